//! Differential tests: the writers against the mock SGLang engine's own HTTP responses
//! (`tests/mock-engine/src/render.rs`, faithful to SGLang's shapes).
//!
//! For each route, a real mock engine (a regular, non-PD worker) answers the same request
//! streamed and not streamed. The events of its stream — per-token text, ids, logprob rows,
//! the finish and the counts — are replayed into pdgate's writer, and the writer's stream and
//! body must equal the engine's, JSON value for JSON value and event for event. Only what is
//! not content is normalized: floats to `f32` precision (engines send `f32` over gRPC, the mock
//! renders `f64`), `e2e_latency` (a clock), and SGLang's `metadata.weight_version` (pdgate shows
//! the weight version as `system_fingerprint`, as SMG does). One documented difference is
//! asserted rather than normalized away: `/generate`'s final frame (see
//! `generate_stream_matches_the_engine`).

use mock_engine::client;
use mock_engine::output::parse_sse;
use mock_engine::{EngineKind, MockEngine, MockEngineConfig, Role};
use pdgate_convert::{
    response_writer, ChoiceUsage, Delta, Finish, FinishReason, LogprobOutput, MatchedStop,
    PromptTokenLogprob, ResponseSpec, TokenLogprob, TopLogprob,
};
use pdgate_filters::route::Route;
use serde_json::{json, Value};

const RID: &str = "diff-rid";

async fn engine() -> MockEngine {
    MockEngine::spawn(MockEngineConfig::test(
        EngineKind::Sglang,
        Role::Both,
        [127, 0, 0, 1],
    ))
    .await
    .expect("mock engine starts")
}

async fn post(engine: &MockEngine, path: &str, body: &Value) -> Vec<u8> {
    let resp = client::post_json(format!("{}{path}", engine.api_url()), body)
        .await
        .expect("mock answers");
    assert_eq!(resp.status, 200, "{path}: {}", resp.text());
    resp.body.to_vec()
}

/// An SSE stream as (event name, JSON data).
type Events = [(Option<String>, Value)];

/// One replayed event.
#[derive(Clone, Debug)]
enum Step {
    Delta {
        index: u32,
        text: String,
        ids: Vec<u32>,
        rows: Vec<TokenLogprob>,
    },
    Finish {
        index: u32,
        reason: &'static str,
        matched: Option<Value>,
        usage: ChoiceUsage,
    },
}

impl Step {
    /// A delta of text alone (routes without token ids or logprobs).
    fn text(index: u32, text: &Value) -> Step {
        Step::Delta {
            index,
            text: str_of(text),
            ids: vec![],
            rows: vec![],
        }
    }
}

/// What the engine's stream told: the events, and the facts known before the first token.
#[derive(Default, Debug)]
struct Script {
    steps: Vec<Step>,
    prompt_tokens: u32,
    prompt_rows: Vec<PromptTokenLogprob>,
}

fn replay(spec: ResponseSpec, script: &Script) -> Vec<u8> {
    let mut w = response_writer(spec).unwrap();
    let mut out = Vec::new();
    if !script.prompt_rows.is_empty() {
        w.prompt_logprobs(0, &script.prompt_rows);
    }
    w.start(&mut out);
    for step in &script.steps {
        match step {
            Step::Delta {
                index,
                text,
                ids,
                rows,
            } => w.delta(
                &mut out,
                &Delta {
                    index: *index,
                    text,
                    token_ids: ids,
                    logprobs: rows,
                    usage: None,
                },
            ),
            Step::Finish {
                index,
                reason,
                matched,
                usage,
            } => {
                let matched = match matched {
                    Some(Value::Number(n)) => {
                        Some(MatchedStop::TokenId(n.as_u64().unwrap() as u32))
                    }
                    Some(Value::String(s)) => Some(MatchedStop::Text(s)),
                    _ => None,
                };
                let reason = match *reason {
                    "stop" => FinishReason::Stop,
                    "length" => FinishReason::Length,
                    _ => FinishReason::Abort(None),
                };
                w.finish(
                    &mut out,
                    &Finish {
                        index: *index,
                        reason,
                        matched,
                        usage: *usage,
                        e2e_latency: Some(0.25),
                    },
                );
            }
        }
    }
    w.end(&mut out);
    out
}

