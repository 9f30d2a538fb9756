//! The one table of defaults. Every default value pdgate uses — for a YAML key, an SMG `launch`
//! flag, a worker spec field or an engine port — is a constant here, and both the clap defaults
//! and the serde defaults of [`super::GatewayConfig`] reference these constants, so a flag and
//! its YAML key cannot drift apart.
//!
//! Values marked "SMG" are SMG's CLI defaults (research/http-pd-spec.md §5, §8): changing one
//! breaks drop-in compatibility. Note SMG's config *struct* has other defaults for cache_aware
//! (0.5 / 32 / 1.1 / 30 s / 10000); the CLI values are the ones `smg launch` applies.

// ---- Listeners --------------------------------------------------------------------------------

/// SMG: `--host`.
pub const HOST: &str = "0.0.0.0";
/// SMG: `--port`.
pub const PORT: u16 = 30000;
/// SMG: `--prometheus-host`.
pub const PROMETHEUS_HOST: &str = "0.0.0.0";
/// SMG: `--prometheus-port`.
pub const PROMETHEUS_PORT: u16 = 29000;
/// pdgate: the admin listener binds loopback unless `admin_host` says otherwise, because the
/// worker API can reconfigure the gateway.
pub const ADMIN_HOST: &str = "127.0.0.1";

// ---- Policies ---------------------------------------------------------------------------------

/// SMG: `--policy` (both legs fall back to it).
pub const POLICY: &str = "cache_aware";
/// SMG: `--cache-threshold`.
pub const CACHE_THRESHOLD: f32 = 0.3;
/// SMG: `--balance-abs-threshold`.
pub const BALANCE_ABS_THRESHOLD: usize = 64;
/// SMG: `--balance-rel-threshold` (must be ≥ 1.0).
pub const BALANCE_REL_THRESHOLD: f32 = 1.5;
/// SMG: `--balance-token-usage-threshold` (≥ 1.0 disables the trigger).
pub const BALANCE_TOKEN_USAGE_THRESHOLD: f32 = 1.0;
/// SMG: `--overload-token-usage-threshold` (≥ 1.0 disables the trigger).
pub const OVERLOAD_TOKEN_USAGE_THRESHOLD: f32 = 1.0;
/// SMG: `--overlap-decay` (0 disables).
pub const OVERLAP_DECAY: f32 = 0.0;
/// SMG: `--selection-temperature` (0 = argmax).
pub const SELECTION_TEMPERATURE: f32 = 0.0;
/// SMG 1.13.0: `--eviction-interval-secs` (older SMG: `--eviction-interval`, 120), seconds.
pub const EVICTION_INTERVAL_SECS: u64 = 60;
/// SMG: `--max-tree-size`.
pub const MAX_TREE_SIZE: usize = 67_108_864;
/// SMG: `--block-size`.
pub const BLOCK_SIZE: usize = 16;
/// SMG: `--cache-index`.
pub const CACHE_INDEX: &str = "tree";
/// SMG: `--cache-ttl-secs`.
pub const CACHE_TTL_SECS: u64 = 180;
/// SMG: `--max-idle-secs` (sticky keys).
pub const MAX_IDLE_SECS: u64 = 14_400;
/// SMG: `--prefix-token-count`.
pub const PREFIX_TOKEN_COUNT: usize = 256;
/// SMG: `--prefix-hash-load-factor`.
pub const PREFIX_HASH_LOAD_FACTOR: f64 = 1.25;
/// SMG: `--prefix-hash-balance-abs-threshold`.
pub const PREFIX_HASH_BALANCE_ABS_THRESHOLD: usize = 10;
/// SMG: `--least-load-kv-pressure-weight` (λ, seconds).
pub const LEAST_LOAD_KV_PRESSURE_WEIGHT: f64 = 0.15;
/// SMG: `--least-load-default-throughput`, tokens/s.
pub const LEAST_LOAD_DEFAULT_THROUGHPUT: f64 = 2000.0;
/// SMG: `--least-load-mean-prefill-tokens` (p̄).
pub const LEAST_LOAD_MEAN_PREFILL_TOKENS: u32 = 1024;
/// SMG: `--least-load-max-waiting-requests` (0 = off).
pub const LEAST_LOAD_MAX_WAITING_REQUESTS: u32 = 0;
/// SMG: `--routing-key-headers`.
pub const ROUTING_KEY_HEADER: &str = "x-smg-routing-key";
/// SMG: power_of_two and least_load poll interval inside the policy, seconds (not a flag).
pub const POLICY_LOAD_CHECK_INTERVAL_SECS: u64 = 5;
/// SMG: the bucket policy re-balances its boundaries this often, seconds (SMG 1.13.0's
/// `--bucket-adjust-interval-secs` default; pdgate accepts that flag and ignores it).
pub const BUCKET_ADJUST_INTERVAL_SECS: u64 = 5;
/// SMG: the bucket policy starts from a request-length range this wide (not a flag).
pub const BUCKET_INITIAL_RANGE: usize = 4096;
/// SMG: consistent_hashing virtual nodes per worker URL (not a flag).
pub const CONSISTENT_HASH_VIRTUAL_NODES: usize = 150;
/// SMG: a pinned sticky worker is bypassed once its key has this many requests in flight there.
pub const STICKY_MAX_IN_FLIGHT_PER_KEY: usize = 2;
/// SMG: routing keys longer than this are ignored.
pub const ROUTING_KEY_MAX_BYTES: usize = 128;

