//! Containers through the Docker Engine API (or Podman's compatible one),
//! over its Unix socket.
//!
//! Each conversation (a session or a chat, as `terminal.workspace_scope`
//! says) gets one container from `terminal.docker.image`, created on its
//! first command and kept warm between commands:
//! - its [`Workspace`] bind-mounted at `/workspace`, the working directory
//!   and `HOME`; a tmpfs at `/tmp`; nothing else of the host, so Talaria's
//!   home (`.env`, `state.db`, `config.yaml`) is not there at all;
//! - no network (`none`) unless `terminal.docker.network`;
//! - memory, CPU and process limits; every capability dropped and
//!   `no-new-privileges`;
//! - labels naming this home ([`LABEL_OWNER`]), the gateway process that
//!   made it and when that process started ([`LABEL_PID`],
//!   [`LABEL_STARTED`]), and the conversation ([`LABEL_SCOPE`]), so the next
//!   start of a gateway that was killed finds and removes what it left
//!   ([`Docker::sweep`]).
//!
//! A command is an exec of `sh -c` in that container with only the
//! allowlisted environment ([`crate::env::for_isolated`]), as the user who
//! owns the workspace (so the file tools can read what it wrote; under a
//! rootless daemon, the container's root, which is that user). Its stderr
//! is joined to its stdout inside the container, so the output keeps its
//! order. The output ends when the command's shell does (the daemon stops
//! collecting shortly after, even if a background job still holds it).
//! The image is never pulled: what runs is what the owner built or pulled.
//!
//! Asked for stdin ([`CommandSpec::stdin`]) or a terminal
//! ([`CommandSpec::pty`]), the exec attaches its stdin (and a terminal) and
//! hands the attached connection's write side out as [`Running::input`].
//!
//! A docker exec cannot be signalled through the Engine API: killing a
//! command restarts its conversation's container (see [`Process::kill`] on
//! the process [`Backend::spawn`] returns here).
//!
//! The container is removed when the conversation is reset
//! ([`Docker::release`]), when it has been idle for
//! `terminal.docker.idle_timeout_secs` ([`Docker::reap_idle`]) and, after a
//! crash, at the next start.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::container::LogOutput;
use bollard::errors::Error as ApiError;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
    RestartContainerOptionsBuilder,
};
use futures::{Stream, StreamExt};
use talaria_core::config::DockerConfig;
use tokio::io::AsyncWriteExt;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::workspace::INNER_ROOT;
use crate::{Backend, BackendKind, CommandSpec, ExecError, Exit, Process, Running, Workspace};

/// The label naming the home a container belongs to (the `owner` given to
/// [`Docker::connect`]).
pub const LABEL_OWNER: &str = "talaria.owner";
/// The label holding the pid of the gateway process that made a container.
pub const LABEL_PID: &str = "talaria.pid";
/// The label holding that process's start time (field 22 of
/// `/proc/<pid>/stat`), so a reused pid is not taken for the gateway.
pub const LABEL_STARTED: &str = "talaria.started";
/// The label naming the conversation a container serves.
pub const LABEL_SCOPE: &str = "talaria.scope";

/// The socket used when neither the configuration nor `DOCKER_HOST` names
/// one.
const DEFAULT_SOCKET: &str = "/var/run/docker.sock";

/// How long one API request may take to be answered (not how long a
/// command may run: an exec's output is a stream without this limit).
const REQUEST_TIMEOUT_SECS: u64 = 60;

/// The bytes of output held between the daemon and the reader; past that
/// the command waits for the reader, as it would on a pipe.
const PIPE_BYTES: usize = 64 * 1024;

/// What a container runs while it waits for commands. Not `sleep
/// infinity`, which busybox and older images lack; the shell's `wait` also
/// reaps the orphans of commands, so they don't pile up as zombies and eat
/// into the process limit.
const KEEP_ALIVE: &str = "trap 'exit 0' TERM; while :; do sleep 3600 & wait; done";

/// Runs the command given as `$1` with its stderr on its stdout, so the
/// output keeps the order it was written in (two attached streams would
/// be interleaved by the daemon as it happens to read them).
const MERGE_OUTPUT: &str = "exec sh -c \"$1\" 2>&1";

