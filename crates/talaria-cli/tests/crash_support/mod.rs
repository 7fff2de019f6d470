//! What the process-level crash tests of every platform share: a home
//! pointed at the mock LLM and a fake platform, and a `talaria gateway run`
//! process whose environment cannot leak a developer's real credentials;
//! and the crash re-send scenario every platform's kit runs through.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use talaria_store::{LedgerStore, ObligationState};
use talaria_testkit::kit::{PlatformKit, Who};
use talaria_testkit::wait::wait_for;
use talaria_testkit::{MockOpenAi, Reply};

/// Platform variables removed from every spawned gateway's environment, so
/// only the test's home decides what it connects to.
const PLATFORM_VARS: &[&str] = &[
    "TALARIA_HOME",
    "TELEGRAM_BOT_TOKEN",
    "TELEGRAM_ALLOWED_USERS",
    "DISCORD_BOT_TOKEN",
    "DISCORD_ALLOWED_USERS",
    "SLACK_BOT_TOKEN",
    "SLACK_APP_TOKEN",
    "SLACK_ALLOWED_USERS",
    "MATTERMOST_URL",
    "MATTERMOST_TOKEN",
    "MATTERMOST_ALLOWED_USERS",
    "MATRIX_HOMESERVER",
    "MATRIX_ACCESS_TOKEN",
    "MATRIX_USER_ID",
    "MATRIX_E2EE_MODE",
    "MATRIX_ENCRYPTION",
    "MATRIX_DEVICE_ID",
    "MATRIX_DEVICE_TRUST",
    "MATRIX_ALLOWED_USERS",
    "SIGNAL_HTTP_URL",
    "SIGNAL_ACCOUNT",
    "SIGNAL_ALLOWED_USERS",
    "SIGNAL_REQUIRE_MENTION",
    "QQ_APP_ID",
    "QQ_CLIENT_SECRET",
    "QQ_ALLOWED_USERS",
    "WEIXIN_TOKEN",
    "WEIXIN_ACCOUNT_ID",
    "WEIXIN_BASE_URL",
    "WEIXIN_ALLOWED_USERS",
    "GATEWAY_ALLOW_ALL_USERS",
    "GATEWAY_ALLOWED_USERS",
    "API_SERVER_KEY",
    "WHATSAPP_CLOUD_TOKEN",
    "WHATSAPP_CLOUD_PHONE_NUMBER_ID",
    "WHATSAPP_CLOUD_APP_SECRET",
    "WHATSAPP_CLOUD_VERIFY_TOKEN",
    "WHATSAPP_CLOUD_ALLOWED_USERS",
    "FEISHU_APP_ID",
    "FEISHU_APP_SECRET",
    "FEISHU_DOMAIN",
    "FEISHU_CONNECTION_MODE",
    "FEISHU_ENCRYPT_KEY",
    "FEISHU_VERIFICATION_TOKEN",
    "FEISHU_ALLOWED_USERS",
    "FEISHU_ALLOW_ALL_USERS",
    "FEISHU_REQUIRE_MENTION",
    "FEISHU_HOME_CHANNEL",
    "FEISHU_BOT_OPEN_ID",
    "TWILIO_ACCOUNT_SID",
    "TWILIO_AUTH_TOKEN",
    "TWILIO_PHONE_NUMBER",
    "SMS_WEBHOOK_URL",
    "SMS_ALLOWED_USERS",
    "HASS_URL",
    "HASS_TOKEN",
    "HASS_CONVERSATION_TOKEN",
    "EMAIL_ADDRESS",
    "EMAIL_PASSWORD",
    "EMAIL_IMAP_HOST",
    "EMAIL_SMTP_HOST",
    "EMAIL_ALLOWED_USERS",
    "DINGTALK_CLIENT_ID",
    "DINGTALK_CLIENT_SECRET",
    "DINGTALK_ALLOWED_USERS",
    "DINGTALK_ALLOW_ALL_USERS",
    "DINGTALK_REQUIRE_MENTION",
    "DINGTALK_HOME_CHANNEL",
    "DINGTALK_WEBHOOK_URL",
    "DINGTALK_WEBHOOK_SECRET",
    "YUANBAO_APP_ID",
    "YUANBAO_APP_KEY",
    "YUANBAO_APP_SECRET",
    "YUANBAO_ALLOWED_USERS",
    "YUANBAO_GROUP_POLICY",
    "KIT_WEBHOOK_SECRET",
    "GITHUB_WEBHOOK_SECRET",
    "ALERTS_WEBHOOK_SECRET",
    "TELEGRAM_HOME_CHANNEL",
    "TELEGRAM_HOME_CHANNEL_THREAD_ID",
    "WECOM_CALLBACK_CORP_ID",
    "WECOM_CALLBACK_CORP_SECRET",
    "WECOM_CALLBACK_AGENT_ID",
    "WECOM_CALLBACK_TOKEN",
    "WECOM_CALLBACK_ENCODING_AES_KEY",
    "WECOM_CALLBACK_ALLOWED_USERS",
    "WECOM_BOT_ID",
    "WECOM_SECRET",
    "WECOM_WEBSOCKET_URL",
    "WECOM_ALLOWED_USERS",
];

