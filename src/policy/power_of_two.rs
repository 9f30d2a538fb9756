//! `power_of_two`: two distinct available workers sampled uniformly; the lower least-load score
//! wins (spec §5). The score uses the built-in least-load defaults, not the `--least-load-*`
//! flags, as in SMG. A single available worker is returned directly.
//!
//! The score is least_load's, so it includes the gateway's live in-flight count on top of the
//! engine's report (see `least_load.rs`, "Why the in-flight term"): of two workers reporting the
//! same, the one holding fewer of the gateway's requests wins.
//!
//! The "fleet" facts of the score (does anyone report, nominal throughput) are taken over the two
//! sampled workers only, so selection is O(1) in the number of workers.

use rand::Rng;

use super::least_load::LeastLoadScore;
use super::{Candidate, Policy, RoutingInput};

pub(crate) struct PowerOfTwo {
    score: LeastLoadScore,
}

impl PowerOfTwo {
    pub(crate) fn new() -> PowerOfTwo {
        PowerOfTwo {
            score: LeastLoadScore::default(),
        }
    }
}

impl Policy for PowerOfTwo {
    fn name(&self) -> &'static str {
        "power_of_two"
    }

    fn select(&self, candidates: &[Candidate<'_>], _input: &RoutingInput<'_>) -> Option<usize> {
        let n = candidates.len();
        if n <= 1 {
            return (n == 1).then_some(0);
        }
        let mut rng = rand::thread_rng();
        let a = rng.gen_range(0..n);
        let mut b = rng.gen_range(0..n - 1);
        if b >= a {
            b += 1;
        }
        let (ca, cb) = (&candidates[a], &candidates[b]);
        let fleet = self.score.fleet([ca, cb]);
        let (sa, sb) = (self.score.score(ca, fleet), self.score.score(cb, fleet));
        // `a` and `b` are already in random order, so an exact tie picking `a` is uniform.
        Some(if sb < sa { b } else { a })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::EngineLoad;

    #[test]
    fn power_of_two_never_picks_the_most_loaded_of_two() {
        let p = PowerOfTwo::new();
        let cands = [
            Candidate {
                url: "a",
                in_flight: 10,
                load: None,
            },
            Candidate {
                url: "b",
                in_flight: 1,
                load: None,
            },
        ];
        for _ in 0..200 {
            assert_eq!(p.select(&cands, &RoutingInput::default()), Some(1));
        }
    }

    #[test]
    fn power_of_two_uses_engine_reports_when_present() {
        let p = PowerOfTwo::new();
        let hot = EngineLoad {
            token_usage: 0.95,
            waiting_requests: 8,
            ..Default::default()
        };
        let cold = EngineLoad::default();
        let cands = [
            Candidate {
                url: "hot",
                in_flight: 0,
                load: Some(&hot),
            },
            Candidate {
                url: "cold",
                in_flight: 7,
                load: Some(&cold),
            },
        ];
        for _ in 0..200 {
            assert_eq!(p.select(&cands, &RoutingInput::default()), Some(1));
        }
    }

    #[test]
    fn power_of_two_prefers_idle_worker_over_one_with_requests_in_flight_and_an_empty_report() {
        let p = PowerOfTwo::new();
        let empty = EngineLoad::default();
        let cands = [
            Candidate {
                url: "busy",
                in_flight: 3,
                load: Some(&empty),
            },
            Candidate {
                url: "idle",
                in_flight: 0,
                load: Some(&empty),
            },
        ];
        for _ in 0..200 {
            assert_eq!(p.select(&cands, &RoutingInput::default()), Some(1));
        }
    }

    #[test]
    fn power_of_two_spreads_over_many_workers_and_avoids_the_busiest() {
        let p = PowerOfTwo::new();
        let urls: Vec<String> = (0..8).map(|i| format!("w{i}")).collect();
        // Worker i has i requests in flight: the busiest (7) can never win a pair.
        let cands: Vec<Candidate> = urls
            .iter()
            .enumerate()
            .map(|(i, u)| Candidate {
                url: u,
                in_flight: i,
                load: None,
            })
            .collect();
        let mut seen = [0u32; 8];
        for _ in 0..8000 {
            seen[p.select(&cands, &RoutingInput::default()).unwrap()] += 1;
        }
        assert_eq!(seen[7], 0);
        assert!(seen[0] > seen[3] && seen[3] > seen[6], "{seen:?}");
    }
}
