//! Property tests: whatever text the detokenizer hands over — quotes, backslashes, control
//! characters, any Unicode — every writer's stream is well-formed SSE whose events parse as
//! JSON and give back exactly the text, `[DONE]` (or the route's closing event) comes last, the
//! non-streaming body holds the same text, usage adds up, and request conversion never panics
//! on a body the gateway accepted.

use pdgate_convert::{
    convert_request, response_writer, ChoiceUsage, Delta, Finish, FinishReason, ResponseSpec,
    UsageTotals,
};
use pdgate_filters::body::scan_object;
use pdgate_filters::classify::classify;
use pdgate_filters::route::Route;
use proptest::prelude::*;
use serde_json::{Map, Value};

/// Text pieces biased towards what breaks hand-written JSON, plus arbitrary strings.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        "[\"\\\\\n\r\t\u{0}\u{1}\u{1f}\u{7f}\u{2028}é☃🎉 a/<>]{0,6}",
        any::<String>(),
    ]
}

/// Deltas over `choices` choices: (choice, text).
fn deltas(choices: u32) -> impl Strategy<Value = Vec<(u32, String)>> {
    prop::collection::vec((0..choices, piece()), 0..12)
}

const STREAMING_ROUTES: [Route; 5] = [
    Route::ChatCompletions,
    Route::Completions,
    Route::Generate,
    Route::Messages,
    Route::Responses,
];

fn run(route: Route, stream: bool, n: u32, deltas: &[(u32, String)]) -> Vec<u8> {
    let mut spec = ResponseSpec::new(route, stream, "id\"1".into(), "m\\x".into(), 7);
    spec.n = n;
    spec.include_usage = true;
    spec.list_output = route == Route::Generate && n > 1;
    let mut w = response_writer(spec).unwrap();
    let mut out = Vec::new();
    w.start(&mut out);
    for (index, text) in deltas {
        w.delta(
            &mut out,
            &Delta {
                index: *index,
                text,
                ..Delta::default()
            },
        );
    }
    for index in 0..n {
        w.finish(
            &mut out,
            &Finish {
                index,
                reason: FinishReason::Stop,
                matched: None,
                usage: ChoiceUsage {
                    prompt_tokens: 3,
                    completion_tokens: 1,
                    ..ChoiceUsage::default()
                },
                e2e_latency: None,
            },
        );
    }
    w.end(&mut out);
    out
}

/// Splits a stream into events, checking the framing: every event is an optional
/// `event: <name>` line then exactly one `data: ` line, events end with a blank line.
fn sse_events(bytes: &[u8]) -> Vec<(Option<String>, String)> {
    let text = std::str::from_utf8(bytes).expect("UTF-8 stream");
    assert!(text.ends_with("\n\n"), "unterminated stream: {text:?}");
    text[..text.len() - 2]
        .split("\n\n")
        .map(|block| {
            let mut lines = block.split('\n');
            let first = lines.next().unwrap();
            let (name, data) = match first.strip_prefix("event: ") {
                Some(name) => (Some(name.to_string()), lines.next().expect("a data line")),
                None => (None, first),
            };
            assert!(lines.next().is_none(), "extra line in {block:?}");
            let data = data
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data line: {data:?}"));
            assert!(!data.contains('\r'), "raw CR in {data:?}");
            (name, data.to_string())
        })
        .collect()
}

fn json(data: &str) -> Value {
    serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data:?}"))
}

