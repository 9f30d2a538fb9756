//! Startup validation: every rule a configuration must pass before pdgate serves with it,
//! whatever the input format. SMG's rules (http-pd-spec §5 "Startup validation", §8) plus
//! pdgate's own (PD-only, listener collisions, phase deadlines). The first violation is
//! returned, naming the key and its `launch` flag.

use std::collections::HashMap;
use std::net::IpAddr;

use super::error::{flag_name, ConfigError};
use super::gateway::{GatewayConfig, PolicyName};
use super::worker::{WorkerSpec, WorkerType};

/// Validates a gateway configuration on its own: its inline `workers` and every key.
///
/// When `workers_file` is set, the file's workers are not seen here, so the checks that count
/// startup workers (power_of_two needs two, duplicate URLs) cover only the inline ones;
/// [`super::load_file`] runs them over both.
pub fn validate(cfg: &GatewayConfig) -> Result<(), ConfigError> {
    let file_workers = if cfg.workers_file.is_some() {
        None
    } else {
        Some(&[][..])
    };
    validate_with_file_workers(cfg, file_workers)
}

/// `file_workers`: the workers of `workers_file` with the location to blame (`None` when the
/// file was not read).
pub(crate) fn validate_with_file_workers(
    cfg: &GatewayConfig,
    file_workers: Option<&[(String, WorkerSpec)]>,
) -> Result<(), ConfigError> {
    if !cfg.pd_disaggregation && !cfg.epd_disaggregation {
        return Err(ConfigError::invalid_key(
            "pd_disaggregation",
            "pdgate serves only prefill/decode disaggregation; set `pd_disaggregation: true` in the \
             gateway section (or pass --pd-disaggregation to `pdgate launch`; \
             --epd-disaggregation for encode workers)",
        ));
    }
    if cfg.pd_disaggregation && cfg.epd_disaggregation {
        return Err(ConfigError::invalid_key(
            "epd_disaggregation",
            "is a mode of its own; set either pd_disaggregation or epd_disaggregation",
        ));
    }
    if cfg.mm_per_request_image_limit == Some(0) {
        return Err(ConfigError::invalid_key(
            "mm_per_request_image_limit",
            "is 0; it must be at least 1 (unset keeps the limit of 128)",
        ));
    }
    for (key, on, bound) in [
        (
            "tokenizer_cache_l0_max_entries",
            cfg.tokenizer_cache_enable_l0,
            cfg.tokenizer_cache_l0_max_entries,
        ),
        (
            "tokenizer_cache_l1_max_memory",
            cfg.tokenizer_cache_enable_l1,
            cfg.tokenizer_cache_l1_max_memory,
        ),
    ] {
        if on && bound == 0 {
            return Err(ConfigError::invalid_key(
                key,
                "is 0 while its cache is enabled; give it room or leave the cache off",
            ));
        }
    }
    if let Some(domains) = &cfg.mm_allowed_media_domains {
        pdgate_media::FetchPolicy::parse_domains(domains)
            .map_err(|why| ConfigError::invalid_key("mm_allowed_media_domains", why))?;
    }
    validate_listeners(cfg)?;
    validate_ranges(cfg)?;
    super::discovery::validate_discovery(cfg)?;
    if let Some(Err(why)) = cfg.otlp_endpoint() {
        return Err(ConfigError::invalid_key("otlp_traces_endpoint", why));
    }

    let inline = cfg
        .workers
        .iter()
        .enumerate()
        .map(|(i, w)| (format!("gateway.workers[{i}]"), w));
    let from_file = file_workers
        .unwrap_or(&[])
        .iter()
        .map(|(loc, w)| (loc.clone(), w));
    let workers: Vec<(String, &WorkerSpec)> = inline.chain(from_file).collect();
    for (location, spec) in &workers {
        validate_startup_worker(spec).map_err(|e| e.within(location))?;
        validate_worker_for_mode(cfg, spec).map_err(|e| e.within(location))?;
    }
    refuse_duplicate_urls(workers.iter().map(|(loc, w)| (loc.as_str(), *w)))?;

    // With a workers_file that was not read, the counts are unknown: treat like dynamic
    // registration.
    let counts_known = file_workers.is_some();
    validate_policies(cfg, &workers, counts_known)
}

