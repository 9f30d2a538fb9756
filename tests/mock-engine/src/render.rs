//! Turns the generation steps of a [`Job`] into each engine's response shapes: complete JSON
//! bodies and SSE streams for every route, and the error bodies / abort frames of each dialect
//! (mock-engines-spec §1.2, §1.3, §1.7).

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use crate::config::EngineKind;
use crate::fake_model::{token_text, Finish, GenToken, Matched, OutputVocab};
use crate::job::{ApiError, Job, LogprobOpts, Route};

pub use crate::fake_model::LogprobRow as LpRow;

/// Prompt facts of one item, known once its prompt is "in the KV".
#[derive(Clone, Debug, Default)]
pub struct PromptInfo {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    /// `None` on a decode leg (SGLang decode never computes prompt rows).
    pub input_logprobs: Option<Vec<LpRow>>,
}

/// How an item finished.
#[derive(Clone, Debug, PartialEq)]
pub enum FinishKind {
    Model(Finish),
    /// A SGLang prefill leg after the transfer: `{"type":"length","length":0}`.
    PrefillHandoff,
}

/// One event of a running job.
#[derive(Clone, Debug)]
pub enum Step {
    Prompt {
        item: usize,
        info: PromptInfo,
    },
    Token {
        item: usize,
        token: GenToken,
        visible: String,
        finish: Option<FinishKind>,
    },
    Finish {
        item: usize,
        finish: FinishKind,
    },
    Scores {
        item: usize,
        scores: Vec<f64>,
    },
    /// The item's runner returned: nothing more will come for it (and what it recorded, such as
    /// a vLLM prefill's handoff, is final).
    ItemDone {
        item: usize,
    },
}

#[derive(Default, Clone)]
struct Item {
    prompt: PromptInfo,
    tokens: Vec<GenToken>,
    visible: String,
    sent_text: usize,
    sent_tokens: usize,
    finish: Option<FinishKind>,
    scores: Option<Vec<f64>>,
    opened: bool,
}

/// Renders one job's output in one dialect.
pub struct Renderer {
    engine: EngineKind,
    /// vLLM `--enable-prompt-tokens-details`.
    pub prompt_tokens_details: bool,
    route: Route,
    model: String,
    rid: String,
    created: u64,
    include_usage: bool,
    lp: LogprobOpts,
    incremental: bool,
    items: Vec<Item>,
    started: bool,
    seq: u64,
    t0: Instant,
    list_output: bool,
    n: usize,
    documents: Vec<String>,
    top_n: Option<usize>,
    return_documents: bool,
    /// vLLM prefill: `kv_transfer_params` for the top level of the non-stream body.
    pub kv_transfer_params: Option<Value>,
    /// The job's output vocabulary (which ids are EOS).
    vocab: OutputVocab,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn sse(v: &Value) -> String {
    format!("data: {v}\n\n")
}

fn sse_event(name: &str, v: &Value) -> String {
    format!("event: {name}\ndata: {v}\n\n")
}

/// The SSE terminator.
pub const DONE: &str = "data: [DONE]\n\n";

impl Renderer {
    pub fn new(engine: EngineKind, job: &Job, incremental: bool) -> Self {
        Renderer {
            engine,
            prompt_tokens_details: false,
            route: job.route,
            model: job.model.clone(),
            rid: job.rid.clone(),
            created: unix_now(),
            include_usage: job.include_usage,
            lp: job.logprobs.clone(),
            incremental,
            items: vec![Item::default(); job.items.len()],
            started: false,
            seq: 0,
            t0: Instant::now(),
            list_output: job.list_output,
            n: job.n,
            documents: job.documents.clone(),
            top_n: job.top_n,
            return_documents: job.return_documents,
            kv_transfer_params: None,
            vocab: job
                .items
                .first()
                .map(|i| i.spec.vocab.clone())
                .unwrap_or_default(),
        }
    }

    fn response_id(&self) -> String {
        match (self.engine, self.route) {
            (_, Route::Messages) => format!("msg_{}", self.rid),
            (_, Route::Responses) => format!("resp_{}", self.rid),
            (EngineKind::Vllm, Route::Chat) => format!("chatcmpl-{}", self.rid),
            (EngineKind::Vllm, Route::Completions) => format!("cmpl-{}", self.rid),
            _ => self.rid.clone(),
        }
    }

