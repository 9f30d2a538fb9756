//! A PD request as the legs see it: the client body parsed once, its facts, and the client
//! headers that travel on both legs.

use std::borrow::Cow;

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use pdgate_filters::{RequestFacts, Route, TopLevel};
use pingora::http::RequestHeader;

use crate::trace::LegSpan;

/// Client headers copied onto both legs, when their value is visible ASCII (SMG's list). Every
/// other client header (cookies, custom headers) stays at the gateway.
pub const FORWARDED_HEADERS: &[&str] = &[
    "authorization",
    "x-correlation-id",
    "traceparent",
    "tracestate",
    "x-smg-routing-key",
];

/// Headers sent on every leg, owned so a background leg task can keep them (cloning a
/// `HeaderValue` is a reference-count bump).
#[derive(Clone, Debug, Default)]
pub struct ForwardHeaders {
    items: Vec<(HeaderName, HeaderValue)>,
}

impl ForwardHeaders {
    /// Picks the forwarded headers of `req` and adds `x-request-id: request_id` (the client's or
    /// ours, `RequestCtx::engine_request_id`, so both legs and the engine logs share one id).
    pub fn from_client(req: &RequestHeader, request_id: &str) -> ForwardHeaders {
        let mut items = Vec::with_capacity(4);
        for (name, v) in req.headers.iter() {
            let n = name.as_str();
            let wanted = FORWARDED_HEADERS.contains(&n)
                || (n.len() > X_REQUEST_ID_EXT.len() && n.starts_with(X_REQUEST_ID_EXT));
            if wanted && is_visible_ascii(v.as_bytes()) {
                items.push((name.clone(), v.clone()));
            }
        }
        if let Ok(v) = HeaderValue::from_str(request_id) {
            items.push((HeaderName::from_static("x-request-id"), v));
        }
        ForwardHeaders { items }
    }

    /// The same headers with `x-request-id` replaced (a fan-out sample's own id).
    pub fn with_request_id(&self, request_id: &str) -> ForwardHeaders {
        let mut items: Vec<_> = self
            .items
            .iter()
            .filter(|(n, _)| n != "x-request-id")
            .cloned()
            .collect();
        if let Ok(v) = HeaderValue::from_str(request_id) {
            items.push((HeaderName::from_static("x-request-id"), v));
        }
        ForwardHeaders { items }
    }

    /// The headers one leg sends: these, or — when the leg is traced — these with the client's
    /// `traceparent` / `tracestate` replaced by the leg span's, so the engine's work is a child
    /// of that leg. Untraced, nothing is copied (the client's trace context goes on verbatim).
    pub fn traced(&self, span: Option<&LegSpan>) -> Cow<'_, ForwardHeaders> {
        let Some(span) = span else {
            return Cow::Borrowed(self);
        };
        let mut items: Vec<_> = self
            .items
            .iter()
            .filter(|(n, _)| n != "traceparent" && n != "tracestate")
            .cloned()
            .collect();
        items.push((
            HeaderName::from_static("traceparent"),
            span.traceparent().clone(),
        ));
        if let Some(state) = span.tracestate() {
            items.push((HeaderName::from_static("tracestate"), state.clone()));
        }
        Cow::Owned(ForwardHeaders { items })
    }

    pub fn as_slice(&self) -> &[(HeaderName, HeaderValue)] {
        &self.items
    }

    pub fn get(&self, name: &str) -> Option<&HeaderValue> {
        self.items.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// Every value of `name` (a client may send a header more than once).
    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a HeaderValue> + 'a {
        self.items
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, v)| v)
    }
}

const X_REQUEST_ID_EXT: &str = "x-request-id-";

fn is_visible_ascii(v: &[u8]) -> bool {
    !v.is_empty() && v.iter().all(|b| (0x20..0x7f).contains(b))
}

/// Routing inputs taken from the client request for the policies.
#[derive(Clone, Debug, Default)]
pub struct RoutingKeys {
    pub routing_key: Option<String>,
    pub target_worker: Option<String>,
    pub implicit_key: Option<String>,
    /// The routing prompt, extracted only when a leg's policy needs it.
    pub text: Option<String>,
    pub token_ids: Option<Vec<u32>>,
    /// A link canary's pinned (prefill id, decode id) (`workers::canary`).
    pub pinned: Option<(String, String)>,
}

/// Everything the legs need about the client request, computed once in `request_filter`.
pub struct PdRequest {
    pub route: Route,
    pub body: Bytes,
    pub top: TopLevel,
    pub facts: RequestFacts,
    pub forward: ForwardHeaders,
    pub routing: RoutingKeys,
}
