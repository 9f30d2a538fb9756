//! Relaying the decode leg back to the client: chunk by chunk as it arrives (SSE with chunked
//! framing), or the engine's JSON as sent, with the prefill's prompt logprobs merged in front
//! when the client asked for logprobs. Watches for the client hanging up the whole time.

use std::future::Future;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::HeaderValue;
use pdgate_filters::logprobs::{merge_event, merge_json, PrefillLogprobs};
use pdgate_filters::sse::{DoneDetector, SseSplitter};
use pingora::http::ResponseHeader;
use pingora::protocols::http::ServerSession;
use pingora::proxy::Session;

use super::client::{LegError, LegErrorKind, OpenLeg};
use super::dispatch::Attempt;
use super::parallel::PdLabels;
use super::prefill::{Abandoning, PrefillLeg};
use crate::gateway::Gateway;
use crate::head::{self, Head};
use crate::in_box::in_box;
use crate::metrics::METRICS;
use crate::proxy::ctx::RequestCtx;
use crate::reply::{self, Reply, JSON, SSE};
use crate::workers::select::Pair;
use crate::workers::Worker;
use pdgate_filters::errors::{render_error, ErrorCode};

/// Headers never copied from an engine response to the client.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "x-request-id",
    "x-smg-routed-worker-id",
];

/// After `data: [DONE]`, how long we wait for the engine to end its body before we end the
/// client's response ourselves.
pub const AFTER_DONE_GRACE: Duration = Duration::from_secs(2);

/// How a relay ended.
pub enum RelayEnd {
    /// The whole response went to the client.
    Complete,
    /// The client went away; the decode leg was dropped.
    ClientGone,
    /// A stream failed or ran out of time after its head: it ended with an SSE error event
    /// (the status was already sent), and the decode leg was dropped.
    StreamError(String),
    /// A non-streamed decode body failed before anything went to the client: answer this
    /// (the attempt may be retried).
    NotSent(Reply),
    /// The prefill failed before the decode produced anything; the gateway dropped the decode
    /// (which is not to blame). `Some`: the answer to send (nothing went out yet); `None`: a
    /// stream that already ended with an error event.
    PrefillFailed(Option<Reply>),
}

pub struct RelayPlan<'a> {
    pub streaming: bool,
    /// `Some` when the client asked for logprobs (the value: the prefill's, if it had any).
    pub logprobs: Option<Option<&'a PrefillLogprobs>>,
    /// When the prefill was dispatched (TTFT origin).
    pub dispatched: Instant,
    /// The decode worker (its URL is `x-smg-routed-worker-id`).
    pub decode: &'a Worker,
    pub body_limit: usize,
    pub stall_timeout: Duration,
    /// The request's total deadline (`request_timeout_secs`), streams included.
    pub deadline: Instant,
    /// A parallel prefill still draining (detached), driven by the relay: if it fails before
    /// the decode produced output, the decode cannot get its KV and the request ends with an
    /// error.
    pub prefill: Option<PrefillLeg>,
    /// Read the answer's cached-token report into `ctx.kv_verdict` (vLLM decodes: their
    /// `cached_tokens` count the KV the connector loaded; SGLang's do not).
    pub read_cache_report: bool,
}

/// The head of a streamed answer, built from the decode's: its status and headers minus
/// hop-by-hop ones and its framing, as `text/event-stream` with chunked framing (Pingora's H1
/// writer flushes every chunk then).
pub fn stream_head(
    decode: &ResponseHeader,
    status: u16,
    ctx: &RequestCtx,
    decode_worker: &Worker,
) -> pingora::Result<ResponseHeader> {
    // Sized to what it holds: the head stays in the session for the whole stream.
    let relayed = |name: &http::header::HeaderName| {
        let n = name.as_str();
        !HOP_BY_HOP.contains(&n)
            && !matches!(n, "content-length" | "content-type" | "cache-control")
    };
    let copied = decode.headers.keys().filter(|n| relayed(n)).count();
    let mut h = Head::new(status, 5 + copied)?;
    for (name, value) in decode.headers.iter() {
        if relayed(name) {
            h.append(name.clone(), value.clone());
        }
    }
    stream_headers(&mut h, ctx, decode_worker);
    Ok(h.finish())
}

