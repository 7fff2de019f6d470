//! The `terminal` and file tools in an untrusted conversation, through the
//! real bubblewrap sandbox: what a command there cannot reach (the home's
//! secrets, the host's files and network, the gateway's processes, another
//! chat's workspace), its CPU limit, and the file tools kept inside the
//! workspace. bubblewrap must be installed (`scripts/test` installs it):
//! these tests fail without it.

use crate::tools_support;

use std::io::Read;
use std::net::TcpListener;

use serde_json::{Value, json};
use talaria_agent::Execution;
use talaria_agent::tools::Tool;
use talaria_agent::tools::files::{ReadFileTool, WriteFileTool};
use talaria_agent::tools::terminal::TerminalTool;
use talaria_core::Config;
use talaria_exec::{BackendKind, Backends, Trust};
use tools_support::{Env, Scripted, json};

const SECRET: &str = "dotenv-secret-planted-5551234";

/// A tool environment whose conversation `chat` is untrusted, with the
/// sandbox as the untrusted backend, and the home holding a `.env` and a
/// `state.db` with a secret in each.
async fn sandboxed(config: Config, chat: &str) -> (Env, Backends) {
    assert!(
        talaria_exec::find_program("bwrap").is_some(),
        "bubblewrap (bwrap) is not installed: scripts/test installs it (apt install bubblewrap)"
    );
    let mut env = Env::with(config, Scripted::with(&[]));
    let home = env.ctx.home.root().to_path_buf();
    std::fs::write(home.join(".env"), format!("SOME_KEY={SECRET}\n")).unwrap();
    std::fs::write(home.join("state.db"), format!("rows {SECRET}")).unwrap();
    let backends = Backends::new(&env.ctx.config.terminal, &env.ctx.home, env.work());
    env.ctx.execution = Execution::for_conversation(&backends, Trust::Untrusted, chat).await;
    if let Err(e) = &env.ctx.execution.backend {
        panic!("the sandbox cannot start here: {e}");
    }
    (env, backends)
}

async fn run(env: &Env, command: &str) -> Value {
    json(
        &TerminalTool::default()
            .call(json!({"command": command, "timeout": 60}), &env.ctx)
            .await
            .unwrap(),
    )
}

