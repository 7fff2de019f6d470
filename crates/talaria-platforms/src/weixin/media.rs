//! Weixin's media CDN: files travel AES-128-ECB encrypted with PKCS#7
//! padding, under a key that rides in the message (inbound) or that we
//! pick and hand over in the message (outbound).
//!
//! Both directions stream: a download is decrypted block by block as it
//! arrives, holding back only the last block (whose padding is stripped
//! once the body ends), and an upload is encrypted as it is read from
//! disk. Neither ever holds a whole file.

use std::path::Path;
use std::pin::Pin;

use aes::Aes128;
use aes::cipher::block_padding::Pkcs7;
use aes::cipher::generic_array::GenericArray;
use aes::cipher::{BlockDecryptMut, BlockEncryptMut, KeyInit};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use md5::{Digest, Md5};
use tokio::io::AsyncReadExt;

/// AES's block, and ECB's unit.
const BLOCK: usize = 16;

/// How much of a file is read from disk at a time while encrypting.
const READ_CHUNK: usize = 64 * 1024;

/// A stream of bytes, as reqwest and the media cache exchange them.
pub(crate) type ByteStream = Pin<Box<dyn Stream<Item = std::io::Result<Bytes>> + Send>>;

/// A media key as iLink hands it over: base64 of the 16 raw bytes, or
/// base64 of their 32-character hex text; images may also carry the hex
/// text itself (`image_item.aeskey`).
pub(crate) fn parse_key(text: &str) -> Option<[u8; 16]> {
    let text = text.trim();
    if let Some(k) = from_hex(text) {
        return Some(k);
    }
    let raw = BASE64.decode(text).ok()?;
    if let Ok(k) = <[u8; 16]>::try_from(raw.as_slice()) {
        return Some(k);
    }
    std::str::from_utf8(&raw).ok().and_then(from_hex)
}

fn from_hex(text: &str) -> Option<[u8; 16]> {
    if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut key = [0u8; 16];
    for (i, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(key)
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The key as an outbound message names it: base64 of its hex text (the
/// form WeChat clients open; base64 of the raw bytes shows a grey box).
pub(crate) fn key_for_message(key: &[u8; 16]) -> String {
    BASE64.encode(hex(key))
}

/// What an attachment's locator holds: the CDN's download parameter and
/// the key, as `<hex key>:<param>` (hex has no colon, so the first one
/// splits them whatever the parameter holds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Locator {
    pub key: [u8; 16],
    pub param: String,
}

impl Locator {
    pub(crate) fn encode(&self) -> String {
        format!("{}:{}", hex(&self.key), self.param)
    }

    pub(crate) fn decode(locator: &str) -> Option<Locator> {
        let (key, param) = locator.split_once(':')?;
        if param.is_empty() {
            return None;
        }
        Some(Locator {
            key: from_hex(key)?,
            param: param.to_owned(),
        })
    }
}

/// The size of `n` bytes once padded and encrypted: the next multiple of
/// 16 above `n` (a whole block of padding when `n` is one already).
pub(crate) fn encrypted_len(n: u64) -> u64 {
    (n / BLOCK as u64 + 1) * BLOCK as u64
}

/// Decrypts `body` (AES-128-ECB, PKCS#7) as it arrives. A body whose
/// length is not a whole number of blocks, or whose padding is wrong,
/// ends the stream with an error rather than handing over garbage.
pub(crate) fn decrypting(body: ByteStream, key: &[u8; 16]) -> ByteStream {
    struct State {
        body: ByteStream,
        cipher: ecb::Decryptor<Aes128>,
        pending: Vec<u8>,
        done: bool,
    }
    let state = State {
        body,
        cipher: ecb::Decryptor::<Aes128>::new(GenericArray::from_slice(key)),
        pending: Vec::new(),
        done: false,
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        loop {
            if st.done {
                return None;
            }
            match st.body.next().await {
                Some(Ok(chunk)) => {
                    st.pending.extend_from_slice(&chunk);
                    // Every whole block but the last one seen, which may
                    // be the padded end.
                    let ready = st.pending.len().saturating_sub(1) / BLOCK * BLOCK;
                    if ready == 0 {
                        continue;
                    }
                    let mut out: Vec<u8> = st.pending.drain(..ready).collect();
                    for block in out.chunks_exact_mut(BLOCK) {
                        st.cipher
                            .decrypt_block_mut(GenericArray::from_mut_slice(block));
                    }
                    return Some((Ok(Bytes::from(out)), st));
                }
                Some(Err(e)) => {
                    st.done = true;
                    return Some((Err(e), st));
                }
                None => {
                    st.done = true;
                    if st.pending.len() != BLOCK {
                        return Some((
                            Err(std::io::Error::other(
                                "the CDN's file is not whole AES blocks (cut short or not encrypted)",
                            )),
                            st,
                        ));
                    }
                    let mut last = [0u8; BLOCK];
                    last.copy_from_slice(&st.pending);
                    let plain = st
                        .cipher
                        .clone()
                        .decrypt_padded_mut::<Pkcs7>(&mut last)
                        .map(Bytes::copy_from_slice)
                        .map_err(|_| {
                            std::io::Error::other(
                                "the CDN's file does not decrypt with its key (bad padding)",
                            )
                        });
                    return Some((plain, st));
                }
            }
        }
    });
    Box::pin(stream)
}

/// A file's size and MD5 (hex), read once from disk.
pub(crate) async fn size_and_md5(path: &Path) -> std::io::Result<(u64, String)> {
    let mut file = tokio::fs::File::open(path).await?;
    let mut hasher = Md5::new();
    let mut buf = vec![0u8; READ_CHUNK];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, hex(&hasher.finalize())))
}

