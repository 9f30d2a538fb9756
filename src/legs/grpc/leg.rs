//! One gRPC leg (a `Generate` call on one worker) that always tells the engine when the gateway
//! lets go of it before it completed: dropping a [`GrpcLeg`] that is not marked completed sends
//! the engine's `Abort` RPC (digest §2.19).
//!
//! * A prefill leg is aborted at once: if it is still prefilling, nothing was handed off yet.
//! * A decode leg that has produced nothing yet (`defer_abort`) may still be receiving its KV,
//!   and aborting it then can crash or leak on the engine side. So its call is moved into a
//!   background task that waits for its first message or its end — at most
//!   [`DEFERRED_ABORT_CAP`] — and only then aborts. After its first message the abort is
//!   immediate, and so it is once the sample's prefill completed on an engine whose prefill
//!   ends only after its KV was sent ([`GrpcLeg::prefill_completed`]).
//!
//! Python grpc.aio servicers send response headers only with the first message, so a call that
//! has not "opened" has produced nothing: the deferral covers that window too.

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use super::channel::LegChannel;
use tonic::Status;

use super::engine::{self, Engine, GenerateRequest, Message, ResponseStream};
use crate::trace::LegTrace;
use crate::workers::admission::Slots;
use crate::workers::Worker;

/// The longest a dropped decode that produced nothing is waited on before its abort.
pub const DEFERRED_ABORT_CAP: Duration = Duration::from_secs(30);

/// The longest a completed leg's stream is read for its end (the status trailers) once its
/// last message came.
const STREAM_END_WAIT: Duration = Duration::from_secs(5);

/// Deadline of one `Abort` RPC.
const ABORT_DEADLINE: Duration = Duration::from_secs(10);

/// The reason sent with an abort (SGLang, TokenSpeed).
const ABORT_REASON: &str = "Stream dropped";

type PendingCall = Pin<Box<dyn Future<Output = Result<ResponseStream, Status>> + Send>>;

enum Call {
    Pending(PendingCall),
    /// Boxed: a stream is large and a leg lives as long as its response.
    Open(Box<ResponseStream>),
    /// Completed, failed, or handed to the abort task.
    Over,
}

/// A leg in flight. See the module doc for what dropping it does.
pub struct GrpcLeg {
    engine: Engine,
    channel: LegChannel,
    request_id: String,
    pub worker: Arc<Worker>,
    call: Call,
    defer_abort: bool,
    /// A message arrived (the engine is past its KV wait).
    yielded: bool,
    /// The engine accepted the call (its headers came).
    opened: bool,
    /// Decode admission slots this leg holds until it ends (released with the leg, or by its
    /// abort task once the engine let go of it).
    slots: Option<Slots>,
    /// The leg's span when the request is traced; it ends with the leg (an abort: `cancelled`).
    trace: LegTrace,
}

impl GrpcLeg {
    /// Sends `req` to `worker`. `defer_abort`: this is a decode leg (see the module doc).
    /// `trace`: the leg's span, whose trace context goes out as the call's metadata.
    pub fn start(
        worker: Arc<Worker>,
        channel: LegChannel,
        engine: Engine,
        request_id: String,
        req: GenerateRequest,
        defer_abort: bool,
        trace: LegTrace,
    ) -> GrpcLeg {
        let context = trace
            .as_deref()
            .map(|span| (span.traceparent().clone(), span.tracestate().cloned()));
        let call = Box::pin(engine::generate(channel.clone(), req, context));
        GrpcLeg {
            engine,
            channel,
            request_id,
            worker,
            call: Call::Pending(call),
            defer_abort,
            yielded: false,
            opened: false,
            slots: None,
            trace,
        }
    }

    /// Holds `slots` (the decode's admission slots) for as long as the leg lives.
    pub fn holding(mut self, slots: Option<Slots>) -> GrpcLeg {
        self.slots = slots;
        self
    }

    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// Waits until the call is open (the engine accepted it); an error status is the engine
    /// refusing the leg (the call is then over: nothing to abort).
    pub async fn opened(&mut self) -> Result<(), Status> {
        if let Call::Pending(call) = &mut self.call {
            match call.await {
                Ok(stream) => {
                    self.call = Call::Open(Box::new(stream));
                    self.opened = true;
                }
                Err(status) => {
                    self.call = Call::Over;
                    if let Some(span) = self.trace.as_deref_mut() {
                        span.grpc_status(&status);
                    }
                    return Err(status);
                }
            }
        }
        Ok(())
    }

