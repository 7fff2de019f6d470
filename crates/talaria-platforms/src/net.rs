//! Small network helpers several adapters share.

#[cfg(any(
    feature = "mattermost",
    feature = "signal",
    feature = "sms",
    feature = "whatsapp"
))]
use reqwest::header::HeaderMap;

/// Whether `host` names this machine only (`localhost`, a loopback
/// address, bracketed or not).
#[cfg(any(feature = "ingress", feature = "email"))]
pub(crate) fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A header holding a number of seconds (`Retry-After` and its kin),
/// rounded up; fractions, spaces and nonsense are handled, negative or
/// non-finite values ignored.
#[cfg(any(
    feature = "mattermost",
    feature = "signal",
    feature = "sms",
    feature = "whatsapp"
))]
pub(crate) fn header_secs(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(|s| s.ceil() as u64)
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

    #[test]
    fn header_seconds_round_up_and_refuse_nonsense() {
        let mut h = HeaderMap::new();
        for (value, want) in [
            ("2", Some(2)),
            (" 1.2 ", Some(2)),
            ("-1", None),
            ("soon", None),
        ] {
            h.insert("retry-after", value.parse().unwrap());
            assert_eq!(header_secs(&h, "retry-after"), want, "{value}");
        }
        assert_eq!(header_secs(&h, "x-absent"), None);
    }
}
