//! vLLM's PD handoff over HTTP (mock-engines-spec §1.3–1.7, §2.3): a prefill block pool with
//! pinning, and the connectors' wire behaviour —
//! * NIXL: the prefill returns `kv_transfer_params`; the decode handshakes on `remote_host:
//!   remote_port` (engine-id check), reads the named blocks (no ownership check: stale ids read
//!   whatever is there; a longer remote list is read from its tail), notifies by request id;
//! * Mooncake: the prefill registers with its bootstrap server (`/register`, `/query`) and holds
//!   the KV under the router-minted `transfer_id` until a decode pulls it (push model, order-free);
//! * MoRI-IO READ (like NIXL, keyed by `transfer_id`, peers from request-id markers first) and
//!   WRITE (the decode allocates blocks and waits for the prefill's push; a decode aborted before
//!   the push keeps its blocks until the push lands — vLLM's delayed free on `finished_recving` —
//!   and forever when it never does, as vLLM#59382 describes).
//!
//! A handoff happens only when the prefill stopped at its length cap. The decode recomputes the
//! last prompt token itself, from the state rebuilt out of the blocks it received.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::Request;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify};

use crate::client;
use crate::config::{Connector, Fault, LoadFailurePolicy, MalformedParams, MockEngineConfig, Role};
use crate::engine::{generate, run_local, send_prompt, Gauge, ReqCtx, RoomInfo, Shared, StepTx};
use crate::fake_model::{self, Decoder, Finish};
use crate::job::{ApiError, ErrorKind, Job, JobItem, Route};
use crate::records::now_ms;
use crate::server::{self, HttpResponse, TaskGroup};

/// What one KV block slot holds (RDMA reads return it whatever it is).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BlockContent {
    pub slot: usize,
    pub owner_req: String,
    pub start_pos: usize,
    pub tokens: Vec<u32>,
    pub prefix_state: u64,
}

/// A pinned handoff on the prefill.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Pinned {
    pub request_id: String,
    pub transfer_id: Option<String>,
    pub blocks: Vec<usize>,
    pub protocol: String,
    pub pinned_ms: f64,
}

struct Pool {
    capacity: usize,
    slots: Vec<BlockContent>,
    free: VecDeque<usize>,
}

impl Pool {
    fn alloc(&mut self) -> usize {
        if self.slots.len() < self.capacity {
            self.slots.push(BlockContent {
                slot: self.slots.len(),
                owner_req: String::new(),
                start_pos: 0,
                tokens: Vec::new(),
                prefix_state: 0,
            });
            return self.slots.len() - 1;
        }
        // vLLM's free queue: least recently freed first; freed slots keep stale content.
        self.free.pop_front().unwrap_or(0)
    }
}

struct WriteWait {
    id: u64,
    tx: mpsc::UnboundedSender<Vec<BlockContent>>,
}

/// Prefill block pool, pinned handoffs, and decode-side MoRI WRITE allocations.
pub struct VllmState {
    pool: Mutex<Pool>,
    pinned: Mutex<HashMap<String, Pinned>>,
    pinned_changed: Notify,
    mooncake: Mutex<Vec<Value>>,
    write_waits: Mutex<HashMap<String, WriteWait>>,
    early_writes: Mutex<HashMap<String, Vec<BlockContent>>>,
    /// WRITE allocations whose decode was aborted before the push landed, by transfer id: their
    /// blocks stay held until the push arrives (locked inside `write_waits`, never the reverse).
    held_allocs: Mutex<HashMap<String, usize>>,
    timers: Mutex<Arc<TaskGroup>>,
}

impl VllmState {
    pub fn new(cfg: &MockEngineConfig) -> Self {
        VllmState {
            pool: Mutex::new(Pool {
                capacity: (cfg.kv_tokens / cfg.block_size.max(1)).max(1) as usize,
                slots: Vec::new(),
                free: VecDeque::new(),
            }),
            pinned: Mutex::new(HashMap::new()),
            pinned_changed: Notify::new(),
            mooncake: Mutex::new(Vec::new()),
            write_waits: Mutex::new(HashMap::new()),
            early_writes: Mutex::new(HashMap::new()),
            held_allocs: Mutex::new(HashMap::new()),
            timers: Mutex::new(Arc::default()),
        }
    }

    pub fn rooms(&self) -> Vec<RoomInfo> {
        let now = now_ms();
        let mut v: Vec<RoomInfo> = self
            .pinned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, p)| RoomInfo {
                room: k.clone(),
                side: "prefill".into(),
                state: "pinned".into(),
                dp_rank: 0,
                peer: None,
                age_ms: now - p.pinned_ms,
            })
            .collect();
        v.extend(
            self.write_waits
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .keys()
                .map(|k| RoomInfo {
                    room: k.clone(),
                    side: "decode".into(),
                    state: "WAITING_FOR_REMOTE_KVS".into(),
                    dp_rank: 0,
                    peer: None,
                    age_ms: 0.0,
                }),
        );
        v
    }

    pub fn pinned_blocks(&self) -> usize {
        self.pinned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|p| p.blocks.len())
            .sum()
    }

    /// Blocks of WRITE allocations held for a push that has not landed (their decode is gone).
    pub fn leaked_allocs(&self) -> usize {
        self.held_allocs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .sum()
    }

    pub fn pinned_list(&self) -> Vec<Value> {
        let mut v: Vec<Value> = self
            .pinned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|p| serde_json::to_value(p).unwrap_or_default())
            .collect();
        v.sort_by_key(|p| p["request_id"].as_str().unwrap_or("").to_string());
        v
    }

    pub fn abort_timers(&self) {
        self.timers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .abort_all();
    }

    fn read(&self, ids: &[usize]) -> Vec<BlockContent> {
        let pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        ids.iter()
            .map(|&i| {
                pool.slots.get(i).cloned().unwrap_or(BlockContent {
                    slot: i,
                    owner_req: String::new(),
                    start_pos: 0,
                    tokens: Vec::new(),
                    prefix_state: 0,
                })
            })
            .collect()
    }

    /// Unpins a handoff (by key) and returns its blocks to the free queue.
    fn unpin(&self, key: &str) -> Option<Pinned> {
        let p = self
            .pinned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key)?;
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        pool.free.extend(p.blocks.iter().copied());
        Some(p)
    }

    fn find_key(&self, pred: impl Fn(&Pinned) -> bool) -> Option<String> {
        self.pinned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(_, p)| pred(p))
            .map(|(k, _)| k.clone())
    }
}

