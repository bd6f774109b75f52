//! The DNS resolver the HTTP client connects through: it resolves a host
//! once, refuses the whole answer when any address in it is refused, and
//! hands the client exactly the addresses it checked, so a second lookup
//! (DNS rebinding) cannot swap in another address between check and
//! connect.
//!
//! reqwest does not call the resolver for IP-literal hosts; those are
//! checked by [`crate::policy::HostPolicy`] before each request.

use std::error::Error as StdError;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::address::{is_refused, AddressClass};

/// A resolver that applies the address rules.
#[derive(Debug, Clone)]
pub(crate) struct GuardedResolver {
    pub allow_private: bool,
}

/// The resolver refused an answer: carried through reqwest's error chain
/// and recovered by [`find_refusal`].
#[derive(Debug)]
pub(crate) struct Refused {
    pub addr: IpAddr,
    pub class: AddressClass,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No address: this text may end up in a message for the client.
        write!(f, "the host resolves to a refused {} address", self.class)
    }
}

impl StdError for Refused {}

/// The lookup itself failed: the name has no address, or the resolver
/// failed.
#[derive(Debug)]
pub(crate) struct LookupFailed {
    pub reason: String,
    /// The resolver failed (could not answer), rather than answering that
    /// the name has no address.
    pub resolver_failed: bool,
}

impl LookupFailed {
    fn new(reason: String) -> LookupFailed {
        LookupFailed {
            resolver_failed: says_resolver_failed(&reason),
            reason,
        }
    }
}

impl fmt::Display for LookupFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

/// Whether the system resolver's message is `EAI_AGAIN` or `EAI_FAIL`
/// (glibc and musl word them alike; the error code itself does not reach
/// us through `std`): the resolver could not answer. Any other failure
/// means the name has no address.
fn says_resolver_failed(message: &str) -> bool {
    [
        "Temporary failure in name resolution",
        "Non-recoverable failure in name resolution",
    ]
    .iter()
    .any(|words| message.contains(words))
}

impl StdError for LookupFailed {}

type BoxError = Box<dyn StdError + Send + Sync>;

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow_private = self.allow_private;
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs = lookup(&host).await?;
            check_all(&addrs, allow_private)?;
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

async fn lookup(host: &str) -> Result<Vec<SocketAddr>, BoxError> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, 0))
        .await
        .map_err(|e| LookupFailed::new(e.to_string()))?
        .collect();
    if addrs.is_empty() {
        return Err(LookupFailed::new("no addresses".to_owned()).into());
    }
    Ok(addrs)
}

/// Refuses the answer when any address is refused: a mixed answer is how
/// rebinding attacks slip a private address past a check of the first one.
fn check_all(addrs: &[SocketAddr], allow_private: bool) -> Result<(), BoxError> {
    for addr in addrs {
        if let Some(class) = is_refused(addr.ip(), allow_private) {
            return Err(Refused {
                addr: addr.ip(),
                class,
            }
            .into());
        }
    }
    Ok(())
}

/// Visits `err` and its sources, looking inside `io::Error` wrappers too
/// (whose `source()` skips the error they wrap).
fn walk<'a>(
    err: &'a (dyn StdError + 'static),
    visit: &mut dyn FnMut(&'a (dyn StdError + 'static)),
) {
    let mut next = Some(err);
    while let Some(e) = next {
        visit(e);
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            walk(inner, visit);
        }
        next = e.source();
    }
}