/// The Engine API client of one process and the containers it keeps.
pub struct Docker {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Docker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

/// What the client and every container backend of it share.
struct Inner {
    api: bollard::Docker,
    /// The socket's path, for messages.
    socket: String,
    config: DockerConfig,
    owner: String,
    me: Gateway,
    /// Whether the daemon runs rootless (its root is the gateway's user),
    /// learnt once from the daemon.
    rootless: tokio::sync::OnceCell<bool>,
    /// The live conversations' containers; an entry leaves on release and
    /// on idle removal, so this holds no more than the live scopes.
    scopes: StdMutex<HashMap<String, Arc<Scope>>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Docker")
            .field("socket", &self.socket)
            .field("image", &self.config.image)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

/// A gateway process as the labels name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Gateway {
    pid: u32,
    started: u64,
}

/// One conversation's container.
struct Scope {
    key: String,
    workspace: Workspace,
    /// The container's name: readable, and unique to this process.
    name: String,
    state: tokio::sync::Mutex<ScopeState>,
    last_used: StdMutex<Instant>,
    /// Commands started and not yet ended; a scope with any is not idle.
    running: AtomicUsize,
    /// A command was dropped while it ran: the container is to be
    /// restarted before anything else runs in it.
    kill_pending: AtomicBool,
}

#[derive(Default)]
struct ScopeState {
    /// The container, once created and started.
    id: Option<String>,
    /// Removed from the map: whoever still holds this scope looks it up
    /// again, so no container is made that nothing would remove.
    released: bool,
}

impl Scope {
    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
    }
}

impl Docker {
    /// A client for `config`'s socket (`terminal.docker.host`, else
    /// `DOCKER_HOST`, else `/var/run/docker.sock`). `owner` labels this
    /// home's containers. Nothing is sent yet: see [`Docker::ping`].
    pub fn connect(config: &DockerConfig, owner: &str) -> Result<Docker, ExecError> {
        let host = config
            .host
            .clone()
            .or_else(|| std::env::var("DOCKER_HOST").ok().filter(|h| !h.is_empty()))
            .unwrap_or_else(|| format!("unix://{DEFAULT_SOCKET}"));
        let socket = socket_path(&host)?;
        if !std::path::Path::new(&socket).exists() {
            return Err(ExecError::Unavailable(format!(
                "there is no Docker socket at {socket}: start Docker (Debian: apt install \
                 docker.io) or Podman's API service (systemctl start podman.socket), or set \
                 terminal.docker.host to the socket's path"
            )));
        }
        let api = bollard::Docker::connect_with_unix(
            &socket,
            REQUEST_TIMEOUT_SECS,
            bollard::API_DEFAULT_VERSION,
        )
        .map_err(|e| {
            ExecError::Unavailable(format!("cannot use the Docker socket {socket}: {e}"))
        })?;
        let me = Gateway {
            pid: std::process::id(),
            started: own_start_time()?,
        };
        Ok(Docker {
            inner: Arc::new(Inner {
                api,
                socket,
                config: config.clone(),
                owner: owner.to_owned(),
                me,
                rootless: tokio::sync::OnceCell::new(),
                scopes: StdMutex::new(HashMap::new()),
            }),
        })
    }

    /// Whether the daemon answers; also settles the API version to the
    /// daemon's when it is older than the client's.
    pub async fn ping(&self) -> Result<(), ExecError> {
        let inner = &self.inner;
        inner.api.ping().await.map_err(|e| {
            ExecError::Unavailable(format!(
                "the Docker daemon at {} does not answer ({e}); start it, or set \
                 terminal.docker.host to a socket that answers",
                inner.socket
            ))
        })?;
        // The client shares its version with its clones, so the one kept
        // in `inner` now speaks the daemon's version.
        inner.api.clone().negotiate_version().await.map_err(|e| {
            ExecError::Unavailable(format!(
                "cannot agree on an API version with the daemon at {}: {e}",
                inner.socket
            ))
        })?;
        inner.rootless().await?;
        Ok(())
    }

    /// The backend of `scope`, its container created and started if needed
    /// (so a missing image is reported now, as [`ExecError::Unavailable`]).
    pub async fn backend(
        &self,
        scope: &str,
        workspace: Workspace,
    ) -> Result<Arc<dyn Backend>, ExecError> {
        let inner = &self.inner;
        let held = inner.ensure(scope, &workspace).await?;
        held.touch();
        Ok(Arc::new(Container {
            inner: inner.clone(),
            key: scope.to_owned(),
            workspace,
        }))
    }

