//! Grouped, typed views of [`GatewayConfig`] for the parts of the gateway that own a concern
//! (retry loop, breakers, health checker, load monitor, legs, policies). They apply SMG's
//! fallbacks and turn seconds/milliseconds into `Duration`s, so no caller re-derives them.

use std::time::Duration;

use super::defaults;
use super::gateway::{AssignmentMode, CacheIndexKind, GatewayConfig};

/// Whole-pair retries (http-pd-spec §3.7).
#[derive(Clone, Debug, PartialEq)]
pub struct RetrySettings {
    /// Total attempts, the first included; 1 when retries are off.
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub backoff_multiplier: f32,
    /// Jitter as a fraction of the delay: the delay is drawn uniformly in ±`jitter_factor`·delay.
    pub jitter_factor: f32,
    /// Final statuses that trigger another attempt (unless the response is marked terminal).
    pub retryable_status_codes: Vec<u16>,
}

impl RetrySettings {
    pub fn enabled(&self) -> bool {
        self.max_attempts > 1
    }

    /// The delay before attempt `k + 1` (k counted from 0), before jitter:
    /// `min(initial · multiplier^k, max)`.
    pub fn base_backoff(&self, k: u32) -> Duration {
        let factor = f64::from(self.backoff_multiplier).powi(k.min(i32::MAX as u32) as i32);
        let millis = self.initial_backoff.as_secs_f64() * 1000.0 * factor;
        let capped = millis.min(self.max_backoff.as_secs_f64() * 1000.0);
        Duration::from_secs_f64(capped.max(0.0) / 1000.0)
    }

    pub fn is_retryable_status(&self, status: u16) -> bool {
        self.retryable_status_codes.contains(&status)
    }
}

/// Per-worker circuit breakers (http-pd-spec §3.6).
#[derive(Clone, Debug, PartialEq)]
pub struct CircuitBreakerSettings {
    pub enabled: bool,
    /// Consecutive failures that open the breaker (`u32::MAX` when disabled, as SMG).
    pub failure_threshold: u32,
    pub success_threshold: u32,
    /// How long an open breaker stays open before half-open.
    pub open_duration: Duration,
    /// Accepted for compatibility; decisions count consecutive outcomes.
    pub window: Duration,
    pub failure_status_codes: Vec<u16>,
    /// Statuses that record no outcome at all.
    pub capacity_status_codes: Vec<u16>,
}

/// Health checks and worker registration (http-pd-spec §3.2, §3.5).
#[derive(Clone, Debug, PartialEq)]
pub struct HealthSettings {
    pub enabled: bool,
    pub failure_threshold: u32,
    pub success_threshold: u32,
    pub timeout: Duration,
    pub interval: Duration,
    /// Path probed on each worker, starting with `/`.
    pub endpoint: String,
    pub remove_unhealthy_workers: bool,
    pub drain_settle: Duration,
    pub startup_timeout: Duration,
    pub startup_check_interval: Duration,
    pub startup_delay: Duration,
}

impl HealthSettings {
    /// Registration probes before giving up: `max(3, ceil(0.9 · timeout / interval))` (SMG).
    pub fn startup_max_attempts(&self) -> u32 {
        let interval = self.startup_check_interval.as_secs_f64().max(1.0);
        let attempts = (0.9 * self.startup_timeout.as_secs_f64() / interval).ceil();
        (attempts as u32).max(3)
    }
}

/// Load monitoring and overload protection (http-pd-spec §3.8).
#[derive(Clone, Debug, PartialEq)]
pub struct OverloadSettings {
    /// Waiting requests at which a worker is overloaded.
    pub waiting_requests: Option<usize>,
    /// Mean KV usage at which a worker is overloaded (0.9 when `worker_overload_protection` is
    /// set without an explicit value).
    pub token_usage: Option<f64>,
    pub load_monitor_interval: Duration,
    /// The `Retry-After` of a shed: the monitor interval in seconds, at least 1.
    pub retry_after_secs: u64,
}

impl OverloadSettings {
    pub fn enabled(&self) -> bool {
        self.waiting_requests.is_some() || self.token_usage.is_some()
    }
}

/// Every deadline of a request. Phase deadlines never exceed `request`; a configured 0 means
/// "no phase deadline", i.e. `request`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timeouts {
    pub connect: Duration,
    pub body_read: Duration,
    pub prefill_head: Duration,
    pub decode_first_byte: Duration,
    pub stream_idle: Duration,
    /// The whole request (SMG `--request-timeout-secs`).
    pub request: Duration,
    /// Idle lifetime of a pooled engine connection; `None` = unlimited.
    pub upstream_pool_idle: Option<Duration>,
}

