//! SGLang's PD handoff over HTTP (mock-engines-spec §1.1, §2.3): the bootstrap server every
//! prefill runs, the bootstrap-room rendezvous, and the KV push from prefill to decode.
//!
//! Wire order, as SGLang does it: the decode fetches `GET /route` from `bootstrap_host:port`,
//! registers itself as the room's receiver on the prefill rank's data port, and waits; the prefill
//! request waits for its receiver (`bootstrap_timeout`), only then "computes" and pushes the
//! payload (prompt state, first token, cached tokens), and answers only after the decode took it.
//! The decode's first token and state come *only* from that payload.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::Request;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::client;
use crate::config::{Connector, Fault, MockEngineConfig};
use crate::engine::{generate, send_prompt, Gauge, ReqCtx, RoomInfo, Shared, StepTx};
use crate::fake_model::{self, Decoder};
use crate::job::{ApiError, ErrorKind, Job, JobItem};
use crate::records::now_ms;
use crate::render::{FinishKind, Step};
use crate::server::{self, HttpResponse, TaskGroup};

/// The decode's heartbeat request timeout (SGLang: `requests.get(..., timeout=(2, 2))`).
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);

/// The SGLang warmup host: no transfer, the decode runs over KV that never arrived.
pub const FAKE_BOOTSTRAP_HOST: &str = "2.2.2.2";

/// Bootstrap fields of one room.
#[derive(Clone, Debug)]
pub struct BootstrapItem {
    pub host: Option<String>,
    /// `None` = JSON `null` (the engine substitutes its default port).
    pub port: Option<u16>,
    pub room: u64,
    pub routed_dp_rank: Option<u32>,
    pub disagg_prefill_dp_rank: Option<u32>,
}

fn pick(v: Option<&Value>, idx: usize, batched: bool) -> Option<&Value> {
    match v {
        Some(Value::Array(a)) if batched => a.get(idx),
        Some(Value::Array(a)) => a.first(),
        other => other,
    }
}

/// Validates and splits the bootstrap fields (one entry per room index).
pub fn parse_bootstrap(
    _cfg: &MockEngineConfig,
    job: &Job,
    body: &Value,
) -> Result<Vec<BootstrapItem>, ApiError> {
    let mut out = Vec::new();
    for i in 0..job.n_rooms.max(1) {
        let room =
            match pick(body.get("bootstrap_room"), i, job.batched) {
                None | Some(Value::Null) => return Err(ApiError::bad_request(
                    "Invalid request: Disaggregated request received without bootstrap room id.",
                )),
                Some(Value::Number(n)) if n.as_u64().is_some() => n.as_u64().unwrap_or_default(),
                Some(_) => return Err(ApiError::bad_request("bootstrap_room must be an integer")),
            };
        let host = pick(body.get("bootstrap_host"), i, job.batched)
            .and_then(Value::as_str)
            .map(str::to_string);
        let port = match pick(body.get("bootstrap_port"), i, job.batched) {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_u64()
                    .filter(|p| *p <= u16::MAX as u64)
                    .ok_or_else(|| ApiError::bad_request("bootstrap_port must be an integer"))?
                    as u16,
            ),
        };
        let rank = |k: &str| {
            pick(body.get(k), i, job.batched)
                .and_then(Value::as_u64)
                .map(|r| r as u32)
        };
        out.push(BootstrapItem {
            host,
            port,
            room,
            routed_dp_rank: rank("routed_dp_rank"),
            disagg_prefill_dp_rank: rank("disagg_prefill_dp_rank"),
        });
    }
    Ok(out)
}

/// What a decode registers with the prefill for one room.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReceiverInfo {
    pub decode_id: String,
    /// Base URL of the decode's data plane (where the payload is pushed).
    pub callback: String,
    pub prompt_len: usize,
    pub dp_rank: u32,
    /// The decode's `host:port` (for error messages and records).
    pub decode_addr: String,
}

/// The KV "transfer": everything a decode needs to continue the prompt.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KvPayload {
    pub room: u64,
    pub prompt_state: u64,
    pub t0: u32,
    pub t0_logprob: f64,
    pub cached_tokens: usize,
    pub prompt_len: usize,
    pub prompt_digest: String,
    pub engine_id: String,
    pub dp_rank: u32,
}

enum PEvent {
    Receiver(ReceiverInfo),
    DecodeAborted(String),
}

enum DEvent {
    Payload(KvPayload),
    PrefillAborted(String),
}

struct PRoom {
    id: u64,
    request: Option<mpsc::UnboundedSender<PEvent>>,
    receiver: Option<ReceiverInfo>,
    state: &'static str,
    opened_ms: f64,
}

struct DSlot {
    id: u64,
    events: mpsc::UnboundedSender<DEvent>,
    peer: String,
    opened_ms: f64,
}

