//! What a gRPC engine says about itself, as worker facts: `GetModelInfo` and `GetServerInfo`
//! (and, for a window SGLang leaves out of its server args, `GetLoads`) → [`Discovered`].
//! Pure: the RPCs are made by `workers::grpc`, which hands the responses here.
//!
//! Labels follow SMG's registration (grpc-pd-spec §1.8): every non-empty, non-zero scalar of the
//! typed responses (booleans kept even when false, lists as JSON arrays), plus a curated set of
//! SGLang / TokenSpeed `server_args` keys (the full Struct holds every engine flag, API keys
//! included), plus `version`. Runtime state (active requests, uptime, pause flag) is left out: it
//! is stale the moment it is read. vLLM's `kv_connector` / `kv_role` / `kv_engine_id` become the
//! worker's own fields, after the spec's `MultiConnector` unwrapping ([`vllm_kv_transfer`]).
//! TokenSpeed's parallelism spellings (`attn_tp_size`, `data_parallel_size`,
//! `pipeline_parallel_size`) and vLLM's `data_parallel_size` are also given under the canonical
//! `tp_size` / `dp_size` / `pp_size`, which the rest of the gateway reads.

use std::collections::BTreeMap;

use pdgate_proto::{sglang, tokenspeed, vllm};
use prost_types::value::Kind;
use serde_json::Value;

use super::worker::Discovered;
use crate::config::{label, RuntimeType};

/// SGLang `server_args` keys that become labels.
const SGLANG_SERVER_ARGS: &[&str] = &[
    "model_path",
    "served_model_name",
    "tokenizer_path",
    "tp_size",
    "dp_size",
    "pp_size",
    "context_length",
    "max_total_tokens",
    "max_running_requests",
    "load_balance_method",
    "disaggregation_mode",
    "is_embedding",
    "vocab_size",
    "weight_version",
    // The pairing facts: transport and KV layout, and the operator's explicit protocol (the
    // servicer reads it from the engine's SMG_PAIRING_PROTOCOL).
    "disaggregation_transfer_backend",
    "disaggregation_bootstrap_port",
    "kv_cache_dtype",
    "page_size",
    "attention_backend",
    "pairing_protocol",
];

/// TokenSpeed `server_args` keys that become labels (its own spellings: `model`, `tokenizer`,
/// `max_num_seqs`, and the parallelism names folded into the canonical ones). TokenSpeed has no
/// page size: its KV layout is exchanged at the rendezvous.
const TOKENSPEED_SERVER_ARGS: &[&str] = &[
    "model",
    "served_model_name",
    "tokenizer",
    "tp_size",
    "attn_tp_size",
    "dp_size",
    "data_parallel_size",
    "pp_size",
    "pipeline_parallel_size",
    "context_length",
    "max_total_tokens",
    "max_num_seqs",
    "max_running_requests",
    "load_balance_method",
    "is_embedding",
    "vocab_size",
    "weight_version",
    "disaggregation_mode",
    "disaggregation_transfer_backend",
    "disaggregation_bootstrap_port",
    "kv_cache_dtype",
    "attention_backend",
    "pairing_protocol",
];

/// Engine spellings of a canonical label, folded in when the canonical one is absent.
const SYNONYMS: &[(&str, &str)] = &[
    ("attn_tp_size", label::TP_SIZE),
    ("data_parallel_size", label::DP_SIZE),
    ("pipeline_parallel_size", "pp_size"),
];

/// A label map that keeps only values worth showing: non-empty strings (not `"null"`),
/// non-zero numbers (integers without a decimal point), every boolean, non-empty lists.
#[derive(Default)]
struct Labels(BTreeMap<String, String>);

impl Labels {
    fn text(&mut self, key: &str, value: &str) {
        let v = value.trim();
        if !v.is_empty() && v != "null" {
            self.0.insert(key.to_string(), v.to_string());
        }
    }

    fn number(&mut self, key: &str, value: f64) {
        if value != 0.0 && value.is_finite() {
            let text = if value.fract() == 0.0 && value.abs() < 1e15 {
                format!("{}", value as i64)
            } else {
                value.to_string()
            };
            self.0.insert(key.to_string(), text);
        }
    }

    fn flag(&mut self, key: &str, value: bool) {
        self.0.insert(key.to_string(), value.to_string());
    }

