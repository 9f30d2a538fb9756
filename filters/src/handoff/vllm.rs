//! vLLM sequential dispatch over HTTP: the connector modes, the one-token prefill leg, the
//! `kv_transfer_params` tags the gateway mints, the relay of the prefill's params to the decode
//! leg, and the decode leg body.

use crate::body::{rewrite_into, scan_object, Sink, TopLevel};
use crate::fields;
use crate::handoff::sglang;
use crate::json;
use crate::route::Route;
use crate::value::{self, Kind};

/// The handoff object on both vLLM legs and in the prefill response.
pub const KV_TRANSFER_PARAMS: &str = "kv_transfer_params";

/// Keys of `kv_transfer_params` objects minted by the gateway.
pub const DO_REMOTE_DECODE: &str = "do_remote_decode";
pub const DO_REMOTE_PREFILL: &str = "do_remote_prefill";
pub const TRANSFER_ID: &str = "transfer_id";
pub const REMOTE_ENGINE_ID: &str = "remote_engine_id";
pub const REMOTE_BOOTSTRAP_ADDR: &str = "remote_bootstrap_addr";

/// Prefix of minted transfer ids (`xfer-<uuid>`).
pub const TRANSFER_ID_PREFIX: &str = "xfer-";

/// Mooncake's bootstrap port when the prefill worker registered none.
pub const MOONCAKE_DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

/// The prefill worker's KV connector (registered `kv_connector`), which decides the tags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Connector {
    Nixl,
    Mooncake,
    MoriIo,
    /// No or unknown connector: no tag, whatever the prefill returns is relayed.
    Passthrough,
}

impl Connector {
    /// Exact, case-sensitive connector class name → mode; anything else is passthrough.
    pub fn from_name(name: Option<&str>) -> Connector {
        match name {
            Some("NixlConnector") => Connector::Nixl,
            Some("MooncakeConnector") => Connector::Mooncake,
            Some("MoRIIOConnector") => Connector::MoriIo,
            _ => Connector::Passthrough,
        }
    }

    /// The `mode` label of `smg_pd_kv_connector_mode_total`.
    pub fn mode_label(self) -> &'static str {
        match self {
            Connector::Nixl => "nixl",
            Connector::Mooncake => "mooncake",
            Connector::MoriIo => "moriio",
            Connector::Passthrough => "passthrough",
        }
    }
}

/// The NIXL prefill tag: compute, then hold the KV for a remote decode.
pub const NIXL_PREFILL_TAG: &str = r#"{"do_remote_decode":true,"do_remote_prefill":false}"#;

/// The Mooncake prefill tag: the NIXL tag plus the minted `transfer_id`.
pub fn mooncake_prefill_tag(transfer_id: &str) -> Vec<u8> {
    json::object(&[
        (DO_REMOTE_DECODE, b"true"),
        (DO_REMOTE_PREFILL, b"false"),
        (TRANSFER_ID, &json::string(transfer_id)),
    ])
}

/// The Mooncake decode params, synthesized because Mooncake pushes the KV and returns nothing:
/// `{"do_remote_decode":false,"do_remote_prefill":true,"transfer_id","remote_engine_id",
/// "remote_bootstrap_addr"}`. `bootstrap_addr` is `http://<host>:<port>` (see
/// [`mooncake_bootstrap_addr`]).
pub fn mooncake_decode_params(transfer_id: &str, engine_id: &str, bootstrap_addr: &str) -> Vec<u8> {
    json::object(&[
        (DO_REMOTE_DECODE, b"false"),
        (DO_REMOTE_PREFILL, b"true"),
        (TRANSFER_ID, &json::string(transfer_id)),
        (REMOTE_ENGINE_ID, &json::string(engine_id)),
        (REMOTE_BOOTSTRAP_ADDR, &json::string(bootstrap_addr)),
    ])
}

/// `http://<bootstrap host>:<port or 8998>`.
pub fn mooncake_bootstrap_addr(host: &str, port: Option<u16>) -> String {
    format!(
        "http://{host}:{}",
        port.unwrap_or(MOONCAKE_DEFAULT_BOOTSTRAP_PORT)
    )
}

