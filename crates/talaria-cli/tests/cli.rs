//! End-to-end tests of the `talaria` binary against the mock model server.

use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};
use talaria_testkit::{MockOpenAi, Reply, ToolCallReply};

async fn talaria(home: &Path, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("TALARIA_HOME")
        .env_remove("OPENAI_API_KEY")
        .env_remove("TALARIA_MODEL")
        .env_remove("TALARIA_BASE_URL")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn write_config(home: &Path, base_url: &str, extra: &str) {
    std::fs::create_dir_all(home).unwrap();
    std::fs::write(
        home.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {base_url}\n  api_key: sk-test-secret-key-0123456789\nagent:\n  api_max_retries: 1\n{extra}"
        ),
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn one_shot_prints_only_the_answer_and_persists_the_session() {
    let mock = MockOpenAi::start().await;
    mock.push(Reply::text("Hello from the mock."));
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    write_config(&home, &mock.base_url(), "");

    let out = talaria(&home, &["chat", "-q", "say hello"]).await;
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "Hello from the mock.\n");

    let reqs = mock.requests();
    assert_eq!(reqs.len(), 1);
    let body = &reqs[0].body;
    assert_eq!(body["model"], "mock-model");
    let auth = reqs[0]
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("authorization"))
        .map(|(_, v)| v.clone());
    assert_eq!(
        auth.as_deref(),
        Some("Bearer sk-test-secret-key-0123456789")
    );

    let list = talaria(&home, &["sessions", "list"]).await;
    assert!(list.status.success(), "{}", text(&list.stderr));
    assert!(text(&list.stdout).contains("cli"), "{}", text(&list.stdout));

    let found = talaria(&home, &["sessions", "search", "mock"]).await;
    assert!(found.status.success());
    assert!(
        text(&found.stdout).contains(">>>mock<<<"),
        "{}",
        text(&found.stdout)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn continue_resumes_the_last_session() {
    let mock = MockOpenAi::start().await;
    mock.push(Reply::text("first answer"));
    mock.push(Reply::text("second answer"));
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    write_config(&home, &mock.base_url(), "");

    assert!(
        talaria(&home, &["chat", "-q", "remember the word pelican"])
            .await
            .status
            .success()
    );
    let out = talaria(&home, &["chat", "--continue", "-q", "which word?"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "second answer\n");
    let reqs = mock.requests();
    let second = reqs[1].body.to_string();
    assert!(second.contains("pelican"), "{second}");
    assert!(second.contains("first answer"), "{second}");
    // Byte-identical system prompt across the two processes.
    assert_eq!(reqs[0].body["messages"][0], reqs[1].body["messages"][0]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_round_trip_runs_the_command() {
    let mock = MockOpenAi::start().await;
    mock.push(Reply::tool_calls(vec![ToolCallReply {
        id: "call_1".into(),
        name: "terminal".into(),
        arguments: r#"{"command":"echo tool-output-marker"}"#.into(),
    }]));
    mock.push(Reply::text("The command printed the marker."));
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    write_config(&home, &mock.base_url(), "");

    let out = talaria(&home, &["chat", "-q", "run echo"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "The command printed the marker.\n");
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 2);
    assert!(reqs[1].body.to_string().contains("tool-output-marker"));
}

#[tokio::test(flavor = "multi_thread")]
async fn failures_exit_non_zero_without_leaking_the_key() {
    let mock = MockOpenAi::start().await;
    for _ in 0..4 {
        mock.push(Reply::error(
            401,
            r#"{"error":{"message":"invalid key sk-test-secret-key-0123456789"}}"#,
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    write_config(&home, &mock.base_url(), "");
    let out = talaria(&home, &["chat", "-q", "hi"]).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(!err.is_empty());
    assert!(!err.contains("sk-test-secret-key-0123456789"), "{err}");
    assert!(text(&out.stdout).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_model_chat_says_what_to_set() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("fresh");
    let out = talaria(&home, &["chat", "-q", "hi"]).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("model.default"), "{err}");
    assert!(err.contains("talaria setup"), "{err}");
    // The home was created private.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&home).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn config_check_and_show() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    write_config(&home, "http://127.0.0.1:9/v1", "agent_typo: 1\n");
    let out = talaria(&home, &["config", "check"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("agent_typo"));

    let show = talaria(&home, &["config", "show"]).await;
    assert!(show.status.success());
    let shown = text(&show.stdout);
    assert!(shown.contains("mock-model"), "{shown}");
    assert!(!shown.contains("sk-test-secret-key-0123456789"), "{shown}");
    assert!(shown.contains("****6789"), "{shown}");

    std::fs::write(home.join("config.yaml"), "agent:\n  max_turns: -3\n").unwrap();
    let bad = talaria(&home, &["config", "check"]).await;
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("agent.max_turns"),
        "{}",
        text(&bad.stderr)
    );

    std::fs::write(home.join("config.yaml"), "model: [\n").unwrap();
    let broken = talaria(&home, &["config", "check"]).await;
    assert!(!broken.status.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn config_check_reads_every_platform_section_enabled_or_not() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    // A typo inside a section, and a section no platform has.
    write_config(
        &home,
        "http://127.0.0.1:9/v1",
        "platforms:\n  telegram:\n    enabled: false\n    pol_timeout_secs: 5\n  telegarm:\n    token: x\n",
    );
    let out = talaria(&home, &["config", "check"]).await;
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("unknown key `platforms.telegram.pol_timeout_secs`"),
        "{err}"
    );
    assert!(err.contains("unknown key `platforms.telegarm`"), "{err}");
    assert!(err.contains("telegram, discord"), "{err}");

    // `config show` prints each section as its platform reads it.
    let show = talaria(&home, &["config", "show"]).await;
    assert!(show.status.success());
    let shown = text(&show.stdout);
    assert!(shown.contains("poll_timeout_secs: 30"), "{shown}");
    assert!(shown.contains("max_concurrent_runs: 10"), "{shown}");
    assert!(!shown.contains("telegarm"), "{shown}");

    // A wrong value in a platform that is off still fails, with the key's
    // path and line.
    write_config(
        &home,
        "http://127.0.0.1:9/v1",
        "platforms:\n  slack:\n    enabled: false\n    api_base: ftp://x\n",
    );
    let bad = talaria(&home, &["config", "check"]).await;
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("line 11: `platforms.slack.api_base`"),
        "{}",
        text(&bad.stderr)
    );
    write_config(
        &home,
        "http://127.0.0.1:9/v1",
        "platforms:\n  api_server:\n    port: lots\n",
    );
    let bad = talaria(&home, &["config", "check"]).await;
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("line 10: `platforms.api_server.port`"),
        "{}",
        text(&bad.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn config_check_sets_up_every_registered_platform_it_turns_on() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    write_config(&home, "http://127.0.0.1:9/v1", "");
    let none = talaria(&home, &["config", "check"]).await;
    assert!(none.status.success(), "{}", text(&none.stderr));
    assert!(!text(&none.stdout).contains("platforms:"));

    std::fs::write(
        home.join(".env"),
        "TELEGRAM_BOT_TOKEN=123456:test-token-abcdefghijklmnop\nDISCORD_BOT_TOKEN=discord-test-token\n",
    )
    .unwrap();
    let two = talaria(&home, &["config", "check"]).await;
    assert!(two.status.success(), "{}", text(&two.stderr));
    assert!(
        text(&two.stdout).contains("platforms: telegram, discord"),
        "{}",
        text(&two.stdout)
    );

    // Half a WhatsApp set-up would stop the gateway: the check says so.
    std::fs::write(home.join(".env"), "WHATSAPP_CLOUD_TOKEN=graph-test-token\n").unwrap();
    let half = talaria(&home, &["config", "check"]).await;
    assert!(!half.status.success());
    assert!(
        text(&half.stderr).contains("WhatsApp Cloud is misconfigured"),
        "{}",
        text(&half.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn setup_writes_a_config_that_chat_can_use() {
    let mock = MockOpenAi::start().await;
    mock.push(Reply::text("configured"));
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let url = mock.base_url();
    let out = talaria(
        &home,
        &[
            "setup",
            "--non-interactive",
            "--provider",
            "custom",
            "--base-url",
            &url,
            "--model",
            "m1",
            "--api-key",
            "sk-setup-key-abcdefghijkl",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let env = std::fs::read_to_string(home.join(".env")).unwrap();
    assert!(env.contains("OPENAI_API_KEY"));
    let config = std::fs::read_to_string(home.join("config.yaml")).unwrap();
    assert!(!config.contains("sk-setup-key"), "{config}");

    let chat = talaria(&home, &["chat", "-q", "hi"]).await;
    assert!(chat.status.success(), "{}", text(&chat.stderr));
    assert_eq!(text(&chat.stdout), "configured\n");
    let auth = mock.requests()[0]
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("authorization"))
        .map(|(_, v)| v.clone());
    assert_eq!(auth.as_deref(), Some("Bearer sk-setup-key-abcdefghijkl"));

    let again = talaria(
        &home,
        &[
            "setup",
            "--non-interactive",
            "--model",
            "x",
            "--base-url",
            &url,
        ],
    )
    .await;
    assert!(
        !again.status.success(),
        "an existing config must not be overwritten silently"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn skills_are_listed_shown_pinned_archived_and_restored() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    write_config(&home, "http://127.0.0.1:9", "");
    let mine = home.join("skills/ops/rotate-logs");
    std::fs::create_dir_all(&mine).unwrap();
    std::fs::write(
        mine.join("SKILL.md"),
        "---\nname: rotate-logs\ndescription: Rotate the app logs.\n---\n1. gzip old logs.\n",
    )
    .unwrap();

    let list = talaria(&home, &["skills", "list"]).await;
    let listed = text(&list.stdout);
    assert!(
        listed.contains("rotate-logs") && listed.contains("yours"),
        "{listed}"
    );
    assert!(
        listed.contains("systematic-debugging") && listed.contains("bundled"),
        "{listed}"
    );
    let show = talaria(&home, &["skills", "show", "rotate-logs"]).await;
    assert!(text(&show.stdout).contains("gzip old logs"));

    assert!(
        talaria(&home, &["skills", "pin", "rotate-logs"])
            .await
            .status
            .success()
    );
    assert!(text(&talaria(&home, &["skills", "list"]).await.stdout).contains("pinned"));
    let archive = talaria(&home, &["skills", "archive", "rotate-logs"]).await;
    assert!(archive.status.success(), "{}", text(&archive.stderr));
    assert!(!text(&talaria(&home, &["skills", "list"]).await.stdout).contains("rotate-logs"));
    assert!(
        home.join("skills/.archive/ops/rotate-logs/SKILL.md")
            .is_file()
    );
    let restore = talaria(&home, &["skills", "restore", "rotate-logs"]).await;
    assert!(restore.status.success(), "{}", text(&restore.stderr));
    assert!(mine.join("SKILL.md").is_file());

    let bundled = talaria(&home, &["skills", "archive", "git-workflow"]).await;
    assert!(!bundled.status.success());
    let missing = talaria(&home, &["skills", "show", "nope"]).await;
    assert!(!missing.status.success());
    assert!(text(&missing.stderr).contains("no skill named"));
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_is_shown_and_edited_with_the_edit_logged() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    write_config(&home, "http://127.0.0.1:9", "");
    std::fs::create_dir_all(home.join("memories")).unwrap();
    std::fs::write(
        home.join("memories/MEMORY.md"),
        "The build runs on the ci host.\n§\nDeploys need a ticket.",
    )
    .unwrap();
    let show = talaria(&home, &["memory", "show"]).await;
    let shown = text(&show.stdout);
    assert!(
        shown.contains("2 entries") && shown.contains("- Deploys need a ticket."),
        "{shown}"
    );

    // An "editor" that appends a line, as a person would.
    let editor = dir.path().join("editor.sh");
    std::fs::write(&editor, "#!/bin/sh\nprintf 'Prefers tabs.' >> \"$1\"\n").unwrap();
    std::fs::set_permissions(&editor, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let edit = tokio::process::Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(&home)
        .args(["memory", "edit", "user"])
        .env("VISUAL", &editor)
        .env_remove("TALARIA_HOME")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(edit.status.success(), "{}", text(&edit.stderr));
    assert_eq!(
        std::fs::read_to_string(home.join("memories/USER.md")).unwrap(),
        "Prefers tabs."
    );
    let log = std::fs::read_to_string(home.join("learning/log.jsonl")).unwrap();
    assert!(
        log.contains("\"actor\":\"user\"") && log.contains("memory:USER.md"),
        "{log}"
    );
}

/// `chat --image PATH -q`: the picture reaches the model as an image part
/// beside the question, and a path that cannot be read stops before any
/// model call, saying which.
#[tokio::test(flavor = "multi_thread")]
async fn an_image_attached_on_the_command_line_reaches_the_model() {
    // A 2×2 PNG.
    const PNG: &[u8] = b"\x89\x50\x4e\x47\x0d\x0a\x1a\x0a\x00\x00\x00\x0d\x49\x48\x44\x52\x00\x00\x00\x02\x00\x00\x00\x02\x08\x02\x00\x00\x00\xfd\xd4\x9a\x73\x00\x00\x00\x10\x49\x44\x41\x54\x78\x9c\x63\xf8\xcf\x00\x04\xff\x19\x20\x14\x00\x1b\xf2\x03\xfd\xd6\x96\xf2\x2b\x00\x00\x00\x00\x49\x45\x4e\x44\xae\x42\x60\x82";
    let mock = MockOpenAi::start().await;
    mock.push(Reply::text("A tiny red square."));
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {}\n  \
             api_key: sk-test-secret-key-0123456789\n  vision: on\n",
            mock.base_url()
        ),
    )
    .unwrap();
    let picture = dir.path().join("pic.png");
    std::fs::write(&picture, PNG).unwrap();
    let picture = picture.to_str().unwrap();

    let out = talaria(&home, &["chat", "--image", picture, "-q", "what is this?"]).await;
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "A tiny red square.\n");
    let body = &mock.requests()[0].body;
    let user = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .unwrap();
    let parts = user["content"].as_array().expect("content parts");
    assert!(
        parts.iter().any(
            |p| p["type"] == "text" && p["text"].as_str().unwrap().starts_with("what is this?")
        ),
        "{user}"
    );
    assert!(
        parts.iter().any(|p| p["type"] == "image_url"
            && p["image_url"]["url"]
                .as_str()
                .unwrap()
                .starts_with("data:image/")),
        "{user}"
    );

    let missing = dir.path().join("nope.png");
    let out = talaria(
        &home,
        &[
            "chat",
            "--image",
            missing.to_str().unwrap(),
            "-q",
            "and this?",
        ],
    )
    .await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("cannot read") && text(&out.stderr).contains("nope.png"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(mock.requests().len(), 1, "no model call for a missing file");
}

// delegate_task and execute_code: what a person running the CLI gets.

/// A home on `mock` whose commands run in its `work` directory, with
/// `extra` YAML.
fn home_with_workdir(mock: &MockOpenAi, extra: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let work = home.join("work");
    std::fs::create_dir_all(&work).unwrap();
    write_config(
        &home,
        &mock.base_url(),
        &format!("terminal:\n  cwd: {}\n{extra}", work.display()),
    );
    (dir, home)
}

/// The names of the tools a recorded request offered.
fn offered(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delegated_task_runs_on_its_own_model_with_fewer_tools_and_returns_its_summary() {
    let mock = MockOpenAi::start().await;
    let args = json!({
        "goal": "Count the lines of notes.txt",
        "context": "The file is in the working directory.",
    });
    mock.push(Reply::tool_calls(vec![ToolCallReply::new(
        "call_delegate",
        "delegate_task",
        args.to_string(),
    )]));
    mock.push(Reply::text("notes.txt has 3 lines."));
    mock.push(Reply::text("Your notes have three lines."));
    let (_dir, home) = home_with_workdir(&mock, "delegation:\n  model: child-model\n");

    let out = talaria(&home, &["chat", "-q", "how long are my notes?"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "Your notes have three lines.\n");

    let requests = mock.requests();
    assert_eq!(requests.len(), 3, "{requests:#?}");
    let parent = &requests[0].body;
    let child = &requests[1].body;
    let last = &requests[2].body;
    // The parent is offered the work-that-outlives-a-turn tools.
    let parent_tools = offered(parent);
    for tool in ["terminal", "process", "delegate_task", "execute_code"] {
        assert!(
            parent_tools.iter().any(|t| t == tool),
            "{tool}: {parent_tools:?}"
        );
    }
    // The child runs on delegation.model, knows the task and nothing of
    // the parent's conversation, and lacks the tools a subagent may not use.
    assert_eq!(child["model"], "child-model");
    assert_eq!(parent["model"], "mock-model");
    let child_text = child["messages"].to_string();
    assert!(
        child_text.contains("Count the lines of notes.txt"),
        "{child_text}"
    );
    assert!(
        !child_text.contains("how long are my notes"),
        "{child_text}"
    );
    let child_tools = offered(child);
    assert!(
        child_tools.iter().any(|t| t == "read_file"),
        "{child_tools:?}"
    );
    for blocked in [
        "delegate_task",
        "memory",
        "send_message",
        "clarify",
        "execute_code",
    ] {
        assert!(
            !child_tools.iter().any(|t| t == blocked),
            "{blocked}: {child_tools:?}"
        );
    }
    // The parent's last request holds the child's summary.
    assert!(
        last["messages"]
            .to_string()
            .contains("notes.txt has 3 lines."),
        "{}",
        last["messages"]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn execute_code_calls_tools_from_a_script_and_only_its_print_comes_back() {
    let mock = MockOpenAi::start().await;
    let script = "from talaria_tools import read_file, search_files\n\
                  found = search_files('needle', target='content')\n\
                  page = read_file('data.txt')\n\
                  print('SUMMARY', 'needle' in str(found), len(str(page)) > 0)\n";
    mock.push(Reply::tool_calls(vec![ToolCallReply::new(
        "call_code",
        "execute_code",
        json!({ "code": script }).to_string(),
    )]));
    mock.push(Reply::text("The script found it."));
    let (_dir, home) = home_with_workdir(&mock, "");
    let work = home.join("work");
    std::fs::write(work.join("data.txt"), "hay\nneedle\nhay\n").unwrap();

    let out = talaria(&home, &["chat", "-q", "look for the needle"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "The script found it.\n");
    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    let result = requests[1].body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "tool"))
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default();
    assert!(result.contains("SUMMARY True True"), "{result}");
    assert!(result.contains("\"tool_calls_made\":2"), "{result}");
    // The file's own text went to the script, not to the model.
    assert!(!result.contains("hay"), "{result}");
}

/// `talaria completions bash` is a script bash takes: completing
/// `talaria ga` offers `gateway`, and `talaria backup --w` offers
/// `--with-secrets`. The home is not touched.
#[tokio::test]
async fn bash_completes_subcommands_and_flags_from_the_generated_script() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("untouched");
    let out = talaria(&home, &["completions", "bash"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!home.exists(), "completions made a home");
    let script = dir.path().join("talaria.bash");
    std::fs::write(&script, &out.stdout).unwrap();
    let complete = |words: &str| {
        let program = format!(
            "source {}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
             COMP_LINE=\"${{COMP_WORDS[*]}}\"; COMP_POINT=${{#COMP_LINE}}; \
             _talaria talaria \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; \
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.display()
        );
        let run = std::process::Command::new("bash")
            .args(["--norc", "-c", &program])
            .output()
            .expect("bash runs");
        assert!(run.status.success(), "{}", text(&run.stderr));
        text(&run.stdout)
    };
    let offered = complete("talaria ga");
    assert!(offered.lines().any(|l| l == "gateway"), "{offered}");
    let offered = complete("talaria backup --w");
    assert!(offered.lines().any(|l| l == "--with-secrets"), "{offered}");
}
