//! Property tests of the hot-path transforms: they never panic on hostile bytes, validate JSON
//! exactly like serde_json, rewrite without losing or inventing data, and read SSE streams the
//! same way whatever the chunking.

use pdgate_filters::body::{rewrite, scan_object, BodyError};
use pdgate_filters::classify::classify;
use pdgate_filters::framing::{BodyDecoder, Framing};
use pdgate_filters::handoff::moriio;
use pdgate_filters::handoff::sglang::{self, BootstrapTarget, DpRanks, Leg, Rooms};
use pdgate_filters::handoff::vllm;
use pdgate_filters::logprobs::{self, PrefillLogprobs};
use pdgate_filters::route::Route;
use pdgate_filters::sse::{self, DoneDetector, SseSplitter};
use proptest::prelude::*;
use serde_json::{Map, Value};

/// Bytes that often form JSON or near-JSON.
fn json_ish() -> impl Strategy<Value = Vec<u8>> {
    const ALPHABET: &[u8] = b"{}[]\":,0123456789-+.eEtruefalsnl \n\r\t\\u\xc3\xa9\xff\x01abx";
    prop::collection::vec(prop::sample::select(ALPHABET), 0..64)
}

/// Any JSON value, with keys from a small set so objects collide.
fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        // Binary fractions: serde_json's default float parsing round-trips them exactly.
        (-1e6f64..1e6).prop_map(|f| Value::from((f * 8.0).round() / 8.0)),
        "[a-z\"\\\\\u{e9}\u{1f600}\n ]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..5)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("model".to_owned()),
        Just("stream".to_owned()),
        Just("n".to_owned()),
        Just("bootstrap_room".to_owned()),
        Just("bootstrap_host".to_owned()),
        Just("bootstrap_port".to_owned()),
        Just("kv_transfer_params".to_owned()),
        Just("routed_dp_rank".to_owned()),
        Just("meta_info".to_owned()),
        "[a-e]{1,3}",
        "[a-z\"\\\\\u{e9}]{0,4}",
    ]
}

/// A JSON key as text, sometimes with gratuitous escapes (`\u0061` for `a`).
fn key_text(k: &str, escape: bool) -> String {
    if !escape {
        return serde_json::to_string(k).unwrap();
    }
    let mut s = String::from("\"");
    for c in k.chars() {
        match c {
            'a'..='z' => s.push_str(&format!("\\u{:04x}", c as u32)),
            _ => {
                let enc = serde_json::to_string(&c.to_string()).unwrap();
                s.push_str(&enc[1..enc.len() - 1]);
            }
        }
    }
    s.push('"');
    s
}

/// An object body written by hand: duplicate keys allowed, odd whitespace, escaped keys.
fn arb_object_body() -> impl Strategy<Value = String> {
    let entry = (key(), arb_json(), any::<bool>(), 0usize..3, any::<bool>());
    prop::collection::vec(entry, 0..8).prop_map(|entries| {
        let ws = ["", " ", "\n\t "];
        let mut s = String::from(ws[entries.len() % 3]);
        s.push('{');
        for (i, (k, v, esc, w, pretty)) in entries.iter().enumerate() {
            if i > 0 {
                s.push_str(ws[*w]);
                s.push(',');
            }
            s.push_str(ws[*w]);
            s.push_str(&key_text(k, *esc));
            s.push_str(ws[(w + 1) % 3]);
            s.push(':');
            s.push_str(ws[*w]);
            if *pretty {
                s.push_str(&serde_json::to_string_pretty(v).unwrap());
            } else {
                s.push_str(&serde_json::to_string(v).unwrap());
            }
        }
        s.push_str(ws[entries.len() % 3]);
        s.push('}');
        s
    })
}

fn expected_after(body: &Value, drop: &[&str], set: &[(&str, Value)]) -> Value {
    let mut map = body.as_object().unwrap().clone();
    for k in drop {
        map.remove(*k);
    }
    for (k, v) in set {
        map.insert((*k).to_owned(), v.clone());
    }
    Value::Object(map)
}

/// An SSE stream built from pieces that exercise line endings and the DONE sentinel.
fn arb_sse_stream() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(&b"data: "[..]),
        Just(&b"data:"[..]),
        Just(&b"[DONE]"[..]),
        Just(&b"{\"t\":\"data: [DONE]\"}"[..]),
        Just(&b"\n"[..]),
        Just(&b"\r"[..]),
        Just(&b"\r\n"[..]),
        Just(&b": c"[..]),
        Just(&b"event: x"[..]),
        Just(&b"data"[..]),
        Just(&b"abcdefghijklmnopqrstuvwxyz0123456789"[..]),
        Just(&b" "[..]),
    ];
    let pieces = prop::collection::vec(piece, 0..40).prop_map(|ps| ps.concat());
    let bytes = prop::collection::vec(prop::sample::select(&b"\r\n\r\ndata: [DONE]x:"[..]), 0..80);
    prop_oneof![pieces, bytes]
}

