//! `canned-engine`: an SGLang-shaped HTTP/1.1 engine that costs next to nothing per request, so a
//! gateway's share of the CPU is not hidden behind the engines' (`mock-engine` spends ~85 µs per
//! call: hyper, JSON parsing, a tokenizer, request records).
//!
//! Every answer is a buffer built once at startup and written with one `write`: a chat completion
//! (`N` words, `usage`) for a non-streamed request, an SSE stream in chunked encoding for a request
//! whose body says `"stream":true` (`N` token events, one finish + usage event, `data: [DONE]`, each
//! event its own chunk, as SGLang sends them). The body is never parsed: a PD leg's
//! `bootstrap_host` / `bootstrap_port` / `bootstrap_room` are ignored, so a leg is answered as a
//! plain request (as `mock-engine --role both` does). What a gateway asks a worker when it
//! registers and health-checks it (`/health`, `/get_server_info`, `/v1/models`, `/v1/loads`, …)
//! gets canned SGLang bodies; the harness's `POST /mock/reset` a 200.
//!
//! One thread (a current-thread tokio runtime), one task per connection, keep-alive, requests
//! framed by `Content-Length` or chunked encoding.

use std::io;
use std::net::SocketAddr;
use std::rc::Rc;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the engine says about itself, and the shape of its answers.
pub struct CannedSpec {
    pub addr: SocketAddr,
    /// Output tokens of every answer: events of a streamed one, words of a non-streamed one.
    pub tokens: usize,
    /// The `prompt_tokens` every answer reports (the prompt is not tokenized).
    pub prompt_tokens: usize,
    pub model: String,
    /// Reported in `/get_server_info` (pdgate sizes a decode's admission window from it).
    pub max_running_requests: u32,
}

/// The preformatted responses, head and body in one buffer each.
struct Answers {
    completion: Vec<u8>,
    stream: Vec<u8>,
    health: Vec<u8>,
    server_info: Vec<u8>,
    models: Vec<u8>,
    model_info: Vec<u8>,
    loads: Vec<u8>,
    metrics: Vec<u8>,
    ok_json: Vec<u8>,
    not_found: Vec<u8>,
    bad_request: Vec<u8>,
}

fn response(status: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

fn json_response(v: &Value) -> Vec<u8> {
    response("200 OK", "application/json", v.to_string().as_bytes())
}

/// The token text of position `i`: short lowercase words, as the mocks emit.
fn token(i: usize) -> &'static str {
    const WORDS: [&str; 8] = [" ka", " lo", " mi", " nu", " ra", " se", " ti", " vo"];
    WORDS[i % WORDS.len()]
}

