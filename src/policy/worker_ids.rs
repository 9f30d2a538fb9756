//! Dense worker ids for policy state, and finding an id in a candidate list in O(1).
//!
//! Stateful policies (tree owners, ring points, sticky pins, bucket ranges) store a `u32` per
//! worker instead of its URL. On the hot path they must turn an id back into an index of the
//! current candidate list without hashing every candidate: each id remembers the index where it
//! was last found (a hint), so a stable fleet resolves in one string comparison and only a
//! reshuffled or shrunken list falls back to a scan.
//!
//! Ids are never reused: a removed worker's id resolves to nothing forever, so state that still
//! mentions it (a sticky pin, a window entry) can never point at a different worker.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use super::hash::FastBuild;
use super::Candidate;

pub(crate) type WorkerId = u32;

#[derive(Default)]
pub(crate) struct WorkerIds {
    /// By id; `None` once removed.
    urls: Vec<Option<Box<str>>>,
    /// By id: the candidate index where the URL was last found.
    hints: Vec<AtomicU32>,
    by_url: HashMap<Box<str>, WorkerId, FastBuild>,
}

impl WorkerIds {
    pub(crate) fn id_of(&self, url: &str) -> Option<WorkerId> {
        self.by_url.get(url).copied()
    }

    /// The id of `url`, assigning a fresh one if it has none. Returns `(id, newly_assigned)`.
    pub(crate) fn intern(&mut self, url: &str) -> (WorkerId, bool) {
        if let Some(id) = self.by_url.get(url) {
            return (*id, false);
        }
        let id = WorkerId::try_from(self.urls.len()).expect("fewer than 2^32 worker registrations");
        self.urls.push(Some(url.into()));
        self.hints.push(AtomicU32::new(0));
        self.by_url.insert(url.into(), id);
        (id, true)
    }

    /// Forget `url`; its id (returned) never resolves again.
    pub(crate) fn remove(&mut self, url: &str) -> Option<WorkerId> {
        let id = self.by_url.remove(url)?;
        self.urls[id as usize] = None;
        Some(id)
    }

    pub(crate) fn url(&self, id: WorkerId) -> Option<&str> {
        self.urls.get(id as usize)?.as_deref()
    }

    /// The index of worker `id` in `candidates`, or `None` if it is not among them.
    #[inline]
    pub(crate) fn locate(&self, id: WorkerId, candidates: &[Candidate<'_>]) -> Option<usize> {
        let url = self.url(id)?;
        let hint_slot = &self.hints[id as usize];
        let hint = hint_slot.load(Ordering::Relaxed) as usize;
        if candidates.get(hint).is_some_and(|c| c.url == url) {
            return Some(hint);
        }
        let found = candidates.iter().position(|c| c.url == url)?;
        hint_slot.store(found as u32, Ordering::Relaxed);
        Some(found)
    }
}

/// Finds candidates a [`WorkerIds`] table has not seen, cheaply: the whole list when its length
/// changed since the last look, otherwise one candidate per call in rotation (so a worker that
/// was never announced is found within `len` calls).
#[derive(Default)]
pub(crate) struct NewcomerScan {
    seen_len: AtomicUsize,
    cursor: AtomicUsize,
}

impl NewcomerScan {
    /// Whether `candidates` may hold URLs unknown to `ids`; when true, the caller should take its
    /// write lock and call [`NewcomerScan::unknown`].
    #[inline]
    pub(crate) fn may_have_unknown(&self, ids: &WorkerIds, candidates: &[Candidate<'_>]) -> bool {
        let n = candidates.len();
        if n == 0 {
            return false;
        }
        if self.seen_len.load(Ordering::Relaxed) != n {
            return true;
        }
        let i = self.cursor.fetch_add(1, Ordering::Relaxed) % n;
        ids.id_of(candidates[i].url).is_none()
    }

    /// The candidate URLs unknown to `ids` (all of them checked), and remember the list length.
    pub(crate) fn unknown<'c>(
        &self,
        ids: &WorkerIds,
        candidates: &[Candidate<'c>],
    ) -> Vec<&'c str> {
        self.seen_len.store(candidates.len(), Ordering::Relaxed);
        candidates
            .iter()
            .filter(|c| ids.id_of(c.url).is_none())
            .map(|c| c.url)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::fixtures::idle;

    #[test]
    fn locate_follows_a_worker_when_the_list_reshuffles() {
        let mut ids = WorkerIds::default();
        let (b, _) = ids.intern("http://b");
        assert_eq!(ids.locate(b, &idle(&["http://a", "http://b"])), Some(1));
        assert_eq!(ids.locate(b, &idle(&["http://b", "http://a"])), Some(0));
        assert_eq!(ids.locate(b, &idle(&["http://a"])), None);
    }

    #[test]
    fn removed_ids_never_resolve_even_when_the_url_returns() {
        let mut ids = WorkerIds::default();
        let (old, _) = ids.intern("http://a");
        ids.remove("http://a");
        let (new, fresh) = ids.intern("http://a");
        assert!(fresh);
        assert_ne!(old, new);
        assert_eq!(ids.locate(old, &idle(&["http://a"])), None);
        assert_eq!(ids.locate(new, &idle(&["http://a"])), Some(0));
    }

    #[test]
    fn newcomer_scan_finds_an_unannounced_worker_within_one_rotation() {
        let mut ids = WorkerIds::default();
        let list = idle(&["http://a", "http://b", "http://c"]);
        let scan = NewcomerScan::default();
        assert!(scan.may_have_unknown(&ids, &list));
        for u in scan.unknown(&ids, &list) {
            ids.intern(u);
        }
        assert!((0..3).all(|_| !scan.may_have_unknown(&ids, &list)));
        // Same length, one URL swapped: found within one rotation.
        let swapped = idle(&["http://a", "http://x", "http://c"]);
        assert!((0..3).any(|_| scan.may_have_unknown(&ids, &swapped)));
    }
}
