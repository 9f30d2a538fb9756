//! SGLang PD over HTTP, end to end: a real gateway process, mock engines that really rendezvous,
//! and a single-worker reference engine for "PD output == reference output".

use std::time::{Duration, Instant};

use mock_engine::output::{self, Output};
use mock_engine::{Fault, FaultMatch, RequestRecord};
use serde_json::{json, Value};

use crate::harness::{gateway_for, metric_value, SglangFleet};

/// One request per route, each small enough to be quick and long enough to show real text.
fn route_bodies(stream: bool) -> Vec<(&'static str, Value)> {
    let mut v = vec![
        (
            "/generate",
            json!({"text": "The capital of France is", "sampling_params": {"max_new_tokens": 8}, "stream": stream}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "mock-model", "messages": [{"role": "user", "content": "Say something"}], "max_tokens": 8, "stream": stream}),
        ),
        (
            "/v1/completions",
            json!({"model": "mock-model", "prompt": "Once upon a time", "max_tokens": 8, "stream": stream}),
        ),
        (
            "/v1/messages",
            json!({"model": "mock-model", "max_tokens": 8, "messages": [{"role": "user", "content": "Hello"}], "stream": stream}),
        ),
        (
            "/v1/responses",
            json!({"model": "mock-model", "input": "Tell me a story", "max_output_tokens": 8, "stream": stream}),
        ),
    ];
    if !stream {
        v.push((
            "/v1/rerank",
            json!({"model": "mock-model", "query": "what is pd", "documents": ["prefill", "decode", "both"]}),
        ));
    }
    v
}

fn extract(path: &str, r: &mock_engine::client::Response) -> Output {
    output::extract(path, r.is_sse(), &r.body)
        .unwrap_or_else(|e| panic!("{path}: cannot parse response ({e}): {}", r.text()))
}

