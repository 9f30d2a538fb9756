//! `round_robin`: a per-instance counter c; pick `available[c mod len]`, then c += 1 (spec §5).
//!
//! The counter indexes the *current* available list, so a worker joining or leaving shifts the
//! rotation rather than restarting it, as in SMG.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Candidate, Policy, RoutingInput};

pub(crate) struct RoundRobin {
    next: AtomicUsize,
}

impl RoundRobin {
    pub(crate) fn new() -> RoundRobin {
        RoundRobin {
            next: AtomicUsize::new(0),
        }
    }
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round_robin"
    }

    fn select(&self, candidates: &[Candidate<'_>], _input: &RoutingInput<'_>) -> Option<usize> {
        if candidates.is_empty() {
            return None;
        }
        Some(self.next.fetch_add(1, Ordering::Relaxed) % candidates.len())
    }
}
