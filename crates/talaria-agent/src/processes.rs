//! Background processes: commands started with `terminal(background=true)`
//! that run on after their call returns, managed with the `process` tool.
//!
//! One [`ProcessRegistry`] serves every session of a process. A command
//! starts through its session's backend (the host, the sandbox, ...) with
//! the same guard and environment as a foreground one. While it runs, a
//! task reads its output into a bounded buffer of recent output and a
//! capped log file under `<home>/processes/`, watches its lines for the
//! patterns asked for, and on its end records how it ended.
//!
//! A session sees only its own processes. The number running is bounded
//! per session and in total (`terminal.background`). Finished entries are
//! kept for a while (a bounded number) so their output can still be read.
//!
//! What outlives the turn reports through [`Reports`](crate::background::Reports): a process started
//! with `notify_on_complete` or `watch_patterns` opens a job before it
//! starts (so a report is never promised that cannot be kept), reports
//! progress when a watched line shows, and closes the job when it ends.
//! Killed on purpose (`process kill`, a session reset), it drops the job;
//! killed at shutdown, it leaves the job open, so the next start can tell
//! the chat it was lost.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::io::BufRead;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use talaria_core::Redactor;
use talaria_core::config::BackgroundProcessConfig;
use talaria_exec::{BackendKind, CommandSpec, Exit, Running};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::background::{JobKind, JobReport, JobStart, ReportsSlot};
// How long to read on after the shell exits, as the foreground does.
use crate::tools::terminal::DRAIN_GRACE;
use crate::tools::{ToolContext, ToolError};

/// Recent output kept in memory per process.
pub const RING_BYTES: usize = 256 * 1024;

/// Finished processes kept for `poll` and `log`, all sessions together;
/// the oldest go first.
pub const MAX_FINISHED: usize = 64;

/// At most one watched-pattern notice per process in this long.
pub const WATCH_COOLDOWN: Duration = Duration::from_secs(15);

/// Consecutive cooldown windows in which matches were dropped before
/// watching stops (and the process reports on its end instead).
pub const WATCH_STRIKES: u32 = 3;

/// Patterns one process may watch for, and the longest one.
const MAX_PATTERNS: usize = 20;
const MAX_PATTERN_CHARS: usize = 200;

/// The longest line watched for patterns; the rest of a longer line is not.
const MAX_LINE_BYTES: usize = 8 * 1024;

/// The most a write to a process's stdin may wait for it to be read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The most `process log` returns at once, in lines.
pub const MAX_LOG_LINES: usize = 2000;

/// Lines `process log` returns without a `limit`.
pub const DEFAULT_LOG_LINES: usize = 200;

/// The end of the output a completion notice quotes.
const REPORT_LINES: usize = 20;
const REPORT_CHARS: usize = 2000;

/// How a background process stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Still running.
    Running,
    /// Ended on its own.
    Exited(Exit),
    /// Killed through the registry (`process kill`, a reset, shutdown).
    Killed,
    /// Its end could not be learnt (the wait failed).
    Lost,
}

impl Status {
    /// The name shown to the model.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Exited(_) => "exited",
            Status::Killed => "killed",
            Status::Lost => "lost",
        }
    }
}

/// Why a process is being killed: decides what is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KillReason {
    /// `process kill`: the job is dropped.
    Asked,
    /// Its session was reset: the job is dropped.
    Reset,
    /// The front end is shutting down: the job is left open.
    Shutdown,
}

/// Recent output: the last bytes up to a cap, addressed by their offset in
/// everything the process printed.
#[derive(Debug)]
pub struct Ring {
    buf: VecDeque<u8>,
    cap: usize,
    /// The offset of the first byte still held.
    start: u64,
}

impl Ring {
    /// A ring holding at most `cap` bytes.
    pub fn new(cap: usize) -> Ring {
        Ring {
            buf: VecDeque::new(),
            cap: cap.max(1),
            start: 0,
        }
    }

    /// Appends `bytes`, forgetting the oldest past the cap.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend(bytes);
        let excess = self.buf.len().saturating_sub(self.cap);
        if excess > 0 {
            self.buf.drain(..excess);
            self.start += excess as u64;
        }
    }

    /// The offset just past the last byte: everything ever printed.
    pub fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }

    /// What was printed from offset `from` on, as far as it is still held,
    /// and how many bytes after `from` were already forgotten.
    pub fn since(&self, from: u64) -> (Vec<u8>, u64) {
        let lost = self.start.saturating_sub(from);
        let skip = usize::try_from(from.saturating_sub(self.start)).unwrap_or(usize::MAX);
        (self.buf.iter().skip(skip).copied().collect(), lost)
    }
}

/// The rate limit on watched-pattern notices of one process: one per
/// [`WATCH_COOLDOWN`]; after [`WATCH_STRIKES`] windows in a row in which a
/// match had to be dropped, watching stops.
#[derive(Debug, Default)]
pub struct WatchLimiter {
    last: Option<Instant>,
    dropped_in_window: bool,
    strikes: u32,
    suppressed: u64,
    stopped: bool,
}

/// What to do with one matching line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchVerdict {
    /// Report it; `suppressed` matches were dropped since the last report.
    Notify {
        /// Matches dropped since the last notice.
        suppressed: u64,
    },
    /// Inside the cooldown: drop it.
    Drop,
    /// Too many dropped: watching stops now.
    Stop,
    /// Watching had already stopped.
    Stopped,
}

