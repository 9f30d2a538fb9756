//! Kubernetes service discovery (`--service-discovery`, `--discovery-provider kubernetes`): one
//! watch per role over the pods its selector matches (in `--service-discovery-namespace`, or
//! every namespace), through kube-runtime's watcher and a reflector store.
//!
//! A pod becomes a worker of its selector's role once it is Running and Ready with an IP, and is
//! retired (drained, then removed) when it is deleted, stops being ready or changes IP. After
//! every change the whole store is reconciled against the workers this watch holds, so a missed
//! event cannot leave a stale worker behind.
//!
//! Failures never stop the gateway: credentials that cannot be found and an API server that
//! cannot be reached are logged and retried with backoff (up to a minute and 30 s apart). A broken watch is resumed and, on `410 Gone`, relisted; the reflector swaps in the new
//! list only once it is complete, so healthy workers stay registered meanwhile.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use rand::Rng;

use super::pods::{pod_name, worker_spec, PodReading};
use super::registered::Registered;
use crate::config::{label_selector, GatewayConfig, WorkerSpec, WorkerType};
use crate::gateway::Gateway;

/// How often a watch checks, without an event, whether it must reconcile: a pod whose URL was
/// still held by a draining worker (it came back on the same IP), or a worker of a serving pod
/// that left the registry some other way (`DELETE /workers/{id}`): the pod is registered again,
/// since the pods are the source of truth.
const RECONCILE_TICK: Duration = Duration::from_secs(1);
/// First and last delay between attempts to build a client (no kubeconfig, no service account).
const CLIENT_RETRY_FIRST: Duration = Duration::from_secs(1);
const CLIENT_RETRY_MAX: Duration = Duration::from_secs(60);

/// Between watch attempts after a failure: client-go's reflector backoff (0.8 s doubling to
/// 30 s, ±50% jitter), back to the start once the API server answers.
const WATCH_RETRY_FIRST: Duration = Duration::from_millis(800);
const WATCH_RETRY_MAX: Duration = Duration::from_secs(30);

#[derive(Default)]
struct WatchBackoff {
    failures: u32,
}

impl WatchBackoff {
    fn next_delay(&mut self) -> Duration {
        let base = WATCH_RETRY_FIRST
            .saturating_mul(1 << self.failures.min(6))
            .min(WATCH_RETRY_MAX);
        self.failures = self.failures.saturating_add(1);
        base.mul_f64(rand::thread_rng().gen_range(0.5..1.5))
            .min(WATCH_RETRY_MAX)
    }

    fn reset(&mut self) {
        self.failures = 0;
    }
}

/// The background service: started once with the startup config's discovery settings (they are
/// restart-only).
pub struct KubernetesDiscovery {
    pub gw: Arc<Gateway>,
    pub roles: Vec<RoleWatch>,
}

/// What one role's watch looks for.
#[derive(Clone, Debug)]
pub struct RoleWatch {
    pub role: WorkerType,
    /// The API server's `labelSelector`.
    pub selector: String,
    pub namespace: Option<String>,
    pub reading: PodReading,
}

impl KubernetesDiscovery {
    /// `Err` only for settings validation already refuses (a bad selector).
    pub fn from_config(gw: Arc<Gateway>, cfg: &GatewayConfig) -> Result<Self, String> {
        let reading = PodReading::from_config(cfg);
        let mut roles = Vec::new();
        for (role, words) in [
            (WorkerType::Prefill, &cfg.prefill_selector),
            (WorkerType::Decode, &cfg.decode_selector),
            (WorkerType::Encode, &cfg.encode_selector),
        ] {
            if role == WorkerType::Encode && !cfg.epd_disaggregation {
                continue;
            }
            roles.push(RoleWatch {
                role,
                selector: label_selector(words)
                    .map_err(|e| format!("{}_selector: {e}", role.as_str()))?,
                namespace: cfg.service_discovery_namespace.clone(),
                reading: reading.clone(),
            });
        }
        Ok(KubernetesDiscovery { gw, roles })
    }
}

