//! The crate's errors, as values the gateway maps to its catalogue: a model directory that does
//! not load ([`LoadError`], a startup or registration failure), a chat template that refuses a
//! request ([`TemplateError`], a 400 when the template raised or could not render the client's
//! messages) and a tokenizer failure on a request ([`TokenizeError`], a 500).

use std::fmt;
use std::path::{Path, PathBuf};

/// A model directory (or one of its files) that cannot be used. The message names the file and
/// what was wrong with it.
#[derive(Debug)]
pub struct LoadError {
    path: PathBuf,
    problem: String,
}

impl LoadError {
    pub(crate) fn new(path: impl AsRef<Path>, problem: impl Into<String>) -> Self {
        Self {
            path: path.as_ref().to_path_buf(),
            problem: problem.into(),
        }
    }

    pub(crate) fn io(path: impl AsRef<Path>, err: &std::io::Error) -> Self {
        let problem = if err.kind() == std::io::ErrorKind::NotFound {
            "not found".to_owned()
        } else {
            format!("cannot be read: {err}")
        };
        Self::new(path, problem)
    }

    /// The file or directory at fault.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What was wrong with it.
    pub fn problem(&self) -> &str {
        &self.problem
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.problem)
    }
}

impl std::error::Error for LoadError {}

/// Why a chat template did not produce a prompt. Every variant is about the request (its messages,
/// tools or kwargs as the model's template sees them), so the gateway answers 400 with
/// [`TemplateError::message`] as the client-facing text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateError {
    /// The model has no chat template (none in the directory and no `--chat-template`).
    NoTemplate,
    /// The template called `raise_exception(message)`: the model's own refusal of the
    /// conversation (a bad role order, a system message where none is allowed, …).
    Raised(String),
    /// The template failed while rendering (an undefined attribute, a type error on the client's
    /// data, …).
    Render(String),
    /// `continue_final_message` could not be honoured (no text to continue, or the template does
    /// not show the final message's text).
    ContinueFinalMessage(String),
}

impl TemplateError {
    /// The client-facing message.
    pub fn message(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoTemplate => f.write_str(
                "the model has no chat template; pass one with --chat-template or use a \
                 completions route",
            ),
            Self::Raised(msg) => write!(f, "chat template rejected the request: {msg}"),
            Self::Render(msg) => write!(f, "chat template failed to render: {msg}"),
            Self::ContinueFinalMessage(msg) => write!(f, "continue_final_message: {msg}"),
        }
    }
}

impl std::error::Error for TemplateError {}

/// The tokenizer failed on a request's text or ids (the `tokenizers` crate's error, as text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizeError(pub String);

impl fmt::Display for TokenizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tokenizer: {}", self.0)
    }
}

impl std::error::Error for TokenizeError {}
