//! The deterministic fake model shared by every role (mock-engines-spec §3).
//!
//! Everything here is pure: the same prompt and sampling spec always give the same tokens, text and
//! logprobs, so a prefill/decode pair that hands its "KV" over correctly produces exactly the output
//! of a single (`Both`) worker, and a handoff that delivers the wrong state produces different text.
//! The "KV" of a prompt is a 64-bit state folded over its token ids; the decode side of a PD pair
//! only ever continues from the state it received.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

/// Padding token id.
pub const PAD: u32 = 0;
/// Beginning-of-sequence token id (prepended to every prompt).
pub const BOS: u32 = 1;
/// End-of-sequence token id.
pub const EOS: u32 = 2;
/// First id of the generated-word vocabulary (`VOCAB_OUT`).
pub const VOCAB_OUT_BASE: u32 = 40_000;
/// Size of the generated-word vocabulary.
pub const VOCAB_OUT_SIZE: u64 = 4096;

const SYLLABLES: [&str; 16] = [
    "ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "vu", "be", "do", "fa", "gi", "ho", "ju", "ze",
];

/// A splitmix64 finalizer: the avalanche step behind every hash here.
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Deterministic 64-bit hash of `bytes` under `seed` (8-byte lanes folded through splitmix64).
pub fn hash_bytes(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = splitmix64(seed ^ (bytes.len() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    for chunk in bytes.chunks(8) {
        let mut lane = [0u8; 8];
        lane[..chunk.len()].copy_from_slice(chunk);
        h = splitmix64(h ^ u64::from_le_bytes(lane));
    }
    h
}

/// Folds one token into a state: `S_i = mix(S_{i-1}, tok_i)`.
pub fn mix(state: u64, token: u64) -> u64 {
    let mut buf = [0u8; 16];
    buf[..8].copy_from_slice(&state.to_le_bytes());
    buf[8..].copy_from_slice(&token.to_le_bytes());
    hash_bytes(0x005E_ED0F_4B1D, &buf)
}

fn model_seed(model: &str) -> u64 {
    hash_bytes(0x6D6F_636B, model.as_bytes())
}

fn piece_table() -> &'static Mutex<HashMap<u32, String>> {
    static TABLE: OnceLock<Mutex<HashMap<u32, String>>> = OnceLock::new();
    TABLE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Splits text into GPT-ish pieces: `\s*\w+|\s*[^\w\s]` (trailing whitespace is dropped).
pub fn pieces(text: &str) -> Vec<&str> {
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some(&(start, _)) = chars.peek() {
        while matches!(chars.peek(), Some(&(_, c)) if c.is_whitespace()) {
            chars.next();
        }
        let Some(&(_, first)) = chars.peek() else {
            break;
        };
        chars.next();
        if is_word(first) {
            while matches!(chars.peek(), Some(&(_, c)) if is_word(c)) {
                chars.next();
            }
        }
        let end = chars.peek().map_or(text.len(), |&(i, _)| i);
        out.push(&text[start..end]);
    }
    out
}

/// Tokenizes text without BOS: `id = 1000 + hash(model, piece) % 30000`.
pub fn tokenize(model: &str, text: &str) -> Vec<u32> {
    let seed = model_seed(model);
    let mut table = piece_table().lock().unwrap_or_else(|e| e.into_inner());
    pieces(text)
        .into_iter()
        .map(|p| {
            let id = 1000 + (hash_bytes(seed, p.as_bytes()) % 30_000) as u32;
            table.entry(id).or_insert_with(|| p.to_string());
            id
        })
        .collect()
}

/// Tokenizes a text prompt: BOS followed by its pieces.
pub fn encode_prompt(model: &str, text: &str) -> Vec<u32> {
    let mut ids = vec![BOS];
    ids.extend(tokenize(model, text));
    ids
}

/// The fixed chat template of both engines:
/// `"<|bos|>" + for m in messages: "<|{role}|>\n{content}\n" + "<|assistant|>\n"`.
pub fn chat_template(messages: &[(String, String)]) -> String {
    let mut s = String::from("<|bos|>");
    for (role, content) in messages {
        s.push_str(&format!("<|{role}|>\n{content}\n"));
    }
    s.push_str("<|assistant|>\n");
    s
}

/// Token ids of a chat conversation: the `<|bos|>` marker becomes the BOS id.
pub fn encode_chat(model: &str, messages: &[(String, String)]) -> Vec<u32> {
    let templ = chat_template(messages);
    encode_prompt(model, templ.trim_start_matches("<|bos|>"))
}

/// The text of one token id (special ids render as empty text, like `skip_special_tokens`).
pub fn token_text(id: u32) -> String {
    if (VOCAB_OUT_BASE..VOCAB_OUT_BASE + VOCAB_OUT_SIZE as u32).contains(&id) {
        let k = (id - VOCAB_OUT_BASE) as usize;
        return format!(
            " {}{}{}",
            SYLLABLES[k >> 8],
            SYLLABLES[(k >> 4) & 15],
            SYLLABLES[k & 15]
        );
    }
    if id < 1000 {
        return String::new();
    }
    let table = piece_table().lock().unwrap_or_else(|e| e.into_inner());
    table.get(&id).cloned().unwrap_or_default()
}

/// Concatenated text of ids.
pub fn detokenize(ids: &[u32]) -> String {
    ids.iter().map(|&i| token_text(i)).collect()
}

/// `S_0`: the state before any prompt token. `seed` and the sample index of `n>1` perturb it.
pub fn initial_state(model: &str, seed: Option<u64>, sample: Option<usize>) -> u64 {
    let mut s = model_seed(model);
    if let Some(seed) = seed {
        s ^= seed;
    }
    if let Some(i) = sample {
        s ^= i as u64 + 1;
    }
    s
}

/// The state after folding `ids` into `s0` (the prompt "KV" digest).
pub fn prompt_state(s0: u64, ids: &[u32]) -> u64 {
    ids.iter().fold(s0, |s, &t| mix(s, t as u64))
}

/// The state a decode ends up with when no KV arrived (deterministic garbage).
pub fn garbage_state(s0: u64, prompt_len: usize) -> u64 {
    mix(s0, 0xDEAD ^ prompt_len as u64)
}

/// The greedy word for a state in the built-in pseudo-word vocabulary.
pub fn word_for(state: u64) -> u32 {
    VOCAB_OUT_BASE + ((state >> 7) % VOCAB_OUT_SIZE) as u32
}

/// Which token ids the model may emit, which of them end a sequence, and (optionally) their
/// text.
///
/// The HTTP mocks detokenize themselves, so they emit the built-in pseudo-words (ids 40000+,
/// EOS 2). A gRPC mock's output is detokenized by the gateway with *its* tokenizer, so a test
/// points the model at ids that tokenizer knows ([`OutputVocab::ids`], [`OutputVocab::range`]) and
/// at its EOS ids; with [`OutputVocab::with_texts`] the engine can also match stop strings the
/// way vLLM and TokenSpeed do. Every engine of a PD pair and the [`reference`] must share one
/// vocabulary.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputVocab {
    words: Words,
    /// Text of each id of `words` (same order) when known; empty = unknown (stop strings never
    /// match, as with a tokenizer the engine does not have).
    texts: Arc<[String]>,
    /// End-of-sequence ids; the model emits the first, and any of them ends a sequence.
    eos: Arc<[u32]>,
}

#[derive(Clone, Debug, PartialEq)]
enum Words {
    Pseudo,
    Range(Range<u32>),
    List(Arc<[u32]>),
}

impl Default for OutputVocab {
    fn default() -> Self {
        OutputVocab::pseudo_words()
    }
}

impl OutputVocab {
    /// The built-in vocabulary of the HTTP mocks: 4096 pseudo-words (ids 40000+), EOS 2.
    pub fn pseudo_words() -> Self {
        OutputVocab {
            words: Words::Pseudo,
            texts: Arc::from(Vec::new()),
            eos: Arc::from(vec![EOS]),
        }
    }

    /// Emits only `ids` (at least one), ends on any of `eos` (at least one).
    pub fn ids(ids: impl IntoIterator<Item = u32>, eos: impl IntoIterator<Item = u32>) -> Self {
        let ids: Vec<u32> = ids.into_iter().collect();
        assert!(
            !ids.is_empty(),
            "an output vocabulary needs at least one id"
        );
        OutputVocab {
            words: Words::List(Arc::from(ids)),
            texts: Arc::from(Vec::new()),
            eos: eos_list(eos),
        }
    }

    /// Emits ids of `range` (not empty), ends on any of `eos` (at least one).
    pub fn range(range: Range<u32>, eos: impl IntoIterator<Item = u32>) -> Self {
        assert!(
            !range.is_empty(),
            "an output vocabulary needs at least one id"
        );
        OutputVocab {
            words: Words::Range(range),
            texts: Arc::from(Vec::new()),
            eos: eos_list(eos),
        }
    }

    /// Emits the ids of `pairs` and knows their text (what the engine matches stop strings on).
    pub fn with_texts(
        pairs: impl IntoIterator<Item = (u32, String)>,
        eos: impl IntoIterator<Item = u32>,
    ) -> Self {
        let (ids, texts): (Vec<u32>, Vec<String>) = pairs.into_iter().unzip();
        assert!(
            !ids.is_empty(),
            "an output vocabulary needs at least one id"
        );
        OutputVocab {
            words: Words::List(Arc::from(ids)),
            texts: Arc::from(texts),
            eos: eos_list(eos),
        }
    }

    /// The greedy word for a state (before the EOS decision).
    pub fn word_for(&self, state: u64) -> u32 {
        let pick = state >> 7;
        match &self.words {
            Words::Pseudo => word_for(state),
            Words::Range(r) => r.start + (pick % (r.end - r.start) as u64) as u32,
            Words::List(ids) => ids[(pick % ids.len() as u64) as usize],
        }
    }

    /// The id the model emits to end a sequence.
    pub fn eos_token(&self) -> u32 {
        self.eos[0]
    }

    /// Every id that ends a sequence (what `GetModelInfo.eos_token_ids` reports).
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eos.contains(&id)
    }

    /// One past the largest id the model can emit or end on (`vocab_size` of the info RPCs).
    pub fn vocab_size(&self) -> u32 {
        let words_end = match &self.words {
            Words::Pseudo => VOCAB_OUT_BASE + VOCAB_OUT_SIZE as u32,
            Words::Range(r) => r.end,
            Words::List(ids) => ids.iter().max().map_or(0, |m| m + 1),
        };
        let eos_end = self.eos.iter().max().map_or(0, |m| m + 1);
        words_end.max(eos_end)
    }

    /// The text of an emitted id: the pseudo-word, the configured text, or empty when unknown.
    pub fn text_of(&self, id: u32) -> String {
        match &self.words {
            Words::Pseudo => token_text(id),
            Words::List(ids) if !self.texts.is_empty() => ids
                .iter()
                .position(|&x| x == id)
                .map(|i| self.texts[i].clone())
                .unwrap_or_default(),
            _ => String::new(),
        }
    }

    /// The `k`-th alternative at a state (`k = 0` is the greedy word).
    fn alternative(&self, state: u64, k: u64) -> u32 {
        self.word_for(state.wrapping_add((k * 977) << 7))
    }
}

