//! Kubernetes service discovery through the real binary, against a fake API server
//! (`mock_engine::kube_api`) found through a generated `KUBECONFIG`: pods become workers once
//! Running and Ready, leave (drained) when deleted or not ready, only in the watched namespace,
//! with their annotations; a 410 relist keeps healthy workers; an API server that is down at
//! startup is waited for. Engines listen on 127.0.80.x–127.0.85.x, all on one port per test
//! (`service_discovery_port`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use mock_engine::kube_api::{pod, FakeKubeApi};
use mock_engine::{EngineKind, MockEngine, MockEngineConfig, Role};
use serde_json::{json, Value};

use crate::harness::{free_port, Gateway};

const NS: &str = "inference";
const PREFILL: &[(&str, &str)] = &[("app", "engine"), ("role", "prefill")];
const DECODE: &[(&str, &str)] = &[("app", "engine"), ("role", "decode")];

async fn engine(
    role: Role,
    ip: [u8; 4],
    port: u16,
    tweak: impl Fn(&mut MockEngineConfig),
) -> MockEngine {
    let mut cfg = MockEngineConfig::test(EngineKind::Sglang, role, ip);
    cfg.port = port;
    tweak(&mut cfg);
    MockEngine::spawn(cfg).await.expect("mock engine")
}

fn ip_of(e: &MockEngine) -> String {
    e.config().bind_ip.to_string()
}

/// A serving prefill pod for `e`, advertising its bootstrap port.
fn prefill_pod(name: &str, e: &MockEngine) -> Value {
    let mut p = pod(NS, name, PREFILL, &ip_of(e), true);
    let port = e.bootstrap_port().expect("a prefill has a bootstrap port");
    p["metadata"]["annotations"] = json!({"sglang.ai/bootstrap-port": port.to_string()});
    p
}

fn decode_pod(name: &str, e: &MockEngine) -> Value {
    pod(NS, name, DECODE, &ip_of(e), true)
}

/// A kubeconfig pointing at `server`, in the test tmp dir.
fn kubeconfig(server: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kubeconfigs");
    std::fs::create_dir_all(&dir).expect("create the kubeconfig dir");
    let path = dir.join(format!("kubeconfig-{}", free_port()));
    std::fs::write(&path, FakeKubeApi::kubeconfig(server, "default")).expect("write kubeconfig");
    path
}

/// A gateway discovering the role selectors above in `inference`, engines on `port`.
async fn gateway(server: &str, port: u16, extra: &str) -> Gateway {
    gateway_watching(
        server,
        port,
        &format!("  service_discovery_namespace: {NS}\n{extra}"),
    )
    .await
}

/// A gateway discovering the role selectors above (in every namespace unless `extra` says).
async fn gateway_watching(server: &str, port: u16, extra: &str) -> Gateway {
    let config = kubeconfig(server);
    let yaml = format!(
        "  service_discovery: true\n  prefill_selector: [app=engine, role=prefill]\n  \
         decode_selector: [app=engine, role=decode]\n  service_discovery_port: {port}\n  \
         drain_settle_secs: 1\n{extra}"
    );
    let kubeconfig = config.display().to_string();
    Gateway::start_with_env(&[], &yaml, &[("KUBECONFIG", &kubeconfig)]).await
}

