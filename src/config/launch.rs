//! `pdgate launch`: SMG's `smg launch` command line, mapped onto the same model as the YAML file.
//!
//! Every `gateway:` key is a flag (flattened [`GatewayConfig`]). On top of those:
//! - `--prefill URL [PORT|none]`, `--decode URL`: the startup workers (SMG's hand-parsed
//!   optional bootstrap port is folded into one token by [`normalize_launch_argv`]);
//! - `--runtime-worker-threads`, `--shutdown-grace-period-secs`: process settings, mapped onto
//!   Pingora's `threads` / `grace_period_seconds` (under `run -c`, write Pingora's keys);
//! - `--no-remove-unhealthy-workers`, `--disable-worker-overload-protection`: SMG's "off"
//!   switches, mapped onto gateway keys (in YAML, write those keys);
//! - every other SMG flag, parsed so an SMG command line is accepted by the parser, then either
//!   refused (a feature pdgate does not have: the operator must know) or accepted with a notice
//!   (no effect on the HTTP PD path). The dispositions are one table, [`SMG_ONLY_FLAGS`], which
//!   also explains these names when they show up as `gateway:` keys in a YAML file.

use pingora::server::configuration::ServerConf;

use super::defaults;
use super::error::{flag_name, ConfigError};
use super::gateway::GatewayConfig;
use super::validate::{refuse_duplicate_urls, validate, validate_startup_worker};
use super::worker::{WorkerSpec, WorkerType};
use super::{ConfigSource, LoadedConfig};

/// One `--prefill` (or `--encode`) value after [`normalize_launch_argv`]: a URL and the
/// optional bootstrap port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartupWorkerArg {
    pub url: String,
    pub bootstrap_port: Option<u16>,
}

/// Separates the URL from its port inside one normalized argv token. A URL never contains a
/// raw space, so the split is unambiguous.
const URL_PORT_SEPARATOR: char = ' ';

fn parse_startup_worker_arg(value: &str) -> Result<StartupWorkerArg, String> {
    let (url, port) = match value.split_once(URL_PORT_SEPARATOR) {
        Some((url, port)) => (url, Some(port)),
        None => (value, None),
    };
    if url.is_empty() || url.starts_with('-') {
        return Err(format!("expected a worker URL, got '{url}'"));
    }
    let bootstrap_port =
        match port {
            None => None,
            Some(p) if p.eq_ignore_ascii_case("none") => None,
            Some(p) => match p.parse::<u16>() {
                Ok(0) => return Err(
                    "bootstrap port 0 is not allowed; give the engine's bootstrap port or `none`"
                        .into(),
                ),
                Ok(port) => Some(port),
                Err(_) => {
                    return Err(format!(
                        "bootstrap port '{p}' is not a port number (1-65535) or `none`"
                    ))
                }
            },
        };
    Ok(StartupWorkerArg {
        url: url.to_string(),
        bootstrap_port,
    })
}

/// Rewrites SMG's `--prefill URL [PORT|none]` (and `--encode`, same shape) so clap can parse
/// it: the optional second token joins the URL in one value. As in SMG, that token is taken
/// when it parses as a port (`u16`) or is `none` (any case), and is otherwise left as the next
/// argument. pdgate also takes an all-digit token that does not fit a port, so the error says
/// "out of range" instead of "unexpected argument". Port 0 is rejected when the value is parsed.
/// `--prefill=URL` is accepted too; everything after `--` is left alone.
pub fn normalize_launch_argv(args: Vec<String>) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let mut iter = args.into_iter().peekable();
    while let Some(arg) = iter.next() {
        if arg == "--" {
            out.push(arg);
            out.extend(iter);
            break;
        }
        let (flag, inline_url) = match arg.split_once('=') {
            Some((flag, url)) if is_url_port_flag(flag) => {
                (flag.to_string(), Some(url.to_string()))
            }
            _ if is_url_port_flag(&arg) => (arg.clone(), None),
            _ => {
                out.push(arg);
                continue;
            }
        };
        let url = match inline_url {
            Some(url) => url,
            None => match iter.peek() {
                Some(next) if !next.starts_with("--") => iter.next().unwrap_or_default(),
                // No URL: let clap report the missing value.
                _ => {
                    out.push(flag);
                    continue;
                }
            },
        };
        let port_token = iter.peek().filter(|next| is_port_token(next)).cloned();
        out.push(flag);
        match port_token {
            Some(port) => {
                iter.next();
                out.push(format!("{url}{URL_PORT_SEPARATOR}{port}"));
            }
            None => out.push(url),
        }
    }
    out
}

