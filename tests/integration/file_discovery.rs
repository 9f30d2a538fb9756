//! File discovery through the real binary with SMG's flags (`--discovery-provider file
//! --discovery-file F`): a manifest created after startup, applied as it changes (new entries
//! registered, missing ones drained), an invalid version refused whole while the workers stay.
//! Mocks on 127.0.86.x.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use mock_engine::{EngineKind, MockEngine, MockEngineConfig, Role};
use serde_json::{json, Value};

use crate::harness::Gateway;

fn entry(e: &MockEngine, worker_type: &str) -> Value {
    let mut v = json!({"url": e.api_url(), "worker_type": worker_type});
    if let Some(port) = e.bootstrap_port() {
        v["bootstrap_port"] = json!(port);
    }
    v
}

/// Writes the manifest as a whole new file swapped in (as an operator's tooling would).
fn write_manifest(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn urls(workers: &Value) -> Vec<String> {
    workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["url"].as_str().unwrap().to_string())
        .collect()
}

async fn until(gw: &Gateway, what: &str, mut ok: impl FnMut(&Value) -> bool) {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let workers = gw.get("/workers").await.json();
        if ok(&workers) {
            return;
        }
        assert!(Instant::now() < end, "{what}: {workers}\n{}", gw.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_written_after_startup_is_applied_as_it_changes() {
    let spawn = |role, ip| MockEngine::spawn(MockEngineConfig::test(EngineKind::Sglang, role, ip));
    let p = spawn(Role::Prefill, [127, 0, 86, 1]).await.unwrap();
    let d1 = spawn(Role::Decode, [127, 0, 86, 2]).await.unwrap();
    let d2 = spawn(Role::Decode, [127, 0, 86, 3]).await.unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("file-discovery-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let manifest = dir.join("workers.json");
    let mut gw = Gateway::launch(&[
        "--discovery-provider",
        "file",
        "--discovery-file",
        manifest.to_str().unwrap(),
        "--discovery-check-interval-secs",
        "30",
        "--drain-settle-secs",
        "0",
        "--policy",
        "round_robin",
    ])
    .await;

    // No manifest yet: the gateway serves, is not ready, and says why (once the watch's first
    // read has failed: right after startup it may not have run yet).
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let r = gw.get("/readiness").await;
        assert_eq!(r.status, 503, "{}", r.text());
        if r.text().contains("cannot be read") {
            break;
        }
        assert!(Instant::now() < end, "{}", r.text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    write_manifest(
        &manifest,
        &json!({"version": 1, "workers": [entry(&p, "prefill"), entry(&d1, "decode")]}).to_string(),
    );
    gw.wait_ready().await;
    let chat = json!({"model": "mock-model", "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"}]});
    let r = gw.post("/v1/chat/completions", &chat).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        d1.records()[0].body["bootstrap_port"],
        json!(p.bootstrap_port()),
        "the manifest's bootstrap port reached the legs"
    );

    // An invalid version changes nothing.
    write_manifest(
        &manifest,
        &json!({"version": 1, "workers": [entry(&p, "prefill"), {"url": d2.api_url(), "worker_type": "decode", "bogus": 1}]})
            .to_string(),
    );
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let r = gw.get("/readiness").await;
        if r.text().contains("unknown field `bogus`") {
            assert_eq!(r.status, 200, "the workers stayed: {}", r.text());
            break;
        }
        assert!(Instant::now() < end, "{}", r.text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(urls(&gw.get("/workers").await.json()).contains(&d1.api_url()));

    // A valid change: d1 leaves (drained), d2 joins.
    write_manifest(
        &manifest,
        &json!({"version": 1, "workers": [entry(&p, "prefill"), entry(&d2, "decode")]}).to_string(),
    );
    until(&gw, "d2 replaces d1", |w| {
        let now = urls(w);
        now.contains(&d2.api_url()) && !now.contains(&d1.api_url())
    })
    .await;
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let r = gw.post("/v1/chat/completions", &chat).await;
        if r.status == 200 {
            break;
        }
        assert!(Instant::now() < end, "{}", r.text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(d2.records().len(), 1);
    assert_eq!(d1.records().len(), 1, "the drained decode got nothing new");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_the_manifest_workers() {
    let spawn = |role, ip| MockEngine::spawn(MockEngineConfig::test(EngineKind::Sglang, role, ip));
    let p = spawn(Role::Prefill, [127, 0, 86, 4]).await.unwrap();
    let d = spawn(Role::Decode, [127, 0, 86, 5]).await.unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("file-discovery-reload-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let manifest = dir.join("workers.json");
    write_manifest(
        &manifest,
        &json!({"version": 1, "workers": [entry(&p, "prefill"), entry(&d, "decode")]}).to_string(),
    );
    let extra = format!(
        "  discovery_provider: file\n  discovery_file: {}\n",
        manifest.display()
    );
    let mut gw = Gateway::start(&[], &extra).await;
    gw.wait_ready().await;
    let before = gw.get("/workers").await.json();
    gw.signal("HUP");
    let m = gw
        .metrics_when(|m| {
            crate::harness::metric_value(m, "pdgate_config_reloads_total", &[("result", "ok")])
                == Some(1.0)
        })
        .await;
    assert_eq!(
        crate::harness::metric_value(&m, "pdgate_config_reloads_total", &[("result", "ok")]),
        Some(1.0),
        "{m}"
    );
    let after = gw.get("/workers").await.json();
    let ids = |w: &Value| -> Vec<String> {
        w["workers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        ids(&before),
        ids(&after),
        "a reload touched the manifest's workers"
    );
    assert_eq!(urls(&after).len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}
