//! Sequential dispatch over gRPC (vLLM, digest §2.13): the prefill capped at one token and
//! drained, its handoff relayed (NIXL), minted (Mooncake with the prefill's engine id; the
//! legacy typed host and port without one) or passed through, then the decode leg relayed.
//!
//! The prefill's connector decides the tags as over HTTP ("Connector Modes"); a NIXL prefill
//! that returns no params is counted in `smg_pd_kv_transfer_failures_total` and the decode
//! recomputes the prompt.

use std::sync::Arc;
use std::time::Instant;

use pdgate_filters::errors::ErrorCode;
use pdgate_filters::handoff::vllm::{self, Connector};
use pingora::proxy::Session;

use super::build::{self, LegSpec, VllmHandoff};
use super::engine::{Engine, Message};
use super::leg::GrpcLeg;
use super::media::{reports_no_vision, Processing};
use super::mm_inputs::MediaLeg;
use super::prepare::Prepared;
use super::relay::Source;
use super::{leg_failed_to_start, prefill_timed_out, relay_open_decode, stream_failed, Legs};
use crate::config::defaults;
use crate::ledger::{Handoff, Kind};
use crate::legs::dispatch::Attempt;
use crate::legs::handoff::KvVerdict;
use crate::legs::sequential::{mint_transfer_id, mooncake_engine_id};
use crate::metrics::METRICS;
use crate::proxy::ctx::RequestCtx;
use crate::reply::Reply;
use crate::trace::{self, LegFacts, LegRole, LegTransport};
use crate::workers::admission::Slots;

/// How this attempt hands the KV over.
enum Plan {
    /// Tag the prefill with this (or nothing); relay what it returns.
    Relay(Option<String>),
    /// Mooncake with the prefill's engine id: the prefill tagged with the minted transfer id,
    /// the decode's params synthesized.
    Mint {
        transfer_id: String,
        prefill_tag: String,
        decode_params: String,
    },
    /// Mooncake without an engine id: the decode gets the legacy bootstrap host and port.
    Legacy,
}

