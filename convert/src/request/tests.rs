//! Every field mapping of the module doc's table and every refusal, per route.

use pdgate_filters::body::scan_object;
use pdgate_filters::classify::classify;
use pdgate_filters::errors::ErrorCode;
use pdgate_filters::route::Route;
use serde_json::{json, Value};

use super::*;

/// Converts `body` after the gateway's own checks (`classify`), as the gateway will.
fn convert(route: Route, body: &Value) -> Result<GenerationRequest, RequestError> {
    let bytes = serde_json::to_vec(body).unwrap();
    let top = scan_object(&bytes).unwrap();
    classify(route, &bytes, &top).unwrap_or_else(|e| panic!("classify refused {body}: {e}"));
    convert_request(route, &bytes, &top)
}

fn ok(route: Route, body: Value) -> GenerationRequest {
    convert(route, &body).unwrap_or_else(|e| panic!("{body}: {e}"))
}

fn refused(route: Route, body: Value) -> RequestError {
    match convert(route, &body) {
        Ok(r) => panic!("{body} was accepted: {r:?}"),
        Err(e) => e,
    }
}

fn unsupported(route: Route, body: Value) -> (Feature, String) {
    match refused(route, body) {
        RequestError::Unsupported(u) => (u.feature, u.field),
        other => panic!("not an unsupported feature: {other}"),
    }
}

fn chat_body(extra: Value) -> Value {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    merge(&mut body, extra);
    body
}

fn merge(body: &mut Value, extra: Value) {
    if let (Some(b), Value::Object(e)) = (body.as_object_mut(), extra) {
        b.extend(e);
    }
}

fn chat_input(r: &GenerationRequest) -> &ChatInput {
    match &r.input {
        Input::Chat(c) => c,
        other => panic!("not a chat: {other:?}"),
    }
}

fn prompts(r: &GenerationRequest) -> (&[Prompt], bool) {
    match &r.input {
        Input::Prompts { prompts, batch } => (prompts, *batch),
        other => panic!("not prompts: {other:?}"),
    }
}

// ---------------------------------------------------------------- chat

#[test]
fn chat_minimal_has_neutral_defaults() {
    let r = ok(Route::ChatCompletions, chat_body(json!({})));
    assert_eq!(r.route, Route::ChatCompletions);
    assert_eq!(r.model.as_deref(), Some("m"));
    assert_eq!(r.sampling, SamplingParams::default());
    assert_eq!(r.logprobs, None);
    assert!(!r.stream && !r.include_usage && !r.echo);
    let c = chat_input(&r);
    assert_eq!(c.messages, vec![json!({"role": "user", "content": "hi"})]);
    assert!(c.add_generation_prompt && !c.continue_final_message);
    assert_eq!((&c.tools, &c.tool_choice, c.thinking), (&None, &None, None));
}

#[test]
fn chat_maps_every_sampling_field() {
    let r = ok(
        Route::ChatCompletions,
        chat_body(json!({
            "temperature": 0.5, "top_p": 0.9, "top_k": -1, "min_p": 0.05,
            "frequency_penalty": 0.1, "presence_penalty": -0.2, "repetition_penalty": 1.1,
            "max_tokens": 5, "max_completion_tokens": 7, "min_tokens": 2,
            "stop": ["a", "bc"], "stop_token_ids": [3, 4], "ignore_eos": true, "n": 3,
            "seed": 42, "skip_special_tokens": false, "spaces_between_special_tokens": false,
            "no_stop_trim": true, "logit_bias": {"17": 5.5},
            "regex": "[0-9]+", "rid": "client-1",
        })),
    );
    assert_eq!(
        r.sampling,
        SamplingParams {
            temperature: Some(0.5),
            top_p: Some(0.9),
            top_k: Some(-1),
            min_p: Some(0.05),
            frequency_penalty: Some(0.1),
            presence_penalty: Some(-0.2),
            repetition_penalty: Some(1.1),
            max_new_tokens: Some(7),
            min_new_tokens: 2,
            stop: vec!["a".into(), "bc".into()],
            stop_token_ids: vec![3, 4],
            ignore_eos: true,
            n: 3,
            seed: Some(42),
            skip_special_tokens: false,
            spaces_between_special_tokens: false,
            no_stop_trim: true,
            constraint: Some(Constraint::Regex("[0-9]+".into())),
            logit_bias: vec![(17, 5.5)],
        }
    );
    assert_eq!(r.request_id.as_deref(), Some("client-1"));
}

#[test]
fn chat_cap_falls_back_to_max_tokens_and_saturates() {
    let cap = |extra| {
        ok(Route::ChatCompletions, chat_body(extra))
            .sampling
            .max_new_tokens
    };
    assert_eq!(cap(json!({"max_tokens": 9})), Some(9));
    assert_eq!(
        cap(json!({"max_completion_tokens": null, "max_tokens": 9})),
        Some(9)
    );
    assert_eq!(cap(json!({})), None);
    let body = br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":123456789012345678901234567890}"#;
    let top = scan_object(body).unwrap();
    let r = convert_request(Route::ChatCompletions, body, &top).unwrap();
    assert_eq!(r.sampling.max_new_tokens, Some(u32::MAX));
}

