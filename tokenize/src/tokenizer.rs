//! One loaded model's text side: the Hugging Face tokenizer, its special tokens, EOS ids and chat
//! templates. Loaded once per model and shared (`Arc<Tokenizer>`): every method takes `&self`
//! and the type is `Send + Sync`.
//!
//! The API is synchronous and CPU-bound. Encoding a large prompt (hundreds of KB) or rendering a
//! long chat takes milliseconds, so async callers run it off the reactor (`spawn_blocking` or a
//! small pool) above a size threshold (SMG uses 512 bytes); decoding a token is microseconds and
//! stays inline.

use std::collections::BTreeMap;

use tokenizers::processors::template::TemplateProcessing;

use crate::byte_level::ByteTable;
use crate::chat_template::{ChatInput, ChatTemplate, ChatTemplates, ContentFormat};
use crate::encode_cache::{CacheConfig, Encoder};
use crate::error::{LoadError, TemplateError, TokenizeError};
use crate::model_dir::{ModelFiles, ModelSource};
use crate::special_tokens::SpecialTokens;

/// A model's tokenizer, special tokens, EOS ids and chat templates.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    special_tokens: SpecialTokens,
    eos_token_ids: Vec<u32>,
    chat_templates: ChatTemplates,
    /// Token bytes for byte-level tokenizers (the stream decoder's fast, exact path).
    byte_table: Option<ByteTable>,
    /// How texts are encoded: `--tokenizer-cache-*` and the fast path (see [`Encoder`]).
    encoder: Encoder,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("special_tokens", &self.special_tokens)
            .field("eos_token_ids", &self.eos_token_ids)
            .field("chat_templates", &self.chat_templates)
            .finish()
    }
}

fn tokenize_error(e: impl std::fmt::Display) -> TokenizeError {
    TokenizeError(e.to_string())
}

impl Tokenizer {
    /// Loads a model's tokenizer and templates from local files (see [`ModelSource`]).
    pub fn load(source: &ModelSource) -> Result<Self, LoadError> {
        let files = ModelFiles::read(source)?;
        let mut inner = tokenizers::Tokenizer::from_bytes(&files.tokenizer_bytes).map_err(|e| {
            LoadError::new(
                &files.tokenizer_json,
                format!("is not a tokenizer this build can load: {e}"),
            )
        })?;

        // Hugging Face's Llama-family tokenizers rebuild their post-processor from
        // `add_bos_token` / `add_eos_token`; as SMG does, only when one of them is set to true.
        if files.add_bos_token == Some(true) || files.add_eos_token == Some(true) {
            if let Some(pp) = bos_eos_post_processor(
                &inner,
                &files.special_tokens,
                files.add_bos_token == Some(true),
                files.add_eos_token == Some(true),
            ) {
                inner.with_post_processor(Some(pp));
            }
        }

        let compile = |(source, path): &(String, std::path::PathBuf)| {
            ChatTemplate::new(source)
                .map_err(|e| LoadError::new(path, format!("chat template does not compile: {e}")))
        };
        let default = files.templates.default.as_ref().map(compile).transpose()?;
        let mut named = BTreeMap::new();
        for (name, src) in &files.templates.named {
            named.insert(name.clone(), compile(src)?);
        }

        // EOS: config.json ∪ generation_config.json; a directory with neither falls back to the
        // tokenizer's own eos_token so generation still ends.
        let mut eos_token_ids = files.config_eos_ids;
        if eos_token_ids.is_empty() {
            if let Some(id) = files
                .special_tokens
                .eos_token
                .as_deref()
                .and_then(|t| inner.token_to_id(t))
            {
                eos_token_ids.push(id);
            }
        }

        let byte_table = ByteTable::build(&inner);
        let encoder = Encoder::new(&inner);
        Ok(Self {
            byte_table,
            special_tokens: files.special_tokens,
            eos_token_ids,
            chat_templates: ChatTemplates::new(default, named),
            encoder,
            inner,
        })
    }

    /// Turns on the encode caches `config` asks for (see [`CacheConfig`]; both exact). `Some`:
    /// why this tokenizer cannot have the piece cache (L1) — the whole-text cache (L0) is on
    /// regardless, when asked for.
    pub fn set_cache(&mut self, config: CacheConfig) -> Option<String> {
        self.encoder.set_caches(config)
    }

    /// Loads a model directory (`--model-path DIR`).
    pub fn from_dir(dir: impl Into<std::path::PathBuf>) -> Result<Self, LoadError> {
        Self::load(&ModelSource::dir(dir))
    }

