//! The shared state of a running gateway: settings derived once from the validated config, the
//! worker registry, the per-leg policies and the data plane's leg client.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};

use crate::config::{
    ConfigSource, GatewayConfig, HealthSettings, LoadedConfig, OverloadSettings, RetrySettings,
};
use crate::ledger::Ledger;
use crate::legs::client::LegClient;
use crate::limiter::{Limiter, Limits};
use crate::workers::select::LegPolicies;
use crate::workers::worker::WorkerDefaults;
use crate::workers::{Registry, Status, Worker};

/// The data plane's view of the config: durations and caps, computed once.
#[derive(Clone, Debug)]
pub struct Settings {
    pub max_payload_size: usize,
    pub body_read_timeout: Duration,
    /// Whole request, stream included.
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    pub prefill_head_timeout: Duration,
    pub decode_first_byte_timeout: Duration,
    pub stream_idle_timeout: Duration,
    pub api_key: Option<String>,
    /// Without an API key, peers allowed to call mutating admin routes (default: loopback).
    pub admin_trusted: Vec<crate::config::IpNet>,
    /// Request-id headers, checked in order.
    pub request_id_headers: Vec<http::HeaderName>,
    pub retry: RetrySettings,
    /// How long `/health_generate` waits for each engine (the health-check timeout, at least 5 s:
    /// the engines run a real generation).
    pub health_generate_timeout: Duration,
    /// `Retry-After` of an overload shed, seconds (the load monitor's interval).
    pub overload_retry_after_secs: u64,
    /// How long a PD dispatch waits for a free decode slot before it is shed (0: at once).
    pub pd_admission_wait: Duration,
    /// What new workers start from (breaker, connect deadline, health checks).
    pub worker_defaults: WorkerDefaults,
    pub dp_aware: bool,
    /// Whether the worker API is served on a separate admin listener (not on the data port).
    pub separate_admin: bool,
    pub pool_size: usize,
    /// Idle lifetime of a pooled engine connection (`None`: unlimited).
    pub pool_idle: Option<Duration>,
    pub health: HealthSettings,
    pub overload: OverloadSettings,
    /// The prefill → decode link breaker.
    pub links: crate::workers::links::LinkSettings,
    /// The capacity advice's sliding window.
    pub capacity_window: Duration,
    /// Between two rounds of link canaries (zero: off).
    pub link_canary_interval: Duration,
    /// `None`: CORS off (no origin configured).
    pub cors: Option<crate::proxy::cors::CorsPolicy>,
    /// Fetches client media under the configured policy (gRPC multimodal; cheap to build: TLS
    /// roots load on the first https fetch). Its `policy()` is the policy in effect.
    media_fetcher: pdgate_media::Fetcher,
}

/// The backoff before attempt `k + 1` (k from 0): the config's base delay ± jitter.
pub fn jittered_backoff(retry: &RetrySettings, k: u32) -> Duration {
    let base = retry.base_backoff(k).as_secs_f64();
    let spread = base * f64::from(retry.jitter_factor);
    let jittered = base + (rand::random::<f64>() * 2.0 - 1.0) * spread;
    Duration::from_secs_f64(jittered.max(0.0))
}

impl Settings {
    pub fn from_config(cfg: &GatewayConfig) -> Settings {
        let t = cfg.timeouts();
        let media_policy = pdgate_media::FetchPolicy {
            allowed_domains: cfg
                .mm_allowed_media_domains
                .as_deref()
                .and_then(|d| pdgate_media::FetchPolicy::parse_domains(d).ok()),
            allow_private: cfg.mm_allow_private_media_hosts,
            ..pdgate_media::FetchPolicy::default()
        };
        Settings {
            max_payload_size: cfg.max_payload_size,
            body_read_timeout: t.body_read,
            request_timeout: t.request,
            connect_timeout: t.connect,
            prefill_head_timeout: t.prefill_head,
            decode_first_byte_timeout: t.decode_first_byte,
            stream_idle_timeout: t.stream_idle,
            api_key: cfg.api_key.clone().filter(|k| !k.is_empty()),
            admin_trusted: cfg
                .admin_trusted_nets()
                .unwrap_or_else(|_| crate::config::IpNet::loopback()),
            request_id_headers: cfg.request_id_header_names(),
            retry: cfg.retry(),
            worker_defaults: WorkerDefaults::from_config(cfg),
            overload_retry_after_secs: cfg.overload().retry_after_secs,
            pd_admission_wait: Duration::from_secs(cfg.pd_admission_wait_secs),
            health_generate_timeout: cfg.health().timeout.max(Duration::from_secs(5)),
            dp_aware: cfg.dp_aware,
            separate_admin: cfg.admin_addr().is_some(),
            health: cfg.health(),
            overload: cfg.overload(),
            pool_size: 256,
            pool_idle: t.upstream_pool_idle,
            links: crate::workers::links::LinkSettings::from_config(cfg),
            link_canary_interval: Duration::from_secs(cfg.link_canary_interval_secs),
            capacity_window: Duration::from_secs(cfg.capacity_window_secs),
            cors: crate::proxy::cors::CorsPolicy::from_config(&cfg.cors_allowed_origins),
            media_fetcher: pdgate_media::Fetcher::new(media_policy),
        }
    }
}