// ---- Pairing, DP, gRPC ------------------------------------------------------------------------

/// SMG [D]: `--pd-pairing-mode`.
pub const PD_PAIRING_MODE: &str = "lenient";
/// SMG [D]: `--pd-admission-wait-secs` (gRPC there; pdgate gates HTTP decodes too).
pub const PD_ADMISSION_WAIT_SECS: u64 = 30;

// ---- Load monitoring and overload ---------------------------------------------------------------

/// SMG: `--load-monitor-interval`, seconds; also the `Retry-After` of an overload shed.
pub const LOAD_MONITOR_INTERVAL_SECS: u64 = 10;
/// SMG: the token-usage threshold `--worker-overload-protection` applies on its own.
pub const WORKER_OVERLOAD_TOKEN_USAGE: f64 = 0.9;

// ---- Request handling and timeouts -------------------------------------------------------------

/// SMG: `--max-payload-size`, bytes (512 MiB).
pub const MAX_PAYLOAD_SIZE: usize = 536_870_912;
/// SMG: `--request-timeout-secs`: the whole request, body and stream included.
pub const REQUEST_TIMEOUT_SECS: u64 = 1800;
/// SMG: `--upstream-pool-idle-timeout-secs`. Below the engines' 5 s keep-alive, so a pooled
/// connection is never reused after the engine closed it (a POST cannot be resent safely).
pub const UPSTREAM_POOL_IDLE_TIMEOUT_SECS: u64 = 3;
/// SMG: the request-id headers checked in order when `--request-id-headers` is empty.
pub const REQUEST_ID_HEADERS: [&str; 4] = [
    "x-request-id",
    "x-correlation-id",
    "x-trace-id",
    "request-id",
];
/// pdgate: TCP connect to an engine, milliseconds.
pub const CONNECT_TIMEOUT_MS: u64 = 2000;
/// pdgate: until the prefill leg's response head. A vLLM prefill answers after its whole
/// forward pass and an SGLang prefill after the KV is sent, so this covers a long prompt in a
/// busy queue; a hung engine is still caught well before the 1800 s total.
pub const PREFILL_HEAD_TIMEOUT_SECS: u64 = 600;
/// pdgate: until the decode leg's first byte (the decode engine waits for the KV first).
pub const DECODE_FIRST_BYTE_TIMEOUT_SECS: u64 = 600;
/// pdgate: the longest silence between two chunks of a streamed decode body. Generous because
/// an engine may pause a request (SGLang retracts under KV pressure) and resume it.
pub const STREAM_IDLE_TIMEOUT_SECS: u64 = 300;
/// pdgate: seconds between two looks at the config file (and its `workers_file`) for a change
/// that reloads it; 0 = only SIGHUP and `POST /reload`.
pub const CONFIG_WATCH_INTERVAL_SECS: u64 = 0;
/// pdgate: reading the client's request body.
pub const BODY_READ_TIMEOUT_SECS: u64 = 60;

// ---- Admission limits (SMG's "Rate Limiting" flags) --------------------------------------------

/// SMG: `--max-concurrent-requests`: -1 derives the bound from the host
/// ([`DERIVED_CONCURRENCY_PER_CPU`] per CPU, at least [`DERIVED_CONCURRENCY_FLOOR`]); 0 disables.
pub const MAX_CONCURRENT_REQUESTS: i64 = -1;
/// SMG: the derived concurrency bound's share per available CPU.
pub const DERIVED_CONCURRENCY_PER_CPU: usize = 1024;
/// SMG: the derived concurrency bound's floor.
pub const DERIVED_CONCURRENCY_FLOOR: usize = 4096;
/// SMG: `--queue-size`: requests that may wait for a place (0 = refuse at once).
pub const QUEUE_SIZE: usize = 100;
/// SMG: `--queue-timeout-secs`.
pub const QUEUE_TIMEOUT_SECS: u64 = 60;
/// SMG: the `Retry-After` of an admission refusal (queue full or queue timeout), seconds.
pub const ADMISSION_RETRY_AFTER_SECS: u64 = 2;