impl WatchLimiter {
    /// The verdict on a match seen at `now`.
    pub fn on_match(&mut self, now: Instant) -> WatchVerdict {
        if self.stopped {
            return WatchVerdict::Stopped;
        }
        match self.last {
            Some(last) if now.saturating_duration_since(last) < WATCH_COOLDOWN => {
                self.suppressed += 1;
                if !self.dropped_in_window {
                    self.dropped_in_window = true;
                    self.strikes += 1;
                    if self.strikes >= WATCH_STRIKES {
                        self.stopped = true;
                        return WatchVerdict::Stop;
                    }
                }
                WatchVerdict::Drop
            }
            _ => {
                // A window that passed without a drop breaks the run.
                if !self.dropped_in_window {
                    self.strikes = 0;
                }
                self.dropped_in_window = false;
                self.last = Some(now);
                WatchVerdict::Notify {
                    suppressed: std::mem::take(&mut self.suppressed),
                }
            }
        }
    }
}

/// Lines of a log, `limit` of them from line `offset` (0-based), or the
/// last `limit` when no offset is given; with the total number of lines.
/// A terminal's CR LF line ends read as plain ones.
pub fn page_lines(
    reader: impl BufRead,
    offset: Option<usize>,
    limit: usize,
) -> std::io::Result<(Vec<String>, usize)> {
    let limit = limit.clamp(1, MAX_LOG_LINES);
    let mut kept: VecDeque<String> = VecDeque::new();
    let mut total = 0usize;
    for line in reader.split(b'\n') {
        let mut line = line?;
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        let wanted = match offset {
            Some(o) => total >= o && total < o.saturating_add(limit),
            None => true,
        };
        if wanted {
            kept.push_back(String::from_utf8_lossy(&line).into_owned());
            if offset.is_none() && kept.len() > limit {
                kept.pop_front();
            }
        }
        total += 1;
    }
    Ok((kept.into(), total))
}

/// How a background process is to be started.
#[derive(Debug, Clone, Default)]
pub struct SpawnOptions {
    /// Under a pseudo-terminal.
    pub pty: bool,
    /// Report its end to the chat (and offer a follow-up turn).
    pub notify_on_complete: bool,
    /// Report lines holding any of these (plain substrings). Dropped when
    /// `notify_on_complete` is set, as the ancestor does.
    pub watch_patterns: Vec<String>,
}

/// A background process that started.
#[derive(Debug, Clone)]
pub struct Started {
    /// Its id, `proc_<12 hex>`.
    pub id: String,
    /// Its pid on the host, when it has one there.
    pub pid: Option<u32>,
    /// Whether its end will be reported.
    pub notify_on_complete: bool,
    /// The patterns watched for (empty when none, or dropped).
    pub watch_patterns: Vec<String>,
    /// Whether the process can be written to (`process write`).
    pub stdin: bool,
    /// What the model should know (a dropped option, where output goes).
    pub note: String,
}

/// What [`ProcessRegistry::spawn`] did.
#[derive(Debug, Clone)]
pub enum Spawn {
    /// The process runs.
    Started(Started),
    /// The guard or the human refused the command: the message for the
    /// model (as the foreground returns it).
    Blocked(String),
}

/// Every background process of this front end. Cheap to clone.
#[derive(Clone)]
pub struct ProcessRegistry {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ProcessRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessRegistry")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

struct Inner {
    /// `<home>/processes`: one log file per process.
    dir: PathBuf,
    reports: ReportsSlot,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    procs: HashMap<String, Arc<Entry>>,
    /// Slots taken by starts under way, per session.
    starting: HashMap<String, usize>,
}

impl Table {
    fn running(&self, session: Option<&str>) -> usize {
        let procs = self
            .procs
            .values()
            .filter(|e| session.is_none_or(|s| e.session_id == s) && e.is_running())
            .count();
        let starting = match session {
            Some(s) => self.starting.get(s).copied().unwrap_or(0),
            None => self.starting.values().sum(),
        };
        procs + starting
    }

    /// Forgets the oldest finished entries past [`MAX_FINISHED`].
    fn prune(&mut self) {
        let mut finished: Vec<(Instant, String)> = self
            .procs
            .values()
            .filter_map(|e| e.ended_at().map(|t| (t, e.id.clone())))
            .collect();
        if finished.len() <= MAX_FINISHED {
            return;
        }
        finished.sort();
        let excess = finished.len() - MAX_FINISHED;
        for (_, id) in finished.into_iter().take(excess) {
            self.procs.remove(&id);
        }
    }
}

/// One process.
struct Entry {
    id: String,
    session_id: String,
    /// The command as shown (redacted).
    command: String,
    pid: Option<u32>,
    pty: bool,
    started: Instant,
    started_at: SystemTime,
    log: PathBuf,
    redactor: Redactor,
    /// The job reports go to, when one was opened.
    job: Option<JobStart>,
    notify_on_complete: bool,
    state: Mutex<State>,
    input: tokio::sync::Mutex<Option<Box<dyn AsyncWrite + Send + Unpin>>>,
    kill: CancellationToken,
    kill_reason: Mutex<Option<KillReason>>,
    /// Becomes true when the process has ended and its output is read.
    ended: tokio::sync::watch::Sender<bool>,
}

struct State {
    status: Status,
    ring: Ring,
    /// Where the last `poll` stopped.
    polled: u64,
    ended_at: Option<Instant>,
    /// Watching stopped for too many matches: report the end instead.
    promoted: bool,
}

impl Entry {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_running(&self) -> bool {
        self.state().status == Status::Running
    }

