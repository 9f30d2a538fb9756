//! SGLang PD prompt logprobs: the decode engine never computes the prompt rows, the prefill
//! engine does, so the gateway puts the prefill's `meta_info.input_token_logprobs` in front of
//! the decode's (as SGLang's mini_lb and SMG do). Everything else in the decode body stays
//! byte-identical and in order: the merge splices the one array.

use std::ops::Range;

use crate::body::{is_valid_json, scan_object, TopLevel};
use crate::fields;
use crate::sse::{self, SseSplitter};
use crate::value::{self, Kind};

/// The prefill leg's prompt logprobs, as raw JSON array text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrefillLogprobs {
    /// One request: its `meta_info.input_token_logprobs` array.
    Single(Vec<u8>),
    /// A batched `/generate` (top-level JSON array): one entry per item, `None` where the item
    /// has no array.
    Batch(Vec<Option<Vec<u8>>>),
}

/// Reads the prompt logprobs from a prefill leg response: a JSON body, or an SSE stream (the
/// first data event whose JSON has `meta_info.input_token_logprobs`). A top-level JSON array
/// (batched `/generate`) gives per-item arrays. `None` when there is nothing to merge.
pub fn prefill_input_logprobs(prefill_body: &[u8], is_sse: bool) -> Option<PrefillLogprobs> {
    if is_sse {
        let mut splitter = SseSplitter::new();
        let mut events = Vec::new();
        splitter.push(prefill_body, &mut events);
        events.extend(splitter.finish());
        return events.iter().find_map(|event| {
            let data = sse::event_data(event)?;
            let data = data.trim_ascii();
            let (_, range) = input_logprobs_range(data)?;
            Some(PrefillLogprobs::Single(data[range].to_vec()))
        });
    }
    let body = prefill_body.trim_ascii();
    match value::kind(body)? {
        Kind::Object => {
            let (_, range) = input_logprobs_range(body)?;
            Some(PrefillLogprobs::Single(body[range].to_vec()))
        }
        Kind::Array if is_valid_json(body) => {
            let items = value::element_ranges(body)?
                .into_iter()
                .map(|item| {
                    let obj = &body[item];
                    input_logprobs_range(obj).map(|(_, r)| obj[r].to_vec())
                })
                .collect();
            Some(PrefillLogprobs::Batch(items))
        }
        _ => None,
    }
}

/// Non-streaming merge: the decode body with `meta_info.input_token_logprobs = prefill ++ decode`.
/// `None` when it cannot merge (the caller then returns the decode body unchanged): a body that
/// is not JSON, no `meta_info`, a decode `input_token_logprobs` that is not an array, or shapes
/// that do not match. A batched `/generate` (top-level arrays of equal length on both sides)
/// merges item by item; items without arrays stay as they are.
pub fn merge_json(decode_body: &[u8], prefill: &PrefillLogprobs) -> Option<Vec<u8>> {
    let body = decode_body;
    let trimmed = trim_json_whitespace(body);
    let offset = trimmed.as_ptr() as usize - body.as_ptr() as usize;
    match (value::kind(trimmed)?, prefill) {
        (Kind::Object, PrefillLogprobs::Single(p)) => {
            let (_, r) = input_logprobs_range(trimmed)?;
            let r = r.start + offset..r.end + offset;
            let mut out = Vec::with_capacity(body.len() + p.len() + 1);
            out.extend_from_slice(&body[..r.start]);
            concat_arrays(&mut out, p, &body[r.clone()]);
            out.extend_from_slice(&body[r.end..]);
            Some(out)
        }
        (Kind::Array, PrefillLogprobs::Batch(ps)) if is_valid_json(trimmed) => {
            let items = value::element_ranges(trimmed)?;
            if items.len() != ps.len() {
                return None;
            }
            let extra: usize = ps.iter().flatten().map(|p| p.len() + 1).sum();
            let mut out = Vec::with_capacity(body.len() + extra);
            let mut copied = 0;
            let mut merged = false;
            for (item, p) in items.into_iter().zip(ps) {
                let (Some(p), obj) = (p, &trimmed[item.clone()]) else {
                    continue;
                };
                let Some((_, r)) = input_logprobs_range(obj) else {
                    continue;
                };
                let start = offset + item.start + r.start;
                let end = offset + item.start + r.end;
                out.extend_from_slice(&body[copied..start]);
                concat_arrays(&mut out, p, &body[start..end]);
                copied = end;
                merged = true;
            }
            if !merged {
                return None;
            }
            out.extend_from_slice(&body[copied..]);
            Some(out)
        }
        _ => None,
    }
}

