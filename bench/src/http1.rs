//! A minimal HTTP/1.1 keep-alive client for load generation: one pre-serialized request per
//! call, a response framed by `Content-Length`, chunked encoding or close, and the arrival time of
//! every SSE event. It does as little work per byte as possible so the load generator is not what
//! the benchmark measures.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use pdgate_filters::framing::{BodyDecoder, Framing};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A request ready to write: head and body in one buffer.
#[derive(Clone)]
pub struct RawRequest {
    pub bytes: std::sync::Arc<[u8]>,
}

impl RawRequest {
    /// `POST path` with a JSON body; `extra_headers` are full `Name: value` lines.
    pub fn post_json(host: &str, path: &str, body: &[u8], extra_headers: &[String]) -> RawRequest {
        let mut head = format!(
            "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nAccept: */*\r\nContent-Length: {}\r\n",
            body.len()
        );
        for h in extra_headers {
            head.push_str(h);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(body);
        RawRequest {
            bytes: bytes.into(),
        }
    }
}

/// What the caller wants kept from a response.
#[derive(Clone, Copy, Debug, Default)]
pub struct Keep {
    /// Keep the decoded body (for parsing usage); otherwise only its tail is kept.
    pub body: bool,
}

/// One response, with timings relative to the moment the request was written.
#[derive(Debug, Default)]
pub struct Response {
    pub status: u16,
    /// The decoded body when [`Keep::body`] was set.
    pub body: Vec<u8>,
    /// The last bytes of the decoded body (to check a stream ended with `[DONE]`).
    pub tail: Vec<u8>,
    /// SSE events seen (`\n\n` terminators in the decoded body).
    pub events: u32,
    /// When the first SSE event completed.
    pub first_event: Option<Instant>,
    /// Delay before each later event, in µs; events delivered in the same read as the previous
    /// one count 0 (they were coalesced on the way).
    pub gaps_us: Vec<u32>,
    /// When the last byte arrived.
    pub done: Option<Instant>,
    /// The server asked to close the connection after this response.
    pub close: bool,
}

impl Response {
    pub fn ended_with_done(&self) -> bool {
        self.tail.windows(6).any(|w| w == b"[DONE]")
    }
}

const TAIL: usize = 64;
const READ_BUF: usize = 64 * 1024;

/// A keep-alive connection.
pub struct Conn {
    stream: TcpStream,
    buf: Box<[u8]>,
    /// Bytes read past the end of the previous response (pipelining never happens here, but a
    /// server may send a response before the request is fully written).
    carry: Vec<u8>,
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> io::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: vec![0u8; READ_BUF].into_boxed_slice(),
            carry: Vec::new(),
        })
    }

    /// Writes `req` and reads the whole response; `started` is when the caller started timing.
    pub async fn send(
        &mut self,
        req: &RawRequest,
        keep: Keep,
        timeout: Duration,
    ) -> io::Result<Response> {
        match tokio::time::timeout(timeout, self.exchange(req, keep)).await {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "request timed out")),
        }
    }

    async fn exchange(&mut self, req: &RawRequest, keep: Keep) -> io::Result<Response> {
        self.stream.write_all(&req.bytes).await?;
        let mut parser = ResponseParser::new(keep);
        if !self.carry.is_empty() {
            let carry = std::mem::take(&mut self.carry);
            if let Some(used) = parser.feed(&carry, Instant::now())? {
                self.carry = carry[used..].to_vec();
                return Ok(parser.finish());
            }
        }
        loop {
            let n = self.stream.read(&mut self.buf).await?;
            let now = Instant::now();
            if n == 0 {
                return parser.eof(now);
            }
            if let Some(used) = parser.feed(&self.buf[..n], now)? {
                if used < n {
                    self.carry = self.buf[used..n].to_vec();
                }
                return Ok(parser.finish());
            }
        }
    }

    /// Reads a streamed response forever, calling `on_event` per read that completed events
    /// (with their count), until the response ends or `stop` resolves. For held-open streams.
    pub async fn hold_stream(
        &mut self,
        req: &RawRequest,
        mut on_events: impl FnMut(u32),
        stop: impl std::future::Future<Output = ()>,
    ) -> io::Result<Response> {
        self.stream.write_all(&req.bytes).await?;
        let mut parser = ResponseParser::new(Keep::default());
        tokio::pin!(stop);
        loop {
            let n = tokio::select! {
                r = self.stream.read(&mut self.buf) => r?,
                _ = &mut stop => return Ok(parser.finish()),
            };
            let now = Instant::now();
            if n == 0 {
                return parser.eof(now);
            }
            let before = parser.resp.events;
            let done = parser.feed(&self.buf[..n], now)?;
            if parser.resp.events > before {
                on_events(parser.resp.events - before);
            }
            if done.is_some() {
                return Ok(parser.finish());
            }
        }
    }
}

/// Incremental response parser (status line, headers, SSE event boundaries); the body framing
/// is pdgate's own decoder (`pdgate_filters::framing`, the one the gateway's legs use).
struct ResponseParser {
    keep: Keep,
    head: Vec<u8>,
    /// After the head: the body decoder and the bytes it has not consumed yet.
    body: Option<(BodyDecoder, BytesMut)>,
    resp: Response,
    /// The previous body byte was `\n` (an SSE event ends with `\n\n`).
    last_lf: bool,
    last_event: Option<Instant>,
}

impl ResponseParser {
    fn new(keep: Keep) -> Self {
        ResponseParser {
            keep,
            head: Vec::new(),
            body: None,
            resp: Response::default(),
            last_lf: false,
            last_event: None,
        }
    }

