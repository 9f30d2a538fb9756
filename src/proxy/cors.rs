//! CORS (`--cors-allowed-origins`), as SMG 1.13.0 answers it (measured): off unless origins are
//! configured. With a list, every response carries `Vary: Origin` and the exposed headers, and
//! `Access-Control-Allow-Origin` echoes the request's `Origin` when it is listed; with `*`,
//! every response allows any origin. Any `OPTIONS` request is answered here as a preflight
//! (200, no body), with `Allow` naming the route's methods when the path is known.

use http::HeaderValue;
use pingora::http::ResponseHeader;

/// Headers a browser script may read from a response (list mode).
const EXPOSED: &str = "x-request-id,traceparent,tracestate";
/// Methods a preflight allows (list mode).
const METHODS: &str = "GET,POST,PATCH,DELETE,OPTIONS";
/// Request headers a preflight allows (list mode): SMG's set, plus the request-id and
/// routing-key headers pdgate honours.
const HEADERS: &str = "content-type,authorization,anthropic-version,anthropic-beta,traceparent,\
                       tracestate,x-request-id,x-smg-routing-key";
/// How long a browser may cache a preflight, seconds.
const MAX_AGE: &str = "3600";

/// The configured allowance.
#[derive(Clone, Debug, PartialEq)]
pub enum CorsPolicy {
    /// `*`: any origin.
    Any,
    /// These origins, exactly (`scheme://host[:port]`).
    Origins(Vec<HeaderValue>),
}

/// What one request's responses carry (decided once, from its `Origin`).
#[derive(Clone, Debug, PartialEq)]
pub enum CorsHeaders {
    Any,
    /// List mode; the origin to echo when the request's is listed.
    Listed(Option<HeaderValue>),
}

/// Checks one configured origin: `*` alone, or `scheme://host[:port]` with nothing after.
pub fn check_origin(origin: &str, count: usize) -> Result<(), String> {
    if origin == "*" {
        return if count == 1 {
            Ok(())
        } else {
            Err("`*` allows any origin and must be the only entry".into())
        };
    }
    let rest = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .ok_or_else(|| format!("'{origin}' is not an origin: expected http(s)://host[:port]"))?;
    if rest.is_empty()
        || rest.contains(['/', '?', '#', ' '])
        || HeaderValue::from_str(origin).is_err()
    {
        return Err(format!(
            "'{origin}' is not an origin: expected http(s)://host[:port] with no path"
        ));
    }
    Ok(())
}

impl CorsPolicy {
    /// `None` when no origin is configured (CORS off). The list was validated.
    pub fn from_config(origins: &[String]) -> Option<CorsPolicy> {
        match origins {
            [] => None,
            [any] if any == "*" => Some(CorsPolicy::Any),
            list => Some(CorsPolicy::Origins(
                list.iter()
                    .filter_map(|o| HeaderValue::from_str(o.trim_end_matches('/')).ok())
                    .collect(),
            )),
        }
    }

    pub fn for_request(&self, origin: Option<&HeaderValue>) -> CorsHeaders {
        match self {
            CorsPolicy::Any => CorsHeaders::Any,
            CorsPolicy::Origins(list) => CorsHeaders::Listed(
                origin
                    .filter(|o| {
                        list.iter()
                            .any(|l| l.as_bytes().eq_ignore_ascii_case(o.as_bytes()))
                    })
                    .cloned(),
            ),
        }
    }
}

/// Adds the response headers of `cors` (when CORS is on) to any response.
pub fn decorate(cors: Option<&CorsHeaders>, h: &mut ResponseHeader) -> pingora::Result<()> {
    match cors {
        None => {}
        Some(CorsHeaders::Any) => {
            h.insert_header("access-control-expose-headers", "*")?;
            h.insert_header("access-control-allow-origin", "*")?;
        }
        Some(CorsHeaders::Listed(origin)) => {
            h.append_header("vary", "origin")?;
            h.insert_header("access-control-expose-headers", EXPOSED)?;
            if let Some(origin) = origin {
                h.insert_header("access-control-allow-origin", origin.clone())?;
            }
        }
    }
    Ok(())
}

/// The headers a preflight answer adds to [`decorate`]'s (`allow`: the route's methods, when
/// the path is known).
pub fn preflight_headers(
    cors: &CorsHeaders,
    allow: Option<&'static str>,
) -> Vec<(&'static str, &'static str)> {
    let (methods, headers) = match cors {
        CorsHeaders::Any => ("*", "*"),
        CorsHeaders::Listed(_) => (METHODS, HEADERS),
    };
    let mut out = vec![
        ("access-control-allow-methods", methods),
        ("access-control-allow-headers", headers),
        ("access-control-max-age", MAX_AGE),
    ];
    if let Some(allow) = allow {
        out.push(("allow", allow));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_checked() {
        assert!(check_origin("*", 1).is_ok());
        assert!(check_origin("*", 2).is_err());
        assert!(check_origin("http://localhost:3000", 1).is_ok());
        assert!(check_origin("https://a.example", 2).is_ok());
        for bad in ["a.example", "http://", "https://a.example/app", "ftp://a"] {
            assert!(check_origin(bad, 1).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_listed_origin_is_echoed_and_others_are_not() {
        let p = CorsPolicy::from_config(&["http://a.example".into()]).unwrap();
        let a = HeaderValue::from_static("http://a.example");
        let b = HeaderValue::from_static("http://b.example");
        assert_eq!(
            p.for_request(Some(&a)),
            CorsHeaders::Listed(Some(a.clone()))
        );
        assert_eq!(p.for_request(Some(&b)), CorsHeaders::Listed(None));
        assert_eq!(p.for_request(None), CorsHeaders::Listed(None));
        assert_eq!(CorsPolicy::from_config(&[]), None);
        assert_eq!(
            CorsPolicy::from_config(&["*".into()])
                .unwrap()
                .for_request(None),
            CorsHeaders::Any
        );
    }
}
