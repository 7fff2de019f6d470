//! Where a chat's commands run, through the real binary and a fake
//! Telegram: a group chat's `terminal` call runs in the bubblewrap sandbox
//! while the owner's DM runs on the host; without bubblewrap the group is
//! not offered the terminal at all (nothing runs on the host instead) and
//! `gateway status` says why.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use talaria_testkit::{FakeTelegram, MockOpenAi, Reply, ToolCallReply};

const TOKEN: &str = "424242:isolation-test-token-abcdefgh";
const WAIT: Duration = Duration::from_secs(30);
const OWNER: i64 = 42;
const GROUP: i64 = -100_777;

struct Home {
    _dir: tempfile::TempDir,
    root: PathBuf,
    locks: PathBuf,
}

fn home(llm: &MockOpenAi, tg: &FakeTelegram) -> Home {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("home");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(
        root.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {}\n  api_key: sk-isolation-test-0123456789\n\
             agent:\n  api_max_retries: 1\n\
             approvals:\n  mode: \"off\"\n\
             platforms:\n  telegram:\n    base_url: {}\n    poll_timeout_secs: 1\n",
            llm.base_url(),
            tg.base_url()
        ),
    )
    .unwrap();
    // The owner is on the allowlist; the group is let in as a whole.
    std::fs::write(
        root.join(".env"),
        format!(
            "TELEGRAM_BOT_TOKEN={TOKEN}\nTELEGRAM_ALLOWED_USERS={OWNER}\nTELEGRAM_GROUP_ALLOWED_CHATS={GROUP}\n"
        ),
    )
    .unwrap();
    let locks = dir.path().join("locks");
    Home {
        _dir: dir,
        root,
        locks,
    }
}

fn command(home: &Home, args: &[&str], path: Option<&str>) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_talaria"));
    c.arg("--home")
        .arg(&home.root)
        .args(args)
        .current_dir(&home.root)
        .env_remove("TALARIA_HOME")
        .env_remove("TELEGRAM_BOT_TOKEN")
        .env_remove("TELEGRAM_ALLOWED_USERS")
        .env_remove("GATEWAY_ALLOW_ALL_USERS")
        .env_remove("API_SERVER_KEY")
        .env("TALARIA_GATEWAY_LOCK_DIR", &home.locks)
        .env("TALARIA_LOG", "info")
        .stdin(Stdio::null());
    if let Some(path) = path {
        c.env("PATH", path);
    }
    c
}

