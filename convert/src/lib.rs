//! `pdgate-convert`: the pure conversions of pdgate's gRPC path, both directions, no I/O.
//!
//! * [`request`]: the client's OpenAI / Anthropic / SGLang-native body (already scanned and
//!   shape-checked by `pdgate-filters`) → an engine-neutral [`GenerationRequest`]: chat
//!   messages for the template or prompts to tokenize, sampling parameters, output options;
//!   what cannot be served yet is an [`Unsupported`] refusal with a catalogue code.
//! * [`response`]: per-choice token events ([`Delta`], [`Finish`]; text already detokenized
//!   and stop-filtered by `pdgate-tokenize`) → the exact JSON body or SSE stream the client
//!   expects, written into a buffer the caller owns ([`response_writer`]).
//! * [`UsageTotals`]: usage over the choices (prompt once per prompt, completions summed).

pub mod event;
pub mod request;
pub mod response;
pub mod usage;
mod write;

pub use event::{
    choice_index, ChoiceUsage, Delta, Finish, FinishReason, MatchedStop, PromptTokenLogprob,
    StreamFailure, TokenLogprob, TopLogprob,
};
pub use request::{
    convert_request, ChatInput, Constraint, Feature, GenerationRequest, Input, LogprobRequest,
    MediaRef, MediaSource, Prompt, RequestError, SamplingParams, Unsupported,
};
pub use response::{content_type, response_writer, LogprobOutput, ResponseSpec, ResponseWriter};
pub use usage::UsageTotals;
