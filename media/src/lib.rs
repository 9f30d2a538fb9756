//! Safe media fetching for pdgate's multimodal path: the images a chat request names by URL
//! (OpenAI `image_url.url`, Anthropic `image` blocks with a `url` or `base64` source).
//!
//! A client-supplied URL fetched from inside a GPU fleet is a server-side request forgery
//! surface, so the contract is about what a fetch will NOT do:
//!
//! - Schemes: only `http`, `https` and `data` ([`MediaError::Refused`] otherwise). `data:` is
//!   decoded in memory, never followed from a redirect.
//! - Hosts: with [`FetchPolicy::allowed_domains`] set, only listed hosts, on the first hop and
//!   on every redirect hop.
//! - Addresses (unless [`FetchPolicy::allow_private`]): never loopback, private, link-local
//!   (cloud metadata), CGNAT, multicast, reserved, documentation or benchmarking addresses, nor
//!   an IPv6 address that carries one of those IPv4 addresses (mapped, compatible, NAT64, 6to4);
//!   `localhost` and its subdomains are refused by name before any DNS. IP literals are judged
//!   in every spelling URL parsers accept (`2130706433`, `0x7f.1`, `0177.0.0.1`, `127.1`).
//! - DNS: resolved once per hop; the hop is refused if ANY resolved address is forbidden; the
//!   connection goes to a judged address, never to a second resolution (no DNS rebinding).
//!   HTTPS verifies the certificate against the URL's host name.
//! - Bounds: at most [`FetchPolicy::max_bytes`] (a larger Content-Length is refused before the
//!   body is read; a streamed body is cut at the limit), at most
//!   [`FetchPolicy::max_redirects`] redirects, and one [`FetchPolicy::timeout`] for the whole
//!   fetch. A final status other than 2xx is a [`MediaError::Fetch`].
//! - Errors name the URL's host and the rule, never a response body nor the URL's path or
//!   query. Logging is at debug level and never includes bodies.
//!
//! What the bytes are (an image? which format?) is the caller's question: `Media` carries the
//! bytes and the content type as sent.

mod address;
mod data_url;
mod error;
mod fetch;
mod host;
mod policy;
mod target;

pub use address::{check_addrs, forbidden_reason};
pub use data_url::{decode_base64, decode_data_url};
pub use error::MediaError;
pub use fetch::{BoxFuture, Fetcher, Resolve, SystemResolver};
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
