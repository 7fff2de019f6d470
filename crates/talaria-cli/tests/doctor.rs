//! `talaria doctor`, run as an operator runs it: against a home with five
//! planted problems (a misspelt key, a model address nothing answers at, a
//! read-only database, a `.env` others may read, a Telegram token the
//! platform refuses) it names each and exits 1; against the same home put
//! right it exits 0, having had the model call a tool and Telegram say
//! whose the token is. LINE's and Twilio's credentials are asked of
//! their fakes: the one accepted is named, the one refused fails the
//! doctor. `doctor auth` walks the rules for one sender.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use talaria_store::{PairingLimits, PairingStore, SqliteStore};
use talaria_testkit::kit::line as line_kit;
use talaria_testkit::kit::sms as sms_kit;
use talaria_testkit::{FakeLine, FakeTelegram, FakeTwilio, MockOpenAi, Reply, ToolCallReply};

const TOKEN: &str = "123456:doctor-right-token";

fn talaria(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("TALARIA_HOME")
        .env_remove("TELEGRAM_BOT_TOKEN")
        .env_remove("TELEGRAM_ALLOWED_USERS")
        .env_remove("DISCORD_BOT_TOKEN")
        .env_remove("GATEWAY_ALLOWED_USERS")
        .env_remove("GATEWAY_ALLOW_ALL_USERS")
        .env_remove("TALARIA_DATABASE_URL")
        .stdin(Stdio::null())
        .output()
        .expect("talaria runs")
}

