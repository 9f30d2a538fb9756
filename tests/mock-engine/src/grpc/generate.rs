//! The engine-neutral `Generate` driver. A servicer decodes its own proto into a [`Call`];
//! the driver records it, applies the request faults, runs the job through the shared core (the
//! HTTP dialects' runners and rendezvous), turns the core's steps into chunk / complete events
//! with the engine's counter and `output_ids` rules, and hands the stream back only once its
//! first message (or its error) is ready — the header timing of Python grpc.aio servicers.
//!
//! Wire rules, from the smg-grpc-servicer sources (SGLang, vLLM, TokenSpeed servicers):
//! * stream: one chunk per generated token (new `token_ids`), then per index a complete whose
//!   `output_ids` are the *last* delta again (every servicer builds it from the finishing
//!   output); non-stream: one complete per index with every id, in index order;
//! * counters: SGLang / TokenSpeed `completion_tokens` are running totals, vLLM's are the
//!   message's own token count;
//! * TokenSpeed drops a matched trailing stop token from `output_ids` unless `no_stop_trim`;
//! * `matched_stop`: SGLang / TokenSpeed report the matched token (EOS included), vLLM only a
//!   `stop_token_ids` hit or a stop string (its `stop_reason`; EOS has none).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::codegen::BoxStream;
use tonic::{Code, Status};

use super::{
    code_for_status, code_name, count_rpc, metadata_map, status_of, tonic_code, GrpcState,
    LiveHandle,
};
use crate::config::{EngineKind, Fault, GrpcCode};
use crate::engine::{drive, protocol_name, AsyncStepSink, ReqCtx, Shared};
use crate::fake_model::{Finish, GenToken, LogprobRow, Matched, SamplingSpec};
use crate::job::{ApiError, ErrorKind, Job, JobItem, LogprobOpts, Route};
use crate::records::{now_ms, GrpcRequest, Handoff, MmRecord, ParsedFields, RequestRecord};
use crate::render::{FinishKind, PromptInfo, Step};
use crate::sglang::BootstrapItem;
use crate::vision::{MediaIdentityOut, MediaPlan, MediaSpan};

/// A servicer's decoded `Generate`, ready for the driver.
pub(crate) struct Call {
    /// `/{package}.{Service}/Generate`: the record's `path` and what faults match on.
    pub method_path: &'static str,
    pub request: GrpcRequest,
    /// The request's media as they arrived (`None`: text only).
    pub mm: Option<MmRecord>,
    pub peer: Option<SocketAddr>,
    /// The job, or the status the servicer refuses the request with before any work.
    pub prepared: Result<Prepared, Status>,
}

/// A request the servicer accepted.
pub(crate) struct Prepared {
    pub job: Job,
    /// The request as the HTTP dialect's body, for what the runners read from it (vLLM's
    /// `kv_transfer_params`).
    pub body: Value,
    /// SGLang / TokenSpeed bootstrap fields (prefill / decode roles).
    pub bootstrap: Vec<BootstrapItem>,
    pub rules: WireRules,
    /// What the request's media still need before the job runs (EPD embeddings, `media_refs`).
    pub media: MediaPlan,
}

/// Per-request choices of how the servicer shapes its messages.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WireRules {
    pub stream: bool,
    /// TokenSpeed: keep a matched trailing stop token in `output_ids`.
    pub no_stop_trim: bool,
    /// Send the prompt's logprob rows (SGLang `logprob_start_len >= 0`, vLLM `prompt_logprobs`).
    pub input_logprobs: bool,
    /// Send the generated tokens' logprobs.
    pub output_logprobs: bool,
}

/// What a servicer needs to build its job: the request fields every engine has.
pub(crate) struct JobRequest {
    pub request_id: String,
    pub prompt_ids: Vec<u32>,
    pub spec: SamplingSpec,
    pub n: u32,
    pub stream: bool,
    pub logprobs: LogprobOpts,
    /// Image placeholder ranges with the features read from the request's pixels.
    pub media: Vec<MediaSpan>,
}