/// A random uuid-shaped engine id.
pub fn new_engine_id() -> String {
    let h = crate::job::random_hex(32);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn params_of(ctx: &ReqCtx) -> Option<serde_json::Map<String, Value>> {
    ctx.body
        .get("kv_transfer_params")
        .and_then(Value::as_object)
        .cloned()
}

fn flag(p: &serde_json::Map<String, Value>, k: &str) -> bool {
    p.get(k).and_then(Value::as_bool).unwrap_or(false)
}

fn id_prefix(route: Route) -> &'static str {
    match route {
        Route::Chat => "chatcmpl-",
        Route::Completions => "cmpl-",
        _ => "resp_",
    }
}

/// The id the engine core sees: the OpenAI server prefixes it (`chatcmpl-<id>`), the gRPC
/// servicer passes `request_id` unchanged.
fn engine_request_id(ctx: &ReqCtx) -> String {
    if ctx.is_grpc() {
        ctx.job.rid.clone()
    } else {
        format!("{}{}", id_prefix(ctx.job.route), ctx.job.rid)
    }
}

/// The engine-internal request id (`<engine id>-<8hex>` since vLLM#27987).
fn internal_request_id(ctx: &ReqCtx) -> String {
    let base = engine_request_id(ctx);
    if ctx.cfg().request_id_suffix {
        format!("{base}-{}", crate::job::random_hex(8))
    } else {
        base
    }
}

/// `___prefill_addr_{h:p}___decode_addr_{h:p}_{uuid}` markers (vllm-router request ids), which
/// the MoRI-IO connector reads before the explicit fields.
fn peer_markers(rid: &str) -> (Option<String>, Option<String>) {
    let grab = |tag: &str| {
        let i = rid.find(tag)? + tag.len();
        let rest = &rid[i..];
        let end = rest.find("___").or_else(|| {
            // `host:port_uuid`: the port ends at the first non-digit after the colon.
            let colon = rest.rfind(':')?;
            rest[colon + 1..]
                .find(|c: char| !c.is_ascii_digit())
                .map(|j| colon + 1 + j)
        });
        Some(rest[..end.unwrap_or(rest.len())].to_string())
    };
    (grab("___prefill_addr_"), grab("___decode_addr_"))
}

fn malformed(ctx: &ReqCtx, what: &str) -> ApiError {
    if ctx.cfg().malformed_params == MalformedParams::Crash {
        ctx.shared.crashed.store(true, Ordering::SeqCst);
    }
    ApiError::internal(format!(
        "EngineCore encountered an issue: invalid kv_transfer_params: {what}"
    ))
}

fn port_of(v: Option<&Value>) -> Result<Option<u16>, ()> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .filter(|p| *p > 0 && *p <= 65535)
            .map(|p| Some(p as u16))
            .ok_or(()),
        Some(Value::String(s)) => s.parse::<u16>().ok().filter(|p| *p > 0).map(Some).ok_or(()),
        _ => Err(()),
    }
}

fn block_ids(v: Option<&Value>) -> Result<Vec<usize>, ()> {
    let Some(Value::Array(a)) = v else {
        return Err(());
    };
    let mut out = Vec::new();
    for x in a {
        match x {
            Value::Number(n) => out.push(n.as_u64().ok_or(())? as usize),
            Value::Array(g) => {
                // One list per KV-cache group: the mock has one group, read the first.
                if out.is_empty() && g.iter().all(Value::is_u64) {
                    out.extend(g.iter().filter_map(Value::as_u64).map(|n| n as usize));
                } else if !g.iter().all(Value::is_u64) {
                    return Err(());
                }
            }
            _ => return Err(()),
        }
    }
    Ok(out)
}

fn count_like(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::Number(n)) => n.as_u64().is_some(),
        Some(Value::String(s)) => s.parse::<u64>().is_ok(),
        _ => false,
    }
}

/// Engine-side validation before any work (vLLM dialect).
pub(crate) fn validate(_shared: &Shared, _job: &Job, _body: &Value) -> Result<(), ApiError> {
    Ok(())
}

/// `kv_transfer_params` a prefill request produced (read back by the renderer).
pub(crate) fn returned_params(shared: &Shared, seq: u64) -> Option<Value> {
    let mut out = None;
    shared
        .recorder
        .update(seq, |r| out = r.handoff.returned_params.clone());
    out
}

fn set_returned(ctx: &ReqCtx, v: Option<Value>) {
    ctx.shared
        .recorder
        .update(ctx.seq, |r| r.handoff.returned_params = v);
}

/// Writes a finished request's computed tokens into pool slots and pins them under `key`.
fn pin_blocks(
    ctx: &ReqCtx,
    key: &str,
    req_id: &str,
    transfer_id: Option<String>,
    s0: u64,
    seq_tokens: &[u32],
) -> Vec<usize> {
    let b = ctx.cfg().block_size.max(1) as usize;
    let shared = &ctx.shared;
    let corrupt = shared
        .take_fault(ctx.job.route.path(), |f| {
            matches!(f, Fault::KvCorrupt { .. })
        })
        .is_some();
    let mut ids = Vec::new();
    {
        let mut pool = shared.vllm.pool.lock().unwrap_or_else(|e| e.into_inner());
        let mut s = s0;
        for (bi, chunk) in seq_tokens.chunks(b).enumerate() {
            let slot = pool.alloc();
            let prefix_state = if corrupt { s ^ 0x0BAD_0BAD } else { s };
            pool.slots[slot] = BlockContent {
                slot,
                owner_req: req_id.to_string(),
                start_pos: bi * b,
                tokens: chunk.to_vec(),
                prefix_state,
            };
            s = fake_model::prompt_state(s, chunk);
            ids.push(slot);
        }
    }
    shared
        .vllm
        .pinned
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(
            key.to_string(),
            Pinned {
                request_id: req_id.to_string(),
                transfer_id,
                blocks: ids.clone(),
                protocol: ctx.cfg().connector.as_str().into(),
                pinned_ms: now_ms(),
            },
        );
    shared.vllm.pinned_changed.notify_waiters();
    // Blocks nobody reads are released after VLLM_*_ABORT_REQUEST_TIMEOUT.
    let sh = shared.clone();
    let k = key.to_string();
    let ttl = ctx.cfg().abort_request_timeout;
    let g = shared
        .vllm
        .timers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    g.spawn(async move {
        tokio::time::sleep(ttl).await;
        if sh.vllm.unpin(&k).is_some() {
            // "Releasing expired KV blocks for request … retrieved by 0 decode worker(s)"
            sh.counters.with(|c| c.expired_unread += 1);
        }
    });
    ids
}

