//! `bucket` (prefill only): split prompt lengths into one contiguous range per prefill worker
//! (spec §5).
//!
//! The ranges start as an even split of 0..4096 (the last open-ended) and are rebalanced every
//! `bucket_adjust_interval_secs` (5 s) from a sliding window of the lengths routed in the last
//! interval, so each range carries about the same number of characters. When the windowed
//! per-worker character loads are imbalanced (max − min > `balance_abs_threshold` **and**
//! max > `balance_rel_threshold` · min) the request goes to the least-loaded worker instead. If
//! the range's worker is not available, a random available worker is used.
//!
//! Length = [`RoutingInput::prompt_len`] when set, else the text's characters, else the token
//! count.
//!
//! Deviations from SMG: workers are learned from the candidate lists and
//! [`Policy::on_worker_removed`] (SMG: from registration); any membership change re-splits
//! 0..4096 evenly (SMG's re-split after the first one spans 0..usize::MAX, a quirk); the imbalance
//! check looks at available workers only; the rebalance runs lazily from `select` (or
//! [`Policy::maintain`]) instead of on a thread. The rebalance rule itself follows SMG: skipped
//! while the per-bucket load is within 2× of the last rebalance's; otherwise the sorted window
//! lengths are dealt out in order, each range closing once it holds a per-bucket share.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::Rng;

use super::worker_ids::{NewcomerScan, WorkerId, WorkerIds};
use super::{Candidate, Policy, PolicyParams, RoutingInput};

/// The initial length range split evenly across workers.
const INITIAL_RANGE: usize = 4096;

struct State {
    ids: WorkerIds,
    /// Workers in bucket order (first seen first).
    members: Vec<WorkerId>,
    /// Inclusive upper length bound of each member's range; the last is `usize::MAX`.
    uppers: Vec<usize>,
    /// Characters routed to each worker within the window, indexed by id.
    load: Vec<usize>,
    window: VecDeque<(Instant, usize, WorkerId)>,
    window_total: usize,
    /// Per-bucket load at the last rebalance (0 = never / reset).
    bucket_load: usize,
    last_adjust: Instant,
}

impl State {
    fn split_evenly(&mut self) {
        let n = self.members.len();
        self.uppers.clear();
        if n == 0 {
            return;
        }
        let gap = INITIAL_RANGE / n;
        self.uppers
            .extend((1..n).map(|i| (i * gap).saturating_sub(1)));
        self.uppers.push(usize::MAX);
        self.bucket_load = 0;
    }

    fn learn(&mut self, url: &str) -> WorkerId {
        let (id, new) = self.ids.intern(url);
        if new {
            self.members.push(id);
            if self.load.len() <= id as usize {
                self.load.resize(id as usize + 1, 0);
            }
            self.split_evenly();
        }
        id
    }

    fn expire(&mut self, now: Instant, period: Duration) {
        while let Some(&(at, len, id)) = self.window.front() {
            if now.saturating_duration_since(at) <= period {
                break;
            }
            self.window.pop_front();
            self.window_total -= len;
            self.load[id as usize] = self.load[id as usize].saturating_sub(len);
        }
    }

    fn rebalance(&mut self) {
        let n = self.members.len();
        if self.window.is_empty() || n == 0 {
            return;
        }
        let target = self.window_total / n;
        let old = self.bucket_load;
        if old != 0 && target <= 2 * old && old <= 2 * target {
            return;
        }
        self.bucket_load = target;
        let mut lengths: Vec<usize> = self.window.iter().map(|&(_, len, _)| len).collect();
        lengths.sort_unstable();
        let mut rest = &lengths[..];
        let mut lower = 0usize;
        self.uppers.clear();
        for _ in 0..n - 1 {
            let mut acc = 0usize;
            let mut cut = None;
            while let Some((&len, tail)) = rest.split_first() {
                rest = tail;
                acc += len;
                if acc >= target.max(1) {
                    cut = Some(len);
                    break;
                }
            }
            let upper = match cut {
                Some(len) if len > lower => len,
                _ => lower.saturating_add(target),
            };
            self.uppers.push(upper);
            lower = upper.saturating_add(1);
        }
        self.uppers.push(usize::MAX);
    }
}

