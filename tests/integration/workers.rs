//! The worker API and who may use it: registration at runtime (used only once healthy), SMG's
//! answers for duplicates and bad ids, drain-then-remove, API-key and loopback-only protection,
//! and single-leg count_tokens.

use std::time::Duration;

use bytes::Bytes;
use mock_engine::client::{self, ClientOptions};
use mock_engine::{EngineKind, MockEngine, MockEngineConfig, Role};
use serde_json::{json, Value};

use crate::harness::{free_port, Gateway};

async fn engine(role: Role, ip: [u8; 4]) -> MockEngine {
    MockEngine::spawn(MockEngineConfig::test(EngineKind::Sglang, role, ip))
        .await
        .expect("mock engine")
}

async fn post_json_from(
    gw: &Gateway,
    source: Option<&str>,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> client::Response {
    let opts = ClientOptions {
        source_ip: source.map(|s| s.parse().unwrap()),
        timeout: Some(Duration::from_secs(10)),
    };
    let mut h = vec![("content-type", "application/json")];
    h.extend_from_slice(headers);
    client::request_with(
        &opts,
        "POST",
        &gw.url(path),
        &h,
        Some(Bytes::from(body.to_string())),
    )
    .await
    .expect("request")
}

async fn wait_status(gw: &Gateway, id: &str, want: &str) -> Value {
    let mut last = Value::Null;
    for _ in 0..200 {
        last = gw.get(&format!("/workers/{id}")).await.json();
        if last["status"] == want {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("worker {id} never became {want}: {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_added_at_runtime_is_used_only_once_healthy() {
    let p = engine(Role::Prefill, [127, 0, 0, 2]).await;
    let gw = Gateway::start(&[p.worker_spec()], "  health_check_timeout_secs: 1\n").await;
    // Register a decode whose engine is not up yet: it stays pending and gets no traffic. The
    // port is held by a listener that never answers until the engine takes it over.
    let holder = std::net::TcpListener::bind("127.0.0.3:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    let url = format!("http://127.0.0.3:{port}");
    let r = gw
        .post(
            "/workers",
            &json!({"url": url, "worker_type": "decode", "runtime_type": "sglang"}),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["worker_id"].as_str().unwrap().to_string();
    assert_eq!(
        r.header("location"),
        Some(format!("/workers/{id}").as_str())
    );
    let w = gw.get(&format!("/workers/{id}")).await.json();
    assert_eq!(w["status"], "pending");
    assert_eq!(w["is_healthy"], false);
    let refused = gw.post("/generate", &json!({"text": "x"})).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(gw.get("/readiness").await.status, 503);

    let mut cfg = MockEngineConfig::test(EngineKind::Sglang, Role::Decode, [127, 0, 0, 3]);
    cfg.port = port;
    drop(holder);
    let d = MockEngine::spawn(cfg).await.unwrap();
    wait_status(&gw, &id, "ready").await;
    let ok = gw
        .post(
            "/generate",
            &json!({"text": "x", "sampling_params": {"max_new_tokens": 2}}),
        )
        .await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(d.records().len(), 1);
    assert_eq!(gw.get("/readiness").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_api_answers_like_smg() {
    let p = engine(Role::Prefill, [127, 0, 0, 2]).await;
    let gw = Gateway::start(&[], "").await;
    let mut spec = p.worker_spec();
    spec["api_key"] = json!("worker-secret");
    spec["unknown_key"] = json!("ignored");
    let r = gw.post("/workers", &spec).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["worker_id"].as_str().unwrap().to_string();

    let dup = gw.post("/workers", &spec).await;
    assert_eq!(dup.status, 409);
    assert_eq!(dup.json()["code"], "WORKER_ALREADY_EXISTS");
    for bad in ["HTTP://p:1", "p:1", "ftp://p:1"] {
        let r = gw
            .post("/workers", &json!({"url": bad, "worker_type": "prefill"}))
            .await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert_eq!(r.json()["code"], "BAD_REQUEST");
    }
    let ipc = gw
        .post(
            "/workers",
            &json!({"url": "ipc:///tmp/x.sock", "worker_type": "decode"}),
        )
        .await;
    assert_eq!(ipc.status, 400, "ipc:// must not become a PD leg");

    assert_eq!(gw.get("/workers/not-a-uuid").await.status, 400);
    let missing = gw
        .get("/workers/2b1f3a3e-8c1e-4e4b-9a6f-0c4c1f1d2e3f")
        .await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.json()["code"], "WORKER_NOT_FOUND");

    let w = wait_status(&gw, &id, "ready").await;
    assert_eq!(w["worker_type"], "prefill");
    assert_eq!(w["bootstrap_port"], json!(p.bootstrap_port()));
    // The transport from the registered `disaggregation_transfer_backend` label; an HTTP engine
    // reports no KV layout, which SMG 1.13.0 shows as one `?`.
    assert_eq!(w["pd_pairing"], "sglang/mooncake/?", "{w}");
    assert!(w.get("api_key").is_none(), "api_key echoed: {w}");
    let listing = gw.get("/workers").await.text();
    assert!(
        !listing.contains("worker-secret"),
        "api_key echoed in the list"
    );
    assert_eq!(gw.get("/workers?model=mock-model").await.json()["total"], 1);
    assert_eq!(
        gw.get("/workers?model=other-model").await.json()["total"],
        0
    );

    let patched = client::request(
        "PATCH",
        &gw.url(&format!("/workers/{id}")),
        &[("content-type", "application/json")],
        Some(Bytes::from(
            json!({"labels": {"zone": "a"}, "priority": 7}).to_string(),
        )),
    )
    .await
    .unwrap();
    assert_eq!(patched.status, 202, "{}", patched.text());
    let w = gw.get(&format!("/workers/{id}")).await.json();
    assert_eq!(w["labels"]["zone"], "a");
    assert_eq!(w["priority"], 7);
    assert_eq!(w["status"], "ready", "a patch must not reset health");
}

/// `DELETE`s the gateway's decode worker (202 expected); its id.
async fn delete_the_decode(gw: &Gateway) -> String {
    let list = gw.get("/workers").await.json();
    let decode_id = list["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["worker_type"] == "decode")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = client::request(
        "DELETE",
        &gw.url(&format!("/workers/{decode_id}")),
        &[],
        None,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 202);
    decode_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_worker_drains_then_disappears() {
    let p = engine(Role::Prefill, [127, 0, 0, 2]).await;
    let d = engine(Role::Decode, [127, 0, 0, 3]).await;
    let mut gw = Gateway::start(
        &[p.worker_spec(), d.worker_spec()],
        "  drain_settle_secs: 1\n",
    )
    .await;
    gw.wait_ready().await;
    let decode_id = delete_the_decode(&gw).await;
    let w = gw.get(&format!("/workers/{decode_id}")).await.json();
    assert_eq!(w["status"], "draining");
    let refused = gw.post("/generate", &json!({"text": "x"})).await;
    assert_eq!(refused.status, 503, "a draining worker was routed to");
    let mut gone = false;
    for _ in 0..100 {
        if gw.get(&format!("/workers/{decode_id}")).await.status == 404 {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone, "the worker was not removed after draining");
    assert!(d.records().is_empty());
}

/// A worker's own `health.drain_settle_secs` wins over the gateway's: with the gateway's at ten
/// minutes and the worker's at 0, a deleted worker is gone at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_own_drain_settle_wins() {
    let p = engine(Role::Prefill, [127, 0, 0, 2]).await;
    let d = engine(Role::Decode, [127, 0, 0, 3]).await;
    let mut decode = d.worker_spec();
    decode["health"] = json!({"drain_settle_secs": 0});
    let mut gw = Gateway::start(&[p.worker_spec(), decode], "  drain_settle_secs: 600\n").await;
    gw.wait_ready().await;
    let decode_id = delete_the_decode(&gw).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while gw.get(&format!("/workers/{decode_id}")).await.status != 404 {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker was not removed (its own drain_settle_secs: 0 was not applied)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_api_key_serving_and_worker_routes_need_it() {
    let p = engine(Role::Prefill, [127, 0, 0, 2]).await;
    let d = engine(Role::Decode, [127, 0, 0, 3]).await;
    let mut gw = Gateway::start(&[p.worker_spec(), d.worker_spec()], "  api_key: s3cret\n").await;
    gw.wait_ready().await;
    let body = json!({"text": "x", "sampling_params": {"max_new_tokens": 2}});
    let r = gw.post("/generate", &body).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    assert_eq!(
        r.json()["error"]["message"],
        "Missing API key: send it as `Authorization: Bearer <key>`"
    );
    let r = post_json_from(
        &gw,
        None,
        "/generate",
        &[("authorization", "Bearer wrong")],
        &body,
    )
    .await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["message"], "Invalid API key");
    assert!(
        p.records().is_empty() && d.records().is_empty(),
        "an unauthenticated request was forwarded"
    );
    let r = post_json_from(
        &gw,
        None,
        "/generate",
        &[("authorization", "Bearer s3cret")],
        &body,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    // The client's Authorization goes to both legs (SMG), the gateway's own key is not added.
    assert_eq!(
        d.records()[0].header("authorization"),
        Some("Bearer s3cret")
    );

    let spec = json!({"url": "http://127.0.0.9:9", "worker_type": "decode"});
    let r = gw.post("/workers", &spec).await;
    assert_eq!(r.status, 401);
    let r = post_json_from(
        &gw,
        None,
        "/workers",
        &[("authorization", "Bearer s3cret")],
        &spec,
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_key_only_trusted_peers_may_change_workers() {
    let gw = Gateway::start(&[], "  admin_trusted: [127.0.0.1]\n").await;
    let spec = json!({"url": "http://127.0.0.9:9", "worker_type": "decode"});
    let r = post_json_from(&gw, Some("127.0.0.2"), "/workers", &[], &spec).await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(
        gw.get("/workers").await.json()["total"],
        0,
        "a refused call changed something"
    );
    let r = client::request_with(
        &ClientOptions {
            source_ip: Some("127.0.0.2".parse().unwrap()),
            timeout: Some(Duration::from_secs(5)),
        },
        "DELETE",
        &gw.url("/workers/2b1f3a3e-8c1e-4e4b-9a6f-0c4c1f1d2e3f"),
        &[],
        None,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 403);
    // Reading is allowed from anywhere; changing from the trusted peer works.
    let r = client::request_with(
        &ClientOptions {
            source_ip: Some("127.0.0.2".parse().unwrap()),
            timeout: Some(Duration::from_secs(5)),
        },
        "GET",
        &gw.url("/workers"),
        &[],
        None,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
    let r = post_json_from(&gw, Some("127.0.0.1"), "/workers", &[], &spec).await;
    assert_eq!(r.status, 202, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_separate_admin_listener_takes_the_worker_api_off_the_data_port() {
    let admin_port = free_port();
    let gw = Gateway::start(&[], &format!("  admin_port: {admin_port}\n")).await;
    let spec = json!({"url": "http://127.0.0.9:9", "worker_type": "decode"});
    assert_eq!(gw.post("/workers", &spec).await.status, 404);
    let admin = format!("http://127.0.0.1:{admin_port}");
    let r = client::post_json(&format!("{admin}/workers"), &spec)
        .await
        .unwrap();
    assert_eq!(r.status, 202, "{}", r.text());
    let r = client::post_json(&format!("{admin}/generate"), &json!({"text": "x"}))
        .await
        .unwrap();
    assert_eq!(
        r.status, 404,
        "PD routes are not served on the admin listener"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_goes_to_one_prefill_without_a_decode_leg() {
    let p = engine(Role::Prefill, [127, 0, 0, 2]).await;
    let d = engine(Role::Decode, [127, 0, 0, 3]).await;
    let mut gw = Gateway::start(&[p.worker_spec(), d.worker_spec()], "").await;
    gw.wait_ready().await;
    let body = json!({"model": "mock-model", "messages": [{"role": "user", "content": "count these words please"}]});
    let r = gw.post("/v1/messages/count_tokens", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.json()["input_tokens"].as_u64().unwrap() > 0,
        "{}",
        r.text()
    );
    assert_eq!(
        r.header("x-smg-routed-worker-id"),
        Some(p.api_url().as_str())
    );
    assert!(
        d.records().is_empty(),
        "count_tokens reached the decode worker"
    );
}
