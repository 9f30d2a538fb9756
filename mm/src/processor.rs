//! The per-model image processor: one decoded image → the tensor and token count the engine
//! expects, as the model's Hugging Face (slow, PIL-based) image processor would produce them.

use std::path::Path;

use image::RgbImage;

use crate::config::{self, ClipResize, Geometry, Settings};
use crate::pixels::{merged_patches, Layout};
use crate::resample::{resize_window, Window};
use crate::MmError;

/// The preprocessing families implemented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// CLIP / LLaVA-1.5: shortest-edge resize, centre crop, `[1, 3, H, W]`.
    Clip,
    /// Qwen2-VL / Qwen2.5-VL: dynamic resolution (`smart_resize`), merged-patch rows.
    Qwen2Vl,
}

/// Built once per model directory and shared (`Arc`) by every request for that model.
#[derive(Debug, Clone)]
pub struct ImageProcessor {
    settings: Settings,
}

/// One image, ready for the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessedImage {
    /// Normalised values, row-major in `shape`.
    pub pixel_values: Vec<f32>,
    /// Clip: `[1, 3, H, W]`; Qwen2-VL: `[grid_t * grid_h * grid_w, 3 * temporal * patch * patch]`.
    pub shape: Vec<u32>,
    /// Qwen2-VL's `image_grid_thw` row; `None` for Clip.
    pub grid_thw: Option<[u32; 3]>,
    /// How many placeholder tokens this image expands to in the prompt.
    pub num_tokens: u32,
}

impl ProcessedImage {
    /// The values as little-endian float32 bytes: the gRPC `TensorData` body (dtype `float32`).
    pub fn pixel_bytes_le(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.pixel_values.len() * 4);
        for v in &self.pixel_values {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        bytes
    }
}

impl ImageProcessor {
    /// From a model directory: `preprocessor_config.json` (the image processor) and, if present,
    /// `config.json` (placeholder token id, vision patch size, feature selection).
    /// `Ok(None)` when there is no `preprocessor_config.json`: a text-only model.
    pub fn from_model_dir(dir: &Path) -> Result<Option<Self>, MmError> {
        let read = |name: &str| -> Result<Option<String>, MmError> {
            let path = dir.join(name);
            match std::fs::read_to_string(&path) {
                Ok(text) => Ok(Some(text)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(MmError::Config(format!("{}: {e}", path.display()))),
            }
        };
        let Some(preprocessor) = read("preprocessor_config.json")? else {
            return Ok(None);
        };
        let model = read("config.json")?;
        Self::from_json(&preprocessor, model.as_deref()).map(Some)
    }

    /// From the two files' contents (`config.json` optional).
    pub fn from_json(
        preprocessor_config: &str,
        model_config: Option<&str>,
    ) -> Result<Self, MmError> {
        Ok(ImageProcessor {
            settings: config::parse(preprocessor_config, model_config)?,
        })
    }

    pub fn family(&self) -> Family {
        self.settings.family
    }

    /// Whether the model positions tokens with multimodal rotary embeddings (Qwen2-VL's M-RoPE),
    /// which need each image's `grid_thw`.
    pub fn uses_mrope(&self) -> bool {
        self.settings.family == Family::Qwen2Vl
    }

    /// The placeholder the chat template writes once per image, from `config.json`
    /// (`image_token_index` for LLaVA, `image_token_id` for Qwen2-VL). `None` when the config does
    /// not say: look [`Self::image_token_text`] up in the tokenizer instead.
    pub fn image_token_id(&self) -> Option<u32> {
        self.settings.image_token_id
    }

    /// The placeholder's text in the chat template.
    pub fn image_token_text(&self) -> &'static str {
        match self.settings.family {
            Family::Clip => "<image>",
            Family::Qwen2Vl => "<|image_pad|>",
        }
    }

    pub fn process(&self, img: &RgbImage) -> Result<ProcessedImage, MmError> {
        let (width, height) = img.dimensions();
        if width == 0 || height == 0 {
            return Err(MmError::Dimensions("the image is empty (0 pixels)".into()));
        }
        let s = &self.settings;
        match s.geometry {
            Geometry::Clip {
                resize,
                crop,
                patch,
                keeps_cls,
            } => {
                let (out_h, out_w) = match resize {
                    None => (height, width),
                    Some(ClipResize::ShortestEdge(edge)) => shortest_edge_size(height, width, edge),
                    Some(ClipResize::Exact { height, width }) => (height, width),
                };
                let window = match crop {
                    // HF center_crop: top = (h - crop_h) // 2 (floor), padded with 0 outside.
                    Some((crop_h, crop_w)) => Window {
                        left: (i64::from(out_w) - i64::from(crop_w)).div_euclid(2),
                        top: (i64::from(out_h) - i64::from(crop_h)).div_euclid(2),
                        width: crop_w as usize,
                        height: crop_h as usize,
                    },
                    None => Window::full(out_w as usize, out_h as usize),
                };
                let rgb = resize_window(img, out_w as usize, out_h as usize, window, s.filter);
                let layout = Layout::channels_first(window.width, window.height);
                let (h, w) = (window.height as u32, window.width as u32);
                Ok(ProcessedImage {
                    pixel_values: layout.fill(&rgb, &s.pixel_map),
                    shape: vec![1, 3, h, w],
                    grid_thw: None,
                    num_tokens: (h / patch) * (w / patch) + u32::from(keeps_cls),
                })
            }
            Geometry::Qwen2Vl {
                resize,
                patch,
                merge,
                temporal,
                min_pixels,
                max_pixels,
            } => {
                let factor = patch * merge;
                let (out_h, out_w) = if resize {
                    smart_resize(height, width, factor, min_pixels, max_pixels)?
                } else if height % factor == 0 && width % factor == 0 {
                    (height, width)
                } else {
                    return Err(MmError::Dimensions(format!(
                        "{width}x{height} is not a multiple of {factor} and the model's do_resize is false"
                    )));
                };
                let rgb = resize_window(
                    img,
                    out_w as usize,
                    out_h as usize,
                    Window::full(out_w as usize, out_h as usize),
                    s.filter,
                );
                let layout = merged_patches(
                    out_w as usize,
                    out_h as usize,
                    patch as usize,
                    merge as usize,
                    temporal as usize,
                );
                let (grid_h, grid_w) = (out_h / patch, out_w / patch);
                Ok(ProcessedImage {
                    pixel_values: layout.fill(&rgb, &s.pixel_map),
                    shape: vec![grid_h * grid_w, 3 * temporal * patch * patch],
                    grid_thw: Some([1, grid_h, grid_w]),
                    num_tokens: grid_h * grid_w / (merge * merge),
                })
            }
        }
    }
}

