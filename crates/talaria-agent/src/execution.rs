//! [`Execution`]: where one conversation's commands run and which files
//! its tools may touch.
//!
//! The owner's conversations run on `terminal.backend` (the host, by
//! default) with the file tools free to go where the user could. Anyone
//! else's run on `terminal.untrusted_backend` (the bubblewrap sandbox, by
//! default), and their file tools are confined to the conversation's
//! workspace. When the backend a conversation needs cannot start, the
//! tools that would need it are withheld from the model, so nothing runs
//! on the host in its place.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use talaria_exec::{Backend, BackendKind, Backends, Unavailable, Workspace};

pub use talaria_exec::Trust;

/// The prefix of an answer's line that attaches a file (the gateway's
/// `parts` module reads it).
const MEDIA_PREFIX: &str = "MEDIA:";

/// Tools that read or write files on the gateway's machine: confined to
/// the workspace in an isolated or untrusted conversation, and withheld
/// where there is no workspace to confine them to.
pub const FILE_TOOLS: &[&str] = &["read_file", "write_file", "patch", "search_files"];

/// Tools that run programs: withheld when the backend cannot start.
pub const COMMAND_TOOLS: &[&str] = &["terminal", "execute_code"];

/// Where a conversation's commands and files go.
#[derive(Debug, Clone)]
pub struct Execution {
    /// Whose conversation it is.
    pub trust: Trust,
    /// The backend the conversation gets (also when it can't start).
    pub kind: BackendKind,
    /// Where `terminal` runs, or why it can't.
    pub backend: Result<Arc<dyn Backend>, Unavailable>,
    /// The directory file tools are confined to; `None` lets them reach
    /// the host (only the owner's local conversations).
    pub workspace: Option<Workspace>,
}

impl Execution {
    /// The owner on the host, commands running in `workdir`: the terminal
    /// chat's default and what tests use.
    pub fn local(workdir: impl Into<PathBuf>) -> Execution {
        Execution {
            trust: Trust::Owner,
            kind: BackendKind::Local,
            backend: Ok(Arc::new(talaria_exec::local::Local::new(workdir))),
            workspace: None,
        }
    }

    /// The execution of the conversation `scope` for `trust`, from the
    /// configured backends.
    pub async fn for_conversation(backends: &Backends, trust: Trust, scope: &str) -> Execution {
        let backend = backends.backend(trust, scope).await;
        let mut execution = Execution {
            trust,
            kind: backends.kind_for(trust),
            backend,
            workspace: None,
        };
        if execution.confined() {
            execution.workspace = match execution.backend.as_ref().ok().and_then(|b| b.workspace())
            {
                Some(w) => Some(w.clone()),
                // With ssh the files are on the remote host: none here.
                None if execution.kind == BackendKind::Ssh => None,
                // The backend failed (or keeps no workspace) but the
                // conversation still needs a place for its files.
                None => match backends.workspace(scope) {
                    Ok(w) => Some(w),
                    Err(e) => {
                        tracing::warn!(
                            scope,
                            "{e}; file tools are withheld from this conversation"
                        );
                        None
                    }
                },
            };
        }
        execution
    }

    /// Whether file tools must stay inside a workspace: someone other than
    /// the owner steers the conversation, or its commands are isolated (a
    /// file tool reaching the host would undo that).
    pub fn confined(&self) -> bool {
        self.trust == Trust::Untrusted || self.kind.is_isolated()
    }

    /// Tools the model must not be offered in this conversation.
    pub fn withheld(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.backend.is_err() {
            out.extend(COMMAND_TOOLS);
        }
        if self.confined() && self.workspace.is_none() {
            out.extend(FILE_TOOLS);
        }
        out
    }

    /// `answer` with its `MEDIA:<path>` lines (files to send) kept inside
    /// what this conversation may send: in a confined conversation a path
    /// must lie in its workspace (written as the commands see it,
    /// `/workspace/...`, and turned into the host path the sender reads) or
    /// be a file its users sent (`media_dir`); any other becomes a line
    /// saying it was not sent. The owner's answers are left as they are.
    pub fn confine_media(&self, answer: &str, media_dir: &Path) -> String {
        if !self.confined() || !answer.contains(MEDIA_PREFIX) {
            return answer.to_owned();
        }
        let media_dir = media_dir.canonicalize().ok();
        let mut out = String::with_capacity(answer.len());
        for line in answer.split_inclusive('\n') {
            let body = line.trim();
            let body = body.strip_prefix('`').unwrap_or(body);
            let Some(raw) = body.strip_prefix(MEDIA_PREFIX) else {
                out.push_str(line);
                continue;
            };
            let raw = raw.trim().trim_end_matches('`').trim();
            let sent = Path::new(raw);
            let in_media = sent.is_absolute()
                && media_dir
                    .as_ref()
                    .is_some_and(|m| sent.canonicalize().is_ok_and(|p| p.starts_with(m)));
            let kept = if in_media {
                Some(sent.to_path_buf())
            } else {
                self.workspace.as_ref().and_then(|w| w.resolve(raw).ok())
            };
            match kept {
                Some(path) => out.push_str(&format!("{MEDIA_PREFIX}{}\n", path.display())),
                None => out.push_str(&format!(
                    "⚠️ Not sent: {raw} is outside this conversation's workspace.\n"
                )),
            }
        }
        out
    }

    /// One line for `/status`: where commands run.
    pub fn describe(&self) -> String {
        match &self.backend {
            Ok(b) => match b.kind() {
                BackendKind::Local => "on this machine (local)".to_owned(),
                BackendKind::Sandbox => {
                    "in a bubblewrap sandbox (sandbox), workspace /workspace".to_owned()
                }
                BackendKind::Docker => "in a container (docker), workspace /workspace".to_owned(),
                BackendKind::Ssh => "on a remote host (ssh)".to_owned(),
            },
            Err(u) => format!("nowhere: {u}; the terminal is withheld"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_confined_answer_sends_only_workspace_and_sent_files() {
        let root = tempfile::tempdir().unwrap();
        let media = root.path().join("media");
        std::fs::create_dir_all(&media).unwrap();
        std::fs::write(media.join("photo.png"), "p").unwrap();
        let ws = Workspace::open(&root.path().join("ws"), "chat").unwrap();
        std::fs::write(ws.host().join("out.txt"), "o").unwrap();
        let confined = Execution {
            trust: Trust::Untrusted,
            kind: BackendKind::Sandbox,
            backend: Err(Unavailable {
                kind: BackendKind::Sandbox,
                reason: "test".into(),
            }),
            workspace: Some(ws.clone()),
        };
        let answer = format!(
            "Here.\nMEDIA:/workspace/out.txt\nMEDIA:{}\nMEDIA:/etc/passwd\n`MEDIA:../x`\nBye",
            media.join("photo.png").display()
        );
        let got = confined.confine_media(&answer, &media);
        assert!(
            got.contains(&format!("MEDIA:{}", ws.host().join("out.txt").display())),
            "{got}"
        );
        assert!(
            got.contains(&format!("MEDIA:{}", media.join("photo.png").display())),
            "{got}"
        );
        assert!(got.contains("Not sent: /etc/passwd"), "{got}");
        assert!(got.contains("Not sent: ../x"), "{got}");
        assert!(got.starts_with("Here.\n") && got.ends_with("Bye"), "{got}");
        // The owner's answers are theirs.
        let owner = Execution::local(root.path());
        assert_eq!(owner.confine_media(&answer, &media), answer);
    }
}
