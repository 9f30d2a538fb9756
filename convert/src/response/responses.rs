//! OpenAI `/v1/responses`, minimal and not stored: one assistant message with one
//! `output_text` part, as the HTTP mocks render it.
//!
//! Body: `{"id","object":"response","created_at","status","model","output":[message],
//! "incomplete_details","error":null,"usage":{"input_tokens","output_tokens","total_tokens"}}`
//! with `status` `incomplete` (`incomplete_details.reason: "max_output_tokens"`) when the
//! output cap ended it, `completed` otherwise (SGLang's rule, aborts included).
//!
//! Stream (named events, each carrying its `type` and a `sequence_number` from 0):
//! `response.created`, `response.in_progress`, `response.output_item.added`,
//! `response.content_part.added`, one `response.output_text.delta` per non-empty delta, then
//! `response.output_text.done`, `response.content_part.done`, `response.output_item.done`,
//! `response.completed` (the final response object), or `response.incomplete` when the output
//! cap ended it (OpenAI's event, which SMG sends too; SGLang's own server sends
//! `response.completed` either way, and clients switching on the event name misread that). A
//! failure is `response.failed` with the response `status: "failed"` and `error: {code,
//! message}`. Only choice 0 is written.

use super::{ResponseSpec, ResponseWriter};
use crate::event::{Delta, Finish, FinishReason, StreamFailure};
use crate::usage::UsageTotals;
use crate::write;

/// Writes one Responses response (see the module doc).
pub struct ResponsesWriter {
    spec: ResponseSpec,
    item_id: String,
    started: bool,
    closed: bool,
    seq: u64,
    /// The output text so far, escaped (the final events repeat it whole).
    text: Vec<u8>,
    /// The finish: whether the output cap ended it, and the counts.
    ended: Option<(bool, u32, u32)>,
    usage: UsageTotals,
}

/// The response's status while and after generating.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Status {
    InProgress,
    Completed,
    Incomplete,
    Failed,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
            Status::Incomplete => "incomplete",
            Status::Failed => "failed",
        }
    }
}

impl ResponsesWriter {
    pub fn new(spec: ResponseSpec) -> Self {
        let item_id = spec.output_item_id.clone().unwrap_or_else(|| {
            format!("msg_{}", spec.id.strip_prefix("resp_").unwrap_or(&spec.id))
        });
        ResponsesWriter {
            usage: UsageTotals::new(1),
            item_id,
            spec,
            started: false,
            closed: false,
            seq: 0,
            text: Vec::new(),
            ended: None,
        }
    }

    /// Opens event `name`: `event: <name>\ndata: {"type":<name>,"sequence_number":<n>`.
    fn event(&mut self, out: &mut Vec<u8>, name: &str) {
        write::event_start(out, name);
        out.push(b'{');
        write::key(out, "type");
        write::string(out, name);
        write::next_key(out, "sequence_number");
        write::u64(out, self.seq);
        self.seq += 1;
    }

    /// `"item_id":…,"output_index":0,"content_index":0` after a comma.
    fn part_location(&self, out: &mut Vec<u8>) {
        write::next_key(out, "item_id");
        write::string(out, &self.item_id);
        out.extend_from_slice(b",\"output_index\":0,\"content_index\":0");
    }