#[async_trait]
impl BackgroundService for KubernetesDiscovery {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let client = tokio::select! {
            client = connect(&self.gw) => client,
            _ = shutdown.changed() => return,
        };
        let watches = self
            .roles
            .iter()
            .map(|role| watch_role(self.gw.clone(), client.clone(), role.clone()));
        tokio::select! {
            _ = futures::future::join_all(watches) => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// A client from the in-cluster service account or `KUBECONFIG` (kube's `Config::infer`),
/// retried with backoff until one can be built.
async fn connect(gw: &Gateway) -> Client {
    let mut delay = CLIENT_RETRY_FIRST;
    loop {
        let built = match kube::Config::infer().await {
            Ok(config) => Client::try_from(config).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match built {
            Ok(client) => return client,
            Err(e) => {
                log::warn!(
                    "discovery: no Kubernetes client ({e}); retrying in {}s",
                    delay.as_secs()
                );
                for role in [WorkerType::Prefill, WorkerType::Decode, WorkerType::Encode] {
                    gw.discovery
                        .failed(role, format!("no Kubernetes client: {e}"));
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(CLIENT_RETRY_MAX);
            }
        }
    }
}

/// One role's watch, for the life of the service.
async fn watch_role(gw: Arc<Gateway>, client: Client, watch: RoleWatch) {
    let api: Api<Pod> = match &watch.namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let (store, writer) = reflector::store::<Pod>();
    let config = watcher::Config::default().labels(&watch.selector);
    // Not kube's `default_backoff()`: it resets on every Ok item, and the watcher yields an Ok
    // `Init` before each relist attempt, so an unreachable API server would be retried every
    // 800 ms forever. The delay here resets only when the API server really answered.
    let events = watcher(api, config).reflect(writer);
    let mut backoff = WatchBackoff::default();
    let mut events = std::pin::pin!(events);
    let mut held = Registered::default();
    let mut tick = tokio::time::interval(RECONCILE_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let role = watch.role.as_str();
    log::info!(
        "discovery: watching {role} pods matching `{}` in {}",
        watch.selector,
        watch
            .namespace
            .as_deref()
            .map_or("every namespace".to_string(), |ns| format!(
                "namespace {ns}"
            ))
    );
    let mut synced = false;
    let mut failing = false;
    loop {
        tokio::select! {
            event = events.next() => match event {
                None => return,
                Some(Ok(event)) => {
                    // `Init` only says a (re)list is about to start.
                    if !matches!(event, watcher::Event::Init) {
                        backoff.reset();
                        if failing {
                            log::info!("discovery: the {role} watch is back");
                            failing = false;
                        }
                    }
                    match event {
                        watcher::Event::InitDone => {
                            synced = true;
                            held.reconcile(&gw, wanted(&store, &watch), watch.role.as_str());
                            gw.discovery.synced(watch.role, held.len());
                        }
                        watcher::Event::Apply(_) | watcher::Event::Delete(_) if synced => {
                            held.reconcile(&gw, wanted(&store, &watch), watch.role.as_str());
                            gw.discovery.synced(watch.role, held.len());
                        }
                        // A (re)list in progress: the store swaps it in at InitDone.
                        _ => {}
                    }
                }
                Some(Err(e)) => {
                    // The watcher resumes on the next poll (relisting after 410 Gone); the
                    // workers it registered stay as they are meanwhile.
                    let why = e.to_string();
                    let delay = backoff.next_delay();
                    if !failing {
                        log::warn!(
                            "discovery: the {role} watch failed ({why}); retrying with backoff, first in {} ms",
                            delay.as_millis()
                        );
                    } else {
                        log::debug!(
                            "discovery: the {role} watch failed again ({why}); retrying in {} ms",
                            delay.as_millis()
                        );
                    }
                    failing = true;
                    gw.discovery.failed(watch.role, why);
                    tokio::time::sleep(delay).await;
                }
            },
            _ = tick.tick(), if synced => {
                if held.needs_pass(&gw) {
                    held.reconcile(&gw, wanted(&store, &watch), watch.role.as_str());
                    gw.discovery.synced(watch.role, held.len());
                }
            }
        }
    }
}

/// The serving pods of `store` as wanted registrations, by pod UID.
fn wanted(store: &Store<Pod>, watch: &RoleWatch) -> HashMap<String, (WorkerSpec, String)> {
    let mut wanted = HashMap::new();
    for pod in store.state() {
        let Some(uid) = pod.metadata.uid.clone() else {
            continue;
        };
        if let Some(spec) = worker_spec(&pod, watch.role, &watch.reading) {
            wanted.insert(uid, (spec, pod_name(&pod)));
        }
    }
    wanted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_retries_back_off_to_30s_and_start_over_once_answered() {
        let mut b = WatchBackoff::default();
        let first = b.next_delay();
        assert!(
            first >= WATCH_RETRY_FIRST / 2 && first <= WATCH_RETRY_FIRST * 3 / 2,
            "{first:?}"
        );
        let later: Vec<Duration> = (0..10).map(|_| b.next_delay()).collect();
        assert!(later.iter().all(|d| *d <= WATCH_RETRY_MAX));
        assert!(
            later[9] >= WATCH_RETRY_MAX / 2,
            "grows to the cap: {later:?}"
        );
        b.reset();
        assert!(b.next_delay() <= WATCH_RETRY_FIRST * 3 / 2);
    }
}
