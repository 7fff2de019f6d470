//! Secret redaction for tool output, logs and stored assistant text.
//!
//! Two layers: patterns that recognise well-known credential shapes, and the
//! exact values loaded from config and `.env` (which no pattern can know).

use std::sync::LazyLock;

use regex::Regex;

/// Replaces secrets in text. Cheap to clone and share.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    /// Known secret values, longest first so a value that contains another
    /// is replaced whole.
    values: Vec<String>,
}

struct Pattern {
    re: Regex,
    /// Which capture group holds the secret (0 = whole match).
    group: usize,
}

// Word boundaries and digits are ASCII: every credential shape here is
// ASCII, and Unicode `\b` and `\d` make each compiled pattern hundreds of
// kilobytes larger and keep the fast DFA engines from running them (this
// runs on every log line and every stored answer).
static PATTERNS: LazyLock<Vec<Pattern>> = LazyLock::new(|| {
    let p = |re: &str, group: usize| Pattern {
        // The patterns are constants; a typo is caught by the tests below.
        re: Regex::new(re).unwrap_or_else(|e| panic!("bad redaction pattern {re}: {e}")),
        group,
    };
    vec![
        // Private key blocks, whole.
        p(
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\z)",
            0,
        ),
        // Authorization headers (Bearer, Basic, raw tokens).
        p(
            r"(?i)(?-u:\b)(?:proxy-)?authorization\s*[:=]\s*(?:(?:bearer|basic|token)\s+)?([^\s,;'\x22]+)",
            1,
        ),
        // OpenAI / Anthropic / OpenRouter style keys.
        p(r"(?-u:\b)sk-[A-Za-z0-9_\-]{16,}", 0),
        // GitHub tokens.
        p(r"(?-u:\b)(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}", 0),
        p(r"(?-u:\b)github_pat_[A-Za-z0-9_]{20,}", 0),
        // Slack tokens.
        p(r"(?-u:\b)xox[abprse]-[A-Za-z0-9\-]{10,}", 0),
        // AWS access key ids and secret keys written as assignments.
        p(r"(?-u:\b)(?:AKIA|ASIA)[0-9A-Z]{16}(?-u:\b)", 0),
        p(
            r"(?i)aws_secret_access_key\s*[:=]\s*['\x22]?([A-Za-z0-9/+=]{40})",
            1,
        ),
        // Telegram bot tokens: <bot id>:<35 chars>.
        p(r"(?-u:\b)[0-9]{6,12}:[A-Za-z0-9_\-]{35}(?-u:\b)", 0),
        // Google API keys.
        p(r"(?-u:\b)AIza[0-9A-Za-z_\-]{35}(?-u:\b)", 0),
        // The password in a URL's userinfo: `scheme://user:password@host`.
        p(
            r"(?i)(?-u:\b)[a-z][a-z0-9+.\-]*://[^\s/?#@:]*:([^\s/?#@]+)@",
            1,
        ),
        // Credential query parameters: `?api-key=...`, `&access_token=...`,
        // `&sig=...` (the names [`is_credential_param`] accepts).
        p(
            r"(?i)[?&](?:[a-z0-9_.\-]*(?:key|token|secret|passw|pwd|sig|auth|credential)[a-z0-9_.\-]*|code)=([^&#\s'\x22<>)]+)",
            1,
        ),
    ]
});

/// Whether a URL query parameter of this name carries a credential
/// (`api-key`, `access_token`, `sig`, `code`, ...). The redaction pattern
/// for query strings accepts the same names.
pub fn is_credential_param(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n == "code"
        || [
            "key",
            "token",
            "secret",
            "passw",
            "pwd",
            "sig",
            "auth",
            "credential",
        ]
        .iter()
        .any(|m| n.contains(m))
}

const MARK: &str = "[REDACTED]";

impl Redactor {
    /// A redactor that also removes these exact values (short values are
    /// ignored: redacting "abc" everywhere would destroy ordinary text).
    pub fn new<I: IntoIterator<Item = String>>(values: I) -> Redactor {
        let mut values: Vec<String> = values.into_iter().filter(|v| v.len() >= 8).collect();
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        values.dedup();
        Redactor { values }
    }

