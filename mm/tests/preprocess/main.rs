//! The crate's public contract: what the gateway sees for each input. Images are generated and
//! encoded in memory.

mod decode;
mod prompt;

use std::io::Cursor;

use image::{DynamicImage, ImageFormat};

pub fn encode(img: DynamicImage, format: ImageFormat) -> Vec<u8> {
    let mut bytes = Vec::new();
    img.write_to(&mut Cursor::new(&mut bytes), format)
        .expect("encode test image");
    bytes
}
