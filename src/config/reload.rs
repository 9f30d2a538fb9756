//! What a SIGHUP reload may change in place. Everything in [`super::GatewayConfig`] is swapped
//! atomically except the listeners, which Pingora binds once, and tracing (the exporter is set
//! up once): changing one needs a graceful upgrade (SIGQUIT + `-u`). Pingora's own settings are
//! read only at startup.

use super::LoadedConfig;

/// The settings that differ between `old` and `new` but cannot take effect without a restart
/// (listener addresses, tracing, service discovery and any Pingora top-level key), as YAML key paths. Empty: the reload can
/// be applied in place.
pub fn restart_required(old: &LoadedConfig, new: &LoadedConfig) -> Vec<String> {
    let (a, b) = (&old.gateway, &new.gateway);
    let mut keys = Vec::new();
    let listeners = [
        ("host", a.host != b.host),
        ("port", a.port != b.port),
        (
            "health_check_port",
            a.health_check_port != b.health_check_port,
        ),
        ("prometheus_host", a.prometheus_host != b.prometheus_host),
        ("prometheus_port", a.prometheus_port != b.prometheus_port),
        ("admin_host", a.admin_host != b.admin_host),
        ("admin_port", a.admin_port != b.admin_port),
        // The logger is installed once, at startup.
        ("log_json", a.log_json != b.log_json),
        // The exporter and its thread are set up once at startup.
        ("enable_trace", a.enable_trace != b.enable_trace),
        (
            "otlp_traces_endpoint",
            a.otlp_traces_endpoint != b.otlp_traces_endpoint,
        ),
        // The discovery watch is started once, with the settings it started with.
        (
            "service_discovery",
            a.service_discovery != b.service_discovery,
        ),
        (
            "discovery_provider",
            a.discovery_provider != b.discovery_provider,
        ),
        ("prefill_selector", a.prefill_selector != b.prefill_selector),
        ("decode_selector", a.decode_selector != b.decode_selector),
        ("encode_selector", a.encode_selector != b.encode_selector),
        // The mode decides which workers may register and what readiness needs; the
        // registry and the discovery watch hold workers admitted under the old one.
        (
            "epd_disaggregation",
            a.epd_disaggregation != b.epd_disaggregation,
        ),
        (
            "service_discovery_port",
            a.service_discovery_port != b.service_discovery_port,
        ),
        (
            "service_discovery_namespace",
            a.service_discovery_namespace != b.service_discovery_namespace,
        ),
        (
            "kv_connector_annotation",
            a.kv_connector_annotation != b.kv_connector_annotation,
        ),
        (
            "kv_engine_id_annotation",
            a.kv_engine_id_annotation != b.kv_engine_id_annotation,
        ),
        ("discovery_file", a.discovery_file != b.discovery_file),
        // The tokenizer (and its caches) is loaded once, at startup.
        ("model_path", a.model_path != b.model_path),
        ("tokenizer_path", a.tokenizer_path != b.tokenizer_path),
        ("chat_template", a.chat_template != b.chat_template),
        (
            "tokenizer_cache_enable_l0",
            a.tokenizer_cache_enable_l0 != b.tokenizer_cache_enable_l0,
        ),
        (
            "tokenizer_cache_l0_max_entries",
            a.tokenizer_cache_l0_max_entries != b.tokenizer_cache_l0_max_entries,
        ),
        (
            "tokenizer_cache_enable_l1",
            a.tokenizer_cache_enable_l1 != b.tokenizer_cache_enable_l1,
        ),
        (
            "tokenizer_cache_l1_max_memory",
            a.tokenizer_cache_l1_max_memory != b.tokenizer_cache_l1_max_memory,
        ),
        (
            "discovery_check_interval_secs",
            a.discovery_check_interval_secs != b.discovery_check_interval_secs,
        ),
    ];
    keys.extend(
        listeners
            .iter()
            .filter(|(_, changed)| *changed)
            .map(|(key, _)| format!("gateway.{key}")),
    );
    if old.server_conf != new.server_conf {
        let as_map = |conf| match serde_yaml::to_value(conf) {
            Ok(serde_yaml::Value::Mapping(m)) => m,
            _ => serde_yaml::Mapping::new(),
        };
        let (old_map, new_map) = (as_map(&old.server_conf), as_map(&new.server_conf));
        for (key, value) in &old_map {
            if new_map.get(key) != Some(value) {
                keys.push(key.as_str().unwrap_or("<pingora setting>").to_string());
            }
        }
    }
    keys
}
