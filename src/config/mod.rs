//! Configuration: one internal model that every input format parses into, validated once.
//!
//! Inputs: the YAML file (`pdgate run -c FILE`, SIGHUP reload) → [`load_file`] /
//! [`parse_yaml`]; SMG's `launch` flags → [`normalize_launch_argv`] + [`LaunchArgs`] →
//! [`LaunchArgs::into_config`]; `POST /workers` bodies → [`WorkerSpec`] +
//! [`WorkerSpec::validate`]. All of them end in a [`LoadedConfig`] (or a spec) that passed
//! [`validate`]. No other module reads YAML keys or flags.
//!
//! The `gateway:` YAML keys are the `launch` flag names in snake_case, because both come from
//! one struct, [`GatewayConfig`]; every default lives in [`defaults`]. See
//! docs/configuration.md for the table and for what is refused and why.

pub mod defaults;
mod discovery;
mod error;
mod file;
mod gateway;
mod launch;
mod manifest;
mod net;
mod otlp;
mod reload;
mod validate;
mod views;
mod worker;

#[cfg(test)]
mod tests;

use std::path::PathBuf;

use pingora::server::configuration::ServerConf;

pub use discovery::label_selector;
pub use error::{ConfigError, ConfigErrorKind};
pub use file::{file_version, load_file, load_workers_file, parse_yaml, FileVersion};
pub use gateway::{
    AssignmentMode, CacheIndexKind, DiscoveryProvider, EncodePolicy, GatewayConfig, LogLevel,
    MmProcessing, PairingMode, PolicyName,
};
pub use launch::{
    normalize_launch_argv, Disposition, LaunchArgs, SmgOnlyFlags, StartupWorkerArg, SMG_ONLY_FLAGS,
};
pub use manifest::parse_manifest;
pub use net::IpNet;
pub use otlp::{OtlpEndpoint, OtlpProtocol};
pub use reload::restart_required;
pub use validate::{validate, validate_worker_for_mode};
pub use views::{
    BucketSettings, CacheAwareSettings, CircuitBreakerSettings, HealthSettings, LeastLoadSettings,
    OverloadSettings, PrefixHashSettings, RetrySettings, StickySettings, Timeouts,
};
pub use worker::{
    label, parse_worker_url, ConnectionMode, HealthOverrides, HttpPoolOverrides, ModelCard,
    OverloadOverrides, ResilienceOverrides, RuntimeType, UrlScheme, WorkerSpec, WorkerType,
    WorkerUrl, GRPCS_WORKERS_SUPPORTED,
};

/// Where a configuration came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigSource {
    /// `pdgate run -c FILE`; SIGHUP re-reads this file.
    File(PathBuf),
    /// `pdgate launch <SMG flags>`; nothing to re-read.
    Launch,
    /// [`parse_yaml`] on a string (tests, a reload body).
    Text,
}

/// A validated configuration, ready to start (or swap in on reload).
#[derive(Debug)]
pub struct LoadedConfig {
    /// Pingora's settings (the file's top-level keys; under `launch`, derived from flags).
    pub server_conf: ServerConf,
    pub gateway: GatewayConfig,
    pub source: ConfigSource,
    /// The workers of `gateway.workers_file`, as read at load time (validated together with
    /// `gateway.workers`: no URL appears twice across both).
    pub file_workers: Vec<WorkerSpec>,
    /// Settings accepted but ignored, and probable typos in keys that are ignored by design
    /// (top-level, worker specs). For the caller to log once logging is up.
    pub notices: Vec<String>,
}

impl LoadedConfig {
    /// Every startup worker: `gateway.workers` (or `--prefill`/`--decode`), then the
    /// `workers_file` ones.
    pub fn startup_workers(&self) -> impl Iterator<Item = &WorkerSpec> {
        self.gateway.workers.iter().chain(self.file_workers.iter())
    }
}
