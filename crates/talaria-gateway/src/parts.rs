//! An answer as it is sent: text cut to the platform's limit, then the
//! files its `MEDIA:<path>` lines name.
//!
//! The agent attaches a file by writing a line `MEDIA:<path>` in its answer
//! (the ancestor's convention; its `send_message` tool and the
//! `text_to_speech` and `image_generate` tools say so to the model). The
//! line is taken out of the text and the file is sent after it. A path is
//! the model's word, which a chat can steer, so it is only honoured inside
//! the folders files may be sent from ([`FileRoots`]); anything else
//! becomes a line saying it was not sent, never an error that loses the
//! rest of the answer.
//!
//! The parts of one answer are numbered in the order they are sent, and
//! the ledger records how many went out: a reply re-sent after a crash
//! starts at the first part not confirmed, so no part arrives twice and
//! none is lost.

use std::path::{Path, PathBuf};

use talaria_adapter::{MediaKind, MessageLimits};

use crate::split::split_message;

/// The prefix of a line that attaches a file.
pub const MEDIA_PREFIX: &str = "MEDIA:";

/// One message of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Text, within the platform's limit.
    Text(String),
    /// A file, checked to be inside a root.
    File(FilePart),
}

/// A file to send, as found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePart {
    /// The file, resolved (no symlink left in the path).
    pub path: PathBuf,
    /// What it is, from its bytes.
    pub kind: MediaKind,
    /// Its type, from its bytes.
    pub mime: String,
    /// The name the recipient sees.
    pub name: String,
}

/// The folders files may be sent from: the agent's workspace, the media
/// cache, scheduled jobs' output. Resolved once, so a symlink inside one
/// that points outside is caught when a path is checked.
#[derive(Debug, Clone, Default)]
pub struct FileRoots {
    roots: Vec<PathBuf>,
}

impl FileRoots {
    /// Roots from these folders; the first is where relative paths point.
    /// A folder that does not exist yet is kept as written (nothing inside
    /// it can be resolved to it until it does).
    pub fn new(roots: impl IntoIterator<Item = PathBuf>) -> FileRoots {
        FileRoots {
            roots: roots
                .into_iter()
                .map(|r| std::fs::canonicalize(&r).unwrap_or(r))
                .collect(),
        }
    }

    /// The file `raw` names, if it is a readable regular file inside a
    /// root; otherwise why not, in words for the recipient.
    pub fn check(&self, raw: &str) -> Result<FilePart, String> {
        let raw = raw
            .trim()
            .trim_matches(|c| c == '`' || c == '"' || c == '\'');
        if raw.is_empty() {
            return Err("an empty file path".to_owned());
        }
        let given = Path::new(raw);
        let joined = match (given.is_absolute(), self.roots.first()) {
            (true, _) => given.to_path_buf(),
            (false, Some(base)) => base.join(given),
            (false, None) => return Err(format!("{raw} is not a full path")),
        };
        let shown = file_name(&joined);
        let path = std::fs::canonicalize(&joined)
            .map_err(|_| format!("{shown} does not exist or cannot be read"))?;
        if !self.roots.iter().any(|root| path.starts_with(root)) {
            return Err(format!(
                "{shown} is outside the folders files can be sent from"
            ));
        }
        let meta = std::fs::metadata(&path).map_err(|_| format!("{shown} cannot be read"))?;
        if !meta.is_file() {
            return Err(format!("{shown} is not a file"));
        }
        let (mime, kind) = talaria_media::identify(&path).map_err(|e| format!("{shown}: {e}"))?;
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("bin");
        Ok(FilePart {
            name: talaria_media::sanitize_name(Some(&shown), ext),
            path,
            kind,
            mime: mime.to_owned(),
        })
    }
}

/// The last component of a path, for messages and as the file's name.
fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "the file".to_owned())
}

/// The path of a `MEDIA:` line, if `line` is one.
fn media_path(line: &str) -> Option<&str> {
    let line = line.trim();
    let line = line.strip_prefix('`').unwrap_or(line);
    line.strip_prefix(MEDIA_PREFIX).map(str::trim)
}

/// Cuts `answer` into the parts sent, in order: its text (without the
/// `MEDIA:` lines) split to `limits`, then each file. A path refused by
/// `roots` becomes a line in the text saying so.
pub fn answer_parts(answer: &str, roots: &FileRoots, limits: MessageLimits) -> Vec<Part> {
    if !answer.contains(MEDIA_PREFIX) {
        return split_message(answer, limits)
            .into_iter()
            .map(Part::Text)
            .collect();
    }
    let mut text = String::with_capacity(answer.len());
    let mut files = Vec::new();
    for line in answer.lines() {
        match media_path(line) {
            Some(raw) => match roots.check(raw) {
                Ok(file) => files.push(Part::File(file)),
                Err(why) => {
                    tracing::warn!(path = raw, reason = %why, "not sending a file the answer names");
                    text.push_str(&format!("⚠️ Not sent: {why}.\n"));
                }
            },
            None => {
                text.push_str(line);
                text.push('\n');
            }
        }
    }
    let text = text.trim();
    let mut parts: Vec<Part> = if text.is_empty() {
        Vec::new()
    } else {
        split_message(text, limits)
            .into_iter()
            .map(Part::Text)
            .collect()
    };
    parts.extend(files);
    parts
}