    fn list<T: serde::Serialize>(&mut self, key: &str, values: &[T]) {
        if !values.is_empty() {
            if let Ok(text) = serde_json::to_string(values) {
                self.0.insert(key.to_string(), text);
            }
        }
    }

    /// The `keys` of a `google.protobuf.Struct` that hold a scalar.
    fn pick(&mut self, args: Option<&prost_types::Struct>, keys: &[&str]) {
        let Some(args) = args else { return };
        for key in keys {
            match args.fields.get(*key).and_then(|v| v.kind.as_ref()) {
                Some(Kind::StringValue(s)) => self.text(key, s),
                Some(Kind::NumberValue(n)) => self.number(key, *n),
                Some(Kind::BoolValue(b)) => self.flag(key, *b),
                _ => {}
            }
        }
    }

    /// Gives each engine spelling's value under the canonical name too, unless already set.
    fn canonicalize(mut self) -> BTreeMap<String, String> {
        for (engine, canonical) in SYNONYMS {
            if let Some(v) = self.0.get(*engine).cloned() {
                self.0.entry((*canonical).to_string()).or_insert(v);
            }
        }
        self.0
    }
}

/// The served model: its served name, else its model path (one name, as the servicers report).
fn served_models(labels: &BTreeMap<String, String>) -> Vec<String> {
    ["served_model_name", label::MODEL_PATH, "model"]
        .iter()
        .find_map(|k| labels.get(*k))
        .map(|m| vec![m.clone()])
        .unwrap_or_default()
}

fn eos_ids(ids: &[i32]) -> Vec<u32> {
    ids.iter().filter_map(|&i| u32::try_from(i).ok()).collect()
}

/// SGLang's facts. `window_from_loads` is the running window `GetLoads` reported, used only when
/// the server args carry none.
pub fn sglang(
    model: &sglang::GetModelInfoResponse,
    server: &sglang::GetServerInfoResponse,
    window_from_loads: Option<u32>,
) -> Discovered {
    let mut l = Labels::default();
    l.text("model_path", &model.model_path);
    l.text("tokenizer_path", &model.tokenizer_path);
    l.flag("is_generation", model.is_generation);
    l.text(
        "preferred_sampling_params",
        &model.preferred_sampling_params,
    );
    l.text("weight_version", &model.weight_version);
    l.text("served_model_name", &model.served_model_name);
    l.number(
        label::MAX_CONTEXT_LENGTH,
        f64::from(model.max_context_length),
    );
    l.number("vocab_size", f64::from(model.vocab_size));
    l.flag("supports_vision", model.supports_vision);
    l.text("model_type", &model.model_type);
    l.list("eos_token_ids", &model.eos_token_ids);
    l.number("pad_token_id", f64::from(model.pad_token_id));
    l.number("bos_token_id", f64::from(model.bos_token_id));
    l.number("max_req_input_len", f64::from(model.max_req_input_len));
    l.list("architectures", &model.architectures);
    l.text("id2label_json", &model.id2label_json);
    l.number("num_labels", f64::from(model.num_labels));
    l.text(
        "default_sampling_params_json",
        &model.default_sampling_params_json,
    );
    l.pick(server.server_args.as_ref(), SGLANG_SERVER_ARGS);
    l.text(label::VERSION, &server.sglang_version);
    if let Some(w) = window_from_loads {
        l.0.entry(label::MAX_RUNNING_REQUESTS.to_string())
            .or_insert_with(|| w.to_string());
    }
    let labels = l.canonicalize();
    Discovered {
        runtime: RuntimeType::Sglang,
        models: served_models(&labels),
        eos_token_ids: eos_ids(&model.eos_token_ids),
        labels,
        ..Discovered::default()
    }
}

