//! A complete answer the gateway writes itself (errors, local endpoints, merged bodies), and the
//! one function that writes it. Every reply carries `x-request-id`; gateway errors carry the
//! JSON error body and `X-SMG-Error-Code` from the catalogue in `pdgate_filters::errors`.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use pdgate_filters::errors::{self, render_error, ErrorCode};
use pdgate_filters::Route;
use pingora::proxy::Session;

use crate::head::{self, Head};
use crate::in_box::in_box;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::routes::Endpoint;

pub const JSON: &str = "application/json";
pub const TEXT: &str = "text/plain; charset=utf-8";
pub const SSE: &str = "text/event-stream";

#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    /// `""`: none here (an empty preflight answer; an engine's own is in `headers`).
    pub content_type: &'static str,
    /// Empty for a gateway error until it is sent (see `message`).
    pub body: Bytes,
    /// A gateway error's message: its body is written when it is sent, in the shape its route
    /// speaks (OpenAI's error object, or Anthropic's on the Messages API).
    pub message: Option<Box<str>>,
    /// Gateway error code (header `X-SMG-Error-Code`, metrics, access log).
    pub error_code: Option<&'static str>,
    /// `Retry-After` seconds (overload sheds, admission refusals, `no_available_workers`).
    pub retry_after: Option<u32>,
    /// Whether the attempt loop may retry this outcome with a new pair.
    pub retryable: bool,
    /// Extra headers (e.g. `x-smg-routed-worker-id`, `allow`, an engine's own headers).
    pub headers: Vec<(HeaderName, HeaderValue)>,
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
            content_type: JSON,
            body: Bytes::new(),
            message: Some(message.as_ref().into()),
            error_code: Some(code.as_str()),
            retry_after: code.fixed_retry_after_secs().map(retry_after_secs),
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
            content_type,
            body: body.into(),
            message: None,
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

    /// Adds a header (off the hot path: admin answers, refusals, preflights); a name or value
    /// that cannot be one is left out. The hot path's own headers go through
    /// [`Reply::with_header_value`] with prebuilt names and values.
    pub fn with_header(self, name: &'static str, value: impl AsRef<str>) -> Reply {
        match (
            HeaderName::from_bytes(name.as_bytes()),
            head::value(value.as_ref()),
        ) {
            (Ok(n), Some(v)) => self.with_header_value(n, v),
            _ => {
                log::debug!("reply header {name}: not a header name and value, left out");
                self
            }
        }
    }

    pub fn with_header_value(mut self, name: HeaderName, value: HeaderValue) -> Reply {
        self.headers.push((name, value));
        self
    }

    pub fn with_retry_after(mut self, secs: u64) -> Reply {
        self.retry_after = Some(retry_after_secs(secs));
        self
    }
}

/// `Retry-After` seconds as a reply keeps them (32 bits: a reply stays small enough to be an
/// `Err` by value); no configuration comes near the cap.
fn retry_after_secs(secs: u64) -> u32 {
    u32::try_from(secs).unwrap_or(u32::MAX)
}

/// A gateway error's body in its route's shape: Anthropic's on the Messages API routes (as
/// SMG 1.13.0 answers them), OpenAI's error object everywhere else.
fn error_body(status: u16, code: &str, message: &str, ctx: &RequestCtx) -> Bytes {
    let body = match ctx.endpoint {
        Some(Endpoint::Pd(Route::Messages) | Endpoint::CountTokens) => {
            errors::render_anthropic_error(status, message, &ctx.request_id)
        }
        _ => render_error(status, code, message),
    };
    Bytes::from(body)
}

/// Writes `reply` as the whole response. The connection stays reusable.
pub async fn send(
    session: &mut Session,
    ctx: &mut RequestCtx,
    reply: Reply,
) -> pingora::Result<()> {
    // Boxed: a request future that may answer here carries this state for its whole life
    // otherwise (Pingora's header and body writes), an open stream included.
    in_box(|| send_now(session, ctx, reply)).await
}

async fn send_now(
    session: &mut Session,
    ctx: &mut RequestCtx,
    mut reply: Reply,
) -> pingora::Result<()> {
    if let (Some(message), Some(code)) = (reply.message.take(), reply.error_code) {
        reply.body = error_body(reply.status, code, &message, ctx);
    }
    let mut h = Head::new(reply.status, 5 + reply.headers.len())?;
    if !reply.content_type.is_empty() {
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static(reply.content_type),
        );
    }
    h.insert(
        http::header::CONTENT_LENGTH,
        head::number(reply.body.len() as u64),
    );
    if let Some(code) = reply.error_code {
        // Codes are ASCII from the catalogue; SMG's one code with spaces is still a valid value.
        h.insert(head::X_SMG_ERROR_CODE, HeaderValue::from_static(code));
    }
    if let Some(secs) = reply.retry_after {
        h.insert(http::header::RETRY_AFTER, head::number(u64::from(secs)));
    }
    for (name, value) in reply.headers {
        h.append(name, value);
    }
    h.request_id(&ctx.request_id);
    let mut h = h.finish();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_that_cannot_be_written_are_left_out_never_a_panic() {
        let r = Reply::text(200, "ok")
            .with_header("Location", "/workers/1")
            .with_header("allow", "GET, POST")
            .with_header("x-bad", "a\nb")
            .with_header("bad name", "v");
        let names: Vec<_> = r.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["location", "allow"]);
        assert_eq!(r.headers[0].1, "/workers/1");
    }
}
