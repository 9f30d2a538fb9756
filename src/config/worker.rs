//! `WorkerSpec`: one worker as SMG's `POST /workers` body describes it (http-pd-spec §3.1). The
//! same type is a `gateway.workers` entry, an entry of a `workers_file`, and what `--prefill` /
//! `--decode` produce, so a worker means the same thing however it arrives.
//!
//! Deserializing applies SMG's intake rules: unknown keys are ignored, `runtime` is an alias of
//! `runtime_type`, and the `kv_connector` / `kv_role` / `kv_engine_id` labels are moved out of
//! `labels` into their fields. [`WorkerSpec::validate`] then applies the URL and range rules.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize, Serializer};

use super::defaults;
use super::error::ConfigError;

/// A worker's role. Lowercase only, as SMG's JSON extractor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerType {
    #[default]
    Regular,
    Prefill,
    Decode,
    Encode,
}

impl WorkerType {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerType::Regular => "regular",
            WorkerType::Prefill => "prefill",
            WorkerType::Decode => "decode",
            WorkerType::Encode => "encode",
        }
    }
}

/// The engine kind declared for a worker. `unspecified` asks for runtime detection; an
/// unresolved runtime becomes `sglang` (SMG).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeType {
    #[default]
    Unspecified,
    Sglang,
    Vllm,
    Trtllm,
    Mlx,
    Tokenspeed,
    Generic,
    External,
}

impl RuntimeType {
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeType::Unspecified => "unspecified",
            RuntimeType::Sglang => "sglang",
            RuntimeType::Vllm => "vllm",
            RuntimeType::Trtllm => "trtllm",
            RuntimeType::Mlx => "mlx",
            RuntimeType::Tokenspeed => "tokenspeed",
            RuntimeType::Generic => "generic",
            RuntimeType::External => "external",
        }
    }

    /// Whether the engine has a PD protocol (a KV handoff the gateway knows how to run):
    /// SGLang, vLLM and TokenSpeed. A gRPC PD request that lands on any other runtime
    /// (TensorRT-LLM, MLX, an unknown servicer) fails 400 `runtime_pd_not_supported`.
    pub fn has_pd_protocol(self) -> bool {
        matches!(
            self,
            RuntimeType::Sglang | RuntimeType::Vllm | RuntimeType::Tokenspeed
        )
    }
}

/// `connection_mode` of a spec. Accepted for compatibility; the URL scheme decides in practice
/// (a live worker's mode is `WorkerAddress::connection_mode`, from its URL).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConnectionMode {
    Http,
    Grpc,
    Zmq,
}

impl ConnectionMode {
    /// The value of SMG's `connection_mode` field and metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectionMode::Http => "http",
            ConnectionMode::Grpc => "grpc",
            ConnectionMode::Zmq => "zmq",
        }
    }
}

/// The scheme of a worker URL; it selects the transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UrlScheme {
    Http,
    Https,
    Grpc,
    Grpcs,
    /// ZMQ; never a PD leg.
    Ipc,
}

impl UrlScheme {
    pub fn as_str(self) -> &'static str {
        match self {
            UrlScheme::Http => "http",
            UrlScheme::Https => "https",
            UrlScheme::Grpc => "grpc",
            UrlScheme::Grpcs => "grpcs",
            UrlScheme::Ipc => "ipc",
        }
    }

    fn from_exact(scheme: &str) -> Option<UrlScheme> {
        Some(match scheme {
            "http" => UrlScheme::Http,
            "https" => UrlScheme::Https,
            "grpc" => UrlScheme::Grpc,
            "grpcs" => UrlScheme::Grpcs,
            "ipc" => UrlScheme::Ipc,
            _ => return None,
        })
    }

    /// `http(s)://`: served by the HTTP PD path.
    pub fn is_http(self) -> bool {
        matches!(self, UrlScheme::Http | UrlScheme::Https)
    }

    /// `grpc(s)://`: needs the gRPC pipeline.
    pub fn is_grpc(self) -> bool {
        matches!(self, UrlScheme::Grpc | UrlScheme::Grpcs)
    }

    pub fn uses_tls(self) -> bool {
        matches!(self, UrlScheme::Https | UrlScheme::Grpcs)
    }
}

