//! vLLM PD over HTTP: NIXL relay, Mooncake push, MoRI-IO READ/WRITE, and the validations and
//! fallbacks that turn a gateway's mistakes into visible failures.

use crate::common;

use std::time::Duration;

use common::*;
use mock_engine::client::{self, ClientOptions};
use mock_engine::output;
use mock_engine::{
    Connector, EngineKind, Fault, LoadFailurePolicy, MalformedParams, MockEngine, MockEngineConfig,
    Role,
};
use serde_json::{json, Value};

fn cfg(role: Role, ip: [u8; 4], c: Connector) -> MockEngineConfig {
    MockEngineConfig::test(EngineKind::Vllm, role, ip).with_connector(c)
}

/// The prefill leg as the gateway should build it (mock-engines-spec §1.3).
fn prefill_leg(body: &Value, tag: Value) -> Value {
    let mut b = body.clone();
    b["stream"] = json!(false);
    let o = b.as_object_mut().unwrap();
    o.remove("stream_options");
    o.remove("min_tokens");
    if o.contains_key("max_completion_tokens") {
        o.insert("max_completion_tokens".into(), json!(1));
        o.remove("max_tokens");
    } else if o.contains_key("max_output_tokens") {
        o.insert("max_output_tokens".into(), json!(1));
    } else {
        o.insert("max_tokens".into(), json!(1));
    }
    o.insert("kv_transfer_params".into(), tag);
    b
}

fn with_params(body: &Value, params: Value) -> Value {
    let mut b = body.clone();
    b["kv_transfer_params"] = params;
    b
}

fn chat(stream: bool) -> Value {
    let mut b = json!({"model":"mock-model","messages":[{"role":"user","content":"Explain KV caches in one line"}],"max_tokens":9,"stream":stream,"logprobs":true});
    if stream {
        b["stream_options"] = json!({"include_usage": true});
    }
    b
}

