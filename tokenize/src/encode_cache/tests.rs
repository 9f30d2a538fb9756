use std::path::PathBuf;
use std::sync::OnceLock;

use proptest::prelude::*;

use super::*;
use crate::fixture;

fn scratch(tag: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("pdgate-encode-cache-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The fixture's `tokenizer.json`, as Hugging Face loads it.
fn hf_of(write: fn(&std::path::Path) -> std::io::Result<()>, tag: &str) -> tokenizers::Tokenizer {
    let dir = scratch(tag);
    write(&dir).expect("write the fixture");
    let hf = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).expect("load");
    let _ = std::fs::remove_dir_all(&dir);
    hf
}

fn chatml() -> &'static tokenizers::Tokenizer {
    static T: OnceLock<tokenizers::Tokenizer> = OnceLock::new();
    T.get_or_init(|| hf_of(|d| fixture::write_model_dir(d), "chatml"))
}

/// Llama-2 style: a `Prepend("▁")` normalizer, which Hugging Face applies to every piece
/// between special tokens — the pieces must still come out as in one encode.
fn sentencepiece() -> &'static tokenizers::Tokenizer {
    static T: OnceLock<tokenizers::Tokenizer> = OnceLock::new();
    T.get_or_init(|| hf_of(|d| fixture::write_sentencepiece_model_dir(d), "sp"))
}

/// The byte-level fixture's JSON with `edit` applied.
fn chatml_edited(edit: impl FnOnce(&mut serde_json::Value)) -> tokenizers::Tokenizer {
    edited(|d| fixture::write_model_dir(d), edit)
}

fn edited(
    write: fn(&std::path::Path) -> std::io::Result<()>,
    edit: impl FnOnce(&mut serde_json::Value),
) -> tokenizers::Tokenizer {
    let dir = scratch("edited");
    write(&dir).unwrap();
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("tokenizer.json")).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    edit(&mut json);
    tokenizers::Tokenizer::from_bytes(serde_json::to_vec(&json).unwrap()).unwrap()
}

const BOTH: CacheConfig = CacheConfig {
    l0_max_entries: 1000,
    l1_max_bytes: 1 << 20,
};

/// `hf`'s encoder with `config`'s caches, and why L1 was refused if it was.
fn encoder(hf: &tokenizers::Tokenizer, config: CacheConfig) -> (Encoder, Option<String>) {
    let mut e = Encoder::new(hf);
    let refused = e.set_caches(config);
    (e, refused)
}

fn cache(hf: &tokenizers::Tokenizer, config: CacheConfig) -> Encoder {
    match encoder(hf, config) {
        (c, None) => c,
        (_, Some(why)) => panic!("L1 refused: {why}"),
    }
}

/// Why L1 is refused for `hf` (and the cache built without it).
fn refused(hf: &tokenizers::Tokenizer) -> (Encoder, String) {
    match encoder(hf, BOTH) {
        (c, Some(why)) => (c, why),
        (_, None) => panic!("L1 was not refused"),
    }
}

/// Text that exercises the splitter: every fixture special token (adjacent ones, at either
/// end), whitespace runs next to them, apostrophes, digits, multi-byte characters.
fn text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-z ]{1,6}",
        Just(" the".to_owned()),
        Just("'s".to_owned()),
        Just("é".to_owned()),
        Just("東京".to_owned()),
        Just("😀".to_owned()),
        Just("\n".to_owned()),
        Just("  ".to_owned()),
        Just("42".to_owned()),
        Just(fixture::IM_START.to_owned()),
        Just(fixture::IM_END.to_owned()),
        Just(fixture::ENDOFTEXT.to_owned()),
        Just("<|im_".to_owned()),
        Just("<s>".to_owned()),
        Just("</s>".to_owned()),
    ];
    prop::collection::vec(piece, 0..24).prop_map(|p| p.concat())
}

