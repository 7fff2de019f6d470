//! The `execute_code` tool with a real `python3`: scripts that call
//! Talaria's tools through the generated module over the Unix socket, the
//! limits (time, tool calls, request size), what the conversation does not
//! offer, a missing interpreter, the interrupt, and a run in the real
//! bubblewrap sandbox (bubblewrap must be installed, as for
//! `tools_sandbox`).

use crate::tools_support;

use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};
use talaria_agent::Execution;
use talaria_agent::tools::execute_code::ExecuteCodeTool;
use talaria_agent::tools::terminal::DENIED_PREFIX;
use talaria_agent::tools::{Registry, Tool};
use talaria_core::Config;
use talaria_exec::{Backends, Trust};
use talaria_testkit::wait::wait_for;
use tools_support::{Env, Scripted, json};

/// A tool environment on the host whose turn offers the core tools.
fn env_with(config: Config) -> Env {
    let mut env = Env::with(config, Scripted::with(&[]));
    env.ctx.tools = Arc::new(Registry::with_core_tools(&env.ctx.config));
    env
}

fn config() -> Config {
    Config::default()
}

async fn run(env: &Env, code: &str) -> Value {
    json(
        &ExecuteCodeTool::new()
            .call(json!({ "code": code }), &env.ctx)
            .await
            .unwrap(),
    )
}

fn output(v: &Value) -> &str {
    v["output"].as_str().unwrap_or_default()
}

