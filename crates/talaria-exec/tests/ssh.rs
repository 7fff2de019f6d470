//! The ssh backend against a real OpenSSH server on 127.0.0.1 (this
//! machine is the "remote" host, so the tests can look at its processes).

use std::path::PathBuf;
use std::time::Duration;

use talaria_core::config::SshConfig;
use talaria_exec::ssh::{Ssh, quote};
use talaria_exec::{Backend, CommandSpec, ExecError, Exit, Running};
use talaria_testkit::sshd::{Sshd, keygen};
use talaria_testkit::wait::WAIT;
use tokio::io::AsyncReadExt;

const SECRET: &str = "TALARIA_TEST_SECRET_XYZ";
const SECRET_VALUE: &str = "planted-secret-0f3a9c";

fn config(sshd: &Sshd, workdir: &str) -> SshConfig {
    SshConfig {
        host: Some("127.0.0.1".to_owned()),
        port: sshd.port(),
        user: None,
        identity_file: Some(sshd.client_key()),
        known_hosts: Some(sshd.known_hosts()),
        workdir: workdir.to_owned(),
        connect_timeout_secs: 10,
    }
}

fn spec(command: &str) -> CommandSpec {
    CommandSpec {
        command: command.to_owned(),
        workdir: None,
        env: talaria_exec::env::child_env(std::env::vars_os(), &[]),
        stdin: false,
        pty: false,
    }
}

/// Everything the command printed, and how it ended.
async fn run(backend: &Ssh, spec: CommandSpec) -> (String, Exit) {
    let Running {
        mut output,
        mut process,
        ..
    } = backend.spawn(spec).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, output.read_to_end(&mut out))
        .await
        .expect("the output did not end")
        .unwrap();
    let exit = tokio::time::timeout(WAIT, process.wait())
        .await
        .expect("ssh did not exit")
        .unwrap();
    process.disarm();
    (String::from_utf8(out).unwrap(), exit)
}

fn unavailable(result: Result<Running, ExecError>) -> String {
    match result {
        Err(ExecError::Unavailable(msg)) => msg,
        Err(other) => panic!("expected Unavailable, got {other:?}"),
        Ok(_) => panic!("expected Unavailable, the command started"),
    }
}

#[tokio::test]
async fn output_and_exit_code_come_back() {
    let sshd = Sshd::start();
    let work = tempfile::tempdir().unwrap();
    let backend = Ssh::new(&config(&sshd, &work.path().display().to_string())).unwrap();
    let (out, exit) = run(
        &backend,
        spec("for i in 1 2 3; do echo out$i; echo err$i >&2; done; exit 7"),
    )
    .await;
    // One stream, in the order written, though stderr is a stream of its
    // own over the connection.
    assert_eq!(
        out,
        "out1\nerr1\nout2\nerr2\nout3\nerr3\n",
        "{}",
        sshd.log()
    );
    assert_eq!(exit.code, Some(7));
    let (out, exit) = run(&backend, spec("true")).await;
    assert_eq!((out.as_str(), exit.code), ("", Some(0)));
    // A command killed by a signal over there reads as a shell reports it.
    let (_, exit) = run(&backend, spec("kill -9 $$")).await;
    assert_eq!(exit.code, Some(128 + 9));
}