    /// Feeds bytes; returns `Some(consumed)` once the response is complete.
    fn feed(&mut self, mut data: &[u8], now: Instant) -> io::Result<Option<usize>> {
        let total = data.len();
        if self.body.is_none() {
            let start = self.head.len().saturating_sub(3);
            self.head.extend_from_slice(data);
            let Some(end) = find(&self.head[start..], b"\r\n\r\n").map(|i| start + i + 4) else {
                if self.head.len() > 64 * 1024 {
                    return Err(bad("response head larger than 64 KiB"));
                }
                return Ok(None);
            };
            let body_start = data.len() - (self.head.len() - end);
            self.parse_head(end)?;
            data = &data[body_start..];
        }
        let (decoded, left_over) = {
            let (decoder, pending) = self.body.as_mut().expect("head parsed before the body");
            pending.extend_from_slice(data);
            let decoded = decoder.decode(pending).map_err(|e| bad(&e.to_string()))?;
            (decoded, decoder.is_done().then_some(pending.len()))
        };
        self.payload(&decoded, now);
        Ok(left_over.map(|left| {
            self.resp.done = Some(now);
            // What is left over lies past the body's end, all of it from this call's bytes.
            total.saturating_sub(left)
        }))
    }

    fn parse_head(&mut self, end: usize) -> io::Result<()> {
        let head = std::str::from_utf8(&self.head[..end]).map_err(|_| bad("non-UTF-8 head"))?;
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        self.resp.status = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("bad status line"))?;
        let mut length = None;
        let mut chunked = false;
        self.resp.close = version == "HTTP/1.0";
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = value.parse::<u64>().ok();
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.to_ascii_lowercase().contains("chunked");
            } else if name.eq_ignore_ascii_case("connection") {
                self.resp.close = value.eq_ignore_ascii_case("close");
            }
        }
        let framing = if chunked {
            Framing::Chunked
        } else if let Some(n) = length {
            Framing::Length(n)
        } else {
            self.resp.close = true;
            Framing::UntilClose
        };
        self.body = Some((BodyDecoder::new(framing), BytesMut::new()));
        self.head = Vec::new();
        Ok(())
    }

    /// Decoded body bytes: count SSE events, keep the tail (and the body when asked).
    fn payload(&mut self, data: &[u8], now: Instant) {
        if data.is_empty() {
            return;
        }
        if self.keep.body {
            self.resp.body.extend_from_slice(data);
        }
        let mut new_events = 0u32;
        let mut prev_lf = self.last_lf;
        for &b in data {
            let lf = b == b'\n';
            if lf && prev_lf {
                new_events += 1;
            }
            prev_lf = lf;
        }
        self.last_lf = prev_lf;
        if new_events > 0 {
            match self.last_event {
                None => self.resp.first_event = Some(now),
                Some(prev) => {
                    let gap = now.duration_since(prev).as_micros().min(u32::MAX as u128) as u32;
                    self.resp.gaps_us.push(gap);
                }
            }
            let coalesced = new_events - 1;
            self.resp
                .gaps_us
                .extend(std::iter::repeat_n(0, coalesced as usize));
            self.resp.events += new_events;
            self.last_event = Some(now);
        }
        let tail = &mut self.resp.tail;
        tail.extend_from_slice(&data[data.len().saturating_sub(TAIL)..]);
        if tail.len() > TAIL {
            tail.drain(..tail.len() - TAIL);
        }
    }

    fn finish(self) -> Response {
        self.resp
    }

    fn eof(mut self, now: Instant) -> io::Result<Response> {
        match self.body.as_mut().map(|(decoder, _)| decoder.finish()) {
            Some(Ok(())) => {
                self.resp.done = Some(now);
                Ok(self.resp)
            }
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed before the response ended",
            )),
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(raw: &[u8], piece: usize) -> (Response, usize) {
        let mut p = ResponseParser::new(Keep { body: true });
        let mut offset = 0;
        for c in raw.chunks(piece) {
            if let Some(used) = p.feed(c, Instant::now()).unwrap() {
                return (p.finish(), offset + used);
            }
            offset += c.len();
        }
        panic!("response did not complete");
    }

    #[test]
    fn content_length_body_is_framed_exactly() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA";
        for piece in [1, 3, raw.len()] {
            let (r, used) = parse_in_pieces(raw, piece);
            assert_eq!(r.status, 200);
            assert_eq!(r.body, b"hello");
            assert_eq!(used, raw.len() - 5, "piece {piece}");
        }
    }

    #[test]
    fn chunked_sse_counts_events_and_sees_done() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
            d\r\ndata: {\"a\"}\n\n\r\n8;ext=1\r\ndata: x\n\r\n\
            d\r\n\ndata: [DONE]\r\n2\r\n\n\n\r\n0\r\n\r\n";
        for piece in [1, 2, 7, raw.len()] {
            let (r, used) = parse_in_pieces(raw, piece);
            assert_eq!(used, raw.len(), "piece {piece}");
            assert_eq!(
                r.events,
                3,
                "piece {piece}: {:?}",
                String::from_utf8_lossy(&r.body)
            );
            assert!(r.ended_with_done());
            assert_eq!(r.gaps_us.len(), 2);
        }
    }

    #[test]
    fn chunked_trailers_are_skipped() {
        let raw =
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n";
        let (r, used) = parse_in_pieces(raw, 1);
        assert_eq!(r.body, b"abc");
        assert_eq!(used, raw.len());
    }

    #[test]
    fn empty_body_completes_at_the_head() {
        let raw = b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        let (r, used) = parse_in_pieces(raw, 4);
        assert_eq!((r.status, used, r.close), (204, raw.len(), true));
    }
}
