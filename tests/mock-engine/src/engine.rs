//! One mock engine: its listeners, shared state, the API router, the request driver that runs a
//! job's items (locally, or through the engine's PD handoff) and the `/mock/*` control plane.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::Request;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::config::{EngineKind, Fault, FaultMatch, MockEngineConfig, Role, Transport};
use crate::fake_model::{self, Decoder};
use crate::job::{self, ApiError, ErrorKind, Job, JobItem, ParseCtx, Route};
use crate::records::{now_ms, Counters, ItemHandoff, ParsedFields, Recorder, RequestRecord, Stats};
use crate::render::{self, FinishKind, PromptInfo, Renderer, Step};
use crate::server::{self, HttpResponse, TaskGroup};
use crate::{grpc, sglang, vllm};

/// An open rendezvous (SGLang room, vLLM pinned transfer, MoRI allocation) as `/mock/rooms` shows it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RoomInfo {
    pub room: String,
    /// `prefill` | `decode`.
    pub side: String,
    /// `Bootstrapping` | `WaitingForInput` | `Transferring` | `pending-receiver` | `pinned` | ...
    pub state: String,
    pub dp_rank: u32,
    pub peer: Option<String>,
    pub age_ms: f64,
}

/// Listener groups that can be torn down independently.
pub(crate) struct Groups {
    pub api: Arc<TaskGroup>,
    pub data: Arc<TaskGroup>,
    pub bootstrap: Mutex<Arc<TaskGroup>>,
    pub side: Arc<TaskGroup>,
    pub work: Arc<TaskGroup>,
}

/// State shared by every task of one engine.
pub(crate) struct Shared {
    pub cfg: MockEngineConfig,
    /// The API listener: HTTP routes, or the gRPC service.
    pub api_addr: SocketAddr,
    /// gRPC transport: the HTTP control plane (`/mock/*`, `/metrics`).
    pub control_addr: Option<SocketAddr>,
    pub data_addr: SocketAddr,
    pub bootstrap_addr: Option<SocketAddr>,
    pub side_addr: Option<SocketAddr>,
    pub notify_addr: Option<SocketAddr>,
    pub engine_id: Mutex<String>,
    pub recorder: Recorder,
    pub counters: Counters,
    faults: Mutex<Vec<(Fault, Option<u32>)>>,
    pub sgl: sglang::SglState,
    pub vllm: vllm::VllmState,
    pub groups: Groups,
    pub killed: AtomicBool,
    pub crashed: AtomicBool,
    pub bootstrap_up: AtomicBool,
    pub waiting: AtomicU64,
    pub running: AtomicU64,
    /// The decode's running slots (`enforce_running_window`).
    pub decode_slots: Arc<tokio::sync::Semaphore>,
    /// A compute-bound prefill's one forward pass at a time (`prefill_us_per_token`).
    pub prefill_compute: tokio::sync::Semaphore,
    /// A load report that replaces the live counters (tests of overload protection).
    pub load_override: Mutex<Option<LoadReport>>,
    prefix_cache: Mutex<HashSet<u64>>,
    pub next_id: AtomicU64,
    /// Live gRPC calls, `Abort` records, RPC counters and the connection kill switch.
    pub grpc: grpc::GrpcState,
    /// Encode worker (EPD): the embeddings waiting for their prefill.
    pub encoder: grpc::encoder::EncoderState,
}

impl Shared {
    pub fn engine_id(&self) -> String {
        self.engine_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn is_killed(&self) -> bool {
        self.killed.load(Ordering::SeqCst)
    }

    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Sleeps `ms` scaled by `time_scale`.
    pub async fn latency(&self, ms: u64) {
        let scaled = ms as f64 * self.cfg.time_scale;
        if scaled > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(scaled / 1000.0)).await;
        }
    }

    /// A prefill's forward pass over `prompt_len` tokens: `ttft_ms`, plus, on a compute-bound
    /// prefill (`prefill_us_per_token`), the per-token cost with one pass at a time.
    pub async fn prefill_forward(&self, prompt_len: usize) {
        if self.cfg.prefill_us_per_token == 0 {
            return self.latency(self.cfg.ttft_ms).await;
        }
        let _pass = self.prefill_compute.acquire().await;
        let us = self.cfg.prefill_us_per_token * prompt_len as u64;
        self.latency(self.cfg.ttft_ms + us / 1000).await;
    }

    /// Takes one use of the first active fault accepted by `pick` for `path`.
    pub fn take_fault(&self, path: &str, pick: impl Fn(&Fault) -> bool) -> Option<Fault> {
        let mut fs = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        let role = self.cfg.role;
        let idx = fs.iter().position(|(f, _)| {
            pick(f)
                && f.matcher().is_none_or(|m| {
                    m.route.as_deref().is_none_or(|r| r == path) && m.role.is_none_or(|r| r == role)
                })
        })?;
        let f = fs[idx].0.clone();
        if let Some(left) = fs[idx].1.as_mut() {
            *left = left.saturating_sub(1);
            if *left == 0 {
                fs.remove(idx);
            }
        }
        Some(f)
    }

    pub fn has_fault(&self, pick: impl Fn(&Fault) -> bool) -> Option<Fault> {
        let fs = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        fs.iter().find(|(f, _)| pick(f)).map(|(f, _)| f.clone())
    }

    /// Counts prompt tokens already in the prefix cache (full pages), then inserts the prompt.
    pub fn prefix_cached_tokens(&self, ids: &[u32]) -> usize {
        if !self.cfg.prefix_cache {
            return 0;
        }
        let bs = self.cfg.block_size.max(1) as usize;
        let mut cache = self.prefix_cache.lock().unwrap_or_else(|e| e.into_inner());
        let mut h = 0u64;
        let mut cached = 0;
        let mut hit = true;
        for (b, chunk) in ids.chunks(bs).enumerate() {
            if chunk.len() < bs {
                break;
            }
            h = fake_model::prompt_state(h ^ b as u64, chunk);
            if hit && cache.contains(&h) {
                cached += bs;
            } else {
                hit = false;
                if cache.len() > 100_000 {
                    cache.clear();
                }
                cache.insert(h);
            }
        }
        // Never report the whole prompt as cached: the last token is always computed.
        cached.min(ids.len().saturating_sub(1))
    }

    pub fn record_item(&self, seq: u64, idx: usize, f: impl FnOnce(&mut ItemHandoff)) {
        self.recorder.update(seq, |r| {
            while r.handoff.items.len() <= idx {
                r.handoff.items.push(ItemHandoff::default());
            }
            f(&mut r.handoff.items[idx]);
            let first = &r.handoff.items[0];
            r.handoff.peer_addr = first.peer_addr.clone();
            r.handoff.kv_source = first.kv_source.clone();
        });
    }

    pub fn timeline(&self, seq: u64, event: impl Into<String>) {
        let e = event.into();
        self.recorder
            .update(seq, |r| r.handoff.timeline.push((now_ms(), e)));
    }

    /// URL of this engine's KV data plane.
    pub fn data_url(&self) -> String {
        format!(
            "http://{}:{}",
            self.cfg.advertised_host(),
            self.data_addr.port()
        )
    }

    pub fn rooms(&self) -> Vec<RoomInfo> {
        let mut v = self.sgl.rooms();
        v.extend(self.vllm.rooms());
        v
    }
}

