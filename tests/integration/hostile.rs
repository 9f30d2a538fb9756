//! Hostile input against the real gateway (issue 9, "bad input never hurts"): malformed and
//! wrong-typed JSON, huge numbers, deep nesting, invalid UTF-8, slowloris bodies, request
//! smuggling and oversized headers. Each is refused with the 4xx a client should see, before any
//! engine is contacted, and the gateway keeps serving (its process alive, no panic in its log).
//!
//! HTTP-level cases go over a raw `TcpStream`: a well-behaved client library would not send them.
//! Those are answered by Pingora itself, before pdgate's code runs; the statuses asserted are
//! Pingora 0.9's (`pingora-core` `v1/server.rs` `read_request`/`validate_request`, and
//! `pingora-proxy` answering any `InvalidHTTPHeader` with 400 and closing the connection).

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::{
    assert_no_engine_contacted, error_code, gateway_for, post_raw, Gateway, SglangFleet,
};

/// Short body deadline (slowloris cases) and a small body cap (413 cases); the rest defaults.
const HOSTILE_CONFIG: &str = "  body_read_timeout_secs: 2\n  max_payload_size: 65536\n";

/// A request every case is followed by: the gateway must still serve it.
fn good_request() -> Value {
    json!({"text": "still serving?", "sampling_params": {"max_new_tokens": 2}})
}

async fn hostile_gateway(fleet: &SglangFleet) -> Gateway {
    gateway_for(fleet, HOSTILE_CONFIG).await
}

/// Whether the `pdgate run` process of `gw` is alive (not exited, not a zombie), found by its
/// config path in `/proc/*/cmdline` (the harness keeps the child handle to itself).
fn gateway_process_alive(gw: &Gateway) -> bool {
    let needle = format!("pdgate-{}.yaml", gw.port);
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    procs.flatten().any(|p| {
        let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(p.path().join("stat")).unwrap_or_default();
        let state = stat.rsplit(") ").next().and_then(|s| s.chars().next());
        String::from_utf8_lossy(&cmdline).contains(&needle) && !matches!(state, Some('Z' | 'X'))
    })
}

/// The gateway is alive, serves a good PD request, and logged no panic.
async fn assert_still_serving(gw: &Gateway, fleet: &SglangFleet, after: &str) {
    assert!(
        gateway_process_alive(gw),
        "pdgate died after {after}\n{}",
        gw.log()
    );
    let r = gw.post("/generate", &good_request()).await;
    assert_eq!(r.status, 200, "good request after {after}: {}", r.text());
    assert_eq!(gw.get("/liveness").await.status, 200, "after {after}");
    let log = gw.log();
    assert!(
        !log.contains("panicked"),
        "pdgate panicked after {after}\n{log}"
    );
    let served = fleet
        .prefill
        .records()
        .iter()
        .any(|r| r.body["text"] == good_request()["text"]);
    assert!(
        served,
        "the good request after {after} did not reach the prefill"
    );
}