/// TokenSpeed's facts (`GetLoads` as for SGLang, after `max_num_seqs`).
pub fn tokenspeed(
    model: &tokenspeed::GetModelInfoResponse,
    server: &tokenspeed::GetServerInfoResponse,
    window_from_loads: Option<u32>,
) -> Discovered {
    let mut l = Labels::default();
    l.text("model_path", &model.model_path);
    l.text("tokenizer_path", &model.tokenizer_path);
    l.text("served_model_name", &model.served_model_name);
    l.text("model_type", &model.model_type);
    l.list("architectures", &model.architectures);
    l.number(
        label::MAX_CONTEXT_LENGTH,
        f64::from(model.max_context_length),
    );
    l.number("max_req_input_len", f64::from(model.max_req_input_len));
    l.number("vocab_size", f64::from(model.vocab_size));
    l.list("eos_token_ids", &model.eos_token_ids);
    l.number("pad_token_id", f64::from(model.pad_token_id));
    l.number("bos_token_id", f64::from(model.bos_token_id));
    l.text("weight_version", &model.weight_version);
    l.text(
        "default_sampling_params_json",
        &model.default_sampling_params_json,
    );
    l.flag("supports_vision", model.supports_vision);
    l.flag("supports_multimodal", model.supports_multimodal);
    l.text(label::MODEL_DTYPE, &model.model_dtype);
    l.text("multimodal_encoder_dtype", &model.multimodal_encoder_dtype);
    l.pick(server.server_args.as_ref(), TOKENSPEED_SERVER_ARGS);
    l.text(label::VERSION, &server.tokenspeed_version);
    l.text("constrained_decoding", &server.constrained_decoding);
    if let Some(w) = window_from_loads {
        let reported = [label::MAX_NUM_SEQS, label::MAX_RUNNING_REQUESTS]
            .iter()
            .any(|k| l.0.contains_key(*k));
        if !reported {
            l.0.insert(label::MAX_RUNNING_REQUESTS.to_string(), w.to_string());
        }
    }
    let labels = l.canonicalize();
    Discovered {
        runtime: RuntimeType::Tokenspeed,
        models: served_models(&labels),
        eos_token_ids: eos_ids(&model.eos_token_ids),
        labels,
        ..Discovered::default()
    }
}

/// vLLM's facts: typed responses only (no Struct), the connector pulled out and unwrapped.
pub fn vllm(
    model: &vllm::GetModelInfoResponse,
    server: &vllm::GetServerInfoResponse,
) -> Discovered {
    let mut l = Labels::default();
    l.text("model_path", &model.model_path);
    l.flag("is_generation", model.is_generation);
    l.number(
        label::MAX_CONTEXT_LENGTH,
        f64::from(model.max_context_length),
    );
    l.number("vocab_size", f64::from(model.vocab_size));
    l.flag("supports_vision", model.supports_vision);
    l.text("served_model_name", &model.served_model_name);
    l.text("tokenizer_path", &model.tokenizer_path);
    l.text("model_type", &model.model_type);
    l.list("architectures", &model.architectures);
    l.list("eos_token_ids", &model.eos_token_ids);
    l.number("pad_token_id", f64::from(model.pad_token_id));
    l.number("bos_token_id", f64::from(model.bos_token_id));
    l.number("max_req_input_len", f64::from(model.max_req_input_len));
    l.text(
        "default_sampling_params_json",
        &model.default_sampling_params_json,
    );
    l.text("server_type", &server.server_type);
    l.number("data_parallel_size", f64::from(server.data_parallel_size));
    l.text("shm_namespace_id", &server.shm_namespace_id);
    l.text(label::KV_CACHE_DTYPE, &server.kv_cache_dtype);
    l.number(label::BLOCK_SIZE, f64::from(server.block_size));
    l.text(label::ATTENTION_BACKEND, &server.attention_backend);
    l.text(label::MODEL_DTYPE, &server.model_dtype);
    l.text(label::PAIRING_PROTOCOL, &server.pairing_protocol);
    l.text("mm_processor", &server.mm_processor);
    l.text("mm_media_ref_schemes", &server.mm_media_ref_schemes);
    l.text("mm_processor_source", &server.mm_processor_source);
    l.flag("mm_device_do_normalize", server.mm_device_do_normalize);
    l.number(label::MAX_NUM_SEQS, f64::from(server.max_num_seqs));
    l.text("mm_item_limits", &server.mm_item_limits);
    l.text("multimodal_encoder_dtype", &server.multimodal_encoder_dtype);
    l.text("engine_reasoning_parser", &server.engine_reasoning_parser);
    l.text(
        "constrained_decoding_start",
        &server.constrained_decoding_start,
    );
    l.number("mm_encoder_budget", f64::from(server.mm_encoder_budget));
    let labels = l.canonicalize();
    let kv = vllm_kv_transfer(&server.kv_connector, &server.kv_role, &server.kv_engine_id);
    Discovered {
        runtime: RuntimeType::Vllm,
        models: served_models(&labels),
        eos_token_ids: eos_ids(&model.eos_token_ids),
        labels,
        kv_connector: kv.connector,
        kv_role: kv.role,
        kv_engine_id: kv.engine_id,
    }
}

