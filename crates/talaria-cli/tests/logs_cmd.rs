//! `talaria logs` as a real process: the tail of a planted log filtered by
//! level and time, the logs named when the one asked for is missing, and
//! `-f` following a file through appends, rotation and truncation until it
//! is told to stop, without reading a large file whole.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Command, Output, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use chrono::Utc;

const WAIT: Duration = Duration::from_secs(20);

fn command(home: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_talaria"));
    c.arg("--home")
        .arg(home)
        .args(args)
        .env_remove("TALARIA_HOME")
        .env_remove("TALARIA_PROFILE")
        .env_remove("TALARIA_LOG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    c
}

fn talaria(home: &Path, args: &[&str]) -> Output {
    command(home, args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn lines(out: &Output) -> Vec<String> {
    text(&out.stdout).lines().map(str::to_owned).collect()
}

/// A home with an empty `logs/`.
fn home() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join("logs")).unwrap();
    (dir, home)
}

/// A line as tracing writes it, `ago` before now.
fn record(ago: chrono::Duration, level: &str, message: &str) -> String {
    let at = Utc::now() - ago;
    format!(
        "{} {level:>5} {message}",
        at.format("%Y-%m-%dT%H:%M:%S%.6fZ")
    )
}

fn minutes(n: i64) -> chrono::Duration {
    chrono::Duration::minutes(n)
}

#[test]
fn the_tail_of_a_planted_log_is_filtered_by_level_and_time() {
    let (_dir, home) = home();
    let log = [
        record(minutes(180), "INFO", "old start"),
        record(minutes(170), "ERROR", "old failure"),
        "  detail of the old failure".to_owned(),
        record(minutes(30), "INFO", "recent start"),
        record(minutes(20), "WARN", "recent warning"),
        "  detail of the recent warning".to_owned(),
        record(minutes(10), "DEBUG", "recent chatter"),
        "  detail of the chatter".to_owned(),
        record(minutes(5), "ERROR", "recent failure"),
    ];
    std::fs::write(home.join("logs/gateway.log"), log.join("\n") + "\n").unwrap();
    std::fs::write(
        home.join("logs/talaria.log"),
        record(minutes(1), "INFO", "from a command") + "\n",
    )
    .unwrap();

    let all = talaria(&home, &["logs"]);
    assert!(all.status.success(), "{}", text(&all.stderr));
    assert_eq!(lines(&all), log);

    let last = talaria(&home, &["logs", "-n", "2"]);
    assert_eq!(lines(&last), log[7..]);

    let warn = talaria(&home, &["logs", "--level", "warn"]);
    assert!(warn.status.success(), "{}", text(&warn.stderr));
    assert_eq!(
        lines(&warn),
        [&log[1], &log[2], &log[4], &log[5], &log[8]].map(String::as_str)
    );

    let recent = talaria(&home, &["logs", "--since", "1h"]);
    assert_eq!(lines(&recent), log[3..]);

    let both = talaria(&home, &["logs", "--since", "45m", "--level", "WARNING"]);
    assert_eq!(
        lines(&both),
        [&log[4], &log[5], &log[8]].map(String::as_str)
    );

    let at = (Utc::now() - minutes(15)).to_rfc3339();
    let since_time = talaria(&home, &["logs", "--since", &at]);
    assert_eq!(lines(&since_time), log[6..]);

    let other = talaria(&home, &["logs", "talaria.log"]);
    assert!(text(&other.stdout).contains("from a command"));

    for (args, said) in [
        (
            &["logs", "--level", "loud"][..],
            "trace, debug, info, warn or error",
        ),
        (&["logs", "--since", "yesterday"], "a span back from now"),
        (&["logs", "-n", "10001"], "at most 10000"),
    ] {
        let out = talaria(&home, args);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            text(&out.stderr).contains(said),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn a_missing_log_is_named_with_the_logs_that_exist() {
    let (_dir, home) = home();
    let empty = talaria(&home, &["logs"]);
    assert!(!empty.status.success());
    assert!(
        text(&empty.stderr).contains("no other log there yet"),
        "{}",
        text(&empty.stderr)
    );

    std::fs::write(home.join("logs/talaria.log"), "one\n").unwrap();
    std::fs::write(home.join("logs/talaria.log.1"), "older\n").unwrap();
    for args in [&["logs"][..], &["logs", "-f"], &["logs", "nope.log"]] {
        let out = talaria(&home, args);
        assert!(!out.status.success(), "{args:?}");
        let said = text(&out.stderr);
        assert!(said.contains("there is no log"), "{said}");
        assert!(said.contains("  talaria.log (4 B)"), "{said}");
        assert!(said.contains("  talaria.log.1 (6 B)"), "{said}");
    }

    // Only names in logs/: no way out of it.
    std::fs::write(home.join("config.yaml"), "secret: yes\n").unwrap();
    let out = talaria(&home, &["logs", "../config.yaml"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not a path"),
        "{}",
        text(&out.stderr)
    );
    assert!(out.stdout.is_empty());
}

/// Lines a child writes to a pipe, read on a thread of their own.
fn reader<R: std::io::Read + Send + 'static>(pipe: R) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The next line, within [`WAIT`].
fn next(rx: &Receiver<String>) -> String {
    rx.recv_timeout(WAIT)
        .expect("no line from `talaria logs -f` in time")
}

/// Waits until a line containing `wanted` arrives.
fn wait_for(rx: &Receiver<String>, wanted: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no `{wanted}` in time"));
        if line.contains(wanted) {
            return;
        }
    }
}

fn append(path: &Path, lines: &[String]) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    for line in lines {
        writeln!(f, "{line}").unwrap();
    }
}

fn follow(home: &Path, args: &[&str]) -> (Child, Receiver<String>, Receiver<String>) {
    let mut child = command(home, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out: ChildStdout = child.stdout.take().unwrap();
    let err: ChildStderr = child.stderr.take().unwrap();
    (child, reader(out), reader(err))
}

fn signal(child: &Child, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "`talaria logs -f` did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn following_prints_appended_lines_across_rotation_and_truncation() {
    let (_dir, home) = home();
    let path = home.join("logs/gateway.log");
    append(
        &path,
        &[
            record(minutes(3), "WARN", "planted one"),
            record(minutes(2), "INFO", "planted two"),
            record(minutes(1), "ERROR", "planted three"),
        ],
    );
    let (mut child, out, err) = follow(&home, &["logs", "-f", "-n", "1", "--level", "warn"]);
    assert!(next(&out).ends_with("planted three"));

    // Appended lines, a quiet one among them, and a record's second line.
    append(
        &path,
        &[
            record(minutes(0), "INFO", "quiet"),
            record(minutes(0), "WARN", "appended"),
            "  its detail".to_owned(),
        ],
    );
    assert!(next(&out).ends_with("WARN appended"));
    assert_eq!(next(&out), "  its detail");

    // Rotation: the file is moved aside, its writer adds a last line to
    // it, and a new file takes the name.
    let rotated = home.join("logs/gateway.log.1");
    std::fs::rename(&path, &rotated).unwrap();
    append(
        &rotated,
        &[record(minutes(0), "ERROR", "last in the old file")],
    );
    assert!(next(&out).ends_with("last in the old file"));
    append(
        &path,
        &[record(minutes(0), "WARN", "first in the new file")],
    );
    assert!(next(&out).ends_with("first in the new file"));
    wait_for(&err, "was replaced");

    // Truncation in place (a copying rotation), then new lines.
    std::fs::write(&path, "").unwrap();
    wait_for(&err, "was truncated");
    append(&path, &[record(minutes(0), "ERROR", "after truncation")]);
    assert!(next(&out).ends_with("after truncation"));

    signal(&child, nix::sys::signal::Signal::SIGTERM);
    assert!(wait_exit(&mut child).success());
    // Nothing was printed that was not asked for.
    assert!(out.try_recv().is_err());
}

/// The peak resident memory of a running process, from /proc, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status")
}

#[test]
fn a_large_log_is_tailed_and_followed_in_bounded_memory() {
    let (_dir, home) = home();
    let path = home.join("logs/gateway.log");
    // Four GiB that cost no disk (a hole), then a few real lines.
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(4 << 30).unwrap();
    drop(file);
    append(
        &path,
        &[
            record(minutes(2), "INFO", "near the end"),
            record(minutes(1), "ERROR", "the one failure"),
            record(minutes(0), "INFO", "the very end"),
        ],
    );
    let tail = talaria(&home, &["logs", "-n", "2"]);
    assert!(tail.status.success(), "{}", text(&tail.stderr));
    assert_eq!(lines(&tail).len(), 2);
    assert!(lines(&tail)[1].ends_with("the very end"));

    // A filter that matches little stops at its scan limit and says so,
    // and following begins at the end.
    let (mut child, out, err) = follow(&home, &["logs", "-f", "--level", "error"]);
    assert!(next(&out).ends_with("the one failure"));
    wait_for(&err, "were searched");
    append(&path, &[record(minutes(0), "ERROR", "one more")]);
    assert!(next(&out).ends_with("one more"));
    let peak = peak_rss_kib(child.id());
    assert!(peak < 96 * 1024, "peak RSS {peak} KiB");
    signal(&child, nix::sys::signal::Signal::SIGINT);
    assert!(wait_exit(&mut child).success());
}