    /// Adds more exact values.
    pub fn with_values<I: IntoIterator<Item = String>>(mut self, more: I) -> Redactor {
        let mut all = std::mem::take(&mut self.values);
        all.extend(more);
        Redactor::new(all)
    }

    /// The text with every recognised secret replaced by `[REDACTED]`.
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for v in &self.values {
            if out.contains(v.as_str()) {
                out = out.replace(v.as_str(), MARK);
            }
        }
        for p in PATTERNS.iter() {
            if !p.re.is_match(&out) {
                continue;
            }
            out =
                p.re.replace_all(&out, |caps: &regex::Captures<'_>| {
                    let whole = caps.get(0).map_or("", |m| m.as_str());
                    match caps.get(p.group) {
                        Some(secret) if p.group != 0 => {
                            let start = secret.start() - caps.get(0).map_or(0, |m| m.start());
                            format!(
                                "{}{MARK}{}",
                                &whole[..start],
                                &whole[start + secret.as_str().len()..]
                            )
                        }
                        _ => MARK.to_owned(),
                    }
                })
                .into_owned();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_shapes_are_redacted() {
        let r = Redactor::default();
        let cases = [
            "key sk-proj-abcdefghijklmnopqrstuvwx end",
            "token ghp_abcdefghijklmnopqrstuvwxyz0123 end",
            "slack xoxb-1234567890-abcdefghij end",
            "aws AKIAIOSFODNN7EXAMPLE end",
            "bot 123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw1 end",
            "-----BEGIN RSA PRIVATE KEY-----\nMIIabc\n-----END RSA PRIVATE KEY-----",
        ];
        for c in cases {
            let out = r.redact(c);
            assert!(out.contains(MARK), "{c} -> {out}");
            for secret in [
                "abcdefghijklmnopqrstuvwx",
                "AKIAIOSFODNN7EXAMPLE",
                "MIIabc",
                "AAHdqTcv",
            ] {
                assert!(!out.contains(secret), "{c} -> {out}");
            }
        }
    }

    #[test]
    fn authorization_headers_keep_their_name() {
        let out = Redactor::default().redact("Authorization: Bearer abc.def.ghi\nnext");
        assert_eq!(out, "Authorization: Bearer [REDACTED]\nnext");
    }

    #[test]
    fn exact_values_are_redacted_and_short_ones_ignored() {
        let r = Redactor::new(["my-private-value-42".to_owned(), "abc".to_owned()]);
        assert_eq!(r.redact("x my-private-value-42 abc"), "x [REDACTED] abc");
    }

    #[test]
    fn url_credentials_are_redacted_and_the_url_kept() {
        let r = Redactor::default();
        assert_eq!(
            r.redact(
                "error sending request for url (http://127.0.0.1:9/v1/x?api-key=k3y-in/query)"
            ),
            "error sending request for url (http://127.0.0.1:9/v1/x?api-key=[REDACTED])"
        );
        assert_eq!(
            r.redact("GET https://h/x?api-version=2024-02-01&token=abc&sig=def#frag"),
            "GET https://h/x?api-version=2024-02-01&token=[REDACTED]&sig=[REDACTED]#frag"
        );
        assert_eq!(
            r.redact("postgres://talaria:pa55word@db:5432/x"),
            "postgres://talaria:[REDACTED]@db:5432/x"
        );
        // No userinfo password, no credential parameter: untouched.
        for t in [
            "https://user@host/p?page=2",
            "see http://a.b/c?q=rust&lang=en",
        ] {
            assert_eq!(r.redact(t), t);
        }
        assert!(is_credential_param("api-key") && is_credential_param("X-Amz-Signature"));
        assert!(!is_credential_param("api-version") && !is_credential_param("page"));
    }

    #[test]
    fn ordinary_text_is_untouched() {
        let t = "ls -la /tmp && echo 12:30 sk-short";
        assert_eq!(Redactor::default().redact(t), t);
    }
}
