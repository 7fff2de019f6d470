//! The guard on every URL a chat can steer: which addresses a fetch may
//! reach, decided on the addresses a name resolves to, not on the name.
//!
//! A URL is refused when it is not `http`/`https`, or when its host is, or
//! resolves to, an address that is not on the public internet: loopback,
//! private, link-local, carrier-grade NAT, multicast, documentation and
//! reserved ranges, IPv6 unique-local and site-local, and IPv4 embedded
//! in IPv6 (mapped, compatible, 6to4, NAT64) when the embedded address is
//! one of those. Cloud metadata addresses stay refused even with
//! `web.allow_private`. Odd IPv4 spellings (`0x7f.1`, `2130706433`,
//! `0177.0.0.1`) need no rule of their own: URLs are parsed the way
//! browsers parse them, into the address a connection would go to.
//!
//! [`UrlGuard::client`] builds an HTTP client whose resolver is the guard:
//! it connects only to addresses it checked, so a name cannot resolve to a
//! public address for the check and a private one for the connection (DNS
//! rebinding). Redirects are checked as they come.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use reqwest::Url;
use talaria_core::config::WebConfig;

/// Why a URL or a host may not be fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardError {
    /// The guard refuses it: `target` (a URL or a host) and why.
    Refused {
        /// What was asked for.
        target: String,
        /// Why not, in words a model and a person understand.
        reason: String,
    },
    /// The name does not resolve.
    Unresolved {
        /// The host.
        host: String,
        /// What the resolver said.
        error: String,
    },
}

impl fmt::Display for GuardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GuardError::Refused { target, reason } => write!(
                f,
                "refused to fetch {target}: {reason} (only public internet addresses are fetched; \
                 web.allow_private or web.allow_hosts opens others)"
            ),
            GuardError::Unresolved { host, error } => {
                write!(f, "cannot resolve {host}: {error}")
            }
        }
    }
}

impl std::error::Error for GuardError {}

fn refused(target: impl Into<String>, reason: impl Into<String>) -> GuardError {
    GuardError::Refused {
        target: target.into(),
        reason: reason.into(),
    }
}

/// A future the resolver hands back.
pub type LookupFuture = Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>>;

/// Resolves a host name to its addresses. The system's resolver in
/// production; a fixed table in tests, so "a name that resolves to
/// loopback" needs no DNS server.
pub trait Lookup: Send + Sync {
    /// The addresses of `host`.
    fn lookup(&self, host: &str) -> LookupFuture;
}

/// The system resolver (`getaddrinfo`, as every other program here).
struct SystemLookup;

impl Lookup for SystemLookup {
    fn lookup(&self, host: &str) -> LookupFuture {
        let host = host.to_owned();
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host.as_str(), 0)).await?;
            Ok(addrs.map(|a| a.ip()).collect())
        })
    }
}

/// A fixed table of names and their addresses; any other name does not
/// resolve.
#[derive(Debug, Clone, Default)]
pub struct StaticLookup {
    names: HashMap<String, Vec<IpAddr>>,
}

impl StaticLookup {
    /// Adds `name` resolving to `addrs`.
    pub fn with(mut self, name: &str, addrs: &[IpAddr]) -> StaticLookup {
        self.names.insert(name.to_ascii_lowercase(), addrs.to_vec());
        self
    }
}

impl Lookup for StaticLookup {
    fn lookup(&self, host: &str) -> LookupFuture {
        let found = self.names.get(&host.to_ascii_lowercase()).cloned();
        Box::pin(async move {
            found.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such host"))
        })
    }
}

/// The guard. Cheap to clone; every clone applies the same policy.
#[derive(Clone)]
pub struct UrlGuard {
    inner: Arc<Policy>,
}

struct Policy {
    allow_private: bool,
    /// Allowed host names, lower case, without a trailing dot.
    names: Vec<String>,
    /// Allowed addresses and networks.
    nets: Vec<IpNet>,
    lookup: Arc<dyn Lookup>,
}

impl fmt::Debug for UrlGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UrlGuard")
            .field("allow_private", &self.inner.allow_private)
            .field("names", &self.inner.names)
            .field("nets", &self.inner.nets)
            .finish()
    }
}

