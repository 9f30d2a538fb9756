//! Tokenizer caches: SMG's `--tokenizer-cache-enable-l0` (whole texts) and
//! `--tokenizer-cache-enable-l1` (pieces of text), both exact — a cached encode returns the ids
//! the tokenizer itself would, or the cache is not used.
//!
//! **L0** keys the whole text (and `add_special_tokens`): a repeated prompt costs a hash and a
//! copy. **L1** keys the text *between* special tokens. Hugging Face splits the added
//! vocabulary out first (leftmost-longest over the non-normalized added tokens) and normalizes,
//! pre-tokenizes and tokenizes every remaining piece on its own, so a chat prompt's ids are its
//! pieces' ids with the special tokens' ids between them. A system prompt, an earlier turn or a
//! template's boilerplate is then tokenized once, whatever surrounds it — SMG's L1 reuses a
//! cached *prefix* only; this reuses any repeated piece. It is enabled only for tokenizers where
//! the pieces are provably independent ([`SegmentSplitter::new`] says why not otherwise):
//! no truncation or padding, added tokens without `lstrip`/`rstrip`/`single_word`, special
//! tokens not encoded as text, and no pre-tokenizer that depends on where a piece starts
//! (Metaspace's `prepend_scheme: first`). L1 serves `add_special_tokens = false` only (what chat
//! prompts use); with `true` the post-processor's tokens would have to be spliced in.
//!
//! Both are bounded (L0 by entries, L1 by bytes) and evict oldest-first; each is split into
//! shards whose lock is held for one lookup or insert (never across a tokenization).
//!
//! [`Encoder`] is how a tokenizer encodes: L0, then the pieces (L1, else the byte-level fast
//! path of [`crate::fast_bpe`], else the library), whichever of them this tokenizer has.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use pdgate_filters::prehashed::BuildPrehashed;

use crate::fast_bpe::FastBpe;

/// What `--tokenizer-cache-*` asked for; a zero bound leaves that level off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheConfig {
    /// L0: whole texts kept, at most (`--tokenizer-cache-l0-max-entries`).
    pub l0_max_entries: usize,
    /// L1: bytes of pieces and their ids kept, at most (`--tokenizer-cache-l1-max-memory`).
    pub l1_max_bytes: usize,
}

/// Hit and miss counts since start (per level): what the tests read to see a level used.
#[cfg(test)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CacheStats {
    pub l0_hits: u64,
    pub l0_misses: u64,
    pub l1_hits: u64,
    pub l1_misses: u64,
}

/// How a tokenizer encodes: the caches it was given, and its pieces encoded one by one when
/// they are independent (with the fast path of [`FastBpe`] where it applies).
pub(crate) struct Encoder {
    l0: Option<Bounded>,
    /// `Err`: why this tokenizer's pieces are not independent (then neither L1 nor the fast
    /// path applies).
    pieces: Result<Pieces, String>,
}

/// The text between added tokens, encoded piece by piece.
struct Pieces {
    splitter: SegmentSplitter,
    l1: Option<Bounded>,
    fast: Option<FastBpe>,
}

impl Encoder {
    /// `hf`'s encoder without caches: its pieces' fast path when it has one (built once, at
    /// load: it reads the whole vocabulary).
    pub(crate) fn new(hf: &tokenizers::Tokenizer) -> Encoder {
        let pieces = SegmentSplitter::new(hf).map(|splitter| Pieces {
            splitter,
            l1: None,
            fast: FastBpe::new(hf),
        });
        Encoder { l0: None, pieces }
    }

    /// Gives it the caches `config` asks for (replacing any it had). `Some`: why L1, asked for,
    /// cannot be had (this tokenizer's pieces are not independent); L0 works regardless.
    pub(crate) fn set_caches(&mut self, config: CacheConfig) -> Option<String> {
        self.l0 =
            (config.l0_max_entries > 0).then(|| Bounded::new(config.l0_max_entries, Cost::Entry));
        let l1 = (config.l1_max_bytes > 0).then(|| Bounded::new(config.l1_max_bytes, Cost::Bytes));
        match &mut self.pieces {
            Ok(pieces) => {
                pieces.l1 = l1;
                None
            }
            Err(why) => l1.map(|_| why.clone()),
        }
    }

    /// Whether encoding goes through the fast path (tests).
    #[cfg(test)]
    pub(crate) fn has_fast_path(&self) -> bool {
        self.pieces.as_ref().is_ok_and(|p| p.fast.is_some())
    }

