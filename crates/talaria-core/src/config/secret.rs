//! Credentials in the configuration (`Secret`), finding and masking them, and the
//! per-platform environment variable names.

use super::*;

/// The environment variable `<PLATFORM>_<suffix>` for a platform name
/// (`telegram` + `HOME_CHANNEL` → `TELEGRAM_HOME_CHANNEL`): upper-cased,
/// anything but letters and digits as `_`, so `whatsapp-cloud` gives a
/// name a shell can set. Every per-platform variable is named this way.
pub fn platform_var(platform: &str, suffix: &str) -> String {
    let prefix: String = platform
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("{prefix}_{suffix}")
}

/// Equality whose time does not depend on where the inputs first differ,
/// so a guesser learns nothing from timing about how close a guess was.
/// Lengths are not hidden: callers compare values whose length is not
/// secret (fixed-size hashes, keys whose length is public).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Keeps the optimiser from turning the fold back into an early exit.
    std::hint::black_box(diff) == 0
}

/// A secret string. Its `Debug` and `Serialize` forms are masked so that
/// printing a config (or logging one by accident) never shows the value.
///
/// Every credential in the configuration is held in this type: that is
/// what [`Config::secret_values`] finds (by walking the configuration, not
/// by a list of fields), so a new `Secret` field is redacted everywhere
/// without anyone remembering to add it.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(String);

/// The key of the one-entry object a [`Secret`] becomes while
/// [`collect_secrets`] walks a value. A NUL byte keeps it from ever being a
/// name anybody writes in a config file.
const SECRET_MARK: &str = "\0talaria:secret";

thread_local! {
    /// Set only while [`collect_secrets`] serializes on this thread: then,
    /// and only then, a [`Secret`] serializes its real value (marked).
    static REVEAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether [`collect_secrets`] is walking a value on this thread, so that
/// what holds a credential serializes it in full.
pub(super) fn revealing() -> bool {
    REVEAL.with(std::cell::Cell::get)
}

/// Clears [`REVEAL`] however the walk ends (a panic included).
struct RevealGuard;

impl Drop for RevealGuard {
    fn drop(&mut self) {
        REVEAL.with(|r| r.set(false));
    }
}

/// Every secret value inside `value`: each [`Secret`] anywhere in its
/// serialized form, plus the credentials written into URLs (a password in
/// `scheme://user:password@host`, a `?api-key=...` query value) and the
/// values of maps that hold credentials by name (an MCP server's `env`
/// entries named like `*_TOKEN`, its `headers`), which stay plain strings
/// because they may be `${VAR}` references.
///
/// `Secret`'s ordinary serialization is masked, so printing a config never
/// shows a value; this walk alone turns the masking off, on this thread,
/// for its own duration.
pub fn collect_secrets<T: Serialize>(value: &T) -> Vec<String> {
    let tree = {
        REVEAL.with(|r| r.set(true));
        let _guard = RevealGuard;
        serde_json::to_value(value)
    };
    let mut out = Vec::new();
    match tree {
        Ok(tree) => walk_secrets(&tree, None, &mut out),
        // Only a map with non-string keys fails to serialize, and the
        // configuration has none; say so loudly rather than redact nothing.
        Err(e) => tracing::error!("cannot walk the configuration for secrets: {e}"),
    }
    out.retain(|v| !v.is_empty());
    out.sort();
    out.dedup();
    out
}

/// Whether a map key names a credential (`GITHUB_TOKEN`, `X-Api-Key`,
/// `Authorization`).
pub(super) fn names_a_credential(key: &str) -> bool {
    let k = key.to_ascii_uppercase();
    [
        "KEY",
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "AUTH",
        "CREDENTIAL",
    ]
    .iter()
    .any(|m| k.contains(m))
}

fn walk_secrets(v: &serde_json::Value, key: Option<&str>, out: &mut Vec<String>) {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            if map.len() == 1
                && let Some(Value::String(secret)) = map.get(SECRET_MARK)
            {
                out.push(secret.clone());
                return;
            }
            // Header values are credentials whatever the header's name.
            let all_secret = key == Some("headers");
            for (k, child) in map {
                match child {
                    Value::String(s)
                        if (all_secret || names_a_credential(k))
                            && !k.ends_with("_env")
                            && !s.contains("${") =>
                    {
                        out.push(s.clone());
                    }
                    _ => walk_secrets(child, Some(k), out),
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                walk_secrets(item, key, out);
            }
        }
        Value::String(s) => out.extend(url_secrets(s)),
        _ => {}
    }
}

/// The credentials written into a URL: the password of its userinfo
/// (`scheme://user:password@host`) and the values of query parameters whose
/// name says credential (`?api-key=...`, `&token=...`, `&sig=...`). Not a
/// URL, or none of those: nothing.
pub fn url_secrets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let Some(scheme_end) = text.find("://") else {
        return out;
    };
    let rest = &text[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    if let Some((userinfo, _host)) = authority.rsplit_once('@')
        && let Some((_user, password)) = userinfo.split_once(':')
    {
        out.push(password.to_owned());
    }
    if let Some(q) = rest.find('?') {
        let query = &rest[q + 1..];
        let query = query.split('#').next().unwrap_or_default();
        for pair in query.split('&') {
            if let Some((name, value)) = pair.split_once('=')
                && crate::redact::is_credential_param(name)
            {
                out.push(value.to_owned());
            }
        }
    }
    out.retain(|v| !v.is_empty());
    out
}

impl Secret {
    /// Holds `value` as a secret.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The real value, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// A masked rendering that keeps just enough to tell keys apart.
    pub fn masked(&self) -> String {
        mask(&self.0)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Secret {
        Secret(value.to_owned())
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Secret {
        Secret(value)
    }
}

// Tests and settings compare a held credential with the text expected.
impl PartialEq<str> for Secret {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for Secret {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for Secret {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

/// A credential from the configuration file, else from the environment
/// variable `var`: each trimmed, and a blank one counts as unset (an empty
/// `token: ""` left in a file must not hide the variable).
pub fn secret_or_env(configured: Option<&Secret>, env: &Env, var: &str) -> Option<Secret> {
    text_or_env(configured.map(Secret::expose), env, var).map(Secret)
}

/// [`secret_or_env`] for a value that is not a secret (a server URL, an
/// account name).
pub fn text_or_env(configured: Option<&str>, env: &Env, var: &str) -> Option<String> {
    let pick = |v: &str| Some(v.trim().to_owned()).filter(|v| !v.is_empty());
    configured
        .and_then(pick)
        .or_else(|| env.get(var).and_then(pick))
}

/// Masks a secret value: short ones entirely, long ones but the last four.
pub fn mask(value: &str) -> String {
    let n = value.chars().count();
    if n <= 8 {
        "****".to_owned()
    } else {
        let tail: String = value.chars().skip(n - 4).collect();
        format!("****{tail}")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.masked())
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if revealing() {
            use serde::ser::SerializeMap;
            let mut map = s.serialize_map(Some(1))?;
            map.serialize_entry(SECRET_MARK, &self.0)?;
            map.end()
        } else {
            s.serialize_str(&self.masked())
        }
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Secret, D::Error> {
        String::deserialize(d).map(Secret)
    }
}
