//! The interactive REPL driven through a real pseudo-terminal: streaming,
//! tool lines, Ctrl-C interrupting the turn but not the program.

use std::process::Command;

use rexpect::reader::Options;
use rexpect::session::spawn_with_options;
use talaria_testkit::{MockOpenAi, Reply, ToolCallReply};

#[test]
fn repl_streams_shows_tools_and_survives_ctrl_c() {
    let mut chat = start();
    let Chat { p, mock, .. } = &mut chat;

    // A streamed answer.
    mock.push(Reply::text("streamed hello world"));
    p.send_line("hi").unwrap();
    p.exp_string("streamed hello world").unwrap();

    // A tool call shows as one line, then the answer.
    mock.push(Reply::tool_calls(vec![ToolCallReply {
        id: "call_1".into(),
        name: "terminal".into(),
        arguments: r#"{"command":"echo from-the-tool"}"#.into(),
    }]));
    mock.push(Reply::text("tool finished fine"));
    p.send_line("run something").unwrap();
    // rexpect reads bytes as Latin-1, so match the ASCII part of the tool line.
    p.exp_string(r#"terminal {"command":"echo from-the-tool"}"#)
        .unwrap();
    p.exp_string("tool finished fine").unwrap();

    // Ctrl-C during a stalled stream interrupts the turn, not the program.
    mock.push(Reply::text("partial words then a very long silence").stall_after(1));
    p.send_line("slow one").unwrap();
    p.exp_string("partial").unwrap();
    p.send_control('c').unwrap();
    p.exp_string("interrupted").unwrap();

    // Still alive: another turn works.
    mock.push(Reply::text("still here"));
    p.send_line("are you there").unwrap();
    p.exp_string("still here").unwrap();

    p.send_line("/exit").unwrap();
    p.exp_eof().unwrap();
    assert_eq!(mock.requests().len(), 5);
}

/// A chat in a fresh home under a temporary directory (also the working
/// directory the agent's commands run in).
struct Chat {
    p: rexpect::session::PtySession,
    mock: MockOpenAi,
    home: std::path::PathBuf,
    dir: tempfile::TempDir,
    _rt: tokio::runtime::Runtime,
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
        home,
        dir,
        _rt: rt,
    }
}

impl Chat {
    /// Queues a model reply that runs `command` in the terminal tool.
    fn push_command(&self, id: &str, command: &str) {
        self.mock.push(Reply::tool_calls(vec![ToolCallReply {
            id: id.into(),
            name: "terminal".into(),
            arguments: serde_json::json!({ "command": command }).to_string(),
        }]));
    }

    /// Sends `line` and returns the output up to and including `until`.
    fn ask(&mut self, line: &str, until: &str) -> String {
        self.p.send_line(line).unwrap();
        let before = self
            .p
            .exp_string(until)
            .unwrap_or_else(|e| panic!("no {until:?} after {line:?}: {e}"));
        format!("{before}{until}")
    }

    /// The last user message of the latest model request.
    fn last_user_text(&self) -> String {
        let reqs = self.mock.requests();
        let last = reqs.last().expect("no request reached the model");
        last.body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default()
            .to_owned()
    }

    fn mkdir(&self, name: &str) -> std::path::PathBuf {
        let d = self.dir.path().join(name);
        std::fs::create_dir_all(d.join("inner")).unwrap();
        d
    }

    fn talaria(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_talaria"))
            .arg("--home")
            .arg(&self.home)
            .args(args)
            .env_remove("TALARIA_HOME")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    }
}

/// How many lines of `text` speak of an interruption.
fn interruption_lines(text: &str) -> usize {
    text.lines()
        .filter(|l| l.to_ascii_lowercase().contains("interrupt"))
        .count()
}

