//! The decode admission window and the context-length check on the gRPC path, through the real
//! binary: a full window makes a dispatch wait, then shed with `Retry-After`; a slot is released
//! however its decode leg ends; a client that leaves while waiting claims nothing; a prompt over
//! the smaller context window of the two legs is refused before any leg goes out.

use std::time::Duration;

use mock_engine::{EngineKind, Fault, GrpcCode, MockEngine, MockEngineConfig, Role};
use serde_json::json;

use crate::grpc_pd::{model_dir, refuse_generate, refuse_next_generate, vocab};
use crate::harness::Gateway;
use crate::http_admission::{a_client_leaving_claims_no_slot, chat, counter, occupy};

/// An SGLang gRPC pair whose decode runs `window` requests at once, emitting a token every
/// `itl_ms`.
async fn pair(ips: ([u8; 4], [u8; 4]), window: u32, itl_ms: u64) -> (MockEngine, MockEngine) {
    let p = MockEngine::spawn(
        MockEngineConfig::grpc_test(EngineKind::Sglang, Role::Prefill, ips.0).with_vocab(vocab()),
    )
    .await
    .unwrap();
    let mut dc =
        MockEngineConfig::grpc_test(EngineKind::Sglang, Role::Decode, ips.1).with_vocab(vocab());
    dc.max_running_requests = window;
    dc.itl_ms = itl_ms;
    // No natural end of text: a held stream ends only when the test lets it.
    dc.natural_stop_every = 0;
    let d = MockEngine::spawn(dc).await.unwrap();
    (p, d)
}

