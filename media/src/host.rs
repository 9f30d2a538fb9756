//! URL host parsing, the WHATWG way for what matters here: every spelling of an IP address that
//! a browser or the `url` crate accepts (`2130706433`, `0x7f.1`, `0177.0.0.1`, `127.1`,
//! `%31%32%37.0.0.1`, `[::ffff:7f00:1]`) becomes the address it means, so the address policy
//! judges the address and not the spelling. Written here rather than taking `url` (not in the
//! tree): the host is the only part whose parsing the policy depends on.
//!
//! Stricter than WHATWG where leniency buys nothing for media: non-ASCII hosts (IDNA) must come
//! in their `xn--` form, and a domain may hold only letters, digits, `-`, `_` and dots.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::MediaError;

/// A URL's host after normalisation: a lower-case domain without its trailing dot, or an IP
/// address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    Domain(String),
    Ip(IpAddr),
}

impl fmt::Display for Host {
    /// The host as it goes into a URL or a `Host` header: IPv6 in brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Domain(name) => f.write_str(name),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

/// A parsed host and the IPv6 zone id it carried (`[fe80::1%25eth0]`), which the fetcher
/// refuses to use but the policy judges after the address.
pub(crate) struct ParsedHost {
    pub host: Host,
    pub zone: Option<String>,
}

/// Parses a URL's host (the authority without userinfo and port).
pub(crate) fn parse_host(raw: &str) -> Result<ParsedHost, MediaError> {
    if let Some(inner) = raw.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| bad(raw, "unclosed '['"))?;
        let (addr, zone) = match inner.split_once('%') {
            Some((addr, zone)) => (addr, Some(zone.to_owned())),
            None => (inner, None),
        };
        let ip: Ipv6Addr = addr.parse().map_err(|_| bad(raw, "not an IPv6 address"))?;
        return Ok(ParsedHost {
            host: Host::Ip(IpAddr::V6(ip)),
            zone,
        });
    }
    let decoded = percent_decode_host(raw)?;
    if decoded.is_empty() {
        return Err(MediaError::BadUrl("the URL has no host".into()));
    }
    if !decoded.is_ascii() {
        return Err(bad(raw, "non-ASCII host names must use their xn-- form"));
    }
    let lower = decoded.to_ascii_lowercase();
    if ends_in_a_number(&lower) {
        let ip = parse_ipv4(&lower).ok_or_else(|| bad(raw, "not an IPv4 address"))?;
        return Ok(ParsedHost {
            host: Host::Ip(IpAddr::V4(ip)),
            zone: None,
        });
    }
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    let valid = !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if !valid {
        return Err(bad(raw, "not a valid host name"));
    }
    Ok(ParsedHost {
        host: Host::Domain(name.to_owned()),
        zone: None,
    })
}

fn bad(raw: &str, why: &str) -> MediaError {
    // The raw host may hold anything the client typed: show a bounded, escaped piece of it.
    let shown: String = raw
        .chars()
        .take(64)
        .flat_map(char::escape_default)
        .collect();
    MediaError::BadUrl(format!("host '{shown}': {why}"))
}

fn percent_decode_host(raw: &str) -> Result<String, MediaError> {
    if !raw.contains('%') {
        return Ok(raw.to_owned());
    }
    let bytes = crate::data_url::percent_decode(raw.as_bytes());
    String::from_utf8(bytes).map_err(|_| bad(raw, "percent-encoded bytes are not UTF-8"))
}

