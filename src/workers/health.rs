//! Active health checks: each worker's `GET {base}{endpoint}` (gRPC workers: the servicer's
//! `HealthCheck`, see `workers::grpc`) on its own schedule, driving the status state machine.
//! Runs as a Pingora background service (its own runtime, connection pool and gRPC channels),
//! so probes never compete with the data plane's reactor.
//!
//! Registration happens here too: the first successful probe asks the engine what it is
//! (`intake::discover` over HTTP; over gRPC the runtime detection and `GetModelInfo` /
//! `GetServerInfo`, which must succeed before the worker turns ready). A gRPC vLLM prefill that
//! recovers from `not_ready` / `failed` has its KV engine id read again before it turns ready.
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

use super::grpc::ControlChannels;
use super::intake;
use super::worker::{Status, Worker};
use crate::config::{defaults, HealthSettings, RuntimeType, WorkerType};
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
                // Re-admitted before it is published as Ready, so no request sees a ready
                // worker whose breaker still refuses it.
                if n == Status::Ready && w.status() != Status::Pending {
                    w.breaker.readmit_on_health();
                }
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

    async fn probe(
        client: &LegClient,
        control: &ControlChannels,
        w: &Worker,
        s: &HealthSettings,
    ) -> bool {
        if w.is_grpc() {
            return control.probe(w, s.timeout).await;
        }
        matches!(
            intake::worker_get(client, w, &s.endpoint, s.timeout).await,
            Some((true, _))
        )
    }

    /// Asks the engine what it is. Over HTTP whatever it answers is kept (SMG); over gRPC the
    /// facts must be read whole, so a failure (`false`) leaves the worker to be asked again.
    async fn discover(
        &self,
        client: &LegClient,
        control: &ControlChannels,
        w: &Worker,
        timeout: Duration,
    ) -> bool {
        let found = if w.is_grpc() {
            match control.discover(w, timeout).await {
                Ok(found) => found,
                Err(why) => {
                    log::warn!(
                        "worker {}: reading its facts failed ({why}); retrying",
                        w.url()
                    );
                    return false;
                }
            }
        } else {
            intake::discover(client, w, timeout).await
        };
        log::info!(
            "worker {} is {} serving {:?}",
            w.url(),
            found.runtime.as_str(),
            found.models
        );
        if w.is_grpc() && !found.runtime.has_pd_protocol() {
            log::warn!(
                "worker {} is a {} gRPC servicer, which has no PD protocol: PD requests routed to it fail with runtime_pd_not_supported",
                w.url(),
                found.runtime.as_str()
            );
        }
        w.set_discovered(found);
        // The runtime and the reported facts feed the pairing descriptor: recompute who pairs
        // with whom.
        self.gw.registry.refresh(None);
        true
    }

    /// A restarted vLLM without a pinned engine id comes back with a new one (spec: "SMG
    /// re-reads its engine id before routing to it again"): a gRPC vLLM prefill probed healthy
    /// while `not_ready` / `failed` has its id read again first. `false` when the servicer does
    /// not answer (the probe then counts as failed). Only the engine id is re-read: the other
    /// facts describe the deployment, which a restart of the same worker does not change.
    async fn reread_engine_id(control: &ControlChannels, w: &Worker, timeout: Duration) -> bool {
        let recovering = matches!(w.status(), Status::NotReady | Status::Failed);
        if !(recovering
            && w.is_grpc()
            && w.role() == WorkerType::Prefill
            && w.runtime() == RuntimeType::Vllm)
        {
            return true;
        }
        match control.engine_id(w, timeout).await {
            Ok(id) => {
                let before = w.kv_engine_id();
                w.set_engine_id(id);
                let now = w.kv_engine_id();
                if now != before {
                    log::info!(
                        "worker {} recovered with KV engine id {:?} (was {:?})",
                        w.url(),
                        now,
                        before
                    );
                }
                true
            }
            Err(why) => {
                log::warn!("worker {}: re-reading its engine id failed: {why}", w.url());
                false
            }
        }
    }
}

impl HealthChecker {
    /// `--dp-aware`: asks an SGLang worker its DP size and, above one, replaces it by one
    /// logical worker per rank (`url@rank`). A gRPC worker's DP size is the one it reported at
    /// registration (SGLang `dp_size`, vLLM `data_parallel_size`, TokenSpeed's either).
    async fn split_by_rank(&self, client: &LegClient, w: &Arc<Worker>, settings: &Settings) {
        let size = match w.spec.dp_size {
            Some(n) => Some(n),
            None if w.is_grpc() => w.dp_size(),
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
pub(crate) fn settings_for(global: &HealthSettings, w: &Worker) -> HealthSettings {
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
        if let Some(secs) = o.drain_settle_secs {
            s.drain_settle = Duration::from_secs(secs);
        }
    }
    s
}

#[async_trait]
impl BackgroundService for HealthChecker {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let client = LegClient::new(64, Some(Duration::from_secs(30)));
        // This service's own gRPC channels (its runtime; see `workers::grpc`).
        let control = ControlChannels::new();
        let mut states: HashMap<String, ProbeState> = HashMap::new();
        let tick = Duration::from_millis(200);
        loop {
            let now = Instant::now();
            let settings = self.gw.settings();
            let global = &settings.health;
            let snap = self.gw.registry.snapshot();
            states.retain(|id, _| snap.by_id(id).is_some());
            control.retain(&snap);
            // (worker, its settings, whether the probe drives its status)
            let due: Vec<(Arc<Worker>, HealthSettings, bool)> = snap
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
                        // A gRPC worker still has to be asked what it is (its runtime and
                        // facts exist nowhere else): probed for that alone, until it answers.
                        if !(w.is_grpc() && w.needs_discovery()) {
                            return None;
                        }
                    }
                    let st = states.entry(w.id.clone()).or_default();
                    st.registered_at.get_or_insert(now);
                    st.next_due
                        .is_none_or(|t| t <= now)
                        .then(|| (w.clone(), settings.clone(), settings.enabled))
                })
                .collect();
            if !due.is_empty() {
                let (client, control) = (&client, &control);
                let results = futures::future::join_all(
                    due.iter()
                        .map(|(w, s, _)| Self::probe(client, control, w, s)),
                )
                .await;
                for ((w, s, checked), mut ok) in due.iter().zip(results) {
                    // Registration asks the engine what it is before it takes traffic.
                    if ok && w.needs_discovery() {
                        ok = self.discover(client, control, w, global.timeout).await;
                    }
                    if ok {
                        ok = Self::reread_engine_id(control, w, s.timeout).await;
                    }
                    if let Some(st) = states.get_mut(&w.id) {
                        if *checked {
                            self.apply(global, w, st, ok, Instant::now());
                        } else {
                            // Discovery only: retried with the startup backoff until it answers.
                            st.consecutive_failures =
                                if ok { 0 } else { st.consecutive_failures + 1 };
                            st.next_due = Some(
                                Instant::now()
                                    + startup_retry_after(
                                        st.consecutive_failures,
                                        s.startup_check_interval,
                                    ),
                            );
                        }
                    }
                    let splits = if w.is_grpc() {
                        w.runtime().has_pd_protocol()
                    } else {
                        w.runtime() == RuntimeType::Sglang
                    };
                    if ok && settings.dp_aware && w.address.dp_rank.is_none() && splits {
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
