//! Commands on another machine through the system `ssh` (OpenSSH).
//!
//! Each command is one `ssh -T` connection, started in a process group of
//! its own on the host (as [`local`](crate::local) starts its shells), so a
//! kill takes the local `ssh` with everything.
//!
//! The connection:
//! - `BatchMode=yes` (never a password or passphrase prompt) and
//!   `StrictHostKeyChecking=yes` always: an unknown or changed host key is
//!   refused, never learned; the known-hosts file is only read;
//! - `-F /dev/null`: neither the user's `~/.ssh/config` nor the system's
//!   `ssh_config` is read, so everything about the connection comes from
//!   `terminal.ssh` and nothing there can add `SendEnv`, agent forwarding,
//!   a `ProxyCommand` or a `RemoteCommand` behind the configuration's back.
//!   Host aliases and `ProxyJump` from a user's config therefore do not
//!   apply: name the real host, port, user and key in `terminal.ssh`;
//! - the local `ssh` gets the command's allowlisted environment and no
//!   `SendEnv`, so none of it reaches the remote side by itself. The remote
//!   command exports on purpose only [`NON_INTERACTIVE`] and the locale
//!   (`LANG`, `LANGUAGE`, `LC_*`, as Debian's own client sends them).
//!   Variables passed through with `terminal.env_passthrough` stay on this
//!   machine: they are this machine's credentials, not the remote's;
//! - `ssh`'s own messages go to a log file (`-E`), not into the output, so
//!   a refused host key or key is told apart from the command's stderr.
//!
//! On the remote side the login shell (which must understand POSIX `sh`
//! quoting) runs `sh` with a small wrapper that prints a ready line (the
//! backend swallows it: it proves the connection and the login worked),
//! creates and enters `terminal.ssh.workdir`, then starts `sh -c <command>`
//! in the background and waits for it. Without a terminal, `sshd` never
//! signals a command whose connection went away, so the wrapper also reads
//! its stdin, which is a pipe from this process held open for the
//! command's life: its end (a kill here, a dropped connection) makes the
//! wrapper kill its whole process group, which `sshd` made for the session
//! and which holds everything the command started. A command that exits on
//! its own keeps what it left in the background, as on the host. The exit
//! code is the command's; one killed by a signal on the remote side shows
//! as 128 + the signal, as a shell reports it; 255 is `ssh` failing.
//!
//! Asked for a terminal ([`CommandSpec::pty`]), the connection is `ssh
//! -tt`: the remote command runs on a terminal sshd makes, our pipe is its
//! keyboard ([`Running::input`]), and the connection's end hangs that
//! terminal up, which ends the command's session. A plain stdin is
//! refused: the pipe is the stop signal above.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use talaria_core::config::SshConfig;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

use crate::env::NON_INTERACTIVE;
use crate::local::spawn_grouped_with_stdin;
use crate::{Backend, BackendKind, CommandSpec, ExecError, Exit, Process, Running, Workspace};

/// The line the remote wrapper prints before anything else: once it is
/// read, the connection, the host key and the login are known to be good.
const READY: &[u8] = b"talaria-ssh-ready\n";

/// The ready line as a remote terminal shows it: its line end becomes
/// CR LF.
const READY_ON_A_TERMINAL: &[u8] = b"talaria-ssh-ready\r\n";

/// How much the remote login may print before the ready line (a noisy
/// `.bashrc`) before it is taken as a failure.
const BEFORE_READY_MAX: usize = 64 * 1024;

/// How much of `ssh`'s log is read into an error.
const LOG_MAX: u64 = 16 * 1024;

/// The SSH backend.
#[derive(Debug, Clone)]
pub struct Ssh {
    config: SshConfig,
    host: String,
    program: PathBuf,
}

