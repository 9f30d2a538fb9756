//! What a PD request is: the facts the gateway plans with (model, stream, `n`, batch size,
//! logprobs, request id, output-cap field), read once from the scanned client body, with a clear
//! 400 message when a field it reads has the wrong JSON type — or when the body does not have
//! the shape its route needs ([`crate::shape`], checked in the same call on the same scan).
//!
//! A JSON `null` counts as absent for every field read here (clients send explicit nulls).

use std::fmt;

use crate::body::TopLevel;
use crate::errors::ErrorCode;
use crate::fields;
use crate::route::Route;
use crate::shape::check_shape;
use crate::value::{self, Kind};

/// Largest `n` accepted. Well above any engine's sampling limit (OpenAI allows 128), it bounds
/// the per-sample room arrays a chat `n` mints.
pub const MAX_N: u64 = 1024;

/// Largest batch (rooms minted for one request). Each item costs one room and a repeated
/// host/port in both legs; the cap keeps that amplification bounded for hostile bodies.
pub const MAX_BATCH: usize = 65_536;

/// The field `n` is read from on `/generate`, as error messages name it.
const SAMPLING_PARAMS_N: &str = "sampling_params.n";

/// What the gateway needs to know about a PD request before choosing workers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestFacts {
    /// Top-level `model` string.
    pub model: Option<String>,
    /// Top-level `stream == true`.
    pub stream: bool,
    /// Samples per prompt: top-level `n` (`/generate`: `sampling_params.n`), default 1.
    pub n: u64,
    /// Items needing their own bootstrap room, when the request is a batch (see [`classify`]).
    pub batch: Option<usize>,
    /// Whether the client asked for prompt/output logprobs (decides the SGLang logprob merge).
    pub logprobs: bool,
    /// Body `request_id` (vLLM), or `/generate`'s `rid` when it is a string.
    pub request_id: Option<String>,
    /// The output-cap field the client used, for the route (see [`cap_field`]).
    pub max_tokens_field: Option<&'static str>,
}

impl RequestFacts {
    /// How many sequences the decode engine runs for this request — the admission slots it
    /// claims: `n` per prompt (chat: one prompt; completions and `/generate`: one per batch
    /// item); one for the other routes.
    pub fn decode_sequences(&self, route: Route) -> usize {
        let n = usize::try_from(self.n).unwrap_or(usize::MAX).max(1);
        match route {
            Route::ChatCompletions => n,
            Route::Completions | Route::Generate => self.batch.unwrap_or(1).saturating_mul(n),
            _ => 1,
        }
    }
}

/// A field the gateway reads has the wrong JSON type or range. Answered with 400.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassifyError {
    /// The offending top-level field.
    pub field: &'static str,
    /// What it must be, as a phrase ("a boolean", "a string", …).
    pub expected: &'static str,
}

impl ClassifyError {
    /// The catalogue code this error is answered with.
    pub fn code(&self) -> ErrorCode {
        ErrorCode::InvalidRequest
    }
}

impl fmt::Display for ClassifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "field `{}` must be {}", self.field, self.expected)
    }
}

impl std::error::Error for ClassifyError {}

fn wrong(field: &'static str, expected: &'static str) -> ClassifyError {
    ClassifyError { field, expected }
}

/// Reads the request facts of `route` from its scanned body, then checks the body's shape
/// ([`check_shape`]); the first wrong field is the error.
///
/// Batch size (one bootstrap room per item):
/// * `/generate`: `input_ids` a non-empty list of lists → its length; else `text` a non-empty
///   list of strings → its length. A single string or a flat list of token ids is one request.
/// * `/v1/completions`: `prompt` a non-empty list of strings, or of token-id lists → its length,
///   even 1 (SMG's rule). A flat list of integers is ONE tokenized prompt, not a batch: SGLang
///   and vLLM serve it as a single request, so it must get a single room.
/// * `/v1/chat/completions`: `n > 1` → `n` (SGLang gives each sample its own room).
/// * other routes: never a batch.
///
/// Logprobs: `/generate` `return_logprob: true`; chat `logprobs: true`; completions `logprobs`
/// present and not `null`/`false` (it is an integer there, and 0 still asks for logprobs).
pub fn classify(route: Route, body: &[u8], top: &TopLevel) -> Result<RequestFacts, ClassifyError> {
    let facts = read_facts(route, body, top)?;
    check_shape(route, body, top)?;
    Ok(facts)
}