/// The file at `path` encrypted (AES-128-ECB, PKCS#7) as it is read.
pub(crate) async fn encrypting(path: &Path, key: &[u8; 16]) -> std::io::Result<ByteStream> {
    struct State {
        file: tokio::fs::File,
        cipher: ecb::Encryptor<Aes128>,
        carry: Vec<u8>,
        done: bool,
    }
    let file = tokio::fs::File::open(path).await?;
    let state = State {
        file,
        cipher: ecb::Encryptor::<Aes128>::new(GenericArray::from_slice(key)),
        carry: Vec::new(),
        done: false,
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        let mut buf = vec![0u8; READ_CHUNK];
        let n = match st.file.read(&mut buf).await {
            Ok(n) => n,
            Err(e) => {
                st.done = true;
                return Some((Err(e), st));
            }
        };
        if n == 0 {
            // The tail (0 to 15 bytes) with its padding: one last block.
            st.done = true;
            let len = st.carry.len();
            let mut last = [0u8; BLOCK];
            last[..len].copy_from_slice(&st.carry);
            let out = st
                .cipher
                .clone()
                .encrypt_padded_mut::<Pkcs7>(&mut last, len)
                .map(Bytes::copy_from_slice)
                .map_err(|_| std::io::Error::other("cannot pad the file's last block"));
            return Some((out, st));
        }
        st.carry.extend_from_slice(&buf[..n]);
        let whole = st.carry.len() / BLOCK * BLOCK;
        let mut out: Vec<u8> = st.carry.drain(..whole).collect();
        for block in out.chunks_exact_mut(BLOCK) {
            st.cipher
                .encrypt_block_mut(GenericArray::from_mut_slice(block));
        }
        Some((Ok(Bytes::from(out)), st))
    });
    Ok(Box::pin(stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn collect(mut s: ByteStream) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(chunk) = s.next().await {
            out.extend_from_slice(&chunk?);
        }
        Ok(out)
    }

    fn chunked(data: Vec<u8>, size: usize) -> ByteStream {
        let chunks: Vec<std::io::Result<Bytes>> = data
            .chunks(size)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        Box::pin(futures::stream::iter(chunks))
    }

    #[test]
    fn keys_come_in_three_spellings() {
        let raw: [u8; 16] = *b"0123456789abcdef";
        let hex_text = hex(&raw);
        assert_eq!(parse_key(&BASE64.encode(raw)), Some(raw));
        assert_eq!(parse_key(&BASE64.encode(&hex_text)), Some(raw));
        assert_eq!(parse_key(&hex_text), Some(raw));
        assert_eq!(parse_key(&key_for_message(&raw)), Some(raw));
        assert_eq!(parse_key("short"), None);
        assert_eq!(parse_key(&BASE64.encode([1u8; 15])), None);
    }

    #[test]
    fn locators_round_trip_whatever_the_parameter_holds() {
        let l = Locator {
            key: [7; 16],
            param: "a:b/c==&d".into(),
        };
        assert_eq!(Locator::decode(&l.encode()), Some(l));
        assert_eq!(Locator::decode("nothex:x"), None);
        assert_eq!(Locator::decode(&format!("{}:", hex(&[1; 16]))), None);
    }

    #[test]
    fn padding_always_adds_a_block_at_most() {
        assert_eq!(encrypted_len(0), 16);
        assert_eq!(encrypted_len(15), 16);
        assert_eq!(encrypted_len(16), 32);
        assert_eq!(encrypted_len(17), 32);
    }

    #[tokio::test]
    async fn a_file_round_trips_through_both_streams_in_odd_chunks() {
        let key = [9u8; 16];
        let dir = tempfile::tempdir().unwrap();
        for len in [0usize, 1, 15, 16, 17, 100_000] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let path = dir.path().join(format!("f{len}"));
            std::fs::write(&path, &plain).unwrap();
            let cipher = collect(encrypting(&path, &key).await.unwrap())
                .await
                .unwrap();
            assert_eq!(cipher.len() as u64, encrypted_len(len as u64));
            let (size, _) = size_and_md5(&path).await.unwrap();
            assert_eq!(size, len as u64);
            for chunk in [1, 5, 16, 33, 70_000] {
                let back = collect(decrypting(chunked(cipher.clone(), chunk), &key))
                    .await
                    .unwrap();
                assert_eq!(back, plain, "len {len}, chunks of {chunk}");
            }
        }
    }

    #[tokio::test]
    async fn a_cut_or_wrongly_keyed_body_is_an_error() {
        let key = [3u8; 16];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"hello, world").unwrap();
        let cipher = collect(encrypting(&path, &key).await.unwrap())
            .await
            .unwrap();
        let cut = cipher[..cipher.len() - 3].to_vec();
        assert!(collect(decrypting(chunked(cut, 4), &key)).await.is_err());
        assert!(
            collect(decrypting(chunked(cipher, 4), &[4u8; 16]))
                .await
                .is_err()
        );
        assert!(
            collect(decrypting(chunked(Vec::new(), 4), &key))
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn md5_is_the_plain_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"abc").unwrap();
        let (size, md5) = size_and_md5(&path).await.unwrap();
        assert_eq!(size, 3);
        assert_eq!(md5, "900150983cd24fb0d6963f7d28e17f72");
    }
}