/// Whether process `pid` is gone (or a zombie nobody has reaped yet,
/// which runs nothing).
fn is_dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// The pids a script wrote to `file` (its own and its child's).
fn pids(file: &Path) -> Vec<u32> {
    std::fs::read_to_string(file)
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

#[tokio::test]
async fn a_script_reads_and_searches_through_the_module_and_prints_a_summary() {
    let env = env_with(config());
    let notes = env.work().join("notes");
    std::fs::create_dir_all(&notes).unwrap();
    std::fs::write(notes.join("a.txt"), "alpha TODO one\nplain line\n").unwrap();
    std::fs::write(notes.join("b.txt"), "beta\nTODO two\n").unwrap();
    let out = run(
        &env,
        r#"
import os
from talaria_tools import read_file, search_files
text = read_file("notes/a.txt")
found = search_files("TODO", path="notes")
lines = found["results"].splitlines()
print("SUMMARY", "alpha" in text, len(lines), sorted(os.path.basename(l.split(":")[0]) for l in lines))
print("SOCKET", os.environ["TALARIA_CODE_SOCKET"])
"#,
    )
    .await;
    assert_eq!(out["status"], "success", "{out}");
    assert_eq!(out["tool_calls_made"], 2, "{out}");
    assert_eq!(out["exit_code"], 0, "{out}");
    assert!(out["duration_seconds"].is_number(), "{out}");
    let text = output(&out);
    assert!(text.contains("SUMMARY True 2 ['a.txt', 'b.txt']"), "{text}");
    // The directory of the socket, the script and the module is gone.
    let socket = text
        .lines()
        .find_map(|l| l.strip_prefix("SOCKET "))
        .unwrap();
    let dir = Path::new(socket).parent().unwrap();
    assert!(!dir.exists(), "{} was left behind", dir.display());
}

#[tokio::test]
async fn scripts_written_for_the_ancestor_import_hermes_tools() {
    let env = env_with(config());
    std::fs::write(env.work().join("x.txt"), "from the ancestor\n").unwrap();
    let out = run(
        &env,
        "from hermes_tools import read_file\nprint(read_file('x.txt'))\n",
    )
    .await;
    assert_eq!(out["status"], "success", "{out}");
    assert!(output(&out).contains("from the ancestor"), "{out}");
}

#[tokio::test]
async fn a_script_that_loops_forever_is_killed_with_its_children_at_the_limit() {
    let mut config = config();
    config.code_execution.timeout_secs = 2;
    let env = env_with(config);
    let marker = env.work().join("pids.txt");
    let out = run(
        &env,
        r#"
import os, subprocess, time
child = subprocess.Popen(["sleep", "300"])
with open("pids.txt", "w") as f:
    f.write("%d %d" % (os.getpid(), child.pid))
print("started", flush=True)
while True:
    time.sleep(0.05)
"#,
    )
    .await;
    assert_eq!(out["status"], "timeout", "{out}");
    assert!(out["exit_code"].is_null(), "{out}");
    assert!(output(&out).contains("started"), "{out}");
    assert!(
        out["error"].as_str().unwrap().contains("timeout_secs"),
        "{out}"
    );
    let pids = pids(&marker);
    assert_eq!(pids.len(), 2);
    for pid in pids {
        assert!(is_dead(pid), "process {pid} survived the timeout");
    }
}

#[tokio::test]
async fn calls_beyond_the_budget_get_errors() {
    let mut config = config();
    config.code_execution.max_tool_calls = 3;
    let env = env_with(config);
    std::fs::write(env.work().join("a.txt"), "a line\n").unwrap();
    let out = run(
        &env,
        r#"
from talaria_tools import read_file
ok, failed, why = 0, 0, ""
for _ in range(10):
    r = read_file("a.txt")
    if isinstance(r, dict) and "error" in r:
        failed += 1
        why = r["error"]
    else:
        ok += 1
print("ok=%d failed=%d" % (ok, failed))
print(why)
"#,
    )
    .await;
    assert_eq!(out["status"], "success", "{out}");
    assert_eq!(out["tool_calls_made"], 3, "{out}");
    let text = output(&out);
    assert!(text.contains("ok=3 failed=7"), "{text}");
    assert!(text.contains("code_execution.max_tool_calls"), "{text}");
}

#[tokio::test]
async fn tools_the_turn_does_not_offer_are_refused_inside_the_script() {
    let mut env = env_with(config());
    env.ctx.tools = Arc::new(Registry::with_core_tools(&env.ctx.config).without(&["terminal"]));
    let out = run(
        &env,
        r#"
from talaria_tools import terminal, web_search, _call
print("TERMINAL", terminal("echo should-not-run"))
print("WEB", web_search("rust"))
print("TODO", _call("todo", {}))
"#,
    )
    .await;
    assert_eq!(out["status"], "success", "{out}");
    assert_eq!(out["tool_calls_made"], 0, "{out}");
    let text = output(&out);
    assert!(!text.contains("should-not-run'"), "{text}");
    let line = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} line in {text}"))
            .to_owned()
    };
    assert!(
        line("TERMINAL").contains("`terminal` is not available in this conversation"),
        "{text}"
    );
    assert!(
        line("WEB").contains("`web_search` is not available in this conversation"),
        "{text}"
    );
    assert!(
        line("TODO").contains("`todo` cannot be called from execute_code"),
        "{text}"
    );
}

#[tokio::test]
async fn terminal_inside_a_script_runs_in_the_foreground_only() {
    let env = env_with(config());
    let out = run(
        &env,
        r#"
from talaria_tools import terminal, _call
print("FG", terminal("echo foreground-ran")["output"].strip())
print("BG", _call("terminal", {"command": "sleep 100", "background": True}))
"#,
    )
    .await;
    assert_eq!(out["status"], "success", "{out}");
    assert_eq!(out["tool_calls_made"], 1, "{out}");
    let text = output(&out);
    assert!(text.contains("FG foreground-ran"), "{text}");
    assert!(
        text.contains("runs in the foreground only inside execute_code"),
        "{text}"
    );
}

