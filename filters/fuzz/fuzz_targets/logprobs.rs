//! Logprob merge: `prefill_input_logprobs` (JSON and SSE), `merge_json` (single and batched) and
//! `merge_event`.
//!
//! Input: 3 control bytes, then bytes split in two at c1c2: a prefill body and a decode body.
//! * c0: bit0 prefill is SSE, bit1 wrap the decode body as a `data:` event, bit2 batched default.
//!
//! Properties: the prefill arrays read are valid JSON arrays equal to the response's
//! `meta_info.input_token_logprobs` (per item for a batch). `merge_json` returns `Some` exactly
//! when the decode body is a JSON object (or a batch of the prefill's length) with that array,
//! and then the output is valid JSON equal to the decode body with `prefill ++ decode` in place
//! of the array and nothing else changed. `merge_event` re-emits one `data:` line whose JSON is
//! the event's data with the merged array.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdgate_filters::logprobs::{merge_event, merge_json, prefill_input_logprobs, PrefillLogprobs};
use pdgate_filters::sse::{event_data, SseSplitter};
use pdgate_filters_fuzz::{assert_one_data_line_event, parse, split_control};
use serde_json::Value;

/// `meta_info.input_token_logprobs` of a parsed object, when it is an array.
fn itl(v: &Value) -> Option<&Vec<Value>> {
    v.get("meta_info")?.get("input_token_logprobs")?.as_array()
}

/// `v` with its array replaced by `p ++ array`; `None` when `v` has no array.
fn merged(v: &Value, p: &[u8]) -> Option<Value> {
    let d = itl(v)?;
    let mut all = parse(p)
        .expect("prefill array")
        .as_array()
        .expect("array")
        .clone();
    all.extend(d.iter().cloned());
    let mut out = v.clone();
    out["meta_info"]["input_token_logprobs"] = Value::Array(all);
    Some(out)
}

fuzz_target!(|data: &[u8]| {
    let (c, rest) = split_control::<3>(data);
    let at = usize::from(u16::from_be_bytes([c[1], c[2]])).min(rest.len());
    let (prefill_body, decode_body) = rest.split_at(at);
    let is_sse = c[0] & 1 != 0;

    // Reading the prefill's arrays.
    let read = prefill_input_logprobs(prefill_body, is_sse);
    match &read {
        Some(PrefillLogprobs::Single(p)) => {
            let p_v = parse(p).expect("prefill array is JSON");
            assert!(p_v.is_array());
            if !is_sse {
                // Surrounding ASCII whitespace is tolerated on the prefill side.
                let v = parse(prefill_body.trim_ascii()).expect("prefill body was JSON");
                assert_eq!(itl(&v), p_v.as_array(), "not the body's array");
            }
        }
        Some(PrefillLogprobs::Batch(items)) => {
            assert!(!is_sse);
            let v = parse(prefill_body.trim_ascii()).expect("batched prefill was JSON");
            let arr = v.as_array().expect("batch is an array");
            assert_eq!(arr.len(), items.len());
            for (item, p) in arr.iter().zip(items) {
                let p_v = p.as_ref().map(|p| parse(p).expect("item array is JSON"));
                assert_eq!(p_v.as_ref().and_then(Value::as_array), itl(item));
            }
        }
        None => {
            if !is_sse {
                if let Some(v) = parse(prefill_body.trim_ascii()) {
                    assert!(v.is_array() || itl(&v).is_none(), "missed the array");
                }
            }
        }
    }
    let prefill = read.unwrap_or_else(|| {
        if c[0] & 4 != 0 {
            PrefillLogprobs::Batch(vec![Some(b"[[-1.5,7,null]]".to_vec()), None])
        } else {
            PrefillLogprobs::Single(b"[ [-0.25, 3, \"t\"] , [null,1,null] ]".to_vec())
        }
    });

    // Non-streaming merge.
    let out = merge_json(decode_body, &prefill);
    let decoded = parse(decode_body);
    match (&prefill, &out) {
        (PrefillLogprobs::Single(p), Some(out)) => {
            let d = decoded.as_ref().expect("merged a body that is not JSON");
            let want = merged(d, p).expect("merged a body without the array");
            assert_eq!(
                parse(out).as_ref(),
                Some(&want),
                "merge_json changed something else"
            );
        }
        (PrefillLogprobs::Single(_), None) => {
            assert!(
                decoded.as_ref().is_none_or(|d| itl(d).is_none()),
                "merge_json refused a mergeable body"
            );
        }
        (PrefillLogprobs::Batch(ps), Some(out)) => {
            let d = decoded.as_ref().expect("merged a batch that is not JSON");
            let items = d.as_array().expect("merged a batch that is not an array");
            assert_eq!(items.len(), ps.len());
            let want: Vec<Value> = items
                .iter()
                .zip(ps)
                .map(|(item, p)| {
                    p.as_ref()
                        .and_then(|p| merged(item, p))
                        .unwrap_or_else(|| item.clone())
                })
                .collect();
            assert_eq!(parse(out), Some(Value::Array(want)), "batched merge_json");
        }
        (PrefillLogprobs::Batch(_), None) => {}
    }

    // Streaming merge, on the decode bytes as (or inside) one event.
    let event = if c[0] & 2 != 0 {
        let mut e = b"data: ".to_vec();
        e.extend_from_slice(decode_body);
        e.extend_from_slice(b"\n\n");
        e
    } else {
        decode_body.to_vec()
    };
    if let Some(out) = merge_event(&event, &prefill) {
        let inner = assert_one_data_line_event(&out);
        let v = parse(inner).expect("re-emitted event data is JSON");
        let mut s = SseSplitter::new();
        let mut events = Vec::new();
        s.push(&out, &mut events);
        assert_eq!(
            events,
            std::slice::from_ref(&out),
            "re-emitted event is not one event"
        );
        let data = event_data(&event).expect("merged an event without data");
        let d = parse(data.trim_ascii()).expect("merged event data that is not JSON");
        let p = match &prefill {
            PrefillLogprobs::Single(p) => p.clone(),
            PrefillLogprobs::Batch(ps) => {
                let i = d["index"].as_u64().expect("batched event without index") as usize;
                ps[i].clone().expect("merged an item without prefill array")
            }
        };
        assert_eq!(
            Some(v),
            merged(&d, &p),
            "merge_event changed something else"
        );
    }
});
