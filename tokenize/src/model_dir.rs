//! Reading a local model directory the way SMG's `--model-path` / `--tokenizer-path` /
//! `--chat-template` do (no hub downloads, no network): `tokenizer.json` (Hugging Face
//! `tokenizers` format), `tokenizer_config.json` (chat template, special tokens,
//! `add_bos_token`), `special_tokens_map.json`, the chat template files, and the EOS ids of
//! `config.json` and `generation_config.json`.
//!
//! Optional files that are absent are skipped; a file that exists but cannot be read or has the
//! wrong shape is a [`LoadError`] naming it, so a broken model directory fails at startup rather
//! than at the first request.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value as Json};

use crate::error::LoadError;
use crate::special_tokens::SpecialTokens;

/// Where a model's text files come from; the three SMG flags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelSource {
    /// `--model-path`: the model directory (tokenizer files, `config.json`,
    /// `generation_config.json`).
    pub model_path: Option<PathBuf>,
    /// `--tokenizer-path`: a directory with `tokenizer.json`, or the `tokenizer.json` file itself
    /// (its directory then holds the tokenizer configs). Wins over `model_path` for the tokenizer.
    pub tokenizer_path: Option<PathBuf>,
    /// `--chat-template`: a template file (`.jinja` or any text, or a `.json` holding
    /// `{"chat_template": …}`) that wins over every template in the directories.
    pub chat_template: Option<PathBuf>,
}

impl ModelSource {
    /// A model directory alone (`--model-path DIR`).
    pub fn dir(path: impl Into<PathBuf>) -> Self {
        Self {
            model_path: Some(path.into()),
            ..Self::default()
        }
    }
}

/// Chat template sources before compilation: the default template and the named ones, with the
/// file each came from (for error messages).
#[derive(Debug, Default)]
pub(crate) struct TemplateSources {
    pub default: Option<(String, PathBuf)>,
    pub named: BTreeMap<String, (String, PathBuf)>,
}

/// Everything read from the directories, before the tokenizer and templates are built.
#[derive(Debug)]
pub(crate) struct ModelFiles {
    pub tokenizer_json: PathBuf,
    pub tokenizer_bytes: Vec<u8>,
    pub special_tokens: SpecialTokens,
    pub add_bos_token: Option<bool>,
    pub add_eos_token: Option<bool>,
    pub templates: TemplateSources,
    /// Union of `eos_token_id` from `config.json` and `generation_config.json`, in order of
    /// first appearance.
    pub config_eos_ids: Vec<u32>,
}

fn read_bytes(path: &Path) -> Result<Option<Vec<u8>>, LoadError> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(LoadError::io(path, &e)),
    }
}

fn read_text(path: &Path) -> Result<Option<String>, LoadError> {
    match read_bytes(path)? {
        None => Ok(None),
        Some(b) => String::from_utf8(b)
            .map(Some)
            .map_err(|_| LoadError::new(path, "is not UTF-8 text")),
    }
}

/// An optional JSON object file.
fn read_json_object(path: &Path) -> Result<Option<Map<String, Json>>, LoadError> {
    let Some(bytes) = read_bytes(path)? else {
        return Ok(None);
    };
    match serde_json::from_slice::<Json>(&bytes) {
        Ok(Json::Object(map)) => Ok(Some(map)),
        Ok(_) => Err(LoadError::new(path, "is not a JSON object")),
        Err(e) => Err(LoadError::new(path, format!("is not valid JSON: {e}"))),
    }
}

