//! Parsing of the model routes' JSON bodies into one internal [`Job`]: the prompts (one item per
//! batch element / sample), their sampling specs, and the output options. Both dialects share it;
//! vLLM's request validations (the 400s that catch a badly rewritten prefill leg) live here too.

use serde_json::{Map, Value};

use crate::config::EngineKind;
use crate::fake_model::{self, OutputVocab, SamplingSpec};

/// A model route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Generate,
    Chat,
    Completions,
    Messages,
    Responses,
    Rerank,
}

impl Route {
    pub fn from_path(path: &str) -> Option<Route> {
        Some(match path {
            "/generate" => Route::Generate,
            "/v1/chat/completions" => Route::Chat,
            "/v1/completions" => Route::Completions,
            "/v1/messages" => Route::Messages,
            "/v1/responses" => Route::Responses,
            "/v1/rerank" | "/rerank" => Route::Rerank,
            _ => return None,
        })
    }

    pub fn path(self) -> &'static str {
        match self {
            Route::Generate => "/generate",
            Route::Chat => "/v1/chat/completions",
            Route::Completions => "/v1/completions",
            Route::Messages => "/v1/messages",
            Route::Responses => "/v1/responses",
            Route::Rerank => "/v1/rerank",
        }
    }

    /// Whether `engine` serves this route.
    pub fn served_by(self, engine: EngineKind) -> bool {
        match engine {
            EngineKind::Sglang => true,
            EngineKind::Vllm => matches!(self, Route::Chat | Route::Completions | Route::Responses),
            // gRPC only: no HTTP model route.
            EngineKind::TokenSpeed => false,
        }
    }
}

/// A request-level error with the HTTP status an engine answers with.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    /// What failed, where a transport answers differently per cause (gRPC).
    pub kind: ErrorKind,
}

/// The cause of an [`ApiError`], for the transports that tell causes apart.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum ErrorKind {
    /// The request itself, or anything without a more specific cause.
    #[default]
    Request,
    /// A SGLang-style rendezvous that never completed: bootstrap / transfer timeout, prefill
    /// bootstrap unreachable.
    KvTimeout,
    /// A vLLM connector could not load the remote KV (`kv_load_failure_policy = fail`): the
    /// engine finishes the request with `finish_reason = "error"`.
    KvLoad,
    /// An injected gRPC fault (`fail_after_tokens`).
    Fault(crate::config::GrpcCode),
}

impl ApiError {
    pub fn bad_request(m: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            message: m.into(),
            kind: ErrorKind::Request,
        }
    }
    pub fn internal(m: impl Into<String>) -> Self {
        ApiError {
            status: 500,
            message: m.into(),
            kind: ErrorKind::Request,
        }
    }
    pub fn with_kind(mut self, kind: ErrorKind) -> Self {
        self.kind = kind;
        self
    }
}

/// One prompt to run (one batch element or one sample).
#[derive(Clone, Debug)]
pub struct JobItem {
    /// Output position (choice index / batch index).
    pub index: usize,
    /// Index into the per-room bootstrap arrays.
    pub room_index: usize,
    /// `n>1` sample index (perturbs the initial state).
    pub sample: Option<usize>,
    pub prompt_ids: Vec<u32>,
    pub spec: SamplingSpec,
    /// gRPC: the prompt's image placeholder ranges, with the features this leg has for them.
    pub media: Vec<crate::vision::MediaSpan>,
}

impl JobItem {
    /// The ids the model folds, where every feature is known; placeholders whose feature this
    /// leg lacks keep their ids (prefix-cache keys, input logprobs).
    pub fn folded_ids(&self) -> Vec<u32> {
        let known: Vec<_> = self
            .media
            .iter()
            .filter_map(|s| s.feature.map(|f| (s.range.clone(), f)))
            .collect();
        crate::fake_model::fold_media(&self.prompt_ids, &known)
    }

    /// The ids a leg that computes the prompt folds; a placeholder without its image's feature
    /// is refused (400: INVALID_ARGUMENT over gRPC).
    pub fn computed_ids(&self) -> Result<Vec<u32>, ApiError> {
        let items = crate::vision::computable(&self.media).map_err(ApiError::bad_request)?;
        Ok(crate::fake_model::fold_media(&self.prompt_ids, &items))
    }
}

