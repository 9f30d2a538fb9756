use proptest::prelude::*;

use super::*;
use crate::fixture;

/// The byte-level fixture's `tokenizer.json` with `edit` applied, as the library loads it.
fn fixture_with(edit: impl FnOnce(&mut Value)) -> tokenizers::Tokenizer {
    let dir = std::env::temp_dir().join(format!(
        "pdgate-fast-bpe-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    fixture::write_model_dir(&dir).unwrap();
    let mut json: Value =
        serde_json::from_slice(&std::fs::read(dir.join("tokenizer.json")).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    edit(&mut json);
    tokenizers::Tokenizer::from_bytes(serde_json::to_vec(&json).unwrap()).unwrap()
}

fn split_then_byte_level(pattern: &str) -> Value {
    serde_json::json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
    ]})
}

/// GPT-2 (the fixture as written), Llama 3 (its regex, `ignore_merges`) and Qwen 2 (its regex,
/// an NFC normalizer).
fn pipelines() -> &'static [(&'static str, tokenizers::Tokenizer, FastBpe)] {
    static P: std::sync::OnceLock<Vec<(&'static str, tokenizers::Tokenizer, FastBpe)>> =
        std::sync::OnceLock::new();
    P.get_or_init(|| {
        let gpt2 = fixture_with(|_| {});
        let llama3 = fixture_with(|j| {
            j["pre_tokenizer"] = split_then_byte_level(LLAMA3_PATTERN);
            j["model"]["ignore_merges"] = true.into();
        });
        let qwen2 = fixture_with(|j| {
            j["pre_tokenizer"] = split_then_byte_level(QWEN2_PATTERN);
            j["normalizer"] = serde_json::json!({"type": "NFC"});
        });
        [("gpt2", gpt2), ("llama3", llama3), ("qwen2", qwen2)]
            .into_iter()
            .map(|(name, hf)| {
                let fast = FastBpe::new(&hf).unwrap_or_else(|| panic!("{name}: no fast path"));
                (name, hf, fast)
            })
            .collect()
    })
}

fn library(hf: &tokenizers::Tokenizer, text: &str) -> Vec<u32> {
    hf.encode_fast(text, false).unwrap().get_ids().to_vec()
}

/// Where the library's pre-tokenizer cuts `text` (byte ranges).
fn library_cuts(hf: &tokenizers::Tokenizer, text: &str) -> Vec<(usize, usize)> {
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
    let mut p = PreTokenizedString::from(text);
    hf.get_pre_tokenizer()
        .unwrap()
        .pre_tokenize(&mut p)
        .unwrap();
    p.get_splits(OffsetReferential::Original, OffsetType::Byte)
        .into_iter()
        .map(|(_, offsets, _)| offsets)
        .collect()
}

/// Where the scanner cuts it.
fn fast_cuts(f: &FastBpe, text: &str) -> Vec<(usize, usize)> {
    let mut cuts = Vec::new();
    let base = text.as_ptr() as usize;
    split(f.pattern, text.as_bytes(), |w| {
        let start = w.as_ptr() as usize - base;
        cuts.push((start, start + w.len()));
    });
    cuts
}

fn fast(f: &FastBpe, text: &str) -> Vec<u32> {
    let mut out = Vec::new();
    f.encode_piece(text, &mut out).expect("ASCII");
    out
}

/// ASCII built to hit every alternative of the three regexes: words in any case, contractions
/// in any case (and near misses), digit runs of every length, whitespace runs of every kind
/// (CRLF, tabs, vertical tab, form feed) before words, digits, punctuation and the end, and
/// any ASCII byte at all.
fn ascii() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-zA-Z]{1,8}",
        "[0-9]{1,7}",
        "[ \t\r\n\x0B\x0C]{1,4}",
        "[!-/:-@\\[-`{-~]{1,4}",
        "'(s|t|re|ve|m|ll|d|S|T|RE|Re|VE|M|LL|D|r|l|v|x)",
        Just(" ".to_owned()),
        Just("\r\n".to_owned()),
        Just(" 's".to_owned()),
        "[\\x00-\\x7F]{1,6}",
    ];
    prop::collection::vec(piece, 0..24).prop_map(|p| p.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_fast_path_gives_the_librarys_ids(text in ascii()) {
        for (name, hf, f) in pipelines() {
            prop_assert_eq!(fast_cuts(f, &text), library_cuts(hf, &text), "{} on {:?}", name, text);
            prop_assert_eq!(fast(f, &text), library(hf, &text), "{} on {:?}", name, text);
        }
    }
}

#[test]
fn the_regex_corners_come_out_as_the_library_cuts_them() {
    let corners = [
        "",
        " ",
        "  ",
        "a  b",
        "a \n b",
        "x\n\n\ny",
        "end  ",
        "\r\n\r\n  x",
        "  \r\n\t y",
        "1234567",
        " 12 345",
        "it's we'RE I'M 'x '",
        "don't 'S 'LL'll",
        "(hello) [world]!!\n",
        "a\x0Bb\x0Cc",
        "\x00\x01\x1f\x7f",
        "tab\there",
        " !!\r\n\r\nnext",
        "''s",
        "hello'",
    ];
    for (name, hf, f) in pipelines() {
        for text in corners {
            assert_eq!(
                fast_cuts(f, text),
                library_cuts(hf, text),
                "{name} on {text:?}"
            );
            assert_eq!(fast(f, text), library(hf, text), "{name} on {text:?}");
        }
    }
}

#[test]
fn other_pipelines_and_non_ascii_text_go_to_the_library() {
    let (_, _, gpt2) = &pipelines()[0];
    assert!(gpt2.encode_piece("café", &mut Vec::new()).is_none());
    let other_regex = fixture_with(|j| {
        j["pre_tokenizer"] = split_then_byte_level(r"\p{L}+|\s+");
    });
    assert!(FastBpe::new(&other_regex).is_none());
    let dropout = fixture_with(|j| j["model"]["dropout"] = 0.1.into());
    assert!(FastBpe::new(&dropout).is_none());
    let lowercase = fixture_with(|j| j["normalizer"] = serde_json::json!({"type": "Lowercase"}));
    assert!(FastBpe::new(&lowercase).is_none());
    let prefix_space = fixture_with(|j| j["pre_tokenizer"]["add_prefix_space"] = true.into());
    assert!(FastBpe::new(&prefix_space).is_none());
}
