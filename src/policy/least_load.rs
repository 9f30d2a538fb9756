//! `least_load`: the worker with the least expected wait (spec §5), counting the requests the
//! gateway has in flight on each worker as well as what the engine last reported.
//!
//! ```text
//! score = queued_tokens / throughput + λ · k / (1 − k)   +   in_flight · p̄ / nominal
//!         └──────────── SMG's report score ────────────┘     └── live, the gateway's own ──┘
//! ```
//! * `queued_tokens`: the reported waiting uncached tokens, else waiting requests × p̄;
//! * `throughput`: the worker's reported generation throughput when positive, else
//!   `--least-load-default-throughput`;
//! * `k`: reported KV usage clamped to [0, 0.999]; λ = `--least-load-kv-pressure-weight`;
//! * `in_flight`: requests the gateway has in flight on the worker right now
//!   ([`Candidate::in_flight`]), each credited as p̄ = `--least-load-mean-prefill-tokens` (HTTP
//!   requests carry no token count);
//! * `nominal`: the mean positive reported throughput over the candidates, else the default —
//!   the same for every candidate of one selection.
//!
//! A worker without a report has no report score, only the in-flight term (SMG's
//! `in_flight · p̄ / nominal` for silent workers). With no reports at all the order is
//! join-shortest-queue on the in-flight count. Ties are broken uniformly at random.
//!
//! # Why the in-flight term (a departure from SMG)
//! SMG scores a reporting worker by its report plus a credit for the requests dispatched since
//! that report, and forgets the gateway's count otherwise. A report is up to a poll interval old
//! and an engine may not list what it has not started yet; the credit covers a request only until
//! the next poll. A slow engine whose report says "empty" therefore kept getting an even share of
//! the traffic while the gateway's requests piled up on it (issue 12: a third of the requests to a
//! decode answering in 900 ms next to two answering in milliseconds). The gateway's in-flight
//! count is live and exact for its own requests, so it is always part of the score, and it
//! replaces the since-the-report credit (a request dispatched since the report and still running
//! is in the in-flight count; one that has finished is no load).
//!
//! Double counting: one of the gateway's requests that the engine reports as waiting is counted
//! twice, once in `queued_tokens` and once in `in_flight` (a running one shows in the report
//! only as KV pressure, a different quantity). We keep the sum, not a subtraction such as
//! `in_flight − (waiting + running)`: the report does not say which of its requests are ours (an
//! engine may serve other gateways and clients, and its counts lag), so any subtraction lets one
//! view cancel the other — a stale or shared report would erase live requests, exactly the
//! failure being fixed — and it would reorder workers whose in-flight counts are equal. The sum
//! errs in the safe direction (our queued requests weigh double on the worker that queues them)
//! and has these properties:
//! * equal in-flight counts add the same term (`nominal` is common to the candidates), so the
//!   report score decides the order as in SMG (dividing by each worker's own throughput would
//!   not keep that);
//! * each request in flight adds p̄ / nominal seconds (≈ 0.5 s with the defaults), so a worker
//!   holding the gateway's requests loses against idle ones even when its report says empty;
//! * it is one pass over the candidates, no lock, no allocation.
//!
//! Other deviation: `--least-load-max-waiting-requests` (when > 0) skips workers reporting at
//! least that many waiting requests unless every worker does.

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
/// throughput that turns in-flight requests into seconds (common to all candidates).
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

    /// Expected wait in seconds (lower is better): the report score, if any, plus the in-flight
    /// term (module doc).
    pub(crate) fn score(&self, c: &Candidate<'_>, fleet: Fleet) -> f64 {
        let in_flight = c.in_flight as f64 * self.mean_prefill_tokens / fleet.nominal_throughput;
        match c.load {
            Some(load) => self.reported_score(load) + in_flight,
            None => in_flight,
        }
    }

    /// SMG's score of a report: queued work over throughput plus KV pressure.
    fn reported_score(&self, load: &EngineLoad) -> f64 {
        let queued = match load.waiting_uncached_tokens {
            Some(t) => t as f64,
            None => load.waiting_requests as f64 * self.mean_prefill_tokens,
        };
        let throughput = load
            .gen_throughput
            .filter(|t| t.is_finite() && *t > 0.0)
            .unwrap_or(self.default_throughput);
        let k = if load.token_usage.is_finite() {
            load.token_usage.clamp(0.0, 0.999)
        } else {
            0.0
        };
        queued / throughput + self.kv_pressure_weight * k / (1.0 - k)
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
        // 9 in flight on the idle one cost 9 × 1024 / 2000 ≈ 4.6 s: still less than busy's queue
        // (25 s) or the full KV (λ · 0.99 / 0.01 ≈ 14.9 s).
        let cands = [
            cand("busy", 0, Some(&busy)),
            cand("full", 0, Some(&full_kv)),
            cand("idle", 9, Some(&idle)),
        ];
        assert_eq!(pick(&p, &cands), 2);
    }

    #[test]
    fn least_load_prefers_idle_worker_over_one_with_requests_in_flight_and_an_empty_report() {
        let p = LeastLoad::new(&PolicyParams::default());
        // Both say "empty"; the gateway knows it has 3 requests on the first one.
        let empty = EngineLoad::default();
        let cands = [cand("busy", 3, Some(&empty)), cand("idle", 0, Some(&empty))];
        for _ in 0..100 {
            assert_eq!(pick(&p, &cands), 1);
        }
    }

    #[test]
    fn least_load_keeps_the_report_order_when_in_flight_counts_are_equal() {
        let p = LeastLoad::new(&PolicyParams::default());
        // SMG's report scores: fast 4000 / 4000 = 1.0 s, slow 900 / 1000 = 0.9 s → slow. The
        // in-flight term is the same for both (one nominal throughput), so the order holds; it
        // would flip if each worker's in-flight work were divided by its own throughput.
        let fast = EngineLoad {
            waiting_uncached_tokens: Some(4000),
            gen_throughput: Some(4000.0),
            ..Default::default()
        };
        let slow = EngineLoad {
            waiting_uncached_tokens: Some(900),
            gen_throughput: Some(1000.0),
            ..Default::default()
        };
        for n in [0, 1, 4, 50] {
            let cands = [cand("fast", n, Some(&fast)), cand("slow", n, Some(&slow))];
            assert_eq!(pick(&p, &cands), 1, "{n} in flight on each");
        }
    }

    #[test]
    fn least_load_adds_requests_in_flight_to_the_reported_queue() {
        let p = LeastLoad::new(&PolicyParams::default());
        // a: 2048 queued tokens, 2048 / 2000 ≈ 1.02 s at the default throughput; nothing in flight.
        // b: an empty queue, but 3 requests in flight: 3 × 1024 / 2000 ≈ 1.54 s.
        let a = EngineLoad {
            waiting_uncached_tokens: Some(2048),
            ..Default::default()
        };
        let b = EngineLoad::default();
        assert_eq!(
            pick(&p, &[cand("a", 0, Some(&a)), cand("b", 3, Some(&b))]),
            0
        );
        // With one in flight b is ahead again (0.51 s).
        assert_eq!(
            pick(&p, &[cand("a", 0, Some(&a)), cand("b", 1, Some(&b))]),
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
