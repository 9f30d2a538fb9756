//! The worker side of gRPC: how a `grpc://` worker's channels are built, and the control RPCs
//! the background services make through the engine's own servicer — runtime detection,
//! `GetModelInfo` / `GetServerInfo` at registration, `HealthCheck` for the health checker and
//! `GetLoads` for the load monitor. The request legs (`Generate`, `Abort`) are the data plane's
//! and use [`super::Worker::grpc_channel`].
//!
//! Two kinds of channel per worker, because Pingora runs each service on its own tokio runtime
//! and a channel's connection task lives on the runtime that created it:
//! - the data plane's (`legs::grpc::LegChannel`), created on first use by a request leg (so on
//!   the data-plane runtime);
//! - one per background service ([`ControlChannels`]), created inside that service, so probes
//!   and load polls never put I/O on the data plane's reactor and never die with it.
//!
//! Runtime detection is SMG's: `HealthCheck` on each service in turn (the declared runtime
//! first, then SGLang, vLLM, TensorRT-LLM, TokenSpeed, MLX); UNIMPLEMENTED means "not this one".
//! TensorRT-LLM's and MLX's protos are not vendored: their `HealthCheck` is probed with a raw
//! unary call and a two-field message of our own, which is all detection and health need.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use http::uri::PathAndQuery;
use pdgate_proto::{common, sglang, tokenspeed, vllm};
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use super::facts;
use super::load::{DisaggLoad, RankLoad};
use super::registry::Snapshot;
use super::worker::{Discovered, Worker, WorkerAddress};
use crate::config::RuntimeType;

/// HTTP/2 keep-alive ping interval, also while idle (SMG's channel settings, digest §1.8).
pub(crate) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a keep-alive ping may go unanswered before the connection is dropped.
pub(crate) const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// TCP keep-alive.
pub(crate) const TCP_KEEPALIVE: Duration = Duration::from_secs(60);
/// Flow-control windows before the adaptive window takes over (SMG's: 16 MiB / 32 MiB).
pub(crate) const STREAM_WINDOW: u32 = 16 << 20;
pub(crate) const CONNECTION_WINDOW: u32 = 32 << 20;

/// The sections of `GetLoads` the gateway asks for (SMG's).
pub const LOAD_SECTIONS: [&str; 4] = ["core", "disagg", "queues", "memory"];

/// The order in which registration tries the services after the declared runtime.
const DETECTION_ORDER: [RuntimeType; 5] = [
    RuntimeType::Sglang,
    RuntimeType::Vllm,
    RuntimeType::Trtllm,
    RuntimeType::Tokenspeed,
    RuntimeType::Mlx,
];

/// The channel settings of every gRPC worker connection: the worker's connect deadline, SMG's
/// keep-alive (HTTP/2 pings every 30 s with a 10 s timeout, also while idle; TCP keep-alive
/// 60 s), no Nagle, an adaptive flow-control window. It dials the address resolved at
/// registration (as the HTTP legs do) and names the URL's host as the `:authority`.
pub fn endpoint(
    address: &WorkerAddress,
    socket: SocketAddr,
    connect_timeout: Duration,
) -> Endpoint {
    // Invariant: a socket address and a validated authority always form a valid URI.
    let target = Endpoint::from_shared(format!("http://{socket}"))
        .expect("a socket address is a valid URI authority");
    let origin = format!("http://{}", address.authority)
        .parse()
        .unwrap_or_else(|_| target.uri().clone());
    target
        .origin(origin)
        .connect_timeout(connect_timeout)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .tcp_keepalive(Some(TCP_KEEPALIVE))
        .tcp_nodelay(true)
        .http2_adaptive_window(true)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
}

/// The gRPC method path of each runtime's `HealthCheck`.
fn health_path(runtime: RuntimeType) -> Option<&'static str> {
    Some(match runtime {
        RuntimeType::Sglang => "/sglang.grpc.scheduler.SglangScheduler/HealthCheck",
        RuntimeType::Vllm => "/vllm.grpc.engine.VllmEngine/HealthCheck",
        RuntimeType::Tokenspeed => "/tokenspeed.grpc.scheduler.TokenSpeedScheduler/HealthCheck",
        RuntimeType::Trtllm => "/trtllm.TrtllmService/HealthCheck",
        RuntimeType::Mlx => "/mlx.grpc.engine.MlxEngine/HealthCheck",
        _ => return None,
    })
}

