//! `talaria chat` with Home Assistant configured: the `ha_*` tools are
//! offered and reach the fake Home Assistant; without the credentials
//! they are not offered at all.

use std::path::Path;

use talaria_testkit::{FakeHomeAssistant, MockOpenAi, Reply, ToolCallReply};

const HASS_TOKEN: &str = "hass-long-lived-token-0123456789";

async fn chat(home: &Path, prompt: &str) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(home)
        .args(["chat", "-q", prompt])
        .env_remove("TALARIA_HOME")
        .env_remove("OPENAI_API_KEY")
        .env_remove("TALARIA_MODEL")
        .env_remove("TALARIA_BASE_URL")
        .env_remove("HASS_URL")
        .env_remove("HASS_TOKEN")
        .env_remove("HASS_CONVERSATION_TOKEN")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap()
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

fn offered(mock: &MockOpenAi, i: usize) -> Vec<String> {
    mock.requests()[i].body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["function"]["name"].as_str())
                .filter(|n| n.starts_with("ha_"))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_offers_the_ha_tools_when_url_and_token_are_set() {
    let mock = MockOpenAi::start().await;
    let ha = FakeHomeAssistant::start(HASS_TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    write_config(
        &home,
        &mock.base_url(),
        &format!(
            "platforms:\n  homeassistant:\n    url: {}\n    token: {HASS_TOKEN}\n",
            ha.url()
        ),
    );
    mock.push(Reply::tool_calls(vec![ToolCallReply::new(
        "c1",
        "ha_get_state",
        r#"{"entity_id": "sensor.outside_temperature"}"#,
    )]));
    mock.push(Reply::text("It is 12.5 °C outside."));
    let out = chat(&home, "how warm is it outside?").await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("12.5 °C"));
    let mut names = offered(&mock, 0);
    names.sort();
    assert_eq!(
        names,
        [
            "ha_call_service",
            "ha_get_state",
            "ha_list_entities",
            "ha_list_services"
        ]
    );
    let second = mock.requests()[1].body.to_string();
    assert!(second.contains("Outside Temperature"), "{second}");
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_offers_no_ha_tools_without_credentials() {
    let mock = MockOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    write_config(&home, &mock.base_url(), "");
    mock.push(Reply::text("hi"));
    let out = chat(&home, "hello").await;
    assert!(out.status.success());
    assert!(offered(&mock, 0).is_empty());
}