/// cache_aware tunables (shared by both legs).
#[derive(Clone, Debug, PartialEq)]
pub struct CacheAwareSettings {
    pub cache_threshold: f32,
    pub balance_abs_threshold: usize,
    pub balance_rel_threshold: f32,
    pub balance_token_usage_threshold: f32,
    pub overload_token_usage_threshold: f32,
    pub overlap_decay: f32,
    pub selection_temperature: f32,
    pub eviction_interval: Duration,
    pub max_tree_size: usize,
    pub block_size: usize,
    pub cache_index: CacheIndexKind,
    pub cache_ttl: Duration,
    pub cache_boundaries: Vec<usize>,
}

/// prefix_hash tunables.
#[derive(Clone, Debug, PartialEq)]
pub struct PrefixHashSettings {
    pub prefix_token_count: usize,
    pub load_factor: f64,
    pub balance_abs_threshold: usize,
    pub cache_boundaries: Vec<usize>,
}

/// least_load tunables (power_of_two uses the built-in defaults, not these: SMG).
#[derive(Clone, Debug, PartialEq)]
pub struct LeastLoadSettings {
    pub kv_pressure_weight: f64,
    pub default_throughput: f64,
    pub mean_prefill_tokens: u32,
    /// 0 = off.
    pub max_waiting_requests: u32,
}

impl Default for LeastLoadSettings {
    /// The built-in values (what power_of_two scores with).
    fn default() -> Self {
        LeastLoadSettings {
            kv_pressure_weight: defaults::LEAST_LOAD_KV_PRESSURE_WEIGHT,
            default_throughput: defaults::LEAST_LOAD_DEFAULT_THROUGHPUT,
            mean_prefill_tokens: defaults::LEAST_LOAD_MEAN_PREFILL_TOKENS,
            max_waiting_requests: defaults::LEAST_LOAD_MAX_WAITING_REQUESTS,
        }
    }
}

/// bucket tunables (prefill only).
#[derive(Clone, Debug, PartialEq)]
pub struct BucketSettings {
    pub balance_abs_threshold: usize,
    pub balance_rel_threshold: f32,
    pub adjust_interval: Duration,
}

/// A sticky-key map: the manual policy's, or the routing-key override's.
#[derive(Clone, Debug, PartialEq)]
pub struct StickySettings {
    /// For the override: whether it is on. The manual policy is always sticky.
    pub enabled: bool,
    pub assignment_mode: AssignmentMode,
    pub max_idle: Duration,
    pub eviction_interval: Duration,
    /// Lowercased, in lookup order. (The manual policy reads only `x-smg-routing-key`.)
    pub headers: Vec<String>,
}

impl GatewayConfig {
    pub fn retry(&self) -> RetrySettings {
        let max_attempts = if self.disable_retries {
            1
        } else {
            self.retry_max_retries.max(1)
        };
        RetrySettings {
            max_attempts,
            initial_backoff: Duration::from_millis(self.retry_initial_backoff_ms),
            max_backoff: Duration::from_millis(self.retry_max_backoff_ms),
            backoff_multiplier: self.retry_backoff_multiplier,
            jitter_factor: self.retry_jitter_factor,
            retryable_status_codes: defaults::RETRYABLE_STATUS_CODES.to_vec(),
        }
    }

    pub fn circuit_breaker(&self) -> CircuitBreakerSettings {
        let enabled = !self.disable_circuit_breaker;
        CircuitBreakerSettings {
            enabled,
            failure_threshold: if enabled {
                self.cb_failure_threshold
            } else {
                u32::MAX
            },
            success_threshold: self.cb_success_threshold,
            open_duration: Duration::from_secs(self.cb_timeout_duration_secs),
            window: Duration::from_secs(self.cb_window_duration_secs),
            failure_status_codes: defaults::CB_FAILURE_STATUS_CODES.to_vec(),
            capacity_status_codes: defaults::CB_CAPACITY_STATUS_CODES.to_vec(),
        }
    }

    pub fn health(&self) -> HealthSettings {
        HealthSettings {
            enabled: !self.disable_health_check,
            failure_threshold: self.health_failure_threshold,
            success_threshold: self.health_success_threshold,
            timeout: Duration::from_secs(self.health_check_timeout_secs),
            interval: Duration::from_secs(self.health_check_interval_secs),
            endpoint: self.health_check_endpoint.clone(),
            // SMG defaults it to the service-discovery setting; pdgate has no discovery.
            remove_unhealthy_workers: self.remove_unhealthy_workers.unwrap_or(false),
            drain_settle: Duration::from_secs(self.drain_settle_secs),
            startup_timeout: Duration::from_secs(self.worker_startup_timeout_secs),
            startup_check_interval: Duration::from_secs(self.worker_startup_check_interval),
            startup_delay: Duration::from_secs(self.worker_startup_delay),
        }
    }

