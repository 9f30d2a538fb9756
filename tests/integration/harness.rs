//! Test harness: a real `pdgate` process on loopback (stopped on drop), with helpers to talk to
//! it. Readiness is polled with a deadline, never slept for.

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use mock_engine::client::{self, ClientOptions, Response};
use mock_engine::{EngineKind, MockEngine, MockEngineConfig, Role};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// A TCP port on 127.0.0.1 for a gateway listener: free when checked, never handed out twice in
/// this process, and below the kernel's ephemeral range (32768–60999) and the benchmarks'
/// ports (24000 up), so neither an engine binding port 0 nor a second call can take it before
/// the gateway binds it. (Asking the kernel for port 0 and releasing it could hand the same
/// port to the next call: a gateway then found its `port` and `prometheus_port` equal.)
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 12_000;
    const SPAN: u32 = 11_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Runs of the suite (and the processes they leave behind) start at different places.
    let offset = std::process::id() % SPAN;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (FIRST + (offset + n) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {FIRST}..{}", FIRST + SPAN)
}

pub fn pdgate_bin() -> &'static str {
    env!("CARGO_BIN_EXE_pdgate")
}

/// A running gateway process.
pub struct Gateway {
    child: Child,
    pub port: u16,
    pub prometheus_port: u16,
    log: PathBuf,
}

/// Settings every test gateway gets unless the test overrides them (fast probes, short grace).
const TEST_DEFAULTS: &str =
    "  pd_disaggregation: true\n  policy: round_robin\n  worker_startup_check_interval: 1\n  \
                             health_check_interval_secs: 1\n  log_level: info\n";

impl Gateway {
    /// Starts `pdgate run` with `workers` (POST /workers bodies) and extra `gateway:` keys
    /// (`extra` is YAML lines indented by two spaces), and waits until it answers `/health`.
    pub async fn start(workers: &[Value], extra: &str) -> Gateway {
        Gateway::start_with_env(workers, extra, &[]).await
    }

    /// [`Gateway::start`] with extra environment variables for the process (e.g. `RUST_LOG`).
    pub async fn start_with_env(workers: &[Value], extra: &str, env: &[(&str, &str)]) -> Gateway {
        let port = free_port();
        let prometheus_port = free_port();
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gateways");
        std::fs::create_dir_all(&dir).expect("create the test tmp dir");
        let conf = dir.join(format!("pdgate-{port}.yaml"));
        let log = dir.join(format!("pdgate-{port}.log"));
        let dir_s = dir.display();
        let mut yaml = [
            "version: 1".to_string(),
            "threads: 2".into(),
            "grace_period_seconds: 0".into(),
            "graceful_shutdown_timeout_seconds: 1".into(),
            format!("upgrade_sock: {dir_s}/upgrade-{port}.sock"),
            format!("pid_file: {dir_s}/pdgate-{port}.pid"),
            "gateway:".into(),
            "  host: 127.0.0.1".into(),
            format!("  port: {port}"),
            "  prometheus_host: 127.0.0.1".into(),
            format!("  prometheus_port: {prometheus_port}"),
            String::new(),
        ]
        .join("\n");
        // Test defaults first; a key in `extra` replaces its default.
        for line in TEST_DEFAULTS.lines() {
            let key = line.trim().split(':').next().unwrap_or("");
            if !extra
                .lines()
                .any(|l| l.trim().starts_with(&format!("{key}:")))
            {
                yaml.push_str(line);
                yaml.push('\n');
            }
        }
        yaml.push_str(extra);
        if !yaml.ends_with('\n') {
            yaml.push('\n');
        }
        if !workers.is_empty() {
            yaml.push_str("  workers:\n");
            for w in workers {
                // JSON is YAML: one flow mapping per worker.
                yaml.push_str(&format!("    - {w}\n"));
            }
        }
        std::fs::write(&conf, yaml).expect("write the test config");
        let mut gw = Gateway::spawn_with_env(&conf, port, prometheus_port, log, &[], env);
        gw.wait_http("/health", Duration::from_secs(20)).await;
        gw.wait_metrics(Duration::from_secs(20)).await;
        gw
    }

