//! Exact bytes of every writer, per route × stream / non-stream, for small scripted choices.
//! The shapes are checked against the mock engines' renderer in `tests/differential.rs`.

use pdgate_filters::errors::ErrorCode;
use pdgate_filters::route::Route;

use super::*;
use crate::event::{ChoiceUsage, FinishReason, MatchedStop, TokenLogprob, TopLogprob};

const HEAD_CHUNK: &str =
    r#"{"id":"id-1","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":["#;
const HEAD_TEXT: &str =
    r#"{"id":"id-1","object":"text_completion","created":1700000000,"model":"m","choices":["#;

fn spec(route: Route, stream: bool) -> ResponseSpec {
    ResponseSpec::new(route, stream, "id-1".into(), "m".into(), 1_700_000_000)
}

fn usage(prompt: u32, completion: u32) -> ChoiceUsage {
    ChoiceUsage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        ..ChoiceUsage::default()
    }
}

/// One scripted event.
enum Ev {
    Text(u32, &'static str, &'static [u32]),
    Rows(u32, &'static str, Vec<TokenLogprob>),
    End(
        u32,
        FinishReason<'static>,
        Option<MatchedStop<'static>>,
        ChoiceUsage,
    ),
}

fn run(spec: ResponseSpec, events: Vec<Ev>) -> String {
    let mut w = response_writer(spec).unwrap();
    let mut out = Vec::new();
    w.start(&mut out);
    for ev in &events {
        match ev {
            Ev::Text(index, text, ids) => w.delta(
                &mut out,
                &Delta {
                    index: *index,
                    text,
                    token_ids: ids,
                    ..Delta::default()
                },
            ),
            Ev::Rows(index, text, rows) => w.delta(
                &mut out,
                &Delta {
                    index: *index,
                    text,
                    logprobs: rows,
                    token_ids: &[],
                    usage: None,
                },
            ),
            Ev::End(index, reason, matched, usage) => w.finish(
                &mut out,
                &Finish {
                    index: *index,
                    reason: *reason,
                    matched: *matched,
                    usage: *usage,
                    e2e_latency: None,
                },
            ),
        }
    }
    w.end(&mut out);
    String::from_utf8(out).unwrap()
}

fn sse(events: &[String]) -> String {
    events.iter().map(|e| format!("data: {e}\n\n")).collect()
}

fn row(token: &str, lp: f32, top: &[(&str, f32)]) -> TokenLogprob {
    TokenLogprob {
        token_id: 7,
        token: token.into(),
        bytes: None,
        logprob: lp,
        top: top
            .iter()
            .map(|&(t, l)| TopLogprob {
                token_id: 8,
                token: t.into(),
                bytes: None,
                logprob: l,
            })
            .collect(),
    }
}

#[test]
fn chat_stream_is_role_content_finish_usage_done() {
    let mut s = spec(Route::ChatCompletions, true);
    s.include_usage = true;
    let got = run(
        s,
        vec![
            Ev::Text(0, "Hel", &[1]),
            Ev::Text(0, "", &[2]),
            Ev::Text(0, "lo \"x\"\n", &[3]),
            Ev::End(
                0,
                FinishReason::Stop,
                Some(MatchedStop::TokenId(2)),
                usage(5, 3),
            ),
        ],
    );
    let choice = |c: &str| format!(r#"{HEAD_CHUNK}{c}],"usage":null}}"#);
    let want = sse(&[
        choice(
            r#"{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null,"matched_stop":null}"#,
        ),
        choice(
            r#"{"index":0,"delta":{"content":"Hel"},"logprobs":null,"finish_reason":null,"matched_stop":null}"#,
        ),
        choice(
            r#"{"index":0,"delta":{"content":"lo \"x\"\n"},"logprobs":null,"finish_reason":null,"matched_stop":null}"#,
        ),
        choice(r#"{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","matched_stop":2}"#),
        format!(
            r#"{HEAD_CHUNK}],"usage":{{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":null}}}}"#
        ),
        "[DONE]".into(),
    ]);
    assert_eq!(got, want);
}

#[test]
fn chat_stream_opens_each_choice_and_omits_usage_unless_asked() {
    let mut s = spec(Route::ChatCompletions, true);
    s.system_fingerprint = Some("v7".into());
    s.n = 2;
    let got = run(
        s,
        vec![
            Ev::Text(1, "b", &[]),
            Ev::Text(0, "a", &[]),
            Ev::End(1, FinishReason::Length, None, usage(4, 1)),
            Ev::End(
                0,
                FinishReason::Stop,
                Some(MatchedStop::Text("END")),
                usage(4, 1),
            ),
        ],
    );
    let head = r#"{"id":"id-1","object":"chat.completion.chunk","created":1700000000,"model":"m","system_fingerprint":"v7","choices":["#;
    let choice = |c: &str| format!(r#"{head}{c}],"usage":null}}"#);
    let want = sse(&[
        choice(
            r#"{"index":1,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null,"matched_stop":null}"#,
        ),
        choice(
            r#"{"index":1,"delta":{"content":"b"},"logprobs":null,"finish_reason":null,"matched_stop":null}"#,
        ),
        choice(
            r#"{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null,"matched_stop":null}"#,
        ),
        choice(
            r#"{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null,"matched_stop":null}"#,
        ),
        choice(
            r#"{"index":1,"delta":{},"logprobs":null,"finish_reason":"length","matched_stop":null}"#,
        ),
        choice(
            r#"{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","matched_stop":"END"}"#,
        ),
        "[DONE]".into(),
    ]);
    assert_eq!(got, want);
}

#[test]
fn chat_stream_logprob_rows() {
    let mut s = spec(Route::ChatCompletions, true);
    s.logprobs = Some(LogprobOutput {
        top_logprobs: 1,
        token_text: false,
    });
    let got = run(
        s,
        vec![
            Ev::Rows(0, "hé", vec![row("hé", -0.5, &[("hé", -0.5)])]),
            Ev::End(0, FinishReason::Length, None, usage(1, 1)),
        ],
    );
    let choice = |c: &str| format!(r#"{HEAD_CHUNK}{c}],"usage":null}}"#);
    let want = sse(&[
        choice(
            r#"{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null,"matched_stop":null}"#,
        ),
        choice(
            r#"{"index":0,"delta":{"content":"hé"},"logprobs":{"content":[{"token":"hé","logprob":-0.5,"bytes":[104,195,169],"top_logprobs":[{"token":"hé","logprob":-0.5,"bytes":[104,195,169]}]}]},"finish_reason":null,"matched_stop":null}"#,
        ),
        choice(
            r#"{"index":0,"delta":{},"logprobs":null,"finish_reason":"length","matched_stop":null}"#,
        ),
        "[DONE]".into(),
    ]);
    assert_eq!(got, want);
}

#[test]
fn chat_body_orders_choices_and_sums_usage() {
    let mut s = spec(Route::ChatCompletions, false);
    s.n = 2;
    let got = run(
        s,
        vec![
            Ev::Text(1, "B", &[]),
            Ev::Text(0, "A", &[]),
            Ev::Text(0, "\u{1}", &[]),
            Ev::End(
                0,
                FinishReason::Stop,
                Some(MatchedStop::TokenId(2)),
                usage(9, 2),
            ),
            Ev::End(1, FinishReason::Abort(None), None, usage(9, 1)),
        ],
    );
    let want = concat!(
        r#"{"id":"id-1","object":"chat.completion","created":1700000000,"model":"m","choices":["#,
        r#"{"index":0,"message":{"role":"assistant","content":"A\u0001","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":"stop","matched_stop":2},"#,
        r#"{"index":1,"message":{"role":"assistant","content":"B","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":"abort","matched_stop":null}],"#,
        r#""usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12,"prompt_tokens_details":null}}"#
    );
    assert_eq!(got, want);
}

#[test]
fn chat_body_with_logprobs() {
    let mut s = spec(Route::ChatCompletions, false);
    s.logprobs = Some(LogprobOutput::default());
    let got = run(
        s,
        vec![
            Ev::Rows(0, "a", vec![row("a", -1.0, &[])]),
            Ev::Rows(0, "b", vec![row("b", f32::NEG_INFINITY, &[])]),
            Ev::End(0, FinishReason::Length, None, usage(1, 2)),
        ],
    );
    assert!(got.contains(r#""logprobs":{"content":[{"token":"a","logprob":-1.0,"bytes":[97],"top_logprobs":[]},{"token":"b","logprob":-9999.0,"bytes":[98],"top_logprobs":[]}]}"#), "{got}");
}

#[test]
fn completions_stream_with_echo_suffix_and_logprobs() {
    let mut s = spec(Route::Completions, true);
    s.echo = vec!["P: ".into()];
    s.suffix = Some("!".into());
    s.include_usage = true;
    s.logprobs = Some(LogprobOutput {
        top_logprobs: 2,
        token_text: false,
    });
    let got = run(
        s,
        vec![
            Ev::Rows(
                0,
                "ab",
                vec![
                    row("a", -0.25, &[("a", -0.25), ("x", -2.0)]),
                    row("b", -0.5, &[("b", -0.5), ("b", -0.75)]),
                ],
            ),
            Ev::Rows(0, "c", vec![row("c", -1.5, &[])]),
            Ev::End(0, FinishReason::Stop, None, usage(2, 3)),
        ],
    );
    let choice = |c: &str| format!(r#"{HEAD_TEXT}{c}],"usage":null}}"#);
    let want = sse(&[
        choice(
            r#"{"index":0,"text":"P: ab","logprobs":{"tokens":["a","b"],"token_logprobs":[-0.25,-0.5],"top_logprobs":[{"a":-0.25,"x":-2.0},{"b":-0.5}],"text_offset":[3,4]},"finish_reason":null,"matched_stop":null}"#,
        ),
        choice(
            r#"{"index":0,"text":"c","logprobs":{"tokens":["c"],"token_logprobs":[-1.5],"top_logprobs":[{}],"text_offset":[5]},"finish_reason":null,"matched_stop":null}"#,
        ),
        choice(
            r#"{"index":0,"text":"!","logprobs":null,"finish_reason":null,"matched_stop":null}"#,
        ),
        choice(
            r#"{"index":0,"text":"","logprobs":null,"finish_reason":"stop","matched_stop":null}"#,
        ),
        format!(
            r#"{HEAD_TEXT}],"usage":{{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5,"prompt_tokens_details":null}}}}"#
        ),
        "[DONE]".into(),
    ]);
    assert_eq!(got, want);
}

#[test]
fn completions_stream_echoes_a_choice_that_generated_nothing() {
    let mut s = spec(Route::Completions, true);
    s.echo = vec!["only".into()];
    let got = run(s, vec![Ev::End(0, FinishReason::Length, None, usage(1, 0))]);
    let choice = |c: &str| format!(r#"{HEAD_TEXT}{c}],"usage":null}}"#);
    let want = sse(&[
        choice(
            r#"{"index":0,"text":"only","logprobs":null,"finish_reason":null,"matched_stop":null}"#,
        ),
        choice(
            r#"{"index":0,"text":"","logprobs":null,"finish_reason":"length","matched_stop":null}"#,
        ),
        "[DONE]".into(),
    ]);
    assert_eq!(got, want);
}

#[test]
fn completions_body_batch_indices_echo_and_usage() {
    // Two prompts × n=2: choices 0,1 share prompt 0 (5 tokens), 2,3 prompt 1 (3 tokens).
    let mut s = spec(Route::Completions, false);
    s.n = 2;
    s.echo = vec!["A".into(), "B".into()];
    s.suffix = Some(".".into());
    let got = run(
        s,
        vec![
            Ev::Text(crate::choice_index(1, 1, 2), "d", &[]),
            Ev::Text(crate::choice_index(0, 0, 2), "a", &[]),
            Ev::End(0, FinishReason::Stop, None, usage(5, 1)),
            Ev::End(1, FinishReason::Stop, None, usage(5, 1)),
            Ev::End(2, FinishReason::Length, None, usage(3, 1)),
            Ev::End(3, FinishReason::Length, None, usage(3, 1)),
        ],
    );
    let want = concat!(
        r#"{"id":"id-1","object":"text_completion","created":1700000000,"model":"m","choices":["#,
        r#"{"index":0,"text":"Aa.","logprobs":null,"finish_reason":"stop","matched_stop":null},"#,
        r#"{"index":1,"text":"A.","logprobs":null,"finish_reason":"stop","matched_stop":null},"#,
        r#"{"index":2,"text":"B.","logprobs":null,"finish_reason":"length","matched_stop":null},"#,
        r#"{"index":3,"text":"Bd.","logprobs":null,"finish_reason":"length","matched_stop":null}],"#,
        r#""usage":{"prompt_tokens":8,"completion_tokens":4,"total_tokens":12,"prompt_tokens_details":null}}"#
    );
    assert_eq!(got, want);
}

#[test]
fn completions_body_logprobs_offsets_count_characters_after_the_echo() {
    let mut s = spec(Route::Completions, false);
    s.echo = vec!["é".into()];
    s.logprobs = Some(LogprobOutput::default());
    let got = run(
        s,
        vec![
            Ev::Rows(0, "ü", vec![row("ü", -1.0, &[])]),
            Ev::Rows(0, "x", vec![row("x", -2.0, &[])]),
            Ev::End(0, FinishReason::Length, None, usage(1, 2)),
        ],
    );
    assert!(
        got.contains(r#""text":"éüx","logprobs":{"tokens":["ü","x"],"token_logprobs":[-1.0,-2.0],"top_logprobs":null,"text_offset":[1,2]}"#),
        "{got}"
    );
}

#[test]
fn generate_stream_is_cumulative_with_a_final_frame_and_done() {
    let mut s = spec(Route::Generate, true);
    s.prompt_tokens = vec![4];
    let got = run(
        s,
        vec![
            Ev::Text(0, "Hi", &[10]),
            Ev::Text(0, " there", &[11, 12]),
            Ev::End(
                0,
                FinishReason::Stop,
                Some(MatchedStop::TokenId(2)),
                usage(4, 3),
            ),
        ],
    );
    let want = sse(&[
        r#"{"text":"Hi","output_ids":[10],"meta_info":{"id":"id-1","finish_reason":null,"prompt_tokens":4,"weight_version":"default","completion_tokens":1,"cached_tokens":0}}"#.into(),
        r#"{"text":"Hi there","output_ids":[10,11,12],"meta_info":{"id":"id-1","finish_reason":null,"prompt_tokens":4,"weight_version":"default","completion_tokens":3,"cached_tokens":0}}"#.into(),
        r#"{"text":"Hi there","output_ids":[10,11,12],"meta_info":{"id":"id-1","finish_reason":{"type":"stop","matched":2},"prompt_tokens":4,"weight_version":"default","completion_tokens":3,"cached_tokens":0}}"#.into(),
        "[DONE]".into(),
    ]);
    assert_eq!(got, want);
}

#[test]
fn generate_batch_body_is_a_list_with_item_ids() {
    let mut s = spec(Route::Generate, false);
    s.list_output = true;
    s.system_fingerprint = Some("w2".into());
    let got = run(
        s,
        vec![
            Ev::Text(1, "y", &[21]),
            Ev::Text(0, "x", &[20]),
            Ev::End(1, FinishReason::Length, None, usage(2, 1)),
            Ev::End(
                0,
                FinishReason::Stop,
                Some(MatchedStop::Text("\n")),
                usage(3, 1),
            ),
        ],
    );
    let want = concat!(
        r#"[{"text":"x","output_ids":[20],"meta_info":{"id":"id-1-0","finish_reason":{"type":"stop","matched":"\n"},"prompt_tokens":3,"weight_version":"w2","completion_tokens":1,"cached_tokens":0}},"#,
        r#"{"text":"y","output_ids":[21],"meta_info":{"id":"id-1-1","finish_reason":{"type":"length","length":1},"prompt_tokens":2,"weight_version":"w2","completion_tokens":1,"cached_tokens":0}}]"#
    );
    assert_eq!(got, want);
}

#[test]
fn generate_list_stream_frames_carry_the_index_and_client_ids() {
    let mut s = spec(Route::Generate, true);
    s.list_output = true;
    s.item_ids = vec!["a".into(), "b".into()];
    let got = run(
        s,
        vec![
            Ev::Text(1, "y", &[21]),
            Ev::End(1, FinishReason::Abort(Some("gone")), None, usage(2, 1)),
        ],
    );
    let want = sse(&[
        r#"{"text":"y","output_ids":[21],"meta_info":{"id":"b","finish_reason":null,"prompt_tokens":0,"weight_version":"default","completion_tokens":1,"cached_tokens":0},"index":1}"#.into(),
        r#"{"text":"y","output_ids":[21],"meta_info":{"id":"b","finish_reason":{"type":"abort","message":"gone"},"prompt_tokens":2,"weight_version":"default","completion_tokens":1,"cached_tokens":0},"index":1}"#.into(),
        "[DONE]".into(),
    ]);
    assert_eq!(got, want);
}

#[test]
fn generate_logprob_triples_prompt_rows_and_latency() {
    let mut s = spec(Route::Generate, false);
    s.logprobs = Some(LogprobOutput {
        top_logprobs: 1,
        token_text: true,
    });
    let mut w = response_writer(s).unwrap();
    w.prompt_logprobs(
        0,
        &[
            PromptTokenLogprob {
                token_id: 1,
                token: "<s>".into(),
                logprob: None,
                top: vec![],
            },
            PromptTokenLogprob {
                token_id: 5,
                token: "q".into(),
                logprob: Some(-3.0),
                top: vec![TopLogprob {
                    token_id: 5,
                    token: "q".into(),
                    bytes: None,
                    logprob: -3.0,
                }],
            },
        ],
    );
    let mut out = Vec::new();
    let rows = [row("a", -0.5, &[("a", -0.5)])];
    w.delta(
        &mut out,
        &Delta {
            index: 0,
            text: "a",
            token_ids: &[7],
            logprobs: &rows,
            usage: None,
        },
    );
    w.finish(
        &mut out,
        &Finish {
            index: 0,
            reason: FinishReason::Length,
            matched: None,
            usage: usage(2, 1),
            e2e_latency: Some(0.5),
        },
    );
    w.end(&mut out);
    let want = concat!(
        r#"{"text":"a","output_ids":[7],"meta_info":{"id":"id-1","finish_reason":{"type":"length","length":1},"prompt_tokens":2,"weight_version":"default","completion_tokens":1,"cached_tokens":0,"e2e_latency":0.5,"#,
        r#""input_token_logprobs":[[null,1,"<s>"],[-3.0,5,"q"]],"output_token_logprobs":[[-0.5,7,"a"]],"#,
        r#""input_top_logprobs":[null,[[-3.0,5,"q"]]],"output_top_logprobs":[[[-0.5,8,"a"]]]}}"#
    );
    assert_eq!(String::from_utf8(out).unwrap(), want);
}

#[test]
fn messages_stream_events() {
    let mut s = spec(Route::Messages, true);
    s.prompt_tokens = vec![12];
    let got = run(
        s,
        vec![
            Ev::Text(0, "Hi", &[]),
            Ev::Text(0, "", &[]),
            Ev::Text(0, "!", &[]),
            Ev::End(
                0,
                FinishReason::Stop,
                Some(MatchedStop::Text("##")),
                usage(12, 3),
            ),
        ],
    );
    let want = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"id-1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":12,\"output_tokens\":0}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"!\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"stop_sequence\",\"stop_sequence\":\"##\"},\"usage\":{\"output_tokens\":3}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    assert_eq!(got, want);
}

#[test]
fn messages_body_and_stop_reasons() {
    let body = |reason, matched| {
        run(
            spec(Route::Messages, false),
            vec![
                Ev::Text(0, "ok", &[]),
                Ev::End(0, reason, matched, usage(7, 2)),
            ],
        )
    };
    assert_eq!(
        body(FinishReason::Stop, Some(MatchedStop::TokenId(2))),
        r#"{"id":"id-1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":7,"output_tokens":2}}"#
    );
    assert!(body(FinishReason::Length, None)
        .contains(r#""stop_reason":"max_tokens","stop_sequence":null"#));
    assert!(body(FinishReason::Stop, Some(MatchedStop::Text("Q:")))
        .contains(r#""stop_reason":"stop_sequence","stop_sequence":"Q:""#));
    assert!(body(FinishReason::Abort(None), None).contains(r#""stop_reason":"end_turn""#));
}

#[test]
fn responses_stream_events_and_sequence_numbers() {
    let mut s = spec(Route::Responses, true);
    s.id = "resp_9".into();
    s.prompt_tokens = vec![3];
    let got = run(
        s,
        vec![
            Ev::Text(0, "Yo", &[]),
            Ev::End(0, FinishReason::Length, None, usage(3, 1)),
        ],
    );
    let obj = |status: &str, output: &str, incomplete: &str, out_tokens: u32| {
        format!(
            r#"{{"id":"resp_9","object":"response","created_at":1700000000,"status":"{status}","model":"m","output":[{output}],"incomplete_details":{incomplete},"error":null,"usage":{{"input_tokens":3,"output_tokens":{out_tokens},"total_tokens":{}}}}}"#,
            3 + out_tokens
        )
    };
    let item = r#"{"id":"msg_9","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Yo","annotations":[]}]}"#;
    let ev = |name: &str, seq: u32, rest: &str| {
        format!("event: {name}\ndata: {{\"type\":\"{name}\",\"sequence_number\":{seq}{rest}}}\n\n")
    };
    let loc = r#","item_id":"msg_9","output_index":0,"content_index":0"#;
    let want = [
        ev("response.created", 0, &format!(r#","response":{}"#, obj("in_progress", "", "null", 0))),
        ev("response.in_progress", 1, &format!(r#","response":{}"#, obj("in_progress", "", "null", 0))),
        ev("response.output_item.added", 2, r#","output_index":0,"item":{"id":"msg_9","type":"message","status":"in_progress","role":"assistant","content":[]}"#),
        ev("response.content_part.added", 3, &format!(r#"{loc},"part":{{"type":"output_text","text":"","annotations":[]}}"#)),
        ev("response.output_text.delta", 4, &format!(r#"{loc},"delta":"Yo""#)),
        ev("response.output_text.done", 5, &format!(r#"{loc},"text":"Yo""#)),
        ev("response.content_part.done", 6, &format!(r#"{loc},"part":{{"type":"output_text","text":"Yo","annotations":[]}}"#)),
        ev("response.output_item.done", 7, &format!(r#","output_index":0,"item":{item}"#)),
        ev("response.incomplete", 8, &format!(r#","response":{}"#, obj("incomplete", item, r#"{"reason":"max_output_tokens"}"#, 1))),
    ]
    .concat();
    assert_eq!(got, want);
}

#[test]
fn a_responses_stream_that_stopped_ends_with_response_completed() {
    let mut s = spec(Route::Responses, true);
    s.prompt_tokens = vec![3];
    let events = |reason| {
        run(
            s.clone(),
            vec![
                Ev::Text(0, "Yo", &[]),
                Ev::End(0, reason, None, usage(3, 1)),
            ],
        )
    };
    let stopped = events(FinishReason::Stop);
    let last = stopped.rsplit("event: ").next().unwrap();
    assert!(last.starts_with("response.completed\n"), "{stopped}");
    assert!(last.contains(r#""status":"completed""#), "{stopped}");
    let capped = events(FinishReason::Length);
    let last = capped.rsplit("event: ").next().unwrap();
    assert!(last.starts_with("response.incomplete\n"), "{capped}");
    assert!(!capped.contains("response.completed"), "{capped}");
}

#[test]
fn responses_body() {
    let got = run(
        spec(Route::Responses, false),
        vec![
            Ev::Text(0, "a\"b", &[]),
            Ev::End(0, FinishReason::Stop, None, usage(2, 2)),
        ],
    );
    assert_eq!(
        got,
        r#"{"id":"id-1","object":"response","created_at":1700000000,"status":"completed","model":"m","output":[{"id":"msg_id-1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"a\"b","annotations":[]}]}],"incomplete_details":null,"error":null,"usage":{"input_tokens":2,"output_tokens":2,"total_tokens":4}}"#
    );
}

fn failed(route: Route, stream: bool) -> String {
    let mut w = response_writer(spec(route, stream)).unwrap();
    let mut out = Vec::new();
    w.delta(
        &mut out,
        &Delta {
            text: "partial",
            ..Delta::default()
        },
    );
    out.clear();
    w.fail(
        &mut out,
        &StreamFailure::new(ErrorCode::InternalError, "decode \"leg\" failed"),
    );
    // Nothing after a failure.
    w.delta(
        &mut out,
        &Delta {
            text: "late",
            ..Delta::default()
        },
    );
    w.end(&mut out);
    String::from_utf8(out).unwrap()
}

#[test]
fn openai_style_streams_fail_with_the_catalogue_body_then_done() {
    let body = r#"{"error":{"type":"server_error","code":"internal_error","message":"decode \"leg\" failed","param":null}}"#;
    for route in [Route::ChatCompletions, Route::Completions, Route::Generate] {
        assert_eq!(
            failed(route, true),
            format!("data: {body}\n\ndata: [DONE]\n\n"),
            "{route:?}"
        );
        assert_eq!(failed(route, false), body, "{route:?}");
    }
}

#[test]
fn anthropic_and_responses_streams_fail_with_their_own_events() {
    assert_eq!(
        failed(Route::Messages, true),
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"decode \\\"leg\\\" failed\"}}\n\n"
    );
    let got = failed(Route::Responses, true);
    assert!(
        got.starts_with("event: response.failed\ndata: {\"type\":\"response.failed\""),
        "{got}"
    );
    assert!(got.contains(r#""status":"failed""#), "{got}");
    assert!(
        got.contains(r#""error":{"code":"internal_error","message":"decode \"leg\" failed"}"#),
        "{got}"
    );
}

#[test]
fn events_after_a_choice_finished_are_ignored() {
    let got = run(
        spec(Route::ChatCompletions, false),
        vec![
            Ev::Text(0, "a", &[]),
            Ev::End(0, FinishReason::Stop, None, usage(1, 1)),
            Ev::Text(0, "b", &[]),
            Ev::End(0, FinishReason::Length, None, usage(1, 5)),
        ],
    );
    assert!(got.contains(r#""content":"a","#), "{got}");
    assert!(got.contains(r#""completion_tokens":1,"#), "{got}");
}

#[test]
fn writers_exist_for_generation_routes_only() {
    for route in Route::ALL {
        let generates = !matches!(route, Route::Rerank | Route::CountTokens);
        assert_eq!(response_writer(spec(route, false)).is_some(), generates);
    }
    assert_eq!(content_type(true), "text/event-stream");
    assert_eq!(content_type(false), "application/json");
}

#[test]
fn spec_for_request_takes_the_output_options_from_the_request() {
    use crate::request::{convert_request, LogprobRequest};
    let body = br#"{"text":["a","b"],"rid":["x","y"],"stream":true,"return_logprob":true,"top_logprobs_num":3,"return_text_in_logprobs":true,"sampling_params":{"n":2}}"#;
    let top = pdgate_filters::body::scan_object(body).unwrap();
    let request = convert_request(Route::Generate, body, &top).unwrap();
    assert_eq!(
        request.logprobs,
        Some(LogprobRequest {
            top_logprobs: 3,
            token_text: true,
            start_len: None,
        })
    );
    let s = ResponseSpec::for_request(&request, "rid".into(), 5);
    assert!(s.stream && s.list_output);
    assert_eq!(s.n, 2);
    assert_eq!(s.item_ids, vec!["x".to_string(), "y".into()]);
    assert_eq!(
        s.logprobs,
        Some(LogprobOutput {
            top_logprobs: 3,
            token_text: true,
        })
    );
    assert_eq!(s.model, "");

    let body = br#"{"model":"m","prompt":"p","echo":true,"suffix":"s","stream":true,"stream_options":{"include_usage":true}}"#;
    let top = pdgate_filters::body::scan_object(body).unwrap();
    let request = convert_request(Route::Completions, body, &top).unwrap();
    let s = ResponseSpec::for_request(&request, "cmpl-1".into(), 5);
    assert!(s.include_usage && !s.list_output);
    assert_eq!((s.model.as_str(), s.suffix.as_deref()), ("m", Some("s")));
    // Echo texts are the gateway's to fill (it knows token prompts' text).
    assert!(s.echo.is_empty());
}

#[test]
fn writers_are_send() {
    fn send<T: Send>(_: &T) {}
    send(&response_writer(spec(Route::ChatCompletions, true)).unwrap());
}
