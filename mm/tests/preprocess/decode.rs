use image::codecs::gif::GifEncoder;
use image::{DynamicImage, Frame, ImageFormat, Rgb, RgbImage, Rgba, RgbaImage};
use pdgate_mm::{decode_image, MmError, DEFAULT_MAX_PIXELS};

use crate::encode;

fn pattern() -> RgbImage {
    RgbImage::from_fn(64, 48, |x, y| Rgb([(x * 4) as u8, (y * 5) as u8, 128]))
}

#[test]
fn png_decodes_losslessly() {
    let bytes = encode(DynamicImage::ImageRgb8(pattern()), ImageFormat::Png);
    assert_eq!(decode_image(&bytes, DEFAULT_MAX_PIXELS).unwrap(), pattern());
}

#[test]
fn webp_lossless_decodes_losslessly() {
    let bytes = encode(DynamicImage::ImageRgb8(pattern()), ImageFormat::WebP);
    assert_eq!(&bytes[8..12], b"WEBP");
    assert_eq!(decode_image(&bytes, DEFAULT_MAX_PIXELS).unwrap(), pattern());
}

#[test]
fn jpeg_decodes_close_to_the_original() {
    let img = RgbImage::from_pixel(64, 48, Rgb([200, 100, 50]));
    let bytes = encode(DynamicImage::ImageRgb8(img), ImageFormat::Jpeg);
    let decoded = decode_image(&bytes, DEFAULT_MAX_PIXELS).unwrap();
    assert_eq!(decoded.dimensions(), (64, 48));
    let px = decoded.get_pixel(30, 20).0;
    for (got, want) in px.iter().zip([200u8, 100, 50]) {
        assert!(got.abs_diff(want) <= 3, "{px:?}");
    }
}

#[test]
fn gif_yields_its_first_frame() {
    let red = RgbaImage::from_pixel(16, 16, Rgba([255, 0, 0, 255]));
    let blue = RgbaImage::from_pixel(16, 16, Rgba([0, 0, 255, 255]));
    let mut bytes = Vec::new();
    {
        let mut encoder = GifEncoder::new(&mut bytes);
        encoder
            .encode_frames([Frame::new(red), Frame::new(blue)])
            .unwrap();
    }
    let decoded = decode_image(&bytes, DEFAULT_MAX_PIXELS).unwrap();
    let [r, g, b] = decoded.get_pixel(8, 8).0;
    assert!(
        r > 240 && g < 16 && b < 16,
        "first frame is red, got {r},{g},{b}"
    );
}

#[test]
fn alpha_is_dropped_keeping_the_colour_underneath_as_pil_convert_rgb() {
    let rgba = RgbaImage::from_pixel(4, 4, Rgba([10, 20, 30, 0]));
    let bytes = encode(DynamicImage::ImageRgba8(rgba), ImageFormat::Png);
    let decoded = decode_image(&bytes, DEFAULT_MAX_PIXELS).unwrap();
    assert_eq!(decoded.get_pixel(0, 0).0, [10, 20, 30]);
}

#[test]
fn greyscale_is_replicated_into_three_channels() {
    let grey = image::GrayImage::from_pixel(4, 4, image::Luma([77]));
    let bytes = encode(DynamicImage::ImageLuma8(grey), ImageFormat::Png);
    assert_eq!(
        decode_image(&bytes, DEFAULT_MAX_PIXELS)
            .unwrap()
            .get_pixel(1, 1)
            .0,
        [77; 3]
    );
}

#[test]
fn garbage_is_not_an_image() {
    let err = decode_image(b"hello, this is not an image at all", DEFAULT_MAX_PIXELS).unwrap_err();
    assert!(matches!(err, MmError::NotAnImage(_)), "{err:?}");
}

#[test]
fn a_truncated_png_is_not_an_image() {
    let bytes = encode(DynamicImage::ImageRgb8(pattern()), ImageFormat::Png);
    let err = decode_image(&bytes[..bytes.len() / 2], DEFAULT_MAX_PIXELS).unwrap_err();
    assert!(matches!(err, MmError::NotAnImage(_)), "{err:?}");
}

#[test]
fn a_known_but_undecoded_format_is_unsupported() {
    // A BMP file header: recognised by its signature, not decoded by this gateway.
    let mut bmp = b"BM".to_vec();
    bmp.extend_from_slice(&[0; 60]);
    let err = decode_image(&bmp, DEFAULT_MAX_PIXELS).unwrap_err();
    assert!(matches!(err, MmError::Unsupported(_)), "{err:?}");
    assert!(err.to_string().contains("PNG, JPEG, WebP or GIF"), "{err}");
}

/// A valid PNG header (signature, IHDR, empty IDAT, IEND) declaring 100000×100000 RGB: 30 GB if
/// anyone believed it.
fn png_bomb_header() -> Vec<u8> {
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = 0xffff_ffffu32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xedb8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }
    fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let start = out.len();
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        let crc = crc32(&out[start..]);
        out.extend_from_slice(&crc.to_be_bytes());
    }
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&100_000u32.to_be_bytes());
    ihdr.extend_from_slice(&100_000u32.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit, RGB, deflate, no filter, no interlace
    chunk(&mut png, b"IHDR", &ihdr);
    chunk(&mut png, b"IDAT", &[]);
    chunk(&mut png, b"IEND", &[]);
    png
}

#[test]
fn a_header_declaring_too_many_pixels_is_refused_before_decoding() {
    let err = decode_image(&png_bomb_header(), DEFAULT_MAX_PIXELS).unwrap_err();
    assert_eq!(
        err,
        MmError::TooLarge {
            width: 100_000,
            height: 100_000,
            max_pixels: DEFAULT_MAX_PIXELS
        }
    );
    assert!(err.to_string().contains("100000x100000"), "{err}");
}

#[test]
fn the_pixel_limit_is_the_callers() {
    let bytes = encode(DynamicImage::ImageRgb8(pattern()), ImageFormat::Png);
    assert!(matches!(
        decode_image(&bytes, 64 * 48 - 1),
        Err(MmError::TooLarge {
            width: 64,
            height: 48,
            ..
        })
    ));
    assert!(decode_image(&bytes, 64 * 48).is_ok());
}