    /// Starts `pdgate launch` with SMG-style `args` (this adds the listener flags and a short
    /// grace period) and waits until it answers `/health` and `/metrics`.
    pub async fn launch(args: &[&str]) -> Gateway {
        let (port, prometheus_port) = (free_port(), free_port());
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gateways");
        std::fs::create_dir_all(&dir).expect("create the test tmp dir");
        let log = dir.join(format!("pdgate-launch-{port}.log"));
        let out = std::fs::File::create(&log).expect("create the gateway log");
        let err = out.try_clone().expect("clone the log handle");
        let (port_s, prom_s) = (port.to_string(), prometheus_port.to_string());
        let child = Command::new(pdgate_bin())
            .arg("launch")
            .arg(if args.contains(&"--epd-disaggregation") {
                "--epd-disaggregation"
            } else {
                "--pd-disaggregation"
            })
            .args(["--host", "127.0.0.1"])
            .args(["--port", &port_s, "--prometheus-host", "127.0.0.1"])
            .args(["--prometheus-port", &prom_s])
            .args(["--worker-startup-check-interval", "1"])
            .args(["--shutdown-grace-period-secs", "0"])
            .args(args)
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("start pdgate launch");
        let mut gw = Gateway {
            child,
            port,
            prometheus_port,
            log,
        };
        gw.wait_http("/health", Duration::from_secs(20)).await;
        gw.wait_metrics(Duration::from_secs(20)).await;
        gw
    }

    /// Spawns `pdgate run -c conf` (for tests that write their own config).
    pub fn spawn(conf: &std::path::Path, port: u16, prometheus_port: u16, log: PathBuf) -> Gateway {
        Gateway::spawn_with(conf, port, prometheus_port, log, &[])
    }

    /// [`Gateway::spawn`] with extra `pdgate run` arguments (e.g. `-u` for a graceful upgrade).
    pub fn spawn_with(
        conf: &std::path::Path,
        port: u16,
        prometheus_port: u16,
        log: PathBuf,
        args: &[&str],
    ) -> Gateway {
        Gateway::spawn_with_env(conf, port, prometheus_port, log, args, &[])
    }

    /// [`Gateway::spawn_with`] plus environment variables for the process.
    pub fn spawn_with_env(
        conf: &std::path::Path,
        port: u16,
        prometheus_port: u16,
        log: PathBuf,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Gateway {
        let out = std::fs::File::create(&log).expect("create the gateway log");
        let err = out.try_clone().expect("clone the log handle");
        let child = Command::new(pdgate_bin())
            .args(["run", "-c"])
            .arg(conf)
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("start pdgate");
        Gateway {
            child,
            port,
            prometheus_port,
            log,
        }
    }

    /// Sends a signal (`HUP`, `QUIT`, `TERM`, …) to the gateway process.
    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{name} failed");
    }

