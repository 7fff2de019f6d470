//! `talaria setup` as a person runs it: the real binary in a pseudo-terminal,
//! answering its questions, against the mock model server.

use std::path::{Path, PathBuf};
use std::process::Command;

use rexpect::reader::Options;
use rexpect::session::{PtySession, spawn_with_options};
use talaria_core::Home;
use talaria_platforms::telegram::TelegramSettings;
use talaria_testkit::MockOpenAi;

/// Where nothing listens: connecting to port 1 of loopback is refused.
const NOBODY: &str = "http://127.0.0.1:1/v1";

struct Setup {
    _dir: tempfile::TempDir,
    home: PathBuf,
    p: PtySession,
}

/// `talaria setup` in a pseudo-terminal that echoes what is typed, as a
/// person's terminal does (rexpect turns the echo off; `stty` puts it
/// back before the binary starts), so a secret that is not hidden shows.
fn spawn_setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"stty echo && exec "$0" --home "$1" setup"#)
        .arg(env!("CARGO_BIN_EXE_talaria"))
        .arg(&home);
    for var in [
        "TALARIA_HOME",
        "TALARIA_MODEL",
        "TALARIA_BASE_URL",
        "OPENAI_API_KEY",
        "OPENROUTER_API_KEY",
        "ANTHROPIC_API_KEY",
        "TELEGRAM_BOT_TOKEN",
        "TELEGRAM_ALLOWED_USERS",
        "TELEGRAM_HOME_CHANNEL",
    ] {
        cmd.env_remove(var);
    }
    cmd.current_dir(dir.path());
    let p = spawn_with_options(
        cmd,
        Options::new()
            .timeout_ms(Some(20_000))
            .strip_ansi_escape_codes(true),
    )
    .unwrap();
    Setup { _dir: dir, home, p }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn answers_are_checked_as_given_the_key_is_hidden_and_the_servers_models_are_offered() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = rt.block_on(MockOpenAi::start());
    mock.set_models(&["alpha-7b", "beta-13b"]);
    let Setup { _dir, home, mut p } = spawn_setup();

    p.exp_string("Provider (a number or a name) [custom]:")
        .unwrap();
    p.send_line("palm").unwrap();
    // The terminal echoes what is typed (so the hidden key below means
    // something).
    let echoed = p.exp_string("unknown provider `palm`").unwrap();
    assert!(echoed.contains("palm"), "{echoed:?}");
    p.exp_string("Provider (a number or a name) [custom]:")
        .unwrap();
    p.send_line("1").unwrap();

    // A base URL without a scheme is explained and asked again.
    let url = mock.base_url();
    let bare = url.trim_start_matches("http://");
    p.exp_string("Base URL [http://127.0.0.1:8080/v1]:")
        .unwrap();
    p.send_line(bare).unwrap();
    p.exp_string("has no scheme").unwrap();
    p.exp_string("Base URL [http://127.0.0.1:8080/v1]:")
        .unwrap();
    p.send_line(&url).unwrap();

    // The key is typed with the echo off.
    let key = "sk-typed-secret-0123456789";
    p.exp_string("API key (hidden; Enter for none):").unwrap();
    p.send_line(key).unwrap();
    let shown = p.exp_string("for its models...").unwrap();
    assert!(!shown.contains(key), "the key was echoed: {shown:?}");

    // The server's models, picked by number.
    p.exp_string("The server offers 2 models:").unwrap();
    p.exp_string("1) alpha-7b").unwrap();
    p.exp_string("2) beta-13b").unwrap();
    p.exp_string("Model (a number or a name) [1]:").unwrap();
    p.send_line("7").unwrap();
    p.exp_string("there is no model number 7").unwrap();
    p.exp_string("Model (a number or a name) [1]:").unwrap();
    p.send_line("2").unwrap();

    p.exp_string("Connect a Telegram bot now? (y/N):").unwrap();
    p.send_line("").unwrap();
    p.exp_string("stored OPENAI_API_KEY").unwrap();
    p.exp_string("next: talaria chat").unwrap();
    p.exp_eof().unwrap();

    let config = read(&home.join("config.yaml"));
    assert!(config.contains("default: beta-13b"), "{config}");
    assert!(config.contains(&url), "{config}");
    assert!(!config.contains(key), "{config}");
    let dotenv = read(&home.join(".env"));
    assert!(
        dotenv.contains(&format!("OPENAI_API_KEY=\"{key}\"")),
        "{dotenv}"
    );

    // The list came from the server, asked with the key.
    let asked = mock
        .requests()
        .into_iter()
        .find(|r| r.path == "/v1/models")
        .expect("the models were not asked for");
    assert_eq!(
        asked.header("authorization"),
        Some(format!("Bearer {key}").as_str())
    );
}

