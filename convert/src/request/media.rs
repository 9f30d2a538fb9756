//! Images in a conversation: each image part or block is taken out of the message (in prompt
//! order) as a [`MediaRef`] and replaced by `{"type": "image"}`, the part Hugging Face vision
//! chat templates write their image placeholder for. Fetching, decoding and preprocessing are
//! the gateway's (`pdgate-media`, `pdgate-mm`); this only reads the client's shapes:
//!
//! * OpenAI chat: `{"type": "image_url", "image_url": {"url": "…", "detail": …}}` (or
//!   `"image_url": "…"`): `http(s)://` or `data:` URLs.
//! * Anthropic: `{"type": "image", "source": {"type": "base64", "media_type", "data"}}` or
//!   `{"source": {"type": "url", "url"}}`.
//!
//! Audio, video and files stay [`Feature::Multimodal`] refusals.

use serde_json::{json, Value};

use super::RequestError;

/// Where an image comes from, as the client gave it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum MediaSource {
    /// An `http(s)://` or `data:` URL.
    Url(String),
    /// Anthropic base64 data with its declared media type.
    Base64 { media_type: String, data: String },
}

/// One image of the request, in prompt order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MediaRef {
    pub source: MediaSource,
}

impl MediaRef {
    /// The source as a URL (base64 blocks as a `data:` URL), for engines that fetch media
    /// themselves (vLLM's `media_refs`).
    pub fn url(&self) -> String {
        match &self.source {
            MediaSource::Url(u) => u.clone(),
            MediaSource::Base64 { media_type, data } => format!("data:{media_type};base64,{data}"),
        }
    }
}

/// The part a template sees in place of an image.
pub(super) fn template_part() -> Value {
    json!({"type": "image"})
}

/// An OpenAI `image_url` part's URL.
pub(super) fn openai_image(part: &Value, field: &str) -> Result<MediaRef, RequestError> {
    let url = match part.get("image_url") {
        Some(Value::String(u)) => Some(u.as_str()),
        Some(Value::Object(o)) => o.get("url").and_then(Value::as_str),
        _ => None,
    };
    match url {
        Some(u) if !u.is_empty() => Ok(MediaRef {
            source: MediaSource::Url(u.to_string()),
        }),
        _ => Err(RequestError::field(
            format!("{field}.image_url"),
            "an object with a non-empty string `url`",
        )),
    }
}

/// An Anthropic `image` block's source.
pub(super) fn anthropic_image(block: &Value, field: &str) -> Result<MediaRef, RequestError> {
    let source = block.get("source");
    let text = |key: &str| {
        source
            .and_then(|s| s.get(key))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let bad = |what: &'static str| RequestError::field(format!("{field}.source"), what);
    match text("type") {
        Some("base64") => match (text("media_type"), text("data")) {
            (Some(m), Some(d)) => Ok(MediaRef {
                source: MediaSource::Base64 {
                    media_type: m.to_string(),
                    data: d.to_string(),
                },
            }),
            _ => Err(bad("a base64 source with string `media_type` and `data`")),
        },
        Some("url") => text("url")
            .map(|u| MediaRef {
                source: MediaSource::Url(u.to_string()),
            })
            .ok_or_else(|| bad("a url source with a string `url`")),
        _ => Err(bad("an object whose `type` is `base64` or `url`")),
    }
}