    /// Waits for the process to exit by itself; its status, or `None` after `deadline`.
    pub async fn wait_exit(&mut self, deadline: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + deadline;
        while Instant::now() < end {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// The gateway's process id (e.g. to read its memory from `/proc/<pid>/status`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    /// The gateway's log so far (for assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn wait_http(&mut self, path: &str, deadline: Duration) {
        let end = Instant::now() + deadline;
        while Instant::now() < end {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "pdgate exited ({status}) before answering {path}\n{}",
                    self.log()
                );
            }
            if let Ok(r) = client::get(&self.url(path)).await {
                if r.status == 200 {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!(
            "gateway did not answer {path} 200 within {deadline:?}\n{}",
            self.log()
        );
    }

    /// Waits until the Prometheus listener answers (it starts as its own service).
    async fn wait_metrics(&self, deadline: Duration) {
        let url = format!("http://127.0.0.1:{}/metrics", self.prometheus_port);
        let end = Instant::now() + deadline;
        while Instant::now() < end {
            if matches!(client::get(&url).await, Ok(r) if r.status == 200) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the Prometheus listener never answered\n{}", self.log());
    }

    /// Waits until `/readiness` is 200 (a healthy prefill and decode).
    pub async fn wait_ready(&mut self) {
        self.wait_http("/readiness", Duration::from_secs(20)).await;
    }

    pub async fn post(&self, path: &str, body: &Value) -> Response {
        client::post_json(&self.url(path), body)
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}\n{}", self.log()))
    }

    pub async fn get(&self, path: &str) -> Response {
        client::get(&self.url(path))
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}\n{}", self.log()))
    }

    /// The Prometheus exposition.
    pub async fn metrics(&self) -> String {
        client::get(&format!(
            "http://127.0.0.1:{}/metrics",
            self.prometheus_port
        ))
        .await
        .expect("scrape /metrics")
        .text()
    }

    /// Scrapes until `ready` holds on the exposition (or a deadline passes) and returns it.
    pub async fn metrics_when(&self, ready: impl Fn(&str) -> bool) -> String {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let m = self.metrics().await;
            if ready(&m) || Instant::now() > end {
                return m;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// POSTs `body` to `path` as a client that gives up after `patience` (its connection
    /// closes); `Err` when it gave up before the answer.
    pub async fn post_and_give_up(
        &self,
        path: &str,
        body: &Value,
        patience: Duration,
    ) -> std::io::Result<Response> {
        let opts = ClientOptions {
            source_ip: None,
            timeout: Some(patience),
        };
        client::request_with(
            &opts,
            "POST",
            &self.url(path),
            &[("content-type", "application/json")],
            Some(Bytes::from(body.to_string())),
        )
        .await
    }

    /// Waits until an access line says a client left (`client_gone=true`): the gateway has seen
    /// it go, and ended that request.
    pub async fn saw_a_client_leave(&self) {
        let seen = mock_engine::wait_until(Duration::from_secs(10), || {
            self.log()
                .lines()
                .any(|l| l.contains("pdgate::access") && l.contains("client_gone=true"))
        })
        .await;
        assert!(
            seen,
            "the gateway never saw the client leave\n{}",
            self.log()
        );
    }

    /// Opens a streaming request (the connection closes when the result is dropped).
    pub async fn stream(&self, path: &str, body: &Value) -> client::StreamingResponse {
        client::stream(
            &ClientOptions::default(),
            "POST",
            &self.url(path),
            &[("content-type", "application/json")],
            Some(Bytes::from(body.to_string())),
        )
        .await
        .unwrap_or_else(|e| panic!("stream {path}: {e}\n{}", self.log()))
    }
}

/// A process started by a test, stopped when the test ends — also when an assertion failed (a
/// gateway left running would hold its ports and the test runner's output pipe).
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of one sample in a Prometheus exposition whose name and labels all match.
pub fn metric_value(exposition: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.starts_with(name)
                && l[name.len()..].starts_with(['{', ' '])
                && labels
                    .iter()
                    .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .next()
}

/// An SGLang prefill/decode pair plus a single-worker reference engine, on distinct loopback IPs.
pub struct SglangFleet {
    pub prefill: MockEngine,
    pub decode: MockEngine,
    pub reference: MockEngine,
}

impl SglangFleet {
    pub async fn start(tweak: impl Fn(&mut MockEngineConfig)) -> SglangFleet {
        let spawn = |role, ip: [u8; 4]| {
            let mut cfg = MockEngineConfig::test(EngineKind::Sglang, role, ip);
            tweak(&mut cfg);
            MockEngine::spawn(cfg)
        };
        SglangFleet {
            prefill: spawn(Role::Prefill, [127, 0, 0, 2])
                .await
                .expect("prefill mock"),
            decode: spawn(Role::Decode, [127, 0, 0, 3])
                .await
                .expect("decode mock"),
            reference: spawn(Role::Both, [127, 0, 0, 4])
                .await
                .expect("reference mock"),
        }
    }

    pub fn workers(&self) -> Vec<Value> {
        vec![self.prefill.worker_spec(), self.decode.worker_spec()]
    }

    /// The reference engine's answer to the same request (a regular, non-PD worker).
    pub async fn reference(&self, path: &str, body: &Value) -> Response {
        client::post_json(&format!("{}{}", self.reference.api_url(), path), body)
            .await
            .expect("reference request")
    }
}

/// A gateway serving `fleet`, ready.
pub async fn gateway_for(fleet: &SglangFleet, extra: &str) -> Gateway {
    let mut gw = Gateway::start(&fleet.workers(), extra).await;
    gw.wait_ready().await;
    gw
}

/// POSTs raw body bytes with a JSON content type.
pub async fn post_raw(gw: &Gateway, path: &str, body: &[u8]) -> Response {
    client::request(
        "POST",
        &gw.url(path),
        &[("content-type", "application/json")],
        Some(Bytes::copy_from_slice(body)),
    )
    .await
    .unwrap_or_else(|e| panic!("POST {path}: {e}\n{}", gw.log()))
}

/// The gateway's error code in an error body (`error.code`).
pub fn error_code(r: &Response) -> String {
    r.json()["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Neither engine of `fleet` received any model request.
pub fn assert_no_engine_contacted(fleet: &SglangFleet, case: &str) {
    let (p, d) = (fleet.prefill.records(), fleet.decode.records());
    assert!(
        p.is_empty() && d.is_empty(),
        "{case}: an engine was contacted: prefill {:?}, decode {:?}",
        p.iter().map(|r| &r.body).collect::<Vec<_>>(),
        d.iter().map(|r| &r.body).collect::<Vec<_>>()
    );
}

/// One request: method, path and its `Content-Length` body.
pub async fn read_request(conn: &mut TcpStream) -> Option<(String, String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut first = head.lines().next()?.split(' ');
    let (method, path) = (first.next()?.to_string(), first.next()?.to_string());
    let len = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = buf[end + 4..].to_vec();
    while body.len() < len {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some((method, path, body))
}

/// What a [`RawEngine`] sends for a POST: pieces written one by one (a short pause between, so
/// they arrive as separate reads), then the connection is closed.
type Pieces = Vec<Vec<u8>>;

/// The path and body bytes of every POST a [`RawEngine`] received, in arrival order.
type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// An engine that is only a TCP socket: `GET /health` is 200 (any other GET 404), and every POST
/// is answered with exactly the bytes of [`RawEngine::answer_with`]. It keeps each POST's path and
/// body bytes as they arrived, for tests about the wire itself (framing, byte-exact forwarding).
pub struct RawEngine {
    addr: SocketAddr,
    answer: Arc<Mutex<Pieces>>,
    received: Received,
    accept: JoinHandle<()>,
}

impl RawEngine {
    pub async fn spawn(ip: [u8; 4]) -> RawEngine {
        let listener = tokio::net::TcpListener::bind((IpAddr::from(ip), 0))
            .await
            .expect("bind a raw engine");
        let addr = listener.local_addr().expect("the raw engine's address");
        let answer: Arc<Mutex<Pieces>> = Arc::default();
        let received: Received = Arc::default();
        let accept = tokio::spawn({
            let (answer, received) = (answer.clone(), received.clone());
            async move {
                while let Ok((conn, _)) = listener.accept().await {
                    tokio::spawn(serve_raw(conn, answer.clone(), received.clone()));
                }
            }
        });
        RawEngine {
            addr,
            answer,
            received,
            accept,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn answer_with(&self, pieces: &[&[u8]]) {
        *self.answer.lock().unwrap() = pieces.iter().map(|p| p.to_vec()).collect();
    }

    /// A `POST /workers` body registering this engine as an SGLang `worker_type`.
    pub fn spec(&self, worker_type: &str) -> Value {
        serde_json::json!({"url": format!("http://{}", self.addr), "worker_type": worker_type,
            "runtime_type": "sglang"})
    }

    /// Path and body bytes of every POST so far, in arrival order.
    pub fn received(&self) -> Vec<(String, Vec<u8>)> {
        self.received.lock().unwrap().clone()
    }
}

impl Drop for RawEngine {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn serve_raw(mut conn: TcpStream, answer: Arc<Mutex<Pieces>>, received: Received) {
    let Some((method, path, body)) = read_request(&mut conn).await else {
        return;
    };
    if method == "GET" {
        let status = if path == "/health" {
            "200 OK"
        } else {
            "404 Not Found"
        };
        let head = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        let _ = conn.write_all(head.as_bytes()).await;
        return;
    }
    received.lock().unwrap().push((path, body));
    let pieces = answer.lock().unwrap().clone();
    for p in pieces {
        if conn.write_all(&p).await.is_err() {
            return;
        }
        let _ = conn.flush().await;
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    let _ = conn.shutdown().await;
}
