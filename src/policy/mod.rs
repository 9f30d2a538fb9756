//! Routing policies: which worker of one leg (prefill or decode) gets a request.
//!
//! This module owns pure selection logic: no I/O, no Pingora types, no `.await`. Each policy lives
//! in its own file behind the [`Policy`] trait, and [`build`] makes one fresh instance per leg so a
//! stateful policy (round-robin counter, radix tree, sticky map) keeps separate state per leg, as
//! SMG does (`research/http-pd-spec.md` §5, spec "Per-Phase Policies").
//!
//! The caller passes the leg's *available* workers (ready, breaker not open, not overloaded) in
//! registration order on every call; policies never see unavailable workers and never keep
//! references to the slice.
//!
//! # Time
//! No policy spawns a thread. Periodic work runs lazily from `select` / `on_selected` once its
//! interval has elapsed (manual's idle-key sweep every `eviction_interval_secs`, one shard at a
//! time; bucket's boundary rebalance every `bucket_adjust_interval_secs`). The caller may also call
//! [`Policy::maintain`] from a background task to do that work off the request path.
//!
//! # Membership
//! The hash rings (`consistent_hashing`, `prefix_hash`) keep every URL they have seen until
//! [`Policy::on_worker_removed`]. They learn new URLs from [`Policy::on_worker_added`] and, as a
//! safety net, from the candidate lists themselves (a full check when the list length changes,
//! otherwise one candidate per call), so a worker the caller forgot to announce still gets traffic.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;

use rand::Rng;
use serde::{Deserialize, Serialize};

mod bench;
mod bucket;
mod cache_aware;
mod consistent_hashing;
mod hash;
mod least_load;
mod manual;
mod passthrough;
mod power_of_two;
mod prefix_hash;
mod radix_tree;
mod random;
mod ring;
mod round_robin;
mod worker_ids;

/// The fixed, seedless hash of ring positions, for other placements that must agree across
/// restarts and replicas (EPD's encode placement).
pub(crate) use hash::FastBuild as FixedHash;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;

pub use bench::{bench_report, BenchCase, BenchConfig};

/// One routing policy instance, owned by one leg.
pub trait Policy: Send + Sync {
    /// SMG's name of the policy (`round_robin`, …), used as the metric label.
    fn name(&self) -> &'static str;

    /// Pick one of `candidates` (all currently available workers of this leg, in registration
    /// order). Returns an index into `candidates`, or `None` when the policy declines (empty
    /// candidates, or `consistent_hashing` with an invalid `X-SMG-Target-Worker`); the caller
    /// answers that with 503 and may retry.
    fn select(&self, candidates: &[Candidate<'_>], input: &RoutingInput<'_>) -> Option<usize>;

    /// Called once the pick is dispatched: cache_aware inserts the prompt under the worker, manual
    /// pins the key, bucket records the prompt length.
    fn on_selected(&self, _chosen: &Candidate<'_>, _input: &RoutingInput<'_>) {}

    /// A worker joined the fleet (startup or `POST /workers`). Rings add its points at once;
    /// other policies learn workers from the candidate lists.
    fn on_worker_added(&self, _url: &str) {}

    /// A worker left the fleet: forget its tree ownership, sticky pins, ring points, buckets.
    fn on_worker_removed(&self, _url: &str) {}

    /// Whether this policy needs the prompt text (or token ids) extracted from the body.
    fn needs_text(&self) -> bool {
        false
    }

    /// Run due periodic work now (see the module doc, "Time"). Cheap when nothing is due.
    fn maintain(&self, _now: Instant) {}
}

/// One available worker as a policy sees it.
#[derive(Clone, Copy, Debug)]
pub struct Candidate<'a> {
    pub url: &'a str,
    /// Requests the gateway has in flight to this worker (`smg_worker_requests_active`): live,
    /// unlike `load`. The load-based policies weigh it on top of the report (least_load's doc).
    pub in_flight: usize,
    /// The engine's latest load report, `None` when it has none or the report is stale.
    pub load: Option<&'a EngineLoad>,
}

/// An engine load report (load monitor, spec §3.8), summed over DP ranks where that applies.
#[derive(Clone, Debug, Default)]
pub struct EngineLoad {
    pub waiting_requests: u64,
    pub running_requests: u64,
    /// Mean KV-cache usage, 0..1.
    pub token_usage: f64,
    /// Prompt tokens queued and not yet cached (SGLang `num_waiting_uncached_tokens`).
    pub waiting_uncached_tokens: Option<u64>,
    /// Generation throughput, tokens/s.
    pub gen_throughput: Option<f64>,
}

