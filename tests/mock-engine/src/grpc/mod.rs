//! The gRPC transport: the engine's own servicer (`SglangScheduler`, `VllmEngine` or
//! `TokenSpeedScheduler`) on the API port, over the same rendezvous core and fake model as the
//! HTTP dialects. Token ids in, token ids out; the `/mock/*` control plane moves to a second
//! HTTP port.
//!
//! This module owns what the three servicers share: the listener (whose connections die with
//! [`crate::MockEngine::kill`] like a crashed process's), the live-call registry that `Abort`
//! reaches, the status mapping of each engine, and the conversions of the info RPCs. The
//! `Generate` driver is [`generate`]; each engine's proto lives in its own submodule.

pub(crate) mod encoder;
pub(crate) mod generate;
mod sglang;
mod tokenspeed;
mod vllm;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic::transport::Server;
use tonic::{Code, Status};

use crate::config::{EngineKind, GrpcCode, MockEngineConfig, Role};
use crate::engine::Shared;
use crate::fake_model::{Finish, Matched, RefOutput};
use crate::job::{ApiError, ErrorKind};
use crate::records::{now_ms, AbortRecord};
use crate::sglang::BootstrapItem;

/// gRPC state of one engine: live `Generate` calls by request id (what `Abort` reaches), the
/// `Abort` log, and the switch that kills every connection.
pub(crate) struct GrpcState {
    calls: Mutex<HashMap<String, Vec<LiveCall>>>,
    aborts: Mutex<Vec<AbortRecord>>,
    /// Samples (`n` per call) of the live `Generate` calls: the scheduler's requests.
    live_samples: AtomicU64,
    kill: CancellationToken,
    started: SystemTime,
}

impl Default for GrpcState {
    fn default() -> Self {
        GrpcState {
            calls: Mutex::default(),
            aborts: Mutex::default(),
            live_samples: AtomicU64::new(0),
            kill: CancellationToken::new(),
            started: SystemTime::now(),
        }
    }
}

struct LiveCall {
    seq: u64,
    abort: CancellationToken,
}

/// A live call's registration; dropping it unregisters the call.
pub(crate) struct LiveHandle {
    shared: Arc<Shared>,
    request_id: String,
    seq: u64,
    samples: u64,
    pub abort: CancellationToken,
}

impl Drop for LiveHandle {
    fn drop(&mut self) {
        let g = &self.shared.grpc;
        g.live_samples.fetch_sub(self.samples, Ordering::Relaxed);
        let mut calls = g.calls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = calls.get_mut(&self.request_id) {
            v.retain(|c| c.seq != self.seq);
            if v.is_empty() {
                calls.remove(&self.request_id);
            }
        }
    }
}

impl GrpcState {
    /// Registers a live `Generate` call of `samples` samples under its request id.
    pub(crate) fn register(
        shared: &Arc<Shared>,
        request_id: &str,
        seq: u64,
        samples: u64,
    ) -> LiveHandle {
        let abort = CancellationToken::new();
        let g = &shared.grpc;
        g.live_samples.fetch_add(samples, Ordering::Relaxed);
        g.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(request_id.to_string())
            .or_default()
            .push(LiveCall {
                seq,
                abort: abort.clone(),
            });
        LiveHandle {
            shared: shared.clone(),
            request_id: request_id.to_string(),
            seq,
            samples,
            abort,
        }
    }

    pub(crate) fn live_samples(&self) -> u64 {
        self.live_samples.load(Ordering::Relaxed)
    }

    /// Live `Generate` calls (`active_requests` of the server info).
    pub(crate) fn live_calls(&self) -> usize {
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(Vec::len)
            .sum()
    }

    pub(crate) fn started(&self) -> SystemTime {
        self.started
    }

    pub(crate) fn uptime_secs(&self) -> f64 {
        self.started.elapsed().unwrap_or_default().as_secs_f64()
    }

