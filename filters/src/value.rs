//! Reading typed facts out of one raw JSON value (bytes from [`crate::body::TopLevel::get`]):
//! its kind, a bool, a string, an integer, a number, the element kinds of an array, the members
//! of an object, without building a `serde_json::Value` (and without allocating, short of
//! unescaping a string or key written with escapes). Inputs are expected to be valid JSON (a
//! scanned body's values); anything else reads as "wrong type", or for the member reads as
//! nothing in particular, never a panic.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// The JSON type of a value, from its first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Null,
    Bool,
    /// A number written without fraction or exponent.
    Integer,
    /// A number with a fraction or exponent.
    Float,
    String,
    Array,
    Object,
}

impl Kind {
    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// The kind of a raw value; `None` for empty or garbage input.
pub fn kind(raw: &[u8]) -> Option<Kind> {
    Some(match raw.first()? {
        b'n' => Kind::Null,
        b't' | b'f' => Kind::Bool,
        b'"' => Kind::String,
        b'[' => Kind::Array,
        b'{' => Kind::Object,
        b'-' | b'0'..=b'9' => {
            if raw.iter().any(|b| matches!(b, b'.' | b'e' | b'E')) {
                Kind::Float
            } else {
                Kind::Integer
            }
        }
        _ => return None,
    })
}

/// `true` / `false`; `None` for anything else.
pub fn as_bool(raw: &[u8]) -> Option<bool> {
    match raw {
        b"true" => Some(true),
        b"false" => Some(false),
        _ => None,
    }
}

/// A JSON string, unescaped (borrowed when it has no escapes); `None` if not a string.
pub fn as_str(raw: &[u8]) -> Option<Cow<'_, str>> {
    if kind(raw) != Some(Kind::String) {
        return None;
    }
    let inner = raw.get(1..raw.len().checked_sub(1)?)?;
    if !inner.contains(&b'\\') {
        return std::str::from_utf8(inner).ok().map(Cow::Borrowed);
    }
    serde_json::from_slice::<String>(raw).ok().map(Cow::Owned)
}

/// A non-negative JSON integer that fits in `u64`; `None` for anything else (floats included).
pub fn as_u64(raw: &[u8]) -> Option<u64> {
    if kind(raw) != Some(Kind::Integer) {
        return None;
    }
    serde_json::from_slice::<u64>(raw).ok()
}

/// Whether a raw value is any JSON integer (signed, any magnitude that serde_json reads as one).
pub fn is_integer(raw: &[u8]) -> bool {
    kind(raw) == Some(Kind::Integer)
}

/// Whether a raw value is a JSON integer literal ≥ 0, of any magnitude. `-0` is not one:
/// serde_json reads it as the float `-0.0`.
pub fn is_non_negative_integer(raw: &[u8]) -> bool {
    is_integer(raw) && raw.first() != Some(&b'-')
}

/// Any JSON number (integer or not) as an `f64`; `None` for anything else.
pub fn as_f64(raw: &[u8]) -> Option<f64> {
    if !matches!(kind(raw), Some(Kind::Integer | Kind::Float)) {
        return None;
    }
    serde_json::from_slice::<f64>(raw).ok()
}

/// The element count of an array, the set of kinds its elements have, and the set of kinds the
/// elements of its array elements have (one level down: token-id lists in a batch).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArrayShape {
    pub len: usize,
    kinds: u8,
    nested: u8,
}

impl ArrayShape {
    /// Whether every element has kind `k` (vacuously true for an empty array).
    pub fn all(&self, k: Kind) -> bool {
        self.kinds & !k.bit() == 0
    }

    /// Whether every element of every array element has kind `k` (vacuously true when there is
    /// no array element or they are empty).
    pub fn all_nested(&self, k: Kind) -> bool {
        self.nested & !k.bit() == 0
    }

    /// Whether some element has kind `k`.
    pub fn any(&self, k: Kind) -> bool {
        self.kinds & k.bit() != 0
    }
}