    /// Finish reason of the first finished item (for records).
    pub fn finish_label(&self) -> Option<String> {
        self.items
            .iter()
            .find_map(|i| i.finish.as_ref())
            .map(|f| match f {
                FinishKind::PrefillHandoff => "length".to_string(),
                FinishKind::Model(Finish::Length(_)) => "length".to_string(),
                FinishKind::Model(Finish::Stop(_)) => "stop".to_string(),
            })
    }

    pub fn completion_tokens(&self) -> u64 {
        self.items.iter().map(|i| i.tokens.len() as u64).sum()
    }

    /// Applies a step; returns the SSE frames it produces when streaming.
    pub fn apply(&mut self, step: Step) -> Vec<String> {
        let mut out = Vec::new();
        if !self.started
            && !matches!(
                step,
                Step::Prompt { .. } | Step::Scores { .. } | Step::ItemDone { .. }
            )
        {
            self.started = true;
            out.extend(self.prologue());
        }
        match step {
            Step::Prompt { item, info } => {
                self.items[item].prompt = info;
            }
            Step::Token {
                item,
                token,
                visible,
                finish,
            } => {
                {
                    let it = &mut self.items[item];
                    it.tokens.push(token);
                    it.visible = visible;
                }
                out.extend(self.open_item(item));
                let fin = finish.is_some();
                if let Some(f) = finish {
                    self.items[item].finish = Some(f);
                }
                out.extend(self.token_frames(item, fin));
                if fin {
                    out.extend(self.finish_frames(item));
                }
            }
            Step::Finish { item, finish } => {
                self.items[item].finish = Some(finish);
                out.extend(self.open_item(item));
                if self.route == Route::Generate {
                    out.extend(self.token_frames(item, true));
                }
                out.extend(self.finish_frames(item));
            }
            Step::Scores { item, scores } => {
                self.items[item].scores = Some(scores);
            }
            Step::ItemDone { .. } => {}
        }
        out
    }

