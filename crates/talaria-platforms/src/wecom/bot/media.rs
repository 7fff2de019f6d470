//! The robot's files: inbound ones decrypted as they stream in, outbound
//! ones read twice in fixed chunks (once for the MD5 the upload names
//! first, once to send), so no file is ever held whole in memory.

use std::path::Path;

use aes::Aes256;
use bytes::Bytes;
use cbc::cipher::BlockDecryptMut;
use cbc::cipher::generic_array::GenericArray;
use futures::{Stream, StreamExt};
use md5::{Digest, Md5};
use talaria_adapter::MediaKind;
use tokio::io::AsyncReadExt;

use crate::wecom::crypto::{CryptoError, PAD_BLOCK, unpad};

/// The size of each upload chunk (WeCom's documented 512 KiB).
pub(super) const CHUNK_BYTES: usize = 512 * 1024;

/// The most chunks one upload may have.
pub(super) const MAX_CHUNKS: u64 = 100;

/// WeCom's limits per upload type, in bytes.
const IMAGE_MAX: u64 = 10 * 1024 * 1024;
const VIDEO_MAX: u64 = 10 * 1024 * 1024;
const FILE_MAX: u64 = 20 * 1024 * 1024;

/// WeCom refuses files of five bytes or fewer.
const MIN_BYTES: u64 = 6;

/// Decrypts a file's AES-256-CBC ciphertext as it arrives. The last 32
/// bytes of plaintext are held back until the end, since they may be
/// padding.
pub(super) struct Decrypting {
    cipher: cbc::Decryptor<Aes256>,
    /// Ciphertext short of a whole block.
    carry: Vec<u8>,
    /// Plaintext not yet handed on.
    held: Vec<u8>,
}

impl Decrypting {
    pub(super) fn new(cipher: cbc::Decryptor<Aes256>) -> Decrypting {
        Decrypting {
            cipher,
            carry: Vec::new(),
            held: Vec::new(),
        }
    }

    /// Takes more ciphertext; returns the plaintext that is certainly not
    /// padding.
    pub(super) fn feed(&mut self, data: &[u8]) -> Vec<u8> {
        self.carry.extend_from_slice(data);
        let whole = self.carry.len() / 16 * 16;
        let mut blocks: Vec<u8> = self.carry.drain(..whole).collect();
        for block in blocks.chunks_exact_mut(16) {
            self.cipher
                .decrypt_block_mut(GenericArray::from_mut_slice(block));
        }
        self.held.extend_from_slice(&blocks);
        if self.held.len() > PAD_BLOCK {
            let ready = self.held.len() - PAD_BLOCK;
            self.held.drain(..ready).collect()
        } else {
            Vec::new()
        }
    }

    /// The end of the ciphertext: the rest of the plaintext, its padding
    /// removed, or why it does not decrypt.
    pub(super) fn finish(self) -> Result<Vec<u8>, CryptoError> {
        if !self.carry.is_empty() || self.held.is_empty() {
            return Err(CryptoError::Malformed);
        }
        unpad(&self.held)
            .map(<[u8]>::to_vec)
            .ok_or(CryptoError::Undecryptable)
    }
}

/// `body` decrypted on the way through.
pub(super) fn decrypt_stream<S>(
    body: S,
    decrypting: Decrypting,
) -> impl Stream<Item = std::io::Result<Bytes>> + Send + 'static
where
    S: Stream<Item = std::io::Result<Bytes>> + Send + Unpin + 'static,
{
    futures::stream::unfold(Some((body, decrypting)), |state| async move {
        let (mut body, mut decrypting) = state?;
        loop {
            match body.next().await {
                Some(Ok(chunk)) => {
                    let plain = decrypting.feed(&chunk);
                    if !plain.is_empty() {
                        return Some((Ok(Bytes::from(plain)), Some((body, decrypting))));
                    }
                }
                Some(Err(e)) => return Some((Err(e), None)),
                None => {
                    let end = decrypting.finish().map(Bytes::from).map_err(|e| {
                        std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!("the WeCom file does not decrypt with its aeskey: {e}"),
                        )
                    });
                    return Some((end, None));
                }
            }
        }
    })
}

/// What an outbound file is uploaded and sent as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Upload {
    Image,
    Video,
    File,
}

impl Upload {
    /// The upload's and the message's `type`/`msgtype`.
    pub(super) fn name(self) -> &'static str {
        match self {
            Upload::Image => "image",
            Upload::Video => "video",
            Upload::File => "file",
        }
    }

    /// How a file of `kind` and `size` goes: an image or video within
    /// WeCom's limit as itself, anything else (voice needs AMR, which the
    /// gateway does not make) as a file. `Err` when it is too large or too
    /// small to upload at all.
    pub(super) fn choose(kind: MediaKind, size: u64) -> Result<Upload, String> {
        if size < MIN_BYTES {
            return Err(format!(
                "WeCom refuses files of fewer than {MIN_BYTES} bytes"
            ));
        }
        let chosen = match kind {
            MediaKind::Image if size <= IMAGE_MAX => Upload::Image,
            MediaKind::Video if size <= VIDEO_MAX => Upload::Video,
            _ => Upload::File,
        };
        if chosen == Upload::File && size > FILE_MAX {
            return Err(format!(
                "the file is {size} bytes; WeCom takes at most {FILE_MAX}"
            ));
        }
        Ok(chosen)
    }
}

