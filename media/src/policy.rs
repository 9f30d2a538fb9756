//! What a media fetch is allowed to do: the one config model the gateway's flags
//! (`--mm-allowed-media-domains`, `--mm-allow-private-media-hosts`) are parsed into.

use std::time::Duration;

use crate::host::{parse_host, Host};

/// 20 MiB: the largest media a fetch or a data URL may yield unless configured otherwise.
pub const DEFAULT_MAX_BYTES: usize = 20 * 1024 * 1024;
/// The whole fetch, redirects included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_MAX_REDIRECTS: u8 = 3;

/// The rules every fetch obeys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchPolicy {
    /// `None`: any host that the address policy passes. `Some(list)`: only these hosts, on the
    /// first request and on every redirect hop. An entry `media.example.com` matches exactly that
    /// host; an entry `.example.com` or `*.example.com` matches every subdomain of
    /// `example.com` but not `example.com` itself (list both to allow both). Matching is
    /// case-insensitive and ignores a trailing dot. An IP-literal URL matches an entry holding
    /// the same address (in any spelling). Entries are normalised by
    /// [`FetchPolicy::parse_domains`]; a list built by hand should hold lower-case names.
    pub allowed_domains: Option<Vec<String>>,
    /// Turns the address policy off (loopback, private, link-local — cloud metadata included —
    /// and every other range in the README's table) and the `localhost` name rule. For a media
    /// server inside the cluster; pair it with `allowed_domains`.
    pub allow_private: bool,
    /// The largest media accepted, in bytes (decoded bytes for data URLs and base64).
    pub max_bytes: usize,
    /// Bounds the whole fetch: DNS, connect, TLS, headers, body, every redirect hop.
    pub timeout: Duration,
    /// Redirects followed before the fetch fails; 0 follows none.
    pub max_redirects: u8,
}

impl Default for FetchPolicy {
    fn default() -> Self {
        FetchPolicy {
            allowed_domains: None,
            allow_private: false,
            max_bytes: DEFAULT_MAX_BYTES,
            timeout: DEFAULT_TIMEOUT,
            max_redirects: DEFAULT_MAX_REDIRECTS,
        }
    }
}

impl FetchPolicy {
    /// Parses `--mm-allowed-media-domains`: a comma-separated list of hosts, each optionally
    /// prefixed by `.` or `*.` for "any subdomain of". Blank entries are skipped; an entry that
    /// is no valid host, or a list naming no host at all, is an error (the message says which
    /// entry). Entries come back normalised: lower case, no trailing dot, `*.` written as `.`,
    /// IP addresses in their canonical form.
    pub fn parse_domains(list: &str) -> Result<Vec<String>, String> {
        let mut domains = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (wildcard, name) = match entry.strip_prefix("*.") {
                Some(rest) => (true, rest),
                None => match entry.strip_prefix('.') {
                    Some(rest) => (true, rest),
                    None => (false, entry),
                },
            };
            let host = parse_host(name)
                .map_err(|e| format!("allowed media domain '{entry}': {e}"))?
                .host;
            let normal = match (&host, wildcard) {
                (Host::Ip(_), true) => {
                    return Err(format!(
                        "allowed media domain '{entry}': a wildcard needs a domain, not an address"
                    ))
                }
                (Host::Ip(ip), false) => ip.to_string(),
                (Host::Domain(name), true) => format!(".{name}"),
                (Host::Domain(name), false) => name.clone(),
            };
            domains.push(normal);
        }
        if domains.is_empty() {
            return Err("the allowed media domain list names no host".into());
        }
        Ok(domains)
    }

    /// Whether the domain list lets a fetch go to `host`.
    pub(crate) fn host_allowed(&self, host: &Host) -> bool {
        let Some(allowed) = &self.allowed_domains else {
            return true;
        };
        let name = match host {
            Host::Domain(name) => name.clone(),
            Host::Ip(ip) => ip.to_string(),
        };
        allowed.iter().any(|entry| {
            let entry = entry.trim_end_matches('.').to_ascii_lowercase();
            match entry.strip_prefix("*.").or_else(|| entry.strip_prefix('.')) {
                Some(parent) => name
                    .strip_suffix(parent)
                    .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
                None => name == entry,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(list: &str) -> FetchPolicy {
        FetchPolicy {
            allowed_domains: Some(FetchPolicy::parse_domains(list).unwrap()),
            ..FetchPolicy::default()
        }
    }

    fn allows(policy: &FetchPolicy, host: &str) -> bool {
        policy.host_allowed(&parse_host(host).unwrap().host)
    }

    #[test]
    fn domain_list_is_normalised() {
        assert_eq!(
            FetchPolicy::parse_domains(" Media.Test. , *.CDN.example.com,,.img.test, 0x7f.1 "),
            Ok(vec![
                "media.test".to_owned(),
                ".cdn.example.com".to_owned(),
                ".img.test".to_owned(),
                "127.0.0.1".to_owned(),
            ])
        );
    }

    #[test]
    fn domain_list_rejects_bad_entries_and_empty_lists() {
        assert!(FetchPolicy::parse_domains("").is_err());
        assert!(FetchPolicy::parse_domains(" , ").is_err());
        assert!(FetchPolicy::parse_domains("ok.test, bad host").is_err());
        assert!(FetchPolicy::parse_domains("*.10.0.0.1").is_err());
        assert!(FetchPolicy::parse_domains("a.*.test").is_err());
    }

    #[test]
    fn exact_entries_match_only_that_host_in_any_case_and_with_a_trailing_dot() {
        let p = policy("media.test");
        assert!(allows(&p, "media.test"));
        assert!(allows(&p, "MEDIA.Test."));
        assert!(!allows(&p, "sub.media.test"));
        assert!(!allows(&p, "evil.test"));
        assert!(!allows(&p, "media.test.evil.test"));
        assert!(!allows(&p, "xmedia.test"));
    }

    #[test]
    fn wildcard_entries_match_subdomains_only() {
        for list in [".example.com", "*.example.com"] {
            let p = policy(list);
            assert!(allows(&p, "img.example.com"), "{list}");
            assert!(allows(&p, "a.b.Example.com."), "{list}");
            assert!(!allows(&p, "example.com"), "{list}");
            assert!(!allows(&p, "badexample.com"), "{list}");
        }
    }

    #[test]
    fn address_entries_match_every_spelling_of_that_address() {
        let p = policy("127.0.0.1");
        assert!(allows(&p, "2130706433"));
        assert!(!allows(&p, "127.0.0.2"));
        assert!(allows(&FetchPolicy::default(), "anything.test"));
    }
}
