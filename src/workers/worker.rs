//! One registered engine endpoint: the facts the router needs (role, runtime, where its legs and
//! its bootstrap server are) and its live state (status, in-flight count).
//!
//! Facts are immutable once registered; a change is a re-registration. The one exception is a
//! gRPC vLLM prefill's KV engine id, re-read when the worker recovers (a restarted vLLM without a
//! pinned id comes back with a new one). Live state is atomics, read on every selection without
//! locks.
//!
//! A worker's facts are its spec merged over what the engine reported ([`Discovered`]): read them
//! through the accessors ([`Worker::labels`], [`Worker::kv_connector`], [`Worker::kv_engine_id`],
//! [`Worker::dp_size`], …), not from `spec`, so a gRPC worker's reported facts count.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use std::sync::{Arc, OnceLock};

use pingora::upstreams::peer::HttpPeer;
use pingora_prometheus::prometheus::IntGauge;

use super::breaker::Breaker;
use crate::config::{
    label, CircuitBreakerSettings, ConnectionMode, RuntimeType, WorkerSpec, WorkerType,
};
use crate::legs::client::LegPeer;
use crate::legs::grpc::LegChannel;
use crate::metrics::METRICS;
use crate::policy::EngineLoad;

/// Health status, SMG's state machine: `pending → ready ↔ not_ready → failed`; `draining` on removal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    Pending = 0,
    Ready = 1,
    NotReady = 2,
    Failed = 3,
    Draining = 4,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Ready => "ready",
            Status::NotReady => "not_ready",
            Status::Failed => "failed",
            Status::Draining => "draining",
        }
    }

    fn from_u8(v: u8) -> Status {
        match v {
            1 => Status::Ready,
            2 => Status::NotReady,
            3 => Status::Failed,
            4 => Status::Draining,
            _ => Status::Pending,
        }
    }
}

/// Where a worker URL points, split the way the legs and the handoff need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerAddress {
    /// The URL without the `@rank` DP suffix; legs are sent here.
    pub base_url: String,
    /// Host as written in the URL, without port (IPv6 stays bracketed): SGLang's `bootstrap_host`.
    pub host: String,
    pub port: u16,
    /// `Host` header value for legs.
    pub authority: String,
    /// The URL's path, without a trailing `/` (usually empty); legs go to `{path_prefix}{route}`.
    pub path_prefix: String,
    pub tls: bool,
    /// The transport, from the scheme: `http(s)://` legs are HTTP/1.1 requests, `grpc://` legs
    /// are calls to the engine's gRPC servicer. Never `Zmq` (refused at intake).
    pub connection_mode: ConnectionMode,
    /// DP rank from a `url@rank` suffix.
    pub dp_rank: Option<u32>,
}

impl WorkerAddress {
    /// Parses an `http(s)://host[:port][/path][@rank]` or `grpc://host:port[@rank]` worker URL.
    /// The scheme must be lowercase; a gRPC URL needs a port and has no path; `grpcs://` is
    /// refused (no TLS client for gRPC in this build, see `GRPCS_WORKERS_SUPPORTED`).
    pub fn parse(url: &str) -> Result<WorkerAddress, String> {
        let (base, dp_rank) = split_dp_suffix(url);
        let (tls, connection_mode, rest) = if let Some(r) = base.strip_prefix("http://") {
            (false, ConnectionMode::Http, r)
        } else if let Some(r) = base.strip_prefix("https://") {
            (true, ConnectionMode::Http, r)
        } else if let Some(r) = base.strip_prefix("grpc://") {
            (false, ConnectionMode::Grpc, r)
        } else {
            return Err(format!(
                "worker URL `{url}` must start with lowercase http://, https:// or grpc://"
            ));
        };
        let grpc = connection_mode == ConnectionMode::Grpc;
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        let path_prefix = rest[authority.len()..]
            .split(['?', '#'])
            .next()
            .unwrap_or("")
            .trim_end_matches('/')
            .to_string();
        if authority.is_empty() || authority.contains('@') {
            return Err(format!("worker URL `{url}` has no valid host"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let end = v6
                .find(']')
                .ok_or_else(|| format!("worker URL `{url}` has an unterminated IPv6 host"))?;
            let host = &authority[..end + 2];
            let after = &v6[end + 1..];
            let port = match after.strip_prefix(':') {
                Some(p) => Some(p),
                None if after.is_empty() => None,
                None => return Err(format!("worker URL `{url}` has a malformed host")),
            };
            (host, port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(format!("worker URL `{url}` has no host"));
        }
        if grpc && (port.is_none() || !path_prefix.is_empty()) {
            return Err(format!(
                "gRPC worker URL `{url}` must be grpc://host:port (a port, no path)"
            ));
        }
        let port = match port {
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("worker URL `{url}` has an invalid port `{p}`"))?,
            None if tls => 443,
            None => 80,
        };
        Ok(WorkerAddress {
            base_url: base.to_string(),
            host: host.to_string(),
            port,
            authority: authority.to_string(),
            path_prefix,
            tls,
            connection_mode,
            dp_rank,
        })
    }

    /// Whether legs to this worker are gRPC calls.
    pub fn is_grpc(&self) -> bool {
        self.connection_mode == ConnectionMode::Grpc
    }

    /// The request path for `route` on this worker.
    pub fn path_for<'a>(&self, route: &'a str) -> std::borrow::Cow<'a, str> {
        if self.path_prefix.is_empty() {
            std::borrow::Cow::Borrowed(route)
        } else {
            std::borrow::Cow::Owned(format!("{}{route}", self.path_prefix))
        }
    }

