//! The one error type of the crate: what went wrong with an image or a model's configuration, in
//! words a client (or an operator reading a log) can act on.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MmError {
    /// The bytes are not an image we can read (unknown signature, or a truncated/corrupt file).
    NotAnImage(String),
    /// A recognised image format this gateway does not decode (BMP, TIFF, AVIF, …).
    Unsupported(String),
    /// The image header declares more pixels than allowed; refused before decoding.
    TooLarge {
        width: u32,
        height: u32,
        max_pixels: u64,
    },
    /// The image decoded but its dimensions are not ones the model's processor accepts
    /// (Qwen2-VL's aspect-ratio limit, an empty image).
    Dimensions(String),
    /// `preprocessor_config.json` / `config.json` is missing a required piece or holds a value
    /// this crate does not implement.
    Config(String),
    /// The prompt's image placeholder tokens do not match the images supplied.
    Placeholders(String),
}

impl fmt::Display for MmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MmError::NotAnImage(why) => write!(f, "not a readable image: {why}"),
            MmError::Unsupported(format) => write!(
                f,
                "unsupported image format {format}: send PNG, JPEG, WebP or GIF"
            ),
            MmError::TooLarge {
                width,
                height,
                max_pixels,
            } => write!(
                f,
                "image is {width}x{height} ({} pixels), more than the {max_pixels} allowed",
                u64::from(*width) * u64::from(*height)
            ),
            MmError::Dimensions(why) => write!(f, "image dimensions not accepted: {why}"),
            MmError::Config(why) => write!(f, "image preprocessor configuration: {why}"),
            MmError::Placeholders(why) => write!(f, "image placeholders: {why}"),
        }
    }
}

impl std::error::Error for MmError {}
