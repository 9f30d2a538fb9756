//! The prefill leg of a parallel (SGLang) dispatch, run as its own task so it can outlive the
//! request's decision points: it reports its response head, then drains its body in the
//! background — closing it early would abort the KV transfer the decode is waiting for.
//!
//! Ownership of the leg's fate: while the handle is held, dropping it cancels the leg (its
//! connection closes and the engine aborts the room). [`PrefillLeg::detach`] lets it run to the
//! end of its body on its own deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::sync::oneshot;

use super::client::{LegClient, LegError, LegErrorKind, LegRequest};
use super::request::ForwardHeaders;
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

/// How the leg ended, for accounting (health of the prefill worker, prefill duration).
#[derive(Debug, Clone)]
pub enum PrefillEnd {
    /// Body read to the end with this status.
    Completed { status: u16, duration: Duration },
    /// Transport or timeout failure.
    Failed(LegError),
    /// Dropped by the gateway before it ended (another leg failed, the client left).
    Cancelled,
}

/// What the task needs to run the leg.
pub struct PrefillJob {
    pub client: Arc<LegClient>,
    pub worker: Arc<Worker>,
    /// Request path (borrowed from the route table unless the worker URL has a path prefix).
    pub path: std::borrow::Cow<'static, str>,
    pub body: Bytes,
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

pub struct PrefillLeg {
    head: Option<oneshot::Receiver<Result<PrefillHead, LegError>>>,
    body: Option<oneshot::Receiver<Result<Bytes, LegError>>>,
    end: Option<oneshot::Receiver<bool>>,
    /// Sending `()` detaches; dropping the sender cancels.
    control: Option<oneshot::Sender<()>>,
}

/// Watches a prefill leg for failure after its head: resolves only if the leg ends badly
/// (transport error, stall, timeout). A prefill that completes never wakes it.
pub struct PrefillWatch {
    end: Option<oneshot::Receiver<bool>>,
}

impl PrefillWatch {
    /// Cancel-safe: can be polled again after a `select!`.
    pub async fn failed(&mut self) {
        let Some(rx) = self.end.as_mut() else {
            return std::future::pending().await;
        };
        let ok = rx.await.unwrap_or(false);
        self.end = None;
        if ok {
            std::future::pending::<()>().await;
        }
    }
}

impl PrefillLeg {
    /// Dispatches the leg now (it runs concurrently with the caller).
    pub fn spawn(job: PrefillJob) -> PrefillLeg {
        let (head_tx, head_rx) = oneshot::channel();
        let (body_tx, body_rx) = oneshot::channel();
        let (control_tx, control_rx) = oneshot::channel();
        let (end_tx, end_rx) = oneshot::channel();
        let keep = job.keep_body;
        tokio::spawn(async move {
            let ok = run(job, head_tx, body_tx, control_rx).await;
            let _ = end_tx.send(ok);
        });
        PrefillLeg {
            head: Some(head_rx),
            body: keep.then_some(body_rx),
            end: Some(end_rx),
            control: Some(control_tx),
        }
    }

    /// Waits for the response head (cancel-safe: can be polled again after a `select!`).
    pub async fn head(&mut self) -> Result<PrefillHead, LegError> {
        let rx = match self.head.as_mut() {
            Some(rx) => rx,
            None => return Err(task_gone()),
        };
        let r = rx.await.unwrap_or_else(|_| Err(task_gone()));
        self.head = None;
        r
    }

    /// Waits for the kept 2xx body (only when spawned with `keep_body`).
    pub async fn body(&mut self) -> Result<Bytes, LegError> {
        let rx = match self.body.as_mut() {
            Some(rx) => rx,
            None => return Err(task_gone()),
        };
        let r = rx.await.unwrap_or_else(|_| Err(task_gone()));
        self.body = None;
        r
    }

    /// Takes the failure watch of the leg (once).
    pub fn watch(&mut self) -> PrefillWatch {
        PrefillWatch {
            end: self.end.take(),
        }
    }

    /// Lets the leg drain to its end on its own; the handle no longer cancels it.
    pub fn detach(mut self) {
        if let Some(c) = self.control.take() {
            let _ = c.send(());
        }
    }
}

fn task_gone() -> LegError {
    LegError {
        kind: LegErrorKind::Body,
        detail: "prefill leg ended".into(),
    }
}

/// The largest read of a prefill body that is drained, not kept.
const DRAIN_READ_MAX: usize = 4 * 1024;

/// Runs the leg; true when it completed with a 2xx body.
async fn run(
    job: PrefillJob,
    head_tx: oneshot::Sender<Result<PrefillHead, LegError>>,
    body_tx: oneshot::Sender<Result<Bytes, LegError>>,
    mut control: oneshot::Receiver<()>,
) -> bool {
    let _in_flight = job.worker.track(job.keyed);
    let started = Instant::now();
    let headers = job.headers.as_slice();
    let req = LegRequest {
        method: "POST",
        path: &job.path,
        host: &job.worker.address.authority,
        headers,
        body: job.body.clone(),
    };
    let mut detached = false;
    let mut trace = job.trace;
    let opened = tokio::select! {
        r = job.client.open_traced(&job.worker.peer, &req, job.head_timeout, &mut trace) => r,
        c = &mut control => {
            if c.is_err() {
                (job.on_end)(PrefillEnd::Cancelled);
                return false;
            }
            detached = true;
            job.client.open_traced(&job.worker.peer, &req, job.head_timeout, &mut trace).await
        }
    };
    let mut leg = match opened {
        Ok(leg) => leg,
        Err(e) => {
            let _ = head_tx.send(Err(e.clone()));
            (job.on_end)(PrefillEnd::Failed(e));
            return false;
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
        (job.on_end)(PrefillEnd::Completed {
            status,
            duration: started.elapsed(),
        });
        return false;
    }
    let _ = head_tx.send(Ok(PrefillHead {
        status,
        error_body: Bytes::new(),
        is_sse,
    }));

    let mut kept = job.keep_body.then(BytesMut::new);
    if kept.is_none() {
        // Drained to be discarded: small reads keep the buffer small (a real prefill answers a
        // token or two; a large body would be read in more, smaller bites).
        leg.set_max_read(DRAIN_READ_MAX);
    }
    loop {
        tokio::select! {
            c = &mut control, if !detached => {
                if c.is_err() {
                    (job.on_end)(PrefillEnd::Cancelled);
                    return false;
                }
                detached = true;
            }
            chunk = leg.next_chunk() => match chunk {
                Ok(Some(c)) => {
                    if let Some(buf) = kept.as_mut() {
                        if buf.len() + c.len() <= job.body_limit {
                            buf.extend_from_slice(&c);
                        } else {
                            // Too big to merge: keep draining, deliver nothing.
                            kept = None;
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let _ = body_tx.send(Err(e.clone()));
                    (job.on_end)(PrefillEnd::Failed(e));
                    return false;
                }
            }
        }
    }
    let _ = body_tx.send(match kept {
        Some(b) => Ok(b.freeze()),
        None => Err(LegError {
            kind: LegErrorKind::TooLarge,
            detail: "prefill body not kept".into(),
        }),
    });
    job.client.release(leg, &job.worker.peer).await;
    (job.on_end)(PrefillEnd::Completed {
        status,
        duration: started.elapsed(),
    });
    true
}