/// Rendezvous tables and bootstrap-server registrations of one engine.
#[derive(Default)]
pub struct SglState {
    prefill: Mutex<HashMap<(u32, u64), PRoom>>,
    decode: Mutex<HashMap<u64, DSlot>>,
    ranks: Mutex<Vec<Value>>,
    dp_rooms: Mutex<HashMap<u64, u32>>,
}

impl SglState {
    pub fn rooms(&self) -> Vec<RoomInfo> {
        let now = now_ms();
        let mut v: Vec<RoomInfo> = self
            .prefill
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|((rank, room), r)| RoomInfo {
                room: room.to_string(),
                side: "prefill".into(),
                state: r.state.into(),
                dp_rank: *rank,
                peer: r.receiver.as_ref().map(|x| x.decode_addr.clone()),
                age_ms: now - r.opened_ms,
            })
            .collect();
        v.extend(
            self.decode
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|(room, s)| RoomInfo {
                    room: room.to_string(),
                    side: "decode".into(),
                    state: "WaitingForInput".into(),
                    dp_rank: 0,
                    peer: Some(s.peer.clone()),
                    age_ms: now - s.opened_ms,
                }),
        );
        v
    }

    pub fn count(&self, side: &str) -> usize {
        match side {
            "prefill" => self.prefill.lock().unwrap_or_else(|e| e.into_inner()).len(),
            _ => self.decode.lock().unwrap_or_else(|e| e.into_inner()).len(),
        }
    }
}

fn fmt_secs(d: Duration) -> String {
    format!("{}", d.as_secs_f64())
}

/// A `KVTransferError` of the prefill side (the rendezvous did not complete).
fn prefill_error(ctx: &ReqCtx, room: u64, reason: &str) -> ApiError {
    ApiError::internal(format!(
        "Prefill transfer failed for request rank=0 req.rid='{}' req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): {reason}",
        ctx.job.rid
    ))
    .with_kind(ErrorKind::KvTimeout)
}

/// A `KVTransferError` of the decode side (the rendezvous did not complete).
fn decode_error(ctx: &ReqCtx, room: u64, reason: &str) -> ApiError {
    ApiError::internal(format!(
        "Decode transfer failed for request rank=0 decode_req.req.rid='{}' decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): {reason}",
        ctx.job.rid
    ))
    .with_kind(ErrorKind::KvTimeout)
}

/// Removes a prefill room when its request ends; a room that did not reach Success tells its
/// receiver (the decode then fails with "it might be dead"), unless the engine was killed.
struct PRoomGuard {
    shared: Arc<Shared>,
    key: (u32, u64),
    id: u64,
    success: bool,
    receiver: Option<ReceiverInfo>,
}

impl Drop for PRoomGuard {
    fn drop(&mut self) {
        {
            let mut rooms = self
                .shared
                .sgl
                .prefill
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if rooms.get(&self.key).is_some_and(|r| r.id == self.id) {
                let r = rooms.remove(&self.key);
                if self.receiver.is_none() {
                    self.receiver = r.and_then(|r| r.receiver);
                }
            }
        }
        if self.success || self.shared.is_killed() {
            return;
        }
        self.shared.counters.with(|c| c.rooms_orphaned += 1);
        if let Some(rcv) = self.receiver.take() {
            let url = format!("{}/mock-kv/sglang/{}/abort", rcv.callback, self.key.1);
            spawn_quiet(async move {
                let _ =
                    client::post_json(&url, &json!({"side":"prefill","dp_rank":rcv.dp_rank})).await;
            });
        }
    }
}

fn spawn_quiet<F: std::future::Future<Output = ()> + Send + 'static>(f: F) {
    if let Ok(h) = tokio::runtime::Handle::try_current() {
        h.spawn(f);
    }
}

fn own_dp_rank(ctx: &ReqCtx, b: &BootstrapItem) -> Result<u32, ApiError> {
    let dp = ctx.cfg().dp_size.max(1);
    let implied = (b.room % dp as u64) as u32;
    match b.routed_dp_rank {
        Some(r) if dp > 1 && ctx.cfg().load_balance_method == "follow_bootstrap_room" && r != implied => Err(ApiError::internal(format!(
            "follow_bootstrap_room conflict: dispatched to dp_rank {r} but bootstrap_room {} implies dp_rank {implied}. Set SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 or use a consistent router.",
            b.room
        ))),
        Some(r) => Ok(r.min(dp - 1)),
        None => Ok(implied),
    }
}