    fn ended_at(&self) -> Option<Instant> {
        self.state().ended_at
    }

    /// The status fields every answer carries.
    fn describe(&self) -> serde_json::Map<String, Value> {
        let st = self.state();
        let mut m = serde_json::Map::new();
        m.insert("session_id".into(), json!(self.id));
        m.insert("command".into(), json!(self.command));
        m.insert("status".into(), json!(st.status.as_str()));
        if let Some(pid) = self.pid {
            m.insert("pid".into(), json!(pid));
        }
        let end = st.ended_at.unwrap_or_else(Instant::now);
        m.insert(
            "runtime_seconds".into(),
            json!(end.saturating_duration_since(self.started).as_secs()),
        );
        if let Ok(since) = self.started_at.duration_since(SystemTime::UNIX_EPOCH) {
            m.insert("started_at".into(), json!(since.as_secs()));
        }
        match st.status {
            Status::Exited(exit) => {
                m.insert("exit_code".into(), json!(exit.code));
                if let Some(sig) = exit.signal {
                    m.insert("signal".into(), json!(sig));
                }
            }
            Status::Killed | Status::Lost | Status::Running => {
                m.insert("exit_code".into(), Value::Null);
            }
        }
        m
    }
}

/// A fresh process id: `proc_` and 12 hex digits, random (std's hasher
/// keys are), so ids of one run and the next do not meet in the store.
fn new_id() -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::hash::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    if let Ok(d) = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    h.write_u32(std::process::id());
    format!("proc_{:012x}", h.finish() & 0xffff_ffff_ffff)
}

/// `d` as a person reads a duration.
fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        _ => format!("{}h {}m", s / 3600, (s % 3600) / 60),
    }
}

/// The last lines of `text`, within [`REPORT_LINES`] and [`REPORT_CHARS`].
fn tail_of(text: &str) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    let from = lines.len().saturating_sub(REPORT_LINES);
    let tail = lines[from..].join("\n");
    let n = tail.chars().count();
    if n <= REPORT_CHARS {
        tail
    } else {
        tail.chars().skip(n - REPORT_CHARS).collect()
    }
}

/// Output bytes as text: a terminal's CR LF read as a line end.
fn text_of(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).replace("\r\n", "\n")
}

