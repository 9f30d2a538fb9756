//! The fake vision tower of the gRPC mocks, and everything a mock derives from the media that
//! reaches it: features of pixel tensors, of encoded images (vLLM worker-side processing) and of
//! encoder embeddings (TokenSpeed EPD), checked against the prompt's placeholder ranges.
//!
//! Independent on purpose: nothing here reuses the gateway's preprocessing. A feature is read
//! back from what arrived on the wire — the per-channel mean of the de-normalised pixels, or of
//! the decoded image — quantised to multiples of 16 so JPEG and resize noise on a solid colour
//! does not move it. A test predicts it from the colour it encoded ([`feature_of_rgb`]) and the
//! expected output from [`crate::fake_model::reference_with_media`].

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::Value;
use tonic::Status;

use crate::client;
use crate::config::Role;
use crate::engine::Shared;
use crate::job::{ErrorKind, Job};

/// The mock's vision tower (`MockEngineConfig::with_vision`).
#[derive(Clone, Debug, PartialEq)]
pub struct MockVision {
    /// The processor's `image_mean` (per channel, 0..1).
    pub image_mean: [f32; 3],
    /// The processor's `image_std`.
    pub image_std: [f32; 3],
    /// How pixel tensors are laid out.
    pub layout: PixelLayout,
    /// The placeholder token every id of an image's range must be.
    pub image_token_id: u32,
    /// vLLM worker-side processing: how many placeholder tokens one image expands to.
    pub worker_tokens_per_image: u32,
    /// vLLM `--language-model-only`: no vision tower; a decode takes only `mm_hashes` and
    /// `mm_placeholders` (`GetModelInfo.supports_vision` is false).
    pub language_model_only: bool,
    /// vLLM worker-side processing backend (`"inprocess"`): the worker accepts `media_refs` and
    /// advertises `mm_processor` / `mm_media_ref_schemes`. `None`: router-side processing only.
    pub mm_processor: Option<String>,
}

/// The layout of a pixel tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PixelLayout {
    /// `[N, 3, H, W]` float32 (CLIP / LLaVA).
    Chw,
    /// Qwen-VL patches: rows of `3 * temporal_patch * patch * patch` values, element order
    /// `(c, t, ph, pw)` within a row; an image has `t * h * w` rows of its `image_grid_thw`.
    QwenPatches { temporal_patch: u32, patch: u32 },
}

/// CLIP's normalisation (also Qwen2-VL's).
const CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
const CLIP_STD: [f32; 3] = [0.268_629_54, 0.261_302_6, 0.275_777_1];

impl MockVision {
    /// A CLIP/LLaVA-style tower: `[N, 3, H, W]` pixels, CLIP normalisation.
    pub fn chw(image_token_id: u32) -> Self {
        MockVision {
            image_mean: CLIP_MEAN,
            image_std: CLIP_STD,
            layout: PixelLayout::Chw,
            image_token_id,
            worker_tokens_per_image: 4,
            language_model_only: false,
            mm_processor: None,
        }
    }

    /// A Qwen2-VL-style tower: patches with `temporal_patch` 2 and `patch` 14.
    pub fn qwen(image_token_id: u32) -> Self {
        MockVision {
            layout: PixelLayout::QwenPatches {
                temporal_patch: 2,
                patch: 14,
            },
            ..MockVision::chw(image_token_id)
        }
    }

    pub fn with_normalization(mut self, mean: [f32; 3], std: [f32; 3]) -> Self {
        self.image_mean = mean;
        self.image_std = std;
        self
    }

    /// vLLM `--language-model-only`.
    pub fn language_model_only(mut self) -> Self {
        self.language_model_only = true;
        self
    }

    /// vLLM worker-side processing (`"inprocess"`), expanding each image to `tokens` tokens.
    pub fn with_worker_processing(mut self, processor: &str, tokens: u32) -> Self {
        self.mm_processor = Some(processor.to_string());
        self.worker_tokens_per_image = tokens.max(1);
        self
    }