    /// Records an `Abort` RPC and ends the live calls it names; returns their sequence numbers.
    pub(crate) fn abort(&self, request_ids: &[String], reason: Option<String>) -> Vec<u64> {
        let mut seqs = Vec::new();
        {
            let calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
            for id in request_ids {
                for c in calls.get(id).into_iter().flatten() {
                    c.abort.cancel();
                    seqs.push(c.seq);
                }
            }
        }
        self.aborts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(AbortRecord {
                at_ms: now_ms(),
                request_ids: request_ids.to_vec(),
                reason,
                aborted_seqs: seqs.clone(),
            });
        seqs
    }

    pub(crate) fn aborts(&self) -> Vec<AbortRecord> {
        self.aborts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn clear_aborts(&self) {
        self.aborts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Closes every gRPC connection and stops accepting: the peers see what a crashed
    /// process leaves them (their calls fail, new connections are refused).
    pub(crate) fn kill_connections(&self) {
        self.kill.cancel();
    }
}

/// The token ids a gRPC engine returns for a reference run: the concatenated chunk
/// `token_ids` of a stream, or the `output_ids` of a non-stream complete. TokenSpeed drops a
/// matched trailing stop token (EOS or `stop_token_ids`) unless `no_stop_trim`; SGLang and vLLM
/// keep it.
pub fn wire_output_ids(engine: EngineKind, r: &RefOutput, no_stop_trim: bool) -> Vec<u32> {
    let mut ids = r.token_ids.clone();
    if engine == EngineKind::TokenSpeed && !no_stop_trim {
        if let Finish::Stop(Matched::Token(m)) = r.finish {
            if ids.last() == Some(&m) {
                ids.pop();
            }
        }
    }
    ids
}

/// Whether `HealthCheck` reports the engine unhealthy: crashed, or the `unhealthy` fault.
pub(crate) fn unhealthy(shared: &Shared) -> bool {
    shared.crashed.load(Ordering::SeqCst)
        || shared
            .has_fault(|f| matches!(f, crate::config::Fault::Unhealthy))
            .is_some()
}

/// Counts one RPC of `method` (`/mock/stats` `rpc_calls`).
pub(crate) fn count_rpc(shared: &Shared, method: &str) {
    shared
        .counters
        .with(|c| *c.rpc_calls.entry(method.to_string()).or_default() += 1);
}

/// Serves the engine's gRPC service on `listener` until the engine is killed.
pub(crate) fn serve(shared: &Arc<Shared>, listener: TcpListener) {
    let kill = shared.grpc.kill.clone();
    let incoming = TcpListenerStream::new(listener).map(move |accepted| {
        accepted.map(|stream| {
            let _ = stream.set_nodelay(true);
            KillableIo::new(stream, kill.clone())
        })
    });
    let shutdown = shared.grpc.kill.clone().cancelled_owned();
    let group = shared.groups.api.clone();
    let builder = Server::builder();
    match shared.cfg.engine {
        EngineKind::Sglang => {
            let svc = sglang::service(shared);
            group.spawn(async move {
                let _ = builder
                    .serve_with_incoming_shutdown(svc, incoming, shutdown)
                    .await;
            });
        }
        EngineKind::Vllm => {
            let svc = vllm::service(shared);
            group.spawn(async move {
                let _ = builder
                    .serve_with_incoming_shutdown(svc, incoming, shutdown)
                    .await;
            });
        }
        EngineKind::TokenSpeed if shared.cfg.role == Role::Encode => {
            // An encode worker also answers the scheduler's info RPCs, so a gateway registers
            // it like any TokenSpeed worker.
            let svc = EncodeWorker {
                scheduler: tokenspeed::service(shared),
                encoder: encoder::service(shared),
            };
            group.spawn(async move {
                let _ = builder
                    .serve_with_incoming_shutdown(svc, incoming, shutdown)
                    .await;
            });
        }
        EngineKind::TokenSpeed => {
            let svc = tokenspeed::service(shared);
            group.spawn(async move {
                let _ = builder
                    .serve_with_incoming_shutdown(svc, incoming, shutdown)
                    .await;
            });
        }
    }
}

/// An encode worker's two services on one port, by method path (tonic's router would bring
/// axum in for this one case).
#[derive(Clone)]
struct EncodeWorker {
    scheduler: pdgate_proto::tokenspeed::token_speed_scheduler_server::TokenSpeedSchedulerServer<
        tokenspeed::TokenSpeedService,
    >,
    encoder: pdgate_proto::tokenspeed_encoder::token_speed_encoder_server::TokenSpeedEncoderServer<
        encoder::EncoderService,
    >,
}

impl tonic::codegen::Service<http::Request<tonic::body::Body>> for EncodeWorker {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Both generated servers are always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if req.uri().path().starts_with("/tokenspeed.grpc.encoder.") {
            Box::pin(self.encoder.call(req))
        } else {
            Box::pin(self.scheduler.call(req))
        }
    }
}

/// A connection that fails every read and write once the engine is killed, so hyper drops it
/// (and every call on it) at once instead of draining gracefully.
struct KillableIo {
    inner: TcpStream,
    killed: Pin<Box<WaitForCancellationFutureOwned>>,
    dead: bool,
}

impl KillableIo {
    fn new(inner: TcpStream, kill: CancellationToken) -> Self {
        KillableIo {
            inner,
            killed: Box::pin(kill.cancelled_owned()),
            dead: false,
        }
    }

    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if !self.dead && self.killed.as_mut().poll(cx).is_ready() {
            self.dead = true;
        }
        if self.dead {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "mock engine killed",
            ));
        }
        Ok(())
    }
}