/// Floats at `f32` precision, `e2e_latency` and SGLang's `metadata` removed.
fn normalize(v: &mut Value) {
    match v {
        Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().unwrap() as f32;
            *v = json!(x.to_string().parse::<f64>().unwrap());
        }
        Value::Array(a) => a.iter_mut().for_each(normalize),
        Value::Object(o) => {
            o.remove("e2e_latency");
            o.remove("metadata");
            o.values_mut().for_each(normalize);
        }
        _ => {}
    }
}

fn json_of(bytes: &[u8]) -> Value {
    let mut v: Value = serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(bytes)));
    normalize(&mut v);
    v
}

/// An SSE stream as (event name, JSON data or the `[DONE]` string).
fn events_of(bytes: &[u8]) -> Vec<(Option<String>, Value)> {
    parse_sse(bytes)
        .into_iter()
        .map(|e| {
            let data = if e.data == "[DONE]" {
                Value::String(e.data)
            } else {
                json_of(e.data.as_bytes())
            };
            (e.event, data)
        })
        .collect()
}

fn f32_of(v: &Value) -> f32 {
    v.as_f64().unwrap() as f32
}

fn str_of(v: &Value) -> String {
    v.as_str().unwrap().to_string()
}

/// `bytes` differs from the token's UTF-8 only for partial characters.
fn bytes_of(token: &str, v: &Value) -> Option<Vec<u8>> {
    let bytes: Vec<u8> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap() as u8)
        .collect();
    (bytes != token.as_bytes()).then_some(bytes)
}

fn openai_finish(choice: &Value, usage: ChoiceUsage) -> Option<Step> {
    let reason = choice.get("finish_reason").and_then(Value::as_str)?;
    Some(Step::Finish {
        index: choice["index"].as_u64().unwrap() as u32,
        reason: match reason {
            "stop" => "stop",
            "length" => "length",
            _ => "abort",
        },
        matched: choice.get("matched_stop").filter(|m| !m.is_null()).cloned(),
        usage,
    })
}

/// The per-choice counts of an OpenAI stream: the prompt from the usage chunk, each choice's
/// completion from its logprob rows (the engine runs with logprobs on).
fn per_choice_usage(events: &Events, index: u32) -> ChoiceUsage {
    let usage = events
        .iter()
        .find_map(|(_, v)| v.get("usage").filter(|u| !u.is_null()))
        .expect("a usage chunk");
    let rows: usize = events
        .iter()
        .flat_map(|(_, v)| {
            v.get("choices")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        })
        .filter(|c| c["index"] == json!(index))
        .map(|c| {
            let lp = &c["logprobs"];
            lp.get("content")
                .or_else(|| lp.get("tokens"))
                .and_then(Value::as_array)
                .map_or(0, Vec::len)
        })
        .sum();
    ChoiceUsage {
        prompt_tokens: usage["prompt_tokens"].as_u64().unwrap() as u32,
        completion_tokens: rows as u32,
        cached_tokens: usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0) as u32,
        reasoning_tokens: 0,
    }
}

