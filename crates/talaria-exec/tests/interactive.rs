//! Commands that take input: a stdin pipe and a pseudo-terminal, on the
//! host and in the bubblewrap sandbox (with its seccomp filter, which then
//! comes in on another descriptor). bubblewrap must be installed.

use std::time::Duration;

use talaria_core::{Config, Home};
use talaria_exec::local::Local;
use talaria_exec::{Backend, Backends, CommandSpec, Exit, Running, Trust};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(30);

fn spec(command: &str, stdin: bool, pty: bool) -> CommandSpec {
    CommandSpec {
        stdin,
        pty,
        ..CommandSpec::new(
            command,
            None,
            talaria_exec::env::child_env(std::env::vars_os(), &[]),
        )
    }
}

/// Writes `input`, reads the output to its end, closes the input, waits.
async fn converse(running: Running, input: &[u8]) -> (String, Exit) {
    let Running {
        mut output,
        input: stdin,
        mut process,
    } = running;
    let mut stdin = stdin.expect("an input was asked for");
    stdin.write_all(input).await.unwrap();
    stdin.flush().await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, output.read_to_end(&mut out))
        .await
        .expect("the output did not end")
        .unwrap();
    drop(stdin);
    let exit = tokio::time::timeout(WAIT, process.wait())
        .await
        .expect("the command did not exit")
        .unwrap();
    (String::from_utf8_lossy(&out).into_owned(), exit)
}

#[tokio::test]
async fn a_local_command_reads_what_is_written_to_its_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let local = Local::new(dir.path());
    let running = local
        .spawn(spec("read x; echo got $x; tty || true", true, false))
        .await
        .unwrap();
    let (out, exit) = converse(running, b"hello\n").await;
    assert_eq!(exit.code, Some(0), "{out}");
    assert!(out.contains("got hello"), "{out}");
    assert!(out.contains("not a tty"), "{out}");
}

#[tokio::test]
async fn a_foreground_command_has_no_input() {
    let dir = tempfile::tempdir().unwrap();
    let running = Local::new(dir.path())
        .spawn(spec("true", false, false))
        .await
        .unwrap();
    assert!(running.input.is_none());
}

#[tokio::test]
async fn a_local_command_on_a_terminal_sees_one() {
    let dir = tempfile::tempdir().unwrap();
    let local = Local::new(dir.path());
    let running = local
        .spawn(spec("tty; read x; echo got $x", false, true))
        .await
        .unwrap();
    let (out, exit) = converse(running, b"typed\n").await;
    assert_eq!(exit.code, Some(0), "{out}");
    assert!(out.contains("/dev/pts/"), "{out}");
    assert!(out.contains("got typed"), "{out}");
    // A terminal ends its lines with CR LF.
    assert!(out.contains("\r\n"), "{out:?}");
}

async fn sandbox() -> (tempfile::TempDir, std::sync::Arc<dyn Backend>) {
    assert!(
        talaria_exec::find_program("bwrap").is_some(),
        "bubblewrap (bwrap) is not installed: scripts/test installs it"
    );
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path().join("home"));
    home.ensure().unwrap();
    let config = Config::default();
    assert!(config.terminal.sandbox.seccomp);
    let backends = Backends::new(&config.terminal, &home, dir.path().to_path_buf());
    let backend = backends
        .backend(Trust::Untrusted, "chat-1")
        .await
        .unwrap_or_else(|e| panic!("the sandbox cannot start here: {e}"));
    (dir, backend)
}

#[tokio::test]
async fn a_sandboxed_command_reads_its_stdin_under_the_seccomp_filter() {
    let (_dir, backend) = sandbox().await;
    // unshare is one of the calls the filter refuses: it proves the filter
    // was loaded from the other descriptor.
    let running = backend
        .spawn(spec(
            "read x; echo got $x; pwd; command -v unshare >/dev/null || echo no-unshare; \
             unshare -U true 2>/dev/null && echo unshared || echo refused",
            true,
            false,
        ))
        .await
        .unwrap();
    let (out, exit) = converse(running, b"sandboxed\n").await;
    assert_eq!(exit.code, Some(0), "{out}");
    assert!(out.contains("got sandboxed"), "{out}");
    assert!(out.contains("/workspace"), "{out}");
    assert!(!out.contains("no-unshare"), "{out}");
    assert!(out.contains("refused"), "{out}");
}

#[tokio::test]
async fn a_sandboxed_command_can_run_on_a_terminal() {
    let (_dir, backend) = sandbox().await;
    let running = backend
        .spawn(spec(
            "test -t 0 && echo terminal; read x; echo got $x",
            false,
            true,
        ))
        .await
        .unwrap();
    let (out, exit) = converse(running, b"keys\n").await;
    assert_eq!(exit.code, Some(0), "{out}");
    assert!(out.contains("terminal"), "{out}");
    assert!(out.contains("got keys"), "{out}");
}