/// One job item per sample (interleaved `index`); every sample shares the request's one room.
pub(crate) fn build_job(model: &str, r: JobRequest) -> Job {
    let n = r.n.max(1) as usize;
    Job {
        route: Route::Generate,
        stream: r.stream,
        items: (0..n)
            .map(|i| JobItem {
                index: i,
                room_index: 0,
                sample: (n > 1).then_some(i),
                prompt_ids: r.prompt_ids.clone(),
                spec: r.spec.clone(),
                media: r.media.clone(),
            })
            .collect(),
        batched: n > 1,
        n_rooms: 1,
        logprobs: r.logprobs,
        include_usage: false,
        model: model.to_string(),
        rid: r.request_id,
        list_output: false,
        documents: Vec::new(),
        top_n: None,
        return_documents: false,
        n,
    }
}

/// An engine-neutral response message; each servicer encodes it in its own proto.
#[derive(Clone, Debug)]
pub(crate) enum GenOut {
    Chunk(ChunkOut),
    Complete(CompleteOut),
}

#[derive(Clone, Debug, Default)]
pub(crate) struct ChunkOut {
    pub index: u32,
    pub token_ids: Vec<u32>,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
    pub output_logprobs: Option<OutputLogprobs>,
    pub input_logprobs: Option<InputLogprobs>,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct CompleteOut {
    pub index: u32,
    pub output_ids: Vec<u32>,
    pub finish_reason: &'static str,
    pub matched: Option<MatchedStop>,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
    pub output_logprobs: Option<OutputLogprobs>,
    pub input_logprobs: Option<InputLogprobs>,
    /// vLLM prefill: the handoff its connector returned.
    pub kv_transfer_params: Option<Value>,
    /// vLLM prefill with worker-side media processing: what it learned about the media.
    pub media_identity: Option<MediaIdentityOut>,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum MatchedStop {
    TokenId(u32),
    Text(String),
}

#[derive(Clone, Debug, Default)]
pub(crate) struct TopLogprobs {
    pub values: Vec<f32>,
    pub token_ids: Vec<u32>,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct OutputLogprobs {
    pub token_logprobs: Vec<f32>,
    pub token_ids: Vec<u32>,
    pub top: Vec<TopLogprobs>,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct InputLogprobs {
    pub token_logprobs: Vec<Option<f32>>,
    pub token_ids: Vec<u32>,
    pub top: Vec<TopLogprobs>,
}

pub(crate) type EventStream = Pin<Box<dyn Stream<Item = Result<GenOut, Status>> + Send>>;

/// A servicer's `Generate` handler: reads the call with the engine's `record` and `prepare`,
/// [`run`]s it, and sends the events in the engine's proto (`encode`).
pub(crate) async fn serve<Req, Resp>(
    shared: &Arc<Shared>,
    method_path: &'static str,
    request: tonic::Request<Req>,
    record: impl FnOnce(&Req, BTreeMap<String, String>) -> (GrpcRequest, Option<MmRecord>),
    prepare: impl FnOnce(&Req) -> Result<Prepared, Status>,
    encode: impl Fn(GenOut) -> Resp + Send + 'static,
) -> Result<tonic::Response<BoxStream<Resp>>, Status>
where
    Resp: Send + 'static,
{
    let peer = request.remote_addr();
    let metadata = metadata_map(request.metadata());
    let req = request.into_inner();
    let (request, mm) = record(&req, metadata);
    let call = Call {
        method_path,
        request,
        mm,
        peer,
        prepared: prepare(&req),
    };
    let events = run(shared, call).await?;
    Ok(tonic::Response::new(Box::pin(
        events.map(move |r| r.map(&encode)),
    )))
}

/// Runs one `Generate` call. Returns once the response headers would go out: with the first
/// message (or the error) by default, at once with `headers_at_once`.
pub(crate) async fn run(shared: &Arc<Shared>, call: Call) -> Result<EventStream, Status> {
    count_rpc(shared, "Generate");
    let seq = push_record(shared, &call);
    let mut guard = CallGuard {
        shared: shared.clone(),
        seq,
        done: false,
        live: None,
    };
    if shared.crashed.load(std::sync::atomic::Ordering::SeqCst) {
        let st = Status::internal("engine is dead (scheduler crashed)");
        guard.finish_status(&st);
        return Err(st);
    }
    let prepared = match call.prepared {
        Ok(p) => p,
        Err(st) => {
            guard.finish_status(&st);
            return Err(st);
        }
    };
    {
        let parsed = parsed_fields(&call.request, Some(&prepared.job), &prepared.body);
        let rooms: Vec<u64> = prepared.bootstrap.iter().map(|b| b.room).collect();
        shared.recorder.update(seq, |r| {
            r.parsed = parsed;
            r.handoff.room = rooms.first().copied();
            r.handoff.rooms = rooms;
        });
        crate::vision::record_features(shared, seq, &prepared.job);
    }

    let mut fail_after = None;
    let mut silence = None;
    let fault = shared.take_fault(call.method_path, |f| {
        matches!(
            f,
            Fault::FailStatus { .. }
                | Fault::GrpcStatus { .. }
                | Fault::Hang { .. }
                | Fault::DelayHead { .. }
                | Fault::StallAfterHead { .. }
                | Fault::FailAfterTokens { .. }
        )
    });
    if let Some(f) = fault {
        shared.timeline(seq, format!("fault:{}", f.kind()));
        match f {
            Fault::FailStatus { status, body, .. } => {
                let st = Status::new(
                    code_for_status(shared.cfg.engine, status),
                    body.unwrap_or_else(|| format!("mock fault: status {status}")),
                );
                guard.finish_status(&st);
                return Err(st);
            }
            Fault::GrpcStatus { code, message, .. } => {
                let st = Status::new(
                    tonic_code(code),
                    message.unwrap_or_else(|| format!("mock fault: {}", code.name())),
                );
                guard.finish_status(&st);
                return Err(st);
            }
            Fault::DelayHead { ms, .. } => tokio::time::sleep(Duration::from_millis(ms)).await,
            Fault::Hang { .. } => silence = Some(Silence::WithoutHeaders),
            Fault::StallAfterHead { .. } => silence = Some(Silence::AfterHeaders),
            Fault::FailAfterTokens {
                tokens,
                code,
                message,
                ..
            } => {
                fail_after = Some(FailAfter {
                    tokens,
                    code,
                    message: message.unwrap_or_else(|| {
                        format!("mock fault: {} after {tokens} tokens", code.name())
                    }),
                })
            }
            _ => {}
        }
    }

    let live = GrpcState::register(
        shared,
        &prepared.job.rid,
        seq,
        prepared.job.items.len() as u64,
    );
    let abort = live.abort.clone();
    guard.live = Some(live);
    let (tx, rx) = mpsc::channel(64);
    let rules = prepared.rules;
    let media = prepared.media;
    let ctx = ReqCtx {
        shared: shared.clone(),
        seq,
        job: prepared.job,
        body: prepared.body,
        bootstrap: prepared.bootstrap,
    };
    let call = Producer {
        rules,
        tx,
        abort,
        guard,
        fail_after,
        silence,
    };
    shared.groups.work.spawn(produce(ctx, media, call));

    let mut rest = ReceiverStream::new(rx);
    if shared.cfg.grpc.headers_at_once || silence == Some(Silence::AfterHeaders) {
        mark_headers(shared, seq);
        return Ok(Box::pin(rest));
    }
    // grpc.aio: the headers go out with the first message, a refusal is trailers-only.
    match rest.next().await {
        Some(Ok(first)) => {
            mark_headers(shared, seq);
            Ok(Box::pin(tokio_stream::once(Ok(first)).chain(rest)))
        }
        Some(Err(st)) => Err(st),
        None => {
            mark_headers(shared, seq);
            Ok(Box::pin(rest))
        }
    }
}

/// A `Hang` / `StallAfterHead` fault: the call produces nothing until the client leaves or an
/// `Abort` names it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Silence {
    WithoutHeaders,
    AfterHeaders,
}

/// A `fail_after_tokens` fault.
struct FailAfter {
    tokens: u64,
    code: GrpcCode,
    message: String,
}

fn mark_headers(shared: &Shared, seq: u64) {
    shared
        .recorder
        .update(seq, |r| r.outcome.head_at_ms = Some(now_ms()));
}

enum Ending {
    Done(Result<(), ApiError>),
    ClientGone,
    Aborted,
}

/// What the producer task of one call holds besides the request.
struct Producer {
    rules: WireRules,
    tx: mpsc::Sender<Result<GenOut, Status>>,
    abort: CancellationToken,
    guard: CallGuard,
    fail_after: Option<FailAfter>,
    silence: Option<Silence>,
}

/// The call's producer task: fetches what the request's media still need, drives the job into
/// the response channel and ends the call.
async fn produce(mut ctx: ReqCtx, media: MediaPlan, call: Producer) {
    let Producer {
        rules,
        tx,
        abort,
        mut guard,
        fail_after,
        silence,
    } = call;
    let shared = ctx.shared.clone();
    let engine = shared.cfg.engine;
    let seq = ctx.seq;
    // A call that ends while its media are still being fetched (an EPD prefill waiting for an
    // embedding) never starts its job: no room is opened for a request nobody waits for.
    let mut ended_early = None;
    let resolved = if silence.is_some() {
        Ok(None)
    } else {
        tokio::select! {
            r = crate::vision::resolve(&shared, seq, &mut ctx.job, media.pending) => r,
            _ = tx.closed() => {
                ended_early = Some(Ending::ClientGone);
                Ok(None)
            }
            _ = abort.cancelled() => {
                ended_early = Some(Ending::Aborted);
                Ok(None)
            }
        }
    };
    let media_identity = match resolved {
        Ok(identity) => identity.filter(|_| media.return_identity),
        Err(st) => {
            let _ = tx.send(Err(st.clone())).await;
            guard.finish_status(&st);
            return;
        }
    };
    let ctx = Arc::new(ctx);
    let mut sink = WireSink {
        media_identity,
        shared: shared.clone(),
        engine,
        seq: ctx.seq,
        rules,
        tx: &tx,
        items: vec![ItemWire::default(); ctx.job.items.len()],
        buffered: BTreeMap::new(),
        fail_after,
        emitted: 0,
    };
    let ending = if let Some(early) = ended_early {
        early
    } else if silence.is_some() {
        tokio::select! {
            _ = tx.closed() => Ending::ClientGone,
            _ = abort.cancelled() => Ending::Aborted,
        }
    } else {
        tokio::select! {
            r = drive(ctx.clone(), &mut sink) => Ending::Done(r),
            _ = tx.closed() => Ending::ClientGone,
            _ = abort.cancelled() => Ending::Aborted,
        }
    };
    match ending {
        Ending::ClientGone | Ending::Done(Err(ApiError { status: 499, .. })) => {
            // The guard records the hang-up.
        }
        Ending::Done(Ok(())) => {
            if sink.flush_buffered().await.is_ok() {
                guard.finish(Code::Ok, None, sink.finish_label(), sink.tokens(), false);
            }
        }
        Ending::Done(Err(e)) if engine == EngineKind::Vllm && e.kind == ErrorKind::KvLoad => {
            // vLLM finishes a request whose KV load failed with `finish_reason: "error"`.
            if sink.end_unfinished("error").await.is_ok() {
                guard.finish(
                    Code::Ok,
                    Some(e.message),
                    Some("error".into()),
                    sink.tokens(),
                    false,
                );
            }
        }
        Ending::Done(Err(e)) => {
            let st = status_of(&shared, &e);
            let _ = tx.send(Err(st.clone())).await;
            guard.finish_status(&st);
        }
        Ending::Aborted => {
            shared.timeline(ctx.seq, "aborted by an Abort RPC");
            match engine {
                EngineKind::Vllm => {
                    // vLLM finishes an aborted request with `finish_reason: "abort"`.
                    let _ = sink.end_unfinished("abort").await;
                    guard.finish(Code::Ok, None, Some("abort".into()), sink.tokens(), true);
                }
                // SGLang: the scheduler's generic abort reaches the servicer as an error
                // without a status code (INTERNAL). TokenSpeed: an abort finish reason without
                // one, message or "aborted".
                EngineKind::Sglang | EngineKind::TokenSpeed => {
                    let message = if engine == EngineKind::Sglang {
                        "Request aborted"
                    } else {
                        "aborted"
                    };
                    let st = Status::internal(message);
                    let _ = tx.send(Err(st.clone())).await;
                    guard.finish(Code::Internal, Some(message.into()), None, None, true);
                }
            }
        }
    }
}

/// Turns the core's steps into one engine's messages.
struct WireSink<'a> {
    shared: Arc<Shared>,
    engine: EngineKind,
    seq: u64,
    rules: WireRules,
    tx: &'a mpsc::Sender<Result<GenOut, Status>>,
    items: Vec<ItemWire>,
    /// Non-stream completes, sent in index order once every item is done.
    buffered: BTreeMap<usize, CompleteOut>,
    fail_after: Option<FailAfter>,
    emitted: u64,
    /// vLLM prefill: the media identity its completes carry.
    media_identity: Option<MediaIdentityOut>,
}

#[derive(Clone, Default)]
struct ItemWire {
    prompt: PromptInfo,
    tokens: Vec<GenToken>,
    /// The tokens of the last message (the engine's last output delta).
    delta: Vec<GenToken>,
    finish: Option<FinishKind>,
    chunks_sent: usize,
    input_logprobs_sent: bool,
    completed: bool,
}

/// The client went away (the send failed).
struct Gone;

impl AsyncStepSink for &mut WireSink<'_> {
    async fn step(&mut self, s: Step) -> Result<(), ApiError> {
        match s {
            Step::Prompt { item, info } => self.items[item].prompt = info,
            Step::Token {
                item,
                token,
                finish,
                ..
            } => {
                self.check_fail_after()?;
                let it = &mut self.items[item];
                it.tokens.push(token.clone());
                it.delta = vec![token];
                if finish.is_some() {
                    it.finish = finish;
                }
                if self.rules.stream {
                    let c = self.chunk(item);
                    self.send(GenOut::Chunk(c)).await.map_err(gone)?;
                }
                self.emitted += 1;
                self.check_fail_after()?;
            }
            Step::Finish { item, finish } => {
                let it = &mut self.items[item];
                it.finish = Some(finish);
                it.delta.clear();
                if self.rules.stream {
                    let c = self.chunk(item);
                    self.send(GenOut::Chunk(c)).await.map_err(gone)?;
                }
            }
            Step::ItemDone { item } => {
                let reason = finish_reason(self.items[item].finish.as_ref());
                let c = self.complete(item, reason);
                self.items[item].completed = true;
                if self.rules.stream {
                    self.send(GenOut::Complete(c)).await.map_err(gone)?;
                } else {
                    self.buffered.insert(item, c);
                }
            }
            Step::Scores { .. } => {}
        }
        Ok(())
    }
}

fn gone(_: Gone) -> ApiError {
    ApiError {
        status: 499,
        message: "client cancelled the call".into(),
        kind: ErrorKind::Request,
    }
}

impl WireSink<'_> {
    async fn send(&self, m: GenOut) -> Result<(), Gone> {
        self.tx.send(Ok(m)).await.map_err(|_| Gone)
    }