    /// Token ids of `text`. `add_special_tokens` runs the tokenizer's post-processor (a BOS, for
    /// models that add one); special-token strings in `text` (`<|im_start|>`) always encode to
    /// their ids, as in Hugging Face. A chat prompt from a template is encoded with `false`: the
    /// template already wrote the BOS.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizeError> {
        self.encoder
            .encode(&self.inner, text, add_special_tokens)
            .map_err(tokenize_error)
    }

    /// How many tokens `text` encodes to (`/v1/messages/count_tokens`).
    pub fn count_tokens(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<usize, TokenizeError> {
        self.encode(text, add_special_tokens).map(|ids| ids.len())
    }

    /// The one token `text` encodes to (without special tokens), if it is exactly one: a stop
    /// string that can travel as a stop token id (SGLang's gRPC servicer accepts no stop strings).
    pub fn single_token_id(&self, text: &str) -> Result<Option<u32>, TokenizeError> {
        let ids = self.encode(text, false)?;
        Ok(match ids.as_slice() {
            [id] => Some(*id),
            _ => None,
        })
    }

    /// The text of `ids`. Unknown ids are skipped; a sequence that ends inside a UTF-8 character
    /// decodes with U+FFFD for the missing bytes (use [`crate::IncrementalDetokenizer`] for
    /// streams).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizeError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(tokenize_error)
    }

    /// One token's text, as a logprob entry shows it (special tokens included; a token that is
    /// part of a UTF-8 character shows U+FFFD).
    pub fn token_text(&self, id: u32) -> Result<String, TokenizeError> {
        self.decode(&[id], false)
    }

    /// The vocabulary entry of `id` as `tokenizer.json` spells it (`"Ġhello"`, `"<0x0A>"`,
    /// `"<|im_end|>"`): Hugging Face's `convert_ids_to_tokens`.
    pub fn token_piece(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a vocabulary entry or added token.
    pub fn token_to_id(&self, piece: &str) -> Option<u32> {
        self.inner.token_to_id(piece)
    }

    /// Whether `id` is a special added token (skipped by `skip_special_tokens`).
    pub fn is_special_token(&self, id: u32) -> bool {
        self.inner
            .get_added_vocabulary()
            .simple_id_to_token(id)
            .is_some_and(|t| self.inner.get_added_vocabulary().is_special_token(&t))
    }

    /// Vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The ids that end generation unless a request sets `ignore_eos`: `eos_token_id` of
    /// `config.json` ∪ `generation_config.json` (else the tokenizer's `eos_token`).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// The named special tokens (`bos_token`, `eos_token`, …).
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special_tokens
    }

    /// The model's chat templates.
    pub fn chat_templates(&self) -> &ChatTemplates {
        &self.chat_templates
    }

    /// The content format of the template a request with/without tools renders with.
    pub fn content_format(&self, has_tools: bool) -> Option<ContentFormat> {
        self.chat_templates
            .select(has_tools)
            .map(ChatTemplate::content_format)
    }

    /// Renders the chat prompt for `input` with the model's template (`tool_use` when the
    /// request has tools and the model has one) and special tokens. Encode the result with
    /// `add_special_tokens = false`.
    pub fn render_chat(&self, input: &ChatInput<'_>) -> Result<String, TemplateError> {
        let template = self
            .chat_templates
            .select(input.tools.is_some())
            .ok_or(TemplateError::NoTemplate)?;
        template.render(input, &self.special_tokens)
    }

    pub(crate) fn byte_table(&self) -> Option<&ByteTable> {
        self.byte_table.as_ref()
    }

    /// The underlying Hugging Face tokenizer.
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// Python's `update_post_processor`: `bos $A eos` (pairs: `bos $A eos bos $B eos`) with the
/// configured parts. `None` when a needed token is not in the vocabulary.
fn bos_eos_post_processor(
    tokenizer: &tokenizers::Tokenizer,
    special: &SpecialTokens,
    add_bos: bool,
    add_eos: bool,
) -> Option<TemplateProcessing> {
    let mut tokens: Vec<(String, u32)> = Vec::new();
    let mut single = String::new();
    let mut pair_b = String::new();
    let bos = if add_bos {
        let bos = special.bos_token.clone()?;
        tokens.push((bos.clone(), tokenizer.token_to_id(&bos)?));
        single.push_str(&format!("{bos}:0 "));
        pair_b.push_str(&format!(" {bos}:1"));
        Some(bos)
    } else {
        None
    };
    single.push_str("$A:0");
    let mut pair = single.clone();
    if add_eos {
        let eos = special.eos_token.clone()?;
        if bos.as_deref() != Some(eos.as_str()) {
            tokens.push((eos.clone(), tokenizer.token_to_id(&eos)?));
        }
        single.push_str(&format!(" {eos}:0"));
        pair = single.clone();
        pair.push_str(&format!("{pair_b} $B:1 {eos}:1"));
    } else {
        pair.push_str(&format!("{pair_b} $B:1"));
    }
    TemplateProcessing::builder()
        .try_single(single.as_str())
        .ok()?
        .try_pair(pair.as_str())
        .ok()?
        .special_tokens(tokens)
        .build()
        .ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokenizer_is_send_and_sync() {
        fn shared<T: Send + Sync>() {}
        shared::<super::Tokenizer>();
    }
}
