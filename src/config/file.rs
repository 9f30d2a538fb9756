//! The YAML file of `pdgate run -c FILE` (and of SIGHUP reload): Pingora's own top-level keys,
//! parsed by Pingora's `ServerConf`, plus pdgate's `gateway:` section, and an optional
//! `workers_file`. Unknown `gateway:` keys are errors with a precise message (a typo must fail
//! `pdgate check`); an unknown top-level key or worker-spec key is only a notice, because
//! Pingora and SMG ignore those by design.

use std::path::Path;

use clap::Args;
use pingora::server::configuration::ServerConf;
use serde::Deserialize;
use serde_yaml::{Mapping, Value};

use super::error::{flag_name, ConfigError};
use super::gateway::GatewayConfig;
use super::launch::{smg_only_flag, Disposition, LAUNCH_ONLY_PROCESS_FLAGS};
use super::validate::{refuse_duplicate_urls, validate_startup_worker, validate_with_file_workers};
use super::worker::{WorkerSpec, WORKER_SPEC_KEYS};
use super::{ConfigSource, LoadedConfig};

#[derive(Deserialize)]
struct GatewaySection {
    gateway: Option<GatewayConfig>,
}

/// One version of a file as a watcher compares them: size, modification time and inode, read
/// through symlinks (a Kubernetes ConfigMap updates by swapping a `..data` symlink, which a watch
/// on the file itself misses). `None`: absent or unreadable.
pub type FileVersion = Option<(std::time::SystemTime, u64, u64)>;

pub fn file_version(path: &Path) -> FileVersion {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

/// Reads, parses and validates a config file. A relative `workers_file` is resolved against
/// the file's directory.
pub fn load_file(path: &Path) -> Result<LoadedConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::new(
            super::ConfigErrorKind::Io,
            Some(path.display().to_string()),
            format!("cannot read the config file: {e}"),
        )
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    parse_yaml_with(&text, base, ConfigSource::File(path.to_path_buf()))
        .map_err(|e| e.within_file(path))
}

/// Parses and validates a config from text (tests, reload). A relative `workers_file` is
/// resolved against the current directory.
pub fn parse_yaml(text: &str) -> Result<LoadedConfig, ConfigError> {
    parse_yaml_with(text, Path::new("."), ConfigSource::Text)
}

fn parse_yaml_with(
    text: &str,
    base: &Path,
    source: ConfigSource,
) -> Result<LoadedConfig, ConfigError> {
    let mut notices = Vec::new();
    let root: Value = serde_yaml::from_str(text)
        .map_err(|e| ConfigError::parse(None, format!("invalid YAML: {e}")))?;
    let Value::Mapping(root) = root else {
        return Err(ConfigError::parse(
            None,
            "the config must be a YAML mapping with Pingora's keys and a `gateway:` section",
        ));
    };
    check_top_level_keys(&root, &mut notices)?;
    let Some(Value::Mapping(gateway)) = root.get("gateway") else {
        return Err(ConfigError::parse(
            None,
            "no `gateway:` section; pdgate's settings (listeners, policies, workers, …) go under `gateway:` (see conf/pdgate.yaml)",
        ));
    };
    check_gateway_keys(gateway)?;
    if let Some(Value::Sequence(workers)) = gateway.get("workers") {
        for (i, worker) in workers.iter().enumerate() {
            note_unknown_worker_keys(worker, &format!("gateway.workers[{i}]"), &mut notices);
        }
    }

    let mut server_conf: ServerConf = serde_yaml::from_str(text)
        .map_err(|e| ConfigError::parse(None, format!("Pingora settings: {e}")))?;
    server_conf = server_conf
        .validate()
        .map_err(|e| ConfigError::invalid_at("Pingora settings", e.to_string()))?;
    let gateway = serde_yaml::from_str::<GatewaySection>(text)
        .map_err(|e| ConfigError::parse(None, e.to_string()))?
        .gateway
        .unwrap_or_default();

    let mut file_workers = Vec::new();
    let mut located = Vec::new();
    if let Some(path) = &gateway.workers_file {
        let path = if path.is_relative() {
            base.join(path)
        } else {
            path.clone()
        };
        let (workers, file_notices) = read_workers_file(&path)?;
        notices.extend(file_notices);
        located = workers
            .iter()
            .enumerate()
            .map(|(i, w)| (format!("{}[{i}]", path.display()), w.clone()))
            .collect();
        file_workers = workers;
    }
    validate_with_file_workers(&gateway, Some(&located))?;
    let inline = gateway
        .workers
        .iter()
        .enumerate()
        .map(|(i, w)| (format!("gateway.workers[{i}]"), w));
    for (location, worker) in inline.chain(located.iter().map(|(l, w)| (l.clone(), w))) {
        for (key, why) in worker.unapplied() {
            notices.push(format!(
                "{location}: `{key}` has no effect in pdgate: {why}"
            ));
        }
    }
    Ok(LoadedConfig {
        server_conf,
        gateway,
        source,
        file_workers,
        notices,
    })
}

