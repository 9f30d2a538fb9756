//! The minijinja environment that renders like Hugging Face's
//! `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
//! extensions=[AssistantTracker, loopcontrols])` with its globals `raise_exception` and
//! `strftime_now` and its `tojson` filter.

use std::fmt;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};

use super::pyjson::{self, DumpOptions};
use super::strftime;
use crate::error::TemplateError;

/// The message of a template's `raise_exception(…)`, carried as the source of minijinja's error so
/// it can be told apart from the template's own failures.
#[derive(Debug)]
struct Raised(String);

impl fmt::Display for Raised {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

pub(super) fn hf_environment() -> Environment<'static> {
    let mut env = Environment::new();
    let syntax = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .expect("the default delimiters are valid");
    env.set_syntax(syntax);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", tojson);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", |format: &str| {
        strftime::strftime_now(format)
    });
    env
}

fn raise_exception(message: Option<Value>) -> Result<Value, Error> {
    let message = match message {
        Some(v) if v.kind() == ValueKind::String => v.as_str().unwrap_or_default().to_owned(),
        Some(v) => v.to_string(),
        None => String::new(),
    };
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

/// Hugging Face's `tojson(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`: Python's `json.dumps`, no HTML escaping.
fn tojson(
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let ensure_ascii = match kwargs
        .get::<Option<Value>>("ensure_ascii")?
        .or(ensure_ascii)
    {
        Some(v) => v.is_true(),
        None => false,
    };
    let indent = match kwargs.get::<Option<Value>>("indent")?.or(indent) {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
        Some(v) => {
            let n = v.as_i64().ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                )
            })?;
            Some(" ".repeat(usize::try_from(n).unwrap_or(0).min(64)))
        }
    };
    let separators = match kwargs.get::<Option<Value>>("separators")? {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [item, key] if item.as_str().is_some() && key.as_str().is_some() => Some((
                    item.as_str().unwrap_or_default().to_owned(),
                    key.as_str().unwrap_or_default().to_owned(),
                )),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ))
                }
            }
        }
    };
    let sort_keys = kwargs
        .get::<Option<Value>>("sort_keys")?
        .is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let options = DumpOptions::new(ensure_ascii, indent, separators, sort_keys);
    pyjson::dumps(value, &options).map(Value::from_safe_string)
}

/// A render failure as the gateway reports it: the template's own `raise_exception` message, or
/// minijinja's description of what failed (with the template line).
pub(super) fn template_error(err: Error) -> TemplateError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(e) = source {
        if let Some(raised) = e.downcast_ref::<Raised>() {
            return TemplateError::Raised(raised.0.clone());
        }
        source = e.source();
    }
    let mut message = err.kind().to_string();
    if let Some(detail) = err.detail() {
        message.push_str(": ");
        message.push_str(detail);
    }
    if let Some(line) = err.line() {
        message.push_str(&format!(" (template line {line})"));
    }
    TemplateError::Render(message)
}

/// Hugging Face's `{% generation %}…{% endgeneration %}` marks the assistant's tokens for training
/// masks and renders its body unchanged; minijinja has no such tag, so it becomes an always-true
/// `if` with the same whitespace control.
pub(super) fn rewrite_generation_tags(source: &str) -> String {
    if !source.contains("generation") {
        return source.to_owned();
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        match rewrite_one(tag) {
            Some((replacement, consumed)) => {
                out.push_str(&replacement);
                rest = &tag[consumed..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// `tag` starts with `{%`; when it is a (end)generation tag, its replacement and length.
fn rewrite_one(tag: &str) -> Option<(String, usize)> {
    let body = &tag[2..];
    let (open_mod, body) = match body.chars().next() {
        Some(c @ ('-' | '+')) => (Some(c), &body[1..]),
        _ => (None, body),
    };
    let trimmed = body.trim_start();
    let (keyword, after) = if let Some(after) = trimmed.strip_prefix("endgeneration") {
        ("endif", after)
    } else if let Some(after) = trimmed.strip_prefix("generation") {
        ("if true", after)
    } else {
        return None;
    };
    let after_ws = after.trim_start();
    if after_ws.len() == after.len() && !after.starts_with(['-', '+', '%']) {
        return None; // `generations`, `generation_prompt`, …
    }
    let (close_mod, after_ws) = match after_ws.chars().next() {
        Some(c @ ('-' | '+')) => (Some(c), &after_ws[1..]),
        _ => (None, after_ws),
    };
    let end = after_ws.strip_prefix("%}")?;
    let consumed = tag.len() - end.len();
    let mut replacement = String::from("{%");
    replacement.extend(open_mod);
    replacement.push(' ');
    replacement.push_str(keyword);
    replacement.push(' ');
    replacement.extend(close_mod);
    replacement.push_str("%}");
    Some((replacement, consumed))
}

#[cfg(test)]
mod tests {
    use super::rewrite_generation_tags;

    #[test]
    fn generation_tags_become_if_true_with_the_same_whitespace_control() {
        assert_eq!(
            rewrite_generation_tags("a{%- generation %}b{% endgeneration -%} c"),
            "a{%- if true %}b{% endif -%} c"
        );
        assert_eq!(
            rewrite_generation_tags("{%generation%}x{%endgeneration%}"),
            "{% if true %}x{% endif %}"
        );
        let untouched = "{% if add_generation_prompt %}{% set generations = 1 %}{% endif %}";
        assert_eq!(rewrite_generation_tags(untouched), untouched);
    }
}
