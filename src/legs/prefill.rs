//! The prefill leg of a parallel (SGLang) dispatch. It reports its response head, then drains
//! its body — closing it early would abort the KV transfer the decode is waiting for — so it
//! must be allowed to outlive the request's decision points.
//!
//! Where it runs ([`Placement`]): under load, inside the request's own task, polled by whoever
//! holds it (no task of its own, no wake-up across threads: every worker is busy anyway); when
//! fewer prefill legs are in flight than the runtime has workers, in a task of its own, so an
//! idle worker sends and reads it beside the decode leg (measured in bench/README.md, "The
//! prefill leg's task").
//!
//! Ownership of the leg's fate: dropping the handle cancels the leg (its connection closes and
//! the engine aborts the room), unless [`PrefillLeg::detach`] was called; a detached leg that
//! has not ended when its handle is dropped goes on in a task of its own, to the end of its
//! body on its own deadline — unless it was [abandoned](PrefillLeg::abandon) before being muted
//! (its decode ended before any output), which makes dropping it cancel it again. Whoever holds the leg drives it by awaiting [`PrefillLeg::head`],
//! [`PrefillLeg::body`] or [`PrefillLeg::failed`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use pdgate_filters::body::BodyParts;
use tokio::sync::oneshot;

use super::client::{LegClient, LegError, LegErrorKind, LegRequest};
use super::request::ForwardHeaders;
use crate::in_box::in_box;
use crate::ledger::Handoff;
use crate::trace::LegTrace;
use crate::workers::Worker;

/// Largest error body kept to build a client message.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// The prefill's response head as the decision point needs it.
pub struct PrefillHead {
    pub status: u16,
    /// The body, read only when the status is not 2xx (for the error message).
    pub error_body: Bytes,
    /// Whether the prefill answered with SSE (its `stream` followed the client's).
    pub is_sse: bool,
}

/// How the leg ended, for accounting (health of the prefill worker, prefill duration). A leg
/// the gateway dropped before it ended reports nothing.
#[derive(Debug, Clone)]
pub enum PrefillEnd {
    /// Body read to the end with this status.
    Completed { status: u16, duration: Duration },
    /// Transport or timeout failure.
    Failed(LegError),
}

/// What the leg needs to run.
pub struct PrefillJob {
    pub client: Arc<LegClient>,
    pub worker: Arc<Worker>,
    /// Request path (borrowed from the route table unless the worker URL has a path prefix).
    pub path: std::borrow::Cow<'static, str>,
    pub body: BodyParts,
    pub headers: ForwardHeaders,
    /// The leg's span when the request is traced (ends with the leg).
    pub trace: LegTrace,
    /// The rendezvous this leg belongs to: held until the leg ends.
    pub handoff: Arc<Handoff>,
    /// The request carries a sticky routing key.
    pub keyed: bool,
    /// Keep the 2xx body for the logprob merge.
    pub keep_body: bool,
    pub body_limit: usize,
    pub head_timeout: Duration,
    pub stall_timeout: Duration,
    /// Called once with how the leg ended (outcome accounting).
    pub on_end: Box<dyn FnOnce(PrefillEnd) + Send>,
}

/// Prefill legs in flight, gateway-wide (see [`Placement`]).
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Counts a leg in [`IN_FLIGHT`] until it ends or is dropped.
struct Counted;