    /// Whether the engine reports a vision tower (`GetModelInfo.supports_vision`).
    pub fn supports_vision(&self) -> bool {
        !self.language_model_only
    }
}

/// The feature of a solid colour: each channel rounded to the nearest multiple of 16, packed.
/// What the tower reads back from an image of that colour (pick channels away from 8 mod 16,
/// where JPEG noise could round either way).
pub fn feature_of_rgb(rgb: [u8; 3]) -> u64 {
    pack([rgb[0] as f64, rgb[1] as f64, rgb[2] as f64])
}

fn pack(means: [f64; 3]) -> u64 {
    means.iter().fold(0u64, |acc, m| {
        let level = (m / 16.0).round().clamp(0.0, 16.0) as u64;
        (acc << 8) | level
    })
}

/// A wire tensor, engine-neutral.
pub(crate) struct TensorView<'a> {
    pub shape: &'a [u32],
    pub dtype: &'a str,
    /// The inline little-endian bytes; `None` when the payload is not inline (shm, remote).
    pub bytes: Option<&'a [u8]>,
}

impl TensorView<'_> {
    fn elements(&self) -> usize {
        self.shape.iter().map(|&d| d as usize).product()
    }

    fn inline(&self, what: &str) -> Result<&[u8], String> {
        self.bytes.ok_or_else(|| {
            format!("{what}: only inline tensor payloads are supported by the mock engine")
        })
    }

    fn f32s(&self, what: &str) -> Result<Vec<f32>, String> {
        if self.dtype != "float32" {
            return Err(format!(
                "{what}: dtype {:?} is not supported (float32 expected)",
                self.dtype
            ));
        }
        let b = self.inline(what)?;
        if b.len() != self.elements() * 4 {
            return Err(format!(
                "{what}: {} bytes do not hold a float32 tensor of shape {:?}",
                b.len(),
                self.shape
            ));
        }
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// An int64 `[N, 3]` grid (`image_grid_thw`).
    pub(crate) fn grid(&self) -> Result<Vec<[i64; 3]>, String> {
        let what = "image_grid_thw";
        if self.dtype != "int64" || self.shape.len() != 2 || self.shape[1] != 3 {
            return Err(format!(
                "{what}: expected int64 [N, 3], got {} {:?}",
                self.dtype, self.shape
            ));
        }
        let b = self.inline(what)?;
        if b.len() != self.elements() * 8 {
            return Err(format!(
                "{what}: {} bytes for shape {:?}",
                b.len(),
                self.shape
            ));
        }
        let v: Vec<i64> = b
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect();
        Ok(v.chunks_exact(3).map(|r| [r[0], r[1], r[2]]).collect())
    }
}

