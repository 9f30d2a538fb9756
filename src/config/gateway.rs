//! `GatewayConfig`: the `gateway:` section of the YAML file and, field for field, the flags of
//! `pdgate launch`. One struct derives both `clap::Args` and `serde::Deserialize`, so every YAML
//! key is a flag name in snake_case (`--retry-max-retries` ⇔ `retry_max_retries`) and both take
//! their defaults from [`super::defaults`]. The serde defaults are literally clap's: see
//! [`GatewayConfig::default`].
//!
//! Two documented exceptions: `workers` is YAML-only (on `launch` the startup workers come from
//! `--prefill URL [PORT|none]` / `--decode URL`, see `launch.rs`), and SMG flags pdgate does not
//! implement live only on `launch` (refused or ignored there, and named in the error when they
//! appear in YAML).

use std::path::PathBuf;

use clap::ValueEnum;
use serde::{Deserialize, Serialize, Serializer};

use super::defaults;
use super::worker::WorkerSpec;

// The routing policy names (`--policy`, SMG's list; `passthrough` is refused for the per-leg
// `prefill_policy` / `decode_policy`, and `bucket` as the effective decode policy) and
// `--assignment-mode` are the policy module's own types: one definition per fact.
pub use crate::policy::{AssignmentMode, PolicyName};

/// `--pd-pairing-mode`: how strictly a prefill and a decode must share a KV transfer protocol
/// (spec "Pairing Modes").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum PairingMode {
    /// Every prefill may pair with every decode.
    Off,
    /// Refuse only when both legs report a fact and the values differ.
    Lenient,
    /// Also refuse unknown runtime/transport, one-sided facts or protocols, differing versions.
    Strict,
}

impl PairingMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PairingMode::Off => "off",
            PairingMode::Lenient => "lenient",
            PairingMode::Strict => "strict",
        }
    }
}

/// `--discovery-provider`: where workers are discovered besides the config and `POST /workers`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum DiscoveryProvider {
    /// Pods of the Kubernetes API server (in-cluster credentials or `KUBECONFIG`).
    Kubernetes,
    /// A JSON manifest listing the workers (`discovery_file`), re-read when it changes.
    File,
}

impl DiscoveryProvider {
    pub fn as_str(self) -> &'static str {
        match self {
            DiscoveryProvider::Kubernetes => "kubernetes",
            DiscoveryProvider::File => "file",
        }
    }
}

/// `--encode-policy`: how EPD assigns each media item an encode worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum EncodePolicy {
    Random,
    RoundRobin,
    /// By the item's content hash: a repeated image goes to the same encode worker.
    ConsistentHashing,
}

impl EncodePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            EncodePolicy::Random => "random",
            EncodePolicy::RoundRobin => "round_robin",
            EncodePolicy::ConsistentHashing => "consistent_hashing",
        }
    }
}

/// `--mm-processing`: where media for vLLM gRPC workers is fetched and preprocessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum MmProcessing {
    /// The worker when its servicer takes media references (it reports an `mm_processor`),
    /// else the gateway.
    Auto,
    /// Always the gateway.
    Router,
    /// The engine (vLLM); EPD refuses media in this mode.
    Worker,
}

impl MmProcessing {
    pub fn as_str(self) -> &'static str {
        match self {
            MmProcessing::Auto => "auto",
            MmProcessing::Router => "router",
            MmProcessing::Worker => "worker",
        }
    }
}

/// `--cache-index`: the cache_aware index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum CacheIndexKind {
    Tree,
    Hash,
}

/// `--log-level` (SMG's four values); the default `log` filter of the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }

    pub fn as_level_filter(self) -> log::LevelFilter {
        match self {
            LogLevel::Debug => log::LevelFilter::Debug,
            LogLevel::Info => log::LevelFilter::Info,
            LogLevel::Warn => log::LevelFilter::Warn,
            LogLevel::Error => log::LevelFilter::Error,
        }
    }
}

