//! Twilio's request signature (`X-Twilio-Signature`).
//!
//! Twilio signs every webhook with the account's auth token: the base64
//! HMAC-SHA1 of the URL it called followed by the POST parameters, sorted
//! by name, each name immediately followed by its value (no separators,
//! values not URL-encoded). The URL is the one configured in Twilio's
//! console, which is what `webhook_url` holds: behind a reverse proxy the
//! URL this process sees is not the one Twilio signed.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use sha1::Sha1;

type HmacSha1 = Hmac<Sha1>;

/// The header Twilio puts the signature in.
pub(crate) const HEADER: &str = "X-Twilio-Signature";

/// Checks signatures for one auth token and one public URL.
pub(crate) struct Verifier {
    /// Keyed with the auth token, nothing fed yet; cloned per request.
    mac: HmacSha1,
    url: String,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// A verifier for `auth_token` over `url` (exactly as Twilio calls it).
    ///
    /// # Errors
    /// Only if HMAC refused the key, which it does for no length.
    pub(crate) fn new(auth_token: &str, url: &str) -> Result<Verifier, String> {
        let mac = <HmacSha1 as Mac>::new_from_slice(auth_token.as_bytes())
            .map_err(|e| format!("the auth token cannot key HMAC-SHA1 ({e})"))?;
        Ok(Verifier {
            mac,
            url: url.to_owned(),
        })
    }

    /// The MAC of `url` and the sorted `params`, as Twilio computes it.
    fn mac_of(&self, params: &[(String, String)]) -> HmacSha1 {
        let mut sorted: Vec<&(String, String)> = params.iter().collect();
        // By name, then by value for a name given twice, so the order the
        // form arrived in never matters.
        sorted.sort();
        let mut mac = self.mac.clone();
        mac.update(self.url.as_bytes());
        for (name, value) in sorted {
            mac.update(name.as_bytes());
            mac.update(value.as_bytes());
        }
        mac
    }

    /// The signature Twilio would send for `params` (for tests and logs of
    /// nothing secret: it is a MAC, not the token).
    #[cfg(test)]
    pub(crate) fn sign(&self, params: &[(String, String)]) -> String {
        BASE64.encode(self.mac_of(params).finalize().into_bytes())
    }

    /// Whether `presented` is the signature of `params`. The comparison is
    /// constant-time (`verify_slice`); a header that is not base64 of the
    /// right length is simply not a match.
    pub(crate) fn verify(&self, presented: &str, params: &[(String, String)]) -> bool {
        let Ok(raw) = BASE64.decode(presented.trim()) else {
            return false;
        };
        self.mac_of(params).verify_slice(&raw).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// The example of Twilio's "Webhooks security" documentation: auth
    /// token `12345`, this URL, these parameters.
    #[test]
    fn twilio_documentation_vector() {
        let url = "https://mycompany.com/myapp.php?foo=1&bar=2";
        let v = Verifier::new("12345", url).unwrap();
        let params = pairs(&[
            ("CallSid", "CA1234567890ABCDE"),
            ("Caller", "+12349013030"),
            ("Digits", "1234"),
            ("From", "+12349013030"),
            ("To", "+18005551212"),
        ]);
        assert_eq!(v.sign(&params), "0/KCTR6DLpKmkAf8muzZqo1nDgQ=");
        assert!(v.verify("0/KCTR6DLpKmkAf8muzZqo1nDgQ=", &params));
        // The order the form arrived in does not matter.
        let mut reversed = params.clone();
        reversed.reverse();
        assert!(v.verify("0/KCTR6DLpKmkAf8muzZqo1nDgQ=", &reversed));
        // Another example from Twilio's snippets, with other numbers.
        let params = pairs(&[
            ("CallSid", "CA1234567890ABCDE"),
            ("Caller", "+14158675309"),
            ("Digits", "1234"),
            ("From", "+14158675309"),
            ("To", "+18005551212"),
        ]);
        assert!(v.verify("RSOYDt4T1cUTdK1PDd93/VVr8B8=", &params));
    }

    #[test]
    fn anything_else_is_refused() {
        let url = "https://mycompany.com/myapp.php?foo=1&bar=2";
        let params = pairs(&[("Body", "hi"), ("From", "+15550001111")]);
        let good = Verifier::new("12345", url).unwrap().sign(&params);
        let v = Verifier::new("12345", url).unwrap();
        assert!(v.verify(&good, &params));
        // Another token, another URL, a changed value, an added parameter.
        assert!(!Verifier::new("12346", url).unwrap().verify(&good, &params));
        assert!(
            !Verifier::new("12345", "https://mycompany.com/other")
                .unwrap()
                .verify(&good, &params)
        );
        assert!(!v.verify(&good, &pairs(&[("Body", "hi!"), ("From", "+15550001111")])));
        let mut more = params.clone();
        more.push(("To".into(), "+15550002222".into()));
        assert!(!v.verify(&good, &more));
        // Not base64, empty, truncated.
        for bad in ["", "!!!", &good[..good.len() - 4]] {
            assert!(!v.verify(bad, &params), "{bad:?}");
        }
    }
}