// ---- Link health (pdgate) -----------------------------------------------------------------------

/// pdgate: the sliding window of a prefill → decode link's handoff outcomes, seconds (the
/// current and the previous window count).
pub const LINK_WINDOW_SECS: u64 = 60;
/// pdgate: handoffs a link needs in its window before it can be judged.
pub const LINK_MIN_HANDOFFS: u32 = 20;
/// pdgate: the share of failed or recomputed handoffs that takes a link out of selection.
pub const LINK_FAILURE_RATIO: f64 = 0.5;
/// pdgate: how long an open link stays out of selection before it is probed, seconds.
pub const LINK_COOLDOWN_SECS: u64 = 30;
/// pdgate: good handoffs in a row that close a half-open link.
pub const LINK_PROBE_SUCCESSES: u32 = 3;
/// SMG: `--discovery-check-interval-secs` when unset: full re-reads of the discovery manifest.
pub const DISCOVERY_CHECK_INTERVAL_SECS: u64 = 30;
/// pdgate: the sliding window of the P:D capacity advice, seconds.
pub const CAPACITY_WINDOW_SECS: u64 = 60;
/// pdgate: seconds between two rounds of link canaries (one tiny PD request per link); 0 = off.
pub const LINK_CANARY_INTERVAL_SECS: u64 = 0;

// ---- Retries (whole-pair) --------------------------------------------------------------------

/// SMG: `--retry-max-retries`: total attempts, the first included (≤ 1 disables retries).
pub const RETRY_MAX_RETRIES: u32 = 5;
/// SMG: `--retry-initial-backoff-ms`.
pub const RETRY_INITIAL_BACKOFF_MS: u64 = 50;
/// SMG: `--retry-max-backoff-ms`.
pub const RETRY_MAX_BACKOFF_MS: u64 = 30_000;
/// SMG: `--retry-backoff-multiplier`.
pub const RETRY_BACKOFF_MULTIPLIER: f32 = 1.5;
/// SMG: `--retry-jitter-factor`.
pub const RETRY_JITTER_FACTOR: f32 = 0.2;
/// SMG: an attempt whose final status is one of these is retried (unless marked terminal).
pub const RETRYABLE_STATUS_CODES: [u16; 6] = [408, 429, 500, 502, 503, 504];

// ---- Circuit breaker ----------------------------------------------------------------------------

/// SMG: `--cb-failure-threshold` (consecutive failures that open the breaker).
pub const CB_FAILURE_THRESHOLD: u32 = 10;
/// SMG: `--cb-success-threshold` (consecutive half-open successes that close it).
pub const CB_SUCCESS_THRESHOLD: u32 = 3;
/// SMG: `--cb-timeout-duration-secs` (open → half-open).
pub const CB_TIMEOUT_DURATION_SECS: u64 = 60;
/// SMG: `--cb-window-duration-secs` (accepted; SMG's decisions do not use it).
pub const CB_WINDOW_DURATION_SECS: u64 = 120;
/// SMG: statuses recorded as a breaker failure.
pub const CB_FAILURE_STATUS_CODES: [u16; 6] = [408, 429, 500, 502, 503, 504];
/// SMG: statuses that record nothing (capacity, not health).
pub const CB_CAPACITY_STATUS_CODES: [u16; 1] = [429];

// ---- Health checks and worker startup ------------------------------------------------------------

/// SMG: `--health-failure-threshold`.
pub const HEALTH_FAILURE_THRESHOLD: u32 = 3;
/// SMG: `--health-success-threshold`.
pub const HEALTH_SUCCESS_THRESHOLD: u32 = 2;
/// SMG: `--health-check-timeout-secs`.
pub const HEALTH_CHECK_TIMEOUT_SECS: u64 = 5;
/// SMG: `--health-check-interval-secs`.
pub const HEALTH_CHECK_INTERVAL_SECS: u64 = 60;
/// SMG: `--health-check-endpoint`.
pub const HEALTH_CHECK_ENDPOINT: &str = "/health";
/// SMG: `--drain-settle-secs`.
pub const DRAIN_SETTLE_SECS: u64 = 5;
/// SMG: `--worker-startup-timeout-secs`.
pub const WORKER_STARTUP_TIMEOUT_SECS: u64 = 1800;
/// SMG: `--worker-startup-check-interval`, seconds.
pub const WORKER_STARTUP_CHECK_INTERVAL_SECS: u64 = 30;
/// SMG: `--worker-startup-delay`, seconds.
pub const WORKER_STARTUP_DELAY_SECS: u64 = 0;
/// pdgate: a worker that has never been healthy is re-probed after this, doubling per failed
/// probe up to `worker_startup_check_interval`, so readiness follows an engine that comes up
/// within a second instead of a whole interval later (SMG waits the full interval).
pub const WORKER_STARTUP_FIRST_RETRY_MS: u64 = 500;

