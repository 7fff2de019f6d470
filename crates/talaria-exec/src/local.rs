//! Commands on the host, as the gateway's user: the owner's own work.
//!
//! The command runs as `sh -c` in a process group of its own, so a timeout
//! or an interrupted turn kills everything it started, not just the shell.
//! Its stdout and stderr are one pipe, so the output keeps the order it was
//! written in.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use async_trait::async_trait;

use crate::process_group::GroupKiller;
use crate::{Backend, BackendKind, CommandSpec, ExecError, Exit, Process, Running, Workspace};

/// The host backend.
#[derive(Debug, Clone)]
pub struct Local {
    /// Where a command without a directory of its own runs.
    workdir: PathBuf,
}

impl Local {
    /// Commands run in `workdir` unless they name another directory.
    pub fn new(workdir: impl Into<PathBuf>) -> Local {
        Local {
            workdir: workdir.into(),
        }
    }
}

#[async_trait]
impl Backend for Local {
    fn kind(&self) -> BackendKind {
        BackendKind::Local
    }

    fn workspace(&self) -> Option<&Workspace> {
        None
    }

    async fn spawn(&self, spec: CommandSpec) -> Result<Running, ExecError> {
        let dir = spec.workdir.clone().unwrap_or_else(|| self.workdir.clone());
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c").arg(&spec.command);
        spawn_grouped(cmd, &dir, &spec.env, "sh")
    }
}

/// Starts `cmd` in `dir` with exactly `env`, in a process group of its
/// own, stdin closed and stdout and stderr on one pipe. `name` is what the
/// error calls the program.
pub(crate) fn spawn_grouped(
    cmd: tokio::process::Command,
    dir: &Path,
    env: &[(String, String)],
    name: &str,
) -> Result<Running, ExecError> {
    spawn_grouped_stdin(cmd, dir, env, name, Stdin::Closed).map(|(running, _)| running)
}

/// [`spawn_grouped`] with `file` as stdin: bubblewrap reads the sandbox's
/// seccomp filter from it (`--seccomp 0`).
pub(crate) fn spawn_grouped_reading(
    cmd: tokio::process::Command,
    dir: &Path,
    env: &[(String, String)],
    name: &str,
    file: std::fs::File,
) -> Result<Running, ExecError> {
    spawn_grouped_stdin(cmd, dir, env, name, Stdin::File(file)).map(|(running, _)| running)
}

/// What a grouped command's stdin is.
enum Stdin {
    /// Closed: nobody is at the keyboard.
    Closed,
    /// A pipe from us.
    Piped,
    /// A file to read.
    File(std::fs::File),
}

/// [`spawn_grouped`] with stdin a pipe from us instead of closed: the
/// [`ssh`](crate::ssh) backend keeps it open for as long as the command
/// should live, and the remote side takes its EOF as the order to stop.
pub(crate) fn spawn_grouped_with_stdin(
    cmd: tokio::process::Command,
    dir: &Path,
    env: &[(String, String)],
    name: &str,
) -> Result<(Running, tokio::process::ChildStdin), ExecError> {
    let (running, stdin) = spawn_grouped_stdin(cmd, dir, env, name, Stdin::Piped)?;
    let stdin =
        stdin.ok_or_else(|| ExecError::Io(format!("cannot start {name}: no stdin pipe")))?;
    Ok((running, stdin))
}

fn spawn_grouped_stdin(
    mut cmd: tokio::process::Command,
    dir: &Path,
    env: &[(String, String)],
    name: &str,
    stdin: Stdin,
) -> Result<(Running, Option<tokio::process::ChildStdin>), ExecError> {
    let (tx, rx) = tokio::net::unix::pipe::pipe().map_err(|e| ExecError::io("create a pipe", e))?;
    let write_end = tx
        .into_blocking_fd()
        .map_err(|e| ExecError::io("create a pipe", e))?;
    let write_end2 = write_end
        .try_clone()
        .map_err(|e| ExecError::io("create a pipe", e))?;
    cmd.current_dir(dir)
        .stdin(match stdin {
            Stdin::Closed => Stdio::null(),
            Stdin::Piped => Stdio::piped(),
            Stdin::File(f) => Stdio::from(f),
        })
        .stdout(Stdio::from(write_end))
        .stderr(Stdio::from(write_end2))
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            ExecError::Unavailable(format!("cannot start {name}: it is not installed"))
        } else {
            ExecError::io(&format!("start {name}"), e)
        }
    })?;
    // The Command holds copies of the pipe's write end; EOF only comes once
    // every copy is closed.
    drop(cmd);
    let stdin = child.stdin.take();
    let killer = GroupKiller::new(child.id());
    let running = Running {
        output: Box::new(rx),
        process: Box::new(HostProcess { child, killer }),
    };
    Ok((running, stdin))
}

/// A process group on the host.
struct HostProcess {
    child: tokio::process::Child,
    killer: GroupKiller,
}

#[async_trait]
impl Process for HostProcess {
    async fn wait(&mut self) -> std::io::Result<Exit> {
        self.child.wait().await.map(crate::exit_of)
    }

    async fn kill(&mut self) {
        self.killer.kill();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), self.child.wait()).await;
    }

    fn disarm(&mut self) {
        self.killer.disarm();
    }
}
