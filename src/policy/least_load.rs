//! `least_load`: the worker with the least expected wait (spec §5).
//!
//! ```text
//! score = (queued_tokens + dispatched_since_report · p̄) / throughput + λ · k / (1 − k)
//! ```
//! * `queued_tokens`: the reported waiting uncached tokens, else waiting requests × p̄;
//! * `throughput`: the reported generation throughput when positive, else
//!   `--least-load-default-throughput`;
//! * `k`: reported KV usage clamped to [0, 0.999]; λ = `--least-load-kv-pressure-weight`.
//!
//! A worker without a report while others report scores `in_flight · p̄ / nominal`, where nominal
//! is the mean positive reported throughput (else the default). With no reports at all it is
//! join-shortest-queue on the gateway's in-flight count. Ties are broken uniformly at random.
//!
//! Deviations: the "dispatched since the last poll" credit comes from
//! [`EngineLoad::dispatched_since_report`] (kept by the registry, which sees the polls) instead
//! of a map inside the policy, so selection stays lock-free. `--least-load-max-waiting-requests`
//! (when > 0) skips workers reporting at least that many waiting requests unless every worker
//! does.

use super::{argmin_random_ties, Candidate, EngineLoad, Policy, PolicyParams, RoutingInput};

/// The least-load score. `power_of_two` uses [`LeastLoadScore::default`] (SMG: built-in defaults,
/// not the `--least-load-*` flags).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeastLoadScore {
    kv_pressure_weight: f64,
    default_throughput: f64,
    mean_prefill_tokens: f64,
}

impl Default for LeastLoadScore {
    fn default() -> Self {
        LeastLoadScore::from_params(&PolicyParams::default())
    }
}

/// Facts about the candidate set the score needs: whether anyone reports, and the nominal
/// throughput for workers that don't.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fleet {
    any_report: bool,
    nominal_throughput: f64,
}

impl LeastLoadScore {
    pub(crate) fn from_params(p: &PolicyParams) -> LeastLoadScore {
        let sane = |v: f64, fallback: f64| {
            if v.is_finite() && v > 0.0 {
                v
            } else {
                fallback
            }
        };
        LeastLoadScore {
            kv_pressure_weight: if p.least_load_kv_pressure_weight.is_finite()
                && p.least_load_kv_pressure_weight >= 0.0
            {
                p.least_load_kv_pressure_weight
            } else {
                0.15
            },
            default_throughput: sane(p.least_load_default_throughput, 2000.0),
            mean_prefill_tokens: sane(p.least_load_mean_prefill_tokens, 1024.0),
        }
    }

    pub(crate) fn fleet<'a, 'b: 'a>(
        &self,
        candidates: impl IntoIterator<Item = &'a Candidate<'b>>,
    ) -> Fleet {
        let (mut any_report, mut sum, mut count) = (false, 0.0, 0u32);
        for c in candidates {
            if let Some(load) = c.load {
                any_report = true;
                if let Some(t) = load.gen_throughput.filter(|t| t.is_finite() && *t > 0.0) {
                    sum += t;
                    count += 1;
                }
            }
        }
        Fleet {
            any_report,
            nominal_throughput: if count > 0 {
                sum / count as f64
            } else {
                self.default_throughput
            },
        }
    }

    /// Expected wait in seconds (lower is better); with no reports in the fleet, the in-flight
    /// count.
    pub(crate) fn score(&self, c: &Candidate<'_>, fleet: Fleet) -> f64 {
        match c.load {
            Some(load) => self.reported_score(load),
            None if fleet.any_report => {
                c.in_flight as f64 * self.mean_prefill_tokens / fleet.nominal_throughput
            }
            None => c.in_flight as f64,
        }
    }

    fn reported_score(&self, load: &EngineLoad) -> f64 {
        let queued = match load.waiting_uncached_tokens {
            Some(t) => t as f64,
            None => load.waiting_requests as f64 * self.mean_prefill_tokens,
        };
        let dispatched = load.dispatched_since_report as f64 * self.mean_prefill_tokens;
        let throughput = load
            .gen_throughput
            .filter(|t| t.is_finite() && *t > 0.0)
            .unwrap_or(self.default_throughput);
        let k = if load.token_usage.is_finite() {
            load.token_usage.clamp(0.0, 0.999)
        } else {
            0.0
        };
        (queued + dispatched) / throughput + self.kv_pressure_weight * k / (1.0 - k)
    }
}

pub(crate) struct LeastLoad {
    score: LeastLoadScore,
    max_waiting_requests: u64,
}

impl LeastLoad {
    pub(crate) fn new(params: &PolicyParams) -> LeastLoad {
        LeastLoad {
            score: LeastLoadScore::from_params(params),
            max_waiting_requests: params.least_load_max_waiting_requests,
        }
    }

    fn over_waiting_cap(&self, c: &Candidate<'_>) -> bool {
        self.max_waiting_requests > 0
            && c.load
                .is_some_and(|l| l.waiting_requests >= self.max_waiting_requests)
    }
}

