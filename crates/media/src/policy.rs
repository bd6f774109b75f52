//! The per-hop URL rules for http(s) fetches: scheme, metadata host names,
//! IP-literal hosts and the domain allow-list. Checked before the first
//! request and again for every redirect target; host names are checked once
//! more, by address, when they are resolved (see [`crate::resolver`]).
//!
//! Also [`redact`], the only form in which URLs are logged or reported.

use std::net::IpAddr;

use url::{Host, Url};

use crate::address::{is_metadata_host, is_refused};
use crate::MediaError;

/// The host rules of one fetcher.
#[derive(Debug, Clone)]
pub(crate) struct HostPolicy {
    allow_private: bool,
    /// Allow-listed domains, as the URL parser spells hosts (lowercase,
    /// IDNA/punycode), without leading or trailing dots.
    allowed_domains: Vec<String>,
    /// Allow-listed IP addresses (entries that parse as one).
    allowed_ips: Vec<IpAddr>,
}

impl HostPolicy {
    pub(crate) fn new(allow_private: bool, allowed_domains: &[String]) -> Self {
        let mut policy = HostPolicy {
            allow_private,
            allowed_domains: Vec::new(),
            allowed_ips: Vec::new(),
        };
        for entry in allowed_domains {
            let entry = entry.trim().trim_matches('.');
            // Spelled the way `Url` spells hosts: `Bücher.de` becomes
            // `xn--bcher-kva.de`, `[::1]` and `2130706433` become addresses.
            match Host::parse(entry) {
                Ok(Host::Domain(d)) => policy.allowed_domains.push(d),
                Ok(Host::Ipv4(ip)) => policy.allowed_ips.push(IpAddr::V4(ip)),
                Ok(Host::Ipv6(ip)) => policy.allowed_ips.push(IpAddr::V6(ip)),
                Err(_) if entry.is_empty() => {}
                Err(_) => policy.allowed_domains.push(entry.to_ascii_lowercase()),
            }
        }
        policy
    }

    fn has_allow_list(&self) -> bool {
        !self.allowed_domains.is_empty() || !self.allowed_ips.is_empty()
    }

    pub(crate) fn allow_private(&self) -> bool {
        self.allow_private
    }

    /// Checks one hop's URL: http or https, a host, not a metadata name,
    /// not a refused IP literal, and in the allow-list when there is one.
    pub(crate) fn check(&self, url: &Url) -> Result<(), MediaError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(MediaError::UnsupportedScheme(url.scheme().to_owned()));
        }
        match url.host() {
            None => Err(MediaError::InvalidUrl("the URL has no host".to_owned())),
            Some(Host::Domain(domain)) => self.check_domain(domain),
            Some(Host::Ipv4(ip)) => self.check_ip(IpAddr::V4(ip)),
            Some(Host::Ipv6(ip)) => self.check_ip(IpAddr::V6(ip)),
        }
    }

    fn check_domain(&self, domain: &str) -> Result<(), MediaError> {
        if is_metadata_host(domain) {
            return Err(MediaError::MetadataHost {
                host: domain.to_owned(),
            });
        }
        if !self.domain_allowed(domain) {
            return Err(MediaError::DomainNotAllowed {
                host: domain.to_owned(),
            });
        }
        Ok(())
    }

    fn check_ip(&self, ip: IpAddr) -> Result<(), MediaError> {
        if let Some(class) = is_refused(ip, self.allow_private) {
            return Err(MediaError::BlockedAddress {
                host: ip.to_string(),
                addr: ip,
                class,
            });
        }
        if self.has_allow_list() && !self.allowed_ips.contains(&ip) {
            return Err(MediaError::DomainNotAllowed {
                host: ip.to_string(),
            });
        }
        Ok(())
    }

    /// Exact match or subdomain of an entry; any domain when the list is
    /// empty.
    fn domain_allowed(&self, domain: &str) -> bool {
        if !self.has_allow_list() {
            return true;
        }
        let domain = domain.trim_end_matches('.').to_ascii_lowercase();
        self.allowed_domains.iter().any(|entry| {
            domain == *entry
                || domain
                    .strip_suffix(entry.as_str())
                    .is_some_and(|prefix| prefix.ends_with('.'))
        })
    }
}

