//! MoRI-IO over HTTP (vLLM `MoRIIOConnector`): READ and WRITE handoffs, sequential by default,
//! concurrent WRITE on opt-in (the decode worker's `moriio_write_dispatch: concurrent`).
//!
//! Taken whenever the decode worker is a MoRI-IO worker. A MoRI-IO decode engine never
//! recomputes the prompt, and it parses the handoff in its scheduler step, where a malformed
//! field breaks the engine rather than one request. So a decode leg never goes out without a
//! valid handoff: a misconfigured pair or a request that would share one handoff is refused before
//! any leg is contacted, and an unusable handoff fails the attempt (502 `moriio_handoff_invalid`)
//! — under sequential dispatch before the decode leg is sent, under concurrent dispatch by
//! dropping the decode leg already in flight, whose response is held back until the handoff
//! passed. The checks themselves live in `pdgate_filters::handoff::moriio`.

use std::borrow::Cow;
use std::time::Instant;

use bytes::Bytes;
use pdgate_filters::body::BodyParts;
use pdgate_filters::errors::ErrorCode;
use pdgate_filters::handoff::moriio::{self, HandoffExpectation, MoriPlan, MoriWorker};
use pdgate_filters::handoff::vllm::{self, Connector};
use pingora::proxy::Session;

use super::client::{spliced_body, LegError, LegErrorKind, LegRequest, OpenLeg};
use super::dispatch::Attempt;
use super::parallel::{decode_refusal, transport_refusal, PdLabels};
use super::request::{ForwardHeaders, PdRequest};
use super::sequential::{finish, mint_transfer_id, prefill_round_trip};
use crate::config::label;
use crate::gateway::{Gateway, Settings};
use crate::ledger::Kind;
use crate::metrics::METRICS;
use crate::proxy::ctx::RequestCtx;
use crate::reply::Reply;
use crate::trace::{self, LegFacts, LegRole, LegTrace, LegTransport};
use crate::workers::select::Pair;
use crate::workers::Worker;

/// The request header vLLM takes its request id from (and the connector its peer markers).
const X_REQUEST_ID: &str = "x-request-id";

/// Whether a worker speaks MoRI-IO (its connector: registered, or reported by a gRPC engine).
pub fn is_moriio(w: &Worker) -> bool {
    Connector::from_name(w.kv_connector()) == Connector::MoriIo
}

pub async fn attempt(
    gw: &Gateway,
    settings: &Settings,
    session: &mut Session,
    ctx: &mut RequestCtx,
    req: &PdRequest,
    pair: &Pair,
) -> Attempt {
    let plan = match preflight(ctx, req, pair) {
        Ok(plan) => plan,
        Err(reply) => return Attempt::Refused(reply),
    };
    METRICS
        .pd_kv_connector_mode
        .with_label_values(&[Connector::MoriIo.mode_label()])
        .inc();
    let transfer_id = mint_transfer_id();
    ctx.connector = Some(Connector::MoriIo.mode_label());
    ctx.transfer_id = Some(transfer_id.clone());
    let legs = Legs {
        gw,
        settings,
        req,
        pair,
        expect: HandoffExpectation {
            transfer_id: &transfer_id,
            told_ports: plan.told_ports(),
        },
        labels: PdLabels::new(ctx, pair),
        dispatched: Instant::now(),
    };
    let tag = moriio::prefill_tag(&plan, &transfer_id);
    let prefill_body = spliced_body(&req.body, |out| {
        moriio::prefill_leg_body_into(out, req.route, &req.body, &req.top, &tag)
    });
    log::debug!(
        "request {} MoRI-IO {:?} {:?} pair {} -> {} transfer_id={transfer_id}",
        ctx.request_id,
        plan.mode,
        plan.dispatch,
        pair.prefill.url(),
        pair.decode.url(),
    );
    let handoff = gw.ledger.open(
        Kind::TransferId,
        &transfer_id,
        &ctx.request_id,
        &pair.prefill,
        &pair.decode,
    );
    let outcome = if plan.is_concurrent() {
        let decode_params = moriio::concurrent_decode_params(&plan, &transfer_id);
        concurrent(&legs, session, ctx, prefill_body, &decode_params).await
    } else {
        sequential(&legs, session, ctx, prefill_body).await
    };
    outcome.settle(&handoff)
}

/// What both dispatch modes share for one attempt.
struct Legs<'a> {
    gw: &'a Gateway,
    /// The dispatch's settings, one snapshot for the whole request.
    settings: &'a Settings,
    req: &'a PdRequest,
    pair: &'a Pair,
    expect: HandoffExpectation<'a>,
    labels: PdLabels,
    /// When the prefill leg went out (TTFT and prefill-duration origin).
    dispatched: Instant,
}