/// Logprob output options.
#[derive(Clone, Debug, Default)]
pub struct LogprobOpts {
    pub return_logprob: bool,
    pub start: usize,
    pub top: usize,
    pub text_in_logprobs: bool,
}

/// A parsed model request.
#[derive(Clone, Debug)]
pub struct Job {
    pub route: Route,
    pub stream: bool,
    pub items: Vec<JobItem>,
    /// Bootstrap fields are arrays (one room per element).
    pub batched: bool,
    /// How many rooms (= bootstrap array length when batched).
    pub n_rooms: usize,
    pub logprobs: LogprobOpts,
    pub include_usage: bool,
    pub model: String,
    /// Request id (`rid`, `X-Request-Id`, `request_id`, or random).
    pub rid: String,
    /// `/generate` answers a list when the input was a list.
    pub list_output: bool,
    /// Rerank documents.
    pub documents: Vec<String>,
    pub top_n: Option<usize>,
    pub return_documents: bool,
    pub n: usize,
}

/// Random lower-case hex id of `len` chars.
pub fn random_hex(len: usize) -> String {
    use rand::Rng;
    let mut r = rand::thread_rng();
    (0..len)
        .map(|_| format!("{:x}", r.gen_range(0..16u8)))
        .collect()
}

fn as_uint(v: &Value, field: &str) -> Result<Option<u64>, ApiError> {
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => n.as_u64().map(Some).ok_or_else(|| {
            ApiError::bad_request(format!("{field} must be a non-negative integer"))
        }),
        _ => Err(ApiError::bad_request(format!(
            "{field}: Input should be a valid integer"
        ))),
    }
}

fn get_uint(o: &Map<String, Value>, field: &str) -> Result<Option<u64>, ApiError> {
    o.get(field).map_or(Ok(None), |v| as_uint(v, field))
}

fn get_bool(o: &Map<String, Value>, field: &str) -> Result<Option<bool>, ApiError> {
    match o.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::bad_request(format!(
            "{field}: Input should be a valid boolean"
        ))),
    }
}

fn stop_list(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

fn u32_list(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64().map(|n| n as u32))
            .collect(),
        _ => Vec::new(),
    }
}

fn content_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str).or_else(|| p.as_str()))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

fn messages_of(v: Option<&Value>) -> Result<Vec<(String, String)>, ApiError> {
    let arr = v
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::bad_request("messages: Field required"))?;
    arr.iter()
        .map(|m| {
            let role = m
                .get("role")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::bad_request("messages.role: Field required"))?;
            Ok((role.to_string(), content_text(m.get("content"))))
        })
        .collect()
}

struct Common {
    stream: bool,
    seed: Option<u64>,
    ignore_eos: bool,
    stop: Vec<String>,
    stop_token_ids: Vec<u32>,
    min_tokens: usize,
}

fn common(
    o: &Map<String, Value>,
    engine: EngineKind,
    max_tokens: Option<u64>,
) -> Result<Common, ApiError> {
    let stream = get_bool(o, "stream")?.unwrap_or(false);
    if engine == EngineKind::Vllm {
        if o.get("stream_options").is_some_and(|v| !v.is_null()) && !stream {
            return Err(ApiError::bad_request(
                "Stream options can only be defined when `stream=True`.",
            ));
        }
        if let Some(kv) = o.get("kv_transfer_params") {
            if !kv.is_null() && !kv.is_object() {
                return Err(ApiError::bad_request(
                    "kv_transfer_params: Input should be a valid dictionary",
                ));
            }
        }
    }
    let min_tokens = get_uint(o, "min_tokens")?.unwrap_or(0);
    if let Some(max) = max_tokens {
        if min_tokens > max {
            return Err(ApiError::bad_request(format!(
                "min_tokens must be less than or equal to max_tokens={max}, got {min_tokens}."
            )));
        }
    }
    Ok(Common {
        stream,
        seed: get_uint(o, "seed")?,
        ignore_eos: get_bool(o, "ignore_eos")?.unwrap_or(false),
        stop: stop_list(o.get("stop")),
        stop_token_ids: u32_list(o.get("stop_token_ids")),
        min_tokens: min_tokens as usize,
    })
}

