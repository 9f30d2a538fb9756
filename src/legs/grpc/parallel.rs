//! Parallel dispatch over gRPC (SGLang, TokenSpeed): a room per sample, every `Generate` call at
//! once, the decode relayed as soon as it has produced its first message, the prefill drained
//! in the background (digest §2.13).
//!
//! `n > 1` fans out (spec "Parallel Sampling"): the handoff is single-consumer, so each sample
//! is its own single-sample PD dispatch — its own room, engine id `<id>-<i>`, TokenSpeed seed
//! offset by `i` — and the samples fail together and merge into one response.
//!
//! Fail-fast: the first leg the engine refuses answers the client at once
//! (`prefill_worker_failed_to_start` / `decode_worker_failed_to_start`, the gRPC status mapped
//! to HTTP) and every other leg is dropped — a prefill aborted at once, a decode at once once
//! its SGLang prefill answered (`GrpcLeg::prefill_completed`), else after its first message or
//! end (at most `leg::DEFERRED_ABORT_CAP`). A prefill that fails after it started dooms a decode
//! still waiting for its KV: that fails the attempt too.

use std::sync::Arc;
use std::time::Instant;

use futures::stream::{FuturesUnordered, StreamExt};
use pdgate_filters::errors::ErrorCode;
use pingora::proxy::Session;

use super::build::{self, Bootstrap, LegSpec};
use super::encode::{self, EncodeCall};
use super::engine::{Engine, Message};
use super::leg::GrpcLeg;
use super::mm_inputs::MediaLeg;
use super::prepare::Prepared;
use super::relay::{FanIn, Source};
use super::{
    leg_failed_to_start, mint_room, prefill_timed_out, relay_open_decode, spawn_prefill_drain,
    stream_failed, Legs,
};
use crate::config::defaults;
use crate::ledger::{Handoff, Kind};
use crate::legs::dispatch::Attempt;
use crate::proxy::ctx::RequestCtx;
use crate::reply::Reply;
use crate::trace::{self, LegFacts, LegRole, LegTransport};
use crate::workers::admission::Slots;

/// One sample's pair of legs (and, in EPD, its encode calls).
struct Sample {
    prefill: GrpcLeg,
    decode: GrpcLeg,
    handoff: Arc<Handoff>,
    prefill_done: bool,
    encodes: Vec<EncodeCall>,
}

