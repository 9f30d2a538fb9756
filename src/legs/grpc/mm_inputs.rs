//! Each engine's multimodal inputs for one leg (spec "Multimodal Requests"): pixels travel only
//! to the leg that runs the vision tower; a decode served by the handoff gets the images'
//! metadata (TokenSpeed: per-item hashes and placeholders; vLLM: identities and M-RoPE grid
//! tensors; SGLang: the grid and placeholders); a language-model-only vLLM decode gets only
//! the content hashes (and where they sit); an EPD prefill gets the items' encode rendezvous
//! instead of pixels. Tensors travel inline, float32 pixels and int64 grids, little-endian.

use std::collections::HashMap;

use pdgate_proto::common::Modality;
use pdgate_proto::{sglang, tokenspeed, vllm};

use super::media::{Item, Media};

/// What one leg carries of the request's images.
#[derive(Clone, Copy, Debug)]
pub enum MediaLeg<'a> {
    /// The pixel tensors (a prefill; a vLLM decode that computes the prompt itself, `n>1`).
    Pixels,
    /// The images' metadata without pixels (a decode served by the handoff).
    Metadata,
    /// Content hashes and placeholder ranges only (a `--language-model-only` vLLM decode).
    HashesOnly,
    /// EPD prefill: each item's embedding comes from its encode rendezvous.
    Encoded(&'a [EncodeRendezvous]),
}

/// One item's encode rendezvous: the encode worker's bootstrap server and the room.
#[derive(Clone, Debug)]
pub struct EncodeRendezvous {
    pub item_index: u32,
    pub host: String,
    pub port: u16,
    pub room: u64,
}

const FLOAT32: &str = "float32";
const INT64: &str = "int64";
const GRID_THW: &str = "image_grid_thw";
const PIXEL_VALUES: &str = "pixel_values";

fn grid_bytes<'a>(grids: impl Iterator<Item = &'a [u32; 3]>) -> (Vec<u8>, u32) {
    let mut out = Vec::new();
    let mut rows = 0;
    for g in grids {
        for v in g {
            out.extend_from_slice(&i64::from(*v).to_le_bytes());
        }
        rows += 1;
    }
    (out, rows)
}

/// All items' pixels concatenated on the first dimension (SGLang, vLLM batches).
fn concat_pixels(items: &[Item]) -> (Vec<u8>, Vec<u32>) {
    let mut bytes = Vec::with_capacity(items.iter().map(|i| i.pixels.len()).sum());
    let mut shape = items
        .first()
        .map(|i| i.pixel_shape.clone())
        .unwrap_or_default();
    let mut rows = 0;
    for i in items {
        bytes.extend_from_slice(&i.pixels);
        rows += i.pixel_shape.first().copied().unwrap_or(1);
    }
    if let Some(first) = shape.first_mut() {
        *first = rows;
    }
    (bytes, shape)
}

/// TokenSpeed: one item per image, each owning its tensors and placeholder.
pub fn tokenspeed(media: &Media, leg: MediaLeg<'_>) -> tokenspeed::MultimodalInputs {
    let items = media
        .items
        .iter()
        .map(|i| {
            let encoder_input = matches!(leg, MediaLeg::Pixels).then(|| tokenspeed::TensorData {
                shape: i.pixel_shape.clone(),
                dtype: FLOAT32.into(),
                payload: Some(tokenspeed::tensor_data::Payload::Inline(i.pixels.to_vec())),
            });
            let mut model_specific_tensors = HashMap::new();
            if let Some(g) = &i.grid_thw {
                let (bytes, rows) = grid_bytes(std::iter::once(g));
                model_specific_tensors.insert(
                    GRID_THW.to_string(),
                    tokenspeed::TensorData {
                        shape: vec![rows, 3],
                        dtype: INT64.into(),
                        payload: Some(tokenspeed::tensor_data::Payload::Inline(bytes)),
                    },
                );
            }
            tokenspeed::MultimodalItem {
                modality: Modality::Image as i32,
                content_hash: i.hash.to_vec(),
                encoder_input,
                model_specific_tensors,
                placeholders: vec![tokenspeed::PlaceholderRange {
                    offset: i.offset,
                    length: i.length,
                }],
                placeholder_token_id: Some(media.image_token_id),
            }
        })
        .collect();
    tokenspeed::MultimodalInputs { items }
}