proptest! {
    /// Cold and warm, with each level alone and both, the cached ids are the tokenizer's.
    #[test]
    fn cached_encodes_equal_the_tokenizers(texts in prop::collection::vec(text(), 1..6)) {
        for hf in [chatml(), sentencepiece()] {
            for config in [
                BOTH,
                CacheConfig { l0_max_entries: 0, ..BOTH },
                CacheConfig { l1_max_bytes: 0, ..BOTH },
            ] {
                let c = cache(hf, config);
                for _round in 0..2 {
                    for t in &texts {
                        for special in [false, true] {
                            prop_assert_eq!(
                                c.encode(hf, t, special).unwrap(),
                                uncached(hf, t, special).unwrap(),
                                "{:?} add_special_tokens={}", t, special
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_chat_prompts_pieces_are_reused_across_prompts() {
    let hf = chatml();
    let c = cache(
        hf,
        CacheConfig {
            l0_max_entries: 0,
            ..BOTH
        },
    );
    let system = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n";
    let first = format!("{system}<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n");
    let second =
        format!("{system}<|im_start|>user\nsomething else<|im_end|>\n<|im_start|>assistant\n");
    assert_eq!(
        c.encode(hf, &first, false).unwrap(),
        uncached(hf, &first, false).unwrap()
    );
    let cold = c.stats();
    assert_eq!(
        c.encode(hf, &second, false).unwrap(),
        uncached(hf, &second, false).unwrap()
    );
    let warm = c.stats();
    // The system text, the "\n" between turns and "assistant\n" are hits; only the new user
    // text is tokenized.
    assert_eq!(warm.l1_misses - cold.l1_misses, 1, "{cold:?} → {warm:?}");
    assert!(warm.l1_hits - cold.l1_hits >= 4, "{cold:?} → {warm:?}");
    assert_eq!((warm.l0_hits, warm.l0_misses), (0, 0));
}

#[test]
fn l0_serves_a_repeated_text_whole() {
    let hf = chatml();
    let c = cache(
        hf,
        CacheConfig {
            l1_max_bytes: 0,
            ..BOTH
        },
    );
    let text = "<|im_start|>user\nhello<|im_end|>\n";
    let ids = c.encode(hf, text, false).unwrap();
    assert_eq!(c.encode(hf, text, false).unwrap(), ids);
    // `add_special_tokens` is part of the key.
    c.encode(hf, text, true).unwrap();
    let s = c.stats();
    assert_eq!((s.l0_hits, s.l0_misses), (1, 2), "{s:?}");
}

#[test]
fn l1_is_refused_where_pieces_are_not_independent() {
    let lstrip = chatml_edited(|j| {
        j["added_tokens"][1]["lstrip"] = true.into();
    });
    let (c, why) = refused(&lstrip);
    assert!(why.contains("strips whitespace"), "{why}");
    // L0 stays on, and stays exact.
    assert!(c.l0.is_some() && !c.has_l1());
    let t = "a <|im_start|> b";
    assert_eq!(
        c.encode(&lstrip, t, false).unwrap(),
        uncached(&lstrip, t, false).unwrap()
    );

    // The SentencePiece fixture, its `Prepend` normalizer traded for Metaspace's "first".
    let first = edited(
        |d| fixture::write_sentencepiece_model_dir(d),
        |j| {
            j["normalizer"] = serde_json::Value::Null;
            j["pre_tokenizer"] = serde_json::json!({
                "type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false
            });
        },
    );
    let (_, why) = refused(&first);
    assert!(why.contains("prepend_scheme first"), "{why}");
    // Why: encoded alone, the piece after a special token would get the `▁` that only the
    // text's first piece gets.
    let whole = uncached(&first, "hello</s>world", false).unwrap();
    let mut pieces = uncached(&first, "hello", false).unwrap();
    pieces.push(first.token_to_id("</s>").unwrap());
    pieces.extend(uncached(&first, "world", false).unwrap());
    assert_ne!(whole, pieces);

    let truncating = chatml_edited(|j| {
        j["truncation"] = serde_json::json!({
            "direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0
        });
    });
    refused(&truncating);
}

#[test]
fn the_bounds_hold_and_the_oldest_goes_first() {
    let b = Bounded::new(SHARDS * 2, Cost::Entry);
    let texts: Vec<String> = (0..200).map(|i| format!("text {i}")).collect();
    for t in &texts {
        b.insert(b.key(t, false), t, &[1, 2, 3]);
    }
    let kept: Vec<&String> = texts
        .iter()
        .filter(|t| b.get(b.key(t, false), t).is_some())
        .collect();
    assert!(kept.len() <= SHARDS * 2, "{}", kept.len());
    // The last text inserted is always kept: eviction takes the oldest of its shard.
    assert!(kept.contains(&texts.last().unwrap()));
    for shard in b.shards.iter() {
        let s = shard.lock().unwrap();
        assert!(s.used <= 2 && s.map.len() == s.order.len());
    }

    let bytes = Bounded::new(SHARDS * 1000, Cost::Bytes);
    let big = "x".repeat(2000);
    bytes.insert(bytes.key(&big, false), &big, &[1]);
    assert!(
        bytes.get(bytes.key(&big, false), &big).is_none(),
        "larger than a shard: not kept"
    );
    for i in 0..500 {
        let t = format!("{i:0>200}");
        bytes.insert(bytes.key(&t, false), &t, &[7; 50]);
    }
    for shard in bytes.shards.iter() {
        assert!(shard.lock().unwrap().used <= 1000);
    }
}

#[test]
fn a_hash_collision_is_a_miss_not_a_wrong_answer() {
    let b = Bounded::new(100, Cost::Entry);
    b.insert(42, "one text", &[1]);
    assert!(b.get(42, "another text").is_none());
    assert_eq!(b.get(42, "one text").as_deref(), Some(&[1u32][..]));
    b.insert(42, "another text", &[2]);
    assert_eq!(b.get(42, "another text").as_deref(), Some(&[2u32][..]));
    let s = b.shard(42);
    assert_eq!((s.map.len(), s.order.len(), s.used), (1, 1, 1));
}

#[test]
fn the_fast_path_is_taken_where_it_applies_even_without_caches() {
    let none = CacheConfig::default();
    assert!(encoder(chatml(), none).0.has_fast_path());
    // SentencePiece: no byte-level alphabet, the library encodes.
    assert!(!encoder(sentencepiece(), none).0.has_fast_path());
    let c = encoder(chatml(), none).0;
    let text = "<|im_start|>user\nIt's 2024; what's new?<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(
        c.encode(chatml(), text, false).unwrap(),
        uncached(chatml(), text, false).unwrap()
    );
}
