//! The discovery manifest of `--discovery-provider file` (`--discovery-file`): SMG 1.13.0's JSON
//! format, read the way SMG reads it (its error messages, measured):
//!
//! ```json
//! {"version": 1, "workers": [
//!   {"url": "http://p0:30000", "worker_type": "prefill", "bootstrap_port": 8998},
//!   {"id": "d0", "url": "http://d0:30000", "worker_type": "decode",
//!    "model_id": "m", "kv_connector": "NixlConnector", "kv_role": "kv_consumer",
//!    "kv_engine_id": "…"}]}
//! ```
//!
//! Only version 1; unknown keys in an entry are refused; `worker_type` is required (PD); an entry's `id`
//! defaults to its URL and ids must be unique. The whole manifest is validated before anything
//! is applied: one bad entry refuses all of it.

use std::collections::HashSet;

use serde::Deserialize;

use super::validate::validate_startup_worker;
use super::worker::{ModelCard, WorkerSpec, WorkerType};

/// The one manifest version this gateway reads.
pub const MANIFEST_VERSION: u32 = 1;

/// Unknown top-level keys are ignored (as SMG does); unknown entry keys are refused.
#[derive(Debug, Deserialize)]
struct Manifest {
    version: u32,
    #[serde(default)]
    workers: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    id: Option<String>,
    url: String,
    worker_type: Option<WorkerType>,
    bootstrap_port: Option<u16>,
    model_id: Option<String>,
    kv_connector: Option<String>,
    kv_role: Option<String>,
    kv_engine_id: Option<String>,
}

/// Parses and validates a whole manifest into worker specs (in the manifest's order).
pub fn parse_manifest(text: &[u8]) -> Result<Vec<WorkerSpec>, String> {
    let m: Manifest = serde_json::from_slice(text).map_err(|e| e.to_string())?;
    if m.version != MANIFEST_VERSION {
        return Err(format!(
            "unsupported version {}; this gateway reads version {MANIFEST_VERSION}",
            m.version
        ));
    }
    let mut ids = HashSet::new();
    let mut specs = Vec::with_capacity(m.workers.len());
    for (i, e) in m.workers.into_iter().enumerate() {
        let at = |why: String| format!("workers[{i}]: {why}");
        let worker_type = e
            .worker_type
            .ok_or_else(|| at("worker_type is required in prefill-decode routing".into()))?;
        let id = e.id.clone().unwrap_or_else(|| e.url.clone());
        if !ids.insert(id.clone()) {
            return Err(at(format!("duplicate id '{id}'")));
        }
        let mut spec = WorkerSpec::new(e.url, worker_type);
        spec.bootstrap_port = e.bootstrap_port;
        spec.kv_connector = e.kv_connector;
        spec.kv_role = e.kv_role;
        spec.kv_engine_id = e.kv_engine_id;
        if let Some(model) = e.model_id {
            spec.models = vec![ModelCard {
                id: model,
                aliases: Vec::new(),
                extra: Default::default(),
            }];
        }
        validate_startup_worker(&spec).map_err(|err| at(err.to_string()))?;
        specs.push(spec);
    }
    Ok(specs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smg_manifests_parse_into_worker_specs() {
        let specs = parse_manifest(
            br#"{"version": 1, "workers": [
                {"url": "http://127.0.0.1:1", "worker_type": "prefill", "bootstrap_port": 8998},
                {"id": "d", "url": "http://127.0.0.1:2", "worker_type": "decode",
                 "model_id": "m", "kv_connector": "NixlConnector", "kv_engine_id": "e"}]}"#,
        )
        .unwrap();
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0].bootstrap_port, Some(8998));
        assert_eq!(specs[1].worker_type, WorkerType::Decode);
        assert_eq!(specs[1].models[0].id, "m");
        assert_eq!(specs[1].kv_engine_id.as_deref(), Some("e"));
        assert!(parse_manifest(br#"{"version": 1}"#).unwrap().is_empty());
    }

    #[test]
    fn bad_manifests_say_what_is_wrong_as_smg_does() {
        for (text, says) in [
            (&br#"{"bogus": 1}"#[..], "missing field `version`"),
            (br#"{"version": 2, "workers": []}"#, "unsupported version 2"),
            (
                br#"{"version": 1, "workers": [{"bogus": 1}]}"#,
                "unknown field `bogus`",
            ),
            (
                br#"{"version": 1, "workers": [{"url": "http://127.0.0.1:1"}]}"#,
                "workers[0]: worker_type is required",
            ),
            (
                br#"{"version": 1, "workers": [{"url": "http://127.0.0.1:1", "worker_type": "prefill"},
                    {"url": "http://127.0.0.1:1", "worker_type": "decode"}]}"#,
                "workers[1]: duplicate id 'http://127.0.0.1:1'",
            ),
            (
                br#"{"version": 1, "workers": [{"url": "http://127.0.0.1:1", "worker_type": "regular"}]}"#,
                "workers[0]:",
            ),
        ] {
            let err = parse_manifest(text).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
    }
}