fn eos_list(eos: impl IntoIterator<Item = u32>) -> Arc<[u32]> {
    let eos: Vec<u32> = eos.into_iter().collect();
    assert!(
        !eos.is_empty(),
        "an output vocabulary needs at least one EOS id"
    );
    Arc::from(eos)
}

/// `lp(S, t) = -((S ^ t) % 5000) / 1000`.
pub fn logprob(state: u64, token: u32) -> f64 {
    -(((state ^ token as u64) % 5000) as f64) / 1000.0
}

/// The `k` most likely alternatives at a state, the chosen word first, with decreasing logprob.
pub fn top_logprobs(state: u64, chosen: u32, k: usize) -> Vec<(u32, f64)> {
    top_logprobs_in(&OutputVocab::pseudo_words(), state, chosen, k)
}

/// [`top_logprobs`] drawn from `vocab`.
pub fn top_logprobs_in(vocab: &OutputVocab, state: u64, chosen: u32, k: usize) -> Vec<(u32, f64)> {
    let base = logprob(state, chosen);
    (0..k)
        .map(|j| {
            let id = if j == 0 {
                chosen
            } else {
                vocab.alternative(state, j as u64)
            };
            (id, base - 0.25 * j as f64)
        })
        .collect()
}

/// Per-request sampling knobs the fake model honours.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingSpec {
    pub max_new_tokens: usize,
    pub min_new_tokens: usize,
    pub ignore_eos: bool,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    /// Emit EOS when `state % eos_period == 0` (0 = never).
    pub eos_period: u64,
    pub seed: Option<u64>,
    /// Top alternatives per position (0 = none).
    pub top_logprobs: usize,
    /// The ids the model emits and ends on.
    pub vocab: OutputVocab,
}

