//! The `terminal` tool: runs one shell command where the conversation's
//! commands run (its [`talaria_exec::Backend`]: the host, a bubblewrap
//! sandbox, a container, a remote host), behind the dangerous-command guard
//! ([`super::guard`]).
//!
//! The backend kills everything a command started on a timeout or an
//! interrupted turn. Output (stdout and stderr merged, in the order
//! written) is capped, head and tail kept, and redacted.
//!
//! A command inherits only an allowlisted environment
//! ([`talaria_exec::env`]), never Talaria's whole one: provider keys and bot
//! tokens would otherwise leave through `env | base64`, which no redaction
//! of the output can recognise. For the same reason a command that names
//! the home's `.env` or `config.yaml` is refused ([`super::secret_files`]).
//! In an isolated backend (sandbox, docker) the dangerous-command prompt is
//! skipped, since what it guards (the host) is out of reach; the hardline
//! list still applies.
//!
//! With `background=true` the command is handed to the
//! [`ProcessRegistry`](crate::processes::ProcessRegistry) and the call
//! returns at once with its id; `pty=true` runs it under a pseudo-terminal
//! (in the foreground too, where the backend can make one).
//!
//! "Always" approvals are persisted to `$TALARIA_HOME/command_allowlist.txt`
//! (one exact command per line, `#` comments) rather than into
//! `config.yaml`: rewriting a hand-edited YAML file risks losing comments
//! and formatting, while a dedicated file is trivially safe to append to.
//! "Always" means the command shown and nothing more; patterns (globs, or a
//! guard pattern key for every command of a kind) are written by hand in
//! `command_allowlist` in `config.yaml`. Older versions stored the pattern
//! key on "always"; such lines are retired, not honoured ([`upgrade_allowlist`]).

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use talaria_core::Home;
use talaria_core::config::ApprovalMode;
use tokio::io::AsyncReadExt;

use super::guard::{self, GuardVerdict};
use super::{
    Tool, ToolContext, ToolError, ToolResult, opt_array, opt_bool, opt_str, opt_u64, req_str,
};
use crate::interaction::{ApprovalDecision, ApprovalRequest};
use crate::processes::{ProcessRegistry, Spawn, SpawnOptions};
use talaria_exec::{Backend, BackendKind, CommandSpec, Exit, Running};

/// File name of the persisted allowlist inside the home.
pub const ALLOWLIST_FILE: &str = "command_allowlist.txt";

/// First line of an allowlist file whose entries are exact commands. A file
/// without it was written by an older Talaria, whose "always" stored the
/// guard's pattern key: one answer allowed every command of that kind.
pub const ALLOWLIST_HEADER: &str = "# Talaria command allowlist (format 2)";

/// The explanation written under [`ALLOWLIST_HEADER`].
const ALLOWLIST_PREAMBLE: &[&str] = &[
    "# Each line is one command approved with \"always\" (in talaria chat, or with",
    "# /approve always in a chat app): exactly that command runs again without",
    "# asking. `talaria approvals list` shows them, `talaria approvals revoke`",
    "# removes one. Patterns belong in command_allowlist in config.yaml.",
];

/// The comment lines older versions started the file with; replaced by the
/// new header when the file is upgraded.
const OLD_PREAMBLE: &[&str] = &[
    "# Command patterns approved with \"always\"; commands matching them run",
    "# without asking. One pattern key or command glob per line.",
];

/// How an upgraded file keeps an old pattern-key line, so the person who
/// reads it sees what happened.
const RETIRED_PREFIX: &str = "# no longer honoured (it allowed every command of this kind): ";

/// How long to keep reading after the shell exits while something it left
/// in the background still holds the output pipe open.
pub(crate) const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// The start of every message for a command the user refused.
pub const DENIED_PREFIX: &str = "BLOCKED: User denied this command.";

/// The persisted allowlist path for `home`.
pub fn allowlist_path(home: &Home) -> PathBuf {
    home.root().join(ALLOWLIST_FILE)
}

/// What the persisted allowlist holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredAllowlist {
    /// Exact commands approved with "always", in the order they were added.
    pub commands: Vec<String>,
    /// Pattern keys an older version stored there. They are not honoured:
    /// each allowed every command of its kind, far more than the one
    /// command the person saw.
    pub retired: Vec<String>,
}