impl ProcessRegistry {
    /// A registry logging under `<home>/processes`, reporting through
    /// `reports` (bound later by the front end).
    pub fn new(home: &talaria_core::Home, reports: ReportsSlot) -> ProcessRegistry {
        ProcessRegistry {
            inner: Arc::new(Inner {
                dir: home.root().join("processes"),
                reports,
                table: Mutex::new(Table::default()),
            }),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.inner.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts `command` in the background for `ctx`'s session, in
    /// `workdir` (as the model gave it, resolved as the foreground does),
    /// behind the same guard.
    pub async fn spawn(
        &self,
        ctx: &ToolContext,
        command: &str,
        workdir: Option<&str>,
        opts: SpawnOptions,
    ) -> Result<Spawn, ToolError> {
        let backend = match &ctx.execution.backend {
            Ok(b) => b.clone(),
            Err(unavailable) => {
                return Err(ToolError::new(format!(
                    "commands cannot run in this conversation: {unavailable}"
                )));
            }
        };
        let (check_dir, run_dir) = crate::tools::terminal::place(ctx, backend.as_ref(), workdir)?;
        if let Err(blocked) = crate::tools::terminal::authorize(command, &check_dir, ctx).await {
            return Ok(Spawn::Blocked(blocked));
        }
        let limits = &ctx.config.terminal.background;
        let watch = checked_patterns(&opts.watch_patterns)?;
        let mut note = Vec::new();
        let watch = if opts.notify_on_complete && !watch.is_empty() {
            note.push(
                "watch_patterns was dropped: it and notify_on_complete are mutually exclusive, \
                 and the end will be reported"
                    .to_owned(),
            );
            Vec::new()
        } else {
            watch
        };
        let _slot = self.reserve(&ctx.session_id, limits)?;

        let id = self.fresh_id();
        let shown = ctx.redactor.redact(command);
        let job = if opts.notify_on_complete || !watch.is_empty() {
            let job = JobStart {
                id: id.clone(),
                session_id: ctx.session_id.clone(),
                kind: JobKind::Process,
                title: one_line(&shown),
            };
            let Some(reports) = self.inner.reports.get() else {
                return Err(ToolError::new(
                    "this conversation cannot be notified of a background process's end or \
                     output (nothing here delivers such notices); start it without \
                     notify_on_complete and watch_patterns, and check on it with the process \
                     tool",
                ));
            };
            reports.opened(&job).await.map_err(|e| {
                ToolError::new(format!(
                    "cannot promise a notice for this process ({e}); start it without \
                     notify_on_complete and watch_patterns, and check on it with the process \
                     tool"
                ))
            })?;
            Some(job)
        } else {
            None
        };

        // A pipe to answer prompts, where the backend can give one.
        let stdin = matches!(
            backend.kind(),
            BackendKind::Local | BackendKind::Sandbox | BackendKind::Docker
        );
        let spec = CommandSpec {
            stdin: stdin && !opts.pty,
            pty: opts.pty,
            ..CommandSpec::new(command, run_dir, crate::tools::terminal::command_env(ctx))
        };
        let log = self.inner.dir.join(format!("{id}.log"));
        let opened = async {
            tokio::fs::create_dir_all(&self.inner.dir)
                .await
                .map_err(|e| format!("cannot create {}: {e}", self.inner.dir.display()))?;
            let file = tokio::fs::File::create(&log)
                .await
                .map_err(|e| format!("cannot create {}: {e}", log.display()))?;
            let running = backend
                .spawn(spec)
                .await
                .map_err(|e| format!("cannot run the command: {e}"))?;
            Ok::<_, String>((file, running))
        };
        let (file, running) = match opened.await {
            Ok(ok) => ok,
            Err(e) => {
                let _ = tokio::fs::remove_file(&log).await;
                if let (Some(job), Some(reports)) = (&job, self.inner.reports.get()) {
                    reports.dropped(job).await;
                }
                return Err(ToolError::new(e));
            }
        };
        let Running {
            output,
            input,
            process,
        } = running;
        let has_input = input.is_some();
        let (ended, _) = tokio::sync::watch::channel(false);
        let entry = Arc::new(Entry {
            id: id.clone(),
            session_id: ctx.session_id.clone(),
            command: shown,
            pid: process.pid(),
            pty: opts.pty,
            started: Instant::now(),
            started_at: SystemTime::now(),
            log,
            redactor: ctx.redactor.clone(),
            job,
            notify_on_complete: opts.notify_on_complete,
            state: Mutex::new(State {
                status: Status::Running,
                ring: Ring::new(RING_BYTES),
                polled: 0,
                ended_at: None,
                promoted: false,
            }),
            input: tokio::sync::Mutex::new(input),
            kill: CancellationToken::new(),
            kill_reason: Mutex::new(None),
            ended,
        });
        {
            let mut table = self.table();
            table.procs.insert(id.clone(), entry.clone());
            table.prune();
        }
        tokio::spawn(pump(
            self.inner.clone(),
            entry.clone(),
            output,
            process,
            file,
            limits.log_max_bytes,
            watch.clone(),
        ));
        note.push(format!(
            "Output goes to a log; read it with process(action=\"poll\"|\"log\", session_id=\"{id}\")."
        ));
        if opts.notify_on_complete {
            note.push("You will be notified when it ends; no need to poll.".to_owned());
        }
        if !has_input {
            note.push(format!(
                "It has no stdin (the {} backend gives one only with pty=true).",
                backend.kind()
            ));
        }
        Ok(Spawn::Started(Started {
            id,
            pid: entry.pid,
            notify_on_complete: opts.notify_on_complete,
            watch_patterns: watch,
            stdin: has_input,
            note: note.join(" "),
        }))
    }

    /// An id not in use.
    fn fresh_id(&self) -> String {
        loop {
            let id = new_id();
            if !self.table().procs.contains_key(&id) {
                return id;
            }
        }
    }

    /// Takes a slot for a start in `session`, or says which limit is full.
    fn reserve(
        &self,
        session: &str,
        limits: &BackgroundProcessConfig,
    ) -> Result<SlotGuard, ToolError> {
        let mut table = self.table();
        let mine = table.running(Some(session));
        if mine >= limits.max_per_session {
            return Err(ToolError::new(format!(
                "this session already has {mine} background processes running, as many as \
                 terminal.background.max_per_session ({}) allows; wait for one to end or free a \
                 slot with process(action=\"kill\", session_id=...) (process(action=\"list\") \
                 shows them)",
                limits.max_per_session
            )));
        }
        let all = table.running(None);
        if all >= limits.max_total {
            return Err(ToolError::new(format!(
                "{all} background processes are running across all sessions, as many as \
                 terminal.background.max_total ({}) allows; wait for one to end or kill one of \
                 this session's with process(action=\"kill\", session_id=...)",
                limits.max_total
            )));
        }
        *table.starting.entry(session.to_owned()).or_default() += 1;
        Ok(SlotGuard {
            inner: self.inner.clone(),
            session: session.to_owned(),
        })
    }

    /// The entry `id` if it belongs to `session`.
    fn entry(&self, session: &str, id: &str) -> Result<Arc<Entry>, ToolError> {
        let table = self.table();
        match table.procs.get(id.trim()) {
            Some(e) if e.session_id == session => Ok(e.clone()),
            // Another session's process is not this one's business, not
            // even its existence.
            _ => Err(ToolError::new(format!(
                "there is no background process {id:?} in this session; \
                 process(action=\"list\") shows this session's processes (finished ones are \
                 forgotten after a while)"
            ))),
        }
    }

    /// This session's processes, oldest first, as `process list` shows
    /// them.
    pub fn list(&self, session: &str) -> Value {
        let mut mine: Vec<Arc<Entry>> = self
            .table()
            .procs
            .values()
            .filter(|e| e.session_id == session)
            .cloned()
            .collect();
        mine.sort_by_key(|e| e.started);
        let procs: Vec<Value> = mine.iter().map(|e| Value::Object(e.describe())).collect();
        json!({"processes": procs})
    }

    /// The ids of `session`'s running processes.
    pub fn running_ids(&self, session: &str) -> Vec<String> {
        self.table()
            .procs
            .values()
            .filter(|e| e.session_id == session && e.is_running())
            .map(|e| e.id.clone())
            .collect()
    }

    /// Status and the output since the last poll (at most `max_chars`, the
    /// end kept).
    pub fn poll(&self, session: &str, id: &str, max_chars: usize) -> Result<Value, ToolError> {
        let entry = self.entry(session, id)?;
        let (bytes, lost) = {
            let mut st = entry.state();
            let from = st.polled;
            st.polled = st.ring.end();
            st.ring.since(from)
        };
        let mut m = entry.describe();
        let text = text_of(&bytes);
        let n = text.chars().count();
        let max_chars = max_chars.max(100);
        let shown: String = if n > max_chars {
            text.chars().skip(n - max_chars).collect()
        } else {
            text
        };
        if n > max_chars || lost > 0 {
            m.insert(
                "note".into(),
                json!(format!(
                    "only the end of the new output is shown; process(action=\"log\", \
                     session_id=\"{}\") reads the whole log",
                    entry.id
                )),
            );
        }
        m.insert("output".into(), json!(entry.redactor.redact(&shown)));
        Ok(Value::Object(m))
    }

    /// Lines of the log: `limit` from line `offset`, or the last `limit`.
    pub async fn log(
        &self,
        session: &str,
        id: &str,
        offset: Option<usize>,
        limit: Option<usize>,
        max_chars: usize,
    ) -> Result<Value, ToolError> {
        let entry = self.entry(session, id)?;
        let limit = limit.unwrap_or(DEFAULT_LOG_LINES).clamp(1, MAX_LOG_LINES);
        let path = entry.log.clone();
        let paged = tokio::task::spawn_blocking(move || {
            let file = std::fs::File::open(&path)?;
            page_lines(std::io::BufReader::new(file), offset, limit)
        })
        .await
        .map_err(|e| ToolError::new(format!("cannot read the log: {e}")))?
        .map_err(|e| ToolError::new(format!("cannot read the log: {e}")))?;
        let (lines, total) = paged;
        let first = match offset {
            Some(o) => o.min(total),
            None => total.saturating_sub(lines.len()),
        };
        let mut text = lines.join("\n");
        let mut cut = false;
        let max_chars = max_chars.max(100);
        if text.chars().count() > max_chars {
            text = text.chars().take(max_chars).collect();
            cut = true;
        }
        let mut m = entry.describe();
        m.insert("output".into(), json!(entry.redactor.redact(&text)));
        m.insert("total_lines".into(), json!(total));
        m.insert("offset".into(), json!(first));
        m.insert("lines".into(), json!(lines.len()));
        if cut {
            m.insert(
                "note".into(),
                json!("the lines were cut at the output limit; ask for fewer with `limit`"),
            );
        }
        Ok(Value::Object(m))
    }

    /// Waits until the process ends, `timeout` passes or `cancel` fires;
    /// then polls it.
    pub async fn wait(
        &self,
        session: &str,
        id: &str,
        timeout: Duration,
        cancel: &CancellationToken,
        max_chars: usize,
    ) -> Result<Value, ToolError> {
        let entry = self.entry(session, id)?;
        let mut ended = entry.ended.subscribe();
        let outcome = tokio::select! {
            r = ended.wait_for(|e| *e) => if r.is_ok() { "ended" } else { "lost" },
            () = tokio::time::sleep(timeout) => "timed_out",
            () = cancel.cancelled() => "interrupted",
        };
        let mut v = self.poll(session, id, max_chars)?;
        match outcome {
            "timed_out" => {
                v["timed_out"] = json!(true);
                v["note"] = json!(format!(
                    "still running after {}s; wait again, or poll later",
                    timeout.as_secs()
                ));
            }
            "interrupted" => v["interrupted"] = json!(true),
            _ => {}
        }
        Ok(v)
    }

    /// Kills the process `id` of `session` (and everything it started);
    /// its job, if any, is dropped.
    pub async fn kill(&self, session: &str, id: &str) -> Result<Value, ToolError> {
        let entry = self.entry(session, id)?;
        if !entry.is_running() {
            let mut m = entry.describe();
            m.insert("note".into(), json!("it had already ended"));
            return Ok(Value::Object(m));
        }
        kill_and_wait(&entry, KillReason::Asked).await;
        Ok(Value::Object(entry.describe()))
    }

    /// Writes `data` to the process's stdin (with a newline after it when
    /// `newline`).
    pub async fn write(
        &self,
        session: &str,
        id: &str,
        data: &str,
        newline: bool,
    ) -> Result<Value, ToolError> {
        let entry = self.entry(session, id)?;
        if !entry.is_running() {
            return Err(ToolError::new(format!(
                "{} has ended; there is nothing to write to",
                entry.id
            )));
        }
        let mut input = entry.input.lock().await;
        let Some(stdin) = input.as_mut() else {
            return Err(ToolError::new(format!(
                "{} has no stdin to write to (it was closed, or its backend cannot give one)",
                entry.id
            )));
        };
        let mut bytes = data.as_bytes().to_vec();
        if newline {
            // A terminal's Enter is a carriage return.
            bytes.push(if entry.pty { b'\r' } else { b'\n' });
        }
        let written = async {
            stdin.write_all(&bytes).await?;
            stdin.flush().await
        };
        match tokio::time::timeout(WRITE_TIMEOUT, written).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Err(ToolError::new(format!(
                    "cannot write to {}: {e} (it may have closed its stdin)",
                    entry.id
                )));
            }
            Err(_) => {
                return Err(ToolError::new(format!(
                    "{} did not read its input within {}s; it may not be reading stdin",
                    entry.id,
                    WRITE_TIMEOUT.as_secs()
                )));
            }
        }
        let mut m = entry.describe();
        m.insert("bytes_written".into(), json!(bytes.len()));
        Ok(Value::Object(m))
    }

