//! Signature checks, one per [`WebhookScheme`].
//!
//! Every comparison of something the caller sent with something derived
//! from the secret goes through [`Mac::verify_slice`], which compares in
//! constant time, so response timing says nothing about how much of a
//! guess was right. Schemes with a timestamp refuse deliveries more than
//! [`TOLERANCE_SECS`] away from the injected clock, which bounds how long a
//! captured delivery can be replayed (the replay cache covers the rest).

use super::WebhookScheme;
use axum::http::HeaderMap;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// How far a signed timestamp may be from now, either way.
pub const TOLERANCE_SECS: i64 = 300;

/// Signature entries looked at in one Svix header; a sender rotating keys
/// sends two or three, so more is only extra work for us.
const MAX_SVIX_ENTRIES: usize = 8;

/// Why a delivery's signature was refused. Only logged: the caller gets
/// the same 401 for every reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A header the scheme needs is absent.
    #[error("no {0} header")]
    Missing(&'static str),
    /// A header is there but cannot be read (not ASCII, not hex, ...).
    #[error("the {0} header is malformed")]
    Malformed(&'static str),
    /// The signed timestamp is too far from now.
    #[error("the signed timestamp is {0} s away from now")]
    Stale(i64),
    /// Well-formed, but not made with this route's secret.
    #[error("the signature does not match")]
    Mismatch,
}

/// What a passing check vouches for besides the body: the values the
/// signature covered, so the replay cache can be keyed on them rather than
/// on headers a replayer could add or change.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Signed<'a> {
    /// The delivery id the signature covers (Svix: `svix-id`, or
    /// `webhook-id` when that is the one that was used).
    pub id: Option<&'a str>,
    /// The timestamp the signature covers (Svix and the generic scheme).
    pub timestamp: Option<&'a str>,
}

/// One route's check: its scheme and the MAC keyed with its secret.
pub struct Verifier {
    scheme: WebhookScheme,
    /// Keyed, nothing fed yet; cloned for every delivery.
    mac: HmacSha256,
    /// For GitLab only: the MAC of the secret itself (see
    /// [`Verifier::gitlab`]); the other schemes never need it.
    token_mac: Option<Vec<u8>>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("scheme", &self.scheme)
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// The check for `scheme` with `secret`.
    ///
    /// # Errors
    /// A Svix secret with the `whsec_` prefix whose rest is not base64.
    pub fn new(scheme: WebhookScheme, secret: &str) -> Result<Verifier, String> {
        let key = match scheme {
            WebhookScheme::Svix => match secret.strip_prefix("whsec_") {
                Some(encoded) => BASE64
                    .decode(encoded.trim())
                    .map_err(|e| format!("the whsec_ secret is not valid base64 ({e})"))?,
                None => secret.as_bytes().to_vec(),
            },
            _ => secret.as_bytes().to_vec(),
        };
        if key.is_empty() {
            return Err("the secret is empty".to_owned());
        }
        let mac = <HmacSha256 as Mac>::new_from_slice(&key)
            .map_err(|e| format!("the secret cannot key HMAC-SHA256 ({e})"))?;
        let token_mac = (scheme == WebhookScheme::Gitlab).then(|| {
            let mut token = mac.clone();
            token.update(&key);
            token.finalize().into_bytes().to_vec()
        });
        Ok(Verifier {
            scheme,
            mac,
            token_mac,
        })
    }

    /// Checks one delivery. `now` is the current time in unix seconds.
    ///
    /// # Errors
    /// Why the delivery is not authentic (see [`Refusal`]).
    pub fn verify<'a>(
        &self,
        headers: &'a HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<Signed<'a>, Refusal> {
        match self.scheme {
            WebhookScheme::Github => self.github(headers, body).map(|()| Signed::default()),
            WebhookScheme::Gitlab => self.gitlab(headers).map(|()| Signed::default()),
            WebhookScheme::Svix => self.svix(headers, body, now),
            WebhookScheme::Hmac => self.generic(headers, body, now),
        }
    }

