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

/// Which endpoint of the mock collector a gateway exports to.
#[derive(Clone, Copy)]
enum Export {
    Grpc,
    Http,
}

/// A prefill/decode pair of mocks and a ready gateway over them exporting to a mock collector.
struct TracedPair {
    otel: MockCollector,
    p: MockEngine,
    d: MockEngine,
    gw: Gateway,
}

impl TracedPair {
    async fn start(
        prefill: MockEngineConfig,
        decode: MockEngineConfig,
        export: Export,
        extra: &str,
    ) -> TracedPair {
        let otel = collector().await;
        let p = MockEngine::spawn(prefill).await.expect("prefill mock");
        let d = MockEngine::spawn(decode).await.expect("decode mock");
        let endpoint = match export {
            Export::Grpc => otel.grpc_endpoint(),
            Export::Http => otel.http_endpoint(),
        };
        let gw = traced_gateway(&[p.worker_spec(), d.worker_spec()], &endpoint, extra).await;
        TracedPair { otel, p, d, gw }
    }

    /// An SGLang HTTP pair on `127.0.60.<prefill>` / `127.0.60.<decode>`.
    async fn sglang(octets: (u8, u8), export: Export, extra: &str) -> TracedPair {
        let cfg = |role, o| MockEngineConfig::test(EngineKind::Sglang, role, [127, 0, 60, o]);
        TracedPair::start(
            cfg(Role::Prefill, octets.0),
            cfg(Role::Decode, octets.1),
            export,
            extra,
        )
        .await
    }

