//! Active health checks: each worker's `GET {base}{endpoint}` on its own schedule, driving the
//! status state machine. Runs as a Pingora background service (its own runtime and connection
//! pool), so probes never compete with the data plane's reactor.
//!
//! State machine (SMG's, with thresholds F = failure, S = success):
//! `pending → ready` on the first success (the registration probe), `pending → failed` when
//! the startup timeout passes; `ready → not_ready` after F consecutive failures;
//! `not_ready → ready` after S consecutive successes; `not_ready → failed` after 3·F.
//! A `pending` worker is re-probed with a short doubling backoff (see [`startup_retry_after`]),
//! not once per startup interval as SMG does.
//! Deviation: a `failed` worker is still probed (at the normal interval) and returns to `ready`
//! after S successes — an operator expects a restarted engine to come back without re-registering.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::intake;
use super::worker::{Status, Worker};
use crate::config::{defaults, HealthSettings, RuntimeType};
use crate::gateway::{Gateway, Settings};
use crate::legs::client::LegClient;
use crate::metrics::METRICS;

#[derive(Default)]
struct ProbeState {
    registered_at: Option<Instant>,
    next_due: Option<Instant>,
    consecutive_failures: u32,
    consecutive_successes: u32,
}

/// Probes every worker on its schedule. Reads the gateway's settings on every round, so a
/// reload's new thresholds and intervals apply at once.
pub struct HealthChecker {
    pub gw: Arc<Gateway>,
}

impl HealthChecker {
    /// Applies one probe result to a worker. Pure state-machine step, shared by tests.
    fn count_probe(w: &Worker, ok: bool) {
        METRICS
            .worker_health_checks
            .with_label_values(&[w.role().as_str(), if ok { "success" } else { "failure" }])
            .inc();
    }

    fn apply(
        &self,
        global: &HealthSettings,
        w: &Worker,
        st: &mut ProbeState,
        ok: bool,
        now: Instant,
    ) {
        let s = &settings_for(global, w);
        Self::count_probe(w, ok);
        if ok {
            st.consecutive_failures = 0;
            st.consecutive_successes += 1;
        } else {
            st.consecutive_successes = 0;
            st.consecutive_failures += 1;
        }
        let next = match (w.status(), ok) {
            (Status::Pending, true) => Some(Status::Ready),
            (Status::Pending, false) => {
                let since = st.registered_at.map_or(Duration::ZERO, |t| now - t);
                (since >= s.startup_timeout).then_some(Status::Failed)
            }
            (Status::Ready, false) if st.consecutive_failures >= s.failure_threshold => {
                Some(Status::NotReady)
            }
            (Status::NotReady, false) if st.consecutive_failures >= 3 * s.failure_threshold => {
                Some(Status::Failed)
            }
            (Status::NotReady | Status::Failed, true)
                if st.consecutive_successes >= s.success_threshold =>
            {
                Some(Status::Ready)
            }
            _ => None,
        };
        if let Some(n) = next {
            if n != w.status() {
                log::info!(
                    "worker {} ({}) {} -> {}",
                    w.url(),
                    w.role().as_str(),
                    w.status().as_str(),
                    n.as_str()
                );
                w.set_status(n);
            }
        }
        let wait = if w.status() == Status::Pending {
            startup_retry_after(st.consecutive_failures, s.startup_check_interval)
        } else {
            s.interval
        };
        st.next_due = Some(now + wait);
    }

    async fn probe(client: &LegClient, w: &Worker, s: &HealthSettings) -> bool {
        matches!(
            intake::worker_get(client, w, &s.endpoint, s.timeout).await,
            Some((true, _))
        )
    }
}

impl HealthChecker {
    /// `--dp-aware`: asks an SGLang worker its DP size and, above one, replaces it by one
    /// logical worker per rank (`url@rank`).
    async fn split_by_rank(&self, client: &LegClient, w: &Arc<Worker>, settings: &Settings) {
        let size = match w.spec.dp_size {
            Some(n) => Some(n),
            None => intake::discover_dp_size(client, w, settings.health.timeout).await,
        };
        let Some(size) = size.filter(|n| *n > 1) else {
            return;
        };
        let children = intake::expand_dp(w, size, &settings.worker_defaults);
        if self.gw.registry.expand(&w.id, children) {
            log::info!(
                "worker {} serves {size} DP ranks: registered {}@0..{}",
                w.url(),
                w.url(),
                size - 1
            );
        }
    }
}