async fn reference(path: &str, body: &Value) -> output::Output {
    let both = engine(EngineKind::Vllm, Role::Both, [127, 0, 0, 1]).await;
    let r = post(&format!("{}{path}", both.api_url()), body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    output::extract(path, r.is_sse(), &r.body).unwrap()
}

const NIXL_TAG: &str = r#"{"do_remote_decode":true,"do_remote_prefill":false}"#;

#[tokio::test]
async fn vllm_nixl_relay_reproduces_the_reference() {
    let p = engine_with(cfg(Role::Prefill, [127, 0, 0, 2], Connector::Nixl)).await;
    let d = engine_with(cfg(Role::Decode, [127, 0, 0, 3], Connector::Nixl)).await;
    let routes = [
        ("/v1/chat/completions", chat(false)),
        ("/v1/chat/completions", chat(true)),
        (
            "/v1/completions",
            json!({"prompt":"The quick brown fox","max_tokens":7,"stream":false}),
        ),
        (
            "/v1/completions",
            json!({"prompt":"The quick brown fox","max_tokens":7,"stream":true}),
        ),
        (
            "/v1/responses",
            json!({"input":"hello","max_output_tokens":6}),
        ),
    ];
    for (i, (path, body)) in routes.iter().enumerate() {
        let want = reference(path, body).await;
        let pr = post(
            &format!("{}{path}", p.api_url()),
            &prefill_leg(body, serde_json::from_str(NIXL_TAG).unwrap()),
        )
        .await;
        assert_eq!(pr.status, 200, "{}", pr.text());
        let params = pr.json()["kv_transfer_params"].clone();
        assert_eq!(params["do_remote_prefill"], true, "{params}");
        assert_eq!(params["remote_engine_id"], json!(p.engine_id()));
        assert_eq!(params["remote_port"], json!(p.side_channel_port().unwrap()));
        assert!(
            params["remote_request_id"].as_str().unwrap().contains("-"),
            "internal id"
        );
        assert!(p.stats().pinned_blocks > 0);
        let dr = post(
            &format!("{}{path}", d.api_url()),
            &with_params(body, params.clone()),
        )
        .await;
        assert_eq!(dr.status, 200, "{}", dr.text());
        let got = output::extract(path, dr.is_sse(), &dr.body).unwrap();
        assert_eq!(got, want, "{path} #{i}");
        assert!(
            p.wait_for(SECS, |e| e.stats().pinned_blocks == 0).await,
            "notif frees the prefill blocks"
        );
        let drec = d.records().pop().unwrap();
        assert_eq!(drec.parsed.kv_transfer_params, Some(params));
        assert_eq!(drec.handoff.kv_source.as_deref(), Some("remote"));
        assert_eq!(drec.handoff.items[0].integrity.as_deref(), Some("ok"));
        let prec = p.records().pop().unwrap();
        assert_eq!(prec.outcome.completion_tokens, Some(1));
        assert!(!prec.parsed.stream && !prec.parsed.has_stream_options);
    }
    let streamed = d.records().into_iter().find(|r| r.parsed.stream).unwrap();
    assert_eq!(streamed.outcome.status, Some(200));
}

#[tokio::test]
async fn vllm_validations_reject_a_badly_rewritten_prefill_leg() {
    let p = engine_with(cfg(Role::Prefill, [127, 0, 0, 2], Connector::Nixl)).await;
    let url = format!("{}/v1/chat/completions", p.api_url());
    let mut b = prefill_leg(&chat(false), serde_json::from_str(NIXL_TAG).unwrap());
    b["stream_options"] = json!({"include_usage": true});
    let r = post(&url, &b).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error"]["message"],
        "Stream options can only be defined when `stream=True`."
    );
    assert_eq!(r.json()["error"]["code"], 400);
    let mut b = prefill_leg(&chat(false), serde_json::from_str(NIXL_TAG).unwrap());
    b["min_tokens"] = json!(5);
    let r = post(&url, &b).await;
    assert_eq!(r.status, 400);
    assert!(
        r.text()
            .contains("min_tokens must be less than or equal to max_tokens=1, got 5."),
        "{}",
        r.text()
    );
    let mut b = chat(false);
    b["kv_transfer_params"] = json!("do_remote_decode");
    assert_eq!(post(&url, &b).await.status, 400);
    // vLLM serves no /generate and ignores unknown fields such as bootstrap_*.
    assert_eq!(
        post(&format!("{}/generate", p.api_url()), &json!({"text":"x"}))
            .await
            .status,
        404
    );
    let mut b = chat(false);
    b["bootstrap_room"] = json!(1);
    assert_eq!(post(&url, &b).await.status, 200);
    // Discovery.
    assert_eq!(
        client::get(&format!("{}/v1/models", p.api_url()))
            .await
            .unwrap()
            .json()["data"][0]["owned_by"],
        "vllm"
    );
    assert_eq!(
        client::get(&format!("{}/version", p.api_url()))
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        client::get(&format!("{}/server_info", p.api_url()))
            .await
            .unwrap()
            .status,
        404
    );
    let m = client::get(&format!("{}/metrics", p.api_url()))
        .await
        .unwrap()
        .text();
    assert!(m.contains("vllm:num_requests_waiting") && m.contains("vllm:gpu_cache_usage_perc"));
}

#[tokio::test]
async fn vllm_eos_first_token_means_no_handoff_and_a_recompute() {
    let p = engine_with(cfg(Role::Prefill, [127, 0, 0, 2], Connector::Nixl)).await;
    let d = engine_with(cfg(Role::Decode, [127, 0, 0, 3], Connector::Nixl)).await;
    p.inject(Fault::EosFirstToken { count: Some(1) }).await;
    let body = chat(false);
    let pr = post(
        &format!("{}/v1/chat/completions", p.api_url()),
        &prefill_leg(&body, serde_json::from_str(NIXL_TAG).unwrap()),
    )
    .await;
    assert_eq!(pr.json()["kv_transfer_params"], Value::Null);
    assert_eq!(pr.json()["choices"][0]["finish_reason"], "stop");
    assert_eq!(p.stats().pinned_blocks, 0);
    let dr = post(&format!("{}/v1/chat/completions", d.api_url()), &body).await;
    assert_eq!(
        output::extract("/v1/chat/completions", false, &dr.body).unwrap(),
        reference("/v1/chat/completions", &body).await
    );
    assert_eq!(
        d.records()[0].handoff.kv_source.as_deref(),
        Some("recompute")
    );
    assert_eq!(d.stats().kv_recompute_total, 1);
    // With ignore_eos (what a gateway sets on MoRI prefill legs) the fault does not stop it.
    p.inject(Fault::EosFirstToken { count: Some(1) }).await;
    let mut leg = prefill_leg(&body, serde_json::from_str(NIXL_TAG).unwrap());
    leg["ignore_eos"] = json!(true);
    let pr = post(&format!("{}/v1/chat/completions", p.api_url()), &leg).await;
    assert_ne!(pr.json()["kv_transfer_params"], Value::Null);
}

