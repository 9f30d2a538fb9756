//! Anthropic `/v1/messages` → [`GenerationRequest`]: `system` and the content blocks become
//! the OpenAI message shape a chat template expects (SMG's conversion, with tool results
//! placed before the user's text so they follow the assistant's tool calls):
//!
//! * `system` (a string, or text blocks joined with `\n`) → a first `system` message;
//! * user `text` blocks → `{"type":"text","text"}` parts; `tool_result` blocks → `tool`
//!   messages (`tool_call_id`, text content joined with `\n`);
//! * assistant `text` blocks → `content` (joined; `null` without text), `tool_use` →
//!   `tool_calls` (`arguments` as JSON text), `thinking` → `reasoning_content`;
//!   `redacted_thinking` is dropped (opaque to a template);
//! * user `image` blocks → `{"type":"image"}` parts, their sources taken out as
//!   [`MediaRef`]s in prompt order; `document` (and images inside tool results) →
//!   [`Feature::Multimodal`]; other block types (server tools, search results, …) →
//!   [`Feature::ContentType`].

use serde_json::{json, Map, Value};

use super::chat::MEDIA_TYPES;
use super::fields::Reader;
use super::media::{self, MediaRef};
use super::{ChatInput, Feature, GenerationRequest, RequestError, SamplingParams};
use pdgate_filters::route::Route;
use pdgate_filters::value::{self, Kind};

type Result<T> = std::result::Result<T, RequestError>;

pub(super) fn convert(r: &Reader<'_>) -> Result<GenerationRequest> {
    let (tools, tool_choice) = r.template_tools(|choice| choice["type"] == "none")?;

    let mut messages = Vec::new();
    if let Some(system) = system_text(r)? {
        messages.push(json!({"role": "system", "content": system}));
    }
    let input: Vec<Value> = r.deserialize("messages", "a non-empty list of messages")?;
    let mut media = Vec::new();
    for (i, message) in input.iter().enumerate() {
        convert_message(i, message, &mut messages, &mut media)?;
    }

    let thinking = match r
        .object("thinking", "thinking.")?
        .map(|t| t.string("type"))
        .transpose()?
        .flatten()
        .as_deref()
    {
        Some("enabled") | Some("adaptive") => Some(true),
        Some("disabled") => Some(false),
        _ => None,
    };

    let sampling = SamplingParams {
        temperature: r.f32("temperature")?,
        top_p: r.f32("top_p")?,
        top_k: r.i32("top_k")?,
        max_new_tokens: r.count("max_tokens")?,
        stop: stop_sequences(r)?,
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
        media,
    };
    Ok(GenerationRequest::conversation(
        Route::Messages,
        r.string("model")?,
        input,
        sampling,
        r.flag("stream")?,
    ))
}

/// `stop_sequences`: a list of non-empty strings (Anthropic takes no single string).
fn stop_sequences(r: &Reader<'_>) -> Result<Vec<String>> {
    if r.raw("stop_sequences").and_then(value::kind) == Some(Kind::String) {
        return Err(RequestError::field(
            "stop_sequences",
            "a list of non-empty strings",
        ));
    }
    r.stop_strings("stop_sequences")
}

/// `system`: a string, or text blocks joined with `\n`.
fn system_text(r: &Reader<'_>) -> Result<Option<String>> {
    const EXPECTED: &str = "a string or a list of text blocks";
    let Some(system) = r.optional::<Value>("system", EXPECTED)? else {
        return Ok(None);
    };
    match system {
        Value::String(s) => Ok(Some(s)),
        Value::Array(blocks) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for block in &blocks {
                match (block.get("type"), block.get("text").and_then(Value::as_str)) {
                    (Some(t), Some(text)) if t == "text" => texts.push(text),
                    _ => return Err(RequestError::field("system", EXPECTED)),
                }
            }
            Ok(Some(texts.join("\n")))
        }
        _ => Err(RequestError::field("system", EXPECTED)),
    }
}

