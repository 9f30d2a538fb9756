//! Property tests: encode/decode round-trips on the fixtures, incremental detokenization equals
//! the full decode whatever the tokens, never shows U+FFFD for text that is valid, and the stop
//! decoder's output equals a reference "cut at the first stop" of the full text however the text
//! is split into tokens and however the tokens are batched. `PROPTEST_CASES=N` for longer runs.

use crate::common;

use std::sync::Arc;

use pdgate_tokenize::{
    fixture, IncrementalDetokenizer, MatchedStop, StopConfig, StopDecoder, Tokenizer,
};
use proptest::prelude::*;

/// Text that exercises the fixtures: ASCII words, accents, CJK (3-byte), emoji (4-byte),
/// newlines and the ChatML special tokens.
fn text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-z ]{1,6}",
        Just(" the".to_owned()),
        Just("é".to_owned()),
        Just("ü".to_owned()),
        Just("東京".to_owned()),
        Just("日本".to_owned()),
        Just("😀".to_owned()),
        Just("🚀".to_owned()),
        Just("\n".to_owned()),
        Just("  ".to_owned()),
        Just(fixture::IM_END.to_owned()),
    ];
    prop::collection::vec(piece, 0..16).prop_map(|p| p.concat())
}

fn detokenize_all(t: &Arc<Tokenizer>, ids: &[u32], skip: bool) -> (Vec<String>, String) {
    let mut d = IncrementalDetokenizer::new(t.clone(), skip);
    let mut pieces = Vec::new();
    for &id in ids {
        let mut out = String::new();
        d.push(id, &mut out).unwrap();
        pieces.push(out);
    }
    let mut rest = String::new();
    d.flush(&mut rest).unwrap();
    pieces.push(rest);
    let joined = pieces.concat();
    (pieces, joined)
}

/// Encodes `text` in the pieces `cuts` split it into (at char boundaries), so the same text comes
/// as different token sequences.
fn encode_in_pieces(t: &Tokenizer, text: &str, cuts: &[usize]) -> Vec<u32> {
    let mut bounds: Vec<usize> = cuts
        .iter()
        .map(|&c| c % (text.len() + 1))
        .filter(|&c| text.is_char_boundary(c))
        .collect();
    bounds.push(0);
    bounds.push(text.len());
    bounds.sort_unstable();
    bounds.dedup();
    bounds
        .windows(2)
        .flat_map(|w| t.encode(&text[w[0]..w[1]], false).unwrap())
        .collect()
}

/// The reference: the first stop to end in `text` (the longest of those ending there), cut
/// before it (hidden) or after it (visible).
fn reference_cut(text: &str, stops: &[String], visible: bool) -> (String, Option<String>) {
    for end in (1..=text.len()).filter(|&e| text.is_char_boundary(e)) {
        let best = stops
            .iter()
            .filter(|s| !s.is_empty() && text[..end].ends_with(s.as_str()))
            .max_by_key(|s| s.len());
        if let Some(s) = best {
            let cut = if visible { end } else { end - s.len() };
            return (text[..cut].to_owned(), Some(s.clone()));
        }
    }
    (text.to_owned(), None)
}

fn stop_strings() -> impl Strategy<Value = Vec<String>> {
    let s = prop_oneof![
        "[a-c ]{1,3}",
        Just("東".to_owned()),
        Just("京 ".to_owned()),
        Just("😀".to_owned()),
        Just("\n\n".to_owned()),
        Just("é".to_owned()),
        Just("the e".to_owned()),
    ];
    prop::collection::vec(s, 0..4)
}

fn small_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-c ]{1,4}",
        Just("the ".to_owned()),
        Just("東京 ".to_owned()),
        Just("😀".to_owned()),
        Just("\n".to_owned()),
        Just("é".to_owned()),
    ];
    prop::collection::vec(piece, 0..14).prop_map(|p| p.concat())
}

