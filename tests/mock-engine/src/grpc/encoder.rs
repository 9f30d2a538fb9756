//! A TokenSpeed EPD encode worker: `tokenspeed.grpc.encoder.TokenSpeedEncoder.Encode` (one
//! item, one room per call, as the current TokenSpeed encode worker accepts) and the embedding
//! bootstrap server the prefill fetches each item's embedding from.
//!
//! TokenSpeed moves the embedding over Mooncake, the encoder being the data source that hosts
//! the bootstrap server; the mock keeps that direction with plain HTTP on the encoder's
//! `bootstrap_port`: `GET /embedding/{room}?wait_ms=N` long-polls (up to `N` ms, default 1000,
//! at most 30 s) and answers `{"room", "feature", "content_hash"}` once, or 404. An embedding
//! nobody fetched within `bootstrap_timeout` is dropped (`embeddings_expired`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::Request;
use pdgate_proto::tokenspeed_encoder::token_speed_encoder_server::{
    TokenSpeedEncoder, TokenSpeedEncoderServer,
};
use pdgate_proto::tokenspeed_encoder::{EncodeRequest, EncodeResponse};
use serde_json::json;
use tokio::sync::Notify;
use tonic::{Code, Response, Status};

use super::{code_for_status, code_name, count_rpc, metadata_map, tonic_code};
use crate::config::{EngineKind, Fault};
use crate::engine::{protocol_name, Shared};
use crate::records::{now_ms, EncodeRecord, Handoff, RequestRecord};
use crate::server::{self, HttpResponse};
use crate::vision::hex;

pub(crate) const ENCODE_PATH: &str = "/tokenspeed.grpc.encoder.TokenSpeedEncoder/Encode";
/// The longest one embedding long-poll waits.
const MAX_POLL: Duration = Duration::from_secs(30);

/// The embeddings an encode worker published, by bootstrap room, until a prefill fetches them.
#[derive(Default)]
pub(crate) struct EncoderState {
    embeddings: Mutex<HashMap<u64, Embedding>>,
    published: Notify,
    next: std::sync::atomic::AtomicU64,
}

#[derive(Clone)]
struct Embedding {
    /// Which publication this is (a room re-encoded later is a new one).
    id: u64,
    feature: u64,
    content_hash: String,
}