    fn check_fail_after(&self) -> Result<(), ApiError> {
        match &self.fail_after {
            Some(f) if self.emitted >= f.tokens => {
                Err(ApiError::internal(f.message.clone()).with_kind(ErrorKind::Fault(f.code)))
            }
            _ => Ok(()),
        }
    }

    /// The ids of `toks` as this engine sends them (TokenSpeed drops a matched trailing stop
    /// token once the item finished on it).
    fn wire_ids(&self, item: usize, toks: &[GenToken]) -> Vec<u32> {
        let mut ids: Vec<u32> = toks.iter().map(|t| t.id).collect();
        if self.engine == EngineKind::TokenSpeed && !self.rules.no_stop_trim {
            if let Some(FinishKind::Model(Finish::Stop(Matched::Token(m)))) =
                &self.items[item].finish
            {
                if ids.last() == Some(m) {
                    ids.pop();
                }
            }
        }
        ids
    }

    fn output_logprobs(&self, toks: &[GenToken], keep: usize) -> Option<OutputLogprobs> {
        if !self.rules.output_logprobs || keep == 0 {
            return None;
        }
        let toks = &toks[..keep.min(toks.len())];
        Some(OutputLogprobs {
            token_logprobs: toks.iter().map(|t| t.logprob as f32).collect(),
            token_ids: toks.iter().map(|t| t.id).collect(),
            top: toks.iter().map(|t| top_of(&t.top)).collect(),
        })
    }

