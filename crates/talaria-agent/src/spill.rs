//! Oversized tool output goes to a file; the model gets a preview and the
//! path.
//!
//! One huge result (a build log, a `cat` of a minified bundle) would
//! otherwise fill the context window and, kept in the transcript, be resent
//! with every later request of the session.

use std::path::{Path, PathBuf};

use talaria_core::Home;
use talaria_core::ids::validate_path_component;

/// Characters of the original output shown in the replacement.
pub const PREVIEW_CHARS: usize = 1500;

/// Returns `output` unchanged when it has at most `max_chars` characters.
/// Otherwise writes it to `<tool-output>/<session>/<call>.txt` and returns a
/// preview that names the file. If the file cannot be written the output
/// is cut to `max_chars` instead, so the turn carries on either way.
pub fn spill_if_large(
    home: &Home,
    session_id: &str,
    tool_call_id: &str,
    output: String,
    max_chars: usize,
) -> String {
    let total = output.chars().count();
    if total <= max_chars {
        return output;
    }
    let dir = home.tool_output_dir().join(safe_component(session_id));
    let path = free_path(&dir, &safe_component(tool_call_id));
    match write_private(&dir, &path, output.as_bytes()) {
        Ok(()) => spilled_preview(&output, total, &path),
        Err(e) => {
            tracing::warn!("cannot spill tool output to {}: {e}", path.display());
            let head: String = output.chars().take(max_chars).collect();
            format!(
                "{head}\n\n[output truncated: {total} characters in all, only the first \
                 {max_chars} are shown; saving the rest to a file failed]"
            )
        }
    }
}

/// `<dir>/<stem>.txt`, or `<stem>-2.txt`, `-3`, ... when taken: some
/// servers number calls from zero in every response, and an earlier spill's
/// preview must keep pointing at its own text.
fn free_path(dir: &Path, stem: &str) -> PathBuf {
    let first = dir.join(format!("{stem}.txt"));
    if !first.exists() {
        return first;
    }
    (2u32..10_000)
        .map(|n| dir.join(format!("{stem}-{n}.txt")))
        .find(|p| !p.exists())
        .unwrap_or(first)
}

fn spilled_preview(output: &str, total: usize, path: &Path) -> String {
    let preview: String = output.chars().take(PREVIEW_CHARS).collect();
    format!(
        "[This output was too large to include: {total} characters. The full text is saved \
         to {path}]\n\nFirst {PREVIEW_CHARS} characters:\n{preview}\n\n[End of preview. Use \
         read_file on {path} (with offset and limit) or search_files to read the rest.]",
        path = path.display(),
    )
}

/// `id` if it is a safe single path component; otherwise a sanitised form
/// (disallowed characters become `_`, a leading `.` or `-` is prefixed) so
/// that ids from a model or a server can never escape the directory.
pub fn safe_component(id: &str) -> String {
    if validate_path_component(id).is_ok() {
        return id.to_owned();
    }
    let mut s: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect();
    while s.contains("..") {
        s = s.replace("..", "_");
    }
    if s.is_empty() || s.starts_with('.') || s.starts_with('-') {
        s.insert_str(0, "id_");
    }
    s
}

fn write_private(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        // Tool output can hold anything the agent saw; keep it owner-only
        // like the rest of the home.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?;
        f.write_all(bytes)?;
        Ok(())
    }
    #[cfg(not(unix))]
    {
        std::fs::create_dir_all(dir)?;
        std::fs::write(path, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_output_is_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path());
        let out = spill_if_large(&home, "s1", "c1", "short".into(), 10);
        assert_eq!(out, "short");
        assert!(!home.tool_output_dir().exists());
    }

    #[test]
    fn large_output_is_written_and_previewed() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path());
        let big = "é".repeat(5000);
        let out = spill_if_large(&home, "s1", "call_1", big.clone(), 1000);
        let path = home.tool_output_dir().join("s1").join("call_1.txt");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), big);
        assert!(out.contains(&path.display().to_string()), "{out}");
        assert!(out.contains("read_file"));
        assert!(out.chars().count() < 2000);
    }

    #[test]
    fn a_reused_call_id_does_not_overwrite_an_earlier_spill() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path());
        let a = spill_if_large(&home, "s", "call_0", "a".repeat(50), 10);
        let b = spill_if_large(&home, "s", "call_0", "b".repeat(50), 10);
        let folder = home.tool_output_dir().join("s");
        assert!(
            a.contains(&folder.join("call_0.txt").display().to_string()),
            "{a}"
        );
        assert!(
            b.contains(&folder.join("call_0-2.txt").display().to_string()),
            "{b}"
        );
        assert_eq!(
            std::fs::read_to_string(folder.join("call_0.txt")).unwrap(),
            "a".repeat(50)
        );
    }

    #[test]
    fn hostile_ids_stay_inside_the_directory() {
        for id in [
            "../../etc/passwd",
            "..",
            "",
            ".hidden",
            "-rf",
            "a/b",
            "x\0y",
            "call:1|2",
        ] {
            let c = safe_component(id);
            validate_path_component(&c).unwrap_or_else(|e| panic!("{id:?} -> {c:?}: {e}"));
        }
        assert_eq!(safe_component("call_abc-1"), "call_abc-1");
    }
}
