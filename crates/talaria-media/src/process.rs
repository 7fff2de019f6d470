//! Running a local program (a speech engine, ffmpeg) the careful way.
//!
//! The programs come from the configuration (`stt.command`, `tts.command`)
//! or are well-known tools, but what they are handed comes from users: a
//! voice note, a text to speak. So: no shell (the command line is split
//! into words, and a placeholder is replaced by one whole argument, which
//! no quoting in the user's text can escape); an environment holding only
//! what programs need to find themselves and their locale (the keys in
//! Talaria's environment never reach a child); a deadline, after which the
//! program and everything it started are killed; and bounded reads of
//! what it prints.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// The only variables a child gets: enough to find programs and libraries,
/// a home for their settings, a locale, a temporary directory.
const KEPT_VARS: [&str; 5] = ["PATH", "HOME", "LANG", "LC_ALL", "TMPDIR"];

/// How much of standard error is kept for an error message.
const STDERR_KEEP: usize = 4 * 1024;

/// How much of standard error is shown to a user.
const STDERR_SHOWN: usize = 300;

/// A program and its arguments, ready to run.
#[derive(Debug, Clone)]
pub(crate) struct Program {
    /// The program, then its arguments.
    pub words: Vec<OsString>,
    /// Written to standard input, which is then closed; `None` gives the
    /// program an empty standard input.
    pub stdin: Option<Vec<u8>>,
    /// The most of standard output kept.
    pub max_stdout: usize,
    /// How long it may run.
    pub timeout: Duration,
}

/// What a program that succeeded printed.
#[derive(Debug)]
pub(crate) struct Output {
    /// Standard output, at most `max_stdout` bytes of it.
    pub stdout: Vec<u8>,
    /// Whether standard output was longer than kept.
    pub truncated: bool,
}

/// Why a program did not succeed, in words for a user.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
    /// The command line is empty.
    #[error("the command is empty")]
    Empty,
    /// The program could not be started.
    #[error("cannot run `{program}`: {source}")]
    Spawn {
        /// The program's name.
        program: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// It ran past its deadline and was killed.
    #[error("`{program}` did not finish within {secs} s and was stopped")]
    Timeout {
        /// The program's name.
        program: String,
        /// The deadline, in seconds.
        secs: u64,
    },
    /// It exited with a failure.
    #[error("`{program}` failed ({status}){}", stderr_suffix(.stderr))]
    Failed {
        /// The program's name.
        program: String,
        /// How it ended.
        status: ExitStatus,
        /// The start of what it printed on standard error.
        stderr: String,
    },
    /// Reading what it printed failed.
    #[error("cannot read what `{program}` printed: {source}")]
    Io {
        /// The program's name.
        program: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!(": {stderr}")
    }
}

/// Splits a configured command line into words as a POSIX shell would
/// (quotes and backslashes), without running a shell.
pub(crate) fn split_command(line: &str) -> Result<Vec<String>, String> {
    let words = shell_words::split(line).map_err(|e| format!("cannot split `{line}`: {e}"))?;
    if words.is_empty() {
        return Err("the command is empty".to_owned());
    }
    Ok(words)
}

/// `words` with each `{name}` placeholder that makes up a whole word
/// replaced by its value, and those inside a word replaced in place; each
/// word stays one argument whatever the value holds.
pub(crate) fn fill(words: &[String], values: &[(&str, &OsString)]) -> Vec<OsString> {
    words
        .iter()
        .map(|word| {
            for (name, value) in values {
                if word == name {
                    return (*value).clone();
                }
            }
            // Inside a word (`--out={output}`): text replacement, which
            // needs the value as text.
            let mut out = word.clone();
            for (name, value) in values {
                if out.contains(name) {
                    out = out.replace(name, &value.to_string_lossy());
                }
            }
            OsString::from(out)
        })
        .collect()
}

/// Whether any word holds the placeholder.
pub(crate) fn mentions(words: &[String], name: &str) -> bool {
    words.iter().any(|w| w.contains(name))
}

/// `name` found in the directories of `PATH`, as a shell would find it.
pub(crate) fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    if !meta.is_file() {
        return false;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        meta.permissions().mode() & 0o111 != 0
    }
    #[cfg(not(unix))]
    {
        true
    }
}

/// The variables a child is given, taken from this process.
pub(crate) fn kept_env() -> Vec<(&'static str, OsString)> {
    KEPT_VARS
        .iter()
        .filter_map(|k| std::env::var_os(k).map(|v| (*k, v)))
        .collect()
}