impl ModelFiles {
    pub(crate) fn read(source: &ModelSource) -> Result<Self, LoadError> {
        let tokenizer_location = source
            .tokenizer_path
            .as_ref()
            .or(source.model_path.as_ref())
            .ok_or_else(|| {
                LoadError::new(
                    "",
                    "no model: give --model-path (a local directory) or --tokenizer-path",
                )
            })?;
        let meta =
            fs::metadata(tokenizer_location).map_err(|e| LoadError::io(tokenizer_location, &e))?;
        let (tokenizer_json, tokenizer_dir) = if meta.is_dir() {
            (
                tokenizer_location.join("tokenizer.json"),
                tokenizer_location.clone(),
            )
        } else {
            let dir = tokenizer_location
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default();
            (tokenizer_location.clone(), dir)
        };
        let tokenizer_bytes = read_bytes(&tokenizer_json)?.ok_or_else(|| {
            LoadError::new(
                &tokenizer_json,
                "not found (pdgate reads a Hugging Face tokenizer.json from a local directory; \
                 it does not download from the hub)",
            )
        })?;

        let config_path = tokenizer_dir.join("tokenizer_config.json");
        let config = read_json_object(&config_path)?.unwrap_or_default();
        let mut special_tokens = SpecialTokens::default();
        special_tokens
            .fill_from(&config)
            .map_err(|what| LoadError::new(&config_path, what))?;
        let map_path = tokenizer_dir.join("special_tokens_map.json");
        if let Some(map) = read_json_object(&map_path)? {
            special_tokens
                .fill_from(&map)
                .map_err(|what| LoadError::new(&map_path, what))?;
        }
        let flag = |key: &str| -> Result<Option<bool>, LoadError> {
            match config.get(key) {
                None | Some(Json::Null) => Ok(None),
                Some(Json::Bool(b)) => Ok(Some(*b)),
                Some(other) => Err(LoadError::new(
                    &config_path,
                    format!("{key} must be true or false, not {other}"),
                )),
            }
        };
        let add_bos_token = flag("add_bos_token")?;
        let add_eos_token = flag("add_eos_token")?;

        let templates = read_templates(source, &tokenizer_dir, &config, &config_path)?;

        // config.json and generation_config.json live with the model; look in the model
        // directory and, when the tokenizer comes from elsewhere, in the tokenizer's too.
        let mut dirs: Vec<PathBuf> = Vec::new();
        if let Some(model) = &source.model_path {
            if model.is_dir() {
                dirs.push(model.clone());
            }
        }
        if !dirs.contains(&tokenizer_dir) {
            dirs.push(tokenizer_dir.clone());
        }
        let mut config_eos_ids = Vec::new();
        for dir in &dirs {
            for name in ["config.json", "generation_config.json"] {
                let path = dir.join(name);
                if let Some(obj) = read_json_object(&path)? {
                    for id in eos_ids(obj.get("eos_token_id"))
                        .map_err(|what| LoadError::new(&path, what))?
                    {
                        if !config_eos_ids.contains(&id) {
                            config_eos_ids.push(id);
                        }
                    }
                }
            }
        }

        Ok(Self {
            tokenizer_json,
            tokenizer_bytes,
            special_tokens,
            add_bos_token,
            add_eos_token,
            templates,
            config_eos_ids,
        })
    }
}

/// `eos_token_id`: absent, null, an id, or a list of ids.
fn eos_ids(value: Option<&Json>) -> Result<Vec<u32>, String> {
    let as_id = |v: &Json| {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| format!("eos_token_id must be a token id or a list of them, not {v}"))
    };
    match value {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Array(items)) => items.iter().map(as_id).collect(),
        Some(v) => Ok(vec![as_id(v)?]),
    }
}

/// A `chat_template` value: a string (the default template) or Hugging Face's list of
/// `{"name", "template"}`.
fn parse_template_value(
    value: &Json,
    path: &Path,
    into: &mut TemplateSources,
) -> Result<(), LoadError> {
    match value {
        Json::Null => Ok(()),
        Json::String(s) => {
            into.default = Some((s.clone(), path.to_path_buf()));
            Ok(())
        }
        Json::Array(items) => {
            for item in items {
                let (Some(Json::String(name)), Some(Json::String(template))) =
                    (item.get("name"), item.get("template"))
                else {
                    return Err(LoadError::new(
                        path,
                        "chat_template list entries must be {\"name\": string, \"template\": string}",
                    ));
                };
                if name == "default" {
                    into.default = Some((template.clone(), path.to_path_buf()));
                } else {
                    into.named
                        .insert(name.clone(), (template.clone(), path.to_path_buf()));
                }
            }
            Ok(())
        }
        _ => Err(LoadError::new(
            path,
            "chat_template must be a string or a list of {\"name\", \"template\"}",
        )),
    }
}

