//! n>1 over SGLang's HTTP rendezvous, one dispatch per sample: which requests fan out, what each
//! single-sample request carries, and how the samples' answers merge back into one.
//!
//! Why: SGLang's tokenizer manager runs the `n` samples of prompt `i` (and a zero-output warm-up)
//! as copies of that prompt's request, so they all carry its one `bootstrap_room`; a room
//! identifies one transfer, and the extra samples wait out the engine's timeout. This holds for
//! `/v1/completions` with `n>1` (one prompt or a list) and `/generate` with `sampling_params.n >
//! 1` (one input or a batch). docs/architecture.md ("HTTP fan-out") cites the source lines.
//!
//! Each sample `j` is the client's body with `n: 1` (`sampling_params.n: 1`), its own rooms, and
//! a client `rid` suffixed `-<j>` (a rid names one request on an engine). Its answers are merged
//! in SGLang's order: prompt `p`'s sample `j` is choice `p·n + j`; usage counts the prompt once
//! (the largest `prompt_tokens`, sample 0's `prompt_tokens_details`) and sums completions. All
//! rewrites splice the engines' bytes: what the gateway does not touch stays as sent.

use std::ops::Range;

use crate::body::{rewrite, scan_object, TopLevel};
use crate::classify::RequestFacts;
use crate::fields;
use crate::json;
use crate::route::Route;
use crate::sse;
use crate::value::{self, Kind};

const CHOICES: &str = "choices";
const USAGE: &str = "usage";
const PROMPT_TOKENS: &str = "prompt_tokens";
const COMPLETION_TOKENS: &str = "completion_tokens";
const TOTAL_TOKENS: &str = "total_tokens";

/// Whether an SGLang HTTP request runs as one dispatch per sample: `n > 1` on
/// `/v1/completions` or `/generate`. Chat `n>1` keeps its per-sample room arrays (one dispatch).
pub fn fans_out(route: Route, facts: &RequestFacts) -> bool {
    facts.n > 1
        && matches!(
            route,
            Route::Completions | Route::Generate | Route::ChatCompletions
        )
}

/// The top-level entries sample `sample`'s request replaces in the client's body: `n: 1`
/// (`/generate`: `sampling_params` with `n: 1`) and a string `rid` (or each string of a `rid`
/// list) suffixed `-<sample>`.
pub fn sample_fields(
    route: Route,
    body: &[u8],
    top: &TopLevel,
    sample: u64,
) -> Vec<(&'static str, Vec<u8>)> {
    let mut set = Vec::with_capacity(2);
    match route {
        Route::Generate => {
            if let Some(sp) = top.get_non_null(body, fields::SAMPLING_PARAMS) {
                if let Ok(sp_top) = scan_object(sp) {
                    set.push((
                        fields::SAMPLING_PARAMS,
                        rewrite(sp, &sp_top, &[], &[(fields::N, b"1")]),
                    ));
                }
            }
        }
        _ => set.push((fields::N, b"1".to_vec())),
    }
    if let Some(rid) = top.get_non_null(body, fields::RID) {
        let suffixed = match value::kind(rid) {
            Some(Kind::String) => value::as_str(rid).map(|r| suffixed_string(&r, sample)),
            Some(Kind::Array) => suffixed_list(rid, sample),
            _ => None,
        };
        if let Some(v) = suffixed {
            set.push((fields::RID, v));
        }
    }
    set
}

fn suffixed_string(s: &str, sample: u64) -> Vec<u8> {
    json::string(&format!("{s}-{sample}"))
}

/// A list of request ids with each string suffixed (other elements kept as they are).
fn suffixed_list(raw: &[u8], sample: u64) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(raw.len() + 8);
    out.push(b'[');
    let mut first = true;
    let walked = value::for_each_element(raw, |el| {
        if !first {
            out.push(b',');
        }
        first = false;
        match value::as_str(el) {
            Some(s) => out.extend_from_slice(&suffixed_string(&s, sample)),
            None => out.extend_from_slice(el),
        }
        true
    });
    out.push(b']');
    walked.then_some(out)
}

/// The index of prompt `item`'s sample `sample` in the merged answer (SGLang's prompt-major
/// order for `n` samples per prompt).
pub fn merged_index(item: u64, n: u64, sample: u64) -> u64 {
    item.saturating_mul(n).saturating_add(sample)
}

