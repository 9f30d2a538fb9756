//! A complete answer the gateway writes itself (errors, local endpoints, merged bodies), and the
//! one function that writes it. Every reply carries `x-request-id`; gateway errors carry the
//! JSON error body and `X-SMG-Error-Code` from the catalogue in `pdgate_filters::errors`.

use std::borrow::Cow;

use bytes::Bytes;
use pdgate_filters::errors::{render_error, ErrorCode};
use pingora::http::ResponseHeader;
use pingora::proxy::Session;

use crate::proxy::ctx::RequestCtx;

pub const JSON: &str = "application/json";
pub const TEXT: &str = "text/plain; charset=utf-8";
pub const SSE: &str = "text/event-stream";

#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub content_type: Cow<'static, str>,
    pub body: Bytes,
    /// Gateway error code (header `X-SMG-Error-Code`, metrics, access log).
    pub error_code: Option<&'static str>,
    /// `Retry-After` seconds (overload sheds).
    pub retry_after: Option<u64>,
    /// Whether the attempt loop may retry this outcome with a new pair.
    pub retryable: bool,
    /// Extra headers (e.g. `x-smg-routed-worker-id`, `allow`, an engine's own headers).
    pub headers: Vec<(Cow<'static, str>, String)>,
}

impl Reply {
    /// A gateway error with the code's default status.
    pub fn error(code: ErrorCode, message: impl AsRef<str>) -> Reply {
        Reply::error_with_status(code.status(), code, message)
    }

    /// A gateway error with an explicit status (passthrough codes such as `prefill_upstream_error`).
    pub fn error_with_status(status: u16, code: ErrorCode, message: impl AsRef<str>) -> Reply {
        Reply {
            status,
            content_type: Cow::Borrowed(JSON),
            body: Bytes::from(render_error(status, code.as_str(), message.as_ref())),
            error_code: Some(code.as_str()),
            retry_after: None,
            retryable: false,
            headers: Vec::new(),
        }
    }

    pub fn json(status: u16, body: impl Into<Bytes>) -> Reply {
        Reply::body(status, JSON, body)
    }

    pub fn text(status: u16, body: impl Into<Bytes>) -> Reply {
        Reply::body(status, TEXT, body)
    }

    pub fn body(status: u16, content_type: &'static str, body: impl Into<Bytes>) -> Reply {
        Reply {
            status,
            content_type: Cow::Borrowed(content_type),
            body: body.into(),
            error_code: None,
            retry_after: None,
            retryable: false,
            headers: Vec::new(),
        }
    }

    pub fn retryable(mut self, yes: bool) -> Reply {
        self.retryable = yes;
        self
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.push((Cow::Borrowed(name), value.into()));
        self
    }

    pub fn with_retry_after(mut self, secs: u64) -> Reply {
        self.retry_after = Some(secs);
        self
    }
}

/// Writes `reply` as the whole response. The connection stays reusable.
pub async fn send(
    session: &mut Session,
    ctx: &mut RequestCtx,
    reply: Reply,
) -> pingora::Result<()> {
    // Boxed: a request future that may answer here carries this state for its whole life
    // otherwise (Pingora's header and body writes), an open stream included.
    Box::pin(send_now(session, ctx, reply)).await
}

async fn send_now(
    session: &mut Session,
    ctx: &mut RequestCtx,
    reply: Reply,
) -> pingora::Result<()> {
    let mut h = ResponseHeader::build(reply.status, Some(5 + reply.headers.len()))?;
    if !reply.content_type.is_empty() {
        h.insert_header("content-type", reply.content_type.as_ref())?;
    }
    h.insert_header("content-length", reply.body.len())?;
    if let Some(code) = reply.error_code {
        // Codes are ASCII from the catalogue; SMG's one code with spaces is still a valid value.
        h.insert_header("x-smg-error-code", code)?;
    }
    if let Some(secs) = reply.retry_after {
        h.insert_header("retry-after", secs)?;
    }
    for (name, value) in &reply.headers {
        h.append_header(name.to_string(), value.as_str())?;
    }
    if !ctx.request_id.is_empty() {
        h.insert_header("x-request-id", ctx.request_id.as_str())?;
    }
    crate::proxy::cors::decorate(ctx.cors.as_ref(), &mut h)?;
    ctx.status = reply.status;
    ctx.error_code = reply.error_code;
    ctx.response_started = true;
    let head_only = session.req_header().method == http::Method::HEAD;
    crate::drain::DRAIN.close_if_draining(session);
    session.write_response_header(Box::new(h), false).await?;
    let body = if head_only { Bytes::new() } else { reply.body };
    session.write_response_body(Some(body), true).await
}