/// A vLLM worker's KV transfer facts, as the handoff needs them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvTransfer {
    pub connector: Option<String>,
    pub role: Option<String>,
    pub engine_id: Option<String>,
}

/// The connectors a vLLM PD handoff runs through; a `MultiConnector` is unwrapped only to one
/// of these.
const HANDOFF_CONNECTORS: [&str; 2] = ["NixlConnector", "MooncakeConnector"];

/// vLLM's `kv_connector` / `kv_role` / `kv_engine_id` server-info fields, with the spec's
/// `MultiConnector` rule: a MultiConnector that wraps exactly one NixlConnector or
/// MooncakeConnector (other children, such as a KV offloading connector, may sit beside it) is
/// that connector, with the child's engine id, or the parent's when the child sets none; any
/// other MultiConnector stays as it is, which the handoff runs as passthrough.
///
/// Newer servicers unwrap before reporting, so the name is usually already the child's. The
/// field is a plain name in the proto; when a servicer puts the whole `--kv-transfer-config`
/// JSON there instead, it is unwrapped here. A bare `MultiConnector` name (a servicer that
/// neither unwraps nor sends the config) cannot be unwrapped and stays passthrough.
pub fn vllm_kv_transfer(connector: &str, role: &str, engine_id: &str) -> KvTransfer {
    let text = |s: &str| Some(s.trim().to_string()).filter(|s| !s.is_empty());
    let reported = KvTransfer {
        connector: text(connector),
        role: text(role),
        engine_id: text(engine_id),
    };
    if !connector.trim_start().starts_with('{') {
        return reported;
    }
    match serde_json::from_str::<Value>(connector) {
        Ok(config) => unwrap_kv_transfer_config(&config, reported.role, reported.engine_id),
        Err(_) => KvTransfer {
            connector: None,
            ..reported
        },
    }
}

/// A `--kv-transfer-config` object → its handoff connector (see [`vllm_kv_transfer`]).
/// `role` / `engine_id` are the separately reported fields, used when the config has none.
pub fn unwrap_kv_transfer_config(
    config: &Value,
    role: Option<String>,
    engine_id: Option<String>,
) -> KvTransfer {
    let field = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let parent = KvTransfer {
        connector: field(config, "kv_connector"),
        role: field(config, "kv_role").or(role),
        engine_id: field(config, "engine_id").or(engine_id),
    };
    if parent.connector.as_deref() != Some("MultiConnector") {
        return parent;
    }
    let children = config
        .pointer("/kv_connector_extra_config/connectors")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut handoff = children.iter().filter(|c| {
        field(c, "kv_connector").is_some_and(|n| HANDOFF_CONNECTORS.contains(&n.as_str()))
    });
    match (handoff.next(), handoff.next()) {
        (Some(child), None) => KvTransfer {
            connector: field(child, "kv_connector"),
            role: field(child, "kv_role").or(parent.role),
            engine_id: field(child, "engine_id").or(parent.engine_id),
        },
        _ => parent,
    }
}

