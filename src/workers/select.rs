//! Pair selection: the prefill policy picks among available prefill workers that have an
//! available compatible decode; the decode policy then picks among that prefill's compatible
//! decodes. Each leg has its own policy instance.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::config::GatewayConfig;
use crate::metrics::METRICS;
use crate::policy::{self, Candidate, EngineLoad, Policy, PolicyLeg, PolicyParams, RoutingInput};
use pdgate_filters::errors::ErrorCode;

use super::pairing::{compatible, Descriptor};
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
    /// Available workers on both legs, but no prefill pairs with an available decode.
    NoCompatiblePair(String),
    /// Every available worker of the leg is overloaded (load monitor).
    Overloaded(WorkerType),
}

impl SelectError {
    /// The catalogue code this refusal is answered with.
    pub fn code(&self) -> ErrorCode {
        match self {
            SelectError::NoCompatiblePair(_) => ErrorCode::NoCompatiblePdPair,
            SelectError::Overloaded(_) => ErrorCode::WorkerOverloadProtectionShed,
            _ => ErrorCode::NoAvailableWorkers,
        }
    }

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
            SelectError::NoCompatiblePair(msg) => msg.clone(),
            SelectError::Overloaded(r) => {
                format!("All {} workers for this model are overloaded", r.as_str())
            }
        }
    }
}

/// Per-request lists over one leg's workers: on the stack up to this many workers.
const INLINE: usize = 16;
type Marks = SmallVec<[bool; INLINE]>;
type List<T> = SmallVec<[T; INLINE]>;

/// A worker may take new requests: ready (not draining) and its circuit breaker lets it.
pub fn is_available(w: &Worker) -> bool {
    w.status() == Status::Ready && w.breaker.allows()
}

/// Chooses a pair for one attempt. `model_label` only feeds the selection metric.
///
/// The prefill policy runs over the available prefills that have at least one available
/// compatible decode; the decode policy then runs over that prefill's compatible decodes.
pub fn select_pair(
    snap: &Snapshot,
    model: Option<&str>,
    policies: &LegPolicies,
    input: &RoutingInput<'_>,
    model_label: &str,
) -> Result<Pair, SelectError> {
    let serving = |w: &Arc<Worker>| w.serves(model);
    if !snap.prefills.iter().any(serving) {
        return Err(SelectError::NoWorkers(WorkerType::Prefill));
    }
    if !snap.decodes.iter().any(serving) {
        return Err(SelectError::NoWorkers(WorkerType::Decode));
    }
    let mut decode_ok: Marks = snap
        .decodes
        .iter()
        .map(|d| serving(d) && is_available(d))
        .collect();
    let mut prefill_ok: Marks = snap
        .prefills
        .iter()
        .map(|p| serving(p) && is_available(p))
        .collect();
    if !prefill_ok.iter().any(|ok| *ok) {
        return Err(SelectError::NoneAvailable(WorkerType::Prefill));
    }
    if !decode_ok.iter().any(|ok| *ok) {
        return Err(SelectError::NoneAvailable(WorkerType::Decode));
    }
    // Overload protection: overloaded workers are skipped; a leg with nothing else is shed.
    shed_overloaded(&snap.decodes, &mut decode_ok, WorkerType::Decode)?;
    shed_overloaded(&snap.prefills, &mut prefill_ok, WorkerType::Prefill)?;
    // Link health: links out of selection are skipped — unless that leaves no pair at all, when
    // a degraded link beats a 503.
    let link_ok = |i: usize, d: usize| snap.prefills[i].links.usable(&snap.decodes[d].id);
    let pairable_with = |links: bool| -> List<usize> {
        (0..snap.prefills.len())
            .filter(|&i| {
                prefill_ok[i]
                    && snap.pairs[i]
                        .iter()
                        .any(|&d| decode_ok[d] && (!links || link_ok(i, d)))
            })
            .collect()
    };
    let mut by_links = true;
    let mut pairable = pairable_with(true);
    if pairable.is_empty() {
        by_links = false;
        pairable = pairable_with(false);
        if !pairable.is_empty() {
            log::debug!("every usable pair crosses a link out of selection: using them anyway");
        }
    }
    if pairable.is_empty() {
        return Err(SelectError::NoCompatiblePair(incompatibility(
            snap,
            &prefill_ok,
            &decode_ok,
        )));
    }

    let prefills: List<&Arc<Worker>> = pairable.iter().map(|&i| &snap.prefills[i]).collect();
    let chosen = pick(&*policies.prefill, &prefills, input).ok_or(SelectError::PolicyDeclined(
        WorkerType::Prefill,
        policies.prefill.name(),
    ))?;
    let prefill = prefills[chosen].clone();
    let decodes: List<&Arc<Worker>> = snap.pairs[pairable[chosen]]
        .iter()
        .filter(|&&d| decode_ok[d] && (!by_links || link_ok(pairable[chosen], d)))
        .map(|&d| &snap.decodes[d])
        .collect();
    let chosen = pick(&*policies.decode, &decodes, input).ok_or(SelectError::PolicyDeclined(
        WorkerType::Decode,
        policies.decode.name(),
    ))?;
    let decode = decodes[chosen].clone();

    // Pairing keeps both legs on one transport, so the prefill's mode is the pair's.
    let mode = prefill.connection_mode().as_str();
    METRICS.worker_selection.with(
        &["prefill", mode, model_label, policies.prefill.name()],
        |m| m.inc(),
    );
    METRICS.worker_selection.with(
        &["decode", mode, model_label, policies.decode.name()],
        |m| m.inc(),
    );
    Ok(Pair { prefill, decode })
}