    fn prologue(&mut self) -> Vec<String> {
        match self.route {
            Route::Messages => {
                let input_tokens = self.items.first().map_or(0, |i| i.prompt.prompt_tokens);
                vec![
                    sse_event(
                        "message_start",
                        &json!({"type":"message_start","message":{"id":self.response_id(),"type":"message","role":"assistant",
                        "model":self.model,"content":[],"stop_reason":null,"stop_sequence":null,
                        "usage":{"input_tokens":input_tokens,"output_tokens":0}}}),
                    ),
                    sse_event(
                        "content_block_start",
                        &json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
                    ),
                ]
            }
            Route::Responses => {
                let r = self.response_object("in_progress");
                let mut v = Vec::new();
                v.push(self.resp_event("response.created", json!({"response": r.clone()})));
                v.push(self.resp_event("response.in_progress", json!({"response": r})));
                let msg_id = format!("msg_{}", self.rid);
                v.push(self.resp_event(
                    "response.output_item.added",
                    json!({"output_index":0,"item":{"id":msg_id,"type":"message","status":"in_progress","role":"assistant","content":[]}}),
                ));
                v.push(self.resp_event(
                    "response.content_part.added",
                    json!({"item_id":msg_id,"output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}),
                ));
                v
            }
            _ => Vec::new(),
        }
    }

    fn resp_event(&mut self, name: &str, mut v: Value) -> String {
        v["type"] = json!(name);
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        sse_event(name, &v)
    }

    fn open_item(&mut self, item: usize) -> Vec<String> {
        if self.items[item].opened {
            return Vec::new();
        }
        self.items[item].opened = true;
        if self.route == Route::Chat {
            let mut choice = json!({"index":item,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null});
            if self.engine == EngineKind::Sglang {
                choice["matched_stop"] = Value::Null;
            }
            return vec![sse(&self.chunk(vec![choice]))];
        }
        Vec::new()
    }

    fn chunk(&self, choices: Vec<Value>) -> Value {
        let object = if self.route == Route::Chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        let mut c = json!({"id":self.response_id(),"object":object,"created":self.created,"model":self.model,"choices":choices});
        if self.engine == EngineKind::Sglang || self.route == Route::Completions {
            c["usage"] = Value::Null;
        }
        c
    }

    fn lp_triple(&self, lp: Option<f64>, id: u32) -> Value {
        let text = if self.lp.text_in_logprobs {
            json!(token_text(id))
        } else {
            Value::Null
        };
        json!([lp, id, text])
    }

    fn output_lp_rows(&self, toks: &[GenToken]) -> Value {
        Value::Array(
            toks.iter()
                .map(|t| self.lp_triple(Some(t.logprob), t.id))
                .collect(),
        )
    }

    fn output_top_rows(&self, toks: &[GenToken]) -> Value {
        Value::Array(
            toks.iter()
                .map(|t| {
                    Value::Array(
                        t.top
                            .iter()
                            .map(|&(id, lp)| self.lp_triple(Some(lp), id))
                            .collect(),
                    )
                })
                .collect(),
        )
    }

    fn generate_finish(f: &FinishKind) -> Value {
        match f {
            FinishKind::PrefillHandoff => json!({"type":"length","length":0}),
            FinishKind::Model(Finish::Length(n)) => json!({"type":"length","length":n}),
            FinishKind::Model(Finish::Stop(Matched::Token(t))) => {
                json!({"type":"stop","matched":t})
            }
            FinishKind::Model(Finish::Stop(Matched::Text(s))) => json!({"type":"stop","matched":s}),
        }
    }

    fn generate_meta(&self, idx: usize, toks: &[GenToken], finish: Option<&FinishKind>) -> Value {
        let it = &self.items[idx];
        let id = if self.list_output {
            format!("{}-{idx}", self.rid)
        } else {
            self.rid.clone()
        };
        let mut m = json!({
            "id": id,
            "finish_reason": finish.map(Self::generate_finish),
            "prompt_tokens": it.prompt.prompt_tokens,
            "weight_version": "default",
            "completion_tokens": it.tokens.len(),
            "cached_tokens": it.prompt.cached_tokens,
            "e2e_latency": self.t0.elapsed().as_secs_f64(),
        });
        if self.lp.return_logprob {
            let rows = it.prompt.input_logprobs.clone().unwrap_or_default();
            m["input_token_logprobs"] = Value::Array(
                rows.iter()
                    .map(|(lp, id, _)| self.lp_triple(*lp, *id))
                    .collect(),
            );
            m["output_token_logprobs"] = self.output_lp_rows(toks);
            if self.lp.top > 0 {
                m["input_top_logprobs"] = Value::Array(
                    rows.iter()
                        .map(|(lp, _, top)| {
                            if lp.is_none() {
                                Value::Null
                            } else {
                                Value::Array(
                                    top.iter()
                                        .map(|&(id, l)| self.lp_triple(Some(l), id))
                                        .collect(),
                                )
                            }
                        })
                        .collect(),
                );
                m["output_top_logprobs"] = self.output_top_rows(toks);
            }
        }
        m
    }

    fn generate_obj(
        &self,
        idx: usize,
        text: &str,
        toks: &[GenToken],
        finish: Option<&FinishKind>,
    ) -> Value {
        let mut o = json!({
            "text": text,
            "output_ids": toks.iter().map(|t| t.id).collect::<Vec<_>>(),
            "meta_info": self.generate_meta(idx, toks, finish),
        });
        if self.list_output {
            o["index"] = json!(idx);
        }
        o
    }

    fn chat_lp_entry(t: &GenToken) -> Value {
        let text = token_text(t.id);
        json!({"token":text,"logprob":t.logprob,"bytes":text.as_bytes(),
            "top_logprobs": t.top.iter().map(|&(id,lp)| {let s = token_text(id); json!({"token":s,"logprob":lp,"bytes":s.as_bytes()})}).collect::<Vec<_>>()})
    }

    fn chat_logprobs(&self, toks: &[GenToken]) -> Value {
        if !self.lp.return_logprob {
            return Value::Null;
        }
        json!({"content": toks.iter().map(Self::chat_lp_entry).collect::<Vec<_>>()})
    }

    fn completion_logprobs(&self, toks: &[GenToken], offset0: usize) -> Value {
        if !self.lp.return_logprob {
            return Value::Null;
        }
        let mut off = offset0;
        let mut offsets = Vec::new();
        for t in toks {
            offsets.push(off);
            off += token_text(t.id).len();
        }
        json!({
            "tokens": toks.iter().map(|t| token_text(t.id)).collect::<Vec<_>>(),
            "token_logprobs": toks.iter().map(|t| t.logprob).collect::<Vec<_>>(),
            "top_logprobs": if self.lp.top > 0 {
                json!(toks.iter().map(|t| t.top.iter().map(|&(id,lp)| (token_text(id), json!(lp))).collect::<Map<String,Value>>()).collect::<Vec<_>>())
            } else { Value::Null },
            "text_offset": offsets,
        })
    }

    fn openai_finish(f: Option<&FinishKind>) -> Value {
        match f {
            None => Value::Null,
            Some(FinishKind::Model(Finish::Stop(_))) => json!("stop"),
            Some(_) => json!("length"),
        }
    }

    fn stop_detail(&self, f: Option<&FinishKind>) -> (&'static str, Value) {
        match self.engine {
            EngineKind::Sglang | EngineKind::TokenSpeed => (
                "matched_stop",
                match f {
                    Some(FinishKind::Model(Finish::Stop(Matched::Token(t)))) => json!(t),
                    Some(FinishKind::Model(Finish::Stop(Matched::Text(s)))) => json!(s),
                    _ => Value::Null,
                },
            ),
            EngineKind::Vllm => (
                "stop_reason",
                match f {
                    Some(FinishKind::Model(Finish::Stop(Matched::Token(t))))
                        if !self.vocab.is_eos(*t) =>
                    {
                        json!(t)
                    }
                    Some(FinishKind::Model(Finish::Stop(Matched::Text(s)))) => json!(s),
                    _ => Value::Null,
                },
            ),
        }
    }

    fn token_frames(&mut self, idx: usize, finishing: bool) -> Vec<String> {
        let (delta, new_toks, offset0) = {
            let it = &self.items[idx];
            let delta = it.visible.get(it.sent_text..).unwrap_or("").to_string();
            (delta, it.tokens[it.sent_tokens..].to_vec(), it.sent_text)
        };
        let frames = match self.route {
            Route::Generate => {
                let it = &self.items[idx];
                let finish = if finishing { it.finish.clone() } else { None };
                let v = if self.incremental {
                    self.generate_obj(idx, &delta, &new_toks, finish.as_ref())
                } else {
                    let (text, toks) = (it.visible.clone(), it.tokens.clone());
                    self.generate_obj(idx, &text, &toks, finish.as_ref())
                };
                vec![sse(&v)]
            }
            Route::Chat => {
                if delta.is_empty() && new_toks.is_empty() {
                    Vec::new()
                } else {
                    let mut choice = json!({"index":idx,"delta":{"content":delta},"logprobs":self.chat_logprobs(&new_toks),"finish_reason":null});
                    if self.engine == EngineKind::Sglang {
                        choice["matched_stop"] = Value::Null;
                    }
                    vec![sse(&self.chunk(vec![choice]))]
                }
            }
            Route::Completions => {
                let mut choice = json!({"index":idx,"text":delta,"logprobs":self.completion_logprobs(&new_toks, offset0),"finish_reason":null});
                let (k, _) = self.stop_detail(None);
                choice[k] = Value::Null;
                vec![sse(&self.chunk(vec![choice]))]
            }
            Route::Messages => {
                if delta.is_empty() {
                    Vec::new()
                } else {
                    vec![sse_event(
                        "content_block_delta",
                        &json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":delta}}),
                    )]
                }
            }
            Route::Responses => {
                if delta.is_empty() {
                    Vec::new()
                } else {
                    let item_id = format!("msg_{}", self.rid);
                    vec![self.resp_event(
                        "response.output_text.delta",
                        json!({"item_id":item_id,"output_index":0,"content_index":0,"delta":delta}),
                    )]
                }
            }
            Route::Rerank => Vec::new(),
        };
        let it = &mut self.items[idx];
        it.sent_text = it.visible.len();
        it.sent_tokens = it.tokens.len();
        frames
    }

    fn finish_frames(&mut self, idx: usize) -> Vec<String> {
        let f = self.items[idx].finish.clone();
        match self.route {
            Route::Chat | Route::Completions => {
                let mut choice = if self.route == Route::Chat {
                    json!({"index":idx,"delta":{},"logprobs":null,"finish_reason":Self::openai_finish(f.as_ref())})
                } else {
                    json!({"index":idx,"text":"","logprobs":null,"finish_reason":Self::openai_finish(f.as_ref())})
                };
                let (k, v) = self.stop_detail(f.as_ref());
                choice[k] = v;
                vec![sse(&self.chunk(vec![choice]))]
            }
            Route::Messages => {
                let (reason, seq) = self.anthropic_stop(f.as_ref());
                vec![
                    sse_event(
                        "content_block_stop",
                        &json!({"type":"content_block_stop","index":0}),
                    ),
                    sse_event(
                        "message_delta",
                        &json!({"type":"message_delta","delta":{"stop_reason":reason,"stop_sequence":seq},"usage":{"output_tokens":self.items[0].tokens.len()}}),
                    ),
                    sse_event("message_stop", &json!({"type":"message_stop"})),
                ]
            }
            Route::Responses => {
                let item_id = format!("msg_{}", self.rid);
                let text = self.items[0].visible.clone();
                let part = json!({"type":"output_text","text":text,"annotations":[]});
                let status = if matches!(f, Some(FinishKind::Model(Finish::Length(_)))) {
                    "incomplete"
                } else {
                    "completed"
                };
                let mut v = vec![
                    self.resp_event(
                        "response.output_text.done",
                        json!({"item_id":item_id,"output_index":0,"content_index":0,"text":text}),
                    ),
                    self.resp_event(
                        "response.content_part.done",
                        json!({"item_id":item_id,"output_index":0,"content_index":0,"part":part}),
                    ),
                ];
                let item = json!({"id":item_id,"type":"message","status":"completed","role":"assistant","content":[part]});
                v.push(self.resp_event(
                    "response.output_item.done",
                    json!({"output_index":0,"item":item}),
                ));
                let r = self.response_object(status);
                v.push(self.resp_event("response.completed", json!({"response": r})));
                v
            }
            _ => Vec::new(),
        }
    }

    fn anthropic_stop(&self, f: Option<&FinishKind>) -> (Value, Value) {
        match f {
            Some(FinishKind::Model(Finish::Stop(Matched::Text(s)))) => {
                (json!("stop_sequence"), json!(s))
            }
            Some(FinishKind::Model(Finish::Stop(_))) => (json!("end_turn"), Value::Null),
            Some(_) => (json!("max_tokens"), Value::Null),
            None => (Value::Null, Value::Null),
        }
    }

    fn usage(&self) -> Value {
        let prompt: usize = self.prompt_tokens_total();
        let completion = self.completion_tokens() as usize;
        let cached: usize = self.items.first().map_or(0, |i| i.prompt.cached_tokens);
        let details = match self.engine {
            EngineKind::Vllm if self.prompt_tokens_details => json!({"cached_tokens": cached}),
            EngineKind::Vllm => Value::Null,
            EngineKind::Sglang | EngineKind::TokenSpeed if cached > 0 => {
                json!({"cached_tokens": cached})
            }
            EngineKind::Sglang | EngineKind::TokenSpeed => Value::Null,
        };
        json!({"prompt_tokens":prompt,"total_tokens":prompt+completion,"completion_tokens":completion,"prompt_tokens_details":details})
    }

    fn prompt_tokens_total(&self) -> usize {
        // n samples of one prompt count the prompt once.
        let sum: usize = self.items.iter().map(|i| i.prompt.prompt_tokens).sum();
        sum / self.n.max(1)
    }

    /// Frames that end a successful stream.
    pub fn epilogue(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            out.extend(self.prologue());
        }
        match self.route {
            Route::Chat | Route::Completions => {
                if self.include_usage {
                    let mut c = self.chunk(vec![]);
                    c["usage"] = self.usage();
                    out.push(sse(&c));
                }
                out.push(DONE.to_string());
            }
            Route::Generate => out.push(DONE.to_string()),
            Route::Rerank => {
                out.push(sse(&self.full_body()));
                out.push(DONE.to_string());
            }
            Route::Messages | Route::Responses => {}
        }
        out
    }

    /// Frames that end a failed stream (the 200 head was already sent).
    pub fn error_frames(&mut self, err: &ApiError) -> Vec<String> {
        let mut out = Vec::new();
        match (self.engine, self.route) {
            (EngineKind::Sglang | EngineKind::TokenSpeed, Route::Generate) if err.status >= 500 => {
                let idx = 0;
                let it = self.items.first().cloned().unwrap_or_default();
                let mut v = self.generate_obj(idx, &it.visible, &it.tokens, None);
                v["meta_info"]["finish_reason"] =
                    json!({"type":"abort","message":err.message,"status_code":err.status});
                out.push(sse(&v));
                out.push(DONE.to_string());
            }
            (EngineKind::Sglang | EngineKind::TokenSpeed, Route::Generate) => {
                out.push(sse(&json!({"error":{"message":err.message}})));
                out.push(DONE.to_string());
            }
            (_, Route::Messages) => {
                let t = if err.status < 500 {
                    "invalid_request_error"
                } else {
                    "api_error"
                };
                out.push(sse_event(
                    "error",
                    &json!({"type":"error","error":{"type":t,"message":err.message}}),
                ));
            }
            (_, Route::Responses) => {
                let mut r = self.response_object("failed");
                r["error"] = json!({"code":"server_error","message":err.message});
                out.push(self.resp_event("response.failed", json!({"response": r})));
            }
            _ => {
                out.push(sse(&json!({"error":{"message":err.message,"type":error_type(self.engine, err.status),"param":null,"code":err.status}})));
                out.push(DONE.to_string());
            }
        }
        out
    }

    fn response_object(&self, status: &str) -> Value {
        let it = self.items.first().cloned().unwrap_or_default();
        let output = if status == "in_progress" {
            json!([])
        } else {
            json!([{"type":"message","id":format!("msg_{}", self.rid),"status":"completed","role":"assistant",
                "content":[{"type":"output_text","text":it.visible,"annotations":[]}]}])
        };
        let incomplete = if status == "incomplete" {
            json!({"reason":"max_output_tokens"})
        } else {
            Value::Null
        };
        json!({"id":self.response_id(),"object":"response","created_at":self.created,"status":status,"model":self.model,
            "output":output,"incomplete_details":incomplete,"error":null,
            "usage":{"input_tokens":it.prompt.prompt_tokens,"output_tokens":it.tokens.len(),"total_tokens":it.prompt.prompt_tokens+it.tokens.len()}})
    }

    /// The complete (non-stream) body.
    pub fn full_body(&self) -> Value {
        match self.route {
            Route::Generate => {
                let objs: Vec<Value> = (0..self.items.len())
                    .map(|i| {
                        let it = &self.items[i];
                        self.generate_obj(i, &it.visible, &it.tokens, it.finish.as_ref())
                    })
                    .map(|mut v| {
                        if let Some(o) = v.as_object_mut() {
                            o.remove("index");
                        }
                        v
                    })
                    .collect();
                if self.list_output {
                    Value::Array(objs)
                } else {
                    objs.into_iter().next().unwrap_or(Value::Null)
                }
            }
            Route::Chat | Route::Completions => {
                let choices: Vec<Value> = self
                    .items
                    .iter()
                    .enumerate()
                    .map(|(i, it)| {
                        let mut c = if self.route == Route::Chat {
                            let mut msg = json!({"role":"assistant","content":it.visible});
                            match self.engine {
                                EngineKind::Sglang | EngineKind::TokenSpeed => {
                                    msg["reasoning_content"] = Value::Null;
                                    msg["tool_calls"] = Value::Null;
                                }
                                EngineKind::Vllm => {
                                    msg["tool_calls"] = json!([]);
                                    msg["reasoning_content"] = Value::Null;
                                }
                            }
                            json!({"index":i,"message":msg,"logprobs":self.chat_logprobs(&it.tokens),"finish_reason":Self::openai_finish(it.finish.as_ref())})
                        } else {
                            json!({"index":i,"text":it.visible,"logprobs":self.completion_logprobs(&it.tokens, 0),"finish_reason":Self::openai_finish(it.finish.as_ref())})
                        };
                        let (k, v) = self.stop_detail(it.finish.as_ref());
                        c[k] = v;
                        c
                    })
                    .collect();
                let object = if self.route == Route::Chat {
                    "chat.completion"
                } else {
                    "text_completion"
                };
                let mut body = json!({"id":self.response_id(),"object":object,"created":self.created,"model":self.model,"choices":choices,"usage":self.usage()});
                match self.engine {
                    EngineKind::Sglang | EngineKind::TokenSpeed => {
                        body["metadata"] = json!({"weight_version":"default"})
                    }
                    EngineKind::Vllm => {
                        body["prompt_logprobs"] = Value::Null;
                        body["kv_transfer_params"] =
                            self.kv_transfer_params.clone().unwrap_or(Value::Null);
                    }
                }
                body
            }
            Route::Messages => {
                let it = &self.items[0];
                let (reason, seq) = self.anthropic_stop(it.finish.as_ref());
                json!({"id":self.response_id(),"type":"message","role":"assistant","model":self.model,
                    "content":[{"type":"text","text":it.visible}],"stop_reason":reason,"stop_sequence":seq,
                    "usage":{"input_tokens":it.prompt.prompt_tokens,"output_tokens":it.tokens.len()}})
            }
            Route::Responses => {
                let status = if matches!(
                    self.items[0].finish,
                    Some(FinishKind::Model(Finish::Length(_)))
                ) {
                    "incomplete"
                } else {
                    "completed"
                };
                let mut r = self.response_object(status);
                if self.engine == EngineKind::Vllm {
                    r["kv_transfer_params"] =
                        self.kv_transfer_params.clone().unwrap_or(Value::Null);
                }
                r
            }
            Route::Rerank => {
                let scores = self.items[0].scores.clone().unwrap_or_default();
                let mut rows: Vec<Value> = scores
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let mut r = json!({"score":s,"index":i,"meta_info":{"id":format!("{}-{i}", self.rid),"prompt_tokens":self.items[0].prompt.prompt_tokens,"cached_tokens":self.items[0].prompt.cached_tokens}});
                        if self.return_documents {
                            r["document"] = json!(self.documents.get(i));
                        }
                        r
                    })
                    .collect();
                rows.sort_by(|a, b| {
                    let (x, y) = (
                        a["score"].as_f64().unwrap_or(0.0),
                        b["score"].as_f64().unwrap_or(0.0),
                    );
                    y.partial_cmp(&x).unwrap_or(std::cmp::Ordering::Equal)
                });
                if let Some(n) = self.top_n {
                    rows.truncate(n);
                }
                Value::Array(rows)
            }
        }
    }
}

