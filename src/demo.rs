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
