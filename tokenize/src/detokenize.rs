//! Incremental detokenization: turning an engine's token stream back into text piece by piece,
//! so that the pieces concatenate to the full decode of the tokens.
//!
//! Decoding token by token is wrong twice over: a byte-level token may hold half of a UTF-8
//! character (decoding it alone gives U+FFFD), and SentencePiece decoders strip the leading space
//! of the first token they see, so `"▁world"` alone is `"world"` while after `"▁Hello"` it is
//! `" world"`. The decoder therefore keeps a small window of tokens with two offsets (vLLM and
//! SGLang's `prefix` / `read`): `window[..read]` was already emitted, and its first tokens are the
//! context the new ones are decoded in. For each token it decodes the window and emits what
//! follows the already emitted text, unless that ends in U+FFFD (a character still incomplete),
//! in which case it waits for the next token. Consumed tokens are dropped, so memory is a few
//! tokens whatever the stream's length.
//!
//! Byte-level tokenizers (GPT-2's byte alphabet with a plain `ByteLevel` decoder: Llama 3, Qwen
//! and most current models) take a faster, exact path instead: each token's bytes are appended to
//! at most three held bytes and the complete characters go out, exactly as a full decode's
//! `from_utf8_lossy` would show them.
//!
//! The pieces concatenate to `Tokenizer::decode` of all the tokens, with one exception no
//! incremental decoder can avoid: SentencePiece's byte fallback turns a whole run of byte tokens
//! that is not UTF-8 into U+FFFDs, including bytes that were valid (and already emitted) before
//! the run went wrong. Text a model actually writes is valid UTF-8, where the two agree.

use std::sync::Arc;

use crate::byte_level::drain_utf8;
use crate::error::TokenizeError;
use crate::tokenizer::Tokenizer;

/// Tokens held without producing text before the decoder stops waiting (see
/// `give_up_waiting`). Only a stream that is not text gets there (dozens of invalid bytes, or
/// of tokens that decode to nothing); a UTF-8 character needs at most 4 byte tokens. The window
/// is thus at most twice this long (context + pending).
const MAX_WINDOW: usize = 64;

/// Turns one sequence's tokens into text, piece by piece. One per choice; not shared.
#[derive(Debug)]
pub struct IncrementalDetokenizer {
    tokenizer: Arc<Tokenizer>,
    skip_special_tokens: bool,
    /// The tokens from the context start (`prefix`) on; earlier ones were consumed and dropped.
    window: Vec<u32>,
    /// `window[..read]` has been emitted.
    read: usize,
    /// `decode(window[..read])`: the emitted text of the window, cached.
    prefix_text: String,
    /// Byte-level tokenizers: the bytes of an incomplete character (at most 3); the window is
    /// not used.
    pending_bytes: Vec<u8>,
    byte_level: bool,
}