async fn gateway(p: &MockEngine, d: &MockEngine, wait_secs: u64) -> Gateway {
    let extra = format!(
        "  model_path: {}\n  pd_admission_wait_secs: {wait_secs}\n",
        model_dir().display()
    );
    let mut gw = Gateway::start(&[p.worker_spec(), d.worker_spec()], &extra).await;
    gw.wait_ready().await;
    gw
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_window_waits_then_sheds_with_retry_after() {
    let (p, d) = pair(([127, 0, 40, 1], [127, 0, 40, 2]), 1, 20).await;
    let gw = gateway(&p, &d, 1).await;
    let held = occupy(&gw).await;
    let r = gw.post("/v1/chat/completions", &chat(2, false)).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "worker_overload_protection_shed");
    assert!(r.header("retry-after").is_some(), "no Retry-After");
    assert_eq!(counter(&gw, "smg_pd_admission_sheds_total").await, 1.0);
    assert_eq!(
        d.records().len(),
        1,
        "the shed request never reached the decode"
    );
    assert_eq!(p.records().len(), 1, "nor the prefill");
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_wait_sheds_at_once_and_a_wait_admits_when_a_slot_frees() {
    let (p, d) = pair(([127, 0, 40, 3], [127, 0, 40, 4]), 1, 20).await;
    let gw = gateway(&p, &d, 0).await;
    let held = occupy(&gw).await;
    let r = gw.post("/v1/chat/completions", &chat(2, false)).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(counter(&gw, "smg_pd_admission_sheds_total").await, 1.0);
    drop(held);

    let gw = gateway(&p, &d, 30).await;
    let held = occupy(&gw).await;
    let waiting = {
        let url = gw.url("/v1/chat/completions");
        let body = chat(2, false);
        tokio::spawn(async move { mock_engine::client::post_json(url, &body).await })
    };
    // The second request waits for the slot; the first ends, and the second goes through.
    let waited = mock_engine::wait_until(Duration::from_secs(2), || {
        // A waiting request has not reached the decode yet.
        d.records().len() == 3
    })
    .await;
    assert!(!waited, "the second request did not wait for the slot");
    drop(held);
    let r = waiting.await.unwrap().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(counter(&gw, "smg_pd_admission_waits_total").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_is_released_however_its_decode_leg_ends() {
    let (p, d) = pair(([127, 0, 40, 5], [127, 0, 40, 6]), 1, 5).await;
    // Waits, not sheds: a slot that is never released would make a later request time out.
    let gw = gateway(&p, &d, 20).await;
    // 1. Answered.
    assert_eq!(
        gw.post("/v1/chat/completions", &chat(2, false))
            .await
            .status,
        200
    );
    // 2. The decode refused the leg.
    refuse_next_generate(&d, mock_engine::GrpcCode::InvalidArgument, None).await;
    assert_eq!(
        gw.post("/v1/chat/completions", &chat(2, false))
            .await
            .status,
        400
    );
    // The dropped prefill's Abort came after its Generate (if that was sent at all: same HTTP/2
    // connection), so no leg of this request can still reach the prefill and take the fault
    // meant for the next one.
    assert!(
        p.wait_for(Duration::from_secs(5), |e| !e.aborts().is_empty())
            .await,
        "the dropped prefill was not aborted"
    );
    // 3. The prefill refused the leg (the decode was waiting for KV). Refused until reset, not
    // once: step 2's dropped prefill call, when it went out, can still reach the engine after its
    // Abort (the engine serves each call in its own task; seen on a loaded machine), and a
    // one-shot refusal would go to that call instead of this request's.
    refuse_generate(&p, GrpcCode::InvalidArgument, None, None).await;
    assert_eq!(
        gw.post("/v1/chat/completions", &chat(2, false))
            .await
            .status,
        400
    );
    p.reset().await;
    assert_eq!(d.wait_records(3, Duration::from_secs(5)).await.len(), 3);
    // 4. The decode failed mid-stream.
    d.inject(Fault::FailAfterTokens {
        tokens: 2,
        code: GrpcCode::Internal,
        message: None,
        count: Some(1),
        matcher: Default::default(),
    })
    .await;
    let r = gw.post("/v1/chat/completions", &chat(8, true)).await;
    assert_eq!(r.status, 200);
    assert!(r.text().contains("error"), "{}", r.text());
    // 5. The client left mid-stream.
    drop(occupy(&gw).await);
    // 6. A stop string the gateway enforces ended the answer early.
    let mut body = chat(50, false);
    body["stop"] = json!(["e"]);
    assert_eq!(gw.post("/v1/chat/completions", &body).await.status, 200);
    // The window of one is free again: requests go through without waiting.
    for _ in 0..3 {
        let r = gw.post("/v1/chat/completions", &chat(2, false)).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(counter(&gw, "smg_pd_admission_sheds_total").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_while_waiting_claims_nothing() {
    let (p, d) = pair(([127, 0, 40, 7], [127, 0, 40, 8]), 1, 20).await;
    let gw = gateway(&p, &d, 30).await;
    a_client_leaving_claims_no_slot(&gw, &d).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_over_the_smaller_context_window_is_refused_before_any_leg() {
    let mut pc = MockEngineConfig::grpc_test(EngineKind::Sglang, Role::Prefill, [127, 0, 40, 9])
        .with_vocab(vocab());
    pc.max_model_len = 4096;
    let mut dc = MockEngineConfig::grpc_test(EngineKind::Sglang, Role::Decode, [127, 0, 40, 10])
        .with_vocab(vocab());
    dc.max_model_len = 40;
    let p = MockEngine::spawn(pc).await.unwrap();
    let d = MockEngine::spawn(dc).await.unwrap();
    let gw = gateway(&p, &d, 30).await;
    let long = "word ".repeat(60);
    let r = gw
        .post(
            "/v1/chat/completions",
            &json!({"model": "mock-model", "max_tokens": 2, "messages": [{"role": "user", "content": long}]}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    assert!(r.text().contains("40 tokens"), "{}", r.text());
    assert!(p.records().is_empty() && d.records().is_empty());
    // A short prompt fits.
    let r = gw
        .post(
            "/v1/chat/completions",
            &json!({"model": "mock-model", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
}
