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
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use talaria_agent::process_group::GroupKiller;
use talaria_core::Home;
use talaria_core::commands::{self, Availability};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

/// The events the gateway emits, as hook manifests name them.
pub mod events {
    /// The gateway started; payload `{platforms: [names]}`.
    pub const GATEWAY_STARTUP: &str = "gateway:startup";
    /// The gateway is stopping (turns are drained); payload `{}`.
    pub const GATEWAY_SHUTDOWN: &str = "gateway:shutdown";
    /// A session key got a new session.
    pub const SESSION_START: &str = "session:start";
    /// A session stopped being its key's current one (`/new`, automatic
    /// reset).
    pub const SESSION_END: &str = "session:end";
    /// `/new` replaced a key's session.
    pub const SESSION_RESET: &str = "session:reset";
    /// An authorized message arrived.
    pub const MESSAGE_RECEIVED: &str = "message:received";
    /// A final reply was delivered.
    pub const MESSAGE_SENT: &str = "message:sent";
    /// An agent turn is about to run.
    pub const AGENT_START: &str = "agent:start";
    /// An agent turn ended.
    pub const AGENT_END: &str = "agent:end";
    /// A scheduled job ran (reserved: cron is not built yet).
    pub const CRON_RUN: &str = "cron:run";
    /// The prefix of `command:<canonical name>`.
    pub const COMMAND_PREFIX: &str = "command";

    /// Every event with a fixed name.
    pub const FIXED: &[&str] = &[
        GATEWAY_STARTUP,
        GATEWAY_SHUTDOWN,
        SESSION_START,
        SESSION_END,
        SESSION_RESET,
        MESSAGE_RECEIVED,
        MESSAGE_SENT,
        AGENT_START,
        AGENT_END,
        CRON_RUN,
    ];

    /// Prefixes a manifest may subscribe to as `<prefix>:*`.
    pub const PREFIXES: &[&str] = &["gateway", "session", "message", "agent", "command", "cron"];

    /// The event a slash command emits, by its canonical name.
    pub fn command(name: &str) -> String {
        format!("{COMMAND_PREFIX}:{name}")
    }
}

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

/// What an `events` entry matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventPattern {
    /// One event, e.g. `agent:end` or `command:new`.
    Exact(String),
    /// `<prefix>:*`: every event starting with `<prefix>:`.
    Prefix(String),
}

impl EventPattern {
    /// Reads one `events` entry. Command names are resolved to their
    /// canonical form, so `command:reset` subscribes to `/new`.
    ///
    /// # Errors
    /// A message saying why the entry names nothing the gateway emits.
    pub fn parse(entry: &str) -> Result<EventPattern, String> {
        let entry = entry.trim().to_ascii_lowercase();
        if events::FIXED.contains(&entry.as_str()) {
            return Ok(EventPattern::Exact(entry));
        }
        let Some((prefix, rest)) = entry.split_once(':') else {
            return Err(format!(
                "`{entry}` is not an event (events look like `agent:end`)"
            ));
        };
        if rest == "*" {
            return if events::PREFIXES.contains(&prefix) {
                Ok(EventPattern::Prefix(prefix.to_owned()))
            } else {
                Err(format!("`{entry}`: no events start with `{prefix}:`"))
            };
        }
        if prefix == events::COMMAND_PREFIX {
            return match commands::resolve(rest) {
                Some(def) if def.availability != Availability::CliOnly => {
                    Ok(EventPattern::Exact(events::command(def.name)))
                }
                Some(_) => Err(format!("`/{rest}` is not a chat command")),
                None => Err(format!("`/{rest}` is not a known command")),
            };
        }
        Err(format!("`{entry}` is not an event the gateway emits"))
    }

    /// Whether `event` is one this pattern subscribes to.
    pub fn matches(&self, event: &str) -> bool {
        match self {
            EventPattern::Exact(name) => name == event,
            EventPattern::Prefix(prefix) => event
                .strip_prefix(prefix.as_str())
                .is_some_and(|rest| rest.starts_with(':')),
        }
    }
}

