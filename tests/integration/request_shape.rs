//! Bodies of the wrong shape for their route never reach an engine (issue 12): a chat without a
//! list of messages, a completion without a prompt, a negative cap, `n: 0`, a `/v1/messages`
//! without `max_tokens`, a `/generate` without input or with `sampling_params` of the wrong
//! kind. Each is the catalogue's 400 `invalid_request`, naming the field, before a worker is
//! chosen; bodies at the edge of the rules and fields the gateway does not know go through as
//! the client wrote them.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::{
    assert_no_engine_contacted, error_code, gateway_for, post_raw, Gateway, RawEngine, SglangFleet,
};

/// The catalogue's 400 body for a field of the wrong shape, checked whole: exactly
/// `{"error":{"type":"invalid_request_error","code":"invalid_request","message":"field `<field>` must be
/// …","param":null}}`, with the code in `X-SMG-Error-Code` too.
fn assert_refused_naming(r: &mock_engine::client::Response, field: &str, case: &str) {
    assert_eq!(r.status, 400, "{case}: {}", r.text());
    assert_eq!(
        r.header("x-smg-error-code"),
        Some("invalid_request"),
        "{case}"
    );
    let body: Value = serde_json::from_slice(&r.body)
        .unwrap_or_else(|e| panic!("{case}: the error body is not JSON ({e}): {}", r.text()));
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(&format!("field `{field}` must be ")),
        "{case}: {message:?} does not name `{field}`"
    );
    let expected = if case.starts_with("/v1/messages") {
        // The Messages API answers in Anthropic's shape (SMG 1.13.0), the code in the header.
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": message},
            "request_id": r.header("x-request-id").unwrap_or_default()})
    } else {
        json!({"error": {"type": "invalid_request_error", "code": "invalid_request",
            "message": message, "param": null}})
    };
    assert_eq!(body, expected, "{case}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_messages_not_a_list_is_refused_before_any_engine() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = gateway_for(&fleet, "").await;
    let r = post_raw(
        &gw,
        "/v1/chat/completions",
        br#"{"model":"mock-model","messages":"not-a-list"}"#,
    )
    .await;
    assert_no_engine_contacted(&fleet, "messages: \"not-a-list\"");
    assert_refused_naming(&r, "messages", "messages: \"not-a-list\"");
    assert_eq!(
        r.json()["error"]["message"],
        "field `messages` must be a non-empty list of objects, each with a string `role`"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_of_the_wrong_shape_are_refused_with_400_before_any_engine() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = gateway_for(&fleet, "").await;
    const CHAT: &str = "/v1/chat/completions";
    const COMPLETIONS: &str = "/v1/completions";
    const MESSAGES: &str = "/v1/messages";
    const GENERATE: &str = "/generate";
    let msgs = r#"[{"role":"user","content":"hi"}]"#;
    // (route, body, the field the refusal names)
    let cases: Vec<(&str, String, &str)> = vec![
        (CHAT, r#"{"model":"mock-model"}"#.into(), "messages"),
        (
            CHAT,
            r#"{"model":"mock-model","messages":null}"#.into(),
            "messages",
        ),
        (CHAT, r#"{"messages":[]}"#.into(), "messages"),
        (CHAT, r#"{"messages":{"role":"user"}}"#.into(), "messages"),
        (CHAT, r#"{"messages":["hi"]}"#.into(), "messages"),
        (
            CHAT,
            r#"{"messages":[{"content":"hi"}]}"#.into(),
            "messages",
        ),
        (CHAT, r#"{"messages":[{"role":7}]}"#.into(), "messages"),
        (
            CHAT,
            format!(r#"{{"messages":{msgs},"max_tokens":-1}}"#),
            "max_tokens",
        ),
        (
            CHAT,
            format!(r#"{{"messages":{msgs},"max_completion_tokens":1.5}}"#),
            "max_completion_tokens",
        ),
        (
            CHAT,
            format!(r#"{{"messages":{msgs},"temperature":-0.5}}"#),
            "temperature",
        ),
        (
            CHAT,
            format!(r#"{{"messages":{msgs},"temperature":"hot"}}"#),
            "temperature",
        ),
        (
            CHAT,
            format!(r#"{{"messages":{msgs},"top_p":1.5}}"#),
            "top_p",
        ),
        (CHAT, format!(r#"{{"messages":{msgs},"n":0}}"#), "n"),
        (MESSAGES, r#"{"max_tokens":8}"#.into(), "messages"),
        (
            MESSAGES,
            r#"{"messages":"hi","max_tokens":8}"#.into(),
            "messages",
        ),
        (MESSAGES, format!(r#"{{"messages":{msgs}}}"#), "max_tokens"),
        (
            MESSAGES,
            format!(r#"{{"messages":{msgs},"max_tokens":null}}"#),
            "max_tokens",
        ),
        (
            MESSAGES,
            format!(r#"{{"messages":{msgs},"max_tokens":0}}"#),
            "max_tokens",
        ),
        (
            MESSAGES,
            format!(r#"{{"messages":{msgs},"max_tokens":8,"top_p":-1}}"#),
            "top_p",
        ),
        (COMPLETIONS, r#"{"model":"mock-model"}"#.into(), "prompt"),
        (COMPLETIONS, r#"{"prompt":null}"#.into(), "prompt"),
        (COMPLETIONS, r#"{"prompt":[[1],["a"]]}"#.into(), "prompt"),
        (
            COMPLETIONS,
            r#"{"prompt_embeds":5}"#.into(),
            "prompt_embeds",
        ),
        (
            COMPLETIONS,
            r#"{"prompt":"a","max_tokens":-1}"#.into(),
            "max_tokens",
        ),
        (COMPLETIONS, r#"{"prompt":"a","n":0}"#.into(), "n"),
        (GENERATE, "{}".into(), "text"),
        (
            GENERATE,
            r#"{"sampling_params":{"max_new_tokens":1}}"#.into(),
            "text",
        ),
        (
            GENERATE,
            r#"{"text":"a","sampling_params":[{"max_new_tokens":1}]}"#.into(),
            "sampling_params",
        ),
        (
            GENERATE,
            r#"{"text":"a","sampling_params":{"max_new_tokens":-1}}"#.into(),
            "sampling_params.max_new_tokens",
        ),
        (
            GENERATE,
            r#"{"text":"a","sampling_params":{"temperature":-1}}"#.into(),
            "sampling_params.temperature",
        ),
        (
            GENERATE,
            r#"{"text":"a","sampling_params":{"top_p":2}}"#.into(),
            "sampling_params.top_p",
        ),
        (GENERATE, r#"{"input_ids":[[1],["a"]]}"#.into(), "input_ids"),
        (
            "/v1/responses",
            r#"{"input":"hi","max_output_tokens":-1}"#.into(),
            "max_output_tokens",
        ),
    ];
    for (path, body, field) in &cases {
        let case = format!("{path} {body}");
        let r = post_raw(&gw, path, body.as_bytes()).await;
        assert_no_engine_contacted(&fleet, &case);
        assert_refused_naming(&r, field, &case);
    }
    // Still serving, and the refusals were counted as the client's errors.
    let r = gw
        .post(
            CHAT,
            &json!({"model": "mock-model", "messages": [{"role": "user", "content": "ok?"}],
                "max_tokens": 2}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!gw.log().contains("panicked"), "{}", gw.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_at_the_edge_of_the_rules_reach_the_engines() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = gateway_for(&fleet, "").await;
    let msgs =
        json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]);
    // Explicit nulls count as absent; 0 is a cap and a temperature; 0 and 1 bound top_p; n
    // starts at 1; Anthropic's smallest cap is 1; the engine's own alternatives to a prompt
    // count as input.
    let cases: Vec<(&str, Value)> = vec![
        (
            "/v1/chat/completions",
            json!({"model": "mock-model", "messages": msgs, "max_tokens": 0, "n": 1,
                "temperature": 0, "top_p": 1, "stream": null, "max_completion_tokens": null}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "mock-model", "messages": msgs, "max_completion_tokens": 2,
                "temperature": null, "top_p": 0, "n": null}),
        ),
        (
            "/v1/messages",
            json!({"model": "mock-model", "messages": msgs, "max_tokens": 1, "temperature": 1.0}),
        ),
        (
            "/v1/completions",
            json!({"model": "mock-model", "prompt": [[1, 2], [3]], "max_tokens": 0, "top_p": null}),
        ),
        (
            "/generate",
            json!({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 0,
                "temperature": 0.0, "top_p": 1}}),
        ),
        ("/generate", json!({"text": "a", "sampling_params": null})),
    ];
    for (i, (path, body)) in cases.iter().enumerate() {
        let r = gw.post(path, body).await;
        assert_ne!(
            error_code(&r),
            "invalid_request",
            "{path} {body}: refused by the gateway: {}",
            r.text()
        );
        let got = fleet
            .prefill
            .wait_records(i + 1, Duration::from_secs(5))
            .await;
        assert!(
            got.len() > i && got[i].path == *path,
            "{path} {body} did not reach the prefill: {:?}",
            got.iter().map(|r| &r.path).collect::<Vec<_>>()
        );
    }
}

/// What the raw engines answer every leg with: a complete chat completion.
const CHAT_ANSWER: &str = r#"{"id":"chatcmpl-raw","object":"chat.completion","created":0,"model":"mock-model","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_reach_both_legs_byte_for_byte() {
    // Raw engines keep the bytes each leg carried (the mock engines keep parsed JSON, which
    // cannot tell `2.50` from `2.5`).
    let prefill = RawEngine::spawn([127, 0, 0, 2]).await;
    let decode = RawEngine::spawn([127, 0, 0, 3]).await;
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{CHAT_ANSWER}",
        CHAT_ANSWER.len()
    );
    for e in [&prefill, &decode] {
        e.answer_with(&[answer.as_bytes()]);
    }
    let mut p = prefill.spec("prefill");
    p["bootstrap_port"] = Value::Null;
    let mut gw = Gateway::start(&[p, decode.spec("decode")], "").await;
    gw.wait_ready().await;

    // Unknown fields: odd spacing, number spellings, escapes, and checked names nested where no
    // rule looks (a rule reads its own field only).
    let unknown = [
        r#""x_tool_state" : {"k" :  [1, 2.50, 1e2, -0], "messages": "not-a-list", "max_tokens": -1}"#,
        r#""x_note":"caf\u00e9 \"q\"""#,
        r#""logit_bias":{"50256":-100}"#,
    ];
    let body = format!(
        r#"{{"model":"mock-model","messages":[{{"role":"user","content":"hi","x_meta":{{"role":5}}}}],{},"max_tokens":2,{},"temperature":0.70,{}}}"#,
        unknown[0], unknown[1], unknown[2]
    );
    let r = post_raw(&gw, "/v1/chat/completions", body.as_bytes()).await;
    assert_eq!(r.status, 200, "{}\n{}", r.text(), gw.log());
    assert_eq!(r.text(), CHAT_ANSWER);

    for (leg, engine) in [("prefill", &prefill), ("decode", &decode)] {
        let deadline = Instant::now() + Duration::from_secs(5);
        let received = loop {
            let got = engine.received();
            if !got.is_empty() || Instant::now() > deadline {
                break got;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let (path, sent) = received
            .first()
            .unwrap_or_else(|| panic!("the {leg} leg never arrived"));
        assert_eq!(path, "/v1/chat/completions", "{leg}");
        let sent = String::from_utf8_lossy(sent);
        for field in unknown
            .iter()
            .chain(&[r#""temperature":0.70"#, r#""x_meta":{"role":5}"#])
        {
            assert!(
                sent.contains(field),
                "{leg} leg lost or changed {field}:\n{sent}"
            );
        }
    }
}