#[tokio::test]
async fn a_dangerous_command_from_a_script_waits_for_the_human_like_any_other() {
    let env = env_with(config());
    // Built at run time, so only the call (not the script's text) shows it.
    let out = run(
        &env,
        r#"
from talaria_tools import terminal
print(terminal("git reset " + "--" + "hard"))
"#,
    )
    .await;
    assert_eq!(out["status"], "success", "{out}");
    assert_eq!(env.human.asked().len(), 1, "{out}");
    assert!(output(&out).contains(DENIED_PREFIX), "{out}");
}

#[tokio::test]
async fn a_script_whose_text_is_dangerous_is_asked_about_before_it_runs() {
    let env = env_with(config());
    let out = ExecuteCodeTool::new()
        .call(
            json!({"code": "import os\nopen('ran.txt', 'w').write('x')\nos.system('git reset --hard')\n"}),
            &env.ctx,
        )
        .await
        .unwrap();
    assert!(out.starts_with(DENIED_PREFIX), "{out}");
    assert_eq!(env.human.asked().len(), 1);
    assert!(!env.work().join("ran.txt").exists(), "the script ran");
}

#[tokio::test]
async fn a_script_gets_the_allowlisted_environment_and_its_output_is_redacted() {
    // Cargo gives the test process variables no command should inherit.
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    let env = env_with(config());
    let out = run(
        &env,
        r#"
import os
print("NAMES", sorted(os.environ))
print("LEAK", "super-secret-" + "value-123")
"#,
    )
    .await;
    assert_eq!(out["status"], "success", "{out}");
    let text = output(&out);
    assert!(text.contains("'TALARIA_CODE_SOCKET'"), "{text}");
    assert!(text.contains("'PATH'"), "{text}");
    assert!(!text.contains("CARGO_"), "{text}");
    assert!(!text.contains("super-secret-value-123"), "{text}");
}

#[tokio::test]
async fn an_oversized_request_is_refused() {
    let env = env_with(config());
    let out = run(
        &env,
        r#"
from talaria_tools import write_file
print(write_file("big.txt", "x" * (2 * 1024 * 1024)))
"#,
    )
    .await;
    assert_eq!(out["status"], "success", "{out}");
    assert_eq!(out["tool_calls_made"], 0, "{out}");
    assert!(output(&out).contains("larger than 1 MiB"), "{out}");
    assert!(!env.work().join("big.txt").exists());
}

#[tokio::test]
async fn a_missing_interpreter_says_python_3_is_needed() {
    let mut config = config();
    config.code_execution.python = "no-such-python-for-talaria".into();
    let env = env_with(config);
    let out = run(&env, "print('hi')").await;
    assert_eq!(out["status"], "error", "{out}");
    assert_eq!(out["exit_code"], 127, "{out}");
    let error = out["error"].as_str().unwrap();
    assert!(error.contains("needs Python 3"), "{error}");
    assert!(error.contains("no-such-python-for-talaria"), "{error}");
    assert!(error.contains("code_execution.python"), "{error}");
}

#[tokio::test]
async fn a_failing_script_reports_its_traceback() {
    let env = env_with(config());
    let out = run(&env, "print('before')\nraise ValueError('boom')\n").await;
    assert_eq!(out["status"], "error", "{out}");
    assert_eq!(out["exit_code"], 1, "{out}");
    let text = output(&out);
    assert!(text.contains("before"), "{text}");
    assert!(text.contains("ValueError: boom"), "{text}");
}

