//! The gateway as an operating-system process: its PID file, the state file
//! `talaria gateway status` reads, the systemd unit, and stopping it.
//!
//! # Why a lock, not just a file
//!
//! `gateway.pid` is held under an exclusive `flock` for the life of the
//! gateway. The lock, not the file's existence or content, says whether a
//! gateway runs: the kernel drops it when the process dies however it dies
//! (SIGKILL, OOM, power loss), so a stale file never blocks a restart and no
//! pid-liveness guess is needed. The JSON inside is only for humans and for
//! `status`/`stop`, which need the pid.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fs4::fs_std::FileExt;
use nix::sys::signal::{Signal, kill};
use serde::{Deserialize, Serialize};
use talaria_core::Home;

use crate::owner::{self, Owner};

/// What `gateway.pid` contains.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PidRecord {
    /// The gateway's process id.
    pub pid: u32,
    /// Start time in clock ticks since boot (see [`crate::owner`]).
    #[serde(default)]
    pub started_at: Option<u64>,
    #[serde(default)]
    /// The command line it was started with.
    pub argv: Vec<String>,
    /// Always `talaria-gateway`: tells this file apart from other tools'.
    #[serde(default)]
    pub kind: String,
    /// Wall-clock start, seconds since the Unix epoch.
    #[serde(default)]
    pub started_unix: f64,
}

/// The `kind` written into PID and lock files.
pub const PID_FILE_KIND: &str = "talaria-gateway";

/// Why [`PidFile::acquire`] failed.
#[derive(Debug, thiserror::Error)]
pub enum PidFileError {
    /// Another live process holds the lock. `pid` is 0 when it could not
    /// be determined.
    #[error("a gateway is already running (pid {pid})")]
    AlreadyRunning {
        /// The holder's process id, or 0.
        pid: u32,
    },
    /// The file could not be created, locked or written.
    #[error("cannot use the PID file {}: {source}", path.display())]
    Io {
        /// The PID file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
}

/// This gateway's claim on its home: `gateway.pid`, exclusively locked for
/// as long as the value lives.
///
/// Dropping it (or [`PidFile::release`]) removes the file, if it is still
/// the one this process locked, and unlocks it.
#[derive(Debug)]
pub struct PidFile {
    lock: LockedFile,
    record: PidRecord,
}

impl PidFile {
    /// Takes `home`'s PID file: creates it (mode 0600) if needed, locks it
    /// without waiting, and writes this process's [`PidRecord`] into it.
    ///
    /// A file left behind by a killed gateway is taken over: its lock died
    /// with it.
    pub fn acquire(home: &Home) -> Result<PidFile, PidFileError> {
        let path = home.gateway_pid_file();
        let io_err = |source| PidFileError::Io {
            path: path.clone(),
            source,
        };
        if let Some(parent) = path.parent() {
            create_private_dir(parent).map_err(io_err)?;
        }
        let (mut lock, previous) = match LockedFile::try_acquire(&path).map_err(io_err)? {
            Acquired::Locked { lock, previous } => (lock, previous),
            Acquired::Held { pid } => return Err(PidFileError::AlreadyRunning { pid }),
        };
        if let Some(stale) = parse_record(&previous) {
            tracing::warn!(
                path = %path.display(),
                stale_pid = stale.pid,
                "replaced a stale PID file left by a gateway that is no longer running"
            );
        } else if !previous.iter().all(u8::is_ascii_whitespace) {
            tracing::warn!(path = %path.display(), "replaced an unreadable stale PID file");
        }
        let me = owner::current();
        let record = PidRecord {
            pid: me.pid,
            started_at: me.started_at,
            argv: std::env::args_os()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            kind: PID_FILE_KIND.to_owned(),
            started_unix: talaria_core::unix_now(),
        };
        lock.write_json(&record).map_err(io_err)?;
        Ok(PidFile { lock, record })
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.lock.path
    }

    /// What was written into it.
    pub fn record(&self) -> &PidRecord {
        &self.record
    }

    /// Removes the file (if still ours) and unlocks it, reporting failures
    /// that a plain drop would swallow.
    pub fn release(self) -> io::Result<()> {
        let mut lock = self.lock;
        lock.release()
    }
}

/// A gateway that holds its home's PID file, as `status` and `stop` see it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunningInfo {
    /// The holder's pid; 0 if it could not be determined.
    pub pid: u32,
    /// The PID file's content, when it names the holder.
    pub record: Option<PidRecord>,
}