    /// Closes the process's stdin (end of input); on a terminal, types
    /// the end-of-file key.
    pub async fn close(&self, session: &str, id: &str) -> Result<Value, ToolError> {
        let entry = self.entry(session, id)?;
        let mut input = entry.input.lock().await;
        if entry.pty {
            // The terminal stays open for the output: end-of-file is a key.
            if let Some(stdin) = input.as_mut() {
                let sent = async {
                    stdin.write_all(&[4]).await?;
                    stdin.flush().await
                };
                let _ = tokio::time::timeout(WRITE_TIMEOUT, sent).await;
            }
        } else if let Some(mut stdin) = input.take() {
            // Said outright: a dropped writer does not close every kind of
            // stdin (an attached container's connection needs the shutdown).
            let _ = tokio::time::timeout(WRITE_TIMEOUT, stdin.shutdown()).await;
        }
        let mut m = entry.describe();
        m.insert("stdin".into(), json!("closed"));
        Ok(Value::Object(m))
    }

    /// Kills every running process of `session` (its reset: `/new`);
    /// their jobs are dropped. Returns how many were killed.
    pub async fn kill_session(&self, session: &str) -> usize {
        let mine: Vec<Arc<Entry>> = self
            .table()
            .procs
            .values()
            .filter(|e| e.session_id == session && e.is_running())
            .cloned()
            .collect();
        let n = mine.len();
        futures::future::join_all(mine.iter().map(|e| kill_and_wait(e, KillReason::Reset))).await;
        n
    }

