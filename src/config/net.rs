//! Address blocks for access rules (`admin_trusted`).

/// An address block, `ip/prefix` (a bare IP is a /32 or /128).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
