//! Writing variables into `$TALARIA_HOME/.env` (for `/sethome`), keeping
//! every other line, comment and ordering as it was.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Symlinks followed before giving up, as Linux does, so a cycle ends.
const MAX_SYMLINKS: usize = 40;

/// Sets each `(name, value)` in the file: an existing `NAME=` line is
/// replaced in place, a missing one appended. An empty value removes the
/// variable. The file is rewritten through a temporary file (mode 0600, as
/// `tempfile` creates it) and renamed over the old one, so a crash leaves
/// either version, never half. When `path` is a symlink, its final target
/// is the file rewritten (and created if missing): an `.env` linked into the
/// home from elsewhere stays linked and is updated where it lives.
///
/// Values are written so that dotenvy reads them back unchanged: bare
/// when plain, otherwise double-quoted with `\`, `"` and `$` escaped.
pub fn upsert(path: &Path, vars: &[(String, String)]) -> io::Result<()> {
    let path = resolve_symlinks(path)?;
    let old = match std::fs::read_to_string(&path) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    for (name, value) in vars {
        if value.contains(['\n', '\r']) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the value for {name} contains a line break"),
            ));
        }
    }
    let mut done = vec![false; vars.len()];
    let mut out = String::new();
    for line in old.lines() {
        let name = line
            .trim_start()
            .trim_start_matches("export ")
            .split('=')
            .next()
            .unwrap_or("")
            .trim();
        match vars.iter().position(|(n, _)| n == name) {
            Some(i) => {
                done[i] = true;
                let value = &vars[i].1;
                if !value.is_empty() {
                    out.push_str(&format!("{name}={}\n", quote(value)));
                }
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    for (i, (name, value)) in vars.iter().enumerate() {
        if !done[i] && !value.is_empty() {
            out.push_str(&format!("{name}={}\n", quote(value)));
        }
    }
    // The temporary file must be in the target's directory for the rename
    // to be atomic; a bare file name has the empty path as its parent.
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    // No chmod: `tempfile` already creates the file 0600 on Unix (the
    // process umask can only narrow that), so the secrets in it are never
    // readable by others, not even before the rename.
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(out.as_bytes())?;
    tmp.as_file().sync_all()?;
    tmp.persist(&path).map_err(|e| e.error)?;
    Ok(())
}

/// The file `path` finally names: symlinks are followed, a relative target
/// being relative to its link's directory. A dangling link resolves to its
/// missing target (which `upsert` then creates), unlike
/// `std::fs::canonicalize`, which fails on it.
fn resolve_symlinks(path: &Path) -> io::Result<PathBuf> {
    let mut current = path.to_path_buf();
    for _ in 0..MAX_SYMLINKS {
        match std::fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = std::fs::read_link(&current)?;
                // `join` keeps an absolute target as it is.
                current = match current.parent() {
                    Some(dir) => dir.join(target),
                    None => target,
                };
            }
            Ok(_) => return Ok(current),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(current),
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{}: too many levels of symbolic links", path.display()),
    ))
}

