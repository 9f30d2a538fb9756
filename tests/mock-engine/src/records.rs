//! What an engine remembers about every request it received (`GET /mock/requests`) and the
//! counters behind `/mock/stats` and `/metrics` (mock-engines-spec §2.2 item 4, §2.6).

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Milliseconds since a process-wide epoch, shared by every in-process engine so timelines of
/// the two legs of one request compare directly.
pub fn now_ms() -> f64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_secs_f64() * 1000.0
}

/// Handoff fields parsed from the request body.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ParsedFields {
    pub stream: bool,
    pub max_tokens_effective: Option<u64>,
    pub n: Option<u64>,
    pub ignore_eos: Option<bool>,
    pub stop: Option<Value>,
    pub bootstrap_host: Option<Value>,
    pub bootstrap_port: Option<Value>,
    pub bootstrap_room: Option<Value>,
    pub routed_dp_rank: Option<Value>,
    pub disagg_prefill_dp_rank: Option<Value>,
    pub kv_transfer_params: Option<Value>,
    pub has_stream_options: bool,
    pub min_tokens: Option<Value>,
}

/// One handoff item (one room / one transfer).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ItemHandoff {
    pub room: Option<u64>,
    /// The address this engine actually dialled for the handoff (decode: the bootstrap / side
    /// channel / Mooncake bootstrap addr; prefill: the decode that registered as receiver).
    pub peer_addr: Option<String>,
    /// `remote` | `recompute` | `fake` | `none` | `garbage` | `stale`.
    pub kv_source: Option<String>,
    /// `ok` | `mismatch` | `n/a`.
    pub integrity: Option<String>,
    /// Hex digest of the prompt state handed over / received.
    pub prompt_digest: Option<String>,
    pub route_attempts: u32,
    pub wait_ms: Option<f64>,
    pub error: Option<String>,
    /// The DP rank the room was placed on (SGLang / TokenSpeed prefill).
    #[serde(default)]
    pub dp_rank: Option<u32>,
}

/// The handoff as this engine saw it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Handoff {
    /// `prefill` | `decode` | `both`.
    pub role: String,
    /// `sglang-mooncake`, `nixl`, `mooncake`, `moriio-read`, `moriio-write`, `none`, ...
    pub protocol: String,
    /// First item's peer (the usual single-item case).
    pub peer_addr: Option<String>,
    pub room: Option<u64>,
    pub rooms: Vec<u64>,
    pub kv_source: Option<String>,
    pub transfer_id: Option<String>,
    pub remote_request_id: Option<String>,
    pub remote_engine_id: Option<String>,
    /// `kv_transfer_params` this engine returned (vLLM prefill).
    pub returned_params: Option<Value>,
    pub items: Vec<ItemHandoff>,
    /// Free-form events (`fault:hang`, `receiver registered`, ...), each with its time in ms.
    pub timeline: Vec<(f64, String)>,
}

/// How the request ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub status: Option<u16>,
    pub head_at_ms: Option<f64>,
    pub done_at_ms: Option<f64>,
    /// The client hung up before the response was complete.
    pub cancelled: bool,
    pub error: Option<String>,
    pub finish_reason: Option<String>,
    pub completion_tokens: Option<u64>,
    /// gRPC: the status the call ended with (`"OK"`, `"INVALID_ARGUMENT"`, ...); `None` while
    /// running, after a client hang-up, and over HTTP.
    #[serde(default)]
    pub grpc_code: Option<String>,
    /// gRPC: ended by an `Abort` RPC naming its request id (a client hang-up sets `cancelled`).
    #[serde(default)]
    pub aborted: bool,
}

/// Everything recorded about one request to the API port: an HTTP request, or a gRPC
/// `Generate` call (then `grpc` is set and `path` is the method path).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    pub seq: u64,
    pub arrive_ms: f64,
    pub method: String,
    pub path: String,
    /// Lower-case header names; repeated headers joined with `, `.
    pub headers: BTreeMap<String, String>,
    /// The JSON body (or the raw text as a JSON string when it did not parse).
    pub body: Value,
    pub x_request_id: Option<String>,
    pub client_addr: String,
    pub parsed: ParsedFields,
    pub handoff: Handoff,
    pub outcome: Outcome,
    /// gRPC: the `GenerateRequest` as the servicer decoded it (`path` is the method path).
    #[serde(default)]
    pub grpc: Option<GrpcRequest>,
    /// gRPC: the request's media as they arrived and as this leg used them (`None` for a
    /// text-only request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mm: Option<MmRecord>,
    /// TokenSpeed encoder: one `Encode` call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encode: Option<EncodeRecord>,
}

