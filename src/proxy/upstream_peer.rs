//! `upstream_peer` and the filters around it, used only by single-leg routes
//! (`/v1/messages/count_tokens`): Pingora's own proxy loop streams the request and response
//! bodies, so nothing is buffered here. The worker was chosen in `request_filter`.

use std::sync::Arc;

use bytes::Bytes;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorType};

use super::ctx::RequestCtx;
use crate::gateway::Gateway;

pub fn single_leg_peer(ctx: &mut RequestCtx) -> pingora::Result<Box<HttpPeer>> {
    match &ctx.single_leg {
        Some((w, _)) => Ok(Box::new(HttpPeer::clone(&w.peer))),
        None => Err(Error::explain(
            ErrorType::InternalError,
            "no upstream chosen for this route",
        )),
    }
}

pub fn prepare_request(upstream: &mut RequestHeader, ctx: &RequestCtx) -> pingora::Result<()> {
    if let Some((w, _)) = &ctx.single_leg {
        upstream.insert_header("host", w.address.authority.as_str())?;
        upstream.insert_header("x-request-id", ctx.engine_request_id())?;
    }
    Ok(())
}

/// Enforces the payload cap and the body deadline on streamed (unbuffered) request bodies: a
/// body still arriving after `body_read_timeout` (a slowloris upload) is refused with 408, as a
/// buffered one is.
pub fn cap_body(
    gw: &Arc<Gateway>,
    body: &mut Option<Bytes>,
    end_of_stream: bool,
    ctx: &mut RequestCtx,
) -> pingora::Result<()> {
    let settings = gw.settings();
    if !end_of_stream && ctx.started.elapsed() > settings.body_read_timeout {
        return Err(Error::explain(
            ErrorType::HTTPStatus(408),
            "request body not received within body_read_timeout_secs",
        ));
    }
    if let Some(b) = body {
        ctx.single_leg_body_bytes += b.len();
        if ctx.single_leg_body_bytes > settings.max_payload_size {
            return Err(Error::explain(
                ErrorType::HTTPStatus(413),
                "request body exceeds max_payload_size",
            ));
        }
    }
    Ok(())
}

pub fn prepare_response(
    upstream: &mut ResponseHeader,
    ctx: &mut RequestCtx,
) -> pingora::Result<()> {
    ctx.status = upstream.status.as_u16();
    ctx.response_started = true;
    upstream.insert_header("x-request-id", ctx.request_id.as_str())?;
    if let Some((w, _)) = &ctx.single_leg {
        upstream.insert_header("x-smg-routed-worker-id", w.url())?;
    }
    super::cors::decorate(ctx.cors.as_ref(), upstream)
}
