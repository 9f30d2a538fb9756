//! The sub-request module's transport: a lean HTTP/1.1 client over Pingora's connector
//! (`TransportConnector`: connect, TCP options, timeouts) with idle connections kept in
//! [`Pool`], used for both legs of a PD request, health probes and single-leg admin calls.
//!
//! Why Pingora's connector and not a second HTTP stack: the same peer/timeout model as the
//! proxy, and no extra dependency (research/pingora-design.md §2). Why not Pingora's
//! v1 `HttpSession` on top of it (what this module used first; docs/architecture.md, "Leg
//! transport"): it sends a request head and its body in two writes, and reads every response
//! body through a 64 KiB buffer — per held stream that buffer was most of the gateway's memory,
//! and the two writes a fifth of its CPU. Here a leg's head and body leave in one write, the
//! response is read through a buffer sized to what arrives, and a read that brings several
//! chunks of a streamed body hands them on as one piece ([`pdgate_filters::framing`]).
//!
//! A leg is opened by writing the whole request and reading the response head; its body is
//! then pulled piece by piece. Dropping an [`OpenLeg`] closes its connection — that is how a leg
//! is "dropped", and the engine sees the hang-up and aborts its side of the rendezvous.

use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderName, HeaderValue, Version};
use pdgate_filters::ascii::all_visible;
use pdgate_filters::body::{BodyParts, BodySink};
use pdgate_filters::framing::{BodyDecoder, Framing, FramingError};
use pdgate_filters::json::decimal_bytes;
use pingora::connectors::{ConnectorOptions, TransportConnector};
use pingora::http::ResponseHeader;
use pingora::protocols::Stream;
use pingora::upstreams::peer::{HttpPeer, Peer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::pool::Pool;
use crate::scratch;
use crate::trace::{LegSpan, LegTrace};

/// First read of a response (the head and, usually, a stream's first events), and the first
/// read size of a body. A read that fills it doubles the next one, up to [`READ_MAX`], so a
/// large body is not read in small bites. Between reads an open stream holds only the bytes it
/// has not handed out yet (none, usually: see `OpenLeg::fill`), so the size costs memory only
/// while a read's bytes are in flight: 4 KiB takes a head and a short answer's whole burst in
/// one read.
const READ_START: usize = 4096;
/// Largest single read.
const READ_MAX: usize = scratch::MAX_READ;
/// Largest response head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Most response header lines accepted.
const MAX_HEADERS: usize = 128;
/// A request body up to this size is copied behind its head so both leave in one write; a
/// larger one is written with the head in one vectored write, its pieces uncopied (and a leg
/// body this large is built as pieces of the client's: [`spliced_body`]).
const COALESCE_BODY: usize = 64 * 1024;

/// What went wrong on a leg, before or after its response head.
#[derive(Debug, Clone)]
pub struct LegError {
    pub kind: LegErrorKind,
    pub detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LegErrorKind {
    /// No connection could be made.
    Connect,
    /// The request could not be written.
    Send,
    /// The connection failed before a response head arrived.
    Head,
    /// The response body failed mid-way.
    Body,
    /// A deadline expired.
    Timeout,
    /// The response body exceeded the size we accept for it.
    TooLarge,
}

impl LegError {
    fn new(kind: LegErrorKind, detail: impl std::fmt::Display) -> Self {
        LegError {
            kind,
            detail: detail.to_string(),
        }
    }

    /// True when nothing of the response arrived (the request may not have reached the engine).
    pub fn before_response(&self) -> bool {
        matches!(
            self.kind,
            LegErrorKind::Connect | LegErrorKind::Send | LegErrorKind::Head
        )
    }
}

impl std::fmt::Display for LegError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.kind {
            LegErrorKind::Connect => "connect failed",
            LegErrorKind::Send => "sending the request failed",
            LegErrorKind::Head => "no response head",
            LegErrorKind::Body => "response body failed",
            LegErrorKind::Timeout => "timed out",
            LegErrorKind::TooLarge => "response body too large",
        };
        write!(f, "{what}: {}", self.detail)
    }
}

/// One request to send on a leg. The body is shared (`Bytes`), so both SGLang legs can carry
/// the same allocation.
pub struct LegRequest<'a> {
    pub method: &'static str,
    pub path: &'a str,
    /// `Host` header value (the worker URL's authority).
    pub host: &'a str,
    /// Extra headers (forwarded client headers, auth). `Content-Type`/`Content-Length` are added.
    pub headers: &'a [(HeaderName, HeaderValue)],
    pub body: BodyParts,
    /// Which of the answer's headers the leg keeps.
    pub answer_headers: AnswerHeaders,
}

/// Which headers of a leg's answer are kept in its head (the framing ones are always read, and
/// never kept).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnswerHeaders {
    /// All of them: an answer that is relayed, or whose headers are read.
    All,
    /// `Content-Type` only: an answer nobody relays (the SGLang prefill's), whose other headers
    /// would be checked and stored for nothing — a `HeaderMap` entry each.
    ContentTypeOnly,
}