/// Writes a value so that dotenvy (0.15) reads it back unchanged.
///
/// Plain values go bare. Anything else is double-quoted, with `\`, `"`
/// and `$` escaped: inside double quotes dotenvy expands `$NAME` and
/// `${NAME}` from the environment, and `\$` is its literal dollar. Single
/// quotes would not expand, but dotenvy's line reader still treats `\` as
/// an escape inside them, so a value ending in a backslash would swallow
/// the closing quote.
fn quote(value: &str) -> String {
    if value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.:@/+".contains(c))
    {
        return value.to_owned();
    }
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        if matches!(c, '\\' | '"' | '$') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_appends_removes_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".env");
        std::fs::write(
            &path,
            "# keys\nA=1\nTELEGRAM_HOME_CHANNEL=old\nB=\"two words\"\n",
        )
        .unwrap();
        upsert(
            &path,
            &[
                ("TELEGRAM_HOME_CHANNEL".into(), "-100123".into()),
                ("TELEGRAM_HOME_CHANNEL_THREAD_ID".into(), "7".into()),
                ("A".into(), String::new()),
            ],
        )
        .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text,
            "# keys\nTELEGRAM_HOME_CHANNEL=-100123\nB=\"two words\"\nTELEGRAM_HOME_CHANNEL_THREAD_ID=7\n"
        );
        let parsed: Vec<(String, String)> = dotenvy::from_path_iter(&path)
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        assert!(parsed.contains(&("TELEGRAM_HOME_CHANNEL".into(), "-100123".into())));
        assert!(upsert(&path, &[("X".into(), "a\nb".into())]).is_err());
    }

    fn parse(path: &Path) -> Vec<(String, String)> {
        dotenvy::from_path_iter(path)
            .unwrap()
            .map(|r| r.unwrap())
            .collect()
    }

    #[test]
    fn values_read_back_unchanged_by_dotenvy() {
        // `$HOME` is set in any test environment, so an unescaped dollar
        // would visibly expand; `$NOT_SET_ANYWHERE_42` would vanish.
        let values = [
            "$HOME",
            "${HOME}/x",
            "price $5 and $NOT_SET_ANYWHERE_42",
            "say \"hi\" and 'bye'",
            "it's",
            "# not a comment",
            "a #b",
            "back\\slash",
            "ends with a backslash\\",
            "\\$HOME",
            "\\n stays two chars",
            "  leading and trailing spaces  ",
            "tab\there",
            "x=y=z",
            "émoji 😀",
            "plain-value_1.2:3@host/+",
        ];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".env");
        let kept = "KEEP='kept $HOME as is' # a comment\n";
        std::fs::write(&path, kept).unwrap();
        let vars: Vec<(String, String)> = values
            .iter()
            .enumerate()
            .map(|(i, v)| (format!("V{i}"), (*v).to_owned()))
            .collect();
        upsert(&path, &vars).unwrap();
        assert!(std::fs::read_to_string(&path).unwrap().starts_with(kept));
        let parsed = parse(&path);
        assert_eq!(parsed[0], ("KEEP".into(), "kept $HOME as is".into()));
        assert_eq!(&parsed[1..], vars.as_slice());
        // Rewriting in place, over the quoted lines, is just as exact.
        let again: Vec<(String, String)> = vars
            .iter()
            .map(|(n, v)| (n.clone(), format!("{v} $HOME")))
            .collect();
        upsert(&path, &again).unwrap();
        assert_eq!(&parse(&path)[1..], again.as_slice());
    }

    #[cfg(unix)]
    #[test]
    fn the_file_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".env");
        std::fs::write(&path, "A=1\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        upsert(&path, &[("B".into(), "2".into())]).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[cfg(unix)]
    #[test]
    fn a_symlinked_file_is_written_through_to_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir(&home).unwrap();
        let real = dir.path().join("secrets.env");
        std::fs::write(&real, "A=1\n").unwrap();
        let link = home.join(".env");
        // Relative, so it resolves against the link's directory.
        std::os::unix::fs::symlink("../secrets.env", &link).unwrap();
        upsert(&link, &[("B".into(), "two words".into())]).unwrap();
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink(),
            "the link was replaced by a file"
        );
        assert_eq!(
            std::fs::read_to_string(&real).unwrap(),
            "A=1\nB=\"two words\"\n"
        );

        // A dangling link gets its target created.
        let missing = dir.path().join("later.env");
        let dangling = home.join("other.env");
        std::os::unix::fs::symlink(&missing, &dangling).unwrap();
        upsert(&dangling, &[("C".into(), "3".into())]).unwrap();
        assert_eq!(std::fs::read_to_string(&missing).unwrap(), "C=3\n");
        assert!(
            std::fs::symlink_metadata(&dangling)
                .unwrap()
                .file_type()
                .is_symlink()
        );

        // A cycle is an error, not a hang.
        let a = home.join("a.env");
        let b = home.join("b.env");
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();
        assert!(upsert(&a, &[("D".into(), "4".into())]).is_err());
    }
}
