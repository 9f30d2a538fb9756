//! Pair selection: the prefill policy picks among available prefill workers that have an
//! available compatible decode; the decode policy then picks among that prefill's compatible
//! decodes. Each leg has its own policy instance.

use std::sync::Arc;

use crate::config::{self, GatewayConfig, PolicyKind};
use crate::metrics::{HTTP, METRICS};
use crate::policy::{self, Candidate, Policy, PolicyLeg, PolicyName, PolicyParams, RoutingInput};

use super::registry::Snapshot;
use super::worker::{Status, Worker};
use crate::config::WorkerType;

/// One policy instance per leg (their state — rotation, trees, pins — is per leg).
pub struct LegPolicies {
    pub prefill: Arc<dyn Policy>,
    pub decode: Arc<dyn Policy>,
}

impl LegPolicies {
    /// Tells the policy of the worker's leg that it joined (hash rings add its points).
    pub fn worker_added(&self, w: &Worker) {
        match w.role() {
            WorkerType::Prefill => self.prefill.on_worker_added(w.url()),
            WorkerType::Decode => self.decode.on_worker_added(w.url()),
            _ => {}
        }
    }

    /// Tells the policy of the worker's leg that it left (trees, pins and ring points go).
    pub fn worker_removed(&self, w: &Worker) {
        match w.role() {
            WorkerType::Prefill => self.prefill.on_worker_removed(w.url()),
            WorkerType::Decode => self.decode.on_worker_removed(w.url()),
            _ => {}
        }
    }

    /// Whether either leg's policy wants the prompt text extracted.
    pub fn needs_text(&self) -> bool {
        self.prefill.needs_text() || self.decode.needs_text()
    }
}

/// A chosen prefill/decode pair.
#[derive(Clone)]
pub struct Pair {
    pub prefill: Arc<Worker>,
    pub decode: Arc<Worker>,
}

/// Why no pair could be chosen. Every variant is answered 503.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SelectError {
    /// No worker of that role serves the model at all.
    NoWorkers(WorkerType),
    /// Workers exist but none is available (unhealthy, draining or circuit open).
    NoneAvailable(WorkerType),
    /// The leg's policy declined to pick.
    PolicyDeclined(WorkerType, &'static str),
}

impl SelectError {
    /// The client-facing message; it names the leg (spec: "Over HTTP, the message names the leg").
    pub fn message(&self) -> String {
        match self {
            SelectError::NoWorkers(r) => format!(
                "No {leg} workers available. Please check if {leg} servers are configured and healthy.",
                leg = r.as_str()
            ),
            SelectError::NoneAvailable(r) => format!(
                "No available {} workers (all circuits open or unhealthy)",
                r.as_str()
            ),
            SelectError::PolicyDeclined(r, p) => {
                format!("Policy {p} failed to select a {} worker", r.as_str())
            }
        }
    }
}

/// A worker may take new requests: ready (not draining) and its circuit breaker lets it.
pub fn is_available(w: &Worker) -> bool {
    w.status() == Status::Ready && w.breaker.allows()
}

/// Whether a prefill may hand its KV to a decode. Everything pairs until pairing descriptors
/// are computed (worker-lifecycle issue); kept as the single place that decides.
pub fn compatible(_prefill: &Worker, _decode: &Worker) -> bool {
    true
}

