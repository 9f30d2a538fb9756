//! Token events → the bytes the client receives: one writer per route, each producing either
//! the complete JSON body (non-streaming) or the SSE stream, event by event, into a buffer the
//! caller owns and reuses.
//!
//! The shapes are the engines' own HTTP shapes — SGLang's dialect for the OpenAI routes (with
//! `matched_stop`), SGLang's native `/generate`, Anthropic's Messages, OpenAI's Responses as
//! `tests/mock-engine/src/render.rs` renders them — so a client sees the same bodies whether
//! pdgate reached its workers over HTTP or gRPC. Where SMG's gRPC router adds something the
//! engines do not send (`system_fingerprint` from the worker's weight version, the
//! `completion_tokens_details` of reasoning models), the writers add it too. The crate README
//! lists each choice made where the two differ.
//!
//! Call order, per response: [`ResponseWriter::start`] (optional; the first event starts the
//! stream otherwise), any number of [`ResponseWriter::delta`] per choice, one
//! [`ResponseWriter::finish`] per choice, then [`ResponseWriter::end`]; or
//! [`ResponseWriter::fail`] at any point to end with an error. Events after a choice's finish,
//! and all events after `end` or `fail`, are ignored.

mod chat;
mod completions;
mod generate;
mod messages;
mod openai;
mod responses;

use pdgate_filters::route::Route;

pub use chat::ChatWriter;
pub use completions::CompletionsWriter;
pub use generate::GenerateWriter;
pub use messages::MessagesWriter;
pub use responses::ResponsesWriter;

use crate::event::{Delta, Finish, PromptTokenLogprob, StreamFailure};
use crate::request::GenerationRequest;
use crate::usage::UsageTotals;

/// Everything a writer needs to know about the response besides the events.
#[derive(Clone, Debug, PartialEq)]
pub struct ResponseSpec {
    pub route: Route,
    /// SSE when true, one JSON body when false.
    pub stream: bool,
    /// The response id: `chatcmpl-…`, `cmpl-…`, `msg_…`, `resp_…`; the request id for
    /// `/generate` (its `meta_info.id`).
    pub id: String,
    /// The `model` the client sees.
    pub model: String,
    /// Unix seconds (`created`, Responses `created_at`).
    pub created: u64,
    /// The worker's weight version, shown as `system_fingerprint` (chat, completions) and as
    /// `/generate`'s `meta_info.weight_version` (`"default"` when unknown, as SGLang).
    pub system_fingerprint: Option<String>,
    /// OpenAI `stream_options.include_usage`: a final chunk with empty `choices` and the usage.
    pub include_usage: bool,
    /// Whether and how logprob rows are shown.
    pub logprobs: Option<LogprobOutput>,
    /// Samples per prompt (choice `i` belongs to prompt `i / n`).
    pub n: u32,
    /// `/generate`: answer a list (a batch input, or `n > 1`) rather than one object.
    pub list_output: bool,
    /// `/generate`: the client's per-item `rid`s; when empty, item `i` of a list is
    /// `"{id}-{i}"`.
    pub item_ids: Vec<String>,
    /// Completions `echo`: each prompt's text, prepended to its choices' text. Empty: no echo.
    pub echo: Vec<String>,
    /// Completions `suffix`, appended to every choice's text.
    pub suffix: Option<String>,
    /// Prompt token counts, per prompt, known before generation starts (the gateway
    /// tokenized): Anthropic `message_start`, Responses `response.created`, `/generate` frames
    /// before the engine reports its own.
    pub prompt_tokens: Vec<u32>,
    /// Responses: the id of the output message item; `msg_` + the response id's suffix when
    /// `None`.
    pub output_item_id: Option<String>,
}

/// How logprob rows are shown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogprobOutput {
    /// Alternatives per token the client asked for (0: none; completions then shows
    /// `top_logprobs: null`, `/generate` no `*_top_logprobs`).
    pub top_logprobs: u32,
    /// `/generate` `return_text_in_logprobs`: the token text as the third member of each
    /// `[logprob, id, text]` triple (otherwise `null`).
    pub token_text: bool,
}

impl ResponseSpec {
    /// A spec with nothing but the route, the stream switch and the identity fields; every
    /// option off.
    pub fn new(route: Route, stream: bool, id: String, model: String, created: u64) -> Self {
        ResponseSpec {
            route,
            stream,
            id,
            model,
            created,
            system_fingerprint: None,
            include_usage: false,
            logprobs: None,
            n: 1,
            list_output: false,
            item_ids: Vec::new(),
            echo: Vec::new(),
            suffix: None,
            prompt_tokens: Vec::new(),
            output_item_id: None,
        }
    }

