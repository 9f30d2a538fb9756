//! The data plane's connection to one gRPC worker: a single HTTP/2 connection whose hyper
//! `SendRequest` every leg clones and sends on directly, reconnected on first use after it
//! closed.
//!
//! Why not tonic's `Channel`: it is a `tower::Buffer` in front of the connection, so every call
//! is handed to the buffer's worker task over a channel and answered over a oneshot (two task
//! wake-ups, often across threads), and its origin, user-agent and timeout layers rebuild each
//! request's URI and box each response body. A leg sends on the HTTP/2 connection itself; the
//! h2 connection task is the only other task involved. Settings are SMG's channel settings
//! (see [`crate::workers::grpc`]): HTTP/2 keep-alive pings every 30 s with a 10 s timeout, also
//! while idle, TCP keep-alive 60 s, no Nagle, 16/32 MiB windows, adaptive flow control, the
//! worker's connect timeout.
//!
//! Failures: a connection that cannot be made, or that closed under a call, is `UNAVAILABLE`
//! (what tonic's channel answers, and what the attempt loop retries); an error on an open
//! stream comes from the response body as before.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tonic::body::Body;
use tonic::Status;

use crate::workers::grpc::{
    CONNECTION_WINDOW, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT, STREAM_WINDOW, TCP_KEEPALIVE,
};
use crate::workers::WorkerAddress;

/// `user-agent` of every call (engines log it).
const USER_AGENT: &str = concat!("pdgate/", env!("CARGO_PKG_VERSION"));

/// A worker's data-plane gRPC connection; cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct LegChannel {
    shared: Arc<Shared>,
}

struct Shared {
    socket: SocketAddr,
    /// The URL's host, the calls' `:authority`.
    authority: Authority,
    connect_timeout: Duration,
    /// The open connection's sender (`None` before the first call, or after one failed to
    /// connect). Locked only to clone or replace it.
    sender: Mutex<Option<http2::SendRequest<Body>>>,
    /// Held while connecting, so concurrent first calls make one connection.
    connecting: tokio::sync::Mutex<()>,
}

impl LegChannel {
    /// A channel that connects on its first call (nothing is dialled here).
    pub fn lazy(address: &WorkerAddress, socket: SocketAddr, connect_timeout: Duration) -> Self {
        let authority = address
            .authority
            .parse()
            .or_else(|_| socket.to_string().parse())
            .expect("a socket address is a valid authority");
        LegChannel {
            shared: Arc::new(Shared {
                socket,
                authority,
                connect_timeout,
                sender: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
            }),
        }
    }
}

impl Shared {
    fn open_sender(&self) -> Option<http2::SendRequest<Body>> {
        self.sender
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .filter(|s| !s.is_closed())
            .cloned()
    }

    async fn sender(&self) -> Result<http2::SendRequest<Body>, Status> {
        if let Some(s) = self.open_sender() {
            return Ok(s);
        }
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(s) = self.open_sender() {
            return Ok(s);
        }
        let sender = self.connect().await?;
        *self.sender.lock().unwrap_or_else(|e| e.into_inner()) = Some(sender.clone());
        Ok(sender)
    }

    /// A new connection, TCP connect and HTTP/2 preface both within the worker's connect timeout.
    async fn connect(&self) -> Result<http2::SendRequest<Body>, Status> {
        let unavailable = |what: &str, e: &dyn std::fmt::Display| {
            Status::unavailable(format!("{what} {}: {e}", self.socket))
        };
        let open = async {
            let tcp = tokio::net::TcpStream::connect(self.socket)
                .await
                .map_err(|e| unavailable("connecting to", &e))?;
            let _ = tcp.set_nodelay(true);
            let _ = socket2::SockRef::from(&tcp)
                .set_tcp_keepalive(&socket2::TcpKeepalive::new().with_time(TCP_KEEPALIVE));
            http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .initial_stream_window_size(STREAM_WINDOW)
                .initial_connection_window_size(CONNECTION_WINDOW)
                .adaptive_window(true)
                .keep_alive_interval(KEEPALIVE_INTERVAL)
                .keep_alive_timeout(KEEPALIVE_TIMEOUT)
                .keep_alive_while_idle(true)
                .handshake(TokioIo::new(tcp))
                .await
                .map_err(|e| unavailable("HTTP/2 handshake with", &e))
        };
        let (sender, connection) = tokio::time::timeout(self.connect_timeout, open)
            .await
            .map_err(|e| unavailable("connecting to", &e))??;
        let socket = self.socket;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                log::debug!("gRPC connection to {socket} ended: {e}");
            }
        });
        Ok(sender)
    }

    /// `path` on this worker: the absolute URI hyper takes `:scheme` and `:authority` from.
    fn uri(&self, path: Option<&PathAndQuery>) -> Result<Uri, Status> {
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(Scheme::HTTP);
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = path.cloned();
        Uri::from_parts(parts).map_err(|e| Status::internal(format!("request URI: {e}")))
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type CallFuture = Pin<Box<dyn Future<Output = Result<Response<Incoming>, BoxError>> + Send>>;

impl tower_service::Service<Request<Body>> for LegChannel {
    type Response = Response<Incoming>;
    type Error = BoxError;
    type Future = CallFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Readiness is the connection's, checked by the call (a closed one is replaced).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> CallFuture {
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let (mut parts, body) = req.into_parts();
            parts.uri = shared.uri(parts.uri.path_and_query())?;
            parts.headers.insert(
                http::header::USER_AGENT,
                HeaderValue::from_static(USER_AGENT),
            );
            // Every call the legs make sends one message. Sent as a body that knows its end,
            // it goes out as one DATA frame carrying END_STREAM, in the same write as the
            // HEADERS; tonic's streaming body ends only when polled again, which costs a
            // second frame and, often, a write of its own.
            let message = body.collect().await?.to_bytes();
            let req = Request::from_parts(parts, Body::new(Full::new(message)));
            let mut sender = shared.sender().await?;
            match sender.send_request(req).await {
                Ok(response) => Ok(response),
                // The connection closed before the call went out, or under it: the engine did
                // not take it, so the attempt may go elsewhere.
                Err(e) if e.is_canceled() || e.is_closed() => Err(Box::new(Status::unavailable(
                    format!("{}: {e}", shared.socket),
                )) as BoxError),
                // Anything else maps as tonic maps a hyper error.
                Err(e) => Err(Box::new(e) as BoxError),
            }
        })
    }
}
