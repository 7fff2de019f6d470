//! Identifiers: session ids, hashed platform ids, and the validators that keep
//! untrusted ids from becoming path traversal.

use rand::Rng;
use sha2::{Digest, Sha256};

/// Why an id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// Nothing to name a file or key by.
    #[error("id is empty")]
    Empty,
    /// Longer than a file name (or key) may be.
    #[error("id is longer than {max} bytes")]
    TooLong {
        /// The limit in bytes.
        max: usize,
    },
    /// A character the validator does not allow: outside the strict set,
    /// or a control character or backslash in a logical key.
    #[error("id contains `{0}`, which is not allowed")]
    BadChar(char),
    /// `..`, which could climb out of a directory.
    #[error("id contains `..`")]
    DotDot,
    /// A first character that would hide a file, read as an option or
    /// root a path (`.`, `-`, `/`).
    #[error("id starts with `{0}`")]
    BadStart(char),
}

/// Longest id accepted by either validator.
pub const MAX_ID_LEN: usize = 128;

/// Strict validation for anything used as a single path component (session
/// ids, file names): ASCII letters, digits, `_`, `-` and `.`, not starting
/// with `.` or `-`, never `..`.
pub fn validate_path_component(id: &str) -> Result<(), IdError> {
    if id.is_empty() {
        return Err(IdError::Empty);
    }
    if id.len() > MAX_ID_LEN {
        return Err(IdError::TooLong { max: MAX_ID_LEN });
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "_-.".contains(*c)))
    {
        return Err(IdError::BadChar(c));
    }
    if id.contains("..") {
        return Err(IdError::DotDot);
    }
    let first = id.chars().next().unwrap_or('.');
    if first == '.' || first == '-' {
        return Err(IdError::BadStart(first));
    }
    Ok(())
}

/// Relaxed validation for logical keys (session keys, chat ids): any
/// printable text with interior `/` and `:`, but no `..` segment, no leading
/// `/`, no backslash and no control characters.
pub fn validate_logical_key(key: &str) -> Result<(), IdError> {
    if key.is_empty() {
        return Err(IdError::Empty);
    }
    if key.len() > 4 * MAX_ID_LEN {
        return Err(IdError::TooLong {
            max: 4 * MAX_ID_LEN,
        });
    }
    if let Some(c) = key.chars().find(|c| c.is_control() || *c == '\\') {
        return Err(IdError::BadChar(c));
    }
    if key.starts_with('/') {
        return Err(IdError::BadStart('/'));
    }
    if key.split(['/', ':']).any(|seg| seg == "..") {
        return Err(IdError::DotDot);
    }
    Ok(())
}

/// A new session id: `YYYYMMDD_HHMMSS_<6 hex>` in UTC. Sortable by start time
/// and valid as a path component.
pub fn new_session_id() -> String {
    let now = chrono::Utc::now();
    let suffix: u32 = rand::rng().random_range(0..0x100_0000);
    format!("{}_{suffix:06x}", now.format("%Y%m%d_%H%M%S"))
}

/// A new random id for something short-lived: `<prefix>_<12 hex>` (a
/// background job, a process). Unique enough among the few alive at once.
pub fn random_id(prefix: &str) -> String {
    let n: u64 = rand::rng().random_range(0..(1u64 << 48));
    format!("{prefix}_{n:012x}")
}

/// A platform id as it may appear in a prompt: `<prefix>_<12 hex of sha256>`.
/// Models see a stable handle, never the raw id.
pub fn hash_id(prefix: &str, raw: &str) -> String {
    let digest = Sha256::digest(raw.as_bytes());
    format!("{prefix}_{}", to_hex(&digest[..6]))
}

/// Lower-case hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_lower_case_two_digits_a_byte() {
        assert_eq!(to_hex(&[]), "");
        assert_eq!(to_hex(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
    }
    use proptest::prelude::*;

    #[test]
    fn session_ids_have_the_documented_shape() {
        let id = new_session_id();
        assert_eq!(id.len(), 22, "{id}");
        validate_path_component(&id).unwrap();
        let re = regex::Regex::new(r"^\d{8}_\d{6}_[0-9a-f]{6}$").unwrap();
        assert!(re.is_match(&id), "{id}");
    }

    #[test]
    fn hashes_are_stable_and_short() {
        assert_eq!(hash_id("user", "12345"), hash_id("user", "12345"));
        assert_ne!(hash_id("user", "12345"), hash_id("user", "12346"));
        assert_eq!(hash_id("user", "x").len(), "user_".len() + 12);
    }

    #[test]
    fn strict_rejects_traversal() {
        for bad in [
            "", "..", "../x", "a/b", ".hidden", "-rf", "a\\b", "a\0b", "a b", "x/../y",
        ] {
            assert!(validate_path_component(bad).is_err(), "{bad:?}");
        }
        for good in ["20260101_120000_abcdef", "cron_job-1.md", "a"] {
            validate_path_component(good).unwrap();
        }
    }

    #[test]
    fn relaxed_allows_interior_slashes_only() {
        validate_logical_key("agent:main:telegram:dm:123").unwrap();
        validate_logical_key("team/project/x").unwrap();
        for bad in ["/etc", "a/../b", "..", "a:..:b", "a\\b", "a\nb", ""] {
            assert!(validate_logical_key(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn strict_accepted_ids_never_escape(id in "\\PC{0,40}") {
            if validate_path_component(&id).is_ok() {
                let p = std::path::Path::new("/base").join(&id);
                prop_assert!(p.starts_with("/base"));
                prop_assert_eq!(p.components().count(), 3);
                prop_assert!(!id.contains('/') && !id.contains(".."));
            }
        }

        #[test]
        fn relaxed_accepted_keys_stay_relative(key in "[a-z./:]{0,20}") {
            if validate_logical_key(&key).is_ok() {
                let p = std::path::Path::new("/base").join(&key);
                prop_assert!(p.starts_with("/base"));
                prop_assert!(!p.components().any(|c| matches!(c, std::path::Component::ParentDir)));
            }
        }

        #[test]
        fn validators_never_panic(s in any::<String>()) {
            let _ = validate_path_component(&s);
            let _ = validate_logical_key(&s);
        }
    }
}
