//! Retries and the fallback chain, end to end against the mocks.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{endpoint, opts, request};
use talaria_core::config::FallbackProvider;
use talaria_core::{Config, Env, ProviderKind, Secret};
use talaria_llm::{ErrorKind, LlmClient, Provider, RetryPolicy, provider_with};
use talaria_testkit::{MockAnthropic, MockOpenAi, Reply};
use tokio_util::sync::CancellationToken;

fn fast(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        base: Duration::from_millis(10),
        max: Duration::from_millis(40),
        retry_after_cap: Duration::from_secs(5),
    }
}

fn openai(mock: &MockOpenAi, model: &str) -> Arc<dyn Provider> {
    provider_with(
        &endpoint(
            ProviderKind::Custom,
            model,
            mock.base_url(),
            Some("sk-primary-0123456789"),
        ),
        opts(true),
    )
}

#[tokio::test]
async fn a_429_is_retried_after_its_retry_after() {
    let mock = MockOpenAi::start().await;
    mock.push(
        Reply::error(429, r#"{"error":{"message":"Rate limit reached"}}"#).with_retry_after(1),
    );
    mock.push(Reply::text("after the wait"));
    let client = LlmClient::new(openai(&mock, "m"), vec![], fast(3));
    let r = client
        .chat(&request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.message.content, "after the wait");
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 2);
    let gap = reqs[1].at.duration_since(reqs[0].at);
    assert!(
        gap >= Duration::from_secs(1),
        "second request came after {gap:?}"
    );
    assert!(gap < Duration::from_secs(3), "{gap:?}");
}

#[tokio::test]
async fn a_500_is_retried_then_succeeds() {
    let mock = MockOpenAi::start().await;
    mock.push(Reply::error(500, "internal error"));
    mock.push(Reply::error(502, "bad gateway"));
    mock.push(Reply::text("third time lucky"));
    let client = LlmClient::new(openai(&mock, "m"), vec![], fast(3));
    let r = client
        .chat(&request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.message.content, "third time lucky");
    assert_eq!(mock.requests().len(), 3);
    assert!(!client.on_fallback());
}

#[tokio::test]
async fn exhausted_retries_fall_back_for_the_rest_of_the_turn() {
    let primary = MockOpenAi::start().await;
    let fallback = MockOpenAi::start().await;
    for _ in 0..2 {
        primary.push(Reply::error(503, "service unavailable"));
    }
    fallback.push(Reply::text("from the fallback"));
    fallback.push(Reply::text("still the fallback"));
    primary.push(Reply::text("primary is back"));
    let client = LlmClient::new(
        openai(&primary, "primary-model"),
        vec![openai(&fallback, "fallback-model")],
        fast(2),
    );
    let cancel = CancellationToken::new();

    let r = client.chat(&request(), &|_| {}, &cancel).await.unwrap();
    assert_eq!(r.message.content, "from the fallback");
    assert_eq!(r.model, "fallback-model");
    assert_eq!(primary.requests().len(), 2);
    assert_eq!(fallback.requests().len(), 1);
    assert_eq!(fallback.requests()[0].body["model"], "fallback-model");
    assert!(client.on_fallback());
    assert_eq!(client.model(), "fallback-model");

    // Same turn: the fallback keeps serving.
    let r = client.chat(&request(), &|_| {}, &cancel).await.unwrap();
    assert_eq!(r.message.content, "still the fallback");
    assert_eq!(primary.requests().len(), 2);

    // New turn: the primary again.
    client.begin_turn();
    let r = client.chat(&request(), &|_| {}, &cancel).await.unwrap();
    assert_eq!(r.message.content, "primary is back");
    assert_eq!(r.model, "primary-model");
}

