//! File discovery (`--discovery-provider file --discovery-file F`): the workers are the entries
//! of a JSON manifest (SMG's format, `config::parse_manifest`), which may be created after
//! startup. It is re-read as soon as it changes — its size, modification time and inode are
//! looked at every second, through symlinks, so a Kubernetes ConfigMap's `..data` swap is seen
//! too (a watch on the file itself misses it) — and in full every
//! `discovery_check_interval_secs` (30). A manifest is validated whole: an invalid one changes
//! nothing (logged, shown in `/readiness`), the next valid one is applied as a diff — new
//! entries registered, changed ones updated, missing ones drained.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::registered::Registered;
use crate::config::{
    defaults, file_version, parse_manifest, FileVersion, GatewayConfig, WorkerSpec, WorkerType,
};
use crate::gateway::Gateway;

/// How often the manifest is looked at for a change.
const LOOK_EVERY: Duration = Duration::from_secs(1);

pub struct FileDiscovery {
    gw: Arc<Gateway>,
    path: PathBuf,
    full_reread: Duration,
}

impl FileDiscovery {
    pub fn from_config(gw: Arc<Gateway>, cfg: &GatewayConfig) -> Result<Self, String> {
        let path = cfg
            .discovery_file
            .clone()
            .ok_or("discovery_provider: file needs discovery_file")?;
        let secs = cfg
            .discovery_check_interval_secs
            .unwrap_or(defaults::DISCOVERY_CHECK_INTERVAL_SECS);
        Ok(FileDiscovery {
            gw,
            path,
            full_reread: Duration::from_secs(secs.max(1)),
        })
    }
}

#[async_trait]
impl BackgroundService for FileDiscovery {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        log::info!(
            "discovery: workers from the manifest {} (re-read on change and every {} s)",
            self.path.display(),
            self.full_reread.as_secs()
        );
        // Prefill and decode entries are held apart, as the pod watches hold their roles.
        let mut registered: HashMap<WorkerType, Registered> = HashMap::new();
        let mut last: FileVersion = None;
        let mut read_at: Option<Instant> = None;
        let mut warned_missing = false;
        loop {
            let now = file_version(&self.path);
            let due = read_at.is_none_or(|t| t.elapsed() >= self.full_reread);
            let pass = registered.values().any(|r| r.needs_pass(&self.gw));
            if now != last || due || pass {
                last = now;
                read_at = Some(Instant::now());
                match self.read().await {
                    Ok(specs) => {
                        warned_missing = false;
                        registered = self.apply(registered, specs).await;
                    }
                    Err(why) => {
                        let missing = last.is_none();
                        if !missing || !warned_missing {
                            log::warn!(
                                "discovery: manifest {}: {why}; workers unchanged",
                                self.path.display()
                            );
                        }
                        warned_missing = missing;
                        for role in [WorkerType::Prefill, WorkerType::Decode] {
                            self.gw.discovery.failed(role, why.clone());
                        }
                    }
                }
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(LOOK_EVERY) => {}
            }
        }
    }
}

impl FileDiscovery {
    async fn read(&self) -> Result<Vec<WorkerSpec>, String> {
        let path = self.path.clone();
        let bytes = tokio::task::spawn_blocking(move || std::fs::read(path))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("cannot be read ({e})"))?;
        parse_manifest(&bytes).map_err(|e| format!("invalid: {e}"))
    }

    /// Registers the manifest's entries (by id, within their role), off the async threads:
    /// a registration resolves its URL's host name.
    async fn apply(
        &self,
        mut registered: HashMap<WorkerType, Registered>,
        specs: Vec<WorkerSpec>,
    ) -> HashMap<WorkerType, Registered> {
        let gw = self.gw.clone();
        let path = self.path.display().to_string();
        let joined = tokio::task::spawn_blocking(move || {
            for role in [WorkerType::Prefill, WorkerType::Decode] {
                let wanted: HashMap<String, (WorkerSpec, String)> = specs
                    .iter()
                    .filter(|s| s.worker_type == role)
                    .map(|s| (s.url.clone(), (s.clone(), format!("{path}: {}", s.url))))
                    .collect();
                let held = registered.entry(role).or_default();
                held.reconcile(&gw, wanted, role.as_str());
                gw.discovery.synced(role, held.len());
            }
            registered
        })
        .await;
        joined.unwrap_or_else(|e| {
            log::error!("discovery: applying the manifest failed: {e}");
            HashMap::new()
        })
    }
}
