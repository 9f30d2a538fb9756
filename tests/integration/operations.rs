//! Operations under steady concurrent load: a SIGHUP reload that adds and removes workers, an
//! invalid reload, `POST /reload`, a graceful binary upgrade (SIGQUIT + `-u`) and a graceful
//! shutdown (SIGTERM) — each without losing a request or cutting a stream, with clients that
//! open a connection per request and with keep-alive clients that reuse one.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mock_engine::client::{KeepAlive, KeepAliveError};
use mock_engine::{EngineKind, MockEngine, MockEngineConfig, Role};
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde_json::{json, Value};

use crate::harness::{free_port, metric_value, Gateway};

/// Counters of a steady load run.
#[derive(Default)]
struct Tally {
    ok: AtomicUsize,
    failed: AtomicUsize,
    streams_cut: AtomicUsize,
}

/// `workers` concurrent clients sending requests in a loop (every other one streamed) until
/// `stop`; a streamed answer must end with `[DONE]`.
fn steady_load(
    port: u16,
    clients: usize,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..clients)
        .map(|i| {
            let (stop, tally) = (stop.clone(), tally.clone());
            tokio::spawn(async move {
                let url = format!("http://127.0.0.1:{port}/v1/chat/completions");
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let stream = (i + n) % 2 == 0;
                    let body = json!({"model": "mock-model", "messages": [{"role": "user", "content": format!("load {i} {n}")}],
                        "max_tokens": 6, "stream": stream});
                    match mock_engine::client::post_json(&url, &body).await {
                        Ok(r) if r.status == 200 => {
                            if stream && !r.text().trim_end().ends_with("data: [DONE]") {
                                tally.streams_cut.fetch_add(1, Ordering::Relaxed);
                            } else {
                                tally.ok.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Ok(r) => {
                            eprintln!("load request failed: {} {}", r.status, r.text());
                            tally.failed.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            eprintln!("load request failed: {e}");
                            tally.failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect()
}

/// What keep-alive clients saw.
#[derive(Default)]
struct KeepAliveTally {
    ok: AtomicUsize,
    /// Answers that carried `Connection: close` (the client then reconnects).
    told_to_close: AtomicUsize,
    streams_cut: AtomicUsize,
    /// Requests sent on a connection that carried earlier ones and never answered in full: what
    /// a pooled client loses when the server closes a keep-alive connection under it.
    lost_on_reused: Mutex<Vec<String>>,
    /// Requests that got no connection, or whose fresh connection failed: only expected once no
    /// process listens any more (after SIGTERM).
    refused: Mutex<Vec<String>>,
    /// Non-200 answers.
    failed: Mutex<Vec<String>>,
}

impl KeepAliveTally {
    fn summary(&self) -> String {
        let first = |v: &Mutex<Vec<String>>| {
            let v = v.lock().unwrap();
            format!("{} {:?}", v.len(), v.iter().take(3).collect::<Vec<_>>())
        };
        format!(
            "ok {}, told to close {}, streams cut {}, lost on reused connections {}, refused {}, failed {}",
            self.ok.load(Ordering::Relaxed),
            self.told_to_close.load(Ordering::Relaxed),
            self.streams_cut.load(Ordering::Relaxed),
            first(&self.lost_on_reused),
            first(&self.refused),
            first(&self.failed),
        )
    }
}

/// `clients` keep-alive clients, each reusing one connection, sending the next request either at
/// once or after a 1–60 ms pause (so connections sit idle at random moments), every other
/// request streamed.
fn keep_alive_load(
    port: u16,
    clients: usize,
    stop: Arc<AtomicBool>,
    tally: Arc<KeepAliveTally>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..clients)
        .map(|i| {
            let (stop, tally) = (stop.clone(), tally.clone());
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(0x6b65_6570 + i as u64);
                let mut client = KeepAlive::new(([127, 0, 0, 1], port).into());
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let stream = (i + n) % 2 == 0;
                    let body = json!({"model": "mock-model", "messages": [{"role": "user", "content": format!("keep-alive {i} {n}")}],
                        "max_tokens": 6, "stream": stream});
                    match client.post_json("/v1/chat/completions", &body).await {
                        Ok(r) if r.status == 200 => {
                            if r.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close")) {
                                tally.told_to_close.fetch_add(1, Ordering::Relaxed);
                            }
                            if stream && !r.text().trim_end().ends_with("data: [DONE]") {
                                tally.streams_cut.fetch_add(1, Ordering::Relaxed);
                            } else {
                                tally.ok.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Ok(r) => tally
                            .failed
                            .lock()
                            .unwrap()
                            .push(format!("{} {}", r.status, r.text())),
                        Err(KeepAliveError::Exchange { reused: true, error }) => {
                            tally.lost_on_reused.lock().unwrap().push(error)
                        }
                        Err(e) => {
                            tally.refused.lock().unwrap().push(e.to_string());
                            // Nobody listens: do not spin.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                    // Half the time the next request goes out at once (racing a close the
                    // server may be sending), else after an idle pause.
                    if rng.gen_bool(0.5) {
                        let pause = rng.gen_range(1..=60);
                        tokio::time::sleep(Duration::from_millis(pause)).await;
                    }
                }
            })
        })
        .collect()
}

fn conf_text(port: u16, prom: u16, dir: &Path, workers: &[Value], grace: u64) -> String {
    let d = dir.display();
    let mut lines = vec![
        "version: 1".to_string(),
        "threads: 2".into(),
        format!("grace_period_seconds: {grace}"),
        "graceful_shutdown_timeout_seconds: 1".into(),
        format!("upgrade_sock: {d}/upgrade-{port}.sock"),
        format!("pid_file: {d}/pdgate-{port}.pid"),
        "gateway:".into(),
        "  pd_disaggregation: true".into(),
        "  host: 127.0.0.1".into(),
        format!("  port: {port}"),
        "  prometheus_host: 127.0.0.1".into(),
        format!("  prometheus_port: {prom}"),
        "  policy: round_robin".into(),
        "  worker_startup_check_interval: 1".into(),
        "  health_check_interval_secs: 1".into(),
        "  drain_settle_secs: 1".into(),
        "  workers:".into(),
    ];
    lines.extend(workers.iter().map(|w| format!("    - {w}")));
    lines.push(String::new());
    lines.join("\n")
}

async fn sglang(role: Role, ip: [u8; 4]) -> MockEngine {
    let mut c = MockEngineConfig::test(EngineKind::Sglang, role, ip);
    c.itl_ms = 2;
    MockEngine::spawn(c).await.unwrap()
}

async fn wait_workers(gw: &Gateway, urls: &[String]) {
    for _ in 0..300 {
        let w = gw.get("/workers").await.json();
        let list = w["workers"].as_array().cloned().unwrap_or_default();
        let ready: Vec<String> = list
            .iter()
            .filter(|w| w["status"] == "ready")
            .map(|w| w["url"].as_str().unwrap().to_string())
            .collect();
        if list.len() == urls.len() && urls.iter().all(|u| ready.contains(u)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "fleet never became {urls:?}: {}",
        gw.get("/workers").await.text()
    );
}

fn tmp() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("operations");
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reload_under_load_loses_nothing_and_invalid_files_change_nothing() {
    let p1 = sglang(Role::Prefill, [127, 0, 3, 1]).await;
    let p2 = sglang(Role::Prefill, [127, 0, 3, 2]).await;
    let d1 = sglang(Role::Decode, [127, 0, 3, 3]).await;
    let d2 = sglang(Role::Decode, [127, 0, 3, 4]).await;
    let (port, prom, dir) = (free_port(), free_port(), tmp());
    let conf = dir.join(format!("reload-{port}.yaml"));
    std::fs::write(
        &conf,
        conf_text(port, prom, &dir, &[p1.worker_spec(), d1.worker_spec()], 1),
    )
    .unwrap();
    let mut gw = Gateway::spawn(&conf, port, prom, dir.join(format!("reload-{port}.log")));
    gw.wait_ready().await;

    let (stop, tally) = (Arc::new(AtomicBool::new(false)), Arc::new(Tally::default()));
    let clients = steady_load(port, 16, stop.clone(), tally.clone());
    while tally.ok.load(Ordering::Relaxed) < 50 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Reload: add p2 and d2, drop d1.
    std::fs::write(
        &conf,
        conf_text(
            port,
            prom,
            &dir,
            &[p1.worker_spec(), p2.worker_spec(), d2.worker_spec()],
            1,
        ),
    )
    .unwrap();
    gw.signal("HUP");
    wait_workers(&gw, &[p1.api_url(), p2.api_url(), d2.api_url()]).await;
    let d1_after_removal = d1.records().len();
    let base = tally.ok.load(Ordering::Relaxed);
    while tally.ok.load(Ordering::Relaxed) < base + 100 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !p2.records().is_empty() && !d2.records().is_empty(),
        "the new workers got no traffic"
    );
    assert_eq!(
        d1.records().len(),
        d1_after_removal,
        "a removed worker still got traffic"
    );

    // An invalid file changes nothing.
    std::fs::write(
        &conf,
        "gateway:\n  pd_disaggregation: true\n  policy: no_such_policy\n",
    )
    .unwrap();
    gw.signal("HUP");
    let mut counted = false;
    for _ in 0..200 {
        if metric_value(
            &gw.metrics().await,
            "pdgate_config_reloads_total",
            &[("result", "error")],
        ) == Some(1.0)
        {
            counted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(counted, "the rejected reload was not counted");
    assert!(
        gw.log().contains("config reload rejected"),
        "no log line for the rejected reload"
    );
    wait_workers(&gw, &[p1.api_url(), p2.api_url(), d2.api_url()]).await;
    let base = tally.ok.load(Ordering::Relaxed);
    while tally.ok.load(Ordering::Relaxed) < base + 50 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // POST /reload does the same as SIGHUP (here: back to p1 + d1).
    std::fs::write(
        &conf,
        conf_text(port, prom, &dir, &[p1.worker_spec(), d1.worker_spec()], 1),
    )
    .unwrap();
    let r = gw.post("/reload", &json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let report = r.json();
    assert_eq!(report["workers_added"], json!([d1.api_url()]));
    wait_workers(&gw, &[p1.api_url(), d1.api_url()]).await;

    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    assert_eq!(
        tally.failed.load(Ordering::Relaxed),
        0,
        "requests failed during reloads"
    );
    assert_eq!(
        tally.streams_cut.load(Ordering::Relaxed),
        0,
        "streams were cut during reloads"
    );
    assert!(
        metric_value(
            &gw.metrics().await,
            "pdgate_config_reloads_total",
            &[("result", "ok")]
        )
        .unwrap_or(0.0)
            >= 2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_upgrade_hands_over_listeners_without_losing_requests() {
    let p = sglang(Role::Prefill, [127, 0, 4, 1]).await;
    let mut dc = MockEngineConfig::test(EngineKind::Sglang, Role::Decode, [127, 0, 4, 2]);
    dc.itl_ms = 20; // streams stay open across the hand-over
    let d = MockEngine::spawn(dc).await.unwrap();
    let (port, prom, dir) = (free_port(), free_port(), tmp());
    let conf = dir.join(format!("upgrade-{port}.yaml"));
    std::fs::write(
        &conf,
        conf_text(port, prom, &dir, &[p.worker_spec(), d.worker_spec()], 5),
    )
    .unwrap();
    let mut old = Gateway::spawn(
        &conf,
        port,
        prom,
        dir.join(format!("upgrade-old-{port}.log")),
    );
    old.wait_ready().await;

    let (stop, tally) = (Arc::new(AtomicBool::new(false)), Arc::new(Tally::default()));
    let clients = steady_load(port, 16, stop.clone(), tally.clone());
    while tally.ok.load(Ordering::Relaxed) < 30 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The new binary waits for the listeners; SIGQUIT makes the old one hand them over, stop
    // accepting, and finish what it has in flight.
    let sock = dir.join(format!("upgrade-{port}.sock"));
    let _ = std::fs::remove_file(&sock);
    let new = Gateway::spawn_with(
        &conf,
        port,
        prom,
        dir.join(format!("upgrade-new-{port}.log")),
        &["-u"],
    );
    // The new process listens on the upgrade socket once it is ready to take the listeners.
    let listening = mock_engine::wait_until(Duration::from_secs(10), || sock.exists()).await;
    assert!(
        listening,
        "the new process never opened {}\n{}",
        sock.display(),
        new.log()
    );
    old.signal("QUIT");
    let status = old.wait_exit(Duration::from_secs(20)).await;
    assert!(
        status.is_some(),
        "the old process never exited\n{}",
        old.log()
    );
    let base = tally.ok.load(Ordering::Relaxed);
    while tally.ok.load(Ordering::Relaxed) < base + 50 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    assert_eq!(
        tally.failed.load(Ordering::Relaxed),
        0,
        "requests failed during the upgrade\nold:\n{}\nnew:\n{}",
        old.log(),
        new.log()
    );
    assert_eq!(
        tally.streams_cut.load(Ordering::Relaxed),
        0,
        "streams were cut by the upgrade"
    );
    assert_eq!(new.get("/readiness").await.status, 200);
}

/// The black-box finding: keep-alive clients lost requests with `ECONNRESET` when the old
/// process closed idle connections they were already sending on. After the hand-over every
/// answer carries `Connection: close`, idle connections keep being served through the grace
/// period, and the last ones are half-closed and drained: nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_upgrade_loses_nothing_for_keep_alive_clients() {
    let p = sglang(Role::Prefill, [127, 0, 4, 11]).await;
    let d = sglang(Role::Decode, [127, 0, 4, 12]).await;
    let (port, prom, dir) = (free_port(), free_port(), tmp());
    let conf = dir.join(format!("upgrade-ka-{port}.yaml"));
    std::fs::write(
        &conf,
        conf_text(port, prom, &dir, &[p.worker_spec(), d.worker_spec()], 3),
    )
    .unwrap();
    let mut old = Gateway::spawn(
        &conf,
        port,
        prom,
        dir.join(format!("upgrade-ka-old-{port}.log")),
    );
    old.wait_ready().await;

    let (stop, tally) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(KeepAliveTally::default()),
    );
    let clients = keep_alive_load(port, 16, stop.clone(), tally.clone());
    while tally.ok.load(Ordering::Relaxed) < 60 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let sock = dir.join(format!("upgrade-{port}.sock"));
    let _ = std::fs::remove_file(&sock);
    let new = Gateway::spawn_with(
        &conf,
        port,
        prom,
        dir.join(format!("upgrade-ka-new-{port}.log")),
        &["-u"],
    );
    let listening = mock_engine::wait_until(Duration::from_secs(10), || sock.exists()).await;
    assert!(listening, "the new process never opened {}", sock.display());
    old.signal("QUIT");
    let status = old.wait_exit(Duration::from_secs(30)).await;
    assert!(
        status.is_some(),
        "the old process never exited\n{}",
        old.log()
    );
    let base = tally.ok.load(Ordering::Relaxed);
    while tally.ok.load(Ordering::Relaxed) < base + 60 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let summary = tally.summary();
    eprintln!("keep-alive clients across the upgrade: {summary}");
    assert!(
        tally.lost_on_reused.lock().unwrap().is_empty()
            && tally.refused.lock().unwrap().is_empty()
            && tally.failed.lock().unwrap().is_empty()
            && tally.streams_cut.load(Ordering::Relaxed) == 0,
        "requests were lost across the upgrade: {summary}\nold:\n{}\nnew:\n{}",
        old.log(),
        new.log()
    );
    assert!(
        tally.told_to_close.load(Ordering::Relaxed) > 0,
        "no answer told a client to reconnect: {summary}"
    );
    assert!(
        old.log().contains("draining client connections"),
        "{}",
        old.log()
    );
    assert_eq!(new.get("/readiness").await.status, 200);
}

/// SIGTERM: no process takes over, so new connections are refused once the listener closes;
/// but a request a keep-alive client sends on its open connection is still answered (with
/// `Connection: close`), and idle connections are closed without a race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_keep_alive_clients_before_closing_their_connections() {
    let p = sglang(Role::Prefill, [127, 0, 4, 13]).await;
    let d = sglang(Role::Decode, [127, 0, 4, 14]).await;
    let (port, prom, dir) = (free_port(), free_port(), tmp());
    let conf = dir.join(format!("term-ka-{port}.yaml"));
    std::fs::write(
        &conf,
        conf_text(port, prom, &dir, &[p.worker_spec(), d.worker_spec()], 2),
    )
    .unwrap();
    let mut gw = Gateway::spawn(&conf, port, prom, dir.join(format!("term-ka-{port}.log")));
    gw.wait_ready().await;

    let (stop, tally) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(KeepAliveTally::default()),
    );
    let clients = keep_alive_load(port, 16, stop.clone(), tally.clone());
    while tally.ok.load(Ordering::Relaxed) < 60 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    gw.signal("TERM");
    let status = gw.wait_exit(Duration::from_secs(20)).await;
    assert!(status.is_some(), "the gateway never exited\n{}", gw.log());
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let summary = tally.summary();
    eprintln!("keep-alive clients across SIGTERM: {summary}");
    assert!(
        tally.lost_on_reused.lock().unwrap().is_empty()
            && tally.failed.lock().unwrap().is_empty()
            && tally.streams_cut.load(Ordering::Relaxed) == 0,
        "requests on open connections were lost at shutdown: {summary}\n{}",
        gw.log()
    );
    assert!(
        tally.told_to_close.load(Ordering::Relaxed) > 0,
        "no answer told a client to reconnect: {summary}"
    );
}

/// SIGTERM with a long grace period: a stream in flight still ends whole, an idle keep-alive
/// connection is closed after its short wait, and then the process exits — it does not sleep out
/// the grace period (Pingora alone lingered all 120 s of it, even with nothing to serve).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_once_drained_not_at_the_end_of_the_grace_period() {
    let p = sglang(Role::Prefill, [127, 0, 4, 15]).await;
    let mut dc = MockEngineConfig::test(EngineKind::Sglang, Role::Decode, [127, 0, 4, 16]);
    dc.itl_ms = 20;
    let d = MockEngine::spawn(dc).await.unwrap();
    let (port, prom, dir) = (free_port(), free_port(), tmp());
    let conf = dir.join(format!("term-exit-{port}.yaml"));
    std::fs::write(
        &conf,
        conf_text(port, prom, &dir, &[p.worker_spec(), d.worker_spec()], 120),
    )
    .unwrap();
    let mut gw = Gateway::spawn(&conf, port, prom, dir.join(format!("term-exit-{port}.log")));
    gw.wait_ready().await;

    // An idle keep-alive connection (one request served on it), and a stream of ~100 tokens.
    let mut idle = KeepAlive::new(([127, 0, 0, 1], port).into());
    let body = json!({"text": "idle", "sampling_params": {"max_new_tokens": 2}});
    assert_eq!(
        idle.post_json("/generate", &body).await.unwrap().status,
        200
    );
    // And a connection that never sends a request (Pingora would wait 60 s for one).
    let _silent = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let long = json!({"text": "long", "stream": true, "sampling_params": {"max_new_tokens": 100, "ignore_eos": true}});
    let mut s = gw.stream("/generate", &long).await;
    assert_eq!(s.status, 200);
    s.next_chunk()
        .await
        .expect("a first chunk")
        .expect("readable");

    gw.signal("TERM");
    let rest = s.body_bytes().await.expect("the stream ends whole");
    assert!(
        String::from_utf8_lossy(&rest).ends_with("data: [DONE]\n\n"),
        "{}",
        String::from_utf8_lossy(&rest)
    );
    // Well under the 120 s grace and the silent connection's 60 s: the stream's end, then the
    // idle connections' 5 s wait (+2 s for the one that never sent a request).
    let status = gw.wait_exit(Duration::from_secs(30)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "the gateway did not exit once drained: {status:?}\n{}",
        gw.log()
    );
    assert!(
        gw.log().contains("drained: no client connection is open"),
        "{}",
        gw.log()
    );
}

/// A ConfigMap-style update: the workers file is a symlink into a `..data` directory that is
/// swapped atomically (how kubelet updates a mounted ConfigMap).
fn configmap_write(dir: &Path, version: u32, workers: &[Value]) {
    let data = dir.join(format!("..v{version}"));
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("workers.yaml"),
        serde_json::to_string(workers).unwrap(),
    )
    .unwrap();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(format!("..v{version}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    let link = dir.join("workers.yaml");
    if std::fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink("..data/workers.yaml", &link).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_update_of_the_workers_file_is_applied_without_a_signal() {
    let spawn = |role, ip| MockEngine::spawn(MockEngineConfig::test(EngineKind::Sglang, role, ip));
    let p = spawn(Role::Prefill, [127, 0, 87, 1]).await.unwrap();
    let d1 = spawn(Role::Decode, [127, 0, 87, 2]).await.unwrap();
    let d2 = spawn(Role::Decode, [127, 0, 87, 3]).await.unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("configmap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    configmap_write(&dir, 1, &[p.worker_spec(), d1.worker_spec()]);
    let extra = format!(
        "  workers_file: {}\n  config_watch_interval_secs: 1\n  drain_settle_secs: 0\n",
        dir.join("workers.yaml").display()
    );
    let mut gw = Gateway::start(&[], &extra).await;
    gw.wait_ready().await;
    let urls = |w: &Value| -> Vec<String> {
        w["workers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["url"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(urls(&gw.get("/workers").await.json()).contains(&d1.api_url()));

    configmap_write(&dir, 2, &[p.worker_spec(), d2.worker_spec()]);
    let end = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = urls(&gw.get("/workers").await.json());
        if now.contains(&d2.api_url()) && !now.contains(&d1.api_url()) {
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "the update was not applied: {now:?}\n{}",
            gw.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Once d2 is ready, requests go there.
    let end = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let r = gw
            .post(
                "/generate",
                &json!({"text": "hi", "sampling_params": {"max_new_tokens": 2}}),
            )
            .await;
        if r.status == 200 {
            break;
        }
        assert!(std::time::Instant::now() < end, "{}", r.text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(d2.records().len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}
