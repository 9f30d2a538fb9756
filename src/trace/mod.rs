//! OpenTelemetry tracing of PD requests (`--enable-trace`): one SERVER span per request on a PD
//! route and one CLIENT span per leg (prefill, decode; HTTP and gRPC), exported over OTLP by
//! [`export`]. With tracing off nothing here allocates: a request checks one `Option`
//! ([`tracing`]), a leg one more (`ctx.trace`), and legs forward the client's `traceparent`
//! unchanged.
//!
//! Trace context: an incoming W3C `traceparent` / `tracestate` is continued (the root span's
//! parent is the client's span); each leg carries its own span's `traceparent` (an HTTP header,
//! gRPC metadata), so an engine that traces joins the same trace under the right leg.
//!
//! Attributes follow the OpenTelemetry HTTP/RPC conventions where one exists
//! (`http.request.method`, `http.route`, `http.response.status_code`, `server.address`,
//! `rpc.grpc.status_code`, `error.type`) and use `pd.*` for the facts of a PD handoff; the list
//! is in docs/configuration.md ("Tracing").

pub mod export;

use std::borrow::Cow;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use http::HeaderValue;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider, Span as SdkSpan};
use opentelemetry_sdk::Resource;
use pingora::http::RequestHeader;

use crate::config::{GatewayConfig, OtlpEndpoint};
use crate::legs::client::{LegError, LegErrorKind};
use crate::proxy::ctx::RequestCtx;
use crate::workers::Worker;

/// The process's tracer, when tracing is on.
pub struct Tracing {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
}

static TRACING: OnceLock<Tracing> = OnceLock::new();

/// The tracer, or `None` with tracing off (the only check on the hot path).
#[inline]
pub fn tracing() -> Option<&'static Tracing> {
    TRACING.get()
}

/// Sets tracing up from the validated config (no thread starts here: Pingora may still fork;
/// the exporter's thread starts with the first finished span). Once per process.
pub fn init(cfg: &GatewayConfig) -> Result<(), String> {
    let Some(endpoint) = cfg.otlp_endpoint() else {
        return Ok(());
    };
    let endpoint: OtlpEndpoint = endpoint?;
    log::info!(
        "tracing on: OTLP {} to {}",
        endpoint.protocol.as_str(),
        endpoint.url
    );
    let processor = export::QueueProcessor::new(endpoint, export::QueueSettings::default());
    let mut resource = Resource::builder();
    // OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES win when set (the SDK reads them).
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("pdgate");
    }
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        // A client that sent `sampled=0` is not traced here either (W3C parent-based sampling).
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)))
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("pdgate");
    TRACING
        .set(Tracing {
            provider,
            tracer,
            propagator: TraceContextPropagator::new(),
        })
        .map_err(|_| "tracing was already set up in this process".to_string())
}

/// Flushes what is queued and stops the exporter, waiting at most `deadline` (the process is
/// exiting: SIGTERM, or the old process of a graceful upgrade).
pub fn shutdown(deadline: Duration) {
    if let Some(t) = tracing() {
        if let Err(e) = t.provider.shutdown_with_timeout(deadline) {
            log::warn!("trace export did not finish before exit: {e}");
        }
    }
}

/// The request's root span, held in [`RequestCtx::trace`] until `logging` ends it.
pub struct RequestTrace {
    /// Holds the root span; the legs' spans are its children.
    cx: Context,
}

/// A leg's span, when the request is traced. Boxed: a leg holds one pointer when tracing is off.
pub type LegTrace = Option<Box<LegSpan>>;

/// Starts the root span of a PD request (no-op with tracing off): `METHOD /path`, SERVER kind,
/// started when the request arrived, child of the client's `traceparent` when it sent one.
pub fn start_request(req: &RequestHeader, ctx: &mut RequestCtx) {
    let Some(t) = tracing() else {
        return;
    };
    let parent = t.propagator.extract(&HeaderExtractor(&req.headers));
    let method = req.method.as_str();
    let path = req.uri.path();
    let started = SystemTime::now()
        .checked_sub(ctx.started.elapsed())
        .unwrap_or_else(SystemTime::now);
    let root = t
        .tracer
        .span_builder(format!("{method} {path}"))
        .with_kind(SpanKind::Server)
        .with_start_time(started)
        .with_attributes([
            KeyValue::new("http.request.method", method.to_string()),
            KeyValue::new("http.route", path.to_string()),
            KeyValue::new("url.path", path.to_string()),
            KeyValue::new("pd.request_id", ctx.request_id.clone()),
        ])
        .start_with_context(&t.tracer, &parent);
    ctx.trace = Some(RequestTrace {
        cx: Context::new().with_span(root),
    });
}