/// The running window a `GetLoads` answer reports: the per-rank `max_running_requests` summed
/// over the ranks (each DP rank schedules its own); `None` when no rank reports one.
pub fn window_from_ranks(per_rank: impl IntoIterator<Item = i32>) -> Option<u32> {
    let total: i64 = per_rank.into_iter().filter(|n| *n > 0).map(i64::from).sum();
    u32::try_from(total).ok().filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_types::{Struct, Value as PValue};
    use serde_json::json;

    fn args(pairs: &[(&str, Kind)]) -> Option<Struct> {
        Some(Struct {
            fields: pairs
                .iter()
                .map(|(k, v)| {
                    (
                        k.to_string(),
                        PValue {
                            kind: Some(v.clone()),
                        },
                    )
                })
                .collect(),
        })
    }

    fn s(v: &str) -> Kind {
        Kind::StringValue(v.into())
    }

    fn n(v: f64) -> Kind {
        Kind::NumberValue(v)
    }

    #[test]
    fn sglang_server_args_become_curated_labels_and_secrets_stay_out() {
        let model = sglang::GetModelInfoResponse {
            model_path: "/models/llama".into(),
            served_model_name: "llama".into(),
            max_context_length: 8192,
            eos_token_ids: vec![2, 7],
            is_generation: true,
            ..Default::default()
        };
        let server = sglang::GetServerInfoResponse {
            server_args: args(&[
                ("tp_size", n(2.0)),
                ("dp_size", n(4.0)),
                ("max_running_requests", n(128.0)),
                ("disaggregation_transfer_backend", s("nixl")),
                ("kv_cache_dtype", s("fp8_e5m2")),
                ("page_size", n(64.0)),
                ("attention_backend", Kind::NullValue(0)),
                ("pairing_protocol", s("kv-v1")),
                ("is_embedding", Kind::BoolValue(false)),
                ("mem_fraction_static", n(0.85)),
                ("api_key", s("secret")),
            ]),
            sglang_version: "0.5.2".into(),
            active_requests: 3,
            ..Default::default()
        };
        let d = super::sglang(&model, &server, Some(999));
        assert_eq!(d.runtime, RuntimeType::Sglang);
        assert_eq!(d.models, ["llama"]);
        assert_eq!(d.eos_token_ids, [2, 7]);
        let l = &d.labels;
        for (k, v) in [
            ("tp_size", "2"),
            ("dp_size", "4"),
            ("max_running_requests", "128"),
            ("disaggregation_transfer_backend", "nixl"),
            ("kv_cache_dtype", "fp8_e5m2"),
            ("page_size", "64"),
            ("pairing_protocol", "kv-v1"),
            ("is_embedding", "false"),
            ("version", "0.5.2"),
            ("max_context_length", "8192"),
            ("model_path", "/models/llama"),
            ("eos_token_ids", "[2,7]"),
            ("is_generation", "true"),
        ] {
            assert_eq!(l.get(k).map(String::as_str), Some(v), "{k}: {l:?}");
        }
        for absent in [
            "api_key",
            "mem_fraction_static",
            "attention_backend",
            "active_requests",
            "pad_token_id",
        ] {
            assert!(!l.contains_key(absent), "{absent}: {l:?}");
        }
    }

    #[test]
    fn sglang_without_a_window_in_its_args_takes_the_one_from_its_loads() {
        let d = super::sglang(
            &Default::default(),
            &Default::default(),
            window_from_ranks([32, 32]),
        );
        assert_eq!(
            d.labels.get("max_running_requests").map(String::as_str),
            Some("64")
        );
        assert_eq!(window_from_ranks([0, -1]), None);
    }

    #[test]
    fn tokenspeed_spellings_fold_into_the_canonical_labels() {
        let server = tokenspeed::GetServerInfoResponse {
            server_args: args(&[
                ("model", s("Qwen/Qwen3-8B")),
                ("attn_tp_size", n(2.0)),
                ("data_parallel_size", n(2.0)),
                ("max_num_seqs", n(48.0)),
                ("disaggregation_mode", s("decode")),
                ("host", s("10.0.0.1")),
            ]),
            tokenspeed_version: "0.1.0".into(),
            ..Default::default()
        };
        let d = super::tokenspeed(&Default::default(), &server, Some(7));
        assert_eq!(d.runtime, RuntimeType::Tokenspeed);
        assert_eq!(d.models, ["Qwen/Qwen3-8B"]);
        let l = &d.labels;
        assert_eq!(l.get("tp_size").map(String::as_str), Some("2"));
        assert_eq!(l.get("dp_size").map(String::as_str), Some("2"));
        assert_eq!(l.get("max_num_seqs").map(String::as_str), Some("48"));
        assert!(
            !l.contains_key("max_running_requests"),
            "the loads' window does not replace the reported one"
        );
        assert_eq!(l.get("version").map(String::as_str), Some("0.1.0"));
        assert!(!l.contains_key("host"));
        assert!(
            !l.contains_key("disaggregation_transfer_backend"),
            "absent: pairing reads it as mooncake"
        );
    }

    #[test]
    fn vllm_facts_pull_the_connector_out_of_the_labels() {
        let model = vllm::GetModelInfoResponse {
            served_model_name: "m".into(),
            max_context_length: 4096,
            ..Default::default()
        };
        let server = vllm::GetServerInfoResponse {
            kv_connector: "NixlConnector".into(),
            kv_role: "kv_producer".into(),
            kv_engine_id: "e-1".into(),
            data_parallel_size: 2,
            kv_cache_dtype: "auto".into(),
            block_size: 16,
            model_dtype: "torch.bfloat16".into(),
            max_num_seqs: 256,
            uptime_seconds: 12.5,
            ..Default::default()
        };
        let d = super::vllm(&model, &server);
        assert_eq!(d.kv_connector.as_deref(), Some("NixlConnector"));
        assert_eq!(d.kv_role.as_deref(), Some("kv_producer"));
        assert_eq!(d.kv_engine_id.as_deref(), Some("e-1"));
        let l = &d.labels;
        assert_eq!(l.get("dp_size").map(String::as_str), Some("2"));
        assert_eq!(l.get("block_size").map(String::as_str), Some("16"));
        assert_eq!(l.get("max_num_seqs").map(String::as_str), Some("256"));
        assert_eq!(
            l.get("max_context_length").map(String::as_str),
            Some("4096")
        );
        assert!(!l.contains_key("kv_connector") && !l.contains_key("kv_engine_id"));
        assert!(!l.contains_key("uptime_seconds") && !l.contains_key("version"));
    }

    #[test]
    fn an_unwrapped_report_is_taken_as_it_is() {
        assert_eq!(
            vllm_kv_transfer("MooncakeConnector", "kv_producer", "e"),
            KvTransfer {
                connector: Some("MooncakeConnector".into()),
                role: Some("kv_producer".into()),
                engine_id: Some("e".into()),
            }
        );
        assert_eq!(vllm_kv_transfer("", "", ""), KvTransfer::default());
        // A bare MultiConnector name cannot be unwrapped: passthrough.
        assert_eq!(
            vllm_kv_transfer("MultiConnector", "kv_both", "p")
                .connector
                .as_deref(),
            Some("MultiConnector")
        );
    }

    #[test]
    fn a_multiconnector_around_one_handoff_connector_is_that_connector() {
        let config = json!({
            "kv_connector": "MultiConnector", "kv_role": "kv_both", "engine_id": "parent",
            "kv_connector_extra_config": {"connectors": [
                {"kv_connector": "NixlConnector", "kv_role": "kv_both", "engine_id": "child"},
                {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"},
            ]},
        });
        let kv = vllm_kv_transfer(&config.to_string(), "", "");
        assert_eq!(kv.connector.as_deref(), Some("NixlConnector"));
        assert_eq!(kv.engine_id.as_deref(), Some("child"));
        assert_eq!(kv.role.as_deref(), Some("kv_both"));

        // The child sets no engine id: the parent's.
        let config = json!({
            "kv_connector": "MultiConnector", "engine_id": "parent",
            "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeConnector"}]},
        });
        let kv = unwrap_kv_transfer_config(&config, Some("kv_producer".into()), None);
        assert_eq!(kv.connector.as_deref(), Some("MooncakeConnector"));
        assert_eq!(kv.engine_id.as_deref(), Some("parent"));
        assert_eq!(kv.role.as_deref(), Some("kv_producer"));

        // Neither engine id in the config: the separately reported one.
        let config = json!({"kv_connector": "MultiConnector",
            "kv_connector_extra_config": {"connectors": [{"kv_connector": "NixlConnector"}]}});
        let kv = vllm_kv_transfer(&config.to_string(), "kv_producer", "reported");
        assert_eq!(kv.engine_id.as_deref(), Some("reported"));
    }

    #[test]
    fn any_other_multiconnector_stays_passthrough() {
        for children in [
            json!([]),
            json!([{"kv_connector": "LMCacheConnectorV1"}]),
            json!([{"kv_connector": "NixlConnector"}, {"kv_connector": "MooncakeConnector"}]),
            json!([{"kv_connector": "MoRIIOConnector"}]),
        ] {
            let config = json!({"kv_connector": "MultiConnector", "engine_id": "parent",
                "kv_connector_extra_config": {"connectors": children}});
            let kv = unwrap_kv_transfer_config(&config, None, None);
            assert_eq!(kv.connector.as_deref(), Some("MultiConnector"), "{config}");
            assert_eq!(kv.engine_id.as_deref(), Some("parent"));
        }
        // Not JSON after all: no connector rather than a made-up one.
        assert_eq!(vllm_kv_transfer("{oops", "", "").connector, None);
    }
}