impl Answers {
    fn new(s: &CannedSpec) -> Answers {
        let created = 1_700_000_000u64;
        let usage = json!({
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.tokens,
            "total_tokens": s.prompt_tokens + s.tokens,
            "prompt_tokens_details": null,
        });
        let text: String = (0..s.tokens).map(token).collect();
        let completion = json!({
            "id": "canned-0", "object": "chat.completion", "created": created, "model": s.model,
            "choices": [{"index": 0,
                "message": {"role": "assistant", "content": text, "reasoning_content": null, "tool_calls": null},
                "logprobs": null, "finish_reason": "length", "matched_stop": null}],
            "usage": usage,
        });
        let chunk = |delta: Value, finish: Value, usage: Value| {
            json!({"id": "canned-0", "object": "chat.completion.chunk", "created": created,
                "model": s.model,
                "choices": [{"index": 0, "delta": delta, "logprobs": null,
                    "finish_reason": finish, "matched_stop": null}],
                "usage": usage})
        };
        let mut events: Vec<String> = (0..s.tokens)
            .map(|i| {
                let delta = if i == 0 {
                    json!({"role": "assistant", "content": token(i)})
                } else {
                    json!({"content": token(i)})
                };
                format!("data: {}\n\n", chunk(delta, Value::Null, Value::Null))
            })
            .collect();
        events.push(format!(
            "data: {}\n\n",
            chunk(json!({}), json!("length"), usage.clone())
        ));
        events.push("data: [DONE]\n\n".to_string());
        let mut stream = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        for e in &events {
            stream.extend_from_slice(format!("{:x}\r\n{e}\r\n", e.len()).as_bytes());
        }
        stream.extend_from_slice(b"0\r\n\r\n");

        let server_info = json!({
            "model_path": s.model, "served_model_name": s.model, "tokenizer_path": s.model,
            "host": s.addr.ip().to_string(), "port": s.addr.port(),
            "disaggregation_mode": "null", "disaggregation_bootstrap_port": 8998,
            "disaggregation_transfer_backend": "mooncake",
            "dp_size": 1, "tp_size": 1, "page_size": 1, "kv_cache_dtype": "auto",
            "max_running_requests": s.max_running_requests,
            "context_length": 1_000_000, "load_balance_method": "round_robin",
            "version": "0.0.0-canned", "weight_version": "default",
            "internal_states": [{"max_total_num_tokens": 1_000_000, "last_gen_throughput": 0.0}],
        });
        let models = json!({"object": "list", "data": [{"id": s.model, "object": "model",
            "created": 0, "owned_by": "sglang", "root": s.model, "parent": null,
            "max_model_len": 1_000_000}]});
        let model_info = json!({"model_path": s.model, "tokenizer_path": s.model,
            "is_generation": true, "preferred_sampling_params": null, "weight_version": "default",
            "has_image_understanding": false, "has_audio_understanding": false,
            "model_type": "mock", "architectures": ["MockForCausalLM"]});
        let loads = json!({"timestamp": "0.000", "version": "0.0.0-canned", "dp_rank_count": 1,
            "loads": [{"dp_rank": 0, "num_running_reqs": 0, "num_waiting_reqs": 0,
                "num_total_reqs": 0, "num_used_tokens": 0, "max_total_num_tokens": 1_000_000,
                "max_running_requests": s.max_running_requests, "token_usage": 0.0,
                "gen_throughput": 0.0, "cache_hit_rate": 0.0, "utilization": 0.0,
                "memory": null, "queues": null,
                "disagg": {"prefill_bootstrap_queue_reqs": 0, "decode_transfer_queue_reqs": 0}}],
            "aggregate": {"total_running_reqs": 0, "total_waiting_reqs": 0, "total_reqs": 0,
                "avg_token_usage": 0.0, "avg_throughput": 0.0, "avg_utilization": 0.0}});
        let metrics = "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 0\n\
                       # TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs 0\n\
                       # TYPE sglang:token_usage gauge\nsglang:token_usage 0\n";
        Answers {
            completion: json_response(&completion),
            stream,
            health: response("200 OK", "text/plain", b""),
            server_info: json_response(&server_info),
            models: json_response(&models),
            model_info: json_response(&model_info),
            loads: json_response(&loads),
            metrics: response(
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                metrics.as_bytes(),
            ),
            ok_json: response("200 OK", "application/json", b"{}"),
            not_found: response("404 Not Found", "text/plain", b"Not Found"),
            bad_request: response("400 Bad Request", "text/plain", b"bad request"),
        }
    }

    fn route(&self, method: &str, path: &str, body: &[u8]) -> &[u8] {
        let path = path.split('?').next().unwrap_or(path);
        match (method, path) {
            ("POST", p) if p.starts_with("/mock/") || p == "/flush_cache" => &self.ok_json,
            ("POST", _) if says_stream(body) => &self.stream,
            ("POST", _) => &self.completion,
            ("GET", "/health" | "/health_generate") => &self.health,
            ("GET", "/get_server_info" | "/server_info") => &self.server_info,
            ("GET", "/v1/models") => &self.models,
            ("GET", "/get_model_info" | "/model_info") => &self.model_info,
            ("GET", "/v1/loads" | "/get_load") => &self.loads,
            ("GET", "/metrics") => &self.metrics,
            _ => &self.not_found,
        }
    }
}

/// Whether a JSON body holds `"stream": true`. A byte search, not a parse: `"stream"` with its
/// quotes unescaped is a key or a string value (inside a prompt it would be `\"stream\"`), and only
/// the key is followed by `:`. Searched from the end, where serde_json's sorted keys put it.
fn says_stream(body: &[u8]) -> bool {
    const KEY: &[u8] = b"\"stream\"";
    let mut end = body.len();
    while end >= KEY.len() {
        let Some(q) = body[..end].iter().rposition(|&b| b == b'"') else {
            return false;
        };
        if q + 1 >= KEY.len() && &body[q + 1 - KEY.len()..=q] == KEY {
            let rest = body[q + 1..].trim_ascii_start();
            if let Some(v) = rest.strip_prefix(b":") {
                return v.trim_ascii_start().starts_with(b"true");
            }
        }
        end = q;
    }
    false
}

