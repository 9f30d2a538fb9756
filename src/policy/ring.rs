//! The consistent-hash ring shared by `consistent_hashing` and `prefix_hash`.
//!
//! Each worker URL owns `virtual_nodes` points at `hash("<url>#<i>")` (SMG: 150 points,
//! blake3). A key hashes to a position and walks clockwise to the first point whose worker is in
//! the current candidate list. The ring keeps every URL it has seen until it is removed, so a
//! worker that is only temporarily unavailable gets its keys back when it returns, and a join or
//! leave moves only the keys of the points that changed hands (about 1/N of them).
//!
//! Reads take a shared lock; only a membership change takes the write lock and rebuilds the
//! point arrays (a merge, O(points)).

use std::sync::{PoisonError, RwLock};

use super::hash::hash_bytes;
use super::worker_ids::{NewcomerScan, WorkerId, WorkerIds};
use super::Candidate;

struct Points {
    /// Sorted ring positions.
    positions: Vec<u64>,
    /// The worker owning `positions[i]`.
    owners: Vec<WorkerId>,
    ids: WorkerIds,
}

pub(crate) struct HashRing {
    points: RwLock<Points>,
    virtual_nodes: usize,
    newcomers: NewcomerScan,
}

impl HashRing {
    pub(crate) fn new(virtual_nodes: usize) -> HashRing {
        HashRing {
            points: RwLock::new(Points {
                positions: Vec::new(),
                owners: Vec::new(),
                ids: WorkerIds::default(),
            }),
            virtual_nodes: virtual_nodes.max(1),
            newcomers: NewcomerScan::default(),
        }
    }

    pub(crate) fn add(&self, urls: &[&str]) {
        let mut points = self.points.write().unwrap_or_else(PoisonError::into_inner);
        let mut fresh: Vec<(u64, WorkerId)> = Vec::new();
        for url in urls {
            let (id, new) = points.ids.intern(url);
            if new {
                fresh.extend((0..self.virtual_nodes).map(|i| (point_position(url, i), id)));
            }
        }
        if fresh.is_empty() {
            return;
        }
        fresh.sort_unstable();
        let old: Vec<(u64, WorkerId)> = points
            .positions
            .iter()
            .copied()
            .zip(points.owners.iter().copied())
            .collect();
        let (positions, owners) = merge_sorted(&old, &fresh);
        points.positions = positions;
        points.owners = owners;
    }

    pub(crate) fn remove(&self, url: &str) {
        let mut points = self.points.write().unwrap_or_else(PoisonError::into_inner);
        let Some(gone) = points.ids.remove(url) else {
            return;
        };
        let Points {
            positions, owners, ..
        } = &mut *points;
        let mut keep = 0;
        for i in 0..positions.len() {
            if owners[i] != gone {
                positions[keep] = positions[i];
                owners[keep] = owners[i];
                keep += 1;
            }
        }
        positions.truncate(keep);
        owners.truncate(keep);
    }

    /// The candidate index owning `key_hash`: the first point clockwise from it whose worker is a
    /// candidate. `None` only when no ring worker is a candidate (cannot happen once the
    /// candidates have been learned, see [`NewcomerScan`]).
    pub(crate) fn lookup(&self, key_hash: u64, candidates: &[Candidate<'_>]) -> Option<usize> {
        self.learn_newcomers(candidates);
        let points = self.points.read().unwrap_or_else(PoisonError::into_inner);
        let n = points.positions.len();
        if n == 0 {
            return None;
        }
        let start = points.positions.partition_point(|&p| p < key_hash);
        // Workers already found absent during this walk; a fleet with a few unavailable workers
        // then costs one scan per absent worker, not one per point.
        let mut absent: [WorkerId; 8] = [WorkerId::MAX; 8];
        let mut absent_len = 0;
        for step in 0..n {
            let owner = points.owners[(start + step) % n];
            if absent[..absent_len].contains(&owner) {
                continue;
            }
            if let Some(idx) = points.ids.locate(owner, candidates) {
                return Some(idx);
            }
            if absent_len < absent.len() {
                absent[absent_len] = owner;
                absent_len += 1;
            }
        }
        None
    }

    fn learn_newcomers(&self, candidates: &[Candidate<'_>]) {
        let unknown = {
            let points = self.points.read().unwrap_or_else(PoisonError::into_inner);
            if !self.newcomers.may_have_unknown(&points.ids, candidates) {
                return;
            }
            self.newcomers.unknown(&points.ids, candidates)
        };
        if !unknown.is_empty() {
            self.add(&unknown);
        }
    }

    #[cfg(test)]
    pub(crate) fn point_count(&self) -> usize {
        self.points
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .positions
            .len()
    }
}

fn point_position(url: &str, i: usize) -> u64 {
    hash_bytes(format!("{url}#{i}").as_bytes())
}

fn merge_sorted(a: &[(u64, WorkerId)], b: &[(u64, WorkerId)]) -> (Vec<u64>, Vec<WorkerId>) {
    let mut positions = Vec::with_capacity(a.len() + b.len());
    let mut owners = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let take_a = j == b.len() || (i < a.len() && a[i] <= b[j]);
        let (p, o) = if take_a { a[i] } else { b[j] };
        if take_a {
            i += 1;
        } else {
            j += 1;
        }
        positions.push(p);
        owners.push(o);
    }
    (positions, owners)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::fixtures::idle;

    #[test]
    fn ring_holds_virtual_nodes_per_url_and_drops_them_on_removal() {
        let ring = HashRing::new(150);
        ring.add(&["http://a", "http://b", "http://a"]);
        assert_eq!(ring.point_count(), 300);
        ring.remove("http://a");
        assert_eq!(ring.point_count(), 150);
    }

    #[test]
    fn each_worker_owns_a_fair_share_of_the_ring() {
        let urls: Vec<String> = (0..8).map(|i| format!("http://10.0.0.{i}:8000")).collect();
        let list = idle(&urls);
        let ring = HashRing::new(150);
        let mut counts = [0u32; 8];
        for k in 0..80_000u64 {
            let h = hash_bytes(&k.to_le_bytes());
            counts[ring.lookup(h, &list).unwrap()] += 1;
        }
        for c in counts {
            assert!((7_000..13_000).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn keys_of_an_unavailable_worker_walk_to_the_next_and_return_later() {
        let urls: Vec<String> = (0..4).map(|i| format!("http://w{i}")).collect();
        let all = idle(&urls);
        let ring = HashRing::new(150);
        let before: Vec<usize> = (0..2000u64)
            .map(|k| ring.lookup(hash_bytes(&k.to_le_bytes()), &all).unwrap())
            .collect();
        let without_w1: Vec<Candidate> = all
            .iter()
            .copied()
            .filter(|c| c.url != "http://w1")
            .collect();
        for (k, &was) in before.iter().enumerate() {
            let now = ring
                .lookup(hash_bytes(&(k as u64).to_le_bytes()), &without_w1)
                .unwrap();
            if all[was].url != "http://w1" {
                assert_eq!(
                    without_w1[now].url, all[was].url,
                    "key {k} moved needlessly"
                );
            }
        }
        let back: Vec<usize> = (0..2000u64)
            .map(|k| ring.lookup(hash_bytes(&k.to_le_bytes()), &all).unwrap())
            .collect();
        assert_eq!(before, back);
    }
}
