//! Relaying gRPC decode output to the client: token ids → a stop decoder per choice
//! (`pdgate-tokenize`: incremental detokenization, stop ids, stop strings withheld until they
//! can no longer match) → the route's response writer (`pdgate-convert`) → the client, as SSE
//! chunk by chunk or one JSON body. Usage comes from the decode's counts (digest §2.16).
//!
//! The choices come from one decode leg (n = 1, or vLLM's engine-side samples, interleaved by
//! index) or from `n` fanned-out single-sample legs ([`FanIn`]: a reader task per leg). A
//! router-side stop (a stop string SGLang could not take, or any stop the engine missed) ends
//! its choice at once; a fanned-out sample's leg is then dropped, which aborts it.

use std::future::Future;
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
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tonic::Status;

use super::engine::{EngineStop, Message, OutputLogprobs};
use super::leg::GrpcLeg;
use super::prepare::Prepared;
use crate::head::Head;
use crate::legs::dispatch::Attempt;
use crate::legs::parallel::PdLabels;
use crate::legs::relay::{write_last, write_piece};
use crate::metrics::{BACKEND_PD, GRPC, METRICS};
use crate::proxy::ctx::RequestCtx;
use crate::reply::{self, Reply, JSON};
use crate::workers::Worker;

pub struct RelayPlan<'a> {
    pub prepared: &'a Prepared,
    /// The decode was asked to stream chunks (the client's `stream`).
    pub streaming: bool,
    /// Prefill dispatch (TTFT origin).
    pub dispatched: Instant,
    pub decode: &'a Worker,
    /// Longest silence between two messages of a stream.
    pub stall_timeout: Duration,
    /// The request's total deadline.
    pub deadline: Instant,
    pub labels: &'a PdLabels,
    /// Record `smg_pd_ttft_seconds`: SMG does for streamed requests on SGLang and TokenSpeed
    /// pairs only (spec, "PD Metrics").
    pub pd_ttft: bool,
    /// The `endpoint` label of the router inference series (`chat`, `generate`, …).
    pub endpoint: &'static str,
    /// Fold the answer's cached-token count into `ctx.kv_verdict` (vLLM's servicer reports
    /// the prompt tokens its connector loaded as `cached_tokens`).
    pub read_cache_report: bool,
}

/// Where the decode messages come from.
pub enum Source<'a> {
    /// One decode leg; its messages carry their choice index.
    One(&'a mut GrpcLeg),
    /// Fanned-out single-sample legs.
    Many(FanIn),
}

/// `n` single-sample decode legs read by one task each; a message's index is its sample.
pub struct FanIn {
    rx: mpsc::Receiver<(u32, Result<Option<Message>, Status>)>,
    tasks: Vec<JoinHandle<()>>,
    worker: Arc<Worker>,
}

impl FanIn {
    /// Reads `legs` (sample `i` = `legs[i]`, already open). Each task marks its leg completed
    /// when the engine finished it; a task aborted or dropped drops its leg (an abort).
    pub fn new(legs: Vec<GrpcLeg>, worker: Arc<Worker>) -> FanIn {
        let (tx, rx) = mpsc::channel(16 * legs.len().max(1));
        let tasks = legs
            .into_iter()
            .enumerate()
            .map(|(i, mut leg)| {
                let tx = tx.clone();
                tokio::spawn(async move {
                    loop {
                        let m = leg.next().await;
                        let last = !matches!(m, Ok(Some(Message::Chunk(_))));
                        if matches!(m, Ok(Some(Message::Complete(_))) | Ok(None)) {
                            leg.completed();
                        }
                        let m = m.map(|o| o.map(|msg| with_index(msg, i as u32)));
                        if tx.send((i as u32, m)).await.is_err() || last {
                            return;
                        }
                    }
                })
            })
            .collect();
        FanIn { rx, tasks, worker }
    }

    /// Drops sample `i`'s leg (it aborts on the engine).
    fn stop(&self, i: u32) {
        if let Some(t) = self.tasks.get(i as usize) {
            t.abort();
        }
    }
}