/// The media of one gRPC request: what arrived on the wire, and the features this leg used.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MmRecord {
    /// Media items (TokenSpeed `mm_inputs.items`, SGLang / vLLM placeholders, or `media_refs`).
    pub items: usize,
    /// Any pixel tensor arrived (`pixel_values`, an item's `encoder_input`).
    pub pixels: bool,
    /// The shape of each pixel tensor received.
    pub pixel_shapes: Vec<Vec<u32>>,
    /// `image_grid_thw` rows received.
    pub grid_thw: Vec<[i64; 3]>,
    /// Content hashes, hex (TokenSpeed `content_hash`, vLLM `mm_hashes`; for `media_refs` the
    /// blake3 of the fetched bytes).
    pub hashes: Vec<String>,
    /// Placeholder ranges `[offset, length]` (after expansion, for `media_refs`).
    pub placeholders: Vec<[u32; 2]>,
    /// The image token id the request named.
    pub im_token_id: Option<u32>,
    /// vLLM `media_refs` URLs.
    pub media_refs: Vec<String>,
    /// vLLM prefill: `GenerateComplete.media_identity` was sent.
    pub media_identity_returned: bool,
    /// One per item, as this leg used it (`null`: never needed, e.g. a decode served from the
    /// handoff).
    pub features: Vec<Option<u64>>,
    /// TokenSpeed EPD: `[item_index, bootstrap_host, bootstrap_port, bootstrap_room]`.
    pub encode_assignments: Vec<(u32, String, i32, i64)>,
}

/// One `TokenSpeedEncoder.Encode` call on an encode worker.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EncodeRecord {
    pub request_id: String,
    /// The item's `bootstrap_room` (the first assignment's, when several were sent).
    pub room: Option<i64>,
    /// The item's `content_hash`, hex.
    pub content_hash: String,
    /// The feature published under the room (`None` when refused).
    pub feature: Option<u64>,
    pub had_pixels: bool,
}

/// A gRPC `GenerateRequest`, engine-neutral: what each servicer read from its own proto.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GrpcRequest {
    pub request_id: String,
    /// `tokenized.input_ids` (vLLM: the fake tokenizer's ids of `text` when `text` was sent).
    pub input_ids: Vec<u32>,
    /// vLLM `text` input.
    pub text: Option<String>,
    pub stream: bool,
    pub sampling: GrpcSampling,
    /// SGLang `disaggregated_params` / TokenSpeed `kv_bootstrap_info`.
    pub bootstrap: Option<GrpcBootstrap>,
    /// vLLM `kv_transfer_params_json`, verbatim.
    pub kv_transfer_params_json: Option<String>,
    /// vLLM legacy typed `kv_transfer_params`.
    pub kv_transfer_params_legacy: Option<LegacyKvParams>,
    pub data_parallel_rank: Option<i32>,
    /// SGLang / TokenSpeed `return_logprob`; vLLM: `logprobs` set.
    pub return_logprob: bool,
    pub logprob_start_len: Option<i32>,
    pub top_logprobs_num: i32,
    /// gRPC metadata (lower-case ASCII keys).
    pub metadata: BTreeMap<String, String>,
}

/// Sampling fields of a `GenerateRequest` (engine-neutral names; `None` = unset where the
/// engine's proto has presence).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GrpcSampling {
    /// SGLang / TokenSpeed `max_new_tokens`, vLLM `max_tokens`.
    pub max_new_tokens: Option<u32>,
    /// SGLang / TokenSpeed `min_new_tokens`, vLLM `min_tokens`.
    pub min_new_tokens: u32,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub n: u32,
    /// vLLM `seed` (sign-extended), TokenSpeed `sampling_seed`.
    pub seed: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub skip_special_tokens: bool,
    pub no_stop_trim: bool,
    /// vLLM `logprobs` / `prompt_logprobs`.
    pub logprobs: Option<i32>,
    pub prompt_logprobs: Option<i32>,
}

/// Bootstrap fields of one SGLang / TokenSpeed leg, as sent (the room widened to i64).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GrpcBootstrap {
    pub host: String,
    pub port: i32,
    pub room: i64,
}

/// vLLM's deprecated typed `KvTransferParams`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LegacyKvParams {
    pub remote_host: String,
    pub remote_port: u32,
}

/// One `Abort` RPC (`GET /mock/aborts`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AbortRecord {
    pub at_ms: f64,
    /// SGLang / TokenSpeed: one id; vLLM: the list sent.
    pub request_ids: Vec<String>,
    /// SGLang / TokenSpeed `reason` (vLLM has none).
    pub reason: Option<String>,
    /// Sequence numbers of the live `Generate` calls it ended.
    pub aborted_seqs: Vec<u64>,
}

