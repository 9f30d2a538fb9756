//! SGLang's native `/generate`: `{"text","output_ids","meta_info"}` per item — one object, or a
//! list for a batch input or `n > 1` — and its stream.
//!
//! Streaming follows SGLang's default (not `incremental_streaming_output`): every frame
//! carries the item's **cumulative** `text` and `output_ids` so far, with
//! `meta_info.finish_reason: null` until the item's final frame, which repeats the whole text
//! with `{"type":"stop","matched":…}`, `{"type":"length","length":n}` or
//! `{"type":"abort","message":…}`. List streams add the item's `index` to each frame. The
//! stream ends with `data: [DONE]`.
//!
//! `meta_info`: `id` (the request id; `"{id}-{i}"` per item of a list unless the client named
//! the items), `finish_reason`, `prompt_tokens`, `weight_version` (`"default"` when unknown),
//! `completion_tokens`, `cached_tokens`, `e2e_latency` (final frame, when the gateway passes
//! it), and with `return_logprob` the `[logprob, token_id, text|null]` triples of
//! `input_token_logprobs` / `output_token_logprobs` (plus `*_top_logprobs` with
//! `top_logprobs_num > 0`), cumulative like the text.

use std::collections::BTreeMap;

use super::openai;
use super::{ResponseSpec, ResponseWriter};
use crate::event::{
    ChoiceUsage, Delta, Finish, FinishReason, MatchedStop, PromptTokenLogprob, StreamFailure,
    TopLogprob,
};
use crate::usage::UsageTotals;
use crate::write;

/// Writes one `/generate` response (see the module doc).
pub struct GenerateWriter {
    spec: ResponseSpec,
    items: BTreeMap<u32, Item>,
    /// Per prompt: its `input_token_logprobs` and `input_top_logprobs` entries.
    prompt_logprobs: BTreeMap<u32, (Vec<u8>, Vec<u8>)>,
    usage: UsageTotals,
    closed: bool,
    /// `meta_info.weight_version`.
    weight_version: String,
}

#[derive(Default)]
struct Item {
    /// The text so far, escaped.
    text: Vec<u8>,
    /// The output ids so far, comma-separated.
    ids: Vec<u8>,
    id_count: u32,
    /// `output_token_logprobs` / `output_top_logprobs` entries so far, comma-separated.
    out_logprobs: Vec<u8>,
    out_top: Vec<u8>,
    /// The engine's latest running counts.
    running: Option<ChoiceUsage>,
    ended: Option<Ended>,
}

struct Ended {
    /// `meta_info.finish_reason`'s JSON.
    reason: Vec<u8>,
    usage: ChoiceUsage,
    e2e_latency: Option<f64>,
}

impl GenerateWriter {
    pub fn new(spec: ResponseSpec) -> Self {
        GenerateWriter {
            weight_version: spec
                .system_fingerprint
                .clone()
                .unwrap_or_else(|| "default".to_string()),
            usage: UsageTotals::new(spec.n),
            items: BTreeMap::new(),
            prompt_logprobs: BTreeMap::new(),
            closed: false,
            spec,
        }
    }

    fn top_wanted(&self) -> bool {
        self.spec.logprobs.is_some_and(|l| l.top_logprobs > 0)
    }

    fn token_text(&self) -> bool {
        self.spec.logprobs.is_some_and(|l| l.token_text)
    }

