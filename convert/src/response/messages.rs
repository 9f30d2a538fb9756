//! Anthropic `/v1/messages`: the `message` body and its event stream (one text block).
//!
//! Stream: `message_start` (usage with the prompt's `input_tokens`, `output_tokens: 0`),
//! `content_block_start` (index 0, empty text block), one `content_block_delta`
//! (`text_delta`) per non-empty delta, then at the finish `content_block_stop`,
//! `message_delta` (`stop_reason`, `stop_sequence`, `usage.output_tokens`) and
//! `message_stop`. Each event is `event: <type>\ndata: <json>\n\n`; there is no `[DONE]`.
//!
//! `stop_reason`: a matched stop *string* → `stop_sequence` (with the string); the output cap
//! → `max_tokens`; anything else (EOS, a stop token id, an engine abort) → `end_turn`.
//! Anthropic has no `n`: only choice 0 is written.

use super::{ResponseSpec, ResponseWriter};
use crate::event::{Delta, Finish, FinishReason, MatchedStop, StreamFailure};
use crate::usage::UsageTotals;
use crate::write;

/// Writes one Messages response (see the module doc).
pub struct MessagesWriter {
    spec: ResponseSpec,
    started: bool,
    closed: bool,
    /// Non-streaming: the text so far, escaped.
    text: Vec<u8>,
    /// The finish: `stop_reason`, `stop_sequence`'s JSON, output tokens, input tokens.
    ended: Option<(&'static str, Vec<u8>, u32, u32)>,
    usage: UsageTotals,
}

impl MessagesWriter {
    pub fn new(spec: ResponseSpec) -> Self {
        MessagesWriter {
            usage: UsageTotals::new(1),
            spec,
            started: false,
            closed: false,
            text: Vec::new(),
            ended: None,
        }
    }
}

/// Anthropic's `stop_reason` and `stop_sequence` (JSON) for a finish.
fn stop_reason(
    reason: FinishReason<'_>,
    matched: Option<MatchedStop<'_>>,
) -> (&'static str, Vec<u8>) {
    match (reason, matched) {
        (FinishReason::Stop, Some(MatchedStop::Text(s))) => {
            let mut json = Vec::with_capacity(s.len() + 2);
            write::string(&mut json, s);
            ("stop_sequence", json)
        }
        (FinishReason::Length, _) => ("max_tokens", b"null".to_vec()),
        _ => ("end_turn", b"null".to_vec()),
    }
}

/// The error `type` Anthropic uses for an HTTP status.
fn error_type(status: u16) -> &'static str {
    match status {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

impl ResponseWriter for MessagesWriter {
    fn start(&mut self, out: &mut Vec<u8>) {
        if self.started || self.closed || !self.spec.stream {
            return;
        }
        self.started = true;
        write::event_start(out, "message_start");
        out.extend_from_slice(b"{\"type\":\"message_start\",\"message\":{\"id\":");
        write::string(out, &self.spec.id);
        out.extend_from_slice(b",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
        write::string(out, &self.spec.model);
        out.extend_from_slice(
            b",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":",
        );
        write::u64(out, u64::from(self.spec.prompt_tokens_of(0)));
        out.extend_from_slice(b",\"output_tokens\":0}}}");
        write::event_end(out);
        write::event_start(out, "content_block_start");
        out.extend_from_slice(
            b"{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}",
        );
        write::event_end(out);
    }

    fn delta(&mut self, out: &mut Vec<u8>, delta: &Delta<'_>) {
        if self.closed || delta.index != 0 || self.ended.is_some() {
            return;
        }
        if !self.spec.stream {
            write::string_contents(&mut self.text, delta.text);
            return;
        }
        self.start(out);
        if delta.text.is_empty() {
            return;
        }
        write::event_start(out, "content_block_delta");
        out.extend_from_slice(
            b"{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":",
        );
        write::string(out, delta.text);
        out.extend_from_slice(b"}}");
        write::event_end(out);
    }

    fn finish(&mut self, out: &mut Vec<u8>, finish: &Finish<'_>) {
        if self.closed || finish.index != 0 || self.ended.is_some() {
            return;
        }
        self.usage.record(0, &finish.usage);
        let (reason, sequence) = stop_reason(finish.reason, finish.matched);
        if self.spec.stream {
            self.start(out);
            write::event_start(out, "content_block_stop");
            out.extend_from_slice(b"{\"type\":\"content_block_stop\",\"index\":0}");
            write::event_end(out);
            write::event_start(out, "message_delta");
            out.extend_from_slice(b"{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":");
            write::string(out, reason);
            write::next_key(out, "stop_sequence");
            out.extend_from_slice(&sequence);
            out.extend_from_slice(b"},\"usage\":{\"output_tokens\":");
            write::u64(out, u64::from(finish.usage.completion_tokens));
            out.extend_from_slice(b"}}");
            write::event_end(out);
            write::event_start(out, "message_stop");
            out.extend_from_slice(b"{\"type\":\"message_stop\"}");
            write::event_end(out);
        }
        self.ended = Some((
            reason,
            sequence,
            finish.usage.completion_tokens,
            finish.usage.prompt_tokens,
        ));
    }

    fn end(&mut self, out: &mut Vec<u8>) {
        if self.closed {
            return;
        }
        self.closed = true;
        if self.spec.stream {
            return;
        }
        out.extend_from_slice(b"{\"id\":");
        write::string(out, &self.spec.id);
        out.extend_from_slice(b",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
        write::string(out, &self.spec.model);
        out.extend_from_slice(b",\"content\":[{\"type\":\"text\",\"text\":\"");
        out.extend_from_slice(&self.text);
        out.extend_from_slice(b"\"}],\"stop_reason\":");
        match &self.ended {
            Some((reason, sequence, output, input)) => {
                write::string(out, reason);
                write::next_key(out, "stop_sequence");
                out.extend_from_slice(sequence);
                out.extend_from_slice(b",\"usage\":{\"input_tokens\":");
                write::u64(out, u64::from(*input));
                write::next_key(out, "output_tokens");
                write::u64(out, u64::from(*output));
            }
            None => {
                out.extend_from_slice(b"null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":");
                write::u64(out, u64::from(self.spec.prompt_tokens_of(0)));
                out.extend_from_slice(b",\"output_tokens\":0");
            }
        }
        out.extend_from_slice(b"}}");
    }

    fn fail(&mut self, out: &mut Vec<u8>, failure: &StreamFailure<'_>) {
        if self.closed {
            return;
        }
        self.closed = true;
        if !self.spec.stream {
            super::gateway_error_body(out, failure);
            return;
        }
        write::event_start(out, "error");
        out.extend_from_slice(b"{\"type\":\"error\",\"error\":{\"type\":");
        write::string(out, error_type(failure.status));
        write::next_key(out, "message");
        write::string(out, failure.message);
        out.extend_from_slice(b"}}");
        write::event_end(out);
    }

    fn usage(&self) -> &UsageTotals {
        &self.usage
    }
}