/// Chooses a pair for one attempt. `model_label` only feeds the selection metric.
pub fn select_pair(
    snap: &Snapshot,
    model: Option<&str>,
    policies: &LegPolicies,
    input: &RoutingInput<'_>,
    model_label: &str,
) -> Result<Pair, SelectError> {
    let prefill_pool: Vec<&Arc<Worker>> =
        snap.prefills.iter().filter(|w| w.serves(model)).collect();
    if prefill_pool.is_empty() {
        return Err(SelectError::NoWorkers(WorkerType::Prefill));
    }
    let decode_pool: Vec<&Arc<Worker>> = snap.decodes.iter().filter(|w| w.serves(model)).collect();
    if decode_pool.is_empty() {
        return Err(SelectError::NoWorkers(WorkerType::Decode));
    }
    let decodes: Vec<&Arc<Worker>> = decode_pool
        .into_iter()
        .filter(|w| is_available(w))
        .collect();
    let prefills: Vec<&Arc<Worker>> = prefill_pool
        .into_iter()
        .filter(|w| is_available(w))
        .collect();
    if prefills.is_empty() {
        return Err(SelectError::NoneAvailable(WorkerType::Prefill));
    }
    if decodes.is_empty() {
        return Err(SelectError::NoneAvailable(WorkerType::Decode));
    }
    let pairable: Vec<&Arc<Worker>> = prefills
        .into_iter()
        .filter(|p| decodes.iter().any(|d| compatible(p, d)))
        .collect();
    if pairable.is_empty() {
        return Err(SelectError::NoneAvailable(WorkerType::Decode));
    }

    let prefill = pick(&*policies.prefill, &pairable, input).ok_or(SelectError::PolicyDeclined(
        WorkerType::Prefill,
        policies.prefill.name(),
    ))?;
    let for_prefill: Vec<&Arc<Worker>> = decodes
        .into_iter()
        .filter(|d| compatible(&prefill, d))
        .collect();
    let decode = pick(&*policies.decode, &for_prefill, input).ok_or(
        SelectError::PolicyDeclined(WorkerType::Decode, policies.decode.name()),
    )?;

    METRICS
        .worker_selection
        .with_label_values(&["prefill", HTTP, model_label, policies.prefill.name()])
        .inc();
    METRICS
        .worker_selection
        .with_label_values(&["decode", HTTP, model_label, policies.decode.name()])
        .inc();
    Ok(Pair { prefill, decode })
}

fn pick(
    policy: &dyn Policy,
    list: &[&Arc<Worker>],
    input: &RoutingInput<'_>,
) -> Option<Arc<Worker>> {
    let cands: Vec<Candidate<'_>> = list
        .iter()
        .map(|w| Candidate {
            url: w.url(),
            in_flight: w.in_flight(),
            load: None,
        })
        .collect();
    let idx = policy.select(&cands, input)?;
    let chosen = cands.get(idx)?;
    policy.on_selected(chosen, input);
    Some(list[idx].clone())
}

impl LegPolicies {
    /// One fresh instance per leg from the effective `--prefill-policy` / `--decode-policy`.
    pub fn from_config(cfg: &GatewayConfig) -> Result<LegPolicies, String> {
        let params = policy_params(cfg);
        let name = |k: PolicyKind| k.as_str().parse::<PolicyName>();
        Ok(LegPolicies {
            prefill: policy::build(
                name(cfg.effective_prefill_policy())?,
                PolicyLeg::Prefill,
                &params,
            )?,
            decode: policy::build(
                name(cfg.effective_decode_policy())?,
                PolicyLeg::Decode,
                &params,
            )?,
        })
    }
}

/// The policy tunables of the config, in the policy module's terms.
fn policy_params(cfg: &GatewayConfig) -> PolicyParams {
    let d = PolicyParams::default();
    PolicyParams {
        cache_threshold: f64::from(cfg.cache_threshold),
        balance_abs_threshold: cfg.balance_abs_threshold,
        balance_rel_threshold: f64::from(cfg.balance_rel_threshold),
        balance_token_usage_threshold: f64::from(cfg.balance_token_usage_threshold),
        overload_token_usage_threshold: f64::from(cfg.overload_token_usage_threshold),
        overlap_decay: f64::from(cfg.overlap_decay),
        selection_temperature: f64::from(cfg.selection_temperature),
        eviction_interval_secs: cfg.eviction_interval,
        max_tree_size: cfg.max_tree_size,
        block_size: cfg.block_size,
        cache_ttl_secs: cfg.cache_ttl_secs,
        cache_boundaries: cfg.cache_boundaries.clone(),
        prefix_token_count: cfg.prefix_token_count,
        prefix_hash_load_factor: cfg.prefix_hash_load_factor,
        prefix_hash_balance_abs_threshold: cfg.prefix_hash_balance_abs_threshold,
        least_load_kv_pressure_weight: cfg.least_load_kv_pressure_weight,
        least_load_default_throughput: cfg.least_load_default_throughput,
        least_load_mean_prefill_tokens: f64::from(cfg.least_load_mean_prefill_tokens),
        least_load_max_waiting_requests: u64::from(cfg.least_load_max_waiting_requests),
        assignment_mode: match cfg.assignment_mode {
            None => d.assignment_mode,
            Some(config::AssignmentMode::Random) => policy::AssignmentMode::Random,
            Some(config::AssignmentMode::MinLoad) => policy::AssignmentMode::MinLoad,
            Some(config::AssignmentMode::MinGroup) => policy::AssignmentMode::MinGroup,
            Some(config::AssignmentMode::Delegate) => policy::AssignmentMode::Delegate,
        },
        max_idle_secs: cfg.max_idle_secs,
        ..d
    }
}