    /// Removes `scope`'s container (its workspace stays). The next command
    /// of the conversation starts a new one.
    pub async fn release(&self, scope: &str) {
        self.inner.release(scope).await;
    }

    /// Removes the containers of this home whose gateway process is gone
    /// (killed, crashed, or the machine restarted): those labelled with
    /// this owner and a pid that is not running, or that now belongs to a
    /// process started at another time. Containers of a gateway that is
    /// still running (this one, or another one on the same home) are kept.
    /// Returns how many were removed.
    pub async fn sweep(&self) -> Result<usize, ExecError> {
        let inner = &self.inner;
        let filter = HashMap::from([(
            "label".to_owned(),
            vec![format!("{LABEL_OWNER}={}", inner.owner)],
        )]);
        let listed = inner
            .api
            .list_containers(Some(
                ListContainersOptionsBuilder::new()
                    .all(true)
                    .filters(&filter)
                    .build(),
            ))
            .await
            .map_err(|e| inner.api_error("list containers", e))?;
        let mut removed = 0;
        for c in listed {
            let Some(id) = c.id else { continue };
            let labels = c.labels.unwrap_or_default();
            // Checked again rather than trusting the filter: a daemon that
            // loosened or ignored it must not get another home's
            // containers removed.
            if labels.get(LABEL_OWNER) != Some(&inner.owner) {
                continue;
            }
            let made_by = labels
                .get(LABEL_PID)
                .and_then(|p| p.parse().ok())
                .zip(labels.get(LABEL_STARTED).and_then(|s| s.parse().ok()))
                .map(|(pid, started)| Gateway { pid, started });
            if made_by.is_some_and(is_running) {
                continue;
            }
            match inner.remove(&id).await {
                Ok(()) => {
                    tracing::info!(container = %id, scope = labels.get(LABEL_SCOPE).map(String::as_str).unwrap_or(""), "removed a container left by a gateway that is gone");
                    removed += 1;
                }
                Err(e) => tracing::warn!(container = %id, "{e}"),
            }
        }
        Ok(removed)
    }

    /// Removes every container this process keeps: the process is ending
    /// (a terminal chat), and nothing would use them again.
    pub async fn release_all(&self) {
        let all: Vec<Arc<Scope>> = {
            let mut scopes = self.inner.scopes.lock().unwrap_or_else(|p| p.into_inner());
            scopes.drain().map(|(_, s)| s).collect()
        };
        for scope in all {
            self.inner.retire(&scope).await;
        }
    }

    /// Removes the containers of conversations that have run nothing for
    /// `terminal.docker.idle_timeout_secs` (0: never). A conversation with
    /// a command still running is not idle.
    pub async fn reap_idle(&self) {
        let timeout = Duration::from_secs(self.inner.config.idle_timeout_secs);
        if timeout.is_zero() {
            return;
        }
        let idle: Vec<Arc<Scope>> = {
            let mut scopes = self.inner.scopes.lock().unwrap_or_else(|p| p.into_inner());
            let keys: Vec<String> = scopes
                .iter()
                .filter(|(_, s)| s.running.load(Ordering::SeqCst) == 0 && s.idle_for() >= timeout)
                .map(|(k, _)| k.clone())
                .collect();
            keys.iter().filter_map(|k| scopes.remove(k)).collect()
        };
        for scope in idle {
            tracing::debug!(scope = %scope.key, "removing an idle container");
            self.inner.retire(&scope).await;
        }
    }
}

impl Inner {
    /// The scope `key`, made if it is not kept.
    fn scope(&self, key: &str, workspace: &Workspace) -> Arc<Scope> {
        let mut scopes = self.scopes.lock().unwrap_or_else(|p| p.into_inner());
        scopes
            .entry(key.to_owned())
            .or_insert_with(|| {
                Arc::new(Scope {
                    key: key.to_owned(),
                    workspace: workspace.clone(),
                    name: self.container_name(key),
                    state: tokio::sync::Mutex::new(ScopeState::default()),
                    last_used: StdMutex::new(Instant::now()),
                    running: AtomicUsize::new(0),
                    kill_pending: AtomicBool::new(false),
                })
            })
            .clone()
    }

