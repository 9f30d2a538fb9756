//! Route-aware extraction of what a client sees (text, tokens, logprobs, usage) from any engine
//! response — JSON or SSE, SGLang or vLLM shapes — so tests can assert "PD output == reference"
//! without caring about ids, timestamps or framing.

use serde_json::Value;

/// The comparable content of one response.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Output {
    /// Generated text per item / choice, in index order.
    pub texts: Vec<String>,
    /// Generated token ids per item (`/generate` only).
    pub token_ids: Option<Vec<Vec<u32>>>,
    pub completion_tokens: Option<u64>,
    pub prompt_tokens: Option<u64>,
    /// Normalized per item: `length` | `stop` | `abort`.
    pub finish_reasons: Vec<String>,
    /// `/generate` `meta_info.input_token_logprobs` logprob column of the first item.
    pub input_logprobs: Option<Vec<Option<f64>>>,
    /// Output token logprobs per item.
    pub output_logprobs: Option<Vec<Vec<f64>>>,
    /// Rerank `(document index, score)` sorted by index.
    pub scores: Option<Vec<(usize, f64)>>,
    /// An error message (error body, SSE error frame, abort frame).
    pub error: Option<String>,
}

impl Output {
    /// Text of the first item.
    pub fn text(&self) -> &str {
        self.texts.first().map_or("", String::as_str)
    }

    /// Returns the output with `prefill`'s prompt logprob rows prepended, as a gateway merges
    /// SGLang's prefill and decode `input_token_logprobs`.
    pub fn with_prefill_logprobs(mut self, prefill: &Output) -> Output {
        if let (Some(p), Some(d)) = (&prefill.input_logprobs, &self.input_logprobs) {
            let mut m = p.clone();
            m.extend(d.iter().cloned());
            self.input_logprobs = Some(m);
        }
        self
    }
}

/// One SSE event.
#[derive(Clone, Debug, PartialEq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

/// Splits an SSE body into events (blank-line separated; `data:` lines joined with `\n`).
pub fn parse_sse(body: &[u8]) -> Vec<SseEvent> {
    let text = String::from_utf8_lossy(body).replace("\r\n", "\n");
    text.split("\n\n")
        .filter_map(|block| {
            let mut event = None;
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(e) = line.strip_prefix("event:") {
                    event = Some(e.trim().to_string());
                } else if let Some(d) = line.strip_prefix("data:") {
                    data.push(d.strip_prefix(' ').unwrap_or(d).to_string());
                }
            }
            (event.is_some() || !data.is_empty()).then(|| SseEvent {
                event,
                data: data.join("\n"),
            })
        })
        .collect()
}

fn error_message(v: &Value) -> Option<String> {
    if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
        return Some(match e {
            Value::String(s) => s.clone(),
            other => other.get("message").map_or_else(
                || other.to_string(),
                |m| m.as_str().map_or_else(|| m.to_string(), str::to_string),
            ),
        });
    }
    if v.get("object").and_then(Value::as_str) == Some("error") {
        return v.get("message").and_then(Value::as_str).map(str::to_string);
    }
    None
}

fn finish_norm(v: &Value) -> Option<String> {
    let s = match v {
        Value::Object(o) => o.get("type").and_then(Value::as_str)?.to_string(),
        Value::String(s) => s.clone(),
        _ => return None,
    };
    Some(match s.as_str() {
        "max_tokens" | "incomplete" | "length" => "length".into(),
        "end_turn" | "stop_sequence" | "stop" | "completed" => "stop".into(),
        other => other.into(),
    })
}

#[derive(Default)]
struct Acc {
    text: String,
    ids: Vec<u32>,
    lps: Vec<f64>,
    finish: Option<String>,
}

fn set<T>(v: &mut Vec<T>, i: usize) -> &mut T
where
    T: Default,
{
    while v.len() <= i {
        v.push(T::default());
    }
    &mut v[i]
}

fn lp_column(v: Option<&Value>) -> Option<Vec<Option<f64>>> {
    v.and_then(Value::as_array).map(|rows| {
        rows.iter()
            .map(|r| r.get(0).and_then(Value::as_f64))
            .collect()
    })
}

fn out_lps(v: Option<&Value>) -> Vec<f64> {
    v.and_then(Value::as_array)
        .map(|rows| {
            rows.iter()
                .filter_map(|r| r.get(0).and_then(Value::as_f64))
                .collect()
        })
        .unwrap_or_default()
}