fn is_url_port_flag(arg: &str) -> bool {
    arg == "--prefill" || arg == "--encode"
}

fn is_port_token(token: &str) -> bool {
    token.eq_ignore_ascii_case("none")
        || (!token.is_empty() && token.bytes().all(|b| b.is_ascii_digit()))
}

/// Every flag of `smg launch`, as `pdgate launch` accepts them.
#[derive(Clone, Debug, clap::Args)]
pub struct LaunchArgs {
    #[command(flatten)]
    pub gateway: GatewayConfig,

    /// Prefill worker: `--prefill URL [BOOTSTRAP_PORT|none]`. Repeat per worker.
    #[arg(long, value_name = "URL [PORT|none]", action = clap::ArgAction::Append, value_parser = parse_startup_worker_arg, help_heading = "PD Disaggregation")]
    pub prefill: Vec<StartupWorkerArg>,

    /// Decode worker URL. Repeat per worker.
    #[arg(long, value_name = "URL", action = clap::ArgAction::Append, help_heading = "PD Disaggregation")]
    pub decode: Vec<String>,

    /// EPD encode worker: `--encode URL [BOOTSTRAP_PORT]` (the port prefill reads embeddings
    /// from; 8998 when omitted). Repeat per worker.
    #[arg(long, value_name = "URL [PORT]", action = clap::ArgAction::Append, value_parser = parse_startup_worker_arg, help_heading = "PD Disaggregation")]
    pub encode: Vec<StartupWorkerArg>,

    /// Worker threads of the serving runtime (Pingora `threads`; default: all CPUs).
    #[arg(long, help_heading = "Process")]
    pub runtime_worker_threads: Option<usize>,

    /// Seconds in-flight requests may keep running after SIGTERM (Pingora `grace_period_seconds`).
    #[arg(long, default_value_t = defaults::SHUTDOWN_GRACE_PERIOD_SECS, help_heading = "Process")]
    pub shutdown_grace_period_secs: u64,

    /// Keep workers that reach the terminal failed state, even under service discovery (SMG's
    /// `--no-` form; `remove_unhealthy_workers: false` in YAML).
    #[arg(
        long,
        visible_alias = "no-worker-auto-recovery",
        conflicts_with = "remove_unhealthy_workers",
        help_heading = "Health Checks"
    )]
    pub no_remove_unhealthy_workers: bool,

    /// Switch the gateway-wide overload protection off, whatever --worker-overload-protection
    /// and the --worker-overload-* thresholds say (a worker spec's `overload` still applies);
    /// in YAML, leave those keys out.
    #[arg(long, help_heading = "Load Monitoring")]
    pub disable_worker_overload_protection: bool,

    #[command(flatten)]
    pub smg_only: SmgOnlyFlags,
}

/// What pdgate does with an SMG flag it does not implement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Refused: the flag asks for a feature pdgate does not have.
    Refused,
    /// Accepted and ignored (with a notice): no effect on the HTTP PD path.
    Ignored,
}

/// Launch-only flags that map onto Pingora's top-level keys; in YAML, write those instead.
pub(crate) const LAUNCH_ONLY_PROCESS_FLAGS: &[(&str, &str)] = &[
    ("runtime_worker_threads", "threads"),
    ("shutdown_grace_period_secs", "grace_period_seconds"),
];

/// Reasons shared by several flags.
const NO_MEMORY_HISTORY: &str =
    "the memory history backend stores nothing in pdgate; /v1/responses is proxied to the engine";
const NO_WARM_UP: &str = "cache_aware has no warm-up slice: a new worker, holding the fewest requests, takes the cache misses as the min-load worker";
const NO_SILENCE_RULE: &str = "pdgate takes a worker out of routing on failed health probes and its circuit breaker (a prefill → decode link on failed handoffs), not on silence";

