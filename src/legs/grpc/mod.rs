//! PD legs over gRPC: `grpc://` workers are another transport for the same attempt loop (same
//! pair selection, retries, breakers, ledger and metrics as HTTP), but the gateway prepares
//! the engine's input itself and turns its token stream into the client's response.
//!
//! `prepare` (once per request: convert, template, tokenize) → `build` (each engine's
//! `GenerateRequest`; the prompt's ids encoded once for every leg, `prompt_wire`) →
//! `parallel` (SGLang, TokenSpeed) or `sequential` (vLLM) over `leg` (a `Generate` call that
//! aborts itself when dropped, through `engine`) → `relay` (detokenize, stops, the route's JSON
//! or SSE).

pub mod build;
pub mod channel;
pub mod encode;
pub mod engine;
pub mod leg;
pub mod media;
pub mod mm_inputs;
pub mod parallel;
pub mod prepare;
pub mod prompt_wire;
pub mod relay;
pub mod sequential;

pub use channel::LegChannel;

use std::sync::Arc;
use std::time::{Duration, Instant};

use pdgate_filters::errors::{grpc_status_to_http, ErrorCode};
use pdgate_filters::handoff::vllm::Connector;
use pingora::proxy::Session;
use tonic::Status;

use self::engine::{Engine, Message};
use self::leg::GrpcLeg;
use self::prepare::Prepared;
use super::dispatch::Attempt;
use super::parallel::PdLabels;
use super::request::PdRequest;
use crate::gateway::{Gateway, Settings};
use crate::ledger::Handoff;
use crate::metrics::METRICS;
use crate::proxy::ctx::RequestCtx;
use crate::reply::Reply;
use crate::workers::select::Pair;
use crate::workers::Worker;

/// One gRPC attempt on `pair`. `prepared` holds the request's conversion and tokens across
/// attempts (computed on the first); `slot` receives the rendezvous the attempt opens.
#[allow(clippy::too_many_arguments)]
pub async fn attempt(
    gw: &Gateway,
    settings: &Settings,
    session: &mut Session,
    ctx: &mut RequestCtx,
    req: &PdRequest,
    pair: &Pair,
    prepared: &mut Option<Arc<Prepared>>,
    slot: &mut Option<Arc<Handoff>>,
) -> Attempt {
    let runtime = pair.prefill.runtime();
    let Some(engine) = Engine::of(runtime) else {
        return Attempt::Refused(Reply::error(
            ErrorCode::RuntimePdNotSupported,
            format!(
                "the selected runtime ({}) has no PD protocol over gRPC; PD legs need SGLang, \
                 vLLM or TokenSpeed workers",
                runtime.as_str()
            ),
        ));
    };
    if Engine::of(pair.decode.runtime()) != Some(engine) {
        return Attempt::Refused(Reply::error(
            ErrorCode::NoCompatiblePdPair,
            "gRPC PD keeps both legs on one runtime; the selected pair mixes two",
        ));
    }
    let moriio = |w: &Worker| Connector::from_name(w.kv_connector()) == Connector::MoriIo;
    if moriio(&pair.prefill) || moriio(&pair.decode) {
        return Attempt::Refused(Reply::error(
            ErrorCode::MoriioGrpcPdUnsupported,
            "MoRI-IO PD is supported only by the HTTP PD router; register the engines' HTTP endpoints",
        ));
    }
    if req.route == pdgate_filters::Route::Responses && gw.config().epd_disaggregation {
        return Attempt::Refused(Reply::error_with_status(
            501,
            ErrorCode::FeatureNotSupported,
            "EPD mode does not serve /v1/responses; use /v1/chat/completions or /v1/messages",
        ));
    }
    let p = match prepared {
        Some(p) => p.clone(),
        None => {
            let prep = tokio::select! {
                p = prepare::prepare(gw, req, pair) => p,
                _ = session.read_body_or_idle(true) => return Attempt::ClientGone,
            };
            match prep {
                Ok(p) => prepared.insert(p).clone(),
                Err(reply) => return Attempt::Refused(reply),
            }
        }
    };
    if let Some(m) = &p.media {
        if gw.config().epd_disaggregation && engine != Engine::TokenSpeed {
            return Attempt::Refused(Reply::error(
                ErrorCode::MultimodalNotSupported,
                format!(
                    "EPD serves media on TokenSpeed workers only; the selected pair runs {}",
                    runtime.as_str()
                ),
            ));
        }
        if let Err(reply) =
            media::check_language_model_only_decode(m, &pair.decode, p.gen.sampling.n.max(1))
        {
            return Attempt::Refused(reply);
        }
    }
    // Context length: the smaller window of the two legs (a leg that reports none is not
    // checked), before any leg goes out.
    let window = [pair.prefill.context_length(), pair.decode.context_length()]
        .into_iter()
        .flatten()
        .min();
    if let Some(window) = window {
        if p.prompt_ids.len() > window as usize {
            return Attempt::Refused(Reply::error(
                ErrorCode::ContextLengthExceeded,
                format!(
                    "the prompt has {} tokens, more than the context window of the selected \
                     workers ({window} tokens)",
                    p.prompt_ids.len()
                ),
            ));
        }
    }
    // The decode admission window: one slot per backend request on the decode.
    let n = p.gen.sampling.n.max(1) as usize;
    let slots = match super::admit::claim(settings, session, &pair.decode, n).await {
        Ok(slots) => slots,
        Err(refused) => return refused,
    };
    let legs = Legs {
        gw,
        settings,
        req,
        pair,
        base_id: p
            .gen
            .request_id
            .clone()
            .unwrap_or_else(|| ctx.request_id.clone()),
        labels: PdLabels::new(ctx, pair),
    };
    match engine {
        Engine::Vllm => Box::pin(sequential::attempt(&legs, session, ctx, &p, slots, slot)).await,
        _ => {
            Box::pin(parallel::attempt(
                &legs, session, ctx, &p, engine, slots, slot,
            ))
            .await
        }
    }
}

