//! WeCom's message encryption, as its callback documentation defines it
//! (and as the robot's file `aeskey`s use it): AES-256-CBC whose key is
//! the base64 `EncodingAESKey` (43 characters, one `=` restored) and whose
//! IV is the key's first 16 bytes, padded PKCS#7-style to a **32-byte**
//! block; the plaintext is 16 random bytes, the message's length (u32,
//! big-endian), the message, and the receive id (the corp id).
//!
//! The signature is the lowercase hex SHA-1 of the token, timestamp, nonce
//! and ciphertext, sorted as strings and concatenated.

use aes::Aes256;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::engine::{GeneralPurpose, GeneralPurposeConfig};
#[cfg(test)]
use cbc::cipher::BlockEncryptMut;
use cbc::cipher::block_padding::NoPadding;
use cbc::cipher::{BlockDecryptMut, KeyIvInit};
use sha1::{Digest, Sha1};

/// Decodes an EncodingAESKey: its 43rd character usually carries bits
/// past the 32nd byte (the console draws the characters at random), which
/// a strict decoder refuses.
const KEY_BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
);

/// The padding block WeCom uses (not AES's 16).
pub(crate) const PAD_BLOCK: usize = 32;

/// Why a ciphertext was not opened. Deliberately vague in what it says
/// to a caller: it never carries key material or plaintext.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CryptoError {
    /// Not base64, or not a whole number of AES blocks.
    #[error("the ciphertext is malformed")]
    Malformed,
    /// The padding or the length field does not fit the plaintext: the
    /// key is wrong or the text was altered.
    #[error("the ciphertext does not decrypt with this key")]
    Undecryptable,
    /// It decrypted, for another receiver (corp).
    #[error("the message is for another receive id")]
    WrongReceiver,
}

/// An `EncodingAESKey` ready to use.
#[derive(Clone)]
pub(crate) struct Key {
    key: [u8; 32],
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

impl Key {
    /// The key from its 43-character base64 form (WeCom leaves off the
    /// one `=` of padding). `None` when it is not 32 bytes once decoded.
    pub(crate) fn from_encoding_aes_key(text: &str) -> Option<Key> {
        let text = text.trim();
        let padded = if text.len() % 4 == 3 {
            format!("{text}=")
        } else {
            text.to_owned()
        };
        let bytes = KEY_BASE64.decode(padded).ok()?;
        let key: [u8; 32] = bytes.try_into().ok()?;
        Some(Key { key })
    }

    fn iv(&self) -> [u8; 16] {
        let mut iv = [0u8; 16];
        iv.copy_from_slice(&self.key[..16]);
        iv
    }

    /// A CBC decryptor of this key and its IV, for ciphertext that comes
    /// as a stream (the robot's files, which carry no length or receive
    /// id: only the 32-byte-block padding, removed with [`unpad`]).
    pub(crate) fn decryptor(&self) -> cbc::Decryptor<Aes256> {
        cbc::Decryptor::<Aes256>::new(&self.key.into(), &self.iv().into())
    }

    /// Opens base64 `ciphertext` and returns the message, checking that
    /// the receive id is `receiver` (any, when `None`).
    pub(crate) fn decrypt(
        &self,
        ciphertext: &str,
        receiver: Option<&str>,
    ) -> Result<Vec<u8>, CryptoError> {
        let data = BASE64
            .decode(ciphertext.trim())
            .map_err(|_| CryptoError::Malformed)?;
        if data.is_empty() || data.len() % 16 != 0 {
            return Err(CryptoError::Malformed);
        }
        let plain = cbc::Decryptor::<Aes256>::new(&self.key.into(), &self.iv().into())
            .decrypt_padded_vec_mut::<NoPadding>(&data)
            .map_err(|_| CryptoError::Malformed)?;
        let plain = unpad(&plain).ok_or(CryptoError::Undecryptable)?;
        // 16 random bytes, then the message's length.
        let len_bytes: [u8; 4] = plain
            .get(16..20)
            .and_then(|b| b.try_into().ok())
            .ok_or(CryptoError::Undecryptable)?;
        let len = u32::from_be_bytes(len_bytes) as usize;
        let end = 20usize.checked_add(len).ok_or(CryptoError::Undecryptable)?;
        let message = plain.get(20..end).ok_or(CryptoError::Undecryptable)?;
        let receive_id = &plain[end..];
        if let Some(expected) = receiver
            && receive_id != expected.as_bytes()
        {
            return Err(CryptoError::WrongReceiver);
        }
        Ok(message.to_vec())
    }