/// A prefill leg: open the room, wait for the receiver, compute, push, answer.
pub(crate) async fn run_prefill_item(
    ctx: &Arc<ReqCtx>,
    item: &JobItem,
    dup: bool,
    tx: &StepTx,
) -> Result<(), ApiError> {
    let shared = &ctx.shared;
    let cfg = ctx.cfg();
    let b = ctx.bootstrap[item.room_index].clone();
    let room = b.room;
    shared.record_item(ctx.seq, item.index, |h| h.room = Some(room));
    let rank = own_dp_rank(ctx, &b)?;
    shared.record_item(ctx.seq, item.index, |h| h.dp_rank = Some(rank));
    let timeout_err = || {
        prefill_error(
            ctx,
            room,
            &format!(
                "Request {room} timed out after {}s in KVPoll.Bootstrapping",
                fmt_secs(cfg.bootstrap_timeout)
            ),
        )
    };
    let _waiting = Gauge::new(&shared.waiting);
    if dup {
        // Extra samples sharing one room never get a receiver of their own.
        tokio::time::sleep(cfg.bootstrap_timeout).await;
        shared.counters.with(|c| c.bootstrap_failed += 1);
        return Err(timeout_err());
    }
    let (etx, mut erx) = mpsc::unbounded_channel();
    let id = shared.next_id();
    let mut guard = PRoomGuard {
        shared: shared.clone(),
        key: (rank, room),
        id,
        success: false,
        receiver: None,
    };
    {
        let mut rooms = shared.sgl.prefill.lock().unwrap_or_else(|e| e.into_inner());
        match rooms.get_mut(&(rank, room)) {
            Some(r) if r.request.is_some() => {
                guard.id = u64::MAX; // not ours: leave the other request's room alone
                return Err(prefill_error(
                    ctx,
                    room,
                    &format!("duplicate bootstrap_room {room}: a room identifies one request"),
                )
                .with_kind(ErrorKind::Request));
            }
            Some(r) => {
                r.id = id;
                r.request = Some(etx);
                r.state = "WaitingForInput";
                guard.receiver = r.receiver.clone();
            }
            None => {
                rooms.insert(
                    (rank, room),
                    PRoom {
                        id,
                        request: Some(etx),
                        receiver: None,
                        state: "Bootstrapping",
                        opened_ms: now_ms(),
                    },
                );
            }
        }
    }
    shared.timeline(ctx.seq, format!("room {room} opened (dp_rank {rank})"));
    let t_wait = now_ms();
    if guard.receiver.is_none() {
        let ev = tokio::time::timeout(cfg.bootstrap_timeout, erx.recv()).await;
        match ev {
            Err(_) | Ok(None) => {
                shared.counters.with(|c| c.bootstrap_failed += 1);
                shared.record_item(ctx.seq, item.index, |h| {
                    h.error = Some("bootstrap timeout".into())
                });
                return Err(timeout_err());
            }
            Ok(Some(PEvent::Receiver(r))) => guard.receiver = Some(r),
            Ok(Some(PEvent::DecodeAborted(addr))) => {
                return Err(prefill_error(ctx, room, &format!("Decode instance could be dead, remote mooncake session {addr} is not alive")));
            }
        }
    }
    let rcv = guard.receiver.clone().expect("receiver set above");
    shared.record_item(ctx.seq, item.index, |h| {
        h.peer_addr = Some(rcv.decode_addr.clone());
        h.wait_ms = Some(now_ms() - t_wait);
    });
    shared.timeline(ctx.seq, format!("receiver {} registered", rcv.decode_addr));
    set_state(shared, (rank, room), id, "Transferring");

    // "Forward pass", aborted if the decode withdraws meanwhile.
    let ids = item.computed_ids()?;
    let cached = shared.prefix_cached_tokens(&ids);
    tokio::select! {
        _ = shared.prefill_forward(item.prompt_ids.len()) => {}
        Some(PEvent::DecodeAborted(addr)) = erx.recv() => {
            return Err(prefill_error(ctx, room, &format!("Decode instance could be dead, remote mooncake session {addr} is not alive")));
        }
    }
    let s0 = fake_model::initial_state(&cfg.model, item.spec.seed, item.sample);
    let s_n = fake_model::prompt_state(s0, &ids);
    let mut d = Decoder::new(s_n, item.spec.clone());
    if shared
        .take_fault(ctx.job.route.path(), |f| {
            matches!(f, Fault::EosFirstToken { .. })
        })
        .is_some()
    {
        d.force_eos_first();
    }
    let (t0, lp0) = d.peek();
    let mut payload = KvPayload {
        room,
        prompt_state: s_n,
        t0,
        t0_logprob: lp0,
        cached_tokens: cached,
        prompt_len: item.prompt_ids.len(),
        // Over the prompt ids the decode has too (it never sees the images' features); for a
        // text prompt this is `s_n`.
        prompt_digest: format!("{:016x}", fake_model::prompt_state(s0, &item.prompt_ids)),
        engine_id: shared.engine_id(),
        dp_rank: rank,
    };
    if shared
        .take_fault(ctx.job.route.path(), |f| {
            matches!(f, Fault::KvCorrupt { .. })
        })
        .is_some()
    {
        payload.prompt_state ^= 0x0BAD_0BAD_0BAD_0BAD;
        payload.t0 = item.spec.vocab.word_for(payload.prompt_state);
    }
    if let Some(Fault::SlowTransferMs { ms }) =
        shared.has_fault(|f| matches!(f, Fault::SlowTransferMs { .. }))
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if shared
        .has_fault(
            |f| matches!(f, Fault::LinkDown { peer } if rcv.decode_addr.contains(peer.as_str())),
        )
        .is_some()
    {
        // The transfer session to this decode is broken; the room's guard tells the decode.
        shared.counters.with(|c| c.transfer_failed += 1);
        shared.counters.handoff("link_down");
        return Err(prefill_error(
            ctx,
            room,
            &format!(
                "Failed to send kv chunk of {room} to {}: transfer session failed",
                rcv.decode_addr
            ),
        ));
    }
    let url = format!("{}/mock-kv/sglang/{room}/data", rcv.callback);
    let pushed = client::request_with(
        &client::ClientOptions {
            source_ip: Some(cfg.bind_ip),
            timeout: Some(Duration::from_secs(10)),
        },
        "POST",
        &url,
        &[("content-type", "application/json")],
        Some(serde_json::to_vec(&payload).unwrap_or_default().into()),
    )
    .await;
    match pushed {
        Ok(r) if r.status == 200 => {}
        _ => {
            shared.counters.with(|c| c.transfer_failed += 1);
            shared.counters.handoff("refused");
            guard.receiver = None; // the decode is gone; nobody to tell
            return Err(prefill_error(
                ctx,
                room,
                &format!(
                    "Decode instance could be dead, remote mooncake session {} is not alive",
                    rcv.decode_addr
                ),
            ));
        }
    }
    guard.success = true;
    drop(guard);
    shared.counters.handoff("ok");
    shared.record_item(ctx.seq, item.index, |h| {
        h.kv_source = Some("none".into());
        h.prompt_digest = Some(payload.prompt_digest.clone());
        h.integrity = Some("n/a".into());
    });
    shared.timeline(ctx.seq, format!("room {room} KVPoll.Success"));
    send_prompt(ctx, item, tx, cached, true);
    if ctx.job.route == crate::job::Route::Rerank {
        generate(ctx, item, Decoder::new(s_n, item.spec.clone()), None, tx).await;
        return Ok(());
    }
    let tok = d.step_forced(t0, lp0);
    match tok {
        Some(tok) => {
            let _ = tx.send(Step::Token {
                item: item.index,
                token: tok,
                visible: d.visible_text().to_string(),
                finish: Some(FinishKind::PrefillHandoff),
            });
        }
        None => {
            let _ = tx.send(Step::Finish {
                item: item.index,
                finish: FinishKind::PrefillHandoff,
            });
        }
    }
    Ok(())
}

