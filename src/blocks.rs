//! A per-thread cache of freed heap blocks from 1 KiB to 16 KiB, in front of glibc's malloc
//! (the `pdgate` binary's global allocator).
//!
//! Why: glibc's own per-thread cache (tcache) stops at 1,032 bytes. Everything larger that a PD
//! request allocates and frees — a leg's read buffer (4 KiB), its encoded request, the relayed
//! answer, the boxed futures of the request's phases — goes through an arena, under the arena's
//! lock, and a block freed on the other worker thread than the one that allocated it (tokio
//! moves tasks between workers) takes the lock of the allocating thread's arena. At c=64 the two
//! workers then contended for it: `strace -c` counted 0.6 `futex` calls per request, all of them
//! malloc's arena lock (`perf record -e syscalls:sys_enter_futex -g`: `__lll_lock_wake_private`
//! / `__lll_lock_wait_private` under `free` and `malloc`), and the arena path itself
//! (`_int_malloc`, `_int_free`, `unlink_chunk`, `malloc_consolidate`) was ~6% of the gateway's
//! CPU (bench/README, "Round 2, sixth part").
//!
//! How: a freed block of a size in the range goes on a list of its size class (256-byte steps)
//! kept by the freeing thread — the block's own first bytes link the list, so the cache
//! allocates nothing — and the next allocation of that class on that thread takes it back with
//! no lock and no search. Every allocation in the range is rounded up to its class (at most 255
//! bytes more), whether or not the cache is on, so any block of a class fits any request of it.
//! A thread keeps at most [`PER_CLASS`] blocks of a class and [`MAX_BYTES`] in all; past that a
//! block goes back to glibc. A thread's lists go back to glibc when it exits.
//!
//! Off until [`BlockCache::enable`]: `pdgate run` / `launch` turn it on together with glibc's
//! tunables (an operator's own `glibc.malloc.*` settings turn both off, e.g. for heaptrack,
//! which would count cached blocks as still in use).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};

/// glibc's tcache serves requests up to this size already.
const TCACHE_MAX: usize = 1032;
/// Size classes are this far apart.
const STEP: usize = 256;
/// The largest request the cache serves.
const MAX_SIZE: usize = 16 * 1024;
/// Class `c` holds blocks of `(c + 1) * STEP` bytes.
const CLASSES: usize = MAX_SIZE / STEP;
/// Blocks of one class a thread keeps.
pub const PER_CLASS: u16 = 32;
/// Bytes a thread keeps in all its lists.
pub const MAX_BYTES: usize = 1 << 20;
/// malloc's alignment: a block with a larger one is left to glibc.
const MALLOC_ALIGN: usize = 16;

/// The class of a request, when the cache serves it.
fn class(layout: &Layout) -> Option<usize> {
    let size = layout.size();
    if size <= TCACHE_MAX || size > MAX_SIZE || layout.align() > MALLOC_ALIGN {
        return None;
    }
    Some(size.div_ceil(STEP) - 1)
}

/// The size of every block of class `c`.
fn class_size(c: usize) -> usize {
    (c + 1) * STEP
}

fn class_layout(c: usize) -> Layout {
    // SAFETY: a multiple of 256 no larger than 16 KiB, with malloc's alignment.
    unsafe { Layout::from_size_align_unchecked(class_size(c), MALLOC_ALIGN) }
}

/// One thread's lists: the first free block of each class (each block's first word points to
/// the next), how many each holds, and their bytes in all.
struct Lists {
    head: [Cell<*mut u8>; CLASSES],
    count: [Cell<u16>; CLASSES],
    bytes: Cell<usize>,
}

impl Lists {
    fn pop(&self, c: usize) -> *mut u8 {
        let p = self.head[c].get();
        if !p.is_null() {
            // SAFETY: `p` is a free block this list owns; its first word is the next one.
            self.head[c].set(unsafe { p.cast::<*mut u8>().read() });
            self.count[c].set(self.count[c].get() - 1);
            self.bytes.set(self.bytes.get() - class_size(c));
        }
        p
    }

