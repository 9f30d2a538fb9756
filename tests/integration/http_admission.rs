//! The decode admission window on HTTP workers, through the real binary: the window comes from
//! the engine's own report (SGLang `/get_server_info`) or a registration label; a full window
//! makes a dispatch wait, then shed with `Retry-After`; a slot is released however its decode leg
//! ends; a client that leaves while waiting claims nothing; a decode with no window is not gated.
//! Mocks on 127.0.50.x.

use std::time::Duration;

use mock_engine::{EngineKind, Fault, FaultMatch, MockEngine, MockEngineConfig, Role};
use serde_json::{json, Value};

use crate::harness::{metric_value, Gateway};

/// An SGLang HTTP pair whose decode reports a running window of `window`, emitting a token every
/// `itl_ms`.
pub(crate) async fn sglang_pair(
    ips: ([u8; 4], [u8; 4]),
    window: u32,
    itl_ms: u64,
) -> (MockEngine, MockEngine) {
    let p = MockEngine::spawn(MockEngineConfig::test(
        EngineKind::Sglang,
        Role::Prefill,
        ips.0,
    ))
    .await
    .unwrap();
    let mut dc = MockEngineConfig::test(EngineKind::Sglang, Role::Decode, ips.1);
    dc.max_running_requests = window;
    dc.itl_ms = itl_ms;
    // No natural end of text: a held stream ends only when the test lets it.
    dc.natural_stop_every = 0;
    let d = MockEngine::spawn(dc).await.unwrap();
    (p, d)
}

async fn gateway(workers: &[Value], wait_secs: u64) -> Gateway {
    let extra = format!("  pd_admission_wait_secs: {wait_secs}\n");
    let mut gw = Gateway::start(workers, &extra).await;
    gw.wait_ready().await;
    gw
}

pub(crate) fn chat(max_tokens: u32, stream: bool) -> Value {
    json!({"model": "mock-model", "max_tokens": max_tokens, "stream": stream, "ignore_eos": true,
        "messages": [{"role": "user", "content": "Tell me a long story."}]})
}

pub(crate) async fn counter(gw: &Gateway, name: &str) -> f64 {
    metric_value(&gw.metrics().await, name, &[]).unwrap_or(0.0)
}