/// A checked worker URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerUrl {
    pub scheme: UrlScheme,
    /// Host without brackets (IPv6 literals unbracketed); for `ipc`, the socket path.
    pub host: String,
    /// The explicit port, if any (never 0).
    pub port: Option<u16>,
}

impl WorkerUrl {
    /// The port to dial: the explicit one, else the scheme's default (80/443; gRPC has none).
    pub fn port_or_default(&self) -> Option<u16> {
        self.port.or(match self.scheme {
            UrlScheme::Http => Some(80),
            UrlScheme::Https => Some(443),
            _ => None,
        })
    }
}

/// Parses a worker URL with SMG's rules: the scheme is lowercase `http`, `https`, `grpc`,
/// `grpcs` or `ipc`; the URL has a host (for `ipc`, a path); and pdgate adds: an explicit port
/// is not 0. The error says what is wrong, without the location (callers add it).
pub fn parse_worker_url(url: &str) -> Result<WorkerUrl, String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!(
            "'{url}' has no scheme; a worker URL starts with http://, https://, grpc://, grpcs:// or ipc://"
        ));
    };
    let scheme = match UrlScheme::from_exact(scheme) {
        Some(s) => s,
        None if UrlScheme::from_exact(&scheme.to_ascii_lowercase()).is_some() => {
            return Err(format!(
                "'{url}': the scheme must be lowercase ('{}://')",
                scheme.to_ascii_lowercase()
            ))
        }
        None => {
            return Err(format!(
                "'{url}': unsupported scheme '{scheme}'; use http, https, grpc, grpcs or ipc"
            ))
        }
    };
    if scheme == UrlScheme::Ipc {
        if rest.is_empty() {
            return Err(format!("'{url}': an ipc:// URL needs a socket path"));
        }
        return Ok(WorkerUrl {
            scheme,
            host: rest.to_string(),
            port: None,
        });
    }
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("'{url}' is not a valid URL: {e}"))?;
    let Some(authority) = uri.authority() else {
        return Err(format!("'{url}' has no host"));
    };
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("'{url}' has no host"));
    }
    // `Uri` accepts "host:", "host:0" and "host:99999" (its `port()` is then `None`): read the
    // port text ourselves.
    let host_port = authority
        .as_str()
        .rsplit_once('@')
        .map_or(authority.as_str(), |(_, hp)| hp);
    let port_text = match host_port.rfind(']') {
        Some(i) => host_port[i + 1..].strip_prefix(':'),
        None => host_port.rsplit_once(':').map(|(_, p)| p),
    };
    let port = match port_text.map(str::parse::<u16>) {
        None => None,
        Some(Ok(0)) => return Err(format!("'{url}': port 0 is not a valid worker port")),
        Some(Ok(port)) => Some(port),
        Some(Err(_)) => return Err(format!("'{url}' has an invalid port (use 1-65535)")),
    };
    Ok(WorkerUrl {
        scheme,
        host: host.to_string(),
        port,
    })
}

/// Whether this build can reach `grpcs://` (TLS) workers. tonic is built without a TLS stack
/// (`proto/Cargo.toml`: no `tls-*` feature), so such workers are refused at intake rather than
/// registered and never reachable; `grpc://` (plaintext HTTP/2) workers are accepted.
pub const GRPCS_WORKERS_SUPPORTED: bool = false;