/// The most characters of an answer spoken aloud: a voice note of several
/// minutes is not what anyone wants to listen to.
const SPOKEN_MAX_CHARS: usize = 4000;

/// The words of an answer to speak: its text without the `MEDIA:` lines
/// and the markdown marks a voice would read out, cut at a sentence near
/// [`SPOKEN_MAX_CHARS`].
pub fn spoken_text(answer: &str) -> String {
    let mut words = String::new();
    for line in answer.lines().filter(|l| media_path(l).is_none()) {
        let line = line.trim_start_matches(['#', '>', '-', '*', ' ']);
        let line: String = line
            .chars()
            .filter(|c| !matches!(c, '*' | '_' | '`' | '~'))
            .collect();
        if !line.trim().is_empty() {
            words.push_str(line.trim());
            words.push('\n');
        }
    }
    if words.chars().count() > SPOKEN_MAX_CHARS {
        let cut: String = words.chars().take(SPOKEN_MAX_CHARS).collect();
        let end = cut
            .rfind(['.', '!', '?', '\n'])
            .map_or(cut.len(), |i| i + 1);
        words = cut[..end].to_owned();
    }
    words.trim().to_owned()
}

/// Whether an answer names a file to send.
pub fn has_files(answer: &str) -> bool {
    answer.lines().any(|l| media_path(l).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use talaria_adapter::LengthUnit;

    const LIMITS: MessageLimits = MessageLimits {
        max_len: 4096,
        unit: LengthUnit::Chars,
    };

    // A tiny but real PNG header is enough for the type to be read.
    const PNG: &[u8] = &[
        0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 0x0d, b'I', b'H', b'D', b'R', 0,
        0, 0, 1, 0, 0, 0, 1, 8, 6, 0, 0, 0, 0x1f, 0x15, 0xc4, 0x89,
    ];

    #[test]
    fn text_without_files_is_only_split() {
        let roots = FileRoots::default();
        assert_eq!(
            answer_parts("hello", &roots, LIMITS),
            [Part::Text("hello".to_owned())]
        );
    }

    #[test]
    fn media_lines_become_files_after_the_text() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir(&work).unwrap();
        std::fs::write(work.join("chart.png"), PNG).unwrap();
        std::fs::write(work.join("notes.txt"), "plain words").unwrap();
        let roots = FileRoots::new([work.clone()]);
        let answer = format!(
            "Here it is.\nMEDIA:{}\n`MEDIA: notes.txt`\nAnything else?",
            work.join("chart.png").display()
        );
        let parts = answer_parts(&answer, &roots, LIMITS);
        assert_eq!(parts.len(), 3, "{parts:?}");
        assert_eq!(
            parts[0],
            Part::Text("Here it is.\nAnything else?".to_owned())
        );
        let Part::File(png) = &parts[1] else {
            panic!("{parts:?}")
        };
        assert_eq!(
            (png.kind, png.mime.as_str()),
            (MediaKind::Image, "image/png")
        );
        assert_eq!(png.name, "chart.png");
        let Part::File(txt) = &parts[2] else {
            panic!("{parts:?}")
        };
        assert_eq!(txt.kind, MediaKind::Document);
        assert!(has_files(&answer));
        assert!(!has_files("no files"));
    }

    #[test]
    fn spoken_text_leaves_out_files_and_marks() {
        assert_eq!(
            spoken_text("## Done\n**All** `three` files.\nMEDIA:/tmp/a.png\n- next"),
            "Done\nAll three files.\nnext"
        );
        let long = "Word. ".repeat(2000);
        let spoken = spoken_text(&long);
        assert!(
            spoken.chars().count() <= SPOKEN_MAX_CHARS,
            "{}",
            spoken.len()
        );
        assert!(spoken.ends_with('.'));
    }

    #[test]
    fn paths_outside_the_roots_are_refused_in_words() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let outside = dir.path().join("secret.txt");
        std::fs::write(&outside, "key").unwrap();
        // A symlink inside the workspace that points out of it.
        std::os::unix::fs::symlink(&outside, work.join("link.txt")).unwrap();
        let roots = FileRoots::new([work.clone()]);
        for raw in [
            outside.display().to_string(),
            "link.txt".to_owned(),
            "../secret.txt".to_owned(),
            "/etc/passwd".to_owned(),
        ] {
            let parts = answer_parts(&format!("ok\nMEDIA:{raw}"), &roots, LIMITS);
            assert_eq!(parts.len(), 1, "{raw}: {parts:?}");
            let Part::Text(t) = &parts[0] else {
                panic!("{parts:?}")
            };
            assert!(t.contains("outside the folders"), "{raw}: {t}");
        }
        let parts = answer_parts("MEDIA:missing.png", &roots, LIMITS);
        let Part::Text(t) = &parts[0] else {
            panic!("{parts:?}")
        };
        assert!(t.contains("does not exist"), "{t}");
        let parts = answer_parts("MEDIA:", &roots, LIMITS);
        assert!(matches!(&parts[0], Part::Text(t) if t.contains("empty")));
    }
}