/// The gateway's own settings: the YAML `gateway:` section, and the flags of `pdgate launch`.
///
/// Read it through the accessors (`effective_*_policy`, `retry()`, `timeouts()`, …) rather than
/// the raw fields where one exists: they apply SMG's fallbacks (`--policy` for both legs,
/// `--worker-overload-protection` alone meaning token usage 0.9, `--disable-retries`, …).
#[derive(Clone, Debug, PartialEq, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    // ---- Mode -------------------------------------------------------------------------------
    /// Prefill/decode disaggregation mode. pdgate serves only this mode, so it must be set
    /// (`pd_disaggregation: true` in YAML, like `--pd-disaggregation` for SMG).
    #[arg(long, help_heading = "PD Disaggregation")]
    pub pd_disaggregation: bool,

    /// Encode-prefill-decode mode (instead of pd_disaggregation): multimodal requests get an
    /// encode leg per media item on the encode workers (gRPC TokenSpeed only).
    #[arg(long, help_heading = "PD Disaggregation")]
    pub epd_disaggregation: bool,

    /// EPD: how each media item is assigned an encode worker.
    #[arg(long, value_enum, default_value = defaults::ENCODE_POLICY, help_heading = "PD Disaggregation")]
    pub encode_policy: EncodePolicy,

    /// How strictly a prefill and a decode must share a KV transfer protocol: off, lenient or
    /// strict.
    #[arg(long, value_enum, default_value = defaults::PD_PAIRING_MODE, help_heading = "PD Disaggregation")]
    pub pd_pairing_mode: PairingMode,

    /// One logical worker per data-parallel rank (`url@rank`); SGLang legs carry the rank.
    #[arg(long, help_heading = "PD Disaggregation")]
    pub dp_aware: bool,

    /// gRPC only: how long a dispatch waits for a free decode slot before it is shed, seconds.
    #[arg(long, default_value_t = defaults::PD_ADMISSION_WAIT_SECS, help_heading = "PD Disaggregation")]
    pub pd_admission_wait_secs: u64,

    /// gRPC only: tokenizer model (HuggingFace id or local path).
    #[arg(long, alias = "model", help_heading = "PD Disaggregation")]
    #[serde(alias = "model")]
    pub model_path: Option<String>,

    /// gRPC only: explicit tokenizer path (overrides model_path).
    #[arg(long, help_heading = "PD Disaggregation")]
    pub tokenizer_path: Option<String>,

    /// gRPC only: a chat template file (`.jinja`, or `.json` with `chat_template`) that wins over
    /// the model directory's templates.
    #[arg(long, help_heading = "PD Disaggregation")]
    pub chat_template: Option<String>,

    /// gRPC only: cache whole prompts' token ids (exact text; SMG's L0).
    #[arg(long, help_heading = "Tokenizer cache")]
    pub tokenizer_cache_enable_l0: bool,

    /// Most prompts the L0 cache keeps (oldest evicted first).
    #[arg(long, default_value_t = defaults::TOKENIZER_CACHE_L0_MAX_ENTRIES, help_heading = "Tokenizer cache")]
    pub tokenizer_cache_l0_max_entries: usize,

    /// gRPC only: cache the token ids of the text between special tokens (system prompts,
    /// earlier turns, template text), reused wherever it recurs (SMG's L1 reuses prefixes).
    #[arg(long, help_heading = "Tokenizer cache")]
    pub tokenizer_cache_enable_l1: bool,

    /// Bytes the L1 cache may hold (texts and ids; oldest evicted first).
    #[arg(long, default_value_t = defaults::TOKENIZER_CACHE_L1_MAX_MEMORY, help_heading = "Tokenizer cache")]
    pub tokenizer_cache_l1_max_memory: usize,

    // ---- Multimodal (gRPC path) ------------------------------------------------------------------
    /// Where media for vLLM gRPC workers is fetched and preprocessed: auto, router or worker.
    #[arg(long, value_enum, default_value = defaults::MM_PROCESSING, help_heading = "Multimodal")]
    pub mm_processing: MmProcessing,

    /// Most images one request may carry (unset: 128, SMG's built-in limit).
    #[arg(long, help_heading = "Multimodal")]
    pub mm_per_request_image_limit: Option<u32>,

    /// Hosts the gateway fetches client media URLs from, comma-separated (`.example.com`
    /// also matches subdomains); a redirect elsewhere is refused. Unset: any host the address
    /// policy passes.
    #[arg(long, help_heading = "Multimodal")]
    pub mm_allowed_media_domains: Option<String>,

    /// Allow media URLs that name or resolve to loopback, private or link-local addresses (an
    /// internal media origin); refused by default.
    #[arg(long, help_heading = "Multimodal")]
    pub mm_allow_private_media_hosts: bool,

    // ---- Listeners ----------------------------------------------------------------------------
    /// Address of the serving listener.
    #[arg(long, default_value = defaults::HOST, help_heading = "Listeners")]
    pub host: String,

    /// Port of the serving listener.
    #[arg(long, default_value_t = defaults::PORT, help_heading = "Listeners")]
    pub port: u16,

    /// Optional dedicated port (on `host`) serving only /liveness, /readiness and /health, on a
    /// runtime of its own (one thread) so probes are answered while requests keep the serving
    /// threads busy; the serving port keeps these routes too.
    #[arg(long, help_heading = "Listeners")]
    pub health_check_port: Option<u16>,

    /// Address of the Prometheus /metrics listener.
    #[arg(long, default_value = defaults::PROMETHEUS_HOST, help_heading = "Listeners")]
    pub prometheus_host: String,

    /// Port of the Prometheus /metrics listener (0 = an OS-assigned port).
    #[arg(long, default_value_t = defaults::PROMETHEUS_PORT, help_heading = "Listeners")]
    pub prometheus_port: u16,

    /// Custom bucket bounds (seconds) for *duration_seconds / *ttft_seconds / *tpot_seconds.
    #[arg(long, num_args = 0.., help_heading = "Listeners")]
    pub prometheus_duration_buckets: Vec<f64>,

    /// pdgate: address of a separate admin listener (/workers, /reload). Default 127.0.0.1
    /// when admin_port is set. Without admin_port the admin routes are on the serving port.
    #[arg(long, help_heading = "Listeners")]
    pub admin_host: Option<String>,

    /// pdgate: port of the separate admin listener; unset = admin routes on the serving port.
    #[arg(long, help_heading = "Listeners")]
    pub admin_port: Option<u16>,

    // ---- Routing policies ------------------------------------------------------------------
    /// Routing policy for both legs unless prefill_policy / decode_policy is set.
    #[arg(long, value_enum, default_value = defaults::POLICY, help_heading = "Routing Policy")]
    pub policy: PolicyName,

    /// Routing policy of the prefill leg (default: policy). No passthrough.
    #[arg(long, value_enum, help_heading = "Routing Policy")]
    pub prefill_policy: Option<PolicyName>,

    /// Routing policy of the decode leg (default: policy). No passthrough, no bucket.
    #[arg(long, value_enum, help_heading = "Routing Policy")]
    pub decode_policy: Option<PolicyName>,

    /// cache_aware: matched-prefix share (0..1) above which the prefix owner is preferred.
    #[arg(long, visible_alias = "cache-match-threshold", default_value_t = defaults::CACHE_THRESHOLD, help_heading = "Routing Policy")]
    #[serde(alias = "cache_match_threshold")]
    pub cache_threshold: f32,

    /// cache_aware / bucket spill gate, absolute part (requests above the mean).
    #[arg(long, visible_alias = "spill-abs-threshold", default_value_t = defaults::BALANCE_ABS_THRESHOLD, help_heading = "Routing Policy")]
    #[serde(alias = "spill_abs_threshold")]
    pub balance_abs_threshold: usize,

    /// cache_aware / bucket spill gate, relative part (multiple of the mean, ≥ 1.0).
    #[arg(long, visible_alias = "spill-rel-threshold", default_value_t = defaults::BALANCE_REL_THRESHOLD, help_heading = "Routing Policy")]
    #[serde(alias = "spill_rel_threshold")]
    pub balance_rel_threshold: f32,

    /// cache_aware: KV-usage spread (hottest − coldest) that abandons affinity; ≥ 1.0 = off.
    #[arg(long, default_value_t = defaults::BALANCE_TOKEN_USAGE_THRESHOLD, help_heading = "Routing Policy")]
    pub balance_token_usage_threshold: f32,

    /// cache_aware: hottest-backend KV usage that abandons affinity; ≥ 1.0 = off.
    #[arg(long, default_value_t = defaults::OVERLOAD_TOKEN_USAGE_THRESHOLD, help_heading = "Routing Policy")]
    pub overload_token_usage_threshold: f32,

    /// cache_aware: de-rank affine candidates by their prefill backlog; 0 = off.
    #[arg(long, default_value_t = defaults::OVERLAP_DECAY, help_heading = "Routing Policy")]
    pub overlap_decay: f32,

    /// cache_aware: softmax temperature over near-equal candidates; 0 = argmax.
    #[arg(long, default_value_t = defaults::SELECTION_TEMPERATURE, help_heading = "Routing Policy")]
    pub selection_temperature: f32,

    /// Seconds between cache-tree (and sticky-map) eviction cycles.
    #[arg(long = "eviction-interval-secs", alias = "eviction-interval", default_value_t = defaults::EVICTION_INTERVAL_SECS, help_heading = "Routing Policy")]
    pub eviction_interval: u64,

    /// cache_aware: maximum size of each model's tree (characters over HTTP).
    #[arg(long, default_value_t = defaults::MAX_TREE_SIZE, help_heading = "Routing Policy")]
    pub max_tree_size: usize,

    /// cache_aware: token-tree page size.
    #[arg(long, default_value_t = defaults::BLOCK_SIZE, help_heading = "Routing Policy")]
    pub block_size: usize,

    /// Token positions where engines keep reusable prefix state (comma-separated).
    #[arg(long, value_delimiter = ',', help_heading = "Routing Policy")]
    pub cache_boundaries: Vec<usize>,

    /// cache_aware index: tree or hash.
    #[arg(long, value_enum, default_value = defaults::CACHE_INDEX, help_heading = "Routing Policy")]
    pub cache_index: CacheIndexKind,

    /// Seconds a cache-affinity placement stays routable (≥ 1).
    #[arg(long, default_value_t = defaults::CACHE_TTL_SECS, help_heading = "Routing Policy")]
    pub cache_ttl_secs: u64,

    /// Seconds an unused sticky routing key stays pinned.
    #[arg(long, visible_alias = "sticky-key-idle-secs", default_value_t = defaults::MAX_IDLE_SECS, help_heading = "Routing Policy")]
    #[serde(alias = "sticky_key_idle_secs")]
    pub max_idle_secs: u64,

    /// How a first-seen sticky key picks its worker: random, min_load, min_group, delegate
    /// (default random for manual, delegate for routing_key_override).
    #[arg(long, value_enum, help_heading = "Routing Policy")]
    pub assignment_mode: Option<AssignmentMode>,

    /// prefix_hash: prefix tokens hashed (or 4× as many characters).
    #[arg(long, default_value_t = defaults::PREFIX_TOKEN_COUNT, help_heading = "Routing Policy")]
    pub prefix_token_count: usize,

    /// prefix_hash: load factor above the mean that counts as overloaded (≥ 1.0).
    #[arg(long, default_value_t = defaults::PREFIX_HASH_LOAD_FACTOR, help_heading = "Routing Policy")]
    pub prefix_hash_load_factor: f64,

    /// prefix_hash: absolute load above the mean that counts as overloaded.
    #[arg(long, default_value_t = defaults::PREFIX_HASH_BALANCE_ABS_THRESHOLD, help_heading = "Routing Policy")]
    pub prefix_hash_balance_abs_threshold: usize,

    /// least_load: KV-pressure weight λ, seconds.
    #[arg(long, default_value_t = defaults::LEAST_LOAD_KV_PRESSURE_WEIGHT, help_heading = "Routing Policy")]
    pub least_load_kv_pressure_weight: f64,

    /// least_load: throughput (tokens/s) assumed when a worker reports none.
    #[arg(long, default_value_t = defaults::LEAST_LOAD_DEFAULT_THROUGHPUT, help_heading = "Routing Policy")]
    pub least_load_default_throughput: f64,

    /// least_load: prefill tokens credited per queued request when the count is unknown, and per
    /// request in flight.
    #[arg(long, default_value_t = defaults::LEAST_LOAD_MEAN_PREFILL_TOKENS, help_heading = "Routing Policy")]
    pub least_load_mean_prefill_tokens: u32,

    /// least_load: skip workers with this many waiting requests; 0 = off.
    #[arg(long, default_value_t = defaults::LEAST_LOAD_MAX_WAITING_REQUESTS, help_heading = "Routing Policy")]
    pub least_load_max_waiting_requests: u32,

    /// Sticky sessions on any policy (key from the body rid, else the routing-key header).
    #[arg(
        long,
        visible_alias = "sticky-sessions",
        help_heading = "Routing Policy"
    )]
    #[serde(alias = "sticky_sessions")]
    pub routing_key_override: bool,

    /// Headers checked, in order, for the routing key.
    #[arg(long, num_args = 0.., default_value = defaults::ROUTING_KEY_HEADER, help_heading = "Routing Policy")]
    pub routing_key_headers: Vec<String>,

    // ---- Load monitoring and overload --------------------------------------------------------
    /// Seconds between worker load polls; also the Retry-After of an overload shed.
    #[arg(long, default_value_t = defaults::LOAD_MONITOR_INTERVAL_SECS, help_heading = "Load Monitoring")]
    pub load_monitor_interval: u64,

    /// Enable overload protection with the default threshold (token usage 0.9).
    #[arg(long, help_heading = "Load Monitoring")]
    pub worker_overload_protection: bool,

    /// Waiting requests (summed over DP ranks) at which a worker is overloaded (≥ 1).
    #[arg(long, help_heading = "Load Monitoring")]
    pub worker_overload_waiting_requests: Option<usize>,

    /// Mean KV token usage at which a worker is overloaded, in (0, 1].
    #[arg(long, help_heading = "Load Monitoring")]
    pub worker_overload_token_usage: Option<f64>,

    // ---- Request handling and timeouts --------------------------------------------------------
    /// Bearer key required on serving routes (on `launch`, also the --prefill/--decode workers'
    /// key; in YAML, set each worker's api_key).
    #[arg(long, help_heading = "Request Handling")]
    #[serde(serialize_with = "redact_secret")]
    pub api_key: Option<String>,

    /// pdgate: without api_key, the peers (IPs or CIDR blocks) allowed to change workers or
    /// reload; empty = loopback only (127.0.0.0/8 and ::1).
    #[arg(long, num_args = 1.., help_heading = "Request Handling")]
    pub admin_trusted: Vec<String>,

    /// Largest request body accepted, bytes (larger → 413).
    #[arg(long, default_value_t = defaults::MAX_PAYLOAD_SIZE, help_heading = "Request Handling")]
    pub max_payload_size: usize,

    /// Total deadline of a request, body and stream included, seconds.
    #[arg(long, default_value_t = defaults::REQUEST_TIMEOUT_SECS, help_heading = "Request Handling")]
    pub request_timeout_secs: u64,

    /// Idle timeout of pooled engine connections, seconds (keep below the engines' 5 s; 0 = no
    /// limit).
    #[arg(long, default_value_t = defaults::UPSTREAM_POOL_IDLE_TIMEOUT_SECS, help_heading = "Request Handling")]
    pub upstream_pool_idle_timeout_secs: u64,

    /// Headers checked, in order, for a request id (empty = x-request-id x-correlation-id
    /// x-trace-id request-id).
    #[arg(long, num_args = 0.., help_heading = "Request Handling")]
    pub request_id_headers: Vec<String>,

    /// pdgate: TCP connect timeout to an engine, milliseconds.
    #[arg(long, default_value_t = defaults::CONNECT_TIMEOUT_MS, help_heading = "Request Handling")]
    pub connect_timeout_ms: u64,

    /// pdgate: deadline for reading the client's request body, seconds (0 = the total).
    #[arg(long, default_value_t = defaults::BODY_READ_TIMEOUT_SECS, help_heading = "Request Handling")]
    pub body_read_timeout_secs: u64,

    /// pdgate: deadline for the prefill leg's response head, seconds (0 = the total).
    #[arg(long, default_value_t = defaults::PREFILL_HEAD_TIMEOUT_SECS, help_heading = "Request Handling")]
    pub prefill_head_timeout_secs: u64,

    /// pdgate: deadline for the decode leg's first byte, seconds (0 = the total).
    #[arg(long, default_value_t = defaults::DECODE_FIRST_BYTE_TIMEOUT_SECS, help_heading = "Request Handling")]
    pub decode_first_byte_timeout_secs: u64,

    /// pdgate: longest silence inside a streamed decode body, seconds (0 = the total).
    #[arg(long, default_value_t = defaults::STREAM_IDLE_TIMEOUT_SECS, help_heading = "Request Handling")]
    pub stream_idle_timeout_secs: u64,

    // ---- Admission limits ---------------------------------------------------------------------
    /// Most inference requests served at once; each holds its place until its response ends,
    /// streams included. -1 = 1024 per CPU, at least 4096; 0 = no limit.
    #[arg(long, allow_negative_numbers = true, default_value_t = defaults::MAX_CONCURRENT_REQUESTS, help_heading = "Rate Limiting")]
    pub max_concurrent_requests: i64,

    /// Requests that may wait (first come, first served) when no place is free; past it → 429.
    /// 0 = refuse at once.
    #[arg(long, default_value_t = defaults::QUEUE_SIZE, help_heading = "Rate Limiting")]
    pub queue_size: usize,

    /// Longest wait in that queue, seconds; past it → 503 admission_queue_timeout.
    #[arg(long, default_value_t = defaults::QUEUE_TIMEOUT_SECS, help_heading = "Rate Limiting")]
    pub queue_timeout_secs: u64,

    /// Sustained admission rate, requests per second, bursting up to max_concurrent_requests
    /// (which still bounds concurrency). Unset or 0 = no rate limit.
    #[arg(long, allow_negative_numbers = true, help_heading = "Rate Limiting")]
    pub rate_limit_tokens_per_second: Option<i64>,

    /// Origins a browser may call the gateway from (`http://localhost:3000`), or `*` alone for
    /// any origin. Empty (the default): no cross-origin allowance.
    #[arg(long, num_args = 0.., help_heading = "Request Handling")]
    pub cors_allowed_origins: Vec<String>,

    // ---- Link health ---------------------------------------------------------------------------
    /// pdgate: keep every prefill → decode link in selection whatever its handoffs do.
    #[arg(long, help_heading = "Link Health")]
    pub disable_link_health: bool,

    /// pdgate: the sliding window of a link's handoff outcomes, seconds.
    #[arg(long, default_value_t = defaults::LINK_WINDOW_SECS, help_heading = "Link Health")]
    pub link_window_secs: u64,

    /// pdgate: handoffs a link needs in its window before it can be taken out.
    #[arg(long, default_value_t = defaults::LINK_MIN_HANDOFFS, help_heading = "Link Health")]
    pub link_min_handoffs: u32,

    /// pdgate: share of failed or recomputed handoffs, in (0, 1], that takes a link out.
    #[arg(long, default_value_t = defaults::LINK_FAILURE_RATIO, help_heading = "Link Health")]
    pub link_failure_ratio: f64,

    /// pdgate: seconds an open link stays out before live requests probe it (half-open).
    #[arg(long, default_value_t = defaults::LINK_COOLDOWN_SECS, help_heading = "Link Health")]
    pub link_cooldown_secs: u64,

    /// pdgate: good handoffs in a row that restore a half-open link.
    #[arg(long, default_value_t = defaults::LINK_PROBE_SUCCESSES, help_heading = "Link Health")]
    pub link_probe_successes: u32,

    /// pdgate: the sliding window of the P:D capacity advice (`/debug/capacity`), seconds.
    #[arg(long, default_value_t = defaults::CAPACITY_WINDOW_SECS, help_heading = "Link Health")]
    pub capacity_window_secs: u64,

    /// pdgate: seconds between rounds of link canaries (one tiny PD request per prefill → decode
    /// link, through the gateway itself); 0 = off.
    #[arg(long, default_value_t = defaults::LINK_CANARY_INTERVAL_SECS, help_heading = "Link Health")]
    pub link_canary_interval_secs: u64,

    // ---- Retries ------------------------------------------------------------------------------
    /// Total attempts per request, the first included (≤ 1 disables retries).
    #[arg(long, default_value_t = defaults::RETRY_MAX_RETRIES, help_heading = "Retry Configuration")]
    pub retry_max_retries: u32,

    /// Backoff before the first retry, milliseconds.
    #[arg(long, default_value_t = defaults::RETRY_INITIAL_BACKOFF_MS, help_heading = "Retry Configuration")]
    pub retry_initial_backoff_ms: u64,

    /// Backoff ceiling, milliseconds.
    #[arg(long, default_value_t = defaults::RETRY_MAX_BACKOFF_MS, help_heading = "Retry Configuration")]
    pub retry_max_backoff_ms: u64,

    /// Backoff multiplier per attempt (≥ 1.0).
    #[arg(long, default_value_t = defaults::RETRY_BACKOFF_MULTIPLIER, help_heading = "Retry Configuration")]
    pub retry_backoff_multiplier: f32,

    /// Jitter, as a fraction of the delay, in [0, 1].
    #[arg(long, default_value_t = defaults::RETRY_JITTER_FACTOR, help_heading = "Retry Configuration")]
    pub retry_jitter_factor: f32,

    /// Disable retries.
    #[arg(long, help_heading = "Retry Configuration")]
    pub disable_retries: bool,

    // ---- Circuit breaker ----------------------------------------------------------------------
    /// Consecutive failures that open a worker's breaker.
    #[arg(long, default_value_t = defaults::CB_FAILURE_THRESHOLD, help_heading = "Circuit Breaker")]
    pub cb_failure_threshold: u32,

    /// Consecutive half-open successes that close it.
    #[arg(long, default_value_t = defaults::CB_SUCCESS_THRESHOLD, help_heading = "Circuit Breaker")]
    pub cb_success_threshold: u32,

    /// Seconds an open breaker waits before half-open; sooner if the health checker promotes
    /// the worker to Ready again (SMG 1.13.0's re-admission, counted in
    /// `smg_worker_cb_health_readmissions_total`).
    #[arg(long, default_value_t = defaults::CB_TIMEOUT_DURATION_SECS, help_heading = "Circuit Breaker")]
    pub cb_timeout_duration_secs: u64,

    /// Failure window, seconds (accepted; like SMG, decisions count consecutive outcomes).
    #[arg(long, default_value_t = defaults::CB_WINDOW_DURATION_SECS, help_heading = "Circuit Breaker")]
    pub cb_window_duration_secs: u64,

    /// Disable circuit breakers.
    #[arg(long, help_heading = "Circuit Breaker")]
    pub disable_circuit_breaker: bool,

    // ---- Health checks and worker startup ----------------------------------------------------
    /// Consecutive probe failures that take a worker out of rotation.
    #[arg(long, default_value_t = defaults::HEALTH_FAILURE_THRESHOLD, help_heading = "Health Checks")]
    pub health_failure_threshold: u32,

    /// Consecutive probe successes that put it back.
    #[arg(long, default_value_t = defaults::HEALTH_SUCCESS_THRESHOLD, help_heading = "Health Checks")]
    pub health_success_threshold: u32,

    /// Timeout of one probe, seconds.
    #[arg(long, default_value_t = defaults::HEALTH_CHECK_TIMEOUT_SECS, help_heading = "Health Checks")]
    pub health_check_timeout_secs: u64,

    /// Seconds between probes of each worker.
    #[arg(long, default_value_t = defaults::HEALTH_CHECK_INTERVAL_SECS, help_heading = "Health Checks")]
    pub health_check_interval_secs: u64,

    /// Path probed on each worker.
    #[arg(long, default_value = defaults::HEALTH_CHECK_ENDPOINT, help_heading = "Health Checks")]
    pub health_check_endpoint: String,

    /// Never probe; workers start ready.
    #[arg(long, help_heading = "Health Checks")]
    pub disable_health_check: bool,

    /// Remove workers that reach the terminal failed state (default off without service
    /// discovery).
    #[arg(long, visible_alias = "worker-auto-recovery", num_args = 0..=1, default_missing_value = "true", help_heading = "Health Checks")]
    #[serde(alias = "worker_auto_recovery")]
    pub remove_unhealthy_workers: Option<bool>,

    /// Seconds a removed worker stays draining before it leaves the registry.
    #[arg(long, default_value_t = defaults::DRAIN_SETTLE_SECS, help_heading = "Health Checks")]
    pub drain_settle_secs: u64,

    /// Give up registering a worker after this many seconds.
    #[arg(long, default_value_t = defaults::WORKER_STARTUP_TIMEOUT_SECS, help_heading = "Health Checks")]
    pub worker_startup_timeout_secs: u64,

    /// Seconds between registration probes.
    #[arg(long, default_value_t = defaults::WORKER_STARTUP_CHECK_INTERVAL_SECS, help_heading = "Health Checks")]
    pub worker_startup_check_interval: u64,

    /// Seconds before the first registration probe.
    #[arg(long, default_value_t = defaults::WORKER_STARTUP_DELAY_SECS, help_heading = "Health Checks")]
    pub worker_startup_delay: u64,

    // ---- Service discovery -------------------------------------------------------------------
    /// Discover workers from Kubernetes pods (SMG's legacy spelling of
    /// `--discovery-provider kubernetes`; give one or the other). Restart to change.
    #[arg(long, help_heading = "Service Discovery")]
    pub service_discovery: bool,

    /// Where workers are discovered: kubernetes (pods matching the role selectors).
    #[arg(long, value_enum, help_heading = "Service Discovery")]
    pub discovery_provider: Option<DiscoveryProvider>,

    /// SMG's selector for regular-mode pods; refused: pdgate discovers prefill and decode pods
    /// with prefill_selector and decode_selector.
    #[arg(long, num_args = 1.., value_name = "KEY=VALUE", help_heading = "Service Discovery")]
    pub selector: Vec<String>,

    /// The JSON manifest of `discovery_provider: file` (SMG's format, version 1); it may be
    /// created after startup.
    #[arg(long, help_heading = "Service Discovery")]
    pub discovery_file: Option<PathBuf>,

    /// Seconds between full re-reads of discovery_file (it is also re-read as soon as it
    /// changes); unset: 30.
    #[arg(long, help_heading = "Service Discovery")]
    pub discovery_check_interval_secs: Option<u64>,

    /// Labels a prefill pod carries (`key=value`, all must match).
    #[arg(long, num_args = 1.., value_name = "KEY=VALUE", help_heading = "Service Discovery")]
    pub prefill_selector: Vec<String>,

    /// Labels a decode pod carries (`key=value`, all must match).
    #[arg(long, num_args = 1.., value_name = "KEY=VALUE", help_heading = "Service Discovery")]
    pub decode_selector: Vec<String>,

    /// EPD: labels an encode pod carries (`key=value`, all must match).
    #[arg(long, num_args = 1.., value_name = "KEY=VALUE", help_heading = "Service Discovery")]
    pub encode_selector: Vec<String>,

    /// Port of a discovered pod's engine.
    #[arg(long, default_value_t = defaults::SERVICE_DISCOVERY_PORT, help_heading = "Service Discovery")]
    pub service_discovery_port: u16,

    /// Namespace whose pods are watched (default: all namespaces, which needs cluster-wide
    /// permission to list and watch pods).
    #[arg(long, help_heading = "Service Discovery")]
    pub service_discovery_namespace: Option<String>,

    /// Pod annotation holding a vLLM worker's KV connector.
    #[arg(long, default_value = defaults::KV_CONNECTOR_ANNOTATION, help_heading = "Service Discovery")]
    pub kv_connector_annotation: String,

    /// Pod annotation holding a worker's KV engine id.
    #[arg(long, default_value = defaults::KV_ENGINE_ID_ANNOTATION, help_heading = "Service Discovery")]
    pub kv_engine_id_annotation: String,

    // ---- Logging --------------------------------------------------------------------------------
    /// Default log filter: debug, info, warn or error (RUST_LOG, when set, wins).
    #[arg(long, value_enum, default_value = defaults::LOG_LEVEL, help_heading = "Logging")]
    pub log_level: LogLevel,

    /// Every log line, the access line included, as one JSON object (restart to change).
    #[arg(long, help_heading = "Logging")]
    pub log_json: bool,

    // ---- Tracing -------------------------------------------------------------------------------
    /// Export OpenTelemetry traces: one server span per PD request, one client span per leg
    /// (needs a restart to change).
    #[arg(long, help_heading = "Tracing")]
    pub enable_trace: bool,

    /// OTLP collector for enable_trace: host:port or grpc://host:port (OTLP/gRPC), or
    /// http://host:port/v1/traces (OTLP/HTTP protobuf).
    #[arg(long, default_value = defaults::OTLP_TRACES_ENDPOINT, help_heading = "Tracing")]
    pub otlp_traces_endpoint: String,

    // ---- Workers -------------------------------------------------------------------------------
    /// Startup workers, each a `POST /workers` body (YAML only; `launch` uses --prefill and
    /// --decode).
    #[arg(skip)]
    pub workers: Vec<WorkerSpec>,

    /// pdgate: seconds between two looks at the config file and its workers_file; a change
    /// reloads them like SIGHUP (a Kubernetes ConfigMap update). 0 = SIGHUP and /reload only.
    #[arg(long, default_value_t = defaults::CONFIG_WATCH_INTERVAL_SECS, help_heading = "PD Disaggregation")]
    pub config_watch_interval_secs: u64,

    /// pdgate: a YAML file holding a list of worker specs, read at startup and on reload
    /// (relative to the config file).
    #[arg(long, help_heading = "PD Disaggregation")]
    pub workers_file: Option<PathBuf>,
}

