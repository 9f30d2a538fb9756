//! `manual`: sticky routing by the `x-smg-routing-key` header (spec §5).
//!
//! Each key maps to up to two workers, most recent first; the first one still available wins. A
//! new key, or one whose workers are all gone or unavailable, is placed by `--assignment-mode`
//! (`random` by default, `min_load`, `min_group` = fewest pinned keys, `delegate` ≡ min_load) and
//! pinned by [`Policy::on_selected`], which puts the chosen worker first and keeps the previous
//! one second. Requests without a key are placed by the assignment mode and pin nothing.
//!
//! State is per instance, so the prefill and decode legs pin independently (SMG namespaces keys
//! as `prefill:<key>` / `decode:<key>` in one map; same effect). Keys idle longer than
//! `max_idle_secs` are dropped by a sweep every `eviction_interval_secs`; the map is split into
//! shards, each swept on its own (lazily from `on_selected`, or from [`Policy::maintain`]) so a
//! sweep never stalls every request at once.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError, RwLock};
use std::time::Instant;

use rand::Rng;

use super::hash::{hash_bytes, FastBuild};
use super::worker_ids::{WorkerId, WorkerIds};
use super::{
    argmin_random_ties, least_in_flight, AssignmentMode, Candidate, Policy, PolicyParams,
    RoutingInput,
};

const SHARDS: usize = 16;
const NONE: WorkerId = WorkerId::MAX;

#[derive(Clone, Copy)]
struct Pin {
    /// Most recent first; `NONE` for an empty slot.
    workers: [WorkerId; 2],
    last_used_ms: u64,
}

#[derive(Default)]
struct Shard {
    pins: HashMap<Box<str>, Pin, FastBuild>,
    last_sweep_ms: u64,
}

pub(crate) struct Manual {
    mode: AssignmentMode,
    shards: Box<[Mutex<Shard>]>,
    ids: RwLock<WorkerIds>,
    /// Keys whose first worker is this id (min_group), indexed by id.
    group_sizes: Mutex<Vec<usize>>,
    epoch: Instant,
    max_idle_ms: u64,
    sweep_every_ms: u64,
}

impl Manual {
    pub(crate) fn new(params: &PolicyParams) -> Manual {
        Manual {
            mode: params.assignment_mode,
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            ids: RwLock::default(),
            group_sizes: Mutex::default(),
            epoch: Instant::now(),
            max_idle_ms: params.max_idle_secs.saturating_mul(1000),
            sweep_every_ms: params.eviction_interval_secs.max(1).saturating_mul(1000),
        }
    }

    fn shard(&self, key: &str) -> &Mutex<Shard> {
        &self.shards[(hash_bytes(key.as_bytes()) % SHARDS as u64) as usize]
    }

    fn millis(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_millis() as u64
    }