/// SMG: `passthrough` is not a leg policy; `bucket` is prefill-only; power_of_two needs two
/// workers to choose from.
fn validate_policies(
    cfg: &GatewayConfig,
    workers: &[(String, &WorkerSpec)],
    counts_known: bool,
) -> Result<(), ConfigError> {
    for (key, policy) in [
        ("prefill_policy", cfg.prefill_policy),
        ("decode_policy", cfg.decode_policy),
    ] {
        if policy == Some(PolicyName::Passthrough) {
            return Err(ConfigError::invalid_key(
                key,
                "passthrough is accepted only by `policy`, not as a per-leg policy; choose one of \
                 cache_aware, prefix_hash, consistent_hashing, power_of_two, least_load, round_robin, \
                 random, manual, bucket",
            ));
        }
    }
    if cfg.effective_decode_policy() == PolicyName::Bucket {
        // The spec rejects bucket as the decode policy; SMG's snapshot only caught an explicit
        // --decode-policy. pdgate checks the effective one: an inherited `policy: bucket` would
        // route decode by request length, which the policy is not designed for.
        let key = if cfg.decode_policy.is_some() {
            "decode_policy"
        } else {
            "policy"
        };
        return Err(ConfigError::invalid_key(
            key,
            "bucket routes prefill only and cannot be the decode policy; set decode_policy to \
             another policy (e.g. `decode_policy: power_of_two`)",
        ));
    }

    let prefill = workers
        .iter()
        .filter(|(_, w)| w.worker_type == WorkerType::Prefill)
        .count();
    let decode = workers
        .iter()
        .filter(|(_, w)| w.worker_type == WorkerType::Decode)
        .count();
    // No startup workers at all = dynamic registration via POST /workers: nothing to count.
    if !counts_known || workers.is_empty() {
        return Ok(());
    }
    let p2 = Some(PolicyName::PowerOfTwo);
    if cfg.prefill_policy == p2 && prefill < 2 {
        return Err(power_of_two_error("prefill_policy", "prefill", prefill));
    }
    if cfg.decode_policy == p2 && decode < 2 {
        return Err(power_of_two_error("decode_policy", "decode", decode));
    }
    // SMG: `--policy power_of_two` needs two URLs in total.
    if cfg.policy == PolicyName::PowerOfTwo && prefill + decode < 2 {
        return Err(power_of_two_error("policy", "", prefill + decode));
    }
    Ok(())
}

fn power_of_two_error(key: &str, leg: &str, have: usize) -> ConfigError {
    let leg = if leg.is_empty() {
        String::new()
    } else {
        format!("{leg} ")
    };
    ConfigError::invalid_key(
        key,
        format!(
            "power_of_two needs at least two {leg}workers to choose from, and {have} {leg}worker(s) are \
             configured; add workers or choose another policy (startup lists may also be left empty \
             to register every worker with POST /workers)"
        ),
    )
}

/// The rules a worker must pass to be a startup worker: the spec's own rules, a PD role, and a
/// transport this build serves.
pub(crate) fn validate_startup_worker(spec: &WorkerSpec) -> Result<(), ConfigError> {
    spec.validate()?;
    match spec.worker_type {
        WorkerType::Prefill | WorkerType::Decode | WorkerType::Encode => Ok(()),
        WorkerType::Regular => Err(ConfigError::invalid_at(
            "worker_type",
            "pdgate routes prefill/decode pairs only; set `worker_type: prefill` or `worker_type: decode` \
             (regular workers belong to SMG's non-PD mode)",
        )),
    }
}

/// The rules of the mode a worker joins (startup, reload and `POST /workers`): encode workers
/// only in EPD mode, and EPD only over gRPC (SMG refuses to start an EPD router for HTTP
/// workers; the engine's runtime is checked when the worker registers).
pub fn validate_worker_for_mode(cfg: &GatewayConfig, spec: &WorkerSpec) -> Result<(), ConfigError> {
    if spec.worker_type == WorkerType::Encode && !cfg.epd_disaggregation {
        return Err(ConfigError::invalid_at(
            "worker_type",
            "encode workers serve EPD only; start pdgate with --epd-disaggregation \
             (`epd_disaggregation: true`) instead of --pd-disaggregation",
        ));
    }
    if cfg.epd_disaggregation && !spec.parsed_url()?.scheme.is_grpc() {
        return Err(ConfigError::unsupported(
            "url",
            format!(
                "EPD runs only over gRPC with TokenSpeed workers; '{}' is not a grpc:// worker",
                spec.url
            ),
        ));
    }
    Ok(())
}