fn shed_overloaded(
    workers: &[Arc<Worker>],
    ok: &mut Marks,
    leg: WorkerType,
) -> Result<(), SelectError> {
    for (ok, w) in ok.iter_mut().zip(workers) {
        *ok = *ok && !w.is_overloaded();
    }
    if ok.iter().any(|k| *k) {
        Ok(())
    } else {
        METRICS
            .worker_overload_shed
            .with_label_values(&["selection"])
            .inc();
        Err(SelectError::Overloaded(leg))
    }
}

/// The `no_compatible_pd_pair` message: the components that differ and both legs' keys, for
/// the first available prefill/decode combinations (also logged at warn).
fn incompatibility(snap: &Snapshot, prefill_ok: &[bool], decode_ok: &[bool]) -> String {
    let mut parts = Vec::new();
    'outer: for (p, _) in snap.prefills.iter().zip(prefill_ok).filter(|(_, ok)| **ok) {
        let pd = Descriptor::of(p);
        for (d, _) in snap.decodes.iter().zip(decode_ok).filter(|(_, ok)| **ok) {
            let dd = Descriptor::of(d);
            if let Err(diff) = compatible(snap.pairing_mode, &pd, &dd) {
                parts.push(format!(
                    "prefill {} [{}] and decode {} [{}] differ in {}",
                    p.url(),
                    pd.key(),
                    d.url(),
                    dd.key(),
                    diff.join(", ")
                ));
            }
            if parts.len() >= 4 {
                break 'outer;
            }
        }
    }
    let msg = format!(
        "No prefill worker shares a KV transfer protocol with an available decode worker (pd_pairing_mode {}): {}",
        snap.pairing_mode.as_str(),
        parts.join("; ")
    );
    log::warn!("{msg}");
    msg
}

/// Runs `policy` over `list`; the index of its pick (after telling it the pick was taken).
fn pick(policy: &dyn Policy, list: &[&Arc<Worker>], input: &RoutingInput<'_>) -> Option<usize> {
    // Filled in place: a `collect` builds its list and then returns it by value, a copy of the
    // whole inline array (528 bytes for the candidates; gdb, bench/README "fourteenth part").
    let mut loads: List<Option<Arc<EngineLoad>>> = List::new();
    loads.extend(list.iter().map(|w| w.load()));
    let mut cands: List<Candidate<'_>> = List::new();
    cands.extend(list.iter().zip(&loads).map(|(w, load)| Candidate {
        url: w.url(),
        in_flight: w.in_flight(),
        load: load.as_deref(),
    }));
    let idx = policy.select(&cands, input)?;
    let chosen = cands.get(idx)?;
    policy.on_selected(chosen, input);
    Some(idx)
}

impl LegPolicies {
    /// One fresh instance per leg from the effective `--prefill-policy` / `--decode-policy`.
    pub fn from_config(cfg: &GatewayConfig) -> Result<LegPolicies, String> {
        let params = policy_params(cfg);
        Ok(LegPolicies {
            prefill: policy::build(cfg.effective_prefill_policy(), PolicyLeg::Prefill, &params)?,
            decode: policy::build(cfg.effective_decode_policy(), PolicyLeg::Decode, &params)?,
        })
    }
}

impl LegPolicies {
    /// The policy tunables of a config (a reload rebuilds the policies only when these or the
    /// policy kinds changed).
    pub fn params_of(cfg: &GatewayConfig) -> PolicyParams {
        policy_params(cfg)
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
        assignment_mode: cfg.assignment_mode.unwrap_or(d.assignment_mode),
        max_idle_secs: cfg.max_idle_secs,
        ..d
    }
}