/// What a policy may look at in the request. All borrowed; nothing is copied per request.
#[derive(Clone, Copy, Debug, Default)]
pub struct RoutingInput<'a> {
    /// The prompt text (only extracted when some leg's policy [`Policy::needs_text`]).
    pub text: Option<&'a str>,
    /// Prompt token ids (`/generate` with `input_ids`).
    pub token_ids: Option<&'a [u32]>,
    /// `x-smg-routing-key` (validated by the caller: non-empty UTF-8, ≤ 128 bytes).
    pub routing_key: Option<&'a str>,
    /// `X-SMG-Target-Worker`: an index into the leg's available list (consistent_hashing).
    pub target_worker: Option<&'a str>,
    /// `Authorization`, else `X-Forwarded-For`, else `Cookie` (consistent_hashing).
    pub implicit_key: Option<&'a str>,
    /// Prompt length in characters of the text, or tokens when only `token_ids` are given; 0 when
    /// unknown. bucket uses it and counts `text` itself only when it is 0.
    pub prompt_len: usize,
}

/// The leg a policy instance serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyLeg {
    Prefill,
    Decode,
}

/// `--assignment-mode`: how manual places a new or stale key.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum AssignmentMode {
    /// Uniform over the available workers (manual's default).
    #[default]
    Random,
    /// Fewest in-flight requests, ties random.
    MinLoad,
    /// Fewest keys pinned to the worker, ties random.
    MinGroup,
    /// Delegate to the leg policy; for manual that is min_load.
    Delegate,
}

impl AssignmentMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AssignmentMode::Random => "random",
            AssignmentMode::MinLoad => "min_load",
            AssignmentMode::MinGroup => "min_group",
            AssignmentMode::Delegate => "delegate",
        }
    }
}

impl FromStr for AssignmentMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "random" => Ok(AssignmentMode::Random),
            "min_load" => Ok(AssignmentMode::MinLoad),
            "min_group" => Ok(AssignmentMode::MinGroup),
            "delegate" => Ok(AssignmentMode::Delegate),
            other => Err(format!(
                "unknown assignment mode '{other}' (expected random, min_load, min_group or delegate)"
            )),
        }
    }
}

/// `--cache-index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum CacheIndex {
    #[default]
    Tree,
    Hash,
}

/// Every policy tunable from spec §5, with SMG's CLI defaults. Both legs share one set.
#[derive(Clone, Debug)]
pub struct PolicyParams {
    /// cache_aware: matched share of the prompt above which the prefix owner is preferred.
    pub cache_threshold: f64,
    /// cache_aware spill gate / bucket imbalance, absolute part.
    pub balance_abs_threshold: usize,
    /// cache_aware spill gate / bucket imbalance, relative part (≥ 1.0).
    pub balance_rel_threshold: f64,
    /// cache_aware: hottest − coldest KV usage that abandons affinity; ≥ 1.0 is off.
    pub balance_token_usage_threshold: f64,
    /// cache_aware: hottest KV usage that abandons affinity; ≥ 1.0 is off.
    pub overload_token_usage_threshold: f64,
    /// Accepted for flag compatibility; not applied (see cache_aware's doc).
    pub overlap_decay: f64,
    /// Accepted for flag compatibility; not applied (see cache_aware's doc).
    pub selection_temperature: f64,
    /// Seconds between manual's idle-key sweeps (cache_aware evicts inline, see its doc).
    pub eviction_interval_secs: u64,
    /// cache_aware: maximum tree size, in characters (bytes) or tokens.
    pub max_tree_size: usize,
    /// Accepted for flag compatibility (gRPC token-tree page size); not used over HTTP.
    pub block_size: usize,
    /// Accepted for flag compatibility; only the tree index exists.
    pub cache_index: CacheIndex,
    /// Accepted for flag compatibility; not applied.
    pub cache_ttl_secs: u64,
    /// Accepted for flag compatibility; prefix_hash hashes one prefix length.
    pub cache_boundaries: Vec<usize>,
    /// prefix_hash: tokens hashed (or 4× as many bytes of text).
    pub prefix_token_count: usize,
    /// prefix_hash: a worker above `mean × factor` (and above `mean + abs`) is overloaded.
    pub prefix_hash_load_factor: f64,
    /// prefix_hash: absolute part of the overload bound.
    pub prefix_hash_balance_abs_threshold: usize,
    /// least_load: KV-pressure weight λ, seconds.
    pub least_load_kv_pressure_weight: f64,
    /// least_load: throughput (tokens/s) assumed when a worker reports none.
    pub least_load_default_throughput: f64,
    /// least_load: prefill tokens credited per request when the count is unknown (p̄), for queued
    /// requests and for each request the gateway has in flight.
    pub least_load_mean_prefill_tokens: f64,
    /// least_load: skip workers reporting at least this many waiting requests; 0 is off.
    pub least_load_max_waiting_requests: u64,
    /// manual: how a new or stale key is placed.
    pub assignment_mode: AssignmentMode,
    /// manual: sticky keys idle longer than this are forgotten.
    pub max_idle_secs: u64,
    /// bucket: seconds between boundary rebalances; also the length of the sliding window.
    pub bucket_adjust_interval_secs: u64,
    /// consistent_hashing / prefix_hash: ring points per worker URL.
    pub virtual_nodes: usize,
}

