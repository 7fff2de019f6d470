//! Getting back to a conversation from the terminal, through the binary:
//! `--continue` and `--resume <title>`, automatic titles, message counts
//! that leave out replaced rows, and listings piped into a reader that
//! stops early.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use talaria_testkit::{MockOpenAi, Reply};

fn talaria(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("TALARIA_HOME")
        .env_remove("TALARIA_MODEL")
        .env_remove("TALARIA_BASE_URL")
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn setup(mock: &MockOpenAi) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  base_url: {}\nagent:\n  api_max_retries: 0\n",
            mock.base_url()
        ),
    )
    .unwrap();
    dir
}

/// The id of the session the model's `n`-th request belonged to, read
/// back through `sessions list` by its title.
fn session_titled(home: &Path, title: &str) -> String {
    let list = ok(&talaria(home, &["sessions", "list"]));
    let line = list
        .lines()
        .find(|l| l.ends_with(title))
        .unwrap_or_else(|| panic!("no session titled {title:?} in:\n{list}"));
    line.split_whitespace().next().unwrap().to_owned()
}

/// Runs the REPL with `input` piped in (not a terminal), as a script
/// drives it.
fn repl(home: &Path, args: &[&str], input: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(home)
        .arg("chat")
        .args(args)
        .env_remove("TALARIA_HOME")
        .env_remove("TALARIA_MODEL")
        .env_remove("TALARIA_BASE_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input.as_bytes()).unwrap();
    }
    child.wait_with_output().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn continue_goes_back_to_the_last_conversation_not_an_empty_or_one_shot_session() {
    let mock = MockOpenAi::start().await;
    let dir = setup(&mock);
    let home = dir.path();

    // A conversation in the REPL: titled from its first message.
    mock.push(Reply::text("Paris, mostly."));
    let out = repl(home, &[], "plan the trip to France\n/exit\n");
    ok(&out);
    let trip = session_titled(home, "plan the trip to France");

    // Later: an empty session (started, nothing said) and a one-shot.
    ok(&repl(home, &[], "/exit\n"));
    mock.push(Reply::text("4"));
    assert_eq!(
        ok(&talaria(home, &["chat", "-q", "what is 2+2"])).trim(),
        "4"
    );

    // A script chaining one-shots continues its own chain.
    mock.push(Reply::text("5"));
    let out = talaria(home, &["chat", "--continue", "-q", "and plus one?"]);
    assert_eq!(ok(&out).trim(), "5");
    let said = mock.requests()[2].body["messages"].to_string();
    assert!(
        said.contains("what is 2+2") && !said.contains("France"),
        "{said}"
    );

    // The REPL's --continue returns to the trip, past the one-shots.
    mock.push(Reply::text("Lyon next."));
    let out = repl(home, &["--continue"], "and after Paris?\n/exit\n");
    assert!(ok(&out).contains("Lyon next."));
    let sent = &mock.requests()[3].body["messages"];
    let said: Vec<&str> = sent
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert!(said.contains(&"plan the trip to France"), "{said:?}");
    assert!(!said.contains(&"what is 2+2"), "{said:?}");

    // --resume takes a title, ignoring case.
    mock.push(Reply::text("Bordeaux."));
    let out = talaria(
        home,
        &[
            "chat",
            "--resume",
            "PLAN THE TRIP TO FRANCE",
            "-q",
            "and then?",
        ],
    );
    assert_eq!(ok(&out).trim(), "Bordeaux.");
    let out = talaria(home, &["sessions", "show", &trip]);
    assert!(ok(&out).contains("Bordeaux."));

    // An unknown title is a clear error.
    let out = talaria(home, &["chat", "--resume", "no such title", "-q", "x"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no session has the id or title `no such title`"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn message_counts_leave_out_rows_undo_and_retry_replaced() {
    let mock = MockOpenAi::start().await;
    let dir = setup(&mock);
    let home = dir.path();
    for answer in ["one", "two", "three", "two again"] {
        mock.push(Reply::text(answer));
    }
    // Three exchanges, one undone, the last retried: 4 rows stand.
    let out = repl(
        home,
        &[],
        "first question\nsecond question\nthird question\n/undo\n/retry\n/exit\n",
    );
    ok(&out);
    let list = ok(&talaria(home, &["sessions", "list"]));
    let row = list
        .lines()
        .find(|l| l.ends_with("first question"))
        .unwrap_or_else(|| panic!("{list}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    // ID, date, time, MESSAGES, SOURCE, title...
    assert_eq!(cells[3], "4", "{list}");
    assert_eq!(cells[4], "cli", "{list}");
    // The header names the columns, and they line up.
    let header = list.lines().next().unwrap();
    assert!(header.starts_with("ID "), "{list}");
    let at = header.find("SOURCE").unwrap();
    assert_eq!(&row[at..at + 3], "cli", "{list}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_source_names_the_sources_there_are() {
    let mock = MockOpenAi::start().await;
    let dir = setup(&mock);
    let home = dir.path();
    let out = talaria(home, &["sessions", "list"]);
    assert!(ok(&out).contains("No sessions yet"));
    mock.push(Reply::text("hi"));
    ok(&talaria(home, &["chat", "-q", "hello"]));
    let out = talaria(home, &["sessions", "list", "--source", "bogus"]);
    let said = ok(&out);
    assert!(
        said.contains("No sessions from `bogus`") && said.contains("cli-oneshot (1)"),
        "{said}"
    );
}

/// `| head` closes the pipe after one line: the command stops quietly,
/// with the status of a tool stopped by a closed pipe, and no backtrace.
#[tokio::test(flavor = "multi_thread")]
async fn a_reader_that_stops_early_ends_every_printing_command_quietly() {
    let mock = MockOpenAi::start().await;
    let dir = setup(&mock);
    let home = dir.path();
    // A long transcript, so `show` writes far more than a pipe holds.
    let long = "word ".repeat(40_000);
    mock.push(Reply::text(&long));
    ok(&talaria(home, &["chat", "-q", "say a lot"]));
    let id = session_titled(home, "say a lot");
    for args in [
        vec!["sessions", "show", id.as_str()],
        vec!["sessions", "export", "--all", "--format", "markdown"],
        vec!["config", "show"],
        vec!["sessions", "list"],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_talaria"))
            .arg("--home")
            .arg(home)
            .args(&args)
            .env_remove("TALARIA_HOME")
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Read one byte, then close our end, as `head -c1` does.
        let mut stdout = child.stdout.take().unwrap();
        let mut first = [0u8; 1];
        let _ = stdout.read(&mut first);
        drop(stdout);
        let out = child.wait_with_output().unwrap();
        let err = text(&out.stderr);
        assert!(
            !err.contains("panicked") && !err.contains("backtrace"),
            "{args:?}: {err}"
        );
        // Short output may fit the pipe before it closes: then success.
        let code = out.status.code();
        assert!(
            code == Some(141) || code == Some(0),
            "{args:?}: {:?} {err}",
            out.status
        );
        if args[0] == "sessions" && (args[1] == "show" || args[1] == "export") {
            assert_eq!(code, Some(141), "{args:?}: {err}");
        }
    }
}

/// A bare `/resume` goes back to the last session with a conversation in
/// it, past sessions started with `/new` and left empty.
#[tokio::test(flavor = "multi_thread")]
async fn a_bare_resume_skips_sessions_left_empty() {
    let mock = MockOpenAi::start().await;
    let dir = setup(&mock);
    let home = dir.path();
    mock.push(Reply::text("Ferries leave hourly."));
    let out = repl(
        home,
        &[],
        "when do ferries leave\n/new\n/new\n/resume\n/status\n/exit\n",
    );
    let said = ok(&out);
    assert!(
        said.contains("Resumed when do ferries leave (2 messages)."),
        "{said}"
    );
    assert!(said.contains("Messages: 2 "), "{said}");
}

/// A skill the agent wrote because the user asked is listed as learned,
/// as the learning graph counts it, not as the user's own.
#[tokio::test(flavor = "multi_thread")]
async fn skills_list_calls_a_skill_the_agent_wrote_on_request_learned() {
    let mock = MockOpenAi::start().await;
    let dir = setup(&mock);
    let home = dir.path();
    let content = "---\nname: rotate-logs\ndescription: Rotate the service logs.\n---\n\n# Rotate logs\n\n1. Run logrotate.\n";
    let args = serde_json::json!({
        "action": "create",
        "name": "rotate-logs",
        "category": "ops",
        "content": content,
    });
    mock.push(Reply::tool_calls(vec![
        talaria_testkit::ToolCallReply::new("c1", "skill_manage", args.to_string()),
    ]));
    mock.push(Reply::text("Saved."));
    ok(&talaria(
        home,
        &["chat", "-q", "please save how to rotate logs as a skill"],
    ));
    let list = ok(&talaria(home, &["skills", "list"]));
    let line = list
        .lines()
        .find(|l| l.contains("rotate-logs"))
        .unwrap_or_else(|| panic!("{list}"));
    assert!(line.contains("learned by the agent"), "{list}");
    assert!(!line.contains("yours"), "{list}");
}