/// One feature per image of a pixel tensor (all images concatenated on dim 0), in order.
pub(crate) fn features_of_pixels(
    v: &MockVision,
    pixels: &TensorView,
    grid: Option<&[[i64; 3]]>,
) -> Result<Vec<u64>, String> {
    let x = pixels.f32s("pixel values")?;
    // Per image, per channel: (sum of x, count); the de-normalisation is linear, so it applies
    // to the mean.
    let sums: Vec<[(f64, usize); 3]> = match v.layout {
        PixelLayout::Chw => {
            let (n, c, hw) = match pixels.shape {
                [n, c, h, w] => (*n as usize, *c as usize, (*h * *w) as usize),
                [c, h, w] => (1, *c as usize, (*h * *w) as usize),
                s => return Err(format!("pixel values: expected [N, 3, H, W], got {s:?}")),
            };
            if c != 3 || hw == 0 {
                return Err(format!(
                    "pixel values: expected [N, 3, H, W], got {:?}",
                    pixels.shape
                ));
            }
            (0..n)
                .map(|i| {
                    let mut s = [(0.0, hw); 3];
                    for (ch, slot) in s.iter_mut().enumerate() {
                        let start = (i * 3 + ch) * hw;
                        slot.0 = x[start..start + hw].iter().map(|&f| f as f64).sum();
                    }
                    s
                })
                .collect()
        }
        PixelLayout::QwenPatches {
            temporal_patch,
            patch,
        } => {
            let per_channel = (temporal_patch * patch * patch) as usize;
            let dim = 3 * per_channel;
            let [rows, d] = pixels.shape else {
                return Err(format!(
                    "pixel values: expected patch rows [R, {dim}], got {:?}",
                    pixels.shape
                ));
            };
            if *d as usize != dim {
                return Err(format!(
                    "pixel values: rows of {d} values, expected 3*{temporal_patch}*{patch}*{patch} = {dim}"
                ));
            }
            let grid = grid.ok_or("pixel values: Qwen patches need image_grid_thw")?;
            let per_image: Vec<usize> = grid
                .iter()
                .map(|[t, h, w]| (t * h * w).max(0) as usize)
                .collect();
            let total: usize = per_image.iter().sum();
            if total != *rows as usize {
                return Err(format!(
                    "pixel values: {rows} patch rows, image_grid_thw {grid:?} needs {total}"
                ));
            }
            let mut row = 0;
            per_image
                .iter()
                .map(|&n| {
                    let mut s = [(0.0, n * per_channel); 3];
                    for r in row..row + n {
                        for (ch, slot) in s.iter_mut().enumerate() {
                            let start = r * dim + ch * per_channel;
                            slot.0 += x[start..start + per_channel]
                                .iter()
                                .map(|&f| f as f64)
                                .sum::<f64>();
                        }
                    }
                    row += n;
                    s
                })
                .collect()
        }
    };
    Ok(sums
        .iter()
        .map(|s| {
            let mut means = [0.0; 3];
            for ch in 0..3 {
                let mean_x = s[ch].0 / s[ch].1.max(1) as f64;
                means[ch] = (mean_x * v.image_std[ch] as f64 + v.image_mean[ch] as f64) * 255.0;
            }
            pack(means)
        })
        .collect())
}

/// The feature of an encoded image (PNG, JPEG, WebP, GIF): its mean colour, quantised.
pub(crate) fn feature_of_image(bytes: &[u8]) -> Result<u64, String> {
    let img = image::load_from_memory(bytes)
        .map_err(|e| format!("cannot decode image: {e}"))?
        .to_rgb8();
    let n = (img.width() as f64 * img.height() as f64).max(1.0);
    let mut sum = [0.0f64; 3];
    for p in img.pixels() {
        for (s, &c) in sum.iter_mut().zip(&p.0) {
            *s += c as f64;
        }
    }
    Ok(pack([sum[0] / n, sum[1] / n, sum[2] / n]))
}

/// The content hash the gateway computes for a media item: blake3 of the encoded bytes, hex.
pub fn content_hash_hex(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// Fetches a media URL as vLLM's MediaConnector would: `data:` (base64) and plain `http://`.
pub(crate) async fn fetch_media(shared: &Shared, url: &str) -> Result<Vec<u8>, String> {
    if let Some(rest) = url.strip_prefix("data:") {
        let (head, data) = rest
            .split_once(',')
            .ok_or("malformed data URL (no comma)")?;
        if !head.ends_with(";base64") {
            return Err("data URL is not base64".into());
        }
        return base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|e| format!("bad base64 in data URL: {e}"));
    }
    if url.starts_with("http://") {
        let opts = client::ClientOptions {
            source_ip: Some(shared.cfg.bind_ip),
            timeout: Some(Duration::from_secs(10)),
        };
        let r = client::request_with(&opts, "GET", url, &[], None)
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        if r.status != 200 {
            return Err(format!("GET {url}: HTTP {}", r.status));
        }
        return Ok(r.body.to_vec());
    }
    let scheme = url.split(':').next().unwrap_or_default();
    Err(format!(
        "URL scheme {scheme:?} is not fetched by the mock engine (data:, http://)"
    ))
}

/// One image's placeholder range in the prompt, with the feature this leg has for it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct MediaSpan {
    pub range: Range<usize>,
    pub feature: Option<u64>,
}