#[tokio::test]
async fn vllm_uncapped_prefill_pins_extra_blocks_and_decode_reads_garbage() {
    let p = engine_with(cfg(Role::Prefill, [127, 0, 0, 2], Connector::Nixl)).await;
    let d = engine_with(cfg(Role::Decode, [127, 0, 0, 3], Connector::Nixl)).await;
    let body = json!({"prompt":"a b c","max_tokens":40});
    let mut leg = prefill_leg(&body, serde_json::from_str(NIXL_TAG).unwrap());
    leg["max_tokens"] = json!(40); // the gateway forgot the cap
    let pr = post(&format!("{}/v1/completions", p.api_url()), &leg).await;
    assert_eq!(pr.json()["usage"]["completion_tokens"], 40);
    let params = pr.json()["kv_transfer_params"].clone();
    assert!(params["remote_block_ids"][0].as_array().unwrap().len() > 1);
    let dr = post(
        &format!("{}/v1/completions", d.api_url()),
        &with_params(&body, params),
    )
    .await;
    assert_eq!(dr.status, 200);
    assert_ne!(
        output::extract("/v1/completions", false, &dr.body)
            .unwrap()
            .text(),
        reference("/v1/completions", &body).await.text()
    );
    assert_eq!(
        d.records()[0].handoff.items[0].integrity.as_deref(),
        Some("mismatch")
    );
}

#[tokio::test]
async fn vllm_unread_blocks_stay_pinned_until_the_abort_timeout() {
    let p = engine_with(cfg(Role::Prefill, [127, 0, 0, 2], Connector::Nixl)).await;
    let d = engine_with(cfg(Role::Decode, [127, 0, 0, 3], Connector::Nixl)).await;
    let body = chat(false);
    let pr = post(
        &format!("{}/v1/chat/completions", p.api_url()),
        &prefill_leg(&body, serde_json::from_str(NIXL_TAG).unwrap()),
    )
    .await;
    let mut params = pr.json()["kv_transfer_params"].clone();
    // V8: an altered remote_request_id — the read works, the notification frees nothing.
    params["remote_request_id"] = json!("chatcmpl-someone-else");
    let dr = post(
        &format!("{}/v1/chat/completions", d.api_url()),
        &with_params(&body, params),
    )
    .await;
    assert_eq!(
        output::extract("/v1/chat/completions", false, &dr.body).unwrap(),
        reference("/v1/chat/completions", &body).await
    );
    assert!(p.stats().pinned_blocks > 0);
    assert_eq!(p.pinned().len(), 1);
    assert!(
        p.wait_for(Duration::from_secs(5), |e| e.stats().pinned_blocks == 0)
            .await
    );
    assert_eq!(p.stats().kv_expired_unread_total, 1);
}

