//! Worker discovery besides the config and `POST /workers`: a background service per provider
//! that turns what it finds into worker registrations through the same path as the worker API
//! (`Gateway::admit` / `Gateway::retire`, [`Origin::Discovery`]), so health checks, breakers,
//! metrics and the ledger apply to discovered workers as to any other.
//!
//! [`DiscoveryStatus`] is what `/readiness` shows of it.
//!
//! [`Origin::Discovery`]: crate::workers::worker::Origin::Discovery

pub mod file;
pub mod kubernetes;
mod pods;
mod registered;

use std::sync::Mutex;

use serde_json::{json, Value};

use crate::config::{DiscoveryProvider, WorkerType};

/// How discovery is doing, per role, for `/readiness` and the logs.
pub struct DiscoveryStatus {
    provider: Option<DiscoveryProvider>,
    /// EPD: encode pods are discovered too.
    encode: bool,
    roles: Mutex<[RoleStatus; 3]>,
}

#[derive(Clone, Debug, Default)]
struct RoleStatus {
    /// The first full list arrived (and every relist since).
    synced: bool,
    /// Workers this role's watch registered and still holds.
    workers: usize,
    /// The watch's latest failure, cleared by its next good event.
    error: Option<String>,
}

impl DiscoveryStatus {
    pub fn new(provider: Option<DiscoveryProvider>) -> DiscoveryStatus {
        DiscoveryStatus {
            provider,
            encode: false,
            roles: Mutex::new(Default::default()),
        }
    }

    /// Encode pods are discovered as well (EPD with Kubernetes discovery).
    pub fn with_encode(mut self, encode: bool) -> DiscoveryStatus {
        self.encode = encode;
        self
    }

    fn slot(role: WorkerType) -> usize {
        match role {
            WorkerType::Decode => 1,
            WorkerType::Encode => 2,
            _ => 0,
        }
    }

    fn update(&self, role: WorkerType, f: impl FnOnce(&mut RoleStatus)) {
        let mut roles = self.roles.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut roles[Self::slot(role)]);
    }

    pub(crate) fn synced(&self, role: WorkerType, workers: usize) {
        self.update(role, |s| {
            s.synced = true;
            s.workers = workers;
            s.error = None;
        });
    }

    pub(crate) fn failed(&self, role: WorkerType, error: String) {
        self.update(role, |s| s.error = Some(error));
    }

    /// `None` without discovery; else the provider and, per role, whether its pods were listed,
    /// how many workers it holds and its latest error.
    pub fn to_json(&self) -> Option<Value> {
        let provider = self.provider?;
        let roles = self.roles.lock().unwrap_or_else(|e| e.into_inner());
        let role =
            |s: &RoleStatus| json!({"synced": s.synced, "workers": s.workers, "error": s.error});
        let used = if self.encode { 3 } else { 2 };
        let mut body = json!({
            "provider": provider.as_str(),
            "synced": roles[..used].iter().all(|s| s.synced),
            "prefill": role(&roles[0]),
            "decode": role(&roles[1]),
        });
        if self.encode {
            body["encode"] = role(&roles[2]);
        }
        Some(body)
    }
}
