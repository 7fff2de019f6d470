//! Probing model servers: fakes of llama.cpp, vLLM, Ollama and LM Studio
//! answer the documented introspection endpoints, and the probe reads the
//! context length and tool support from each.
//!
//! The fakes reproduce these documented fields:
//! - llama.cpp server README, `GET /props`: `default_generation_settings.n_ctx`,
//!   `chat_template` (and, in newer builds, `chat_template_caps.supports_tools`);
//! - vLLM OpenAI-compatible server, `GET /v1/models`: the OpenAI list shape
//!   with `owned_by: "vllm"` and `max_model_len` on each model card;
//! - Ollama API docs, `POST /api/show` with `{"model": name}`: `capabilities`
//!   (`"completion"`, `"tools"`, …), `model_info` with
//!   `general.architecture` and `<arch>.context_length`, and `parameters`
//!   as text lines such as `num_ctx 8192`;
//! - LM Studio REST API, `GET /api/v0/models`: `max_context_length`.

use std::time::{Duration, Instant};

use serde_json::json;
use talaria_llm::probe::{ServerKind, describe_local, detect_local, probe};
use talaria_testkit::MockOpenAi;

const T: Duration = Duration::from_secs(2);

#[tokio::test]
async fn llama_cpp_reports_its_window_and_template() {
    let server = MockOpenAi::start().await;
    server.set_models(&["qwen2.5-7b-instruct-q4_k_m.gguf"]);
    server.set_route(
        "GET",
        "/props",
        200,
        json!({
            "default_generation_settings": {"n_ctx": 4096, "params": {"temperature": 0.8}},
            "total_slots": 1,
            "model_path": "/models/qwen2.5-7b-instruct-q4_k_m.gguf",
            "chat_template": "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- for tool in tools %}{{ tool | tojson }}{%- endfor %}{%- endif %}",
            "build_info": "b4600-abcdef"
        }),
    );
    let info = probe(
        &server.base_url(),
        Some("qwen2.5-7b-instruct-q4_k_m.gguf"),
        None,
        T,
    )
    .await;
    assert_eq!(info.kind, ServerKind::LlamaCpp);
    assert_eq!(info.context_length, Some(4096));
    assert_eq!(info.tools, Some(true));
    assert_eq!(info.models, ["qwen2.5-7b-instruct-q4_k_m.gguf"]);

    // A template that cannot render tools (no --jinja, an old model).
    server.set_route(
        "GET",
        "/props",
        200,
        json!({
            "default_generation_settings": {"n_ctx": 2048},
            "chat_template": "{% for message in messages %}{{ message.content }}{% endfor %}"
        }),
    );
    let info = probe(&server.base_url(), None, None, T).await;
    assert_eq!(info.context_length, Some(2048));
    assert_eq!(info.tools, Some(false));

    // Newer builds say it outright.
    server.set_route(
        "GET",
        "/props",
        200,
        json!({
            "default_generation_settings": {"n_ctx": 32768},
            "chat_template": "{{ tools }}",
            "chat_template_caps": {"supports_tools": false}
        }),
    );
    let info = probe(&server.base_url(), None, None, T).await;
    assert_eq!(info.tools, Some(false));
}

#[tokio::test]
async fn vllm_reports_max_model_len() {
    let server = MockOpenAi::start().await;
    server.set_route(
        "GET",
        "/v1/models",
        200,
        json!({"object": "list", "data": [
            {"id": "meta-llama/Llama-3.1-8B-Instruct", "object": "model", "created": 1733000000,
             "owned_by": "vllm", "root": "meta-llama/Llama-3.1-8B-Instruct", "parent": null,
             "max_model_len": 16384, "permission": []},
            {"id": "other", "object": "model", "owned_by": "vllm", "max_model_len": 999999}
        ]}),
    );
    let info = probe(
        &server.base_url(),
        Some("meta-llama/Llama-3.1-8B-Instruct"),
        Some("token-abc123"),
        T,
    )
    .await;
    assert_eq!(info.kind, ServerKind::Vllm);
    assert_eq!(info.context_length, Some(16384));
    assert_eq!(info.tools, None, "vLLM does not say");
    // The key went along (a vLLM started with --api-key requires it).
    let asked = server
        .probe_requests()
        .into_iter()
        .find(|r| r.path == "/v1/models")
        .unwrap();
    assert_eq!(asked.header("authorization"), Some("Bearer token-abc123"));
}