/// Per-request context handed to item runners.
pub(crate) struct ReqCtx {
    pub shared: Arc<Shared>,
    pub seq: u64,
    pub job: Job,
    /// The request as the HTTP dialect's JSON body (a gRPC request is translated into the
    /// fields the runners read, e.g. vLLM's `kv_transfer_params`).
    pub body: Value,
    /// SGLang / TokenSpeed bootstrap fields, one per room index.
    pub bootstrap: Vec<sglang::BootstrapItem>,
}

impl ReqCtx {
    pub fn cfg(&self) -> &MockEngineConfig {
        &self.shared.cfg
    }

    /// Whether the request came over the gRPC servicer (ids and counters differ).
    pub fn is_grpc(&self) -> bool {
        self.shared.cfg.transport == Transport::Grpc
    }
}

pub(crate) type StepTx = mpsc::UnboundedSender<Step>;

/// Emits the prompt facts of an item.
pub(crate) fn send_prompt(
    ctx: &ReqCtx,
    item: &JobItem,
    tx: &StepTx,
    cached: usize,
    with_input_lp: bool,
) {
    let s0 = fake_model::initial_state(&ctx.cfg().model, item.spec.seed, item.sample);
    let input_logprobs = (with_input_lp && ctx.job.logprobs.return_logprob).then(|| {
        fake_model::input_logprobs(
            s0,
            &item.folded_ids(),
            ctx.job.logprobs.start,
            ctx.job.logprobs.top,
        )
    });
    let _ = tx.send(Step::Prompt {
        item: item.index,
        info: PromptInfo {
            prompt_tokens: item.prompt_ids.len(),
            cached_tokens: cached,
            input_logprobs,
        },
    });
}

/// Generates from a decoder, emitting tokens with inter-token latency. `first` forces `t0`.
pub(crate) async fn generate(
    ctx: &ReqCtx,
    item: &JobItem,
    mut d: Decoder,
    first: Option<(u32, f64)>,
    tx: &StepTx,
) -> usize {
    ctx.shared
        .counters
        .with(|c| c.prompt_tokens += item.prompt_ids.len() as u64);
    if ctx.job.route == Route::Rerank {
        let scores = ctx
            .job
            .documents
            .iter()
            .map(|doc| fake_model::rerank_score(&ctx.cfg().model, d.state(), doc))
            .collect();
        let _ = tx.send(Step::Scores {
            item: item.index,
            scores,
        });
        let _ = tx.send(Step::Finish {
            item: item.index,
            finish: FinishKind::Model(fake_model::Finish::Length(0)),
        });
        return 0;
    }
    let mut n = 0;
    loop {
        let tok = match (n, first) {
            (0, Some((t, lp))) => d.step_forced(t, lp),
            _ => d.step(),
        };
        let Some(tok) = tok else {
            if n == 0 {
                let f = d.finish.clone().unwrap_or(fake_model::Finish::Length(0));
                let _ = tx.send(Step::Finish {
                    item: item.index,
                    finish: FinishKind::Model(f),
                });
            }
            break;
        };
        n += 1;
        let finish = d.finish.clone().map(FinishKind::Model);
        let done = finish.is_some();
        let _ = tx.send(Step::Token {
            item: item.index,
            token: tok,
            visible: d.visible_text().to_string(),
            finish,
        });
        if done {
            break;
        }
        ctx.shared.latency(ctx.cfg().itl_ms).await;
    }
    ctx.shared
        .counters
        .with(|c| c.generation_tokens += n as u64);
    n
}

/// A non-PD run of one item (role `Both`, and the local-recompute paths).
pub(crate) async fn run_local(
    ctx: &ReqCtx,
    item: &JobItem,
    tx: &StepTx,
    kv_source: &str,
) -> Result<(), ApiError> {
    ctx.shared.record_item(ctx.seq, item.index, |h| {
        h.kv_source = Some(kv_source.to_string())
    });
    // A leg that computes the prompt needs every image's feature.
    let ids = item.computed_ids()?;
    let cached = ctx.shared.prefix_cached_tokens(&ids);
    ctx.shared.latency(ctx.cfg().ttft_ms).await;
    send_prompt(ctx, item, tx, cached, true);
    let s0 = fake_model::initial_state(&ctx.cfg().model, item.spec.seed, item.sample);
    let mut d = Decoder::new(fake_model::prompt_state(s0, &ids), item.spec.clone());
    if ctx
        .shared
        .take_fault(ctx.job.route.path(), |f| {
            matches!(f, Fault::EosFirstToken { .. })
        })
        .is_some()
    {
        d.force_eos_first();
    }
    generate(ctx, item, d, None, tx).await;
    Ok(())
}

async fn run_item(ctx: Arc<ReqCtx>, item: JobItem, dup: bool, tx: StepTx) -> Result<(), ApiError> {
    let _running = Gauge::new(&ctx.shared.running);
    let engine = ctx.cfg().engine;
    match (ctx.cfg().role, engine.uses_bootstrap_rooms()) {
        (Role::Both, _) => run_local(&ctx, &item, &tx, "none").await,
        (Role::Prefill, true) => sglang::run_prefill_item(&ctx, &item, dup, &tx).await,
        (Role::Decode, true) => sglang::run_decode_item(&ctx, &item, dup, &tx).await,
        (Role::Prefill, false) => vllm::run_prefill_item(&ctx, &item, &tx).await,
        (Role::Decode, false) => vllm::run_decode_item(&ctx, &item, &tx).await,
        // Its servicer refuses `Generate` before any job exists.
        (Role::Encode, _) => Err(ApiError::bad_request("an encode worker generates nothing")),
    }?;
    let _ = tx.send(Step::ItemDone { item: item.index });
    Ok(())
}