pub(crate) struct Bucket {
    state: Mutex<State>,
    newcomers: NewcomerScan,
    balance_abs: usize,
    balance_rel: f64,
    period: Duration,
}

fn prompt_length(input: &RoutingInput<'_>) -> usize {
    if input.prompt_len > 0 {
        input.prompt_len
    } else if let Some(text) = input.text {
        text.chars().count()
    } else {
        input.token_ids.map_or(0, <[u32]>::len)
    }
}

impl Bucket {
    pub(crate) fn new(params: &PolicyParams) -> Bucket {
        Bucket {
            state: Mutex::new(State {
                ids: WorkerIds::default(),
                members: Vec::new(),
                uppers: Vec::new(),
                load: Vec::new(),
                window: VecDeque::new(),
                window_total: 0,
                bucket_load: 0,
                last_adjust: Instant::now(),
            }),
            newcomers: NewcomerScan::default(),
            balance_abs: params.balance_abs_threshold,
            balance_rel: params.balance_rel_threshold,
            period: Duration::from_secs(params.bucket_adjust_interval_secs.max(1)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn select_at(&self, candidates: &[Candidate<'_>], len: usize, now: Instant) -> Option<usize> {
        if candidates.len() <= 1 {
            return (!candidates.is_empty()).then_some(0);
        }
        let mut state = self.lock();
        if self.newcomers.may_have_unknown(&state.ids, candidates) {
            for url in self.newcomers.unknown(&state.ids, candidates) {
                state.learn(url);
            }
        }
        if now.saturating_duration_since(state.last_adjust) >= self.period {
            state.rebalance();
            state.last_adjust = now;
        }
        // Imbalance over the available members.
        let (mut max, mut min, mut min_at) = (0usize, usize::MAX, None);
        for &id in &state.members {
            if let Some(idx) = state.ids.locate(id, candidates) {
                let load = state.load[id as usize];
                max = max.max(load);
                if load < min {
                    min = load;
                    min_at = Some(idx);
                }
            }
        }
        if let Some(least) = min_at {
            if max - min > self.balance_abs && max as f64 > self.balance_rel * min as f64 {
                return Some(least);
            }
        }
        let slot = state.uppers.partition_point(|&upper| upper < len);
        state
            .members
            .get(slot)
            .and_then(|&id| state.ids.locate(id, candidates))
            .or_else(|| Some(rand::thread_rng().gen_range(0..candidates.len())))
    }

    fn record_at(&self, url: &str, len: usize, now: Instant) {
        let mut state = self.lock();
        let id = state.learn(url);
        state.expire(now, self.period);
        state.window.push_back((now, len, id));
        state.window_total += len;
        state.load[id as usize] += len;
    }

    #[cfg(test)]
    fn uppers(&self) -> Vec<usize> {
        self.lock().uppers.clone()
    }
}

impl Policy for Bucket {
    fn name(&self) -> &'static str {
        "bucket"
    }

    fn select(&self, candidates: &[Candidate<'_>], input: &RoutingInput<'_>) -> Option<usize> {
        self.select_at(candidates, prompt_length(input), Instant::now())
    }

    fn on_selected(&self, chosen: &Candidate<'_>, input: &RoutingInput<'_>) {
        self.record_at(chosen.url, prompt_length(input), Instant::now());
    }

    fn on_worker_removed(&self, url: &str) {
        let mut state = self.lock();
        let Some(id) = state.ids.remove(url) else {
            return;
        };
        state.members.retain(|&m| m != id);
        state.window.retain(|&(_, _, w)| w != id);
        state.window_total = state.window.iter().map(|&(_, len, _)| len).sum();
        state.load[id as usize] = 0;
        state.split_evenly();
    }

    fn needs_text(&self) -> bool {
        true
    }

    fn maintain(&self, now: Instant) {
        let mut state = self.lock();
        if now.saturating_duration_since(state.last_adjust) >= self.period {
            state.rebalance();
            state.last_adjust = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::fixtures::{fleet, idle};
    use crate::policy::{build, PolicyLeg, PolicyName};

    fn no_imbalance() -> PolicyParams {
        PolicyParams {
            balance_abs_threshold: usize::MAX / 2,
            ..Default::default()
        }
    }

    #[test]
    fn bucket_is_refused_as_a_decode_policy() {
        let params = PolicyParams::default();
        assert!(build(PolicyName::Bucket, PolicyLeg::Decode, &params).is_err());
        assert!(build(PolicyName::Bucket, PolicyLeg::Prefill, &params).is_ok());
    }

    #[test]
    fn short_and_long_prompts_go_to_different_workers() {
        let p = Bucket::new(&no_imbalance());
        let urls = fleet(2);
        let list = idle(&urls);
        let now = Instant::now();
        // Even split of 0..4096 over two workers: [0, 2047] and [2048, ∞).
        assert_eq!(p.select_at(&list, 100, now), Some(0));
        assert_eq!(p.select_at(&list, 2047, now), Some(0));
        assert_eq!(p.select_at(&list, 2048, now), Some(1));
        assert_eq!(p.select_at(&list, 100_000, now), Some(1));
        assert_eq!(p.uppers(), vec![2047, usize::MAX]);
    }

    #[test]
    fn boundaries_follow_the_recent_length_mix() {
        let p = Bucket::new(&no_imbalance());
        let urls = fleet(3);
        let list = idle(&urls);
        let t0 = Instant::now();
        p.select_at(&list, 1, t0); // learn the fleet
        for len in [5, 10, 15, 20, 24, 26] {
            p.record_at(&urls[0], len, t0);
        }
        p.maintain(t0 + Duration::from_secs(5));
        // 100 characters over 3 buckets (33 each), dealt out in sorted order.
        assert_eq!(p.uppers(), vec![20, 26, usize::MAX]);
        let later = t0 + Duration::from_secs(6);
        assert_eq!(p.select_at(&list, 18, later), Some(0));
        assert_eq!(p.select_at(&list, 25, later), Some(1));
        assert_eq!(p.select_at(&list, 300, later), Some(2));
    }

    #[test]
    fn imbalanced_character_loads_send_work_to_the_least_loaded() {
        let p = Bucket::new(&PolicyParams {
            balance_abs_threshold: 100,
            balance_rel_threshold: 1.5,
            ..Default::default()
        });
        let urls = fleet(2);
        let list = idle(&urls);
        let now = Instant::now();
        assert_eq!(p.select_at(&list, 10, now), Some(0));
        p.record_at(&urls[0], 90, now);
        // 90 − 0 ≤ 100: the bucket still decides.
        assert_eq!(p.select_at(&list, 10, now), Some(0));
        p.record_at(&urls[0], 50, now);
        // 140 − 0 > 100 and 140 > 1.5 · 0: worker 1 takes even a short prompt.
        assert_eq!(p.select_at(&list, 10, now), Some(1));
        // The window forgets: after the interval the loads are gone and the bucket decides again
        // (the rebalance on a one-entry window gives worker 0 the range [0, 1]).
        let later = now + Duration::from_secs(6);
        p.record_at(&urls[1], 1, later);
        assert_eq!(p.select_at(&list, 1, later), Some(0));
    }

    #[test]
    fn a_removed_worker_loses_its_range() {
        let p = Bucket::new(&no_imbalance());
        let urls = fleet(3);
        let list = idle(&urls);
        let now = Instant::now();
        assert_eq!(p.select_at(&list, 3000, now), Some(2));
        p.on_worker_removed(&urls[2]);
        let rest = &list[..2];
        assert_eq!(p.uppers(), vec![2047, usize::MAX]);
        assert_eq!(p.select_at(rest, 3000, now), Some(1));
    }
}