fn ollama_show(capabilities: &[&str], parameters: &str) -> serde_json::Value {
    json!({
        "license": "…",
        "modelfile": "FROM llama3.2",
        "parameters": parameters,
        "template": "{{ .Prompt }}",
        "details": {"format": "gguf", "family": "llama", "parameter_size": "3.2B", "quantization_level": "Q4_K_M"},
        "model_info": {
            "general.architecture": "llama",
            "general.parameter_count": 3212749888u64,
            "llama.context_length": 131072,
            "llama.embedding_length": 3072
        },
        "capabilities": capabilities,
        "modified_at": "2025-01-01T00:00:00Z"
    })
}

#[tokio::test]
async fn ollama_reports_capabilities_and_context() {
    let server = MockOpenAi::start().await;
    server.set_models(&["llama3.2:latest", "gemma:2b"]);
    server.set_route(
        "POST",
        "/api/show",
        200,
        ollama_show(&["completion", "tools"], "stop \"<|eot_id|>\""),
    );
    let info = probe(&server.base_url(), Some("llama3.2:latest"), None, T).await;
    assert_eq!(info.kind, ServerKind::Ollama);
    assert_eq!(info.context_length, Some(131072));
    assert_eq!(info.tools, Some(true));
    let asked = server
        .probe_requests()
        .into_iter()
        .find(|r| r.path == "/api/show")
        .unwrap();
    assert_eq!(asked.body, json!({"model": "llama3.2:latest"}));

    // A model without tools; its Modelfile sets the window Ollama runs.
    server.set_route(
        "POST",
        "/api/show",
        200,
        ollama_show(&["completion"], "num_ctx 8192\nstop \"<end_of_turn>\""),
    );
    let info = probe(&server.base_url(), Some("gemma:2b"), None, T).await;
    assert_eq!(info.kind, ServerKind::Ollama);
    assert_eq!(info.tools, Some(false));
    assert_eq!(info.context_length, Some(8192));
}

#[tokio::test]
async fn lm_studio_reports_max_context_length() {
    let server = MockOpenAi::start().await;
    server.set_models(&["qwen2.5-7b-instruct"]);
    server.set_route(
        "GET",
        "/api/v0/models",
        200,
        json!({"object": "list", "data": [
            {"id": "qwen2.5-7b-instruct", "object": "model", "type": "llm", "publisher": "lmstudio-community",
             "arch": "qwen2", "compatibility_type": "gguf", "quantization": "Q4_K_M", "state": "loaded",
             "max_context_length": 32768, "capabilities": ["tool_use"]}
        ]}),
    );
    let info = probe(&server.base_url(), Some("qwen2.5-7b-instruct"), None, T).await;
    assert_eq!(info.kind, ServerKind::LmStudio);
    assert_eq!(info.context_length, Some(32768));
    assert_eq!(info.tools, Some(true));
}

#[tokio::test]
async fn a_plain_server_or_none_at_all_leaves_everything_unknown() {
    let server = MockOpenAi::start().await;
    let info = probe(&server.base_url(), Some("mock-model"), None, T).await;
    assert_eq!(info.kind, ServerKind::OpenAiCompatible);
    assert_eq!(info.context_length, None);
    assert_eq!(info.tools, None);

    // Nothing listening: quick, and no error.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let started = Instant::now();
    let info = probe(&format!("http://127.0.0.1:{port}/v1"), None, None, T).await;
    assert_eq!(info.kind, ServerKind::Unknown);
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn a_server_that_hangs_costs_at_most_the_timeout() {
    let server = MockOpenAi::start().await;
    // A listener that accepts and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let started = Instant::now();
    let info = probe(
        &format!("http://127.0.0.1:{port}/v1"),
        None,
        None,
        Duration::from_millis(300),
    )
    .await;
    assert_eq!(info.kind, ServerKind::Unknown);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    hold.abort();
    drop(server);
}

#[tokio::test]
async fn local_servers_are_found_on_the_given_ports() {
    let ollama = MockOpenAi::start().await;
    ollama.set_models(&["llama3.2:latest", "qwen2.5:7b"]);
    ollama.set_route(
        "POST",
        "/api/show",
        404,
        json!({"error": "model not found"}),
    );
    let free = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let ports = [free, ollama.addr().port()];
    let found = detect_local(&ports, Duration::from_millis(800)).await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        found[0].base_url,
        format!("http://127.0.0.1:{}/v1", ports[1])
    );
    assert_eq!(found[0].models, ["llama3.2:latest", "qwen2.5:7b"]);
    let line = describe_local(&found[0]);
    assert!(line.contains("llama3.2:latest, qwen2.5:7b"), "{line}");
}
