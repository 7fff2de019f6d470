//! Commands on the host, as the gateway's user: the owner's own work.
//!
//! The command runs as `sh -c` in a process group of its own, so a timeout
//! or an interrupted turn kills everything it started, not just the shell.
//! Its stdout and stderr are one pipe, so the output keeps the order it was
//! written in. Asked for ([`CommandSpec::stdin`]), its stdin is a pipe from
//! us; asked for a terminal ([`CommandSpec::pty`]), it runs in a session of
//! its own with a pseudo-terminal as stdin, stdout and stderr.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::task::{Context, Poll};

use async_trait::async_trait;
use tokio::io::{AsyncRead, ReadBuf};

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
        if spec.pty {
            let args = [OsString::from("-c"), OsString::from(&spec.command)];
            return spawn_pty(OsStr::new("sh"), &args, &dir, &spec.env, "sh");
        }
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c").arg(&spec.command);
        if spec.stdin {
            spawn_grouped_input(cmd, &dir, &spec.env, "sh")
        } else {
            spawn_grouped(cmd, &dir, &spec.env, "sh")
        }
    }
}

/// [`spawn_grouped`] with stdin a pipe from us, handed out as
/// [`Running::input`]: a background command the agent may answer.
pub(crate) fn spawn_grouped_input(
    cmd: tokio::process::Command,
    dir: &Path,
    env: &[(String, String)],
    name: &str,
) -> Result<Running, ExecError> {
    let (mut running, stdin) = spawn_grouped_stdin(cmd, dir, env, name, Stdin::Piped)?;
    let stdin =
        stdin.ok_or_else(|| ExecError::Io(format!("cannot start {name}: no stdin pipe")))?;
    running.input = Some(Box::new(stdin));
    Ok(running)
}

/// Starts `program` with `args` in `dir` with exactly `env`, on a new
/// pseudo-terminal: the child leads a session of its own (so its process
/// group is killed as [`spawn_grouped`]'s is) whose controlling terminal
/// is that one. The output is what the terminal shows; the input is its
/// keyboard.
pub(crate) fn spawn_pty(
    program: &OsStr,
    args: &[OsString],
    dir: &Path,
    env: &[(String, String)],
    name: &str,
) -> Result<Running, ExecError> {
    let (pty, pts) = pty_process::open().map_err(|e| ExecError::io("open a pseudo-terminal", e))?;
    // A size is needed for full-screen programs; 24x80 is what a terminal
    // without one is taken to be.
    pty.resize(pty_process::Size::new(24, 80))
        .map_err(|e| ExecError::io("size the pseudo-terminal", e))?;
    let cmd = pty_process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .kill_on_drop(true);
    let child = cmd.spawn(pts).map_err(|e| match e {
        pty_process::Error::Io(e) if e.kind() == std::io::ErrorKind::NotFound => {
            ExecError::Unavailable(format!("cannot start {name}: it is not installed"))
        }
        e => ExecError::io(&format!("start {name} on a pseudo-terminal"), e),
    })?;
    let killer = GroupKiller::new(child.id());
    let (read, write) = pty.into_split();
    Ok(Running {
        output: Box::new(PtyOutput(read)),
        input: Some(Box::new(write)),
        process: Box::new(HostProcess { child, killer }),
    })
}

/// A terminal's output as a stream that ends: once nothing holds the
/// terminal's other side any more, Linux answers reads with EIO rather
/// than an end of file.
struct PtyOutput(pty_process::OwnedReadPty);

impl AsyncRead for PtyOutput {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match Pin::new(&mut self.0).poll_read(cx, buf) {
            Poll::Ready(Err(e)) if e.raw_os_error() == Some(libc::EIO) => Poll::Ready(Ok(())),
            other => other,
        }
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
        input: None,
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

    fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}