/// `HealthCheckRequest {}` of every servicer.
#[derive(Clone, PartialEq, prost::Message)]
struct Empty {}

/// TensorRT-LLM's `HealthCheckResponse { string status = 1; }` ("OK" when healthy).
#[derive(Clone, PartialEq, prost::Message)]
struct StatusReply {
    #[prost(string, tag = "1")]
    status: String,
}

/// SGLang's, vLLM's, TokenSpeed's and MLX's `HealthCheckResponse { bool healthy = 1; string
/// message = 2; }` (the field numbers are the same in all four).
#[derive(Clone, PartialEq, prost::Message)]
struct HealthyReply {
    #[prost(bool, tag = "1")]
    healthy: bool,
    #[prost(string, tag = "2")]
    message: String,
}

/// How a servicer answered a `HealthCheck`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HealthAnswer {
    /// The service exists; its verdict.
    Healthy(bool),
    /// UNIMPLEMENTED: the server is up but does not serve this runtime.
    NotThisService,
    /// No answer (transport error, UNAVAILABLE, deadline) or a failure of the call itself.
    Down(String),
}

impl HealthAnswer {
    fn from_status(status: &Status) -> HealthAnswer {
        match status.code() {
            Code::Unimplemented => HealthAnswer::NotThisService,
            // The service is there and says it cannot answer: unhealthy, not absent.
            Code::Internal | Code::FailedPrecondition | Code::ResourceExhausted | Code::Aborted => {
                HealthAnswer::Healthy(false)
            }
            _ => HealthAnswer::Down(format!("{:?}: {}", status.code(), status.message())),
        }
    }
}

/// A worker's control channels, one per worker URL (DP ranks of one engine share it), owned by
/// one background service. Create it inside the service's `start` (its runtime) and call
/// [`ControlChannels::retain`] each round so removed workers' connections close.
#[derive(Default)]
pub struct ControlChannels {
    by_url: Mutex<HashMap<String, Channel>>,
}

impl ControlChannels {
    pub fn new() -> ControlChannels {
        ControlChannels::default()
    }