/// One SSE event of the decode stream: when its data is a JSON object with a
/// `meta_info.input_token_logprobs` array, the event re-emitted as `data: <json>\n\n` with the
/// prefill array prepended (for a batch, the item named by the event's `index`). `[DONE]`,
/// comments and anything else → `None` (the caller forwards the event unchanged).
pub fn merge_event(event: &[u8], prefill: &PrefillLogprobs) -> Option<Vec<u8>> {
    let data = sse::event_data(event)?;
    let data = data.trim_ascii();
    if data == sse::DONE {
        return None;
    }
    let (top, r) = input_logprobs_range(data)?;
    let p = match prefill {
        PrefillLogprobs::Single(p) => p,
        PrefillLogprobs::Batch(ps) => {
            let index = top.get(data, fields::INDEX).and_then(value::as_u64)?;
            ps.get(usize::try_from(index).ok()?)?.as_ref()?
        }
    };
    let mut json = Vec::with_capacity(data.len() + p.len() + 1);
    json.extend_from_slice(&data[..r.start]);
    concat_arrays(&mut json, p, &data[r.clone()]);
    json.extend_from_slice(&data[r.end..]);
    // Multi-line data was joined with '\n'; the re-emitted event stays on one `data:` line.
    Some(sse::data_event(&json))
}

/// Scans a JSON object and finds its `meta_info.input_token_logprobs` array; the range is
/// relative to `obj`. `None` unless both are there and the value is an array.
fn input_logprobs_range(obj: &[u8]) -> Option<(TopLevel, Range<usize>)> {
    let top = scan_object(obj).ok()?;
    let entry = top
        .entries()
        .iter()
        .rev()
        .find(|e| e.key == fields::META_INFO)?;
    let meta_range = entry.value.clone();
    let meta = obj.get(meta_range.clone())?;
    let inner = scan_object(meta).ok()?;
    let itl = inner
        .entries()
        .iter()
        .rev()
        .find(|e| e.key == fields::INPUT_TOKEN_LOGPROBS)?;
    let raw = meta.get(itl.value.clone())?;
    if value::kind(raw) != Some(Kind::Array) {
        return None;
    }
    let start = meta_range.start + itl.value.start;
    Some((top, start..start + raw.len()))
}

/// `bytes` without the JSON whitespace (space, tab, LF, CR) around it. Not `trim_ascii`, which
/// also strips form feeds: a body wrapped in them is not JSON, and merging it would hand the
/// client invalid JSON as if it were merged output (found by the `logprobs` fuzz target).
fn trim_json_whitespace(bytes: &[u8]) -> &[u8] {
    let is_ws = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    let start = bytes.iter().position(|b| !is_ws(b)).unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !is_ws(b))
        .map_or(start, |e| e + 1);
    &bytes[start..end]
}

/// Appends `a ++ b` for two JSON array texts, handling empty arrays and inner whitespace.
fn concat_arrays(out: &mut Vec<u8>, a: &[u8], b: &[u8]) {
    let a = array_inner(a);
    let b = array_inner(b);
    out.push(b'[');
    out.extend_from_slice(a);
    if !a.is_empty() && !b.is_empty() {
        out.push(b',');
    }
    out.extend_from_slice(b);
    out.push(b']');
}

