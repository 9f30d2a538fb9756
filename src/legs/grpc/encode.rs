//! EPD's encode legs (TokenSpeed): every media item gets an encode worker (`--encode-policy`)
//! and a fresh 63-bit room; the prefill is told where each item's embedding comes from
//! (`encode_bootstrap_info`: the encoder's host and bootstrap port) and gets no pixels; one
//! `Encode` call per item carries the pixels to its encoder, which ships the embedding to the
//! prefill over its bootstrap port (digest §1.6, §2.18).
//!
//! The calls run beside the prefill and decode legs, inside the attempt: an encoder that
//! refuses (or does not accept) its item fails the attempt at once with
//! `encode_worker_failed_to_start`, and the other legs are dropped — rather than letting the
//! prefill wait out its embedding timeout, as a gateway that only logs the failure would.
//! Dropping an unfinished call cancels it (its HTTP/2 stream is reset). Each room is in the
//! ledger until the decode opened (the prefill then had every embedding) or the attempt ended.

use std::sync::Arc;

use pdgate_filters::errors::{grpc_status_to_http, ErrorCode};
use pdgate_proto::{tokenspeed, tokenspeed_encoder as enc};
use tonic::Status;

use super::engine::Engine;
use super::media::Media;
use super::mint_room;
use super::mm_inputs::{self, EncodeRendezvous, MediaLeg};
use crate::config::defaults;
use crate::gateway::Gateway;
use crate::ledger::{Handoff, Kind};
use crate::reply::Reply;
use crate::workers::Worker;

/// One item's planned encode call.
pub struct EncodeCall {
    pub worker: Arc<Worker>,
    /// Taken when the call is made.
    pub request: Option<enc::EncodeRequest>,
    pub handoff: Arc<Handoff>,
}

/// The encode plan of one sample: the prefill's rendezvous list and the calls to make.
pub struct EncodePlan {
    pub rendezvous: Vec<EncodeRendezvous>,
    pub calls: Vec<EncodeCall>,
}

/// Assigns each item of `media` an encode worker and a room. `Err`: no encode worker is
/// available (503).
pub fn plan(
    gw: &Gateway,
    media: &Media,
    request_id: &str,
    client_request_id: &str,
    prefill: &Arc<Worker>,
    model_label: &str,
) -> Result<EncodePlan, Reply> {
    let snap = gw.registry.snapshot();
    let policy = gw.config().encode_policy;
    let mut rendezvous = Vec::with_capacity(media.items.len());
    let mut calls = Vec::with_capacity(media.items.len());
    // The full per-item inputs (pixels included), built once; each call takes its item.
    let mut items = mm_inputs::tokenspeed(media, MediaLeg::Pixels)
        .items
        .into_iter();
    for (i, item) in media.items.iter().enumerate() {
        let worker = gw
            .encoders
            .pick(&snap, policy, &item.hash, model_label)
            .ok_or_else(|| {
                Reply::error(
                    ErrorCode::NoAvailableWorkers,
                    "no encode worker is available for this multimodal request",
                )
                .retryable(true)
            })?;
        let room = mint_room(Engine::TokenSpeed, None);
        let port = worker
            .spec
            .bootstrap_port
            .unwrap_or(defaults::ENCODE_BOOTSTRAP_PORT);
        rendezvous.push(EncodeRendezvous {
            item_index: i as u32,
            host: worker.address.host.clone(),
            port,
            room,
        });
        let handoff = gw
            .ledger
            .open(Kind::EncodeRoom, room, client_request_id, &worker, prefill);
        let item = items.next().unwrap_or_default();
        calls.push(EncodeCall {
            request: Some(enc::EncodeRequest {
                request_id: format!("{request_id}-enc{i}"),
                mm_inputs: Some(tokenspeed::MultimodalInputs { items: vec![item] }),
                items: vec![enc::EncodeItemAssignment {
                    bootstrap_room: room as i64,
                }],
            }),
            worker,
            handoff,
        });
    }
    Ok(EncodePlan { rendezvous, calls })
}

/// Runs one encode call: `Ok` when the encoder accepted its item.
pub async fn run(worker: Arc<Worker>, request: enc::EncodeRequest) -> Result<(), Status> {
    let mut client =
        enc::token_speed_encoder_client::TokenSpeedEncoderClient::new(worker.grpc_channel());
    let accepted = client.encode(request).await?.into_inner().accepted;
    if accepted {
        Ok(())
    } else {
        Err(Status::failed_precondition(
            "the encode worker did not accept the item",
        ))
    }
}

/// The answer when an encoder refused its item: its status mapped to HTTP; server-side
/// statuses may be retried.
pub fn encode_failed(worker: &Worker, status: &Status) -> Reply {
    let http = grpc_status_to_http(status.code() as i32);
    Reply::error_with_status(
        http,
        ErrorCode::EncodeWorkerFailedToStart,
        format!(
            "the encode worker {} refused a media item: {}",
            worker.url(),
            status.message()
        ),
    )
    .retryable(http >= 500)
}
