//! [`Backends`]: which backend a conversation's commands run in, and the
//! backend itself.
//!
//! The owner's conversations use `terminal.backend`, everyone else's
//! `terminal.untrusted_backend`. An isolated backend that cannot start
//! here is reported as [`Unavailable`] with the reason; the caller then
//! withholds the tools that would need it. Nothing ever falls back to the
//! host.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use talaria_core::Home;
use talaria_core::config::TerminalConfig;

use crate::bwrap::Sandbox;
use crate::docker::Docker;
use crate::local::Local;
use crate::ssh::Ssh;
use crate::{Backend, BackendKind, Workspace};

/// How long a finding about the sandbox (it works, or why not) is trusted
/// before bubblewrap is probed again: installing it takes effect without a
/// restart, and a removed one is noticed.
const PROBE_TTL: Duration = Duration::from_secs(60);

/// Whose conversation it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Trust {
    /// The owner: the terminal, or a DM from someone `gateway.owners`
    /// names.
    Owner,
    /// Anyone else: group chats, paired users, cron jobs made from a chat,
    /// webhooks, the API server.
    Untrusted,
}

impl Trust {
    /// A word for logs and status lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Trust::Owner => "owner",
            Trust::Untrusted => "untrusted",
        }
    }
}

/// The backend a conversation should use cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {kind} backend is unavailable: {reason}")]
pub struct Unavailable {
    /// The backend that was wanted.
    pub kind: BackendKind,
    /// Why it cannot start, for the log and the status.
    pub reason: String,
}

/// Picks and keeps the backends of every conversation of one process.
pub struct Backends {
    config: TerminalConfig,
    workspaces: PathBuf,
    local: Arc<Local>,
    /// The last finding about bubblewrap and when it was made.
    sandbox_probe: tokio::sync::Mutex<Option<(Instant, Result<PathBuf, String>)>>,
    /// The Engine API client, once it has answered.
    docker: tokio::sync::Mutex<Option<Arc<Docker>>>,
    /// The sandbox's seccomp filter, written once (`None`: off, or not
    /// available on this architecture).
    seccomp: std::sync::OnceLock<Option<PathBuf>>,
    /// The last reason each kind could not start, for the status.
    unavailable: Mutex<HashMap<BackendKind, String>>,
}

impl std::fmt::Debug for Backends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backends")
            .field("backend", &self.config.backend)
            .field("untrusted_backend", &self.config.untrusted_backend)
            .finish_non_exhaustive()
    }
}

impl Backends {
    /// The backends `config` names; local commands run in `workdir`.
    pub fn new(config: &TerminalConfig, home: &Home, workdir: PathBuf) -> Backends {
        let workspaces = config
            .workspaces_dir
            .clone()
            .unwrap_or_else(|| home.root().join("workspaces"));
        Backends {
            config: config.clone(),
            workspaces,
            local: Arc::new(Local::new(workdir)),
            sandbox_probe: tokio::sync::Mutex::new(None),
            docker: tokio::sync::Mutex::new(None),
            seccomp: std::sync::OnceLock::new(),
            unavailable: Mutex::new(HashMap::new()),
        }
    }

    /// Where workspaces live (`terminal.workspaces_dir`, else
    /// `<home>/workspaces`).
    pub fn workspaces_dir(&self) -> &std::path::Path {
        &self.workspaces
    }

    /// The kind of backend `trust` gets.
    pub fn kind_for(&self, trust: Trust) -> BackendKind {
        match trust {
            Trust::Owner => self.config.backend,
            Trust::Untrusted => self.config.untrusted_backend,
        }
    }

    /// The backend of the conversation `scope` (a session id or a chat's
    /// key, as `terminal.workspace_scope` says) for `trust`.
    pub async fn backend(
        &self,
        trust: Trust,
        scope: &str,
    ) -> Result<Arc<dyn Backend>, Unavailable> {
        let kind = self.kind_for(trust);
        let made = self.make(kind, scope).await;
        self.note(kind, made.as_ref().map(drop).map_err(String::clone));
        made.map_err(|reason| Unavailable { kind, reason })
    }