/// The gateway running for `home`, if any.
///
/// Decided by the lock, not the file: if a shared lock can be taken right
/// now, nobody holds the exclusive one and the file (if any) is stale. The
/// probe lock is released at once; [`PidFile::acquire`] retries briefly so
/// a concurrent probe cannot make a starting gateway think it is a
/// duplicate.
pub fn running_gateway(home: &Home) -> Option<RunningInfo> {
    let path = home.gateway_pid_file();
    // Read-only: a probe must never create the file.
    let file = File::open(&path).ok()?;
    match FileExt::try_lock_shared(&file) {
        Ok(true) => {
            // Closing the file would unlock it too; this just makes it prompt.
            let _ = FileExt::unlock(&file);
            None
        }
        Ok(false) => {
            let pid = holder_pid(&file);
            let record = parse_record(&read_all(&file).unwrap_or_default())
                .filter(|r| r.pid == pid && pid != 0);
            Some(RunningInfo { pid, record })
        }
        // No flock here (some network file systems): fall back to asking
        // whether the recorded process lives.
        Err(_) => {
            let record = parse_record(&read_all(&file).ok()?)?;
            let alive = owner::is_alive(&Owner {
                pid: record.pid,
                started_at: record.started_at,
            });
            alive.then_some(RunningInfo {
                pid: record.pid,
                record: Some(record),
            })
        }
    }
}

/// One platform adapter's health in [`GatewayStatus`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdapterStatus {
    /// `connecting`, `live`, `backoff`, … (see [`crate::Liveness`]).
    pub liveness: String,
    /// When it entered this state, seconds since the Unix epoch.
    pub since: f64,
    /// The error that ended the last connection, if any.
    pub last_error: Option<String>,
}

/// What the running gateway reports about itself in `gateway_state.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GatewayStatus {
    /// The gateway's process id.
    pub pid: u32,
    /// The gateway's node id in its store (see [`crate::node`]).
    #[serde(default)]
    pub node: Option<String>,
    /// Seconds since the Unix epoch.
    pub started_at_unix: f64,
    /// `starting`, `running`, `draining` or `stopped`.
    pub state: String,
    /// By platform name.
    pub adapters: BTreeMap<String, AdapterStatus>,
    /// Session keys with a turn in progress.
    pub running_sessions: Vec<String>,
    /// Delivery-ledger row counts by state.
    pub ledger: BTreeMap<String, u64>,
    /// Where commands run, for the owner and for everyone else, and why a
    /// backend can't start.
    #[serde(default)]
    pub commands: Vec<String>,
    /// Seconds since the Unix epoch.
    pub updated_at: f64,
}

/// Writes `home`'s state file atomically (temporary file, then rename), so
/// a reader never sees half a file. Mode 0600.
pub fn write_status(home: &Home, status: &GatewayStatus) -> io::Result<()> {
    let path = home.gateway_state_file();
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "state file has no parent"))?;
    let json = serde_json::to_vec_pretty(status).map_err(io::Error::other)?;
    // `tempfile` creates the file with mode 0600 already.
    let mut tmp = tempfile::Builder::new()
        .prefix(".gateway_state.")
        .suffix(".tmp")
        .tempfile_in(dir)?;
    tmp.write_all(&json)?;
    tmp.write_all(b"\n")?;
    tmp.as_file().sync_data()?;
    tmp.persist(&path).map_err(|e| e.error)?;
    Ok(())
}