/// HF `get_resize_output_image_size(default_to_square=False)`: the short side becomes `edge`, the
/// long side `int(edge * long / short)` (truncated). Returns (height, width).
fn shortest_edge_size(height: u32, width: u32, edge: u32) -> (u32, u32) {
    let (short, long) = if width <= height {
        (width, height)
    } else {
        (height, width)
    };
    let new_long = (u64::from(edge) * u64::from(long)) as f64 / f64::from(short);
    let new_long = new_long as u32;
    if width <= height {
        (new_long, edge)
    } else {
        (edge, new_long)
    }
}

/// Qwen2-VL's `smart_resize` as in HF's `image_processing_qwen2_vl.py`: both sides rounded
/// (half to even, as Python's `round`) to multiples of `factor`, then scaled down (floor) into
/// `max_pixels` or up (ceil) to `min_pixels` keeping the aspect ratio; aspect ratios above 200
/// are refused. Returns (height, width).
pub(crate) fn smart_resize(
    height: u32,
    width: u32,
    factor: u32,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(u32, u32), MmError> {
    let (h, w, f) = (f64::from(height), f64::from(width), f64::from(factor));
    let ratio = h.max(w) / h.min(w);
    if ratio > 200.0 {
        return Err(MmError::Dimensions(format!(
            "{width}x{height} has an aspect ratio of {ratio:.1}, above the model's limit of 200"
        )));
    }
    let mut h_bar = (h / f).round_ties_even() * f;
    let mut w_bar = (w / f).round_ties_even() * f;
    if h_bar * w_bar > max_pixels as f64 {
        let beta = (h * w / max_pixels as f64).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if h_bar * w_bar < min_pixels as f64 {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    if h_bar > f64::from(u32::MAX) || w_bar > f64::from(u32::MAX) {
        return Err(MmError::Dimensions(format!(
            "{width}x{height} resizes out of range"
        )));
    }
    Ok((h_bar as u32, w_bar as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT_MAX: u64 = 28 * 28 * 1280;

    #[test]
    fn smart_resize_matches_hf_formula() {
        // (h, w) → expected, worked by hand from HF's formula with factor 28, min 56*56,
        // max 28*28*1280 (1 003 520).
        let table = [
            // 480/28 = 17.14 → 17 → 476; 640/28 = 22.86 → 23 → 644; 306 544 pixels: in range.
            ((480, 640), (476, 644)),
            // Already multiples.
            ((56, 56), (56, 56)),
            // 1080/28 = 38.57 → 39 → 1092; 1920/28 = 68.57 → 69 → 1932; 2.1 M > max:
            // beta = sqrt(1080*1920/1003520) = 1.43747; 1080/beta/28 = 26.83 → 26 → 728,
            // 1920/beta/28 = 47.70 → 47 → 1316.
            ((1080, 1920), (728, 1316)),
            // 10x10 rounds to 0x0 < min: beta = sqrt(3136/100) = 5.6; 10*5.6/28 = 2 → 56.
            ((10, 10), (56, 56)),
            // 42/28 = 1.5: half to even → 2 → 56; 70/28 = 2.5 → 2 → 56.
            ((42, 70), (56, 56)),
            // 98/28 = 3.5 → 4 → 112 (ties to even rounds up here).
            ((98, 28 * 10), (112, 280)),
        ];
        for ((h, w), expected) in table {
            assert_eq!(
                smart_resize(h, w, 28, 56 * 56, DEFAULT_MAX).unwrap(),
                expected,
                "{h}x{w}"
            );
        }
    }

    #[test]
    fn smart_resize_refuses_aspect_ratios_above_200() {
        assert!(smart_resize(10, 2000, 28, 3136, DEFAULT_MAX).is_ok());
        let err = smart_resize(10, 2001, 28, 3136, DEFAULT_MAX).unwrap_err();
        assert!(matches!(err, MmError::Dimensions(_)));
        assert!(err.to_string().contains("aspect ratio"), "{err}");
    }

    #[test]
    fn shortest_edge_truncates_the_long_side_like_hf() {
        assert_eq!(shortest_edge_size(480, 640, 336), (336, 448));
        assert_eq!(shortest_edge_size(640, 480, 336), (448, 336));
        // 336 * 1000 / 333 = 1009.009 → 1009.
        assert_eq!(shortest_edge_size(333, 1000, 336), (336, 1009));
    }
}
