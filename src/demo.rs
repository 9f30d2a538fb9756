//! `pdgate demo`: the whole product in one command, on loopback. Starts a mock SGLang prefill
//! and decode (and a single-worker reference engine) from the `mock-engine` binary next to this
//! one, starts the gateway from the embedded `conf/demo.yaml`, sends streamed and non-streamed
//! requests, and prints the evidence of the handoff: the same room on both legs, the decode's KV
//! fetched from the prefill it was paired with, and PD text equal to the reference text.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use pdgate_filters::framing::{BodyDecoder, Framing};
use serde_json::{json, Value};

/// The demo's configuration, compiled in so `pdgate demo` runs from anywhere.
pub const DEMO_CONF: &str = include_str!("../conf/demo.yaml");
/// The gRPC half's configuration.
pub const DEMO_GRPC_CONF: &str = include_str!("../conf/demo-grpc.yaml");

/// gRPC engines: (host, api port, control port, bootstrap port).
const GRPC_PREFILL: (&str, u16, u16, u16) = ("127.0.0.1", 31011, 31021, 31911);
const GRPC_DECODE: (&str, u16, u16) = ("127.0.0.1", 31012, 31022);
const GRPC_REFERENCE: (&str, u16, u16) = ("127.0.0.1", 31013, 31023);
const GRPC_GATEWAY: (&str, u16) = ("127.0.0.1", 30001);
/// Where the demo writes its model directory (conf/demo-grpc.yaml's `model_path`).
const GRPC_MODEL_DIR: &str = "/tmp/pdgate-demo-model";

const PREFILL: (&str, u16, u16) = ("127.0.0.1", 31001, 31901);
const DECODE: (&str, u16) = ("127.0.0.1", 31002);
const REFERENCE: (&str, u16) = ("127.0.0.1", 31003);
const GATEWAY: (&str, u16) = ("127.0.0.1", 30000);

#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Leave everything running after the requests (Ctrl-C to stop).
    #[arg(long)]
    pub keep_running: bool,
}

/// Child processes, killed on drop whatever way the demo ends.
struct Children(Vec<(String, Child)>);

