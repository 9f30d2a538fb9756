//! The data plane's connection to one gRPC worker: a single HTTP/2 connection (the `h2`
//! crate's client) whose request handle every leg clones and sends on directly, reconnected on
//! first use after it closed.
//!
//! Why not tonic's `Channel`: it is a `tower::Buffer` in front of the connection, so every call
//! is handed to the buffer's worker task over a channel and answered over a oneshot (two task
//! wake-ups, often across threads), and its origin, user-agent and timeout layers rebuild each
//! request's URI and box each response body. Why not hyper's HTTP/2 client either (it was used
//! here before): hyper sends a request body through a pipe that waits for flow-control
//! capacity, and h2 grants none to a stream until its HEADERS have been written, so every call
//! was two writes (HEADERS, then DATA), the second often from a task hyper spawned for the pipe.
//! Here a call queues its HEADERS and its one DATA frame (with END_STREAM) together, and the
//! connection task writes both at once: one write per leg.
//!
//! Settings are SMG's channel settings (see [`crate::workers::grpc`]): HTTP/2 keep-alive pings
//! every 30 s with a 10 s timeout, also while idle (a connection whose ping goes unanswered is
//! closed), TCP keep-alive 60 s, no Nagle, 16/32 MiB windows, the worker's connect timeout, no
//! server push; more reset streams remembered than h2's default, no limit on the frames that
//! arrive on forgotten ones ([`RESET_STREAMS_REMEMBERED`]), and unread token frames bounded by
//! the connection window alone ([`UNREAD_FRAME_BUDGET`]).
//! The windows stay at their initial sizes (hyper's adaptive window would only
//! grow them; a leg's messages are small).
//!
//! Failures: a connection that cannot be made, or that closed under a call, is `UNAVAILABLE`
//! (what tonic's channel answers, and what the attempt loop retries), as is a stream the engine
//! refused; an error on an open stream comes from the response body.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri};
use http_body_util::BodyExt;
use hyper::body::Frame;
use tonic::body::Body;
use tonic::{Code, Status};

use crate::workers::grpc::{
    CONNECTION_WINDOW, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT, STREAM_WINDOW, TCP_KEEPALIVE,
};
use crate::workers::WorkerAddress;

/// Streams this side reset (a leg dropped mid-call: the client went away, an abort) that h2
/// remembers (for 1 s, its default), so the frames the engine had already sent on them are
/// dropped quietly. h2's default is 50 (each is a few hundred bytes while remembered).
///
/// A frame that arrives on a reset stream h2 has forgotten is a protocol error, which h2
/// answers with another reset and counts for the connection's lifetime; by default, at 1,024
/// it closes the connection with every call on it. That limit is a server's defence against a
/// hostile client; here the peer is the gateway's own engine, and a few thousand clients hanging
/// up together (a load balancer restarting) must not cut every other stream on that worker.
/// So the count is not limited ([`h2::client::Builder::max_local_error_reset_streams`]).
const RESET_STREAMS_REMEMBERED: usize = 1024;

/// Unread DATA frames h2 lets a connection hold, counted as what each frame under 256 bytes
/// costs beyond its payload (h2's own budget, by default half the connection window: 16 MiB).
/// A token stream is frames of a few dozen bytes, and a client that stops reading stops the
/// relay reading its leg, so h2 buffered ~70,000 of them — a few long generations to slow
/// clients — before closing the connection and every other call on it. The connection window
/// already bounds what is buffered (32 MiB of payload, plus h2's bookkeeping per frame); the
/// budget is set so that only the window can run out: every byte of it in one-byte frames.
const UNREAD_FRAME_BUDGET: usize = CONNECTION_WINDOW as usize * 256;

/// `user-agent` of every call (engines log it).
const USER_AGENT: &str = concat!("pdgate/", env!("CARGO_PKG_VERSION"));

/// A worker's data-plane gRPC connection; cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct LegChannel {
    shared: Arc<Shared>,
}

/// An open connection: its request handle, and whether its connection task has ended.
#[derive(Clone)]
struct Open {
    sender: h2::client::SendRequest<Bytes>,
    closed: Arc<AtomicBool>,
}

