//! Providers by name (issue 26): each name in `model.provider` parses,
//! resolves its documented base URL and key variable, and reaches the
//! server (here the mock, through the `TALARIA_BASE_URL` override) with
//! its key as a bearer token; OpenRouter's routing preferences and its
//! Anthropic cache breakpoints go out as OpenRouter documents them, and
//! its cache usage comes back into `Usage`.

use std::path::Path;

use serde_json::{Value, json};
use talaria_core::config::{Config, Env};
use talaria_core::{Message, ProviderKind, Secret};
use talaria_llm::{ChatRequest, LlmClient, Provider};
use talaria_testkit::{MockOpenAi, Reply};
use tokio_util::sync::CancellationToken;

/// Name in `config.yaml`, the documented base URL, and the key variables
/// in the order they are read (none: a local server without a key).
const TABLE: &[(&str, ProviderKind, &str, &[&str])] = &[
    (
        "gemini",
        ProviderKind::Gemini,
        "https://generativelanguage.googleapis.com/v1beta/openai",
        &["GEMINI_API_KEY", "GOOGLE_API_KEY"],
    ),
    (
        "deepseek",
        ProviderKind::Deepseek,
        "https://api.deepseek.com/v1",
        &["DEEPSEEK_API_KEY"],
    ),
    (
        "groq",
        ProviderKind::Groq,
        "https://api.groq.com/openai/v1",
        &["GROQ_API_KEY"],
    ),
    (
        "mistral",
        ProviderKind::Mistral,
        "https://api.mistral.ai/v1",
        &["MISTRAL_API_KEY"],
    ),
    (
        "xai",
        ProviderKind::Xai,
        "https://api.x.ai/v1",
        &["XAI_API_KEY"],
    ),
    (
        "together",
        ProviderKind::Together,
        "https://api.together.xyz/v1",
        &["TOGETHER_API_KEY"],
    ),
    (
        "fireworks",
        ProviderKind::Fireworks,
        "https://api.fireworks.ai/inference/v1",
        &["FIREWORKS_API_KEY"],
    ),
    (
        "nous",
        ProviderKind::Nous,
        "https://inference-api.nousresearch.com/v1",
        &["NOUS_API_KEY"],
    ),
    (
        "ollama-cloud",
        ProviderKind::OllamaCloud,
        "https://ollama.com/v1",
        &["OLLAMA_API_KEY"],
    ),
    (
        "openrouter",
        ProviderKind::Openrouter,
        "https://openrouter.ai/api/v1",
        &["OPENROUTER_API_KEY"],
    ),
    (
        "ollama",
        ProviderKind::Ollama,
        "http://127.0.0.1:11434/v1",
        &[],
    ),
    (
        "lmstudio",
        ProviderKind::Lmstudio,
        "http://127.0.0.1:1234/v1",
        &[],
    ),
    ("vllm", ProviderKind::Vllm, "http://127.0.0.1:8000/v1", &[]),
    (
        "llamacpp",
        ProviderKind::Llamacpp,
        "http://127.0.0.1:8080/v1",
        &[],
    ),
];

fn config(yaml: &str) -> Config {
    let (config, warnings) = Config::parse(yaml, Path::new("config.yaml")).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    config
}

fn key_for(name: &str) -> String {
    format!("key-for-{name}-0123456789abcdef")
}

async fn ask(client: &LlmClient) -> talaria_llm::ChatResponse {
    let req = ChatRequest {
        messages: vec![Message::system("sys"), Message::user("hello")],
        ..ChatRequest::default()
    };
    client
        .chat(&req, &|_| {}, &CancellationToken::new())
        .await
        .unwrap()
}

