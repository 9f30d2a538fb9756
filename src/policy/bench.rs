//! A dependency-free timing harness for `select`, per policy, fleet size and prompt size.
//!
//! `bench_report(&BenchConfig::default())` returns a markdown table of ns/op. Run it with
//! `cargo test --release -p pdgate --lib policy::bench -- --ignored --nocapture`, or call it from
//! a bench binary. Each cell routes a pool of 32 prompts that share their first half (a system
//! prompt) and differ in the rest, with routing keys from 1,000 sessions and in-flight counts
//! between 0 and 7. Two numbers per cell: `select` alone, and a full request
//! (`select` + `on_selected`, which is where cache_aware inserts, manual pins, bucket records).

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

use super::hash::hash_bytes;
use super::{build, Candidate, Policy, PolicyLeg, PolicyName, PolicyParams, RoutingInput};

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub policies: Vec<PolicyName>,
    pub workers: Vec<usize>,
    pub prompt_bytes: Vec<usize>,
    /// Minimum measured time per cell and mode.
    pub min_time: Duration,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            policies: PolicyName::ALL.to_vec(),
            workers: vec![8, 128, 1024],
            prompt_bytes: vec![1 << 10, 32 << 10, 256 << 10],
            min_time: Duration::from_millis(200),
        }
    }
}

const PROMPTS: usize = 32;
const SESSIONS: usize = 1000;

fn prompt_pool(bytes: usize) -> Vec<String> {
    let letters = b"abcdefghijklmnopqrstuvwxyz      ";
    let text = |seed: u64, len: usize| -> String {
        (0..len)
            .map(|i| {
                letters[(hash_bytes(&(seed ^ (i as u64) << 8).to_le_bytes()) % 32) as usize] as char
            })
            .collect()
    };
    let shared = text(1, bytes / 2);
    (0..PROMPTS)
        .map(|p| format!("{shared}{}", text(100 + p as u64, bytes - bytes / 2)))
        .collect()
}

/// ns per call of `op` over `min_time`, after a warm-up pass.
fn time_per_op(min_time: Duration, mut op: impl FnMut(usize)) -> f64 {
    for i in 0..PROMPTS * 2 {
        op(i);
    }
    let mut iters = 64usize;
    loop {
        let start = Instant::now();
        for i in 0..iters {
            op(i);
        }
        let elapsed = start.elapsed();
        if elapsed >= min_time {
            return elapsed.as_nanos() as f64 / iters as f64;
        }
        let grow =
            (min_time.as_secs_f64() / elapsed.as_secs_f64().max(1e-9) * 1.2).clamp(2.0, 100.0);
        iters = (iters as f64 * grow) as usize;
    }
}

struct Cell {
    select_ns: f64,
    request_ns: f64,
}

/// One benchmark cell, ready to run: a policy instance with `workers` registered and its state
/// populated, a pool of prompts of one size, and the routing keys. Shared by [`bench_report`]
/// and the Criterion benchmark (`bench/benches/policy.rs`).
pub struct BenchCase {
    policy: std::sync::Arc<dyn Policy>,
    urls: Vec<String>,
    in_flight: Vec<usize>,
    keys: Vec<String>,
    prompts: Vec<String>,
}

impl BenchCase {
    pub fn new(name: PolicyName, workers: usize, prompt_bytes: usize) -> BenchCase {
        let urls: Vec<String> = (0..workers)
            .map(|i| format!("http://10.{}.{}.{}:8000", i >> 16, (i >> 8) & 255, i & 255))
            .collect();
        let in_flight = urls
            .iter()
            .enumerate()
            .map(|(i, u)| (hash_bytes(u.as_bytes()) % 8) as usize + (i == 0) as usize)
            .collect();
        let policy =
            build(name, PolicyLeg::Prefill, &PolicyParams::default()).expect("prefill leg");
        for u in &urls {
            policy.on_worker_added(u);
        }
        let case = BenchCase {
            policy,
            urls,
            in_flight,
            keys: (0..SESSIONS).map(|s| format!("session-{s}")).collect(),
            prompts: prompt_pool(prompt_bytes),
        };
        // Populate state (tree, pins, window) before anything is timed.
        for i in 0..SESSIONS.max(PROMPTS) {
            case.request(i);
        }
        case
    }