    /// The host for socket resolution (brackets removed).
    pub fn resolve_host(&self) -> &str {
        self.host.trim_start_matches('[').trim_end_matches(']')
    }
}

/// `http://p:8000@3` → (`http://p:8000`, Some(3)); anything else unchanged.
fn split_dp_suffix(url: &str) -> (&str, Option<u32>) {
    if let Some((base, rank)) = url.rsplit_once('@') {
        if !rank.is_empty() && rank.bytes().all(|b| b.is_ascii_digit()) && base.contains("://") {
            if let Ok(r) = rank.parse() {
                return (base, Some(r));
            }
        }
    }
    (url, None)
}

/// Where a registration came from: the config file (a reload may change or remove it), the
/// worker API or service discovery (a reload leaves both alone; discovery retires its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Config,
    Api,
    Discovery,
}

/// What every new worker starts from; a spec's own overrides apply on top.
#[derive(Clone, Debug)]
pub struct WorkerDefaults {
    pub breaker: CircuitBreakerSettings,
    /// TCP connect deadline for this worker's legs.
    pub connect_timeout: std::time::Duration,
    /// Whether workers are probed (`pending` until healthy) or ready at once.
    pub health_checks: bool,
}

impl WorkerDefaults {
    pub fn from_config(cfg: &crate::config::GatewayConfig) -> WorkerDefaults {
        WorkerDefaults {
            breaker: cfg.circuit_breaker(),
            connect_timeout: cfg.timeouts().connect,
            health_checks: cfg.health().enabled,
        }
    }
}

/// What an engine told us about itself at registration: over HTTP, `/v1/models`, `/version`,
/// `/server_info` (runtime and models only); over gRPC, the servicer's `HealthCheck`,
/// `GetModelInfo` and `GetServerInfo` (see `workers::facts` for how each fact is sourced).
#[derive(Clone, Debug, Default)]
pub struct Discovered {
    pub runtime: RuntimeType,
    pub models: Vec<String>,
    /// Facts as SMG's labels (`context_length`, `dp_size`, `disaggregation_transfer_backend`,
    /// `kv_cache_dtype`, `version`, …). The spec's own labels win over these.
    pub labels: BTreeMap<String, String>,
    /// vLLM's KV connector, role and engine id as the servicer reports them (after the
    /// spec's `MultiConnector` unwrapping); the spec's fields win over these.
    pub kv_connector: Option<String>,
    pub kv_role: Option<String>,
    pub kv_engine_id: Option<String>,
    pub eos_token_ids: Vec<u32>,
}

/// What discovery learned, with the labels merged once (the spec's over the discovered).
struct Facts {
    discovered: Discovered,
    labels: BTreeMap<String, String>,
}

