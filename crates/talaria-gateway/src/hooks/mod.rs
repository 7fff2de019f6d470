//! Event hooks: user programs the gateway runs when something happens
//! (it starts, a message arrives, a turn ends, ...).
//!
//! A hook is a folder `$TALARIA_HOME/hooks/<name>/` holding a `HOOK.yaml`
//! manifest and an executable `handler` (a script with a shebang or a
//! binary):
//!
//! ```yaml
//! name: audit            # optional, defaults to the folder name
//! description: Logs every turn to a file
//! events: [message:received, "agent:*", "command:*"]
//! timeout_secs: 5        # optional, default 10, at most 60
//! ```
//!
//! # Running a handler
//!
//! Each run is a new process: the event arrives on stdin as one JSON
//! object `{"event": "...", "timestamp": <unix secs>, "payload": {...}}`;
//! the working directory is the hook's folder and the environment holds
//! only `PATH`, `HOME`, `LANG` and `TALARIA_HOME`, so nothing the gateway
//! was given (API keys, bot tokens) reaches a hook. What the handler prints
//! on stdout, when it exits 0, is read as JSON and handed to callers of
//! [`Hooks::emit_and_wait`]; a non-zero exit, a crash, output that is not
//! JSON or more than [`MAX_STDOUT`] bytes of it only cost a warning.
//!
//! # Bounds
//!
//! A run that has not finished within its timeout is killed with its whole
//! process group (the handler is its own group leader, so whatever it
//! started goes too). At most [`MAX_RUNNING`] handlers run at once;
//! runs waiting for a slot count towards [`MAX_BACKLOG`], beyond which new
//! runs are dropped with a warning, and a run that cannot start within its
//! timeout is dropped too. A flood of events therefore costs bounded memory
//! and processes, and [`Hooks::emit`] never waits for any of it.
//!
//! Runs of one event start concurrently, and nothing orders runs of
//! different events: a hook sees `agent:end` before `agent:start` if the
//! first run happens to be slower to start.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;
use talaria_core::Home;
use tokio::sync::Semaphore;

pub mod events;
mod handler;
mod manifest;

pub use events::HookEvent;
pub use manifest::{EventPattern, Manifest};

use handler::{encode, run};

/// The manifest's file name inside a hook folder.
pub const MANIFEST: &str = "HOOK.yaml";

/// The handler's file name inside a hook folder.
pub const HANDLER: &str = "handler";

/// A run's timeout when the manifest names none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest timeout a manifest may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);

/// Handler processes alive at once, over all hooks.
pub const MAX_RUNNING: usize = 8;

/// Runs accepted but not finished (running or waiting for a slot); more
/// are dropped.
pub const MAX_BACKLOG: usize = 64;

/// Stdout kept per run; a handler printing more gets no answer.
pub const MAX_STDOUT: usize = 64 * 1024;

/// Stderr kept per run, for the log.
const MAX_STDERR: usize = 4 * 1024;

/// A manifest is a few lines; a bigger file is a mistake, not a manifest.
const MAX_MANIFEST: u64 = 64 * 1024;

/// After the handler exits, how long processes it left behind may keep its
/// output open before they are killed.
const LINGER: Duration = Duration::from_millis(500);

/// The environment variables passed through to handlers.
const PASSED_ENV: &[&str] = &["PATH", "HOME", "LANG"];

/// One loaded hook.
#[derive(Debug)]
pub struct Hook {
    manifest: Manifest,
    /// The folder, absolute: the handler's working directory.
    dir: PathBuf,
    handler: PathBuf,
}

impl Hook {
    /// The manifest's name (by default the folder's).
    pub fn name(&self) -> &str {
        &self.manifest.name
    }

    /// The manifest's description.
    pub fn description(&self) -> &str {
        &self.manifest.description
    }

    /// What it subscribes to.
    pub fn events(&self) -> &[EventPattern] {
        &self.manifest.events
    }

    /// How long one run may take.
    pub fn timeout(&self) -> Duration {
        self.manifest.timeout
    }

    /// The hook's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether it subscribes to `event`.
    pub fn wants(&self, event: &str) -> bool {
        self.manifest.events.iter().any(|p| p.matches(event))
    }
}

/// The loaded hooks and the limits their runs share. Build once per
/// gateway and share it behind an `Arc`.
pub struct Hooks {
    hooks: Vec<Arc<Hook>>,
    runtime: Arc<Shared>,
}

/// What every run needs, shared with the tasks runs live on.
struct Shared {
    env: Vec<(OsString, OsString)>,
    running: Semaphore,
    backlog: Arc<Semaphore>,
    dropped: AtomicU64,
}

impl Hooks {
    /// No hooks at all.
    pub fn none() -> Hooks {
        Hooks::from_parts(Vec::new(), Vec::new())
    }

