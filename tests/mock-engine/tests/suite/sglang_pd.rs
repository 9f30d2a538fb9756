//! SGLang PD over HTTP: the rendezvous is real, so correct legs reproduce the single-worker
//! output and broken legs fail the way SGLang does.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use mock_engine::client::{self, ClientOptions};
use mock_engine::output::{self, Output};
use mock_engine::{EngineKind, Fault, FaultMatch, MockEngine, MockEngineConfig, Role};
use serde_json::{json, Value};

fn route_bodies(stream: bool) -> Vec<(&'static str, Value)> {
    let mut v = vec![
        (
            "/generate",
            json!({"text":"The capital of France is","sampling_params":{"max_new_tokens":8,"temperature":0},"return_logprob":true,"logprob_start_len":0,"stream":stream}),
        ),
        (
            "/v1/chat/completions",
            json!({"model":"mock-model","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello there"}],"max_tokens":7,"logprobs":true,"top_logprobs":2,"stream":stream}),
        ),
        (
            "/v1/completions",
            json!({"model":"mock-model","prompt":"Once upon a time","max_tokens":6,"stream":stream,"logprobs":1}),
        ),
        (
            "/v1/messages",
            json!({"model":"mock-model","system":"sys","messages":[{"role":"user","content":[{"type":"text","text":"Hi Claude"}]}],"max_tokens":5,"stream":stream}),
        ),
        (
            "/v1/responses",
            json!({"model":"mock-model","instructions":"be nice","input":"Tell me a story","max_output_tokens":9,"stream":stream}),
        ),
    ];
    if !stream {
        v.push((
            "/v1/rerank",
            json!({"query":"what is rust","documents":["a language","a fungus","oxidation"]}),
        ));
    }
    if stream {
        v[1].1["stream_options"] = json!({"include_usage": true});
    }
    v
}

async fn pair() -> (MockEngine, MockEngine, MockEngine) {
    let both = engine(EngineKind::Sglang, Role::Both, [127, 0, 0, 1]).await;
    let p = engine(EngineKind::Sglang, Role::Prefill, [127, 0, 0, 2]).await;
    let d = engine(EngineKind::Sglang, Role::Decode, [127, 0, 0, 3]).await;
    (both, p, d)
}

/// The bootstrap timeout of `slow_pair`: long enough that a test checking something happens
/// *before* the timeout can give it half this and still survive a loaded machine's stalls.
const SLOW_BOOTSTRAP: Duration = Duration::from_secs(6);

/// A prefill/decode pair whose bootstrap timeout is `SLOW_BOOTSTRAP`, for the tests that tell a
/// hang-up or an early head apart from the timeout (the default 2 s left them 1 s of margin).
async fn slow_pair() -> (MockEngine, MockEngine) {
    let slow = |role, ip| {
        let mut cfg = MockEngineConfig::test(EngineKind::Sglang, role, ip);
        cfg.bootstrap_timeout = SLOW_BOOTSTRAP;
        engine_with(cfg)
    };
    (
        slow(Role::Prefill, [127, 0, 0, 2]).await,
        slow(Role::Decode, [127, 0, 0, 3]).await,
    )
}

#[tokio::test]
async fn sglang_pd_output_equals_reference_on_every_route() {
    let (both, p, d) = pair().await;
    let mut n_requests = 0;
    for stream in [false, true] {
        for (path, body) in route_bodies(stream) {
            let reference = post(&format!("{}{path}", both.api_url()), &body).await;
            assert_eq!(
                reference.status,
                200,
                "{path} reference: {}",
                reference.text()
            );
            let r = room();
            let (pr, dr) = pd(&p, &d, path, &with_room(&body, &p, r)).await;
            n_requests += 1;
            assert_eq!(pr.status, 200, "{path} prefill: {}", pr.text());
            assert_eq!(dr.status, 200, "{path} decode: {}", dr.text());
            let sse = stream && path != "/v1/rerank";
            assert_eq!(dr.is_sse(), sse, "{path} content type");
            if sse {
                let t = dr.text();
                if matches!(
                    path,
                    "/generate" | "/v1/chat/completions" | "/v1/completions"
                ) {
                    assert!(t.ends_with("data: [DONE]\n\n"), "{path} stream end: {t}");
                }
            } else {
                assert_eq!(dr.header("content-type"), Some("application/json"));
            }
            let want = output::extract(path, sse, &reference.body).unwrap();
            let pout = output::extract(path, sse, &pr.body).unwrap();
            let got = output::extract(path, sse, &dr.body)
                .unwrap()
                .with_prefill_logprobs(&pout);
            assert!(
                want.error.is_none() && got.error.is_none(),
                "{path}: {want:?} {got:?}"
            );
            assert!(
                !want.text().is_empty() || want.scores.is_some(),
                "{path}: empty reference"
            );
            assert_eq!(
                got, want,
                "{path} stream={stream}: PD output differs from the reference"
            );
            if path == "/generate" {
                let lps = got.input_logprobs.clone().unwrap();
                assert_eq!(lps.len() as u64, got.prompt_tokens.unwrap());
                assert_eq!(lps[0], None);
                let d_only = output::extract(path, sse, &dr.body).unwrap();
                assert_eq!(
                    d_only.input_logprobs,
                    Some(vec![]),
                    "decode returns no prompt rows"
                );
                assert_eq!(
                    pout.token_ids.as_ref().unwrap()[0].len(),
                    1,
                    "prefill returns only t0"
                );
            }
        }
    }
    let precs = p.wait_records(n_requests, SECS).await;
    let drecs = d.wait_records(n_requests, SECS).await;
    for (pr, dr) in precs.iter().zip(&drecs) {
        assert_eq!(pr.handoff.room, dr.handoff.room);
        assert_eq!(
            dr.handoff.peer_addr.as_deref(),
            Some(format!("{}:{}", p.host(), p.bootstrap_port().unwrap()).as_str())
        );
        assert_eq!(dr.handoff.kv_source.as_deref(), Some("remote"));
        assert_eq!(dr.handoff.items[0].integrity.as_deref(), Some("ok"));
        assert_eq!(pr.outcome.status, Some(200));
        assert!(!pr.outcome.cancelled && !dr.outcome.cancelled);
        assert_eq!(dr.x_request_id.as_deref(), Some("req-test-1"));
    }
    let gen = &precs[0];
    assert_eq!(gen.path, "/generate");
    assert!(p.wait_idle(SECS).await && d.wait_idle(SECS).await);
    assert!(p.rooms().is_empty() && d.rooms().is_empty());
}

