use image::{Rgb, RgbImage};
use pdgate_mm::{Family, ImageProcessor, MmError};

use crate::{solid, CLIP_MEAN, CLIP_STD};

/// llava-hf/llava-1.5-7b-hf's preprocessor_config.json and the relevant part of its config.json.
const LLAVA_PREPROCESSOR: &str = r#"{
  "crop_size": {"height": 336, "width": 336},
  "do_center_crop": true, "do_convert_rgb": true, "do_normalize": true,
  "do_rescale": true, "do_resize": true,
  "image_mean": [0.48145466, 0.4578275, 0.40821073],
  "image_processor_type": "CLIPImageProcessor",
  "image_std": [0.26862954, 0.26130258, 0.27577711],
  "processor_class": "LlavaProcessor",
  "resample": 3, "rescale_factor": 0.00392156862745098,
  "size": {"shortest_edge": 336}
}"#;
const LLAVA_CONFIG: &str = r#"{
  "architectures": ["LlavaForConditionalGeneration"],
  "image_token_index": 32000,
  "vision_feature_select_strategy": "default",
  "vision_config": {"image_size": 336, "patch_size": 14, "model_type": "clip_vision_model"}
}"#;

fn llava() -> ImageProcessor {
    ImageProcessor::from_json(LLAVA_PREPROCESSOR, Some(LLAVA_CONFIG)).unwrap()
}

fn expected(rgb: [u8; 3]) -> [f32; 3] {
    std::array::from_fn(|c| ((f64::from(rgb[c]) / 255.0 - CLIP_MEAN[c]) / CLIP_STD[c]) as f32)
}

#[test]
fn llava_is_clip_with_its_token_and_no_mrope() {
    let p = llava();
    assert_eq!(p.family(), Family::Clip);
    assert!(!p.uses_mrope());
    assert_eq!(p.image_token_id(), Some(32000));
    assert_eq!(p.image_token_text(), "<image>");
}

#[test]
fn a_solid_640x480_becomes_a_336_square_of_that_colour_normalised() {
    let out = llava().process(&solid(640, 480, [200, 100, 50])).unwrap();
    assert_eq!(out.shape, [1, 3, 336, 336]);
    assert_eq!(out.grid_thw, None);
    assert_eq!(out.num_tokens, 576);
    assert_eq!(out.pixel_values.len(), 3 * 336 * 336);
    let want = expected([200, 100, 50]);
    for (c, plane) in out.pixel_values.chunks_exact(336 * 336).enumerate() {
        for &v in plane {
            assert!(
                (v - want[c]).abs() < 1e-5,
                "channel {c}: {v} vs {}",
                want[c]
            );
        }
    }
}

#[test]
fn the_centre_crop_takes_the_middle_of_the_long_side() {
    // 600×336: the shortest edge is already 336, so the resize keeps every pixel and the crop's
    // left edge is (600 - 336) // 2 = 132. Red encodes x, green y.
    let img = RgbImage::from_fn(600, 336, |x, y| Rgb([(x % 256) as u8, (y % 256) as u8, 0]));
    let out = llava().process(&img).unwrap();
    assert_eq!(out.shape, [1, 3, 336, 336]);
    let plane = 336 * 336;
    for (x, y) in [(0usize, 0usize), (10, 5), (335, 335)] {
        let want = expected([((x + 132) % 256) as u8, (y % 256) as u8, 0]);
        let at = y * 336 + x;
        for (c, &w) in want.iter().enumerate() {
            let got = out.pixel_values[c * plane + at];
            assert!(
                (got - w).abs() < 1e-5,
                "({x},{y}) channel {c}: {got} vs {w}"
            );
        }
    }
}