    fn input_logprobs(&self, item: usize) -> Option<InputLogprobs> {
        if !self.rules.input_logprobs {
            return None;
        }
        self.items[item]
            .prompt
            .input_logprobs
            .as_ref()
            .map(|rows| input_rows(rows))
    }

    fn chunk(&mut self, item: usize) -> ChunkOut {
        let token_ids = self.wire_ids(item, &self.items[item].delta);
        let it = &self.items[item];
        let completion_tokens = match self.engine {
            EngineKind::Vllm => token_ids.len(),
            EngineKind::Sglang | EngineKind::TokenSpeed => it.tokens.len(),
        };
        let output_logprobs = self.output_logprobs(&it.delta, token_ids.len());
        let input_logprobs = match self.engine {
            EngineKind::Sglang if !it.input_logprobs_sent => self.input_logprobs(item),
            EngineKind::Vllm if it.chunks_sent == 0 => self.input_logprobs(item),
            _ => None,
        };
        let out = ChunkOut {
            index: item as u32,
            token_ids,
            prompt_tokens: it.prompt.prompt_tokens as u32,
            completion_tokens: completion_tokens as u32,
            cached_tokens: it.prompt.cached_tokens as u32,
            output_logprobs,
            input_logprobs,
        };
        let it = &mut self.items[item];
        it.chunks_sent += 1;
        if out.input_logprobs.is_some() {
            it.input_logprobs_sent = true;
        }
        out
    }

