//! Faithful CPU-only mock SGLang, vLLM and TokenSpeed engines for pdgate's tests.
//!
//! A prefill/decode pair of mocks really rendezvous — SGLang / TokenSpeed bootstrap rooms with a
//! real bootstrap server and KV push, vLLM `kv_transfer_params` with NIXL-style block reads,
//! Mooncake pushes and MoRI-IO — so a gateway bug in the handoff fails a test the way a real
//! engine would: an error, a hang until the engine's timeout, or silently wrong output. Output
//! comes from a deterministic fake model ([`fake_model`]): a correct PD handoff reproduces a
//! single worker's output exactly. Each engine speaks its HTTP API or ([`Transport::Grpc`]) its
//! gRPC servicer over the same core. See the crate README for the emulated behaviour and its
//! sources.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use mock_engine::{client, output, EngineKind, MockEngine, MockEngineConfig, Role};
//! let p = MockEngine::spawn(MockEngineConfig::test(EngineKind::Sglang, Role::Prefill, [127, 0, 0, 2])).await?;
//! let d = MockEngine::spawn(MockEngineConfig::test(EngineKind::Sglang, Role::Decode, [127, 0, 0, 3])).await?;
//! let body = serde_json::json!({"text": "hi", "bootstrap_host": p.host(),
//!     "bootstrap_port": p.bootstrap_port(), "bootstrap_room": 42u64});
//! let (pr, dr) = tokio::join!(client::post_json(&format!("{}/generate", p.api_url()), &body),
//!                             client::post_json(&format!("{}/generate", d.api_url()), &body));
//! let out = output::extract("/generate", false, &dr?.body).unwrap();
//! assert!(p.wait_idle(std::time::Duration::from_secs(1)).await);
//! # let _ = (pr, out); Ok(()) }
//! ```

pub mod client;
pub mod config;
mod engine;
pub mod fake_model;
mod grpc;
mod job;
pub mod kube_api;
pub mod otlp;
pub mod output;
pub mod records;
mod render;
mod server;
mod sglang;
pub mod vision;
mod vllm;

use std::io;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

pub use config::{
    Connector, EngineKind, Fault, FaultMatch, GrpcCode, GrpcOptions, LoadFailurePolicy,
    MalformedParams, MockEngineConfig, Role, Transport,
};
pub use engine::{wait_until, LoadReport, RoomInfo};
pub use fake_model::{OutputVocab, RefOutput, SamplingSpec};
pub use grpc::{code_name, struct_to_json, wire_output_ids};
pub use records::{
    AbortRecord, EncodeRecord, GrpcBootstrap, GrpcRequest, GrpcSampling, Handoff, ItemHandoff,
    LegacyKvParams, MmRecord, Outcome, ParsedFields, RequestRecord, Stats,
};
pub use vision::{feature_of_rgb, MockVision, PixelLayout};

/// A running mock engine. Dropping the handle kills it (listeners and connections closed).
pub struct MockEngine {
    shared: Arc<engine::Shared>,
}

impl MockEngine {
    /// Binds the engine's listeners (API, KV data plane, and per role/engine the bootstrap server
    /// and side channels) and starts serving. A SGLang prefill has registered its ranks with its
    /// own bootstrap server before this returns.
    pub async fn spawn(cfg: MockEngineConfig) -> io::Result<MockEngine> {
        Ok(MockEngine {
            shared: engine::start(cfg).await?,
        })
    }

    /// `http://ip:port` of the API listener: the HTTP routes, or (gRPC transport) the endpoint
    /// a tonic client connects to.
    pub fn api_url(&self) -> String {
        format!("http://{}", self.shared.api_addr)
    }

    /// `grpc://ip:port` of a gRPC engine (what a gateway registers); `None` over HTTP.
    pub fn grpc_url(&self) -> Option<String> {
        (self.shared.cfg.transport == Transport::Grpc)
            .then(|| format!("grpc://{}", self.shared.api_addr))
    }

    /// `http://ip:port` of the control plane (`/mock/*`, `/metrics`): the API port over HTTP,
    /// a second port for a gRPC engine.
    pub fn control_url(&self) -> String {
        format!(
            "http://{}",
            self.shared.control_addr.unwrap_or(self.shared.api_addr)
        )
    }

    pub fn transport(&self) -> Transport {
        self.shared.cfg.transport
    }

    /// The bind IP as a string (what a gateway puts in `bootstrap_host`).
    pub fn host(&self) -> String {
        self.shared.api_addr.ip().to_string()
    }

    pub fn port(&self) -> u16 {
        self.shared.api_addr.port()
    }

    /// SGLang bootstrap / vLLM Mooncake bootstrap port (prefill only).
    pub fn bootstrap_port(&self) -> Option<u16> {
        self.shared.bootstrap_addr.map(|a| a.port())
    }

