//! The address policy: which IP addresses a media fetch may never connect to (unless the
//! operator allows private hosts). One table per family; IPv6 forms that carry an IPv4 address
//! (mapped, compatible, NAT64, 6to4) are judged by the address they carry, so
//! `::ffff:127.0.0.1` is loopback like `127.0.0.1`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::{FetchPolicy, MediaError};

/// (network, prefix length, why it is refused). Sources: the IANA IPv4 Special-Purpose Address
/// Registry (RFC 6890 and updates), plus multicast and the old class E.
const FORBIDDEN_V4: &[([u8; 4], u8, &str)] = &[
    ([0, 0, 0, 0], 8, "a 'this network' address (0.0.0.0/8)"),
    ([10, 0, 0, 0], 8, "a private address (10.0.0.0/8)"),
    (
        [100, 64, 0, 0],
        10,
        "a carrier-grade NAT address (100.64.0.0/10)",
    ),
    ([127, 0, 0, 0], 8, "a loopback address (127.0.0.0/8)"),
    (
        [169, 254, 0, 0],
        16,
        "a link-local address (169.254.0.0/16, cloud metadata)",
    ),
    ([172, 16, 0, 0], 12, "a private address (172.16.0.0/12)"),
    (
        [192, 0, 0, 0],
        24,
        "an IETF protocol address (192.0.0.0/24)",
    ),
    ([192, 0, 2, 0], 24, "a documentation address (192.0.2.0/24)"),
    (
        [192, 88, 99, 0],
        24,
        "a 6to4 relay address (192.88.99.0/24)",
    ),
    ([192, 168, 0, 0], 16, "a private address (192.168.0.0/16)"),
    (
        [198, 18, 0, 0],
        15,
        "a benchmarking address (198.18.0.0/15)",
    ),
    (
        [198, 51, 100, 0],
        24,
        "a documentation address (198.51.100.0/24)",
    ),
    (
        [203, 0, 113, 0],
        24,
        "a documentation address (203.0.113.0/24)",
    ),
    ([224, 0, 0, 0], 4, "a multicast address (224.0.0.0/4)"),
    (
        [240, 0, 0, 0],
        4,
        "a reserved or broadcast address (240.0.0.0/4)",
    ),
];

/// IPv6 networks refused outright. The IPv4-carrying forms are not here: [`forbidden_reason`]
/// unwraps them first.
const FORBIDDEN_V6: &[([u16; 8], u8, &str)] = &[
    (
        [0, 0, 0, 0, 0, 0, 0, 0],
        128,
        "the unspecified address (::)",
    ),
    ([0, 0, 0, 0, 0, 0, 0, 1], 128, "the loopback address (::1)"),
    (
        [0x64, 0xff9b, 1, 0, 0, 0, 0, 0],
        48,
        "a local-use NAT64 address (64:ff9b:1::/48)",
    ),
    (
        [0x100, 0, 0, 0, 0, 0, 0, 0],
        64,
        "a discard-only address (100::/64)",
    ),
    // Teredo hides its IPv4 addresses (one of them XOR-ed): refused, not unwrapped.
    (
        [0x2001, 0, 0, 0, 0, 0, 0, 0],
        32,
        "a Teredo address (2001::/32)",
    ),
    (
        [0x2001, 2, 0, 0, 0, 0, 0, 0],
        48,
        "a benchmarking address (2001:2::/48)",
    ),
    (
        [0x2001, 0xdb8, 0, 0, 0, 0, 0, 0],
        32,
        "a documentation address (2001:db8::/32)",
    ),
    (
        [0x3fff, 0, 0, 0, 0, 0, 0, 0],
        20,
        "a documentation address (3fff::/20)",
    ),
    (
        [0xfc00, 0, 0, 0, 0, 0, 0, 0],
        7,
        "a unique-local (private) address (fc00::/7)",
    ),
    (
        [0xfe80, 0, 0, 0, 0, 0, 0, 0],
        10,
        "a link-local address (fe80::/10)",
    ),
    (
        [0xfec0, 0, 0, 0, 0, 0, 0, 0],
        10,
        "a site-local address (fec0::/10)",
    ),
    (
        [0xff00, 0, 0, 0, 0, 0, 0, 0],
        8,
        "a multicast address (ff00::/8)",
    ),
];

/// Why the address policy refuses `ip`, or `None` when a media fetch may connect to it.
pub fn forbidden_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => forbidden_v4(v4),
            None => forbidden_v6(v6),
        },
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let bits = u32::from(ip);
    FORBIDDEN_V4.iter().find_map(|&(net, len, why)| {
        let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
        (bits & mask == u32::from_be_bytes(net) & mask).then_some(why)
    })
}

fn forbidden_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let bits = u128::from(ip);
    FORBIDDEN_V6.iter().find_map(|&(net, len, why)| {
        let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
        (bits & mask == u128::from(Ipv6Addr::from(net)) & mask).then_some(why)
    })
}