    fn complete(&self, item: usize, finish_reason: &'static str) -> CompleteOut {
        let it = &self.items[item];
        let toks: &[GenToken] = if self.rules.stream {
            &it.delta
        } else {
            &it.tokens
        };
        let output_ids = self.wire_ids(item, toks);
        let completion_tokens = match self.engine {
            EngineKind::Vllm => output_ids.len(),
            EngineKind::Sglang | EngineKind::TokenSpeed => it.tokens.len(),
        };
        let input_logprobs = match self.engine {
            EngineKind::Sglang if !self.rules.stream => self.input_logprobs(item),
            EngineKind::Vllm => self.input_logprobs(item),
            _ => None,
        };
        let kv_transfer_params = match self.engine {
            EngineKind::Vllm => crate::vllm::returned_params(&self.shared, self.seq),
            _ => None,
        };
        if self.media_identity.is_some() {
            self.shared.recorder.update(self.seq, |r| {
                if let Some(mm) = r.mm.as_mut() {
                    mm.media_identity_returned = true;
                }
            });
        }
        CompleteOut {
            index: item as u32,
            output_logprobs: self.output_logprobs(toks, output_ids.len()),
            output_ids,
            finish_reason,
            matched: self.matched(it.finish.as_ref()),
            prompt_tokens: it.prompt.prompt_tokens as u32,
            completion_tokens: completion_tokens as u32,
            cached_tokens: it.prompt.cached_tokens as u32,
            input_logprobs,
            kv_transfer_params,
            media_identity: self.media_identity.clone(),
        }
    }