impl Default for SamplingSpec {
    fn default() -> Self {
        SamplingSpec {
            max_new_tokens: 16,
            min_new_tokens: 0,
            ignore_eos: false,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            eos_period: 0,
            seed: None,
            top_logprobs: 0,
            vocab: OutputVocab::pseudo_words(),
        }
    }
}

/// One generated token.
#[derive(Clone, Debug, PartialEq)]
pub struct GenToken {
    pub id: u32,
    pub text: String,
    pub logprob: f64,
    pub top: Vec<(u32, f64)>,
}

/// What a stop condition matched.
#[derive(Clone, Debug, PartialEq)]
pub enum Matched {
    Token(u32),
    Text(String),
}

/// Why generation ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Finish {
    /// Hit the token cap; `length` is what SGLang reports (the prefill leg reports 0).
    Length(usize),
    Stop(Matched),
}

/// Autoregressive decoder over the fake model.
#[derive(Clone, Debug)]
pub struct Decoder {
    state: u64,
    spec: SamplingSpec,
    pub tokens: Vec<GenToken>,
    /// Full detokenized text (before stop trimming).
    raw_text: String,
    pub finish: Option<Finish>,
    /// When set, the first token is forced to EOS (`eos_first_token` fault).
    force_eos_first: bool,
}