fn convert_message(
    i: usize,
    message: &Value,
    out: &mut Vec<Value>,
    media: &mut Vec<MediaRef>,
) -> Result<()> {
    let role = match message.get("role").and_then(Value::as_str) {
        Some(role @ ("user" | "assistant" | "system")) => role,
        _ => {
            return Err(RequestError::field(
                format!("messages[{i}].role"),
                "`user` or `assistant`",
            ))
        }
    };
    let content = message.get("content").unwrap_or(&Value::Null);
    let blocks = match content {
        Value::String(text) => {
            out.push(json!({"role": role, "content": text}));
            return Ok(());
        }
        Value::Array(blocks) => blocks,
        _ => {
            return Err(RequestError::field(
                format!("messages[{i}].content"),
                "a string or a list of content blocks",
            ))
        }
    };
    let block_type = |j: usize, block: &Value| -> Result<String> {
        let t = block.get("type").and_then(Value::as_str).ok_or_else(|| {
            RequestError::field(
                format!("messages[{i}].content[{j}]"),
                "an object with a string `type`",
            )
        })?;
        if MEDIA_TYPES.contains(&t) && !(t == "image" && role == "user") {
            return Err(RequestError::unsupported(
                Feature::Multimodal,
                format!("messages[{i}].content[{j}]"),
            ));
        }
        Ok(t.to_string())
    };
    let text_of = |j: usize, block: &Value, key: &str| -> Result<String> {
        block
            .get(key)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| {
                RequestError::field(format!("messages[{i}].content[{j}].{key}"), "a string")
            })
    };
    let unknown = |j: usize| {
        RequestError::unsupported(Feature::ContentType, format!("messages[{i}].content[{j}]"))
    };

    if role == "assistant" {
        let mut text = String::new();
        let mut has_text = false;
        let mut tool_calls = Vec::new();
        let mut thinking = Vec::new();
        for (j, block) in blocks.iter().enumerate() {
            match block_type(j, block)?.as_str() {
                "text" => {
                    text.push_str(&text_of(j, block, "text")?);
                    has_text = true;
                }
                "tool_use" => {
                    let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                    tool_calls.push(json!({
                        "id": text_of(j, block, "id")?,
                        "type": "function",
                        "function": {"name": text_of(j, block, "name")?, "arguments": input.to_string()},
                    }));
                }
                "thinking" => thinking.push(text_of(j, block, "thinking")?),
                "redacted_thinking" => {}
                _ => return Err(unknown(j)),
            }
        }
        let mut m = Map::new();
        m.insert("role".into(), json!("assistant"));
        m.insert(
            "content".into(),
            if has_text { json!(text) } else { Value::Null },
        );
        if !tool_calls.is_empty() {
            m.insert("tool_calls".into(), Value::Array(tool_calls));
        }
        if !thinking.is_empty() {
            m.insert("reasoning_content".into(), json!(thinking.join("\n")));
        }
        out.push(Value::Object(m));
        return Ok(());
    }

    let mut parts = Vec::new();
    let mut tool_results = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        match block_type(j, block)?.as_str() {
            "text" => parts.push(json!({"type": "text", "text": text_of(j, block, "text")?})),
            "image" => {
                media.push(media::anthropic_image(
                    block,
                    &format!("messages[{i}].content[{j}]"),
                )?);
                parts.push(media::template_part());
            }
            "tool_result" => tool_results.push(json!({
                "role": "tool",
                "tool_call_id": text_of(j, block, "tool_use_id")?,
                "content": tool_result_text(i, j, block)?,
            })),
            _ => return Err(unknown(j)),
        }
    }
    out.extend(tool_results);
    if !parts.is_empty() {
        if role == "system" {
            // A system message inside `messages` (Claude Code sends them) stays in place, as text.
            let text: Vec<&str> = parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect();
            out.push(json!({"role": "system", "content": text.join("\n")}));
        } else {
            out.push(json!({"role": role, "content": parts}));
        }
    }
    Ok(())
}

/// A `tool_result`'s content: a string, or text blocks joined with `\n`.
fn tool_result_text(i: usize, j: usize, block: &Value) -> Result<String> {
    let field = || format!("messages[{i}].content[{j}].content");
    match block.get("content") {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(blocks)) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for b in blocks {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => texts.push(
                        b.get("text")
                            .and_then(Value::as_str)
                            .ok_or_else(|| RequestError::field(field(), "text blocks"))?,
                    ),
                    Some(t) if MEDIA_TYPES.contains(&t) => {
                        return Err(RequestError::unsupported(Feature::Multimodal, field()))
                    }
                    _ => return Err(RequestError::unsupported(Feature::ContentType, field())),
                }
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err(RequestError::field(
            field(),
            "a string or a list of text blocks",
        )),
    }
}
