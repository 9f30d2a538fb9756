//! A model's named special tokens (`bos_token`, `eos_token`, …) as `tokenizer_config.json` and
//! `special_tokens_map.json` give them: a string, or an `AddedToken` object whose `content` is the
//! string. Templates see them as variables, undefined when the model names none.

use minijinja::value::Value;
use serde_json::{Map, Value as Json};

/// The special-token strings a chat template may print.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub unk_token: Option<String>,
    pub pad_token: Option<String>,
    pub sep_token: Option<String>,
    pub cls_token: Option<String>,
    pub mask_token: Option<String>,
    pub additional_special_tokens: Vec<String>,
}

/// A token given as `"<s>"` or `{"content": "<s>", …}`; `Err` names what it was instead.
pub(crate) fn token_string(value: &Json) -> Result<Option<String>, String> {
    match value {
        Json::Null => Ok(None),
        Json::String(s) => Ok(Some(s.clone())),
        Json::Object(o) => match o.get("content") {
            Some(Json::String(s)) => Ok(Some(s.clone())),
            _ => Err("an object without a string \"content\"".to_owned()),
        },
        other => Err(format!("{other}")),
    }
}

impl SpecialTokens {
    /// Reads the named tokens from a config object; a key already set is kept (the first file
    /// read wins). `Err` names the key and what was wrong.
    pub(crate) fn fill_from(&mut self, config: &Map<String, Json>) -> Result<(), String> {
        let slots: [(&str, &mut Option<String>); 7] = [
            ("bos_token", &mut self.bos_token),
            ("eos_token", &mut self.eos_token),
            ("unk_token", &mut self.unk_token),
            ("pad_token", &mut self.pad_token),
            ("sep_token", &mut self.sep_token),
            ("cls_token", &mut self.cls_token),
            ("mask_token", &mut self.mask_token),
        ];
        for (key, slot) in slots {
            if slot.is_some() {
                continue;
            }
            if let Some(v) = config.get(key) {
                *slot = token_string(v).map_err(|what| {
                    format!("{key} must be a string or an AddedToken object, not {what}")
                })?;
            }
        }
        if self.additional_special_tokens.is_empty() {
            if let Some(v) = config.get("additional_special_tokens") {
                let Json::Array(items) = v else {
                    return Err("additional_special_tokens must be a list".to_owned());
                };
                for item in items {
                    if let Some(s) = token_string(item).map_err(|what| {
                        format!("additional_special_tokens holds {what}, not a token")
                    })? {
                        self.additional_special_tokens.push(s);
                    }
                }
            }
        }
        Ok(())
    }

    /// `(variable name, value)` for each token the model names.
    pub(crate) fn template_variables(&self) -> Vec<(&'static str, Value)> {
        let mut out = Vec::with_capacity(8);
        for (name, token) in [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
            ("unk_token", &self.unk_token),
            ("pad_token", &self.pad_token),
            ("sep_token", &self.sep_token),
            ("cls_token", &self.cls_token),
            ("mask_token", &self.mask_token),
        ] {
            if let Some(t) = token {
                out.push((name, Value::from(t.as_str())));
            }
        }
        if !self.additional_special_tokens.is_empty() {
            out.push((
                "additional_special_tokens",
                Value::from(
                    self.additional_special_tokens
                        .iter()
                        .map(|s| Value::from(s.as_str()))
                        .collect::<Vec<_>>(),
                ),
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn strings_and_added_token_objects_both_name_a_token() {
        let mut t = SpecialTokens::default();
        let config = json!({
            "bos_token": "<s>",
            "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": false},
            "pad_token": null
        });
        t.fill_from(config.as_object().unwrap()).unwrap();
        assert_eq!(t.bos_token.as_deref(), Some("<s>"));
        assert_eq!(t.eos_token.as_deref(), Some("</s>"));
        assert_eq!(t.pad_token, None);
        let bad = json!({"unk_token": 3});
        let err = SpecialTokens::default()
            .fill_from(bad.as_object().unwrap())
            .unwrap_err();
        assert!(err.contains("unk_token"), "{err}");
    }
}
