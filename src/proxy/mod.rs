//! The `ProxyHttp` implementation: a thin dispatcher, one file per phase. Reading this module
//! top to bottom is the life of a request:
//!
//! 1. `request_filter` — route, auth, local answers; PD routes read the body and run the legs
//!    (`crate::legs`), writing the response themselves.
//! 2. `upstream_peer` — only for single-leg routes (count_tokens), proxied by Pingora's own loop.
//! 3. `fail_to_proxy` — a JSON error body, unless the response had already started.
//! 4. `logging` — access log line and metrics, for every request; the end of its trace span.
//!
//! Why PD legs are not run through Pingora's proxy loop: see `docs/architecture.md` (a body
//! read in `request_filter` is replayed upstream only up to 64 KiB on 0.9.1, and a piped
//! subrequest with a preset body never notices the client hanging up).

pub mod body;
pub mod cors;
pub mod ctx;
pub mod logging;
pub mod request_filter;
pub mod routes;
pub mod upstream_peer;

use std::sync::Arc;

use async_trait::async_trait;
use pdgate_filters::errors::ErrorCode;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::modules::http::HttpModules;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorSource, ErrorType};

use crate::gateway::Gateway;
use crate::reply::{self, Reply};
use ctx::RequestCtx;

/// Which routes a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    /// The serving port: PD routes, health, and (unless a separate admin listener exists) the
    /// worker API.
    Data,
    /// The separate admin listener: health and the worker API only.
    Admin,
    /// The dedicated probe listener (`health_check_port`): `/liveness`, `/readiness` and
    /// `/health` only, on a runtime of its own so that probes are answered while the serving
    /// runtime is busy.
    Probes,
}

pub struct PdGateway {
    pub gw: Arc<Gateway>,
    pub listener: Listener,
}

#[async_trait]
impl ProxyHttp for PdGateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::new()
    }

    /// No downstream modules. Pingora's default adds its response compression, disabled (level
    /// 0), which still builds a context for every request (four allocations) and passes each
    /// response head and body piece through its filters. pdgate does not compress answers (nor
    /// does SMG): engines' JSON and SSE go to the client as they came.
    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<bool> {
        request_filter::run(&self.gw, self.listener, session, ctx).await
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<Box<HttpPeer>> {
        upstream_peer::single_leg_peer(ctx)
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        upstream_peer::prepare_request(upstream, ctx)
    }

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        upstream_peer::cap_body(&self.gw, body, end_of_stream, ctx)
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        upstream: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        crate::drain::DRAIN.close_if_draining(session);
        upstream_peer::prepare_response(upstream, ctx)
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        // After the head went out the status cannot change: the connection is just closed.
        if ctx.response_started || ctx.client_gone {
            return FailToProxy {
                error_code: ctx.status,
                can_reuse_downstream: false,
            };
        }
        let reply = match (e.esource(), e.etype()) {
            (_, ErrorType::HTTPStatus(413)) => Reply::error(
                ErrorCode::PayloadTooLarge,
                "request body exceeds max_payload_size",
            ),
            (_, ErrorType::HTTPStatus(408))
            | (ErrorSource::Downstream, ErrorType::ReadTimedout) => Reply::error(
                ErrorCode::RequestTimeout,
                "request body not received within body_read_timeout_secs",
            ),
            // The details (peer addresses) go to the log, not to the client.
            (ErrorSource::Upstream, ErrorType::ConnectTimedout | ErrorType::ReadTimedout) => {
                Reply::error(ErrorCode::Timeout, "the upstream worker timed out")
            }
            (ErrorSource::Upstream, _) => Reply::error(
                ErrorCode::PdRequestFailed,
                "Transport error: the upstream worker connection failed",
            ),
            (ErrorSource::Downstream, _) => {
                Reply::error(ErrorCode::InvalidRequest, "the request could not be read")
            }
            _ => Reply::error(ErrorCode::InternalError, "internal error"),
        };
        let status = reply.status;
        session.set_keepalive(None);
        let _ = reply::send(session, ctx, reply).await;
        FailToProxy {
            error_code: status,
            can_reuse_downstream: false,
        }
    }

    fn suppress_error_log(&self, _session: &Session, ctx: &RequestCtx, _e: &Error) -> bool {
        // A client hanging up is routine; the access log line records it.
        ctx.client_gone
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut RequestCtx) {
        logging::record(&self.gw, session, e, ctx);
        crate::trace::end_request(ctx, e);
    }
}