/// The headers every streamed answer carries (the HTTP relay's and the gRPC one's).
pub fn stream_headers(h: &mut Head, ctx: &RequestCtx, decode: &Worker) {
    h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(SSE));
    h.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    h.insert(
        http::header::TRANSFER_ENCODING,
        HeaderValue::from_static("chunked"),
    );
    if let Some(v) = decode.url_value() {
        h.insert(head::X_SMG_ROUTED_WORKER_ID, v);
    }
    h.request_id(&ctx.request_id);
}

/// `reply` with `x-smg-routed-worker-id`: the decode that answered.
pub fn routed_to(reply: Reply, decode: &Worker) -> Reply {
    match decode.url_value() {
        Some(v) => reply.with_header_value(head::X_SMG_ROUTED_WORKER_ID, v),
        None => reply,
    }
}

/// Sends a stream's head: from here on the request can no longer be retried. `more`: the first
/// piece is already in hand and written next, so the head waits for it (one client write, see
/// [`write_piece`]). `Err`: the client is gone.
pub async fn start_stream(
    session: &mut Session,
    ctx: &mut RequestCtx,
    head: ResponseHeader,
    status: u16,
    more: bool,
) -> Result<(), ()> {
    ctx.status = status;
    ctx.response_started = true;
    crate::drain::DRAIN.close_if_draining(session);
    let mut head = head;
    if crate::proxy::cors::decorate(ctx.cors.as_ref(), &mut head).is_err() {
        return Err(());
    }
    crate::gather::hold(session, more);
    session
        .write_response_header(Box::new(head), false)
        .await
        .map_err(|_| ())
}