/// A live worker. Shared (`Arc`) between the registry snapshot, in-flight requests and the
/// health checker.
pub struct Worker {
    pub id: String,
    pub origin: Origin,
    /// The registration as given (validated); `api_key` inside is never echoed.
    pub spec: WorkerSpec,
    /// The declared engine (`Unspecified` when detection decides).
    declared_runtime: RuntimeType,
    pub address: WorkerAddress,
    /// The resolved address legs connect to.
    pub socket: SocketAddr,
    /// Models declared in the spec; empty means "as discovered", or any.
    declared_models: Vec<String>,
    /// What registration learned from the engine (set once, before the worker turns ready).
    facts: OnceLock<Facts>,
    /// The engine's KV engine id as last read (starts as discovered; a gRPC vLLM prefill's is
    /// re-read when it recovers, since a restarted vLLM without a pinned id gets a new one).
    live_engine_id: ArcSwapOption<String>,
    pub peer: LegPeer,
    /// TCP connect deadline of this worker's connections (HTTP peer and gRPC channels).
    connect_timeout: Duration,
    /// The data plane's gRPC channel, created on first use (see [`Worker::grpc_channel`]);
    /// shared by the DP-rank workers of one engine.
    channel: Arc<OnceLock<LegChannel>>,
    /// The decode admission window, sized by the running window the engine reported when it is
    /// first used (see `workers::admission`).
    admission: OnceLock<super::admission::Window>,
    status: AtomicU8,
    in_flight: AtomicUsize,
    /// Fed by the legs sent to this worker.
    pub breaker: Breaker,
    /// The engine's latest load report (load monitor).
    load: ArcSwapOption<EngineLoad>,
    /// At or above the overload thresholds in the latest report.
    overloaded: AtomicBool,
    active_gauge: IntGauge,
    /// A prefill's links to its decodes (link health; empty on decodes).
    pub links: super::links::LinkTable,
    /// The URL as a header value (`x-smg-routed-worker-id` on every answer): built once,
    /// shared by reference count.
    url_value: Option<http::HeaderValue>,
}

impl Worker {
    /// A worker made from `spec` with the default settings, at a socket nothing listens on
    /// (unit tests that never send it a leg).
    #[cfg(test)]
    pub fn for_test(spec: WorkerSpec) -> Arc<Worker> {
        let defaults = WorkerDefaults::from_config(&crate::config::GatewayConfig::default());
        let address = WorkerAddress::parse(&spec.url).expect("a test worker URL");
        Worker::new(
            "id".into(),
            spec,
            address,
            "127.0.0.1:1".parse().expect("an address"),
            &defaults,
            Origin::Config,
        )
    }

    pub fn new(
        id: String,
        spec: WorkerSpec,
        address: WorkerAddress,
        addr: SocketAddr,
        defaults: &WorkerDefaults,
        origin: Origin,
    ) -> Arc<Worker> {
        let w = Arc::new(Worker::build(id, spec, address, addr, defaults, origin));
        w.publish_health();
        w
    }

    /// One DP rank of `parent` (`--dp-aware`): its own registration (`spec`, `address` with the
    /// rank), the parent's live state, and the parent's data-plane gRPC channel (one engine,
    /// one connection).
    pub fn rank_of(
        parent: &Worker,
        spec: WorkerSpec,
        address: WorkerAddress,
        defaults: &WorkerDefaults,
    ) -> Arc<Worker> {
        let mut w = Worker::build(
            uuid::Uuid::new_v4().to_string(),
            spec,
            address,
            parent.socket,
            defaults,
            parent.origin,
        );
        w.channel = parent.channel.clone();
        let w = Arc::new(w);
        w.inherit_state(parent);
        w
    }

    fn build(
        id: String,
        spec: WorkerSpec,
        address: WorkerAddress,
        addr: SocketAddr,
        defaults: &WorkerDefaults,
        origin: Origin,
    ) -> Worker {
        let mut peer = HttpPeer::new(addr, address.tls, address.resolve_host().to_string());
        peer.options.connection_timeout = Some(defaults.connect_timeout);
        // New workers are probed before they take traffic, unless health checks are off.
        let initial = if defaults.health_checks {
            Status::Pending
        } else {
            Status::Ready
        };
        let active_gauge = METRICS
            .worker_requests_active
            .with_label_values(&[spec.url.as_str()]);
        let declared_models = spec.models.iter().map(|m| m.id.clone()).collect();
        let breaker = Breaker::new(
            super::breaker::settings_for(&defaults.breaker, spec.resilience.as_ref()),
            &spec.url,
        );
        let spec_url = spec.url.clone();
        Worker {
            id,
            origin,
            declared_runtime: spec.runtime_type,
            spec,
            address,
            socket: addr,
            declared_models,
            facts: OnceLock::new(),
            live_engine_id: ArcSwapOption::empty(),
            peer: LegPeer::new(peer),
            connect_timeout: defaults.connect_timeout,
            channel: Arc::default(),
            admission: OnceLock::new(),
            status: AtomicU8::new(initial as u8),
            in_flight: AtomicUsize::new(0),
            breaker,
            load: ArcSwapOption::empty(),
            overloaded: AtomicBool::new(false),
            active_gauge,
            links: Default::default(),
            url_value: http::HeaderValue::from_str(&spec_url).ok(),
        }
    }