    fn assign(&self, candidates: &[Candidate<'_>]) -> Option<usize> {
        match self.mode {
            AssignmentMode::Random => Some(rand::thread_rng().gen_range(0..candidates.len())),
            AssignmentMode::MinLoad | AssignmentMode::Delegate => least_in_flight(candidates),
            AssignmentMode::MinGroup => {
                let ids = self.ids.read().unwrap_or_else(PoisonError::into_inner);
                let groups = self
                    .group_sizes
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                argmin_random_ties(candidates.len(), |i| {
                    ids.id_of(candidates[i].url)
                        .and_then(|id| groups.get(id as usize).copied())
                        .unwrap_or(0)
                })
            }
        }
    }

    fn worker_id(&self, url: &str) -> WorkerId {
        if let Some(id) = self
            .ids
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .id_of(url)
        {
            return id;
        }
        self.ids
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .intern(url)
            .0
    }

    fn regroup(&self, from: WorkerId, to: WorkerId) {
        let mut groups = self
            .group_sizes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = groups.get_mut(from as usize) {
            *n = n.saturating_sub(1);
        }
        if to != NONE {
            if groups.len() <= to as usize {
                groups.resize(to as usize + 1, 0);
            }
            groups[to as usize] += 1;
        }
    }

    fn sweep(&self, shard: &mut Shard, now_ms: u64) {
        shard.last_sweep_ms = now_ms;
        let mut released = Vec::new();
        shard.pins.retain(|_, pin| {
            let keep = now_ms.saturating_sub(pin.last_used_ms) <= self.max_idle_ms;
            if !keep {
                released.push(pin.workers[0]);
            }
            keep
        });
        for id in released {
            self.regroup(id, NONE);
        }
    }

    fn pin_at(&self, chosen: &Candidate<'_>, key: &str, now: Instant) {
        let id = self.worker_id(chosen.url);
        let now_ms = self.millis(now);
        let mut shard = self
            .shard(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match shard.pins.get_mut(key) {
            Some(pin) => {
                let first = pin.workers[0];
                if first != id {
                    pin.workers = [id, first];
                    self.regroup(first, id);
                }
                pin.last_used_ms = now_ms;
            }
            None => {
                shard.pins.insert(
                    key.into(),
                    Pin {
                        workers: [id, NONE],
                        last_used_ms: now_ms,
                    },
                );
                self.regroup(NONE, id);
            }
        }
        if now_ms.saturating_sub(shard.last_sweep_ms) >= self.sweep_every_ms {
            self.sweep(&mut shard, now_ms);
        }
    }

    #[cfg(test)]
    fn pinned_keys(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap().pins.len())
            .sum()
    }
}

impl Policy for Manual {
    fn name(&self) -> &'static str {
        "manual"
    }