impl Counted {
    /// Counts one more leg; gives how many were in flight before it.
    fn enter() -> (Counted, usize) {
        (Counted, IN_FLIGHT.fetch_add(1, Ordering::Relaxed))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where a prefill leg runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Polled by whoever holds the leg, in the request's task.
    InTask,
    /// Its own task, which an idle worker picks up.
    OwnTask,
}

impl Placement {
    /// Its own task while fewer legs than workers are in flight (counting this one): then a
    /// worker is likely idle and sending and reading the prefill there shortens the request
    /// (c=1). Otherwise every worker is busy and a task of its own only adds a hop.
    fn choose(before: usize) -> Placement {
        let workers = tokio::runtime::Handle::try_current()
            .map(|h| h.metrics().num_workers())
            .unwrap_or(1);
        if before + 1 < workers {
            Placement::OwnTask
        } else {
            Placement::InTask
        }
    }
}

type Run = Pin<Box<dyn Future<Output = bool> + Send>>;

/// The leg itself, wherever it runs, or how it ended.
enum State {
    Here(Run),
    /// Its own task: dropped undetached, the task is aborted.
    There(tokio::task::JoinHandle<bool>),
    /// Ended: true when a 2xx body was read to the end.
    Ended(bool),
}

pub struct PrefillLeg {
    state: State,
    head: Option<oneshot::Receiver<Result<PrefillHead, LegError>>>,
    body: Option<oneshot::Receiver<Result<Bytes, LegError>>>,
    /// Dropping the handle lets the leg finish on its own instead of cancelling it.
    detached: bool,
    /// A failure after the head is no longer reported (the decode produced output).
    muted: bool,
}

impl PrefillLeg {
    /// Dispatches the leg: now when it gets a task of its own, else on the first poll of
    /// [`PrefillLeg::head`].
    pub fn new(job: PrefillJob) -> PrefillLeg {
        let (counted, before) = Counted::enter();
        PrefillLeg::placed(job, counted, Placement::choose(before))
    }

