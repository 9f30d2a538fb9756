//! A future boxed where it is built, not built and then copied into its box.
//!
//! Why: `Box::pin(some_async_fn(args))` builds the future on the stack and copies all of it into
//! the box. A future is as large as its largest state (the futures it awaits inline included),
//! often 1–2 KiB, though at that point only its arguments are set: `gdb` on a loaded gateway
//! counted ~16.5 KB of such copies in pdgate's own boxes per PD request, a `memmove` of each
//! whole future into memory the allocator had just handed out (bench/README, "Round 2,
//! fourteenth part"). Allocating first and then calling the `async fn` lets the compiler build
//! the future in the box: only its arguments and its state's tag are written.

use std::future::Future;
use std::pin::Pin;

/// `Box::pin(make())`, with the box allocated before `make` runs, so the future is written in
/// place. `make` is the call of an `async fn` (or an `async` block): nothing else should run in
/// it.
#[inline(always)]
pub fn in_box<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    let mut slot = Box::<F>::new_uninit();
    slot.write(make());
    // SAFETY: `write` initialised the box's content just above.
    Box::into_pin(unsafe { slot.assume_init() })
}

#[cfg(test)]
mod tests {
    use super::in_box;

    #[tokio::test]
    async fn the_boxed_future_runs_to_its_answer() {
        async fn double(x: u64) -> u64 {
            tokio::task::yield_now().await;
            x * 2
        }
        assert_eq!(in_box(|| double(21)).await, 42);
    }
}