    /// Kills every running process (shutdown). Their jobs stay open: the
    /// next start tells their chats they were lost.
    pub async fn kill_all(&self) -> usize {
        let all: Vec<Arc<Entry>> = self
            .table()
            .procs
            .values()
            .filter(|e| e.is_running())
            .cloned()
            .collect();
        let n = all.len();
        futures::future::join_all(all.iter().map(|e| kill_and_wait(e, KillReason::Shutdown))).await;
        n
    }
}

impl crate::background::SessionWork for ProcessRegistry {
    /// Kills the session's background processes from a task of the
    /// running runtime (the reset goes on meanwhile); their jobs are
    /// dropped. Whether a reset should do this at all
    /// (`terminal.background.kill_on_reset`) is the caller's to check.
    fn running(&self, session_id: &str) -> Vec<(String, String, u64)> {
        let mut mine: Vec<Arc<Entry>> = self
            .table()
            .procs
            .values()
            .filter(|e| e.session_id == session_id && e.is_running())
            .cloned()
            .collect();
        mine.sort_by_key(|e| e.started);
        mine.iter()
            .map(|e| {
                (
                    e.id.clone(),
                    e.command.clone(),
                    e.started.elapsed().as_secs(),
                )
            })
            .collect()
    }

    fn end_session(&self, session_id: &str) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                session = session_id,
                "no runtime to end the session's background processes in"
            );
            return;
        };
        let registry = self.clone();
        let session = session_id.to_owned();
        runtime.spawn(async move {
            let n = registry.kill_session(&session).await;
            if n > 0 {
                tracing::info!(session = %session, killed = n, "ended the background processes of a reset session");
            }
        });
    }
}

/// Gives back a reserved start slot when the start is over (the process
/// then counts itself, or it did not start).
struct SlotGuard {
    inner: Arc<Inner>,
    session: String,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let mut table = self.inner.table.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = table.starting.get_mut(&self.session) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                table.starting.remove(&self.session);
            }
        }
    }
}

/// Asks the process's task to kill it, and waits (boundedly) for the end.
async fn kill_and_wait(entry: &Entry, reason: KillReason) {
    {
        let mut r = entry.kill_reason.lock().unwrap_or_else(|p| p.into_inner());
        r.get_or_insert(reason);
    }
    entry.kill.cancel();
    let mut ended = entry.ended.subscribe();
    let _ = tokio::time::timeout(Duration::from_secs(10), ended.wait_for(|e| *e)).await;
}

