//! Client body → engine-neutral [`GenerationRequest`]: what to tokenize (chat messages ready
//! for a Jinja chat template, or prompt texts / token ids), the sampling parameters, and the
//! output options. What SGLang, vLLM and TokenSpeed then receive over gRPC (explicit
//! defaults, `max_new_tokens` vs `max_tokens`, SGLang's stop strings turned into token ids,
//! the json_object encoding, …) is the gateway's business; this is the neutral form.
//!
//! Input is the body the gateway already scanned once (`pdgate_filters::scan_object`) and
//! checked (`classify`, `shape`): each field is read from its raw bytes in [`TopLevel`] and
//! only that value is deserialized. A JSON `null` counts as absent. Unknown fields are ignored,
//! as the engines ignore them; a known feature this path cannot serve yet is refused with
//! [`Unsupported`], never dropped.
//!
//! # Field mapping
//!
//! Routes: **chat** `/v1/chat/completions`, **cmpl** `/v1/completions`, **gen** `/generate`
//! (fields under `sampling_params` written `sp.x`), **msg** Anthropic `/v1/messages`, **resp**
//! `/v1/responses`. "—" means the route has no such field.
//!
//! | neutral field | chat | cmpl | gen | msg | resp |
//! |---|---|---|---|---|---|
//! | `input` | `Chat`: `messages` as sent | `Prompts`: `prompt` (string, strings, ids, id lists) | `Prompts`: `input_ids` (ids, id lists), else `text` (string, strings) | `Chat`: `system` → first system message; content blocks → OpenAI parts, `tool_use` → `tool_calls`, `tool_result` → tool messages, `thinking` → `reasoning_content` | `Chat`: `instructions` → system message; `input` string → user message, message items → messages |
//! | `ChatInput.tools`, `.tool_choice` | `tools`, `tool_choice` (legacy `functions`, `function_call`) | — | — | `tools`, `tool_choice` | `tools`, `tool_choice` |
//! | `ChatInput.chat_template_kwargs` | `chat_template_kwargs` | — | — | — | — |
//! | `ChatInput.add_generation_prompt` | `add_generation_prompt` (default true) | — | — | true | true |
//! | `ChatInput.continue_final_message` | `continue_final_message` | — | — | false | false |
//! | `ChatInput.thinking` | `reasoning_effort` `none`/`minimal` → false | — | — | `thinking.type` enabled/adaptive → true, disabled → false | `reasoning.effort` as chat |
//! | `sampling.temperature`, `top_p` | same name | same | `sp.` same | same | same |
//! | `sampling.top_k`, `min_p`, `repetition_penalty` | same name | same | `sp.` same | `top_k` only | same name |
//! | `sampling.frequency_penalty`, `presence_penalty` | same name | same | `sp.` same | — | same name |
//! | `sampling.max_new_tokens` | `max_completion_tokens`, else `max_tokens` | `max_tokens`, default 16 | `sp.max_new_tokens` | `max_tokens` (required) | `max_output_tokens` |
//! | `sampling.min_new_tokens` | `min_tokens`, else `min_completion_tokens` | same | `sp.min_new_tokens` | — | — |
//! | `sampling.stop` | `stop` (string or list) | `stop` | `sp.stop` | `stop_sequences` | — |
//! | `sampling.stop_token_ids` | `stop_token_ids` | same | `sp.stop_token_ids` | — | — |
//! | `sampling.ignore_eos` | `ignore_eos` | same | `sp.ignore_eos` | — | — |
//! | `sampling.n` | `n` | `n` | `sp.n` | 1 | 1 |
//! | `sampling.seed` | `seed`, else `sampling_seed` | same | `sp.sampling_seed` | — | — |
//! | `sampling.skip_special_tokens` | `skip_special_tokens` (default true) | same | `sp.` same | true | true |
//! | `sampling.spaces_between_special_tokens` | same name (default true) | same | `sp.` same | true | true |
//! | `sampling.no_stop_trim` | `no_stop_trim` or vLLM `include_stop_str_in_output` | same | `sp.no_stop_trim` | false | false |
//! | `sampling.constraint` (at most one) | `response_format` json_object / json_schema / structural_tag, `regex`, `ebnf` | `response_format`, `json_schema`, `regex`, `ebnf` | `sp.json_schema`, `sp.regex`, `sp.ebnf`, `sp.structural_tag` | — | `text.format` json_object / json_schema |
//! | `sampling.logit_bias` | `logit_bias` (`{"<token id>": bias}`) | same | `sp.logit_bias` | — | — |
//! | `logprobs` | `logprobs: true` + `top_logprobs` | `logprobs: <int>` (= top count) | `return_logprob` + `top_logprobs_num`, `logprob_start_len`, `return_text_in_logprobs` | — | — |
//! | `stream`, `include_usage` | `stream`, `stream_options.include_usage` | same | `stream` | `stream` | `stream` |
//! | `echo`, `suffix` | — | `echo`, `suffix` | — | — | — |
//! | `model` | `model` | `model` | `model` | `model` | `model` |
//! | `request_id` | `rid`, else `request_id` | same | `rid` (string; a list gives `item_request_ids`) | — | — |