impl Drop for FanIn {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn with_index(m: Message, i: u32) -> Message {
    match m {
        Message::Chunk(mut c) => {
            c.index = i;
            Message::Chunk(c)
        }
        Message::Complete(mut c) => {
            c.index = i;
            Message::Complete(c)
        }
    }
}

/// What a source yields next.
enum Next {
    Message(Message),
    /// A stream ended: choice `Some(i)` (fan-out) or the only stream (`None`).
    Ended(Option<u32>),
    Failed(Status),
}

impl Source<'_> {
    async fn next(&mut self) -> Next {
        match self {
            Source::One(leg) => match leg.next().await {
                Ok(Some(m)) => Next::Message(m),
                Ok(None) => Next::Ended(None),
                Err(s) => Next::Failed(s),
            },
            Source::Many(fan) => match fan.rx.recv().await {
                Some((_, Ok(Some(m)))) => Next::Message(m),
                Some((i, Ok(None))) => Next::Ended(Some(i)),
                Some((_, Err(s))) => Next::Failed(s),
                // Every task ended: nothing more will come.
                None => Next::Ended(None),
            },
        }
    }

    /// The next message if it is already here, without waiting (a noop waker: the next real
    /// poll registers the task's own).
    fn ready(&mut self) -> Option<Next> {
        let next = std::pin::pin!(self.next());
        match next.poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
            std::task::Poll::Ready(n) => Some(n),
            std::task::Poll::Pending => None,
        }
    }

    fn worker(&self) -> &Arc<Worker> {
        match self {
            Source::One(leg) => &leg.worker,
            Source::Many(fan) => &fan.worker,
        }
    }
}

