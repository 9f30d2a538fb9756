//! `/v1/chat/completions` → [`GenerationRequest`]: the messages go to the template as sent;
//! content parts must be text or images (`image_url`, taken out as [`MediaRef`]s); other
//! media is [`Feature::Multimodal`].

use serde_json::{Map, Value};

use super::fields::Reader;
use super::media::{self, MediaRef};
use super::sampling;
use super::{
    single_constraint, ChatInput, Constraint, Feature, GenerationRequest, Input, LogprobRequest,
    RequestError,
};
use pdgate_filters::route::Route;

type Result<T> = std::result::Result<T, RequestError>;

/// Content part and block types that carry media.
pub(super) const MEDIA_TYPES: [&str; 12] = [
    "image_url",
    "image",
    "input_image",
    "input_audio",
    "audio_url",
    "audio",
    "video_url",
    "video",
    "file",
    "input_file",
    "document",
    "image_file",
];

pub(super) fn convert(r: &Reader<'_>) -> Result<GenerationRequest> {
    refuse_output_modalities(r)?;
    r.refuse("echo", Feature::ChatEcho)?;

    let mut messages: Vec<Value> = r.deserialize("messages", "a non-empty list of messages")?;
    let media = take_content_parts(&mut messages)?;
    let (tools, tool_choice) = tools(r)?;

    let stream = r.flag("stream")?;
    let include_usage = sampling::include_usage(r, stream)?;
    let logprobs = logprobs(r)?;
    let cap = match r.count("max_completion_tokens")? {
        Some(cap) => Some(cap),
        None => r.count("max_tokens")?,
    };
    let mut sampling = sampling::openai(r, cap)?;
    let mut constraints = Vec::new();
    if let Some(c) = sampling::response_format(r)? {
        constraints.push(("response_format", c));
    }
    sampling::string_constraints(
        r,
        &[("regex", Constraint::Regex), ("ebnf", Constraint::Ebnf)],
        &mut constraints,
    )?;
    sampling.constraint = single_constraint(constraints)?;

    let add_generation_prompt = r.bool("add_generation_prompt")?.unwrap_or(true);
    let continue_final_message = r.flag("continue_final_message")?;
    if add_generation_prompt && continue_final_message && r.has("add_generation_prompt") {
        return Err(RequestError::InvalidParameters(
            "`continue_final_message` and `add_generation_prompt` cannot both be true".into(),
        ));
    }

    Ok(GenerationRequest {
        route: Route::ChatCompletions,
        model: r.string("model")?,
        request_id: request_id(r)?,
        item_request_ids: Vec::new(),
        input: Input::Chat(Box::new(ChatInput {
            messages,
            tools,
            tool_choice,
            chat_template_kwargs: r
                .optional::<Map<String, Value>>("chat_template_kwargs", "an object")?,
            // Continuing the final message opens no new turn (vLLM's default in that case).
            add_generation_prompt: add_generation_prompt && !continue_final_message,
            continue_final_message,
            thinking: thinking_from_effort(r.raw("reasoning_effort")),
            media,
        })),
        sampling,
        logprobs,
        stream,
        include_usage,
        echo: false,
        suffix: None,
    })
}

/// `rid` (SGLang), else `request_id` (vLLM).
pub(super) fn request_id(r: &Reader<'_>) -> Result<Option<String>> {
    match r.string("rid")? {
        Some(rid) => Ok(Some(rid)),
        None => r.string("request_id"),
    }
}

/// `logprobs: true` with `top_logprobs` alternatives; `top_logprobs` alone is a 400 (OpenAI,
/// vLLM and SMG all refuse it).
fn logprobs(r: &Reader<'_>) -> Result<Option<LogprobRequest>> {
    let wanted = r.flag("logprobs")?;
    let top = r.u32("top_logprobs")?;
    if top.is_some_and(|t| t > 0) && !wanted {
        return Err(RequestError::InvalidParameters(
            "`top_logprobs` is only allowed when `logprobs` is true".into(),
        ));
    }
    Ok(wanted.then(|| LogprobRequest {
        top_logprobs: top.unwrap_or(0),
        ..LogprobRequest::default()
    }))
}

/// SMG's reading of `reasoning_effort`: `none` and `minimal` turn thinking off; the levels
/// leave the template's default.
pub(super) fn thinking_from_effort(raw: Option<&[u8]>) -> Option<bool> {
    match raw {
        Some(br#""none""#) | Some(br#""minimal""#) => Some(false),
        _ => None,
    }
}

/// Audio output (`modalities` with `audio`, or an `audio` config) needs a speech decoder.
fn refuse_output_modalities(r: &Reader<'_>) -> Result<()> {
    if let Some(modalities) =
        r.optional::<Vec<String>>("modalities", "a list of output modalities")?
    {
        if modalities.iter().any(|m| m != "text") {
            return Err(RequestError::unsupported(
                Feature::AudioOutput,
                r.name("modalities"),
            ));
        }
    }
    r.refuse("audio", Feature::AudioOutput)
}

/// [`Reader::template_tools`] with OpenAI's `tool_choice: "none"`, plus the legacy
/// `functions` / `function_call` and the 400 for a forced call without tools.
fn tools(r: &Reader<'_>) -> Result<(Option<Value>, Option<Value>)> {
    let (tools, tool_choice) = r.template_tools(|choice| choice == "none")?;
    let functions: Option<Vec<Value>> = r.optional("functions", "a list of functions")?;
    let function_call_none = r.raw("function_call") == Some(br#""none""#);
    if functions.is_some_and(|f| !f.is_empty()) && !function_call_none {
        return Err(RequestError::unsupported(
            Feature::ToolCalling,
            r.name("functions"),
        ));
    }
    let forces_a_call = tool_choice
        .as_ref()
        .is_some_and(|c| c == "required" || c.is_object());
    if forces_a_call && tools.is_none() {
        return Err(RequestError::InvalidParameters(
            "`tool_choice` other than `none` or `auto` is only allowed when `tools` are given"
                .into(),
        ));
    }
    Ok((tools, tool_choice))
}

/// Every list content must be text or image parts: images are taken out in prompt order and
/// replaced by the template's image part; other media parts are [`Feature::Multimodal`],
/// unknown ones [`Feature::ContentType`].
fn take_content_parts(messages: &mut [Value]) -> Result<Vec<MediaRef>> {
    let mut media = Vec::new();
    for (i, message) in messages.iter_mut().enumerate() {
        let Some(Value::Array(parts)) = message.get_mut("content") else {
            continue;
        };
        for (j, part) in parts.iter_mut().enumerate() {
            let field = || format!("messages[{i}].content[{j}]");
            match part.get("type").and_then(Value::as_str) {
                Some("text") => {}
                Some("image_url") => {
                    media.push(media::openai_image(part, &field())?);
                    *part = media::template_part();
                }
                Some(t) if MEDIA_TYPES.contains(&t) => {
                    return Err(RequestError::unsupported(Feature::Multimodal, field()))
                }
                Some(_) => return Err(RequestError::unsupported(Feature::ContentType, field())),
                None => {
                    return Err(RequestError::field(
                        field(),
                        "an object with a string `type`",
                    ))
                }
            }
        }
    }
    Ok(media)
}