    /// The next message (opening the call first if needed). `Ok(None)`: the stream ended. An
    /// error or the end of the stream makes the leg over (no abort).
    pub async fn next(&mut self) -> Result<Option<Message>, Status> {
        self.opened().await?;
        let Call::Open(stream) = &mut self.call else {
            return Ok(None);
        };
        let next = stream.next().await;
        match &next {
            Ok(Some(_)) => self.yielded = true,
            Ok(None) | Err(_) => self.call = Call::Over,
        }
        if let Some(span) = self.trace.as_deref_mut() {
            match &next {
                Ok(Some(Message::Chunk(c))) => span.add_tokens(c.token_ids.len()),
                // A non-streamed call carries its tokens in the `complete` only.
                Ok(Some(Message::Complete(c))) => span.add_final_tokens(c.output_ids.len()),
                Ok(None) => span.grpc_ok(),
                Err(status) => span.grpc_status(status),
            }
        }
        next
    }

    /// Whether the engine accepted the call (a later error is a stream failure, not a refusal).
    pub fn was_opened(&self) -> bool {
        self.opened
    }

    /// The prefill that feeds this decode completed. On an engine whose prefill ends only after
    /// its KV was sent ([`Engine::prefill_ends_after_kv_sent`]; a pair's legs share one engine)
    /// the KV is in, so an abort can no longer cut a transfer and is sent at once. Without it a
    /// dropped decode that has produced nothing — a non-streamed one until its whole answer —
    /// kept generating for [`DEFERRED_ABORT_CAP`] after its client left. Other engines keep
    /// the deferral.
    pub fn prefill_completed(&mut self) {
        if self.engine.prefill_ends_after_kv_sent() {
            self.defer_abort = false;
        }
    }

    /// The leg ended normally: dropping it sends no abort, and its stream is read to its end.
    pub fn completed(&mut self) {
        if let Call::Open(stream) = std::mem::replace(&mut self.call, Call::Over) {
            read_to_end(stream);
        }
        if let Some(span) = self.trace.as_deref_mut() {
            span.grpc_ok();
        }
    }
}

impl Drop for GrpcLeg {
    fn drop(&mut self) {
        let call = std::mem::replace(&mut self.call, Call::Over);
        if matches!(call, Call::Over) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (channel, engine, request_id) = (
            self.channel.clone(),
            self.engine,
            std::mem::take(&mut self.request_id),
        );
        let deferred = self.defer_abort && !self.yielded;
        let url = self.worker.url().to_string();
        // The engine holds the slot until it lets go of the request: release it then.
        let slots = self.slots.take();
        rt.spawn(async move {
            let _slots = slots;
            if deferred {
                // Keep the call (and its HTTP/2 stream) alive until the decode shows life or
                // ends: closing it now would cancel a decode that may be receiving KV.
                let running = tokio::time::timeout(DEFERRED_ABORT_CAP, still_running(call))
                    .await
                    .unwrap_or(true);
                if !running {
                    return;
                }
            } else {
                drop(call);
            }
            match tokio::time::timeout(
                ABORT_DEADLINE,
                engine::abort(channel, engine, request_id.clone(), ABORT_REASON),
            )
            .await
            {
                Ok(Ok(())) => log::debug!("aborted {request_id} on {url}"),
                Ok(Err(s)) => log::debug!("abort of {request_id} on {url}: {}", s.message()),
                Err(_) => log::debug!("abort of {request_id} on {url} timed out"),
            }
        });
    }
}

/// Reads a completed call's stream to its end — its trailers — now if they have arrived, else in
/// a task that waits at most [`STREAM_END_WAIT`]. A stream dropped before its trailers is reset
/// (`RST_STREAM`), and the trailers that arrive after it are, once more resets are pending than
/// h2 remembers, protocol errors that h2 counts: at its limit it closes the whole connection
/// with every call on it (the bench lost a worker that way at c=32, within seconds).
fn read_to_end(mut stream: Box<ResponseStream>) {
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        match pin!(stream.next()).poll(&mut cx) {
            Poll::Ready(Ok(Some(_))) => continue,
            Poll::Ready(Ok(None) | Err(_)) => return,
            Poll::Pending => break,
        }
    }
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        let _ = tokio::time::timeout(STREAM_END_WAIT, async {
            while let Ok(Some(_)) = stream.next().await {}
        })
        .await;
    });
}