fn set_state(shared: &Shared, key: (u32, u64), id: u64, state: &'static str) {
    if let Some(r) = shared
        .sgl
        .prefill
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_mut(&key)
    {
        if r.id == id {
            r.state = state;
        }
    }
}

/// Removes a decode slot when its request ends; a slot that never got its payload withdraws
/// from the prefill (SGLang sends `ABORT` for the room), unless the engine was killed.
struct DSlotGuard {
    shared: Arc<Shared>,
    room: u64,
    id: u64,
    done: bool,
    prefill_data: Option<(String, u32)>,
}

impl Drop for DSlotGuard {
    fn drop(&mut self) {
        {
            let mut slots = self
                .shared
                .sgl
                .decode
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if slots.get(&self.room).is_some_and(|s| s.id == self.id) {
                slots.remove(&self.room);
            }
        }
        if self.done || self.shared.is_killed() {
            return;
        }
        if let Some((url, rank)) = self.prefill_data.take() {
            let url = format!("{url}/mock-kv/sglang/{}/abort", self.room);
            let me = self.shared.data_url();
            spawn_quiet(async move {
                let _ = client::post_json(
                    &url,
                    &json!({"side":"decode","dp_rank":rank,"decode_addr":me}),
                )
                .await;
            });
        }
    }
}

/// `GET /route` with all ranks = -1, retried as SGLang's `try_ensure_parallel_info`.
async fn fetch_parallel_info(ctx: &ReqCtx, idx: usize, addr: &str) -> Result<Value, ApiError> {
    let cfg = ctx.cfg();
    let url = format!("http://{addr}/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1");
    let attempts = cfg.ensure_retries.max(1);
    for n in 1..=attempts {
        ctx.shared
            .record_item(ctx.seq, idx, |h| h.route_attempts = n);
        let opts = client::ClientOptions {
            source_ip: Some(cfg.bind_ip),
            timeout: Some(Duration::from_secs(5)),
        };
        if let Ok(r) = client::request_with(&opts, "GET", &url, &[], None).await {
            if r.status == 200 {
                let v = r.json();
                if v.get("dp_size").is_some() {
                    return Ok(v);
                }
            }
        }
        if n < attempts {
            tokio::time::sleep(cfg.ensure_retry_interval).await;
        }
    }
    ctx.shared.counters.with(|c| c.bootstrap_failed += 1);
    Err(ApiError::internal(format!(
        "Could not fetch prefill parallel info from {addr} after {attempts} attempts"
    ))
    .with_kind(ErrorKind::KvTimeout))
}

