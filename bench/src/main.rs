//! `pdgate-bench`: the load generator behind `bench/run.sh` and `bench/policy.sh`.
//!
//! * `sweep`  — closed-loop load over concurrency × prompt size × streaming, against several
//!   targets in turn (direct to an engine, pdgate, a peer gateway), one JSON line per point and a
//!   markdown table with pdgate's ratios to the others measured in the same run;
//! * `hold`   — thousands of open streams at once: the gateway's RSS per open stream;
//! * `prefix` — a shared-prefix multi-turn workload: the engines' prefix hit rate;
//! * `share`  — a fixed number of requests: the share each engine served (a slow one first);
//! * `policy` — the routing policies' micro-benchmark (`--features policy`);
//! * `write-model` — the gRPC runs' model directory, and the token ids the gRPC mocks emit;
//! * `table`  — a result file's markdown again, or its targets side by side (`pivot`, `ratio`);
//! * `canned-engine` — an SGLang-shaped engine answering from preformatted buffers (a few µs of
//!   CPU per request), so the gateways' share is what the engines' CPU no longer hides;
//! * `floor-proxy` — the least a PD gateway can do per request (splice, both legs, relay the
//!   decode's answer): what the wire alone costs on the machine, beside pdgate.
//!   `--pingora` serves the same inside Pingora's `ProxyHttp` (Pingora's own share).
//!
//! Loopback only, every run bounded in seconds. See bench/README.md.

mod canned;
mod control;
mod floor;
#[cfg(feature = "policy")]
mod floor_pingora;
mod hold;
mod http1;
mod load;
mod one_pass;
mod prefix;
mod procstat;
mod report;
mod share;
mod stats;
mod workload;

use std::fs::OpenOptions;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};

use load::{parse_http_addr, LoadSpec, Target};

#[derive(Parser)]
#[command(
    name = "pdgate-bench",
    about = "Load generator for pdgate benchmarks (loopback)"
)]
struct Cli {
    /// Worker threads of the load generator's runtime.
    #[arg(long, default_value_t = 1, global = true)]
    threads: usize,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Closed-loop load against each target in turn; JSON lines + a markdown table.
    Sweep(SweepArgs),
    /// Hold many streams open at once and report the gateway's memory.
    Hold(HoldArgs),
    /// Shared-prefix multi-turn workload; reports the engines' prefix hit rate.
    Prefix(PrefixArgs),
    /// A fixed number of requests; reports each engine's share (the slow engine first).
    Share(ShareArgs),
    /// Routing-policy micro-benchmark (needs `--features policy`).
    Policy(PolicyArgs),
    /// Re-render the markdown table of a JSON-lines result file.
    Table(TableArgs),
    /// Write the gRPC runs' model directory; print the ids the mocks emit and the EOS id.
    WriteModel(WriteModelArgs),
    /// An SGLang-shaped HTTP/1.1 engine answering from preformatted buffers (one thread).
    CannedEngine(CannedEngineArgs),
    /// Time the gateway's one pass over a request body (parse + shape check + leg splice) alone.
    OnePass(OnePassArgs),
    /// The least a PD gateway can do per request (splice, two legs, relay): a yardstick.
    FloorProxy(FloorProxyArgs),
}

#[derive(Args)]
struct FloorProxyArgs {
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The prefill engine, `IP:PORT`.
    #[arg(long)]
    prefill: SocketAddr,
    /// The prefill's bootstrap port, spliced into every leg.
    #[arg(long, default_value_t = 8998)]
    bootstrap_port: u16,
    /// The decode engine, `IP:PORT`.
    #[arg(long)]
    decode: SocketAddr,
    /// Worker threads (pdgate's benches run `threads: 2`).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Serve it through Pingora's `ProxyHttp` (its HTTP/1 session reads the request and writes
    /// the answer): what Pingora itself costs (needs `--features policy`).
    #[arg(long)]
    pingora: bool,
}

#[derive(Args)]
struct OnePassArgs {
    /// Prompt size of the chat body, bytes.
    #[arg(default_value_t = 262_144)]
    prompt_bytes: usize,
    /// Calls per batch (default: ~50 ms worth).
    iters: Option<u32>,
}

