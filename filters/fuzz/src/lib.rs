//! Oracles shared by the fuzz targets: what a transform's output must be, computed independently
//! of the crate (with serde_json's `Value` and `RawValue`), and the input layout every structured
//! target uses (a few control bytes, then the body).
//!
//! A target that only checked "no panic" would pass on a transform that drops keys or emits
//! broken JSON; these helpers let each target assert the transform's contract instead.

use std::collections::HashMap;

use pdgate_filters::body::{scan_object, TopLevel};
use pdgate_filters::Route;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// Splits a fuzz input into `N` control bytes (zero-padded when the input is shorter) and the
/// rest, the body. Seeds are written as `N` control bytes followed by a JSON body.
pub fn split_control<const N: usize>(data: &[u8]) -> ([u8; N], &[u8]) {
    let mut ctl = [0u8; N];
    let n = data.len().min(N);
    ctl[..n].copy_from_slice(&data[..n]);
    (ctl, &data[n..])
}

/// `bytes` as one JSON document, exactly as serde_json reads it.
pub fn parse(bytes: &[u8]) -> Option<Value> {
    serde_json::from_slice(bytes).ok()
}

/// `bytes` as a JSON object; panics (a fuzz failure) when it is not one.
pub fn parse_object(bytes: &[u8], what: &str) -> Map<String, Value> {
    match parse(bytes) {
        Some(Value::Object(m)) => m,
        other => panic!(
            "{what} is not a JSON object: {other:?}\n{}",
            String::from_utf8_lossy(bytes)
        ),
    }
}

/// The top-level entries of a valid JSON object as raw text, last duplicate winning (the rule
/// the crate and serde_json share). `None` when `body` is not a JSON object. Validity is
/// `Value`'s (a `RawValue` alone lets lone surrogate escapes through).
pub fn raw_fields(body: &[u8]) -> Option<HashMap<String, &RawValue>> {
    parse(body)?;
    let text = std::str::from_utf8(body).ok()?;
    serde_json::from_str::<HashMap<String, &RawValue>>(text).ok()
}

/// A raw field, `None` when absent or JSON `null` (the crate's "null counts as absent").
pub fn non_null<'a>(fields: &HashMap<String, &'a RawValue>, key: &str) -> Option<&'a str> {
    fields.get(key).map(|r| r.get()).filter(|r| *r != "null")
}

/// The JSON type of a raw literal. An integer is a number written without fraction or
/// exponent, whatever its magnitude (that is the crate's documented rule for token ids).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lit {
    Null,
    Bool,
    Integer,
    Float,
    String,
    Array,
    Object,
}

pub fn lit(raw: &str) -> Lit {
    match raw.as_bytes().first() {
        Some(b'n') => Lit::Null,
        Some(b't' | b'f') => Lit::Bool,
        Some(b'"') => Lit::String,
        Some(b'[') => Lit::Array,
        Some(b'{') => Lit::Object,
        Some(b'-' | b'0'..=b'9') if raw.contains(['.', 'e', 'E']) => Lit::Float,
        Some(b'-' | b'0'..=b'9') => Lit::Integer,
        _ => panic!("not a JSON literal: {raw:?}"),
    }
}

/// The elements of a raw JSON array; `None` when `raw` is not an array.
pub fn elements(raw: &str) -> Option<Vec<&str>> {
    if lit(raw) != Lit::Array {
        return None;
    }
    let els: Vec<&RawValue> = serde_json::from_str(raw).expect("a valid array");
    Some(els.into_iter().map(RawValue::get).collect())
}

/// A raw value as a `Value` (it was validated with its document).
pub fn value_of(raw: &str) -> Value {
    serde_json::from_str(raw).expect("raw value of a valid document")
}

/// The object `body` must become when `drop` keys and every `set` key are removed and `set` is
/// added: the contract of `rewrite` and of every leg body built on it.
pub fn expected_after(
    body: &Map<String, Value>,
    drop: &[&str],
    set: &[(&str, &[u8])],
) -> Map<String, Value> {
    let mut map = body.clone();
    for k in drop {
        map.remove(*k);
    }
    for (k, v) in set {
        let v = parse(v).unwrap_or_else(|| panic!("set value for {k} is not JSON"));
        map.insert((*k).to_owned(), v);
    }
    map
}

/// Asserts `out` is `body` rewritten with `drop`/`set`: a JSON object equal to
/// [`expected_after`], each `set` key exactly once and no `drop` key (escaped spellings
/// included), and every kept entry byte-identical and in the client's order.
pub fn assert_rewritten(
    body: &[u8],
    top: &TopLevel,
    out: &[u8],
    drop: &[&str],
    set: &[(&str, &[u8])],
) {
    let before = parse_object(body, "input body");
    let after = parse_object(out, "rewritten body");
    let want = expected_after(&before, drop, set);
    assert_eq!(
        after,
        want,
        "rewrite lost, changed or invented a key\n in: {}\nout: {}",
        String::from_utf8_lossy(body),
        String::from_utf8_lossy(out)
    );
    let out_top = scan_object(out).expect("rewritten body scans");
    for (k, _) in set {
        let n = out_top.entries().iter().filter(|e| e.key == *k).count();
        assert_eq!(n, 1, "set key {k:?} appears {n} times");
    }
    for k in drop {
        if !set.iter().any(|(s, _)| s == k) {
            assert!(!out_top.contains(k), "dropped key {k:?} is still there");
        }
    }
    let mut cursor = 0;
    for e in top.entries() {
        let key = e.key.as_str();
        if drop.contains(&key) || set.iter().any(|(k, _)| *k == key) {
            continue;
        }
        let raw = &body[e.key_start..e.value.end];
        let found = find(&out[cursor..], raw).unwrap_or_else(|| {
            panic!(
                "kept entry {:?} is not byte-identical and in order in the output\nout: {}",
                String::from_utf8_lossy(raw),
                String::from_utf8_lossy(out)
            )
        });
        cursor += found + raw.len();
    }
}

