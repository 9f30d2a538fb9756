//! Property tests of the hot-path transforms: they never panic on hostile bytes, validate JSON
//! exactly like serde_json, rewrite without losing or inventing data, read SSE streams the
//! same way whatever the chunking, and accept exactly the request bodies of the right shape.

use pdgate_filters::body::{rewrite, rewrite_into, scan_object, BodyError, PartsSink};
use pdgate_filters::classify::classify;
use pdgate_filters::fanout;
use pdgate_filters::framing::{BodyDecoder, Framing};
use pdgate_filters::handoff::moriio;
use pdgate_filters::handoff::sglang::{self, BootstrapTarget, DpRanks, Leg, Rooms};
use pdgate_filters::handoff::vllm;
use pdgate_filters::logprobs::{self, PrefillLogprobs};
use pdgate_filters::route::Route;
use pdgate_filters::sse::{self, DoneDetector, SseSplitter};
use pdgate_filters::value;
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

/// Top-level keys no rule reads (every name the gateway knows lacks the `x_` prefix), with any
/// value — including values that would break a rule if they sat under a checked name.
fn unknown_fields() -> impl Strategy<Value = Vec<(String, Value)>> {
    let value = prop_oneof![
        arb_json(),
        Just(serde_json::json!({"messages": "not-a-list", "max_tokens": -1, "role": 5})),
        Just(Value::from(-1)),
    ];
    prop::collection::vec(("x_[a-z_]{0,8}", value), 0..4)
}

fn object(entries: impl IntoIterator<Item = (String, Value)>) -> Value {
    Value::Object(entries.into_iter().collect())
}

/// `Some` entries of `fields`, in order.
fn present(fields: Vec<(&str, Option<Value>)>) -> Vec<(String, Value)> {
    fields
        .into_iter()
        .filter_map(|(k, v)| Some((k.to_owned(), v?)))
        .collect()
}

/// A binary fraction in `lo..hi` (exact in JSON text), or an integer in that range.
fn number_in(lo: f64, hi: f64) -> impl Strategy<Value = Value> {
    prop_oneof![
        (lo..=hi).prop_map(|f| Value::from((f * 64.0).floor() / 64.0)),
        ((lo.ceil() as u64)..=(hi.floor() as u64)).prop_map(Value::from),
    ]
}

/// A valid value, or an explicit `null` (which counts as absent), or nothing.
fn maybe(value: impl Strategy<Value = Value>) -> impl Strategy<Value = Option<Value>> {
    prop::option::of(prop_oneof![4 => value, 1 => Just(Value::Null)])
}

fn count() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0u64..=4).prop_map(Value::from),
        any::<u64>().prop_map(Value::from)
    ]
}

fn messages() -> impl Strategy<Value = Value> {
    let message =
        ("[a-z]{1,9}", arb_json(), unknown_fields()).prop_map(|(role, content, extra)| {
            let mut m = vec![("role".to_owned(), Value::from(role))];
            m.push(("content".to_owned(), content));
            m.extend(extra);
            object(m)
        });
    prop::collection::vec(message, 1..4).prop_map(Value::Array)
}

/// What every route reads for its facts, valid.
fn facts_fields() -> impl Strategy<Value = Vec<(String, Value)>> {
    (
        maybe("[a-z0-9-]{1,8}".prop_map(Value::from)),
        maybe(any::<bool>().prop_map(Value::from)),
        maybe((1u64..=4).prop_map(Value::from)),
    )
        .prop_map(|(model, stream, n)| {
            present(vec![("model", model), ("stream", stream), ("n", n)])
        })
}