/// The largest char boundary of `s` at or below `i`.
fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    if i >= s.len() {
        return s.len();
    }
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl IncrementalDetokenizer {
    /// A decoder for a new sequence. `skip_special_tokens` is the request's (true by default in
    /// the OpenAI APIs).
    pub fn new(tokenizer: Arc<Tokenizer>, skip_special_tokens: bool) -> Self {
        Self {
            byte_level: tokenizer.byte_table().is_some(),
            pending_bytes: Vec::with_capacity(4),
            tokenizer,
            skip_special_tokens,
            window: Vec::with_capacity(8),
            read: 0,
            prefix_text: String::new(),
        }
    }

    /// Starts the window with the prompt's last tokens as context, so the first generated
    /// token keeps its leading space on SentencePiece models (vLLM does this with 5 prompt
    /// tokens; SGLang and SMG start with no context, which is the default).
    pub fn with_context(mut self, prompt_tail: &[u32]) -> Result<Self, TokenizeError> {
        if self.byte_level {
            // A byte-level token's text does not depend on what precedes it.
            return Ok(self);
        }
        self.window.extend_from_slice(prompt_tail);
        self.read = self.window.len();
        self.prefix_text = self.decode_window(self.read)?;
        Ok(self)
    }

    /// Whether special tokens are left out of the text.
    pub fn skip_special_tokens(&self) -> bool {
        self.skip_special_tokens
    }

    /// Tokens held: the context and those whose text is still pending. A few, whatever the
    /// stream's length (none on the byte-level path, which holds at most 3 bytes).
    pub fn held_tokens(&self) -> usize {
        self.window.len()
    }

    /// The tokenizer this decoder decodes with.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    fn decode_window(&self, end: usize) -> Result<String, TokenizeError> {
        if end == 0 {
            return Ok(String::new());
        }
        self.tokenizer
            .decode(&self.window[..end], self.skip_special_tokens)
    }

    /// Adds a token and appends to `out` the text it completes (often all of its text; nothing
    /// while a character is still incomplete).
    pub fn push(&mut self, id: u32, out: &mut String) -> Result<(), TokenizeError> {
        if self.byte_level {
            let table = self.tokenizer.byte_table().expect("byte-level tokenizer");
            if let Some(bytes) = table.token_bytes(id, self.skip_special_tokens) {
                self.pending_bytes.extend_from_slice(bytes);
                drain_utf8(&mut self.pending_bytes, out, false);
            }
            return Ok(());
        }
        self.window.push(id);
        let text = self.decode_window(self.window.len())?;
        if text.len() > self.prefix_text.len() && !text.ends_with('\u{FFFD}') {
            self.emit_and_advance(&text, out)
        } else if self.window.len() - self.read >= MAX_WINDOW {
            self.give_up_waiting(text, out)
        } else {
            Ok(())
        }
    }

    /// Too many tokens pending: tokens that added nothing are dropped; else the text is emitted
    /// up to the last point where it ended on a whole character (found by decoding shorter
    /// windows), and only when there is none is everything emitted, U+FFFD included.
    fn give_up_waiting(&mut self, text: String, out: &mut String) -> Result<(), TokenizeError> {
        if text == self.prefix_text {
            // Skipped special tokens and the like: no text in any context.
            self.window.truncate(self.read);
            return Ok(());
        }
        for cut in (self.read + 1..self.window.len()).rev() {
            let shorter = self.decode_window(cut)?;
            if shorter.len() > self.prefix_text.len() && !shorter.ends_with('\u{FFFD}') {
                let pending = self.window.split_off(cut);
                self.emit_and_advance(&shorter, out)?;
                self.window.extend(pending);
                return Ok(());
            }
        }
        self.emit_rest(&text, out);
        Ok(())
    }

    /// Appends the text of every token given so far that has not been emitted yet; a sequence
    /// that ends inside a character shows U+FFFD for it, as a full decode does. The decoder can
    /// go on afterwards.
    pub fn flush(&mut self, out: &mut String) -> Result<(), TokenizeError> {
        if self.byte_level {
            drain_utf8(&mut self.pending_bytes, out, true);
            return Ok(());
        }
        if self.read < self.window.len() {
            let text = self.decode_window(self.window.len())?;
            self.emit_rest(&text, out);
        }
        Ok(())
    }

    /// Emits `text` past the emitted prefix; the new tokens become the next context.
    fn emit_and_advance(&mut self, text: &str, out: &mut String) -> Result<(), TokenizeError> {
        let from = if text.starts_with(self.prefix_text.as_str()) {
            self.prefix_text.len()
        } else {
            floor_char_boundary(text, self.prefix_text.len())
        };
        out.push_str(&text[from..]);
        // The tokens just emitted are the context for the next ones; drop the older context.
        self.window.drain(..self.read);
        self.read = self.window.len();
        self.prefix_text = self.decode_window(self.read)?;
        Ok(())
    }

    /// Emits everything pending and restarts the window empty.
    fn emit_rest(&mut self, text: &str, out: &mut String) {
        let from = if text.starts_with(self.prefix_text.as_str()) {
            self.prefix_text.len()
        } else {
            floor_char_boundary(text, self.prefix_text.len())
        };
        out.push_str(&text[from..]);
        self.window.clear();
        self.read = 0;
        self.prefix_text.clear();
    }
}