#[test]
fn an_unreachable_server_is_reported_before_writing_and_can_be_fixed_keeping_the_answers() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = rt.block_on(MockOpenAi::start());
    let Setup { _dir, home, mut p } = spawn_setup();

    p.exp_string("Provider (a number or a name) [custom]:")
        .unwrap();
    p.send_line("").unwrap();
    p.exp_string("Base URL").unwrap();
    p.send_line(NOBODY).unwrap();
    p.exp_string("API key").unwrap();
    p.send_line("").unwrap();
    p.exp_string("Cannot list the models at http://127.0.0.1:1/v1: nothing answers there")
        .unwrap();
    p.exp_string("Nothing has been written yet.").unwrap();
    p.exp_string("[f]ix the answers, [r]etry, or [w]rite them anyway [f]:")
        .unwrap();
    assert!(!home.join("config.yaml").exists());
    assert!(!home.join(".env").exists());

    // Fixing goes through the questions again, with the answers given so
    // far as the defaults.
    p.send_line("").unwrap();
    p.exp_string("Provider (a number or a name) [custom]:")
        .unwrap();
    p.send_line("").unwrap();
    p.exp_string(&format!("Base URL [{NOBODY}]:")).unwrap();
    p.send_line(&mock.base_url()).unwrap();
    p.exp_string("API key").unwrap();
    p.send_line("").unwrap();
    p.exp_string("1) mock-model").unwrap();
    p.exp_string("Model (a number or a name) [1]:").unwrap();
    p.send_line("").unwrap();
    p.exp_string("Connect a Telegram bot now?").unwrap();
    p.send_line("n").unwrap();
    p.exp_eof().unwrap();
    let config = read(&home.join("config.yaml"));
    assert!(config.contains("default: mock-model"), "{config}");
    assert!(config.contains(&mock.base_url()), "{config}");
    // No key was given, so none is stored.
    assert!(!home.join(".env").exists());
}

#[test]
fn an_unreachable_server_can_be_written_anyway() {
    let Setup { _dir, home, mut p } = spawn_setup();
    p.exp_string("Provider").unwrap();
    p.send_line("custom").unwrap();
    p.exp_string("Base URL").unwrap();
    p.send_line(NOBODY).unwrap();
    p.exp_string("API key").unwrap();
    p.send_line("").unwrap();
    p.exp_string("[w]rite them anyway").unwrap();
    p.send_line("w").unwrap();
    // Without the server's list, the name is typed, and must not be empty.
    p.exp_string("Model name:").unwrap();
    p.send_line("").unwrap();
    p.exp_string("a model name is required").unwrap();
    p.exp_string("Model name:").unwrap();
    p.send_line("local-llama").unwrap();
    p.exp_string("Connect a Telegram bot now?").unwrap();
    p.send_line("n").unwrap();
    p.exp_eof().unwrap();
    let config = read(&home.join("config.yaml"));
    assert!(config.contains("default: local-llama"), "{config}");
    assert!(config.contains(NOBODY), "{config}");
}