#[derive(Args)]
struct CannedEngineArgs {
    #[arg(long, default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    #[arg(long)]
    port: u16,
    /// Output tokens of every answer: the token events of a streamed one (then one finish +
    /// usage event and `[DONE]`), the words of a non-streamed one. At least 1: a stream of no
    /// tokens measures nothing a client waits for.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    stream_chunks: u32,
    /// The `prompt_tokens` every answer reports (prompts are not tokenized).
    #[arg(long, default_value_t = 170)]
    prompt_tokens: usize,
    #[arg(long, default_value = workload::MODEL)]
    model: String,
    /// Reported in `/get_server_info` and `/v1/loads`.
    #[arg(long, default_value_t = 100_000)]
    max_running_requests: u32,
}

#[derive(Args)]
struct WriteModelArgs {
    /// Created if needed: tokenizer.json, tokenizer_config.json (ChatML), config.json,
    /// generation_config.json.
    dir: PathBuf,
}

#[derive(Args)]
struct TableArgs {
    /// `sweep`, `pivot` (a sweep's targets side by side, medians over rounds), `ratio` (direct,
    /// peer and subject on the 1 KB points: c=64, c=1, streamed c=64), `hold`, `prefix` or
    /// `share`.
    kind: String,
    /// The JSON-lines file written with `--json`.
    file: PathBuf,
    /// `ratio`: the `hold` results whose memory per open stream the table adds.
    #[arg(long)]
    hold: Option<PathBuf>,
    #[command(flatten)]
    roles: RoleArgs,
}

/// Which sweep targets the ratios compare.
#[derive(Args)]
struct RoleArgs {
    /// The gateway under test (its row carries the ratios).
    #[arg(long, default_value = "pdgate")]
    subject: String,
    /// The direct-to-engine target (ratio denominator).
    #[arg(long, default_value = "direct")]
    baseline: String,
    /// The peer gateway target, when there is one.
    #[arg(long)]
    peer: Option<String>,
    /// The `floor-proxy` target, when there is one (`table ratio` gives it a column).
    #[arg(long)]
    floor: Option<String>,
    /// The `floor-proxy --pingora` target, when there is one (a column too).
    #[arg(long)]
    pingora_floor: Option<String>,
}

impl RoleArgs {
    fn roles(&self) -> report::Roles<'_> {
        report::Roles {
            subject: &self.subject,
            baseline: Some(self.baseline.as_str()),
            peer: self.peer.as_deref(),
            floor: self.floor.as_deref(),
            pingora_floor: self.pingora_floor.as_deref(),
        }
    }
}

#[derive(Args)]
struct Output {
    /// Append results to this file as JSON lines.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the markdown table here (default: stdout).
    #[arg(long)]
    markdown: Option<PathBuf>,
}

#[derive(Args)]
struct SweepArgs {
    /// `name=http://IP:PORT[,pid=N]`, in the order they run; `pid` is the gateway process whose
    /// CPU and memory are charged to it.
    #[arg(long = "target", required = true)]
    targets: Vec<String>,
    #[command(flatten)]
    roles: RoleArgs,
    /// Engine processes whose CPU per request is reported: `name=pid`.
    #[arg(long = "watch")]
    watch: Vec<String>,
    /// Mock engine API URLs reset (`POST /mock/reset`) before every point, so their request
    /// records do not pile up.
    #[arg(long = "engine")]
    engines: Vec<String>,
    /// Label of this sweep (e.g. `canned`, `modeled`).
    #[arg(long, default_value = "canned")]
    mode: String,
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    concurrency: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "1024,32768,262144")]
    prompt_bytes: Vec<usize>,
    /// `off`, `on` or both.
    #[arg(long, value_delimiter = ',', default_value = "off,on")]
    stream: Vec<String>,
    #[arg(long, default_value = "/v1/chat/completions")]
    path: String,
    #[arg(long, default_value_t = 16)]
    max_tokens: u32,
    /// Measured seconds per point.
    #[arg(long, default_value_t = 3.0)]
    duration: f64,
    /// Warm-up seconds per point (not measured).
    #[arg(long, default_value_t = 0.5)]
    warmup: f64,
    /// Per-request timeout, seconds.
    #[arg(long, default_value_t = 60.0)]
    timeout: f64,
    /// Make every request's prompt different (its first word carries the connection and
    /// request number), so tokenizer and prefix caches cannot serve a repeat.
    #[arg(long)]
    unique_prompts: bool,
    #[command(flatten)]
    out: Output,
}