fn error_type(engine: EngineKind, status: u16) -> &'static str {
    match (engine, status) {
        (EngineKind::Vllm, 400) => "BadRequestError",
        (EngineKind::Vllm, 404) => "NotFoundError",
        (EngineKind::Vllm, _) => "InternalServerError",
        (EngineKind::Sglang | EngineKind::TokenSpeed, 400) => "BadRequest",
        (EngineKind::Sglang | EngineKind::TokenSpeed, 404) => "NotFound",
        (EngineKind::Sglang | EngineKind::TokenSpeed, 503) => "ServiceUnavailable",
        (EngineKind::Sglang | EngineKind::TokenSpeed, _) => "InternalServerError",
    }
}

/// The complete error body an engine answers a non-stream request with.
pub fn error_body(engine: EngineKind, route: Option<Route>, err: &ApiError) -> Value {
    match (engine, route) {
        (_, Some(Route::Messages)) => {
            let t = if err.status < 500 {
                "invalid_request_error"
            } else {
                "api_error"
            };
            json!({"type":"error","error":{"type":t,"message":err.message}})
        }
        (EngineKind::Sglang | EngineKind::TokenSpeed, Some(Route::Generate))
        | (EngineKind::Sglang | EngineKind::TokenSpeed, None) => {
            json!({"error":{"message":err.message}})
        }
        (EngineKind::Sglang | EngineKind::TokenSpeed, _) => {
            json!({"object":"error","message":err.message,"type":error_type(engine, err.status),"param":null,"code":err.status})
        }
        (EngineKind::Vllm, _) => {
            json!({"error":{"message":err.message,"type":error_type(engine, err.status),"param":null,"code":err.status}})
        }
    }
}