    fn matched(&self, f: Option<&FinishKind>) -> Option<MatchedStop> {
        match f {
            Some(FinishKind::Model(Finish::Stop(Matched::Token(t)))) => {
                // vLLM's `stop_reason` is None for EOS.
                let eos = self.shared.cfg.output_vocab.is_eos(*t);
                (self.engine != EngineKind::Vllm || !eos).then_some(MatchedStop::TokenId(*t))
            }
            Some(FinishKind::Model(Finish::Stop(Matched::Text(s)))) => {
                Some(MatchedStop::Text(s.clone()))
            }
            _ => None,
        }
    }

    /// Sends the buffered non-stream completes, in index order.
    async fn flush_buffered(&mut self) -> Result<(), Gone> {
        for (_, c) in std::mem::take(&mut self.buffered) {
            self.send(GenOut::Complete(c)).await?;
        }
        Ok(())
    }

    /// Ends every index that has not completed with `reason` (vLLM abort / load failure), after
    /// the buffered completes: a stream sends an empty chunk and a complete per index.
    async fn end_unfinished(&mut self, reason: &'static str) -> Result<(), Gone> {
        for item in 0..self.items.len() {
            if let Some(c) = self.buffered.remove(&item) {
                self.send(GenOut::Complete(c)).await?;
                continue;
            }
            if self.items[item].completed {
                continue;
            }
            self.items[item].delta.clear();
            if self.rules.stream {
                let c = self.chunk(item);
                self.send(GenOut::Chunk(c)).await?;
            }
            let c = self.complete(item, reason);
            self.items[item].completed = true;
            self.send(GenOut::Complete(c)).await?;
        }
        Ok(())
    }

