//! An engine that breaks HTTP/1.1 (issue 9, and the leg client's own framing): the decode leg is
//! a raw TCP server answering with exactly the bytes a case gives. Each broken answer becomes a
//! clean refusal (or, mid-stream, an SSE error event), the unusual-but-valid ones (interim 1xx
//! heads, chunk extensions and trailers, close-delimited bodies, bytes split across writes) are
//! relayed intact, and afterwards the gateway is alive, panic-free and holds no handoff open.

use std::time::{Duration, Instant};

use mock_engine::{EngineKind, MockEngine, MockEngineConfig, Role};
use serde_json::{json, Value};

use crate::harness::{Gateway, RawEngine};

fn chunk(data: &str) -> Vec<u8> {
    format!("{:x}\r\n{data}\r\n", data.len()).into_bytes()
}

const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
const EVENT: &str = "data: {\"text\":\"a\",\"meta_info\":{\"id\":\"x\"}}\n\n";

fn request(stream: bool) -> Value {
    json!({"text": "wire", "stream": stream, "sampling_params": {"max_new_tokens": 2}})
}

#[tokio::test]
async fn an_engine_that_breaks_http_framing_gets_a_clean_refusal_and_leaks_nothing() {
    let prefill = MockEngine::spawn(MockEngineConfig::test(
        EngineKind::Sglang,
        Role::Both,
        [127, 0, 0, 2],
    ))
    .await
    .expect("prefill mock");
    let decode = RawEngine::spawn([127, 0, 0, 3]).await;
    let workers = [
        json!({"url": prefill.api_url(), "worker_type": "prefill", "runtime_type": "sglang",
            "bootstrap_port": null}),
        decode.spec("decode"),
    ];
    let mut gw = Gateway::start(
        &workers,
        "  retry_max_retries: 1\n  disable_circuit_breaker: true\n  stream_idle_timeout_secs: 5\n",
    )
    .await;
    gw.wait_ready().await;

    let big_head = [
        b"HTTP/1.1 200 OK\r\nx-pad: ".as_slice(),
        &vec![b'a'; 70 * 1024],
        b"\r\n\r\n",
    ]
    .concat();
    // (what the engine sends, the status the client must get)
    let refused: [(&str, Vec<Vec<u8>>, u16); 5] = [
        (
            "conflicting content-length",
            vec![
                b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello".to_vec(),
            ],
            502,
        ),
        ("not HTTP", vec![b"SMTP ready\r\n\r\n".to_vec()], 502),
        ("a head over 64 KiB", vec![big_head], 502),
        ("closed before any head", vec![], 502),
        (
            "a body cut short",
            vec![b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"text\"".to_vec()],
            500,
        ),
    ];
    for (case, pieces, status) in refused {
        let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        decode.answer_with(&refs);
        let r = gw.post("/generate", &request(false)).await;
        assert_eq!(r.status, status, "{case}: {}", r.text());
        let body: Value = serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("{case}: error body is not JSON ({e}): {}", r.text()));
        assert!(body["error"]["message"].is_string(), "{case}: {body}");
    }

    // Broken chunked framing mid-stream: the first event is relayed, then an SSE error event,
    // and the chunked body is terminated (the client sees a complete response).
    for (case, bad) in [
        ("a chunk size that is not hex", b"zz\r\n".as_slice()),
        ("chunk data without its CRLF", b"3\r\nabcXY"),
    ] {
        let first = chunk(EVENT);
        decode.answer_with(&[SSE_HEAD, &first, bad]);
        let r = gw.stream("/generate", &request(true)).await;
        assert_eq!(r.status, 200, "{case}");
        let body = r
            .body_bytes()
            .await
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        let text = String::from_utf8_lossy(&body);
        // Exactly: the relayed event, then one error event, then the end of the body.
        let rest = text
            .strip_prefix(EVENT)
            .unwrap_or_else(|| panic!("{case}: the first event was not relayed: {text}"));
        let error = rest
            .strip_prefix("data: ")
            .and_then(|e| e.strip_suffix("\n\n"))
            .unwrap_or_else(|| panic!("{case}: not one SSE error event after it: {rest:?}"));
        let error: Value = serde_json::from_str(error)
            .unwrap_or_else(|e| panic!("{case}: error event is not JSON ({e}): {error}"));
        assert_eq!(
            error["error"]["code"], "decode_request_failed",
            "{case}: {error}"
        );
    }

    // Valid but unusual: an interim 100 head, chunk extensions, a trailer, the bytes split at
    // awkward places across writes. Relayed byte for byte.
    let events = [EVENT, "data: [DONE]\n\n"];
    let mut wire = b"HTTP/1.1 100 Continue\r\n\r\n".to_vec();
    wire.extend_from_slice(SSE_HEAD);
    wire.extend_from_slice(format!("{:x};ext=1\r\n{}\r\n", events[0].len(), events[0]).as_bytes());
    wire.extend_from_slice(&chunk(events[1]));
    wire.extend_from_slice(b"0\r\nx-trailer: t\r\n\r\n");
    let cuts = [7, 30, 95, 96, 140];
    let mut pieces: Vec<&[u8]> = Vec::new();
    let mut at = 0;
    for c in cuts.into_iter().chain([wire.len()]) {
        pieces.push(&wire[at..c]);
        at = c;
    }
    decode.answer_with(&pieces);
    let r = gw.stream("/generate", &request(true)).await;
    assert_eq!(r.status, 200);
    let body = r.body_bytes().await.expect("a complete stream");
    assert_eq!(String::from_utf8_lossy(&body), events.concat());

    // A body delimited by the engine closing the connection (no length, no chunking).
    let json_body = r#"{"text":"closed","meta_info":{"id":"y"}}"#;
    let whole = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{json_body}");
    decode.answer_with(&[whole.as_bytes()]);
    let r = gw.post("/generate", &request(false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), json_body);

    // Nothing hurt, nothing left open.
    assert_eq!(gw.get("/liveness").await.status, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let open = gw.get("/debug/handoffs").await;
        let v: Value = serde_json::from_slice(&open.body).unwrap_or(Value::Null);
        if v["open"] == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "handoffs still open: {v}\n{}",
            gw.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = gw.log();
    assert!(!log.contains("panicked"), "{log}");
}