fn chunked(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.push(0);
    points.push(bytes.len());
    points.sort_unstable();
    points
        .windows(2)
        .map(|w| bytes[w[0]..w[1]].to_vec())
        .collect()
}

fn split(chunks: &[Vec<u8>]) -> (Vec<Vec<u8>>, Option<Vec<u8>>) {
    let mut s = SseSplitter::new();
    let mut out = Vec::new();
    for c in chunks {
        s.push(c, &mut out);
    }
    (out, s.finish())
}

fn detect(chunks: &[Vec<u8>]) -> bool {
    let mut d = DoneDetector::new();
    let mut seen = false;
    for c in chunks {
        seen = d.feed(c);
    }
    seen
}

proptest! {
    // 512 cases by default; `PROPTEST_CASES=N` runs more.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(512),
        ..ProptestConfig::default()
    })]

    #[test]
    fn scan_object_agrees_with_serde_json_on_arbitrary_bytes(
        bytes in prop_oneof![json_ish(), prop::collection::vec(any::<u8>(), 0..64)]
    ) {
        let reference = serde_json::from_slice::<Value>(&bytes);
        match (scan_object(&bytes), reference) {
            (Ok(_), Ok(v)) => prop_assert!(v.is_object()),
            (Err(BodyError::NotObject), Ok(v)) => prop_assert!(!v.is_object()),
            (Err(BodyError::Syntax(_)), Err(_)) => {}
            (got, want) => prop_assert!(false, "scan {:?} vs serde_json {:?}", got, want),
        }
    }

    #[test]
    fn scan_object_agrees_with_serde_json_on_mutated_json(
        v in arb_json(), pos in any::<usize>(), byte in any::<u8>(), mode in 0u8..3
    ) {
        let mut bytes = serde_json::to_vec(&v).unwrap();
        let at = pos % (bytes.len() + 1);
        match mode {
            0 => bytes.insert(at, byte),
            1 if at < bytes.len() => { bytes.remove(at); }
            _ if at < bytes.len() => bytes[at] = byte,
            _ => {}
        }
        let reference = serde_json::from_slice::<Value>(&bytes);
        match (scan_object(&bytes), reference) {
            (Ok(_), Ok(v)) => prop_assert!(v.is_object()),
            (Err(BodyError::NotObject), Ok(v)) => prop_assert!(!v.is_object()),
            (Err(BodyError::Syntax(_)), Err(_)) => {}
            (got, want) => prop_assert!(false, "scan {:?} vs serde_json {:?}", got, want),
        }
    }

    #[test]
    fn scan_object_entries_match_the_parsed_value(body in arb_object_body()) {
        let value: Value = serde_json::from_str(&body).unwrap();
        let top = scan_object(body.as_bytes()).unwrap();
        let map = value.as_object().unwrap();
        for (k, v) in map {
            let raw = top.get(body.as_bytes(), k).unwrap();
            prop_assert_eq!(&serde_json::from_slice::<Value>(raw).unwrap(), v);
        }
        for e in top.entries() {
            prop_assert!(map.contains_key(&e.key));
            prop_assert_eq!(body.as_bytes()[e.key_start], b'"');
        }
    }

    #[test]
    fn rewrite_output_equals_input_with_edits_applied(
        body in arb_object_body(),
        drop in prop::collection::vec(key(), 0..4),
        set in prop::collection::vec((key(), arb_json()), 0..4),
    ) {
        let mut seen = std::collections::HashSet::new();
        let set: Vec<(String, Value)> =
            set.into_iter().filter(|(k, _)| seen.insert(k.clone())).collect();
        let set_text: Vec<(String, Vec<u8>)> =
            set.iter().map(|(k, v)| (k.clone(), serde_json::to_vec(v).unwrap())).collect();
        let set_refs: Vec<(&str, &[u8])> =
            set_text.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
        let drop_refs: Vec<&str> = drop.iter().map(String::as_str).collect();

        let top = scan_object(body.as_bytes()).unwrap();
        let out = rewrite(body.as_bytes(), &top, &drop_refs, &set_refs);
        let got: Value = serde_json::from_slice(&out).unwrap();
        let want_set: Vec<(&str, Value)> =
            set.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let input: Value = serde_json::from_str(&body).unwrap();
        prop_assert_eq!(got, expected_after(&input, &drop_refs, &want_set));
    }

    #[test]
    fn sglang_leg_carries_each_bootstrap_key_once(
        body in arb_object_body(),
        room in any::<u64>(),
        batch in prop::option::of(0usize..4),
        port in prop::option::of(any::<u16>()),
        host in "[a-z0-9.:\\[\\]\"\\\\]{0,12}",
        decode in any::<bool>(),
        dp in (prop::option::of(0u32..8), prop::option::of(0u32..8)),
    ) {
        let top = scan_object(body.as_bytes()).unwrap();
        let rooms = match batch {
            None => Rooms::Single(sglang::room_from_bits(room)),
            Some(n) => Rooms::Batch((0..n as u64).map(|i| sglang::room_from_bits(room ^ i)).collect()),
        };
        let target = BootstrapTarget { host: &host, port };
        let leg = if decode { Leg::Decode } else { Leg::Prefill };
        let dp = DpRanks { prefill: dp.0, decode: dp.1 };
        let out = sglang::leg_body(body.as_bytes(), &top, &target, &rooms, leg, &dp);

        let out_top = scan_object(&out).unwrap();
        for k in [sglang::BOOTSTRAP_HOST, sglang::BOOTSTRAP_PORT, sglang::BOOTSTRAP_ROOM] {
            prop_assert_eq!(out_top.entries().iter().filter(|e| e.key == k).count(), 1);
        }
        prop_assert!(!out_top.contains(vllm::KV_TRANSFER_PARAMS));
        let v: Value = serde_json::from_slice(&out).unwrap();
        let rooms_json: Vec<Value> = rooms.as_slice().iter().map(|r| Value::from(*r)).collect();
        let port_json = port.map(Value::from).unwrap_or(Value::Null);
        match &rooms {
            Rooms::Single(r) => {
                prop_assert_eq!(&v["bootstrap_room"], &Value::from(*r));
                prop_assert_eq!(&v["bootstrap_host"], &Value::from(host.clone()));
                prop_assert_eq!(&v["bootstrap_port"], &port_json);
            }
            Rooms::Batch(rs) => {
                prop_assert_eq!(&v["bootstrap_room"], &Value::Array(rooms_json));
                prop_assert_eq!(&v["bootstrap_host"], &Value::Array(vec![Value::from(host.clone()); rs.len()]));
                prop_assert_eq!(&v["bootstrap_port"], &Value::Array(vec![port_json; rs.len()]));
            }
        }
        let want_routed = if decode { dp.decode } else { dp.prefill };
        prop_assert_eq!(v.get("routed_dp_rank").cloned(), want_routed.map(Value::from));
        let want_disagg = if decode { dp.prefill } else { None };
        prop_assert_eq!(v.get("disagg_prefill_dp_rank").cloned(), want_disagg.map(Value::from));
        // Everything else the client sent is unchanged.
        let input: Value = serde_json::from_str(&body).unwrap();
        let mut rest_in = input.as_object().unwrap().clone();
        let mut rest_out = v.as_object().unwrap().clone();
        for k in sglang::CLIENT_FORBIDDEN_KEYS {
            rest_in.remove(*k);
            rest_out.remove(*k);
        }
        prop_assert_eq!(rest_in, rest_out);
    }

    #[test]
    fn vllm_legs_never_forward_client_handoff_keys(
        body in arb_object_body(), route_i in 0usize..7, with_tag in any::<bool>()
    ) {
        let route = Route::ALL[route_i];
        let top = scan_object(body.as_bytes()).unwrap();
        let tag = with_tag.then_some(vllm::NIXL_PREFILL_TAG.as_bytes());
        for out in [
            vllm::prefill_leg_body(route, body.as_bytes(), &top, tag),
            vllm::decode_leg_body(body.as_bytes(), &top, tag),
        ] {
            let v: Value = serde_json::from_slice(&out).unwrap();
            for k in sglang::CLIENT_FORBIDDEN_KEYS {
                if *k == vllm::KV_TRANSFER_PARAMS && with_tag {
                    prop_assert_eq!(&v[*k], &serde_json::from_str::<Value>(vllm::NIXL_PREFILL_TAG).unwrap());
                } else {
                    prop_assert!(v.get(*k).is_none(), "{} leaked", k);
                }
            }
        }
    }

    #[test]
    fn splitter_events_do_not_depend_on_chunking(
        stream in arb_sse_stream(), cuts in prop::collection::vec(any::<usize>(), 0..8)
    ) {
        let whole = split(std::slice::from_ref(&stream));
        let pieces = split(&chunked(&stream, &cuts));
        prop_assert_eq!(&whole, &pieces);
        let mut joined: Vec<u8> = whole.0.concat();
        joined.extend(whole.1.unwrap_or_default());
        prop_assert_eq!(joined, stream);
    }

    #[test]
    fn done_detection_does_not_depend_on_chunking(
        stream in arb_sse_stream(), cuts in prop::collection::vec(any::<usize>(), 0..8)
    ) {
        prop_assert_eq!(detect(std::slice::from_ref(&stream)), detect(&chunked(&stream, &cuts)));
    }

    #[test]
    fn done_detector_agrees_with_splitter_and_is_done_event(stream in arb_sse_stream()) {
        // A trailing byte settles a final CR, which the splitter otherwise holds back.
        let mut settled = stream.clone();
        settled.push(b'x');
        let (events, _) = split(&[settled]);
        let want = events.iter().any(|e| sse::is_done_event(e));
        prop_assert_eq!(detect(&[stream]), want);
    }

    #[test]
    fn hostile_bytes_never_panic(bytes in prop_oneof![json_ish(), prop::collection::vec(any::<u8>(), 0..64)]) {
        if let Ok(top) = scan_object(&bytes) {
            for route in Route::ALL {
                let _ = classify(route, &bytes, &top);
                let _ = vllm::prefill_leg_body(route, &bytes, &top, None);
                let _ = moriio::check_request(route, &bytes, &top);
            }
        }
        let _ = vllm::harvest_kv_transfer_params(&bytes);
        let _ = moriio::validate_handoff(&bytes, &moriio::HandoffExpectation {
            transfer_id: "xfer-1",
            told_ports: Some((6301, 61005)),
        });
        let _ = pdgate_filters::errors::upstream_error_message(&bytes);
        let _ = pdgate_filters::errors::sse_error_event(500, &bytes);
        let _ = sse::event_data(&bytes);
        let p = PrefillLogprobs::Single(b"[1]".to_vec());
        let _ = logprobs::merge_json(&bytes, &p);
        let _ = logprobs::merge_event(&bytes, &p);
        let _ = logprobs::prefill_input_logprobs(&bytes, false);
        let _ = logprobs::prefill_input_logprobs(&bytes, true);
    }

    #[test]
    fn merge_json_output_is_valid_json(
        pre in prop::collection::vec(arb_json(), 0..3),
        dec in prop::collection::vec(arb_json(), 0..3),
        other in arb_object_body(),
    ) {
        let p = serde_json::to_vec(&Value::Array(pre.clone())).unwrap();
        let d = serde_json::to_vec(&Value::Array(dec.clone())).unwrap();
        let body = format!(
            r#"{{"x":{},"meta_info":{{"input_token_logprobs":{}}}}}"#,
            other,
            String::from_utf8(d).unwrap()
        );
        let out = logprobs::merge_json(body.as_bytes(), &PrefillLogprobs::Single(p)).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        let mut want = pre;
        want.extend(dec);
        prop_assert_eq!(&v["meta_info"]["input_token_logprobs"], &Value::Array(want));
        prop_assert_eq!(&v["x"], &serde_json::from_str::<Value>(&other).unwrap());
    }

    #[test]
    fn chunked_framing_round_trips_under_any_split(
        payloads in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..40), 0..8),
        ext in any::<bool>(),
        cuts in prop::collection::vec(1usize..24, 1..8),
        tail in prop::collection::vec(any::<u8>(), 0..8),
    ) {
        let mut wire = Vec::new();
        for p in &payloads {
            wire.extend_from_slice(format!("{:x}", p.len()).as_bytes());
            if ext {
                wire.extend_from_slice(b";x=\"y\"");
            }
            wire.extend_from_slice(b"\r\n");
            wire.extend_from_slice(p);
            wire.extend_from_slice(b"\r\n");
        }
        wire.extend_from_slice(b"0\r\nTrailer: t\r\n\r\n");
        let body_len = wire.len();
        wire.extend_from_slice(&tail);
        let mut d = BodyDecoder::new(Framing::Chunked);
        let mut buf = bytes::BytesMut::new();
        let mut out = Vec::new();
        let (mut at, mut i) = (0, 0);
        while at < wire.len() && !d.is_done() {
            let end = (at + cuts[i % cuts.len()]).min(wire.len());
            buf.extend_from_slice(&wire[at..end]);
            out.extend_from_slice(&d.decode(&mut buf).unwrap());
            at = end;
            i += 1;
        }
        prop_assert!(d.is_done());
        prop_assert_eq!(out, payloads.concat());
        // What is left is exactly what followed the body.
        prop_assert_eq!(&buf[..], &wire[body_len..at]);
    }
}
