//! An exact fast path for byte-level BPE tokenizers on ASCII text.
//!
//! Hugging Face's `encode` builds a `NormalizedString` with an alignment pair per byte, a
//! `PreTokenizedString` of them, a `Token` with its own `String` per token and an `Encoding` of
//! seven vectors, all to hand back ids: on the gRPC path that was over half of the gateway's CPU
//! per request. For the pipelines that dominate chat models — a byte-level BPE model behind
//! GPT-2's pre-tokenizer regex (`ByteLevel` with `use_regex`), or behind Llama 3's or Qwen 2's
//! `Split` regex and a regex-less `ByteLevel` — and for ASCII text, where those regexes'
//! Unicode classes are plain byte classes, this does the same work directly: the regex as a
//! hand-written scanner, the byte-to-character table, and BPE merges exactly as the library
//! applies them (lowest rank first, then leftmost; an entry made stale by an earlier merge is
//! skipped the same way). Words are cached per thread.
//!
//! Anything else falls back to the library: another pre-tokenizer or normalizer (NFC is the
//! identity on ASCII and allowed), a model with dropout, a subword prefix or suffix, byte
//! fallback or no byte-level alphabet, and every piece of text that is not ASCII. A property
//! test compares the ids with the library's on random ASCII text for all three patterns.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use foldhash::fast::RandomState;

use serde_json::Value;

/// The pre-tokenizer regexes this scanner reproduces (as `tokenizer.json` spells them).
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Words longer than this are merged but not cached (as the library does).
const MAX_CACHED_WORD: usize = 256;
/// Words cached per thread, at most.
const CACHE_WORDS: usize = 16_384;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pattern {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    Gpt2,
    /// [`LLAMA3_PATTERN`]: digits in runs of at most 3.
    Llama3,
    /// [`QWEN2_PATTERN`]: one digit per piece.
    Qwen2,
}

pub(crate) struct FastBpe {
    pattern: Pattern,
    /// The id of each byte's byte-level character.
    byte_ids: [u32; 256],
    /// `(left, right)` → `(rank, merged id)`.
    merges: HashMap<(u32, u32), (u32, u32), RandomState>,
    /// Llama 3: a word that is itself in the vocabulary is that one token.
    ignore_merges: Option<HashMap<String, u32, RandomState>>,
    /// Byte → its byte-level character.
    table: [char; 256],
    /// Distinguishes this tokenizer's words in the per-thread cache.
    id: usize,
}

/// One tokenizer's merged words. Every word of every prompt is looked up here, so the hash is
/// foldhash's (keyed per map from a per-process random seed, so a client cannot aim collisions
/// at it): SipHash, std's default, was 27,000 instructions of a 1 KB gRPC request, ~140 a word
/// (`bench/instructions.sh`, TRANSPORT=grpc).
type Words = HashMap<Box<[u8]>, Box<[u32]>, RandomState>;

thread_local! {
    /// Per thread, by tokenizer ([`FastBpe::id`]).
    static WORDS: RefCell<HashMap<usize, Words, RandomState>> = RefCell::new(HashMap::default());
}

impl FastBpe {
    /// `None` when the tokenizer's pipeline is not one this reproduces exactly.
    pub(crate) fn new(hf: &tokenizers::Tokenizer) -> Option<FastBpe> {
        if let Some(n) = hf.get_normalizer() {
            let n = serde_json::to_value(n).ok()?;
            if n["type"] != "NFC" {
                return None;
            }
        }
        let pattern = pattern_of(&serde_json::to_value(hf.get_pre_tokenizer()?).ok()?)?;
        let model = serde_json::to_value(hf.get_model()).ok()?;
        if model["type"] != "BPE"
            || !(model["dropout"].is_null() || model["dropout"] == 0.0)
            || !empty_or_null(&model["continuing_subword_prefix"])
            || !empty_or_null(&model["end_of_word_suffix"])
            || model["byte_fallback"] == true
        {
            return None;
        }
        let vocab: HashMap<String, u32, RandomState> = model["vocab"]
            .as_object()?
            .iter()
            .map(|(k, v)| Some((k.clone(), u32::try_from(v.as_u64()?).ok()?)))
            .collect::<Option<_>>()?;
        let table = crate::byte_level::byte_to_unicode();
        let mut byte_ids = [0u32; 256];
        for (b, id) in byte_ids.iter_mut().enumerate() {
            *id = *vocab.get(&table[b].to_string())?;
        }
        let mut merges = HashMap::default();
        for (rank, m) in model["merges"].as_array()?.iter().enumerate() {
            let (a, b) = match m {
                Value::String(s) => s.split_once(' ')?,
                Value::Array(p) => (p.first()?.as_str()?, p.get(1)?.as_str()?),
                _ => return None,
            };
            let merged = *vocab.get(&format!("{a}{b}"))?;
            merges.insert((*vocab.get(a)?, *vocab.get(b)?), (rank as u32, merged));
        }
        let ignore_merges = (model["ignore_merges"] == true).then_some(vocab);
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        Some(FastBpe {
            pattern,
            table,
            byte_ids,
            merges,
            ignore_merges,
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        })
    }

