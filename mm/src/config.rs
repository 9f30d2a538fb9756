//! `preprocessor_config.json` + `config.json` → one validated [`Settings`], read once per model
//! directory. No other module reads a JSON key.
//!
//! Family detection, first rule that applies:
//! 1. `image_processor_type` (a trailing `Fast` ignored): `CLIPImageProcessor` → Clip,
//!    `Qwen2VLImageProcessor` → Qwen2-VL, anything else → refused (named in the error);
//! 2. `feature_extractor_type` `CLIPFeatureExtractor` (configs older than image processors) → Clip;
//! 3. `processor_class`: `LlavaProcessor` / `CLIPProcessor` → Clip, `Qwen2VLProcessor` /
//!    `Qwen2_5_VLProcessor` → Qwen2-VL;
//! 4. otherwise refused. No guessing from which keys happen to be present: a processor we do not
//!    implement must fail loudly, not produce plausible tensors the model was not trained on.

use serde_json::{Map, Value};

use crate::pixels::PixelMap;
use crate::resample::Filter;
use crate::{Family, MmError};

/// OpenAI CLIP's statistics: HF's `OPENAI_CLIP_MEAN` / `OPENAI_CLIP_STD`, the default of both
/// `CLIPImageProcessor` and `Qwen2VLImageProcessor`.
const CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
const CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];