/// Ends the root span with what the access line reports: status (499 for a client that left
/// before one was sent), error code, outcome, the last attempt's pair and handoff, attempts and
/// TTFT. `failure`: the proxy's error, if any.
pub fn end_request(ctx: &mut RequestCtx, failure: Option<&pingora::Error>) {
    let Some(trace) = ctx.trace.take() else {
        return;
    };
    let status = if ctx.status == 0 && ctx.client_gone {
        499
    } else {
        ctx.status
    };
    let span = trace.cx.span();
    let mut attrs = Vec::with_capacity(16);
    attrs.push(KeyValue::new(
        "http.response.status_code",
        i64::from(status),
    ));
    attrs.push(KeyValue::new("pd.attempts", i64::from(ctx.attempts)));
    attrs.push(KeyValue::new("pd.streaming", ctx.streaming));
    if let Some(model) = &ctx.model_label {
        attrs.push(KeyValue::new("gen_ai.request.model", model.to_string()));
    }
    if let Some(pair) = &ctx.pair {
        attrs.push(KeyValue::new(
            "pd.prefill.url",
            pair.prefill.url().to_string(),
        ));
        attrs.push(KeyValue::new(
            "pd.decode.url",
            pair.decode.url().to_string(),
        ));
    }
    handoff_attributes(
        &mut attrs,
        ctx.connector,
        ctx.room,
        ctx.transfer_id.as_deref(),
    );
    if let Some(ttft) = ctx.ttft {
        attrs.push(KeyValue::new("pd.ttft_ms", ttft.as_secs_f64() * 1e3));
    }
    // A 4xx is the client's request refused; anything else that is not a clean 2xx/3xx is an
    // error: a 5xx, no answer at all, a stream that ended with an error event after its 200
    // head, or a response cut short.
    let outcome = if ctx.client_gone {
        "client_gone"
    } else if (400..500).contains(&status) {
        "rejected"
    } else if status >= 500 || status == 0 || failure.is_some() || ctx.error_code.is_some() {
        "error"
    } else {
        "ok"
    };
    attrs.push(KeyValue::new("pd.outcome", outcome));
    if let Some(code) = ctx.error_code {
        attrs.push(KeyValue::new("error.type", code));
    }
    span.set_attributes(attrs);
    if outcome == "error" {
        let why = match (ctx.error_code, failure) {
            (Some(code), _) => code.to_string(),
            (None, Some(e)) => e.to_string(),
            (None, None) => format!("status {status}"),
        };
        span.set_status(Status::error(why));
    }
    span.end();
}

fn handoff_attributes(
    attrs: &mut Vec<KeyValue>,
    connector: Option<&'static str>,
    room: Option<u64>,
    transfer_id: Option<&str>,
) {
    if let Some(c) = connector {
        attrs.push(KeyValue::new("pd.connector", c));
    }
    if let Some(room) = room {
        // Rooms are in [0, 2^63-1]: they fit an OTLP int.
        attrs.push(KeyValue::new("pd.bootstrap_room", room as i64));
    }
    if let Some(id) = transfer_id {
        attrs.push(KeyValue::new("pd.transfer_id", id.to_string()));
    }
}

/// Which leg a span is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LegRole {
    Prefill,
    Decode,
}

impl LegRole {
    pub fn as_str(self) -> &'static str {
        match self {
            LegRole::Prefill => "prefill",
            LegRole::Decode => "decode",
        }
    }
}

/// The transport of a leg (which attributes its span gets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LegTransport {
    Http,
    Grpc,
}

/// What a leg span records beyond the request's facts: set by the dispatch mode when it differs
/// from the request's (a fan-out sample's room and index).
#[derive(Clone, Copy, Debug, Default)]
pub struct LegFacts {
    pub room: Option<u64>,
    pub sample: Option<u64>,
}