impl Decoder {
    /// A decoder continuing from the state after the prompt.
    pub fn new(state_after_prompt: u64, spec: SamplingSpec) -> Self {
        Decoder {
            state: state_after_prompt,
            spec,
            tokens: Vec::new(),
            raw_text: String::new(),
            finish: None,
            force_eos_first: false,
        }
    }

    /// Forces the first token to be EOS unless `ignore_eos` (the `eos_first_token` fault).
    pub fn force_eos_first(&mut self) {
        self.force_eos_first = true;
    }

    /// The current state (after every emitted token).
    pub fn state(&self) -> u64 {
        self.state
    }

    fn choose(&self) -> u32 {
        let n = self.tokens.len();
        let eos_allowed = !self.spec.ignore_eos && n >= self.spec.min_new_tokens;
        if eos_allowed && n == 0 && self.force_eos_first {
            return self.spec.vocab.eos_token();
        }
        if eos_allowed && self.spec.eos_period > 0 && self.state % self.spec.eos_period == 0 {
            return self.spec.vocab.eos_token();
        }
        self.spec.vocab.word_for(self.state)
    }

    /// The token the next step would emit, with its logprob (what a prefill hands over as `t0`).
    pub fn peek(&self) -> (u32, f64) {
        let t = self.choose();
        (t, logprob(self.state, t))
    }

    /// Emits the next token, or `None` when finished.
    pub fn step(&mut self) -> Option<GenToken> {
        let (t, lp) = self.peek();
        self.step_forced(t, lp)
    }