    pub fn url(&self) -> &str {
        &self.spec.url
    }

    /// [`Worker::url`] as a header value (`None` if the URL has bytes a header cannot carry).
    pub fn url_value(&self) -> Option<http::HeaderValue> {
        self.url_value.clone()
    }

    pub fn role(&self) -> WorkerType {
        self.spec.worker_type
    }

    /// Whether this worker is reached over gRPC (`grpc://`): its legs, health checks and load
    /// reports go through the engine's servicer.
    pub fn is_grpc(&self) -> bool {
        self.address.is_grpc()
    }

    /// `http` or `grpc`: SMG's `connection_mode` (worker listing, metric labels).
    pub fn connection_mode(&self) -> ConnectionMode {
        self.address.connection_mode
    }

    /// The TCP connect deadline of this worker's connections.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The data plane's gRPC channel to this worker (meaningful only when [`Worker::is_grpc`]):
    /// one HTTP/2 connection, multiplexing every leg, with SMG's settings (the worker's connect
    /// timeout, keep-alive, windows; see [`LegChannel`]). Cheap to clone.
    ///
    /// Created lazily, on the first call, not at registration: Pingora runs each service on its
    /// own tokio runtime, and a channel's connection task lives on the runtime that created
    /// it. Registration happens on the admin or a background service's runtime; the
    /// first request leg runs on the data plane's, which is where the connection must live.
    /// Call it only from the data plane (the background services have their own channels).
    pub fn grpc_channel(&self) -> LegChannel {
        self.channel
            .get_or_init(|| LegChannel::lazy(&self.address, self.socket, self.connect_timeout))
            .clone()
    }

    pub fn status(&self) -> Status {
        Status::from_u8(self.status.load(Ordering::Acquire))
    }

    pub fn set_status(&self, s: Status) {
        self.status.store(s as u8, Ordering::Release);
        self.publish_health();
    }

    fn publish_health(&self) {
        let v = i64::from(self.status() == Status::Ready);
        METRICS
            .worker_health
            .with_label_values(&[self.spec.url.as_str()])
            .set(v);
    }

    pub fn is_healthy(&self) -> bool {
        self.status() == Status::Ready
    }

    /// In-flight requests through this gateway.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The engine. HTTP: declared, else detected at registration, else SGLang (SMG's fallback
    /// for an unresolved runtime). gRPC: the service that answered at registration (the
    /// declared runtime is only the first one tried), else as HTTP; a servicer that answers
    /// none of the known services is `Generic` — see [`RuntimeType::has_pd_protocol`].
    /// Never `Unspecified`.
    pub fn runtime(&self) -> RuntimeType {
        self.known_runtime().unwrap_or(RuntimeType::Sglang)
    }

    /// The runtime when it is known (declared, or detected at registration); `None` otherwise.
    pub fn known_runtime(&self) -> Option<RuntimeType> {
        let detected = self
            .discovered()
            .map(|d| d.runtime)
            .filter(|r| *r != RuntimeType::Unspecified);
        let declared = Some(self.declared_runtime).filter(|r| *r != RuntimeType::Unspecified);
        if self.is_grpc() {
            detected.or(declared)
        } else {
            declared.or(detected)
        }
    }

    fn discovered(&self) -> Option<&Discovered> {
        self.facts.get().map(|f| &f.discovered)
    }

    /// Models served: declared in the spec, else discovered from the engine; empty = any.
    pub fn models(&self) -> &[String] {
        if !self.declared_models.is_empty() {
            return &self.declared_models;
        }
        self.discovered().map_or(&[], |d| d.models.as_slice())
    }

    /// Whether registration still has to ask the engine what it is. A gRPC worker always asks:
    /// its facts (connector, window, context length, layout) come only from the engine.
    pub fn needs_discovery(&self) -> bool {
        self.facts.get().is_none()
            && (self.is_grpc()
                || self.declared_runtime == RuntimeType::Unspecified
                || self.declared_models.is_empty()
                // An HTTP decode is asked its running window (its admission window) unless
                // the registration gives one.
                || (self.role() == WorkerType::Decode
                    && ![label::MAX_RUNNING_REQUESTS, label::MAX_NUM_SEQS]
                        .iter()
                        .any(|k| self.spec.labels.contains_key(*k))))
    }