/// The findings of `doctor --json`: (check, status, detail).
fn findings(out: &Output) -> Vec<(String, String, String)> {
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json printed no JSON ({e}):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| {
            (
                c["check"].as_str().unwrap_or_default().to_owned(),
                c["status"].as_str().unwrap_or_default().to_owned(),
                c["detail"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn write_home(root: &Path, model_url: &str, key_line: &str, telegram_url: &str, token: &str) {
    std::fs::create_dir_all(root).unwrap();
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(
        root.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {model_url}\n\
             {key_line}\
             terminal:\n  backend: local\n  untrusted_backend: local\n\
             platforms:\n  telegram:\n    base_url: {telegram_url}\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        root.join("config.yaml"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::write(
        root.join(".env"),
        format!("OPENAI_API_KEY=sk-doctor-key-0123456789\nTELEGRAM_BOT_TOKEN={token}\n"),
    )
    .unwrap();
    std::fs::set_permissions(root.join(".env"), std::fs::Permissions::from_mode(0o600)).unwrap();
    drop(SqliteStore::open(&root.join("state.db")).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_planted_problems_are_named_and_a_healthy_home_passes() {
    let llm = MockOpenAi::start().await;
    let telegram = FakeTelegram::start(TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("home");

    // Nothing listens on a port just bound and released.
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    write_home(
        &root,
        &format!("http://127.0.0.1:{dead_port}/v1"),
        // A misspelt section: the setting it meant stays at its default.
        "modle:\n  temperature: 0.2\n",
        &telegram.base_url(),
        "123456:a-token-telegram-refuses",
    );
    std::fs::set_permissions(
        root.join("state.db"),
        std::fs::Permissions::from_mode(0o444),
    )
    .unwrap();
    std::fs::set_permissions(root.join(".env"), std::fs::Permissions::from_mode(0o644)).unwrap();

    let out = talaria(&root, &["doctor", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let found = findings(&out);
    let failed = |check: &str, needle: &str| {
        found
            .iter()
            .any(|(c, s, d)| c == check && s == "fail" && d.contains(needle))
    };
    assert!(failed("config", "modle"), "the misspelt key: {found:#?}");
    assert!(
        failed("model", &dead_port.to_string()),
        "the dead model address: {found:#?}"
    );
    assert!(
        failed("database", "444"),
        "the read-only database: {found:#?}"
    );
    assert!(failed(".env", "644"), "the readable .env: {found:#?}");
    assert!(
        failed("telegram", "rejected the bot token"),
        "the refused token: {found:#?}"
    );
    assert_eq!(
        found.iter().filter(|(_, s, _)| s == "fail").count(),
        5,
        "exactly the five planted problems: {found:#?}"
    );
    // The keys never show, whatever the servers' errors quoted.
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("sk-doctor-key-0123456789"), "{text}");
    assert!(!text.contains("a-token-telegram-refuses"), "{text}");

    // The same report for people: one line per check, FAIL marked.
    let out = talaria(&root, &["doctor"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("FAIL").count(), 5, "{text}");
    assert!(text.contains("5 problems"), "{text}");

    // Put right, the home passes: the model is asked to call a tool and
    // does, Telegram names the bot.
    std::fs::remove_dir_all(&root).unwrap();
    write_home(&root, &llm.base_url(), "", &telegram.base_url(), TOKEN);
    llm.push_when(
        "doctor_ping",
        Reply::tool_calls(vec![ToolCallReply::new(
            "call_1",
            "doctor_ping",
            r#"{"ok": true}"#,
        )]),
    );
    let out = talaria(&root, &["doctor", "--json"]);
    let found = findings(&out);
    assert_eq!(out.status.code(), Some(0), "{found:#?}");
    let ok = |check: &str, needle: &str| {
        found
            .iter()
            .any(|(c, s, d)| c == check && s == "ok" && d.contains(needle))
    };
    assert!(ok("model", "calls tools"), "{found:#?}");
    assert!(ok("telegram", "@"), "{found:#?}");
    assert!(ok("database", "sound and writable"), "{found:#?}");
    let asked = llm.requests();
    let probe = asked
        .iter()
        .find(|r| r.body.to_string().contains("doctor_ping"))
        .expect("the model was asked to call a tool");
    assert_eq!(probe.body["tools"][0]["function"]["name"], "doctor_ping");

    // A model that answers in words only is a warning, not a pass.
    llm.push_when("doctor_ping", Reply::text("I would rather not."));
    let out = talaria(&root, &["doctor", "--json"]);
    let found = findings(&out);
    assert!(
        found
            .iter()
            .any(|(c, s, d)| c == "model" && s == "warn" && d.contains("did not call")),
        "{found:#?}"
    );

    // Offline, nothing is asked and nothing fails for it.
    let before = llm.requests().len();
    let out = talaria(&root, &["doctor", "--offline"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(llm.requests().len(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_auth_walks_the_rules_for_one_sender() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("home");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(
        root.join(".env"),
        "TELEGRAM_ALLOWED_USERS=111,112\nDISCORD_BOT_TOKEN=x\n",
    )
    .unwrap();
    {
        let store = SqliteStore::open(&root.join("state.db")).unwrap();
        let limits = PairingLimits::default();
        store
            .pairing_offer("discord", "333", Some("Ada"), "333", "ABCD2345", limits)
            .await
            .unwrap();
        store
            .pairing_approve("discord", "ABCD2345", limits)
            .await
            .unwrap();
    }

    let out = talaria(&root, &["doctor", "auth", "telegram:111"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("111 is on TELEGRAM_ALLOWED_USERS"), "{text}");
    assert!(text.contains("verdict: let in (allowlisted)"), "{text}");

    let out = talaria(&root, &["doctor", "auth", "telegram:999"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(
            "999 is not on TELEGRAM_ALLOWED_USERS or GATEWAY_ALLOWED_USERS (it holds 111, 112)"
        ),
        "{text}"
    );
    assert!(text.contains("verdict: kept out"), "{text}");

    // Paired on Discord: the store's approval is what lets them in.
    let out = talaria(&root, &["doctor", "auth", "discord:333"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("333 was approved on discord"), "{text}");
    let out = talaria(&root, &["doctor", "auth", "discord:444"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("pairing code"), "{text}");

    // A bot is never let in by pairing or allow-all, only by its own entry.
    let out = talaria(&root, &["doctor", "auth", "discord:333", "--bot"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("is a bot"), "{text}");

    let out = talaria(&root, &["doctor", "auth", "nowhere:1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no platform named `nowhere`"));
}

/// A home with LINE and SMS (Twilio), each pointed at its fake, and the
/// mock model.
fn write_two_platform_home(root: &Path, llm: &MockOpenAi, line: &FakeLine, twilio: &FakeTwilio) {
    std::fs::create_dir_all(root).unwrap();
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700)).unwrap();
    let config = root.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {}\n\
             terminal:\n  backend: local\n  untrusted_backend: local\n\
             platforms:\n  line:\n    api_base: {line}\n    data_base: {line}\n\
             \x20 sms:\n    api_base: {twilio}\n",
            llm.base_url(),
            line = line.base_url(),
            twilio = twilio.base_url(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    drop(SqliteStore::open(&root.join("state.db")).unwrap());
}

/// `.env` with these LINE and Twilio secrets.
fn write_platform_secrets(root: &Path, line_token: &str, twilio_token: &str) {
    let path = root.join(".env");
    std::fs::write(
        &path,
        format!(
            "OPENAI_API_KEY=sk-doctor-key-0123456789\n\
             LINE_CHANNEL_ACCESS_TOKEN={line_token}\nLINE_CHANNEL_SECRET={}\n\
             TWILIO_ACCOUNT_SID={}\nTWILIO_AUTH_TOKEN={twilio_token}\n\
             TWILIO_PHONE_NUMBER={}\nSMS_WEBHOOK_URL={}\n",
            line_kit::SECRET,
            sms_kit::ACCOUNT_SID,
            sms_kit::NUMBER,
            sms_kit::PUBLIC_URL,
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// `talaria doctor --json` with none of the platforms' variables of the
/// machine running the test.
fn doctor_json(root: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(root)
        .args(["doctor", "--json"])
        .env_remove("TALARIA_HOME")
        .env_remove("TALARIA_DATABASE_URL")
        .env_remove("LINE_CHANNEL_ACCESS_TOKEN")
        .env_remove("LINE_CHANNEL_SECRET")
        .env_remove("TWILIO_ACCOUNT_SID")
        .env_remove("TWILIO_AUTH_TOKEN")
        .env_remove("TWILIO_PHONE_NUMBER")
        .env_remove("SMS_WEBHOOK_URL")
        .env_remove("GATEWAY_ALLOWED_USERS")
        .env_remove("GATEWAY_ALLOW_ALL_USERS")
        .stdin(Stdio::null())
        .output()
        .expect("talaria runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn line_and_twilio_credentials_are_each_asked_of_their_platform() {
    let llm = MockOpenAi::start().await;
    let line = FakeLine::start(line_kit::TOKEN, line_kit::BOT);
    let twilio = FakeTwilio::start(sms_kit::ACCOUNT_SID, sms_kit::AUTH_TOKEN, sms_kit::NUMBER);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("home");
    write_two_platform_home(&root, &llm, &line, &twilio);
    let tool_call = || {
        Reply::tool_calls(vec![ToolCallReply::new(
            "call_1",
            "doctor_ping",
            r#"{"ok": true}"#,
        )])
    };
    let has = |found: &[(String, String, String)], check: &str, status: &str, needle: &str| {
        found
            .iter()
            .any(|(c, s, d)| c == check && s == status && d.contains(needle))
    };

    // LINE takes its token and names the bot; Twilio refuses its token,
    // and that alone fails the doctor.
    write_platform_secrets(&root, line_kit::TOKEN, "a-token-twilio-refuses");
    llm.push_when("doctor_ping", tool_call());
    let out = doctor_json(&root);
    let found = findings(&out);
    assert_eq!(out.status.code(), Some(1), "{found:#?}");
    assert!(has(&found, "line", "ok", "Talaria @123fakeb"), "{found:#?}");
    assert!(has(&found, "sms", "fail", "Twilio rejected"), "{found:#?}");
    assert_eq!(
        found.iter().filter(|(_, s, _)| s == "fail").count(),
        1,
        "only the refused token fails: {found:#?}"
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("a-token-twilio-refuses"), "{text}");

    // The other way round.
    write_platform_secrets(&root, "a-token-line-refuses", sms_kit::AUTH_TOKEN);
    llm.push_when("doctor_ping", tool_call());
    let out = doctor_json(&root);
    let found = findings(&out);
    assert_eq!(out.status.code(), Some(1), "{found:#?}");
    assert!(has(&found, "line", "fail", "LINE refused"), "{found:#?}");
    assert!(
        has(&found, "sms", "ok", "Talaria test account"),
        "{found:#?}"
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("a-token-line-refuses"), "{text}");

    // Both right: the doctor passes.
    write_platform_secrets(&root, line_kit::TOKEN, sms_kit::AUTH_TOKEN);
    llm.push_when("doctor_ping", tool_call());
    let out = doctor_json(&root);
    let found = findings(&out);
    assert_eq!(out.status.code(), Some(0), "{found:#?}");
    assert!(has(&found, "line", "ok", "@123fakeb"), "{found:#?}");
    assert!(
        has(&found, "sms", "ok", "Talaria test account"),
        "{found:#?}"
    );
}
