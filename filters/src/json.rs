//! Writing JSON text by hand: strings (escaped), integers, and the few fixed-shape objects the
//! gateway mints. Everything the crate emits goes through here, so escaping lives in one place.

use crate::ascii::{needs_json_escape, word_needs_json_escape};

/// Appends `s` as a JSON string literal (with quotes), escaping `"`, `\` and control characters.
pub fn push_string(out: &mut Vec<u8>, s: &str) {
    out.reserve(s.len() + 2);
    out.push(b'"');
    push_string_contents(out, s);
    out.push(b'"');
}

/// Appends the escaped contents of `s` without the surrounding quotes. Escaping is per
/// character, so the contents of `a` then of `b` are the contents of `a + b`: a growing string
/// can be escaped once, piece by piece.
pub fn push_string_contents(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    let mut start = 0;
    while let Some(i) = next_to_escape(bytes, start) {
        out.extend_from_slice(&bytes[start..i]);
        let b = bytes[i];
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            _ => {
                push_control_escape(out, b);
                start = i + 1;
                continue;
            }
        };
        out.extend_from_slice(escape);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

/// Where the first byte at or after `from` lies that a JSON string must escape (a quote, a
/// backslash or a control character), looked for eight bytes at a step: the text written is
/// mostly field names and plain words, which then cost a few instructions a word, not a
/// branch a byte.
fn next_to_escape(bytes: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(word) = bytes.get(at..at + 8) {
        if word_needs_json_escape(u64::from_le_bytes(word.try_into().expect("eight bytes"))) {
            break;
        }
        at += 8;
    }
    let hit = bytes[at..].iter().position(|&b| needs_json_escape(b))?;
    Some(at + hit)
}

fn push_control_escape(out: &mut Vec<u8>, b: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.extend_from_slice(b"\\u00");
    out.push(HEX[usize::from(b >> 4)]);
    out.push(HEX[usize::from(b & 0xf)]);
}

/// `n` as decimal text, written into `buf` (no allocation): for header values and metric
/// labels. Where bytes will do (a JSON body, a request head), [`decimal_bytes`] skips the UTF-8
/// check.
pub fn decimal(n: u64, buf: &mut [u8; 20]) -> &str {
    std::str::from_utf8(decimal_bytes(n, buf)).unwrap_or_default()
}

/// `n`'s decimal digits, written into the end of `buf`, two a step (a bootstrap room has 19).
pub fn decimal_bytes(n: u64, buf: &mut [u8; 20]) -> &[u8] {
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
        2021222324252627282930313233343536373839\
        4041424344454647484950515253545556575859\
        6061626364656667686970717273747576777879\
        8081828384858687888990919293949596979899";
    let mut at = buf.len();
    let mut rest = n;
    while rest >= 100 {
        let pair = usize::from((rest % 100) as u8) * 2;
        rest /= 100;
        at -= 2;
        buf[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    if rest >= 10 {
        let pair = usize::from(rest as u8) * 2;
        at -= 2;
        buf[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    } else {
        at -= 1;
        buf[at] = b'0' + rest as u8;
    }
    &buf[at..]
}

/// Appends `n` as a JSON integer (exact decimal, never a float).
pub fn push_u64(out: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 20];
    out.extend_from_slice(decimal_bytes(n, &mut digits));
}

/// A JSON string literal for `s`, as a fresh buffer.
pub fn string(s: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len() + 2);
    push_string(&mut out, s);
    out
}

/// A JSON integer for `n`, as a fresh buffer.
pub fn u64_text(n: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(20);
    push_u64(&mut out, n);
    out
}

/// Builds a flat JSON object `{"k":<raw>,…}` from trusted raw values, in order.
pub fn object(fields: &[(&str, &[u8])]) -> Vec<u8> {
    let cap = 2 + fields
        .iter()
        .map(|(k, v)| k.len() + v.len() + 4)
        .sum::<usize>();
    let mut out = Vec::with_capacity(cap);
    out.push(b'{');
    for (i, (k, v)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_string(&mut out, k);
        out.push(b':');
        out.extend_from_slice(v);
    }
    out.push(b'}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_round_trip_through_serde_json() {
        for s in [
            "",
            "plain",
            "q\"uote",
            "back\\slash",
            "nl\n cr\r tab\t",
            "\u{0}\u{1f}\u{7f}",
            "héllo ☃ 🎉",
            "\u{8}\u{c}",
        ] {
            let text = string(s);
            let back: String = serde_json::from_slice(&text).unwrap();
            assert_eq!(back, s);
        }
    }

    #[test]
    fn strings_escaped_at_every_place_match_serde_json() {
        // push_string_contents with its word check (crate::ascii): every place of texts that
        // span words and the bytes after them.
        for len in 0..40 {
            for place in 0..len {
                for hit in ["\"", "\\", "\n", "\u{1}", "é"] {
                    let mut text = "x".repeat(len);
                    text.replace_range(place..=place, hit);
                    assert_eq!(
                        string(&text),
                        serde_json::to_vec(&text).unwrap(),
                        "{text:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn contents_of_pieces_concatenate_to_the_contents_of_the_whole() {
        let pieces = ["a\"", "\\b\n", "\u{1}é", ""];
        let mut out = b"\"".to_vec();
        for p in pieces {
            push_string_contents(&mut out, p);
        }
        out.push(b'"');
        assert_eq!(out, string(&pieces.concat()));
    }

    #[test]
    fn integers_are_exact_decimal() {
        for n in [0u64, 7, 10, 9_223_372_036_854_775_807, u64::MAX] {
            assert_eq!(u64_text(n), n.to_string().into_bytes());
        }
        // Every length, either side of each power of ten, and a run of small numbers.
        let mut p = 1u64;
        let mut cases: Vec<u64> = (0..=1_000).collect();
        while let Some(next) = p.checked_mul(10) {
            cases.extend([p - 1, p, p + 1, next / 2]);
            p = next;
        }
        cases.extend([p - 1, p, p + 1]);
        let mut digits = [0u8; 20];
        for n in cases {
            assert_eq!(decimal(n, &mut digits), n.to_string());
            assert_eq!(decimal_bytes(n, &mut digits), n.to_string().as_bytes());
        }
    }

    #[test]
    fn object_is_valid_json_in_order() {
        let o = object(&[("b", b"1"), ("a", b"\"x\"")]);
        assert_eq!(o, br#"{"b":1,"a":"x"}"#);
    }
}
