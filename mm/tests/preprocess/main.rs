//! The crate's public contract: what the gateway sees for each input. Images are generated and
//! encoded in memory.

mod clip;
mod decode;
mod prompt;
mod qwen2_vl;

use std::io::Cursor;

use image::{DynamicImage, ImageFormat, RgbImage};

pub fn encode(img: DynamicImage, format: ImageFormat) -> Vec<u8> {
    let mut bytes = Vec::new();
    img.write_to(&mut Cursor::new(&mut bytes), format)
        .expect("encode test image");
    bytes
}

pub fn solid(width: u32, height: u32, rgb: [u8; 3]) -> RgbImage {
    RgbImage::from_pixel(width, height, image::Rgb(rgb))
}

pub const CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
pub const CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];