/// Increments a gauge for its lifetime.
pub(crate) struct Gauge<'a>(&'a AtomicU64);

impl<'a> Gauge<'a> {
    pub fn new(g: &'a AtomicU64) -> Self {
        g.fetch_add(1, Ordering::Relaxed);
        Gauge(g)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Runs every item of a job concurrently; `on_step` sees steps in arrival order. The first item
/// error aborts the others (dropping the `JoinSet` cancels their handoffs).
pub(crate) async fn drive<F>(ctx: Arc<ReqCtx>, mut on_step: F) -> Result<(), ApiError>
where
    F: AsyncStepSink,
{
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut set = JoinSet::new();
    let mut seen_rooms = HashSet::new();
    for item in ctx.job.items.clone() {
        let room_key = ctx.bootstrap.get(item.room_index).map(|b| b.room);
        let dup = room_key.is_some_and(|r| !seen_rooms.insert(r));
        set.spawn(run_item(ctx.clone(), item, dup, tx.clone()));
    }
    drop(tx);
    let mut steps_open = true;
    loop {
        tokio::select! {
            s = rx.recv(), if steps_open => match s {
                Some(s) => on_step.step(s).await?,
                None => steps_open = false,
            },
            r = set.join_next() => match r {
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => return Err(e),
                Some(Err(e)) => return Err(ApiError::internal(format!("engine task failed: {e}"))),
                None => {
                    while let Some(s) = rx.recv().await {
                        on_step.step(s).await?;
                    }
                    return Ok(());
                }
            },
        }
    }
}

/// Receives steps (async so a stream can apply backpressure).
pub(crate) trait AsyncStepSink {
    fn step(&mut self, s: Step) -> impl std::future::Future<Output = Result<(), ApiError>> + Send;
}

struct CollectSink<'a>(&'a mut Renderer);

impl AsyncStepSink for CollectSink<'_> {
    async fn step(&mut self, s: Step) -> Result<(), ApiError> {
        self.0.apply(s);
        Ok(())
    }
}

struct StreamSink<'a> {
    r: &'a mut Renderer,
    tx: &'a mpsc::Sender<Result<Bytes, io::Error>>,
}

impl AsyncStepSink for StreamSink<'_> {
    async fn step(&mut self, s: Step) -> Result<(), ApiError> {
        for f in self.r.apply(s) {
            if self.tx.send(Ok(Bytes::from(f))).await.is_err() {
                return Err(ApiError {
                    status: 499,
                    message: "client disconnected".into(),
                    kind: ErrorKind::Request,
                });
            }
        }
        Ok(())
    }
}

/// Marks the record done when dropped; a drop before `finish` means the client went away.
struct RecordGuard {
    shared: Arc<Shared>,
    seq: u64,
    route: String,
    finished: bool,
}

impl RecordGuard {
    fn finish(
        &mut self,
        status: u16,
        error: Option<String>,
        finish_reason: Option<String>,
        tokens: Option<u64>,
    ) {
        self.finished = true;
        let route = self.route.clone();
        let role = self.shared.cfg.role.as_str().to_string();
        self.shared.counters.with(|c| {
            *c.by_role_route_status
                .entry((format!("{role}|{route}"), status))
                .or_default() += 1;
        });
        self.shared.recorder.update(self.seq, |r| {
            if r.outcome.status.is_none() {
                r.outcome.status = Some(status);
            }
            if r.outcome.head_at_ms.is_none() {
                r.outcome.head_at_ms = Some(now_ms());
            }
            r.outcome.done_at_ms = Some(now_ms());
            r.outcome.error = error;
            r.outcome.finish_reason = finish_reason;
            r.outcome.completion_tokens = tokens;
        });
    }
}

impl Drop for RecordGuard {
    fn drop(&mut self) {
        // Recorded before the count drops: whoever waits for the engine to be idle then reads
        // the request's final outcome.
        if !self.finished {
            self.shared.recorder.update(self.seq, |r| {
                r.outcome.cancelled = true;
                r.outcome.done_at_ms = Some(now_ms());
                if r.outcome.error.is_none() {
                    r.outcome.error = Some("client disconnected".into());
                }
            });
        }
        self.shared
            .counters
            .with(|c| c.in_flight = c.in_flight.saturating_sub(1));
    }
}

fn error_response(shared: &Shared, route: Option<Route>, err: &ApiError) -> HttpResponse {
    server::json(
        err.status,
        &render::error_body(shared.cfg.engine, route, err),
    )
}

fn headers_map(req: &Request<Incoming>) -> BTreeMap<String, String> {
    let mut m: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in req.headers() {
        let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
        m.entry(k.as_str().to_string())
            .and_modify(|e| {
                e.push_str(", ");
                e.push_str(&v);
            })
            .or_insert(v);
    }
    m
}

fn parsed_fields(body: &Value, job: Option<&Job>) -> ParsedFields {
    let g = |k: &str| body.get(k).cloned();
    let max_eff = job
        .and_then(|j| j.items.first())
        .map(|i| i.spec.max_new_tokens as u64);
    ParsedFields {
        stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
        max_tokens_effective: max_eff,
        n: body.get("n").and_then(Value::as_u64),
        ignore_eos: body
            .get("ignore_eos")
            .or_else(|| {
                body.get("sampling_params")
                    .and_then(|s| s.get("ignore_eos"))
            })
            .and_then(Value::as_bool),
        stop: g("stop").or_else(|| {
            body.get("sampling_params")
                .and_then(|s| s.get("stop"))
                .cloned()
        }),
        bootstrap_host: g("bootstrap_host"),
        bootstrap_port: g("bootstrap_port"),
        bootstrap_room: g("bootstrap_room"),
        routed_dp_rank: g("routed_dp_rank"),
        disagg_prefill_dp_rank: g("disagg_prefill_dp_rank"),
        kv_transfer_params: g("kv_transfer_params"),
        has_stream_options: body.get("stream_options").is_some(),
        min_tokens: g("min_tokens"),
    }
}