/// The `(range, feature)` pairs a leg that has every feature folds, or the refusal of a leg
/// that must compute the prompt without them.
pub(crate) fn computable(spans: &[MediaSpan]) -> Result<Vec<(Range<usize>, u64)>, String> {
    spans
        .iter()
        .map(|s| match s.feature {
            Some(f) => Ok((s.range.clone(), f)),
            None => Err(missing_pixels(s.range.start)),
        })
        .collect()
}

pub(crate) fn missing_pixels(offset: usize) -> String {
    format!("image placeholders at offset {offset} have no pixel data")
}

/// Checks the declared ranges against the prompt (inside it, every id the image token), then
/// adds the image-token runs no range declares, featureless: a leg that must compute them
/// refuses them as images without pixels.
pub(crate) fn check_placeholders(
    ids: &[u32],
    declared: Vec<MediaSpan>,
    image_token_id: Option<u32>,
) -> Result<Vec<MediaSpan>, Status> {
    let mut covered = vec![false; ids.len()];
    for s in &declared {
        if s.range.end > ids.len() || s.range.is_empty() {
            return Err(Status::invalid_argument(format!(
                "image placeholder range [{}, {}) is outside the prompt of {} tokens",
                s.range.start,
                s.range.end,
                ids.len()
            )));
        }
        if let Some(tok) = image_token_id {
            if let Some(p) = s.range.clone().find(|&p| ids[p] != tok) {
                return Err(Status::invalid_argument(format!(
                    "image placeholder range [{}, {}) holds token {} at offset {p}, not the image token {tok}",
                    s.range.start, s.range.end, ids[p]
                )));
            }
        }
        covered[s.range.clone()].iter_mut().for_each(|c| *c = true);
    }
    let mut spans = declared;
    if let Some(tok) = image_token_id {
        let mut p = 0;
        while p < ids.len() {
            if ids[p] == tok && !covered[p] {
                let start = p;
                while p < ids.len() && ids[p] == tok && !covered[p] {
                    p += 1;
                }
                spans.push(MediaSpan {
                    range: start..p,
                    feature: None,
                });
            } else {
                p += 1;
            }
        }
    }
    spans.sort_by_key(|s| s.range.start);
    Ok(spans)
}

/// Whether this leg computes the prompt itself when nothing else is known (a decode normally
/// takes it from the handoff; it recomputes only at run time, and refuses then).
pub(crate) fn computes_prompt(role: Role) -> bool {
    matches!(role, Role::Both | Role::Prefill)
}

/// A TokenSpeed EPD item: its embedding comes from an encode worker's bootstrap server.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct EmbeddingFetch {
    /// Where the item's placeholder range starts in the prompt.
    pub offset: usize,
    pub item_index: u32,
    pub host: String,
    pub port: u16,
    pub room: u64,
}

/// What a request's media still needs before the job runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) enum PendingMedia {
    #[default]
    Nothing,
    /// TokenSpeed EPD prefill: fetch these embeddings.
    Embeddings(Vec<EmbeddingFetch>),
    /// vLLM worker-side processing: fetch and decode these URLs, expand each image anchor.
    MediaRefs {
        urls: Vec<String>,
        image_token_id: u32,
    },
}

/// vLLM: what the prefill learned about the media it processed (`GenerateComplete.media_identity`).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct MediaIdentityOut {
    pub prompt_token_ids: Vec<u32>,
    pub hashes: Vec<String>,
    pub placeholders: Vec<(u32, u32)>,
    pub im_token_id: u32,
}

/// A servicer's reading of a request's media.
#[derive(Clone, Debug, Default)]
pub(crate) struct MediaPlan {
    pub spans: Vec<MediaSpan>,
    pub pending: PendingMedia,
    /// vLLM prefill with worker-side processing: return the media identity.
    pub return_identity: bool,
}

