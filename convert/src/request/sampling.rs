//! The sampling fields the routes share: the ones spelled the same on chat, completions and
//! `/generate`'s `sampling_params`, the OpenAI-route extras, and the OpenAI `response_format`.

use pdgate_filters::classify::MAX_N;

use super::fields::Reader;
use super::{Constraint, Feature, RequestError, SamplingParams};

type Result<T> = std::result::Result<T, RequestError>;

/// vLLM's guided-decoding fields: refused rather than dropped (a silently unconstrained output
/// is worse than a 400).
const GUIDED: [&str; 6] = [
    "guided_json",
    "guided_regex",
    "guided_grammar",
    "guided_choice",
    "guided_decoding_backend",
    "structured_outputs",
];

/// SGLang extensions every route with SGLang's fields may carry, none served yet.
pub(super) fn refuse_engine_extras(r: &Reader<'_>) -> Result<()> {
    for (key, feature) in [
        ("return_hidden_states", Feature::HiddenStates),
        ("lora_path", Feature::Lora),
        ("lora_id", Feature::Lora),
        ("session_params", Feature::SessionParams),
        ("custom_logit_processor", Feature::CustomLogitProcessor),
    ] {
        r.refuse(key, feature)?;
    }
    Ok(())
}

/// The fields spelled the same on every route that has them (chat, completions, and the
/// members of `/generate`'s `sampling_params`).
pub(super) fn shared(r: &Reader<'_>) -> Result<SamplingParams> {
    let n = match r.u32("n")? {
        None => 1,
        Some(n) if (1..=MAX_N).contains(&u64::from(n)) => n,
        Some(_) => {
            return Err(RequestError::field(
                r.name("n"),
                "an integer between 1 and 1024",
            ))
        }
    };
    Ok(SamplingParams {
        temperature: r.f32("temperature")?,
        top_p: r.f32("top_p")?,
        top_k: r.i32("top_k")?,
        min_p: r.f32("min_p")?,
        frequency_penalty: r.f32("frequency_penalty")?,
        presence_penalty: r.f32("presence_penalty")?,
        repetition_penalty: r.f32("repetition_penalty")?,
        max_new_tokens: None,
        min_new_tokens: 0,
        stop: r.stop_strings("stop")?,
        stop_token_ids: r.token_ids("stop_token_ids")?,
        ignore_eos: r.flag("ignore_eos")?,
        n,
        seed: None,
        skip_special_tokens: r.bool("skip_special_tokens")?.unwrap_or(true),
        spaces_between_special_tokens: r.bool("spaces_between_special_tokens")?.unwrap_or(true),
        no_stop_trim: r.flag("no_stop_trim")?,
        constraint: None,
        logit_bias: r.logit_bias("logit_bias")?,
    })
}

/// Chat and completions: [`shared`] plus the output cap, `min_tokens`, the seed, vLLM's
/// `include_stop_str_in_output`, and the refusals common to both.
pub(super) fn openai(r: &Reader<'_>, max_new_tokens: Option<u32>) -> Result<SamplingParams> {
    for key in GUIDED {
        r.refuse(key, Feature::GuidedDecoding)?;
    }
    r.refuse("use_beam_search", Feature::BeamSearch)?;
    refuse_engine_extras(r)?;
    let mut sampling = shared(r)?;
    sampling.max_new_tokens = max_new_tokens;
    sampling.min_new_tokens = match r.count("min_tokens")? {
        Some(n) => n,
        None => r.count("min_completion_tokens")?.unwrap_or(0),
    };
    sampling.seed = match r.i64("seed")? {
        Some(seed) => Some(seed),
        None => sampling_seed(r)?,
    };
    sampling.no_stop_trim |= r.flag("include_stop_str_in_output")?;
    Ok(sampling)
}

/// SGLang's `sampling_seed`: a non-negative integer (below 2^63).
pub(super) fn sampling_seed(r: &Reader<'_>) -> Result<Option<i64>> {
    match r.i64("sampling_seed") {
        Ok(Some(seed)) if seed >= 0 => Ok(Some(seed)),
        Ok(None) => Ok(None),
        _ => Err(RequestError::field(
            r.name("sampling_seed"),
            "a non-negative integer below 2^63",
        )),
    }
}

/// `stream_options`: `include_usage`; vLLM's `continuous_usage_stats` is refused. Like OpenAI
/// and SMG, the options need `stream: true`.
pub(super) fn include_usage(r: &Reader<'_>, stream: bool) -> Result<bool> {
    let Some(options) = r.object("stream_options", "stream_options.")? else {
        return Ok(false);
    };
    if !stream {
        return Err(RequestError::InvalidParameters(
            "`stream_options` is only allowed when `stream` is true".into(),
        ));
    }
    options.refuse("continuous_usage_stats", Feature::ContinuousUsageStats)?;
    options.flag("include_usage")
}

