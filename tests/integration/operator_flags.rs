//! SMG's operator flags through the real binary: the admission limiter (`max_concurrent_requests`
//! with its FIFO queue and deadline), the rate limit, CORS, and JSON logs — in YAML and with
//! SMG's `launch` spelling. Mocks on 127.0.60.x.

use std::time::{Duration, Instant};

use mock_engine::client::{self, Response};
use serde_json::Value;

use crate::harness::{metric_value, Gateway};
use crate::http_admission::{chat, counter, occupy, sglang_pair};

/// An SGLang pair whose decode never stops a stream on its own (so a held stream holds its
/// admission place) and has room for everything.
async fn engines(ips: ([u8; 4], [u8; 4])) -> (mock_engine::MockEngine, mock_engine::MockEngine) {
    sglang_pair(ips, 256, 5).await
}

async fn gateway(workers: &[Value], extra: &str) -> Gateway {
    let mut gw = Gateway::start(workers, extra).await;
    gw.wait_ready().await;
    gw
}

/// A non-streamed chat request sent in the background; yields the answer and when it ended.
fn send_in_background(gw: &Gateway) -> tokio::task::JoinHandle<(Response, Instant)> {
    let url = gw.url("/v1/chat/completions");
    tokio::spawn(async move {
        let r = client::post_json(&url, &chat(2, false))
            .await
            .expect("an answer");
        (r, Instant::now())
    })
}

async fn gauge_reaches(gw: &Gateway, name: &str, value: f64) {
    let m = gw
        .metrics_when(|m| metric_value(m, name, &[]) == Some(value))
        .await;
    assert_eq!(metric_value(&m, name, &[]), Some(value), "{name}\n{m}");
}

fn rejected(m: &str, reason: &str) -> f64 {
    metric_value(
        m,
        "smg_admission_queue_rejected_total",
        &[("reason", reason)],
    )
    .unwrap_or(0.0)
}

fn rate_limit(m: &str, result: &str) -> f64 {
    metric_value(m, "smg_http_rate_limit_total", &[("result", result)]).unwrap_or(0.0)
}