impl Ssh {
    /// The backend `config` describes; refused when it names no host, a
    /// key file that is not there, or when `ssh` is not installed.
    pub fn new(config: &SshConfig) -> Result<Ssh, ExecError> {
        let host = config.host.as_deref().map(str::trim).unwrap_or_default();
        if host.is_empty() {
            return Err(ExecError::Unavailable(
                "terminal.ssh.host is not set; name the machine commands should run on \
                 (and its port, user and key) under terminal.ssh in config.yaml"
                    .to_owned(),
            ));
        }
        // ssh would read a leading '-' as an option; a space or control
        // character is never part of a host name.
        if host.starts_with('-') || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ExecError::Unavailable(format!(
                "terminal.ssh.host {host:?} is not a host name or address"
            )));
        }
        if let Some(user) = &config.user
            && (user.is_empty() || user.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return Err(ExecError::Unavailable(format!(
                "terminal.ssh.user {user:?} is not a user name"
            )));
        }
        if let Some(key) = &config.identity_file
            && !key.is_file()
        {
            return Err(ExecError::Unavailable(format!(
                "terminal.ssh.identity_file {} is not a readable file; point it at the private key \
                 the remote host accepts (ssh-keygen makes one)",
                key.display()
            )));
        }
        if let Some(known) = &config.known_hosts
            && !known.is_file()
        {
            return Err(ExecError::Unavailable(format!(
                "terminal.ssh.known_hosts {} does not exist; create it with the host's key \
                 (ssh-keyscan -p {} {host} >> {}, after checking the key out of band)",
                known.display(),
                config.port,
                known.display()
            )));
        }
        let program = crate::find_program("ssh").ok_or_else(|| {
            ExecError::Unavailable(
                "the OpenSSH client (ssh) is not installed or not on PATH; install it \
                 (Debian: apt install openssh-client)"
                    .to_owned(),
            )
        })?;
        Ok(Ssh {
            config: config.clone(),
            host: host.to_owned(),
            program,
        })
    }

    /// The known-hosts file host keys are checked against, for messages.
    fn known_hosts_name(&self) -> String {
        match &self.config.known_hosts {
            Some(p) => p.display().to_string(),
            None => "~/.ssh/known_hosts".to_owned(),
        }
    }

    /// `ssh`'s arguments up to the host, with `log` for its messages.
    fn args(&self, log: &Path, terminal: bool) -> Vec<std::ffi::OsString> {
        let c = &self.config;
        let mut a: Vec<std::ffi::OsString> = Vec::new();
        let mut opt = |o: String| {
            a.push("-o".into());
            a.push(o.into());
        };
        opt("BatchMode=yes".to_owned());
        opt("StrictHostKeyChecking=yes".to_owned());
        // The known-hosts file is the owner's record; ssh must not rewrite
        // it behind their back.
        opt("UpdateHostKeys=no".to_owned());
        opt(format!("ConnectTimeout={}", c.connect_timeout_secs.max(1)));
        opt("ServerAliveInterval=15".to_owned());
        if let Some(known) = &c.known_hosts {
            opt(format!("UserKnownHostsFile={}", ssh_config_path(known)));
            opt("GlobalKnownHostsFile=/dev/null".to_owned());
        }
        if let Some(key) = &c.identity_file {
            opt(format!("IdentityFile={}", ssh_config_path(key)));
            opt("IdentitiesOnly=yes".to_owned());
        }
        let mut push = |items: &[&str]| a.extend(items.iter().map(std::ffi::OsString::from));
        // -tt: a terminal on the remote side even though our stdin is a
        // pipe.
        push(&[if terminal { "-tt" } else { "-T" }, "-F", "/dev/null", "-p"]);
        a.push(c.port.to_string().into());
        if let Some(user) = &c.user {
            a.push("-l".into());
            a.push(user.into());
        }
        a.push("-E".into());
        a.push(log.into());
        // After `--` ssh reads no more options: the host and the command
        // can't be taken for one.
        a.push("--".into());
        a.push(self.host.clone().into());
        a
    }

    /// What the remote login shell runs for `spec`.
    fn remote_command(&self, spec: &CommandSpec) -> Result<String, ExecError> {
        // stderr joins stdout on the remote side: over the connection they
        // are two streams whose order is lost, and the output promises the
        // order the command wrote in.
        let mut script = String::from("exec 2>&1\n");
        script.push_str(&format!(
            "printf '%s' {}\n",
            quote(&String::from_utf8_lossy(READY))
        ));
        if let Some(dir) = remote_workdir(&self.config.workdir) {
            let dir = quote(dir);
            script.push_str(&format!("mkdir -p -- {dir} && cd -- {dir} || exit 1\n"));
        }
        if let Some(dir) = &spec.workdir {
            let dir = dir.to_str().ok_or_else(|| {
                ExecError::Io(format!(
                    "cannot run in {}: a remote directory must be valid UTF-8",
                    dir.display()
                ))
            })?;
            script.push_str(&format!("cd -- {} || exit 1\n", quote(dir)));
        }
        let mut exports: Vec<String> = NON_INTERACTIVE
            .iter()
            .map(|(k, v)| format!("{k}={}", quote(v)))
            .collect();
        exports.extend(
            spec.env
                .iter()
                .filter(|(k, _)| is_locale(k) && is_name(k))
                .map(|(k, v)| format!("{k}={}", quote(v))),
        );
        script.push_str(&format!("export {}\n", exports.join(" ")));
        if spec.pty {
            // On a terminal the connection's end hangs the terminal up,
            // which ends the command's session: no watcher is needed, and
            // stdin is the terminal's keyboard.
            script.push_str("exec sh -c \"$1\"\n");
            return Ok(format!(
                "exec sh -c {} talaria-ssh {}",
                quote(&script),
                quote(&spec.command)
            ));
        }
        // fd 3 keeps the connection's stdin for the watcher: a background
        // job's own stdin is /dev/null. The command gets neither.
        script.push_str(concat!(
            "exec 3<&0\n",
            "sh -c \"$1\" </dev/null 3<&- &\n",
            "cmd=$!\n",
            "{ while read -r _ <&3; do :; done; kill -s KILL 0; } </dev/null >/dev/null 2>&1 &\n",
            "watcher=$!\n",
            "exec 3<&-\n",
            "wait \"$cmd\"\n",
            "status=$?\n",
            "kill \"$watcher\" 2>/dev/null\n",
            "exit \"$status\"\n",
        ));
        Ok(format!(
            "exec sh -c {} talaria-ssh {}",
            quote(&script),
            quote(&spec.command)
        ))
    }

    /// Turns a connection that ended before the ready line into the error
    /// that says what to do.
    fn refusal(&self, exit: Option<Exit>, log: &str, early: &[u8]) -> ExecError {
        let target = format!("{}:{}", self.host, self.config.port);
        let log = log.trim();
        let known = self.known_hosts_name();
        if exit.is_some_and(|e| e.code == Some(255)) {
            if log.contains("REMOTE HOST IDENTIFICATION HAS CHANGED")
                || log.contains("Host key for") && log.contains("has changed")
            {
                return ExecError::Unavailable(format!(
                    "ssh refused {target}: its host key does not match the one in {known}. \
                     If the host was really reinstalled, check the new key out of band, \
                     remove the old line (ssh-keygen -R '[{}]:{}' -f {known}) and add the \
                     new key; otherwise someone may be in the middle. ssh said: {log}",
                    self.host, self.config.port
                ));
            }
            if log.contains("Host key verification failed")
                || log.contains("No ") && log.contains("host key is known")
            {
                return ExecError::Unavailable(format!(
                    "ssh refused {target}: its host key is not in {known}. Add it after \
                     checking its fingerprint out of band (ssh-keyscan -p {} {} >> {known}). \
                     ssh said: {log}",
                    self.config.port, self.host
                ));
            }
            if log.contains("Permission denied") {
                let key = match &self.config.identity_file {
                    Some(k) => format!("the key {}", k.display()),
                    None => "the default keys of ~/.ssh (terminal.ssh.identity_file is not set)"
                        .to_owned(),
                };
                return ExecError::Unavailable(format!(
                    "{target} did not accept {key} for user {}; add its public key to the \
                     remote ~/.ssh/authorized_keys, or set terminal.ssh.identity_file and \
                     terminal.ssh.user. ssh said: {log}",
                    self.config.user.as_deref().unwrap_or("(ssh's default)")
                ));
            }
            return ExecError::Unavailable(format!(
                "cannot reach {target} over ssh (check terminal.ssh.host and port, and that \
                 sshd runs there): {log}"
            ));
        }
        let early = String::from_utf8_lossy(early);
        ExecError::Io(format!(
            "the remote shell on {target} did not start the command (its login shell must \
             run POSIX sh commands; exit {exit:?}): {} {log}",
            early.trim()
        ))
    }

    /// Reads `output` until the ready line: `Ok` with what came after it
    /// (the command's first output), `Err` with what came instead when the
    /// output ended first or the login printed too much before it.
    async fn await_ready(
        output: &mut (dyn AsyncRead + Send + Unpin),
        ready: &[u8],
    ) -> std::io::Result<Result<Vec<u8>, Vec<u8>>> {
        let mut seen: Vec<u8> = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = output.read(&mut buf).await?;
            if n == 0 {
                return Ok(Err(seen));
            }
            seen.extend_from_slice(&buf[..n]);
            if let Some(at) = find(&seen, ready) {
                return Ok(Ok(seen.split_off(at + ready.len())));
            }
            if seen.len() > BEFORE_READY_MAX {
                return Ok(Err(seen));
            }
        }
    }
}