/// Host names of cloud metadata services, refused before any lookup.
const METADATA_NAMES: &[&str] = &["metadata.google.internal", "metadata.goog", "metadata"];

impl UrlGuard {
    /// The guard `web:` describes: `allow_private` and `allow_hosts`
    /// (names, addresses, networks), with the system resolver.
    ///
    /// # Errors
    /// An `allow_hosts` entry that is neither a name, an address nor a
    /// network.
    pub fn from_config(web: &WebConfig) -> Result<UrlGuard, String> {
        UrlGuard::with_lookup(web.allow_private, &web.allow_hosts, Arc::new(SystemLookup))
    }

    /// The strictest guard: public addresses only.
    pub fn public_only() -> UrlGuard {
        UrlGuard {
            inner: Arc::new(Policy {
                allow_private: false,
                names: Vec::new(),
                nets: Vec::new(),
                lookup: Arc::new(SystemLookup),
            }),
        }
    }

    /// A guard with its own resolver (tests).
    ///
    /// # Errors
    /// As [`UrlGuard::from_config`].
    pub fn with_lookup(
        allow_private: bool,
        allow_hosts: &[String],
        lookup: Arc<dyn Lookup>,
    ) -> Result<UrlGuard, String> {
        let mut names = Vec::new();
        let mut nets = Vec::new();
        for entry in allow_hosts {
            let entry = entry.trim().trim_start_matches('[').trim_end_matches(']');
            if let Ok(net) = entry.parse::<IpNet>() {
                nets.push(net);
            } else if let Ok(ip) = entry.parse::<IpAddr>() {
                nets.push(IpNet::from(ip));
            } else if !entry.is_empty() && !entry.contains(['/', ' ', ':']) {
                names.push(normal_name(entry));
            } else {
                return Err(format!(
                    "web.allow_hosts: `{entry}` is not a host name, an IP address or a network"
                ));
            }
        }
        Ok(UrlGuard {
            inner: Arc::new(Policy {
                allow_private,
                names,
                nets,
                lookup,
            }),
        })
    }

