//! `pdgate-bench one-pass PROMPT_BYTES [ITERS]`: the gateway's one pass over a PD request body,
//! timed in isolation — `scan_object` (validate + record the top-level entries), `classify` (the
//! request facts and the route's shape check) and the SGLang leg body splice (`leg_body`, one
//! copy of the body with the bootstrap keys added), what `serve_pd` and `legs::parallel::attempt`
//! do once per request — on the body `sweep` sends. A plain copy of the body and a
//! `serde_json::Value` parse of it are timed too, for scale. Prints µs per call: median and min
//! of 7 batches by wall clock and, where Linux exposes it, the thread's own CPU time over the 7
//! batches (`/proc/thread-self/schedstat`).

use std::hint::black_box;
use std::time::Instant;

use pdgate_filters::body::is_valid_json;
use pdgate_filters::handoff::sglang::{leg_body, BootstrapTarget, DpRanks, Leg, Rooms};
use pdgate_filters::shape::check_shape;
use pdgate_filters::{classify, scan_object, Route};
use serde_json::Value;

use crate::procstat::thread_cpu_ns;
use crate::report::median;
use crate::workload::{chat, chat_body, words};

struct Timing {
    wall_us: Vec<f64>,
    /// The thread's CPU time over all 7 batches, per call (the kernel updates it at ticks and
    /// context switches, so only a long total is precise).
    cpu_us: Option<f64>,
}

/// Runs `f` `iters` times per batch, 7 batches (after one warm-up batch); µs per call.
fn time(iters: u32, mut f: impl FnMut()) -> Timing {
    const BATCHES: u32 = 7;
    for _ in 0..iters {
        f();
    }
    let mut wall_us = Vec::new();
    let cpu0 = thread_cpu_ns();
    for _ in 0..BATCHES {
        let t0 = Instant::now();
        for _ in 0..iters {
            f();
        }
        wall_us.push(t0.elapsed().as_secs_f64() * 1e6 / f64::from(iters));
    }
    let cpu_us = thread_cpu_ns()
        .zip(cpu0)
        .map(|(b, a)| b.saturating_sub(a) as f64 / 1e3 / f64::from(iters * BATCHES));
    Timing { wall_us, cpu_us }
}

fn report(name: &str, mut t: Timing, bytes: usize) -> f64 {
    let min = t.wall_us.iter().copied().fold(f64::INFINITY, f64::min);
    let wall = median(std::mem::take(&mut t.wall_us)).unwrap_or(f64::NAN);
    let cpu = t
        .cpu_us
        .map_or_else(|| "–".to_string(), |c| format!("{c:.1}"));
    let gbps = bytes as f64 / (wall * 1e3);
    println!("| {name} | {wall:.1} | {min:.1} | {cpu} | {gbps:.2} |");
    wall
}