    fn github(&self, headers: &HeaderMap, body: &[u8]) -> Result<(), Refusal> {
        const NAME: &str = "X-Hub-Signature-256";
        let value = header(headers, NAME)?;
        let hex = value
            .strip_prefix("sha256=")
            .ok_or(Refusal::Malformed(NAME))?;
        let presented = decode_hex(hex).ok_or(Refusal::Malformed(NAME))?;
        let mut mac = self.mac.clone();
        mac.update(body);
        mac.verify_slice(&presented).map_err(|_| Refusal::Mismatch)
    }

    fn gitlab(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let presented = header(headers, "X-Gitlab-Token")?;
        // Only a verifier built for another scheme lacks the token MAC, and
        // it never gets here; refusing keeps that impossible case closed.
        let expected = self.token_mac.as_deref().ok_or(Refusal::Mismatch)?;
        // GitLab sends the secret itself. Comparing MACs of both sides keyed
        // with the secret makes the comparison constant-time and of fixed
        // length, so not even the secret's length leaks.
        let mut mac = self.mac.clone();
        mac.update(presented.as_bytes());
        mac.verify_slice(expected).map_err(|_| Refusal::Mismatch)
    }

    fn svix<'a>(
        &self,
        headers: &'a HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<Signed<'a>, Refusal> {
        // Standard Webhooks is Svix without the brand: same scheme, headers
        // named `webhook-*`.
        let either = |svix: &'static str, standard: &'static str| {
            header(headers, svix).or_else(|_| header(headers, standard))
        };
        let id = either("svix-id", "webhook-id")?;
        let timestamp = either("svix-timestamp", "webhook-timestamp")?;
        let signatures = either("svix-signature", "webhook-signature")?;
        check_timestamp(timestamp, "svix-timestamp", now)?;
        let mut mac = self.mac.clone();
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.as_bytes());
        mac.update(b".");
        mac.update(body);
        let matched = signatures
            .split_whitespace()
            .take(MAX_SVIX_ENTRIES)
            .filter_map(|entry| entry.strip_prefix("v1,"))
            .filter_map(|b64| BASE64.decode(b64).ok())
            .any(|sig| mac.clone().verify_slice(&sig).is_ok());
        if matched {
            Ok(Signed {
                id: Some(id),
                timestamp: Some(timestamp),
            })
        } else {
            Err(Refusal::Mismatch)
        }
    }

    fn generic<'a>(
        &self,
        headers: &'a HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<Signed<'a>, Refusal> {
        const NAME: &str = "X-Webhook-Signature";
        let timestamp = header(headers, "X-Webhook-Timestamp")?;
        check_timestamp(timestamp, "X-Webhook-Timestamp", now)?;
        let value = header(headers, NAME)?;
        let hex = value.strip_prefix("sha256=").unwrap_or(value);
        let presented = decode_hex(hex).ok_or(Refusal::Malformed(NAME))?;
        let mut mac = self.mac.clone();
        mac.update(timestamp.as_bytes());
        mac.update(b".");
        mac.update(body);
        mac.verify_slice(&presented)
            .map_err(|_| Refusal::Mismatch)?;
        Ok(Signed {
            id: None,
            timestamp: Some(timestamp),
        })
    }
}

/// A header's value, trimmed; absent, empty and non-ASCII are refusals.
fn header<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<&'a str, Refusal> {
    let value = headers.get(name).ok_or(Refusal::Missing(name))?;
    let text = value.to_str().map_err(|_| Refusal::Malformed(name))?.trim();
    if text.is_empty() {
        return Err(Refusal::Missing(name));
    }
    Ok(text)
}

fn check_timestamp(text: &str, name: &'static str, now: i64) -> Result<(), Refusal> {
    let ts: i64 = text.parse().map_err(|_| Refusal::Malformed(name))?;
    let skew = now.saturating_sub(ts);
    if skew.unsigned_abs() > TOLERANCE_SECS.unsigned_abs() {
        return Err(Refusal::Stale(skew));
    }
    Ok(())
}