    /// The spec for a converted request: route, stream, usage, logprob, `n`, list output,
    /// client item ids and suffix come from it; `model` is the request's (empty when it named
    /// none: set the served model). Echo texts and prompt token counts are the gateway's to
    /// fill (it has the prompt texts and the tokenizer).
    pub fn for_request(request: &GenerationRequest, id: String, created: u64) -> Self {
        let mut spec = ResponseSpec::new(
            request.route,
            request.stream,
            id,
            request.model.clone().unwrap_or_default(),
            created,
        );
        spec.include_usage = request.include_usage;
        spec.logprobs = request.logprobs.map(|l| LogprobOutput {
            top_logprobs: l.top_logprobs,
            token_text: l.token_text,
        });
        spec.n = request.sampling.n;
        spec.list_output = request.route == Route::Generate
            && (request.input.is_batch() || request.sampling.n > 1);
        spec.item_ids = request.item_request_ids.clone();
        spec.suffix = request.suffix.clone();
        spec
    }

    /// The prompt count known for the prompt of choice `index`.
    fn prompt_tokens_of(&self, index: u32) -> u32 {
        let prompt = (index / self.n.max(1)) as usize;
        self.prompt_tokens.get(prompt).copied().unwrap_or(0)
    }
}

/// Writes one response. Every method appends to `out` (and may append nothing); the caller
/// sends and clears the buffer when it likes.
pub trait ResponseWriter: Send {
    /// The stream's opening events (Anthropic `message_start`, Responses `response.created`, …),
    /// for a client to see before the first token. Nothing for the other routes and for
    /// non-streaming responses. Idempotent; the first event calls it when the caller did not.
    fn start(&mut self, out: &mut Vec<u8>);

    /// New output of a choice.
    fn delta(&mut self, out: &mut Vec<u8>, delta: &Delta<'_>);

    /// The end of a choice (exactly once per choice).
    fn finish(&mut self, out: &mut Vec<u8>, finish: &Finish<'_>);

    /// `/generate` prompt logprobs of prompt `prompt` (from the SGLang prefill leg); shown in
    /// `meta_info.input_token_logprobs` when the client asked for logprobs. Ignored by the
    /// other routes.
    fn prompt_logprobs(&mut self, prompt: u32, rows: &[PromptTokenLogprob]) {
        let _ = (prompt, rows);
    }

    /// The end of the response: the usage chunk and `[DONE]` of a stream, or the whole JSON
    /// body.
    fn end(&mut self, out: &mut Vec<u8>);

    /// Ends the response with an error. Streams get the route's error event (then `[DONE]` on
    /// the OpenAI-style routes); a non-streaming writer writes the gateway error body
    /// (`pdgate_filters::errors::render_error`), to be sent with `failure.status`.
    fn fail(&mut self, out: &mut Vec<u8>, failure: &StreamFailure<'_>);

    /// The usage over the choices finished so far.
    fn usage(&self) -> &UsageTotals;
}

/// The writer of `spec.route`; `None` for the routes that generate nothing (rerank,
/// count_tokens).
pub fn response_writer(spec: ResponseSpec) -> Option<Box<dyn ResponseWriter>> {
    Some(match spec.route {
        Route::ChatCompletions => Box::new(ChatWriter::new(spec)),
        Route::Completions => Box::new(CompletionsWriter::new(spec)),
        Route::Generate => Box::new(GenerateWriter::new(spec)),
        Route::Messages => Box::new(MessagesWriter::new(spec)),
        Route::Responses => Box::new(ResponsesWriter::new(spec)),
        Route::Rerank | Route::CountTokens => return None,
    })
}

/// A non-streaming response that failed: the gateway's error body
/// (`pdgate_filters::errors::render_error`).
fn gateway_error_body(out: &mut Vec<u8>, failure: &StreamFailure<'_>) {
    out.extend_from_slice(&pdgate_filters::errors::render_error(
        failure.status,
        failure.code.as_str(),
        failure.message,
    ));
}

/// The `Content-Type` of a response.
pub fn content_type(stream: bool) -> &'static str {
    if stream {
        "text/event-stream"
    } else {
        "application/json"
    }
}

#[cfg(test)]
mod tests;