    /// Keeps `p` (a block of class `c`), unless the lists are full.
    fn push(&self, c: usize, p: *mut u8) -> bool {
        let bytes = self.bytes.get() + class_size(c);
        if self.count[c].get() >= PER_CLASS || bytes > MAX_BYTES {
            return false;
        }
        // SAFETY: the caller gives up `p`, a block of at least `class_size(c)` bytes aligned
        // for a pointer; its first word now links the list.
        unsafe { p.cast::<*mut u8>().write(self.head[c].get()) };
        self.head[c].set(p);
        self.count[c].set(self.count[c].get() + 1);
        self.bytes.set(bytes);
        true
    }
}

impl Drop for Lists {
    fn drop(&mut self) {
        for c in 0..CLASSES {
            loop {
                let p = self.pop(c);
                if p.is_null() {
                    break;
                }
                // SAFETY: a block of class `c`, allocated from `System` with its layout.
                unsafe { System.dealloc(p, class_layout(c)) };
            }
        }
    }
}

thread_local! {
    static LISTS: Lists = const {
        Lists {
            head: [const { Cell::new(ptr::null_mut()) }; CLASSES],
            count: [const { Cell::new(0) }; CLASSES],
            bytes: Cell::new(0),
        }
    };
}

/// The global allocator: glibc's malloc, with the per-thread block cache in front of it.
pub struct BlockCache {
    on: AtomicBool,
}

impl BlockCache {
    /// Off: every request goes to glibc (rounded up to its class when in the range).
    pub const fn new() -> BlockCache {
        BlockCache {
            on: AtomicBool::new(false),
        }
    }

    /// Turns the cache on (at startup, before the runtime's threads exist).
    pub fn enable(&self) {
        self.on.store(true, Ordering::Relaxed);
    }

    fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// A cached block of class `c` from this thread's lists, or null.
    fn take(&self, c: usize) -> *mut u8 {
        if !self.on() {
            return ptr::null_mut();
        }
        // After this thread's lists were dropped (it is exiting), there is no cache.
        LISTS.try_with(|l| l.pop(c)).unwrap_or(ptr::null_mut())
    }

    /// Whether this thread's lists kept the block.
    fn keep(&self, c: usize, p: *mut u8) -> bool {
        self.on() && LISTS.try_with(|l| l.push(c, p)).unwrap_or(false)
    }
}

impl Default for BlockCache {
    fn default() -> Self {
        BlockCache::new()
    }
}

