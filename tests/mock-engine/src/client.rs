//! A small HTTP/1 client for tests and for the mock's own KV data plane: one connection per
//! request, optional source-IP binding (tests send from 127.0.0.2, …), and a streaming variant
//! that yields body chunks with their arrival time and closes the connection when dropped.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::{lookup_host, TcpSocket};
use tokio::task::JoinHandle;

/// Connection options.
#[derive(Clone, Debug, Default)]
pub struct ClientOptions {
    /// Bind the client socket to this source IP (loopback only).
    pub source_ip: Option<IpAddr>,
    /// Overall deadline for connect + head (+ body for [`request_with`]).
    pub timeout: Option<Duration>,
}

/// A complete response.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    /// Lower-case header names, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// True when the content type is `text/event-stream`.
    pub fn is_sse(&self) -> bool {
        self.header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream"))
    }
}

/// One received body chunk and when it arrived.
#[derive(Clone, Debug)]
pub struct Chunk {
    pub data: Bytes,
    pub at: Instant,
}

/// A response whose body is read chunk by chunk. Dropping it closes the connection.
pub struct StreamingResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// When the head arrived.
    pub head_at: Instant,
    body: Incoming,
    conn: JoinHandle<()>,
}

impl StreamingResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The next data chunk; `None` at the end of the body.
    pub async fn next_chunk(&mut self) -> Option<io::Result<Chunk>> {
        loop {
            match self.body.frame().await? {
                Ok(f) => {
                    if let Ok(data) = f.into_data() {
                        return Some(Ok(Chunk {
                            data,
                            at: Instant::now(),
                        }));
                    }
                }
                Err(e) => return Some(Err(io::Error::other(e.to_string()))),
            }
        }
    }

    /// Reads the rest of the body. An error (connection cut) ends it with what arrived.
    pub async fn collect(mut self) -> (Vec<Chunk>, Option<io::Error>) {
        let mut out = Vec::new();
        while let Some(c) = self.next_chunk().await {
            match c {
                Ok(c) => out.push(c),
                Err(e) => return (out, Some(e)),
            }
        }
        (out, None)
    }

    /// Reads the rest of the body into one buffer.
    pub async fn body_bytes(self) -> io::Result<Bytes> {
        let (chunks, err) = self.collect().await;
        if let Some(e) = err {
            return Err(e);
        }
        Ok(chunks
            .into_iter()
            .flat_map(|c| c.data.to_vec())
            .collect::<Vec<u8>>()
            .into())
    }
}

impl Drop for StreamingResponse {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

struct ParsedUrl {
    host: String,
    port: u16,
    path: String,
}

fn parse_url(url: &str) -> io::Result<ParsedUrl> {
    let bad = || io::Error::new(io::ErrorKind::InvalidInput, format!("bad url {url}"));
    let rest = url.strip_prefix("http://").ok_or_else(bad)?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = if let Some(h) = authority.strip_prefix('[') {
        let (h, p) = h.split_once(']').ok_or_else(bad)?;
        (
            h.to_string(),
            p.strip_prefix(':')
                .map(|p| p.parse::<u16>())
                .transpose()
                .map_err(|_| bad())?
                .unwrap_or(80),
        )
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse::<u16>().map_err(|_| bad())?),
            None => (authority.to_string(), 80),
        }
    };
    Ok(ParsedUrl {
        host,
        port,
        path: path.to_string(),
    })
}

async fn connect(opts: &ClientOptions, u: &ParsedUrl) -> io::Result<tokio::net::TcpStream> {
    let addr: SocketAddr = lookup_host((u.host.as_str(), u.port))
        .await?
        .find(|a| a.is_ipv4() == opts.source_ip.is_none_or(|s| s.is_ipv4()))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("cannot resolve {}", u.host),
            )
        })?;
    let sock = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(ip) = opts.source_ip {
        sock.bind(SocketAddr::new(ip, 0))?;
    }
    let s = sock.connect(addr).await?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

async fn open(
    opts: &ClientOptions,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Bytes>,
) -> io::Result<StreamingResponse> {
    let u = parse_url(url)?;
    let stream = connect(opts, &u).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| io::Error::other(e.to_string()))?;
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let host_hdr = if u.host.contains(':') {
        format!("[{}]:{}", u.host, u.port)
    } else {
        format!("{}:{}", u.host, u.port)
    };
    let mut b = http::Request::builder()
        .method(method)
        .uri(&u.path)
        .header("host", host_hdr);
    let has_ct = headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"));
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    if body.is_some() && !has_ct {
        b = b.header("content-type", "application/json");
    }
    let req = b
        .body(Full::new(body.unwrap_or_default()))
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let resp = match sender.send_request(req).await {
        Ok(r) => r,
        Err(e) => {
            conn.abort();
            return Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                e.to_string(),
            ));
        }
    };
    let head_at = Instant::now();
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    Ok(StreamingResponse {
        status,
        headers,
        head_at,
        body: resp.into_body(),
        conn,
    })
}