/// The elements text of a JSON array (between the brackets, trimmed).
fn array_inner(arr: &[u8]) -> &[u8] {
    let arr = arr.trim_ascii();
    let inner = arr
        .strip_prefix(b"[")
        .and_then(|a| a.strip_suffix(b"]"))
        .unwrap_or(b"");
    inner.trim_ascii()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn single(arr: &str) -> PrefillLogprobs {
        PrefillLogprobs::Single(arr.as_bytes().to_vec())
    }

    #[test]
    fn reads_prefill_array_from_json_body() {
        let p = prefill_input_logprobs(
            br#"{"text":"P","meta_info":{"id":"a","input_token_logprobs":[[-1,1,null]]}}"#,
            false,
        );
        assert_eq!(p, Some(single("[[-1,1,null]]")));
    }

    #[test]
    fn prefill_without_array_gives_none() {
        for body in [
            &br#"{"meta_info":{}}"#[..],
            br#"{"meta_info":{"input_token_logprobs":null}}"#,
            br#"{"text":"x"}"#,
            br#"{"meta_info":[1]}"#,
            b"not json",
            b"",
            b"5",
        ] {
            assert_eq!(prefill_input_logprobs(body, false), None);
        }
    }

    #[test]
    fn reads_prefill_array_from_first_sse_event_that_has_it() {
        let stream = b"data: {\"text\":\"\"}\n\n\
            data: {\"meta_info\":{\"input_token_logprobs\":[[-1,1,null]]}}\n\n\
            data: {\"meta_info\":{\"input_token_logprobs\":[[-9,9,null]]}}\n\n\
            data: [DONE]\n\n";
        assert_eq!(
            prefill_input_logprobs(stream, true),
            Some(single("[[-1,1,null]]"))
        );
        assert_eq!(prefill_input_logprobs(b"data: [DONE]\n\n", true), None);
    }

    #[test]
    fn reads_batched_prefill_arrays_per_item() {
        let body = br#"[{"meta_info":{"input_token_logprobs":[[-1,1,null]]}},{"meta_info":{}}]"#;
        assert_eq!(
            prefill_input_logprobs(body, false),
            Some(PrefillLogprobs::Batch(vec![
                Some(b"[[-1,1,null]]".to_vec()),
                None
            ]))
        );
    }

    #[test]
    fn merge_prepends_prefill_entries() {
        let decode = br#"{"text":"x","meta_info":{"input_token_logprobs":[[-2,2,null]]}}"#;
        let out = merge_json(decode, &single("[[-1,1,null]]")).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v["meta_info"]["input_token_logprobs"],
            json!([[-1, 1, null], [-2, 2, null]])
        );
    }

    #[test]
    fn merge_keeps_everything_else_byte_identical() {
        let decode = br#"{"text":"x" , "meta_info":{"id":"a", "input_token_logprobs": [] ,"output_token_logprobs":[[-0.5,3,null]]},"z":1.50}"#;
        let out = merge_json(decode, &single("[[null,1,null],[-1.25,2,null]]")).unwrap();
        assert_eq!(
            out,
            br#"{"text":"x" , "meta_info":{"id":"a", "input_token_logprobs": [[null,1,null],[-1.25,2,null]] ,"output_token_logprobs":[[-0.5,3,null]]},"z":1.50}"#
        );
    }

    #[test]
    fn merge_handles_empty_arrays_on_either_side() {
        let d = br#"{"meta_info":{"input_token_logprobs":[ ]}}"#;
        assert_eq!(
            merge_json(d, &single("[ ]")).unwrap(),
            br#"{"meta_info":{"input_token_logprobs":[]}}"#
        );
        let d = br#"{"meta_info":{"input_token_logprobs":[1]}}"#;
        assert_eq!(
            merge_json(d, &single("[]")).unwrap(),
            br#"{"meta_info":{"input_token_logprobs":[1]}}"#
        );
    }

    #[test]
    fn merge_keeps_surrounding_whitespace_of_the_body() {
        let d = b"\n {\"meta_info\":{\"input_token_logprobs\":[2]}} \n";
        assert_eq!(
            merge_json(d, &single("[1]")).unwrap(),
            b"\n {\"meta_info\":{\"input_token_logprobs\":[1,2]}} \n"
        );
    }

    #[test]
    fn merge_refuses_what_it_cannot_merge() {
        let p = single("[1]");
        for d in [
            &br#"{"meta_info":{"input_token_logprobs":null}}"#[..],
            br#"{"meta_info":{"input_token_logprobs":{}}}"#,
            br#"{"text":"x"}"#,
            br#"{"meta_info":"x"}"#,
            b"not json",
            br#"{"meta_info":{"input_token_logprobs":[1]}"#,
            br#"[{"meta_info":{"input_token_logprobs":[1]}}]"#,
        ] {
            assert_eq!(merge_json(d, &p), None, "{}", String::from_utf8_lossy(d));
        }
    }

    #[test]
    fn merge_json_refuses_a_body_wrapped_in_form_feeds() {
        let p = single("[1]");
        for d in [
            &b"{\"meta_info\":{\"input_token_logprobs\":[2]}}\x0c"[..],
            b"\x0c{\"meta_info\":{\"input_token_logprobs\":[2]}}",
            b"\x0c[{\"meta_info\":{\"input_token_logprobs\":[2]}}]",
        ] {
            assert!(serde_json::from_slice::<Value>(d).is_err());
            let batch = PrefillLogprobs::Batch(vec![Some(b"[1]".to_vec())]);
            assert_eq!(merge_json(d, &p), None, "{}", String::from_utf8_lossy(d));
            assert_eq!(
                merge_json(d, &batch),
                None,
                "{}",
                String::from_utf8_lossy(d)
            );
        }
    }

    #[test]
    fn batched_generate_merges_element_wise() {
        let d = br#"[{"meta_info":{"input_token_logprobs":[2]}}, {"meta_info":{"input_token_logprobs":[4]}},{"x":1}]"#;
        let p = PrefillLogprobs::Batch(vec![Some(b"[1]".to_vec()), None, Some(b"[5]".to_vec())]);
        assert_eq!(
            merge_json(d, &p).unwrap(),
            br#"[{"meta_info":{"input_token_logprobs":[1,2]}}, {"meta_info":{"input_token_logprobs":[4]}},{"x":1}]"#
        );
    }

    #[test]
    fn batched_merge_needs_equal_lengths() {
        let d = br#"[{"meta_info":{"input_token_logprobs":[2]}}]"#;
        let p = PrefillLogprobs::Batch(vec![Some(b"[1]".to_vec()), None]);
        assert_eq!(merge_json(d, &p), None);
        let single_d = br#"{"meta_info":{"input_token_logprobs":[2]}}"#;
        assert_eq!(merge_json(single_d, &p), None);
    }

    #[test]
    fn merge_event_prepends_and_reemits_one_data_line() {
        let ev = b"data: {\"text\":\"a\",\"meta_info\":{\"input_token_logprobs\":[[-2,2,null]]}}\r\n\r\n";
        let out = merge_event(ev, &single("[[-1,1,null]]")).unwrap();
        assert_eq!(
            out,
            b"data: {\"text\":\"a\",\"meta_info\":{\"input_token_logprobs\":[[-1,1,null],[-2,2,null]]}}\n\n"
        );
    }

    #[test]
    fn merge_event_joins_multi_line_data() {
        let ev = b"data: {\"meta_info\":\ndata: {\"input_token_logprobs\":[2]}}\n\n";
        let out = merge_event(ev, &single("[1]")).unwrap();
        assert_eq!(
            out,
            b"data: {\"meta_info\": {\"input_token_logprobs\":[1,2]}}\n\n"
        );
    }

    #[test]
    fn merge_event_leaves_other_events_alone() {
        let p = single("[1]");
        assert_eq!(merge_event(b"data: [DONE]\n\n", &p), None);
        assert_eq!(merge_event(b": ping\n\n", &p), None);
        assert_eq!(merge_event(b"data: not json\n\n", &p), None);
        assert_eq!(
            merge_event(b"data: {\"choices\":[]}\n\n", &p),
            None,
            "OpenAI chunks have no meta_info"
        );
    }

    #[test]
    fn merge_event_uses_index_for_batches() {
        let p = PrefillLogprobs::Batch(vec![Some(b"[1]".to_vec()), Some(b"[5]".to_vec())]);
        let ev = b"data: {\"index\":1,\"meta_info\":{\"input_token_logprobs\":[6]}}\n\n";
        assert_eq!(
            merge_event(ev, &p).unwrap(),
            b"data: {\"index\":1,\"meta_info\":{\"input_token_logprobs\":[5,6]}}\n\n"
        );
        let no_index = b"data: {\"meta_info\":{\"input_token_logprobs\":[6]}}\n\n";
        assert_eq!(merge_event(no_index, &p), None);
        let out_of_range = b"data: {\"index\":7,\"meta_info\":{\"input_token_logprobs\":[6]}}\n\n";
        assert_eq!(merge_event(out_of_range, &p), None);
    }
}
