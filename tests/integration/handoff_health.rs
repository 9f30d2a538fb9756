//! Handoff health through the real binary: a decode that silently recomputes the prompt is
//! counted and attributed to its link; a prefill → decode link that fails (or recomputes) its
//! handoffs is taken out of pair selection while both workers keep serving with their other
//! partners, and comes back, half-open then closed, once it heals. Mocks on 127.0.70.x.

use std::time::{Duration, Instant};

use mock_engine::{EngineKind, Fault, LoadFailurePolicy, MockEngine, MockEngineConfig, Role};
use serde_json::{json, Value};

use crate::harness::{metric_value, Gateway};

const P1: [u8; 4] = [127, 0, 70, 1];
const P2: [u8; 4] = [127, 0, 70, 2];
const D1: [u8; 4] = [127, 0, 70, 3];
const D2: [u8; 4] = [127, 0, 70, 4];

fn ip(a: [u8; 4]) -> String {
    format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3])
}

/// Two prefills and two decodes of `kind`; `tweak` adjusts each config.
async fn fleet(
    kind: EngineKind,
    tweak: impl Fn(&mut MockEngineConfig),
) -> (Vec<MockEngine>, Vec<MockEngine>) {
    let mut prefills = Vec::new();
    let mut decodes = Vec::new();
    for (role, addr) in [
        (Role::Prefill, P1),
        (Role::Prefill, P2),
        (Role::Decode, D1),
        (Role::Decode, D2),
    ] {
        let mut c = MockEngineConfig::test(kind, role, addr);
        tweak(&mut c);
        let e = MockEngine::spawn(c).await.unwrap();
        match role {
            Role::Prefill => prefills.push(e),
            _ => decodes.push(e),
        }
    }
    (prefills, decodes)
}

/// How long an open link stays out. The checks made while it is out stop well before: within
/// half of it, which leaves a loaded machine 5 s for them.
const COOLDOWN: Duration = Duration::from_secs(10);

/// Link health judged after 4 handoffs, probed back after 10 s (`COOLDOWN`), closed by 2 good
/// probes. The per-worker breakers are not under test here: they are set out of reach. Prefills
/// in turn, decodes at random (a shared round-robin could pair each prefill with one decode
/// forever).
const LINK_KEYS: &str =
    "  link_min_handoffs: 4\n  link_cooldown_secs: 10\n  link_probe_successes: 2\n  \
    cb_failure_threshold: 1000\n  decode_policy: random\n";

async fn gateway(prefills: &[MockEngine], decodes: &[MockEngine]) -> Gateway {
    let workers: Vec<Value> = prefills
        .iter()
        .chain(decodes)
        .map(MockEngine::worker_spec)
        .collect();
    let mut gw = Gateway::start(&workers, LINK_KEYS).await;
    gw.wait_ready().await;
    gw
}

fn chat() -> Value {
    json!({"model": "mock-model", "max_tokens": 4,
        "messages": [{"role": "user", "content": "Say something about links and handoffs."}]})
}

/// How many of `decode`'s records came from the prefill at `prefill` (by the KV peer address).
fn served_by(decode: &MockEngine, prefill: [u8; 4], from: usize) -> usize {
    let host = format!("{}:", ip(prefill));
    decode.records()[from..]
        .iter()
        .filter(|r| {
            r.handoff
                .peer_addr
                .as_deref()
                .is_some_and(|p| p.starts_with(&host))
        })
        .count()
}

fn outcome(m: &str, outcome: &str, connector: &str) -> f64 {
    metric_value(
        m,
        "pdgate_pd_handoff_outcome_total",
        &[("outcome", outcome), ("connector", connector)],
    )
    .unwrap_or(0.0)
}

/// The prefill's `links_out` in `/workers`.
async fn links_out(gw: &Gateway, prefill: &MockEngine) -> Vec<Value> {
    let workers = gw.get("/workers").await.json();
    workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["url"] == prefill.api_url().as_str())
        .and_then(|w| w["links_out"].as_array().cloned())
        .unwrap_or_default()
}