/// `url` without credentials, query or fragment:
/// `scheme://host[:port]/path`, the path cut to 128 characters.
pub(crate) fn redact(url: &Url) -> String {
    let host = url.host_str().unwrap_or("");
    let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
    let path = url.path();
    let path = match path.char_indices().nth(128) {
        Some((cut, _)) => format!("{}...", &path[..cut]),
        None => path.to_owned(),
    };
    format!("{}://{host}{port}{path}", url.scheme())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AddressClass;

    fn url(s: &str) -> Url {
        Url::parse(s).expect("test URL parses")
    }

    fn blocked_class(policy: &HostPolicy, s: &str) -> Option<AddressClass> {
        match policy.check(&url(s)) {
            Err(MediaError::BlockedAddress { class, .. }) => Some(class),
            _ => None,
        }
    }

    #[test]
    fn url_crate_normalises_numeric_hosts_to_ipv4() {
        // WHATWG host parsing: decimal, hex and octal forms all become the
        // dotted quad, so the IP-literal check sees them.
        for s in [
            "http://2130706433/",
            "http://0x7f000001/",
            "http://0x7f.0.0.1/",
            "http://0177.0.0.1/",
            "http://127.1/",
            "http://017700000001/",
        ] {
            assert_eq!(url(s).host_str(), Some("127.0.0.1"), "{s}");
        }
    }

    #[test]
    fn refuses_each_address_class_as_literal() {
        use AddressClass::*;
        let policy = HostPolicy::new(false, &[]);
        let cases = [
            ("http://127.0.0.1/x.png", Loopback),
            ("http://2130706433/", Loopback),
            ("http://0x7f.0.0.1/", Loopback),
            ("http://0177.0.0.1/", Loopback),
            ("http://[::1]/", Loopback),
            ("http://[::ffff:127.0.0.1]/", Loopback),
            ("http://[::ffff:10.0.0.1]/", Private),
            ("http://10.0.0.1/", Private),
            ("http://172.16.5.4/", Private),
            ("http://192.168.0.1:8080/", Private),
            ("http://[fd12::1]/", Private),
            ("http://169.254.10.10/", LinkLocal),
            ("http://[fe80::1]/", LinkLocal),
            ("http://224.0.0.1/", Multicast),
            ("http://[ff02::1]/", Multicast),
            ("http://0.0.0.0/", Unspecified),
            ("http://0/", Unspecified),
            ("http://[::]/", Unspecified),
            ("http://255.255.255.255/", Broadcast),
            ("http://100.64.1.1/", SharedCgnat),
            ("http://169.254.169.254/latest/meta-data/", CloudMetadata),
            ("http://[fd00:ec2::254]/", CloudMetadata),
            ("http://[::ffff:169.254.169.254]/", CloudMetadata),
            ("https://[::ffff:a9fe:a9fe]/", CloudMetadata),
            ("http://168.63.129.16/machine/", CloudMetadata),
            ("http://169.254.170.2/v2/credentials/x", CloudMetadata),
            ("http://169.254.170.23/v1/credentials", CloudMetadata),
            ("http://[fd00:ec2::23]/", CloudMetadata),
            ("http://[fd20:ce::254]/", CloudMetadata),
            ("http://[64:ff9b::7f00:1]/", Loopback),
            ("http://[64:ff9b:1::a00:1]/", Private),
            ("http://[2001:0:808:808::80ff:fffe]/", Loopback),
        ];
        for (s, class) in cases {
            assert_eq!(blocked_class(&policy, s), Some(class), "{s}");
        }
        assert!(policy.check(&url("http://8.8.8.8/")).is_ok());
        assert!(policy.check(&url("https://[2606:4700::1111]/")).is_ok());
    }

    #[test]
    fn allow_private_allows_all_but_metadata() {
        let policy = HostPolicy::new(true, &[]);
        assert!(policy.check(&url("http://127.0.0.1/")).is_ok());
        assert!(policy.check(&url("http://[::1]/")).is_ok());
        assert!(policy.check(&url("http://10.0.0.1/")).is_ok());
        assert!(policy.check(&url("http://[64:ff9b:1::a00:1]/")).is_ok());
        for never in [
            "http://169.254.169.254/",
            "http://168.63.129.16/",
            "http://169.254.170.2/",
            "http://169.254.170.23/",
            "http://[fd00:ec2::23]/",
            "http://[fd20:ce::254]/",
            "http://[::ffff:169.254.170.2]/",
            "http://[64:ff9b::a9fe:a9fe]/",
            "http://[2001:0:808:808::5601:5601]/",
        ] {
            assert_eq!(
                blocked_class(&policy, never),
                Some(AddressClass::CloudMetadata),
                "{never}"
            );
        }
        assert!(matches!(
            policy.check(&url("http://metadata.google.internal/computeMetadata/v1/")),
            Err(MediaError::MetadataHost { .. })
        ));
    }

    #[test]
    fn only_http_and_https() {
        let policy = HostPolicy::new(true, &[]);
        for s in [
            "ftp://example.com/a.png",
            "file:///etc/passwd",
            "gopher://x/",
        ] {
            assert!(
                matches!(policy.check(&url(s)), Err(MediaError::UnsupportedScheme(_))),
                "{s}"
            );
        }
    }

    #[test]
    fn allow_list_matches_exact_host_and_subdomains() {
        let policy = HostPolicy::new(
            false,
            &[
                "Example.com".into(),
                ".cdn.test.".into(),
                "8.8.8.8".into(),
                "[2606:4700::1111]".into(),
                "bücher.de".into(),
            ],
        );
        for ok in [
            "https://example.com/a.png",
            "https://img.example.com/a.png",
            "https://a.b.example.com./a.png",
            "https://cdn.test/a.png",
            "http://8.8.8.8/a.png",
            "http://[2606:4700:0::1111]/a.png",
            "https://img.BÜCHER.de/a.png",
            "https://xn--bcher-kva.de/a.png",
        ] {
            assert!(policy.check(&url(ok)).is_ok(), "{ok}");
        }
        for bad in [
            "https://badexample.com/a.png",
            "https://example.com.evil.net/a.png",
            "https://test/a.png",
            "http://8.8.4.4/a.png",
            "https://buecher.de/a.png",
        ] {
            assert!(
                matches!(
                    policy.check(&url(bad)),
                    Err(MediaError::DomainNotAllowed { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn redirect_targets_are_checked_like_first_hops() {
        // What the fetch loop does with a Location header.
        let policy = HostPolicy::new(false, &["example.com".into()]);
        let base = url("https://img.example.com/a/b.png");
        let hop = |loc: &str| policy.check(&base.join(loc).expect("joins"));
        assert!(hop("/c.png").is_ok());
        assert!(hop("//cdn.example.com/c.png").is_ok());
        assert!(matches!(
            hop("http://169.254.169.254/"),
            Err(MediaError::BlockedAddress { .. })
        ));
        assert!(matches!(
            hop("http://[::1]:8080/"),
            Err(MediaError::BlockedAddress { .. })
        ));
        assert!(matches!(
            hop("https://evil.net/c.png"),
            Err(MediaError::DomainNotAllowed { .. })
        ));
        assert!(matches!(
            hop("file:///etc/passwd"),
            Err(MediaError::UnsupportedScheme(_))
        ));
    }

    #[test]
    fn redact_drops_credentials_and_query() {
        let u = url("https://user:secret@example.com:8443/p/a.png?sig=token#frag");
        assert_eq!(redact(&u), "https://example.com:8443/p/a.png");
    }
}