/// Reads a workers file: a YAML list of worker specs (or a mapping with a `workers:` list),
/// each validated as a startup worker, with no URL twice.
pub fn load_workers_file(path: &Path) -> Result<Vec<WorkerSpec>, ConfigError> {
    read_workers_file(path).map(|(workers, _)| workers)
}

fn read_workers_file(path: &Path) -> Result<(Vec<WorkerSpec>, Vec<String>), ConfigError> {
    let location = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::new(
            super::ConfigErrorKind::Io,
            Some(location.clone()),
            format!("cannot read the workers file: {e}"),
        )
    })?;
    let value: Value = serde_yaml::from_str(&text)
        .map_err(|e| ConfigError::parse(Some(location.clone()), format!("invalid YAML: {e}")))?;
    let list = match value {
        Value::Null => Value::Sequence(Vec::new()),
        Value::Mapping(mut m) if m.len() == 1 && m.contains_key("workers") => {
            m.remove("workers").unwrap_or(Value::Null)
        }
        other => other,
    };
    let mut notices = Vec::new();
    if let Value::Sequence(entries) = &list {
        for (i, entry) in entries.iter().enumerate() {
            note_unknown_worker_keys(entry, &format!("{location}[{i}]"), &mut notices);
        }
    }
    let workers: Vec<WorkerSpec> = match list {
        Value::Null => Vec::new(),
        list @ Value::Sequence(_) => serde_yaml::from_value(list)
            .map_err(|e| ConfigError::parse(Some(location.clone()), e.to_string()))?,
        _ => {
            return Err(ConfigError::parse(
                Some(location),
                "a workers file is a YAML list of worker specs",
            ))
        }
    };
    let located: Vec<(String, &WorkerSpec)> = workers
        .iter()
        .enumerate()
        .map(|(i, w)| (format!("{location}[{i}]"), w))
        .collect();
    for (loc, spec) in &located {
        validate_startup_worker(spec).map_err(|e| e.within(loc))?;
    }
    refuse_duplicate_urls(located.iter().map(|(loc, w)| (loc.as_str(), *w)))?;
    Ok((workers, notices))
}

/// Top-level keys are Pingora's (which ignores unknown ones) plus `gateway`. A gateway key at
/// the top level is a misplaced setting: refuse it. Anything else is a notice.
fn check_top_level_keys(root: &Mapping, notices: &mut Vec<String>) -> Result<(), ConfigError> {
    let pingora_keys = pingora_keys();
    let gateway_keys = gateway_keys();
    for key in root.keys() {
        let Some(key) = key.as_str() else {
            return Err(ConfigError::parse(
                None,
                format!("top-level key {key:?} is not a string"),
            ));
        };
        if key == "gateway" || pingora_keys.iter().any(|k| k == key) {
            continue;
        }
        if gateway_keys.iter().any(|k| k == key) {
            return Err(ConfigError::parse(
                None,
                format!("`{key}` is a pdgate setting; move it under `gateway:`"),
            ));
        }
        notices.push(format!("unknown top-level key `{key}` ignored (not a Pingora setting; pdgate's settings go under `gateway:`)"));
    }
    Ok(())
}