/// Client keys never forwarded to vLLM legs: the handoff (the gateway decides it), SGLang
/// bootstrap fields and DP keys.
const HANDOFF_KEYS: &[&str] = &[
    KV_TRANSFER_PARAMS,
    sglang::BOOTSTRAP_HOST,
    sglang::BOOTSTRAP_PORT,
    sglang::BOOTSTRAP_ROOM,
    sglang::ROUTED_DP_RANK,
    sglang::DISAGG_PREFILL_DP_RANK,
];

/// Keys dropped from every prefill leg besides the handoff keys and the cap: a stream option
/// without `stream: true` and a minimum above the one-token cap are both 400s in vLLM.
const PREFILL_DROPS: &[&str] = &[
    fields::STREAM_OPTIONS,
    fields::MIN_TOKENS,
    fields::MIN_COMPLETION_TOKENS,
];

/// The prefill leg: capped at one token on the route's own field, `stream: false`, `n: 1` if
/// present, no `min_tokens`/`min_completion_tokens`, no `stream_options`, no client
/// `kv_transfer_params`/bootstrap/DP keys (replaced by `tag` when `Some`).
///
/// Cap: chat with `max_completion_tokens` (non-null) → `max_completion_tokens: 1` and
/// `max_tokens` dropped (vLLM reads `max_completion_tokens or max_tokens`); `/v1/responses` →
/// `max_output_tokens: 1`; every other route, chat without a cap included → `max_tokens: 1`.
pub fn prefill_leg_body(route: Route, body: &[u8], top: &TopLevel, tag: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 64 + tag.map_or(0, <[u8]>::len));
    prefill_leg_body_into(&mut out, route, body, top, tag, &[], &[]);
    out
}

/// [`prefill_leg_body`] with further keys dropped and set (MoRI-IO's stop edits, a canonical
/// `model`), into any [`Sink`]: a `Vec` (one copy), or a [`crate::body::PartsSink`] (the
/// client's bytes uncopied).
pub fn prefill_leg_body_into<S: Sink>(
    out: &mut S,
    route: Route,
    body: &[u8],
    top: &TopLevel,
    tag: Option<&[u8]>,
    extra_drop: &[&str],
    extra_set: &[(&str, &[u8])],
) {
    let cap = match route {
        Route::ChatCompletions
            if top
                .get_non_null(body, fields::MAX_COMPLETION_TOKENS)
                .is_some() =>
        {
            fields::MAX_COMPLETION_TOKENS
        }
        Route::Responses => fields::MAX_OUTPUT_TOKENS,
        _ => fields::MAX_TOKENS,
    };
    let mut drop: Vec<&str> =
        Vec::with_capacity(HANDOFF_KEYS.len() + PREFILL_DROPS.len() + 1 + extra_drop.len());
    drop.extend_from_slice(HANDOFF_KEYS);
    drop.extend_from_slice(PREFILL_DROPS);
    if cap == fields::MAX_COMPLETION_TOKENS {
        drop.push(fields::MAX_TOKENS);
    }
    drop.extend_from_slice(extra_drop);

    let mut set: Vec<(&str, &[u8])> = Vec::with_capacity(4 + extra_set.len());
    set.extend_from_slice(extra_set);
    set.push((fields::STREAM, b"false"));
    if top.contains(fields::N) {
        set.push((fields::N, b"1"));
    }
    set.push((cap, b"1"));
    if let Some(tag) = tag {
        set.push((KV_TRANSFER_PARAMS, tag));
    }
    rewrite_into(out, body, top, &drop, &set)
}

/// The decode leg: the client request unchanged except client `kv_transfer_params`, bootstrap
/// and DP keys are stripped and `params` (when `Some`) is set as `kv_transfer_params`.
pub fn decode_leg_body(body: &[u8], top: &TopLevel, params: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 32 + params.map_or(0, <[u8]>::len));
    decode_leg_body_into(&mut out, body, top, params, &[]);
    out
}

