//! The SSRF address rules: which IP addresses and host names a fetch may
//! never reach.
//!
//! [`classify`] says why an address is not a public unicast one (loopback,
//! private, link-local, ...). IPv6 forms that embed an IPv4 address
//! (IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible `::a.b.c.d`, NAT64
//! `64:ff9b::/96` and 6to4 `2002::/16`) are judged by the embedded IPv4
//! address, so `::ffff:127.0.0.1` is loopback like `127.0.0.1`.
//!
//! Cloud metadata endpoints are a class of their own: they are refused even
//! when private hosts are allowed (see [`is_refused`]).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is refused as a fetch target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressClass {
    /// A cloud instance-metadata endpoint (169.254.169.254, fd00:ec2::254,
    /// 100.100.100.200, ...): refused even with `allow_private_hosts`.
    CloudMetadata,
    /// 127.0.0.0/8, ::1.
    Loopback,
    /// RFC 1918 (10/8, 172.16/12, 192.168/16) and unique-local fc00::/7.
    Private,
    /// 169.254/16, fe80::/10 (and the deprecated site-local fec0::/10).
    LinkLocal,
    /// 224/4, ff00::/8.
    Multicast,
    /// 0.0.0.0/8 ("this network") and ::.
    Unspecified,
    /// 255.255.255.255.
    Broadcast,
    /// 100.64/10, carrier-grade NAT shared space (RFC 6598).
    SharedCgnat,
    /// Other special-purpose ranges: 192.0.0/24, documentation ranges,
    /// 198.18/15 benchmarking, 240/4, deprecated IPv4-compatible IPv6,
    /// 100::/64 discard-only.
    Reserved,
}

impl AddressClass {
    /// A short lowercase name, for messages and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            AddressClass::CloudMetadata => "cloud metadata",
            AddressClass::Loopback => "loopback",
            AddressClass::Private => "private",
            AddressClass::LinkLocal => "link-local",
            AddressClass::Multicast => "multicast",
            AddressClass::Unspecified => "unspecified",
            AddressClass::Broadcast => "broadcast",
            AddressClass::SharedCgnat => "shared (CGNAT)",
            AddressClass::Reserved => "reserved",
        }
    }
}

impl fmt::Display for AddressClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Host names of metadata services that resolve to metadata addresses only
/// inside the cloud; refused by name so no lookup is made at all.
const METADATA_HOSTS: [&str; 6] = [
    "metadata.google.internal",
    "metadata.goog",
    "metadata",
    "instance-data",
    "instance-data.ec2.internal",
    "metadata.azure.internal",
];

/// Whether `host` (a DNS name, lowercase, trailing dot allowed) names a
/// cloud metadata service.
pub fn is_metadata_host(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    METADATA_HOSTS
        .iter()
        .any(|name| host.eq_ignore_ascii_case(name))
}

/// Why `ip` is not a public unicast address, or `None` when it is one.
pub fn classify(ip: IpAddr) -> Option<AddressClass> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

/// The class that refuses `ip` under the given policy: every non-public
/// class unless `allow_private`, and cloud metadata always.
pub fn is_refused(ip: IpAddr, allow_private: bool) -> Option<AddressClass> {
    match classify(ip) {
        Some(AddressClass::CloudMetadata) => Some(AddressClass::CloudMetadata),
        Some(_) if allow_private => None,
        other => other,
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn classify_v4(ip: Ipv4Addr) -> Option<AddressClass> {
    use AddressClass::*;
    const METADATA_V4: [[u8; 4]; 2] = [
        [169, 254, 169, 254], // AWS, GCP, Azure, OpenStack, ...
        [100, 100, 100, 200], // Alibaba Cloud
    ];
    const RANGES: [([u8; 4], u32, AddressClass); 16] = [
        ([0, 0, 0, 0], 8, Unspecified),
        ([10, 0, 0, 0], 8, Private),
        ([100, 64, 0, 0], 10, SharedCgnat),
        ([127, 0, 0, 0], 8, Loopback),
        ([169, 254, 0, 0], 16, LinkLocal),
        ([172, 16, 0, 0], 12, Private),
        ([192, 0, 0, 0], 24, Reserved),
        ([192, 0, 2, 0], 24, Reserved),
        ([192, 88, 99, 0], 24, Reserved),
        ([192, 168, 0, 0], 16, Private),
        ([198, 18, 0, 0], 15, Reserved),
        ([198, 51, 100, 0], 24, Reserved),
        ([203, 0, 113, 0], 24, Reserved),
        ([224, 0, 0, 0], 4, Multicast),
        ([255, 255, 255, 255], 32, Broadcast),
        ([240, 0, 0, 0], 4, Reserved),
    ];
    if METADATA_V4.iter().any(|m| ip.octets() == *m) {
        return Some(CloudMetadata);
    }
    RANGES
        .iter()
        .find(|(net, prefix, _)| in_v4(ip, *net, *prefix))
        .map(|&(_, _, class)| class)
}

fn in_v6(ip: Ipv6Addr, net: Ipv6Addr, prefix: u32) -> bool {
    let mask = u128::MAX.checked_shl(128 - prefix).unwrap_or(0);
    u128::from(ip) & mask == u128::from(net) & mask
}

/// The IPv4 address an IPv6 address stands for, in the forms that reach or
/// name an IPv4 host: mapped, compatible, NAT64 well-known prefix, 6to4.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = u128::from(ip);
    let low32 = Ipv4Addr::from((bits & 0xFFFF_FFFF) as u32);
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    if in_v6(ip, Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96) {
        return Some(low32);
    }
    if in_v6(ip, Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0), 16) {
        return Some(Ipv4Addr::from(((bits >> 80) & 0xFFFF_FFFF) as u32));
    }
    None
}