/// SMG's refusal: the code in the body and in `X-SMG-Error-Code`, its message, `Retry-After: 2`.
fn assert_refused(r: &Response, status: u16, code: &str, message: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    let body = r.json();
    assert_eq!(body["error"]["code"], code, "{body}");
    assert_eq!(body["error"]["message"], message, "{body}");
    assert_eq!(r.header("x-smg-error-code"), Some(code));
    assert_eq!(r.header("retry-after"), Some("2"), "{:?}", r.headers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_concurrency_limit_queues_first_come_first_served_and_refuses_past_the_queue() {
    let (p, d) = engines(([127, 0, 60, 1], [127, 0, 60, 2])).await;
    let gw = gateway(
        &[p.worker_spec(), d.worker_spec()],
        "  max_concurrent_requests: 2\n  queue_size: 2\n  queue_timeout_secs: 60\n",
    )
    .await;
    let first = occupy(&gw).await;
    let second = occupy(&gw).await;
    gauge_reaches(&gw, "smg_admission_inflight", 2.0).await;

    // Two wait, in arrival order.
    let a = send_in_background(&gw);
    gauge_reaches(&gw, "smg_admission_queue_depth", 1.0).await;
    let b = send_in_background(&gw);
    gauge_reaches(&gw, "smg_admission_queue_depth", 2.0).await;

    // The queue is full: three more are refused at once, and reach no engine.
    for _ in 0..3 {
        let r = gw.post("/v1/chat/completions", &chat(2, false)).await;
        assert_refused(
            &r,
            429,
            "admission_queue_full",
            "admission queue is at capacity",
        );
    }
    assert_eq!(
        d.records().len(),
        2,
        "a queued or refused request reached the decode"
    );
    // Health, readiness and the worker API are not limited.
    for path in ["/health", "/liveness", "/readiness", "/workers"] {
        assert_eq!(gw.get(path).await.status, 200, "{path}");
    }

    // One place frees: the first in line takes it; the second can only follow once that one
    // has finished (the other place stays held), so the order of their ends is the queue's.
    drop(first);
    let (ra, a_done) = a.await.unwrap();
    let (rb, b_done) = b.await.unwrap();
    assert_eq!(
        (ra.status, rb.status),
        (200, 200),
        "{} {}",
        ra.text(),
        rb.text()
    );
    assert!(a_done < b_done, "the second in line was served first");
    drop(second);

    gauge_reaches(&gw, "smg_admission_inflight", 0.0).await;
    let m = gw.metrics().await;
    assert_eq!(rate_limit(&m, "allowed"), 4.0, "{m}");
    assert_eq!(rate_limit(&m, "rejected"), 3.0, "{m}");
    assert_eq!(rejected(&m, "full"), 3.0, "{m}");
    assert_eq!(
        metric_value(&m, "smg_admission_queue_depth", &[]),
        Some(0.0)
    );
    assert_eq!(
        metric_value(&m, "pdgate_admission_queue_wait_seconds_count", &[]),
        Some(2.0),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_times_out_with_503_and_a_client_leaving_the_queue_frees_its_place() {
    let (p, d) = engines(([127, 0, 60, 3], [127, 0, 60, 4])).await;
    let gw = gateway(
        &[p.worker_spec(), d.worker_spec()],
        "  max_concurrent_requests: 1\n  queue_size: 1\n  queue_timeout_secs: 2\n",
    )
    .await;
    let held = occupy(&gw).await;

    let started = Instant::now();
    let r = gw.post("/v1/chat/completions", &chat(2, false)).await;
    assert_refused(
        &r,
        503,
        "admission_queue_timeout",
        "timed out waiting for an admission slot",
    );
    assert!(
        started.elapsed() >= Duration::from_millis(1900),
        "refused before the queue deadline: {:?}",
        started.elapsed()
    );

    // A client gives up while queued (the queue holds one)...
    let left = gw
        .post_and_give_up(
            "/v1/chat/completions",
            &chat(2, false),
            Duration::from_millis(300),
        )
        .await;
    assert!(left.is_err(), "the client gave up while queued");
    let m = gw.metrics_when(|m| rejected(m, "cancelled") == 1.0).await;
    assert_eq!(rejected(&m, "cancelled"), 1.0, "{m}");
    gauge_reaches(&gw, "smg_admission_queue_depth", 0.0).await;

    // ...so the next one is queued, not refused, and is served when the place frees.
    let c = send_in_background(&gw);
    gauge_reaches(&gw, "smg_admission_queue_depth", 1.0).await;
    drop(held);
    let (rc, _) = c.await.unwrap();
    assert_eq!(rc.status, 200, "{}", rc.text());
    assert_eq!(
        d.records().len(),
        2,
        "only the held stream and the last request reached the decode"
    );
    let m = gw.metrics().await;
    assert_eq!(rejected(&m, "timeout"), 1.0, "{m}");
    assert_eq!(
        rate_limit(&m, "rejected"),
        1.0,
        "a client leaving is not a refusal: {m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_paces_queued_requests() {
    let (p, d) = engines(([127, 0, 60, 5], [127, 0, 60, 6])).await;
    // A burst of 2, then 4 per second; everything fits in the queue.
    let gw = gateway(
        &[p.worker_spec(), d.worker_spec()],
        "  max_concurrent_requests: 2\n  rate_limit_tokens_per_second: 4\n  queue_size: 20\n  \
         queue_timeout_secs: 60\n",
    )
    .await;
    let started = Instant::now();
    let all: Vec<_> = (0..10).map(|_| send_in_background(&gw)).collect();
    for h in all {
        let (r, _) = h.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // 10 admissions at 4/s after a burst of 2 take at least 2 s (load only makes it longer).
    assert!(
        started.elapsed() >= Duration::from_millis(1900),
        "admitted faster than the rate: {:?}",
        started.elapsed()
    );
    assert_eq!(d.records().len(), 10);
    assert_eq!(counter(&gw, "smg_admission_queue_depth").await, 0.0);
}

/// Every log line of a `--log-json` gateway, parsed (the test fails on a line that is not one
/// JSON object).
fn json_log_lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}\n{log}"));
            for key in ["timestamp", "level", "target", "message"] {
                assert!(v.get(key).is_some(), "no `{key}`: {l}");
            }
            v
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smg_spelled_flags_limit_the_rate_answer_cors_and_log_json() {
    let (p, d) = engines(([127, 0, 60, 7], [127, 0, 60, 8])).await;
    let boot = p.bootstrap_port().unwrap().to_string();
    let mut gw = Gateway::launch(&[
        "--prefill",
        &p.api_url(),
        &boot,
        "--decode",
        &d.api_url(),
        "--policy",
        "round_robin",
        "--max-concurrent-requests",
        "3",
        "--rate-limit-tokens-per-second",
        "1",
        "--queue-size",
        "0",
        "--queue-timeout-secs",
        "5",
        "--cors-allowed-origins",
        "http://app.example",
        "http://localhost:3000",
        "--log-json",
        // Spans go nowhere (nothing listens there); they are dropped and counted.
        "--enable-trace",
        "--otlp-traces-endpoint",
        "127.0.0.1:9",
    ])
    .await;
    gw.wait_ready().await;

    // Rate: a burst of 3, then 1 per second; no queue, so past the bucket → 429 at once.
    let started = Instant::now();
    let (mut admitted, mut refusal) = (0u32, None);
    for _ in 0..50 {
        let r = gw.post("/v1/chat/completions", &chat(1, false)).await;
        if r.status == 200 {
            admitted += 1;
        } else {
            refusal = Some(r);
            break;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let refusal = refusal.expect("the rate limit never refused a request");
    assert_refused(
        &refusal,
        429,
        "admission_queue_full",
        "concurrency limit reached and queuing is disabled",
    );
    assert!(admitted >= 3, "the burst was not granted: {admitted}");
    assert!(
        f64::from(admitted) <= 3.0 + elapsed.ceil(),
        "{admitted} admitted in {elapsed:.2} s at 1/s after a burst of 3"
    );

    // CORS: a preflight from a listed origin is allowed; from another it is answered without
    // the allowance; responses echo a listed origin, never another.
    let preflight = |origin: &'static str| {
        let url = gw.url("/v1/chat/completions");
        async move {
            client::request(
                "OPTIONS",
                &url,
                &[
                    ("origin", origin),
                    ("access-control-request-method", "POST"),
                    (
                        "access-control-request-headers",
                        "content-type,authorization",
                    ),
                ],
                None,
            )
            .await
            .unwrap()
        }
    };
    let ok = preflight("http://app.example").await;
    assert_eq!(ok.status, 200);
    assert!(ok.body.is_empty());
    assert_eq!(
        ok.header("access-control-allow-origin"),
        Some("http://app.example")
    );
    assert_eq!(ok.header("access-control-max-age"), Some("3600"));
    assert_eq!(ok.header("allow"), Some("POST"));
    for (name, needle) in [
        ("access-control-allow-methods", "POST"),
        ("access-control-allow-headers", "authorization"),
        ("vary", "origin"),
    ] {
        assert!(
            ok.header(name).is_some_and(|v| v.contains(needle)),
            "{name}: {:?}",
            ok.headers
        );
    }
    let other = preflight("http://evil.example").await;
    assert_eq!(other.status, 200);
    assert_eq!(other.header("access-control-allow-origin"), None);

    // Wait for a rate token, then a real answer from a listed origin, whole and streamed.
    let deadline = Instant::now() + Duration::from_secs(10);
    let answer = loop {
        let r = client::request(
            "POST",
            &gw.url("/v1/chat/completions"),
            &[
                ("content-type", "application/json"),
                ("origin", "http://localhost:3000"),
            ],
            Some(bytes::Bytes::from(chat(1, false).to_string())),
        )
        .await
        .unwrap();
        if r.status != 429 || Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(
        answer.header("access-control-allow-origin"),
        Some("http://localhost:3000")
    );
    assert_eq!(
        answer.header("access-control-expose-headers"),
        Some("x-request-id,traceparent,tracestate")
    );
    let request_id = answer
        .header("x-request-id")
        .expect("a request id")
        .to_string();
    let not_found = client::request(
        "GET",
        &gw.url("/nowhere"),
        &[("origin", "http://evil.example")],
        None,
    )
    .await
    .unwrap();
    assert_eq!(not_found.status, 404);
    assert_eq!(not_found.header("access-control-allow-origin"), None);
    assert_eq!(not_found.header("vary"), Some("origin"));

    // JSON logs: every line one object; the access line carries the request's fields, typed.
    let deadline = Instant::now() + Duration::from_secs(10);
    let access = loop {
        let lines = json_log_lines(&gw.log());
        let found = lines
            .into_iter()
            .find(|l| l["target"] == "pdgate::access" && l["request_id"] == request_id.as_str());
        match found {
            Some(l) => break l,
            None if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            None => panic!("no access line for {request_id}\n{}", gw.log()),
        }
    };
    assert_eq!(access["level"], "INFO");
    assert_eq!(access["status"], 200, "{access}");
    assert_eq!(access["path"], "/v1/chat/completions");
    assert_eq!(access["method"], "POST");
    assert_eq!(access["prefill"], p.api_url().as_str(), "{access}");
    assert_eq!(access["decode"], d.api_url().as_str(), "{access}");
    assert_eq!(access["attempts"], 1);
    assert!(access["room"].is_u64(), "{access}");
    assert!(access["duration_ms"].is_f64(), "{access}");
    assert_eq!(access["error"], Value::Null);
    let m = gw
        .metrics_when(|m| {
            metric_value(
                m,
                "pdgate_trace_spans_dropped_total",
                &[("reason", "export_failed")],
            )
            .is_some_and(|v| v > 0.0)
        })
        .await;
    assert!(
        metric_value(
            &m,
            "pdgate_trace_spans_dropped_total",
            &[("reason", "export_failed")]
        )
        .is_some_and(|v| v > 0.0),
        "--enable-trace took effect: {m}"
    );
    let refused_line = json_log_lines(&gw.log())
        .into_iter()
        .find(|l| l["target"] == "pdgate::access" && l["status"] == 429)
        .expect("the refusal's access line");
    assert_eq!(refused_line["error"], "admission_queue_full");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_is_off_by_default_and_a_wildcard_allows_any_origin() {
    let off = Gateway::start(&[], "").await;
    let r = client::request(
        "OPTIONS",
        &off.url("/v1/chat/completions"),
        &[
            ("origin", "http://app.example"),
            ("access-control-request-method", "POST"),
        ],
        None,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 405, "no CORS, no preflight answer");
    assert!(
        r.headers
            .iter()
            .all(|(k, _)| !k.starts_with("access-control-")),
        "{:?}",
        r.headers
    );

    let any = Gateway::start(&[], "  cors_allowed_origins: [\"*\"]\n").await;
    let r = any.get("/health").await;
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    assert_eq!(r.header("access-control-expose-headers"), Some("*"));
    let r = client::request(
        "OPTIONS",
        &any.url("/generate"),
        &[
            ("origin", "http://anyone.example"),
            ("access-control-request-method", "POST"),
        ],
        None,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    assert_eq!(r.header("access-control-allow-methods"), Some("*"));
}

/// `health_check_port` (SMG's `--health-check-port`): `/liveness`, `/readiness` and `/health`
/// answer on that port as on the serving port; nothing else is served there. The serving port
/// keeps its probes and its routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_port_answers_the_probes_and_nothing_else() {
    let (p, d) = engines(([127, 0, 60, 9], [127, 0, 60, 10])).await;
    let probe_port = crate::harness::free_port();
    let gw = gateway(
        &[p.worker_spec(), d.worker_spec()],
        &format!("  health_check_port: {probe_port}\n"),
    )
    .await;
    let probe = |path: &str| format!("http://127.0.0.1:{probe_port}{path}");
    for path in ["/liveness", "/readiness", "/health"] {
        let main = gw.get(path).await;
        let there = client::request("GET", &probe(path), &[], None)
            .await
            .unwrap_or_else(|e| panic!("{path} on the probe port: {e}"));
        assert_eq!(there.status, 200, "{path}: {}", there.text());
        assert_eq!(there.status, main.status, "{path}");
        assert_eq!(there.body, main.body, "{path}");
    }
    for (method, path, body) in [
        ("GET", "/workers", None),
        ("GET", "/v1/models", None),
        ("POST", "/reload", None),
        (
            "POST",
            "/v1/chat/completions",
            Some(bytes::Bytes::from(chat(2, false).to_string())),
        ),
    ] {
        let r = client::request(
            method,
            &probe(path),
            &[("content-type", "application/json")],
            body,
        )
        .await
        .unwrap();
        assert_eq!(
            r.status,
            404,
            "{method} {path} on the probe port: {}",
            r.text()
        );
    }
    let r = gw.post("/v1/chat/completions", &chat(2, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
}