/// Serves one model-route POST.
async fn handle_model(
    shared: Arc<Shared>,
    route: Route,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> HttpResponse {
    let headers = headers_map(&req);
    let path = req.uri().path().to_string();
    let body_bytes = server::read_body(req.into_body()).await.unwrap_or_default();
    let body: Result<Value, _> = serde_json::from_slice(&body_bytes);
    let seq = shared.recorder.push(RequestRecord {
        arrive_ms: now_ms(),
        method: "POST".into(),
        path: path.clone(),
        x_request_id: headers.get("x-request-id").cloned(),
        headers: headers.clone(),
        body: body
            .as_ref()
            .cloned()
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body_bytes).into_owned())),
        client_addr: peer.to_string(),
        parsed: body
            .as_ref()
            .map(|b| parsed_fields(b, None))
            .unwrap_or_default(),
        handoff: crate::records::Handoff {
            role: shared.cfg.role.as_str().into(),
            protocol: protocol_name(&shared.cfg),
            ..Default::default()
        },
        ..Default::default()
    });
    shared.counters.with(|c| {
        c.requests_total += 1;
        c.in_flight += 1;
        *c.by_route.entry(path.clone()).or_default() += 1;
    });
    let mut guard = RecordGuard {
        shared: shared.clone(),
        seq,
        route: path.clone(),
        finished: false,
    };

    if shared.crashed.load(Ordering::SeqCst) {
        let e = ApiError {
            status: 503,
            message: "engine is dead (scheduler crashed)".into(),
            kind: ErrorKind::Request,
        };
        guard.finish(503, Some(e.message.clone()), None, None);
        return error_response(&shared, Some(route), &e);
    }
    if let Some(resp) = apply_request_faults(&shared, &path, &mut guard).await {
        return resp;
    }
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            let err = ApiError::bad_request(format!("JSON decode error: {e}"));
            guard.finish(400, Some(err.message.clone()), None, None);
            return error_response(&shared, Some(route), &err);
        }
    };
    let pctx = ParseCtx {
        engine: shared.cfg.engine,
        model: shared.cfg.model.clone(),
        eos_period: shared.cfg.natural_stop_every,
        max_model_len: shared.cfg.max_model_len as u64,
        header_request_id: headers.get("x-request-id").cloned(),
        vocab: shared.cfg.output_vocab.clone(),
        sample_from_request_id: shared.cfg.sample_from_request_id,
    };
    let job = job::parse(route, &body, &pctx);
    if let Ok(j) = &job {
        let pf = parsed_fields(&body, Some(j));
        shared.recorder.update(seq, |r| r.parsed = pf);
    }
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let prepared = job.and_then(|job| {
        let bootstrap = if shared.cfg.engine.uses_bootstrap_rooms() && shared.cfg.role != Role::Both
        {
            sglang::parse_bootstrap(&shared.cfg, &job, &body)?
        } else {
            Vec::new()
        };
        if shared.cfg.engine == EngineKind::Vllm {
            vllm::validate(&shared, &job, &body)?;
        }
        Ok((job, bootstrap))
    });
    let (job, bootstrap) = match prepared {
        Ok(x) => x,
        Err(err) => {
            guard.finish(err.status, Some(err.message.clone()), None, None);
            if stream && shared.cfg.engine == EngineKind::Sglang {
                // SGLang raises inside the streaming generator: 200 head, error frame, [DONE].
                let (resp, tx) = server::channel(200, "text/event-stream");
                let dummy = Job {
                    items: Vec::new(),
                    ..job_for_errors(route)
                };
                let mut r = Renderer::new(shared.cfg.engine, &dummy, false);
                let frames = r.error_frames(&err);
                tokio::spawn(async move {
                    for f in frames {
                        let _ = tx.send(Ok(Bytes::from(f))).await;
                    }
                });
                shared
                    .recorder
                    .update(seq, |r| r.outcome.status = Some(200));
                return resp;
            }
            return error_response(&shared, Some(route), &err);
        }
    };
    {
        let rooms: Vec<u64> = bootstrap.iter().map(|b| b.room).collect();
        shared.recorder.update(seq, |r| {
            r.handoff.room = rooms.first().copied();
            r.handoff.rooms = rooms;
        });
    }
    let ctx = Arc::new(ReqCtx {
        shared: shared.clone(),
        seq,
        job,
        body,
        bootstrap,
    });
    let mut renderer = Renderer::new(
        shared.cfg.engine,
        &ctx.job,
        shared.cfg.incremental_streaming_output,
    );
    renderer.prompt_tokens_details = shared.cfg.prompt_tokens_details;

    if ctx.job.stream && route != Route::Rerank {
        let (resp, tx) = server::channel(200, "text/event-stream");
        shared.recorder.update(seq, |r| {
            r.outcome.status = Some(200);
            r.outcome.head_at_ms = Some(now_ms());
        });
        let sh = shared.clone();
        shared.groups.work.spawn(async move {
            let mut cut = CutUnlessFinished {
                tx: tx.clone(),
                finished: false,
            };
            let result = {
                let run = drive(
                    ctx.clone(),
                    StreamSink {
                        r: &mut renderer,
                        tx: &tx,
                    },
                );
                tokio::select! {
                    r = run => Some(r),
                    _ = tx.closed() => None,
                }
            };
            match result {
                None | Some(Err(ApiError { status: 499, .. })) => {} // guard records the cancellation
                Some(Ok(())) => {
                    let mut ok = true;
                    for f in renderer.epilogue() {
                        ok &= tx.send(Ok(Bytes::from(f))).await.is_ok();
                    }
                    if ok {
                        guard.finish(
                            200,
                            None,
                            renderer.finish_label(),
                            Some(renderer.completion_tokens()),
                        );
                    }
                }
                Some(Err(err)) => {
                    sh.recorder
                        .update(seq, |r| r.outcome.error = Some(err.message.clone()));
                    let mut ok = true;
                    for f in renderer.error_frames(&err) {
                        ok &= tx.send(Ok(Bytes::from(f))).await.is_ok();
                    }
                    if ok {
                        guard.finish(
                            200,
                            Some(err.message.clone()),
                            Some("abort".into()),
                            Some(renderer.completion_tokens()),
                        );
                    }
                }
            }
            cut.finished = true;
        });
        return resp;
    }

    let result = drive(ctx.clone(), CollectSink(&mut renderer)).await;
    match result {
        Ok(()) => {
            if shared.cfg.engine == EngineKind::Vllm {
                renderer.kv_transfer_params = vllm::returned_params(&shared, seq);
            }
            let body = renderer.full_body();
            guard.finish(
                200,
                None,
                renderer.finish_label(),
                Some(renderer.completion_tokens()),
            );
            server::json(200, &body)
        }
        Err(err) => {
            guard.finish(
                err.status,
                Some(err.message.clone()),
                Some("abort".into()),
                None,
            );
            error_response(&shared, Some(route), &err)
        }
    }
}

