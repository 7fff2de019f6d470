//! One gateway per bot credential on a machine.
//!
//! Most bot APIs allow a single reader per token (Telegram's `getUpdates`
//! answers a second poller with a conflict, and each gateway would then see
//! half the messages). Two gateways with *different* homes would not notice
//! each other through their PID files, so credentials are locked in a
//! machine-wide (per user) directory instead.
//!
//! The lock file is named after a hash of the credential, never the
//! credential itself, and held with an exclusive `flock`, so a gateway that
//! dies, however it dies, frees its tokens at once.

use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::owner;
use crate::process::{Acquired, LockedFile, create_private_dir};

/// Overrides where token locks live.
pub const LOCK_DIR_ENV: &str = "TALARIA_GATEWAY_LOCK_DIR";

/// Why a [`TokenLock`] could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum TokenLockError {
    /// Another live gateway holds this credential. `pid` is 0 when it could
    /// not be determined.
    #[error(
        "the {} is already used by another gateway (pid {pid}); stop it first",
        scope_words(scope)
    )]
    Held {
        /// The credential's scope (`telegram-bot-token`, ...).
        scope: String,
        /// The holder's process id, or 0.
        pid: u32,
    },
    /// The scope would not make a plain file name.
    #[error("invalid token lock scope {0:?}: use lowercase letters, digits, '-' and '_'")]
    InvalidScope(String),
    /// Neither the override nor `XDG_STATE_HOME` nor `HOME` is set.
    #[error("cannot place token locks: set {LOCK_DIR_ENV}, XDG_STATE_HOME or HOME to a directory")]
    NoLockDir,
    /// The lock directory or file could not be created, locked or written.
    #[error("cannot use the token lock {}: {source}", path.display())]
    Io {
        /// The lock directory or file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
}

/// `telegram-bot-token` → `telegram bot token`, for messages.
fn scope_words(scope: &str) -> String {
    scope.replace(['-', '_'], " ")
}

/// Exclusive use of one credential by this process, until dropped.
#[derive(Debug)]
pub struct TokenLock {
    lock: LockedFile,
    scope: String,
}

/// What a token lock file contains (for humans and for naming the holder).
#[derive(Serialize)]
struct LockRecord<'a> {
    pid: u32,
    started_at: Option<u64>,
    scope: &'a str,
}

impl TokenLock {
    /// Locks `credential` under `scope` (e.g. `telegram-bot-token`) in the
    /// machine-wide lock directory (see [`lock_dir`]).
    pub fn acquire(scope: &str, credential: &str) -> Result<TokenLock, TokenLockError> {
        let dir = lock_dir().ok_or(TokenLockError::NoLockDir)?;
        TokenLock::acquire_in(&dir, scope, credential)
    }

    /// Like [`TokenLock::acquire`], in `dir`.
    pub fn acquire_in(
        dir: &Path,
        scope: &str,
        credential: &str,
    ) -> Result<TokenLock, TokenLockError> {
        let valid = !scope.is_empty()
            && scope
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !valid {
            return Err(TokenLockError::InvalidScope(scope.to_owned()));
        }
        let path = dir.join(lock_file_name(scope, credential));
        let io_err = |source| TokenLockError::Io {
            path: path.clone(),
            source,
        };
        create_private_dir(dir).map_err(io_err)?;
        let mut lock = match LockedFile::try_acquire(&path).map_err(io_err)? {
            Acquired::Locked { lock, .. } => lock,
            Acquired::Held { pid } => {
                return Err(TokenLockError::Held {
                    scope: scope.to_owned(),
                    pid,
                });
            }
        };
        let me = owner::current();
        lock.write_json(&LockRecord {
            pid: me.pid,
            started_at: me.started_at,
            scope,
        })
        .map_err(io_err)?;
        Ok(TokenLock {
            lock,
            scope: scope.to_owned(),
        })
    }

    /// The scope this lock was taken under.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        self.lock.path()
    }

    /// Removes the lock file and unlocks it, reporting failures that a
    /// plain drop would only log.
    pub fn release(self) -> io::Result<()> {
        let mut lock = self.lock;
        lock.release()
    }
}

