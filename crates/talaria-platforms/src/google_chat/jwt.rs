//! The two JSON Web Tokens of a Google Chat app, both RS256.
//!
//! - In: every event Google posts carries `Authorization: Bearer <JWT>`.
//!   [`Verifier`] checks it against Google's published keys (a JWK set,
//!   fetched from configurable URLs and cached), and checks the issuer
//!   (`chat@system.gserviceaccount.com` when the app's authentication
//!   audience is the project number; `accounts.google.com` with the
//!   Chat service account's `email` when it is the endpoint URL), the
//!   audience and the validity window.
//! - Out: [`ServiceAccount`] signs the assertion of the OAuth 2.0 JWT
//!   bearer grant that trades the app's service-account key for an access
//!   token with the `chat.bot` scope.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::signature::{self, RsaKeyPair, RsaPublicKeyComponents};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::http::Http;

/// The issuer of events signed for a project-number audience.
pub(crate) const CHAT_ISSUER: &str = "chat@system.gserviceaccount.com";

/// The issuers of Google's OIDC ID tokens (an endpoint-URL audience).
const OIDC_ISSUERS: [&str; 2] = ["https://accounts.google.com", "accounts.google.com"];

/// How long fetched keys are trusted before they are fetched again.
const KEYS_TTL: Duration = Duration::from_secs(300);

/// An unknown key id fetches the keys again at most this often, so
/// forged tokens cannot make the gateway hammer Google.
const REFETCH_GAP: Duration = Duration::from_secs(10);

/// Clock skew allowed on `exp`, `iat` and `nbf`.
const LEEWAY_SECS: i64 = 60;

/// The scope an app's access token needs to post as the app.
pub(crate) const CHAT_BOT_SCOPE: &str = "https://www.googleapis.com/auth/chat.bot";

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
}

#[derive(Deserialize)]
struct Jwk {
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    kty: String,
    #[serde(default)]
    n: String,
    #[serde(default)]
    e: String,
}

#[derive(Deserialize)]
struct JwkSet {
    #[serde(default)]
    keys: Vec<Jwk>,
}

/// RSA public keys by key id.
type Keys = HashMap<String, (Vec<u8>, Vec<u8>)>;

struct Cache {
    keys: Keys,
    fetched: Option<Instant>,
}

/// Checks the bearer tokens of Google Chat's events (see the module docs).
pub(crate) struct Verifier {
    http: Http,
    urls: Vec<String>,
    audience: String,
    emails: Vec<String>,
    cache: Mutex<Cache>,
}

impl Verifier {
    pub(crate) fn new(
        http: Http,
        urls: Vec<String>,
        audience: String,
        emails: Vec<String>,
    ) -> Verifier {
        Verifier {
            http,
            urls,
            audience,
            emails,
            cache: Mutex::new(Cache {
                keys: HashMap::new(),
                fetched: None,
            }),
        }
    }