struct Shared {
    socket: SocketAddr,
    /// The URL's host, the calls' `:authority`.
    authority: Authority,
    connect_timeout: Duration,
    /// HTTP/2 keep-alive: a PING this often, and how long its answer may take.
    keep_alive: (Duration, Duration),
    /// The open connection (`None` before the first call, or after one failed to connect).
    /// Locked only to clone or replace it.
    sender: Mutex<Option<Open>>,
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
                keep_alive: (KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT),
                sender: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
            }),
        }
    }
}

impl Shared {
    fn open_sender(&self) -> Option<Open> {
        self.sender
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .filter(|o| !o.closed.load(Ordering::Acquire))
            .cloned()
    }

    async fn sender(&self) -> Result<Open, Status> {
        if let Some(o) = self.open_sender() {
            return Ok(o);
        }
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(o) = self.open_sender() {
            return Ok(o);
        }
        let open = self.connect().await?;
        *self.sender.lock().unwrap_or_else(|e| e.into_inner()) = Some(open.clone());
        Ok(open)
    }

    /// A new connection, TCP connect and HTTP/2 preface both within the worker's connect timeout.
    async fn connect(&self) -> Result<Open, Status> {
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
            h2::client::Builder::new()
                .initial_window_size(STREAM_WINDOW)
                .initial_connection_window_size(CONNECTION_WINDOW)
                .enable_push(false)
                .max_concurrent_reset_streams(RESET_STREAMS_REMEMBERED)
                .max_local_error_reset_streams(None)
                .data_frame_budget(UNREAD_FRAME_BUDGET)
                .handshake::<_, Bytes>(tcp)
                .await
                .map_err(|e| unavailable("HTTP/2 handshake with", &e))
        };
        let (sender, mut connection) = tokio::time::timeout(self.connect_timeout, open)
            .await
            .map_err(|e| unavailable("connecting to", &e))??;
        let pings = connection.ping_pong();
        let closed = Arc::new(AtomicBool::new(false));
        let socket = self.socket;
        let ended = closed.clone();
        let (every, within) = self.keep_alive;
        tokio::spawn(async move {
            tokio::select! {
                r = &mut connection => if let Err(e) = r {
                    log::debug!("gRPC connection to {socket} ended: {e}");
                },
                _ = keep_alive(pings, every, within) => log::debug!(
                    "gRPC connection to {socket}: no PING answer within {within:?}, closed"
                ),
            }
            // Dropping the connection fails every stream still on it.
            ended.store(true, Ordering::Release);
        });
        Ok(Open { sender, closed })
    }

    /// `path` on this worker: the absolute URI h2 takes `:scheme` and `:authority` from.
    fn uri(&self, path: Option<&PathAndQuery>) -> Result<Uri, Status> {
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(Scheme::HTTP);
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = path.cloned();
        Uri::from_parts(parts).map_err(|e| Status::internal(format!("request URI: {e}")))
    }
}

/// HTTP/2 keep-alive: a PING `every` (SMG: [`KEEPALIVE_INTERVAL`]), idle or not; returns when
/// one is not answered `within` ([`KEEPALIVE_TIMEOUT`]), or the connection is gone.
async fn keep_alive(pings: Option<h2::PingPong>, every: Duration, within: Duration) {
    let Some(mut pings) = pings else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(every).await;
        match tokio::time::timeout(within, pings.ping(h2::Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            _ => return,
        }
    }
}

/// The status of an HTTP/2 failure: a connection that failed or went away, or a stream the
/// engine refused, is `UNAVAILABLE` (the engine did not take the call: it may go elsewhere);
/// otherwise by the stream's reset reason, as tonic maps them.
fn status_of(e: &h2::Error) -> Status {
    let code = if e.is_io() || e.is_go_away() {
        Code::Unavailable
    } else {
        match e.reason() {
            Some(h2::Reason::REFUSED_STREAM) => Code::Unavailable,
            Some(h2::Reason::CANCEL) => Code::Cancelled,
            Some(h2::Reason::ENHANCE_YOUR_CALM) => Code::ResourceExhausted,
            Some(h2::Reason::INADEQUATE_SECURITY) => Code::PermissionDenied,
            _ => Code::Internal,
        }
    };
    Status::new(code, format!("h2 protocol error: {e}"))
}