    /// Remembers whether `kind` could start, for the status, and logs a
    /// reason the first time it is seen.
    fn note(&self, kind: BackendKind, found: Result<(), String>) {
        let mut reasons = self.unavailable.lock().unwrap_or_else(|p| p.into_inner());
        match found {
            Ok(()) => {
                reasons.remove(&kind);
            }
            Err(reason) => {
                if reasons.get(&kind) != Some(&reason) {
                    tracing::warn!(backend = %kind, "{reason}; commands are withheld from conversations that need this backend");
                }
                reasons.insert(kind, reason);
            }
        }
    }

    async fn make(&self, kind: BackendKind, scope: &str) -> Result<Arc<dyn Backend>, String> {
        match kind {
            BackendKind::Local => Ok(self.local.clone()),
            BackendKind::Sandbox => {
                let program = self.sandbox_program().await?;
                let workspace = self.workspace(scope)?;
                Ok(Arc::new(
                    Sandbox::new(self.config.sandbox.clone(), workspace, program)
                        .with_seccomp(self.seccomp_file()),
                ))
            }
            BackendKind::Docker => {
                let docker = self.docker().await?;
                let workspace = self.workspace(scope)?;
                docker
                    .backend(scope, workspace)
                    .await
                    .map_err(|e| e.to_string())
            }
            BackendKind::Ssh => Ssh::new(&self.config.ssh)
                .map(|s| Arc::new(s) as Arc<dyn Backend>)
                .map_err(|e| e.to_string()),
        }
    }

    /// The workspace of `scope`.
    pub fn workspace(&self, scope: &str) -> Result<Workspace, String> {
        Workspace::open(&self.workspaces, scope).map_err(|e| {
            format!(
                "cannot create the workspace under {}: {e}",
                self.workspaces.display()
            )
        })
    }

    /// Frees what `scope`'s conversation holds (its container), when it is
    /// reset. The workspace's files stay.
    pub async fn release(&self, scope: &str) {
        let docker = self.docker.lock().await.clone();
        if let Some(docker) = docker {
            docker.release(scope).await;
        }
    }

    /// Frees everything this process holds (its containers): it is
    /// ending. Workspaces stay.
    pub async fn release_all(&self) {
        let docker = self.docker.lock().await.clone();
        if let Some(docker) = docker {
            docker.release_all().await;
        }
    }

    /// Work done once at start: containers a killed gateway of this home
    /// left behind are removed. Says what it did, for the log.
    pub async fn start(&self) -> Option<String> {
        let uses_docker =
            [self.config.backend, self.config.untrusted_backend].contains(&BackendKind::Docker);
        if !uses_docker {
            return None;
        }
        match self.docker().await {
            Ok(docker) => match docker.sweep().await {
                Ok(0) => None,
                Ok(n) => Some(format!("removed {n} container(s) left by an earlier run")),
                Err(e) => Some(format!("could not sweep old containers: {e}")),
            },
            Err(e) => Some(e),
        }
    }

    /// Checks that the configured backends can start, so the status says
    /// why one can't before a conversation needs it. Cheap when nothing
    /// changed (the sandbox's finding is cached, a connected daemon kept).
    pub async fn check(&self) {
        let mut kinds = vec![self.config.backend, self.config.untrusted_backend];
        kinds.dedup();
        for kind in kinds {
            let found = match kind {
                BackendKind::Local => Ok(()),
                BackendKind::Sandbox => self.sandbox_program().await.map(drop),
                BackendKind::Docker => self.docker().await.map(drop),
                BackendKind::Ssh => Ssh::new(&self.config.ssh)
                    .map(drop)
                    .map_err(|e| e.to_string()),
            };
            self.note(kind, found);
        }
    }

    /// Removes containers idle longer than `terminal.docker.idle_timeout_secs`.
    pub async fn reap_idle(&self) {
        let docker = self.docker.lock().await.clone();
        if let Some(docker) = docker {
            docker.reap_idle().await;
        }
    }