    /// Emits a given token (a decode taking `t0` from the KV payload).
    pub fn step_forced(&mut self, id: u32, lp: f64) -> Option<GenToken> {
        if self.finish.is_some() {
            return None;
        }
        if self.tokens.len() >= self.spec.max_new_tokens {
            self.finish = Some(Finish::Length(self.tokens.len()));
            return None;
        }
        let top = top_logprobs_in(&self.spec.vocab, self.state, id, self.spec.top_logprobs);
        let tok = GenToken {
            id,
            text: self.spec.vocab.text_of(id),
            logprob: lp,
            top,
        };
        self.state = mix(self.state, id as u64);
        self.raw_text.push_str(&tok.text);
        self.tokens.push(tok.clone());
        let ends_sequence = !self.spec.ignore_eos && self.spec.vocab.is_eos(id);
        if ends_sequence || self.spec.stop_token_ids.contains(&id) {
            self.finish = Some(Finish::Stop(Matched::Token(id)));
        } else if let Some(s) = self
            .spec
            .stop
            .iter()
            .find(|s| !s.is_empty() && self.raw_text.contains(s.as_str()))
        {
            self.finish = Some(Finish::Stop(Matched::Text(s.clone())));
        } else if self.tokens.len() >= self.spec.max_new_tokens {
            self.finish = Some(Finish::Length(self.tokens.len()));
        }
        Some(tok)
    }

    /// Output text: trimmed before a matched stop string, and holding back a possible stop prefix
    /// while unfinished (so streamed deltas never need retracting).
    pub fn visible_text(&self) -> &str {
        if let Some(Finish::Stop(Matched::Text(s))) = &self.finish {
            let cut = self
                .raw_text
                .find(s.as_str())
                .unwrap_or(self.raw_text.len());
            return &self.raw_text[..cut];
        }
        if self.finish.is_some() || self.spec.stop.is_empty() {
            return &self.raw_text;
        }
        let hold = self
            .spec
            .stop
            .iter()
            .map(|s| s.len())
            .max()
            .unwrap_or(1)
            .saturating_sub(1);
        let mut cut = self.raw_text.len().saturating_sub(hold);
        while !self.raw_text.is_char_boundary(cut) {
            cut -= 1;
        }
        &self.raw_text[..cut]
    }
}

/// One prompt-logprob row: `(logprob, or None at position 0; token id; top alternatives)`.
pub type LogprobRow = (Option<f64>, u32, Vec<(u32, f64)>);

/// Prompt logprob rows: position 0 is `None`, position i is `lp(S_{i-1}, tok_i)`.
/// Rows before `start` are omitted. Also returns top alternatives per row when `top_k > 0`.
pub fn input_logprobs(s0: u64, ids: &[u32], start: usize, top_k: usize) -> Vec<LogprobRow> {
    let mut s = s0;
    let mut out = Vec::with_capacity(ids.len());
    for (i, &t) in ids.iter().enumerate() {
        if i >= start {
            if i == 0 {
                out.push((None, t, Vec::new()));
            } else {
                out.push((Some(logprob(s, t)), t, top_logprobs(s, t, top_k)));
            }
        }
        s = mix(s, t as u64);
    }
    out
}

/// The output a single (non-PD) worker produces for a prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct RefOutput {
    pub token_ids: Vec<u32>,
    pub text: String,
    pub logprobs: Vec<f64>,
    pub finish: Finish,
    pub prompt_state: u64,
}

/// Reference generation: what `Both` (and every correct PD pair) returns for `prompt_ids`.
pub fn reference(
    model: &str,
    prompt_ids: &[u32],
    spec: &SamplingSpec,
    sample: Option<usize>,
) -> RefOutput {
    let s_n = prompt_state(initial_state(model, spec.seed, sample), prompt_ids);
    let mut d = Decoder::new(s_n, spec.clone());
    while d.step().is_some() {}
    RefOutput {
        token_ids: d.tokens.iter().map(|t| t.id).collect(),
        text: d.visible_text().to_string(),
        logprobs: d.tokens.iter().map(|t| t.logprob).collect(),
        finish: d.finish.clone().unwrap_or(Finish::Length(0)),
        prompt_state: s_n,
    }
}

/// First id of the vision tokens the model folds at image placeholder positions: far above any
/// tokenizer's vocabulary, so an image position never folds like a text token.
pub const VISION_TOKEN_BASE: u32 = 1 << 30;