/// `HOOK.yaml` as written.
#[derive(Debug, Deserialize)]
struct RawManifest {
    name: Option<String>,
    description: Option<String>,
    #[serde(default)]
    events: Vec<String>,
    timeout_secs: Option<u64>,
}

/// A parsed, checked manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub name: String,
    pub description: String,
    pub events: Vec<EventPattern>,
    pub timeout: Duration,
    /// Entries that were ignored, and why: the hook still loads when at
    /// least one entry is usable.
    pub warnings: Vec<String>,
}

impl Manifest {
    /// Parses `HOOK.yaml` text of the hook in folder `folder`.
    ///
    /// # Errors
    /// Why the hook cannot load: the YAML does not parse, the name is
    /// unusable, or no usable event is listed.
    pub fn parse(text: &str, folder: &str) -> Result<Manifest, String> {
        if text.trim().is_empty() {
            return Err(format!("{MANIFEST} is empty"));
        }
        let raw: RawManifest =
            serde_saphyr::from_str(text).map_err(|e| format!("{MANIFEST} does not parse: {e}"))?;
        let name = raw
            .name
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| folder.to_owned());
        talaria_core::ids::validate_logical_key(&name)
            .map_err(|e| format!("the name `{name}` is unusable: {e}"))?;
        let mut warnings = Vec::new();
        let mut patterns: Vec<EventPattern> = Vec::new();
        for entry in &raw.events {
            match EventPattern::parse(entry) {
                Ok(p) if !patterns.contains(&p) => patterns.push(p),
                Ok(_) => {}
                Err(why) => warnings.push(format!("event ignored: {why}")),
            }
        }
        if patterns.is_empty() {
            let why = if raw.events.is_empty() {
                "it lists no events".to_owned()
            } else {
                format!("none of its events is usable ({})", warnings.join("; "))
            };
            return Err(why);
        }
        let timeout = match raw.timeout_secs {
            None => DEFAULT_TIMEOUT,
            Some(0) => {
                warnings.push("timeout_secs: 0 is too short; using 1".to_owned());
                Duration::from_secs(1)
            }
            Some(s) if Duration::from_secs(s) > MAX_TIMEOUT => {
                warnings.push(format!(
                    "timeout_secs: {s} is over the limit; using {}",
                    MAX_TIMEOUT.as_secs()
                ));
                MAX_TIMEOUT
            }
            Some(s) => Duration::from_secs(s),
        };
        Ok(Manifest {
            name,
            description: raw.description.unwrap_or_default(),
            events: patterns,
            timeout,
            warnings,
        })
    }
}

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

/// The handler's stdin.
fn encode(event: &str, payload: &Value) -> Vec<u8> {
    let timestamp = talaria_core::unix_now();
    let doc = serde_json::json!({
        "event": event,
        "timestamp": timestamp,
        "payload": payload,
    });
    let mut bytes = doc.to_string().into_bytes();
    // Line-oriented readers (`read line`) expect the line to end.
    bytes.push(b'\n');
    bytes
}

/// Bytes read from a pipe, at most a cap of them kept.
struct Captured {
    bytes: Vec<u8>,
    overflowed: bool,
}