// SAFETY: every block handed out is at least `layout.size()` bytes with `layout.align()` (a
// class block is `class_size` ≥ the request, malloc-aligned, and a request with a larger
// alignment never has a class); a block goes back to `System` with the layout it was allocated
// with (its class layout, or the caller's), and a cached block is handed out once.
unsafe impl GlobalAlloc for BlockCache {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(c) = class(&layout) else {
            return unsafe { System.alloc(layout) };
        };
        let p = self.take(c);
        if p.is_null() {
            unsafe { System.alloc(class_layout(c)) }
        } else {
            p
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let Some(c) = class(&layout) else {
            return unsafe { System.alloc_zeroed(layout) };
        };
        let p = self.take(c);
        if p.is_null() {
            return unsafe { System.alloc_zeroed(class_layout(c)) };
        }
        // A cached block holds what its last owner wrote.
        unsafe { p.write_bytes(0, layout.size()) };
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        match class(&layout) {
            Some(c) if self.keep(c, p) => {}
            Some(c) => unsafe { System.dealloc(p, class_layout(c)) },
            None => unsafe { System.dealloc(p, layout) },
        }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size`, rounded up to the alignment, fits `isize`.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (class(&layout), class(&new_layout)) {
            (None, None) => unsafe { System.realloc(p, layout, new_size) },
            (Some(a), Some(b)) if a == b => p,
            _ => {
                let q = unsafe { self.alloc(new_layout) };
                if !q.is_null() {
                    unsafe {
                        ptr::copy_nonoverlapping(p, q, layout.size().min(new_size));
                        self.dealloc(p, layout);
                    }
                }
                q
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize) -> Layout {
        Layout::from_size_align(size, 8).unwrap()
    }

    fn cached(c: usize) -> u16 {
        LISTS.with(|l| l.count[c].get())
    }

    #[test]
    fn classes_cover_what_the_tcache_does_not_up_to_16_kib() {
        assert_eq!(class(&layout(1032)), None);
        assert_eq!(class(&layout(1033)), Some(4));
        assert_eq!(class_size(4), 1280);
        assert_eq!(class(&layout(4096)), Some(15));
        assert_eq!(class_size(15), 4096);
        assert_eq!(class(&layout(16 * 1024)), Some(CLASSES - 1));
        assert_eq!(class(&layout(16 * 1024 + 1)), None);
        assert_eq!(class(&Layout::from_size_align(4096, 64).unwrap()), None);
    }

    #[test]
    fn a_freed_block_is_handed_out_again_for_any_size_of_its_class() {
        let cache = BlockCache::new();
        cache.enable();
        unsafe {
            let a = cache.alloc(layout(4000));
            a.write_bytes(7, 4000);
            cache.dealloc(a, layout(4000));
            assert_eq!(cached(15), 1);
            // 3841..=4096 share the class: the same block comes back, whole.
            let b = cache.alloc(layout(4096));
            assert_eq!(a, b);
            assert_eq!(cached(15), 0);
            b.write_bytes(1, 4096);
            // Another class does not take it.
            cache.dealloc(b, layout(4096));
            let c = cache.alloc(layout(2000));
            assert_ne!(c, b);
            cache.dealloc(c, layout(2000));
            let z = cache.alloc_zeroed(layout(3900));
            assert_eq!(z, b);
            assert!(std::slice::from_raw_parts(z, 3900).iter().all(|&x| x == 0));
            cache.dealloc(z, layout(3900));
        }
    }

    #[test]
    fn off_it_keeps_nothing_and_on_it_keeps_at_most_its_caps() {
        let cache = BlockCache::new();
        unsafe {
            let a = cache.alloc(layout(1500));
            cache.dealloc(a, layout(1500));
            assert_eq!(cached(5), 0, "off");
            cache.enable();
            let blocks: Vec<_> = (0..PER_CLASS + 3)
                .map(|_| cache.alloc(layout(1500)))
                .collect();
            for &p in &blocks {
                cache.dealloc(p, layout(1500));
            }
            assert_eq!(cached(5), PER_CLASS);
            // The byte cap: 16 KiB blocks fill 1 MiB with 64, but a class stops at 32 first;
            // two classes of large blocks reach the cap.
            let big: Vec<_> = (0..PER_CLASS)
                .flat_map(|_| {
                    [
                        cache.alloc(layout(16 * 1024)),
                        cache.alloc(layout(15 * 1024)),
                    ]
                })
                .collect();
            for (i, &p) in big.iter().enumerate() {
                cache.dealloc(p, layout(if i % 2 == 0 { 16 * 1024 } else { 15 * 1024 }));
            }
            assert!(LISTS.with(|l| l.bytes.get()) <= MAX_BYTES);
            // Drain what this thread kept, so the lists' drop has less to do.
            for c in 0..CLASSES {
                while !cache.take(c).is_null() {}
            }
        }
    }

    #[test]
    fn realloc_keeps_the_bytes_across_classes_and_out_of_the_range() {
        let cache = BlockCache::new();
        cache.enable();
        unsafe {
            let mut size = 100;
            let mut p = cache.alloc(layout(size));
            for i in 0..size {
                p.add(i).write(i as u8);
            }
            for next in [900, 1100, 1200, 3000, 2000, 20_000, 5000, 64] {
                p = cache.realloc(p, layout(size), next);
                assert!(!p.is_null());
                for i in 0..size.min(next).min(100) {
                    assert_eq!(p.add(i).read(), i as u8, "{size} -> {next}");
                }
                size = next;
            }
            cache.dealloc(p, layout(size));
            // Within a class, realloc is the same block.
            let q = cache.alloc(layout(1100));
            assert_eq!(cache.realloc(q, layout(1100), 1280), q);
            cache.dealloc(q, layout(1280));
        }
    }

    #[test]
    fn blocks_passed_between_threads_keep_their_bytes_until_freed() {
        // Four threads allocate blocks of every size around the range, fill each with a pattern
        // of its own, and pass them round a ring; whoever receives a block checks the pattern,
        // and frees it or reallocates it to another size and passes it on. A list that handed
        // a block out twice, or a class too small for a request, breaks a pattern.
        static CACHE: BlockCache = BlockCache::new();
        CACHE.enable();
        const THREADS: usize = 4;
        const ROUNDS: usize = 3000;
        struct Block(usize, usize, u8);
        fn fill(b: &Block) {
            unsafe { (b.0 as *mut u8).write_bytes(b.2, b.1) };
        }
        fn check(b: &Block) {
            let bytes = unsafe { std::slice::from_raw_parts(b.0 as *const u8, b.1) };
            assert!(
                bytes.iter().all(|&x| x == b.2),
                "a block of {} bytes was overwritten",
                b.1
            );
        }
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..THREADS)
            .map(|_| std::sync::mpsc::channel::<Block>())
            .unzip();
        let handles: Vec<_> = rxs
            .into_iter()
            .enumerate()
            .map(|(i, rx)| {
                let next = txs[(i + 1) % THREADS].clone();
                std::thread::spawn(move || {
                    let mut seed = i as u64 * 7919 + 1;
                    let mut rand = move || {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        seed
                    };
                    for r in 0..ROUNDS {
                        let size = 900 + (rand() % 17_000) as usize;
                        let b = Block(unsafe { CACHE.alloc(layout(size)) } as usize, size, r as u8);
                        fill(&b);
                        let _ = next.send(b);
                        while let Ok(got) = rx.try_recv() {
                            check(&got);
                            if rand() % 2 == 0 {
                                unsafe { CACHE.dealloc(got.0 as *mut u8, layout(got.1)) };
                            } else {
                                let size = 900 + (rand() % 17_000) as usize;
                                let p =
                                    unsafe { CACHE.realloc(got.0 as *mut u8, layout(got.1), size) };
                                // The bytes both sizes share moved with the block.
                                check(&Block(p as usize, size.min(got.1), got.2));
                                let moved = Block(p as usize, size, got.2.wrapping_add(1));
                                fill(&moved);
                                let _ = next.send(moved);
                            }
                        }
                    }
                    rx
                })
            })
            .collect();
        drop(txs);
        let rxs: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        for rx in rxs {
            while let Ok(got) = rx.try_recv() {
                check(&got);
                unsafe { CACHE.dealloc(got.0 as *mut u8, layout(got.1)) };
            }
        }
    }

    #[test]
    fn a_block_freed_on_another_thread_joins_that_threads_lists() {
        static CACHE: BlockCache = BlockCache::new();
        CACHE.enable();
        let p = unsafe { CACHE.alloc(layout(8000)) } as usize;
        let (kept, reused) = std::thread::spawn(move || unsafe {
            CACHE.dealloc(p as *mut u8, layout(8000));
            let kept = cached(31);
            (kept, CACHE.alloc(layout(8100)) as usize)
        })
        .join()
        .unwrap();
        assert_eq!(kept, 1);
        assert_eq!(reused, p, "the other thread took it back");
        assert_eq!(cached(31), 0, "not on this thread's lists");
        unsafe { CACHE.dealloc(reused as *mut u8, layout(8100)) };
        assert_eq!(cached(31), 1);
        while !CACHE.take(31).is_null() {}
    }
}