    /// Loads the hooks under `home`'s hooks folder, sorted by folder name.
    /// Never fails: a hook that cannot load is skipped with a warning
    /// saying which folder and why; a missing folder means no hooks.
    pub fn load(home: &Home) -> Hooks {
        let root = home.hooks_dir();
        let talaria_home =
            std::fs::canonicalize(home.root()).unwrap_or_else(|_| home.root().to_path_buf());
        let mut env: Vec<(OsString, OsString)> = PASSED_ENV
            .iter()
            .filter_map(|k| std::env::var_os(k).map(|v| (OsString::from(k), v)))
            .collect();
        env.push(("TALARIA_HOME".into(), talaria_home.into_os_string()));
        let entries = match std::fs::read_dir(&root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Hooks::from_parts(Vec::new(), env);
            }
            Err(e) => {
                tracing::warn!(dir = %root.display(), error = %e, "cannot read the hooks folder; no hooks loaded");
                return Hooks::from_parts(Vec::new(), env);
            }
        };
        let mut folders: Vec<(String, PathBuf)> = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let shown = entry.file_name().to_string_lossy().into_owned();
            // Only folders are hooks; a README next to them is not a mistake.
            if !path.is_dir() {
                continue;
            }
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                tracing::warn!(hook = %shown, "hook skipped: its folder name is not UTF-8");
                continue;
            };
            if let Err(e) = talaria_core::ids::validate_path_component(&name) {
                tracing::warn!(hook = %name, error = %e, "hook skipped: unusable folder name");
                continue;
            }
            folders.push((name, path));
        }
        folders.sort();
        let mut hooks = Vec::new();
        for (folder, path) in folders {
            match load_one(&folder, &path) {
                Ok(hook) if hooks.iter().any(|h: &Arc<Hook>| h.name() == hook.name()) => {
                    // Answers are attributed by name; two hooks sharing one
                    // would be indistinguishable.
                    tracing::warn!(hook = %folder, name = %hook.name(), "hook skipped: an earlier folder's hook has the same name");
                }
                Ok(hook) => {
                    for w in &hook.manifest.warnings {
                        tracing::warn!(hook = %folder, "{w}");
                    }
                    tracing::info!(hook = %hook.name(), events = ?hook.events(), "hook loaded");
                    hooks.push(Arc::new(hook));
                }
                Err(why) => tracing::warn!(hook = %folder, "hook skipped: {why}"),
            }
        }
        Hooks::from_parts(hooks, env)
    }

    fn from_parts(hooks: Vec<Arc<Hook>>, env: Vec<(OsString, OsString)>) -> Hooks {
        Hooks {
            hooks,
            runtime: Arc::new(Shared {
                env,
                running: Semaphore::new(MAX_RUNNING),
                backlog: Arc::new(Semaphore::new(MAX_BACKLOG)),
                dropped: AtomicU64::new(0),
            }),
        }
    }

    /// The hook named `name` alone, sharing this set's limits and
    /// environment: `talaria hooks test` runs one hook without the others
    /// that subscribe to the same event.
    pub fn only(&self, name: &str) -> Option<Hooks> {
        let hook = self.hooks.iter().find(|h| h.name() == name)?;
        Some(Hooks {
            hooks: vec![hook.clone()],
            runtime: self.runtime.clone(),
        })
    }

    /// Whether no hook loaded.
    pub fn is_empty(&self) -> bool {
        self.hooks.is_empty()
    }

    /// The loaded hooks, in folder-name order.
    pub fn hooks(&self) -> impl Iterator<Item = &Hook> {
        self.hooks.iter().map(|h| h.as_ref())
    }

    /// Whether any hook subscribes to `event`: callers can skip building a
    /// payload nobody reads.
    pub fn wants(&self, event: &str) -> bool {
        self.hooks.iter().any(|h| h.wants(event))
    }

    /// Runs every hook subscribed to `event` and returns at once: the runs
    /// live on tokio tasks, bounded as the module documentation says.
    /// Outside a tokio runtime nothing runs (and a warning says so).
    pub fn emit(&self, event: &str, payload: Value) {
        let matching = self.matching(event);
        if matching.is_empty() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(event, "hooks not run: no async runtime");
            return;
        };
        let input: Arc<[u8]> = encode(event, &payload).into();
        for hook in matching {
            let Some(ticket) = self.runtime.admit(&hook, event) else {
                continue;
            };
            let shared = self.runtime.clone();
            let input = input.clone();
            let event = event.to_owned();
            rt.spawn(async move {
                let _ticket = ticket;
                shared.run_when_free(&hook, &event, &input).await;
            });
        }
    }

    /// Runs every hook subscribed to `event` and waits for them: one entry
    /// per subscribed hook, in folder-name order, with the handler's answer
    /// (`None` when it printed nothing, failed, timed out or was dropped).
    /// Each run waits at most its timeout for a free slot and then runs at
    /// most its timeout; dropping the returned future kills the runs.
    pub async fn emit_and_wait(&self, event: &str, payload: Value) -> Vec<(String, Option<Value>)> {
        let matching = self.matching(event);
        if matching.is_empty() {
            return Vec::new();
        }
        let input = encode(event, &payload);
        let runs = matching.into_iter().map(|hook| {
            let input = &input;
            async move {
                let answer = match self.runtime.admit(&hook, event) {
                    Some(_ticket) => self.runtime.run_when_free(&hook, event, input).await,
                    None => None,
                };
                (hook.name().to_owned(), answer)
            }
        });
        futures::future::join_all(runs).await
    }

    /// Fires a typed event (see [`events`]) and returns at once, as
    /// [`Hooks::emit`] does. Nothing is serialized unless some hook
    /// subscribes to it.
    pub fn fire(&self, event: &impl HookEvent) {
        let name = event.name();
        if let Some(payload) = self.payload(&name, event) {
            self.emit(&name, payload);
        }
    }

    /// Fires a typed event and waits for its runs, as
    /// [`Hooks::emit_and_wait`] does.
    pub async fn fire_and_wait(&self, event: &impl HookEvent) -> Vec<(String, Option<Value>)> {
        let name = event.name();
        match self.payload(&name, event) {
            Some(payload) => self.emit_and_wait(&name, payload).await,
            None => Vec::new(),
        }
    }

    /// `event` as JSON, when some hook subscribes to `name`.
    fn payload(&self, name: &str, event: &impl HookEvent) -> Option<Value> {
        if !self.wants(name) {
            return None;
        }
        match serde_json::to_value(event) {
            Ok(payload) => Some(payload),
            Err(e) => {
                // Only strings, numbers and flags: this cannot fail.
                tracing::warn!(event = name, error = %e, "hook payload not serializable; not sent");
                None
            }
        }
    }

    fn matching(&self, event: &str) -> Vec<Arc<Hook>> {
        self.hooks
            .iter()
            .filter(|h| h.wants(event))
            .cloned()
            .collect()
    }
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("hooks", &self.hooks)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// A place in the backlog, or `None` (with a warning) when it is full.
    fn admit(&self, hook: &Hook, event: &str) -> Option<tokio::sync::OwnedSemaphorePermit> {
        match self.backlog.clone().try_acquire_owned() {
            Ok(ticket) => Some(ticket),
            Err(_) => {
                let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                // Powers of two: a flood is reported without becoming one
                // in the log.
                if dropped.is_power_of_two() {
                    tracing::warn!(
                        hook = %hook.name(),
                        event,
                        dropped_so_far = dropped,
                        "too many hook runs waiting; this one is dropped"
                    );
                }
                None
            }
        }
    }

    async fn run_when_free(&self, hook: &Hook, event: &str, input: &[u8]) -> Option<Value> {
        let Ok(Ok(_slot)) = tokio::time::timeout(hook.timeout(), self.running.acquire()).await
        else {
            tracing::warn!(
                hook = %hook.name(),
                event,
                "hook run dropped: no free slot within its timeout"
            );
            return None;
        };
        run(hook, event, &self.env, input).await
    }
}

