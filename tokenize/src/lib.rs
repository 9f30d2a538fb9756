//! `pdgate-tokenize`: the text work of pdgate's gRPC path, pure and Pingora-free. The gateway
//! tokenizes prompts itself there (the engines take token ids), renders chat templates, and turns
//! the engines' token streams back into text.
//!
//! - [`Tokenizer`]: one model's tokenizer, special tokens, EOS ids and chat templates, loaded
//!   from a local directory ([`ModelSource`], SMG's `--model-path` / `--tokenizer-path` /
//!   `--chat-template`) and shared by every request (`Arc<Tokenizer>`, `Send + Sync`).
//!   Synchronous and CPU-bound: encode large prompts off the async reactor.
//! - [`ChatTemplate`] / [`ChatInput`]: Hugging Face-compatible chat rendering from the client's
//!   JSON messages.
//! - [`CacheConfig`]: SMG's tokenizer caches (`--tokenizer-cache-enable-l0/-l1`), exact: whole
//!   texts, and the pieces between special tokens (system prompts, earlier turns).
//! - [`IncrementalDetokenizer`]: token stream → text pieces that never split a character.
//! - [`StopDecoder`]: per-choice stop token ids and stop strings on top of it.
//! - [`fixture`]: small deterministic model directories for tests.
//!
//! Errors: [`LoadError`] (a model directory that does not load; names the file),
//! [`TemplateError`] (the request's chat cannot be rendered: a 400), [`TokenizeError`].

mod byte_level;
pub mod chat_template;
mod detokenize;
mod encode_cache;
mod error;
mod fast_bpe;
pub mod fixture;
mod model_dir;
mod special_tokens;
mod stop;
mod tokenizer;

pub use chat_template::{ChatInput, ChatTemplate, ChatTemplates, ContentFormat};
pub use detokenize::IncrementalDetokenizer;
pub use encode_cache::CacheConfig;
pub use error::{LoadError, TemplateError, TokenizeError};
pub use model_dir::ModelSource;
pub use special_tokens::SpecialTokens;
pub use stop::{MatchedStop, StopConfig, StopDecoder};
pub use tokenizer::Tokenizer;