#[test]
fn chat_vllm_spellings() {
    let r = ok(
        Route::ChatCompletions,
        chat_body(
            json!({"min_completion_tokens": 3, "include_stop_str_in_output": true,
            "request_id": "v-1", "sampling_seed": 7}),
        ),
    );
    assert_eq!(r.sampling.min_new_tokens, 3);
    assert!(r.sampling.no_stop_trim);
    assert_eq!(r.request_id.as_deref(), Some("v-1"));
    assert_eq!(r.sampling.seed, Some(7));
}

#[test]
fn chat_stop_is_a_string_or_a_list() {
    let stop = |v| {
        ok(Route::ChatCompletions, chat_body(json!({"stop": v})))
            .sampling
            .stop
    };
    assert_eq!(stop(json!("###")), vec!["###".to_string()]);
    assert_eq!(stop(json!([])), Vec::<String>::new());
    for bad in [json!(""), json!([""]), json!(5), json!(["a", 1])] {
        let e = refused(Route::ChatCompletions, chat_body(json!({"stop": bad})));
        assert_eq!(e.code(), ErrorCode::InvalidRequest);
        assert!(e.to_string().starts_with("field `stop` must be"), "{e}");
    }
}

#[test]
fn chat_logprobs_and_top_logprobs() {
    let lp = |extra| ok(Route::ChatCompletions, chat_body(extra)).logprobs;
    assert_eq!(lp(json!({"logprobs": false})), None);
    assert_eq!(
        lp(json!({"logprobs": true})),
        Some(LogprobRequest::default())
    );
    assert_eq!(
        lp(json!({"logprobs": true, "top_logprobs": 5})).map(|l| l.top_logprobs),
        Some(5)
    );
    assert_eq!(lp(json!({"top_logprobs": 0})), None);
    let e = refused(
        Route::ChatCompletions,
        chat_body(json!({"top_logprobs": 2})),
    );
    assert_eq!(e.code(), ErrorCode::InvalidRequestParameters);
    assert_eq!(
        e.to_string(),
        "Invalid request parameters: `top_logprobs` is only allowed when `logprobs` is true"
    );
}

#[test]
fn chat_stream_and_usage() {
    let r = ok(
        Route::ChatCompletions,
        chat_body(json!({"stream": true, "stream_options": {"include_usage": true}})),
    );
    assert!(r.stream && r.include_usage);
    let r = ok(Route::ChatCompletions, chat_body(json!({"stream": true})));
    assert!(r.stream && !r.include_usage);
    let e = refused(
        Route::ChatCompletions,
        chat_body(json!({"stream_options": {"include_usage": true}})),
    );
    assert_eq!(e.code(), ErrorCode::InvalidRequestParameters);
    let (f, field) = unsupported(
        Route::ChatCompletions,
        chat_body(json!({"stream": true, "stream_options": {"continuous_usage_stats": true}})),
    );
    assert_eq!(
        (f, field.as_str()),
        (
            Feature::ContinuousUsageStats,
            "stream_options.continuous_usage_stats"
        )
    );
}

#[test]
fn chat_response_format_constraints() {
    let c = |extra| {
        ok(Route::ChatCompletions, chat_body(extra))
            .sampling
            .constraint
    };
    assert_eq!(c(json!({"response_format": {"type": "text"}})), None);
    assert_eq!(
        c(json!({"response_format": {"type": "json_object"}})),
        Some(Constraint::JsonObject)
    );
    assert_eq!(
        c(
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}})
        ),
        Some(Constraint::JsonSchema(r#"{"type":"object"}"#.into()))
    );
    assert_eq!(
        c(json!({"ebnf": "root ::= \"a\""})),
        Some(Constraint::Ebnf("root ::= \"a\"".into()))
    );
}

#[test]
fn chat_two_constraints_are_invalid_request_parameters() {
    for extra in [
        json!({"regex": "a", "ebnf": "b"}),
        json!({"response_format": {"type": "json_object"}, "regex": "a"}),
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {}}}, "ebnf": "x"}),
    ] {
        let e = refused(Route::ChatCompletions, chat_body(extra.clone()));
        assert_eq!(e.code(), ErrorCode::InvalidRequestParameters, "{extra}");
        assert_eq!(e.status(), 400);
        assert!(e.to_string().contains("only one output constraint"), "{e}");
    }
}

