//! `ConfigError`: why a configuration was refused, worded for the operator who has to fix it.
//! Every error names where the bad value lives (a YAML key path and, for `gateway:` keys, the
//! equivalent `launch` flag), the value, and what would be accepted.

use std::fmt;

/// What went wrong, for callers that react differently (e.g. a reload keeps the old config on
/// any of them, but a metric label may want the kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigErrorKind {
    /// The file could not be read.
    Io,
    /// The text is not valid YAML/JSON, or a value has the wrong type or an unknown name.
    Parse,
    /// Parsed, but a value (or a combination) is refused.
    Invalid,
    /// An SMG option pdgate deliberately does not implement.
    Unsupported,
}

impl ConfigErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigErrorKind::Io => "io",
            ConfigErrorKind::Parse => "parse",
            ConfigErrorKind::Invalid => "invalid",
            ConfigErrorKind::Unsupported => "unsupported",
        }
    }
}

/// A refused configuration. `Display` is the whole actionable message (what `pdgate check`
/// prints): `<where>: <what is wrong and what to do>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    kind: ConfigErrorKind,
    /// Where the value lives, e.g. "gateway.decode_policy (--decode-policy)" or
    /// "gateway.workers[1].url". `None` for whole-file problems.
    location: Option<String>,
    message: String,
}

impl ConfigError {
    pub fn new(
        kind: ConfigErrorKind,
        location: Option<String>,
        message: impl Into<String>,
    ) -> Self {
        ConfigError {
            kind,
            location,
            message: message.into(),
        }
    }

    /// A refused value of a `gateway:` key (= a `launch` flag).
    pub fn invalid_key(key: &str, message: impl Into<String>) -> Self {
        Self::new(ConfigErrorKind::Invalid, Some(key_location(key)), message)
    }

    /// A refused value at an explicit location (worker spec fields, files).
    pub fn invalid_at(location: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ConfigErrorKind::Invalid, Some(location.into()), message)
    }

    pub fn parse(location: Option<String>, message: impl Into<String>) -> Self {
        Self::new(ConfigErrorKind::Parse, location, message)
    }

    pub fn unsupported(location: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ConfigErrorKind::Unsupported, Some(location.into()), message)
    }

    pub fn kind(&self) -> ConfigErrorKind {
        self.kind
    }

    pub fn location(&self) -> Option<&str> {
        self.location.as_deref()
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// Prefix the location with an outer path, e.g. a worker spec error inside
    /// `gateway.workers[2]` or inside a workers file.
    pub(crate) fn within(mut self, outer: &str) -> Self {
        self.location = Some(match self.location.take() {
            Some(inner) => format!("{outer}.{inner}"),
            None => outer.to_string(),
        });
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.location {
            Some(location) => write!(f, "{location}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// `gateway.<key> (--<flag>)`: the YAML key and the `launch` flag are the same setting.
pub(crate) fn key_location(key: &str) -> String {
    format!("gateway.{key} ({})", flag_name(key))
}

/// The `launch` flag spelling of a `gateway:` key.
pub(crate) fn flag_name(key: &str) -> String {
    format!("--{}", key.replace('_', "-"))
}
