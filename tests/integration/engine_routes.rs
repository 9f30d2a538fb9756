//! The routes SMG's PD router answers from its workers rather than from a pair: `/v1/models`,
//! `/get_server_info`, `/get_model_info`, `/flush_cache` and `/get_loads`, in SMG 1.13.0's
//! shapes.

use serde_json::{json, Value};

use crate::harness::{error_code, gateway_for, Gateway, RawEngine, SglangFleet};

async fn engine_get(url: &str) -> Value {
    mock_engine::client::get(url)
        .await
        .expect("the engine answers")
        .json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_routes_answer_from_the_registered_workers() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = gateway_for(&fleet, "").await;

    let r = gw.get("/v1/models").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"object": "list", "data": [
            {"id": "mock-model", "object": "model", "created": 0, "owned_by": "self_hosted"}]})
    );

    // One model by id (SMG 1.13.0's card and refusal); an empty id is no route.
    let r = gw.get("/v1/models/mock-model").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"id": "mock-model", "object": "model", "created": 0, "owned_by": "self_hosted"})
    );
    let r = gw.get("/v1/models/not-served").await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(error_code(&r), "model_not_found");
    assert_eq!(
        r.json()["error"]["message"],
        "No worker available for model 'not-served'"
    );
    let r = gw.get("/v1/models/").await;
    assert_eq!((r.status, error_code(&r)), (404, "unknown_url".to_string()));

    // The first prefill worker's own answers, as they are.
    for path in ["/get_server_info", "/get_model_info"] {
        let r = gw.get(path).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        let direct = engine_get(&format!("{}{path}", fleet.prefill.api_url())).await;
        assert_eq!(r.json(), direct, "{path}");
    }
    // And it is the prefill's, not the decode's (their model info is the same).
    let info = gw.get("/get_server_info").await.json();
    assert_eq!(info["disaggregation_mode"], "prefill", "{info}");
    assert_eq!(info["port"], json!(fleet.prefill.port()), "{info}");

    let r = gw.post("/flush_cache", &json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"status": "success", "message": "Successfully flushed cache on all 2 workers",
            "workers_flushed": 2, "total_http_workers": 2, "total_grpc_workers": 0,
            "total_zmq_workers_skipped": 0, "total_workers": 2})
    );
}