/// Bounds the `model` metric label: a name no registered worker serves is `"other"` (as SMG
/// 1.13.0 labels an unknown model), so a client cannot mint series, nor fill the table with
/// made-up names ahead of the fleet's real ones; past [`MAX_MODEL_LABELS`] distinct served
/// names (a fleet of model-agnostic workers serves every name) later ones are `"other"` too.
pub struct ModelLabels {
    seen: Mutex<Vec<Arc<str>>>,
    /// `"other"`, made once (a request naming an unserved model allocates nothing for it).
    other: Arc<str>,
}

pub const MAX_MODEL_LABELS: usize = 64;

impl ModelLabels {
    pub fn new() -> Self {
        ModelLabels {
            seen: Mutex::new(Vec::new()),
            other: Arc::from("other"),
        }
    }

    /// The label of `model`; `served` says whether a registered worker serves a name, and is
    /// asked only for a name not labelled before (outside the lock).
    pub fn label(&self, model: Option<&str>, served: impl FnOnce(&str) -> bool) -> Arc<str> {
        let m = model.unwrap_or(crate::metrics::UNKNOWN_MODEL);
        let known = |seen: &[Arc<str>]| seen.iter().find(|s| &***s == m).cloned();
        if let Some(s) = known(&self.seen.lock().unwrap_or_else(|e| e.into_inner())) {
            return s;
        }
        if model.is_some() && !served(m) {
            return self.other.clone();
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = known(&seen) {
            return s;
        }
        if seen.len() >= MAX_MODEL_LABELS {
            return self.other.clone();
        }
        let s: Arc<str> = Arc::from(m);
        seen.push(s.clone());
        s
    }
}

impl Default for ModelLabels {
    fn default() -> Self {
        Self::new()
    }
}

/// The running gateway's state. Settings, config and policies are swapped whole on reload;
/// a request reads them once (`settings()`) and keeps that view to its end.
pub struct Gateway {
    settings: ArcSwap<Settings>,
    config: ArcSwap<GatewayConfig>,
    /// Where the config came from (what SIGHUP / `POST /reload` re-reads).
    pub source: ConfigSource,
    /// The config the process started with: listeners and Pingora settings are bound from it
    /// and cannot change without a graceful upgrade.
    startup: LoadedConfig,
    pub registry: Arc<Registry>,
    pub policies: ArcSwap<LegPolicies>,
    pub client: Arc<LegClient>,
    pub model_labels: ModelLabels,
    /// Every rendezvous the gateway minted and whose legs have not all ended.
    pub ledger: Arc<Ledger>,
    /// Serializes reloads (SIGHUP and `POST /reload` may race).
    pub reload_lock: tokio::sync::Mutex<()>,
    /// The gRPC path's tokenizers.
    pub models: crate::models::Models,
    /// The admission limits of the inference routes (`None`: unlimited). Rebuilt by a reload
    /// only when the limits change; requests admitted before keep their place in the old one.
    pub limiter: ArcSwapOption<Limiter>,
    /// The secret a link canary presents to pin its pair (`workers::canary`); minted at
    /// startup, never configured or shown.
    pub canary_secret: String,
    /// The latest P:D capacity advice.
    pub capacity: crate::capacity::Capacity,
    /// How service discovery is doing (`/readiness`); empty without discovery.
    pub discovery: crate::discovery::DiscoveryStatus,
    /// EPD: the encode policy's state.
    pub encoders: crate::workers::encode::EncodePicker,
}

impl Gateway {
    pub fn new(
        startup: LoadedConfig,
        registry: Arc<Registry>,
        policies: LegPolicies,
        models: crate::models::Models,
    ) -> Gateway {
        let cfg = startup.gateway.clone();
        let discovery = crate::discovery::DiscoveryStatus::new(cfg.discovery())
            .with_encode(cfg.epd_disaggregation && !cfg.encode_selector.is_empty());
        let limiter = Limiter::new(Limits::from_config(&cfg)).map(Arc::new);
        let source = startup.source.clone();
        let settings = Settings::from_config(&cfg);
        let client = Arc::new(LegClient::new(settings.pool_size, settings.pool_idle));
        Gateway {
            settings: ArcSwap::from_pointee(settings),
            config: ArcSwap::from_pointee(cfg),
            source,
            startup,
            registry,
            policies: ArcSwap::from_pointee(policies),
            client,
            model_labels: ModelLabels::new(),
            ledger: Ledger::new(),
            reload_lock: tokio::sync::Mutex::new(()),
            encoders: Default::default(),
            models,
            limiter: ArcSwapOption::new(limiter),
            canary_secret: uuid::Uuid::new_v4().simple().to_string(),
            capacity: crate::capacity::Capacity::new(),
            discovery,
        }
    }

