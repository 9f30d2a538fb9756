//! Relaying a gRPC decode leg to the client: token ids → the stop decoder
//! (`pdgate-tokenize`: incremental detokenization, stop ids, stop strings withheld until they
//! can no longer match) → the route's response writer (`pdgate-convert`) → the client, as SSE
//! chunk by chunk or one JSON body. Usage comes from the decode's counts (digest §2.16).
//!
//! A router-side stop (a stop string SGLang could not take, or any stop the engine missed)
//! ends the choice at once; the decode is then dropped, which aborts it on the engine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pdgate_convert::{
    response_writer, ChoiceUsage, Delta, Finish, FinishReason, MatchedStop, ResponseSpec,
    ResponseWriter, StreamFailure, TokenLogprob, TopLogprob,
};
use pdgate_filters::errors::{grpc_status_to_http, ErrorCode};
use pdgate_tokenize::{MatchedStop as RouterStop, StopConfig, StopDecoder, Tokenizer};
use pingora::http::ResponseHeader;
use pingora::proxy::Session;

use super::engine::{EngineStop, Message, OutputLogprobs};
use super::leg::GrpcLeg;
use super::prepare::Prepared;
use crate::legs::dispatch::Attempt;
use crate::legs::parallel::PdLabels;
use crate::metrics::METRICS;
use crate::proxy::ctx::RequestCtx;
use crate::reply::{self, Reply, JSON, SSE};

pub struct RelayPlan<'a> {
    pub prepared: &'a Prepared,
    /// The decode was asked to stream chunks (the client's `stream`).
    pub streaming: bool,
    /// Prefill dispatch (TTFT origin).
    pub dispatched: Instant,
    pub decode_url: &'a str,
    /// Longest silence between two messages of a stream.
    pub stall_timeout: Duration,
    /// The request's total deadline.
    pub deadline: Instant,
    pub labels: &'a PdLabels,
}

/// Relays `decode` (already open: its first message is ready) and records its outcome.
pub async fn relay(
    session: &mut Session,
    ctx: &mut RequestCtx,
    decode: &mut GrpcLeg,
    plan: RelayPlan<'_>,
) -> Attempt {
    let p = plan.prepared;
    let mut out = Output::new(p, ctx, &plan);
    let deadline = tokio::time::Instant::from_std(plan.deadline);
    let mut head_sent = false;
    if plan.streaming {
        if let Err(end) = out.send_head(session, ctx, plan.decode_url).await {
            return end;
        }
        head_sent = true;
    }
    loop {
        let stall = if plan.streaming {
            tokio::time::Instant::now() + plan.stall_timeout
        } else {
            deadline
        };
        let next = tokio::select! {
            m = decode.next() => m,
            _ = session.read_body_or_idle(true) => return Attempt::ClientGone,
            _ = tokio::time::sleep_until(stall.min(deadline)) => {
                decode.worker.record_leg(None);
                let why = if tokio::time::Instant::now() >= deadline {
                    "the request ran past request_timeout_secs"
                } else {
                    "the decode stream stalled past stream_idle_timeout_secs"
                };
                return out.fail(session, ctx, head_sent, ErrorCode::Timeout, why).await;
            }
        };
        match next {
            Ok(Some(Message::Chunk(c))) => {
                out.chunk(
                    &c.token_ids,
                    c.prompt_tokens,
                    c.cached_tokens,
                    c.logprobs.as_ref(),
                );
            }
            Ok(Some(Message::Complete(c))) => {
                if !plan.streaming {
                    // Not streamed: the complete carries every output id.
                    out.chunk(
                        &c.output_ids,
                        c.prompt_tokens,
                        c.cached_tokens,
                        c.logprobs.as_ref(),
                    );
                }
                out.complete(
                    &c.finish_reason,
                    c.matched.as_ref(),
                    c.prompt_tokens,
                    c.completion_tokens,
                    c.cached_tokens,
                );
            }
            Ok(None) => {
                if !out.finished {
                    decode.worker.record_leg(None);
                    return out
                        .fail(
                            session,
                            ctx,
                            head_sent,
                            ErrorCode::WorkerStreamFailed,
                            "the decode stream ended before its last message",
                        )
                        .await;
                }
            }
            Err(status) => {
                let http = grpc_status_to_http(status.code() as i32);
                decode.worker.record_leg(Some(http));
                let why = format!("the decode stream failed: {}", status.message());
                return out
                    .fail(session, ctx, head_sent, ErrorCode::WorkerStreamFailed, &why)
                    .await;
            }
        }
        if ctx.ttft.is_none() && out.produced {
            let ttft = plan.dispatched.elapsed();
            ctx.ttft = Some(ttft);
            METRICS
                .pd_ttft
                .with_label_values(&plan.labels.as_array())
                .observe(ttft.as_secs_f64());
        }
        if out.finished {
            if out.ended_early {
                // A router-side stop: the engine is still generating; dropping the leg aborts it.
                decode.worker.record_leg(Some(200));
            } else {
                decode.completed();
                decode.worker.record_leg(Some(200));
            }
            out.end();
            if !plan.streaming {
                return out.send_body(session, ctx, plan.decode_url).await;
            }
            if out.flush(session).await.is_err()
                || session.write_response_body(None, true).await.is_err()
            {
                return Attempt::ClientGone;
            }
            return Attempt::Answered;
        }
        if plan.streaming && out.flush(session).await.is_err() {
            return Attempt::ClientGone;
        }
    }
}