#[derive(Args)]
struct HoldArgs {
    /// The gateway (or engine) URL.
    #[arg(long)]
    url: String,
    /// The process whose memory is reported.
    #[arg(long)]
    pid: Option<u32>,
    #[arg(long, default_value = "pdgate")]
    label: String,
    #[arg(long, default_value_t = 10_000)]
    streams: usize,
    /// Streams connecting at once while opening.
    #[arg(long, default_value_t = 256)]
    ramp: usize,
    /// Seconds all streams stay open once they are.
    #[arg(long, default_value_t = 5.0)]
    hold: f64,
    /// Give up opening after this many seconds.
    #[arg(long, default_value_t = 60.0)]
    open_timeout: f64,
    #[arg(long, default_value = "/v1/chat/completions")]
    path: String,
    /// Tokens per stream: with the engine's `--itl-ms`, how long a stream would last.
    #[arg(long, default_value_t = 1000)]
    max_tokens: u32,
    #[arg(long, default_value_t = 1024)]
    prompt_bytes: usize,
    #[command(flatten)]
    out: Output,
}

#[derive(Args)]
struct PrefixArgs {
    #[arg(long)]
    url: String,
    #[arg(long)]
    label: String,
    #[arg(long, default_value_t = 8)]
    systems: usize,
    #[arg(long, default_value_t = 64)]
    conversations: usize,
    #[arg(long, default_value_t = 4)]
    turns: usize,
    #[arg(long, default_value_t = 4096)]
    system_bytes: usize,
    #[arg(long, default_value_t = 1024)]
    turn_bytes: usize,
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Prefill engine API URLs (their request counts show the policy's spread).
    #[arg(long = "engine")]
    engines: Vec<String>,
    #[command(flatten)]
    out: Output,
}

#[derive(Args)]
struct ShareArgs {
    #[arg(long)]
    url: String,
    #[arg(long)]
    label: String,
    #[arg(long, default_value_t = 150)]
    requests: usize,
    #[arg(long, default_value_t = 12)]
    concurrency: usize,
    #[arg(long, default_value = "/v1/chat/completions")]
    path: String,
    /// Tokens per answer: with an engine's `--itl-ms`, how long it takes to answer.
    #[arg(long, default_value_t = 4)]
    max_tokens: u32,
    #[arg(long, default_value_t = 1024)]
    prompt_bytes: usize,
    /// Per-request timeout, seconds.
    #[arg(long, default_value_t = 60.0)]
    timeout: f64,
    /// Engine API URLs whose request counts are compared, the slow one first.
    #[arg(long = "engine", required = true)]
    engines: Vec<String>,
    #[command(flatten)]
    out: Output,
}

#[derive(Args)]
struct PolicyArgs {
    /// Minimum measured time per cell and mode, ms.
    #[arg(long, default_value_t = 200)]
    min_ms: u64,
    #[arg(long, value_delimiter = ',', default_value = "8,128,1024")]
    workers: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "1024,32768,262144")]
    prompt_bytes: Vec<usize>,
    /// Write the markdown table here (default: stdout).
    #[arg(long)]
    markdown: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let threads = cli.threads.max(1);
    // Built only by the subcommands that use it: `canned-engine` runs on one thread of its own.
    let rt = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
            .expect("tokio runtime")
    };
    let result = match cli.command {
        Command::Sweep(a) => rt().block_on(sweep(a)),
        Command::Hold(a) => rt().block_on(hold(a)),
        Command::Prefix(a) => rt().block_on(prefix_run(a)),
        Command::Share(a) => rt().block_on(share_run(a)),
        Command::Policy(a) => policy(a),
        Command::Table(a) => table(a),
        Command::WriteModel(a) => write_model(a),
        Command::CannedEngine(a) => canned::run(canned::CannedSpec {
            addr: SocketAddr::new(a.host, a.port),
            tokens: a.stream_chunks as usize,
            prompt_tokens: a.prompt_tokens,
            model: a.model,
            max_running_requests: a.max_running_requests,
        }),
        Command::OnePass(a) => {
            one_pass::run(a.prompt_bytes, a.iters);
            Ok(())
        }
        Command::FloorProxy(a) => floor_proxy(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pdgate-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn write_out(out: &Output, rows: &[Value], markdown: &str) -> Result<(), String> {
    if let Some(path) = &out.json {
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        for r in rows {
            writeln!(f, "{r}").map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    match &out.markdown {
        Some(path) => {
            std::fs::write(path, markdown).map_err(|e| format!("{}: {e}", path.display()))
        }
        None => {
            print!("{markdown}");
            Ok(())
        }
    }
}

fn addrs(urls: &[String]) -> Result<Vec<SocketAddr>, String> {
    urls.iter().map(|u| parse_http_addr(u)).collect()
}

fn name_pid(s: &str) -> Result<(String, u32), String> {
    let (n, p) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: want name=pid"))?;
    Ok((
        n.to_string(),
        p.parse().map_err(|_| format!("{s:?}: bad pid"))?,
    ))
}

async fn sweep(a: SweepArgs) -> Result<(), String> {
    let targets: Vec<Target> = a
        .targets
        .iter()
        .map(|t| Target::parse(t))
        .collect::<Result<_, _>>()?;
    let watch: Vec<(String, u32)> = a
        .watch
        .iter()
        .map(|w| name_pid(w))
        .collect::<Result<_, _>>()?;
    let engines = addrs(&a.engines)?;
    let mut rows = Vec::new();
    for stream in &a.stream {
        let stream = match stream.as_str() {
            "on" | "yes" | "true" => true,
            "off" | "no" | "false" => false,
            o => return Err(format!("--stream {o:?}: want on or off")),
        };
        for &bytes in &a.prompt_bytes {
            let body = Arc::new(workload::chat_body(bytes, a.max_tokens, stream));
            for &c in &a.concurrency {
                for t in &targets {
                    for e in &engines {
                        control::post(*e, "/mock/reset").await;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let spec = LoadSpec {
                        path: a.path.clone(),
                        body: Arc::clone(&body),
                        stream,
                        concurrency: c,
                        warmup: Duration::from_secs_f64(a.warmup),
                        duration: Duration::from_secs_f64(a.duration),
                        timeout: Duration::from_secs_f64(a.timeout),
                        unique_prompts: a.unique_prompts,
                    };
                    let mut r = load::run(t, &spec, &watch).await;
                    r["mode"] = json!(a.mode);
                    r["max_tokens"] = json!(a.max_tokens);
                    eprintln!(
                        "{} stream={} {}B c={} {:>8}: {} req/s, p50 {} ms, p99 {} ms, gw {} µs/req, engines {} µs/req, errors {} {}",
                        a.mode,
                        stream,
                        bytes,
                        c,
                        t.name,
                        r["rps"],
                        r["p50_ms"],
                        r["p99_ms"],
                        r["gateway_cpu_us_per_req"],
                        r["engines_cpu_us_per_req_total"],
                        r["errors"],
                        if r["errors"].as_u64().unwrap_or(0) > 0 { r["error_samples"].to_string() } else { String::new() },
                    );
                    rows.push(r);
                }
            }
        }
    }
    let md = report::sweep_table(&rows, &a.roles.roles());
    write_out(&a.out, &rows, &md)
}

async fn hold(a: HoldArgs) -> Result<(), String> {
    let spec = hold::HoldSpec {
        addr: parse_http_addr(&a.url)?,
        path: a.path,
        body: workload::chat_body(a.prompt_bytes, a.max_tokens, true),
        streams: a.streams,
        ramp: a.ramp,
        open_timeout: Duration::from_secs_f64(a.open_timeout),
        hold: Duration::from_secs_f64(a.hold),
        pid: a.pid,
        label: a.label,
    };
    let r = hold::run(spec).await;
    eprintln!("hold: {r}");
    let md = hold::table(std::slice::from_ref(&r));
    write_out(&a.out, &[r], &md)
}

async fn prefix_run(a: PrefixArgs) -> Result<(), String> {
    let spec = prefix::PrefixSpec {
        addr: parse_http_addr(&a.url)?,
        label: a.label,
        systems: a.systems.max(1),
        conversations: a.conversations,
        turns: a.turns,
        system_bytes: a.system_bytes,
        turn_bytes: a.turn_bytes,
        concurrency: a.concurrency,
        engines: addrs(&a.engines)?,
    };
    let r = prefix::run(spec).await;
    eprintln!("prefix: {r}");
    let md = prefix::table(std::slice::from_ref(&r));
    write_out(&a.out, &[r], &md)
}

async fn share_run(a: ShareArgs) -> Result<(), String> {
    let spec = share::ShareSpec {
        addr: parse_http_addr(&a.url)?,
        label: a.label,
        path: a.path,
        body: workload::chat_body(a.prompt_bytes, a.max_tokens, false),
        requests: a.requests,
        concurrency: a.concurrency,
        timeout: Duration::from_secs_f64(a.timeout),
        engines: addrs(&a.engines)?,
    };
    let r = share::run(spec).await;
    eprintln!("share: {r}");
    let md = share::table(std::slice::from_ref(&r));
    write_out(&a.out, &[r], &md)
}

fn json_lines(file: &std::path::Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", file.display()))
}

fn table(a: TableArgs) -> Result<(), String> {
    let rows = json_lines(&a.file)?;
    let md = match a.kind.as_str() {
        "sweep" => report::sweep_table(&rows, &a.roles.roles()),
        "pivot" => report::pivot_table(&rows, &a.roles.roles()),
        "ratio" => {
            let holds = match &a.hold {
                Some(h) if h.exists() => json_lines(h)?,
                _ => Vec::new(),
            };
            report::ratio_table(&rows, &holds, &a.roles.roles())
        }
        "hold" => hold::table(&rows),
        "prefix" => prefix::table(&rows),
        "share" => share::table(&rows),
        o => {
            return Err(format!(
                "unknown table kind {o:?} (sweep | pivot | ratio | hold | prefix | share)"
            ))
        }
    };
    print!("{md}");
    Ok(())
}

/// Writes the fixture model directory and prints one line, `OUTPUT_IDS EOS_ID`: the ids of the
/// model's whole lowercase word pieces (what `pdgate demo` has its gRPC engines emit, so the
/// gateway detokenizes text that reads) and `<|im_end|>`, for `mock-engine --output-ids … --eos-ids …`.
fn write_model(a: WriteModelArgs) -> Result<(), String> {
    let (ids, eos) = model_dir(&a.dir)?;
    let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
    println!("{} {eos}", ids.join(","));
    Ok(())
}

fn model_dir(dir: &std::path::Path) -> Result<(Vec<u32>, u32), String> {
    use pdgate_tokenize::fixture;
    fixture::write_model_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let tok =
        pdgate_tokenize::Tokenizer::from_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let ids: Vec<u32> = (256..256 + fixture::MERGES as u32)
        .filter(|&id| {
            tok.decode(&[id], true).is_ok_and(|t| {
                let w = t.trim_start();
                w.len() >= 2 && w.bytes().all(|b| b.is_ascii_lowercase())
            })
        })
        .collect();
    if ids.is_empty() {
        return Err("the fixture model has no whole word pieces".into());
    }
    Ok((ids, fixture::IM_END_ID))
}

fn floor_proxy(a: FloorProxyArgs) -> Result<(), String> {
    let spec = floor::FloorSpec {
        addr: a.listen,
        prefill: a.prefill,
        decode: a.decode,
        bootstrap_port: a.bootstrap_port,
        threads: a.threads,
    };
    if !a.pingora {
        return floor::run(spec);
    }
    #[cfg(feature = "policy")]
    return floor_pingora::run(spec);
    #[cfg(not(feature = "policy"))]
    Err("built without Pingora: cargo build --release -p pdgate-bench --features policy".into())
}

#[cfg(feature = "policy")]
fn policy(a: PolicyArgs) -> Result<(), String> {
    let config = pdgate::policy::BenchConfig {
        workers: a.workers,
        prompt_bytes: a.prompt_bytes,
        min_time: Duration::from_millis(a.min_ms),
        ..Default::default()
    };
    let table = pdgate::policy::bench_report(&config);
    match a.markdown {
        Some(p) => std::fs::write(&p, table).map_err(|e| format!("{}: {e}", p.display())),
        None => {
            print!("{table}");
            Ok(())
        }
    }
}

#[cfg(not(feature = "policy"))]
fn policy(_: PolicyArgs) -> Result<(), String> {
    Err("built without the policy benchmark: cargo run --release -p pdgate-bench --features policy -- policy".into())
}

#[cfg(test)]
mod tests {
    #[test]
    fn model_dir_loads_and_its_word_pieces_decode_to_words() {
        let dir = std::env::temp_dir().join(format!("pdgate-bench-model-{}", std::process::id()));
        let (ids, eos) = super::model_dir(&dir).unwrap();
        assert!(ids.len() >= 16, "{} word pieces", ids.len());
        assert!(!ids.contains(&eos));
        let tok = pdgate_tokenize::Tokenizer::from_dir(&dir).unwrap();
        let text = tok.decode(&ids[..16], true).unwrap();
        assert!(
            text.bytes().all(|b| b == b' ' || b.is_ascii_lowercase()),
            "{text:?}"
        );
        assert_eq!(tok.decode(&[eos], false).unwrap(), "<|im_end|>");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