/// A decode leg: find the prefill through its bootstrap server, register as receiver, wait for
/// the payload, then decode from the handed-over state.
pub(crate) async fn run_decode_item(
    ctx: &Arc<ReqCtx>,
    item: &JobItem,
    dup: bool,
    tx: &StepTx,
) -> Result<(), ApiError> {
    let shared = &ctx.shared;
    let cfg = ctx.cfg();
    let b = ctx.bootstrap[item.room_index].clone();
    let room = b.room;
    let host = b.host.clone().ok_or_else(|| {
        ApiError::bad_request(
            "Invalid request: Disaggregated request received without bootstrap host.",
        )
    })?;
    let port = b.port.unwrap_or(cfg.default_bootstrap_port);
    let addr = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    shared.record_item(ctx.seq, item.index, |h| {
        h.room = Some(room);
        h.peer_addr = Some(addr.clone());
    });
    let s0 = fake_model::initial_state(&cfg.model, item.spec.seed, item.sample);
    if host == FAKE_BOOTSTRAP_HOST || cfg.connector == Connector::Fake {
        shared.record_item(ctx.seq, item.index, |h| h.kv_source = Some("fake".into()));
        send_prompt(ctx, item, tx, 0, false);
        let d = Decoder::new(
            fake_model::garbage_state(s0, item.prompt_ids.len()),
            item.spec.clone(),
        );
        generate(ctx, item, d, None, tx).await;
        return Ok(());
    }
    let _waiting = Gauge::new(&shared.waiting);
    let wait_err = || {
        decode_error(
            ctx,
            room,
            &format!(
                "Request {room} timed out after {}s in KVPoll.WaitingForInput",
                fmt_secs(cfg.waiting_timeout)
            ),
        )
    };
    if dup {
        tokio::time::sleep(cfg.waiting_timeout).await;
        return Err(wait_err());
    }
    let info = fetch_parallel_info(ctx, item.index, &addr).await?;
    let p_page = info.get("page_size").and_then(Value::as_u64).unwrap_or(1);
    if p_page != cfg.page_size as u64 {
        return Err(decode_error(
            ctx,
            room,
            &format!("Page size mismatch: prefill server has page_size={p_page}, but decode server has page_size={}", cfg.page_size),
        ).with_kind(ErrorKind::Request));
    }
    let p_dtype = info
        .get("kv_cache_dtype")
        .and_then(Value::as_str)
        .unwrap_or("auto");
    if p_dtype != cfg.kv_cache_dtype {
        return Err(decode_error(
            ctx,
            room,
            &format!("KV cache dtype mismatch: prefill server has kv_cache_dtype={p_dtype}, but decode server has kv_cache_dtype={}", cfg.kv_cache_dtype),
        ).with_kind(ErrorKind::Request));
    }
    let p_dp = info
        .get("dp_size")
        .and_then(Value::as_u64)
        .unwrap_or(1)
        .max(1);
    let follow = info
        .get("follow_bootstrap_room")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let p_rank = match b.disagg_prefill_dp_rank {
        Some(r) => r as u64,
        None if follow || p_dp == 1 => room % p_dp,
        None => {
            let url = format!("http://{addr}/query_dp_ranks");
            let r = client::post_json(&url, &json!({"bootstrap_rooms":[room]}))
                .await
                .ok()
                .map(|r| r.json());
            r.and_then(|v| v.get(room.to_string()).and_then(Value::as_u64))
                .unwrap_or(room % p_dp)
        }
    };
    let rank_url = format!("http://{addr}/route?prefill_dp_rank={p_rank}&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0");
    let opts = client::ClientOptions {
        source_ip: Some(cfg.bind_ip),
        timeout: Some(Duration::from_secs(5)),
    };
    let rank_info = match client::request_with(&opts, "GET", &rank_url, &[], None).await {
        Ok(r) if r.status == 200 => r.json(),
        Ok(r) => return Err(decode_error(ctx, room, &r.text())),
        Err(_) => {
            return Err(decode_error(
                ctx,
                room,
                "Failed to get kvcache from prefill instance, it might be dead",
            ))
        }
    };
    let rank_ip = rank_info
        .get("rank_ip")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let rank_port = rank_info
        .get("rank_port")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let p_data = format!("http://{rank_ip}:{rank_port}");

    let (etx, mut erx) = mpsc::unbounded_channel();
    let id = shared.next_id();
    {
        let mut slots = shared.sgl.decode.lock().unwrap_or_else(|e| e.into_inner());
        if slots.contains_key(&room) {
            return Err(decode_error(
                ctx,
                room,
                &format!("duplicate bootstrap_room {room}: a room identifies one request"),
            )
            .with_kind(ErrorKind::Request));
        }
        slots.insert(
            room,
            DSlot {
                id,
                events: etx,
                peer: addr.clone(),
                opened_ms: now_ms(),
            },
        );
    }
    let mut guard = DSlotGuard {
        shared: shared.clone(),
        room,
        id,
        done: false,
        prefill_data: None,
    };
    let me = shared.data_url();
    let reg = ReceiverInfo {
        decode_id: shared.engine_id(),
        callback: me.clone(),
        prompt_len: item.prompt_ids.len(),
        dp_rank: p_rank as u32,
        decode_addr: me.trim_start_matches("http://").to_string(),
    };
    let reg_url = format!("{p_data}/mock-kv/sglang/{room}/receiver");
    let t_wait = now_ms();
    match client::request_with(
        &opts,
        "POST",
        &reg_url,
        &[("content-type", "application/json")],
        Some(serde_json::to_vec(&reg).unwrap_or_default().into()),
    )
    .await
    {
        Ok(r) if r.status == 200 => guard.prefill_data = Some((p_data.clone(), p_rank as u32)),
        Ok(r) => return Err(decode_error(ctx, room, &r.text())),
        Err(_) => {
            return Err(decode_error(
                ctx,
                room,
                "Failed to get kvcache from prefill instance, it might be dead",
            ))
        }
    }
    shared.timeline(
        ctx.seq,
        format!("registered as receiver of room {room} at {p_data}"),
    );

    let deadline = tokio::time::Instant::now() + cfg.waiting_timeout;
    let hb_every = cfg.heartbeat_interval.max(Duration::from_millis(10));
    let mut hb = tokio::time::interval_at(tokio::time::Instant::now() + hb_every, hb_every);
    let mut hb_failures = 0;
    let payload = loop {
        tokio::select! {
            ev = erx.recv() => match ev {
                Some(DEvent::Payload(p)) => break p,
                Some(DEvent::PrefillAborted(reason)) => {
                    guard.prefill_data = None;
                    shared.counters.with(|c| c.transfer_failed += 1);
                    return Err(decode_error(ctx, room, &reason));
                }
                None => return Err(decode_error(ctx, room, "Aborted by AbortReq.")),
            },
            _ = tokio::time::sleep_until(deadline) => {
                shared.counters.with(|c| c.transfer_failed += 1);
                shared.counters.handoff("timeout");
                return Err(wait_err());
            }
            _ = hb.tick() => {
                // SGLang's heartbeat GETs the bootstrap server with a 2 s timeout whatever the
                // interval; a shorter one fails live prefills on a loaded machine.
                let hb_timeout = hb_every.max(HEARTBEAT_TIMEOUT);
                let ok = client::request_with(&client::ClientOptions { source_ip: Some(cfg.bind_ip), timeout: Some(hb_timeout) }, "GET", &format!("http://{addr}/health"), &[], None)
                    .await
                    .is_ok_and(|r| r.status == 200);
                hb_failures = if ok { 0 } else { hb_failures + 1 };
                if hb_failures >= cfg.heartbeat_max_failure.max(1) {
                    shared.counters.with(|c| c.transfer_failed += 1);
                    return Err(decode_error(ctx, room, &format!("Lost connection with prefill instance (bootstrap_addr: {addr})")));
                }
            }
        }
    };
    guard.done = true;
    drop(guard);
    let own_digest = format!("{:016x}", fake_model::prompt_state(s0, &item.prompt_ids));
    let integrity = if own_digest == payload.prompt_digest && payload.room == room {
        "ok"
    } else {
        "mismatch"
    };
    shared.record_item(ctx.seq, item.index, |h| {
        h.kv_source = Some("remote".into());
        h.prompt_digest = Some(payload.prompt_digest.clone());
        h.integrity = Some(integrity.into());
        h.wait_ms = Some(now_ms() - t_wait);
    });
    shared.timeline(ctx.seq, format!("room {room} payload received"));
    // A full running batch: the request waits with its KV until a slot frees.
    let _slot = if cfg.enforce_running_window {
        let _waiting = Gauge::new(&shared.waiting);
        shared.decode_slots.clone().acquire_owned().await.ok()
    } else {
        None
    };
    send_prompt(ctx, item, tx, payload.cached_tokens, false);
    let d = Decoder::new(payload.prompt_state, item.spec.clone());
    generate(ctx, item, d, Some((payload.t0, payload.t0_logprob)), tx).await;
    Ok(())
}