#[tokio::test]
async fn vllm_nixl_engine_id_mismatch_fails_or_recomputes_by_policy() {
    let p = engine_with(cfg(Role::Prefill, [127, 0, 0, 2], Connector::Nixl)).await;
    let d = engine_with(cfg(Role::Decode, [127, 0, 0, 3], Connector::Nixl)).await;
    let body = chat(false);
    let pr = post(
        &format!("{}/v1/chat/completions", p.api_url()),
        &prefill_leg(&body, serde_json::from_str(NIXL_TAG).unwrap()),
    )
    .await;
    let mut params = pr.json()["kv_transfer_params"].clone();
    params["remote_engine_id"] = json!("stale-engine");
    let dr = post(
        &format!("{}/v1/chat/completions", d.api_url()),
        &with_params(&body, params.clone()),
    )
    .await;
    assert_eq!(dr.status, 500);
    assert!(
        dr.text().contains(&format!(
            "Remote NIXL agent engine ID mismatch. Expected stale-engine,received {}.",
            p.engine_id()
        )),
        "{}",
        dr.text()
    );
    assert_eq!(dr.json()["error"]["code"], 500);
    // Streamed: 200 head, error frame, [DONE].
    let mut sb = with_params(&chat(true), params.clone());
    sb["stream"] = json!(true);
    let sr = post(&format!("{}/v1/chat/completions", d.api_url()), &sb).await;
    assert_eq!(sr.status, 200);
    assert!(sr.text().contains("\"code\":500") && sr.text().ends_with("data: [DONE]\n\n"));
    // recompute policy: correct text, kv_source=recompute.
    let d2 = engine_with(MockEngineConfig {
        kv_load_failure_policy: LoadFailurePolicy::Recompute,
        ..cfg(Role::Decode, [127, 0, 0, 4], Connector::Nixl)
    })
    .await;
    let dr = post(
        &format!("{}/v1/chat/completions", d2.api_url()),
        &with_params(&body, params.clone()),
    )
    .await;
    assert_eq!(dr.status, 200);
    assert_eq!(
        output::extract("/v1/chat/completions", false, &dr.body).unwrap(),
        reference("/v1/chat/completions", &body).await
    );
    assert_eq!(
        d2.records()[0].handoff.kv_source.as_deref(),
        Some("recompute")
    );
    // remote_host = localhost (the real default) dials the decode's own side, not the prefill.
    params["remote_engine_id"] = json!(p.engine_id());
    params["remote_host"] = json!("127.0.0.77");
    let dr = post(
        &format!("{}/v1/chat/completions", d.api_url()),
        &with_params(&body, params),
    )
    .await;
    assert_eq!(dr.status, 500);
}

#[tokio::test]
async fn vllm_stale_block_ids_read_whatever_the_slots_hold() {
    let small = |role, ip| MockEngineConfig {
        kv_tokens: 64,
        block_size: 16,
        ..cfg(role, ip, Connector::Nixl)
    };
    let p = engine_with(small(Role::Prefill, [127, 0, 0, 2])).await;
    let d = engine_with(small(Role::Decode, [127, 0, 0, 3])).await;
    let body = json!({"prompt":"one two three","max_tokens":4});
    let pr = post(
        &format!("{}/v1/completions", p.api_url()),
        &prefill_leg(&body, serde_json::from_str(NIXL_TAG).unwrap()),
    )
    .await;
    let params = pr.json()["kv_transfer_params"].clone();
    let dr = post(
        &format!("{}/v1/completions", d.api_url()),
        &with_params(&body, params.clone()),
    )
    .await;
    let want = reference("/v1/completions", &body).await;
    assert_eq!(
        output::extract("/v1/completions", false, &dr.body).unwrap(),
        want
    );
    // The pool is tiny: other requests reuse the freed slots.
    for i in 0..6 {
        let other = json!({"prompt":format!("other prompt {i}"),"max_tokens":1});
        post(
            &format!("{}/v1/completions", p.api_url()),
            &prefill_leg(&other, serde_json::from_str(NIXL_TAG).unwrap()),
        )
        .await;
    }
    // Replaying the old params (a gateway retry bug) silently reads foreign KV.
    let dr = post(
        &format!("{}/v1/completions", d.api_url()),
        &with_params(&body, params),
    )
    .await;
    assert_eq!(dr.status, 200);
    assert_ne!(
        output::extract("/v1/completions", false, &dr.body)
            .unwrap()
            .text(),
        want.text()
    );
}

fn mooncake_decode_params(p: &MockEngine, tid: &str) -> Value {
    json!({"do_remote_decode":false,"do_remote_prefill":true,"transfer_id":tid,"remote_engine_id":p.engine_id(),
        "remote_bootstrap_addr":format!("http://{}:{}", p.host(), p.bootstrap_port().unwrap())})
}