/// Copies `body` with each range replaced by its bytes (ranges sorted, not overlapping).
fn splice(body: &[u8], mut edits: Vec<(Range<usize>, Vec<u8>)>) -> Vec<u8> {
    edits.sort_by_key(|(r, _)| r.start);
    let extra: usize = edits.iter().map(|(_, v)| v.len()).sum();
    let mut out = Vec::with_capacity(body.len() + extra);
    let mut at = 0;
    for (r, v) in edits {
        out.extend_from_slice(&body[at..r.start]);
        out.extend_from_slice(&v);
        at = r.end;
    }
    out.extend_from_slice(&body[at..]);
    out
}

/// The range of the value of `key` in a scanned object (last duplicate), relative to it.
fn member_range(top: &TopLevel, key: &str) -> Option<Range<usize>> {
    top.entries()
        .iter()
        .rev()
        .find(|e| e.key == key)
        .map(|e| e.value.clone())
}

/// The choices of one answer (`choices` elements as byte ranges of `body`), each with its index.
fn choices(body: &[u8], top: &TopLevel) -> Option<Vec<(u64, Range<usize>)>> {
    let r = member_range(top, CHOICES)?;
    let raw = &body[r.clone()];
    value::element_ranges(raw)?
        .into_iter()
        .map(|el| {
            let abs = r.start + el.start..r.start + el.end;
            let index = value::object_get(&body[abs.clone()], fields::INDEX)
                .and_then(value::as_u64)
                .unwrap_or(0);
            Some((index, abs))
        })
        .collect()
}

/// One choice object with its `index` value replaced (added when it has none).
fn reindexed(choice: &[u8], index: u64) -> Option<Vec<u8>> {
    let top = scan_object(choice).ok()?;
    let new = json::u64_text(index);
    Some(match member_range(&top, fields::INDEX) {
        Some(r) => splice(choice, vec![(r, new)]),
        None => rewrite(choice, &top, &[], &[(fields::INDEX, &new)]),
    })
}

/// An OpenAI chunk or answer with every `choices[k].index` mapped from sample `sample`'s
/// numbering to the merged one; `None` when it is not such a JSON object.
fn reindex_choices(data: &[u8], n: u64, sample: u64) -> Option<Vec<u8>> {
    let top = scan_object(data).ok()?;
    let edits = choices(data, &top)?
        .into_iter()
        .map(|(i, r)| {
            let obj = &data[r.clone()];
            let ctop = scan_object(obj).ok()?;
            let ir = member_range(&ctop, fields::INDEX)?;
            let abs = r.start + ir.start..r.start + ir.end;
            Some((abs, json::u64_text(merged_index(i, n, sample))))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(splice(data, edits))
}

/// A usage object with `prompt_tokens` the largest of all, `completion_tokens` summed and
/// `total_tokens` their sum; every other field as in the first (sample 0: `prompt_tokens_details`
/// counts the cached prompt once). `None` when a usage is not an object with integer counts.
pub fn merge_usage(usages: &[&[u8]]) -> Option<Vec<u8>> {
    let first = *usages.first()?;
    let mut prompt = 0u64;
    let mut completion = 0u64;
    for u in usages {
        let get = |k| value::object_get(u, k).and_then(value::as_u64);
        prompt = prompt.max(get(PROMPT_TOKENS)?);
        completion = completion.saturating_add(get(COMPLETION_TOKENS)?);
    }
    let top = scan_object(first).ok()?;
    let mut edits = Vec::with_capacity(3);
    for (key, v) in [
        (PROMPT_TOKENS, prompt),
        (COMPLETION_TOKENS, completion),
        (TOTAL_TOKENS, prompt.saturating_add(completion)),
    ] {
        if let Some(r) = member_range(&top, key) {
            edits.push((r, json::u64_text(v)));
        }
    }
    Some(splice(first, edits))
}

/// The samples' whole (non-streamed) answers as one: `bodies[j]` is sample `j`'s. OpenAI routes:
/// sample 0's answer with every sample's choices, in merged order, and the merged usage.
/// `/generate`: a list of every sample's objects (a batched sample answers a list itself), in
/// merged order. `None` when an answer is not of its route's shape.
pub fn merge_answers(route: Route, bodies: &[&[u8]]) -> Option<Vec<u8>> {
    let n = bodies.len() as u64;
    let mut items: Vec<(u64, Vec<u8>)> = Vec::new();
    if route == Route::Generate {
        for (j, body) in bodies.iter().enumerate() {
            let body = body.trim_ascii();
            match value::kind(body)? {
                Kind::Object => items.push((merged_index(0, n, j as u64), body.to_vec())),
                Kind::Array => {
                    for (p, r) in value::element_ranges(body)?.into_iter().enumerate() {
                        items.push((merged_index(p as u64, n, j as u64), body[r].to_vec()));
                    }
                }
                _ => return None,
            }
        }
        items.sort_by_key(|(i, _)| *i);
        return Some(json_list(items.iter().map(|(_, b)| b.as_slice())));
    }
    let mut usages = Vec::with_capacity(bodies.len());
    for (j, body) in bodies.iter().enumerate() {
        let top = scan_object(body).ok()?;
        for (i, r) in choices(body, &top)? {
            let index = merged_index(i, n, j as u64);
            items.push((index, reindexed(&body[r], index)?));
        }
        if let Some(u) = top.get_non_null(body, USAGE) {
            usages.push(u);
        }
    }
    items.sort_by_key(|(i, _)| *i);
    let first = *bodies.first()?;
    let top = scan_object(first).ok()?;
    let mut edits = vec![(
        member_range(&top, CHOICES)?,
        json_list(items.iter().map(|(_, b)| b.as_slice())),
    )];
    if usages.len() == bodies.len() {
        if let (Some(r), Some(u)) = (member_range(&top, USAGE), merge_usage(&usages)) {
            edits.push((r, u));
        }
    }
    Some(splice(first, edits))
}

fn json_list<'a>(items: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = vec![b'['];
    for (k, item) in items.enumerate() {
        if k > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item);
    }
    out.push(b']');
    out
}

/// What one SSE event of sample `j`'s stream becomes in the merged stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SampleEvent {
    /// Forward these bytes (the event with its indices in merged numbering).
    Forward(Vec<u8>),
    /// The sample's `data: [DONE]`: the merged stream sends one, after every sample ended.
    Done,
    /// An OpenAI usage chunk (`choices: []` and a usage): sent once at the end, with the usage
    /// merged. `usage` is the range of its usage object in `chunk`.
    Usage { chunk: Vec<u8>, usage: Range<usize> },
}

