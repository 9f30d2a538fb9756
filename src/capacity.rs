//! P:D capacity advice: which pool is the bottleneck at the current load, and roughly by how
//! much — `pdgate_pd_capacity_pressure{role}` and `GET /debug/capacity`.
//!
//! The spec's sizing guidelines say prefill is compute-bound (add prefill when TTFT climbs while
//! decodes have headroom) and decode is bounded by its batch (add decode when dispatches wait at
//! the admission window). Both become one number per pool, the **pressure**: the demand on the
//! pool over its capacity, averaged over a sliding window (Little's law: the time-average of
//! requests inside a pool is its arrival rate × time spent there, queueing included).
//!
//! * Prefill: demand = prefill legs open (every one, running or queued inside the engine);
//!   capacity = available prefill workers × 1, since a compute-bound prefill runs one forward
//!   pass at a time and everything beyond it queues (its TTFT grows).
//! * Decode: demand = admission slots in use plus dispatches waiting for one, less the prefill
//!   legs open (a slot is claimed before the prefill runs and held while the decode waits for
//!   its KV: that wait is the prefill's, not the decode's); capacity = the decodes' running
//!   windows. Decodes that report no window (vLLM over HTTP without a
//!   `max_running_requests` label) have no known capacity and are left out; with none known,
//!   decode pressure is unknown.
//!
//! Pressure ≥ 1: the pool is saturated (requests queue); the advice names the pool with the
//! higher pressure when it is ≥ 0.8, and the workers that would bring it to 0.7 at this load.
//! It reads the gateway's own counts only, sampled every 250 ms off the data path.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use serde_json::{json, Value};

use crate::gateway::Gateway;
use crate::metrics::METRICS;
use crate::workers::select::is_available;

/// How often the pools are sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// Pressure at or above which a pool is called the bottleneck.
const BOTTLENECK: f64 = 0.8;
/// Pressure the advice sizes a pool for.
const TARGET: f64 = 0.7;
/// Concurrent forward passes a compute-bound prefill worker runs.
const PREFILL_STREAMS_PER_WORKER: f64 = 1.0;

/// One sample of both pools.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    pub prefill_demand: f64,
    pub prefill_workers: f64,
    pub decode_demand: f64,
    /// Summed running windows of the decodes that report one (0: none does).
    pub decode_capacity: f64,
    pub decode_workers: f64,
    /// Mean window of the decodes that report one.
    pub decode_window: f64,
}

/// The advice over a window of samples.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Advice {
    pub prefill_pressure: Option<f64>,
    pub decode_pressure: Option<f64>,
    pub prefill_demand: f64,
    pub decode_demand: f64,
    pub prefill_workers: f64,
    pub decode_workers: f64,
    pub bottleneck: Option<&'static str>,
    pub add_prefill: u64,
    pub add_decode: u64,
    pub reasoning: String,
}

impl Advice {
    /// The advice from samples over the window.
    pub fn from_samples(samples: &[Sample]) -> Advice {
        if samples.is_empty() {
            return Advice {
                reasoning: "no samples yet".into(),
                ..Advice::default()
            };
        }
        let n = samples.len() as f64;
        let mean = |f: fn(&Sample) -> f64| samples.iter().map(f).sum::<f64>() / n;
        let prefill_demand = mean(|s| s.prefill_demand);
        let prefill_workers = mean(|s| s.prefill_workers);
        let decode_demand = mean(|s| s.decode_demand);
        let decode_capacity = mean(|s| s.decode_capacity);
        let decode_workers = mean(|s| s.decode_workers);
        let decode_window = mean(|s| s.decode_window);
        let prefill_capacity = prefill_workers * PREFILL_STREAMS_PER_WORKER;
        let prefill_pressure = (prefill_capacity > 0.0).then(|| prefill_demand / prefill_capacity);
        let decode_pressure = (decode_capacity > 0.0).then(|| decode_demand / decode_capacity);
        let needed = |demand: f64, per_worker: f64, have: f64| -> u64 {
            let want = (demand / (per_worker * TARGET)).ceil();
            (want - have.round()).max(0.0) as u64
        };
        let (p, d) = (
            prefill_pressure.unwrap_or(0.0),
            decode_pressure.unwrap_or(0.0),
        );
        let bottleneck = if p.max(d) < BOTTLENECK {
            None
        } else if p >= d {
            Some("prefill")
        } else {
            Some("decode")
        };
        let add_prefill = match bottleneck {
            Some("prefill") => needed(prefill_demand, PREFILL_STREAMS_PER_WORKER, prefill_workers),
            _ => 0,
        };
        let add_decode = match bottleneck {
            Some("decode") if decode_window > 0.0 => {
                needed(decode_demand, decode_window, decode_workers)
            }
            _ => 0,
        };
        let fmt = |x: Option<f64>| x.map_or_else(|| "unknown".to_string(), |v| format!("{v:.2}"));
        let reasoning = match bottleneck {
            None => format!(
                "both pools have headroom: prefill pressure {}, decode pressure {}",
                fmt(prefill_pressure),
                fmt(decode_pressure)
            ),
            Some("prefill") => format!(
                "prefill is the bottleneck: {prefill_demand:.1} prefill legs open on average for \
                 {prefill_workers:.0} prefill workers (pressure {}; above 1 prompts queue and TTFT \
                 grows) while decode pressure is {}; about {add_prefill} more prefill worker(s) \
                 would bring it to {TARGET} at this load",
                fmt(prefill_pressure),
                fmt(decode_pressure)
            ),
            Some(_) => format!(
                "decode is the bottleneck: {decode_demand:.1} decode slots used or waited for on \
                 average out of {decode_capacity:.0} (pressure {}; above 1 dispatches wait at the \
                 admission window) while prefill pressure is {}; about {add_decode} more decode \
                 worker(s) would bring it to {TARGET} at this load",
                fmt(decode_pressure),
                fmt(prefill_pressure)
            ),
        };
        Advice {
            prefill_pressure,
            decode_pressure,
            prefill_demand,
            decode_demand,
            prefill_workers,
            decode_workers,
            bottleneck,
            add_prefill,
            add_decode,
            reasoning,
        }
    }