    fn placed(job: PrefillJob, counted: Counted, placement: Placement) -> PrefillLeg {
        let (head_tx, head_rx) = oneshot::channel();
        let keep = job.keep_body;
        let (body_tx, body_rx) = if keep {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let leg = in_box(|| async move {
            let _counted = counted;
            run(job, head_tx, body_tx).await
        });
        let state = match placement {
            Placement::InTask => State::Here(leg),
            Placement::OwnTask => State::There(tokio::spawn(leg)),
        };
        PrefillLeg {
            state,
            head: Some(head_rx),
            body: body_rx,
            detached: false,
            muted: false,
        }
    }

    /// Moves the leg on as far as it can go now.
    fn drive(&mut self, cx: &mut Context<'_>) {
        let polled = match &mut self.state {
            State::Ended(_) => return,
            State::Here(run) => run.as_mut().poll(cx),
            // A task that panicked or was aborted did not complete.
            State::There(task) => Pin::new(task).poll(cx).map(|r| r.unwrap_or(false)),
        };
        if let Poll::Ready(ok) = polled {
            self.state = State::Ended(ok);
        }
    }

    /// Waits for the response head (cancel-safe: can be polled again after a `select!`).
    pub async fn head(&mut self) -> Result<PrefillHead, LegError> {
        std::future::poll_fn(|cx| {
            self.drive(cx);
            poll_slot(&mut self.head, cx)
        })
        .await
    }

    /// Waits for the kept 2xx body (only when made with `keep_body`).
    pub async fn body(&mut self) -> Result<Bytes, LegError> {
        std::future::poll_fn(|cx| {
            self.drive(cx);
            poll_slot(&mut self.body, cx)
        })
        .await
    }

    /// Drives the leg after its head; resolves only if it ends badly (transport error, stall,
    /// timeout) while not muted. A prefill that completes never wakes it. Cancel-safe.
    pub async fn failed(&mut self) {
        std::future::poll_fn(|cx| {
            self.drive(cx);
            match self.state {
                State::Ended(false) if !self.muted => Poll::Ready(()),
                _ => Poll::Pending,
            }
        })
        .await
    }

    /// Failures after this are not reported by [`PrefillLeg::failed`] (which still drives the
    /// leg to its end).
    pub fn mute(&mut self) {
        self.muted = true;
    }

    /// Lets the leg drain to its end on its own when the handle is dropped: dropping it no
    /// longer cancels it (until an unmuted [`PrefillLeg::abandon`]).
    pub fn detach(&mut self) {
        self.detached = true;
    }

    /// The decode this prefill feeds is gone before it produced anything (it failed, or the
    /// client left): the KV may never be fetched, so a detached leg is cancelled when dropped
    /// after all — its connection closes and the engine aborts the room now, instead of holding
    /// the KV until its bootstrap timeout. Once muted (the decode produced output, so the KV
    /// arrived), it still drains to its end.
    pub fn abandon(&mut self) {
        if !self.muted {
            self.detached = false;
        }
    }
}

/// A detached prefill held while its decode's answer is relayed. Dropped, the leg is
/// [abandoned](PrefillLeg::abandon): cancelled unless muted, so a relay mutes it once the decode
/// has its KV (its first output, or its whole answer) and every other end cancels it.
pub struct Abandoning(pub Option<PrefillLeg>);

impl Abandoning {
    /// The decode has its KV: the leg drains to its end when dropped.
    pub fn mute(&mut self) {
        if let Some(p) = self.0.as_mut() {
            p.mute();
        }
    }
}

impl Drop for Abandoning {
    fn drop(&mut self) {
        if let Some(p) = self.0.as_mut() {
            p.abandon();
        }
    }
}

impl Drop for PrefillLeg {
    fn drop(&mut self) {
        match (
            std::mem::replace(&mut self.state, State::Ended(false)),
            self.detached,
        ) {
            (State::Ended(_), _) => {}
            // Detached: it finishes on its own (a task of its own from here).
            (State::Here(run), true) => {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(run);
                }
            }
            (State::There(_), true) => {}
            // Held: dropping it cancels it (dropping the future closes its connection).
            (State::Here(_), false) => {}
            (State::There(task), false) => task.abort(),
        }
    }
}

/// Polls a result slot of the leg; a slot already taken, or whose sender is gone, is an error.
fn poll_slot<T>(
    slot: &mut Option<oneshot::Receiver<Result<T, LegError>>>,
    cx: &mut Context<'_>,
) -> Poll<Result<T, LegError>> {
    let Some(rx) = slot.as_mut() else {
        return Poll::Ready(Err(leg_gone()));
    };
    match Pin::new(rx).poll(cx) {
        Poll::Ready(r) => {
            *slot = None;
            Poll::Ready(r.unwrap_or_else(|_| Err(leg_gone())))
        }
        Poll::Pending => Poll::Pending,
    }
}

fn leg_gone() -> LegError {
    LegError {
        kind: LegErrorKind::Body,
        detail: "prefill leg ended".into(),
    }
}

/// The largest read of a prefill body that is drained, not kept.
const DRAIN_READ_MAX: usize = 4 * 1024;

/// Runs the leg; true when it completed with a 2xx body. Its end is reported once, after the
/// worker's in-flight count is released (the leg is over when its end is reported).
async fn run(
    mut job: PrefillJob,
    head_tx: oneshot::Sender<Result<PrefillHead, LegError>>,
    body_tx: Option<oneshot::Sender<Result<Bytes, LegError>>>,
) -> bool {
    let in_flight = job.worker.track(job.keyed);
    let end = exchange(&mut job, head_tx, body_tx).await;
    drop(in_flight);
    let ok = matches!(end, PrefillEnd::Completed { status, .. } if (200..300).contains(&status));
    (job.on_end)(end);
    ok
}

/// Sends the leg, reports its head, then reads its body to the end (kept or drained).
async fn exchange(
    job: &mut PrefillJob,
    head_tx: oneshot::Sender<Result<PrefillHead, LegError>>,
    body_tx: Option<oneshot::Sender<Result<Bytes, LegError>>>,
) -> PrefillEnd {
    let started = Instant::now();
    let req = LegRequest {
        answer_headers: super::client::AnswerHeaders::ContentTypeOnly,
        method: "POST",
        path: &job.path,
        host: &job.worker.address.authority,
        headers: job.headers.as_slice(),
        body: job.body.clone(),
    };
    let mut trace = job.trace.take();
    let opened = job
        .client
        .open_traced(&job.worker.peer, &req, job.head_timeout, &mut trace)
        .await;
    let mut leg = match opened {
        Ok(leg) => leg,
        Err(e) => {
            let _ = head_tx.send(Err(e.clone()));
            return PrefillEnd::Failed(e);
        }
    };
    leg.set_read_timeout(Some(job.stall_timeout));
    let status = leg.status();
    let is_sse = leg
        .header_str("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream"));

