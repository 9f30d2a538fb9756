//! `prefix_hash`: a hash of the prompt's beginning on a consistent-hash ring, with bounded load
//! (spec §5).
//!
//! Key: the routing key, else the first `prefix_token_count` token ids, else the first
//! 4 × `prefix_token_count` bytes of the text. No key → the least-loaded worker.
//! The ring target is accepted when its in-flight load ≤ max(avg · factor, avg + abs) with
//! avg = (total + 1) / n; otherwise the least-loaded worker (which always passes that bound).
//!
//! Deviations: the text prefix is cut at 4N *bytes* (SMG: characters; the same for ASCII), the
//! hash is ours rather than xxh3-as-hex, and `--cache-boundaries` is not applied. SMG's
//! prefix_hash does not ask for the text (a [S] quirk); this one does, so it hashes text prompts
//! whatever the other leg's policy.

use super::hash::{hash_bytes, hash_tokens};
use super::ring::HashRing;
use super::{least_in_flight, Candidate, Policy, PolicyParams, RoutingInput};

pub(crate) struct PrefixHash {
    ring: HashRing,
    prefix_tokens: usize,
    load_factor: f64,
    abs_threshold: f64,
}

impl PrefixHash {
    pub(crate) fn new(params: &PolicyParams) -> PrefixHash {
        PrefixHash {
            ring: HashRing::new(params.virtual_nodes),
            prefix_tokens: params.prefix_token_count.max(1),
            load_factor: params.prefix_hash_load_factor,
            abs_threshold: params.prefix_hash_balance_abs_threshold as f64,
        }
    }

    fn key_hash(&self, input: &RoutingInput<'_>) -> Option<u64> {
        if let Some(key) = input.routing_key {
            return Some(hash_bytes(key.as_bytes()));
        }
        if let Some(tokens) = input.token_ids.filter(|t| !t.is_empty()) {
            return Some(hash_tokens(&tokens[..tokens.len().min(self.prefix_tokens)]));
        }
        let text = input.text.filter(|t| !t.is_empty())?.as_bytes();
        Some(hash_bytes(&text[..text.len().min(4 * self.prefix_tokens)]))
    }
}

impl Policy for PrefixHash {
    fn name(&self) -> &'static str {
        "prefix_hash"
    }

    fn select(&self, candidates: &[Candidate<'_>], input: &RoutingInput<'_>) -> Option<usize> {
        let n = candidates.len();
        if n <= 1 {
            return (n == 1).then_some(0);
        }
        let Some(hash) = self.key_hash(input) else {
            return least_in_flight(candidates);
        };
        let Some(target) = self.ring.lookup(hash, candidates) else {
            return least_in_flight(candidates);
        };
        let total: usize = candidates.iter().map(|c| c.in_flight).sum();
        if total == 0 {
            return Some(target);
        }
        let avg = (total + 1) as f64 / n as f64;
        let bound = (avg * self.load_factor).max(avg + self.abs_threshold);
        if candidates[target].in_flight as f64 <= bound {
            Some(target)
        } else {
            least_in_flight(candidates)
        }
    }

    fn on_worker_added(&self, url: &str) {
        self.ring.add(&[url]);
    }

    fn on_worker_removed(&self, url: &str) {
        self.ring.remove(url);
    }

    fn needs_text(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::fixtures::{loaded, prompt};

    #[test]
    fn prompts_sharing_the_hashed_prefix_land_on_one_worker() {
        let p = PrefixHash::new(&PolicyParams {
            prefix_token_count: 8, // 32 bytes of text
            ..Default::default()
        });
        let urls: Vec<String> = (0..8).map(|i| format!("http://w{i}")).collect();
        let list = loaded(&urls, &[0; 8]);
        let system = "You are a helpful assistant. Answer briefly.";
        let first = p.select(&list, &prompt(&format!("{system} Q1"))).unwrap();
        for q in 2..50 {
            assert_eq!(
                p.select(&list, &prompt(&format!("{system} Q{q}"))),
                Some(first)
            );
        }
        let tokens_a: Vec<u32> = (0..8).chain([100, 101]).collect();
        let tokens_b: Vec<u32> = (0..8).chain([200]).collect();
        let by_tokens = |t| RoutingInput {
            token_ids: Some(t),
            ..Default::default()
        };
        assert_eq!(
            p.select(&list, &by_tokens(&tokens_a)),
            p.select(&list, &by_tokens(&tokens_b))
        );
    }

    #[test]
    fn an_overloaded_ring_target_yields_to_the_least_loaded_worker() {
        let p = PrefixHash::new(&PolicyParams::default());
        let urls: Vec<String> = (0..4).map(|i| format!("http://w{i}")).collect();
        let idle = loaded(&urls, &[0; 4]);
        let same = prompt("the same prompt every time");
        let target = p.select(&idle, &same).unwrap();
        // Within max(avg·1.25, avg+10) the target keeps its keys.
        let mut loads = [2usize; 4];
        loads[target] = 12;
        assert_eq!(p.select(&loaded(&urls, &loads), &same), Some(target));
        // Far beyond it, the least-loaded worker takes the request.
        let mut loads = [5usize; 4];
        loads[target] = 40;
        let least = (target + 1) % 4;
        loads[least] = 1;
        assert_eq!(p.select(&loaded(&urls, &loads), &same), Some(least));
    }

    #[test]
    fn without_a_key_prefix_hash_picks_the_least_loaded() {
        let p = PrefixHash::new(&PolicyParams::default());
        let urls: Vec<String> = (0..3).map(|i| format!("http://w{i}")).collect();
        assert_eq!(
            p.select(&loaded(&urls, &[4, 2, 0]), &RoutingInput::default()),
            Some(2)
        );
    }
}