pub async fn attempt(
    legs: &Legs<'_>,
    session: &mut Session,
    ctx: &mut RequestCtx,
    p: &Arc<Prepared>,
    engine: Engine,
    mut slots: Option<Slots>,
    slot: &mut Option<Arc<Handoff>>,
) -> Attempt {
    let (gw, s, pair) = (legs.gw, legs.settings, legs.pair);
    let n = p.gen.sampling.n.max(1);
    let attempt_id = legs.attempt_request_id();
    ctx.connector = Some("bootstrap");
    ctx.kv_verdict = crate::legs::handoff::KvVerdict::of_bootstrap_decode(&pair.decode);
    let build = match engine {
        Engine::TokenSpeed => build::tokenspeed,
        _ => build::sglang,
    };
    let dispatched = Instant::now();
    let prefill_in_flight = pair.prefill.track(legs.keyed());
    let decode_in_flight = pair.decode.track(legs.keyed());
    let mut samples: Vec<Sample> = Vec::with_capacity(n as usize);
    let epd = gw.config().epd_disaggregation;
    let fail_all = |samples: &[Sample]| {
        for s in samples {
            s.handoff.failed();
            for e in &s.encodes {
                e.handoff.failed();
            }
        }
    };
    for i in 0..n {
        let room = mint_room(engine, legs.prefill_dp());
        if i == 0 {
            ctx.room = Some(room);
        }
        let bootstrap = Bootstrap {
            host: pair.prefill.address.host.clone(),
            port: pair
                .prefill
                .spec
                .bootstrap_port
                .unwrap_or(defaults::BOOTSTRAP_PORT),
            room,
        };
        let handoff = gw.ledger.open(
            Kind::Room,
            room,
            &ctx.request_id,
            &pair.prefill,
            &pair.decode,
        );
        if i == 0 {
            *slot = Some(handoff.clone());
        }
        let request_id = if n == 1 {
            attempt_id.clone()
        } else {
            format!("{attempt_id}-{i}")
        };
        // EPD: the items' encoders and rooms; the prefill gets the rendezvous, not pixels.
        let epd = match (&p.media, epd) {
            (Some(m), true) => match encode::plan(
                gw,
                m,
                &request_id,
                &ctx.request_id,
                &pair.prefill,
                legs.labels().model(),
            ) {
                Ok(plan) => Some(plan),
                Err(reply) => {
                    fail_all(&samples);
                    handoff.failed();
                    return Attempt::Refused(reply);
                }
            },
            _ => None,
        };
        let leg = |stream, dp_rank, media| LegSpec {
            request_id: &request_id,
            stream,
            dp_rank,
            sample: i,
            media,
        };
        let prefill_media = match &epd {
            Some(plan) => MediaLeg::Encoded(&plan.rendezvous),
            None => MediaLeg::Pixels,
        };
        let prefill_req = build(
            p,
            &leg(false, legs.dp_rank(&pair.prefill), prefill_media),
            &bootstrap,
        );
        let decode_req = build(
            p,
            &leg(p.gen.stream, legs.dp_rank(&pair.decode), MediaLeg::Metadata),
            &bootstrap,
        );
        log::debug!(
            "request {} gRPC pair {} -> {} bootstrap_room={room} id={request_id}",
            ctx.request_id,
            pair.prefill.url(),
            pair.decode.url(),
        );
        // Each sample's decode holds one of the claimed slots.
        let sample_slots = match slots.as_mut() {
            Some(all) if all.num_permits() > 1 => all.split(1),
            _ => slots.take(),
        };
        let facts = LegFacts {
            room: Some(room),
            sample: (n > 1).then_some(u64::from(i)),
        };
        let span = |role, worker| trace::leg(ctx, role, LegTransport::Grpc, worker, facts);
        samples.push(Sample {
            prefill: GrpcLeg::start(
                pair.prefill.clone(),
                pair.prefill.grpc_channel(),
                engine,
                request_id.clone(),
                prefill_req,
                false,
                span(LegRole::Prefill, &pair.prefill),
            ),
            decode: GrpcLeg::start(
                pair.decode.clone(),
                pair.decode.grpc_channel(),
                engine,
                request_id.clone(),
                decode_req,
                true,
                span(LegRole::Decode, &pair.decode),
            )
            .holding(sample_slots),
            handoff,
            prefill_done: false,
            encodes: epd.map(|plan| plan.calls).unwrap_or_default(),
        });
    }
    // A non-streamed decode answers only when it is done.
    let open_deadline = tokio::time::Instant::now()
        + if p.gen.stream {
            s.decode_first_byte_timeout
        } else {
            s.request_timeout
        };
    if let Err(end) = open_all(legs, session, &mut samples, open_deadline).await {
        fail_all(&samples);
        return end;
    }
    // Every decode produced output, so its KV arrived; let the prefills end on their own.
    let mut decodes = Vec::with_capacity(samples.len());
    for mut sample in samples {
        // The decode has its KV, so the prefill had every embedding: the encode rooms are done.
        sample.encodes.clear();
        if sample.prefill_done {
            drop(sample.handoff);
        } else {
            spawn_prefill_drain(sample.prefill, sample.handoff, s.prefill_head_timeout);
        }
        decodes.push(sample.decode);
    }
    drop(prefill_in_flight);
    let end = if decodes.len() == 1 {
        let mut decode = decodes.pop().expect("one decode");
        relay_open_decode(legs, session, ctx, p, Source::One(&mut decode), dispatched).await
    } else {
        let fan = FanIn::new(decodes, pair.decode.clone());
        relay_open_decode(legs, session, ctx, p, Source::Many(fan), dispatched).await
    };
    drop(decode_in_flight);
    end
}