/// Decodes hex in either case; `None` for odd lengths or other characters.
fn decode_hex(text: &str) -> Option<Vec<u8>> {
    let digits = text.as_bytes();
    if digits.is_empty() || !digits.len().is_multiple_of(2) {
        return None;
    }
    let nibble = |c: u8| (c as char).to_digit(16);
    digits
        .chunks_exact(2)
        .map(|pair| Some((nibble(pair[0])? << 4 | nibble(pair[1])?) as u8))
        .collect()
}

/// Lower-case hex, for signing in tests and for body digests.
pub fn encode_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const NOW: i64 = 1_700_000_000;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn hmac_hex(key: &[u8], data: &[u8]) -> String {
        let mut mac = HmacSha256::new_from_slice(key).unwrap();
        mac.update(data);
        encode_hex(&mac.finalize().into_bytes())
    }

    #[test]
    fn hex_round_trips_and_refuses_junk() {
        assert_eq!(decode_hex("00ffA0"), Some(vec![0, 255, 160]));
        assert_eq!(encode_hex(&[0, 255, 160]), "00ffa0");
        for bad in ["", "0", "zz", "0g", "é0"] {
            assert_eq!(decode_hex(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn github_known_answer() {
        // The example from GitHub's "Validating webhook deliveries" docs.
        let v = Verifier::new(WebhookScheme::Github, "It's a Secret to Everybody").unwrap();
        let sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        let h = headers(&[("X-Hub-Signature-256", sig)]);
        // GitHub signs neither an id nor a timestamp.
        assert_eq!(v.verify(&h, b"Hello, World!", NOW), Ok(Signed::default()));
        assert_eq!(v.verify(&h, b"Hello, World?", NOW), Err(Refusal::Mismatch));
        let h = headers(&[("X-Hub-Signature-256", &sig[7..])]);
        assert!(matches!(
            v.verify(&h, b"Hello, World!", NOW),
            Err(Refusal::Malformed(_))
        ));
        assert!(matches!(
            v.verify(&HeaderMap::new(), b"x", NOW),
            Err(Refusal::Missing(_))
        ));
    }

    #[test]
    fn only_gitlab_keeps_a_token_mac() {
        for scheme in [
            WebhookScheme::Github,
            WebhookScheme::Svix,
            WebhookScheme::Hmac,
        ] {
            assert!(Verifier::new(scheme, "k").unwrap().token_mac.is_none());
        }
        let v = Verifier::new(WebhookScheme::Gitlab, "k").unwrap();
        assert!(v.token_mac.is_some());
    }

    #[test]
    fn gitlab_token_must_be_equal() {
        let v = Verifier::new(WebhookScheme::Gitlab, "tok-123").unwrap();
        assert_eq!(
            v.verify(&headers(&[("X-Gitlab-Token", "tok-123")]), b"", NOW),
            Ok(Signed::default())
        );
        for bad in ["tok-124", "tok-12", "tok-1234", "x"] {
            assert_eq!(
                v.verify(&headers(&[("X-Gitlab-Token", bad)]), b"", NOW),
                Err(Refusal::Mismatch),
                "{bad}"
            );
        }
    }

    #[test]
    fn svix_keys_entries_and_window() {
        let raw_key = b"svix-test-key-0123456789";
        let secret = format!("whsec_{}", BASE64.encode(raw_key));
        let v = Verifier::new(WebhookScheme::Svix, &secret).unwrap();
        let ts = NOW.to_string();
        let mut mac = HmacSha256::new_from_slice(raw_key).unwrap();
        mac.update(format!("msg_1.{ts}.{{}}").as_bytes());
        let good = BASE64.encode(mac.finalize().into_bytes());
        let list = format!("v1,{} v2,zzz v1,{good}", BASE64.encode([0u8; 32]));
        let h = headers(&[
            ("svix-id", "msg_1"),
            ("svix-timestamp", &ts),
            ("svix-signature", &list),
        ]);
        let signed = Signed {
            id: Some("msg_1"),
            timestamp: Some(ts.as_str()),
        };
        assert_eq!(v.verify(&h, b"{}", NOW), Ok(signed));
        assert_eq!(v.verify(&h, b"{}", NOW + TOLERANCE_SECS), Ok(signed));
        assert_eq!(
            v.verify(&h, b"{}", NOW + TOLERANCE_SECS + 1),
            Err(Refusal::Stale(TOLERANCE_SECS + 1))
        );
        assert_eq!(v.verify(&h, b"{ }", NOW), Err(Refusal::Mismatch));
        // The same delivery under Standard Webhooks names.
        let h = headers(&[
            ("webhook-id", "msg_1"),
            ("webhook-timestamp", &ts),
            ("webhook-signature", &format!("v1,{good}")),
        ]);
        assert_eq!(v.verify(&h, b"{}", NOW), Ok(signed));
        // An empty `svix-id` is absent: the `webhook-id` that was signed is
        // the one reported, not the header that merely came first.
        let mut h = h;
        h.insert("svix-id", HeaderValue::from_static(""));
        assert_eq!(v.verify(&h, b"{}", NOW).map(|s| s.id), Ok(Some("msg_1")));
        assert!(Verifier::new(WebhookScheme::Svix, "whsec_!!!").is_err());
        // Without the prefix the secret's bytes are the key.
        let v = Verifier::new(WebhookScheme::Svix, "plain").unwrap();
        let mut mac = HmacSha256::new_from_slice(b"plain").unwrap();
        mac.update(format!("m.{ts}.x").as_bytes());
        let sig = format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()));
        let h = headers(&[
            ("svix-id", "m"),
            ("svix-timestamp", &ts),
            ("svix-signature", &sig),
        ]);
        assert!(v.verify(&h, b"x", NOW).is_ok());
    }

    #[test]
    fn generic_hmac_signs_timestamp_and_body() {
        let v = Verifier::new(WebhookScheme::Hmac, "k").unwrap();
        let ts = NOW.to_string();
        let hex = hmac_hex(b"k", format!("{ts}.body").as_bytes());
        for sig in [format!("sha256={hex}"), hex.clone(), hex.to_uppercase()] {
            let h = headers(&[("X-Webhook-Timestamp", &ts), ("X-Webhook-Signature", &sig)]);
            let signed = Signed {
                id: None,
                timestamp: Some(ts.as_str()),
            };
            assert_eq!(v.verify(&h, b"body", NOW), Ok(signed), "{sig}");
        }
        let h = headers(&[("X-Webhook-Signature", &hex)]);
        assert_eq!(
            v.verify(&h, b"body", NOW),
            Err(Refusal::Missing("X-Webhook-Timestamp"))
        );
        let h = headers(&[("X-Webhook-Timestamp", &ts), ("X-Webhook-Signature", &hex)]);
        assert_eq!(
            v.verify(&h, b"body", NOW - TOLERANCE_SECS - 1),
            Err(Refusal::Stale(-TOLERANCE_SECS - 1))
        );
        // A signature over the body alone (no timestamp) does not pass.
        let body_only = hmac_hex(b"k", b"body");
        let h = headers(&[
            ("X-Webhook-Timestamp", &ts),
            ("X-Webhook-Signature", &body_only),
        ]);
        assert_eq!(v.verify(&h, b"body", NOW), Err(Refusal::Mismatch));
        let h = headers(&[
            ("X-Webhook-Timestamp", "soon"),
            ("X-Webhook-Signature", &hex),
        ]);
        assert!(matches!(
            v.verify(&h, b"body", NOW),
            Err(Refusal::Malformed(_))
        ));
    }
}