#[tokio::test]
async fn vllm_mooncake_push_by_transfer_id() {
    let p = engine_with(cfg(Role::Prefill, [127, 0, 0, 2], Connector::Mooncake)).await;
    let d = engine_with(cfg(Role::Decode, [127, 0, 0, 3], Connector::Mooncake)).await;
    let q = client::get(&format!(
        "http://{}:{}/query",
        p.host(),
        p.bootstrap_port().unwrap()
    ))
    .await
    .unwrap()
    .json();
    assert_eq!(q["0"]["engine_id"], json!(p.engine_id()));
    assert_eq!(
        q["0"]["worker_addr"]["0"]["0"],
        json!(format!(
            "tcp://{}:{}",
            p.host(),
            p.side_channel_port().unwrap()
        ))
    );
    let body = chat(true);
    let want = reference("/v1/chat/completions", &body).await;
    // Sequential.
    let tid = "xfer-0001";
    let pr = post(
        &format!("{}/v1/chat/completions", p.api_url()),
        &prefill_leg(
            &body,
            json!({"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":tid}),
        ),
    )
    .await;
    assert_eq!(
        pr.json()["kv_transfer_params"],
        Value::Null,
        "push model returns nothing"
    );
    assert!(p.stats().pinned_blocks > 0);
    let dr = post(
        &format!("{}/v1/chat/completions", d.api_url()),
        &with_params(&body, mooncake_decode_params(&p, tid)),
    )
    .await;
    assert_eq!(
        output::extract("/v1/chat/completions", true, &dr.body).unwrap(),
        want
    );
    assert_eq!(p.stats().pinned_blocks, 0);
    assert_eq!(
        d.records()[0].handoff.peer_addr,
        Some(format!(
            "http://{}:{}",
            p.host(),
            p.bootstrap_port().unwrap()
        ))
    );
    // Order-free: both legs at once.
    let tid = "xfer-0002";
    let pb = prefill_leg(
        &body,
        json!({"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":tid}),
    );
    let db = with_params(&body, mooncake_decode_params(&p, tid));
    let (_, dr) = tokio::join!(
        post(&format!("{}/v1/chat/completions", p.api_url()), &pb),
        post(&format!("{}/v1/chat/completions", d.api_url()), &db)
    );
    assert_eq!(
        output::extract("/v1/chat/completions", true, &dr.body).unwrap(),
        want
    );
    // Missing transfer_id on the prefill leg: nothing registered, the decode times out.
    let pr = post(
        &format!("{}/v1/chat/completions", p.api_url()),
        &prefill_leg(
            &body,
            json!({"do_remote_decode":true,"do_remote_prefill":false}),
        ),
    )
    .await;
    assert_eq!(pr.status, 200);
    assert_eq!(p.stats().pinned_blocks, 0);
    assert!(p
        .records()
        .last()
        .unwrap()
        .handoff
        .timeline
        .iter()
        .any(|(_, e)| e.contains("Missing transfer_id")));
    let mut nb = db.clone();
    nb["stream"] = json!(false);
    nb.as_object_mut().unwrap().remove("stream_options");
    nb["kv_transfer_params"]["transfer_id"] = json!("xfer-never");
    let dr = post(&format!("{}/v1/chat/completions", d.api_url()), &nb).await;
    assert_eq!(dr.status, 500);
    assert!(
        dr.text().contains("Timeout waiting for P side ready."),
        "{}",
        dr.text()
    );
    // After a restart without a pinned engine id, the registered id is stale.
    let old = p.engine_id();
    p.restart().await;
    assert_ne!(p.engine_id(), old);
    let tid = "xfer-0003";
    let pb = prefill_leg(
        &body,
        json!({"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":tid}),
    );
    post(&format!("{}/v1/chat/completions", p.api_url()), &pb).await;
    let mut stale = mooncake_decode_params(&p, tid);
    stale["remote_engine_id"] = json!(old);
    let mut sb = with_params(&body, stale);
    sb["stream"] = json!(false);
    sb.as_object_mut().unwrap().remove("stream_options");
    let dr = post(&format!("{}/v1/chat/completions", d.api_url()), &sb).await;
    assert_eq!(dr.status, 500);
    assert!(
        p.wait_for(Duration::from_secs(5), |e| e.stats().pinned_blocks == 0)
            .await,
        "expires unread"
    );
}

fn moriio_tag(tid: &str) -> Value {
    json!({"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":tid,"remote_dp_size":1})
}

