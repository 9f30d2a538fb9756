//! Bytes as received → an RGB image, refusing decompression bombs from the header alone.

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageError, ImageFormat, ImageReader, RgbImage};

use crate::MmError;

/// 8192×8192 (67 M pixels, 256 MiB as RGBA while decoding): room for 8K UHD photos (33 M) and
/// scans, below Pillow's own bomb warning (`Image.MAX_IMAGE_PIXELS`, 89 M) that the Python
/// engines would otherwise log. Every model here shrinks images far below this anyway.
pub const DEFAULT_MAX_PIXELS: u64 = 8192 * 8192;

/// Decodes a PNG, JPEG, WebP or GIF (its first frame), the format told by the magic bytes, not by
/// any declared MIME type. An image whose header declares more than `max_pixels` pixels is
/// refused before any pixel buffer is allocated.
///
/// Alpha is dropped, not composited: Hugging Face's `convert_to_rgb` is PIL's
/// `convert("RGB")`, which discards the alpha channel and keeps the colour underneath. (vLLM's own
/// HTTP loader composites RGBA onto white instead; we follow the processor, which is what the
/// model was trained with.) Greyscale is replicated into three channels; 16-bit samples are
/// scaled to 8 bits.
pub fn decode_image(bytes: &[u8], max_pixels: u64) -> Result<RgbImage, MmError> {
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| MmError::NotAnImage(e.to_string()))?;
    let format = reader.format().ok_or_else(|| {
        MmError::NotAnImage("unrecognised signature (expected PNG, JPEG, WebP or GIF)".into())
    })?;
    if !matches!(
        format,
        ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP | ImageFormat::Gif
    ) {
        return Err(MmError::Unsupported(
            format
                .extensions_str()
                .first()
                .copied()
                .unwrap_or("?")
                .to_uppercase(),
        ));
    }
    // `into_decoder` reads the header only; the dimensions are known before any pixel is.
    let decoder = reader.into_decoder().map_err(|e| image_error(e, None))?;
    let (width, height) = decoder.dimensions();
    if u64::from(width) * u64::from(height) > max_pixels {
        return Err(MmError::TooLarge {
            width,
            height,
            max_pixels,
        });
    }
    let decoded =
        DynamicImage::from_decoder(decoder).map_err(|e| image_error(e, Some((width, height))))?;
    if width == 0 || height == 0 {
        return Err(MmError::Dimensions("the image is empty (0 pixels)".into()));
    }
    Ok(match decoded {
        DynamicImage::ImageRgb8(rgb) => rgb,
        other => other.to_rgb8(),
    })
}

fn image_error(error: ImageError, dims: Option<(u32, u32)>) -> MmError {
    match error {
        ImageError::Unsupported(e) => MmError::Unsupported(e.to_string()),
        ImageError::Limits(_) => {
            let (width, height) = dims.unwrap_or((0, 0));
            MmError::TooLarge {
                width,
                height,
                max_pixels: 0,
            }
        }
        other => MmError::NotAnImage(other.to_string()),
    }
}