/// Refuses unknown `gateway:` keys with a message that says what the key is (an SMG flag pdgate
/// does not implement, a launch-only flag, or a probable typo).
fn check_gateway_keys(gateway: &Mapping) -> Result<(), ConfigError> {
    let known = gateway_keys();
    for key in gateway.keys() {
        let Some(key) = key.as_str() else {
            return Err(ConfigError::parse(
                Some("gateway".into()),
                format!("key {key:?} is not a string"),
            ));
        };
        if known.iter().any(|k| k == key) {
            continue;
        }
        let location = Some(format!("gateway.{key}"));
        if let Some((disposition, why)) = smg_only_flag(key) {
            let message = match disposition {
                Disposition::Refused => format!(
                    "is SMG's {}, which pdgate does not support: {why}",
                    flag_name(key)
                ),
                Disposition::Ignored => format!(
                    "is SMG's {}, which has no effect in pdgate ({why}); remove it",
                    flag_name(key)
                ),
            };
            return Err(ConfigError::new(
                super::ConfigErrorKind::Unsupported,
                location,
                message,
            ));
        }
        if let Some((_, pingora_key)) = LAUNCH_ONLY_PROCESS_FLAGS
            .iter()
            .find(|(flag, _)| *flag == key)
        {
            return Err(ConfigError::parse(
                location,
                format!("is a `pdgate launch` flag; in the file, set Pingora's top-level `{pingora_key}` instead"),
            ));
        }
        if key == "prefill" || key == "decode" {
            return Err(ConfigError::parse(
                location,
                format!("startup workers go in `workers:`, one spec each, e.g. `- {{url: http://host:8000, worker_type: {key}}}`"),
            ));
        }
        let hint = match closest(key, &known) {
            Some(near) => format!("; did you mean `{near}`?"),
            None => String::new(),
        };
        return Err(ConfigError::parse(location, format!("unknown key{hint} (the keys are the `pdgate launch` flag names in snake_case; see docs/configuration.md)")));
    }
    Ok(())
}

fn note_unknown_worker_keys(worker: &Value, location: &str, notices: &mut Vec<String>) {
    let Value::Mapping(worker) = worker else {
        return;
    };
    for key in worker.keys().filter_map(Value::as_str) {
        if !WORKER_SPEC_KEYS.contains(&key) {
            let hint = closest(key, WORKER_SPEC_KEYS)
                .map(|k| format!("; did you mean `{k}`?"))
                .unwrap_or_default();
            notices.push(format!(
                "{location}: unknown worker key `{key}` ignored{hint}"
            ));
        }
    }
}

/// Every key the `gateway:` section accepts: the flag ids of [`GatewayConfig`], their aliases in
/// snake_case, and `workers`.
pub(crate) fn gateway_keys() -> Vec<String> {
    let cmd = GatewayConfig::augment_args(clap::Command::new("pdgate"));
    let mut keys = vec!["workers".to_string()];
    for arg in cmd.get_arguments() {
        keys.push(arg.get_id().as_str().to_string());
        for alias in arg.get_all_aliases().unwrap_or_default() {
            keys.push(alias.replace('-', "_"));
        }
    }
    keys
}

/// Pingora's top-level keys, from its own `ServerConf`.
fn pingora_keys() -> Vec<String> {
    match serde_yaml::to_value(ServerConf::default()) {
        Ok(Value::Mapping(m)) => m
            .keys()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    }
}

/// The known key nearest to `key` by edit distance, if it is close enough to be a typo.
fn closest<S: AsRef<str>>(key: &str, known: &[S]) -> Option<String> {
    known
        .iter()
        .map(|k| (edit_distance(key, k.as_ref()), k.as_ref()))
        .filter(|(d, k)| *d <= 2.max(k.len() / 5))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k.to_string())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

impl ConfigError {
    /// Names the file in a parse error that has no location of its own.
    fn within_file(self, path: &Path) -> Self {
        if self.location().is_some() {
            self
        } else {
            self.within(&path.display().to_string())
        }
    }
}