impl RequestRecord {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(|s| s.as_str())
    }
    /// True once the response finished (any way).
    pub fn is_done(&self) -> bool {
        self.outcome.done_at_ms.is_some()
    }
}

/// A ring buffer of records, updated in place by sequence number.
pub struct Recorder {
    inner: Mutex<RecorderInner>,
    limit: usize,
}

struct RecorderInner {
    next_seq: u64,
    records: std::collections::VecDeque<RequestRecord>,
}

impl Recorder {
    pub fn new(limit: usize) -> Self {
        Recorder {
            inner: Mutex::new(RecorderInner {
                next_seq: 1,
                records: Default::default(),
            }),
            limit: limit.max(1),
        }
    }

    pub fn push(&self, mut r: RequestRecord) -> u64 {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        r.seq = g.next_seq;
        g.next_seq += 1;
        if g.records.len() >= self.limit {
            g.records.pop_front();
        }
        let seq = r.seq;
        g.records.push_back(r);
        seq
    }

    pub fn update(&self, seq: u64, f: impl FnOnce(&mut RequestRecord)) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(front) = g.records.front().map(|r| r.seq) else {
            return;
        };
        if seq < front {
            return;
        }
        if let Some(r) = g.records.get_mut((seq - front) as usize) {
            f(r);
        }
    }

    pub fn all(&self) -> Vec<RequestRecord> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .records
            .iter()
            .cloned()
            .collect()
    }

    pub fn clear(&self) {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .records
            .clear();
    }
}

/// `GET /mock/stats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub engine: String,
    pub role: String,
    pub connector: String,
    pub engine_id: String,
    pub rooms_open: usize,
    pub pinned_blocks: usize,
    pub leaked_allocs: usize,
    pub requests_total: u64,
    pub requests_in_flight: u64,
    pub requests_by_route: BTreeMap<String, u64>,
    pub requests_by_status: BTreeMap<String, u64>,
    pub handoffs: BTreeMap<String, u64>,
    pub kv_recompute_total: u64,
    pub kv_expired_unread_total: u64,
    pub rooms_orphaned_total: u64,
    pub bootstrap_failed_total: u64,
    pub transfer_failed_total: u64,
    pub crashed: bool,
    pub killed: bool,
    /// gRPC: calls per method (`HealthCheck`, `GetLoads`, `Generate`, ...).
    #[serde(default)]
    pub rpc_calls: BTreeMap<String, u64>,
    /// gRPC: finished `Generate` calls per status name.
    #[serde(default)]
    pub requests_by_grpc_code: BTreeMap<String, u64>,
    /// gRPC requests that carried media.
    #[serde(default)]
    pub mm_requests: u64,
    /// gRPC requests that carried pixel tensors (a decode should have none).
    #[serde(default)]
    pub mm_pixel_requests: u64,
    /// vLLM worker-side processing: `media_refs` URLs fetched.
    #[serde(default)]
    pub media_fetches: u64,
    /// Encoder: `Encode` calls accepted.
    #[serde(default)]
    pub encodes_total: u64,
    /// Encoder: embeddings fetched by a prefill.
    #[serde(default)]
    pub embeddings_fetched: u64,
    /// Encoder: embeddings dropped unfetched after `bootstrap_timeout`.
    #[serde(default)]
    pub embeddings_expired: u64,
    /// Encoder: embeddings published and not fetched yet.
    #[serde(default)]
    pub embeddings_pending: usize,
    /// Prefill: embeddings received from encode workers (EPD).
    #[serde(default)]
    pub embeddings_received: u64,
}

/// Monotonic counters kept by the engine.
#[derive(Default)]
pub struct Counters {
    pub inner: Mutex<CountersInner>,
}

#[derive(Default, Clone)]
pub struct CountersInner {
    pub requests_total: u64,
    pub in_flight: u64,
    pub by_route: BTreeMap<String, u64>,
    pub by_role_route_status: BTreeMap<(String, u16), u64>,
    pub handoffs: BTreeMap<String, u64>,
    pub recompute: u64,
    pub expired_unread: u64,
    pub rooms_orphaned: u64,
    pub bootstrap_failed: u64,
    pub transfer_failed: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub rpc_calls: BTreeMap<String, u64>,
    pub by_grpc_code: BTreeMap<String, u64>,
    pub mm_requests: u64,
    pub mm_pixel_requests: u64,
    pub media_fetches: u64,
    pub encodes: u64,
    pub embeddings_fetched: u64,
    pub embeddings_expired: u64,
    pub embeddings_received: u64,
}

impl Counters {
    pub fn with<R>(&self, f: impl FnOnce(&mut CountersInner) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }
    pub fn handoff(&self, result: &str) {
        self.with(|c| *c.handoffs.entry(result.to_string()).or_default() += 1);
    }
}
