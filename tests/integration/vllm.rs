//! vLLM over HTTP, end to end: sequential dispatch with NIXL, Mooncake and passthrough handoffs
//! against mock vLLM engines that really pin, read and push KV blocks.

use std::time::Duration;

use mock_engine::output::{self, Output};
use mock_engine::{
    Connector, EngineKind, Fault, FaultMatch, MockEngine, MockEngineConfig, RequestRecord, Role,
};
use serde_json::{json, Value};

use crate::harness::{metric_value, Gateway};

struct VllmFleet {
    prefill: MockEngine,
    decode: MockEngine,
    reference: MockEngine,
}

impl VllmFleet {
    async fn start(connector: Connector) -> VllmFleet {
        let spawn = |role, ip: [u8; 4]| {
            MockEngine::spawn(
                MockEngineConfig::test(EngineKind::Vllm, role, ip).with_connector(connector),
            )
        };
        VllmFleet {
            prefill: spawn(Role::Prefill, [127, 0, 0, 2]).await.unwrap(),
            decode: spawn(Role::Decode, [127, 0, 0, 3]).await.unwrap(),
            reference: spawn(Role::Both, [127, 0, 0, 4]).await.unwrap(),
        }
    }

    async fn gateway(&self, extra: &str) -> Gateway {
        let mut gw = Gateway::start(
            &[self.prefill.worker_spec(), self.decode.worker_spec()],
            extra,
        )
        .await;
        gw.wait_ready().await;
        gw
    }

    async fn reference(&self, path: &str, body: &Value) -> mock_engine::client::Response {
        mock_engine::client::post_json(&format!("{}{}", self.reference.api_url(), path), body)
            .await
            .unwrap()
    }

    /// Nothing stays pinned on the prefill once every request ended.
    async fn assert_nothing_pinned(&self) {
        let ok = self
            .prefill
            .wait_for(Duration::from_secs(5), |e| e.stats().pinned_blocks == 0)
            .await;
        assert!(
            ok,
            "blocks left pinned on the prefill: {:?}",
            self.prefill.pinned()
        );
    }
}

fn extract(path: &str, r: &mock_engine::client::Response) -> Output {
    output::extract(path, r.is_sse(), &r.body)
        .unwrap_or_else(|e| panic!("{path}: {e}: {}", r.text()))
}

fn last(records: &[RequestRecord]) -> &RequestRecord {
    records.last().expect("a record")
}

fn bodies(stream: bool) -> Vec<(&'static str, Value)> {
    vec![
        (
            "/v1/chat/completions",
            json!({"model": "mock-model", "messages": [{"role": "user", "content": "Tell me about KV caches"}],
                   "max_tokens": 8, "stream": stream}),
        ),
        (
            "/v1/completions",
            json!({"model": "mock-model", "prompt": "Disaggregated serving is", "max_tokens": 8, "stream": stream}),
        ),
        (
            "/v1/responses",
            json!({"model": "mock-model", "input": "Why split prefill and decode?", "max_output_tokens": 8, "stream": stream}),
        ),
    ]
}