/// One event of sample `sample`'s stream (of `n`), as the merged stream carries it: choice
/// indices (`/generate`: the object's `index`, added when a single-prompt sample has none)
/// renumbered; its `[DONE]` and its usage chunk held back. Events that are not JSON objects
/// (comments, error bodies without choices) are forwarded unchanged.
pub fn sample_event(route: Route, event: &[u8], n: u64, sample: u64) -> SampleEvent {
    let Some(data) = sse::event_data(event) else {
        return SampleEvent::Forward(event.to_vec());
    };
    let data = data.trim_ascii();
    if data == sse::DONE {
        return SampleEvent::Done;
    }
    let Ok(top) = scan_object(data) else {
        return SampleEvent::Forward(event.to_vec());
    };
    let json = if route == Route::Generate {
        let index = top
            .get(data, fields::INDEX)
            .and_then(value::as_u64)
            .unwrap_or(0);
        reindexed(data, merged_index(index, n, sample))
    } else {
        let empty_choices = top
            .get(data, CHOICES)
            .and_then(value::array_shape)
            .is_some_and(|s| s.len == 0);
        if empty_choices {
            if let Some(r) = member_range(&top, USAGE) {
                if &data[r.clone()] != b"null" {
                    return SampleEvent::Usage {
                        chunk: data.to_vec(),
                        usage: r,
                    };
                }
            }
        }
        if top.contains(CHOICES) {
            reindex_choices(data, n, sample)
        } else {
            None
        }
    };
    match json {
        Some(json) => SampleEvent::Forward(sse::data_event(&json)),
        None => SampleEvent::Forward(event.to_vec()),
    }
}