/// Opens the span of a leg of the current attempt (`None`, and no allocation, when the request
/// is not traced). The handoff facts come from `ctx` (`connector`, `room`, `transfer_id` are set
/// before the legs go out), overridden by `facts`.
pub fn leg(
    ctx: &RequestCtx,
    role: LegRole,
    transport: LegTransport,
    worker: &Worker,
    facts: LegFacts,
) -> LegTrace {
    let trace = ctx.trace.as_ref()?;
    let t = tracing()?;
    let mut attrs = Vec::with_capacity(14);
    attrs.push(KeyValue::new("pd.leg", role.as_str()));
    attrs.push(KeyValue::new("pd.request_id", ctx.request_id.clone()));
    attrs.push(KeyValue::new("pd.attempt", i64::from(ctx.attempts)));
    attrs.push(KeyValue::new("pd.worker.url", worker.url().to_string()));
    attrs.push(KeyValue::new(
        "server.address",
        worker
            .address
            .host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
    ));
    if let Some(port) = worker
        .address
        .authority
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse::<u16>().ok())
    {
        attrs.push(KeyValue::new("server.port", i64::from(port)));
    }
    match transport {
        LegTransport::Http => attrs.push(KeyValue::new("http.request.method", "POST")),
        LegTransport::Grpc => {
            attrs.push(KeyValue::new("rpc.system", "grpc"));
            attrs.push(KeyValue::new("rpc.method", "Generate"));
        }
    }
    handoff_attributes(
        &mut attrs,
        ctx.connector,
        facts.room.or(ctx.room),
        ctx.transfer_id.as_deref(),
    );
    if let Some(j) = facts.sample {
        attrs.push(KeyValue::new("pd.sample", j as i64));
    }
    let span = t
        .tracer
        .span_builder(role.as_str())
        .with_kind(SpanKind::Client)
        .with_attributes(attrs)
        .start_with_context(&t.tracer, &trace.cx);
    let traceparent = traceparent_of(span.span_context());
    let tracestate = tracestate_of(span.span_context());
    Some(Box::new(LegSpan {
        span,
        transport,
        traceparent,
        tracestate,
        bytes: 0,
        tokens: 0,
        http_status: None,
        grpc_code: None,
        error: None,
        completed: false,
    }))
}

/// One leg's span. It ends when dropped — with the leg, wherever the leg ends (released to the
/// pool, dropped on a failure or a cancellation, drained in the background) — and records then
/// how the leg went: `pd.outcome` `ok` (the response read to its end), `error` (a transport
/// failure, a 4xx/5xx, a gRPC error) or `cancelled` (the gateway let go of it first).
pub struct LegSpan {
    span: SdkSpan,
    transport: LegTransport,
    traceparent: HeaderValue,
    tracestate: Option<HeaderValue>,
    /// Response body bytes received (HTTP).
    bytes: u64,
    /// Output token ids received (gRPC).
    tokens: u64,
    http_status: Option<u16>,
    grpc_code: Option<i32>,
    /// The first failure (`error.type`, and the status description).
    error: Option<(Cow<'static, str>, String)>,
    completed: bool,
}

impl LegSpan {
    /// The `traceparent` a leg sends: this span as the parent of the engine's work.
    pub fn traceparent(&self) -> &HeaderValue {
        &self.traceparent
    }

    /// The `tracestate` a leg sends (the client's, carried along), if any.
    pub fn tracestate(&self) -> Option<&HeaderValue> {
        self.tracestate.as_ref()
    }

    /// The leg's response head arrived with `status`.
    pub fn http_status(&mut self, status: u16) {
        self.http_status = Some(status);
    }

    /// Response bytes (HTTP) went through.
    pub fn add_bytes(&mut self, n: usize) {
        self.bytes += n as u64;
    }

    /// Output tokens (gRPC) arrived.
    pub fn add_tokens(&mut self, n: usize) {
        self.tokens += n as u64;
    }

    /// The output tokens of a gRPC `complete`: counted only when no chunk came before (in a
    /// stream the `complete` repeats the last delta; a non-streamed call has only this).
    pub fn add_final_tokens(&mut self, n: usize) {
        if self.tokens == 0 {
            self.tokens = n as u64;
        }
    }

