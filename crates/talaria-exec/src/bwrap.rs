//! The bubblewrap sandbox: commands on the host, kept from the host.
//!
//! Each command gets a fresh set of namespaces from `bwrap`:
//! - the system directories (`/usr` and its `/bin`, `/lib` links) and a
//!   short list of harmless `/etc` files, read-only; nothing else of the
//!   host's filesystem, so Talaria's home (`.env`, `state.db`,
//!   `config.yaml`) and the user's home are not there at all;
//! - the conversation's [`Workspace`], writable, at `/workspace`, which is
//!   also `HOME`; a private `/tmp`, `/proc` and `/dev`;
//! - its own PID, IPC, UTS, cgroup and network namespaces (only a loopback
//!   of its own unless `terminal.sandbox.network`), a new session (no
//!   terminal to push keystrokes into), no capabilities;
//! - rlimits (CPU seconds, file size, address space, processes) set by
//!   `prlimit` before the command starts;
//! - `--die-with-parent`: if the gateway dies, so does the sandbox.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use talaria_core::config::SandboxConfig;

use crate::local::{spawn_grouped, spawn_grouped_input, spawn_grouped_reading, spawn_pty};
use crate::workspace::INNER_ROOT;
use crate::{Backend, BackendKind, CommandSpec, ExecError, Running, Workspace};

/// Files and directories of `/etc` a command may read: name lookup, TLS
/// roots, time zone, the dynamic linker's cache and Debian's alternatives
/// (where `/usr/bin/python3`-style links point). Not `/etc/shadow`, not
/// anything a service keeps credentials in.
const ETC: &[&str] = &[
    "/etc/alternatives",
    "/etc/ca-certificates",
    "/etc/ca-certificates.conf",
    "/etc/group",
    "/etc/host.conf",
    "/etc/hosts",
    "/etc/inputrc",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/mime.types",
    "/etc/nsswitch.conf",
    "/etc/os-release",
    "/etc/passwd",
    "/etc/protocols",
    "/etc/resolv.conf",
    "/etc/services",
    "/etc/ssl",
    "/etc/timezone",
];

/// Top-level system directories; on merged-/usr systems most are links
/// into `/usr`, and are recreated as links.
const SYSTEM: &[&str] = &[
    "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr",
];

/// The sandbox of one workspace.
#[derive(Debug, Clone)]
pub struct Sandbox {
    config: SandboxConfig,
    workspace: Workspace,
    program: PathBuf,
    /// The seccomp filter's file (see [`crate::seccomp`]), when on.
    seccomp: Option<PathBuf>,
}

impl Sandbox {
    /// A sandbox over `workspace`, run by `program` (the `bwrap` found on
    /// `PATH`, see [`Sandbox::find`]).
    pub fn new(config: SandboxConfig, workspace: Workspace, program: PathBuf) -> Sandbox {
        Sandbox {
            config,
            workspace,
            program,
            seccomp: None,
        }
    }

    /// Installs the seccomp filter in `file` (the program
    /// [`crate::seccomp::program`] makes) before each command.
    pub fn with_seccomp(mut self, file: Option<PathBuf>) -> Sandbox {
        self.seccomp = file;
        self
    }

    /// The seccomp filter's file opened for bubblewrap to read as its
    /// stdin, when the filter is on.
    fn seccomp_input(&self) -> Result<Option<std::fs::File>, ExecError> {
        match &self.seccomp {
            Some(path) => std::fs::File::open(path).map(Some).map_err(|e| {
                ExecError::io(&format!("open the seccomp filter {}", path.display()), e)
            }),
            None => Ok(None),
        }
    }

    /// The `bwrap` on `PATH`, or why there is none.
    pub fn find() -> Result<PathBuf, ExecError> {
        crate::find_program("bwrap").ok_or_else(|| {
            ExecError::Unavailable(
                "bubblewrap (bwrap) is not installed or not on PATH; install it (Debian: apt \
                 install bubblewrap)"
                    .to_owned(),
            )
        })
    }

    /// Runs `true` in a sandbox like the real ones: whether this machine
    /// lets bubblewrap make its namespaces (a container without user
    /// namespaces does not).
    pub async fn probe(&self) -> Result<(), ExecError> {
        let stdin = match self.seccomp_input()? {
            Some(file) => std::process::Stdio::from(file),
            None => std::process::Stdio::null(),
        };
        let out = tokio::process::Command::new(&self.program)
            .args(self.args(Path::new(INNER_ROOT)))
            .arg("true")
            .env_clear()
            .stdin(stdin)
            .output()
            .await
            .map_err(|e| ExecError::Unavailable(format!("cannot start bwrap: {e}")))?;
        if out.status.success() {
            return Ok(());
        }
        let err = String::from_utf8_lossy(&out.stderr);
        Err(ExecError::Unavailable(format!(
            "bubblewrap cannot make a sandbox here: {}",
            err.trim()
        )))
    }

    /// `bwrap`'s arguments up to the command (which follows them).
    pub fn args(&self, inner_workdir: &Path) -> Vec<OsString> {
        self.args_reading_filter_from(inner_workdir, "0")
    }