    fn finish_label(&self) -> Option<String> {
        self.items
            .first()
            .map(|it| finish_reason(it.finish.as_ref()).to_string())
    }

    fn tokens(&self) -> Option<u64> {
        Some(self.items.iter().map(|i| i.tokens.len() as u64).sum())
    }
}

fn finish_reason(f: Option<&FinishKind>) -> &'static str {
    match f {
        Some(FinishKind::Model(Finish::Stop(_))) => "stop",
        Some(FinishKind::Model(Finish::Length(_))) | Some(FinishKind::PrefillHandoff) => "length",
        None => "stop",
    }
}

fn top_of(top: &[(u32, f64)]) -> TopLogprobs {
    TopLogprobs {
        values: top.iter().map(|&(_, lp)| lp as f32).collect(),
        token_ids: top.iter().map(|&(id, _)| id).collect(),
    }
}

fn input_rows(rows: &[LogprobRow]) -> InputLogprobs {
    InputLogprobs {
        token_logprobs: rows.iter().map(|(lp, _, _)| lp.map(|v| v as f32)).collect(),
        token_ids: rows.iter().map(|(_, id, _)| *id).collect(),
        top: rows.iter().map(|(_, _, top)| top_of(top)).collect(),
    }
}

/// Ends the call's record; dropped unfinished, it records the client's hang-up.
struct CallGuard {
    shared: Arc<Shared>,
    seq: u64,
    done: bool,
    live: Option<LiveHandle>,
}

