//! The top-level JSON object of a request or response body: validate it once, record where each
//! entry's bytes are, and rewrite it by splicing those bytes (never by re-serializing), so keys
//! and values the gateway does not touch stay byte-for-byte and in the client's order.
//!
//! Validation is exactly `serde_json::from_slice::<serde_json::Value>`'s (UTF-8, syntax, escapes,
//! number range, recursion limit, trailing characters) but builds no `Value`. A body it accepts
//! is walked once ([`walk`]: validate and record each top-level entry as it passes); anything
//! else (and any body that walk does not take) goes to serde_json: a zero-sized validating
//! visitor, then a second pass over the object recording each entry's key and raw value. That
//! two-pass scan is the reference and gives the error messages. Nothing is allocated but the
//! entry list (and a key longer than [`Key`] holds inline).

use std::fmt;
use std::ops::Range;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::json;

mod parts;
mod walk;

pub use parts::{BodyParts, BodySink, PartsSink, Sink};

/// The entries of one JSON object, in document order (duplicates kept).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopLevel {
    entries: Vec<Entry>,
}

/// One `"key": value` of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The key, unescaped (so `"str\u0065am"` is `stream`).
    pub key: Key,
    /// Index of the key's opening quote in the scanned bytes.
    pub key_start: usize,
    /// The raw value bytes, without surrounding whitespace.
    pub value: Range<usize>,
}

/// An object key, unescaped. The keys of the APIs' bodies fit inline (up to 22 bytes:
/// `max_completion_tokens`, `kv_transfer_params`), so scanning a request allocates none; a
/// longer one is boxed. The size of a `String`.
#[derive(Clone, PartialEq, Eq)]
pub enum Key {
    Inline { len: u8, bytes: [u8; KEY_INLINE] },
    Heap(Box<str>),
}

const KEY_INLINE: usize = 22;

impl Key {
    pub fn new(s: &str) -> Key {
        if s.len() <= KEY_INLINE {
            let mut bytes = [0u8; KEY_INLINE];
            bytes[..s.len()].copy_from_slice(s.as_bytes());
            Key::Inline {
                len: s.len() as u8,
                bytes,
            }
        } else {
            Key::Heap(s.into())
        }
    }

    /// A key from the text between its quotes, when that text has no escape; `None` if it is
    /// not UTF-8. ASCII text (every API's keys) is copied without a UTF-8 check.
    pub(crate) fn from_unescaped(text: &[u8]) -> Option<Key> {
        if text.len() <= KEY_INLINE {
            if !text.is_ascii() {
                std::str::from_utf8(text).ok()?;
            }
            let mut bytes = [0u8; KEY_INLINE];
            bytes[..text.len()].copy_from_slice(text);
            Some(Key::Inline {
                len: text.len() as u8,
                bytes,
            })
        } else {
            std::str::from_utf8(text).ok().map(|s| Key::Heap(s.into()))
        }
    }

    pub fn as_str(&self) -> &str {
        // The bytes are a copy of a `&str`, so they are UTF-8.
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }

    /// The key's bytes: what comparisons look at (a key is compared on every field lookup,
    /// and bytes need no UTF-8 check).
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Key::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Key::Heap(s) => s.as_bytes(),
        }
    }
}