/// The token the model folds at position `j` of an image placeholder range whose image has
/// `feature` (what the fake vision tower made of its pixels): `VISION_TOKEN_BASE + f(feature, j)`.
pub fn vision_token(feature: u64, j: usize) -> u32 {
    VISION_TOKEN_BASE + (splitmix64(feature ^ splitmix64(j as u64 + 1)) % (1 << 29)) as u32
}

/// The ids the model folds for a prompt with images: inside item i's placeholder range (a
/// range of prompt positions, with the item's feature) the vision tokens, elsewhere the ids.
/// Ranges past the prompt's end are clipped.
pub fn fold_media(prompt_ids: &[u32], items: &[(Range<usize>, u64)]) -> Vec<u32> {
    let mut ids = prompt_ids.to_vec();
    for (range, feature) in items {
        let end = range.end.min(ids.len());
        for (j, pos) in (range.start..end).enumerate() {
            ids[pos] = vision_token(*feature, j);
        }
    }
    ids
}

/// [`reference`] for a prompt with images: `items` are the placeholder ranges with their
/// images' features, in prompt order ([`crate::vision::feature_of_rgb`] predicts a solid
/// colour's). With no items this is [`reference`].
pub fn reference_with_media(
    model: &str,
    prompt_ids: &[u32],
    items: &[(Range<usize>, u64)],
    spec: &SamplingSpec,
    sample: Option<usize>,
) -> RefOutput {
    reference(model, &fold_media(prompt_ids, items), spec, sample)
}