/// The engine's prefix cache makes the second call of a pair report cached prompt tokens the
/// first did not: take the body's own count for the body's replay.
fn with_cached_from(script: &Script, body: &Value) -> Script {
    let cached = body
        .pointer("/usage/prompt_tokens_details/cached_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(0) as u32;
    let steps = script
        .steps
        .iter()
        .cloned()
        .map(|mut step| {
            if let Step::Finish { usage, .. } = &mut step {
                usage.cached_tokens = cached;
            }
            step
        })
        .collect();
    Script {
        steps,
        prompt_tokens: script.prompt_tokens,
        prompt_rows: script.prompt_rows.clone(),
    }
}

fn chat_script(events: &Events) -> Script {
    let mut script = Script::default();
    for (_, v) in events {
        for choice in v
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let index = choice["index"].as_u64().unwrap() as u32;
            let delta = &choice["delta"];
            if let Some(text) = delta.get("content").and_then(Value::as_str) {
                if delta.get("role").is_some() {
                    continue; // the role chunk
                }
                let rows = choice["logprobs"]["content"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|e| {
                        let token = str_of(&e["token"]);
                        TokenLogprob {
                            token_id: 0,
                            bytes: bytes_of(&token, &e["bytes"]),
                            logprob: f32_of(&e["logprob"]),
                            top: e["top_logprobs"]
                                .as_array()
                                .unwrap()
                                .iter()
                                .map(|t| {
                                    let tok = str_of(&t["token"]);
                                    TopLogprob {
                                        token_id: 0,
                                        bytes: bytes_of(&tok, &t["bytes"]),
                                        logprob: f32_of(&t["logprob"]),
                                        token: tok,
                                    }
                                })
                                .collect(),
                            token,
                        }
                    })
                    .collect();
                script.steps.push(Step::Delta {
                    index,
                    text: text.into(),
                    ids: vec![],
                    rows,
                });
            }
            if let Some(step) = openai_finish(choice, per_choice_usage(events, index)) {
                script.steps.push(step);
            }
        }
    }
    script
}

fn completions_script(events: &Events) -> Script {
    let mut script = Script::default();
    for (_, v) in events {
        for choice in v
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let index = choice["index"].as_u64().unwrap() as u32;
            if choice["finish_reason"].is_null() {
                let lp = &choice["logprobs"];
                let tokens = lp["tokens"].as_array().unwrap();
                let rows = tokens
                    .iter()
                    .enumerate()
                    .map(|(k, t)| TokenLogprob {
                        token_id: 0,
                        token: str_of(t),
                        bytes: None,
                        logprob: f32_of(&lp["token_logprobs"][k]),
                        top: lp["top_logprobs"][k]
                            .as_object()
                            .into_iter()
                            .flatten()
                            .map(|(tok, l)| TopLogprob {
                                token_id: 0,
                                token: tok.clone(),
                                bytes: None,
                                logprob: f32_of(l),
                            })
                            .collect(),
                    })
                    .collect();
                script.steps.push(Step::Delta {
                    index,
                    text: str_of(&choice["text"]),
                    ids: vec![],
                    rows,
                });
            }
            if let Some(step) = openai_finish(choice, per_choice_usage(events, index)) {
                script.steps.push(step);
            }
        }
    }
    script
}

fn triple_row(t: &Value) -> (Option<f32>, u32, String) {
    (
        t[0].as_f64().map(|x| x as f32),
        t[1].as_u64().unwrap() as u32,
        t[2].as_str().unwrap_or("").to_string(),
    )
}

fn top_rows(list: &Value) -> Vec<TopLogprob> {
    list.as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            let (lp, id, token) = triple_row(t);
            TopLogprob {
                token_id: id,
                token,
                bytes: None,
                logprob: lp.unwrap(),
            }
        })
        .collect()
}

