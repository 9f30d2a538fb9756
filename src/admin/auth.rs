//! Who may call what. With an API key configured, serving routes and the whole worker API need
//! `Authorization: Bearer <key>` (as SMG). Without one, mutating admin calls are accepted only
//! from loopback peers, so a gateway on a public address cannot be reconfigured by a stranger.

use pingora::proxy::Session;

use crate::gateway::Settings;

/// Constant-time comparison, so the key cannot be guessed byte by byte from response times.
fn same(a: &[u8], b: &[u8]) -> bool {
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

/// An address block, `ip/prefix` (a bare IP is a /32 or /128).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpNet {
    addr: std::net::IpAddr,
    prefix: u8,
}

impl IpNet {
    pub fn parse(s: &str) -> Result<IpNet, String> {
        let (ip, prefix) = match s.split_once('/') {
            Some((ip, p)) => (ip, Some(p)),
            None => (s, None),
        };
        let addr: std::net::IpAddr = ip
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not an IP address or CIDR block"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("`{s}` has an invalid prefix length"))?,
            None => max,
        };
        Ok(IpNet { addr, prefix })
    }

    /// Loopback: `127.0.0.0/8` and `::1`.
    pub fn loopback() -> Vec<IpNet> {
        vec![
            IpNet::parse("127.0.0.0/8").expect("valid literal"),
            IpNet::parse("::1").expect("valid literal"),
        ]
    }

    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        let ip = match ip {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (std::net::IpAddr::V4(net), std::net::IpAddr::V4(ip)) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - self.prefix)
                };
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (std::net::IpAddr::V6(net), std::net::IpAddr::V6(ip)) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u128::MAX << (128 - self.prefix)
                };
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_block_contains_all_of_127_slash_8() {
        let nets = IpNet::loopback();
        for ip in ["127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1"] {
            let ip = ip.parse().unwrap();
            assert!(nets.iter().any(|n| n.contains(ip)), "{ip}");
        }
        assert!(!nets.iter().any(|n| n.contains("10.0.0.1".parse().unwrap())));
    }

    #[test]
    fn single_address_block_excludes_neighbours() {
        let n = IpNet::parse("127.0.0.1").unwrap();
        assert!(n.contains("127.0.0.1".parse().unwrap()));
        assert!(!n.contains("127.0.0.2".parse().unwrap()));
        assert!(IpNet::parse("10.0.0.0/33").is_err());
    }
}