fn load_one(folder: &str, dir: &Path) -> Result<Hook, String> {
    let manifest_path = dir.join(MANIFEST);
    let mut text = String::new();
    std::fs::File::open(&manifest_path)
        .and_then(|f| f.take(MAX_MANIFEST + 1).read_to_string(&mut text))
        .map_err(|e| format!("cannot read {MANIFEST}: {e}"))?;
    if text.len() as u64 > MAX_MANIFEST {
        return Err(format!("{MANIFEST} is larger than {MAX_MANIFEST} bytes"));
    }
    let manifest = Manifest::parse(&text, folder)?;
    let dir = std::fs::canonicalize(dir).map_err(|e| format!("cannot resolve the folder: {e}"))?;
    let handler = dir.join(HANDLER);
    let meta = std::fs::metadata(&handler).map_err(|e| format!("no `{HANDLER}` file: {e}"))?;
    if !meta.is_file() {
        return Err(format!("`{HANDLER}` is not a file"));
    }
    if !is_executable(&meta) {
        return Err(format!("`{HANDLER}` is not executable (chmod +x it)"));
    }
    Ok(Hook {
        manifest,
        dir,
        handler,
    })
}

#[cfg(unix)]
fn is_executable(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o111 != 0
}

#[cfg(not(unix))]
fn is_executable(_meta: &std::fs::Metadata) -> bool {
    true
}

#[cfg(test)]
mod tests;
