//! Per-image cost of the gRPC multimodal path, step by step: decode (JPEG, PNG), hash, and each
//! family's processing of a 1024×768 photo-like image.
//!
//! cargo run --release -p pdgate-mm --example preprocess_bench -- [iterations]

use std::hint::black_box;
use std::io::Cursor;
use std::time::Instant;

use image::{DynamicImage, ImageFormat, Rgb, RgbImage};
use pdgate_mm::{content_hash, decode_image, ImageProcessor, DEFAULT_MAX_PIXELS};

const LLAVA: &str = r#"{"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 336},
  "crop_size": {"height": 336, "width": 336}, "resample": 3}"#;
const QWEN2_VL: &str = r#"{"image_processor_type": "Qwen2VLImageProcessor",
  "min_pixels": 3136, "max_pixels": 12845056}"#;

/// Smooth gradients plus texture, so the JPEG and PNG sizes are photo-like, not trivial.
fn photo_like() -> RgbImage {
    photo_sized(1024, 768)
}

fn photo_sized(w: u32, h: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| {
        let noise = (x.wrapping_mul(2_654_435_761) ^ y.wrapping_mul(40_503)) >> 27;
        Rgb([
            (x / 4) as u8 ^ noise as u8,
            (y / 3) as u8,
            ((x + y) / 7) as u8 ^ (noise as u8 >> 1),
        ])
    })
}

fn encode(img: &RgbImage, format: ImageFormat) -> Vec<u8> {
    let mut bytes = Vec::new();
    DynamicImage::ImageRgb8(img.clone())
        .write_to(&mut Cursor::new(&mut bytes), format)
        .expect("encode");
    bytes
}

fn time<T>(label: &str, iterations: u32, mut step: impl FnMut() -> T) {
    black_box(step()); // warm-up
    let start = Instant::now();
    for _ in 0..iterations {
        black_box(step());
    }
    let micros = start.elapsed().as_secs_f64() * 1e6 / f64::from(iterations);
    println!("| {label} | {micros:.0} |");
}

fn main() {
    let iterations: u32 = std::env::args()
        .nth(1)
        .map(|n| n.parse().expect("iterations"))
        .unwrap_or(50);
    let img = photo_like();
    let jpeg = encode(&img, ImageFormat::Jpeg);
    let png = encode(&img, ImageFormat::Png);
    let llava = ImageProcessor::from_json(LLAVA, None).expect("llava config");
    let qwen = ImageProcessor::from_json(QWEN2_VL, None).expect("qwen config");
    let qwen_out = qwen.process(&img).expect("qwen");

    println!(
        "1024x768, {iterations} iterations, JPEG {} KiB, PNG {} KiB",
        jpeg.len() / 1024,
        png.len() / 1024
    );
    println!(
        "Qwen2-VL grid {:?}, {} tokens\n",
        qwen_out.grid_thw, qwen_out.num_tokens
    );
    println!("| step | µs per image |");
    println!("|---|---|");
    time("decode JPEG", iterations, || {
        decode_image(&jpeg, DEFAULT_MAX_PIXELS).unwrap()
    });
    time("decode PNG", iterations, || {
        decode_image(&png, DEFAULT_MAX_PIXELS).unwrap()
    });
    time("blake3 of the JPEG bytes", iterations, || {
        content_hash(&jpeg)
    });
    time(
        "LLaVA-1.5 process (resize 448x336, crop 336, normalise)",
        iterations,
        || llava.process(&img).unwrap(),
    );
    time(
        "Qwen2-VL process (resize 1036x756, normalise, patchify)",
        iterations,
        || qwen.process(&img).unwrap(),
    );
    time("Qwen2-VL pixel_bytes_le", iterations, || {
        qwen_out.pixel_bytes_le()
    });
    time(
        "JPEG end to end: decode + hash + Qwen2-VL + bytes",
        iterations,
        || {
            let decoded = decode_image(&jpeg, DEFAULT_MAX_PIXELS).unwrap();
            let hash = content_hash(&jpeg);
            let out = qwen.process(&decoded).unwrap();
            (hash, out.pixel_bytes_le())
        },
    );

    // Smaller inputs, end to end (what one request pays per image): decode, hash, process and
    // the tensor's bytes, next to a text request's whole gateway CPU (≈ 57 µs, issue 15).
    println!("\n| input, end to end | µs per image |");
    println!("|---|---|");
    for (w, h, format, name) in [
        (336, 336, ImageFormat::Jpeg, "JPEG 336x336"),
        (448, 448, ImageFormat::Jpeg, "JPEG 448x448"),
        (56, 56, ImageFormat::Png, "PNG 56x56"),
    ] {
        let bytes = encode(&photo_sized(w, h), format);
        for (family, processor) in [("LLaVA-1.5", &llava), ("Qwen2-VL", &qwen)] {
            time(&format!("{name} → {family}"), iterations, || {
                let decoded = decode_image(&bytes, DEFAULT_MAX_PIXELS).unwrap();
                let hash = content_hash(&bytes);
                let out = processor.process(&decoded).unwrap();
                (hash, out.pixel_bytes_le())
            });
        }
    }
}