impl<'a> Legs<'a> {
    fn route_path(&self) -> &'static str {
        self.req.route.upstream_path()
    }

    /// A leg to `worker` at `path` (its URL's path prefix applied) carrying `headers` (the
    /// client's forwarded headers, with the leg's trace context when traced).
    fn leg<'r>(
        &'r self,
        worker: &'r Worker,
        path: &'r str,
        headers: &'r ForwardHeaders,
        body: BodyParts,
    ) -> LegRequest<'r> {
        LegRequest {
            answer_headers: super::client::AnswerHeaders::All,
            method: "POST",
            path,
            host: &worker.address.authority,
            headers: headers.as_slice(),
            body,
        }
    }

    /// The span of one of this attempt's legs (`None` when the request is not traced) and the
    /// headers that leg sends (its own trace context when traced).
    fn traced(&self, ctx: &RequestCtx, role: LegRole) -> (LegTrace, Cow<'a, ForwardHeaders>) {
        let worker = match role {
            LegRole::Prefill => &self.pair.prefill,
            LegRole::Decode => &self.pair.decode,
        };
        let span = trace::leg(ctx, role, LegTransport::Http, worker, LegFacts::default());
        let headers = self.req.forward.traced(span.as_deref());
        (span, headers)
    }

    /// Relays the decode response (the handoff passed) to the client.
    async fn relay(&self, session: &mut Session, ctx: &mut RequestCtx, decode: OpenLeg) -> Attempt {
        let (gw, req, pair) = (self.gw, self.req, self.pair);
        finish(
            gw,
            self.settings,
            session,
            ctx,
            req,
            pair,
            decode,
            self.dispatched,
            self.labels.clone(),
        )
        .await
    }

    /// A decode that answered non-2xx: its status and body, mapped as for any decode.
    async fn decode_refused(&self, leg: OpenLeg) -> Attempt {
        self.pair.decode.record_leg(Some(leg.status()));
        Attempt::Refused(decode_refusal(leg, self.req.facts.stream).await)
    }

    /// The decode's head may take the whole request when it is not streamed (it answers only
    /// when done).
    fn decode_head_timeout(&self) -> std::time::Duration {
        let s = self.settings;
        if self.req.facts.stream {
            s.decode_first_byte_timeout
        } else {
            s.request_timeout
        }
    }

    fn prefill_done(&self) {
        METRICS
            .pd_prefill_duration
            .with(&self.labels.as_array(), |m| {
                m.observe(self.dispatched.elapsed().as_secs_f64())
            });
    }

    /// The prefill's `kv_transfer_params`, if they are a handoff the decode engine can use.
    fn check_handoff(&self, ctx: &RequestCtx, response: &Bytes) -> Result<Bytes, Reply> {
        match moriio::validate_handoff(response, &self.expect) {
            Ok(params) => Ok(response.slice_ref(params)),
            Err(reason) => {
                METRICS.pd_kv_transfer_failures.inc();
                log::warn!(
                    "request {} MoRI-IO prefill {} returned an unusable handoff: {reason}",
                    ctx.request_id,
                    self.pair.prefill.url()
                );
                // Another pair (and a new transfer id) may well work: retryable.
                Err(Reply::error(
                    ErrorCode::MoriioHandoffInvalid,
                    "the MoRI-IO prefill returned no usable KV handoff (see the gateway log)",
                )
                .retryable(true))
            }
        }
    }
}