    /// Checks what can be checked without a lookup: the scheme, and the
    /// host when it is an address or a name that is refused outright.
    ///
    /// # Errors
    /// [`GuardError::Refused`].
    pub fn check_url(&self, url: &Url) -> Result<(), GuardError> {
        let shown = shown(url);
        if !matches!(url.scheme(), "http" | "https") {
            return Err(refused(
                shown,
                format!(
                    "the {} scheme is not fetched (http and https only)",
                    url.scheme()
                ),
            ));
        }
        match url.host() {
            None => Err(refused(shown, "the URL has no host")),
            Some(url::Host::Ipv4(ip)) => self.check_addr(&shown, None, IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => self.check_addr(&shown, None, IpAddr::V6(ip)),
            Some(url::Host::Domain(name)) => self.check_name(&shown, name),
        }
    }

    /// The addresses `host` may be reached at: all of them, each checked.
    /// One refused address refuses the host: a name that answers with a
    /// public and a private address is a name to distrust.
    ///
    /// # Errors
    /// [`GuardError::Refused`] or [`GuardError::Unresolved`].
    pub async fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, GuardError> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            self.check_addr(host, None, ip)?;
            return Ok(vec![ip]);
        }
        self.check_name(host, host)?;
        let addrs = self
            .inner
            .lookup
            .lookup(host)
            .await
            .map_err(|e| GuardError::Unresolved {
                host: host.to_owned(),
                error: e.to_string(),
            })?;
        if addrs.is_empty() {
            return Err(GuardError::Unresolved {
                host: host.to_owned(),
                error: "no addresses".to_owned(),
            });
        }
        for &ip in &addrs {
            self.check_addr(host, Some(host), ip)?;
        }
        Ok(addrs)
    }

    /// An HTTP client that reaches only what this guard allows: its
    /// resolver is the guard, system proxies are ignored (a proxy would
    /// make the connection to a name the guard never saw), and every
    /// redirect is checked, at most `max_redirects` of them.
    ///
    /// # Errors
    /// When the TLS backend cannot start.
    pub fn client(&self, max_redirects: usize) -> Result<reqwest::Client, reqwest::Error> {
        let guard = self.clone();
        let policy = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().iter().any(|u| u == attempt.url()) {
                let url = shown(attempt.url());
                return attempt.error(RedirectError(format!("a redirect loop at {url}")));
            }
            if attempt.previous().len() > max_redirects {
                return attempt.error(RedirectError(format!(
                    "more than {max_redirects} redirects"
                )));
            }
            match guard.check_url(attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(e) => attempt.error(e),
            }
        });
        reqwest::Client::builder()
            .dns_resolver(Arc::new(GuardResolver(self.clone())))
            .no_proxy()
            .redirect(policy)
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("Talaria/", env!("CARGO_PKG_VERSION")))
            .build()
    }

    fn allowed_name(&self, name: &str) -> bool {
        let name = normal_name(name);
        self.inner.names.contains(&name)
    }

    fn check_name(&self, shown: &str, name: &str) -> Result<(), GuardError> {
        if self.allowed_name(name) {
            return Ok(());
        }
        let name = normal_name(name);
        if METADATA_NAMES.contains(&name.as_str()) {
            return Err(refused(
                shown,
                format!("{name} is a cloud metadata service"),
            ));
        }
        if !self.inner.allow_private && (name == "localhost" || name.ends_with(".localhost")) {
            return Err(refused(shown, format!("{name} is this machine (loopback)")));
        }
        Ok(())
    }

    /// Whether `ip` (what `name`, if any, resolved to) may be reached.
    fn check_addr(&self, shown: &str, name: Option<&str>, ip: IpAddr) -> Result<(), GuardError> {
        if name.is_some_and(|n| self.allowed_name(n))
            || self.inner.nets.iter().any(|net| net.contains(&ip))
        {
            return Ok(());
        }
        let Some(reason) = not_public(ip) else {
            return Ok(());
        };
        if self.inner.allow_private && !is_metadata(ip) {
            return Ok(());
        }
        let what = match name {
            Some(n) => format!("{n} resolves to {ip}, {reason}"),
            None => format!("{ip} is {reason}"),
        };
        Err(refused(shown, what))
    }
}

/// A URL as shown in a refusal: without user name, password or query,
/// which can hold what the guard should not repeat.
fn shown(url: &Url) -> String {
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.set_query(None);
    u.set_fragment(None);
    u.to_string()
}

fn normal_name(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// The guard as reqwest's resolver: it resolves and checks, and the
/// connection goes to the checked addresses only.
struct GuardResolver(UrlGuard);

impl reqwest::dns::Resolve for GuardResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let guard = self.0.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs = guard
                .resolve(&host)
                .await
                .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)?;
            let addrs: reqwest::dns::Addrs =
                Box::new(addrs.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}

/// A redirect the client will not follow.
#[derive(Debug)]
pub(crate) struct RedirectError(pub(crate) String);

impl fmt::Display for RedirectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RedirectError {}

/// Cloud metadata services: refused even where private addresses are
/// allowed (AWS, GCP, Azure, OpenStack; ECS task metadata; Alibaba;
/// Oracle; AWS over IPv6).
pub fn is_metadata(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => matches!(
            v4.octets(),
            [169, 254, 169, 254] | [169, 254, 170, 2] | [100, 100, 100, 200] | [192, 0, 0, 192]
        ),
        IpAddr::V6(v6) => v6 == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254),
    }
}

/// An IPv4 address written as IPv6 (`::ffff:a.b.c.d`) is that IPv4
/// address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Why `ip` is not a public internet address; `None` when it is one.
pub fn not_public(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_not_public(v4),
        IpAddr::V6(v6) => v6_not_public(v6),
    }
}