/// Where token locks live: `$TALARIA_GATEWAY_LOCK_DIR`, else
/// `$XDG_STATE_HOME/talaria/gateway-locks`, else
/// `~/.local/state/talaria/gateway-locks`. Deliberately not under the
/// Talaria home: two homes must still see each other's locks.
pub fn lock_dir() -> Option<PathBuf> {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var(LOCK_DIR_ENV) {
        return Some(PathBuf::from(dir));
    }
    // The XDG spec says relative values are invalid and to be ignored.
    if let Some(state) = var("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
    {
        return Some(state.join("talaria/gateway-locks"));
    }
    var("HOME").map(|home| PathBuf::from(home).join(".local/state/talaria/gateway-locks"))
}

/// `<scope>-<first 16 hex of sha256(credential)>.lock`.
fn lock_file_name(scope: &str, credential: &str) -> String {
    let digest = Sha256::digest(credential.as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{scope}-{hex}.lock")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw";

    #[test]
    fn a_credential_can_be_locked_only_once() {
        let dir = tempfile::tempdir().unwrap();
        let first = TokenLock::acquire_in(dir.path(), "telegram-bot-token", TOKEN).unwrap();
        assert_eq!(first.scope(), "telegram-bot-token");
        let err = TokenLock::acquire_in(dir.path(), "telegram-bot-token", TOKEN).unwrap_err();
        match &err {
            TokenLockError::Held { scope, pid } => {
                assert_eq!(scope, "telegram-bot-token");
                assert_eq!(*pid, std::process::id());
            }
            other => panic!("expected Held, got {other:?}"),
        }
        assert_eq!(
            err.to_string(),
            format!(
                "the telegram bot token is already used by another gateway (pid {}); stop it first",
                std::process::id()
            )
        );
    }

    #[test]
    fn a_different_credential_or_scope_is_independent() {
        let dir = tempfile::tempdir().unwrap();
        let _a = TokenLock::acquire_in(dir.path(), "telegram-bot-token", TOKEN).unwrap();
        let _b = TokenLock::acquire_in(dir.path(), "telegram-bot-token", "987:other").unwrap();
        let _c = TokenLock::acquire_in(dir.path(), "discord-bot-token", TOKEN).unwrap();
    }

    #[test]
    fn drop_releases_the_credential() {
        let dir = tempfile::tempdir().unwrap();
        let lock = TokenLock::acquire_in(dir.path(), "telegram-bot-token", TOKEN).unwrap();
        let path = lock.path().to_owned();
        assert!(path.exists());
        drop(lock);
        assert!(!path.exists());
        let again = TokenLock::acquire_in(dir.path(), "telegram-bot-token", TOKEN).unwrap();
        again.release().unwrap();
        assert!(!path.exists());
    }

    #[test]
    fn the_credential_never_touches_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let lock = TokenLock::acquire_in(dir.path(), "telegram-bot-token", TOKEN).unwrap();
        let name = lock
            .path()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        let expected_hash: String = Sha256::digest(TOKEN.as_bytes())[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(name, format!("telegram-bot-token-{expected_hash}.lock"));
        // No fragment of the token (its bot id, any 6-character window of
        // its secret) appears in the name or the content. (Digit-only
        // windows are skipped: pids and start times are digits too.)
        let content = std::fs::read_to_string(lock.path()).unwrap();
        let (bot_id, secret) = TOKEN.split_once(':').unwrap();
        assert!(!name.contains(bot_id) && !content.contains(bot_id));
        let chars: Vec<char> = secret.chars().collect();
        for window in chars.windows(6) {
            let piece: String = window.iter().collect();
            assert!(!name.contains(&piece), "{piece} leaked into {name}");
            assert!(!content.contains(&piece), "{piece} leaked into {content}");
        }
        let record: serde_json::Value = serde_json::from_str(&content).unwrap();
        assert_eq!(record["pid"], std::process::id());
        assert_eq!(record["scope"], "telegram-bot-token");
        let mode = {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(lock.path()).unwrap().permissions().mode()
        };
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn scopes_must_be_plain_file_name_parts() {
        let dir = tempfile::tempdir().unwrap();
        for scope in ["", "../etc", "a/b", "Telegram", "a b"] {
            assert!(matches!(
                TokenLock::acquire_in(dir.path(), scope, TOKEN),
                Err(TokenLockError::InvalidScope(_))
            ));
        }
    }
}