/// A file's size and lowercase hex MD5, read in chunks.
pub(super) async fn measure(path: &Path) -> std::io::Result<(u64, String)> {
    let mut file = tokio::fs::File::open(path).await?;
    let mut hasher = Md5::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    let digest = hasher.finalize();
    Ok((size, digest.iter().map(|b| format!("{b:02x}")).collect()))
}

/// Reads the next upload chunk (up to [`CHUNK_BYTES`]); empty at the end.
pub(super) async fn next_chunk(file: &mut tokio::fs::File) -> std::io::Result<Vec<u8>> {
    let mut chunk = vec![0u8; CHUNK_BYTES];
    let mut filled = 0;
    while filled < CHUNK_BYTES {
        let n = file.read(&mut chunk[filled..]).await?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    chunk.truncate(filled);
    Ok(chunk)
}

/// How many chunks a file of `size` bytes takes.
pub(super) fn chunk_count(size: u64) -> u64 {
    size.div_ceil(CHUNK_BYTES as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wecom::crypto::Key;
    use cbc::cipher::block_padding::NoPadding;
    use cbc::cipher::{BlockEncryptMut, KeyIvInit};

    // Its last character carries no bits past the 32nd byte, so the
    // strict decoder below takes it too.
    const AES_KEY: &str = "Zm9vYmFyYmF6cXV4MDEyMzQ1Njc4OWFiY2RlZmdoaWo";

    fn seal(plain: &[u8]) -> Vec<u8> {
        use base64::Engine as _;
        let key = base64::engine::general_purpose::STANDARD
            .decode(format!("{AES_KEY}="))
            .unwrap();
        let mut padded = plain.to_vec();
        let pad = PAD_BLOCK - plain.len() % PAD_BLOCK;
        padded.extend(std::iter::repeat_n(pad as u8, pad));
        cbc::Encryptor::<Aes256>::new_from_slices(&key, &key[..16])
            .unwrap()
            .encrypt_padded_vec_mut::<NoPadding>(&padded)
    }

    #[test]
    fn a_file_decrypts_whatever_the_pieces_it_arrives_in() {
        let key = Key::from_encoding_aes_key(AES_KEY).unwrap();
        for len in [0usize, 1, 31, 32, 33, 100, 1000] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let sealed = seal(&plain);
            for piece in [1usize, 5, 16, 17, 64, 4096] {
                let mut d = Decrypting::new(key.decryptor());
                let mut out = Vec::new();
                for p in sealed.chunks(piece) {
                    out.extend(d.feed(p));
                }
                out.extend(d.finish().unwrap());
                assert_eq!(out, plain, "len {len}, pieces of {piece}");
            }
        }
    }

    #[test]
    fn a_truncated_or_foreign_file_is_refused() {
        let key = Key::from_encoding_aes_key(AES_KEY).unwrap();
        let sealed = seal(b"hello there");
        let mut d = Decrypting::new(key.decryptor());
        d.feed(&sealed[..sealed.len() - 3]);
        assert_eq!(d.finish(), Err(CryptoError::Malformed));
        let other =
            Key::from_encoding_aes_key("ZYXWVUTSRQPONMLKJIHGFEDCBA9876543210abcdefg").unwrap();
        let mut d = Decrypting::new(other.decryptor());
        d.feed(&sealed);
        assert!(d.finish().is_err());
        assert_eq!(
            Decrypting::new(key.decryptor()).finish(),
            Err(CryptoError::Malformed)
        );
    }

    #[test]
    fn kinds_and_sizes_choose_the_upload() {
        assert_eq!(Upload::choose(MediaKind::Image, 100), Ok(Upload::Image));
        assert_eq!(
            Upload::choose(MediaKind::Image, IMAGE_MAX + 1),
            Ok(Upload::File)
        );
        assert_eq!(Upload::choose(MediaKind::Video, 100), Ok(Upload::Video));
        assert_eq!(Upload::choose(MediaKind::Voice, 100), Ok(Upload::File));
        assert!(Upload::choose(MediaKind::Document, FILE_MAX + 1).is_err());
        assert!(Upload::choose(MediaKind::Document, 5).is_err());
        assert_eq!(chunk_count(1), 1);
        assert_eq!(chunk_count(CHUNK_BYTES as u64), 1);
        assert_eq!(chunk_count(CHUNK_BYTES as u64 + 1), 2);
        assert!(chunk_count(FILE_MAX) <= MAX_CHUNKS);
    }
}