/// The IPv4 address an IPv6 address stands for, where the packet would really go to (or come
/// from) that IPv4 host: IPv4-mapped `::ffff:a.b.c.d`, IPv4-translated `::ffff:0:a.b.c.d`,
/// IPv4-compatible `::a.b.c.d` (deprecated; `::` and `::1` excluded, they are IPv6's own),
/// NAT64 `64:ff9b::a.b.c.d`, and 6to4 `2002:AABB:CCDD::/48`.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] | [0, 0, 0, 0, 0xffff, 0, _, _] => Some(low),
        [0, 0, 0, 0, 0, 0, 0, 0 | 1] => None,
        [0, 0, 0, 0, 0, 0, _, _] => Some(low),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(low),
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::new(
            (hi >> 8) as u8,
            hi as u8,
            (lo >> 8) as u8,
            lo as u8,
        )),
        _ => None,
    }
}

/// Judges every address a host resolved to. Refuses if ANY of them is forbidden, not only the
/// one that would be dialled: a name that answers with a public and a private address is a
/// rebinding setup, and which one a client picks is not ours to bet on. Passes everything when
/// the policy allows private hosts. An empty list is a fetch error (nothing to connect to).
pub fn check_addrs(addrs: &[SocketAddr], policy: &FetchPolicy) -> Result<(), MediaError> {
    if addrs.is_empty() {
        return Err(MediaError::Fetch("the host resolved to no address".into()));
    }
    if policy.allow_private {
        return Ok(());
    }
    for addr in addrs {
        if let Some(why) = forbidden_reason(addr.ip()) {
            return Err(MediaError::Refused(format!("{} is {why}", addr.ip())));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> bool {
        forbidden_reason(text.parse().unwrap()).is_some()
    }

    #[test]
    fn every_forbidden_ipv4_range_is_refused_at_both_ends() {
        for (net, len, _) in FORBIDDEN_V4 {
            let first = u32::from_be_bytes(*net);
            let last = first | (u32::MAX >> len);
            assert!(forbidden_v4(first.into()).is_some(), "{first:#x}");
            assert!(forbidden_v4(last.into()).is_some(), "{last:#x}");
        }
    }

    #[test]
    fn special_ipv4_addresses_are_refused() {
        for ip in [
            "127.0.0.1",
            "127.255.255.254",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "0.1.2.3",
            "100.64.0.1",
            "100.127.255.255",
            "198.18.0.1",
            "198.19.255.255",
            "192.0.2.1",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "255.255.255.255",
            "240.0.0.1",
        ] {
            assert!(refused(ip), "{ip} should be refused");
        }
    }

    #[test]
    fn public_addresses_next_to_forbidden_ranges_pass() {
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "169.253.255.255",
            "192.167.255.255",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2a00:1450::1",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(!refused(ip), "{ip} should pass");
        }
    }

    #[test]
    fn special_ipv6_addresses_are_refused() {
        for ip in [
            "::",
            "::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "ff02::1",
            "2001:db8::1",
            "2001::1",
            "2001:2::1",
            "100::1",
            "64:ff9b:1::1",
            "3fff::1",
        ] {
            assert!(refused(ip), "{ip} should be refused");
        }
    }

    #[test]
    fn ipv6_forms_carrying_ipv4_are_judged_by_the_ipv4_address() {
        for ip in [
            "::ffff:127.0.0.1",
            "::ffff:7f00:1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:0:127.0.0.1",
            "::127.0.0.1",
            "::10.1.2.3",
            "64:ff9b::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "2002:c0a8:101::1",
        ] {
            assert!(refused(ip), "{ip} should be refused");
        }
    }

    #[test]
    fn check_addrs_refuses_when_any_resolved_address_is_forbidden() {
        let policy = FetchPolicy::default();
        let public: SocketAddr = "93.184.215.14:80".parse().unwrap();
        let private: SocketAddr = "10.1.2.3:80".parse().unwrap();
        assert_eq!(check_addrs(&[public], &policy), Ok(()));
        let err = check_addrs(&[public, private], &policy).unwrap_err();
        assert!(
            matches!(&err, MediaError::Refused(m) if m.contains("10.1.2.3")),
            "{err}"
        );
        assert!(matches!(
            check_addrs(&[], &policy),
            Err(MediaError::Fetch(_))
        ));
    }

    #[test]
    fn check_addrs_passes_private_addresses_when_the_policy_allows_them() {
        let policy = FetchPolicy {
            allow_private: true,
            ..FetchPolicy::default()
        };
        let addrs = ["127.0.0.1:80".parse().unwrap(), "[::1]:80".parse().unwrap()];
        assert_eq!(check_addrs(&addrs, &policy), Ok(()));
    }
}