#[test]
fn chat_template_options() {
    let r = ok(
        Route::ChatCompletions,
        chat_body(json!({
            "chat_template_kwargs": {"enable_thinking": false},
            "continue_final_message": true,
            "reasoning_effort": "none",
        })),
    );
    let c = chat_input(&r);
    assert_eq!(
        c.chat_template_kwargs,
        Some(
            json!({"enable_thinking": false})
                .as_object()
                .unwrap()
                .clone()
        )
    );
    assert!(c.continue_final_message && !c.add_generation_prompt);
    assert_eq!(c.thinking, Some(false));
    let r = ok(
        Route::ChatCompletions,
        chat_body(json!({"add_generation_prompt": false, "reasoning_effort": "high"})),
    );
    assert!(!chat_input(&r).add_generation_prompt);
    assert_eq!(chat_input(&r).thinking, None);
    let e = refused(
        Route::ChatCompletions,
        chat_body(json!({"add_generation_prompt": true, "continue_final_message": true})),
    );
    assert_eq!(e.code(), ErrorCode::InvalidRequestParameters);
}

#[test]
fn chat_messages_pass_as_sent_with_text_parts() {
    let messages = json!([
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "name": "u"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]);
    let r = ok(Route::ChatCompletions, json!({"messages": messages}));
    assert_eq!(Value::Array(chat_input(&r).messages.clone()), messages);
}

#[test]
fn chat_images_are_taken_out_in_prompt_order() {
    let body = json!({"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://media.test/a.png", "detail": "low"}},
            {"type": "text", "text": "and"},
            {"type": "image_url", "image_url": "data:image/png;base64,AA"},
        ]},
    ]});
    let r = ok(Route::ChatCompletions, body);
    let chat = chat_input(&r);
    assert_eq!(
        chat.media,
        vec![
            MediaRef {
                source: MediaSource::Url("https://media.test/a.png".into())
            },
            MediaRef {
                source: MediaSource::Url("data:image/png;base64,AA".into())
            },
        ]
    );
    assert_eq!(
        chat.messages[1]["content"],
        json!([{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}])
    );
    for bad in [json!({"url": ""}), json!({}), json!(7)] {
        let body = json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": bad}]}]});
        let e = refused(Route::ChatCompletions, body);
        assert_eq!(e.code(), ErrorCode::InvalidRequest, "{e}");
        assert!(
            e.to_string().contains("messages[0].content[0].image_url"),
            "{e}"
        );
    }
}

#[test]
fn chat_media_parts_are_multimodal_refusals() {
    for part in [
        json!({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}),
        json!({"type": "video_url", "video_url": {"url": "x"}}),
        json!({"type": "file", "file": {}}),
    ] {
        let body = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, part]}]});
        let e = refused(Route::ChatCompletions, body);
        assert_eq!(e.code(), ErrorCode::MultimodalNotSupported);
        assert_eq!(
            e.to_string(),
            "`messages[0].content[1]` is not supported for gRPC workers yet: image, audio, video and file input"
        );
    }
    let (f, field) = unsupported(
        Route::ChatCompletions,
        json!({"messages": [{"role": "user", "content": [{"type": "hologram"}]}]}),
    );
    assert_eq!(
        (f, field.as_str()),
        (Feature::ContentType, "messages[0].content[0]")
    );
    let e = refused(
        Route::ChatCompletions,
        json!({"messages": [{"role": "user", "content": [{"text": "no type"}]}]}),
    );
    assert_eq!(e.code(), ErrorCode::InvalidRequest);
}

#[test]
fn chat_tools_with_tool_calling_are_refused() {
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
    for choice in [
        None,
        Some(json!("auto")),
        Some(json!("required")),
        Some(json!({"type": "function", "function": {"name": "f"}})),
    ] {
        let mut extra = json!({"tools": tools});
        if let Some(c) = choice {
            extra["tool_choice"] = c;
        }
        let (f, field) = unsupported(Route::ChatCompletions, chat_body(extra));
        assert_eq!((f, field.as_str()), (Feature::ToolCalling, "tools"));
    }
    let e = refused(
        Route::ChatCompletions,
        chat_body(json!({"tools": tools, "tool_choice": "auto"})),
    );
    assert_eq!(e.code(), ErrorCode::FeatureNotSupported);
    // Tool calling off: the tools reach the template.
    let r = ok(
        Route::ChatCompletions,
        chat_body(json!({"tools": tools, "tool_choice": "none"})),
    );
    assert_eq!(chat_input(&r).tools, Some(tools.clone()));
    assert_eq!(chat_input(&r).tool_choice, Some(json!("none")));
    // No tools at all, or an empty list, is plain chat.
    let r = ok(
        Route::ChatCompletions,
        chat_body(json!({"tools": [], "tool_choice": "auto"})),
    );
    assert_eq!(chat_input(&r).tools, None);
    // Legacy functions.
    let (f, field) = unsupported(
        Route::ChatCompletions,
        chat_body(json!({"functions": [{"name": "f"}]})),
    );
    assert_eq!((f, field.as_str()), (Feature::ToolCalling, "functions"));
    ok(
        Route::ChatCompletions,
        chat_body(json!({"functions": [{"name": "f"}], "function_call": "none"})),
    );
    // Forcing a call without tools is a plain 400.
    let e = refused(
        Route::ChatCompletions,
        chat_body(json!({"tool_choice": "required"})),
    );
    assert_eq!(e.code(), ErrorCode::InvalidRequestParameters);
}