/// What each route answers when the engines fail it, or when there are none; `/flush_cache`
/// reaches every engine and needs the API key, the model list does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_routes_say_what_went_wrong() {
    let p = RawEngine::spawn([127, 0, 40, 1]).await;
    let d = RawEngine::spawn([127, 0, 40, 2]).await;
    let mut gw = Gateway::start(
        &[p.spec("prefill"), d.spec("decode")],
        "  api_key: s3cret\n",
    )
    .await;
    gw.wait_ready().await;

    // The raw engine answers every GET but /health with 404.
    let r = gw.get("/get_server_info").await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(error_code(&r), "server_not_found");
    assert_eq!(
        r.json()["error"]["message"],
        "Server returned status: 404 Not Found"
    );

    // Nothing declared or reported a model.
    let r = gw.get("/v1/models").await;
    assert_eq!(
        (r.status, r.text()),
        (503, "No models available".to_string())
    );

    let flush = |key: Option<&'static str>| {
        let url = gw.url("/flush_cache");
        async move {
            let auth = key.map(|k| format!("Bearer {k}"));
            let headers: Vec<(&str, &str)> = auth
                .as_deref()
                .map(|a| vec![("authorization", a)])
                .unwrap_or_default();
            mock_engine::client::request("POST", &url, &headers, None)
                .await
                .expect("flush_cache answers")
        }
    };
    let r = flush(None).await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert!(p.received().is_empty() && d.received().is_empty());

    p.answer_with(&[b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"]);
    d.answer_with(&[b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n\r\nbusy"]);
    let r = flush(Some("s3cret")).await;
    assert_eq!(r.status, 206, "{}", r.text());
    let v = r.json();
    assert_eq!(v["status"], "partial_success");
    assert_eq!(v["message"], "Cache flush: 1 succeeded, 1 failed");
    assert_eq!(v["workers_flushed"], 1);
    assert_eq!(v["successful"], json!([format!("http://{}", p.addr())]));
    assert_eq!(v["failed"][0]["worker"], format!("http://{}", d.addr()));
    assert!(
        v["failed"][0]["error"]
            .as_str()
            .unwrap()
            .contains("500: busy"),
        "{v}"
    );
    for e in [&p, &d] {
        assert_eq!(e.received(), vec![("/flush_cache".to_string(), Vec::new())]);
    }
}

/// A prefill that is registered but not healthy (here: nothing listens at its address) is not
/// asked for its info: 503 `no_prefill_servers`, as SMG 1.13.0 (it was a 500 with the
/// connection error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_info_routes_skip_a_prefill_that_is_not_healthy() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = dead.local_addr().unwrap();
    drop(dead);
    let spec =
        json!({"url": format!("http://{addr}"), "worker_type": "prefill", "bootstrap_port": null});
    let gw = Gateway::start(&[spec], "").await;
    for path in ["/get_server_info", "/get_model_info"] {
        let r = gw.get(path).await;
        assert_eq!(r.status, 503, "{path}: {}", r.text());
        assert_eq!(error_code(&r), "no_prefill_servers", "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_workers_the_engine_routes_say_so() {
    let gw = Gateway::start(&[], "").await;
    let r = gw.get("/v1/models").await;
    assert_eq!(
        (r.status, r.text()),
        (503, "No models available".to_string())
    );
    for path in ["/get_server_info", "/get_model_info"] {
        let r = gw.get(path).await;
        assert_eq!(r.status, 503, "{path}: {}", r.text());
        assert_eq!(error_code(&r), "no_prefill_servers", "{path}");
    }
    // The Messages API says it in Anthropic's shape (SMG 1.13.0's), with Retry-After.
    let r = gw
        .post(
            "/v1/messages",
            &json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status, 503, "{}", r.text());
    let id = r.header("x-request-id").unwrap_or_default().to_string();
    assert!(id.starts_with("msg_"), "{id}");
    let v = r.json();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "overloaded_error", "{v}");
    assert_eq!(v["request_id"], id.as_str(), "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("prefill"),
        "{v}"
    );
    assert_eq!(r.header("x-smg-error-code"), Some("no_available_workers"));
    assert_eq!(r.header("retry-after"), Some("1"));

    let r = gw.post("/flush_cache", &json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["message"], "No workers available for cache flush");
    assert_eq!(r.json()["total_workers"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_loads_asks_every_engine_now() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = gateway_for(&fleet, "").await;
    let r = gw.get("/get_loads").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let body = r.json();
    let loads = body["loads"].as_array().expect("loads");
    assert_eq!(body["dp_rank_count"], json!(loads.len()), "{body}");
    let mut seen: Vec<(String, String)> = loads
        .iter()
        .map(|l| {
            (
                l["worker"].as_str().unwrap().to_string(),
                l["worker_type"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    seen.sort();
    let mut want = vec![
        (fleet.prefill.api_url(), "prefill".to_string()),
        (fleet.decode.api_url(), "decode".to_string()),
    ];
    want.sort();
    assert_eq!(seen, want, "{body}");
    // Each row is the engine's own rank row, with the worker and its role added.
    for l in loads {
        let url = l["worker"].as_str().unwrap();
        let direct = engine_get(&format!("{url}/v1/loads?include=core,disagg,queues,memory")).await;
        let mut row = l.clone();
        let row = row.as_object_mut().unwrap();
        row.remove("worker");
        row.remove("worker_type");
        let own = &direct["loads"][0];
        assert!(row["num_running_reqs"].is_u64(), "{body}");
        assert_eq!(
            row["max_total_num_tokens"], own["max_total_num_tokens"],
            "{body}"
        );
        let keys = |m: &serde_json::Map<String, Value>| {
            let mut k: Vec<String> = m.keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(keys(row), keys(own.as_object().unwrap()), "{body}");
    }
    for key in [
        "total_running_reqs",
        "total_waiting_reqs",
        "total_reqs",
        "avg_token_usage",
        "avg_throughput",
        "avg_utilization",
    ] {
        assert!(body["aggregate"][key].is_number(), "{key}: {body}");
    }
    assert!(body["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')));
    assert!(body.get("unreachable").is_none(), "{body}");

    // An engine that gives no report is named, not dropped silently.
    fleet.decode.kill();
    let body = gw.get("/get_loads").await.json();
    assert_eq!(body["loads"].as_array().map(Vec::len), Some(1), "{body}");
    assert_eq!(
        body["unreachable"][0]["worker"],
        json!(fleet.decode.api_url()),
        "{body}"
    );

    // No workers: an empty report.
    let gw = Gateway::start(&[], "").await;
    let r = gw.get("/get_loads").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["loads"], json!([]));
}
