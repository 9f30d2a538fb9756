//! The images of a gRPC request, prepared once per request (not per attempt) after the prompt
//! is tokenized: the limit, the model's image processor, where the media is processed, then
//! either the media references a vLLM worker fetches itself, or the gateway's own pipeline —
//! each distinct URL fetched once through the media policy (`pdgate-media`), every image
//! decoded and preprocessed off the reactor (`pdgate-mm`), hashed, and its placeholder
//! expanded in the prompt to the image's token count.
//!
//! What each leg then carries (pixels on the prefill only, metadata on the decode, embeddings
//! from encode workers in EPD) is `build`'s business.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use pdgate_convert::{MediaRef, MediaSource};
use pdgate_filters::errors::ErrorCode;
use pdgate_media::{Fetcher, MediaError};
use pdgate_mm::MmError;

use super::engine::Engine;
use crate::config::{defaults, MmProcessing};
use crate::gateway::Gateway;
use crate::models::Vision;
use crate::reply::Reply;
use crate::workers::select::Pair;

/// Where the images are processed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Processing {
    /// By the gateway: legs carry tensors.
    Gateway,
    /// By the vLLM prefill worker: it gets `media_refs` and returns the media identity.
    WorkerRefs,
}

/// The request's images, ready for the legs.
pub struct Media {
    pub items: Vec<Item>,
    pub processing: Processing,
    /// Qwen2-VL's M-RoPE: the decode needs the grid tensors to compute positions.
    pub mrope: bool,
    /// The prompt token each image expands.
    pub image_token_id: u32,
}

/// One image, in prompt order.
pub struct Item {
    /// The client's reference (`data:` for inline data), for worker-side processing.
    pub url: String,
    /// blake3 of the encoded bytes (gateway processing only; zero otherwise).
    pub hash: [u8; 32],
    /// float32 little-endian pixels (empty for worker-side processing).
    pub pixels: Bytes,
    pub pixel_shape: Vec<u32>,
    /// Qwen2-VL's `image_grid_thw` row.
    pub grid_thw: Option<[u32; 3]>,
    /// Where the image's tokens are in the prompt (after expansion; the single anchor for
    /// worker-side processing).
    pub offset: u32,
    pub length: u32,
}

impl Media {
    pub fn hash_hex(&self) -> Vec<String> {
        self.items
            .iter()
            .map(|i| pdgate_mm::hash_hex(&i.hash))
            .collect()
    }
}