/// The last record of `engine` for `path`.
fn last_record(records: &[RequestRecord], path: &str) -> RequestRecord {
    records
        .iter()
        .rev()
        .find(|r| r.path == path)
        .cloned()
        .unwrap_or_else(|| panic!("no record for {path}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pd_output_equals_reference_for_every_route_streamed_and_not() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = gateway_for(&fleet, "").await;
    for stream in [false, true] {
        for (path, body) in route_bodies(stream) {
            let pd = gw.post(path, &body).await;
            assert_eq!(pd.status, 200, "{path} stream={stream}: {}", pd.text());
            if stream {
                assert!(
                    pd.is_sse(),
                    "{path}: content-type {:?}",
                    pd.header("content-type")
                );
            }
            let reference = fleet.reference(path, &body).await;
            assert_eq!(
                reference.status,
                200,
                "reference {path}: {}",
                reference.text()
            );
            let (pd_out, ref_out) = (extract(path, &pd), extract(path, &reference));
            assert!(
                pd_out.error.is_none(),
                "{path} stream={stream}: {:?}",
                pd_out.error
            );
            assert_eq!(
                pd_out, ref_out,
                "{path} stream={stream}: PD output differs from reference"
            );
            let d = last_record(&fleet.decode.records(), path);
            assert_eq!(
                d.handoff.kv_source.as_deref(),
                Some("remote"),
                "{path}: decode did not get the KV"
            );
        }
    }
    assert!(
        fleet.prefill.wait_idle(Duration::from_secs(5)).await,
        "rooms left open on the prefill"
    );
    assert!(
        fleet.decode.wait_idle(Duration::from_secs(5)).await,
        "rooms left open on the decode"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_legs_carry_one_room_and_rooms_differ_across_requests() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = gateway_for(&fleet, "").await;
    let body = json!({"text": "hi", "sampling_params": {"max_new_tokens": 2},
        // A client's own handoff fields must be replaced, never forwarded.
        "bootstrap_host": "203.0.113.9", "bootstrap_port": 1, "bootstrap_room": 7});
    let mut rooms = Vec::new();
    for _ in 0..3 {
        let r = gw.post("/generate", &body).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let p = fleet.prefill.wait_records(3, Duration::from_secs(5)).await;
    let d = fleet.decode.wait_records(3, Duration::from_secs(5)).await;
    for (pr, dr) in p.iter().zip(&d) {
        let room = pr.body["bootstrap_room"]
            .as_u64()
            .expect("integer room on the prefill leg");
        assert_eq!(
            dr.body["bootstrap_room"].as_u64(),
            Some(room),
            "legs carry different rooms"
        );
        assert!(room <= i64::MAX as u64);
        assert_ne!(room, 7, "the client's room was forwarded");
        assert_eq!(pr.body["bootstrap_host"], json!(fleet.prefill.host()));
        assert_eq!(
            dr.body["bootstrap_port"],
            json!(fleet.prefill.bootstrap_port())
        );
        assert_eq!(
            dr.handoff.peer_addr.as_deref(),
            Some(
                format!(
                    "{}:{}",
                    fleet.prefill.host(),
                    fleet.prefill.bootstrap_port().unwrap()
                )
                .as_str()
            ),
            "decode fetched the KV from somewhere else"
        );
        rooms.push(room);
    }
    rooms.sort_unstable();
    rooms.dedup();
    assert_eq!(rooms.len(), 3, "rooms repeat across requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_inputs_get_equal_length_arrays_with_one_room_per_item() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = gateway_for(&fleet, "").await;
    let cases = [
        (
            "/generate",
            json!({"input_ids": [[11, 12], [13, 14], [15, 16]], "sampling_params": {"max_new_tokens": 3}}),
            3,
        ),
        (
            "/generate",
            json!({"text": ["a b", "c d"], "sampling_params": {"max_new_tokens": 3}}),
            2,
        ),
        (
            "/v1/completions",
            json!({"model": "mock-model", "prompt": ["one", "two"], "max_tokens": 3}),
            2,
        ),
        (
            "/v1/completions",
            json!({"model": "mock-model", "prompt": ["only"], "max_tokens": 3}),
            1,
        ),
    ];
    for (i, (path, body, n)) in cases.iter().enumerate() {
        let pd = gw.post(path, body).await;
        assert_eq!(pd.status, 200, "{path}: {}", pd.text());
        let reference = fleet.reference(path, body).await;
        assert_eq!(
            extract(path, &pd),
            extract(path, &reference),
            "{path} #{i}: PD output differs"
        );
        let p = last_record(&fleet.prefill.records(), path);
        let d = last_record(&fleet.decode.records(), path);
        for rec in [&p, &d] {
            for key in ["bootstrap_host", "bootstrap_port", "bootstrap_room"] {
                let arr = rec.body[key]
                    .as_array()
                    .unwrap_or_else(|| panic!("{path}: {key} is not an array"));
                assert_eq!(arr.len(), *n, "{path}: {key} length");
            }
        }
        assert_eq!(
            p.body["bootstrap_room"], d.body["bootstrap_room"],
            "{path}: legs differ"
        );
        let mut rooms: Vec<u64> = p.body["bootstrap_room"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_u64)
            .collect();
        rooms.dedup();
        assert_eq!(rooms.len(), *n, "{path}: rooms are not independent");
    }
    // A completions prompt given once with n>1 shares one rendezvous (SMG's behaviour): scalar fields.
    let body = json!({"model": "mock-model", "prompt": "x", "n": 1, "max_tokens": 2});
    assert_eq!(gw.post("/v1/completions", &body).await.status, 200);
    assert!(
        last_record(&fleet.prefill.records(), "/v1/completions").body["bootstrap_room"].is_u64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_are_merged_prefill_rows_first_in_json_and_every_sse_event() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = gateway_for(&fleet, "").await;
    let body = json!({"text": "The quick brown fox", "sampling_params": {"max_new_tokens": 4},
        "return_logprob": true, "logprob_start_len": 0});
    let pd = gw.post("/generate", &body).await;
    assert_eq!(pd.status, 200, "{}", pd.text());
    assert_eq!(pd.header("content-type"), Some("application/json"));
    let merged = extract("/generate", &pd);
    let reference = extract("/generate", &fleet.reference("/generate", &body).await);
    assert_eq!(
        merged.input_logprobs, reference.input_logprobs,
        "merged prompt logprobs differ from a single worker's"
    );
    let rows = merged.input_logprobs.expect("input_token_logprobs");
    assert_eq!(
        rows.first(),
        Some(&None),
        "the first prompt position has a null logprob"
    );
    assert_eq!(
        Some(rows.len() as u64),
        merged.prompt_tokens,
        "one row per prompt token"
    );

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let pd = gw.post("/generate", &sbody).await;
    assert!(pd.is_sse());
    let events = output::parse_sse(&pd.body);
    let mut with_rows = 0;
    for ev in &events {
        if ev.data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(&ev.data).expect("event JSON");
        if let Some(rows) = v["meta_info"]["input_token_logprobs"].as_array() {
            assert_eq!(
                Some(rows.len() as u64),
                v["meta_info"]["prompt_tokens"].as_u64(),
                "event not merged: {}",
                ev.data
            );
            with_rows += 1;
        }
    }
    assert!(with_rows > 0, "no event carried input_token_logprobs");
    assert_eq!(events.last().map(|e| e.data.as_str()), Some("[DONE]"));
}

/// A fleet whose engines wait 30 s for a rendezvous (so a leg the gateway failed to drop is
/// seen, not timed out), behind a gateway that does not retry.
async fn long_rendezvous_fleet() -> (SglangFleet, crate::harness::Gateway) {
    let fleet = SglangFleet::start(|c| {
        c.bootstrap_timeout = Duration::from_secs(30);
        c.waiting_timeout = Duration::from_secs(30);
    })
    .await;
    let gw = gateway_for(&fleet, "  retry_max_retries: 1\n").await;
    (fleet, gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefill_error_fails_fast_and_drops_the_decode_leg() {
    // A correct gateway answers well before the engines' own rendezvous timeout.
    let (fleet, gw) = long_rendezvous_fleet().await;
    fleet
        .prefill
        .inject(Fault::FailStatus {
            status: 500,
            body: None,
            count: Some(1),
            matcher: FaultMatch::default(),
        })
        .await;
    let started = Instant::now();
    let r = gw
        .post("/v1/chat/completions", &json!({"model": "mock-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}))
        .await;
    let took = started.elapsed();
    assert_eq!(r.status, 500, "{}", r.text());
    assert_eq!(
        r.json()["error"]["code"],
        "prefill_internal_error",
        "{}",
        r.text()
    );
    assert!(
        took < Duration::from_secs(10),
        "the error took {took:?}: the gateway waited for the rendezvous timeout"
    );
    // The decode leg was dropped, so the decode engine abandoned its room well before its timeout.
    assert!(
        fleet.decode.wait_idle(Duration::from_secs(10)).await,
        "decode still holds the room: {:?}",
        fleet.decode.rooms()
    );
    // The decode leg either never got out (the prefill's error came first) or was dropped.
    let d = fleet.decode.records();
    assert!(
        d.iter().all(|r| r.outcome.cancelled),
        "decode leg was not dropped: {:?}",
        d.iter().map(|r| &r.outcome).collect::<Vec<_>>()
    );
}

/// A decode that fails after its head, before any output: the client gets the stream's error
/// event, and the prefill leg is dropped too — its engine would otherwise hold the room (and
/// the KV) until its own bootstrap timeout, waiting for a decode that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_failing_after_its_head_drops_the_prefill_leg() {
    // Only a dropped leg ends sooner than the engines' own rendezvous timeout.
    let (fleet, gw) = long_rendezvous_fleet().await;
    fleet
        .decode
        .inject(Fault::DropConnectionAfterHead {
            count: Some(1),
            matcher: FaultMatch::default(),
        })
        .await;
    let body = json!({"model": "mock-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "stream": true});
    let s = gw.stream("/v1/chat/completions", &body).await;
    assert_eq!(s.status, 200);
    let text = String::from_utf8_lossy(&s.body_bytes().await.unwrap_or_default()).to_string();
    assert!(text.contains("\"error\""), "no error event: {text}");
    let p = fleet.prefill.wait_records(1, Duration::from_secs(10)).await;
    assert!(
        p[0].outcome.cancelled,
        "the prefill leg was left to wait for its room's timeout: {:?} {:?}",
        p[0].outcome,
        fleet.prefill.rooms()
    );
    assert!(
        fleet.prefill.wait_idle(Duration::from_secs(10)).await,
        "prefill room left open: {:?}",
        fleet.prefill.rooms()
    );
}

/// The gateway gathers a stream's writes only while the next piece is already in hand
/// (`src/gather.rs`): tokens the engine produces one at a time reach the client one at a time,
/// the first while the engine is still generating.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_tokens_reach_the_client_as_the_engine_makes_them() {
    let itl = Duration::from_millis(250);
    let fleet = SglangFleet::start(|c| c.itl_ms = itl.as_millis() as u64).await;
    let gw = gateway_for(&fleet, "").await;
    let body = json!({"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": true});
    let mut s = gw.stream("/v1/chat/completions", &body).await;
    assert_eq!(s.status, 200);
    let mut tokens = Vec::new();
    while let Some(chunk) = s.next_chunk().await {
        let chunk = chunk.expect("chunk ok");
        if tokens.is_empty() {
            assert!(
                !fleet.decode.records().iter().all(|r| r.is_done()),
                "the first chunk arrived after the engine had finished"
            );
        }
        if std::str::from_utf8(&chunk.data).is_ok_and(|t| t.contains("\"content\"")) {
            tokens.push(chunk.at);
        }
    }
    // Six tokens 250 ms apart: held to the end they would arrive at once.
    let spread = tokens.last().unwrap().duration_since(tokens[0]);
    assert!(
        tokens.len() >= 2 && spread >= itl * 2,
        "{} token chunks over {spread:?}",
        tokens.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_hang_up_mid_stream_drops_both_legs() {
    let fleet = SglangFleet::start(|c| c.itl_ms = 50).await;
    let gw = gateway_for(&fleet, "").await;
    let body = json!({"model": "mock-model", "messages": [{"role": "user", "content": "long"}], "max_tokens": 200, "stream": true});
    let mut s = gw.stream("/v1/chat/completions", &body).await;
    assert_eq!(s.status, 200);
    let first = s
        .next_chunk()
        .await
        .expect("a first chunk")
        .expect("chunk ok");
    assert!(!first.data.is_empty());
    drop(s);
    assert!(
        fleet
            .decode
            .wait_for(Duration::from_secs(5), |e| e
                .records()
                .iter()
                .all(|r| r.is_done()))
            .await,
        "the decode leg kept streaming after the client left"
    );
    let d = fleet.decode.records();
    assert!(
        d[0].outcome.cancelled,
        "decode leg not dropped: {:?}",
        d[0].outcome
    );
    assert!(
        fleet.prefill.wait_idle(Duration::from_secs(5)).await,
        "prefill room left open: {:?}",
        fleet.prefill.rooms()
    );
    assert!(
        fleet.decode.wait_idle(Duration::from_secs(5)).await,
        "decode room left open: {:?}",
        fleet.decode.rooms()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_start_on_both_heads_without_waiting_for_the_prefill_body() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = gateway_for(&fleet, "").await;
    let body = json!({"text": "a", "sampling_params": {"max_new_tokens": 3}, "stream": true});
    let r = gw.post("/generate", &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert!(r.header("x-smg-routed-worker-id").is_some());
    assert!(r.header("x-request-id").is_some());
    assert_eq!(
        output::parse_sse(&r.body).last().map(|e| e.data.clone()),
        Some("[DONE]".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_of_1mib_and_8mib_work_and_over_the_cap_is_413() {
    // The mocks' test timeouts (2 s to rendezvous) are shorter than an 8 MiB prompt may take
    // on a loaded 2-core machine; the engines' real defaults are 300 s.
    let fleet = SglangFleet::start(|c| {
        c.max_model_len = 4_000_000;
        c.bootstrap_timeout = Duration::from_secs(60);
        c.waiting_timeout = Duration::from_secs(60);
    })
    .await;
    let gw = gateway_for(&fleet, "  max_payload_size: 10485760\n").await;
    for size in [1 << 20, 8 << 20] {
        let text = "word ".repeat(size / 5);
        let body = json!({"text": text, "sampling_params": {"max_new_tokens": 2}});
        let pd = gw.post("/generate", &body).await;
        assert_eq!(pd.status, 200, "{size} bytes: {}", pd.text());
        // Both legs got the client's bytes whole (written as pieces of its body, not copied).
        let p = last_record(&fleet.prefill.records(), "/generate");
        let d = last_record(&fleet.decode.records(), "/generate");
        for (leg, r) in [("prefill", &p), ("decode", &d)] {
            assert_eq!(
                r.body["text"].as_str().map(str::len),
                Some(text.len()),
                "prompt truncated on the {leg} leg"
            );
            assert!(
                r.body["text"] == text.as_str(),
                "prompt changed on the {leg} leg"
            );
            assert_eq!(r.body["sampling_params"], body["sampling_params"], "{leg}");
            assert_eq!(r.body["bootstrap_room"], p.body["bootstrap_room"], "{leg}");
        }
        assert_eq!(d.handoff.kv_source.as_deref(), Some("remote"));
    }
    let too_big = json!({"text": "x".repeat(11 << 20)});
    let r = gw.post("/generate", &too_big).await;
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "request_body_too_large");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue_does_not_stall() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = gateway_for(&fleet, "").await;
    let body = json!({"text": "x", "sampling_params": {"max_new_tokens": 2}}).to_string();
    let started = Instant::now();
    // A raw client that waits for `100 Continue` before sending the body, as curl does.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .unwrap();
    let head = format!(
        "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
        .await
        .expect("no 100 Continue within 2 s")
        .unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 100"),
        "got {:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    s.write_all(body.as_bytes()).await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&rest);
    assert!(text.contains("200 OK"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_prefills_on_different_ips_each_decode_fetches_from_its_pair() {
    use mock_engine::{EngineKind, MockEngine, MockEngineConfig, Role};
    // Enough requests at once that crossed wires between the two prefills would show.
    const REQUESTS: usize = 120;
    // That many requests at once on a loaded 2-core machine can take longer to rendezvous than the
    // mocks' 2 s test timeouts (the engines' real defaults are 300 s), and each waiting decode's
    // heartbeat to its prefill (a 2 s GET every 0.5 s) can miss too; this test is about which
    // prefill each decode fetches from, not about timeouts or liveness.
    let engine = |role, ip| {
        let mut c = MockEngineConfig::test(EngineKind::Sglang, role, ip);
        c.bootstrap_timeout = Duration::from_secs(60);
        c.waiting_timeout = Duration::from_secs(60);
        c.heartbeat_max_failure = 100;
        // The parallel-info fetch retried as SGLang's `try_ensure_parallel_info` does, 20 times
        // rather than the test config's 3: one full-suite run on a loaded VM saw every handoff
        // fail and the decode's breaker open. The cause was not found (11 runs of this test
        // alone beside CPU hogs passed, at 200 requests and 3 retries); a failure now prints the
        // engines' stats and failed outcomes to name it.
        c.ensure_retries = 20;
        MockEngine::spawn(c)
    };
    let p2 = engine(Role::Prefill, [127, 0, 0, 2]).await.unwrap();
    let p3 = engine(Role::Prefill, [127, 0, 0, 3]).await.unwrap();
    let d = engine(Role::Decode, [127, 0, 0, 5]).await.unwrap();
    let mut gw =
        crate::harness::Gateway::start(&[p2.worker_spec(), p3.worker_spec(), d.worker_spec()], "")
            .await;
    gw.wait_ready().await;
    let gw = std::sync::Arc::new(gw);
    let mut tasks = Vec::new();
    for i in 0..REQUESTS {
        let gw = gw.clone();
        tasks.push(tokio::spawn(async move {
            let body =
                json!({"text": format!("request {i}"), "sampling_params": {"max_new_tokens": 2}});
            let r = gw.post("/generate", &body).await;
            (r.status, r.text())
        }));
    }
    let diagnosis = || {
        let failed = |e: &MockEngine| {
            e.records()
                .into_iter()
                .filter(|r| r.outcome.status != Some(200))
                .take(3)
                .map(|r| format!("{} {:?} {:?}", r.path, r.outcome.status, r.outcome.error))
                .collect::<Vec<_>>()
        };
        let log = gw.log();
        let log: Vec<_> = log.lines().filter(|l| !l.contains(" INFO ")).collect();
        format!(
            "{}\ndecode: {:?}\n{:?}\nprefills: {:?} {:?}",
            log.join("\n"),
            d.stats(),
            failed(&d),
            failed(&p2),
            failed(&p3)
        )
    };
    for t in tasks {
        let (status, text) = t.await.unwrap();
        assert_eq!(status, 200, "{text}\n{}", diagnosis());
    }
    let mut by_room = std::collections::HashMap::new();
    for (p, host) in [(&p2, p2.host()), (&p3, p3.host())] {
        for r in p.records() {
            by_room.insert(
                r.body["bootstrap_room"].as_u64().unwrap(),
                (host.clone(), p.bootstrap_port().unwrap()),
            );
        }
    }
    let records = d.wait_records(REQUESTS, Duration::from_secs(10)).await;
    assert_eq!(records.len(), REQUESTS, "{}", diagnosis());
    let mut per_prefill = std::collections::HashMap::new();
    for r in &records {
        let room = r.body["bootstrap_room"].as_u64().unwrap();
        let (host, port) = by_room
            .get(&room)
            .expect("decode room unknown to every prefill");
        assert_eq!(
            r.handoff.peer_addr.as_deref(),
            Some(format!("{host}:{port}").as_str()),
            "crossed wires"
        );
        assert_eq!(r.handoff.kv_source.as_deref(), Some("remote"));
        *per_prefill.entry(host.clone()).or_insert(0) += 1;
    }
    assert_eq!(
        per_prefill.len(),
        2,
        "round robin used one prefill only: {per_prefill:?}"
    );
    for e in [&p2, &p3, &d] {
        assert!(
            e.wait_idle(Duration::from_secs(5)).await,
            "rooms left open: {:?}",
            e.rooms()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_refusals_are_json_errors_and_never_forwarded() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = gateway_for(&fleet, "").await;
    let r = gw.post("/v1/embeddings", &json!({"input": "x"})).await;
    assert_eq!(r.status, 501);
    assert_eq!(r.json()["error"]["code"], "not_implemented");
    let r = gw.post("/v1/classify", &json!({"input": "x"})).await;
    assert_eq!(r.status, 501);
    let r = gw.post("/v2/unknown", &json!({})).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "unknown_url");
    assert_eq!(
        r.json()["error"]["message"],
        "Invalid URL (POST /v2/unknown)"
    );
    let r = gw.get("/v1/chat/completions").await;
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("POST"));
    let r = mock_engine::client::request(
        "POST",
        &gw.url("/generate"),
        &[],
        Some(bytes::Bytes::from_static(b"{\"text\": ")),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "json_parse_error");
    let r = gw
        .post(
            "/v1/chat/completions",
            &json!({"messages": [], "stream": "yes"}),
        )
        .await;
    assert_eq!(r.status, 400);
    assert!(
        fleet.prefill.records().is_empty() && fleet.decode.records().is_empty(),
        "a refused request reached an engine"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_needs_a_healthy_prefill_and_decode() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = crate::harness::Gateway::start(&[fleet.prefill.worker_spec()], "").await;
    let r = gw.get("/readiness").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["status"], "not ready");
    let r = gw.post("/generate", &json!({"text": "x"})).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["code"], "no_available_workers");
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("decode"),
        "message must name the leg: {}",
        r.text()
    );
    assert_eq!(gw.get("/health").await.status, 200);
    assert_eq!(gw.get("/liveness").await.status, 200);
    let w = gw.get("/workers").await.json();
    assert_eq!(w["workers"][0]["worker_type"], "prefill");
    assert_eq!(
        w["workers"][0]["bootstrap_port"],
        json!(fleet.prefill.bootstrap_port())
    );
    assert!(w["workers"][0].get("api_key").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_request_and_pd_ttft_series() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = gateway_for(&fleet, "").await;
    let r = gw
        .post("/v1/chat/completions", &json!({"model": "mock-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}))
        .await;
    assert_eq!(r.status, 200);
    let labels = [
        ("backend_type", "pd"),
        ("model", "mock-model"),
        ("runtime", "sglang"),
    ];
    // Request series are recorded in the logging phase and the prefill duration when the
    // prefill's drain ends — both may land just after the client has its answer.
    let m = gw
        .metrics_when(|m| {
            metric_value(m, "smg_router_requests_total", &[("endpoint", "chat")]).is_some()
                && metric_value(m, "smg_pd_prefill_duration_seconds_count", &labels).is_some()
        })
        .await;
    assert_eq!(
        metric_value(&m, "smg_pd_ttft_seconds_count", &labels),
        Some(1.0),
        "{m}"
    );
    assert!(
        metric_value(&m, "smg_pd_prefill_duration_seconds_count", &labels).is_some(),
        "{m}"
    );
    assert_eq!(
        metric_value(
            &m,
            "smg_router_requests_total",
            &[("endpoint", "chat"), ("streaming", "false")]
        ),
        Some(1.0)
    );
    assert_eq!(
        metric_value(
            &m,
            "smg_worker_selection_total",
            &[("worker_type", "prefill"), ("policy", "round_robin")]
        ),
        Some(1.0)
    );
    assert_eq!(
        metric_value(
            &m,
            "smg_worker_selection_total",
            &[("worker_type", "decode")]
        ),
        Some(1.0)
    );
}

/// The request's deadline (`request_timeout_secs`) ends a stream whose tokens keep coming (so
/// the stall timeout never fires): the events so far, then one SSE `timeout` error event, and
/// the body ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_outlives_the_request_deadline_ends_with_a_timeout_event() {
    let fleet = SglangFleet::start(|c| {
        c.itl_ms = 100;
        c.natural_stop_every = 0;
    })
    .await;
    let gw = gateway_for(
        &fleet,
        "  request_timeout_secs: 2\n  stream_idle_timeout_secs: 30\n",
    )
    .await;
    let started = Instant::now();
    let body = json!({"text": "a long answer", "stream": true,
        "sampling_params": {"max_new_tokens": 1000}});
    let r = gw.stream("/generate", &body).await;
    assert_eq!(r.status, 200);
    let (chunks, err) = r.collect().await;
    let took = started.elapsed();
    assert!(err.is_none(), "the stream was cut, not ended: {err:?}");
    let text: String = chunks
        .iter()
        .map(|c| String::from_utf8_lossy(&c.data).into_owned())
        .collect();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    let last = events.last().expect("events");
    let error: Value = serde_json::from_str(last.strip_prefix("data: ").expect("an SSE event"))
        .unwrap_or_else(|e| panic!("the last event is not JSON ({e}): {last}"));
    assert_eq!(error["error"]["code"], "timeout", "{last}");
    assert!(
        events.len() >= 5,
        "tokens flowed before the deadline: {} events",
        events.len()
    );
    assert!(
        took >= Duration::from_millis(1800) && took < Duration::from_secs(15),
        "ended after {took:?}, not at the 2 s deadline"
    );
}
