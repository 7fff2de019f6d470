//! The webhook's signature and encryption (Feishu's "Encrypt Key").
//!
//! - Signature: `X-Lark-Signature` is the lowercase hex SHA-256 of
//!   `timestamp + nonce + encrypt_key + raw_body`, with the timestamp and
//!   nonce from `X-Lark-Request-Timestamp` / `X-Lark-Request-Nonce`.
//! - Encryption: `{"encrypt": base64(iv ‖ AES-256-CBC(PKCS#7(json)))}`,
//!   keyed with SHA-256 of the encrypt key string; the IV is the first 16
//!   bytes of the decoded blob.

use aes::cipher::{BlockDecryptMut, KeyIvInit, block_padding::Pkcs7};
use base64::Engine;
use sha2::{Digest, Sha256};

type Decryptor = cbc::Decryptor<aes::Aes256>;

/// Why a delivery's signature was refused (said in logs, never to the
/// sender beyond "invalid signature").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SignatureError {
    /// A header is missing or unreadable.
    Missing(&'static str),
    /// The timestamp is outside the allowed skew: a replay, or a clock off.
    Stale,
    /// The digest does not match.
    Mismatch,
}

impl SignatureError {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SignatureError::Missing(h) => h,
            SignatureError::Stale => "the request timestamp is too old or in the future",
            SignatureError::Mismatch => "the signature does not match",
        }
    }
}

/// Checks the signature headers against the raw body, at `now` (Unix
/// seconds), allowing `max_skew` seconds either way.
pub(crate) fn check_signature(
    encrypt_key: &str,
    timestamp: Option<&str>,
    nonce: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now: u64,
    max_skew: u64,
) -> Result<(), SignatureError> {
    let timestamp = timestamp.ok_or(SignatureError::Missing("no X-Lark-Request-Timestamp"))?;
    let nonce = nonce.ok_or(SignatureError::Missing("no X-Lark-Request-Nonce"))?;
    let signature = signature.ok_or(SignatureError::Missing("no X-Lark-Signature"))?;
    let at: u64 = timestamp
        .trim()
        .parse()
        .map_err(|_| SignatureError::Missing("X-Lark-Request-Timestamp is not a number"))?;
    if at.abs_diff(now) > max_skew {
        return Err(SignatureError::Stale);
    }
    let mut digest = Sha256::new();
    digest.update(timestamp.as_bytes());
    digest.update(nonce.as_bytes());
    digest.update(encrypt_key.as_bytes());
    digest.update(body);
    let expected = digest.finalize();
    let presented = decode_hex(signature.trim()).ok_or(SignatureError::Mismatch)?;
    if talaria_core::constant_time_eq(&presented, expected.as_slice()) {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// Decrypts an `encrypt` field into the JSON text it carries.
pub(crate) fn decrypt(encrypt_key: &str, encrypted: &str) -> Result<Vec<u8>, &'static str> {
    let blob = base64::engine::general_purpose::STANDARD
        .decode(encrypted.trim())
        .map_err(|_| "the encrypt field is not base64")?;
    if blob.len() < 32 || !(blob.len() - 16).is_multiple_of(16) {
        return Err("the encrypted body has an impossible length");
    }
    let (iv, data) = blob.split_at(16);
    let key: [u8; 32] = Sha256::digest(encrypt_key.as_bytes()).into();
    let decryptor = Decryptor::new_from_slices(&key, iv).map_err(|_| "bad key or IV length")?;
    decryptor
        .decrypt_padded_vec_mut::<Pkcs7>(data)
        .map_err(|_| "the body does not decrypt with the encrypt key")
}

/// Decodes hex in either case; `None` for odd lengths or other characters.
fn decode_hex(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    if bytes.is_empty() || !bytes.len().is_multiple_of(2) {
        return None;
    }
    bytes
        .chunks_exact(2)
        .map(|pair| {
            let hi = (pair[0] as char).to_digit(16)?;
            let lo = (pair[1] as char).to_digit(16)?;
            u8::try_from(hi * 16 + lo).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_decoding() {
        assert_eq!(decode_hex("00ffA0"), Some(vec![0, 255, 160]));
        for bad in ["", "0", "zz"] {
            assert_eq!(decode_hex(bad), None);
        }
    }

    #[test]
    fn short_or_ragged_blobs_are_refused() {
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        assert!(decrypt("k", &b64(&[0u8; 16])).is_err());
        assert!(decrypt("k", &b64(&[0u8; 33])).is_err());
        assert!(decrypt("k", "not base64!").is_err());
        // Right length, wrong key: the padding does not check out (or, by
        // rare chance, garbage comes out; never a panic).
        let _ = decrypt("k", &b64(&[7u8; 48]));
    }
}