fn job_for_errors(route: Route) -> Job {
    Job {
        route,
        stream: true,
        items: Vec::new(),
        batched: false,
        n_rooms: 0,
        logprobs: Default::default(),
        include_usage: false,
        model: String::new(),
        rid: job::random_hex(32),
        list_output: false,
        documents: Vec::new(),
        top_n: None,
        return_documents: false,
        n: 1,
    }
}

pub(crate) fn protocol_name(cfg: &MockEngineConfig) -> String {
    match (cfg.engine, cfg.role) {
        (_, Role::Both) => "none".into(),
        (EngineKind::Sglang, _) => format!("sglang-{}", cfg.connector.as_str()),
        (EngineKind::TokenSpeed, _) => format!("tokenspeed-{}", cfg.connector.as_str()),
        (EngineKind::Vllm, _) => cfg.connector.as_str().into(),
    }
}

/// Applies request-level faults; `Some` = the fault produced the response.
async fn apply_request_faults(
    shared: &Arc<Shared>,
    path: &str,
    guard: &mut RecordGuard,
) -> Option<HttpResponse> {
    let f = shared.take_fault(path, |f| {
        matches!(
            f,
            Fault::FailStatus { .. }
                | Fault::FailStatusAfter { .. }
                | Fault::Hang { .. }
                | Fault::DelayHead { .. }
                | Fault::DropConnectionAfterHead { .. }
                | Fault::StallAfterHead { .. }
        )
    })?;
    shared.timeline(guard.seq, format!("fault:{}", f.kind()));
    let f = match f {
        Fault::FailStatusAfter { status, ms, .. } => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Fault::FailStatus {
                status,
                body: None,
                count: None,
                matcher: FaultMatch::default(),
            }
        }
        f => f,
    };
    match f {
        Fault::FailStatus { status, body, .. } => {
            let route = Route::from_path(path);
            let resp = match body {
                Some(b) => {
                    let ct = if serde_json::from_str::<Value>(&b).is_ok() {
                        "application/json"
                    } else {
                        "text/plain"
                    };
                    server::full(status, ct, b.clone())
                }
                None => error_response(
                    shared,
                    route,
                    &ApiError {
                        status,
                        message: format!("mock fault: status {status}"),
                        kind: ErrorKind::Request,
                    },
                ),
            };
            guard.finish(status, Some("fault:fail_status".into()), None, None);
            Some(resp)
        }
        Fault::Hang { .. } => {
            std::future::pending::<()>().await;
            None
        }
        Fault::DelayHead { ms, .. } => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            None
        }
        Fault::DropConnectionAfterHead { .. } => {
            let (resp, tx) = server::channel(200, "text/event-stream");
            guard.finish(
                200,
                Some("fault:drop_connection_after_head".into()),
                None,
                None,
            );
            tokio::spawn(async move {
                let _ = tx
                    .send(Err(io::Error::other("mock fault: connection dropped")))
                    .await;
            });
            Some(resp)
        }
        Fault::StallAfterHead { .. } => {
            let (resp, tx) = server::channel(200, "text/event-stream");
            shared.recorder.update(guard.seq, |r| {
                r.outcome.status = Some(200);
                r.outcome.head_at_ms = Some(now_ms());
            });
            let g = std::mem::replace(
                guard,
                RecordGuard {
                    shared: shared.clone(),
                    seq: guard.seq,
                    route: guard.route.clone(),
                    finished: true,
                },
            );
            shared.groups.work.spawn(async move {
                tx.closed().await;
                drop(g);
            });
            Some(resp)
        }
        _ => None,
    }
}

pub(crate) fn stats(shared: &Shared) -> Stats {
    let c = shared.counters.with(|c| c.clone());
    let mut by_status: BTreeMap<String, u64> = BTreeMap::new();
    for ((_, s), n) in &c.by_role_route_status {
        *by_status.entry(s.to_string()).or_default() += n;
    }
    Stats {
        engine: shared.cfg.engine.as_str().into(),
        role: shared.cfg.role.as_str().into(),
        connector: shared.cfg.connector.as_str().into(),
        engine_id: shared.engine_id(),
        rooms_open: shared.rooms().len(),
        pinned_blocks: shared.vllm.pinned_blocks(),
        leaked_allocs: shared.vllm.leaked_allocs(),
        requests_total: c.requests_total,
        requests_in_flight: c.in_flight,
        requests_by_route: c.by_route.clone(),
        requests_by_status: by_status,
        handoffs: c.handoffs.clone(),
        kv_recompute_total: c.recompute,
        kv_expired_unread_total: c.expired_unread,
        rooms_orphaned_total: c.rooms_orphaned,
        bootstrap_failed_total: c.bootstrap_failed,
        transfer_failed_total: c.transfer_failed,
        crashed: shared.crashed.load(Ordering::SeqCst),
        killed: shared.is_killed(),
        rpc_calls: c.rpc_calls.clone(),
        requests_by_grpc_code: c.by_grpc_code.clone(),
        mm_requests: c.mm_requests,
        mm_pixel_requests: c.mm_pixel_requests,
        media_fetches: c.media_fetches,
        encodes_total: c.encodes,
        embeddings_fetched: c.embeddings_fetched,
        embeddings_expired: c.embeddings_expired,
        embeddings_pending: shared.encoder.pending(),
        embeddings_received: c.embeddings_received,
    }
}

/// What the engine reports about its load: (running, waiting, KV usage 0..1).
pub(crate) fn current_load(shared: &Shared) -> (u64, u64, f64) {
    if let Some(o) = *shared
        .load_override
        .lock()
        .unwrap_or_else(|e| e.into_inner())
    {
        return (o.running, o.waiting, o.token_usage);
    }
    let waiting = shared.waiting.load(Ordering::Relaxed);
    let running = match shared.cfg.transport {
        Transport::Http => shared.running.load(Ordering::Relaxed),
        // Every sample of every live call is in the scheduler, running unless it waits for its
        // KV (a hung or silent call still holds its slot).
        Transport::Grpc => shared.grpc.live_samples().saturating_sub(waiting),
    };
    let usage = (running as f64 * 64.0 / shared.cfg.kv_tokens.max(1) as f64).min(1.0);
    (running, waiting, usage)
}

