//! The one configuration model of a mock engine (library and CLI both build it), and the fault
//! catalogue of `POST /mock/faults` (mock-engines-spec §2.1, §2.5).

use std::net::IpAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::fake_model::{OutputVocab, SamplingSpec};
use crate::vision::MockVision;

/// Which PD role the engine plays (SGLang `disaggregation_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Prefill,
    Decode,
    /// A regular, non-PD worker: the reference output.
    Both,
    /// TokenSpeed EPD encode worker (gRPC only): serves `TokenSpeedEncoder.Encode` and
    /// publishes each item's embedding on its bootstrap server for the prefill to fetch.
    Encode,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Both => "both",
            Role::Encode => "encode",
        }
    }
}

/// Which engine's wire dialect the mock speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    Sglang,
    Vllm,
    /// gRPC only: the `TokenSpeedScheduler` service, with SGLang's bootstrap-room handoff
    /// (63-bit rooms, prefill DP rank = `room % dp_size`).
    #[serde(rename = "tokenspeed")]
    TokenSpeed,
}

impl EngineKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Sglang => "sglang",
            EngineKind::Vllm => "vllm",
            EngineKind::TokenSpeed => "tokenspeed",
        }
    }

    /// Engines whose legs meet in a bootstrap room on the prefill's bootstrap server (SGLang's
    /// handoff, which TokenSpeed kept); the other one (vLLM) relays `kv_transfer_params`.
    pub fn uses_bootstrap_rooms(self) -> bool {
        matches!(self, EngineKind::Sglang | EngineKind::TokenSpeed)
    }
}

/// How the engine's API is served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// The engine's HTTP server (OpenAI routes, `/generate`, ...).
    #[default]
    Http,
    /// The engine's gRPC servicer (`SglangScheduler`, `VllmEngine`, `TokenSpeedScheduler`):
    /// token ids in, token ids out. The `/mock/*` control plane moves to a second HTTP port.
    Grpc,
}

/// A gRPC status code, named as the gRPC spec names it (`"INVALID_ARGUMENT"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum GrpcCode {
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl GrpcCode {
    /// The spec's name (`"INVALID_ARGUMENT"`), as records show it.
    pub fn name(self) -> &'static str {
        match self {
            GrpcCode::Cancelled => "CANCELLED",
            GrpcCode::Unknown => "UNKNOWN",
            GrpcCode::InvalidArgument => "INVALID_ARGUMENT",
            GrpcCode::DeadlineExceeded => "DEADLINE_EXCEEDED",
            GrpcCode::NotFound => "NOT_FOUND",
            GrpcCode::AlreadyExists => "ALREADY_EXISTS",
            GrpcCode::PermissionDenied => "PERMISSION_DENIED",
            GrpcCode::ResourceExhausted => "RESOURCE_EXHAUSTED",
            GrpcCode::FailedPrecondition => "FAILED_PRECONDITION",
            GrpcCode::Aborted => "ABORTED",
            GrpcCode::OutOfRange => "OUT_OF_RANGE",
            GrpcCode::Unimplemented => "UNIMPLEMENTED",
            GrpcCode::Internal => "INTERNAL",
            GrpcCode::Unavailable => "UNAVAILABLE",
            GrpcCode::DataLoss => "DATA_LOSS",
            GrpcCode::Unauthenticated => "UNAUTHENTICATED",
        }
    }

    /// Parses the spec's name (any case, `-` or `_`).
    pub fn parse(s: &str) -> Option<GrpcCode> {
        let norm = s.trim().to_ascii_uppercase().replace('-', "_");
        serde_json::from_value(serde_json::Value::String(norm)).ok()
    }
}

