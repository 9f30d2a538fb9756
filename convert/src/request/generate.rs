//! SGLang `/generate` → [`GenerationRequest`]: `input_ids` (one id list, or a list of them: a
//! batch) win over `text` (a string, or a list: a batch); the sampling fields live in
//! `sampling_params`, the logprob switches at the top level.

use super::fields::Reader;
use super::sampling;
use super::{
    single_constraint, Constraint, Feature, GenerationRequest, Input, LogprobRequest, Prompt,
    RequestError, SamplingParams,
};
use pdgate_filters::route::Route;
use pdgate_filters::value::{self, Kind};

type Result<T> = std::result::Result<T, RequestError>;

/// SGLang's media fields.
const MEDIA: [&str; 3] = ["image_data", "audio_data", "video_data"];

pub(super) fn convert(r: &Reader<'_>) -> Result<GenerationRequest> {
    for key in MEDIA {
        r.refuse(key, Feature::Multimodal)?;
    }
    r.refuse("input_embeds", Feature::PromptEmbeddings)?;
    r.refuse("token_ids_logprob", Feature::TokenIdLogprobs)?;
    sampling::refuse_engine_extras(r)?;
    let (prompts, batch) = prompts(r)?;
    let sampling = match r.object("sampling_params", "sampling_params.")? {
        Some(sp) => sampling_params(&sp)?,
        None => SamplingParams::default(),
    };

    let (request_id, item_request_ids) = rids(r, batch.then_some(prompts.len()))?;
    let logprobs = if r.flag("return_logprob")? {
        Some(LogprobRequest {
            top_logprobs: r.u32("top_logprobs_num")?.unwrap_or(0),
            token_text: r.flag("return_text_in_logprobs")?,
            start_len: r.i64("logprob_start_len")?,
        })
    } else {
        None
    };

    Ok(GenerationRequest {
        route: Route::Generate,
        model: r.string("model")?,
        request_id,
        item_request_ids,
        input: Input::Prompts { prompts, batch },
        sampling,
        logprobs,
        stream: r.flag("stream")?,
        include_usage: false,
        echo: false,
        suffix: None,
    })
}

fn sampling_params(sp: &Reader<'_>) -> Result<SamplingParams> {
    let mut sampling = sampling::shared(sp)?;
    sampling.max_new_tokens = sp.count("max_new_tokens")?;
    sampling.min_new_tokens = sp.count("min_new_tokens")?.unwrap_or(0);
    sampling.seed = sampling::sampling_seed(sp)?;
    let mut constraints = Vec::new();
    sampling::string_constraints(
        sp,
        &[
            ("json_schema", Constraint::JsonSchema),
            ("regex", Constraint::Regex),
            ("ebnf", Constraint::Ebnf),
            ("structural_tag", Constraint::StructuralTag),
        ],
        &mut constraints,
    )?;
    sampling.constraint = single_constraint(constraints)?;
    Ok(sampling)
}

/// The prompts, and whether the client sent a batch.
fn prompts(r: &Reader<'_>) -> Result<(Vec<Prompt>, bool)> {
    if let Some(raw) = r.raw("input_ids") {
        const EXPECTED: &str = "a list of token ids or a non-empty list of token-id lists";
        let shape = value::array_shape(raw)
            .ok_or_else(|| RequestError::field(r.name("input_ids"), EXPECTED))?;
        if shape.len > 0 && shape.all(Kind::Array) {
            let lists: Vec<Vec<u32>> = r.deserialize("input_ids", EXPECTED)?;
            return Ok((lists.into_iter().map(Prompt::TokenIds).collect(), true));
        }
        let ids: Vec<u32> = r.deserialize("input_ids", EXPECTED)?;
        return Ok((vec![Prompt::TokenIds(ids)], false));
    }
    const EXPECTED: &str = "a string or a non-empty list of strings";
    let raw = r
        .raw("text")
        .ok_or_else(|| RequestError::field(r.name("text"), EXPECTED))?;
    match value::kind(raw) {
        Some(Kind::String) => Ok((
            vec![Prompt::Text(r.string("text")?.unwrap_or_default())],
            false,
        )),
        _ => {
            let texts: Vec<String> = r.deserialize("text", EXPECTED)?;
            if texts.is_empty() {
                return Err(RequestError::field(r.name("text"), EXPECTED));
            }
            Ok((texts.into_iter().map(Prompt::Text).collect(), true))
        }
    }
}

/// `rid`: a string (the request's id), or for a batch a list with one id per item.
fn rids(r: &Reader<'_>, batch: Option<usize>) -> Result<(Option<String>, Vec<String>)> {
    const EXPECTED: &str = "a string, or for a batch a list of one string per item";
    match r.raw("rid").and_then(value::kind) {
        None => Ok((None, Vec::new())),
        Some(Kind::String) => Ok((r.string("rid")?, Vec::new())),
        Some(_) => {
            let ids: Vec<String> = r.deserialize("rid", EXPECTED)?;
            if Some(ids.len()) != batch {
                return Err(RequestError::field(r.name("rid"), EXPECTED));
            }
            Ok((None, ids))
        }
    }
}