/// Declares the SMG flags pdgate parses but does not implement, each once: its field (a loose
/// type — the value is never used, only whether the flag asks for a feature), its extra clap
/// arguments (every one is `--long` and hidden), what pdgate does when it is given and why, and,
/// for a flag whose "off" value is not a request, the test that it asks for something. Makes
/// [`SmgOnlyFlags`], its `given` and [`SMG_ONLY_FLAGS`] out of the one list.
macro_rules! smg_only_flags {
    ($(
        $(#[doc = $doc:literal])*
        $field:ident: $ty:ty [$($arg:tt)*] => $disposition:ident($why:expr) $(if $asks:ident)?,
    )*) => {
        /// SMG flags outside [`GatewayConfig`], by snake_case name: what pdgate does when one is
        /// given, and why. One table for `launch` (refuse/notice) and YAML (explain an unknown
        /// key).
        pub const SMG_ONLY_FLAGS: &[(&str, Disposition, &str)] =
            &[$((stringify!($field), Disposition::$disposition, $why)),*];

        /// The SMG flags pdgate parses but does not implement.
        #[derive(Clone, Debug, Default, clap::Args)]
        pub struct SmgOnlyFlags {
            $(
                $(#[doc = $doc])*
                #[arg(long, hide = true, $($arg)*)]
                $field: $ty,
            )*
        }

        impl SmgOnlyFlags {
            /// The snake_case names of the flags given on the command line that ask for
            /// something (SMG's "off" values — `--prefill-max-inflight-requests-per-worker -1`,
            /// `--history-backend memory`, `--backend vllm`, … — are not requests).
            pub fn given(&self) -> Vec<&'static str> {
                let mut out = Vec::new();
                $(
                    if smg_only_flags!(@asks self.$field $(, $asks)?) {
                        out.push(stringify!($field));
                    }
                )*
                out
            }
        }
    };
    (@asks $value:expr) => { Given::given(&$value) };
    (@asks $value:expr, $asks:ident) => { $asks(&$value) };
}

smg_only_flags! {
    worker_urls: Vec<String> [num_args = 0..] => Refused("regular (non-PD) workers are SMG's regular mode; pdgate serves only PD: use --prefill/--decode"),
    enable_igw: bool [] => Refused("IGW (multi-model, multi-router) mode is not supported; pdgate is a PD router"),
    router_selector: Vec<String> [num_args = 0..] => Refused("the HA mesh (router pod discovery) is not supported"),
    model_id_from: Option<String> [] => Refused("overriding model ids from pod metadata is not supported; discovered workers report their models"),
    model_alias: Vec<String> [action = clap::ArgAction::Append] => Refused("model aliases are not supported"),
    /// `sglang`, `vllm`, `trtllm` and `tokenspeed` are accepted (the HTTP PD path detects the
    /// runtime per worker); the external providers are refused.
    backend: Option<String> [alias = "runtime", value_parser = ["sglang", "vllm", "trtllm", "tokenspeed", "openai", "anthropic", "gemini"]] => Refused("external-provider backends (openai, anthropic, gemini) are not PD; engine backends are detected per worker") if names_an_external_provider,
    zmq_engine_count: Option<String> [] => Refused("ipc:// (ZMQ) workers cannot be PD legs"),
    log_dir: Option<String> [] => Refused("pdgate logs to stderr (Pingora's `error_log` in daemon mode); capture it with your supervisor"),
    priority_scheduler_enabled: bool [] => Refused("the priority admission scheduler is not supported"),
    priority_scheduler_config: Option<String> [] => Refused("the priority admission scheduler is not supported"),
    tenant_rate_limit_enabled: bool [] => Refused("tenant rate limiting is not supported"),
    tenant_rate_limit_config: Option<String> [] => Refused("tenant rate limiting is not supported"),
    tenant_api_key: Vec<String> [action = clap::ArgAction::Append] => Refused("per-tenant API keys are not supported; use --api-key"),
    trust_tenant_header: bool [] => Refused("tenants are not supported"),
    storage_context_headers: Vec<String> [num_args = 0..] => Refused("storage hooks are not supported"),
    /// `memory` (SMG's default) and `none` are accepted: pdgate stores nothing.
    history_backend: Option<String> [value_parser = ["memory", "none", "oracle", "postgres", "redis"]] => Refused("stored conversation history (oracle, postgres, redis) is not supported; /v1/responses is proxied to the engine") if asks_for_history_storage,
    enable_wasm: bool [] => Refused("WebAssembly plugins are not supported"),
    storage_hook_wasm_path: Option<String> [] => Refused("WebAssembly plugins are not supported"),
    schema_config: Option<String> [] => Refused("history storage is not supported"),
    oracle_wallet_path: Option<String> [] => Refused("history storage is not supported"),
    oracle_tns_alias: Option<String> [] => Refused("history storage is not supported"),
    oracle_dsn: Option<String> [] => Refused("history storage is not supported"),
    oracle_connect_descriptor: Option<String> [] => Refused("history storage is not supported"),
    oracle_user: Option<String> [] => Refused("history storage is not supported"),
    oracle_username: Option<String> [] => Refused("history storage is not supported"),
    oracle_password: Option<String> [] => Refused("history storage is not supported"),
    oracle_external_auth: bool [] => Refused("history storage is not supported"),
    oracle_pool_min: Option<String> [] => Refused("history storage is not supported"),
    oracle_pool_max: Option<String> [] => Refused("history storage is not supported"),
    oracle_pool_timeout_secs: Option<String> [] => Refused("history storage is not supported"),
    postgres_db_url: Option<String> [] => Refused("history storage is not supported"),
    postgres_pool_max_size: Option<String> [] => Refused("history storage is not supported"),
    postgres_pool_max: Option<String> [] => Refused("history storage is not supported"),
    postgres_op_timeout_secs: Option<String> [] => Refused("history storage is not supported"),
    redis_url: Option<String> [] => Refused("history storage is not supported"),
    redis_pool_max_size: Option<String> [] => Refused("history storage is not supported"),
    redis_pool_max: Option<String> [] => Refused("history storage is not supported"),
    redis_retention_days: Option<String> [allow_negative_numbers = true] => Refused("history storage is not supported"),
    redis_op_timeout_secs: Option<String> [] => Refused("history storage is not supported"),
    tls_cert_path: Option<String> [] => Refused("TLS termination is not supported yet; terminate TLS in front of pdgate"),
    tls_key_path: Option<String> [] => Refused("TLS termination is not supported yet; terminate TLS in front of pdgate"),
    client_cert_path: Option<String> [] => Refused("client certificates (mTLS) towards workers are not supported"),
    client_key_path: Option<String> [] => Refused("client certificates (mTLS) towards workers are not supported"),
    ca_cert_paths: Vec<String> [num_args = 0..] => Refused("custom CA certificates for workers' TLS are not supported"),
    jwt_issuer: Option<String> [] => Refused("control-plane JWT/OIDC authentication is not supported; use --api-key and a separate admin listener (admin_port)"),
    jwt_audience: Option<String> [] => Refused("control-plane JWT/OIDC authentication is not supported"),
    jwt_jwks_uri: Option<String> [] => Refused("control-plane JWT/OIDC authentication is not supported"),
    jwt_role_claim: Option<String> [] => Refused("control-plane JWT/OIDC authentication is not supported"),
    jwt_role_mapping: Vec<String> [action = clap::ArgAction::Append] => Refused("control-plane JWT/OIDC authentication is not supported"),
    control_plane_api_keys: Vec<String> [action = clap::ArgAction::Append] => Refused("control-plane API keys are not supported; use --api-key and a separate admin listener (admin_port)"),
    control_plane_audit_enabled: bool [] => Refused("the control-plane audit log is not supported"),
    enable_mesh: bool [] => Refused("the HA mesh is not supported; run independent pdgate replicas"),
    mesh_server_name: Option<String> [] => Refused("the HA mesh is not supported"),
    mesh_host: Option<String> [] => Refused("the HA mesh is not supported"),
    mesh_advertise_host: Option<String> [] => Refused("the HA mesh is not supported"),
    mesh_port: Option<String> [] => Refused("the HA mesh is not supported"),
    mesh_peer_urls: Vec<String> [num_args = 0..] => Refused("the HA mesh is not supported"),
    mesh_tls_ca_cert: Option<String> [] => Refused("the HA mesh is not supported"),
    mesh_tls_cert: Option<String> [] => Refused("the HA mesh is not supported"),
    mesh_tls_key: Option<String> [] => Refused("the HA mesh is not supported"),
    webrtc_bind_addr: Option<String> [] => Refused("WebRTC is not supported"),
    webrtc_stun_server: Option<String> [] => Refused("WebRTC is not supported"),
    mcp_config_path: Option<String> [] => Refused("MCP tools are not supported"),
    enable_rl: bool [] => Refused("the RL control plane (/v1/rl) is not supported"),
    /// A value ≤ 0 is SMG's "no cap" (its default, -1), not a request.
    prefill_max_inflight_requests_per_worker: Option<String> [allow_negative_numbers = true] => Refused("the per-worker prefill in-flight cap (and its admission queue) is not supported; --max-concurrent-requests bounds the gateway as a whole, and worker overload protection skips busy workers") if asks_for_a_cap,
    priority_scheduler_default_max_class: Option<String> [] => Ignored("only used with the priority scheduler"),
    priority_scheduler_tenant_metric_top_n: Option<String> [] => Ignored("only used with the priority scheduler"),
    tenant_header_name: Option<String> [] => Ignored("only used with --trust-tenant-header"),
    rl_control_timeout_secs: Option<String> [] => Ignored("only used with --enable-rl"),
    rl_fanout_concurrency: Option<String> [] => Ignored("only used with --enable-rl"),
    prefill_queue_size: Option<String> [] => Ignored("only used with --prefill-max-inflight-requests-per-worker"),
    prefill_queue_timeout_secs: Option<String> [] => Ignored("only used with --prefill-max-inflight-requests-per-worker"),
    history_memory_max_responses: Option<String> [] => Ignored(NO_MEMORY_HISTORY),
    history_memory_max_items: Option<String> [] => Ignored(NO_MEMORY_HISTORY),
    history_memory_retention_secs: Option<String> [] => Ignored(NO_MEMORY_HISTORY),
    max_background_responses: Option<String> [] => Ignored("pdgate runs no background responses: HTTP engines answer /v1/responses themselves, and the gRPC path refuses `background`"),
    jemalloc_prof_dir: Option<String> [] => Ignored("pdgate has no heap-profile route"),
    disable_audit_logging: bool [] => Ignored("pdgate has no control-plane audit log"),
    job_queue_capacity: Option<String> [] => Ignored("pdgate registers workers without SMG's job queue"),
    job_queue_concurrency: Option<String> [] => Ignored("pdgate registers workers without SMG's job queue"),
    upstream_http2: bool [] => Ignored("pdgate speaks HTTP/1.1 to workers (SMG falls back to it for workers without HTTP/2)"),
    disable_load_monitoring: bool [] => Ignored("pdgate polls loads only when a policy or overload protection needs them"),
    engine_metrics: bool [] => Ignored("engine load gauges come from gRPC load reports"),
    kv_indexer_ttl_secs: Option<String> [] => Ignored("the event-driven KV indexer is gRPC-only"),
    kv_indexer_max_entries: Option<String> [] => Ignored("the event-driven KV indexer is gRPC-only"),
    kv_index: Option<String> [] => Ignored("cache_aware matches prompts against pdgate's own tree; there is no event-driven KV index"),
    selection_policy: Option<String> [] => Ignored("cache_aware has one selection rule (SMG's only selection policy, cache-aware-default)"),
    selection_accounting_ttl_ms: Option<String> [] => Ignored("cache_aware's load is the gateway's own in-flight count, charged at dispatch; there are no bookings to expire"),
    power_of_two_load_metric: Option<String> [] => Ignored("power_of_two always compares least_load's expected-wait score (SMG's default, expected_wait)"),
    bucket_adjust_interval_secs: Option<String> [] => Ignored("the bucket policy rebalances its ranges at SMG's default interval, which is not configurable"),
    worker_warmup_secs: Option<String> [] => Ignored(NO_WARM_UP),
    worker_warmup_share: Option<String> [] => Ignored(NO_WARM_UP),
    worker_warmup_blocks: Option<String> [] => Ignored(NO_WARM_UP),
    worker_warmup_thin_ratio: Option<String> [] => Ignored(NO_WARM_UP),
    worker_warmup_divert_every: Option<String> [] => Ignored(NO_WARM_UP),
    worker_stall_secs: Option<String> [] => Ignored(NO_SILENCE_RULE),
    worker_wedge_secs: Option<String> [] => Ignored(NO_SILENCE_RULE),
    worker_stale_secs: Option<String> [] => Ignored(NO_SILENCE_RULE),
    worker_overload_shed: bool [] => Ignored("pdgate always sheds (503 worker_overload_protection_shed) when every available worker of a leg is overloaded"),
    dp_minimum_tokens_scheduler: bool [] => Ignored("with --dp-aware every DP rank is a worker of its own, chosen by the prefill/decode policy (least_load and power_of_two weigh the ranks' requests in flight); there is no separate per-rank token scheduler"),
    mm_pixel_rdma: bool [] => Refused("the RDMA pixel lane is not supported; tensors travel inline in the gRPC message"),
    mm_pixel_cache_mb: Option<String> [] => Ignored("pdgate keeps no pixel cache: each request's images are preprocessed once, for all its attempts"),
    multimodal_max_inflight_bytes: Option<String> [] => Ignored("pdgate bounds each image (20 MiB fetched, 8192x8192 pixels) and the images per request (--mm-per-request-image-limit), not the bytes in flight across requests"),
    rdma_listen_ip: Option<String> [] => Ignored("only used by the RDMA pixel lane"),
    rdma_slot_ttl_s: Option<String> [] => Ignored("only used by the RDMA pixel lane"),
    log_mm_timing: bool [] => Ignored("pdgate logs no per-request media timing"),
    multimodal_tensor_transport: Option<String> [] => Ignored("HTTP legs carry media as sent; gRPC legs carry tensors inline"),
    multimodal_shm_min_bytes: Option<String> [] => Ignored("HTTP legs carry media as sent; gRPC legs carry tensors inline"),
    max_buffered_request_bytes: Option<String> [] => Ignored("PD requests are always buffered, up to --max-payload-size"),
    stream_body_stall_timeout_secs: Option<String> [] => Ignored("PD request bodies are read whole, bounded by --body-read-timeout-secs"),
    header_read_timeout_secs: Option<String> [] => Ignored("a request head is read under Pingora's fixed keep-alive timeout (per read); the body under --body-read-timeout-secs"),
    idle_connection_timeout_secs: Option<String> [] => Ignored("an idle client connection stays open until the client closes it (SMG's 0)"),
    sse_keepalive_secs: Option<String> [] => Ignored("pdgate sends no SSE keep-alive frames: a stream carries what the engine sends (--stream-idle-timeout-secs bounds its silences)"),
    disable_tokenizer_autoload: bool [] => Ignored("gRPC pipeline only"),
    reasoning_parser: Option<String> [] => Ignored("gRPC pipeline only; HTTP engines parse their own output"),
    tool_call_parser: Option<String> [] => Ignored("gRPC pipeline only; HTTP engines parse their own output"),
    parser: Option<String> [] => Ignored("gRPC pipeline only; HTTP engines parse their own output"),
    tokenizer_cache_l0_max_memory: Option<String> [] => Ignored("the L0 tokenizer cache is bounded by entries (--tokenizer-cache-l0-max-entries), not bytes"),
}

/// `--history-backend`: `memory` (SMG's default) and `none` store nothing, as pdgate.
fn asks_for_history_storage(backend: &Option<String>) -> bool {
    backend
        .as_deref()
        .is_some_and(|b| !matches!(b, "memory" | "none"))
}

/// `--prefill-max-inflight-requests-per-worker`: a value ≤ 0 is SMG's "no cap".
fn asks_for_a_cap(cap: &Option<String>) -> bool {
    cap.as_deref()
        .is_some_and(|v| v.trim().parse::<i64>().map_or(true, |cap| cap > 0))
}

/// `--backend`: an engine runtime is detected per worker; an external provider is refused.
fn names_an_external_provider(backend: &Option<String>) -> bool {
    backend
        .as_deref()
        .is_some_and(|b| matches!(b, "openai" | "anthropic" | "gemini"))
}

/// "Was this flag given?" for the loose types of [`SmgOnlyFlags`].
trait Given {
    fn given(&self) -> bool;
}

impl Given for bool {
    fn given(&self) -> bool {
        *self
    }
}

impl<T> Given for Option<T> {
    fn given(&self) -> bool {
        self.is_some()
    }
}

impl<T> Given for Vec<T> {
    fn given(&self) -> bool {
        !self.is_empty()
    }
}

/// The disposition and reason of an SMG-only flag, by snake_case name.
pub(crate) fn smg_only_flag(name: &str) -> Option<(Disposition, &'static str)> {
    SMG_ONLY_FLAGS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, d, why)| (*d, *why))
}