#[tokio::test]
async fn sglang_prefill_leg_reports_length_zero_and_t0() {
    let (_both, p, d) = pair().await;
    let body = json!({"text":"hello","sampling_params":{"max_new_tokens":4}});
    let (pr, dr) = pd(&p, &d, "/generate", &with_room(&body, &p, room())).await;
    let pv = pr.json();
    assert_eq!(
        pv["meta_info"]["finish_reason"],
        json!({"type":"length","length":0})
    );
    assert_eq!(pv["output_ids"].as_array().unwrap().len(), 1);
    let dv = dr.json();
    assert_eq!(
        dv["output_ids"][0], pv["output_ids"][0],
        "decode's first token is the prefill's t0"
    );
    assert_eq!(dv["meta_info"]["completion_tokens"], 4);
    assert_eq!(
        dv["meta_info"]["finish_reason"],
        json!({"type":"length","length":4})
    );
}

#[tokio::test]
async fn sglang_batched_requests_rendezvous_per_item() {
    let (both, p, d) = pair().await;
    let gen = json!({"input_ids":[[1,1001,1002],[1,1003],[1,1004,1005,1006]],"sampling_params":{"max_new_tokens":5}});
    let rooms = [room(), room(), room()];
    let reference = post(&format!("{}/generate", both.api_url()), &gen).await;
    let (pr, dr) = pd(&p, &d, "/generate", &with_rooms(&gen, &p, &rooms)).await;
    assert_eq!(
        (pr.status, dr.status),
        (200, 200),
        "{} {}",
        pr.text(),
        dr.text()
    );
    assert!(dr.json().is_array());
    assert_eq!(
        output::extract("/generate", false, &dr.body).unwrap(),
        output::extract("/generate", false, &reference.body).unwrap()
    );

    // Chat n>1 is one prompt: SGLang runs its samples as copies of the prompt's object, all in
    // `bootstrap_room[0]`, so the room array does not help and the extra sample stalls until
    // the engine's waiting timeout (SGLang PRs #24223, #26486; the gateway fans chat n>1 out).
    let chat = json!({"messages":[{"role":"user","content":"pick"}],"max_tokens":4,"n":2});
    let (_, dr) = pd(
        &p,
        &d,
        "/v1/chat/completions",
        &with_rooms(&chat, &p, &[room(), room()]),
    )
    .await;
    assert_ne!(
        dr.status,
        200,
        "chat n=2 in one request rendezvoused: {}",
        dr.text()
    );
    assert!(p.wait_idle(SECS).await && d.wait_idle(SECS).await);

    let comp = json!({"prompt":["a","b"],"max_tokens":3,"stream":true});
    let reference = post(&format!("{}/v1/completions", both.api_url()), &comp).await;
    let (_, dr) = pd(
        &p,
        &d,
        "/v1/completions",
        &with_rooms(&comp, &p, &[room(), room()]),
    )
    .await;
    assert_eq!(
        output::extract("/v1/completions", true, &dr.body).unwrap(),
        output::extract("/v1/completions", true, &reference.body).unwrap()
    );

    let recs = d.wait_records(3, SECS).await;
    assert_eq!(recs[0].handoff.rooms, rooms.to_vec());
    assert_eq!(recs[0].handoff.items.len(), 3);
    assert!(recs[0]
        .handoff
        .items
        .iter()
        .all(|i| i.kv_source.as_deref() == Some("remote")));
    assert!(p.wait_idle(SECS).await && d.wait_idle(SECS).await);
}