/// Polls `GET /workers` until `done` holds; panics with the last list after `deadline`.
async fn workers_when(
    gw: &Gateway,
    deadline: Duration,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let end = Instant::now() + deadline;
    loop {
        let list = gw.get("/workers").await.json();
        let workers = list["workers"].as_array().cloned().unwrap_or_default();
        if done(&workers) {
            return workers;
        }
        if Instant::now() > end {
            panic!(
                "workers never reached the expected state: {list:#}\n{}",
                gw.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn find<'a>(workers: &'a [Value], url: &str) -> Option<&'a Value> {
    workers.iter().find(|w| w["url"] == url)
}

fn url_of(e: &MockEngine, port: u16) -> String {
    format!("http://{}:{port}", ip_of(e))
}

/// Polls `/readiness` until its status is `want`; returns the body.
async fn readiness_when(gw: &Gateway, want: u16, deadline: Duration) -> Value {
    let end = Instant::now() + deadline;
    loop {
        let r = gw.get("/readiness").await;
        if r.status == want {
            return r.json();
        }
        if Instant::now() > end {
            panic!(
                "/readiness stayed {} ({}), wanted {want}\n{}",
                r.status,
                r.text(),
                gw.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn generate(max_new_tokens: u32, stream: bool) -> Value {
    json!({"text": "hi", "stream": stream,
        "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": true}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_pods_in_the_namespace_serve_pd_requests() {
    let api = FakeKubeApi::start().await.expect("fake API server");
    let port = free_port();
    let p = engine(Role::Prefill, [127, 0, 80, 1], port, |_| {}).await;
    let d = engine(Role::Decode, [127, 0, 80, 2], port, |_| {}).await;
    api.apply(prefill_pod("prefill-0", &p));
    api.apply(decode_pod("decode-0", &d));
    // Matching labels in another namespace, and the right namespace with other labels: ignored.
    api.apply(pod("other", "decode-x", DECODE, "127.0.80.3", true));
    api.apply(pod(
        NS,
        "router-0",
        &[("app", "engine"), ("role", "router")],
        "127.0.80.4",
        true,
    ));
    let gw = gateway(&api.url(), port, "").await;

    let ready = readiness_when(&gw, 200, Duration::from_secs(20)).await;
    assert_eq!(ready["discovery"]["provider"], "kubernetes", "{ready}");
    assert_eq!(ready["discovery"]["synced"], true, "{ready}");
    let workers = workers_when(&gw, Duration::from_secs(5), |w| w.len() == 2).await;
    let prefill = find(&workers, &url_of(&p, port)).expect("the prefill pod is a worker");
    assert_eq!(prefill["worker_type"], "prefill");
    assert_eq!(
        prefill["bootstrap_port"],
        json!(p.bootstrap_port()),
        "the bootstrap-port annotation reaches the worker"
    );
    let decode = find(&workers, &url_of(&d, port)).expect("the decode pod is a worker");
    assert_eq!(decode["worker_type"], "decode");

    let r = gw.post("/generate", &generate(4, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let pr = p.wait_records(1, Duration::from_secs(5)).await;
    let dr = d.wait_records(1, Duration::from_secs(5)).await;
    assert_eq!(
        pr[0].body["bootstrap_room"], dr[0].body["bootstrap_room"],
        "one PD request over the discovered pair"
    );
    assert_eq!(
        dr[0].body["bootstrap_port"],
        json!(p.bootstrap_port()),
        "the decode is sent to the annotated bootstrap port"
    );

    // The pods are the source of truth: a discovered worker deleted through the worker API
    // drains, then its still-serving pod is registered again.
    let old_id = decode["id"].as_str().expect("an id").to_string();
    let r =
        mock_engine::client::request("DELETE", &gw.url(&format!("/workers/{old_id}")), &[], None)
            .await
            .expect("DELETE");
    assert_eq!(r.status, 202, "{}", r.text());
    let d_url = url_of(&d, port);
    workers_when(&gw, Duration::from_secs(15), |w| {
        find(w, &d_url).is_some_and(|w| w["id"] != old_id.as_str() && w["status"] == "ready")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_namespace_every_namespace_is_watched() {
    let api = FakeKubeApi::start().await.expect("fake API server");
    let port = free_port();
    api.apply(pod("team-a", "prefill-a", PREFILL, "127.0.85.1", true));
    api.apply(pod("team-b", "decode-b", DECODE, "127.0.85.2", true));
    let gw = gateway_watching(&api.url(), port, "").await;
    let workers = workers_when(&gw, Duration::from_secs(20), |w| w.len() == 2).await;
    assert!(find(&workers, &format!("http://127.0.85.1:{port}"))
        .is_some_and(|w| w["worker_type"] == "prefill"));
    assert!(find(&workers, &format!("http://127.0.85.2:{port}"))
        .is_some_and(|w| w["worker_type"] == "decode"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_is_deleted_or_not_ready_is_drained_and_its_request_finishes() {
    let api = FakeKubeApi::start().await.expect("fake API server");
    let port = free_port();
    let p = engine(Role::Prefill, [127, 0, 81, 1], port, |_| {}).await;
    let slow = engine(Role::Decode, [127, 0, 81, 2], port, |c| c.itl_ms = 40).await;
    let other = engine(Role::Decode, [127, 0, 81, 3], port, |_| {}).await;
    api.apply(prefill_pod("prefill-0", &p));
    api.apply(decode_pod("decode-slow", &slow));
    let gw = gateway(&api.url(), port, "").await;
    readiness_when(&gw, 200, Duration::from_secs(20)).await;

    // A long answer in flight on the slow decode when its pod is deleted.
    let mut s = gw.stream("/generate", &generate(40, true)).await;
    assert_eq!(s.status, 200);
    s.next_chunk()
        .await
        .expect("a first chunk")
        .expect("readable");
    assert!(api.delete(NS, "decode-slow"));
    let slow_url = url_of(&slow, port);
    workers_when(&gw, Duration::from_secs(10), |w| {
        find(w, &slow_url).is_none_or(|w| w["status"] == "draining")
    })
    .await;
    api.apply(decode_pod("decode-other", &other));
    let (chunks, err) = s.collect().await;
    assert!(err.is_none(), "the in-flight stream was cut: {err:?}");
    let text: String = chunks
        .iter()
        .map(|c| String::from_utf8_lossy(&c.data))
        .collect();
    assert!(
        text.contains("[DONE]"),
        "the in-flight stream did not finish: {text}"
    );

    // The deleted pod leaves; new requests go to the other decode.
    workers_when(&gw, Duration::from_secs(10), |w| {
        find(w, &slow_url).is_none()
            && find(w, &url_of(&other, port)).is_some_and(|w| w["status"] == "ready")
    })
    .await;
    let before = slow.records().len();
    let r = gw.post("/generate", &generate(2, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    other.wait_records(1, Duration::from_secs(5)).await;
    assert_eq!(
        slow.records().len(),
        before,
        "a deleted pod's engine got a new request"
    );

    // Not ready: the decode leaves and readiness follows; ready again: it comes back.
    api.apply(pod(NS, "decode-other", DECODE, &ip_of(&other), false));
    let not_ready = readiness_when(&gw, 503, Duration::from_secs(10)).await;
    assert_eq!(not_ready["decode_healthy"], 0, "{not_ready}");
    api.apply(decode_pod("decode-other", &other));
    readiness_when(&gw, 200, Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_annotations_reach_the_worker_spec() {
    let api = FakeKubeApi::start().await.expect("fake API server");
    let port = free_port();
    let mut p = pod(NS, "prefill-0", PREFILL, "127.0.82.1", true);
    p["metadata"]["annotations"] = json!({
        "sglang.ai/bootstrap-port": "9100",
        "example.com/kv-connector": "NixlConnector",
        "example.com/kv-engine-id": "prefill-engine-0",
        // The default annotation names are not read when others are configured.
        "smg.ai/kv-connector": "MooncakeConnector",
    });
    let mut d = pod(NS, "decode-0", DECODE, "127.0.82.2", true);
    d["metadata"]["annotations"] = json!({
        "sglang.ai/bootstrap-port": "9101",
        "example.com/kv-connector": "NixlConnector",
        "example.com/kv-engine-id": "decode-engine-0",
    });
    api.apply(p.clone());
    api.apply(d);
    let gw = gateway(
        &api.url(),
        port,
        "  kv_connector_annotation: example.com/kv-connector\n  \
         kv_engine_id_annotation: example.com/kv-engine-id\n",
    )
    .await;
    let workers = workers_when(&gw, Duration::from_secs(20), |w| w.len() == 2).await;
    let prefill = find(&workers, &format!("http://127.0.82.1:{port}")).expect("prefill");
    assert_eq!(prefill["bootstrap_port"], 9100);
    assert_eq!(prefill["kv_connector"], "NixlConnector");
    assert_eq!(prefill["kv_engine_id"], "prefill-engine-0");
    let decode = find(&workers, &format!("http://127.0.82.2:{port}")).expect("decode");
    assert!(
        decode.get("bootstrap_port").is_none(),
        "a decode has no bootstrap port: {decode}"
    );
    assert_eq!(decode["kv_connector"], "NixlConnector");
    assert_eq!(decode["kv_engine_id"], "decode-engine-0");

    // A changed annotation updates the registration in place (same worker id, no drain).
    let id = prefill["id"].clone();
    p["metadata"]["annotations"]["example.com/kv-engine-id"] = json!("prefill-engine-1");
    api.apply(p);
    let prefill_url = format!("http://127.0.82.1:{port}");
    let workers = workers_when(&gw, Duration::from_secs(10), |w| {
        find(w, &prefill_url).is_some_and(|w| w["kv_engine_id"] == "prefill-engine-1")
    })
    .await;
    let prefill = find(&workers, &prefill_url).expect("prefill");
    assert_eq!(prefill["id"], id, "the worker was re-created: {prefill}");
    assert_ne!(prefill["status"], "draining", "{prefill}");

    // A reload owns the config's workers only: the discovered ones stay as they are.
    let before: Vec<Value> = workers.iter().map(|w| w["id"].clone()).collect();
    let r = gw.post("/reload", &json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["workers_removed"], json!([]), "{}", r.text());
    let after = gw.get("/workers").await.json();
    let after = after["workers"].as_array().expect("workers");
    assert_eq!(after.len(), 2, "{after:?}");
    for w in after {
        assert!(
            before.contains(&w["id"]),
            "a discovered worker changed on reload: {w}"
        );
        assert_ne!(w["status"], "draining", "{w}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relist_after_410_gone_keeps_healthy_workers_and_picks_up_changes() {
    let api = FakeKubeApi::start().await.expect("fake API server");
    let port = free_port();
    let p = engine(Role::Prefill, [127, 0, 83, 1], port, |_| {}).await;
    let d = engine(Role::Decode, [127, 0, 83, 2], port, |_| {}).await;
    let d2 = engine(Role::Decode, [127, 0, 83, 3], port, |_| {}).await;
    api.apply(prefill_pod("prefill-0", &p));
    api.apply(decode_pod("decode-0", &d));
    let gw = gateway(&api.url(), port, "").await;
    readiness_when(&gw, 200, Duration::from_secs(20)).await;
    let before = workers_when(&gw, Duration::from_secs(5), |w| w.len() == 2).await;
    let ids: Vec<Value> = before.iter().map(|w| w["id"].clone()).collect();
    // Both watches are open before the history is compacted.
    let end = Instant::now() + Duration::from_secs(10);
    while api.open_watches() < 2 {
        assert!(
            Instant::now() < end,
            "the watches never opened\n{}",
            gw.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A change the watches miss, then 410 Gone: only a relist can see it.
    api.set_quiet(true);
    api.apply(decode_pod("decode-1", &d2));
    api.set_quiet(false);
    let lists = api.lists();
    api.expire_watches();
    let d2_url = url_of(&d2, port);
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let workers = gw.get("/workers").await.json()["workers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for id in &ids {
            let w = workers.iter().find(|w| w["id"] == *id);
            assert!(
                w.is_some_and(|w| w["status"] == "ready"),
                "a healthy worker left during the relist: {workers:?}\n{}",
                gw.log()
            );
        }
        if find(&workers, &d2_url).is_some() {
            break;
        }
        assert!(
            Instant::now() < end,
            "the relist never found the new pod\n{}",
            gw.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(api.lists() > lists, "no relist after 410 Gone");
    // The watch resumed: a later change arrives as an event.
    assert!(api.delete(NS, "decode-1"));
    workers_when(&gw, Duration::from_secs(10), |w| find(w, &d2_url).is_none()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_api_server_down_at_startup_workers_appear_once_it_is_up() {
    let port = free_port();
    let api_port = free_port();
    let p = engine(Role::Prefill, [127, 0, 84, 1], port, |_| {}).await;
    let d = engine(Role::Decode, [127, 0, 84, 2], port, |_| {}).await;
    let gw = gateway(&format!("http://127.0.0.1:{api_port}"), port, "").await;
    // Up and answering, not ready, and saying why.
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let r = gw.get("/readiness").await;
        assert_eq!(r.status, 503, "{}", r.text());
        let body = r.json();
        assert_eq!(body["discovery"]["synced"], false, "{body}");
        if body["discovery"]["prefill"]["error"].is_string() {
            break;
        }
        assert!(
            Instant::now() < end,
            "no discovery error reported: {body}\n{}",
            gw.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        gw.log().contains("discovery"),
        "the failure is not logged\n{}",
        gw.log()
    );

    let api = FakeKubeApi::start_on(api_port)
        .await
        .expect("fake API server");
    api.apply(prefill_pod("prefill-0", &p));
    api.apply(decode_pod("decode-0", &d));
    let ready = readiness_when(&gw, 200, Duration::from_secs(60)).await;
    assert_eq!(ready["discovery"]["synced"], true, "{ready}");
    let r = gw.post("/generate", &generate(2, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_come_and_go_under_load_without_a_failed_request() {
    let api = FakeKubeApi::start().await.expect("fake API server");
    let port = free_port();
    let p = engine(Role::Prefill, [127, 0, 88, 1], port, |_| {}).await;
    let a = engine(Role::Decode, [127, 0, 88, 2], port, |c| c.itl_ms = 5).await;
    let b = engine(Role::Decode, [127, 0, 88, 3], port, |c| c.itl_ms = 5).await;
    api.apply(prefill_pod("prefill-0", &p));
    api.apply(decode_pod("decode-a", &a));
    api.apply(decode_pod("decode-b", &b));
    let gw = gateway(&api.url(), port, "").await;
    let (a_url, b_url) = (url_of(&a, port), url_of(&b, port));
    workers_when(&gw, Duration::from_secs(20), |w| {
        [&a_url, &b_url]
            .iter()
            .all(|u| find(w, u).is_some_and(|w| w["status"] == "ready"))
    })
    .await;

    // Four clients keep requests in flight the whole time.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (url, stop) = (gw.url("/generate"), stop.clone());
            tokio::spawn(async move {
                let (mut ok, mut failed) = (0u32, Vec::new());
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match mock_engine::client::post_json(&url, &generate(8, false)).await {
                        Ok(r) if r.status == 200 => ok += 1,
                        Ok(r) => failed.push(format!("{} {}", r.status, r.text())),
                        Err(e) => failed.push(e.to_string()),
                    }
                }
                (ok, failed)
            })
        })
        .collect();

    // a goes (gracefully) and comes back; then b goes. One decode is always serving.
    assert!(api.delete(NS, "decode-a"));
    workers_when(&gw, Duration::from_secs(20), |w| find(w, &a_url).is_none()).await;
    api.apply(decode_pod("decode-a-2", &a));
    workers_when(&gw, Duration::from_secs(20), |w| {
        find(w, &a_url).is_some_and(|w| w["status"] == "ready")
    })
    .await;
    let a_before = a.records().len();
    assert!(api.delete(NS, "decode-b"));
    workers_when(&gw, Duration::from_secs(20), |w| find(w, &b_url).is_none()).await;
    let end = Instant::now() + Duration::from_secs(20);
    while a.records().len() < a_before + 8 {
        assert!(Instant::now() < end, "the load did not move to decode a");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut ok, mut failed) = (0, Vec::new());
    for c in clients {
        let (o, f) = c.await.unwrap();
        ok += o;
        failed.extend(f);
    }
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {failed:?}",
        failed.len(),
        ok as usize + failed.len()
    );
    assert!(ok > 20, "too little load to mean anything: {ok}");
    assert!(!b.records().is_empty());
}
