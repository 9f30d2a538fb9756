//! `/v1/completions`: `text_completion` bodies and streams, in SGLang's dialect.
//!
//! Choice `i` is sample `i % n` of prompt `i / n` ([`crate::choice_index`]). `echo` prepends
//! the prompt's text to the choice's first output (SMG); `suffix` is appended after the last,
//! as its own chunk when streaming (SMG). Logprobs use the legacy shape: `tokens`,
//! `token_logprobs`, `top_logprobs` (`null` when the client asked for 0 alternatives, else
//! one `{token: logprob}` object per token), `text_offset` — character offsets into the
//! choice's text (echo included), counted in Unicode scalar values as Python's `len` counts.

use std::collections::BTreeMap;

use super::openai::{self, Ended, CHUNK_TAIL};
use super::{ResponseSpec, ResponseWriter};
use crate::event::{Delta, Finish, StreamFailure, TokenLogprob};
use crate::usage::UsageTotals;
use crate::write;

/// Writes one completions response (see the module doc).
pub struct CompletionsWriter {
    spec: ResponseSpec,
    head: Vec<u8>,
    choices: BTreeMap<u32, Choice>,
    usage: UsageTotals,
    closed: bool,
}

#[derive(Default)]
struct Choice {
    /// The echoed prompt still has to go out (streaming).
    echo_pending: bool,
    /// Characters of the choice's text so far, echo included (`text_offset`).
    chars: u64,
    ended: Option<Ended>,
    /// Non-streaming accumulators: the text (escaped) and the logprob columns.
    text: Vec<u8>,
    columns: Columns,
}

impl CompletionsWriter {
    pub fn new(spec: ResponseSpec) -> Self {
        CompletionsWriter {
            head: openai::head(&spec, "text_completion"),
            usage: UsageTotals::new(spec.n),
            choices: BTreeMap::new(),
            closed: false,
            spec,
        }
    }

    fn echo_of(&self, index: u32) -> Option<&str> {
        let prompt = (index / self.spec.n.max(1)) as usize;
        self.spec.echo.get(prompt).map(String::as_str)
    }

    /// The choice, created on first use with its echo accounted for.
    fn choice(&mut self, index: u32) -> &mut Choice {
        if !self.choices.contains_key(&index) {
            let mut choice = Choice::default();
            if let Some(echo) = self.echo_of(index) {
                choice.echo_pending = true;
                choice.chars = echo.chars().count() as u64;
            }
            self.choices.insert(index, choice);
        }
        self.choices.entry(index).or_default()
    }

    fn is_ended(&self, index: u32) -> bool {
        self.choices.get(&index).is_some_and(|c| c.ended.is_some())
    }

    /// One streamed chunk with one running choice: `text` is `echo` + `piece`.
    fn text_chunk(
        &self,
        out: &mut Vec<u8>,
        index: u32,
        echo: Option<&str>,
        piece: &str,
        rows: Option<(&[TokenLogprob], u64)>,
    ) {
        write::data_start(out);
        out.extend_from_slice(&self.head);
        out.push(b'{');
        write::key(out, "index");
        write::u64(out, u64::from(index));
        out.extend_from_slice(b",\"text\":\"");
        if let Some(echo) = echo {
            write::string_contents(out, echo);
        }
        write::string_contents(out, piece);
        out.extend_from_slice(b"\",\"logprobs\":");
        match rows {
            Some((rows, offset)) => Columns::write_rows(out, rows, offset, self.top_wanted()),
            None => out.extend_from_slice(b"null"),
        }
        openai::finish_members(out, None, &[]);
        out.push(b'}');
        out.extend_from_slice(CHUNK_TAIL);
        write::event_end(out);
    }

    fn top_wanted(&self) -> bool {
        self.spec.logprobs.is_some_and(|l| l.top_logprobs > 0)
    }
}

/// `{token: logprob, …}`: one token's alternatives. A token text listed twice keeps its first
/// (likeliest) logprob, as one JSON object holds each key once.
fn top_object(out: &mut Vec<u8>, row: &TokenLogprob) {
    out.push(b'{');
    let mut first = true;
    for (i, alt) in row.top.iter().enumerate() {
        if row.top[..i].iter().any(|t| t.token == alt.token) {
            continue;
        }
        if !first {
            out.push(b',');
        }
        first = false;
        write::string(out, &alt.token);
        out.push(b':');
        write::logprob(out, alt.logprob);
    }
    out.push(b'}');
}

/// The four legacy logprob columns of some tokens, as comma-separated JSON values.
#[derive(Default)]
struct Columns {
    tokens: Vec<u8>,
    token_logprobs: Vec<u8>,
    top_logprobs: Vec<u8>,
    text_offset: Vec<u8>,
}

impl Columns {
    /// Appends `rows`, the first starting at character `offset` of the choice's text.
    fn push(&mut self, rows: &[TokenLogprob], mut offset: u64, with_top: bool) {
        for row in rows {
            self.push_row(row, offset, with_top);
            offset += row.token.chars().count() as u64;
        }
    }