/// Reads `pipe` to its end, keeping at most `cap` bytes. The rest is read
/// and discarded so a chatty handler never blocks on a full pipe.
async fn read_capped(pipe: Option<impl AsyncRead + Unpin>, cap: usize) -> Captured {
    let mut out = Captured {
        bytes: Vec::new(),
        overflowed: false,
    };
    let Some(mut pipe) = pipe else {
        return out;
    };
    let mut buf = [0u8; 8192];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return out,
            Ok(n) => {
                let room = cap.saturating_sub(out.bytes.len());
                if n > room {
                    out.overflowed = true;
                }
                out.bytes.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

enum Ending {
    Exited(std::process::ExitStatus),
    TimedOut,
}

/// One run of `hook`'s handler with `input` on stdin.
async fn run(
    hook: &Hook,
    event: &str,
    env: &[(OsString, OsString)],
    input: &[u8],
) -> Option<Value> {
    let name = hook.name();
    let mut cmd = tokio::process::Command::new(&hook.handler);
    cmd.current_dir(&hook.dir)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(hook = %name, event, error = %e, "cannot start the hook handler");
            return None;
        }
    };
    let mut killer = GroupKiller::new(child.id());
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let io = async {
        let feed = async {
            if let Some(mut stdin) = stdin {
                // A handler that ignores its input may exit before reading
                // it: a broken pipe is not its failure.
                if let Err(e) = stdin.write_all(input).await {
                    tracing::debug!(hook = %name, error = %e, "hook did not read its input");
                }
            }
        };
        let (_, out, err) = tokio::join!(
            feed,
            read_capped(stdout, MAX_STDOUT),
            read_capped(stderr, MAX_STDERR)
        );
        (out, err)
    };
    tokio::pin!(io);

    let deadline = tokio::time::sleep(hook.timeout());
    tokio::pin!(deadline);
    let linger = tokio::time::sleep(MAX_TIMEOUT);
    tokio::pin!(linger);
    let mut status = None;
    let mut output = None;
    let mut lingered = false;
    let ending = loop {
        if let (Some(s), Some(_)) = (status, &output) {
            break Ending::Exited(s);
        }
        tokio::select! {
            o = &mut io, if output.is_none() => output = Some(o),
            s = child.wait(), if status.is_none() => match s {
                Ok(s) => {
                    status = Some(s);
                    linger.as_mut().reset(tokio::time::Instant::now() + LINGER);
                }
                Err(e) => {
                    tracing::warn!(hook = %name, event, error = %e, "cannot wait for the hook handler");
                    return None;
                }
            },
            _ = &mut linger, if status.is_some() && output.is_none() && !lingered => {
                // The handler is gone but something it started still holds
                // its output open; the run ends now, so does that.
                tracing::warn!(hook = %name, event, "hook handler left processes holding its output; killed them");
                lingered = true;
                killer.kill();
            },
            _ = &mut deadline => break Ending::TimedOut,
        }
    };
    let status = match ending {
        Ending::TimedOut => {
            killer.kill();
            // Reap it: the group was sent SIGKILL, so this is quick.
            let _ = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
            tracing::warn!(
                hook = %name,
                event,
                timeout_secs = hook.timeout().as_secs(),
                "hook handler timed out; killed it and everything it started"
            );
            return None;
        }
        Ending::Exited(s) => s,
    };
    // Background processes that let go of the output are the hook's own.
    killer.disarm();
    let (out, err) = output?;
    let stderr = String::from_utf8_lossy(&err.bytes);
    let stderr = stderr.trim();
    if !status.success() {
        tracing::warn!(hook = %name, event, status = %status, stderr = %stderr, "hook handler failed");
        return None;
    }
    if !stderr.is_empty() {
        tracing::debug!(hook = %name, event, stderr = %stderr, "hook handler wrote to stderr");
    }
    if out.overflowed {
        tracing::warn!(
            hook = %name,
            event,
            "hook handler printed more than {MAX_STDOUT} bytes; its answer is ignored"
        );
        return None;
    }
    let text = String::from_utf8_lossy(&out.bytes);
    if text.trim().is_empty() {
        return None;
    }
    match serde_json::from_str(&text) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(hook = %name, event, error = %e, "hook handler printed something that is not JSON; ignored");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Manifest, String> {
        Manifest::parse(text, "my-hook")
    }

    #[test]
    fn manifest_defaults_and_fields() {
        let m = parse("events: [agent:end]\n").unwrap();
        assert_eq!(m.name, "my-hook");
        assert_eq!(m.description, "");
        assert_eq!(m.timeout, DEFAULT_TIMEOUT);
        assert_eq!(m.events, vec![EventPattern::Exact("agent:end".into())]);

        let m = parse(
            "name: audit\ndescription: Logs turns\nevents:\n  - message:received\n  - \"agent:*\"\n  - command:*\ntimeout_secs: 3\n",
        )
        .unwrap();
        assert_eq!(m.name, "audit");
        assert_eq!(m.description, "Logs turns");
        assert_eq!(m.timeout, Duration::from_secs(3));
        assert_eq!(
            m.events,
            vec![
                EventPattern::Exact("message:received".into()),
                EventPattern::Prefix("agent".into()),
                EventPattern::Prefix("command".into()),
            ]
        );
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
    }

    #[test]
    fn manifest_without_usable_events_is_refused() {
        for text in [
            "",
            "name: x\n",
            "events: []\n",
            "events: [nope:nothing, \"bogus:*\", command:no-such-command]\n",
            "events: [: : :\n",
            "events: agent:end\n",
        ] {
            assert!(parse(text).is_err(), "{text:?} loaded");
        }
        let why = parse("name: x\n").unwrap_err();
        assert!(why.contains("no events"), "{why}");
    }

    #[test]
    fn unusable_entries_warn_but_the_rest_loads() {
        let m = parse("events: [agent:end, agent:step, agent:end]\n").unwrap();
        assert_eq!(m.events, vec![EventPattern::Exact("agent:end".into())]);
        assert_eq!(m.warnings.len(), 1, "{:?}", m.warnings);
        assert!(m.warnings[0].contains("agent:step"));
    }

    #[test]
    fn timeouts_are_clamped() {
        assert_eq!(
            parse("events: [agent:end]\ntimeout_secs: 600\n")
                .unwrap()
                .timeout,
            MAX_TIMEOUT
        );
        assert_eq!(
            parse("events: [agent:end]\ntimeout_secs: 0\n")
                .unwrap()
                .timeout,
            Duration::from_secs(1)
        );
    }

    #[test]
    fn command_events_resolve_to_canonical_names() {
        let m = parse("events: [command:reset, COMMAND:New]\n").unwrap();
        assert_eq!(m.events, vec![EventPattern::Exact("command:new".into())]);
    }

    #[test]
    fn matching_exact_command_wildcard_and_prefix() {
        let exact = EventPattern::parse("agent:end").unwrap();
        assert!(exact.matches("agent:end"));
        assert!(!exact.matches("agent:start"));
        assert!(!exact.matches("agent:endx"));

        let commands = EventPattern::parse("command:*").unwrap();
        assert!(commands.matches("command:new"));
        assert!(commands.matches(&events::command("status")));
        assert!(!commands.matches("commander:new"));
        assert!(!commands.matches("agent:end"));

        let sessions = EventPattern::parse("session:*").unwrap();
        for e in ["session:start", "session:end", "session:reset"] {
            assert!(sessions.matches(e), "{e}");
        }
        assert!(!sessions.matches("sessions:start"));
        assert!(!sessions.matches("message:received"));

        let new = EventPattern::parse("command:new").unwrap();
        assert!(new.matches("command:new"));
        assert!(!new.matches("command:status"));

        assert!(EventPattern::parse("cron:run").is_ok());
        assert!(EventPattern::parse("*").is_err());
        assert!(EventPattern::parse("agent").is_err());
    }

    #[test]
    fn every_fixed_event_has_a_subscribable_prefix() {
        for e in events::FIXED {
            let (prefix, _) = e.split_once(':').unwrap();
            assert!(events::PREFIXES.contains(&prefix), "{e}");
            assert!(EventPattern::Prefix(prefix.into()).matches(e));
        }
    }

    #[test]
    fn input_is_one_json_line() {
        let bytes = encode("agent:end", &serde_json::json!({"a": 1}));
        assert_eq!(bytes.last(), Some(&b'\n'));
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["event"], "agent:end");
        assert_eq!(v["payload"]["a"], 1);
        assert!(v["timestamp"].as_f64().unwrap() > 1.0e9);
    }

    #[tokio::test]
    async fn no_hooks_means_nothing_runs() {
        let hooks = Hooks::none();
        assert!(hooks.is_empty());
        assert!(!hooks.wants("agent:end"));
        hooks.emit("agent:end", Value::Null);
        assert!(
            hooks
                .emit_and_wait("agent:end", Value::Null)
                .await
                .is_empty()
        );
    }
}
