//! What the process-level crash tests of every platform share: a home
//! pointed at the mock LLM and a fake platform, and a `talaria gateway run`
//! process whose environment cannot leak a developer's real credentials.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use talaria_testkit::MockOpenAi;

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
    "MATRIX_ALLOWED_USERS",
    "GATEWAY_ALLOW_ALL_USERS",
    "GATEWAY_ALLOWED_USERS",
    "API_SERVER_KEY",
    "WHATSAPP_CLOUD_TOKEN",
    "WHATSAPP_CLOUD_PHONE_NUMBER_ID",
    "WHATSAPP_CLOUD_APP_SECRET",
    "WHATSAPP_CLOUD_VERIFY_TOKEN",
    "WHATSAPP_CLOUD_ALLOWED_USERS",
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
            std::env::var("TALARIA_TEST_GATEWAY_LOG").unwrap_or_else(|_| "info".to_owned()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    command
}