#[test]
fn a_provider_that_needs_a_key_is_refused_without_one() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = rt.block_on(MockOpenAi::start());
    let Setup { _dir, home, mut p } = spawn_setup();
    p.exp_string("Provider").unwrap();
    p.send_line("openai").unwrap();
    p.exp_string("API key (hidden):").unwrap();
    p.send_line("").unwrap();
    p.exp_string("openai needs an API key").unwrap();
    // Back to the provider, with the answer kept.
    p.exp_string("Provider (a number or a name) [openai]:")
        .unwrap();
    assert!(!home.join("config.yaml").exists());
    p.send_line("custom").unwrap();
    p.exp_string("Base URL").unwrap();
    p.send_line(&mock.base_url()).unwrap();
    p.exp_string("API key (hidden; Enter for none):").unwrap();
    p.send_line("").unwrap();
    p.exp_string("Model (a number or a name) [1]:").unwrap();
    p.send_line("1").unwrap();
    p.exp_string("Connect a Telegram bot now?").unwrap();
    p.send_line("n").unwrap();
    p.exp_eof().unwrap();
    assert!(read(&home.join("config.yaml")).contains("provider: custom"));

    // Without questions, the same refusal, and nothing written.
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("home");
    let out = Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(&other)
        .args([
            "setup",
            "--non-interactive",
            "--provider",
            "openai",
            "--model",
            "gpt-4o",
        ])
        .env_remove("TALARIA_HOME")
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs an API key"), "{err}");
    assert!(!other.join("config.yaml").exists());
}

#[test]
fn a_telegram_bot_and_its_owner_end_up_where_the_gateway_reads_them() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = rt.block_on(MockOpenAi::start());
    let Setup { _dir, home, mut p } = spawn_setup();
    p.exp_string("Provider").unwrap();
    p.send_line("").unwrap();
    p.exp_string("Base URL").unwrap();
    p.send_line(&mock.base_url()).unwrap();
    p.exp_string("API key").unwrap();
    p.send_line("").unwrap();
    p.exp_string("Model (a number or a name) [1]:").unwrap();
    p.send_line("mock-model").unwrap();

    p.exp_string("Connect a Telegram bot now? (y/N):").unwrap();
    p.send_line("y").unwrap();
    p.exp_string("Bot token (hidden):").unwrap();
    p.send_line("not-a-token").unwrap();
    p.exp_string("does not look like a bot token").unwrap();
    p.exp_string("Bot token (hidden):").unwrap();
    let token = "987654321:AAHsetupTestToken_abcdefghijklmnop";
    p.send_line(token).unwrap();
    let shown = p.exp_string("Your Telegram user id:").unwrap();
    assert!(
        !shown.contains("AAHsetupTestToken"),
        "the token was echoed: {shown:?}"
    );
    p.send_line("@ann").unwrap();
    p.exp_string("is not a Telegram user id").unwrap();
    p.exp_string("Your Telegram user id:").unwrap();
    p.send_line("123456789").unwrap();
    p.exp_string("stored TELEGRAM_BOT_TOKEN, TELEGRAM_ALLOWED_USERS, TELEGRAM_HOME_CHANNEL")
        .unwrap();
    p.exp_string("talaria gateway start").unwrap();
    p.exp_eof().unwrap();

    // Read back the way the gateway reads them.
    let loaded = talaria_core::config::load(&Home::at(&home)).unwrap();
    let settings = TelegramSettings::from_config(&loaded.config.section().unwrap(), &loaded.env)
        .expect("Telegram is not enabled");
    assert_eq!(settings.token, token);
    assert_eq!(loaded.env.get("TELEGRAM_ALLOWED_USERS"), Some("123456789"));
    assert_eq!(loaded.env.get("TELEGRAM_HOME_CHANNEL"), Some("123456789"));
    let config = read(&home.join("config.yaml"));
    assert!(!config.contains(token), "{config}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(home.join(".env"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