/// What the dispatch modes share for one attempt.
pub struct Legs<'a> {
    pub gw: &'a Gateway,
    /// The dispatch's settings, one snapshot for the whole request.
    pub settings: &'a Settings,
    pub req: &'a PdRequest,
    pub pair: &'a Pair,
    /// The client's request id (or the gateway's), the base of each attempt's engine id.
    base_id: String,
    labels: PdLabels,
}

impl Legs<'_> {
    /// The engine request id of one attempt: the same on both legs, new for every attempt (a
    /// NIXL prefill keeps an id alive until its KV lease expires, so a retry must not reuse it).
    pub fn attempt_request_id(&self) -> String {
        format!("{}-{}", self.base_id, crate::legs::uuid_v7())
    }

    pub fn labels(&self) -> &PdLabels {
        &self.labels
    }

    pub fn keyed(&self) -> bool {
        self.req.routing.routing_key.is_some()
    }

    /// The DP rank a leg to `w` carries (`--dp-aware` only).
    pub fn dp_rank(&self, w: &Worker) -> Option<i32> {
        if self.settings.dp_aware {
            w.address.dp_rank.map(|r| r as i32)
        } else {
            None
        }
    }

    /// The prefill's (rank, size) under `--dp-aware`, for rooms that land on its rank.
    pub fn prefill_dp(&self) -> Option<(u32, u32)> {
        let w = &self.pair.prefill;
        if self.settings.dp_aware {
            w.address.dp_rank.zip(w.dp_size())
        } else {
            None
        }
    }

    /// The prefill finished (duration from dispatch). Sequential (vLLM) pairs only: SMG records
    /// no prefill duration on parallel gRPC pairs (spec, "PD Metrics").
    pub fn prefill_done(&self, dispatched: Instant) {
        METRICS
            .pd_prefill_duration
            .with(&self.labels.as_array(), |m| {
                m.observe(dispatched.elapsed().as_secs_f64())
            });
    }
}

/// Relays an open decode leg to the client with the attempt's plan (both dispatch modes).
pub async fn relay_open_decode(
    legs: &Legs<'_>,
    session: &mut Session,
    ctx: &mut RequestCtx,
    p: &Prepared,
    decode: relay::Source<'_>,
    dispatched: Instant,
) -> Attempt {
    let s = legs.settings;
    let vllm = Engine::of(legs.pair.decode.runtime()) == Some(Engine::Vllm);
    let plan = relay::RelayPlan {
        prepared: p,
        streaming: p.gen.stream,
        dispatched,
        decode: &legs.pair.decode,
        stall_timeout: s.stream_idle_timeout,
        deadline: ctx.started + s.request_timeout,
        labels: legs.labels(),
        pd_ttft: p.gen.stream && !vllm,
        endpoint: legs.req.route.metric_endpoint(),
        read_cache_report: vllm,
    };
    relay::relay(session, ctx, decode, plan).await
}

/// A fresh room: SGLang's is an int32 (uniform in [0, 2^31-1)), TokenSpeed's 63 bits. Under
/// DP the room lands on the prefill's rank (`room % size == rank`), as TokenSpeed places by it.
pub fn mint_room(engine: Engine, dp: Option<(u32, u32)>) -> u64 {
    let bound: u64 = match engine {
        Engine::Sglang => i32::MAX as u64,
        _ => i64::MAX as u64,
    };
    let room = rand::random::<u64>() % bound;
    match dp {
        Some((rank, size)) if size > 1 && rank < size => {
            let size = u64::from(size);
            let aligned = room - room % size + u64::from(rank);
            if aligned >= bound {
                aligned - size
            } else {
                aligned
            }
        }
        _ => room,
    }
}