/// Reads `home`'s state file; `Ok(None)` if there is none.
pub fn read_status(home: &Home) -> io::Result<Option<GatewayStatus>> {
    let bytes = match std::fs::read(home.gateway_state_file()) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The exit status of `talaria gateway run` when its configuration is
/// unusable (sysexits' `EX_CONFIG`). The unit does not restart on it: the
/// same files would fail the same way, every few seconds, forever.
pub const EXIT_BAD_CONFIG: u8 = 78;

/// A systemd **user** unit that runs `exe gateway run` for `home`.
///
/// It waits for the network to be up (where the manager knows of
/// `network-online.target`), restarts the gateway when it fails, except
/// for a configuration error ([`EXIT_BAD_CONFIG`]).
///
/// Paths are quoted the way systemd parses them: `%` is doubled (it starts
/// a specifier), `$` in the command line is doubled (it starts a variable),
/// and a path with spaces, quotes, backslashes or bytes that are not UTF-8
/// is put in double quotes with C-style escapes.
pub fn systemd_unit(exe: &Path, home: &Home) -> String {
    let exec = quote_systemd(exe.as_os_str().as_bytes(), true);
    let mut env = b"TALARIA_HOME=".to_vec();
    env.extend_from_slice(home.root().as_os_str().as_bytes());
    let env = quote_systemd(&env, false);
    format!(
        "[Unit]\n\
         Description=Talaria gateway\n\
         Wants=network-online.target\n\
         After=network-online.target\n\
         \n\
         [Service]\n\
         # The gateway says READY=1 once it serves, and pings the watchdog\n\
         # from its event loop: a hung gateway is restarted.\n\
         Type=notify\n\
         NotifyAccess=main\n\
         WatchdogSec=60\n\
         ExecStart={exec} gateway run\n\
         Environment={env}\n\
         Restart=on-failure\n\
         RestartSec=5\n\
         # A configuration error is not retried: fix it, then start again.\n\
         RestartPreventExitStatus={bad_config}\n\
         KillSignal=SIGTERM\n\
         TimeoutStopSec=60\n\
         # A user unit's soft open-file limit is 1,024; the gateway raises\n\
         # its soft limit to this hard one at start, for its connections.\n\
         LimitNOFILE=65536\n\
         \n\
         [Install]\n\
         WantedBy=default.target\n",
        bad_config = EXIT_BAD_CONFIG
    )
}

/// One word of a unit file line, escaped for systemd. `in_command` also
/// escapes `$`, which only command lines expand.
fn quote_systemd(bytes: &[u8], in_command: bool) -> String {
    let mut out = String::new();
    let mut needs_quotes = bytes.is_empty();
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '%' => out.push_str("%%"),
                '$' if in_command => out.push_str("$$"),
                '\\' => {
                    needs_quotes = true;
                    out.push_str("\\\\");
                }
                '"' => {
                    needs_quotes = true;
                    out.push_str("\\\"");
                }
                '\'' => {
                    needs_quotes = true;
                    out.push_str("\\'");
                }
                '\n' => {
                    needs_quotes = true;
                    out.push_str("\\n");
                }
                '\t' => {
                    needs_quotes = true;
                    out.push_str("\\t");
                }
                c if c.is_control() => {
                    needs_quotes = true;
                    out.push_str(&format!("\\x{:02x}", c as u32));
                }
                c if c.is_whitespace() => {
                    needs_quotes = true;
                    out.push(c);
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            needs_quotes = true;
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    if needs_quotes {
        format!("\"{out}\"")
    } else {
        out
    }
}

/// Asks process `pid` to stop gracefully (SIGTERM).
pub fn signal_stop(pid: u32) -> io::Result<()> {
    // Pid 0 or a "negative" pid would signal a whole process group,
    // possibly our own.
    let target = owner::as_single_pid(pid).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{pid} does not name a single process"),
        )
    })?;
    kill(target, Signal::SIGTERM).map_err(|e| io::Error::from_raw_os_error(e as i32))
}

/// Pins process `pid` by its start time, so that a pid the kernel recycles
/// later is not mistaken for it.
pub fn pin(pid: u32) -> Owner {
    Owner {
        pid,
        started_at: owner::start_time(pid),
    }
}

/// Waits up to `timeout` for the pinned process `target` to exit; `true`
/// if it did. Pin it (see [`pin`]) before signalling it: a start time read
/// after the signal may already belong to a recycled pid.
pub fn wait_for_exit(target: &Owner, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if !owner::is_alive(target) {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(100)));
    }
}

// ---------------------------------------------------------------------------
// Exclusively locked files (shared with `token_lock`).

/// How long a contended lock is retried before it counts as held: long
/// enough to outlast a `status` probe's momentary shared lock.
const CONTENTION_WAIT: Duration = Duration::from_millis(250);
const CONTENTION_STEP: Duration = Duration::from_millis(25);

/// A file held under an exclusive `flock` until [`LockedFile::release`] or
/// drop, which also remove it.
#[derive(Debug)]
pub(crate) struct LockedFile {
    /// `None` once released.
    file: Option<File>,
    path: PathBuf,
}

/// The outcome of [`LockedFile::try_acquire`].
#[derive(Debug)]
pub(crate) enum Acquired {
    /// Ours now; `previous` is whatever a dead holder left in the file.
    Locked { lock: LockedFile, previous: Vec<u8> },
    /// A live process holds it (pid 0 if unknown).
    Held { pid: u32 },
}