/// The text per choice a client reads from a stream.
fn streamed_texts(route: Route, n: u32, events: &[(Option<String>, String)]) -> Vec<String> {
    let mut texts = vec![String::new(); n as usize];
    let last = events.last().expect("some event");
    match route {
        Route::ChatCompletions | Route::Completions | Route::Generate => {
            assert_eq!(last.1, "[DONE]");
            assert!(events[..events.len() - 1]
                .iter()
                .all(|(_, d)| d != "[DONE]"));
        }
        Route::Messages => assert_eq!(last.0.as_deref(), Some("message_stop")),
        _ => assert_eq!(last.0.as_deref(), Some("response.completed")),
    }
    for (name, data) in events {
        if data == "[DONE]" {
            continue;
        }
        let v = json(data);
        match route {
            Route::ChatCompletions | Route::Completions => {
                for c in v["choices"].as_array().unwrap() {
                    let i = c["index"].as_u64().unwrap() as usize;
                    let piece = if route == Route::Completions {
                        &c["text"]
                    } else {
                        &c["delta"]["content"]
                    };
                    texts[i].push_str(piece.as_str().unwrap_or(""));
                }
            }
            Route::Generate => {
                // Cumulative: every frame extends the item's text.
                let i = v.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                let text = v["text"].as_str().unwrap();
                assert!(
                    text.starts_with(texts[i].as_str()),
                    "{text:?} after {:?}",
                    texts[i]
                );
                texts[i] = text.to_string();
            }
            Route::Messages => {
                assert_eq!(v["type"].as_str(), name.as_deref());
                if name.as_deref() == Some("content_block_delta") {
                    texts[0].push_str(v["delta"]["text"].as_str().unwrap());
                }
            }
            _ => {
                assert_eq!(v["type"].as_str(), name.as_deref());
                match name.as_deref() {
                    Some("response.output_text.delta") => {
                        texts[0].push_str(v["delta"].as_str().unwrap())
                    }
                    Some("response.output_text.done") => {
                        assert_eq!(v["text"].as_str().unwrap(), texts[0])
                    }
                    _ => {}
                }
            }
        }
    }
    texts
}

/// The text per choice of a non-streaming body.
fn body_texts(route: Route, n: u32, body: &Value) -> Vec<String> {
    match route {
        Route::ChatCompletions | Route::Completions => body["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let t = if route == Route::Completions {
                    &c["text"]
                } else {
                    &c["message"]["content"]
                };
                t.as_str().unwrap().to_string()
            })
            .collect(),
        Route::Generate if n > 1 => body
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["text"].as_str().unwrap().to_string())
            .collect(),
        Route::Generate => vec![body["text"].as_str().unwrap().to_string()],
        Route::Messages => vec![body["content"][0]["text"].as_str().unwrap().to_string()],
        _ => vec![body["output"][0]["content"][0]["text"]
            .as_str()
            .unwrap()
            .to_string()],
    }
}

fn expected(n: u32, deltas: &[(u32, String)]) -> Vec<String> {
    let mut texts = vec![String::new(); n as usize];
    for (i, t) in deltas {
        texts[*i as usize].push_str(t);
    }
    texts
}

