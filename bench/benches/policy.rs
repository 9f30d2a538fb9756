//! Criterion benchmark of every routing policy (issue 6): `select` alone and a full request
//! (`select` + `on_selected`) at 8, 128 and 1,024 workers and prompts of 1 KB, 32 KB and 256 KB,
//! on the same fixtures as `pdgate::policy::bench_report` (32 prompts sharing their first half,
//! routing keys from 1,000 sessions, in-flight counts 0–7).
//!
//!   cargo bench -p pdgate-bench --features policy --bench policy
//!   cargo bench -p pdgate-bench --features policy --bench policy -- 'cache_aware/select'
//!
//! Short windows (0.3 s warm-up, 1 s measured, 20 samples per cell): 180 cells in ~5 minutes.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use pdgate::policy::{BenchCase, PolicyName};

const WORKERS: [usize; 3] = [8, 128, 1024];
const PROMPTS: [usize; 3] = [1 << 10, 32 << 10, 256 << 10];

fn policies(c: &mut Criterion) {
    for name in PolicyName::ALL {
        let mut group = c.benchmark_group(name.as_str());
        group
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(1))
            .sample_size(20);
        for workers in WORKERS {
            for bytes in PROMPTS {
                let case = BenchCase::new(name, workers, bytes);
                let param = format!("{workers}w/{}KB", bytes >> 10);
                let select = case.selector();
                group.bench_function(BenchmarkId::new("select", &param), |b| {
                    let mut i = 0usize;
                    b.iter(|| {
                        i = i.wrapping_add(1);
                        black_box(select(i))
                    })
                });
                let request = case.requester();
                group.bench_function(BenchmarkId::new("request", &param), |b| {
                    let mut i = 0usize;
                    b.iter(|| {
                        i = i.wrapping_add(1);
                        request(i)
                    })
                });
            }
        }
        group.finish();
    }
}

criterion_group!(benches, policies);
criterion_main!(benches);