/// The answer when the engine refused a leg (`Generate` ended with a status before any message):
/// the leg's code with the status mapped to HTTP. Server-side statuses may be retried, and so
/// may RESOURCE_EXHAUSTED (429: that engine is full; another pair may have room, as SMG retries
/// it); the retry settings' status list has the last word.
pub fn leg_failed_to_start(leg: &str, status: &Status) -> Reply {
    let http = grpc_status_to_http(status.code() as i32);
    let code = if leg == "prefill" {
        ErrorCode::PrefillWorkerFailedToStart
    } else {
        ErrorCode::DecodeWorkerFailedToStart
    };
    Reply::error_with_status(
        http,
        code,
        format!("the {leg} worker refused the request: {}", status.message()),
    )
    .retryable(http >= 500 || http == 429)
}

/// The answer when a prefill did not answer within `prefill_head_timeout_secs` (both dispatch
/// modes): 504 `timeout`, retried on a new pair; the worker's leg is recorded as failed.
pub fn prefill_timed_out(prefill: &Worker, limit: Duration) -> Reply {
    prefill.record_leg(None);
    Reply::error(
        ErrorCode::Timeout,
        format!("the prefill worker did not answer within {limit:?} (prefill_head_timeout_secs)"),
    )
    .retryable(true)
}

/// A prefill stream that failed after it started (the decode cannot get its KV).
pub fn stream_failed(status: &Status) -> Reply {
    Reply::error(
        ErrorCode::PrefillStreamError,
        format!("the prefill stream failed: {}", status.message()),
    )
    .retryable(true)
}

/// Drains a parallel prefill that is still running after the decode started: it completes on
/// its own (no abort), bounded by `deadline`; its breaker outcome is recorded when it ends.
pub fn spawn_prefill_drain(mut prefill: GrpcLeg, handoff: Arc<Handoff>, deadline: Duration) {
    tokio::spawn(async move {
        let _handoff = handoff;
        let drained = tokio::time::timeout(deadline, async {
            loop {
                match prefill.next().await {
                    Ok(Some(Message::Chunk(_))) => continue,
                    Ok(Some(Message::Complete(_))) | Ok(None) => return Ok(()),
                    Err(status) => return Err(status),
                }
            }
        })
        .await;
        match drained {
            Ok(Ok(())) => {
                prefill.completed();
                prefill.worker.record_leg(Some(200));
            }
            Ok(Err(status)) => prefill
                .worker
                .record_leg(Some(grpc_status_to_http(status.code() as i32))),
            // Past its deadline: dropped, so aborted.
            Err(_) => prefill.worker.record_leg(None),
        }
    });
}

/// `/v1/messages/count_tokens` for a gRPC fleet: the Anthropic body rendered with the chat
/// template and counted with the gateway's tokenizer (`{"input_tokens": N}`); no leg is
/// contacted. `source`: the prefill whose reported tokenizer path is the fallback source.
pub async fn count_tokens(
    gw: &Gateway,
    session: &mut Session,
    source: Arc<crate::workers::Worker>,
) -> Reply {
    let s = gw.settings();
    let body = match crate::proxy::body::read_body(session, s.max_payload_size, s.body_read_timeout)
        .await
    {
        Ok(b) => b,
        Err(refusal) => return refusal.reply,
    };
    let top = match pdgate_filters::scan_object(&body) {
        Ok(t) => t,
        Err(e) => return Reply::error(ErrorCode::JsonParseError, e.to_string()),
    };
    let gen = match pdgate_convert::convert_request(pdgate_filters::Route::Messages, &body, &top) {
        Ok(g) => g,
        Err(e) => return Reply::error_with_status(e.status(), e.code(), e.to_string()),
    };
    let tokenizer = match gw.models.tokenizer(|| source.tokenizer_source()).await {
        Ok(t) => t,
        Err(why) => return Reply::error(ErrorCode::TokenizerUnavailable, why),
    };
    let pdgate_convert::Input::Chat(chat) = &gen.input else {
        return Reply::error(ErrorCode::InvalidRequest, "field `messages` is required");
    };
    let rendered = tokenizer.render_chat(&pdgate_tokenize::ChatInput {
        messages: &chat.messages,
        tools: chat
            .tools
            .as_ref()
            .and_then(|t| t.as_array())
            .map(Vec::as_slice),
        documents: None,
        add_generation_prompt: chat.add_generation_prompt,
        continue_final_message: chat.continue_final_message,
        template_kwargs: chat.chat_template_kwargs.as_ref(),
    });
    let text = match rendered {
        Ok(t) => t,
        Err(e) => {
            return Reply::error(
                ErrorCode::InvalidRequest,
                format!("the chat template could not render these messages: {e}"),
            )
        }
    };
    let counted = if text.len() >= 8 * 1024 {
        let tok = tokenizer.clone();
        tokio::task::spawn_blocking(move || tok.count_tokens(&text, false))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
    } else {
        tokenizer
            .count_tokens(&text, false)
            .map_err(|e| e.to_string())
    };
    match counted {
        Ok(n) => Reply::json(200, format!("{{\"input_tokens\":{n}}}")),
        Err(e) => Reply::error(
            ErrorCode::InvalidRequest,
            format!("could not tokenize: {e}"),
        ),
    }
}