/// [`decode_leg_body`] with further keys set (e.g. a canonical `model`), into any [`Sink`].
pub fn decode_leg_body_into<S: Sink>(
    out: &mut S,
    body: &[u8],
    top: &TopLevel,
    params: Option<&[u8]>,
    extra_set: &[(&str, &[u8])],
) {
    let mut set: Vec<(&str, &[u8])> = Vec::with_capacity(1 + extra_set.len());
    set.extend_from_slice(extra_set);
    if let Some(params) = params {
        set.push((KV_TRANSFER_PARAMS, params));
    }
    rewrite_into(out, body, top, HANDOFF_KEYS, &set)
}

/// vLLM ≥ 0.31 (NIXL, MoRI-IO): the prefill's params carry its own prefix-cache hit count, and
/// a decode given them reports that count as its `cached_tokens`, whatever it loaded.
pub const REMOTE_PREFILL_CACHED_TOKENS: &str = "remote_prefill_cached_tokens";

/// Whether relayed `kv_transfer_params` carry [`REMOTE_PREFILL_CACHED_TOKENS`] (then the
/// decode's cached-token count is the prefill's, not a report of the transfer).
pub fn carries_prefill_cached_tokens(params: &[u8]) -> bool {
    scan_object(params).is_ok_and(|t| t.contains(REMOTE_PREFILL_CACHED_TOKENS))
}

/// NIXL params a vLLM decode cannot take: `do_remote_prefill: true` with no block to read
/// (`remote_block_ids` an empty list, or a list of empty per-group lists). vLLM's scheduler
/// asserts on them (`nixl/pull_scheduler.py`, `update_state_after_alloc`, v0.9.2–0.33.0)
/// instead of recomputing, which takes the whole decode engine down; they are never relayed.
pub fn crashes_nixl_decode(params: &[u8]) -> bool {
    let Ok(top) = scan_object(params) else {
        return false;
    };
    if top.get(params, DO_REMOTE_PREFILL) != Some(&b"true"[..]) {
        return false;
    }
    let Some(ids) = top.get(params, "remote_block_ids") else {
        return false;
    };
    match serde_json::from_slice::<serde_json::Value>(ids) {
        Ok(serde_json::Value::Array(list)) => list
            .iter()
            .all(|group| matches!(group, serde_json::Value::Array(inner) if inner.is_empty())),
        _ => false,
    }
}

