//! A streamed token must not cost allocations: once a choice has started and the caller's
//! buffer has grown, writing a delta allocates nothing on the chat, completions and Anthropic
//! streams, and only amortized buffer growth on the routes that must keep the whole text
//! (`/generate`'s cumulative frames, the Responses `done` events). Counted with a global
//! allocator that tallies the current thread's allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use pdgate_convert::{
    response_writer, Delta, LogprobOutput, ResponseSpec, ResponseWriter, TokenLogprob, TopLogprob,
};
use pdgate_filters::route::Route;

struct CountingAllocator;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded to `System` unchanged; the counter is a const-initialized
// thread-local `Cell`, which never allocates itself.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

fn allocations_of(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

const TOKENS: usize = 2000;

fn rows() -> Vec<TokenLogprob> {
    vec![TokenLogprob {
        token_id: 5,
        token: "\"tok\"".into(),
        bytes: None,
        logprob: -0.125,
        top: vec![TopLogprob {
            token_id: 6,
            token: "alt\\".into(),
            bytes: None,
            logprob: -2.5,
        }],
    }]
}

/// Allocations made while streaming `TOKENS` deltas after a warm-up one, the caller clearing
/// (and so reusing) its buffer after each.
fn streaming_allocations(route: Route, logprobs: bool) -> usize {
    let mut spec = ResponseSpec::new(route, true, "id".into(), "model".into(), 1);
    if logprobs {
        spec.logprobs = Some(LogprobOutput {
            top_logprobs: 1,
            token_text: true,
        });
    }
    let mut writer: Box<dyn ResponseWriter> = response_writer(spec).unwrap();
    let rows = if logprobs { rows() } else { Vec::new() };
    let delta = Delta {
        index: 0,
        text: "a \"quoted\"\n piece é",
        token_ids: &[7],
        logprobs: &rows,
        usage: None,
    };
    let mut out = Vec::with_capacity(1 << 16);
    writer.start(&mut out);
    writer.delta(&mut out, &delta);
    out.clear();
    allocations_of(|| {
        for _ in 0..TOKENS {
            writer.delta(&mut out, &delta);
            out.clear();
        }
    })
}

#[test]
fn streamed_deltas_allocate_nothing_on_chat_completions_and_messages() {
    for (route, logprobs) in [
        (Route::ChatCompletions, false),
        (Route::ChatCompletions, true),
        (Route::Completions, false),
        (Route::Completions, true),
        (Route::Messages, false),
    ] {
        assert_eq!(
            streaming_allocations(route, logprobs),
            0,
            "{route:?} logprobs {logprobs}"
        );
    }
}

#[test]
fn cumulative_routes_only_grow_their_buffers() {
    for (route, logprobs) in [
        (Route::Generate, false),
        (Route::Generate, true),
        (Route::Responses, false),
    ] {
        let n = streaming_allocations(route, logprobs);
        // Doubling growth of a handful of buffers: logarithmic in the text, not per token.
        assert!(
            n <= 80,
            "{route:?} logprobs {logprobs}: {n} allocations for {TOKENS} tokens"
        );
    }
}