mod anthropic;
mod chat;
mod completions;
mod fields;
mod generate;
mod media;
mod responses;
mod sampling;

use std::fmt;

use pdgate_filters::body::TopLevel;
use pdgate_filters::errors::ErrorCode;
use pdgate_filters::route::Route;
use serde_json::{Map, Value};

/// A client request in engine-neutral form.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationRequest {
    pub route: Route,
    /// The `model` the client named.
    pub model: Option<String>,
    /// The client's request id (`rid`, vLLM's `request_id`).
    pub request_id: Option<String>,
    /// `/generate` with a list `rid`: one id per batch item.
    pub item_request_ids: Vec<String>,
    pub input: Input,
    pub sampling: SamplingParams,
    /// Whether and which logprobs the client asked for.
    pub logprobs: Option<LogprobRequest>,
    pub stream: bool,
    /// `stream_options.include_usage` (chat, completions).
    pub include_usage: bool,
    /// Completions `echo`: the prompt text goes before each choice's text.
    pub echo: bool,
    /// Completions `suffix`: appended after each choice's text.
    pub suffix: Option<String>,
}

impl GenerationRequest {
    /// A conversation without the OpenAI-only output options (Anthropic, Responses): no
    /// logprobs, usage chunk, echo or client request id.
    fn conversation(
        route: Route,
        model: Option<String>,
        input: ChatInput,
        sampling: SamplingParams,
        stream: bool,
    ) -> Self {
        GenerationRequest {
            route,
            model,
            request_id: None,
            item_request_ids: Vec::new(),
            input: Input::Chat(Box::new(input)),
            sampling,
            logprobs: None,
            stream,
            include_usage: false,
            echo: false,
            suffix: None,
        }
    }
}

/// What the engine generates from.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// A conversation to render with the model's chat template (boxed: with serde_json's
    /// `preserve_order`, which the workspace enables, it outweighs the other variant).
    Chat(Box<ChatInput>),
    /// Ready prompts, one engine request each (completions, `/generate`).
    Prompts {
        prompts: Vec<Prompt>,
        /// The client sent a list (a batch answers a list, even of one).
        batch: bool,
    },
}

impl Input {
    /// Whether the client sent a batch.
    pub fn is_batch(&self) -> bool {
        matches!(self, Input::Prompts { batch: true, .. })
    }

    /// How many prompts (1 for a chat).
    pub fn prompt_count(&self) -> usize {
        match self {
            Input::Chat(_) => 1,
            Input::Prompts { prompts, .. } => prompts.len(),
        }
    }
}

/// One prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    /// Text to tokenize.
    Text(String),
    /// Already tokenized.
    TokenIds(Vec<u32>),
}

/// A conversation, in the shape a Hugging Face chat template expects.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChatInput {
    /// OpenAI-shaped messages: `{"role", "content"}` where content is a string or a list of
    /// `{"type":"text","text"}` parts, plus `tool_calls`, `tool_call_id`, `reasoning_content`,
    /// `name` where present. Chat messages are passed as sent.
    pub messages: Vec<Value>,
    /// Tool definitions, only when they reach the template without tool calling
    /// (`tool_choice: "none"`); tool calling itself is [`Feature::ToolCalling`].
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    /// Extra template variables (`enable_thinking`, …); they win over the gateway's.
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Open an assistant turn after the messages (vLLM's `add_generation_prompt`, default
    /// true).
    pub add_generation_prompt: bool,
    /// Continue the final (assistant) message instead of opening a new turn.
    pub continue_final_message: bool,
    /// The client's thinking preference for templates with a thinking toggle: `Some(false)`
    /// for OpenAI `reasoning_effort` `none`/`minimal` (SMG's reading), Anthropic
    /// `thinking.type` as given; `None` leaves the template's default.
    pub thinking: Option<bool>,
    /// The images of the conversation in prompt order; each one's place in `messages` holds
    /// `{"type": "image"}` (chat `image_url` parts, Anthropic `image` blocks).
    pub media: Vec<MediaRef>,
}