impl Drop for Children {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn run(args: DemoArgs) -> ExitCode {
    match demo(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pdgate demo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn demo(args: DemoArgs) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = exe
        .parent()
        .ok_or("cannot locate the executable's directory")?;
    let mock = dir.join("mock-engine");
    if !mock.exists() {
        return Err(format!(
            "{} not found; build it first: cargo build --release -p pdgate -p mock-engine --bins",
            mock.display()
        ));
    }
    for (host, port) in [
        (PREFILL.0, PREFILL.1),
        (PREFILL.0, PREFILL.2),
        DECODE,
        REFERENCE,
        GATEWAY,
        ("127.0.0.1", 29000),
        (GRPC_PREFILL.0, GRPC_PREFILL.1),
        (GRPC_PREFILL.0, GRPC_PREFILL.2),
        (GRPC_PREFILL.0, GRPC_PREFILL.3),
        (GRPC_DECODE.0, GRPC_DECODE.1),
        (GRPC_DECODE.0, GRPC_DECODE.2),
        (GRPC_REFERENCE.0, GRPC_REFERENCE.1),
        (GRPC_REFERENCE.0, GRPC_REFERENCE.2),
        GRPC_GATEWAY,
        ("127.0.0.1", 29001),
    ] {
        if TcpStream::connect((host, port)).is_ok() {
            return Err(format!(
                "port {host}:{port} is in use; the demo needs it free"
            ));
        }
    }

    let mut children = Children(Vec::new());
    let port = |p: u16| p.to_string();
    spawn_mock(
        &mut children,
        &mock,
        "prefill",
        &[
            "--role",
            "prefill",
            "--port",
            &port(PREFILL.1),
            "--bootstrap-port",
            &port(PREFILL.2),
        ],
    )?;
    spawn_mock(
        &mut children,
        &mock,
        "decode",
        &["--role", "decode", "--port", &port(DECODE.1)],
    )?;
    spawn_mock(
        &mut children,
        &mock,
        "reference",
        &["--role", "both", "--port", &port(REFERENCE.1)],
    )?;

    let conf = std::env::temp_dir().join(format!("pdgate-demo-{}.yaml", std::process::id()));
    std::fs::write(&conf, DEMO_CONF).map_err(|e| format!("writing {}: {e}", conf.display()))?;
    let gateway = Command::new(&exe)
        .arg("run")
        .arg("-c")
        .arg(&conf)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn,pdgate::access=info".into()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("starting the gateway: {e}"))?;
    children.0.push(("gateway".into(), gateway));
    wait_ready(Duration::from_secs(20))?;

    println!("pdgate demo — SGLang prefill/decode disaggregation over HTTP, on loopback");
    println!(
        "  prefill  http://{}:{}  (bootstrap server :{})",
        PREFILL.0, PREFILL.1, PREFILL.2
    );
    println!("  decode   http://{}:{}", DECODE.0, DECODE.1);
    println!(
        "  gateway  http://{}:{}  (config: conf/demo.yaml, embedded)",
        GATEWAY.0, GATEWAY.1
    );
    println!(
        "  reference single worker http://{}:{} (not behind the gateway)\n",
        REFERENCE.0, REFERENCE.1
    );

    let cases = [
        (
            "/v1/chat/completions",
            json!({"model": "mock-model", "messages": [{"role": "user", "content": "Why split prefill from decode?"}], "max_tokens": 12}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "mock-model", "messages": [{"role": "user", "content": "Stream me an answer"}], "max_tokens": 12, "stream": true}),
        ),
        (
            "/generate",
            json!({"text": "The capital of France is", "sampling_params": {"max_new_tokens": 8}, "return_logprob": true}),
        ),
    ];
    let mut all_ok = true;
    for (i, (path, body)) in cases.iter().enumerate() {
        all_ok &= show_case(i + 1, path, body)?;
    }
    all_ok &= grpc_demo(&exe, &mock, &mut children, cases.len() + 1)?;
    println!(
        "{}",
        if all_ok {
            "Handoff verified: every request used one room on both legs, and PD output = single-worker output."
        } else {
            "Some check FAILED (see above)."
        }
    );
    if args.keep_running {
        println!("\nEverything keeps running; try: curl -s http://127.0.0.1:30000/v1/chat/completions -d '{{\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'");
        println!("Ctrl-C to stop.");
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    let _ = std::fs::remove_file(&conf);
    if all_ok {
        Ok(())
    } else {
        Err("the handoff evidence did not check out".into())
    }
}

fn spawn_mock(
    children: &mut Children,
    mock: &Path,
    name: &str,
    args: &[&str],
) -> Result<(), String> {
    let mut child = Command::new(mock)
        .args(["--engine", "sglang", "--host", "127.0.0.1"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting the {name} mock engine: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    children.0.push((name.into(), child));
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| format!("{name} mock engine: {e}"))?;
    if !line.starts_with("READY") {
        return Err(format!("{name} mock engine did not start: {line}"));
    }
    Ok(())
}

fn wait_ready(deadline: Duration) -> Result<(), String> {
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if let Ok((200, _, _)) = http(GATEWAY, "GET", "/readiness", None) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err("the gateway did not become ready within 20 s".into())
}

/// Runs one request through the gateway and prints what each engine saw.
fn show_case(n: usize, path: &str, body: &Value) -> Result<bool, String> {
    let stream = body["stream"].as_bool().unwrap_or(false);
    println!(
        "[{n}] POST {path}{}",
        if stream { "  (streamed)" } else { "" }
    );
    let (status, headers, pd_body) = http(GATEWAY, "POST", path, Some(body))?;
    let pd_text = generated_text(path, &pd_body, stream);
    println!(
        "    gateway answered {status} ({}), text: {pd_text:?}",
        header(&headers, "content-type")
    );

    let prefill = last_record((PREFILL.0, PREFILL.1), path)?;
    let decode = last_record(DECODE, path)?;
    let p_room = &prefill["body"]["bootstrap_room"];
    let d_room = &decode["body"]["bootstrap_room"];
    println!(
        "    prefill leg: bootstrap_host={} bootstrap_port={} bootstrap_room={p_room}",
        prefill["body"]["bootstrap_host"], prefill["body"]["bootstrap_port"]
    );
    println!(
        "    decode  leg: bootstrap_room={d_room}; decode fetched the KV from {} (kv_source={})",
        decode["handoff"]["peer_addr"], decode["handoff"]["kv_source"]
    );
    let (_, _, ref_body) = http(REFERENCE, "POST", path, Some(body))?;
    let ref_text = generated_text(path, &ref_body, stream);
    let same_room = p_room.is_u64() && p_room == d_room;
    let same_text = !pd_text.is_empty() && pd_text == ref_text;
    println!(
        "    same room on both legs: {}   PD text == reference text: {}\n",
        yes_no(same_room),
        yes_no(same_text)
    );
    Ok(status == 200 && same_room && same_text)
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "NO"
    }
}

fn last_record(engine: (&str, u16), path: &str) -> Result<Value, String> {
    let (_, _, body) = http(engine, "GET", "/mock/requests", None)?;
    let all: Value = serde_json::from_slice(&body).map_err(|e| format!("/mock/requests: {e}"))?;
    let list = all.get("requests").unwrap_or(&all);
    list.as_array()
        .and_then(|l| l.iter().rev().find(|r| r["path"] == path))
        .cloned()
        .ok_or_else(|| format!("the engine on :{} recorded no {path} request", engine.1))
}

/// The generated text of a chat / generate response, JSON or SSE.
fn generated_text(path: &str, body: &[u8], stream: bool) -> String {
    let pick = |v: &Value| -> String {
        if path == "/generate" {
            v["text"].as_str().unwrap_or_default().to_string()
        } else if stream {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        } else {
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        }
    };
    if !stream {
        return serde_json::from_slice::<Value>(body)
            .map(|v| pick(&v))
            .unwrap_or_default();
    }
    let mut text = String::new();
    for line in String::from_utf8_lossy(body).lines() {
        if let Some(data) = line.strip_prefix("data: ") {
            if let Ok(v) = serde_json::from_str::<Value>(data) {
                if path == "/generate" {
                    text = pick(&v); // SGLang streams cumulative text
                } else {
                    text.push_str(&pick(&v));
                }
            }
        }
    }
    text
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> &'a str {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map_or("", |(_, v)| v.as_str())
}

type HttpResult = Result<(u16, Vec<(String, String)>, Vec<u8>), String>;

/// A minimal blocking HTTP/1.1 client (one request per connection), enough for the demo.
fn http(addr: (&str, u16), method: &str, path: &str, body: Option<&Value>) -> HttpResult {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("{}:{}: {e}", addr.0, addr.1))?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{payload}",
        addr.0,
        addr.1,
        payload.len()
    );
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("malformed response")?;
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or("malformed status line")?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let rest = &raw[split + 4..];
    let body = if header(&headers, "transfer-encoding").eq_ignore_ascii_case("chunked") {
        let mut decoder = BodyDecoder::new(Framing::Chunked);
        decoder
            .decode(&mut BytesMut::from(rest))
            .map_err(|e| format!("chunked body: {e}"))?
            .to_vec()
    } else {
        rest.to_vec()
    };
    Ok((status, headers, body))
}