#[test]
fn chat_refusals_name_their_fields() {
    for (extra, feature, field) in [
        (
            json!({"modalities": ["text", "audio"]}),
            Feature::AudioOutput,
            "modalities",
        ),
        (
            json!({"audio": {"voice": "x"}}),
            Feature::AudioOutput,
            "audio",
        ),
        (json!({"echo": true}), Feature::ChatEcho, "echo"),
        (
            json!({"use_beam_search": true}),
            Feature::BeamSearch,
            "use_beam_search",
        ),
        (
            json!({"return_hidden_states": true}),
            Feature::HiddenStates,
            "return_hidden_states",
        ),
        (json!({"lora_path": "a"}), Feature::Lora, "lora_path"),
        (
            json!({"session_params": {"id": "s"}}),
            Feature::SessionParams,
            "session_params",
        ),
        (
            json!({"custom_logit_processor": "x"}),
            Feature::CustomLogitProcessor,
            "custom_logit_processor",
        ),
        (
            json!({"guided_json": {"type": "object"}}),
            Feature::GuidedDecoding,
            "guided_json",
        ),
        (
            json!({"guided_regex": "a"}),
            Feature::GuidedDecoding,
            "guided_regex",
        ),
        (
            json!({"structured_outputs": {"regex": "a"}}),
            Feature::GuidedDecoding,
            "structured_outputs",
        ),
    ] {
        let (f, name) = unsupported(Route::ChatCompletions, chat_body(extra.clone()));
        assert_eq!((f, name.as_str()), (feature, field), "{extra}");
    }
    // Off values are not requests for the feature.
    ok(
        Route::ChatCompletions,
        chat_body(
            json!({"modalities": ["text"], "echo": false, "use_beam_search": false,
            "return_hidden_states": false, "lora_path": null}),
        ),
    );
}

#[test]
fn chat_unknown_fields_are_ignored() {
    ok(
        Route::ChatCompletions,
        chat_body(
            json!({"user": "u", "metadata": {"a": "b"}, "store": true, "service_tier": "auto",
            "parallel_tool_calls": true, "separate_reasoning": false, "x_vendor": [1, {"y": null}]}),
        ),
    );
}

#[test]
fn chat_wrong_types_are_invalid_request() {
    for (extra, field) in [
        (json!({"top_k": 1.5}), "top_k"),
        (json!({"min_p": "0.1"}), "min_p"),
        (json!({"frequency_penalty": true}), "frequency_penalty"),
        (json!({"stop_token_ids": [-1]}), "stop_token_ids"),
        (json!({"ignore_eos": 1}), "ignore_eos"),
        (json!({"seed": "1"}), "seed"),
        (json!({"logit_bias": {"a": 1}}), "logit_bias"),
        (json!({"chat_template_kwargs": []}), "chat_template_kwargs"),
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format.type",
        ),
        (
            json!({"top_logprobs": -1, "logprobs": true}),
            "top_logprobs",
        ),
        (json!({"rid": 5}), "rid"),
    ] {
        match refused(Route::ChatCompletions, chat_body(extra.clone())) {
            RequestError::InvalidField { field: f, .. } => assert_eq!(f, field, "{extra}"),
            other => panic!("{extra}: {other}"),
        }
    }
}

// ---------------------------------------------------------------- completions

#[test]
fn completions_prompt_forms() {
    let p = |prompt: Value| {
        let r = ok(Route::Completions, json!({"prompt": prompt}));
        let (ps, batch) = prompts(&r);
        (ps.to_vec(), batch)
    };
    assert_eq!(p(json!("hi")), (vec![Prompt::Text("hi".into())], false));
    assert_eq!(
        p(json!(["a", "b"])),
        (
            vec![Prompt::Text("a".into()), Prompt::Text("b".into())],
            true
        )
    );
    assert_eq!(p(json!(["a"])), (vec![Prompt::Text("a".into())], true));
    assert_eq!(
        p(json!([1, 2, 3])),
        (vec![Prompt::TokenIds(vec![1, 2, 3])], false)
    );
    assert_eq!(
        p(json!([[1], [2, 3]])),
        (
            vec![Prompt::TokenIds(vec![1]), Prompt::TokenIds(vec![2, 3])],
            true
        )
    );
    let e = refused(Route::Completions, json!({"prompt": []}));
    assert_eq!(e.code(), ErrorCode::InvalidRequest);
    let e = refused(Route::Completions, json!({"prompt": [-1]}));
    assert_eq!(e.code(), ErrorCode::InvalidRequest);
}

