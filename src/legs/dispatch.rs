//! The attempt loop of a PD request: select a pair, run the engine's dispatch mode, and retry
//! with a new pair (and a new rendezvous) while nothing has reached the client and the outcome
//! is retryable. Pingora never retries a POST after connect, so retries are ours.

use std::time::Instant;

use pingora::proxy::Session;

use super::request::PdRequest;
use super::{admit, fanout, grpc, handoff, moriio, parallel, sequential};
use crate::config::RuntimeType;
use crate::gateway::{jittered_backoff, Gateway, Settings};
use crate::in_box::in_box;
use crate::ledger::Handoff;
use crate::metrics::{METRICS, UNKNOWN_MODEL};
use crate::policy::RoutingInput;
use crate::proxy::ctx::RequestCtx;
use crate::reply::{self, Reply};
use crate::workers::select::{select_pair, Pair, SelectError};

/// How one attempt ended.
pub enum Attempt {
    /// The response went to the client in full.
    Answered,
    /// The client went away; every leg was dropped.
    ClientGone,
    /// Nothing reached the client: answer this, or retry when allowed.
    Refused(Reply),
    /// The head went out but the decode failed mid-body; the client response must be cut.
    CutShort(String),
    /// A stream ended early with an SSE error event (complete response, failed request).
    EndedWithError(String),
}

impl Attempt {
    /// Marks the attempt's rendezvous as abnormal unless the response went out in full.
    pub fn settle(self, handoff: &Handoff) -> Attempt {
        if !matches!(self, Attempt::Answered) {
            handoff.failed();
        }
        self
    }
}

/// A link canary's pair: both workers by id, ready — whatever the link's health (a canary is
/// how an open link is probed without user traffic).
fn pinned_pair(
    snap: &crate::workers::Snapshot,
    (prefill, decode): &(String, String),
) -> Result<Pair, SelectError> {
    let ready = |id: &str| {
        snap.by_id(id)
            .filter(|w| w.status() == crate::workers::Status::Ready)
            .cloned()
    };
    let prefill = ready(prefill).ok_or(SelectError::NoneAvailable(
        crate::config::WorkerType::Prefill,
    ))?;
    let decode = ready(decode).ok_or(SelectError::NoneAvailable(
        crate::config::WorkerType::Decode,
    ))?;
    Ok(Pair { prefill, decode })
}

/// How the whole request ended, for the proxy phase.
pub enum Served {
    Answered,
    /// The connection must be closed without finishing the response.
    Abort(String),
}

impl Served {
    /// The client went away: marked on the request, and its connection closed.
    fn client_gone(ctx: &mut RequestCtx) -> Served {
        ctx.client_gone = true;
        Served::Abort("client closed the connection".into())
    }
}

/// One attempt over HTTP legs, in the dispatch mode of the pair.
async fn http_attempt(
    gw: &Gateway,
    settings: &Settings,
    session: &mut Session,
    ctx: &mut RequestCtx,
    req: &PdRequest,
    pair: &Pair,
) -> Attempt {
    // A MoRI-IO decode decides the path (it cannot recompute, so it never falls back); otherwise
    // the prefill's runtime picks the dispatch mode. A MoRI-IO prefill paired with anything else
    // is refused there too ("a leg that is not a MoRIIOConnector worker"), rather than silently
    // running passthrough.
    if moriio::is_moriio(&pair.decode) || moriio::is_moriio(&pair.prefill) {
        return in_box(|| moriio::attempt(gw, settings, session, ctx, req, pair)).await;
    }
    let mut slot = None;
    let outcome = if pair.prefill.runtime() == RuntimeType::Vllm {
        in_box(|| sequential::attempt(gw, settings, session, ctx, req, pair, &mut slot)).await
    } else if pdgate_filters::fanout::fans_out(req.route, &req.facts) {
        // SGLang would put every sample in one room: one rendezvous per sample instead.
        return in_box(|| fanout::attempt(gw, settings, session, ctx, req, pair)).await;
    } else {
        in_box(|| parallel::attempt(gw, settings, session, ctx, req, pair, &mut slot)).await
    };
    match slot {
        Some(handoff) => outcome.settle(&handoff),
        None => outcome,
    }
}