/// The label keys that mean something to pdgate (http-pd-spec §3.1, spec "MoRI-IO").
pub mod label {
    /// Moved to `WorkerSpec::kv_connector` at intake.
    pub const KV_CONNECTOR: &str = "kv_connector";
    /// Moved to `WorkerSpec::kv_role` at intake.
    pub const KV_ROLE: &str = "kv_role";
    /// Moved to `WorkerSpec::kv_engine_id` at intake.
    pub const KV_ENGINE_ID: &str = "kv_engine_id";
    pub const DP_SIZE: &str = "dp_size";
    pub const TP_SIZE: &str = "tp_size";
    /// SGLang's running window (server args; gRPC `GetLoads` per rank).
    pub const MAX_RUNNING_REQUESTS: &str = "max_running_requests";
    /// TokenSpeed's and vLLM's running window.
    pub const MAX_NUM_SEQS: &str = "max_num_seqs";
    /// gRPC `GetModelInfo.max_context_length`.
    pub const MAX_CONTEXT_LENGTH: &str = "max_context_length";
    /// SGLang / TokenSpeed server args.
    pub const CONTEXT_LENGTH: &str = "context_length";
    pub const TOKENIZER_PATH: &str = "tokenizer_path";
    /// vLLM's name for the page size.
    pub const BLOCK_SIZE: &str = "block_size";
    pub const MODEL_ID: &str = "model_id";
    pub const SERVED_MODEL_NAME: &str = "served_model_name";
    pub const MODEL_PATH: &str = "model_path";
    pub const DISAGGREGATION_MODE: &str = "disaggregation_mode";
    /// Explicit pairing protocol; takes precedence over the spec's `pairing_protocol` field.
    pub const PAIRING_PROTOCOL: &str = "pairing_protocol";
    pub const KV_CACHE_DTYPE: &str = "kv_cache_dtype";
    pub const PAGE_SIZE: &str = "page_size";
    pub const ATTENTION_BACKEND: &str = "attention_backend";
    pub const MODEL_DTYPE: &str = "model_dtype";
    pub const VERSION: &str = "version";
    pub const DISAGGREGATION_TRANSFER_BACKEND: &str = "disaggregation_transfer_backend";
    /// MoRI-IO: `read` or `write` (required on MoRI-IO workers).
    pub const MORIIO_MODE: &str = "moriio_mode";
    /// MoRI-IO: side-channel host (default: the worker URL's host).
    pub const MORIIO_HOST: &str = "moriio_host";
    /// MoRI-IO: the engine's `handshake_port` (default [`super::defaults::MORIIO_HANDSHAKE_PORT`]).
    pub const MORIIO_HANDSHAKE_PORT: &str = "moriio_handshake_port";
    /// MoRI-IO: the engine's `notify_port` (default [`super::defaults::MORIIO_NOTIFY_PORT`]).
    pub const MORIIO_NOTIFY_PORT: &str = "moriio_notify_port";
    /// MoRI-IO WRITE: `sequential` (default) or `concurrent`; honoured on the decode worker.
    pub const MORIIO_WRITE_DISPATCH: &str = "moriio_write_dispatch";
}

/// A model card of a worker spec; only `id` and `aliases` are read, the rest is kept.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    pub id: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// Per-worker health-check overrides (all optional).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HealthOverrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check_interval_secs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub success_threshold: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_health_check: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain_settle_secs: Option<u64>,
}

/// Per-worker retry and circuit-breaker overrides. The retry part becomes the per-model retry
/// config (SMG: last registration wins).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ResilienceOverrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initial_backoff_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_backoff_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff_multiplier: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jitter_factor: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_retry: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cb_failure_threshold: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cb_success_threshold: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cb_timeout_secs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cb_window_secs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_circuit_breaker: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retryable_status_codes: Option<Vec<u16>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_status_codes: Option<Vec<u16>>,
}

/// Per-worker connection-pool overrides.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HttpPoolOverrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool_max_idle_per_host: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool_idle_timeout_secs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect_timeout_secs: Option<u64>,
}

/// Per-worker overload thresholds; setting either enables protection for that worker.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OverloadOverrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_requests: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_usage: Option<f64>,
}