    fn candidates(&self) -> Vec<Candidate<'_>> {
        self.urls
            .iter()
            .zip(&self.in_flight)
            .map(|(u, &n)| Candidate {
                url: u,
                in_flight: n,
                load: None,
            })
            .collect()
    }

    fn input(&self, i: usize) -> RoutingInput<'_> {
        RoutingInput {
            text: Some(&self.prompts[i % PROMPTS]),
            routing_key: Some(&self.keys[i % SESSIONS]),
            prompt_len: self.prompts[i % PROMPTS].len(),
            ..Default::default()
        }
    }

    /// A runner for `select` alone (the candidate list is built once, outside the timing).
    pub fn selector(&self) -> impl Fn(usize) -> Option<usize> + '_ {
        let candidates = self.candidates();
        move |i| self.policy.select(black_box(&candidates), &self.input(i))
    }

    /// A runner for a full request: `select` + `on_selected`.
    pub fn requester(&self) -> impl Fn(usize) + '_ {
        let candidates = self.candidates();
        move |i| {
            let inp = self.input(i);
            let chosen = self.policy.select(&candidates, &inp).expect("a worker");
            self.policy.on_selected(&candidates[chosen], &inp);
        }
    }

    fn request(&self, i: usize) {
        (self.requester())(i)
    }
}

fn measure(name: PolicyName, workers: usize, prompt_bytes: usize, min_time: Duration) -> Cell {
    let case = BenchCase::new(name, workers, prompt_bytes);
    let select = case.selector();
    let select_ns = time_per_op(min_time, |i| {
        black_box(select(i));
    });
    let request = case.requester();
    let request_ns = time_per_op(min_time, request);
    Cell {
        select_ns,
        request_ns,
    }
}

fn fmt_ns(ns: f64) -> String {
    if ns >= 100_000.0 {
        format!("{:.0} µs", ns / 1000.0)
    } else if ns >= 10_000.0 {
        format!("{:.1} µs", ns / 1000.0)
    } else {
        format!("{ns:.0} ns")
    }
}

/// Time every configured cell and return a markdown table (`select` / full request, per op).
pub fn bench_report(config: &BenchConfig) -> String {
    let mut out = String::new();
    let _ = write!(out, "| policy | workers |");
    for b in &config.prompt_bytes {
        let _ = write!(out, " {} KB: select / request |", b / 1024);
    }
    out.push('\n');
    let _ = write!(out, "|---|---:|");
    for _ in &config.prompt_bytes {
        out.push_str("---:|");
    }
    out.push('\n');
    for &name in &config.policies {
        for &w in &config.workers {
            let _ = write!(out, "| {name} | {w} |");
            for &bytes in &config.prompt_bytes {
                let cell = measure(name, w, bytes, config.min_time);
                let _ = write!(
                    out,
                    " {} / {} |",
                    fmt_ns(cell.select_ns),
                    fmt_ns(cell.request_ns)
                );
            }
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_harness_produces_a_row_per_policy_and_fleet() {
        let report = bench_report(&BenchConfig {
            policies: vec![PolicyName::RoundRobin, PolicyName::CacheAware],
            workers: vec![4],
            prompt_bytes: vec![256],
            min_time: Duration::from_millis(1),
        });
        assert_eq!(report.lines().count(), 4, "{report}");
        assert!(report.contains("| cache_aware | 4 |"));
    }

    #[test]
    #[ignore = "timing run: cargo test --release -p pdgate --lib policy::bench -- --ignored --nocapture"]
    fn print_bench_report() {
        println!("{}", bench_report(&BenchConfig::default()));
    }
}