#[tokio::test]
async fn the_interrupt_kills_the_script() {
    let env = env_with(config());
    let marker = env.work().join("pids.txt");
    let ctx = env.ctx.clone();
    let call = tokio::spawn(async move {
        ExecuteCodeTool::new()
            .call(
                json!({"code": r#"
import os, subprocess, time
child = subprocess.Popen(["sleep", "300"])
with open("pids.tmp", "w") as f:
    f.write("%d %d" % (os.getpid(), child.pid))
os.rename("pids.tmp", "pids.txt")
while True:
    time.sleep(0.05)
"#}),
                &ctx,
            )
            .await
    });
    let probe = marker.clone();
    wait_for("the script to start", || {
        let probe = probe.clone();
        async move {
            if probe.exists() {
                Ok(())
            } else {
                Err("no pids yet")
            }
        }
    })
    .await;
    env.ctx.cancel.cancel();
    let out = json(&call.await.unwrap().unwrap());
    assert_eq!(out["status"], "interrupted", "{out}");
    for pid in pids(&marker) {
        assert!(is_dead(pid), "process {pid} survived the interrupt");
    }
}

/// A tool environment whose conversation is an untrusted group chat,
/// run in the bubblewrap sandbox.
async fn sandboxed(config: Config) -> Env {
    assert!(
        talaria_exec::find_program("bwrap").is_some(),
        "bubblewrap (bwrap) is not installed: scripts/test installs it (apt install bubblewrap)"
    );
    let mut env = env_with(config);
    let backends = Backends::new(&env.ctx.config.terminal, &env.ctx.home, env.work());
    env.ctx.execution =
        Execution::for_conversation(&backends, Trust::Untrusted, "telegram:group:-7").await;
    if let Err(e) = &env.ctx.execution.backend {
        panic!("the sandbox cannot start here: {e}");
    }
    env
}

/// Runs a script in `env`'s sandbox that reads a workspace file and says
/// where it ran; checks it worked and left nothing in the workspace.
async fn read_in_the_sandbox(env: &Env) {
    let ws = env.ctx.execution.workspace.clone().unwrap();
    std::fs::write(ws.host().join("hello.txt"), "hello from the workspace\n").unwrap();
    let out = run(
        env,
        r#"
import os
from talaria_tools import read_file
print(read_file("hello.txt"))
print("CWD", os.getcwd())
print("SOCKET", os.environ["TALARIA_CODE_SOCKET"])
"#,
    )
    .await;
    assert_eq!(out["status"], "success", "{out}");
    assert_eq!(out["tool_calls_made"], 1, "{out}");
    let text = output(&out);
    assert!(text.contains("hello from the workspace"), "{text}");
    assert!(text.contains("CWD /workspace\n"), "{text}");
    assert!(text.contains("SOCKET /workspace/.talaria-code-"), "{text}");
    let left: Vec<String> = std::fs::read_dir(ws.host())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".talaria-code-"))
        .collect();
    assert!(left.is_empty(), "left in the workspace: {left:?}");
}

#[tokio::test]
async fn a_sandboxed_script_reads_a_workspace_file_through_the_socket() {
    let env = sandboxed(config()).await;
    read_in_the_sandbox(&env).await;
}

#[tokio::test]
async fn a_workspace_deeper_than_a_socket_path_allows_still_works() {
    let root = tempfile::tempdir().unwrap();
    let deep = root.path().join("w".repeat(60)).join("x".repeat(60));
    let mut config = config();
    config.terminal.workspaces_dir = Some(deep.clone());
    let env = sandboxed(config).await;
    let ws = env.ctx.execution.workspace.clone().unwrap();
    // Past what a socket address holds (108 bytes), so the socket is bound
    // through the directory's descriptor.
    assert!(
        ws.host()
            .join(".talaria-code-xxxxxx/tools.sock")
            .as_os_str()
            .len()
            > 108
    );
    read_in_the_sandbox(&env).await;
}

