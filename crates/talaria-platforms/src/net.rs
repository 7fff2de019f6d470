//! Small network helpers several adapters share.

/// Whether `host` names this machine only (`localhost`, a loopback
/// address, bracketed or not).
#[cfg(any(feature = "ingress", feature = "email", feature = "irc"))]
pub(crate) fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for host in [
            "127.0.0.1",
            "localhost",
            "::1",
            "[::1]",
            "LOCALHOST",
            "127.1.2.3",
        ] {
            assert!(is_loopback(host), "{host}");
        }
        for host in ["0.0.0.0", "example.org", "192.168.1.2", "::"] {
            assert!(!is_loopback(host), "{host}");
        }
    }
}
