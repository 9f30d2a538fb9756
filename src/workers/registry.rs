//! The worker registry: who is registered, in registration order, published as an immutable
//! snapshot that the hot path reads without locks (ArcSwap). Writers (startup, admin API,
//! reload) serialize on a mutex and publish a new snapshot.

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use super::pairing::{compatible, Descriptor};
use super::worker::Worker;
use crate::config::{PairingMode, WorkerType};
use crate::metrics::METRICS;

/// An immutable view of the fleet at one instant.
pub struct Snapshot {
    /// Every worker, in registration order.
    pub all: Vec<Arc<Worker>>,
    pub prefills: Vec<Arc<Worker>>,
    pub decodes: Vec<Arc<Worker>>,
    /// For each prefill (same index as `prefills`), the indices into `decodes` it may pair
    /// with under the pairing mode — worked out here, when the fleet changes.
    pub pairs: Vec<Vec<usize>>,
    pub pairing_mode: PairingMode,
}

impl Snapshot {
    fn build(all: Vec<Arc<Worker>>, mode: PairingMode) -> Snapshot {
        let of = |r: WorkerType| -> Vec<Arc<Worker>> {
            all.iter().filter(|w| w.role() == r).cloned().collect()
        };
        let prefills = of(WorkerType::Prefill);
        let decodes = of(WorkerType::Decode);
        let decode_desc: Vec<Descriptor> = decodes.iter().map(|d| Descriptor::of(d)).collect();
        let pairs = prefills
            .iter()
            .map(|p| {
                let pd = Descriptor::of(p);
                decode_desc
                    .iter()
                    .enumerate()
                    .filter(|(_, dd)| compatible(mode, &pd, dd).is_ok())
                    .map(|(i, _)| i)
                    .collect()
            })
            .collect();
        publish_pool_sizes(&all);
        Snapshot {
            prefills,
            decodes,
            pairs,
            pairing_mode: mode,
            all,
        }
    }

    pub fn by_id(&self, id: &str) -> Option<&Arc<Worker>> {
        self.all.iter().find(|w| w.id == id)
    }

    pub fn by_url(&self, url: &str) -> Option<&Arc<Worker>> {
        self.all.iter().find(|w| w.url() == url)
    }

    pub fn healthy(&self, role: WorkerType) -> usize {
        let list = match role {
            WorkerType::Prefill => &self.prefills,
            WorkerType::Decode => &self.decodes,
            _ => {
                return self
                    .all
                    .iter()
                    .filter(|w| w.role() == role && w.is_healthy())
                    .count()
            }
        };
        list.iter().filter(|w| w.is_healthy()).count()
    }
}

/// `smg_worker_pool_size`: registered workers per leg, connection mode and model (every
/// combination seen so far is rewritten, so one that emptied reads 0).
fn publish_pool_sizes(all: &[Arc<Worker>]) {
    use std::collections::BTreeMap;
    use std::sync::Mutex as StdMutex;
    type Key = (String, &'static str, String);
    static SEEN: StdMutex<BTreeMap<Key, i64>> = StdMutex::new(BTreeMap::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    for v in seen.values_mut() {
        *v = 0;
    }
    for w in all {
        let model = w
            .models()
            .first()
            .cloned()
            .unwrap_or_else(|| crate::metrics::UNKNOWN_MODEL.into());
        *seen
            .entry((
                w.role().as_str().to_string(),
                w.connection_mode().as_str(),
                model,
            ))
            .or_insert(0) += 1;
    }
    for ((role, mode, model), n) in seen.iter() {
        METRICS
            .worker_pool_size
            .with_label_values(&[role.as_str(), mode, model.as_str()])
            .set(*n);
    }
}

pub struct Registry {
    writers: Mutex<PairingMode>,
    current: ArcSwap<Snapshot>,
}

/// Why a registration was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum RegisterError {
    /// A worker with this URL exists (its id).
    Duplicate(String),
}

impl Registry {
    pub fn new(mode: PairingMode) -> Registry {
        Registry {
            writers: Mutex::new(mode),
            current: ArcSwap::from_pointee(Snapshot::build(Vec::new(), mode)),
        }
    }

    /// Recomputes pairing after a worker's facts changed (discovery) or the mode changed.
    pub fn refresh(&self, mode: Option<PairingMode>) {
        let mut current_mode = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = mode {
            *current_mode = m;
        }
        let all = self.current.load().all.clone();
        self.current
            .store(Arc::new(Snapshot::build(all, *current_mode)));
    }

    /// The current fleet. Cheap; hold it for one request, not longer.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    pub fn add(&self, worker: Arc<Worker>) -> Result<(), RegisterError> {
        let mode = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        let cur = self.current.load();
        if let Some(existing) = cur.by_url(worker.url()) {
            return Err(RegisterError::Duplicate(existing.id.clone()));
        }
        let mut all = cur.all.clone();
        all.push(worker);
        self.current.store(Arc::new(Snapshot::build(all, *mode)));
        Ok(())
    }

    /// Replaces the worker with the same id (a changed registration), keeping its position.
    pub fn replace(&self, worker: Arc<Worker>) -> bool {
        let mode = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        let cur = self.current.load();
        let Some(pos) = cur.all.iter().position(|w| w.id == worker.id) else {
            return false;
        };
        let mut all = cur.all.clone();
        all[pos] = worker;
        self.current.store(Arc::new(Snapshot::build(all, *mode)));
        true
    }

    /// Replaces one worker by several (`--dp-aware`: a URL becomes one worker per rank), in
    /// its position. False when the parent is gone or a child URL already exists.
    pub fn expand(&self, parent_id: &str, children: Vec<Arc<Worker>>) -> bool {
        let mode = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        let cur = self.current.load();
        let Some(pos) = cur.all.iter().position(|w| w.id == parent_id) else {
            return false;
        };
        if children.iter().any(|c| cur.by_url(c.url()).is_some()) {
            return false;
        }
        let mut all = cur.all.clone();
        all.splice(pos..=pos, children);
        self.current.store(Arc::new(Snapshot::build(all, *mode)));
        true
    }

    /// Removes a worker by id; returns it if it was registered. In-flight requests keep their
    /// `Arc` and finish normally.
    pub fn remove(&self, id: &str) -> Option<Arc<Worker>> {
        let mode = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        let cur = self.current.load();
        let pos = cur.all.iter().position(|w| w.id == id)?;
        let mut all = cur.all.clone();
        let removed = all.remove(pos);
        self.current.store(Arc::new(Snapshot::build(all, *mode)));
        Some(removed)
    }
}
