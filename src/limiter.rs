//! The front door's admission limits — SMG's "Rate Limiting" flags — for the inference routes:
//!
//! * `--max-concurrent-requests`: at most N requests at once. A request holds its place until
//!   its response has ended (streams included): the [`Admitted`] guard lives in the request's
//!   context and is dropped with it.
//! * `--queue-size` / `--queue-timeout-secs`: past N, up to `queue_size` requests wait, served
//!   strictly first come, first served; a full queue (or no queue) is a 429
//!   `admission_queue_full`, a wait past the deadline a 503 `admission_queue_timeout`, both
//!   with `Retry-After` (SMG 1.13.0's codes, bodies and header, measured). A client that hangs
//!   up while queued gives its place back at once.
//! * `--rate-limit-tokens-per-second`: a sustained admission rate (a token bucket, bursting up
//!   to N), on top of the concurrency bound. The bucket is one atomic word (GCRA), so the hot
//!   path takes no lock; only requests that must wait line up behind an async mutex, which
//!   keeps the queue's order for rate waits too.
//!
//! pdgate has one API key, so a per-key bucket is the gateway's bucket.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use pingora_prometheus::prometheus::IntCounter;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::{defaults, GatewayConfig};
use crate::metrics::METRICS;

/// The limits as configured, after SMG's conventions (-1 derived, 0 off) were applied.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// Requests served at once; `None`: unbounded.
    pub max_concurrent: Option<usize>,
    pub queue_size: usize,
    pub queue_timeout: Duration,
    /// Sustained admissions per second; `None`: no rate limit.
    pub rate_per_sec: Option<u32>,
}

impl Limits {
    pub fn from_config(cfg: &GatewayConfig) -> Limits {
        let max_concurrent = match cfg.max_concurrent_requests {
            n if n < 0 => Some(derived_concurrency()),
            0 => None,
            n => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        };
        Limits {
            max_concurrent,
            queue_size: cfg.queue_size,
            queue_timeout: Duration::from_secs(cfg.queue_timeout_secs),
            rate_per_sec: cfg
                .rate_limit_tokens_per_second
                .filter(|r| *r > 0)
                .map(|r| u32::try_from(r).unwrap_or(u32::MAX)),
        }
    }

    fn is_unlimited(&self) -> bool {
        self.max_concurrent.is_none() && self.rate_per_sec.is_none()
    }
}

/// SMG's bound for `--max-concurrent-requests -1`: 1024 per available CPU, at least 4096.
pub fn derived_concurrency() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    (cpus * defaults::DERIVED_CONCURRENCY_PER_CPU).max(defaults::DERIVED_CONCURRENCY_FLOOR)
}

/// Why a request was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No place and no room in the queue; `queuing_disabled` when `queue_size` is 0.
    QueueFull { queuing_disabled: bool },
    /// Waited `queue_timeout` without getting a place.
    Timeout,
    /// The client left while queued (nothing to answer).
    ClientGone,
}

impl Refusal {
    /// SMG's message for the refusal.
    pub fn message(self) -> &'static str {
        match self {
            Refusal::QueueFull {
                queuing_disabled: true,
            } => "concurrency limit reached and queuing is disabled",
            Refusal::QueueFull {
                queuing_disabled: false,
            } => "admission queue is at capacity",
            Refusal::Timeout => "timed out waiting for an admission slot",
            Refusal::ClientGone => "the client left while queued",
        }
    }

    fn metric_reason(self) -> &'static str {
        match self {
            Refusal::QueueFull { .. } => "full",
            Refusal::Timeout => "timeout",
            Refusal::ClientGone => "cancelled",
        }
    }
}

/// A request's admission: its place is given back when this is dropped.
pub struct Admitted {
    _place: Option<OwnedSemaphorePermit>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        METRICS.admission_inflight.dec();
    }
}

pub struct Limiter {
    limits: Limits,
    places: Option<Arc<Semaphore>>,
    rate: Option<RateBucket>,
    /// Requests in the queue (waiting for a place or a rate token).
    waiting: AtomicUsize,
    /// Rate waiters take turns in arrival order (tokio's mutex is fair).
    rate_turn: tokio::sync::Mutex<()>,
}