/// Refuses two workers with the same URL (trailing `/` ignored).
pub(crate) fn refuse_duplicate_urls<'a>(
    workers: impl IntoIterator<Item = (&'a str, &'a WorkerSpec)>,
) -> Result<(), ConfigError> {
    let mut seen: HashMap<&str, &str> = HashMap::new();
    for (location, spec) in workers {
        if let Some(first) = seen.insert(spec.url_key(), location) {
            return Err(ConfigError::invalid_at(
                format!("{location}.url"),
                format!(
                    "'{}' is already configured by {first}; each worker URL may appear once",
                    spec.url
                ),
            ));
        }
    }
    Ok(())
}

fn validate_listeners(cfg: &GatewayConfig) -> Result<(), ConfigError> {
    cfg.admin_trusted_nets()
        .map_err(|e| ConfigError::invalid_key("admin_trusted", e))?;
    for (key, host) in [
        ("host", Some(&cfg.host)),
        ("prometheus_host", Some(&cfg.prometheus_host)),
        ("admin_host", cfg.admin_host.as_ref()),
    ] {
        if let Some(host) = host {
            if host.is_empty() || host.chars().any(char::is_whitespace) {
                return Err(ConfigError::invalid_key(
                    key,
                    format!("'{host}' is not a host address"),
                ));
            }
        }
    }
    if cfg.port == 0 {
        return Err(ConfigError::invalid_key(
            "port",
            "0 is not a serving port; clients need a known port",
        ));
    }
    if cfg.admin_host.is_some() && cfg.admin_port.is_none() {
        return Err(ConfigError::invalid_key(
            "admin_host",
            "is set without admin_port; set admin_port to open a separate admin listener, or remove \
             admin_host to serve the admin routes on the serving port",
        ));
    }
    for (key, port) in [
        ("admin_port", cfg.admin_port),
        ("health_check_port", cfg.health_check_port),
    ] {
        if port == Some(0) {
            return Err(ConfigError::invalid_key(key, "0 is not a valid port"));
        }
    }

    let admin_host = cfg
        .admin_host
        .clone()
        .unwrap_or_else(|| super::defaults::ADMIN_HOST.to_string());
    let mut listeners: Vec<(&str, &str, u16)> = vec![("port", &cfg.host, cfg.port)];
    if cfg.prometheus_port != 0 {
        listeners.push(("prometheus_port", &cfg.prometheus_host, cfg.prometheus_port));
    }
    if let Some(port) = cfg.admin_port {
        listeners.push(("admin_port", &admin_host, port));
    }
    if let Some(port) = cfg.health_check_port {
        listeners.push(("health_check_port", &cfg.host, port));
    }
    for (i, (key_a, host_a, port_a)) in listeners.iter().enumerate() {
        for (key_b, host_b, port_b) in &listeners[i + 1..] {
            if port_a == port_b && hosts_overlap(host_a, host_b) {
                return Err(ConfigError::invalid_key(
                    key_b,
                    format!("port {port_b} is already used by {key_a} ({}); give each listener its own port", flag_name(key_a)),
                ));
            }
        }
    }
    Ok(())
}

/// Two bind addresses conflict on the same port when equal or when either is unspecified.
fn hosts_overlap(a: &str, b: &str) -> bool {
    let unspecified = |h: &str| {
        h.trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_unspecified())
    };
    a.eq_ignore_ascii_case(b) || unspecified(a) || unspecified(b)
}

