//! At start, `talaria chat` asks the model server what it is: the window a
//! llama.cpp server reports drives compression, a model Ollama says cannot
//! take tools gets one clear warning, and with no model configured the
//! error names a local server that answers.
//!
//! The fakes are the mock model server with the documented introspection
//! endpoints added: llama.cpp's `GET /props`
//! (`default_generation_settings.n_ctx`, `chat_template`) and Ollama's
//! `POST /api/show` (`capabilities`, `model_info`).

use std::path::Path;
use std::process::Output;

use serde_json::json;
use talaria_testkit::{MockOpenAi, Reply};

async fn talaria(home: &Path, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_talaria"));
    cmd.arg("--home")
        .arg(home)
        .args(args)
        .env_remove("TALARIA_HOME")
        .env_remove("OPENAI_API_KEY")
        .env_remove("TALARIA_MODEL")
        .env_remove("TALARIA_BASE_URL")
        .env_remove("TALARIA_LOCAL_PORTS")
        .stdin(std::process::Stdio::null());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().await.unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn write_config(home: &Path, model: &str, base_url: &str, extra: &str) {
    std::fs::create_dir_all(home).unwrap();
    std::fs::write(
        home.join("config.yaml"),
        format!(
            "model:\n  default: {model}\n  provider: custom\n  base_url: {base_url}\n{extra}agent:\n  api_max_retries: 1\nmemory:\n  enabled: false\n"
        ),
    )
    .unwrap();
}

async fn fake_llama_cpp(n_ctx: u64) -> MockOpenAi {
    let mock = MockOpenAi::start().await;
    mock.set_models(&["local.gguf"]);
    mock.set_route(
        "GET",
        "/props",
        200,
        json!({
            "default_generation_settings": {"n_ctx": n_ctx},
            "total_slots": 1,
            "chat_template": "{%- if tools %}{{ tools | tojson }}{%- endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
        }),
    );
    mock
}

/// Whether a request is compression's summary request.
fn is_summary(body: &serde_json::Value) -> bool {
    body.get("tools").is_none()
        && body["messages"][0]["content"]
            .as_str()
            .is_some_and(|s| s.contains("condense the history"))
}

/// Two turns; the second is compressed first when the window is small.
async fn two_turns(home: &Path, mock: &MockOpenAi) -> (Output, Output) {
    mock.push(Reply::text("first answer"));
    let first = talaria(home, &["chat", "-q", "remember the word pelican"], &[]).await;
    mock.push(Reply::text(
        "## Goal\nRemember a word.\n## Progress\nRemembered.",
    ));
    mock.push(Reply::text("second answer"));
    let second = talaria(home, &["chat", "--continue", "-q", "which word?"], &[]).await;
    (first, second)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_llama_cpp_window_of_4096_drives_compression() {
    let mock = fake_llama_cpp(4096).await;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    // No model.context_length: the server's n_ctx is used.
    write_config(
        &home,
        "local.gguf",
        &mock.base_url(),
        "compression:\n  protect_first_n: 1\n  protect_last_n: 1\n",
    );
    let (first, second) = two_turns(&home, &mock).await;
    assert!(first.status.success(), "{}", text(&first.stderr));
    assert!(second.status.success(), "{}", text(&second.stderr));
    assert!(
        !mock.probe_requests().is_empty(),
        "the server was probed at start"
    );
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 3, "first turn, summary, second turn");
    assert!(!is_summary(&reqs[0].body));
    assert!(
        is_summary(&reqs[1].body),
        "the second turn is compressed first at a 4096-token window: {}",
        reqs[1].body
    );
    assert_eq!(text(&second.stdout), "second answer\n");
    // No tools warning: the template renders tools.
    assert!(!text(&second.stderr).contains("tool calls"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_context_length_set_by_the_user_wins_over_the_server() {
    let mock = fake_llama_cpp(4096).await;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    write_config(
        &home,
        "local.gguf",
        &mock.base_url(),
        "  context_length: 1000000\ncompression:\n  protect_first_n: 1\n  protect_last_n: 1\n",
    );
    mock.push(Reply::text("first answer"));
    let first = talaria(&home, &["chat", "-q", "remember the word pelican"], &[]).await;
    assert!(first.status.success(), "{}", text(&first.stderr));
    mock.push(Reply::text("second answer"));
    let second = talaria(&home, &["chat", "--continue", "-q", "which word?"], &[]).await;
    assert!(second.status.success(), "{}", text(&second.stderr));
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 2, "no summary request at a 1M window");
    assert!(reqs.iter().all(|r| !is_summary(&r.body)));
    assert_eq!(text(&second.stdout), "second answer\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ollama_model_without_tools_is_warned_about_once() {
    let mock = MockOpenAi::start().await;
    mock.set_models(&["gemma:2b"]);
    mock.set_route(
        "POST",
        "/api/show",
        200,
        json!({
            "parameters": "stop \"<end_of_turn>\"",
            "details": {"family": "gemma", "parameter_size": "2B"},
            "model_info": {"general.architecture": "gemma", "gemma.context_length": 8192},
            "capabilities": ["completion"]
        }),
    );
    mock.push(Reply::text("plain answer"));
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    write_config(&home, "gemma:2b", &mock.base_url(), "");
    let out = talaria(&home, &["chat", "-q", "hello"], &[]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "plain answer\n");
    let stderr = text(&out.stderr);
    assert_eq!(
        stderr.matches("does not support tool calls").count(),
        1,
        "{stderr}"
    );
    assert!(
        stderr.contains("model gemma:2b on Ollama at") && stderr.contains("text only"),
        "{stderr}"
    );
    let show = mock
        .probe_requests()
        .into_iter()
        .find(|r| r.path == "/api/show")
        .expect("asked /api/show");
    assert_eq!(show.body, json!({"model": "gemma:2b"}));
}

#[tokio::test(flavor = "multi_thread")]
async fn with_no_model_the_error_names_a_local_server() {
    let local = MockOpenAi::start().await;
    local.set_models(&["llama3.2:latest", "qwen2.5:7b"]);
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("config.yaml"), "agent:\n  api_max_retries: 1\n").unwrap();
    let free = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let ports = format!("{free},{}", local.addr().port());
    let out = talaria(
        &home,
        &["chat", "-q", "hello"],
        &[("TALARIA_LOCAL_PORTS", &ports)],
    )
    .await;
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("no model is configured"), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "answers at http://127.0.0.1:{}/v1 with models llama3.2:latest, qwen2.5:7b",
            local.addr().port()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("talaria setup"), "{stderr}");
    assert!(
        local.requests().is_empty(),
        "only probed, never chatted with"
    );

    // Nothing local: the plain message.
    let out = talaria(
        &home,
        &["chat", "-q", "hello"],
        &[("TALARIA_LOCAL_PORTS", &free.to_string())],
    )
    .await;
    let stderr = text(&out.stderr);
    assert!(stderr.contains("no model is configured"), "{stderr}");
    assert!(!stderr.contains("answers at"), "{stderr}");
}