/// The usage chunk that ends a merged OpenAI stream: `chunk` (sample 0's) with its usage
/// replaced by the merge of every sample's (`None`: some usage could not be read).
pub fn usage_chunk(chunk: &[u8], usage: Range<usize>, usages: &[&[u8]]) -> Option<Vec<u8>> {
    let merged = merge_usage(usages)?;
    Some(sse::data_event(&splice(chunk, vec![(usage, merged)])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::classify;
    use serde_json::{json, Value};

    fn facts(route: Route, body: &str) -> RequestFacts {
        let top = scan_object(body.as_bytes()).unwrap();
        classify(route, body.as_bytes(), &top).unwrap()
    }

    #[test]
    fn completions_generate_and_chat_with_n_over_one_fan_out() {
        let c = r#"{"prompt":"a","n":3}"#;
        assert!(fans_out(Route::Completions, &facts(Route::Completions, c)));
        let batch = r#"{"prompt":["a","b"],"n":2}"#;
        assert!(fans_out(
            Route::Completions,
            &facts(Route::Completions, batch)
        ));
        let g = r#"{"text":"a","sampling_params":{"n":2}}"#;
        assert!(fans_out(Route::Generate, &facts(Route::Generate, g)));
        let chat = r#"{"messages":[{"role":"user","content":"x"}],"n":3}"#;
        assert!(fans_out(
            Route::ChatCompletions,
            &facts(Route::ChatCompletions, chat)
        ));
        let one = r#"{"prompt":"a","n":1}"#;
        assert!(!fans_out(
            Route::Completions,
            &facts(Route::Completions, one)
        ));
    }

    fn with_fields(route: Route, body: &str, sample: u64) -> Value {
        let top = scan_object(body.as_bytes()).unwrap();
        let set = sample_fields(route, body.as_bytes(), &top, sample);
        let set: Vec<(&str, &[u8])> = set.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        serde_json::from_slice(&rewrite(body.as_bytes(), &top, &[], &set)).unwrap()
    }

    #[test]
    fn each_sample_asks_for_one_and_gets_its_own_rid() {
        let v = with_fields(Route::Completions, r#"{"prompt":"a","n":3,"rid":"r"}"#, 2);
        assert_eq!(v, json!({"prompt":"a","n":1,"rid":"r-2"}));
        let v = with_fields(
            Route::Generate,
            r#"{"text":["a","b"],"sampling_params":{"temperature":0.5,"n":4},"rid":["x","y"]}"#,
            1,
        );
        assert_eq!(
            v,
            json!({"text":["a","b"],"sampling_params":{"temperature":0.5,"n":1},"rid":["x-1","y-1"]})
        );
        // No client rid: none is invented; chat-style bodies keep everything else byte for byte.
        let body = r#"{"prompt" : "a",  "n":2, "max_tokens": 3}"#;
        let top = scan_object(body.as_bytes()).unwrap();
        let set = sample_fields(Route::Completions, body.as_bytes(), &top, 0);
        assert_eq!(set, vec![("n", b"1".to_vec())]);
    }

    #[test]
    fn merged_order_is_prompt_major() {
        assert_eq!(merged_index(0, 3, 2), 2);
        assert_eq!(merged_index(1, 3, 0), 3);
        assert_eq!(merged_index(2, 2, 1), 5);
    }

    #[test]
    fn usage_counts_the_prompt_once_and_sums_completions() {
        let a = br#"{"prompt_tokens":7,"total_tokens":10,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}}"#;
        let b = br#"{"prompt_tokens":7,"total_tokens":12,"completion_tokens":5,"prompt_tokens_details":null}"#;
        let m: Value = serde_json::from_slice(&merge_usage(&[a, b]).unwrap()).unwrap();
        assert_eq!(
            m,
            json!({"prompt_tokens":7,"total_tokens":15,"completion_tokens":8,"prompt_tokens_details":{"cached_tokens":4}})
        );
        assert_eq!(merge_usage(&[b"null"]), None);
        assert_eq!(merge_usage(&[]), None);
    }

    #[test]
    fn openai_answers_merge_their_choices_and_usage() {
        let s0 = br#"{"id":"c-0","object":"text_completion","choices":[{"index":0,"text":"A","finish_reason":"length"}],"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}"#;
        let s1 = br#"{"id":"c-1","object":"text_completion","choices":[{"index":0,"text":"B","finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}"#;
        let m: Value =
            serde_json::from_slice(&merge_answers(Route::Completions, &[s0, s1]).unwrap()).unwrap();
        assert_eq!(m["id"], "c-0");
        assert_eq!(
            m["choices"],
            json!([{"index":0,"text":"A","finish_reason":"length"},{"index":1,"text":"B","finish_reason":"stop"}])
        );
        assert_eq!(
            m["usage"],
            json!({"prompt_tokens":4,"completion_tokens":3,"total_tokens":7})
        );
    }

    #[test]
    fn batched_samples_interleave_prompt_major() {
        // Two prompts, n = 2: sample j answers prompts 0 and 1 as its indices 0 and 1.
        let s = |j: u32| {
            format!(
                r#"{{"choices":[{{"index":0,"text":"p0s{j}"}},{{"index":1,"text":"p1s{j}"}}],"usage":{{"prompt_tokens":8,"completion_tokens":2,"total_tokens":10}}}}"#
            )
        };
        let (a, b) = (s(0), s(1));
        let m: Value = serde_json::from_slice(
            &merge_answers(Route::Completions, &[a.as_bytes(), b.as_bytes()]).unwrap(),
        )
        .unwrap();
        let texts: Vec<&str> = m["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["text"].as_str().unwrap())
            .collect();
        assert_eq!(texts, ["p0s0", "p0s1", "p1s0", "p1s1"]);
        let idx: Vec<u64> = m["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["index"].as_u64().unwrap())
            .collect();
        assert_eq!(idx, [0, 1, 2, 3]);
        assert_eq!(m["usage"]["prompt_tokens"], 8);
        assert_eq!(m["usage"]["completion_tokens"], 4);
    }

    #[test]
    fn generate_answers_become_one_list() {
        let s0 = br#"{"text":"a","meta_info":{"id":"r-0"}}"#;
        let s1 = br#" {"text":"b","meta_info":{"id":"r-1"}} "#;
        let m: Value =
            serde_json::from_slice(&merge_answers(Route::Generate, &[s0, s1]).unwrap()).unwrap();
        assert_eq!(
            m,
            json!([{"text":"a","meta_info":{"id":"r-0"}},{"text":"b","meta_info":{"id":"r-1"}}])
        );
        let batched = br#"[{"text":"p0"},{"text":"p1"}]"#;
        let other = br#"[{"text":"q0"},{"text":"q1"}]"#;
        let m: Value =
            serde_json::from_slice(&merge_answers(Route::Generate, &[batched, other]).unwrap())
                .unwrap();
        assert_eq!(
            m,
            json!([{"text":"p0"},{"text":"q0"},{"text":"p1"},{"text":"q1"}])
        );
        assert_eq!(merge_answers(Route::Generate, &[b"5"]), None);
    }

    fn forwarded(route: Route, event: &str, n: u64, j: u64) -> Value {
        match sample_event(route, event.as_bytes(), n, j) {
            SampleEvent::Forward(b) => {
                let text = String::from_utf8(b).unwrap();
                let data = text.strip_prefix("data: ").unwrap().trim_end();
                serde_json::from_str(data).unwrap()
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn stream_events_carry_their_sample_index() {
        let ev = "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n";
        let v = forwarded(Route::ChatCompletions, ev, 3, 2);
        assert_eq!(v["choices"][0]["index"], 2);
        assert_eq!(v["choices"][0]["delta"]["content"], "hi");
        assert_eq!(v["usage"], Value::Null);
        // A batched sample's second prompt.
        let ev = "data: {\"choices\":[{\"index\":1,\"text\":\"t\"}]}\n\n";
        assert_eq!(
            forwarded(Route::Completions, ev, 3, 1)["choices"][0]["index"],
            4
        );
        // /generate: the index a single-prompt sample lacks is added.
        let ev = "data: {\"text\":\"a\",\"meta_info\":{}}\n\n";
        assert_eq!(forwarded(Route::Generate, ev, 2, 1)["index"], 1);
        let ev = "data: {\"text\":\"a\",\"index\":1}\n\n";
        assert_eq!(forwarded(Route::Generate, ev, 2, 1)["index"], 3);
    }

    #[test]
    fn done_and_usage_chunks_are_held_back() {
        assert_eq!(
            sample_event(Route::Completions, b"data: [DONE]\n\n", 2, 1),
            SampleEvent::Done
        );
        let ev = b"data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\n";
        let SampleEvent::Usage { chunk, usage } = sample_event(Route::Completions, ev, 2, 0) else {
            panic!("not held back")
        };
        let other = br#"{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}"#;
        let merged = usage_chunk(&chunk, usage.clone(), &[&chunk[usage], other]).unwrap();
        let text = String::from_utf8(merged).unwrap();
        let v: Value =
            serde_json::from_str(text.strip_prefix("data: ").unwrap().trim_end()).unwrap();
        assert_eq!(
            v,
            json!({"id":"x","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":6,"total_tokens":9}})
        );
        // Comments and error bodies pass unchanged.
        let err = b"data: {\"error\":{\"message\":\"boom\"}}\n\n";
        assert_eq!(
            sample_event(Route::Completions, err, 2, 1),
            SampleEvent::Forward(err.to_vec())
        );
        assert_eq!(
            sample_event(Route::Completions, b": ping\n\n", 2, 1),
            SampleEvent::Forward(b": ping\n\n".to_vec())
        );
    }
}
