//! Idle leg connections, kept per engine for reuse.
//!
//! Why not Pingora's pool (`TransportConnector::release_stream` / `reused_stream`): it spawns an
//! idle-watcher task for every connection it keeps, wakes and locks it on every reuse, and asks
//! the kernel for the socket's peer (`getpeername`) each time — a task, two cross-thread wake-ups
//! and a syscall per leg, on the critical path of every request (bench/README.md, "What is
//! left"). Here an idle connection is just parked: it is checked when taken (an engine never
//! speaks first on an idle HTTP/1.1 connection, so a readable socket was closed or is broken)
//! and dropped when it sat longer than the idle limit. Most recently parked first: the warmest
//! connection is the likeliest to be alive.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use pdgate_filters::prehashed::BuildPrehashed;
use pingora::protocols::Stream;
use tokio::io::{AsyncRead, ReadBuf};

struct Idle {
    stream: Stream,
    since: Instant,
}

/// Idle connections by peer key (`Peer::reuse_hash`), at most `capacity` in all.
pub struct Pool {
    idle: Mutex<Parked>,
    capacity: usize,
    max_idle: Option<Duration>,
}

#[derive(Default)]
struct Parked {
    /// The key is already a hash of the peer (computed once per worker), used as it is.
    by_peer: HashMap<u64, Vec<Idle>, BuildPrehashed>,
    /// Sum of the lists' lengths.
    count: usize,
}

impl Pool {
    /// `capacity` caps idle connections over all engines; `max_idle` is how long one may sit
    /// before it is dropped instead of reused (`None`: no limit).
    pub fn new(capacity: usize, max_idle: Option<Duration>) -> Pool {
        Pool {
            idle: Mutex::new(Parked::default()),
            capacity,
            max_idle,
        }
    }

    /// The most recently parked live connection to `key`, if any.
    pub fn take(&self, key: u64) -> Option<Stream> {
        loop {
            let idle = {
                let mut parked = self.idle.lock().unwrap_or_else(|e| e.into_inner());
                let list = parked.by_peer.get_mut(&key)?;
                let idle = list.pop();
                if list.is_empty() {
                    parked.by_peer.remove(&key);
                }
                parked.count -= usize::from(idle.is_some());
                idle?
            };
            // Checked (and dropped, closing it) outside the lock.
            let mut stream = idle.stream;
            // No clock read without an idle limit.
            let expired = self.max_idle.is_some() && self.expired(idle.since, Instant::now());
            if !expired && still_idle(&mut stream) {
                return Some(stream);
            }
        }
    }

    /// Parks a connection whose last exchange ended cleanly. Over capacity, it is closed.
    pub fn put(&self, key: u64, stream: Stream) {
        let now = Instant::now();
        let mut stale = Vec::new();
        {
            let mut guard = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            let parked = &mut *guard;
            let list = parked.by_peer.entry(key).or_default();
            // The oldest sit at the front: drop the ones past the idle limit while here (one
            // clock read for all of them).
            let keep_from = list
                .iter()
                .position(|i| !self.expired(i.since, now))
                .unwrap_or(list.len());
            stale.extend(list.drain(..keep_from));
            parked.count -= stale.len();
            if parked.count < self.capacity {
                list.push(Idle { stream, since: now });
                parked.count += 1;
            } else {
                stale.push(Idle { stream, since: now });
            }
            if list.is_empty() {
                parked.by_peer.remove(&key);
            }
        }
        drop(stale);
    }

    /// Idle connections parked now (all engines).
    pub fn len(&self) -> usize {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).count
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn expired(&self, since: Instant, now: Instant) -> bool {
        self.max_idle
            .is_some_and(|m| now.saturating_duration_since(since) >= m)
    }
}

/// True when nothing can be read from the idle connection right now: no bytes, no end of file,
/// no error. One non-blocking poll; the waker is a no-op (the next real read registers its own).
fn still_idle(stream: &mut Stream) -> bool {
    let mut byte = [0u8; 1];
    let mut buf = ReadBuf::new(&mut byte);
    let mut cx = Context::from_waker(Waker::noop());
    matches!(Pin::new(stream).poll_read(&mut cx, &mut buf), Poll::Pending)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    async fn pair() -> (Stream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (c, s) = tokio::join!(TcpStream::connect(addr), l.accept());
        let client: Stream = Box::new(pingora::protocols::l4::stream::Stream::from(c.unwrap()));
        (client, s.unwrap().0)
    }

    /// Polls (with a deadline) until what the peer did is visible on `s`.
    async fn until_readable(s: &mut Stream) {
        let end = Instant::now() + Duration::from_secs(5);
        while still_idle(s) {
            assert!(Instant::now() < end, "the peer's close never arrived");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test]
    async fn a_live_connection_comes_back_most_recent_first() {
        let pool = Pool::new(8, None);
        let (a, _sa) = pair().await;
        let (b, _sb) = pair().await;
        let (id_a, id_b) = (a.id(), b.id());
        pool.put(1, a);
        pool.put(1, b);
        assert_eq!(pool.len(), 2);
        assert_eq!(pool.take(1).map(|s| s.id()), Some(id_b));
        assert_eq!(pool.take(1).map(|s| s.id()), Some(id_a));
        assert!(pool.take(1).is_none());
        assert!(pool.take(2).is_none());
    }

    #[tokio::test]
    async fn closed_or_talkative_connections_are_dropped_on_take() {
        let pool = Pool::new(8, None);
        let (mut a, sa) = pair().await;
        let (mut b, mut sb) = pair().await;
        drop(sa);
        sb.write_all(b"HTTP/1.1 408\r\n\r\n").await.unwrap();
        until_readable(&mut a).await;
        until_readable(&mut b).await;
        pool.put(1, a);
        pool.put(1, b);
        assert!(pool.take(1).is_none());
        assert!(pool.is_empty());
    }

    #[tokio::test]
    async fn capacity_and_idle_limit_are_kept() {
        let pool = Pool::new(1, None);
        let (a, _sa) = pair().await;
        let (b, _sb) = pair().await;
        pool.put(1, a);
        pool.put(2, b);
        assert_eq!(pool.len(), 1, "over capacity, the newcomer is closed");

        let pool = Pool::new(8, Some(Duration::ZERO));
        let (a, _sa) = pair().await;
        let (b, _sb) = pair().await;
        pool.put(1, a);
        pool.put(1, b);
        assert_eq!(pool.len(), 1, "parking one drops those past the idle limit");
        assert!(pool.take(1).is_none(), "past the idle limit");
    }
}
