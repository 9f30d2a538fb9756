//! One hop of a fetch, judged before any I/O: the URL parsed into a [`Target`] and checked
//! against the scheme rule, the `localhost` names, the domain list and (for IP literals) the
//! address policy. The same check runs on the client's URL and on every redirect's `Location`.

use std::fmt;

use crate::address::forbidden_reason;
use crate::host::{parse_host, Host};
use crate::{FetchPolicy, MediaError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

/// An http(s) URL that passed [`check_target`]: where to connect and what to ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub scheme: Scheme,
    pub host: Host,
    pub port: u16,
    /// The request target: starts with `/`, no fragment, only characters valid in an HTTP
    /// request line (others percent-encoded).
    pub path_and_query: String,
}

impl Target {
    /// The `Host` header's value: the port only when it is not the scheme's default.
    pub fn authority(&self) -> String {
        if self.port == self.scheme.default_port() {
            self.host.to_string()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Resolves a redirect's `Location` (absolute, scheme-relative, absolute-path, query-only
    /// or relative-path) against this URL into an absolute URL string, which the caller checks
    /// again with [`check_target`]. Dot segments are left for the server to resolve.
    pub fn join(&self, location: &str) -> String {
        let location = location.trim();
        if scheme_of(location).is_some() {
            return location.to_owned();
        }
        if location.starts_with("//") || location.starts_with("\\\\") {
            return format!("{}:{location}", self.scheme.as_str());
        }
        let origin = format!("{}://{}", self.scheme.as_str(), self.authority());
        let path = self
            .path_and_query
            .split_once('?')
            .map_or(&self.path_and_query[..], |(path, _)| path);
        let location = location.split_once('#').map_or(location, |(l, _)| l);
        if location.starts_with('/') || location.starts_with('\\') {
            format!("{origin}{location}")
        } else if location.is_empty() {
            format!("{origin}{}", self.path_and_query)
        } else if location.starts_with('?') {
            format!("{origin}{path}{location}")
        } else {
            let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
            format!("{origin}{dir}{location}")
        }
    }
}

impl fmt::Display for Target {
    /// Scheme, host and port only: paths and queries can carry signed tokens, and this is what
    /// error messages and logs show.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme.as_str(), self.authority())
    }
}

/// Host names that mean this machine whatever DNS says (RFC 6761 `localhost` and its
/// subdomains, and the names Linux distributions put in `/etc/hosts`): refused by name, before
/// any resolution.
fn is_local_name(name: &str) -> bool {
    name == "localhost"
        || name.ends_with(".localhost")
        || name == "localhost.localdomain"
        || name == "ip6-localhost"
        || name == "ip6-loopback"
}

/// Parses and judges one hop. `data:` URLs are refused here: they are decoded by the caller for
/// the client's own URL, and a redirect to one is not followed.
pub fn check_target(url: &str, policy: &FetchPolicy) -> Result<Target, MediaError> {
    let (target, zone) = parse_url(url)?;
    if !policy.allow_private {
        match &target.host {
            Host::Domain(name) if is_local_name(name) => {
                return Err(MediaError::Refused(format!("host {name} is this machine")));
            }
            Host::Ip(ip) => {
                if let Some(why) = forbidden_reason(*ip) {
                    return Err(MediaError::Refused(format!(
                        "host {} is {why}",
                        target.host
                    )));
                }
            }
            Host::Domain(_) => {}
        }
    }
    if !policy.host_allowed(&target.host) {
        return Err(MediaError::Refused(format!(
            "host {} is not in the allowed media domains",
            target.host
        )));
    }
    if zone.is_some() {
        return Err(MediaError::BadUrl(format!(
            "host {}: IPv6 zone ids are not supported",
            target.host
        )));
    }
    Ok(target)
}

/// The URL's scheme, lower-cased, if it starts with one (`ALPHA *( ALPHA / DIGIT / "+" / "-" /
/// "." ) ":"`).
fn scheme_of(url: &str) -> Option<String> {
    let (scheme, _) = url.split_once(':')?;
    let mut bytes = scheme.bytes();
    let first = bytes.next()?;
    (first.is_ascii_alphabetic()
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'-' || b == b'.'))
    .then(|| scheme.to_ascii_lowercase())
}