    /// Carries the live state of the registration this one replaces (PATCH/PUT, a DP rank):
    /// status, what discovery learned (merged again with this spec's labels) and the engine id
    /// as last read.
    pub fn inherit_state(&self, old: &Worker) {
        self.set_status(old.status());
        if let Some(d) = old.discovered() {
            self.set_discovered(d.clone());
        }
        self.live_engine_id.store(old.live_engine_id.load_full());
    }

    /// Records what registration learned (first call wins).
    pub fn set_discovered(&self, d: Discovered) {
        let mut labels = d.labels.clone();
        labels.extend(self.spec.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        if self.facts.get().is_none() {
            self.live_engine_id.store(
                d.kv_engine_id
                    .clone()
                    .filter(|e| !e.is_empty())
                    .map(Arc::new),
            );
        }
        let _ = self.facts.set(Facts {
            discovered: d,
            labels,
        });
    }

    /// Records the KV engine id the engine reports now (a recovered gRPC vLLM prefill).
    pub fn set_engine_id(&self, id: Option<String>) {
        self.live_engine_id
            .store(id.filter(|e| !e.is_empty()).map(Arc::new));
    }

    /// The worker's labels: the spec's, over what the engine reported (the merged view that
    /// pairing, `GET /workers` and the handoff checks read).
    pub fn labels(&self) -> &BTreeMap<String, String> {
        self.facts.get().map_or(&self.spec.labels, |f| &f.labels)
    }

    /// One label of the merged view.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels().get(key).map(String::as_str)
    }

    /// An SGLang decode whose "transfer" is the `fake` backend (a test mode: it decodes
    /// without any KV), so a successful answer says nothing about a handoff.
    pub fn fake_kv_transfer(&self) -> bool {
        self.fact(&[crate::config::label::DISAGGREGATION_TRANSFER_BACKEND])
            .is_some_and(|b| b.eq_ignore_ascii_case("fake"))
    }