pub fn run(prompt: usize, iters: Option<u32>) {
    let body = chat_body(prompt, 16, false);
    // Enough calls per batch for ~50 ms at ~1 GB/s.
    let iters: u32 = iters.unwrap_or_else(|| {
        u32::try_from((50_000_000 / body.len()).clamp(20, 100_000)).unwrap_or(20)
    });
    let target = BootstrapTarget {
        host: "127.0.0.1",
        port: Some(8998),
    };
    let rooms = Rooms::Single(0x1234_5678_9abc_def0 & (i64::MAX as u64));
    let dp = DpRanks::default();
    let top = scan_object(&body).expect("a JSON object");
    let facts = classify(Route::ChatCompletions, &body, &top).expect("a chat request");
    assert!(!facts.stream);
    let leg = leg_body(&body, &top, &target, &rooms, Leg::Prefill, &dp);
    let _: Value = serde_json::from_slice(&leg).expect("the leg body is JSON");

    println!(
        "body {} bytes (prompt {prompt}), {iters} calls × 7 batches; µs per call",
        body.len()
    );
    println!();
    println!("| step | wall median µs | wall min µs | thread CPU mean µs | GB/s (wall median) |");
    println!("|---|---:|---:|---:|---:|");
    let mut dst = vec![0u8; body.len()];
    report(
        "memcpy into a reused buffer",
        time(iters, || {
            dst.copy_from_slice(black_box(&body));
            black_box(&mut dst);
        }),
        body.len(),
    );
    // Copies between 2 × 128 distinct buffers (2 × 32 MiB, more than the L3): memory bandwidth.
    let srcs: Vec<Vec<u8>> = (0..128).map(|_| body.clone()).collect();
    let mut dsts: Vec<Vec<u8>> = (0..128).map(|_| vec![0u8; body.len()]).collect();
    let mut k = 0usize;
    report(
        "memcpy, cold (128 sources × 128 destinations)",
        time(iters, || {
            k = (k + 1) % srcs.len();
            dsts[k].copy_from_slice(black_box(&srcs[(k * 7) % srcs.len()]));
            black_box(&mut dsts[k]);
        }),
        body.len(),
    );
    drop((srcs, dsts));
    report(
        "`to_vec` (malloc + copy + free; the freed block is reused at once)",
        time(iters, || {
            black_box(black_box(&body).to_vec());
        }),
        body.len(),
    );
    let scan = report(
        "`scan_object`",
        time(iters, || {
            black_box(scan_object(black_box(&body)).ok());
        }),
        body.len(),
    );
    report(
        "  serde_json's validating walk alone (`is_valid_json`; the scan's fallback for a body its own walk refuses)",
        time(iters, || {
            black_box(is_valid_json(black_box(&body)));
        }),
        body.len(),
    );
    let cls = report(
        "`classify` (chat)",
        time(iters, || {
            black_box(classify(Route::ChatCompletions, black_box(&body), &top).ok());
        }),
        body.len(),
    );
    report(
        "  of which `check_shape` (chat: the `messages` walk)",
        time(iters, || {
            black_box(check_shape(Route::ChatCompletions, black_box(&body), &top).ok());
        }),
        body.len(),
    );
    let splice = report(
        "`leg_body` (SGLang splice, one room)",
        time(iters, || {
            black_box(leg_body(
                black_box(&body),
                &top,
                &target,
                &rooms,
                Leg::Prefill,
                &dp,
            ));
        }),
        body.len(),
    );
    let pass = report(
        "**one pass: scan + classify + splice**",
        time(iters, || {
            let top = scan_object(black_box(&body)).expect("object");
            let facts = classify(Route::ChatCompletions, &body, &top).expect("chat");
            black_box(&facts);
            black_box(leg_body(&body, &top, &target, &rooms, Leg::Prefill, &dp));
        }),
        body.len(),
    );
    report(
        "`serde_json::from_slice::<Value>` (scale)",
        time(iters, || {
            black_box(serde_json::from_slice::<Value>(black_box(&body)).ok());
        }),
        body.len(),
    );
    // Prose as chat clients send it: a line break (`\n` in JSON) every ~60 bytes, a quoted
    // word, a few non-ASCII characters (some 15% longer than the body above).
    let prose = {
        let text: String = words(11, body.len().saturating_sub(120).max(8))
            .split(' ')
            .enumerate()
            .map(|(i, w)| match i % 10 {
                9 => format!("{w}\n"),
                4 => format!("\"{w}\" "),
                7 => format!("café {w} "),
                _ => format!("{w} "),
            })
            .collect();
        serde_json::to_vec(&chat(
            vec![serde_json::json!({"role": "user", "content": text})],
            16,
            false,
        ))
        .expect("a JSON value serializes")
    };
    report(
        "`scan_object`, prose (escapes and non-ASCII)",
        time(iters, || {
            black_box(scan_object(black_box(&prose)).ok());
        }),
        prose.len(),
    );
    report(
        "  serde_json's validating walk alone, prose",
        time(iters, || {
            black_box(is_valid_json(black_box(&prose)));
        }),
        prose.len(),
    );
    println!();
    println!(
        "sum of the parts {:.1} µs; one pass {pass:.1} µs",
        scan + cls + splice
    );
}