    /// vLLM NIXL / MoRI handshake side-channel port.
    pub fn side_channel_port(&self) -> Option<u16> {
        self.shared.side_addr.map(|a| a.port())
    }

    /// MoRI-IO notify port.
    pub fn notify_port(&self) -> Option<u16> {
        self.shared.notify_addr.map(|a| a.port())
    }

    /// The mock KV data-plane port (SGLang `rank_port`).
    pub fn data_port(&self) -> u16 {
        self.shared.data_addr.port()
    }

    /// The KV engine id (changes on `restart()` unless pinned in the config).
    pub fn engine_id(&self) -> String {
        self.shared.engine_id()
    }

    pub fn config(&self) -> &MockEngineConfig {
        &self.shared.cfg
    }

    /// Every model-route request (HTTP) or `Generate` call (gRPC) received so far
    /// (`GET /mock/requests`).
    pub fn records(&self) -> Vec<RequestRecord> {
        self.shared.recorder.all()
    }

    /// Every gRPC `Abort` received so far, with the calls it ended (`GET /mock/aborts`).
    pub fn aborts(&self) -> Vec<AbortRecord> {
        self.shared.grpc.aborts()
    }

    /// The sampling spec this engine starts every request from (its output vocabulary and
    /// natural EOS period): set the request's knobs on it and pass it to [`Self::reference`].
    pub fn sampling_spec(&self) -> SamplingSpec {
        self.shared.cfg.sampling_spec()
    }

    /// What a single worker of this engine's model generates for `prompt_ids` (sample `None`
    /// for `n = 1`, `Some(i)` for sample `i` of `n > 1`).
    pub fn reference(
        &self,
        prompt_ids: &[u32],
        spec: &SamplingSpec,
        sample: Option<usize>,
    ) -> RefOutput {
        fake_model::reference(&self.shared.cfg.model, prompt_ids, spec, sample)
    }

    /// Open rendezvous rooms / pinned transfers (`GET /mock/rooms`).
    /// [`MockEngine::reference`] for a prompt with images: `items` are the placeholder ranges
    /// (prompt positions) with the features of their images ([`feature_of_rgb`]), in prompt
    /// order.
    pub fn reference_with_media(
        &self,
        prompt_ids: &[u32],
        items: &[(std::ops::Range<usize>, u64)],
        spec: &SamplingSpec,
        sample: Option<usize>,
    ) -> RefOutput {
        fake_model::reference_with_media(&self.shared.cfg.model, prompt_ids, items, spec, sample)
    }

    pub fn rooms(&self) -> Vec<RoomInfo> {
        self.shared.rooms()
    }

    /// `GET /mock/stats`.
    pub fn stats(&self) -> Stats {
        engine::stats(&self.shared)
    }

    /// Pinned prefill KV blocks (vLLM; `GET /mock/pinned`).
    pub fn pinned(&self) -> Vec<Value> {
        self.shared.vllm.pinned_list()
    }

    /// Forces the load the engine reports on `/v1/loads` and `/metrics` (`None`: the live one).
    pub fn report_load(&self, report: Option<LoadReport>) {
        *self
            .shared
            .load_override
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = report;
    }

    /// Activates a fault (`POST /mock/faults`).
    pub async fn inject(&self, f: Fault) {
        engine::inject(&self.shared, f).await;
    }

    /// Clears faults and records, and brings a downed bootstrap listener back (`POST /mock/reset`).
    pub async fn reset(&self) {
        engine::reset(&self.shared).await;
    }

    /// vLLM: restart the engine in place — a new engine id (unless pinned), pinned KV dropped,
    /// a crashed engine alive again, Mooncake re-registered (`POST /mock/restart`).
    pub async fn restart(&self) {
        vllm::restart(&self.shared).await;
    }

    /// Abruptly stops the engine like a crashed process: listeners and open connections close,
    /// in-flight requests vanish without notifying peers.
    pub fn kill(&self) {
        engine::kill(&self.shared);
    }

    /// Stops the engine.
    pub async fn shutdown(self) {
        engine::kill(&self.shared);
    }

    /// Polls `pred` until it holds or `deadline` passes.
    pub async fn wait_for(
        &self,
        deadline: Duration,
        mut pred: impl FnMut(&MockEngine) -> bool,
    ) -> bool {
        wait_until(deadline, || pred(self)).await
    }

    /// Waits until no request is in flight and no room is open.
    pub async fn wait_idle(&self, deadline: Duration) -> bool {
        self.wait_for(deadline, |e| {
            e.rooms().is_empty() && e.stats().requests_in_flight == 0
        })
        .await
    }