/// KV data-plane endpoints (`/mock-kv/sglang/{room}/{receiver|data|abort}`).
pub(crate) async fn data_plane(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    _peer: SocketAddr,
) -> HttpResponse {
    let path = req.uri().path().to_string();
    let parts: Vec<&str> = path
        .trim_start_matches("/mock-kv/sglang/")
        .split('/')
        .collect();
    let (Some(room), Some(action)) = (
        parts.first().and_then(|r| r.parse::<u64>().ok()),
        parts.get(1).map(|s| s.to_string()),
    ) else {
        return server::text(404, "Not Found");
    };
    let body: Value =
        serde_json::from_slice(&server::read_body(req.into_body()).await.unwrap_or_default())
            .unwrap_or(Value::Null);
    match action.as_str() {
        "receiver" => {
            let Ok(info) = serde_json::from_value::<ReceiverInfo>(body) else {
                return server::text(400, "bad receiver info");
            };
            if shared.cfg.role != crate::config::Role::Prefill {
                return server::text(404, "not a prefill");
            }
            let key = (info.dp_rank, room);
            let mut rooms = shared.sgl.prefill.lock().unwrap_or_else(|e| e.into_inner());
            match rooms.get_mut(&key) {
                Some(r) if r.receiver.is_some() => server::text(
                    409,
                    format!("A room identifies one request: room {room} already has a receiver"),
                ),
                Some(r) => {
                    r.receiver = Some(info.clone());
                    r.state = "WaitingForInput";
                    if let Some(tx) = &r.request {
                        let _ = tx.send(PEvent::Receiver(info));
                    }
                    server::text(200, "OK")
                }
                None => {
                    // The decode arrived first: keep its metadata until the prefill request comes.
                    let id = shared.next_id();
                    rooms.insert(
                        key,
                        PRoom {
                            id,
                            request: None,
                            receiver: Some(info),
                            state: "pending-receiver",
                            opened_ms: now_ms(),
                        },
                    );
                    let sh = shared.clone();
                    let ttl = shared.cfg.bootstrap_timeout.max(shared.cfg.waiting_timeout)
                        + Duration::from_secs(1);
                    shared.groups.work.spawn(async move {
                        tokio::time::sleep(ttl).await;
                        let mut rooms = sh.sgl.prefill.lock().unwrap_or_else(|e| e.into_inner());
                        if rooms
                            .get(&key)
                            .is_some_and(|r| r.id == id && r.request.is_none())
                        {
                            rooms.remove(&key);
                            sh.counters.with(|c| c.rooms_orphaned += 1);
                        }
                    });
                    server::text(200, "OK")
                }
            }
        }
        "abort" if body.get("side").and_then(Value::as_str) == Some("decode") => {
            let rank = body.get("dp_rank").and_then(Value::as_u64).unwrap_or(0) as u32;
            let who = body
                .get("decode_addr")
                .and_then(Value::as_str)
                .unwrap_or("")
                .trim_start_matches("http://")
                .to_string();
            let mut rooms = shared.sgl.prefill.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(r) = rooms.get_mut(&(rank, room)) {
                match &r.request {
                    Some(tx) => {
                        let _ = tx.send(PEvent::DecodeAborted(who));
                    }
                    None => {
                        rooms.remove(&(rank, room));
                    }
                }
            }
            server::text(200, "OK")
        }
        "abort" => {
            let slots = shared.sgl.decode.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = slots.get(&room) {
                let _ = s.events.send(DEvent::PrefillAborted(
                    "Failed to get kvcache from prefill instance, it might be dead".into(),
                ));
            }
            server::text(200, "OK")
        }
        "data" => {
            let Ok(p) = serde_json::from_value::<KvPayload>(body) else {
                return server::text(400, "bad payload");
            };
            let slots = shared.sgl.decode.lock().unwrap_or_else(|e| e.into_inner());
            match slots.get(&room) {
                Some(s) if s.events.send(DEvent::Payload(p)).is_ok() => server::text(200, "OK"),
                _ => server::text(404, format!("no receiver waiting for room {room}")),
            }
        }
        _ => server::text(404, "Not Found"),
    }
}