    /// The scope `key` with its container running.
    async fn ensure(&self, key: &str, workspace: &Workspace) -> Result<Arc<Scope>, ExecError> {
        loop {
            let scope = self.scope(key, workspace);
            let mut state = scope.state.lock().await;
            if state.released {
                continue;
            }
            if state.id.is_none() {
                state.id = Some(self.create(&scope).await?);
            }
            drop(state);
            return Ok(scope);
        }
    }

    /// Removes the scope `key` and its container.
    async fn release(&self, key: &str) {
        let held = self
            .scopes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        if let Some(held) = held {
            self.retire(&held).await;
        }
    }

    /// Takes `scope` (already out of the map) down with its container.
    async fn retire(&self, scope: &Scope) {
        let mut state = scope.state.lock().await;
        state.released = true;
        if let Some(id) = state.id.take()
            && let Err(e) = self.remove(&id).await
        {
            tracing::warn!(scope = %scope.key, "{e}");
        }
    }

    /// Whether the daemon runs rootless, asked once.
    async fn rootless(&self) -> Result<bool, ExecError> {
        self.rootless
            .get_or_try_init(|| async {
                let info = self
                    .api
                    .info()
                    .await
                    .map_err(|e| self.api_error("ask the daemon about itself", e))?;
                Ok(info
                    .security_options
                    .unwrap_or_default()
                    .iter()
                    .any(|o| o.contains("rootless")))
            })
            .await
            .copied()
    }

    /// A name for `key`'s container: `docker ps` shows which conversation
    /// it is, and the hash (of the owner, the scope and this process) keeps
    /// two homes, two scopes and two gateways apart.
    fn container_name(&self, key: &str) -> String {
        let readable: String = key
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .take(40)
            .collect();
        let mut h = std::hash::DefaultHasher::new();
        (&self.owner, key, self.me.pid, self.me.started).hash(&mut h);
        format!("talaria-{readable}-{:016x}", h.finish())
    }

    /// Creates and starts `scope`'s container; returns its id.
    async fn create(&self, scope: &Scope) -> Result<String, ExecError> {
        let image = &self.config.image;
        match self.api.inspect_image(image).await {
            Ok(_) => {}
            Err(e) if status(&e) == Some(404) => {
                return Err(ExecError::Unavailable(format!(
                    "the container image {image} is not on this machine, and Talaria never pulls \
                     one: get it with `docker pull {image}` (or `podman pull {image}`, or build \
                     it), or set terminal.docker.image to an image you have"
                )));
            }
            Err(e) => return Err(self.api_error(&format!("look up the image {image}"), e)),
        }
        let body = self.container_body(scope).await?;
        let options = CreateContainerOptionsBuilder::new()
            .name(&scope.name)
            .build();
        let created = match self
            .api
            .create_container(Some(options.clone()), body.clone())
            .await
        {
            // A container of that name can only be one this process made
            // and lost track of (its removal failed): replace it.
            Err(e) if status(&e) == Some(409) => {
                self.remove(&scope.name).await?;
                self.api.create_container(Some(options), body).await
            }
            other => other,
        }
        .map_err(|e| self.api_error("create a container", e))?;
        for warning in &created.warnings {
            tracing::warn!(scope = %scope.key, "docker: {warning}");
        }
        let id = created.id;
        if let Err(e) = self.api.start_container(&id, None).await {
            let _ = self.remove(&id).await;
            return Err(ExecError::Unavailable(format!(
                "a container from {image} does not start ({}); the image needs a POSIX `sh` and \
                 `sleep`, and the daemon must be able to run containers here",
                api_message(&e)
            )));
        }
        tracing::debug!(scope = %scope.key, container = %id, "started a container");
        Ok(id)
    }