/// Knobs of the gRPC transport.
#[derive(Clone, Debug, PartialEq)]
pub struct GrpcOptions {
    /// Send `Generate`'s response headers as soon as the call is accepted. Off (the default),
    /// they go out with the first message, as Python grpc.aio servicers do: a client's
    /// `generate().await` returns only when the first message or the error is ready.
    pub headers_at_once: bool,
    /// The control-plane HTTP port (`/mock/*`, `/metrics`); 0 = ephemeral.
    pub control_port: u16,
    /// SGLang: the servicer runs with `skip_tokenizer_init` (how gRPC workers run), so string
    /// `stop` and `min_new_tokens > 0` are refused with INVALID_ARGUMENT, as SGLang's
    /// `SamplingParams.normalize` does. Off: both are honoured.
    pub skip_tokenizer_init: bool,
    /// The code a SGLang/TokenSpeed leg whose rendezvous never completed ends with (bootstrap or
    /// transfer timeout, prefill unreachable). The servicers map the scheduler's 500 abort to
    /// INTERNAL, the default.
    pub kv_timeout_code: GrpcCode,
}

impl Default for GrpcOptions {
    fn default() -> Self {
        GrpcOptions {
            headers_at_once: false,
            control_port: 0,
            skip_tokenizer_init: true,
            kv_timeout_code: GrpcCode::Internal,
        }
    }
}

/// KV connector / transfer backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Connector {
    /// SGLang `mooncake` / vLLM `MooncakeConnector`.
    Mooncake,
    /// SGLang `nixl` / vLLM `NixlConnector`.
    Nixl,
    /// SGLang `fake` backend: no transfer, decode runs over KV that never arrived.
    Fake,
    /// vLLM `MoRIIOConnector` in READ mode.
    MoriioRead,
    /// vLLM `MoRIIOConnector` in WRITE mode.
    MoriioWrite,
    /// No connector (vLLM passthrough).
    None,
}

impl Connector {
    pub fn as_str(self) -> &'static str {
        match self {
            Connector::Mooncake => "mooncake",
            Connector::Nixl => "nixl",
            Connector::Fake => "fake",
            Connector::MoriioRead => "moriio-read",
            Connector::MoriioWrite => "moriio-write",
            Connector::None => "none",
        }
    }

    pub fn parse(s: &str) -> Option<Connector> {
        Some(match s.to_ascii_lowercase().as_str() {
            "mooncake" | "mooncakeconnector" => Connector::Mooncake,
            "nixl" | "nixlconnector" => Connector::Nixl,
            "fake" => Connector::Fake,
            "moriio-read" | "moriio_read" => Connector::MoriioRead,
            "moriio-write" | "moriio_write" | "moriio" | "moriioconnector" => {
                Connector::MoriioWrite
            }
            "none" | "passthrough" => Connector::None,
            _ => return None,
        })
    }
}

/// vLLM `kv_load_failure_policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadFailurePolicy {
    Fail,
    Recompute,
}

/// What a type-invalid handoff field does to a vLLM engine (`--malformed-params`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MalformedParams {
    /// The request fails with 500.
    Error500,
    /// The scheduler step raises: the engine is dead (`/health` 503) until `restart()`.
    Crash,
}