#[tokio::test]
async fn vllm_moriio_read_and_malformed_params() {
    let p = engine_with(cfg(Role::Prefill, [127, 0, 0, 2], Connector::MoriioRead)).await;
    let d = engine_with(cfg(Role::Decode, [127, 0, 0, 3], Connector::MoriioRead)).await;
    let body = json!({"messages":[{"role":"user","content":"read mode"}],"max_tokens":5});
    let want = reference("/v1/chat/completions", &body).await;
    let mut leg = prefill_leg(&body, moriio_tag("xfer-r1"));
    leg["ignore_eos"] = json!(true);
    let pr = post(&format!("{}/v1/chat/completions", p.api_url()), &leg).await;
    let params = pr.json()["kv_transfer_params"].clone();
    assert_eq!(params["transfer_id"], "xfer-r1");
    assert_eq!(
        params["remote_handshake_port"],
        json!(p.side_channel_port().unwrap())
    );
    assert_eq!(
        params["remote_notify_port"],
        json!(p.notify_port().unwrap())
    );
    let dr = post(
        &format!("{}/v1/chat/completions", d.api_url()),
        &with_params(&body, params.clone()),
    )
    .await;
    assert_eq!(
        output::extract("/v1/chat/completions", false, &dr.body).unwrap(),
        want
    );
    assert!(
        p.wait_for(SECS, |e| e.stats().pinned_blocks == 0).await,
        "notify frees the blocks"
    );
    // No handoff: a MoRI decode never recomputes — garbage text.
    let dr = post(&format!("{}/v1/chat/completions", d.api_url()), &body).await;
    assert_eq!(dr.status, 200);
    assert_ne!(
        output::extract("/v1/chat/completions", false, &dr.body)
            .unwrap()
            .text(),
        want.text()
    );
    assert_eq!(
        d.records().last().unwrap().handoff.kv_source.as_deref(),
        Some("garbage")
    );
    // Missing transfer_id on the prefill leg: the scheduler's KeyError.
    let pr = post(
        &format!("{}/v1/chat/completions", p.api_url()),
        &prefill_leg(&body, json!({"do_remote_decode":true})),
    )
    .await;
    assert_eq!(pr.status, 500);
    assert!(pr.text().contains("transfer_id"));
    // Type-invalid field with --malformed-params crash: the engine is dead until restart.
    let dc = engine_with(MockEngineConfig {
        malformed_params: MalformedParams::Crash,
        ..cfg(Role::Decode, [127, 0, 0, 4], Connector::MoriioRead)
    })
    .await;
    let mut bad = params.clone();
    bad["remote_handshake_port"] = json!("abc");
    let dr = post(
        &format!("{}/v1/chat/completions", dc.api_url()),
        &with_params(&body, bad),
    )
    .await;
    assert_eq!(dr.status, 500);
    assert_eq!(
        client::get(&format!("{}/health", dc.api_url()))
            .await
            .unwrap()
            .status,
        503
    );
    assert_eq!(
        post(&format!("{}/v1/chat/completions", dc.api_url()), &body)
            .await
            .status,
        503
    );
    dc.restart().await;
    assert_eq!(
        client::get(&format!("{}/health", dc.api_url()))
            .await
            .unwrap()
            .status,
        200
    );
}

#[tokio::test]
async fn vllm_moriio_request_id_markers_win_over_fields() {
    let p = engine_with(cfg(Role::Prefill, [127, 0, 0, 2], Connector::MoriioRead)).await;
    let other = engine_with(cfg(Role::Prefill, [127, 0, 0, 5], Connector::MoriioRead)).await;
    let d = engine_with(cfg(Role::Decode, [127, 0, 0, 3], Connector::MoriioRead)).await;
    let body = json!({"messages":[{"role":"user","content":"markers"}],"max_tokens":4});
    let pr = post(
        &format!("{}/v1/chat/completions", p.api_url()),
        &prefill_leg(&body, moriio_tag("xfer-m")),
    )
    .await;
    let params = pr.json()["kv_transfer_params"].clone();
    let rid = format!(
        "___prefill_addr_{}:{}___decode_addr_{}:{}_abc123",
        other.host(),
        other.side_channel_port().unwrap(),
        d.host(),
        d.notify_port().unwrap()
    );
    let opts = ClientOptions {
        source_ip: None,
        timeout: Some(SECS),
    };
    let r = client::request_with(
        &opts,
        "POST",
        &format!("{}/v1/chat/completions", d.api_url()),
        &[("content-type", "application/json"), ("x-request-id", &rid)],
        Some(with_params(&body, params).to_string().into()),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        d.records()[0].handoff.peer_addr,
        Some(format!(
            "{}:{}",
            other.host(),
            other.side_channel_port().unwrap()
        ))
    );
    assert_ne!(
        output::extract("/v1/chat/completions", false, &r.body).unwrap(),
        reference("/v1/chat/completions", &body).await
    );
}