/// A request body of the right shape for its route, as an entry list (no duplicate keys).
fn valid_body() -> impl Strategy<Value = (Route, Vec<(String, Value)>)> {
    let sampling = || (maybe(number_in(0.0, 4.0)), maybe(number_in(0.0, 1.0)));
    let chat = (messages(), maybe(count()), maybe(count()), sampling()).prop_map(
        |(m, cap, cap2, (t, p))| {
            let f = vec![
                ("messages", Some(m)),
                ("max_tokens", cap),
                ("max_completion_tokens", cap2),
                ("temperature", t),
                ("top_p", p),
            ];
            (Route::ChatCompletions, present(f))
        },
    );
    let anthropic = (messages(), 1u64.., sampling()).prop_map(|(m, cap, (t, p))| {
        let f = vec![
            ("messages", Some(m)),
            ("max_tokens", Some(Value::from(cap))),
            ("temperature", t),
            ("top_p", p),
        ];
        (Route::Messages, present(f))
    });
    let prompt = prop_oneof![
        "[a-z ]{0,8}".prop_map(Value::from),
        prop::collection::vec("[a-z]{0,4}".prop_map(Value::from), 0..3).prop_map(Value::Array),
        prop::collection::vec(any::<u32>().prop_map(Value::from), 0..3).prop_map(Value::Array),
        prop::collection::vec(
            prop::collection::vec(any::<u32>().prop_map(Value::from), 0..3).prop_map(Value::Array),
            1..3
        )
        .prop_map(Value::Array),
    ];
    let embeds = prop_oneof![
        "[A-Za-z0-9+/=]{0,8}".prop_map(Value::from),
        prop::collection::vec("[A-Za-z0-9+/=]{0,8}".prop_map(Value::from), 0..3)
            .prop_map(Value::Array),
    ];
    let completions = (prompt, maybe(embeds), maybe(count()), sampling()).prop_map(
        |(prompt, embeds, cap, (t, p))| {
            // Without `prompt_embeds`, the prompt is required.
            let prompt = if embeds.as_ref().is_some_and(|e| !e.is_null()) {
                None
            } else {
                Some(prompt)
            };
            let f = vec![
                ("prompt", prompt),
                ("prompt_embeds", embeds),
                ("max_tokens", cap),
                ("temperature", t),
                ("top_p", p),
            ];
            (Route::Completions, present(f))
        },
    );
    let input = prop_oneof![
        "[a-z ]{0,8}".prop_map(|t| ("text", Value::from(t))),
        prop::collection::vec(any::<u32>().prop_map(Value::from), 0..3)
            .prop_map(|ids| ("input_ids", Value::Array(ids))),
        Just(("input_embeds", serde_json::json!([[0.5, -1.0]]))),
    ];
    let sampling_params =
        (maybe(count()), sampling(), unknown_fields()).prop_map(|(cap, (t, p), extra)| {
            let mut f = present(vec![
                ("max_new_tokens", cap),
                ("temperature", t),
                ("top_p", p),
            ]);
            f.extend(extra);
            object(f)
        });
    let generate = (input, maybe(sampling_params)).prop_map(|((key, input), sp)| {
        let f = vec![(key, Some(input)), ("sampling_params", sp)];
        (Route::Generate, present(f))
    });
    let responses = ("[a-z]{0,8}", maybe(count())).prop_map(|(input, cap)| {
        let f = vec![
            ("input", Some(Value::from(input))),
            ("max_output_tokens", cap),
        ];
        (Route::Responses, present(f))
    });
    let body = prop_oneof![chat, anthropic, completions, generate, responses];
    (body, facts_fields()).prop_map(|((route, mut fields), facts)| {
        fields.extend(facts);
        (route, fields)
    })
}

/// JSON kinds, to build a value of a kind a field does not take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JsonKind {
    String,
    Integer,
    Float,
    Bool,
    Array,
    Object,
}

const KINDS: [JsonKind; 6] = [
    JsonKind::String,
    JsonKind::Integer,
    JsonKind::Float,
    JsonKind::Bool,
    JsonKind::Array,
    JsonKind::Object,
];