#[tokio::test]
async fn sglang_missing_or_malformed_room_is_rejected_with_400() {
    let (_both, p, d) = pair().await;
    let body = json!({"text":"x","bootstrap_host":p.host(),"bootstrap_port":p.bootstrap_port()});
    for e in [&p, &d] {
        let r = post(&format!("{}/generate", e.api_url()), &body).await;
        assert_eq!(r.status, 400);
        assert!(
            r.text()
                .contains("Disaggregated request received without bootstrap room id."),
            "{}",
            r.text()
        );
        let mut b = body.clone();
        b["bootstrap_room"] = json!(1.5);
        let r = post(
            &format!("{}/v1/chat/completions", e.api_url()),
            &json!({"messages":[{"role":"user","content":"x"}],"bootstrap_room":"12"}),
        )
        .await;
        assert_eq!(r.status, 400, "{}", r.text());
        let r = post(&format!("{}/generate", e.api_url()), &b).await;
        assert_eq!(r.status, 400);
        // Streamed: SGLang raises inside the generator — 200 head, error frame, [DONE].
        let mut s = body.clone();
        s["stream"] = json!(true);
        let r = post(&format!("{}/generate", e.api_url()), &s).await;
        assert_eq!(r.status, 200);
        let out = output::extract("/generate", true, &r.body).unwrap();
        assert!(out.error.unwrap().contains("without bootstrap room id"));
    }
}

#[tokio::test]
async fn sglang_different_rooms_time_out_on_both_legs() {
    let (_both, p, d) = pair().await;
    let body = json!({"text":"x","sampling_params":{"max_new_tokens":3}});
    let (r1, r2) = (room(), room());
    let t = Instant::now();
    let (b1, b2) = (with_room(&body, &p, r1), with_room(&body, &p, r2));
    let (pr, dr) = tokio::join!(
        post(&format!("{}/generate", p.api_url()), &b1),
        post(&format!("{}/generate", d.api_url()), &b2)
    );
    assert!(t.elapsed() >= Duration::from_secs(2));
    assert_eq!(pr.status, 500);
    assert!(
        pr.text().contains(&format!(
            "Request {r1} timed out after 2s in KVPoll.Bootstrapping"
        )),
        "{}",
        pr.text()
    );
    assert_eq!(dr.status, 500);
    assert!(
        dr.text().contains(&format!(
            "Request {r2} timed out after 2s in KVPoll.WaitingForInput"
        )),
        "{}",
        dr.text()
    );
    assert!(dr
        .text()
        .contains("Decode transfer failed for request rank=0"));
    assert!(
        p.wait_idle(SECS).await && d.wait_idle(SECS).await,
        "rooms left: {:?} {:?}",
        p.rooms(),
        d.rooms()
    );
}