impl std::ops::Deref for Key {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl PartialEq<str> for Key {
    fn eq(&self, other: &str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl PartialEq<&str> for Key {
    fn eq(&self, other: &&str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl PartialEq<Key> for &str {
    fn eq(&self, other: &Key) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl PartialEq<Key> for String {
    fn eq(&self, other: &Key) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Key, E> {
                Ok(Key::new(s))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// Why a body is not a usable JSON object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BodyError {
    /// Not valid JSON; serde_json's message, including line and column.
    Syntax(String),
    /// Valid JSON, but not an object.
    NotObject,
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyError::Syntax(msg) => write!(f, "invalid JSON: {msg}"),
            BodyError::NotObject => f.write_str("the JSON body must be an object"),
        }
    }
}

impl std::error::Error for BodyError {}

/// Validates the whole of `body` as JSON and records the entries of its top-level object.
///
/// Works on any slice, so a caller can pass a nested object's raw bytes (e.g. `meta_info`); entry
/// ranges are then relative to that slice.
pub fn scan_object(body: &[u8]) -> Result<TopLevel, BodyError> {
    match walk::object_entries(body) {
        Some(entries) => Ok(TopLevel { entries }),
        None => scan_two_passes(body),
    }
}

/// The reference scan: validate the whole document (and say what is wrong with it), then walk
/// the object again for its entries.
fn scan_two_passes(body: &[u8]) -> Result<TopLevel, BodyError> {
    match serde_json::from_slice::<JsonKind>(body) {
        Ok(JsonKind::Object) => {}
        Ok(JsonKind::Other) => return Err(BodyError::NotObject),
        Err(e) => return Err(BodyError::Syntax(e.to_string())),
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let entries = de
        .deserialize_map(EntriesVisitor { body })
        .map_err(|e| BodyError::Syntax(e.to_string()))?;
    Ok(TopLevel { entries })
}

/// Whether `bytes` is one valid JSON document (same rules as `serde_json::Value`).
pub fn is_valid_json(bytes: &[u8]) -> bool {
    serde_json::from_slice::<JsonKind>(bytes).is_ok()
}

impl TopLevel {
    /// All entries in document order, duplicates included.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Raw bytes of the value of the last occurrence of `key` (duplicate keys: last wins, as in
    /// serde_json and pydantic). `body` must be the slice this was scanned from.
    pub fn get<'b>(&self, body: &'b [u8], key: &str) -> Option<&'b [u8]> {
        let entry = self.entries.iter().rev().find(|e| e.key == key)?;
        body.get(entry.value.clone())
    }

    /// Like [`TopLevel::get`], but a JSON `null` counts as absent.
    pub fn get_non_null<'b>(&self, body: &'b [u8], key: &str) -> Option<&'b [u8]> {
        self.get(body, key).filter(|v| *v != b"null")
    }

    /// Whether `key` occurs at all (with any value, `null` included).
    pub fn contains(&self, key: &str) -> bool {
        self.entries.iter().any(|e| e.key == key)
    }
}

/// A copy of `body` without every top-level entry whose key is in `drop` or is one of `set`'s
/// keys (all duplicates removed), followed by `set` appended in order as `"key":<raw value>`.
///
/// `set` values are trusted JSON text (the gateway's own). Kept entries are byte-identical
/// (key, whitespace, colon, value); separators between entries are normalized to `,`.
pub fn rewrite(body: &[u8], top: &TopLevel, drop: &[&str], set: &[(&str, &[u8])]) -> Vec<u8> {
    let added: usize = set.iter().map(|(k, v)| k.len() + v.len() + 8).sum();
    let mut out = Vec::with_capacity(body.len() + added + 2);
    rewrite_into(&mut out, body, top, drop, set);
    out
}

/// [`rewrite`] into any [`Sink`]: with a [`PartsSink`], the kept entries are not copied.
pub fn rewrite_into<S: Sink>(
    out: &mut S,
    body: &[u8],
    top: &TopLevel,
    drop: &[&str],
    set: &[(&str, &[u8])],
) {
    out.own(|o| o.push(b'{'));
    let mut first = true;
    for entry in &top.entries {
        let key = entry.key.as_bytes();
        if drop
            .iter()
            .chain(set.iter().map(|(k, _)| k))
            .any(|k| k.as_bytes() == key)
        {
            continue;
        }
        if entry.key_start > entry.value.end || entry.value.end > body.len() {
            continue;
        }
        if !first {
            out.own(|o| o.push(b','));
        }
        out.kept(body, entry.key_start..entry.value.end);
        first = false;
    }
    for (key, value) in set {
        out.own(|o| {
            if !first {
                o.push(b',');
            }
            json::push_string(o, key);
            o.push(b':');
            o.extend_from_slice(value);
        });
        first = false;
    }
    out.own(|o| o.push(b'}'));
}

/// What a validated document is at the top. Deserializing it walks every value with
/// `deserialize_any`, which is exactly the validation `serde_json::Value` gets.
enum JsonKind {
    Object,
    Other,
}

impl<'de> Deserialize<'de> for JsonKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(KindVisitor)
    }
}