fn generate_obj(o: &Value, acc: &mut Acc, out: &mut Output, first: bool) {
    acc.text = o
        .get("text")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    acc.ids = o
        .get("output_ids")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_u64().map(|n| n as u32))
                .collect()
        })
        .unwrap_or_default();
    let m = o.get("meta_info").cloned().unwrap_or(Value::Null);
    acc.lps = out_lps(m.get("output_token_logprobs"));
    if let Some(f) = m.get("finish_reason").filter(|f| !f.is_null()) {
        acc.finish = finish_norm(f);
        if f.get("type").and_then(Value::as_str) == Some("abort") {
            out.error = f.get("message").and_then(Value::as_str).map(str::to_string);
        }
    }
    if first {
        if let Some(l) = lp_column(m.get("input_token_logprobs")) {
            out.input_logprobs = Some(l);
        }
        out.prompt_tokens = m
            .get("prompt_tokens")
            .and_then(Value::as_u64)
            .or(out.prompt_tokens);
    }
}

/// Extracts the comparable output of a response on `route` (a request path such as
/// `/v1/chat/completions`). `is_sse` selects the streaming parser. `/generate` streams are read
/// as SGLang's default cumulative frames; see [`extract_with`] for incremental ones.
pub fn extract(route: &str, is_sse: bool, body: &[u8]) -> Result<Output, String> {
    extract_with(route, is_sse, body, false)
}

