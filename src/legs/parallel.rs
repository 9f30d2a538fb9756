//! Parallel dispatch (SGLang): one rendezvous room, both legs sent at once, the decode streamed
//! back as soon as both heads are 2xx, the prefill drained in the background.
//!
//! Failure rule: the first leg that fails ends the attempt and the other leg is dropped at once
//! (its connection closes, so its engine aborts the room instead of waiting out its timeout).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pdgate_filters::body::BodyParts;
use pdgate_filters::errors::{
    decode_error, prefill_error, sse_error_event, upstream_error_message, ErrorCode,
};
use pdgate_filters::handoff::sglang::{self, BootstrapTarget, DpRanks, Leg, Rooms};
use pdgate_filters::logprobs::{prefill_input_logprobs, PrefillLogprobs};
use pingora::proxy::Session;

use super::client::{spliced_body, LegError, LegErrorKind, LegRequest, OpenLeg};
use super::dispatch::Attempt;
use super::handoff::KvVerdict;
use super::prefill::{PrefillEnd, PrefillHead, PrefillJob, PrefillLeg};
use super::relay::{relay_decode, RelayPlan};
use super::request::{ForwardHeaders, PdRequest};
use crate::gateway::{Gateway, Settings};
use crate::in_box::in_box;
use crate::ledger::{Handoff, Kind};
use crate::metrics::{BACKEND_PD, METRICS};
use crate::proxy::ctx::RequestCtx;
use crate::reply::{Reply, SSE};
use crate::trace::{self, LegFacts, LegRole, LegTrace, LegTransport};
use crate::workers::select::Pair;
use crate::workers::InFlight;