impl Default for PolicyParams {
    fn default() -> Self {
        PolicyParams {
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
            balance_token_usage_threshold: 1.0,
            overload_token_usage_threshold: 1.0,
            overlap_decay: 0.0,
            selection_temperature: 0.0,
            eviction_interval_secs: crate::config::defaults::EVICTION_INTERVAL_SECS,
            max_tree_size: 67_108_864,
            block_size: 16,
            cache_index: CacheIndex::Tree,
            cache_ttl_secs: 180,
            cache_boundaries: Vec::new(),
            prefix_token_count: 256,
            prefix_hash_load_factor: 1.25,
            prefix_hash_balance_abs_threshold: 10,
            least_load_kv_pressure_weight: 0.15,
            least_load_default_throughput: 2000.0,
            least_load_mean_prefill_tokens: 1024.0,
            least_load_max_waiting_requests: 0,
            assignment_mode: AssignmentMode::Random,
            max_idle_secs: 14_400,
            bucket_adjust_interval_secs: 5,
            virtual_nodes: 150,
        }
    }
}

/// A policy name as SMG spells it (flags, YAML, the `policy` metric label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum PolicyName {
    CacheAware,
    PrefixHash,
    ConsistentHashing,
    PowerOfTwo,
    LeastLoad,
    RoundRobin,
    Random,
    Manual,
    Bucket,
    /// `--policy passthrough`: the first available worker (not accepted per leg by SMG's flags;
    /// the config module enforces that).
    Passthrough,
}

impl PolicyName {
    pub const ALL: [PolicyName; 10] = [
        PolicyName::CacheAware,
        PolicyName::PrefixHash,
        PolicyName::ConsistentHashing,
        PolicyName::PowerOfTwo,
        PolicyName::LeastLoad,
        PolicyName::RoundRobin,
        PolicyName::Random,
        PolicyName::Manual,
        PolicyName::Bucket,
        PolicyName::Passthrough,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyName::CacheAware => "cache_aware",
            PolicyName::PrefixHash => "prefix_hash",
            PolicyName::ConsistentHashing => "consistent_hashing",
            PolicyName::PowerOfTwo => "power_of_two",
            PolicyName::LeastLoad => "least_load",
            PolicyName::RoundRobin => "round_robin",
            PolicyName::Random => "random",
            PolicyName::Manual => "manual",
            PolicyName::Bucket => "bucket",
            PolicyName::Passthrough => "passthrough",
        }
    }
}

impl std::fmt::Display for PolicyName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PolicyName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        PolicyName::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = PolicyName::ALL.iter().map(|p| p.as_str()).collect();
                format!(
                    "unknown policy '{s}' (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

/// One fresh instance for one leg. Err when the policy is not allowed on that leg (bucket on
/// decode, as SMG refuses `--decode-policy bucket` at startup).
pub fn build(
    name: PolicyName,
    leg: PolicyLeg,
    params: &PolicyParams,
) -> Result<Arc<dyn Policy>, String> {
    let policy: Arc<dyn Policy> = match name {
        PolicyName::CacheAware => Arc::new(cache_aware::CacheAware::new(params)),
        PolicyName::PrefixHash => Arc::new(prefix_hash::PrefixHash::new(params)),
        PolicyName::ConsistentHashing => {
            Arc::new(consistent_hashing::ConsistentHashing::new(params))
        }
        PolicyName::PowerOfTwo => Arc::new(power_of_two::PowerOfTwo::new()),
        PolicyName::LeastLoad => Arc::new(least_load::LeastLoad::new(params)),
        PolicyName::RoundRobin => Arc::new(round_robin::RoundRobin::new()),
        PolicyName::Random => Arc::new(random::Random),
        PolicyName::Manual => Arc::new(manual::Manual::new(params)),
        PolicyName::Bucket => {
            if leg == PolicyLeg::Decode {
                return Err(
                    "bucket is a prefill-only policy; it cannot be the decode policy".into(),
                );
            }
            Arc::new(bucket::Bucket::new(params))
        }
        PolicyName::Passthrough => Arc::new(passthrough::Passthrough),
    };
    Ok(policy)
}

/// Index of the minimum of `key(0..n)`, ties broken uniformly at random; `None` when `n == 0`.
/// Two passes (find the minimum and count its ties, then take the r-th tie) so a fleet of idle
/// workers costs one random draw, not one per tie.
pub(crate) fn argmin_random_ties<K: PartialOrd + Copy>(
    n: usize,
    key: impl Fn(usize) -> K,
) -> Option<usize> {
    if n == 0 {
        return None;
    }
    let mut best = key(0);
    let mut first = 0;
    let mut ties = 1usize;
    for i in 1..n {
        let k = key(i);
        if k < best {
            best = k;
            first = i;
            ties = 1;
        } else if k == best {
            ties += 1;
        }
    }
    if ties == 1 {
        return Some(first);
    }
    let mut nth = rand::thread_rng().gen_range(0..ties);
    for i in first..n {
        if key(i) == best {
            if nth == 0 {
                return Some(i);
            }
            nth -= 1;
        }
    }
    Some(first)
}

/// The candidate with the fewest gateway in-flight requests, ties random.
pub(crate) fn least_in_flight(candidates: &[Candidate<'_>]) -> Option<usize> {
    argmin_random_ties(candidates.len(), |i| candidates[i].in_flight)
}