/// The prefill's bootstrap server (and vLLM Mooncake's `/register` + `/query`).
pub(crate) async fn bootstrap_server(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> HttpResponse {
    if shared.cfg.role == crate::config::Role::Encode {
        return crate::grpc::encoder::embedding_server(shared, req, peer).await;
    }
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = server::query_pairs(req.uri().query());
    if shared.cfg.engine == crate::config::EngineKind::Vllm {
        return crate::vllm::mooncake_bootstrap(shared, req, peer).await;
    }
    let body = server::read_body(req.into_body()).await.unwrap_or_default();
    match (method.as_str(), path.as_str()) {
        ("GET", "/health") => server::text(200, "OK"),
        ("PUT", "/route") => {
            let Ok(v) = serde_json::from_slice::<Value>(&body) else {
                return server::text(400, "bad registration");
            };
            shared
                .sgl
                .ranks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(v);
            server::text(200, "OK")
        }
        ("GET", "/route") => {
            let get = |k: &str| {
                query
                    .iter()
                    .find(|(q, _)| q == k)
                    .and_then(|(_, v)| v.parse::<i64>().ok())
            };
            let (Some(dp), Some(cp), Some(tp), Some(pp)) = (
                get("prefill_dp_rank"),
                get("prefill_cp_rank"),
                get("target_tp_rank"),
                get("target_pp_rank"),
            ) else {
                return server::text(400, "Missing inputs for bootstrap server.");
            };
            let ranks = shared
                .sgl
                .ranks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let cfg = &shared.cfg;
            let expected = (cfg.dp_size.max(1) * cfg.tp_size.max(1)) as usize;
            if dp == -1 && cp == -1 && tp == -1 && pp == -1 {
                if ranks.len() < expected {
                    return server::text(
                        503,
                        format!(
                            "Prefill server not fully registered yet ({} workers registered).",
                            ranks.len()
                        ),
                    );
                }
                return server::json(
                    200,
                    &json!({"attn_tp_size":cfg.tp_size,"attn_cp_size":1,"dp_size":cfg.dp_size,"pp_size":1,"page_size":cfg.page_size,
                        "kv_cache_dtype":cfg.kv_cache_dtype,"follow_bootstrap_room":cfg.load_balance_method=="follow_bootstrap_room",
                        "enable_dsa_cache_layer_split":false,"prefill_http_port":shared.api_addr.port(),
                        "target_tp_rank":null,"target_tp_ranks":null,"target_cp_ranks":null,"target_pp_ranks":null,
                        "required_dst_info_num":null,"required_prefill_response_num":null}),
                );
            }
            let hit = ranks.iter().find(|r| {
                r.get("attn_dp_rank").and_then(Value::as_i64) == Some(dp)
                    && r.get("attn_cp_rank").and_then(Value::as_i64) == Some(cp)
                    && r.get("attn_tp_rank").and_then(Value::as_i64) == Some(tp)
                    && r.get("pp_rank").and_then(Value::as_i64) == Some(pp)
            });
            match hit {
                Some(r) => server::json(200, &json!({"rank_ip": r["rank_ip"], "rank_port": r["rank_port"]})),
                None => server::text(404, format!("Bootstrap info not found for dp_rank={dp} cp_rank={cp} tp_rank={tp} pp_rank={pp}")),
            }
        }
        ("POST", "/register_dp_rank") => {
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            if let (Some(room), Some(r)) = (
                v.get("bootstrap_room").and_then(Value::as_u64),
                v.get("dp_rank").and_then(Value::as_u64),
            ) {
                shared
                    .sgl
                    .dp_rooms
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(room, r as u32);
            }
            server::text(200, "OK")
        }
        ("POST", "/query_dp_ranks") => {
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let table = shared
                .sgl
                .dp_rooms
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let mut out = serde_json::Map::new();
            for r in v
                .get("bootstrap_rooms")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(room) = r.as_u64() {
                    if let Some(d) = table.get(&room) {
                        out.insert(room.to_string(), json!(d));
                    }
                }
            }
            server::json(200, &Value::Object(out))
        }
        _ => server::text(404, "Not Found"),
    }
}