    #[cfg(test)]
    fn has_l1(&self) -> bool {
        self.pieces.as_ref().is_ok_and(|p| p.l1.is_some())
    }

    pub(crate) fn encode(
        &self,
        hf: &tokenizers::Tokenizer,
        text: &str,
        add_special_tokens: bool,
    ) -> tokenizers::Result<Vec<u32>> {
        let l0_key = self
            .l0
            .as_ref()
            .map(|l0| (l0, l0.key(text, add_special_tokens)));
        if let Some((l0, key)) = &l0_key {
            if let Some(ids) = l0.get(*key, text) {
                return Ok(ids.to_vec());
            }
        }
        let ids = match &self.pieces {
            Ok(pieces) if !add_special_tokens && (pieces.l1.is_some() || pieces.fast.is_some()) => {
                pieces.encode(hf, text)?
            }
            _ => uncached(hf, text, add_special_tokens)?,
        };
        if let Some((l0, key)) = l0_key {
            l0.insert(key, text, &ids);
        }
        Ok(ids)
    }

    #[cfg(test)]
    pub(crate) fn stats(&self) -> CacheStats {
        let (l0_hits, l0_misses) = self.l0.as_ref().map_or((0, 0), Bounded::counts);
        let (l1_hits, l1_misses) = self
            .pieces
            .as_ref()
            .ok()
            .and_then(|p| p.l1.as_ref())
            .map_or((0, 0), Bounded::counts);
        CacheStats {
            l0_hits,
            l0_misses,
            l1_hits,
            l1_misses,
        }
    }
}

/// The tokenizer's own encode: what every cached answer must equal.
pub(crate) fn uncached(
    hf: &tokenizers::Tokenizer,
    text: &str,
    add_special_tokens: bool,
) -> tokenizers::Result<Vec<u32>> {
    hf.encode_fast(text, add_special_tokens)
        .map(|e| e.get_ids().to_vec())
}

/// Cuts a text where Hugging Face's added-vocabulary pass cuts it.
struct SegmentSplitter {
    /// The non-normalized added tokens, matched as Hugging Face matches them (leftmost-longest).
    tokens: AhoCorasick,
    /// Pattern index → token id.
    ids: Vec<u32>,
}

impl SegmentSplitter {
    /// `Err`: why this tokenizer's pieces cannot be encoded one by one.
    fn new(hf: &tokenizers::Tokenizer) -> Result<SegmentSplitter, String> {
        if hf.get_truncation().is_some() || hf.get_padding().is_some() {
            return Err("the tokenizer truncates or pads".into());
        }
        if hf.get_encode_special_tokens() {
            return Err("the tokenizer encodes special tokens as text".into());
        }
        if let Some(pre) = hf.get_pre_tokenizer() {
            // Metaspace with `prepend_scheme: first` prepends only to the piece at offset 0.
            let json = serde_json::to_string(pre).map_err(|e| e.to_string())?;
            if json.contains(r#""prepend_scheme":"first""#) {
                return Err("the pre-tokenizer treats the text's first piece apart (Metaspace prepend_scheme first)".into());
            }
        }
        let mut patterns = Vec::new();
        let mut ids = Vec::new();
        let mut decoder: Vec<_> = hf.get_added_tokens_decoder().into_iter().collect();
        decoder.sort_by_key(|(id, _)| *id);
        for (id, token) in decoder {
            if token.normalized || token.content.is_empty() {
                continue;
            }
            if token.lstrip || token.rstrip || token.single_word {
                return Err(format!(
                    "added token {:?} strips whitespace or matches single words",
                    token.content
                ));
            }
            patterns.push(token.content);
            ids.push(id);
        }
        let tokens = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)
            .map_err(|e| e.to_string())?;
        Ok(SegmentSplitter { tokens, ids })
    }
}