/// Sends the decode response: a stream chunk by chunk (the head goes out first; from then on
/// the request can no longer be retried), a non-streamed answer whole.
///
/// Not an `async fn`: one keeps a copy of its by-value arguments beside the locals they move into
/// (rust-lang/rust#62958), here the leg and the plan (~520 bytes) for the life of the stream. The
/// `async move` block uses the captured arguments in place.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn copies its arguments (above)"
)]
pub fn relay<'a>(
    session: &'a mut Session,
    ctx: &'a mut RequestCtx,
    mut leg: OpenLeg,
    mut plan: RelayPlan<'a>,
) -> impl Future<Output = (RelayEnd, Option<OpenLeg>)> + Send + 'a {
    async move {
        leg.set_read_timeout(Some(plan.stall_timeout));
        let status = leg.status();
        let mut prefill = Abandoning(plan.prefill.take());
        // The one-shot steps are boxed where awaited: this future lives as long as the stream, and
        // inline each would size it (see "Memory per open stream" in bench/README.md).
        if !plan.streaming {
            return in_box(|| relay_whole(session, ctx, leg, &mut plan, &mut prefill.0, status))
                .await;
        }
        let head = match stream_head(leg.head(), status, ctx, plan.decode) {
            Ok(h) => h,
            Err(e) => {
                return (
                    RelayEnd::NotSent(Reply::error(ErrorCode::InternalError, e.to_string())),
                    None,
                )
            }
        };
        // The client's head is built: the engine's is not needed again.
        leg.shed_head();
        let mut merge = match plan.logprobs {
            Some(Some(lp)) => Some((lp, SseSplitter::new())),
            _ => None,
        };
        // A piece already in hand (a burst that came with the engine's head) leaves in the same
        // client write as the head: the head's flush is held (`crate::gather`). Only pieces
        // relayed as they are (no logprobs merge) are looked ahead: each is then non-empty, so
        // a held flush is always followed by a write.
        let look_ahead = merge.is_none();
        let mut in_hand = look_ahead.then(|| leg.piece_in_hand()).flatten();
        if in_hand.is_some() {
            // Output is already here, so the KV arrived: the prefill drains to its end.
            prefill.mute();
        }
        if Box::pin(start_stream(session, ctx, head, status, in_hand.is_some()))
            .await
            .is_err()
        {
            return (RelayEnd::ClientGone, None);
        }
        let mut done = DoneDetector::new();
        let mut saw_done = false;
        // One timer for the stream's deadline, not one registered and dropped per chunk.
        let deadline = tokio::time::sleep_until(tokio::time::Instant::from_std(plan.deadline));
        tokio::pin!(deadline);
        loop {
            let next = match in_hand.take() {
                Some(next) => next,
                None => tokio::select! {
                c = leg.next_chunk() => c,
                _ = session.read_body_or_idle(true) => {
                    return (RelayEnd::ClientGone, None);
                }
                _ = &mut deadline => Err(LegError {
                    kind: LegErrorKind::Timeout,
                    detail: "the request ran past request_timeout_secs".into(),
                }),
                _ = prefill_failed(&mut prefill.0) => {
                    let e = LegError {
                        kind: LegErrorKind::Body,
                        detail: "the prefill leg failed before the KV was handed over".into(),
                    };
                    return match Box::pin(end_stream_with_error(session, ctx, &e)).await {
                        RelayEnd::ClientGone => (RelayEnd::ClientGone, None),
                        _ => (RelayEnd::PrefillFailed(None), None),
                    };
                }
                },
            };
            let chunk = match next {
                Ok(Some(c)) => c,
                Ok(None) => break,
                // The engine did not end its body after `[DONE]`: the answer is complete.
                Err(_) if saw_done => {
                    if let Some(span) = leg.trace_mut() {
                        span.complete();
                    }
                    break;
                }
                Err(e) => {
                    return (
                        Box::pin(end_stream_with_error(session, ctx, &e)).await,
                        None,
                    )
                }
            };
            if !saw_done && done.feed(&chunk) {
                saw_done = true;
                leg.set_read_timeout(Some(AFTER_DONE_GRACE));
            }
            let out = match merge.as_mut() {
                Some((lp, splitter)) => merge_chunk(splitter, &chunk, lp),
                None => chunk,
            };
            if out.is_empty() {
                continue;
            }
            // Output means the KV arrived: the prefill's fate no longer matters (it is still
            // driven to its end, and drains if the relay ends first).
            prefill.mute();
            if ctx.ttft.is_none() {
                ctx.ttft = Some(plan.dispatched.elapsed());
            }
            // The next piece (or the end) already here: this one waits for it in the buffer.
            in_hand = look_ahead.then(|| leg.piece_in_hand()).flatten();
            if write_piece(session, Some(out), in_hand.is_some())
                .await
                .is_err()
            {
                return (RelayEnd::ClientGone, None);
            }
        }
        let rest = merge
            .as_mut()
            .and_then(|(_, splitter)| splitter.finish())
            .map(Bytes::from);
        if write_last(session, rest).await.is_err() {
            return (RelayEnd::ClientGone, None);
        }
        let reusable = leg.is_done();
        prefill.mute();
        (RelayEnd::Complete, reusable.then_some(leg))
    }
}

/// Writes a piece of a streamed answer to the client, `None` ending it (every streamed
/// answer's writes go through here). The client's session
/// is Pingora's HTTP/1 one (`drain::DrainingApp` makes no other), and its write is awaited
/// directly: the proxy `Session`'s write is sized for every kind of session (768 bytes against
/// 320), and the relay holds it for the life of the stream. Same steps as that write: the
/// downstream modules' body filter, then the session's write.
///
/// `more`: the caller writes its next piece at once (it is already in hand), so this one's flush
/// is held and both leave in one client write (`crate::gather`); otherwise this write, and
/// whatever was held before it, goes out now. The end of an answer always goes out.
pub async fn write_piece(
    session: &mut Session,
    piece: Option<Bytes>,
    more: bool,
) -> pingora::Result<()> {
    let end = piece.is_none();
    crate::gather::hold(session, more && !end);
    let mut body = piece;
    session
        .downstream_modules_ctx
        .response_body_filter(&mut body, end)?;
    let data = body.unwrap_or_default();
    match session.as_downstream_mut() {
        ServerSession::H1(h1) => {
            if !data.is_empty() {
                h1.write_body(&data).await?;
            }
            if end {
                h1.finish_body().await?;
            }
            Ok(())
        }
        other => Box::pin(other.write_response_body(data, end)).await,
    }
}

