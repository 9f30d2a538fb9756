//! The common case of [`super::scan_object`] in one walk of our own: a body that
//! `serde_json::Value` accepts and whose top level is an object. It validates by the same rules
//! (UTF-8, syntax, escapes and surrogate pairs, control characters, number range, nesting limit,
//! trailing characters) and records the top-level entries as it passes them; the prompt's long
//! strings are skipped a block at a time, not a byte at a time.
//!
//! It only ever says yes for a body serde_json accepts: a number whose range could matter is
//! handed to serde_json itself. Anything it does not accept (a refused body, a non-object, a
//! number serde_json refuses) gives `None`, and the caller's serde_json scan answers, with its
//! messages. A body it refused that serde_json would accept would only be slower, never wrong.

use super::{Entry, Key};
use crate::value;

/// serde_json's nesting limit: the 128th nested array or object is refused.
const MAX_NESTING: usize = 127;

/// A number without an exponent and with at most this many integer digits is below 1e308, so
/// finite whatever its digits: valid without a range check.
const PLAIN_NUMBER_DIGITS: usize = 308;

/// The entries of `body`'s top-level object when `body` is valid JSON and an object; `None`
/// otherwise (the caller's reference scan then says why).
pub(super) fn object_entries(body: &[u8]) -> Option<Vec<Entry>> {
    let mut walk = Walk { b: body, at: 0 };
    walk.ws();
    if walk.peek()? != b'{' {
        return None;
    }
    // Room for 8, as the two-pass scan reserves: most requests have no more top-level keys,
    // and the list lives as long as the request (an open stream).
    let mut entries = Vec::with_capacity(8);
    walk.object(1, Some(&mut entries))?;
    walk.ws();
    (walk.at == body.len()).then_some(entries)
}

struct Walk<'b> {
    b: &'b [u8],
    at: usize,
}

impl Walk<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.at).copied()
    }

    /// Skips JSON's whitespace.
    fn ws(&mut self) {
        self.at = value::skip_ws(self.b, self.at);
    }

    /// Steps over `byte`, or fails.
    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// One value at nesting `nesting` (the containers open around it).
    fn value(&mut self, nesting: usize) -> Option<()> {
        match self.peek()? {
            b'"' => self.string(),
            b'{' => self.object(nesting + 1, None),
            b'[' => self.array(nesting + 1),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at + word.len();
        (self.b.get(self.at..end)? == word).then(|| self.at = end)
    }

    /// An object at `nesting` (this one counted); its entries go to `entries` when given.
    fn object(&mut self, nesting: usize, mut entries: Option<&mut Vec<Entry>>) -> Option<()> {
        let mut more = self.open(nesting, b'}')?;
        while more {
            if self.peek()? != b'"' {
                return None;
            }
            let key_start = self.at;
            self.string()?;
            let key_end = self.at;
            self.ws();
            self.eat(b':')?;
            self.ws();
            let value_start = self.at;
            self.value(nesting)?;
            if let Some(entries) = entries.as_deref_mut() {
                let text = &self.b[key_start..key_end];
                let inner = &text[1..text.len() - 1];
                let key = if inner.contains(&b'\\') {
                    Key::new(&value::as_str(text)?)
                } else {
                    Key::from_unescaped(inner)?
                };
                entries.push(Entry {
                    key,
                    key_start,
                    value: value_start..self.at,
                });
            }
            more = self.next(b'}')?;
        }
        Some(())
    }

    fn array(&mut self, nesting: usize) -> Option<()> {
        let mut more = self.open(nesting, b']')?;
        while more {
            self.value(nesting)?;
            more = self.next(b']')?;
        }
        Some(())
    }

    /// Steps into a container at `nesting` (refused past serde_json's limit); whether a member
    /// follows (false: it closed at once with `close`).
    fn open(&mut self, nesting: usize, close: u8) -> Option<bool> {
        if nesting > MAX_NESTING {
            return None;
        }
        self.at += 1;
        self.ws();
        if self.peek()? == close {
            self.at += 1;
            return Some(false);
        }
        Some(true)
    }

    /// After a member: `,` and another member follows (true), or the container's `close`.
    fn next(&mut self, close: u8) -> Option<bool> {
        self.ws();
        match self.peek()? {
            b',' => {
                self.at += 1;
                self.ws();
                Some(true)
            }
            c if c == close => {
                self.at += 1;
                Some(false)
            }
            _ => None,
        }
    }

    /// A string from its opening quote.
    ///
    /// Its text must be UTF-8. Outside strings only ASCII is valid JSON, and a character
    /// cannot straddle a quote, a backslash or a control byte (ASCII, never part of a longer
    /// sequence), so checking each stretch of text between those is checking the string as
    /// serde_json does (raw text and decoded escapes together). ASCII text needs no check.
    fn string(&mut self) -> Option<()> {
        self.at += 1;
        loop {
            self.at += text_run::<true>(&self.b[self.at..]);
            match self.peek()? {
                b'"' => {
                    self.at += 1;
                    return Some(());
                }
                b'\\' => self.escape()?,
                0x80.. => {
                    let len = text_run::<false>(&self.b[self.at..]);
                    std::str::from_utf8(&self.b[self.at..self.at + len]).ok()?;
                    self.at += len;
                }
                // A control character.
                _ => return None,
            }
        }
    }

    /// An escape from its backslash. A `\u` escape of a UTF-16 surrogate must be a leading one
    /// followed at once by a `\u` trailing one (serde_json refuses a lone one either way).
    fn escape(&mut self) -> Option<()> {
        let kind = *self.b.get(self.at + 1)?;
        self.at += 2;
        match kind {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(()),
            b'u' => match self.hex4()? {
                0xD800..=0xDBFF => {
                    self.eat(b'\\')?;
                    self.eat(b'u')?;
                    matches!(self.hex4()?, 0xDC00..=0xDFFF).then_some(())
                }
                0xDC00..=0xDFFF => None,
                _ => Some(()),
            },
            _ => None,
        }
    }

    fn hex4(&mut self) -> Option<u16> {
        let digits = self.b.get(self.at..self.at + 4)?;
        let mut n = 0u16;
        for &d in digits {
            n = n << 4 | u16::from(char::from(d).to_digit(16)? as u8);
        }
        self.at += 4;
        Some(n)
    }

    /// A number by JSON's grammar; one whose magnitude could overflow an `f64` (an exponent,
    /// or more than [`PLAIN_NUMBER_DIGITS`] integer digits) must also parse in serde_json.
    fn number(&mut self) -> Option<()> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        let int_digits = match self.peek()? {
            b'0' => {
                self.at += 1;
                1
            }
            b'1'..=b'9' => self.digits(),
            _ => return None,
        };
        let mut plain = int_digits <= PLAIN_NUMBER_DIGITS;
        if self.peek() == Some(b'.') {
            self.at += 1;
            if self.digits() == 0 {
                return None;
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            if self.digits() == 0 {
                return None;
            }
            plain = false;
        }
        if !plain {
            serde_json::from_slice::<serde_json::Number>(&self.b[start..self.at]).ok()?;
        }
        Some(())
    }

    /// Steps over ASCII digits; how many.
    fn digits(&mut self) -> usize {
        let n = self.b[self.at..]
            .iter()
            .take_while(|d| d.is_ascii_digit())
            .count();
        self.at += n;
        n
    }
}