impl Limiter {
    /// `None` when nothing is limited (`--max-concurrent-requests 0`, no rate).
    pub fn new(limits: Limits) -> Option<Limiter> {
        if limits.is_unlimited() {
            return None;
        }
        let burst = limits
            .max_concurrent
            .map_or(limits.rate_per_sec.unwrap_or(1), |n| {
                u32::try_from(n).unwrap_or(u32::MAX)
            });
        Some(Limiter {
            limits,
            places: limits
                .max_concurrent
                .map(|n| Arc::new(Semaphore::new(n.min(Semaphore::MAX_PERMITS)))),
            rate: limits
                .rate_per_sec
                .map(|r| RateBucket::new(r, burst.max(1))),
            waiting: AtomicUsize::new(0),
            rate_turn: tokio::sync::Mutex::new(()),
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Admits the request at once, or queues it until a place (and a rate token) is free, the
    /// queue deadline passes, or the future `client_gone` makes completes.
    ///
    /// The common case (nobody queued, a place free) is decided without a future; the queue's,
    /// and `client_gone`'s, are built and boxed only for a request that waits, so the caller's
    /// future does not carry their size.
    pub async fn admit<F: Future>(
        &self,
        client_gone: impl FnOnce() -> F,
    ) -> Result<Admitted, Refusal> {
        match self.admit_now() {
            Some(admitted) => Ok(admitted),
            None => Box::pin(self.queue(client_gone())).await,
        }
    }

    /// [`Self::admit`] when the queue is empty and a place (and a rate token) is free. `None`:
    /// the request must queue.
    fn admit_now(&self) -> Option<Admitted> {
        // Nobody may pass a request that is already waiting: the fast path is only for an
        // empty queue (tokio's semaphore is fair as well: a freed place goes to the oldest
        // waiter).
        if self.waiting.load(Ordering::Acquire) != 0 {
            return None;
        }
        let place = match &self.places {
            None => None,
            Some(places) => Some(places.clone().try_acquire_owned().ok()?),
        };
        if self.rate.as_ref().is_some_and(|r| r.try_take().is_err()) {
            return None;
        }
        allowed().inc();
        Some(admitted(place))
    }

    /// Queues a request [`Self::admit_now`] did not admit, and counts how that ended.
    async fn queue(&self, client_gone: impl Future) -> Result<Admitted, Refusal> {
        let outcome = self.wait_in_queue(client_gone).await;
        match outcome {
            Ok(_) => allowed().inc(),
            Err(refusal) => {
                METRICS
                    .admission_queue_rejected
                    .with_label_values(&[refusal.metric_reason()])
                    .inc();
                if refusal != Refusal::ClientGone {
                    METRICS
                        .http_rate_limit
                        .with_label_values(&["rejected"])
                        .inc();
                }
            }
        }
        outcome
    }

    async fn wait_in_queue(&self, client_gone: impl Future) -> Result<Admitted, Refusal> {
        if self.limits.queue_size == 0 {
            return Err(Refusal::QueueFull {
                queuing_disabled: true,
            });
        }
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.limits.queue_size {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(Refusal::QueueFull {
                queuing_disabled: false,
            });
        }
        let _queued = Queued::enter(&self.waiting);
        let started = Instant::now();
        let wait = async {
            let place = match &self.places {
                None => None,
                Some(places) => Some(
                    places
                        .clone()
                        .acquire_owned()
                        .await
                        .expect("the limiter's semaphore is never closed"),
                ),
            };
            if let Some(rate) = &self.rate {
                let _turn = self.rate_turn.lock().await;
                while let Err(wait) = rate.try_take() {
                    tokio::time::sleep(wait).await;
                }
            }
            place
        };
        // Biased, client first: a place that frees as its client leaves goes to the next one.
        tokio::select! {
            biased;
            _ = client_gone => Err(Refusal::ClientGone),
            waited = tokio::time::timeout(self.limits.queue_timeout, wait) => match waited {
                Ok(place) => {
                    METRICS
                        .admission_queue_wait
                        .observe(started.elapsed().as_secs_f64());
                    Ok(admitted(place))
                }
                Err(_) => Err(Refusal::Timeout),
            },
        }
    }
}

/// The per-request counter of admitted requests, resolved once, not looked up by label on every
/// request.
fn allowed() -> &'static IntCounter {
    static ALLOWED: LazyLock<IntCounter> =
        LazyLock::new(|| METRICS.http_rate_limit.with_label_values(&["allowed"]));
    &ALLOWED
}

fn admitted(place: Option<OwnedSemaphorePermit>) -> Admitted {
    METRICS.admission_inflight.inc();
    Admitted { _place: place }
}

/// One request's presence in the queue (depth counter and gauge), left on drop — also when
/// the waiting future is dropped because the client left.
struct Queued<'a>(&'a AtomicUsize);

impl<'a> Queued<'a> {
    /// The caller has already counted itself into `waiting`.
    fn enter(waiting: &'a AtomicUsize) -> Queued<'a> {
        METRICS.admission_queue_depth.inc();
        Queued(waiting)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
        METRICS.admission_queue_depth.dec();
    }
}

/// A token bucket as one atomic word: the generic cell rate algorithm. `tat` is the
/// theoretical arrival time of the next token (nanoseconds since `epoch`); a request may take
/// one while `tat` is at most `burst` intervals ahead of now.
struct RateBucket {
    epoch: Instant,
    interval_ns: u64,
    tolerance_ns: u64,
    tat: AtomicU64,
}

impl RateBucket {
    fn new(per_sec: u32, burst: u32) -> RateBucket {
        let interval_ns = 1_000_000_000 / u64::from(per_sec.max(1));
        RateBucket {
            epoch: Instant::now(),
            interval_ns,
            tolerance_ns: interval_ns.saturating_mul(u64::from(burst)),
            tat: AtomicU64::new(0),
        }
    }