#[test]
fn a_portrait_image_is_cropped_vertically_around_its_centre() {
    // 336 wide, 400 tall: top = (400 - 336) // 2 = 32.
    let img = RgbImage::from_fn(336, 400, |_, y| Rgb([0, (y % 256) as u8, 0]));
    let out = llava().process(&img).unwrap();
    let green = &out.pixel_values[336 * 336..2 * 336 * 336];
    assert!((green[0] - expected([0, 32, 0])[1]).abs() < 1e-5);
}

#[test]
fn full_feature_selection_adds_the_cls_token() {
    let config = LLAVA_CONFIG.replace("\"default\"", "\"full\"");
    let p = ImageProcessor::from_json(LLAVA_PREPROCESSOR, Some(&config)).unwrap();
    assert_eq!(
        p.process(&solid(336, 336, [1, 2, 3])).unwrap().num_tokens,
        577
    );
}

#[test]
fn integer_size_and_crop_size_from_older_configs_are_understood() {
    let pre =
        r#"{"feature_extractor_type": "CLIPFeatureExtractor", "size": 224, "crop_size": 224}"#;
    let p = ImageProcessor::from_json(pre, None).unwrap();
    assert_eq!(p.image_token_id(), None);
    let out = p.process(&solid(300, 200, [9, 9, 9])).unwrap();
    assert_eq!(out.shape, [1, 3, 224, 224]);
    assert_eq!(out.num_tokens, 16 * 16);
}

#[test]
fn without_rescale_and_normalize_the_values_are_the_bytes() {
    let pre = r#"{"image_processor_type": "CLIPImageProcessorFast", "do_rescale": false,
                  "do_normalize": false, "do_resize": false, "do_center_crop": false}"#;
    let out = ImageProcessor::from_json(pre, None)
        .unwrap()
        .process(&solid(28, 14, [200, 100, 50]))
        .unwrap();
    assert_eq!(out.shape, [1, 3, 14, 28]);
    assert_eq!(out.pixel_values[0], 200.0);
    assert_eq!(out.pixel_values[14 * 28], 100.0);
    assert_eq!(out.pixel_values[2 * 14 * 28], 50.0);
}

#[test]
fn pixel_bytes_are_float32_little_endian() {
    let out = llava().process(&solid(336, 336, [200, 100, 50])).unwrap();
    let bytes = out.pixel_bytes_le();
    assert_eq!(bytes.len(), out.pixel_values.len() * 4);
    let first = f32::from_le_bytes(bytes[..4].try_into().unwrap());
    assert_eq!(first, out.pixel_values[0]);
}

#[test]
fn an_unimplemented_processor_is_refused_by_name() {
    let err =
        ImageProcessor::from_json(r#"{"image_processor_type": "SiglipImageProcessor"}"#, None)
            .unwrap_err();
    assert!(matches!(err, MmError::Config(_)));
    assert!(err.to_string().contains("SiglipImageProcessor"), "{err}");
    let err = ImageProcessor::from_json(r#"{"crop_size": 336}"#, None).unwrap_err();
    assert!(err.to_string().contains("cannot tell"), "{err}");
}

#[test]
fn a_resample_filter_we_do_not_implement_is_refused() {
    let err = ImageProcessor::from_json(
        r#"{"image_processor_type": "CLIPImageProcessor", "resample": 1}"#,
        None,
    )
    .unwrap_err();
    assert!(err.to_string().contains("resample 1"), "{err}");
}

#[test]
fn a_model_dir_without_preprocessor_config_is_text_only() {
    let dir = std::env::temp_dir().join(format!("pdgate-mm-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), LLAVA_CONFIG).unwrap();
    assert!(ImageProcessor::from_model_dir(&dir).unwrap().is_none());
    std::fs::write(dir.join("preprocessor_config.json"), LLAVA_PREPROCESSOR).unwrap();
    let p = ImageProcessor::from_model_dir(&dir)
        .unwrap()
        .expect("a vision model");
    assert_eq!(p.image_token_id(), Some(32000));
    std::fs::remove_dir_all(&dir).unwrap();
}