/// Fetches what `pending` names and writes the features (and, for `media_refs`, the expanded
/// prompt) into every item of `job`. Returns the media identity a vLLM prefill hands back.
pub(crate) async fn resolve(
    shared: &Arc<Shared>,
    seq: u64,
    job: &mut Job,
    pending: PendingMedia,
) -> Result<Option<MediaIdentityOut>, Status> {
    match pending {
        PendingMedia::Nothing => Ok(None),
        PendingMedia::Embeddings(fetches) => {
            for f in &fetches {
                let feature = fetch_embedding(shared, f).await?;
                for item in &mut job.items {
                    for s in item.media.iter_mut().filter(|s| s.range.start == f.offset) {
                        s.feature = Some(feature);
                    }
                }
            }
            record_features(shared, seq, job);
            Ok(None)
        }
        PendingMedia::MediaRefs {
            urls,
            image_token_id,
        } => {
            let mut features = Vec::new();
            let mut hashes = Vec::new();
            for (i, url) in urls.iter().enumerate() {
                shared.counters.with(|c| c.media_fetches += 1);
                let bytes = fetch_media(shared, url)
                    .await
                    .map_err(|e| Status::invalid_argument(format!("media_refs[{i}]: {e}")))?;
                let f = feature_of_image(&bytes)
                    .map_err(|e| Status::invalid_argument(format!("media_refs[{i}]: {e}")))?;
                features.push(f);
                hashes.push(content_hash_hex(&bytes));
            }
            let per = shared
                .cfg
                .vision
                .as_ref()
                .map_or(1, |v| v.worker_tokens_per_image.max(1)) as usize;
            let Some(first) = job.items.first() else {
                return Ok(None);
            };
            let (ids, spans) = expand_anchors(&first.prompt_ids, image_token_id, per, &features);
            for item in &mut job.items {
                item.prompt_ids = ids.clone();
                item.media = spans.clone();
            }
            let placeholders: Vec<(u32, u32)> = spans
                .iter()
                .map(|s| (s.range.start as u32, s.range.len() as u32))
                .collect();
            shared.recorder.update(seq, |r| {
                if let Some(mm) = r.mm.as_mut() {
                    mm.hashes = hashes.clone();
                    mm.placeholders = placeholders.iter().map(|&(o, l)| [o, l]).collect();
                    mm.im_token_id = Some(image_token_id);
                }
            });
            record_features(shared, seq, job);
            Ok(Some(MediaIdentityOut {
                prompt_token_ids: ids,
                hashes,
                placeholders,
                im_token_id: image_token_id,
            }))
        }
    }
}

/// Expands each `anchor` of `ids` to `per` copies; one span per anchor with its feature.
fn expand_anchors(
    ids: &[u32],
    anchor: u32,
    per: usize,
    features: &[u64],
) -> (Vec<u32>, Vec<MediaSpan>) {
    let mut out = Vec::with_capacity(ids.len() + features.len() * per);
    let mut spans = Vec::new();
    for &t in ids {
        if t == anchor && spans.len() < features.len() {
            let start = out.len();
            out.extend(std::iter::repeat_n(anchor, per));
            spans.push(MediaSpan {
                range: start..out.len(),
                feature: Some(features[spans.len()]),
            });
        } else {
            out.push(t);
        }
    }
    (out, spans)
}

/// The record's `features`: one per item, as this leg uses them.
pub(crate) fn record_features(shared: &Shared, seq: u64, job: &Job) {
    let Some(item) = job.items.first() else {
        return;
    };
    let features: Vec<Option<u64>> = item.media.iter().map(|s| s.feature).collect();
    shared.recorder.update(seq, |r| {
        if let Some(mm) = r.mm.as_mut() {
            mm.features = features;
        }
    });
}