/// The watch patterns, checked: a bounded number of non-empty strings of a
/// bounded length.
fn checked_patterns(patterns: &[String]) -> Result<Vec<String>, ToolError> {
    if patterns.len() > MAX_PATTERNS {
        return Err(ToolError::new(format!(
            "argument `watch_patterns`: at most {MAX_PATTERNS} patterns"
        )));
    }
    let mut out = Vec::new();
    for p in patterns {
        if p.chars().count() > MAX_PATTERN_CHARS {
            return Err(ToolError::new(format!(
                "argument `watch_patterns`: a pattern may have at most {MAX_PATTERN_CHARS} \
                 characters"
            )));
        }
        if !p.is_empty() && !out.contains(p) {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// The command on one line, for titles.
fn one_line(command: &str) -> String {
    let line = command.split_whitespace().collect::<Vec<_>>().join(" ");
    let n = line.chars().count();
    if n > 200 {
        format!("{}…", line.chars().take(199).collect::<String>())
    } else {
        line
    }
}

/// The log file, capped.
struct LogFile {
    file: Option<tokio::fs::File>,
    written: u64,
    cap: u64,
}

impl LogFile {
    async fn write(&mut self, bytes: &[u8]) {
        let Some(file) = self.file.as_mut() else {
            return;
        };
        let room = self.cap.saturating_sub(self.written);
        let take = usize::try_from(room).unwrap_or(usize::MAX).min(bytes.len());
        let mut keep = file.write_all(&bytes[..take]).await.is_ok();
        self.written += take as u64;
        if keep && take < bytes.len() {
            let note = format!(
                "\n[talaria: the log reached terminal.background.log_max_bytes ({} bytes); \
                 later output is not written here]\n",
                self.cap
            );
            let _ = file.write_all(note.as_bytes()).await;
            keep = false;
        }
        if !keep {
            // Full, or the disk refused: no more writes, what is there stays.
            let _ = file.flush().await;
            self.file = None;
        }
    }

    async fn finish(&mut self) {
        if let Some(file) = self.file.as_mut() {
            let _ = file.flush().await;
        }
    }
}

/// Finds whole lines in the output to match the patterns against.
struct Lines {
    partial: Vec<u8>,
}

impl Lines {
    /// The complete lines `bytes` ends (with what came before them).
    fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        for &b in bytes {
            if b == b'\n' {
                let line = String::from_utf8_lossy(&self.partial).trim_end().to_owned();
                out.push(line);
                self.partial.clear();
            } else if self.partial.len() < MAX_LINE_BYTES {
                self.partial.push(b);
            }
        }
        out
    }
}

/// Reads one process's output until it ends, then settles its job.
async fn pump(
    inner: Arc<Inner>,
    entry: Arc<Entry>,
    mut output: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    mut process: Box<dyn talaria_exec::Process>,
    file: tokio::fs::File,
    log_cap: u64,
    watch: Vec<String>,
) {
    let mut log = LogFile {
        file: Some(file),
        written: 0,
        cap: log_cap,
    };
    let mut lines = Lines {
        partial: Vec::new(),
    };
    let mut limiter = WatchLimiter::default();
    let mut buf = vec![0u8; 16 * 1024];
    let mut exit: Option<std::io::Result<Exit>> = None;
    let mut eof = false;
    let mut killed = false;
    let grace = tokio::time::sleep(Duration::from_secs(365 * 24 * 3600));
    tokio::pin!(grace);
    loop {
        if eof && exit.is_some() {
            break;
        }
        tokio::select! {
            r = output.read(&mut buf), if !eof => match r {
                Ok(0) | Err(_) => eof = true,
                Ok(n) => {
                    let bytes = &buf[..n];
                    entry.state().ring.push(bytes);
                    log.write(bytes).await;
                    if !watch.is_empty() {
                        for line in lines.feed(bytes) {
                            if let Some(pattern) = watch.iter().find(|p| line.contains(p.as_str())) {
                                watched(&inner, &entry, &mut limiter, pattern, &line).await;
                            }
                        }
                    }
                }
            },
            w = process.wait(), if exit.is_none() => {
                exit = Some(w);
                grace.as_mut().reset(tokio::time::Instant::now() + DRAIN_GRACE);
            },
            () = &mut grace, if exit.is_some() && !eof => break,
            () = entry.kill.cancelled(), if !killed => {
                killed = true;
                process.kill().await;
                // What it wrote before dying is still read, boundedly.
                if exit.is_none() {
                    exit = Some(Ok(Exit { code: None, signal: Some(9) }));
                }
                grace.as_mut().reset(tokio::time::Instant::now() + DRAIN_GRACE);
            },
        }
    }
    log.finish().await;
    if !killed {
        // What it left running is the user's (as in the foreground).
        process.disarm();
    }
    let status = if killed {
        Status::Killed
    } else {
        match exit {
            Some(Ok(e)) => Status::Exited(e),
            _ => Status::Lost,
        }
    };
    let promoted = {
        let mut st = entry.state();
        st.status = status;
        st.ended_at = Some(Instant::now());
        st.promoted
    };
    drop(entry.input.lock().await.take());
    settle(&inner, &entry, status, promoted).await;
    entry.ended.send_replace(true);
}

/// A watched line showed: reports it within the rate limit.
async fn watched(
    inner: &Inner,
    entry: &Entry,
    limiter: &mut WatchLimiter,
    pattern: &str,
    line: &str,
) {
    let (Some(job), Some(reports)) = (&entry.job, inner.reports.get()) else {
        return;
    };
    let text = match limiter.on_match(Instant::now()) {
        WatchVerdict::Notify { suppressed } => {
            let mut t = format!(
                "👀 {} matched {pattern:?}: {}",
                entry.id,
                entry.redactor.redact(&tail_of(line))
            );
            if suppressed > 0 {
                t.push_str(&format!(
                    " ({suppressed} earlier matches were dropped by the rate limit)"
                ));
            }
            t
        }
        WatchVerdict::Stop => {
            entry.state().promoted = true;
            format!(
                "👀 {} matches its watch patterns too often; watching stopped, and its end \
                 will be reported instead",
                entry.id
            )
        }
        WatchVerdict::Drop | WatchVerdict::Stopped => return,
    };
    reports.progress(job, &text).await;
}

/// Settles the job of a process that ended with `status`.
async fn settle(inner: &Inner, entry: &Entry, status: Status, promoted: bool) {
    let (Some(job), Some(reports)) = (&entry.job, inner.reports.get()) else {
        return;
    };
    if status == Status::Killed {
        let reason = *entry.kill_reason.lock().unwrap_or_else(|p| p.into_inner());
        if reason != Some(KillReason::Shutdown) {
            reports.dropped(job).await;
        }
        return;
    }
    if !entry.notify_on_complete && !promoted {
        // Only watched: its end was not asked about.
        reports.dropped(job).await;
        return;
    }
    reports.closed(job, report(entry, status)).await;
}

/// The notice of a finished process.
fn report(entry: &Entry, status: Status) -> JobReport {
    let (bytes, _) = {
        let st = entry.state();
        st.ring.since(st.ring.end().saturating_sub(16 * 1024))
    };
    let tail = entry.redactor.redact(&tail_of(&text_of(&bytes)));
    let took = entry
        .ended_at()
        .unwrap_or_else(Instant::now)
        .saturating_duration_since(entry.started);
    let (ok, how) = match status {
        Status::Exited(Exit {
            code: Some(code), ..
        }) => (code == 0, format!("exit {code}")),
        Status::Exited(Exit {
            signal: Some(sig), ..
        }) => (false, format!("signal {sig}")),
        Status::Exited(_) | Status::Lost => (false, "its end is unknown".to_owned()),
        Status::Killed => (false, "killed".to_owned()),
        Status::Running => (false, "running".to_owned()),
    };
    let mark = if ok { "✅" } else { "❌" };
    let mut text = format!(
        "{mark} Background process {} finished ({how}) after {}: `{}`",
        entry.id,
        human_duration(took),
        one_line(&entry.command)
    );
    if !tail.trim().is_empty() {
        text.push_str(&format!("\n```\n{tail}\n```"));
    }
    let follow_up = format!(
        "[Background process {id} finished]\ncommand: {cmd}\n{how} after {took}\nlast output:\n{tail}\n\
         (process(action=\"log\", session_id=\"{id}\") reads the whole log.)",
        id = entry.id,
        cmd = entry.command,
        took = human_duration(took),
    );
    JobReport {
        text,
        follow_up: Some(follow_up),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_last_bytes_and_counts_what_it_forgot() {
        let mut r = Ring::new(10);
        r.push(b"0123456789");
        assert_eq!(r.since(0), (b"0123456789".to_vec(), 0));
        r.push(b"abcd");
        assert_eq!(r.end(), 14);
        assert_eq!(r.since(0), (b"456789abcd".to_vec(), 4));
        assert_eq!(r.since(12), (b"cd".to_vec(), 0));
        assert_eq!(r.since(14), (Vec::new(), 0));
        // More than the cap at once keeps only its end.
        r.push(&[b'x'; 25]);
        assert_eq!(r.since(14), (vec![b'x'; 10], 15));
    }

    #[test]
    fn log_pages_by_offset_and_limit_or_take_the_end() {
        let text: String = (0..10).map(|i| format!("line {i}\r\n")).collect();
        let (lines, total) = page_lines(text.as_bytes(), None, 3).unwrap();
        assert_eq!(total, 10);
        assert_eq!(lines, ["line 7", "line 8", "line 9"]);
        let (lines, total) = page_lines(text.as_bytes(), Some(2), 2).unwrap();
        assert_eq!(total, 10);
        assert_eq!(lines, ["line 2", "line 3"]);
        let (lines, _) = page_lines(text.as_bytes(), Some(9), 5).unwrap();
        assert_eq!(lines, ["line 9"]);
        let (lines, _) = page_lines(text.as_bytes(), Some(50), 5).unwrap();
        assert!(lines.is_empty());
        // A last line without its newline still counts.
        let (lines, total) = page_lines(&b"a\nb"[..], None, 10).unwrap();
        assert_eq!((lines, total), (vec!["a".to_owned(), "b".to_owned()], 2));
    }

    #[test]
    fn watch_notices_are_rate_limited_and_stop_after_three_busy_windows() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut w = WatchLimiter::default();
        assert_eq!(w.on_match(at(0)), WatchVerdict::Notify { suppressed: 0 });
        assert_eq!(w.on_match(at(1)), WatchVerdict::Drop);
        assert_eq!(w.on_match(at(2)), WatchVerdict::Drop);
        // A new window: the drops are told, a first strike was counted.
        assert_eq!(w.on_match(at(16)), WatchVerdict::Notify { suppressed: 2 });
        assert_eq!(w.on_match(at(17)), WatchVerdict::Drop);
        assert_eq!(w.on_match(at(32)), WatchVerdict::Notify { suppressed: 1 });
        assert_eq!(w.on_match(at(33)), WatchVerdict::Stop);
        assert_eq!(w.on_match(at(100)), WatchVerdict::Stopped);

        // A quiet window in between starts the count again.
        let mut w = WatchLimiter::default();
        assert_eq!(w.on_match(at(0)), WatchVerdict::Notify { suppressed: 0 });
        assert_eq!(w.on_match(at(1)), WatchVerdict::Drop);
        assert_eq!(w.on_match(at(16)), WatchVerdict::Notify { suppressed: 1 });
        assert_eq!(w.on_match(at(17)), WatchVerdict::Drop);
        assert_eq!(w.on_match(at(40)), WatchVerdict::Notify { suppressed: 1 });
        assert_eq!(w.on_match(at(60)), WatchVerdict::Notify { suppressed: 0 });
        assert_eq!(w.on_match(at(61)), WatchVerdict::Drop);
        assert_eq!(w.on_match(at(80)), WatchVerdict::Notify { suppressed: 1 });
        assert_eq!(w.on_match(at(81)), WatchVerdict::Drop);
        assert_eq!(w.on_match(at(82)), WatchVerdict::Drop);
    }

    #[test]
    fn ids_are_proc_and_twelve_hex_digits() {
        let a = new_id();
        assert!(a.starts_with("proc_") && a.len() == 17, "{a}");
        assert!(a[5..].chars().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, new_id());
    }

    #[test]
    fn the_report_tail_is_bounded() {
        let long: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let t = tail_of(&long);
        assert!(t.starts_with("line 80") && t.ends_with("line 99"), "{t}");
        let wide = "x".repeat(10_000);
        assert_eq!(tail_of(&wide).chars().count(), REPORT_CHARS);
    }
}
