//! OpenAI `/v1/responses` → [`GenerationRequest`], for a minimal, non-stored response:
//! `instructions` becomes a first `system` message, `input` a user message (a string) or the
//! conversation (message items; `input_text` / `output_text` / `refusal` parts become text
//! parts, user content as a part list, other roles' content as one string). `text.format`
//! (`json_object`, `json_schema`) is the constraint.
//!
//! Refused: `previous_response_id`, `conversation` and `item_reference` items (they need stored
//! responses), `background`, `top_logprobs`, tool calling and function-call items, media
//! parts. `store` is accepted and nothing is stored.

use serde_json::{json, Value};

use super::chat::{thinking_from_effort, MEDIA_TYPES};
use super::fields::Reader;
use super::sampling;
use super::{ChatInput, Constraint, Feature, GenerationRequest, RequestError, SamplingParams};
use pdgate_filters::route::Route;

type Result<T> = std::result::Result<T, RequestError>;

pub(super) fn convert(r: &Reader<'_>) -> Result<GenerationRequest> {
    for (key, feature) in [
        ("previous_response_id", Feature::StoredResponses),
        ("conversation", Feature::StoredResponses),
        ("background", Feature::BackgroundResponses),
    ] {
        r.refuse(key, feature)?;
    }
    if r.u32("top_logprobs")?.is_some_and(|n| n > 0) {
        return Err(RequestError::unsupported(
            Feature::ResponsesLogprobs,
            "top_logprobs",
        ));
    }
    let (tools, tool_choice) = r.template_tools(|choice| choice == "none")?;

    let mut messages = Vec::new();
    if let Some(instructions) = r.string("instructions")? {
        messages.push(json!({"role": "system", "content": instructions}));
    }
    match r.optional::<Value>("input", "a string or a list of input items")? {
        Some(Value::String(text)) => messages.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) if !items.is_empty() => {
            for (i, item) in items.iter().enumerate() {
                messages.push(convert_item(i, item)?);
            }
        }
        _ => {
            return Err(RequestError::field(
                "input",
                "a string or a non-empty list of input items",
            ))
        }
    }

    let thinking = r
        .object("reasoning", "reasoning.")?
        .and_then(|reasoning| thinking_from_effort(reasoning.raw("effort")));

    let sampling = SamplingParams {
        temperature: r.f32("temperature")?,
        top_p: r.f32("top_p")?,
        top_k: r.i32("top_k")?,
        min_p: r.f32("min_p")?,
        frequency_penalty: r.f32("frequency_penalty")?,
        presence_penalty: r.f32("presence_penalty")?,
        repetition_penalty: r.f32("repetition_penalty")?,
        max_new_tokens: r.count("max_output_tokens")?,
        constraint: text_format(r)?,
        ..SamplingParams::default()
    };

    let input = ChatInput {
        messages,
        tools,
        tool_choice,
        chat_template_kwargs: None,
        add_generation_prompt: true,
        continue_final_message: false,
        thinking,
        media: Vec::new(),
    };
    Ok(GenerationRequest::conversation(
        Route::Responses,
        r.string("model")?,
        input,
        sampling,
        r.flag("stream")?,
    ))
}

/// One input item → one chat message.
fn convert_item(i: usize, item: &Value) -> Result<Value> {
    let field = || format!("input[{i}]");
    match item.get("type").and_then(Value::as_str) {
        None | Some("message") => {}
        Some("function_call") | Some("function_call_output") => {
            return Err(RequestError::unsupported(Feature::ToolCalling, field()))
        }
        Some("item_reference") => {
            return Err(RequestError::unsupported(Feature::StoredResponses, field()))
        }
        Some(_) => return Err(RequestError::unsupported(Feature::ContentType, field())),
    }
    let role = match item.get("role").and_then(Value::as_str) {
        Some(role @ ("user" | "assistant" | "system" | "developer")) => role,
        _ => {
            return Err(RequestError::field(
                format!("input[{i}].role"),
                "one of `user`, `assistant`, `system`, `developer`",
            ))
        }
    };
    let parts = match item.get("content") {
        Some(Value::String(text)) => return Ok(json!({"role": role, "content": text})),
        Some(Value::Array(parts)) => parts,
        _ => {
            return Err(RequestError::field(
                format!("input[{i}].content"),
                "a string or a list of content parts",
            ))
        }
    };
    let mut texts = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let part_field = || format!("input[{i}].content[{j}]");
        let key = match part.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text" | "text") => "text",
            Some("refusal") => "refusal",
            Some(t) if MEDIA_TYPES.contains(&t) => {
                return Err(RequestError::unsupported(Feature::Multimodal, part_field()))
            }
            Some(_) => {
                return Err(RequestError::unsupported(
                    Feature::ContentType,
                    part_field(),
                ))
            }
            None => {
                return Err(RequestError::field(
                    part_field(),
                    "an object with a string `type`",
                ))
            }
        };
        let text = part.get(key).and_then(Value::as_str).ok_or_else(|| {
            RequestError::field(format!("input[{i}].content[{j}].{key}"), "a string")
        })?;
        texts.push(text);
    }
    if role == "user" {
        let parts: Vec<Value> = texts
            .iter()
            .map(|t| json!({"type": "text", "text": t}))
            .collect();
        Ok(json!({"role": role, "content": parts}))
    } else {
        Ok(json!({"role": role, "content": texts.concat()}))
    }
}

/// `text.format`: `text` (none), `json_object`, or `json_schema` with its `schema` (flat, not
/// nested as in chat).
fn text_format(r: &Reader<'_>) -> Result<Option<Constraint>> {
    const TYPES: &str = "one of `text`, `json_object`, `json_schema`";
    let Some(text) = r.object("text", "text.")? else {
        return Ok(None);
    };
    let Some(format) = text.object("format", "text.format.")? else {
        return Ok(None);
    };
    Ok(match sampling::format_type(&format, TYPES)?.as_str() {
        "text" => None,
        "json_object" => Some(Constraint::JsonObject),
        "json_schema" => sampling::schema_constraint(&format, "text.format.schema.")?,
        _ => return Err(RequestError::field(format.name("type"), TYPES)),
    })
}
