//! `mock-engine` binary: one mock engine per process, for the demo and bench scripts.
//! Prints `READY api=http://H:P bootstrap=N ...` once listening (a gRPC engine:
//! `READY api=grpc://H:P control=http://H:C ...`); exits on SIGTERM/SIGINT.

use std::net::IpAddr;
use std::time::Duration;

use clap::Parser;
use mock_engine::{
    Connector, EngineKind, GrpcCode, GrpcOptions, LoadFailurePolicy, MalformedParams, MockEngine,
    MockEngineConfig, MockVision, OutputVocab, Role, Transport,
};

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("bad duration {s:?} (use 2, 2.5s, 500ms)"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("bad duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(v * mult))
}

fn parse_role(s: &str) -> Result<Role, String> {
    match s {
        "prefill" => Ok(Role::Prefill),
        "decode" => Ok(Role::Decode),
        "both" | "regular" | "null" => Ok(Role::Both),
        "encode" => Ok(Role::Encode),
        _ => Err(format!("bad role {s:?} (prefill|decode|both|encode)")),
    }
}

fn parse_engine(s: &str) -> Result<EngineKind, String> {
    match s {
        "sglang" => Ok(EngineKind::Sglang),
        "vllm" => Ok(EngineKind::Vllm),
        "tokenspeed" => Ok(EngineKind::TokenSpeed),
        _ => Err(format!("bad engine {s:?} (sglang|vllm|tokenspeed)")),
    }
}

fn parse_transport(s: &str) -> Result<Transport, String> {
    match s {
        "http" => Ok(Transport::Http),
        "grpc" => Ok(Transport::Grpc),
        _ => Err(format!("bad transport {s:?} (http|grpc)")),
    }
}

fn parse_grpc_code(s: &str) -> Result<GrpcCode, String> {
    GrpcCode::parse(s).ok_or_else(|| format!("bad gRPC code {s:?} (e.g. INTERNAL, UNAVAILABLE)"))
}

/// A list of token ids (one flag value; clap would read a bare `Vec` as repeated values).
#[derive(Clone, Debug)]
struct TokenIds(Vec<u32>);

/// Token ids: `5,6,7`, a half-open range `1000..1200`, or an inclusive one `1000-1199`, mixed
/// with commas.
fn parse_ids(s: &str) -> Result<TokenIds, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let num = |x: &str| {
            x.trim()
                .parse::<u32>()
                .map_err(|_| format!("bad token id {x:?} in {s:?}"))
        };
        if let Some((a, b)) = part.split_once("..") {
            out.extend(num(a)?..num(b)?);
        } else if let Some((a, b)) = part.split_once('-') {
            out.extend(num(a)?..=num(b)?);
        } else {
            out.push(num(part)?);
        }
    }
    if out.is_empty() {
        return Err(format!("no token ids in {s:?}"));
    }
    Ok(TokenIds(out))
}

fn parse_connector(s: &str) -> Result<Connector, String> {
    Connector::parse(s).ok_or_else(|| format!("bad connector {s:?}"))
}

