//! Streaming a file into the cache.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use talaria_core::Home;
use talaria_core::config::MediaConfig;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::name::sanitize_name;
use crate::sniff::{SNIFF_BYTES, sniff};
use crate::{MediaError, MediaKind};

/// The size of one read from the platform's stream: big enough that a
/// 20 MB file is a few hundred reads, small enough that 32 downloads at
/// once hold little memory.
const CHUNK: usize = 64 * 1024;

/// Temporary files start with this, so a sweep can tell them from cached
/// files and nothing else lists them as content.
pub(crate) const TEMP_PREFIX: &str = ".tmp-";

/// The content-addressed cache of the files users send, a directory with
/// one file per distinct content, named `<sha256>.<ext>`.
#[derive(Debug, Clone)]
pub struct MediaCache {
    dir: PathBuf,
    max_bytes: u64,
}

/// What the platform says about a file. Only claims: the type is read from
/// the bytes, and the name is sanitized before anyone sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hint<'a> {
    /// The file's name as sent, if the platform gives one.
    pub name: Option<&'a str>,
    /// The MIME type the platform claims. Kept for logs only; it never
    /// decides what a file is.
    pub mime: Option<&'a str>,
    /// Whether the platform sent the file as a voice note (recorded in the
    /// app) rather than as an audio file. It makes an OGG/Opus file a
    /// [`MediaKind::Voice`]; it changes nothing else.
    pub voice: bool,
}

/// A file in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// Where it is: `<cache>/<sha256>.<ext>`.
    pub path: PathBuf,
    /// The sha256 of its content, in lowercase hex.
    pub sha256: String,
    /// Its size.
    pub bytes: u64,
    /// Its MIME type, read from its bytes.
    pub mime: String,
    /// What kind of media it is, read from its bytes.
    pub kind: MediaKind,
    /// The original name, sanitized, for showing to the model and for
    /// uploads ([`crate::sanitize_name`]).
    pub name: String,
}

impl MediaCache {
    /// A cache in `dir` that refuses files larger than `max_bytes`. The
    /// directory is created (private to the user) on the first store.
    pub fn new(dir: impl Into<PathBuf>, max_bytes: u64) -> MediaCache {
        MediaCache {
            dir: dir.into(),
            max_bytes,
        }
    }

    /// The home's cache, `$TALARIA_HOME/media`, with `media.max_bytes`.
    pub fn for_home(home: &Home, config: &MediaConfig) -> MediaCache {
        MediaCache::new(home.media_dir(), config.max_bytes)
    }

    /// The cache's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The largest file stored, in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Streams `reader` into the cache.
    ///
    /// The bytes go to a temporary file in the cache directory while they
    /// are hashed and counted; the copy stops at the first byte past the
    /// limit with [`MediaError::TooLarge`]. Only a complete file is renamed
    /// to its final name, so a refusal, a read error or dropping this
    /// future part-way leaves nothing behind. The same content stored
    /// twice is one file (the second store renames over the first, which
    /// also renews its age for the sweep).
    pub async fn store<R>(&self, mut reader: R, hint: Hint<'_>) -> Result<Stored, MediaError>
    where
        R: AsyncRead + Unpin,
    {
        create_private_dir(&self.dir).await?;
        let temp = TempFile::create(&self.dir)?;
        let mut file = temp.file;
        let guard = temp.guard;

        let mut hasher = Sha256::new();
        let mut head = Vec::with_capacity(SNIFF_BYTES);
        let mut total: u64 = 0;
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = reader.read(&mut buf).await.map_err(MediaError::Read)?;
            if n == 0 {
                break;
            }
            total += n as u64;
            if total > self.max_bytes {
                // `guard` removes the partial file on the way out.
                return Err(MediaError::TooLarge {
                    limit: self.max_bytes,
                });
            }
            let chunk = &buf[..n];
            hasher.update(chunk);
            if head.len() < SNIFF_BYTES {
                let take = (SNIFF_BYTES - head.len()).min(n);
                head.extend_from_slice(&chunk[..take]);
            }
            file.write_all(chunk)
                .await
                .map_err(|e| cache_error(guard.path(), e))?;
        }
        // On disk before it gets its final name: after a crash, a file with
        // a content name has that content.
        file.flush()
            .await
            .map_err(|e| cache_error(guard.path(), e))?;
        file.sync_data()
            .await
            .map_err(|e| cache_error(guard.path(), e))?;
        drop(file);

        let sha256 = talaria_core::ids::to_hex(&hasher.finalize());
        let sniffed = sniff(&head, hint.voice);
        let path = self.dir.join(format!("{sha256}.{}", sniffed.ext));
        tokio::fs::rename(guard.path(), &path)
            .await
            .map_err(|e| cache_error(&path, e))?;
        guard.disarm();

        if let Some(claimed) = hint.mime
            && !claimed.eq_ignore_ascii_case(sniffed.mime)
        {
            tracing::debug!(
                claimed = ?claimed,
                found = sniffed.mime,
                "media: the platform's type differs from the bytes'"
            );
        }
        Ok(Stored {
            path,
            sha256,
            bytes: total,
            mime: sniffed.mime.to_owned(),
            kind: sniffed.kind,
            name: sanitize_name(hint.name, sniffed.ext),
        })
    }
}

/// A temporary file being written, with the guard that removes it.
struct TempFile {
    file: tokio::fs::File,
    guard: RemoveOnDrop,
}

impl TempFile {
    /// A new file with a name no other store uses, readable by the user
    /// only (what people send is private).
    fn create(dir: &Path) -> Result<TempFile, MediaError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!(
            "{TEMP_PREFIX}{}-{n}-{nanos:09}",
            std::process::id()
        ));
        let mut options = std::fs::OpenOptions::new();
        // `create_new`: never write into a file someone else put there.
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        // Opened in place rather than on Tokio's blocking pool: a store
        // dropped while the pool still opened the file would leave it
        // behind with no guard yet to remove it. One open, like the one
        // unlink in the guard's drop.
        let file = options.open(&path).map_err(|e| cache_error(&path, e))?;
        Ok(TempFile {
            file: tokio::fs::File::from_std(file),
            guard: RemoveOnDrop { path: Some(path) },
        })
    }
}

/// Removes its file when dropped, unless disarmed: the one place that
/// makes "nothing half-written is left" hold on every way out of
/// [`MediaCache::store`], a dropped future included.
struct RemoveOnDrop {
    path: Option<PathBuf>,
}

impl RemoveOnDrop {
    fn path(&self) -> &Path {
        self.path.as_deref().unwrap_or(Path::new(""))
    }

    /// The file became a cached file: keep it.
    fn disarm(mut self) {
        self.path = None;
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            // Blocking, but one unlink; Drop cannot await. A failure leaves
            // a temp file the sweep removes later.
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %path.display(), error = %e, "media: cannot remove a partial file");
            }
        }
    }
}

fn cache_error(path: &Path, source: std::io::Error) -> MediaError {
    MediaError::Cache {
        path: path.to_owned(),
        source,
    }
}

/// Creates the cache directory, mode 0700 on Unix, if it is missing.
async fn create_private_dir(dir: &Path) -> Result<(), MediaError> {
    let mut builder = tokio::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    builder.mode(0o700);
    builder.create(dir).await.map_err(|e| cache_error(dir, e))
}