/// A call's response body: the stream's DATA (its flow-control window released as it is read),
/// then its trailers (the gRPC status).
pub struct LegBody {
    recv: h2::RecvStream,
    data_done: bool,
}

impl hyper::body::Body for LegBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if !self.data_done {
            match ready!(self.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(status_of(&e)))),
                None => self.data_done = true,
            }
        }
        match ready!(self.recv.poll_trailers(cx)) {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(status_of(&e)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type CallFuture = Pin<Box<dyn Future<Output = Result<Response<LegBody>, BoxError>> + Send>>;

impl tower_service::Service<Request<Body>> for LegChannel {
    type Response = Response<LegBody>;
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
            // Every call the legs make sends one message: queued as one DATA frame carrying
            // END_STREAM right behind the HEADERS, both go out in the connection's next write.
            let message = body.collect().await?.to_bytes();
            let open = shared.sender().await?;
            let gone = |e: h2::Error| -> BoxError {
                Box::new(Status::unavailable(format!("{}: {e}", shared.socket)))
            };
            let mut sender = open.sender.ready().await.map_err(gone)?;
            let (response, mut stream) = sender
                .send_request(Request::from_parts(parts, ()), false)
                .map_err(gone)?;
            stream
                .send_data(message, true)
                .map_err(|e| Box::new(status_of(&e)) as BoxError)?;
            match response.await {
                Ok(response) => Ok(response.map(|recv| LegBody {
                    recv,
                    data_done: false,
                })),
                Err(e) => Err(Box::new(status_of(&e)) as BoxError),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A peer that takes the connection and reads it, but never answers anything (an engine
    /// wedged, or a path that silently drops packets).
    async fn silent_peer() -> (WorkerAddress, SocketAddr) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let socket = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut sink = [0u8; 4096];
            while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
        });
        (
            WorkerAddress::parse(&format!("grpc://{socket}")).unwrap(),
            socket,
        )
    }

    #[tokio::test]
    async fn a_connection_whose_ping_goes_unanswered_is_closed_and_replaced() {
        let (address, socket) = silent_peer().await;
        let mut channel = LegChannel::lazy(&address, socket, Duration::from_secs(10));
        Arc::get_mut(&mut channel.shared).unwrap().keep_alive =
            (Duration::from_millis(20), Duration::from_millis(50));
        let first = channel.shared.sender().await.unwrap();
        assert!(!first.closed.load(Ordering::Acquire));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !first.closed.load(Ordering::Acquire) {
            assert!(
                std::time::Instant::now() < deadline,
                "an unanswered PING did not close the connection"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The next call does not get the closed connection.
        assert!(channel.shared.open_sender().is_none());
    }

    /// A call of one message on `open`, as a leg makes it; resolves with the response head.
    async fn call(open: &Open, socket: SocketAddr) -> Result<Response<h2::RecvStream>, h2::Error> {
        let mut sender = open.sender.clone().ready().await?;
        let request = Request::post(format!("http://{socket}/x"))
            .body(())
            .unwrap();
        let (response, mut stream) = sender.send_request(request, false)?;
        stream.send_data(Bytes::from_static(b"call"), true)?;
        response.await
    }

    /// Many calls dropped at once while the engine is still sending on them (clients hanging up
    /// together): the frames that arrive after the resets do not close the connection.
    #[tokio::test]
    async fn a_mass_hang_up_does_not_close_the_connection() {
        // Four times the resets h2 remembers here: frames arrive on thousands of forgotten streams.
        const CALLS: usize = 4 * RESET_STREAMS_REMEMBERED;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let socket = listener.local_addr().unwrap();
        let resets = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = resets.clone();
        // Generation starts once every call is open (else the first calls' tokens would fill
        // the connection's flow-control window before the last calls got theirs).
        let (all_open, started) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut conn = h2::server::handshake(tcp).await.unwrap();
            let mut accepted = 0;
            while let Some(Ok((_req, mut respond))) = conn.accept().await {
                let seen = seen.clone();
                let mut started = started.clone();
                accepted += 1;
                if accepted == CALLS {
                    all_open.send_replace(true);
                }
                tokio::spawn(async move {
                    let head = http::Response::builder().body(()).unwrap();
                    let mut send = respond.send_response(head, false).unwrap();
                    let _ = started.wait_for(|go| *go).await;
                    // Tokens as fast as it can until the client resets the stream (a
                    // generating engine: there are always tokens on the way).
                    loop {
                        if send.send_data(Bytes::from_static(b"token"), false).is_err() {
                            break;
                        }
                        tokio::task::yield_now().await;
                        let reset = std::future::poll_fn(|cx| {
                            Poll::Ready(matches!(send.poll_reset(cx), Poll::Ready(_)))
                        })
                        .await;
                        if reset {
                            break;
                        }
                    }
                    seen.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        let address = WorkerAddress::parse(&format!("grpc://{socket}")).unwrap();
        let channel = LegChannel::lazy(&address, socket, Duration::from_secs(10));
        let open = channel.shared.sender().await.unwrap();
        let mut bodies = Vec::with_capacity(CALLS);
        for _ in 0..CALLS {
            bodies.push(call(&open, socket).await.unwrap().into_body());
        }
        for body in &mut bodies {
            // The first token came: the engine is generating.
            body.data().await.unwrap().unwrap();
        }
        // Every client hangs up at once.
        drop(bodies);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while resets.load(Ordering::SeqCst) < CALLS {
            assert!(
                std::time::Instant::now() < deadline,
                "the engine saw {} of {CALLS} calls end",
                resets.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A call after the storm still goes out on the same connection.
        let mut body = call(&open, socket)
            .await
            .expect("the connection survived")
            .into_body();
        body.data().await.unwrap().unwrap();
        assert!(!open.closed.load(Ordering::Acquire));
    }

    /// A stream nobody reads for a while (its client stopped reading) while the engine keeps
    /// generating: the connection holds its tokens and serves other calls, up to its window.
    #[tokio::test]
    async fn an_unread_token_stream_does_not_close_the_connection() {
        // 100,000 tokens of 40 bytes: 4 MB, within the stream's window; past h2's default
        // budget for small frames (~70,000 of this size).
        const TOKENS: usize = 100_000;
        const TOKEN: usize = 40;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let socket = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut conn = h2::server::handshake(tcp).await.unwrap();
            let mut first = true;
            while let Some(Ok((_req, mut respond))) = conn.accept().await {
                let tokens = if first { TOKENS } else { 1 };
                first = false;
                tokio::spawn(async move {
                    let head = http::Response::builder().body(()).unwrap();
                    let mut send = respond.send_response(head, false).unwrap();
                    let token = Bytes::from(vec![b't'; TOKEN]);
                    for i in 1..=tokens {
                        if send.send_data(token.clone(), false).is_err() {
                            return;
                        }
                        if i % 1_000 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                    // Held open: the client decides when the call ends.
                    std::future::pending::<()>().await;
                });
            }
        });
        let address = WorkerAddress::parse(&format!("grpc://{socket}")).unwrap();
        let channel = LegChannel::lazy(&address, socket, Duration::from_secs(10));
        let open = channel.shared.sender().await.unwrap();
        let mut stalled = call(&open, socket).await.unwrap().into_body();
        // Wait until every token has arrived unread (the stream's window shrank by all of
        // them), or the connection closed.
        let all_in = STREAM_WINDOW as isize - (TOKENS * TOKEN) as isize;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while stalled.flow_control().available_capacity() > all_in
            && !open.closed.load(Ordering::Acquire)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the tokens did not arrive"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            !open.closed.load(Ordering::Acquire),
            "unread tokens closed the connection"
        );
        let mut other = call(&open, socket)
            .await
            .expect("the connection survived")
            .into_body();
        assert!(other.data().await.unwrap().is_ok());
        drop(stalled);
    }
}