    /// The first of `keys` the spec's labels have, else the first the engine reported
    /// (so a configured fact wins over every spelling of a discovered one); trimmed, non-empty.
    fn fact(&self, keys: &[&str]) -> Option<&str> {
        fn find<'a>(labels: &'a BTreeMap<String, String>, keys: &[&str]) -> Option<&'a str> {
            keys.iter()
                .find_map(|k| labels.get(*k))
                .map(|v| v.trim())
                .filter(|v| !v.is_empty())
        }
        find(&self.spec.labels, keys).or_else(|| find(&self.discovered()?.labels, keys))
    }

    fn numeric_fact(&self, keys: &[&str]) -> Option<u32> {
        self.fact(keys)?.parse::<u32>().ok().filter(|n| *n > 0)
    }

    /// The KV connector class name: the registered one, else the one the engine reported.
    pub fn kv_connector(&self) -> Option<&str> {
        self.spec
            .kv_connector
            .as_deref()
            .or_else(|| self.discovered()?.kv_connector.as_deref())
            .filter(|c| !c.is_empty())
    }

    /// The KV role (`kv_producer`, `kv_consumer`, `kv_both`): registered, else reported.
    pub fn kv_role(&self) -> Option<&str> {
        self.spec
            .kv_role
            .as_deref()
            .or_else(|| self.discovered()?.kv_role.as_deref())
            .filter(|r| !r.is_empty())
    }

    /// The KV engine id: the registered one (an HTTP worker keeps it), else the one the engine
    /// reported last (re-read when a gRPC prefill recovers).
    pub fn kv_engine_id(&self) -> Option<String> {
        match self.spec.kv_engine_id.as_deref().filter(|e| !e.is_empty()) {
            Some(id) => Some(id.to_string()),
            None => self.live_engine_id.load().as_deref().cloned(),
        }
    }

    /// The explicit pairing protocol: what the registration says (the `pairing_protocol` label,
    /// else the spec field), else what the engine reports from its `SMG_PAIRING_PROTOCOL`.
    pub fn pairing_protocol(&self) -> Option<&str> {
        self.spec.pairing_protocol().or_else(|| {
            self.discovered()?
                .labels
                .get(label::PAIRING_PROTOCOL)
                .map(String::as_str)
                .filter(|p| !p.is_empty())
        })
    }

    /// The model's context window in tokens (gRPC: `GetModelInfo.max_context_length`, else the
    /// engine's `context_length`); `None` when unreported.
    pub fn context_length(&self) -> Option<u32> {
        self.numeric_fact(&[label::MAX_CONTEXT_LENGTH, label::CONTEXT_LENGTH])
    }

    /// How many requests the engine runs at once: SGLang's `max_running_requests`, TokenSpeed's
    /// and vLLM's `max_num_seqs`; `None` when unreported.
    pub fn running_window(&self) -> Option<u32> {
        self.numeric_fact(&[label::MAX_RUNNING_REQUESTS, label::MAX_NUM_SEQS])
    }

    /// The admission window of this worker as a decode: `None` when it reports no running
    /// window (not gated). Sized once, by the window known at first use.
    pub fn admission_window(&self) -> Option<&super::admission::Window> {
        let size = self.running_window()?;
        Some(
            self.admission
                .get_or_init(|| super::admission::Window::new(size)),
        )
    }

    /// The engine's data-parallel size: the spec's `dp_size` field, else the `dp_size` label
    /// (registered, then reported); `None` when unreported or unreadable.
    pub fn dp_size(&self) -> Option<u32> {
        self.spec
            .dp_size
            .or_else(|| self.numeric_fact(&[label::DP_SIZE]))
    }

    /// The engine's tensor-parallel size (`tp_size` label); `None` when unreported.
    pub fn tp_size(&self) -> Option<u32> {
        self.numeric_fact(&[label::TP_SIZE])
    }

    /// The model's end-of-sequence token ids as the engine reported them (gRPC `GetModelInfo`).
    pub fn eos_token_ids(&self) -> &[u32] {
        self.discovered()
            .map_or(&[], |d| d.eos_token_ids.as_slice())
    }

    /// Where this worker's tokenizer can be read locally: its `tokenizer_path` label, else its
    /// `model_path` label, whichever names a path that exists on this machine (SMG's order;
    /// the gateway-wide `--tokenizer-path` / `--model-path` come after, and are the caller's).
    pub fn tokenizer_source(&self) -> Option<PathBuf> {
        [label::TOKENIZER_PATH, label::MODEL_PATH]
            .iter()
            .filter_map(|k| self.fact(&[*k]))
            .map(PathBuf::from)
            .find(|p| p.exists())
    }

    /// Whether this worker serves `model` (`None`: the client named none).
    pub fn serves(&self, model: Option<&str>) -> bool {
        let models = self.models();
        match model {
            None => true,
            Some(m) => models.is_empty() || models.iter().any(|x| x == m),
        }
    }

    /// Records how one leg sent to this worker ended (`None`: no usable response — transport
    /// failure or timeout): its breaker outcome, and `smg_worker_errors_total` for failures.
    pub fn record_leg(&self, status: Option<u16>) {
        self.breaker.record_status(status);
        // SMG 1.13.0's `error_type`s: `timeout` for 408/504, `backend_error` for the other
        // 5xx (side by side); a leg with no usable response is pdgate's `transport`.
        let error_type = match status {
            None => "transport",
            Some(408) | Some(504) => "timeout",
            Some(s) if (500..600).contains(&s) => "backend_error",
            _ => return,
        };
        METRICS
            .worker_errors
            .with_label_values(&[
                self.role().as_str(),
                self.connection_mode().as_str(),
                error_type,
            ])
            .inc();
    }

    /// Records the load monitor's latest report (or its absence) and the overload verdict.
    pub fn set_load(&self, report: Option<EngineLoad>, overloaded: bool) {
        self.load.store(report.map(Arc::new));
        self.overloaded.store(overloaded, Ordering::Relaxed);
    }

    pub fn is_overloaded(&self) -> bool {
        self.overloaded.load(Ordering::Relaxed)
    }

    /// The latest load report, for the policies (they weigh it with [`Worker::in_flight`]).
    pub fn load(&self) -> Option<Arc<EngineLoad>> {
        self.load.load_full()
    }

    /// Counts one in-flight request until the returned guard drops. `keyed`: the request
    /// carries a sticky routing key (also counted in `smg_worker_routing_keys_active`).
    pub fn track(self: &Arc<Self>, keyed: bool) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.active_gauge.inc();
        if keyed {
            self.keys_gauge().inc();
        }
        InFlight {
            worker: self.clone(),
            keyed,
        }
    }

    fn keys_gauge(&self) -> IntGauge {
        METRICS
            .worker_routing_keys_active
            .with_label_values(&[self.url()])
    }
}