    /// Drops the channels of workers no longer registered.
    pub fn retain(&self, snap: &Snapshot) {
        let mut map = self.by_url.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|url, _| snap.all.iter().any(|w| &w.address.base_url == url));
    }

    fn channel(&self, w: &Worker) -> Channel {
        let mut map = self.by_url.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(w.address.base_url.clone())
            .or_insert_with(|| endpoint(&w.address, w.socket, w.connect_timeout()).connect_lazy())
            .clone()
    }

    /// A control request: the message, the deadline (also sent as `grpc-timeout`), and the
    /// worker's registered `api_key` as a bearer token, as the HTTP control calls send it.
    fn request<T>(w: &Worker, message: T, timeout: Duration) -> Request<T> {
        let mut req = Request::new(message);
        req.set_timeout(timeout);
        if let Some(key) = &w.spec.api_key {
            if let Ok(v) = MetadataValue::try_from(format!("Bearer {key}")) {
                req.metadata_mut().insert("authorization", v);
            }
        }
        req
    }

    /// One `HealthCheck` against `runtime`'s service.
    pub async fn health_check(
        &self,
        w: &Worker,
        runtime: RuntimeType,
        timeout: Duration,
    ) -> HealthAnswer {
        let Some(path) = health_path(runtime) else {
            return HealthAnswer::NotThisService;
        };
        let call = async {
            let mut grpc = tonic::client::Grpc::new(self.channel(w));
            grpc.ready()
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            let path = PathAndQuery::from_static(path);
            let req = Self::request(w, Empty {}, timeout);
            if runtime == RuntimeType::Trtllm {
                let codec = tonic_prost::ProstCodec::<Empty, StatusReply>::default();
                let reply = grpc.unary(req, path, codec).await?.into_inner();
                Ok(reply.status.trim().eq_ignore_ascii_case("ok"))
            } else {
                let codec = tonic_prost::ProstCodec::<Empty, HealthyReply>::default();
                let reply = grpc.unary(req, path, codec).await?.into_inner();
                if !reply.healthy {
                    log::debug!("worker {} is unhealthy: {}", w.url(), reply.message);
                }
                Ok(reply.healthy)
            }
        };
        match tokio::time::timeout(timeout, call).await {
            Err(_) => HealthAnswer::Down(format!("no answer within {timeout:?}")),
            Ok(Ok(healthy)) => HealthAnswer::Healthy(healthy),
            Ok(Err(status)) => HealthAnswer::from_status(&status),
        }
    }

    /// Which runtime's service answers, and whether it says it is healthy: the declared runtime
    /// first, then SMG's order. `Generic` (with `true`) when the server answers but serves none
    /// of them; `Err` when it does not answer at all.
    pub async fn detect(
        &self,
        w: &Worker,
        timeout: Duration,
    ) -> Result<(RuntimeType, bool), String> {
        let declared = w.spec.runtime_type;
        let order = std::iter::once(declared)
            .filter(|r| health_path(*r).is_some())
            .chain(DETECTION_ORDER.into_iter().filter(|r| *r != declared));
        for runtime in order {
            match self.health_check(w, runtime, timeout).await {
                HealthAnswer::Healthy(ok) => return Ok((runtime, ok)),
                HealthAnswer::NotThisService => continue,
                HealthAnswer::Down(why) => return Err(why),
            }
        }
        Ok((RuntimeType::Generic, true))
    }

    /// A health probe: the detected runtime's `HealthCheck` (healthy flag; no answer is a
    /// failure). Before detection, and for a servicer of no known runtime, detection itself: the
    /// servicer answering at all is what "healthy" can mean for a runtime we cannot ask.
    pub async fn probe(&self, w: &Worker, timeout: Duration) -> bool {
        match w.known_runtime().filter(|_| !w.needs_discovery()) {
            Some(rt) if health_path(rt).is_some() => {
                self.health_check(w, rt, timeout).await == HealthAnswer::Healthy(true)
            }
            _ => matches!(self.detect(w, timeout).await, Ok((_, true))),
        }
    }

    /// Registration: detect the runtime, then read its facts (`GetModelInfo`, `GetServerInfo`,
    /// and for SGLang / TokenSpeed `GetLoads` for the running window). `Err` when the engine
    /// stopped answering halfway: the worker stays unready and is asked again at its next probe.
    pub async fn discover(&self, w: &Worker, timeout: Duration) -> Result<Discovered, String> {
        let (runtime, _) = self.detect(w, timeout).await?;
        let ch = self.channel(w);
        // `GetModelInfo` then `GetServerInfo` on one engine's client (each engine has its own
        // message types, hence a macro rather than a function).
        macro_rules! info {
            ($client:expr, $proto:ident) => {{
                let model_req = Self::request(w, $proto::GetModelInfoRequest {}, timeout);
                let model = call("GetModelInfo", timeout, $client.get_model_info(model_req));
                let model = model.await?;
                let server_req = Self::request(w, $proto::GetServerInfoRequest {}, timeout);
                let server = call(
                    "GetServerInfo",
                    timeout,
                    $client.get_server_info(server_req),
                );
                (model, server.await?)
            }};
        }
        // The running window `GetLoads` reports (only used when the server args carry none).
        macro_rules! window {
            ($client:expr, $request:expr) => {{
                let req = Self::request(w, $request, timeout);
                call("GetLoads", timeout, $client.get_loads(req))
                    .await
                    .ok()
                    .and_then(|l| {
                        facts::window_from_ranks(l.loads.iter().map(|r| r.max_running_requests))
                    })
            }};
        }
        match runtime {
            RuntimeType::Sglang => {
                let mut c = sglang::sglang_scheduler_client::SglangSchedulerClient::new(ch);
                let (model, server) = info!(c, sglang);
                let window = window!(c, sglang_loads_request());
                Ok(facts::sglang(&model, &server, window))
            }
            RuntimeType::Vllm => {
                let mut c = vllm::vllm_engine_client::VllmEngineClient::new(ch);
                let (model, server) = info!(c, vllm);
                Ok(facts::vllm(&model, &server))
            }
            RuntimeType::Tokenspeed => {
                let mut c =
                    tokenspeed::token_speed_scheduler_client::TokenSpeedSchedulerClient::new(ch);
                let (model, server) = info!(c, tokenspeed);
                let window = window!(c, tokenspeed_loads_request());
                Ok(facts::tokenspeed(&model, &server, window))
            }
            // TensorRT-LLM, MLX and unknown servicers: the runtime is the fact that matters (no
            // PD protocol); their info RPCs are not read.
            other => Ok(Discovered {
                runtime: other,
                ..Discovered::default()
            }),
        }
    }

    /// A vLLM worker's KV engine id as its servicer reports it now (after the MultiConnector
    /// unwrapping); `Ok(None)` when it reports none.
    pub async fn engine_id(&self, w: &Worker, timeout: Duration) -> Result<Option<String>, String> {
        let mut c = vllm::vllm_engine_client::VllmEngineClient::new(self.channel(w));
        let req = Self::request(w, vllm::GetServerInfoRequest {}, timeout);
        let server = call("GetServerInfo", timeout, c.get_server_info(req)).await?;
        Ok(
            facts::vllm_kv_transfer(&server.kv_connector, &server.kv_role, &server.kv_engine_id)
                .engine_id,
        )
    }

    /// The engine's `FlushCache` (flush now: fails while requests run, as SMG asks it).
    /// `Err`: why the cache was not flushed.
    pub async fn flush_cache(&self, w: &Worker, timeout: Duration) -> Result<(), String> {
        let ch = self.channel(w);
        let flush = || Self::request(w, common::FlushCacheRequest { timeout_s: 0.0 }, timeout);
        let reply = match w.runtime() {
            RuntimeType::Sglang => {
                let mut c = sglang::sglang_scheduler_client::SglangSchedulerClient::new(ch);
                call("FlushCache", timeout, c.flush_cache(flush())).await?
            }
            RuntimeType::Vllm => {
                let mut c = vllm::vllm_engine_client::VllmEngineClient::new(ch);
                call("FlushCache", timeout, c.flush_cache(flush())).await?
            }
            RuntimeType::Tokenspeed => {
                let mut c =
                    tokenspeed::token_speed_scheduler_client::TokenSpeedSchedulerClient::new(ch);
                call("FlushCache", timeout, c.flush_cache(flush())).await?
            }
            other => return Err(format!("a {} servicer has no FlushCache", other.as_str())),
        };
        if reply.success {
            Ok(())
        } else {
            Err(format!("FlushCache: {}", reply.message))
        }
    }

    /// The engine's `GetLoads`, one row per DP rank; `None` when it does not answer or its
    /// runtime has no load report we read.
    pub async fn loads(&self, w: &Worker, timeout: Duration) -> Option<Vec<RankLoad>> {
        let ch = self.channel(w);
        Some(match w.runtime() {
            RuntimeType::Sglang => {
                let mut c = sglang::sglang_scheduler_client::SglangSchedulerClient::new(ch);
                let req = Self::request(w, sglang_loads_request(), timeout);
                let r = call("GetLoads", timeout, c.get_loads(req)).await.ok()?;
                r.loads.iter().map(sglang_rank).collect()
            }
            RuntimeType::Vllm => {
                let mut c = vllm::vllm_engine_client::VllmEngineClient::new(ch);
                let load_req = vllm::GetLoadsRequest {
                    dp_rank: None,
                    include: sections(),
                };
                let req = Self::request(w, load_req, timeout);
                let r = call("GetLoads", timeout, c.get_loads(req)).await.ok()?;
                r.loads.iter().map(vllm_rank).collect()
            }
            RuntimeType::Tokenspeed => {
                let mut c =
                    tokenspeed::token_speed_scheduler_client::TokenSpeedSchedulerClient::new(ch);
                let req = Self::request(w, tokenspeed_loads_request(), timeout);
                let r = call("GetLoads", timeout, c.get_loads(req)).await.ok()?;
                r.loads.iter().map(tokenspeed_rank).collect()
            }
            _ => return None,
        })
    }
}

