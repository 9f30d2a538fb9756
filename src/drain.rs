//! Draining client connections at a graceful upgrade (SIGQUIT) or shutdown (SIGTERM) without
//! losing a request a keep-alive client has already sent.
//!
//! Pingora 0.9.1, left to itself, drops every idle keep-alive connection the moment its shutdown
//! starts (`HttpProxy::http_cleanup` wakes each session parked in `read_request` and drops it).
//! A client that is sending its next request on such a connection at that moment gets a reset
//! (unread data on close) or an EOF instead of an answer; the black-box run lost 5 of 300
//! requests from 16 `aiohttp` keep-alive clients that way. So pdgate hosts its proxy services in
//! [`DrainingApp`], which owns the wait between two requests of a connection:
//!
//! 1. **Drain starts** when the listeners have been handed to the new process (execution phase
//!    `GracefulUpgradeCloseTimeout`) or, on SIGTERM, when the shutdown starts.
//! 2. From then on every response whose head has not gone out carries `Connection: close`
//!    ([`Drain::close_if_draining`]), so a client learns to reconnect (to the new process) from
//!    an answer, never from a closed socket.
//! 3. An idle connection keeps waiting for its next request for the grace period at an
//!    upgrade (`grace_period_seconds`), at most [`TERMINATE_IDLE_WAIT`] on SIGTERM; a request
//!    that arrives is read and served, with `Connection: close`. A new connection (accepted
//!    until the listener closes) waits for its first request up to
//!    [`FIRST_REQUEST_AFTER_DRAIN`] past that.
//! 4. A connection still idle at the end is closed so that no client can race it: a half-close
//!    (FIN) first, then its input is read and discarded until the client closes too (bounded by
//!    [`LINGER`]), so the kernel never answers a late request with a reset.
//!
//! 5. **The process exits once its last client connection closed** (or when Pingora's grace
//!    period ends, whichever is first), not at the end of the grace period whatever the load:
//!    Pingora 0.9.1 sleeps the whole `grace_period_seconds` after SIGTERM, so an idle gateway
//!    lingered 180 s (SMG exits within seconds). On SIGTERM idle connections wait at most
//!    [`TERMINATE_IDLE_WAIT`] for a next request (no process takes over, and keep-alive pools
//!    would otherwise hold the process for the whole grace); at an upgrade they wait the grace.
//!
//! The proxy's own `http_cleanup` is never called: it would drop the idle sessions at once.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use bytes::BytesMut;
use pingora::apps::{HttpPersistentSettings, HttpServerApp, ServerApp};
use pingora::protocols::http::ServerSession;
use pingora::protocols::Stream;
use pingora::proxy::{HttpProxy, ProxyHttp, Session};
use pingora::server::{ExecutionPhase, ShutdownWatch};
use pingora::services::background::BackgroundService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{broadcast, watch, Notify};
use tokio::time::Instant;

use crate::scratch;

/// How long a connection closed at the end of a drain is read from after its half-close,
/// waiting for the client to close its side.
pub const LINGER: Duration = Duration::from_secs(2);

/// How long a new downstream connection may take to send its first request (Pingora's
/// `process_new` default keep-alive for a new connection).
const NEW_CONNECTION_KEEPALIVE_SECS: u64 = 60;

/// On SIGTERM, how long an idle keep-alive connection may still bring a request (answered with
/// `Connection: close`) before it is closed: long enough for a load balancer to stop sending,
/// short enough that pooled idle connections do not hold the exit for the whole grace period.
pub const TERMINATE_IDLE_WAIT: Duration = Duration::from_secs(5);

/// How long past the drain's idle deadline a new connection may still send its first request.
const FIRST_REQUEST_AFTER_DRAIN: Duration = Duration::from_secs(2);

/// After the shutdown starts, how long the exit waits before it counts connections: a connection
/// accepted just before the listener stopped is counted once its task first runs.
const EXIT_SETTLE: Duration = Duration::from_millis(500);

/// Why the drain started: the grace idle connections get differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainReason {
    /// The listeners went to a new process (SIGQUIT): idle connections wait the grace period.
    Upgrade,
    /// SIGTERM: idle connections wait at most [`TERMINATE_IDLE_WAIT`]. (At an upgrade the
    /// drain has already started as `Upgrade` when its shutdown comes: the first start wins.)
    Shutdown,
}

/// The drain state of the process (one process, one drain): read on every response head.
pub static DRAIN: LazyLock<Drain> = LazyLock::new(Drain::new);

pub struct Drain {
    draining: AtomicBool,
    /// When idle connections are closed: `None` until the drain starts.
    idle_until: watch::Sender<Option<Instant>>,
    /// How long idle connections may still bring a request once the drain started, ms.
    idle_grace_ms: AtomicU64,
    /// Client connections open (served by [`DrainingApp`]).
    open: AtomicUsize,
    /// Woken when the last open connection closes during a drain.
    all_closed: Notify,
}

