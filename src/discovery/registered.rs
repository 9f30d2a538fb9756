//! What a discovery source registered, and how its wanted set becomes registrations: new
//! workers admitted, gone or moved ones retired (drained), changed facts swapped in place.
//! Shared by the Kubernetes watch (keyed by pod UID) and the manifest file (by entry id).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::config::WorkerSpec;
use crate::gateway::Gateway;
use crate::workers::intake;
use crate::workers::worker::{Origin, WorkerDefaults};
use crate::workers::{Worker, WorkerAddress};

/// The workers one discovery source registered (a role's pod watch, a manifest), by the
/// source's own key (a pod UID, a manifest entry id).
#[derive(Default)]
pub struct Registered {
    workers: HashMap<String, HeldWorker>,
    /// A serving pod is not registered yet (its URL is taken): reconcile again on the tick.
    waiting: bool,
}

struct HeldWorker {
    id: String,
    spec: WorkerSpec,
    pod: String,
}

impl Registered {
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Whether a reconcile would change something the pods did not: a pod waits for its URL, or
    /// a held worker is no longer registered.
    pub fn needs_pass(&self, gw: &Gateway) -> bool {
        if self.waiting {
            return true;
        }
        let snap = gw.registry.snapshot();
        let live: HashSet<&str> = snap.all.iter().map(|w| w.id.as_str()).collect();
        self.workers.values().any(|h| !live.contains(h.id.as_str()))
    }

    /// Makes the registered workers match `wanted` (key → spec and a name for the logs):
    /// admits new ones, retires those that left or moved, updates those whose facts changed.
    pub fn reconcile(
        &mut self,
        gw: &Arc<Gateway>,
        wanted: HashMap<String, (WorkerSpec, String)>,
        role: &str,
    ) {
        // Workers removed behind the source's back are forgotten, so they register again.
        let snap = gw.registry.snapshot();
        self.workers
            .retain(|_, held| snap.by_id(&held.id).is_some());
        // Same pod and URL, new annotations: the registration changes in place, as a
        // `PUT /workers/{id}` does (no drain, health and load kept).
        let defaults = gw.settings().worker_defaults.clone();
        for (uid, held) in self.workers.iter_mut() {
            let Some((spec, pod)) = wanted.get(uid) else {
                continue;
            };
            if spec.url != held.spec.url || *spec == held.spec {
                continue;
            }
            let Some(current) = snap.by_id(&held.id).cloned() else {
                continue;
            };
            match same_worker_with(&current, spec.clone(), &defaults) {
                Ok(worker) => {
                    log::info!("discovery: {pod}: worker {} updated", spec.url);
                    gw.swap(&current, worker);
                    held.spec = spec.clone();
                }
                Err(e) => log::warn!("discovery: {pod}: {e}"),
            }
        }
        // Leaving (or moved to another IP): retire first, so a new registration may take the
        // URL later.
        let gone: Vec<String> = self
            .workers
            .iter()
            .filter(|(uid, held)| wanted.get(*uid).is_none_or(|(spec, _)| *spec != held.spec))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in gone {
            if let Some(held) = self.workers.remove(&uid) {
                if let Some(worker) = gw.registry.snapshot().by_id(&held.id).cloned() {
                    log::info!(
                        "discovery: {} left or stopped serving; draining worker {}",
                        held.pod,
                        held.spec.url
                    );
                    gw.retire(worker);
                }
            }
        }
        self.waiting = false;
        for (uid, (spec, pod)) in wanted {
            if self.workers.contains_key(&uid) {
                continue;
            }
            let snap = gw.registry.snapshot();
            if let Some(existing) = snap.by_url(&spec.url) {
                if existing.origin == Origin::Discovery
                    && existing.status() == crate::workers::Status::Draining
                {
                    // The same IP came back while its old worker drains: try again later.
                    self.waiting = true;
                } else {
                    log::warn!(
                        "discovery: {pod}: {} is already registered (as {}); not added",
                        spec.url,
                        existing.id
                    );
                }
                continue;
            }
            let worker = match intake::startup_worker(&spec, &defaults, Origin::Discovery) {
                Ok(w) => w,
                Err(e) => {
                    log::warn!("discovery: {pod}: {e}");
                    continue;
                }
            };
            let id = worker.id.clone();
            if gw.admit(worker) {
                log::info!(
                    "discovery: {pod} registered as {} worker {} ({id})",
                    role,
                    spec.url
                );
                self.workers.insert(uid, HeldWorker { id, spec, pod });
            } else {
                self.waiting = true;
            }
        }
    }
}

/// `current`'s registration with a new spec for the same URL (same id).
fn same_worker_with(
    current: &Worker,
    spec: WorkerSpec,
    defaults: &WorkerDefaults,
) -> Result<Arc<Worker>, String> {
    let address = WorkerAddress::parse(&spec.url)?;
    let addr = intake::resolve(&address)?;
    Ok(Worker::new(
        current.id.clone(),
        spec,
        address,
        addr,
        defaults,
        Origin::Discovery,
    ))
}
