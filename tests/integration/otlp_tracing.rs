//! OpenTelemetry tracing through the real binary (`enable_trace`): the gateway exports to a mock
//! OTLP collector ([`mock_engine::otlp`]) over gRPC or HTTP/protobuf, and each PD request shows up
//! as one SERVER span with one CLIENT child per leg, linked to the client's trace when it sent
//! one, with every engine receiving the `traceparent` of its own leg. A collector that is down
//! costs the requests nothing: spans are dropped and counted.

use std::time::Duration;

use bytes::Bytes;
use mock_engine::client::{self, Response};
use mock_engine::otlp::{MockCollector, ReceivedSpan};
use mock_engine::{
    Connector, EngineKind, Fault, FaultMatch, MockEngine, MockEngineConfig, RequestRecord, Role,
};
use serde_json::{json, Value};

use crate::harness::{free_port, metric_value, Gateway};

/// Long enough for a batch (1 s delay) and a slow CI machine.
const SPANS_DEADLINE: Duration = Duration::from_secs(15);

async fn mock(
    engine: EngineKind,
    role: Role,
    ip: [u8; 4],
    connector: Option<Connector>,
) -> MockEngine {
    let mut cfg = MockEngineConfig::test(engine, role, ip);
    if let Some(c) = connector {
        cfg = cfg.with_connector(c);
    }
    MockEngine::spawn(cfg)
        .await
        .unwrap_or_else(|e| panic!("{engine:?} {role:?} mock: {e}"))
}

async fn collector() -> MockCollector {
    MockCollector::spawn([127, 0, 0, 1].into())
        .await
        .expect("mock collector")
}

/// A ready gateway over `workers` exporting to `endpoint`.
async fn traced_gateway(workers: &[Value], endpoint: &str, extra: &str) -> Gateway {
    let keys = format!("  enable_trace: true\n  otlp_traces_endpoint: '{endpoint}'\n{extra}");
    let mut gw = Gateway::start(workers, &keys).await;
    gw.wait_ready().await;
    gw
}

fn chat(stream: bool) -> Value {
    json!({"model": "mock-model", "max_tokens": 6, "stream": stream,
        "messages": [{"role": "user", "content": "trace this request"}]})
}

async fn post_with(gw: &Gateway, path: &str, headers: &[(&str, &str)], body: &Value) -> Response {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    client::request(
        "POST",
        &gw.url(path),
        &all,
        Some(Bytes::from(body.to_string())),
    )
    .await
    .unwrap_or_else(|e| panic!("POST {path}: {e}\n{}", gw.log()))
}

/// One request's spans: its root and the root's children.
struct Trace {
    root: ReceivedSpan,
    legs: Vec<ReceivedSpan>,
}

impl Trace {
    fn leg(&self, role: &str) -> &ReceivedSpan {
        let mut of_role = self
            .legs
            .iter()
            .filter(|s| s.attr_str("pd.leg") == Some(role));
        let leg = of_role
            .next()
            .unwrap_or_else(|| panic!("no {role} span in {:#?}", self.legs));
        assert!(
            of_role.next().is_none(),
            "one {role} span: {:#?}",
            self.legs
        );
        leg
    }
}

/// Waits for the root span of `request_id` and `legs` children of it.
async fn trace_of(collector: &MockCollector, request_id: &str, legs: usize) -> Trace {
    let split = |spans: &[ReceivedSpan]| -> Option<Trace> {
        let root = spans
            .iter()
            .find(|s| s.kind == "server" && s.attr_str("pd.request_id") == Some(request_id))?;
        let children: Vec<ReceivedSpan> = spans
            .iter()
            .filter(|s| s.trace_id == root.trace_id && s.parent_span_id == root.span_id)
            .cloned()
            .collect();
        Some(Trace {
            root: root.clone(),
            legs: children,
        })
    };
    let spans = collector
        .wait_for(SPANS_DEADLINE, |spans| {
            split(spans).is_some_and(|t| t.legs.len() >= legs)
        })
        .await;
    let trace =
        split(&spans).unwrap_or_else(|| panic!("no root span for {request_id} in {spans:#?}"));
    assert_eq!(
        trace.legs.len(),
        legs,
        "children of {request_id}: {:#?}",
        trace.legs
    );
    trace
}

