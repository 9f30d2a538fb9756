//! n>1 over SGLang's HTTP rendezvous, where every sample would share one room: pdgate sends one
//! PD request per sample (`n: 1`, its own rooms) and merges the answers. Through the real
//! binary, mocks on 127.0.51.x: every sample equals the single-worker reference's, each decode
//! took its own room's KV, streamed and not; one failing sample fails the request and drops the
//! others; a fan-out claims one decode slot per sample.

use std::collections::HashSet;
use std::time::Duration;

use mock_engine::output::{self, Output};
use mock_engine::{
    EngineKind, Fault, FaultMatch, MockEngine, MockEngineConfig, RequestRecord, Role,
};
use serde_json::{json, Value};

use crate::harness::{metric_value, Gateway};

struct Fleet {
    prefill: MockEngine,
    decode: MockEngine,
    reference: MockEngine,
}

/// An SGLang prefill, decode and single-worker reference on `127.0.51.{base..base+2}`; the PD
/// engines run a request id ending in `-<i>` as sample `i`.
async fn fleet(base: u8, tweak: impl Fn(&mut MockEngineConfig)) -> Fleet {
    let spawn = |role, last: u8| {
        let mut c = MockEngineConfig::test(EngineKind::Sglang, role, [127, 0, 51, last]);
        c.sample_from_request_id = true;
        tweak(&mut c);
        MockEngine::spawn(c)
    };
    Fleet {
        prefill: spawn(Role::Prefill, base).await.unwrap(),
        decode: spawn(Role::Decode, base + 1).await.unwrap(),
        reference: spawn(Role::Both, base + 2).await.unwrap(),
    }
}

impl Fleet {
    async fn gateway(&self, extra: &str) -> Gateway {
        let mut gw = Gateway::start(
            &[self.prefill.worker_spec(), self.decode.worker_spec()],
            extra,
        )
        .await;
        gw.wait_ready().await;
        gw
    }

    async fn reference(&self, path: &str, body: &Value) -> Output {
        let r =
            mock_engine::client::post_json(&format!("{}{}", self.reference.api_url(), path), body)
                .await
                .unwrap();
        assert_eq!(r.status, 200, "reference: {}", r.text());
        output::extract(path, r.is_sse(), &r.body).unwrap()
    }
}

fn extract(path: &str, r: &mock_engine::client::Response) -> Output {
    output::extract(path, r.is_sse(), &r.body)
        .unwrap_or_else(|e| panic!("{path}: cannot parse ({e}): {}", r.text()))
}