/// Relays the decode output (its legs already open) and records the decode's outcome.
pub async fn relay(
    session: &mut Session,
    ctx: &mut RequestCtx,
    mut source: Source<'_>,
    plan: RelayPlan<'_>,
) -> Attempt {
    let mut out = Output::new(plan.prepared, ctx, &plan);
    let deadline = tokio::time::Instant::from_std(plan.deadline);
    let mut head_sent = false;
    if plan.streaming {
        if let Err(end) = out.send_head(session, ctx, plan.decode).await {
            return end;
        }
        head_sent = true;
    }
    // A message that was already there when the previous one was handled (see the flush).
    let mut ready: Option<Next> = None;
    loop {
        let stall = if plan.streaming {
            tokio::time::Instant::now() + plan.stall_timeout
        } else {
            deadline
        };
        let next = if let Some(next) = ready.take() {
            next
        } else {
            tokio::select! {
                n = source.next() => n,
                _ = session.read_body_or_idle(true) => return Attempt::ClientGone,
                _ = tokio::time::sleep_until(stall.min(deadline)) => {
                    source.worker().record_leg(None);
                    let why = if tokio::time::Instant::now() >= deadline {
                        "the request ran past request_timeout_secs"
                    } else {
                        "the decode stream stalled past stream_idle_timeout_secs"
                    };
                    return out.fail(session, ctx, head_sent, ErrorCode::Timeout, why).await;
                }
            }
        };
        match next {
            Next::Message(Message::Chunk(c)) => {
                out.chunk(
                    c.index,
                    &c.token_ids,
                    c.prompt_tokens,
                    c.cached_tokens,
                    c.logprobs.as_ref(),
                );
            }
            Next::Message(Message::Complete(c)) => {
                if !plan.streaming {
                    // Not streamed: the complete carries every output id.
                    out.chunk(
                        c.index,
                        &c.output_ids,
                        c.prompt_tokens,
                        c.cached_tokens,
                        c.logprobs.as_ref(),
                    );
                }
                out.complete(
                    c.index,
                    &c.finish_reason,
                    c.matched.as_ref(),
                    c.prompt_tokens,
                    c.completion_tokens,
                    c.cached_tokens,
                );
            }
            Next::Ended(choice) => {
                let unfinished = match choice {
                    Some(i) => !out.is_finished(i),
                    None => !out.all_finished(),
                };
                if unfinished {
                    source.worker().record_leg(None);
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
            Next::Failed(status) => {
                source
                    .worker()
                    .record_leg(Some(grpc_status_to_http(status.code() as i32)));
                let why = format!("the decode stream failed: {}", status.message());
                return out
                    .fail(session, ctx, head_sent, ErrorCode::WorkerStreamFailed, &why)
                    .await;
            }
        }
        if let Source::Many(fan) = &source {
            for i in out.take_early_ends() {
                fan.stop(i);
            }
        }
        if ctx.ttft.is_none() && out.produced {
            let ttft = plan.dispatched.elapsed();
            ctx.ttft = Some(ttft);
            out.first_output = Some(Instant::now());
            if plan.pd_ttft {
                METRICS
                    .pd_ttft
                    .with(&plan.labels.as_array(), |m| m.observe(ttft.as_secs_f64()));
            }
        }
        if out.all_finished() {
            source.worker().record_leg(Some(200));
            if plan.read_cache_report {
                if let Some(c) = out.choices.first() {
                    ctx.kv_verdict = ctx
                        .kv_verdict
                        .with_report(u64::from(c.prompt_tokens), Some(u64::from(c.cached_tokens)));
                }
            }
            if let Source::One(leg) = &mut source {
                // A router-side stop leaves the engine generating: dropping the leg aborts it.
                if !out.any_ended_early {
                    leg.completed();
                }
            }
            out.end();
            if !plan.streaming {
                return out.send_body(session, ctx, plan.decode).await;
            }
            out.record_stream(&plan);
            if out.end_stream(session).await.is_err() {
                return Attempt::ClientGone;
            }
            return Attempt::Answered;
        }
        if plan.streaming {
            // Messages that have already arrived go out in one write with this one: nothing
            // waits for them, and the client gets one send instead of one per token.
            if out.buf.len() < COALESCE_BYTES {
                ready = source.ready();
                if ready.is_some() {
                    continue;
                }
            }
            if out.flush(session).await.is_err() {
                return Attempt::ClientGone;
            }
        }
    }
}

/// Most bytes of events held back while later messages are already there.
const COALESCE_BYTES: usize = 16 * 1024;

/// One choice's state.
struct Choice {
    decoder: StopDecoder,
    /// Tokens consumed by the decoder (completion tokens when the router stopped).
    consumed: u32,
    prompt_tokens: u32,
    cached_tokens: u32,
    finished: bool,
    /// The router stopped it before the engine finished it (not yet reported to the source).
    ended_early: bool,
}

/// Choice `index` unless it is unknown or already finished, with the engine's counts noted.
fn live_choice(
    choices: &mut [Choice],
    index: u32,
    prompt_tokens: u32,
    cached_tokens: u32,
) -> Option<&mut Choice> {
    let c = choices.get_mut(index as usize).filter(|c| !c.finished)?;
    if prompt_tokens > 0 {
        c.prompt_tokens = prompt_tokens;
    }
    c.cached_tokens = c.cached_tokens.max(cached_tokens);
    Some(c)
}

/// What goes to the client: the route's writer, a stop decoder per choice, and counts.
struct Output {
    writer: Box<dyn ResponseWriter>,
    tokenizer: Arc<Tokenizer>,
    want_logprobs: bool,
    choices: Vec<Choice>,
    buf: Vec<u8>,
    text: String,
    rows: Vec<TokenLogprob>,
    produced: bool,
    any_ended_early: bool,
    /// The decode stream's start: the origin of the router inference series.
    started: Instant,
    /// When the first output reached the client's buffer.
    first_output: Option<Instant>,
    /// Completion tokens of the finished choices.
    output_tokens: u64,
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
        let config = StopConfig {
            stop: s.stop.clone(),
            stop_token_ids: s.stop_token_ids.clone(),
            ignore_eos: s.ignore_eos,
            no_stop_trim: s.no_stop_trim,
            skip_special_tokens: s.skip_special_tokens,
        };
        let choices = (0..s.n.max(1))
            .map(|_| Choice {
                decoder: StopDecoder::new(p.tokenizer.clone(), &config),
                consumed: 0,
                prompt_tokens: p.prompt_ids.len() as u32,
                cached_tokens: 0,
                finished: false,
                ended_early: false,
            })
            .collect();
        Output {
            writer,
            tokenizer: p.tokenizer.clone(),
            want_logprobs: gen.logprobs.is_some(),
            choices,
            buf: Vec::with_capacity(512),
            text: String::new(),
            rows: Vec::new(),
            produced: false,
            any_ended_early: false,
            started: Instant::now(),
            first_output: None,
            output_tokens: 0,
        }
    }

    /// SMG's router inference series of a streamed request that ended well (its gRPC path
    /// records them for streamed requests only): TTFT and generation time from the decode
    /// stream's start, which is why they measure the decode leg alone; time per output token
    /// after the first; input and output tokens.
    fn record_stream(&self, plan: &RelayPlan<'_>) {
        let labels = [GRPC, BACKEND_PD, plan.labels.model(), plan.endpoint];
        let generation = self.started.elapsed();
        if let Some(first) = self.first_output {
            let ttft = first.saturating_duration_since(self.started);
            METRICS
                .router_ttft
                .with(&labels, |m| m.observe(ttft.as_secs_f64()));
            if self.output_tokens > 1 {
                let per =
                    generation.saturating_sub(ttft).as_secs_f64() / (self.output_tokens - 1) as f64;
                METRICS.router_tpot.with(&labels, |m| m.observe(per));
            }
        }
        METRICS
            .router_generation_duration
            .with(&labels, |m| m.observe(generation.as_secs_f64()));
        let input = self
            .choices
            .first()
            .map_or(0, |c| u64::from(c.prompt_tokens));
        for (token_type, n) in [("input", input), ("output", self.output_tokens)] {
            if n > 0 {
                let [r, b, m, e] = labels;
                METRICS
                    .router_tokens
                    .with(&[r, b, m, e, token_type], |c| c.inc_by(n));
            }
        }
    }

    fn is_finished(&self, i: u32) -> bool {
        self.choices.get(i as usize).is_none_or(|c| c.finished)
    }

    fn all_finished(&self) -> bool {
        self.choices.iter().all(|c| c.finished)
    }

    /// Choices the router ended since the last call (their fanned-out legs are to be dropped).
    fn take_early_ends(&mut self) -> Vec<u32> {
        let mut out = Vec::new();
        for (i, c) in self.choices.iter_mut().enumerate() {
            if c.ended_early {
                c.ended_early = false;
                out.push(i as u32);
            }
        }
        out
    }

    /// New output ids of choice `index`.
    fn chunk(
        &mut self,
        index: u32,
        ids: &[u32],
        prompt_tokens: u32,
        cached_tokens: u32,
        logprobs: Option<&OutputLogprobs>,
    ) {
        let Some(c) = live_choice(&mut self.choices, index, prompt_tokens, cached_tokens) else {
            return;
        };
        self.text.clear();
        let taken = c.decoder.push_all(ids, &mut self.text).unwrap_or(ids.len());
        let ids = &ids[..taken.min(ids.len())];
        c.consumed += ids.len() as u32;
        let stopped = c.decoder.stopped().cloned();
        let consumed = c.consumed;
        self.rows.clear();
        if self.want_logprobs {
            if let Some(lp) = logprobs {
                fill_rows(&self.tokenizer, &mut self.rows, lp, ids.len());
            }
        }
        if !ids.is_empty() || !self.text.is_empty() {
            self.produced = true;
            self.writer.delta(
                &mut self.buf,
                &Delta {
                    index,
                    text: &self.text,
                    token_ids: ids,
                    logprobs: &self.rows,
                    usage: None,
                },
            );
        }
        if let Some(stop) = stopped {
            self.choices[index as usize].ended_early = true;
            self.any_ended_early = true;
            self.finish(index, FinishReason::Stop, router_stop(&stop), consumed);
        }
    }

    /// The engine's end of choice `index` (ignored after a router-side stop).
    fn complete(
        &mut self,
        index: u32,
        reason: &str,
        matched: Option<&EngineStop>,
        prompt_tokens: u32,
        completion_tokens: u32,
        cached_tokens: u32,
    ) {
        let Some(c) = live_choice(&mut self.choices, index, prompt_tokens, cached_tokens) else {
            return;
        };
        self.text.clear();
        let _ = c.decoder.flush(&mut self.text);
        let completion = completion_tokens.max(c.consumed);
        let stopped = c.decoder.stopped().cloned();
        if !self.text.is_empty() {
            self.produced = true;
            self.writer.delta(
                &mut self.buf,
                &Delta {
                    index,
                    text: &self.text,
                    ..Delta::default()
                },
            );
        }
        if let Some(stop) = stopped {
            self.finish(index, FinishReason::Stop, router_stop(&stop), completion);
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
        self.finish(index, reason, matched, completion);
    }

    fn finish(
        &mut self,
        index: u32,
        reason: FinishReason<'_>,
        matched: Option<MatchedStop<'_>>,
        completion: u32,
    ) {
        let c = &mut self.choices[index as usize];
        c.finished = true;
        self.output_tokens += u64::from(completion);
        let usage = ChoiceUsage {
            prompt_tokens: c.prompt_tokens,
            completion_tokens: completion,
            cached_tokens: c.cached_tokens,
            reasoning_tokens: 0,
        };
        self.writer.finish(
            &mut self.buf,
            &Finish {
                index,
                reason,
                matched,
                usage,
                e2e_latency: Some(self.started.elapsed().as_secs_f64()),
            },
        );
    }

    fn end(&mut self) {
        self.writer.end(&mut self.buf);
    }

    async fn send_head(
        &mut self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        decode: &Worker,
    ) -> Result<(), Attempt> {
        let head = stream_head(ctx, decode)
            .map_err(|e| Attempt::Refused(Reply::error(ErrorCode::InternalError, e.to_string())))?;
        // The stream's opening bytes follow the head at once: one client write for both.
        self.writer.start(&mut self.buf);
        crate::legs::relay::start_stream(session, ctx, head, 200, !self.buf.is_empty())
            .await
            .map_err(|()| Attempt::ClientGone)?;
        self.flush(session).await.map_err(|()| Attempt::ClientGone)
    }

    /// Writes what the writer produced so far (a stream's chunk).
    async fn flush(&mut self, session: &mut Session) -> Result<(), ()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::take(&mut self.buf));
        write_piece(session, Some(chunk), false)
            .await
            .map_err(|_| ())
    }

    /// Ends a stream: what the writer produced last and the end of the body, in one write.
    async fn end_stream(&mut self, session: &mut Session) -> Result<(), ()> {
        let last = Bytes::from(std::mem::take(&mut self.buf));
        write_last(session, Some(last)).await.map_err(|_| ())
    }

    /// A non-streamed answer: the whole body.
    async fn send_body(
        &mut self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        decode: &Worker,
    ) -> Attempt {
        let body = Bytes::from(std::mem::take(&mut self.buf));
        let reply = crate::legs::relay::routed_to(Reply::body(200, JSON, body), decode);
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
        if self.end_stream(session).await.is_err() {
            return Attempt::ClientGone;
        }
        Attempt::EndedWithError(message.to_string())
    }
}

fn router_stop(stop: &RouterStop) -> Option<MatchedStop<'_>> {
    Some(match stop {
        RouterStop::TokenId(t) => MatchedStop::TokenId(*t),
        RouterStop::Text(s) => MatchedStop::Text(s),
    })
}

fn fill_rows(tok: &Tokenizer, rows: &mut Vec<TokenLogprob>, lp: &OutputLogprobs, n: usize) {
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
        rows.push(TokenLogprob {
            token_id: id,
            token: text(id),
            bytes: None,
            logprob: lp.token_logprobs.get(i).copied().unwrap_or(f32::NAN),
            top,
        });
    }
}

fn stream_head(ctx: &RequestCtx, decode: &Worker) -> pingora::Result<ResponseHeader> {
    let mut h = Head::new(200, 5)?;
    crate::legs::relay::stream_headers(&mut h, ctx, decode);
    Ok(h.finish())
}
