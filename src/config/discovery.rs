//! The service-discovery settings: the rules they must pass (checked with the rest of the
//! config at startup and on reload) and the Kubernetes label selectors they give.

use super::error::ConfigError;
use super::gateway::{DiscoveryProvider, GatewayConfig};

/// A role selector as the API server's `labelSelector` takes it: SMG's `key=value` words
/// joined by commas (every label must match). `Err` names the first bad word.
pub fn label_selector(words: &[String]) -> Result<String, String> {
    let mut out = Vec::with_capacity(words.len());
    for word in words {
        // A YAML list or one flag value may carry several words ("app=sglang role=prefill").
        for part in word.split([' ', ',']).filter(|p| !p.is_empty()) {
            out.push(label_pair(part)?);
        }
    }
    if out.is_empty() {
        return Err("no `key=value` label given".into());
    }
    Ok(out.join(","))
}

/// One `key=value` (Kubernetes label syntax: an optional DNS prefix and `/`, a name of at most
/// 63 alphanumerics, `-`, `_`, `.`; the value the same or empty).
fn label_pair(part: &str) -> Result<String, String> {
    let (key, value) = part
        .split_once('=')
        .ok_or_else(|| format!("`{part}` is not `key=value`"))?;
    let name = key.rsplit_once('/').map_or(
        key,
        |(prefix, name)| {
            if prefix.is_empty() {
                ""
            } else {
                name
            }
        },
    );
    let label_ok = |s: &str| {
        s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && s.bytes().next().is_none_or(|b| b.is_ascii_alphanumeric())
            && s.bytes().last().is_none_or(|b| b.is_ascii_alphanumeric())
    };
    if name.is_empty() || !label_ok(name) {
        return Err(format!("`{part}`: `{key}` is not a label key"));
    }
    if !label_ok(value) {
        return Err(format!("`{part}`: `{value}` is not a label value"));
    }
    Ok(format!("{key}={value}"))
}

