//! Reading one typed field at a time from the scanned body (or from a nested object's raw
//! bytes), with the field's path in the 400 when its type is wrong. `null` counts as absent.

use pdgate_filters::body::TopLevel;
use pdgate_filters::value::{self, Kind};
use serde::de::DeserializeOwned;

use super::{Feature, RequestError};

type Result<T> = std::result::Result<T, RequestError>;

/// Where fields are read: the body's top level, or a nested object (its path prefix names
/// its fields in errors, e.g. `sampling_params.`).
#[derive(Clone, Copy)]
pub(super) struct Reader<'b> {
    source: Source<'b>,
    prefix: &'static str,
}

#[derive(Clone, Copy)]
enum Source<'b> {
    Top(&'b [u8], &'b TopLevel),
    Object(&'b [u8]),
}

impl<'b> Reader<'b> {
    pub fn top(body: &'b [u8], top: &'b TopLevel) -> Self {
        Reader {
            source: Source::Top(body, top),
            prefix: "",
        }
    }

    /// The raw value of `key`; `None` when absent or `null`.
    pub fn raw(&self, key: &str) -> Option<&'b [u8]> {
        match self.source {
            Source::Top(body, top) => top.get_non_null(body, key),
            Source::Object(raw) => value::object_get(raw, key).filter(|v| *v != b"null"),
        }
    }

    pub fn has(&self, key: &str) -> bool {
        self.raw(key).is_some()
    }

    /// The field's path for messages.
    pub fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn wrong(&self, key: &str, expected: &'static str) -> RequestError {
        RequestError::field(self.name(key), expected)
    }

    /// The nested object `key` (named `prefix` + its keys in errors).
    pub fn object(&self, key: &str, prefix: &'static str) -> Result<Option<Reader<'b>>> {
        match self.raw(key) {
            None => Ok(None),
            Some(raw) if value::kind(raw) == Some(Kind::Object) => Ok(Some(Reader {
                source: Source::Object(raw),
                prefix,
            })),
            Some(_) => Err(self.wrong(key, "an object")),
        }
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>> {
        self.raw(key)
            .map(|raw| value::as_bool(raw).ok_or_else(|| self.wrong(key, "a boolean")))
            .transpose()
    }

    pub fn flag(&self, key: &str) -> Result<bool> {
        Ok(self.bool(key)?.unwrap_or(false))
    }

    pub fn f32(&self, key: &str) -> Result<Option<f32>> {
        self.raw(key)
            .map(|raw| {
                value::as_f64(raw)
                    .map(|x| x as f32)
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| self.wrong(key, "a number"))
            })
            .transpose()
    }

    /// A non-negative integer that fits in `u32`.
    pub fn u32(&self, key: &str) -> Result<Option<u32>> {
        self.raw(key)
            .map(|raw| {
                value::as_u64(raw)
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| self.wrong(key, "a non-negative integer below 2^32"))
            })
            .transpose()
    }

    /// A non-negative integer of any size, saturated to `u32::MAX` (output caps: whether a cap
    /// fits the model is the context check's to say).
    pub fn count(&self, key: &str) -> Result<Option<u32>> {
        self.raw(key)
            .map(|raw| {
                if !value::is_non_negative_integer(raw) {
                    return Err(self.wrong(key, "a non-negative integer"));
                }
                Ok(value::as_u64(raw).map_or(u32::MAX, |n| u32::try_from(n).unwrap_or(u32::MAX)))
            })
            .transpose()
    }

    pub fn i32(&self, key: &str) -> Result<Option<i32>> {
        self.raw(key)
            .map(|raw| {
                value::is_integer(raw)
                    .then(|| serde_json::from_slice::<i32>(raw).ok())
                    .flatten()
                    .ok_or_else(|| self.wrong(key, "an integer"))
            })
            .transpose()
    }

    pub fn i64(&self, key: &str) -> Result<Option<i64>> {
        self.raw(key)
            .map(|raw| {
                value::is_integer(raw)
                    .then(|| serde_json::from_slice::<i64>(raw).ok())
                    .flatten()
                    .ok_or_else(|| self.wrong(key, "a 64-bit integer"))
            })
            .transpose()
    }

    pub fn string(&self, key: &str) -> Result<Option<String>> {
        self.raw(key)
            .map(|raw| {
                value::as_str(raw)
                    .map(|s| s.into_owned())
                    .ok_or_else(|| self.wrong(key, "a string"))
            })
            .transpose()
    }

    /// The raw JSON text of `key` (any kind), for values passed on as JSON text.
    pub fn json_text(&self, key: &str) -> Option<String> {
        self.raw(key)
            .and_then(|raw| std::str::from_utf8(raw).ok())
            .map(str::to_owned)
    }

    /// Stop strings: a non-empty string or a list of them.
    pub fn stop_strings(&self, key: &str) -> Result<Vec<String>> {
        const EXPECTED: &str = "a non-empty string or a list of non-empty strings";
        let Some(raw) = self.raw(key) else {
            return Ok(Vec::new());
        };
        let list = match value::kind(raw) {
            Some(Kind::String) => vec![self.string(key)?.unwrap_or_default()],
            Some(Kind::Array) => self.deserialize::<Vec<String>>(key, EXPECTED)?,
            _ => return Err(self.wrong(key, EXPECTED)),
        };
        if list.iter().any(String::is_empty) {
            return Err(self.wrong(key, EXPECTED));
        }
        Ok(list)
    }

    /// A list of token ids.
    pub fn token_ids(&self, key: &str) -> Result<Vec<u32>> {
        match self.raw(key) {
            None => Ok(Vec::new()),
            Some(_) => self.deserialize(key, "a list of token ids"),
        }
    }

    /// `key` deserialized as `T`.
    pub fn deserialize<T: DeserializeOwned>(&self, key: &str, expected: &'static str) -> Result<T> {
        let raw = self.raw(key).ok_or_else(|| self.wrong(key, expected))?;
        serde_json::from_slice(raw).map_err(|_| self.wrong(key, expected))
    }

    /// `key` deserialized as `T` when present.
    pub fn optional<T: DeserializeOwned>(
        &self,
        key: &str,
        expected: &'static str,
    ) -> Result<Option<T>> {
        if self.has(key) {
            self.deserialize(key, expected).map(Some)
        } else {
            Ok(None)
        }
    }

    /// OpenAI `logit_bias`: `{"<token id>": bias}`.
    pub fn logit_bias(&self, key: &str) -> Result<Vec<(u32, f32)>> {
        const EXPECTED: &str = "an object mapping token ids to numbers";
        let Some(map) = self.optional::<std::collections::BTreeMap<String, f64>>(key, EXPECTED)?
        else {
            return Ok(Vec::new());
        };
        map.into_iter()
            .map(|(k, v)| match k.parse::<u32>() {
                Ok(id) if v.is_finite() => Ok((id, v as f32)),
                _ => Err(self.wrong(key, EXPECTED)),
            })
            .collect()
    }

    /// Tools for the template: `tools` (a non-empty list) and `tool_choice`, as sent. Tool
    /// calling needs a tool parser the gRPC path does not have yet, so tools are accepted only
    /// with a `tool_choice` that turns calling off (`calling_off`); otherwise
    /// [`Feature::ToolCalling`].
    pub fn template_tools(
        &self,
        calling_off: fn(&serde_json::Value) -> bool,
    ) -> Result<(Option<serde_json::Value>, Option<serde_json::Value>)> {
        let tool_choice: Option<serde_json::Value> =
            self.optional("tool_choice", "a string or an object")?;
        let tools: Option<Vec<serde_json::Value>> = self.optional("tools", "a list of tools")?;
        let tools = tools.filter(|t| !t.is_empty());
        if tools.is_some() && !tool_choice.as_ref().is_some_and(calling_off) {
            return Err(RequestError::unsupported(
                Feature::ToolCalling,
                self.name("tools"),
            ));
        }
        Ok((tools.map(serde_json::Value::Array), tool_choice))
    }

    /// Refuses `key` when it is present (and not `null`, `false`, empty list or empty object).
    pub fn refuse(&self, key: &str, feature: Feature) -> Result<()> {
        match self.raw(key) {
            None | Some(b"false") | Some(b"[]") | Some(b"{}") => Ok(()),
            Some(raw)
                if value::kind(raw) == Some(Kind::Array)
                    && value::array_shape(raw).is_some_and(|s| s.len == 0) =>
            {
                Ok(())
            }
            Some(_) => Err(RequestError::unsupported(feature, self.name(key))),
        }
    }
}