/// Waits for one item's embedding on its encode worker's bootstrap server, up to this
/// prefill's `bootstrap_timeout` (TokenSpeed's embedding-receive timeout).
async fn fetch_embedding(shared: &Shared, f: &EmbeddingFetch) -> Result<u64, Status> {
    let timeout = shared.cfg.bootstrap_timeout;
    let deadline = Instant::now() + timeout;
    let addr = format!("{}:{}", f.host, f.port);
    let mut last_error = String::from("no answer");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let wait = left.min(Duration::from_secs(1));
        let url = format!(
            "http://{addr}/embedding/{}?wait_ms={}",
            f.room,
            wait.as_millis()
        );
        let opts = client::ClientOptions {
            source_ip: Some(shared.cfg.bind_ip),
            timeout: Some(wait + Duration::from_secs(1)),
        };
        match client::request_with(&opts, "GET", &url, &[], None).await {
            Ok(r) if r.status == 200 => {
                let v: Value = serde_json::from_slice(&r.body).unwrap_or_default();
                if let Some(feature) = v.get("feature").and_then(Value::as_u64) {
                    shared.counters.with(|c| c.embeddings_received += 1);
                    return Ok(feature);
                }
                last_error = format!("malformed embedding answer: {}", r.text());
            }
            Ok(r) => {
                last_error = format!("HTTP {}: {}", r.status, r.text());
            }
            Err(e) => {
                last_error = format!("unreachable: {e}");
                // The encoder's bootstrap server is down: retry within the deadline.
                tokio::time::sleep(left.min(Duration::from_millis(50))).await;
            }
        }
    }
    let e = crate::job::ApiError::internal(format!(
        "EmbeddingTransferError: no multimodal embedding for item {} (bootstrap_room {}) from encode worker {addr} within {}s ({last_error})",
        f.item_index,
        f.room,
        timeout.as_secs_f64()
    ))
    .with_kind(ErrorKind::KvTimeout);
    Err(crate::grpc::status_of(shared, &e))
}

/// A leg's media plan: the declared ranges checked against the prompt, image-token runs no
/// range declares added; a leg that computes the prompt refuses an image it has neither pixels
/// nor a pending embedding for.
pub(crate) fn plan(
    role: Role,
    ids: &[u32],
    declared: Vec<MediaSpan>,
    image_token_id: Option<u32>,
    pending: PendingMedia,
) -> Result<MediaPlan, Status> {
    let spans = check_placeholders(ids, declared, image_token_id)?;
    if computes_prompt(role) {
        let coming: Vec<usize> = match &pending {
            PendingMedia::Embeddings(f) => f.iter().map(|f| f.offset).collect(),
            _ => Vec::new(),
        };
        if let Some(s) = spans
            .iter()
            .find(|s| s.feature.is_none() && !coming.contains(&s.range.start))
        {
            return Err(Status::invalid_argument(missing_pixels(s.range.start)));
        }
    }
    Ok(MediaPlan {
        spans,
        pending,
        return_identity: false,
    })
}

/// A request's `image_grid_thw` rows (`None`: not sent), or why they do not parse.
pub(crate) type GridRows = Result<Option<Vec<[i64; 3]>>, String>;

/// Router-side processing (SGLang, vLLM): one placeholder range per image, the features from
/// one pixel tensor holding every image on dim 0 (with its `image_grid_thw`), when it came.
pub(crate) fn placeholders_plan(
    role: Role,
    v: &MockVision,
    ids: &[u32],
    ranges: &[(u32, u32)],
    pixels: Option<(TensorView, GridRows)>,
    image_token_id: u32,
) -> Result<MediaPlan, Status> {
    let features = match pixels {
        Some((t, grid)) => {
            let grid = grid.map_err(Status::invalid_argument)?;
            let f = features_of_pixels(v, &t, grid.as_deref()).map_err(Status::invalid_argument)?;
            if f.len() != ranges.len() {
                return Err(Status::invalid_argument(format!(
                    "pixel_values hold {} images for {} mm_placeholders",
                    f.len(),
                    ranges.len()
                )));
            }
            Some(f)
        }
        None => None,
    };
    let spans = ranges
        .iter()
        .enumerate()
        .map(|(i, &(offset, len))| MediaSpan {
            range: offset as usize..(offset + len) as usize,
            feature: features.as_ref().and_then(|f| f.get(i).copied()),
        })
        .collect();
    plan(
        role,
        ids,
        spans,
        Some(image_token_id),
        PendingMedia::Nothing,
    )
}

