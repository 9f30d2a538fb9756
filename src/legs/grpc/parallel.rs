//! Parallel dispatch over gRPC (SGLang, TokenSpeed): one room, both `Generate` calls at once,
//! the decode relayed as soon as it has produced its first message, the prefill drained in the
//! background (digest §2.13).
//!
//! Fail-fast: the first leg the engine refuses answers the client at once
//! (`prefill_worker_failed_to_start` / `decode_worker_failed_to_start`, the gRPC status mapped
//! to HTTP) and the other leg is dropped — the prefill aborted at once, the decode after its
//! first message or end (at most 30 s; see `leg`). A prefill that fails after it started
//! dooms a decode still waiting for its KV: that fails the attempt too.

use std::sync::Arc;
use std::time::Instant;

use pdgate_filters::errors::ErrorCode;
use pingora::proxy::Session;
use tonic::Status;

use super::build::{self, Bootstrap, LegSpec};
use super::engine::{Engine, Message};
use super::leg::GrpcLeg;
use super::prepare::Prepared;
use super::{
    leg_failed_to_start, mint_room, relay_open_decode, spawn_prefill_drain, stream_failed, Legs,
};
use crate::config::defaults;
use crate::ledger::{Handoff, Kind};
use crate::legs::dispatch::Attempt;
use crate::proxy::ctx::RequestCtx;
use crate::reply::Reply;
use crate::workers::admission::Slots;

pub async fn attempt(
    legs: &Legs<'_>,
    session: &mut Session,
    ctx: &mut RequestCtx,
    p: &Arc<Prepared>,
    engine: Engine,
    slots: Option<Slots>,
    slot: &mut Option<Arc<Handoff>>,
) -> Attempt {
    let (gw, pair) = (legs.gw, legs.pair);
    let s = gw.settings();
    let room = mint_room(engine, legs.prefill_dp());
    ctx.room = Some(room);
    ctx.connector = Some("bootstrap");
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
        pair.prefill.url(),
        pair.decode.url(),
    );
    *slot = Some(handoff.clone());
    let request_id = legs.attempt_request_id();
    let build = match engine {
        Engine::TokenSpeed => build::tokenspeed,
        _ => build::sglang,
    };
    let prefill_req = build(
        p,
        &LegSpec {
            request_id: &request_id,
            stream: false,
            dp_rank: legs.dp_rank(&pair.prefill),
        },
        &bootstrap,
    );
    let decode_req = build(
        p,
        &LegSpec {
            request_id: &request_id,
            stream: p.gen.stream,
            dp_rank: legs.dp_rank(&pair.decode),
        },
        &bootstrap,
    );
    log::debug!(
        "request {} gRPC pair {} -> {} bootstrap_room={room} id={request_id}",
        ctx.request_id,
        pair.prefill.url(),
        pair.decode.url(),
    );
    let dispatched = Instant::now();
    let prefill_in_flight = pair.prefill.track(legs.keyed());
    let decode_in_flight = pair.decode.track(legs.keyed());
    let mut prefill = GrpcLeg::start(
        pair.prefill.clone(),
        pair.prefill.grpc_channel(),
        engine,
        request_id.clone(),
        prefill_req,
        false,
    );
    let mut decode = GrpcLeg::start(
        pair.decode.clone(),
        pair.decode.grpc_channel(),
        engine,
        request_id,
        decode_req,
        true,
    )
    .holding(slots);
    // A non-streamed decode answers only when it is done.
    let open_deadline = tokio::time::Instant::now()
        + if p.gen.stream {
            s.decode_first_byte_timeout
        } else {
            s.request_timeout
        };
    let mut prefill_done = false;
    let opened: Result<(), Attempt> = loop {
        tokio::select! {
            d = decode.opened() => match d {
                Ok(()) => break Ok(()),
                Err(status) => break Err(refused("decode", &decode, &status)),
            },
            m = prefill.next(), if !prefill_done => match m {
                Ok(Some(Message::Complete(_))) | Ok(None) => {
                    prefill_done = true;
                    prefill.completed();
                    pair.prefill.record_leg(Some(200));
                    legs.prefill_done(dispatched);
                }
                Ok(Some(Message::Chunk(_))) => {}
                Err(status) => break Err(if prefill.was_opened() {
                    pair.prefill.record_leg(Some(stream_failed(&status).status));
                    Attempt::Refused(stream_failed(&status))
                } else {
                    refused("prefill", &prefill, &status)
                }),
            },
            _ = tokio::time::sleep_until(open_deadline) => {
                pair.decode.record_leg(None);
                break Err(Attempt::Refused(
                    Reply::error(ErrorCode::Timeout, "the decode worker produced nothing in time")
                        .retryable(true),
                ));
            }
            _ = session.read_body_or_idle(true) => break Err(Attempt::ClientGone),
        }
    };
    if let Err(end) = opened {
        return end;
    }
    if !prefill_done {
        // The decode produced output, so its KV arrived; let the prefill end on its own.
        spawn_prefill_drain(
            prefill,
            handoff,
            s.prefill_head_timeout,
            legs.labels(),
            dispatched,
        );
    }
    drop(prefill_in_flight);
    let end = relay_open_decode(legs, session, ctx, p, &mut decode, dispatched).await;
    drop(decode_in_flight);
    end
}

/// A leg the engine refused: its breaker outcome, and the client's answer (retried on another
/// pair when the status is a server-side one).
fn refused(leg: &str, l: &GrpcLeg, status: &Status) -> Attempt {
    let reply = leg_failed_to_start(leg, status);
    l.worker.record_leg(Some(reply.status));
    Attempt::Refused(reply)
}