async fn pd_equals_reference(connector: Connector) {
    let fleet = VllmFleet::start(connector).await;
    let gw = fleet.gateway("").await;
    for stream in [false, true] {
        for (path, body) in bodies(stream) {
            let pd = gw.post(path, &body).await;
            assert_eq!(pd.status, 200, "{path} stream={stream}: {}", pd.text());
            let reference = fleet.reference(path, &body).await;
            assert_eq!(
                extract(path, &pd),
                extract(path, &reference),
                "{path} stream={stream}"
            );
            let d = last(&fleet.decode.records()).clone();
            assert_eq!(
                d.handoff.kv_source.as_deref(),
                Some("remote"),
                "{path}: the decode recomputed"
            );
        }
    }
    fleet.assert_nothing_pinned().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nixl_pd_output_equals_reference_and_decode_reads_remote_kv() {
    pd_equals_reference(Connector::Nixl).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mooncake_pd_output_equals_reference_and_decode_reads_remote_kv() {
    pd_equals_reference(Connector::Mooncake).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prefill_leg_is_capped_on_the_routes_own_field_and_sent_first() {
    let fleet = VllmFleet::start(Connector::Nixl).await;
    let gw = fleet.gateway("").await;
    let chat = json!({"model": "mock-model", "messages": [{"role": "user", "content": "x"}],
        "max_completion_tokens": 6, "min_tokens": 2, "stream": true, "stream_options": {"include_usage": true},
        "kv_transfer_params": {"remote_host": "203.0.113.66", "remote_port": 1}});
    let r = gw.post("/v1/chat/completions", &chat).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let p = last(&fleet.prefill.records()).clone();
    let d = last(&fleet.decode.records()).clone();
    assert_eq!(p.body["max_completion_tokens"], 1);
    assert!(p.body.get("max_tokens").is_none());
    assert_eq!(p.body["stream"], false);
    assert!(p.body.get("stream_options").is_none() && p.body.get("min_tokens").is_none());
    assert_eq!(
        p.body["kv_transfer_params"],
        json!({"do_remote_decode": true, "do_remote_prefill": false})
    );
    assert!(
        p.outcome.done_at_ms.unwrap() <= d.arrive_ms,
        "the decode was sent before the prefill finished"
    );
    // The decode gets the client's request back, plus the prefill's params verbatim.
    assert_eq!(d.body["max_completion_tokens"], 6);
    assert_eq!(d.body["stream"], true);
    assert_eq!(d.body["stream_options"], json!({"include_usage": true}));
    assert_eq!(d.body["min_tokens"], 2);
    assert_eq!(
        d.body["kv_transfer_params"],
        p.handoff.returned_params.clone().unwrap(),
        "params not relayed verbatim"
    );
    assert_ne!(
        d.body["kv_transfer_params"]["remote_host"], "203.0.113.66",
        "the client steered the handoff"
    );
    assert_eq!(
        p.x_request_id, d.x_request_id,
        "legs carry different X-Request-Id"
    );
    assert!(p.x_request_id.is_some());

    for (path, body, field) in [
        (
            "/v1/completions",
            json!({"model": "mock-model", "prompt": "x", "max_tokens": 9}),
            "max_tokens",
        ),
        (
            "/v1/responses",
            json!({"model": "mock-model", "input": "x", "max_output_tokens": 9}),
            "max_output_tokens",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "mock-model", "messages": [{"role": "user", "content": "x"}]}),
            "max_tokens",
        ),
    ] {
        let r = gw.post(path, &body).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(
            last(&fleet.prefill.records()).body[field],
            1,
            "{path}: cap field"
        );
    }
    fleet.assert_nothing_pinned().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_64_kib_reaches_both_legs_whole_with_its_edits() {
    // Over 64 KiB each leg's body is pieces of the client's (written uncopied, in one
    // vectored write with its head): the edits and the client's bytes must still all arrive.
    let fleet = VllmFleet::start(Connector::Nixl).await;
    let gw = fleet.gateway("").await;
    let user = "u".repeat(100 * 1024);
    let chat = json!({"model": "mock-model", "messages": [{"role": "user", "content": "x"}],
        "user": user, "max_tokens": 3, "stream": false,
        "kv_transfer_params": {"remote_host": "203.0.113.66", "remote_port": 1}});
    let r = gw.post("/v1/chat/completions", &chat).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let p = last(&fleet.prefill.records()).clone();
    let d = last(&fleet.decode.records()).clone();
    for (leg, rec) in [("prefill", &p), ("decode", &d)] {
        assert!(
            rec.body["user"] == user.as_str(),
            "{leg}: the client's bytes changed"
        );
        assert_eq!(rec.body["messages"], chat["messages"], "{leg}");
    }
    assert_eq!(p.body["max_tokens"], 1);
    assert_eq!(
        p.body["kv_transfer_params"],
        json!({"do_remote_decode": true, "do_remote_prefill": false})
    );
    assert_eq!(d.body["max_tokens"], 3);
    assert_eq!(
        d.body["kv_transfer_params"],
        p.handoff.returned_params.clone().unwrap(),
        "params not relayed verbatim"
    );
    fleet.assert_nothing_pinned().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_above_one_skips_the_prefill_and_strips_client_handoff_fields() {
    let fleet = VllmFleet::start(Connector::Nixl).await;
    let gw = fleet.gateway("").await;
    let body = json!({"model": "mock-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "n": 2,
        "kv_transfer_params": {"do_remote_prefill": true, "remote_host": "203.0.113.66"}});
    let r = gw.post("/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(fleet.prefill.records().is_empty(), "n>1 sent a prefill leg");
    let d = last(&fleet.decode.records()).clone();
    assert_eq!(d.body["n"], 2);
    assert!(
        d.body.get("kv_transfer_params").is_none(),
        "client params reached the decode"
    );
    let m = gw.metrics().await;
    assert_eq!(
        metric_value(&m, "smg_pd_kv_connector_mode_total", &[("mode", "nixl")]),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mooncake_params_are_minted_with_one_transfer_id() {
    let fleet = VllmFleet::start(Connector::Mooncake).await;
    let gw = fleet.gateway("").await;
    let r = gw
        .post(
            "/v1/completions",
            &json!({"model": "mock-model", "prompt": "mooncake", "max_tokens": 4}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let p = last(&fleet.prefill.records()).body["kv_transfer_params"].clone();
    let d = last(&fleet.decode.records()).body["kv_transfer_params"].clone();
    let id = p["transfer_id"]
        .as_str()
        .expect("transfer_id on the prefill leg");
    assert!(id.starts_with("xfer-"));
    assert_eq!(p["do_remote_decode"], true);
    assert_eq!(d["transfer_id"], id);
    assert_eq!(d["do_remote_prefill"], true);
    assert_eq!(d["remote_engine_id"], fleet.prefill.engine_id());
    assert_eq!(
        d["remote_bootstrap_addr"],
        format!(
            "http://{}:{}",
            fleet.prefill.host(),
            fleet.prefill.bootstrap_port().unwrap()
        )
    );
    let m = gw.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "smg_pd_kv_connector_mode_total",
            &[("mode", "mooncake")]
        ),
        Some(1.0)
    );
    assert!(metric_value(
        &m,
        "smg_pd_prefill_duration_seconds_count",
        &[("runtime", "vllm")]
    )
    .is_some());
    // The KV window is a gRPC vLLM series (spec, "PD Metrics").
    assert_eq!(
        metric_value(&m, "smg_pd_kv_transfer_duration_seconds_count", &[]),
        None
    );
    fleet.assert_nothing_pinned().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nixl_prefill_without_params_falls_back_to_recompute_and_is_counted() {
    let fleet = VllmFleet::start(Connector::Nixl).await;
    let gw = fleet.gateway("").await;
    // The prefill's one token is EOS: vLLM hands off nothing (kv_transfer_params: null).
    fleet
        .prefill
        .inject(Fault::EosFirstToken { count: Some(1) })
        .await;
    let body = json!({"model": "mock-model", "prompt": "recompute me", "max_tokens": 5});
    let r = gw.post("/v1/completions", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let d = last(&fleet.decode.records()).clone();
    assert!(d.body.get("kv_transfer_params").is_none());
    assert_eq!(d.handoff.kv_source.as_deref(), Some("recompute"));
    assert_eq!(
        extract("/v1/completions", &r),
        extract(
            "/v1/completions",
            &fleet.reference("/v1/completions", &body).await
        )
    );
    let m = gw.metrics().await;
    assert_eq!(
        metric_value(&m, "smg_pd_kv_transfer_failures_total", &[]),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_relays_whatever_the_prefill_returns() {
    let fleet = VllmFleet::start(Connector::Nixl).await;
    // Registered by URL alone (no connector): passthrough. The engine still hands off when tagged,
    // but the gateway does not tag, so the prefill returns nothing and decode recomputes.
    let mut p = fleet.prefill.worker_spec();
    p.as_object_mut().unwrap().remove("kv_connector");
    p["labels"].as_object_mut().unwrap().remove("kv_connector");
    p.as_object_mut().unwrap().remove("runtime_type");
    let mut d = fleet.decode.worker_spec();
    d.as_object_mut().unwrap().remove("runtime_type");
    let mut gw = Gateway::start(&[p, d], "").await;
    gw.wait_ready().await;
    let workers = gw.get("/workers").await.json();
    assert_eq!(
        workers["workers"][0]["runtime_type"], "vllm",
        "runtime not detected from /v1/models"
    );
    let r = gw
        .post(
            "/v1/completions",
            &json!({"model": "mock-model", "prompt": "x", "max_tokens": 3}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let pr = last(&fleet.prefill.records()).clone();
    assert_eq!(
        pr.body["max_tokens"], 1,
        "passthrough still sends a one-token prefill"
    );
    assert!(pr.body.get("kv_transfer_params").is_none());
    let m = gw.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "smg_pd_kv_connector_mode_total",
            &[("mode", "passthrough")]
        ),
        Some(1.0)
    );
    fleet.assert_nothing_pinned().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefill_error_statuses_pass_through_and_decode_is_never_contacted() {
    let fleet = VllmFleet::start(Connector::Nixl).await;
    let gw = fleet.gateway("  retry_max_retries: 1\n").await;
    for status in [429u16, 400, 500] {
        fleet
            .prefill
            .inject(Fault::FailStatus {
                status,
                body: Some(json!({"error": {"message": format!("boom {status}")}}).to_string()),
                count: Some(1),
                matcher: FaultMatch::default(),
            })
            .await;
        let r = gw
            .post(
                "/v1/completions",
                &json!({"model": "mock-model", "prompt": "x", "max_tokens": 3}),
            )
            .await;
        assert_eq!(r.status, status, "{}", r.text());
        assert_eq!(r.json()["error"]["code"], "prefill_upstream_error");
        assert_eq!(r.json()["error"]["message"], format!("boom {status}"));
        let kind = match status {
            429 => "rate_limit_error",
            400 => "invalid_request_error",
            _ => "server_error",
        };
        assert_eq!(
            r.json()["error"]["type"],
            kind,
            "SMG 1.13.0's type for {status}"
        );
    }
    assert!(
        fleet.decode.records().is_empty(),
        "a failed prefill reached the decode"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_that_is_down_answers_502_decode_request_failed() {
    let fleet = VllmFleet::start(Connector::Nixl).await;
    let gw = fleet.gateway("  retry_max_retries: 1\n").await;
    fleet.decode.kill();
    let r = gw
        .post(
            "/v1/completions",
            &json!({"model": "mock-model", "prompt": "x", "max_tokens": 3}),
        )
        .await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "decode_request_failed");
    // The prefill pinned blocks for a decode that never came; they expire on the engine's timer.
    fleet.assert_nothing_pinned().await;
}