/// `/generate`'s cumulative frames → deltas (the new text, ids and logprob rows of each).
fn generate_script(events: &Events) -> Script {
    let mut script = Script::default();
    let (mut text_len, mut ids_len) = (0usize, 0usize);
    for (_, v) in events {
        let Some(meta) = v.get("meta_info") else {
            continue;
        };
        if script.prompt_rows.is_empty() {
            script.prompt_tokens = meta["prompt_tokens"].as_u64().unwrap() as u32;
            let tops = meta["input_top_logprobs"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            script.prompt_rows = meta["input_token_logprobs"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
                .map(|(k, t)| {
                    let (logprob, token_id, token) = triple_row(t);
                    PromptTokenLogprob {
                        token_id,
                        token,
                        logprob,
                        top: tops.get(k).map(top_rows).unwrap_or_default(),
                    }
                })
                .collect();
        }
        let text = v["text"].as_str().unwrap();
        let ids: Vec<u32> = v["output_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as u32)
            .collect();
        let tops = meta["output_top_logprobs"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let rows = meta["output_token_logprobs"].as_array().unwrap()[ids_len..]
            .iter()
            .enumerate()
            .map(|(k, t)| {
                let (lp, token_id, token) = triple_row(t);
                TokenLogprob {
                    token_id,
                    token,
                    bytes: None,
                    logprob: lp.unwrap(),
                    top: tops.get(ids_len + k).map(top_rows).unwrap_or_default(),
                }
            })
            .collect();
        if text.len() > text_len || ids.len() > ids_len {
            script.steps.push(Step::Delta {
                index: 0,
                text: text[text_len..].into(),
                ids: ids[ids_len..].to_vec(),
                rows,
            });
        }
        text_len = text.len();
        ids_len = ids.len();
        let finish = &meta["finish_reason"];
        if !finish.is_null() {
            script.steps.push(Step::Finish {
                index: 0,
                reason: if finish["type"] == "length" {
                    "length"
                } else {
                    "stop"
                },
                matched: finish.get("matched").cloned(),
                usage: ChoiceUsage {
                    prompt_tokens: meta["prompt_tokens"].as_u64().unwrap() as u32,
                    completion_tokens: meta["completion_tokens"].as_u64().unwrap() as u32,
                    cached_tokens: meta["cached_tokens"].as_u64().unwrap() as u32,
                    reasoning_tokens: 0,
                },
            });
        }
    }
    script
}

fn messages_script(events: &Events) -> Script {
    let mut script = Script::default();
    for (name, v) in events {
        match name.as_deref() {
            Some("message_start") => {
                script.prompt_tokens =
                    v["message"]["usage"]["input_tokens"].as_u64().unwrap() as u32
            }
            Some("content_block_delta") => script.steps.push(Step::text(0, &v["delta"]["text"])),
            Some("message_delta") => {
                let (reason, matched) = match v["delta"]["stop_reason"].as_str().unwrap() {
                    "max_tokens" => ("length", None),
                    "stop_sequence" => ("stop", Some(v["delta"]["stop_sequence"].clone())),
                    _ => ("stop", None),
                };
                script.steps.push(Step::Finish {
                    index: 0,
                    reason,
                    matched,
                    usage: ChoiceUsage {
                        prompt_tokens: script.prompt_tokens,
                        completion_tokens: v["usage"]["output_tokens"].as_u64().unwrap() as u32,
                        ..ChoiceUsage::default()
                    },
                });
            }
            _ => {}
        }
    }
    script
}

fn responses_script(events: &Events) -> Script {
    let mut script = Script::default();
    for (name, v) in events {
        match name.as_deref() {
            Some("response.created") => {
                script.prompt_tokens =
                    v["response"]["usage"]["input_tokens"].as_u64().unwrap() as u32
            }
            Some("response.output_text.delta") => script.steps.push(Step::text(0, &v["delta"])),
            Some("response.completed") => script.steps.push(Step::Finish {
                index: 0,
                reason: if v["response"]["status"] == "incomplete" {
                    "length"
                } else {
                    "stop"
                },
                matched: None,
                usage: ChoiceUsage {
                    prompt_tokens: script.prompt_tokens,
                    completion_tokens: v["response"]["usage"]["output_tokens"].as_u64().unwrap()
                        as u32,
                    ..ChoiceUsage::default()
                },
            }),
            _ => {}
        }
    }
    script
}

/// The `created` of the first event (or the body) that has one.
fn created_of(values: &[&Value]) -> u64 {
    values
        .iter()
        .find_map(|v| {
            v.get("created")
                .or_else(|| v.get("created_at"))
                .or_else(|| v.get("response").and_then(|r| r.get("created_at")))
                .and_then(Value::as_u64)
        })
        .unwrap_or(0)
}

/// Runs `body` streamed (with `stream_extra` merged in) and not, replays the stream into
/// pdgate's writers, and returns (engine stream, pdgate stream, engine body, pdgate body).
async fn both_ways(
    engine: &MockEngine,
    route: Route,
    body: Value,
    stream_extra: Value,
    script_of: fn(&Events) -> Script,
    spec_of: impl Fn(bool, u64, &Script) -> ResponseSpec,
) -> [Value; 4] {
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    if let (Some(s), Value::Object(extra)) = (streamed.as_object_mut(), stream_extra) {
        s.extend(extra);
    }
    let engine_stream = events_of(&post(engine, route.upstream_path(), &streamed).await);
    let engine_body = json_of(&post(engine, route.upstream_path(), &body).await);
    let script = script_of(&engine_stream);
    assert!(
        script
            .steps
            .iter()
            .any(|s| matches!(s, Step::Finish { .. })),
        "{route:?}: no finish in {engine_stream:?}"
    );
    let stream_created = created_of(&engine_stream.iter().map(|(_, v)| v).collect::<Vec<_>>());
    let ours_stream = events_of(&replay(spec_of(true, stream_created, &script), &script));
    let ours_body = json_of(&replay(
        spec_of(false, created_of(&[&engine_body]), &script),
        &with_cached_from(&script, &engine_body),
    ));
    let as_list = |e: Vec<(Option<String>, Value)>| {
        Value::Array(
            e.into_iter()
                .map(|(name, v)| json!({"event": name, "data": v}))
                .collect(),
        )
    };
    [
        as_list(engine_stream),
        as_list(ours_stream),
        engine_body,
        ours_body,
    ]
}

fn spec(route: Route, stream: bool, created: u64, id: String) -> ResponseSpec {
    ResponseSpec::new(route, stream, id, "diff-model".into(), created)
}

fn with_usage() -> Value {
    json!({"stream_options": {"include_usage": true}})
}

#[tokio::test]
async fn chat_matches_the_engine_for_two_choices_with_logprobs() {
    let engine = engine().await;
    let body = json!({"model": "diff-model", "rid": RID, "n": 2, "max_tokens": 6,
        "logprobs": true, "top_logprobs": 2,
        "messages": [{"role": "user", "content": "Tell me about \"quotes\" and \\ slashes"}]});
    let [engine_stream, ours_stream, engine_body, ours_body] = both_ways(
        &engine,
        Route::ChatCompletions,
        body,
        with_usage(),
        chat_script,
        |stream, created, _| {
            let mut s = spec(Route::ChatCompletions, stream, created, RID.into());
            s.n = 2;
            s.include_usage = stream;
            s.logprobs = Some(LogprobOutput {
                top_logprobs: 2,
                token_text: false,
            });
            s
        },
    )
    .await;
    assert!(engine_stream.to_string().contains(r#""choices":[]"#));
    assert_eq!(ours_stream, engine_stream);
    assert_eq!(ours_body, engine_body);
}

#[tokio::test]
async fn chat_with_a_system_message_and_stop_strings_matches_the_engine() {
    let engine = engine().await;
    let body = json!({"model": "diff-model", "rid": RID, "max_tokens": 5, "logprobs": true,
        "stop": ["zz"], "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]});
    let [engine_stream, ours_stream, engine_body, ours_body] = both_ways(
        &engine,
        Route::ChatCompletions,
        body,
        with_usage(),
        chat_script,
        |stream, created, _| {
            let mut s = spec(Route::ChatCompletions, stream, created, RID.into());
            s.include_usage = stream;
            s.logprobs = Some(LogprobOutput::default());
            s
        },
    )
    .await;
    assert_eq!(ours_stream, engine_stream);
    assert_eq!(ours_body, engine_body);
}

#[tokio::test]
async fn completions_match_the_engine_with_logprobs() {
    let engine = engine().await;
    for top in [0, 3] {
        let body = json!({"model": "diff-model", "rid": RID, "prompt": "Once upon a time",
            "max_tokens": 7, "logprobs": top});
        let [engine_stream, ours_stream, engine_body, ours_body] = both_ways(
            &engine,
            Route::Completions,
            body,
            with_usage(),
            completions_script,
            |stream, created, _| {
                let mut s = spec(Route::Completions, stream, created, RID.into());
                s.include_usage = stream;
                s.logprobs = Some(LogprobOutput {
                    top_logprobs: top,
                    token_text: false,
                });
                s
            },
        )
        .await;
        assert_eq!(ours_stream, engine_stream, "logprobs {top}");
        assert_eq!(ours_body, engine_body, "logprobs {top}");
    }
}

/// `/generate` streams agree frame for frame, with one documented difference: the engine
/// renders the last token and the finish in one frame; pdgate gets the last tokens and the
/// finish as two gRPC messages and writes one frame for each (as SMG does), so its second-last
/// frame is the final frame without `finish_reason`.
#[tokio::test]
async fn generate_stream_matches_the_engine() {
    let engine = engine().await;
    let body = json!({"model": "diff-model", "rid": RID, "text": "The capital of France",
        "sampling_params": {"max_new_tokens": 6}, "return_logprob": true,
        "top_logprobs_num": 2, "return_text_in_logprobs": true});
    let [engine_stream, ours_stream, engine_body, ours_body] = both_ways(
        &engine,
        Route::Generate,
        body,
        json!({}),
        generate_script,
        |stream, _, script| {
            let mut s = spec(Route::Generate, stream, 0, RID.into());
            s.prompt_tokens = vec![script.prompt_tokens];
            s.logprobs = Some(LogprobOutput {
                top_logprobs: 2,
                token_text: true,
            });
            s
        },
    )
    .await;
    assert_eq!(ours_body, engine_body);
    let mut ours = ours_stream.as_array().unwrap().clone();
    let theirs = engine_stream.as_array().unwrap();
    assert_eq!(ours.len(), theirs.len() + 1, "{ours:?}");
    let last_frame = ours.len() - 2; // before [DONE]
    let before_final = ours.remove(last_frame - 1);
    let mut final_without_finish = ours[last_frame - 1].clone();
    final_without_finish["data"]["meta_info"]["finish_reason"] = Value::Null;
    assert_eq!(before_final, final_without_finish);
    assert_eq!(Value::Array(ours), engine_stream);
}

#[tokio::test]
async fn generate_batch_matches_the_engine() {
    let engine = engine().await;
    let body = json!({"model": "diff-model", "rid": RID, "text": ["one", "two words"],
        "sampling_params": {"max_new_tokens": 3}});
    let engine_body = json_of(&post(&engine, "/generate", &body).await);
    // Replay each item from the engine's own body.
    let mut s = spec(Route::Generate, false, 0, RID.into());
    s.list_output = true;
    let mut w = response_writer(s).unwrap();
    let mut out = Vec::new();
    for (i, item) in engine_body.as_array().unwrap().iter().enumerate() {
        let ids: Vec<u32> = serde_json::from_value(item["output_ids"].clone()).unwrap();
        let meta = &item["meta_info"];
        w.delta(
            &mut out,
            &Delta {
                index: i as u32,
                text: item["text"].as_str().unwrap(),
                token_ids: &ids,
                ..Delta::default()
            },
        );
        let matched = meta["finish_reason"].get("matched").cloned();
        w.finish(
            &mut out,
            &Finish {
                index: i as u32,
                reason: if meta["finish_reason"]["type"] == "length" {
                    FinishReason::Length
                } else {
                    FinishReason::Stop
                },
                matched: match &matched {
                    Some(Value::Number(n)) => {
                        Some(MatchedStop::TokenId(n.as_u64().unwrap() as u32))
                    }
                    Some(Value::String(t)) => Some(MatchedStop::Text(t)),
                    _ => None,
                },
                usage: ChoiceUsage {
                    prompt_tokens: meta["prompt_tokens"].as_u64().unwrap() as u32,
                    completion_tokens: meta["completion_tokens"].as_u64().unwrap() as u32,
                    ..ChoiceUsage::default()
                },
                e2e_latency: None,
            },
        );
    }
    w.end(&mut out);
    assert_eq!(json_of(&out), engine_body);
}

#[tokio::test]
async fn anthropic_messages_match_the_engine() {
    let engine = engine().await;
    let body = json!({"model": "diff-model", "rid": RID, "max_tokens": 8,
        "system": "be brief", "messages": [{"role": "user", "content": "Hello there"}]});
    let [engine_stream, ours_stream, engine_body, ours_body] = both_ways(
        &engine,
        Route::Messages,
        body,
        json!({}),
        messages_script,
        |stream, _, script| {
            let mut s = spec(Route::Messages, stream, 0, format!("msg_{RID}"));
            s.prompt_tokens = vec![script.prompt_tokens];
            s
        },
    )
    .await;
    assert_eq!(ours_stream, engine_stream);
    assert_eq!(ours_body, engine_body);
}

#[tokio::test]
async fn anthropic_stop_sequences_match_the_engine() {
    let engine = engine().await;
    // Find a word the engine will produce, then stop on it.
    let probe = json!({"model": "diff-model", "rid": RID, "max_tokens": 6,
        "messages": [{"role": "user", "content": "stop test"}]});
    let text = json_of(&post(&engine, "/v1/messages", &probe).await)["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    let word = text
        .split_whitespace()
        .nth(2)
        .expect("three words")
        .to_string();
    let mut body = probe;
    body["stop_sequences"] = json!([word]);
    let [engine_stream, ours_stream, engine_body, ours_body] = both_ways(
        &engine,
        Route::Messages,
        body,
        json!({}),
        messages_script,
        |stream, _, script| {
            let mut s = spec(Route::Messages, stream, 0, format!("msg_{RID}"));
            s.prompt_tokens = vec![script.prompt_tokens];
            s
        },
    )
    .await;
    assert_eq!(engine_body["stop_reason"], "stop_sequence");
    assert_eq!(ours_stream, engine_stream);
    assert_eq!(ours_body, engine_body);
}

#[tokio::test]
async fn responses_match_the_engine() {
    let engine = engine().await;
    for max in [3, 400] {
        let body = json!({"model": "diff-model", "rid": RID, "max_output_tokens": max,
            "instructions": "answer", "input": "What is 2+2?"});
        let [engine_stream, ours_stream, engine_body, ours_body] = both_ways(
            &engine,
            Route::Responses,
            body,
            json!({}),
            responses_script,
            |stream, created, script| {
                let mut s = spec(Route::Responses, stream, created, format!("resp_{RID}"));
                s.prompt_tokens = vec![script.prompt_tokens];
                s
            },
        )
        .await;
        // SGLang's server ends a capped response with `response.completed` (status
        // `incomplete`); the gateway sends OpenAI's `response.incomplete`, as SMG does.
        let capped = engine_body["status"] == "incomplete";
        let engine_stream = if capped {
            let text = engine_stream.to_string();
            assert!(text.contains(r#""response.completed""#), "{text}");
            let renamed = text.replace(r#""response.completed""#, r#""response.incomplete""#);
            serde_json::from_str(&renamed).unwrap()
        } else {
            engine_stream
        };
        assert_eq!(ours_stream, engine_stream, "max_output_tokens {max}");
        assert_eq!(ours_body, engine_body, "max_output_tokens {max}");
    }
}
