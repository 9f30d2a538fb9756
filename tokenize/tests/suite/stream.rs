//! The streaming side, behaviour by behaviour: the incremental detokenizer on split characters
//! and SentencePiece spaces, and the stop decoder's withholding, trimming, latching and flushing.

use crate::common;

use std::sync::Arc;

use pdgate_tokenize::{
    fixture, IncrementalDetokenizer, MatchedStop, StopConfig, StopDecoder, Tokenizer,
};

fn pieces(d: &mut IncrementalDetokenizer, ids: &[u32]) -> Vec<String> {
    ids.iter()
        .map(|&id| {
            let mut out = String::new();
            d.push(id, &mut out).unwrap();
            out
        })
        .collect()
}

#[test]
fn a_character_split_across_tokens_waits_for_its_last_byte() {
    let t = common::chatml();
    // "😀" is four bytes; the fixture has no token for it, so one of its tokens ends mid-character.
    let ids = t.encode("a😀b", false).unwrap();
    assert!(ids.len() >= 3, "{ids:?}");
    let mut d = IncrementalDetokenizer::new(t.clone(), false);
    let got = pieces(&mut d, &ids);
    assert!(got.iter().all(|p| !p.contains('\u{FFFD}')), "{got:?}");
    assert!(
        got.iter().any(String::is_empty),
        "some token completed nothing: {got:?}"
    );
    assert_eq!(got.concat(), "a😀b");
}

#[test]
fn a_stream_that_ends_inside_a_character_flushes_a_replacement_character() {
    let t = common::chatml();
    let ids = t.encode("😀", false).unwrap();
    let mut d = IncrementalDetokenizer::new(t.clone(), false);
    let got = pieces(&mut d, &ids[..ids.len() - 1]).concat();
    assert_eq!(got, "");
    let mut rest = String::new();
    d.flush(&mut rest).unwrap();
    assert_eq!(rest, t.decode(&ids[..ids.len() - 1], false).unwrap());
    assert!(rest.ends_with('\u{FFFD}'));
}

#[test]
fn sentencepiece_words_keep_their_leading_space_after_the_first() {
    let t = common::sentencepiece();
    let ids = t.encode("Hello world again", false).unwrap();
    let mut d = IncrementalDetokenizer::new(t.clone(), true);
    assert_eq!(pieces(&mut d, &ids).concat(), "Hello world again");
    // With the prompt's last tokens as context the first word keeps its space, as vLLM does.
    let prompt = t.encode("Say", false).unwrap();
    // "hello" encodes as "▁hello…": a word start, whose space the decoder strips when it is first.
    let answer = t.encode("hello", false).unwrap();
    let mut d = IncrementalDetokenizer::new(t.clone(), true)
        .with_context(&prompt)
        .unwrap();
    assert_eq!(pieces(&mut d, &answer).concat(), " hello");
}

#[test]
fn skip_special_tokens_leaves_them_out_of_the_stream() {
    let t = common::chatml();
    let ids = t.encode("hi<|im_end|>there", false).unwrap();
    let mut d = IncrementalDetokenizer::new(t.clone(), true);
    assert_eq!(pieces(&mut d, &ids).concat(), "hithere");
    let mut d = IncrementalDetokenizer::new(t.clone(), false);
    assert_eq!(pieces(&mut d, &ids).concat(), "hi<|im_end|>there");
}

#[test]
fn memory_stays_a_few_tokens_over_a_long_stream() {
    let t = common::chatml();
    let ids = t
        .encode(&"The gateway streams 東京 😀 tokens. ".repeat(300), false)
        .unwrap();
    let mut d = IncrementalDetokenizer::new(t.clone(), false);
    let mut out = String::new();
    let mut most = 0;
    for &id in &ids {
        d.push(id, &mut out).unwrap();
        most = most.max(d.held_tokens());
    }
    assert!(most <= 6, "held up to {most} tokens");
    assert_eq!(out, t.decode(&ids, false).unwrap());
}

