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
    pub pid: u32,
    /// Start time in clock ticks since boot (see [`crate::owner`]).
    #[serde(default)]
    pub started_at: Option<u64>,
    #[serde(default)]
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
    AlreadyRunning { pid: u32 },
    /// The file could not be created, locked or written.
    #[error("cannot use the PID file {}: {source}", path.display())]
    Io {
        path: PathBuf,
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
    pub last_error: Option<String>,
}

/// What the running gateway reports about itself in `gateway_state.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GatewayStatus {
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
         Type=simple\n\
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
mod tests {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    use super::*;

    fn temp_home() -> (tempfile::TempDir, Home) {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home"));
        (dir, home)
    }

    fn file_pid(path: &Path) -> u32 {
        parse_record(&std::fs::read(path).unwrap()).unwrap().pid
    }

    #[test]
    fn acquire_writes_a_private_record() {
        let (_dir, home) = temp_home();
        let pid_file = PidFile::acquire(&home).unwrap();
        let path = home.gateway_pid_file();
        assert_eq!(pid_file.path(), path);
        let record = parse_record(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(record.pid, std::process::id());
        assert_eq!(record.started_at, owner::current().started_at);
        assert_eq!(record.kind, PID_FILE_KIND);
        assert!(!record.argv.is_empty());
        assert!(record.started_unix > 1_600_000_000.0);
        assert_eq!(&record, pid_file.record());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_second_acquire_in_the_same_process_is_refused() {
        // flock belongs to the open file description, so a second open of
        // the same file conflicts even within one process.
        let (_dir, home) = temp_home();
        let _first = PidFile::acquire(&home).unwrap();
        match PidFile::acquire(&home) {
            Err(PidFileError::AlreadyRunning { pid }) => assert_eq!(pid, std::process::id()),
            other => panic!("expected AlreadyRunning, got {other:?}"),
        }
        let info = running_gateway(&home).expect("the gateway is running");
        assert_eq!(info.pid, std::process::id());
        assert_eq!(info.record.unwrap().kind, PID_FILE_KIND);
    }

    #[test]
    fn drop_removes_the_file_and_frees_the_lock() {
        let (_dir, home) = temp_home();
        let first = PidFile::acquire(&home).unwrap();
        drop(first);
        assert!(!home.gateway_pid_file().exists());
        assert_eq!(running_gateway(&home), None);
        let second = PidFile::acquire(&home).unwrap();
        second.release().unwrap();
        assert!(!home.gateway_pid_file().exists());
    }

    #[test]
    fn release_leaves_a_file_that_is_no_longer_ours() {
        let (_dir, home) = temp_home();
        let pid_file = PidFile::acquire(&home).unwrap();
        let path = home.gateway_pid_file();
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"someone else's").unwrap();
        pid_file.release().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"someone else's");
    }

    #[test]
    fn a_stale_file_without_a_lock_is_taken_over() {
        let (_dir, home) = temp_home();
        create_private_dir(home.root()).unwrap();
        let path = home.gateway_pid_file();
        std::fs::write(&path, br#"{"pid": 999999999, "kind": "talaria-gateway"}"#).unwrap();
        assert_eq!(running_gateway(&home), None);
        let pid_file = PidFile::acquire(&home).unwrap();
        assert_eq!(file_pid(&path), std::process::id());
        drop(pid_file);
    }

    /// Another process holding the lock, as a killed gateway would have.
    /// `None` (with a note) where flock(1) is missing.
    fn spawn_flock_holder(path: &Path) -> Option<std::process::Child> {
        if Command::new("flock")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_err()
        {
            eprintln!("note: flock(1) is not installed; skipping the cross-process test");
            return None;
        }
        let script = r#"exec 9>>"$1"; flock -x 9 || exit 1; printf '{"pid":%s}\n' "$$" >&9; echo locked; exec sleep 30"#;
        let mut child = Command::new("sh")
            .args(["-c", script, "sh"])
            .arg(path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "locked", "the helper could not take the lock");
        Some(child)
    }

    #[test]
    fn a_lock_held_by_another_process_blocks_until_it_dies() {
        let (_dir, home) = temp_home();
        create_private_dir(home.root()).unwrap();
        let path = home.gateway_pid_file();
        let Some(mut child) = spawn_flock_holder(&path) else {
            return;
        };
        match PidFile::acquire(&home) {
            Err(PidFileError::AlreadyRunning { pid }) => assert_eq!(pid, child.id()),
            other => panic!("expected AlreadyRunning, got {other:?}"),
        }
        assert_eq!(running_gateway(&home).map(|i| i.pid), Some(child.id()));

        child.kill().unwrap(); // SIGKILL: no cleanup, the file stays.
        child.wait().unwrap();
        assert_eq!(file_pid(&path), child.id());
        assert_eq!(running_gateway(&home), None);

        let pid_file = PidFile::acquire(&home).unwrap();
        assert_eq!(file_pid(&path), std::process::id());
        drop(pid_file);
        assert!(!path.exists());
    }

    #[test]
    fn an_empty_locked_file_names_its_holder_through_the_kernel() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let Acquired::Locked { lock, .. } = LockedFile::try_acquire(&path).unwrap() else {
            panic!("the lock should be free");
        };
        // Nothing written yet, as just after a holder took the lock.
        let probe = File::open(&path).unwrap();
        assert_eq!(holder_pid(&probe), std::process::id());
        drop(lock);
    }

