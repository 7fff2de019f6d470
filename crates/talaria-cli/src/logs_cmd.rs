//! `talaria logs [FILE] [-f] [--level LEVEL] [--since WHEN] [-n LINES]`:
//! a log under `$TALARIA_HOME/logs/`.
//!
//! The last lines are read backwards through `talaria_core::logs`, the
//! reader `GET /api/logs` uses, so memory stays within a chunk and the
//! lines shown however large the file is. `-f` then reads what is
//! appended, a chunk at a time, the way `tail -F` does: when the file is
//! truncated it starts again from its beginning, and when another file
//! takes its name (rotation) it finishes the old one and goes on with the
//! new one. A line longer than `MAX_LINE_BYTES` is cut there, as the tail
//! cuts it, so a partial line never grows without bound.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use talaria_core::Home;
use talaria_core::logs::{
    self, CHUNK, Forwards, GATEWAY_LOG, MAX_LINE_BYTES, Query, line_text, valid_name,
};
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::LogsArgs;

/// The most lines `-n` may ask for: what is shown is held in memory until
/// it is printed, oldest first.
const MAX_LINES: usize = 10_000;

/// The most bytes a tail reads looking for its lines: a filter that
/// matches little stops here and says so.
const SCAN_LIMIT: u64 = 256 * 1024 * 1024;

/// How often `-f` looks for new lines when there were none.
const POLL: Duration = Duration::from_millis(200);

/// The most files named when the one asked for is not there.
const MAX_FILES_NAMED: usize = 50;