proptest! {
    #[test]
    fn encode_then_decode_gives_the_text_back(s in text(), any_text in "\\PC{0,40}") {
        let t = common::chatml();
        for s in [&s, &any_text] {
            let ids = t.encode(s, false).unwrap();
            prop_assert_eq!(&t.decode(&ids, false).unwrap(), s);
            prop_assert_eq!(t.count_tokens(s, false).unwrap(), ids.len());
            prop_assert_eq!(ids, t.hf().encode(s.as_str(), false).unwrap().get_ids().to_vec());
        }
        let sp = common::sentencepiece();
        let plain = s.replace(fixture::IM_END, "");
        let ids = sp.encode(&plain, false).unwrap();
        prop_assert_eq!(sp.decode(&ids, false).unwrap(), plain.clone());
        // The SentencePiece fixture adds its BOS with add_special_tokens.
        let with_bos = sp.encode(&plain, true).unwrap();
        prop_assert_eq!(with_bos[0], fixture::SP_BOS_ID);
        prop_assert_eq!(&with_bos[1..], &ids[..]);
    }

    #[test]
    fn incremental_detokenization_of_any_tokens_equals_the_full_decode(
        ids in prop::collection::vec(0u32..fixture::VOCAB_SIZE as u32, 0..48),
        sp_ids in prop::collection::vec(0u32..400, 0..48),
        skip in any::<bool>(),
    ) {
        let t = common::chatml();
        let (_, joined) = detokenize_all(&t, &ids, skip);
        prop_assert_eq!(joined, t.decode(&ids, skip).unwrap());
        // SentencePiece byte fallback turns a whole run of byte tokens into U+FFFDs when the run
        // is not UTF-8, even bytes already shown as valid text; no incremental decoder can take
        // text back, so byte tokens are left to the valid-text property below.
        let sp = common::sentencepiece();
        let bytes = fixture::SP_BYTE_BASE..fixture::SP_BYTE_BASE + 256;
        let sp_ids: Vec<u32> = sp_ids
            .into_iter()
            .filter(|&i| (i as usize) < sp.vocab_size() && !bytes.contains(&i))
            .collect();
        let (_, joined) = detokenize_all(&sp, &sp_ids, skip);
        prop_assert_eq!(joined, sp.decode(&sp_ids, skip).unwrap());
    }

    #[test]
    fn valid_text_never_shows_a_replacement_character(s in text(), cuts in prop::collection::vec(any::<usize>(), 0..6)) {
        for t in [common::chatml(), common::sentencepiece()] {
            let ids = encode_in_pieces(&t, &s, &cuts);
            let (pieces, joined) = detokenize_all(&t, &ids, false);
            for p in &pieces {
                prop_assert!(!p.contains('\u{FFFD}'), "piece {:?} of {:?}", p, s);
            }
            // SentencePiece strips the first leading space of the whole decode.
            prop_assert_eq!(joined, t.decode(&ids, false).unwrap());
        }
    }

    #[test]
    fn stop_decoder_output_is_the_full_text_cut_at_the_first_stop(
        s in small_text(),
        cuts in prop::collection::vec(any::<usize>(), 0..6),
        batch in 1usize..5,
        stops in stop_strings(),
        visible in any::<bool>(),
        eos_at in prop::option::of(any::<usize>()),
    ) {
        let t = common::chatml();
        let mut ids = encode_in_pieces(&t, &s, &cuts);
        if let Some(at) = eos_at {
            let at = at % (ids.len() + 1);
            ids.insert(at, fixture::IM_END_ID);
        }
        let config = StopConfig {
            stop: stops.clone(),
            no_stop_trim: visible,
            skip_special_tokens: true,
            ..StopConfig::default()
        };
        let mut d = StopDecoder::new(t.clone(), &config);
        let mut out = String::new();
        let mut consumed = 0;
        for chunk in ids.chunks(batch) {
            let mut piece = String::new();
            consumed += d.push_all(chunk, &mut piece).unwrap();
            out.push_str(&piece);
            if d.is_stopped() { break; }
        }
        let mut tail = String::new();
        d.flush(&mut tail).unwrap();
        out.push_str(&tail);

        // Reference: decode everything before the first EOS (through it when visible), cut at
        // the first stop string.
        let eos = ids.iter().position(|&i| i == fixture::IM_END_ID);
        let upto = match eos { Some(p) if visible => p + 1, Some(p) => p, None => ids.len() };
        let full = t.decode(&ids[..upto], true).unwrap();
        let (want, matched) = reference_cut(&full, &stops, visible);
        prop_assert_eq!(&out, &want, "ids {:?}", ids);
        // U+FFFD only where the reference has one (an EOS inside a character's tokens).
        let shows_fffd = out.contains('\u{FFFD}');
        prop_assert!(want.contains('\u{FFFD}') || !shows_fffd, "{:?}", out);
        match (matched, eos) {
            (Some(m), _) => prop_assert_eq!(d.stopped(), Some(&MatchedStop::Text(m))),
            (None, Some(p)) => {
                prop_assert_eq!(d.stopped(), Some(&MatchedStop::TokenId(fixture::IM_END_ID)));
                prop_assert_eq!(consumed, p + 1);
            }
            (None, None) => prop_assert_eq!(d.stopped(), None),
        }
        if !visible {
            for stop in stops.iter().filter(|s| !s.is_empty()) {
                prop_assert!(!out.contains(stop.as_str()), "{:?} shows {:?}", out, stop);
            }
        }
    }
}