    pub fn overload(&self) -> OverloadSettings {
        // SMG: the flag supplies the token-usage default; an explicit threshold overrides it
        // per signal, and either threshold alone enables protection.
        let token_usage = self.worker_overload_token_usage.or(self
            .worker_overload_protection
            .then_some(defaults::WORKER_OVERLOAD_TOKEN_USAGE));
        OverloadSettings {
            waiting_requests: self.worker_overload_waiting_requests,
            token_usage,
            load_monitor_interval: Duration::from_secs(self.load_monitor_interval),
            retry_after_secs: self.load_monitor_interval.max(1),
        }
    }

    pub fn timeouts(&self) -> Timeouts {
        let request = Duration::from_secs(self.request_timeout_secs);
        let phase = |secs: u64| {
            if secs == 0 {
                request
            } else {
                Duration::from_secs(secs).min(request)
            }
        };
        Timeouts {
            connect: Duration::from_millis(self.connect_timeout_ms).min(request),
            body_read: phase(self.body_read_timeout_secs),
            prefill_head: phase(self.prefill_head_timeout_secs),
            decode_first_byte: phase(self.decode_first_byte_timeout_secs),
            stream_idle: phase(self.stream_idle_timeout_secs),
            request,
            upstream_pool_idle: (self.upstream_pool_idle_timeout_secs > 0)
                .then(|| Duration::from_secs(self.upstream_pool_idle_timeout_secs)),
        }
    }

    pub fn cache_aware(&self) -> CacheAwareSettings {
        CacheAwareSettings {
            cache_threshold: self.cache_threshold,
            balance_abs_threshold: self.balance_abs_threshold,
            balance_rel_threshold: self.balance_rel_threshold,
            balance_token_usage_threshold: self.balance_token_usage_threshold,
            overload_token_usage_threshold: self.overload_token_usage_threshold,
            overlap_decay: self.overlap_decay,
            selection_temperature: self.selection_temperature,
            eviction_interval: Duration::from_secs(self.eviction_interval),
            max_tree_size: self.max_tree_size,
            block_size: self.block_size,
            cache_index: self.cache_index,
            cache_ttl: Duration::from_secs(self.cache_ttl_secs),
            cache_boundaries: self.cache_boundaries.clone(),
        }
    }

    pub fn prefix_hash(&self) -> PrefixHashSettings {
        PrefixHashSettings {
            prefix_token_count: self.prefix_token_count,
            load_factor: self.prefix_hash_load_factor,
            balance_abs_threshold: self.prefix_hash_balance_abs_threshold,
            cache_boundaries: self.cache_boundaries.clone(),
        }
    }

    pub fn least_load(&self) -> LeastLoadSettings {
        LeastLoadSettings {
            kv_pressure_weight: self.least_load_kv_pressure_weight,
            default_throughput: self.least_load_default_throughput,
            mean_prefill_tokens: self.least_load_mean_prefill_tokens,
            max_waiting_requests: self.least_load_max_waiting_requests,
        }
    }

    pub fn bucket(&self) -> BucketSettings {
        BucketSettings {
            balance_abs_threshold: self.balance_abs_threshold,
            balance_rel_threshold: self.balance_rel_threshold,
            adjust_interval: Duration::from_secs(defaults::BUCKET_ADJUST_INTERVAL_SECS),
        }
    }

    /// The manual policy's sticky map (assignment defaults to `random`; header fixed).
    pub fn manual(&self) -> StickySettings {
        StickySettings {
            enabled: true,
            assignment_mode: self.assignment_mode.unwrap_or(AssignmentMode::Random),
            max_idle: Duration::from_secs(self.max_idle_secs),
            eviction_interval: Duration::from_secs(self.eviction_interval),
            headers: vec![defaults::ROUTING_KEY_HEADER.to_string()],
        }
    }

    /// The routing-key override (`--routing-key-override`; assignment defaults to `delegate`).
    pub fn sticky(&self) -> StickySettings {
        StickySettings {
            enabled: self.routing_key_override,
            assignment_mode: self.assignment_mode.unwrap_or(AssignmentMode::Delegate),
            max_idle: Duration::from_secs(self.max_idle_secs),
            eviction_interval: Duration::from_secs(self.eviction_interval),
            headers: self.routing_key_header_names(),
        }
    }
}
