//! Slash commands at the interactive prompt, driven through a real
//! pseudo-terminal: every command resolves through the shared registry and
//! only text that is not a command reaches the model.

use std::process::Command;

use rexpect::reader::Options;
use rexpect::session::{PtySession, spawn_with_options};
use serde_json::Value;
use talaria_testkit::{MockOpenAi, Reply};

struct Chat {
    p: PtySession,
    mock: MockOpenAi,
    _rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

fn start() -> Chat {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = rt.block_on(MockOpenAi::start());
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  base_url: {}\n",
            mock.base_url()
        ),
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_talaria"));
    cmd.arg("--home").arg(&home).arg("chat");
    cmd.env_remove("TALARIA_HOME");
    cmd.current_dir(dir.path());
    let mut p = spawn_with_options(
        cmd,
        Options::new()
            .timeout_ms(Some(20_000))
            .strip_ansi_escape_codes(true),
    )
    .unwrap();
    p.exp_string("Type /help").unwrap();
    Chat {
        p,
        mock,
        _rt: rt,
        _dir: dir,
    }
}

impl Chat {
    /// Sends `line` and returns the output up to and including `until`.
    fn ask(&mut self, line: &str, until: &str) -> String {
        self.p.send_line(line).unwrap();
        let before = self
            .p
            .exp_string(until)
            .unwrap_or_else(|e| panic!("no {until:?} after {line:?}: {e}"));
        format!("{before}{until}")
    }

    /// The `content` of every user message in request `i`.
    fn user_texts(&self, i: usize) -> Vec<String> {
        let reqs = self.mock.requests();
        reqs[i].body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "user")
            .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    fn all_contents(&self, i: usize) -> Vec<Value> {
        let reqs = self.mock.requests();
        reqs[i].body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].clone())
            .collect()
    }

    fn exit(mut self) {
        self.p.send_line("/exit").unwrap();
        self.p.exp_eof().unwrap();
    }
}

#[test]
fn unknown_and_gateway_only_commands_are_answered_without_the_model() {
    let mut c = start();
    c.ask("/frobnicate now", "Unknown command /frobnicate.");
    c.ask(
        "/sethome",
        "/sethome is only available in chats served by the gateway",
    );
    c.ask("/approve", "/approve is only available in chats served");

    let help = c.ask("/help", "Ctrl-D leaves.");
    assert!(help.contains("/exit (also /quit)"), "{help}");
    assert!(help.contains("/undo [N]"), "{help}");
    assert!(!help.contains("/sethome"), "{help}");
    c.ask(
        "/version",
        &format!("Talaria {}", env!("CARGO_PKG_VERSION")),
    );
    assert!(c.mock.requests().is_empty(), "a command reached the model");

    // A path only looks like a command: it is a message for the model.
    c.mock.push(Reply::text("that lists files"));
    c.ask("/usr/bin/ls -la", "that lists files");
    assert_eq!(c.mock.requests().len(), 1);
    assert_eq!(c.user_texts(0), vec!["/usr/bin/ls -la"]);
    c.exit();
}

#[test]
fn title_status_undo_and_retry_work_on_the_current_session() {
    let mut c = start();
    c.ask("/title My notes", "Title set: My notes");
    let status = c.ask("/status", "Model: mock-model");
    assert!(status.contains("(My notes)"), "{status}");
    c.ask("/title", "Title: My notes");

    c.mock.push(Reply::text("first answer"));
    c.ask("first question", "first answer");
    c.ask("/undo", "Removed the last exchange");
    c.ask("/undo 2", "nothing was removed");

    // The undone exchange is not sent again.
    c.mock.push(Reply::text("second answer"));
    c.ask("second question", "second answer");
    let contents = c.all_contents(1);
    assert!(
        !contents.contains(&Value::from("first question"))
            && !contents.contains(&Value::from("first answer")),
        "{contents:#?}"
    );

    // /retry sends the last message again, in place of its old answer.
    c.mock.push(Reply::text("retried answer"));
    c.ask("/retry", "retried answer");
    assert_eq!(c.mock.requests().len(), 3);
    assert_eq!(c.user_texts(2), vec!["second question"]);
    assert!(!c.all_contents(2).contains(&Value::from("second answer")));

    c.ask("/usage", "reasoning");
    c.exit();
}