/// The module reaches a socket whose path is too long for a socket
/// address (through the directory's descriptor): a local run's temp dir
/// can be that deep.
#[tokio::test]
async fn the_module_connects_to_a_socket_path_longer_than_an_address_holds() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let root = tempfile::tempdir().unwrap();
    let deep = root.path().join("d".repeat(70)).join("e".repeat(70));
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(
        deep.join("talaria_tools.py"),
        include_str!("../src/tools/execute_code/talaria_tools.py"),
    )
    .unwrap();
    let socket = deep.join("tools.sock");
    let dir = std::fs::File::open(&deep).unwrap();
    let listener = {
        use std::os::fd::AsRawFd;
        tokio::net::UnixListener::bind(format!("/proc/self/fd/{}/tools.sock", dir.as_raw_fd()))
            .unwrap()
    };
    let server = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let (read, mut write) = stream.into_split();
        let mut line = String::new();
        BufReader::new(read).read_line(&mut line).await.unwrap();
        let request: Value = serde_json::from_str(&line).unwrap();
        let reply = json!({"result": json!({"echo": request}).to_string()});
        write
            .write_all(format!("{reply}\n").as_bytes())
            .await
            .unwrap();
    });
    let out = tokio::process::Command::new("python3")
        .arg("-c")
        .arg("from talaria_tools import read_file\nprint(read_file('a.txt', limit=3)['echo'])")
        .env("PYTHONPATH", &deep)
        .env("TALARIA_CODE_SOCKET", &socket)
        .env("TALARIA_CODE_TOKEN", "t0k")
        .output()
        .await
        .unwrap();
    server.await.unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(printed.contains("'tool': 'read_file'"), "{printed}");
    assert!(printed.contains("'path': 'a.txt'"), "{printed}");
    assert!(printed.contains("'limit': 3"), "{printed}");
    // Arguments left out take the tool's default.
    assert!(!printed.contains("'offset'"), "{printed}");
    assert!(printed.contains("'token': 't0k'"), "{printed}");
}

/// A backend that says it is a remote host and records whether anything
/// was started on it.
#[derive(Debug, Default)]
struct RemoteHost {
    spawned: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl talaria_exec::Backend for RemoteHost {
    fn kind(&self) -> talaria_exec::BackendKind {
        talaria_exec::BackendKind::Ssh
    }
    fn workspace(&self) -> Option<&talaria_exec::Workspace> {
        None
    }
    async fn spawn(
        &self,
        _spec: talaria_exec::CommandSpec,
    ) -> Result<talaria_exec::Running, talaria_exec::ExecError> {
        self.spawned
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Err(talaria_exec::ExecError::Unavailable(
            "not really remote".into(),
        ))
    }
}

#[tokio::test]
async fn a_conversation_on_a_remote_host_is_told_scripts_cannot_run_there() {
    let mut env = env_with(config());
    let remote = Arc::new(RemoteHost::default());
    env.ctx.execution.kind = talaria_exec::BackendKind::Ssh;
    env.ctx.execution.backend = Ok(remote.clone());
    let err = ExecuteCodeTool::new()
        .call(json!({"code": "print('hi')"}), &env.ctx)
        .await
        .unwrap_err();
    assert!(err.0.contains("remote host (ssh)"), "{err}");
    assert!(!remote.spawned.load(std::sync::atomic::Ordering::SeqCst));
}

#[tokio::test]
async fn code_is_required() {
    let env = env_with(config());
    let tool = ExecuteCodeTool::new();
    let err = tool.call(json!({}), &env.ctx).await.unwrap_err();
    assert!(err.0.contains("`code`"), "{err}");
    let err = tool
        .call(json!({"command": "ls"}), &env.ctx)
        .await
        .unwrap_err();
    assert!(err.0.contains("terminal"), "{err}");
    let err = tool
        .call(json!({"code": "  "}), &env.ctx)
        .await
        .unwrap_err();
    assert!(err.0.contains("empty"), "{err}");
}

#[test]
fn scripts_are_withheld_where_commands_cannot_run() {
    let execution = Execution {
        trust: Trust::Untrusted,
        kind: talaria_exec::BackendKind::Sandbox,
        backend: Err(talaria_exec::Unavailable {
            kind: talaria_exec::BackendKind::Sandbox,
            reason: "no bubblewrap here".into(),
        }),
        workspace: None,
    };
    let withheld = execution.withheld();
    assert!(withheld.contains(&"execute_code"), "{withheld:?}");
    assert!(withheld.contains(&"terminal"), "{withheld:?}");
}