/// Parses nothing but the defaults: `GatewayConfig::default()` is what `launch` gives with no
/// flags, so a missing YAML key means exactly what a missing flag means.
#[derive(clap::Parser)]
#[command(no_binary_name = true)]
struct DefaultsOnly {
    #[command(flatten)]
    gateway: GatewayConfig,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        use clap::Parser;
        // Invariant (local, tested by `defaults_parse`): every field has a clap default or is
        // optional, so parsing an empty argv cannot fail.
        DefaultsOnly::try_parse_from(std::iter::empty::<String>())
            .expect("every GatewayConfig flag has a default")
            .gateway
    }
}

fn redact_secret<S: Serializer>(value: &Option<String>, serializer: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(_) => serializer.serialize_some("<redacted>"),
        None => serializer.serialize_none(),
    }
}

/// Joins a host and a port into a listen address, bracketing IPv6 literals.
pub(crate) fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

impl GatewayConfig {
    /// The discovery provider in effect: `discovery_provider`, or kubernetes for SMG's
    /// `service_discovery: true`. `None`: workers come only from the config and the worker API.
    pub fn discovery(&self) -> Option<DiscoveryProvider> {
        self.discovery_provider.or(self
            .service_discovery
            .then_some(DiscoveryProvider::Kubernetes))
    }