/// `{"a":[[[…]]]}` nested `depth` levels below the top object.
fn nested(depth: usize) -> Vec<u8> {
    format!("{{\"a\":{}{}}}", "[".repeat(depth), "]".repeat(depth)).into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_wrong_typed_bodies_get_400_before_any_engine() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = hostile_gateway(&fleet).await;
    let forty_digits = "1234567890123456789012345678901234567890";
    // (what, route, body, code). Every body is read whole and validated once, exactly as
    // serde_json reads JSON, before a worker is chosen: not JSON is `json_parse_error`; JSON with
    // a field the gateway reads of the wrong type or range is `invalid_request`. Both are 400,
    // a client error the client must fix, never retried.
    let cases: Vec<(&str, &str, Vec<u8>, &str)> = vec![
        (
            "truncated JSON",
            "/generate",
            br#"{"text": "hi""#.to_vec(),
            "json_parse_error",
        ),
        (
            "trailing garbage",
            "/generate",
            br#"{"text":"hi"} x"#.to_vec(),
            "json_parse_error",
        ),
        (
            "trailing comma",
            "/v1/completions",
            br#"{"prompt":"a",}"#.to_vec(),
            "json_parse_error",
        ),
        (
            "single quotes",
            "/generate",
            br#"{'text':'hi'}"#.to_vec(),
            "json_parse_error",
        ),
        ("empty body", "/generate", Vec::new(), "json_parse_error"),
        (
            "invalid UTF-8 in a string",
            "/generate",
            b"{\"text\":\"\xff\xfe\"}".to_vec(),
            "json_parse_error",
        ),
        (
            "invalid UTF-8 in a key",
            "/v1/chat/completions",
            b"{\"mo\xc3del\":\"m\"}".to_vec(),
            "json_parse_error",
        ),
        (
            "lone surrogate escape",
            "/generate",
            br#"{"text":"\ud800"}"#.to_vec(),
            "json_parse_error",
        ),
        (
            "raw control character",
            "/generate",
            b"{\"text\":\"a\x01b\"}".to_vec(),
            "json_parse_error",
        ),
        (
            "number out of f64 range",
            "/v1/completions",
            br#"{"prompt":"a","max_tokens":1e400}"#.to_vec(),
            "json_parse_error",
        ),
        (
            "200 levels of nesting",
            "/generate",
            nested(200),
            "json_parse_error",
        ),
        (
            "200 levels of objects",
            "/v1/chat/completions",
            format!("{}1{}", r#"{"a":"#.repeat(200), "}".repeat(200)).into_bytes(),
            "json_parse_error",
        ),
        (
            "n: -1",
            "/v1/chat/completions",
            br#"{"model":"m","messages":[],"n":-1}"#.to_vec(),
            "invalid_request",
        ),
        (
            "n: 40 digits",
            "/v1/chat/completions",
            format!(r#"{{"messages":[],"n":{forty_digits}}}"#).into_bytes(),
            "invalid_request",
        ),
        (
            "n: 1e2",
            "/v1/completions",
            br#"{"prompt":"a","n":1e2}"#.to_vec(),
            "invalid_request",
        ),
        (
            "n: 1025",
            "/v1/chat/completions",
            br#"{"messages":[],"n":1025}"#.to_vec(),
            "invalid_request",
        ),
        (
            "stream: 3",
            "/v1/chat/completions",
            br#"{"messages":[],"stream":3}"#.to_vec(),
            "invalid_request",
        ),
        (
            "stream: \"true\"",
            "/generate",
            br#"{"text":"a","stream":"true"}"#.to_vec(),
            "invalid_request",
        ),
        (
            "model: 5",
            "/v1/completions",
            br#"{"model":5,"prompt":"a"}"#.to_vec(),
            "invalid_request",
        ),
        (
            "model: {}",
            "/v1/messages",
            br#"{"model":{},"messages":[]}"#.to_vec(),
            "invalid_request",
        ),
        (
            "text: 5",
            "/generate",
            br#"{"text":5}"#.to_vec(),
            "invalid_request",
        ),
        (
            "input_ids mixed",
            "/generate",
            br#"{"input_ids":[1,[2]]}"#.to_vec(),
            "invalid_request",
        ),
        (
            "prompt: {}",
            "/v1/completions",
            br#"{"prompt":{}}"#.to_vec(),
            "invalid_request",
        ),
        (
            "return_logprob: 1",
            "/generate",
            br#"{"text":"a","return_logprob":1}"#.to_vec(),
            "invalid_request",
        ),
        (
            "request_id: []",
            "/v1/chat/completions",
            br#"{"messages":[],"request_id":[]}"#.to_vec(),
            "invalid_request",
        ),
    ];
    for (what, path, body, code) in &cases {
        let r = post_raw(&gw, path, body).await;
        assert_eq!(r.status, 400, "{what}: {}", r.text());
        if path.starts_with("/v1/messages") {
            // Anthropic's shape (SMG 1.13.0): the code is in the header only.
            assert_eq!(r.json()["type"], "error", "{what}: {}", r.text());
            assert_eq!(
                r.json()["error"]["type"],
                "invalid_request_error",
                "{what}: {}",
                r.text()
            );
        } else {
            assert_eq!(error_code(&r), *code, "{what}: {}", r.text());
        }
        assert_eq!(r.header("x-smg-error-code"), Some(*code), "{what}");
        assert_no_engine_contacted(&fleet, what);
    }
    // Valid JSON that is not an object: 400. The gateway answers `json_parse_error` ("the JSON
    // body must be an object"); the catalogue's doc also allows `invalid_request` for it.
    for body in [&b"[1,2]"[..], b"\"text\"", b"42", b"null", b" true "] {
        let r = post_raw(&gw, "/generate", body).await;
        assert_eq!(
            r.status,
            400,
            "{:?}: {}",
            String::from_utf8_lossy(body),
            r.text()
        );
        assert!(
            ["json_parse_error", "invalid_request"].contains(&error_code(&r).as_str()),
            "{}",
            r.text()
        );
    }
    assert_no_engine_contacted(&fleet, "non-object bodies");
    assert_still_serving(&gw, &fleet, "malformed bodies").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_typed_handoff_fields_are_replaced_never_forwarded() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = hostile_gateway(&fleet).await;
    // The handoff belongs to the gateway: whatever a client puts in these fields, of any type,
    // is stripped and replaced by the gateway's own (README "Security defaults"). So the right
    // answer is not a 4xx but a normal 200 whose legs carry only the gateway's values.
    let forged = json!({"text": "hi", "sampling_params": {"max_new_tokens": 2},
        "bootstrap_room": "x", "bootstrap_host": 5, "bootstrap_port": "x",
        "routed_dp_rank": {"a": 1}, "disagg_prefill_dp_rank": -1, "data_parallel_rank": 3,
        "kv_transfer_params": []});
    let r = gw.post("/generate", &forged).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let p = fleet.prefill.wait_records(1, Duration::from_secs(5)).await;
    let d = fleet.decode.wait_records(1, Duration::from_secs(5)).await;
    let (p, d) = (&p[0].body, &d[0].body);
    let room = p["bootstrap_room"]
        .as_u64()
        .expect("an integer room on the prefill leg");
    assert!(room <= i64::MAX as u64);
    assert_eq!(
        d["bootstrap_room"].as_u64(),
        Some(room),
        "legs carry different rooms"
    );
    assert_eq!(p["bootstrap_host"], json!(fleet.prefill.host()));
    assert_eq!(d["bootstrap_port"], json!(fleet.prefill.bootstrap_port()));
    for leg in [p, d] {
        assert!(
            leg.get("kv_transfer_params").is_none(),
            "client params forwarded: {leg}"
        );
        assert!(
            leg.get("routed_dp_rank").is_none(),
            "client DP rank forwarded: {leg}"
        );
        assert!(
            leg.get("disagg_prefill_dp_rank").is_none(),
            "client DP rank forwarded: {leg}"
        );
        assert!(
            leg.get("data_parallel_rank").is_none(),
            "client DP rank forwarded under SGLang's deprecated name: {leg}"
        );
    }

    // A huge cap has the right shape (a non-negative integer); whether it fits the model is the
    // engine's to judge: it reaches the engines, and their 400 reaches the client as a 400
    // (never a 5xx).
    let huge = r#"{"model":"mock-model","prompt":"a","max_tokens":1234567890123456789012345678901234567890}"#;
    let r = post_raw(&gw, "/v1/completions", huge.as_bytes()).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_still_serving(&gw, &fleet, "forged handoff fields").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_client_kv_transfer_params_of_any_type_are_replaced() {
    use mock_engine::{Connector, EngineKind, MockEngine, MockEngineConfig, Role};
    let spawn = |role, ip: [u8; 4]| {
        MockEngine::spawn(
            MockEngineConfig::test(EngineKind::Vllm, role, ip).with_connector(Connector::Nixl),
        )
    };
    let prefill = spawn(Role::Prefill, [127, 0, 0, 2]).await.unwrap();
    let decode = spawn(Role::Decode, [127, 0, 0, 3]).await.unwrap();
    let mut gw = Gateway::start(
        &[prefill.worker_spec(), decode.worker_spec()],
        HOSTILE_CONFIG,
    )
    .await;
    gw.wait_ready().await;
    for (i, forged) in [
        json!([]),
        json!("x"),
        json!(7),
        json!({"do_remote_prefill": true,
        "remote_engine_id": "evil", "remote_block_ids": [[1]], "remote_host": "203.0.113.9"}),
    ]
    .into_iter()
    .enumerate()
    {
        let body = json!({"model": "mock-model", "prompt": "a", "max_tokens": 2,
            "kv_transfer_params": forged});
        let r = gw.post("/v1/completions", &body).await;
        assert_eq!(r.status, 200, "{forged}: {}", r.text());
        let p = prefill.wait_records(i + 1, Duration::from_secs(5)).await;
        let tag = &p[i].body["kv_transfer_params"];
        assert_eq!(
            tag,
            &json!({"do_remote_decode": true, "do_remote_prefill": false}),
            "the prefill leg did not get the gateway's NIXL tag for {forged}"
        );
        let d = decode.wait_records(i + 1, Duration::from_secs(5)).await;
        let params = &d[i].body["kv_transfer_params"];
        assert_ne!(params, &forged, "client params reached the decode");
        assert_ne!(params["remote_engine_id"], json!("evil"));
    }
}

/// What came back on a raw connection.
struct RawReply {
    bytes: Vec<u8>,
    /// The server closed the connection (EOF or reset) before the read deadline.
    closed: bool,
}

impl RawReply {
    /// The status of the first response, if one arrived.
    fn status(&self) -> Option<u16> {
        let text = std::str::from_utf8(self.bytes.get(..12)?).ok()?;
        text.strip_prefix("HTTP/1.")?.get(2..5)?.parse().ok()
    }

    /// How many responses arrived (status lines at a response boundary).
    fn responses(&self) -> usize {
        let text = String::from_utf8_lossy(&self.bytes);
        usize::from(text.starts_with("HTTP/1.")) + text.matches("\r\nHTTP/1.").count()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// Writes `parts` (pausing `gap` between them) on a fresh connection while reading until the
/// server closes or `read_for` has passed. Write errors are ignored: a server may rightly close
/// before taking everything a hostile client sends.
async fn raw_exchange(
    gw: &Gateway,
    parts: Vec<Vec<u8>>,
    gap: Duration,
    read_for: Duration,
) -> RawReply {
    let stream = TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .expect("connect to the gateway");
    let (mut rd, mut wr) = stream.into_split();
    let writer = tokio::spawn(async move {
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(gap).await;
            }
            if wr.write_all(part).await.is_err() {
                return;
            }
        }
        // Keep the write half open (no FIN): a slowloris client never finishes.
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(wr);
    });
    let mut bytes = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let end = Instant::now() + read_for;
    let closed = loop {
        let left = end.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rd.read(&mut buf)).await {
            Err(_) => break false,
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => bytes.extend_from_slice(&buf[..n]),
        }
    };
    writer.abort();
    RawReply { bytes, closed }
}

async fn raw(gw: &Gateway, request: impl Into<Vec<u8>>) -> RawReply {
    raw_exchange(
        gw,
        vec![request.into()],
        Duration::ZERO,
        Duration::from_secs(5),
    )
    .await
}

const BODY: &str = r#"{"text":"hi","sampling_params":{"max_new_tokens":2}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_bodies_get_408_and_free_the_gateway() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = hostile_gateway(&fleet).await;
    // Declares a 62-byte body, sends 4 bytes, then one byte every 500 ms: each byte arrives well
    // within any per-read timeout, but the body deadline (2 s here) covers the whole body. 408 is
    // the status for "the client did not send its request in time" (RFC 9110 §15.5.9).
    let head = format!(
        "POST /generate HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{{\"te",
        BODY.len() + 10
    );
    let mut parts = vec![head.into_bytes()];
    parts.extend((0..20).map(|_| b" ".to_vec()));
    let started = Instant::now();
    let reply = raw_exchange(
        &gw,
        parts,
        Duration::from_millis(500),
        Duration::from_secs(8),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(reply.status(), Some(408), "trickled body: {}", reply.text());
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(6),
        "408 after {took:?}, not at the 2 s body deadline"
    );
    assert!(reply.closed, "connection left open after a timed-out body");

    // Declares a body and sends none of it.
    let head = "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 100\r\n\r\n";
    let reply = raw_exchange(
        &gw,
        vec![head.into()],
        Duration::ZERO,
        Duration::from_secs(8),
    )
    .await;
    assert_eq!(reply.status(), Some(408), "silent body: {}", reply.text());

    // A chunked body whose last chunk never comes.
    let head =
        "POST /generate HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"te\r\n";
    let reply = raw_exchange(
        &gw,
        vec![head.into()],
        Duration::ZERO,
        Duration::from_secs(8),
    )
    .await;
    assert_eq!(
        reply.status(),
        Some(408),
        "unfinished chunked body: {}",
        reply.text()
    );

    assert_no_engine_contacted(&fleet, "slowloris");
    assert_still_serving(&gw, &fleet, "slowloris bodies").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_get_413_before_any_engine() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = hostile_gateway(&fleet).await;
    // 413 Content Too Large (RFC 9110 §15.5.14): over `max_payload_size` (64 KiB here), decided
    // from Content-Length before reading, or while reading a chunked body.
    let big = format!(r#"{{"text":"{}"}}"#, "a".repeat(70 * 1024));
    let r = post_raw(&gw, "/generate", big.as_bytes()).await;
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(error_code(&r), "request_body_too_large");

    let head = "POST /generate HTTP/1.1\r\nHost: gw\r\nContent-Length: 99999999999\r\n\r\n";
    let reply = raw(&gw, head).await;
    assert_eq!(
        reply.status(),
        Some(413),
        "huge declared length: {}",
        reply.text()
    );

    let mut chunked =
        b"POST /generate HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..20 {
        chunked.extend_from_slice(format!("1000\r\n{}\r\n", "a".repeat(0x1000)).as_bytes());
    }
    let reply = raw(&gw, chunked).await;
    assert_eq!(
        reply.status(),
        Some(413),
        "chunked over the cap: {}",
        reply.text()
    );

    assert_no_engine_contacted(&fleet, "oversized bodies");
    assert_still_serving(&gw, &fleet, "oversized bodies").await;
}

/// A request with `headers` (each `Name: value`, no CRLF) and `body` on `path`.
fn http1(path: &str, headers: &[&str], body: &str) -> Vec<u8> {
    let mut r = format!("POST {path} HTTP/1.1\r\nHost: gw\r\n");
    for h in headers {
        r.push_str(h);
        r.push_str("\r\n");
    }
    r.push_str("\r\n");
    r.push_str(body);
    r.into_bytes()
}

/// `body` in one chunk, then the last chunk.
fn chunk(body: &str) -> String {
    format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len())
}