/// WHATWG's "ends in a number": the last label (a trailing dot ignored) is all digits or a `0x`
/// hex number. Such a host is an IPv4 address or invalid, never a domain.
fn ends_in_a_number(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    let last = host.rsplit('.').next().unwrap_or(host);
    if !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    last.strip_prefix("0x")
        .is_some_and(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// WHATWG's IPv4 parser: one to four dot-separated parts, each decimal, `0x` hex or `0` octal;
/// the last part fills the remaining bytes (`127.1` = 127.0.0.1, `2130706433` = 127.0.0.1).
fn parse_ipv4(host: &str) -> Option<Ipv4Addr> {
    let host = host.strip_suffix('.').unwrap_or(host);
    let parts: Vec<&str> = host.split('.').collect();
    if parts.len() > 4 {
        return None;
    }
    let numbers = parts
        .iter()
        .map(|part| parse_ipv4_number(part))
        .collect::<Option<Vec<u64>>>()?;
    let (last, leading) = numbers.split_last()?;
    if leading.iter().any(|&n| n > 255) {
        return None;
    }
    let last_bytes = 4 - leading.len() as u32;
    if *last >= 1u64 << (8 * last_bytes) {
        return None;
    }
    let mut ip = *last;
    for (i, &n) in leading.iter().enumerate() {
        ip += n << (8 * (3 - i));
    }
    Some(Ipv4Addr::from(u32::try_from(ip).ok()?))
}

fn parse_ipv4_number(part: &str) -> Option<u64> {
    if part.is_empty() {
        return None;
    }
    let (digits, radix) = if let Some(hex) = part.strip_prefix("0x") {
        (hex, 16)
    } else if part.len() > 1 && part.starts_with('0') {
        (&part[1..], 8)
    } else {
        (part, 10)
    };
    if digits.is_empty() {
        return Some(0);
    }
    // Leading zeros cannot overflow; anything longer than this cannot fit in 32 bits.
    let digits = digits.trim_start_matches('0');
    if digits.len() > 32 {
        return None;
    }
    if digits.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(digits, radix).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(raw: &str) -> IpAddr {
        match parse_host(raw) {
            Ok(ParsedHost {
                host: Host::Ip(ip), ..
            }) => ip,
            Ok(ParsedHost { host, .. }) => panic!("{raw} parsed as {host}"),
            Err(e) => panic!("{raw}: {e}"),
        }
    }

    #[test]
    fn every_ipv4_spelling_becomes_the_address_it_means() {
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        for raw in [
            "127.0.0.1",
            "127.0.0.1.",
            "2130706433",
            "0x7f000001",
            "0X7F000001",
            "0x7f.1",
            "0177.0.0.1",
            "0177.0.0.01",
            "127.1",
            "127.0.1",
            "0x7f.0.0.0x1",
            "00000000000000000000000000000000177.0.0.1",
            "%31%32%37.0.0.1",
            "127%2E0.0.1",
        ] {
            assert_eq!(ip(raw), loopback, "{raw}");
        }
        assert_eq!(ip("0"), "0.0.0.0".parse::<IpAddr>().unwrap());
        assert_eq!(ip("0x"), "0.0.0.0".parse::<IpAddr>().unwrap());
        assert_eq!(
            ip("169.254.43518"),
            "169.254.169.254".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn hosts_that_end_in_a_number_but_are_no_ipv4_address_are_invalid() {
        for raw in [
            "1.2.3.4.5",
            "256.0.0.1",
            "1.2.3.256",
            "4294967296",
            "0x100000000",
            "09.0.0.1",
            "foo.0x1",
            "1..1",
            "999999999999999999999999999999999999",
        ] {
            assert!(
                matches!(parse_host(raw), Err(MediaError::BadUrl(_))),
                "{raw}"
            );
        }
    }

    #[test]
    fn ipv6_hosts_parse_in_brackets_with_their_zone_set_aside() {
        assert_eq!(ip("[::1]"), "::1".parse::<IpAddr>().unwrap());
        assert_eq!(
            ip("[::ffff:7f00:1]"),
            "::ffff:127.0.0.1".parse::<IpAddr>().unwrap()
        );
        let parsed = parse_host("[fe80::1%25eth0]").unwrap();
        assert_eq!(parsed.host, Host::Ip("fe80::1".parse().unwrap()));
        assert_eq!(parsed.zone.as_deref(), Some("25eth0"));
        assert!(parse_host("[::1").is_err());
        assert!(parse_host("[127.0.0.1]").is_err());
    }

    #[test]
    fn domains_are_lower_cased_without_their_trailing_dot() {
        let domain = |raw: &str| parse_host(raw).unwrap().host;
        assert_eq!(domain("LocalHost."), Host::Domain("localhost".into()));
        assert_eq!(
            domain("Media.Example.COM"),
            Host::Domain("media.example.com".into())
        );
        assert_eq!(domain("1.2.3.x"), Host::Domain("1.2.3.x".into()));
        for raw in ["", ".", "a..b", "a b", "a/b", "exämple.com", "a%00b", "a:b"] {
            assert!(parse_host(raw).is_err(), "{raw:?}");
        }
    }
}