/// One worker, as a `POST /workers` body (http-pd-spec §3.1). Build it with serde (JSON body,
/// YAML entry) or [`WorkerSpec::new`]; check it with [`WorkerSpec::validate`].
///
/// Serializing never writes the `api_key` value (it is replaced by `"<redacted>"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawWorkerSpec")]
pub struct WorkerSpec {
    pub url: String,
    pub worker_type: WorkerType,
    pub runtime_type: RuntimeType,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connection_mode: Option<ConnectionMode>,
    /// SGLang / TokenSpeed / vLLM Mooncake bootstrap port; used for prefill (and encode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bootstrap_port: Option<u16>,
    /// Labels without the kv_* keys (those are in the fields below).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<ModelCard>,
    /// Used for health and admin calls to the worker, never on PD legs, never echoed.
    #[serde(
        serialize_with = "redact_secret",
        skip_serializing_if = "Option::is_none"
    )]
    pub api_key: Option<String>,
    pub priority: u32,
    pub cost: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_connector: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_role: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_engine_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_block_size: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dp_size: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dp_rank: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dp_base_url: Option<String>,
    /// The spec field; the `pairing_protocol` label wins (see [`WorkerSpec::pairing_protocol`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pairing_protocol: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthOverrides>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resilience: Option<ResilienceOverrides>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_pool: Option<HttpPoolOverrides>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overload: Option<OverloadOverrides>,
    pub max_connection_attempts: u32,
}

/// The wire shape: what SMG accepts before intake moves labels around.
#[derive(Deserialize)]
#[serde(default)]
struct RawWorkerSpec {
    url: Option<String>,
    worker_type: WorkerType,
    #[serde(alias = "runtime")]
    runtime_type: RuntimeType,
    connection_mode: Option<ConnectionMode>,
    bootstrap_port: Option<u16>,
    labels: BTreeMap<String, serde_json::Value>,
    models: Vec<ModelCard>,
    api_key: Option<String>,
    priority: u32,
    cost: f32,
    provider: Option<String>,
    kv_connector: Option<String>,
    kv_role: Option<String>,
    kv_engine_id: Option<String>,
    kv_block_size: Option<u32>,
    dp_size: Option<u32>,
    dp_rank: Option<u32>,
    dp_base_url: Option<String>,
    pairing_protocol: Option<String>,
    health: Option<HealthOverrides>,
    resilience: Option<ResilienceOverrides>,
    http_pool: Option<HttpPoolOverrides>,
    overload: Option<OverloadOverrides>,
    max_connection_attempts: u32,
}

impl Default for RawWorkerSpec {
    fn default() -> Self {
        RawWorkerSpec {
            url: None,
            worker_type: WorkerType::default(),
            runtime_type: RuntimeType::default(),
            connection_mode: None,
            bootstrap_port: None,
            labels: BTreeMap::new(),
            models: Vec::new(),
            api_key: None,
            priority: defaults::WORKER_PRIORITY,
            cost: defaults::WORKER_COST,
            provider: None,
            kv_connector: None,
            kv_role: None,
            kv_engine_id: None,
            kv_block_size: None,
            dp_size: None,
            dp_rank: None,
            dp_base_url: None,
            pairing_protocol: None,
            health: None,
            resilience: None,
            http_pool: None,
            overload: None,
            max_connection_attempts: defaults::WORKER_MAX_CONNECTION_ATTEMPTS,
        }
    }
}

/// The top-level keys of a worker spec that pdgate reads (the rest are ignored, as in SMG);
/// used to point out probable typos in YAML files.
pub(crate) const WORKER_SPEC_KEYS: &[&str] = &[
    "url",
    "worker_type",
    "runtime_type",
    "runtime",
    "connection_mode",
    "bootstrap_port",
    "labels",
    "models",
    "api_key",
    "priority",
    "cost",
    "provider",
    "kv_connector",
    "kv_role",
    "kv_engine_id",
    "kv_block_size",
    "dp_size",
    "dp_rank",
    "dp_base_url",
    "pairing_protocol",
    "health",
    "resilience",
    "http_pool",
    "overload",
    "max_connection_attempts",
    // Known SMG keys pdgate accepts and does not use.
    "load_monitor_interval_secs",
    "multimodal_tensor_transport",
    "multimodal_shm_min_bytes",
    "zmq_handshake_address",
];

impl TryFrom<RawWorkerSpec> for WorkerSpec {
    type Error = String;