    /// Why `kind` could not start the last time it was tried, if it
    /// couldn't.
    pub fn unavailable_reason(&self, kind: BackendKind) -> Option<String> {
        self.unavailable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&kind)
            .cloned()
    }

    /// Lines for `gateway status` and `/status`: which backend each kind of
    /// conversation gets, and why one cannot start.
    pub fn status_lines(&self) -> Vec<String> {
        let reasons = self.unavailable.lock().unwrap_or_else(|p| p.into_inner());
        let line = |who: &str, kind: BackendKind| match reasons.get(&kind) {
            Some(why) => format!("{who}: {kind}, unavailable ({why}): no terminal for them"),
            None => format!("{who}: {kind}"),
        };
        vec![
            line("owner commands", self.config.backend),
            line("untrusted commands", self.config.untrusted_backend),
        ]
    }

    async fn sandbox_program(&self) -> Result<PathBuf, String> {
        let mut probe = self.sandbox_probe.lock().await;
        if let Some((at, found)) = probe.as_ref()
            && at.elapsed() < PROBE_TTL
        {
            return found.clone();
        }
        let found = self.probe_sandbox().await;
        *probe = Some((Instant::now(), found.clone()));
        found
    }

    async fn probe_sandbox(&self) -> Result<PathBuf, String> {
        let program = Sandbox::find().map_err(|e| e.to_string())?;
        let scratch = tempfile_dir(&self.workspaces).map_err(|e| {
            format!(
                "cannot create a directory under {}: {e}",
                self.workspaces.display()
            )
        })?;
        let workspace =
            Workspace::open(&scratch, "probe").map_err(|e| format!("cannot probe: {e}"))?;
        let sandbox = Sandbox::new(self.config.sandbox.clone(), workspace, program.clone())
            .with_seccomp(self.seccomp_file());
        let result = sandbox.probe().await.map_err(|e| e.to_string());
        let _ = std::fs::remove_dir_all(&scratch);
        result.map(|()| program)
    }

    /// The file holding the sandbox's seccomp filter, written on first use
    /// (atomically: processes sharing a home write the same bytes).
    fn seccomp_file(&self) -> Option<PathBuf> {
        if !self.config.sandbox.seccomp {
            return None;
        }
        self.seccomp
            .get_or_init(|| {
                let Some(program) = crate::seccomp::program() else {
                    tracing::warn!("no seccomp filter for this architecture; the sandbox runs without one");
                    return None;
                };
                let path = self.workspaces.join(".sandbox-seccomp.bpf");
                let written = std::fs::create_dir_all(&self.workspaces).and_then(|()| {
                    let tmp = self
                        .workspaces
                        .join(format!(".sandbox-seccomp.{}.tmp", std::process::id()));
                    std::fs::write(&tmp, &program)?;
                    std::fs::rename(&tmp, &path)
                });
                match written {
                    Ok(()) => Some(path),
                    Err(e) => {
                        tracing::warn!("cannot write the sandbox's seccomp filter to {}: {e}; the sandbox runs without one", path.display());
                        None
                    }
                }
            })
            .clone()
    }

    async fn docker(&self) -> Result<Arc<Docker>, String> {
        // Only a client that answered is kept: a daemon started later is
        // found at the next command.
        let mut slot = self.docker.lock().await;
        if let Some(docker) = slot.as_ref() {
            return Ok(docker.clone());
        }
        let label = self.workspaces.to_string_lossy().into_owned();
        let docker = Docker::connect(&self.config.docker, &label).map_err(|e| e.to_string())?;
        docker.ping().await.map_err(|e| e.to_string())?;
        let docker = Arc::new(docker);
        *slot = Some(docker.clone());
        Ok(docker)
    }
}

/// A fresh directory under `root` for one probe.
fn tempfile_dir(root: &std::path::Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(root)?;
    let dir = root.join(format!(".probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
