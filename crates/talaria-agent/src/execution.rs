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

use std::path::PathBuf;
use std::sync::Arc;

use talaria_exec::{Backend, BackendKind, Backends, Trust, Unavailable, Workspace};

/// Tools that read or write files on the gateway's machine: confined to
/// the workspace in an isolated or untrusted conversation, and withheld
/// where there is no workspace to confine them to.
pub const FILE_TOOLS: &[&str] = &["read_file", "write_file", "patch", "search_files"];

/// Tools that run programs: withheld when the backend cannot start.
pub const COMMAND_TOOLS: &[&str] = &["terminal"];

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
        let kind = backends.kind_for(trust);
        let confined =
            trust == Trust::Untrusted || matches!(kind, BackendKind::Sandbox | BackendKind::Docker);
        let workspace = match &backend {
            Ok(b) => b.workspace().cloned(),
            Err(_) => None,
        };
        // The backend failed but the conversation still needs a place for
        // its files: open the workspace on its own.
        let workspace = match workspace {
            Some(w) => Some(w),
            None if confined && kind != BackendKind::Ssh => match backends.workspace(scope) {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::warn!(scope, "{e}; file tools are withheld from this conversation");
                    None
                }
            },
            None => None,
        };
        Execution {
            trust,
            kind,
            backend,
            workspace: if confined { workspace } else { None },
        }
    }

    /// Whether file tools must stay inside a workspace: someone other than
    /// the owner steers the conversation, or its commands are isolated (a
    /// file tool reaching the host would undo that).
    pub fn confined(&self) -> bool {
        self.trust == Trust::Untrusted
            || matches!(self.kind, BackendKind::Sandbox | BackendKind::Docker)
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