fn read_facts(route: Route, body: &[u8], top: &TopLevel) -> Result<RequestFacts, ClassifyError> {
    let get = |key: &str| top.get_non_null(body, key);

    let model = match get(fields::MODEL) {
        None => None,
        Some(raw) => Some(
            value::as_str(raw)
                .ok_or_else(|| wrong(fields::MODEL, "a string"))?
                .into_owned(),
        ),
    };
    let stream = read_bool(get(fields::STREAM), fields::STREAM)?.unwrap_or(false);
    // `n: 0` asks for no sample at all; engines refuse it (OpenAI's range starts at 1).
    let read_n = |raw: Option<&[u8]>, field| match raw {
        None => Ok(1),
        Some(raw) => value::as_u64(raw)
            .filter(|n| (1..=MAX_N).contains(n))
            .ok_or_else(|| wrong(field, "an integer between 1 and 1024")),
    };
    let mut n = read_n(get(fields::N), fields::N)?;
    // `/generate` takes its sampling parameters in one object (SGLang's `sampling_params.n`).
    if route == Route::Generate {
        let sp_n = get(fields::SAMPLING_PARAMS)
            .and_then(|sp| value::object_get(sp, fields::N))
            .filter(|raw| *raw != b"null");
        n = read_n(sp_n, SAMPLING_PARAMS_N)?;
    }

    let batch = match route {
        Route::Generate => generate_batch(get(fields::INPUT_IDS), get(fields::TEXT))?,
        Route::Completions => completions_batch(get(fields::PROMPT))?,
        Route::ChatCompletions => (n > 1).then_some((fields::N, n as usize)),
        _ => None,
    };
    if let Some((field, len)) = batch {
        if len > MAX_BATCH {
            return Err(wrong(field, "a batch of at most 65536 items"));
        }
    }
    let batch = batch.map(|(_, len)| len);

    let logprobs = match route {
        Route::Generate => {
            read_bool(get(fields::RETURN_LOGPROB), fields::RETURN_LOGPROB)?.unwrap_or(false)
        }
        Route::ChatCompletions => {
            read_bool(get(fields::LOGPROBS), fields::LOGPROBS)?.unwrap_or(false)
        }
        Route::Completions => get(fields::LOGPROBS).is_some_and(|raw| raw != b"false"),
        _ => false,
    };

    let request_id = match get(fields::REQUEST_ID) {
        Some(raw) => Some(
            value::as_str(raw)
                .ok_or_else(|| wrong(fields::REQUEST_ID, "a string"))?
                .into_owned(),
        ),
        None if route == Route::Generate => get(fields::RID)
            .and_then(value::as_str)
            .map(|s| s.into_owned()),
        None => None,
    };

    Ok(RequestFacts {
        model,
        stream,
        n,
        batch,
        logprobs,
        request_id,
        max_tokens_field: cap_field(route, body, top),
    })
}

/// The output-cap field the client set (present and not null) for `route`: chat
/// `max_completion_tokens`, else `max_tokens`; responses `max_output_tokens`; every other route
/// `max_tokens`. `None` when the client set no cap.
pub fn cap_field(route: Route, body: &[u8], top: &TopLevel) -> Option<&'static str> {
    let has = |k: &str| top.get_non_null(body, k).is_some();
    match route {
        Route::ChatCompletions if has(fields::MAX_COMPLETION_TOKENS) => {
            Some(fields::MAX_COMPLETION_TOKENS)
        }
        Route::Responses => has(fields::MAX_OUTPUT_TOKENS).then_some(fields::MAX_OUTPUT_TOKENS),
        _ => has(fields::MAX_TOKENS).then_some(fields::MAX_TOKENS),
    }
}