/// The shape of a JSON array; `None` if `raw` is not an array.
pub fn array_shape(raw: &[u8]) -> Option<ArrayShape> {
    shape_of(raw, true)
}

/// `nested`: also read the element kinds of array elements (one level only, so a deeply nested
/// hostile array costs two walks, not one per level).
fn shape_of(raw: &[u8], nested: bool) -> Option<ArrayShape> {
    if kind(raw) != Some(Kind::Array) {
        return None;
    }
    let mut de = serde_json::Deserializer::from_slice(raw);
    de.deserialize_seq(ShapeVisitor { nested }).ok()
}

/// Calls `each` with the raw bytes of every element of a JSON array, in order; `false` if `raw`
/// is not an array or `each` returned `false` (which stops the walk).
pub fn for_each_element(raw: &[u8], each: impl FnMut(&[u8]) -> bool) -> bool {
    if kind(raw) != Some(Kind::Array) {
        return false;
    }
    let mut de = serde_json::Deserializer::from_slice(raw);
    de.deserialize_seq(EachVisitor { each }).unwrap_or(false)
}

/// Byte ranges of a JSON array's elements, relative to `array`; `None` if it is not an array.
pub fn element_ranges(array: &[u8]) -> Option<Vec<std::ops::Range<usize>>> {
    let base = array.as_ptr() as usize;
    let mut ranges = Vec::new();
    let mut ok = true;
    let walked = for_each_element(array, |el| {
        match (el.as_ptr() as usize).checked_sub(base) {
            Some(start) if start + el.len() <= array.len() => {
                ranges.push(start..start + el.len());
            }
            _ => ok = false,
        }
        ok
    });
    (walked && ok).then_some(ranges)
}

/// Calls `each` once per element of a JSON array, in order, with the raw value of the
/// element's member `key` (last duplicate wins), or `None` when the element is not an object or
/// has no such member. One pass over the array. `false` if `raw` is not an array or `each`
/// returned `false` (which stops the walk).
pub fn for_each_element_member(
    raw: &[u8],
    key: &str,
    mut each: impl FnMut(Option<&[u8]>) -> bool,
) -> bool {
    let at = walk::skip_ws(raw, 0);
    if raw.get(at) != Some(&b'[') {
        return false;
    }
    walk::array(raw, at, |start| {
        let (end, member) = if raw.get(start) == Some(&b'{') {
            let mut found = None;
            let end = walk::object(raw, start, |k, v| {
                if walk::key_is(k, key) {
                    found = Some(v);
                }
            })?;
            (end, found)
        } else {
            (walk::value_end(raw, start)?, None)
        };
        each(member).then_some(end)
    })
    .is_some()
}

/// The raw value of member `key` of a JSON object (last duplicate wins, as in serde_json);
/// `None` if `raw` is not an object or has no such member. Keys are compared unescaped.
pub fn object_get<'a>(raw: &'a [u8], key: &str) -> Option<&'a [u8]> {
    let at = walk::skip_ws(raw, 0);
    if raw.get(at) != Some(&b'{') {
        return None;
    }
    let mut found = None;
    walk::object(raw, at, |k, v| {
        if walk::key_is(k, key) {
            found = Some(v);
        }
    })?;
    found
}

struct ShapeVisitor {
    nested: bool,
}

impl<'de> Visitor<'de> for ShapeVisitor {
    type Value = ArrayShape;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ArrayShape, A::Error> {
        let mut shape = ArrayShape::default();
        while let Some(el) = seq.next_element::<&'de RawValue>()? {
            let el = el.get().as_bytes();
            let k = kind(el).ok_or_else(|| de::Error::custom("bad element"))?;
            if k == Kind::Array && self.nested {
                let inner = shape_of(el, false).ok_or_else(|| de::Error::custom("bad element"))?;
                shape.nested |= inner.kinds;
            }
            shape.kinds |= k.bit();
            shape.len += 1;
        }
        Ok(shape)
    }
}

