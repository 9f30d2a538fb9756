//! Routing policies as wired into the gateway: prompt text reaches cache_aware, sticky keys reach
//! manual, each leg runs its own instance, and the load-based policies weigh the gateway's live
//! in-flight count even when the engines' load reports say they are idle.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mock_engine::{EngineKind, LoadReport, MockEngine, MockEngineConfig, Role};
use serde_json::json;

use crate::harness::{metric_value, Gateway};

async fn fleet(prefills: u8, decodes: u8) -> (Vec<MockEngine>, Vec<MockEngine>) {
    let mut p = Vec::new();
    for i in 0..prefills {
        p.push(
            MockEngine::spawn(MockEngineConfig::test(
                EngineKind::Sglang,
                Role::Prefill,
                [127, 0, 1, i + 1],
            ))
            .await
            .unwrap(),
        );
    }
    let mut d = Vec::new();
    for i in 0..decodes {
        d.push(
            MockEngine::spawn(MockEngineConfig::test(
                EngineKind::Sglang,
                Role::Decode,
                [127, 0, 2, i + 1],
            ))
            .await
            .unwrap(),
        );
    }
    (p, d)
}

async fn ready(p: &[MockEngine], d: &[MockEngine], extra: &str) -> Gateway {
    let specs: Vec<_> = p.iter().chain(d).map(MockEngine::worker_spec).collect();
    let gw = Gateway::start(&specs, extra).await;
    for _ in 0..200 {
        let w = gw.get("/workers").await.json();
        if w["workers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w["status"] == "ready")
        {
            return gw;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("workers never ready");
}

/// Which prefill (by index) served each request, from the engines' records.
fn served_by(prefills: &[MockEngine]) -> HashMap<String, usize> {
    let mut by_text = HashMap::new();
    for (i, p) in prefills.iter().enumerate() {
        for r in p.records() {
            by_text.insert(r.body["text"].as_str().unwrap_or_default().to_string(), i);
        }
    }
    by_text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_aware_keeps_a_shared_prefix_on_one_prefill() {
    let (p, d) = fleet(3, 1).await;
    let gw = ready(
        &p,
        &d,
        "  prefill_policy: cache_aware\n  decode_policy: round_robin\n",
    )
    .await;
    let families = [
        "You are a helpful assistant that answers questions about geography. ",
        "System: translate every message into French, keeping the tone. ",
    ];
    for round in 0..6 {
        for f in families {
            let text = format!("{}{}", f.repeat(8), round);
            let r = gw
                .post(
                    "/generate",
                    &json!({"text": text, "sampling_params": {"max_new_tokens": 1}}),
                )
                .await;
            assert_eq!(r.status, 200, "{}", r.text());
        }
    }
    let served = served_by(&p);
    for f in families {
        let workers: std::collections::HashSet<usize> = served
            .iter()
            .filter(|(t, _)| t.starts_with(f))
            .map(|(_, w)| *w)
            .collect();
        // The first request of a family may land anywhere; the rest follow its prefix.
        assert_eq!(
            workers.len(),
            1,
            "family {f:?} spread over prefills {workers:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_routing_keys_stick_per_leg() {
    let (p, d) = fleet(3, 3).await;
    let gw = ready(&p, &d, "  policy: manual\n").await;
    let body = json!({"text": "sticky", "sampling_params": {"max_new_tokens": 1}});
    for key in ["alice", "bob"] {
        for _ in 0..4 {
            let r = mock_engine::client::request(
                "POST",
                &gw.url("/generate"),
                &[
                    ("content-type", "application/json"),
                    ("x-smg-routing-key", key),
                ],
                Some(bytes::Bytes::from(body.to_string())),
            )
            .await
            .unwrap();
            assert_eq!(r.status, 200);
        }
    }
    for (leg, engines) in [("prefill", &p), ("decode", &d)] {
        for key in ["alice", "bob"] {
            let hit: Vec<usize> = engines
                .iter()
                .enumerate()
                .filter(|(_, e)| {
                    e.records()
                        .iter()
                        .any(|r| r.header("x-smg-routing-key") == Some(key))
                })
                .map(|(i, _)| i)
                .collect();
            assert_eq!(hit.len(), 1, "{leg}: key {key} went to {hit:?}");
        }
    }
}

/// The slow decode's share of the requests, for `decode_policy` (issue 12, item 4).
///
/// One prefill and three decodes; decode 0 answers in ~900 ms (4 tokens, 300 ms apart), the
/// others in a few ms. Every decode's load report says "empty" (0 waiting, 0 running, no KV in
/// use) the whole time — a report is up to a poll old, and an engine's report may not see what the
/// gateway has just sent it — and load monitoring is on (1 s polls) so the policies use those
/// reports. 150 requests from 12 clients, each sending its next request when its answer arrives.
///
/// Returns (requests served by the slow decode, requests served in all).
async fn slow_decode_share(decode_policy: &str) -> (usize, usize) {
    const REQUESTS: usize = 150;
    const CLIENTS: usize = 12;
    let prefill = MockEngine::spawn(MockEngineConfig::test(
        EngineKind::Sglang,
        Role::Prefill,
        [127, 0, 4, 1],
    ))
    .await
    .unwrap();
    let mut decodes = Vec::new();
    for i in 0..3u8 {
        let mut cfg = MockEngineConfig::test(EngineKind::Sglang, Role::Decode, [127, 0, 4, 2 + i]);
        if i == 0 {
            cfg.itl_ms = 300;
        }
        decodes.push(MockEngine::spawn(cfg).await.unwrap());
    }
    let report = |waiting| {
        Some(LoadReport {
            waiting,
            running: 0,
            token_usage: 0.0,
        })
    };
    // Handshake with the load monitor, so the run starts with the empty reports in use: every
    // decode first reports a queue above the overload threshold until the gateway flags all three,
    // then the empty report until it flags none. Nothing is sent meanwhile.
    for d in &decodes {
        d.report_load(report(1_000));
    }
    let extra = format!(
        "  decode_policy: {decode_policy}\n  load_monitor_interval: 1\n  \
         worker_overload_waiting_requests: 1000\n"
    );
    let specs: Vec<_> = std::iter::once(&prefill)
        .chain(&decodes)
        .map(MockEngine::worker_spec)
        .collect();
    let gw = Gateway::start(&specs, &extra).await;
    let overloaded = |n: f64| {
        move |m: &str| metric_value(m, "smg_workers_overloaded", &[("model", "all")]) == Some(n)
    };
    let m = gw.metrics_when(overloaded(3.0)).await;
    assert!(
        overloaded(3.0)(&m),
        "the load monitor never saw the decodes' reports\n{m}"
    );
    for d in &decodes {
        d.report_load(report(0));
    }
    let m = gw.metrics_when(overloaded(0.0)).await;
    assert!(
        overloaded(0.0)(&m),
        "the empty reports never reached the gateway\n{m}"
    );

    let url = gw.url("/generate");
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (url, next) = (url.clone(), next.clone());
            tokio::spawn(async move {
                let mut failures = Vec::new();
                while next.fetch_add(1, Ordering::Relaxed) < REQUESTS {
                    let body =
                        json!({"text": "slow or fast", "sampling_params": {"max_new_tokens": 4}});
                    match mock_engine::client::post_json(&url, &body).await {
                        Ok(r) if r.status == 200 => {}
                        Ok(r) => failures.push(format!("{}: {}", r.status, r.text())),
                        Err(e) => failures.push(e.to_string()),
                    }
                }
                failures
            })
        })
        .collect();
    let run = async {
        let mut failures = Vec::new();
        for c in clients {
            failures.extend(c.await.expect("client task"));
        }
        failures
    };
    let failures = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .unwrap_or_else(|_| panic!("150 requests did not end within 60 s\n{}", gw.log()));
    assert!(failures.is_empty(), "{failures:?}\n{}", gw.log());
    let served: Vec<usize> = decodes.iter().map(|d| d.records().len()).collect();
    eprintln!(
        "decode_policy {decode_policy}: requests per decode (slow first) {served:?} in {:?}",
        started.elapsed()
    );
    assert_eq!(served.iter().sum::<usize>(), REQUESTS, "{served:?}");
    (served[0], REQUESTS)
}

/// Asserts that the slow decode got at most a sixth of the requests.
///
/// Why that bound: every report says "empty", so the reports cannot tell the decodes apart and the
/// gateway's live in-flight count decides: a new request goes where fewest of the gateway's
/// requests are in flight (power_of_two: the less busy of two sampled). While all three are idle
/// the slow decode takes its turn like the others, and from then on only when it holds fewer of the
/// gateway's requests than a fast decode, which finishes its own in milliseconds. So it gets a
/// handful near the start, and the fast decodes serve everything else before its first answer at
/// ~0.9 s: measured 4–6 of 150 (3–4 %) on a busy 2-core machine; a machine slow enough to stretch
/// the fast answers lets it take a few more per 0.9 s. Routing by the reports alone (before the
/// in-flight term) spread the requests evenly: 49 and 51 of 150, a third. The bound, 1/6 (25), is 4×
/// what was measured and half the bug's share.
async fn slow_decode_gets_at_most_a_sixth(decode_policy: &str) {
    let (slow, total) = slow_decode_share(decode_policy).await;
    assert!(
        slow * 6 <= total,
        "{decode_policy} sent {slow} of {total} requests to the slow decode"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_load_gives_a_slow_decode_reporting_an_empty_queue_at_most_a_sixth() {
    slow_decode_gets_at_most_a_sixth("least_load").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_of_two_gives_a_slow_decode_reporting_an_empty_queue_at_most_a_sixth() {
    slow_decode_gets_at_most_a_sixth("power_of_two").await;
}