    /// The token's claims when it is Google Chat's, for this app, now;
    /// otherwise why not (for the log, never for the caller).
    pub(crate) async fn verify(&self, token: &str) -> Result<Value, String> {
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("not a JWT".into());
        };
        let header: Header = decode_json(h)?;
        if header.alg != "RS256" {
            return Err(format!("the algorithm is {}, not RS256", header.alg));
        }
        let signature = URL_SAFE_NO_PAD
            .decode(s)
            .map_err(|_| "the signature is not base64url".to_owned())?;
        let kid = header.kid.unwrap_or_default();
        let (n, e) = self.key(&kid).await?;
        let signed = &token[..h.len() + 1 + p.len()];
        RsaPublicKeyComponents { n: &n, e: &e }
            .verify(
                &signature::RSA_PKCS1_2048_8192_SHA256,
                signed.as_bytes(),
                &signature,
            )
            .map_err(|_| "the signature does not match Google's key".to_owned())?;
        let claims: Value = decode_json(p)?;
        self.check_claims(&claims, now_secs())?;
        Ok(claims)
    }

    fn check_claims(&self, claims: &Value, now: i64) -> Result<(), String> {
        let iss = claims["iss"].as_str().unwrap_or_default();
        let aud_ok = match &claims["aud"] {
            Value::String(a) => *a == self.audience,
            Value::Array(list) => list.iter().any(|a| a.as_str() == Some(&self.audience)),
            _ => false,
        };
        if !aud_ok {
            return Err("the audience is not this app's".into());
        }
        if iss == CHAT_ISSUER {
            // Signed by the Chat service account itself.
        } else if OIDC_ISSUERS.contains(&iss) {
            let email = claims["email"].as_str().unwrap_or_default();
            let verified = claims["email_verified"].as_bool() != Some(false);
            if !verified || !self.emails.iter().any(|e| e.eq_ignore_ascii_case(email)) {
                return Err(format!(
                    "the token's e-mail {email:?} is not an accepted sender"
                ));
            }
        } else {
            return Err(format!("the issuer {iss:?} is not Google Chat"));
        }
        let exp = claims["exp"].as_i64().ok_or("no expiry")?;
        if exp + LEEWAY_SECS < now {
            return Err("the token expired".into());
        }
        for early in ["iat", "nbf"] {
            if claims[early]
                .as_i64()
                .is_some_and(|t| t - LEEWAY_SECS > now)
            {
                return Err(format!("the token's {early} is in the future"));
            }
        }
        Ok(())
    }

    /// The key `kid`, from the cache or fetched again.
    async fn key(&self, kid: &str) -> Result<(Vec<u8>, Vec<u8>), String> {
        let mut cache = self.cache.lock().await;
        let fresh = cache.fetched.is_some_and(|at| at.elapsed() < KEYS_TTL);
        if fresh && let Some(k) = cache.keys.get(kid) {
            return Ok(k.clone());
        }
        let may_fetch = cache
            .fetched
            .is_none_or(|at| !fresh || at.elapsed() >= REFETCH_GAP);
        if may_fetch {
            match self.fetch().await {
                Ok(keys) => {
                    cache.keys = keys;
                    cache.fetched = Some(Instant::now());
                }
                Err(e) if cache.keys.is_empty() => return Err(e),
                // Keep serving the keys we had while Google is away.
                Err(e) => tracing::warn!("cannot refresh Google's signing keys: {e}"),
            }
        }
        cache
            .keys
            .get(kid)
            .cloned()
            .ok_or_else(|| format!("no Google key has the id {kid:?}"))
    }

    async fn fetch(&self) -> Result<Keys, String> {
        let mut keys = HashMap::new();
        for url in &self.urls {
            let answer = self
                .http
                .send(self.http.client().get(url), Duration::from_secs(10))
                .await
                .map_err(|e| format!("fetching {url}: {e}"))?;
            if !answer.is_success() {
                return Err(format!("fetching {url}: HTTP {}", answer.status));
            }
            let set: JwkSet = self.http.decode(&answer).map_err(|e| e.to_string())?;
            for k in set.keys.into_iter().filter(|k| k.kty == "RSA") {
                let (Ok(n), Ok(e)) = (URL_SAFE_NO_PAD.decode(&k.n), URL_SAFE_NO_PAD.decode(&k.e))
                else {
                    continue;
                };
                keys.insert(k.kid.unwrap_or_default(), (n, e));
            }
        }
        Ok(keys)
    }
}

fn decode_json<T: serde::de::DeserializeOwned>(part: &str) -> Result<T, String> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| "a part is not base64url".to_owned())?;
    serde_json::from_slice(&bytes).map_err(|e| format!("a part is not JSON: {e}"))
}

/// The app's service account, from its JSON key file.
pub(crate) struct ServiceAccount {
    pub email: String,
    pub token_uri: String,
    key: RsaKeyPair,
}

