//! Keeps a runtime's timer wheel from ever being empty, so that a request's timers do not wake
//! a parked worker.
//!
//! tokio's time driver wakes whichever worker is parked on the I/O driver (an `eventfd` write
//! and that thread's wake-up) when a timer is registered that is due before the driver's
//! next planned wake-up — and always when no timer was pending at all. pdgate's worker runtime
//! has no timers of its own (health checks, discovery and the like run in Pingora's background
//! services, on runtimes of their own), so at low load the wheel empties between requests and
//! every leg's head timeout woke the other worker: at c=1, 2 `eventfd` writes per request from
//! `Sleep::poll_elapsed`, and the woken worker's futex calls and `epoll_wait` after them
//! (`perf record -e syscalls:sys_enter_write --call-graph dwarf`; bench/README, "Round 2, sixth
//! part"). A floor proxy on the same runtime, with no timers, makes none of these calls.
//!
//! [`ensure`] spawns, once per worker thread, a task that sleeps [`PERIOD`] at a time for as long
//! as the runtime lives. The driver's next wake-up is then never more than a second away, and a
//! request's timers (head, stall and request timeouts: seconds to minutes) are due after it, so
//! registering them wakes nobody. The cost: each worker runtime's driver wakes once a second.

use std::cell::Cell;
use std::time::Duration;

/// How often the keeper's timer fires: shorter than any request timeout worth sparing a wake-up.
pub const PERIOD: Duration = Duration::from_secs(1);

thread_local! {
    static KEPT: Cell<bool> = const { Cell::new(false) };
}

/// Called on every request (the front door): the first call on a thread of a tokio runtime
/// spawns that runtime's keeper (one per worker thread, so each of Pingora's per-thread runtimes
/// gets one when work stealing is off).
pub fn ensure() {
    if KEPT.get() {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    KEPT.set(true);
    runtime.spawn(async {
        let mut tick = tokio::time::interval(PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_keeper_per_thread_that_keeps_a_timer_pending_and_none_outside_a_runtime() {
        // Outside a runtime nothing is spawned and the thread stays unmarked.
        std::thread::spawn(|| {
            ensure();
            assert!(!KEPT.get());
        })
        .join()
        .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            ensure();
            ensure();
            assert!(KEPT.get());
            let alive = || {
                tokio::runtime::Handle::current()
                    .metrics()
                    .num_alive_tasks()
            };
            assert_eq!(alive(), 1, "one keeper, however often it is asked for");
            // Many periods later (the paused clock jumps to each timer) the keeper is still
            // there, waiting on its next tick: the wheel never empties.
            let start = tokio::time::Instant::now();
            tokio::time::sleep(PERIOD * 10 + PERIOD / 2).await;
            assert!(start.elapsed() >= PERIOD * 10);
            assert_eq!(alive(), 1, "the keeper ended");
        });
    }
}
