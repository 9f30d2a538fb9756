//! The router-side stop decoder: one per choice, fed the engine's tokens, it turns them into text
//! and ends the choice at the first stop token id or stop string, whatever the engine did.
//!
//! - Stop token ids (the request's `stop_token_ids`, plus the model's EOS ids unless
//!   `ignore_eos`) are checked before decoding; the token is left out of the text unless
//!   `no_stop_trim`.
//! - Stop strings are found in the decoded text, across token boundaries: text that could still
//!   become a stop string (the longest end of it that is a proper prefix of one) is withheld in a
//!   small "jail" buffer and released once it can no longer match. The stop string itself is left
//!   out unless `no_stop_trim`.
//! - The first stop is the one that ends first in the text (the longest one when several end at
//!   the same place), so the output does not depend on how the engine chunked its tokens.
//! - Once stopped, the decoder latches: later tokens are ignored. [`StopDecoder::flush`] at the
//!   engine's end releases whatever is still withheld.
//!
//! Per token: one incremental decode, a scan of the jail (a few bytes) and no allocation when
//! there is no stop string.

use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};

use crate::detokenize::IncrementalDetokenizer;
use crate::error::TokenizeError;
use crate::tokenizer::Tokenizer;

/// A request's stop settings (OpenAI `stop`, SGLang/vLLM `stop_token_ids`, `ignore_eos`,
/// `no_stop_trim`, `skip_special_tokens`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopConfig {
    /// Stop strings; empty strings are ignored.
    pub stop: Vec<String>,
    /// Stop token ids besides the model's EOS ids.
    pub stop_token_ids: Vec<u32>,
    /// Do not stop at the model's EOS ids.
    pub ignore_eos: bool,
    /// Keep the stop string or stop token in the text.
    pub no_stop_trim: bool,
    /// Leave special tokens out of the text.
    pub skip_special_tokens: bool,
}

/// What ended a choice on the router side (`matched_stop` in SGLang's responses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatchedStop {
    /// A stop token id or EOS id.
    TokenId(u32),
    /// A stop string, as the request gave it.
    Text(String),
}

impl MatchedStop {
    /// The OpenAI `finish_reason` of a router-side stop: always `"stop"` (it overrides the
    /// engine's `length` when both happen on the same token).
    pub fn finish_reason(&self) -> &'static str {
        "stop"
    }
}

/// One choice's text with stop handling. Not shared between choices.
#[derive(Debug)]
pub struct StopDecoder {
    detokenizer: IncrementalDetokenizer,
    /// Sorted, no duplicates.
    stop_ids: Vec<u32>,
    /// The stop strings, indexed like the matcher's patterns.
    stops: Vec<String>,
    matcher: Option<AhoCorasick>,
    max_stop_len: usize,
    no_stop_trim: bool,
    /// Decoded text not yet released: at most the longest stop string's length minus one,
    /// between calls.
    jail: String,
    /// The current token's text.
    scratch: String,
    stopped: Option<MatchedStop>,
}

impl StopDecoder {
    /// A decoder for one choice of a request.
    pub fn new(tokenizer: Arc<Tokenizer>, config: &StopConfig) -> Self {
        let mut stop_ids = config.stop_token_ids.clone();
        if !config.ignore_eos {
            stop_ids.extend_from_slice(tokenizer.eos_token_ids());
        }
        stop_ids.sort_unstable();
        stop_ids.dedup();
        let mut stops: Vec<String> = Vec::new();
        for s in &config.stop {
            if !s.is_empty() && !stops.contains(s) {
                stops.push(s.clone());
            }
        }
        // Standard semantics: overlapping matches reported in order of where they end.
        let matcher = (!stops.is_empty()).then(|| {
            AhoCorasick::builder()
                .match_kind(MatchKind::Standard)
                .build(&stops)
                .expect("a few stop strings always build an automaton")
        });
        let max_stop_len = stops.iter().map(String::len).max().unwrap_or(0);
        Self {
            detokenizer: IncrementalDetokenizer::new(tokenizer, config.skip_special_tokens),
            stop_ids,
            stops,
            matcher,
            max_stop_len,
            no_stop_trim: config.no_stop_trim,
            jail: String::new(),
            scratch: String::new(),
            stopped: None,
        }
    }