/// Where the demo's config lives in the source tree (for docs and tests).
pub fn demo_conf_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("conf/demo.yaml")
}

/// The gRPC half: SGLang engines over gRPC behind a second gateway that tokenizes with a
/// generated model directory; the PD text is compared with the reference engine's answer to the
/// same token ids, detokenized with the same tokenizer.
fn grpc_demo(
    exe: &Path,
    mock: &Path,
    children: &mut Children,
    first: usize,
) -> Result<bool, String> {
    let model = Path::new(GRPC_MODEL_DIR);
    pdgate_tokenize::fixture::write_model_dir(model)
        .map_err(|e| format!("writing the demo model to {}: {e}", model.display()))?;
    let port = |p: u16| p.to_string();
    let tokenizer = pdgate_tokenize::Tokenizer::from_dir(model)
        .map_err(|e| format!("loading the demo tokenizer: {e}"))?;
    // The engines emit whole ASCII word pieces of the model's vocabulary, so the text reads.
    let vocab = (256..256 + pdgate_tokenize::fixture::MERGES as u32)
        .filter(|&id| {
            tokenizer.decode(&[id], true).is_ok_and(|t| {
                let w = t.trim_start();
                w.len() >= 2 && w.bytes().all(|b| b.is_ascii_lowercase())
            })
        })
        .map(|id| id.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let eos = pdgate_tokenize::fixture::IM_END_ID.to_string();
    let common = [
        "--transport",
        "grpc",
        "--output-ids",
        &vocab,
        "--eos-ids",
        &eos,
    ];
    let engines: [(&str, Vec<String>); 3] = [
        (
            "gRPC prefill",
            vec![
                "--role".into(),
                "prefill".into(),
                "--port".into(),
                port(GRPC_PREFILL.1),
                "--control-port".into(),
                port(GRPC_PREFILL.2),
                "--bootstrap-port".into(),
                port(GRPC_PREFILL.3),
            ],
        ),
        (
            "gRPC decode",
            vec![
                "--role".into(),
                "decode".into(),
                "--port".into(),
                port(GRPC_DECODE.1),
                "--control-port".into(),
                port(GRPC_DECODE.2),
            ],
        ),
        (
            "gRPC reference",
            vec![
                "--role".into(),
                "both".into(),
                "--port".into(),
                port(GRPC_REFERENCE.1),
                "--control-port".into(),
                port(GRPC_REFERENCE.2),
            ],
        ),
    ];
    for (name, args) in &engines {
        let mut all: Vec<&str> = common.to_vec();
        all.extend(args.iter().map(String::as_str));
        spawn_mock(children, mock, name, &all)?;
    }
    let conf = std::env::temp_dir().join(format!("pdgate-demo-grpc-{}.yaml", std::process::id()));
    std::fs::write(&conf, DEMO_GRPC_CONF)
        .map_err(|e| format!("writing {}: {e}", conf.display()))?;
    let gateway = Command::new(exe)
        .arg("run")
        .arg("-c")
        .arg(&conf)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("starting the gRPC gateway: {e}"))?;
    children.0.push(("gRPC gateway".into(), gateway));
    wait_ready_at(GRPC_GATEWAY, Duration::from_secs(20))?;
    println!(
        "pdgate demo — the same over gRPC: SGLang engines take token ids, the gateway tokenizes"
    );
    println!(
        "  prefill  grpc://{}:{}  (bootstrap :{})   decode grpc://{}:{}   gateway http://{}:{}  (conf/demo-grpc.yaml)",
        GRPC_PREFILL.0, GRPC_PREFILL.1, GRPC_PREFILL.3, GRPC_DECODE.0, GRPC_DECODE.1,
        GRPC_GATEWAY.0, GRPC_GATEWAY.1
    );
    println!("  tokenizer and chat template: {GRPC_MODEL_DIR} (a small generated BPE model)\n");
    let mut ok = true;
    for (i, stream) in [false, true].into_iter().enumerate() {
        let messages = json!([{"role": "user", "content": "Why split prefill from decode?"}]);
        let body = json!({"model": "mock-model", "messages": messages, "max_tokens": 12, "stream": stream});
        println!(
            "[{}] POST /v1/chat/completions over gRPC{}",
            first + i,
            if stream { "  (streamed)" } else { "" }
        );
        let (status, _, pd_body) = http(GRPC_GATEWAY, "POST", "/v1/chat/completions", Some(&body))?;
        let pd_text = generated_text("/v1/chat/completions", &pd_body, stream);
        println!("    gateway answered {status}, text: {pd_text:?}");
        let prefill = last_grpc_record(GRPC_PREFILL.2)?;
        let decode = last_grpc_record(GRPC_DECODE.2)?;
        let p_room = &prefill["grpc"]["bootstrap"]["room"];
        let d_room = &decode["grpc"]["bootstrap"]["room"];
        println!(
            "    prefill leg: {} prompt token ids, bootstrap_room={p_room}; decode leg: bootstrap_room={d_room}, KV from {}",
            prefill["grpc"]["input_ids"].as_array().map_or(0, Vec::len),
            decode["handoff"]["peer_addr"]
        );
        let ref_text = grpc_reference(&tokenizer, &messages, 12)?;
        let same_room = p_room.is_number() && p_room == d_room;
        let same_text = !pd_text.is_empty() && pd_text == ref_text;
        println!(
            "    same room on both legs: {}   PD text == reference text: {}\n",
            yes_no(same_room),
            yes_no(same_text)
        );
        ok &= status == 200 && same_room && same_text;
    }
    let _ = std::fs::remove_file(&conf);
    Ok(ok)
}

