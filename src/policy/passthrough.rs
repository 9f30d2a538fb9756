//! `passthrough`: the first available worker (spec §5; `--policy` only, never per leg).

use super::{Candidate, Policy, RoutingInput};

pub(crate) struct Passthrough;

impl Policy for Passthrough {
    fn name(&self) -> &'static str {
        "passthrough"
    }

    fn select(&self, candidates: &[Candidate<'_>], _input: &RoutingInput<'_>) -> Option<usize> {
        (!candidates.is_empty()).then_some(0)
    }
}