/// Sampling parameters; `None` means the client left the field out, so the worker's
/// `default_sampling_params`, then the engine's own default, apply.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// `-1` (or 0 on vLLM) disables top-k.
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// The output cap. Values above `u32::MAX` saturate (the context check refuses them).
    pub max_new_tokens: Option<u32>,
    pub min_new_tokens: u32,
    /// Stop strings (never empty strings).
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// Samples per prompt (1..=1024, checked by `classify`).
    pub n: u32,
    pub seed: Option<i64>,
    /// Detokenization (the gateway detokenizes): skip special tokens, default true.
    pub skip_special_tokens: bool,
    pub spaces_between_special_tokens: bool,
    /// Keep the matched stop string in the output.
    pub no_stop_trim: bool,
    pub constraint: Option<Constraint>,
    /// Token id → additive bias.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: None,
            top_p: None,
            top_k: None,
            min_p: None,
            frequency_penalty: None,
            presence_penalty: None,
            repetition_penalty: None,
            max_new_tokens: None,
            min_new_tokens: 0,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            n: 1,
            seed: None,
            skip_special_tokens: true,
            spaces_between_special_tokens: true,
            no_stop_trim: false,
            constraint: None,
            logit_bias: Vec::new(),
        }
    }
}

/// A constraint on the output (structured generation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Constraint {
    /// Any JSON object (OpenAI `json_object`; SGLang takes it as the schema
    /// `{"type":"object"}`, vLLM as its `json_object` switch).
    JsonObject,
    /// A JSON schema, as JSON text.
    JsonSchema(String),
    Regex(String),
    /// An EBNF grammar.
    Ebnf(String),
    /// SGLang/TokenSpeed structural tag, as JSON text.
    StructuralTag(String),
}

/// The logprobs the client asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogprobRequest {
    /// Alternatives per output token (chat `top_logprobs`, completions `logprobs`,
    /// `/generate` `top_logprobs_num`).
    pub top_logprobs: u32,
    /// `/generate` `return_text_in_logprobs`.
    pub token_text: bool,
    /// `/generate` `logprob_start_len` (prompt logprobs from this position; -1: none).
    pub start_len: Option<i64>,
}

/// Why a request cannot be converted. Each maps to a catalogue code and a 400.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// A field has the wrong JSON type or value (`invalid_request`).
    InvalidField {
        /// The field's path (`messages[2].content`, `sampling_params.stop`).
        field: String,
        /// What it must be, as a phrase.
        expected: &'static str,
    },
    /// Fields that are fine alone but not together (`invalid_request_parameters`).
    InvalidParameters(String),
    /// A feature this path does not serve yet.
    Unsupported(Unsupported),
}

/// A request feature the gRPC path does not implement yet, and the field that asked for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    pub feature: Feature,
    pub field: String,
}

/// The features refused by [`Unsupported`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Feature {
    /// `tools` with tool calling on: the output would need a tool parser.
    ToolCalling,
    /// Image, audio, video or file input.
    Multimodal,
    /// A content part, block or input item type the conversion does not know.
    ContentType,
    /// vLLM `prompt_embeds`, SGLang `input_embeds`.
    PromptEmbeddings,
    /// vLLM `use_beam_search`.
    BeamSearch,
    /// `best_of` above `n`.
    BestOf,
    /// SGLang `return_hidden_states`.
    HiddenStates,
    /// `lora_path` / `lora_id`.
    Lora,
    /// SGLang `custom_logit_processor`.
    CustomLogitProcessor,
    /// SGLang `session_params`.
    SessionParams,
    /// SGLang `token_ids_logprob`.
    TokenIdLogprobs,
    /// Responses `previous_response_id`, `conversation`, item references: needs storage.
    StoredResponses,
    /// Responses `background`.
    BackgroundResponses,
    /// Responses `top_logprobs`.
    ResponsesLogprobs,
    /// Chat audio output (`modalities` with audio, `audio`).
    AudioOutput,
    /// vLLM `stream_options.continuous_usage_stats`.
    ContinuousUsageStats,
    /// vLLM `guided_*` / `structured_outputs` (use `response_format`, `regex`, `ebnf`).
    GuidedDecoding,
    /// vLLM chat `echo`.
    ChatEcho,
    /// A route that generates nothing (rerank, count_tokens).
    NotAGenerationRoute,
}