/// Sequential dispatch (READ, and WRITE by default): the prefill leg, the handoff check, then
/// the decode leg with the prefill's params verbatim.
async fn sequential(
    legs: &Legs<'_>,
    session: &mut Session,
    ctx: &mut RequestCtx,
    prefill_body: BodyParts,
) -> Attempt {
    let (gw, s, req, pair) = (legs.gw, legs.settings, legs.req, legs.pair);
    let prefill_path = pair.prefill.address.path_for(legs.route_path());
    let (prefill_trace, prefill_headers) = legs.traced(ctx, LegRole::Prefill);
    let prefill_req = legs.leg(&pair.prefill, &prefill_path, &prefill_headers, prefill_body);
    let prefill_in_flight = pair.prefill.track(req.routing.routing_key.is_some());
    let response = tokio::select! {
        r = prefill_round_trip(gw, &pair.prefill, &prefill_req, s.prefill_head_timeout, s.max_payload_size, prefill_trace) => r,
        _ = session.read_body_or_idle(true) => return Attempt::ClientGone,
    };
    drop(prefill_in_flight);
    let response = match response {
        Ok(b) => b,
        Err(reply) => return Attempt::Refused(reply),
    };
    legs.prefill_done();
    let params = match legs.check_handoff(ctx, &response) {
        Ok(p) => p,
        Err(reply) => return Attempt::Refused(reply),
    };

    let _decode_in_flight = pair.decode.track(req.routing.routing_key.is_some());
    let decode_path = pair.decode.address.path_for(legs.route_path());
    let decode_body = spliced_body(&req.body, |out| {
        vllm::decode_leg_body_into(out, &req.body, &req.top, Some(&params), &[])
    });
    let (mut decode_trace, decode_headers) = legs.traced(ctx, LegRole::Decode);
    let decode_req = legs.leg(&pair.decode, &decode_path, &decode_headers, decode_body);
    let opened = tokio::select! {
        r = gw.client.open_traced(&pair.decode.peer, &decode_req, legs.decode_head_timeout(), &mut decode_trace) => r,
        _ = session.read_body_or_idle(true) => return Attempt::ClientGone,
    };
    let decode = match opened {
        Err(e) => return Attempt::Refused(decode_failed(pair, &e)),
        Ok(leg) if !leg.is_success() => return legs.decode_refused(leg).await,
        Ok(leg) => leg,
    };
    legs.relay(session, ctx, decode).await
}

/// How the concurrent legs came out, decided before either is relayed.
enum Concurrent {
    /// A 2xx decode head, and the prefill's handoff passed.
    Relay(OpenLeg),
    /// The decode refused the request (it takes no push; no need to wait for the prefill).
    DecodeRefused(OpenLeg),
    Refused(Reply),
    ClientGone,
}

/// Concurrent WRITE dispatch: both legs at once, the decode's params minted up front. The first
/// leg to fail ends the attempt and the other is dropped; the decode response, even one that
/// already arrived, is relayed only once the prefill's handoff passed (ports included).
async fn concurrent(
    legs: &Legs<'_>,
    session: &mut Session,
    ctx: &mut RequestCtx,
    prefill_body: BodyParts,
    decode_params: &[u8],
) -> Attempt {
    let (gw, s, req, pair) = (legs.gw, legs.settings, legs.req, legs.pair);
    let prefill_path = pair.prefill.address.path_for(legs.route_path());
    let (prefill_trace, prefill_headers) = legs.traced(ctx, LegRole::Prefill);
    let prefill_req = legs.leg(&pair.prefill, &prefill_path, &prefill_headers, prefill_body);
    let decode_path = pair.decode.address.path_for(legs.route_path());
    let decode_body = spliced_body(&req.body, |out| {
        vllm::decode_leg_body_into(out, &req.body, &req.top, Some(decode_params), &[])
    });
    let (mut decode_trace, decode_headers) = legs.traced(ctx, LegRole::Decode);
    let decode_req = legs.leg(&pair.decode, &decode_path, &decode_headers, decode_body);
    let prefill_in_flight = pair.prefill.track(req.routing.routing_key.is_some());
    let _decode_in_flight = pair.decode.track(req.routing.routing_key.is_some());

    // Both legs live only inside this block: leaving it drops whichever is still open (its
    // connection closes, so its engine aborts the request) — a dropped leg records no outcome.
    let outcome = {
        let prefill = prefill_round_trip(
            gw,
            &pair.prefill,
            &prefill_req,
            s.prefill_head_timeout,
            s.max_payload_size,
            prefill_trace,
        );
        let decode = gw.client.open_traced(
            &pair.decode.peer,
            &decode_req,
            legs.decode_head_timeout(),
            &mut decode_trace,
        );
        tokio::pin!(prefill, decode);
        let mut decode_leg: Option<OpenLeg> = None;
        let mut handoff_ok = false;
        // A client that leaves while the prefill is still pushing: cutting now would leave the
        // decode's WRITE allocation waiting for a push that never comes (vLLM keeps those
        // blocks, vllm#59382). So the prefill is drained to its end (its own deadline) with the
        // decode still open, and only then are both dropped.
        let mut client_gone = false;
        let mut drain_until: Option<tokio::time::Instant> = None;
        loop {
            if handoff_ok {
                if client_gone {
                    break Concurrent::ClientGone;
                }
                if let Some(leg) = decode_leg.take() {
                    break Concurrent::Relay(leg);
                }
            }
            tokio::select! {
                d = &mut decode, if decode_leg.is_none() => match d {
                    Err(e) => break Concurrent::Refused(decode_failed(pair, &e)),
                    Ok(leg) if !leg.is_success() => break Concurrent::DecodeRefused(leg),
                    Ok(leg) => decode_leg = Some(leg),
                },
                p = &mut prefill, if !handoff_ok => match p {
                    Err(_) if client_gone => break Concurrent::ClientGone,
                    Err(reply) => break Concurrent::Refused(reply),
                    Ok(response) => {
                        legs.prefill_done();
                        match legs.check_handoff(ctx, &response) {
                            Ok(_) => handoff_ok = true,
                            Err(_) if client_gone => break Concurrent::ClientGone,
                            Err(reply) => break Concurrent::Refused(reply),
                        }
                    }
                },
                _ = session.read_body_or_idle(true), if !client_gone => {
                    client_gone = true;
                    drain_until = Some(tokio::time::Instant::now() + HANG_UP_DRAIN);
                }
                _ = sleep_until_opt(drain_until) => break Concurrent::ClientGone,
            }
        }
    };
    drop(prefill_in_flight);
    match outcome {
        Concurrent::Relay(decode) => legs.relay(session, ctx, decode).await,
        Concurrent::DecodeRefused(leg) => legs.decode_refused(leg).await,
        Concurrent::Refused(reply) => Attempt::Refused(reply),
        Concurrent::ClientGone => Attempt::ClientGone,
    }
}

