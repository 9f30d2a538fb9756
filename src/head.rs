//! The heads of the responses the gateway writes itself (replies, streamed answers), built
//! straight into `http`'s parts. Pingora's `insert_header` re-parses every name and copies every
//! value, two allocations a header; here the names are constants and a value is copied only when
//! it is the request's own (its id, a length), so a head costs its map and those values.
//!
//! Such a head has no header-case map: Pingora writes the well-known names title-cased and the
//! others as given (lowercase), which HTTP clients read alike.

use http::header::{HeaderName, HeaderValue};
use http::StatusCode;
use pingora::http::ResponseHeader;

pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub const X_SMG_ROUTED_WORKER_ID: HeaderName = HeaderName::from_static("x-smg-routed-worker-id");
pub const X_SMG_ERROR_CODE: HeaderName = HeaderName::from_static("x-smg-error-code");

/// The headers Pingora's writer adds to every head (`date`, `connection`): room is kept for
/// them so the map never grows while the head is written.
const ADDED_BY_PINGORA: usize = 2;

/// A response head under construction.
pub struct Head(http::response::Parts);

/// A response head with `status` and no headers (its map allocates nothing until one is
/// added): what a head is built from, here and in the legs' parser.
pub fn bare(status: StatusCode) -> http::response::Parts {
    let mut parts = http::Response::new(()).into_parts().0;
    parts.status = status;
    parts
}

impl Head {
    /// A head with room for `headers` headers (and Pingora's own).
    pub fn new(status: u16, headers: usize) -> pingora::Result<Head> {
        let status = StatusCode::from_u16(status).map_err(|_| {
            pingora::Error::explain(
                pingora::ErrorType::InvalidHTTPHeader,
                format!("invalid status {status}"),
            )
        })?;
        let mut parts = bare(status);
        parts.headers.reserve(headers + ADDED_BY_PINGORA);
        Ok(Head(parts))
    }

    pub fn insert(&mut self, name: HeaderName, value: HeaderValue) {
        self.0.headers.insert(name, value);
    }

    pub fn append(&mut self, name: HeaderName, value: HeaderValue) {
        self.0.headers.append(name, value);
    }

    /// `x-request-id`, when the request has one that is a valid header value (a client's id
    /// was checked on the way in; a minted one is ASCII).
    pub fn request_id(&mut self, id: &str) {
        if id.is_empty() {
            return;
        }
        if let Some(v) = value(id) {
            self.insert(X_REQUEST_ID, v);
        }
    }

    pub fn finish(self) -> ResponseHeader {
        ResponseHeader::from(self.0)
    }
}

/// A decimal header value (`content-length`, `retry-after`): one allocation, where
/// `HeaderValue::from(u64)` makes two.
pub fn number(n: u64) -> HeaderValue {
    let mut buf = [0u8; 20];
    HeaderValue::from_str(pdgate_filters::json::decimal(n, &mut buf))
        .expect("digits are a valid header value")
}

/// A header value from text that may not be one (an engine's, a URL): `None` when it has
/// bytes a header cannot carry.
pub fn value(text: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_written_in_decimal() {
        for n in [0u64, 7, 10, 407, 1_000_000, u64::MAX] {
            assert_eq!(number(n).to_str().unwrap(), n.to_string());
        }
    }

    #[test]
    fn a_head_keeps_its_status_and_headers_and_room_for_pingoras() {
        let mut h = Head::new(201, 2).unwrap();
        h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("a/b"));
        h.request_id("req-1");
        h.request_id("");
        let h = h.finish();
        assert_eq!(h.status.as_u16(), 201);
        assert_eq!(h.headers.get("x-request-id").unwrap(), "req-1");
        assert_eq!(h.headers.len(), 2);
        assert!(h.headers.capacity() >= 4);
        assert!(Head::new(1000, 0).is_err());
    }

    #[test]
    fn every_error_code_is_a_static_header_value() {
        // `reply::send` writes `x-smg-error-code` with `HeaderValue::from_static`, which panics
        // on a byte a header cannot carry.
        for c in pdgate_filters::errors::ErrorCode::ALL {
            assert_eq!(HeaderValue::from_static(c.as_str()), c.as_str());
        }
    }

    #[test]
    fn an_id_that_is_not_a_header_value_is_left_out() {
        let mut h = Head::new(200, 1).unwrap();
        h.request_id("bad\nid");
        assert!(h.finish().headers.is_empty());
    }
}