/// A complete request at the front of a buffer.
pub(crate) struct Request<'a> {
    pub(crate) method: &'a str,
    pub(crate) path: &'a str,
    /// The body as sent (chunked bodies keep their framing: only searched, never parsed).
    pub(crate) body: &'a [u8],
    /// Bytes of the buffer the request took.
    pub(crate) len: usize,
    pub(crate) close: bool,
}

/// `Ok(None)` until the buffer holds a whole request.
fn parse_request(buf: &[u8]) -> Result<Option<Request<'_>>, ()> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut headers);
    let head = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(()),
    };
    let (mut length, mut chunked, mut close) = (0usize, false, false);
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            length = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or(())?;
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = h.value.eq_ignore_ascii_case(b"chunked");
        } else if h.name.eq_ignore_ascii_case("connection") {
            close = h.value.eq_ignore_ascii_case(b"close");
        }
    }
    let body_len = if chunked {
        match chunked_len(&buf[head..])? {
            Some(n) => n,
            None => return Ok(None),
        }
    } else if buf.len() - head >= length {
        length
    } else {
        return Ok(None);
    };
    Ok(Some(Request {
        method: req.method.unwrap_or(""),
        path: req.path.unwrap_or(""),
        body: &buf[head..head + body_len],
        len: head + body_len,
        close: close || req.version == Some(0),
    }))
}

/// The length of a whole chunked body at the front of `buf` (chunks, last chunk, trailers), or
/// `None` while it is incomplete.
pub(crate) fn chunked_len(buf: &[u8]) -> Result<Option<usize>, ()> {
    let line_end = |from: usize| -> Option<usize> {
        buf.get(from..)?
            .windows(2)
            .position(|w| w == b"\r\n")
            .map(|i| from + i)
    };
    let mut pos = 0;
    loop {
        let Some(eol) = line_end(pos) else {
            return Ok(None);
        };
        let size = &buf[pos..eol];
        let size = size.split(|&b| b == b';').next().unwrap_or(size);
        let size = std::str::from_utf8(size).map_err(|_| ())?.trim();
        let size = usize::from_str_radix(size, 16).map_err(|_| ())?;
        pos = eol + 2;
        if size == 0 {
            // Trailers, then the empty line.
            loop {
                let Some(eol) = line_end(pos) else {
                    return Ok(None);
                };
                let empty = eol == pos;
                pos = eol + 2;
                if empty {
                    return Ok(Some(pos));
                }
            }
        }
        pos += size + 2;
        if pos > buf.len() {
            return Ok(None);
        }
    }
}

/// The requests of one keep-alive connection: what has been read and not yet answered, in a
/// buffer that grows to fit a whole request.
pub(crate) struct Requests {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Requests {
    pub(crate) fn new() -> Requests {
        Requests {
            buf: vec![0u8; 16 * 1024],
            start: 0,
            end: 0,
        }
    }

    /// The next whole request, `Ok(None)` until one has arrived, `Err` when it is malformed.
    pub(crate) fn next(&self) -> Result<Option<Request<'_>>, ()> {
        parse_request(&self.buf[self.start..self.end])
    }

    /// Drops the request just answered (`len` bytes).
    pub(crate) fn consume(&mut self, len: usize) {
        self.start += len;
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
    }

    /// Reads more of the connection; false at its end.
    pub(crate) async fn fill(&mut self, sock: &mut TcpStream) -> io::Result<bool> {
        if self.end == self.buf.len() {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                (self.start, self.end) = (0, self.end - self.start);
            } else {
                self.buf.resize(self.buf.len() * 2, 0);
            }
        }
        let n = sock.read(&mut self.buf[self.end..]).await?;
        self.end += n;
        Ok(n > 0)
    }
}

async fn serve_connection(mut sock: TcpStream, answers: Rc<Answers>) -> io::Result<()> {
    sock.set_nodelay(true)?;
    let mut requests = Requests::new();
    loop {
        match requests.next() {
            Ok(Some(req)) => {
                let answer = answers.route(req.method, req.path, req.body);
                let (len, close) = (req.len, req.close);
                sock.write_all(answer).await?;
                requests.consume(len);
                if close {
                    return Ok(());
                }
                continue;
            }
            Ok(None) => {}
            Err(()) => {
                sock.write_all(&answers.bad_request).await?;
                return Ok(());
            }
        }
        if !requests.fill(&mut sock).await? {
            return Ok(());
        }
    }
}