fn value_of_kind(kind: JsonKind) -> BoxedStrategy<Value> {
    match kind {
        JsonKind::String => "[a-z0-9 ]{0,6}".prop_map(Value::from).boxed(),
        JsonKind::Integer => any::<i64>().prop_map(Value::from).boxed(),
        // serde_json writes every f64 with a fraction or an exponent (`2.0`, `1e20`).
        JsonKind::Float => (-1e6f64..1e6).prop_map(Value::from).boxed(),
        JsonKind::Bool => any::<bool>().prop_map(Value::from).boxed(),
        JsonKind::Array => prop::collection::vec(arb_json(), 0..3)
            .prop_map(Value::Array)
            .boxed(),
        JsonKind::Object => prop::collection::vec(("[a-z]{1,4}", arb_json()), 0..3)
            .prop_map(object)
            .boxed(),
    }
}

/// A field a rule checks: where it is (a member of `sampling_params` when `nested`), the name a
/// refusal gives, and the JSON kinds it takes.
#[derive(Clone, Copy, Debug)]
struct Checked {
    key: &'static str,
    nested: bool,
    name: &'static str,
    kinds: &'static [JsonKind],
}

const fn top(key: &'static str, kinds: &'static [JsonKind]) -> Checked {
    Checked {
        key,
        nested: false,
        name: key,
        kinds,
    }
}

const INTEGER: &[JsonKind] = &[JsonKind::Integer];
const NUMBER: &[JsonKind] = &[JsonKind::Integer, JsonKind::Float];
const TEXT_OR_LIST: &[JsonKind] = &[JsonKind::String, JsonKind::Array];

/// The fields `classify` checks on `route`, given the body's input field (`/generate`).
fn checked_fields(route: Route, body: &[(String, Value)]) -> Vec<Checked> {
    let mut out = vec![
        top("model", &[JsonKind::String]),
        top("stream", &[JsonKind::Bool]),
        top("n", INTEGER),
    ];
    let sampling = [top("temperature", NUMBER), top("top_p", NUMBER)];
    match route {
        Route::ChatCompletions => {
            out.push(top("messages", &[JsonKind::Array]));
            out.push(top("max_tokens", INTEGER));
            out.push(top("max_completion_tokens", INTEGER));
            out.extend(sampling);
        }
        Route::Messages => {
            out.push(top("messages", &[JsonKind::Array]));
            out.push(top("max_tokens", INTEGER));
            out.extend(sampling);
        }
        Route::Completions => {
            out.push(top("max_tokens", INTEGER));
            out.push(top("prompt_embeds", TEXT_OR_LIST));
            if body.iter().any(|(k, _)| k == "prompt") {
                out.push(top("prompt", TEXT_OR_LIST));
            }
            out.extend(sampling);
        }
        Route::Generate => {
            let input = &body[0].0;
            out.push(match input.as_str() {
                "text" => top("text", TEXT_OR_LIST),
                "input_ids" => top("input_ids", &[JsonKind::Array]),
                _ => top("input_embeds", &[JsonKind::Array]),
            });
            out.push(top("sampling_params", &[JsonKind::Object]));
            for (key, name, kinds) in [
                ("max_new_tokens", "sampling_params.max_new_tokens", INTEGER),
                ("temperature", "sampling_params.temperature", NUMBER),
                ("top_p", "sampling_params.top_p", NUMBER),
            ] {
                out.push(Checked {
                    key,
                    nested: true,
                    name,
                    kinds,
                });
            }
        }
        Route::Responses => out.push(top("max_output_tokens", INTEGER)),
        Route::Rerank | Route::CountTokens => {}
    }
    out
}

