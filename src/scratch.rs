//! Reading a socket without holding a buffer while it waits: one read goes into a per-thread
//! scratch buffer (borrowed within one poll only, never across a wait) and only the bytes that
//! arrived are appended to the caller's buffer. Used where a connection mostly waits: between
//! two requests of a client connection (`drain`) and between two events of an open stream
//! (`legs::client`), so thousands of idle connections hold no read buffers.

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, ReadBuf};

/// The largest read through the scratch buffer.
pub const MAX_READ: usize = 64 * 1024;

thread_local! {
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0; MAX_READ].into_boxed_slice());
}

/// Polls one read of up to `want` bytes (at most [`MAX_READ`]) from `stream` and appends what
/// arrived to `buf`: the number of bytes (0 at the end of the stream) and the room the read had.
pub fn poll_read_onto<S: AsyncRead + Unpin + ?Sized>(
    stream: &mut S,
    cx: &mut Context<'_>,
    want: usize,
    buf: &mut BytesMut,
) -> Poll<io::Result<(usize, usize)>> {
    SCRATCH.with_borrow_mut(|scratch| {
        let room = want.min(scratch.len());
        let mut read = ReadBuf::new(&mut scratch[..room]);
        match Pin::new(stream).poll_read(cx, &mut read) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Ready(Ok(())) => {
                buf.extend_from_slice(read.filled());
                Poll::Ready(Ok((read.filled().len(), room)))
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_read_appends_what_arrived_up_to_the_room_asked() {
        let mut source: &[u8] = b"0123456789";
        let mut buf = BytesMut::from(&b"ab"[..]);
        let got = std::future::poll_fn(|cx| poll_read_onto(&mut source, cx, 4, &mut buf)).await;
        assert_eq!(got.unwrap(), (4, 4));
        assert_eq!(&buf[..], b"ab0123");
        let got = std::future::poll_fn(|cx| poll_read_onto(&mut source, cx, 100, &mut buf)).await;
        assert_eq!(got.unwrap(), (6, 100));
        let end = std::future::poll_fn(|cx| poll_read_onto(&mut source, cx, 100, &mut buf)).await;
        assert_eq!(end.unwrap().0, 0, "the end of the stream");
        assert_eq!(&buf[..], b"ab0123456789");
    }
}