impl Policy for LeastLoad {
    fn name(&self) -> &'static str {
        "least_load"
    }

    fn select(&self, candidates: &[Candidate<'_>], _input: &RoutingInput<'_>) -> Option<usize> {
        if candidates.len() <= 1 {
            return (!candidates.is_empty()).then_some(0);
        }
        let fleet = self.score.fleet(candidates.iter());
        if !fleet.any_report {
            return argmin_random_ties(candidates.len(), |i| candidates[i].in_flight);
        }
        let all_capped =
            self.max_waiting_requests > 0 && candidates.iter().all(|c| self.over_waiting_cap(c));
        argmin_random_ties(candidates.len(), |i| {
            let c = &candidates[i];
            let capped = !all_capped && self.over_waiting_cap(c);
            (capped, self.score.score(c, fleet))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand<'a>(url: &'a str, in_flight: usize, load: Option<&'a EngineLoad>) -> Candidate<'a> {
        Candidate {
            url,
            in_flight,
            load,
        }
    }

    fn pick(policy: &LeastLoad, cands: &[Candidate<'_>]) -> usize {
        policy.select(cands, &RoutingInput::default()).unwrap()
    }

    #[test]
    fn least_load_without_reports_joins_the_shortest_queue() {
        let p = LeastLoad::new(&PolicyParams::default());
        let cands = [cand("a", 5, None), cand("b", 1, None), cand("c", 3, None)];
        for _ in 0..100 {
            assert_eq!(pick(&p, &cands), 1);
        }
    }

    #[test]
    fn least_load_breaks_ties_at_random() {
        let p = LeastLoad::new(&PolicyParams::default());
        let cands = [cand("a", 2, None), cand("b", 0, None), cand("c", 0, None)];
        let mut seen = [0; 3];
        for _ in 0..1000 {
            seen[pick(&p, &cands)] += 1;
        }
        assert_eq!(seen[0], 0);
        assert!(seen[1] > 350 && seen[2] > 350, "{seen:?}");
    }

    #[test]
    fn least_load_prefers_the_worker_with_less_queued_work_and_kv_pressure() {
        let p = LeastLoad::new(&PolicyParams::default());
        let busy = EngineLoad {
            waiting_uncached_tokens: Some(50_000),
            token_usage: 0.5,
            ..Default::default()
        };
        let full_kv = EngineLoad {
            token_usage: 0.99,
            ..Default::default()
        };
        let idle = EngineLoad {
            waiting_uncached_tokens: Some(100),
            token_usage: 0.1,
            ..Default::default()
        };
        // The gateway's own in-flight count is ignored once reports exist.
        let cands = [
            cand("busy", 0, Some(&busy)),
            cand("full", 0, Some(&full_kv)),
            cand("idle", 9, Some(&idle)),
        ];
        assert_eq!(pick(&p, &cands), 2);
    }

    #[test]
    fn least_load_credits_dispatches_since_the_last_report() {
        let p = LeastLoad::new(&PolicyParams::default());
        let a = EngineLoad {
            dispatched_since_report: 4,
            ..Default::default()
        };
        let b = EngineLoad {
            dispatched_since_report: 1,
            ..Default::default()
        };
        assert_eq!(
            pick(&p, &[cand("a", 0, Some(&a)), cand("b", 0, Some(&b))]),
            1
        );
    }

    #[test]
    fn least_load_scores_a_silent_worker_by_its_in_flight_work_when_others_report() {
        let p = LeastLoad::new(&PolicyParams::default());
        // Reporter: 4096 queued tokens at 2048 tok/s = 2 s. Silent with 1 in flight: 1024/2048.
        let reporter = EngineLoad {
            waiting_uncached_tokens: Some(4096),
            gen_throughput: Some(2048.0),
            ..Default::default()
        };
        assert_eq!(
            pick(&p, &[cand("r", 0, Some(&reporter)), cand("s", 1, None)]),
            1
        );
        assert_eq!(
            pick(&p, &[cand("r", 0, Some(&reporter)), cand("s", 5, None)]),
            0
        );
    }

    #[test]
    fn least_load_skips_workers_over_the_waiting_cap_unless_all_are() {
        let params = PolicyParams {
            least_load_max_waiting_requests: 10,
            ..Default::default()
        };
        let p = LeastLoad::new(&params);
        let capped = EngineLoad {
            waiting_requests: 10,
            waiting_uncached_tokens: Some(0),
            ..Default::default()
        };
        let ok = EngineLoad {
            waiting_requests: 3,
            waiting_uncached_tokens: Some(9_000),
            ..Default::default()
        };
        assert_eq!(
            pick(&p, &[cand("c", 0, Some(&capped)), cand("o", 0, Some(&ok))]),
            1
        );
        let both = [cand("c", 0, Some(&capped)), cand("c2", 0, Some(&capped))];
        let _ = pick(&p, &both); // all capped: still picks one
    }
}