#[tokio::test]
async fn vllm_moriio_write_sequential_concurrent_and_leak() {
    let p = engine_with(cfg(Role::Prefill, [127, 0, 0, 2], Connector::MoriioWrite)).await;
    let d = engine_with(cfg(Role::Decode, [127, 0, 0, 3], Connector::MoriioWrite)).await;
    let body = json!({"prompt":"write mode prompt","max_tokens":6});
    let want = reference("/v1/completions", &body).await;
    let tag = |tid: &str| {
        json!({"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":tid,"remote_dp_size":1,
            "remote_host":d.host(),"remote_handshake_port":d.side_channel_port().unwrap(),"remote_notify_port":d.notify_port().unwrap()})
    };
    // Sequential: the prefill pushes first, the decode finds the data on arrival.
    let pr = post(
        &format!("{}/v1/completions", p.api_url()),
        &prefill_leg(&body, tag("xfer-w1")),
    )
    .await;
    let params = pr.json()["kv_transfer_params"].clone();
    assert_eq!(params["transfer_id"], "xfer-w1");
    assert_eq!(p.stats().pinned_blocks, 0, "pushed");
    let dr = post(
        &format!("{}/v1/completions", d.api_url()),
        &with_params(&body, params),
    )
    .await;
    assert_eq!(
        output::extract("/v1/completions", false, &dr.body).unwrap(),
        want
    );
    // Concurrent: the decode allocates and waits for the push.
    let minted = json!({"do_remote_decode":false,"do_remote_prefill":true,"transfer_id":"xfer-w2","remote_dp_size":1,
        "remote_host":p.host(),"remote_handshake_port":p.side_channel_port().unwrap(),"remote_notify_port":p.notify_port().unwrap()});
    let db = with_params(&body, minted.clone());
    let d_url = format!("{}/v1/completions", d.api_url());
    let dtask = tokio::spawn(async move { post(&d_url, &db).await });
    assert!(d.wait_for(SECS, |e| !e.rooms().is_empty()).await);
    post(
        &format!("{}/v1/completions", p.api_url()),
        &prefill_leg(&body, tag("xfer-w2")),
    )
    .await;
    let dr = dtask.await.unwrap();
    assert_eq!(
        output::extract("/v1/completions", false, &dr.body).unwrap(),
        want
    );
    assert_eq!(d.stats().leaked_allocs, 0);
    // A concurrent decode dropped before the push keeps its blocks (vLLM#59382)...
    let mut db = with_params(&body, minted.clone());
    db["kv_transfer_params"]["transfer_id"] = json!("xfer-w3");
    let d_url = format!("{}/v1/completions", d.api_url());
    let dtask = tokio::spawn(async move { post(&d_url, &db).await });
    assert!(d.wait_for(SECS, |e| !e.rooms().is_empty()).await);
    dtask.abort();
    assert!(
        d.wait_for(SECS, |e| e.stats().leaked_allocs > 0
            && e.rooms().is_empty())
            .await
    );
    let held = d.stats().leaked_allocs;
    // ...until its push lands (vLLM frees an aborted request's blocks on `finished_recving`).
    let mut db = with_params(&body, minted);
    db["kv_transfer_params"]["transfer_id"] = json!("xfer-w4");
    let d_url = format!("{}/v1/completions", d.api_url());
    let dtask = tokio::spawn(async move { post(&d_url, &db).await });
    assert!(d.wait_for(SECS, |e| !e.rooms().is_empty()).await);
    dtask.abort();
    assert!(
        d.wait_for(SECS, |e| e.stats().leaked_allocs > held
            && e.rooms().is_empty())
            .await
    );
    post(
        &format!("{}/v1/completions", p.api_url()),
        &prefill_leg(&body, tag("xfer-w4")),
    )
    .await;
    assert_eq!(
        d.stats().leaked_allocs,
        held,
        "the late push freed its allocation"
    );
    assert_eq!(p.stats().pinned_blocks, 0, "the late push was taken");
}