/// Every knob of one mock engine. `Default` gives a SGLang `Both` engine over HTTP on 127.0.0.1
/// with ephemeral ports and the real engines' timeouts.
#[derive(Clone, Debug)]
pub struct MockEngineConfig {
    pub role: Role,
    pub engine: EngineKind,
    pub transport: Transport,
    /// gRPC transport knobs (ignored over HTTP).
    pub grpc: GrpcOptions,
    /// The ids the fake model emits and ends on (default: the HTTP pseudo-words, EOS 2).
    pub output_vocab: OutputVocab,
    /// `tokenizer_path` the info RPCs report (a gateway may load its tokenizer from it).
    pub tokenizer_path: Option<String>,
    pub connector: Connector,
    pub bind_ip: IpAddr,
    /// API port; 0 = ephemeral.
    pub port: u16,
    /// SGLang bootstrap server / vLLM Mooncake bootstrap port (prefill only); 0 = ephemeral.
    pub bootstrap_port: u16,
    /// What a SGLang engine substitutes for `bootstrap_port: null` (real default 8998).
    pub default_bootstrap_port: u16,
    /// Host advertised to peers (SGLang `rank_ip`, Mooncake `/query` addrs); default `bind_ip`.
    pub advertise_host: Option<String>,
    /// vLLM NIXL `remote_host` advertised by the prefill (real default `localhost`; `None` = bind_ip).
    pub side_channel_host: Option<String>,
    /// vLLM side-channel port (NIXL handshake / MoRI handshake); 0 = ephemeral.
    pub side_channel_port: u16,
    /// MoRI-IO notify port; 0 = ephemeral.
    pub notify_port: u16,
    /// KV engine id; `None` = a random uuid per start (changes on `restart()`).
    pub engine_id: Option<String>,
    pub model: String,
    pub dp_size: u32,
    pub tp_size: u32,
    pub page_size: u32,
    pub kv_cache_dtype: String,
    pub max_running_requests: u32,
    pub max_model_len: u32,
    /// Total KV tokens of the prefill block pool.
    pub kv_tokens: u32,
    /// vLLM block size (tokens per block).
    pub block_size: u32,
    /// SGLang `load_balance_method` of the prefill (`follow_bootstrap_room` or other).
    pub load_balance_method: String,
    pub bootstrap_timeout: Duration,
    pub waiting_timeout: Duration,
    pub heartbeat_interval: Duration,
    pub heartbeat_max_failure: u32,
    pub ensure_retries: u32,
    pub ensure_retry_interval: Duration,
    /// vLLM `VLLM_*_ABORT_REQUEST_TIMEOUT` (pinned prefill blocks expire after it).
    pub abort_request_timeout: Duration,
    /// vLLM Mooncake decode: how long to wait for the prefill side to be ready.
    pub p_ready_timeout: Duration,
    /// MoRI WRITE decode: how long to wait for the push (`None` = forever, as vLLM).
    pub moriio_write_wait: Option<Duration>,
    pub kv_load_failure_policy: LoadFailurePolicy,
    pub malformed_params: MalformedParams,
    /// vLLM request-id randomization (`<id>-<8hex>` internal ids, #27987). Off = legacy profile.
    pub request_id_suffix: bool,
    /// vLLM `remote_block_ids` grouped per KV-cache group (`[[...]]`) or flat.
    pub grouped_block_ids: bool,
    pub ttft_ms: u64,
    pub itl_ms: u64,
    /// Multiplies every latency sleep (not the protocol timeouts).
    pub time_scale: f64,
    /// EOS when `state % period == 0` (0 = never).
    pub natural_stop_every: u64,
    /// SGLang `--incremental-streaming-output` for `/generate` streams.
    pub incremental_streaming_output: bool,
    /// vLLM `--enable-prompt-tokens-details`: OpenAI answers carry
    /// `usage.prompt_tokens_details.cached_tokens` (the prompt tokens not computed here: local
    /// prefix hits plus what the KV connector loaded). Off, vLLM sends `null` details.
    pub prompt_tokens_details: bool,
    /// A compute-bound prefill: each prompt token adds this many microseconds to the forward
    /// pass, and forward passes run one at a time (others queue). 0 = the fixed `ttft_ms` only,
    /// concurrently.
    pub prefill_us_per_token: u64,
    /// Prefix cache on the prefill (reports `cached_tokens`).
    pub prefix_cache: bool,
    /// Max `/mock/requests` records kept.
    pub record_limit: usize,
    /// Test device for per-sample fan-out: a single-sample request whose request id ends in
    /// `-<i>` (1 to 4 digits: `rid`, else `X-Request-Id`) runs as sample `i` of an `n>1`
    /// request, as the engine's own parallel sampling would (a real engine samples at random;
    /// the mock needs the index to stay deterministic). Off by default.
    pub sample_from_request_id: bool,
    /// A decode runs at most `max_running_requests` requests at once: one that got its KV waits
    /// for a running slot before it generates (SGLang's decode holds the transferred KV in its
    /// waiting queue meanwhile). Off by default: the mock runs everything at once.
    pub enforce_running_window: bool,
    /// `/get_server_info` carries `max_running_requests` (off: `null`, as an SGLang whose
    /// report names no window).
    pub report_running_window: bool,
    /// gRPC: the fake vision tower. `None`: a text model (media are recorded, not understood).
    pub vision: Option<MockVision>,
}

