//! EPD: which encode worker runs a media item's vision tower (`--encode-policy`). Each item is
//! placed on its own, so the items of one request may land on different encoders.
//!
//! `consistent_hashing` keys an item by its content hash with rendezvous (highest random
//! weight) hashing over the available encoders' URLs: a repeated image goes to the same
//! encoder (whose cache may still hold it), and an encoder joining or leaving moves only the
//! items that hash to it — with no ring to rebuild when the fleet changes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::registry::Snapshot;
use super::select::is_available;
use super::worker::Worker;
use crate::config::{EncodePolicy, WorkerType};
use crate::metrics::METRICS;

/// The encode policy's state (the round-robin cursor).
#[derive(Default)]
pub struct EncodePicker {
    next: AtomicUsize,
}

/// An item's weight on an encoder: the routing policies' fixed, seedless hash
/// (`policy::FixedHash`), so every restart and replica places an item on the same encoder.
fn weight(hash: &[u8; 32], url: &str) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = crate::policy::FixedHash.build_hasher();
    h.write(hash);
    h.write(url.as_bytes());
    h.finish()
}

impl EncodePicker {
    /// The encode worker for an item with content hash `hash`; `None` when no encode worker
    /// is available.
    pub fn pick(
        &self,
        snap: &Snapshot,
        policy: EncodePolicy,
        hash: &[u8; 32],
        model_label: &str,
    ) -> Option<Arc<Worker>> {
        let available: Vec<&Arc<Worker>> = snap
            .all
            .iter()
            .filter(|w| w.role() == WorkerType::Encode && is_available(w))
            .collect();
        if available.is_empty() {
            return None;
        }
        let chosen = match policy {
            EncodePolicy::Random => available[rand::random::<usize>() % available.len()],
            EncodePolicy::RoundRobin => {
                available[self.next.fetch_add(1, Ordering::Relaxed) % available.len()]
            }
            EncodePolicy::ConsistentHashing => available
                .iter()
                .copied()
                .max_by_key(|w| weight(hash, w.url()))?,
        };
        METRICS.worker_selection.with(
            &[
                "encode",
                chosen.connection_mode().as_str(),
                model_label,
                policy.as_str(),
            ],
            |m| m.inc(),
        );
        Some(chosen.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendezvous_weights_are_stable_and_spread() {
        let urls = ["grpc://e1:1", "grpc://e2:1", "grpc://e3:1"];
        let mut hits = [0usize; 3];
        for i in 0..300u32 {
            let mut h = [0u8; 32];
            h[..4].copy_from_slice(&i.to_le_bytes());
            let best = (0..3).max_by_key(|&k| weight(&h, urls[k])).unwrap();
            // Stable: the same item always picks the same encoder.
            assert_eq!(best, (0..3).max_by_key(|&k| weight(&h, urls[k])).unwrap());
            hits[best] += 1;
        }
        assert!(hits.iter().all(|&n| n > 50), "{hits:?}");
    }
}