/// The one record of `request_id` on `engine`.
fn record_of(engine: &MockEngine, request_id: &str) -> RequestRecord {
    let mut of_id: Vec<RequestRecord> = engine
        .records()
        .into_iter()
        .filter(|r| r.x_request_id.as_deref() == Some(request_id))
        .collect();
    assert_eq!(
        of_id.len(),
        1,
        "{} records of {request_id}",
        engine.api_url()
    );
    of_id.remove(0)
}

/// The `traceparent` an engine must have received for `span`: its trace and its span id.
fn traceparent_of(span: &ReceivedSpan) -> String {
    format!("00-{}-{}-01", span.trace_id, span.span_id)
}

/// Checks the shape every traced PD request has: a SERVER root named for the route, one CLIENT
/// span per leg under it, the request's facts on each, and each engine given its leg's context.
fn assert_pd_trace(t: &Trace, request_id: &str, prefill: &MockEngine, decode: &MockEngine) {
    let root = &t.root;
    assert_eq!(root.name, "POST /v1/chat/completions");
    assert_eq!(root.service_name.as_deref(), Some("pdgate"));
    assert_eq!(root.attr_str("http.route"), Some("/v1/chat/completions"));
    assert_eq!(root.attr_i64("http.response.status_code"), Some(200));
    assert_eq!(root.attr_str("gen_ai.request.model"), Some("mock-model"));
    assert_eq!(root.attr_i64("pd.attempts"), Some(1));
    assert_eq!(root.attr_str("pd.outcome"), Some("ok"));
    assert_eq!(
        root.attr_str("pd.prefill.url"),
        Some(prefill.api_url().as_str())
    );
    assert_eq!(
        root.attr_str("pd.decode.url"),
        Some(decode.api_url().as_str())
    );
    assert!(
        root.attr("pd.ttft_ms")
            .and_then(Value::as_f64)
            .is_some_and(|ms| ms > 0.0),
        "{root:#?}"
    );
    assert_eq!(root.status, "unset");
    for (role, engine) in [("prefill", prefill), ("decode", decode)] {
        let leg = t.leg(role);
        assert_eq!((leg.kind.as_str(), leg.name.as_str()), ("client", role));
        assert_eq!(leg.attr_str("pd.request_id"), Some(request_id));
        assert_eq!(
            leg.attr_str("pd.worker.url"),
            Some(engine.api_url().as_str())
        );
        assert_eq!(leg.attr_i64("pd.attempt"), Some(1));
        assert_eq!(leg.attr_i64("http.response.status_code"), Some(200));
        assert_eq!(leg.attr_str("pd.outcome"), Some("ok"), "{leg:#?}");
        assert!(leg.attr_i64("pd.bytes").is_some_and(|b| b > 0), "{leg:#?}");
        assert_eq!(leg.attr_str("pd.connector"), root.attr_str("pd.connector"));
        assert!(leg.start_unix_nano >= root.start_unix_nano);
        let got = record_of(engine, request_id);
        assert_eq!(
            got.header("traceparent"),
            Some(traceparent_of(leg).as_str()),
            "{role} engine"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_pd_request_is_a_server_span_with_a_client_span_per_leg() {
    let otel = collector().await;
    let p = mock(EngineKind::Sglang, Role::Prefill, [127, 0, 60, 1], None).await;
    let d = mock(EngineKind::Sglang, Role::Decode, [127, 0, 60, 2], None).await;
    let gw = traced_gateway(
        &[p.worker_spec(), d.worker_spec()],
        &otel.grpc_endpoint(),
        "",
    )
    .await;
    for (id, stream) in [("trace-sglang-json", false), ("trace-sglang-sse", true)] {
        let r = post_with(
            &gw,
            "/v1/chat/completions",
            &[("x-request-id", id)],
            &chat(stream),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        let t = trace_of(&otel, id, 2).await;
        assert_pd_trace(&t, id, &p, &d);
        assert_eq!(t.root.via, "grpc");
        assert_eq!(t.root.parent_span_id, "", "no client context: a new trace");
        assert_eq!(t.root.attr("pd.streaming"), Some(&json!(stream)));
        let room = record_of(&d, id).parsed.bootstrap_room.expect("a room");
        for span in [&t.root, t.leg("prefill"), t.leg("decode")] {
            assert_eq!(span.attr_str("pd.connector"), Some("bootstrap"));
            assert_eq!(span.attr("pd.bootstrap_room"), Some(&room), "{span:#?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_pd_request_spans_carry_the_minted_transfer_id() {
    let otel = collector().await;
    let mooncake = Some(Connector::Mooncake);
    let p = mock(EngineKind::Vllm, Role::Prefill, [127, 0, 60, 3], mooncake).await;
    let d = mock(EngineKind::Vllm, Role::Decode, [127, 0, 60, 4], mooncake).await;
    let gw = traced_gateway(
        &[p.worker_spec(), d.worker_spec()],
        &otel.grpc_endpoint(),
        "",
    )
    .await;
    let id = "trace-vllm";
    let r = post_with(
        &gw,
        "/v1/chat/completions",
        &[("x-request-id", id)],
        &chat(true),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let t = trace_of(&otel, id, 2).await;
    assert_pd_trace(&t, id, &p, &d);
    let minted = record_of(&d, id).body["kv_transfer_params"]["transfer_id"].clone();
    assert!(
        minted.as_str().is_some_and(|x| x.starts_with("xfer-")),
        "{minted}"
    );
    for span in [&t.root, t.leg("prefill"), t.leg("decode")] {
        assert_eq!(span.attr_str("pd.connector"), Some("mooncake"), "{span:#?}");
        assert_eq!(span.attr("pd.transfer_id"), Some(&minted), "{span:#?}");
        assert_eq!(span.attr("pd.bootstrap_room"), None);
    }
    // Sequential: the decode leg starts after the prefill leg ended.
    let (pl, dl) = (t.leg("prefill"), t.leg("decode"));
    assert!(dl.start_unix_nano >= pl.end_unix_nano, "{pl:#?}\n{dl:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incoming_traceparent_is_continued_and_each_leg_names_its_own_span() {
    let otel = collector().await;
    let p = mock(EngineKind::Sglang, Role::Prefill, [127, 0, 60, 5], None).await;
    let d = mock(EngineKind::Sglang, Role::Decode, [127, 0, 60, 6], None).await;
    let gw = traced_gateway(
        &[p.worker_spec(), d.worker_spec()],
        &otel.grpc_endpoint(),
        "",
    )
    .await;
    let (trace_id, client_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let id = "trace-continued";
    let r = post_with(
        &gw,
        "/v1/chat/completions",
        &[
            ("x-request-id", id),
            ("traceparent", &format!("00-{trace_id}-{client_span}-01")),
            ("tracestate", "congo=t61rcWkgMzE"),
        ],
        &chat(false),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let t = trace_of(&otel, id, 2).await;
    assert_pd_trace(&t, id, &p, &d);
    assert_eq!(t.root.trace_id, trace_id);
    assert_eq!(t.root.parent_span_id, client_span);
    for (role, engine) in [("prefill", &p), ("decode", &d)] {
        let leg = t.leg(role);
        assert_eq!(leg.trace_id, trace_id);
        assert_ne!(leg.span_id, client_span);
        let got = record_of(engine, id);
        assert_eq!(
            got.header("traceparent"),
            Some(traceparent_of(leg).as_str())
        );
        assert_eq!(got.header("tracestate"), Some("congo=t61rcWkgMzE"));
    }

    // A client that does not sample: nothing is recorded, the legs still carry its trace id
    // (with the not-sampled flag) under spans of their own.
    let id = "trace-not-sampled";
    let unsampled = "0af7651916cd43dd8448eb211c80319c";
    let r = post_with(
        &gw,
        "/v1/chat/completions",
        &[
            ("x-request-id", id),
            (
                "traceparent",
                &format!("00-{unsampled}-b7ad6b7169203331-00"),
            ),
        ],
        &chat(false),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    for engine in [&p, &d] {
        let got = record_of(engine, id);
        let tp = got.header("traceparent").unwrap_or_default().to_string();
        assert!(
            tp.starts_with(&format!("00-{unsampled}-")) && tp.ends_with("-00"),
            "{tp}"
        );
        assert!(
            !tp.contains("b7ad6b7169203331"),
            "the leg's own span id: {tp}"
        );
    }
    // The sampled request's spans came; give a later batch its time, then look for the other.
    let marker = "trace-after-unsampled";
    let r = post_with(
        &gw,
        "/v1/chat/completions",
        &[("x-request-id", marker)],
        &chat(false),
    )
    .await;
    assert_eq!(r.status, 200);
    trace_of(&otel, marker, 2).await;
    assert!(
        otel.spans().iter().all(|s| s.trace_id != unsampled),
        "an unsampled trace was exported"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_otlp_http_protobuf_endpoint_gets_the_same_spans() {
    let otel = collector().await;
    let p = mock(EngineKind::Sglang, Role::Prefill, [127, 0, 60, 7], None).await;
    let d = mock(EngineKind::Sglang, Role::Decode, [127, 0, 60, 8], None).await;
    let gw = traced_gateway(
        &[p.worker_spec(), d.worker_spec()],
        &otel.http_endpoint(),
        "",
    )
    .await;
    let id = "trace-over-http";
    let r = post_with(
        &gw,
        "/v1/chat/completions",
        &[("x-request-id", id)],
        &chat(true),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let t = trace_of(&otel, id, 2).await;
    assert_pd_trace(&t, id, &p, &d);
    assert!(
        [&t.root, t.leg("prefill"), t.leg("decode")]
            .iter()
            .all(|s| s.via == "http"),
        "{:#?}",
        t.root
    );
    let m = gw
        .metrics_when(|m| {
            metric_value(m, "pdgate_trace_spans_exported_total", &[]).is_some_and(|n| n >= 3.0)
        })
        .await;
    assert!(
        metric_value(&m, "pdgate_trace_spans_exported_total", &[]).is_some_and(|n| n >= 3.0),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_costs_nothing_and_its_spans_are_counted_as_dropped() {
    let p = mock(EngineKind::Sglang, Role::Prefill, [127, 0, 60, 9], None).await;
    let d = mock(EngineKind::Sglang, Role::Decode, [127, 0, 60, 10], None).await;
    // Nothing listens there.
    let nowhere = format!("127.0.0.1:{}", free_port());
    let gw = traced_gateway(&[p.worker_spec(), d.worker_spec()], &nowhere, "").await;
    for i in 0..5 {
        let r = post_with(
            &gw,
            "/v1/chat/completions",
            &[("x-request-id", &format!("down-{i}"))],
            &chat(i % 2 == 0),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let dropped = |m: &str| {
        metric_value(
            m,
            "pdgate_trace_spans_dropped_total",
            &[("reason", "export_failed")],
        )
        .unwrap_or(0.0)
    };
    let m = gw.metrics_when(|m| dropped(m) >= 15.0).await;
    assert!(dropped(&m) >= 15.0, "3 spans a request were dropped:\n{m}");
    assert_eq!(
        metric_value(&m, "pdgate_trace_spans_exported_total", &[]),
        Some(0.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_flushes_the_last_spans_before_exit() {
    let otel = collector().await;
    let p = mock(EngineKind::Sglang, Role::Prefill, [127, 0, 60, 11], None).await;
    let d = mock(EngineKind::Sglang, Role::Decode, [127, 0, 60, 12], None).await;
    let mut gw = traced_gateway(
        &[p.worker_spec(), d.worker_spec()],
        &otel.grpc_endpoint(),
        "",
    )
    .await;
    let id = "trace-at-exit";
    let r = post_with(
        &gw,
        "/v1/chat/completions",
        &[("x-request-id", id)],
        &chat(false),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    // At once, before the batch's 1 s delay: only the exit's flush can deliver the spans.
    gw.signal("TERM");
    let status = gw.wait_exit(Duration::from_secs(15)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        gw.log()
    );
    let spans = otel.spans();
    assert!(
        spans
            .iter()
            .any(|s| s.attr_str("pd.request_id") == Some(id) && s.kind == "server"),
        "{spans:#?}\n{}",
        gw.log()
    );
    assert_eq!(
        spans
            .iter()
            .filter(|s| s.attr_str("pd.request_id") == Some(id))
            .count(),
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_pd_legs_are_client_spans_and_carry_their_context_as_metadata() {
    let otel = collector().await;
    let engine = |role, ip| async move {
        let cfg = MockEngineConfig::grpc_test(EngineKind::Sglang, role, ip)
            .with_vocab(crate::grpc_pd::vocab());
        MockEngine::spawn(cfg).await.expect("spawn a gRPC mock")
    };
    let p = engine(Role::Prefill, [127, 0, 60, 13]).await;
    let d = engine(Role::Decode, [127, 0, 60, 14]).await;
    let extra = format!("  model_path: {}\n", crate::grpc_pd::model_dir().display());
    let gw = traced_gateway(
        &[p.worker_spec(), d.worker_spec()],
        &otel.grpc_endpoint(),
        &extra,
    )
    .await;
    let id = "trace-grpc";
    let r = post_with(
        &gw,
        "/v1/chat/completions",
        &[("x-request-id", id)],
        &chat(true),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let t = trace_of(&otel, id, 2).await;
    assert_eq!(t.root.name, "POST /v1/chat/completions");
    assert_eq!(t.root.attr_i64("http.response.status_code"), Some(200));
    assert_eq!(t.root.attr_str("pd.outcome"), Some("ok"));
    let room = t.root.attr_i64("pd.bootstrap_room").expect("a room");
    for (role, engine) in [("prefill", &p), ("decode", &d)] {
        let leg = t.leg(role);
        assert_eq!(leg.kind, "client");
        assert_eq!(leg.attr_str("rpc.system"), Some("grpc"));
        assert_eq!(leg.attr_i64("rpc.grpc.status_code"), Some(0), "{leg:#?}");
        assert_eq!(leg.attr_str("pd.outcome"), Some("ok"), "{leg:#?}");
        assert_eq!(leg.attr_i64("pd.bootstrap_room"), Some(room));
        let got = engine
            .records()
            .into_iter()
            .find(|r| {
                r.grpc
                    .as_ref()
                    .is_some_and(|g| g.request_id.starts_with(id))
            })
            .unwrap_or_else(|| panic!("{role}: no gRPC record of {id}"));
        assert_eq!(
            got.header("traceparent"),
            Some(traceparent_of(leg).as_str()),
            "{role} metadata"
        );
    }
    assert!(
        t.leg("decode")
            .attr_i64("pd.output_tokens")
            .is_some_and(|n| n > 0),
        "{:#?}",
        t.leg("decode")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_leg_is_an_error_span_and_a_retry_gets_spans_of_its_own() {
    let otel = collector().await;
    let p = mock(EngineKind::Sglang, Role::Prefill, [127, 0, 60, 15], None).await;
    let d = mock(EngineKind::Sglang, Role::Decode, [127, 0, 60, 16], None).await;
    let gw = traced_gateway(
        &[p.worker_spec(), d.worker_spec()],
        &otel.grpc_endpoint(),
        "  retry_initial_backoff_ms: 1\n  retry_max_retries: 2\n",
    )
    .await;
    let fail = |count| Fault::FailStatus {
        status: 503,
        body: None,
        count,
        matcher: FaultMatch {
            route: None,
            role: Some(Role::Decode),
        },
    };

    // The first decode answers 503; the retry (attempt 2) goes through.
    d.inject(fail(Some(1))).await;
    let id = "trace-retried";
    let r = post_with(
        &gw,
        "/v1/chat/completions",
        &[("x-request-id", id)],
        &chat(false),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let t = trace_of(&otel, id, 4).await;
    assert_eq!(t.root.attr_i64("pd.attempts"), Some(2));
    assert_eq!(
        (t.root.attr_str("pd.outcome"), t.root.status.as_str()),
        (Some("ok"), "unset")
    );
    let attempt = |n: i64, role: &str| -> &ReceivedSpan {
        t.legs
            .iter()
            .find(|s| s.attr_i64("pd.attempt") == Some(n) && s.attr_str("pd.leg") == Some(role))
            .unwrap_or_else(|| panic!("no attempt {n} {role} span: {:#?}", t.legs))
    };
    let failed = attempt(1, "decode");
    assert_eq!(failed.attr_i64("http.response.status_code"), Some(503));
    assert_eq!(
        (failed.attr_str("pd.outcome"), failed.status.as_str()),
        (Some("error"), "error"),
        "{failed:#?}"
    );
    // The gateway dropped the first prefill (its room was doomed): cancelled, not an error.
    assert_eq!(
        attempt(1, "prefill").attr_str("pd.outcome"),
        Some("cancelled")
    );
    for role in ["prefill", "decode"] {
        assert_eq!(attempt(2, role).attr_str("pd.outcome"), Some("ok"));
    }
    assert_ne!(
        attempt(1, "decode").attr("pd.bootstrap_room"),
        attempt(2, "decode").attr("pd.bootstrap_room"),
        "a retry mints a new room"
    );

    // Every attempt fails: the root is an error with the gateway's code.
    d.inject(fail(None)).await;
    let id = "trace-failed";
    let r = post_with(
        &gw,
        "/v1/chat/completions",
        &[("x-request-id", id)],
        &chat(false),
    )
    .await;
    assert_eq!(r.status, 503, "{}", r.text());
    let t = trace_of(&otel, id, 4).await;
    assert_eq!(t.root.attr_i64("http.response.status_code"), Some(503));
    assert_eq!(t.root.attr_str("pd.outcome"), Some("error"));
    assert_eq!(t.root.status, "error");
    let code = t
        .root
        .attr_str("error.type")
        .expect("the gateway's error code");
    assert_eq!(t.root.status_message, code);
}