    /// `{"type":"output_text","text":<the text so far>,"annotations":[]}`.
    fn part(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"type\":\"output_text\",\"text\":\"");
        out.extend_from_slice(&self.text);
        out.extend_from_slice(b"\",\"annotations\":[]}");
    }

    /// The output message item.
    fn message_item(&self, out: &mut Vec<u8>, status: &str, with_part: bool) {
        out.extend_from_slice(b"{\"id\":");
        write::string(out, &self.item_id);
        out.extend_from_slice(b",\"type\":\"message\",\"status\":");
        write::string(out, status);
        out.extend_from_slice(b",\"role\":\"assistant\",\"content\":[");
        if with_part {
            self.part(out);
        }
        out.extend_from_slice(b"]}");
    }

    /// The response object.
    fn response_object(
        &self,
        out: &mut Vec<u8>,
        status: Status,
        failure: Option<&StreamFailure<'_>>,
    ) {
        let (input, output) = match self.ended {
            Some((_, output, input)) => (input, output),
            None => (self.spec.prompt_tokens_of(0), 0),
        };
        out.extend_from_slice(b"{\"id\":");
        write::string(out, &self.spec.id);
        out.extend_from_slice(b",\"object\":\"response\",\"created_at\":");
        write::u64(out, self.spec.created);
        write::next_key(out, "status");
        write::string(out, status.as_str());
        write::next_key(out, "model");
        write::string(out, &self.spec.model);
        write::next_key(out, "output");
        out.push(b'[');
        if status != Status::InProgress {
            self.message_item(out, "completed", true);
        }
        out.push(b']');
        write::next_key(out, "incomplete_details");
        if status == Status::Incomplete {
            out.extend_from_slice(b"{\"reason\":\"max_output_tokens\"}");
        } else {
            out.extend_from_slice(b"null");
        }
        write::next_key(out, "error");
        match failure {
            Some(failure) => {
                out.extend_from_slice(b"{\"code\":");
                write::string(out, failure.code.as_str());
                write::next_key(out, "message");
                write::string(out, failure.message);
                out.push(b'}');
            }
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"usage\":{\"input_tokens\":");
        write::u64(out, u64::from(input));
        write::next_key(out, "output_tokens");
        write::u64(out, u64::from(output));
        write::next_key(out, "total_tokens");
        write::u64(out, u64::from(input) + u64::from(output));
        out.extend_from_slice(b"}}");
    }

    fn final_status(&self) -> Status {
        match self.ended {
            Some((true, _, _)) => Status::Incomplete,
            _ => Status::Completed,
        }
    }
}

impl ResponseWriter for ResponsesWriter {
    fn start(&mut self, out: &mut Vec<u8>) {
        if self.started || self.closed || !self.spec.stream {
            return;
        }
        self.started = true;
        for name in ["response.created", "response.in_progress"] {
            self.event(out, name);
            write::next_key(out, "response");
            self.response_object(out, Status::InProgress, None);
            out.push(b'}');
            write::event_end(out);
        }
        self.event(out, "response.output_item.added");
        out.extend_from_slice(b",\"output_index\":0,\"item\":");
        self.message_item(out, "in_progress", false);
        out.push(b'}');
        write::event_end(out);
        self.event(out, "response.content_part.added");
        self.part_location(out);
        out.extend_from_slice(
            b",\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}}",
        );
        write::event_end(out);
    }

    fn delta(&mut self, out: &mut Vec<u8>, delta: &Delta<'_>) {
        if self.closed || delta.index != 0 || self.ended.is_some() {
            return;
        }
        write::string_contents(&mut self.text, delta.text);
        if !self.spec.stream || delta.text.is_empty() {
            return;
        }
        self.start(out);
        self.event(out, "response.output_text.delta");
        self.part_location(out);
        write::next_key(out, "delta");
        write::string(out, delta.text);
        out.push(b'}');
        write::event_end(out);
    }

    fn finish(&mut self, out: &mut Vec<u8>, finish: &Finish<'_>) {
        if self.closed || finish.index != 0 || self.ended.is_some() {
            return;
        }
        self.usage.record(0, &finish.usage);
        self.ended = Some((
            finish.reason == FinishReason::Length,
            finish.usage.completion_tokens,
            finish.usage.prompt_tokens,
        ));
        if !self.spec.stream {
            return;
        }
        self.start(out);
        self.event(out, "response.output_text.done");
        self.part_location(out);
        out.extend_from_slice(b",\"text\":\"");
        out.extend_from_slice(&self.text);
        out.extend_from_slice(b"\"}");
        write::event_end(out);
        self.event(out, "response.content_part.done");
        self.part_location(out);
        write::next_key(out, "part");
        self.part(out);
        out.push(b'}');
        write::event_end(out);
        self.event(out, "response.output_item.done");
        out.extend_from_slice(b",\"output_index\":0,\"item\":");
        self.message_item(out, "completed", true);
        out.push(b'}');
        write::event_end(out);
        let status = self.final_status();
        self.event(
            out,
            match status {
                Status::Incomplete => "response.incomplete",
                _ => "response.completed",
            },
        );
        write::next_key(out, "response");
        self.response_object(out, status, None);
        out.push(b'}');
        write::event_end(out);
    }

    fn end(&mut self, out: &mut Vec<u8>) {
        if self.closed {
            return;
        }
        self.closed = true;
        if !self.spec.stream {
            self.response_object(out, self.final_status(), None);
        }
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
        self.event(out, "response.failed");
        write::next_key(out, "response");
        self.response_object(out, Status::Failed, Some(failure));
        out.push(b'}');
        write::event_end(out);
    }

    fn usage(&self) -> &UsageTotals {
        &self.usage
    }
}