/// While P1 → D1 is out (for at most half the cooldown, so it cannot turn half-open): sends
/// requests until D1 served P2 and P1 served D2 — both workers still in service — and checks
/// that P1 → D1 carried none of them.
async fn while_out(gw: &Gateway, decodes: &[MockEngine], tripped: Instant) {
    let marks: Vec<usize> = decodes.iter().map(|d| d.records().len()).collect();
    let mut sent = 0;
    loop {
        let both_serving =
            served_by(&decodes[0], P2, marks[0]) > 0 && served_by(&decodes[1], P1, marks[1]) > 0;
        if both_serving && sent >= 8 {
            break;
        }
        assert!(
            tripped.elapsed() < COOLDOWN / 2,
            "after {sent} requests, D1 served P2: {}, D2 served P1: {}",
            served_by(&decodes[0], P2, marks[0]),
            served_by(&decodes[1], P1, marks[1])
        );
        let r = gw.post("/v1/chat/completions", &chat()).await;
        assert_eq!(r.status, 200, "{}", r.text());
        sent += 1;
    }
    assert_eq!(
        served_by(&decodes[0], P1, marks[0]),
        0,
        "the open link was used"
    );
}

/// Sends requests until `done` holds (each must answer 200), at most `max`.
async fn drive(gw: &Gateway, max: usize, mut done: impl FnMut(&str) -> bool) -> usize {
    for sent in 1..=max {
        let r = gw.post("/v1/chat/completions", &chat()).await;
        assert_eq!(r.status, 200, "{}", r.text());
        if done(&gw.metrics().await) {
            return sent;
        }
    }
    panic!(
        "the condition did not hold after {max} requests\n{}",
        gw.metrics().await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_recompute_is_counted_and_its_link_taken_out_until_it_heals() {
    // vLLM NIXL decodes that report cached tokens and recompute when a KV load fails.
    let (prefills, decodes) = fleet(EngineKind::Vllm, |c| {
        c.prompt_tokens_details = true;
        c.kv_load_failure_policy = LoadFailurePolicy::Recompute;
    })
    .await;
    // P1 → D1 is broken: D1's reads from P1 fail, so D1 recomputes those prompts (correctly).
    decodes[0].inject(Fault::LinkDown { peer: ip(P1) }).await;
    let gw = gateway(&prefills, &decodes).await;

    let trips = |m: &str| metric_value(m, "pdgate_pd_link_trips_total", &[]).unwrap_or(0.0);
    drive(&gw, 80, |m| trips(m) >= 1.0).await;
    let tripped = Instant::now();
    let m = gw.metrics().await;
    assert!(outcome(&m, "recomputed", "nixl") >= 2.0, "{m}");
    assert!(
        metric_value(
            &m,
            "pdgate_pd_recomputed_prompt_tokens_total",
            &[("connector", "nixl")]
        )
        .unwrap_or(0.0)
            > 0.0,
        "{m}"
    );
    assert_eq!(metric_value(&m, "pdgate_pd_links_open", &[]), Some(1.0));
    let (p1_url, d1_url) = (prefills[0].api_url(), decodes[0].api_url());
    let link_series = [("prefill", p1_url.as_str()), ("decode", d1_url.as_str())];
    assert_eq!(
        metric_value(&m, "pdgate_pd_link_open", &link_series),
        Some(1.0),
        "{m}"
    );
    let out = links_out(&gw, &prefills[0]).await;
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0]["decode"], decodes[0].api_url().as_str());
    assert_eq!(out[0]["state"], "open");
    assert!(links_out(&gw, &prefills[1]).await.is_empty());
    let log = gw.log();
    assert_eq!(
        log.matches("recomputed the prompt instead of receiving its KV (first occurrence")
            .count(),
        1,
        "the first recompute on the link is logged once\n{log}"
    );
    let debug = gw.get("/debug/handoffs").await.json();
    assert_eq!(
        debug["links"][0]["prefill"],
        prefills[0].api_url().as_str(),
        "{debug}"
    );

    // While it is out, P1 → D1 carries nothing; every other pair keeps serving, and hands
    // its KV over.
    while_out(&gw, &decodes, tripped).await;
    let m = gw
        .metrics_when(|m| outcome(m, "transferred", "nixl") >= 1.0)
        .await;
    assert!(outcome(&m, "transferred", "nixl") >= 1.0, "{m}");

    // Healed: after the cooldown the link is probed and restored.
    decodes[0].reset().await;
    let restored = Instant::now() + COOLDOWN + Duration::from_secs(20);
    loop {
        let r = gw.post("/v1/chat/completions", &chat()).await;
        assert_eq!(r.status, 200, "{}", r.text());
        if links_out(&gw, &prefills[0]).await.is_empty() {
            break;
        }
        assert!(Instant::now() < restored, "the link never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let m = gw
        .metrics_when(|m| metric_value(m, "pdgate_pd_links_open", &[]) == Some(0.0))
        .await;
    assert_eq!(metric_value(&m, "pdgate_pd_links_open", &[]), Some(0.0));
    assert_eq!(
        metric_value(&m, "pdgate_pd_link_open", &link_series),
        None,
        "a closed link has no series"
    );
    let mark = decodes[0].records().len();
    for _ in 0..40 {
        assert_eq!(gw.post("/v1/chat/completions", &chat()).await.status, 200);
    }
    assert!(
        served_by(&decodes[0], P1, mark) > 0,
        "the restored link is used again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_that_fails_its_handoffs_is_taken_out_while_both_workers_keep_serving() {
    // SGLang: P1 cannot send KV to D1 (both legs of such a pair fail; the gateway retries the
    // request on another pair, so clients still get answers).
    let (prefills, decodes) = fleet(EngineKind::Sglang, |_| {}).await;
    prefills[0].inject(Fault::LinkDown { peer: ip(D1) }).await;
    let gw = gateway(&prefills, &decodes).await;
    let trips = |m: &str| metric_value(m, "pdgate_pd_link_trips_total", &[]).unwrap_or(0.0);
    drive(&gw, 80, |m| trips(m) >= 1.0).await;
    let tripped = Instant::now();
    let m = gw.metrics().await;
    assert!(
        metric_value(
            &m,
            "pdgate_pd_handoff_outcome_total",
            &[("outcome", "failed"), ("connector", "bootstrap")]
        )
        .unwrap_or(0.0)
            >= 2.0,
        "{m}"
    );
    let out = links_out(&gw, &prefills[0]).await;
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0]["decode"], decodes[0].api_url().as_str());

    let failed_before = outcome(&gw.metrics().await, "failed", "bootstrap");
    while_out(&gw, &decodes, tripped).await;
    assert_eq!(
        outcome(&gw.metrics().await, "failed", "bootstrap"),
        failed_before,
        "no handoff failed once the link was out"
    );
    let workers = gw.get("/workers").await.json();
    for w in workers["workers"].as_array().unwrap() {
        assert_eq!(w["status"], "ready", "{w}");
    }

    // Still broken when probed: it goes straight back out.
    let reopened = Instant::now() + COOLDOWN + Duration::from_secs(20);
    let trips_before = trips(&gw.metrics().await);
    loop {
        let r = gw.post("/v1/chat/completions", &chat()).await;
        assert_eq!(r.status, 200, "{}", r.text());
        if trips(&gw.metrics().await) > trips_before {
            break;
        }
        assert!(
            Instant::now() < reopened,
            "a failing probe did not reopen the link"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nixl_params_without_blocks_are_not_relayed_to_a_decode_that_would_assert_on_them() {
    let spawn = |role, addr| {
        let mut c = MockEngineConfig::test(EngineKind::Vllm, role, addr);
        // vLLM's scheduler asserts on such params: the engine dies.
        c.malformed_params = mock_engine::MalformedParams::Crash;
        MockEngine::spawn(c)
    };
    let p = spawn(Role::Prefill, [127, 0, 70, 5]).await.unwrap();
    let d = spawn(Role::Decode, [127, 0, 70, 6]).await.unwrap();
    p.inject(Fault::NoBlocks { count: Some(1) }).await;
    let mut gw = Gateway::start(&[p.worker_spec(), d.worker_spec()], "").await;
    gw.wait_ready().await;
    let r = gw.post("/v1/chat/completions", &chat()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let rec = &d.records()[0];
    assert!(
        rec.body
            .get("kv_transfer_params")
            .is_none_or(Value::is_null),
        "params without blocks reached the decode: {}",
        rec.body
    );
    let health = mock_engine::client::get(&format!("{}/health", d.api_url()))
        .await
        .unwrap();
    assert_eq!(health.status, 200, "the decode engine died");
    // The attempt is accounted once it has returned, which can be after the client's answer.
    let m = gw
        .metrics_when(|m| outcome(m, "recomputed", "nixl") >= 1.0)
        .await;
    assert_eq!(
        metric_value(&m, "smg_pd_kv_transfer_failures_total", &[]),
        Some(1.0)
    );
    assert_eq!(outcome(&m, "recomputed", "nixl"), 1.0, "{m}");
    // The next request hands its KV over as usual.
    let r = gw.post("/v1/chat/completions", &chat()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(d.records()[1].handoff.kv_source.as_deref(), Some("remote"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canaries_find_a_broken_link_with_no_user_traffic() {
    let (prefills, decodes) = fleet(EngineKind::Sglang, |_| {}).await;
    prefills[0].inject(Fault::LinkDown { peer: ip(D1) }).await;
    let workers: Vec<Value> = prefills
        .iter()
        .chain(&decodes)
        .map(MockEngine::worker_spec)
        .collect();
    let extra = format!(
        "{}  link_min_handoffs: 2\n  link_canary_interval_secs: 1\n",
        LINK_KEYS.replace("  link_min_handoffs: 4\n", "")
    );
    let mut gw = Gateway::start(&workers, &extra).await;
    gw.wait_ready().await;

    // No client request at all: the canaries alone take the broken link out.
    let found = Instant::now() + Duration::from_secs(30);
    loop {
        let out = links_out(&gw, &prefills[0]).await;
        if out.len() == 1 {
            assert_eq!(out[0]["decode"], decodes[0].api_url().as_str());
            break;
        }
        assert!(
            Instant::now() < found,
            "the canaries did not find the link\n{}",
            gw.metrics().await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let m = gw.metrics().await;
    let canaries =
        |result| metric_value(&m, "pdgate_pd_canaries_total", &[("result", result)]).unwrap_or(0.0);
    assert!(canaries("failed") >= 2.0, "{m}");
    assert!(
        canaries("passed") >= 3.0,
        "the healthy links were canaried too\n{m}"
    );
    assert!(links_out(&gw, &prefills[1]).await.is_empty());
    // Healed, the canaries probe it back (after the cooldown) and restore it.
    prefills[0].reset().await;
    let restored = Instant::now() + COOLDOWN + Duration::from_secs(30);
    while !links_out(&gw, &prefills[0]).await.is_empty() {
        assert!(
            Instant::now() < restored,
            "the canaries did not restore the link"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every request the engines saw was a canary: pinned, one attempt, the canary prompt.
    for d in &decodes {
        for r in d.records() {
            assert!(
                r.body.to_string().contains("pdgate link canary"),
                "{}",
                r.body
            );
            assert!(
                !r.headers.contains_key("x-pdgate-canary"),
                "the canary secret reached an engine"
            );
        }
    }
}

/// Keeps `clients` requests of `body` in flight until the returned flag is set.
fn load(
    gw: &Gateway,
    clients: usize,
    body: Value,
) -> (
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    Vec<tokio::task::JoinHandle<()>>,
) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tasks = (0..clients)
        .map(|_| {
            let (url, body, stop) = (gw.url("/v1/chat/completions"), body.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = mock_engine::client::post_json(&url, &body).await.unwrap();
                    assert_eq!(r.status, 200, "{}", r.text());
                }
            })
        })
        .collect();
    (stop, tasks)
}

/// Polls `/debug/capacity` until it names `bottleneck`.
async fn advice_names(gw: &Gateway, bottleneck: &str) -> Value {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let advice = gw.get("/debug/capacity").await.json();
        if advice["bottleneck"] == bottleneck {
            return advice;
        }
        assert!(Instant::now() < end, "never {bottleneck}: {advice}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_advice_changes_sides_with_the_load_shape() {
    // A compute-bound prefill (2 ms per prompt token, one pass at a time) and a decode that
    // runs 4 sequences at once, a token every 30 ms.
    let mut pc = MockEngineConfig::test(EngineKind::Sglang, Role::Prefill, [127, 0, 70, 7]);
    pc.prefill_us_per_token = 2000;
    let p = MockEngine::spawn(pc).await.unwrap();
    let mut dc = MockEngineConfig::test(EngineKind::Sglang, Role::Decode, [127, 0, 70, 8]);
    dc.max_running_requests = 4;
    dc.enforce_running_window = true;
    dc.itl_ms = 30;
    dc.natural_stop_every = 0;
    let d = MockEngine::spawn(dc).await.unwrap();
    let mut gw = Gateway::start(
        &[p.worker_spec(), d.worker_spec()],
        "  capacity_window_secs: 2\n  pd_admission_wait_secs: 60\n",
    )
    .await;
    gw.wait_ready().await;
    let idle = gw.get("/debug/capacity").await.json();
    assert_eq!(idle["bottleneck"], Value::Null, "{idle}");

    // Long prompts, one-token answers: prompts queue at the prefill.
    let long_prompt = "tell me about the weather and the sea ".repeat(30);
    let (stop, tasks) = load(
        &gw,
        6,
        json!({"model": "mock-model", "max_tokens": 1,
            "messages": [{"role": "user", "content": long_prompt}]}),
    );
    let advice = advice_names(&gw, "prefill").await;
    assert!(advice["add"]["prefill"].as_u64().unwrap() >= 1, "{advice}");
    assert!(
        advice["advice"]
            .as_str()
            .unwrap()
            .starts_with("prefill is the bottleneck"),
        "{advice}"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }

    // Short prompts, long answers: sequences wait for the decode's window.
    let (stop, tasks) = load(
        &gw,
        6,
        json!({"model": "mock-model", "max_tokens": 40, "ignore_eos": true,
            "messages": [{"role": "user", "content": "hi"}]}),
    );
    let advice = advice_names(&gw, "decode").await;
    assert!(advice["add"]["decode"].as_u64().unwrap() >= 1, "{advice}");
    let m = gw.metrics().await;
    let pressure =
        |role| metric_value(&m, "pdgate_pd_capacity_pressure", &[("role", role)]).unwrap_or(-1.0);
    assert!(pressure("decode") > pressure("prefill"), "{m}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_vllm_decode_that_recomputes_is_told_apart_from_one_that_received_the_kv() {
    // vLLM's gRPC servicer always reports cached_tokens (the connector's included).
    let cfg = |role, addr| {
        let mut c = MockEngineConfig::grpc_test(EngineKind::Vllm, role, addr)
            .with_vocab(crate::grpc_pd::vocab())
            .with_connector(mock_engine::Connector::Nixl);
        c.kv_load_failure_policy = LoadFailurePolicy::Recompute;
        c
    };
    let p = MockEngine::spawn(cfg(Role::Prefill, [127, 0, 70, 9]))
        .await
        .unwrap();
    let d = MockEngine::spawn(cfg(Role::Decode, [127, 0, 70, 10]))
        .await
        .unwrap();
    let extra = format!("  model_path: {}\n", crate::grpc_pd::model_dir().display());
    let mut gw = Gateway::start(&[p.worker_spec(), d.worker_spec()], &extra).await;
    gw.wait_ready().await;
    let body = chat();
    let ask = || gw.post("/v1/chat/completions", &body);

    let r = ask().await;
    assert_eq!(r.status, 200, "{}", r.text());
    // The attempt is accounted once it has returned, which can be after the client's answer.
    let m = gw
        .metrics_when(|m| outcome(m, "transferred", "nixl") >= 1.0)
        .await;
    assert_eq!(outcome(&m, "transferred", "nixl"), 1.0, "{m}");

    d.inject(Fault::LinkDown {
        peer: ip([127, 0, 70, 9]),
    })
    .await;
    let r = ask().await;
    assert_eq!(r.status, 200, "the recompute is silent: {}", r.text());
    let m = gw
        .metrics_when(|m| outcome(m, "recomputed", "nixl") >= 1.0)
        .await;
    assert_eq!(outcome(&m, "recomputed", "nixl"), 1.0, "{m}");
    let prompt = r.json()["usage"]["prompt_tokens"].as_f64().unwrap();
    assert_eq!(
        metric_value(
            &m,
            "pdgate_pd_recomputed_prompt_tokens_total",
            &[("connector", "nixl")]
        ),
        Some(prompt),
        "{m}"
    );
}
