//! Switching models through the binary: `/model` in a Telegram chat (the
//! next request goes to the new model, a running turn refuses the switch,
//! the switch outlives a restart), `talaria model` listing the server's
//! models and setting the default, and `model.routes` on the API server.

use crate::api_gateway;
use crate::crash_support;

use std::process::Command;
use std::time::Duration;

use api_gateway::{ApiGateway, free_port};
use crash_support::{kit_home, logs, spawn_gateway};
use talaria_testkit::kit::telegram::TelegramKit;
use talaria_testkit::kit::{PlatformKit, Who, wait_for_text};
use talaria_testkit::{MockOpenAi, Reply};

/// The model named by the mock's `n`-th request (from 0).
fn model_of(llm: &MockOpenAi, n: usize) -> String {
    let requests = llm.requests();
    requests[n].body["model"].as_str().unwrap_or("").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_switches_a_chat_is_refused_mid_turn_and_outlives_a_restart() {
    let llm = MockOpenAi::start().await;
    let kit = TelegramKit::start().await;
    let home = kit_home(&llm, &kit);
    let log = home.root.join("test-gateway.log");
    let mut gateway = spawn_gateway(&home, &log);
    kit.wait_connected(1).await;

    // Before any switch: the configured model.
    llm.push(Reply::text("first answer"));
    kit.push_dm(Who::Friend, "hello");
    wait_for_text(&kit, "first answer").await;
    assert_eq!(model_of(&llm, 0), "mock-model");
    // The turn is over once its answer is marked delivered: a command sent
    // before that would be refused as arriving mid-turn.
    crash_support::wait_delivered(&home, 1).await;

    kit.push_dm(Who::Friend, "/model small-model");
    let sent = wait_for_text(&kit, "small-model for this conversation").await;
    assert!(
        sent.iter()
            .any(|o| o.text.contains("the default stays mock-model")),
        "{sent:?}"
    );
    llm.push(Reply::text("answer from the small one"));
    kit.push_dm(Who::Friend, "and now?");
    wait_for_text(&kit, "answer from the small one").await;
    assert_eq!(model_of(&llm, 1), "small-model", "{}", logs(&home));
    crash_support::wait_delivered(&home, 2).await;

    // A switch while a turn runs is refused and the turn goes on.
    llm.push(Reply::text("slow answer").with_delay(Duration::from_secs(2)));
    kit.push_dm(Who::Friend, "think hard");
    talaria_testkit::wait::wait_for("the slow request", || async {
        if llm.requests().len() == 3 {
            Ok(())
        } else {
            Err(llm.requests().len())
        }
    })
    .await;
    kit.push_dm(Who::Friend, "/model other-model");
    wait_for_text(&kit, "A turn is running, so /model can't run now").await;
    wait_for_text(&kit, "slow answer").await;
    assert_eq!(model_of(&llm, 2), "small-model");
    crash_support::wait_delivered(&home, 3).await;
    kit.push_dm(Who::Friend, "/model");
    wait_for_text(
        &kit,
        "Model: small-model (this conversation; the default is mock-model)",
    )
    .await;

    // The switch is stored with the session: a restarted gateway keeps it.
    gateway.kill().unwrap();
    gateway.wait().unwrap();
    let seen = kit.connections();
    let mut gateway = spawn_gateway(&home, &home.root.join("test-gateway-2.log"));
    kit.wait_connected(seen + 1).await;
    llm.push(Reply::text("after the restart"));
    kit.push_dm(Who::Friend, "still you?");
    wait_for_text(&kit, "after the restart").await;
    assert_eq!(model_of(&llm, 3), "small-model", "{}", logs(&home));
    crash_support::wait_delivered(&home, 4).await;

    // Back to the default, and a model no server can serve is refused.
    kit.push_dm(Who::Friend, "/model default");
    wait_for_text(&kit, "Model: mock-model, the default").await;
    kit.push_dm(Who::Friend, "/model anthropic:claude-haiku-4-5");
    let sent = wait_for_text(&kit, "Cannot switch to anthropic:claude-haiku-4-5").await;
    assert!(
        sent.iter().any(|o| o.text.contains("ANTHROPIC_API_KEY")),
        "{sent:?}"
    );
    llm.push(Reply::text("default again"));
    kit.push_dm(Who::Friend, "last one");
    wait_for_text(&kit, "default again").await;
    assert_eq!(model_of(&llm, 4), "mock-model");
    assert_eq!(llm.requests().len(), 5);
    gateway.kill().unwrap();
    gateway.wait().unwrap();
}

/// `talaria model` in `home`.
fn talaria_model(home: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(home)
        .arg("model")
        .args(args)
        .env_remove("TALARIA_HOME")
        .env_remove("TALARIA_MODEL")
        .env_remove("TALARIA_BASE_URL")
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn talaria_model_lists_the_servers_models_and_sets_the_default() {
    let llm = MockOpenAi::start().await;
    llm.set_models(&["mock-model", "small-model"]);
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.yaml"),
        format!(
            "# my settings\nmodel:\n  default: mock-model   # the cheap one\n  base_url: {}\n  api_key: sk-test-secret-key-0123456789\n  routes:\n    fast: {{model: small-model}}\n# tuned by hand\nagent:\n  max_turns: 7\n",
            llm.base_url()
        ),
    )
    .unwrap();

    let out = talaria_model(&home, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("* mock-model\n"), "{stdout}");
    assert!(stdout.contains("  small-model\n"), "{stdout}");
    assert!(stdout.contains("fast -> small-model"), "{stdout}");
    // The key went to the server, never to the screen.
    assert_eq!(
        llm.requests()[0].header("authorization"),
        Some("Bearer sk-test-secret-key-0123456789")
    );
    assert!(!stdout.contains("sk-test-secret"), "{stdout}");

    let out = talaria_model(&home, &["small-model"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = std::fs::read_to_string(home.join("config.yaml.bak")).unwrap();
    let text = std::fs::read_to_string(home.join("config.yaml")).unwrap();
    // Only the one value changed: comments and layout are as written.
    assert_eq!(
        text,
        before.replace("default: mock-model ", "default: small-model ")
    );
    let config: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(config["model"]["default"], "small-model");
    // Everything else is kept, the key included; the old file is beside it.
    assert_eq!(config["model"]["api_key"], "sk-test-secret-key-0123456789");
    assert_eq!(config["model"]["routes"]["fast"]["model"], "small-model");
    assert_eq!(config["agent"]["max_turns"], 7);
    assert!(home.join("config.yaml.bak").exists());

    let out = talaria_model(&home, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("* small-model\n"), "{stdout}");

    // A provider without its key changes nothing.
    let out = talaria_model(&home, &["anthropic:claude-haiku-4-5"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ANTHROPIC_API_KEY"), "{stderr}");
    assert!(stderr.contains("nothing was changed"), "{stderr}");
    let after = std::fs::read_to_string(home.join("config.yaml")).unwrap();
    assert_eq!(after, text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_name_on_the_api_server_picks_its_model() {
    let llm = MockOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let port = free_port();
    std::fs::write(
        home.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  base_url: {}\n  routes:\n    fast: {{model: small-model}}\n\
             platforms:\n  api_server:\n    enabled: true\n    port: {port}\n    key: api-key-0123456789\n",
            llm.base_url()
        ),
    )
    .unwrap();
    let gateway = ApiGateway::start(&home, port).await;
    let http = reqwest::Client::new();

    let listed: serde_json::Value = http
        .get(format!("{}/v1/models", gateway.url))
        .bearer_auth("api-key-0123456789")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["mock-model", "fast"]);

    for (asked, served) in [("fast", "small-model"), ("gpt-4o", "mock-model")] {
        llm.push(Reply::text(format!("from {served}")));
        let response: serde_json::Value = http
            .post(format!("{}/v1/chat/completions", gateway.url))
            .bearer_auth("api-key-0123456789")
            .json(&serde_json::json!({
                "model": asked,
                "messages": [{"role": "user", "content": format!("hello {asked}")}],
            }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            response["choices"][0]["message"]["content"],
            format!("from {served}")
        );
        // The client's own name comes back, as OpenAI's clients expect.
        assert_eq!(response["model"], asked);
        let last = llm.requests().len() - 1;
        assert_eq!(model_of(&llm, last), served);
    }
}