impl Default for MockEngineConfig {
    fn default() -> Self {
        MockEngineConfig {
            role: Role::Both,
            engine: EngineKind::Sglang,
            transport: Transport::Http,
            grpc: GrpcOptions::default(),
            output_vocab: OutputVocab::pseudo_words(),
            tokenizer_path: None,
            connector: Connector::Mooncake,
            bind_ip: IpAddr::from([127, 0, 0, 1]),
            port: 0,
            bootstrap_port: 0,
            default_bootstrap_port: 8998,
            advertise_host: None,
            side_channel_host: None,
            side_channel_port: 0,
            notify_port: 0,
            engine_id: None,
            model: "mock-model".into(),
            dp_size: 1,
            tp_size: 1,
            page_size: 1,
            kv_cache_dtype: "auto".into(),
            max_running_requests: 256,
            max_model_len: 32768,
            kv_tokens: 524_288,
            block_size: 16,
            load_balance_method: "follow_bootstrap_room".into(),
            bootstrap_timeout: Duration::from_secs(300),
            waiting_timeout: Duration::from_secs(300),
            heartbeat_interval: Duration::from_secs(5),
            heartbeat_max_failure: 2,
            ensure_retries: 15,
            ensure_retry_interval: Duration::from_secs(1),
            abort_request_timeout: Duration::from_secs(480),
            p_ready_timeout: Duration::from_secs(30),
            moriio_write_wait: None,
            kv_load_failure_policy: LoadFailurePolicy::Fail,
            malformed_params: MalformedParams::Error500,
            request_id_suffix: true,
            grouped_block_ids: true,
            ttft_ms: 5,
            itl_ms: 1,
            time_scale: 1.0,
            natural_stop_every: 0,
            incremental_streaming_output: false,
            prompt_tokens_details: false,
            prefill_us_per_token: 0,
            prefix_cache: true,
            record_limit: 10_000,
            sample_from_request_id: false,
            enforce_running_window: false,
            report_running_window: true,
            vision: None,
        }
    }
}

impl MockEngineConfig {
    /// A config for `engine`/`role` on `bind_ip` with short protocol timeouts (2 s) for tests.
    pub fn test(engine: EngineKind, role: Role, bind_ip: [u8; 4]) -> Self {
        let connector = match engine {
            EngineKind::Sglang | EngineKind::TokenSpeed => Connector::Mooncake,
            EngineKind::Vllm => Connector::Nixl,
        };
        let transport = match engine {
            EngineKind::TokenSpeed => Transport::Grpc,
            _ => Transport::Http,
        };
        MockEngineConfig {
            role,
            engine,
            transport,
            connector,
            bind_ip: IpAddr::from(bind_ip),
            bootstrap_timeout: Duration::from_secs(2),
            waiting_timeout: Duration::from_secs(2),
            heartbeat_interval: Duration::from_millis(500),
            ensure_retries: 3,
            ensure_retry_interval: Duration::from_millis(100),
            abort_request_timeout: Duration::from_secs(2),
            p_ready_timeout: Duration::from_secs(2),
            moriio_write_wait: Some(Duration::from_secs(2)),
            ttft_ms: 2,
            itl_ms: 0,
            ..MockEngineConfig::default()
        }
    }

