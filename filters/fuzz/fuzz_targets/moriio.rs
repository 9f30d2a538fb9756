//! MoRI-IO `check_request`, `validate_handoff` (and `validate_params`), `prefill_tag`,
//! `prefill_leg_body_into`, `concurrent_decode_params` and the pair check with hostile labels.
//!
//! Input: 6 control bytes, then the body (used as client request AND as prefill response).
//! * c0: route (mod 7); c1: bit0 WRITE mode, bit1 concurrent, bit2 told ports, bit3 decode TP,
//!   bits4-7 host/id choice; c2-c3: handshake port; c4-c5: notify port
//!
//! Properties: `check_request` refuses exactly per the documented rules in their order (route,
//! `n` > 1, batched `prompt`, `prompt_embeds` list, `use_beam_search`, reserved `request_id`).
//! `validate_handoff` accepts exactly the handoffs whose every field has the documented shape
//! (checked here field by field) and then returns the response's `kv_transfer_params` verbatim.
//! Tags and decode params are valid JSON with the plan's values; the prefill leg is the vLLM
//! prefill leg plus `ignore_eos: true`, without `stop`/`stop_token_ids`, tagged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdgate_filters::handoff::moriio::{
    check_pair, check_request, concurrent_decode_params, prefill_leg_body_into, prefill_tag,
    validate_handoff, HandoffExpectation, Mode, MoriPlan, MoriSide, MoriWorker, RequestRefusal,
    WriteDispatch,
};
use pdgate_filters::handoff::vllm::Connector;
use pdgate_filters::{scan_object, Route};
use pdgate_filters_fuzz::{
    assert_rewritten, elements, lit, non_null, parse, parse_object, raw_fields, split_control,
    value_of, Lit, TRICKY_STRINGS,
};
use serde_json::{json, Value};

fuzz_target!(|data: &[u8]| {
    let (c, body) = split_control::<6>(data);
    let route = Route::ALL[usize::from(c[0]) % Route::ALL.len()];
    let mode = if c[1] & 1 != 0 {
        Mode::Write
    } else {
        Mode::Read
    };
    let dispatch = if mode == Mode::Write && c[1] & 2 != 0 {
        WriteDispatch::Concurrent
    } else {
        WriteDispatch::Sequential
    };
    let text = TRICKY_STRINGS[usize::from(c[1] >> 4) % TRICKY_STRINGS.len()];
    let hp = u16::from_be_bytes([c[2], c[3]]);
    let np = u16::from_be_bytes([c[4], c[5]]);
    let side = |host: &str, tp| MoriSide {
        mode,
        host: host.to_owned(),
        handshake_port: hp,
        notify_port: np,
        write_dispatch: dispatch,
        tp_size: tp,
    };
    let plan = MoriPlan {
        mode,
        dispatch,
        prefill: side(text, None),
        decode: side(text, (c[1] & 8 != 0).then_some(u32::from(c[2]) + 1)),
    };

    // Handoff validation on the body as a prefill response.
    let fields = raw_fields(body);
    let kv = fields
        .as_ref()
        .and_then(|f| f.get("kv_transfer_params").map(|r| r.get()));
    let kv_fields = kv.and_then(|k| raw_fields(k.as_bytes()));
    let minted = kv_fields
        .as_ref()
        .and_then(|f| non_null(f, "transfer_id"))
        .and_then(|r| value_of(r).as_str().map(str::to_owned))
        .filter(|_| c[1] & 16 == 0)
        .unwrap_or_else(|| "xfer-1".to_owned());
    let expect = HandoffExpectation {
        transfer_id: &minted,
        told_ports: (c[1] & 4 != 0).then_some((hp, np)),
    };
    let got = validate_handoff(body, &expect);
    let want = kv_fields.as_ref().is_some_and(|f| handoff_ok(f, &expect));
    match got {
        Ok(params) => {
            assert!(want, "accepted a handoff the rules refuse: {:?}", kv);
            assert_eq!(
                Some(params),
                kv.map(str::as_bytes),
                "params not relayed verbatim"
            );
        }
        Err(reason) => assert!(!want, "refused a valid handoff: {reason}\n{kv:?}"),
    }

    // Tags and decode params.
    let tag = prefill_tag(&plan, text);
    let tag_v = parse(&tag).expect("prefill tag is JSON");
    assert_eq!(tag_v["transfer_id"], json!(text));
    assert_eq!(tag_v["do_remote_decode"], json!(true));
    assert_eq!(tag_v.get("remote_host").is_some(), mode == Mode::Write);
    let params = parse(&concurrent_decode_params(&plan, text)).expect("decode params are JSON");
    assert_eq!(params["remote_host"], json!(text));
    assert_eq!(params["remote_handshake_port"], json!(hp));
    assert_eq!(params["remote_notify_port"], json!(np));

    // Pair check with labels taken from the input: never panics, and an accepted pair is sane.
    let label_text = String::from_utf8_lossy(&body[..body.len().min(24)]).into_owned();
    let labels = |k: &str| -> Option<&str> {
        match (k, c[0] >> 3) {
            ("moriio_mode", m) => Some(if m & 1 == 0 { "write" } else { "read" }),
            ("moriio_host", m) if m & 2 != 0 => Some(&label_text),
            ("moriio_handshake_port" | "moriio_notify_port" | "tp_size", m) if m & 4 != 0 => {
                Some(&label_text)
            }
            ("moriio_write_dispatch", m) if m & 8 != 0 => Some(&label_text),
            _ => None,
        }
    };
    let worker = |host| MoriWorker {
        connector: Connector::MoriIo,
        dp_size: 1,
        url_host: host,
        label: &labels,
    };
    if let Ok(p) = check_pair(&worker(text), &worker("10.0.0.2")) {
        for s in [&p.prefill, &p.decode] {
            assert!(s.handshake_port != 0 && s.notify_port != 0);
            assert!(!s.host.is_empty() && !s.host.chars().any(char::is_whitespace));
        }
    }

    // Request checks and the prefill leg on the body as a client request.
    let Ok(top) = scan_object(body) else { return };
    let fields = fields.expect("object");
    assert_eq!(
        check_request(route, body, &top),
        request_oracle(route, &fields),
        "check_request"
    );
    let mut out = Vec::new();
    prefill_leg_body_into(&mut out, route, body, &top, &tag);
    let cap = match route {
        Route::ChatCompletions if non_null(&fields, "max_completion_tokens").is_some() => {
            "max_completion_tokens"
        }
        Route::Responses => "max_output_tokens",
        _ => "max_tokens",
    };
    let mut drop = vec![
        "kv_transfer_params",
        "bootstrap_host",
        "bootstrap_port",
        "bootstrap_room",
        "routed_dp_rank",
        "disagg_prefill_dp_rank",
        "stream_options",
        "min_tokens",
        "min_completion_tokens",
        "stop",
        "stop_token_ids",
    ];
    if cap == "max_completion_tokens" {
        drop.push("max_tokens");
    }
    let mut set: Vec<(&str, &[u8])> = vec![("ignore_eos", b"true"), ("stream", b"false")];
    if top.contains("n") {
        set.push(("n", b"1"));
    }
    set.push((cap, b"1"));
    set.push(("kv_transfer_params", &tag));
    assert_rewritten(body, &top, &out, &drop, &set);
    let leg = parse_object(&out, "MoRI-IO prefill leg");
    assert_eq!(leg["ignore_eos"], Value::Bool(true));
    assert_eq!(leg["kv_transfer_params"], tag_v);
});