fn output(v: &Value) -> String {
    v["output"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn a_sandboxed_command_cannot_read_the_home() {
    let (env, _b) = sandboxed(Config::default(), "telegram:group:-1").await;
    let home = env.ctx.home.root().display().to_string();
    // Named outright: in the sandbox the check on command lines naming the
    // home's credential files is off, so this shows the sandbox stops it.
    let out = run(
        &env,
        &format!(
            "ls {home}; cat {home}/state.db; cat {home}/.env; \
             find / -xdev -name state.db 2>/dev/null; echo end"
        ),
    )
    .await;
    let text = output(&out);
    assert!(text.contains("No such file or directory"), "{text}");
    assert!(text.contains("end"), "{text}");
    assert!(!text.contains(SECRET), "{text}");
    assert!(!text.contains("state.db\n"), "found the database: {text}");
    // The user's own home is not there either.
    let out = run(&env, "echo $HOME; ls /root /home 2>&1; pwd").await;
    let text = output(&out);
    assert!(text.starts_with("/workspace\n"), "{text}");
    assert!(text.trim_end().ends_with("/workspace"), "{text}");
}

#[tokio::test]
async fn a_sandboxed_command_writes_only_into_its_workspace() {
    let (env, _b) = sandboxed(Config::default(), "telegram:group:-2").await;
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("escaped");
    let out = run(
        &env,
        &format!(
            "touch '{}' 2>&1; touch /usr/escaped 2>&1; echo kept > /workspace/kept.txt; \
             echo tmp > /tmp/t && cat /tmp/t",
            target.display()
        ),
    )
    .await;
    let text = output(&out);
    assert!(!target.exists(), "{text}");
    assert!(!std::path::Path::new("/usr/escaped").exists(), "{text}");
    assert!(
        text.contains("Read-only file system") || text.contains("No such file"),
        "{text}"
    );
    let ws = env
        .ctx
        .execution
        .workspace
        .as_ref()
        .unwrap()
        .host()
        .to_path_buf();
    assert_eq!(
        std::fs::read_to_string(ws.join("kept.txt")).unwrap(),
        "kept\n"
    );
    assert!(text.contains("tmp"), "{text}");
}

#[tokio::test]
async fn without_network_a_sandboxed_command_cannot_reach_the_hosts_loopback() {
    let (env, _b) = sandboxed(Config::default(), "telegram:group:-3").await;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let out = run(
        &env,
        &format!("bash -c 'echo hello > /dev/tcp/127.0.0.1/{port}' 2>&1; echo status=$?"),
    )
    .await;
    let text = output(&out);
    assert!(text.contains("status=1"), "{text}");
    // The command has finished: a connection it made would be waiting.
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        Ok((mut s, _)) => {
            let mut got = String::new();
            let _ = s.read_to_string(&mut got);
            panic!("the sandbox reached the host's loopback and sent {got:?}");
        }
        Err(e) => panic!("{e}"),
    }
    // The same command on the host does connect: the test can fail.
    let local = Env::new();
    let out = run(
        &local,
        &format!("bash -c 'echo hello > /dev/tcp/127.0.0.1/{port}' 2>&1; echo status=$?"),
    )
    .await;
    assert!(output(&out).contains("status=0"), "{out}");
    listener.set_nonblocking(false).unwrap();
    assert!(listener.accept().is_ok());
}

#[tokio::test]
async fn a_sandboxed_command_cannot_see_the_gateways_processes() {
    let (env, _b) = sandboxed(Config::default(), "telegram:group:-4").await;
    // A process of the host with a name nothing else has.
    let mut marker = std::process::Command::new("sleep")
        .arg("4242.1717")
        .spawn()
        .unwrap();
    let out = run(
        &env,
        "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done",
    )
    .await;
    let text = output(&out);
    assert!(!text.contains("4242.1717"), "{text}");
    let procs = text.lines().filter(|l| !l.trim().is_empty()).count();
    assert!(procs < 10, "the sandbox sees {procs} processes: {text}");
    // On the host the same loop sees it: the test can fail.
    let local = Env::new();
    let out = run(
        &local,
        "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>/dev/null; echo; done",
    )
    .await;
    assert!(output(&out).contains("4242.1717"));
    marker.kill().unwrap();
    marker.wait().unwrap();
}

#[tokio::test]
async fn a_sandboxed_command_is_killed_at_its_cpu_limit() {
    let mut config = Config::default();
    config.terminal.sandbox.cpu_secs = 1;
    let (env, _b) = sandboxed(config, "telegram:group:-5").await;
    let out = run(&env, "while :; do :; done").await;
    // SIGXCPU at the soft limit or SIGKILL at the hard one, long before
    // the 60 s timeout; the sandbox's init reports the signal as 128 + it.
    assert!(out["timed_out"].is_null(), "{out}");
    let signal = out["signal"]
        .as_i64()
        .or_else(|| out["exit_code"].as_i64().map(|c| c - 128));
    assert!(
        matches!(signal, Some(24) | Some(9)),
        "not killed by the CPU limit: {out}"
    );
    // Without the limit the same loop runs until the timeout: the test can
    // fail.
    let mut config = Config::default();
    config.terminal.sandbox.cpu_secs = 0;
    let (env, _b) = sandboxed(config, "telegram:group:-5b").await;
    let out = json(
        &TerminalTool::default()
            .call(
                json!({"command": "while :; do :; done", "timeout": 3}),
                &env.ctx,
            )
            .await
            .unwrap(),
    );
    assert_eq!(out["timed_out"], true, "{out}");
}

#[tokio::test]
async fn two_chats_cannot_see_each_others_workspace() {
    let (a, backends) = sandboxed(Config::default(), "telegram:group:-6").await;
    let mut b = Env::with(Config::default(), Scripted::with(&[]));
    // Same home and workspaces root as `a`, another chat.
    b.ctx.home = a.ctx.home.clone();
    b.ctx.execution =
        Execution::for_conversation(&backends, Trust::Untrusted, "telegram:group:-7").await;
    run(&a, "echo mine > /workspace/a-only.txt").await;
    let a_host = a
        .ctx
        .execution
        .workspace
        .as_ref()
        .unwrap()
        .host()
        .to_path_buf();
    assert!(a_host.join("a-only.txt").exists());
    let out = run(
        &b,
        &format!(
            "ls -a /workspace; cat '{}/a-only.txt' 2>&1; ls '{}' 2>&1",
            a_host.display(),
            a_host.parent().unwrap().display()
        ),
    )
    .await;
    let text = output(&out);
    assert!(
        !text.contains("a-only.txt\n") && !text.contains("mine"),
        "{text}"
    );
    assert!(text.contains("No such file or directory"), "{text}");
    // Nor with the file tools.
    let e = ReadFileTool
        .call(
            json!({"path": a_host.join("a-only.txt").display().to_string()}),
            &b.ctx,
        )
        .await
        .unwrap_err();
    assert!(e.0.contains("outside this conversation's workspace"), "{e}");
}

#[tokio::test]
async fn file_tools_stay_inside_the_workspace() {
    let (env, _b) = sandboxed(Config::default(), "telegram:group:-8").await;
    for path in [
        "/etc/hostname",
        "../outside.txt",
        "/workspace/../etc/passwd",
    ] {
        let e = ReadFileTool
            .call(json!({"path": path}), &env.ctx)
            .await
            .unwrap_err();
        assert!(e.0.contains("outside"), "{path}: {e}");
    }
    let e = WriteFileTool
        .call(json!({"path": "../escaped.txt", "content": "x"}), &env.ctx)
        .await
        .unwrap_err();
    assert!(e.0.contains("outside"), "{e}");
    let out = WriteFileTool
        .call(
            json!({"path": "/workspace/notes/a.txt", "content": "hello\n"}),
            &env.ctx,
        )
        .await
        .unwrap();
    assert!(out.contains("/workspace/notes/a.txt"), "{out}");
    assert!(
        !out.contains(env.ctx.home.root().to_str().unwrap()),
        "{out}"
    );
    // What the file tool wrote, the command sees where it said.
    let seen = run(&env, "cat notes/a.txt").await;
    assert_eq!(output(&seen), "hello\n");
    // A link planted by a command cannot lead the file tools out.
    run(&env, "ln -s /etc escape").await;
    let e = ReadFileTool
        .call(json!({"path": "escape/hostname"}), &env.ctx)
        .await
        .unwrap_err();
    assert!(e.0.contains("symbolic link"), "{e}");
}

#[tokio::test]
async fn an_isolated_command_is_not_held_for_approval_but_hardline_still_blocks() {
    let (env, _b) = sandboxed(Config::default(), "telegram:group:-9").await;
    assert_eq!(env.ctx.execution.kind, BackendKind::Sandbox);
    // Would ask on the host (a recursive delete); nobody is asked here.
    let out = run(&env, "mkdir -p d/e && rm -rf d && echo gone").await;
    assert!(output(&out).contains("gone"), "{out}");
    assert!(env.human.asked().is_empty());
    // The hardline list holds everywhere.
    let blocked = TerminalTool::default()
        .call(json!({"command": "rm -rf /"}), &env.ctx)
        .await
        .unwrap();
    assert!(blocked.contains("BLOCKED (hardline)"), "{blocked}");
}

#[tokio::test]
async fn the_seccomp_filter_refuses_tracing_and_new_namespaces() {
    let probe = "unshare --user true 2>&1; echo unshare=$?; \
                 python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); \
                 r = l.syscall(101, 0, 0, 0, 0); print(\"ptrace\", r, ctypes.get_errno())'";
    let (env, _b) = sandboxed(Config::default(), "telegram:group:-10").await;
    let text = output(&run(&env, probe).await);
    assert!(
        text.contains("Operation not permitted") && text.contains("unshare=1"),
        "{text}"
    );
    assert!(text.contains("ptrace -1 1"), "{text}");
    // Without the filter both work in the same sandbox: the test can fail.
    let mut config = Config::default();
    config.terminal.sandbox.seccomp = false;
    let (env, _b) = sandboxed(config, "telegram:group:-11").await;
    let text = output(&run(&env, probe).await);
    assert!(text.contains("unshare=0"), "{text}");
    assert!(text.contains("ptrace 0 0"), "{text}");
}
