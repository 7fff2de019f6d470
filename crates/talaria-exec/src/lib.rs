//! Where the agent's commands run.
//!
//! A [`Backend`] starts `sh -c <command>` somewhere and hands back its
//! merged output and a handle to wait for or kill it:
//!
//! - [`local`]: on the host, as the gateway's user (the owner's own work);
//! - [`bwrap`]: in a bubblewrap sandbox on the host: read-only system
//!   directories, a writable [`Workspace`], a private `/tmp`, no network,
//!   its own PID, IPC and UTS namespaces, no capabilities, rlimits;
//! - [`docker`]: in a container per session or chat, through the Engine
//!   API (Docker or Podman);
//! - [`ssh`]: on another machine, through the system `ssh`.
//!
//! Whatever the backend, a command starts from an allowlisted environment
//! ([`env`]): provider keys, bot tokens and database URLs never reach it.
//! [`Backends`] picks and keeps the backend of each session: it knows which
//! one the configuration names for trusted and untrusted conversations,
//! whether that one can start here, and why not when it can't.

#![forbid(unsafe_code)]

use std::fmt;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncWrite};

pub mod bwrap;
pub mod docker;
pub mod env;
pub mod local;
mod pool;
pub mod process_group;
pub mod seccomp;
pub mod ssh;
pub mod workspace;

pub use pool::{Backends, Trust, Unavailable};
pub use talaria_core::config::BackendKind;
pub use workspace::Workspace;

/// Why a command could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The backend's program or daemon is missing or refused (no `bwrap`,
    /// no Docker socket, a host key that doesn't match).
    #[error("{0}")]
    Unavailable(String),
    /// Anything else: a pipe, a spawn, a bad directory.
    #[error("{0}")]
    Io(String),
}

impl ExecError {
    /// An I/O failure while doing `what`.
    pub fn io(what: &str, e: impl fmt::Display) -> ExecError {
        ExecError::Io(format!("cannot {what}: {e}"))
    }
}

/// One command to run.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    /// The command line, run by `sh -c`.
    pub command: String,
    /// The directory to run in as the backend sees it; `None` is the
    /// backend's own default (the workspace, or the host's working
    /// directory for [`local`]).
    pub workdir: Option<PathBuf>,
    /// The whole environment of the command (see [`env::child_env`]).
    pub env: Vec<(String, String)>,
    /// Give the command a pipe from us as stdin ([`Running::input`])
    /// instead of `/dev/null`: a background process the agent may answer.
    pub stdin: bool,
    /// Run the command under a pseudo-terminal, for programs that behave
    /// differently (or refuse to run) without one: its output is the
    /// terminal's (stdout and stderr, with the terminal's line endings),
    /// its stdin the terminal's keyboard ([`Running::input`]). A backend
    /// that cannot make one refuses the command.
    pub pty: bool,
}

impl CommandSpec {
    /// `command` run in `workdir` with `env`, without stdin or a terminal
    /// (a foreground command: nobody is at the keyboard).
    pub fn new(
        command: impl Into<String>,
        workdir: Option<PathBuf>,
        env: Vec<(String, String)>,
    ) -> CommandSpec {
        CommandSpec {
            command: command.into(),
            workdir,
            env,
            stdin: false,
            pty: false,
        }
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// The exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
}

/// A command that has started: its output (stdout and stderr merged, in
/// the order written) and the process.
pub struct Running {
    /// Ends (EOF) once everything the command started has closed it.
    pub output: Box<dyn AsyncRead + Send + Unpin>,
    /// The command's stdin (or its terminal's keyboard), when
    /// [`CommandSpec::stdin`] or [`CommandSpec::pty`] asked for one;
    /// dropping it is the end of input (for a terminal, writing `^D`
    /// is).
    pub input: Option<Box<dyn AsyncWrite + Send + Unpin>>,
    /// Waits for or kills the command.
    pub process: Box<dyn Process>,
}

impl fmt::Debug for Running {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Running").finish_non_exhaustive()
    }
}

/// A started command.
#[async_trait]
pub trait Process: Send {
    /// Waits for the command's shell to end. Cancel-safe: it can be polled
    /// in a `select!` and called again.
    async fn wait(&mut self) -> std::io::Result<Exit>;
    /// Kills the command and everything it started. Dropping the process
    /// without [`Process::disarm`] does the same.
    async fn kill(&mut self);
    /// The shell exited on its own: leave what it started in the
    /// background alone.
    fn disarm(&mut self);
    /// The pid of the process on this host that leads the command (the
    /// shell, or `bwrap`), for showing; `None` where there is none here
    /// (a container, another machine) or it has been reaped.
    fn pid(&self) -> Option<u32> {
        None
    }
}

/// Somewhere commands run.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug {
    /// Which kind of backend this is.
    fn kind(&self) -> BackendKind;

    /// The directory commands and file tools are confined to; `None` for a
    /// backend that reaches the whole host ([`local`]) or another machine
    /// ([`ssh`]).
    fn workspace(&self) -> Option<&Workspace>;

    /// Whether commands are kept from the host: the dangerous-command
    /// prompt is then skipped (the hardline list still applies).
    fn isolated(&self) -> bool {
        self.kind().is_isolated()
    }

    /// Starts `spec`.
    async fn spawn(&self, spec: CommandSpec) -> Result<Running, ExecError>;

    /// Frees what the backend keeps for its conversation (a warm
    /// container): the conversation was reset or went idle.
    async fn release(&self) {}

    /// One line for `/status` and `gateway status`.
    fn describe(&self) -> String {
        match self.workspace() {
            Some(w) => format!("{} (workspace {})", self.kind(), w.host().display()),
            None => self.kind().to_string(),
        }
    }
}

/// The exit status of a host process as an [`Exit`].
pub fn exit_of(status: std::process::ExitStatus) -> Exit {
    Exit {
        code: status.code(),
        signal: std::os::unix::process::ExitStatusExt::signal(&status),
    }
}

/// Finds `program` on `PATH` (as the child would: only executable files).
pub fn find_program(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let p = Path::new(program);
        return is_executable(p).then(|| p.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
