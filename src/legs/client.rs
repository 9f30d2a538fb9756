//! The sub-request module's transport: one pooled HTTP/1.1 client over Pingora's `Connector`,
//! used for both legs of a PD request, health probes and single-leg admin calls.
//!
//! Why Pingora's connector and not a second HTTP stack: the same peer/timeout model and keepalive
//! pool as the proxy, and no extra dependency (research/pingora-design.md §2). A leg is opened by
//! writing the whole request and reading the response head; its body is then pulled chunk by
//! chunk. Dropping an [`OpenLeg`] closes its connection — that is how a leg is "dropped", and the
//! engine sees the hang-up and aborts its side of the rendezvous.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderName, HeaderValue};
use pingora::connectors::http::v1::Connector;
use pingora::connectors::ConnectorOptions;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::protocols::http::v1::client::HttpSession;
use pingora::upstreams::peer::HttpPeer;

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
    pub body: Bytes,
}

/// The pooled client. One per service runtime: pooled sockets belong to the reactor that made
/// them (Pingora's own warning), so the proxy, health and admin services each build their own.
pub struct LegClient {
    connector: Connector,
    pool_idle: Option<Duration>,
}

impl LegClient {
    /// `pool_size` caps idle pooled connections; `pool_idle` is how long one may sit idle (keep
    /// it below the engines' own keep-alive, or a reused socket races the engine's close).
    pub fn new(pool_size: usize, pool_idle: Option<Duration>) -> Self {
        let opts = ConnectorOptions::new(pool_size);
        LegClient {
            connector: Connector::new(Some(opts)),
            pool_idle,
        }
    }

    /// Sends the request and reads the response head within `head_timeout`.
    ///
    /// A pooled connection that fails before any response arrives (typically closed by the
    /// engine while idle) is retried once on a fresh connection; nothing else is retried here.
    pub async fn open(
        &self,
        peer: &HttpPeer,
        req: &LegRequest<'_>,
        head_timeout: Duration,
    ) -> Result<OpenLeg, LegError> {
        let header = build_request_header(req)?;
        let (session, reused) = self.connect(peer).await?;
        match send_and_read_head(session, header.clone(), &req.body, head_timeout).await {
            Err((e, true)) if reused && e.before_response() => {
                let (session, _) = self.connect(peer).await?;
                send_and_read_head(session, header, &req.body, head_timeout)
                    .await
                    .map_err(|(e, _)| e)
            }
            other => other.map_err(|(e, _)| e),
        }
    }

    async fn connect(&self, peer: &HttpPeer) -> Result<(HttpSession, bool), LegError> {
        self.connector
            .get_http_session(peer)
            .await
            .map_err(|e| LegError::new(LegErrorKind::Connect, e))
    }

    /// Returns a finished leg's connection to the pool (only if its body was read to the end
    /// and the engine allows keep-alive; otherwise it is closed).
    pub async fn release(&self, leg: OpenLeg, peer: &HttpPeer) {
        self.connector
            .release_http_session(leg.session, peer, self.pool_idle)
            .await;
    }
}

fn build_request_header(req: &LegRequest<'_>) -> Result<Box<RequestHeader>, LegError> {
    let bad = |e: pingora::Error| LegError::new(LegErrorKind::Send, e);
    let mut h = RequestHeader::build(req.method, req.path.as_bytes(), Some(req.headers.len() + 3))
        .map_err(|e| bad(*e))?;
    h.insert_header("host", req.host).map_err(|e| bad(*e))?;
    if !req.body.is_empty() || req.method == "POST" {
        h.insert_header("content-type", "application/json")
            .map_err(|e| bad(*e))?;
        h.insert_header("content-length", req.body.len())
            .map_err(|e| bad(*e))?;
    }
    for (name, value) in req.headers {
        h.append_header(name.clone(), value.clone())
            .map_err(|e| bad(*e))?;
    }
    Ok(Box::new(h))
}

/// Err carries whether the failure happened before any response byte (retryable on a fresh
/// connection when the socket came from the pool).
async fn send_and_read_head(
    mut session: HttpSession,
    header: Box<RequestHeader>,
    body: &Bytes,
    head_timeout: Duration,
) -> Result<OpenLeg, (LegError, bool)> {
    if let Err(e) = session.write_request_header(header).await {
        return Err((LegError::new(LegErrorKind::Send, e), true));
    }
    if !body.is_empty() {
        if let Err(e) = session.write_body(body).await {
            return Err((LegError::new(LegErrorKind::Send, e), true));
        }
    }
    if let Err(e) = session.finish_body().await {
        return Err((LegError::new(LegErrorKind::Send, e), true));
    }
    match tokio::time::timeout(head_timeout, session.read_response()).await {
        Err(_) => Err((
            LegError::new(
                LegErrorKind::Timeout,
                format!("no response head within {head_timeout:?}"),
            ),
            false,
        )),
        Ok(Err(e)) => Err((LegError::new(LegErrorKind::Head, e), true)),
        Ok(Ok(_)) => {
            let status = session.get_status().map(|s| s.as_u16()).unwrap_or(0);
            Ok(OpenLeg { session, status })
        }
    }
}

/// A leg whose response head has arrived. Dropping it closes the connection.
pub struct OpenLeg {
    session: HttpSession,
    status: u16,
}

impl OpenLeg {
    pub fn status(&self) -> u16 {
        self.status
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The response head (present once opened).
    pub fn head(&self) -> Option<&ResponseHeader> {
        self.session.resp_header()
    }

    pub fn header_str(&self, name: &str) -> Option<&str> {
        self.session.get_header(name).and_then(|v| v.to_str().ok())
    }

    /// Sets the longest wait for any single read of the body (the stall deadline).
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) {
        self.session.read_timeout = timeout;
    }

    /// The next body chunk as it arrives; `None` at the end of the body.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>, LegError> {
        self.session.read_body_bytes().await.map_err(|e| {
            let kind = if matches!(e.etype(), pingora::ErrorType::ReadTimedout) {
                LegErrorKind::Timeout
            } else {
                LegErrorKind::Body
            };
            LegError::new(kind, e)
        })
    }

    /// Reads the rest of the body, refusing more than `limit` bytes.
    pub async fn read_to_end(&mut self, limit: usize) -> Result<Bytes, LegError> {
        let mut first: Option<Bytes> = None;
        let mut buf = BytesMut::new();
        while let Some(chunk) = self.next_chunk().await? {
            let total = first.as_ref().map_or(0, |f| f.len()) + buf.len() + chunk.len();
            if total > limit {
                return Err(LegError::new(
                    LegErrorKind::TooLarge,
                    format!("more than {limit} bytes"),
                ));
            }
            match first.take() {
                None if buf.is_empty() => first = Some(chunk),
                None => buf.extend_from_slice(&chunk),
                Some(f) => {
                    buf.reserve(f.len() + chunk.len());
                    buf.extend_from_slice(&f);
                    buf.extend_from_slice(&chunk);
                }
            }
        }
        Ok(match first {
            Some(f) => f,
            None => buf.freeze(),
        })
    }

    /// Whether the whole body has been read (the connection may then be pooled).
    pub fn is_done(&mut self) -> bool {
        self.session.is_body_done()
    }
}