/// What goes to the client: the route's writer, the stop decoder of the choice, and counts.
struct Output {
    writer: Box<dyn ResponseWriter>,
    decoder: StopDecoder,
    tokenizer: Arc<Tokenizer>,
    want_logprobs: bool,
    buf: Vec<u8>,
    text: String,
    rows: Vec<TokenLogprob>,
    /// Tokens consumed by the decoder (completion tokens when the router stopped).
    consumed: u32,
    prompt_tokens: u32,
    cached_tokens: u32,
    produced: bool,
    finished: bool,
    /// The router stopped the choice before the engine finished it.
    ended_early: bool,
    started: Instant,
}

impl Output {
    fn new(p: &Prepared, ctx: &RequestCtx, plan: &RelayPlan<'_>) -> Output {
        let gen = &p.gen;
        let mut spec = ResponseSpec::for_request(gen, ctx.request_id.clone(), p.created);
        if spec.model.is_empty() {
            spec.model = ctx
                .model_label
                .as_deref()
                .unwrap_or(crate::metrics::UNKNOWN_MODEL)
                .to_string();
        }
        spec.stream = plan.streaming;
        if gen.echo {
            spec.echo = vec![p.prompt_text.clone()];
        }
        spec.prompt_tokens = vec![p.prompt_ids.len() as u32];
        let writer = response_writer(spec).expect("a generation route has a response writer");
        let s = &gen.sampling;
        let decoder = StopDecoder::new(
            p.tokenizer.clone(),
            &StopConfig {
                stop: s.stop.clone(),
                stop_token_ids: s.stop_token_ids.clone(),
                ignore_eos: s.ignore_eos,
                no_stop_trim: s.no_stop_trim,
                skip_special_tokens: s.skip_special_tokens,
            },
        );
        Output {
            writer,
            decoder,
            tokenizer: p.tokenizer.clone(),
            want_logprobs: gen.logprobs.is_some(),
            buf: Vec::with_capacity(512),
            text: String::new(),
            rows: Vec::new(),
            consumed: 0,
            prompt_tokens: p.prompt_ids.len() as u32,
            cached_tokens: 0,
            produced: false,
            finished: false,
            ended_early: false,
            started: Instant::now(),
        }
    }

    /// New output ids of the (single) choice.
    fn chunk(
        &mut self,
        ids: &[u32],
        prompt_tokens: u32,
        cached_tokens: u32,
        logprobs: Option<&OutputLogprobs>,
    ) {
        if self.finished {
            return;
        }
        if prompt_tokens > 0 {
            self.prompt_tokens = prompt_tokens;
        }
        self.cached_tokens = self.cached_tokens.max(cached_tokens);
        self.text.clear();
        let taken = match self.decoder.push_all(ids, &mut self.text) {
            Ok(n) => n,
            Err(_) => ids.len(),
        };
        let ids = &ids[..taken.min(ids.len())];
        self.consumed += ids.len() as u32;
        self.rows.clear();
        if self.want_logprobs {
            if let Some(lp) = logprobs {
                self.fill_rows(lp, ids.len());
            }
        }
        if !ids.is_empty() || !self.text.is_empty() {
            self.produced = true;
            self.writer.delta(
                &mut self.buf,
                &Delta {
                    index: 0,
                    text: &self.text,
                    token_ids: ids,
                    logprobs: &self.rows,
                    usage: None,
                },
            );
        }
        if let Some(stop) = self.decoder.stopped().cloned() {
            self.ended_early = true;
            self.finish(FinishReason::Stop, Some(&stop), self.consumed);
        }
    }

    /// The engine's end of the choice (ignored after a router-side stop).
    fn complete(
        &mut self,
        reason: &str,
        matched: Option<&EngineStop>,
        prompt_tokens: u32,
        completion_tokens: u32,
        cached_tokens: u32,
    ) {
        if self.finished {
            return;
        }
        if prompt_tokens > 0 {
            self.prompt_tokens = prompt_tokens;
        }
        self.cached_tokens = self.cached_tokens.max(cached_tokens);
        self.text.clear();
        let _ = self.decoder.flush(&mut self.text);
        if !self.text.is_empty() {
            self.produced = true;
            self.writer.delta(
                &mut self.buf,
                &Delta {
                    index: 0,
                    text: &self.text,
                    ..Delta::default()
                },
            );
        }
        let completion = completion_tokens.max(self.consumed);
        if let Some(stop) = self.decoder.stopped().cloned() {
            self.finish(FinishReason::Stop, Some(&stop), completion);
            return;
        }
        let reason = match reason {
            "length" => FinishReason::Length,
            "abort" => FinishReason::Abort(None),
            "error" => FinishReason::Abort(Some("the engine could not load the KV cache")),
            _ => FinishReason::Stop,
        };
        let matched = matched.map(|m| match m {
            EngineStop::TokenId(t) => MatchedStop::TokenId(*t),
            EngineStop::Text(s) => MatchedStop::Text(s),
        });
        self.finish_with(reason, matched, completion);
    }