/// Reads one response with a `Content-Length` body from `stream`: its status and body.
async fn read_one_response(stream: &mut TcpStream) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&bytes[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .expect("a content-length answer");
            if bytes.len() >= end + 4 + length {
                let status = head[9..12].parse().expect("a status line");
                let body = String::from_utf8_lossy(&bytes[end + 4..end + 4 + length]);
                return (status, body.into_owned());
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => bytes.extend_from_slice(&buf[..n]),
            other => panic!(
                "no whole response ({other:?}) after {:?}",
                String::from_utf8_lossy(&bytes)
            ),
        }
    }
}

/// The gateway reads the first bytes of each request itself (while it waits for one) and hands
/// them to Pingora's parser. A request whose first byte comes alone, whose head is split and
/// whose body comes after a pause is served whole, and so is the next one on the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_arrives_in_pieces_is_served_and_the_connection_goes_on() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = hostile_gateway(&fleet).await;
    let length = format!("Content-Length: {}", BODY.len());
    let request = http1(
        "/generate",
        &["Content-Type: application/json", &length],
        BODY,
    );
    let head_end = request.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let mut stream = TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .expect("connect to the gateway");
    stream.set_nodelay(true).unwrap();
    for piece in [
        &request[..1],
        &request[1..20],
        &request[20..head_end],
        &request[head_end..],
    ] {
        stream.write_all(piece).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, body) = read_one_response(&mut stream).await;
    assert_eq!(status, 200, "the request sent in pieces: {body}");
    stream.write_all(&request).await.unwrap();
    let (status, body) = read_one_response(&mut stream).await;
    assert_eq!(status, 200, "the next request on the connection: {body}");
    let reached = fleet
        .prefill
        .records()
        .iter()
        .filter(|r| r.body["text"] == "hi")
        .count();
    assert_eq!(reached, 2, "both requests reach the prefill whole");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_framing_and_bad_headers_get_400_and_a_closed_connection() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = hostile_gateway(&fleet).await;
    let len = BODY.len();
    let smuggled = "GET /workers HTTP/1.1\r\nHost: gw\r\n\r\n";
    // Pingora refuses each of these while parsing the head (`InvalidHTTPHeader`) with a bare
    // 400 and closes the connection: RFC 9112 §6.3 makes differing Content-Lengths and a final
    // coding other than chunked unrecoverable framing errors (400 and close), and §5.2 lets a
    // server reject obs-fold with 400. A malformed chunk is found while pdgate reads the body
    // (400 `invalid_request`, connection closed). Nothing is forwarded, and anything pipelined
    // behind the request is never parsed.
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "duplicate differing Content-Length",
            http1(
                "/generate",
                &[&format!("Content-Length: {len}"), "Content-Length: 4"],
                &format!("{BODY}{smuggled}"),
            ),
        ),
        (
            "comma-listed differing Content-Length",
            http1("/generate", &[&format!("Content-Length: {len}, 4")], BODY),
        ),
        (
            "negative Content-Length",
            http1("/generate", &["Content-Length: -1"], BODY),
        ),
        (
            "non-numeric Content-Length",
            http1("/generate", &["Content-Length: 1x"], BODY),
        ),
        (
            "obs-fold header",
            http1(
                "/generate",
                &[&format!("Content-Length: {len}"), "X-Folded: a", " b"],
                BODY,
            ),
        ),
        (
            "obs-fold on Transfer-Encoding",
            http1(
                "/generate",
                &["Transfer-Encoding: identity", " chunked"],
                &chunk(BODY),
            ),
        ),
        (
            "final coding not chunked",
            http1("/generate", &["Transfer-Encoding: chunked, gzip"], BODY),
        ),
        (
            "Transfer-Encoding: gzip only",
            http1("/generate", &["Transfer-Encoding: gzip"], BODY),
        ),
        (
            "Transfer-Encoding on HTTP/1.0",
            format!(
                "POST /generate HTTP/1.0\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n{}",
                chunk(BODY)
            )
            .into_bytes(),
        ),
        (
            "space before the colon",
            http1("/generate", &[&format!("Content-Length : {len}")], BODY),
        ),
        (
            "invalid chunk size",
            http1(
                "/generate",
                &["Transfer-Encoding: chunked"],
                &format!("zz\r\n{BODY}\r\n0\r\n\r\n"),
            ),
        ),
        (
            "chunk size overflow",
            http1(
                "/generate",
                &["Transfer-Encoding: chunked"],
                &format!("ffffffffffffffffffff\r\n{BODY}\r\n0\r\n\r\n"),
            ),
        ),
        (
            "NUL in a header value",
            http1(
                "/generate",
                &["X-A: a\0b", &format!("Content-Length: {len}")],
                BODY,
            ),
        ),
    ];
    for (what, request) in cases {
        let reply = raw(&gw, request).await;
        assert_eq!(reply.status(), Some(400), "{what}: {}", reply.text());
        assert_eq!(
            reply.responses(),
            1,
            "{what}: a pipelined request was answered: {}",
            reply.text()
        );
        assert!(
            reply.closed,
            "{what}: connection kept open after a framing error"
        );
        assert_no_engine_contacted(&fleet, what);
    }
    assert_still_serving(&gw, &fleet, "framing errors").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_with_transfer_encoding_is_not_smuggled() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = hostile_gateway(&fleet).await;
    // CL.TE: a front end honouring Content-Length (4) would forward `5c\r\n` as the body and
    // see the rest as a second request; a back end honouring chunked reads the whole chunk.
    // Pingora follows RFC 9112 §6.1/§6.3: Transfer-Encoding wins, Content-Length is dropped, and
    // the connection is closed after the response. So exactly one request is served (the
    // chunked body), and the bytes after the last chunk are never parsed as a request.
    let smuggled = "POST /generate HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\n\r\n{}";
    let request = http1(
        "/generate",
        &[
            "Content-Type: application/json",
            "Content-Length: 4",
            "Transfer-Encoding: chunked",
        ],
        &format!("{}{smuggled}", chunk(BODY)),
    );
    let reply = raw(&gw, request).await;
    let status = reply
        .status()
        .unwrap_or_else(|| panic!("no response: {}", reply.text()));
    assert!(status == 200 || status == 400, "CL+TE: {}", reply.text());
    assert_eq!(
        reply.responses(),
        1,
        "the smuggled request was answered: {}",
        reply.text()
    );
    assert!(reply.closed, "connection kept open after CL+TE");
    let p = fleet.prefill.records();
    assert!(
        p.len() <= 1,
        "more than one request reached the prefill: {p:?}"
    );
    for r in &p {
        assert_eq!(r.body["text"], json!("hi"), "a smuggled body was forwarded");
    }
    // TE.CL: chunked first, then a Content-Length: same rule, same outcome.
    let request = http1(
        "/generate",
        &["Transfer-Encoding: chunked", "Content-Length: 200"],
        &format!("{}{smuggled}", chunk(BODY)),
    );
    let reply = raw(&gw, request).await;
    assert_eq!(reply.responses(), 1, "TE.CL: {}", reply.text());
    assert!(reply.closed, "TE.CL: connection kept open");
    assert_still_serving(&gw, &fleet, "CL+TE").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_with_transfer_encoding_is_refused_with_400() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = hostile_gateway(&fleet).await;
    let request = http1(
        "/generate",
        &[
            "Content-Type: application/json",
            "Content-Length: 4",
            "Transfer-Encoding: chunked",
        ],
        &chunk(BODY),
    );
    let reply = raw(&gw, request).await;
    assert_eq!(reply.status(), Some(400), "CL+TE: {}", reply.text());
    assert_no_engine_contacted(&fleet, "CL+TE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_headers_get_400_and_a_closed_connection() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = hostile_gateway(&fleet).await;
    // Pingora caps the request head at 1 MiB and 256 header fields and answers either excess
    // with 400 (`InvalidHTTPHeader`), not 431. RFC 9110 §15.5 lets a server pick any 4xx for a
    // head it will not process; what matters to a client is a 4xx it must fix, the connection
    // closed, and nothing forwarded.
    let huge_value = format!("X-Big: {}", "a".repeat(1024 * 1024 + 512));
    let reply = raw(&gw, http1("/generate", &[&huge_value], "")).await;
    assert_eq!(reply.status(), Some(400), "1 MiB header: {}", reply.text());
    assert!(reply.closed, "1 MiB header: connection kept open");

    let many: Vec<String> = (0..300).map(|i| format!("X-H{i}: v")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let reply = raw(&gw, http1("/generate", &many, "")).await;
    assert_eq!(reply.status(), Some(400), "300 headers: {}", reply.text());
    assert!(reply.closed, "300 headers: connection kept open");

    let long_path = format!("/generate?{}", "q".repeat(1024 * 1024 + 512));
    let reply = raw(&gw, http1(&long_path, &[], "")).await;
    assert_eq!(
        reply.status(),
        Some(400),
        "1 MiB request line: {}",
        reply.text()
    );

    assert_no_engine_contacted(&fleet, "oversized headers");
    assert_still_serving(&gw, &fleet, "oversized headers").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_slowloris_body_gets_408() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = hostile_gateway(&fleet).await;
    let head = "POST /v1/messages/count_tokens HTTP/1.1\r\nHost: gw\r\n\
        Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"mo";
    let mut parts = vec![head.as_bytes().to_vec()];
    parts.extend((0..20).map(|_| b" ".to_vec()));
    let started = Instant::now();
    let reply = raw_exchange(
        &gw,
        parts,
        Duration::from_millis(500),
        Duration::from_secs(8),
    )
    .await;
    assert_eq!(
        reply.status(),
        Some(408),
        "after {:?}: {}",
        started.elapsed(),
        reply.text()
    );
    assert!(reply.closed, "connection left open after a timed-out body");
    assert_still_serving(&gw, &fleet, "a count_tokens slowloris body").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_values_in_headers_the_gateway_reads_are_not_forwarded() {
    let fleet = SglangFleet::start(|_| {}).await;
    let gw = hostile_gateway(&fleet).await;
    // Request ids and routing keys are client input too: invalid ones (not visible ASCII, too
    // long) are ignored, the request is served, and only a clean id reaches the engines.
    let long = "r".repeat(300);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "obs-text request id",
            b"X-Request-Id: \xff\xfe\x80id".to_vec(),
        ),
        (
            "300-byte request id",
            format!("X-Request-Id: {long}").into_bytes(),
        ),
        ("tab in request id", b"X-Request-Id: a\tb".to_vec()),
        (
            "obs-text routing key",
            b"X-SMG-Routing-Key: \xc3\x28".to_vec(),
        ),
        (
            "10 KiB routing key",
            format!("X-SMG-Routing-Key: {}", "k".repeat(10 * 1024)).into_bytes(),
        ),
        (
            "garbage authorization",
            b"Authorization: Bearer \xff\x00".to_vec(),
        ),
    ];
    for (i, (what, header)) in cases.into_iter().enumerate() {
        let mut request = format!(
            "POST /generate HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n",
            BODY.len()
        )
        .into_bytes();
        request.extend_from_slice(&header);
        request.extend_from_slice(b"\r\n\r\n");
        request.extend_from_slice(BODY.as_bytes());
        let reply = raw(&gw, request).await;
        let status = reply.status();
        // A header value httparse itself refuses (NUL) is Pingora's 400; anything else is served.
        assert!(
            status == Some(200) || status == Some(400),
            "{what}: {}",
            reply.text()
        );
        if status == Some(200) {
            let p = fleet
                .prefill
                .wait_records(i + 1, Duration::from_secs(5))
                .await;
            let id = p
                .last()
                .and_then(|r| r.x_request_id.clone())
                .unwrap_or_default();
            assert!(
                !id.is_empty() && id.len() <= 256 && id.bytes().all(|b| (0x21..0x7f).contains(&b)),
                "{what}: forwarded request id {id:?}"
            );
            for r in &p {
                for (k, v) in &r.headers {
                    assert!(
                        v.bytes().all(|b| (0x20..0x7f).contains(&b)),
                        "{what}: header {k} forwarded with {v:?}"
                    );
                }
            }
        }
    }
    assert_still_serving(&gw, &fleet, "hostile header values").await;
}
