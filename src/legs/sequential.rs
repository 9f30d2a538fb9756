//! Sequential dispatch (vLLM): the prefill leg first, capped at one token and tagged for the
//! prefill's KV connector; then the decode leg with `kv_transfer_params` — relayed verbatim from
//! the prefill (NIXL, passthrough) or minted by the gateway (Mooncake, which pushes the KV and
//! returns nothing).
//!
//! Fallbacks (decode recomputes the prompt), as the spec lists them: a NIXL prefill that returns
//! no params (counted in `smg_pd_kv_transfer_failures_total`), Mooncake without a KV engine id,
//! and `n > 1` (the handoff is single-consumer, so no prefill leg is sent at all).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pdgate_filters::errors::{upstream_error_message, ErrorCode};
use pdgate_filters::handoff::vllm::{self, Connector, TRANSFER_ID_PREFIX};
use pingora::proxy::Session;

use super::client::{spliced_body, LegErrorKind, LegRequest, OpenLeg};
use super::dispatch::Attempt;
use super::handoff::KvVerdict;
use super::parallel::{decode_refusal, transport_refusal, PdLabels};
use super::relay::{relay_decode, RelayPlan};
use super::request::PdRequest;
use crate::config::label;
use crate::gateway::{Gateway, Settings};
use crate::in_box::in_box;
use crate::ledger::{Handoff, Kind};
use crate::metrics::METRICS;
use crate::proxy::ctx::RequestCtx;
use crate::reply::Reply;
use crate::trace::{self, LegFacts, LegRole, LegTrace, LegTransport};
use crate::workers::select::Pair;
use crate::workers::Worker;

/// The prefill's KV engine id as a Mooncake decode must name it: `<id>` or, under DP > 1,
/// `<id>_dp<rank>` (which needs a pinned rank). `None` — no minting, decode recomputes — when
/// the id is unknown or empty, the DP size does not parse as a positive integer (fail closed),
/// or DP > 1 without a rank.
pub fn mooncake_engine_id(worker: &Worker) -> Option<String> {
    let base = worker.kv_engine_id().filter(|id| !id.is_empty())?;
    let dp_size = match (worker.spec.dp_size, worker.label(label::DP_SIZE)) {
        (Some(n), _) => n,
        (None, Some(text)) => text.trim().parse::<u32>().ok().filter(|n| *n > 0)?,
        (None, None) => 1,
    };
    if dp_size <= 1 {
        return Some(base);
    }
    let rank = worker.spec.dp_rank.or(worker.address.dp_rank)?;
    Some(format!("{base}_dp{rank}"))
}

/// A fresh Mooncake transfer id: `xfer-<UUIDv7>`.
pub fn mint_transfer_id() -> String {
    format!("{TRANSFER_ID_PREFIX}{}", super::uuid_v7())
}