/// Largest decode error body read to build the client's message.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// Fresh rooms for one attempt: one per batch item, each uniform in [0, 2^63-1].
///
/// Under DP (`rank` of `size`), each room is chosen so that `room % size == rank`: engines that
/// place a request by its room (SGLang's `follow_bootstrap_room`, TokenSpeed) then agree with
/// the rank the gateway routed it to.
pub fn mint_rooms(batch: Option<usize>, dp: Option<(u32, u32)>) -> Rooms {
    let one = || {
        let room = sglang::room_from_bits(rand::random());
        match dp {
            Some((rank, size)) if size > 1 && rank < size => {
                let size = u64::from(size);
                let aligned = room - room % size + u64::from(rank);
                // Stay within [0, 2^63-1]: step back one period if the alignment overflowed it.
                if aligned > i64::MAX as u64 {
                    aligned - size
                } else {
                    aligned
                }
            }
            _ => room,
        }
    };
    match batch {
        None => Rooms::Single(one()),
        Some(n) => Rooms::Batch((0..n).map(|_| one()).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rooms_land_on_the_prefill_rank_under_dp() {
        for _ in 0..1000 {
            let Rooms::Single(r) = mint_rooms(None, Some((3, 4))) else {
                unreachable!()
            };
            assert_eq!(r % 4, 3);
            assert!(r <= i64::MAX as u64);
        }
        let Rooms::Batch(v) = mint_rooms(Some(5), Some((1, 2))) else {
            unreachable!()
        };
        assert!(v.iter().all(|r| r % 2 == 1));
    }
}

/// Where an attempt's rendezvous happens: the prefill's bootstrap server, and under `--dp-aware`
/// the ranks both legs carry and the (rank, size) its rooms must land on.
pub struct Rendezvous<'a> {
    pub dp_place: Option<(u32, u32)>,
    pub target: BootstrapTarget<'a>,
    pub dp: DpRanks,
}

impl<'a> Rendezvous<'a> {
    pub fn of(dp_aware: bool, pair: &'a Pair) -> Rendezvous<'a> {
        let (p, d) = (&pair.prefill, &pair.decode);
        Rendezvous {
            dp_place: if dp_aware {
                p.address.dp_rank.zip(p.spec.dp_size)
            } else {
                None
            },
            target: BootstrapTarget {
                host: &p.address.host,
                port: p.spec.bootstrap_port,
            },
            dp: if dp_aware {
                DpRanks {
                    prefill: p.address.dp_rank,
                    decode: d.address.dp_rank,
                }
            } else {
                DpRanks::default()
            },
        }
    }
}

/// Maps a transport failure on either leg (nothing usable came back).
pub fn transport_refusal(leg: &str, e: &LegError) -> Reply {
    if e.kind == LegErrorKind::Timeout {
        return Reply::error(ErrorCode::Timeout, format!("{leg} worker timed out: {e}"))
            .retryable(true);
    }
    Reply::error(
        ErrorCode::PdRequestFailed,
        format!("Transport error: {leg} {e}"),
    )
    .retryable(true)
}

/// One SGLang attempt. The rendezvous it opens is put in `slot` as soon as it exists, so the
/// caller can settle it however the attempt ends.
pub async fn attempt(
    gw: &Gateway,
    s: &Settings,
    session: &mut Session,
    ctx: &mut RequestCtx,
    req: &PdRequest,
    pair: &Pair,
    slot: &mut Option<Arc<Handoff>>,
) -> Attempt {
    let Rendezvous {
        dp_place,
        target,
        dp,
    } = Rendezvous::of(s.dp_aware, pair);
    let rooms = mint_rooms(req.facts.batch, dp_place);
    ctx.room = Some(match &rooms {
        Rooms::Single(r) => *r,
        Rooms::Batch(v) => v.first().copied().unwrap_or(0),
    });
    let dispatched = Instant::now();
    let labels = PdLabels::new(ctx, pair);
    // What outlives the opening: the prefill's logprob rows (the plan borrows them) and the
    // decode's in-flight count. Everything else is built in the block, so this future (held
    // for the life of the stream) keeps no room for it while the answer is relayed.
    let merge_source;
    let _decode_in_flight;
    let relayed = {
        // A large body's bytes are shared, not copied: each leg body is then pieces of the
        // client's around the gateway's fields.
        let body = |leg| {
            spliced_body(&req.body, |out| {
                sglang::leg_body_into(out, &req.body, &req.top, &target, &rooms, leg, &dp, &[])
            })
        };
        let prefill_body = body(Leg::Prefill);
        // Without DP ranks both legs carry the same bytes: one set of pieces, shared.
        let decode_body = if dp.prefill.is_none() && dp.decode.is_none() {
            prefill_body.clone()
        } else {
            body(Leg::Decode)
        };

        let handoff = gw.ledger.open(
            Kind::Room,
            ctx.room.unwrap_or_default(),
            &ctx.request_id,
            &pair.prefill,
            &pair.decode,
        );
        *slot = Some(handoff.clone());
        ctx.connector = Some("bootstrap");
        ctx.kv_verdict = KvVerdict::of_bootstrap_decode(&pair.decode);
        log::debug!(
            "request {} pair {} -> {} bootstrap_room={}",
            ctx.request_id,
            pair.prefill.url(),
            pair.decode.url(),
            ctx.room.unwrap_or_default()
        );
        let headers = req.forward.clone();
        let legs = SampleLegs::new(
            ctx,
            pair,
            [prefill_body, decode_body],
            headers,
            handoff,
            LegFacts::default(),
        );
        // Boxed: opening both legs is the attempt's largest state, and it ends before the
        // relay, which runs for the life of the stream; inline, every open stream would hold
        // its size.
        let opened = tokio::select! {
            biased;
            o = in_box(|| open_sample(gw, s, req, pair, &labels, legs)) => o,
            _ = session.read_body_or_idle(true) => return Attempt::ClientGone,
        };
        let OpenSample {
            decode,
            mut prefill,
            logprobs,
            _decode_in_flight: in_flight,
        } = match opened {
            Ok(open) => open,
            Err(reply) => return Attempt::Refused(reply),
        };
        (merge_source, _decode_in_flight) = (logprobs, in_flight);
        // The relay drives the prefill to its end; if the relay ends first, the prefill finishes
        // on its own — unless the decode ended before any output: it is then cancelled (see
        // `prefill::Abandoning`).
        prefill.detach();

        let plan = RelayPlan {
            streaming: req.facts.stream,
            logprobs: merge_source.as_ref().map(|o| o.as_ref()),
            dispatched,
            decode: &pair.decode,
            body_limit: s.max_payload_size,
            stall_timeout: s.stream_idle_timeout,
            deadline: ctx.started + s.request_timeout,
            prefill: Some(prefill),
            read_cache_report: false,
        };
        relay_decode(gw, session, ctx, pair, decode, plan, &labels)
    };
    relayed.await
}

/// What one rendezvous sends: the two leg bodies (the same room), the headers, its ledger entry,
/// and the legs' spans when the request is traced.
pub struct SampleLegs {
    pub prefill_body: BodyParts,
    pub decode_body: BodyParts,
    pub headers: ForwardHeaders,
    pub handoff: Arc<Handoff>,
    pub prefill_trace: LegTrace,
    pub decode_trace: LegTrace,
}

impl SampleLegs {
    /// The legs of one rendezvous of `pair` (its `[prefill, decode]` bodies), with their spans.
    pub fn new(
        ctx: &RequestCtx,
        pair: &Pair,
        [prefill_body, decode_body]: [BodyParts; 2],
        headers: ForwardHeaders,
        handoff: Arc<Handoff>,
        facts: LegFacts,
    ) -> SampleLegs {
        let span = |role, worker| trace::leg(ctx, role, LegTransport::Http, worker, facts);
        SampleLegs {
            prefill_body,
            decode_body,
            headers,
            handoff,
            prefill_trace: span(LegRole::Prefill, &pair.prefill),
            decode_trace: span(LegRole::Decode, &pair.decode),
        }
    }
}

/// One rendezvous whose legs both answered 2xx: the decode to relay, the prefill (still held:
/// dropping it cancels it, [`PrefillLeg::detach`] lets it drain; whoever holds it drives it and
/// watches it fail), and — when the client asked for logprobs — the prefill's prompt rows.
pub struct OpenSample {
    pub decode: OpenLeg,
    pub prefill: PrefillLeg,
    pub logprobs: Option<Option<PrefillLogprobs>>,
    /// The decode counted in flight for as long as its answer is relayed.
    pub _decode_in_flight: InFlight,
}

/// Sends both legs of one rendezvous at once and waits for both heads, the first failure
/// winning (the other leg is dropped with the future). A prefill that fails after its 2xx head
/// dooms the decode (it waits for KV that will not come), so it is watched meanwhile. The caller
/// watches the client.
pub async fn open_sample(
    gw: &Gateway,
    s: &Settings,
    req: &PdRequest,
    pair: &Pair,
    labels: &PdLabels,
    legs: SampleLegs,
) -> Result<OpenSample, Reply> {
    let mut prefill = PrefillLeg::new(PrefillJob {
        client: gw.client.clone(),
        worker: pair.prefill.clone(),
        path: pair.prefill.address.path_for(req.route.upstream_path()),
        body: legs.prefill_body,
        headers: legs
            .headers
            .traced(legs.prefill_trace.as_deref())
            .into_owned(),
        trace: legs.prefill_trace,
        handoff: legs.handoff,
        keyed: req.routing.routing_key.is_some(),
        keep_body: req.facts.logprobs,
        body_limit: s.max_payload_size,
        head_timeout: s.prefill_head_timeout,
        stall_timeout: s.stream_idle_timeout,
        on_end: {
            let labels = labels.clone();
            let worker = pair.prefill.clone();
            // The prefill's outcome is known only when its drain ends (SMG's newer behaviour);
            // a leg we dropped records nothing.
            Box::new(move |end| match end {
                PrefillEnd::Completed { duration, status } => {
                    worker.record_leg(Some(status));
                    if (200..300).contains(&status) {
                        METRICS
                            .pd_prefill_duration
                            .with(&labels.as_array(), |m| m.observe(duration.as_secs_f64()));
                    }
                }
                PrefillEnd::Failed(_) => worker.record_leg(None),
            })
        },
    });

    let decode_in_flight = pair.decode.track(req.routing.routing_key.is_some());
    let decode_path = pair.decode.address.path_for(req.route.upstream_path());
    let decode_headers = legs.headers.traced(legs.decode_trace.as_deref());
    let mut decode_trace = legs.decode_trace;
    let decode_req = LegRequest {
        answer_headers: super::client::AnswerHeaders::All,
        method: "POST",
        path: &decode_path,
        host: &pair.decode.address.authority,
        headers: decode_headers.as_slice(),
        body: legs.decode_body,
    };
    // A non-streamed decode answers only when it is done, so its head may take the whole request.
    let decode_head_timeout = if req.facts.stream {
        s.decode_first_byte_timeout
    } else {
        s.request_timeout
    };
    // Boxed so its state is freed once the head is in, instead of sizing this future (held
    // for the whole stream) by it.
    let mut decode_open = in_box(|| {
        gw.client.open_traced(
            &pair.decode.peer,
            &decode_req,
            decode_head_timeout,
            &mut decode_trace,
        )
    });

    // Both heads, first failure wins. Biased, the decode first: an in-task prefill is then
    // sent right after it, the order a prefill in its own task gets (it runs once this task
    // yields); A/B at c=1 slightly favoured it over prefill first.
    let mut decode: Option<OpenLeg> = None;
    let mut prefill_ok = false;
    while decode.is_none() || !prefill_ok {
        tokio::select! {
            biased;
            d = &mut decode_open, if decode.is_none() => match d {
                Err(e) => {
                    pair.decode.record_leg(None);
                    return Err(transport_refusal("decode", &e));
                }
                Ok(leg) if !leg.is_success() => {
                    drop(prefill);
                    pair.decode.record_leg(Some(leg.status()));
                    // Boxed: a rare path, which inline would size this future by a leg read.
                    return Err(Box::pin(decode_refusal(leg, req.facts.stream)).await);
                }
                Ok(leg) => decode = Some(leg),
            },
            p = prefill_step(&mut prefill, prefill_ok) => match p {
                // It failed after its 2xx head: the decode waits for KV that will not come.
                None => return Err(prefill_failed_after_head()),
                Some(Err(e)) => return Err(transport_refusal("prefill", &e)),
                Some(Ok(head)) if !(200..300).contains(&head.status) => {
                    return Err(prefill_refusal(&head));
                }
                Some(Ok(_)) => prefill_ok = true,
            },
        }
    }
    // Free what the stream does not need (the open's state, the leg body) before relaying it.
    drop(decode_open);
    drop(decode_req);
    let decode = decode.expect("loop ends only with the decode head");

    // Logprobs: the prompt rows come from the prefill body, so wait for it.
    let logprobs = if req.facts.logprobs {
        let body = prefill.body().await.ok();
        Some(body.and_then(|b| prefill_input_logprobs(&b, is_sse(&b))))
    } else {
        None
    };
    Ok(OpenSample {
        decode,
        prefill,
        logprobs,
        _decode_in_flight: decode_in_flight,
    })
}

/// Drives the prefill: its head while `head_taken` is false, then (`None`) its failure.
async fn prefill_step(
    prefill: &mut PrefillLeg,
    head_taken: bool,
) -> Option<Result<PrefillHead, LegError>> {
    if head_taken {
        prefill.failed().await;
        None
    } else {
        Some(prefill.head().await)
    }
}

/// The refusal when a prefill failed after its 2xx head (before the decode produced anything).
pub fn prefill_failed_after_head() -> Reply {
    Reply::error(
        ErrorCode::PdRequestFailed,
        "Transport error: the prefill leg failed after its response head",
    )
    .retryable(true)
}

fn is_sse(body: &[u8]) -> bool {
    let trimmed = body
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(0);
    body[trimmed..].starts_with(b"data:") || body[trimmed..].starts_with(b":")
}

/// A decode that answered non-2xx: its status with SMG's code (non-streaming), or one SSE error
/// event carrying its body (streaming).
pub async fn decode_refusal(mut leg: OpenLeg, streaming: bool) -> Reply {
    let status = leg.status();
    leg.set_read_timeout(Some(Duration::from_secs(5)));
    let body = leg.read_to_end(ERROR_BODY_LIMIT).await.unwrap_or_default();
    if streaming {
        return Reply::body(status, SSE, sse_error_event(status, &body)).retryable(true);
    }
    let (status, code) = decode_error(status);
    Reply::error_with_status(status, code, upstream_error_message(&body)).retryable(true)
}

pub fn prefill_refusal(head: &PrefillHead) -> Reply {
    let (status, code) = prefill_error(head.status);
    let msg = format!(
        "Prefill server error ({}): {}",
        head.status,
        String::from_utf8_lossy(&head.error_body)
    );
    Reply::error_with_status(status, code, msg).retryable(true)
}

/// Labels of the `smg_pd_*` histograms.
#[derive(Clone)]
pub struct PdLabels {
    model: Arc<str>,
    runtime: &'static str,
}

impl PdLabels {
    pub fn new(ctx: &RequestCtx, pair: &Pair) -> PdLabels {
        PdLabels {
            model: ctx
                .model_label
                .clone()
                .unwrap_or_else(|| Arc::from(crate::metrics::UNKNOWN_MODEL)),
            runtime: pair.prefill.runtime().as_str(),
        }
    }

    pub fn as_array(&self) -> [&str; 3] {
        [BACKEND_PD, &self.model, self.runtime]
    }

    /// The request's `model` label.
    pub fn model(&self) -> &str {
        &self.model
    }
}
