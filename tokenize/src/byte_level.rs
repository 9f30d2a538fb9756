//! Byte-level BPE (GPT-2's scheme, used by Llama 3, Qwen, GPT-OSS, DeepSeek and most current
//! models): every vocabulary entry stands for raw bytes, spelled with one printable character per
//! byte. For such tokenizers a token's text contribution does not depend on its neighbours, so
//! the stream decoder can work on bytes: exact, a few nanoseconds per token, and never more than
//! three bytes held (an incomplete character).

use tokenizers::DecoderWrapper;

/// GPT-2's byte-to-unicode map: printable bytes stand for themselves, the others are moved to
/// code points from U+0100 so every token is printable text.
pub(crate) fn byte_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(256 + next).expect("U+0100.. are chars");
            next += 1;
            c
        };
    }
    table
}

/// Each token id's bytes and whether it is a special token, for a tokenizer whose decoder is
/// exactly `ByteLevel`.
#[derive(Debug)]
pub(crate) struct ByteTable {
    /// `bytes[offsets[id]..offsets[id + 1]]` are the bytes of `id`.
    offsets: Vec<u32>,
    bytes: Vec<u8>,
    /// Ids the tokenizer does not know (skipped by `decode`) or special added tokens.
    known: Vec<bool>,
    special: Vec<bool>,
}

impl ByteTable {
    /// The table, when `tokenizer` decodes with `ByteLevel` alone (else `None`: other decoders
    /// depend on neighbouring tokens).
    pub(crate) fn build(tokenizer: &tokenizers::Tokenizer) -> Option<Self> {
        if !matches!(tokenizer.get_decoder(), Some(DecoderWrapper::ByteLevel(_))) {
            return None;
        }
        let mut char_to_byte = [None::<u8>; 0x144];
        for (b, c) in byte_to_unicode().iter().enumerate() {
            char_to_byte[*c as usize] = Some(b as u8);
        }
        let vocab = tokenizer.get_vocab(true);
        let max_id = vocab.values().copied().max()?;
        let n = max_id as usize + 1;
        let mut table = Self {
            offsets: Vec::with_capacity(n + 1),
            bytes: Vec::new(),
            known: vec![false; n],
            special: vec![false; n],
        };
        let added = tokenizer.get_added_vocabulary();
        for id in 0..=max_id {
            table.offsets.push(table.bytes.len() as u32);
            // What `decode` looks up: the added token's content, else the model's piece.
            let Some(piece) = tokenizer.id_to_token(id) else {
                continue;
            };
            table.known[id as usize] = true;
            table.special[id as usize] = added.is_special_token(&piece);
            // ByteLevel's rule: every char mapped back to its byte, or (when one is not in the
            // map) the piece's own UTF-8.
            let mapped: Option<Vec<u8>> = piece
                .chars()
                .map(|c| char_to_byte.get(c as usize).copied().flatten())
                .collect();
            match mapped {
                Some(bytes) => table.bytes.extend_from_slice(&bytes),
                None => table.bytes.extend_from_slice(piece.as_bytes()),
            }
        }
        table.offsets.push(table.bytes.len() as u32);
        Some(table)
    }

    /// The bytes `id` contributes to a decode, `None` when `decode` would skip it.
    pub(crate) fn token_bytes(&self, id: u32, skip_special_tokens: bool) -> Option<&[u8]> {
        let i = id as usize;
        if !*self.known.get(i)? || (skip_special_tokens && self.special[i]) {
            return None;
        }
        Some(&self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize])
    }
}

/// Moves the complete part of `pending` to `out` exactly as `String::from_utf8_lossy` would
/// decode it (one U+FFFD per invalid sequence), keeping an incomplete character at the end
/// unless `at_end`, when it too becomes U+FFFD.
pub(crate) fn drain_utf8(pending: &mut Vec<u8>, out: &mut String, at_end: bool) {
    let mut start = 0;
    while start < pending.len() {
        match std::str::from_utf8(&pending[start..]) {
            Ok(s) => {
                out.push_str(s);
                start = pending.len();
            }
            Err(e) => {
                let valid = e.valid_up_to();
                let text = std::str::from_utf8(&pending[start..start + valid])
                    .expect("valid_up_to is valid UTF-8");
                out.push_str(text);
                match e.error_len() {
                    Some(n) => {
                        out.push('\u{FFFD}');
                        start += valid + n;
                    }
                    None if at_end => {
                        out.push('\u{FFFD}');
                        start = pending.len();
                    }
                    None => {
                        start += valid;
                        break;
                    }
                }
            }
        }
    }
    pending.drain(..start);
}

#[cfg(test)]
mod tests {
    use super::drain_utf8;

    #[test]
    fn drains_like_from_utf8_lossy_and_keeps_an_incomplete_end() {
        for input in [
            &b"abc"[..],
            b"a\xE4\xB8",
            b"a\xE4\xB8\xADb",
            b"\x80\x80x",
            b"\xE4x\xF0\x9F\x98",
            b"\xF0\x9F\x98\x80",
            b"\xED\xA0\x80",
        ] {
            let mut pending = input.to_vec();
            let mut out = String::new();
            drain_utf8(&mut pending, &mut out, false);
            assert!(pending.len() <= 3, "{input:?}");
            drain_utf8(&mut pending, &mut out, true);
            assert!(pending.is_empty());
            assert_eq!(out, String::from_utf8_lossy(input), "{input:?}");
        }
        let mut pending = b"ok\xE4\xB8".to_vec();
        let mut out = String::new();
        drain_utf8(&mut pending, &mut out, false);
        assert_eq!((out.as_str(), pending.as_slice()), ("ok", &b"\xE4\xB8"[..]));
    }
}