/// Each sample went to the decode as a single-sample request with its own room, and its decode
/// took that room's KV from the prefill.
fn assert_one_room_per_sample(d: &[RequestRecord], samples: usize, path: &str) {
    assert_eq!(d.len(), samples, "{path}: one decode request per sample");
    let mut rooms = HashSet::new();
    for r in d {
        let n = match path {
            "/generate" => &r.body["sampling_params"]["n"],
            _ => &r.body["n"],
        };
        assert_eq!(n, &json!(1), "{path}: a sample asked for {n}");
        assert_eq!(
            r.handoff.kv_source.as_deref(),
            Some("remote"),
            "{path}: a decode did not get its KV"
        );
        for room in r
            .handoff
            .items
            .iter()
            .filter_map(|i| i.room)
            .chain(r.handoff.room)
        {
            rooms.insert(room);
        }
    }
    let per_sample = d[0].body["bootstrap_room"].as_array().map_or(1, Vec::len);
    assert_eq!(
        rooms.len(),
        samples * per_sample,
        "{path}: rooms shared: {rooms:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_with_one_prompt_and_n3_return_three_reference_samples_each_with_its_room() {
    let f = fleet(1, |_| {}).await;
    let gw = f.gateway("").await;
    let path = "/v1/completions";
    for stream in [false, true] {
        let mut body = json!({"model": "mock-model", "prompt": "Once upon a time", "n": 3, "max_tokens": 6,
                "stream": stream});
        if stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        let from = f.decode.records().len();
        let pd = gw.post(path, &body).await;
        assert_eq!(pd.status, 200, "stream={stream}: {}", pd.text());
        let got = extract(path, &pd);
        assert!(got.error.is_none(), "{:?}", got.error);
        assert_eq!(got.texts.len(), 3);
        assert_eq!(got, f.reference(path, &body).await, "stream={stream}");
        let distinct: HashSet<&String> = got.texts.iter().collect();
        assert_eq!(
            distinct.len(),
            3,
            "samples are not distinct: {:?}",
            got.texts
        );
        if stream {
            let events = output::parse_sse(&pd.body);
            assert_eq!(
                events.iter().filter(|e| e.data == "[DONE]").count(),
                1,
                "one [DONE]"
            );
            assert_eq!(events.last().map(|e| e.data.as_str()), Some("[DONE]"));
        }
        let d = f
            .decode
            .wait_records(from + 3, Duration::from_secs(5))
            .await;
        assert_one_room_per_sample(&d[from..], 3, path);
    }
    assert!(
        f.prefill.wait_idle(Duration::from_secs(5)).await,
        "prefill rooms left"
    );
    assert!(
        f.decode.wait_idle(Duration::from_secs(5)).await,
        "decode rooms left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_with_sampling_params_n_batched_prompts_with_n_and_chat_n_fan_out_too() {
    let f = fleet(4, |_| {}).await;
    let gw = f.gateway("").await;
    let cases = [
        (
            "/generate",
            json!({"text": "The capital of France is", "sampling_params": {"max_new_tokens": 5, "n": 2}}),
            2,
        ),
        (
            "/generate",
            json!({"text": ["one two", "three"], "sampling_params": {"max_new_tokens": 4, "n": 2}}),
            2,
        ),
        (
            "/v1/completions",
            json!({"model": "mock-model", "prompt": ["alpha", "beta"], "n": 2, "max_tokens": 4}),
            2,
        ),
        // Chat n>1 is one prompt: SGLang would run all its samples in the room array's first
        // room (see docs/architecture.md), so it fans out like completions.
        (
            "/v1/chat/completions",
            json!({"model": "mock-model", "messages": [{"role": "user", "content": "pick one"}], "n": 3, "max_tokens": 4}),
            3,
        ),
    ];
    for (path, body, samples) in cases {
        for stream in [false, true] {
            let mut body = body.clone();
            body["stream"] = json!(stream);
            let from = f.decode.records().len();
            let pd = gw.post(path, &body).await;
            assert_eq!(pd.status, 200, "{path} stream={stream}: {}", pd.text());
            let got = extract(path, &pd);
            assert!(got.error.is_none(), "{path}: {:?}", got.error);
            assert_eq!(
                got,
                f.reference(path, &body).await,
                "{path} stream={stream}: {body}"
            );
            let d = f
                .decode
                .wait_records(from + samples, Duration::from_secs(5))
                .await;
            assert_one_room_per_sample(&d[from..], samples, path);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failing_sample_fails_the_request_and_drops_the_other_samples() {
    // Long answers: the other samples are still running when one fails; the engines' own
    // rendezvous timeouts are long, so only the gateway's drop ends them early.
    let f = fleet(7, |c| {
        c.itl_ms = 20;
        c.natural_stop_every = 0;
        c.bootstrap_timeout = Duration::from_secs(30);
        c.waiting_timeout = Duration::from_secs(30);
    })
    .await;
    let gw = f.gateway("  retry_max_retries: 1\n").await;
    let path = "/v1/completions";
    for stream in [false, true] {
        // The failing sample answers once every sample's legs have reached the engines: 2 s
        // leaves a loaded machine room to send all three (the others run 400 × 20 ms).
        let fault = Fault::FailStatusAfter {
            status: 500,
            ms: 2_000,
            count: Some(1),
            matcher: FaultMatch::default(),
        };
        let from = f.decode.records().len();
        f.decode.inject(fault).await;
        let body = json!({"model": "mock-model", "prompt": "x", "n": 3, "max_tokens": 400,
            "ignore_eos": true, "stream": stream});
        let r = gw.post(path, &body).await;
        assert_eq!(r.status, 500, "stream={stream}: {}", r.text());
        assert!(r.text().contains("error"), "{}", r.text());
        f.decode
            .wait_records(from + 3, Duration::from_secs(5))
            .await;
        assert!(
            f.decode
                .wait_for(Duration::from_secs(5), |e| e
                    .records()
                    .iter()
                    .all(|r| r.is_done()))
                .await,
            "a sample kept running"
        );
        let d: Vec<RequestRecord> = f.decode.records().into_iter().skip(from).collect();
        let outcomes: Vec<_> = d.iter().map(|r| &r.outcome).collect();
        assert_eq!(d.len(), 3, "one decode request per sample: {outcomes:?}");
        assert_eq!(
            d.iter().filter(|r| r.outcome.status == Some(500)).count(),
            1,
            "{outcomes:?}"
        );
        assert_eq!(
            d.iter().filter(|r| r.outcome.cancelled).count(),
            2,
            "stream={stream}: the other samples were not dropped: {outcomes:?}"
        );
        assert!(
            f.decode.wait_idle(Duration::from_secs(10)).await,
            "stream={stream}: decode rooms left: {:?}",
            f.decode.rooms()
        );
        assert!(
            f.prefill.wait_idle(Duration::from_secs(10)).await,
            "stream={stream}: prefill rooms left: {:?} {:?}",
            f.prefill.rooms(),
            f.prefill
                .records()
                .iter()
                .map(|r| &r.outcome)
                .collect::<Vec<_>>()
        );
    }
}

/// A sample whose decode fails after its head, before any output: its prefill leg is dropped
/// with the attempt, not left to wait out its engine's rendezvous timeout for a decode that is
/// gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sample_whose_decode_fails_after_its_head_drops_its_prefill() {
    let f = fleet(13, |c| {
        c.bootstrap_timeout = Duration::from_secs(30);
        c.waiting_timeout = Duration::from_secs(30);
    })
    .await;
    let gw = f.gateway("  retry_max_retries: 1\n").await;
    f.decode
        .inject(Fault::DropConnectionAfterHead {
            count: Some(1),
            matcher: FaultMatch::default(),
        })
        .await;
    let body =
        json!({"model": "mock-model", "prompt": "x", "n": 2, "max_tokens": 4, "stream": true});
    let r = gw.post("/v1/completions", &body).await;
    assert!(r.text().contains("error"), "{} {}", r.status, r.text());
    let p = f.prefill.wait_records(2, Duration::from_secs(10)).await;
    assert!(
        f.prefill.wait_idle(Duration::from_secs(10)).await,
        "a prefill leg was left to wait for its room's timeout: {:?} {:?}",
        f.prefill.rooms(),
        p.iter().map(|r| &r.outcome).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_claims_one_decode_slot_per_sample() {
    let f = fleet(10, |c| c.max_running_requests = 2).await;
    let gw = f.gateway("  pd_admission_wait_secs: 0\n").await;
    // Three samples never fit a window of two: shed at once, before any leg goes out.
    let body = json!({"model": "mock-model", "prompt": "x", "n": 3, "max_tokens": 2});
    let r = gw.post("/v1/completions", &body).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.header("retry-after").is_some());
    assert!(f.prefill.records().is_empty() && f.decode.records().is_empty());
    // Two fit, and hold both slots while they run.
    let mut two = body.clone();
    two["n"] = json!(2);
    let r = gw.post("/v1/completions", &two).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let m = gw.metrics().await;
    assert_eq!(
        metric_value(&m, "smg_pd_admission_sheds_total", &[]),
        Some(1.0)
    );
}