fn stop_decoder(t: &Arc<Tokenizer>, stop: &[&str], no_stop_trim: bool) -> StopDecoder {
    StopDecoder::new(
        t.clone(),
        &StopConfig {
            stop: stop.iter().map(|s| s.to_string()).collect(),
            no_stop_trim,
            skip_special_tokens: true,
            ..StopConfig::default()
        },
    )
}

/// Feeds `text` one byte-token at a time (the fixture's ids for bytes are the byte values), so
/// every boundary is exercised; returns the released pieces.
fn feed_bytes(d: &mut StopDecoder, text: &str) -> Vec<String> {
    text.bytes()
        .map(|b| {
            let mut out = String::new();
            d.push(u32::from(b), &mut out).unwrap();
            out
        })
        .collect()
}

#[test]
fn text_that_may_start_a_stop_string_is_withheld_then_released() {
    let t = common::chatml();
    let mut d = stop_decoder(&t, &["STOP"], false);
    let got = feed_bytes(&mut d, "go ST");
    assert_eq!(got.concat(), "go ", "\"ST\" could still become STOP");
    let got = feed_bytes(&mut d, "OP");
    assert_eq!(got.concat(), "");
    assert_eq!(d.stopped(), Some(&MatchedStop::Text("STOP".into())));
    assert_eq!(d.finish_reason(), Some("stop"));

    let mut d = stop_decoder(&t, &["STOP"], false);
    assert_eq!(
        feed_bytes(&mut d, "go STA").concat(),
        "go STA",
        "released once it cannot match"
    );
    assert!(!d.is_stopped());
}

#[test]
fn no_stop_trim_shows_the_stop_string() {
    let t = common::chatml();
    let mut d = stop_decoder(&t, &["\n\n"], true);
    assert_eq!(feed_bytes(&mut d, "a\n\nb").concat(), "a\n\n");
    assert_eq!(d.stopped(), Some(&MatchedStop::Text("\n\n".into())));
}

#[test]
fn the_first_stop_to_end_wins_and_the_longest_of_those() {
    let t = common::chatml();
    let mut d = stop_decoder(&t, &["abcd", "bc"], false);
    assert_eq!(feed_bytes(&mut d, "xabcd").concat(), "xa");
    assert_eq!(d.stopped(), Some(&MatchedStop::Text("bc".into())));
    let mut d = stop_decoder(&t, &["bc", "abc"], false);
    let mut out = String::new();
    d.push_all(&t.encode("xabcz", false).unwrap(), &mut out)
        .unwrap();
    assert_eq!(out, "x");
    assert_eq!(d.stopped(), Some(&MatchedStop::Text("abc".into())));
}

#[test]
fn eos_stops_hidden_unless_no_stop_trim_and_not_with_ignore_eos() {
    let t = common::chatml();
    let ids = [
        u32::from(b'o'),
        u32::from(b'k'),
        fixture::IM_END_ID,
        u32::from(b'!'),
    ];
    let mut d = stop_decoder(&t, &[], false);
    let mut out = String::new();
    assert_eq!(d.push_all(&ids, &mut out).unwrap(), 3);
    assert_eq!(out, "ok");
    assert_eq!(d.stopped(), Some(&MatchedStop::TokenId(fixture::IM_END_ID)));

    let visible = StopConfig {
        no_stop_trim: true,
        ..StopConfig::default()
    };
    let mut d = StopDecoder::new(t.clone(), &visible);
    let mut out = String::new();
    d.push_all(&ids, &mut out).unwrap();
    assert_eq!(out, "ok<|im_end|>");

    let ignore = StopConfig {
        ignore_eos: true,
        stop_token_ids: vec![u32::from(b'!')],
        ..StopConfig::default()
    };
    let mut d = StopDecoder::new(t.clone(), &ignore);
    let mut out = String::new();
    assert_eq!(d.push_all(&ids, &mut out).unwrap(), 4);
    assert_eq!(out, "ok<|im_end|>");
    assert_eq!(d.stopped(), Some(&MatchedStop::TokenId(u32::from(b'!'))));
}