fn metrics_text(shared: &Shared) -> String {
    let c = shared.counters.with(|c| c.clone());
    let m = &shared.cfg.model;
    let (running, waiting, usage) = current_load(shared);
    let mut s = String::new();
    let mut gauge = |name: &str, help: &str, labels: &str, v: f64| {
        s.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{labels}}} {v}\n"
        ));
    };
    let ml = format!("model_name=\"{m}\"");
    match shared.cfg.engine {
        EngineKind::Sglang | EngineKind::TokenSpeed => {
            gauge(
                "sglang:num_running_reqs",
                "The number of running requests.",
                &ml,
                running as f64,
            );
            gauge(
                "sglang:num_waiting_reqs",
                "The number of waiting requests.",
                &ml,
                waiting as f64,
            );
            gauge("sglang:token_usage", "The token usage.", &ml, usage);
            gauge(
                "sglang:num_prefill_bootstrap_queue_reqs",
                "Requests in the prefill bootstrap queue.",
                &ml,
                shared.sgl.count("prefill") as f64,
            );
            gauge(
                "sglang:num_prefill_inflight_queue_reqs",
                "Requests in the prefill inflight queue.",
                &ml,
                0.0,
            );
            gauge(
                "sglang:num_decode_prealloc_queue_reqs",
                "Requests in the decode prealloc queue.",
                &ml,
                0.0,
            );
            gauge(
                "sglang:num_decode_transfer_queue_reqs",
                "Requests in the decode transfer queue.",
                &ml,
                shared.sgl.count("decode") as f64,
            );
        }
        EngineKind::Vllm => {
            gauge(
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                &ml,
                running as f64,
            );
            gauge(
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                &ml,
                waiting as f64,
            );
            gauge(
                "vllm:gpu_cache_usage_perc",
                "GPU KV-cache usage. 1 means 100 percent usage.",
                &ml,
                usage,
            );
            gauge(
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                &ml,
                usage,
            );
        }
    }
    gauge(
        "mock_kv_pinned_blocks",
        "Prefill KV blocks pinned for a handoff.",
        "",
        shared.vllm.pinned_blocks() as f64,
    );
    gauge(
        "mock_rooms_open",
        "Open rendezvous rooms.",
        "",
        shared.rooms().len() as f64,
    );
    s.push_str("# HELP mock_requests_total Requests by role, route and status.\n# TYPE mock_requests_total counter\n");
    for ((rr, status), n) in &c.by_role_route_status {
        let (role, route) = rr.split_once('|').unwrap_or(("", rr));
        s.push_str(&format!(
            "mock_requests_total{{role=\"{role}\",route=\"{route}\",status=\"{status}\"}} {n}\n"
        ));
    }
    s.push_str("# HELP mock_kv_handoffs_total KV handoffs by result.\n# TYPE mock_kv_handoffs_total counter\n");
    for (r, n) in &c.handoffs {
        s.push_str(&format!(
            "mock_kv_handoffs_total{{protocol=\"{}\",result=\"{r}\"}} {n}\n",
            protocol_name(&shared.cfg)
        ));
    }
    for (name, v) in [
        ("mock_kv_recompute_total", c.recompute),
        ("mock_kv_expired_unread_total", c.expired_unread),
        ("mock_rooms_orphaned_total", c.rooms_orphaned),
        ("num_bootstrap_failed_reqs_total", c.bootstrap_failed),
        ("num_transfer_failed_reqs_total", c.transfer_failed),
    ] {
        s.push_str(&format!("# TYPE {name} counter\n{name} {v}\n"));
    }
    s
}

fn server_info(shared: &Shared) -> Value {
    let cfg = &shared.cfg;
    let mode = match cfg.role {
        Role::Both => Value::Null,
        r => json!(r.as_str()),
    };
    json!({
        "model_path": cfg.model, "served_model_name": cfg.model, "tokenizer_path": cfg.model,
        "host": cfg.bind_ip.to_string(), "port": shared.api_addr.port(),
        "disaggregation_mode": mode.as_str().unwrap_or("null"),
        "disaggregation_bootstrap_port": shared.bootstrap_addr.map(|a| a.port()).unwrap_or(cfg.default_bootstrap_port),
        "disaggregation_transfer_backend": cfg.connector.as_str(),
        "dp_size": cfg.dp_size, "tp_size": cfg.tp_size, "page_size": cfg.page_size,
        "kv_cache_dtype": cfg.kv_cache_dtype,
        "max_running_requests": cfg.report_running_window.then_some(cfg.max_running_requests),
        "context_length": cfg.max_model_len, "load_balance_method": cfg.load_balance_method,
        "version": "0.0.0-mock", "weight_version": "default",
        "internal_states": [{"max_total_num_tokens": cfg.kv_tokens, "last_gen_throughput": 0.0}],
    })
}

fn loads(shared: &Shared) -> Value {
    let (running, waiting, usage) = current_load(shared);
    let dp = shared.cfg.dp_size.max(1) as u64;
    let kv = shared.cfg.kv_tokens as u64;
    let used = ((usage * kv as f64) as u64).min(kv);
    let rows: Vec<Value> = (0..dp)
        .map(|r| {
            let (run, wait) = if r == 0 { (running, waiting) } else { (0, 0) };
            json!({"dp_rank": r, "num_running_reqs": run, "num_waiting_reqs": wait, "num_total_reqs": run + wait,
                "num_used_tokens": if r == 0 { used } else { 0 }, "max_total_num_tokens": kv,
                "max_running_requests": shared.cfg.max_running_requests,
                "token_usage": if r == 0 { used as f64 / kv.max(1) as f64 } else { 0.0 },
                "gen_throughput": 0.0, "cache_hit_rate": 0.0, "utilization": 0.0,
                "memory": null, "queues": null,
                "disagg": {"prefill_bootstrap_queue_reqs": shared.sgl.count("prefill"), "decode_transfer_queue_reqs": shared.sgl.count("decode")}})
        })
        .collect();
    json!({"timestamp": format!("{:.3}", now_ms()), "version": "0.0.0-mock", "dp_rank_count": dp, "loads": rows,
        "aggregate": {"total_running_reqs": running, "total_waiting_reqs": waiting, "total_reqs": running + waiting,
            "avg_token_usage": used as f64 / kv.max(1) as f64, "avg_throughput": 0.0, "avg_utilization": 0.0}})
}

