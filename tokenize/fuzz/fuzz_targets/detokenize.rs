//! `IncrementalDetokenizer` over arbitrary token ids of the byte-level fixture.
//!
//! Input: c0 (bit0: skip_special_tokens; bits 1..: flush every k-th token, 0 = never), then
//! token ids as little-endian u16 pairs (reduced into the vocabulary).
//!
//! Properties: without mid-stream flushes the pieces concatenate to `Tokenizer::decode` of all
//! the ids (with them, wherever neither side shows U+FFFD); the decoder never holds more than
//! twice its give-up limit of tokens.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdgate_tokenize::IncrementalDetokenizer;
use pdgate_tokenize_fuzz::{chatml, token_ids};

fuzz_target!(|data: &[u8]| {
    let Some((&c0, rest)) = data.split_first() else {
        return;
    };
    let skip = c0 & 1 == 1;
    let flush_every = usize::from(c0 >> 1);
    let t = chatml();
    let ids = token_ids(rest);
    let mut d = IncrementalDetokenizer::new(t.clone(), skip);
    let mut out = String::new();
    for (i, &id) in ids.iter().enumerate() {
        d.push(id, &mut out).unwrap();
        assert!(d.held_tokens() <= 128, "window grew to {}", d.held_tokens());
        if flush_every > 0 && (i + 1) % flush_every == 0 {
            d.flush(&mut out).unwrap();
        }
    }
    d.flush(&mut out).unwrap();
    if flush_every == 0 {
        assert_eq!(out, t.decode(&ids, skip).unwrap(), "ids {ids:?}");
    } else {
        // Flushing mid-stream shows incomplete characters early, so only the valid text agrees.
        let full = t.decode(&ids, skip).unwrap();
        if !full.contains('\u{FFFD}') && !out.contains('\u{FFFD}') {
            assert_eq!(out, full);
        }
    }
});
