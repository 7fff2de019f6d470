//! Where log lines go: the terminal of a person running a command gets
//! short sentences, the log file gets the details, and `TALARIA_LOG=debug`
//! follows a turn's life there.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use talaria_testkit::{MockOpenAi, Reply, ToolCallReply};

fn talaria(home: &Path, args: &[&str], log: Option<&str>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_talaria"));
    c.arg("--home")
        .arg(home)
        .args(args)
        .current_dir(home)
        .env_remove("TALARIA_HOME")
        .env_remove("RUST_LOG")
        .env_remove("OPENAI_API_KEY")
        .env_remove("TALARIA_MODEL")
        .env_remove("TALARIA_BASE_URL")
        .stdin(Stdio::null());
    match log {
        Some(filter) => c.env("TALARIA_LOG", filter),
        None => c.env_remove("TALARIA_LOG"),
    };
    c.output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn home_for(base_url: &str, attempts: u32) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {base_url}\n  api_key: sk-test-secret-key-0123456789\nagent:\n  api_max_retries: {attempts}\n"
        ),
    )
    .unwrap();
    (dir, home)
}

fn log_file(home: &Path) -> String {
    std::fs::read_to_string(home.join("logs/talaria.log")).unwrap_or_default()
}

#[test]
fn an_unreachable_model_gets_one_short_line_per_retry_and_the_details_go_to_the_log() {
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let (_dir, home) = home_for(&format!("http://127.0.0.1:{port}/v1"), 3);

    let out = talaria(&home, &["chat", "-q", "hello?"], None);
    assert!(!out.status.success());
    assert!(text(&out.stdout).is_empty(), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    // Three attempts: two retries, one line each, and the failure.
    assert_eq!(lines.len(), 3, "{stderr}");
    assert!(
        lines[0].starts_with("Could not reach the model server; trying again in "),
        "{stderr}"
    );
    assert!(lines[0].ends_with("(attempt 2 of 3)."), "{stderr}");
    assert!(lines[1].ends_with("(attempt 3 of 3)."), "{stderr}");
    assert_eq!(
        lines[2], "talaria: the model call failed: could not reach the model server",
        "{stderr}"
    );
    for line in &lines {
        assert!(
            line.chars().count() <= 100,
            "too long for a terminal: {line}"
        );
        for noise in ["WARN", "INFO", "DEBUG", "ERROR", "provider=", "127.0.0.1"] {
            assert!(!line.contains(noise), "{noise} in: {stderr}");
        }
    }

    // The log has what the terminal left out: each failed attempt with the
    // provider and the client's own words, at the default level.
    let log = log_file(&home);
    assert!(log.contains("WARN"), "{log}");
    assert!(log.contains("attempt 2 of 3"), "{log}");
    assert!(log.contains("model call failed"), "{log}");
    assert!(log.contains("provider=custom:mock-model"), "{log}");
    assert!(!log.contains("sk-test-secret-key-0123456789"), "{log}");
}

#[test]
fn debug_logs_follow_the_turn_and_leave_out_connection_chatter() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = rt.block_on(MockOpenAi::start());
    mock.push(Reply::tool_calls(vec![ToolCallReply::new(
        "call_1",
        "todo",
        r#"{"todos":[{"id":"1","content":"look","status":"pending"}]}"#,
    )]));
    mock.push(Reply::text("All done."));
    let (_dir, home) = home_for(&mock.base_url(), 1);

    let out = talaria(&home, &["chat", "-q", "plan it"], Some("debug"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "All done.\n");
    // Debug lines go to the log, not to the terminal.
    assert!(
        !text(&out.stderr).contains("DEBUG"),
        "{}",
        text(&out.stderr)
    );

    let log = log_file(&home);
    let life = [
        "turn started",
        "model call",
        "model answered",
        "tool call",
        "tool call finished",
        "model call",
        "model answered",
        "turn finished",
    ];
    // In this order.
    let mut from = 0;
    for step in life {
        let at = log[from..]
            .find(&format!("DEBUG {step}"))
            .unwrap_or_else(|| panic!("no `{step}` after byte {from} in:\n{log}"));
        from += at + 1;
    }
    assert!(log.contains("tool=todo"), "{log}");
    // Names and sizes, not words.
    assert!(!log.contains("plan it"), "{log}");
    assert!(!log.contains("All done."), "{log}");
    // hyper's and reqwest's pool lines stay out unless asked for.
    for chatter in [
        "idle connection",
        "starting new connection",
        "connecting to",
    ] {
        assert!(!log.contains(chatter), "{chatter} in:\n{log}");
    }

    // Named by target, they are in.
    mock.push(Reply::text("Again."));
    let out = talaria(
        &home,
        &["chat", "-q", "again"],
        Some("debug,hyper_util=debug,reqwest=debug"),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let log = log_file(&home);
    assert!(
        log.contains("connecting to")
            || log.contains("idle connection")
            || log.contains("starting new connection"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_logs_of_the_gateway_follow_a_message_from_received_to_delivered() {
    use std::time::{Duration, Instant};
    use talaria_testkit::FakeTelegram;

    const TOKEN: &str = "424242:logs-test-token-abcdefghijkl";
    let llm = MockOpenAi::start().await;
    let tg = FakeTelegram::start(TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {}\n  api_key: sk-test-secret-key-0123456789\nagent:\n  api_max_retries: 1\nplatforms:\n  telegram:\n    base_url: {}\n    poll_timeout_secs: 1\n",
            llm.base_url(),
            tg.base_url()
        ),
    )
    .unwrap();
    std::fs::write(
        home.join(".env"),
        format!("TELEGRAM_BOT_TOKEN={TOKEN}\nTELEGRAM_ALLOWED_USERS=7\n"),
    )
    .unwrap();
    // The gateway's log is its standard error.
    let log_path = dir.path().join("gateway.log");
    let mut gateway = Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(&home)
        .args(["gateway", "run"])
        .env_remove("TALARIA_HOME")
        .env_remove("TELEGRAM_BOT_TOKEN")
        .env_remove("TELEGRAM_ALLOWED_USERS")
        .env_remove("GATEWAY_ALLOW_ALL_USERS")
        .env_remove("API_SERVER_KEY")
        .env_remove("RUST_LOG")
        .env("TALARIA_GATEWAY_LOCK_DIR", dir.path().join("locks"))
        .env("TALARIA_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    tg.wait_for_get_updates_calls(1, Duration::from_secs(20))
        .await;

    llm.push(Reply::text("Hello from the gateway."));
    tg.push_private_text(7, "are you there?");
    tg.wait_for_sent(1, Duration::from_secs(20)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let log = loop {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if log.contains("answer delivered") || Instant::now() > deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let _ = gateway.kill();
    let _ = gateway.wait();

    let mut from = 0;
    for step in [
        "message received",
        "sender authorized",
        "turn starting",
        "turn started",
        "model call",
        "model answered",
        "turn finished",
        "answer delivered",
    ] {
        let at = log[from..]
            .find(step)
            .unwrap_or_else(|| panic!("no `{step}` after byte {from} in:\n{log}"));
        from += at + 1;
    }
    assert!(!log.contains("are you there?"), "{log}");
    assert!(!log.contains("idle connection"), "{log}");
}