/// Runs `program` and waits for it, within its deadline.
pub(crate) async fn run(program: Program) -> Result<Output, RunError> {
    let Some((first, args)) = program.words.split_first() else {
        return Err(RunError::Empty);
    };
    let name = first.to_string_lossy().into_owned();
    let mut command = tokio::process::Command::new(first);
    command
        .args(args)
        .env_clear()
        .envs(kept_env())
        .stdin(if program.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Dropping the future (the caller gave up) kills the program.
        .kill_on_drop(true);
    // Its own process group, so a timeout kills what it started too.
    #[cfg(unix)]
    command.process_group(0);
    let mut child = command.spawn().map_err(|source| RunError::Spawn {
        program: name.clone(),
        source,
    })?;
    let pid = child.id();
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let input = program.stdin;
    let max_stdout = program.max_stdout;

    let work = async {
        let feed = async {
            if let (Some(mut pipe), Some(bytes)) = (stdin, input) {
                // A program that does not read its input closes the pipe:
                // not an error of ours.
                let _ = pipe.write_all(&bytes).await;
                let _ = pipe.shutdown().await;
            }
        };
        let (_, out, err) = tokio::join!(
            feed,
            read_bounded(stdout, max_stdout),
            read_bounded(stderr, STDERR_KEEP)
        );
        let status = child.wait().await;
        (out, err, status)
    };
    let Ok((out, err, status)) = tokio::time::timeout(program.timeout, work).await else {
        kill_group(pid);
        // `kill_on_drop` reaps the direct child when `child` goes away.
        return Err(RunError::Timeout {
            program: name,
            secs: program.timeout.as_secs().max(1),
        });
    };
    let io = |source| RunError::Io {
        program: name.clone(),
        source,
    };
    let (stdout, truncated) = out.map_err(io)?;
    let status = status.map_err(io)?;
    if !status.success() {
        let (stderr, _) = err.unwrap_or_default();
        return Err(RunError::Failed {
            program: name.clone(),
            status,
            stderr: excerpt(&stderr),
        });
    }
    Ok(Output { stdout, truncated })
}

/// Kills the process group `pid` leads (the program and its children).
fn kill_group(pid: Option<u32>) {
    #[cfg(unix)]
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        use nix::sys::signal::{Signal, killpg};
        use nix::unistd::Pid;
        // Already gone is fine.
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }
    #[cfg(not(unix))]
    let _ = pid;
}

/// Reads all of `pipe`, keeping at most `max` bytes: the rest is read and
/// dropped, so a chatty program never blocks on a full pipe.
async fn read_bounded<R>(pipe: Option<R>, max: usize) -> std::io::Result<(Vec<u8>, bool)>
where
    R: AsyncRead + Unpin,
{
    let Some(mut pipe) = pipe else {
        return Ok((Vec::new(), false));
    };
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = pipe.read(&mut buf).await?;
        if n == 0 {
            return Ok((kept, truncated));
        }
        let room = max.saturating_sub(kept.len());
        if n > room {
            truncated = true;
        }
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
}

/// The first lines of a program's standard error, short enough to show.
fn excerpt(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let one_line: String = text
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    let mut shown: String = one_line.chars().take(STDERR_SHOWN).collect();
    if one_line.chars().count() > STDERR_SHOWN {
        shown.push('…');
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(words: &[&str]) -> Program {
        Program {
            words: words.iter().map(OsString::from).collect(),
            stdin: None,
            max_stdout: 1024,
            timeout: Duration::from_secs(10),
        }
    }

    #[test]
    fn placeholders_become_whole_arguments() {
        let words = split_command("prog --in {path} 'two words' x{path}y").unwrap();
        let path = OsString::from("/a b/c; rm -rf ~");
        let filled = fill(&words, &[("{path}", &path)]);
        assert_eq!(
            filled,
            vec![
                OsString::from("prog"),
                OsString::from("--in"),
                path.clone(),
                OsString::from("two words"),
                OsString::from("x/a b/c; rm -rf ~y"),
            ]
        );
        assert!(split_command("  ").is_err());
        assert!(split_command("prog 'unbalanced").is_err());
    }

    #[tokio::test]
    async fn children_get_no_secrets() {
        // The test process has variables a child must not see.
        let out = run(program(&["env"])).await.unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        for line in text.lines() {
            let key = line.split('=').next().unwrap_or("");
            assert!(KEPT_VARS.contains(&key), "leaked {key}");
        }
    }

    #[tokio::test]
    async fn output_is_bounded_and_the_rest_drained() {
        let mut p = program(&["sh", "-c", "head -c 200000 /dev/zero"]);
        p.max_stdout = 100;
        let out = run(p).await.unwrap();
        assert_eq!(out.stdout.len(), 100);
        assert!(out.truncated);
    }

    #[tokio::test]
    async fn a_failure_carries_a_stderr_excerpt() {
        let err = run(program(&[
            "sh",
            "-c",
            "echo 'bad thing\nhappened' >&2; exit 3",
        ]))
        .await
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("bad thing happened"), "{text}");
        assert!(matches!(err, RunError::Failed { .. }));
    }

    #[tokio::test]
    async fn a_slow_program_and_its_children_are_killed() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("still-alive");
        let script = format!("(sleep 2; touch '{}') & sleep 30", marker.display());
        let mut p = program(&["sh", "-c", &script]);
        p.timeout = Duration::from_millis(300);
        let started = std::time::Instant::now();
        let err = run(p).await.unwrap_err();
        assert!(matches!(err, RunError::Timeout { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert!(!marker.exists(), "a child outlived the timeout");
    }

    #[tokio::test]
    async fn a_missing_program_says_so() {
        let err = run(program(&["/nonexistent/talaria-no-such-program"]))
            .await
            .unwrap_err();
        assert!(matches!(err, RunError::Spawn { .. }), "{err}");
    }
}