/// Lower-case hex of raw bytes (TokenSpeed's 32-byte `content_hash`).
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The refusal of a model without a vision tower.
pub(crate) fn no_vision() -> Status {
    Status::invalid_argument("this model does not accept multimodal inputs (no vision tower)")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chw_pixels(v: &MockVision, rgb: [u8; 3], h: usize, w: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for (ch, &c) in rgb.iter().enumerate() {
            let x = (c as f32 / 255.0 - v.image_mean[ch]) / v.image_std[ch];
            for _ in 0..h * w {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        out
    }

    #[test]
    fn a_solid_colour_reads_back_as_its_quantised_feature() {
        let v = MockVision::chw(9);
        let mut bytes = chw_pixels(&v, [250, 10, 130], 2, 2);
        bytes.extend(chw_pixels(&v, [0, 64, 255], 2, 2));
        let shape = [2, 3, 2, 2];
        let t = TensorView {
            shape: &shape,
            dtype: "float32",
            bytes: Some(&bytes),
        };
        assert_eq!(
            features_of_pixels(&v, &t, None).unwrap(),
            vec![feature_of_rgb([250, 10, 130]), feature_of_rgb([0, 64, 255])]
        );
        assert_ne!(feature_of_rgb([250, 10, 130]), feature_of_rgb([0, 64, 255]));
        // Noise below half a step does not move the feature.
        assert_eq!(
            feature_of_rgb([250, 10, 130]),
            feature_of_rgb([253, 12, 127])
        );
    }

    #[test]
    fn qwen_patches_split_by_the_grid() {
        let v = MockVision {
            layout: PixelLayout::QwenPatches {
                temporal_patch: 1,
                patch: 2,
            },
            ..MockVision::chw(9)
        };
        // Image 0: 2 rows red, image 1: 1 row blue; rows of (c, t, ph, pw) = 3*1*2*2 values.
        let row = |rgb: [u8; 3]| -> Vec<u8> { chw_pixels(&v, rgb, 2, 2) };
        let mut bytes = row([240, 0, 0]);
        bytes.extend(row([240, 0, 0]));
        bytes.extend(row([0, 0, 240]));
        let shape = [3, 12];
        let t = TensorView {
            shape: &shape,
            dtype: "float32",
            bytes: Some(&bytes),
        };
        let grid = [[1, 1, 2], [1, 1, 1]];
        assert_eq!(
            features_of_pixels(&v, &t, Some(&grid)).unwrap(),
            vec![feature_of_rgb([240, 0, 0]), feature_of_rgb([0, 0, 240])]
        );
        assert!(features_of_pixels(&v, &t, Some(&[[1, 1, 2]])).is_err());
    }

    #[test]
    fn undeclared_image_tokens_become_featureless_spans() {
        let declared = vec![MediaSpan {
            range: 1..3,
            feature: Some(5),
        }];
        let spans = check_placeholders(&[1, 9, 9, 4, 9, 9, 2], declared, Some(9)).unwrap();
        assert_eq!(spans[1].range, 4..6);
        assert_eq!(spans[1].feature, None);
        assert_eq!(
            computable(&spans).unwrap_err(),
            "image placeholders at offset 4 have no pixel data"
        );
        let wrong = vec![MediaSpan {
            range: 1..4,
            feature: Some(5),
        }];
        assert!(check_placeholders(&[1, 9, 9, 4], wrong, Some(9)).is_err());
    }

    #[test]
    fn anchors_expand_in_prompt_order() {
        let (ids, spans) = expand_anchors(&[1, 9, 3, 9, 4], 9, 3, &[7, 8]);
        assert_eq!(ids, vec![1, 9, 9, 9, 3, 9, 9, 9, 4]);
        assert_eq!(spans[0].range, 1..4);
        assert_eq!(spans[1].range, 5..8);
        assert_eq!(spans[1].feature, Some(8));
    }
}