pub async fn run(home: &Home, args: LogsArgs) -> anyhow::Result<ExitCode> {
    let dir = home.logs_dir();
    let name = args.file.unwrap_or_else(|| GATEWAY_LOG.to_owned());
    if !valid_name(&name) {
        bail!(
            "`{}` is not the name of a file in {}; give a name from there, not a path",
            name.escape_debug(),
            dir.display()
        );
    }
    if args.lines > MAX_LINES {
        bail!("-n is at most {MAX_LINES} lines");
    }
    let path = dir.join(&name);
    let file = open(&dir, &name, &path)?;
    let size = file
        .metadata()
        .with_context(|| format!("cannot read {}", path.display()))?
        .len();
    let query = Query {
        level: args.level,
        since: args.since,
        ..Query::last(args.lines, SCAN_LIMIT)
    };
    // Listened for before anything is printed: a signal that comes as
    // soon as a line shows must find its handler in place.
    let signals = if args.follow {
        let listen = |kind: SignalKind, name: &str| {
            signal(kind).with_context(|| format!("cannot listen for {name}"))
        };
        Some((
            listen(SignalKind::interrupt(), "SIGINT")?,
            listen(SignalKind::terminate(), "SIGTERM")?,
        ))
    } else {
        None
    };
    // Reading is blocking file I/O; it runs off the async threads.
    let shown = {
        let (query, path) = (query.clone(), path.clone());
        tokio::task::spawn_blocking(move || print_tail(&file, size, &query, &path).map(|()| file))
            .await
            .context("the log reader stopped")??
    };
    let Some((mut interrupt, mut terminate)) = signals else {
        return Ok(ExitCode::SUCCESS);
    };
    let stop = Arc::new(AtomicBool::new(false));
    let mut follower = {
        let stop = stop.clone();
        let mut follower = Follower::new(path, shown, size, Forwards::new(query))?;
        tokio::task::spawn_blocking(move || follower.run(&stop))
    };
    tokio::select! {
        ended = &mut follower => {
            // Only an error ends it by itself (a closed stdout, a read
            // that failed).
            ended.context("the log follower stopped")??;
            return Ok(ExitCode::SUCCESS);
        }
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    stop.store(true, Ordering::Relaxed);
    follower.await.context("the log follower stopped")??;
    Ok(ExitCode::SUCCESS)
}

/// The plain file `name` in `dir`; when there is none, an error naming the
/// files that are there.
fn open(dir: &Path, name: &str, path: &Path) -> anyhow::Result<File> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_file() => {
            File::open(path).with_context(|| format!("cannot open {}", path.display()))
        }
        Ok(_) => bail!("{} is not a plain file", path.display()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let (files, more) = logs::list(dir, MAX_FILES_NAMED)
                .with_context(|| format!("cannot list {}", dir.display()))?;
            if files.is_empty() {
                bail!(
                    "there is no log {name} in {}, and no other log there yet (the gateway \
                     writes gateway.log when `talaria gateway start` runs it; other commands \
                     write talaria.log)",
                    dir.display()
                );
            }
            let mut named: Vec<String> = files
                .iter()
                .map(|f| format!("  {} ({})", f.name, crate::human_bytes(f.size)))
                .collect();
            if more {
                named.push("  …".to_owned());
            }
            bail!(
                "there is no log {name} in {}; the logs there are:\n{}",
                dir.display(),
                named.join("\n")
            )
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Prints the last lines of the first `size` bytes of `file`.
fn print_tail(file: &File, size: u64, query: &Query, path: &Path) -> anyhow::Result<()> {
    let tail =
        logs::tail(file, size, query).with_context(|| format!("cannot read {}", path.display()))?;
    let mut out = io::stdout().lock();
    for line in &tail.lines {
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    // The count reached leaves the rest unread on purpose; the scan limit
    // reached before it is worth a word.
    if tail.truncated && tail.lines.len() < query.lines {
        eprintln!(
            "talaria: only the last {} MiB of {} were searched",
            SCAN_LIMIT / (1024 * 1024),
            path.display()
        );
    }
    Ok(())
}

/// A log file followed as it grows, the way `tail -F` follows one.
struct Follower {
    path: PathBuf,
    file: File,
    /// The device and inode of `file`, to tell when another file has
    /// taken its name.
    id: (u64, u64),
    /// Where the next read starts.
    pos: u64,
    /// The start of a line whose end has not been written yet.
    partial: Vec<u8>,
    /// Within a line cut at [`MAX_LINE_BYTES`]: the rest of it is skipped.
    skipping: bool,
    filter: Forwards,
    chunk: Vec<u8>,
}

impl Follower {
    fn new(path: PathBuf, file: File, pos: u64, filter: Forwards) -> anyhow::Result<Follower> {
        let meta = file
            .metadata()
            .with_context(|| format!("cannot read {}", path.display()))?;
        Ok(Follower {
            path,
            file,
            id: (meta.dev(), meta.ino()),
            pos,
            partial: Vec::new(),
            skipping: false,
            filter,
            chunk: vec![0; CHUNK],
        })
    }

    /// Follows until `stop` is set, or printing fails.
    fn run(&mut self, stop: &AtomicBool) -> anyhow::Result<()> {
        let mut out = io::stdout().lock();
        while !stop.load(Ordering::Relaxed) {
            let progressed = self.step(&mut out)?;
            out.flush()?;
            if !progressed {
                std::thread::sleep(POLL);
            }
        }
        Ok(())
    }

    /// Reads and prints at most a chunk of new lines, or moves on to the
    /// file that took this one's name; whether there was anything to do.
    fn step(&mut self, out: &mut impl Write) -> anyhow::Result<bool> {
        let len = self
            .file
            .metadata()
            .with_context(|| format!("cannot read {}", self.path.display()))?
            .len();
        if len < self.pos {
            eprintln!(
                "talaria: {} was truncated; following it from its start",
                self.path.display()
            );
            self.pos = 0;
            self.partial.clear();
            self.skipping = false;
            return Ok(true);
        }
        if len > self.pos {
            let n = usize::try_from(len - self.pos).map_or(CHUNK, |left| left.min(CHUNK));
            let read = self
                .file
                .read_at(&mut self.chunk[..n], self.pos)
                .with_context(|| format!("cannot read {}", self.path.display()))?;
            if read > 0 {
                self.pos += read as u64;
                let bytes = std::mem::take(&mut self.chunk);
                let fed = self.feed(&bytes[..read], out);
                self.chunk = bytes;
                fed?;
                return Ok(true);
            }
        }
        // All of this file is read: has another taken its name?
        let Ok(meta) = std::fs::symlink_metadata(&self.path) else {
            // Moved away and not yet made again: wait for it.
            return Ok(false);
        };
        if !meta.is_file() || (meta.dev(), meta.ino()) == self.id {
            return Ok(false);
        }
        let Ok(file) = File::open(&self.path) else {
            return Ok(false);
        };
        // The old file's last line, if it never got its newline.
        if !self.partial.is_empty() {
            let line = line_text(&std::mem::take(&mut self.partial), false);
            self.emit(&line, out)?;
        }
        eprintln!(
            "talaria: {} was replaced (rotated); following the new file",
            self.path.display()
        );
        self.file = file;
        self.id = (meta.dev(), meta.ino());
        self.pos = 0;
        self.skipping = false;
        Ok(true)
    }

    /// Splits `bytes` into lines, keeping an unfinished one for later.
    fn feed(&mut self, bytes: &[u8], out: &mut impl Write) -> io::Result<()> {
        let mut rest = bytes;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            if self.skipping {
                self.skipping = false;
            } else {
                self.partial.extend_from_slice(&rest[..i]);
                let line = line_text(&std::mem::take(&mut self.partial), false);
                self.emit(&line, out)?;
            }
            rest = &rest[i + 1..];
        }
        if self.skipping {
            return Ok(());
        }
        let room = MAX_LINE_BYTES - self.partial.len();
        if rest.len() > room {
            self.partial.extend_from_slice(&rest[..room]);
            let line = line_text(&std::mem::take(&mut self.partial), true);
            self.skipping = true;
            return self.emit(&line, out);
        }
        self.partial.extend_from_slice(rest);
        Ok(())
    }

    fn emit(&mut self, line: &str, out: &mut impl Write) -> io::Result<()> {
        if self.filter.keep(line) {
            writeln!(out, "{line}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn follower(dir: &Path, query: Query) -> Follower {
        let path = dir.join("t.log");
        std::fs::write(&path, "").unwrap();
        let file = File::open(&path).unwrap();
        Follower::new(path, file, 0, Forwards::new(query)).unwrap()
    }

    fn append(path: &Path, text: &[u8]) {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
        f.write_all(text).unwrap();
    }

    /// Steps until there is nothing left to do; what was printed.
    fn drain(f: &mut Follower) -> String {
        let mut out = Vec::new();
        while f.step(&mut out).unwrap() {}
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn lines_are_printed_once_whole_and_long_ones_cut() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = follower(dir.path(), Query::last(0, 0));
        let path = dir.path().join("t.log");
        append(&path, b"one\ntw");
        assert_eq!(drain(&mut f), "one\n");
        append(&path, b"o\n");
        assert_eq!(drain(&mut f), "two\n");
        let long = "x".repeat(3 * CHUNK);
        append(&path, format!("{long}\nafter\n").as_bytes());
        let printed = drain(&mut f);
        let lines: Vec<&str> = printed.lines().collect();
        assert_eq!(lines.len(), 2, "{}", &printed[..40]);
        assert_eq!(lines[0].len(), MAX_LINE_BYTES + logs::CUT.len());
        assert_eq!(lines[1], "after");
        assert!(f.partial.capacity() <= 2 * MAX_LINE_BYTES);
    }

    #[test]
    fn truncation_and_rotation_are_followed() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = follower(dir.path(), Query::last(0, 0));
        let path = dir.path().join("t.log");
        append(&path, b"before\n");
        assert_eq!(drain(&mut f), "before\n");
        // Truncated in place (copytruncate), then written again.
        std::fs::write(&path, "").unwrap();
        assert_eq!(drain(&mut f), "");
        append(&path, b"after truncation\n");
        assert_eq!(drain(&mut f), "after truncation\n");
        // Renamed away, the old file written once more, a new one made.
        std::fs::rename(&path, dir.path().join("t.log.1")).unwrap();
        append(
            &dir.path().join("t.log.1"),
            b"late in the old file\nno newline",
        );
        assert_eq!(drain(&mut f), "late in the old file\n");
        std::fs::write(&path, "first of the new file\n").unwrap();
        assert_eq!(drain(&mut f), "no newline\nfirst of the new file\n");
    }
}