fn spec_of(c: &Common, max_new: u64, ctx: &ParseCtx, top: usize) -> SamplingSpec {
    SamplingSpec {
        max_new_tokens: max_new as usize,
        min_new_tokens: c.min_tokens,
        ignore_eos: c.ignore_eos,
        stop: c.stop.clone(),
        stop_token_ids: c.stop_token_ids.clone(),
        eos_period: ctx.eos_period,
        seed: c.seed,
        top_logprobs: top,
        vocab: ctx.vocab.clone(),
    }
}

/// Engine-wide knobs that shape parsing.
#[derive(Clone, Debug)]
pub struct ParseCtx {
    pub engine: EngineKind,
    pub model: String,
    pub eos_period: u64,
    pub max_model_len: u64,
    /// `X-Request-Id` header value.
    pub header_request_id: Option<String>,
    pub vocab: OutputVocab,
    /// See `MockEngineConfig::sample_from_request_id`.
    pub sample_from_request_id: bool,
}

fn check_context(ctx: &ParseCtx, prompt_len: usize, max_new: u64) -> Result<(), ApiError> {
    if prompt_len as u64 > ctx.max_model_len
        || (ctx.engine == EngineKind::Vllm && prompt_len as u64 + max_new > ctx.max_model_len)
    {
        return Err(ApiError::bad_request(format!(
            "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the messages, {} in the completion). Please reduce the length of the messages or completion.",
            ctx.max_model_len,
            prompt_len as u64 + max_new,
            prompt_len,
            max_new
        )));
    }
    Ok(())
}

