//! `random`: uniform over the available workers (spec §5).

use rand::Rng;

use super::{Candidate, Policy, RoutingInput};

pub(crate) struct Random;

impl Policy for Random {
    fn name(&self) -> &'static str {
        "random"
    }

    fn select(&self, candidates: &[Candidate<'_>], _input: &RoutingInput<'_>) -> Option<usize> {
        match candidates.len() {
            0 => None,
            1 => Some(0),
            n => Some(rand::thread_rng().gen_range(0..n)),
        }
    }
}
