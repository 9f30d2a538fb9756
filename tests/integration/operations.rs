//! Operations under steady concurrent load: a SIGHUP reload that adds and removes workers, an
//! invalid reload, `POST /reload`, and a graceful binary upgrade (SIGQUIT + `-u`) — each
//! without losing a request or cutting a stream.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mock_engine::{EngineKind, MockEngine, MockEngineConfig, Role};
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