/// Parses a model route body.
pub fn parse(route: Route, body: &Value, ctx: &ParseCtx) -> Result<Job, ApiError> {
    let o = body
        .as_object()
        .ok_or_else(|| ApiError::bad_request("Input should be a valid dictionary or object"))?;
    let model = o
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(&ctx.model)
        .to_string();
    let rid = match (ctx.engine, o.get("rid")) {
        (EngineKind::Sglang, Some(Value::String(s))) => s.clone(),
        _ => ctx
            .header_request_id
            .clone()
            .or_else(|| {
                o.get("request_id")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .unwrap_or_else(|| random_hex(32)),
    };
    let m = &ctx.model;
    let mut job = Job {
        route,
        stream: false,
        items: Vec::new(),
        batched: false,
        n_rooms: 1,
        logprobs: LogprobOpts::default(),
        include_usage: o
            .get("stream_options")
            .and_then(|s| s.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false),
        model,
        rid,
        list_output: false,
        documents: Vec::new(),
        top_n: None,
        return_documents: true,
        n: 1,
    };
    match route {
        Route::Generate => {
            let sp = o
                .get("sampling_params")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let max_new = get_uint(&sp, "max_new_tokens")?.unwrap_or(128);
            let mut c = common(&sp, ctx.engine, Some(max_new))?;
            c.stream = get_bool(o, "stream")?.unwrap_or(false);
            c.min_tokens = get_uint(&sp, "min_new_tokens")?.unwrap_or(0) as usize;
            c.seed = get_uint(&sp, "sampling_seed")?.or(c.seed);
            let prompts: Vec<Vec<u32>> = match (o.get("input_ids"), o.get("text")) {
                (Some(Value::Array(a)), _) if a.first().is_some_and(Value::is_array) => {
                    job.batched = true;
                    a.iter().map(|x| u32_list(Some(x))).collect()
                }
                (Some(Value::Array(a)), _) => vec![u32_list(Some(&Value::Array(a.clone())))],
                (_, Some(Value::String(s))) => vec![fake_model::encode_prompt(m, s)],
                (_, Some(Value::Array(a))) => {
                    job.batched = true;
                    a.iter()
                        .map(|x| fake_model::encode_prompt(m, x.as_str().unwrap_or("")))
                        .collect()
                }
                _ => {
                    return Err(ApiError::bad_request(
                        "Either text or input_ids should be provided.",
                    ))
                }
            };
            // `sampling_params.n`: SGLang turns one prompt into a batch of n samples (its
            // answer is then a list), every sample of a prompt in that prompt's room.
            let n = get_uint(&sp, "n")?.unwrap_or(1).max(1) as usize;
            job.n = n;
            job.list_output = job.batched || n > 1;
            let top = get_uint(o, "top_logprobs_num")?.unwrap_or(0) as usize;
            job.logprobs = LogprobOpts {
                return_logprob: get_bool(o, "return_logprob")?.unwrap_or(false),
                start: o
                    .get("logprob_start_len")
                    .and_then(Value::as_i64)
                    .filter(|&s| s >= 0)
                    .unwrap_or(0) as usize,
                top,
                text_in_logprobs: get_bool(o, "return_text_in_logprobs")?.unwrap_or(false),
            };
            job.stream = c.stream;
            job.n_rooms = prompts.len();
            for (i, p) in prompts.into_iter().enumerate() {
                check_context(ctx, p.len(), max_new)?;
                for s in 0..n {
                    job.items.push(JobItem {
                        index: i * n + s,
                        room_index: i,
                        sample: (n > 1).then_some(s),
                        prompt_ids: p.clone(),
                        spec: spec_of(&c, max_new, ctx, top),
                        media: Vec::new(),
                    });
                }
            }
        }
        Route::Chat => {
            let msgs = messages_of(o.get("messages"))?;
            let ids = fake_model::encode_chat(m, &msgs);
            let max = get_uint(o, "max_completion_tokens")?.or(get_uint(o, "max_tokens")?);
            let c = common(o, ctx.engine, max)?;
            let max_new = max.unwrap_or_else(|| ctx.max_model_len.saturating_sub(ids.len() as u64));
            check_context(ctx, ids.len(), max_new)?;
            let n = get_uint(o, "n")?.unwrap_or(1).max(1) as usize;
            let want_lp = get_bool(o, "logprobs")?.unwrap_or(false);
            let top = if want_lp {
                get_uint(o, "top_logprobs")?.unwrap_or(0) as usize
            } else {
                0
            };
            job.logprobs = LogprobOpts {
                return_logprob: want_lp,
                start: 0,
                top,
                text_in_logprobs: true,
            };
            job.stream = c.stream;
            job.n = n;
            job.batched = n > 1;
            job.n_rooms = n;
            for i in 0..n {
                job.items.push(JobItem {
                    index: i,
                    // SGLang runs the n samples of its one prompt as copies of the prompt's
                    // object, all in `bootstrap_room[0]` (batch_request_dispatcher.py; SGLang PRs
                    // #24223, #26486): the extra samples wait on a room already consumed.
                    room_index: 0,
                    sample: (n > 1).then_some(i),
                    prompt_ids: ids.clone(),
                    spec: spec_of(&c, max_new, ctx, top),
                    media: Vec::new(),
                });
            }
        }
        Route::Completions => {
            let max_new = get_uint(o, "max_tokens")?.unwrap_or(16);
            let c = common(o, ctx.engine, Some(max_new))?;
            let prompts: Vec<Vec<u32>> = match o.get("prompt") {
                Some(Value::String(s)) => vec![fake_model::encode_prompt(m, s)],
                Some(Value::Array(a)) if a.iter().all(Value::is_u64) && !a.is_empty() => {
                    // One tokenized prompt; the gateway still counts it as a batch of its length.
                    job.batched = true;
                    vec![u32_list(Some(&Value::Array(a.clone())))]
                }
                Some(Value::Array(a)) if !a.is_empty() => {
                    job.batched = true;
                    a.iter()
                        .map(|x| match x {
                            Value::String(s) => fake_model::encode_prompt(m, s),
                            other => u32_list(Some(other)),
                        })
                        .collect()
                }
                _ => return Err(ApiError::bad_request("prompt: Field required")),
            };
            let n = get_uint(o, "n")?.unwrap_or(1).max(1) as usize;
            let lp = o.get("logprobs").filter(|v| !v.is_null());
            let top = lp.and_then(Value::as_u64).unwrap_or(0) as usize;
            job.logprobs = LogprobOpts {
                return_logprob: lp.is_some(),
                start: 0,
                top,
                text_in_logprobs: true,
            };
            job.stream = c.stream;
            job.n = n;
            job.n_rooms = if job.batched {
                o.get("prompt")
                    .and_then(Value::as_array)
                    .map_or(1, Vec::len)
            } else {
                1
            };
            let mut index = 0;
            for (pi, p) in prompts.into_iter().enumerate() {
                check_context(ctx, p.len(), max_new)?;
                for s in 0..n {
                    job.items.push(JobItem {
                        index,
                        room_index: pi,
                        sample: (n > 1).then_some(s),
                        prompt_ids: p.clone(),
                        spec: spec_of(&c, max_new, ctx, top),
                        media: Vec::new(),
                    });
                    index += 1;
                }
            }
        }
        Route::Messages => {
            let mut msgs = Vec::new();
            let sys = content_text(o.get("system"));
            if !sys.is_empty() {
                msgs.push(("system".to_string(), sys));
            }
            msgs.extend(messages_of(o.get("messages"))?);
            let max_new = get_uint(o, "max_tokens")?
                .ok_or_else(|| ApiError::bad_request("max_tokens: Field required"))?;
            let mut c = common(o, ctx.engine, Some(max_new))?;
            c.stop = stop_list(o.get("stop_sequences"));
            let ids = fake_model::encode_chat(m, &msgs);
            check_context(ctx, ids.len(), max_new)?;
            job.stream = c.stream;
            job.items.push(JobItem {
                index: 0,
                room_index: 0,
                sample: None,
                prompt_ids: ids,
                spec: spec_of(&c, max_new, ctx, 0),
                media: Vec::new(),
            });
        }
        Route::Responses => {
            let mut msgs = Vec::new();
            let instr = content_text(o.get("instructions"));
            if !instr.is_empty() {
                msgs.push(("system".to_string(), instr));
            }
            match o.get("input") {
                Some(Value::String(s)) => msgs.push(("user".to_string(), s.clone())),
                Some(Value::Array(items)) => {
                    for it in items {
                        let role = it.get("role").and_then(Value::as_str).unwrap_or("user");
                        msgs.push((role.to_string(), content_text(it.get("content"))));
                    }
                }
                _ => return Err(ApiError::bad_request("input: Field required")),
            }
            let ids = fake_model::encode_chat(m, &msgs);
            let max = get_uint(o, "max_output_tokens")?;
            let c = common(o, ctx.engine, max)?;
            let max_new = max.unwrap_or_else(|| ctx.max_model_len.saturating_sub(ids.len() as u64));
            check_context(ctx, ids.len(), max_new)?;
            job.stream = c.stream;
            job.items.push(JobItem {
                index: 0,
                room_index: 0,
                sample: None,
                prompt_ids: ids,
                spec: spec_of(&c, max_new, ctx, 0),
                media: Vec::new(),
            });
        }
        Route::Rerank => {
            let query = o
                .get("query")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::bad_request("query: Field required"))?;
            let docs = o
                .get("documents")
                .and_then(Value::as_array)
                .ok_or_else(|| ApiError::bad_request("documents: Field required"))?;
            job.documents = docs
                .iter()
                .map(|d| {
                    d.as_str()
                        .or_else(|| d.get("text").and_then(Value::as_str))
                        .unwrap_or("")
                        .to_string()
                })
                .collect();
            job.top_n = get_uint(o, "top_n")?.map(|n| n as usize);
            job.return_documents = get_bool(o, "return_documents")?.unwrap_or(true);
            let ids = fake_model::encode_prompt(m, query);
            job.items.push(JobItem {
                index: 0,
                room_index: 0,
                sample: None,
                prompt_ids: ids,
                spec: SamplingSpec {
                    max_new_tokens: 1,
                    vocab: ctx.vocab.clone(),
                    ..Default::default()
                },
                media: Vec::new(),
            });
        }
    }
    if ctx.sample_from_request_id && job.n == 1 {
        if let Some(i) = sample_suffix(&job.rid) {
            for item in &mut job.items {
                item.sample = Some(i);
            }
        }
    }
    Ok(job)
}

/// The sample index a request id ends with (`…-<i>`, 1 to 4 digits).
fn sample_suffix(rid: &str) -> Option<usize> {
    let (_, tail) = rid.rsplit_once('-')?;
    if (1..=4).contains(&tail.len()) && tail.bytes().all(|b| b.is_ascii_digit()) {
        tail.parse().ok()
    } else {
        None
    }
}