fn v4_not_public(ip: Ipv4Addr) -> Option<&'static str> {
    if is_metadata(IpAddr::V4(ip)) {
        return Some("a cloud metadata address");
    }
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        (0, _, _) => "a \"this network\" address (0.0.0.0/8)",
        (10, _, _) | (172, 16..=31, _) | (192, 168, _) => "a private address",
        (100, 64..=127, _) => "a carrier-grade NAT address (100.64.0.0/10)",
        (127, _, _) => "a loopback address",
        (169, 254, _) => "a link-local address",
        (192, 0, 0) => "an IETF protocol address (192.0.0.0/24)",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "a documentation address",
        (192, 88, 99) => "a 6to4 relay address",
        (198, 18..=19, _) => "a benchmarking address (198.18.0.0/15)",
        (224..=239, _, _) => "a multicast address",
        (240..=255, _, _) => "a reserved or broadcast address",
        _ => return None,
    })
}

fn v6_not_public(ip: Ipv6Addr) -> Option<&'static str> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return v4_not_public(v4).map(|_| "an IPv4-mapped address of a non-public IPv4 address");
    }
    let s = ip.segments();
    let embedded = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    if ip.is_unspecified() {
        return Some("the unspecified address");
    }
    if ip.is_loopback() {
        return Some("a loopback address");
    }
    if is_metadata(IpAddr::V6(ip)) {
        return Some("a cloud metadata address");
    }
    Some(match s[0] {
        // ::a.b.c.d, the deprecated IPv4-compatible form.
        0 if s[1..6] == [0; 5] => "an IPv4-compatible address (::/96)",
        0x64 if s[1] == 0xff9b && s[2..6] == [0; 4] => {
            // NAT64: reaches the embedded IPv4 address.
            return v4_not_public(embedded(s[6], s[7]))
                .map(|_| "a NAT64 address of a non-public IPv4 address");
        }
        0x64 if s[1] == 0xff9b && s[2] == 1 => "a local-use NAT64 address (64:ff9b:1::/48)",
        0x100 if s[1..4] == [0; 3] => "a discard-only address (100::/64)",
        0x2001 if s[1] == 0 => "a Teredo address (2001::/32)",
        0x2001 if s[1] == 0xdb8 => "a documentation address (2001:db8::/32)",
        0x2001 if s[1] < 0x200 => "an IETF protocol address (2001::/23)",
        0x2002 => {
            // 6to4: reaches the embedded IPv4 address.
            return v4_not_public(embedded(s[1], s[2]))
                .map(|_| "a 6to4 address of a non-public IPv4 address");
        }
        x if x & 0xfe00 == 0xfc00 => "a unique local (private) address (fc00::/7)",
        x if x & 0xffc0 == 0xfe80 => "a link-local address (fe80::/10)",
        x if x & 0xffc0 == 0xfec0 => "a site-local address (fec0::/10)",
        x if x & 0xff00 == 0xff00 => "a multicast address",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_addresses_pass_and_others_say_why() {
        for ok in [
            "8.8.8.8",
            "1.1.1.1",
            "2606:4700:4700::1111",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            let ip: IpAddr = ok.parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
            assert_eq!(not_public(ip), None, "{ok}");
        }
        for (bad, why) in [
            ("127.0.0.1", "loopback"),
            ("10.1.2.3", "private"),
            ("172.31.255.255", "private"),
            ("192.168.0.1", "private"),
            ("100.64.0.1", "carrier-grade NAT"),
            ("169.254.169.254", "metadata"),
            ("169.254.1.1", "link-local"),
            ("0.0.0.0", "this network"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "broadcast"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("::ffff:127.0.0.1", "IPv4-mapped"),
            ("::127.0.0.1", "IPv4-compatible"),
            ("64:ff9b::a00:1", "NAT64"),
            ("2002:7f00:1::", "6to4"),
            ("fd00:ec2::254", "metadata"),
            ("fc00::1", "unique local"),
            ("fe80::1", "link-local"),
            ("ff02::1", "multicast"),
            ("2001:db8::1", "documentation"),
            ("2001:0:4136:e378::1", "Teredo"),
        ] {
            let ip: IpAddr = bad.parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
            let reason = not_public(ip).unwrap_or("public");
            assert!(reason.contains(why), "{bad}: {reason}");
        }
    }
}