    /// The container of `scope`, as the Engine API wants it.
    async fn container_body(&self, scope: &Scope) -> Result<ContainerCreateBody, ExecError> {
        let c = &self.config;
        let host = scope.workspace.host();
        let source = host.to_str().ok_or_else(|| {
            ExecError::Io(format!(
                "the workspace path {} is not UTF-8, which the Engine API cannot carry; set \
                 terminal.workspaces_dir to a plain path",
                host.display()
            ))
        })?;
        // The workspace is the gateway user's, mode 0700: commands run as
        // that user so they can write there and the file tools can read
        // what they wrote. A rootless daemon's root already is that user.
        let user = if self.rootless().await? {
            None
        } else {
            use std::os::unix::fs::MetadataExt;
            let meta = std::fs::metadata(host)
                .map_err(|e| ExecError::io(&format!("read {}", host.display()), e))?;
            Some(format!("{}:{}", meta.uid(), meta.gid()))
        };
        let mib = |n: u64| i64::try_from(n.saturating_mul(1024 * 1024)).unwrap_or(i64::MAX);
        let labels = HashMap::from([
            (LABEL_OWNER.to_owned(), self.owner.clone()),
            (LABEL_PID.to_owned(), self.me.pid.to_string()),
            (LABEL_STARTED.to_owned(), self.me.started.to_string()),
            (LABEL_SCOPE.to_owned(), scope.key.clone()),
        ]);
        let host_config = HostConfig {
            mounts: Some(vec![Mount {
                target: Some(INNER_ROOT.to_owned()),
                source: Some(source.to_owned()),
                typ: Some(MountType::BIND),
                read_only: Some(false),
                ..Default::default()
            }]),
            tmpfs: Some(HashMap::from([(
                "/tmp".to_owned(),
                "rw,nosuid,nodev,mode=1777".to_owned(),
            )])),
            network_mode: Some(if c.network { "bridge" } else { "none" }.to_owned()),
            memory: (c.memory_mb > 0).then(|| mib(c.memory_mb)),
            nano_cpus: (c.cpus > 0.0).then_some((c.cpus * 1e9) as i64),
            pids_limit: (c.pids > 0).then_some(c.pids),
            cap_drop: Some(vec!["ALL".to_owned()]),
            security_opt: Some(vec!["no-new-privileges".to_owned()]),
            ..Default::default()
        };
        Ok(ContainerCreateBody {
            image: Some(c.image.clone()),
            // The entrypoint is ours, so an image's own entrypoint (a
            // server, a wrapper) does not run.
            entrypoint: Some(vec![
                "sh".to_owned(),
                "-c".to_owned(),
                KEEP_ALIVE.to_owned(),
            ]),
            cmd: Some(Vec::new()),
            working_dir: Some(INNER_ROOT.to_owned()),
            user,
            hostname: Some("talaria".to_owned()),
            labels: Some(labels),
            // Nothing of ours: each command brings its own allowlisted
            // environment.
            env: Some(Vec::new()),
            attach_stdin: Some(false),
            attach_stdout: Some(false),
            attach_stderr: Some(false),
            tty: Some(false),
            host_config: Some(host_config),
            ..Default::default()
        })
    }

    /// Force-removes the container `id` (a name works too); one that is
    /// already gone is fine.
    async fn remove(&self, id: &str) -> Result<(), ExecError> {
        let options = RemoveContainerOptionsBuilder::new().force(true).build();
        match self.api.remove_container(id, Some(options)).await {
            Ok(()) => Ok(()),
            Err(e) if status(&e) == Some(404) => Ok(()),
            Err(e) => Err(self.api_error(&format!("remove the container {id}"), e)),
        }
    }

    /// Kills everything running in `scope`'s container by restarting it:
    /// the workspace survives, the processes don't.
    async fn restart(&self, scope: &Scope) {
        let mut state = scope.state.lock().await;
        scope.kill_pending.store(false, Ordering::SeqCst);
        self.restart_locked(scope, &mut state).await;
    }

    /// [`Inner::restart`] with the scope's state already locked.
    async fn restart_locked(&self, scope: &Scope, state: &mut ScopeState) {
        let Some(id) = state.id.clone() else { return };
        // Stop at once (SIGKILL after no grace), then start again.
        let options = RestartContainerOptionsBuilder::new().t(0).build();
        if let Err(e) = self.api.restart_container(&id, Some(options)).await {
            // The next command makes a new one.
            tracing::warn!(scope = %scope.key, "{}", self.api_error("restart a container", e));
            state.id = None;
            let _ = self.remove(&id).await;
        }
    }