    /// The prefill leg's policy: `prefill_policy`, else `policy`.
    pub fn effective_prefill_policy(&self) -> PolicyName {
        self.prefill_policy.unwrap_or(self.policy)
    }

    /// The decode leg's policy: `decode_policy`, else `policy`.
    pub fn effective_decode_policy(&self) -> PolicyName {
        self.decode_policy.unwrap_or(self.policy)
    }

    /// `host:port` of the serving listener.
    pub fn listen_addr(&self) -> String {
        join_host_port(&self.host, self.port)
    }

    /// `host:port` of the Prometheus listener.
    pub fn prometheus_addr(&self) -> String {
        join_host_port(&self.prometheus_host, self.prometheus_port)
    }

    /// `host:port` of the separate admin listener, when `admin_port` is set (loopback unless
    /// `admin_host` says otherwise). `None`: admin routes share the serving listener.
    pub fn admin_addr(&self) -> Option<String> {
        let port = self.admin_port?;
        Some(join_host_port(
            self.admin_host.as_deref().unwrap_or(defaults::ADMIN_HOST),
            port,
        ))
    }

    /// `host:port` of the dedicated probe listener, when `health_check_port` is set.
    pub fn health_check_addr(&self) -> Option<String> {
        self.health_check_port
            .map(|port| join_host_port(&self.host, port))
    }

