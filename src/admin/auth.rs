//! Who may call what. With an API key configured, serving routes and the whole worker API need
//! `Authorization: Bearer <key>` (as SMG). Without one, mutating admin calls are accepted only
//! from loopback peers, so a gateway on a public address cannot be reconfigured by a stranger.

use pingora::proxy::Session;

use crate::gateway::Settings;

pub use crate::config::IpNet;

/// Constant-time comparison, so the key cannot be guessed byte by byte from response times.
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// True when no key is configured, or the request carries it as a bearer token.
pub fn has_api_key(settings: &Settings, session: &Session) -> bool {
    let Some(key) = settings.api_key.as_deref() else {
        return true;
    };
    session
        .req_header()
        .headers
        .get_all(http::header::AUTHORIZATION)
        .iter()
        .any(|v| {
            let v = v.as_bytes();
            v.len() > 7
                && v[..7].eq_ignore_ascii_case(b"bearer ")
                && same(v[7..].trim_ascii(), key.as_bytes())
        })
}

/// Why a request was refused for its key, in SMG 1.13.0's words: none sent, or a wrong one.
pub fn key_refusal(session: &Session) -> &'static str {
    if session
        .req_header()
        .headers
        .contains_key(http::header::AUTHORIZATION)
    {
        "Invalid API key"
    } else {
        "Missing API key: send it as `Authorization: Bearer <key>`"
    }
}

/// The refusal of an admin call from a peer outside `admin_trusted` while no API key is set
/// (403 `forbidden`); `what` names the call (`reload is accepted`).
pub fn only_trusted(what: &str) -> String {
    format!("{what} only from trusted (loopback) peers when no api_key is configured")
}

/// May this request change the gateway's configuration?
/// With a key: the key. Without: only peers inside `admin_trusted` (default: loopback).
pub fn may_mutate(settings: &Settings, session: &Session) -> bool {
    if settings.api_key.is_some() {
        return has_api_key(settings, session);
    }
    session
        .client_addr()
        .and_then(|a| a.as_inet())
        .is_some_and(|a| {
            settings
                .admin_trusted
                .iter()
                .any(|net| net.contains(a.ip()))
        })
}