/// `body` with `field` set to `value` (added when absent; `sampling_params` made an object).
fn with_field(
    mut body: Vec<(String, Value)>,
    field: Checked,
    value: Value,
) -> Vec<(String, Value)> {
    let set = |entries: &mut Vec<(String, Value)>, key: &str, value: Value| match entries
        .iter_mut()
        .find(|(k, _)| k == key)
    {
        Some(entry) => entry.1 = value,
        None => entries.push((key.to_owned(), value)),
    };
    if field.nested {
        let mut members = match body.iter().find(|(k, _)| k == "sampling_params") {
            Some((_, Value::Object(m))) => m.clone().into_iter().collect(),
            _ => Vec::new(),
        };
        set(&mut members, field.key, value);
        set(&mut body, "sampling_params", object(members));
    } else {
        set(&mut body, field.key, value);
    }
    body
}

/// The body as JSON text, unknown fields spliced in at `at` (so they land between checked ones).
fn body_text(body: &[(String, Value)], unknown: &[(String, Value)], at: usize) -> Vec<u8> {
    let mut entries: Vec<&(String, Value)> = body.iter().collect();
    let at = at % (entries.len() + 1);
    entries.splice(at..at, unknown.iter());
    let mut out = b"{".to_vec();
    for (i, (k, v)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend(serde_json::to_vec(k).unwrap());
        out.push(b':');
        out.extend(serde_json::to_vec(v).unwrap());
    }
    out.push(b'}');
    out
}

fn verdict(route: Route, body: &[u8]) -> Result<(), &'static str> {
    let top = scan_object(body).unwrap();
    classify(route, body, &top).map(drop).map_err(|e| e.field)
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

/// `scan_object` accepts exactly what `serde_json::Value` accepts, and calls a valid non-object
/// `NotObject`.
fn agrees_with_serde_json(bytes: &[u8]) -> Result<(), TestCaseError> {
    match (scan_object(bytes), serde_json::from_slice::<Value>(bytes)) {
        (Ok(_), Ok(v)) => prop_assert!(v.is_object()),
        (Err(BodyError::NotObject), Ok(v)) => prop_assert!(!v.is_object()),
        (Err(BodyError::Syntax(_)), Err(_)) => {}
        (got, want) => prop_assert!(
            false,
            "{:?}: scan {:?} vs serde_json {:?}",
            String::from_utf8_lossy(bytes),
            got,
            want
        ),
    }
    Ok(())
}