impl LaunchArgs {
    /// Builds the validated configuration of `pdgate launch`: refuses SMG features pdgate does
    /// not have, turns `--prefill` / `--decode` into startup worker specs (as SMG: role,
    /// bootstrap port, `api_key` = `--api-key`, no labels, `max_connection_attempts` =
    /// 10 × `health_success_threshold`), maps the process flags onto Pingora's `ServerConf`,
    /// and runs [`validate`].
    pub fn into_config(self) -> Result<LoadedConfig, ConfigError> {
        let mut notices = Vec::new();
        let given = self.smg_only.given();
        let refused: Vec<String> = given
            .iter()
            .filter_map(|name| match smg_only_flag(name) {
                Some((Disposition::Refused, why)) => Some(format!("{} ({why})", flag_name(name))),
                _ => None,
            })
            .collect();
        if !refused.is_empty() {
            return Err(ConfigError::unsupported(
                "pdgate launch",
                format!(
                    "pdgate does not support {}; remove the flag(s)",
                    refused.join("; ")
                ),
            ));
        }
        for name in &given {
            if let Some((Disposition::Ignored, why)) = smg_only_flag(name) {
                notices.push(format!(
                    "{} has no effect in pdgate: {why}",
                    flag_name(name)
                ));
            }
        }
        if self.smg_only.backend.is_some() {
            notices.push(
                "--backend has no effect in pdgate: the HTTP PD path detects each worker's runtime"
                    .into(),
            );
        }

        let mut gateway = self.gateway;
        if self.no_remove_unhealthy_workers {
            gateway.remove_unhealthy_workers = Some(false);
        }
        if self.disable_worker_overload_protection {
            gateway.worker_overload_protection = false;
            gateway.worker_overload_waiting_requests = None;
            gateway.worker_overload_token_usage = None;
        }
        if !gateway.workers.is_empty() {
            // `workers` has no flag; only a caller building LaunchArgs by hand could set it.
            return Err(ConfigError::invalid_key(
                "workers",
                "is YAML-only; use --prefill and --decode",
            ));
        }
        let attempts = defaults::STARTUP_WORKER_CONNECTION_ATTEMPTS_PER_SUCCESS
            .saturating_mul(gateway.health_success_threshold);
        let mut launch_workers = Vec::new();
        for arg in self.prefill {
            let mut spec = WorkerSpec::new(arg.url.clone(), WorkerType::Prefill);
            spec.bootstrap_port = arg.bootstrap_port;
            launch_workers.push((format!("--prefill {}", arg.url), spec));
        }
        for url in self.decode {
            launch_workers.push((
                format!("--decode {url}"),
                WorkerSpec::new(url, WorkerType::Decode),
            ));
        }
        for arg in self.encode {
            let mut spec = WorkerSpec::new(arg.url.clone(), WorkerType::Encode);
            spec.bootstrap_port = arg.bootstrap_port;
            launch_workers.push((format!("--encode {}", arg.url), spec));
        }
        for (location, spec) in &mut launch_workers {
            spec.api_key = gateway.api_key.clone();
            spec.max_connection_attempts = attempts;
            validate_startup_worker(spec).map_err(|e| e.within(location))?;
        }
        refuse_duplicate_urls(
            launch_workers
                .iter()
                .map(|(loc, spec)| (loc.as_str(), spec)),
        )?;
        gateway.workers = launch_workers.into_iter().map(|(_, spec)| spec).collect();
        validate(&gateway)?;

        if self.runtime_worker_threads == Some(0) {
            return Err(ConfigError::invalid_key(
                "runtime_worker_threads",
                "is 0; it must be at least 1",
            ));
        }
        let server_conf =
            launch_server_conf(self.runtime_worker_threads, self.shutdown_grace_period_secs);
        Ok(LoadedConfig {
            server_conf,
            gateway,
            source: ConfigSource::Launch,
            file_workers: Vec::new(),
            notices,
        })
    }
}

/// Pingora's settings under `launch`: all CPUs unless `--runtime-worker-threads` (SMG sizes its
/// runtime the same way), and SMG's shutdown grace period as Pingora's grace period (in-flight
/// requests keep running; Pingora then allows its default 5 s for the runtimes to stop).
fn launch_server_conf(threads: Option<usize>, grace_period_secs: u64) -> ServerConf {
    let mut conf = ServerConf {
        version: 1,
        ..ServerConf::default()
    };
    conf.threads = threads
        .or_else(|| std::thread::available_parallelism().ok().map(usize::from))
        .unwrap_or(1);
    conf.grace_period_seconds = Some(grace_period_secs);
    conf
}