#[derive(Deserialize)]
struct KeyFile {
    client_email: String,
    private_key: String,
    #[serde(default)]
    token_uri: Option<String>,
}

impl ServiceAccount {
    /// Reads the key file's JSON. Errors never quote the key.
    pub(crate) fn from_json(json: &str) -> Result<ServiceAccount, String> {
        // serde's message may quote the text it choked on: only its place.
        let file: KeyFile = serde_json::from_str(json).map_err(|e| {
            format!(
                "the service account key is not a key file's JSON (line {}, column {})",
                e.line(),
                e.column()
            )
        })?;
        let body: String = file
            .private_key
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        let der = STANDARD
            .decode(body.trim())
            .map_err(|_| "the service account's private_key is not PEM".to_owned())?;
        let key = RsaKeyPair::from_pkcs8(&der).map_err(|e| {
            format!("the service account's private_key is not an RSA PKCS#8 key ({e})")
        })?;
        Ok(ServiceAccount {
            email: file.client_email,
            token_uri: file
                .token_uri
                .unwrap_or_else(|| "https://oauth2.googleapis.com/token".to_owned()),
            key,
        })
    }

    /// The signed assertion of a token request, valid for an hour.
    pub(crate) fn assertion(&self) -> Result<String, String> {
        let now = now_secs();
        let header = json!({"alg": "RS256", "typ": "JWT"});
        let claims = json!({
            "iss": self.email, "scope": CHAT_BOT_SCOPE, "aud": self.token_uri,
            "iat": now, "exp": now + 3600,
        });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let mut sig = vec![0u8; self.key.public().modulus_len()];
        self.key
            .sign(
                &signature::RSA_PKCS1_SHA256,
                &ring::rand::SystemRandom::new(),
                signing_input.as_bytes(),
                &mut sig,
            )
            .map_err(|_| "cannot sign with the service account key".to_owned())?;
        Ok(format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(sig)))
    }
}

impl std::fmt::Debug for ServiceAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccount")
            .field("email", &self.email)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verifier() -> Verifier {
        Verifier::new(
            Http::new(crate::http::Service {
                name: "Google",
                request: "a Google request",
                code_label: None,
            })
            .unwrap(),
            Vec::new(),
            "123456789".into(),
            vec![CHAT_ISSUER.into()],
        )
    }

    #[test]
    fn claims_are_checked() {
        let v = verifier();
        let now = 1_700_000_000;
        let good = json!({"iss": CHAT_ISSUER, "aud": "123456789", "iat": now, "exp": now + 3600});
        assert_eq!(v.check_claims(&good, now), Ok(()));
        let mut bad = good.clone();
        bad["aud"] = json!("987");
        assert!(v.check_claims(&bad, now).is_err());
        let mut bad = good.clone();
        bad["iss"] = json!("someone@example.com");
        assert!(v.check_claims(&bad, now).is_err());
        assert!(v.check_claims(&good, now + 3600 + 61).is_err(), "expired");
        assert!(
            v.check_claims(&good, now - 120).is_err(),
            "issued in the future"
        );
        let oidc = json!({"iss": "https://accounts.google.com", "aud": "123456789",
                          "email": CHAT_ISSUER, "email_verified": true, "exp": now + 60});
        assert_eq!(v.check_claims(&oidc, now), Ok(()));
        let mut other = oidc.clone();
        other["email"] = json!("mallory@gmail.com");
        assert!(v.check_claims(&other, now).is_err());
    }

    #[test]
    fn a_key_file_without_a_pem_key_is_refused_without_quoting_it() {
        let e = ServiceAccount::from_json(
            r#"{"client_email": "a@b.iam.gserviceaccount.com", "private_key": "SECRETKEYMATERIAL"}"#,
        )
        .unwrap_err();
        assert!(!e.contains("SECRETKEYMATERIAL"), "{e}");
        assert!(ServiceAccount::from_json("{").is_err());
    }
}
