//! What a SIGHUP reload may change in place. Everything in [`super::GatewayConfig`] is swapped
//! atomically except the listeners, which Pingora binds once, and tracing (the exporter is set
//! up once): changing one needs a graceful upgrade (SIGQUIT + `-u`). Pingora's own settings are
//! read only at startup.

use super::LoadedConfig;

/// The settings that differ between `old` and `new` but cannot take effect without a restart
/// (listener addresses, tracing, service discovery, the tokenizer and any Pingora top-level key),
/// as YAML key paths. Empty: the reload can be applied in place.
pub fn restart_required(old: &LoadedConfig, new: &LoadedConfig) -> Vec<String> {
    let (a, b) = (&old.gateway, &new.gateway);
    let mut keys = Vec::new();
    // A key whose new value needs a restart, when it changed.
    macro_rules! changed {
        ($key:ident) => {
            (stringify!($key), a.$key != b.$key)
        };
    }
    let listeners = [
        changed!(host),
        changed!(port),
        changed!(health_check_port),
        changed!(prometheus_host),
        changed!(prometheus_port),
        changed!(admin_host),
        changed!(admin_port),
        // The logger is installed once, at startup.
        changed!(log_json),
        // The exporter and its thread are set up once at startup.
        changed!(enable_trace),
        changed!(otlp_traces_endpoint),
        // The discovery watch is started once, with the settings it started with.
        changed!(service_discovery),
        changed!(discovery_provider),
        changed!(prefill_selector),
        changed!(decode_selector),
        changed!(encode_selector),
        // The mode decides which workers may register and what readiness needs; the
        // registry and the discovery watch hold workers admitted under the old one.
        changed!(epd_disaggregation),
        changed!(service_discovery_port),
        changed!(service_discovery_namespace),
        changed!(kv_connector_annotation),
        changed!(kv_engine_id_annotation),
        changed!(discovery_file),
        changed!(discovery_check_interval_secs),
        // The tokenizer (and its caches) is loaded once, at startup.
        changed!(model_path),
        changed!(tokenizer_path),
        changed!(chat_template),
        changed!(tokenizer_cache_enable_l0),
        changed!(tokenizer_cache_l0_max_entries),
        changed!(tokenizer_cache_enable_l1),
        changed!(tokenizer_cache_l1_max_memory),
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