/// The prefill response's top-level `kv_transfer_params` raw bytes, relayed verbatim. Absent,
/// JSON `null`, not an object, or a response that is not a JSON object → `None`.
pub fn harvest_kv_transfer_params(prefill_response: &[u8]) -> Option<&[u8]> {
    let top = scan_object(prefill_response).ok()?;
    let raw = top.get(prefill_response, KV_TRANSFER_PARAMS)?;
    (value::kind(raw) == Some(Kind::Object)).then_some(raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn params_without_blocks_would_crash_a_nixl_decode() {
        for bad in [
            &br#"{"do_remote_prefill":true,"remote_block_ids":[]}"#[..],
            br#"{"do_remote_prefill":true,"remote_block_ids":[[]]}"#,
        ] {
            assert!(crashes_nixl_decode(bad), "{}", String::from_utf8_lossy(bad));
        }
        for ok in [
            &br#"{"do_remote_prefill":true,"remote_block_ids":[1,2]}"#[..],
            br#"{"do_remote_prefill":true,"remote_block_ids":[[3]]}"#,
            br#"{"do_remote_prefill":false,"remote_block_ids":[]}"#,
            br#"{"remote_block_ids":[]}"#,
            b"garbage",
        ] {
            assert!(!crashes_nixl_decode(ok), "{}", String::from_utf8_lossy(ok));
        }
    }

    #[test]
    fn relayed_prefill_cache_counts_are_seen() {
        assert!(carries_prefill_cached_tokens(
            br#"{"remote_block_ids":[1],"remote_prefill_cached_tokens":32}"#
        ));
        assert!(!carries_prefill_cached_tokens(
            br#"{"remote_block_ids":[1]}"#
        ));
        assert!(!carries_prefill_cached_tokens(b"not json"));
    }

    fn prefill(route: Route, body: &str, tag: Option<&[u8]>) -> Value {
        let top = scan_object(body.as_bytes()).unwrap();
        serde_json::from_slice(&prefill_leg_body(route, body.as_bytes(), &top, tag)).unwrap()
    }

    fn decode(body: &str, params: Option<&[u8]>) -> Vec<u8> {
        let top = scan_object(body.as_bytes()).unwrap();
        decode_leg_body(body.as_bytes(), &top, params)
    }

    #[test]
    fn connector_names_are_exact_and_case_sensitive() {
        assert_eq!(Connector::from_name(Some("NixlConnector")), Connector::Nixl);
        assert_eq!(
            Connector::from_name(Some("MooncakeConnector")),
            Connector::Mooncake
        );
        assert_eq!(
            Connector::from_name(Some("MoRIIOConnector")),
            Connector::MoriIo
        );
        for other in [
            Some("nixlconnector"),
            Some("NixlConnector "),
            Some("MultiConnector"),
            Some(""),
            None,
        ] {
            assert_eq!(Connector::from_name(other), Connector::Passthrough);
        }
    }

    #[test]
    fn mode_labels() {
        assert_eq!(Connector::Nixl.mode_label(), "nixl");
        assert_eq!(Connector::Mooncake.mode_label(), "mooncake");
        assert_eq!(Connector::MoriIo.mode_label(), "moriio");
        assert_eq!(Connector::Passthrough.mode_label(), "passthrough");
    }

    #[test]
    fn vllm_prefill_leg_is_capped_at_one_token() {
        let v = prefill(
            Route::ChatCompletions,
            r#"{"model":"m","max_tokens":50,"max_completion_tokens":50,"stream":true,
                "stream_options":{"include_usage":true},"min_tokens":5,"n":1}"#,
            Some(NIXL_PREFILL_TAG.as_bytes()),
        );
        assert_eq!(
            v,
            json!({"model":"m","stream":false,"n":1,"max_completion_tokens":1,
                "kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false}})
        );
    }

    #[test]
    fn chat_with_only_max_tokens_caps_max_tokens() {
        let v = prefill(Route::ChatCompletions, r#"{"max_tokens":50}"#, None);
        assert_eq!(v, json!({"stream":false,"max_tokens":1}));
    }

    #[test]
    fn chat_without_any_cap_gets_max_tokens_one() {
        let v = prefill(Route::ChatCompletions, r#"{"messages":[]}"#, None);
        assert_eq!(v, json!({"messages":[],"stream":false,"max_tokens":1}));
    }

    #[test]
    fn responses_cap_is_max_output_tokens() {
        let v = prefill(Route::Responses, r#"{"input":"x","max_tokens":9}"#, None);
        assert_eq!(
            v,
            json!({"input":"x","max_tokens":9,"stream":false,"max_output_tokens":1})
        );
    }

    #[test]
    fn completions_cap_is_max_tokens() {
        let v = prefill(
            Route::Completions,
            r#"{"prompt":"x","max_tokens":9,"min_completion_tokens":3}"#,
            None,
        );
        assert_eq!(v, json!({"prompt":"x","stream":false,"max_tokens":1}));
    }

    #[test]
    fn n_is_set_to_one_only_when_present() {
        let v = prefill(Route::Completions, r#"{"n":1}"#, None);
        assert_eq!(v["n"], 1);
        let v = prefill(Route::Completions, r#"{}"#, None);
        assert!(v.get("n").is_none());
    }

    #[test]
    fn client_handoff_keys_never_reach_the_prefill() {
        let v = prefill(
            Route::Completions,
            r#"{"kv_transfer_params":{"evil":1},"bootstrap_room":1,"bootstrap_host":"h",
                "bootstrap_port":2,"routed_dp_rank":0,"disagg_prefill_dp_rank":0}"#,
            None,
        );
        assert_eq!(v, json!({"stream":false,"max_tokens":1}));
    }

    #[test]
    fn prefill_tag_replaces_client_params() {
        let tag = mooncake_prefill_tag("xfer-1");
        let v = prefill(
            Route::Completions,
            r#"{"kv_transfer_params":{"evil":1}}"#,
            Some(&tag),
        );
        assert_eq!(
            v["kv_transfer_params"],
            json!({"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":"xfer-1"})
        );
    }

    #[test]
    fn prefill_leg_keeps_other_fields_byte_identical() {
        let body = br#"{"messages" : [ {"role":"user","content":"h\u00e9"} ],"temperature":0.70}"#;
        let top = scan_object(body).unwrap();
        let out = prefill_leg_body(Route::ChatCompletions, body, &top, None);
        assert!(out.starts_with(
            br#"{"messages" : [ {"role":"user","content":"h\u00e9"} ],"temperature":0.70,"#
        ));
    }

    #[test]
    fn prefill_leg_with_extra_edits() {
        let body = br#"{"stop":["x"],"stop_token_ids":[1],"model":"a"}"#;
        let top = scan_object(body).unwrap();
        let mut out = Vec::new();
        prefill_leg_body_into(
            &mut out,
            Route::Completions,
            body,
            &top,
            None,
            &["stop", "stop_token_ids"],
            &[("ignore_eos", b"true")],
        );
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v,
            json!({"model":"a","ignore_eos":true,"stream":false,"max_tokens":1})
        );
    }

    #[test]
    fn decode_leg_is_the_client_request_plus_params() {
        let body = r#"{"max_completion_tokens":50,"stream":true,"stream_options":{"include_usage":true},"min_tokens":5,"bootstrap_room":3,"kv_transfer_params":{"x":1}}"#;
        let out = decode(body, Some(br#"{"remote_engine_id":"e"}"#));
        assert_eq!(
            out,
            br#"{"max_completion_tokens":50,"stream":true,"stream_options":{"include_usage":true},"min_tokens":5,"kv_transfer_params":{"remote_engine_id":"e"}}"#
        );
    }

    #[test]
    fn decode_leg_without_params_strips_client_params() {
        let out = decode(
            r#"{"n":2,"kv_transfer_params":{"x":1},"routed_dp_rank":1}"#,
            None,
        );
        assert_eq!(out, br#"{"n":2}"#);
    }

    #[test]
    fn mooncake_tags() {
        let v: Value = serde_json::from_slice(&mooncake_prefill_tag("xfer-\"q")).unwrap();
        assert_eq!(
            v,
            json!({"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":"xfer-\"q"})
        );
        let addr = mooncake_bootstrap_addr("10.0.0.5", None);
        assert_eq!(addr, "http://10.0.0.5:8998");
        assert_eq!(mooncake_bootstrap_addr("p", Some(7777)), "http://p:7777");
        let v: Value =
            serde_json::from_slice(&mooncake_decode_params("xfer-1", "eng", &addr)).unwrap();
        assert_eq!(
            v,
            json!({"do_remote_decode":false,"do_remote_prefill":true,"transfer_id":"xfer-1",
                "remote_engine_id":"eng","remote_bootstrap_addr":"http://10.0.0.5:8998"})
        );
    }

    #[test]
    fn nixl_tag_is_valid_json() {
        let v: Value = serde_json::from_str(NIXL_PREFILL_TAG).unwrap();
        assert_eq!(
            v,
            json!({"do_remote_decode":true,"do_remote_prefill":false})
        );
    }

    #[test]
    fn harvest_returns_the_raw_object_verbatim() {
        let resp =
            br#"{"id":"x","kv_transfer_params": {"remote_block_ids":[[1, 2]],"tp_size":1} }"#;
        assert_eq!(
            harvest_kv_transfer_params(resp).unwrap(),
            br#"{"remote_block_ids":[[1, 2]],"tp_size":1}"#
        );
    }

    #[test]
    fn harvest_treats_null_absent_and_non_objects_as_none() {
        for resp in [
            &br#"{"kv_transfer_params":null}"#[..],
            br#"{"id":"x"}"#,
            br#"{"kv_transfer_params":[1]}"#,
            br#"{"kv_transfer_params":"s"}"#,
            br#"[{"kv_transfer_params":{}}]"#,
            b"not json",
            b"",
        ] {
            assert_eq!(harvest_kv_transfer_params(resp), None);
        }
    }

    #[test]
    fn harvest_takes_the_last_duplicate() {
        let resp = br#"{"kv_transfer_params":{"a":1},"kv_transfer_params":{"b":2}}"#;
        assert_eq!(harvest_kv_transfer_params(resp).unwrap(), br#"{"b":2}"#);
    }
}