/// Whether `text` is an allowlist file in the current format.
fn is_current(text: &str) -> bool {
    text.lines()
        .next()
        .is_some_and(|l| l.trim() == ALLOWLIST_HEADER)
}

fn parse_allowlist(text: &str) -> StoredAllowlist {
    let current = is_current(text);
    let keys = guard::pattern_keys();
    let mut out = StoredAllowlist::default();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // Some keys read like commands (`git reset --hard`): only an old
        // file's lines are taken for keys.
        if !current && keys.contains(&line) {
            out.retired.push(line.to_owned());
        } else if !out.commands.iter().any(|c| c == line) {
            out.commands.push(line.to_owned());
        }
    }
    out
}

/// Reads the persisted allowlist (empty when the file is missing).
pub fn read_allowlist(home: &Home) -> std::io::Result<StoredAllowlist> {
    match std::fs::read_to_string(allowlist_path(home)) {
        Ok(text) => Ok(parse_allowlist(&text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(StoredAllowlist::default()),
        Err(e) => Err(e),
    }
}

/// The commands of the persisted allowlist (empty when the file is missing
/// or unreadable).
pub fn persisted_allowlist(home: &Home) -> Vec<String> {
    read_allowlist(home).map(|a| a.commands).unwrap_or_default()
}

/// The entry "always" stores for `command`, given the command as the human
/// was shown it; `None` when it cannot be stored: it spans lines (the file
/// holds one a line), starts like a comment, or holds something the
/// redactor hides (a secret must not be written to a plain file, and the
/// human did not see the command in full).
pub fn always_entry(command: &str, shown: &str) -> Option<String> {
    let entry = command.trim();
    let storable = !entry.is_empty()
        && !entry.contains(['\n', '\r'])
        && !entry.starts_with('#')
        && shown.trim() == entry;
    storable.then(|| entry.to_owned())
}

/// Runs `change` on the allowlist file's lines under the file lock, and
/// writes the result back atomically if it differs, so concurrent sessions
/// cannot lose each other's entries. A file from an older version is
/// upgraded first: its pattern keys become comments. A missing file stays
/// missing unless `change` adds an entry. Returns what `change` returned
/// and the pattern keys this call retired.
fn edit_allowlist<R>(
    home: &Home,
    change: impl FnOnce(&mut Vec<String>) -> R,
) -> std::io::Result<(R, Vec<String>)> {
    std::fs::create_dir_all(home.root())?;
    let path = allowlist_path(home);
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(home.root().join(format!("{ALLOWLIST_FILE}.lock")))?;
    fs4::fs_std::FileExt::lock_exclusive(&lock)?;
    let (before, existed) = match std::fs::read_to_string(&path) {
        Ok(t) => (t, true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (String::new(), false),
        Err(e) => return Err(e),
    };
    let mut retired = Vec::new();
    let mut lines: Vec<String> = Vec::new();
    if is_current(&before) {
        lines.extend(before.lines().map(str::to_owned));
    } else {
        lines.push(ALLOWLIST_HEADER.to_owned());
        lines.extend(ALLOWLIST_PREAMBLE.iter().map(|l| (*l).to_owned()));
        let keys = guard::pattern_keys();
        for line in before.lines() {
            let t = line.trim();
            if OLD_PREAMBLE.contains(&t) {
                continue;
            }
            if keys.contains(&t) {
                retired.push(t.to_owned());
                lines.push(format!("{RETIRED_PREFIX}{t}"));
            } else {
                lines.push(line.to_owned());
            }
        }
    }
    let result = change(&mut lines);
    let has_entries = lines.iter().any(|l| {
        let t = l.trim();
        !t.is_empty() && !t.starts_with('#')
    });
    let mut after = lines.join("\n");
    after.push('\n');
    if after != before && (existed || has_entries) {
        super::atomic_write(&path, after.as_bytes())?;
    }
    Ok((result, retired))
}

/// Whether `line` is the entry `entry` (not a comment).
fn is_entry(line: &str, entry: &str) -> bool {
    let t = line.trim();
    !t.starts_with('#') && t == entry
}

/// Upgrades an allowlist file written by an older version: its pattern
/// keys, which allowed every command of a kind, become comments. Returns
/// the keys retired now (empty when there was nothing to do), for a
/// one-time notice.
pub fn upgrade_allowlist(home: &Home) -> std::io::Result<Vec<String>> {
    match std::fs::read_to_string(allowlist_path(home)) {
        Ok(text) if !is_current(&text) => Ok(edit_allowlist(home, |_| ())?.1),
        Ok(_) => Ok(Vec::new()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// What to tell a person whose allowlist held retired pattern keys.
pub fn retired_notice(keys: &[String]) -> String {
    format!(
        "Note: {} listed kinds of command ({}) that an earlier \"always\" allowed \
         wholesale. They are no longer honoured: such commands ask again, and \
         \"always\" now remembers only the exact command you approve.",
        ALLOWLIST_FILE,
        keys.join("; ")
    )
}

/// Adds `command` to the persisted allowlist (no-op if present).
pub fn persist_allowlist_entry(home: &Home, command: &str) -> std::io::Result<()> {
    let entry = command.trim();
    if entry.is_empty() || entry.contains(['\n', '\r']) || entry.starts_with('#') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "an allowlist entry must be one non-empty line that does not start with #",
        ));
    }
    let ((), retired) = edit_allowlist(home, |lines| {
        if !lines.iter().any(|l| is_entry(l, entry)) {
            lines.push(entry.to_owned());
        }
    })?;
    if !retired.is_empty() {
        tracing::warn!("{}", retired_notice(&retired));
    }
    Ok(())
}

/// Removes `command` from the persisted allowlist; whether it was there.
pub fn revoke_allowlist_entry(home: &Home, command: &str) -> std::io::Result<bool> {
    let entry = command.trim();
    if entry.is_empty() || !allowlist_path(home).exists() {
        return Ok(false);
    }
    let (removed, _) = edit_allowlist(home, |lines| {
        let before = lines.len();
        lines.retain(|l| !is_entry(l, entry));
        lines.len() != before
    })?;
    Ok(removed)
}

/// The key under which a session remembers one exact command approved with
/// "always" (it holds for the session even when the file cannot be
/// written). Pattern keys never start like this.
fn session_command_key(command: &str) -> String {
    format!("command:{}", command.trim())
}

/// Warns once per process about retired entries an old file still holds
/// (the gateway may run without anyone upgrading the file).
fn warn_retired_once(keys: &[String]) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| tracing::warn!("{}", retired_notice(keys)));
}

/// Decides whether `command` may run, asking the human when the guard says
/// so. `Err` holds the message for the model when it may not.
///
/// What lets a flagged command run without asking: approvals off; the exact
/// command approved with "always" (the file) or earlier in the session; a
/// `command_allowlist` entry of the configuration (a glob or a pattern key,
/// only for commands without shell operators); every matched pattern
/// approved for the session.
pub async fn authorize(command: &str, workdir: &Path, ctx: &ToolContext) -> Result<(), String> {
    let isolated = ctx.execution.backend.as_ref().is_ok_and(|b| b.isolated());
    // An isolated command cannot reach the home at all (it is not mounted),
    // so naming it is harmless there.
    if !isolated
        && let Some(file) = super::secret_files::command_reaches(&ctx.home, command, workdir)
    {
        return Err(format!(
            "BLOCKED: this command reaches {file}, where Talaria keeps its credentials (API \
             keys, bot tokens). No command may read, copy or encode those files, whatever the \
             approval settings. Do not retry it or reach the files another way; if the user \
             needs something from them, tell them to look themselves."
        ));
    }
    let findings = match guard::check(command) {
        GuardVerdict::Allow => return Ok(()),
        GuardVerdict::Hardline { reason } => {
            return Err(format!(
                "BLOCKED (hardline): this command matches \"{reason}\", which is never run, \
                 whatever the approval settings. Do not retry it, rephrase it, or reach the \
                 same result another way. If the user truly wants this, they must run it \
                 themselves outside the agent."
            ));
        }
        // What the prompt protects is the host; an isolated command cannot
        // reach it.
        GuardVerdict::NeedsApproval { .. } if isolated => return Ok(()),
        GuardVerdict::NeedsApproval { findings } => findings,
    };
    if ctx.config.approvals.mode == ApprovalMode::Off {
        return Ok(());
    }
    let exact = command.trim();
    let session_key = session_command_key(exact);
    if ctx
        .session
        .approved_patterns
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&session_key)
    {
        return Ok(());
    }
    // An exact command the human saw and allowed: shell operators in it
    // were part of what they approved.
    let home = ctx.home.clone();
    let stored = match tokio::task::spawn_blocking(move || read_allowlist(&home)).await {
        Ok(Ok(stored)) => stored,
        Ok(Err(e)) => {
            tracing::warn!("cannot read the command allowlist: {e}");
            StoredAllowlist::default()
        }
        Err(e) => {
            tracing::warn!("cannot read the command allowlist: {e}");
            StoredAllowlist::default()
        }
    };
    if !stored.retired.is_empty() {
        warn_retired_once(&stored.retired);
    }
    if stored.commands.iter().any(|c| c == exact) {
        return Ok(());
    }
    let mut remaining: Vec<&'static str> = findings.iter().map(|f| f.key).collect();
    if !guard::has_shell_operators(command) {
        let allow = &ctx.config.command_allowlist;
        if allow
            .iter()
            .any(|a| a.as_str() == exact || guard::glob_match(a, exact))
        {
            return Ok(());
        }
        remaining.retain(|k| !allow.iter().any(|a| a.as_str() == *k));
    }
    {
        let approved = ctx
            .session
            .approved_patterns
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        remaining.retain(|k| !approved.contains(*k));
    }
    let Some(first) = remaining.first() else {
        return Ok(());
    };
    let shown = ctx.redactor.redact(command);
    let always = always_entry(command, &shown);
    let request = ApprovalRequest {
        command: shown,
        reason: remaining.join("; "),
        pattern_key: (*first).to_owned(),
        always: always.clone(),
    };
    let wait = Duration::from_secs(ctx.config.approvals.timeout_secs.max(1));
    let decision = tokio::select! {
        d = tokio::time::timeout(wait, ctx.interaction.approve(&request)) => {
            d.unwrap_or(ApprovalDecision::TimedOut)
        }
        // Nobody is waiting for the result any more.
        _ = ctx.cancel.cancelled() => ApprovalDecision::Deny,
    };
    match decision {
        ApprovalDecision::Once => Ok(()),
        ApprovalDecision::Session => {
            ctx.session
                .approved_patterns
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(remaining.iter().map(|k| (*k).to_owned()));
            Ok(())
        }
        // "Always" is this exact command and nothing else. It also holds
        // for the rest of the session in case the file cannot be written
        // (or, for a command that cannot be stored, only there).
        ApprovalDecision::Always => {
            ctx.session
                .approved_patterns
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(session_key);
            if let Some(entry) = always {
                let home = ctx.home.clone();
                let saved =
                    tokio::task::spawn_blocking(move || persist_allowlist_entry(&home, &entry))
                        .await;
                match saved {
                    Ok(Ok(())) => {}
                    // The user said yes; failing to remember it for next
                    // time is no reason to refuse now.
                    Ok(Err(e)) => tracing::warn!("cannot save the command allowlist: {e}"),
                    Err(e) => tracing::warn!("cannot save the command allowlist: {e}"),
                }
            }
            Ok(())
        }
        ApprovalDecision::Deny => Err(format!(
            "{DENIED_PREFIX} The user has NOT consented to this action ({}). Do NOT retry \
             this command, do NOT rephrase it, and do NOT try to get the same outcome with a \
             different command. Tell the user what you wanted to do and ask how to proceed.",
            request.reason
        )),
        ApprovalDecision::TimedOut => Err(format!(
            "{DENIED_PREFIX} No answer came within {}s, and silence is not consent ({}). Do \
             NOT retry this command, do NOT rephrase it, and do NOT try to get the same \
             outcome with a different command. Tell the user what you wanted to do and ask \
             how to proceed.",
            wait.as_secs(),
            request.reason
        )),
    }
}