/// TokenSpeed EPD prefill: where each item's embedding is fetched from.
pub fn tokenspeed_encode_info(rvs: &[EncodeRendezvous]) -> tokenspeed::EncodeBootstrapInfo {
    tokenspeed::EncodeBootstrapInfo {
        items: rvs
            .iter()
            .map(|r| tokenspeed::EncodeItemBootstrapInfo {
                item_index: r.item_index,
                bootstrap_host: r.host.clone(),
                bootstrap_port: i32::from(r.port),
                bootstrap_room: r.room as i64,
            })
            .collect(),
    }
}

/// SGLang: one batch; the decode gets everything but the pixels.
pub fn sglang(media: &Media, leg: MediaLeg<'_>) -> sglang::MultimodalInputs {
    let pixel_values = matches!(leg, MediaLeg::Pixels).then(|| {
        let (data, shape) = concat_pixels(&media.items);
        sglang::TensorData {
            data,
            shape,
            dtype: FLOAT32.into(),
        }
    });
    let mut model_specific_tensors = HashMap::new();
    if media.mrope {
        let (data, rows) = grid_bytes(media.items.iter().filter_map(|i| i.grid_thw.as_ref()));
        model_specific_tensors.insert(
            GRID_THW.to_string(),
            sglang::TensorData {
                data,
                shape: vec![rows, 3],
                dtype: INT64.into(),
            },
        );
    }
    sglang::MultimodalInputs {
        pixel_values,
        model_specific_tensors,
        im_token_id: Some(media.image_token_id),
        mm_placeholders: media
            .items
            .iter()
            .map(|i| sglang::PlaceholderRange {
                offset: i.offset,
                length: i.length,
            })
            .collect(),
        modalities: media.items.iter().map(|_| "image".to_string()).collect(),
        ..Default::default()
    }
}

/// vLLM, gateway-processed: one batch with per-image hashes; `batched_keys` / `flat_keys` say
/// how the engine splits it per image (Qwen2-VL's pixels are flat patch rows, split by the
/// grid).
pub fn vllm(media: &Media, leg: MediaLeg<'_>) -> vllm::MultimodalInputs {
    let placeholders = media
        .items
        .iter()
        .map(|i| vllm::PlaceholderRange {
            offset: i.offset,
            length: i.length,
        })
        .collect();
    let hashes = media.hash_hex();
    if matches!(leg, MediaLeg::HashesOnly) {
        return vllm::MultimodalInputs {
            mm_placeholders: placeholders,
            mm_hashes: hashes,
            modality: Modality::Image as i32,
            ..Default::default()
        };
    }
    let pixel_values = matches!(leg, MediaLeg::Pixels).then(|| {
        let (bytes, shape) = concat_pixels(&media.items);
        vllm::TensorData {
            shape,
            dtype: FLOAT32.into(),
            payload: Some(vllm::tensor_data::Payload::Inline(bytes)),
        }
    });
    let mut model_specific_tensors = HashMap::new();
    let mut batched_keys = Vec::new();
    let mut flat_keys = HashMap::new();
    if media.mrope {
        let (bytes, rows) = grid_bytes(media.items.iter().filter_map(|i| i.grid_thw.as_ref()));
        model_specific_tensors.insert(
            GRID_THW.to_string(),
            vllm::TensorData {
                shape: vec![rows, 3],
                dtype: INT64.into(),
                payload: Some(vllm::tensor_data::Payload::Inline(bytes)),
            },
        );
        batched_keys.push(GRID_THW.to_string());
        flat_keys.insert(PIXEL_VALUES.to_string(), GRID_THW.to_string());
    } else {
        batched_keys.push(PIXEL_VALUES.to_string());
    }
    vllm::MultimodalInputs {
        pixel_values,
        model_specific_tensors,
        im_token_id: Some(media.image_token_id),
        mm_placeholders: placeholders,
        mm_hashes: hashes,
        batched_keys,
        flat_keys,
        modality: Modality::Image as i32,
        ..Default::default()
    }
}

/// vLLM, worker-processed: the references in prompt order (one anchor per image in the ids).
pub fn vllm_media_refs(media: &Media) -> vllm::MediaRefs {
    vllm::MediaRefs {
        items: media
            .items
            .iter()
            .map(|i| vllm::MediaRef {
                modality: Modality::Image as i32,
                url: i.url.clone(),
            })
            .collect(),
    }
}
