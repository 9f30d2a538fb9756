//! `/v1/completions` → [`GenerationRequest`]: `prompt` as one text, a list of texts, one
//! token-id list or a list of them (a list is a batch, even of one; a flat id list is one
//! prompt, as `classify` counts it); `max_tokens` defaults to 16 as in OpenAI, vLLM and SGLang.

use super::chat::request_id;
use super::fields::Reader;
use super::sampling;
use super::{
    single_constraint, Constraint, Feature, GenerationRequest, Input, LogprobRequest, Prompt,
    RequestError,
};
use pdgate_filters::route::Route;
use pdgate_filters::value::{self, Kind};

type Result<T> = std::result::Result<T, RequestError>;

/// OpenAI's default output cap for completions.
pub const DEFAULT_MAX_TOKENS: u32 = 16;

pub(super) fn convert(r: &Reader<'_>) -> Result<GenerationRequest> {
    r.refuse("prompt_embeds", Feature::PromptEmbeddings)?;
    let (prompts, batch) = prompts(r)?;

    let stream = r.flag("stream")?;
    let include_usage = sampling::include_usage(r, stream)?;
    let cap = r.count("max_tokens")?.unwrap_or(DEFAULT_MAX_TOKENS);
    let mut sampling = sampling::openai(r, Some(cap))?;
    if let Some(best_of) = r.u32("best_of")? {
        if best_of > sampling.n {
            return Err(RequestError::unsupported(
                Feature::BestOf,
                r.name("best_of"),
            ));
        }
    }
    let mut constraints = Vec::new();
    if let Some(c) = sampling::response_format(r)? {
        constraints.push(("response_format", c));
    }
    sampling::string_constraints(
        r,
        &[
            ("json_schema", Constraint::JsonSchema),
            ("regex", Constraint::Regex),
            ("ebnf", Constraint::Ebnf),
        ],
        &mut constraints,
    )?;
    sampling.constraint = single_constraint(constraints)?;

    // `logprobs` is the number of alternatives (0 still asks for the chosen tokens' logprobs).
    let logprobs = match r.raw("logprobs") {
        None | Some(b"false") => None,
        Some(_) => Some(LogprobRequest {
            top_logprobs: r.u32("logprobs")?.unwrap_or(0),
            ..LogprobRequest::default()
        }),
    };

    Ok(GenerationRequest {
        route: Route::Completions,
        model: r.string("model")?,
        request_id: request_id(r)?,
        item_request_ids: Vec::new(),
        input: Input::Prompts { prompts, batch },
        sampling,
        logprobs,
        stream,
        include_usage,
        echo: r.flag("echo")?,
        suffix: r.string("suffix")?,
    })
}

/// The prompts, and whether the client sent a list of them.
fn prompts(r: &Reader<'_>) -> Result<(Vec<Prompt>, bool)> {
    const EXPECTED: &str =
        "a string, a non-empty list of strings, a list of token ids, or a non-empty list of token-id lists";
    let raw = r
        .raw("prompt")
        .ok_or_else(|| RequestError::field(r.name("prompt"), EXPECTED))?;
    match value::kind(raw) {
        Some(Kind::String) => Ok((
            vec![Prompt::Text(r.string("prompt")?.unwrap_or_default())],
            false,
        )),
        Some(Kind::Array) => {
            let shape = value::array_shape(raw)
                .ok_or_else(|| RequestError::field(r.name("prompt"), EXPECTED))?;
            if shape.len == 0 {
                return Err(RequestError::field(r.name("prompt"), EXPECTED));
            }
            if shape.all(Kind::Integer) {
                let ids: Vec<u32> = r.deserialize("prompt", EXPECTED)?;
                return Ok((vec![Prompt::TokenIds(ids)], false));
            }
            if shape.all(Kind::String) {
                let texts: Vec<String> = r.deserialize("prompt", EXPECTED)?;
                return Ok((texts.into_iter().map(Prompt::Text).collect(), true));
            }
            let lists: Vec<Vec<u32>> = r.deserialize("prompt", EXPECTED)?;
            Ok((lists.into_iter().map(Prompt::TokenIds).collect(), true))
        }
        _ => Err(RequestError::field(r.name("prompt"), EXPECTED)),
    }
}