/// Runs `f` on a reader of `body`'s top level.
#[cfg(test)]
pub(super) fn with<T>(body: &str, f: impl FnOnce(&Reader<'_>) -> T) -> T {
    let top = pdgate_filters::body::scan_object(body.as_bytes()).unwrap();
    f(&Reader::top(body.as_bytes(), &top))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_is_absent() {
        with(r#"{"a":null}"#, |r| {
            assert!(!r.has("a"));
            assert_eq!(r.f32("a"), Ok(None));
            assert_eq!(r.stop_strings("a"), Ok(vec![]));
        });
    }

    #[test]
    fn numbers_and_counts() {
        with(
            r#"{"t":0.5,"i":3,"big":99999999999999999999999,"neg":-2,"s":"1"}"#,
            |r| {
                assert_eq!(r.f32("t"), Ok(Some(0.5)));
                assert_eq!(r.f32("i"), Ok(Some(3.0)));
                assert_eq!(r.u32("i"), Ok(Some(3)));
                assert_eq!(r.count("big"), Ok(Some(u32::MAX)));
                assert_eq!(r.i32("neg"), Ok(Some(-2)));
                assert!(r.u32("neg").is_err());
                assert!(r.u32("t").is_err());
                assert!(r.f32("s").is_err());
                assert!(r.i32("t").is_err());
                let e = r.count("neg").unwrap_err();
                assert_eq!(e.to_string(), "field `neg` must be a non-negative integer");
            },
        );
    }

    #[test]
    fn nested_objects_name_their_fields() {
        with(r#"{"sp":{"stop":5},"x":1}"#, |r| {
            let sp = r.object("sp", "sp.").unwrap().unwrap();
            let e = sp.stop_strings("stop").unwrap_err();
            assert_eq!(
                e.to_string(),
                "field `sp.stop` must be a non-empty string or a list of non-empty strings"
            );
            assert!(r.object("x", "x.").is_err());
        });
    }

    #[test]
    fn stop_strings_take_a_string_or_a_list_and_refuse_empty_ones() {
        with(
            r#"{"a":"x","b":["y","z"],"c":"","d":["y",""],"e":[1]}"#,
            |r| {
                assert_eq!(r.stop_strings("a"), Ok(vec!["x".to_string()]));
                assert_eq!(r.stop_strings("b"), Ok(vec!["y".to_string(), "z".into()]));
                for bad in ["c", "d", "e"] {
                    assert!(r.stop_strings(bad).is_err(), "{bad}");
                }
            },
        );
    }

    #[test]
    fn logit_bias_keys_are_token_ids() {
        with(r#"{"a":{"12":-100,"7":2.5},"b":{"x":1},"c":[1]}"#, |r| {
            assert_eq!(r.logit_bias("a"), Ok(vec![(12, -100.0), (7, 2.5)]));
            assert!(r.logit_bias("b").is_err());
            assert!(r.logit_bias("c").is_err());
        });
    }

    #[test]
    fn refuse_ignores_empty_and_false_values() {
        with(
            r#"{"a":false,"b":[],"c":{},"d":[ ],"e":true,"f":"x","g":[1]}"#,
            |r| {
                for ok in ["a", "b", "c", "d", "absent"] {
                    assert!(r.refuse(ok, Feature::Lora).is_ok(), "{ok}");
                }
                for bad in ["e", "f", "g"] {
                    let e = r.refuse(bad, Feature::Lora).unwrap_err();
                    assert_eq!(
                        e.code(),
                        pdgate_filters::errors::ErrorCode::FeatureNotSupported
                    );
                }
            },
        );
    }
}
