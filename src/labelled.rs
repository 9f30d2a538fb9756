//! `labelled`: a labelled metric whose handles each worker thread remembers.
//!
//! `MetricVec::with_label_values` hashes the labels, takes the vector's read lock, looks the
//! hash up and clones the series' `Arc`, then the caller drops it: a lock word and a reference
//! count that every thread writes, for each of the ~10 labelled updates of a request.
//! [`Labelled::with`] finds the labels in the calling thread's own list and updates the series
//! through the handle kept there; only a series the thread has not used yet goes through the
//! vector. Measured on this 2-core VM (a loop of counter increments, one series): 43 ns per
//! update against 85–89 on one thread, 107 ns against 560 with two threads on the same series
//! (what is left is the series' own atomic, which both cores write).
//!
//! Only for vectors whose series are never removed or reset: a remembered handle would keep
//! counting into a series the vector no longer exports.

use std::cell::RefCell;
use std::ops::Deref;

use pingora_prometheus::prometheus::core::{MetricVec, MetricVecBuilder};
use pingora_prometheus::prometheus::{HistogramVec, IntCounterVec};
use thread_local::ThreadLocal;

/// Series remembered per thread and vector; a thread past it updates the rest through the vector
/// (the labels a client can influence are bounded elsewhere, see `metrics::model_label`).
const REMEMBERED: usize = 64;

/// A metric vector and its handles, remembered per thread. Derefs to the vector for everything
/// else (registration, reads in tests, rare updates).
pub struct Labelled<B: MetricVecBuilder> {
    vec: MetricVec<B>,
    seen: ThreadLocal<RefCell<Vec<Seen<B::M>>>>,
}

/// The two kinds the request path updates.
pub type LabelledCounters = Labelled<<IntCounterVec as Vector>::Builder>;
pub type LabelledHistogram = Labelled<<HistogramVec as Vector>::Builder>;

/// Names a vector's builder (prometheus keeps the builder types private).
pub trait Vector {
    type Builder: MetricVecBuilder;
}

impl<B: MetricVecBuilder> Vector for MetricVec<B> {
    type Builder = B;
}

struct Seen<M> {
    labels: Box<[Box<str>]>,
    handle: M,
}

impl<B: MetricVecBuilder> Labelled<B> {
    pub fn new(vec: MetricVec<B>) -> Self {
        Labelled {
            vec,
            seen: ThreadLocal::new(),
        }
    }

    /// Runs `update` on the series of `labels` (the vector's label order, as for
    /// `with_label_values`).
    pub fn with<R>(&self, labels: &[&str], update: impl FnOnce(&B::M) -> R) -> R {
        let seen = self.seen.get_or(|| RefCell::new(Vec::new()));
        // Not re-entered (an update does not record another metric), but never panic for it.
        let Ok(mut seen) = seen.try_borrow_mut() else {
            return update(&self.vec.with_label_values(labels));
        };
        if let Some(found) = seen.iter().position(|s| same(&s.labels, labels)) {
            // One step toward the front: the thread's busiest series end up looked at first.
            let i = found.saturating_sub(1);
            seen.swap(i, found);
            return update(&seen[i].handle);
        }
        let handle = self.vec.with_label_values(labels);
        let out = update(&handle);
        if seen.len() < REMEMBERED {
            seen.push(Seen {
                labels: labels.iter().map(|l| Box::from(*l)).collect(),
                handle,
            });
        }
        out
    }
}

impl<B: MetricVecBuilder> Deref for Labelled<B> {
    type Target = MetricVec<B>;

    fn deref(&self) -> &MetricVec<B> {
        &self.vec
    }
}

/// Whether a remembered series has these labels (string equality compares lengths first).
fn same(seen: &[Box<str>], labels: &[&str]) -> bool {
    seen.len() == labels.len() && seen.iter().zip(labels).all(|(a, b)| **a == **b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pingora_prometheus::prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts};

    fn counters() -> LabelledCounters {
        Labelled::new(IntCounterVec::new(Opts::new("t", "t"), &["a", "b"]).unwrap())
    }

    #[test]
    fn updates_land_in_the_vectors_series() {
        let c = counters();
        for _ in 0..3 {
            c.with(&["x", "y"], |s| s.inc());
        }
        c.with(&["x", "z"], |s| s.inc_by(5));
        assert_eq!(c.with_label_values(&["x", "y"]).get(), 3);
        assert_eq!(c.with_label_values(&["x", "z"]).get(), 5);
        c.with(&["y", "x"], |s| s.inc());
        assert_eq!(c.with_label_values(&["x", "y"]).get(), 3);
        assert_eq!(c.with_label_values(&["y", "x"]).get(), 1);
    }

    #[test]
    fn each_thread_counts_into_the_same_series() {
        let c = counters();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        c.with(&["x", "y"], |s| s.inc());
                    }
                });
            }
        });
        assert_eq!(c.with_label_values(&["x", "y"]).get(), 4000);
    }

    #[test]
    fn series_past_what_a_thread_remembers_are_still_counted() {
        let c = counters();
        let names: Vec<String> = (0..REMEMBERED * 2).map(|i| i.to_string()).collect();
        for n in &names {
            c.with(&[n, "y"], |s| s.inc());
            c.with(&[n, "y"], |s| s.inc());
        }
        assert!(names
            .iter()
            .all(|n| c.with_label_values(&[n, "y"]).get() == 2));
    }

    #[test]
    fn histograms_observe_through_it() {
        let h = Labelled::new(HistogramVec::new(HistogramOpts::new("h", "h"), &["a"]).unwrap());
        h.with(&["x"], |s| s.observe(0.5));
        h.with(&["x"], |s| s.observe(1.5));
        let s = h.with_label_values(&["x"]);
        assert_eq!(s.get_sample_count(), 2);
        assert_eq!(s.get_sample_sum(), 2.0);
    }
}