    /// One item object: `{"text","output_ids","meta_info"[,"index"]}`.
    fn write_item(&self, out: &mut Vec<u8>, index: u32, item: &Item, with_index: bool) {
        out.extend_from_slice(b"{\"text\":\"");
        out.extend_from_slice(&item.text);
        out.extend_from_slice(b"\",\"output_ids\":[");
        out.extend_from_slice(&item.ids);
        out.extend_from_slice(b"],\"meta_info\":{\"id\":");
        match self.spec.item_ids.get(index as usize) {
            Some(id) => write::string(out, id),
            None if self.spec.list_output => {
                out.push(b'"');
                write::string_contents(out, &self.spec.id);
                out.push(b'-');
                write::u64(out, u64::from(index));
                out.push(b'"');
            }
            None => write::string(out, &self.spec.id),
        }
        write::next_key(out, "finish_reason");
        match &item.ended {
            Some(ended) => out.extend_from_slice(&ended.reason),
            None => out.extend_from_slice(b"null"),
        }
        let usage = match (&item.ended, item.running) {
            (Some(ended), _) => ended.usage,
            (None, running) => ChoiceUsage {
                prompt_tokens: running
                    .map_or_else(|| self.spec.prompt_tokens_of(index), |r| r.prompt_tokens),
                completion_tokens: item.id_count,
                cached_tokens: running.map_or(0, |r| r.cached_tokens),
                reasoning_tokens: 0,
            },
        };
        write::next_key(out, "prompt_tokens");
        write::u64(out, u64::from(usage.prompt_tokens));
        write::next_key(out, "weight_version");
        write::string(out, &self.weight_version);
        write::next_key(out, "completion_tokens");
        write::u64(out, u64::from(usage.completion_tokens));
        write::next_key(out, "cached_tokens");
        write::u64(out, u64::from(usage.cached_tokens));
        if let Some(e2e) = item.ended.as_ref().and_then(|e| e.e2e_latency) {
            write::next_key(out, "e2e_latency");
            write::f64(out, e2e);
        }
        if self.spec.logprobs.is_some() {
            let prompt = index / self.spec.n.max(1);
            let (input, input_top) = self
                .prompt_logprobs
                .get(&prompt)
                .map_or((&[][..], &[][..]), |(a, b)| (&a[..], &b[..]));
            write::next_key(out, "input_token_logprobs");
            out.push(b'[');
            out.extend_from_slice(input);
            out.push(b']');
            write::next_key(out, "output_token_logprobs");
            out.push(b'[');
            out.extend_from_slice(&item.out_logprobs);
            out.push(b']');
            if self.top_wanted() {
                write::next_key(out, "input_top_logprobs");
                out.push(b'[');
                out.extend_from_slice(input_top);
                out.push(b']');
                write::next_key(out, "output_top_logprobs");
                out.push(b'[');
                out.extend_from_slice(&item.out_top);
                out.push(b']');
            }
        }
        out.push(b'}');
        if with_index {
            write::next_key(out, "index");
            write::u64(out, u64::from(index));
        }
        out.push(b'}');
    }

    fn frame(&self, out: &mut Vec<u8>, index: u32) {
        if let Some(item) = self.items.get(&index) {
            write::data_start(out);
            self.write_item(out, index, item, self.spec.list_output);
            write::event_end(out);
        }
    }

    fn is_ended(&self, index: u32) -> bool {
        self.items.get(&index).is_some_and(|i| i.ended.is_some())
    }
}

/// `[lp, id, text|null]`: one `/generate` logprob triple.
fn triple(out: &mut Vec<u8>, logprob: Option<f32>, id: u32, text: Option<&str>) {
    out.push(b'[');
    match logprob {
        Some(lp) => write::logprob(out, lp),
        None => out.extend_from_slice(b"null"),
    }
    out.push(b',');
    write::u64(out, u64::from(id));
    out.push(b',');
    write::opt_string(out, text);
    out.push(b']');
}

/// `[[lp, id, text|null], …]`: a token's alternatives.
fn top_list(out: &mut Vec<u8>, top: &[TopLogprob], token_text: bool) {
    out.push(b'[');
    for (i, alt) in top.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        triple(
            out,
            Some(alt.logprob),
            alt.token_id,
            token_text.then_some(alt.token.as_str()),
        );
    }
    out.push(b']');
}

/// Appends a comma when `column` already holds an entry.
fn separate(column: &mut Vec<u8>) {
    if !column.is_empty() {
        column.push(b',');
    }
}

