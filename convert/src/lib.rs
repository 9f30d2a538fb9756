//! `pdgate-convert`: the pure conversions of pdgate's gRPC path, both directions, no I/O.
//!
//! * [`event`]: per-choice token events ([`Delta`], [`Finish`]; text already detokenized
//!   and stop-filtered by `pdgate-tokenize`).
//! * [`UsageTotals`]: usage over the choices (prompt once per prompt, completions summed).

pub mod event;
pub mod usage;
mod write;

pub use event::{
    choice_index, ChoiceUsage, Delta, Finish, FinishReason, MatchedStop, PromptTokenLogprob,
    StreamFailure, TokenLogprob, TopLogprob,
};
pub use usage::UsageTotals;
