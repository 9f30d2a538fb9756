//! The decode admission window (spec "Decode Admission Window (gRPC)"): before a PD dispatch goes
//! out, the gateway claims one slot per backend request on the chosen decode, within the running
//! window that engine reports (SGLang `max_running_requests`, TokenSpeed and vLLM `max_num_seqs`).
//! A full window makes the dispatch wait up to `--pd-admission-wait-secs` (`0`: shed at once),
//! then it is shed with 503 `worker_overload_protection_shed` and `Retry-After`.
//!
//! Why before dispatch: a PD request holds a decode slot from the moment its rendezvous opens.
//! Sent to a full decode, the prefill still runs and its KV waits in a bootstrap room until the
//! engine's deadline — wasted compute, pinned KV, and a timeout the client sees much later.
//!
//! The slots are a semaphore per decode worker, sized by its window when first used; a slot is
//! held by the decode leg ([`Slots`]) and released however that leg ends. Workers that report no
//! window are not gated.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Worker;
use crate::metrics::METRICS;

/// A worker's admission window.
pub struct Window {
    slots: Arc<Semaphore>,
    size: u32,
    /// Dispatches waiting for a slot now (the capacity advice reads it).
    waiting: AtomicU32,
}

impl Window {
    pub fn new(size: u32) -> Window {
        Window {
            slots: Arc::new(Semaphore::new(size as usize)),
            size,
            waiting: AtomicU32::new(0),
        }
    }

    pub fn size(&self) -> u32 {
        self.size
    }

    /// Dispatches waiting for a slot now.
    pub fn waiting(&self) -> u32 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Slots in use now.
    pub fn in_use(&self) -> u32 {
        self.size
            .saturating_sub(self.slots.available_permits() as u32)
    }
}

/// Claimed slots on one decode; dropping them releases the slots.
pub type Slots = OwnedSemaphorePermit;

/// Why a dispatch was not admitted.
#[derive(Debug, PartialEq, Eq)]
pub enum NotAdmitted {
    /// The window stayed full for the whole wait (or the request needs more slots than the
    /// window has).
    Shed,
    /// The client left while waiting: nothing was claimed.
    ClientGone,
}

/// Claims `n` slots on `decode` (none when it reports no window): at once when free, else after
/// waiting up to `wait` while the future `client_gone` makes has not resolved. Counts the waits
/// and the sheds.
///
/// The common case (no window, or free slots) is decided without a future; the waiting one, and
/// `client_gone`'s, are built and boxed only for a request that waits, so the caller's future
/// does not carry their size.
pub async fn admit<F: Future<Output = ()>>(
    decode: &Worker,
    n: u32,
    wait: Duration,
    client_gone: impl FnOnce() -> F,
) -> Result<Option<Slots>, NotAdmitted> {
    let Some(window) = decode.admission_window() else {
        return Ok(None);
    };
    let decided = match admit_now(window, n, wait) {
        Some(decided) => decided,
        None => Box::pin(wait_for_slots(window, n, wait, client_gone())).await,
    };
    decided.map(Some)
}

/// [`admit`] when it needs no wait: the slots, or a shed of a request larger than the window or
/// of one that finds it full when `wait` is zero. `None`: the request may wait.
fn admit_now(window: &Window, n: u32, wait: Duration) -> Option<Result<Slots, NotAdmitted>> {
    if n > window.size {
        METRICS.pd_admission_sheds.inc();
        return Some(Err(NotAdmitted::Shed));
    }
    if let Ok(slots) = window.slots.clone().try_acquire_many_owned(n) {
        return Some(Ok(slots));
    }
    if wait.is_zero() {
        METRICS.pd_admission_sheds.inc();
        return Some(Err(NotAdmitted::Shed));
    }
    None
}

/// The wait of a request [`admit_now`] left undecided: up to `wait` for `n` slots of `window`,
/// while `client_gone` has not resolved.
async fn wait_for_slots(
    window: &Window,
    n: u32,
    wait: Duration,
    client_gone: impl Future<Output = ()>,
) -> Result<Slots, NotAdmitted> {
    let acquire = window.slots.clone().acquire_many_owned(n);
    window.waiting.fetch_add(1, Ordering::Relaxed);
    struct Waiting<'a>(&'a AtomicU32);
    impl Drop for Waiting<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::Relaxed);
        }
    }
    let _waiting = Waiting(&window.waiting);
    // Biased, client first: a waiter whose slot frees as its client leaves must not dispatch
    // a request nobody waits for.
    tokio::select! {
        biased;
        _ = client_gone => Err(NotAdmitted::ClientGone),
        slots = acquire => match slots {
            Ok(slots) => {
                METRICS.pd_admission_waits.inc();
                Ok(slots)
            }
            // The semaphore is never closed.
            Err(_) => Err(NotAdmitted::Shed),
        },
        _ = tokio::time::sleep(wait) => {
            METRICS.pd_admission_sheds.inc();
            Err(NotAdmitted::Shed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_window_admits_up_to_its_size_and_frees_slots_when_they_drop() {
        let w = Window::new(2);
        let a = w.slots.clone().try_acquire_many_owned(1).unwrap();
        let b = w.slots.clone().try_acquire_many_owned(1).unwrap();
        assert_eq!(w.in_use(), 2);
        assert!(w.slots.clone().try_acquire_many_owned(1).is_err());
        drop(a);
        assert_eq!(w.in_use(), 1);
        drop(b);
        assert_eq!(w.in_use(), 0);
    }
}