/// SGLang's `finish_reason` object.
fn finish_json(reason: FinishReason<'_>, matched: Option<MatchedStop<'_>>, length: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(40);
    out.extend_from_slice(b"{\"type\":");
    match reason {
        FinishReason::Stop => {
            write::string(&mut out, "stop");
            if matched.is_some() {
                write::next_key(&mut out, "matched");
                openai::matched_json(&mut out, matched);
            }
        }
        FinishReason::Length => {
            write::string(&mut out, "length");
            write::next_key(&mut out, "length");
            write::u64(&mut out, u64::from(length));
        }
        FinishReason::Abort(message) => {
            write::string(&mut out, "abort");
            write::next_key(&mut out, "message");
            write::opt_string(&mut out, message);
        }
    }
    out.push(b'}');
    out
}

impl ResponseWriter for GenerateWriter {
    fn start(&mut self, _out: &mut Vec<u8>) {}

    fn delta(&mut self, out: &mut Vec<u8>, delta: &Delta<'_>) {
        if self.closed || self.is_ended(delta.index) {
            return;
        }
        let with_logprobs = self.spec.logprobs.is_some();
        let with_top = self.top_wanted();
        let token_text = self.token_text();
        let item = self.items.entry(delta.index).or_default();
        write::string_contents(&mut item.text, delta.text);
        for &id in delta.token_ids {
            separate(&mut item.ids);
            write::u64(&mut item.ids, u64::from(id));
            item.id_count += 1;
        }
        if with_logprobs {
            for row in delta.logprobs {
                separate(&mut item.out_logprobs);
                let text = token_text.then_some(row.token.as_str());
                triple(
                    &mut item.out_logprobs,
                    Some(row.logprob),
                    row.token_id,
                    text,
                );
                if with_top {
                    separate(&mut item.out_top);
                    top_list(&mut item.out_top, &row.top, token_text);
                }
            }
        }
        if delta.usage.is_some() {
            item.running = delta.usage;
        }
        if self.spec.stream && !(delta.text.is_empty() && delta.token_ids.is_empty()) {
            self.frame(out, delta.index);
        }
    }

    fn finish(&mut self, out: &mut Vec<u8>, finish: &Finish<'_>) {
        if self.closed || self.is_ended(finish.index) {
            return;
        }
        self.usage.record(finish.index, &finish.usage);
        let item = self.items.entry(finish.index).or_default();
        item.ended = Some(Ended {
            reason: finish_json(
                finish.reason,
                finish.matched,
                finish.usage.completion_tokens,
            ),
            usage: finish.usage,
            e2e_latency: finish.e2e_latency,
        });
        if self.spec.stream {
            self.frame(out, finish.index);
        }
    }

    fn prompt_logprobs(&mut self, prompt: u32, rows: &[PromptTokenLogprob]) {
        let token_text = self.token_text();
        let mut tokens = Vec::new();
        let mut tops = Vec::new();
        for row in rows {
            separate(&mut tokens);
            let text = token_text.then_some(row.token.as_str());
            triple(&mut tokens, row.logprob, row.token_id, text);
            separate(&mut tops);
            if row.logprob.is_none() {
                tops.extend_from_slice(b"null");
            } else {
                top_list(&mut tops, &row.top, token_text);
            }
        }
        self.prompt_logprobs.insert(prompt, (tokens, tops));
    }

    fn end(&mut self, out: &mut Vec<u8>) {
        if self.closed {
            return;
        }
        self.closed = true;
        if self.spec.stream {
            out.extend_from_slice(write::DONE);
            return;
        }
        if !self.spec.list_output {
            let empty = Item::default();
            let (index, item) = self
                .items
                .iter()
                .next()
                .map_or((0, &empty), |(index, item)| (*index, item));
            self.write_item(out, index, item, false);
            return;
        }
        out.push(b'[');
        for (i, (index, item)) in self.items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            self.write_item(out, *index, item, false);
        }
        out.push(b']');
    }

    fn fail(&mut self, out: &mut Vec<u8>, failure: &StreamFailure<'_>) {
        openai::fail(&mut self.closed, self.spec.stream, out, failure);
    }

    fn usage(&self) -> &UsageTotals {
        &self.usage
    }
}
