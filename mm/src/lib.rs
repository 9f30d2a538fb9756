//! Gateway-side image preprocessing for pdgate's gRPC multimodal path. Over gRPC the gateway
//! tokenizes the prompt itself, so it also owns what the engines' Python processors would do to
//! an image: decode it ([`decode_image`]), turn it into the model's pixel tensor
//! ([`ImageProcessor::process`]), hash it ([`content_hash`]) and expand the prompt's placeholder
//! tokens ([`expand_placeholders`]). No I/O beyond reading a model directory's two JSON files, no
//! Pingora or tonic types.

mod config;
mod content_hash;
mod decode;
mod error;
mod pixels;
mod placeholders;
mod processor;
mod resample;

pub use content_hash::{content_hash, hash_hex};
pub use decode::{decode_image, DEFAULT_MAX_PIXELS};
pub use error::MmError;
pub use placeholders::{expand_placeholders, PlaceholderRange};
pub use processor::{Family, ImageProcessor, ProcessedImage};