/// Prepares `refs` for `pair` and rewrites `prompt_ids` (placeholders expanded). `Err`: the
/// client's answer.
pub async fn prepare(
    gw: &Gateway,
    pair: &Pair,
    refs: &[MediaRef],
    prompt_ids: &mut Vec<u32>,
    tokenizer: &pdgate_tokenize::Tokenizer,
) -> Result<Arc<Media>, Reply> {
    let cfg = gw.config();
    let limit = cfg
        .mm_per_request_image_limit
        .unwrap_or(defaults::MM_PER_REQUEST_IMAGE_LIMIT);
    if refs.len() > limit as usize {
        return Err(Reply::error(
            ErrorCode::TooManyImages,
            format!("at most {limit} images are allowed per request"),
        ));
    }
    let engine = Engine::of(pair.prefill.runtime());
    if cfg.epd_disaggregation && cfg.mm_processing == MmProcessing::Worker {
        return Err(Reply::error(
            ErrorCode::MultimodalNotSupported,
            "EPD encode workers take preprocessed media only; with --mm-processing worker an EPD \
             request cannot carry images",
        ));
    }
    // A PD prefill must run the vision tower itself (EPD prefills take embeddings instead).
    if !cfg.epd_disaggregation && reports_no_vision(&pair.prefill) {
        return Err(Reply::error(
            ErrorCode::MultimodalNotSupported,
            format!(
                "image input is not supported by the prefill worker {}: it accepts no vision input \
                 (the engine runs as a language model only)",
                pair.prefill.url()
            ),
        ));
    }
    let vision = gw
        .models
        .vision(tokenizer, || pair.prefill.tokenizer_source())
        .await
        .map_err(|why| Reply::error(ErrorCode::MultimodalNotSupported, why))?
        .ok_or_else(|| {
            Reply::error(
                ErrorCode::MultimodalNotSupported,
                "image input is not supported by this model: its directory has no \
                 preprocessor_config.json",
            )
        })?;
    let anchors = prompt_ids
        .iter()
        .filter(|&&t| t == vision.image_token_id)
        .count();
    if anchors != refs.len() {
        return Err(Reply::error(
            ErrorCode::InvalidMedia,
            format!(
                "the chat template wrote {anchors} image placeholders for {} images; images must \
                 be content parts of user messages",
                refs.len()
            ),
        ));
    }
    let processing = match (engine, cfg.mm_processing) {
        (Some(Engine::Vllm), MmProcessing::Worker) => Processing::WorkerRefs,
        (Some(Engine::Vllm), MmProcessing::Auto)
            if pair
                .prefill
                .label("mm_processor")
                .is_some_and(|p| !p.is_empty()) =>
        {
            Processing::WorkerRefs
        }
        _ => Processing::Gateway,
    };
    let mrope = vision.processor.uses_mrope();
    let image_token_id = vision.image_token_id;
    let items = match processing {
        Processing::WorkerRefs => worker_refs(gw, refs, prompt_ids, image_token_id)?,
        Processing::Gateway => gateway_items(gw, refs, prompt_ids, vision).await?,
    };
    Ok(Arc::new(Media {
        items,
        processing,
        mrope,
        image_token_id,
    }))
}

/// Worker-side processing: each reference is checked against the media policy (scheme, domain
/// list, literal private addresses) and passed on; the prompt keeps one anchor per image.
fn worker_refs(
    gw: &Gateway,
    refs: &[MediaRef],
    prompt_ids: &[u32],
    image_token_id: u32,
) -> Result<Vec<Item>, Reply> {
    let fetcher = gw.media_fetcher();
    let policy = fetcher.policy();
    let anchors = prompt_ids
        .iter()
        .enumerate()
        .filter(|(_, &t)| t == image_token_id)
        .map(|(i, _)| i as u32);
    refs.iter()
        .zip(anchors)
        .map(|(r, offset)| {
            let url = r.url();
            if let MediaSource::Url(u) = &r.source {
                if !u.starts_with("data:") {
                    pdgate_media::check_target(u, policy).map_err(fetch_failed)?;
                }
            }
            Ok(Item {
                url,
                hash: [0; 32],
                pixels: Bytes::new(),
                pixel_shape: Vec::new(),
                grid_thw: None,
                offset,
                length: 1,
            })
        })
        .collect()
}

