//! Worker lifecycle through the real binary: pairing modes against mixed fleets, circuit
//! breakers opening and recovering (fed only by the legs contacted), whole-pair retries with a
//! new room, and health checks taking a failing worker out and bringing it back.

use std::time::{Duration, Instant};

use mock_engine::{Connector, EngineKind, Fault, FaultMatch, MockEngine, MockEngineConfig, Role};
use serde_json::{json, Value};

use crate::harness::{metric_value, Gateway};

async fn sglang(role: Role, ip: [u8; 4]) -> MockEngine {
    MockEngine::spawn(MockEngineConfig::test(EngineKind::Sglang, role, ip))
        .await
        .unwrap()
}

fn with_labels(mut spec: Value, labels: Value) -> Value {
    let map = spec["labels"].as_object_mut().expect("labels");
    for (k, v) in labels.as_object().unwrap() {
        map.insert(k.clone(), v.clone());
    }
    spec
}

fn generate() -> Value {
    json!({"text": "pair me", "sampling_params": {"max_new_tokens": 2}})
}

async fn started(workers: &[Value], extra: &str) -> Gateway {
    let gw = Gateway::start(workers, extra).await;
    // Wait until every worker is ready (readiness needs one per leg only).
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
    panic!(
        "workers never became ready: {}",
        gw.get("/workers").await.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_modes_decide_which_legs_pair() {
    let p = sglang(Role::Prefill, [127, 0, 0, 2]).await;
    let d = sglang(Role::Decode, [127, 0, 0, 3]).await;
    let pf = with_labels(p.worker_spec(), json!({"kv_cache_dtype": "fp8"}));
    let dauto = with_labels(d.worker_spec(), json!({"kv_cache_dtype": "auto"}));

    // lenient (default): both report a dtype and they differ → refused, naming what differs.
    let gw = started(&[pf.clone(), dauto.clone()], "").await;
    let r = gw.post("/generate", &generate()).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "no_compatible_pd_pair");
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("kv_cache_dtype"), "{msg}");
    assert!(
        msg.contains("sglang/mooncake/dtype=fp8") && msg.contains("dtype=auto"),
        "{msg}"
    );
    let keys: Vec<String> = gw.get("/workers").await.json()["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["pd_pairing"].as_str().unwrap().to_string())
        .collect();
    assert!(
        keys.contains(&"sglang/mooncake/dtype=fp8".to_string()),
        "{keys:?}"
    );
    assert!(p.records().is_empty() && d.records().is_empty());
    drop(gw);

    // off: everything pairs.
    let gw = started(&[pf.clone(), dauto], "  pd_pairing_mode: \"off\"\n").await;
    assert_eq!(gw.post("/generate", &generate()).await.status, 200);
    drop(gw);

    // A fact only one leg reports: lenient pairs, strict refuses.
    let plain = d.worker_spec();
    let gw = started(&[pf.clone(), plain.clone()], "").await;
    assert_eq!(gw.post("/generate", &generate()).await.status, 200);
    drop(gw);
    let gw = started(&[pf.clone(), plain], "  pd_pairing_mode: strict\n").await;
    let r = gw.post("/generate", &generate()).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["code"], "no_compatible_pd_pair");
    drop(gw);

    // Different transports never pair under lenient.
    let nixl = with_labels(
        d.worker_spec(),
        json!({"disaggregation_transfer_backend": "nixl"}),
    );
    let gw = started(&[p.worker_spec(), nixl], "").await;
    let r = gw.post("/generate", &generate()).await;
    assert_eq!(r.status, 503);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("transport"));
    drop(gw);

    // Explicit protocols on both legs decide alone: equal pairs despite the dtype, unequal not.
    let pa = with_labels(pf.clone(), json!({"pairing_protocol": "team-a"}));
    let da = with_labels(
        d.worker_spec(),
        json!({"kv_cache_dtype": "auto", "pairing_protocol": "team-a"}),
    );
    let gw = started(&[pa.clone(), da], "  pd_pairing_mode: strict\n").await;
    assert_eq!(gw.post("/generate", &generate()).await.status, 200);
    drop(gw);
    let db = with_labels(d.worker_spec(), json!({"pairing_protocol": "team-b"}));
    let gw = started(&[pa, db], "").await;
    assert_eq!(gw.post("/generate", &generate()).await.status, 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_without_a_compatible_decode_is_skipped() {
    let p_bad = sglang(Role::Prefill, [127, 0, 0, 2]).await;
    let p_good = sglang(Role::Prefill, [127, 0, 0, 4]).await;
    let d = sglang(Role::Decode, [127, 0, 0, 3]).await;
    let gw = started(
        &[
            with_labels(p_bad.worker_spec(), json!({"page_size": "64"})),
            with_labels(p_good.worker_spec(), json!({"page_size": "16"})),
            with_labels(d.worker_spec(), json!({"page_size": "16"})),
        ],
        "",
    )
    .await;
    for _ in 0..6 {
        assert_eq!(gw.post("/generate", &generate()).await.status, 200);
    }
    assert!(
        p_bad.records().is_empty(),
        "an incompatible prefill got traffic"
    );
    assert_eq!(p_good.records().len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_opens_on_consecutive_failures_and_recovers() {
    let p = sglang(Role::Prefill, [127, 0, 0, 2]).await;
    let d = sglang(Role::Decode, [127, 0, 0, 3]).await;
    // The breaker stays open 5 s: long enough for the checks below on a loaded machine.
    let extra = "  cb_failure_threshold: 2\n  cb_success_threshold: 1\n  cb_timeout_duration_secs: 5\n  retry_max_retries: 1\n";
    let gw = started(&[p.worker_spec(), d.worker_spec()], extra).await;
    let fail = Fault::FailStatus {
        status: 500,
        body: None,
        count: Some(2),
        matcher: FaultMatch::default(),
    };
    d.inject(fail).await;
    for _ in 0..2 {
        let r = gw.post("/generate", &generate()).await;
        assert_eq!(r.status, 500, "{}", r.text());
        assert_eq!(r.json()["error"]["code"], "decode_internal_error");
    }
    let decode_url = d.api_url();
    let m = gw.metrics().await;
    assert_eq!(
        metric_value(&m, "smg_worker_cb_state", &[("worker", &decode_url)]),
        Some(1.0),
        "{m}"
    );
    // Only the leg that failed is penalized.
    assert_eq!(
        metric_value(&m, "smg_worker_cb_state", &[("worker", &p.api_url())]),
        Some(0.0)
    );
    let r = gw.post("/generate", &generate()).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["code"], "no_available_workers");
    assert_eq!(r.header("retry-after"), Some("1"), "SMG 1.13.0's header");
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("decode"));
    let recorded = d.records().len();

    // After the open timeout the breaker half-opens; one success closes it.
    let mut ok = false;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if gw.post("/generate", &generate()).await.status == 200 {
            ok = true;
            break;
        }
    }
    assert!(ok, "the breaker never let traffic through again");
    assert!(d.records().len() > recorded);
    // The leg's outcome is recorded as its relay ends, which the client's answer may precede.
    let m = gw
        .metrics_when(|m| {
            metric_value(m, "smg_worker_cb_state", &[("worker", &decode_url)]) == Some(0.0)
        })
        .await;
    assert_eq!(
        metric_value(&m, "smg_worker_cb_state", &[("worker", &decode_url)]),
        Some(0.0)
    );
    assert!(metric_value(
        &m,
        "smg_worker_cb_transitions_total",
        &[("worker", &decode_url), ("to", "open")]
    )
    .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_vllm_prefill_never_touches_the_decode_breaker() {
    let spawn = |role, ip: [u8; 4]| {
        MockEngine::spawn(
            MockEngineConfig::test(EngineKind::Vllm, role, ip).with_connector(Connector::Nixl),
        )
    };
    let p = spawn(Role::Prefill, [127, 0, 0, 2]).await.unwrap();
    let d = spawn(Role::Decode, [127, 0, 0, 3]).await.unwrap();
    let gw = started(
        &[p.worker_spec(), d.worker_spec()],
        "  cb_failure_threshold: 2\n  retry_max_retries: 1\n",
    )
    .await;
    p.inject(Fault::FailStatus {
        status: 503,
        body: None,
        count: Some(3),
        matcher: FaultMatch::default(),
    })
    .await;
    for _ in 0..3 {
        let r = gw
            .post(
                "/v1/completions",
                &json!({"model": "mock-model", "prompt": "x", "max_tokens": 2}),
            )
            .await;
        assert!(r.status == 503, "{}", r.text());
    }
    let m = gw.metrics().await;
    assert_eq!(
        metric_value(&m, "smg_worker_cb_state", &[("worker", &p.api_url())]),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric_value(&m, "smg_worker_cb_state", &[("worker", &d.api_url())]),
        Some(0.0)
    );
    assert!(d.records().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_lands_on_another_pair_with_a_new_room_and_drops_the_first_legs() {
    let p1 = sglang(Role::Prefill, [127, 0, 0, 2]).await;
    let p2 = sglang(Role::Prefill, [127, 0, 0, 4]).await;
    let d = sglang(Role::Decode, [127, 0, 0, 3]).await;
    let gw = started(&[p1.worker_spec(), p2.worker_spec(), d.worker_spec()], "").await;
    // Round robin sends the first attempt to p1, which fails; the retry goes to p2.
    p1.inject(Fault::FailStatus {
        status: 503,
        body: None,
        count: Some(1),
        matcher: FaultMatch::default(),
    })
    .await;
    let r = gw.post("/generate", &generate()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // The first attempt's decode leg was dropped when p1 failed — or never got out at all, when
    // p1's error arrived before it was written.
    let records = d
        .wait_for(Duration::from_secs(5), |e| {
            let r = e.records();
            !r.is_empty() && r.iter().all(|r| r.is_done())
        })
        .await;
    assert!(records);
    let records = d.records();
    assert!(records.len() <= 2, "decode legs: {records:?}");
    let last = records.last().unwrap();
    if records.len() == 2 {
        assert!(
            records[0].outcome.cancelled,
            "the first attempt's decode leg was not dropped"
        );
    }
    let first_room = &p1.records()[0].body["bootstrap_room"];
    let retry_room = &last.body["bootstrap_room"];
    assert_ne!(first_room, retry_room, "the retry reused the room");
    assert_eq!(p2.records()[0].body["bootstrap_room"], *retry_room);
    assert_eq!(
        last.handoff.peer_addr.as_deref(),
        Some(format!("{}:{}", p2.host(), p2.bootstrap_port().unwrap()).as_str())
    );
    let m = gw.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "smg_worker_retries_total",
            &[("worker_type", "decode"), ("endpoint", "generate")]
        ),
        Some(1.0)
    );
    for e in [&p1, &p2, &d] {
        assert!(
            e.wait_idle(Duration::from_secs(5)).await,
            "rooms left open: {:?}",
            e.rooms()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_take_a_dead_decode_out_and_bring_it_back() {
    // IPs no other test uses: the decode's port stays free on its IP while it is down.
    let p = sglang(Role::Prefill, [127, 0, 11, 2]).await;
    let d = sglang(Role::Decode, [127, 0, 11, 3]).await;
    let port = d.port();
    let extra = "  health_failure_threshold: 1\n  health_success_threshold: 1\n  health_check_timeout_secs: 1\n  retry_max_retries: 1\n";
    let gw = started(&[p.worker_spec(), d.worker_spec()], extra).await;
    d.kill();
    drop(d);
    wait_not_ready(&gw).await;
    let w = gw.get("/workers").await.json();
    let decode = w["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["worker_type"] == "decode")
        .unwrap()
        .clone();
    assert_eq!(decode["status"], "not_ready");
    assert_eq!(decode["is_healthy"], false);
    assert_eq!(gw.post("/generate", &generate()).await.status, 503);

    let d2 = decode_back_at(&gw, [127, 0, 11, 3], port).await;
    assert_eq!(gw.post("/generate", &generate()).await.status, 200);
    assert_eq!(d2.records().len(), 1);
}

/// SMG 1.13.0's health re-admission: a decode whose breaker opened and that then came back
/// (the health checker promoted it to Ready again) serves at once, not only after the breaker's
/// open timeout — here an hour, so only the re-admission can explain the 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_back_in_health_is_readmitted_before_its_breaker_timeout() {
    // IPs no other test uses: the decode's port stays free on its IP while it is down.
    let p = sglang(Role::Prefill, [127, 0, 12, 2]).await;
    let d = sglang(Role::Decode, [127, 0, 12, 3]).await;
    let port = d.port();
    let mut decode_spec = d.worker_spec();
    decode_spec["resilience"] =
        json!({"cb_failure_threshold": 1, "cb_success_threshold": 1, "cb_timeout_secs": 3600});
    let extra = "  health_failure_threshold: 1\n  health_success_threshold: 1\n  health_check_timeout_secs: 1\n  retry_max_retries: 1\n";
    let gw = started(&[p.worker_spec(), decode_spec], extra).await;
    let decode_url = d.api_url();

    d.inject(Fault::FailStatus {
        status: 500,
        body: None,
        count: Some(1),
        matcher: FaultMatch::default(),
    })
    .await;
    assert_eq!(gw.post("/generate", &generate()).await.status, 500);
    let m = gw
        .metrics_when(|m| {
            metric_value(m, "smg_worker_cb_state", &[("worker", &decode_url)]) == Some(1.0)
        })
        .await;
    assert_eq!(
        metric_value(&m, "smg_worker_cb_state", &[("worker", &decode_url)]),
        Some(1.0),
        "{m}"
    );
    let r = gw.post("/generate", &generate()).await;
    assert_eq!(r.status, 503, "{}", r.text());

    // The engine goes away and comes back on the same address.
    d.kill();
    drop(d);
    wait_not_ready(&gw).await;
    let d2 = decode_back_at(&gw, [127, 0, 12, 3], port).await;

    let r = gw.post("/generate", &generate()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(d2.records().len(), 1);
    let m = gw
        .metrics_when(|m| {
            metric_value(m, "smg_worker_cb_state", &[("worker", &decode_url)]) == Some(0.0)
        })
        .await;
    assert_eq!(
        metric_value(
            &m,
            "smg_worker_cb_health_readmissions_total",
            &[("worker", &decode_url)]
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric_value(&m, "smg_worker_cb_state", &[("worker", &decode_url)]),
        Some(0.0),
        "half-open, then closed by the success"
    );
}

/// Waits (10 s at most) until the gateway is not ready: its only decode is down.
async fn wait_not_ready(gw: &Gateway) {
    for _ in 0..200 {
        if gw.get("/readiness").await.status == 503 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("a dead decode stayed ready");
}

/// A decode engine started again on `ip:port`, once the gateway is ready with it.
async fn decode_back_at(gw: &Gateway, ip: [u8; 4], port: u16) -> MockEngine {
    let mut cfg = MockEngineConfig::test(EngineKind::Sglang, Role::Decode, ip);
    cfg.port = port;
    let d = MockEngine::spawn(cfg).await.unwrap();
    gw_wait_ready(gw).await;
    d
}

async fn gw_wait_ready(gw: &Gateway) {
    for _ in 0..200 {
        if gw.get("/readiness").await.status == 200 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("never ready again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overloaded_legs_are_shed_with_retry_after_and_not_retried() {
    let p = sglang(Role::Prefill, [127, 0, 0, 2]).await;
    let d = sglang(Role::Decode, [127, 0, 0, 3]).await;
    let extra = "  worker_overload_waiting_requests: 2\n  load_monitor_interval: 1\n";
    let gw = started(&[p.worker_spec(), d.worker_spec()], extra).await;
    d.report_load(Some(mock_engine::LoadReport {
        waiting: 5,
        running: 1,
        token_usage: 0.2,
    }));
    let mut shed = None;
    for _ in 0..100 {
        let r = gw.post("/generate", &generate()).await;
        if r.status == 503 {
            shed = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = shed.expect("the overloaded decode was never shed");
    assert_eq!(
        r.json()["error"]["code"],
        "worker_overload_protection_shed",
        "{}",
        r.text()
    );
    assert_eq!(r.header("retry-after"), Some("1"));
    let (p_before, d_before) = (p.records().len(), d.records().len());
    let r = gw.post("/generate", &generate()).await;
    assert_eq!(r.status, 503);
    assert_eq!(
        (p.records().len(), d.records().len()),
        (p_before, d_before),
        "a shed request reached an engine"
    );
    let m = gw.metrics().await;
    assert!(
        metric_value(
            &m,
            "smg_worker_overload_shed_total",
            &[("stage", "selection")]
        )
        .unwrap_or(0.0)
            >= 2.0
    );
    assert_eq!(
        metric_value(&m, "smg_worker_retries_total", &[("worker_type", "decode")]),
        None,
        "a shed was retried"
    );

    d.report_load(None);
    let mut back = false;
    for _ in 0..100 {
        if gw.post("/generate", &generate()).await.status == 200 {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(back, "the decode never came back after its load dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dp_aware_registers_one_worker_per_rank_and_legs_carry_the_ranks() {
    let spawn = |role, ip: [u8; 4]| {
        let mut c = MockEngineConfig::test(EngineKind::Sglang, role, ip);
        c.dp_size = 2;
        MockEngine::spawn(c)
    };
    let p = spawn(Role::Prefill, [127, 0, 0, 2]).await.unwrap();
    let d = spawn(Role::Decode, [127, 0, 0, 3]).await.unwrap();
    let reference = sglang(Role::Both, [127, 0, 0, 4]).await;
    let gw = Gateway::start(&[p.worker_spec(), d.worker_spec()], "  dp_aware: true\n").await;
    let mut urls = Vec::new();
    for _ in 0..200 {
        let w = gw.get("/workers").await.json();
        let list = w["workers"].as_array().unwrap().clone();
        if list.len() == 4 && list.iter().all(|w| w["status"] == "ready") {
            urls = list
                .iter()
                .map(|w| w["url"].as_str().unwrap().to_string())
                .collect();
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    for want in [
        format!("{}@0", p.api_url()),
        format!("{}@1", p.api_url()),
        format!("{}@0", d.api_url()),
        format!("{}@1", d.api_url()),
    ] {
        assert!(urls.contains(&want), "{want} not registered: {urls:?}");
    }
    let body = json!({"text": "ranked", "sampling_params": {"max_new_tokens": 4}});
    for _ in 0..4 {
        let r = gw.post("/generate", &body).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let reference =
            mock_engine::client::post_json(&format!("{}/generate", reference.api_url()), &body)
                .await
                .unwrap();
        assert_eq!(
            mock_engine::output::extract("/generate", false, &r.body).unwrap(),
            mock_engine::output::extract("/generate", false, &reference.body).unwrap()
        );
    }
    for (pr, dr) in p.records().iter().zip(d.records().iter()) {
        assert_eq!(pr.path, "/generate", "legs go to the base URL");
        let rank = pr.body["routed_dp_rank"]
            .as_u64()
            .expect("prefill leg carries routed_dp_rank");
        assert_eq!(dr.body["disagg_prefill_dp_rank"].as_u64(), Some(rank));
        assert!(dr.body["routed_dp_rank"].is_u64());
        assert_eq!(
            pr.body["bootstrap_room"].as_u64().unwrap() % 2,
            rank,
            "room not placed on the prefill's rank"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_generate_checks_one_pair_and_names_the_failing_leg() {
    let p = sglang(Role::Prefill, [127, 0, 0, 2]).await;
    let d = sglang(Role::Decode, [127, 0, 0, 3]).await;
    let extra = "  health_check_interval_secs: 60\n";
    let gw = started(&[p.worker_spec(), d.worker_spec()], extra).await;
    let r = gw.get("/health_generate").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains(&p.api_url()) && r.text().contains(&d.api_url()));
    // The decode dies; its /health_generate fails before the periodic probe notices.
    d.kill();
    let r = gw.get("/health_generate").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["code"], "health_generate_failed");
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("decode") && !msg.contains("prefill"), "{msg}");
}

/// Engines started together with the gateway (a systemd unit, a pod) are not listening at its
/// first probe. A worker that has never been healthy is re-probed with a short doubling backoff,
/// so readiness follows the engines within seconds, not one startup interval (30 s) later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_whose_engines_start_after_the_gateway_are_ready_within_seconds() {
    let configs = [
        MockEngineConfig::test(EngineKind::Sglang, Role::Prefill, [127, 0, 10, 1]),
        MockEngineConfig::test(EngineKind::Sglang, Role::Decode, [127, 0, 10, 2]),
    ];
    // Learn each engine's ports, then stop it: the gateway starts before its engines.
    let mut specs = Vec::new();
    let mut later = Vec::new();
    for cfg in configs {
        let e = MockEngine::spawn(cfg.clone()).await.unwrap();
        specs.push(e.worker_spec());
        later.push(MockEngineConfig {
            port: e.port(),
            bootstrap_port: e.bootstrap_port().unwrap_or(0),
            ..cfg
        });
        e.kill();
    }
    // SMG's default startup check interval, which the old code waited in full.
    let gw = Gateway::start(&specs, "  worker_startup_check_interval: 30\n").await;
    let probed_twice = |m: &str| {
        ["prefill", "decode"].iter().all(|role| {
            metric_value(
                m,
                "smg_worker_health_checks_total",
                &[("worker_type", role), ("result", "failure")],
            )
            .is_some_and(|n| n >= 2.0)
        })
    };
    let m = gw.metrics_when(probed_twice).await;
    assert!(probed_twice(&m), "each worker was not probed twice:\n{m}");
    assert_eq!(gw.get("/readiness").await.status, 503);

    let mut engines = Vec::new();
    for cfg in later {
        engines.push(MockEngine::spawn(cfg).await.unwrap());
    }
    let up = Instant::now();
    let mut ready = false;
    // Well under the 30 s interval; the backoff has reached at most a few seconds by now.
    while up.elapsed() < Duration::from_secs(15) {
        if gw.get("/readiness").await.status == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    eprintln!("engines up -> gateway ready: {:?}", up.elapsed());
    assert!(
        ready,
        "the gateway was not ready 15 s after its engines came up\n{}",
        gw.get("/workers").await.text()
    );
    assert_eq!(gw.post("/generate", &generate()).await.status, 200);
}