impl AsyncRead for KillableIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if let Err(e) = me.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut me.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for KillableIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        if let Err(e) = me.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut me.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        if let Err(e) = me.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut me.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if let Err(e) = me.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut me.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl Connected for KillableIo {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.inner.connect_info()
    }
}

/// SGLang `disaggregated_params` / TokenSpeed `kv_bootstrap_info` (host, port, room) of a
/// prefill or decode leg, as the rendezvous core takes them. A `Both` engine ignores them, as an
/// aggregated scheduler does.
pub(crate) fn bootstrap_items(
    cfg: &MockEngineConfig,
    fields: Option<(&str, i32, i64)>,
    dp_rank: Option<i32>,
) -> Result<Vec<BootstrapItem>, Status> {
    if cfg.role == Role::Both {
        return Ok(Vec::new());
    }
    let Some((host, port, room)) = fields else {
        // The scheduler's 400 for a disaggregated request without a room.
        return Err(Status::invalid_argument(
            "Invalid request: Disaggregated request received without bootstrap room id.",
        ));
    };
    if room < 0 {
        return Err(Status::invalid_argument(format!(
            "bootstrap_room must be non-negative, got {room}"
        )));
    }
    let port = match port {
        0 => None,
        p if (1..=65535).contains(&p) => Some(p as u16),
        p => {
            return Err(Status::invalid_argument(format!(
                "bootstrap_port must be in [1, 65535], got {p}"
            )))
        }
    };
    Ok(vec![BootstrapItem {
        host: (!host.is_empty()).then(|| host.to_string()),
        port,
        room: room as u64,
        routed_dp_rank: dp_rank.filter(|r| *r >= 0).map(|r| r as u32),
        disagg_prefill_dp_rank: None,
    }])
}

/// The prompt checks of each engine (empty prompt, longer than the context window).
pub(crate) fn check_prompt(cfg: &MockEngineConfig, ids: &[u32]) -> Result<(), Status> {
    let max = cfg.max_model_len as usize;
    match cfg.engine {
        EngineKind::Vllm if ids.is_empty() => Err(Status::invalid_argument(
            "The decoder prompt cannot be empty",
        )),
        EngineKind::Vllm if ids.len() > max => Err(Status::invalid_argument(format!(
            "The decoder prompt (length {}) is longer than the maximum model length of {max}. Make sure that `max_model_len` is no smaller than the number of text tokens.",
            ids.len()
        ))),
        EngineKind::TokenSpeed if ids.is_empty() => Err(Status::invalid_argument(
            "GenerateRequest.tokenized.input_ids is empty",
        )),
        EngineKind::Sglang if ids.is_empty() => Err(Status::invalid_argument(
            "The input_ids of a generate request must not be empty",
        )),
        EngineKind::Sglang | EngineKind::TokenSpeed if ids.len() > max => {
            Err(Status::invalid_argument(format!(
                "Input length ({} tokens) exceeds the maximum allowed length ({max} tokens). Use a shorter input or enable --allow-auto-truncate.",
                ids.len()
            )))
        }
        _ => Ok(()),
    }
}