#[tokio::test]
async fn a_command_on_a_remote_terminal_is_typed_into_and_a_plain_stdin_is_refused() {
    use tokio::io::AsyncWriteExt;
    let sshd = Sshd::start();
    let work = tempfile::tempdir().unwrap();
    let backend = Ssh::new(&config(&sshd, &work.path().display().to_string())).unwrap();
    let mut running = backend
        .spawn(CommandSpec {
            pty: true,
            ..spec("tty; read x; echo got $x; exit 4")
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", sshd.log()));
    let mut keyboard = running.input.take().expect("a terminal has a keyboard");
    keyboard.write_all(b"keys\r").await.unwrap();
    keyboard.flush().await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, running.output.read_to_end(&mut out))
        .await
        .expect("the output did not end")
        .unwrap();
    let exit = tokio::time::timeout(WAIT, running.process.wait())
        .await
        .expect("ssh did not exit")
        .unwrap();
    let out = String::from_utf8_lossy(&out);
    assert!(out.contains("/dev/pts/"), "{out:?}");
    assert!(out.contains("got keys"), "{out:?}");
    assert!(!out.contains("talaria-ssh-ready"), "{out:?}");
    assert_eq!(exit.code, Some(4), "{out:?}");

    let msg = unavailable(
        backend
            .spawn(CommandSpec {
                stdin: true,
                ..spec("cat")
            })
            .await,
    );
    assert!(msg.contains("pty=true"), "{msg}");
}

#[tokio::test]
async fn the_remote_workdir_is_created_and_used() {
    let sshd = Sshd::start();
    let root = tempfile::tempdir().unwrap();
    let workdir = root.path().join("remote dir").join("it's here");
    let backend = Ssh::new(&config(&sshd, &workdir.display().to_string())).unwrap();
    let (out, exit) = run(&backend, spec("pwd; echo hi > made-here")).await;
    assert_eq!(exit.code, Some(0), "{out}");
    assert_eq!(out.trim_end(), workdir.display().to_string());
    assert_eq!(
        std::fs::read_to_string(workdir.join("made-here")).unwrap(),
        "hi\n"
    );

    // A command's own directory wins, relative to the workdir.
    std::fs::create_dir(workdir.join("sub")).unwrap();
    let mut s = spec("pwd");
    s.workdir = Some(PathBuf::from("sub"));
    let (out, _) = run(&backend, s).await;
    assert_eq!(out.trim_end(), workdir.join("sub").display().to_string());

    // One that is missing is an error in the output, not a run elsewhere.
    let mut s = spec("echo should-not-run");
    s.workdir = Some(PathBuf::from("missing"));
    let (out, exit) = run(&backend, s).await;
    assert_ne!(exit.code, Some(0));
    assert!(!out.contains("should-not-run"), "{out}");
}

#[tokio::test]
async fn a_changed_host_key_is_refused() {
    let sshd = Sshd::start();
    let mut c = config(&sshd, "/tmp");
    let wrong = sshd.wrong_known_hosts();
    c.known_hosts = Some(wrong.clone());
    let backend = Ssh::new(&c).unwrap();
    let msg = unavailable(backend.spawn(spec("echo reached")).await);
    assert!(msg.contains("does not match"), "{msg}");
    assert!(msg.contains(&wrong.display().to_string()), "{msg}");
    assert!(msg.contains("ssh-keygen -R"), "{msg}");
}

#[tokio::test]
async fn an_unknown_host_key_is_refused() {
    let sshd = Sshd::start();
    let mut c = config(&sshd, "/tmp");
    let empty = sshd.dir().join("empty_known_hosts");
    std::fs::write(&empty, "").unwrap();
    c.known_hosts = Some(empty.clone());
    let backend = Ssh::new(&c).unwrap();
    let msg = unavailable(backend.spawn(spec("echo reached")).await);
    assert!(msg.contains("is not in"), "{msg}");
    assert!(msg.contains(&empty.display().to_string()), "{msg}");
    assert!(msg.contains("ssh-keyscan"), "{msg}");
    // Nothing was learned: the file is still empty.
    assert_eq!(std::fs::read_to_string(&empty).unwrap(), "");
}

#[tokio::test]
async fn a_missing_or_unaccepted_key_is_refused() {
    let sshd = Sshd::start();
    let mut c = config(&sshd, "/tmp");
    c.identity_file = Some(sshd.dir().join("no-such-key"));
    let msg = match Ssh::new(&c) {
        Err(ExecError::Unavailable(msg)) => msg,
        other => panic!("expected Unavailable, got {other:?}"),
    };
    assert!(
        msg.contains("terminal.ssh.identity_file") && msg.contains("no-such-key"),
        "{msg}"
    );

    let stranger = sshd.dir().join("stranger_key");
    keygen(&stranger);
    c.identity_file = Some(stranger.clone());
    let backend = Ssh::new(&c).unwrap();
    let msg = unavailable(backend.spawn(spec("echo reached")).await);
    assert!(msg.contains("did not accept"), "{msg}");
    assert!(msg.contains(&stranger.display().to_string()), "{msg}");
}

#[test]
fn a_config_without_a_host_is_refused() {
    let msg = Ssh::new(&SshConfig::default()).unwrap_err().to_string();
    assert!(msg.contains("terminal.ssh.host"), "{msg}");
}

/// Runs the real test in a child test process that has [`SECRET`] in its
/// environment, as the gateway has its keys (setting it here would take
/// `unsafe`).
#[test]
fn secrets_of_this_process_do_not_reach_the_remote() {
    let name = "ssh::secrets_of_this_process_do_not_reach_the_remote_inner";
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--include-ignored"])
        .env(SECRET, SECRET_VALUE)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("test {name} ... ok")),
        "the inner test did not run: {stdout}"
    );
}

