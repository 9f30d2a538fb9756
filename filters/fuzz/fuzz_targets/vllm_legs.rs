//! vLLM `prefill_leg_body` / `decode_leg_body` / `harvest_kv_transfer_params`, and the Mooncake
//! tags, on any client object and any prefill response.
//!
//! Input: 2 control bytes, then the body (used as client request AND as prefill response).
//! * c0: route (mod 7); c1: bits0-1 tag kind (none, NIXL, Mooncake, the harvested params),
//!   bit2 decode params present.
//!
//! Properties: harvest returns exactly the last top-level `kv_transfer_params` when it is an
//! object (verbatim), else `None`. The prefill leg is the client object minus the handoff keys,
//! `stream_options`, `min_tokens`, `min_completion_tokens` (and `max_tokens` when capped on
//! `max_completion_tokens`), plus `stream: false`, `n: 1` when `n` was sent, the route's cap at 1
//! and the tag — each exactly once, all else byte-identical and in order. The decode leg is the
//! client object minus the handoff keys plus the params. Tags are valid JSON holding the ids.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdgate_filters::handoff::vllm::{
    decode_leg_body, harvest_kv_transfer_params, mooncake_bootstrap_addr, mooncake_decode_params,
    mooncake_prefill_tag, prefill_leg_body, NIXL_PREFILL_TAG,
};
use pdgate_filters::{scan_object, Route};
use pdgate_filters_fuzz::{
    assert_rewritten, non_null, parse, parse_object, raw_fields, split_control, TRICKY_STRINGS,
};
use serde_json::{json, Value};

const HANDOFF: &[&str] = &[
    "kv_transfer_params",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "routed_dp_rank",
    "disagg_prefill_dp_rank",
];

fuzz_target!(|data: &[u8]| {
    let (c, body) = split_control::<2>(data);
    let route = Route::ALL[usize::from(c[0]) % Route::ALL.len()];

    // Harvest, against a plain reading of the response.
    let harvested = harvest_kv_transfer_params(body);
    let want = raw_fields(body)
        .and_then(|f| f.get("kv_transfer_params").map(|r| r.get().to_owned()))
        .filter(|raw| raw.starts_with('{'));
    assert_eq!(
        harvested.map(|h| String::from_utf8_lossy(h).into_owned()),
        want,
        "harvest_kv_transfer_params"
    );

    // Mooncake tags with ids that need escaping.
    let id = TRICKY_STRINGS[usize::from(c[1] >> 4) % TRICKY_STRINGS.len()];
    let tag_v = parse(&mooncake_prefill_tag(id)).expect("mooncake prefill tag is JSON");
    assert_eq!(
        tag_v,
        json!({"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":id})
    );
    let addr = mooncake_bootstrap_addr(id, Some(u16::from(c[1])));
    let params = parse(&mooncake_decode_params(id, id, &addr)).expect("mooncake params are JSON");
    assert_eq!(params["remote_bootstrap_addr"], json!(addr));
    assert_eq!(params["remote_engine_id"], json!(id));

    let Ok(top) = scan_object(body) else { return };
    let fields = raw_fields(body).expect("object");
    let mooncake = mooncake_prefill_tag(id);
    let tag: Option<&[u8]> = match c[1] & 3 {
        0 => None,
        1 => Some(NIXL_PREFILL_TAG.as_bytes()),
        2 => Some(&mooncake),
        _ => harvested,
    };

    // Prefill leg.
    let out = prefill_leg_body(route, body, &top, tag);
    let cap = match route {
        Route::ChatCompletions if non_null(&fields, "max_completion_tokens").is_some() => {
            "max_completion_tokens"
        }
        Route::Responses => "max_output_tokens",
        _ => "max_tokens",
    };
    let mut drop: Vec<&str> = HANDOFF.to_vec();
    drop.extend(["stream_options", "min_tokens", "min_completion_tokens"]);
    if cap == "max_completion_tokens" {
        drop.push("max_tokens");
    }
    let mut set: Vec<(&str, &[u8])> = vec![("stream", b"false")];
    if top.contains("n") {
        set.push(("n", b"1"));
    }
    set.push((cap, b"1"));
    if let Some(tag) = tag {
        set.push(("kv_transfer_params", tag));
    }
    assert_rewritten(body, &top, &out, &drop, &set);
    let leg = parse_object(&out, "prefill leg");
    assert_eq!(leg["stream"], Value::Bool(false));
    assert_eq!(leg[cap], json!(1));

    // Decode leg.
    let params: Option<&[u8]> = if c[1] & 4 != 0 { tag } else { None };
    let out = decode_leg_body(body, &top, params);
    let set: Vec<(&str, &[u8])> = params
        .map(|p| ("kv_transfer_params", p))
        .into_iter()
        .collect();
    assert_rewritten(body, &top, &out, HANDOFF, &set);
});