/// One in-flight request on a worker; dropping it ends the count (whatever way the leg ended).
pub struct InFlight {
    worker: Arc<Worker>,
    keyed: bool,
}

impl InFlight {
    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.worker.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.worker.active_gauge.dec();
        if self.keyed {
            self.worker.keys_gauge().dec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_splits_host_port_and_dp_rank() {
        let a = WorkerAddress::parse("http://10.0.0.5:8000@3").unwrap();
        assert_eq!(a.base_url, "http://10.0.0.5:8000");
        assert_eq!(a.host, "10.0.0.5");
        assert_eq!(a.port, 8000);
        assert_eq!(a.dp_rank, Some(3));
        assert_eq!(a.authority, "10.0.0.5:8000");
        assert_eq!(a.path_for("/generate"), "/generate");
    }

    #[test]
    fn address_keeps_a_path_prefix_for_legs() {
        let a = WorkerAddress::parse("http://p:1/v2/").unwrap();
        assert_eq!(a.path_for("/health"), "/v2/health");
    }

    #[test]
    fn address_keeps_ipv6_brackets_for_bootstrap_host() {
        let a = WorkerAddress::parse("http://[::1]:9000").unwrap();
        assert_eq!(a.host, "[::1]");
        assert_eq!(a.resolve_host(), "::1");
        assert_eq!(a.port, 9000);
    }

    #[test]
    fn address_defaults_port_by_scheme() {
        assert_eq!(WorkerAddress::parse("http://p").unwrap().port, 80);
        assert_eq!(WorkerAddress::parse("https://p/").unwrap().port, 443);
    }

    #[test]
    fn address_refuses_bad_urls() {
        for bad in [
            "HTTP://p:1",
            "p:1",
            "http://",
            "http://p:0",
            "http://p:x",
            "grpcs://p:1",
            "grpc://p",
            "grpc://p:1/v1",
            "http://user@p:1",
        ] {
            assert!(WorkerAddress::parse(bad).is_err(), "{bad} accepted");
        }
    }

    fn reported() -> Discovered {
        Discovered {
            runtime: RuntimeType::Vllm,
            models: vec!["served".into()],
            labels: [
                ("max_context_length", "8192"),
                ("dp_size", "2"),
                ("max_num_seqs", "64"),
                ("kv_cache_dtype", "auto"),
                ("tokenizer_path", "/nonexistent/tok"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            kv_connector: Some("NixlConnector".into()),
            kv_role: Some("kv_producer".into()),
            kv_engine_id: Some("engine-a".into()),
            eos_token_ids: vec![2, 7],
        }
    }

    #[test]
    fn reported_facts_are_read_through_the_worker_with_the_spec_winning() {
        let mut spec = WorkerSpec::new("grpc://p:1", WorkerType::Prefill);
        spec.labels.insert("kv_cache_dtype".into(), "fp8".into());
        spec.labels.insert("context_length".into(), "4096".into());
        let w = Worker::for_test(spec);
        assert_eq!(w.kv_connector(), None);
        assert_eq!(w.running_window(), None);
        w.set_discovered(reported());
        assert_eq!(w.runtime(), RuntimeType::Vllm);
        assert_eq!(w.models(), ["served".to_string()]);
        assert_eq!(
            w.label("kv_cache_dtype"),
            Some("fp8"),
            "the spec's label wins"
        );
        assert_eq!(w.label("dp_size"), Some("2"));
        // A configured fact wins over every spelling of the reported one.
        assert_eq!(w.context_length(), Some(4096));
        assert_eq!(w.running_window(), Some(64));
        assert_eq!(w.dp_size(), Some(2));
        assert_eq!(w.kv_connector(), Some("NixlConnector"));
        assert_eq!(w.kv_role(), Some("kv_producer"));
        assert_eq!(w.kv_engine_id().as_deref(), Some("engine-a"));
        assert_eq!(w.eos_token_ids(), [2, 7]);
        assert_eq!(w.tokenizer_source(), None, "not a local path");
    }

    #[test]
    fn a_grpc_worker_takes_the_runtime_that_answered_an_http_worker_keeps_the_declared_one() {
        for (url, want) in [
            ("grpc://p:1", RuntimeType::Vllm),
            ("http://p:1", RuntimeType::Sglang),
        ] {
            let mut spec = WorkerSpec::new(url, WorkerType::Decode);
            spec.runtime_type = RuntimeType::Sglang;
            spec.models = vec![crate::config::ModelCard {
                id: "m".into(),
                aliases: Vec::new(),
                extra: BTreeMap::new(),
            }];
            // A decode that reports its window is asked nothing more over HTTP.
            spec.labels
                .insert("max_running_requests".into(), "8".into());
            let w = Worker::for_test(spec.clone());
            // Over HTTP a declared runtime and model need no discovery; gRPC always asks.
            assert_eq!(w.needs_discovery(), w.is_grpc(), "{url}");
            // Without a window, an HTTP decode is asked for its running window.
            spec.labels.clear();
            assert!(Worker::for_test(spec).needs_discovery(), "{url}");
            w.set_discovered(reported());
            assert_eq!(w.runtime(), want, "{url}");
        }
    }

    #[test]
    fn the_engine_id_is_re_read_unless_registered() {
        let w = Worker::for_test(WorkerSpec::new("grpc://p:1", WorkerType::Prefill));
        w.set_discovered(reported());
        w.set_engine_id(Some("engine-b".into()));
        assert_eq!(w.kv_engine_id().as_deref(), Some("engine-b"));
        // A re-registration (PATCH) keeps the id as last read.
        let again = Worker::for_test(WorkerSpec::new("grpc://p:1", WorkerType::Prefill));
        again.inherit_state(&w);
        assert_eq!(again.kv_engine_id().as_deref(), Some("engine-b"));
        w.set_engine_id(None);
        assert_eq!(w.kv_engine_id(), None);

        let mut spec = WorkerSpec::new("http://p:1", WorkerType::Prefill);
        spec.kv_engine_id = Some("pinned".into());
        let http = Worker::for_test(spec);
        http.set_engine_id(Some("other".into()));
        assert_eq!(http.kv_engine_id().as_deref(), Some("pinned"));
    }

    /// The lazily created data-plane channel reaches the servicer (URL host as `:authority`,
    /// resolved address dialled), and the DP ranks of one engine share it.
    #[tokio::test]
    async fn the_data_plane_channel_reaches_the_servicer_and_is_shared_by_dp_ranks() {
        use mock_engine::{EngineKind, MockEngine, MockEngineConfig, Role};
        use pdgate_proto::sglang::{
            sglang_scheduler_client::SglangSchedulerClient, HealthCheckRequest,
        };
        let engine = MockEngine::spawn(MockEngineConfig::grpc_test(
            EngineKind::Sglang,
            Role::Decode,
            [127, 0, 28, 1],
        ))
        .await
        .unwrap();
        let url = engine.grpc_url().unwrap();
        let spec = WorkerSpec::new(url.as_str(), WorkerType::Decode);
        let address = WorkerAddress::parse(&url).unwrap();
        let defaults = WorkerDefaults::from_config(&crate::config::GatewayConfig::default());
        let socket = format!("127.0.28.1:{}", engine.port()).parse().unwrap();
        let w = Worker::new(
            "id".into(),
            spec.clone(),
            address,
            socket,
            &defaults,
            Origin::Api,
        );
        let mut client = SglangSchedulerClient::new(w.grpc_channel());
        let reply = client.health_check(HealthCheckRequest {}).await.unwrap();
        assert!(reply.into_inner().healthy);

        let rank_url = format!("{url}@1");
        let rank = Worker::rank_of(
            &w,
            WorkerSpec::new(rank_url.as_str(), WorkerType::Decode),
            WorkerAddress::parse(&rank_url).unwrap(),
            &defaults,
        );
        assert!(Arc::ptr_eq(&w.channel, &rank.channel));
        assert!(w.channel.get().is_some() && rank.channel.get().is_some());
    }

    #[test]
    fn a_grpc_address_is_a_grpc_transport_with_the_url_host_for_bootstrap() {
        let a = WorkerAddress::parse("grpc://10.0.0.5:50051@1").unwrap();
        assert!(a.is_grpc());
        assert_eq!(a.connection_mode, ConnectionMode::Grpc);
        assert_eq!(a.base_url, "grpc://10.0.0.5:50051");
        assert_eq!((a.host.as_str(), a.port), ("10.0.0.5", 50051));
        assert_eq!(a.dp_rank, Some(1));
        assert!(!a.tls);
        assert!(!WorkerAddress::parse("http://p:1").unwrap().is_grpc());
        assert_eq!(
            WorkerAddress::parse("grpc://[::1]:7/").unwrap().authority,
            "[::1]:7"
        );
    }
}