impl CallGuard {
    fn finish(
        &mut self,
        code: Code,
        error: Option<String>,
        finish_reason: Option<String>,
        tokens: Option<u64>,
        aborted: bool,
    ) {
        self.done = true;
        let name = code_name(code);
        self.shared
            .counters
            .with(|c| *c.by_grpc_code.entry(name.to_string()).or_default() += 1);
        self.shared.recorder.update(self.seq, |r| {
            r.outcome.grpc_code = Some(name.to_string());
            r.outcome.done_at_ms = Some(now_ms());
            r.outcome.error = error;
            r.outcome.finish_reason = finish_reason;
            r.outcome.completion_tokens = tokens;
            r.outcome.aborted = aborted;
        });
    }

    fn finish_status(&mut self, st: &Status) {
        self.finish(st.code(), Some(st.message().to_string()), None, None, false);
    }
}

/// A gRPC call's guard dropped (`Generate` or an encoder's `Encode`): the call leaves the
/// in-flight count and, unless it finished, is recorded as cancelled by its client.
pub(crate) fn call_ended(shared: &Shared, seq: u64, done: bool) {
    // Recorded before the count drops: whoever waits for the engine to be idle then reads the
    // call's final outcome.
    if !done {
        shared.recorder.update(seq, |r| {
            r.outcome.cancelled = true;
            r.outcome.done_at_ms = Some(now_ms());
            if r.outcome.error.is_none() {
                r.outcome.error = Some("client cancelled the call".into());
            }
        });
    }
    shared
        .counters
        .with(|c| c.in_flight = c.in_flight.saturating_sub(1));
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        call_ended(&self.shared, self.seq, self.done);
    }
}

fn push_record(shared: &Shared, call: &Call) -> u64 {
    let seq = shared.recorder.push(RequestRecord {
        arrive_ms: now_ms(),
        method: "POST".into(),
        path: call.method_path.into(),
        headers: call.request.metadata.clone(),
        body: serde_json::to_value(&call.request).unwrap_or_default(),
        client_addr: call.peer.map(|p| p.to_string()).unwrap_or_default(),
        parsed: parsed_fields(&call.request, None, &Value::Null),
        handoff: Handoff {
            role: shared.cfg.role.as_str().into(),
            protocol: protocol_name(&shared.cfg),
            ..Default::default()
        },
        grpc: Some(call.request.clone()),
        mm: call.mm.clone(),
        ..Default::default()
    });
    shared.counters.with(|c| {
        if let Some(mm) = &call.mm {
            c.mm_requests += 1;
            c.mm_pixel_requests += u64::from(mm.pixels);
        }
        c.requests_total += 1;
        c.in_flight += 1;
        *c.by_route.entry(call.method_path.to_string()).or_default() += 1;
    });
    seq
}

/// The handoff fields of a gRPC request, in the HTTP record's shape.
fn parsed_fields(r: &GrpcRequest, job: Option<&Job>, body: &Value) -> ParsedFields {
    let b = r.bootstrap.as_ref();
    ParsedFields {
        stream: r.stream,
        max_tokens_effective: job
            .and_then(|j| j.items.first())
            .map(|i| i.spec.max_new_tokens as u64),
        n: Some(r.sampling.n.max(1) as u64),
        ignore_eos: Some(r.sampling.ignore_eos),
        stop: (!r.sampling.stop.is_empty()).then(|| json!(r.sampling.stop)),
        bootstrap_host: b.map(|b| json!(b.host)),
        bootstrap_port: b.map(|b| json!(b.port)),
        bootstrap_room: b.map(|b| json!(b.room)),
        routed_dp_rank: r.data_parallel_rank.map(|d| json!(d)),
        disagg_prefill_dp_rank: None,
        kv_transfer_params: body.get("kv_transfer_params").cloned(),
        has_stream_options: false,
        min_tokens: Some(json!(r.sampling.min_new_tokens)),
    }
}