/// Drives every sample until all decodes are open (their first message is ready), completing
/// the prefills that finish meanwhile. `Err`: the attempt's end (a refusal, a failed prefill,
/// the deadline, or the client leaving); the legs are dropped by the caller.
async fn open_all(
    legs: &Legs<'_>,
    session: &mut Session,
    samples: &mut [Sample],
    deadline: tokio::time::Instant,
) -> Result<(), Attempt> {
    let pair = legs.pair;
    let total = samples.len();
    let prefill_deadline = tokio::time::Instant::now() + legs.settings.prefill_head_timeout;
    let mut decodes = FuturesUnordered::new();
    let mut prefills = FuturesUnordered::new();
    let mut encodes = FuturesUnordered::new();
    for s in samples.iter_mut() {
        for call in &mut s.encodes {
            let Some(request) = call.request.take() else {
                continue;
            };
            let worker = call.worker.clone();
            encodes.push(async move {
                let result = encode::run(worker.clone(), request).await;
                (worker, result)
            });
        }
    }
    for (i, s) in samples.iter_mut().enumerate() {
        let decode = &mut s.decode;
        decodes.push(async move { decode.opened().await });
        let prefill = &mut s.prefill;
        prefills.push(async move {
            loop {
                match prefill.next().await {
                    Ok(Some(Message::Chunk(_))) => continue,
                    Ok(Some(Message::Complete(_))) | Ok(None) => {
                        prefill.completed();
                        return Ok(i);
                    }
                    Err(status) => return Err((status, prefill.was_opened())),
                }
            }
        });
    }
    let mut open = 0;
    let mut done = Vec::new();
    // One timer, made once (a timer registers in the wheel when first polled): the prefills'
    // bound while one is out, then the decodes'. A prefill answers once its KV is sent, so
    // `prefill_head_timeout_secs` bounds it here as it bounds an HTTP prefill's head (a decode
    // that never takes the KV leaves the prefill waiting out its own bootstrap timeout
    // otherwise).
    let timer = tokio::time::sleep_until(prefill_deadline.min(deadline));
    tokio::pin!(timer);
    let outcome = loop {
        if open == total {
            break Ok(());
        }
        tokio::select! {
            d = decodes.next() => match d {
                Some(Ok(())) => open += 1,
                Some(Err(status)) => {
                    let reply = leg_failed_to_start("decode", &status);
                    pair.decode.record_leg(Some(reply.status));
                    break Err(Attempt::Refused(reply));
                }
                None => break Ok(()),
            },
            p = prefills.next(), if !prefills.is_empty() => match p {
                Some(Ok(i)) => {
                    // No `smg_pd_prefill_duration_seconds` on parallel gRPC pairs: SMG records it
                    // for HTTP PD and gRPC vLLM only (spec, "PD Metrics").
                    pair.prefill.record_leg(Some(200));
                    done.push(i);
                    if prefills.is_empty() && timer.deadline() < deadline {
                        timer.as_mut().reset(deadline);
                    }
                }
                Some(Err((status, opened))) => {
                    let reply = if opened {
                        stream_failed(&status)
                    } else {
                        leg_failed_to_start("prefill", &status)
                    };
                    pair.prefill.record_leg(Some(reply.status));
                    break Err(Attempt::Refused(reply));
                }
                None => {}
            },
            e = encodes.next(), if !encodes.is_empty() => match e {
                Some((worker, Err(status))) => {
                    let reply = encode::encode_failed(&worker, &status);
                    worker.record_leg(Some(reply.status));
                    break Err(Attempt::Refused(reply));
                }
                Some((worker, Ok(()))) => worker.record_leg(Some(200)),
                None => {}
            },
            _ = &mut timer => {
                if !prefills.is_empty() && tokio::time::Instant::now() >= prefill_deadline {
                    let limit = legs.settings.prefill_head_timeout;
                    break Err(Attempt::Refused(prefill_timed_out(&pair.prefill, limit)));
                }
                pair.decode.record_leg(None);
                break Err(Attempt::Refused(
                    Reply::error(ErrorCode::Timeout, "the decode worker produced nothing in time")
                        .retryable(true),
                ));
            }
            _ = session.read_body_or_idle(true) => break Err(Attempt::ClientGone),
        }
    };
    drop(decodes);
    drop(prefills);
    drop(encodes);
    for i in done {
        samples[i].prefill_done = true;
        samples[i].decode.prefill_completed();
    }
    outcome
}
