//! Reading typed facts out of one raw JSON value (bytes from [`crate::body::TopLevel::get`]):
//! its kind, a bool, a string, an integer, and the element kinds of an array, without building a
//! `serde_json::Value`. Inputs are expected to be valid JSON; anything else reads as "wrong type".

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

/// The element count of an array and the set of kinds its elements have.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArrayShape {
    pub len: usize,
    kinds: u8,
}

impl ArrayShape {
    /// Whether every element has kind `k` (vacuously true for an empty array).
    pub fn all(&self, k: Kind) -> bool {
        self.kinds & !k.bit() == 0
    }

    /// Whether some element has kind `k`.
    pub fn any(&self, k: Kind) -> bool {
        self.kinds & k.bit() != 0
    }
}

/// The shape of a JSON array; `None` if `raw` is not an array.
pub fn array_shape(raw: &[u8]) -> Option<ArrayShape> {
    if kind(raw) != Some(Kind::Array) {
        return None;
    }
    let mut de = serde_json::Deserializer::from_slice(raw);
    de.deserialize_seq(ShapeVisitor).ok()
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

struct ShapeVisitor;

impl<'de> Visitor<'de> for ShapeVisitor {
    type Value = ArrayShape;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ArrayShape, A::Error> {
        let mut shape = ArrayShape::default();
        while let Some(el) = seq.next_element::<&'de RawValue>()? {
            let k = kind(el.get().as_bytes()).ok_or_else(|| de::Error::custom("bad element"))?;
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
}