#[test]
fn ctrl_c_at_the_approval_prompt_leaves_the_next_lines_to_the_chat() {
    let mut c = start();
    let dir = c.mkdir("somedir");
    c.push_command("call_1", "rm -r somedir");
    c.ask("clean up", "allow exactly this command from now on");
    c.p.exp_string("> ").unwrap();
    c.p.send_control('c').unwrap();
    let out = c.p.exp_string("(interrupted)").unwrap();
    assert_eq!(interruption_lines(&out), 0, "{out}");
    assert!(dir.exists(), "an interrupted approval runs nothing");

    // Every line typed afterwards reaches the model, in order...
    c.mock.push(Reply::text("answer to one"));
    c.ask("word one", "answer to one");
    assert_eq!(c.last_user_text(), "word one");
    c.mock.push(Reply::text("answer to two"));
    c.ask("word two", "answer to two");
    assert_eq!(c.last_user_text(), "word two");
    assert_eq!(c.mock.requests().len(), 3);

    // ...and /exit ends the chat at once.
    c.p.send_line("/exit").unwrap();
    c.p.exp_eof().unwrap();
}

#[test]
fn one_ctrl_c_during_a_turn_prints_one_interruption_line() {
    let mut c = start();
    c.mock
        .push(Reply::text("partial words then a very long silence").stall_after(1));
    c.ask("slow one", "partial");
    c.p.send_control('c').unwrap();
    let before = c.p.exp_string("(interrupted)").unwrap();
    // Everything up to the next command's answer: nothing more about the
    // interruption may follow.
    let after = c.ask(
        "/version",
        &format!("Talaria {}", env!("CARGO_PKG_VERSION")),
    );
    let all = format!("{before}(interrupted){after}");
    assert_eq!(interruption_lines(&all), 1, "{all}");
    c.p.send_line("/exit").unwrap();
    c.p.exp_eof().unwrap();
}

#[test]
fn always_allows_exactly_the_command_shown() {
    let mut c = start();
    let some = c.mkdir("somedir");
    let other = c.mkdir("otherdir");

    c.push_command("call_1", "rm -r somedir");
    c.mock.push(Reply::text("removed the first time"));
    c.ask("clean up", "allow exactly this command from now on");
    c.ask("a", "removed the first time");
    assert!(!some.exists());

    // The same command again runs without a prompt.
    let some = c.mkdir("somedir");
    c.push_command("call_2", "rm -r somedir");
    c.mock.push(Reply::text("removed once more"));
    let out = c.ask("again please", "removed once more");
    assert!(!out.contains("needs approval"), "{out}");
    assert!(!some.exists());

    // Another recursive delete still asks.
    c.push_command("call_3", "rm -r otherdir");
    c.mock.push(Reply::text("left it alone"));
    c.ask(
        "now the other one",
        "allow exactly this command from now on",
    );
    c.ask("d", "left it alone");
    assert!(other.exists());
    c.p.send_line("/exit").unwrap();
    c.p.exp_eof().unwrap();

    // `talaria approvals` shows it and takes it back.
    let list = c.talaria(&["approvals", "list"]);
    let listed = String::from_utf8_lossy(&list.stdout).into_owned();
    assert!(list.status.success(), "{list:?}");
    assert!(listed.contains("  1. rm -r somedir"), "{listed}");
    assert!(!listed.contains("otherdir"), "{listed}");
    let revoke = c.talaria(&["approvals", "revoke", "rm", "-r", "somedir"]);
    assert!(revoke.status.success(), "{revoke:?}");
    let list = c.talaria(&["approvals", "list"]);
    let listed = String::from_utf8_lossy(&list.stdout).into_owned();
    assert!(listed.contains("No commands are approved"), "{listed}");
}

#[test]
fn slash_model_switches_the_terminals_conversation() {
    let mut chat = start();
    chat.ask("/model small-model", "small-model for this conversation");
    chat.mock.push(Reply::text("answered by the small one"));
    chat.ask("who answers?", "answered by the small one");
    let model = |chat: &Chat| {
        chat.mock.requests().last().expect("a request").body["model"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(model(&chat), "small-model");
    chat.ask("/status", "Model: small-model");
    chat.ask("/model default", "the default, for this conversation");
    chat.mock.push(Reply::text("answered by the default"));
    chat.ask("and now?", "answered by the default");
    assert_eq!(model(&chat), "mock-model");
    chat.p.send_line("/exit").unwrap();
    chat.p.exp_eof().unwrap();
}
