//! The prompt a routing policy keys on (cache_aware's prefix tree, bucket's length, prefix_hash's
//! key), as SMG extracts it per route. Only computed when a leg's policy asks for text, so the
//! common path pays nothing.

use serde_json::Value;

use crate::body::TopLevel;
use crate::route::Route;

/// What a policy may look at: the prompt text, or token ids when the client sent ids.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoutingText {
    pub text: Option<String>,
    pub token_ids: Option<Vec<u32>>,
}

fn field(body: &[u8], top: &TopLevel, key: &str) -> Option<Value> {
    serde_json::from_slice(top.get_non_null(body, key)?).ok()
}

fn token_ids(v: &Value) -> Option<Vec<u32>> {
    v.as_array()?
        .iter()
        .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
        .collect()
}

/// Text of an OpenAI/Anthropic `content`: a string, or the `text` of its parts.
fn content_text(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => push(out, s),
        Value::Array(parts) => {
            for p in parts {
                if let Some(t) = p.get("text").and_then(Value::as_str) {
                    push(out, t);
                } else if let Some(s) = p.as_str() {
                    push(out, s);
                }
            }
        }
        _ => {}
    }
}

fn push(out: &mut String, s: &str) {
    if !out.is_empty() {
        out.push('\n');
    }
    out.push_str(s);
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

/// The routing prompt of a request: `/generate` — the first `input_ids` sequence as tokens, else
/// `text` (the first item of a batch); chat and messages — every message's text in order (plus
/// the Anthropic `system`); completions — the prompt (first item of a batch; token ids as
/// tokens); responses — the input text; rerank — the query.
pub fn routing_text(route: Route, body: &[u8], top: &TopLevel) -> RoutingText {
    let mut out = RoutingText::default();
    match route {
        Route::Generate => {
            if let Some(ids) = field(body, top, "input_ids") {
                let first = ids.get(0).filter(|f| f.is_array()).unwrap_or(&ids);
                out.token_ids = token_ids(first);
            }
            if out.token_ids.is_none() {
                out.text = match field(body, top, "text") {
                    Some(Value::String(s)) => Some(s),
                    Some(Value::Array(a)) => a.first().and_then(Value::as_str).map(str::to_string),
                    _ => None,
                };
            }
        }
        Route::ChatCompletions | Route::Messages | Route::CountTokens => {
            let mut text = String::new();
            if let Some(system) = field(body, top, "system") {
                content_text(&system, &mut text);
            }
            if let Some(Value::Array(messages)) = field(body, top, "messages") {
                for m in &messages {
                    if let Some(c) = m.get("content") {
                        content_text(c, &mut text);
                    }
                }
            }
            out.text = non_empty(text);
        }
        Route::Completions => match field(body, top, "prompt") {
            Some(Value::String(s)) => out.text = Some(s),
            Some(Value::Array(a)) => match a.first() {
                Some(Value::String(s)) => out.text = Some(s.clone()),
                Some(first @ Value::Array(_)) => out.token_ids = token_ids(first),
                Some(Value::Number(_)) => out.token_ids = token_ids(&Value::Array(a.clone())),
                _ => {}
            },
            _ => {}
        },
        Route::Responses => match field(body, top, "input") {
            Some(Value::String(s)) => out.text = Some(s),
            Some(Value::Array(items)) => {
                let mut text = String::new();
                for item in &items {
                    match item.get("content") {
                        Some(c) => content_text(c, &mut text),
                        None => content_text(item, &mut text),
                    }
                }
                out.text = non_empty(text);
            }
            _ => {}
        },
        Route::Rerank => {
            out.text = field(body, top, "query").and_then(|q| q.as_str().map(str::to_string));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::scan_object;

    fn text_of(route: Route, body: &str) -> RoutingText {
        let top = scan_object(body.as_bytes()).unwrap();
        routing_text(route, body.as_bytes(), &top)
    }

    #[test]
    fn chat_text_is_every_message_in_order() {
        let t = text_of(
            Route::ChatCompletions,
            r#"{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#,
        );
        assert_eq!(t.text.as_deref(), Some("be brief\nhi"));
    }

    #[test]
    fn generate_prefers_token_ids_and_takes_the_first_of_a_batch() {
        assert_eq!(
            text_of(Route::Generate, r#"{"input_ids":[[1,2],[3]]}"#).token_ids,
            Some(vec![1, 2])
        );
        assert_eq!(
            text_of(Route::Generate, r#"{"input_ids":[5,6]}"#).token_ids,
            Some(vec![5, 6])
        );
        assert_eq!(
            text_of(Route::Generate, r#"{"text":["a","b"]}"#)
                .text
                .as_deref(),
            Some("a")
        );
    }

    #[test]
    fn completions_responses_and_rerank() {
        assert_eq!(
            text_of(Route::Completions, r#"{"prompt":["x","y"]}"#)
                .text
                .as_deref(),
            Some("x")
        );
        assert_eq!(
            text_of(Route::Completions, r#"{"prompt":[7,8]}"#).token_ids,
            Some(vec![7, 8])
        );
        assert_eq!(
            text_of(Route::Responses, r#"{"input":"q"}"#)
                .text
                .as_deref(),
            Some("q")
        );
        assert_eq!(
            text_of(Route::Rerank, r#"{"query":"r","documents":[]}"#)
                .text
                .as_deref(),
            Some("r")
        );
        assert_eq!(text_of(Route::Rerank, r#"{"query":1}"#).text, None);
    }
}