    /// The current settings (a reload swaps in new ones; holders keep theirs).
    pub fn settings(&self) -> Arc<Settings> {
        self.settings.load_full()
    }

    /// The current settings for a read right away, not held across an `.await`: no reference
    /// count is touched (every request's `Arc` clone and drop of one shared count made the two
    /// workers' cores pass its cache line back and forth).
    pub fn settings_now(&self) -> arc_swap::Guard<Arc<Settings>> {
        self.settings.load()
    }

    /// The fetcher of the media policy in effect (one per configuration).
    pub fn media_fetcher(&self) -> pdgate_media::Fetcher {
        self.settings().media_fetcher.clone()
    }

    /// The config the current settings came from.
    pub fn config(&self) -> Arc<GatewayConfig> {
        self.config.load_full()
    }

    /// The config the process started with (for what a reload cannot change).
    pub fn startup_config(&self) -> &LoadedConfig {
        &self.startup
    }

    /// Registers a worker and tells its leg's policy; false when its URL is taken.
    pub fn admit(&self, worker: Arc<Worker>) -> bool {
        if self.registry.add(worker.clone()).is_err() {
            return false;
        }
        self.policies.load().worker_added(&worker);
        true
    }

    /// Stops routing to a worker at once (`draining`) and removes it after `drain_settle` (the
    /// worker's own `health.drain_settle_secs` when its spec has one). Requests already on it
    /// finish normally: they hold their own reference.
    pub fn retire(self: &Arc<Self>, worker: Arc<Worker>) {
        worker.set_status(Status::Draining);
        let gw = self.clone();
        let settle =
            crate::workers::health::settings_for(&self.settings_now().health, &worker).drain_settle;
        tokio::spawn(async move {
            tokio::time::sleep(settle).await;
            if gw.registry.remove(&worker.id).is_some() {
                gw.policies.load().worker_removed(&worker);
                log::info!("worker {} removed", worker.url());
            }
        });
    }

    /// Replaces a worker's registration in place: same id, its live state (health, breaker,
    /// load) carried over. Requests in flight keep the old registration.
    pub fn swap(&self, current: &Arc<Worker>, worker: Arc<Worker>) {
        worker.inherit_state(current);
        self.registry.replace(worker.clone());
        let policies = self.policies.load();
        policies.worker_removed(current);
        policies.worker_added(&worker);
    }

    /// Swaps in a validated new config (reload).
    pub fn swap_config(&self, cfg: GatewayConfig) {
        let limiter = Limiter::new(Limits::from_config(&cfg));
        let current = self.limiter.load().as_ref().map(|l| *l.limits());
        if current != limiter.as_ref().map(|l| *l.limits()) {
            self.limiter.store(limiter.map(Arc::new));
        }
        self.settings.store(Arc::new(Settings::from_config(&cfg)));
        self.config.store(Arc::new(cfg));
    }
}

#[cfg(test)]
mod tests {
    use super::{ModelLabels, MAX_MODEL_LABELS};

    #[test]
    fn only_served_models_are_labelled_by_name() {
        let labels = ModelLabels::new();
        let served = |m: &str| m.starts_with("served");
        assert_eq!(&*labels.label(Some("served-a"), served), "served-a");
        assert_eq!(&*labels.label(Some("made-up"), served), "other");
        assert_eq!(&*labels.label(None, |_| false), "unknown");
        // A name labelled once keeps its label without asking again.
        assert_eq!(
            &*labels.label(Some("served-a"), |_| panic!("asked again")),
            "served-a"
        );
        // Made-up names do not take the places of served ones.
        for i in 0..2 * MAX_MODEL_LABELS {
            assert_eq!(&*labels.label(Some(&format!("junk-{i}")), served), "other");
        }
        assert_eq!(&*labels.label(Some("served-b"), served), "served-b");
        // Served names past the bound (model-agnostic workers serve any name) are "other".
        for i in 0..MAX_MODEL_LABELS {
            labels.label(Some(&format!("served-{i}")), served);
        }
        assert_eq!(&*labels.label(Some("served-late"), served), "other");
    }
}