#[tokio::test]
async fn every_named_provider_resolves_and_reaches_its_server_with_its_key() {
    let mock = MockOpenAi::start().await;
    for (i, (name, kind, url, vars)) in TABLE.iter().enumerate() {
        let c = config(&format!(
            "model:\n  provider: {name}\n  default: some-model\n"
        ));
        assert_eq!(c.model.provider, *kind, "{name}");
        assert_eq!(kind.as_str(), *name);
        assert_eq!(ProviderKind::parse(name), Some(*kind));
        assert_eq!(kind.default_base_url(), Some(*url), "{name}");

        // The documented URL when nothing overrides it; the key from the
        // provider's variable; no key needed only for local servers.
        let key = key_for(name);
        let env = match vars.first() {
            Some(var) => Env::from_pairs([(*var, key.as_str())]),
            None => Env::default(),
        };
        let e = c.primary_endpoint(&env).unwrap();
        assert_eq!(e.base_url, *url, "{name}");
        assert_eq!(
            e.api_key.as_ref().map(Secret::expose),
            vars.first().map(|_| key.as_str())
        );
        if !vars.is_empty() {
            let err = c.primary_endpoint(&Env::default()).unwrap_err();
            assert!(err.contains(vars[0]), "{name}: {err}");
        }

        // Pointed at the mock, the request arrives with the right header.
        let mut pairs = vec![("TALARIA_BASE_URL".to_owned(), mock.base_url())];
        if let Some(var) = vars.first() {
            pairs.push(((*var).to_owned(), key.clone()));
        }
        let env = Env::from_pairs(pairs);
        let client = LlmClient::from_config(&c, &env).unwrap();
        mock.push(Reply::text(format!("hi from {name}")));
        let r = ask(&client).await;
        assert_eq!(r.message.content, format!("hi from {name}"));
        assert_eq!(r.provider, *name);
        let got = &mock.requests()[i];
        assert_eq!(got.path, "/v1/chat/completions", "{name}");
        assert_eq!(got.body["model"], "some-model");
        let expected = vars.first().map(|_| format!("Bearer {key}"));
        assert_eq!(got.header("authorization"), expected.as_deref(), "{name}");
        if *kind != ProviderKind::Openrouter {
            assert!(got.body.get("provider").is_none(), "{name}");
        }
    }
}

#[tokio::test]
async fn gemini_takes_the_google_variable_when_its_own_is_unset() {
    let c = config("model:\n  provider: gemini\n  default: gemini-2.5-flash\n");
    let e = c
        .primary_endpoint(&Env::from_pairs([("GOOGLE_API_KEY", "g-key")]))
        .unwrap();
    assert_eq!(e.api_key.as_ref().map(Secret::expose), Some("g-key"));
    let both = Env::from_pairs([("GEMINI_API_KEY", "first"), ("GOOGLE_API_KEY", "second")]);
    let e = c.primary_endpoint(&both).unwrap();
    assert_eq!(e.api_key.as_ref().map(Secret::expose), Some("first"));
    let err = c.primary_endpoint(&Env::default()).unwrap_err();
    assert!(err.contains("GEMINI_API_KEY or GOOGLE_API_KEY"), "{err}");
}

#[test]
fn aliases_and_unknown_names() {
    let c = config("model:\n  provider: llama.cpp\n");
    assert_eq!(c.model.provider, ProviderKind::Llamacpp);
    assert_eq!(
        ProviderKind::parse("LM-Studio"),
        Some(ProviderKind::Lmstudio)
    );
    assert_eq!(ProviderKind::parse("grok"), Some(ProviderKind::Xai));
    assert_eq!(ProviderKind::parse("bard"), None);
    assert!(Config::parse("model:\n  provider: bard\n", Path::new("c.yaml")).is_err());
    // Every kind is listed once and round-trips through its name.
    for kind in ProviderKind::ALL {
        assert_eq!(ProviderKind::parse(kind.as_str()), Some(kind));
    }
}

const OPENROUTER_YAML: &str = "\
model:
  provider: openrouter
  default: anthropic/claude-sonnet-4
  openrouter:
    provider:
      order: [anthropic, amazon-bedrock]
      allow_fallbacks: false
      data_collection: deny
      sort: throughput
";

fn openrouter_client(yaml: &str, mock: &MockOpenAi) -> LlmClient {
    let env = Env::from_pairs([
        ("TALARIA_BASE_URL", mock.base_url()),
        ("OPENROUTER_API_KEY", "sk-or-test-0123456789".to_owned()),
    ]);
    LlmClient::from_config(&config(yaml), &env).unwrap()
}