/// The pooled client. One per service runtime: pooled sockets belong to the reactor that made
/// them (Pingora's own warning), so the proxy, health and admin services each build their own.
pub struct LegClient {
    transport: TransportConnector,
    pool: Pool,
}

impl LegClient {
    /// `pool_size` caps idle pooled connections; `pool_idle` is how long one may sit idle (keep
    /// it below the engines' own keep-alive, or a reused socket races the engine's close).
    pub fn new(pool_size: usize, pool_idle: Option<Duration>) -> Self {
        // Pingora's own pool is not used (see `pool`): it keeps nothing.
        let opts = ConnectorOptions::new(0);
        LegClient {
            transport: TransportConnector::new(Some(opts)),
            pool: Pool::new(pool_size, pool_idle),
        }
    }

    /// Sends the request and reads the response head, both within `head_timeout`.
    ///
    /// A pooled connection that fails before any response arrives (typically closed by the
    /// engine while idle) is retried once on a fresh connection; nothing else is retried here.
    pub async fn open(
        &self,
        peer: &LegPeer,
        req: &LegRequest<'_>,
        head_timeout: Duration,
    ) -> Result<OpenLeg, LegError> {
        let wire = RequestWire::encode(req)?;
        let (stream, reused) = self.connect(peer).await?;
        match exchange(stream, &wire, head_timeout).await {
            Err((e, true)) if reused && e.before_response() => {
                let (stream, _) = self.connect(peer).await?;
                exchange(stream, &wire, head_timeout)
                    .await
                    .map_err(|(e, _)| e)
            }
            other => other.map_err(|(e, _)| e),
        }
    }

    /// [`LegClient::open`] for a traced leg: the span (taken from `trace`) records the response
    /// status or the failure, and travels with the [`OpenLeg`] (counting its body bytes) until the
    /// leg ends. If this future is dropped first, `trace` keeps the span (a cancelled leg).
    pub async fn open_traced(
        &self,
        peer: &LegPeer,
        req: &LegRequest<'_>,
        head_timeout: Duration,
        trace: &mut LegTrace,
    ) -> Result<OpenLeg, LegError> {
        let opened = self.open(peer, req, head_timeout).await;
        let Some(mut span) = trace.take() else {
            return opened;
        };
        match opened {
            Ok(mut leg) => {
                span.http_status(leg.status);
                leg.trace = Some(span);
                Ok(leg)
            }
            Err(e) => {
                span.http_failed(&e);
                Err(e)
            }
        }
    }

    async fn connect(&self, peer: &LegPeer) -> Result<(Stream, bool), LegError> {
        if let Some(stream) = self.pool.take(peer.key) {
            return Ok((stream, true));
        }
        // Boxed: dialing is rare (a pooled connection serves most legs), and inline Pingora's
        // connector future would size every leg's future by it.
        Box::pin(self.transport.new_stream(&peer.http))
            .await
            .map(|s| (s, false))
            .map_err(|e| LegError::new(LegErrorKind::Connect, e))
    }

    /// Returns a finished leg's connection to the pool (only if its body was read to the end,
    /// nothing followed it, and the engine allows keep-alive; otherwise it is closed).
    pub async fn release(&self, leg: OpenLeg, peer: &LegPeer) {
        if leg.reusable() {
            self.pool.put(peer.key, leg.stream);
        }
    }
}

/// An engine's address as the legs dial it, with its pool key worked out once: Pingora's
/// `Peer::reuse_hash` runs SipHash over every field of the peer (address, scheme, SNI, TLS
/// options, proxy), and a request takes and returns two connections.
pub struct LegPeer {
    http: HttpPeer,
    key: u64,
}

impl LegPeer {
    pub fn new(http: HttpPeer) -> LegPeer {
        let key = http.reuse_hash();
        LegPeer { http, key }
    }
}

impl std::ops::Deref for LegPeer {
    type Target = HttpPeer;

    fn deref(&self) -> &HttpPeer {
        &self.http
    }
}

/// A request serialized for the wire: the head, with the body behind it when it is small.
struct RequestWire {
    /// A plain vector: it is written once (twice on a stale pooled connection), never shared,
    /// and a frozen `Bytes` of it would cost a second allocation.
    first: Vec<u8>,
    /// A large body's pieces, written after `first` in the same vectored write (never copied).
    rest: Option<BodyParts>,
    answer_headers: AnswerHeaders,
}