#[async_trait]
impl Backend for Ssh {
    fn kind(&self) -> BackendKind {
        BackendKind::Ssh
    }

    fn workspace(&self) -> Option<&Workspace> {
        None
    }

    fn describe(&self) -> String {
        let user = self
            .config
            .user
            .as_deref()
            .map(|u| format!("{u}@"))
            .unwrap_or_default();
        format!(
            "ssh ({user}{}:{}, workdir {})",
            self.host, self.config.port, self.config.workdir
        )
    }

    async fn spawn(&self, spec: CommandSpec) -> Result<Running, ExecError> {
        if spec.stdin && !spec.pty {
            // Without a terminal the connection's stdin is the remote
            // side's order to stop (see the module documentation): it
            // cannot also be the command's.
            return Err(ExecError::Unavailable(
                "the ssh backend cannot give a command a plain stdin: run it with pty=true to \
                 type into it, or give it its input in a file or its arguments"
                    .to_owned(),
            ));
        }
        let log = tempfile::Builder::new()
            .prefix("talaria-ssh-")
            .suffix(".log")
            .tempfile()
            .map_err(|e| ExecError::io("create ssh's log file", e))?;
        let remote = self.remote_command(&spec)?;
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(self.args(log.path(), spec.pty)).arg(remote);
        // ssh runs here; any existing directory does, and the temp dir's
        // is one.
        let here = log
            .path()
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(std::env::temp_dir);
        let (mut running, stdin) = spawn_grouped_with_stdin(cmd, &here, &spec.env, "ssh")?;
        let limit = Duration::from_secs(self.config.connect_timeout_secs.max(1).saturating_mul(3));
        let marker = if spec.pty { READY_ON_A_TERMINAL } else { READY };
        let ready =
            tokio::time::timeout(limit, Self::await_ready(running.output.as_mut(), marker)).await;
        match ready {
            Ok(Ok(Ok(rest))) => {
                let output = std::io::Cursor::new(rest).chain(running.output);
                // On a terminal, the pipe is the keyboard; a kill ends the
                // connection, which hangs the remote terminal up.
                let (input, stdin): (Option<Box<dyn AsyncWrite + Send + Unpin>>, _) = if spec.pty {
                    (Some(Box::new(stdin)), None)
                } else {
                    (None, Some(stdin))
                };
                Ok(Running {
                    output: Box::new(output),
                    input,
                    process: Box::new(SshProcess {
                        inner: running.process,
                        stdin,
                        log,
                    }),
                })
            }
            Ok(Ok(Err(early))) => {
                drop(stdin);
                let exit =
                    match tokio::time::timeout(Duration::from_secs(10), running.process.wait())
                        .await
                    {
                        Ok(Ok(exit)) => Some(exit),
                        _ => None,
                    };
                // A reaped ssh's group id may be reused: only kill one that
                // has not been seen to end.
                if exit.is_some() {
                    running.process.disarm();
                } else {
                    running.process.kill().await;
                }
                Err(self.refusal(exit, &read_log(log.path()), &early))
            }
            Ok(Err(e)) => {
                running.process.kill().await;
                Err(ExecError::io("read ssh's output", e))
            }
            Err(_) => {
                running.process.kill().await;
                Err(ExecError::Unavailable(format!(
                    "{}:{} did not start the command within {}s over ssh: {}",
                    self.host,
                    self.config.port,
                    limit.as_secs(),
                    read_log(log.path()).trim()
                )))
            }
        }
    }
}