impl EncoderState {
    fn publish(&self, room: u64, feature: u64, content_hash: String) -> u64 {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.embeddings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                room,
                Embedding {
                    id,
                    feature,
                    content_hash,
                },
            );
        self.published.notify_waiters();
        id
    }

    fn take(&self, room: u64, id: Option<u64>) -> Option<Embedding> {
        let mut m = self.embeddings.lock().unwrap_or_else(|e| e.into_inner());
        match m.get(&room) {
            Some(e) if id.is_none_or(|id| id == e.id) => m.remove(&room),
            _ => None,
        }
    }

    /// Embeddings published and not fetched yet.
    pub(crate) fn pending(&self) -> usize {
        self.embeddings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

#[derive(Clone)]
pub(crate) struct EncoderService {
    shared: Arc<Shared>,
}

pub(super) fn service(shared: &Arc<Shared>) -> TokenSpeedEncoderServer<EncoderService> {
    TokenSpeedEncoderServer::new(EncoderService {
        shared: shared.clone(),
    })
}

/// Ends an `Encode` call's record; dropped unfinished (the client left a hung call), it
/// records the hang-up.
struct EncodeGuard {
    shared: Arc<Shared>,
    seq: u64,
    done: bool,
}

impl EncodeGuard {
    fn finish(&mut self, result: &Result<u64, Status>) {
        self.done = true;
        let code = result.as_ref().map_or_else(Status::code, |_| Code::Ok);
        let name = code_name(code);
        self.shared
            .counters
            .with(|c| *c.by_grpc_code.entry(name.to_string()).or_default() += 1);
        self.shared.recorder.update(self.seq, |r| {
            r.outcome.grpc_code = Some(name.to_string());
            r.outcome.done_at_ms = Some(now_ms());
            r.outcome.head_at_ms = Some(now_ms());
            match result {
                Ok(feature) => {
                    if let Some(e) = r.encode.as_mut() {
                        e.feature = Some(*feature);
                    }
                }
                Err(st) => r.outcome.error = Some(st.message().to_string()),
            }
        });
    }
}

impl Drop for EncodeGuard {
    fn drop(&mut self) {
        super::generate::call_ended(&self.shared, self.seq, self.done);
    }
}

#[tonic::async_trait]
impl TokenSpeedEncoder for EncoderService {
    async fn encode(
        &self,
        request: tonic::Request<EncodeRequest>,
    ) -> Result<Response<EncodeResponse>, Status> {
        let sh = &self.shared;
        count_rpc(sh, "Encode");
        let peer = request.remote_addr();
        let metadata = metadata_map(request.metadata());
        let req = request.into_inner();
        let items = req.mm_inputs.as_ref().map_or(&[][..], |m| &m.items[..]);
        let record = EncodeRecord {
            request_id: req.request_id.clone(),
            room: req.items.first().map(|a| a.bootstrap_room),
            content_hash: items
                .first()
                .map(|i| hex(&i.content_hash))
                .unwrap_or_default(),
            feature: None,
            had_pixels: items.iter().any(|i| i.encoder_input.is_some()),
        };
        let seq = sh.recorder.push(RequestRecord {
            arrive_ms: now_ms(),
            method: "POST".into(),
            path: ENCODE_PATH.into(),
            headers: metadata,
            body: json!({
                "request_id": req.request_id,
                "items": items.len(),
                "rooms": req.items.iter().map(|a| a.bootstrap_room).collect::<Vec<_>>(),
            }),
            client_addr: peer.map(|p| p.to_string()).unwrap_or_default(),
            handoff: Handoff {
                role: sh.cfg.role.as_str().into(),
                protocol: protocol_name(&sh.cfg),
                room: req.items.first().map(|a| a.bootstrap_room as u64),
                ..Default::default()
            },
            encode: Some(record),
            ..Default::default()
        });
        sh.counters.with(|c| {
            c.requests_total += 1;
            c.in_flight += 1;
            *c.by_route.entry(ENCODE_PATH.to_string()).or_default() += 1;
        });
        let mut guard = EncodeGuard {
            shared: sh.clone(),
            seq,
            done: false,
        };
        let result = encode(sh, seq, &req).await;
        guard.finish(&result);
        result.map(|_| Response::new(EncodeResponse { accepted: true }))
    }
}

/// Runs one `Encode`: faults, checks, the item's feature, published under its room.
async fn encode(shared: &Arc<Shared>, seq: u64, req: &EncodeRequest) -> Result<u64, Status> {
    if shared.crashed.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(Status::internal("engine is dead (scheduler crashed)"));
    }
    let fault = shared.take_fault(ENCODE_PATH, |f| {
        matches!(
            f,
            Fault::FailStatus { .. }
                | Fault::GrpcStatus { .. }
                | Fault::Hang { .. }
                | Fault::DelayHead { .. }
        )
    });
    if let Some(f) = fault {
        shared.timeline(seq, format!("fault:{}", f.kind()));
        match f {
            Fault::FailStatus { status, body, .. } => {
                return Err(Status::new(
                    code_for_status(EngineKind::TokenSpeed, status),
                    body.unwrap_or_else(|| format!("mock fault: status {status}")),
                ));
            }
            Fault::GrpcStatus { code, message, .. } => {
                return Err(Status::new(
                    tonic_code(code),
                    message.unwrap_or_else(|| format!("mock fault: {}", code.name())),
                ));
            }
            // Until the client leaves (tonic drops this future, the guard records it).
            Fault::Hang { .. } => std::future::pending::<()>().await,
            Fault::DelayHead { ms, .. } => tokio::time::sleep(Duration::from_millis(ms)).await,
            _ => {}
        }
    }
    let Some(vision) = shared.cfg.vision.as_ref() else {
        return Err(Status::failed_precondition(
            "this encode worker has no vision tower configured",
        ));
    };
    let items = req.mm_inputs.as_ref().map_or(&[][..], |m| &m.items[..]);
    let ([item], [assignment]) = (items, &req.items[..]) else {
        return Err(Status::invalid_argument(format!(
            "the encode worker accepts exactly one multimodal item and one bootstrap room per EncodeRequest, got {} items and {} rooms",
            items.len(),
            req.items.len()
        )));
    };
    if item.encoder_input.is_none() {
        return Err(Status::invalid_argument(
            "EncodeRequest item has no encoder_input (nothing to encode)",
        ));
    }
    if assignment.bootstrap_room < 0 {
        return Err(Status::invalid_argument(format!(
            "bootstrap_room must be non-negative, got {}",
            assignment.bootstrap_room
        )));
    }
    let feature = super::tokenspeed::item_feature(vision, item, "mm_inputs.items[0]")?
        .ok_or_else(|| Status::invalid_argument("EncodeRequest item has no encoder_input"))?;
    let room = assignment.bootstrap_room as u64;
    let id = shared
        .encoder
        .publish(room, feature, hex(&item.content_hash));
    shared.counters.with(|c| c.encodes += 1);
    shared.timeline(seq, format!("embedding published under room {room}"));
    // Dropped when no prefill fetched it within the bootstrap timeout.
    let sh = shared.clone();
    let ttl = shared.cfg.bootstrap_timeout;
    shared.groups.work.spawn(async move {
        tokio::time::sleep(ttl).await;
        if sh.encoder.take(room, Some(id)).is_some() {
            sh.counters.with(|c| c.embeddings_expired += 1);
        }
    });
    Ok(feature)
}

/// The encoder's bootstrap server: `GET /embedding/{room}` (long poll) and `GET /health`.
pub(crate) async fn embedding_server(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    _peer: SocketAddr,
) -> HttpResponse {
    let path = req.uri().path().to_string();
    let query = server::query_pairs(req.uri().query());
    if req.method() != hyper::Method::GET {
        return server::text(405, "method not allowed");
    }
    if path == "/health" {
        return server::text(200, "OK");
    }
    let Some(room) = path
        .strip_prefix("/embedding/")
        .and_then(|r| r.parse::<u64>().ok())
    else {
        return server::json(404, &json!({"error": format!("no route {path}")}));
    };
    let wait = query
        .iter()
        .find(|(k, _)| k == "wait_ms")
        .and_then(|(_, v)| v.parse::<u64>().ok())
        .map_or(Duration::from_secs(1), Duration::from_millis)
        .min(MAX_POLL);
    let deadline = tokio::time::Instant::now() + wait;
    let st = &shared.encoder;
    loop {
        let notified = st.published.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if let Some(e) = st.take(room, None) {
            shared.counters.with(|c| c.embeddings_fetched += 1);
            return server::json(
                200,
                &json!({"room": room, "feature": e.feature, "content_hash": e.content_hash}),
            );
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return server::json(
                404,
                &json!({"error": format!("no embedding published for bootstrap_room {room}")}),
            );
        }
    }
}
