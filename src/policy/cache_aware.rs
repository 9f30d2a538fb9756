//! `cache_aware`: send a prompt where its prefix was sent before, unless that worker is too busy
//! (spec §5).
//!
//! Per request, with load = the gateway's in-flight count:
//! 1. the average load and the min-load worker (ties random);
//! 2. a KV trigger (needs engine reports): hottest KV usage > `overload_token_usage_threshold`, or
//!    hottest − coldest > `balance_token_usage_threshold` → the min-load worker;
//! 3. match the prompt against the tree; `match_rate` = matched / prompt length.
//!    * `match_rate > cache_threshold` → the least-loaded available owner of the matched prefix
//!      (ties random), then the spill gate: if its load > avg · `balance_rel_threshold` **and**
//!      > avg + `balance_abs_threshold` → the min-load worker instead;
//!    * otherwise → the min-load worker.
//! 4. [`Policy::on_selected`] inserts the whole prompt under the chosen worker.
//!
//! The tree (see `radix_tree.rs`) is per instance, holds text prompts by byte and `/generate`
//! token prompts by token in a second tree, and is bounded by `max_tree_size` on every insert.
//! Selection walks the prompt once (O(prompt length)) and touches only the owners on that path;
//! finding an owner in the candidate list is O(1) (`worker_ids.rs`). The only per-worker work is
//! one pass over the candidates' in-flight counts for the average and the minimum.
//!
//! Deviations from SMG: the match rate counts bytes, not characters (the same for ASCII);
//! eviction is continuous and bounds the whole tree (not each worker's share every
//! `eviction_interval`); a removed worker is forgotten at once (SMG leaves it to LRU); min-load
//! ties are broken at random rather than by processed count; `overlap_decay`,
//! `selection_temperature`, `cache_index hash`, `cache_ttl_secs` and `cache_boundaries` are
//! accepted but not applied.

use std::sync::{Mutex, PoisonError};

use super::radix_tree::{RadixTree, Symbol};
use super::worker_ids::WorkerIds;
use super::{argmin_random_ties, Candidate, Policy, PolicyParams, RoutingInput};

/// One tree plus the worker ids its owners refer to.
struct Index<T: Symbol> {
    tree: RadixTree<T>,
    ids: WorkerIds,
}

impl<T: Symbol> Index<T> {
    fn new(max_size: usize) -> Index<T> {
        Index {
            tree: RadixTree::new(max_size),
            ids: WorkerIds::default(),
        }
    }

    /// The least-loaded available owner of the longest matched prefix, if the match is long
    /// enough.
    fn affine_worker(
        &self,
        key: &[T],
        candidates: &[Candidate<'_>],
        threshold: f64,
    ) -> Option<usize> {
        let m = self
            .tree
            .longest_match(key, |owner| self.ids.locate(owner, candidates).is_some());
        if (m.matched as f64) / (key.len() as f64) <= threshold {
            return None;
        }
        let owners = self.tree.owners(m.node);
        // Owners as candidate indices; usize::MAX marks an owner that is not available.
        let located = |i: usize| self.ids.locate(owners[i], candidates);
        let pick = argmin_random_ties(owners.len(), |i| match located(i) {
            Some(idx) => (false, candidates[idx].in_flight),
            None => (true, usize::MAX),
        })?;
        located(pick)
    }

    fn insert(&mut self, key: &[T], url: &str) {
        let (id, _) = self.ids.intern(url);
        self.tree.insert(key, id);
    }

    fn forget(&mut self, url: &str) {
        if let Some(id) = self.ids.remove(url) {
            self.tree.remove_owner(id);
        }
    }
}

pub(crate) struct CacheAware {
    text: Mutex<Index<u8>>,
    tokens: Mutex<Index<u32>>,
    cache_threshold: f64,
    balance_abs: f64,
    balance_rel: f64,
    token_usage_spread: f64,
    token_usage_overload: f64,
}

/// The prompt as the tree sees it.
enum Key<'a> {
    Text(&'a [u8]),
    Tokens(&'a [u32]),
}

fn prompt_key<'a>(input: &RoutingInput<'a>) -> Option<Key<'a>> {
    if let Some(text) = input.text.filter(|t| !t.is_empty()) {
        return Some(Key::Text(text.as_bytes()));
    }
    input.token_ids.filter(|t| !t.is_empty()).map(Key::Tokens)
}

impl CacheAware {
    pub(crate) fn new(params: &PolicyParams) -> CacheAware {
        CacheAware {
            text: Mutex::new(Index::new(params.max_tree_size)),
            tokens: Mutex::new(Index::new(params.max_tree_size)),
            cache_threshold: params.cache_threshold,
            balance_abs: params.balance_abs_threshold as f64,
            balance_rel: params.balance_rel_threshold,
            token_usage_spread: params.balance_token_usage_threshold,
            token_usage_overload: params.overload_token_usage_threshold,
        }
    }