/// Writes the last piece of a streamed answer (if any) and its end in one client write.
pub async fn write_last(session: &mut Session, last: Option<Bytes>) -> pingora::Result<()> {
    if let Some(piece) = last.filter(|p| !p.is_empty()) {
        write_piece(session, Some(piece), true).await?;
    }
    write_piece(session, None, false).await
}

/// A stream that cannot go on: one SSE error event (the gateway's error body: `timeout` for a
/// stalled or over-long stream, `decode_request_failed` for a broken one), then the end of the
/// chunked body, so SSE clients see why and HTTP clients a complete response.
pub async fn end_stream_with_error(
    session: &mut Session,
    ctx: &mut RequestCtx,
    e: &LegError,
) -> RelayEnd {
    let (status, code) = match e.kind {
        LegErrorKind::Timeout => (504, ErrorCode::Timeout),
        _ => (502, ErrorCode::DecodeRequestFailed),
    };
    let message = format!("the decode stream failed: {e}");
    let mut event = Vec::with_capacity(message.len() + 96);
    event.extend_from_slice(b"data: ");
    event.extend_from_slice(&render_error(status, code.as_str(), &message));
    event.extend_from_slice(b"\n\n");
    ctx.error_code = Some(code.as_str());
    if write_last(session, Some(Bytes::from(event))).await.is_err() {
        return RelayEnd::ClientGone;
    }
    RelayEnd::StreamError(message)
}

/// Drives the held prefill; resolves when it failed unmuted, never when there is none.
pub async fn prefill_failed(prefill: &mut Option<PrefillLeg>) {
    match prefill {
        Some(w) => w.failed().await,
        None => std::future::pending().await,
    }
}

/// Splits SSE events out of a decode chunk and merges the prefill logprobs into each.
fn merge_chunk(splitter: &mut SseSplitter, chunk: &[u8], lp: &PrefillLogprobs) -> Bytes {
    let mut events = Vec::new();
    splitter.push(chunk, &mut events);
    let mut out = BytesMut::new();
    for ev in events {
        match merge_event(&ev, lp) {
            Some(merged) => out.extend_from_slice(&merged),
            None => out.extend_from_slice(&ev),
        }
    }
    out.freeze()
}

/// A non-streamed answer: the decode body is read whole (bounded, with the client watched and
/// the total deadline) before anything goes out, so a decode that breaks mid-body is a clean 502
/// or 504 (and may be retried) rather than a truncated 200. With logprobs the gateway builds the
/// body (merged, or the decode body as is when the prefill had nothing to merge) as
/// `application/json`; otherwise the engine's body and headers are relayed as sent.
async fn relay_whole(
    session: &mut Session,
    ctx: &mut RequestCtx,
    mut leg: OpenLeg,
    plan: &mut RelayPlan<'_>,
    prefill: &mut Option<PrefillLeg>,
    status: u16,
) -> (RelayEnd, Option<OpenLeg>) {
    let deadline = tokio::time::Instant::from_std(plan.deadline);
    // Biased, the body first: a body already read with the head (the usual short answer) is
    // taken without polling the client's connection or registering the deadline's timer.
    let body = tokio::select! {
        biased;
        b = leg.read_to_end(plan.body_limit) => b,
        _ = session.read_body_or_idle(true) => return (RelayEnd::ClientGone, None),
        _ = tokio::time::sleep_until(deadline) => Err(LegError {
            kind: LegErrorKind::Timeout,
            detail: "the request ran past request_timeout_secs".into(),
        }),
        _ = prefill_failed(prefill) => {
            return (RelayEnd::PrefillFailed(Some(super::parallel::prefill_failed_after_head())), None);
        }
    };
    let body = match body {
        Ok(b) => b,
        Err(e) => return (RelayEnd::NotSent(unread_answer(&e)), None),
    };
    // The decode's whole answer is in, so its KV arrived: the prefill drains to its end,
    // whatever happens to the answer's delivery.
    if let Some(p) = prefill.as_mut() {
        p.mute();
    }
    if plan.read_cache_report && (200..300).contains(&status) {
        if let Some(r) = pdgate_filters::usage::prompt_cache_report(&body) {
            ctx.kv_verdict = ctx.kv_verdict.with_report(r.prompt_tokens, r.cached_tokens);
        }
    }
    let reply = match plan.logprobs {
        Some(lp) => {
            let merged = lp.and_then(|lp| merge_json(&body, lp)).map(Bytes::from);
            Reply::body(status, JSON, merged.unwrap_or(body))
        }
        None => {
            let mut r = Reply::body(status, JSON, body);
            let head = leg.head();
            // The engine's content type, when it sent one, goes with its other headers.
            if head.headers.contains_key(http::header::CONTENT_TYPE) {
                r.content_type = "";
            }
            for (name, value) in head.headers.iter() {
                let n = name.as_str();
                if !HOP_BY_HOP.contains(&n) && !matches!(n, "content-length" | "date" | "server") {
                    r.headers.push((name.clone(), value.clone()));
                }
            }
            r
        }
    };
    let reply = routed_to(reply, plan.decode);
    if ctx.ttft.is_none() {
        ctx.ttft = Some(plan.dispatched.elapsed());
    }
    match reply::send(session, ctx, reply).await {
        Ok(()) => (RelayEnd::Complete, Some(leg)),
        Err(_) => (RelayEnd::ClientGone, None),
    }
}