/// Splits an absolute http(s) URL into its target, plus the IPv6 zone id if it had one.
/// Like WHATWG for special schemes: any run of `/` or `\` may follow the scheme, `\` ends the
/// authority, the fragment is dropped. Stricter: credentials in the URL are refused (they would
/// be sent nowhere, and `http://good.test@evil.test/` exists to mislead), and so are spaces and
/// control characters.
fn parse_url(url: &str) -> Result<(Target, Option<String>), MediaError> {
    let url = url.trim_matches(|c: char| c.is_ascii_whitespace() || c.is_ascii_control());
    if url
        .chars()
        .any(|c| c.is_ascii_whitespace() || c.is_ascii_control())
    {
        return Err(MediaError::BadUrl(
            "the URL contains spaces or control characters".into(),
        ));
    }
    let scheme =
        scheme_of(url).ok_or_else(|| MediaError::BadUrl("the URL has no scheme".into()))?;
    let scheme = match scheme.as_str() {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        "data" => {
            return Err(MediaError::Refused(
                "a data: URL is only accepted as the request's own media, not as a redirect".into(),
            ))
        }
        other => {
            let shown: String = other.chars().take(16).collect();
            return Err(MediaError::Refused(format!(
                "scheme '{shown}:' is not fetched (only http, https and data)"
            )));
        }
    };
    let rest = &url[url.find(':').map_or(0, |i| i + 1)..];
    let rest = rest.trim_start_matches(['/', '\\']);
    let end = rest.find(['/', '\\', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    if authority.contains('@') {
        return Err(MediaError::BadUrl(
            "credentials in media URLs are not supported".into(),
        ));
    }
    let (host_text, port_text) = split_port(authority);
    let parsed = parse_host(host_text)?;
    let port = match port_text {
        None | Some("") => scheme.default_port(),
        Some(digits) => digits
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0 && digits.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| MediaError::BadUrl(format!("host {}: invalid port", parsed.host)))?,
    };
    let tail = tail.split_once('#').map_or(tail, |(before, _)| before);
    Ok((
        Target {
            scheme,
            host: parsed.host,
            port,
            path_and_query: request_target(tail),
        },
        parsed.zone,
    ))
}

/// `host[:port]`, with IPv6 brackets respected.
fn split_port(authority: &str) -> (&str, Option<&str>) {
    if authority.starts_with('[') {
        return match authority.find(']') {
            Some(close) => {
                let (host, after) = authority.split_at(close + 1);
                match after.strip_prefix(':') {
                    Some(port) => (host, Some(port)),
                    // Anything else after `]` fails the port check.
                    None if after.is_empty() => (host, None),
                    None => (host, Some(after)),
                }
            }
            None => (authority, None),
        };
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (authority, None),
    }
}

/// Path and query as an HTTP request target: a leading `/`, `\` read as `/` in the path (as
/// browsers do), and bytes that may not appear in a request line percent-encoded.
fn request_target(tail: &str) -> String {
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (tail, None),
    };
    let mut out = String::with_capacity(tail.len() + 1);
    if !path.starts_with(['/', '\\']) {
        out.push('/');
    }
    let push = |out: &mut String, b: u8| {
        let allowed = b.is_ascii_alphanumeric() || b"-._~:/?#[]@!$&'()*+,;=%".contains(&b);
        if allowed {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    };
    for b in path.bytes() {
        push(&mut out, if b == b'\\' { b'/' } else { b });
    }
    if let Some(query) = query {
        out.push('?');
        for b in query.bytes() {
            push(&mut out, b);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strict() -> FetchPolicy {
        FetchPolicy::default()
    }

    fn refused(url: &str, policy: &FetchPolicy) -> bool {
        matches!(check_target(url, policy), Err(MediaError::Refused(_)))
    }

    #[test]
    fn only_http_and_https_are_fetched() {
        for url in [
            "file:///etc/passwd",
            "FILE:///etc/passwd",
            "ftp://files.test/a.png",
            "gopher://media.test:70/1",
            "dict://media.test:11211/",
            "javascript:alert(1)",
            "data:image/png;base64,AAAA",
        ] {
            assert!(refused(url, &strict()), "{url}");
            assert!(
                refused(
                    url,
                    &FetchPolicy {
                        allow_private: true,
                        ..strict()
                    }
                ),
                "{url}"
            );
        }
        assert!(check_target("HTTPS://media.test/a.png", &strict()).is_ok());
        assert!(matches!(
            check_target("media.test/a.png", &strict()),
            Err(MediaError::BadUrl(_))
        ));
    }

    #[test]
    fn forbidden_hosts_are_refused_in_every_spelling() {
        for url in [
            "http://127.0.0.1/",
            "http://localhost/",
            "http://LocalHost./",
            "http://foo.localhost/",
            "http://localhost.localdomain/",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://0177.0.0.1/",
            "http://127.1/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:7f00:1]/",
            "http://[64:ff9b::7f00:1]/",
            "http://[2002:7f00:1::]/",
            "http://169.254.169.254/latest/meta-data",
            "http://10.0.0.1/",
            "http://[fe80::1%25eth0]/",
            "http://0.0.0.0/",
            "http://[::]/",
            "http://%31%32%37.0.0.1/",
            "http:127.0.0.1/",
            "http:\\\\127.0.0.1\\",
            "https://192.168.0.1:8443/x",
        ] {
            assert!(refused(url, &strict()), "{url}");
        }
    }

    #[test]
    fn allow_private_lets_private_hosts_through_but_not_zone_ids() {
        let open = FetchPolicy {
            allow_private: true,
            ..strict()
        };
        for url in [
            "http://127.0.0.1:8080/",
            "http://localhost/",
            "http://[::1]/",
        ] {
            assert!(check_target(url, &open).is_ok(), "{url}");
        }
        assert!(matches!(
            check_target("http://[fe80::1%25eth0]/", &open),
            Err(MediaError::BadUrl(_))
        ));
    }

    #[test]
    fn urls_split_into_host_port_and_request_target() {
        let t = check_target(
            "HTTP://Media.TEST:8080/a b/../c.png?x=1&y=\"2\"#frag",
            &strict(),
        );
        // Spaces are refused outright; the rest of the path's oddities are encoded.
        assert!(matches!(t, Err(MediaError::BadUrl(_))));
        let t = check_target(
            "http://Media.TEST:8080/a\\c|.png?x=1&y=\"2\"#frag",
            &strict(),
        )
        .unwrap();
        assert_eq!(t.host, Host::Domain("media.test".into()));
        assert_eq!(t.port, 8080);
        assert_eq!(t.path_and_query, "/a/c%7C.png?x=1&y=%222%22");
        assert_eq!(t.to_string(), "http://media.test:8080");
        let t = check_target("https://media.test", &strict()).unwrap();
        assert_eq!((t.port, &t.path_and_query[..]), (443, "/"));
        assert_eq!(t.authority(), "media.test");
        let t = check_target("http://[2606:4700::1]:81/x", &strict()).unwrap();
        assert_eq!(t.authority(), "[2606:4700::1]:81");
        for url in [
            "http://media.test:99999/",
            "http://media.test:0/",
            "http://media.test:+80/",
            "http://media.test:8o/",
            "http://user:pw@media.test/",
            "http://media.test@127.0.0.1/",
            "http://",
            "http://?x",
            "http://[2606:4700::1]x/",
        ] {
            assert!(
                matches!(check_target(url, &strict()), Err(MediaError::BadUrl(_))),
                "{url}"
            );
        }
    }

    #[test]
    fn redirect_locations_resolve_against_the_current_url() {
        let base = check_target("http://media.test:8080/img/a.png?sig=1", &strict()).unwrap();
        assert_eq!(base.join("https://cdn.test/b"), "https://cdn.test/b");
        assert_eq!(base.join("//cdn.test/b"), "http://cdn.test/b");
        assert_eq!(base.join("/b.png"), "http://media.test:8080/b.png");
        assert_eq!(base.join("b.png"), "http://media.test:8080/img/b.png");
        assert_eq!(
            base.join("?sig=2"),
            "http://media.test:8080/img/a.png?sig=2"
        );
        assert_eq!(base.join(""), "http://media.test:8080/img/a.png?sig=1");
    }

    #[test]
    fn redirect_hops_are_judged_like_the_first_url() {
        let base = check_target("https://public.test/a.png", &strict()).unwrap();
        for location in [
            "http://127.0.0.1/",
            "http://169.254.169.254/latest/meta-data/iam",
            "//localhost/x",
            "http://[::ffff:10.0.0.1]/",
            "file:///etc/passwd",
            "data:image/png;base64,AAAA",
        ] {
            assert!(refused(&base.join(location), &strict()), "{location}");
        }
        let listed = FetchPolicy {
            allowed_domains: Some(vec!["public.test".into()]),
            ..strict()
        };
        assert!(check_target(&base.join("/b.png"), &listed).is_ok());
        assert!(refused(&base.join("https://evil.test/b.png"), &listed));
    }
}