    if !leg.is_success() {
        let error_body = leg.read_to_end(ERROR_BODY_LIMIT).await.unwrap_or_default();
        let _ = head_tx.send(Ok(PrefillHead {
            status,
            error_body,
            is_sse,
        }));
        return PrefillEnd::Completed {
            status,
            duration: started.elapsed(),
        };
    }
    let _ = head_tx.send(Ok(PrefillHead {
        status,
        error_body: Bytes::new(),
        is_sse,
    }));

    let mut kept = body_tx.is_some().then(BytesMut::new);
    if kept.is_none() {
        // Drained to be discarded: small reads keep the buffer small (a real prefill answers a
        // token or two; a large body would be read in more, smaller bites).
        leg.set_max_read(DRAIN_READ_MAX);
    }
    loop {
        // Whether more of the body came. One nobody reads is passed over, not handed out
        // piece by piece.
        let more = match kept.as_mut() {
            None => leg.skip_chunk().await.map(|n| n.is_some()),
            Some(buf) => match leg.next_chunk().await {
                Ok(Some(c)) if buf.len() + c.len() <= job.body_limit => {
                    buf.extend_from_slice(&c);
                    Ok(true)
                }
                // Too big to merge: keep draining, deliver nothing.
                Ok(Some(_)) => {
                    kept = None;
                    Ok(true)
                }
                Ok(None) => Ok(false),
                Err(e) => Err(e),
            },
        };
        match more {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                if let Some(tx) = body_tx {
                    let _ = tx.send(Err(e.clone()));
                }
                return PrefillEnd::Failed(e);
            }
        }
    }
    if let Some(tx) = body_tx {
        let _ = tx.send(match kept {
            Some(b) => Ok(b.freeze()),
            None => Err(LegError {
                kind: LegErrorKind::TooLarge,
                detail: "prefill body not kept".into(),
            }),
        });
    }
    job.client.release(leg, &job.worker.peer).await;
    PrefillEnd::Completed {
        status,
        duration: started.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    //! Both placements, against a scripted engine on loopback: the leg's fate (held, detached,
    //! muted) must not depend on where it runs.

    use super::*;
    use crate::config::{WorkerSpec, WorkerType};
    use crate::ledger::{Kind, Ledger};
    use crate::legs::within;
    use crate::workers::worker::{Origin, WorkerDefaults};
    use crate::workers::WorkerAddress;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;

    const PLACEMENTS: [Placement; 2] = [Placement::InTask, Placement::OwnTask];
    const HEAD: &[u8] =
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 10\r\n\r\n";

    /// What the engine does after its head and the first half of a 10-byte body.
    #[derive(Clone, Copy, Debug)]
    enum Then {
        /// Sends the rest when the test says so.
        Finish,
        /// Sends the first half when the test says so (so it arrives after the head was read),
        /// then the rest when it says so again.
        FinishLate,
        /// Closes the connection, the body cut short.
        Break,
    }

    /// What the engine saw.
    #[derive(Debug, PartialEq)]
    enum Saw {
        /// The head and the body's first half went out (sent before either of the others).
        HalfSent,
        /// The gateway closed the connection before the body was sent.
        Closed,
        /// The whole body went out.
        Sent,
    }

    /// A one-request engine: reads a request, answers per `then`, reports what it saw.
    async fn engine(then: Then) -> (String, mpsc::Sender<()>, mpsc::Receiver<Saw>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (go_tx, mut go_rx) = mpsc::channel::<()>(1);
        let (saw_tx, saw_rx) = mpsc::channel(2);
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            // The request: its head and its 4-byte body.
            while !req.windows(4).any(|w| w == b"\r\n\r\n") || !req.ends_with(b"body") {
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0, "the request was cut short");
                req.extend_from_slice(&buf[..n]);
            }
            s.write_all(HEAD).await.unwrap();
            if let Then::FinishLate = then {
                if go_rx.recv().await.is_none() {
                    return;
                }
            }
            s.write_all(b"01234").await.unwrap();
            let _ = saw_tx.send(Saw::HalfSent).await;
            let saw = match then {
                Then::Break => {
                    drop(s);
                    return;
                }
                Then::Finish | Then::FinishLate => tokio::select! {
                    _ = go_rx.recv() => {
                        s.write_all(b"56789").await.unwrap();
                        Saw::Sent
                    }
                    // A close with the body's first half still unread in the gateway's
                    // socket goes out as a reset, not an end of stream: both are the close.
                    n = s.read(&mut buf) => match n {
                        Ok(0) => Saw::Closed,
                        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Saw::Closed,
                        other => panic!("unexpected from the gateway: {other:?}"),
                    },
                },
            };
            let _ = saw_tx.send(saw).await;
            // Hold the connection until the gateway is done with it.
            let _ = s.read(&mut buf).await;
        });
        (url, go_tx, saw_rx)
    }

    struct Leg {
        leg: PrefillLeg,
        worker: Arc<Worker>,
        ended: mpsc::UnboundedReceiver<PrefillEnd>,
    }

    fn leg(url: &str, placement: Placement, keep_body: bool) -> Leg {
        let address = WorkerAddress::parse(url).unwrap();
        let socket = address.authority.parse().unwrap();
        let defaults = WorkerDefaults::from_config(&crate::config::GatewayConfig::default());
        let worker = Worker::new(
            "p".into(),
            WorkerSpec::new(url, WorkerType::Prefill),
            address,
            socket,
            &defaults,
            Origin::Config,
        );
        let (end_tx, ended) = mpsc::unbounded_channel();
        let job = PrefillJob {
            client: Arc::new(LegClient::new(4, None)),
            worker: worker.clone(),
            path: "/generate".into(),
            body: Bytes::from_static(b"body").into(),
            headers: ForwardHeaders::default(),
            trace: None,
            handoff: Ledger::new().open(Kind::Room, 1, "r", &worker, &worker),
            keyed: false,
            keep_body,
            body_limit: 1024,
            head_timeout: Duration::from_secs(30),
            stall_timeout: Duration::from_secs(30),
            on_end: Box::new(move |end| {
                let _ = end_tx.send(end);
            }),
        };
        let (counted, _) = Counted::enter();
        Leg {
            leg: PrefillLeg::placed(job, counted, placement),
            worker,
            ended,
        }
    }

    /// A leg on a fresh scripted engine, past its 2xx head.
    async fn past_head(
        then: Then,
        placement: Placement,
        keep_body: bool,
    ) -> (Leg, mpsc::Sender<()>, mpsc::Receiver<Saw>) {
        let (url, go, saw) = engine(then).await;
        let mut l = leg(&url, placement, keep_body);
        assert_eq!(
            within(l.leg.head()).await.unwrap().status,
            200,
            "{placement:?}"
        );
        (l, go, saw)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_detached_leg_dropped_mid_body_reads_it_to_the_end() {
        // Detached; or detached, muted (its decode produced output) and then dropped from an
        // `Abandoning` guard, which must not cancel it.
        for (placement, muted) in PLACEMENTS.into_iter().flat_map(|p| [(p, false), (p, true)]) {
            let (l, go, mut saw) = past_head(Then::Finish, placement, false).await;
            let Leg {
                mut leg,
                worker,
                mut ended,
            } = l;
            leg.detach();
            if muted {
                let mut held = Abandoning(Some(leg));
                held.mute();
                drop(held);
            } else {
                drop(leg);
            }
            go.send(()).await.unwrap();
            assert_eq!(
                within(saw.recv()).await,
                Some(Saw::HalfSent),
                "{placement:?}"
            );
            assert_eq!(within(saw.recv()).await, Some(Saw::Sent), "{placement:?}");
            let end = within(ended.recv()).await.expect("the leg reports its end");
            assert!(
                matches!(end, PrefillEnd::Completed { status: 200, .. }),
                "{placement:?}: {end:?}"
            );
            assert_eq!(worker.in_flight(), 0, "{placement:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_detached_leg_abandoned_unmuted_is_cancelled_and_its_connection_closed() {
        for placement in PLACEMENTS {
            let (l, _go, mut saw) = past_head(Then::Finish, placement, false).await;
            let Leg {
                mut leg,
                worker,
                mut ended,
            } = l;
            leg.detach();
            // Its decode ended before any output: the guard abandons it as it drops.
            drop(Abandoning(Some(leg)));
            assert_cancelled(&mut saw, &mut ended, &worker, &format!("{placement:?}")).await;
        }
    }

    /// The engine saw the leg's connection close, the leg reported nothing (its closure went
    /// with it), and it left the in-flight count (an aborted task drops its state after the
    /// closure: waited for, with a deadline).
    async fn assert_cancelled(
        saw: &mut mpsc::Receiver<Saw>,
        ended: &mut mpsc::UnboundedReceiver<PrefillEnd>,
        worker: &Worker,
        case: &str,
    ) {
        let mut seen = within(saw.recv()).await;
        if seen == Some(Saw::HalfSent) {
            seen = within(saw.recv()).await;
        }
        assert_eq!(seen, Some(Saw::Closed), "{case}");
        assert!(within(ended.recv()).await.is_none(), "{case}");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while worker.in_flight() != 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "{case}: still in flight"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_held_leg_dropped_mid_body_is_cancelled_and_its_connection_closed() {
        // Dropped at once (the body's first half may not have arrived yet), and dropped once
        // that half arrived after the head was read (then, when the leg runs in the request's
        // task, it lies unread in the gateway's socket and the close goes out as a reset).
        for (placement, then) in PLACEMENTS
            .into_iter()
            .flat_map(|p| [(p, Then::Finish), (p, Then::FinishLate)])
        {
            let (l, go, mut saw) = past_head(then, placement, false).await;
            let Leg {
                leg,
                worker,
                mut ended,
            } = l;
            if let Then::FinishLate = then {
                go.send(()).await.unwrap();
                assert_eq!(
                    within(saw.recv()).await,
                    Some(Saw::HalfSent),
                    "{placement:?}"
                );
            }
            drop(leg);
            let case = format!("{placement:?} {then:?}");
            assert_cancelled(&mut saw, &mut ended, &worker, &case).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leg_that_breaks_after_its_head_is_reported_failed_unless_muted() {
        for placement in PLACEMENTS {
            for muted in [false, true] {
                let (l, _go, _saw) = past_head(Then::Break, placement, false).await;
                let Leg {
                    mut leg, mut ended, ..
                } = l;
                if muted {
                    leg.mute();
                }
                let end = within(async {
                    tokio::select! {
                        _ = leg.failed() => {
                            assert!(!muted, "{placement:?}: a muted leg reported its failure");
                            ended.recv().await
                        }
                        // A muted leg is still driven to its end, which it reports.
                        end = ended.recv(), if muted => end,
                    }
                })
                .await;
                assert!(
                    matches!(end, Some(PrefillEnd::Failed(_))),
                    "{placement:?} muted={muted}: {end:?}"
                );
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kept_body_is_delivered_whole() {
        for placement in PLACEMENTS {
            let (Leg { mut leg, .. }, go, _saw) = past_head(Then::Finish, placement, true).await;
            go.send(()).await.unwrap();
            assert_eq!(
                &within(leg.body()).await.unwrap()[..],
                b"0123456789",
                "{placement:?}"
            );
        }
    }

    #[test]
    fn a_leg_gets_its_own_task_only_while_a_worker_is_free() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .build()
            .unwrap();
        rt.block_on(async {
            assert_eq!(Placement::choose(0), Placement::OwnTask);
            assert_eq!(Placement::choose(2), Placement::OwnTask);
            assert_eq!(Placement::choose(3), Placement::InTask);
            assert_eq!(Placement::choose(64), Placement::InTask);
        });
        let one = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        one.block_on(async { assert_eq!(Placement::choose(0), Placement::InTask) });
    }
}