/// OpenAI `response_format` (chat; vLLM completions): `text` (none), `json_object`,
/// `json_schema` (its `json_schema.schema` as JSON text; without a schema, any JSON object),
/// SGLang's `structural_tag` (the whole format object as JSON text).
pub(super) fn response_format(r: &Reader<'_>) -> Result<Option<Constraint>> {
    const TYPES: &str = "one of `text`, `json_object`, `json_schema`, `structural_tag`";
    let Some(format) = r.object("response_format", "response_format.")? else {
        return Ok(None);
    };
    Ok(match format_type(&format, TYPES)?.as_str() {
        "text" => None,
        "json_object" => Some(Constraint::JsonObject),
        "json_schema" => {
            let spec = format
                .object("json_schema", "response_format.json_schema.")?
                .ok_or_else(|| RequestError::field(format.name("json_schema"), "an object"))?;
            schema_constraint(&spec, "response_format.json_schema.schema.")?
        }
        "structural_tag" => r
            .json_text("response_format")
            .map(Constraint::StructuralTag),
        _ => return Err(RequestError::field(format.name("type"), TYPES)),
    })
}

/// The `type` of an output format object.
pub(super) fn format_type(format: &Reader<'_>, types: &'static str) -> Result<String> {
    format
        .string("type")?
        .ok_or_else(|| RequestError::field(format.name("type"), types))
}

/// A JSON-schema format's constraint: its `schema` object as JSON text, or any JSON object
/// when it has no schema.
pub(super) fn schema_constraint(
    spec: &Reader<'_>,
    prefix: &'static str,
) -> Result<Option<Constraint>> {
    Ok(match spec.object("schema", prefix)? {
        Some(_) => spec.json_text("schema").map(Constraint::JsonSchema),
        None => Some(Constraint::JsonObject),
    })
}

/// A constraint given as a string field: the field and how its text becomes the constraint.
pub(super) type StringConstraint = (&'static str, fn(String) -> Constraint);

/// The constraints spelled as top-level strings: `regex`, `ebnf`, and (SGLang completions,
/// `/generate`) `json_schema` as schema text.
pub(super) fn string_constraints(
    r: &Reader<'_>,
    keys: &[StringConstraint],
    found: &mut Vec<(&'static str, Constraint)>,
) -> Result<()> {
    for (key, make) in keys {
        if let Some(text) = r.string(key)? {
            found.push((key, make(text)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::fields::with;
    use super::*;

    #[test]
    fn response_formats() {
        let rf = |body: &str| with(body, response_format);
        assert_eq!(rf(r#"{"response_format":{"type":"text"}}"#), Ok(None));
        assert_eq!(
            rf(r#"{"response_format":{"type":"json_object"}}"#),
            Ok(Some(Constraint::JsonObject))
        );
        assert_eq!(
            rf(
                r#"{"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"integer"}}}}"#
            ),
            Ok(Some(Constraint::JsonSchema(r#"{"type":"integer"}"#.into())))
        );
        assert_eq!(
            rf(r#"{"response_format":{"type":"json_schema","json_schema":{"name":"x"}}}"#),
            Ok(Some(Constraint::JsonObject))
        );
        let tag = r#"{"type":"structural_tag","structures":[],"triggers":[]}"#;
        assert_eq!(
            rf(&format!(r#"{{"response_format":{tag}}}"#)),
            Ok(Some(Constraint::StructuralTag(tag.into())))
        );
        for bad in [
            r#"{"response_format":"json"}"#,
            r#"{"response_format":{}}"#,
            r#"{"response_format":{"type":"yaml"}}"#,
            r#"{"response_format":{"type":"json_schema"}}"#,
            r#"{"response_format":{"type":"json_schema","json_schema":{"schema":true}}}"#,
        ] {
            assert!(rf(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn seeds_take_seed_then_sampling_seed() {
        let seed = |body: &str| with(body, |r| openai(r, None).map(|s| s.seed));
        assert_eq!(seed(r#"{"seed":-3}"#), Ok(Some(-3)));
        assert_eq!(seed(r#"{"seed":1,"sampling_seed":2}"#), Ok(Some(1)));
        assert_eq!(seed(r#"{"sampling_seed":2}"#), Ok(Some(2)));
        assert_eq!(
            seed(r#"{"sampling_seed":9000000000}"#),
            Ok(Some(9_000_000_000))
        );
        assert!(seed(r#"{"sampling_seed":-1}"#).is_err());
        assert!(seed(r#"{"seed":1.5}"#).is_err());
        assert_eq!(seed("{}"), Ok(None));
    }

    #[test]
    fn stream_options_need_a_stream() {
        let usage = |body: &str, stream| with(body, |r| include_usage(r, stream));
        assert_eq!(
            usage(r#"{"stream_options":{"include_usage":true}}"#, true),
            Ok(true)
        );
        assert_eq!(usage(r#"{"stream_options":{}}"#, true), Ok(false));
        assert_eq!(usage("{}", false), Ok(false));
        let e = usage(r#"{"stream_options":{"include_usage":true}}"#, false).unwrap_err();
        assert_eq!(
            e.code(),
            pdgate_filters::errors::ErrorCode::InvalidRequestParameters
        );
        let e = usage(
            r#"{"stream_options":{"continuous_usage_stats":true}}"#,
            true,
        )
        .unwrap_err();
        assert!(matches!(e, RequestError::Unsupported(_)));
    }
}
