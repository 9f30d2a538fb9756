//! A client connection's writes gathered until a flush, so that an answer goes out in one
//! `write`/`writev` however Pingora's HTTP/1 writer slices it.
//!
//! Pingora 0.9.1 writes a response head, then each body piece, and flushes: after the head of a
//! response without `Content-Length` (a stream), after every chunk, and after the end of the body.
//! Its L4 write buffer is MSS-sized (1,460 bytes), so even a non-streamed answer over ~1.2 KB left
//! in two writes (the head flushed to make room for the body). Each write to a loopback or LAN
//! peer is a `sendto` with its transmit and the peer's wake-up — the largest single cost of a
//! request (bench/README.md, "Round 2, seventh part").
//!
//! [`Gathered`] sits between Pingora's session and the socket (the listener's own write buffer is
//! then off): writes are copied into a buffer that exists only while it holds bytes, and a
//! flush sends them at once. Two more things make a stream's burst one write:
//!
//! * a write that would overflow [`GATHER_MAX`] goes out in one `writev` with what is gathered;
//! * the relay may [`hold`] flushes while the next piece of the answer is already in hand (the
//!   engine's burst arrived with its head, or the end of the body with the last event): the head,
//!   that piece and the chunked terminator then share one write. A hold is released before the
//!   last piece in hand is written, and the end of every streamed answer releases it, so nothing
//!   ever waits in the buffer for bytes that have not arrived.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Buf, BytesMut};
use pingora::protocols::http::ServerSession;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType,
};
use pingora::proxy::Session;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

/// The most gathered by copying; a write past it goes out with what is gathered in one `writev`.
pub const GATHER_MAX: usize = 16 * 1024;

/// The first room reserved when a buffer starts gathering: a head and a small answer fit.
const FIRST_ROOM: usize = 4096;

/// A client connection whose writes are gathered until a flush (see the module doc).
#[derive(Debug)]
pub struct Gathered {
    inner: Stream,
    /// Bytes written and not yet sent; holds no memory when empty.
    out: BytesMut,
    /// Flushes are held: the relay has the next piece of the answer in hand.
    hold: AtomicBool,
}

impl Gathered {
    pub fn wrap(inner: Stream) -> Stream {
        Box::new(Gathered {
            inner,
            out: BytesMut::new(),
            hold: AtomicBool::new(false),
        })
    }

    /// Sends every gathered byte to the socket (not flushing it), then lets the buffer go.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.out.is_empty() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.out))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out.advance(n);
        }
        self.out = BytesMut::new();
        Poll::Ready(Ok(()))
    }

    /// Copies `pieces` (`total` bytes) into the buffer when they fit under [`GATHER_MAX`].
    fn gather(&mut self, pieces: &[IoSlice<'_>], total: usize) -> bool {
        if self.out.len() + total > GATHER_MAX {
            return false;
        }
        if self.out.capacity() == 0 {
            self.out.reserve(total.max(FIRST_ROOM));
        }
        for piece in pieces {
            self.out.extend_from_slice(piece);
        }
        true
    }
}

/// Holds (`true`) or releases the flushes of `session`'s client connection. Only the streamed
/// relay holds, and only while the next piece of the answer is in hand.
pub fn hold(session: &Session, on: bool) {
    if let ServerSession::H1(h1) = session.as_downstream() {
        if let Some(g) = h1.stream().as_any().downcast_ref::<Gathered>() {
            g.hold.store(on, Ordering::Relaxed);
        }
    }
}

/// Between two requests of a connection: no hold survives an answer and nothing gathered waits
/// (both would be a bug in the writer that left them; this is the net under it).
pub async fn settle(stream: &mut Stream) -> io::Result<()> {
    let Some(g) = stream.as_any().downcast_ref::<Gathered>() else {
        return Ok(());
    };
    if !g.hold.swap(false, Ordering::Relaxed) && g.out.is_empty() {
        return Ok(());
    }
    log::warn!("a client answer left its writes held or unsent: sent now");
    stream.flush().await
}

impl AsyncWrite for Gathered {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.gather(&[IoSlice::new(data)], data.len()) {
            return Poll::Ready(Ok(data.len()));
        }
        // Too much to copy: what is gathered and this write leave together.
        loop {
            if this.out.is_empty() {
                this.out = BytesMut::new();
                return Pin::new(&mut this.inner).poll_write(cx, data);
            }
            let both = [IoSlice::new(&this.out), IoSlice::new(data)];
            let n = ready!(Pin::new(&mut this.inner).poll_write_vectored(cx, &both))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            let held = this.out.len();
            if n < held {
                this.out.advance(n);
                continue;
            }
            this.out = BytesMut::new();
            if n > held {
                return Poll::Ready(Ok(n - held));
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if this.gather(bufs, total) {
            return Poll::Ready(Ok(total));
        }
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &**b);
        Pin::new(this).poll_write(cx, first)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.hold.load(Ordering::Relaxed) {
            return Poll::Ready(Ok(()));
        }
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl AsyncRead for Gathered {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

#[async_trait]
impl Shutdown for Gathered {
    async fn shutdown(&mut self) {
        let _ = std::future::poll_fn(|cx| self.poll_send(cx)).await;
        Shutdown::shutdown(&mut *self.inner).await;
    }
}

impl UniqueID for Gathered {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for Gathered {}

impl GetTimingDigest for Gathered {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }
    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }
    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for Gathered {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest)
    }
}

impl GetSocketDigest for Gathered {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }
    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.inner.set_socket_digest(digest)
    }
}