#[test]
fn completions_fields() {
    let r = ok(
        Route::Completions,
        json!({"prompt": "p", "model": "m", "echo": true, "suffix": "!", "logprobs": 3,
            "stream": true, "stream_options": {"include_usage": true}, "n": 2, "best_of": 2,
            "temperature": 0, "min_tokens": 1, "stop": "\n", "json_schema": "{\"type\":\"string\"}"}),
    );
    assert!(r.echo && r.stream && r.include_usage);
    assert_eq!(r.suffix.as_deref(), Some("!"));
    assert_eq!(r.logprobs.map(|l| l.top_logprobs), Some(3));
    assert_eq!(r.sampling.n, 2);
    assert_eq!(r.sampling.max_new_tokens, Some(16));
    assert_eq!(r.sampling.temperature, Some(0.0));
    assert_eq!(r.sampling.min_new_tokens, 1);
    assert_eq!(r.sampling.stop, vec!["\n".to_string()]);
    assert_eq!(
        r.sampling.constraint,
        Some(Constraint::JsonSchema("{\"type\":\"string\"}".into()))
    );
    let lp = |v| ok(Route::Completions, json!({"prompt": "p", "logprobs": v})).logprobs;
    assert_eq!(lp(json!(0)), Some(LogprobRequest::default()));
    assert_eq!(lp(json!(null)), None);
    assert_eq!(lp(json!(false)), None);
    assert_eq!(
        ok(Route::Completions, json!({"prompt": "p", "max_tokens": 0}))
            .sampling
            .max_new_tokens,
        Some(0)
    );
}

#[test]
fn completions_refusals() {
    let (f, _) = unsupported(
        Route::Completions,
        json!({"prompt": "p", "n": 1, "best_of": 3}),
    );
    assert_eq!(f, Feature::BestOf);
    let (f, field) = unsupported(Route::Completions, json!({"prompt_embeds": "AAAA"}));
    assert_eq!(
        (f, field.as_str()),
        (Feature::PromptEmbeddings, "prompt_embeds")
    );
    let e = refused(
        Route::Completions,
        json!({"prompt": "p", "regex": "a", "json_schema": "{}"}),
    );
    assert_eq!(e.code(), ErrorCode::InvalidRequestParameters);
    let e = refused(Route::Completions, json!({"prompt": "p", "logprobs": true}));
    assert_eq!(e.code(), ErrorCode::InvalidRequest);
}

// ---------------------------------------------------------------- /generate

#[test]
fn generate_inputs() {
    let p = |body: Value| {
        let r = ok(Route::Generate, body);
        let (ps, batch) = prompts(&r);
        (ps.to_vec(), batch)
    };
    assert_eq!(
        p(json!({"text": "hi"})),
        (vec![Prompt::Text("hi".into())], false)
    );
    assert_eq!(
        p(json!({"text": ["a", "b"]})),
        (
            vec![Prompt::Text("a".into()), Prompt::Text("b".into())],
            true
        )
    );
    assert_eq!(
        p(json!({"input_ids": [5, 6]})),
        (vec![Prompt::TokenIds(vec![5, 6])], false)
    );
    assert_eq!(
        p(json!({"input_ids": []})),
        (vec![Prompt::TokenIds(vec![])], false)
    );
    assert_eq!(
        p(json!({"input_ids": [[5], [6]], "text": "ignored"})),
        (
            vec![Prompt::TokenIds(vec![5]), Prompt::TokenIds(vec![6])],
            true
        )
    );
    let e = refused(Route::Generate, json!({"text": []}));
    assert_eq!(e.code(), ErrorCode::InvalidRequest);
}

#[test]
fn generate_sampling_params_and_logprobs() {
    let r = ok(
        Route::Generate,
        json!({
            "text": "x", "stream": true, "rid": "r-1",
            "return_logprob": true, "top_logprobs_num": 2, "logprob_start_len": -1,
            "return_text_in_logprobs": true,
            "sampling_params": {
                "temperature": 0.2, "top_p": 0.8, "top_k": 20, "min_p": 0.1,
                "frequency_penalty": 0.3, "presence_penalty": 0.4, "repetition_penalty": 1.2,
                "max_new_tokens": 64, "min_new_tokens": 4, "stop": "END", "stop_token_ids": [2],
                "ignore_eos": true, "n": 2, "sampling_seed": 9, "skip_special_tokens": false,
                "spaces_between_special_tokens": false, "no_stop_trim": true,
                "structural_tag": "{}", "logit_bias": {"3": -1}
            }
        }),
    );
    assert!(r.stream);
    assert_eq!(r.request_id.as_deref(), Some("r-1"));
    assert_eq!(
        r.logprobs,
        Some(LogprobRequest {
            top_logprobs: 2,
            token_text: true,
            start_len: Some(-1),
        })
    );
    assert_eq!(
        r.sampling,
        SamplingParams {
            temperature: Some(0.2),
            top_p: Some(0.8),
            top_k: Some(20),
            min_p: Some(0.1),
            frequency_penalty: Some(0.3),
            presence_penalty: Some(0.4),
            repetition_penalty: Some(1.2),
            max_new_tokens: Some(64),
            min_new_tokens: 4,
            stop: vec!["END".into()],
            stop_token_ids: vec![2],
            ignore_eos: true,
            n: 2,
            seed: Some(9),
            skip_special_tokens: false,
            spaces_between_special_tokens: false,
            no_stop_trim: true,
            constraint: Some(Constraint::StructuralTag("{}".into())),
            logit_bias: vec![(3, -1.0)],
        }
    );
    // No sampling_params: defaults; no cap (SGLang's own default applies).
    let r = ok(Route::Generate, json!({"text": "x"}));
    assert_eq!(r.sampling, SamplingParams::default());
    assert_eq!(r.logprobs, None);
}