/// A template file: `.json` holds a string or `{"chat_template": …}`; anything else is the
/// template text, verbatim (as Hugging Face reads `chat_template.jinja`).
fn read_template_file(path: &Path, into: &mut TemplateSources) -> Result<bool, LoadError> {
    let Some(text) = read_text(path)? else {
        return Ok(false);
    };
    if path.extension().is_some_and(|e| e == "json") {
        let json: Json = serde_json::from_str(&text)
            .map_err(|e| LoadError::new(path, format!("is not valid JSON: {e}")))?;
        let value = match &json {
            Json::Object(o) => o
                .get("chat_template")
                .ok_or_else(|| LoadError::new(path, "has no \"chat_template\" key"))?,
            other => other,
        };
        parse_template_value(value, path, into)?;
    } else {
        into.default = Some((text, path.to_path_buf()));
    }
    Ok(true)
}

/// The chat templates, first source found wins (SMG's order): the explicit `--chat-template`
/// file; `tokenizer_config.json`'s `chat_template`; `chat_template.json`;
/// `chat_template.jinja`; the first other `*.jinja` file (by name). Named templates from
/// `additional_chat_templates/*.jinja` are added when the default came from the directory.
fn read_templates(
    source: &ModelSource,
    dir: &Path,
    config: &Map<String, Json>,
    config_path: &Path,
) -> Result<TemplateSources, LoadError> {
    let mut t = TemplateSources::default();
    if let Some(explicit) = &source.chat_template {
        if !read_template_file(explicit, &mut t)? {
            return Err(LoadError::new(explicit, "not found (--chat-template)"));
        }
        if t.default.is_none() && t.named.is_empty() {
            return Err(LoadError::new(explicit, "holds no chat template"));
        }
        return Ok(t);
    }
    if let Some(value) = config.get("chat_template") {
        parse_template_value(value, config_path, &mut t)?;
    }
    if t.default.is_none() && t.named.is_empty() {
        let _ = read_template_file(&dir.join("chat_template.json"), &mut t)?
            || read_template_file(&dir.join("chat_template.jinja"), &mut t)?;
    }
    if t.default.is_none() && t.named.is_empty() {
        if let Some(first) = jinja_files(dir)?.into_iter().next() {
            read_template_file(&first, &mut t)?;
        }
    }
    for path in jinja_files(&dir.join("additional_chat_templates"))? {
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Some(text) = read_text(&path)? {
            t.named.entry(name).or_insert((text, path));
        }
    }
    Ok(t)
}

/// `*.jinja` files directly in `dir`, sorted by name; none when `dir` does not exist.
fn jinja_files(dir: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => return Ok(Vec::new()),
        Err(e) => return Err(LoadError::io(dir, &e)),
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "jinja"))
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::eos_ids;

    #[test]
    fn eos_token_id_is_an_id_a_list_or_nothing() {
        assert_eq!(eos_ids(None).unwrap(), Vec::<u32>::new());
        assert_eq!(eos_ids(Some(&json!(null))).unwrap(), Vec::<u32>::new());
        assert_eq!(eos_ids(Some(&json!(7))).unwrap(), vec![7]);
        assert_eq!(eos_ids(Some(&json!([7, 9]))).unwrap(), vec![7, 9]);
        assert!(eos_ids(Some(&json!("7"))).is_err());
        assert!(eos_ids(Some(&json!([-1]))).is_err());
    }
}