/// How long a concurrent WRITE prefill may go on pushing after the client left, before both
/// legs are dropped anyway (as SMG bounds a decode abort waiting for its handoff). The
/// prefill's own head deadline applies too.
const HANG_UP_DRAIN: std::time::Duration = std::time::Duration::from_secs(30);

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// A decode leg that failed before its response head: a timeout, or 502 `decode_request_failed`.
fn decode_failed(pair: &Pair, e: &LegError) -> Reply {
    pair.decode.record_leg(None);
    if e.kind == LegErrorKind::Timeout {
        return transport_refusal("decode", e);
    }
    Reply::error(
        ErrorCode::DecodeRequestFailed,
        format!("Decode transport error: {e}"),
    )
    .retryable(true)
}

/// The refusals before any leg is contacted: the request checks (route 501, fan-out 400, a
/// reserved request id in the body or any forwarded `X-Request-Id` 400), then the pair check
/// (503 `moriio_pair_misconfigured`, counted as a transfer failure, the reason in the log).
/// None is retried: the request or the workers' configuration would have to change.
fn preflight(ctx: &RequestCtx, req: &PdRequest, pair: &Pair) -> Result<MoriPlan, Reply> {
    let request_refusal = moriio::check_request(req.route, &req.body, &req.top).and_then(|()| {
        let reserved = req
            .forward
            .all(X_REQUEST_ID)
            .any(|v| moriio::request_id_is_reserved(&String::from_utf8_lossy(v.as_bytes())));
        if reserved {
            Err(moriio::RequestRefusal::RequestIdReserved)
        } else {
            Ok(())
        }
    });
    if let Err(refusal) = request_refusal {
        return Err(Reply::error(refusal.code(), refusal.to_string()));
    }
    check_pair(pair).map_err(|reason| {
        METRICS.pd_kv_transfer_failures.inc();
        log::warn!(
            "request {} MoRI-IO pair {} -> {} is misconfigured: {reason}",
            ctx.request_id,
            pair.prefill.url(),
            pair.decode.url()
        );
        Reply::error(
            ErrorCode::MoriioPairMisconfigured,
            "the selected prefill/decode pair is not configured for MoRI-IO (see the gateway log)",
        )
    })
}

/// The pair check over the workers' registered facts; `Err` is the reason for the log.
fn check_pair(pair: &Pair) -> Result<MoriPlan, String> {
    let prefill_labels = |k: &str| pair.prefill.label(k);
    let decode_labels = |k: &str| pair.decode.label(k);
    let prefill = MoriWorker {
        connector: Connector::from_name(pair.prefill.kv_connector()),
        dp_size: dp_size("prefill", &pair.prefill)?,
        url_host: &pair.prefill.address.host,
        label: &prefill_labels,
    };
    let decode = MoriWorker {
        connector: Connector::from_name(pair.decode.kv_connector()),
        dp_size: dp_size("decode", &pair.decode)?,
        url_host: &pair.decode.address.host,
        label: &decode_labels,
    };
    moriio::check_pair(&prefill, &decode)
}

/// The worker's DP size: its own `dp_size`, else its `dp_size` label (which must then be a
/// positive integer: an unreadable one fails closed), else 1.
fn dp_size(role: &str, w: &Worker) -> Result<u32, String> {
    match (w.spec.dp_size, w.label(label::DP_SIZE)) {
        (Some(n), _) => Ok(n),
        (None, Some(text)) => text
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| {
                format!(
                    "{role} worker label `{}` must be a positive integer, got {text:?}",
                    label::DP_SIZE
                )
            }),
        (None, None) => Ok(1),
    }
}
