//! The one error type of a media fetch. Its messages are shown to API clients: they name the
//! URL's host and the rule or failure, never a response body and never more of the URL than the
//! host (query strings can carry signed tokens).

use std::fmt;

/// Why a media URL gave no media.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediaError {
    /// The policy said no: a scheme other than http/https/data, a host outside the allowed
    /// domains, a name or address that is loopback, private, link-local or otherwise forbidden.
    Refused(String),
    /// The fetch itself failed: DNS, connect, TLS, an HTTP status other than 2xx, a broken
    /// response, too many redirects.
    Fetch(String),
    /// The media is larger than the policy's `max_bytes` (announced or actually sent).
    TooLarge { limit: usize },
    /// The whole fetch (connect, TLS, headers, body, every redirect) outlasted the policy's
    /// `timeout`.
    Timeout,
    /// The URL does not parse (bad host, port, characters, credentials in the URL).
    BadUrl(String),
    /// A `data:` URL or base64 payload that does not decode.
    BadData(String),
}

impl fmt::Display for MediaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MediaError::Refused(why) => write!(f, "media URL refused: {why}"),
            MediaError::Fetch(why) => write!(f, "media fetch failed: {why}"),
            MediaError::TooLarge { limit } => {
                write!(f, "media is larger than the limit of {limit} bytes")
            }
            MediaError::Timeout => f.write_str("media fetch timed out"),
            MediaError::BadUrl(why) => write!(f, "invalid media URL: {why}"),
            MediaError::BadData(why) => write!(f, "invalid inline media data: {why}"),
        }
    }
}

impl std::error::Error for MediaError {}