impl RequestWire {
    fn encode(req: &LegRequest<'_>) -> Result<RequestWire, LegError> {
        // The path and host come from configuration and the route table, never from a client,
        // but a control byte or space in either would split the request line: refuse it.
        let token_ok = |s: &str| !s.is_empty() && all_visible(s.as_bytes());
        if !token_ok(req.path) || !token_ok(req.host) || !token_ok(req.method) {
            return Err(LegError::new(
                LegErrorKind::Send,
                "request line or host contains a forbidden byte",
            ));
        }
        let headers_len: usize = req
            .headers
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len() + 4)
            .sum();
        let with_body = !req.body.is_empty() || req.method == "POST";
        let coalesce = req.body.len() <= COALESCE_BODY;
        let body_len = if coalesce { req.body.len() } else { 0 };
        let mut w = Vec::with_capacity(
            req.method.len() + req.path.len() + req.host.len() + headers_len + 96 + body_len,
        );
        w.extend_from_slice(req.method.as_bytes());
        w.extend_from_slice(b" ");
        w.extend_from_slice(req.path.as_bytes());
        w.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        w.extend_from_slice(req.host.as_bytes());
        if with_body {
            w.extend_from_slice(b"\r\ncontent-type: application/json\r\ncontent-length: ");
            let mut digits = [0u8; 20];
            w.extend_from_slice(decimal_bytes(req.body.len() as u64, &mut digits));
        }
        w.extend_from_slice(b"\r\n");
        for (name, value) in req.headers {
            w.extend_from_slice(name.as_str().as_bytes());
            w.extend_from_slice(b": ");
            w.extend_from_slice(value.as_bytes());
            w.extend_from_slice(b"\r\n");
        }
        w.extend_from_slice(b"\r\n");
        let rest = if coalesce {
            req.body.copy_into(&mut w);
            None
        } else {
            Some(req.body.clone())
        };
        Ok(RequestWire {
            first: w,
            rest,
            answer_headers: req.answer_headers,
        })
    }
}

