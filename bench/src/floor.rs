//! `floor-proxy`: the least a PD gateway can do per request over HTTP/1.1 on this machine, as a
//! yardstick for pdgate's own cost (issue 15: "close to what a proxy can do").
//!
//! Per request it does only what the wire demands of any SGLang-style PD gateway: read the
//! client's request, splice the three bootstrap fields into the body, write the leg to the
//! prefill and to the decode engine at once (one `write` each, on keep-alive connections the
//! client connection owns), read both answers to their end, and write the decode's answer back
//! verbatim in one `write`. No JSON parse, no routing, no timeouts, no metrics, no logs, no
//! retries, no error bodies beyond a bare 502: nothing a real gateway may leave out is kept
//! either (three reads and three writes per request, the floor pdgate also sits on).
//!
//! It relays a whole answer once it has ended, so it is a floor for the `canned-engine`s, which
//! send every answer in one write (a streamed one arrives as one burst, and the client gets it in
//! one piece either way); it is not a gateway for engines that stream over time.
//!
//! The runtime is tokio's multi-thread one with `threads` workers (pdgate's `threads: 2` by
//! default): the same scheduler, the same wake-ups, so what separates the two is the gateway.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::canned::{chunked_len, Requests};

pub struct FloorSpec {
    pub addr: SocketAddr,
    pub prefill: SocketAddr,
    pub decode: SocketAddr,
    /// The prefill's bootstrap port, spliced into every leg.
    pub bootstrap_port: u16,
    pub threads: usize,
}

const BAD_GATEWAY: &[u8] =
    b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

/// Rooms: a counter mixed so consecutive rooms differ in every bit (any 63-bit value will do).
static ROOM: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);

fn next_room() -> u64 {
    let x = ROOM.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
    (x ^ (x >> 31)) & (i64::MAX as u64)
}

/// The client's body with the bootstrap fields spliced in after its opening brace (a body that
/// is not an object goes as it is): what both engines get.
pub(crate) fn leg_body(body: &[u8], bootstrap_port: u16) -> Vec<u8> {
    let Some(i) = body.iter().position(|b| !b.is_ascii_whitespace()) else {
        return body.to_vec();
    };
    if body[i] != b'{' {
        return body.to_vec();
    }
    let comma = if body[i + 1..].trim_ascii_start().starts_with(b"}") {
        ""
    } else {
        ","
    };
    let fields = format!(
        "\"bootstrap_host\":\"127.0.0.1\",\"bootstrap_port\":{bootstrap_port},\"bootstrap_room\":{}{comma}",
        next_room()
    );
    let mut out = Vec::with_capacity(body.len() + fields.len());
    out.extend_from_slice(&body[..=i]);
    out.extend_from_slice(fields.as_bytes());
    out.extend_from_slice(&body[i + 1..]);
    out
}

/// One request to an engine, head and body in one buffer (one write).
pub(crate) fn request(method: &str, path: &str, host: &str, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + path.len() + host.len() + 96);
    for part in [method, " ", path, " HTTP/1.1\r\nhost: ", host] {
        out.extend_from_slice(part.as_bytes());
    }
    if !body.is_empty() {
        out.extend_from_slice(b"\r\ncontent-type: application/json");
    }
    out.extend_from_slice(format!("\r\ncontent-length: {}\r\n\r\n", body.len()).as_bytes());
    out.extend_from_slice(body);
    out
}

/// The length of a whole response at the front of `buf` (head and body), `None` while it is
/// incomplete. Bodies are framed by `Content-Length` or chunked encoding (the engines use both).
fn response_len(buf: &[u8]) -> io::Result<Option<usize>> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let head = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
    };
    let (mut length, mut chunked) = (0usize, false);
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            length = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "content-length"))?;
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = h.value.eq_ignore_ascii_case(b"chunked");
        }
    }
    if chunked {
        return chunked_len(&buf[head..])
            .map(|n| n.map(|n| head + n))
            .map_err(|()| io::Error::new(io::ErrorKind::InvalidData, "chunked body"));
    }
    Ok((buf.len() - head >= length).then_some(head + length))
}

/// A keep-alive connection to one engine, opened on first use.
pub(crate) struct Upstream {
    addr: SocketAddr,
    sock: Option<TcpStream>,
    /// The last whole response read.
    pub(crate) buf: Vec<u8>,
}

impl Upstream {
    pub(crate) fn new(addr: SocketAddr) -> Upstream {
        Upstream {
            addr,
            sock: None,
            buf: Vec::with_capacity(8 * 1024),
        }
    }

    /// Writes `req` and reads one whole response into `self.buf`.
    pub(crate) async fn exchange(&mut self, req: &[u8]) -> io::Result<()> {
        if self.sock.is_none() {
            let s = TcpStream::connect(self.addr).await?;
            s.set_nodelay(true)?;
            self.sock = Some(s);
        }
        let result = self.exchange_on(req).await;
        if result.is_err() {
            self.sock = None;
        }
        result
    }