/// The gateway's pipeline: fetch (each distinct URL once, concurrently), then decode,
/// preprocess and hash off the reactor, then expand the placeholders.
async fn gateway_items(
    gw: &Gateway,
    refs: &[MediaRef],
    prompt_ids: &mut Vec<u32>,
    vision: Arc<Vision>,
) -> Result<Vec<Item>, Reply> {
    let fetcher: Fetcher = gw.media_fetcher();
    let max_bytes = fetcher.policy().max_bytes;
    // Distinct sources, in first-appearance order; `slot[i]` is image i's source.
    let mut distinct: Vec<&MediaSource> = Vec::new();
    let mut index: HashMap<&MediaSource, usize> = HashMap::new();
    let slot: Vec<usize> = refs
        .iter()
        .map(|r| {
            *index.entry(&r.source).or_insert_with(|| {
                distinct.push(&r.source);
                distinct.len() - 1
            })
        })
        .collect();
    let fetches = distinct.iter().map(|src| {
        let fetcher = fetcher.clone();
        async move {
            match src {
                MediaSource::Url(u) => fetcher.fetch(u).await.map(|m| m.bytes),
                MediaSource::Base64 { data, .. } => pdgate_media::decode_base64(data, max_bytes),
            }
        }
    });
    let image_token_id = vision.image_token_id;
    let bytes: Vec<Bytes> = futures::future::try_join_all(fetches)
        .await
        .map_err(fetch_failed)?;
    let processed = tokio::task::spawn_blocking(move || {
        bytes
            .iter()
            .map(|b| {
                let img = pdgate_mm::decode_image(b, pdgate_mm::DEFAULT_MAX_PIXELS)?;
                let out = vision.processor.process(&img)?;
                Ok((pdgate_mm::content_hash(b), out))
            })
            .collect::<Result<Vec<_>, MmError>>()
    })
    .await
    .map_err(|e| Reply::error(ErrorCode::InternalError, format!("preprocessing: {e}")))?
    .map_err(invalid_media)?;
    let counts: Vec<u32> = slot.iter().map(|&s| processed[s].1.num_tokens).collect();
    let (expanded, ranges) = pdgate_mm::expand_placeholders(prompt_ids, image_token_id, &counts)
        .map_err(invalid_media)?;
    *prompt_ids = expanded;
    Ok(refs
        .iter()
        .zip(slot)
        .zip(ranges)
        .map(|((r, s), range)| {
            let (hash, out) = &processed[s];
            Item {
                url: r.url(),
                hash: *hash,
                pixels: Bytes::from(out.pixel_bytes_le()),
                pixel_shape: out.shape.clone(),
                grid_thw: out.grid_thw,
                offset: range.offset,
                length: range.length,
            }
        })
        .collect())
}

fn fetch_failed(e: MediaError) -> Reply {
    Reply::error(ErrorCode::MediaFetchFailed, format!("image: {e}"))
}

fn invalid_media(e: MmError) -> Reply {
    Reply::error(ErrorCode::InvalidMedia, format!("image: {e}"))
}

/// The worker's servicer reports no vision support (`supports_vision: false`): the engine
/// runs as a language model only (vLLM's `--language-model-only`) — it takes token ids, the
/// handoff and image hashes, never pixels.
pub fn reports_no_vision(w: &crate::workers::Worker) -> bool {
    w.label("supports_vision") == Some("false")
}

/// What a language-model-only vLLM decode cannot serve (spec "Multimodal Requests"), checked
/// before any leg goes out. `n`: the samples the client asked for.
pub fn check_language_model_only_decode(
    media: &Media,
    decode: &crate::workers::Worker,
    n: u32,
) -> Result<(), Reply> {
    if Engine::of(decode.runtime()) != Some(Engine::Vllm) || !reports_no_vision(decode) {
        return Ok(());
    }
    let (code, why) = if n > 1 {
        (
            ErrorCode::PdDecodeLanguageModelOnlyNSamples,
            "n>1 parallel sampling of a multimodal prompt recomputes it on the decode leg, which \
             a decode worker running with --language-model-only cannot do; add a decode worker \
             with the vision encoder enabled",
        )
    } else if media.processing == Processing::WorkerRefs {
        (
            ErrorCode::PdDecodeLanguageModelOnlyMediaRefs,
            "a decode worker running with --language-model-only cannot expand media references; \
             add a decode worker with the vision encoder or use gateway-side processing \
             (--mm-processing router)",
        )
    } else if media.mrope {
        (
            ErrorCode::PdDecodeLanguageModelOnlyMrope,
            "the decode leg of this M-RoPE model needs the image grid tensors, which a decode \
             worker running with --language-model-only cannot take; add a decode worker with \
             the vision encoder enabled for this model",
        )
    } else {
        return Ok(());
    };
    Err(Reply::error(
        code,
        format!(
            "no decode worker with a vision encoder is paired for this model ({}): {why}",
            decode.url()
        ),
    ))
}