    /// The logprobs object of `rows` alone, written straight into `out` (a streamed chunk).
    fn write_rows(out: &mut Vec<u8>, rows: &[TokenLogprob], offset: u64, with_top: bool) {
        out.extend_from_slice(b"{\"tokens\":[");
        for (i, row) in rows.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write::string(out, &row.token);
        }
        out.extend_from_slice(b"],\"token_logprobs\":[");
        for (i, row) in rows.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write::logprob(out, row.logprob);
        }
        out.extend_from_slice(b"],\"top_logprobs\":");
        if with_top {
            out.push(b'[');
            for (i, row) in rows.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                top_object(out, row);
            }
            out.push(b']');
        } else {
            out.extend_from_slice(b"null");
        }
        out.extend_from_slice(b",\"text_offset\":[");
        let mut at = offset;
        for (i, row) in rows.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write::u64(out, at);
            at += row.token.chars().count() as u64;
        }
        out.extend_from_slice(b"]}");
    }

    fn push_row(&mut self, row: &TokenLogprob, offset: u64, with_top: bool) {
        for column in [
            &mut self.tokens,
            &mut self.token_logprobs,
            &mut self.text_offset,
        ] {
            if !column.is_empty() {
                column.push(b',');
            }
        }
        write::string(&mut self.tokens, &row.token);
        write::logprob(&mut self.token_logprobs, row.logprob);
        write::u64(&mut self.text_offset, offset);
        if !with_top {
            return;
        }
        if !self.top_logprobs.is_empty() {
            self.top_logprobs.push(b',');
        }
        top_object(&mut self.top_logprobs, row);
    }

    /// `{"tokens":[…],"token_logprobs":[…],"top_logprobs":[…]|null,"text_offset":[…]}`.
    fn write(&self, out: &mut Vec<u8>, with_top: bool) {
        out.extend_from_slice(b"{\"tokens\":[");
        out.extend_from_slice(&self.tokens);
        out.extend_from_slice(b"],\"token_logprobs\":[");
        out.extend_from_slice(&self.token_logprobs);
        out.extend_from_slice(b"],\"top_logprobs\":");
        if with_top {
            out.push(b'[');
            out.extend_from_slice(&self.top_logprobs);
            out.push(b']');
        } else {
            out.extend_from_slice(b"null");
        }
        out.extend_from_slice(b",\"text_offset\":[");
        out.extend_from_slice(&self.text_offset);
        out.extend_from_slice(b"]}");
    }
}

impl ResponseWriter for CompletionsWriter {
    fn start(&mut self, _out: &mut Vec<u8>) {}

    fn delta(&mut self, out: &mut Vec<u8>, delta: &Delta<'_>) {
        if self.closed || self.is_ended(delta.index) {
            return;
        }
        let with_logprobs = self.spec.logprobs.is_some();
        let with_top = self.top_wanted();
        if !self.spec.stream {
            let choice = self.choice(delta.index);
            if with_logprobs {
                let offset = choice.chars;
                choice.columns.push(delta.logprobs, offset, with_top);
            }
            write::string_contents(&mut choice.text, delta.text);
            choice.chars += delta.text.chars().count() as u64;
            return;
        }
        let echo_pending = self.choice(delta.index).echo_pending;
        let rows_shown = with_logprobs && !delta.logprobs.is_empty();
        if delta.text.is_empty() && !rows_shown && !echo_pending {
            return;
        }
        let offset = self.choice(delta.index).chars;
        let echo = if echo_pending {
            self.echo_of(delta.index)
        } else {
            None
        };
        let rows = with_logprobs.then_some((delta.logprobs, offset));
        self.text_chunk(out, delta.index, echo, delta.text, rows);
        let choice = self.choice(delta.index);
        choice.echo_pending = false;
        choice.chars += delta.text.chars().count() as u64;
    }

    fn finish(&mut self, out: &mut Vec<u8>, finish: &Finish<'_>) {
        if self.closed || self.is_ended(finish.index) {
            return;
        }
        self.usage.record(finish.index, &finish.usage);
        let ended = Ended::new(finish.reason, finish.matched);
        if self.spec.stream {
            if self.choice(finish.index).echo_pending {
                let echo = self.echo_of(finish.index);
                self.text_chunk(out, finish.index, echo, "", None);
            }
            if let Some(suffix) = &self.spec.suffix {
                self.text_chunk(out, finish.index, None, suffix, None);
            }
            write::data_start(out);
            out.extend_from_slice(&self.head);
            out.push(b'{');
            write::key(out, "index");
            write::u64(out, u64::from(finish.index));
            out.extend_from_slice(b",\"text\":\"\",\"logprobs\":null");
            openai::finish_members(out, ended.reason, &ended.matched);
            out.push(b'}');
            out.extend_from_slice(CHUNK_TAIL);
            write::event_end(out);
        }
        let choice = self.choice(finish.index);
        choice.echo_pending = false;
        choice.ended = Some(ended);
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
        let with_top = self.top_wanted();
        out.extend_from_slice(&self.head);
        for (i, (index, choice)) in self.choices.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.push(b'{');
            write::key(out, "index");
            write::u64(out, u64::from(*index));
            out.extend_from_slice(b",\"text\":\"");
            if let Some(echo) = self.echo_of(*index) {
                write::string_contents(out, echo);
            }
            out.extend_from_slice(&choice.text);
            if let Some(suffix) = &self.spec.suffix {
                write::string_contents(out, suffix);
            }
            out.extend_from_slice(b"\",\"logprobs\":");
            if self.spec.logprobs.is_some() {
                choice.columns.write(out, with_top);
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
