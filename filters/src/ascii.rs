//! Byte classes looked for eight bytes at a step, for text the gateway checks or writes on every
//! request (a leg's path and host, a request id, JSON strings). One place for the word tricks and
//! why they are exact.
//!
//! In a `u64` of eight bytes, [`any_below`] is non-zero exactly when some byte is under `n`
//! (`n` ≤ 128): such a byte borrows into its top bit, and a borrow that reaches a byte above
//! only starts at one that was under `n` itself, so the answer for the word as a whole is exact.
//! Bytes from 0x80 up never count. A given byte value is a zero byte once the word is xored with
//! copies of it.

/// `0x0101…01`: a byte value times this is that byte in every place of a word.
const ONES: u64 = u64::from_ne_bytes([1; 8]);
/// The top bit of every byte.
const HIGH: u64 = ONES * 0x80;

/// Non-zero exactly when some byte of `w` is under `n` (`n` ≤ 128; see the module).
const fn any_below(w: u64, n: u8) -> u64 {
    w.wrapping_sub(ONES * n as u64) & !w & HIGH
}

/// Non-zero exactly when some byte of `w` is `b`.
const fn any_equal(w: u64, b: u8) -> u64 {
    any_below(w ^ (ONES * b as u64), 1)
}

/// Whether `b` must be escaped in a JSON string: a quote, a backslash or a control character.
pub(crate) const fn needs_json_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// Whether some byte of `w` [`needs_json_escape`], all eight at once.
pub(crate) const fn word_needs_json_escape(w: u64) -> bool {
    any_below(w, 0x20) | any_equal(w, b'"') | any_equal(w, b'\\') != 0
}

/// Whether every byte of `w` is visible ASCII (0x21 to 0x7e). A byte under 0x21 is
/// [`any_below`]; a byte from 0x80 up has its top bit; 0x7f is the one below that which reaches
/// it when its low seven bits are incremented (which never carries into the next byte).
const fn word_is_visible(w: u64) -> bool {
    (any_below(w, 0x21) | w | ((w & !HIGH) + ONES)) & HIGH == 0
}

/// Whether every byte of `bytes` is visible ASCII (0x21 to 0x7e: no space, control byte or
/// non-ASCII byte: nothing that could end or bend a request line or a header value); `true` for
/// no bytes.
pub fn all_visible(bytes: &[u8]) -> bool {
    let mut words = bytes.chunks_exact(8);
    words.all(|w| word_is_visible(u64::from_le_bytes(w.try_into().expect("eight bytes"))))
        && words.remainder().iter().all(u8::is_ascii_graphic)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each byte value at each place of a word, among fillers from both sides of each bound (a
    /// borrow or carry from one byte must neither hide nor invent another).
    fn each_word(mut check: impl FnMut([u8; 8])) {
        for filler in [
            b'a', b' ', b'!', b'~', b'"', b'\\', 0x00, 0x1f, 0x7f, 0x80, 0xff,
        ] {
            for place in 0..8 {
                for b in 0..=255u8 {
                    let mut word = [filler; 8];
                    word[place] = b;
                    check(word);
                }
            }
        }
    }

    #[test]
    fn the_json_escape_check_is_exact_at_every_place_of_a_word() {
        each_word(|word| {
            let want = word.iter().any(|&x| needs_json_escape(x));
            assert_eq!(
                word_needs_json_escape(u64::from_le_bytes(word)),
                want,
                "{word:?}"
            );
        });
    }

    #[test]
    fn the_visible_check_is_exact_at_every_place_of_a_word() {
        each_word(|word| {
            let want = word.iter().all(u8::is_ascii_graphic);
            assert_eq!(word_is_visible(u64::from_le_bytes(word)), want, "{word:?}");
        });
    }

    #[test]
    fn all_visible_looks_at_the_words_and_the_bytes_after_them() {
        assert!(all_visible(b""));
        for len in 1..=20 {
            for place in 0..len {
                for bad in [" ", "\r", "\n", "\u{7f}", "é"] {
                    let mut text = "a".repeat(len);
                    assert!(all_visible(text.as_bytes()));
                    text.replace_range(place..=place, bad);
                    assert!(!all_visible(text.as_bytes()), "{text:?}");
                }
            }
        }
        assert!(all_visible(b"/v1/chat/completions"));
        assert!(all_visible(b"127.0.0.1:30000"));
    }
}