    /// The stop that ended the choice, once it has.
    pub fn stopped(&self) -> Option<&MatchedStop> {
        self.stopped.as_ref()
    }

    /// Whether the choice has ended on the router side.
    pub fn is_stopped(&self) -> bool {
        self.stopped.is_some()
    }

    /// `"stop"` once stopped.
    pub fn finish_reason(&self) -> Option<&'static str> {
        self.stopped.as_ref().map(MatchedStop::finish_reason)
    }

    /// Whether `id` ends the choice (a stop token id or, unless `ignore_eos`, an EOS id).
    pub fn is_stop_token(&self, id: u32) -> bool {
        self.stop_ids.binary_search(&id).is_ok()
    }

    /// Feeds one token and appends the text it releases to `out`. Returns whether the choice is
    /// now stopped (then [`StopDecoder::stopped`] says why, and later tokens are ignored).
    pub fn push(&mut self, id: u32, out: &mut String) -> Result<bool, TokenizeError> {
        if self.stopped.is_some() {
            return Ok(true);
        }
        self.scratch.clear();
        if self.is_stop_token(id) {
            // Text still pending in the decoder can no longer be completed.
            if self.no_stop_trim {
                self.detokenizer.push(id, &mut self.scratch)?;
            }
            self.detokenizer.flush(&mut self.scratch)?;
            self.feed_text(out);
            if self.stopped.is_none() {
                out.push_str(&self.jail);
                self.jail.clear();
                self.stopped = Some(MatchedStop::TokenId(id));
            }
            return Ok(true);
        }
        self.detokenizer.push(id, &mut self.scratch)?;
        self.feed_text(out);
        Ok(self.stopped.is_some())
    }

    /// Feeds tokens until the choice stops; returns how many were consumed (the stop token
    /// included), all of them when none stops.
    pub fn push_all(&mut self, ids: &[u32], out: &mut String) -> Result<usize, TokenizeError> {
        for (i, &id) in ids.iter().enumerate() {
            if self.push(id, out)? {
                return Ok(i + 1);
            }
        }
        Ok(ids.len())
    }

    /// The engine finished the choice: appends to `out` everything still withheld (text that
    /// could have become a stop string, a character left incomplete). Nothing once stopped.
    pub fn flush(&mut self, out: &mut String) -> Result<(), TokenizeError> {
        if self.stopped.is_some() {
            return Ok(());
        }
        self.scratch.clear();
        self.detokenizer.flush(&mut self.scratch)?;
        self.feed_text(out);
        if self.stopped.is_none() {
            out.push_str(&self.jail);
            self.jail.clear();
        }
        Ok(())
    }

    /// Runs `self.scratch` through the stop strings.
    fn feed_text(&mut self, out: &mut String) {
        let Some(matcher) = &self.matcher else {
            out.push_str(&self.scratch);
            return;
        };
        if self.scratch.is_empty() {
            return;
        }
        self.jail.push_str(&self.scratch);
        // The first match to end; among those ending there, the longest.
        let mut first: Option<aho_corasick::Match> = None;
        for m in matcher.find_overlapping_iter(self.jail.as_str()) {
            match first {
                None => first = Some(m),
                Some(f) if m.end() == f.end() && m.start() < f.start() => first = Some(m),
                Some(f) if m.end() > f.end() => break,
                Some(_) => {}
            }
        }
        if let Some(m) = first {
            let cut = if self.no_stop_trim {
                m.end()
            } else {
                m.start()
            };
            out.push_str(&self.jail[..cut]);
            self.jail.clear();
            self.stopped = Some(MatchedStop::Text(
                self.stops[m.pattern().as_usize()].clone(),
            ));
            return;
        }
        let keep = self.longest_partial_stop_suffix();
        let release = self.jail.len() - keep;
        out.push_str(&self.jail[..release]);
        self.jail.drain(..release);
    }

    /// Length of the longest end of the jail that is a proper prefix of some stop string.
    fn longest_partial_stop_suffix(&self) -> usize {
        let jail = self.jail.as_bytes();
        let longest = jail.len().min(self.max_stop_len.saturating_sub(1));
        (1..=longest)
            .rev()
            .find(|&k| {
                let tail = &jail[jail.len() - k..];
                self.stops
                    .iter()
                    .any(|s| s.len() > k && s.as_bytes().starts_with(tail))
            })
            .unwrap_or(0)
    }
}
