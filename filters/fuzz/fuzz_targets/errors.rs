//! Error helpers: `upstream_error_message`, `sse_error_event`, `render_error`,
//! `render_admin_error`, `prefill_server_error_message` and the status mappings.
//!
//! Input: 2 control bytes (the upstream status, big endian), then the upstream body.
//!
//! Properties: the message is the body's `error.message`, else its `message`, else the body as
//! lossy UTF-8, cut to at most 4096 bytes on a char boundary. The SSE error event is exactly one
//! `data:` line whose JSON is `{"error":{"message":<body as JSON, or as a string>,"status":s}}`.
//! Error bodies are valid JSON carrying the given code and message. Mappings keep the status.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdgate_filters::errors::{
    decode_error, prefill_error, prefill_server_error_message, render_admin_error, render_error,
    server_error, sse_error_event, upstream_error_message, ErrorCode, MAX_UPSTREAM_MESSAGE,
};
use pdgate_filters_fuzz::{assert_one_data_line_event, parse, split_control};
use serde_json::{json, Value};

fuzz_target!(|data: &[u8]| {
    let (c, body) = split_control::<2>(data);
    let status = u16::from_be_bytes(c);

    // upstream_error_message
    let msg = upstream_error_message(body);
    let from_json = parse(body).filter(Value::is_object).and_then(|v| {
        v.get("error")
            .and_then(|e| e.get("message"))
            .and_then(Value::as_str)
            .or_else(|| v.get("message").and_then(Value::as_str))
            .map(str::to_owned)
    });
    let full = from_json.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    assert!(
        msg.len() <= MAX_UPSTREAM_MESSAGE,
        "message longer than the cap"
    );
    assert!(
        full.starts_with(&msg),
        "message is not a prefix of the expected text"
    );
    if msg.len() < full.len() {
        assert!(
            msg.len() + 4 > MAX_UPSTREAM_MESSAGE,
            "cut more than one char short"
        );
    }

    // sse_error_event
    let ev = sse_error_event(status, body);
    let inner = assert_one_data_line_event(&ev);
    let v = parse(inner).expect("SSE error event data is JSON");
    let trimmed = body.trim_ascii();
    let want_msg = parse(trimmed)
        .filter(|_| !trimmed.is_empty())
        .unwrap_or_else(|| Value::String(String::from_utf8_lossy(body).into_owned()));
    assert_eq!(v, json!({"error":{"message":want_msg,"status":status}}));

    // Error bodies with arbitrary messages.
    let text = String::from_utf8_lossy(body);
    let code = ErrorCode::ALL[usize::from(c[0]) % ErrorCode::ALL.len()];
    let rendered = parse(&render_error(status, code.as_str(), &text)).expect("error body is JSON");
    // OpenAI's kinds, as SMG 1.13.0 writes them.
    let kind = if (400..500).contains(&status) {
        "invalid_request_error"
    } else {
        "server_error"
    };
    assert_eq!(
        rendered,
        json!({"error":{"type":kind,"code":code.as_str(),"message":text,"param":null}})
    );
    let admin = parse(&render_admin_error(code, &text)).expect("admin error body is JSON");
    assert_eq!(admin, json!({"error":text,"code":code.as_str()}));
    let m = prefill_server_error_message(status, body);
    assert!(m.starts_with(&format!("Prefill server error ({status} ")));

    for map in [decode_error, prefill_error, server_error] {
        let (s, code) = map(status);
        assert_eq!(s, status, "mapping changed the status");
        assert!(code.is_header_safe());
    }
});