impl Pieces {
    fn encode(&self, hf: &tokenizers::Tokenizer, text: &str) -> tokenizers::Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 8);
        let mut at = 0;
        for m in self.splitter.tokens.find_iter(text) {
            self.piece(hf, &text[at..m.start()], &mut out)?;
            out.push(self.splitter.ids[m.pattern().as_usize()]);
            at = m.end();
        }
        self.piece(hf, &text[at..], &mut out)?;
        Ok(out)
    }

    /// One piece's ids: from L1, else from the fast path or the tokenizer (then kept in L1).
    fn piece(
        &self,
        hf: &tokenizers::Tokenizer,
        piece: &str,
        out: &mut Vec<u32>,
    ) -> tokenizers::Result<()> {
        if piece.is_empty() {
            return Ok(());
        }
        let key = self.l1.as_ref().map(|l1| (l1, l1.key(piece, false)));
        if let Some((l1, key)) = &key {
            if let Some(ids) = l1.get(*key, piece) {
                out.extend_from_slice(&ids);
                return Ok(());
            }
        }
        let start = out.len();
        let fast = self.fast.as_ref().and_then(|f| f.encode_piece(piece, out));
        if fast.is_none() {
            out.extend(uncached(hf, piece, false)?);
        }
        if let Some((l1, key)) = key {
            l1.insert(key, piece, &out[start..]);
        }
        Ok(())
    }
}

/// What an entry costs against a [`Bounded`]'s budget.
#[derive(Clone, Copy)]
enum Cost {
    /// One per entry (L0's `max_entries`).
    Entry,
    /// Its key and ids in bytes, plus the bookkeeping (L1's `max_memory`).
    Bytes,
}

impl Cost {
    fn of(self, text: &str, ids: &[u32]) -> usize {
        match self {
            Cost::Entry => 1,
            Cost::Bytes => text.len() + 4 * ids.len() + ENTRY_OVERHEAD,
        }
    }
}

/// Allocation headers, the map slot and the eviction queue's slot of one entry, roughly.
const ENTRY_OVERHEAD: usize = 96;
const SHARDS: usize = 8;

/// A map from text to ids, bounded, oldest-first eviction, sharded by the text's hash.
struct Bounded {
    hasher: std::hash::RandomState,
    shards: Box<[Mutex<Shard>]>,
    budget_per_shard: usize,
    cost: Cost,
    #[cfg(test)]
    hits: std::sync::atomic::AtomicU64,
    #[cfg(test)]
    misses: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct Shard {
    map: HashMap<u64, Entry, BuildPrehashed>,
    /// Keys in insertion order; each key of `map` appears once.
    order: VecDeque<u64>,
    used: usize,
}

struct Entry {
    text: Box<str>,
    ids: Arc<[u32]>,
    cost: usize,
}

impl Bounded {
    fn new(budget: usize, cost: Cost) -> Bounded {
        Bounded {
            hasher: std::hash::RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            budget_per_shard: budget.div_ceil(SHARDS).max(1),
            cost,
            #[cfg(test)]
            hits: Default::default(),
            #[cfg(test)]
            misses: Default::default(),
        }
    }

    fn key(&self, text: &str, flag: bool) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write(text.as_bytes());
        h.write_u8(u8::from(flag));
        h.finish()
    }

    fn shard(&self, key: u64) -> std::sync::MutexGuard<'_, Shard> {
        // The high bits pick the shard; the map uses the whole key.
        let i = (key >> 56) as usize % SHARDS;
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, key: u64, text: &str) -> Option<Arc<[u32]>> {
        let found = self
            .shard(key)
            .map
            .get(&key)
            .filter(|e| &*e.text == text)
            .map(|e| e.ids.clone());
        #[cfg(test)]
        {
            use std::sync::atomic::Ordering::Relaxed;
            match found {
                Some(_) => self.hits.fetch_add(1, Relaxed),
                None => self.misses.fetch_add(1, Relaxed),
            };
        }
        found
    }

    fn insert(&self, key: u64, text: &str, ids: &[u32]) {
        let cost = self.cost.of(text, ids);
        if cost > self.budget_per_shard {
            return;
        }
        let entry = Entry {
            text: text.into(),
            ids: ids.into(),
            cost,
        };
        let mut shard = self.shard(key);
        let shard = &mut *shard;
        match shard.map.insert(key, entry) {
            // Two texts with one hash: the newer one takes the slot (and its place in `order`).
            Some(old) => shard.used -= old.cost,
            None => shard.order.push_back(key),
        }
        shard.used += cost;
        while shard.used > self.budget_per_shard {
            let Some(oldest) = shard.order.pop_front() else {
                break;
            };
            if let Some(e) = shard.map.remove(&oldest) {
                shard.used -= e.cost;
            }
        }
    }

    #[cfg(test)]
    fn counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.hits.load(Relaxed), self.misses.load(Relaxed))
    }
}

#[cfg(test)]
mod tests;
