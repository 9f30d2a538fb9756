//! Reading the client's request body for PD routes: bounded in size (413 over the cap, decided
//! from `Content-Length` before reading when possible), bounded in time (408 on a stalled
//! upload), and honouring `Expect: 100-continue` (otherwise curl-like clients stall a second).

use std::future::Future;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use pdgate_filters::errors::ErrorCode;
use pingora::proxy::Session;

use crate::reply::Reply;

/// Why the body could not be read; `Reply` is what to answer, `keepalive` whether the
/// connection can still be reused (not when unread body bytes remain on it).
pub struct BodyRefusal {
    pub reply: Reply,
}

pub async fn read_body(
    session: &mut Session,
    cap: usize,
    timeout: Duration,
) -> Result<Bytes, BodyRefusal> {
    let declared = session
        .req_header()
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(len) = declared {
        if len > cap as u64 {
            session.set_keepalive(None);
            return Err(too_large(cap));
        }
    }
    let expects_continue = session
        .req_header()
        .headers
        .get(http::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if expects_continue {
        if let Err(e) = session.write_continue_response().await {
            session.set_keepalive(None);
            return Err(BodyRefusal {
                reply: Reply::error(
                    ErrorCode::InvalidRequest,
                    format!("writing 100 Continue: {e}"),
                ),
            });
        }
    }

    let deadline = Instant::now() + timeout;
    // Allocated only for a body that arrives in more than one chunk.
    let mut buf = BytesMut::new();
    let mut first: Option<Bytes> = None;
    loop {
        let read = {
            let mut read = std::pin::pin!(session.read_request_body());
            // A chunk already read with the head needs no timer (each costs the runtime's
            // clock and a shared reference count, and a registration once it waits).
            match std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await {
                Poll::Ready(chunk) => Ok(chunk),
                Poll::Pending => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    tokio::time::timeout(left, read).await
                }
            }
        };
        let chunk = match read {
            Err(_) => {
                session.set_keepalive(None);
                return Err(BodyRefusal {
                    reply: Reply::error(
                        ErrorCode::RequestTimeout,
                        format!("request body not received within {}s", timeout.as_secs()),
                    ),
                });
            }
            Ok(Err(e)) => {
                session.set_keepalive(None);
                return Err(BodyRefusal {
                    reply: Reply::error(
                        ErrorCode::InvalidRequest,
                        format!("reading the request body failed: {e}"),
                    ),
                });
            }
            Ok(Ok(None)) => break,
            Ok(Ok(Some(c))) => c,
        };
        let total = buf.len() + first.as_ref().map_or(0, |f| f.len()) + chunk.len();
        if total > cap {
            session.set_keepalive(None);
            return Err(too_large(cap));
        }
        // A body that arrives in one chunk is kept without a copy.
        if first.is_none() && buf.is_empty() {
            first = Some(chunk);
        } else {
            if let Some(f) = first.take() {
                buf.reserve(
                    declared
                        .map_or(8 * 1024, |l| l as usize)
                        .max(f.len() + chunk.len()),
                );
                buf.extend_from_slice(&f);
            }
            buf.extend_from_slice(&chunk);
        }
    }
    Ok(match first {
        Some(f) => f,
        None => buf.freeze(),
    })
}

fn too_large(cap: usize) -> BodyRefusal {
    BodyRefusal {
        reply: Reply::error(
            ErrorCode::PayloadTooLarge,
            format!("request body exceeds the {cap}-byte limit (max_payload_size)"),
        ),
    }
}
