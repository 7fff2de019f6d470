//! Storing files: limits, failures part-way, types from bytes, dedupe.

use crate::common;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use common::{elf, jpeg, listing, png};
use talaria_media::{Hint, MediaCache, MediaError, MediaKind};
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

const LIMIT: u64 = 20 * 1024 * 1024;

fn cache() -> (tempfile::TempDir, MediaCache) {
    let dir = tempfile::tempdir().unwrap();
    let cache = MediaCache::new(dir.path().join("media"), LIMIT);
    (dir, cache)
}

/// Gives `good` bytes, then fails (a connection reset) or, with `hang`,
/// never answers again.
struct Broken {
    good: usize,
    hang: bool,
}

impl AsyncRead for Broken {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.good == 0 {
            if self.hang {
                return Poll::Pending;
            }
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "connection reset by peer",
            )));
        }
        let n = self.good.min(buf.remaining()).min(10_000);
        buf.put_slice(&vec![7u8; n]);
        self.good -= n;
        Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn a_stream_over_the_limit_is_refused_and_leaves_nothing() {
    let (_dir, cache) = cache();
    let body = tokio::io::repeat(0x42).take(25 * 1024 * 1024);
    let err = cache.store(body, Hint::default()).await.unwrap_err();
    assert!(
        matches!(err, MediaError::TooLarge { limit } if limit == LIMIT),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "the file is too large: the limit is 20 MB");
    assert_eq!(listing(cache.dir()), Vec::<String>::new());

    // Exactly the limit is accepted: the bound is "more than".
    let body = tokio::io::repeat(0x42).take(LIMIT);
    let stored = cache.store(body, Hint::default()).await.unwrap();
    assert_eq!(stored.bytes, LIMIT);
    assert_eq!(listing(cache.dir()).len(), 1);
}

#[tokio::test]
async fn a_read_error_part_way_leaves_nothing() {
    let (_dir, cache) = cache();
    let body = Broken {
        good: 3 * 1024 * 1024,
        hang: false,
    };
    let err = cache.store(body, Hint::default()).await.unwrap_err();
    assert!(matches!(err, MediaError::Read(_)), "{err:?}");
    assert!(err.to_string().contains("connection reset"), "{err}");
    assert_eq!(listing(cache.dir()), Vec::<String>::new());
}

