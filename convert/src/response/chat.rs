//! `/v1/chat/completions`: `chat.completion` bodies and `chat.completion.chunk` streams, in
//! SGLang's dialect.
//!
//! Stream, per choice: a role chunk (`delta: {"role":"assistant","content":""}`) before its
//! first content, content chunks (`delta: {"content":…}`, with `logprobs.content` rows when
//! asked), a finish chunk (`delta: {}`, `finish_reason`, `matched_stop`); then, once, a usage
//! chunk with empty `choices` when `stream_options.include_usage`, and `data: [DONE]`. Every
//! chunk carries `"usage":null` and every choice `"matched_stop"` (SGLang's extension).

use std::collections::BTreeMap;

use super::openai::{self, Ended, CHUNK_TAIL};
use super::{ResponseSpec, ResponseWriter};
use crate::event::{Delta, Finish, StreamFailure, TokenLogprob};
use crate::usage::UsageTotals;
use crate::write;

/// Writes one chat completion response (see the module doc).
pub struct ChatWriter {
    spec: ResponseSpec,
    /// The chunk (or body) head, built once.
    head: Vec<u8>,
    choices: BTreeMap<u32, Choice>,
    usage: UsageTotals,
    closed: bool,
}

#[derive(Default)]
struct Choice {
    /// The role chunk went out.
    opened: bool,
    ended: Option<Ended>,
    /// Non-streaming: the content so far, escaped.
    content: Vec<u8>,
    /// Non-streaming: the `logprobs.content` entries so far, comma-separated.
    logprobs: Vec<u8>,
}

impl ChatWriter {
    pub fn new(spec: ResponseSpec) -> Self {
        let object = if spec.stream {
            "chat.completion.chunk"
        } else {
            "chat.completion"
        };
        ChatWriter {
            head: openai::head(&spec, object),
            usage: UsageTotals::new(spec.n),
            choices: BTreeMap::new(),
            closed: false,
            spec,
        }
    }

    fn chunk_start(&self, out: &mut Vec<u8>) {
        write::data_start(out);
        out.extend_from_slice(&self.head);
    }

    fn chunk_end(out: &mut Vec<u8>) {
        out.extend_from_slice(CHUNK_TAIL);
        write::event_end(out);
    }

    /// The role chunk of choice `index`, the first time.
    fn open(&mut self, out: &mut Vec<u8>, index: u32) {
        let choice = self.choices.entry(index).or_default();
        if choice.opened {
            return;
        }
        choice.opened = true;
        self.chunk_start(out);
        out.push(b'{');
        write::key(out, "index");
        write::u64(out, u64::from(index));
        out.extend_from_slice(
            b",\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null",
        );
        openai::finish_members(out, None, &[]);
        out.push(b'}');
        Self::chunk_end(out);
    }
}

/// One `logprobs.content` entry: `{"token","logprob","bytes","top_logprobs":[…]}`.
fn logprob_entry(out: &mut Vec<u8>, row: &TokenLogprob) {
    out.push(b'{');
    write::key(out, "token");
    write::string(out, &row.token);
    write::next_key(out, "logprob");
    write::logprob(out, row.logprob);
    write::next_key(out, "bytes");
    write::byte_list(out, row.raw_bytes());
    write::next_key(out, "top_logprobs");
    out.push(b'[');
    for (i, top) in row.top.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'{');
        write::key(out, "token");
        write::string(out, &top.token);
        write::next_key(out, "logprob");
        write::logprob(out, top.logprob);
        write::next_key(out, "bytes");
        write::byte_list(out, top.raw_bytes());
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
}

fn logprob_entries(out: &mut Vec<u8>, rows: &[TokenLogprob]) {
    for row in rows {
        if !out.is_empty() {
            out.push(b',');
        }
        logprob_entry(out, row);
    }
}

impl ResponseWriter for ChatWriter {
    fn start(&mut self, _out: &mut Vec<u8>) {}

    fn delta(&mut self, out: &mut Vec<u8>, delta: &Delta<'_>) {
        if self.closed
            || self
                .choices
                .get(&delta.index)
                .is_some_and(|c| c.ended.is_some())
        {
            return;
        }
        let with_logprobs = self.spec.logprobs.is_some();
        if !self.spec.stream {
            let choice = self.choices.entry(delta.index).or_default();
            write::string_contents(&mut choice.content, delta.text);
            if with_logprobs {
                logprob_entries(&mut choice.logprobs, delta.logprobs);
            }
            return;
        }
        self.open(out, delta.index);
        if delta.text.is_empty() && (!with_logprobs || delta.logprobs.is_empty()) {
            return;
        }
        self.chunk_start(out);
        out.push(b'{');
        write::key(out, "index");
        write::u64(out, u64::from(delta.index));
        out.extend_from_slice(b",\"delta\":{\"content\":");
        write::string(out, delta.text);
        out.extend_from_slice(b"},\"logprobs\":");
        if with_logprobs {
            out.extend_from_slice(b"{\"content\":[");
            for (i, row) in delta.logprobs.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                logprob_entry(out, row);
            }
            out.extend_from_slice(b"]}");
        } else {
            out.extend_from_slice(b"null");
        }
        openai::finish_members(out, None, &[]);
        out.push(b'}');
        Self::chunk_end(out);
    }

    fn finish(&mut self, out: &mut Vec<u8>, finish: &Finish<'_>) {
        if self.closed
            || self
                .choices
                .get(&finish.index)
                .is_some_and(|c| c.ended.is_some())
        {
            return;
        }
        self.usage.record(finish.index, &finish.usage);
        let ended = Ended::new(finish.reason, finish.matched);
        if self.spec.stream {
            self.open(out, finish.index);
            self.chunk_start(out);
            out.push(b'{');
            write::key(out, "index");
            write::u64(out, u64::from(finish.index));
            out.extend_from_slice(b",\"delta\":{},\"logprobs\":null");
            openai::finish_members(out, ended.reason, &ended.matched);
            out.push(b'}');
            Self::chunk_end(out);
        }
        self.choices.entry(finish.index).or_default().ended = Some(ended);
    }

    fn end(&mut self, out: &mut Vec<u8>) {
        if self.closed {
            return;
        }
        self.closed = true;
        if self.spec.stream {
            openai::stream_end(out, &self.head, self.spec.include_usage, &self.usage);
            return;
        }
        out.extend_from_slice(&self.head);
        for (i, (index, choice)) in self.choices.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.push(b'{');
            write::key(out, "index");
            write::u64(out, u64::from(*index));
            out.extend_from_slice(b",\"message\":{\"role\":\"assistant\",\"content\":\"");
            out.extend_from_slice(&choice.content);
            out.extend_from_slice(
                b"\",\"reasoning_content\":null,\"tool_calls\":null},\"logprobs\":",
            );
            if self.spec.logprobs.is_some() {
                out.extend_from_slice(b"{\"content\":[");
                out.extend_from_slice(&choice.logprobs);
                out.extend_from_slice(b"]}");
            } else {
                out.extend_from_slice(b"null");
            }
            let (reason, matched) = openai::ended_members(choice.ended.as_ref());
            openai::finish_members(out, reason, matched);
            out.push(b'}');
        }
        out.extend_from_slice(b"],\"usage\":");
        self.usage.write_openai(out);
        out.push(b'}');
    }

    fn fail(&mut self, out: &mut Vec<u8>, failure: &StreamFailure<'_>) {
        openai::fail(&mut self.closed, self.spec.stream, out, failure);
    }

    fn usage(&self) -> &UsageTotals {
        &self.usage
    }
}