#[tokio::test]
#[ignore = "run by secrets_of_this_process_do_not_reach_the_remote with the secret planted"]
async fn secrets_of_this_process_do_not_reach_the_remote_inner() {
    assert_eq!(std::env::var(SECRET).unwrap(), SECRET_VALUE);
    let sshd = Sshd::start();
    let backend = Ssh::new(&config(&sshd, "/tmp")).unwrap();
    // Even passed through on purpose, the secret stays on this machine.
    let mut env = talaria_exec::env::child_env(std::env::vars_os(), &[SECRET.to_owned()]);
    assert!(env.iter().any(|(k, _)| k == SECRET));
    env.push(("LC_ALL".to_owned(), "C.UTF-8".to_owned()));
    let plain = CommandSpec {
        command: "env; echo; cat /proc/self/environ | tr '\\0' '\\n'".to_owned(),
        workdir: None,
        env: env.clone(),
        stdin: false,
        pty: false,
    };
    let (out, exit) = run(&backend, plain).await;
    assert_eq!(exit.code, Some(0), "{out}");
    // The export that is meant to happen did, so the output is the
    // command's environment and not an empty run.
    assert!(out.contains("PAGER=cat"), "{out}");
    assert!(out.contains("GIT_TERMINAL_PROMPT=0"), "{out}");
    assert!(out.contains("LC_ALL=C.UTF-8"), "{out}");
    assert!(
        !out.contains(SECRET_VALUE) && !out.contains(SECRET),
        "{out}"
    );

    let encoded = CommandSpec {
        command: "env | base64".to_owned(),
        workdir: None,
        env,
        stdin: false,
        pty: false,
    };
    let (out, exit) = run(&backend, encoded).await;
    assert_eq!(exit.code, Some(0), "{out}");
    let decoded = std::process::Command::new("sh")
        .args(["-c", "printf '%s' \"$1\" | base64 -d", "sh", &out])
        .output()
        .unwrap();
    let decoded = String::from_utf8_lossy(&decoded.stdout);
    assert!(decoded.contains("PAGER=cat"), "{decoded}");
    assert!(!decoded.contains(SECRET_VALUE), "{decoded}");
}

/// The processes on this machine whose command line holds `pattern`.
fn pgrep(pattern: &str) -> Vec<String> {
    let out = std::process::Command::new("pgrep")
        .args(["-a", "-f", pattern])
        .output()
        .expect("pgrep (procps) is needed for this test");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

async fn until_gone(pattern: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let left = pgrep(pattern);
        if left.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still running after the kill: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A `sleep` no other test or process runs: its argument is unique.
fn unique_sleep() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("sleep 300.{}{nanos:09}", std::process::id())
}

#[tokio::test]
async fn kill_stops_the_remote_command() {
    let sshd = Sshd::start();
    let backend = Ssh::new(&config(&sshd, "/tmp")).unwrap();
    let sleep = unique_sleep();
    // A child of a child, in the background: all of it must go.
    let command = format!("( {sleep} & {sleep}; ) ; echo never");
    let Running {
        mut output,
        mut process,
        ..
    } = backend.spawn(spec(&command)).await.unwrap();
    // Both sleeps are running on the "remote" side.
    let deadline = tokio::time::Instant::now() + WAIT;
    while pgrep(&format!("^{sleep}$")).len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sleeps never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    process.kill().await;
    until_gone(&sleep).await;
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, output.read_to_end(&mut out))
        .await
        .expect("the output did not end after the kill")
        .unwrap();
    assert!(!String::from_utf8_lossy(&out).contains("never"));
}

#[tokio::test]
async fn kill_hangs_up_a_remote_terminal_and_stops_its_command() {
    let sshd = Sshd::start();
    let backend = Ssh::new(&config(&sshd, "/tmp")).unwrap();
    let sleep = unique_sleep();
    let command = format!("( {sleep} & {sleep}; ) ; echo never");
    let mut running = backend
        .spawn(CommandSpec {
            pty: true,
            ..spec(&command)
        })
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while pgrep(&format!("^{sleep}$")).len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sleeps never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.process.kill().await;
    until_gone(&sleep).await;
}

#[tokio::test]
async fn dropping_the_process_stops_the_remote_command() {
    let sshd = Sshd::start();
    let backend = Ssh::new(&config(&sshd, "/tmp")).unwrap();
    let sleep = unique_sleep();
    let running = backend.spawn(spec(&sleep)).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while pgrep(&format!("^{sleep}$")).is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sleep never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(running);
    until_gone(&sleep).await;
}

#[tokio::test]
async fn awkward_commands_round_trip() {
    let sshd = Sshd::start();
    let backend = Ssh::new(&config(&sshd, "/tmp")).unwrap();
    let words = [
        "it's",
        "'",
        "\"double\" and 'single'",
        "$HOME `id -u` $(id -u) ${X:-y}",
        "line one\nline two\n",
        "back\\slash \\n \\'",
        "; exit 3 & | > /dev/null",
        "-n",
        "日本語 ✓",
        "",
    ];
    for w in words {
        let (out, exit) = run(&backend, spec(&format!("printf '%s' {}", quote(w)))).await;
        assert_eq!(exit.code, Some(0), "{w:?}: {out}");
        assert_eq!(out, w);
    }
    // Shell syntax in the command is the remote shell's to run.
    let (out, _) = run(&backend, spec("x=$((6*7)); echo \"it's $x\"")).await;
    assert_eq!(out, "it's 42\n");
}