/// Position of `needle` in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The key written at `body[at..]` (a JSON string), unescaped.
pub fn key_at(body: &[u8], at: usize) -> String {
    let mut de = serde_json::Deserializer::from_slice(&body[at..]);
    String::deserialize(&mut de).expect("a JSON string at the key position")
}

/// A small deterministic selector from the input, so targets without control bytes still vary
/// their edits with it.
pub fn pick(data: &[u8], salt: usize, n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let h = data
        .iter()
        .fold(salt.wrapping_mul(31) ^ data.len(), |h, &b| {
            h.wrapping_mul(131).wrapping_add(usize::from(b))
        });
    h % n
}

/// Strings that stress JSON escaping when the gateway writes them (hosts, ids, messages).
pub const TRICKY_STRINGS: &[&str] = &[
    "10.0.0.5",
    "[::1]",
    "prefill-0.example",
    "a\"b\\c",
    "line\nbreak\r\t",
    "\u{0}\u{1f}\u{7f}",
    "h\u{e9}llo \u{2603} \u{1f389}",
    "",
];

/// The byte-exact and CR/LF rules of one re-emitted SSE event: `data: <one line>\n\n`.
pub fn assert_one_data_line_event(event: &[u8]) -> &[u8] {
    let inner = event
        .strip_prefix(b"data: ")
        .and_then(|e| e.strip_suffix(b"\n\n"))
        .unwrap_or_else(|| panic!("not `data: …\\n\\n`: {:?}", String::from_utf8_lossy(event)));
    assert!(
        !inner.iter().any(|&b| b == b'\n' || b == b'\r'),
        "event data spans several lines: {:?}",
        String::from_utf8_lossy(event)
    );
    inner
}

/// The shape rules of `pdgate_filters::shape`, read independently from the documented table:
/// `Err(field)` names the first broken rule in the table's order (caps, `temperature`, `top_p`,
/// `messages`, required inputs, `sampling_params` members), `null` counting as absent.
pub fn shape_oracle(route: Route, f: &HashMap<String, &RawValue>) -> Result<(), &'static str> {
    let check = |field: &'static str, ok: fn(&str) -> bool| match non_null(f, field) {
        Some(raw) if !ok(raw) => Err(field),
        _ => Ok(()),
    };
    let sampling = |f: &HashMap<String, &RawValue>| -> Result<(), &'static str> {
        let member = |key: &str, name: &'static str, ok: fn(&str) -> bool| match non_null(f, key) {
            Some(raw) if !ok(raw) => Err(name),
            _ => Ok(()),
        };
        member("max_new_tokens", "sampling_params.max_new_tokens", is_count)?;
        member("temperature", "sampling_params.temperature", is_temperature)?;
        member("top_p", "sampling_params.top_p", is_probability)
    };
    match route {
        Route::ChatCompletions | Route::Messages => {
            if !non_null(f, "messages").is_some_and(is_messages) {
                return Err("messages");
            }
            if route == Route::Messages {
                let cap = non_null(f, "max_tokens");
                if !cap.is_some_and(|raw| is_count(raw) && raw != "0") {
                    return Err("max_tokens");
                }
            } else {
                check("max_tokens", is_count)?;
                check("max_completion_tokens", is_count)?;
            }
            check("temperature", is_temperature)?;
            check("top_p", is_probability)
        }
        Route::Completions => {
            if non_null(f, "prompt").is_none() && non_null(f, "prompt_embeds").is_none() {
                return Err("prompt");
            }
            check("prompt_embeds", |raw| match lit(raw) {
                Lit::String => true,
                Lit::Array => {
                    elements(raw).is_some_and(|els| els.iter().all(|e| lit(e) == Lit::String))
                }
                _ => false,
            })?;
            check("max_tokens", is_count)?;
            check("temperature", is_temperature)?;
            check("top_p", is_probability)
        }
        Route::Generate => {
            if ["text", "input_ids", "input_embeds"]
                .iter()
                .all(|k| non_null(f, k).is_none())
            {
                return Err("text");
            }
            check("input_embeds", |raw| lit(raw) == Lit::Array)?;
            if let Some(raw) = non_null(f, "sampling_params") {
                if lit(raw) != Lit::Object {
                    return Err("sampling_params");
                }
                let members = raw_fields(raw.as_bytes()).expect("a valid object");
                sampling(&members)?;
            }
            Ok(())
        }
        Route::Responses => check("max_output_tokens", is_count),
        Route::Rerank | Route::CountTokens => Ok(()),
    }
}

/// An integer literal without a sign, any magnitude.
fn is_count(raw: &str) -> bool {
    lit(raw) == Lit::Integer && !raw.starts_with('-')
}

fn number(raw: &str) -> Option<f64> {
    matches!(lit(raw), Lit::Integer | Lit::Float)
        .then(|| value_of(raw).as_f64())
        .flatten()
}

fn is_temperature(raw: &str) -> bool {
    number(raw).is_some_and(|t| t >= 0.0)
}

fn is_probability(raw: &str) -> bool {
    number(raw).is_some_and(|p| (0.0..=1.0).contains(&p))
}

/// A non-empty array of objects whose (last) `role` is a string.
fn is_messages(raw: &str) -> bool {
    match value_of(raw) {
        Value::Array(ms) => {
            !ms.is_empty()
                && ms.iter().all(|m| {
                    m.as_object()
                        .is_some_and(|o| o.get("role").is_some_and(Value::is_string))
                })
        }
        _ => false,
    }
}