impl Drain {
    fn new() -> Drain {
        Drain {
            draining: AtomicBool::new(false),
            idle_until: watch::Sender::new(None),
            idle_grace_ms: AtomicU64::new(0),
            open: AtomicUsize::new(0),
            all_closed: Notify::new(),
        }
    }

    /// Sets how long idle connections may still bring a request once the drain started: the
    /// process's grace period (Pingora's `grace_period_seconds`), the longest a drain may take
    /// (shortened to [`TERMINATE_IDLE_WAIT`] on SIGTERM).
    pub fn set_idle_grace(&self, grace: Duration) {
        self.idle_grace_ms
            .store(grace.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Starts the drain (the first call wins; later calls change nothing).
    pub fn start(&self, reason: DrainReason, why: &str) {
        if self.draining.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut grace = Duration::from_millis(self.idle_grace_ms.load(Ordering::Relaxed));
        if reason == DrainReason::Shutdown {
            grace = grace.min(TERMINATE_IDLE_WAIT);
        }
        log::info!(
            "draining client connections ({why}): responses close their connection; idle \
             connections close in {grace:?}"
        );
        self.idle_until.send_replace(Some(Instant::now() + grace));
    }

    /// Counts a client connection open until the guard drops.
    fn opened(&'static self) -> OpenConnection {
        self.open.fetch_add(1, Ordering::SeqCst);
        OpenConnection(self)
    }

    /// Resolves once no client connection is open (at once when none is).
    pub async fn all_closed(&self) {
        loop {
            let notified = self.all_closed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.open.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Marks the response about to be written as the connection's last (`Connection: close`)
    /// when the process is draining. Call before every response head goes out.
    pub fn close_if_draining(&self, session: &mut Session) {
        if self.is_draining() {
            session.set_keepalive(None);
        }
    }

    /// Resolves when idle connections must close (never, unless the drain started).
    async fn idle_deadline(&self) {
        let mut rx = self.idle_until.subscribe();
        loop {
            let at = *rx.borrow_and_update();
            if let Some(at) = at {
                tokio::time::sleep_until(at).await;
                return;
            }
            if rx.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Waits for the first request of a new connection: its client connected to send one, so
    /// the drain does not close it with the idle ones (a connection accepted just before the
    /// listener closes is still served), but gives it [`FIRST_REQUEST_AFTER_DRAIN`] past the
    /// idle deadline at most (a connection that never sends would hold the exit for Pingora's
    /// first-request timeout).
    async fn first_request(&self, mut stream: Stream) -> Option<Arrived> {
        let wait = Duration::from_secs(NEW_CONNECTION_KEEPALIVE_SECS);
        let arrived = tokio::select! {
            biased;
            head = tokio::time::timeout(wait, read_arrived(&mut stream)) => head.ok().flatten(),
            _ = async {
                self.idle_deadline().await;
                tokio::time::sleep(FIRST_REQUEST_AFTER_DRAIN).await;
            } => {
                Box::pin(close_without_race(stream)).await;
                return None;
            }
        };
        arrived.map(|head| Arrived { stream, head })
    }

    /// Waits for the next request on an idle keep-alive connection. `Some` when request bytes
    /// arrived (they are handed on, see [`Arrived`]); `None` when the client closed it, or the
    /// drain's idle deadline passed (the connection is then closed without a race, see the
    /// module doc).
    async fn next_request(&self, mut stream: Stream) -> Option<Arrived> {
        let arrived = tokio::select! {
            // A request that is already there is served, whatever the deadline says.
            biased;
            head = read_arrived(&mut stream) => head,
            _ = self.idle_deadline() => {
                // Boxed: the rare end of a connection keeps a read buffer, which would
                // otherwise sit in every connection's future.
                Box::pin(close_without_race(stream)).await;
                return None;
            }
        };
        arrived.map(|head| Arrived { stream, head })
    }
}

/// One open client connection, counted in [`Drain::open`] while it lives.
struct OpenConnection(&'static Drain);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.all_closed.notify_waiters();
        }
    }
}

/// A connection whose next request has started to arrive, and the bytes of it read so far.
///
/// They are read here, not peeked: the wait between two requests is this module's, and Pingora's
/// parser takes what was read as the start of the request (`set_pipelined_prefix`, the path it
/// uses for a pipelined request). So a request costs one read, not a peek plus reads (Pingora's
/// `try_peek` reads a byte and pushes it back as a one-byte buffer), and the session keeps a
/// buffer the size of the request instead of Pingora's 4 KiB header buffer for its whole life.
struct Arrived {
    stream: Stream,
    head: BytesMut,
}

/// How much one read takes of a request that arrives: Pingora's first header read.
const FIRST_READ: usize = 4096;

/// Waits for bytes on `stream` and returns what one read got, in a buffer of its size (read
/// through [`crate::scratch`]). `None`: the client closed the connection, or it failed.
async fn read_arrived(stream: &mut Stream) -> Option<BytesMut> {
    let mut head = BytesMut::new();
    match std::future::poll_fn(|cx| scratch::poll_read_onto(stream, cx, FIRST_READ, &mut head))
        .await
    {
        Ok((n, _)) if n > 0 => Some(head),
        _ => None,
    }
}

/// Half-closes `stream` and reads (discarding) until the client closes its side or [`LINGER`]
/// passes, so a request the client sent meanwhile is not answered by a reset.
async fn close_without_race(mut stream: Stream) {
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 512];
    let _ = tokio::time::timeout(LINGER, async {
        while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// A Pingora HTTP/1.1 proxy app hosted so that its connections drain gracefully: it replaces
/// Pingora's `ServerApp` loop for plain HTTP/1.1 (pdgate listens neither with TLS nor h2c).
pub struct DrainingApp<SV: ProxyHttp> {
    proxy: Arc<HttpProxy<SV>>,
}

impl<SV: ProxyHttp> DrainingApp<SV> {
    pub fn new(proxy: HttpProxy<SV>) -> DrainingApp<SV> {
        DrainingApp {
            proxy: Arc::new(proxy),
        }
    }
}

#[async_trait]
impl<SV> ServerApp for DrainingApp<SV>
where
    SV: ProxyHttp + Send + Sync + 'static,
    SV::CTX: Send + Sync,
{
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        // Pipelining stays off (Pingora's default), so a connection handed back between two
        // requests never holds bytes of the next one: waiting on the socket is enough.
        // Its writes are gathered until a flush (one write per answer, see `crate::gather`).
        let _open = DRAIN.opened();
        let mut arrived = DRAIN
            .first_request(crate::gather::Gathered::wrap(stream))
            .await?;
        let mut settings: Option<HttpPersistentSettings> = None;
        loop {
            // The session is moved into Pingora's (boxed) future in a statement of its own, so
            // this future does not keep room for one while the request is served.
            let served = self
                .proxy
                .process_new_http(session_for(arrived, settings.take()), shutdown);
            let (mut next, persistent) = served.await?.consume();
            settings = persistent;
            crate::gather::settle(&mut next).await.ok()?;
            arrived = DRAIN.next_request(next).await?;
        }
    }

    /// Pingora stopped accepting on this service's listeners (its shutdown started): drain, but
    /// leave the proxy's own cleanup alone (it would drop idle connections at once).
    async fn cleanup(&self) {
        DRAIN.start(DrainReason::Shutdown, "shutdown");
    }
}

/// The Pingora session for a request that has [`Arrived`]: its bytes so far go to the parser.
fn session_for(arrived: Arrived, settings: Option<HttpPersistentSettings>) -> ServerSession {
    let mut session = ServerSession::new_http1(arrived.stream);
    match settings {
        Some(s) => s.apply_to_session(&mut session),
        None => session.set_keepalive(Some(NEW_CONNECTION_KEEPALIVE_SECS)),
    }
    session.set_pipelined_prefix(arrived.head);
    session
}

/// Starts the drain as soon as the listeners have been handed to a new process, or a graceful
/// shutdown began (Pingora's execution phases); once the listeners stopped and the last client
/// connection closed, calls `exit` (the process need not sleep out Pingora's grace period).
pub struct DrainOnShutdown {
    pub phases: std::sync::Mutex<Option<broadcast::Receiver<ExecutionPhase>>>,
    /// Ends the process once drained (flushes what must go out first); never returns.
    pub exit: fn(),
}

#[async_trait]
impl BackgroundService for DrainOnShutdown {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let taken = self.phases.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(mut phases) = taken else { return };
        loop {
            let phase = tokio::select! {
                p = phases.recv() => p,
                _ = shutdown.changed() => {
                    DRAIN.start(DrainReason::Shutdown, "shutdown");
                    break;
                }
            };
            match phase {
                Ok(ExecutionPhase::GracefulUpgradeCloseTimeout) => {
                    DRAIN.start(DrainReason::Upgrade, "listeners handed to the new process");
                }
                Ok(ExecutionPhase::GracefulTerminate | ExecutionPhase::ShutdownStarted) => {
                    DRAIN.start(DrainReason::Shutdown, "graceful shutdown");
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
        // The listeners stop with the shutdown broadcast; a connection accepted just before is
        // counted once its task runs: none open, twice, a settle apart.
        loop {
            tokio::time::sleep(EXIT_SETTLE).await;
            DRAIN.all_closed().await;
            tokio::time::sleep(EXIT_SETTLE).await;
            if DRAIN.open.load(Ordering::SeqCst) == 0 {
                break;
            }
        }
        log::info!("drained: no client connection is open; exiting");
        let exit = self.exit;
        // Off the runtime: the exit may block (the trace exporter's flush).
        std::thread::spawn(exit);
    }
}