type Fields<'a> = std::collections::HashMap<String, &'a serde_json::value::RawValue>;

fn request_oracle(route: Route, f: &Fields) -> Result<(), RequestRefusal> {
    if !matches!(route, Route::ChatCompletions | Route::Completions) {
        return Err(RequestRefusal::RouteUnsupported(route));
    }
    let get = |k: &str| non_null(f, k);
    if get("n")
        .and_then(|r| value_of(r).as_u64())
        .is_some_and(|n| n > 1)
    {
        return Err(RequestRefusal::Fanout("`n` > 1"));
    }
    if let Some(els) = get("prompt").and_then(elements) {
        if els.len() > 1 && !els.iter().all(|e| lit(e) == Lit::Integer) {
            return Err(RequestRefusal::Fanout("a batched `prompt`"));
        }
    }
    if get("prompt_embeds")
        .and_then(elements)
        .is_some_and(|e| e.len() > 1)
    {
        return Err(RequestRefusal::Fanout("a `prompt_embeds` list"));
    }
    if get("use_beam_search") == Some("true") {
        return Err(RequestRefusal::Fanout("`use_beam_search`"));
    }
    if let Some(id) = get("request_id").and_then(|r| value_of(r).as_str().map(str::to_owned)) {
        if id.contains("___prefill_addr_") || id.contains("___decode_addr_") {
            return Err(RequestRefusal::RequestIdReserved);
        }
    }
    Ok(())
}

/// The handoff rules of `validate_params`' documentation, read with serde_json.
fn handoff_ok(f: &Fields, expect: &HandoffExpectation) -> bool {
    let get = |k: &str| non_null(f, k).map(value_of);
    let string = |k: &str| get(k).and_then(|v| v.as_str().map(str::to_owned));
    let digits = |s: &str| -> Option<u64> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let count = |raw: &str| -> Option<u64> {
        match lit(raw) {
            Lit::Integer => value_of(raw).as_u64(),
            Lit::String => digits(value_of(raw).as_str()?),
            _ => None,
        }
    };
    let port = |k: &str| -> Option<u16> {
        count(non_null(f, k)?)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0)
    };
    if string("transfer_id").as_deref() != Some(expect.transfer_id) {
        return false;
    }
    if string("remote_engine_id").is_none_or(|s| s.is_empty()) {
        return false;
    }
    let Some(blocks) = non_null(f, "remote_block_ids").and_then(elements) else {
        return false;
    };
    let flat = blocks.iter().all(|b| lit(b) == Lit::Integer);
    let grouped = blocks
        .iter()
        .all(|b| elements(b).is_some_and(|g| g.iter().all(|e| lit(e) == Lit::Integer)));
    if !flat && !grouped {
        return false;
    }
    if string("remote_host").is_none_or(|h| h.is_empty() || h.chars().any(char::is_whitespace)) {
        return false;
    }
    let (Some(hp), Some(np)) = (port("remote_handshake_port"), port("remote_notify_port")) else {
        return false;
    };
    for k in [
        "remote_dp_size",
        "remote_dp_size_local",
        "remote_dp_rank",
        "tp_size",
        "remote_tp_size",
    ] {
        if non_null(f, k).is_some_and(|raw| count(raw).is_none()) {
            return false;
        }
    }
    expect.told_ports.is_none_or(|told| told == (hp, np))
}
