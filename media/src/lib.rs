//! Safe media fetching for pdgate's multimodal path: the images a chat request names by URL
//! or carries inline. This first piece decodes inline media (`data:` URLs, base64 blocks).

mod data_url;
mod error;

pub use data_url::{decode_base64, decode_data_url};
pub use error::MediaError;

/// Fetched or decoded media.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Media {
    pub bytes: bytes::Bytes,
    /// The `Content-Type` the server sent, or the media type a `data:` URL declared; as given.
    pub content_type: Option<String>,
}