#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub family: Family,
    pub filter: Filter,
    pub pixel_map: PixelMap,
    pub geometry: Geometry,
    pub image_token_id: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Geometry {
    Clip {
        resize: Option<ClipResize>,
        /// (height, width)
        crop: Option<(u32, u32)>,
        /// The vision tower's patch (config.json `vision_config.patch_size`).
        patch: u32,
        /// `vision_feature_select_strategy: "full"` keeps the CLS feature: one more token.
        keeps_cls: bool,
    },
    Qwen2Vl {
        resize: bool,
        patch: u32,
        merge: u32,
        temporal: u32,
        min_pixels: u64,
        max_pixels: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClipResize {
    ShortestEdge(u32),
    Exact { height: u32, width: u32 },
}

pub(crate) fn parse(preprocessor: &str, model: Option<&str>) -> Result<Settings, MmError> {
    let pre = object(preprocessor, "preprocessor_config.json")?;
    let model = match model {
        Some(text) => object(text, "config.json")?,
        None => Map::new(),
    };
    let family = detect_family(&pre)?;

    let filter_code = uint(&pre, "resample")?.unwrap_or(3);
    let filter = Filter::from_pil(filter_code).ok_or_else(|| {
        MmError::Config(format!(
            "resample {filter_code} is not implemented (2 = bilinear and 3 = bicubic are)"
        ))
    })?;
    let rescale = flag(&pre, "do_rescale", true)?
        .then(|| float(&pre, "rescale_factor").map(|f| f.unwrap_or(1.0 / 255.0)))
        .transpose()?;
    let normalize = if flag(&pre, "do_normalize", true)? {
        let mean = triple(&pre, "image_mean")?.unwrap_or(CLIP_MEAN);
        let std = triple(&pre, "image_std")?.unwrap_or(CLIP_STD);
        if std.contains(&0.0) {
            return Err(MmError::Config("image_std holds a zero".into()));
        }
        Some((mean, std))
    } else {
        None
    };
    // `do_convert_rgb` is read for validation only: decode_image always yields RGB, the only input
    // both families' vision towers take.
    flag(&pre, "do_convert_rgb", true)?;

    let geometry = match family {
        Family::Clip => clip_geometry(&pre, &model)?,
        Family::Qwen2Vl => qwen2_vl_geometry(&pre)?,
    };
    let token_key = match family {
        Family::Clip => "image_token_index",
        Family::Qwen2Vl => "image_token_id",
    };
    let image_token_id = uint(&model, token_key)?
        .map(|id| {
            u32::try_from(id)
                .map_err(|_| MmError::Config(format!("{token_key} {id} is out of range")))
        })
        .transpose()?;

    Ok(Settings {
        family,
        filter,
        pixel_map: PixelMap::new(rescale, normalize),
        geometry,
        image_token_id,
    })
}

fn detect_family(pre: &Map<String, Value>) -> Result<Family, MmError> {
    if let Some(kind) = text(pre, "image_processor_type")? {
        return match kind.strip_suffix("Fast").unwrap_or(kind) {
            "CLIPImageProcessor" => Ok(Family::Clip),
            "Qwen2VLImageProcessor" => Ok(Family::Qwen2Vl),
            other => Err(MmError::Config(format!(
                "image_processor_type {other} is not implemented (CLIPImageProcessor and Qwen2VLImageProcessor are)"
            ))),
        };
    }
    if text(pre, "feature_extractor_type")? == Some("CLIPFeatureExtractor") {
        return Ok(Family::Clip);
    }
    match text(pre, "processor_class")? {
        Some("LlavaProcessor" | "CLIPProcessor") => Ok(Family::Clip),
        Some("Qwen2VLProcessor" | "Qwen2_5_VLProcessor") => Ok(Family::Qwen2Vl),
        Some(other) => Err(MmError::Config(format!(
            "processor_class {other} is not implemented (LLaVA/CLIP and Qwen2-VL processors are)"
        ))),
        None => Err(MmError::Config(
            "no image_processor_type or processor_class: cannot tell which image processor the model uses".into(),
        )),
    }
}

fn clip_geometry(
    pre: &Map<String, Value>,
    model: &Map<String, Value>,
) -> Result<Geometry, MmError> {
    let resize = if flag(pre, "do_resize", true)? {
        // HF CLIPImageProcessor default: {"shortest_edge": 224}; an int is a shortest edge.
        Some(match pre.get("size") {
            None | Some(Value::Null) => ClipResize::ShortestEdge(224),
            Some(Value::Number(_)) => {
                ClipResize::ShortestEdge(positive(pre, "size")?.unwrap_or(224))
            }
            Some(Value::Object(size)) => {
                if let Some(edge) = positive(size, "shortest_edge")? {
                    ClipResize::ShortestEdge(edge)
                } else if let (Some(height), Some(width)) =
                    (positive(size, "height")?, positive(size, "width")?)
                {
                    ClipResize::Exact { height, width }
                } else {
                    return Err(MmError::Config(
                        "size must hold shortest_edge or height and width".into(),
                    ));
                }
            }
            Some(_) => return Err(MmError::Config("size must be a number or an object".into())),
        })
    } else {
        None
    };
    let crop = if flag(pre, "do_center_crop", true)? {
        // HF default {"height": 224, "width": 224}; an int is a square.
        Some(match pre.get("crop_size") {
            None | Some(Value::Null) => (224, 224),
            Some(Value::Number(_)) => {
                let side = positive(pre, "crop_size")?.unwrap_or(224);
                (side, side)
            }
            Some(Value::Object(size)) => {
                match (positive(size, "height")?, positive(size, "width")?) {
                    (Some(h), Some(w)) => (h, w),
                    _ => {
                        return Err(MmError::Config(
                            "crop_size must hold height and width".into(),
                        ))
                    }
                }
            }
            Some(_) => {
                return Err(MmError::Config(
                    "crop_size must be a number or an object".into(),
                ))
            }
        })
    } else {
        None
    };
    let vision = match model.get("vision_config") {
        Some(Value::Object(vision)) => Some(vision),
        _ => None,
    };
    let patch = match vision {
        Some(vision) => positive(vision, "patch_size")?.unwrap_or(14),
        None => 14,
    };
    let keeps_cls = match text(model, "vision_feature_select_strategy")? {
        None | Some("default") => false,
        Some("full") => true,
        Some(other) => {
            return Err(MmError::Config(format!(
                "vision_feature_select_strategy {other} is not implemented (default and full are)"
            )))
        }
    };
    Ok(Geometry::Clip {
        resize,
        crop,
        patch,
        keeps_cls,
    })
}

fn qwen2_vl_geometry(pre: &Map<String, Value>) -> Result<Geometry, MmError> {
    // Newer transformers write the pixel bounds as size {shortest_edge: min, longest_edge: max}
    // (older ones as size {min_pixels, max_pixels}); explicit min_pixels / max_pixels override
    // either, as in Qwen2VLImageProcessor.__init__.
    let (mut min_pixels, mut max_pixels) = (56 * 56, 28 * 28 * 1280);
    if let Some(Value::Object(size)) = pre.get("size") {
        for key in ["shortest_edge", "min_pixels"] {
            if let Some(v) = uint(size, key)? {
                min_pixels = v;
            }
        }
        for key in ["longest_edge", "max_pixels"] {
            if let Some(v) = uint(size, key)? {
                max_pixels = v;
            }
        }
    }
    if let Some(v) = uint(pre, "min_pixels")? {
        min_pixels = v;
    }
    if let Some(v) = uint(pre, "max_pixels")? {
        max_pixels = v;
    }
    if max_pixels == 0 || min_pixels > max_pixels {
        return Err(MmError::Config(format!(
            "pixel bounds min {min_pixels} / max {max_pixels} are not a range"
        )));
    }
    Ok(Geometry::Qwen2Vl {
        resize: flag(pre, "do_resize", true)?,
        patch: positive(pre, "patch_size")?.unwrap_or(14),
        merge: positive(pre, "merge_size")?.unwrap_or(2),
        temporal: positive(pre, "temporal_patch_size")?.unwrap_or(2),
        min_pixels,
        max_pixels,
    })
}

fn object(json: &str, name: &str) -> Result<Map<String, Value>, MmError> {
    match serde_json::from_str(json) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(MmError::Config(format!("{name} is not a JSON object"))),
        Err(e) => Err(MmError::Config(format!("{name}: {e}"))),
    }
}

fn present<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    map.get(key).filter(|v| !v.is_null())
}

