//! The SSRF address rules: which IP addresses and host names a fetch may
//! never reach.
//!
//! [`classify`] says why an address is not a public unicast one (loopback,
//! private, link-local, ...). IPv6 forms that embed an IPv4 address
//! (IPv4-mapped `::ffff:0:0/96`, IPv4-translated `::ffff:0:0:0/96`,
//! IPv4-compatible `::a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`,
//! Teredo `2001::/32`) are judged by the embedded IPv4 address, so
//! `::ffff:127.0.0.1` is loopback like `127.0.0.1`. Where a form carries
//! two IPv4 addresses (Teredo: server and client) every one is judged and
//! the strictest class wins. The local-use NAT64 prefix `64:ff9b:1::/48`
//! reaches whatever the site's translator maps it to: it is private, or
//! the class of a non-public IPv4 address embedded in it.
//!
//! Cloud metadata and credential endpoints are a class of their own: they
//! are refused even when private hosts are allowed (see [`is_refused`]).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is refused as a fetch target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressClass {
    /// A cloud instance-metadata or credential endpoint (169.254.169.254,
    /// fd00:ec2::254, Azure's WireServer 168.63.129.16, the ECS/EKS
    /// credential agents 169.254.170.2, 169.254.170.23 and fd00:ec2::23,
    /// GCE's fd20:ce::254, Alibaba's 100.100.100.200): refused even with
    /// `allow_private_hosts`.
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
    const METADATA_V4: [[u8; 4]; 5] = [
        [169, 254, 169, 254], // AWS, GCP, Azure, OpenStack, ...
        [100, 100, 100, 200], // Alibaba Cloud
        [168, 63, 129, 16],   // Azure WireServer (a public address)
        [169, 254, 170, 2],   // ECS task credentials
        [169, 254, 170, 23],  // EKS Pod Identity agent
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

/// The IPv4 addresses an IPv6 address stands for, in the forms that reach
/// or name an IPv4 host: mapped, translated, NAT64 well-known prefix, 6to4
/// and Teredo. Empty for any other address.
fn embedded_v4(ip: Ipv6Addr) -> Vec<Ipv4Addr> {
    let bits = u128::from(ip);
    let at = |shift: u32| Ipv4Addr::from(((bits >> shift) & 0xFFFF_FFFF) as u32);
    let net = |a: u16, b: u16, c: u16, prefix: u32| {
        in_v6(ip, Ipv6Addr::new(a, b, c, 0, 0, 0, 0, 0), prefix)
    };
    if let Some(v4) = ip.to_ipv4_mapped() {
        return vec![v4];
    }
    // IPv4-translated ::ffff:0:a.b.c.d (SIIT) and NAT64 64:ff9b::/96.
    let translated = in_v6(ip, Ipv6Addr::new(0, 0, 0, 0, 0xffff, 0, 0, 0), 96);
    if translated || net(0x64, 0xff9b, 0, 96) {
        return vec![at(0)];
    }
    if net(0x2002, 0, 0, 16) {
        return vec![at(80)];
    }
    // Teredo: the server's IPv4 in bits 32..64, the client's (the host
    // traffic reaches) in the last 32 bits, inverted.
    if net(0x2001, 0, 0, 32) {
        let client = Ipv4Addr::from(!(bits as u32));
        return vec![client, at(64)];
    }
    Vec::new()
}

/// The local-use NAT64 prefix 64:ff9b:1::/48 (RFC 8215).
const LOCAL_NAT64: Ipv6Addr = Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0);

/// An address under the local-use NAT64 prefix: the site's own translator
/// decides what it reaches, so it is private however it is read, and a
/// non-public embedded IPv4 address (metadata above all) classifies it.
/// The operator picks the prefix length, so both the /96 placement (last
/// 32 bits) and the /48 one (bits 48..64 and 72..88, around RFC 6052's
/// "u" octet) are judged; a candidate that is all zeros is padding.
fn classify_local_nat64(ip: Ipv6Addr) -> AddressClass {
    let bits = u128::from(ip);
    let hi = ((bits >> 64) & 0xFFFF) as u32;
    let lo = ((bits >> 40) & 0xFFFF) as u32;
    let candidates = [
        Ipv4Addr::from((bits & 0xFFFF_FFFF) as u32),
        Ipv4Addr::from((hi << 16) | lo),
    ];
    let judged = candidates
        .into_iter()
        .filter(|v4| !v4.is_unspecified())
        .map(classify_v4);
    strictest(judged).unwrap_or(AddressClass::Private)
}

/// The strictest class among `classes`: cloud metadata first, then the
/// first non-public one.
fn strictest(classes: impl Iterator<Item = Option<AddressClass>>) -> Option<AddressClass> {
    let found: Vec<AddressClass> = classes.flatten().collect();
    found
        .iter()
        .copied()
        .find(|&c| c == AddressClass::CloudMetadata)
        .or_else(|| found.first().copied())
}

