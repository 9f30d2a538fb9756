//! The shape check runs on every PD request, so it must not allocate for a valid body (issue 12):
//! counted here with a global allocator that tallies the allocations of the current thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use pdgate_filters::body::scan_object;
use pdgate_filters::shape::check_shape;
use pdgate_filters::Route;

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

#[test]
fn checking_a_valid_body_allocates_nothing() {
    // Escapes in values (not in keys) and nested content are the common case.
    let bodies: [(Route, &str); 6] = [
        (
            Route::ChatCompletions,
            r#"{"model":"m","messages":[{"role":"system","content":"be \"brief\"\n"},
                {"role":"user","content":[{"type":"text","text":"h\u00e9"}],"name":"u"}],
                "max_tokens":16,"max_completion_tokens":0,"temperature":0.7,"top_p":1,
                "tools":[{"type":"function"}],"x":{"messages":5}}"#,
        ),
        (
            Route::Messages,
            r#"{"model":"c","system":"s","messages":[{"role":"user","content":"hi"}],
                "max_tokens":1,"temperature":0,"top_p":0.5}"#,
        ),
        (
            Route::Completions,
            r#"{"prompt":[[1,2],[3]],"max_tokens":8,"temperature":1e0}"#,
        ),
        (Route::Completions, r#"{"prompt_embeds":["AAAA","BBBB"]}"#),
        (
            Route::Generate,
            r#"{"text":"a","sampling_params":{"max_new_tokens":4,"temperature":0.5,
                "top_p":0.9,"stop":["\n"],"regex":"[a-z]+"}}"#,
        ),
        (Route::Responses, r#"{"input":"hi","max_output_tokens":5}"#),
    ];
    for (route, body) in bodies {
        let top = scan_object(body.as_bytes()).unwrap();
        let mut verdict = Err(());
        let n = allocations_of(|| {
            verdict = check_shape(route, body.as_bytes(), &top).map_err(drop);
        });
        assert_eq!(verdict, Ok(()), "{route:?} {body}");
        assert_eq!(n, 0, "{route:?}: {n} allocations checking {body}");
    }
}