struct EachVisitor<F> {
    each: F,
}

impl<'de, F: FnMut(&[u8]) -> bool> Visitor<'de> for EachVisitor<F> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON array")
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<bool, A::Error> {
        while let Some(el) = seq.next_element::<&'de RawValue>()? {
            if !(self.each)(el.get().as_bytes()) {
                // Drain the rest so the deserializer ends cleanly.
                while seq.next_element::<de::IgnoredAny>()?.is_some() {}
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Walking the items of a JSON array or object by their text, for the nested reads above.
///
/// serde_json keeps a scratch buffer per deserializer that grows the first time it skips a
/// value nested two levels deep or unescapes a string: one allocation per read of a chat's
/// `messages`. These reads run on every request, so they walk the bytes instead. The text must
/// already be valid JSON (every raw value here comes from a body [`crate::body::scan_object`]
/// validated); on other text they never panic, but their answer means nothing.
pub(crate) use walk::skip_ws;

mod walk {
    use std::borrow::Cow;

    /// Index of the first byte at or after `at` that is not JSON whitespace (space, `\n`,
    /// `\t`, `\r`).
    pub fn skip_ws(raw: &[u8], mut at: usize) -> usize {
        while matches!(raw.get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            at += 1;
        }
        at
    }

    /// Index just past the string whose opening quote is at `at`. Jumps from quote or
    /// backslash to the next (`memchr2`, SIMD): a prompt is mostly string, and a byte-at-a-time
    /// loop made this walk the costliest pass over a 256 KiB body.
    fn string_end(raw: &[u8], at: usize) -> Option<usize> {
        let mut i = at + 1;
        loop {
            i += memchr::memchr2(b'"', b'\\', raw.get(i..)?)?;
            if raw[i] == b'"' {
                return Some(i + 1);
            }
            i += 2;
        }
    }

    /// Index just past the value that starts at `at`.
    pub fn value_end(raw: &[u8], at: usize) -> Option<usize> {
        match raw.get(at)? {
            b'"' => string_end(raw, at),
            b'[' | b'{' => {
                let mut depth = 0usize;
                let mut i = at;
                loop {
                    match raw.get(i)? {
                        b'"' => {
                            i = string_end(raw, i)?;
                            continue;
                        }
                        b'[' | b'{' => depth += 1,
                        b']' | b'}' => {
                            depth -= 1;
                            if depth == 0 {
                                return Some(i + 1);
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
            }
            _ => {
                let mut i = at;
                while raw.get(i).is_some_and(|b| !b",]} \t\n\r".contains(b)) {
                    i += 1;
                }
                (i > at).then_some(i)
            }
        }
    }

    /// Walks the comma-separated items between `raw[at]` (the opening bracket) and `close`;
    /// `item` gets each item's first index and returns the index just past it (`None` stops).
    /// Returns the index just past `close`.
    fn items(
        raw: &[u8],
        at: usize,
        close: u8,
        mut item: impl FnMut(usize) -> Option<usize>,
    ) -> Option<usize> {
        let mut at = skip_ws(raw, at + 1);
        if raw.get(at) == Some(&close) {
            return Some(at + 1);
        }
        loop {
            at = skip_ws(raw, item(at)?);
            match raw.get(at)? {
                b',' => at = skip_ws(raw, at + 1),
                b if *b == close => return Some(at + 1),
                _ => return None,
            }
        }
    }

    /// The elements of the array opening at `at`: `element` as in [`items`].
    pub fn array(
        raw: &[u8],
        at: usize,
        element: impl FnMut(usize) -> Option<usize>,
    ) -> Option<usize> {
        items(raw, at, b']', element)
    }

    /// The members of the object opening at `at`: `member` gets each raw key (quoted) and raw
    /// value, in document order.
    pub fn object<'a>(
        raw: &'a [u8],
        at: usize,
        mut member: impl FnMut(&'a [u8], &'a [u8]),
    ) -> Option<usize> {
        items(raw, at, b'}', |start| {
            let key_end = string_end(raw, start)?;
            let colon = skip_ws(raw, key_end);
            if raw.get(colon) != Some(&b':') {
                return None;
            }
            let value_start = skip_ws(raw, colon + 1);
            let value_end = value_end(raw, value_start)?;
            member(raw.get(start..key_end)?, raw.get(value_start..value_end)?);
            Some(value_end)
        })
    }

    /// Whether a raw (quoted) key is `key` once unescaped. Only a key written with escapes is
    /// unescaped, which allocates.
    pub fn key_is(raw_key: &[u8], key: &str) -> bool {
        match raw_key.get(1..raw_key.len().saturating_sub(1)) {
            Some(inner) if !inner.contains(&b'\\') => inner == key.as_bytes(),
            _ => super::as_str(raw_key).is_some_and(|k: Cow<'_, str>| k == key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_come_from_the_first_byte() {
        assert_eq!(kind(b"null"), Some(Kind::Null));
        assert_eq!(kind(b"false"), Some(Kind::Bool));
        assert_eq!(kind(b"-12"), Some(Kind::Integer));
        assert_eq!(kind(b"1.5"), Some(Kind::Float));
        assert_eq!(kind(b"1e3"), Some(Kind::Float));
        assert_eq!(kind(b"\"s\""), Some(Kind::String));
        assert_eq!(kind(b"[]"), Some(Kind::Array));
        assert_eq!(kind(b"{}"), Some(Kind::Object));
        assert_eq!(kind(b""), None);
        assert_eq!(kind(b"x"), None);
    }

    #[test]
    fn strings_unescape_and_borrow_when_plain() {
        assert!(matches!(as_str(b"\"abc\""), Some(Cow::Borrowed("abc"))));
        assert_eq!(as_str(br#""a\"b\u0063""#).unwrap(), "a\"bc");
        assert_eq!(as_str(b"1"), None);
        assert_eq!(as_str(b"\""), None);
    }

    #[test]
    fn integers_reject_floats_negatives_and_overflow() {
        assert_eq!(as_u64(b"7"), Some(7));
        assert_eq!(as_u64(b"7.0"), None);
        assert_eq!(as_u64(b"-1"), None);
        assert_eq!(as_u64(b"18446744073709551616"), None);
        assert_eq!(as_u64(b"\"7\""), None);
    }

    #[test]
    fn array_shape_counts_and_classifies_elements() {
        let s = array_shape(b"[[1],[2,3]]").unwrap();
        assert_eq!(s.len, 2);
        assert!(s.all(Kind::Array));
        let s = array_shape(b"[1,\"a\"]").unwrap();
        assert!(!s.all(Kind::Integer) && s.any(Kind::String));
        let s = array_shape(b"[]").unwrap();
        assert_eq!(s.len, 0);
        assert!(s.all(Kind::String));
        assert_eq!(array_shape(b"{}"), None);
    }

    #[test]
    fn array_shape_reads_the_kinds_one_level_down() {
        let s = array_shape(b"[[1,2],[],[3]]").unwrap();
        assert!(s.all_nested(Kind::Integer));
        let s = array_shape(b"[[1,\"a\"],[3]]").unwrap();
        assert!(!s.all_nested(Kind::Integer) && !s.all_nested(Kind::String));
        let s = array_shape(b"[[[1]]]").unwrap();
        assert!(s.all_nested(Kind::Array) && !s.all_nested(Kind::Integer));
        assert!(array_shape(b"[1,2]").unwrap().all_nested(Kind::Integer));
    }

    #[test]
    fn for_each_element_visits_in_order_and_stops_early() {
        let mut seen = Vec::new();
        assert!(for_each_element(b"[1, [2], \"x\"]", |e| {
            seen.push(e.to_vec());
            true
        }));
        assert_eq!(seen, [b"1".to_vec(), b"[2]".to_vec(), b"\"x\"".to_vec()]);
        let mut n = 0;
        assert!(!for_each_element(b"[1,2,3]", |_| {
            n += 1;
            n < 2
        }));
        assert_eq!(n, 2);
        assert!(!for_each_element(b"1", |_| true));
    }

    #[test]
    fn non_negative_integers_are_integer_literals_without_a_sign() {
        for ok in ["0", "7", "1234567890123456789012345678901234567890"] {
            assert!(is_non_negative_integer(ok.as_bytes()), "{ok}");
        }
        for bad in ["-1", "-0", "1.0", "1e2", "\"1\"", "true", "null", "[]"] {
            assert!(!is_non_negative_integer(bad.as_bytes()), "{bad}");
        }
    }

    #[test]
    fn numbers_read_as_f64_whatever_their_spelling() {
        assert_eq!(as_f64(b"0"), Some(0.0));
        assert_eq!(as_f64(b"-0.5"), Some(-0.5));
        assert_eq!(as_f64(b"1e2"), Some(100.0));
        assert_eq!(as_f64(b"\"1\""), None);
        assert_eq!(as_f64(b"null"), None);
        assert_eq!(as_f64(b"[1]"), None);
    }

    #[test]
    fn the_walk_is_not_fooled_by_brackets_quotes_or_whitespace_in_strings() {
        let raw = b"[ {\"content\" : \"]}\\\"{[,\\\\\" ,\n\t\"role\" :\"a\" } ,\r\n{\"x\":[{\"role\":1},[]], \"role\":\"b\"},-1.5e3 ,true]";
        let mut roles = Vec::new();
        assert!(for_each_element_member(raw, "role", |m| {
            roles.push(m.map(<[u8]>::to_vec));
            true
        }));
        assert_eq!(
            roles,
            [Some(b"\"a\"".to_vec()), Some(b"\"b\"".to_vec()), None, None]
        );
        let raw = b" {\"a\\\"\":{\"role\":[\"}\"]} , \"role\"\n:\n{ \"k\" : [ ] }\n}";
        assert_eq!(object_get(raw, "role"), Some(&b"{ \"k\" : [ ] }"[..]));
        assert_eq!(object_get(raw, "a\""), Some(&b"{\"role\":[\"}\"]}"[..]));
    }

    #[test]
    fn object_get_finds_the_last_member_by_unescaped_key() {
        let raw = br#"{"a":1,"r\u006fle":"x","b":{"role":2},"role" : [ 3 ]}"#;
        assert_eq!(object_get(raw, "role"), Some(&b"[ 3 ]"[..]));
        assert_eq!(object_get(raw, "a"), Some(&b"1"[..]));
        assert_eq!(object_get(raw, "c"), None);
        assert_eq!(object_get(br#"{"role":"x"}"#, "role"), Some(&br#""x""#[..]));
        for not_object in [&b"[1]"[..], b"\"role\"", b"1", b"null", b""] {
            assert_eq!(object_get(not_object, "role"), None);
        }
    }

    #[test]
    fn for_each_element_member_reads_each_element_once() {
        let raw =
            br#"[{"role":"user","content":[{"role":7}]}, 1, {"content":"x"}, null, {"role":null}]"#;
        let mut seen = Vec::new();
        assert!(for_each_element_member(raw, "role", |m| {
            seen.push(m.map(<[u8]>::to_vec));
            true
        }));
        assert_eq!(
            seen,
            [
                Some(br#""user""#.to_vec()),
                None,
                None,
                None,
                Some(b"null".to_vec())
            ]
        );
        let mut n = 0;
        assert!(!for_each_element_member(raw, "role", |m| {
            n += 1;
            m.is_some()
        }));
        assert_eq!(n, 2);
        assert!(for_each_element_member(b"[]", "role", |_| false));
        assert!(for_each_element_member(b" [ ]", "role", |_| false));
        assert!(!for_each_element_member(br#"{"role":"x"}"#, "role", |_| {
            true
        }));
    }
}