    fn try_from(raw: RawWorkerSpec) -> Result<Self, String> {
        let url = raw.url.ok_or_else(|| "missing field `url`".to_string())?;
        let mut labels = BTreeMap::new();
        for (key, value) in raw.labels {
            let text = match value {
                serde_json::Value::String(s) => s,
                serde_json::Value::Number(n) => n.to_string(),
                serde_json::Value::Bool(b) => b.to_string(),
                other => {
                    return Err(format!(
                        "label `{key}` must be a string (or a number or boolean), got {other}"
                    ))
                }
            };
            labels.insert(key, text);
        }
        let kv_connector = take_kv_label(&mut labels, label::KV_CONNECTOR, raw.kv_connector)?;
        let kv_role = take_kv_label(&mut labels, label::KV_ROLE, raw.kv_role)?;
        let kv_engine_id = take_kv_label(&mut labels, label::KV_ENGINE_ID, raw.kv_engine_id)?;
        Ok(WorkerSpec {
            url,
            worker_type: raw.worker_type,
            runtime_type: raw.runtime_type,
            connection_mode: raw.connection_mode,
            bootstrap_port: raw.bootstrap_port,
            labels,
            models: raw.models,
            api_key: raw.api_key,
            priority: raw.priority,
            cost: raw.cost,
            provider: raw.provider,
            kv_connector,
            kv_role,
            kv_engine_id,
            kv_block_size: raw.kv_block_size,
            dp_size: raw.dp_size,
            dp_rank: raw.dp_rank,
            dp_base_url: raw.dp_base_url,
            pairing_protocol: raw.pairing_protocol,
            health: raw.health,
            resilience: raw.resilience,
            http_pool: raw.http_pool,
            overload: raw.overload,
            max_connection_attempts: raw.max_connection_attempts,
        })
    }
}

/// Moves a kv_* label into its field. SMG [S] reads only the label and [D] honours the
/// top-level field; pdgate takes either, and refuses the two when they disagree rather than
/// guess which one the operator meant.
fn take_kv_label(
    labels: &mut BTreeMap<String, String>,
    key: &str,
    field: Option<String>,
) -> Result<Option<String>, String> {
    match (labels.remove(key), field) {
        (Some(from_label), Some(from_field)) if from_label != from_field => Err(format!(
            "`{key}` is given twice with different values ('{from_field}' and labels.{key} '{from_label}'); keep one"
        )),
        (from_label, from_field) => Ok(from_field.or(from_label)),
    }
}

fn redact_secret<S: Serializer>(value: &Option<String>, serializer: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(_) => serializer.serialize_some("<redacted>"),
        None => serializer.serialize_none(),
    }
}

/// Why a worker's retry overrides do nothing in pdgate.
const RETRIES_ARE_GATEWAY_WIDE: &str =
    "retries are gateway-wide in pdgate: the retry_* settings apply to every request";

impl WorkerSpec {
    /// The settings of this spec that pdgate accepts (they are SMG's spec shape) but does not
    /// apply, each with what applies instead, so that a given one is reported (a notice at
    /// startup, a warning for `POST /workers`) rather than dropped without a word. The circuit
    /// breaker, health and overload overrides do apply.
    pub fn unapplied(&self) -> Vec<(&'static str, &'static str)> {
        let mut out = Vec::new();
        if let Some(r) = &self.resilience {
            let retries = [
                ("resilience.max_retries", r.max_retries.is_some()),
                (
                    "resilience.initial_backoff_ms",
                    r.initial_backoff_ms.is_some(),
                ),
                ("resilience.max_backoff_ms", r.max_backoff_ms.is_some()),
                (
                    "resilience.backoff_multiplier",
                    r.backoff_multiplier.is_some(),
                ),
                ("resilience.jitter_factor", r.jitter_factor.is_some()),
                ("resilience.disable_retry", r.disable_retry.is_some()),
                (
                    "resilience.retryable_status_codes",
                    r.retryable_status_codes.is_some(),
                ),
            ];
            out.extend(
                retries
                    .into_iter()
                    .filter(|(_, given)| *given)
                    .map(|(key, _)| (key, RETRIES_ARE_GATEWAY_WIDE)),
            );
            if r.cb_window_secs.is_some() {
                out.push((
                    "resilience.cb_window_secs",
                    "the circuit breaker counts consecutive outcomes, not outcomes in a window",
                ));
            }
        }
        if self.http_pool.is_some() {
            out.push((
                "http_pool",
                "legs share the gateway's connection pool (upstream_pool_idle_timeout_secs, connect_timeout_ms)",
            ));
        }
        if self.dp_base_url.is_some() {
            out.push((
                "dp_base_url",
                "a DP rank is reached at the worker's own URL, the rank carried by its legs (--dp-aware)",
            ));
        }
        out
    }

