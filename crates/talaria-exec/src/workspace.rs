//! A workspace: the one host directory an isolated conversation may write
//! to, seen by its commands as `/workspace`.
//!
//! File tools in an isolated session resolve every path through
//! [`Workspace::resolve`]: a path that leaves the workspace, by `..` or by
//! a symlink that points out of it, is refused.

use std::path::{Component, Path, PathBuf};

/// Where a workspace appears inside a sandbox or container.
pub const INNER_ROOT: &str = "/workspace";

/// One conversation's workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    host: PathBuf,
}

impl Workspace {
    /// The workspace of `scope` (a session id or a chat's key) under
    /// `root`, created if missing (mode 0700).
    pub fn open(root: &Path, scope: &str) -> std::io::Result<Workspace> {
        let host = root.join(dir_name(scope));
        std::fs::create_dir_all(&host)?;
        set_private(&host)?;
        // Canonical, so resolved paths compare against the real location.
        let host = host.canonicalize()?;
        Ok(Workspace { host })
    }

    /// The directory on the host.
    pub fn host(&self) -> &Path {
        &self.host
    }

    /// Where commands see it.
    pub fn inner(&self) -> &Path {
        Path::new(INNER_ROOT)
    }

    /// The host path of `raw`, a path as the model wrote it: relative to
    /// the workspace, under `/workspace`, `~` (a sandbox's home is the
    /// workspace), or the host path of the workspace itself. Anything
    /// that leaves the workspace is refused with a message for the model.
    pub fn resolve(&self, raw: &str) -> Result<PathBuf, String> {
        let raw = raw.trim();
        let rel: PathBuf = if raw.is_empty() || raw == "~" {
            PathBuf::new()
        } else if let Some(rest) = raw.strip_prefix("~/") {
            PathBuf::from(rest)
        } else {
            let p = Path::new(raw);
            if p.is_absolute() {
                if let Ok(rest) = p.strip_prefix(INNER_ROOT) {
                    rest.to_path_buf()
                } else if let Ok(rest) = p.strip_prefix(&self.host) {
                    rest.to_path_buf()
                } else {
                    return Err(self.outside(raw));
                }
            } else {
                p.to_path_buf()
            }
        };
        // Lexically first: `..` may not climb above the workspace.
        let mut clean = PathBuf::new();
        for c in rel.components() {
            match c {
                Component::Normal(part) => clean.push(part),
                Component::CurDir => {}
                Component::ParentDir => {
                    if !clean.pop() {
                        return Err(self.outside(raw));
                    }
                }
                Component::RootDir | Component::Prefix(_) => return Err(self.outside(raw)),
            }
        }
        let full = self.host.join(&clean);
        // Then on disk: the deepest part that exists, with every symlink
        // followed, must still be inside.
        let mut probe = full.as_path();
        loop {
            match probe.canonicalize() {
                Ok(real) => {
                    if real.starts_with(&self.host) {
                        return Ok(full);
                    }
                    return Err(format!(
                        "{raw} leads out of this conversation's workspace (through a symbolic \
                         link); only files inside {INNER_ROOT} can be used here"
                    ));
                }
                // A dangling symlink could point anywhere a write would
                // then create a file.
                Err(_) if std::fs::symlink_metadata(probe).is_ok() => {
                    return Err(format!(
                        "{raw} goes through a symbolic link that points nowhere; only files \
                         inside {INNER_ROOT} can be used here"
                    ));
                }
                Err(_) => match probe.parent() {
                    Some(parent) => probe = parent,
                    None => return Err(self.outside(raw)),
                },
            }
        }
    }

    /// `host`, a path inside the workspace on the host, as commands see it.
    pub fn to_inner(&self, host: &Path) -> PathBuf {
        match host.strip_prefix(&self.host) {
            // `join("")` would add a trailing slash.
            Ok(rest) if !rest.as_os_str().is_empty() => Path::new(INNER_ROOT).join(rest),
            _ => PathBuf::from(INNER_ROOT),
        }
    }

    fn outside(&self, raw: &str) -> String {
        format!(
            "{raw} is outside this conversation's workspace. Commands and file tools here are \
             isolated: use paths inside {INNER_ROOT} (relative paths are taken from there)"
        )
    }
}

/// A directory name for `scope` that is safe on any filesystem and stays
/// the same across restarts and versions: a readable part and a hash.
fn dir_name(scope: &str) -> String {
    let readable: String = scope
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(48)
        .collect();
    format!("{readable}-{:016x}", fnv1a(scope.as_bytes()))
}

/// FNV-1a, 64 bits: stable, unlike std's hasher, and enough to keep two
/// scopes whose readable parts agree apart.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn set_private(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_inside_resolve_and_paths_outside_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let ws = Workspace::open(root.path(), "telegram:group:-100").unwrap();
        let h = ws.host().to_path_buf();
        assert_eq!(ws.resolve("a/b.txt").unwrap(), h.join("a/b.txt"));
        assert_eq!(ws.resolve("/workspace/a.txt").unwrap(), h.join("a.txt"));
        assert_eq!(ws.resolve("~/x").unwrap(), h.join("x"));
        assert_eq!(ws.resolve("a/../b").unwrap(), h.join("b"));
        assert!(ws.resolve("../x").is_err());
        assert!(ws.resolve("/etc/passwd").is_err());
        assert!(ws.resolve("/workspace/../etc/passwd").is_err());
        assert_eq!(ws.to_inner(&h.join("d/e")), PathBuf::from("/workspace/d/e"));
        assert_eq!(ws.to_inner(&h).to_str(), Some("/workspace"));
    }

    #[test]
    fn a_symlink_out_of_the_workspace_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        let ws = Workspace::open(root.path(), "chat").unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.host().join("link")).unwrap();
        std::os::unix::fs::symlink("inside.txt", ws.host().join("ok")).unwrap();
        let err = ws.resolve("link/secret").unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
        assert!(ws.resolve("link/new-file").is_err());
        assert!(ws.resolve("ok").is_err());
        std::fs::write(ws.host().join("inside.txt"), "i").unwrap();
        assert!(ws.resolve("ok").is_ok());
    }

    #[test]
    fn two_scopes_get_two_directories() {
        let root = tempfile::tempdir().unwrap();
        let a = Workspace::open(root.path(), "telegram:group:1").unwrap();
        let b = Workspace::open(root.path(), "telegram:group/1").unwrap();
        assert_ne!(a.host(), b.host());
        assert_eq!(a, Workspace::open(root.path(), "telegram:group:1").unwrap());
    }
}