/// Each prefill rank registers itself with its own bootstrap server at startup (`PUT /route`).
pub(crate) async fn register_ranks(shared: &Arc<Shared>) -> std::io::Result<()> {
    let Some(boot) = shared.bootstrap_addr else {
        return Ok(());
    };
    let cfg = &shared.cfg;
    for dp in 0..cfg.dp_size.max(1) {
        for tp in 0..cfg.tp_size.max(1) {
            let body = json!({"attn_tp_size":cfg.tp_size,"attn_tp_rank":tp,"attn_cp_size":1,"attn_cp_rank":0,
                "attn_dp_size":cfg.dp_size,"attn_dp_rank":dp,"pp_size":1,"pp_rank":0,"system_dp_size":cfg.dp_size,
                "system_dp_rank":dp,"rank_ip":cfg.advertised_host(),"rank_port":shared.data_addr.port(),
                "page_size":cfg.page_size,"kv_cache_dtype":cfg.kv_cache_dtype,"load_balance_method":cfg.load_balance_method,
                "enable_dsa_cache_layer_split":false,"prefill_http_port":shared.api_addr.port()});
            let url = format!("http://{boot}/route");
            let r = client::request(
                "PUT",
                &url,
                &[("content-type", "application/json")],
                Some(serde_json::to_vec(&body)?.into()),
            )
            .await?;
            if r.status != 200 {
                return Err(std::io::Error::other(format!(
                    "bootstrap registration failed: {}",
                    r.status
                )));
            }
        }
    }
    Ok(())
}

/// `bootstrap_down` fault: stop the bootstrap listener and its connections.
pub(crate) fn bootstrap_down(shared: &Arc<Shared>) {
    let old = std::mem::replace(
        &mut *shared
            .groups
            .bootstrap
            .lock()
            .unwrap_or_else(|e| e.into_inner()),
        Arc::new(TaskGroup::default()),
    );
    old.abort_all();
    shared.bootstrap_up.store(false, Ordering::SeqCst);
}

/// Re-binds the bootstrap listener on its original port.
pub(crate) async fn bootstrap_up(shared: &Arc<Shared>) -> std::io::Result<()> {
    let Some(addr) = shared.bootstrap_addr else {
        return Ok(());
    };
    let l = tokio::net::TcpListener::bind(addr).await?;
    let g = shared
        .groups
        .bootstrap
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let sh = shared.clone();
    server::serve(l, g, move |req, peer| {
        bootstrap_server(sh.clone(), req, peer)
    });
    shared.bootstrap_up.store(true, Ordering::SeqCst);
    Ok(())
}