    /// A spec with SMG's defaults for everything but the URL and role.
    pub fn new(url: impl Into<String>, worker_type: WorkerType) -> Self {
        let raw = RawWorkerSpec {
            url: Some(url.into()),
            worker_type,
            ..RawWorkerSpec::default()
        };
        // Invariant: a raw spec with a URL and no labels always converts.
        WorkerSpec::try_from(raw).expect("a spec without labels converts")
    }

    /// Parses a `POST /workers` body. Errors read like `labels: …` or `url: …`.
    pub fn from_json(body: &[u8]) -> Result<Self, ConfigError> {
        serde_json::from_slice(body)
            .map_err(|e| ConfigError::parse(None, format!("invalid worker spec: {e}")))
    }

    /// The checked URL. Fails exactly when [`WorkerSpec::validate`] fails on the URL.
    pub fn parsed_url(&self) -> Result<WorkerUrl, ConfigError> {
        parse_worker_url(&self.url).map_err(|e| ConfigError::invalid_at("url", e))
    }

    /// The explicit pairing protocol: the `pairing_protocol` label, else the spec field.
    pub fn pairing_protocol(&self) -> Option<&str> {
        self.labels
            .get(label::PAIRING_PROTOCOL)
            .or(self.pairing_protocol.as_ref())
            .map(String::as_str)
            .filter(|p| !p.is_empty())
    }

    /// The URL without a trailing `/`, for duplicate detection.
    pub fn url_key(&self) -> &str {
        self.url.trim_end_matches('/')
    }