/// The API-port router.
pub(crate) async fn api(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> HttpResponse {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let cfg = &shared.cfg;
    let engine = cfg.engine;
    if cfg.transport == Transport::Grpc
        && !(path.starts_with("/mock/") || path == "/metrics" || path == "/health")
    {
        // The control port of a gRPC engine: the engine itself answers on the gRPC port.
        return server::text(404, "Not Found");
    }
    if method == http::Method::POST {
        if let Some(route) = Route::from_path(&path).filter(|r| r.served_by(engine)) {
            return handle_model(shared, route, req, peer).await;
        }
    }
    match (method.as_str(), path.as_str()) {
        ("GET", "/health") | ("GET", "/health_generate") => {
            if shared.crashed.load(Ordering::SeqCst) {
                server::text(503, "")
            } else if engine == EngineKind::Sglang {
                server::text(200, "")
            } else {
                server::full(200, "application/json", "")
            }
        }
        ("POST", "/v1/messages/count_tokens") if engine == EngineKind::Sglang => {
            let b = server::read_body(req.into_body()).await.unwrap_or_default();
            let body: Value = serde_json::from_slice(&b).unwrap_or(Value::Null);
            let mut probe = body.clone();
            probe["max_tokens"] = json!(1);
            let pctx = ParseCtx {
                engine,
                model: cfg.model.clone(),
                eos_period: 0,
                max_model_len: u64::MAX,
                header_request_id: None,
                vocab: cfg.output_vocab.clone(),
                sample_from_request_id: false,
            };
            match job::parse(Route::Messages, &probe, &pctx) {
                Ok(j) => server::json(200, &json!({"input_tokens": j.items[0].prompt_ids.len()})),
                Err(e) => error_response(&shared, Some(Route::Messages), &e),
            }
        }
        ("POST", "/flush_cache") => {
            shared
                .prefix_cache
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
            server::text(200, "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n")
        }
        ("GET", "/v1/models") => {
            let owned = engine.as_str();
            server::json(
                200,
                &json!({"object":"list","data":[{"id":cfg.model,"object":"model","created":0,"owned_by":owned,
                "root":cfg.model,"parent":null,"max_model_len":cfg.max_model_len}]}),
            )
        }
        ("GET", "/version") if engine == EngineKind::Vllm => {
            server::json(200, &json!({"version":"0.0.0-mock"}))
        }
        ("GET", "/server_info") | ("GET", "/get_server_info") if engine == EngineKind::Sglang => {
            server::json(200, &server_info(&shared))
        }
        ("GET", "/model_info") | ("GET", "/get_model_info") if engine == EngineKind::Sglang => {
            server::json(
                200,
                &json!({"model_path":cfg.model,"tokenizer_path":cfg.model,"is_generation":true,"preferred_sampling_params":null,
                "weight_version":"default","has_image_understanding":false,"has_audio_understanding":false,"model_type":"mock","architectures":["MockForCausalLM"]}),
            )
        }
        ("GET", "/v1/loads") | ("GET", "/get_load") if engine == EngineKind::Sglang => {
            server::json(200, &loads(&shared))
        }
        ("GET", "/metrics") => server::full(
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics_text(&shared),
        ),
        ("GET", "/mock/requests") => server::json(
            200,
            &serde_json::to_value(shared.recorder.all()).unwrap_or_default(),
        ),
        ("GET", "/mock/rooms") => server::json(
            200,
            &serde_json::to_value(shared.rooms()).unwrap_or_default(),
        ),
        ("GET", "/mock/aborts") => server::json(
            200,
            &serde_json::to_value(shared.grpc.aborts()).unwrap_or_default(),
        ),
        ("GET", "/mock/pinned") => server::json(
            200,
            &serde_json::to_value(shared.vllm.pinned_list()).unwrap_or_default(),
        ),
        ("GET", "/mock/stats") => server::json(
            200,
            &serde_json::to_value(stats(&shared)).unwrap_or_default(),
        ),
        ("POST", "/mock/faults") => {
            let b = server::read_body(req.into_body()).await.unwrap_or_default();
            match serde_json::from_slice::<Fault>(&b) {
                Ok(f) => {
                    inject(&shared, f).await;
                    server::json(200, &json!({"ok":true}))
                }
                Err(e) => {
                    server::json(400, &json!({"error":{"message":format!("bad fault: {e}")}}))
                }
            }
        }
        ("POST", "/mock/load") => {
            let b = server::read_body(req.into_body()).await.unwrap_or_default();
            let report = serde_json::from_slice::<LoadReport>(&b).ok();
            *shared
                .load_override
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = report;
            server::json(200, &json!({"ok":true}))
        }
        ("POST", "/mock/reset") => {
            reset(&shared).await;
            server::json(200, &json!({"ok":true}))
        }
        ("POST", "/mock/restart") => {
            vllm::restart(&shared).await;
            server::json(200, &json!({"ok":true,"engine_id":shared.engine_id()}))
        }
        _ => {
            let e = ApiError {
                status: 404,
                message: "Not Found".into(),
                kind: ErrorKind::Request,
            };
            if engine == EngineKind::Vllm {
                server::json(404, &json!({"detail":"Not Found"}))
            } else {
                error_response(&shared, None, &e)
            }
        }
    }
}

pub(crate) async fn inject(shared: &Arc<Shared>, f: Fault) {
    if matches!(f, Fault::BootstrapDown) {
        sglang::bootstrap_down(shared);
        return;
    }
    let count = f.count();
    shared
        .faults
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((f, count));
}

pub(crate) async fn reset(shared: &Arc<Shared>) {
    shared
        .faults
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clear();
    shared.recorder.clear();
    shared.grpc.clear_aborts();
    if !shared.bootstrap_up.load(Ordering::SeqCst) {
        let _ = sglang::bootstrap_up(shared).await;
    }
}

/// Binds every listener of an engine and starts serving.
pub(crate) async fn start(cfg: MockEngineConfig) -> io::Result<Arc<Shared>> {
    if cfg.engine == EngineKind::TokenSpeed && cfg.transport != Transport::Grpc {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "TokenSpeed serves gRPC only (set transport: Grpc)",
        ));
    }
    let api_l = TcpListener::bind(SocketAddr::new(cfg.bind_ip, cfg.port)).await?;
    let control_l = match cfg.transport {
        Transport::Grpc => {
            Some(TcpListener::bind(SocketAddr::new(cfg.bind_ip, cfg.grpc.control_port)).await?)
        }
        Transport::Http => None,
    };
    let data_l = TcpListener::bind(SocketAddr::new(cfg.bind_ip, 0)).await?;
    if cfg.role == Role::Encode
        && (cfg.engine != EngineKind::TokenSpeed || cfg.transport != Transport::Grpc)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the encode role is TokenSpeed over gRPC only (EPD)",
        ));
    }
    // An encode worker's bootstrap server is where prefills fetch its embeddings.
    let needs_bootstrap = cfg.role == Role::Encode
        || cfg.role == Role::Prefill
            && match cfg.engine {
                EngineKind::Sglang | EngineKind::TokenSpeed => true,
                EngineKind::Vllm => cfg.connector == crate::config::Connector::Mooncake,
            };
    let boot_l = if needs_bootstrap {
        Some(TcpListener::bind(SocketAddr::new(cfg.bind_ip, cfg.bootstrap_port)).await?)
    } else {
        None
    };
    let needs_side = cfg.engine == EngineKind::Vllm && cfg.role != Role::Both;
    let side_l = if needs_side {
        Some(TcpListener::bind(SocketAddr::new(cfg.bind_ip, cfg.side_channel_port)).await?)
    } else {
        None
    };
    let notify_l = if needs_side
        && matches!(
            cfg.connector,
            crate::config::Connector::MoriioRead | crate::config::Connector::MoriioWrite
        ) {
        Some(TcpListener::bind(SocketAddr::new(cfg.bind_ip, cfg.notify_port)).await?)
    } else {
        None
    };
    let engine_id = cfg.engine_id.clone().unwrap_or_else(vllm::new_engine_id);
    let shared = Arc::new(Shared {
        api_addr: api_l.local_addr()?,
        control_addr: control_l.as_ref().map(|l| l.local_addr()).transpose()?,
        data_addr: data_l.local_addr()?,
        bootstrap_addr: boot_l.as_ref().map(|l| l.local_addr()).transpose()?,
        side_addr: side_l.as_ref().map(|l| l.local_addr()).transpose()?,
        notify_addr: notify_l.as_ref().map(|l| l.local_addr()).transpose()?,
        engine_id: Mutex::new(engine_id),
        recorder: Recorder::new(cfg.record_limit),
        counters: Counters::default(),
        faults: Mutex::new(Vec::new()),
        sgl: sglang::SglState::default(),
        vllm: vllm::VllmState::new(&cfg),
        groups: Groups {
            api: Arc::default(),
            data: Arc::default(),
            bootstrap: Mutex::new(Arc::default()),
            side: Arc::default(),
            work: Arc::default(),
        },
        killed: AtomicBool::new(false),
        crashed: AtomicBool::new(false),
        bootstrap_up: AtomicBool::new(boot_l.is_some()),
        waiting: AtomicU64::new(0),
        load_override: Mutex::new(None),
        running: AtomicU64::new(0),
        decode_slots: Arc::new(tokio::sync::Semaphore::new(
            cfg.max_running_requests.max(1) as usize
        )),
        prefill_compute: tokio::sync::Semaphore::new(1),
        prefix_cache: Mutex::new(HashSet::new()),
        next_id: AtomicU64::new(1),
        grpc: grpc::GrpcState::default(),
        encoder: grpc::encoder::EncoderState::default(),
        cfg,
    });
    match control_l {
        Some(control_l) => {
            grpc::serve(&shared, api_l);
            let sh = shared.clone();
            server::serve(control_l, shared.groups.api.clone(), move |req, peer| {
                api(sh.clone(), req, peer)
            });
        }
        None => {
            let sh = shared.clone();
            server::serve(api_l, shared.groups.api.clone(), move |req, peer| {
                api(sh.clone(), req, peer)
            });
        }
    }
    let sh = shared.clone();
    server::serve(data_l, shared.groups.data.clone(), move |req, peer| {
        data_plane(sh.clone(), req, peer)
    });
    if let Some(l) = boot_l {
        let g = shared
            .groups
            .bootstrap
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let sh = shared.clone();
        server::serve(l, g, move |req, peer| {
            sglang::bootstrap_server(sh.clone(), req, peer)
        });
        if shared.cfg.role == Role::Encode {
            // No KV ranks: the encoder only serves embeddings.
        } else if shared.cfg.engine.uses_bootstrap_rooms() {
            sglang::register_ranks(&shared).await?;
        } else {
            vllm::register_mooncake(&shared).await?;
        }
    }
    if let Some(l) = side_l {
        let sh = shared.clone();
        server::serve(l, shared.groups.side.clone(), move |req, peer| {
            vllm::side_channel(sh.clone(), req, peer)
        });
    }
    if let Some(l) = notify_l {
        let sh = shared.clone();
        server::serve(l, shared.groups.side.clone(), move |req, peer| {
            vllm::side_channel(sh.clone(), req, peer)
        });
    }
    Ok(shared)
}