/// Serves until the process is killed. Runs on the calling thread (a current-thread runtime).
pub fn run(spec: CannedSpec) -> Result<(), String> {
    let answers = Rc::new(Answers::new(&spec));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let listener = TcpListener::bind(spec.addr)
            .await
            .map_err(|e| format!("bind {}: {e}", spec.addr))?;
        eprintln!("canned-engine listening on {}", spec.addr);
        loop {
            let (sock, _) = match listener.accept().await {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    eprintln!("canned-engine: accept: {e}");
                    tokio::task::yield_now().await;
                    continue;
                }
            };
            tokio::task::spawn_local(serve_connection(sock, Rc::clone(&answers)));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> CannedSpec {
        CannedSpec {
            addr: "127.0.0.1:1".parse().unwrap(),
            tokens: 4,
            prompt_tokens: 10,
            model: "mock-model".into(),
            max_running_requests: 100,
        }
    }

    #[test]
    fn stream_key_is_found_and_prompt_text_is_not() {
        assert!(says_stream(br#"{"model":"m","stream":true}"#));
        assert!(says_stream(br#"{"stream" : true, "x": 1}"#));
        assert!(!says_stream(br#"{"stream":false}"#));
        assert!(!says_stream(
            br#"{"messages":[{"content":"say \"stream\":true"}],"stream_options":{}}"#
        ));
        assert!(!says_stream(br#"{"content":"stream"}"#));
        assert!(!says_stream(b""));
    }

    #[test]
    fn requests_are_framed_by_length_and_by_chunks() {
        let req = b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcdGET /x";
        let r = parse_request(req).unwrap().unwrap();
        assert_eq!(
            (r.method, r.path, r.body, r.close),
            ("POST", "/v1/chat/completions", &b"abcd"[..], false)
        );
        assert!(parse_request(&req[r.len..]).unwrap().is_none());
        assert!(parse_request(&req[..req.len() - 8]).unwrap().is_none());

        let chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        let r = parse_request(chunked).unwrap().unwrap();
        assert_eq!((r.len, r.close), (chunked.len(), true));
        assert!(parse_request(&chunked[..chunked.len() - 2])
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_stream_answer_is_chunked_sse_ending_with_usage_and_done() {
        let a = Answers::new(&spec());
        let stream = a.route("POST", "/v1/chat/completions", br#"{"stream":true}"#);
        let text = std::str::from_utf8(stream).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains("transfer-encoding: chunked"), "{head}");
        assert_eq!(body.matches("data: ").count(), 4 + 2, "{body}");
        assert!(
            body.contains(r#""finish_reason":"length""#)
                && body.contains(r#""completion_tokens":4"#)
        );
        assert!(body.ends_with("data: [DONE]\n\n\r\n0\r\n\r\n"), "{body}");
        // The chunks' sizes add up to the framed bytes.
        assert_eq!(chunked_len(body.as_bytes()).unwrap(), Some(body.len()));

        let plain = a.route("POST", "/v1/chat/completions", br#"{"stream":false}"#);
        let (head, body) = std::str::from_utf8(plain)
            .unwrap()
            .split_once("\r\n\r\n")
            .unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let v: Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 4);
        assert_eq!(v["choices"][0]["message"]["content"], " ka lo mi nu");
    }

    #[test]
    fn registration_endpoints_answer_as_sglang() {
        let a = Answers::new(&spec());
        let body = |r: &[u8]| -> Value {
            let t = std::str::from_utf8(r).unwrap();
            serde_json::from_str(t.split_once("\r\n\r\n").unwrap().1).unwrap()
        };
        assert_eq!(
            body(a.route("GET", "/v1/models", b""))["data"][0]["owned_by"],
            "sglang"
        );
        assert_eq!(
            body(a.route("GET", "/get_server_info", b""))["max_running_requests"],
            100
        );
        assert_eq!(
            body(a.route("GET", "/server_info?config_format=json", b""))["dp_size"],
            1
        );
        assert!(a.route("GET", "/health", b"").starts_with(b"HTTP/1.1 200"));
        assert!(a.route("GET", "/version", b"").starts_with(b"HTTP/1.1 404"));
        assert!(a
            .route("POST", "/mock/reset", b"")
            .starts_with(b"HTTP/1.1 200"));
    }
}