fn validate_ranges(cfg: &GatewayConfig) -> Result<(), ConfigError> {
    fraction(
        "cache_threshold",
        f64::from(cfg.cache_threshold),
        Bound::Closed,
    )?;
    at_least_f(
        "balance_rel_threshold",
        f64::from(cfg.balance_rel_threshold),
        1.0,
    )?;
    at_least_f(
        "balance_token_usage_threshold",
        f64::from(cfg.balance_token_usage_threshold),
        0.0,
    )?;
    at_least_f(
        "overload_token_usage_threshold",
        f64::from(cfg.overload_token_usage_threshold),
        0.0,
    )?;
    at_least_f("overlap_decay", f64::from(cfg.overlap_decay), 0.0)?;
    at_least_f(
        "selection_temperature",
        f64::from(cfg.selection_temperature),
        0.0,
    )?;
    at_least_one("eviction_interval", cfg.eviction_interval)?;
    at_least_one("max_tree_size", cfg.max_tree_size as u64)?;
    at_least_one("block_size", cfg.block_size as u64)?;
    at_least_one("cache_ttl_secs", cfg.cache_ttl_secs)?;
    if cfg.cache_boundaries.contains(&0) {
        return Err(ConfigError::invalid_key(
            "cache_boundaries",
            "boundaries are token positions and must be ≥ 1",
        ));
    }
    at_least_one("max_idle_secs", cfg.max_idle_secs)?;
    at_least_one("prefix_token_count", cfg.prefix_token_count as u64)?;
    at_least_f("prefix_hash_load_factor", cfg.prefix_hash_load_factor, 1.0)?;
    at_least_f(
        "least_load_kv_pressure_weight",
        cfg.least_load_kv_pressure_weight,
        0.0,
    )?;
    if !(cfg.least_load_default_throughput.is_finite() && cfg.least_load_default_throughput > 0.0) {
        return Err(ConfigError::invalid_key(
            "least_load_default_throughput",
            format!(
                "{} must be a positive number of tokens per second",
                cfg.least_load_default_throughput
            ),
        ));
    }
    at_least_one(
        "least_load_mean_prefill_tokens",
        u64::from(cfg.least_load_mean_prefill_tokens),
    )?;

    if cfg.max_concurrent_requests < -1 {
        return Err(ConfigError::invalid_key(
            "max_concurrent_requests",
            format!(
                "{} is not a bound: give a count, 0 for no limit, or -1 for 1024 per CPU (at least 4096)",
                cfg.max_concurrent_requests
            ),
        ));
    }
    if cfg.queue_size > 0 && cfg.queue_timeout_secs == 0 {
        return Err(ConfigError::invalid_key(
            "queue_timeout_secs",
            "is 0 while queue_size is not; give the longest wait in seconds (or queue_size 0 to refuse at once)",
        ));
    }
    if let Some(rate) = cfg.rate_limit_tokens_per_second.filter(|r| *r < 0) {
        return Err(ConfigError::invalid_key(
            "rate_limit_tokens_per_second",
            format!("{rate} must be ≥ 0 (0 or unset: no rate limit)"),
        ));
    }
    for origin in &cfg.cors_allowed_origins {
        crate::proxy::cors::check_origin(origin, cfg.cors_allowed_origins.len())
            .map_err(|why| ConfigError::invalid_key("cors_allowed_origins", why))?;
    }
    at_least_one("link_window_secs", cfg.link_window_secs)?;
    at_least_one("capacity_window_secs", cfg.capacity_window_secs)?;
    at_least_one("link_min_handoffs", u64::from(cfg.link_min_handoffs))?;
    at_least_one("link_cooldown_secs", cfg.link_cooldown_secs)?;
    at_least_one("link_probe_successes", u64::from(cfg.link_probe_successes))?;
    if !(cfg.link_failure_ratio > 0.0 && cfg.link_failure_ratio <= 1.0) {
        return Err(ConfigError::invalid_key(
            "link_failure_ratio",
            format!(
                "{} must be a share in (0, 1] (0.5: half the handoffs failed)",
                cfg.link_failure_ratio
            ),
        ));
    }
    at_least_one("load_monitor_interval", cfg.load_monitor_interval)?;
    if cfg.worker_overload_waiting_requests == Some(0) {
        return Err(ConfigError::invalid_key(
            "worker_overload_waiting_requests",
            "must be ≥ 1: the comparison is inclusive, so 0 would mark every worker overloaded",
        ));
    }
    if let Some(usage) = cfg.worker_overload_token_usage {
        fraction("worker_overload_token_usage", usage, Bound::OpenAtZero)?;
    }

    if cfg.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        return Err(ConfigError::invalid_key(
            "api_key",
            "must not be empty when set; remove it to serve without a key",
        ));
    }
    at_least_one("max_payload_size", cfg.max_payload_size as u64)?;
    at_least_one("request_timeout_secs", cfg.request_timeout_secs)?;
    at_least_one("connect_timeout_ms", cfg.connect_timeout_ms)?;

    if cfg.retry_initial_backoff_ms > cfg.retry_max_backoff_ms {
        return Err(ConfigError::invalid_key(
            "retry_initial_backoff_ms",
            format!(
                "{} is above retry_max_backoff_ms ({})",
                cfg.retry_initial_backoff_ms, cfg.retry_max_backoff_ms
            ),
        ));
    }
    at_least_f(
        "retry_backoff_multiplier",
        f64::from(cfg.retry_backoff_multiplier),
        1.0,
    )?;
    fraction(
        "retry_jitter_factor",
        f64::from(cfg.retry_jitter_factor),
        Bound::Closed,
    )?;

    at_least_one("cb_failure_threshold", u64::from(cfg.cb_failure_threshold))?;
    at_least_one("cb_success_threshold", u64::from(cfg.cb_success_threshold))?;
    at_least_one("cb_timeout_duration_secs", cfg.cb_timeout_duration_secs)?;

    at_least_one(
        "health_failure_threshold",
        u64::from(cfg.health_failure_threshold),
    )?;
    at_least_one(
        "health_success_threshold",
        u64::from(cfg.health_success_threshold),
    )?;
    at_least_one("health_check_timeout_secs", cfg.health_check_timeout_secs)?;
    at_least_one("health_check_interval_secs", cfg.health_check_interval_secs)?;
    if !cfg.health_check_endpoint.starts_with('/') {
        return Err(ConfigError::invalid_key(
            "health_check_endpoint",
            format!(
                "'{}' must be a path starting with '/'",
                cfg.health_check_endpoint
            ),
        ));
    }
    at_least_one(
        "worker_startup_timeout_secs",
        cfg.worker_startup_timeout_secs,
    )?;
    at_least_one(
        "worker_startup_check_interval",
        cfg.worker_startup_check_interval,
    )?;

    for (key, headers) in [
        ("routing_key_headers", &cfg.routing_key_headers),
        ("request_id_headers", &cfg.request_id_headers),
    ] {
        for header in headers {
            if http::HeaderName::from_bytes(header.as_bytes()).is_err() {
                return Err(ConfigError::invalid_key(
                    key,
                    format!("'{header}' is not a valid HTTP header name"),
                ));
            }
        }
    }
    let buckets = &cfg.prometheus_duration_buckets;
    if buckets.iter().any(|b| !(b.is_finite() && *b > 0.0))
        || buckets.windows(2).any(|w| w[0] >= w[1])
    {
        return Err(ConfigError::invalid_key(
            "prometheus_duration_buckets",
            format!("{buckets:?} must be positive seconds in strictly increasing order"),
        ));
    }
    for (key, value) in [
        ("model_path", &cfg.model_path),
        ("tokenizer_path", &cfg.tokenizer_path),
        ("chat_template", &cfg.chat_template),
    ] {
        if value.as_deref().is_some_and(str::is_empty) {
            return Err(ConfigError::invalid_key(key, "must not be empty when set"));
        }
    }
    if cfg
        .workers_file
        .as_ref()
        .is_some_and(|p| p.as_os_str().is_empty())
    {
        return Err(ConfigError::invalid_key(
            "workers_file",
            "must not be empty when set",
        ));
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Bound {
    /// [0, 1]
    Closed,
    /// (0, 1]
    OpenAtZero,
}

fn fraction(key: &str, value: f64, bound: Bound) -> Result<(), ConfigError> {
    let (ok, range) = match bound {
        Bound::Closed => (value.is_finite() && (0.0..=1.0).contains(&value), "[0, 1]"),
        Bound::OpenAtZero => (value.is_finite() && value > 0.0 && value <= 1.0, "(0, 1]"),
    };
    if ok {
        Ok(())
    } else {
        Err(ConfigError::invalid_key(
            key,
            format!("{value} is outside {range}"),
        ))
    }
}

fn at_least_f(key: &str, value: f64, min: f64) -> Result<(), ConfigError> {
    if value.is_finite() && value >= min {
        Ok(())
    } else {
        Err(ConfigError::invalid_key(
            key,
            format!("{value} must be ≥ {min:?}"),
        ))
    }
}

fn at_least_one(key: &str, value: u64) -> Result<(), ConfigError> {
    if value >= 1 {
        Ok(())
    } else {
        Err(ConfigError::invalid_key(key, "is 0; it must be at least 1"))
    }
}