/// A vLLM prefill leg: generate normally; on a length-capped finish with a handoff tag, pin the
/// KV and describe it per connector.
pub(crate) async fn run_prefill_item(
    ctx: &Arc<ReqCtx>,
    item: &JobItem,
    tx: &StepTx,
) -> Result<(), ApiError> {
    let cfg = ctx.cfg();
    let shared = &ctx.shared;
    let params = params_of(ctx);
    let tagged = params.as_ref().is_some_and(|p| flag(p, "do_remote_decode"));
    let req_id = internal_request_id(ctx);
    shared.recorder.update(ctx.seq, |r| {
        r.handoff.remote_request_id = Some(req_id.clone())
    });
    let transfer_id = params
        .as_ref()
        .and_then(|p| p.get("transfer_id"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let moriio = matches!(
        cfg.connector,
        Connector::MoriioRead | Connector::MoriioWrite
    );
    if tagged && moriio && transfer_id.is_none() {
        // The MoRI scheduler reads params["transfer_id"] unguarded.
        return Err(malformed(ctx, "KeyError: 'transfer_id'"));
    }
    // The prompt as the model folds it (images' vision tokens in their placeholders).
    let ids = item.computed_ids()?;
    let cached = shared.prefix_cached_tokens(&ids);
    shared.prefill_forward(item.prompt_ids.len()).await;
    send_prompt(ctx, item, tx, cached, true);
    let s0 = fake_model::initial_state(&cfg.model, item.spec.seed, item.sample);
    let mut d = Decoder::new(fake_model::prompt_state(s0, &ids), item.spec.clone());
    if shared
        .take_fault(ctx.job.route.path(), |f| {
            matches!(f, Fault::EosFirstToken { .. })
        })
        .is_some()
    {
        d.force_eos_first();
    }
    // Keep a copy to know what was generated.
    let tokens_before = d.tokens.len();
    let d_final = generate_tracked(ctx, item, d, tx).await;
    let generated: Vec<u32> = d_final.tokens[tokens_before..]
        .iter()
        .map(|t| t.id)
        .collect();
    let capped = matches!(d_final.finish, Some(Finish::Length(_)));
    if !tagged || cfg.connector == Connector::None || cfg.connector == Connector::Fake {
        set_returned(ctx, None);
        return Ok(());
    }
    if !capped {
        // EOS/stop on the single token: request_finished returns no params, blocks freed.
        shared.timeline(ctx.seq, "finished by stop: no handoff");
        set_returned(ctx, None);
        return Ok(());
    }
    // KV holds the prompt and every generated token but the last (not yet computed).
    let mut seq_tokens = ids;
    seq_tokens.extend(&generated[..generated.len().saturating_sub(1)]);
    let side_port = shared.side_addr.map(|a| a.port()).unwrap_or(0);
    let ids = match cfg.connector {
        Connector::Mooncake => {
            let Some(tid) = transfer_id.clone() else {
                shared.timeline(
                    ctx.seq,
                    "Missing transfer_id in kv_transfer_params from router!",
                );
                set_returned(ctx, None);
                return Ok(());
            };
            pin_blocks(ctx, &tid, &req_id, Some(tid.clone()), s0, &seq_tokens)
        }
        _ => pin_blocks(ctx, &req_id, &req_id, transfer_id.clone(), s0, &seq_tokens),
    };
    shared
        .recorder
        .update(ctx.seq, |r| r.handoff.transfer_id = transfer_id.clone());
    let no_blocks = shared
        .take_fault(ctx.job.route.path(), |f| {
            matches!(f, Fault::NoBlocks { .. })
        })
        .is_some();
    let ids = if no_blocks { Vec::new() } else { ids };
    let block_ids = if cfg.grouped_block_ids {
        json!([ids])
    } else {
        json!(ids)
    };
    let host = cfg
        .side_channel_host
        .clone()
        .unwrap_or_else(|| cfg.advertised_host());
    let engine_id = shared.engine_id();
    let returned = match cfg.connector {
        Connector::Nixl => {
            let mut p = json!({"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":block_ids,
                "remote_engine_id":engine_id,"remote_host":host,"remote_port":side_port,"tp_size":cfg.tp_size});
            if cfg.request_id_suffix {
                p["remote_request_id"] = json!(req_id);
            }
            Some(p)
        }
        Connector::Mooncake => None,
        Connector::MoriioRead | Connector::MoriioWrite => {
            let notify = shared.notify_addr.map(|a| a.port()).unwrap_or(0);
            Some(
                json!({"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":block_ids,
                "remote_engine_id":engine_id,"remote_host":host,"remote_handshake_port":side_port,"remote_notify_port":notify,
                "remote_dp_size":cfg.dp_size,"tp_size":cfg.tp_size,"transfer_id":transfer_id}),
            )
        }
        _ => None,
    };
    set_returned(ctx, returned);
    if cfg.connector == Connector::MoriioWrite {
        push_write(
            ctx,
            params.as_ref(),
            transfer_id.unwrap_or_default(),
            &req_id,
        )
        .await;
    }
    Ok(())
}

/// Like `generate`, but returns the decoder so the caller knows what was produced.
async fn generate_tracked(ctx: &ReqCtx, item: &JobItem, d: Decoder, tx: &StepTx) -> Decoder {
    let mut shadow = d.clone();
    generate(ctx, item, d, None, tx).await;
    while shadow.step().is_some() {}
    shadow
}

/// MoRI WRITE prefill: push the pinned blocks into the decode named by the leg (request-id
/// markers first, then `remote_host`/`remote_notify_port`).
async fn push_write(
    ctx: &ReqCtx,
    params: Option<&serde_json::Map<String, Value>>,
    tid: String,
    req_id: &str,
) {
    let shared = &ctx.shared;
    let marker = peer_markers(&ctx.job.rid).1;
    let target = marker.or_else(|| {
        let p = params?;
        let host = p.get("remote_host")?.as_str()?.to_string();
        let port = port_of(p.get("remote_notify_port")).ok().flatten()?;
        Some(format!("{host}:{port}"))
    });
    let Some(target) = target else {
        shared.timeline(
            ctx.seq,
            "WRITE: no decode side channel named; KV stays pinned",
        );
        return;
    };
    shared.record_item(ctx.seq, 0, |h| h.peer_addr = Some(target.clone()));
    let Some(key) = shared.vllm.find_key(|p| p.request_id == req_id) else {
        return;
    };
    let blocks = {
        let pinned = shared.vllm.pinned.lock().unwrap_or_else(|e| e.into_inner());
        pinned
            .get(&key)
            .map(|p| p.blocks.clone())
            .unwrap_or_default()
    };
    let content = shared.vllm.read(&blocks);
    let url = format!("http://{target}/mock-kv/moriio/write");
    let ok = client::request_with(
        &client::ClientOptions {
            source_ip: Some(ctx.cfg().bind_ip),
            timeout: Some(Duration::from_secs(5)),
        },
        "POST",
        &url,
        &[("content-type", "application/json")],
        Some(
            json!({"transfer_id":tid,"blocks":content})
                .to_string()
                .into(),
        ),
    )
    .await
    .is_ok_and(|r| r.status == 200);
    if ok {
        shared.vllm.unpin(&key);
        shared.counters.handoff("ok");
        shared.timeline(ctx.seq, format!("WRITE pushed to {target}"));
    } else {
        shared.timeline(
            ctx.seq,
            format!("WRITE push to {target} failed; KV stays pinned"),
        );
    }
}

/// Rebuilds `S_{n-1}` from received blocks (folding only prompt positions before the last).
fn state_from_blocks(blocks: &[BlockContent], prompt_len: usize) -> Option<u64> {
    let first = blocks.first()?;
    let mut s = first.prefix_state;
    let mut pos = first.start_pos;
    let target = prompt_len.saturating_sub(1);
    'outer: for b in blocks {
        for &t in &b.tokens {
            if pos >= target {
                break 'outer;
            }
            s = fake_model::mix(s, t as u64);
            pos += 1;
        }
    }
    Some(s)
}

/// The ids a decode folds: its own, with each placeholder position whose image feature it
/// lacks taken from the blocks it read (the encoder's output arrived inside the KV, as a decode
/// given only hashes and placeholders relies on).
fn decode_fold_ids(item: &JobItem, blocks: &[BlockContent]) -> Vec<u32> {
    let mut ids = item.folded_ids();
    for span in item.media.iter().filter(|s| s.feature.is_none()) {
        for pos in span.range.clone() {
            let held = blocks
                .iter()
                .find(|b| (b.start_pos..b.start_pos + b.tokens.len()).contains(&pos))
                .map(|b| b.tokens[pos - b.start_pos]);
            if let (Some(t), Some(slot)) = (held, ids.get_mut(pos)) {
                *slot = t;
            }
        }
    }
    ids
}

enum LoadFailure {
    /// Load failed: apply `kv_load_failure_policy`.
    Failed(String),
}

/// A vLLM decode leg.
pub(crate) async fn run_decode_item(
    ctx: &Arc<ReqCtx>,
    item: &JobItem,
    tx: &StepTx,
) -> Result<(), ApiError> {
    let cfg = ctx.cfg();
    let shared = &ctx.shared;
    let params = params_of(ctx).filter(|p| flag(p, "do_remote_prefill"));
    let s0 = fake_model::initial_state(&cfg.model, item.spec.seed, item.sample);
    let Some(p) = params else {
        return match cfg.connector {
            // A MoRI-IO decode never recomputes: READ runs over KV that never arrived, WRITE waits.
            Connector::MoriioRead => {
                decode_from(
                    ctx,
                    item,
                    tx,
                    fake_model::garbage_state(s0, item.prompt_ids.len()),
                    "garbage",
                    None,
                )
                .await
            }
            Connector::MoriioWrite => moriio_write_decode(ctx, item, tx, None).await,
            _ => {
                shared.counters.with(|c| c.recompute += 1);
                run_local(ctx, item, tx, "recompute").await
            }
        };
    };
    for k in [
        "transfer_id",
        "remote_engine_id",
        "remote_request_id",
        "remote_host",
        "remote_bootstrap_addr",
    ] {
        if let Some(v) = p.get(k).and_then(Value::as_str) {
            shared.recorder.update(ctx.seq, |r| match k {
                "transfer_id" => r.handoff.transfer_id = Some(v.to_string()),
                "remote_engine_id" => r.handoff.remote_engine_id = Some(v.to_string()),
                "remote_request_id" => r.handoff.remote_request_id = Some(v.to_string()),
                _ => {}
            });
        }
    }
    let _waiting = Gauge::new(&shared.waiting);
    let loaded = match cfg.connector {
        Connector::Nixl => nixl_load(ctx, item, &p).await?,
        Connector::Mooncake => mooncake_load(ctx, item, &p).await?,
        Connector::MoriioRead => moriio_read_load(ctx, item, &p).await?,
        Connector::MoriioWrite => return moriio_write_decode(ctx, item, tx, Some(&p)).await,
        _ => {
            shared.counters.with(|c| c.recompute += 1);
            return run_local(ctx, item, tx, "recompute").await;
        }
    };
    drop(_waiting);
    match loaded {
        Ok(blocks) => {
            let s_prev = state_from_blocks(&blocks, item.prompt_ids.len())
                .unwrap_or_else(|| fake_model::garbage_state(s0, item.prompt_ids.len()));
            let ids = decode_fold_ids(item, &blocks);
            let own_prev = fake_model::prompt_state(s0, &ids[..ids.len().saturating_sub(1)]);
            let integrity = if s_prev == own_prev { "ok" } else { "mismatch" };
            shared.record_item(ctx.seq, item.index, |h| {
                h.integrity = Some(integrity.into())
            });
            shared
                .counters
                .handoff(if integrity == "ok" { "ok" } else { "mismatch" });
            let last = ids.last().copied().unwrap_or(0);
            let s_n = fake_model::mix(s_prev, last as u64);
            decode_from(ctx, item, tx, s_n, "remote", Some(format!("{s_prev:016x}"))).await
        }
        Err(LoadFailure::Failed(reason)) => {
            shared.record_item(ctx.seq, item.index, |h| h.error = Some(reason.clone()));
            shared.counters.handoff("failed");
            shared.timeline(ctx.seq, format!("KV load failed: {reason}"));
            match cfg.kv_load_failure_policy {
                LoadFailurePolicy::Fail => {
                    Err(ApiError::internal(reason).with_kind(ErrorKind::KvLoad))
                }
                LoadFailurePolicy::Recompute => {
                    shared.counters.with(|c| c.recompute += 1);
                    run_local(ctx, item, tx, "recompute").await
                }
            }
        }
    }
}

async fn decode_from(
    ctx: &ReqCtx,
    item: &JobItem,
    tx: &StepTx,
    s_n: u64,
    source: &str,
    digest: Option<String>,
) -> Result<(), ApiError> {
    ctx.shared.record_item(ctx.seq, item.index, |h| {
        h.kv_source = Some(source.to_string());
        h.prompt_digest = digest;
    });
    // The gRPC servicer reports `num_cached_tokens`, which counts the prompt tokens whose KV
    // came from the connector: the whole prompt when it arrived (a recompute reports 0).
    let cached = if (ctx.is_grpc() || cfg_details(ctx)) && source == "remote" {
        item.prompt_ids.len()
    } else {
        0
    };
    send_prompt(ctx, item, tx, cached, false);
    generate(ctx, item, Decoder::new(s_n, item.spec.clone()), None, tx).await;
    Ok(())
}

/// Whether OpenAI answers carry `prompt_tokens_details` (`--enable-prompt-tokens-details`).
fn cfg_details(ctx: &ReqCtx) -> bool {
    ctx.cfg().prompt_tokens_details
}

fn opts(ctx: &ReqCtx, t: Duration) -> client::ClientOptions {
    client::ClientOptions {
        source_ip: Some(ctx.cfg().bind_ip),
        timeout: Some(t),
    }
}

fn invalid_params_reason(p: &serde_json::Map<String, Value>) -> String {
    format!(
        "Got invalid KVTransferParams: {}. This request will not utilize KVTransfer",
        Value::Object(p.clone())
    )
}

async fn nixl_load(
    ctx: &ReqCtx,
    item: &JobItem,
    p: &serde_json::Map<String, Value>,
) -> Result<Result<Vec<BlockContent>, LoadFailure>, ApiError> {
    let cfg = ctx.cfg();
    let need_rid = cfg.request_id_suffix;
    let missing = [
        "remote_engine_id",
        "remote_host",
        "remote_port",
        "remote_block_ids",
    ]
    .iter()
    .chain(if need_rid {
        &["remote_request_id"][..]
    } else {
        &[][..]
    })
    .any(|k| p.get(*k).is_none_or(Value::is_null));
    if missing {
        return Ok(Err(LoadFailure::Failed(invalid_params_reason(p))));
    }
    let port = port_of(p.get("remote_port"))
        .map_err(|_| malformed(ctx, "remote_port"))?
        .unwrap_or(0);
    let ids =
        block_ids(p.get("remote_block_ids")).map_err(|_| malformed(ctx, "remote_block_ids"))?;
    if ids.is_empty() {
        // vLLM claims the prompt as remote, then `update_state_after_alloc` asserts
        // `num_external_tokens == 0` in the scheduler (nixl/pull_scheduler.py).
        return Err(malformed(ctx, "remote_block_ids is empty (AssertionError)"));
    }
    let host = p
        .get("remote_host")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let want = p
        .get("remote_engine_id")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let addr = format!("{host}:{port}");
    ctx.shared
        .record_item(ctx.seq, item.index, |h| h.peer_addr = Some(addr.clone()));
    if ctx
        .shared
        .has_fault(|f| matches!(f, Fault::LinkDown { peer } if addr.contains(peer.as_str())))
        .is_some()
    {
        return Ok(Err(LoadFailure::Failed(format!(
            "NIXL transfer from {addr} failed: the RDMA read did not complete"
        ))));
    }
    let meta = client::request_with(
        &opts(ctx, Duration::from_secs(5)),
        "GET",
        &format!("http://{addr}/mock-kv/nixl/meta?tp_rank=0"),
        &[],
        None,
    )
    .await;
    let meta = match meta {
        Ok(r) if r.status == 200 => r.json(),
        _ => {
            return Ok(Err(LoadFailure::Failed(format!(
                "NIXL handshake with {addr} failed: remote agent not reachable"
            ))))
        }
    };
    let got = meta.get("engine_id").and_then(Value::as_str).unwrap_or("");
    if got != want {
        return Ok(Err(LoadFailure::Failed(format!(
            "Remote NIXL agent engine ID mismatch. Expected {want},received {got}."
        ))));
    }
    // Fewer local blocks than remote (a prefix hit, or an uncapped prefill): read the tail.
    let b = cfg.block_size.max(1) as usize;
    let local = item.prompt_ids.len().div_ceil(b);
    let read_ids: Vec<usize> = if ids.len() > local {
        ids[ids.len() - local..].to_vec()
    } else {
        ids.clone()
    };
    let r = client::request_with(
        &opts(ctx, Duration::from_secs(5)),
        "POST",
        &format!("http://{addr}/mock-kv/nixl/read"),
        &[("content-type", "application/json")],
        Some(json!({"block_ids": read_ids}).to_string().into()),
    )
    .await;
    let blocks: Vec<BlockContent> = match r {
        Ok(r) if r.status == 200 => serde_json::from_slice(&r.body).unwrap_or_default(),
        _ => {
            return Ok(Err(LoadFailure::Failed(format!(
                "NIXL transfer from {addr} failed"
            ))))
        }
    };
    // Tell the prefill it may free the blocks (keyed by remote_request_id, or our own id).
    let notif_id = p
        .get("remote_request_id")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| engine_request_id(ctx));
    let _ = client::request_with(
        &opts(ctx, Duration::from_secs(5)),
        "POST",
        &format!("http://{addr}/mock-kv/nixl/notif"),
        &[("content-type", "application/json")],
        Some(json!({"remote_request_id": notif_id}).to_string().into()),
    )
    .await;
    Ok(Ok(blocks))
}