    /// SMG's intake checks plus pdgate's range checks. The error's location is relative to the
    /// spec (`url`, `overload.token_usage`, …); callers prefix where the spec came from.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let url = self.parsed_url()?;
        if url.scheme == UrlScheme::Ipc && self.worker_type != WorkerType::Regular {
            return Err(ConfigError::invalid_at(
                "url",
                format!(
                    "'{}': an ipc:// (ZMQ) worker cannot be a {} worker; PD legs need an http(s):// or grpc(s):// URL",
                    self.url,
                    self.worker_type.as_str()
                ),
            ));
        }
        if url.scheme == UrlScheme::Grpcs && !GRPCS_WORKERS_SUPPORTED {
            return Err(ConfigError::unsupported(
                "url",
                format!(
                    "'{}': grpcs:// (TLS) workers are not supported: this build of pdgate has no TLS client for gRPC; use grpc:// (plaintext) or terminate TLS next to the engine",
                    self.url
                ),
            ));
        }
        if url.scheme.is_grpc() {
            check_grpc_target(&self.url, &url)?;
        }
        if self.bootstrap_port == Some(0) {
            return Err(ConfigError::invalid_at(
                "bootstrap_port",
                "port 0 is not a valid bootstrap port",
            ));
        }
        if self.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
            return Err(ConfigError::invalid_at(
                "api_key",
                "must not be empty when set; remove it for no key",
            ));
        }
        if !self.cost.is_finite() || self.cost < 0.0 {
            return Err(ConfigError::invalid_at(
                "cost",
                format!("{} is not a cost; use a number ≥ 0", self.cost),
            ));
        }
        if self.max_connection_attempts == 0 {
            return Err(ConfigError::invalid_at(
                "max_connection_attempts",
                "is 0; it must be at least 1",
            ));
        }
        if self.dp_size == Some(0) {
            return Err(ConfigError::invalid_at(
                "dp_size",
                "is 0; it must be at least 1",
            ));
        }
        if let (Some(rank), Some(size)) = (self.dp_rank, self.dp_size) {
            if rank >= size {
                return Err(ConfigError::invalid_at(
                    "dp_rank",
                    format!("rank {rank} is out of range for dp_size {size}"),
                ));
            }
        }
        if let Some(health) = &self.health {
            check_at_least_one(
                "health.success_threshold",
                health.success_threshold.map(u64::from),
            )?;
            check_at_least_one(
                "health.failure_threshold",
                health.failure_threshold.map(u64::from),
            )?;
            check_at_least_one("health.timeout_secs", health.timeout_secs)?;
            check_at_least_one("health.check_interval_secs", health.check_interval_secs)?;
        }
        if let Some(r) = &self.resilience {
            if let Some(j) = r.jitter_factor {
                check_fraction("resilience.jitter_factor", f64::from(j), true)?;
            }
            if let Some(m) = r.backoff_multiplier {
                if !(m.is_finite() && m >= 1.0) {
                    return Err(ConfigError::invalid_at(
                        "resilience.backoff_multiplier",
                        format!("{m} must be ≥ 1.0"),
                    ));
                }
            }
            if let (Some(initial), Some(max)) = (r.initial_backoff_ms, r.max_backoff_ms) {
                if initial > max {
                    return Err(ConfigError::invalid_at(
                        "resilience.initial_backoff_ms",
                        format!("{initial} is above max_backoff_ms {max}"),
                    ));
                }
            }
            check_at_least_one(
                "resilience.cb_failure_threshold",
                r.cb_failure_threshold.map(u64::from),
            )?;
            check_at_least_one(
                "resilience.cb_success_threshold",
                r.cb_success_threshold.map(u64::from),
            )?;
            for (key, codes) in [
                (
                    "resilience.retryable_status_codes",
                    &r.retryable_status_codes,
                ),
                ("resilience.capacity_status_codes", &r.capacity_status_codes),
            ] {
                if let Some(bad) = codes.iter().flatten().find(|c| !(100..=599).contains(*c)) {
                    return Err(ConfigError::invalid_at(
                        key,
                        format!("{bad} is not an HTTP status code"),
                    ));
                }
            }
        }
        if let Some(o) = &self.overload {
            if o.waiting_requests == Some(0) {
                return Err(ConfigError::invalid_at(
                    "overload.waiting_requests",
                    "must be at least 1 (the comparison is inclusive, so 0 would mark the worker always overloaded)",
                ));
            }
            if let Some(t) = o.token_usage {
                check_fraction("overload.token_usage", t, false)?;
            }
        }
        Ok(())
    }
}

/// A gRPC worker URL names a servicer: `grpc://host:port`. The servicers have no conventional
/// port, and a gRPC method path is absolute, so a URL without a port or with a path is a
/// mistake, not a default.
fn check_grpc_target(text: &str, url: &WorkerUrl) -> Result<(), ConfigError> {
    if url.port.is_none() {
        return Err(ConfigError::invalid_at(
            "url",
            format!("'{text}': a gRPC worker URL needs the servicer's port (grpc://host:port)"),
        ));
    }
    let after_scheme = text.split_once("://").map_or(text, |(_, rest)| rest);
    let path = after_scheme
        .split_once('/')
        .map_or("", |(_, p)| p)
        .trim_end_matches('/');
    if !path.is_empty() {
        return Err(ConfigError::invalid_at(
            "url",
            format!("'{text}': a gRPC worker URL has no path (grpc://host:port)"),
        ));
    }
    Ok(())
}

fn check_at_least_one(location: &str, value: Option<u64>) -> Result<(), ConfigError> {
    if value == Some(0) {
        return Err(ConfigError::invalid_at(
            location,
            "is 0; it must be at least 1",
        ));
    }
    Ok(())
}

/// `[0, 1]` when `zero_ok`, else `(0, 1]`.
fn check_fraction(location: &str, value: f64, zero_ok: bool) -> Result<(), ConfigError> {
    let ok = value.is_finite() && value <= 1.0 && if zero_ok { value >= 0.0 } else { value > 0.0 };
    if !ok {
        let range = if zero_ok { "[0, 1]" } else { "(0, 1]" };
        return Err(ConfigError::invalid_at(
            location,
            format!("{value} is outside {range}"),
        ));
    }
    Ok(())
}