/// A command on the remote host: the local `ssh` and the pipe whose end
/// stops the remote side.
struct SshProcess {
    inner: Box<dyn Process>,
    /// Closed on kill: the remote wrapper kills its group on EOF.
    stdin: Option<tokio::process::ChildStdin>,
    /// ssh's own messages; removed when the process is dropped.
    log: tempfile::NamedTempFile,
}

#[async_trait]
impl Process for SshProcess {
    async fn wait(&mut self) -> std::io::Result<Exit> {
        let exit = self.inner.wait().await?;
        if exit.code == Some(255) {
            tracing::warn!(log = %read_log(self.log.path()).trim(), "ssh ended with 255: the connection failed or broke");
        }
        Ok(exit)
    }

    async fn kill(&mut self) {
        // EOF first, so the remote side stops even if the connection
        // outlives the local ssh for a moment; then the local group.
        self.stdin = None;
        self.inner.kill().await;
    }

    fn disarm(&mut self) {
        self.inner.disarm();
    }
}

/// `s` as one word for a POSIX shell: in single quotes, where nothing is
/// special, each `'` written as `'\''` (close, escaped quote, reopen).
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// The directory to create and enter, as the remote shell should see it:
/// relative ones are under the login directory (the home); `None` is the
/// home itself.
fn remote_workdir(workdir: &str) -> Option<&str> {
    let dir = workdir.trim();
    let dir = match dir.strip_prefix('~') {
        Some("") => return None,
        Some(rest) => rest.strip_prefix('/').unwrap_or(dir),
        None => dir,
    };
    (!dir.is_empty()).then_some(dir)
}

