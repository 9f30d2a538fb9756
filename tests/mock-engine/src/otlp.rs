//! A mock OpenTelemetry collector for the tracing tests: it accepts spans over OTLP/gRPC
//! (`opentelemetry.proto.collector.trace.v1.TraceService/Export`) and OTLP/HTTP
//! (`POST /v1/traces`, `application/x-protobuf`), decodes them with the `opentelemetry-proto`
//! types, and keeps them in memory (up to a cap: a benchmark only needs them counted). The HTTP
//! listener also serves them as JSON (`GET /mock/spans`, `GET /mock/stats` for the counts;
//! `POST /mock/reset` forgets them), for scripts and the `mock-collector` binary; tests read
//! [`MockCollector::spans`] directly.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::Method;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use prost::Message;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;

use crate::server::{self, TaskGroup};

/// One span as the collector received it, flattened for assertions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReceivedSpan {
    /// Lower-case hex, 32 digits.
    pub trace_id: String,
    /// Lower-case hex, 16 digits.
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// `server`, `client`, `internal`, `producer`, `consumer` or `unspecified`.
    pub kind: String,
    /// `unset`, `ok` or `error`.
    pub status: String,
    pub status_message: String,
    pub attributes: BTreeMap<String, Value>,
    /// The resource's `service.name`.
    pub service_name: Option<String>,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    /// How it arrived: `grpc` or `http`.
    pub via: String,
}

impl ReceivedSpan {
    pub fn attr(&self, key: &str) -> Option<&Value> {
        self.attributes.get(key)
    }

    pub fn attr_str(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).and_then(Value::as_str)
    }

    pub fn attr_i64(&self, key: &str) -> Option<i64> {
        self.attributes.get(key).and_then(Value::as_i64)
    }
}

struct Shared {
    spans: Mutex<Vec<ReceivedSpan>>,
    /// Export calls received (both protocols).
    exports: Mutex<u64>,
    /// Spans received, kept or not.
    received: Mutex<u64>,
    /// Most spans kept.
    keep: usize,
}

impl Shared {
    fn add(&self, req: ExportTraceServiceRequest, via: &str) {
        let mut out = Vec::new();
        for rs in req.resource_spans {
            let service_name = rs.resource.as_ref().and_then(|r| {
                r.attributes
                    .iter()
                    .find(|kv| kv.key == "service.name")
                    .and_then(|kv| any_to_json(kv.value.as_ref()).as_str().map(str::to_string))
            });
            for ss in rs.scope_spans {
                for s in ss.spans {
                    let status = s.status.as_ref();
                    out.push(ReceivedSpan {
                        trace_id: hex(&s.trace_id),
                        span_id: hex(&s.span_id),
                        parent_span_id: hex(&s.parent_span_id),
                        name: s.name,
                        kind: match s.kind {
                            1 => "internal",
                            2 => "server",
                            3 => "client",
                            4 => "producer",
                            5 => "consumer",
                            _ => "unspecified",
                        }
                        .to_string(),
                        status: match status.map_or(0, |st| st.code) {
                            1 => "ok",
                            2 => "error",
                            _ => "unset",
                        }
                        .to_string(),
                        status_message: status.map(|st| st.message.clone()).unwrap_or_default(),
                        attributes: attributes(&s.attributes),
                        service_name: service_name.clone(),
                        start_unix_nano: s.start_time_unix_nano,
                        end_unix_nano: s.end_time_unix_nano,
                        via: via.to_string(),
                    });
                }
            }
        }
        *self.exports.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        *self.received.lock().unwrap_or_else(|e| e.into_inner()) += out.len() as u64;
        let mut kept = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        let room = self.keep.saturating_sub(kept.len());
        kept.extend(out.into_iter().take(room));
    }

    fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, Value> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), any_to_json(kv.value.as_ref())))
        .collect()
}

fn any_to_json(v: Option<&AnyValue>) -> Value {
    match v.and_then(|v| v.value.as_ref()) {
        None => Value::Null,
        Some(any_value::Value::StringValue(s)) => json!(s),
        Some(any_value::Value::BoolValue(b)) => json!(b),
        Some(any_value::Value::IntValue(i)) => json!(i),
        Some(any_value::Value::DoubleValue(d)) => json!(d),
        Some(any_value::Value::ArrayValue(a)) => {
            Value::Array(a.values.iter().map(|v| any_to_json(Some(v))).collect())
        }
        Some(any_value::Value::KvlistValue(kv)) => json!(attributes(&kv.values)),
        Some(any_value::Value::BytesValue(b)) => json!(hex(b)),
        #[allow(unreachable_patterns)]
        Some(_) => Value::Null,
    }
}

struct GrpcReceiver(Arc<Shared>);