fn spawn_gateway(home: &Home, log: &Path, path: Option<&str>) -> Child {
    let log = std::fs::File::create(log).unwrap();
    command(home, &["gateway", "run"], path)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

fn stop(mut child: Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let deadline = Instant::now() + WAIT;
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the gateway did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the tool call `id` returned, from the model request that carries
/// it.
fn tool_result(llm: &MockOpenAi, id: &str) -> serde_json::Value {
    for req in llm.requests() {
        if let Some(m) = req.body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == "tool" && m["tool_call_id"] == id)
        {
            let content = m["content"].as_str().unwrap();
            return serde_json::from_str(content)
                .unwrap_or_else(|_| serde_json::Value::String(content.to_owned()));
        }
    }
    panic!("no result for {id} in {:?}", llm.requests());
}

async fn answered(tg: &FakeTelegram, chat: i64, text: &str) {
    let deadline = Instant::now() + WAIT;
    while !tg
        .sent()
        .iter()
        .any(|s| s.chat_id == chat && s.text.contains(text))
    {
        assert!(
            Instant::now() < deadline,
            "no {text:?} in chat {chat}: {:?}",
            tg.sent()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Where am I: the host name (the sandbox has its own), the directory and
/// whether the home's `.env` is there to read.
fn probe(id: &str, home: &Path) -> Reply {
    Reply::tool_calls(vec![ToolCallReply::new(
        id,
        "terminal",
        serde_json::json!({
            "command": format!(
                "echo host=$(cat /proc/sys/kernel/hostname); echo dir=$(pwd); \
                 test -e {}/state.db && echo home=visible || echo home=hidden",
                home.display()
            )
        })
        .to_string(),
    )])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groups_command_runs_in_the_sandbox_and_the_owners_dm_on_the_host() {
    let llm = MockOpenAi::start().await;
    let tg = FakeTelegram::start(TOKEN).await;
    let home = home(&llm, &tg);
    let log = home.root.join("gateway.log");
    let gateway = spawn_gateway(&home, &log, None);
    tg.wait_for_get_updates_calls(1, WAIT).await;

    llm.push(probe("c_group", &home.root));
    llm.push(Reply::text("group done"));
    tg.push_group_text(
        GROUP,
        7,
        &format!("@{} where do you run?", tg.bot_username()),
        None,
        false,
    );
    answered(&tg, GROUP, "group done").await;

    llm.push(probe("c_owner", &home.root));
    llm.push(Reply::text("owner done"));
    tg.push_private_text(OWNER, "and here?");
    answered(&tg, OWNER, "owner done").await;

    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let group = tool_result(&llm, "c_group");
    let group_out = group["output"].as_str().unwrap();
    assert!(group_out.contains("host=talaria-sandbox"), "{group}");
    assert!(group_out.contains("dir=/workspace\n"), "{group}");
    assert!(group_out.contains("home=hidden"), "{group}");

    let owner = tool_result(&llm, "c_owner");
    let owner_out = owner["output"].as_str().unwrap();
    assert!(
        owner_out.contains(&format!("host={}", host.trim())),
        "{owner}"
    );
    assert!(!owner_out.contains("dir=/workspace"), "{owner}");
    assert!(owner_out.contains("home=visible"), "{owner}");

    // The group's workspace is a directory of the home, one per chat (the
    // sandbox's seccomp filter is kept beside them, as a file).
    let workspaces = home.root.join("workspaces");
    let dirs = std::fs::read_dir(&workspaces)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().is_dir())
        .count();
    assert_eq!(dirs, 1);

    // `/status` in each chat says where its commands run.
    tg.push_group_text(GROUP, 7, "/status", None, false);
    answered(&tg, GROUP, "Commands: in a bubblewrap sandbox").await;
    tg.push_private_text(OWNER, "/status");
    answered(&tg, OWNER, "Commands: on the gateway's machine (local)").await;
    stop(gateway);
}

/// A `PATH` with the usual programs but no `bwrap`.
fn path_without_bwrap(dir: &Path) -> String {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for program in ["sh", "cat", "echo", "ls", "env", "prlimit"] {
        let found = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(program))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("no {program}"));
        std::os::unix::fs::symlink(found, bin.join(program)).unwrap();
    }
    bin.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_bubblewrap_a_group_gets_no_terminal_and_the_status_says_why() {
    let llm = MockOpenAi::start().await;
    let tg = FakeTelegram::start(TOKEN).await;
    let home = home(&llm, &tg);
    let path = path_without_bwrap(home._dir.path());
    let log = home.root.join("gateway.log");
    let gateway = spawn_gateway(&home, &log, Some(&path));
    tg.wait_for_get_updates_calls(1, WAIT).await;

    llm.push(Reply::text("no terminal here"));
    tg.push_group_text(
        GROUP,
        7,
        &format!("@{} run ls", tg.bot_username()),
        None,
        false,
    );
    answered(&tg, GROUP, "no terminal here").await;
    llm.push(Reply::text("owner has it"));
    tg.push_private_text(OWNER, "run ls");
    answered(&tg, OWNER, "owner has it").await;

    let tools = |i: usize| -> Vec<String> {
        llm.requests()[i].body["tools"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let group_tools = tools(0);
    assert!(
        !group_tools.contains(&"terminal".to_owned()),
        "{group_tools:?}"
    );
    // The file tools stay, inside the group's workspace.
    assert!(
        group_tools.contains(&"read_file".to_owned()),
        "{group_tools:?}"
    );
    // The owner's DM runs on the host and keeps the terminal.
    assert!(tools(1).contains(&"terminal".to_owned()), "{:?}", tools(1));

    // `gateway status` says which backend is missing and why.
    let deadline = Instant::now() + WAIT;
    loop {
        let out = command(&home, &["gateway", "status"], Some(&path))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains("untrusted commands: sandbox, unavailable")
            && text.contains("bubblewrap (bwrap) is not installed")
        {
            assert!(text.contains("owner commands: local"), "{text}");
            break;
        }
        assert!(Instant::now() < deadline, "status never said why: {text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("bubblewrap (bwrap) is not installed"),
        "{logged}"
    );
    stop(gateway);
}

/// Planted in the gateway's process environment.
const PROCESS_SECRET: (&str, &str) = ("DEPLOY_PASSWORD", "process-secret-planted-31415926");
/// Planted in the home's `.env`.
const DOTENV_SECRET: (&str, &str) = ("SOME_SERVICE_KEY", "dotenv-secret-planted-27182818");

/// `secret` and the base64 forms it can take inside any encoded text.
fn forms(secret: &str) -> Vec<String> {
    use base64::Engine as _;
    let mut out = vec![secret.to_owned()];
    for skip in 0..3 {
        let b = &secret.as_bytes()[skip..];
        out.push(base64::engine::general_purpose::STANDARD.encode(&b[..b.len() / 3 * 3]));
    }
    out
}

fn assert_clean(what: &str, text: &str) {
    let joined = text.replace("\\n", "").replace(['\n', '\r'], "");
    for secret in [PROCESS_SECRET.1, DOTENV_SECRET.1, TOKEN] {
        for form in forms(secret) {
            assert!(
                !joined.contains(&form),
                "{what} holds {secret} (as {form}):\n{text}"
            );
        }
    }
}

/// A group's model goes looking for secrets with `env`,
/// `/proc/self/environ`, `env | base64` and the home's `.env`: nothing
/// planted in the gateway's environment or the home's `.env` (nor the bot
/// token) reaches a tool result, the chat, the database or the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groups_commands_see_none_of_the_gateways_secrets() {
    let llm = MockOpenAi::start().await;
    let tg = FakeTelegram::start(TOKEN).await;
    let home = home(&llm, &tg);
    let dotenv = home.root.join(".env");
    let mut env = std::fs::read_to_string(&dotenv).unwrap();
    env.push_str(&format!("{}={}\n", DOTENV_SECRET.0, DOTENV_SECRET.1));
    std::fs::write(&dotenv, env).unwrap();
    let log = home.root.join("gateway.log");
    let gateway = command(&home, &["gateway", "run"], None)
        .env(PROCESS_SECRET.0, PROCESS_SECRET.1)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    tg.wait_for_get_updates_calls(1, WAIT).await;

    let run = |id: &str, command: String| {
        ToolCallReply::new(
            id,
            "terminal",
            serde_json::json!({ "command": command }).to_string(),
        )
    };
    llm.push(Reply::tool_calls(vec![
        run("env", "env".into()),
        run("environ", "tr '\\0' '\\n' < /proc/self/environ".into()),
        run("b64", "env | base64".into()),
        run("dotenv", format!("cat {}", dotenv.display())),
    ]));
    llm.push(Reply::text("Nothing to see."));
    tg.push_group_text(
        GROUP,
        7,
        &format!("@{} show me your environment", tg.bot_username()),
        None,
        false,
    );
    answered(&tg, GROUP, "Nothing to see.").await;
    let results: Vec<serde_json::Value> = ["env", "environ", "b64", "dotenv"]
        .iter()
        .map(|id| tool_result(&llm, id))
        .collect();
    // The commands ran in the sandbox: `env` printed its PATH and home.
    let env_out = results[0]["output"].as_str().unwrap();
    assert!(env_out.contains("HOME=/workspace"), "{}", results[0]);
    assert!(
        results[3]["output"]
            .as_str()
            .unwrap()
            .contains("No such file or directory"),
        "{}",
        results[3]
    );
    for (id, r) in ["env", "environ", "b64", "dotenv"].iter().zip(&results) {
        assert_clean(&format!("tool result {id}"), &r.to_string());
    }
    stop(gateway);
    for sent in tg.sent() {
        assert_clean("a message the group got", &sent.text);
    }
    assert_clean("the log", &std::fs::read_to_string(&log).unwrap());
    for entry in std::fs::read_dir(&home.root).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_file() && name != ".env" && name != "config.yaml" {
            let bytes = std::fs::read(&path).unwrap();
            assert_clean(
                &path.display().to_string(),
                &String::from_utf8_lossy(&bytes),
            );
        }
    }
}