    /// [`MockEngineConfig::test`] serving the engine's gRPC service.
    pub fn grpc_test(engine: EngineKind, role: Role, bind_ip: [u8; 4]) -> Self {
        MockEngineConfig {
            transport: Transport::Grpc,
            ..MockEngineConfig::test(engine, role, bind_ip)
        }
    }

    pub fn with_connector(mut self, c: Connector) -> Self {
        self.connector = c;
        self
    }

    /// Gives the engine a vision tower (see [`crate::vision`]).
    pub fn with_vision(mut self, v: MockVision) -> Self {
        self.vision = Some(v);
        self
    }

    pub fn with_vocab(mut self, v: OutputVocab) -> Self {
        self.output_vocab = v;
        self
    }

    /// The sampling spec this engine starts every request from (its vocabulary and natural
    /// EOS period); a test sets the request's knobs on top and passes it to
    /// [`crate::fake_model::reference`].
    pub fn sampling_spec(&self) -> SamplingSpec {
        SamplingSpec {
            eos_period: self.natural_stop_every,
            vocab: self.output_vocab.clone(),
            ..SamplingSpec::default()
        }
    }

    /// The host peers should dial for this engine.
    pub fn advertised_host(&self) -> String {
        self.advertise_host
            .clone()
            .unwrap_or_else(|| self.bind_ip.to_string())
    }
}

/// Which requests a fault applies to.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultMatch {
    /// Exact request path (e.g. `/generate`, or over gRPC the method path
    /// `/sglang.grpc.scheduler.SglangScheduler/Generate`); `None` = every model route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// Only when the engine has this role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
}

/// A deterministic failure or latency fault (`POST /mock/faults` body, tagged by `kind`).
/// `count` = how many matching requests it applies to (`None` = until `reset()`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// Answer with `status` (and `body`, default an engine-shaped error) without doing any work.
    FailStatus {
        status: u16,
        #[serde(default)]
        body: Option<String>,
        #[serde(default)]
        count: Option<u32>,
        #[serde(default, rename = "match")]
        matcher: FaultMatch,
    },
    /// Wait `ms`, then answer with `status` as `fail_status` does: a request that fails once
    /// the requests sent with it have reached their engines.
    FailStatusAfter {
        status: u16,
        ms: u64,
        #[serde(default)]
        count: Option<u32>,
        #[serde(default, rename = "match")]
        matcher: FaultMatch,
    },
    /// Sleep before doing anything (the response head is delayed by at least `ms`).
    DelayHead {
        ms: u64,
        #[serde(default)]
        count: Option<u32>,
        #[serde(default, rename = "match")]
        matcher: FaultMatch,
    },
    /// Never respond (until the client hangs up).
    Hang {
        #[serde(default)]
        count: Option<u32>,
        #[serde(default, rename = "match")]
        matcher: FaultMatch,
    },
    /// Send a 200 head, then close the connection.
    DropConnectionAfterHead {
        #[serde(default)]
        count: Option<u32>,
        #[serde(default, rename = "match")]
        matcher: FaultMatch,
    },
    /// Send a 200 head, then nothing (until the client hangs up).
    StallAfterHead {
        #[serde(default)]
        count: Option<u32>,
        #[serde(default, rename = "match")]
        matcher: FaultMatch,
    },
    /// The first generated token is EOS (unless `ignore_eos`).
    EosFirstToken {
        #[serde(default)]
        count: Option<u32>,
    },
    /// Stop the bootstrap listener (SGLang: decode heartbeats fail ⇒ `Lost connection`).
    BootstrapDown,
    /// Flip the KV payload/blocks this prefill hands over (decode computes garbage).
    KvCorrupt {
        #[serde(default)]
        count: Option<u32>,
    },
    /// Delay every KV transfer by `ms`.
    SlowTransferMs { ms: u64 },
    /// gRPC: end `Generate` with `code` before producing anything (`message` defaults to a
    /// mock text). Over gRPC, `fail_status` does the same with its HTTP status mapped to a code.
    GrpcStatus {
        code: GrpcCode,
        #[serde(default)]
        message: Option<String>,
        #[serde(default)]
        count: Option<u32>,
        #[serde(default, rename = "match")]
        matcher: FaultMatch,
    },
    /// gRPC: produce `tokens` tokens, then end `Generate` with `code` (a stream sees them as
    /// chunks first; a non-stream call sees only the status).
    FailAfterTokens {
        tokens: u64,
        code: GrpcCode,
        #[serde(default)]
        message: Option<String>,
        #[serde(default)]
        count: Option<u32>,
        #[serde(default, rename = "match")]
        matcher: FaultMatch,
    },
    /// `HealthCheck` (gRPC) reports unhealthy until `reset()`.
    Unhealthy,
    /// KV transfers between this engine and the peer whose KV address (`host:port`) contains
    /// `peer` fail — a broken link between two healthy engines. Checked where the mock moves the
    /// KV: an SGLang prefill's push (both sides fail, as a dead transfer session does), a vLLM
    /// NIXL decode's pull (the decode applies `kv_load_failure_policy`: `recompute` answers
    /// correctly after computing the prompt itself). Until `reset()`.
    LinkDown { peer: String },
    /// vLLM NIXL prefill: the returned `kv_transfer_params` name no block
    /// (`remote_block_ids: []`) — params a vLLM decode's scheduler asserts on.
    NoBlocks {
        #[serde(default)]
        count: Option<u32>,
    },
}

