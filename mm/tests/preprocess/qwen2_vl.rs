use image::{Rgb, RgbImage};
use pdgate_mm::{Family, ImageProcessor, MmError};

use crate::{solid, CLIP_MEAN, CLIP_STD};

/// Qwen/Qwen2-VL-7B-Instruct's preprocessor_config.json and the relevant part of config.json.
const QWEN_PREPROCESSOR: &str = r#"{
  "min_pixels": 3136, "max_pixels": 12845056,
  "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
  "image_mean": [0.48145466, 0.4578275, 0.40821073],
  "image_std": [0.26862954, 0.26130258, 0.27577711],
  "image_processor_type": "Qwen2VLImageProcessor",
  "processor_class": "Qwen2VLProcessor"
}"#;
const QWEN_CONFIG: &str = r#"{
  "architectures": ["Qwen2VLForConditionalGeneration"],
  "image_token_id": 151655, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
  "vision_config": {"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}
}"#;

fn qwen() -> ImageProcessor {
    ImageProcessor::from_json(QWEN_PREPROCESSOR, Some(QWEN_CONFIG)).unwrap()
}

#[test]
fn qwen2_vl_uses_mrope_and_its_image_pad_token() {
    let p = qwen();
    assert_eq!(p.family(), Family::Qwen2Vl);
    assert!(p.uses_mrope());
    assert_eq!(p.image_token_id(), Some(151655));
    assert_eq!(p.image_token_text(), "<|image_pad|>");
}

#[test]
fn a_56_square_is_a_4x4_grid_of_16_rows_and_4_tokens() {
    let out = qwen().process(&solid(56, 56, [200, 100, 50])).unwrap();
    assert_eq!(out.grid_thw, Some([1, 4, 4]));
    assert_eq!(out.shape, [16, 1176]);
    assert_eq!(out.pixel_values.len(), 16 * 1176);
    assert_eq!(out.num_tokens, 4);
}

#[test]
fn a_solid_colour_stays_that_colour_in_every_patch() {
    let out = qwen().process(&solid(640, 480, [200, 100, 50])).unwrap();
    // smart_resize(480, 640) = (476, 644): a 34×46 grid.
    assert_eq!(out.grid_thw, Some([1, 34, 46]));
    assert_eq!(out.shape, [34 * 46, 1176]);
    assert_eq!(out.num_tokens, 34 * 46 / 4);
    let want: [f32; 3] = std::array::from_fn(|c| {
        ((f64::from([200u8, 100, 50][c]) / 255.0 - CLIP_MEAN[c]) / CLIP_STD[c]) as f32
    });
    for row in out.pixel_values.chunks_exact(1176) {
        for (c, channel) in row.chunks_exact(392).enumerate() {
            assert!(channel.iter().all(|&v| (v - want[c]).abs() < 1e-5));
        }
    }
}

#[test]
fn newer_size_keys_bound_the_pixels() {
    // size {shortest_edge: min, longest_edge: max}: 1000×1000 into at most 200 704 pixels.
    let pre = r#"{"image_processor_type": "Qwen2VLImageProcessor",
                  "size": {"shortest_edge": 3136, "longest_edge": 200704}}"#;
    let out = ImageProcessor::from_json(pre, None)
        .unwrap()
        .process(&solid(1000, 1000, [0, 0, 0]))
        .unwrap();
    // beta = sqrt(1e6 / 200704) = 2.2321; 1000 / beta / 28 = 16.0 → 448.
    assert_eq!(out.grid_thw, Some([1, 32, 32]));
}

#[test]
fn an_extreme_aspect_ratio_is_refused_with_a_clear_error() {
    let err = qwen().process(&solid(2010, 10, [0, 0, 0])).unwrap_err();
    assert!(matches!(err, MmError::Dimensions(_)));
    assert!(err.to_string().contains("aspect ratio"), "{err}");
}

/// HF's reshape (t, tp, c, gh/m, m, ph, gw/m, m, pw) → permute (t, gh/m, gw/m, m, m, c, tp, ph, pw):
/// rows walk 2×2 merge blocks left to right, each block's patches in raster order; inside a row,
/// channel, then temporal copy, then the 14×14 patch in raster order.
#[test]
fn rows_and_columns_follow_hf_patch_order() {
    // 28 high × 56 wide, unresized and unnormalised: red = y, green = x, blue = 7.
    let pre = r#"{"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 784,
                  "do_rescale": false, "do_normalize": false}"#;
    let img = RgbImage::from_fn(56, 28, |x, y| Rgb([y as u8, x as u8, 7]));
    let out = ImageProcessor::from_json(pre, None)
        .unwrap()
        .process(&img)
        .unwrap();
    assert_eq!(out.grid_thw, Some([1, 2, 4]));
    assert_eq!(out.shape, [8, 1176]);
    assert_eq!(out.num_tokens, 2);
    // Row r → patch (grid_y, grid_x): block r / 4 (left or right 28×28), then raster inside it.
    let patch_of_row = [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
        (0, 2),
        (0, 3),
        (1, 2),
        (1, 3),
    ];
    let value = |row: usize, c: usize, t: usize, py: usize, px: usize| {
        out.pixel_values[row * 1176 + c * 392 + t * 196 + py * 14 + px]
    };
    for (row, &(grid_y, grid_x)) in patch_of_row.iter().enumerate() {
        for (py, px) in [(0, 0), (3, 5), (13, 13)] {
            for t in 0..2 {
                assert_eq!(
                    value(row, 0, t, py, px),
                    (grid_y * 14 + py) as f32,
                    "row {row} y"
                );
                assert_eq!(
                    value(row, 1, t, py, px),
                    (grid_x * 14 + px) as f32,
                    "row {row} x"
                );
                assert_eq!(value(row, 2, t, py, px), 7.0);
            }
        }
    }
    // Spot check of one flat index: row 5 is patch (0, 3); column 392 + 196 + 3*14 + 5 is green,
    // second temporal copy, patch pixel (3, 5) → x = 3*14 + 5 = 47.
    assert_eq!(out.pixel_values[5 * 1176 + 392 + 196 + 3 * 14 + 5], 47.0);
}

#[test]
fn without_resize_dimensions_must_already_fit_the_grid() {
    let pre = r#"{"image_processor_type": "Qwen2VLImageProcessor", "do_resize": false}"#;
    let p = ImageProcessor::from_json(pre, None).unwrap();
    assert!(p.process(&solid(56, 84, [0, 0, 0])).is_ok());
    let err = p.process(&solid(50, 84, [0, 0, 0])).unwrap_err();
    assert!(err.to_string().contains("multiple of 28"), "{err}");
}