    pub fn to_json(&self, window: Duration) -> Value {
        json!({
            "window_seconds": window.as_secs_f64(),
            "bottleneck": self.bottleneck,
            "pressure": {"prefill": self.prefill_pressure, "decode": self.decode_pressure},
            "demand": {"prefill_legs": self.prefill_demand, "decode_slots": self.decode_demand},
            "workers": {"prefill": self.prefill_workers, "decode": self.decode_workers},
            "add": {"prefill": self.add_prefill, "decode": self.add_decode},
            "advice": self.reasoning,
        })
    }
}

/// The latest advice (published by [`CapacityAdvisor`]).
pub struct Capacity {
    latest: ArcSwap<(Duration, Advice)>,
}

impl Capacity {
    pub fn new() -> Capacity {
        Capacity {
            latest: ArcSwap::from_pointee((Duration::ZERO, Advice::default())),
        }
    }

    pub fn to_json(&self) -> Value {
        let latest = self.latest.load();
        latest.1.to_json(latest.0)
    }
}

impl Default for Capacity {
    fn default() -> Self {
        Self::new()
    }
}

fn sample(gw: &Gateway) -> Sample {
    let snap = gw.registry.snapshot();
    let mut s = Sample::default();
    for p in snap.prefills.iter().filter(|w| is_available(w)) {
        s.prefill_workers += 1.0;
        s.prefill_demand += p.in_flight() as f64;
    }
    let mut windows = 0.0;
    for d in snap.decodes.iter().filter(|w| is_available(w)) {
        s.decode_workers += 1.0;
        if let Some(w) = d.admission_window() {
            s.decode_capacity += f64::from(w.size());
            s.decode_demand += f64::from(w.in_use() + w.waiting());
            windows += 1.0;
        }
    }
    if windows > 0.0 {
        s.decode_window = s.decode_capacity / windows;
        s.decode_demand = (s.decode_demand - s.prefill_demand).max(0.0);
    }
    s
}

/// Samples the pools and publishes the advice (and its gauges).
pub struct CapacityAdvisor {
    pub gw: Arc<Gateway>,
}

#[async_trait]
impl BackgroundService for CapacityAdvisor {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut samples: VecDeque<Sample> = VecDeque::new();
        loop {
            let window = self.gw.settings().capacity_window;
            let keep = (window.as_millis() / SAMPLE_EVERY.as_millis()).max(1) as usize;
            samples.push_back(sample(&self.gw));
            while samples.len() > keep {
                samples.pop_front();
            }
            let advice = Advice::from_samples(samples.make_contiguous());
            for (role, p) in [
                ("prefill", advice.prefill_pressure),
                ("decode", advice.decode_pressure),
            ] {
                METRICS
                    .pd_capacity_pressure
                    .with_label_values(&[role])
                    .set(p.unwrap_or(-1.0));
            }
            self.gw.capacity.latest.store(Arc::new((window, advice)));
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(SAMPLE_EVERY) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(prefill_demand: f64, decode_demand: f64) -> Sample {
        Sample {
            prefill_demand,
            prefill_workers: 2.0,
            decode_demand,
            decode_capacity: 16.0,
            decode_workers: 2.0,
            decode_window: 8.0,
        }
    }

    #[test]
    fn long_prompts_short_answers_point_at_prefill() {
        let a = Advice::from_samples(&[s(5.0, 2.0), s(7.0, 2.0)]);
        assert_eq!(a.prefill_pressure, Some(3.0));
        assert_eq!(a.bottleneck, Some("prefill"));
        // 6 legs at 0.7 per worker: 9 workers, 2 there.
        assert_eq!((a.add_prefill, a.add_decode), (7, 0));
        assert!(
            a.reasoning.starts_with("prefill is the bottleneck"),
            "{}",
            a.reasoning
        );
    }

    #[test]
    fn short_prompts_long_answers_point_at_decode() {
        let a = Advice::from_samples(&[s(0.5, 20.0)]);
        assert_eq!(a.decode_pressure, Some(1.25));
        assert_eq!(a.bottleneck, Some("decode"));
        // 20 slots at 0.7 × 8 per worker: 4 workers, 2 there.
        assert_eq!((a.add_prefill, a.add_decode), (0, 2));
    }

    #[test]
    fn headroom_and_unknown_windows() {
        let a = Advice::from_samples(&[s(0.5, 4.0)]);
        assert_eq!(a.bottleneck, None);
        let mut no_window = s(0.1, 0.0);
        no_window.decode_capacity = 0.0;
        let a = Advice::from_samples(&[no_window]);
        assert_eq!(a.decode_pressure, None);
        assert!(a.reasoning.contains("unknown"), "{}", a.reasoning);
        assert_eq!(Advice::from_samples(&[]).bottleneck, None);
    }
}