/// One unary control RPC under a deadline; the error names the RPC.
async fn call<T>(
    what: &str,
    timeout: Duration,
    rpc: impl std::future::Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, String> {
    match tokio::time::timeout(timeout, rpc).await {
        Err(_) => Err(format!("{what}: no answer within {timeout:?}")),
        Ok(Err(s)) => Err(format!("{what}: {:?}: {}", s.code(), s.message())),
        Ok(Ok(r)) => Ok(r.into_inner()),
    }
}

fn sections() -> Vec<String> {
    LOAD_SECTIONS.iter().map(|s| s.to_string()).collect()
}

fn sglang_loads_request() -> sglang::GetLoadsRequest {
    sglang::GetLoadsRequest {
        dp_rank: None,
        include: sections(),
    }
}

fn tokenspeed_loads_request() -> tokenspeed::GetLoadsRequest {
    tokenspeed::GetLoadsRequest {
        dp_rank: None,
        include: sections(),
    }
}

fn count(n: i32) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn sglang_rank(l: &sglang::SchedulerLoad) -> RankLoad {
    RankLoad {
        dp_rank: l.dp_rank,
        waiting: count(l.num_waiting_reqs),
        running: count(l.num_running_reqs),
        token_usage: l.token_usage,
        waiting_uncached_tokens: count(l.num_waiting_uncached_tokens),
        gen_throughput: l.gen_throughput,
        disagg: l.disaggregation.as_ref().map(|d| DisaggLoad {
            mode: d.mode.clone(),
            prefill_queue: count(d.prefill_prealloc_queue_reqs)
                + count(d.prefill_inflight_queue_reqs),
            decode_queue: count(d.decode_prealloc_queue_reqs)
                + count(d.decode_transfer_queue_reqs)
                + count(d.decode_retracted_queue_reqs),
            kv_transfer_speed_gb_s: d.kv_transfer_speed_gb_s,
            kv_transfer_latency_ms: d.kv_transfer_latency_ms,
        }),
    }
}

fn vllm_rank(l: &vllm::SchedulerLoad) -> RankLoad {
    RankLoad {
        dp_rank: l.dp_rank,
        waiting: count(l.num_waiting_reqs),
        running: count(l.num_running_reqs),
        token_usage: l.token_usage,
        waiting_uncached_tokens: count(l.num_waiting_uncached_tokens),
        gen_throughput: l.gen_throughput,
        disagg: None,
    }
}

fn tokenspeed_rank(l: &tokenspeed::SchedulerLoad) -> RankLoad {
    RankLoad {
        dp_rank: l.dp_rank,
        waiting: count(l.num_waiting_reqs),
        running: count(l.num_running_reqs),
        // Retained prefix cache is reclaimable: the non-evictable share is the real pressure.
        token_usage: l.active_token_usage.unwrap_or(l.token_usage),
        waiting_uncached_tokens: count(l.num_waiting_uncached_tokens),
        gen_throughput: l.gen_throughput,
        disagg: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unimplemented_means_another_runtime() {
        let answer = |code| HealthAnswer::from_status(&Status::new(code, "x"));
        assert_eq!(answer(Code::Unimplemented), HealthAnswer::NotThisService);
        assert_eq!(answer(Code::Internal), HealthAnswer::Healthy(false));
        for down in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Unknown,
            Code::Cancelled,
        ] {
            assert!(matches!(answer(down), HealthAnswer::Down(_)), "{down:?}");
        }
    }

    #[test]
    fn every_known_runtime_has_a_health_method() {
        for rt in DETECTION_ORDER {
            assert!(health_path(rt).is_some(), "{rt:?}");
        }
        assert_eq!(health_path(RuntimeType::Generic), None);
    }
}