    /// The ids of `text`, a piece with no added token in it. `None`: not ASCII (the caller
    /// asks the library).
    pub(crate) fn encode_piece(&self, text: &str, out: &mut Vec<u32>) -> Option<()> {
        if !text.is_ascii() {
            return None;
        }
        WORDS.with(|cell| {
            let mut by_tokenizer = cell.borrow_mut();
            let words = by_tokenizer.entry(self.id).or_default();
            split(self.pattern, text.as_bytes(), |word| {
                self.encode_word(words, word, out)
            });
        });
        Some(())
    }

    fn encode_word(&self, words: &mut Words, word: &[u8], out: &mut Vec<u32>) {
        if let Some(ids) = words.get(word) {
            out.extend_from_slice(ids);
            return;
        }
        let ids = self.merge(word);
        out.extend_from_slice(&ids);
        if word.len() <= MAX_CACHED_WORD && words.len() < CACHE_WORDS {
            words.insert(word.into(), ids.into_boxed_slice());
        }
    }

    /// BPE over the word's byte-level characters, as `tokenizers` merges a word.
    fn merge(&self, word: &[u8]) -> Vec<u32> {
        if let Some(vocab) = &self.ignore_merges {
            let text: String = word.iter().map(|&b| self.table[b as usize]).collect();
            if let Some(&id) = vocab.get(&text) {
                return vec![id];
            }
        }
        // Symbols as a linked list over positions; a merged-away symbol has `alive` false.
        let n = word.len();
        let mut ids: Vec<u32> = word.iter().map(|&b| self.byte_ids[b as usize]).collect();
        let mut alive = vec![true; n];
        let mut next: Vec<usize> = (1..=n).collect();
        let mut prev: Vec<Option<usize>> = (0..n).map(|i| i.checked_sub(1)).collect();
        let mut queue = BinaryHeap::with_capacity(n);
        for pos in 0..n.saturating_sub(1) {
            if let Some(&(rank, new_id)) = self.merges.get(&(ids[pos], ids[pos + 1])) {
                queue.push(Reverse((rank, pos, new_id)));
            }
        }
        while let Some(Reverse((_, pos, new_id))) = queue.pop() {
            if !alive[pos] || next[pos] >= n {
                continue;
            }
            let right = next[pos];
            // An entry made stale by an earlier merge: the pair there now merges otherwise.
            if self
                .merges
                .get(&(ids[pos], ids[right]))
                .is_none_or(|&(_, id)| id != new_id)
            {
                continue;
            }
            ids[pos] = new_id;
            alive[right] = false;
            next[pos] = next[right];
            if next[pos] < n {
                prev[next[pos]] = Some(pos);
            }
            if let Some(p) = prev[pos] {
                if let Some(&(rank, id)) = self.merges.get(&(ids[p], ids[pos])) {
                    queue.push(Reverse((rank, p, id)));
                }
            }
            if next[pos] < n {
                if let Some(&(rank, id)) = self.merges.get(&(ids[pos], ids[next[pos]])) {
                    queue.push(Reverse((rank, pos, id)));
                }
            }
        }
        ids.into_iter()
            .zip(alive)
            .filter_map(|(id, a)| a.then_some(id))
            .collect()
    }
}

fn empty_or_null(v: &Value) -> bool {
    v.is_null() || v == ""
}

/// Which scanner reproduces this pre-tokenizer, if any.
fn pattern_of(pre: &Value) -> Option<Pattern> {
    let byte_level = |v: &Value, use_regex: bool| {
        v["type"] == "ByteLevel" && v["add_prefix_space"] == false && v["use_regex"] == use_regex
    };
    if byte_level(pre, true) {
        return Some(Pattern::Gpt2);
    }
    let steps = pre["pretokenizers"]
        .as_array()
        .filter(|_| pre["type"] == "Sequence")?;
    let [split, bl] = steps.as_slice() else {
        return None;
    };
    if !byte_level(bl, false)
        || split["type"] != "Split"
        || split["behavior"] != "Isolated"
        || split["invert"] != false
    {
        return None;
    }
    match split["pattern"]["Regex"].as_str()? {
        LLAMA3_PATTERN => Some(Pattern::Llama3),
        QWEN2_PATTERN => Some(Pattern::Qwen2),
        _ => None,
    }
}