/// Whether `c` ends a run of string text: a quote, a backslash, a control character, and
/// when `ASCII` any byte of a multi-byte character.
fn ends<const ASCII: bool>(c: u8) -> bool {
    (c < 0x20) | (c == b'"') | (c == b'\\') | (ASCII & (c >= 0x80))
}

/// The bytes of `word` (8, little-endian) that end a run, as each byte's high bit. Exact up to
/// the first such byte (a borrow can only mark bytes above a marked one), which is all the
/// caller reads.
fn word_ends<const ASCII: bool>(word: &[u8]) -> u64 {
    const ONES: u64 = u64::MAX / 255;
    let w = u64::from_le_bytes(word.try_into().unwrap_or_default());
    let ctrl = w.wrapping_sub(ONES * 0x20) & !w;
    let q = w ^ (ONES * u64::from(b'"'));
    let quote = q.wrapping_sub(ONES) & !q;
    let b = w ^ (ONES * u64::from(b'\\'));
    let backslash = b.wrapping_sub(ONES) & !b;
    let wide = if ASCII { w } else { 0 };
    (ctrl | quote | backslash | wide) & (ONES << 7)
}

/// How many bytes at the start of `s` are string text (and ASCII, when `ASCII`). Prose stops
/// every few words (a line break, a quote, an accent), so the first 32 bytes go a word (8
/// bytes) at a time; a long run then goes in blocks of 32 bytes tested at once (branch-free
/// byte tests the compiler turns into vector compares), and the block that has the end is
/// searched a word at a time.
fn text_run<const ASCII: bool>(s: &[u8]) -> usize {
    const WORD: usize = 8;
    const BLOCK: usize = 32;
    let in_words = |from: usize, to: usize| {
        let mut at = from;
        while at + WORD <= to {
            let hits = word_ends::<ASCII>(&s[at..at + WORD]);
            if hits != 0 {
                return Ok(at + hits.trailing_zeros() as usize / 8);
            }
            at += WORD;
        }
        Err(at)
    };
    let mut at = match in_words(0, s.len().min(BLOCK)) {
        Ok(end) => return end,
        Err(at) => at,
    };
    while at + BLOCK <= s.len() {
        let hit = s[at..at + BLOCK]
            .iter()
            .fold(0u8, |acc, &c| acc | u8::from(ends::<ASCII>(c)));
        if hit != 0 {
            if let Ok(end) = in_words(at, at + BLOCK) {
                return end;
            }
        }
        at += BLOCK;
    }
    at + s[at..]
        .iter()
        .position(|&c| ends::<ASCII>(c))
        .unwrap_or(s.len() - at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_run_stops_at_the_first_byte_that_ends_it_anywhere_in_a_block() {
        for len in [0usize, 1, 31, 32, 33, 64, 100] {
            let text = vec![b'a'; len];
            assert_eq!(text_run::<true>(&text), len);
            assert_eq!(text_run::<false>(&text), len);
            for at in 0..len {
                for special in [b'"', b'\\', 0x00, 0x1f, b'\n'] {
                    let mut t = text.clone();
                    t[at] = special;
                    assert_eq!(text_run::<true>(&t), at, "len {len} at {at} {special:#x}");
                    assert_eq!(text_run::<false>(&t), at, "len {len} at {at} {special:#x}");
                }
                let mut t = text.clone();
                t[at] = 0xc3;
                assert_eq!(text_run::<true>(&t), at, "len {len} at {at}");
                assert_eq!(text_run::<false>(&t), len, "len {len} at {at}");
            }
        }
        let text = "é ü 中 0x20 ~\u{7f}\"".as_bytes();
        assert_eq!(text_run::<false>(text), text.len() - 1);
        assert_eq!(text_run::<true>(&text[9..]), 8);
    }

    #[test]
    fn numbers_follow_json_grammar_and_serde_json_range() {
        let ok: &[&str] = &[
            "0",
            "-0",
            "1",
            "-12",
            "1.5",
            "0.0001",
            "1e5",
            "1E+5",
            "1e-400",
            "-2.5e-3",
            "1.7976931348623157e308",
        ];
        let bad: &[&str] = &[
            "01", "-", "1.", ".5", "1e", "1e+", "+1", "1e400", "-1e400", "0x1", "1.e3",
        ];
        for n in ok {
            let body = format!(r#"{{"n":{n}}}"#);
            assert!(object_entries(body.as_bytes()).is_some(), "{n}");
        }
        for n in bad {
            let body = format!(r#"{{"n":{n}}}"#);
            assert!(object_entries(body.as_bytes()).is_none(), "{n}");
            assert!(
                serde_json::from_str::<serde_json::Value>(&body).is_err(),
                "{n}"
            );
        }
        let long = format!(r#"{{"n":{}}}"#, "9".repeat(309));
        assert_eq!(
            object_entries(long.as_bytes()).is_some(),
            serde_json::from_str::<serde_json::Value>(&long).is_ok()
        );
    }

    #[test]
    fn escapes_and_surrogates_follow_serde_json() {
        for s in [
            r#"\ud83d\ude00"#,
            r#"\u00e9\n\t\"\\\/\b\f\r"#,
            r#"\uD83D\uDE00"#,
            r#"\ud800"#,
            r#"\udc00"#,
            r#"\ud800\u0041"#,
            r#"\ud800\ud800"#,
            r#"\ud800x"#,
            r#"\x"#,
            r#"\u12"#,
            r#"\u12g4"#,
            "a\u{1}b",
            "tab\there",
        ] {
            let body = format!(r#"{{"s":"{s}"}}"#);
            let want = serde_json::from_str::<serde_json::Value>(&body).is_ok();
            assert_eq!(object_entries(body.as_bytes()).is_some(), want, "{s}");
        }
    }

    #[test]
    fn nesting_stops_where_serde_json_stops() {
        for depth in [125usize, 126, 127, 128] {
            let body = format!("{{\"a\":{}{}}}", "[".repeat(depth), "]".repeat(depth));
            let want = serde_json::from_str::<serde_json::Value>(&body).is_ok();
            assert_eq!(
                object_entries(body.as_bytes()).is_some(),
                want,
                "depth {depth}"
            );
        }
        assert!(object_entries(format!("{{\"a\":{}", "[".repeat(100_000)).as_bytes()).is_none());
    }

    #[test]
    fn invalid_utf8_is_refused() {
        assert!(object_entries(b"{\"a\":\"\xff\"}").is_none());
        assert!(object_entries(b"{\"a\xc3\":1}").is_none());
        assert!(object_entries(b"{\"a\":\"\xc3\\n\xa9\"}").is_none());
        assert!(object_entries(b"{\"a\":\"\xed\xa0\x80\"}").is_none());
        assert!(object_entries(b"{\"a\":1}\xc3\xa9").is_none());
        assert!(object_entries(b"\xef\xbb\xbf{\"a\":1}").is_none());
        let body = "{\"é\":\"中文 text\\n\\\"more\\\" ü\"}";
        let entries = object_entries(body.as_bytes()).unwrap();
        assert_eq!(entries[0].key, "é");
        assert!(serde_json::from_str::<serde_json::Value>(body).is_ok());
    }
}
