//! The home's credential files (`.env` and `config.yaml`), kept out of the
//! agent's reach.
//!
//! Redaction replaces every known secret *value* in what a tool returns,
//! but a value that was transformed first (`base64 .env`, `xxd`, a
//! character at a time) no longer looks like itself. So the files that hold
//! the values are refused at the door instead:
//!
//! - the file tools (`read_file`, `write_file`, `patch`) refuse a path that
//!   is one of these files, compared by file identity (device and inode),
//!   so a symbolic or hard link to them is refused too; `search_files`
//!   skips them;
//! - the `terminal` tool refuses a command that names one of them: its
//!   absolute path, a path through the home (`~/.talaria/...`, the home's
//!   absolute path, a glob in the home), or the bare file name when the
//!   command runs inside the home.
//!
//! The command check reads the command's text, so a command that builds the
//! path at run time (`cat $(printf ...)`) is not recognised; shutting that
//! off needs the command to run where the files are not visible at all,
//! which is the sandbox's work. Commands get no secret through their
//! environment either way (see `terminal`'s allowlist).

use std::path::{Component, Path, PathBuf};

use talaria_core::Home;

/// The files this module protects, by kind, for messages.
const NAMES: [&str; 2] = [".env", "config.yaml"];

/// The protected files of `home`: its `.env` and its `config.yaml`.
pub fn protected_files(home: &Home) -> [PathBuf; 2] {
    [home.dotenv_file(), home.config_file()]
}

/// A device and inode: what makes two paths the same file.
#[cfg(unix)]
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn identity(path: &Path) -> Option<(u64, u64)> {
    let _ = path;
    None
}

/// `path` with `.` and `..` folded away, without touching the disk (the
/// file may not exist yet).
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// The path a written file ends up at: symbolic links followed (a link to
/// a file that does not exist yet included), its directory resolved, and
/// its own name.
fn resolved(path: &Path) -> PathBuf {
    if let Ok(p) = std::fs::canonicalize(path) {
        return p;
    }
    let mut path = lexical(path);
    // A dangling link: writing through it creates its target. Bounded like
    // the kernel's own limit on nested links.
    for _ in 0..40 {
        let Ok(target) = std::fs::read_link(&path) else {
            break;
        };
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        path = lexical(&base.join(target));
    }
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(dir)
            .map(|d| d.join(name))
            .unwrap_or(path.clone()),
        _ => path,
    }
}

/// Which protected file `path` is, if it is one (the same file by identity,
/// or the same path once resolved).
pub fn protected(home: &Home, path: &Path) -> Option<PathBuf> {
    let target_id = identity(path);
    let target = resolved(path);
    protected_files(home).into_iter().find(|file| {
        (target_id.is_some() && identity(file) == target_id) || resolved(file) == target
    })
}

/// Whether `a` and `b` are the same existing file.
pub fn same_file(a: &Path, b: &Path) -> bool {
    identity(a).is_some_and(|id| identity(b) == Some(id))
}

/// The refusal the file tools give for a protected file.
pub fn refusal(file: &Path) -> String {
    format!(
        "{} holds Talaria's credentials (API keys, bot tokens); the agent's tools may not \
         read or change it. Tell the user what you need: they can look at or edit the file \
         themselves.",
        file.display()
    )
}

/// Ways a command may spell the home directory.
fn home_spellings(home: &Home) -> Vec<String> {
    let mut out = vec![home.root().display().to_string()];
    if let Ok(real) = std::fs::canonicalize(home.root()) {
        out.push(real.display().to_string());
    }
    out.push("$TALARIA_HOME".to_owned());
    out.push("${TALARIA_HOME}".to_owned());
    if let Some(user_home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        let user_home = PathBuf::from(user_home);
        for root in out.clone() {
            if let Ok(rest) = Path::new(&root).strip_prefix(&user_home) {
                let rest = rest.display().to_string();
                for prefix in ["~", "$HOME", "${HOME}"] {
                    out.push(if rest.is_empty() {
                        prefix.to_owned()
                    } else {
                        format!("{prefix}/{rest}")
                    });
                }
            }
        }
    }
    out.retain(|s| s.len() > 1);
    out.sort();
    out.dedup();
    out
}