/// A byte's regex class on ASCII, one bit of [`CLASS`]: `\p{L}`, `\p{N}`, `\s` (Unicode
/// White_Space: tab, LF, VT, FF, CR, space), or `[^\s\p{L}\p{N}]` (every other byte; the
/// scanner only sees ASCII). One table load per byte: the classes as functions passed by
/// pointer were a call per byte.
const LETTER: u8 = 1;
const DIGIT: u8 = 2;
const SPACE: u8 = 4;
const OTHER: u8 = 8;

static CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = if c.is_ascii_alphabetic() {
            LETTER
        } else if c.is_ascii_digit() {
            DIGIT
        } else if matches!(c, b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' ') {
            SPACE
        } else {
            OTHER
        };
        b += 1;
    }
    t
};

#[inline(always)]
fn is(class: u8, b: u8) -> bool {
    CLASS[b as usize] & class != 0
}

fn is_letter(b: u8) -> bool {
    is(LETTER, b)
}

fn is_digit(b: u8) -> bool {
    is(DIGIT, b)
}

/// `[^\s\p{L}\p{N}]` on ASCII.
fn is_other(b: u8) -> bool {
    is(OTHER, b)
}

/// The end of the run of `class` bytes from `from`.
#[inline(always)]
fn run(s: &[u8], from: usize, class: u8) -> usize {
    from + s[from..].iter().take_while(|&&b| is(class, b)).count()
}

/// The contraction at `i` (`'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`, `'d`), its length.
fn contraction(s: &[u8], i: usize, any_case: bool) -> Option<usize> {
    if s.get(i) != Some(&b'\'') {
        return None;
    }
    let at = |k: usize| {
        s.get(i + k)
            .map(|&b| if any_case { b.to_ascii_lowercase() } else { b })
    };
    match (at(1)?, at(2)) {
        (b'r', Some(b'e')) | (b'v', Some(b'e')) | (b'l', Some(b'l')) => Some(3),
        (b's' | b't' | b'm' | b'd', _) => Some(2),
        _ => None,
    }
}

/// The whitespace alternatives every pattern ends with: `\s+(?!\S)|\s+` at `i` (a space).
fn trailing_space(s: &[u8], i: usize) -> usize {
    let end = run(s, i, SPACE);
    if end == s.len() || end - i == 1 {
        end
    } else {
        end - 1
    }
}

/// Calls `word` with each piece the pattern's regex finds in `s` (ASCII), in order; the pieces
/// cover `s`.
fn split(pattern: Pattern, s: &[u8], mut word: impl FnMut(&[u8])) {
    let mut i = 0;
    while i < s.len() {
        let end = match pattern {
            Pattern::Gpt2 => gpt2_at(s, i),
            Pattern::Llama3 => llama_at(s, i, 3),
            Pattern::Qwen2 => llama_at(s, i, 1),
        };
        word(&s[i..end]);
        i = end;
    }
}

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
fn gpt2_at(s: &[u8], i: usize) -> usize {
    if let Some(n) = contraction(s, i, false) {
        return i + n;
    }
    let k = if s[i] == b' ' { i + 1 } else { i };
    if let Some(&b) = s.get(k) {
        let class = CLASS[b as usize];
        if class != SPACE {
            return run(s, k, class);
        }
    }
    trailing_space(s, i)
}

/// Llama 3 (`digits` = 3) and Qwen 2 (`digits` = 1):
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,digits}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
fn llama_at(s: &[u8], i: usize, digits: usize) -> usize {
    let b = s[i];
    if let Some(n) = contraction(s, i, true) {
        return i + n;
    }
    if is_letter(b) {
        return run(s, i, LETTER);
    }
    let crlf = |b: u8| b == b'\r' || b == b'\n';
    if !crlf(b) && !is_digit(b) && s.get(i + 1).copied().is_some_and(is_letter) {
        return run(s, i + 1, LETTER);
    }
    if is_digit(b) {
        return (i + digits).min(run(s, i, DIGIT));
    }
    let k = if b == b' ' { i + 1 } else { i };
    if s.get(k).copied().is_some_and(is_other) {
        let end = run(s, k, OTHER);
        return end + s[end..].iter().take_while(|&&b| crlf(b)).count();
    }
    // `\s*[\r\n]+`: the whitespace run up to its last CR or LF.
    let end = run(s, i, SPACE);
    if let Some(last) = s[i..end].iter().rposition(|&b| crlf(b)) {
        return i + last + 1;
    }
    trailing_space(s, i)
}

#[cfg(test)]
mod tests;
