//! Safe media fetching for pdgate's multimodal path: the images a chat request names by URL
//! or carries inline. So far: inline media, and the per-hop judgement of a URL (`check_target`)
//! and of the addresses its host resolves to (`check_addrs`), pure and I/O-free.

mod address;
mod data_url;
mod error;
mod host;
mod policy;
mod target;

pub use address::{check_addrs, forbidden_reason};
pub use data_url::{decode_base64, decode_data_url};
pub use error::MediaError;
pub use host::Host;
pub use policy::{FetchPolicy, DEFAULT_MAX_BYTES, DEFAULT_MAX_REDIRECTS, DEFAULT_TIMEOUT};
pub use target::{check_target, Scheme, Target};

/// Fetched or decoded media.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Media {
    pub bytes: bytes::Bytes,
    /// The `Content-Type` the server sent, or the media type a `data:` URL declared; as given.
    pub content_type: Option<String>,
}