/// Holds one decode slot (and one admission place): a long streamed answer, read up to its
/// first chunk.
pub(crate) async fn occupy(gw: &Gateway) -> mock_engine::client::StreamingResponse {
    let mut s = gw.stream("/v1/chat/completions", &chat(5000, true)).await;
    assert_eq!(s.status, 200);
    s.next_chunk()
        .await
        .expect("a first chunk")
        .expect("readable");
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_decode_window_from_get_server_info_waits_then_sheds_with_retry_after() {
    let (p, d) = sglang_pair(([127, 0, 50, 1], [127, 0, 50, 2]), 1, 20).await;
    let gw = gateway(&[p.worker_spec(), d.worker_spec()], 1).await;
    // The window is what the engine reported at registration.
    let workers = gw.get("/workers").await.json();
    let decode = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["worker_type"] == "decode")
        .cloned()
        .unwrap();
    assert_eq!(decode["labels"]["max_running_requests"], "1", "{decode}");

    let held = occupy(&gw).await;
    let started = std::time::Instant::now();
    let r = gw.post("/v1/chat/completions", &chat(2, false)).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "worker_overload_protection_shed");
    assert!(r.header("retry-after").is_some(), "no Retry-After");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "shed before the wait ran out"
    );
    assert_eq!(counter(&gw, "smg_pd_admission_sheds_total").await, 1.0);
    assert_eq!(d.records().len(), 1, "the shed request reached the decode");
    assert_eq!(p.records().len(), 1, "the shed request reached the prefill");
    drop(held);

    // With a longer wait the same request is admitted once the slot frees.
    let gw = gateway(&[p.worker_spec(), d.worker_spec()], 30).await;
    let held = occupy(&gw).await;
    let waiting = {
        let url = gw.url("/v1/chat/completions");
        let body = chat(2, false);
        tokio::spawn(async move { mock_engine::client::post_json(url, &body).await })
    };
    // A waiting request has not reached the decode yet.
    let dispatched =
        mock_engine::wait_until(Duration::from_secs(2), || d.records().len() == 3).await;
    assert!(!dispatched, "the second request did not wait for the slot");
    drop(held);
    let r = waiting.await.unwrap().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(counter(&gw, "smg_pd_admission_waits_total").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_slot_is_released_however_its_decode_leg_ends() {
    let (p, d) = sglang_pair(([127, 0, 50, 3], [127, 0, 50, 4]), 1, 5).await;
    // Waits, not sheds: a slot never released would make a later request wait 20 s and fail.
    let gw = gateway(&[p.worker_spec(), d.worker_spec()], 20).await;
    let fail = |status| Fault::FailStatus {
        status,
        body: None,
        count: Some(1),
        matcher: FaultMatch::default(),
    };
    // 1. Answered.
    assert_eq!(
        gw.post("/v1/chat/completions", &chat(2, false))
            .await
            .status,
        200
    );
    // 2. The decode refused the leg.
    d.inject(fail(400)).await;
    assert_eq!(
        gw.post("/v1/chat/completions", &chat(2, false))
            .await
            .status,
        400
    );
    // 3. The prefill refused the leg (the decode was waiting for KV and was dropped). The
    // fault holds until reset: step 2's prefill leg, dropped when its decode refused, may reach
    // the engine after this point and would take a one-time fault meant for this step.
    p.inject(Fault::FailStatus {
        status: 400,
        body: None,
        count: None,
        matcher: FaultMatch::default(),
    })
    .await;
    assert_eq!(
        gw.post("/v1/chat/completions", &chat(2, false))
            .await
            .status,
        400
    );
    p.reset().await;
    // 4. The decode broke after its head (held until reset, for the same reason). Once the
    // stream has started the client gets an error event; if the break is seen before (the
    // prefill's head not yet in), every attempt breaks and the client gets a 5xx.
    d.inject(Fault::DropConnectionAfterHead {
        count: None,
        matcher: FaultMatch::default(),
    })
    .await;
    let r = gw.post("/v1/chat/completions", &chat(8, true)).await;
    assert!(
        (r.status == 200 && r.text().contains("error")) || r.status >= 500,
        "{} {}",
        r.status,
        r.text()
    );
    d.reset().await;
    // 5. The client left mid-stream.
    drop(occupy(&gw).await);
    // The window of one is free again: requests go through without waiting.
    for _ in 0..3 {
        let r = gw.post("/v1/chat/completions", &chat(2, false)).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // (A request may wait a moment for a slot its predecessor is still letting go of: the
    // client can see an answer end before the gateway's attempt returned. A leaked slot would
    // make it wait the whole 20 s and be shed.)
    assert_eq!(counter(&gw, "smg_pd_admission_sheds_total").await, 0.0);
    // And the window still holds: with its slot taken, the next request waits for it.
    let waits = counter(&gw, "smg_pd_admission_waits_total").await;
    let held = occupy(&gw).await;
    let before = d.records().len();
    let waiting = {
        let url = gw.url("/v1/chat/completions");
        let body = chat(2, false);
        tokio::spawn(async move { mock_engine::client::post_json(url, &body).await })
    };
    let dispatched =
        mock_engine::wait_until(Duration::from_millis(500), || d.records().len() > before).await;
    assert!(!dispatched, "a request went past a full window");
    drop(held);
    assert_eq!(waiting.await.unwrap().unwrap().status, 200);
    assert!(counter(&gw, "smg_pd_admission_waits_total").await > waits);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_client_leaving_while_waiting_claims_nothing() {
    let (p, d) = sglang_pair(([127, 0, 50, 5], [127, 0, 50, 6]), 1, 20).await;
    let gw = gateway(&[p.worker_spec(), d.worker_spec()], 30).await;
    a_client_leaving_claims_no_slot(&gw, &d).await;
}

/// With `decode`'s only slot held (and a long admission wait), a client that gives up while
/// waiting for it claims nothing: the next request gets the slot at once, and the leaving one
/// never reached the decode. HTTP and gRPC decodes alike.
pub(crate) async fn a_client_leaving_claims_no_slot(gw: &Gateway, decode: &MockEngine) {
    let held = occupy(gw).await;
    let left = gw
        .post_and_give_up(
            "/v1/chat/completions",
            &chat(2, false),
            Duration::from_millis(300),
        )
        .await;
    assert!(left.is_err(), "the client gave up while waiting");
    // The slot frees only once the gateway saw the client go (its access line is written when
    // the request ends), so the test does not depend on which it notices first.
    gw.saw_a_client_leave().await;
    drop(held);
    // Had the leaving request claimed the slot, this one would wait for the whole admission wait.
    let r = gw.post("/v1/chat/completions", &chat(2, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        decode.records().len(),
        2,
        "the leaving request was dispatched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_without_a_window_is_not_gated_and_a_registration_label_gates_it() {
    // vLLM's OpenAI server reports no running window: not gated.
    let spawn = |role, ip| MockEngine::spawn(MockEngineConfig::test(EngineKind::Vllm, role, ip));
    let p = spawn(Role::Prefill, [127, 0, 50, 7]).await.unwrap();
    let mut dc = MockEngineConfig::test(EngineKind::Vllm, Role::Decode, [127, 0, 50, 8]);
    dc.itl_ms = 20;
    dc.natural_stop_every = 0;
    let d = MockEngine::spawn(dc).await.unwrap();
    let gw = gateway(&[p.worker_spec(), d.worker_spec()], 0).await;
    let held = occupy(&gw).await;
    let r = gw.post("/v1/chat/completions", &chat(2, false)).await;
    assert_eq!(r.status, 200, "an ungated decode shed: {}", r.text());
    drop(held);

    // The same decode registered with a window of one is gated (wait 0: shed at once).
    let mut spec = d.worker_spec();
    spec["labels"]["max_running_requests"] = json!("1");
    let gw = gateway(&[p.worker_spec(), spec], 0).await;
    let held = occupy(&gw).await;
    let r = gw.post("/v1/chat/completions", &chat(2, false)).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.header("retry-after").is_some());
    drop(held);
}