    /// Takes a token, or says how long until one is free.
    fn try_take(&self) -> Result<(), Duration> {
        self.try_take_at(u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// [`RateBucket::try_take`] at `now`, nanoseconds since the bucket's epoch.
    fn try_take_at(&self, now: u64) -> Result<(), Duration> {
        let mut tat = self.tat.load(Ordering::Acquire);
        loop {
            let next = tat.max(now).saturating_add(self.interval_ns);
            let allowed_until = now.saturating_add(self.tolerance_ns);
            if next > allowed_until {
                return Err(Duration::from_nanos(next - allowed_until));
            }
            match self
                .tat
                .compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(()),
                Err(current) => tat = current,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: Option<usize>, queue: usize, timeout_ms: u64, rate: Option<u32>) -> Limits {
        Limits {
            max_concurrent: max,
            queue_size: queue,
            queue_timeout: Duration::from_millis(timeout_ms),
            rate_per_sec: rate,
        }
    }

    #[test]
    fn smg_conventions_for_the_flags() {
        let mut cfg = GatewayConfig::default();
        assert_eq!(
            Limits::from_config(&cfg).max_concurrent,
            Some(derived_concurrency())
        );
        assert!(derived_concurrency() >= 4096);
        cfg.max_concurrent_requests = 0;
        cfg.rate_limit_tokens_per_second = Some(0);
        assert!(Limiter::new(Limits::from_config(&cfg)).is_none());
        cfg.max_concurrent_requests = 8;
        cfg.rate_limit_tokens_per_second = Some(5);
        let l = Limits::from_config(&cfg);
        assert_eq!(
            (l.max_concurrent, l.queue_size, l.rate_per_sec),
            (Some(8), 100, Some(5))
        );
    }

    #[test]
    fn the_bucket_bursts_then_paces() {
        // The time is passed in: no stall of the machine can refill the bucket meanwhile.
        let b = RateBucket::new(10, 3);
        for _ in 0..3 {
            assert!(b.try_take_at(0).is_ok());
        }
        let wait = b.try_take_at(0).expect_err("the burst is spent");
        assert_eq!(wait, Duration::from_millis(100));
        assert_eq!(b.try_take_at(60_000_000), Err(Duration::from_millis(40)));
        assert!(b.try_take_at(100_000_000).is_ok(), "one token per 100 ms");
        assert!(b.try_take_at(100_000_000).is_err());
    }

    #[tokio::test]
    async fn places_are_held_until_dropped_and_the_queue_is_fifo() {
        let l = Arc::new(Limiter::new(limits(Some(1), 2, 60_000, None)).unwrap());
        let first = l.admit(std::future::pending::<()>).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for i in 0..2 {
            let (waiter, tx) = (l.clone(), tx.clone());
            tokio::spawn(async move {
                let a = waiter.admit(std::future::pending::<()>).await;
                tx.send((i, a.is_ok())).unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            });
            // Let each waiter line up before the next one arrives.
            while l.waiting.load(Ordering::Acquire) <= i {
                tokio::task::yield_now().await;
            }
        }
        assert_eq!(
            l.admit(std::future::pending::<()>).await.err(),
            Some(Refusal::QueueFull {
                queuing_disabled: false
            })
        );
        drop(first);
        assert_eq!(rx.recv().await, Some((0, true)));
        assert_eq!(rx.recv().await, Some((1, true)));
    }

    #[tokio::test]
    async fn a_queued_request_times_out_or_leaves() {
        let l = Limiter::new(limits(Some(1), 4, 50, None)).unwrap();
        let _held = l.admit(std::future::pending::<()>).await.unwrap();
        assert_eq!(
            l.admit(std::future::pending::<()>).await.err(),
            Some(Refusal::Timeout)
        );
        assert_eq!(
            l.admit(|| std::future::ready(())).await.err(),
            Some(Refusal::ClientGone)
        );
        assert_eq!(l.waiting.load(Ordering::Acquire), 0);
    }

    #[tokio::test]
    async fn no_queue_refuses_at_once() {
        let l = Limiter::new(limits(Some(1), 0, 1_000, None)).unwrap();
        let _held = l.admit(std::future::pending::<()>).await.unwrap();
        assert_eq!(
            l.admit(std::future::pending::<()>).await.err(),
            Some(Refusal::QueueFull {
                queuing_disabled: true
            })
        );
    }

    #[tokio::test]
    async fn rate_waiters_are_paced() {
        // Before the bucket's epoch: however late the first two come, the third is paced.
        let t0 = Instant::now();
        let l = Limiter::new(limits(Some(2), 10, 60_000, Some(20))).unwrap();
        drop(l.admit(std::future::pending::<()>).await.unwrap());
        drop(l.admit(std::future::pending::<()>).await.unwrap());
        // A burst of 2, asked at the bucket's epoch (a refusal takes nothing): whenever the two
        // came, their tokens reach at least 100 ms past it, the burst's whole tolerance.
        assert!(
            l.rate.as_ref().unwrap().try_take_at(0).is_err(),
            "a burst of 2"
        );
        // The third waits for the bucket: 20 per second is one per 50 ms.
        drop(l.admit(std::future::pending::<()>).await.unwrap());
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_millis(40), "{waited:?}");
    }
}