fn read_bool(raw: Option<&[u8]>, field: &'static str) -> Result<Option<bool>, ClassifyError> {
    match raw {
        None => Ok(None),
        Some(raw) => value::as_bool(raw)
            .map(Some)
            .ok_or_else(|| wrong(field, "a boolean")),
    }
}

/// A batch, as the field that makes it one and its item count.
type Batch = Option<(&'static str, usize)>;

fn generate_batch(input_ids: Option<&[u8]>, text: Option<&[u8]>) -> Result<Batch, ClassifyError> {
    if let Some(raw) = input_ids {
        const EXPECTED: &str = "a list of token ids or a list of token-id lists";
        let shape = value::array_shape(raw).ok_or_else(|| wrong(fields::INPUT_IDS, EXPECTED))?;
        if shape.len > 0 && shape.all(Kind::Array) {
            if !shape.all_nested(Kind::Integer) {
                return Err(wrong(fields::INPUT_IDS, EXPECTED));
            }
            return Ok(Some((fields::INPUT_IDS, shape.len)));
        }
        if !shape.all(Kind::Integer) {
            return Err(wrong(fields::INPUT_IDS, EXPECTED));
        }
        return Ok(None);
    }
    if let Some(raw) = text {
        const EXPECTED: &str = "a string or a list of strings";
        return match value::kind(raw) {
            Some(Kind::String) => Ok(None),
            Some(Kind::Array) => {
                let shape = value::array_shape(raw).ok_or_else(|| wrong(fields::TEXT, EXPECTED))?;
                if !shape.all(Kind::String) {
                    return Err(wrong(fields::TEXT, EXPECTED));
                }
                Ok((shape.len > 0).then_some((fields::TEXT, shape.len)))
            }
            _ => Err(wrong(fields::TEXT, EXPECTED)),
        };
    }
    Ok(None)
}

fn completions_batch(prompt: Option<&[u8]>) -> Result<Batch, ClassifyError> {
    const EXPECTED: &str =
        "a string, a list of strings, a list of token ids, or a list of token-id lists";
    let Some(raw) = prompt else { return Ok(None) };
    match value::kind(raw) {
        Some(Kind::String) => Ok(None),
        Some(Kind::Array) => {
            let shape = value::array_shape(raw).ok_or_else(|| wrong(fields::PROMPT, EXPECTED))?;
            if shape.len == 0 || shape.all(Kind::Integer) {
                // Empty (the engine rejects it) or one tokenized prompt.
                Ok(None)
            } else if shape.all(Kind::String)
                || (shape.all(Kind::Array) && shape.all_nested(Kind::Integer))
            {
                Ok(Some((fields::PROMPT, shape.len)))
            } else {
                Err(wrong(fields::PROMPT, EXPECTED))
            }
        }
        _ => Err(wrong(fields::PROMPT, EXPECTED)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::scan_object;

    /// The facts alone; [`classify`] also checks the shape (its own tests are in `shape`).
    fn facts(route: Route, body: &str) -> Result<RequestFacts, ClassifyError> {
        let top = scan_object(body.as_bytes()).unwrap();
        read_facts(route, body.as_bytes(), &top)
    }

    fn ok(route: Route, body: &str) -> RequestFacts {
        facts(route, body).unwrap()
    }

    fn err(route: Route, body: &str) -> String {
        facts(route, body).unwrap_err().to_string()
    }

    #[test]
    fn defaults_for_an_empty_body() {
        let f = ok(Route::ChatCompletions, "{}");
        assert_eq!(
            f,
            RequestFacts {
                n: 1,
                ..RequestFacts::default()
            }
        );
    }

    #[test]
    fn reads_model_stream_and_n() {
        let f = ok(
            Route::Completions,
            r#"{"model":"m\u0031","stream":true,"n":3}"#,
        );
        assert_eq!(f.model.as_deref(), Some("m1"));
        assert!(f.stream);
        assert_eq!(f.n, 3);
    }

    #[test]
    fn null_fields_count_as_absent() {
        let f = ok(
            Route::ChatCompletions,
            r#"{"model":null,"stream":null,"n":null,"logprobs":null}"#,
        );
        assert_eq!(f.model, None);
        assert!(!f.stream);
        assert_eq!(f.n, 1);
        assert!(!f.logprobs);
    }

    #[test]
    fn duplicate_stream_last_wins() {
        assert!(ok(Route::Generate, r#"{"stream":false,"stream":true}"#).stream);
    }

    #[test]
    fn model_must_be_a_string() {
        assert_eq!(
            err(Route::Generate, r#"{"model":1}"#),
            "field `model` must be a string"
        );
    }

    #[test]
    fn stream_must_be_a_boolean() {
        assert_eq!(
            err(Route::ChatCompletions, r#"{"stream":"true"}"#),
            "field `stream` must be a boolean"
        );
        assert!(facts(Route::ChatCompletions, r#"{"stream":1}"#).is_err());
    }

    #[test]
    fn n_must_be_an_integer_from_1_to_1024() {
        for bad in ["0", "-1", "-0", "2.0", "\"2\"", "1025", "true", "1e2"] {
            let e = err(Route::ChatCompletions, &format!(r#"{{"n":{bad}}}"#));
            assert_eq!(
                e, "field `n` must be an integer between 1 and 1024",
                "{bad}"
            );
        }
        assert_eq!(ok(Route::ChatCompletions, r#"{"n":1024}"#).n, 1024);
        assert_eq!(ok(Route::ChatCompletions, r#"{"n":1}"#).n, 1);
    }

    #[test]
    fn generate_reads_n_from_its_sampling_params() {
        assert_eq!(ok(Route::Generate, r#"{"sampling_params":{"n":3}}"#).n, 3);
        assert_eq!(ok(Route::Generate, r#"{"n":3,"sampling_params":{}}"#).n, 1);
        assert_eq!(
            ok(Route::Generate, r#"{"sampling_params":{"n":null}}"#).n,
            1
        );
        assert_eq!(
            err(Route::Generate, r#"{"sampling_params":{"n":0}}"#),
            "field `sampling_params.n` must be an integer between 1 and 1024"
        );
    }

    #[test]
    fn decode_sequences_count_every_sample_of_every_prompt() {
        let seqs = |route, body| ok(route, body).decode_sequences(route);
        assert_eq!(seqs(Route::ChatCompletions, r#"{"n":4}"#), 4);
        assert_eq!(seqs(Route::ChatCompletions, "{}"), 1);
        assert_eq!(seqs(Route::Completions, r#"{"prompt":"a","n":3}"#), 3);
        assert_eq!(seqs(Route::Completions, r#"{"prompt":["a","b"],"n":3}"#), 6);
        assert_eq!(seqs(Route::Completions, r#"{"prompt":["a","b"]}"#), 2);
        assert_eq!(
            seqs(
                Route::Generate,
                r#"{"text":["a","b"],"sampling_params":{"n":2}}"#
            ),
            4
        );
        assert_eq!(seqs(Route::Generate, r#"{"input_ids":[[1],[2],[3]]}"#), 3);
        assert_eq!(seqs(Route::Messages, r#"{"n":5}"#), 1);
    }

    #[test]
    fn classify_refuses_a_body_of_the_wrong_shape_after_its_facts() {
        let classify_str = |route, body: &str| {
            let top = scan_object(body.as_bytes()).unwrap();
            classify(route, body.as_bytes(), &top).map_err(|e| e.to_string())
        };
        let e = classify_str(
            Route::ChatCompletions,
            r#"{"model":"m","messages":"not-a-list"}"#,
        )
        .unwrap_err();
        assert_eq!(
            e,
            "field `messages` must be a non-empty list of objects, each with a string `role`"
        );
        // A fact's own type error comes first.
        let e = classify_str(Route::ChatCompletions, r#"{"model":1,"messages":5}"#).unwrap_err();
        assert_eq!(e, "field `model` must be a string");
        let f = classify_str(
            Route::ChatCompletions,
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"n":2}"#,
        )
        .unwrap();
        assert_eq!((f.model.as_deref(), f.n, f.batch), (Some("m"), 2, Some(2)));
    }

    #[test]
    fn classify_error_maps_to_invalid_request() {
        let e = facts(Route::Generate, r#"{"model":[]}"#).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidRequest);
    }

    #[test]
    fn generate_input_ids_list_of_lists_is_a_batch() {
        let f = ok(Route::Generate, r#"{"input_ids":[[1,2],[3,4],[5,6]]}"#);
        assert_eq!(f.batch, Some(3));
    }

    #[test]
    fn generate_flat_input_ids_is_one_request() {
        assert_eq!(ok(Route::Generate, r#"{"input_ids":[1,2,3]}"#).batch, None);
        assert_eq!(ok(Route::Generate, r#"{"input_ids":[]}"#).batch, None);
    }

    #[test]
    fn generate_mixed_input_ids_is_rejected() {
        assert!(err(Route::Generate, r#"{"input_ids":[1,[2]]}"#).contains("input_ids"));
        assert!(err(Route::Generate, r#"{"input_ids":"12"}"#).contains("input_ids"));
    }

    #[test]
    fn generate_input_id_lists_hold_only_token_ids() {
        for bad in [r#"[[1],["a"]]"#, "[[1,2.5]]", "[[[1]]]", "[[null]]"] {
            let e = err(Route::Generate, &format!(r#"{{"input_ids":{bad}}}"#));
            assert!(e.starts_with("field `input_ids`"), "{bad}: {e}");
        }
        assert_eq!(
            ok(Route::Generate, r#"{"input_ids":[[1],[]]}"#).batch,
            Some(2)
        );
    }

    #[test]
    fn generate_text_list_is_a_batch_and_string_is_not() {
        assert_eq!(ok(Route::Generate, r#"{"text":["a","b"]}"#).batch, Some(2));
        assert_eq!(ok(Route::Generate, r#"{"text":["a"]}"#).batch, Some(1));
        assert_eq!(ok(Route::Generate, r#"{"text":"a"}"#).batch, None);
        assert_eq!(ok(Route::Generate, r#"{"text":[]}"#).batch, None);
        assert!(err(Route::Generate, r#"{"text":["a",1]}"#).contains("text"));
        assert!(err(Route::Generate, r#"{"text":5}"#).contains("text"));
    }

    #[test]
    fn generate_input_ids_wins_over_text() {
        let f = ok(Route::Generate, r#"{"input_ids":[[1]],"text":["a","b"]}"#);
        assert_eq!(f.batch, Some(1));
    }

    #[test]
    fn completions_prompt_array_is_a_batch_even_of_one() {
        assert_eq!(ok(Route::Completions, r#"{"prompt":["a"]}"#).batch, Some(1));
        assert_eq!(
            ok(Route::Completions, r#"{"prompt":["a","b"]}"#).batch,
            Some(2)
        );
        assert_eq!(
            ok(Route::Completions, r#"{"prompt":[[1,2],[3]]}"#).batch,
            Some(2)
        );
    }

    #[test]
    fn completions_flat_token_prompt_is_one_request() {
        assert_eq!(ok(Route::Completions, r#"{"prompt":[1,2,3]}"#).batch, None);
    }

    #[test]
    fn completions_single_prompt_with_n_gets_one_room() {
        let f = ok(Route::Completions, r#"{"prompt":"a","n":3}"#);
        assert_eq!(f.batch, None);
        assert_eq!(f.n, 3);
    }

    #[test]
    fn completions_bad_prompt_shapes_are_rejected() {
        for bad in [
            r#"["a",1]"#,
            r#"["a",[1]]"#,
            "5",
            "{}",
            "[null]",
            r#"[[1],["a"]]"#,
            "[[1.5]]",
            "[[[1]]]",
            "true",
        ] {
            let e = err(Route::Completions, &format!(r#"{{"prompt":{bad}}}"#));
            assert!(e.starts_with("field `prompt`"), "{bad}: {e}");
        }
    }

    #[test]
    fn chat_n_above_one_is_a_batch_of_n() {
        assert_eq!(ok(Route::ChatCompletions, r#"{"n":2}"#).batch, Some(2));
        assert_eq!(ok(Route::ChatCompletions, r#"{"n":1}"#).batch, None);
    }

    #[test]
    fn other_routes_are_never_batches() {
        for r in [
            Route::Messages,
            Route::Responses,
            Route::Rerank,
            Route::CountTokens,
        ] {
            let f = ok(r, r#"{"n":4,"prompt":["a","b"],"input_ids":[[1],[2]]}"#);
            assert_eq!(f.batch, None, "{r:?}");
        }
    }

    #[test]
    fn oversized_batches_are_rejected() {
        let body = format!(r#"{{"text":[{}"x"]}}"#, "\"x\",".repeat(MAX_BATCH));
        assert!(err(Route::Generate, &body).contains("at most 65536"));
        let body = format!(r#"{{"text":[{}"x"]}}"#, "\"x\",".repeat(MAX_BATCH - 1));
        assert_eq!(ok(Route::Generate, &body).batch, Some(MAX_BATCH));
    }

    #[test]
    fn logprobs_per_route() {
        assert!(ok(Route::Generate, r#"{"return_logprob":true}"#).logprobs);
        assert!(!ok(Route::Generate, r#"{"logprobs":true}"#).logprobs);
        assert!(err(Route::Generate, r#"{"return_logprob":1}"#).contains("return_logprob"));
        assert!(ok(Route::ChatCompletions, r#"{"logprobs":true}"#).logprobs);
        assert!(!ok(Route::ChatCompletions, r#"{"logprobs":false}"#).logprobs);
        assert!(err(Route::ChatCompletions, r#"{"logprobs":5}"#).contains("logprobs"));
        assert!(ok(Route::Completions, r#"{"logprobs":0}"#).logprobs);
        assert!(ok(Route::Completions, r#"{"logprobs":5}"#).logprobs);
        assert!(!ok(Route::Completions, r#"{"logprobs":false}"#).logprobs);
        assert!(!ok(Route::Completions, r#"{"logprobs":null}"#).logprobs);
        assert!(!ok(Route::Messages, r#"{"logprobs":true}"#).logprobs);
    }

    #[test]
    fn request_id_from_body_or_generate_rid() {
        assert_eq!(
            ok(Route::ChatCompletions, r#"{"request_id":"abc"}"#)
                .request_id
                .as_deref(),
            Some("abc")
        );
        assert!(err(Route::ChatCompletions, r#"{"request_id":7}"#).contains("request_id"));
        assert_eq!(
            ok(Route::Generate, r#"{"rid":"r1"}"#).request_id.as_deref(),
            Some("r1")
        );
        assert_eq!(ok(Route::Generate, r#"{"rid":["a","b"]}"#).request_id, None);
        assert_eq!(ok(Route::Completions, r#"{"rid":"r1"}"#).request_id, None);
    }

    #[test]
    fn cap_field_follows_the_route() {
        let chat = |b| ok(Route::ChatCompletions, b).max_tokens_field;
        assert_eq!(
            chat(r#"{"max_completion_tokens":5,"max_tokens":3}"#),
            Some("max_completion_tokens")
        );
        assert_eq!(chat(r#"{"max_tokens":3}"#), Some("max_tokens"));
        assert_eq!(chat(r#"{"max_completion_tokens":null}"#), None);
        assert_eq!(chat("{}"), None);
        assert_eq!(
            ok(Route::Responses, r#"{"max_output_tokens":5}"#).max_tokens_field,
            Some("max_output_tokens")
        );
        assert_eq!(
            ok(Route::Completions, r#"{"max_tokens":5}"#).max_tokens_field,
            Some("max_tokens")
        );
    }
}