    #[test]
    fn the_holder_is_found_in_proc_locks() {
        let table = "1: FLOCK  ADVISORY  WRITE 4242 00:2a:1234 0 EOF\n\
                     1: -> FLOCK  ADVISORY  WRITE 77 00:2a:1234 0 EOF\n\
                     2: POSIX  ADVISORY  WRITE 55 00:2a:999 0 EOF\n\
                     3: FLOCK  ADVISORY  READ 66 00:2a:777 0 EOF\n";
        assert_eq!(flock_holder(table, 1234), Some(4242));
        assert_eq!(flock_holder(table, 999), None);
        assert_eq!(flock_holder(table, 777), None);
        assert_eq!(flock_holder(table, 5), None);
    }

    #[test]
    fn status_round_trips() {
        let (_dir, home) = temp_home();
        create_private_dir(home.root()).unwrap();
        assert_eq!(read_status(&home).unwrap(), None);
        let status = GatewayStatus {
            node: None,
            pid: 42,
            started_at_unix: 1_700_000_000.25,
            state: "running".into(),
            adapters: BTreeMap::from([(
                "telegram".to_owned(),
                AdapterStatus {
                    liveness: "live".into(),
                    since: 1_700_000_001.5,
                    last_error: Some("was down".into()),
                },
            )]),
            running_sessions: vec!["agent:main:telegram:dm:1".into()],
            ledger: BTreeMap::from([("pending".to_owned(), 2)]),
            updated_at: 1_700_000_002.0,
        };
        write_status(&home, &status).unwrap();
        assert_eq!(read_status(&home).unwrap(), Some(status.clone()));
        let mode = std::fs::metadata(home.gateway_state_file())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // Overwriting leaves no temporary files behind.
        let stopped = GatewayStatus {
            node: None,
            state: "stopped".into(),
            ..status
        };
        write_status(&home, &stopped).unwrap();
        assert_eq!(read_status(&home).unwrap(), Some(stopped));
        let names: Vec<_> = std::fs::read_dir(home.root())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("gateway_state.json")]);

        std::fs::write(home.gateway_state_file(), b"{not json").unwrap();
        assert_eq!(
            read_status(&home).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn the_unit_runs_the_gateway_for_this_home() {
        let home = Home::at("/home/ann/.talaria");
        let unit = systemd_unit(Path::new("/usr/local/bin/talaria"), &home);
        assert!(unit.contains("ExecStart=/usr/local/bin/talaria gateway run\n"));
        assert!(unit.contains("Environment=TALARIA_HOME=/home/ann/.talaria\n"));
        for line in [
            "[Unit]",
            "Description=Talaria gateway",
            "Wants=network-online.target",
            "After=network-online.target",
            "RestartPreventExitStatus=78",
            "[Service]",
            "Restart=on-failure",
            "RestartSec=5",
            "KillSignal=SIGTERM",
            "TimeoutStopSec=60",
            "LimitNOFILE=65536",
            "[Install]",
            "WantedBy=default.target",
        ] {
            assert!(
                unit.lines().any(|l| l == line),
                "missing {line:?} in\n{unit}"
            );
        }
    }

    #[test]
    fn unit_paths_are_quoted_for_systemd() {
        let home = Home::at("/home/ann/My Talaria 100%");
        let unit = systemd_unit(Path::new("/opt/my apps/$bin/talaria"), &home);
        assert!(
            unit.contains("ExecStart=\"/opt/my apps/$$bin/talaria\" gateway run\n"),
            "{unit}"
        );
        assert!(
            unit.contains("Environment=\"TALARIA_HOME=/home/ann/My Talaria 100%%\"\n"),
            "{unit}"
        );
        assert_eq!(quote_systemd(br#"a"b\c"#, false), r#""a\"b\\c""#);
        assert_eq!(quote_systemd(b"a\xffb", false), r#""a\xffb""#);
        assert_eq!(quote_systemd(b"a\nb", false), r#""a\nb""#);
    }

    #[test]
    fn signal_stop_refuses_group_pids_and_wait_sees_exit() {
        assert_eq!(
            signal_stop(0).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert!(signal_stop(u32::MAX).is_err());

        let mut child = Command::new("sleep")
            .arg("30")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        let pinned = pin(pid);
        assert!(!wait_for_exit(&pinned, Duration::from_millis(50)));
        signal_stop(pid).unwrap();
        // The child exits on SIGTERM; until reaped it is a zombie, which
        // counts as exited.
        assert!(wait_for_exit(&pinned, Duration::from_secs(10)));
        child.wait().unwrap();
    }
}