/// SGLang / TokenSpeed `disaggregation_mode`.
pub(crate) fn disaggregation_mode(role: Role) -> &'static str {
    match role {
        Role::Prefill => "prefill",
        Role::Decode => "decode",
        Role::Both => "null",
        Role::Encode => "encode",
    }
}

/// One DP rank's load as the engine reports it (rank 0 carries the live counts).
pub(crate) struct RankLoad {
    pub dp_rank: u32,
    pub running: u64,
    pub waiting: u64,
    pub used_tokens: u64,
    pub max_total_tokens: u64,
    pub token_usage: f64,
}

/// The engine's load per DP rank, optionally only `dp_rank`.
pub(crate) fn rank_loads(shared: &Shared, dp_rank: Option<i32>) -> Vec<RankLoad> {
    let (running, waiting, usage) = crate::engine::current_load(shared);
    let kv = shared.cfg.kv_tokens as u64;
    let used = ((usage * kv as f64) as u64).min(kv);
    (0..shared.cfg.dp_size.max(1))
        .filter(|r| dp_rank.is_none_or(|want| want == *r as i32))
        .map(|r| {
            let live = r == 0;
            RankLoad {
                dp_rank: r,
                running: if live { running } else { 0 },
                waiting: if live { waiting } else { 0 },
                used_tokens: if live { used } else { 0 },
                max_total_tokens: kv,
                token_usage: if live {
                    used as f64 / kv.max(1) as f64
                } else {
                    0.0
                },
            }
        })
        .collect()
}

/// Our config's code as tonic's.
pub(crate) fn tonic_code(c: GrpcCode) -> Code {
    match c {
        GrpcCode::Cancelled => Code::Cancelled,
        GrpcCode::Unknown => Code::Unknown,
        GrpcCode::InvalidArgument => Code::InvalidArgument,
        GrpcCode::DeadlineExceeded => Code::DeadlineExceeded,
        GrpcCode::NotFound => Code::NotFound,
        GrpcCode::AlreadyExists => Code::AlreadyExists,
        GrpcCode::PermissionDenied => Code::PermissionDenied,
        GrpcCode::ResourceExhausted => Code::ResourceExhausted,
        GrpcCode::FailedPrecondition => Code::FailedPrecondition,
        GrpcCode::Aborted => Code::Aborted,
        GrpcCode::OutOfRange => Code::OutOfRange,
        GrpcCode::Unimplemented => Code::Unimplemented,
        GrpcCode::Internal => Code::Internal,
        GrpcCode::Unavailable => Code::Unavailable,
        GrpcCode::DataLoss => Code::DataLoss,
        GrpcCode::Unauthenticated => Code::Unauthenticated,
    }
}

/// The spec's name of a tonic code (`"INVALID_ARGUMENT"`), as records show it.
pub fn code_name(c: Code) -> &'static str {
    match c {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The code an engine's servicer aborts with for a scheduler error of HTTP `status`:
/// SGLang's `abort_code_from_output`, TokenSpeed's `_abort_status_code`, vLLM's
/// `grpc_code_for` (smg-grpc-servicer).
pub(crate) fn code_for_status(engine: EngineKind, status: u16) -> Code {
    match (engine, status) {
        (_, 400) => Code::InvalidArgument,
        (EngineKind::Sglang | EngineKind::Vllm, 503) => Code::Unavailable,
        (EngineKind::Vllm, 404) => Code::NotFound,
        (EngineKind::Vllm | EngineKind::TokenSpeed, 429) => Code::ResourceExhausted,
        (EngineKind::TokenSpeed, 408 | 504) => Code::DeadlineExceeded,
        _ => Code::Internal,
    }
}

/// The status a failed `Generate` ends with.
pub(crate) fn status_of(shared: &Shared, e: &ApiError) -> Status {
    let code = match e.kind {
        ErrorKind::Fault(c) => tonic_code(c),
        ErrorKind::KvTimeout if shared.cfg.engine.uses_bootstrap_rooms() => {
            tonic_code(shared.cfg.grpc.kv_timeout_code)
        }
        _ => code_for_status(shared.cfg.engine, e.status),
    };
    Status::new(code, e.message.clone())
}

/// gRPC metadata as lower-case ASCII pairs (binary values are skipped).
pub(crate) fn metadata_map(md: &tonic::metadata::MetadataMap) -> BTreeMap<String, String> {
    md.iter()
        .filter_map(|kv| match kv {
            tonic::metadata::KeyAndValueRef::Ascii(k, v) => v
                .to_str()
                .ok()
                .map(|v| (k.as_str().to_string(), v.to_string())),
            tonic::metadata::KeyAndValueRef::Binary(..) => None,
        })
        .collect()
}

/// A JSON object as a `google.protobuf.Struct` (SGLang / TokenSpeed `server_args`).
pub(crate) fn to_struct(v: &Value) -> prost_types::Struct {
    match v {
        Value::Object(m) => prost_types::Struct {
            fields: m.iter().map(|(k, v)| (k.clone(), to_value(v))).collect(),
        },
        _ => prost_types::Struct::default(),
    }
}

fn to_value(v: &Value) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.iter().map(to_value).collect(),
        }),
        Value::Object(_) => Kind::StructValue(to_struct(v)),
    };
    prost_types::Value { kind: Some(kind) }
}