    /// Waits until `n` requests have been recorded and all of them finished.
    pub async fn wait_records(&self, n: usize, deadline: Duration) -> Vec<RequestRecord> {
        self.wait_for(deadline, |e| {
            let r = e.records();
            r.len() >= n && r.iter().all(RequestRecord::is_done)
        })
        .await;
        self.records()
    }

    /// A `POST /workers` body registering this engine with a gateway (`url` is `grpc://…` for
    /// a gRPC engine; a prefill adds its `bootstrap_port`).
    pub fn worker_spec(&self) -> Value {
        let cfg = &self.shared.cfg;
        let worker_type = match cfg.role {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Both => "regular",
            Role::Encode => "encode",
        };
        let url = self.grpc_url().unwrap_or_else(|| self.api_url());
        let mut spec =
            json!({"url": url, "worker_type": worker_type, "runtime_type": cfg.engine.as_str()});
        let mut labels = serde_json::Map::new();
        if matches!(cfg.role, Role::Prefill | Role::Encode) {
            if let Some(p) = self.bootstrap_port() {
                spec["bootstrap_port"] = json!(p);
            }
        }
        match cfg.engine {
            EngineKind::Sglang | EngineKind::TokenSpeed => {
                labels.insert(
                    "disaggregation_transfer_backend".into(),
                    json!(cfg.connector.as_str()),
                );
            }
            EngineKind::Vllm => {
                let name = match cfg.connector {
                    Connector::Nixl => Some("NixlConnector"),
                    Connector::Mooncake => Some("MooncakeConnector"),
                    Connector::MoriioRead | Connector::MoriioWrite => Some("MoRIIOConnector"),
                    _ => None,
                };
                if let Some(n) = name {
                    spec["kv_connector"] = json!(n);
                    labels.insert("kv_connector".into(), json!(n));
                }
                if cfg.connector == Connector::Mooncake || cfg.engine_id.is_some() {
                    spec["kv_engine_id"] = json!(self.engine_id());
                    labels.insert("kv_engine_id".into(), json!(self.engine_id()));
                }
                if matches!(
                    cfg.connector,
                    Connector::MoriioRead | Connector::MoriioWrite
                ) {
                    let mode = if cfg.connector == Connector::MoriioRead {
                        "read"
                    } else {
                        "write"
                    };
                    labels.insert("moriio_mode".into(), json!(mode));
                    labels.insert("moriio_host".into(), json!(self.host()));
                    if let Some(p) = self.side_channel_port() {
                        labels.insert("moriio_handshake_port".into(), json!(p.to_string()));
                    }
                    if let Some(p) = self.notify_port() {
                        labels.insert("moriio_notify_port".into(), json!(p.to_string()));
                    }
                }
            }
        }
        if !labels.is_empty() {
            spec["labels"] = Value::Object(labels);
        }
        spec
    }
}

impl Drop for MockEngine {
    fn drop(&mut self) {
        engine::kill(&self.shared);
    }
}

/// A set of prefill and decode engines on distinct loopback IPs (prefill i on `127.0.1.{i+1}`,
/// decode j on `127.0.2.{j+1}`), all with ephemeral ports.
pub struct MockFleet {
    pub prefills: Vec<MockEngine>,
    pub decodes: Vec<MockEngine>,
}

impl MockFleet {
    /// Spawns `n_prefill` prefills and `n_decode` decodes from `template` (role and IP replaced).
    pub async fn pd(
        n_prefill: usize,
        n_decode: usize,
        template: MockEngineConfig,
    ) -> io::Result<MockFleet> {
        let mut prefills = Vec::new();
        for i in 0..n_prefill {
            let cfg = MockEngineConfig {
                role: Role::Prefill,
                bind_ip: [127, 0, 1, (i + 1) as u8].into(),
                ..template.clone()
            };
            prefills.push(MockEngine::spawn(cfg).await?);
        }
        let mut decodes = Vec::new();
        for j in 0..n_decode {
            let cfg = MockEngineConfig {
                role: Role::Decode,
                bind_ip: [127, 0, 2, (j + 1) as u8].into(),
                ..template.clone()
            };
            decodes.push(MockEngine::spawn(cfg).await?);
        }
        Ok(MockFleet { prefills, decodes })
    }

    /// `POST /workers` bodies for every engine (prefills first).
    pub fn worker_specs(&self) -> Vec<Value> {
        self.prefills
            .iter()
            .chain(&self.decodes)
            .map(MockEngine::worker_spec)
            .collect()
    }

    /// Waits until every engine is idle (no rooms, nothing in flight).
    pub async fn wait_idle(&self, deadline: Duration) -> bool {
        for e in self.prefills.iter().chain(&self.decodes) {
            if !e.wait_idle(deadline).await {
                return false;
            }
        }
        true
    }
}