fn classify_v6(ip: Ipv6Addr) -> Option<AddressClass> {
    use AddressClass::*;
    const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);
    if ip == METADATA_V6 {
        return Some(CloudMetadata);
    }
    if ip.is_unspecified() {
        return Some(Unspecified);
    }
    if ip.is_loopback() {
        return Some(Loopback);
    }
    if let Some(v4) = embedded_v4(ip) {
        return classify_v4(v4);
    }
    // IPv4-compatible ::a.b.c.d (deprecated): judge the IPv4 address, and
    // refuse it as reserved even when that one is public.
    if in_v6(ip, Ipv6Addr::UNSPECIFIED, 96) {
        let v4 = Ipv4Addr::from((u128::from(ip) & 0xFFFF_FFFF) as u32);
        return Some(classify_v4(v4).unwrap_or(Reserved));
    }
    let ranges: [(Ipv6Addr, u32, AddressClass); 6] = [
        (Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7, Private),
        (Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10, LinkLocal),
        (Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10, LinkLocal),
        (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8, Multicast),
        (Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 32, Reserved),
        (Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0), 64, Reserved),
    ];
    ranges
        .iter()
        .find(|(net, prefix, _)| in_v6(ip, *net, *prefix))
        .map(|&(_, _, class)| class)
}

#[cfg(test)]
mod tests {
    use super::*;
    use AddressClass::*;

    fn class(s: &str) -> Option<AddressClass> {
        classify(s.parse().expect("test address parses"))
    }

    #[test]
    fn classifies_ipv4_ranges() {
        let cases = [
            ("127.0.0.1", Some(Loopback)),
            ("127.255.1.2", Some(Loopback)),
            ("10.1.2.3", Some(Private)),
            ("172.16.0.1", Some(Private)),
            ("172.31.255.255", Some(Private)),
            ("172.32.0.1", None),
            ("192.168.1.1", Some(Private)),
            ("169.254.1.1", Some(LinkLocal)),
            ("169.254.169.254", Some(CloudMetadata)),
            ("100.100.100.200", Some(CloudMetadata)),
            ("100.64.0.1", Some(SharedCgnat)),
            ("100.127.255.255", Some(SharedCgnat)),
            ("100.128.0.1", None),
            ("224.0.0.1", Some(Multicast)),
            ("239.255.255.250", Some(Multicast)),
            ("0.0.0.0", Some(Unspecified)),
            ("0.1.2.3", Some(Unspecified)),
            ("255.255.255.255", Some(Broadcast)),
            ("240.0.0.1", Some(Reserved)),
            ("192.0.2.1", Some(Reserved)),
            ("198.18.0.1", Some(Reserved)),
            ("8.8.8.8", None),
            ("1.1.1.1", None),
            ("93.184.216.34", None),
        ];
        for (addr, want) in cases {
            assert_eq!(class(addr), want, "{addr}");
        }
    }

    #[test]
    fn classifies_ipv6_ranges() {
        let cases = [
            ("::1", Some(Loopback)),
            ("::", Some(Unspecified)),
            ("fc00::1", Some(Private)),
            ("fd12:3456::1", Some(Private)),
            ("fd00:ec2::254", Some(CloudMetadata)),
            ("fe80::1", Some(LinkLocal)),
            ("febf::1", Some(LinkLocal)),
            ("fec0::1", Some(LinkLocal)),
            ("ff02::1", Some(Multicast)),
            ("2001:db8::1", Some(Reserved)),
            ("100::1", Some(Reserved)),
            ("2606:4700:4700::1111", None),
            ("2001:4860:4860::8888", None),
        ];
        for (addr, want) in cases {
            assert_eq!(class(addr), want, "{addr}");
        }
    }

    #[test]
    fn judges_ipv6_forms_by_their_embedded_ipv4() {
        let cases = [
            ("::ffff:127.0.0.1", Some(Loopback)),
            ("::ffff:7f00:1", Some(Loopback)),
            ("::ffff:10.0.0.1", Some(Private)),
            ("::ffff:169.254.169.254", Some(CloudMetadata)),
            ("::ffff:8.8.8.8", None),
            ("::127.0.0.1", Some(Loopback)),
            ("::10.0.0.1", Some(Private)),
            ("::8.8.8.8", Some(Reserved)),
            ("64:ff9b::127.0.0.1", Some(Loopback)),
            ("64:ff9b::8.8.8.8", None),
            ("2002:7f00:0001::1", Some(Loopback)),
            ("2002:a9fe:a9fe::", Some(CloudMetadata)),
            ("2002:0808:0808::1", None),
        ];
        for (addr, want) in cases {
            assert_eq!(class(addr), want, "{addr}");
        }
    }

    #[test]
    fn allow_private_still_refuses_metadata() {
        let lo: IpAddr = "127.0.0.1".parse().expect("parses");
        let md: IpAddr = "169.254.169.254".parse().expect("parses");
        let md6: IpAddr = "fd00:ec2::254".parse().expect("parses");
        assert_eq!(is_refused(lo, false), Some(Loopback));
        assert_eq!(is_refused(lo, true), None);
        assert_eq!(is_refused(md, true), Some(CloudMetadata));
        assert_eq!(is_refused(md6, true), Some(CloudMetadata));
    }

    #[test]
    fn recognises_metadata_host_names() {
        assert!(is_metadata_host("metadata.google.internal"));
        assert!(is_metadata_host("METADATA.google.internal."));
        assert!(is_metadata_host("metadata"));
        assert!(!is_metadata_host("metadata.example.com"));
        assert!(!is_metadata_host("example.com"));
    }
}