/// Output kept from a command: the first and last bytes, with a count of
/// what fell in between. Memory stays bounded however much is printed.
pub(crate) struct Capture {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    head_cap: usize,
    tail_cap: usize,
    dropped: usize,
}

impl Capture {
    pub(crate) fn new(max_chars: usize) -> Capture {
        // Four bytes per char at worst; the char cap is applied at the end.
        let half = max_chars.saturating_mul(2).max(64);
        Capture {
            head: Vec::new(),
            tail: VecDeque::new(),
            head_cap: half,
            tail_cap: half,
            dropped: 0,
        }
    }

    pub(crate) fn push(&mut self, mut bytes: &[u8]) {
        if self.head.len() < self.head_cap {
            let n = (self.head_cap - self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
        self.tail.extend(bytes);
        let excess = self.tail.len().saturating_sub(self.tail_cap);
        if excess > 0 {
            self.tail.drain(..excess);
            self.dropped += excess;
        }
    }

    pub(crate) fn finish(self, max_chars: usize) -> String {
        let half = max_chars / 2;
        let head = String::from_utf8_lossy(&self.head).into_owned();
        let tail_bytes: Vec<u8> = self.tail.into_iter().collect();
        let tail = String::from_utf8_lossy(&tail_bytes).into_owned();
        if self.dropped == 0 {
            let all = head + &tail;
            let n = all.chars().count();
            if n <= max_chars {
                return all;
            }
            let first: String = all.chars().take(half).collect();
            let last: String = all.chars().skip(n - half).collect();
            return format!(
                "{first}\n\n[... output truncated: {} chars omitted ...]\n\n{last}",
                n - 2 * half
            );
        }
        let first: String = head.chars().take(half).collect();
        let tn = tail.chars().count();
        let last: String = tail.chars().skip(tn.saturating_sub(half)).collect();
        format!(
            "{first}\n\n[... output truncated: more than {} bytes omitted ...]\n\n{last}",
            self.dropped
        )
    }
}

/// How a watched command ended.
pub(crate) enum Ending {
    /// Its shell exited.
    Exited(Exit),
    /// The time given ran out (it still runs: the caller kills it).
    TimedOut,
    /// The turn was interrupted (it still runs: the caller kills it).
    Cancelled,
}

/// What [`watch`] saw.
pub(crate) struct Watched {
    /// How it ended.
    pub(crate) ending: Ending,
    /// Its output reached its end (every process holding it closed it).
    pub(crate) eof: bool,
    /// It exited while something it started still held its output.
    pub(crate) lingering: bool,
}

/// Reads a started command's output into `capture` until it has exited
/// and its output ended (or, once it exited, [`DRAIN_GRACE`] passed with
/// something it left behind still holding the output), `timeout` passes,
/// or `cancel` fires. `what` names it in errors ("command", "script").
pub(crate) async fn watch(
    rx: &mut (dyn tokio::io::AsyncRead + Send + Unpin),
    process: &mut dyn talaria_exec::Process,
    capture: &mut Capture,
    timeout: Duration,
    cancel: &tokio_util::sync::CancellationToken,
    what: &str,
) -> Result<Watched, ToolError> {
    let mut buf = vec![0u8; 16 * 1024];
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut status: Option<Exit> = None;
    let mut eof = false;
    let mut lingering = false;
    // Armed for real once the shell exits.
    let grace = tokio::time::sleep(Duration::from_secs(365 * 24 * 3600));
    tokio::pin!(grace);
    let ending = loop {
        if eof && let Some(s) = status {
            break Ending::Exited(s);
        }
        tokio::select! {
            r = rx.read(&mut buf), if !eof => match r {
                Ok(0) => eof = true,
                Ok(n) => capture.push(&buf[..n]),
                Err(e) => {
                    tracing::warn!("reading the output of a {what} failed: {e}");
                    eof = true;
                }
            },
            s = process.wait(), if status.is_none() => {
                let s = s.map_err(|e| ToolError::new(format!("cannot wait for the {what}: {e}")))?;
                status = Some(s);
                grace.as_mut().reset(tokio::time::Instant::now() + DRAIN_GRACE);
            },
            _ = &mut grace, if status.is_some() && !eof => {
                lingering = true;
                if let Some(s) = status {
                    break Ending::Exited(s);
                }
            },
            _ = &mut deadline => break Ending::TimedOut,
            _ = cancel.cancelled() => break Ending::Cancelled,
        }
    };
    Ok(Watched {
        ending,
        eof,
        lingering,
    })
}

/// Collects what a killed command wrote before its end, for at most half
/// a second: the output closes as soon as every process holding it is
/// gone.
pub(crate) async fn drain_killed(
    rx: &mut (dyn tokio::io::AsyncRead + Send + Unpin),
    capture: &mut Capture,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let drain = async {
        loop {
            match rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => capture.push(&buf[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(500), drain).await;
}

/// The environment of a command: the allowlist, `terminal.env_passthrough`
/// and, in the owner's conversations, the variables the session's loaded
/// skills declared (from the process environment, else the home's
/// `.env`).
pub(crate) fn command_env(ctx: &ToolContext) -> Vec<(String, String)> {
    let mut names = ctx.config.terminal.env_passthrough.clone();
    let mut from: Vec<(std::ffi::OsString, std::ffi::OsString)> = std::env::vars_os().collect();
    if ctx.execution.trust == talaria_exec::Trust::Owner {
        let skill_env: Vec<String> = ctx
            .session
            .skill_env
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        let missing: Vec<&String> = skill_env
            .iter()
            .filter(|n| !from.iter().any(|(k, _)| k.to_str() == Some(n.as_str())))
            .collect();
        if !missing.is_empty()
            && let Ok(dotenv) = talaria_core::Env::load(&ctx.home.dotenv_file())
        {
            for name in missing {
                if let Some(v) = dotenv.get(name) {
                    from.push((name.into(), v.into()));
                }
            }
        }
        names.extend(skill_env);
    }
    talaria_exec::env::child_env(from, &names)
}

/// Runs `command` through `backend` (in `workdir`, as the backend sees
/// it) and returns the tool result.
async fn run(
    backend: &dyn Backend,
    command: &str,
    workdir: Option<PathBuf>,
    timeout: Duration,
    pty: bool,
    ctx: &ToolContext,
) -> ToolResult {
    let spec = CommandSpec {
        pty,
        ..CommandSpec::new(command, workdir, command_env(ctx))
    };
    // A terminal's keyboard stays unused (nobody types in the foreground);
    // held so the terminal is not torn down early.
    let Running {
        output: mut rx,
        input: _keyboard,
        mut process,
    } = backend
        .spawn(spec)
        .await
        .map_err(|e| ToolError::new(format!("cannot run the command: {e}")))?;

    let max_chars = ctx.config.terminal.max_output_chars.max(100);
    let mut capture = Capture::new(max_chars);
    let Watched {
        ending, lingering, ..
    } = watch(
        &mut rx,
        process.as_mut(),
        &mut capture,
        timeout,
        &ctx.cancel,
        "command",
    )
    .await?;

    let mut out = serde_json::Map::new();
    match ending {
        Ending::Exited(s) => {
            // Background jobs that outlive the shell are the user's to keep.
            process.disarm();
            out.insert("exit_code".into(), json!(s.code));
            if let Some(sig) = s.signal {
                out.insert("signal".into(), json!(sig));
            }
            if lingering {
                out.insert(
                    "note".into(),
                    json!("the command left background processes holding its output; they are still running and their later output is not shown"),
                );
            }
        }
        Ending::TimedOut | Ending::Cancelled => {
            process.kill().await;
            drain_killed(&mut rx, &mut capture).await;
            out.insert("exit_code".into(), Value::Null);
            let msg = if matches!(ending, Ending::TimedOut) {
                format!(
                    "Command timed out after {}s and was killed (with everything it started). \
                     Pass a larger `timeout` if it needs longer, or run long jobs in the \
                     background with output redirected to a file.",
                    timeout.as_secs()
                )
            } else {
                "Command was interrupted by the user and killed.".to_owned()
            };
            out.insert("error".into(), json!(msg));
            if matches!(ending, Ending::TimedOut) {
                out.insert("timed_out".into(), json!(true));
            } else {
                out.insert("interrupted".into(), json!(true));
            }
        }
    }
    let mut text = capture.finish(max_chars);
    if pty {
        // A terminal ends lines with CR LF; the model reads plain ones.
        text = text.replace("\r\n", "\n");
    }
    let output = ctx.redactor.redact(&text);
    out.insert("output".into(), json!(output));
    Ok(Value::Object(out).to_string())
}

/// The `terminal` tool.
#[derive(Debug, Clone, Default)]
pub struct TerminalTool {
    /// Where `background=true` commands go; without it they are refused.
    processes: Option<ProcessRegistry>,
}

impl TerminalTool {
    /// The tool with background commands run by `processes`.
    pub fn with_processes(processes: ProcessRegistry) -> TerminalTool {
        TerminalTool {
            processes: Some(processes),
        }
    }
}

#[async_trait]
impl Tool for TerminalTool {
    fn name(&self) -> &str {
        "terminal"
    }

    fn description(&self) -> &str {
        "Run a shell command (sh -c) in this conversation's environment and get its exit \
         code and combined stdout/stderr. In the foreground there is no stdin: use \
         non-interactive flags (-y, --no-pager). Long jobs and servers: background=true returns \
         at once with a process id for the `process` tool (poll, log, wait, kill, write); add \
         notify_on_complete=true to be told when it ends. pty=true runs under a \
         pseudo-terminal for programs that need one. Dangerous commands need the user's \
         approval; some are always blocked. Long output is cut in the middle. In an isolated \
         conversation commands run in a sandbox or container: the working directory is \
         /workspace (kept between commands) and there may be no network."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The command line to run."},
                "background": {"type": "boolean", "default": false, "description": "Run it in the background and return at once with a process id (for servers, watchers and long jobs; pair long jobs with notify_on_complete). Manage it with the `process` tool."},
                "timeout": {"type": "integer", "minimum": 1, "description": "Seconds before a foreground command is killed (default from config, capped by terminal.max_timeout_secs)."},
                "workdir": {"type": "string", "description": "Directory to run in (default: the session's working directory)."},
                "pty": {"type": "boolean", "default": false, "description": "Run under a pseudo-terminal, for interactive programs that need one (local and sandbox backends)."},
                "notify_on_complete": {"type": "boolean", "default": false, "description": "With background=true: the chat is told once when the process ends, with the end of its output. The right choice for almost every long job. Mutually exclusive with watch_patterns (which is dropped when both are set)."},
                "watch_patterns": {"type": "array", "items": {"type": "string"}, "description": "With background=true: plain strings; a line of output containing one is reported to the chat. At most one notice per 15 seconds per process; after 3 windows in a row with dropped matches watching stops and the end is reported instead. Only for rare one-shot signals of long-lived processes (a server's 'ready' line), not for errors in loops or end markers."}
            },
            "required": ["command"]
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolResult {
        let command = req_str(&args, "command")?;
        if command.trim().is_empty() {
            return Err(ToolError::new("argument `command` is empty"));
        }
        if command.contains('\0') {
            return Err(ToolError::new("argument `command` contains a NUL byte"));
        }
        let cfg = &ctx.config.terminal;
        let secs = opt_u64(&args, "timeout")?
            .unwrap_or(cfg.timeout_secs)
            .clamp(1, cfg.max_timeout_secs.max(1));
        let backend = match &ctx.execution.backend {
            Ok(b) => b.clone(),
            Err(unavailable) => {
                return Err(ToolError::new(format!(
                    "commands cannot run in this conversation: {unavailable}"
                )));
            }
        };
        let asked = opt_str(&args, "workdir")?;
        let pty = opt_bool(&args, "pty")?.unwrap_or(false);
        if opt_bool(&args, "background")?.unwrap_or(false) {
            return self.background(&args, command, asked, pty, ctx).await;
        }
        // Checked for their types only: without background they mean
        // nothing.
        opt_bool(&args, "notify_on_complete")?;
        opt_array(&args, "watch_patterns")?;
        let (check_dir, run_dir) = place(ctx, backend.as_ref(), asked)?;
        if let Err(blocked) = authorize(command, &check_dir, ctx).await {
            return Ok(blocked);
        }
        run(
            backend.as_ref(),
            command,
            run_dir,
            Duration::from_secs(secs),
            pty,
            ctx,
        )
        .await
    }
}

impl TerminalTool {
    /// `terminal(background=true)`: hands the command to the registry.
    async fn background(
        &self,
        args: &Value,
        command: &str,
        workdir: Option<&str>,
        pty: bool,
        ctx: &ToolContext,
    ) -> ToolResult {
        let Some(processes) = &self.processes else {
            return Err(ToolError::new(
                "background processes are not available here; run the command in the \
                 foreground (without background=true) with a suitable timeout",
            ));
        };
        let notify_on_complete = opt_bool(args, "notify_on_complete")?.unwrap_or(false);
        let mut watch_patterns = Vec::new();
        for (i, v) in opt_array(args, "watch_patterns")?
            .into_iter()
            .flatten()
            .enumerate()
        {
            match v.as_str() {
                Some(p) => watch_patterns.push(p.to_owned()),
                None => {
                    return Err(ToolError::new(format!(
                        "argument `watch_patterns`: item {i} must be a string, got {}",
                        super::json_type(v)
                    )));
                }
            }
        }
        let opts = SpawnOptions {
            pty,
            notify_on_complete,
            watch_patterns,
        };
        match processes.spawn(ctx, command, workdir, opts).await? {
            Spawn::Blocked(message) => Ok(message),
            Spawn::Started(started) => {
                let mut out = serde_json::Map::new();
                out.insert("session_id".into(), json!(started.id));
                out.insert("status".into(), json!("running"));
                if let Some(pid) = started.pid {
                    out.insert("pid".into(), json!(pid));
                }
                out.insert(
                    "notify_on_complete".into(),
                    json!(started.notify_on_complete),
                );
                if !started.watch_patterns.is_empty() {
                    out.insert("watch_patterns".into(), json!(started.watch_patterns));
                }
                out.insert("note".into(), json!(started.note));
                Ok(Value::Object(out).to_string())
            }
        }
    }
}

/// Where a command asked to run in `asked` runs: the directory on this
/// machine the checks look at, and the directory as the backend sees it
/// (`None`: the backend's default).
pub(crate) fn place(
    ctx: &ToolContext,
    backend: &dyn Backend,
    asked: Option<&str>,
) -> Result<(PathBuf, Option<PathBuf>), ToolError> {
    let cfg = &ctx.config.terminal;
    let asked = asked.filter(|w| !w.trim().is_empty());
    let (host_dir, run_dir) = if let Some(ws) = backend.workspace() {
        let host = match asked {
            Some(w) => ws.resolve(w).map_err(ToolError::new)?,
            None => ws.host().to_path_buf(),
        };
        let inner = ws.to_inner(&host);
        (Some(host), Some(inner))
    } else if backend.kind() == BackendKind::Ssh {
        // A directory on the remote host; it checks it.
        (None, asked.map(PathBuf::from))
    } else {
        let host = match (asked, &ctx.execution.workspace, &cfg.cwd) {
            (Some(w), _, _) => super::resolve_path(ctx, w)?,
            (None, Some(ws), _) => ws.host().to_path_buf(),
            (None, None, Some(c)) => super::resolve_path(ctx, &c.to_string_lossy())?,
            (None, None, None) => ctx.workdir.clone(),
        };
        (Some(host.clone()), Some(host))
    };
    if let Some(dir) = &host_dir
        && !dir.is_dir()
    {
        let shown = super::shown_path(ctx, dir);
        return Err(ToolError::new(format!(
            "argument `workdir`: {shown} is not a directory"
        )));
    }
    let check_dir = host_dir.unwrap_or_else(|| ctx.workdir.clone());
    Ok((check_dir, run_dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_keeps_head_and_tail() {
        let mut c = Capture::new(100);
        for i in 0..1000 {
            c.push(format!("line {i}\n").as_bytes());
        }
        let out = c.finish(100);
        assert!(out.starts_with("line 0\n"), "{out}");
        assert!(out.ends_with("line 999\n"), "{out}");
        assert!(out.contains("output truncated"), "{out}");
        assert!(out.chars().count() < 200, "{out}");
    }

    #[test]
    fn short_output_is_untouched() {
        let mut c = Capture::new(100);
        c.push("héllo".as_bytes());
        assert_eq!(c.finish(100), "héllo");
    }
}