/// The discovery rules: one way to turn it on, selectors for both roles (pdgate routes PD
/// only), valid selectors and port, and no discovery key without discovery.
pub(crate) fn validate_discovery(cfg: &GatewayConfig) -> Result<(), ConfigError> {
    if cfg.service_discovery && cfg.discovery_provider.is_some() {
        return Err(ConfigError::invalid_key(
            "discovery_provider",
            "give discovery_provider or service_discovery (its legacy spelling), not both",
        ));
    }
    if !cfg.selector.is_empty() {
        return Err(ConfigError::invalid_key(
            "selector",
            "selector picks regular (non-PD) worker pods, which pdgate does not serve; discover \
             prefill and decode pods with prefill_selector and decode_selector",
        ));
    }
    let kubernetes_keys = [
        ("prefill_selector", !cfg.prefill_selector.is_empty()),
        ("decode_selector", !cfg.decode_selector.is_empty()),
        ("encode_selector", !cfg.encode_selector.is_empty()),
        (
            "service_discovery_namespace",
            cfg.service_discovery_namespace.is_some(),
        ),
    ];
    let file_keys = [
        ("discovery_file", cfg.discovery_file.is_some()),
        (
            "discovery_check_interval_secs",
            cfg.discovery_check_interval_secs.is_some(),
        ),
    ];
    let Some(provider) = cfg.discovery() else {
        for (key, given) in kubernetes_keys.into_iter().chain(file_keys) {
            if given {
                return Err(ConfigError::invalid_key(
                    key,
                    "has no effect without service discovery: set service_discovery: true (or \
                     discovery_provider: kubernetes | file)",
                ));
            }
        }
        return Ok(());
    };
    match provider {
        DiscoveryProvider::File => {
            if cfg.discovery_file.is_none() {
                return Err(ConfigError::invalid_key(
                    "discovery_file",
                    "is required with discovery_provider: file (the JSON manifest of the workers)",
                ));
            }
            if cfg.discovery_check_interval_secs == Some(0) {
                return Err(ConfigError::invalid_key(
                    "discovery_check_interval_secs",
                    "must be at least 1 (unset: 30)",
                ));
            }
            for (key, given) in kubernetes_keys {
                if given {
                    return Err(ConfigError::invalid_key(
                        key,
                        "is for Kubernetes discovery; the file provider's workers are its manifest's",
                    ));
                }
            }
        }
        DiscoveryProvider::Kubernetes => {
            for (key, given) in file_keys {
                if given {
                    return Err(ConfigError::invalid_key(
                        key,
                        "is for discovery_provider: file",
                    ));
                }
            }
            for (key, words) in [
                ("prefill_selector", &cfg.prefill_selector),
                ("decode_selector", &cfg.decode_selector),
            ] {
                if words.is_empty() {
                    return Err(ConfigError::invalid_key(
                        key,
                        "Kubernetes service discovery in PD mode needs prefill_selector and \
                         decode_selector (e.g. --prefill-selector app=sglang role=prefill)",
                    ));
                }
                label_selector(words).map_err(|why| ConfigError::invalid_key(key, why))?;
            }
            if cfg.epd_disaggregation {
                if cfg.encode_selector.is_empty() {
                    return Err(ConfigError::invalid_key(
                        "encode_selector",
                        "EPD discovery needs all three role selectors; give encode_selector \
                         (e.g. --encode-selector app=tokenspeed role=encode)",
                    ));
                }
                label_selector(&cfg.encode_selector)
                    .map_err(|why| ConfigError::invalid_key("encode_selector", why))?;
            } else if !cfg.encode_selector.is_empty() {
                return Err(ConfigError::invalid_key(
                    "encode_selector",
                    "picks encode pods, which serve only EPD; start with --epd-disaggregation",
                ));
            }
            if label_selector(&cfg.prefill_selector) == label_selector(&cfg.decode_selector) {
                return Err(ConfigError::invalid_key(
                    "decode_selector",
                    "is the prefill_selector: every pod would be both a prefill and a decode",
                ));
            }
            if cfg.service_discovery_port == 0 {
                return Err(ConfigError::invalid_key(
                    "service_discovery_port",
                    "must be a port (1-65535)",
                ));
            }
            if cfg
                .service_discovery_namespace
                .as_deref()
                .is_some_and(|ns| ns.trim().is_empty())
            {
                return Err(ConfigError::invalid_key(
                    "service_discovery_namespace",
                    "is empty; omit it to watch every namespace",
                ));
            }
            for (key, name) in [
                ("kv_connector_annotation", &cfg.kv_connector_annotation),
                ("kv_engine_id_annotation", &cfg.kv_engine_id_annotation),
            ] {
                if name.trim().is_empty() {
                    return Err(ConfigError::invalid_key(key, "is empty"));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_provider_needs_its_file_and_refuses_kubernetes_keys() {
        let mut cfg = GatewayConfig {
            pd_disaggregation: true,
            discovery_provider: Some(DiscoveryProvider::File),
            ..GatewayConfig::default()
        };
        let err = validate_discovery(&cfg).unwrap_err().to_string();
        assert!(err.contains("discovery_file"), "{err}");
        cfg.discovery_file = Some("/etc/pdgate/workers.json".into());
        validate_discovery(&cfg).expect("file + discovery_file");
        cfg.prefill_selector = vec!["app=x".into()];
        let err = validate_discovery(&cfg).unwrap_err().to_string();
        assert!(err.contains("prefill_selector"), "{err}");
        cfg.prefill_selector.clear();
        cfg.discovery_check_interval_secs = Some(0);
        assert!(validate_discovery(&cfg).is_err());
        // The file keys mean nothing to Kubernetes discovery, or without discovery.
        cfg.discovery_check_interval_secs = None;
        cfg.discovery_provider = None;
        let err = validate_discovery(&cfg).unwrap_err().to_string();
        assert!(err.contains("discovery_file"), "{err}");
    }

    fn words(s: &[&str]) -> Vec<String> {
        s.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn selectors_join_smg_words_into_one_label_selector() {
        assert_eq!(
            label_selector(&words(&["app=sglang", "role=prefill"])).as_deref(),
            Ok("app=sglang,role=prefill")
        );
        assert_eq!(
            label_selector(&words(&["app=sglang role=decode"])).as_deref(),
            Ok("app=sglang,role=decode")
        );
        assert_eq!(
            label_selector(&words(&["example.com/tier=", "a_b=x.y-z"])).as_deref(),
            Ok("example.com/tier=,a_b=x.y-z")
        );
        for bad in [&["app"][..], &["=x"], &["a=b=c"], &["a=-x"], &["/a=b"], &[]] {
            assert!(label_selector(&words(bad)).is_err(), "{bad:?}");
        }
    }
}