    /// Creates and starts an exec of `command` in `scope`'s container,
    /// making the container again if it was removed or stopped behind our
    /// back.
    async fn exec(
        &self,
        key: &str,
        workspace: &Workspace,
        spec: &CommandSpec,
    ) -> Result<(Arc<Scope>, String, OutputStream, AttachedInput), ExecError> {
        let workdir = match &spec.workdir {
            Some(dir) => dir
                .to_str()
                .ok_or_else(|| ExecError::Io(format!("{} is not a UTF-8 path", dir.display())))?
                .to_owned(),
            None => INNER_ROOT.to_owned(),
        };
        let env: Vec<String> = crate::env::for_isolated(&spec.env, INNER_ROOT)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let options = CreateExecOptions {
            cmd: Some(vec![
                "sh".to_owned(),
                "-c".to_owned(),
                MERGE_OUTPUT.to_owned(),
                "sh".to_owned(),
                spec.command.clone(),
            ]),
            env: Some(env),
            working_dir: Some(workdir),
            attach_stdin: Some(spec.stdin || spec.pty),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            // A terminal's output is one stream already (Console frames).
            tty: Some(spec.pty),
            ..Default::default()
        };
        let mut retried = false;
        loop {
            let scope = self.ensure(key, workspace).await?;
            let mut state = scope.state.lock().await;
            // A command dropped while running is killed before the next
            // one starts, not in the middle of it.
            if scope.kill_pending.swap(false, Ordering::SeqCst) {
                self.restart_locked(&scope, &mut state).await;
            }
            let Some(id) = state.id.clone().filter(|_| !state.released) else {
                // Released or restarted-and-lost between the two locks.
                continue;
            };
            let exec_id = match self.api.create_exec(&id, options.clone()).await {
                Ok(created) => created.id,
                // Removed (404) or stopped (409) by someone else: once,
                // make it again.
                Err(e) if !retried && matches!(status(&e), Some(404 | 409)) => {
                    tracing::info!(scope = %key, "the container is gone or stopped ({}); making a new one", api_message(&e));
                    retried = true;
                    state.id = None;
                    drop(state);
                    let _ = self.remove(&id).await;
                    continue;
                }
                Err(e) => return Err(self.api_error("start a command in the container", e)),
            };
            let started = self
                .api
                .start_exec(&exec_id, None)
                .await
                .map_err(|e| self.api_error("start a command in the container", e))?;
            drop(state);
            return match started {
                StartExecResults::Attached { output, input } => Ok((scope, exec_id, output, input)),
                StartExecResults::Detached => Err(ExecError::Io(
                    "the daemon started the command detached; its output is lost".to_owned(),
                )),
            };
        }
    }