async fn with_timeout<T>(
    t: Option<Duration>,
    f: impl std::future::Future<Output = io::Result<T>>,
) -> io::Result<T> {
    match t {
        Some(t) => tokio::time::timeout(t, f)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "request timed out"))?,
        None => f.await,
    }
}

/// Sends one request and reads the whole response.
pub async fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Bytes>,
) -> io::Result<Response> {
    request_with(&ClientOptions::default(), method, url, headers, body).await
}

/// [`request`] with options (source IP, deadline).
pub async fn request_with(
    opts: &ClientOptions,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Bytes>,
) -> io::Result<Response> {
    with_timeout(opts.timeout, async {
        let s = open(opts, method, url, headers, body).await?;
        let status = s.status;
        let headers = s.headers.clone();
        let body = s.body_bytes().await?;
        Ok(Response {
            status,
            headers,
            body,
        })
    })
    .await
}

/// Sends one request and returns as soon as the head arrived; read the body with
/// [`StreamingResponse::next_chunk`]. Dropping the result closes the connection.
pub async fn stream(
    opts: &ClientOptions,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Bytes>,
) -> io::Result<StreamingResponse> {
    with_timeout(opts.timeout, open(opts, method, url, headers, body)).await
}

/// POSTs a JSON value. The URL is taken by value up front, so `&format!(..)` works inside
/// `tokio::join!`.
pub fn post_json(
    url: impl Into<String>,
    v: &serde_json::Value,
) -> impl std::future::Future<Output = io::Result<Response>> + Send + 'static {
    let url = url.into();
    let body = serde_json::to_vec(v).map(Bytes::from);
    async move {
        request(
            "POST",
            &url,
            &[("content-type", "application/json")],
            Some(body?),
        )
        .await
    }
}

/// GETs a URL.
pub fn get(
    url: impl Into<String>,
) -> impl std::future::Future<Output = io::Result<Response>> + Send + 'static {
    let url = url.into();
    async move { request("GET", &url, &[], None).await }
}

/// Why a request on a [`KeepAlive`] connection failed.
#[derive(Debug)]
pub enum KeepAliveError {
    /// No connection could be opened (nothing listens): the request never left the client.
    Connect(io::Error),
    /// The request was sent (or being sent) and no complete answer came back: the error of a
    /// client whose server closed or reset the connection under it. `reused` tells whether the
    /// connection had carried an earlier request.
    Exchange { reused: bool, error: String },
}

impl std::fmt::Display for KeepAliveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeepAliveError::Connect(e) => write!(f, "connect: {e}"),
            KeepAliveError::Exchange { reused, error } => {
                write!(f, "exchange (reused connection: {reused}): {error}")
            }
        }
    }
}

/// One client with one HTTP/1.1 keep-alive connection it reuses like a pooled client (aiohttp,
/// `requests.Session`): it opens a new connection only when the server answered
/// `Connection: close` or had closed the idle one before the next request went out, and it
/// never retries a request that failed on the wire.
pub struct KeepAlive {
    addr: SocketAddr,
    sender: Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>>,
    conn: Option<JoinHandle<()>>,
    used: bool,
    /// Connections opened so far.
    pub connections: usize,
}

impl KeepAlive {
    pub fn new(addr: SocketAddr) -> KeepAlive {
        KeepAlive {
            addr,
            sender: None,
            conn: None,
            used: false,
            connections: 0,
        }
    }

    /// The connection to send on, taken out: the current one while it is open, else a new one.
    async fn take_ready(
        &mut self,
    ) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>, KeepAliveError> {
        if let Some(mut s) = self.sender.take() {
            if s.ready().await.is_ok() {
                return Ok(s);
            }
        }
        if let Some(c) = self.conn.take() {
            c.abort();
        }
        let stream = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(KeepAliveError::Connect)?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| KeepAliveError::Connect(io::Error::other(e.to_string())))?;
        self.conn = Some(tokio::spawn(async move {
            let _ = conn.await;
        }));
        self.used = false;
        self.connections += 1;
        Ok(sender)
    }

    /// POSTs `body` to `path` and reads the whole answer.
    pub async fn post_json(
        &mut self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<Response, KeepAliveError> {
        let req = http::Request::builder()
            .method("POST")
            .uri(path)
            .header("host", self.addr.to_string())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("a valid request");
        let mut sender = self.take_ready().await?;
        let reused = std::mem::replace(&mut self.used, true);
        let fail = |error: String| KeepAliveError::Exchange { reused, error };
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let status = resp.status().as_u16();
        let headers: Vec<(String, String)> = resp
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| fail(e.to_string()))?
            .to_bytes();
        let response = Response {
            status,
            headers,
            body,
        };
        // Kept for the next request unless the server said this was its last; a connection the
        // server closes later is noticed by `ready` before the next request goes out.
        if !response
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
        {
            self.sender = Some(sender);
        }
        Ok(response)
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        if let Some(c) = self.conn.take() {
            c.abort();
        }
    }
}