fn wrong(key: &str, expected: &str) -> MmError {
    MmError::Config(format!("{key} must be {expected}"))
}

fn text<'a>(map: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, MmError> {
    present(map, key)
        .map(|v| v.as_str().ok_or_else(|| wrong(key, "a string")))
        .transpose()
}

fn flag(map: &Map<String, Value>, key: &str, default: bool) -> Result<bool, MmError> {
    present(map, key)
        .map(|v| v.as_bool().ok_or_else(|| wrong(key, "true or false")))
        .transpose()
        .map(|v| v.unwrap_or(default))
}

fn uint(map: &Map<String, Value>, key: &str) -> Result<Option<u64>, MmError> {
    present(map, key)
        .map(|v| {
            v.as_u64()
                .ok_or_else(|| wrong(key, "a non-negative integer"))
        })
        .transpose()
}

fn positive(map: &Map<String, Value>, key: &str) -> Result<Option<u32>, MmError> {
    uint(map, key)?
        .map(|v| match u32::try_from(v) {
            Ok(v) if v > 0 => Ok(v),
            _ => Err(wrong(key, "a positive 32-bit integer")),
        })
        .transpose()
}

fn float(map: &Map<String, Value>, key: &str) -> Result<Option<f64>, MmError> {
    present(map, key)
        .map(|v| v.as_f64().ok_or_else(|| wrong(key, "a number")))
        .transpose()
}

/// A per-channel triple, or one number for all three channels (HF accepts both).
fn triple(map: &Map<String, Value>, key: &str) -> Result<Option<[f64; 3]>, MmError> {
    let Some(value) = present(map, key) else {
        return Ok(None);
    };
    if let Some(one) = value.as_f64() {
        return Ok(Some([one; 3]));
    }
    let numbers: Option<Vec<f64>> = value
        .as_array()
        .map(|items| items.iter().filter_map(Value::as_f64).collect());
    match numbers.as_deref() {
        Some(&[a, b, c]) if value.as_array().is_some_and(|items| items.len() == 3) => {
            Ok(Some([a, b, c]))
        }
        _ => Err(wrong(key, "three numbers (one per RGB channel)")),
    }
}