fn classify_v6(ip: Ipv6Addr) -> Option<AddressClass> {
    use AddressClass::*;
    const METADATA_V6: [Ipv6Addr; 3] = [
        Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254), // AWS IMDS
        Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23),  // EKS Pod Identity agent
        Ipv6Addr::new(0xfd20, 0xce, 0, 0, 0, 0, 0, 0x254),  // GCE metadata
    ];
    if METADATA_V6.contains(&ip) {
        return Some(CloudMetadata);
    }
    if ip.is_unspecified() {
        return Some(Unspecified);
    }
    if ip.is_loopback() {
        return Some(Loopback);
    }
    if in_v6(ip, LOCAL_NAT64, 48) {
        return Some(classify_local_nat64(ip));
    }
    let embedded = embedded_v4(ip);
    if !embedded.is_empty() {
        return strictest(embedded.into_iter().map(classify_v4));
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

    /// Teredo address with server `server` and client `client` (stored
    /// inverted in the last 32 bits), flags and port zero.
    fn teredo(server: [u8; 4], client: [u8; 4]) -> String {
        let s = u32::from(Ipv4Addr::from(server));
        let c = !u32::from(Ipv4Addr::from(client));
        let bits = (0x2001_0000u128 << 96) | (u128::from(s) << 64) | u128::from(c);
        Ipv6Addr::from(bits).to_string()
    }

    #[test]
    fn judges_translated_nat64_and_teredo_forms_by_their_ipv4() {
        let cases = [
            // IPv4-mapped ::ffff:0:0/96, written both ways.
            ("::ffff:0:0", Some(Unspecified)),
            ("::ffff:a00:1", Some(Private)),
            ("::ffff:168.63.129.16", Some(CloudMetadata)),
            // IPv4-translated ::ffff:0:0:0/96.
            ("::ffff:0:127.0.0.1", Some(Loopback)),
            ("::ffff:0:8.8.8.8", None),
            // NAT64 well-known prefix and its hex spelling.
            ("64:ff9b::a9fe:a9fe", Some(CloudMetadata)),
            ("64:ff9b::192.168.1.1", Some(Private)),
            // Local-use NAT64, /96 placement (last 32 bits): private even
            // with a public IPv4 inside, classed by a non-public one.
            ("64:ff9b:1::10.0.0.1", Some(Private)),
            ("64:ff9b:1::127.0.0.1", Some(Loopback)),
            ("64:ff9b:1:ab::169.254.170.2", Some(CloudMetadata)),
            ("64:ff9b:1::8.8.8.8", Some(Private)),
            // Local-use NAT64, /48 placement: 127.0.0.1 = 7f00 | u | 0001.
            ("64:ff9b:1:7f00:1::", Some(Loopback)),
            ("64:ff9b:1:a9fe:a9:fe00::", Some(CloudMetadata)),
            ("64:ff9b:1:0808:08::", Some(Private)),
        ];
        for (addr, want) in cases {
            assert_eq!(class(addr), want, "{addr}");
        }
        let teredo_cases = [
            (teredo([8, 8, 8, 8], [127, 0, 0, 1]), Some(Loopback)),
            (teredo([8, 8, 8, 8], [10, 1, 2, 3]), Some(Private)),
            (teredo([192, 168, 0, 1], [8, 8, 4, 4]), Some(Private)),
            (
                teredo([10, 0, 0, 1], [169, 254, 169, 254]),
                Some(CloudMetadata),
            ),
            (teredo([8, 8, 8, 8], [1, 1, 1, 1]), None),
        ];
        for (addr, want) in teredo_cases {
            assert_eq!(class(&addr), want, "{addr}");
        }
        // The layout the helper writes: 2001:0:SSSS:SSSS:0:0:~CCCC:~CCCC.
        assert_eq!(
            teredo([8, 8, 8, 8], [127, 0, 0, 1]),
            "2001:0:808:808::80ff:fffe"
        );
    }

    #[test]
    fn credential_endpoints_are_metadata_even_when_private_is_allowed() {
        for addr in [
            "168.63.129.16",
            "169.254.170.2",
            "169.254.170.23",
            "fd00:ec2::23",
            "fd20:ce::254",
            "fd00:ec2::254",
            "::ffff:169.254.170.2",
            "64:ff9b::168.63.129.16",
            "2002:a9fe:aa17::1",
        ] {
            let ip: IpAddr = addr.parse().expect("test address parses");
            assert_eq!(is_refused(ip, true), Some(CloudMetadata), "{addr}");
            assert_eq!(is_refused(ip, false), Some(CloudMetadata), "{addr}");
        }
        // Their neighbours are ordinary link-local / unique-local / public.
        let neighbours = [
            ("169.254.170.3", Some(LinkLocal)),
            ("fd00:ec2::24", Some(Private)),
            ("168.63.129.17", None),
        ];
        for (addr, want) in neighbours {
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