pub async fn attempt(
    legs: &Legs<'_>,
    session: &mut Session,
    ctx: &mut RequestCtx,
    p: &Arc<Prepared>,
    slots: Option<Slots>,
    slot: &mut Option<Arc<Handoff>>,
) -> Attempt {
    let (gw, s, pair) = (legs.gw, legs.settings, legs.pair);
    let connector = Connector::from_name(pair.prefill.kv_connector());
    // n > 1: the handoff is single-consumer, so none is made (the decode samples n itself and
    // recomputes the prompt); counted as passthrough, the mode it runs in. The prefill leg still
    // runs, untagged, and a Mooncake decode still gets the legacy bootstrap host and port.
    let samples = p.gen.sampling.n > 1;
    let mode = if samples {
        Connector::Passthrough.mode_label()
    } else {
        connector.mode_label()
    };
    ctx.connector = Some(mode);
    METRICS
        .pd_kv_connector_mode
        .with_label_values(&[mode])
        .inc();
    let host = pair.prefill.address.host.clone();
    let port = pair.prefill.spec.bootstrap_port;
    let plan = match connector {
        Connector::Mooncake if samples => Plan::Legacy,
        _ if samples => Plan::Relay(None),
        Connector::Nixl => Plan::Relay(Some(vllm::NIXL_PREFILL_TAG.to_string())),
        Connector::Mooncake => match mooncake_engine_id(&pair.prefill) {
            Some(engine_id) => {
                let id = mint_transfer_id();
                let addr = vllm::mooncake_bootstrap_addr(&host, port);
                Plan::Mint {
                    prefill_tag: utf8(vllm::mooncake_prefill_tag(&id)),
                    decode_params: utf8(vllm::mooncake_decode_params(&id, &engine_id, &addr)),
                    transfer_id: id,
                }
            }
            None => Plan::Legacy,
        },
        Connector::MoriIo | Connector::Passthrough => Plan::Relay(None),
    };
    let handoff_key = match &plan {
        Plan::Mint { transfer_id, .. } => {
            ctx.transfer_id = Some(transfer_id.clone());
            Some((Kind::TransferId, transfer_id.clone()))
        }
        _ => None,
    };
    let handoff = handoff_key.map(|(kind, id)| {
        let h = gw
            .ledger
            .open(kind, &id, &ctx.request_id, &pair.prefill, &pair.decode);
        *slot = Some(h.clone());
        h
    });
    let request_id = legs.attempt_request_id();
    let prefill_tag = match &plan {
        Plan::Relay(tag) => tag.clone(),
        Plan::Mint { prefill_tag, .. } => Some(prefill_tag.clone()),
        Plan::Legacy => None,
    };
    let dispatched = Instant::now();

    // 1. The prefill, drained to its end.
    let prefill_in_flight = pair.prefill.track(legs.keyed());
    let prefill_req = build::vllm_prefill(
        p,
        &LegSpec {
            request_id: &request_id,
            stream: false,
            dp_rank: legs.dp_rank(&pair.prefill),
            sample: 0,
            media: MediaLeg::Pixels,
        },
        prefill_tag,
    );
    let mut prefill = GrpcLeg::start(
        pair.prefill.clone(),
        pair.prefill.grpc_channel(),
        Engine::Vllm,
        request_id.clone(),
        prefill_req,
        false,
        trace::leg(
            ctx,
            LegRole::Prefill,
            LegTransport::Grpc,
            &pair.prefill,
            LegFacts::default(),
        ),
    );
    // One timer for the whole prefill stream, made once (a timer registers in the wheel when
    // first polled), not one per message.
    let prefill_timer = tokio::time::sleep(s.prefill_head_timeout);
    tokio::pin!(prefill_timer);
    let mut returned: Option<String> = None;
    let mut identity = None;
    loop {
        let m = tokio::select! {
            m = prefill.next() => m,
            _ = session.read_body_or_idle(true) => return Attempt::ClientGone,
            _ = &mut prefill_timer => {
                return Attempt::Refused(prefill_timed_out(&pair.prefill, s.prefill_head_timeout));
            }
        };
        match m {
            Ok(Some(Message::Complete(c))) => {
                returned = c.kv_transfer_params_json;
                identity = c.media_identity;
            }
            Ok(Some(Message::Chunk(_))) => {}
            Ok(None) => break,
            Err(status) => {
                let reply = if prefill.was_opened() {
                    stream_failed(&status)
                } else {
                    leg_failed_to_start("prefill", &status)
                };
                pair.prefill.record_leg(Some(reply.status));
                return Attempt::Refused(reply);
            }
        }
    }
    prefill.completed();
    pair.prefill.record_leg(Some(200));
    drop(prefill_in_flight);
    legs.prefill_done(dispatched);
    let prefill_end = Instant::now();

    // 2. The decode's handoff.
    let decode_handoff = match plan {
        Plan::Relay(_) if samples => VllmHandoff::None,
        Plan::Relay(tag) => match returned {
            Some(json) if vllm::crashes_nixl_decode(json.as_bytes()) => {
                METRICS.pd_kv_transfer_failures.inc();
                ctx.kv_verdict = KvVerdict::Recomputed { tokens: 0 };
                log::warn!(
                    "request {} NIXL prefill {} returned kv_transfer_params with no block to \
                     read; not relayed (vLLM's decode scheduler asserts on them), decode \
                     recomputes the prompt",
                    ctx.request_id,
                    pair.prefill.url()
                );
                VllmHandoff::None
            }
            Some(json) if json_object(&json) => {
                if vllm::carries_prefill_cached_tokens(json.as_bytes()) {
                    ctx.kv_verdict = KvVerdict::Opaque;
                }
                VllmHandoff::Json(json)
            }
            Some(_) => {
                METRICS.pd_kv_transfer_failures.inc();
                ctx.kv_verdict = KvVerdict::Recomputed { tokens: 0 };
                log::warn!(
                    "request {} vLLM prefill {} returned kv_transfer_params that are not a JSON \
                     object; decode recomputes the prompt",
                    ctx.request_id,
                    pair.prefill.url()
                );
                VllmHandoff::None
            }
            None => {
                if tag.is_some() {
                    METRICS.pd_kv_transfer_failures.inc();
                    ctx.kv_verdict = KvVerdict::Recomputed { tokens: 0 };
                    log::warn!(
                        "request {} NIXL prefill {} returned no kv_transfer_params; decode \
                         recomputes the prompt",
                        ctx.request_id,
                        pair.prefill.url()
                    );
                }
                VllmHandoff::None
            }
        },
        Plan::Mint { decode_params, .. } => VllmHandoff::Json(decode_params),
        Plan::Legacy => VllmHandoff::Legacy {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port: port.unwrap_or(defaults::BOOTSTRAP_PORT),
        },
    };

    // 3. The decode leg: with the handoff it needs no pixels (a language-model-only decode
    // only the images' hashes); n > 1 computes the prompt itself, so it gets the media.
    let worker_refs = p
        .media
        .as_ref()
        .is_some_and(|m| m.processing == Processing::WorkerRefs);
    if worker_refs && !samples && identity.is_none() {
        log::warn!(
            "request {} vLLM prefill {} returned no media identity; the decode leg processes \
             the media again",
            ctx.request_id,
            pair.prefill.url()
        );
    }
    let media = if samples || (worker_refs && identity.is_none()) {
        MediaLeg::Pixels
    } else if reports_no_vision(&pair.decode) {
        MediaLeg::HashesOnly
    } else {
        MediaLeg::Metadata
    };
    let decode_in_flight = pair.decode.track(legs.keyed());
    let decode_req = build::vllm_decode(
        p,
        &LegSpec {
            request_id: &request_id,
            stream: p.gen.stream,
            dp_rank: legs.dp_rank(&pair.decode),
            sample: 0,
            media,
        },
        decode_handoff,
        if samples { None } else { identity.as_deref() },
    );
    let mut decode = GrpcLeg::start(
        pair.decode.clone(),
        pair.decode.grpc_channel(),
        Engine::Vllm,
        request_id,
        decode_req,
        true,
        trace::leg(
            ctx,
            LegRole::Decode,
            LegTransport::Grpc,
            &pair.decode,
            LegFacts::default(),
        ),
    )
    .holding(slots);
    METRICS
        .pd_kv_transfer_duration
        .with_label_values(&legs.labels().as_array())
        .observe(prefill_end.elapsed().as_secs_f64());
    let open_deadline = tokio::time::Instant::now()
        + if p.gen.stream {
            s.decode_first_byte_timeout
        } else {
            s.request_timeout
        };
    let opened = tokio::select! {
        d = decode.opened() => d,
        _ = session.read_body_or_idle(true) => return Attempt::ClientGone,
        _ = tokio::time::sleep_until(open_deadline) => {
            pair.decode.record_leg(None);
            return Attempt::Refused(
                Reply::error(ErrorCode::Timeout, "the decode worker produced nothing in time")
                    .retryable(true),
            );
        }
    };
    if let Err(status) = opened {
        let reply = leg_failed_to_start("decode", &status);
        pair.decode.record_leg(Some(reply.status));
        return Attempt::Refused(reply);
    }
    let end = relay_open_decode(legs, session, ctx, p, Source::One(&mut decode), dispatched).await;
    drop(decode_in_flight);
    drop(handoff);
    end
}

fn utf8(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_default()
}

/// Whether `text` is a JSON object (the vLLM servicer refuses anything else).
fn json_object(text: &str) -> bool {
    let top = pdgate_filters::scan_object(text.as_bytes());
    top.is_ok()
}