#[async_trait]
impl Peek for Gathered {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tokio::io::AsyncWriteExt;

    /// A socket that records each write call (a `writev` as one entry) and takes at most
    /// `max_write` bytes per call.
    #[derive(Debug, Default, Clone)]
    struct Recorder {
        writes: Arc<Mutex<Vec<Vec<u8>>>>,
        max_write: usize,
    }

    impl Recorder {
        fn writes(&self) -> Vec<Vec<u8>> {
            self.writes.lock().unwrap().clone()
        }
        fn take(&self, data: &[u8]) -> usize {
            let n = if self.max_write == 0 {
                data.len()
            } else {
                data.len().min(self.max_write)
            };
            self.writes.lock().unwrap().push(data[..n].to_vec());
            n
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            d: &[u8],
        ) -> Poll<io::Result<usize>> {
            Poll::Ready(Ok(self.take(d)))
        }
        fn poll_write_vectored(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let all: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            Poll::Ready(Ok(self.take(&all)))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }
    impl AsyncRead for Recorder {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }
    #[async_trait]
    impl Shutdown for Recorder {
        async fn shutdown(&mut self) {}
    }
    impl UniqueID for Recorder {
        fn id(&self) -> UniqueIDType {
            7
        }
    }
    impl Ssl for Recorder {}
    impl GetTimingDigest for Recorder {
        fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
            Vec::new()
        }
    }
    impl GetProxyDigest for Recorder {
        fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
            None
        }
    }
    impl GetSocketDigest for Recorder {
        fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
            None
        }
    }
    impl Peek for Recorder {}

    fn wrapped(max_write: usize) -> (Stream, Recorder) {
        let rec = Recorder {
            max_write,
            ..Recorder::default()
        };
        (Gathered::wrap(Box::new(rec.clone())), rec)
    }

    fn gathered(s: &Stream) -> &Gathered {
        s.as_any().downcast_ref::<Gathered>().unwrap()
    }

    #[tokio::test]
    async fn writes_leave_together_at_the_flush_and_the_buffer_is_let_go() {
        let (mut s, rec) = wrapped(0);
        s.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
        s.write_all(b"body").await.unwrap();
        assert!(rec.writes().is_empty(), "nothing is sent before the flush");
        s.flush().await.unwrap();
        assert_eq!(rec.writes(), vec![b"HTTP/1.1 200 OK\r\n\r\nbody".to_vec()]);
        assert_eq!(gathered(&s).out.capacity(), 0);
    }

    #[tokio::test]
    async fn a_held_flush_waits_for_the_release() {
        let (mut s, rec) = wrapped(0);
        gathered(&s).hold.store(true, Ordering::Relaxed);
        s.write_all(b"head").await.unwrap();
        s.flush().await.unwrap();
        s.write_all(b"piece").await.unwrap();
        s.flush().await.unwrap();
        assert!(rec.writes().is_empty());
        gathered(&s).hold.store(false, Ordering::Relaxed);
        s.write_all(b"end").await.unwrap();
        s.flush().await.unwrap();
        assert_eq!(rec.writes(), vec![b"headpieceend".to_vec()]);
    }

    #[tokio::test]
    async fn a_write_past_the_limit_leaves_with_what_is_gathered_in_one_writev() {
        let (mut s, rec) = wrapped(0);
        let big = vec![b'x'; GATHER_MAX + 10];
        s.write_all(b"head").await.unwrap();
        s.write_all(&big).await.unwrap();
        s.flush().await.unwrap();
        let writes = rec.writes();
        assert_eq!(writes.len(), 1);
        assert_eq!(&writes[0][..4], b"head");
        assert_eq!(writes[0].len(), 4 + big.len());
    }

    #[tokio::test]
    async fn partial_writes_lose_and_reorder_nothing() {
        let (mut s, rec) = wrapped(997);
        let mut sent = Vec::new();
        for i in 0..40u32 {
            // Sizes around and past the limit, with the bytes numbered.
            let len = (i as usize * 977) % (GATHER_MAX + 3000) + 1;
            let piece: Vec<u8> = (0..len).map(|j| (j as u32 * 31 + i) as u8).collect();
            s.write_all(&piece).await.unwrap();
            sent.extend_from_slice(&piece);
            if i % 3 == 0 {
                s.flush().await.unwrap();
            }
        }
        s.flush().await.unwrap();
        assert_eq!(rec.writes().concat(), sent);
    }

    #[tokio::test]
    async fn settle_releases_a_hold_left_behind() {
        let (mut s, rec) = wrapped(0);
        gathered(&s).hold.store(true, Ordering::Relaxed);
        s.write_all(b"answer").await.unwrap();
        s.flush().await.unwrap();
        assert!(rec.writes().is_empty());
        settle(&mut s).await.unwrap();
        assert_eq!(rec.writes().concat(), b"answer");
        assert!(!gathered(&s).hold.load(Ordering::Relaxed));
    }
}