impl LockedFile {
    /// Opens or creates `path` (mode 0600) and locks it exclusively without
    /// blocking (beyond a short retry, see [`CONTENTION_WAIT`]).
    pub(crate) fn try_acquire(path: &Path) -> io::Result<Acquired> {
        let started = Instant::now();
        // Bounded only so a pathological loop cannot hang; each turn means
        // another process removed the file under us.
        for _ in 0..1000 {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(path)?;
            if !FileExt::try_lock_exclusive(&file)? {
                if started.elapsed() < CONTENTION_WAIT {
                    std::thread::sleep(CONTENTION_STEP);
                    continue;
                }
                return Ok(Acquired::Held {
                    pid: holder_pid(&file),
                });
            }
            // A releasing holder unlinks the file before unlocking it; if
            // we opened it before the unlink we now hold a lock on a file
            // nobody else will ever open. Only the file still at `path`
            // counts.
            let ours = file.metadata()?;
            match std::fs::metadata(path) {
                Ok(there) if there.dev() == ours.dev() && there.ino() == ours.ino() => {}
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
            if ours.permissions().mode() & 0o777 != 0o600 {
                file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            }
            let previous = read_all(&file)?;
            return Ok(Acquired::Locked {
                lock: LockedFile {
                    file: Some(file),
                    path: path.to_owned(),
                },
                previous,
            });
        }
        Err(io::Error::other(format!(
            "{} keeps being replaced while locking it",
            path.display()
        )))
    }

    /// Replaces the file's content with `value` as JSON.
    pub(crate) fn write_json<T: Serialize>(&mut self, value: &T) -> io::Result<()> {
        let mut json = serde_json::to_vec(value).map_err(io::Error::other)?;
        json.push(b'\n');
        let mut file = self
            .file
            .as_ref()
            .ok_or_else(|| io::Error::other("the lock was released"))?;
        file.set_len(0)?;
        file.seek(SeekFrom::Start(0))?;
        file.write_all(&json)?;
        file.sync_data()
    }

    /// Where the file is.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the file, if the one at the path is still ours, then
    /// unlocks it. Removing first means nobody can lock the old file and
    /// believe it current (see [`LockedFile::try_acquire`]).
    pub(crate) fn release(&mut self) -> io::Result<()> {
        let Some(file) = self.file.take() else {
            return Ok(());
        };
        let ours = file.metadata()?;
        let removed = match std::fs::metadata(&self.path) {
            Ok(there) if there.dev() == ours.dev() && there.ino() == ours.ino() => {
                match std::fs::remove_file(&self.path) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        };
        let unlocked = FileExt::unlock(&file);
        removed.and(unlocked)
    }
}

impl Drop for LockedFile {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot release a lock file");
        }
    }
}

/// The pid of the process holding an exclusive lock on `file`.
///
/// The holder writes its record just after locking, so an empty file or a
/// dead predecessor's record may be seen for a moment: the record is
/// re-read briefly until it names a live process. Failing that, the
/// kernel's lock table (`/proc/locks`) names the locker.
pub(crate) fn holder_pid(file: &File) -> u32 {
    let mut recorded = None;
    for attempt in 0..10 {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
        let Some(record) = read_all(file).ok().and_then(|b| parse_pid(&b)) else {
            continue;
        };
        if owner::is_alive(&record) {
            return record.pid;
        }
        recorded = Some(record.pid);
    }
    file.metadata()
        .ok()
        .and_then(|m| flock_holder(&std::fs::read_to_string("/proc/locks").ok()?, m.ino()))
        .or(recorded)
        .unwrap_or(0)
}

/// The pid holding an exclusive `flock` on inode `ino`, from the text of
/// `/proc/locks` (`1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF`).
/// Lines starting `->` after the number are waiters, not holders.
fn flock_holder(proc_locks: &str, ino: u64) -> Option<u32> {
    proc_locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_ascii_whitespace().collect();
        match fields.as_slice() {
            [_, "FLOCK", _, "WRITE", pid, dev_ino, ..] => {
                let line_ino: u64 = dev_ino.rsplit(':').next()?.parse().ok()?;
                let pid: u32 = pid.parse().ok()?;
                (line_ino == ino && pid != 0).then_some(pid)
            }
            _ => None,
        }
    })
}

fn read_all(mut file: &File) -> io::Result<Vec<u8>> {
    file.seek(SeekFrom::Start(0))?;
    let mut buf = Vec::new();
    file.read_to_end(&mut buf)?;
    Ok(buf)
}

fn parse_record(bytes: &[u8]) -> Option<PidRecord> {
    serde_json::from_slice(bytes).ok()
}

/// The pid and start time from any of our lock files' JSON.
fn parse_pid(bytes: &[u8]) -> Option<Owner> {
    #[derive(Deserialize)]
    struct PidOnly {
        pid: u32,
        #[serde(default)]
        started_at: Option<u64>,
    }
    let p: PidOnly = serde_json::from_slice(bytes).ok()?;
    Some(Owner {
        pid: p.pid,
        started_at: p.started_at,
    })
}

/// Creates `dir` and its parents, new ones with mode 0700.
pub(crate) fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

#[cfg(test)]
mod tests;