/// A leg body spliced from the client's `body` by `splice`: a copy when small (a leg copies it
/// behind its head anyway), pieces of the client's bytes when large.
pub fn spliced_body(body: &Bytes, splice: impl FnOnce(&mut BodySink<'_>)) -> BodyParts {
    let mut out = BodySink::new(body, COALESCE_BODY);
    splice(&mut out);
    out.finish()
}

/// Writes `first` then every part, in as few vectored writes as the socket takes.
async fn write_all_parts(
    stream: &mut Stream,
    first: &[u8],
    parts: &[Bytes],
) -> std::io::Result<()> {
    let mut slices: Vec<std::io::IoSlice<'_>> = Vec::with_capacity(parts.len() + 1);
    slices.push(std::io::IoSlice::new(first));
    slices.extend(parts.iter().map(|p| std::io::IoSlice::new(p)));
    let mut left = slices.as_mut_slice();
    while !left.is_empty() {
        let n = stream.write_vectored(left).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        std::io::IoSlice::advance_slices(&mut left, n);
    }
    Ok(())
}

/// Writes the request and reads the response head within `limit`. Err carries whether the
/// failure happened before any response byte (retryable on a fresh connection when the socket
/// came from the pool).
async fn exchange(
    mut stream: Stream,
    wire: &RequestWire,
    limit: Duration,
) -> Result<OpenLeg, (LegError, bool)> {
    let work = async {
        let send = |e: std::io::Error| (LegError::new(LegErrorKind::Send, e), true);
        match &wire.rest {
            None => stream.write_all(&wire.first).await.map_err(send)?,
            Some(rest) => write_all_parts(&mut stream, &wire.first, rest.parts())
                .await
                .map_err(send)?,
        }
        stream.flush().await.map_err(send)?;
        read_head(&mut stream, wire.answer_headers).await
    };
    match tokio::time::timeout(limit, work).await {
        Err(_) => Err((
            LegError::new(
                LegErrorKind::Timeout,
                format!("no response head within {limit:?}"),
            ),
            false,
        )),
        Ok(Err(e)) => Err(e),
        Ok(Ok((head, buf, framing, keepalive))) => Ok(OpenLeg {
            stream,
            status: head.status.as_u16(),
            head,
            more_waiting: buf.len() == buf.capacity(),
            buf,
            read_size: READ_START,
            read_max: READ_MAX,
            decoder: BodyDecoder::new(framing),
            framing,
            keepalive,
            read_timeout: None,
            trace: None,
        }),
    }
}

type Head = (ResponseHeader, BytesMut, Framing, bool);

/// Reads until a complete final response head (1xx interim heads are skipped). The returned
/// buffer holds whatever of the body came with it.
async fn read_head(stream: &mut Stream, keep: AnswerHeaders) -> Result<Head, (LegError, bool)> {
    let head_err = |detail: String, retry: bool| (LegError::new(LegErrorKind::Head, detail), retry);
    let mut buf = BytesMut::with_capacity(READ_START);
    let mut got_any = false;
    loop {
        if buf.capacity() == buf.len() {
            buf.reserve(READ_START);
        }
        let n = stream
            .read_buf(&mut buf)
            .await
            .map_err(|e| head_err(e.to_string(), !got_any))?;
        if n == 0 {
            return Err(head_err(
                "the engine closed the connection before a response head".into(),
                !got_any,
            ));
        }
        got_any = true;
        loop {
            match parse_head(&buf, keep)? {
                None if buf.len() >= MAX_HEAD => {
                    return Err(head_err(
                        format!("response head larger than {MAX_HEAD} bytes"),
                        false,
                    ))
                }
                None => break,
                Some((len, None)) => {
                    // An interim 1xx head: drop it and look at what follows.
                    buf.advance(len);
                    if buf.is_empty() {
                        break;
                    }
                }
                Some((len, Some((head, framing, keepalive)))) => {
                    buf.advance(len);
                    return Ok((head, buf, framing, keepalive));
                }
            }
        }
    }
}

type Parsed = Option<(usize, Option<(ResponseHeader, Framing, bool)>)>;

/// Parses a response head at the start of `buf`: `None` while incomplete; `Some((len, None))`
/// for an interim 1xx head; otherwise the head, its body framing (RFC 9112 §6.3) and whether
/// the connection may be kept alive.
fn parse_head(buf: &[u8], keep: AnswerHeaders) -> Result<Parsed, (LegError, bool)> {
    let bad = |detail: String| (LegError::new(LegErrorKind::Head, detail), false);
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(bad(format!("malformed response head: {e}"))),
    };
    let status = resp.code.unwrap_or(0);
    if (100..200).contains(&status) && status != 101 {
        return Ok(Some((len, None)));
    }
    let version = if resp.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    // No case-preserving name map: the client never sees these names as sent.
    let mut parts = crate::head::bare(
        http::StatusCode::from_u16(status).map_err(|_| bad(format!("bad status {status}")))?,
    );
    parts.version = version;
    let mut chunked = false;
    let mut other_coding = false;
    let mut length: Option<u64> = None;
    let mut conn_close = version == Version::HTTP_10;
    for h in resp.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| bad(format!("bad header name {:?}", h.name)))?;
        if name == http::header::TRANSFER_ENCODING {
            // The last coding decides (RFC 9112 §6.3): chunked, or read until close.
            for coding in tokens(h.value) {
                chunked = coding.eq_ignore_ascii_case(b"chunked");
                other_coding |= !chunked;
            }
            continue;
        } else if name == http::header::CONTENT_LENGTH {
            for v in tokens(h.value) {
                let n = std::str::from_utf8(v)
                    .ok()
                    .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| bad("bad content-length".into()))?;
                if length.is_some_and(|l| l != n) {
                    return Err(bad("conflicting content-length values".into()));
                }
                length = Some(n);
            }
            continue;
        } else if name == http::header::CONNECTION {
            for t in tokens(h.value) {
                if t.eq_ignore_ascii_case(b"close") {
                    conn_close = true;
                } else if t.eq_ignore_ascii_case(b"keep-alive") && version == Version::HTTP_10 {
                    conn_close = false;
                }
            }
            continue;
        }
        // The framing headers above describe this connection, not the answer: they are read
        // here and never relayed, so the head keeps only the others.
        if keep == AnswerHeaders::ContentTypeOnly && name != http::header::CONTENT_TYPE {
            continue;
        }
        let value = well_known_value(h.value)
            .map_or_else(|| HeaderValue::from_bytes(h.value), Ok)
            .map_err(|_| bad(format!("bad value for header {:?}", h.name)))?;
        if parts.headers.try_append(name, value).is_err() {
            return Err(bad("too many headers".into()));
        }
    }
    let head = ResponseHeader::from(parts);
    let has_te = chunked || other_coding;
    let framing = if status == 204 || status == 304 {
        Framing::Length(0)
    } else if has_te {
        if chunked {
            Framing::Chunked
        } else {
            Framing::UntilClose
        }
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        Framing::UntilClose
    };
    // Both framings at once smells of smuggling: serve it, but never pool that connection.
    let keepalive = !conn_close
        && framing != Framing::UntilClose
        && !(has_te && length.is_some())
        && status != 101;
    Ok(Some((len, Some((head, framing, keepalive)))))
}

/// The values engines send on most answers, kept static instead of copied per answer. Built
/// once: `HeaderValue::from_static` checks its bytes wherever its argument is not a constant.
static WELL_KNOWN_VALUES: [HeaderValue; 5] = [
    HeaderValue::from_static("application/json"),
    HeaderValue::from_static("text/event-stream"),
    HeaderValue::from_static("no-cache"),
    HeaderValue::from_static("text/event-stream; charset=utf-8"),
    HeaderValue::from_static("application/json; charset=utf-8"),
];

fn well_known_value(v: &[u8]) -> Option<HeaderValue> {
    WELL_KNOWN_VALUES
        .iter()
        .find(|w| w.as_bytes() == v)
        .cloned()
}

/// Comma-separated, whitespace-trimmed, non-empty tokens of a header value.
fn tokens(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    v.split(|&b| b == b',').filter_map(|t| {
        let start = t.iter().position(|b| !b.is_ascii_whitespace())?;
        let end = t.iter().rposition(|b| !b.is_ascii_whitespace())?;
        Some(&t[start..=end])
    })
}

/// One step of [`OpenLeg::next_chunk`]: the payload decoded from what has arrived, if any.
fn decode_piece(d: &mut BodyDecoder, buf: &mut BytesMut) -> Result<Option<Bytes>, FramingError> {
    d.decode(buf).map(|out| (!out.is_empty()).then_some(out))
}