/// Resolves when the call produced its first message (`true`: it still runs and needs its
/// abort), or ended or failed on its own (`false`).
async fn still_running(call: Call) -> bool {
    let mut stream = match call {
        Call::Pending(c) => match c.await {
            Ok(s) => Box::new(s),
            Err(_) => return false,
        },
        Call::Open(s) => s,
        Call::Over => return false,
    };
    match stream.next().await {
        Ok(Some(Message::Complete(_))) => {
            // Finished after all: its end is read like any completed leg's, not reset.
            read_to_end(stream);
            false
        }
        Ok(Some(_)) => true,
        Ok(None) | Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{WorkerSpec, WorkerType};
    use crate::legs::grpc::engine::EngineRequest;
    use crate::workers::WorkerAddress;
    use bytes::{BufMut, Bytes, BytesMut};
    use pdgate_proto::sglang;
    use prost::Message as _;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// How each call on the test server ended.
    #[derive(Default)]
    struct Ends {
        /// Reset by the client after its last message, before its trailers.
        reset: AtomicUsize,
        /// Trailers sent: the stream ended normally.
        trailers: AtomicUsize,
    }

    /// An h2 server answering every call with one `complete` and, `gap` later, its status
    /// trailers — unless the client resets the stream in between.
    async fn late_trailers_server(gap: Duration) -> (std::net::SocketAddr, Arc<Ends>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let ends = Arc::new(Ends::default());
        let seen = ends.clone();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut conn = h2::server::handshake(tcp).await.unwrap();
            while let Some(Ok((req, mut respond))) = conn.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut body = req.into_body();
                    while let Some(Ok(_)) = body.data().await {}
                    let head = http::Response::builder()
                        .header("content-type", "application/grpc")
                        .body(())
                        .unwrap();
                    let mut send = respond.send_response(head, false).unwrap();
                    let msg = sglang::GenerateResponse {
                        request_id: "r".into(),
                        response: Some(sglang::generate_response::Response::Complete(
                            sglang::GenerateComplete {
                                output_ids: vec![7],
                                finish_reason: "stop".into(),
                                ..Default::default()
                            },
                        )),
                    };
                    let mut frame = BytesMut::new();
                    frame.put_u8(0);
                    frame.put_u32(msg.encoded_len() as u32);
                    msg.encode(&mut frame).unwrap();
                    send.send_data(frame.freeze(), false).unwrap();
                    let reset =
                        tokio::time::timeout(gap, std::future::poll_fn(|cx| send.poll_reset(cx)))
                            .await;
                    if reset.is_ok() {
                        seen.reset.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                    if send.send_trailers(trailers).is_ok() {
                        seen.trailers.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        (addr, ends)
    }

    /// A completed leg whose trailers come after its last message is read to its end, not
    /// reset: resets of streams whose trailers were already on the way are what h2 counts
    /// against the connection (at 1,024 it closes it, failing every call on it).
    #[tokio::test]
    async fn a_completed_leg_is_read_to_its_end_not_reset() {
        let (addr, ends) = late_trailers_server(Duration::from_millis(300)).await;
        let url = format!("grpc://{addr}");
        let worker = Worker::for_test(WorkerSpec::new(&url, WorkerType::Decode));
        let channel = LegChannel::lazy(
            &WorkerAddress::parse(&url).unwrap(),
            addr,
            Duration::from_secs(5),
        );
        for i in 0..3 {
            let req = GenerateRequest {
                msg: EngineRequest::Sglang(Box::default()),
                prompt: Bytes::new(),
            };
            let mut leg = GrpcLeg::start(
                worker.clone(),
                channel.clone(),
                Engine::Sglang,
                format!("r-{i}"),
                req,
                true,
                None,
            );
            assert!(matches!(leg.next().await, Ok(Some(Message::Complete(_)))));
            leg.completed();
            drop(leg);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while ends.reset.load(Ordering::SeqCst) + ends.trailers.load(Ordering::SeqCst) < 3 {
            assert!(
                std::time::Instant::now() < deadline,
                "the calls did not end"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            ends.reset.load(Ordering::SeqCst),
            0,
            "a completed leg was reset"
        );
        assert_eq!(ends.trailers.load(Ordering::SeqCst), 3);
    }
}