#[tokio::test]
async fn sglang_stream_failure_is_an_abort_frame_after_a_200_head() {
    let (p, d) = slow_pair().await;
    let body = json!({"text":"x","stream":true,"sampling_params":{"max_new_tokens":3}});
    let opts = ClientOptions::default();
    let url = format!("{}/generate", d.api_url());
    let t = Instant::now();
    let s = client::stream(
        &opts,
        "POST",
        &url,
        &[],
        Some(with_room(&body, &p, room()).to_string().into()),
    )
    .await
    .unwrap();
    assert_eq!(s.status, 200);
    assert!(
        t.elapsed() < SLOW_BOOTSTRAP / 2,
        "stream head is sent at once, not when the room times out"
    );
    let b = s.body_bytes().await.unwrap();
    let text = String::from_utf8_lossy(&b);
    assert!(
        text.contains(r#""type":"abort""#) && text.contains(r#""status_code":500"#),
        "{text}"
    );
    assert!(text.ends_with("data: [DONE]\n\n"));
    let out = output::extract("/generate", true, &b).unwrap();
    assert!(out.error.unwrap().contains("KVPoll.WaitingForInput"));
    assert!(p.wait_idle(SECS).await && d.wait_idle(SECS).await);
    // OpenAI route: error object then [DONE] (no timing checked: the usual 2 s pair).
    let (_both, p, d) = pair().await;
    let chat = json!({"messages":[{"role":"user","content":"x"}],"stream":true,"max_tokens":2});
    let r = post(
        &format!("{}/v1/chat/completions", d.api_url()),
        &with_room(&chat, &p, room()),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(
        r.text().contains(r#""code":500"#) && r.text().ends_with("data: [DONE]\n\n"),
        "{}",
        r.text()
    );
    assert!(p.wait_idle(SECS).await && d.wait_idle(SECS).await);
}

#[tokio::test]
async fn sglang_single_leg_times_out_and_leaves_no_rooms() {
    let (_both, p, d) = pair().await;
    let body = json!({"text":"only one leg"});
    let pr = post(
        &format!("{}/generate", p.api_url()),
        &with_room(&body, &p, room()),
    )
    .await;
    assert_eq!(pr.status, 500);
    assert!(pr.text().contains("KVPoll.Bootstrapping"));
    assert!(p.wait_idle(SECS).await);
    let dr = post(
        &format!("{}/generate", d.api_url()),
        &with_room(&body, &p, room()),
    )
    .await;
    assert_eq!(dr.status, 500);
    assert!(dr.text().contains("KVPoll.WaitingForInput"));
    assert!(
        p.wait_idle(SECS).await && d.wait_idle(SECS).await,
        "{:?} {:?}",
        p.rooms(),
        d.rooms()
    );
    let precs = p.records();
    assert_eq!(
        precs.len(),
        1,
        "the decode never sends a request to the prefill's API"
    );
}

#[tokio::test]
async fn sglang_sequential_legs_deadlock_until_bootstrap_timeout() {
    let (_both, p, d) = pair().await;
    let body = with_room(&json!({"text":"seq"}), &p, room());
    let t = Instant::now();
    let pr = post(&format!("{}/generate", p.api_url()), &body).await;
    assert_eq!(pr.status, 500);
    assert!(t.elapsed() >= Duration::from_secs(2));
    assert!(d.records().is_empty());
}

#[tokio::test]
async fn hyper_drops_the_handler_when_the_client_hangs_up() {
    let (p, _d) = slow_pair().await;
    let url = format!("{}/generate", p.api_url());
    let body = with_room(&json!({"text":"x"}), &p, room());
    let opts = ClientOptions {
        source_ip: None,
        timeout: Some(Duration::from_millis(300)),
    };
    let t = Instant::now();
    let r = client::request_with(&opts, "POST", &url, &[], Some(body.to_string().into())).await;
    assert!(r.is_err(), "request times out client-side");
    // Cancelled, not failed: the handler was dropped by the hang-up, before the room timed out
    // (which would have answered 500 and recorded an error instead).
    let recs = p.wait_records(1, SECS).await;
    assert!(recs[0].outcome.cancelled, "{recs:?}");
    assert!(
        p.wait_idle(SLOW_BOOTSTRAP / 2).await,
        "room is released long before the bootstrap timeout: {:?}",
        p.rooms()
    );
    assert!(t.elapsed() < SLOW_BOOTSTRAP);
}

#[tokio::test]
async fn sglang_decode_dropped_mid_wait_withdraws_its_receiver() {
    let (p, d) = slow_pair().await;
    let body = with_room(&json!({"text":"x"}), &p, room());
    let url = format!("{}/generate", d.api_url());
    let d_task = tokio::spawn(async move {
        let s = client::stream(
            &ClientOptions::default(),
            "POST",
            &url,
            &[],
            Some(body.to_string().into()),
        )
        .await;
        s.map(|s| s.status)
    });
    // The decode registers with the prefill before any prefill request exists.
    assert!(
        p.wait_for(SECS, |e| e
            .rooms()
            .iter()
            .any(|r| r.state == "pending-receiver"))
            .await
    );
    d_task.abort();
    let _ = d_task.await;
    // Withdrawn, not timed out: both are idle well before the bootstrap timeout.
    assert!(p.wait_idle(SLOW_BOOTSTRAP / 2).await, "{:?}", p.rooms());
    assert!(d.wait_idle(SLOW_BOOTSTRAP / 2).await, "{:?}", d.rooms());
    let rec = &d.records()[0];
    assert!(rec.outcome.cancelled);
}

#[tokio::test]
async fn sglang_decode_dropped_while_prefill_waits_fails_the_prefill() {
    let (_both, p, d) = pair().await;
    let cfg = MockEngineConfig {
        ttft_ms: 800,
        ..MockEngineConfig::test(EngineKind::Sglang, Role::Prefill, [127, 0, 0, 4])
    };
    let slow_p = engine_with(cfg).await;
    let body = with_room(&json!({"text":"x"}), &slow_p, room());
    let p_req = tokio::spawn({
        let url = format!("{}/generate", slow_p.api_url());
        let body = body.clone();
        async move { post(&url, &body).await }
    });
    let d_url = format!("{}/generate", d.api_url());
    let d_task = tokio::spawn(async move { post(&d_url, &body).await });
    assert!(
        slow_p
            .wait_for(SECS, |e| e
                .rooms()
                .iter()
                .any(|r| r.state == "Transferring"))
            .await
    );
    d_task.abort();
    let pr = p_req.await.unwrap();
    assert_eq!(pr.status, 500);
    assert!(
        pr.text().contains("Decode instance could be dead"),
        "{}",
        pr.text()
    );
    assert!(slow_p.wait_idle(SECS).await && d.wait_idle(SECS).await);
    drop(p);
}

#[tokio::test]
async fn sglang_prefill_dropped_before_success_fails_the_decode() {
    let d = engine(EngineKind::Sglang, Role::Decode, [127, 0, 0, 3]).await;
    let cfg = MockEngineConfig {
        ttft_ms: 800,
        ..MockEngineConfig::test(EngineKind::Sglang, Role::Prefill, [127, 0, 0, 5])
    };
    let p = engine_with(cfg).await;
    let body = with_room(&json!({"text":"x","stream":true}), &p, room());
    let d_req = tokio::spawn({
        let url = format!("{}/generate", d.api_url());
        let body = body.clone();
        async move { post(&url, &body).await }
    });
    assert!(p.wait_for(SECS, |e| !e.rooms().is_empty()).await);
    let ps = client::stream(
        &ClientOptions::default(),
        "POST",
        &format!("{}/generate", p.api_url()),
        &[],
        Some(body.to_string().into()),
    )
    .await
    .unwrap();
    assert!(
        p.wait_for(SECS, |e| e
            .rooms()
            .iter()
            .any(|r| r.state == "Transferring"))
            .await
    );
    drop(ps); // the gateway closed the prefill body before Success
    let dr = d_req.await.unwrap();
    let out = output::extract("/generate", true, &dr.body).unwrap();
    assert!(
        out.error
            .as_deref()
            .unwrap_or("")
            .contains("Failed to get kvcache from prefill instance, it might be dead"),
        "{}",
        dr.text()
    );
    assert!(p.wait_idle(SECS).await && d.wait_idle(SECS).await);
    assert!(p.records()[0].outcome.cancelled);
}

#[tokio::test]
async fn sglang_decode_talks_to_the_prefill_it_was_pointed_at() {
    // The second prefill binds the first one's (ephemeral) bootstrap port on its own IP, which
    // no other test uses; should another process hold that port there, both are re-drawn.
    let (p2, p3, port) = loop {
        let p2 = engine(EngineKind::Sglang, Role::Prefill, [127, 0, 0, 2]).await;
        let port = p2.bootstrap_port().unwrap();
        let p3 = MockEngine::spawn(MockEngineConfig {
            bootstrap_port: port,
            ..MockEngineConfig::test(EngineKind::Sglang, Role::Prefill, [127, 0, 0, 33])
        })
        .await;
        match p3 {
            Ok(p3) => break (p2, p3, port),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
            Err(e) => panic!("spawn the second prefill: {e}"),
        }
    };
    assert_eq!(
        p3.bootstrap_port(),
        Some(port),
        "same bootstrap port, different hosts"
    );
    let d = engine(EngineKind::Sglang, Role::Decode, [127, 0, 0, 6]).await;
    let both = engine(EngineKind::Sglang, Role::Both, [127, 0, 0, 1]).await;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let p = if i % 2 == 0 { &p2 } else { &p3 };
        let body = with_room(
            &json!({"text":format!("prompt {i}"),"sampling_params":{"max_new_tokens":3}}),
            p,
            room(),
        );
        let (pu, du) = (
            format!("{}/generate", p.api_url()),
            format!("{}/generate", d.api_url()),
        );
        tasks.push(tokio::spawn(async move {
            tokio::join!(post(&pu, &body), post(&du, &body))
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        let (pr, dr) = t.await.unwrap();
        assert_eq!((pr.status, dr.status), (200, 200));
        let r = post(
            &format!("{}/generate", both.api_url()),
            &json!({"text":format!("prompt {i}"),"sampling_params":{"max_new_tokens":3}}),
        )
        .await;
        assert_eq!(
            dr.json()["text"],
            r.json()["text"],
            "request {i} got its own prefill's KV"
        );
    }
    for rec in d.wait_records(20, SECS).await {
        let host = rec.body["bootstrap_host"].as_str().unwrap().to_string();
        assert_eq!(rec.handoff.peer_addr, Some(format!("{host}:{port}")));
    }
    assert_eq!(p2.records().len(), 10);
    assert_eq!(p3.records().len(), 10);
    for p in [&p2, &p3] {
        for r in p.records() {
            assert_eq!(
                r.handoff.peer_addr.as_deref(),
                Some(format!("127.0.0.6:{}", d.data_port()).as_str())
            );
        }
    }
    // A decode pointed at the wrong prefill parks its receiver there: both legs time out.
    let body = with_room(&json!({"text":"crossed"}), &p3, room());
    let (pr, dr) = tokio::join!(
        post(&format!("{}/generate", p2.api_url()), &body),
        post(&format!("{}/generate", d.api_url()), &body)
    );
    assert_eq!((pr.status, dr.status), (500, 500));
    assert!(p2.wait_idle(SECS).await && p3.wait_idle(SECS).await && d.wait_idle(SECS).await);
}

#[tokio::test]
async fn sglang_null_bootstrap_port_uses_the_decode_default() {
    let p = engine(EngineKind::Sglang, Role::Prefill, [127, 0, 0, 2]).await;
    let good = MockEngineConfig {
        default_bootstrap_port: p.bootstrap_port().unwrap(),
        ..MockEngineConfig::test(EngineKind::Sglang, Role::Decode, [127, 0, 0, 7])
    };
    let d = engine_with(good).await;
    let mut body = with_room(&json!({"text":"x"}), &p, room());
    body["bootstrap_port"] = Value::Null;
    let (pr, dr) = pd(&p, &d, "/generate", &body).await;
    assert_eq!((pr.status, dr.status), (200, 200));
    // A decode with the real default (8998) dials host:8998, where nothing listens.
    let d2 = engine_with(MockEngineConfig {
        default_bootstrap_port: 8998,
        ..MockEngineConfig::test(EngineKind::Sglang, Role::Decode, [127, 0, 0, 8])
    })
    .await;
    body["bootstrap_room"] = json!(room());
    let dr = post(&format!("{}/generate", d2.api_url()), &body).await;
    assert_eq!(dr.status, 500);
    assert!(
        dr.text()
            .contains("Could not fetch prefill parallel info from 127.0.0.2:8998 after 3 attempts"),
        "{}",
        dr.text()
    );
    assert_eq!(d2.records()[0].handoff.items[0].route_attempts, 3);
    // A bootstrap port that is the prefill's API port: /route is 404 there.
    let mut body = with_room(&json!({"text":"x"}), &p, room());
    body["bootstrap_port"] = json!(p.port());
    let dr = post(&format!("{}/generate", d.api_url()), &body).await;
    assert_eq!(dr.status, 500);
    assert!(dr.text().contains("Could not fetch prefill parallel info"));
}

#[tokio::test]
async fn sglang_fake_bootstrap_host_decodes_over_missing_kv() {
    let (both, _p, d) = pair().await;
    let body = json!({"text":"warmup","sampling_params":{"max_new_tokens":4},"bootstrap_host":"2.2.2.2","bootstrap_port":8998,"bootstrap_room":7});
    let dr = post(&format!("{}/generate", d.api_url()), &body).await;
    assert_eq!(dr.status, 200);
    let reference = post(
        &format!("{}/generate", both.api_url()),
        &json!({"text":"warmup","sampling_params":{"max_new_tokens":4}}),
    )
    .await;
    assert_ne!(
        dr.json()["text"],
        reference.json()["text"],
        "no KV arrived: garbage text"
    );
    assert_eq!(d.records()[0].handoff.kv_source.as_deref(), Some("fake"));
}

#[tokio::test]
async fn sglang_kv_corrupt_gives_silently_wrong_text() {
    let (both, p, d) = pair().await;
    p.inject(Fault::KvCorrupt { count: Some(1) }).await;
    let body = json!({"text":"x y z","sampling_params":{"max_new_tokens":5}});
    let reference = post(&format!("{}/generate", both.api_url()), &body).await;
    let (_, dr) = pd(&p, &d, "/generate", &with_room(&body, &p, room())).await;
    assert_eq!(dr.status, 200);
    assert_ne!(dr.json()["text"], reference.json()["text"]);
}

#[tokio::test]
async fn sglang_bootstrap_down_and_killed_prefill_lose_the_decode() {
    let (_both, p, d) = pair().await;
    let body = with_room(&json!({"text":"x"}), &p, room());
    let d_url = format!("{}/generate", d.api_url());
    let b2 = body.clone();
    let dreq = tokio::spawn(async move { post(&d_url, &b2).await });
    assert!(p.wait_for(SECS, |e| !e.rooms().is_empty()).await);
    p.kill();
    let dr = dreq.await.unwrap();
    assert_eq!(dr.status, 500);
    assert!(
        dr.text().contains(&format!(
            "Lost connection with prefill instance (bootstrap_addr: {}:{})",
            p.host(),
            p.bootstrap_port().unwrap()
        )),
        "{}",
        dr.text()
    );
    assert!(d.wait_idle(SECS).await);

    let p = engine(EngineKind::Sglang, Role::Prefill, [127, 0, 0, 9]).await;
    p.inject(Fault::BootstrapDown).await;
    let dr = post(
        &format!("{}/generate", d.api_url()),
        &with_room(&json!({"text":"x"}), &p, room()),
    )
    .await;
    assert!(
        dr.text().contains("Could not fetch prefill parallel info"),
        "{}",
        dr.text()
    );
    p.reset().await;
    let (pr, dr) = pd(
        &p,
        &d,
        "/generate",
        &with_room(&json!({"text":"x"}), &p, room()),
    )
    .await;
    assert_eq!(
        (pr.status, dr.status),
        (200, 200),
        "bootstrap back after reset"
    );
}

#[tokio::test]
async fn faults_shape_responses() {
    let e = engine(EngineKind::Sglang, Role::Both, [127, 0, 0, 10]).await;
    let url = format!("{}/generate", e.api_url());
    let body = json!({"text":"x","sampling_params":{"max_new_tokens":3}});
    e.inject(Fault::FailStatus {
        status: 503,
        body: Some("{\"error\":\"boom\"}".into()),
        count: Some(1),
        matcher: FaultMatch {
            route: Some("/generate".into()),
            role: None,
        },
    })
    .await;
    let r = post(&url, &body).await;
    assert_eq!((r.status, r.text().as_str()), (503, "{\"error\":\"boom\"}"));
    assert_eq!(post(&url, &body).await.status, 200, "count 1");

    e.inject(Fault::DelayHead {
        ms: 300,
        count: Some(1),
        matcher: FaultMatch::default(),
    })
    .await;
    let t = Instant::now();
    assert_eq!(post(&url, &body).await.status, 200);
    assert!(t.elapsed() >= Duration::from_millis(300));

    e.inject(Fault::DropConnectionAfterHead {
        count: Some(1),
        matcher: FaultMatch::default(),
    })
    .await;
    let s = client::stream(
        &ClientOptions::default(),
        "POST",
        &url,
        &[],
        Some(body.to_string().into()),
    )
    .await
    .unwrap();
    assert_eq!(s.status, 200);
    assert!(
        s.body_bytes().await.is_err(),
        "connection cut after the head"
    );

    e.inject(Fault::StallAfterHead {
        count: Some(1),
        matcher: FaultMatch::default(),
    })
    .await;
    let mut s = client::stream(
        &ClientOptions::default(),
        "POST",
        &url,
        &[],
        Some(body.to_string().into()),
    )
    .await
    .unwrap();
    assert_eq!(s.status, 200);
    assert!(
        tokio::time::timeout(Duration::from_millis(200), s.next_chunk())
            .await
            .is_err(),
        "no body"
    );
    drop(s);

    e.inject(Fault::Hang {
        count: Some(1),
        matcher: FaultMatch::default(),
    })
    .await;
    let opts = ClientOptions {
        source_ip: None,
        timeout: Some(Duration::from_millis(200)),
    };
    assert!(
        client::request_with(&opts, "POST", &url, &[], Some(body.to_string().into()))
            .await
            .is_err()
    );

    e.inject(Fault::EosFirstToken { count: Some(1) }).await;
    let r = post(&url, &body).await.json();
    assert_eq!(r["output_ids"], json!([2]));
    assert_eq!(
        r["meta_info"]["finish_reason"],
        json!({"type":"stop","matched":2})
    );

    // Faults through the HTTP control plane.
    let f = client::post_json(
        &format!("{}/mock/faults", e.api_url()),
        &json!({"kind":"fail_status","status":429,"count":1}),
    )
    .await
    .unwrap();
    assert_eq!(f.status, 200);
    assert_eq!(post(&url, &body).await.status, 429);
    assert!(
        e.wait_for(SECS, |e| e.stats().requests_in_flight == 0)
            .await
    );
    let recs = e.records();
    assert!(
        recs.iter().any(|r| r.outcome.cancelled),
        "hang/stall records are cancelled"
    );
    client::post_json(&format!("{}/mock/reset", e.api_url()), &json!({}))
        .await
        .unwrap();
    assert!(e.records().is_empty());
}

#[tokio::test]
async fn control_and_discovery_endpoints() {
    let p = engine(EngineKind::Sglang, Role::Prefill, [127, 0, 0, 11]).await;
    let get = |path: &str| {
        let u = format!("{}{path}", p.api_url());
        async move { client::get(&u).await.unwrap() }
    };
    assert_eq!(get("/health").await.status, 200);
    assert_eq!(get("/health_generate").await.status, 200);
    assert_eq!(
        get("/v1/models").await.json()["data"][0]["owned_by"],
        "sglang"
    );
    let si = get("/server_info").await.json();
    assert_eq!(si["disaggregation_mode"], "prefill");
    assert_eq!(
        si["disaggregation_bootstrap_port"],
        p.bootstrap_port().unwrap()
    );
    assert_eq!(si["disaggregation_transfer_backend"], "mooncake");
    for k in [
        "dp_size",
        "page_size",
        "kv_cache_dtype",
        "max_running_requests",
    ] {
        assert!(si.get(k).is_some(), "{k}");
    }
    assert_eq!(get("/get_server_info").await.status, 200);
    assert_eq!(get("/model_info").await.status, 200);
    let loads = get("/v1/loads?include=core,disagg,queues,memory")
        .await
        .json();
    assert!(loads["loads"][0].get("num_waiting_reqs").is_some());
    let m = get("/metrics").await.text();
    assert!(m.contains("sglang:num_running_reqs") && m.contains("mock_rooms_open"));
    assert_eq!(get("/mock/rooms").await.json(), json!([]));
    assert_eq!(get("/mock/stats").await.json()["role"], "prefill");
    assert_eq!(get("/nope").await.status, 404);
    let ct = client::post_json(
        format!("{}/v1/messages/count_tokens", p.api_url()),
        &json!({"model":"mock-model","messages":[{"role":"user","content":"count me"}]}),
    )
    .await
    .unwrap();
    assert!(ct.json()["input_tokens"].as_u64().unwrap() > 2);
    assert!(
        p.records().is_empty(),
        "token counting is not a generation request"
    );
    // Bootstrap server texts.
    let b = format!("http://{}:{}", p.host(), p.bootstrap_port().unwrap());
    let r = client::get(&format!("{b}/route?prefill_dp_rank=-1"))
        .await
        .unwrap();
    assert_eq!(
        (r.status, r.text().as_str()),
        (400, "Missing inputs for bootstrap server.")
    );
    let r = client::get(&format!(
        "{b}/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
    ))
    .await
    .unwrap();
    assert_eq!(r.json()["dp_size"], 1);
    let r = client::get(&format!(
        "{b}/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"
    ))
    .await
    .unwrap();
    assert_eq!(r.json()["rank_port"], p.data_port());
    let r = client::get(&format!(
        "{b}/route?prefill_dp_rank=5&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"
    ))
    .await
    .unwrap();
    assert_eq!(r.status, 404);
    assert!(r
        .text()
        .starts_with("Bootstrap info not found for dp_rank=5"));
    assert_eq!(
        client::get(&format!("{b}/health")).await.unwrap().text(),
        "OK"
    );
    // Records carry headers and the parsed handoff fields.
    let body =
        json!({"text":"x","bootstrap_host":"127.0.0.11","bootstrap_port":1,"bootstrap_room":99});
    let opts = ClientOptions {
        source_ip: Some([127, 0, 0, 2].into()),
        timeout: Some(Duration::from_millis(200)),
    };
    let _ = client::request_with(
        &opts,
        "POST",
        &format!("{}/generate", p.api_url()),
        &[
            ("authorization", "Bearer k"),
            ("traceparent", "00-abc-def-01"),
        ],
        Some(body.to_string().into()),
    )
    .await;
    let recs = get("/mock/requests").await.json();
    assert_eq!(recs[0]["headers"]["authorization"], "Bearer k");
    assert_eq!(recs[0]["parsed"]["bootstrap_room"], 99);
    assert!(recs[0]["client_addr"]
        .as_str()
        .unwrap()
        .starts_with("127.0.0.2:"));
}

#[tokio::test]
async fn sglang_dp_rank_conflict_fails_like_follow_bootstrap_room() {
    let cfg = |role, ip| MockEngineConfig {
        dp_size: 2,
        ..MockEngineConfig::test(EngineKind::Sglang, role, ip)
    };
    let p = engine_with(cfg(Role::Prefill, [127, 0, 0, 12])).await;
    let d = engine_with(cfg(Role::Decode, [127, 0, 0, 13])).await;
    let r = room() & !1; // even room ⇒ rank 0
    let mut body = with_room(&json!({"text":"dp"}), &p, r);
    body["routed_dp_rank"] = json!(1);
    let pr = post(&format!("{}/generate", p.api_url()), &body).await;
    assert_eq!(pr.status, 500);
    assert!(
        pr.text().contains("follow_bootstrap_room conflict"),
        "{}",
        pr.text()
    );
    body["routed_dp_rank"] = json!(0);
    body["disagg_prefill_dp_rank"] = json!(0);
    let (pr, dr) = pd(&p, &d, "/generate", &body).await;
    assert_eq!((pr.status, dr.status), (200, 200));
}

#[tokio::test]
async fn output_extract_reads_errors_and_the_fake_model_is_pure() {
    let e = Output::default();
    assert_eq!(e.text(), "");
    let out = output::extract(
        "/v1/chat/completions",
        false,
        br#"{"object":"error","message":"bad","code":400}"#,
    )
    .unwrap();
    assert_eq!(out.error.as_deref(), Some("bad"));
    let spec = mock_engine::fake_model::SamplingSpec {
        max_new_tokens: 4,
        ..Default::default()
    };
    let ids = mock_engine::fake_model::encode_prompt("mock-model", "hello");
    let r = mock_engine::fake_model::reference("mock-model", &ids, &spec, None);
    let both = engine(EngineKind::Sglang, Role::Both, [127, 0, 0, 1]).await;
    let resp = post(
        &format!("{}/generate", both.api_url()),
        &json!({"text":"hello","sampling_params":{"max_new_tokens":4}}),
    )
    .await;
    assert_eq!(resp.json()["text"], r.text);
}

#[tokio::test]
async fn binary_prints_ready_and_exits_on_sigterm() {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mock-engine"))
        .args([
            "--role",
            "prefill",
            "--host",
            "127.0.0.14",
            "--port",
            "0",
            "--bootstrap-port",
            "0",
            "--ttft-ms",
            "1",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("READY api=http://127.0.0.14:"), "{line}");
    let api = line
        .split_whitespace()
        .nth(1)
        .unwrap()
        .trim_start_matches("api=")
        .to_string();
    let boot: u16 = line
        .split_whitespace()
        .nth(2)
        .unwrap()
        .trim_start_matches("bootstrap=")
        .parse()
        .unwrap();
    assert!(boot > 0);
    assert_eq!(
        client::get(&format!("{api}/health")).await.unwrap().status,
        200
    );
    std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + SECS;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success() || st.code().is_none(), "{st:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "mock-engine did not exit on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn fleet_spawns_pairs_on_distinct_loopback_ips() {
    let fleet = mock_engine::MockFleet::pd(
        2,
        1,
        MockEngineConfig::test(EngineKind::Sglang, Role::Both, [127, 0, 0, 1]),
    )
    .await
    .unwrap();
    let specs = fleet.worker_specs();
    assert_eq!(specs.len(), 3);
    assert_eq!(specs[0]["worker_type"], "prefill");
    assert_eq!(
        specs[0]["bootstrap_port"],
        json!(fleet.prefills[0].bootstrap_port().unwrap())
    );
    assert_eq!(specs[2]["worker_type"], "decode");
    assert_ne!(fleet.prefills[0].host(), fleet.prefills[1].host());
    let (p, d) = (&fleet.prefills[1], &fleet.decodes[0]);
    let (pr, dr) = pd(
        p,
        d,
        "/generate",
        &with_room(&json!({"text":"fleet"}), p, room()),
    )
    .await;
    assert_eq!((pr.status, dr.status), (200, 200));
    assert!(fleet.wait_idle(SECS).await);
}