/// The resolver's refusal somewhere in `err`'s chain.
pub(crate) fn find_refusal(err: &(dyn StdError + 'static)) -> Option<(IpAddr, AddressClass)> {
    let mut found = None;
    walk(err, &mut |e| {
        if let Some(r) = e.downcast_ref::<Refused>() {
            found.get_or_insert((r.addr, r.class));
        }
    });
    found
}

/// The resolver's lookup failure somewhere in `err`'s chain: its message
/// and whether the resolver itself failed.
pub(crate) fn find_lookup_failure(err: &(dyn StdError + 'static)) -> Option<(String, bool)> {
    let mut found = None;
    walk(err, &mut |e| {
        if let Some(l) = e.downcast_ref::<LookupFailed>() {
            found.get_or_insert_with(|| (l.reason.clone(), l.resolver_failed));
        }
    });
    found
}

/// `err` and its sources joined with `: `, without repeats.
pub(crate) fn chain_message(err: &(dyn StdError + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    walk(err, &mut |e| {
        let s = e.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
    });
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(list: &[&str]) -> Vec<SocketAddr> {
        list.iter()
            .map(|a| SocketAddr::new(a.parse().expect("test address"), 0))
            .collect()
    }

    #[test]
    fn refuses_answer_with_any_refused_address() {
        let mixed = addrs(&["8.8.8.8", "10.0.0.1"]);
        let err = check_all(&mixed, false).expect_err("mixed answer refused");
        let (addr, class) = find_refusal(err.as_ref()).expect("refusal in chain");
        assert_eq!(addr.to_string(), "10.0.0.1");
        assert_eq!(class, AddressClass::Private);
        assert!(check_all(&mixed, true).is_ok());
        assert!(check_all(&addrs(&["8.8.8.8", "2606:4700::1111"]), false).is_ok());
        assert!(check_all(&addrs(&["169.254.169.254"]), true).is_err());
    }

    #[test]
    fn finds_refusal_inside_io_error() {
        let refused = Refused {
            addr: "127.0.0.1".parse().expect("address"),
            class: AddressClass::Loopback,
        };
        let io = std::io::Error::other(refused);
        assert_eq!(
            find_refusal(&io).map(|(_, c)| c),
            Some(AddressClass::Loopback)
        );
        assert!(find_lookup_failure(&io).is_none());
    }

    #[test]
    fn a_name_without_address_is_told_from_a_failed_resolver() {
        let prefix = "failed to lookup address information: ";
        for (message, resolver_failed) in [
            ("Name or service not known", false),
            ("No address associated with hostname", false),
            ("Name does not resolve", false),
            ("Temporary failure in name resolution", true),
            ("Non-recoverable failure in name resolution", true),
        ] {
            let failed = LookupFailed::new(format!("{prefix}{message}"));
            assert_eq!(failed.resolver_failed, resolver_failed, "{message}");
        }
        assert!(!LookupFailed::new("no addresses".to_owned()).resolver_failed);
    }

    #[tokio::test]
    async fn a_name_that_does_not_exist_is_a_lookup_failure() {
        // RFC 6761: `.invalid` never resolves; a machine without DNS
        // answers EAI_AGAIN instead, which is the other case.
        let name: Name = "no-such-host.invalid".parse().expect("name");
        let err = GuardedResolver {
            allow_private: false,
        }
        .resolve(name)
        .await
        .err()
        .expect("does not resolve");
        let (reason, _) = find_lookup_failure(err.as_ref()).expect("lookup failure in chain");
        assert!(!reason.is_empty());
    }

    #[tokio::test]
    async fn resolves_localhost_and_refuses_it_by_default() {
        let name: Name = "localhost".parse().expect("name");
        let err = GuardedResolver {
            allow_private: false,
        }
        .resolve(name)
        .await
        .err()
        .expect("localhost refused");
        assert_eq!(
            find_refusal(err.as_ref()).map(|(_, c)| c),
            Some(AddressClass::Loopback)
        );
        let name: Name = "localhost".parse().expect("name");
        let got: Vec<SocketAddr> = GuardedResolver {
            allow_private: true,
        }
        .resolve(name)
        .await
        .map_err(|e| e.to_string())
        .expect("allowed")
        .collect();
        assert!(got.iter().all(|a| a.ip().is_loopback()), "{got:?}");
    }
}
