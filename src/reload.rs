//! Config reload (SIGHUP, `POST /reload`): re-read the config file, validate it completely,
//! then apply it at once — workers, policies, pairing mode, timeouts and thresholds. An invalid
//! file changes nothing, is logged with the reason, and is counted
//! (`pdgate_config_reloads_total{result}`).
//!
//! Workers: those the file lists are registered (new ones are probed first, as at startup),
//! changed ones re-registered, and config workers the file no longer lists drain and go.
//! Workers registered through the API are left alone. Requests in flight finish on the pairs
//! they started with (they hold their own references). Listener and Pingora settings cannot
//! change in place: they are reported, and need a graceful upgrade.

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::config::{self, ConfigSource, LoadedConfig, WorkerSpec};
use crate::gateway::Gateway;
use crate::metrics::METRICS;
use crate::workers::select::LegPolicies;
use crate::workers::worker::Origin;
use crate::workers::{intake, Worker};

/// What a reload did.
#[derive(Debug, Default)]
pub struct ReloadReport {
    pub added: Vec<String>,
    pub changed: Vec<String>,
    pub removed: Vec<String>,
    /// Settings that differ but need a graceful upgrade (listeners, Pingora keys).
    pub restart_required: Vec<String>,
    pub policies_rebuilt: bool,
}

impl ReloadReport {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "status": "ok",
            "workers_added": self.added,
            "workers_changed": self.changed,
            "workers_removed": self.removed,
            "policies_rebuilt": self.policies_rebuilt,
            "restart_required": self.restart_required,
        })
    }
}

/// Reads and validates the new config; `Err` is the reason (nothing was changed).
async fn read_config(gw: &Gateway) -> Result<(LoadedConfig, Vec<WorkerSpec>), String> {
    let path =
        match &gw.source {
            ConfigSource::File(p) => p.clone(),
            _ => return Err(
                "this gateway was started without a config file (pdgate launch); nothing to reload"
                    .into(),
            ),
        };
    let loaded = tokio::task::spawn_blocking(move || config::load_file(&path))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let workers = loaded.startup_workers().cloned().collect();
    Ok((loaded, workers))
}

/// The URL a worker was registered with in the file (a DP rank child answers for its parent).
fn file_url(w: &Worker) -> &str {
    &w.address.base_url
}

/// Whether a registered worker still matches its spec in the file (DP children carry rank
/// fields the file does not have, so those are ignored).
fn same_spec(w: &Worker, spec: &WorkerSpec) -> bool {
    let mut mine = w.spec.clone();
    if w.address.dp_rank.is_some() {
        mine.url = spec.url.clone();
        mine.dp_rank = spec.dp_rank;
        mine.dp_size = spec.dp_size;
    }
    mine == *spec
}

/// Applies the config file now. Serialized with other reloads.
pub async fn reload(gw: &Arc<Gateway>) -> Result<ReloadReport, String> {
    let _one_at_a_time = gw.reload_lock.lock().await;
    let result = apply(gw).await;
    let outcome = if result.is_ok() { "ok" } else { "error" };
    METRICS.config_reloads.with_label_values(&[outcome]).inc();
    match &result {
        Ok(r) => log::info!(
            "config reloaded: +{} workers, ~{} changed, -{} removed{}{}",
            r.added.len(),
            r.changed.len(),
            r.removed.len(),
            if r.policies_rebuilt {
                ", policies rebuilt"
            } else {
                ""
            },
            if r.restart_required.is_empty() {
                String::new()
            } else {
                format!(
                    "; not applied, need a graceful upgrade: {}",
                    r.restart_required.join(", ")
                )
            }
        ),
        Err(e) => log::error!("config reload rejected, nothing changed: {e}"),
    }
    result
}