    /// Request-id headers in lookup order (SMG's list when none is configured), parsed once
    /// (a lookup by a parsed name hashes it directly). Names are validated at load.
    pub fn request_id_header_names(&self) -> Vec<http::HeaderName> {
        let names: Vec<&str> = if self.request_id_headers.is_empty() {
            defaults::REQUEST_ID_HEADERS.to_vec()
        } else {
            self.request_id_headers.iter().map(String::as_str).collect()
        };
        names
            .into_iter()
            .filter_map(|h| http::HeaderName::from_bytes(h.as_bytes()).ok())
            .collect()
    }

    /// Routing-key headers in lookup order, lowercased.
    pub fn routing_key_header_names(&self) -> Vec<String> {
        self.routing_key_headers
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect()
    }

    /// Peers trusted with admin changes when no api_key is set (default: loopback).
    pub fn admin_trusted_nets(&self) -> Result<Vec<super::IpNet>, String> {
        if self.admin_trusted.is_empty() {
            return Ok(super::IpNet::loopback());
        }
        self.admin_trusted
            .iter()
            .map(|s| super::IpNet::parse(s))
            .collect()
    }

    /// The collector of `enable_trace` (`None` when tracing is off). Validated at load, so an
    /// error here means the config skipped validation.
    pub fn otlp_endpoint(&self) -> Option<Result<super::OtlpEndpoint, String>> {
        self.enable_trace
            .then(|| super::OtlpEndpoint::parse(&self.otlp_traces_endpoint))
    }

    /// The default `log` filter (`RUST_LOG`, when set, should win).
    pub fn log_filter(&self) -> log::LevelFilter {
        self.log_level.as_level_filter()
    }
}
