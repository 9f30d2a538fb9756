//! Pieces the OpenAI-style writers (chat, completions) share: the fixed head of every chunk and
//! body, the finish members, and the mid-stream error event.

use pdgate_filters::errors::render_error;

use super::ResponseSpec;
use crate::event::{FinishReason, MatchedStop, StreamFailure};
use crate::usage::UsageTotals;
use crate::write;

/// `{"id":…,"object":<object>,"created":…,"model":…[,"system_fingerprint":…],"choices":[` —
/// the same bytes open every chunk (and the body) of one response, so they are built once.
pub(super) fn head(spec: &ResponseSpec, object: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(96 + spec.id.len() + spec.model.len());
    out.push(b'{');
    write::key(&mut out, "id");
    write::string(&mut out, &spec.id);
    write::next_key(&mut out, "object");
    write::string(&mut out, object);
    write::next_key(&mut out, "created");
    write::u64(&mut out, spec.created);
    write::next_key(&mut out, "model");
    write::string(&mut out, &spec.model);
    if let Some(fp) = &spec.system_fingerprint {
        write::next_key(&mut out, "system_fingerprint");
        write::string(&mut out, fp);
    }
    write::next_key(&mut out, "choices");
    out.push(b'[');
    out
}

/// Closes a chunk opened with [`head`]: `],"usage":null}` (SGLang sends the explicit null).
pub(super) const CHUNK_TAIL: &[u8] = b"],\"usage\":null}";

/// The JSON of what stopped a choice (`matched_stop`): the token id, the string, or `null`.
pub(super) fn matched_json(out: &mut Vec<u8>, matched: Option<MatchedStop<'_>>) {
    match matched {
        Some(MatchedStop::TokenId(id)) => write::u64(out, u64::from(id)),
        Some(MatchedStop::Text(s)) => write::string(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

/// `,"finish_reason":<reason>,"matched_stop":<matched>` with both already rendered (`null`
/// while the choice runs).
pub(super) fn finish_members(out: &mut Vec<u8>, reason: Option<&str>, matched: &[u8]) {
    write::next_key(out, "finish_reason");
    write::opt_string(out, reason);
    write::next_key(out, "matched_stop");
    if matched.is_empty() {
        out.extend_from_slice(b"null");
    } else {
        out.extend_from_slice(matched);
    }
}

/// The finish state of a choice, rendered once at its finish.
#[derive(Clone, Debug, Default)]
pub(super) struct Ended {
    pub reason: Option<&'static str>,
    /// `matched_stop`'s JSON; empty for `null`.
    pub matched: Vec<u8>,
}

impl Ended {
    pub fn new(reason: FinishReason<'_>, matched: Option<MatchedStop<'_>>) -> Self {
        let mut json = Vec::new();
        if matched.is_some() {
            matched_json(&mut json, matched);
        }
        Ended {
            reason: Some(reason.as_str()),
            matched: json,
        }
    }
}

/// The finish members of a choice that may not have ended (`null`s then).
pub(super) fn ended_members(ended: Option<&Ended>) -> (Option<&'static str>, &[u8]) {
    ended.map_or((None, &[][..]), |e| (e.reason, &e.matched[..]))
}

/// The mid-stream error of the OpenAI-style routes and `/generate`: the gateway's error body
/// as one `data:` event, then `[DONE]` (SMG ends its error streams the same way).
pub(super) fn error_event(out: &mut Vec<u8>, failure: &StreamFailure<'_>) {
    write::data_start(out);
    out.extend_from_slice(&render_error(
        failure.status,
        failure.code.as_str(),
        failure.message,
    ));
    write::event_end(out);
    out.extend_from_slice(write::DONE);
}

/// Ends an OpenAI-style or `/generate` response with an error, once: the error event when
/// streaming, the gateway error body otherwise.
pub(super) fn fail(
    closed: &mut bool,
    stream: bool,
    out: &mut Vec<u8>,
    failure: &StreamFailure<'_>,
) {
    if *closed {
        return;
    }
    *closed = true;
    if stream {
        error_event(out, failure);
    } else {
        super::gateway_error_body(out, failure);
    }
}

/// The end of an OpenAI-style stream: the usage chunk (empty `choices`) when the client asked
/// for it, then `[DONE]`.
pub(super) fn stream_end(out: &mut Vec<u8>, head: &[u8], include_usage: bool, usage: &UsageTotals) {
    if include_usage {
        write::data_start(out);
        out.extend_from_slice(head);
        out.extend_from_slice(b"],\"usage\":");
        usage.write_openai(out);
        out.push(b'}');
        write::event_end(out);
    }
    out.extend_from_slice(write::DONE);
}
