//! `talaria config show` through the binary: the configuration as it takes
//! effect, with what `.env` and the process supply filled in, masked, and
//! said where it came from.

use std::process::Command;

#[test]
fn config_show_fills_in_values_from_env_files_masked_with_their_origin() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    std::fs::write(
        home.join("config.yaml"),
        "model:\n  default: local-model\n  base_url: http://127.0.0.1:8080/v1\n",
    )
    .unwrap();
    std::fs::write(
        home.join(".env"),
        "TELEGRAM_BOT_TOKEN=123456:ABCDEFGHIJKLMNOPQRSTUVWX\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(home)
        .args(["config", "show"])
        .env_remove("TALARIA_HOME")
        .env_remove("TELEGRAM_BOT_TOKEN")
        .env_remove("TALARIA_BASE_URL")
        .env("TALARIA_MODEL", "override-model")
        .output()
        .unwrap();
    assert!(out.status.success());
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(!shown.contains("ABCDEFGHIJ"), "{shown}");
    // The token's own line under `telegram:` holds the masked value.
    let telegram = shown.split("telegram:").nth(1).unwrap_or_default();
    let token_line = telegram
        .lines()
        .find(|l| l.trim_start().starts_with("token:"))
        .unwrap_or_default();
    assert!(token_line.contains("****UVWX"), "{shown}");
    assert!(
        shown.contains("platforms.telegram.token = ****UVWX (TELEGRAM_BOT_TOKEN from .env)"),
        "{shown}"
    );
    assert!(
        shown.contains(
            "model.default = override-model (TALARIA_MODEL from the environment, over the file's value)"
        ),
        "{shown}"
    );
    assert!(
        shown.contains("custom override-model at http://127.0.0.1:8080/v1"),
        "{shown}"
    );
}