    /// [`Sandbox::args`] with the seccomp filter read from descriptor `fd`
    /// (when the filter is on).
    fn args_reading_filter_from(&self, inner_workdir: &Path, fd: &str) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |items: &[&str]| a.extend(items.iter().map(OsString::from));
        push(&[
            "--die-with-parent",
            "--new-session",
            "--unshare-all",
            "--cap-drop",
            "ALL",
            "--hostname",
            "talaria-sandbox",
        ]);
        if self.config.network {
            push(&["--share-net"]);
        }
        for dir in SYSTEM {
            let path = Path::new(dir);
            match std::fs::read_link(path) {
                Ok(target) => {
                    a.push("--symlink".into());
                    a.push(target.into_os_string());
                    a.push(path.into());
                }
                Err(_) if path.is_dir() => {
                    a.extend(["--ro-bind".into(), path.into(), path.into()]);
                }
                Err(_) => {}
            }
        }
        for file in ETC.iter().map(Path::new).filter(|p| p.exists()) {
            a.extend(["--ro-bind".into(), file.into(), file.into()]);
        }
        for extra in &self.config.read_only_paths {
            if extra.exists() {
                a.extend(["--ro-bind".into(), extra.into(), extra.into()]);
            } else {
                tracing::warn!(path = %extra.display(), "terminal.sandbox.read_only_paths names a path that does not exist; left out");
            }
        }
        a.extend([
            "--proc".into(),
            "/proc".into(),
            "--dev".into(),
            "/dev".into(),
            "--tmpfs".into(),
            "/tmp".into(),
            "--bind".into(),
            self.workspace.host().into(),
            INNER_ROOT.into(),
            "--chdir".into(),
            inner_workdir.into(),
        ]);
        if self.seccomp.is_some() {
            // Read from stdin, which the command then finds at its end,
            // or from the descriptor a wrapper opened (see `spawn`).
            a.extend(["--seccomp".into(), fd.into()]);
        }
        a.push("--".into());
        a.extend(self.limits());
        a
    }

    /// `prlimit` and its options, when any limit is set.
    fn limits(&self) -> Vec<OsString> {
        let c = &self.config;
        let mib = |n: u64| n.saturating_mul(1024 * 1024);
        let mut opts: Vec<String> = Vec::new();
        if c.cpu_secs > 0 {
            opts.push(format!("--cpu={}", c.cpu_secs));
        }
        if c.file_size_mb > 0 {
            opts.push(format!("--fsize={}", mib(c.file_size_mb)));
        }
        if c.memory_mb > 0 {
            opts.push(format!("--as={}", mib(c.memory_mb)));
        }
        if c.processes > 0 {
            opts.push(format!("--nproc={}", c.processes));
        }
        if opts.is_empty() {
            return Vec::new();
        }
        let mut out = vec![OsString::from("prlimit")];
        out.extend(opts.into_iter().map(OsString::from));
        out.push("--".into());
        out
    }
}

#[async_trait]
impl Backend for Sandbox {
    fn kind(&self) -> BackendKind {
        BackendKind::Sandbox
    }

    fn workspace(&self) -> Option<&Workspace> {
        Some(&self.workspace)
    }

    async fn spawn(&self, spec: CommandSpec) -> Result<Running, ExecError> {
        let inner = spec
            .workdir
            .clone()
            .unwrap_or_else(|| PathBuf::from(INNER_ROOT));
        let env = crate::env::for_isolated(&spec.env, INNER_ROOT);
        let here = self.workspace.host();
        if spec.stdin || spec.pty {
            return self.spawn_interactive(&spec, &inner, &env);
        }
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(self.args(&inner))
            .arg("sh")
            .arg("-c")
            .arg(&spec.command);
        // bwrap runs on the host; give it a directory that surely exists
        // there (the command's own is set with --chdir).
        match self.seccomp_input()? {
            Some(filter) => spawn_grouped_reading(cmd, here, &env, "bwrap", filter),
            None => spawn_grouped(cmd, here, &env, "bwrap"),
        }
    }
}

impl Sandbox {
    /// Starts a command whose stdin is ours (a pipe or a terminal). The
    /// seccomp filter can then not come in on stdin: a host `sh` opens it
    /// as descriptor 3 and execs bubblewrap, which reads it from there.
    fn spawn_interactive(
        &self,
        spec: &CommandSpec,
        inner: &Path,
        env: &[(String, String)],
    ) -> Result<Running, ExecError> {
        let mut argv: Vec<OsString> = Vec::new();
        let program: OsString = match &self.seccomp {
            Some(filter) => {
                let sh = crate::find_program("sh").ok_or_else(|| {
                    ExecError::Unavailable("cannot start the sandbox: no sh on PATH".to_owned())
                })?;
                argv.extend([
                    "-c".into(),
                    "f=$1; shift; exec \"$@\" 3<\"$f\"".into(),
                    "sh".into(),
                    filter.into(),
                    self.program.clone().into(),
                ]);
                argv.extend(self.args_reading_filter_from(inner, "3"));
                sh.into()
            }
            None => {
                argv.extend(self.args(inner));
                self.program.clone().into()
            }
        };
        argv.extend(["sh".into(), "-c".into(), spec.command.clone().into()]);
        let here = self.workspace.host();
        if spec.pty {
            return spawn_pty(&program, &argv, here, env, "bwrap");
        }
        let mut cmd = tokio::process::Command::new(&program);
        cmd.args(&argv);
        spawn_grouped_input(cmd, here, env, "bwrap")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_home_is_not_mounted_and_limits_come_first() {
        let root = tempfile::tempdir().unwrap();
        let ws = Workspace::open(root.path(), "s").unwrap();
        let sb = Sandbox::new(SandboxConfig::default(), ws.clone(), PathBuf::from("bwrap"));
        let args: Vec<String> = sb
            .args(Path::new("/workspace"))
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let joined = args.join(" ");
        assert!(joined.contains("--unshare-all"), "{joined}");
        assert!(!joined.contains("--share-net"), "{joined}");
        assert!(
            !args
                .iter()
                .any(|a| a == "/etc" || a == "/root" || a == "/home")
        );
        assert!(!joined.contains("/etc/shadow"));
        assert!(joined.contains(&format!("--bind {} /workspace", ws.host().display())));
        assert!(joined.ends_with("-- prlimit --cpu=600 --fsize=1073741824 --as=4294967296 --"));
    }
}