/// A leg whose response head has arrived. Dropping it closes the connection.
pub struct OpenLeg {
    stream: Stream,
    status: u16,
    head: ResponseHeader,
    /// Body bytes read but not yet decoded.
    buf: BytesMut,
    /// How much the next read asks for (see [`READ_START`]).
    read_size: usize,
    /// The largest read ([`READ_MAX`] unless [`OpenLeg::set_max_read`] lowered it).
    read_max: usize,
    decoder: BodyDecoder,
    framing: Framing,
    keepalive: bool,
    read_timeout: Option<Duration>,
    /// The last read filled the buffer: more bytes may already be waiting in the socket.
    more_waiting: bool,
    /// The leg's span when the request is traced; it ends when the leg is dropped or released.
    trace: LegTrace,
}

impl OpenLeg {
    pub fn status(&self) -> u16 {
        self.status
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// Frees the response head's headers (a streamed leg relays for minutes once its head has
    /// been turned into the client's): afterwards [`OpenLeg::head`] has the status only.
    pub fn shed_head(&mut self) {
        self.head = ResponseHeader::from(crate::head::bare(self.head.status));
    }

    /// The response head.
    pub fn head(&self) -> &ResponseHeader {
        &self.head
    }

    pub fn header_str(&self, name: &str) -> Option<&str> {
        self.head.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Caps every read of the body at `max` bytes (at least the first read's size): a body that
    /// is read only to be discarded (a prefill drained in the background) then never grows a
    /// large buffer — with thousands of streams open, each drain's buffer is resident memory.
    pub fn set_max_read(&mut self, max: usize) {
        self.read_max = max.max(READ_START);
        self.read_size = self.read_size.min(self.read_max);
    }

    /// Sets the longest wait for any single read of the body (the stall deadline).
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) {
        self.read_timeout = timeout;
    }

    /// The leg's span, if traced (e.g. to mark a stream complete that ended by the gateway's
    /// own rule after `[DONE]`).
    pub fn trace_mut(&mut self) -> Option<&mut LegSpan> {
        self.trace.as_deref_mut()
    }

    /// Every body byte that has arrived and not been handed out yet, as one piece (waiting for
    /// the next read when there is none); `None` at the end of the body. Cancel-safe: a read
    /// that is dropped loses nothing.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>, LegError> {
        let next = self.read_payload(decode_piece).await;
        self.trace_read(next.as_ref().map(|p| p.as_ref().map(Bytes::len)));
        next
    }

    /// What [`OpenLeg::next_chunk`] would give without waiting: `Some` when the next piece (or
    /// the end of the body, or its error) is already in hand, `None` when it needs a read that
    /// may wait. Reads nothing unless the last read left bytes waiting in the socket.
    pub fn piece_in_hand(&mut self) -> Option<Result<Option<Bytes>, LegError>> {
        let piece = self.payload_in_hand(&decode_piece);
        // Traced as `next_chunk` traces what it hands out.
        if let Some(read) = &piece {
            self.trace_read(read.as_ref().map(|p| p.as_ref().map(Bytes::len)));
        }
        piece
    }

    /// Like [`OpenLeg::next_chunk`] for a body read only to reach its end (a drained
    /// prefill): the payload is dropped as it is decoded, nothing is split off or joined. The
    /// number of payload bytes passed over; `None` at the end of the body.
    pub async fn skip_chunk(&mut self) -> Result<Option<usize>, LegError> {
        let next = self
            .read_payload(|d, buf| d.skip(buf).map(|n| (n > 0).then_some(n)))
            .await;
        self.trace_read(next.as_ref().map(|n| *n));
        next
    }

    fn trace_read(&mut self, read: Result<Option<usize>, &LegError>) {
        if let Some(span) = self.trace.as_deref_mut() {
            match read {
                Ok(Some(n)) => span.add_bytes(n),
                Ok(None) => span.complete(),
                Err(e) => span.http_failed(e),
            }
        }
    }

    /// Decodes with `step` what has arrived, reading more until it yields payload or the body
    /// ends (`None`).
    async fn read_payload<T>(
        &mut self,
        step: impl Fn(&mut BodyDecoder, &mut BytesMut) -> Result<Option<T>, FramingError>,
    ) -> Result<Option<T>, LegError> {
        loop {
            if let Some(out) = self.payload_in_hand(&step) {
                return out;
            }
            let want = self.decoder.expected().map_or(self.read_size, |n| {
                n.clamp(self.read_size as u64, self.read_max as u64) as usize
            });
            let (n, room) = self.fill(want).await?;
            self.after_read(n, room);
            if n == 0 {
                self.decoder
                    .finish()
                    .map_err(|e| LegError::new(LegErrorKind::Body, e))?;
            }
        }
    }

    /// Decodes with `step` what has arrived, without waiting: `Some` with its payload, the end
    /// of the body (`Ok(None)`) or its error; `None` when it needs another read.
    fn payload_in_hand<T>(
        &mut self,
        step: &impl Fn(&mut BodyDecoder, &mut BytesMut) -> Result<Option<T>, FramingError>,
    ) -> Option<Result<Option<T>, LegError>> {
        if self.decoder.is_done() {
            return Some(Ok(None));
        }
        if let Err(e) = self.take_waiting() {
            return Some(Err(e));
        }
        let out = match step(&mut self.decoder, &mut self.buf) {
            Ok(out) => out,
            Err(e) => return Some(Err(LegError::new(LegErrorKind::Body, e))),
        };
        // A buffer left empty is let go: an open stream waits for its next event holding
        // none (the piece handed out keeps what it needs until it is written).
        if self.buf.is_empty() {
            self.buf = BytesMut::new();
        }
        match out {
            Some(out) => Some(Ok(Some(out))),
            None => self.decoder.is_done().then_some(Ok(None)),
        }
    }

    /// After a read that filled the buffer, reads what already waits in the socket, without
    /// waiting for more (up to the largest read): an engine's burst then goes on as one piece,
    /// one client write, instead of one per read. Nothing is held back for bytes that have not
    /// arrived.
    fn take_waiting(&mut self) -> Result<(), LegError> {
        use futures::FutureExt;
        while self.more_waiting && self.buf.len() < self.read_max {
            let room = self.room_for(self.read_size);
            match self.stream.read_buf(&mut self.buf).now_or_never() {
                Some(Ok(n)) => self.after_read(n, room),
                Some(Err(e)) => return Err(LegError::new(LegErrorKind::Body, e)),
                // Nothing more yet (an end of stream is seen again by the next read).
                None => self.more_waiting = false,
            }
        }
        Ok(())
    }

    /// Makes room in the buffer for a read of about `want` bytes; gives the room there is.
    fn room_for(&mut self, want: usize) -> usize {
        if self.buf.capacity() - self.buf.len() < want / 2 {
            self.buf.reserve(want);
        }
        self.buf.capacity() - self.buf.len()
    }

    /// Books a read of `n` bytes into `room`: one that filled it doubles the next read (up to
    /// the largest) and may have left more bytes waiting.
    fn after_read(&mut self, n: usize, room: usize) {
        self.more_waiting = n == room;
        if n == room {
            self.read_size = (self.read_size * 2).min(self.read_max);
        }
    }

    /// One read of about `want` bytes onto the buffer, within the stall deadline: the bytes read
    /// and the room they were read into. A buffer that holds no memory (let go once empty, see
    /// `read_payload`) gets only what arrived, through [`crate::scratch`]; otherwise the
    /// read goes to the buffer's spare room.
    async fn fill(&mut self, want: usize) -> Result<(usize, usize), LegError> {
        let limit = self.read_timeout;
        let read = async {
            if self.buf.capacity() == 0 {
                let (stream, buf) = (&mut self.stream, &mut self.buf);
                std::future::poll_fn(|cx| scratch::poll_read_onto(stream, cx, want, buf)).await
            } else {
                let room = self.room_for(want);
                self.stream.read_buf(&mut self.buf).await.map(|n| (n, room))
            }
        };
        let got = match limit {
            Some(t) => tokio::time::timeout(t, read).await.map_err(|_| {
                LegError::new(LegErrorKind::Timeout, format!("no body bytes for {t:?}"))
            })?,
            None => read.await,
        };
        got.map_err(|e| LegError::new(LegErrorKind::Body, e))
    }

    /// Reads the rest of the body, refusing more than `limit` bytes. A body of known length is
    /// read into one buffer of that size and handed out without a copy.
    pub async fn read_to_end(&mut self, limit: usize) -> Result<Bytes, LegError> {
        let read = self.read_whole(limit).await;
        if let (Some(span), Err(e)) = (self.trace.as_deref_mut(), &read) {
            span.http_failed(e);
        }
        read
    }

    async fn read_whole(&mut self, limit: usize) -> Result<Bytes, LegError> {
        let too_large =
            || LegError::new(LegErrorKind::TooLarge, format!("more than {limit} bytes"));
        if let (Framing::Length(_), Some(left)) = (self.framing, self.decoder.expected()) {
            let left = usize::try_from(left).map_err(|_| too_large())?;
            if left > limit {
                return Err(too_large());
            }
            // Reserved as it arrives, in steps of at most 4 MiB: the length is the engine's word.
            while self.buf.len() < left {
                if self.buf.capacity() == self.buf.len() {
                    self.buf.reserve((left - self.buf.len()).min(4 << 20));
                }
                let want = (left - self.buf.len()).min(READ_MAX);
                if self.fill(want).await?.0 == 0 {
                    return Err(LegError::new(
                        LegErrorKind::Body,
                        "connection closed before the end of the body",
                    ));
                }
            }
        }
        let mut first: Option<Bytes> = None;
        let mut joined = BytesMut::new();
        while let Some(piece) = self.next_chunk().await? {
            let total = first.as_ref().map_or(0, |f| f.len()) + joined.len() + piece.len();
            if total > limit {
                return Err(too_large());
            }
            match first.take() {
                None if joined.is_empty() => first = Some(piece),
                None => joined.extend_from_slice(&piece),
                Some(f) => {
                    joined.reserve(f.len() + piece.len());
                    joined.extend_from_slice(&f);
                    joined.extend_from_slice(&piece);
                }
            }
        }
        Ok(match first {
            Some(f) => f,
            None => joined.freeze(),
        })
    }

    /// Whether the whole body has been read (the connection may then be pooled).
    pub fn is_done(&self) -> bool {
        self.decoder.is_done()
    }

    fn reusable(&self) -> bool {
        self.keepalive && self.decoder.is_done() && self.buf.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legs::within;

    fn head(raw: &[u8]) -> (usize, ResponseHeader, Framing, bool) {
        match parse_head(raw, AnswerHeaders::All).unwrap() {
            Some((len, Some((h, f, k)))) => (len, h, f, k),
            other => panic!("not a final head: {:?}", other.map(|(l, _)| l)),
        }
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let (_, h, f, k) = head(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello");
        assert_eq!((h.status.as_u16(), f, k), (200, Framing::Length(5), true));
        let (_, _, f, k) = head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n");
        assert_eq!((f, k), (Framing::Chunked, true));
        let (_, _, f, k) = head(b"HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!((f, k), (Framing::UntilClose, false));
        let (_, _, f, k) = head(b"HTTP/1.1 204 No Content\r\ncontent-length: 9\r\n\r\n");
        assert_eq!((f, k), (Framing::Length(0), true));
        let (_, _, f, k) = head(b"HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n");
        assert_eq!((f, k), (Framing::Length(1), false));
        let (_, _, _, k) =
            head(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\ncontent-length: 1\r\n\r\n");
        assert!(k);
        let (_, _, _, k) =
            head(b"HTTP/1.1 200 OK\r\nConnection: close\r\ncontent-length: 1\r\n\r\n");
        assert!(!k);
        // Both framings: chunked wins, the connection is not pooled.
        let (_, _, f, k) =
            head(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n");
        assert_eq!((f, k), (Framing::Chunked, false));
        // Identical repeats collapse; conflicts are refused.
        let (_, _, f, _) =
            head(b"HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\ncontent-length: 2\r\n\r\n");
        assert_eq!(f, Framing::Length(2));
        for bad in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: +1\r\n\r\n",
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"HTTQ/1.1 200 OK\r\n\r\n",
        ] {
            assert!(
                parse_head(bad, AnswerHeaders::All).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_head_kept_for_its_content_type_still_reads_the_framing() {
        let raw = b"HTTP/1.1 200 OK\r\ndate: Thu, 03 Dec 2026 18:00:00 GMT\r\nserver: uvicorn\r\n\
                    content-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
        let Ok(Some((len, Some((h, framing, keepalive))))) =
            parse_head(raw, AnswerHeaders::ContentTypeOnly)
        else {
            panic!("not a final head");
        };
        assert_eq!(
            (len, framing, keepalive),
            (raw.len(), Framing::Chunked, true)
        );
        assert_eq!(h.headers.len(), 1);
        assert_eq!(h.headers["content-type"], "text/event-stream");
        // All of them, for an answer that is relayed.
        let (_, h, _, _) = head(raw);
        assert_eq!(h.headers.len(), 3);
    }

    #[test]
    fn interim_heads_are_skipped_and_partial_heads_wait() {
        assert!(matches!(
            parse_head(b"HTTP/1.1 100 Continue\r\n\r\n", AnswerHeaders::All),
            Ok(Some((25, None)))
        ));
        assert!(matches!(
            parse_head(b"HTTP/1.1 200 OK\r\ncontent-le", AnswerHeaders::All),
            Ok(None)
        ));
        let (len, h, _, _) = head(
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 3\r\ncontent-length: 0\r\n\r\nX",
        );
        assert_eq!(h.status.as_u16(), 503);
        assert_eq!(h.headers.get("retry-after").unwrap(), "3");
        assert_eq!(len, 71);
    }

    #[test]
    fn request_head_and_small_body_are_one_write() {
        let headers = [(
            HeaderName::from_static("x-request-id"),
            HeaderValue::from_static("abc"),
        )];
        let req = LegRequest {
            answer_headers: AnswerHeaders::All,
            method: "POST",
            path: "/generate",
            host: "127.0.0.1:30000",
            headers: &headers,
            body: Bytes::from_static(b"{\"a\":1}").into(),
        };
        let w = RequestWire::encode(&req).unwrap();
        assert!(w.rest.is_none());
        assert_eq!(
            &w.first[..],
            &b"POST /generate HTTP/1.1\r\nhost: 127.0.0.1:30000\r\ncontent-type: application/json\r\ncontent-length: 7\r\nx-request-id: abc\r\n\r\n{\"a\":1}"[..]
        );
        let get = LegRequest {
            answer_headers: AnswerHeaders::All,
            method: "GET",
            path: "/health",
            host: "h:1",
            headers: &[],
            body: Bytes::new().into(),
        };
        assert_eq!(
            &RequestWire::encode(&get).unwrap().first[..],
            b"GET /health HTTP/1.1\r\nhost: h:1\r\n\r\n"
        );
        let big = LegRequest {
            answer_headers: AnswerHeaders::All,
            body: Bytes::from(vec![b'x'; COALESCE_BODY + 1]).into(),
            ..get
        };
        let w = RequestWire::encode(&big).unwrap();
        assert_eq!(w.rest.as_ref().map(|b| b.len()), Some(COALESCE_BODY + 1));
        for (path, host) in [("/a b", "h"), ("/a\r\nX: y", "h"), ("/a", "h\r\n")] {
            let r = LegRequest {
                answer_headers: AnswerHeaders::All,
                method: "GET",
                path,
                host,
                headers: &[],
                body: Bytes::new().into(),
            };
            assert!(RequestWire::encode(&r).is_err());
        }
    }

    /// A scripted engine: answers one request with `first`, then `rest` once told to.
    async fn engine(first: Vec<u8>, rest: Vec<u8>) -> (LegPeer, tokio::sync::mpsc::Sender<()>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = LegPeer::new(HttpPeer::new(
            listener.local_addr().unwrap(),
            false,
            String::new(),
        ));
        let (go_tx, mut go_rx) = tokio::sync::mpsc::channel::<()>(1);
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0);
                req.extend_from_slice(&buf[..n]);
            }
            s.write_all(&first).await.unwrap();
            if go_rx.recv().await.is_some() {
                s.write_all(&rest).await.unwrap();
            }
            let _ = s.read(&mut buf).await;
        });
        (peer, go_tx)
    }

    fn chunked(events: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for e in events {
            out.extend_from_slice(format!("{:x}\r\n", e.len()).as_bytes());
            out.extend_from_slice(e);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    const SSE_HEAD: &[u8] =
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

    fn get() -> LegRequest<'static> {
        LegRequest {
            answer_headers: AnswerHeaders::All,
            method: "GET",
            path: "/s",
            host: "h:1",
            headers: &[],
            body: Bytes::new().into(),
        }
    }

    #[tokio::test]
    async fn a_burst_already_in_the_socket_is_handed_on_as_one_piece() {
        // 40 events of 200 bytes, past the first read (READ_START), all written at once.
        let events: Vec<Vec<u8>> = (0..40)
            .map(|i| format!("data: {i:0>192}\n\n").into_bytes())
            .collect();
        let body = chunked(&events);
        let mut first = SSE_HEAD.to_vec();
        first.extend_from_slice(&body);
        first.extend_from_slice(b"0\r\n\r\n");
        let (peer, _go) = engine(first, Vec::new()).await;
        let client = LegClient::new(1, None);
        let mut leg = client
            .open(&peer, &get(), Duration::from_secs(10))
            .await
            .unwrap();
        let want: Vec<u8> = events.concat();
        // The engine's one write may reach us in more than one segment: whatever had arrived
        // goes on whole, so a handful of pieces at most, never one per read.
        let mut got = Vec::new();
        let mut pieces = 0;
        while let Some(p) = within(leg.next_chunk()).await.unwrap() {
            got.extend_from_slice(&p);
            pieces += 1;
        }
        assert_eq!(got, want);
        assert!(
            pieces <= 2,
            "{pieces} pieces for one burst of {} bytes",
            want.len()
        );
    }

    #[tokio::test]
    async fn what_has_arrived_goes_on_without_waiting_for_more() {
        // The head's read fills the first buffer (30 events of 200 bytes, past READ_START);
        // the rest of the stream comes only later.
        let early: Vec<Vec<u8>> = (0..30)
            .map(|i| format!("data: {i:0>192}\n\n").into_bytes())
            .collect();
        let late = vec![b"data: [DONE]\n\n".to_vec()];
        let mut first = SSE_HEAD.to_vec();
        first.extend_from_slice(&chunked(&early));
        let mut rest = chunked(&late);
        rest.extend_from_slice(b"0\r\n\r\n");
        let (peer, go) = engine(first, rest).await;
        let client = LegClient::new(1, None);
        let mut leg = client
            .open(&peer, &get(), Duration::from_secs(10))
            .await
            .unwrap();
        let want = early.concat();
        let mut got = Vec::new();
        // Everything sent so far arrives while the engine holds the rest back.
        while got.len() < want.len() {
            got.extend_from_slice(&within(leg.next_chunk()).await.unwrap().unwrap());
        }
        assert_eq!(got, want);
        // Waiting for the next event, the leg holds no read buffer (the next read goes through
        // the thread's scratch buffer).
        assert_eq!(
            leg.buf.capacity(),
            0,
            "an idle stream keeps its read buffer"
        );
        go.send(()).await.unwrap();
        assert_eq!(
            &within(leg.next_chunk()).await.unwrap().unwrap()[..],
            &late[0][..]
        );
        assert!(within(leg.next_chunk()).await.unwrap().is_none());
    }
}