#[tonic::async_trait]
impl TraceService for GrpcReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.add(request.into_inner(), "grpc");
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// A running mock collector. Dropping it closes its listeners.
pub struct MockCollector {
    shared: Arc<Shared>,
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    group: Arc<TaskGroup>,
    stop: CancellationToken,
}

impl MockCollector {
    /// Listens on `ip` (OS-assigned ports): OTLP/gRPC on one port, OTLP/HTTP and the JSON
    /// control routes on another. Keeps every span.
    pub async fn spawn(ip: IpAddr) -> io::Result<MockCollector> {
        MockCollector::spawn_on(ip, 0, 0, usize::MAX).await
    }

    /// [`MockCollector::spawn`] on given ports (0: any), keeping at most `keep` spans (the rest
    /// are only counted).
    pub async fn spawn_on(
        ip: IpAddr,
        grpc_port: u16,
        http_port: u16,
        keep: usize,
    ) -> io::Result<MockCollector> {
        let shared = Arc::new(Shared {
            spans: Mutex::new(Vec::new()),
            exports: Mutex::new(0),
            received: Mutex::new(0),
            keep,
        });
        let group = Arc::new(TaskGroup::default());
        let stop = CancellationToken::new();

        let grpc_l = TcpListener::bind(SocketAddr::new(ip, grpc_port)).await?;
        let grpc_addr = grpc_l.local_addr()?;
        let svc = TraceServiceServer::new(GrpcReceiver(shared.clone()));
        let shutdown = stop.clone().cancelled_owned();
        group.spawn(async move {
            let _ = tonic::transport::Server::builder()
                .serve_with_incoming_shutdown(svc, TcpListenerStream::new(grpc_l), shutdown)
                .await;
        });

        let http_l = TcpListener::bind(SocketAddr::new(ip, http_port)).await?;
        let http_addr = http_l.local_addr()?;
        let s = shared.clone();
        server::serve(http_l, group.clone(), move |req, _peer| {
            let s = s.clone();
            async move { handle_http(&s, req).await }
        });
        Ok(MockCollector {
            shared,
            grpc_addr,
            http_addr,
            group,
            stop,
        })
    }

    /// `ip:port` of the OTLP/gRPC listener (SMG's `--otlp-traces-endpoint` form).
    pub fn grpc_endpoint(&self) -> String {
        self.grpc_addr.to_string()
    }

    /// `http://ip:port/v1/traces`: the OTLP/HTTP endpoint.
    pub fn http_endpoint(&self) -> String {
        format!("http://{}/v1/traces", self.http_addr)
    }

    /// `http://ip:port` of the HTTP listener (`/mock/spans`, `/mock/reset`).
    pub fn control_url(&self) -> String {
        format!("http://{}", self.http_addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.shared.spans()
    }

    /// Export calls received so far.
    pub fn exports(&self) -> u64 {
        *self
            .shared
            .exports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Polls until `done` holds over the spans received, or `deadline` passes; the spans either
    /// way.
    pub async fn wait_for(
        &self,
        deadline: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let end = Instant::now() + deadline;
        loop {
            let spans = self.spans();
            if done(&spans) || Instant::now() >= end {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for MockCollector {
    fn drop(&mut self) {
        self.stop.cancel();
        self.group.abort_all();
    }
}

async fn handle_http(
    shared: &Shared,
    req: hyper::Request<hyper::body::Incoming>,
) -> server::HttpResponse {
    let (parts, body) = req.into_parts();
    match (&parts.method, parts.uri.path()) {
        (&Method::POST, "/v1/traces") => {
            let is_proto = parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|ct| ct.starts_with("application/x-protobuf"));
            if !is_proto {
                return server::text(415, "OTLP/HTTP: only application/x-protobuf is served");
            }
            let bytes = match server::read_body(body).await {
                Ok(b) => b,
                Err(e) => return server::text(400, e.to_string()),
            };
            match ExportTraceServiceRequest::decode(bytes) {
                Ok(export) => {
                    shared.add(export, "http");
                    let answer = ExportTraceServiceResponse {
                        partial_success: None,
                    };
                    server::full(200, "application/x-protobuf", answer.encode_to_vec())
                }
                Err(e) => server::text(400, format!("not an ExportTraceServiceRequest: {e}")),
            }
        }
        (&Method::GET, "/mock/spans") => server::json(200, &json!(shared.spans())),
        (&Method::GET, "/mock/stats") => {
            let exports = *shared.exports.lock().unwrap_or_else(|e| e.into_inner());
            let spans = *shared.received.lock().unwrap_or_else(|e| e.into_inner());
            server::json(200, &json!({"exports": exports, "spans": spans}))
        }
        (&Method::POST, "/mock/reset") => {
            shared
                .spans
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
            server::json(200, &json!({"status": "ok"}))
        }
        _ => server::text(404, "not found"),
    }
}