/// How the handoff of this attempt is done.
enum Plan {
    /// Tag the prefill with this; relay what it returns.
    Relay(Option<&'static [u8]>),
    /// Mooncake: tag the prefill with the transfer id; mint the decode's params.
    Mint {
        transfer_id: String,
        prefill_tag: Vec<u8>,
        decode_params: Vec<u8>,
    },
    /// No handoff; decode recomputes (Mooncake without an engine id).
    Recompute,
}

fn plan(connector: Connector, prefill: &Worker) -> Plan {
    match connector {
        Connector::Nixl => Plan::Relay(Some(vllm::NIXL_PREFILL_TAG.as_bytes())),
        Connector::Mooncake => match mooncake_engine_id(prefill) {
            Some(engine_id) => {
                let id = mint_transfer_id();
                let addr = vllm::mooncake_bootstrap_addr(
                    &prefill.address.host,
                    prefill.spec.bootstrap_port,
                );
                Plan::Mint {
                    prefill_tag: vllm::mooncake_prefill_tag(&id),
                    decode_params: vllm::mooncake_decode_params(&id, &engine_id, &addr),
                    transfer_id: id,
                }
            }
            None => {
                log::warn!(
                    "Mooncake prefill {} has no usable kv_engine_id; decode recomputes the prompt",
                    prefill.url()
                );
                Plan::Recompute
            }
        },
        // MoRI-IO pairs never reach here (they are refused or handled by their own path);
        // anything else is passthrough: no tag, relay whatever comes back.
        Connector::MoriIo | Connector::Passthrough => Plan::Relay(None),
    }
}

/// One vLLM attempt. The handoff it opens is put in `slot` as soon as it exists, so the caller
/// can settle it however the attempt ends.
pub async fn attempt(
    gw: &Gateway,
    s: &Settings,
    session: &mut Session,
    ctx: &mut RequestCtx,
    req: &PdRequest,
    pair: &Pair,
    slot: &mut Option<Arc<Handoff>>,
) -> Attempt {
    let connector = Connector::from_name(pair.prefill.kv_connector());
    ctx.connector = Some(connector.mode_label());
    METRICS
        .pd_kv_connector_mode
        .with_label_values(&[connector.mode_label()])
        .inc();
    let labels = PdLabels::new(ctx, pair);
    let dispatched = Instant::now();
    let route_path = req.route.upstream_path();
    // The prefill worker counts this attempt even when n>1 skips its leg (SMG's accounting).
    let prefill_in_flight = pair.prefill.track(req.routing.routing_key.is_some());

    let decode_params: Option<Bytes> = if req.facts.n > 1 {
        None
    } else {
        let plan = plan(connector, &pair.prefill);
        let (tag, minted): (Option<Bytes>, Option<Bytes>) = match plan {
            Plan::Relay(tag) => (tag.map(Bytes::from_static), None),
            Plan::Mint {
                transfer_id,
                prefill_tag,
                decode_params,
            } => {
                ctx.transfer_id = Some(transfer_id.clone());
                *slot = Some(gw.ledger.open(
                    Kind::TransferId,
                    &transfer_id,
                    &ctx.request_id,
                    &pair.prefill,
                    &pair.decode,
                ));
                (Some(prefill_tag.into()), Some(decode_params.into()))
            }
            Plan::Recompute => {
                // A fallback the gateway chose (e.g. Mooncake without a KV engine id).
                ctx.kv_verdict = KvVerdict::Recomputed { tokens: 0 };
                (None, None)
            }
        };
        let body = spliced_body(&req.body, |out| {
            vllm::prefill_leg_body_into(
                out,
                req.route,
                &req.body,
                &req.top,
                tag.as_deref(),
                &[],
                &[],
            )
        });
        let prefill_path = pair.prefill.address.path_for(route_path);
        let prefill_trace = trace::leg(
            ctx,
            LegRole::Prefill,
            LegTransport::Http,
            &pair.prefill,
            LegFacts::default(),
        );
        let prefill_headers = req.forward.traced(prefill_trace.as_deref());
        let prefill_req = LegRequest {
            answer_headers: super::client::AnswerHeaders::All,
            method: "POST",
            path: &prefill_path,
            host: &pair.prefill.address.authority,
            headers: prefill_headers.as_slice(),
            body,
        };
        let response = tokio::select! {
            // Boxed, as the decode's opening below: short-lived states kept out of the attempt's
            // future, which lives as long as the stream it relays.
            r = in_box(|| prefill_round_trip(gw, &pair.prefill, &prefill_req, s.prefill_head_timeout, s.max_payload_size, prefill_trace)) => r,
            _ = session.read_body_or_idle(true) => return Attempt::ClientGone,
        };
        let response = match response {
            Ok(b) => b,
            Err(reply) => return Attempt::Refused(reply),
        };
        METRICS.pd_prefill_duration.with(&labels.as_array(), |m| {
            m.observe(dispatched.elapsed().as_secs_f64())
        });
        match (minted, connector) {
            (Some(m), _) => Some(m),
            (None, Connector::Mooncake) => None,
            (None, _) => {
                let mut harvested = vllm::harvest_kv_transfer_params(&response);
                if harvested.is_some_and(vllm::crashes_nixl_decode) {
                    log::warn!(
                        "NIXL prefill {} returned kv_transfer_params with no block to read; not \
                         relayed (vLLM's decode scheduler asserts on them)",
                        pair.prefill.url()
                    );
                    harvested = None;
                }
                if harvested.is_none() && connector == Connector::Nixl {
                    METRICS.pd_kv_transfer_failures.inc();
                    ctx.kv_verdict = KvVerdict::Recomputed { tokens: 0 };
                    log::warn!(
                        "NIXL prefill {} returned no kv_transfer_params; decode recomputes the prompt",
                        pair.prefill.url()
                    );
                }
                harvested.map(|p| response.slice_ref(p))
            }
        }
    };
    drop(prefill_in_flight);
    if decode_params
        .as_deref()
        .is_some_and(vllm::carries_prefill_cached_tokens)
    {
        ctx.kv_verdict = KvVerdict::Opaque;
    }
    log::debug!(
        "request {} pair {} -> {} connector={} kv_transfer_params {}",
        ctx.request_id,
        pair.prefill.url(),
        pair.decode.url(),
        connector.mode_label(),
        if decode_params.is_some() {
            "relayed"
        } else {
            "absent"
        }
    );

    // No `smg_pd_kv_transfer_duration_seconds` here: SMG records it on gRPC vLLM pairs only
    // (spec, "PD Metrics"); over HTTP the decode leg goes out as the prefill's answer is read.
    let _decode_in_flight = pair.decode.track(req.routing.routing_key.is_some());
    let decode_path = pair.decode.address.path_for(route_path);
    let mut decode_trace = trace::leg(
        ctx,
        LegRole::Decode,
        LegTransport::Http,
        &pair.decode,
        LegFacts::default(),
    );
    let decode_headers = req.forward.traced(decode_trace.as_deref());
    let decode_req = LegRequest {
        answer_headers: super::client::AnswerHeaders::All,
        method: "POST",
        path: &decode_path,
        host: &pair.decode.address.authority,
        headers: decode_headers.as_slice(),
        body: spliced_body(&req.body, |out| {
            vllm::decode_leg_body_into(out, &req.body, &req.top, decode_params.as_deref(), &[])
        }),
    };
    let head_timeout = if req.facts.stream {
        s.decode_first_byte_timeout
    } else {
        s.request_timeout
    };
    let opened = tokio::select! {
        r = in_box(|| gw.client.open_traced(&pair.decode.peer, &decode_req, head_timeout, &mut decode_trace)) => r,
        _ = session.read_body_or_idle(true) => return Attempt::ClientGone,
    };
    let decode = match opened {
        Err(e) if e.kind == LegErrorKind::Timeout => {
            pair.decode.record_leg(None);
            return Attempt::Refused(transport_refusal("decode", &e));
        }
        Err(e) => {
            pair.decode.record_leg(None);
            return Attempt::Refused(
                Reply::error(
                    ErrorCode::DecodeRequestFailed,
                    format!("Decode transport error: {e}"),
                )
                .retryable(true),
            );
        }
        Ok(leg) if !leg.is_success() => {
            pair.decode.record_leg(Some(leg.status()));
            return Attempt::Refused(decode_refusal(leg, req.facts.stream).await);
        }
        Ok(leg) => leg,
    };
    finish(gw, s, session, ctx, req, pair, decode, dispatched, labels).await
}

/// Sends the prefill leg and reads its whole (small) response. `trace`: the leg's span (it ends
/// with the leg).
pub(crate) async fn prefill_round_trip(
    gw: &Gateway,
    worker: &Worker,
    req: &LegRequest<'_>,
    head_timeout: Duration,
    limit: usize,
    mut trace: LegTrace,
) -> Result<Bytes, Reply> {
    let mut leg = match gw
        .client
        .open_traced(&worker.peer, req, head_timeout, &mut trace)
        .await
    {
        Ok(leg) => leg,
        Err(e) if e.kind == LegErrorKind::Timeout => {
            worker.record_leg(None);
            return Err(transport_refusal("prefill", &e));
        }
        Err(e) => {
            worker.record_leg(None);
            return Err(Reply::error(
                ErrorCode::PrefillRequestFailed,
                format!("Prefill transport error: {e}"),
            )
            .retryable(true));
        }
    };
    leg.set_read_timeout(Some(head_timeout));
    let status = leg.status();
    let body = match leg.read_to_end(limit).await {
        Ok(b) => b,
        Err(e) => {
            worker.record_leg(None);
            return Err(Reply::error(
                ErrorCode::PrefillReadFailed,
                format!("Prefill response could not be read: {e}"),
            )
            .retryable(true));
        }
    };
    worker.record_leg(Some(status));
    if !leg.is_success() {
        // The prefill's own status goes to the client (a 429 stays a 429).
        return Err(Reply::error_with_status(
            status,
            ErrorCode::PrefillUpstreamError,
            upstream_error_message(&body),
        )
        .retryable(true));
    }
    gw.client.release(leg, &worker.peer).await;
    Ok(body)
}

/// Relays a vLLM decode (no prefill body to merge from: a logprob request still gets a JSON
/// body built by the gateway).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn finish(
    gw: &Gateway,
    s: &Settings,
    session: &mut Session,
    ctx: &mut RequestCtx,
    req: &PdRequest,
    pair: &Pair,
    decode: OpenLeg,
    dispatched: Instant,
    labels: PdLabels,
) -> Attempt {
    let plan = RelayPlan {
        streaming: req.facts.stream,
        logprobs: req.facts.logprobs.then_some(None),
        dispatched,
        decode: &pair.decode,
        body_limit: s.max_payload_size,
        stall_timeout: s.stream_idle_timeout,
        deadline: ctx.started + s.request_timeout,
        prefill: None,
        read_cache_report: true,
    };
    relay_decode(gw, session, ctx, pair, decode, plan, &labels).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{WorkerSpec, WorkerType};

    fn worker(
        url: &str,
        engine_id: Option<&str>,
        dp_size: Option<u32>,
        dp_label: Option<&str>,
    ) -> Arc<Worker> {
        let mut spec = WorkerSpec::new(url, WorkerType::Prefill);
        spec.kv_engine_id = engine_id.map(str::to_string);
        spec.dp_size = dp_size;
        if let Some(l) = dp_label {
            spec.labels.insert(label::DP_SIZE.into(), l.into());
        }
        Worker::for_test(spec)
    }

    use std::sync::Arc;

    #[test]
    fn mooncake_engine_id_is_the_registered_one_without_dp() {
        assert_eq!(
            mooncake_engine_id(&worker("http://p:1", Some("eng"), None, None)).as_deref(),
            Some("eng")
        );
        assert_eq!(
            mooncake_engine_id(&worker("http://p:1", Some(""), None, None)),
            None
        );
        assert_eq!(
            mooncake_engine_id(&worker("http://p:1", None, None, None)),
            None
        );
    }

    #[test]
    fn mooncake_engine_id_under_dp_needs_a_pinned_rank() {
        assert_eq!(
            mooncake_engine_id(&worker("http://p:1@1", Some("eng"), Some(2), None)).as_deref(),
            Some("eng_dp1")
        );
        assert_eq!(
            mooncake_engine_id(&worker("http://p:1", Some("eng"), Some(2), None)),
            None
        );
        assert_eq!(
            mooncake_engine_id(&worker("http://p:1@0", Some("eng"), None, Some("2"))).as_deref(),
            Some("eng_dp0")
        );
    }

    #[test]
    fn an_unparsable_dp_size_label_fails_closed() {
        assert_eq!(
            mooncake_engine_id(&worker("http://p:1", Some("eng"), None, Some("abc"))),
            None
        );
        assert_eq!(
            mooncake_engine_id(&worker("http://p:1", Some("eng"), None, Some("0"))),
            None
        );
    }

    #[test]
    fn transfer_ids_are_fresh_uuid_v7() {
        let (a, b) = (mint_transfer_id(), mint_transfer_id());
        assert!(a.starts_with("xfer-") && a.len() == 5 + 36);
        assert_ne!(a, b);
    }
}
