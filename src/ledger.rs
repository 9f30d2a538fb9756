//! The handoff ledger: every rendezvous the gateway mints (an SGLang bootstrap room, a Mooncake
//! or MoRI-IO transfer id) is tracked from dispatch until both of its legs have ended, so an
//! operator can see a handoff the gateway left hanging (`GET /debug/handoffs`,
//! `pdgate_handoffs_open`) and count the ones that ended abnormally.
//!
//! A [`Handoff`] is shared (`Arc`) by everything that holds a leg of it — the request's task and
//! a background prefill drain — and the entry closes when the last holder drops it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{json, Value};

use crate::metrics::METRICS;
use crate::workers::Worker;

/// What a rendezvous is keyed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// SGLang bootstrap room.
    Room,
    /// Mooncake / MoRI-IO transfer id.
    TransferId,
    /// EPD: one media item's encode → prefill room (`prefill` holds the encode worker,
    /// `decode` the prefill that receives the embedding).
    EncodeRoom,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Room => "bootstrap_room",
            Kind::TransferId => "transfer_id",
            Kind::EncodeRoom => "encode_room",
        }
    }
}

/// A rendezvous' id: SGLang's rooms are numbers, transfer ids are text.
#[derive(Clone, Debug)]
pub enum HandoffId {
    Number(u64),
    Text(Box<str>),
}

impl From<u64> for HandoffId {
    fn from(n: u64) -> HandoffId {
        HandoffId::Number(n)
    }
}

impl From<&str> for HandoffId {
    fn from(s: &str) -> HandoffId {
        HandoffId::Text(s.into())
    }
}

impl From<&String> for HandoffId {
    fn from(s: &String) -> HandoffId {
        HandoffId::Text(s.as_str().into())
    }
}

impl std::fmt::Display for HandoffId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandoffId::Number(n) => write!(f, "{n}"),
            HandoffId::Text(s) => f.write_str(s),
        }
    }
}

/// What an open rendezvous records: kept small, it is written for every PD request (the
/// workers are shared, not copied; a room is a number).
struct Entry {
    kind: Kind,
    id: HandoffId,
    request_id: Box<str>,
    /// The worker the KV leaves (the prefill; for an encode room, the encode worker).
    from: Arc<Worker>,
    /// The worker it goes to (the decode; for an encode room, the prefill).
    to: Arc<Worker>,
    since: Instant,
}

#[derive(Default)]
pub struct Ledger {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Entry>>,
}

/// One open rendezvous. Mark it [`Handoff::failed`] when its request did not end normally; the
/// entry closes when the last clone drops.
pub struct Handoff {
    ledger: Arc<Ledger>,
    key: u64,
    failed: AtomicBool,
}

impl Handoff {
    /// The request ended abnormally (error, hang-up, timeout): counted when the entry closes.
    pub fn failed(&self) {
        self.failed.store(true, Ordering::Relaxed);
    }
}

impl Drop for Handoff {
    fn drop(&mut self) {
        let removed = self
            .ledger
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key)
            .is_some();
        if removed {
            METRICS.handoffs_open.dec();
            if self.failed.load(Ordering::Relaxed) {
                METRICS.handoffs_abnormal.inc();
            }
        }
    }
}

impl Ledger {
    pub fn new() -> Arc<Ledger> {
        Arc::new(Ledger::default())
    }

    /// Records a freshly minted rendezvous from `from` (the prefill) to `to` (the decode).
    pub fn open(
        self: &Arc<Self>,
        kind: Kind,
        id: impl Into<HandoffId>,
        request_id: &str,
        from: &Arc<Worker>,
        to: &Arc<Worker>,
    ) -> Arc<Handoff> {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let entry = Entry {
            kind,
            id: id.into(),
            request_id: request_id.into(),
            from: from.clone(),
            to: to.clone(),
            since: Instant::now(),
        };
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, entry);
        METRICS.handoffs_open.inc();
        Arc::new(Handoff {
            ledger: self.clone(),
            key,
            failed: AtomicBool::new(false),
        })
    }

    pub fn open_count(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// `GET /debug/handoffs`: the open rendezvous, oldest first, with their age.
    pub fn to_json(&self) -> Value {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let mut list: Vec<&Entry> = open.values().collect();
        list.sort_by_key(|e| e.since);
        let items: Vec<Value> = list
            .iter()
            .map(|e| {
                // An encode room runs from an encode worker to a prefill.
                let (from, to) = match e.kind {
                    Kind::EncodeRoom => ("encode", "prefill"),
                    _ => ("prefill", "decode"),
                };
                let mut v = json!({
                    "kind": e.kind.as_str(),
                    "id": e.id.to_string(),
                    "request_id": &*e.request_id,
                    "age_seconds": e.since.elapsed().as_secs_f64(),
                });
                v[from] = json!(e.from.url());
                v[to] = json!(e.to.url());
                v
            })
            .collect();
        json!({"open": items.len(), "handoffs": items})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_closes_when_the_last_holder_drops() {
        let ledger = Ledger::new();
        use crate::config::{WorkerSpec, WorkerType};
        let p = Worker::for_test(WorkerSpec::new("http://p", WorkerType::Prefill));
        let d = Worker::for_test(WorkerSpec::new("http://d", WorkerType::Decode));
        let h = ledger.open(Kind::Room, 42u64, "req-1", &p, &d);
        let drain = h.clone();
        assert_eq!(ledger.open_count(), 1);
        drop(h);
        assert_eq!(ledger.open_count(), 1, "the prefill drain still holds it");
        let listed = ledger.to_json();
        assert_eq!(listed["handoffs"][0]["id"], "42");
        assert_eq!(listed["handoffs"][0]["request_id"], "req-1");
        assert_eq!(listed["handoffs"][0]["prefill"], "http://p");
        assert_eq!(listed["handoffs"][0]["decode"], "http://d");
        drop(drain);
        assert_eq!(ledger.open_count(), 0);
    }
}