async fn mooncake_load(
    ctx: &ReqCtx,
    item: &JobItem,
    p: &serde_json::Map<String, Value>,
) -> Result<Result<Vec<BlockContent>, LoadFailure>, ApiError> {
    let cfg = ctx.cfg();
    let (Some(tid), Some(engine), Some(boot)) = (
        p.get("transfer_id").and_then(Value::as_str),
        p.get("remote_engine_id").and_then(Value::as_str),
        p.get("remote_bootstrap_addr").and_then(Value::as_str),
    ) else {
        return Ok(Err(LoadFailure::Failed(invalid_params_reason(p))));
    };
    ctx.shared.record_item(ctx.seq, item.index, |h| {
        h.peer_addr = Some(boot.to_string())
    });
    let not_ready = || {
        LoadFailure::Failed(format!(
            "pulling kv_caches for [{}] failed: Timeout waiting for P side ready.",
            ctx.job.rid
        ))
    };
    let deadline = tokio::time::Instant::now() + cfg.p_ready_timeout;
    let worker = loop {
        let q = client::request_with(
            &opts(ctx, Duration::from_secs(2)),
            "GET",
            &format!("{boot}/query"),
            &[],
            None,
        )
        .await;
        let found = q.ok().filter(|r| r.status == 200).and_then(|r| {
            let v = r.json();
            v.as_object()?
                .values()
                .find(|e| e.get("engine_id").and_then(Value::as_str) == Some(engine))
                .and_then(|e| {
                    e.get("worker_addr")?
                        .as_object()?
                        .values()
                        .next()?
                        .as_object()?
                        .values()
                        .next()?
                        .as_str()
                        .map(str::to_string)
                })
        });
        if let Some(w) = found {
            break w;
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(Err(not_ready()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let addr = worker.trim_start_matches("tcp://").to_string();
    let remaining =
        deadline.saturating_duration_since(tokio::time::Instant::now()) + Duration::from_secs(1);
    let r = client::request_with(
        &opts(ctx, remaining),
        "POST",
        &format!("http://{addr}/mock-kv/mooncake/xfer"),
        &[("content-type", "application/json")],
        Some(json!({"transfer_id":tid,"request_id":ctx.job.rid,"wait_ms":cfg.p_ready_timeout.as_millis() as u64}).to_string().into()),
    )
    .await;
    match r {
        Ok(r) if r.status == 200 && r.json()["status"] == "FINISH" => Ok(Ok(
            serde_json::from_value(r.json()["blocks"].clone()).unwrap_or_default(),
        )),
        _ => Ok(Err(not_ready())),
    }
}

async fn moriio_read_load(
    ctx: &ReqCtx,
    item: &JobItem,
    p: &serde_json::Map<String, Value>,
) -> Result<Result<Vec<BlockContent>, LoadFailure>, ApiError> {
    let hs = port_of(p.get("remote_handshake_port"))
        .map_err(|_| malformed(ctx, "remote_handshake_port"))?;
    let nt =
        port_of(p.get("remote_notify_port")).map_err(|_| malformed(ctx, "remote_notify_port"))?;
    let ids =
        block_ids(p.get("remote_block_ids")).map_err(|_| malformed(ctx, "remote_block_ids"))?;
    for k in [
        "remote_dp_size",
        "remote_dp_size_local",
        "remote_dp_rank",
        "tp_size",
        "remote_tp_size",
    ] {
        if !count_like(p.get(k)) {
            return Err(malformed(ctx, k));
        }
    }
    let host = p
        .get("remote_host")
        .and_then(Value::as_str)
        .map(str::to_string);
    let marker = peer_markers(&ctx.job.rid).0;
    let addr = match (marker, host, hs) {
        (Some(m), _, _) => m,
        (None, Some(h), Some(port)) => format!("{h}:{port}"),
        _ => return Err(malformed(ctx, "remote_host/remote_handshake_port")),
    };
    ctx.shared
        .record_item(ctx.seq, item.index, |h| h.peer_addr = Some(addr.clone()));
    let tid = p
        .get("transfer_id")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let r = client::request_with(
        &opts(ctx, Duration::from_secs(5)),
        "POST",
        &format!("http://{addr}/mock-kv/nixl/read"),
        &[("content-type", "application/json")],
        Some(json!({"block_ids": ids}).to_string().into()),
    )
    .await;
    // A MoRI decode never recomputes: without data it decodes over whatever the blocks hold.
    let blocks: Vec<BlockContent> = match r {
        Ok(r) if r.status == 200 => serde_json::from_slice(&r.body).unwrap_or_default(),
        _ => Vec::new(),
    };
    let notify_host = addr
        .rsplit_once(':')
        .map(|(h, _)| h.to_string())
        .unwrap_or_default();
    if let Some(nt) = nt {
        let _ = client::request_with(
            &opts(ctx, Duration::from_secs(5)),
            "POST",
            &format!("http://{notify_host}:{nt}/mock-kv/moriio/notify"),
            &[("content-type", "application/json")],
            Some(json!({"transfer_id": tid}).to_string().into()),
        )
        .await;
    }
    Ok(Ok(blocks))
}

/// Frees a WRITE decode's allocation. One aborted before its push (its entry still waiting in
/// `write_waits`) is held until the push lands, as vLLM delays freeing an aborted request's blocks
/// until `finished_recving`; a push that never comes leaks them (vLLM#59382). Whether the push
/// landed is decided under the `write_waits` lock, where the push handler takes the entry, so a
/// decode aborted between the push's delivery and its own read is not counted as a leak.
struct WriteAllocGuard {
    shared: Arc<Shared>,
    tid: String,
    id: u64,
    blocks: usize,
    done: bool,
}

impl Drop for WriteAllocGuard {
    fn drop(&mut self) {
        let mut w = self
            .shared
            .vllm
            .write_waits
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let unpushed = w.get(&self.tid).is_some_and(|x| x.id == self.id);
        if unpushed {
            w.remove(&self.tid);
            if !self.done {
                *self
                    .shared
                    .vllm
                    .held_allocs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(self.tid.clone())
                    .or_insert(0) += self.blocks;
            }
        }
    }
}

async fn moriio_write_decode(
    ctx: &Arc<ReqCtx>,
    item: &JobItem,
    tx: &StepTx,
    p: Option<&serde_json::Map<String, Value>>,
) -> Result<(), ApiError> {
    let cfg = ctx.cfg();
    let shared = &ctx.shared;
    if let Some(p) = p {
        for k in ["remote_handshake_port", "remote_notify_port"] {
            port_of(p.get(k)).map_err(|_| malformed(ctx, k))?;
        }
        for k in [
            "remote_dp_size",
            "remote_dp_size_local",
            "remote_dp_rank",
            "tp_size",
            "remote_tp_size",
        ] {
            if !count_like(p.get(k)) {
                return Err(malformed(ctx, k));
            }
        }
        if let Some(ids) = p.get("remote_block_ids") {
            block_ids(Some(ids)).map_err(|_| malformed(ctx, "remote_block_ids"))?;
        }
    }
    let tid = p
        .and_then(|p| p.get("transfer_id"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let n_blocks = item
        .prompt_ids
        .len()
        .div_ceil(cfg.block_size.max(1) as usize);
    let (wtx, mut wrx) = mpsc::unbounded_channel();
    let id = shared.next_id();
    let mut guard = WriteAllocGuard {
        shared: shared.clone(),
        tid: tid.clone(),
        id,
        blocks: n_blocks,
        done: false,
    };
    let early = shared
        .vllm
        .early_writes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&tid);
    if let Some(b) = early {
        let _ = wtx.send(b);
    } else {
        shared
            .vllm
            .write_waits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(tid.clone(), WriteWait { id, tx: wtx });
    }
    shared.record_item(ctx.seq, item.index, |h| {
        h.kv_source = Some("waiting".into())
    });
    shared.timeline(
        ctx.seq,
        format!("WRITE: allocated {n_blocks} blocks for transfer {tid}"),
    );
    let got = match cfg.moriio_write_wait {
        Some(t) => tokio::time::timeout(t, wrx.recv()).await.ok().flatten(),
        None => wrx.recv().await,
    };
    let Some(blocks) = got else {
        // vLLM waits forever; the mock gives up after --moriio-write-wait, and the blocks leak.
        return Err(ApiError::internal(format!(
            "MoRI-IO WRITE: no KV pushed for transfer {tid} (decode blocks leaked)"
        )));
    };
    guard.done = true;
    drop(guard);
    let s0 = fake_model::initial_state(&cfg.model, item.spec.seed, item.sample);
    let s_prev = state_from_blocks(&blocks, item.prompt_ids.len())
        .unwrap_or_else(|| fake_model::garbage_state(s0, item.prompt_ids.len()));
    let ids = decode_fold_ids(item, &blocks);
    let own_prev = fake_model::prompt_state(s0, &ids[..ids.len().saturating_sub(1)]);
    shared.record_item(ctx.seq, item.index, |h| {
        h.integrity = Some(if s_prev == own_prev { "ok" } else { "mismatch" }.into())
    });
    let s_n = fake_model::mix(s_prev, ids.last().copied().unwrap_or(0) as u64);
    decode_from(ctx, item, tx, s_n, "remote", Some(format!("{s_prev:016x}"))).await
}

/// Side-channel endpoints (NIXL handshake/read/notif, Mooncake xfer, MoRI notify/write).
pub(crate) async fn side_channel(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    _peer: SocketAddr,
) -> HttpResponse {
    let path = req.uri().path().to_string();
    let body: Value =
        serde_json::from_slice(&server::read_body(req.into_body()).await.unwrap_or_default())
            .unwrap_or(Value::Null);
    match path.as_str() {
        "/mock-kv/nixl/meta" => server::json(
            200,
            &json!({"engine_id": shared.engine_id(), "tp_size": shared.cfg.tp_size, "block_size": shared.cfg.block_size, "layout_hash": "mock"}),
        ),
        "/mock-kv/nixl/read" => {
            let ids: Vec<usize> = body["block_ids"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_u64)
                .map(|n| n as usize)
                .collect();
            if let Some(Fault::SlowTransferMs { ms }) =
                shared.has_fault(|f| matches!(f, Fault::SlowTransferMs { .. }))
            {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            server::json(
                200,
                &serde_json::to_value(shared.vllm.read(&ids)).unwrap_or_default(),
            )
        }
        "/mock-kv/nixl/notif" => {
            let rid = body["remote_request_id"].as_str().unwrap_or("").to_string();
            let key = shared.vllm.find_key(|p| p.request_id == rid);
            if let Some(k) = key {
                shared.vllm.unpin(&k);
            }
            server::text(200, "OK")
        }
        "/mock-kv/moriio/notify" => {
            let tid = body["transfer_id"].as_str().unwrap_or("").to_string();
            if let Some(k) = shared
                .vllm
                .find_key(|p| p.transfer_id.as_deref() == Some(tid.as_str()))
            {
                shared.vllm.unpin(&k);
            }
            server::text(200, "OK")
        }
        "/mock-kv/mooncake/xfer" => {
            let tid = body["transfer_id"].as_str().unwrap_or("").to_string();
            let wait = Duration::from_millis(body["wait_ms"].as_u64().unwrap_or(30_000));
            let deadline = tokio::time::Instant::now() + wait;
            loop {
                let notified = shared.vllm.pinned_changed.notified();
                if shared
                    .vllm
                    .pinned
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .contains_key(&tid)
                {
                    break;
                }
                if tokio::time::timeout_at(deadline, notified).await.is_err() {
                    return server::json(
                        200,
                        &json!({"status":"ERROR","err_reqs":[tid],"err_msg":"Timeout waiting for P side ready."}),
                    );
                }
            }
            let Some(p) = shared
                .vllm
                .pinned
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&tid)
                .cloned()
            else {
                return server::json(
                    200,
                    &json!({"status":"ERROR","err_msg":"transfer vanished"}),
                );
            };
            let blocks = shared.vllm.read(&p.blocks);
            shared.vllm.unpin(&tid);
            shared.counters.handoff("ok");
            server::json(200, &json!({"status":"FINISH","blocks":blocks}))
        }
        "/mock-kv/moriio/write" => {
            let tid = body["transfer_id"].as_str().unwrap_or("").to_string();
            let blocks: Vec<BlockContent> =
                serde_json::from_value(body["blocks"].clone()).unwrap_or_default();
            let mut waits = shared
                .vllm
                .write_waits
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if let Some(w) = waits.remove(&tid) {
                drop(waits);
                // Taken under the lock: the allocation counts as pushed even if its decode is
                // aborted before it reads the blocks.
                let _ = w.tx.send(blocks);
                return server::text(200, "OK");
            }
            let late = shared
                .vllm
                .held_allocs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&tid)
                .is_some();
            drop(waits);
            if late {
                // The decode was aborted before the push: the landed push frees its blocks.
                return server::text(200, "OK");
            }
            // No allocation yet (sequential dispatch: the decode leg comes later).
            shared
                .vllm
                .early_writes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(tid.clone(), blocks);
            let sh = shared.clone();
            let ttl = shared.cfg.abort_request_timeout;
            shared.groups.work.spawn(async move {
                tokio::time::sleep(ttl).await;
                sh.vllm
                    .early_writes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&tid);
            });
            server::text(200, "OK")
        }
        _ => server::text(404, "Not Found"),
    }
}

/// vLLM Mooncake bootstrap server (`POST /register`, `GET /query`).
pub(crate) async fn mooncake_bootstrap(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    _peer: SocketAddr,
) -> HttpResponse {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let body = server::read_body(req.into_body()).await.unwrap_or_default();
    match (method.as_str(), path.as_str()) {
        ("POST", "/register") => {
            let Ok(v) = serde_json::from_slice::<Value>(&body) else {
                return server::text(400, "bad registration");
            };
            let mut reg = shared
                .vllm
                .mooncake
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let dp = v["dp_rank"].as_u64();
            reg.retain(|e| {
                !(e["dp_rank"].as_u64() == dp
                    && e["tp_rank"] == v["tp_rank"]
                    && e["pp_rank"] == v["pp_rank"])
            });
            reg.push(v);
            server::json(200, &json!({"status":"ok"}))
        }
        ("GET", "/query") => {
            let reg = shared
                .vllm
                .mooncake
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let mut out = serde_json::Map::new();
            for e in reg.iter() {
                let dp = e["dp_rank"].as_u64().unwrap_or(0).to_string();
                let entry = out
                    .entry(dp)
                    .or_insert_with(|| json!({"engine_id": e["engine_id"], "worker_addr": {}}));
                let tp = e["tp_rank"].as_u64().unwrap_or(0).to_string();
                let pp = e["pp_rank"].as_u64().unwrap_or(0).to_string();
                let wa = entry["worker_addr"].as_object_mut().expect("object");
                let t = wa.entry(tp).or_insert_with(|| json!({}));
                t[pp] = e["addr"].clone();
            }
            server::json(200, &Value::Object(out))
        }
        ("GET", "/health") => server::text(200, "OK"),
        _ => server::text(404, "Not Found"),
    }
}

/// Registers every DP rank of a Mooncake prefill with its own bootstrap server.
pub(crate) async fn register_mooncake(shared: &Arc<Shared>) -> std::io::Result<()> {
    let Some(boot) = shared.bootstrap_addr else {
        return Ok(());
    };
    if !shared.bootstrap_up.load(Ordering::SeqCst) {
        return Ok(());
    }
    let cfg = &shared.cfg;
    let side = shared.side_addr.map(|a| a.port()).unwrap_or(0);
    let base = shared.engine_id();
    for dp in 0..cfg.dp_size.max(1) {
        let engine_id = if cfg.dp_size > 1 {
            format!("{base}_dp{dp}")
        } else {
            base.clone()
        };
        let body = json!({"engine_id": engine_id, "dp_rank": dp, "tp_rank": 0, "pp_rank": 0,
            "addr": format!("tcp://{}:{side}", cfg.advertised_host()), "tp_size": cfg.tp_size, "pp_size": 1});
        let r = client::request(
            "POST",
            &format!("http://{boot}/register"),
            &[("content-type", "application/json")],
            Some(body.to_string().into()),
        )
        .await?;
        if r.status != 200 {
            return Err(std::io::Error::other(format!(
                "mooncake registration failed: {}",
                r.status
            )));
        }
    }
    Ok(())
}

/// Restarts the engine in place: new engine id (unless pinned), pinned KV dropped, alive again.
pub(crate) async fn restart(shared: &Arc<Shared>) {
    if shared.cfg.engine_id.is_none() {
        *shared.engine_id.lock().unwrap_or_else(|e| e.into_inner()) = new_engine_id();
    }
    let old = std::mem::replace(
        &mut *shared.vllm.timers.lock().unwrap_or_else(|e| e.into_inner()),
        Arc::new(TaskGroup::default()),
    );
    old.abort_all();
    let keys: Vec<String> = shared
        .vllm
        .pinned
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .keys()
        .cloned()
        .collect();
    for k in keys {
        shared.vllm.unpin(&k);
    }
    shared
        .vllm
        .early_writes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clear();
    // A new process: allocations held by the old one are gone with its memory.
    shared
        .vllm
        .held_allocs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clear();
    shared.crashed.store(false, Ordering::SeqCst);
    if shared.cfg.role == Role::Prefill && shared.cfg.connector == Connector::Mooncake {
        let _ = register_mooncake(shared).await;
    }
}