#[test]
fn a_stop_token_releases_what_was_withheld() {
    let t = common::chatml();
    let mut d = stop_decoder(&t, &["STOP"], false);
    let mut out = String::new();
    d.push_all(
        &[u32::from(b'a'), u32::from(b'S'), fixture::ENDOFTEXT_ID],
        &mut out,
    )
    .unwrap();
    assert_eq!(out, "aS");
    assert_eq!(
        d.stopped(),
        Some(&MatchedStop::TokenId(fixture::ENDOFTEXT_ID))
    );
}

#[test]
fn stopped_latches_and_flush_releases_the_rest_at_the_end() {
    let t = common::chatml();
    let mut d = stop_decoder(&t, &["END"], false);
    feed_bytes(&mut d, "xEN");
    let mut tail = String::new();
    d.flush(&mut tail).unwrap();
    assert_eq!(tail, "EN");
    assert!(!d.is_stopped());

    let mut d = stop_decoder(&t, &["END"], false);
    feed_bytes(&mut d, "xEND");
    assert!(d.is_stopped());
    assert_eq!(feed_bytes(&mut d, "more").concat(), "");
    let mut tail = String::new();
    d.flush(&mut tail).unwrap();
    assert_eq!(tail, "");
}

#[test]
fn multi_byte_stop_strings_match_across_split_characters() {
    let t = common::chatml();
    let mut d = stop_decoder(&t, &["東京"], false);
    let got = feed_bytes(&mut d, "in 東京!");
    assert!(got.iter().all(|p| !p.contains('\u{FFFD}')), "{got:?}");
    assert_eq!(got.concat(), "in ");
    assert_eq!(d.stopped(), Some(&MatchedStop::Text("東京".into())));
}

#[test]
fn a_stream_that_is_not_text_keeps_the_window_bounded() {
    // The SentencePiece fixture decodes through a window; 200 tokens that add nothing (skipped
    // specials) or only invalid bytes must not grow it without bound.
    let t = common::sentencepiece();
    let mut d = IncrementalDetokenizer::new(t.clone(), true);
    let mut out = String::new();
    let mut ids = t.encode("Hello", false).unwrap();
    ids.extend(std::iter::repeat_n(fixture::SP_BOS_ID, 200));
    ids.extend(t.encode("world", false).unwrap());
    for &id in &ids {
        d.push(id, &mut out).unwrap();
        assert!(d.held_tokens() <= 128, "{}", d.held_tokens());
    }
    d.flush(&mut out).unwrap();
    assert_eq!(out, t.decode(&ids, true).unwrap());

    let invalid = vec![fixture::SP_BYTE_BASE + 0x80; 200];
    let mut d = IncrementalDetokenizer::new(t.clone(), true);
    let mut out = String::new();
    for &id in &invalid {
        d.push(id, &mut out).unwrap();
        assert!(d.held_tokens() <= 128, "{}", d.held_tokens());
    }
    d.flush(&mut out).unwrap();
    assert_eq!(out, "\u{FFFD}".repeat(200));
}

#[test]
fn byte_level_streams_hold_bytes_not_tokens() {
    let t = common::chatml();
    // A run of tokens that each end inside a character, hundreds long, stays exact.
    let text = "疇".repeat(300) + "東京😀".repeat(100).as_str();
    let ids = t.encode(&text, false).unwrap();
    let mut d = IncrementalDetokenizer::new(t.clone(), false);
    let mut out = String::new();
    for &id in &ids {
        d.push(id, &mut out).unwrap();
        assert_eq!(d.held_tokens(), 0);
    }
    assert_eq!(out, text);
}