/// Whether `text` has `word` with no file-name character right before or
/// after it (so `.env` matches in `cat .env` but not in `.envrc`).
fn mentions_file_name(text: &str, word: &str) -> bool {
    let name_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        // A leading `.` of `.env` may follow a path separator or a quote;
        // what matters is that the name is not part of a longer name.
        !before.is_some_and(|c| name_char(c) && c != '.') && !after.is_some_and(name_char)
    })
}

/// The protected file a shell command would reach, judged from its text:
/// `Some(name)` when it names `.env` or `config.yaml` through the home (or
/// as a bare name while running inside the home), or points a glob into
/// the home.
pub fn command_reaches(home: &Home, command: &str, workdir: &Path) -> Option<&'static str> {
    let names: Vec<&'static str> = NAMES
        .iter()
        .copied()
        .filter(|n| mentions_file_name(command, n))
        .collect();
    let in_home = {
        let dir = resolved(workdir);
        let root = resolved(home.root());
        dir.starts_with(&root)
    };
    if in_home && let Some(n) = names.first() {
        return Some(n);
    }
    for spelling in home_spellings(home) {
        for (at, _) in command.match_indices(spelling.as_str()) {
            let rest = &command[at + spelling.len()..];
            // The home named, then (after an optional `/`) a glob or the
            // end of the word: `cat ~/.talaria/*`, `tar c ~/.talaria`.
            let rest = rest.strip_prefix('/').unwrap_or(rest);
            let word_end = rest
                .find(|c: char| {
                    c.is_whitespace() || matches!(c, ';' | '|' | '&' | ')' | '\'' | '"')
                })
                .unwrap_or(rest.len());
            let word = &rest[..word_end];
            if let Some(n) = names.first() {
                return Some(n);
            }
            if word.is_empty() || word.contains(['*', '?', '[', '{']) {
                return Some("the Talaria home");
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_match_only_whole() {
        assert!(mentions_file_name("base64 .env", ".env"));
        assert!(mentions_file_name("cat ./.env | x", ".env"));
        assert!(mentions_file_name("cat '/h/.env'", ".env"));
        assert!(mentions_file_name("cat config.yaml", "config.yaml"));
        assert!(!mentions_file_name("cat .envrc", ".env"));
        assert!(!mentions_file_name("cat my.env", ".env"));
        assert!(!mentions_file_name("cat app-config.yaml", "config.yaml"));
    }

    #[test]
    fn commands_through_the_home_are_recognised() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home"));
        std::fs::create_dir_all(home.root()).unwrap();
        let elsewhere = dir.path();
        let root = home.root().display().to_string();
        for cmd in [
            format!("base64 {root}/.env"),
            format!("cat {root}/config.yaml | rev"),
            format!("tar c {root} | base64"),
            format!("cat {root}/* | xxd"),
            format!("cd {root} && base64 .env"),
            "cat $TALARIA_HOME/.env".to_owned(),
        ] {
            assert!(command_reaches(&home, &cmd, elsewhere).is_some(), "{cmd}");
        }
        // Inside the home, the bare names are enough.
        assert_eq!(
            command_reaches(&home, "base64 .env", home.root()),
            Some(".env")
        );
        assert_eq!(
            command_reaches(&home, "cat config.yaml", home.root()),
            Some("config.yaml")
        );
        // Elsewhere, a project's own .env or config.yaml is the user's.
        assert_eq!(
            command_reaches(&home, "cat .env config.yaml", elsewhere),
            None
        );
        assert_eq!(
            command_reaches(&home, &format!("ls {root}/skills"), elsewhere),
            None
        );
        assert_eq!(command_reaches(&home, "env | base64", home.root()), None);
    }

    #[test]
    fn links_to_a_protected_file_are_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home"));
        std::fs::create_dir_all(home.root()).unwrap();
        std::fs::write(home.dotenv_file(), "K=v\n").unwrap();
        let hard = dir.path().join("hard");
        std::fs::hard_link(home.dotenv_file(), &hard).unwrap();
        let soft = dir.path().join("soft");
        std::os::unix::fs::symlink(home.config_file(), &soft).unwrap();
        assert!(protected(&home, &hard).is_some());
        // A link to a config.yaml that does not exist yet still resolves
        // to it.
        assert!(protected(&home, &soft).is_some());
        assert!(protected(&home, &home.root().join("sub/../.env")).is_some());
        assert!(protected(&home, &dir.path().join(".env")).is_none());
    }
}