// ---- Worker spec (`POST /workers` body) -------------------------------------------------------

/// SMG: `priority` of a worker spec.
pub const WORKER_PRIORITY: u32 = 50;
/// SMG: `cost` of a worker spec.
pub const WORKER_COST: f32 = 1.0;
/// SMG: `max_connection_attempts` of a worker spec.
pub const WORKER_MAX_CONNECTION_ATTEMPTS: u32 = 20;
/// SMG: a `--prefill`/`--decode` startup worker gets `max_connection_attempts` =
/// this × `health_success_threshold`.
pub const STARTUP_WORKER_CONNECTION_ATTEMPTS_PER_SUCCESS: u32 = 10;

// ---- Engine-side ports ---------------------------------------------------------------------------

/// SGLang / TokenSpeed / vLLM Mooncake bootstrap port when a prefill worker has none
/// (gRPC addressing and the Mooncake `remote_bootstrap_addr`).
pub const BOOTSTRAP_PORT: u16 = 8998;
/// vLLM MoRI-IO: the `moriio_handshake_port` label default (the engine's `handshake_port`).
pub const MORIIO_HANDSHAKE_PORT: u16 = 6301;
/// vLLM MoRI-IO: the `moriio_notify_port` label default (the engine's `notify_port`).
pub const MORIIO_NOTIFY_PORT: u16 = 61005;

// ---- Process (`pdgate launch` only; `run -c` takes Pingora's own keys) -------------------------

/// Pingora's own `grace_period_seconds` when a YAML file sets none (its `EXIT_TIMEOUT`).
pub const PINGORA_GRACE_PERIOD_SECS: u64 = 300;
/// SMG: `--shutdown-grace-period-secs`; becomes Pingora's `grace_period_seconds` under `launch`.
pub const SHUTDOWN_GRACE_PERIOD_SECS: u64 = 180;
/// SMG: `--log-level`.
pub const LOG_LEVEL: &str = "info";

// ---- Tracing ------------------------------------------------------------------------------------

/// SMG: `--otlp-traces-endpoint` (OTLP/gRPC to a local collector).
pub const OTLP_TRACES_ENDPOINT: &str = "localhost:4317";

// ---- Service discovery (`--service-discovery` / `--discovery-provider`) -----------------------

/// SMG: `--service-discovery-port`, the port of a discovered pod's engine.
pub const SERVICE_DISCOVERY_PORT: u16 = 80;
/// SMG: `--kv-connector-annotation`.
pub const KV_CONNECTOR_ANNOTATION: &str = "smg.ai/kv-connector";
/// SMG: `--kv-engine-id-annotation`.
pub const KV_ENGINE_ID_ANNOTATION: &str = "smg.ai/kv-engine-id";
/// SMG: the annotation a prefill pod advertises its bootstrap port with (no flag).
pub const BOOTSTRAP_PORT_ANNOTATION: &str = "sglang.ai/bootstrap-port";

/// `--encode-policy`: a repeated image goes to the same encode worker.
pub const ENCODE_POLICY: &str = "consistent_hashing";
/// SMG: `--tokenizer-cache-l0-max-entries`.
pub const TOKENIZER_CACHE_L0_MAX_ENTRIES: usize = 10_000;
/// SMG: `--tokenizer-cache-l1-max-memory` (bytes; 50 MiB).
pub const TOKENIZER_CACHE_L1_MAX_MEMORY: usize = 52_428_800;

/// `--mm-processing`.
pub const MM_PROCESSING: &str = "auto";
/// Images per request when `--mm-per-request-image-limit` is unset (SMG's built-in limit).
pub const MM_PER_REQUEST_IMAGE_LIMIT: u32 = 128;
/// An encode worker's bootstrap port when `--encode URL` gives none (SMG).
pub const ENCODE_BOOTSTRAP_PORT: u16 = 8998;