/// The paths of every `cache_control` in `v`.
fn marks(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                if k == "cache_control" {
                    out.push(at.clone());
                } else {
                    marks(x, format!("{at}/{k}"), out);
                }
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                marks(x, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

fn all_marks(body: &Value) -> Vec<String> {
    let mut out = Vec::new();
    marks(body, String::new(), &mut out);
    out
}

/// A chunk stream whose last chunk reports usage as OpenRouter's usage
/// accounting documents it (`prompt_tokens_details.cached_tokens` and
/// `cache_write_tokens`).
fn stream_with_cache_usage() -> Vec<String> {
    vec![
        json!({"id": "gen-1", "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": "cached!"}, "finish_reason": null}]})
        .to_string(),
        json!({"id": "gen-1", "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {}, "finish_reason": "stop"}]})
        .to_string(),
        json!({"id": "gen-1", "object": "chat.completion.chunk", "choices": [],
               "usage": {"prompt_tokens": 5000, "completion_tokens": 3,
                         "prompt_tokens_details": {"cached_tokens": 4000, "cache_write_tokens": 900},
                         "completion_tokens_details": {"reasoning_tokens": 0}}})
        .to_string(),
    ]
}

#[tokio::test]
async fn openrouter_sends_routing_and_claude_breakpoints_and_reads_cache_usage() {
    let mock = MockOpenAi::start().await;
    let client = openrouter_client(OPENROUTER_YAML, &mock);
    mock.push(Reply::raw_sse(stream_with_cache_usage()));
    let req = ChatRequest {
        messages: vec![
            Message::system("the system prompt"),
            Message::user("first"),
            Message::assistant("one"),
            Message::user("second"),
            Message::assistant_tool_calls(
                "",
                vec![talaria_core::ToolCall {
                    id: "c1".into(),
                    name: "terminal".into(),
                    arguments: "{}".into(),
                }],
            ),
            Message::tool_result("c1", "terminal", "output"),
        ],
        ..ChatRequest::default()
    };
    let r = client
        .chat(&req, &|_| {}, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.message.content, "cached!");
    assert_eq!(r.usage.cache_read_tokens, 4000);
    assert_eq!(r.usage.cache_write_tokens, 900);
    assert_eq!(r.usage.input_tokens, 100, "prompt less cached and written");

    let body = &mock.requests()[0].body;
    assert_eq!(
        body["provider"],
        json!({"order": ["anthropic", "amazon-bedrock"], "allow_fallbacks": false,
               "data_collection": "deny", "sort": "throughput"})
    );
    let m = body["messages"].as_array().unwrap();
    let marker = json!({"type": "ephemeral"});
    // System, and the last three others: the user row and the tool result
    // as text parts; the assistant row that is only a tool call has no
    // content to mark, so it goes out as before.
    assert_eq!(
        m[0]["content"],
        json!([{"type": "text", "text": "the system prompt", "cache_control": marker}])
    );
    assert_eq!(
        m[3]["content"],
        json!([{"type": "text", "text": "second", "cache_control": marker}])
    );
    assert!(m[4]["content"].is_null());
    assert_eq!(m[4]["tool_calls"][0]["id"], "c1");
    assert_eq!(
        m[5]["content"],
        json!([{"type": "text", "text": "output", "cache_control": marker}])
    );
    assert_eq!(m[5]["tool_call_id"], "c1");
    // Older rows are untouched.
    assert_eq!(m[1]["content"], "first");
    assert_eq!(m[2]["content"], "one");
    assert_eq!(all_marks(body).len(), 3);
}

#[tokio::test]
async fn openrouter_without_claude_or_with_caching_off_sends_plain_rows() {
    let mock = MockOpenAi::start().await;
    let other = OPENROUTER_YAML.replace("anthropic/claude-sonnet-4", "openai/gpt-4o");
    let off = format!("{OPENROUTER_YAML}  prompt_caching:\n    enabled: false\n");
    for yaml in [other.as_str(), off.as_str()] {
        let client = openrouter_client(yaml, &mock);
        mock.push(Reply::text("plain"));
        ask(&client).await;
    }
    let requests = mock.requests();
    for r in &requests {
        assert!(all_marks(&r.body).is_empty(), "{}", r.body);
        assert_eq!(r.body["messages"][0]["content"], "sys");
        assert_eq!(r.body["provider"]["sort"], "throughput");
    }
    // A one-hour TTL is passed through on Claude models.
    let hour = format!("{OPENROUTER_YAML}  prompt_caching:\n    ttl: 1h\n");
    let client = openrouter_client(&hour, &mock);
    mock.push(Reply::text("hour"));
    ask(&client).await;
    let body = &mock.requests()[2].body;
    assert_eq!(
        body["messages"][1]["content"][0]["cache_control"],
        json!({"type": "ephemeral", "ttl": "1h"})
    );
}

#[tokio::test]
async fn routing_preferences_are_not_sent_to_other_providers() {
    let mock = MockOpenAi::start().await;
    let yaml = OPENROUTER_YAML.replace("provider: openrouter", "provider: deepseek");
    let env = Env::from_pairs([
        ("TALARIA_BASE_URL", mock.base_url()),
        ("DEEPSEEK_API_KEY", "ds-key".to_owned()),
    ]);
    let client = LlmClient::from_config(&config(&yaml), &env).unwrap();
    mock.push(Reply::text("ok"));
    ask(&client).await;
    let body = &mock.requests()[0].body;
    assert!(body.get("provider").is_none(), "{body}");
    assert!(all_marks(body).is_empty());
}
