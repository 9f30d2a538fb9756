//! `consistent_hashing`: stable key → worker assignment on a hash ring (spec §5).
//!
//! Key priority:
//! 1. `X-SMG-Target-Worker: <index>`: an index into the leg's available list. Out of range or not
//!    a number → `None` (no selection; the caller answers 503 and may retry).
//! 2. the routing key (`x-smg-routing-key`);
//! 3. the implicit key (`Authorization`, else `X-Forwarded-For`, else `Cookie`);
//! 4. none → uniform random.
//!
//! The ring (see `ring.rs`) holds every URL seen by this instance until it is removed. SMG keeps
//! one ring per model holding prefill and decode workers alike; here each leg's instance keeps its
//! own ring of that leg's workers. Either way the walk stops at the first URL in the candidate
//! set, so the assignment is the same function of (key, available workers of the leg) up to the
//! hash function (ours, not blake3).

use rand::Rng;

use super::hash::hash_bytes;
use super::ring::HashRing;
use super::{Candidate, Policy, PolicyParams, RoutingInput};

pub(crate) struct ConsistentHashing {
    ring: HashRing,
}

impl ConsistentHashing {
    pub(crate) fn new(params: &PolicyParams) -> ConsistentHashing {
        ConsistentHashing {
            ring: HashRing::new(params.virtual_nodes),
        }
    }
}

impl Policy for ConsistentHashing {
    fn name(&self) -> &'static str {
        "consistent_hashing"
    }

    fn select(&self, candidates: &[Candidate<'_>], input: &RoutingInput<'_>) -> Option<usize> {
        let n = candidates.len();
        if n == 0 {
            return None;
        }
        if let Some(target) = input.target_worker {
            return target.trim().parse::<usize>().ok().filter(|&i| i < n);
        }
        let random = || rand::thread_rng().gen_range(0..n);
        match input.routing_key.or(input.implicit_key) {
            Some(key) => Some(
                self.ring
                    .lookup(hash_bytes(key.as_bytes()), candidates)
                    .unwrap_or_else(random),
            ),
            None => Some(random()),
        }
    }

    fn on_worker_added(&self, url: &str) {
        self.ring.add(&[url]);
    }

    fn on_worker_removed(&self, url: &str) {
        self.ring.remove(url);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::fixtures::idle;

    fn with_key(key: &str) -> RoutingInput<'_> {
        RoutingInput {
            routing_key: Some(key),
            ..Default::default()
        }
    }

    #[test]
    fn target_worker_header_picks_by_index_and_declines_when_invalid() {
        let p = ConsistentHashing::new(&PolicyParams::default());
        let list = idle(&["http://a", "http://b"]);
        let target = |t| RoutingInput {
            target_worker: Some(t),
            routing_key: Some("k"),
            ..Default::default()
        };
        assert_eq!(p.select(&list, &target("1")), Some(1));
        assert_eq!(p.select(&list, &target("2")), None);
        assert_eq!(p.select(&list, &target("x")), None);
    }

    #[test]
    fn routing_key_wins_over_the_implicit_key() {
        let p = ConsistentHashing::new(&PolicyParams::default());
        let urls: Vec<String> = (0..16).map(|i| format!("http://w{i}")).collect();
        let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
        let list = idle(&refs);
        for i in 0..50 {
            let key = format!("user-{i}");
            let by_key = p.select(&list, &with_key(&key));
            let both = RoutingInput {
                routing_key: Some(&key),
                implicit_key: Some("Bearer other"),
                ..Default::default()
            };
            assert_eq!(p.select(&list, &both), by_key);
            let implicit = RoutingInput {
                implicit_key: Some(&key),
                ..Default::default()
            };
            assert_eq!(p.select(&list, &implicit), by_key);
        }
    }

    #[test]
    fn without_any_key_consistent_hashing_spreads_at_random() {
        let p = ConsistentHashing::new(&PolicyParams::default());
        let list = idle(&["http://a", "http://b"]);
        let picks: Vec<usize> = (0..200)
            .map(|_| p.select(&list, &RoutingInput::default()).unwrap())
            .collect();
        assert!(picks.contains(&0) && picks.contains(&1));
    }
}