impl Fault {
    pub(crate) fn count(&self) -> Option<u32> {
        match self {
            Fault::FailStatus { count, .. }
            | Fault::FailStatusAfter { count, .. }
            | Fault::DelayHead { count, .. }
            | Fault::Hang { count, .. }
            | Fault::DropConnectionAfterHead { count, .. }
            | Fault::StallAfterHead { count, .. }
            | Fault::EosFirstToken { count }
            | Fault::KvCorrupt { count }
            | Fault::NoBlocks { count }
            | Fault::GrpcStatus { count, .. }
            | Fault::FailAfterTokens { count, .. } => *count,
            Fault::BootstrapDown
            | Fault::SlowTransferMs { .. }
            | Fault::Unhealthy
            | Fault::LinkDown { .. } => None,
        }
    }

    pub(crate) fn matcher(&self) -> Option<&FaultMatch> {
        match self {
            Fault::FailStatus { matcher, .. }
            | Fault::FailStatusAfter { matcher, .. }
            | Fault::DelayHead { matcher, .. }
            | Fault::Hang { matcher, .. }
            | Fault::DropConnectionAfterHead { matcher, .. }
            | Fault::StallAfterHead { matcher, .. }
            | Fault::GrpcStatus { matcher, .. }
            | Fault::FailAfterTokens { matcher, .. } => Some(matcher),
            _ => None,
        }
    }

    /// Short name used in records and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::FailStatus { .. } => "fail_status",
            Fault::FailStatusAfter { .. } => "fail_status_after",
            Fault::DelayHead { .. } => "delay_head",
            Fault::Hang { .. } => "hang",
            Fault::DropConnectionAfterHead { .. } => "drop_connection_after_head",
            Fault::StallAfterHead { .. } => "stall_after_head",
            Fault::EosFirstToken { .. } => "eos_first_token",
            Fault::BootstrapDown => "bootstrap_down",
            Fault::KvCorrupt { .. } => "kv_corrupt",
            Fault::SlowTransferMs { .. } => "slow_transfer_ms",
            Fault::GrpcStatus { .. } => "grpc_status",
            Fault::FailAfterTokens { .. } => "fail_after_tokens",
            Fault::Unhealthy => "unhealthy",
            Fault::LinkDown { .. } => "link_down",
            Fault::NoBlocks { .. } => "no_blocks",
        }
    }
}