impl Feature {
    /// What is missing, for the 400 message.
    pub fn describe(self) -> &'static str {
        match self {
            Feature::ToolCalling => "tool calling (no tool parser on the gRPC path yet)",
            Feature::Multimodal => "image, audio, video and file input",
            Feature::ContentType => "this content type",
            Feature::PromptEmbeddings => "prompt embeddings",
            Feature::BeamSearch => "beam search",
            Feature::BestOf => "`best_of` above `n`",
            Feature::HiddenStates => "returning hidden states",
            Feature::Lora => "LoRA adapters",
            Feature::CustomLogitProcessor => "custom logit processors",
            Feature::SessionParams => "sessions",
            Feature::TokenIdLogprobs => "logprobs of chosen token ids",
            Feature::StoredResponses => "stored responses and conversations",
            Feature::BackgroundResponses => "background responses",
            Feature::ResponsesLogprobs => "logprobs on the Responses API",
            Feature::AudioOutput => "audio output",
            Feature::ContinuousUsageStats => "usage in every chunk",
            Feature::GuidedDecoding => {
                "vLLM guided decoding fields (use `response_format`, `regex` or `ebnf`)"
            }
            Feature::ChatEcho => "echoing the last chat message",
            Feature::NotAGenerationRoute => "this route",
        }
    }

    /// The catalogue code of the refusal.
    pub fn code(self) -> ErrorCode {
        match self {
            Feature::Multimodal => ErrorCode::MultimodalNotSupported,
            _ => ErrorCode::FeatureNotSupported,
        }
    }
}

impl RequestError {
    /// The catalogue code the refusal is answered with.
    pub fn code(&self) -> ErrorCode {
        match self {
            RequestError::InvalidField { .. } => ErrorCode::InvalidRequest,
            RequestError::InvalidParameters(_) => ErrorCode::InvalidRequestParameters,
            RequestError::Unsupported(u) => u.feature.code(),
        }
    }

    /// The HTTP status (always 400 today).
    pub fn status(&self) -> u16 {
        self.code().status()
    }

    pub(crate) fn field(field: impl Into<String>, expected: &'static str) -> Self {
        RequestError::InvalidField {
            field: field.into(),
            expected,
        }
    }

    pub(crate) fn unsupported(feature: Feature, field: impl Into<String>) -> Self {
        RequestError::Unsupported(Unsupported {
            feature,
            field: field.into(),
        })
    }
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::InvalidField { field, expected } => {
                write!(f, "field `{field}` must be {expected}")
            }
            RequestError::InvalidParameters(msg) => write!(f, "Invalid request parameters: {msg}"),
            RequestError::Unsupported(u) => write!(
                f,
                "`{}` is not supported for gRPC workers yet: {}",
                u.field,
                u.feature.describe()
            ),
        }
    }
}

impl std::error::Error for RequestError {}

/// Converts the body of `route` (scanned into `top`, already accepted by `classify`).
pub fn convert_request(
    route: Route,
    body: &[u8],
    top: &TopLevel,
) -> Result<GenerationRequest, RequestError> {
    let r = fields::Reader::top(body, top);
    match route {
        Route::ChatCompletions => chat::convert(&r),
        Route::Completions => completions::convert(&r),
        Route::Generate => generate::convert(&r),
        Route::Messages => anthropic::convert(&r),
        Route::Responses => responses::convert(&r),
        Route::Rerank | Route::CountTokens => Err(RequestError::unsupported(
            Feature::NotAGenerationRoute,
            route.upstream_path(),
        )),
    }
}

/// The one constraint of a request; two or more is `invalid_request_parameters` (SMG refuses
/// them too: the engines take a single grammar).
fn single_constraint(
    found: Vec<(&'static str, Constraint)>,
) -> Result<Option<Constraint>, RequestError> {
    match found.len() {
        0 | 1 => Ok(found.into_iter().next().map(|(_, c)| c)),
        _ => {
            let names: Vec<String> = found.iter().map(|(f, _)| format!("`{f}`")).collect();
            Err(RequestError::InvalidParameters(format!(
                "only one output constraint may be given, got {}",
                names.join(", ")
            )))
        }
    }
}

pub use media::{MediaRef, MediaSource};

#[cfg(test)]
mod tests;