/// The answer when a non-streamed decode body could not be read whole (nothing went to the
/// client, so the attempt may be retried): 504 `timeout` or 500 `read_response_failed`.
pub fn unread_answer(e: &LegError) -> Reply {
    let reply = if e.kind == LegErrorKind::Timeout {
        Reply::error(
            ErrorCode::Timeout,
            format!("the decode answer did not complete: {e}"),
        )
    } else {
        Reply::error(
            ErrorCode::ReadResponseFailed,
            format!("Failed to read response: {e}"),
        )
    };
    reply.retryable(true)
}

/// Relays the decode leg of `pair` to the client (any dispatch mode) and accounts for it: the
/// decode's breaker outcome, the PD TTFT, and the pooled connection when it ended cleanly.
///
/// Not an `async fn`, for the reason given at [`relay`].
#[allow(clippy::manual_async_fn, reason = "an async fn copies its arguments")]
pub fn relay_decode<'a>(
    gw: &'a Gateway,
    session: &'a mut Session,
    ctx: &'a mut RequestCtx,
    pair: &'a Pair,
    decode: OpenLeg,
    plan: RelayPlan<'a>,
    labels: &'a PdLabels,
) -> impl Future<Output = Attempt> + Send + 'a {
    async move {
        let status = decode.status();
        // Boxed for the same reason as the attempts in `dispatch` (futures nest by value).
        let (end, reusable) = in_box(|| relay(session, ctx, decode, plan)).await;
        match &end {
            RelayEnd::Complete => pair.decode.record_leg(Some(status)),
            RelayEnd::StreamError(_) | RelayEnd::NotSent(_) => pair.decode.record_leg(None),
            // The gateway dropped the leg: it says nothing about the engine.
            RelayEnd::ClientGone | RelayEnd::PrefillFailed(_) => {}
        }
        if let Some(ttft) = ctx.ttft {
            METRICS
                .pd_ttft
                .with(&labels.as_array(), |m| m.observe(ttft.as_secs_f64()));
        }
        // Boxed: short-lived, and this future is held by the attempt for the stream's life.
        // The leg is handed over unmatched, so no room is kept for it here.
        in_box(|| release(gw, reusable, pair)).await;
        match end {
            RelayEnd::Complete => Attempt::Answered,
            RelayEnd::ClientGone => Attempt::ClientGone,
            RelayEnd::StreamError(why) => Attempt::EndedWithError(why),
            RelayEnd::NotSent(reply) | RelayEnd::PrefillFailed(Some(reply)) => {
                Attempt::Refused(reply)
            }
            RelayEnd::PrefillFailed(None) => Attempt::EndedWithError(
                "the prefill leg failed before the KV was handed over".into(),
            ),
        }
    }
}

/// Gives a decode connection that ended cleanly back to the pool.
async fn release(gw: &Gateway, leg: Option<OpenLeg>, pair: &Pair) {
    if let Some(leg) = leg {
        gw.client.release(leg, &pair.decode.peer).await;
    }
}