fn wait_ready_at(addr: (&str, u16), deadline: Duration) -> Result<(), String> {
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if let Ok((200, _, _)) = http(addr, "GET", "/readiness", None) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "the gateway on :{} did not become ready within 20 s",
        addr.1
    ))
}

fn last_grpc_record(control_port: u16) -> Result<Value, String> {
    let (_, _, body) = http(("127.0.0.1", control_port), "GET", "/mock/requests", None)?;
    let all: Value = serde_json::from_slice(&body).map_err(|e| format!("/mock/requests: {e}"))?;
    let list = all.get("requests").unwrap_or(&all);
    list.as_array()
        .and_then(|l| l.iter().rev().find(|r| !r["grpc"].is_null()))
        .cloned()
        .ok_or_else(|| format!("the engine on :{control_port} recorded no Generate call"))
}

/// What the single gRPC reference engine generates for the same chat: the template rendered and
/// tokenized as the gateway does, its `Generate` called directly, the ids detokenized.
fn grpc_reference(
    tok: &pdgate_tokenize::Tokenizer,
    messages: &Value,
    max_tokens: u32,
) -> Result<String, String> {
    use pdgate_proto::sglang;
    let text = tok
        .render_chat(&pdgate_tokenize::ChatInput::conversation(
            messages.as_array().map(Vec::as_slice).unwrap_or(&[]),
        ))
        .map_err(|e| e.to_string())?;
    let ids = tok.encode(&text, false).map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let out: Result<Vec<u32>, String> = rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!(
            "http://{}:{}",
            GRPC_REFERENCE.0, GRPC_REFERENCE.1
        ))
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("the gRPC reference engine: {e}"))?;
        let mut client = sglang::sglang_scheduler_client::SglangSchedulerClient::new(channel);
        let mut stream = client
            .generate(sglang::GenerateRequest {
                request_id: "demo-reference".into(),
                tokenized: Some(sglang::TokenizedInput {
                    original_text: String::new(),
                    input_ids: ids,
                }),
                sampling_params: Some(sglang::SamplingParams {
                    temperature: 1.0,
                    top_p: 1.0,
                    top_k: -1,
                    repetition_penalty: 1.0,
                    max_new_tokens: Some(max_tokens),
                    skip_special_tokens: true,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .map_err(|e| e.message().to_string())?
            .into_inner();
        let mut ids = Vec::new();
        while let Some(m) = stream
            .message()
            .await
            .map_err(|e| e.message().to_string())?
        {
            if let Some(sglang::generate_response::Response::Complete(c)) = m.response {
                ids = c.output_ids;
            }
        }
        Ok(ids)
    });
    let out = out?;
    let eos = tok.eos_token_ids();
    let kept: Vec<u32> = out
        .iter()
        .copied()
        .take_while(|t| !eos.contains(t))
        .collect();
    tok.decode(&kept, true).map_err(|e| e.to_string())
}
