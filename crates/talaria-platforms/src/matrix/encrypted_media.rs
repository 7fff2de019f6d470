//! Files in encrypted rooms. Each file has a key of its own: the bytes
//! are AES-256-CTR ciphertext in the media repository, and the key, the
//! counter's start and the ciphertext's SHA-256 travel in the (encrypted)
//! event as its `file` object. matrix-sdk-crypto's attachment encryptor
//! and decryptor do the cipher and the hash on a blocking thread, fed and
//! drained through channels, so no file is ever held whole in memory.

use std::io::Read;
use std::pin::Pin;

use bytes::Bytes;
use matrix_sdk_crypto::{AttachmentDecryptor, AttachmentEncryptor, MediaEncryptionInfo};
use tokio::io::AsyncRead;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::io::{StreamReader, SyncIoBridge};

use super::media::{Media, parse_mxc};
use super::*;

/// How a locator says "an encrypted file": the rest is its `file` object.
const PREFIX: &str = "mxc+e2ee:";

/// Chunks between the cipher's thread and the network.
const CHUNK: usize = 64 * 1024;

/// The locator of an encrypted file event's `file` object, when it is
/// one this adapter can fetch (an `mxc://` address with its key).
pub(super) fn locator(file: &Value) -> Option<String> {
    let url = file.get("url").and_then(Value::as_str)?;
    parse_mxc(url)?;
    serde_json::from_value::<MediaEncryptionInfo>(file.clone()).ok()?;
    Some(format!("{PREFIX}{file}"))
}

/// Whether `locator` names an encrypted file.
pub(super) fn is_encrypted(locator: &str) -> bool {
    locator.starts_with(PREFIX)
}

/// The address and key of an encrypted file's locator.
fn parse(locator: &str) -> Option<(String, MediaEncryptionInfo)> {
    let file: Value = serde_json::from_str(locator.strip_prefix(PREFIX)?).ok()?;
    let url = file.get("url").and_then(Value::as_str)?.to_owned();
    parse_mxc(&url)?;
    let info = serde_json::from_value(file).ok()?;
    Some((url, info))
}

impl Media {
    /// Fetches an encrypted file and decrypts it as it streams. A file
    /// whose hash does not match fails at its end, so whoever reads it
    /// keeps nothing of it.
    pub(super) async fn download_encrypted(
        &self,
        locator: &str,
    ) -> Result<Download, DownloadError> {
        let Some((url, info)) = parse(locator) else {
            return Err(DownloadError::Gone(
                "a malformed encrypted-file address (its key or url is missing)".into(),
            ));
        };
        let ciphertext = self.download(&url).await?;
        Ok(Download {
            reader: decrypting(ciphertext.reader, info),
            length: ciphertext.length,
        })
    }

    /// Encrypts `file` as it streams into the media repository; the
    /// event's `file` object (address, key, counter, hash) and the size.
    pub(super) async fn upload_encrypted(
        &self,
        file: &OutboundFile,
    ) -> Result<(Value, u64), SendError> {
        let size = match tokio::fs::metadata(&file.path).await {
            Ok(m) => m.len(),
            Err(e) => return Err(media::unreadable(file, &e)),
        };
        let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(4);
        let path = file.path.clone();
        let cipher = tokio::task::spawn_blocking(move || {
            let mut plain = std::fs::File::open(&path)?;
            let mut encryptor = AttachmentEncryptor::new(&mut plain);
            pump(&mut encryptor, &tx)?;
            Ok::<_, std::io::Error>(encryptor.finish())
        });
        // The name stays out of the upload: it would sit in the clear on
        // the server. It travels inside the encrypted event instead.
        let body = reqwest::Body::wrap_stream(ReceiverStream::new(rx));
        let uri = self
            .post(body, size, "application/octet-stream", None)
            .await?;
        let info = match cipher.await {
            Ok(Ok(info)) => info,
            Ok(Err(e)) => return Err(media::unreadable(file, &e)),
            Err(e) => return Err(SendError::Transient(format!("the encryption stopped: {e}"))),
        };
        let mut object = serde_json::to_value(&info)
            .map_err(|e| SendError::Transient(format!("the file's key: {e}")))?;
        object["url"] = Value::String(uri);
        Ok((object, size))
    }
}

/// `input` decrypted with `info` on a blocking thread.
fn decrypting(
    input: Pin<Box<dyn AsyncRead + Send>>,
    info: MediaEncryptionInfo,
) -> Pin<Box<dyn AsyncRead + Send>> {
    let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(4);
    // The bridge needs the runtime's handle, which the blocking thread
    // does not have.
    let mut bridge = SyncIoBridge::new(input);
    tokio::task::spawn_blocking(move || {
        let failed = match AttachmentDecryptor::new(&mut bridge, info) {
            Ok(mut decryptor) => pump(&mut decryptor, &tx).err(),
            Err(e) => Some(std::io::Error::other(format!("the file's key: {e}"))),
        };
        if let Some(e) = failed {
            // The reader sees the error rather than a clean end.
            let _ = tx.blocking_send(Err(e));
        }
    });
    Box::pin(StreamReader::new(ReceiverStream::new(rx)))
}

/// Reads `source` to its end in chunks into `sink`.
fn pump(
    source: &mut impl Read,
    sink: &mpsc::Sender<std::io::Result<Bytes>>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = source.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        if sink
            .blocking_send(Ok(Bytes::copy_from_slice(&buf[..n])))
            .is_err()
        {
            return Err(std::io::Error::other("the other end stopped reading"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn encrypt(plain: &[u8]) -> (Vec<u8>, MediaEncryptionInfo) {
        let mut input = plain;
        let mut encryptor = AttachmentEncryptor::new(&mut input);
        let mut out = Vec::new();
        encryptor.read_to_end(&mut out).unwrap();
        (out, encryptor.finish())
    }

    #[tokio::test]
    async fn a_file_decrypts_as_it_streams_and_a_tampered_one_fails() {
        let plain: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let (cipher, info) = encrypt(&plain);
        assert_ne!(cipher, plain);
        let info_json = serde_json::to_value(&info).unwrap();

        let reader: Pin<Box<dyn AsyncRead + Send>> = Box::pin(std::io::Cursor::new(cipher.clone()));
        let mut out = Vec::new();
        decrypting(reader, serde_json::from_value(info_json.clone()).unwrap())
            .read_to_end(&mut out)
            .await
            .unwrap();
        assert_eq!(out, plain);

        let mut tampered = cipher;
        tampered[1000] ^= 1;
        let reader: Pin<Box<dyn AsyncRead + Send>> = Box::pin(std::io::Cursor::new(tampered));
        let mut out = Vec::new();
        let e = decrypting(reader, serde_json::from_value(info_json).unwrap())
            .read_to_end(&mut out)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("Hash mismatch"), "{e}");
    }

    #[test]
    fn locators_carry_the_whole_file_object() {
        let (_, info) = encrypt(b"x");
        let mut file = serde_json::to_value(&info).unwrap();
        file["url"] = json!("mxc://example.org/abc");
        let loc = locator(&file).unwrap();
        assert!(is_encrypted(&loc));
        let (url, _) = parse(&loc).unwrap();
        assert_eq!(url, "mxc://example.org/abc");
        file["url"] = json!("https://elsewhere.example/abc");
        assert!(locator(&file).is_none(), "only mxc addresses are fetched");
        assert!(
            locator(&json!({"url": "mxc://example.org/abc"})).is_none(),
            "no key"
        );
    }
}