    /// The leg's response ended normally.
    pub fn complete(&mut self) {
        self.completed = true;
        self.error = None;
    }

    /// An HTTP leg failed (the first failure is kept).
    pub fn http_failed(&mut self, e: &LegError) {
        if self.error.is_none() {
            self.error = Some((Cow::Borrowed(leg_error_type(e.kind)), e.to_string()));
        }
    }

    /// A gRPC leg ended with `status` (`Ok` included: code 0).
    pub fn grpc_status(&mut self, status: &tonic::Status) {
        self.grpc_code = Some(status.code() as i32);
        if self.error.is_none() {
            self.error = Some((
                Cow::Owned(format!("{:?}", status.code())),
                status.message().to_string(),
            ));
        }
    }

    /// A gRPC leg's stream ended normally.
    pub fn grpc_ok(&mut self) {
        self.grpc_code = Some(0);
        self.complete();
    }
}

fn leg_error_type(kind: LegErrorKind) -> &'static str {
    match kind {
        LegErrorKind::Connect => "connect",
        LegErrorKind::Send => "send",
        LegErrorKind::Head => "no_response_head",
        LegErrorKind::Body => "body",
        LegErrorKind::Timeout => "timeout",
        LegErrorKind::TooLarge => "too_large",
    }
}

impl Drop for LegSpan {
    fn drop(&mut self) {
        let mut attrs = Vec::with_capacity(5);
        match self.transport {
            LegTransport::Http => attrs.push(KeyValue::new("pd.bytes", self.bytes as i64)),
            LegTransport::Grpc => attrs.push(KeyValue::new("pd.output_tokens", self.tokens as i64)),
        }
        if let Some(s) = self.http_status {
            attrs.push(KeyValue::new("http.response.status_code", i64::from(s)));
        }
        if let Some(c) = self.grpc_code {
            attrs.push(KeyValue::new("rpc.grpc.status_code", i64::from(c)));
        }
        let bad_status = self.http_status.is_some_and(|s| s >= 400);
        let outcome = match (&self.error, self.completed) {
            (Some(_), _) => "error",
            (None, _) if bad_status => "error",
            (None, true) => "ok",
            (None, false) => "cancelled",
        };
        attrs.push(KeyValue::new("pd.outcome", outcome));
        if let Some((kind, why)) = self.error.take() {
            attrs.push(KeyValue::new("error.type", kind));
            self.span.set_status(Status::error(why));
        } else if bad_status {
            let s = self.http_status.unwrap_or_default();
            attrs.push(KeyValue::new("error.type", s.to_string()));
            self.span.set_status(Status::error(format!("HTTP {s}")));
        }
        self.span.set_attributes(attrs);
        self.span.end();
    }
}

/// `00-<trace id>-<span id>-<flags>` (W3C Trace Context, version 00).
fn traceparent_of(sc: &SpanContext) -> HeaderValue {
    let v = format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    );
    HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static(""))
}

fn tracestate_of(sc: &SpanContext) -> Option<HeaderValue> {
    let state = sc.trace_state().header();
    if state.is_empty() {
        return None;
    }
    HeaderValue::from_str(&state).ok()
}

/// Reads `traceparent` / `tracestate` from the client's request head.
struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};

    #[test]
    fn traceparent_is_w3c_version_00() {
        let sc = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            false,
            TraceState::from_key_value([("congo", "t61rcWkgMzE")]).unwrap(),
        );
        assert_eq!(
            traceparent_of(&sc),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        assert_eq!(tracestate_of(&sc).unwrap(), "congo=t61rcWkgMzE");
    }

    #[test]
    fn incoming_trace_context_is_extracted() {
        let mut h = http::HeaderMap::new();
        h.insert(
            "traceparent",
            HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        let cx = TraceContextPropagator::new().extract(&HeaderExtractor(&h));
        let span = cx.span();
        let sc = span.span_context();
        assert!(sc.is_remote() && sc.is_sampled());
        assert_eq!(sc.span_id(), SpanId::from_hex("00f067aa0ba902b7").unwrap());
    }
}