/// A `google.protobuf.Struct` as JSON (what a test reads `server_args` with).
pub fn struct_to_json(s: &prost_types::Struct) -> Value {
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect(),
    )
}

fn value_to_json(v: &prost_types::Value) -> Value {
    use prost_types::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n)
            .map(|n| {
                // Integral values read back as integers, as JSON-minded callers expect.
                if n.as_f64()
                    .is_some_and(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                {
                    Value::from(n.as_f64().unwrap_or_default() as i64)
                } else {
                    Value::Number(n)
                }
            })
            .unwrap_or(Value::Null),
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value_to_json).collect()),
        Some(Kind::StructValue(s)) => struct_to_json(s),
    }
}

/// Now as ISO 8601 UTC (`GetLoadsResponse.timestamp`, Python's `datetime.isoformat()`).
pub(crate) fn iso8601_now() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}+00:00",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        d.subsec_micros()
    )
}

/// The engine's start time as a protobuf timestamp (`GetServerInfo.start_time`).
pub(crate) fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// Python's `repr` of a list of strings (SGLang quotes the refused `stop` this way).
pub(crate) fn py_list_repr(items: &[String]) -> String {
    let reprs: Vec<String> = items
        .iter()
        .map(|s| {
            let quote = if s.contains('\'') && !s.contains('"') {
                '"'
            } else {
                '\''
            };
            let mut out = String::new();
            out.push(quote);
            for c in s.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    c if c == quote => {
                        out.push('\\');
                        out.push(c);
                    }
                    c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                        out.push_str(&format!("\\x{:02x}", c as u32))
                    }
                    c => out.push(c),
                }
            }
            out.push(quote);
            out
        })
        .collect();
    format!("[{}]", reprs.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_repr_of_stop_lists() {
        assert_eq!(
            py_list_repr(&["a".into(), "it's".into(), "\n".into()]),
            r#"['a', "it's", '\n']"#
        );
        assert_eq!(py_list_repr(&[]), "[]");
    }

    #[test]
    fn struct_round_trips_json() {
        let v = serde_json::json!({"a": 1, "b": "x", "c": [true, null], "d": {"e": 2.5}});
        assert_eq!(struct_to_json(&to_struct(&v)), v);
    }

    #[test]
    fn engines_map_scheduler_statuses_like_their_servicers() {
        assert_eq!(
            code_for_status(EngineKind::Sglang, 400),
            Code::InvalidArgument
        );
        assert_eq!(code_for_status(EngineKind::Sglang, 429), Code::Internal);
        assert_eq!(
            code_for_status(EngineKind::TokenSpeed, 504),
            Code::DeadlineExceeded
        );
        assert_eq!(code_for_status(EngineKind::TokenSpeed, 503), Code::Internal);
        assert_eq!(code_for_status(EngineKind::Vllm, 404), Code::NotFound);
        assert_eq!(code_for_status(EngineKind::Vllm, 503), Code::Unavailable);
    }
}