async fn apply(gw: &Arc<Gateway>) -> Result<ReloadReport, String> {
    let (loaded, specs) = read_config(gw).await?;
    let old_cfg = gw.config();
    let mut report = ReloadReport {
        restart_required: config::restart_required(gw.startup_config(), &loaded),
        ..Default::default()
    };

    // Build everything that can fail before changing anything.
    let new_policies = if policy_config_changed(&old_cfg, &loaded.gateway) {
        Some(LegPolicies::from_config(&loaded.gateway)?)
    } else {
        None
    };
    let snap = gw.registry.snapshot();
    let mut fresh = Vec::new();
    for spec in &specs {
        let existing: Vec<&Arc<Worker>> = snap
            .all
            .iter()
            .filter(|w| file_url(w) == spec.url)
            .collect();
        if let Some(w) = existing.iter().find(|w| w.origin != Origin::Config) {
            let by = match w.origin {
                Origin::Discovery => "service discovery",
                _ => "the worker API",
            };
            log::warn!(
                "reload: {} is registered by {by}; the file's entry is ignored",
                spec.url
            );
            continue;
        }
        if !existing.is_empty() && existing.iter().all(|w| same_spec(w, spec)) {
            continue;
        }
        let s = spec.clone();
        let defaults = crate::workers::worker::WorkerDefaults::from_config(&loaded.gateway);
        let worker = tokio::task::spawn_blocking(move || {
            intake::startup_worker(&s, &defaults, Origin::Config)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("worker {}: {e}", spec.url))?;
        fresh.push((worker, existing.into_iter().cloned().collect::<Vec<_>>()));
    }
    let listed: HashSet<&str> = specs.iter().map(|s| s.url.as_str()).collect();
    let gone: Vec<Arc<Worker>> = snap
        .all
        .iter()
        .filter(|w| w.origin == Origin::Config && !listed.contains(file_url(w)))
        .cloned()
        .collect();

    // Apply: settings first (new workers start from them), then policies, then the fleet.
    let mode = loaded.gateway.pd_pairing_mode;
    gw.swap_config(loaded.gateway.clone());
    if let Some(p) = new_policies {
        for w in &gw.registry.snapshot().all {
            p.worker_added(w);
        }
        gw.policies.store(Arc::new(p));
        report.policies_rebuilt = true;
    }
    for (worker, replaced) in fresh {
        let url = worker.url().to_string();
        for old in &replaced {
            gw.retire(old.clone());
        }
        if gw.admit(worker) {
            if replaced.is_empty() {
                report.added.push(url);
            } else {
                report.changed.push(url);
            }
        }
    }
    for w in gone {
        report.removed.push(w.url().to_string());
        gw.retire(w);
    }
    gw.registry.refresh(Some(mode));
    Ok(report)
}

/// Whether the policy kinds or any tunable changed (a rebuild resets policy state, so only
/// then).
fn policy_config_changed(old: &config::GatewayConfig, new: &config::GatewayConfig) -> bool {
    old.effective_prefill_policy() != new.effective_prefill_policy()
        || old.effective_decode_policy() != new.effective_decode_policy()
        || format!("{:?}", LegPolicies::params_of(old))
            != format!("{:?}", LegPolicies::params_of(new))
}

/// SIGHUP → reload. (Until this service starts, SIGHUP keeps its default action.)
/// Reloads when the config file or its `workers_file` changes (`config_watch_interval_secs`):
/// their size, modification time and inode, read through symlinks, are compared every
/// interval. Polling, not inotify: a Kubernetes ConfigMap volume updates by swapping a `..data`
/// symlink, which a watch on the file itself does not see, and a stat per few seconds costs
/// nothing. A change that does not validate is logged and counted like a bad SIGHUP, and tried
/// again on the next change.
pub struct ReloadOnChange {
    pub gw: Arc<Gateway>,
}

/// The files a reload reads: the config file and its `workers_file` (resolved as the loader
/// does, against the config file's folder).
fn watched(gw: &Gateway) -> Vec<std::path::PathBuf> {
    let ConfigSource::File(path) = &gw.source else {
        return Vec::new();
    };
    let mut files = vec![path.clone()];
    if let Some(w) = &gw.config().workers_file {
        files.push(match path.parent() {
            Some(dir) if w.is_relative() => dir.join(w),
            _ => w.clone(),
        });
    }
    files
}

#[async_trait]
impl BackgroundService for ReloadOnChange {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut last: Vec<config::FileVersion> = watched(&self.gw)
            .iter()
            .map(|p| config::file_version(p))
            .collect();
        loop {
            let every = self.gw.config().config_watch_interval_secs;
            // Off (0): look again later, a reload may turn it on.
            let wait = std::time::Duration::from_secs(if every == 0 { 5 } else { every });
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            let files = watched(&self.gw);
            let now: Vec<config::FileVersion> =
                files.iter().map(|p| config::file_version(p)).collect();
            if every == 0 || now == last {
                last = now;
                continue;
            }
            log::info!("config file changed: reloading");
            let _ = reload(&self.gw).await;
            // The reload may have named another workers_file: stamp what it reads now.
            last = watched(&self.gw)
                .iter()
                .map(|p| config::file_version(p))
                .collect();
        }
    }
}

pub struct ReloadOnHangup {
    pub gw: Arc<Gateway>,
}

#[async_trait]
impl BackgroundService for ReloadOnHangup {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                log::error!("cannot listen for SIGHUP, config reload disabled: {e}");
                return;
            }
        };
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                got = hup.recv() => {
                    if got.is_none() {
                        return;
                    }
                    log::info!("SIGHUP: reloading the config");
                    let _ = reload(&self.gw).await;
                }
            }
        }
    }
}
