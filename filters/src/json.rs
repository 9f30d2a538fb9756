//! Writing JSON text by hand: strings (escaped), integers, and the few fixed-shape objects the
//! gateway mints. Everything the crate emits goes through here, so escaping lives in one place.

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
        if word_needs_escape(u64::from_le_bytes(word.try_into().expect("eight bytes"))) {
            break;
        }
        at += 8;
    }
    let hit = bytes[at..]
        .iter()
        .position(|&b| b < 0x20 || b == b'"' || b == b'\\')?;
    Some(at + hit)
}

/// Whether any byte of `w` must be escaped. `below(v, n)` is non-zero exactly when some byte of
/// `v` is under `n` (n ≤ 128): such a byte borrows into its top bit, and a borrow that reaches
/// a byte above only starts at one that was under `n` itself, so the answer as a whole is
/// exact; bytes from 0x80 up (UTF-8 sequences) never count. A quote or a backslash is a zero
/// byte once xored with copies of it.
const fn word_needs_escape(w: u64) -> bool {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const fn below(v: u64, n: u8) -> u64 {
        v.wrapping_sub(ONES * n as u64) & !v & (ONES * 0x80)
    }
    below(w, 0x20) | below(w ^ (ONES * b'"' as u64), 1) | below(w ^ (ONES * b'\\' as u64), 1) != 0
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
    fn the_word_check_finds_exactly_the_bytes_to_escape() {
        let escaped = |b: u8| b < 0x20 || b == b'"' || b == b'\\';
        // Each byte value at each place of a word, among fillers that are escaped or not, from
        // both sides of 0x20 and of 0x80 (a borrow from a hit must not hide or invent another).
        for filler in [b'a', b' ', 0x1f, 0x21, b'"', 0x7f, 0x80, 0xff, 0x00] {
            for place in 0..8 {
                for b in 0..=255u8 {
                    let mut word = [filler; 8];
                    word[place] = b;
                    let want = word.iter().any(|&x| escaped(x));
                    assert_eq!(
                        word_needs_escape(u64::from_le_bytes(word)),
                        want,
                        "{word:?}"
                    );
                }
            }
        }
        // And as push_string_contents uses it: every place of longer texts, matching serde_json.
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