    fn finish(&mut self, reason: FinishReason<'_>, stop: Option<&RouterStop>, completion: u32) {
        let matched = stop.map(|s| match s {
            RouterStop::TokenId(t) => MatchedStop::TokenId(*t),
            RouterStop::Text(s) => MatchedStop::Text(s),
        });
        self.finish_with(reason, matched, completion);
    }

    fn finish_with(
        &mut self,
        reason: FinishReason<'_>,
        matched: Option<MatchedStop<'_>>,
        completion: u32,
    ) {
        self.writer.finish(
            &mut self.buf,
            &Finish {
                index: 0,
                reason,
                matched,
                usage: ChoiceUsage {
                    prompt_tokens: self.prompt_tokens,
                    completion_tokens: completion,
                    cached_tokens: self.cached_tokens,
                    reasoning_tokens: 0,
                },
                e2e_latency: Some(self.started.elapsed().as_secs_f64()),
            },
        );
        self.finished = true;
    }

    fn end(&mut self) {
        self.writer.end(&mut self.buf);
    }

    fn fill_rows(&mut self, lp: &OutputLogprobs, n: usize) {
        let tok = &self.tokenizer;
        let text = |id: u32| tok.token_text(id).unwrap_or_default();
        for i in 0..n.min(lp.token_ids.len()) {
            let id = lp.token_ids[i];
            let top = lp
                .top
                .get(i)
                .map(|(values, ids)| {
                    ids.iter()
                        .zip(values)
                        .map(|(&t, &v)| TopLogprob {
                            token_id: t,
                            token: text(t),
                            bytes: None,
                            logprob: v,
                        })
                        .collect()
                })
                .unwrap_or_default();
            self.rows.push(TokenLogprob {
                token_id: id,
                token: text(id),
                bytes: None,
                logprob: lp.token_logprobs.get(i).copied().unwrap_or(f32::NAN),
                top,
            });
        }
    }

    async fn send_head(
        &mut self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        decode_url: &str,
    ) -> Result<(), Attempt> {
        let head = stream_head(ctx, decode_url)
            .map_err(|e| Attempt::Refused(Reply::error(ErrorCode::InternalError, e.to_string())))?;
        ctx.status = 200;
        ctx.response_started = true;
        crate::drain::DRAIN.close_if_draining(session);
        session
            .write_response_header(Box::new(head), false)
            .await
            .map_err(|_| Attempt::ClientGone)?;
        self.writer.start(&mut self.buf);
        self.flush(session).await.map_err(|()| Attempt::ClientGone)
    }

    /// Writes what the writer produced so far (a stream's chunk).
    async fn flush(&mut self, session: &mut Session) -> Result<(), ()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::take(&mut self.buf));
        session
            .write_response_body(Some(chunk), false)
            .await
            .map_err(|_| ())
    }

    /// A non-streamed answer: the whole body.
    async fn send_body(
        &mut self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        decode_url: &str,
    ) -> Attempt {
        let body = Bytes::from(std::mem::take(&mut self.buf));
        let reply = Reply::body(200, JSON, body).with_header("x-smg-routed-worker-id", decode_url);
        match reply::send(session, ctx, reply).await {
            Ok(()) => Attempt::Answered,
            Err(_) => Attempt::ClientGone,
        }
    }

    /// A failure: before the head, a refusal the attempt loop may retry; after it, the route's
    /// error event and the end of the stream.
    async fn fail(
        &mut self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        head_sent: bool,
        code: ErrorCode,
        message: &str,
    ) -> Attempt {
        if !head_sent {
            return Attempt::Refused(Reply::error(code, message).retryable(true));
        }
        self.writer
            .fail(&mut self.buf, &StreamFailure::new(code, message));
        ctx.error_code = Some(code.as_str());
        if self.flush(session).await.is_err()
            || session.write_response_body(None, true).await.is_err()
        {
            return Attempt::ClientGone;
        }
        Attempt::EndedWithError(message.to_string())
    }
}

fn stream_head(ctx: &RequestCtx, decode_url: &str) -> pingora::Result<ResponseHeader> {
    let mut h = ResponseHeader::build(200, Some(6))?;
    h.insert_header("content-type", SSE)?;
    h.insert_header("cache-control", "no-cache")?;
    h.insert_header("transfer-encoding", "chunked")?;
    h.insert_header("x-smg-routed-worker-id", decode_url)?;
    h.insert_header("x-request-id", ctx.request_id.as_str())?;
    Ok(h)
}