    async fn exchange_on(&mut self, req: &[u8]) -> io::Result<()> {
        let sock = self.sock.as_mut().expect("connected");
        sock.write_all(req).await?;
        self.buf.clear();
        loop {
            if self.buf.capacity() == self.buf.len() {
                self.buf.reserve(self.buf.len());
            }
            let n = sock.read_buf(&mut self.buf).await?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            if let Some(len) = response_len(&self.buf)? {
                // Engines answer one request at a time: nothing follows the response.
                self.buf.truncate(len);
                return Ok(());
            }
        }
    }
}

/// The spec and the engines' `host` header values, for the life of the process.
struct Floor {
    spec: FloorSpec,
    prefill_host: String,
    decode_host: String,
}

async fn serve_connection(mut client: TcpStream, floor: &'static Floor) -> io::Result<()> {
    client.set_nodelay(true)?;
    let mut prefill = Upstream::new(floor.spec.prefill);
    let mut decode = Upstream::new(floor.spec.decode);
    let mut requests = Requests::new();
    loop {
        let parsed = requests.next().map_err(|()| {
            io::Error::new(io::ErrorKind::InvalidData, "bad request from the client")
        })?;
        if let Some(req) = parsed {
            let (len, close) = (req.len, req.close);
            let ok = if req.method == "POST" {
                // Both engines get the same room: one splice, a head for each.
                let body = leg_body(req.body, floor.spec.bootstrap_port);
                let leg_p = request("POST", req.path, &floor.prefill_host, &body);
                let leg_d = request("POST", req.path, &floor.decode_host, &body);
                let (p, d) = tokio::join!(prefill.exchange(&leg_p), decode.exchange(&leg_d));
                p.is_ok() && d.is_ok()
            } else {
                // Health checks and the like: the decode answers them.
                let head = request(req.method, req.path, &floor.decode_host, b"");
                decode.exchange(&head).await.is_ok()
            };
            if ok {
                client.write_all(&decode.buf).await?;
            } else {
                client.write_all(BAD_GATEWAY).await?;
                return Ok(());
            }
            requests.consume(len);
            if close {
                return Ok(());
            }
            continue;
        }
        if !requests.fill(&mut client).await? {
            return Ok(());
        }
    }
}

/// Serves until the process is killed.
pub fn run(spec: FloorSpec) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(spec.threads.max(1))
        .enable_io()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let floor: &'static Floor = Box::leak(Box::new(Floor {
        prefill_host: spec.prefill.to_string(),
        decode_host: spec.decode.to_string(),
        spec,
    }));
    let spec = &floor.spec;
    rt.block_on(async move {
        let listener = TcpListener::bind(spec.addr)
            .await
            .map_err(|e| format!("bind {}: {e}", spec.addr))?;
        eprintln!(
            "floor-proxy listening on {} (prefill {}, decode {})",
            spec.addr, spec.prefill, spec.decode
        );
        loop {
            match listener.accept().await {
                Ok((sock, _)) => {
                    tokio::spawn(async move {
                        let _ = serve_connection(sock, floor).await;
                    });
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    eprintln!("floor-proxy: accept: {e}");
                    tokio::task::yield_now().await;
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leg_carries_the_bootstrap_fields_and_a_matching_length() {
        let body = leg_body(br#" {"model":"m"}"#, 8998);
        let l = request("POST", "/v1/chat/completions", "h:1", &body);
        let text = std::str::from_utf8(&l).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            head.starts_with("POST /v1/chat/completions HTTP/1.1\r\nhost: h:1\r\n"),
            "{text}"
        );
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{text}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["bootstrap_port"], 8998);
        assert_eq!(v["model"], "m");
        assert!(v["bootstrap_room"].as_u64().unwrap() <= i64::MAX as u64);

        let empty = leg_body(b"{}", 1);
        assert!(
            serde_json::from_slice::<serde_json::Value>(&empty).is_ok(),
            "{empty:?}"
        );
        assert_eq!(leg_body(b"[1]", 1), b"[1]");
        let get = request("GET", "/health", "h:1", b"");
        assert_eq!(
            get,
            b"GET /health HTTP/1.1\r\nhost: h:1\r\ncontent-length: 0\r\n\r\n"
        );
    }

    #[test]
    fn responses_are_framed_by_length_and_by_chunks() {
        let r = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        assert_eq!(response_len(r).unwrap(), Some(r.len()));
        assert_eq!(response_len(&r[..r.len() - 1]).unwrap(), None);
        let c = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n";
        assert_eq!(response_len(c).unwrap(), Some(c.len()));
        assert_eq!(response_len(&c[..c.len() - 2]).unwrap(), None);
    }
}