    /// Total symbols held by the text and token trees (tests, diagnostics).
    #[cfg(test)]
    pub(crate) fn tree_size(&self) -> usize {
        self.text.lock().unwrap().tree.size() + self.tokens.lock().unwrap().tree.size()
    }

    #[cfg(test)]
    pub(crate) fn owned_text(&self, url: &str) -> usize {
        let index = self.text.lock().unwrap();
        index
            .ids
            .id_of(url)
            .map_or(0, |id| index.tree.owned_size(id))
    }
}

impl Policy for CacheAware {
    fn name(&self) -> &'static str {
        "cache_aware"
    }

    fn select(&self, candidates: &[Candidate<'_>], input: &RoutingInput<'_>) -> Option<usize> {
        let n = candidates.len();
        if n <= 1 {
            return (n == 1).then_some(0);
        }
        // One pass: total load and the KV usage range of reporting workers.
        let mut total = 0usize;
        let (mut hottest, mut coldest) = (f64::NEG_INFINITY, f64::INFINITY);
        for c in candidates {
            total += c.in_flight;
            if let Some(load) = c.load {
                hottest = hottest.max(load.token_usage);
                coldest = coldest.min(load.token_usage);
            }
        }
        let min_load = || argmin_random_ties(n, |i| candidates[i].in_flight);
        let kv_triggered = hottest.is_finite()
            && (hottest > self.token_usage_overload || hottest - coldest > self.token_usage_spread);
        if kv_triggered {
            return min_load();
        }
        let affine = match prompt_key(input) {
            None => None,
            Some(Key::Text(key)) => self
                .text
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .affine_worker(key, candidates, self.cache_threshold),
            Some(Key::Tokens(key)) => self
                .tokens
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .affine_worker(key, candidates, self.cache_threshold),
        };
        let Some(owner) = affine else {
            return min_load();
        };
        let avg = total as f64 / n as f64;
        let load = candidates[owner].in_flight as f64;
        if load > avg * self.balance_rel && load > avg + self.balance_abs {
            return min_load();
        }
        Some(owner)
    }

    fn on_selected(&self, chosen: &Candidate<'_>, input: &RoutingInput<'_>) {
        match prompt_key(input) {
            None => {}
            Some(Key::Text(key)) => self
                .text
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key, chosen.url),
            Some(Key::Tokens(key)) => self
                .tokens
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key, chosen.url),
        }
    }

    fn on_worker_removed(&self, url: &str) {
        self.text
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .forget(url);
        self.tokens
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .forget(url);
    }

    fn needs_text(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::fixtures::{fleet, loaded, prompt};
    use crate::policy::EngineLoad;

    /// select + on_selected, as the gateway does.
    fn route(p: &CacheAware, list: &[Candidate<'_>], text: &str) -> usize {
        let input = prompt(text);
        let i = p.select(list, &input).unwrap();
        p.on_selected(&list[i], &input);
        i
    }

    fn long_prefix(tag: &str) -> String {
        format!(
            "{tag}: {}",
            "shared system prompt and few-shot examples. ".repeat(40)
        )
    }

    #[test]
    fn requests_sharing_a_long_prefix_go_to_the_same_worker() {
        let p = CacheAware::new(&PolicyParams::default());
        let urls = fleet(8);
        let list = loaded(&urls, &[0; 8]);
        let prefix = long_prefix("A");
        let first = route(&p, &list, &format!("{prefix} question 0"));
        for q in 1..100 {
            assert_eq!(route(&p, &list, &format!("{prefix} question {q}")), first);
        }
    }

    #[test]
    fn distinct_prefixes_spread_over_idle_workers() {
        let p = CacheAware::new(&PolicyParams::default());
        let urls = fleet(4);
        let list = loaded(&urls, &[0; 4]);
        let homes: std::collections::HashSet<usize> = (0..40)
            .map(|i| route(&p, &list, &long_prefix(&format!("tenant-{i}"))))
            .collect();
        assert!(homes.len() >= 3, "{homes:?}");
    }

    #[test]
    fn a_short_match_below_the_threshold_goes_to_the_least_loaded() {
        let p = CacheAware::new(&PolicyParams::default());
        let urls = fleet(3);
        route(&p, &loaded(&urls, &[0, 5, 5]), "abcdefghij");
        // "abc" matched out of 20 bytes = 0.15 ≤ 0.3.
        assert_eq!(
            p.select(&loaded(&urls, &[3, 5, 0]), &prompt("abcXXXXXXXXXXXXXXXXX")),
            Some(2)
        );
    }

    #[test]
    fn an_owner_beyond_both_balance_thresholds_spills_to_the_least_loaded() {
        let p = CacheAware::new(&PolicyParams::default());
        let urls = fleet(4);
        let prefix = long_prefix("B");
        let home = route(&p, &loaded(&urls, &[0; 4]), &format!("{prefix} 0"));
        // avg = (100 + 10 + 10 + 0)/4 = 30: 100 > 1.5·30 and 100 > 30 + 64 → spill.
        let mut loads = [10usize; 4];
        loads[home] = 100;
        let least = (home + 2) % 4;
        loads[least] = 0;
        let spill = p.select(&loaded(&urls, &loads), &prompt(&format!("{prefix} 1")));
        assert_eq!(spill, Some(least));
        // Busy but within the absolute threshold (60 ≤ 22.5 + 64): affinity holds.
        let mut loads = [10usize; 4];
        loads[home] = 60;
        let kept = p.select(&loaded(&urls, &loads), &prompt(&format!("{prefix} 2")));
        assert_eq!(kept, Some(home));
    }

    #[test]
    fn an_unavailable_owner_is_skipped_for_the_next_holder_or_min_load() {
        let p = CacheAware::new(&PolicyParams::default());
        let urls = fleet(3);
        let all = loaded(&urls, &[0; 3]);
        let prefix = long_prefix("C");
        let home = route(&p, &all, &format!("{prefix} 0"));
        let without: Vec<Candidate> = all
            .iter()
            .copied()
            .filter(|c| c.url != urls[home])
            .collect();
        let other = p.select(&without, &prompt(&format!("{prefix} 1"))).unwrap();
        assert_ne!(without[other].url, urls[home]);
    }

    #[test]
    fn kv_pressure_reports_override_affinity_when_triggers_are_on() {
        let p = CacheAware::new(&PolicyParams {
            overload_token_usage_threshold: 0.9,
            ..Default::default()
        });
        let urls = fleet(2);
        let prefix = long_prefix("D");
        let home = route(&p, &loaded(&urls, &[0, 0]), &format!("{prefix} 0"));
        let hot = EngineLoad {
            token_usage: 0.95,
            ..Default::default()
        };
        let cool = EngineLoad::default();
        let mut list = loaded(&urls, &[0, 0]);
        list[home].load = Some(&hot);
        list[home].in_flight = 1;
        list[1 - home].load = Some(&cool);
        assert_eq!(
            p.select(&list, &prompt(&format!("{prefix} 1"))),
            Some(1 - home)
        );
    }

    #[test]
    fn a_removed_worker_is_forgotten_and_its_prompts_find_a_new_home() {
        let p = CacheAware::new(&PolicyParams::default());
        let urls = fleet(3);
        let all = loaded(&urls, &[0; 3]);
        let prefix = long_prefix("E");
        let home = route(&p, &all, &format!("{prefix} 0"));
        assert!(p.owned_text(&urls[home]) > 0);
        p.on_worker_removed(&urls[home]);
        assert_eq!(p.owned_text(&urls[home]), 0);
        assert_eq!(p.tree_size(), 0);
        let rest: Vec<Candidate> = all
            .iter()
            .copied()
            .filter(|c| c.url != urls[home])
            .collect();
        let new_home = route(&p, &rest, &format!("{prefix} 1"));
        for q in 2..20 {
            assert_eq!(route(&p, &rest, &format!("{prefix} {q}")), new_home);
        }
        // The same URL re-registering starts with no affinity.
        assert_eq!(p.owned_text(&urls[home]), 0);
    }

    #[test]
    fn the_tree_stays_within_max_tree_size() {
        let p = CacheAware::new(&PolicyParams {
            max_tree_size: 10_000,
            ..Default::default()
        });
        let urls = fleet(4);
        let list = loaded(&urls, &[0; 4]);
        for i in 0..500 {
            route(&p, &list, &format!("{i:05} {}", "y".repeat(300)));
            assert!(p.tree_size() <= 10_000);
        }
    }

    #[test]
    fn token_prompts_are_matched_by_token() {
        let p = CacheAware::new(&PolicyParams::default());
        let urls = fleet(4);
        let list = loaded(&urls, &[0; 4]);
        let prefix: Vec<u32> = (0..500).collect();
        let route_tokens = |suffix: u32| {
            let mut t = prefix.clone();
            t.push(suffix);
            let input = RoutingInput {
                token_ids: Some(&t),
                ..Default::default()
            };
            let i = p.select(&list, &input).unwrap();
            p.on_selected(&list[i], &input);
            i
        };
        let home = route_tokens(1);
        assert!((2..30).all(|s| route_tokens(s) == home));
    }
}