#[tokio::test]
async fn a_401_falls_back_immediately_across_protocols() {
    let primary = MockOpenAi::start().await;
    let fallback = MockAnthropic::start().await;
    primary.push(Reply::error(
        401,
        r#"{"error":{"message":"invalid key sk-primary-0123456789"}}"#,
    ));
    fallback.push(Reply::text("claude here"));
    let fb = provider_with(
        &endpoint(
            ProviderKind::Anthropic,
            "claude-fb",
            fallback.base_url(),
            Some("sk-ant-fallback-0123456789"),
        ),
        opts(true),
    );
    let client = LlmClient::new(openai(&primary, "m"), vec![fb], fast(3));
    let r = client
        .chat(&request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.message.content, "claude here");
    assert_eq!(
        (r.provider.as_str(), r.model.as_str()),
        ("anthropic", "claude-fb")
    );
    assert_eq!(primary.requests().len(), 1, "auth errors are not retried");
    assert_eq!(fallback.requests().len(), 1);
}

#[tokio::test]
async fn context_overflow_goes_back_to_the_caller() {
    let primary = MockOpenAi::start().await;
    let fallback = MockOpenAi::start().await;
    primary.push(Reply::error(
        400,
        r#"{"error":{"message":"This model's maximum context length is 8192 tokens","code":"context_length_exceeded"}}"#,
    ));
    let client = LlmClient::new(openai(&primary, "m"), vec![openai(&fallback, "f")], fast(3));
    let e = client
        .chat(&request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::ContextOverflow);
    assert_eq!(primary.requests().len(), 1);
    assert!(fallback.requests().is_empty());
}

#[tokio::test]
async fn when_everything_fails_the_last_error_is_returned_without_the_key() {
    let primary = MockOpenAi::start().await;
    let fallback = MockOpenAi::start().await;
    primary.push(Reply::error(401, "bad key sk-primary-0123456789"));
    fallback.push(Reply::error(
        402,
        "insufficient credits for sk-primary-0123456789",
    ));
    let client = LlmClient::new(openai(&primary, "m"), vec![openai(&fallback, "f")], fast(3));
    let e = client
        .chat(&request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Billing);
    assert!(!e.to_string().contains("sk-primary-0123456789"), "{e}");
}

#[tokio::test]
async fn a_backoff_wait_is_interruptible() {
    let mock = MockOpenAi::start().await;
    mock.push(Reply::error(429, "slow down").with_retry_after(30));
    let client = LlmClient::new(
        openai(&mock, "m"),
        vec![],
        RetryPolicy {
            retry_after_cap: Duration::from_secs(60),
            ..fast(3)
        },
    );
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        c2.cancel();
    });
    let t = Instant::now();
    let e = client.chat(&request(), &|_| {}, &cancel).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Interrupted);
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn from_config_wires_primary_and_fallback() {
    let primary = MockOpenAi::start().await;
    let fallback = MockAnthropic::start().await;
    primary.push(Reply::error(404, "model not found"));
    fallback.push(Reply::text("fallback via config"));
    let mut config = Config::default();
    config.model.default = Some("local-model".into());
    config.model.base_url = Some(primary.base_url());
    config.model.api_key = Some(Secret::new("sk-config-0123456789"));
    config.model.temperature = Some(0.2);
    config.fallback_providers = vec![FallbackProvider {
        provider: ProviderKind::Anthropic,
        model: "claude-cfg".into(),
        base_url: Some(fallback.base_url()),
        api_key: None,
    }];
    let env = Env::from_pairs([("ANTHROPIC_API_KEY", "sk-ant-env-0123456789")]);
    let client = LlmClient::from_config(&config, &env).unwrap();
    assert!(client.warnings().is_empty());
    assert_eq!(client.describe(), "custom:local-model");
    let r = client
        .chat(&request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.model, "claude-cfg");
    let p = &primary.requests()[0];
    assert_eq!(
        p.header("authorization"),
        Some("Bearer sk-config-0123456789")
    );
    assert!((p.body["temperature"].as_f64().unwrap() - 0.2).abs() < 1e-6);
    assert_eq!(
        fallback.requests()[0].header("x-api-key"),
        Some("sk-ant-env-0123456789")
    );
    assert!(fallback.requests()[0].body.get("temperature").is_none());

    // A fallback without a key is skipped with a warning, not an error.
    let client = LlmClient::from_config(&config, &Env::default()).unwrap();
    assert_eq!(client.providers().len(), 1);
    assert_eq!(client.warnings().len(), 1);
    assert!(LlmClient::from_config(&Config::default(), &Env::default()).is_err());
}