#[tokio::test]
async fn a_store_dropped_part_way_leaves_nothing() {
    let (_dir, cache) = cache();
    let body = Broken {
        good: 1024 * 1024,
        hang: true,
    };
    let mut store = Box::pin(cache.store(body, Hint::default()));
    // Run the store until its partial file is there, as it is when a
    // shutdown or a cancelled turn drops a download.
    let mut partial = Vec::new();
    let deadline = tokio::time::Instant::now() + talaria_testkit::wait::WAIT;
    while tokio::time::Instant::now() < deadline {
        tokio::select! {
            outcome = &mut store => panic!("the stream never ends, yet: {outcome:?}"),
            () = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
        partial = listing(cache.dir());
        if !partial.is_empty() {
            break;
        }
    }
    assert_eq!(partial.len(), 1, "{partial:?}");
    assert!(partial[0].starts_with(".tmp-"), "{partial:?}");
    drop(store);
    assert_eq!(listing(cache.dir()), Vec::<String>::new());
}

#[tokio::test]
async fn an_executable_named_like_a_photo_is_not_an_image() {
    let (_dir, cache) = cache();
    let hint = Hint {
        name: Some("photo.jpg"),
        mime: Some("image/jpeg"),
        voice: false,
    };
    let stored = cache.store(&elf()[..], hint).await.unwrap();
    assert_eq!(stored.kind, MediaKind::Document);
    assert_eq!(stored.mime, "application/x-executable");
    assert_eq!(
        stored.path.file_name().unwrap().to_str().unwrap(),
        format!("{}.elf", stored.sha256)
    );
    // The name is what the sender called it, shown as such.
    assert_eq!(stored.name, "photo.jpg");
}

#[tokio::test]
async fn real_images_are_stored_under_their_hash_once() {
    let (_dir, cache) = cache();
    let png = png(64, 48, false);
    let jpeg = jpeg(64, 48);

    let a = cache
        .store(
            &png[..],
            Hint {
                name: Some("../../screenshot.png"),
                mime: Some("application/octet-stream"),
                voice: false,
            },
        )
        .await
        .unwrap();
    assert_eq!((a.kind, a.mime.as_str()), (MediaKind::Image, "image/png"));
    assert_eq!(a.bytes, png.len() as u64);
    assert_eq!(a.name, "screenshot.png");
    assert_eq!(a.sha256, sha256_hex(&png));
    assert_eq!(a.path, cache.dir().join(format!("{}.png", a.sha256)));
    assert_eq!(std::fs::read(&a.path).unwrap(), png);

    let b = cache.store(&jpeg[..], Hint::default()).await.unwrap();
    assert_eq!((b.kind, b.mime.as_str()), (MediaKind::Image, "image/jpeg"));
    assert_eq!(b.path, cache.dir().join(format!("{}.jpg", b.sha256)));
    assert_eq!(b.name, "file.jpg");

    // The same photo again, under another name: the same file.
    let again = cache
        .store(
            &png[..],
            Hint {
                name: Some("copy.png"),
                ..Hint::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(again.path, a.path);
    assert_eq!(again.name, "copy.png");
    assert_eq!(listing(cache.dir()), {
        let mut names = vec![format!("{}.png", a.sha256), format!("{}.jpg", b.sha256)];
        names.sort();
        names
    });
}

#[tokio::test]
#[cfg(unix)]
async fn the_cache_and_its_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let (_dir, cache) = cache();
    let stored = cache.store(&b"hello"[..], Hint::default()).await.unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(cache.dir()), 0o700);
    assert_eq!(mode(&stored.path), 0o600);
    assert_eq!(
        (stored.mime.as_str(), stored.kind),
        ("text/plain", MediaKind::Document)
    );
}

#[tokio::test]
async fn a_voice_note_is_voice_only_when_the_platform_says_so() {
    let (_dir, cache) = cache();
    let mut ogg = b"OggS\x00\x02".to_vec();
    ogg.resize(28, 0);
    ogg.extend_from_slice(b"OpusHead\x01\x01\x38\x01\x80\xbb\x00\x00\x00\x00\x00");
    ogg.resize(2048, 0x55);
    let voice = Hint {
        name: Some("voice.oga"),
        mime: Some("audio/ogg"),
        voice: true,
    };
    let note = cache.store(&ogg[..], voice).await.unwrap();
    assert_eq!(
        (note.kind, note.mime.as_str()),
        (MediaKind::Voice, "audio/ogg")
    );
    assert!(note.path.to_str().unwrap().ends_with(".ogg"));
    let song = cache.store(&ogg[..], Hint::default()).await.unwrap();
    assert_eq!(song.kind, MediaKind::Audio);
    // A voice claim on a photo changes nothing.
    let photo = cache
        .store(
            &png(8, 8, false)[..],
            Hint {
                voice: true,
                ..Hint::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(photo.kind, MediaKind::Image);
}

#[tokio::test]
async fn the_home_cache_is_the_media_folder_with_the_configured_limit() {
    let dir = tempfile::tempdir().unwrap();
    let home = talaria_core::Home::at(dir.path());
    let config = talaria_core::config::MediaConfig {
        max_bytes: 10,
        ..Default::default()
    };
    let cache = MediaCache::for_home(&home, &config);
    assert_eq!(cache.dir(), dir.path().join("media"));
    let err = cache
        .store(&b"eleven byte"[..], Hint::default())
        .await
        .unwrap_err();
    assert!(matches!(err, MediaError::TooLarge { limit: 10 }), "{err:?}");
    assert_eq!(listing(cache.dir()), Vec::<String>::new());
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