/// [`extract`] with `/generate` frames treated as deltas when `incremental`.
pub fn extract_with(
    route: &str,
    is_sse: bool,
    body: &[u8],
    incremental: bool,
) -> Result<Output, String> {
    let mut out = Output::default();
    let mut accs: Vec<Acc> = Vec::new();
    let mut has_logprobs = false;
    let events: Vec<(Option<String>, Value)> = if is_sse {
        parse_sse(body)
            .into_iter()
            .filter(|e| e.data != "[DONE]")
            .map(|e| {
                serde_json::from_str(&e.data)
                    .map(|v| (e.event, v))
                    .map_err(|err| format!("bad SSE data {:?}: {err}", e.data))
            })
            .collect::<Result<_, _>>()?
    } else {
        vec![(
            None,
            serde_json::from_slice(body).map_err(|e| format!("bad JSON body: {e}"))?,
        )]
    };
    let mut total_completion: Option<u64> = None;
    for (event, v) in &events {
        if let Some(e) = error_message(v) {
            if v.get("type").and_then(Value::as_str) != Some("message") {
                out.error = Some(e);
                continue;
            }
        }
        match route {
            "/generate" => {
                let objs: Vec<&Value> = match v {
                    Value::Array(a) => a.iter().collect(),
                    o => vec![o],
                };
                for (k, o) in objs.into_iter().enumerate() {
                    let idx = o
                        .get("index")
                        .and_then(Value::as_u64)
                        .map_or(k, |i| i as usize);
                    let acc = set(&mut accs, idx);
                    if is_sse && incremental {
                        let mut delta = Acc::default();
                        generate_obj(o, &mut delta, &mut out, idx == 0);
                        acc.text.push_str(&delta.text);
                        acc.ids.extend(delta.ids);
                        acc.lps.extend(delta.lps);
                        acc.finish = delta.finish.or(acc.finish.take());
                    } else {
                        generate_obj(o, acc, &mut out, idx == 0);
                    }
                    has_logprobs |= o
                        .get("meta_info")
                        .and_then(|m| m.get("output_token_logprobs"))
                        .is_some();
                }
            }
            "/v1/chat/completions" | "/v1/completions" => {
                let chat = route == "/v1/chat/completions";
                for c in v
                    .get("choices")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let idx = c.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                    let acc = set(&mut accs, idx);
                    let piece = if chat {
                        c.get("message")
                            .or_else(|| c.get("delta"))
                            .and_then(|m| m.get("content"))
                            .and_then(Value::as_str)
                    } else {
                        c.get("text").and_then(Value::as_str)
                    };
                    acc.text.push_str(piece.unwrap_or(""));
                    if let Some(f) = c.get("finish_reason").filter(|f| !f.is_null()) {
                        acc.finish = finish_norm(f);
                    }
                    let lp = c.get("logprobs").filter(|l| !l.is_null());
                    if let Some(lp) = lp {
                        has_logprobs = true;
                        if chat {
                            acc.lps.extend(
                                lp.get("content")
                                    .and_then(Value::as_array)
                                    .into_iter()
                                    .flatten()
                                    .filter_map(|e| e.get("logprob").and_then(Value::as_f64)),
                            );
                        } else {
                            acc.lps.extend(
                                lp.get("token_logprobs")
                                    .and_then(Value::as_array)
                                    .into_iter()
                                    .flatten()
                                    .filter_map(Value::as_f64),
                            );
                        }
                    }
                }
                if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                    total_completion = u.get("completion_tokens").and_then(Value::as_u64);
                    out.prompt_tokens = u.get("prompt_tokens").and_then(Value::as_u64);
                }
            }
            "/v1/messages" => {
                let acc = set(&mut accs, 0);
                match event.as_deref().or(v.get("type").and_then(Value::as_str)) {
                    Some("message_start") => {
                        out.prompt_tokens = v
                            .pointer("/message/usage/input_tokens")
                            .and_then(Value::as_u64)
                    }
                    Some("content_block_delta") => acc.text.push_str(
                        v.pointer("/delta/text")
                            .and_then(Value::as_str)
                            .unwrap_or(""),
                    ),
                    Some("message_delta") => {
                        acc.finish = v.pointer("/delta/stop_reason").and_then(finish_norm_opt);
                        total_completion =
                            v.pointer("/usage/output_tokens").and_then(Value::as_u64);
                    }
                    Some("message") => {
                        acc.text = v
                            .get("content")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten()
                            .filter_map(|c| c.get("text").and_then(Value::as_str))
                            .collect();
                        acc.finish = v.get("stop_reason").and_then(finish_norm_opt);
                        total_completion =
                            v.pointer("/usage/output_tokens").and_then(Value::as_u64);
                        out.prompt_tokens =
                            v.pointer("/usage/input_tokens").and_then(Value::as_u64);
                    }
                    _ => {}
                }
            }
            "/v1/responses" => {
                let acc = set(&mut accs, 0);
                let kind = event
                    .as_deref()
                    .or(v.get("type").and_then(Value::as_str))
                    .map(str::to_string);
                let resp = match kind.as_deref() {
                    Some("response.output_text.delta") => {
                        acc.text
                            .push_str(v.get("delta").and_then(Value::as_str).unwrap_or(""));
                        None
                    }
                    Some("response.completed") => v.get("response"),
                    Some("response.failed") => {
                        out.error = v
                            .pointer("/response/error/message")
                            .and_then(Value::as_str)
                            .map(str::to_string);
                        None
                    }
                    None | Some("response") => Some(v),
                    _ => None,
                };
                if let Some(r) = resp {
                    if !is_sse {
                        acc.text = r
                            .get("output")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten()
                            .flat_map(|o| {
                                o.get("content")
                                    .and_then(Value::as_array)
                                    .cloned()
                                    .unwrap_or_default()
                            })
                            .filter_map(|c| {
                                c.get("text").and_then(Value::as_str).map(str::to_string)
                            })
                            .collect();
                    }
                    acc.finish = r.get("status").and_then(finish_norm_opt);
                    total_completion = r.pointer("/usage/output_tokens").and_then(Value::as_u64);
                    out.prompt_tokens = r.pointer("/usage/input_tokens").and_then(Value::as_u64);
                }
            }
            "/v1/rerank" | "/rerank" => {
                let mut s: Vec<(usize, f64)> = v
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|r| {
                        Some((
                            r.get("index")?.as_u64()? as usize,
                            r.get("score")?.as_f64()?,
                        ))
                    })
                    .collect();
                s.sort_by_key(|x| x.0);
                out.scores = Some(s);
            }
            other => return Err(format!("unknown route {other}")),
        }
    }
    if route == "/generate" {
        out.token_ids = Some(accs.iter().map(|a| a.ids.clone()).collect());
        total_completion = Some(accs.iter().map(|a| a.ids.len() as u64).sum());
    }
    out.texts = accs.iter().map(|a| a.text.clone()).collect();
    out.finish_reasons = accs
        .iter()
        .map(|a| a.finish.clone().unwrap_or_default())
        .collect();
    if has_logprobs {
        out.output_logprobs = Some(accs.iter().map(|a| a.lps.clone()).collect());
    }
    if total_completion.is_none() && route == "/v1/chat/completions" && has_logprobs {
        total_completion = Some(accs.iter().map(|a| a.lps.len() as u64).sum());
    }
    out.completion_tokens = total_completion;
    Ok(out)
}

fn finish_norm_opt(v: &Value) -> Option<String> {
    finish_norm(v)
}