/// Rerank relevance of one document given the query's prompt state.
pub fn rerank_score(model: &str, query_state: u64, document: &str) -> f64 {
    let s = prompt_state(query_state, &tokenize(model, document));
    ((s >> 11) % 1_000_000) as f64 / 1_000_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_follow_the_gpt_like_regex() {
        assert_eq!(
            pieces("The capital, of  France"),
            vec!["The", " capital", ",", " of", "  France"]
        );
        assert_eq!(pieces("  "), Vec::<&str>::new());
    }

    #[test]
    fn reference_is_deterministic_and_prompt_dependent() {
        let spec = SamplingSpec {
            max_new_tokens: 8,
            ..Default::default()
        };
        let a = reference(
            "m",
            &encode_prompt("m", "The capital of France is"),
            &spec,
            None,
        );
        let b = reference(
            "m",
            &encode_prompt("m", "The capital of France is"),
            &spec,
            None,
        );
        let c = reference(
            "m",
            &encode_prompt("m", "The capital of Spain is"),
            &spec,
            None,
        );
        assert_eq!(a, b);
        assert_ne!(a.text, c.text);
        assert_eq!(a.token_ids.len(), 8);
        assert_eq!(a.finish, Finish::Length(8));
    }

    #[test]
    fn continuing_from_a_handed_over_state_matches_the_reference() {
        let spec = SamplingSpec {
            max_new_tokens: 5,
            ..Default::default()
        };
        let ids = encode_prompt("m", "hello world");
        let r = reference("m", &ids, &spec, None);
        let s_n = prompt_state(initial_state("m", None, None), &ids);
        let (t0, lp0) = Decoder::new(s_n, spec.clone()).peek();
        let mut d = Decoder::new(s_n, spec);
        d.step_forced(t0, lp0);
        while d.step().is_some() {}
        assert_eq!(
            d.tokens.iter().map(|t| t.id).collect::<Vec<_>>(),
            r.token_ids
        );
    }

    #[test]
    fn stop_strings_trim_and_hold_back() {
        let spec = SamplingSpec {
            max_new_tokens: 6,
            ..Default::default()
        };
        let ids = encode_prompt("m", "x");
        let r = reference("m", &ids, &spec, None);
        let stop = token_text(r.token_ids[2]).trim().to_string();
        let spec2 = SamplingSpec {
            stop: vec![stop.clone()],
            ..spec
        };
        let r2 = reference("m", &ids, &spec2, None);
        assert_eq!(r2.finish, Finish::Stop(Matched::Text(stop)));
        assert!(r.text.starts_with(&r2.text));
        assert_eq!(r2.token_ids.len(), 3);
    }

    #[test]
    fn an_output_vocabulary_bounds_what_the_model_emits() {
        let ids = encode_prompt("m", "x");
        let spec = SamplingSpec {
            max_new_tokens: 30,
            eos_period: 4,
            vocab: OutputVocab::range(500..510, [3, 4]),
            ..Default::default()
        };
        let r = reference("m", &ids, &spec, None);
        let (last, words) = r.token_ids.split_last().unwrap();
        assert!(words.iter().all(|t| (500..510).contains(t)), "{r:?}");
        assert_eq!(*last, 3, "the first EOS id is emitted");
        assert_eq!(r.finish, Finish::Stop(Matched::Token(3)));
        assert_eq!(spec.vocab.eos_ids(), &[3, 4]);
        assert_eq!(spec.vocab.vocab_size(), 510);
        // Any EOS id ends a sequence, also when forced (a decode taking t0 from its prefill).
        let mut d = Decoder::new(r.prompt_state, spec.clone());
        d.step_forced(4, -0.5);
        assert_eq!(d.finish, Some(Finish::Stop(Matched::Token(4))));
        // The pseudo-word default is what the HTTP mocks always emitted.
        let plain = SamplingSpec {
            max_new_tokens: 5,
            ..Default::default()
        };
        let r = reference("m", &ids, &plain, None);
        assert!(r.token_ids.iter().all(|&t| t >= VOCAB_OUT_BASE));
        assert_eq!(r.text, detokenize(&r.token_ids));
    }

    #[test]
    fn vocabulary_texts_let_stop_strings_match() {
        let pairs: Vec<(u32, String)> = (0..20).map(|i| (100 + i, format!(" t{i}"))).collect();
        let vocab = OutputVocab::with_texts(pairs, [1]);
        let ids = encode_prompt("m", "y");
        let base = SamplingSpec {
            max_new_tokens: 6,
            vocab: vocab.clone(),
            ..Default::default()
        };
        let r = reference("m", &ids, &base, None);
        let second = vocab.text_of(r.token_ids[1]);
        assert!(second.starts_with(" t"));
        let stopped = reference(
            "m",
            &ids,
            &SamplingSpec {
                stop: vec![second.clone()],
                ..base
            },
            None,
        );
        assert!(stopped.token_ids.len() <= 2);
        assert_eq!(stopped.finish, Finish::Stop(Matched::Text(second)));
        // Ids without a known text never match a stop string.
        assert_eq!(OutputVocab::range(0..5, [9]).text_of(3), "");
    }

    #[test]
    fn images_change_the_state_only_inside_their_placeholders() {
        let spec = SamplingSpec {
            max_new_tokens: 6,
            ..Default::default()
        };
        let ids = [1, 500, 9, 9, 9, 501];
        let text = reference("m", &ids, &spec, None);
        assert_eq!(reference_with_media("m", &ids, &[], &spec, None), text);
        let red = reference_with_media("m", &ids, &[(2..5, 7)], &spec, None);
        let blue = reference_with_media("m", &ids, &[(2..5, 8)], &spec, None);
        assert_ne!(red.token_ids, text.token_ids);
        assert_ne!(red.token_ids, blue.token_ids);
        let folded = fold_media(&ids, &[(2..5, 7)]);
        assert_eq!(folded[..2], ids[..2]);
        assert_eq!(folded[5], 501);
        assert!(folded[2..5].iter().all(|&t| t >= VISION_TOKEN_BASE));
    }

    #[test]
    fn eos_period_and_min_tokens() {
        let ids = encode_prompt("m", "x");
        let spec = SamplingSpec {
            max_new_tokens: 50,
            eos_period: 3,
            ..Default::default()
        };
        let r = reference("m", &ids, &spec, None);
        assert!(r.token_ids.len() < 50);
        assert_eq!(*r.token_ids.last().unwrap(), EOS);
        let spec_ign = SamplingSpec {
            ignore_eos: true,
            ..spec
        };
        assert_eq!(reference("m", &ids, &spec_ign, None).token_ids.len(), 50);
    }
}
