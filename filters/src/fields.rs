//! Names of the client-API JSON fields the gateway reads or edits (OpenAI, Anthropic, SGLang
//! native, vLLM extensions), and of the engine response fields it reads. Handoff fields live in
//! [`crate::handoff`].

/// Model name (all routes).
pub const MODEL: &str = "model";
/// Streaming switch (all routes).
pub const STREAM: &str = "stream";
/// OpenAI streaming options; only valid with `stream: true`.
pub const STREAM_OPTIONS: &str = "stream_options";
/// Number of samples (OpenAI `n`; vLLM's fan-out test reads the top-level one on every route).
pub const N: &str = "n";
/// Output caps: chat/completions/messages `max_tokens`, chat `max_completion_tokens`, responses
/// `max_output_tokens`.
pub const MAX_TOKENS: &str = "max_tokens";
pub const MAX_COMPLETION_TOKENS: &str = "max_completion_tokens";
pub const MAX_OUTPUT_TOKENS: &str = "max_output_tokens";
/// vLLM minimum-output fields (a minimum above the one-token prefill cap is a 400).
pub const MIN_TOKENS: &str = "min_tokens";
pub const MIN_COMPLETION_TOKENS: &str = "min_completion_tokens";
/// SGLang `/generate` inputs (one of them is required).
pub const INPUT_IDS: &str = "input_ids";
pub const TEXT: &str = "text";
pub const INPUT_EMBEDS: &str = "input_embeds";
/// SGLang `/generate` sampling parameters (an object) and the members of it the gateway checks.
pub const SAMPLING_PARAMS: &str = "sampling_params";
pub const MAX_NEW_TOKENS: &str = "max_new_tokens";
/// Sampling temperature and nucleus mass (OpenAI/Anthropic top level, SGLang `sampling_params`).
pub const TEMPERATURE: &str = "temperature";
pub const TOP_P: &str = "top_p";
/// Chat and Anthropic conversation, and the member every message must have.
pub const MESSAGES: &str = "messages";
pub const ROLE: &str = "role";
/// SGLang `/generate` prompt logprobs switch.
pub const RETURN_LOGPROB: &str = "return_logprob";
/// SGLang `/generate` request id (a string, or a list for batches).
pub const RID: &str = "rid";
/// OpenAI completions inputs.
pub const PROMPT: &str = "prompt";
/// vLLM completions prompt embeddings (base64 bytes, or a list of them).
pub const PROMPT_EMBEDS: &str = "prompt_embeds";
/// OpenAI logprobs (chat: bool; completions: integer).
pub const LOGPROBS: &str = "logprobs";
/// vLLM body request id (used when no `X-Request-Id` header is sent).
pub const REQUEST_ID: &str = "request_id";
/// vLLM beam search switch.
pub const USE_BEAM_SEARCH: &str = "use_beam_search";
/// Stop conditions and their override (SGLang/vLLM).
pub const IGNORE_EOS: &str = "ignore_eos";
pub const STOP: &str = "stop";
pub const STOP_TOKEN_IDS: &str = "stop_token_ids";
/// SGLang response metadata and the prompt logprobs inside it.
pub const META_INFO: &str = "meta_info";
pub const INPUT_TOKEN_LOGPROBS: &str = "input_token_logprobs";
/// SGLang batched-stream item index.
pub const INDEX: &str = "index";
