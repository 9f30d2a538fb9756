//! HTTP/1 serving plumbing shared by every listener of a mock engine (API, bootstrap, KV data
//! plane): a response body that is either complete or fed by a channel, and an accept loop whose
//! tasks can all be aborted at once (a `kill()` must look like a crashed process).
//!
//! Connections are served with `half_close(false)`, so when the peer closes its socket while a
//! request is in flight hyper notices the EOF and drops the handler future (and a streamed body) —
//! that drop is how the engine learns of a client disconnect, like SGLang's `is_disconnected()`.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

/// A response body: complete bytes, or frames pushed through a channel (SSE, faults).
pub enum MockBody {
    Full(Option<Bytes>),
    Channel(mpsc::Receiver<Result<Bytes, io::Error>>),
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match self.get_mut() {
            MockBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            MockBody::Channel(rx) => match rx.poll_recv(cx) {
                Poll::Ready(Some(Ok(b))) => Poll::Ready(Some(Ok(Frame::data(b)))),
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, MockBody::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            MockBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            MockBody::Full(None) => SizeHint::with_exact(0),
            MockBody::Channel(_) => SizeHint::default(),
        }
    }
}

pub type HttpResponse = Response<MockBody>;

/// A complete response with a content type.
pub fn full(status: u16, content_type: &str, body: impl Into<Bytes>) -> HttpResponse {
    let mut r = Response::new(MockBody::Full(Some(body.into())));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = HeaderValue::from_str(content_type) {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}

pub fn json(status: u16, v: &serde_json::Value) -> HttpResponse {
    full(
        status,
        "application/json",
        serde_json::to_vec(v).unwrap_or_default(),
    )
}

pub fn text(status: u16, s: impl Into<String>) -> HttpResponse {
    full(status, "text/plain; charset=utf-8", s.into())
}

/// A streamed response whose frames come from the returned sender.
pub fn channel(
    status: u16,
    content_type: &str,
) -> (HttpResponse, mpsc::Sender<Result<Bytes, io::Error>>) {
    let (tx, rx) = mpsc::channel(64);
    let mut r = Response::new(MockBody::Channel(rx));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    if let Ok(v) = HeaderValue::from_str(content_type) {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    (r, tx)
}

/// Tasks (accept loops, connections, stream drivers) that die together.
#[derive(Default)]
pub struct TaskGroup {
    handles: Mutex<Vec<AbortHandle>>,
}

impl TaskGroup {
    pub fn add(&self, h: AbortHandle) {
        let mut hs = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        if hs.len() >= 256 {
            hs.retain(|h| !h.is_finished());
        }
        hs.push(h);
    }

    /// Spawns `fut` as a member of the group.
    pub fn spawn<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let h = tokio::spawn(fut);
        self.add(h.abort_handle());
    }

    pub fn abort_all(&self) {
        let hs = std::mem::take(&mut *self.handles.lock().unwrap_or_else(|e| e.into_inner()));
        for h in hs {
            h.abort();
        }
    }
}

/// Serves `listener` until its group is aborted. `handler` gets the request and the peer address.
pub fn serve<F, Fut>(listener: TcpListener, group: Arc<TaskGroup>, handler: F)
where
    F: Fn(Request<Incoming>, SocketAddr) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = HttpResponse> + Send + 'static,
{
    let g = group.clone();
    group.spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let h = handler.clone();
            g.spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let h = h.clone();
                    async move { Ok::<_, Infallible>(h(req, peer).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .half_close(false)
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
}

/// Reads a whole request body (bounded at 64 MiB).
pub async fn read_body(body: Incoming) -> Result<Bytes, io::Error> {
    use http_body_util::BodyExt;
    let b = http_body_util::Limited::new(body, 64 << 20)
        .collect()
        .await
        .map_err(|e| io::Error::other(e.to_string()))?;
    Ok(b.to_bytes())
}

/// Parses `a=1&b=2` into pairs (no percent-decoding beyond `%2F`/`%3A`; the mock needs no more).
pub fn query_pairs(q: Option<&str>) -> Vec<(String, String)> {
    q.unwrap_or("")
        .split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            let dec = |s: &str| {
                s.replace("%2F", "/")
                    .replace("%3A", ":")
                    .replace("%2f", "/")
                    .replace("%3a", ":")
            };
            (dec(k), dec(v))
        })
        .collect()
}