pub async fn serve(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut RequestCtx,
    req: &PdRequest,
) -> Served {
    let settings = gw.settings();
    // gRPC legs: the request converted and tokenized once, on its first gRPC attempt.
    let mut prepared = None;
    loop {
        ctx.attempts += 1;
        let outcome = match choose(gw, ctx, req, &settings) {
            Err(refused) => refused,
            Ok(pair) => {
                ctx.pair = Some(pair.clone());
                (ctx.room, ctx.transfer_id, ctx.connector) = (None, None, None);
                ctx.kv_verdict = Default::default();
                let outcome = if pair.prefill.is_grpc() {
                    let mut slot = None;
                    let outcome = Box::pin(grpc::attempt(
                        gw,
                        &settings,
                        session,
                        ctx,
                        req,
                        &pair,
                        &mut prepared,
                        &mut slot,
                    ))
                    .await;
                    match slot {
                        Some(handoff) => outcome.settle(&handoff),
                        None => outcome,
                    }
                } else {
                    // The decode's admission window (every transport): the slots are held until
                    // the attempt, and with it every decode leg, has ended.
                    let sequences = req.facts.decode_sequences(req.route);
                    match admit::claim(&settings, session, &pair.decode, sequences).await {
                        Err(refused) => refused,
                        Ok(_slots) => {
                            in_box(|| http_attempt(gw, &settings, session, ctx, req, &pair)).await
                        }
                    }
                };
                handoff::account(&settings, ctx, &pair, &outcome);
                outcome
            }
        };
        match outcome {
            Attempt::Answered => return Served::Answered,
            Attempt::EndedWithError(why) => {
                log::warn!(
                    "request {}: stream ended with an error event: {why}",
                    ctx.request_id
                );
                return Served::Answered;
            }
            Attempt::ClientGone => return Served::client_gone(ctx),
            Attempt::CutShort(why) => return Served::Abort(why),
            // Boxed: a refusal is rare, and inline its state (the reply, the backoff, the
            // answer's write) would size this future, which lives as long as every stream.
            Attempt::Refused(reply) => {
                match Box::pin(after_refusal(session, ctx, req, &settings, reply)).await {
                    Some(served) => return served,
                    None => continue,
                }
            }
        }
    }
}

/// This attempt's pair (a canary's link when the request is pinned to one), or the refusal
/// when none can be chosen. A plain function: what selection needs (the registry's snapshot, the
/// policies, the routing input) is not kept across the attempt.
fn choose(
    gw: &Gateway,
    ctx: &RequestCtx,
    req: &PdRequest,
    settings: &Settings,
) -> Result<Pair, Attempt> {
    let snap = gw.registry.snapshot();
    let chosen = match &req.routing.pinned {
        Some(link) => pinned_pair(&snap, link),
        None => {
            let input = RoutingInput {
                text: req.routing.text.as_deref(),
                token_ids: req.routing.token_ids.as_deref(),
                routing_key: req.routing.routing_key.as_deref(),
                target_worker: req.routing.target_worker.as_deref(),
                implicit_key: req.routing.implicit_key.as_deref(),
                prompt_len: req
                    .routing
                    .text
                    .as_ref()
                    .map(|t| t.chars().count())
                    .or(req.routing.token_ids.as_ref().map(Vec::len))
                    .unwrap_or(0),
            };
            let label = ctx.model_label.as_deref().unwrap_or(UNKNOWN_MODEL);
            let model = req.facts.model.as_deref();
            select_pair(&snap, model, &gw.policies.load(), &input, label)
        }
    };
    chosen.map_err(|e| match e {
        // An overload shed is final (SMG marks it terminal) and tells the client when to come
        // back; other selection failures may clear up on a retry.
        SelectError::Overloaded(_) => Attempt::Refused(
            Reply::error(e.code(), e.message())
                .with_retry_after(settings.overload_retry_after_secs),
        ),
        _ => Attempt::Refused(Reply::error(e.code(), e.message()).retryable(true)),
    })
}

/// After a refused attempt: waits the backoff and says `None` (retry with a new pair) while a
/// retry is allowed, otherwise answers the refusal.
async fn after_refusal(
    session: &mut Session,
    ctx: &mut RequestCtx,
    req: &PdRequest,
    settings: &Settings,
    reply: Reply,
) -> Option<Served> {
    let retry = &settings.retry;
    let deadline = ctx.started + settings.request_timeout;
    let backoff = jittered_backoff(retry, ctx.attempts - 1);
    // A canary's outcome belongs to its link: no other pair is tried.
    let retryable =
        reply.retryable && retry.is_retryable_status(reply.status) && req.routing.pinned.is_none();
    let may_retry =
        retryable && ctx.attempts < retry.max_attempts && Instant::now() + backoff < deadline;
    let endpoint = req.route.metric_endpoint();
    // Both legs are counted: a refused attempt retries the pair.
    let count_both_legs = |counter: &pingora_prometheus::prometheus::IntCounterVec| {
        for leg in ["prefill", "decode"] {
            counter.with_label_values(&[leg, endpoint]).inc();
        }
    };
    if may_retry {
        count_both_legs(&METRICS.worker_retries);
        METRICS
            .worker_retry_backoff
            .with_label_values(&[&ctx.attempts.to_string()])
            .observe(backoff.as_secs_f64());
        log::debug!(
            "request {} attempt {} refused ({}), retrying with a new pair",
            ctx.request_id,
            ctx.attempts,
            reply.status
        );
        return tokio::select! {
            _ = tokio::time::sleep(backoff) => None,
            _ = session.read_body_or_idle(true) => Some(Served::client_gone(ctx)),
        };
    }
    if retryable {
        count_both_legs(&METRICS.worker_retries_exhausted);
    }
    Some(match reply::send(session, ctx, reply).await {
        Ok(()) => Served::Answered,
        Err(e) => Served::Abort(e.to_string()),
    })
}