    fn select(&self, candidates: &[Candidate<'_>], input: &RoutingInput<'_>) -> Option<usize> {
        if candidates.is_empty() {
            return None;
        }
        if let Some(key) = input.routing_key {
            let pinned = self
                .shard(key)
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pins
                .get(key)
                .map(|p| p.workers);
            if let Some(workers) = pinned {
                let ids = self.ids.read().unwrap_or_else(PoisonError::into_inner);
                if let Some(i) = workers.iter().find_map(|&w| ids.locate(w, candidates)) {
                    return Some(i);
                }
            }
        }
        self.assign(candidates)
    }

    fn on_selected(&self, chosen: &Candidate<'_>, input: &RoutingInput<'_>) {
        if let Some(key) = input.routing_key {
            self.pin_at(chosen, key, Instant::now());
        }
    }

    fn on_worker_removed(&self, url: &str) {
        let removed = self
            .ids
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(url);
        if let Some(id) = removed {
            // Its pins stay in the map but never resolve again; they are re-pinned on next use.
            if let Some(n) = self
                .group_sizes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_mut(id as usize)
            {
                *n = 0;
            }
        }
    }

    fn maintain(&self, now: Instant) {
        let now_ms = self.millis(now);
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            if now_ms.saturating_sub(shard.last_sweep_ms) >= self.sweep_every_ms {
                self.sweep(&mut shard, now_ms);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::policy::fixtures::{fleet, idle};

    fn keyed(key: &str) -> RoutingInput<'_> {
        RoutingInput {
            routing_key: Some(key),
            ..Default::default()
        }
    }

    fn route<'a>(p: &Manual, list: &[Candidate<'a>], key: &str) -> &'a str {
        let input = keyed(key);
        let i = p.select(list, &input).unwrap();
        p.on_selected(&list[i], &input);
        list[i].url
    }

    #[test]
    fn the_same_key_always_reaches_the_same_worker() {
        let p = Manual::new(&PolicyParams::default());
        let urls = fleet(8);
        let list = idle(&urls);
        for k in 0..50 {
            let key = format!("session-{k}");
            let home = route(&p, &list, &key);
            assert!((0..20).all(|_| route(&p, &list, &key) == home));
        }
    }

    #[test]
    fn random_assignment_spreads_new_keys() {
        let p = Manual::new(&PolicyParams::default());
        let urls = fleet(4);
        let list = idle(&urls);
        let homes: std::collections::HashSet<&str> = (0..100)
            .map(|k| route(&p, &list, &format!("k{k}")))
            .collect();
        assert_eq!(homes.len(), 4);
    }

    #[test]
    fn a_key_is_repinned_when_its_worker_leaves_and_stays_on_the_new_one() {
        let p = Manual::new(&PolicyParams::default());
        let urls = fleet(4);
        let list = idle(&urls);
        let home = route(&p, &list, "conv-1");
        p.on_worker_removed(home);
        let rest: Vec<Candidate> = list.iter().copied().filter(|c| c.url != home).collect();
        let new_home = route(&p, &rest, "conv-1");
        assert_ne!(new_home, home);
        assert!((0..20).all(|_| route(&p, &rest, "conv-1") == new_home));
        // The old URL coming back does not take the key back.
        assert_eq!(route(&p, &list, "conv-1"), new_home);
    }

    #[test]
    fn a_key_keeps_its_previous_worker_as_second_choice() {
        let p = Manual::new(&PolicyParams::default());
        let urls = fleet(3);
        let list = idle(&urls);
        let home = route(&p, &list, "conv-2");
        let rest: Vec<Candidate> = list.iter().copied().filter(|c| c.url != home).collect();
        let stand_in = route(&p, &rest, "conv-2");
        assert_ne!(stand_in, home);
        // Most recent first: the stand-in keeps the key while both are available...
        assert_eq!(route(&p, &list, "conv-2"), stand_in);
        // ...and the original is the second choice when the stand-in goes away.
        let without_stand_in: Vec<Candidate> =
            list.iter().copied().filter(|c| c.url != stand_in).collect();
        assert_eq!(route(&p, &without_stand_in, "conv-2"), home);
    }

    #[test]
    fn prefill_and_decode_instances_pin_independently() {
        let prefill = Manual::new(&PolicyParams::default());
        let decode = Manual::new(&PolicyParams::default());
        let urls = fleet(16);
        let list = idle(&urls);
        let mut differ = 0;
        for k in 0..40 {
            let key = format!("user-{k}");
            let a = route(&prefill, &list, &key);
            let b = route(&decode, &list, &key);
            differ += usize::from(a != b);
            assert_eq!(route(&prefill, &list, &key), a);
            assert_eq!(route(&decode, &list, &key), b);
        }
        assert!(differ > 20, "legs share state? only {differ} of 40 differ");
    }

    #[test]
    fn min_group_assignment_balances_keys_across_workers() {
        let p = Manual::new(&PolicyParams {
            assignment_mode: AssignmentMode::MinGroup,
            ..Default::default()
        });
        let urls = fleet(4);
        let list = idle(&urls);
        let mut counts = HashMap::new();
        for k in 0..40 {
            *counts
                .entry(route(&p, &list, &format!("k{k}")))
                .or_insert(0) += 1;
        }
        assert!(counts.values().all(|&c| c == 10), "{counts:?}");
    }

    #[test]
    fn min_load_assignment_and_keyless_requests_use_the_least_loaded() {
        let p = Manual::new(&PolicyParams {
            assignment_mode: AssignmentMode::MinLoad,
            ..Default::default()
        });
        let urls = fleet(3);
        let mut list = idle(&urls);
        list[0].in_flight = 4;
        list[1].in_flight = 0;
        list[2].in_flight = 2;
        assert_eq!(p.select(&list, &RoutingInput::default()), Some(1));
        assert_eq!(route(&p, &list, "new"), urls[1]);
    }

    #[test]
    fn idle_keys_are_forgotten_after_max_idle() {
        let p = Manual::new(&PolicyParams {
            max_idle_secs: 60,
            eviction_interval_secs: 10,
            ..Default::default()
        });
        let urls = fleet(2);
        let list = idle(&urls);
        let t0 = Instant::now();
        for k in 0..100 {
            p.pin_at(&list[k % 2], &format!("k{k}"), t0);
        }
        assert_eq!(p.pinned_keys(), 100);
        p.maintain(t0 + Duration::from_secs(30));
        assert_eq!(p.pinned_keys(), 100);
        p.maintain(t0 + Duration::from_secs(120));
        assert_eq!(p.pinned_keys(), 0);
    }
}
