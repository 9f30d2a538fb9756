//! The client's JSON as template values, in one pass with no typed round trip: every field the
//! client sent stays (in the client's key order), and two reshapings happen on the way:
//! - `content` as a list of parts becomes one string for a "string" template (text parts joined
//!   with a space, other parts dropped, as SGLang and SMG do);
//! - `tool_calls[].function.arguments` given as a JSON string is parsed, because templates print
//!   arguments with `tojson` or iterate them (vLLM and SGLang do the same; a string that is not
//!   JSON stays a string).

use minijinja::value::Value;
use serde_json::Value as Json;

use super::ContentFormat;

/// A JSON value as a template value.
pub(super) fn json_value(v: &Json) -> Value {
    match v {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => Value::from(items.iter().map(json_value).collect::<Vec<_>>()),
        Json::Object(map) => {
            Value::from_pairs(map.iter().map(|(k, v)| (k.as_str(), json_value(v))))
        }
    }
}

/// One message as a template value, reshaped for the template's content format.
pub(super) fn message_value(message: &Json, format: ContentFormat) -> Value {
    let Json::Object(map) = message else {
        return json_value(message);
    };
    Value::from_pairs(map.iter().map(|(k, v)| {
        let value = match k.as_str() {
            "content" => content_value(v, format),
            "tool_calls" => tool_calls_value(v),
            _ => json_value(v),
        };
        (k.as_str(), value)
    }))
}

fn content_value(content: &Json, format: ContentFormat) -> Value {
    match (content, format) {
        (Json::Array(parts), ContentFormat::String) => Value::from(flatten_text_parts(parts)),
        _ => json_value(content),
    }
}

/// The text parts of an OpenAI content list, joined with a space.
pub(crate) fn flatten_text_parts(parts: &[Json]) -> String {
    let mut out = String::new();
    let texts = parts.iter().filter_map(|p| {
        (p.get("type").and_then(Json::as_str) == Some("text"))
            .then(|| p.get("text").and_then(Json::as_str))
            .flatten()
    });
    for (i, text) in texts.enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(text);
    }
    out
}

fn tool_calls_value(calls: &Json) -> Value {
    let Json::Array(calls) = calls else {
        return json_value(calls);
    };
    Value::from(calls.iter().map(tool_call_value).collect::<Vec<_>>())
}

fn tool_call_value(call: &Json) -> Value {
    let Json::Object(call) = call else {
        return json_value(call);
    };
    Value::from_pairs(call.iter().map(|(k, v)| {
        let value = match (k.as_str(), v) {
            ("function", Json::Object(function)) => {
                Value::from_pairs(function.iter().map(|(fk, fv)| {
                    let value = match (fk.as_str(), fv) {
                        ("arguments", Json::String(s)) => match serde_json::from_str::<Json>(s) {
                            Ok(parsed) => json_value(&parsed),
                            Err(_) => Value::from(s.as_str()),
                        },
                        _ => json_value(fv),
                    };
                    (fk.as_str(), value)
                }))
            }
            _ => json_value(v),
        };
        (k.as_str(), value)
    }))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn string_format_joins_text_parts_and_drops_the_rest() {
        let m = json!({"role": "user", "content": [
            {"type": "text", "text": "a"},
            {"type": "image_url", "image_url": {"url": "x"}},
            {"type": "text", "text": "b"}
        ], "name": "n"});
        let v = message_value(&m, ContentFormat::String);
        assert_eq!(v.get_attr("content").unwrap().as_str(), Some("a b"));
        assert_eq!(v.get_attr("name").unwrap().as_str(), Some("n"));
        let v = message_value(&m, ContentFormat::OpenAi);
        assert_eq!(v.get_attr("content").unwrap().len(), Some(3));
    }

    #[test]
    fn tool_call_arguments_strings_are_parsed_when_json() {
        let m = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
            {"id": "2", "type": "function", "function": {"name": "g", "arguments": "not json"}}
        ]});
        let v = message_value(&m, ContentFormat::String);
        let calls = v.get_attr("tool_calls").unwrap();
        let args0 = calls
            .get_item_by_index(0)
            .unwrap()
            .get_attr("function")
            .unwrap()
            .get_attr("arguments")
            .unwrap();
        assert_eq!(args0.get_attr("x").unwrap().as_i64(), Some(1));
        let args1 = calls
            .get_item_by_index(1)
            .unwrap()
            .get_attr("function")
            .unwrap()
            .get_attr("arguments")
            .unwrap();
        assert_eq!(args1.as_str(), Some("not json"));
    }
}