/// A temporary home and the directory for the per-machine token locks.
pub struct Home {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
    pub locks: PathBuf,
}

/// A home using `llm`, with `platforms` (YAML lines indented under
/// `platforms:`) in `config.yaml` and `dotenv` as `.env`.
pub fn home(llm: &MockOpenAi, platforms: &str, dotenv: &str) -> Home {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("home");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(
        root.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {}\n  \
             api_key: sk-test-secret-key-0123456789\nagent:\n  api_max_retries: 1\n\
             platforms:\n{platforms}",
            llm.base_url()
        ),
    )
    .unwrap();
    std::fs::write(root.join(".env"), dotenv).unwrap();
    let locks = dir.path().join("locks");
    Home {
        _dir: dir,
        root,
        locks,
    }
}

/// `talaria gateway run` in `home`, its log in `log`.
pub fn spawn_gateway(home: &Home, log: &Path) -> Child {
    gateway_command(home, log).spawn().unwrap()
}

/// The command [`spawn_gateway`] runs, for a test to add to.
pub fn gateway_command(home: &Home, log: &Path) -> Command {
    let log = std::fs::File::create(log).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_talaria"));
    command
        .arg("--home")
        .arg(&home.root)
        .args(["gateway", "run"]);
    for var in PLATFORM_VARS {
        command.env_remove(var);
    }
    command
        .env_remove("TALARIA_DATABASE_URL")
        .env_remove("TALARIA_NODE_HOST")
        .env("TALARIA_GATEWAY_LOCK_DIR", &home.locks)
        .env(
            "TALARIA_LOG",
            // The ledger's steps at debug: a crash test that fails shows
            // how far the dead gateway got with its reply.
            std::env::var("TALARIA_TEST_GATEWAY_LOG")
                .unwrap_or_else(|_| "info,talaria_gateway::ledger=debug".to_owned()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    command
}

/// A home for `kit`'s platform: its section and its `.env` lines.
pub fn kit_home<K: PlatformKit>(llm: &MockOpenAi, kit: &K) -> Home {
    let dotenv: String = kit
        .dotenv()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}\n"))
        .collect();
    home(llm, &kit.section(), &dotenv)
}

/// Both gateways' logs, for a failure message.
pub fn logs(home: &Home) -> String {
    ["test-gateway.log", "test-gateway-2.log"]
        .iter()
        .map(|f| std::fs::read_to_string(home.root.join(f)).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// The crash re-send, for any platform: a gateway killed (SIGKILL) while
/// its answer is on the wire loses nothing; the restarted gateway sends it
/// exactly once, with the recovery line, to the chat it was owed to,
/// without asking the model again, and the conversation goes on.
pub async fn reply_cut_off_by_sigkill_is_sent_once_after_restart<K: PlatformKit>() {
    let llm = MockOpenAi::start().await;
    let kit = K::start().await;
    let home = kit_home(&llm, &kit);

    let mut first = spawn_gateway(&home, &home.root.join("test-gateway.log"));
    kit.wait_connected(1).await;
    llm.push(Reply::text("The precious answer.").with_delay(K::CRASH_ANSWER_DELAY));
    kit.hang_send(true);
    let asked = kit.push_dm(Who::Friend, "important question");
    kit.wait_send_attempts(1).await;
    // The answer is on the wire and the platform has not answered: crash.
    first.kill().unwrap();
    first.wait().unwrap();
    // The ledger marks a send as begun before it goes out: the dead
    // gateway's one reply must read as handed over, or the restart could
    // not know to say it may be a duplicate.
    let store = talaria_store::SqliteStore::open(&home.root.join("state.db")).unwrap();
    let open = store.open_obligations(10).await.unwrap();
    assert!(
        open.len() == 1 && open[0].state == ObligationState::Attempting,
        "after the kill, with {} send attempts: {open:#?}\n{}",
        kit.send_attempts().len(),
        logs(&home)
    );
    drop(store);
    assert!(kit.sent().is_empty());
    assert_eq!(llm.requests().len(), 1);
    if let Some(held) = kit.unacknowledged() {
        // The message was acknowledged before the turn ran: the platform
        // does not re-deliver it, the ledger is what owes the answer.
        assert_eq!(held, 0, "{}", logs(&home));
    }

    kit.hang_send(false);
    let seen = kit.connections();
    let mut second = spawn_gateway(&home, &home.root.join("test-gateway-2.log"));
    kit.wait_connected(seen + 1).await;
    let sent = kit.wait_sent(1).await;
    let text = &sent[0].text;
    assert!(
        text.starts_with("♻️ Recovered reply"),
        "{text:?}\n{}",
        logs(&home)
    );
    assert!(text.ends_with("The precious answer."), "{text:?}");
    assert_eq!(sent[0].chat, kit.dm_chat(Who::Friend));
    if K::DM_REPLY_QUOTES {
        assert_eq!(sent[0].reply_to.as_deref(), Some(asked.as_str()));
    }
    // Exactly once, and the model was not asked again. A duplicate could
    // only come from a second sweep, which runs at startup or when the
    // adapter reconnects, both within moments of the first send: a short
    // settle catches it here, and the counts after the follow-up below
    // catch one that came later still.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(kit.sent().len(), 1);
    assert_eq!(llm.requests().len(), 1);

    // The conversation goes on where it was (or, where each message is a
    // conversation of its own, a new one starts).
    llm.push(Reply::text("Next answer."));
    kit.push_dm(Who::Friend, "and then?");
    let sent = kit.wait_sent(2).await;
    assert_eq!(sent[1].text, "Next answer.");
    // Both replies are delivered in the ledger and nothing is owed. The
    // follow-up is marked just after its send returns: wait for that.
    let store = talaria_store::SqliteStore::open(&home.root.join("state.db")).unwrap();
    wait_for("every reply delivered in the ledger", || async {
        let open = store.open_obligations(0).await.unwrap();
        let counts = store.obligation_counts().await.unwrap();
        if open.is_empty() && counts.get(&ObligationState::Delivered) == Some(&2) {
            Ok(())
        } else {
            Err((open, counts))
        }
    })
    .await;
    assert_eq!(kit.sent().len(), 2, "the recovered reply was sent again");
    let users: Vec<String> = llm.requests()[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect();
    if K::DMS_CONTINUE {
        assert_eq!(users, vec!["important question", "and then?"]);
    } else {
        assert_eq!(
            users,
            vec!["and then?"],
            "a delivery is a session of its own"
        );
    }
    assert!(!logs(&home).contains(kit.secret()), "the token was logged");

    second.kill().unwrap();
    second.wait().unwrap();
}

/// Waits until `n` replies are marked delivered in the ledger.
pub async fn wait_delivered(home: &Home, n: u64) {
    use talaria_store::{LedgerStore, ObligationState};
    let store = talaria_store::SqliteStore::open(&home.root.join("state.db")).unwrap();
    talaria_testkit::wait::wait_for("replies delivered in the ledger", || async {
        let counts = store.obligation_counts().await.unwrap();
        if counts
            .get(&ObligationState::Delivered)
            .copied()
            .unwrap_or(0)
            >= n
        {
            Ok(())
        } else {
            Err(counts)
        }
    })
    .await;
}