    /// How the exec `exec_id` ended, once its output has: the daemon may
    /// record the exit a moment after the streams close, and a command that
    /// closed its output but goes on is waited for.
    async fn exit_of(&self, exec_id: &str) -> Result<Exit, String> {
        let mut pause = Duration::from_millis(5);
        let mut failures = 0;
        loop {
            match self.api.inspect_exec(exec_id).await {
                Ok(r) if r.running != Some(true) => {
                    return Ok(Exit {
                        code: r.exit_code.and_then(|c| i32::try_from(c).ok()),
                        signal: None,
                    });
                }
                Ok(_) => {}
                // The container went away with the command in it.
                Err(e) if status(&e) == Some(404) => {
                    return Ok(Exit {
                        code: None,
                        signal: None,
                    });
                }
                Err(e) => {
                    failures += 1;
                    if failures >= 5 {
                        return Err(self.api_error("learn how the command ended", e).to_string());
                    }
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// An API failure while doing `what`: a daemon that cannot be reached
    /// is unavailable, anything else an I/O error.
    fn api_error(&self, what: &str, e: ApiError) -> ExecError {
        match e {
            ApiError::DockerResponseServerError { .. } | ApiError::JsonDataError { .. } => {
                ExecError::Io(format!("docker: cannot {what}: {}", api_message(&e)))
            }
            e => ExecError::Unavailable(format!(
                "docker: cannot {what}: the daemon at {} does not answer ({e})",
                self.socket
            )),
        }
    }
}

type OutputStream = Pin<Box<dyn Stream<Item = Result<LogOutput, ApiError>> + Send>>;
type AttachedInput = Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

/// The HTTP status of a refusal from the daemon.
fn status(e: &ApiError) -> Option<u16> {
    match e {
        ApiError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// The daemon's own words for a refusal.
fn api_message(e: &ApiError) -> String {
    match e {
        ApiError::DockerResponseServerError { message, .. } => message.trim().to_owned(),
        e => e.to_string(),
    }
}

/// The socket path of a `unix://` host (a bare path is taken as one).
fn socket_path(host: &str) -> Result<String, ExecError> {
    if let Some(path) = host.strip_prefix("unix://") {
        return Ok(path.to_owned());
    }
    if host.starts_with('/') {
        return Ok(host.to_owned());
    }
    Err(ExecError::Unavailable(format!(
        "the Docker host {host} is not a Unix socket; only local daemons are supported: set \
         terminal.docker.host (or DOCKER_HOST) to unix:///path/to/docker.sock"
    )))
}

/// When this process started, in clock ticks after boot.
fn own_start_time() -> Result<u64, ExecError> {
    let stat = std::fs::read_to_string("/proc/self/stat")
        .map_err(|e| ExecError::io("read /proc/self/stat (is /proc mounted?)", e))?;
    start_time(&stat).ok_or_else(|| ExecError::Io("cannot parse /proc/self/stat".to_owned()))
}

/// Field 22 (`starttime`) of a `/proc/<pid>/stat` line. The command name
/// (field 2) may hold spaces and parentheses, so fields are counted after
/// its last `)`.
fn start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the name come fields 3, 4, ...: field 22 is the 20th.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether `gateway` still runs: its pid is alive and started when the
/// label says (a pid reused since is someone else).
fn is_running(gateway: Gateway) -> bool {
    std::fs::read_to_string(format!("/proc/{}/stat", gateway.pid))
        .ok()
        .and_then(|s| start_time(&s))
        == Some(gateway.started)
}

/// One conversation's container as a [`Backend`].
#[derive(Debug)]
struct Container {
    inner: Arc<Inner>,
    key: String,
    workspace: Workspace,
}

#[async_trait]
impl Backend for Container {
    fn kind(&self) -> BackendKind {
        BackendKind::Docker
    }

    fn workspace(&self) -> Option<&Workspace> {
        Some(&self.workspace)
    }

    async fn spawn(&self, spec: CommandSpec) -> Result<Running, ExecError> {
        let inner = self.inner.clone();
        let (scope, exec_id, output, input) = inner.exec(&self.key, &self.workspace, &spec).await?;
        // Asked for, the attached stdin is the caller's; otherwise it is
        // held by the output task (see below).
        let (input, held) = if spec.stdin || spec.pty {
            let input: Box<dyn tokio::io::AsyncWrite + Send + Unpin> = Box::new(input);
            (Some(input), None)
        } else {
            (None, Some(input))
        };
        scope.running.fetch_add(1, Ordering::SeqCst);
        scope.touch();
        let (reader, writer) = tokio::io::duplex(PIPE_BYTES);
        let (done_tx, done_rx) = oneshot::channel();
        let pump_scope = scope.clone();
        let pump_inner = inner.clone();
        let stop_output = CancellationToken::new();
        let stop = stop_output.clone();
        tokio::spawn(async move {
            pump(output, writer, stop).await;
            // Kept until the output has ended, so the connection closes
            // only once everything is read.
            drop(held);
            let exit = pump_inner.exit_of(&exec_id).await;
            pump_scope.running.fetch_sub(1, Ordering::SeqCst);
            pump_scope.touch();
            let _ = done_tx.send(exit);
        });
        Ok(Running {
            output: Box::new(reader),
            input,
            process: Box::new(ExecProcess {
                inner,
                scope,
                done: Some(done_rx),
                stop_output,
                exit: None,
                killed: false,
                armed: true,
            }),
        })
    }

    async fn release(&self) {
        self.inner.release(&self.key).await;
    }

    fn describe(&self) -> String {
        format!(
            "docker (image {}, network {}, workspace {})",
            self.inner.config.image,
            if self.inner.config.network {
                "bridge"
            } else {
                "none"
            },
            self.workspace.host().display()
        )
    }
}

/// Copies an exec's output into the pipe the reader holds. Once the reader
/// has gone, or `stop` says the command was killed, the rest is read and
/// dropped: the command never blocks on output nobody takes, and a kill
/// ends the output even when the pipe is full and nobody reads.
async fn pump(
    mut output: OutputStream,
    mut writer: tokio::io::DuplexStream,
    stop: CancellationToken,
) {
    let mut open = true;
    while let Some(item) = output.next().await {
        let bytes = match item {
            Ok(LogOutput::StdOut { message })
            | Ok(LogOutput::StdErr { message })
            | Ok(LogOutput::Console { message }) => message,
            Ok(LogOutput::StdIn { .. }) => continue,
            Err(e) => {
                tracing::debug!("docker: the output stream broke: {e}");
                break;
            }
        };
        if open {
            tokio::select! {
                written = writer.write_all(&bytes) => open = written.is_ok(),
                () = stop.cancelled() => open = false,
            }
        }
    }
    let _ = writer.shutdown().await;
}

/// A command running as an exec in a container.
///
/// A docker exec cannot be signalled through the Engine API, so
/// [`Process::kill`] (and dropping it armed) restarts the conversation's
/// container: the command and everything it started die, the workspace
/// survives, and so do files in it; `/tmp` and any other command running
/// in the same conversation at that moment do not.
struct ExecProcess {
    inner: Arc<Inner>,
    scope: Arc<Scope>,
    /// Resolves once the output has ended and the exit is known.
    done: Option<oneshot::Receiver<Result<Exit, String>>>,
    /// Tells the output task the command was killed.
    stop_output: CancellationToken,
    exit: Option<Exit>,
    killed: bool,
    armed: bool,
}

#[async_trait]
impl Process for ExecProcess {
    async fn wait(&mut self) -> std::io::Result<Exit> {
        if let Some(exit) = self.exit {
            return Ok(exit);
        }
        let Some(done) = self.done.as_mut() else {
            return Err(std::io::Error::other("the command's end was already lost"));
        };
        // Polling `&mut Receiver` is cancel-safe: a dropped wait leaves it
        // in place for the next.
        let got = done.await;
        self.done = None;
        let exit = match got {
            Ok(Ok(_)) if self.killed => Exit {
                code: None,
                signal: Some(9),
            },
            Ok(Ok(exit)) => exit,
            Ok(Err(e)) => return Err(std::io::Error::other(e)),
            Err(_) => {
                return Err(std::io::Error::other(
                    "the command's output task ended early",
                ));
            }
        };
        self.exit = Some(exit);
        Ok(exit)
    }

    async fn kill(&mut self) {
        if self.killed {
            return;
        }
        self.killed = true;
        self.armed = false;
        self.inner.restart(&self.scope).await;
        self.stop_output.cancel();
        // The output ends once the exec is dead; wait a bounded while so the
        // caller's next read sees the end.
        let _ = tokio::time::timeout(Duration::from_secs(5), self.wait()).await;
        if let Some(exit) = self.exit.as_mut() {
            *exit = Exit {
                code: None,
                signal: Some(9),
            };
        }
    }

    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for ExecProcess {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Dropped mid-run (a turn abandoned, a timeout that dropped the
        // future): kill as `kill` would, from a task, since drop can't wait.
        // The next command of the conversation does it first if this task
        // has not yet.
        self.scope.kill_pending.store(true, Ordering::SeqCst);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let inner = self.inner.clone();
            let scope = self.scope.clone();
            runtime.spawn(async move {
                let mut state = scope.state.lock().await;
                if scope.kill_pending.swap(false, Ordering::SeqCst) {
                    inner.restart_locked(&scope, &mut state).await;
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_field_22_even_with_odd_names() {
        let stat = "1234 (a) b (c)) S 1 1234 1234 0 -1 4194304 100 0 0 0 1 2 0 0 20 0 1 0 \
                    987654 1000 100";
        assert_eq!(start_time(stat), Some(987_654));
        assert_eq!(start_time("garbage"), None);
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(start_time(&own).is_some());
    }

    #[test]
    fn only_unix_sockets_are_hosts() {
        assert_eq!(
            socket_path("unix:///run/podman/podman.sock").unwrap(),
            "/run/podman/podman.sock"
        );
        assert_eq!(
            socket_path("/var/run/docker.sock").unwrap(),
            "/var/run/docker.sock"
        );
        assert!(matches!(
            socket_path("tcp://10.0.0.1:2375"),
            Err(ExecError::Unavailable(_))
        ));
    }
}
