//! Routing policies as wired into the gateway: prompt text reaches cache_aware, sticky keys reach
//! manual, and each leg runs its own instance.

use std::collections::HashMap;
use std::time::Duration;

use mock_engine::{EngineKind, MockEngine, MockEngineConfig, Role};
use serde_json::json;

use crate::harness::Gateway;

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