    /// Seals `message` for `receiver` with `random` as the 16 leading
    /// bytes; base64. The adapter answers nothing encrypted; this is the
    /// inverse its tests check decryption against.
    #[cfg(test)]
    pub(crate) fn encrypt(&self, random: [u8; 16], message: &[u8], receiver: &str) -> String {
        let mut plain = random.to_vec();
        plain.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
        plain.extend_from_slice(message);
        plain.extend_from_slice(receiver.as_bytes());
        let pad = PAD_BLOCK - plain.len() % PAD_BLOCK;
        plain.extend(std::iter::repeat_n(pad as u8, pad));
        let sealed = cbc::Encryptor::<Aes256>::new(&self.key.into(), &self.iv().into())
            .encrypt_padded_vec_mut::<NoPadding>(&plain);
        BASE64.encode(sealed)
    }
}

/// Strips the 32-byte-block padding: the last byte says how many bytes
/// (1..=32) of that same value end the text.
pub(crate) fn unpad(plain: &[u8]) -> Option<&[u8]> {
    let &last = plain.last()?;
    let pad = usize::from(last);
    if pad == 0 || pad > PAD_BLOCK || pad > plain.len() {
        return None;
    }
    let (body, tail) = plain.split_at(plain.len() - pad);
    tail.iter().all(|&b| b == last).then_some(body)
}

/// `msg_signature`: the hex SHA-1 of the four parts sorted and joined.
pub(crate) fn signature(token: &str, timestamp: &str, nonce: &str, encrypted: &str) -> String {
    let mut parts = [token, timestamp, nonce, encrypted];
    parts.sort_unstable();
    let digest = Sha1::digest(parts.concat().as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `given` is the signature of the parts, compared in constant
/// time (the expected value is public once computed, but a comparison
/// that stops early would still tell a forger how far they got).
pub(crate) fn signature_matches(
    given: &str,
    token: &str,
    timestamp: &str,
    nonce: &str,
    encrypted: &str,
) -> bool {
    let expected = signature(token, timestamp, nonce, encrypted);
    let given = given.trim().to_ascii_lowercase();
    given.len() == expected.len()
        && given
            .bytes()
            .zip(expected.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const AES_KEY: &str = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG";

    #[test]
    fn the_key_needs_43_characters_of_base64_for_32_bytes() {
        assert!(Key::from_encoding_aes_key(AES_KEY).is_some());
        assert!(Key::from_encoding_aes_key("short").is_none());
        assert!(Key::from_encoding_aes_key(&AES_KEY[..42]).is_none());
        assert!(
            Key::from_encoding_aes_key("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!").is_none()
        );
        assert_eq!(
            format!("{:?}", Key::from_encoding_aes_key(AES_KEY).unwrap()),
            "Key(<redacted>)"
        );
    }

    #[test]
    fn round_trip_and_every_padding_length() {
        let key = Key::from_encoding_aes_key(AES_KEY).unwrap();
        // 16 + 4 + n + 8 ("ww123456"): every pad value 1..=32 comes up.
        for n in 0..64 {
            let message = "x".repeat(n);
            let sealed = key.encrypt([7; 16], message.as_bytes(), "ww123456");
            assert_eq!(
                key.decrypt(&sealed, Some("ww123456")).unwrap(),
                message.as_bytes()
            );
            assert_eq!(
                key.decrypt(&sealed, Some("ww999")),
                Err(CryptoError::WrongReceiver)
            );
        }
    }

    #[test]
    fn bad_padding_and_lengths_are_refused() {
        assert_eq!(unpad(&[1, 2, 3, 0]), None);
        assert_eq!(unpad(&[33; 64]), None);
        assert_eq!(unpad(&[5, 5, 4, 2]), None);
        assert_eq!(unpad(&[9, 2, 2]), Some(&[9u8][..]));
        let key = Key::from_encoding_aes_key(AES_KEY).unwrap();
        assert_eq!(
            key.decrypt("not base64!", None),
            Err(CryptoError::Malformed)
        );
        assert_eq!(
            key.decrypt(&BASE64.encode([1u8; 15]), None),
            Err(CryptoError::Malformed)
        );
        // Random blocks almost never unpad; when one does, the length
        // field is nonsense and is caught.
        assert!(key.decrypt(&BASE64.encode([1u8; 64]), None).is_err());
    }

    #[test]
    fn signatures_sort_their_parts() {
        let a = signature("t", "2", "n", "e");
        assert_eq!(a, signature("e", "n", "2", "t"));
        assert_eq!(a.len(), 40);
        assert!(signature_matches(&a.to_uppercase(), "t", "2", "n", "e"));
        assert!(!signature_matches(&a, "t", "3", "n", "e"));
        assert!(!signature_matches("", "t", "2", "n", "e"));
    }
}
