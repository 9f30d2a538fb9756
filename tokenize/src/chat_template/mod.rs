//! Chat templates: a model's Jinja template compiled once with minijinja in an environment that
//! behaves like Hugging Face's (`trim_blocks`, `lstrip_blocks`, Python string methods, Python's
//! `json.dumps` as `tojson`, `raise_exception`, `strftime_now`, loop controls, the
//! `{% generation %}` tag), and rendered per request from the client's JSON messages without a
//! typed round trip: every field the client sent reaches the template.

mod content_format;
mod environment;
mod messages;
mod pyjson;
mod strftime;

use std::collections::BTreeMap;

use minijinja::value::Value;
use minijinja::Environment;
use serde_json::{Map, Value as Json};

pub use content_format::ContentFormat;

use crate::error::TemplateError;
use crate::special_tokens::SpecialTokens;

/// What a chat render needs from the request. Borrowed: the gateway parses the client body once
/// and points into it.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChatInput<'a> {
    /// The client's `messages`, as sent.
    pub messages: &'a [Json],
    /// The tools the template may describe; `None` leaves `tools` undefined in the template (not
    /// none), so `{% if tools is defined %}` guards see no tools.
    pub tools: Option<&'a [Json]>,
    /// RAG documents; `None` leaves `documents` undefined.
    pub documents: Option<&'a [Json]>,
    /// End the prompt with the assistant's header so the model answers.
    pub add_generation_prompt: bool,
    /// Leave the final (assistant) message open so the model continues it; Hugging Face's rule:
    /// the prompt is cut right after the final message's text.
    pub continue_final_message: bool,
    /// `chat_template_kwargs`: extra template variables, merged over everything else (they win,
    /// as in vLLM; `enable_thinking` and the like arrive here).
    pub template_kwargs: Option<&'a Map<String, Json>>,
}

impl<'a> ChatInput<'a> {
    /// A plain conversation that asks the model to answer: `messages`, the assistant's header
    /// at the end, no tools, documents or extra variables.
    pub fn conversation(messages: &'a [Json]) -> Self {
        ChatInput {
            messages,
            add_generation_prompt: true,
            ..ChatInput::default()
        }
    }
}

/// One compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    content_format: ContentFormat,
}

const TEMPLATE_NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles a template's source. The error is minijinja's syntax error (with its line).
    pub fn new(source: &str) -> Result<Self, minijinja::Error> {
        let source = environment::rewrite_generation_tags(source);
        let content_format = content_format::detect(&source);
        let mut env = environment::hf_environment();
        env.add_template_owned(TEMPLATE_NAME, source)?;
        Ok(Self {
            env,
            content_format,
        })
    }

    /// The shape of `message.content` this template expects.
    pub fn content_format(&self) -> ContentFormat {
        self.content_format
    }

    /// Renders the prompt for `input`, with the model's special tokens as `bos_token`,
    /// `eos_token`, … (undefined when the model has none).
    pub fn render(
        &self,
        input: &ChatInput<'_>,
        special_tokens: &SpecialTokens,
    ) -> Result<String, TemplateError> {
        if input.continue_final_message && input.add_generation_prompt {
            return Err(TemplateError::ContinueFinalMessage(
                "cannot be combined with add_generation_prompt".to_owned(),
            ));
        }
        let messages: Vec<Value> = input
            .messages
            .iter()
            .map(|m| messages::message_value(m, self.content_format))
            .collect();
        let undefined_or = |v: Option<&[Json]>| {
            v.map_or(Value::UNDEFINED, |items| {
                Value::from(items.iter().map(messages::json_value).collect::<Vec<_>>())
            })
        };
        let mut ctx: Vec<(Value, Value)> = vec![
            (Value::from("messages"), Value::from(messages)),
            (
                Value::from("add_generation_prompt"),
                Value::from(input.add_generation_prompt),
            ),
            (Value::from("tools"), undefined_or(input.tools)),
            (Value::from("documents"), undefined_or(input.documents)),
        ];
        for (name, token) in special_tokens.template_variables() {
            ctx.push((Value::from(name), token));
        }
        if let Some(kwargs) = input.template_kwargs {
            for (k, v) in kwargs {
                ctx.push((Value::from(k.as_str()), messages::json_value(v)));
            }
        }
        // Later entries win: kwargs over the rest.
        let ctx = Value::from_pairs(ctx);
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TemplateError::Render(e.to_string()))?;
        let rendered = template.render(ctx).map_err(environment::template_error)?;
        if input.continue_final_message {
            cut_after_final_message(rendered, input.messages)
        } else {
            Ok(rendered)
        }
    }
}

/// Hugging Face's `continue_final_message`: the prompt ends right after the final message's
/// text (its last text part for a list of parts), keeping the text's own leading/trailing
/// whitespace only where the template kept it.
fn cut_after_final_message(rendered: String, messages: &[Json]) -> Result<String, TemplateError> {
    let final_text = messages
        .last()
        .and_then(|m| m.get("content"))
        .and_then(|c| match c {
            Json::String(s) => Some(s.as_str()),
            Json::Array(parts) => parts
                .iter()
                .rev()
                .find_map(|p| p.get("text").and_then(Json::as_str)),
            _ => None,
        })
        .ok_or_else(|| {
            TemplateError::ContinueFinalMessage(
                "the final message has no text to continue".to_owned(),
            )
        })?;
    let stripped = final_text.trim();
    let Some(at) = rendered.rfind(stripped) else {
        return Err(TemplateError::ContinueFinalMessage(
            "the final message does not appear in the rendered prompt".to_owned(),
        ));
    };
    let lstripped = final_text.trim_start();
    let end = if rendered[at..].starts_with(lstripped) {
        at + lstripped.len()
    } else {
        at + stripped.len()
    };
    let mut rendered = rendered;
    rendered.truncate(end);
    Ok(rendered)
}

/// A model's chat templates: the default one and any named ones (`tokenizer_config.json` may hold
/// a list of `{name, template}`; Hugging Face renders with `tool_use` when the request has tools
/// and the model has one, else with `default`).
#[derive(Debug, Default)]
pub struct ChatTemplates {
    default: Option<ChatTemplate>,
    named: BTreeMap<String, ChatTemplate>,
}

impl ChatTemplates {
    pub(crate) fn new(
        default: Option<ChatTemplate>,
        named: BTreeMap<String, ChatTemplate>,
    ) -> Self {
        Self { default, named }
    }

    /// The template a request renders with: `tool_use` when it has tools and the model has one,
    /// else the default.
    pub fn select(&self, has_tools: bool) -> Option<&ChatTemplate> {
        if has_tools {
            if let Some(t) = self.named.get("tool_use") {
                return Some(t);
            }
        }
        self.default.as_ref()
    }

    /// The default template, if any.
    pub fn default_template(&self) -> Option<&ChatTemplate> {
        self.default.as_ref()
    }

    /// A named template (`"default"` is the default one).
    pub fn get(&self, name: &str) -> Option<&ChatTemplate> {
        if name == "default" {
            return self.default.as_ref();
        }
        self.named.get(name)
    }

    /// Whether there is no template at all.
    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.named.is_empty()
    }
}