#[test]
fn generate_rid_lists_name_batch_items() {
    let r = ok(
        Route::Generate,
        json!({"text": ["a", "b"], "rid": ["x", "y"]}),
    );
    assert_eq!(r.item_request_ids, vec!["x".to_string(), "y".into()]);
    assert_eq!(r.request_id, None);
    for body in [
        json!({"text": ["a", "b"], "rid": ["x"]}),
        json!({"text": "a", "rid": ["x"]}),
        json!({"text": "a", "rid": 3}),
    ] {
        assert_eq!(
            refused(Route::Generate, body).code(),
            ErrorCode::InvalidRequest
        );
    }
}

#[test]
fn generate_refusals() {
    for (body, feature, field) in [
        (
            json!({"text": "a", "image_data": "x"}),
            Feature::Multimodal,
            "image_data",
        ),
        (
            json!({"text": "a", "audio_data": ["x"]}),
            Feature::Multimodal,
            "audio_data",
        ),
        (
            json!({"input_embeds": [[0.1]]}),
            Feature::PromptEmbeddings,
            "input_embeds",
        ),
        (
            json!({"text": "a", "return_hidden_states": true}),
            Feature::HiddenStates,
            "return_hidden_states",
        ),
        (
            json!({"text": "a", "lora_path": "l"}),
            Feature::Lora,
            "lora_path",
        ),
        (
            json!({"text": "a", "session_params": {"id": 1}}),
            Feature::SessionParams,
            "session_params",
        ),
        (
            json!({"text": "a", "custom_logit_processor": "p"}),
            Feature::CustomLogitProcessor,
            "custom_logit_processor",
        ),
        (
            json!({"text": "a", "token_ids_logprob": [1]}),
            Feature::TokenIdLogprobs,
            "token_ids_logprob",
        ),
    ] {
        let (f, name) = unsupported(Route::Generate, body.clone());
        assert_eq!((f, name.as_str()), (feature, field), "{body}");
    }
    let e = refused(
        Route::Generate,
        json!({"text": "a", "sampling_params": {"regex": "a", "ebnf": "b"}}),
    );
    assert_eq!(e.code(), ErrorCode::InvalidRequestParameters);
    // The gateway's classification refuses a bad `sampling_params.n` first (it fans out on
    // it), with the message the conversion gives.
    let bytes = br#"{"text":"a","sampling_params":{"n":0}}"#;
    let top = scan_object(bytes).unwrap();
    let e = classify(Route::Generate, bytes, &top).unwrap_err();
    assert_eq!(
        e.to_string(),
        "field `sampling_params.n` must be an integer between 1 and 1024"
    );
    let e = convert_request(Route::Generate, bytes, &top).unwrap_err();
    assert_eq!(
        e.to_string(),
        "field `sampling_params.n` must be an integer between 1 and 1024"
    );
    let e = refused(
        Route::Generate,
        json!({"text": "a", "sampling_params": {"stop": [1]}}),
    );
    assert!(
        e.to_string().starts_with("field `sampling_params.stop`"),
        "{e}"
    );
}

// ---------------------------------------------------------------- Anthropic

fn anthropic(extra: Value) -> Value {
    let mut body = json!({"model": "claude", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]});
    merge(&mut body, extra);
    body
}

#[test]
fn anthropic_sampling_fields() {
    let r = ok(
        Route::Messages,
        anthropic(json!({"temperature": 0.3, "top_p": 0.7, "top_k": 5,
            "stop_sequences": ["\n\nHuman:"], "stream": true,
            "metadata": {"user_id": "u"}})),
    );
    assert!(r.stream);
    assert_eq!(r.model.as_deref(), Some("claude"));
    assert_eq!(
        r.sampling,
        SamplingParams {
            temperature: Some(0.3),
            top_p: Some(0.7),
            top_k: Some(5),
            max_new_tokens: Some(32),
            stop: vec!["\n\nHuman:".into()],
            ..SamplingParams::default()
        }
    );
}