/// Pieces of JSON string text: escapes (surrogate halves among them), control bytes, whole and
/// broken UTF-8 sequences.
const STRING_TOKENS: &[&[u8]] = &[
    b"\\ud83d",
    b"\\uDE00",
    b"\\udc00",
    b"\\uD800",
    b"\\u0041",
    b"\\u00e9",
    b"\\u12",
    b"\\u",
    b"\\",
    b"\\n",
    b"\\\"",
    b"\\/",
    b"\\x",
    b"\"",
    b"a",
    b" ",
    b"9",
    b"f",
    b"\x01",
    b"\x1f",
    b"\x7f",
    b"\xc3",
    b"\xa9",
    b"\xe4\xb8\xad",
    b"\xed\xa0\x80",
    b"\xf0\x9f\x98\x80",
    b"\x80",
    b"\xc0\xaf",
    b"\xff",
];

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
        agrees_with_serde_json(&bytes)?;
    }

    /// Strings and numbers in a valid frame: escapes, surrogates, control bytes, pieces of
    /// multi-byte characters, exponents; the scan takes exactly what serde_json takes.
    #[test]
    fn scan_object_agrees_with_serde_json_on_strings_and_numbers(
        text in prop::collection::vec(prop::sample::select(STRING_TOKENS), 0..12),
        number in prop::collection::vec(prop::sample::select(&b"-+.eE0123456789"[..]), 1..12),
        exponent in 0u16..400,
    ) {
        let mut string_body = b"{\"k\":\"".to_vec();
        string_body.extend(text.concat());
        string_body.extend_from_slice(b"\"}");
        let mut number_body = b"{\"n\":".to_vec();
        number_body.extend_from_slice(&number);
        number_body.push(b'}');
        let big = format!("{{\"n\":1.5e{exponent},\"m\":-9e-{exponent}}}").into_bytes();
        for bytes in [string_body, number_body, big] {
            agrees_with_serde_json(&bytes)?;
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
        agrees_with_serde_json(&bytes)?;
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
            prop_assert!(map.contains_key(e.key.as_str()));
            prop_assert_eq!(body.as_bytes()[e.key_start], b'"');
            // The key written there is this entry's, and the value range is the value alone.
            let written = serde_json::Deserializer::from_str(&body[e.key_start..])
                .into_iter::<String>()
                .next();
            let written = written.and_then(Result::ok);
            prop_assert_eq!(written.as_deref(), Some(e.key.as_str()));
            let raw = &body.as_bytes()[e.value.clone()];
            prop_assert_eq!(raw.trim_ascii(), raw);
            prop_assert!(serde_json::from_slice::<Value>(raw).is_ok());
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
        // Kept as pieces of the body instead of copied: the same bytes.
        let shared = bytes::Bytes::from(body.clone().into_bytes());
        let mut parts = PartsSink::new(&shared);
        rewrite_into(&mut parts, &shared, &top, &drop_refs, &set_refs);
        let parts = parts.finish();
        prop_assert_eq!(parts.len(), out.len());
        prop_assert!(parts == *out.as_slice());
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
        let shared = bytes::Bytes::from(body.clone().into_bytes());
        let mut parts = PartsSink::new(&shared);
        sglang::leg_body_into(&mut parts, &shared, &top, &target, &rooms, leg, &dp, &[]);
        prop_assert!(parts.finish() == *out.as_slice());

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
        // Decoded, and skipped (a drained body): same payload, same end, same leftover.
        for skip in [false, true] {
            let mut d = BodyDecoder::new(Framing::Chunked);
            let mut buf = bytes::BytesMut::new();
            let mut out = Vec::new();
            let mut skipped = 0;
            let (mut at, mut i) = (0, 0);
            while at < wire.len() && !d.is_done() {
                let end = (at + cuts[i % cuts.len()]).min(wire.len());
                buf.extend_from_slice(&wire[at..end]);
                if skip {
                    skipped += d.skip(&mut buf).unwrap();
                } else {
                    out.extend_from_slice(&d.decode(&mut buf).unwrap());
                }
                at = end;
                i += 1;
            }
            prop_assert!(d.is_done());
            if skip {
                prop_assert_eq!(skipped, payloads.concat().len());
            } else {
                prop_assert_eq!(&out, &payloads.concat());
            }
            // What is left is exactly what followed the body.
            prop_assert_eq!(&buf[..], &wire[body_len..at]);
        }
    }

    #[test]
    fn member_reads_agree_with_serde_json(v in arb_json(), pretty in any::<bool>(), k in key()) {
        let text = if pretty {
            serde_json::to_vec_pretty(&v).unwrap()
        } else {
            serde_json::to_vec(&v).unwrap()
        };
        let member = |raw: Option<&[u8]>| raw.map(|r| serde_json::from_slice::<Value>(r).unwrap());
        prop_assert_eq!(member(value::object_get(&text, &k)), v.as_object().and_then(|o| o.get(&k)).cloned());
        let mut got = Vec::new();
        let is_array = value::for_each_element_member(&text, &k, |m| {
            got.push(member(m));
            true
        });
        prop_assert_eq!(is_array, v.is_array());
        if let Value::Array(els) = &v {
            let want: Vec<Option<Value>> =
                els.iter().map(|e| e.as_object().and_then(|o| o.get(&k)).cloned()).collect();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn bodies_of_the_right_shape_are_accepted_whatever_unknown_fields_they_carry(
        (route, body) in valid_body(), unknown in unknown_fields(), at in any::<usize>(),
    ) {
        let plain = body_text(&body, &[], 0);
        prop_assert_eq!(verdict(route, &plain), Ok(()), "{}", String::from_utf8_lossy(&plain));
        let with_unknown = body_text(&body, &unknown, at);
        prop_assert_eq!(
            verdict(route, &with_unknown), Ok(()), "{}", String::from_utf8_lossy(&with_unknown)
        );
    }

    #[test]
    fn a_checked_field_of_a_wrong_json_kind_is_refused_by_name(
        (route, body, field, bad) in valid_body().prop_flat_map(|(route, body)| {
            let fields = checked_fields(route, &body);
            (Just(route), Just(body), prop::sample::select(fields)).prop_flat_map(
                |(route, body, field)| {
                    let wrong: Vec<JsonKind> =
                        KINDS.into_iter().filter(|k| !field.kinds.contains(k)).collect();
                    let bad = prop::sample::select(wrong).prop_flat_map(value_of_kind);
                    (Just(route), Just(body), Just(field), bad)
                },
            )
        }),
        unknown in unknown_fields(),
        at in any::<usize>(),
    ) {
        let broken = with_field(body, field, bad);
        let plain = body_text(&broken, &[], 0);
        prop_assert_eq!(verdict(route, &plain), Err(field.name), "{}", String::from_utf8_lossy(&plain));
        let with_unknown = body_text(&broken, &unknown, at);
        prop_assert_eq!(
            verdict(route, &with_unknown), Err(field.name), "{}",
            String::from_utf8_lossy(&with_unknown)
        );
    }
}

/// The data of a forwarded merged-stream event, as JSON.
fn forwarded_json(e: fanout::SampleEvent) -> Option<Value> {
    match e {
        fanout::SampleEvent::Forward(b) => {
            let text = String::from_utf8(b).ok()?;
            serde_json::from_str(text.strip_prefix("data: ")?.trim_end()).ok()
        }
        _ => None,
    }
}

proptest! {
    /// A sample's stream event reaches the merged stream with only its choice indices changed.
    #[test]
    fn fanout_events_change_only_their_indices(
        content in arb_json(), index in 0u64..8, n in 1u64..6, sample in 0u64..6,
    ) {
        let sample = sample % n;
        let chunk = serde_json::json!({"id": "c", "choices": [{"index": index, "delta": content}], "usage": null});
        let event = format!("data: {chunk}\n\n");
        let got = forwarded_json(fanout::sample_event(Route::ChatCompletions, event.as_bytes(), n, sample));
        let mut want = chunk.clone();
        want["choices"][0]["index"] = (index * n + sample).into();
        prop_assert_eq!(got, Some(want));
    }

    /// Merged answers hold every sample's choices once, indexed 0.., and sum their completions.
    #[test]
    fn fanout_answers_keep_every_choice_and_sum_completions(
        completions in prop::collection::vec(0u64..1000, 1..6), prompt in 0u64..1000,
    ) {
        let bodies: Vec<Vec<u8>> = completions.iter().enumerate().map(|(j, c)| {
            serde_json::json!({"choices": [{"index": 0, "text": format!("s{j}")}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": c, "total_tokens": prompt + c}})
                .to_string().into_bytes()
        }).collect();
        let refs: Vec<&[u8]> = bodies.iter().map(Vec::as_slice).collect();
        let merged: Value = serde_json::from_slice(&fanout::merge_answers(Route::Completions, &refs).unwrap()).unwrap();
        let choices = merged["choices"].as_array().unwrap();
        prop_assert_eq!(choices.len(), completions.len());
        for (k, c) in choices.iter().enumerate() {
            prop_assert_eq!(c["index"].as_u64(), Some(k as u64));
            let text = format!("s{k}");
            prop_assert_eq!(c["text"].as_str(), Some(text.as_str()));
        }
        let sum: u64 = completions.iter().sum();
        prop_assert_eq!(merged["usage"]["completion_tokens"].as_u64(), Some(sum));
        prop_assert_eq!(merged["usage"]["prompt_tokens"].as_u64(), Some(prompt));
        prop_assert_eq!(merged["usage"]["total_tokens"].as_u64(), Some(prompt + sum));
    }
}