#[test]
fn sessions_resume_new_and_the_prompt_only_commands() {
    let mut c = start();
    c.ask("/title Older", "Title set: Older");
    c.ask("/new Fresh start", "new conversation");
    let list = c.ask("/sessions", "(current)");
    assert!(list.contains(" 1. Fresh start"), "{list}");
    let rest = c.ask("/status", "Model: mock-model");
    assert!(rest.contains(" 2. Older"), "{rest}");
    assert!(rest.contains("(Fresh start)"), "{rest}");

    // Both sessions are empty: a bare /resume has nowhere to go back to,
    // but a title (or number) opens one anyway.
    c.ask("/resume", "No other conversation has messages");
    c.ask("/resume older", "Resumed Older");
    c.ask("/status", "(Older)");
    c.ask("/resume fresh START", "Resumed Fresh start");
    c.ask("/resume 1", "That is the current conversation.");
    c.ask("/resume 9", "No conversation matches");

    c.ask("/stop", "Ctrl-C while a turn runs");
    c.ask("/queue", "Usage: /queue <prompt>");
    c.ask("/whoami", "local user");
    c.ask("/model other-model", "other-model for this conversation");
    c.ask("/compact", "too short to compress");
    assert!(c.mock.requests().is_empty(), "a command reached the model");

    c.mock.push(Reply::text("queued answer"));
    c.ask("/q do this now", "queued answer");
    assert_eq!(c.user_texts(0), vec!["do this now"]);
    c.exit();
}

/// `talaria chat -q <text>` in a home wired to `mock`, without a terminal.
fn one_shot(home: &std::path::Path, text: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(home)
        .args(["chat", "-q", text])
        .env_remove("TALARIA_HOME")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

fn one_shot_home(mock: &MockOpenAi) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  base_url: {}\n",
            mock.base_url()
        ),
    )
    .unwrap();
    (dir, home)
}

#[test]
fn a_one_shot_slash_command_runs_the_command_without_the_model() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = rt.block_on(MockOpenAi::start());
    let (_dir, home) = one_shot_home(&mock);

    let help = one_shot(&home, "/help");
    let out = String::from_utf8_lossy(&help.stdout);
    assert!(help.status.success(), "{help:?}");
    assert!(out.contains("/exit (also /quit)"), "{out}");
    assert!(
        out.contains(
            "/model [name|provider:name|default] — Show or switch this conversation's model\n"
        ),
        "{out}"
    );

    let version = one_shot(&home, "/version");
    assert!(version.status.success());
    assert_eq!(
        String::from_utf8_lossy(&version.stdout),
        format!("Talaria {}\n", env!("CARGO_PKG_VERSION"))
    );
    assert!(mock.requests().is_empty(), "a command reached the model");
}

#[test]
fn an_unknown_one_shot_command_points_to_help_and_fails() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = rt.block_on(MockOpenAi::start());
    let (_dir, home) = one_shot_home(&mock);
    for (line, says) in [
        ("/frobnicate now", "Unknown command /frobnicate. Type /help"),
        ("/sethome", "only available in chats served by the gateway"),
        ("/queue", "Usage: /queue <prompt>"),
    ] {
        let out = one_shot(&home, line);
        assert!(!out.status.success(), "{line}: {out:?}");
        assert!(out.stdout.is_empty(), "{line}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{line}: {err}");
    }
    assert!(mock.requests().is_empty(), "a command reached the model");
}

#[test]
fn a_one_shot_skill_command_runs_the_skill_turn() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = rt.block_on(MockOpenAi::start());
    let (_dir, home) = one_shot_home(&mock);
    let skill = home.join("skills/ops/rotate-logs");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: rotate-logs\ndescription: Rotate the app logs.\n---\n1. gzip old logs.\n",
    )
    .unwrap();
    mock.push(Reply::text("logs rotated"));
    let out = one_shot(&home, "/rotate-logs only nginx");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "logs rotated\n");
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 1);
    let user: Vec<&str> = reqs[0].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(user.len(), 1, "{user:?}");
    assert!(
        user[0].contains("invoked the \"rotate-logs\" skill")
            && user[0].contains("1. gzip old logs.")
            && user[0].contains("The user's instruction with the skill: only nginx"),
        "{}",
        user[0]
    );

    // Text that only looks like a command still goes to the model as is.
    mock.push(Reply::text("a path"));
    let out = one_shot(&home, "/usr/bin/ls -la");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(mock.requests().len(), 2);
}
