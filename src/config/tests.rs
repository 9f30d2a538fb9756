//! Tests of the configuration model: the shipped conf files, YAML key ⇔ flag equivalence, SMG's
//! `--prefill URL [PORT|none]` argv, every validation refusal, the worker spec intake, the
//! grouped views, and the generated defaults table in docs/configuration.md.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser};
use serde_yaml::Value;

use super::*;

// ---- helpers ------------------------------------------------------------------------------------

const PD_PAIR: &str = "
  workers:
    - {url: 'http://p0:8000', worker_type: prefill, bootstrap_port: 8998}
    - {url: 'http://d0:8000', worker_type: decode}";

/// A config whose gateway section is `pd_disaggregation: true` plus `body` (indented 2).
fn yaml(body: &str) -> Result<LoadedConfig, ConfigError> {
    parse_yaml(&format!(
        "version: 1\ngateway:\n  pd_disaggregation: true\n{body}\n"
    ))
}

fn yaml_error(body: &str) -> String {
    match yaml(body) {
        Ok(_) => panic!("expected a refusal for:\n{body}"),
        Err(e) => e.to_string(),
    }
}

#[derive(Parser)]
#[command(no_binary_name = true)]
struct LaunchCli {
    #[command(flatten)]
    args: LaunchArgs,
}

fn launch_args(argv: &[&str]) -> Result<LaunchArgs, String> {
    let argv = normalize_launch_argv(argv.iter().map(|s| s.to_string()).collect());
    LaunchCli::try_parse_from(argv)
        .map(|c| c.args)
        .map_err(|e| e.to_string())
}

fn launch(argv: &[&str]) -> Result<LoadedConfig, String> {
    launch_args(argv)?.into_config().map_err(|e| e.to_string())
}

fn launch_error(argv: &[&str]) -> String {
    match launch(argv) {
        Ok(_) => panic!("expected a refusal for {argv:?}"),
        Err(e) => e,
    }
}

fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn gateway_command() -> clap::Command {
    GatewayConfig::augment_args(clap::Command::new("pdgate"))
}

fn gateway_field_ids() -> Vec<String> {
    gateway_command()
        .get_arguments()
        .map(|a| a.get_id().as_str().to_string())
        .collect()
}

// ---- shipped conf files ---------------------------------------------------------------------------