struct KindVisitor;

macro_rules! scalar_visits {
    ($($name:ident: $ty:ty),*) => {
        $(fn $name<E: de::Error>(self, _: $ty) -> Result<JsonKind, E> { Ok(JsonKind::Other) })*
    };
}

impl<'de> Visitor<'de> for KindVisitor {
    type Value = JsonKind;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    scalar_visits!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_f64: f64,
        visit_i128: i128, visit_u128: u128, visit_str: &str, visit_bytes: &[u8]);

    fn visit_unit<E: de::Error>(self) -> Result<JsonKind, E> {
        Ok(JsonKind::Other)
    }

    fn visit_none<E: de::Error>(self) -> Result<JsonKind, E> {
        Ok(JsonKind::Other)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<JsonKind, D::Error> {
        d.deserialize_any(KindVisitor)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<JsonKind, A::Error> {
        while seq.next_element::<JsonKind>()?.is_some() {}
        Ok(JsonKind::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JsonKind, A::Error> {
        while map.next_entry::<JsonKind, JsonKind>()?.is_some() {}
        Ok(JsonKind::Object)
    }
}

/// Second pass over an already validated object: keys unescaped, values as borrowed raw text
/// whose position is found by pointer offset into `body` (a slice deserializer borrows from it).
struct EntriesVisitor<'b> {
    body: &'b [u8],
}

impl<'de> Visitor<'de> for EntriesVisitor<'_> {
    type Value = Vec<Entry>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<Entry>, A::Error> {
        let body = self.body;
        let open = body
            .iter()
            .position(|&b| b == b'{')
            .ok_or_else(|| de::Error::custom("object without `{`"))?;
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(8).min(64));
        let mut prev_end = open + 1;
        while let Some(key) = map.next_key::<Key>()? {
            let raw: &'de RawValue = map.next_value()?;
            let text = raw.get().as_bytes();
            let start = (text.as_ptr() as usize)
                .checked_sub(body.as_ptr() as usize)
                .filter(|s| s + text.len() <= body.len())
                .ok_or_else(|| de::Error::custom("raw value outside the scanned body"))?;
            // Only whitespace and `,` separate the previous value from this key's opening quote.
            let key_start = body
                .get(prev_end..start)
                .unwrap_or_default()
                .iter()
                .position(|&b| b == b'"')
                .map(|i| prev_end + i)
                .ok_or_else(|| de::Error::custom("key quote not found"))?;
            let end = start + text.len();
            entries.push(Entry {
                key,
                key_start,
                value: start..end,
            });
            prev_end = end;
        }
        Ok(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn keys(top: &TopLevel) -> Vec<&str> {
        top.entries().iter().map(|e| e.key.as_str()).collect()
    }

    #[test]
    fn keys_are_inline_up_to_22_bytes_and_unescaped() {
        let body = br#"{"max_completion_tokens":1,"str\u0065am":true,"spaces_between_special_tokens":false}"#;
        let top = scan_object(body).unwrap();
        let e = top.entries();
        assert!(matches!(e[0].key, Key::Inline { .. }));
        assert_eq!(e[0].key, "max_completion_tokens");
        assert_eq!(e[1].key, "stream");
        assert!(matches!(e[2].key, Key::Heap(_)));
        assert_eq!(e[2].key.as_str(), "spaces_between_special_tokens");
        assert_eq!(Key::new(""), "");
        assert_eq!(Key::new("é"), "é");
        assert_eq!(format!("{:?}", Key::new("a\"b")), r#""a\"b""#);
    }

    #[test]
    fn scan_records_entries_in_document_order_with_raw_values() {
        let body = br#" { "b" : 1 , "a":[1, 2] ,"c":{"x":"y"}, "d" :"s\"q" } "#;
        let top = scan_object(body).unwrap();
        assert_eq!(keys(&top), ["b", "a", "c", "d"]);
        assert_eq!(top.get(body, "b").unwrap(), b"1");
        assert_eq!(top.get(body, "a").unwrap(), b"[1, 2]");
        assert_eq!(top.get(body, "c").unwrap(), br#"{"x":"y"}"#);
        assert_eq!(top.get(body, "d").unwrap(), br#""s\"q""#);
        for e in top.entries() {
            assert_eq!(body[e.key_start], b'"');
        }
    }

    /// The one walk records exactly what the two-pass reference records, wherever the
    /// whitespace, separators and look-alike bytes inside values are, and leaves what it cannot
    /// take to the reference.
    #[test]
    fn one_walk_records_what_the_two_pass_scan_records() {
        let bodies: &[&[u8]] = &[
            b"{}",
            b" \n{ } \t",
            br#"{"a":1}"#,
            br#"{"a":1,"b":"x"}"#,
            b"\r\n {\n\t\"a\" \t:\n -1.5e3 \n,\r\"b\"\t:\ttrue\n,\"c\":null } \n",
            br#"{"s":"a\",\"b\":1, ","t":{"x":"}"} , "u":[{"k":","}] }"#,
            br#"{"a":{},"a":[],"a":"","a":0}"#,
            "{\"é\":\"ü\",\"\":\"\",\"k\":\"\\u00e9\\\"\\\\\"}".as_bytes(),
            br#"{"deep":[[[[{"a":[1,{"b":"}]"}]}]]]],"z":false}"#,
            br#"{"n":0.5E-7 ,"m":-0 }"#,
            br#"{"str\u0065am":true,"a":1,"\"":2}"#,
            br#"{"pair":"\ud83d\ude00","big":1e308,"long":"\n\n"}"#,
        ];
        for body in bodies {
            let one = walk::object_entries(body).expect("one walk takes it");
            let two = scan_two_passes(body).unwrap();
            assert_eq!(one, two.entries, "{}", String::from_utf8_lossy(body));
        }
        let left: &[&[u8]] = &[
            b"[]",
            b"1",
            b"{",
            br#"{"a":1} x"#,
            br#"{"a":1e400}"#,
            b"{\"a\":\"\\ud800\"}",
        ];
        for body in left {
            assert_eq!(
                walk::object_entries(body),
                None,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn scan_unescapes_keys() {
        let body = br#"{"str\u0065am":true,"\u00e9":1}"#;
        let top = scan_object(body).unwrap();
        assert_eq!(keys(&top), ["stream", "é"]);
        assert!(top.contains("stream"));
        assert_eq!(top.get(body, "stream").unwrap(), b"true");
        // Unescaped keys are taken as written: raw UTF-8, and past the inline length.
        let long = "ключ_длиннее_двадцати_двух_байт";
        let body = format!(r#"{{"é":1,"{long}":2,"":3}}"#);
        let top = scan_object(body.as_bytes()).unwrap();
        assert_eq!(keys(&top), ["é", long, ""]);
        assert!(matches!(top.entries()[1].key, Key::Heap(_)));
    }

    #[test]
    fn duplicate_keys_last_wins_for_get() {
        let body = br#"{"a":1,"a":2}"#;
        let top = scan_object(body).unwrap();
        assert_eq!(top.entries().len(), 2);
        assert_eq!(top.get(body, "a").unwrap(), b"2");
    }

    #[test]
    fn empty_object_has_no_entries() {
        let top = scan_object(b"{}").unwrap();
        assert!(top.entries().is_empty());
        assert!(!top.contains("a"));
        assert_eq!(top.get(b"{}", "a"), None);
    }

    #[test]
    fn get_non_null_treats_null_as_absent() {
        let body = br#"{"a":null,"b":0}"#;
        let top = scan_object(body).unwrap();
        assert_eq!(top.get_non_null(body, "a"), None);
        assert_eq!(top.get_non_null(body, "b").unwrap(), b"0");
        assert!(top.contains("a"));
    }

    #[test]
    fn non_object_json_is_not_object() {
        for body in [&b"[]"[..], b"1", b"\"s\"", b"null", b" true "] {
            assert_eq!(scan_object(body), Err(BodyError::NotObject));
        }
    }

    #[test]
    fn syntax_errors_carry_serde_json_position() {
        let err = scan_object(b"{\"a\":}").unwrap_err();
        match err {
            BodyError::Syntax(msg) => assert!(msg.contains("line 1 column"), "{msg}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rejects_what_serde_json_value_rejects() {
        let bad: &[&[u8]] = &[
            b"",
            b"{",
            b"{\"a\":1,}",
            b"{\"a\":1} x",
            b"{\"a\":1e400}",
            b"{\"a\":\"\\ud800\"}",
            b"{\"a\":\"\xff\"}",
            b"{\"a\xff\":1}",
            b"{\"a\":tru}",
            b"{'a':1}",
            b"{\"a\":\"\x01\"}",
        ];
        for body in bad {
            assert!(serde_json::from_slice::<Value>(body).is_err());
            assert!(
                matches!(scan_object(body), Err(BodyError::Syntax(_))),
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn enforces_the_recursion_limit_like_serde_json() {
        for depth in [120usize, 126, 127, 128, 200] {
            let body = format!("{{\"a\":{}{}}}", "[".repeat(depth), "]".repeat(depth));
            let want = serde_json::from_str::<Value>(&body).is_ok();
            assert_eq!(scan_object(body.as_bytes()).is_ok(), want, "depth {depth}");
        }
    }

    #[test]
    fn scan_works_on_a_nested_sub_slice() {
        let body = br#"{"meta_info":{"id":"x","input_token_logprobs":[]}}"#;
        let top = scan_object(body).unwrap();
        let meta = top.get(body, "meta_info").unwrap();
        let inner = scan_object(meta).unwrap();
        assert_eq!(inner.get(meta, "input_token_logprobs").unwrap(), b"[]");
    }

    #[test]
    fn rewrite_keeps_untouched_entries_byte_identical() {
        let body = br#"{ "model" : "m",  "x":{"k" :  [1, 2.50]}, "stream":true }"#;
        let top = scan_object(body).unwrap();
        let out = rewrite(body, &top, &["stream"], &[("room", b"7")]);
        assert_eq!(out, br#"{"model" : "m","x":{"k" :  [1, 2.50]},"room":7}"#);
    }

    #[test]
    fn rewrite_replaces_set_keys_and_removes_all_duplicates() {
        let body = br#"{"a":1,"b":2,"a":3,"c":4}"#;
        let top = scan_object(body).unwrap();
        let out = rewrite(body, &top, &["c"], &[("a", b"9")]);
        assert_eq!(out, br#"{"b":2,"a":9}"#);
    }

    #[test]
    fn rewrite_drops_keys_written_with_escapes() {
        let body = br#"{"bootstrap_r\u006fom":1,"k":2}"#;
        let top = scan_object(body).unwrap();
        let out = rewrite(body, &top, &["bootstrap_room"], &[]);
        assert_eq!(out, br#"{"k":2}"#);
    }

    #[test]
    fn rewrite_of_empty_object_with_sets() {
        let top = scan_object(b"{}").unwrap();
        assert_eq!(rewrite(b"{}", &top, &[], &[]), b"{}");
        assert_eq!(
            rewrite(b"{}", &top, &[], &[("a", b"1"), ("b\"", b"null")]),
            br#"{"a":1,"b\"":null}"#
        );
    }

    #[test]
    fn rewrite_with_mismatched_body_does_not_panic() {
        let top = scan_object(br#"{"aaaaaaa":1111111}"#).unwrap();
        let out = rewrite(b"{}", &top, &[], &[]);
        assert_eq!(out, b"{}");
    }

    #[test]
    fn is_valid_json_accepts_any_document() {
        assert!(is_valid_json(b"[1,2]"));
        assert!(is_valid_json(b" \"s\" "));
        assert!(!is_valid_json(b"nope"));
    }
}