/// When to probe a worker that has never been healthy again, after `failures` failed probes in
/// a row: 0.5 s, doubling, capped at the startup check interval. Engines take minutes to load
/// and are often started together with the gateway: a refused connection is cheap to retry, and
/// the doubling keeps a dead address from being hammered.
fn startup_retry_after(failures: u32, cap: Duration) -> Duration {
    let first = Duration::from_millis(defaults::WORKER_STARTUP_FIRST_RETRY_MS);
    let doublings = failures.saturating_sub(1).min(16);
    first.saturating_mul(1 << doublings).min(cap.max(first))
}

/// The global health settings with the worker's own `health` overrides applied.
fn settings_for(global: &HealthSettings, w: &Worker) -> HealthSettings {
    let mut s = global.clone();
    if let Some(o) = &w.spec.health {
        if let Some(t) = o.timeout_secs {
            s.timeout = Duration::from_secs(t);
        }
        if let Some(i) = o.check_interval_secs {
            s.interval = Duration::from_secs(i);
        }
        if let Some(n) = o.success_threshold {
            s.success_threshold = n;
        }
        if let Some(n) = o.failure_threshold {
            s.failure_threshold = n;
        }
        if o.disable_health_check == Some(true) {
            s.enabled = false;
        }
    }
    s
}

#[async_trait]
impl BackgroundService for HealthChecker {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let client = LegClient::new(64, Some(Duration::from_secs(30)));
        let mut states: HashMap<String, ProbeState> = HashMap::new();
        let tick = Duration::from_millis(200);
        loop {
            let now = Instant::now();
            let settings = self.gw.settings();
            let global = &settings.health;
            let snap = self.gw.registry.snapshot();
            states.retain(|id, _| snap.by_id(id).is_some());
            let due: Vec<(Arc<Worker>, HealthSettings)> = snap
                .all
                .iter()
                .filter(|w| w.status() != Status::Draining)
                .filter_map(|w| {
                    let settings = settings_for(global, w);
                    if !settings.enabled {
                        // Health checks off for this worker: it is ready as registered.
                        if w.status() == Status::Pending {
                            w.set_status(Status::Ready);
                        }
                        return None;
                    }
                    let st = states.entry(w.id.clone()).or_default();
                    st.registered_at.get_or_insert(now);
                    st.next_due
                        .is_none_or(|t| t <= now)
                        .then(|| (w.clone(), settings))
                })
                .collect();
            if !due.is_empty() {
                let client = &client;
                let results =
                    futures::future::join_all(due.iter().map(|(w, s)| Self::probe(client, w, s)))
                        .await;
                for ((w, _), ok) in due.iter().zip(results) {
                    // Registration asks the engine what it is before it takes traffic.
                    if ok && w.needs_discovery() {
                        let found = intake::discover(client, w, global.timeout).await;
                        log::info!(
                            "worker {} is {} serving {:?}",
                            w.url(),
                            found.runtime.as_str(),
                            found.models
                        );
                        w.set_discovered(found);
                        // The runtime feeds the pairing descriptor: recompute who pairs with whom.
                        self.gw.registry.refresh(None);
                    }
                    if let Some(st) = states.get_mut(&w.id) {
                        self.apply(global, w, st, ok, Instant::now());
                    }
                    if ok
                        && settings.dp_aware
                        && w.address.dp_rank.is_none()
                        && w.runtime() == RuntimeType::Sglang
                    {
                        self.split_by_rank(client, w, &settings).await;
                    }
                }
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(tick) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_never_healthy_worker_is_retried_soon_then_less_often() {
        let cap = Duration::from_secs(30);
        let waits: Vec<u64> = (1..=9)
            .map(|f| startup_retry_after(f, cap).as_millis() as u64)
            .collect();
        assert_eq!(
            waits,
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        assert_eq!(startup_retry_after(u32::MAX, cap), cap);
    }

    #[test]
    fn the_startup_retry_never_exceeds_a_short_interval_nor_goes_below_the_first_step() {
        assert_eq!(
            startup_retry_after(5, Duration::from_secs(1)),
            Duration::from_secs(1)
        );
        assert_eq!(
            startup_retry_after(3, Duration::ZERO),
            Duration::from_millis(500)
        );
    }
}