#[test]
fn every_conf_file_parses_and_validates() {
    let mut seen = 0;
    for entry in std::fs::read_dir(repo_path("conf")).expect("conf/ exists") {
        let path = entry.expect("readable dir entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("readable conf file");
        if text.lines().any(|l| l.starts_with("gateway:")) {
            let loaded = load_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(loaded.source, ConfigSource::File(path.clone()));
            assert!(
                loaded.notices.is_empty(),
                "{}: {:?}",
                path.display(),
                loaded.notices
            );
        } else {
            load_workers_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
        seen += 1;
    }
    assert!(
        seen >= 3,
        "pdgate.yaml, demo.yaml and workers.yaml are loaded"
    );
}

#[test]
fn demo_conf_is_one_loopback_pair_on_the_smg_ports() {
    let loaded = load_file(&repo_path("conf/demo.yaml")).expect("demo conf loads");
    let g = &loaded.gateway;
    assert_eq!(g.listen_addr(), "127.0.0.1:30000");
    assert_eq!(g.prometheus_addr(), "127.0.0.1:29000");
    assert_eq!(g.policy, PolicyName::RoundRobin);
    assert_eq!(loaded.server_conf.grace_period_seconds, Some(1));
    let workers: Vec<_> = loaded.startup_workers().collect();
    assert_eq!(workers.len(), 2);
    assert_eq!(workers[0].url, "http://127.0.0.1:31001");
    assert_eq!(workers[0].worker_type, WorkerType::Prefill);
    assert_eq!(workers[0].bootstrap_port, Some(31901));
    assert_eq!(workers[1].url, "http://127.0.0.1:31002");
    assert_eq!(workers[1].worker_type, WorkerType::Decode);
}

#[test]
fn annotated_conf_documents_every_gateway_key() {
    let text = std::fs::read_to_string(repo_path("conf/pdgate.yaml")).expect("pdgate.yaml");
    let missing: Vec<_> = gateway_field_ids()
        .into_iter()
        .chain(["workers".to_string()])
        .filter(|key| !text.contains(&format!(" {key}:")))
        .collect();
    assert!(
        missing.is_empty(),
        "conf/pdgate.yaml does not mention: {missing:?}"
    );
}

#[test]
fn annotated_conf_keeps_pingora_settings() {
    let loaded = load_file(&repo_path("conf/pdgate.yaml")).expect("pdgate.yaml loads");
    assert_eq!(loaded.server_conf.version, 1);
    assert_eq!(loaded.server_conf.threads, 2);
    assert_eq!(
        loaded.server_conf.graceful_shutdown_timeout_seconds,
        Some(5)
    );
    assert_eq!(loaded.server_conf.upgrade_sock, "/tmp/pdgate_upgrade.sock");
    assert_eq!(loaded.gateway.workers.len(), 2);
}

#[test]
fn workers_file_is_read_relative_to_the_config_and_checked_with_inline_workers() {
    let dir = std::env::temp_dir().join(format!("pdgate-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::copy(repo_path("conf/workers.yaml"), dir.join("workers.yaml")).expect("copy");
    let conf = dir.join("pdgate.yaml");
    std::fs::write(
        &conf,
        "gateway:\n  pd_disaggregation: true\n  workers_file: workers.yaml\n",
    )
    .expect("write");
    let loaded = load_file(&conf).expect("loads with the workers file");
    assert_eq!(loaded.file_workers.len(), 4);
    assert_eq!(
        loaded.file_workers[0].kv_connector.as_deref(),
        Some("NixlConnector")
    );
    assert_eq!(loaded.startup_workers().count(), 4);

    std::fs::write(
        &conf,
        "gateway:\n  pd_disaggregation: true\n  workers_file: workers.yaml\n  workers:\n    - {url: 'http://vllm-decode-0:8000/', worker_type: decode}\n",
    )
    .expect("write");
    let err = load_file(&conf).expect_err("the same URL inline and in the file");
    assert!(err.to_string().contains("already configured"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn missing_file_names_the_path() {
    let err = load_file(Path::new("/nonexistent/pdgate.yaml")).expect_err("no file");
    assert_eq!(err.kind(), ConfigErrorKind::Io);
    assert!(
        err.to_string()
            .starts_with("/nonexistent/pdgate.yaml: cannot read"),
        "{err}"
    );
}

// ---- defaults: one table ---------------------------------------------------------------------------

#[test]
fn defaults_are_smg_values() {
    let g = GatewayConfig::default();
    assert_eq!((g.host.as_str(), g.port), (defaults::HOST, 30000));
    assert_eq!(
        (g.prometheus_host.as_str(), g.prometheus_port),
        ("0.0.0.0", 29000)
    );
    assert_eq!(g.policy, PolicyName::CacheAware);
    assert_eq!((g.prefill_policy, g.decode_policy), (None, None));
    assert_eq!(g.pd_pairing_mode, PairingMode::Lenient);
    assert_eq!(g.cache_threshold, 0.3);
    assert_eq!(g.balance_abs_threshold, 64);
    assert_eq!(g.balance_rel_threshold, 1.5);
    assert_eq!(g.routing_key_headers, vec!["x-smg-routing-key".to_string()]);
    assert_eq!(g.retry_max_retries, 5);
    assert_eq!(g.cb_failure_threshold, 10);
    assert_eq!(g.health_check_interval_secs, 60);
    assert_eq!(g.max_payload_size, 536_870_912);
    assert_eq!(g.request_timeout_secs, 1800);
    assert_eq!(g.connect_timeout_ms, 2000);
    assert_eq!(g.body_read_timeout_secs, 60);
    assert_eq!(g.log_level, LogLevel::Info);
    assert!(!g.pd_disaggregation);
    assert!(g.workers.is_empty());
    assert_eq!(
        (
            defaults::MORIIO_HANDSHAKE_PORT,
            defaults::MORIIO_NOTIFY_PORT,
            defaults::BOOTSTRAP_PORT
        ),
        (6301, 61005, 8998)
    );
}

#[test]
fn a_missing_yaml_key_means_what_a_missing_flag_means() {
    let from_yaml = yaml("").expect("minimal yaml").gateway;
    let from_flags = launch(&["--pd-disaggregation"])
        .expect("minimal launch")
        .gateway;
    assert_eq!(from_yaml, from_flags);
}

// ---- YAML key == flag name ------------------------------------------------------------------------

#[test]
fn every_flag_is_the_yaml_key_in_kebab_case() {
    let serialized = serde_yaml::to_value(GatewayConfig::default()).expect("serializes");
    let Value::Mapping(keys) = serialized else {
        panic!("a mapping")
    };
    for arg in gateway_command().get_arguments() {
        let id = arg.get_id().as_str();
        let kebab = id.replace('_', "-");
        // The flag itself or, where SMG renamed the flag, its old name (kept as an alias).
        let names: Vec<&str> = arg
            .get_long()
            .into_iter()
            .chain(arg.get_all_aliases().unwrap_or_default())
            .collect();
        assert!(
            names.contains(&kebab.as_str()),
            "`{id}` is not one of its flag's names {names:?}"
        );
        assert!(keys.contains_key(id), "`{id}` is a flag but not a YAML key");
    }
    let ids = gateway_field_ids();
    for key in keys.keys().filter_map(Value::as_str) {
        assert!(
            key == "workers" || ids.iter().any(|id| id == key),
            "`{key}` is a YAML key but not a flag"
        );
    }
}

/// A value for every key, none of them the default.
const EVERY_KEY: &str = "
  epd_disaggregation: true
  encode_policy: random
  mm_processing: router
  mm_per_request_image_limit: 8
  mm_allowed_media_domains: media.test
  mm_allow_private_media_hosts: true
  encode_selector: [role=e]
  pd_pairing_mode: strict
  dp_aware: true
  pd_admission_wait_secs: 7
  model_path: org/model
  tokenizer_path: /tok
  chat_template: /t.jinja
  tokenizer_cache_enable_l0: true
  tokenizer_cache_l0_max_entries: 500
  tokenizer_cache_enable_l1: true
  tokenizer_cache_l1_max_memory: 1048576
  host: 127.0.0.2
  port: 31000
  health_check_port: 31005
  prometheus_host: 127.0.0.3
  prometheus_port: 29001
  prometheus_duration_buckets: [0.5, 1.0, 2.5]
  admin_host: 127.0.0.4
  admin_port: 31010
  policy: least_load
  prefill_policy: bucket
  decode_policy: round_robin
  cache_threshold: 0.35
  balance_abs_threshold: 65
  balance_rel_threshold: 1.75
  balance_token_usage_threshold: 0.5
  overload_token_usage_threshold: 0.85
  overlap_decay: 0.25
  selection_temperature: 0.125
  eviction_interval: 121
  max_tree_size: 1000
  block_size: 32
  cache_boundaries: [128, 512]
  cache_index: hash
  cache_ttl_secs: 181
  max_idle_secs: 100
  assignment_mode: min_group
  prefix_token_count: 128
  prefix_hash_load_factor: 1.5
  prefix_hash_balance_abs_threshold: 11
  least_load_kv_pressure_weight: 0.25
  least_load_default_throughput: 1500.5
  least_load_mean_prefill_tokens: 512
  least_load_max_waiting_requests: 4
  routing_key_override: true
  routing_key_headers: [x-a, x-b]
  load_monitor_interval: 11
  worker_overload_protection: true
  worker_overload_waiting_requests: 12
  worker_overload_token_usage: 0.75
  api_key: sekret
  admin_trusted: [10.0.0.0/8, 192.168.0.1]
  max_payload_size: 1024
  request_timeout_secs: 900
  upstream_pool_idle_timeout_secs: 2
  request_id_headers: [x-req, x-trace]
  connect_timeout_ms: 1500
  body_read_timeout_secs: 30
  prefill_head_timeout_secs: 301
  decode_first_byte_timeout_secs: 302
  stream_idle_timeout_secs: 303
  max_concurrent_requests: 64
  queue_size: 9
  queue_timeout_secs: 7
  rate_limit_tokens_per_second: 50
  disable_link_health: true
  link_window_secs: 61
  link_min_handoffs: 21
  link_failure_ratio: 0.6
  link_cooldown_secs: 31
  link_probe_successes: 4
  link_canary_interval_secs: 15
  capacity_window_secs: 30
  config_watch_interval_secs: 4
  cors_allowed_origins: [http://localhost:3000]
  retry_max_retries: 3
  retry_initial_backoff_ms: 20
  retry_max_backoff_ms: 2000
  retry_backoff_multiplier: 2.0
  retry_jitter_factor: 0.5
  disable_retries: true
  cb_failure_threshold: 4
  cb_success_threshold: 5
  cb_timeout_duration_secs: 61
  cb_window_duration_secs: 121
  disable_circuit_breaker: true
  health_failure_threshold: 6
  health_success_threshold: 7
  health_check_timeout_secs: 8
  health_check_interval_secs: 9
  health_check_endpoint: /healthz
  disable_health_check: true
  remove_unhealthy_workers: false
  drain_settle_secs: 10
  worker_startup_timeout_secs: 600
  worker_startup_check_interval: 15
  worker_startup_delay: 2
  log_level: debug
  log_json: true
  enable_trace: true
  otlp_traces_endpoint: 'collector:4317'
  workers_file: /etc/pdgate/workers.yaml
  service_discovery: true
  discovery_provider: kubernetes
  discovery_file: /etc/pdgate/discovery.json
  discovery_check_interval_secs: 7
  selector: [app=x]
  prefill_selector: [app=sglang, role=prefill]
  decode_selector: [app=sglang, role=decode]
  service_discovery_port: 8000
  service_discovery_namespace: inference
  kv_connector_annotation: example.com/kv-connector
  kv_engine_id_annotation: example.com/kv-engine-id";

/// The argv that sets what `cfg` sets, built from its serialized form and clap's own view of
/// each flag (switch or value, delimiter).
fn argv_for(cfg: &GatewayConfig) -> Vec<String> {
    let Value::Mapping(map) = serde_yaml::to_value(cfg).expect("serializes") else {
        panic!("a mapping")
    };
    let cmd = gateway_command();
    let mut argv = vec!["--pd-disaggregation".to_string()];
    for (key, value) in &map {
        let key = key.as_str().expect("string keys");
        if key == "workers" || key == "pd_disaggregation" || value.is_null() {
            continue;
        }
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_id() == key)
            .expect("every key is a flag");
        let flag = format!("--{}", key.replace('_', "-"));
        let scalar = |v: &Value| match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            other => panic!("unexpected {other:?}"),
        };
        match value {
            Value::Bool(true) if !arg.get_action().takes_values() => argv.push(flag),
            Value::Bool(false) if !arg.get_action().takes_values() => {}
            Value::Sequence(items) => {
                let items: Vec<String> = items.iter().map(scalar).collect();
                argv.push(flag);
                match arg.get_value_delimiter() {
                    Some(d) => argv.push(items.join(&d.to_string())),
                    None => argv.extend(items),
                }
            }
            _ if key == "api_key" => argv.extend([flag, cfg.api_key.clone().expect("set")]),
            other => argv.extend([flag, scalar(other)]),
        }
    }
    argv
}

#[test]
fn every_yaml_key_and_its_flag_build_the_same_config() {
    // Parse without validation (the values are chosen to differ from the defaults, not to make
    // sense together).
    let text = format!("gateway:\n  pd_disaggregation: true\n{EVERY_KEY}\n");
    let from_yaml: GatewayConfig =
        serde_yaml::from_value::<Value>(serde_yaml::from_str(&text).expect("yaml"))
            .ok()
            .and_then(|v| v.get("gateway").cloned())
            .map(|g| serde_yaml::from_value(g).expect("every key parses"))
            .expect("gateway section");

    let default = serde_yaml::to_value(GatewayConfig::default()).expect("serializes");
    let set = serde_yaml::to_value(&from_yaml).expect("serializes");
    for id in gateway_field_ids() {
        if id != "pd_disaggregation" {
            assert_ne!(
                default.get(&id),
                set.get(&id),
                "EVERY_KEY must give `{id}` a non-default value"
            );
        }
    }

    let argv = argv_for(&from_yaml);
    let argv_refs: Vec<&str> = argv.iter().map(String::as_str).collect();
    let from_flags = launch_args(&argv_refs).expect("the flags parse").gateway;
    assert_eq!(from_yaml, from_flags, "argv: {argv:?}");
}

#[test]
fn smg_aliases_work_as_flags_and_as_yaml_keys() {
    let from_yaml = yaml(
        "  cache_match_threshold: 0.5\n  spill_abs_threshold: 3\n  spill_rel_threshold: 2.0\n  sticky_key_idle_secs: 9\n  sticky_sessions: true\n  worker_auto_recovery: true\n  model: m",
    )
    .expect("aliases parse")
    .gateway;
    let from_flags = launch(&[
        "--pd-disaggregation",
        "--cache-match-threshold",
        "0.5",
        "--spill-abs-threshold",
        "3",
        "--spill-rel-threshold",
        "2.0",
        "--sticky-key-idle-secs",
        "9",
        "--sticky-sessions",
        "--worker-auto-recovery",
        "--model",
        "m",
    ])
    .expect("alias flags parse")
    .gateway;
    assert_eq!(from_yaml, from_flags);
    assert_eq!(from_yaml.cache_threshold, 0.5);
    assert_eq!(from_yaml.remove_unhealthy_workers, Some(true));
    assert_eq!(from_yaml.model_path.as_deref(), Some("m"));
}

#[test]
fn eviction_interval_takes_smg_1_13_spelling_and_default() {
    let eviction = |argv: &[&str]| {
        let mut full = vec!["--pd-disaggregation"];
        full.extend_from_slice(argv);
        launch(&full)
            .unwrap_or_else(|e| panic!("{argv:?}: {e}"))
            .gateway
            .eviction_interval
    };
    assert_eq!(eviction(&["--eviction-interval-secs", "30"]), 30);
    // The older SMG spelling still parses.
    assert_eq!(eviction(&["--eviction-interval", "30"]), 30);
    assert_eq!(eviction(&["--eviction-interval=30"]), 30);
    // SMG 1.13.0's default (older SMG had 120).
    assert_eq!(eviction(&[]), 60);
    assert_eq!(GatewayConfig::default().eviction_interval, 60);
    assert_eq!(
        yaml("  eviction_interval: 30")
            .expect("the YAML key")
            .gateway
            .eviction_interval,
        30
    );
    let zero = launch_error(&["--pd-disaggregation", "--eviction-interval-secs", "0"]);
    assert!(zero.contains("eviction_interval"), "{zero}");
}

#[test]
fn smg_off_switches_map_onto_the_gateway_keys() {
    for flag in ["--no-remove-unhealthy-workers", "--no-worker-auto-recovery"] {
        let g = launch(&[
            "--pd-disaggregation",
            "--service-discovery",
            "--prefill-selector",
            "r=p",
            "--decode-selector",
            "r=d",
            flag,
        ])
        .unwrap_or_else(|e| panic!("{flag}: {e}"))
        .gateway;
        assert_eq!(g.remove_unhealthy_workers, Some(false), "{flag}");
    }
    let both = launch_args(&[
        "--pd-disaggregation",
        "--remove-unhealthy-workers",
        "--no-remove-unhealthy-workers",
    ])
    .expect_err("SMG's group is mutually exclusive");
    assert!(both.contains("cannot be used with"), "{both}");

    let off = launch(&[
        "--pd-disaggregation",
        "--worker-overload-protection",
        "--worker-overload-waiting-requests",
        "4",
        "--worker-overload-token-usage",
        "0.7",
        "--disable-worker-overload-protection",
    ])
    .expect("accepted");
    assert!(off.notices.is_empty(), "{:?}", off.notices);
    let g = off.gateway;
    assert!(!g.worker_overload_protection);
    assert_eq!(
        (
            g.worker_overload_waiting_requests,
            g.worker_overload_token_usage
        ),
        (None, None)
    );
    assert!(!g.overload().enabled());
}

#[test]
fn policy_names_are_smg_names() {
    for name in [
        "cache_aware",
        "prefix_hash",
        "consistent_hashing",
        "power_of_two",
        "least_load",
        "round_robin",
        "random",
        "manual",
        "bucket",
        "passthrough",
    ] {
        let kind = PolicyName::from_str_for_test(name);
        assert_eq!(kind.as_str(), name);
        assert_eq!(
            serde_yaml::from_str::<PolicyName>(name).expect("serde name"),
            kind
        );
    }
    let err = yaml_error("  policy: round-robin");
    assert!(
        err.contains("policy") && err.contains("round-robin"),
        "{err}"
    );
}

impl PolicyName {
    fn from_str_for_test(name: &str) -> PolicyName {
        <PolicyName as clap::ValueEnum>::from_str(name, false).expect("a clap value")
    }
}

// ---- --prefill URL [PORT|none] -------------------------------------------------------------------

#[test]
fn prefill_takes_an_optional_port_or_none() {
    let argv: Vec<String> = [
        "--pd-disaggregation",
        "--prefill",
        "http://p1:8000",
        "8998",
        "--prefill",
        "http://p2:8000",
        "none",
        "--decode",
        "http://d1:8000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(
        normalize_launch_argv(argv),
        [
            "--pd-disaggregation",
            "--prefill",
            "http://p1:8000 8998",
            "--prefill",
            "http://p2:8000 none",
            "--decode",
            "http://d1:8000"
        ]
    );
    let loaded = launch(&[
        "--pd-disaggregation",
        "--prefill",
        "http://p1:8000",
        "8998",
        "--prefill",
        "http://p2:8000",
        "none",
        "--decode",
        "http://d1:8000",
    ])
    .expect("valid");
    let w = &loaded.gateway.workers;
    assert_eq!(w.len(), 3);
    assert_eq!(
        (w[0].url.as_str(), w[0].worker_type, w[0].bootstrap_port),
        ("http://p1:8000", WorkerType::Prefill, Some(8998))
    );
    assert_eq!(
        (w[1].url.as_str(), w[1].bootstrap_port),
        ("http://p2:8000", None)
    );
    assert_eq!(
        (w[2].url.as_str(), w[2].worker_type, w[2].bootstrap_port),
        ("http://d1:8000", WorkerType::Decode, None)
    );
    assert!(w
        .iter()
        .all(|w| w.labels.is_empty() && w.runtime_type == RuntimeType::Unspecified));
}

#[test]
fn prefill_port_token_rules_follow_smg() {
    let norm = |a: &[&str]| normalize_launch_argv(a.iter().map(|s| s.to_string()).collect());
    // Next token is a flag: no port.
    assert_eq!(
        norm(&["--prefill", "http://p:1", "--decode", "http://d:1"]),
        ["--prefill", "http://p:1", "--decode", "http://d:1"]
    );
    // `none` in any case; `--prefill=URL` form.
    assert_eq!(
        norm(&["--prefill=http://p:1", "NONE"]),
        ["--prefill", "http://p:1 NONE"]
    );
    // Last argument.
    assert_eq!(
        norm(&["--prefill", "http://p:1"]),
        ["--prefill", "http://p:1"]
    );
    // After `--` nothing is touched.
    assert_eq!(
        norm(&["--", "--prefill", "x", "1"]),
        ["--", "--prefill", "x", "1"]
    );
    // --encode has the same shape (and is refused later).
    assert_eq!(
        norm(&["--encode", "grpc://e:1", "8995"]),
        ["--encode", "grpc://e:1 8995"]
    );

    let zero = launch_args(&["--pd-disaggregation", "--prefill", "http://p:1", "0"])
        .expect_err("port 0 refused");
    assert!(zero.contains("bootstrap port 0"), "{zero}");
    let big = launch_args(&["--pd-disaggregation", "--prefill", "http://p:1", "70000"])
        .expect_err("out of range");
    assert!(big.contains("'70000' is not a port number"), "{big}");
}

#[test]
fn launch_workers_carry_the_api_key_and_smg_connection_attempts() {
    let loaded = launch(&[
        "--pd-disaggregation",
        "--api-key",
        "k1",
        "--health-success-threshold",
        "3",
        "--prefill",
        "http://p:1",
        "--decode",
        "http://d:1",
    ])
    .expect("valid");
    for w in &loaded.gateway.workers {
        assert_eq!(w.api_key.as_deref(), Some("k1"));
        assert_eq!(w.max_connection_attempts, 30);
    }
    assert_eq!(loaded.source, ConfigSource::Launch);
}

#[test]
fn launch_worker_errors_name_the_flag() {
    let err = launch_error(&[
        "--pd-disaggregation",
        "--prefill",
        "ftp://p:1",
        "--decode",
        "http://d:1",
    ]);
    assert!(err.starts_with("--prefill ftp://p:1.url:"), "{err}");
    let dup = launch_error(&[
        "--pd-disaggregation",
        "--decode",
        "http://d:1",
        "--decode",
        "http://d:1/",
    ]);
    assert!(
        dup.contains("already configured by --decode http://d:1"),
        "{dup}"
    );
}

#[test]
fn launch_maps_process_flags_onto_pingora() {
    let loaded = launch(&[
        "--pd-disaggregation",
        "--runtime-worker-threads",
        "4",
        "--shutdown-grace-period-secs",
        "9",
    ])
    .expect("valid");
    assert_eq!(loaded.server_conf.threads, 4);
    assert_eq!(loaded.server_conf.grace_period_seconds, Some(9));
    assert_eq!(loaded.server_conf.version, 1);
    let default = launch(&["--pd-disaggregation"]).expect("valid");
    assert!(default.server_conf.threads >= 1);
    assert_eq!(default.server_conf.grace_period_seconds, Some(180));
    assert!(
        launch_error(&["--pd-disaggregation", "--runtime-worker-threads", "0"])
            .contains("runtime_worker_threads")
    );
}

#[test]
fn grpc_only_flags_parse_into_the_model() {
    let g = launch(&[
        "--pd-disaggregation",
        "--model-path",
        "meta/llama",
        "--tokenizer-path",
        "/tok",
        "--chat-template",
        "/t.jinja",
        "--pd-admission-wait-secs",
        "0",
    ])
    .expect("valid")
    .gateway;
    assert_eq!(g.model_path.as_deref(), Some("meta/llama"));
    assert_eq!(g.tokenizer_path.as_deref(), Some("/tok"));
    assert_eq!(g.chat_template.as_deref(), Some("/t.jinja"));
    assert_eq!(g.pd_admission_wait_secs, 0);
}

#[test]
fn log_level_flag_sets_the_default_filter() {
    let g = launch(&["--pd-disaggregation", "--log-level", "debug"])
        .expect("valid")
        .gateway;
    assert_eq!(g.log_filter(), log::LevelFilter::Debug);
}

// ---- SMG flags pdgate does not implement -------------------------------------------------------

#[test]
fn launch_without_pd_disaggregation_is_refused() {
    let err = launch_error(&["--prefill", "http://p:1", "--decode", "http://d:1"]);
    assert!(
        err.contains("--pd-disaggregation") && err.contains("only prefill/decode"),
        "{err}"
    );
}

#[test]
fn unsupported_smg_features_are_refused_with_the_reason() {
    let err = launch_error(&[
        "--pd-disaggregation",
        "--router-selector",
        "app=r",
        "--enable-igw",
    ]);
    assert!(
        err.contains("--router-selector") && err.contains("--enable-igw"),
        "{err}"
    );
    // EPD runs over gRPC only; encode workers need EPD mode.
    let epd = launch_error(&["--epd-disaggregation", "--encode", "http://e:1", "8995"]);
    assert!(epd.contains("EPD runs only over gRPC"), "{epd}");
    let pd = launch_error(&["--pd-disaggregation", "--encode", "grpc://e:1", "8995"]);
    assert!(pd.contains("--epd-disaggregation"), "{pd}");
    let both = launch_error(&["--pd-disaggregation", "--epd-disaggregation"]);
    assert!(both.contains("either"), "{both}");
    let rdma = launch_error(&["--pd-disaggregation", "--mm-pixel-rdma"]);
    assert!(
        rdma.contains("--mm-pixel-rdma") && rdma.contains("inline"),
        "{rdma}"
    );
    let regular = launch_error(&["--pd-disaggregation", "--worker-urls", "http://w:1"]);
    assert!(regular.contains("--worker-urls"), "{regular}");
}

#[test]
fn smg_off_values_are_not_feature_requests() {
    let loaded = launch(&[
        "--pd-disaggregation",
        "--max-concurrent-requests",
        "-1",
        "--history-backend",
        "memory",
        "--backend",
        "vllm",
        "--rate-limit-tokens-per-second",
        "0",
    ])
    .expect("off values are accepted");
    assert!(
        loaded
            .notices
            .iter()
            .any(|n| n.starts_with("--backend has no effect")),
        "{:?}",
        loaded.notices
    );
    assert!(
        launch_error(&["--pd-disaggregation", "--history-backend", "redis"])
            .contains("--history-backend")
    );
    assert!(launch_error(&["--pd-disaggregation", "--backend", "openai"]).contains("--backend"));
}

#[test]
fn smg_prefill_cap_off_values_are_accepted_and_a_cap_is_refused() {
    for off in ["-1", "0"] {
        let loaded = launch(&[
            "--pd-disaggregation",
            "--prefill-max-inflight-requests-per-worker",
            off,
        ])
        .unwrap_or_else(|e| panic!("{off}: {e}"));
        assert!(loaded.notices.is_empty(), "{off}: {:?}", loaded.notices);
    }
    let err = launch_error(&[
        "--pd-disaggregation",
        "--prefill-max-inflight-requests-per-worker",
        "8",
        "--prefill-queue-size",
        "10",
    ]);
    assert!(
        err.contains("--prefill-max-inflight-requests-per-worker")
            && !err.contains("--prefill-queue-size"),
        "{err}"
    );
    // Alone, the queue settings only tune a cap that is not there.
    let loaded = launch(&["--pd-disaggregation", "--prefill-queue-size", "10"]).expect("accepted");
    assert!(
        loaded
            .notices
            .iter()
            .any(|n| n.starts_with("--prefill-queue-size has no effect")),
        "{:?}",
        loaded.notices
    );
}

#[test]
fn smg_admission_and_operator_flags_map_onto_the_config() {
    let g = launch(&[
        "--pd-disaggregation",
        "--max-concurrent-requests",
        "64",
        "--queue-size",
        "8",
        "--queue-timeout-secs",
        "5",
        "--rate-limit-tokens-per-second",
        "100",
        "--cors-allowed-origins",
        "http://localhost:3000",
        "https://app.example",
        "--log-json",
    ])
    .expect("SMG's rate-limiting, CORS and log flags are accepted")
    .gateway;
    assert_eq!(g.max_concurrent_requests, 64);
    assert_eq!((g.queue_size, g.queue_timeout_secs), (8, 5));
    assert_eq!(g.rate_limit_tokens_per_second, Some(100));
    assert_eq!(
        g.cors_allowed_origins,
        ["http://localhost:3000", "https://app.example"]
    );
    assert!(g.log_json);
    // SMG's defaults: the derived bound, a queue of 100 for 60 s, no rate, no CORS.
    let d = GatewayConfig::default();
    assert_eq!(
        (
            d.max_concurrent_requests,
            d.queue_size,
            d.queue_timeout_secs
        ),
        (-1, 100, 60)
    );
    assert_eq!(d.rate_limit_tokens_per_second, None);
    assert!(d.cors_allowed_origins.is_empty() && !d.log_json);

    for (args, key) in [
        (
            &["--max-concurrent-requests", "-2"][..],
            "max_concurrent_requests",
        ),
        (&["--queue-timeout-secs", "0"][..], "queue_timeout_secs"),
        (
            &["--rate-limit-tokens-per-second", "-1"][..],
            "rate_limit_tokens_per_second",
        ),
        (
            &["--cors-allowed-origins", "*", "http://a.example"][..],
            "cors_allowed_origins",
        ),
        (
            &["--cors-allowed-origins", "http://a.example/app"][..],
            "cors_allowed_origins",
        ),
    ] {
        let mut argv = vec!["--pd-disaggregation"];
        argv.extend_from_slice(args);
        assert!(
            launch_error(&argv).contains(key),
            "{args:?}: {}",
            launch_error(&argv)
        );
    }
    // No queue needs no timeout.
    launch(&[
        "--pd-disaggregation",
        "--queue-size",
        "0",
        "--queue-timeout-secs",
        "0",
    ])
    .expect("queue_size 0 refuses at once, no timeout needed");
}

#[test]
fn harmless_smg_flags_are_accepted_with_a_notice() {
    let loaded = launch(&[
        "--pd-disaggregation",
        "--job-queue-capacity",
        "10",
        "--upstream-http2",
        "--reasoning-parser",
        "qwen3",
    ])
    .expect("accepted");
    assert_eq!(loaded.notices.len(), 3, "{:?}", loaded.notices);
    assert!(loaded
        .notices
        .iter()
        .any(|n| n.starts_with("--upstream-http2 has no effect in pdgate")));
}

#[test]
fn every_smg_only_flag_is_classified_and_detected() {
    let cmd = SmgOnlyFlags::augment_args(clap::Command::new("pdgate"));
    let gateway_ids = gateway_field_ids();
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        assert!(
            !gateway_ids.iter().any(|g| g == id),
            "`{id}` is both a gateway key and an SMG-only flag"
        );
        assert!(
            SMG_ONLY_FLAGS.iter().any(|(name, _, _)| *name == id),
            "`{id}` has no disposition"
        );
        let flag = format!("--{}", arg.get_long().expect("long flag"));
        let mut argv = vec!["--pd-disaggregation".to_string(), flag];
        if arg.get_action().takes_values() {
            let last = arg
                .get_possible_values()
                .last()
                .map(|v| v.get_name().to_string());
            argv.push(last.unwrap_or_else(|| "1".to_string()));
        }
        let argv_refs: Vec<&str> = argv.iter().map(String::as_str).collect();
        let parsed = launch_args(&argv_refs).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        assert!(
            parsed.smg_only.given().contains(&id),
            "{argv:?} is not detected"
        );
    }
    for (name, _, _) in SMG_ONLY_FLAGS {
        assert!(
            cmd.get_arguments().any(|a| a.get_id() == *name),
            "table entry `{name}` is not a flag"
        );
    }
}

// ---- validation refusals -------------------------------------------------------------------------

#[test]
fn pd_disaggregation_is_required() {
    let err = parse_yaml(&format!("gateway:{PD_PAIR}\n"))
        .expect_err("PD-only")
        .to_string();
    assert!(
        err.starts_with("gateway.pd_disaggregation (--pd-disaggregation):"),
        "{err}"
    );
}

#[test]
fn bucket_is_refused_as_the_decode_policy() {
    let explicit = yaml_error("  decode_policy: bucket");
    assert!(
        explicit.starts_with("gateway.decode_policy (--decode-policy): bucket routes prefill only"),
        "{explicit}"
    );
    let inherited = yaml_error("  policy: bucket");
    assert!(
        inherited.starts_with("gateway.policy (--policy): bucket"),
        "{inherited}"
    );
    yaml("  policy: bucket\n  decode_policy: round_robin").expect("bucket on prefill only is fine");
}

#[test]
fn passthrough_is_refused_as_a_leg_policy() {
    for key in ["prefill_policy", "decode_policy"] {
        let err = yaml_error(&format!("  {key}: passthrough"));
        assert!(
            err.contains(&format!("gateway.{key}"))
                && err.contains("passthrough is accepted only by `policy`"),
            "{err}"
        );
    }
    yaml("  policy: passthrough").expect("passthrough is a valid --policy");
}

#[test]
fn power_of_two_needs_two_workers_on_its_leg() {
    let prefill = yaml_error(&format!("  prefill_policy: power_of_two{PD_PAIR}"));
    assert!(
        prefill.contains("gateway.prefill_policy")
            && prefill.contains("two prefill workers")
            && prefill.contains("1 prefill"),
        "{prefill}"
    );
    let decode = yaml_error(&format!("  decode_policy: power_of_two{PD_PAIR}"));
    assert!(decode.contains("gateway.decode_policy"), "{decode}");
    let total = yaml_error(
        "  policy: power_of_two\n  workers:\n    - {url: 'http://p:1', worker_type: prefill}",
    );
    assert!(total.contains("gateway.policy"), "{total}");
    // SMG: `--policy power_of_two` needs two URLs in total, not two per leg.
    yaml(&format!("  policy: power_of_two{PD_PAIR}")).expect("two URLs in total");
    // No startup workers at all: dynamic registration.
    yaml("  prefill_policy: power_of_two\n  decode_policy: power_of_two")
        .expect("dynamic registration");
    let launch_err = launch_error(&[
        "--pd-disaggregation",
        "--decode-policy",
        "power_of_two",
        "--prefill",
        "http://p:1",
        "--decode",
        "http://d:1",
    ]);
    assert!(launch_err.contains("--decode-policy"), "{launch_err}");
}

#[test]
fn thresholds_out_of_range_are_refused() {
    let cases = [
        (
            "balance_rel_threshold: 0.9",
            "gateway.balance_rel_threshold",
        ),
        ("cache_threshold: 1.5", "gateway.cache_threshold"),
        (
            "worker_overload_token_usage: 0.0",
            "gateway.worker_overload_token_usage",
        ),
        (
            "worker_overload_token_usage: 1.5",
            "gateway.worker_overload_token_usage",
        ),
        (
            "worker_overload_waiting_requests: 0",
            "gateway.worker_overload_waiting_requests",
        ),
        ("retry_jitter_factor: 1.5", "gateway.retry_jitter_factor"),
        (
            "retry_backoff_multiplier: 0.5",
            "gateway.retry_backoff_multiplier",
        ),
        (
            "retry_initial_backoff_ms: 500\n  retry_max_backoff_ms: 100",
            "gateway.retry_initial_backoff_ms",
        ),
        ("cb_failure_threshold: 0", "gateway.cb_failure_threshold"),
        (
            "health_success_threshold: 0",
            "gateway.health_success_threshold",
        ),
        (
            "health_check_endpoint: health",
            "gateway.health_check_endpoint",
        ),
        (
            "prefix_hash_load_factor: 0.5",
            "gateway.prefix_hash_load_factor",
        ),
        (
            "least_load_default_throughput: 0",
            "gateway.least_load_default_throughput",
        ),
        ("load_monitor_interval: 0", "gateway.load_monitor_interval"),
        ("request_timeout_secs: 0", "gateway.request_timeout_secs"),
        ("cache_boundaries: [0]", "gateway.cache_boundaries"),
        (
            "prometheus_duration_buckets: [1.0, 0.5]",
            "gateway.prometheus_duration_buckets",
        ),
        (
            "routing_key_headers: ['bad header']",
            "gateway.routing_key_headers",
        ),
        ("request_id_headers: ['x:y']", "gateway.request_id_headers"),
        ("api_key: ''", "gateway.api_key"),
        ("model_path: ''", "gateway.model_path"),
    ];
    for (body, location) in cases {
        let err = yaml_error(&format!("  {body}"));
        assert!(err.starts_with(location), "`{body}` → {err}");
    }
}

#[test]
fn listener_mistakes_are_refused() {
    assert!(yaml_error("  port: 0").starts_with("gateway.port"));
    let collide = yaml_error("  port: 29000");
    assert!(
        collide.starts_with("gateway.prometheus_port") && collide.contains("already used by port"),
        "{collide}"
    );
    yaml("  host: 127.0.0.1\n  prometheus_host: 127.0.0.2\n  prometheus_port: 30000")
        .expect("different hosts");
    assert!(yaml_error("  admin_host: 0.0.0.0").starts_with("gateway.admin_host"));
    let admin = yaml_error("  admin_port: 30000");
    assert!(admin.starts_with("gateway.admin_port"), "{admin}");
    assert!(yaml_error("  health_check_port: 29000").starts_with("gateway.health_check_port"));
    assert!(yaml_error("  host: ''").starts_with("gateway.host"));
}

#[test]
fn bad_worker_urls_are_refused() {
    let cases = [
        ("p0:8000", "has no scheme"),
        ("HTTP://p0:8000", "must be lowercase"),
        ("ftp://p0:8000", "unsupported scheme 'ftp'"),
        ("http://:8000", "no host"),
        ("http://p0:0", "port 0"),
        (
            "ipc:///tmp/engine.sock",
            "ipc:// (ZMQ) worker cannot be a prefill worker",
        ),
        (
            "grpcs://p0:50051",
            "grpcs:// (TLS) workers are not supported",
        ),
        ("grpc://p0", "needs the servicer's port"),
        ("grpc://p0:50051/v1", "has no path"),
    ];
    for (url, expected) in cases {
        let err = yaml_error(&format!(
            "  workers:\n    - {{url: '{url}', worker_type: prefill}}"
        ));
        assert!(
            err.starts_with("gateway.workers[0].url:") && err.contains(expected),
            "{url} → {err}"
        );
    }
}

#[test]
fn grpc_workers_are_accepted_from_yaml_and_launch() {
    let g = yaml(
        "  workers:\n    - {url: 'grpc://p0:50051', worker_type: prefill, bootstrap_port: 9000}\n    - {url: 'grpc://d0:50052/', worker_type: decode}",
    )
    .expect("grpc:// workers are valid")
    .gateway;
    assert_eq!(g.workers[0].bootstrap_port, Some(9000));
    let g = launch(&[
        "--pd-disaggregation",
        "--prefill",
        "grpc://p0:50051",
        "9000",
        "--decode",
        "grpc://d0:50052",
    ])
    .expect("grpc:// workers on the command line")
    .gateway;
    assert_eq!(g.workers[0].url, "grpc://p0:50051");
    assert_eq!(g.workers[0].bootstrap_port, Some(9000));
    assert_eq!(g.workers[1].url, "grpc://d0:50052");
}

#[test]
fn duplicate_worker_urls_are_refused() {
    let err = yaml_error(
        "  workers:\n    - {url: 'http://p:1', worker_type: prefill}\n    - {url: 'http://p:1/', worker_type: decode}",
    );
    assert!(
        err.starts_with("gateway.workers[1].url:")
            && err.contains("already configured by gateway.workers[0]"),
        "{err}"
    );
}

#[test]
fn startup_workers_must_be_prefill_or_decode() {
    let regular = yaml_error("  workers:\n    - url: 'http://w:1'");
    assert!(
        regular.starts_with("gateway.workers[0].worker_type:")
            && regular.contains("worker_type: prefill"),
        "{regular}"
    );
    let encode =
        yaml("  workers:\n    - {url: 'grpc://e:1', worker_type: encode}").expect_err("EPD");
    assert_eq!(encode.kind(), ConfigErrorKind::Invalid);
    assert!(
        encode.to_string().contains("epd_disaggregation"),
        "{encode}"
    );
}

#[test]
fn worker_field_ranges_are_refused() {
    let cases = [
        ("bootstrap_port: 0", "bootstrap_port"),
        ("api_key: ''", "api_key"),
        (
            "overload: {waiting_requests: 0}",
            "overload.waiting_requests",
        ),
        ("overload: {token_usage: 1.5}", "overload.token_usage"),
        (
            "resilience: {jitter_factor: 2.0}",
            "resilience.jitter_factor",
        ),
        (
            "resilience: {retryable_status_codes: [42]}",
            "resilience.retryable_status_codes",
        ),
        ("health: {success_threshold: 0}", "health.success_threshold"),
        ("dp_size: 2\n      dp_rank: 2", "dp_rank"),
        ("max_connection_attempts: 0", "max_connection_attempts"),
        ("cost: -1.0", "cost"),
    ];
    for (field, location) in cases {
        let body = format!(
            "  workers:\n    - url: 'http://p:1'\n      worker_type: prefill\n      {field}"
        );
        let err = yaml_error(&body);
        assert!(
            err.starts_with(&format!("gateway.workers[0].{location}:")),
            "`{field}` → {err}"
        );
    }
}

#[test]
fn unknown_gateway_keys_are_clear_errors() {
    let typo = yaml_error("  polcy: round_robin");
    assert!(
        typo.starts_with("gateway.polcy: unknown key; did you mean `policy`?"),
        "{typo}"
    );
    let smg = yaml("  enable_igw: true").expect_err("SMG-only");
    assert_eq!(smg.kind(), ConfigErrorKind::Unsupported);
    assert!(
        smg.to_string()
            .contains("is SMG's --enable-igw, which pdgate does not support"),
        "{smg}"
    );
    let ignored = yaml_error("  job_queue_capacity: 10");
    assert!(
        ignored.contains("has no effect in pdgate") && ignored.contains("remove it"),
        "{ignored}"
    );
    let process = yaml_error("  runtime_worker_threads: 4");
    assert!(
        process.contains("Pingora's top-level `threads`"),
        "{process}"
    );
    let prefill = yaml_error("  prefill: ['http://p:1']");
    assert!(
        prefill.contains("startup workers go in `workers:`"),
        "{prefill}"
    );
}

#[test]
fn a_gateway_key_at_the_top_level_is_refused() {
    let err = parse_yaml("port: 8080\ngateway:\n  pd_disaggregation: true\n")
        .expect_err("misplaced")
        .to_string();
    assert!(
        err.contains("`port` is a pdgate setting; move it under `gateway:`"),
        "{err}"
    );
    let unknown =
        parse_yaml("thread: 2\ngateway:\n  pd_disaggregation: true\n").expect("only a notice");
    assert!(
        unknown.notices[0].contains("unknown top-level key `thread`"),
        "{:?}",
        unknown.notices
    );
}

#[test]
fn a_file_without_a_gateway_section_is_refused() {
    let err = parse_yaml("version: 1\nthreads: 2\n")
        .expect_err("no gateway")
        .to_string();
    assert!(err.contains("no `gateway:` section"), "{err}");
    assert!(parse_yaml("- 1\n")
        .expect_err("not a mapping")
        .to_string()
        .contains("YAML mapping"));
    assert!(parse_yaml("gateway: [\n")
        .expect_err("bad yaml")
        .to_string()
        .starts_with("invalid YAML"));
}

#[test]
fn type_errors_name_the_key() {
    let err = yaml_error("  port: thirty");
    assert!(
        err.contains("gateway.port") && err.contains("thirty"),
        "{err}"
    );
}

#[test]
fn pingora_settings_are_validated_by_pingora() {
    let err = parse_yaml("max_blocking_threads: 0\ngateway:\n  pd_disaggregation: true\n")
        .expect_err("pingora refuses");
    assert!(err.to_string().contains("max_blocking_threads"), "{err}");
}

#[test]
fn unknown_worker_keys_are_ignored_with_a_notice() {
    let loaded =
        yaml("  workers:\n    - {url: 'http://p:1', worker_type: prefill, bootstrap_prot: 8998}")
            .expect("ignored, as SMG");
    assert_eq!(loaded.gateway.workers[0].bootstrap_port, None);
    assert!(
        loaded.notices[0].contains(
            "unknown worker key `bootstrap_prot` ignored; did you mean `bootstrap_port`?"
        ),
        "{:?}",
        loaded.notices
    );
}

#[test]
fn worker_settings_pdgate_does_not_apply_are_reported_with_a_notice() {
    let loaded = yaml(
        "  workers:\n    - {url: 'http://p:1', worker_type: prefill, resilience: {max_retries: 5, \
         cb_failure_threshold: 3, cb_window_secs: 30}, http_pool: {pool_max_idle_per_host: 8}}\n    \
         - {url: 'http://d:1', worker_type: decode, resilience: {cb_failure_threshold: 3}}",
    )
    .expect("accepted, as SMG");
    let expected = [
        "gateway.workers[0]: `resilience.max_retries` has no effect in pdgate: retries are gateway-wide",
        "gateway.workers[0]: `resilience.cb_window_secs` has no effect in pdgate",
        "gateway.workers[0]: `http_pool` has no effect in pdgate",
    ];
    assert_eq!(loaded.notices.len(), expected.len(), "{:?}", loaded.notices);
    for (notice, start) in loaded.notices.iter().zip(expected) {
        assert!(
            notice.starts_with(start),
            "{notice:?} should start with {start:?}"
        );
    }
    // The breaker's overrides apply: nothing to report for the decode.
    assert!(loaded.notices.iter().all(|n| !n.contains("workers[1]")));
}

#[test]
fn validate_alone_skips_counts_that_depend_on_an_unread_workers_file() {
    let mut cfg = GatewayConfig {
        pd_disaggregation: true,
        decode_policy: Some(PolicyName::PowerOfTwo),
        ..GatewayConfig::default()
    };
    cfg.workers = vec![
        WorkerSpec::new("http://p:1", WorkerType::Prefill),
        WorkerSpec::new("http://d:1", WorkerType::Decode),
    ];
    assert!(validate(&cfg).is_err());
    cfg.workers_file = Some(PathBuf::from("workers.yaml"));
    validate(&cfg).expect("the file may hold more decode workers");
}

// ---- worker spec intake (POST /workers) ------------------------------------------------------------

#[test]
fn worker_spec_json_from_the_spec_parses_with_unknown_keys_ignored() {
    let body = br#"{
        "url": "http://prefill-0:8000",
        "worker_type": "prefill",
        "runtime": "vllm",
        "labels": {"kv_connector": "MooncakeConnector", "kv_engine_id": "engine-7", "tp_size": 8, "moriio_mode": "write"},
        "bootstrap_port": 8998,
        "load_monitor_interval_secs": 3,
        "something_new": {"nested": true},
        "health": {"timeout_secs": 2, "unknown": 1},
        "overload": {"token_usage": 0.8}
    }"#;
    let spec = WorkerSpec::from_json(body).expect("parses");
    spec.validate().expect("valid");
    assert_eq!(spec.runtime_type, RuntimeType::Vllm);
    assert_eq!(spec.kv_connector.as_deref(), Some("MooncakeConnector"));
    assert_eq!(spec.kv_engine_id.as_deref(), Some("engine-7"));
    assert!(!spec.labels.contains_key("kv_connector") && !spec.labels.contains_key("kv_engine_id"));
    assert_eq!(spec.labels.get("tp_size").map(String::as_str), Some("8"));
    assert_eq!(
        spec.labels.get(label::MORIIO_MODE).map(String::as_str),
        Some("write")
    );
    assert_eq!(
        (spec.priority, spec.cost, spec.max_connection_attempts),
        (50, 1.0, 20)
    );
    assert_eq!(spec.health.as_ref().and_then(|h| h.timeout_secs), Some(2));
}

#[test]
fn moriio_registration_example_from_the_docs_parses() {
    let body =
        br#"{"url": "http://prefill-0:8000", "worker_type": "prefill", "runtime_type": "vllm",
       "kv_connector": "MoRIIOConnector", "labels": {"moriio_mode": "write"}}"#;
    let spec = WorkerSpec::from_json(body).expect("parses");
    assert_eq!(spec.kv_connector.as_deref(), Some("MoRIIOConnector"));
    assert_eq!(
        spec.parsed_url().expect("valid url").port_or_default(),
        Some(8000)
    );
}

#[test]
fn kv_fields_given_twice_must_agree() {
    let same = br#"{"url": "http://p:1", "kv_connector": "NixlConnector", "labels": {"kv_connector": "NixlConnector"}}"#;
    assert_eq!(
        WorkerSpec::from_json(same)
            .expect("agree")
            .kv_connector
            .as_deref(),
        Some("NixlConnector")
    );
    let differ = br#"{"url": "http://p:1", "kv_connector": "NixlConnector", "labels": {"kv_connector": "MooncakeConnector"}}"#;
    let err = WorkerSpec::from_json(differ)
        .expect_err("disagree")
        .to_string();
    assert!(err.contains("`kv_connector` is given twice"), "{err}");
}

#[test]
fn worker_spec_intake_is_strict_where_smg_is() {
    assert!(
        WorkerSpec::from_json(br#"{"url": "http://p:1", "worker_type": "Prefill"}"#).is_err(),
        "lowercase only"
    );
    assert!(WorkerSpec::from_json(br#"{"worker_type": "prefill"}"#)
        .expect_err("url required")
        .to_string()
        .contains("url"));
    assert!(
        WorkerSpec::from_json(br#"{"url": "http://p:1", "labels": {"a": [1]}}"#).is_err(),
        "labels are strings"
    );
    let ipc = WorkerSpec::from_json(br#"{"url": "ipc:///tmp/s"}"#).expect("parses");
    ipc.validate()
        .expect("a regular ipc worker is a valid spec");
}

#[test]
fn worker_api_key_is_never_serialized() {
    let mut spec = WorkerSpec::new("http://p:1", WorkerType::Prefill);
    spec.api_key = Some("secret".into());
    let json = serde_json::to_string(&spec).expect("serializes");
    assert!(
        !json.contains("secret") && json.contains("<redacted>"),
        "{json}"
    );
    let cfg = GatewayConfig {
        api_key: Some("secret2".into()),
        ..GatewayConfig::default()
    };
    assert!(!serde_yaml::to_string(&cfg)
        .expect("serializes")
        .contains("secret2"));
}

#[test]
fn pairing_protocol_label_wins_over_the_field() {
    let spec = WorkerSpec::from_json(
        br#"{"url": "http://p:1", "pairing_protocol": "a", "labels": {"pairing_protocol": "b"}}"#,
    )
    .expect("parses");
    assert_eq!(spec.pairing_protocol(), Some("b"));
}

#[test]
fn worker_urls_parse_into_scheme_host_port() {
    let url = parse_worker_url("https://[::1]:8443/v1").expect("valid");
    assert_eq!(
        (url.scheme, url.host.as_str(), url.port),
        (UrlScheme::Https, "::1", Some(8443))
    );
    assert_eq!(
        parse_worker_url("http://h")
            .expect("valid")
            .port_or_default(),
        Some(80)
    );
    assert!(parse_worker_url("http://h:99999").is_err());
}

// ---- grouped views ----------------------------------------------------------------------------

#[test]
fn leg_policies_fall_back_to_policy() {
    let g = GatewayConfig {
        policy: PolicyName::RoundRobin,
        decode_policy: Some(PolicyName::LeastLoad),
        ..GatewayConfig::default()
    };
    assert_eq!(g.effective_prefill_policy(), PolicyName::RoundRobin);
    assert_eq!(g.effective_decode_policy(), PolicyName::LeastLoad);
}

#[test]
fn retry_view_applies_smg_backoff_and_disable() {
    let r = GatewayConfig::default().retry();
    assert_eq!(r.max_attempts, 5);
    let ms: Vec<u128> = (0..4).map(|k| r.base_backoff(k).as_micros()).collect();
    assert_eq!(ms, [50_000, 75_000, 112_500, 168_750]);
    assert_eq!(r.base_backoff(100), Duration::from_secs(30));
    assert!(r.is_retryable_status(503) && !r.is_retryable_status(501));
    let off = GatewayConfig {
        disable_retries: true,
        ..GatewayConfig::default()
    }
    .retry();
    assert!(!off.enabled());
}

#[test]
fn overload_view_applies_the_protection_default() {
    let off = GatewayConfig::default().overload();
    assert!(!off.enabled());
    assert_eq!(off.retry_after_secs, 10);
    let flag = GatewayConfig {
        worker_overload_protection: true,
        ..GatewayConfig::default()
    }
    .overload();
    assert_eq!(flag.token_usage, Some(0.9));
    let explicit = GatewayConfig {
        worker_overload_protection: true,
        worker_overload_token_usage: Some(0.7),
        ..GatewayConfig::default()
    }
    .overload();
    assert_eq!(explicit.token_usage, Some(0.7));
    let waiting = GatewayConfig {
        worker_overload_waiting_requests: Some(4),
        ..GatewayConfig::default()
    }
    .overload();
    assert!(waiting.enabled() && waiting.token_usage.is_none());
}

#[test]
fn timeouts_view_caps_phases_at_the_total() {
    let t = GatewayConfig::default().timeouts();
    assert_eq!(t.connect, Duration::from_millis(2000));
    assert_eq!(t.body_read, Duration::from_secs(60));
    assert_eq!(t.request, Duration::from_secs(1800));
    assert_eq!(t.upstream_pool_idle, Some(Duration::from_secs(3)));
    let g = GatewayConfig {
        request_timeout_secs: 100,
        stream_idle_timeout_secs: 0,
        upstream_pool_idle_timeout_secs: 0,
        ..GatewayConfig::default()
    };
    let t = g.timeouts();
    assert_eq!(t.prefill_head, Duration::from_secs(100));
    assert_eq!(t.stream_idle, Duration::from_secs(100));
    assert_eq!(t.upstream_pool_idle, None);
}

#[test]
fn breaker_and_health_views() {
    let cb = GatewayConfig {
        disable_circuit_breaker: true,
        ..GatewayConfig::default()
    }
    .circuit_breaker();
    assert_eq!(cb.failure_threshold, u32::MAX);
    assert_eq!(cb.capacity_status_codes, [429]);
    let h = GatewayConfig::default().health();
    assert_eq!(h.startup_max_attempts(), 54);
    assert!(!h.remove_unhealthy_workers);
    assert_eq!(h.endpoint, "/health");
}

#[test]
fn sticky_views_default_assignment_per_use() {
    let g = GatewayConfig::default();
    assert_eq!(g.manual().assignment_mode, AssignmentMode::Random);
    assert_eq!(g.sticky().assignment_mode, AssignmentMode::Delegate);
    assert_eq!(g.sticky().headers, ["x-smg-routing-key"]);
    assert_eq!(g.cache_aware().cache_threshold, 0.3);
    assert_eq!(g.least_load(), LeastLoadSettings::default());
    assert_eq!(g.prefix_hash().prefix_token_count, 256);
    assert_eq!(g.bucket().adjust_interval, Duration::from_secs(5));
}

#[test]
fn listener_addresses() {
    let g = GatewayConfig {
        host: "::".into(),
        admin_port: Some(9000),
        health_check_port: Some(9001),
        ..GatewayConfig::default()
    };
    assert_eq!(g.listen_addr(), "[::]:30000");
    assert_eq!(g.admin_addr().as_deref(), Some("127.0.0.1:9000"));
    assert_eq!(g.health_check_addr().as_deref(), Some("[::]:9001"));
    assert_eq!(GatewayConfig::default().admin_addr(), None);
    assert_eq!(
        GatewayConfig::default().request_id_header_names()[0],
        "x-request-id"
    );
}

// ---- reload ----------------------------------------------------------------------------------------

#[test]
fn reload_flags_only_listener_and_pingora_changes() {
    let old = yaml("  policy: round_robin").expect("valid");
    let same_listeners = yaml("  policy: least_load\n  retry_max_retries: 2").expect("valid");
    assert!(restart_required(&old, &same_listeners).is_empty());
    let moved =
        parse_yaml("version: 1\nthreads: 8\ngateway:\n  pd_disaggregation: true\n  port: 31000\n")
            .expect("valid");
    assert_eq!(restart_required(&old, &moved), ["gateway.port", "threads"]);
}

#[test]
fn tracing_changes_need_a_restart() {
    let old = yaml("  policy: round_robin").expect("valid");
    let traced = yaml("  policy: round_robin\n  enable_trace: true").expect("valid");
    assert_eq!(restart_required(&old, &traced), ["gateway.enable_trace"]);
    let moved = yaml("  policy: round_robin\n  otlp_traces_endpoint: 'http://otel:4318/v1/traces'")
        .expect("valid");
    assert_eq!(
        restart_required(&old, &moved),
        ["gateway.otlp_traces_endpoint"]
    );
}

#[test]
fn tokenizer_changes_need_a_restart() {
    let old = yaml("  model_path: /m").expect("valid");
    let cached = yaml(
        "  model_path: /m\n  tokenizer_cache_enable_l1: true\n  tokenizer_cache_l0_max_entries: 5",
    )
    .expect("valid");
    assert_eq!(
        restart_required(&old, &cached),
        [
            "gateway.tokenizer_cache_l0_max_entries",
            "gateway.tokenizer_cache_enable_l1"
        ]
    );
    let other = yaml("  model_path: /other").expect("valid");
    assert_eq!(restart_required(&old, &other), ["gateway.model_path"]);
}

#[test]
fn an_enabled_tokenizer_cache_needs_room() {
    let err = yaml("  tokenizer_cache_enable_l0: true\n  tokenizer_cache_l0_max_entries: 0")
        .expect_err("refused");
    assert!(
        err.to_string().contains("tokenizer_cache_l0_max_entries"),
        "{err}"
    );
    yaml("  tokenizer_cache_l0_max_entries: 0").expect("a cache left off needs no room");
}

// ---- tracing -------------------------------------------------------------------------------------------

#[test]
fn trace_flags_map_onto_the_gateway_section() {
    let loaded = launch(&[
        "--pd-disaggregation",
        "--enable-trace",
        "--otlp-traces-endpoint",
        "10.1.2.3:4317",
    ])
    .expect("tracing is supported");
    assert!(loaded.notices.is_empty(), "{:?}", loaded.notices);
    assert!(loaded.gateway.enable_trace);
    let endpoint = loaded.gateway.otlp_endpoint().expect("on").expect("valid");
    assert_eq!(
        (endpoint.protocol, endpoint.url.as_str()),
        (OtlpProtocol::Grpc, "http://10.1.2.3:4317")
    );
    let default = GatewayConfig::default();
    assert!(!default.enable_trace && default.otlp_endpoint().is_none());
    assert_eq!(default.otlp_traces_endpoint, "localhost:4317");
    let from_yaml = yaml("  enable_trace: true\n  otlp_traces_endpoint: 'http://c:4318/v1/traces'")
        .expect("valid");
    assert_eq!(
        from_yaml
            .gateway
            .otlp_endpoint()
            .expect("on")
            .expect("valid")
            .protocol,
        OtlpProtocol::HttpProtobuf
    );
}

#[test]
fn a_bad_otlp_endpoint_is_refused_only_with_tracing_on() {
    let err =
        yaml_error("  enable_trace: true\n  otlp_traces_endpoint: 'https://c:4318/v1/traces'");
    assert!(
        err.starts_with("gateway.otlp_traces_endpoint (--otlp-traces-endpoint):")
            && err.contains("TLS"),
        "{err}"
    );
    let err = launch_error(&[
        "--pd-disaggregation",
        "--enable-trace",
        "--otlp-traces-endpoint",
        "collector",
    ]);
    assert!(err.contains("the port is missing"), "{err}");
    // SMG reads the endpoint only with --enable-trace; so does pdgate.
    yaml("  otlp_traces_endpoint: 'nonsense'").expect("ignored while tracing is off");
}

// ---- docs --------------------------------------------------------------------------------------------

const TABLE_BEGIN: &str = "<!-- BEGIN GENERATED: defaults table (cargo test config::tests::docs_defaults_table_is_current) -->";
const TABLE_END: &str = "<!-- END GENERATED -->";

/// The `gateway:` keys table, from clap's view of [`GatewayConfig`] (so from `defaults`).
fn defaults_table() -> String {
    let mut out = String::from(
        "| YAML key (`gateway:`) | `launch` flag | Default | Meaning |\n|---|---|---|---|\n",
    );
    for arg in gateway_command().get_arguments() {
        let id = arg.get_id().as_str();
        let mut flag = format!("`--{}`", arg.get_long().expect("long"));
        for alias in arg.get_all_aliases().unwrap_or_default() {
            flag.push_str(&format!(" (`--{alias}`)"));
        }
        let default: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let default = if default.is_empty() {
            if arg.get_action().takes_values() {
                "unset".to_string()
            } else {
                "`false`".to_string()
            }
        } else {
            format!("`{}`", default.join(" "))
        };
        let help = arg
            .get_help()
            .map(|h| h.to_string())
            .unwrap_or_default()
            .replace('|', "\\|");
        out.push_str(&format!("| `{id}` | {flag} | {default} | {help} |\n"));
    }
    out.push_str("| `workers` | `--prefill URL [PORT\\|none]`, `--decode URL` | `[]` | Startup workers, each a `POST /workers` body. |\n");
    out
}

#[test]
fn docs_defaults_table_is_current() {
    let path = repo_path("docs/configuration.md");
    let doc = std::fs::read_to_string(&path).expect("docs/configuration.md");
    let (Some(begin), Some(end)) = (doc.find(TABLE_BEGIN), doc.find(TABLE_END)) else {
        panic!("docs/configuration.md lacks the generated-table markers");
    };
    let current = &doc[begin + TABLE_BEGIN.len()..end];
    let expected = format!("\n{}", defaults_table());
    if current != expected {
        if std::env::var_os("PDGATE_BLESS_DOCS").is_some() {
            let updated = format!(
                "{}{}{}{}",
                &doc[..begin],
                TABLE_BEGIN,
                expected,
                &doc[end..]
            );
            std::fs::write(&path, updated).expect("write docs");
        } else {
            panic!(
                "docs/configuration.md's defaults table is stale; rerun with PDGATE_BLESS_DOCS=1"
            );
        }
    }
}

#[test]
fn kubernetes_discovery_flags_take_smg_spelling_and_defaults() {
    let loaded = launch(&[
        "--pd-disaggregation",
        "--service-discovery",
        "--prefill-selector",
        "app=sglang",
        "role=prefill",
        "--decode-selector",
        "app=sglang",
        "role=decode",
        "--service-discovery-namespace",
        "inference",
        "--service-discovery-port",
        "8000",
    ])
    .expect("valid discovery flags");
    let g = &loaded.gateway;
    assert_eq!(g.discovery(), Some(DiscoveryProvider::Kubernetes));
    assert_eq!(g.prefill_selector, ["app=sglang", "role=prefill"]);
    assert_eq!(g.service_discovery_namespace.as_deref(), Some("inference"));
    assert_eq!(g.service_discovery_port, 8000);
    assert_eq!(g.kv_connector_annotation, "smg.ai/kv-connector");
    assert_eq!(g.kv_engine_id_annotation, "smg.ai/kv-engine-id");
    let modern = launch(&[
        "--pd-disaggregation",
        "--discovery-provider",
        "kubernetes",
        "--prefill-selector",
        "role=p",
        "--decode-selector",
        "role=d",
    ])
    .expect("--discovery-provider kubernetes");
    assert_eq!(
        modern.gateway.discovery(),
        Some(DiscoveryProvider::Kubernetes)
    );
    assert_eq!(modern.gateway.service_discovery_port, 80);
    assert_eq!(GatewayConfig::default().discovery(), None);
}

#[test]
fn kubernetes_discovery_settings_are_checked_with_clear_errors() {
    let base = ["--pd-disaggregation", "--service-discovery"];
    let with = |extra: &[&str]| {
        let argv: Vec<&str> = base.iter().chain(extra).copied().collect();
        launch_error(&argv)
    };
    let no_decode = with(&["--prefill-selector", "role=p"]);
    assert!(
        no_decode.contains("--decode-selector")
            && no_decode.contains("needs prefill_selector and decode_selector"),
        "{no_decode}"
    );
    let bad = with(&["--prefill-selector", "role", "--decode-selector", "role=d"]);
    assert!(bad.contains("`role` is not `key=value`"), "{bad}");
    let same = with(&["--prefill-selector", "a=b", "--decode-selector", "a=b"]);
    assert!(same.contains("is the prefill_selector"), "{same}");
    let regular = with(&[
        "--selector",
        "app=x",
        "--prefill-selector",
        "a=p",
        "--decode-selector",
        "a=d",
    ]);
    assert!(
        regular.contains("--selector") && regular.contains("regular"),
        "{regular}"
    );
    let both = launch_error(&[
        "--pd-disaggregation",
        "--service-discovery",
        "--discovery-provider",
        "kubernetes",
        "--prefill-selector",
        "a=p",
        "--decode-selector",
        "a=d",
    ]);
    assert!(both.contains("not both"), "{both}");
    let orphan = launch_error(&["--pd-disaggregation", "--prefill-selector", "a=p"]);
    assert!(orphan.contains("without service discovery"), "{orphan}");
    let epd = launch_error(&[
        "--pd-disaggregation",
        "--service-discovery",
        "--prefill-selector",
        "a=p",
        "--decode-selector",
        "a=d",
        "--encode-selector",
        "a=e",
    ]);
    assert!(
        epd.contains("--encode-selector") && epd.contains("--epd-disaggregation"),
        "{epd}"
    );
    let epd = launch_error(&[
        "--epd-disaggregation",
        "--service-discovery",
        "--prefill-selector",
        "a=p",
        "--decode-selector",
        "a=d",
    ]);
    assert!(epd.contains("all three role selectors"), "{epd}");
    let from_yaml = yaml_error("  discovery_provider: kubernetes\n  prefill_selector: [role=p]");
    assert!(from_yaml.contains("gateway.decode_selector"), "{from_yaml}");
}

#[test]
fn discovery_settings_need_a_restart() {
    let old = yaml("").expect("defaults");
    let new =
        yaml("  service_discovery: true\n  prefill_selector: [a=p]\n  decode_selector: [a=d]")
            .expect("discovery");
    let keys = restart_required(&old, &new);
    for key in [
        "gateway.service_discovery",
        "gateway.prefill_selector",
        "gateway.decode_selector",
    ] {
        assert!(keys.iter().any(|k| k == key), "{key} in {keys:?}");
    }
}