/// A path as an `ssh -o` value: ssh splits option values on whitespace
/// unless quoted, and double quotes are its quoting.
fn ssh_config_path(p: &Path) -> String {
    format!("\"{}\"", p.display())
}

fn is_locale(name: &str) -> bool {
    name == "LANG" || name == "LANGUAGE" || name.starts_with("LC_")
}

/// A shell variable name: only these can be exported safely.
fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The start of ssh's log, for an error message.
fn read_log(path: &Path) -> String {
    use std::io::Read;
    let mut out = Vec::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(LOG_MAX).read_to_end(&mut out);
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn through_sh(quoted: &str) -> String {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("printf '%s' {quoted}"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn awkward_strings_round_trip_through_sh() {
        for s in [
            "",
            "'",
            "''",
            "it's",
            "a\nb",
            "$HOME `id` $(id) \\ \" * ? [a] ~ # ; & | < > ( ) { } !",
            "'\\''",
            "-n",
        ] {
            assert_eq!(through_sh(&quote(s)), s);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn any_string_round_trips_through_sh(s in "[^\u{0}]*") {
            prop_assert_eq!(through_sh(&quote(&s)), s);
        }

        #[test]
        fn quoting_twice_round_trips_through_two_shells(s in "[^\u{0}]{0,40}") {
            // What the backend does: a quoted word inside a quoted script.
            let inner = format!("printf '%s' {}", quote(&s));
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("sh -c {}", quote(&inner)))
                .output()
                .unwrap();
            prop_assert_eq!(String::from_utf8(out.stdout).unwrap(), s);
        }
    }

    #[test]
    fn the_workdir_is_under_the_home_unless_absolute() {
        assert_eq!(
            remote_workdir("talaria-workspace"),
            Some("talaria-workspace")
        );
        assert_eq!(remote_workdir("~/w"), Some("w"));
        assert_eq!(remote_workdir("~"), None);
        assert_eq!(remote_workdir(""), None);
        assert_eq!(remote_workdir("/srv/w"), Some("/srv/w"));
    }

    #[test]
    fn a_config_without_a_host_is_refused() {
        let err = Ssh::new(&SshConfig::default()).unwrap_err().to_string();
        assert!(err.contains("terminal.ssh.host is not set"), "{err}");
        let err = Ssh::new(&SshConfig {
            host: Some("-oProxyCommand=x".into()),
            ..SshConfig::default()
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("is not a host name"), "{err}");
    }
}