async fn data_plane(shared: Arc<Shared>, req: Request<Incoming>, peer: SocketAddr) -> HttpResponse {
    let path = req.uri().path().to_string();
    if path.starts_with("/mock-kv/sglang/") {
        return sglang::data_plane(shared, req, peer).await;
    }
    if path.starts_with("/mock-kv/") {
        return vllm::side_channel(shared, req, peer).await;
    }
    server::text(404, "Not Found")
}

/// Cuts a streamed body unless its producer finished it: a stream driver aborted by [`kill`]
/// drops its sender, which would end the body cleanly (hyper writes the chunked terminator) if
/// the connection's task has not been aborted yet. A crashed engine never ends a stream cleanly,
/// so the body ends with an error instead (hyper then drops the connection).
struct CutUnlessFinished {
    tx: mpsc::Sender<Result<Bytes, io::Error>>,
    finished: bool,
}

impl Drop for CutUnlessFinished {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self
                .tx
                .try_send(Err(io::Error::other("mock engine killed mid-stream")));
        }
    }
}

/// Abruptly stops everything (a crashed process): listeners, connections, running requests.
pub(crate) fn kill(shared: &Shared) {
    shared.killed.store(true, Ordering::SeqCst);
    shared.grpc.kill_connections();
    shared.groups.api.abort_all();
    shared.groups.data.abort_all();
    shared
        .groups
        .bootstrap
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .abort_all();
    shared.groups.side.abort_all();
    shared.groups.work.abort_all();
    shared.vllm.abort_timers();
}

/// Polls `pred` every 10 ms until it holds or `deadline` passes.
pub async fn wait_until(deadline: Duration, mut pred: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    loop {
        if pred() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A load report forced on the engine (`POST /mock/load`; a body that is not a report clears it).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LoadReport {
    pub waiting: u64,
    pub running: u64,
    pub token_usage: f64,
}