#[test]
fn anthropic_system_and_blocks_become_template_messages() {
    let r = ok(
        Route::Messages,
        anthropic(json!({
            "system": [{"type": "text", "text": "rule 1"}, {"type": "text", "text": "rule 2", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "text", "text": "Let me "},
                    {"type": "text", "text": "check."},
                    {"type": "tool_use", "id": "tu1", "name": "get", "input": {"city": "Paris"}},
                    {"type": "redacted_thinking", "data": "zz"}
                ]},
                {"role": "user", "content": [
                    {"type": "text", "text": "and?"},
                    {"type": "tool_result", "tool_use_id": "tu1", "content": [{"type": "text", "text": "sunny"}, {"type": "text", "text": "20C"}]}
                ]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "tu2", "name": "x", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu2", "content": "done"}]},
            ],
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        })),
    );
    let c = chat_input(&r);
    assert_eq!(
        Value::Array(c.messages.clone()),
        json!([
            {"role": "system", "content": "rule 1\nrule 2"},
            {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
            {"role": "assistant", "content": "Let me check.", "reasoning_content": "hmm",
             "tool_calls": [{"id": "tu1", "type": "function", "function": {"name": "get", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "tu1", "content": "sunny\n20C"},
            {"role": "user", "content": [{"type": "text", "text": "and?"}]},
            {"role": "assistant", "content": null,
             "tool_calls": [{"id": "tu2", "type": "function", "function": {"name": "x", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "tu2", "content": "done"},
        ])
    );
    assert_eq!(c.thinking, Some(true));
    assert!(c.add_generation_prompt);
    let r = ok(
        Route::Messages,
        anthropic(json!({"system": "be terse", "thinking": {"type": "disabled"}})),
    );
    assert_eq!(
        chat_input(&r).messages[0],
        json!({"role": "system", "content": "be terse"})
    );
    assert_eq!(chat_input(&r).thinking, Some(false));
}

#[test]
fn anthropic_refusals() {
    let tools = json!([{"name": "get", "input_schema": {"type": "object"}}]);
    let (f, _) = unsupported(Route::Messages, anthropic(json!({"tools": tools})));
    assert_eq!(f, Feature::ToolCalling);
    let (f, _) = unsupported(
        Route::Messages,
        anthropic(json!({"tools": tools, "tool_choice": {"type": "any"}})),
    );
    assert_eq!(f, Feature::ToolCalling);
    let r = ok(
        Route::Messages,
        anthropic(json!({"tools": tools, "tool_choice": {"type": "none"}})),
    );
    assert_eq!(chat_input(&r).tools, Some(tools));

    let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}});
    let by_url =
        json!({"type": "image", "source": {"type": "url", "url": "https://media.test/b.jpg"}});
    let r = ok(
        Route::Messages,
        anthropic(
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, image, by_url]}]}),
        ),
    );
    let chat = chat_input(&r);
    assert_eq!(
        chat.media,
        vec![
            MediaRef {
                source: MediaSource::Base64 {
                    media_type: "image/png".into(),
                    data: "AA".into()
                }
            },
            MediaRef {
                source: MediaSource::Url("https://media.test/b.jpg".into())
            },
        ]
    );
    assert_eq!(chat.media[0].url(), "data:image/png;base64,AA");
    assert_eq!(
        chat.messages[0]["content"],
        json!([{"type": "text", "text": "see"}, {"type": "image"}, {"type": "image"}])
    );
    let e = refused(
        Route::Messages,
        anthropic(
            json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]}),
        ),
    );
    assert_eq!(e.code(), ErrorCode::InvalidRequest, "{e}");
    let e = refused(
        Route::Messages,
        anthropic(json!({"messages": [{"role": "assistant", "content": [image]}]})),
    );
    assert_eq!(e.code(), ErrorCode::MultimodalNotSupported);
    let e = refused(
        Route::Messages,
        anthropic(
            json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [image]}]}]}),
        ),
    );
    assert_eq!(e.code(), ErrorCode::MultimodalNotSupported);
    let (f, _) = unsupported(
        Route::Messages,
        anthropic(
            json!({"messages": [{"role": "assistant", "content": [{"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}}]}]}),
        ),
    );
    assert_eq!(f, Feature::ContentType);
    for bad in [
        json!({"system": 5}),
        json!({"system": [{"type": "image"}]}),
        json!({"messages": [{"role": "tool", "content": "x"}]}),
        json!({"messages": [{"role": "user", "content": 5}]}),
        json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
        json!({"stop_sequences": "x"}),
    ] {
        let e = refused(Route::Messages, anthropic(bad.clone()));
        assert_eq!(e.code(), ErrorCode::InvalidRequest, "{bad}");
    }
}

// ---------------------------------------------------------------- Responses

#[test]
fn responses_input_forms_and_fields() {
    let r = ok(
        Route::Responses,
        json!({"model": "m", "input": "hello", "instructions": "be nice", "max_output_tokens": 50,
            "temperature": 0.1, "top_p": 0.5, "stream": true, "store": true,
            "reasoning": {"effort": "minimal"}}),
    );
    assert!(r.stream);
    assert_eq!(r.sampling.max_new_tokens, Some(50));
    assert_eq!(r.sampling.temperature, Some(0.1));
    assert_eq!(r.sampling.top_p, Some(0.5));
    let c = chat_input(&r);
    assert_eq!(
        Value::Array(c.messages.clone()),
        json!([{"role": "system", "content": "be nice"}, {"role": "user", "content": "hello"}])
    );
    assert_eq!(c.thinking, Some(false));

    let r = ok(
        Route::Responses,
        json!({"input": [
            {"role": "user", "content": "plain"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x"}, {"type": "output_text", "text": "y"}]},
            {"role": "developer", "content": [{"type": "input_text", "text": "d"}]},
        ]}),
    );
    assert_eq!(
        Value::Array(chat_input(&r).messages.clone()),
        json!([
            {"role": "user", "content": "plain"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "xy"},
            {"role": "developer", "content": "d"},
        ])
    );
}

#[test]
fn responses_text_format_constraints() {
    let c = |format: Value| {
        ok(
            Route::Responses,
            json!({"input": "x", "text": {"format": format}}),
        )
        .sampling
        .constraint
    };
    assert_eq!(c(json!({"type": "text"})), None);
    assert_eq!(
        c(json!({"type": "json_object"})),
        Some(Constraint::JsonObject)
    );
    assert_eq!(
        c(
            json!({"type": "json_schema", "name": "n", "schema": {"type": "number"}, "strict": true})
        ),
        Some(Constraint::JsonSchema(r#"{"type":"number"}"#.into()))
    );
    let e = refused(
        Route::Responses,
        json!({"input": "x", "text": {"format": {"type": "csv"}}}),
    );
    assert_eq!(
        e.to_string(),
        "field `text.format.type` must be one of `text`, `json_object`, `json_schema`"
    );
}

#[test]
fn responses_refusals() {
    for (body, feature) in [
        (
            json!({"input": "x", "previous_response_id": "resp_1"}),
            Feature::StoredResponses,
        ),
        (
            json!({"input": "x", "conversation": "conv_1"}),
            Feature::StoredResponses,
        ),
        (
            json!({"input": "x", "background": true}),
            Feature::BackgroundResponses,
        ),
        (
            json!({"input": "x", "top_logprobs": 2}),
            Feature::ResponsesLogprobs,
        ),
        (
            json!({"input": "x", "tools": [{"type": "function", "name": "f"}]}),
            Feature::ToolCalling,
        ),
        (
            json!({"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]}),
            Feature::ToolCalling,
        ),
        (
            json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
            Feature::StoredResponses,
        ),
        (
            json!({"input": [{"type": "reasoning", "summary": []}]}),
            Feature::ContentType,
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            Feature::Multimodal,
        ),
    ] {
        let (f, _) = unsupported(Route::Responses, body.clone());
        assert_eq!(f, feature, "{body}");
    }
    ok(
        Route::Responses,
        json!({"input": "x", "background": false, "top_logprobs": 0, "tools": []}),
    );
    for bad in [
        json!({}),
        json!({"input": []}),
        json!({"input": 3}),
        json!({"input": [{"role": "robot", "content": "x"}]}),
        json!({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}),
    ] {
        assert_eq!(
            refused(Route::Responses, bad.clone()).code(),
            ErrorCode::InvalidRequest,
            "{bad}"
        );
    }
}

// ---------------------------------------------------------------- other routes

#[test]
fn non_generation_routes_are_refused() {
    for route in [Route::Rerank, Route::CountTokens] {
        let bytes =
            br#"{"query":"q","documents":["d"],"messages":[{"role":"user","content":"x"}]}"#;
        let top = scan_object(bytes).unwrap();
        let e = convert_request(route, bytes, &top).unwrap_err();
        assert!(matches!(
            e,
            RequestError::Unsupported(Unsupported {
                feature: Feature::NotAGenerationRoute,
                ..
            })
        ));
    }
}

#[test]
fn every_feature_has_a_catalogue_code_and_a_description() {
    let all = [
        Feature::ToolCalling,
        Feature::Multimodal,
        Feature::ContentType,
        Feature::PromptEmbeddings,
        Feature::BeamSearch,
        Feature::BestOf,
        Feature::HiddenStates,
        Feature::Lora,
        Feature::CustomLogitProcessor,
        Feature::SessionParams,
        Feature::TokenIdLogprobs,
        Feature::StoredResponses,
        Feature::BackgroundResponses,
        Feature::ResponsesLogprobs,
        Feature::AudioOutput,
        Feature::ContinuousUsageStats,
        Feature::GuidedDecoding,
        Feature::ChatEcho,
        Feature::NotAGenerationRoute,
    ];
    for f in all {
        assert_eq!(f.code().status(), 400, "{f:?}");
        assert!(!f.describe().is_empty());
    }
}