/// Mock SGLang / vLLM / TokenSpeed PD engine (HTTP or gRPC).
#[derive(Parser, Debug)]
#[command(name = "mock-engine", version)]
struct Args {
    #[arg(long, default_value = "both", value_parser = parse_role)]
    role: Role,
    /// sglang | vllm | tokenspeed (gRPC only).
    #[arg(long, default_value = "sglang", value_parser = parse_engine)]
    engine: EngineKind,
    /// http | grpc (default: http; grpc for tokenspeed). gRPC serves the engine's servicer on
    /// --port and the /mock/* control plane on --control-port.
    #[arg(long, value_parser = parse_transport)]
    transport: Option<Transport>,
    /// gRPC: the control-plane HTTP port (0 = ephemeral).
    #[arg(long, default_value_t = 0)]
    control_port: u16,
    /// gRPC: send Generate's response headers at once (default: with the first message, as
    /// Python grpc.aio servicers do).
    #[arg(long)]
    grpc_headers_at_once: bool,
    /// gRPC SGLang: accept string stops and min_new_tokens (a servicer with a tokenizer; the
    /// default refuses them, as skip_tokenizer_init workers do).
    #[arg(long)]
    no_skip_tokenizer_init: bool,
    /// gRPC SGLang/TokenSpeed: the status of a rendezvous that never completed.
    #[arg(long, default_value = "INTERNAL", value_parser = parse_grpc_code)]
    kv_timeout_code: GrpcCode,
    /// Token ids the model emits (`5,6,7`, `1000..1200`, `1000-1199`); default: the built-in
    /// pseudo-words (ids 40000+). Set it to ids the gateway's tokenizer knows.
    #[arg(long, value_parser = parse_ids)]
    output_ids: Option<TokenIds>,
    /// End-of-sequence ids (the first is emitted); default 2.
    #[arg(long, value_parser = parse_ids)]
    eos_ids: Option<TokenIds>,
    /// `tokenizer_path` the info RPCs report.
    #[arg(long)]
    tokenizer_path: Option<String>,
    /// mooncake | nixl | fake | moriio-read | moriio-write | none (default: mooncake for sglang, nixl for vllm).
    #[arg(long, value_parser = parse_connector)]
    connector: Option<Connector>,
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    #[arg(long, default_value_t = 0)]
    port: u16,
    #[arg(long, default_value_t = 8998)]
    bootstrap_port: u16,
    #[arg(long, default_value_t = 8998)]
    default_bootstrap_port: u16,
    #[arg(long)]
    advertise_host: Option<String>,
    /// vLLM NIXL `remote_host` (real default `localhost`; default here: --host).
    #[arg(long)]
    side_channel_host: Option<String>,
    #[arg(long, default_value_t = 0)]
    side_channel_port: u16,
    #[arg(long, default_value_t = 0)]
    notify_port: u16,
    #[arg(long)]
    engine_id: Option<String>,
    #[arg(long, default_value = "mock-model")]
    model: String,
    #[arg(long, default_value_t = 1)]
    dp_size: u32,
    #[arg(long, default_value_t = 1)]
    tp_size: u32,
    #[arg(long, default_value_t = 1)]
    page_size: u32,
    #[arg(long, default_value = "auto")]
    kv_cache_dtype: String,
    #[arg(long, default_value_t = 256)]
    max_running_requests: u32,
    #[arg(long, default_value_t = 32768)]
    max_model_len: u32,
    #[arg(long, default_value_t = 16)]
    block_size: u32,
    #[arg(long, default_value = "follow_bootstrap_room")]
    load_balance_method: String,
    #[arg(long, default_value = "300s", value_parser = parse_duration)]
    bootstrap_timeout: Duration,
    #[arg(long, default_value = "300s", value_parser = parse_duration)]
    waiting_timeout: Duration,
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    heartbeat_interval: Duration,
    #[arg(long, default_value_t = 2)]
    heartbeat_max_failure: u32,
    #[arg(long, default_value_t = 15)]
    ensure_retries: u32,
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    ensure_retry_interval: Duration,
    #[arg(long, default_value = "480s", value_parser = parse_duration)]
    abort_request_timeout: Duration,
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    p_ready_timeout: Duration,
    /// MoRI WRITE decode wait for the push (default: forever, as vLLM).
    #[arg(long, value_parser = parse_duration)]
    moriio_write_wait: Option<Duration>,
    /// fail | recompute
    #[arg(long, default_value = "fail")]
    kv_load_failure_policy: String,
    /// error500 | crash
    #[arg(long, default_value = "error500")]
    malformed_params: String,
    /// Legacy vLLM profile: no `<id>-<8hex>` internal request ids, flat `remote_block_ids`.
    #[arg(long)]
    legacy: bool,
    #[arg(long, default_value_t = 5)]
    ttft_ms: u64,
    #[arg(long, default_value_t = 1)]
    itl_ms: u64,
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    #[arg(long, default_value_t = 0)]
    natural_stop_every: u64,
    #[arg(long)]
    incremental_streaming_output: bool,
    #[arg(long)]
    no_prefix_cache: bool,
    /// A decode runs at most `--max-running-requests` at once (the others wait with their KV).
    #[arg(long)]
    enforce_running_window: bool,
    /// `/get_server_info` reports no `max_running_requests`.
    #[arg(long)]
    no_report_running_window: bool,
    /// vLLM: report `usage.prompt_tokens_details.cached_tokens` (vLLM's flag of the same name).
    #[arg(long)]
    enable_prompt_tokens_details: bool,
    /// gRPC: a fake vision tower with this pixel layout: chw (CLIP/LLaVA) | qwen (patches,
    /// temporal patch 2, patch 14). Off: a text model.
    #[arg(long)]
    vision: Option<String>,
    /// The vision tower's image placeholder token id.
    #[arg(long, default_value_t = 151_655)]
    image_token_id: u32,
    /// vLLM worker-side processing backend (`inprocess`): accept `media_refs`.
    #[arg(long)]
    mm_processor: Option<String>,
    /// vLLM worker-side processing: placeholder tokens one image expands to.
    #[arg(long, default_value_t = 4)]
    worker_tokens_per_image: u32,
    /// vLLM `--language-model-only`: a decode without a vision tower.
    #[arg(long)]
    language_model_only: bool,
}