    /// A chat request with `x-request-id: id` (and `headers`); must answer `status`.
    async fn chat(&self, id: &str, stream: bool, headers: &[(&str, &str)], status: u16) {
        let mut all = vec![("x-request-id", id)];
        all.extend_from_slice(headers);
        let r = post_with(&self.gw, "/v1/chat/completions", &all, &chat(stream)).await;
        assert_eq!(r.status, status, "{}", r.text());
    }
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
    let t = TracedPair::sglang((1, 2), Export::Grpc, "").await;
    for (id, stream) in [("trace-sglang-json", false), ("trace-sglang-sse", true)] {
        t.chat(id, stream, &[], 200).await;
        let trace = trace_of(&t.otel, id, 2).await;
        assert_pd_trace(&trace, id, &t.p, &t.d);
        assert_eq!(trace.root.via, "grpc");
        assert_eq!(
            trace.root.parent_span_id, "",
            "no client context: a new trace"
        );
        assert_eq!(trace.root.attr("pd.streaming"), Some(&json!(stream)));
        let room = record_of(&t.d, id).parsed.bootstrap_room.expect("a room");
        for span in [&trace.root, trace.leg("prefill"), trace.leg("decode")] {
            assert_eq!(span.attr_str("pd.connector"), Some("bootstrap"));
            assert_eq!(span.attr("pd.bootstrap_room"), Some(&room), "{span:#?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_pd_request_spans_carry_the_minted_transfer_id() {
    let cfg = |role, o| {
        MockEngineConfig::test(EngineKind::Vllm, role, [127, 0, 60, o])
            .with_connector(Connector::Mooncake)
    };
    let t = TracedPair::start(
        cfg(Role::Prefill, 3),
        cfg(Role::Decode, 4),
        Export::Grpc,
        "",
    )
    .await;
    let id = "trace-vllm";
    t.chat(id, true, &[], 200).await;
    let trace = trace_of(&t.otel, id, 2).await;
    assert_pd_trace(&trace, id, &t.p, &t.d);
    let minted = record_of(&t.d, id).body["kv_transfer_params"]["transfer_id"].clone();
    assert!(
        minted.as_str().is_some_and(|x| x.starts_with("xfer-")),
        "{minted}"
    );
    for span in [&trace.root, trace.leg("prefill"), trace.leg("decode")] {
        assert_eq!(span.attr_str("pd.connector"), Some("mooncake"), "{span:#?}");
        assert_eq!(span.attr("pd.transfer_id"), Some(&minted), "{span:#?}");
        assert_eq!(span.attr("pd.bootstrap_room"), None);
    }
    // Sequential: the decode leg starts after the prefill leg ended.
    let (pl, dl) = (trace.leg("prefill"), trace.leg("decode"));
    assert!(dl.start_unix_nano >= pl.end_unix_nano, "{pl:#?}\n{dl:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incoming_traceparent_is_continued_and_each_leg_names_its_own_span() {
    let t = TracedPair::sglang((5, 6), Export::Grpc, "").await;
    let (trace_id, client_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let id = "trace-continued";
    let parent = format!("00-{trace_id}-{client_span}-01");
    let context = [
        ("traceparent", parent.as_str()),
        ("tracestate", "congo=t61rcWkgMzE"),
    ];
    t.chat(id, false, &context, 200).await;
    let trace = trace_of(&t.otel, id, 2).await;
    assert_pd_trace(&trace, id, &t.p, &t.d);
    assert_eq!(trace.root.trace_id, trace_id);
    assert_eq!(trace.root.parent_span_id, client_span);
    for (role, engine) in [("prefill", &t.p), ("decode", &t.d)] {
        let leg = trace.leg(role);
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
    let parent = format!("00-{unsampled}-b7ad6b7169203331-00");
    t.chat(id, false, &[("traceparent", &parent)], 200).await;
    for engine in [&t.p, &t.d] {
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
    // A sampled request after it: once its spans are in, the unsampled one's would be too.
    let marker = "trace-after-unsampled";
    t.chat(marker, false, &[], 200).await;
    trace_of(&t.otel, marker, 2).await;
    assert!(
        t.otel.spans().iter().all(|s| s.trace_id != unsampled),
        "an unsampled trace was exported"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_otlp_http_protobuf_endpoint_gets_the_same_spans() {
    let t = TracedPair::sglang((7, 8), Export::Http, "").await;
    let id = "trace-over-http";
    t.chat(id, true, &[], 200).await;
    let trace = trace_of(&t.otel, id, 2).await;
    assert_pd_trace(&trace, id, &t.p, &t.d);
    assert!(
        [&trace.root, trace.leg("prefill"), trace.leg("decode")]
            .iter()
            .all(|s| s.via == "http"),
        "{:#?}",
        trace.root
    );
    let exported = |m: &str| metric_value(m, "pdgate_trace_spans_exported_total", &[]);
    let m =
        t.gw.metrics_when(|m| exported(m).is_some_and(|n| n >= 3.0))
            .await;
    assert!(exported(&m).is_some_and(|n| n >= 3.0), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_costs_nothing_and_its_spans_are_counted_as_dropped() {
    let cfg = |role, o| MockEngineConfig::test(EngineKind::Sglang, role, [127, 0, 60, o]);
    let p = MockEngine::spawn(cfg(Role::Prefill, 9))
        .await
        .expect("prefill mock");
    let d = MockEngine::spawn(cfg(Role::Decode, 10))
        .await
        .expect("decode mock");
    // Nothing listens there.
    let nowhere = format!("127.0.0.1:{}", free_port());
    let gw = traced_gateway(&[p.worker_spec(), d.worker_spec()], &nowhere, "").await;
    for i in 0..5 {
        let id = format!("down-{i}");
        let r = post_with(
            &gw,
            "/v1/chat/completions",
            &[("x-request-id", &id)],
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
    let mut t = TracedPair::sglang((11, 12), Export::Grpc, "").await;
    let id = "trace-at-exit";
    t.chat(id, false, &[], 200).await;
    // At once, before the batch's 1 s delay: only the exit's flush can deliver the spans.
    t.gw.signal("TERM");
    let status = t.gw.wait_exit(Duration::from_secs(15)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        t.gw.log()
    );
    let of_request: Vec<ReceivedSpan> = t
        .otel
        .spans()
        .into_iter()
        .filter(|s| s.attr_str("pd.request_id") == Some(id))
        .collect();
    assert_eq!(of_request.len(), 3, "{of_request:#?}\n{}", t.gw.log());
    assert!(of_request.iter().any(|s| s.kind == "server"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_leg_is_an_error_span_and_a_retry_gets_spans_of_its_own() {
    let retries = "  retry_initial_backoff_ms: 1\n  retry_max_retries: 2\n";
    let t = TracedPair::sglang((15, 16), Export::Grpc, retries).await;
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
    t.d.inject(fail(Some(1))).await;
    let id = "trace-retried";
    t.chat(id, false, &[], 200).await;
    let trace = trace_of(&t.otel, id, 4).await;
    assert_eq!(trace.root.attr_i64("pd.attempts"), Some(2));
    assert_eq!(
        (
            trace.root.attr_str("pd.outcome"),
            trace.root.status.as_str()
        ),
        (Some("ok"), "unset")
    );
    let attempt = |n: i64, role: &str| -> &ReceivedSpan {
        trace
            .legs
            .iter()
            .find(|s| s.attr_i64("pd.attempt") == Some(n) && s.attr_str("pd.leg") == Some(role))
            .unwrap_or_else(|| panic!("no attempt {n} {role} span: {:#?}", trace.legs))
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
    t.d.inject(fail(None)).await;
    let id = "trace-failed";
    t.chat(id, false, &[], 503).await;
    let trace = trace_of(&t.otel, id, 4).await;
    assert_eq!(trace.root.attr_i64("http.response.status_code"), Some(503));
    assert_eq!(trace.root.attr_str("pd.outcome"), Some("error"));
    assert_eq!(trace.root.status, "error");
    let code = trace
        .root
        .attr_str("error.type")
        .expect("the gateway's error code");
    assert_eq!(trace.root.status_message, code);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_pd_legs_are_client_spans_and_carry_their_context_as_metadata() {
    let cfg = |role, o| {
        MockEngineConfig::grpc_test(EngineKind::Sglang, role, [127, 0, 60, o])
            .with_vocab(crate::grpc_pd::vocab())
    };
    let extra = format!("  model_path: {}\n", crate::grpc_pd::model_dir().display());
    let t = TracedPair::start(
        cfg(Role::Prefill, 13),
        cfg(Role::Decode, 14),
        Export::Grpc,
        &extra,
    )
    .await;
    let id = "trace-grpc";
    t.chat(id, true, &[], 200).await;
    let trace = trace_of(&t.otel, id, 2).await;
    assert_eq!(trace.root.name, "POST /v1/chat/completions");
    assert_eq!(trace.root.attr_i64("http.response.status_code"), Some(200));
    assert_eq!(trace.root.attr_str("pd.outcome"), Some("ok"));
    let room = trace.root.attr_i64("pd.bootstrap_room").expect("a room");
    for (role, engine) in [("prefill", &t.p), ("decode", &t.d)] {
        let leg = trace.leg(role);
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
    let decode = trace.leg("decode");
    assert!(
        decode.attr_i64("pd.output_tokens").is_some_and(|n| n > 0),
        "{decode:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fanned_out_sample_has_its_own_leg_spans_and_room() {
    let t = TracedPair::sglang((17, 18), Export::Grpc, "").await;
    let id = "trace-fanout";
    let body = json!({"model": "mock-model", "max_tokens": 4, "n": 2,
        "messages": [{"role": "user", "content": "two samples"}]});
    let r = post_with(
        &t.gw,
        "/v1/chat/completions",
        &[("x-request-id", id)],
        &body,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let trace = trace_of(&t.otel, id, 4).await;
    for j in 0..2i64 {
        let sample_id = format!("{id}-{j}");
        for (role, engine) in [("prefill", &t.p), ("decode", &t.d)] {
            let leg = trace
                .legs
                .iter()
                .find(|s| s.attr_i64("pd.sample") == Some(j) && s.attr_str("pd.leg") == Some(role))
                .unwrap_or_else(|| panic!("no sample {j} {role} span: {:#?}", trace.legs));
            let got = record_of(engine, &sample_id);
            assert_eq!(
                got.header("traceparent"),
                Some(traceparent_of(leg).as_str())
            );
            assert_eq!(
                leg.attr("pd.bootstrap_room"),
                got.parsed.bootstrap_room.as_ref(),
                "sample {j} {role}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moriio_legs_are_traced_in_both_dispatch_modes() {
    for (octets, concurrent) in [((19, 20), false), ((21, 22), true)] {
        let cfg = |role, o| {
            MockEngineConfig::test(EngineKind::Vllm, role, [127, 0, 60, o])
                .with_connector(Connector::MoriioWrite)
        };
        let otel = collector().await;
        let p = MockEngine::spawn(cfg(Role::Prefill, octets.0))
            .await
            .expect("prefill mock");
        let d = MockEngine::spawn(cfg(Role::Decode, octets.1))
            .await
            .expect("decode mock");
        let mut decode_spec = d.worker_spec();
        if concurrent {
            decode_spec["labels"]["moriio_write_dispatch"] = json!("concurrent");
        }
        let gw = traced_gateway(&[p.worker_spec(), decode_spec], &otel.grpc_endpoint(), "").await;
        let id = if concurrent {
            "trace-mori-concurrent"
        } else {
            "trace-mori-sequential"
        };
        let r = post_with(
            &gw,
            "/v1/chat/completions",
            &[("x-request-id", id)],
            &chat(false),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        let trace = trace_of(&otel, id, 2).await;
        assert_pd_trace(&trace, id, &p, &d);
        let minted = record_of(&d, id)
            .handoff
            .transfer_id
            .expect("a transfer id");
        for span in [&trace.root, trace.leg("prefill"), trace.leg("decode")] {
            assert_eq!(span.attr_str("pd.connector"), Some("moriio"), "{span:#?}");
            assert_eq!(span.attr_str("pd.transfer_id"), Some(minted.as_str()));
        }
    }
}