proptest! {
    #[test]
    fn single_choice_streams_and_bodies_give_back_the_text(deltas in deltas(1)) {
        for route in STREAMING_ROUTES {
            let want = expected(1, &deltas);
            let events = sse_events(&run(route, true, 1, &deltas));
            prop_assert_eq!(&streamed_texts(route, 1, &events), &want, "{:?}", route);
            let body = json(std::str::from_utf8(&run(route, false, 1, &deltas)).unwrap());
            prop_assert_eq!(&body_texts(route, 1, &body), &want, "{:?}", route);
        }
    }

    #[test]
    fn interleaved_choices_keep_their_own_text(deltas in deltas(3)) {
        for route in [Route::ChatCompletions, Route::Completions, Route::Generate] {
            let want = expected(3, &deltas);
            let events = sse_events(&run(route, true, 3, &deltas));
            prop_assert_eq!(&streamed_texts(route, 3, &events), &want, "{:?}", route);
            let body = json(std::str::from_utf8(&run(route, false, 3, &deltas)).unwrap());
            prop_assert_eq!(&body_texts(route, 3, &body), &want, "{:?}", route);
        }
    }

    #[test]
    fn usage_takes_each_prompt_once_and_sums_completions(
        n in 1u32..4,
        choices in prop::collection::vec((0u32..12, 0u32..1000, 0u32..1000, 0u32..1000, 0u32..50), 0..12),
    ) {
        let mut totals = UsageTotals::new(n);
        let mut seen = std::collections::BTreeSet::new();
        let mut prompt_max = std::collections::BTreeMap::<u32, (u32, u32)>::new();
        let (mut completion, mut reasoning) = (0u64, 0u64);
        for &(index, prompt, done, cached, think) in &choices {
            if !seen.insert(index) {
                continue;
            }
            totals.record(index, &ChoiceUsage {
                prompt_tokens: prompt,
                completion_tokens: done,
                cached_tokens: cached,
                reasoning_tokens: think,
            });
            let e = prompt_max.entry(index / n).or_default();
            e.0 = e.0.max(prompt);
            e.1 = e.1.max(cached);
            completion += u64::from(done);
            reasoning += u64::from(think);
        }
        let prompt: u64 = prompt_max.values().map(|p| u64::from(p.0)).sum();
        let cached: u64 = prompt_max.values().map(|p| u64::from(p.1)).sum();
        prop_assert_eq!(totals.prompt_tokens(), prompt);
        prop_assert_eq!(totals.cached_tokens(), cached);
        prop_assert_eq!(totals.completion_tokens(), completion);
        prop_assert_eq!(totals.reasoning_tokens(), reasoning);
        prop_assert_eq!(totals.total_tokens(), prompt + completion);
        let mut out = Vec::new();
        totals.write_openai(&mut out);
        let v: Value = serde_json::from_slice(&out).unwrap();
        prop_assert_eq!(v["prompt_tokens"].as_u64(), Some(prompt));
        prop_assert_eq!(v["completion_tokens"].as_u64(), Some(completion));
        prop_assert_eq!(v["total_tokens"].as_u64(), Some(prompt + completion));
        prop_assert_eq!(v["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0), cached);
    }

    #[test]
    fn conversion_never_panics_on_an_accepted_body(body in request_body(), route in 0usize..5) {
        let route = STREAMING_ROUTES[route];
        let bytes = serde_json::to_vec(&body).unwrap();
        let top = scan_object(&bytes).unwrap();
        if classify(route, &bytes, &top).is_ok() {
            match convert_request(route, &bytes, &top) {
                Ok(r) => prop_assert_eq!(r.route, route),
                Err(e) => prop_assert_eq!(e.status(), 400),
            }
        }
    }
}

/// Request-like bodies: the fields the conversion reads, with values of every kind.
fn request_body() -> impl Strategy<Value = Value> {
    const KEYS: &[&str] = &[
        "model",
        "messages",
        "prompt",
        "text",
        "input_ids",
        "input",
        "instructions",
        "system",
        "max_tokens",
        "max_completion_tokens",
        "max_output_tokens",
        "stop",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "n",
        "seed",
        "logprobs",
        "top_logprobs",
        "stream",
        "stream_options",
        "response_format",
        "regex",
        "ebnf",
        "json_schema",
        "tools",
        "tool_choice",
        "sampling_params",
        "rid",
        "echo",
        "suffix",
        "logit_bias",
        "text",
        "return_logprob",
        "chat_template_kwargs",
        "thinking",
        "best_of",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-3i64..40).prop_map(Value::from),
        (0.0f64..2.0).prop_map(Value::from),
        "[a-z\"\\\\ ]{0,5}".prop_map(Value::String),
        Just(serde_json::json!([{"role": "user", "content": "hi"}])),
        Just(serde_json::json!([{"role": "user", "content": [{"type": "text", "text": "a"}]}])),
        Just(serde_json::json!({"type": "json_object"})),
        Just(serde_json::json!({"include_usage": true})),
    ];
    let value = leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..4).prop_map(|kv| {
                Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            }),
        ]
    });
    prop::collection::vec((prop::sample::select(KEYS), value), 0..8).prop_map(|kv| {
        Value::Object(
            kv.into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect::<Map<_, _>>(),
        )
    })
}