fn config(a: Args) -> Result<MockEngineConfig, String> {
    let connector = a.connector.unwrap_or(match a.engine {
        EngineKind::Sglang | EngineKind::TokenSpeed => Connector::Mooncake,
        EngineKind::Vllm => Connector::Nixl,
    });
    let transport = a.transport.unwrap_or(match a.engine {
        EngineKind::TokenSpeed => Transport::Grpc,
        _ => Transport::Http,
    });
    let eos = a.eos_ids.clone().map_or_else(|| vec![2], |t| t.0);
    let output_vocab = match a.output_ids.clone() {
        Some(ids) => OutputVocab::ids(ids.0, eos),
        None if a.eos_ids.is_some() => {
            return Err("--eos-ids needs --output-ids (the pseudo-words end on 2)".into())
        }
        None => OutputVocab::pseudo_words(),
    };
    Ok(MockEngineConfig {
        role: a.role,
        engine: a.engine,
        transport,
        grpc: GrpcOptions {
            headers_at_once: a.grpc_headers_at_once,
            control_port: a.control_port,
            skip_tokenizer_init: !a.no_skip_tokenizer_init,
            kv_timeout_code: a.kv_timeout_code,
        },
        output_vocab,
        tokenizer_path: a.tokenizer_path,
        connector,
        bind_ip: a.host,
        port: a.port,
        bootstrap_port: a.bootstrap_port,
        default_bootstrap_port: a.default_bootstrap_port,
        advertise_host: a.advertise_host,
        side_channel_host: a.side_channel_host,
        side_channel_port: a.side_channel_port,
        notify_port: a.notify_port,
        engine_id: a.engine_id,
        model: a.model,
        dp_size: a.dp_size,
        tp_size: a.tp_size,
        page_size: a.page_size,
        kv_cache_dtype: a.kv_cache_dtype,
        max_running_requests: a.max_running_requests,
        max_model_len: a.max_model_len,
        block_size: a.block_size,
        load_balance_method: a.load_balance_method,
        bootstrap_timeout: a.bootstrap_timeout,
        waiting_timeout: a.waiting_timeout,
        heartbeat_interval: a.heartbeat_interval,
        heartbeat_max_failure: a.heartbeat_max_failure,
        ensure_retries: a.ensure_retries,
        ensure_retry_interval: a.ensure_retry_interval,
        abort_request_timeout: a.abort_request_timeout,
        p_ready_timeout: a.p_ready_timeout,
        moriio_write_wait: a.moriio_write_wait,
        kv_load_failure_policy: match a.kv_load_failure_policy.as_str() {
            "fail" => LoadFailurePolicy::Fail,
            "recompute" => LoadFailurePolicy::Recompute,
            o => return Err(format!("bad --kv-load-failure-policy {o:?}")),
        },
        malformed_params: match a.malformed_params.as_str() {
            "error500" => MalformedParams::Error500,
            "crash" => MalformedParams::Crash,
            o => return Err(format!("bad --malformed-params {o:?}")),
        },
        request_id_suffix: !a.legacy,
        grouped_block_ids: !a.legacy,
        ttft_ms: a.ttft_ms,
        itl_ms: a.itl_ms,
        time_scale: a.time_scale,
        natural_stop_every: a.natural_stop_every,
        incremental_streaming_output: a.incremental_streaming_output,
        prefix_cache: !a.no_prefix_cache,
        enforce_running_window: a.enforce_running_window,
        report_running_window: !a.no_report_running_window,
        vision: match a.vision.as_deref() {
            None => None,
            Some(layout) => {
                let v = match layout {
                    "chw" => MockVision::chw(a.image_token_id),
                    "qwen" => MockVision::qwen(a.image_token_id),
                    other => return Err(format!("bad --vision {other:?} (chw|qwen)")),
                };
                let v = match &a.mm_processor {
                    Some(p) => v.with_worker_processing(p, a.worker_tokens_per_image),
                    None => v,
                };
                Some(if a.language_model_only {
                    v.language_model_only()
                } else {
                    v
                })
            }
        },
        prompt_tokens_details: a.enable_prompt_tokens_details,
        ..MockEngineConfig::default()
    })
}

#[tokio::main]
async fn main() {
    let cfg = match config(Args::parse()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mock-engine: {e}");
            std::process::exit(2);
        }
    };
    let engine = match MockEngine::spawn(cfg).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("mock-engine: cannot start: {e}");
            std::process::exit(1);
        }
    };
    let boot = engine
        .bootstrap_port()
        .map_or_else(|| "none".to_string(), |p| p.to_string());
    let mut line = match engine.grpc_url() {
        Some(url) => format!(
            "READY api={url} control={} bootstrap={boot}",
            engine.control_url()
        ),
        None => format!("READY api={} bootstrap={boot}", engine.api_url()),
    };
    if let Some(p) = engine.side_channel_port() {
        line.push_str(&format!(" side_channel={p}"));
    }
    if let Some(p) = engine.notify_port() {
        line.push_str(&format!(" notify={p}"));
    }
    line.push_str(&format!(" engine_id={}", engine.engine_id()));
    println!("{line}");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    engine.shutdown().await;
}
