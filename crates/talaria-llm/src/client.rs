//! [`LlmClient`]: retries, then the fallback chain.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use async_trait::async_trait;
use talaria_core::config::{AgentConfig, VisionMode};
use talaria_core::{Config, Endpoint, Env};
use tokio_util::sync::CancellationToken;

use crate::anthropic::AnthropicProvider;
use crate::classify::is_retryable;
use crate::http::HttpOptions;
use crate::openai::OpenAiProvider;
use crate::retry::{RetryPolicy, sleep_or_cancel};
use crate::{ChatRequest, ChatResponse, ErrorKind, EventSink, LlmError, Provider, StreamEvent};

/// The provider for an endpoint, with the `agent:` timeouts.
pub fn provider_for(endpoint: &Endpoint, agent: &AgentConfig) -> Arc<dyn Provider> {
    provider_with(endpoint, HttpOptions::from_agent(agent))
}

/// The provider for an endpoint with explicit HTTP options.
pub fn provider_with(endpoint: &Endpoint, opts: HttpOptions) -> Arc<dyn Provider> {
    if endpoint.provider.is_anthropic() {
        Arc::new(AnthropicProvider::new(endpoint, opts))
    } else {
        Arc::new(OpenAiProvider::new(endpoint, opts))
    }
}

/// The provider for `auxiliary.vision` (the model `vision_analyze` and
/// `media.describe_images` ask), or `None` when none is configured; the
/// error says what the block lacks. It is configured to look at images, so
/// it is sent them unless its block says `vision: off`: `auto` would judge
/// an unfamiliar local model's name as blind.
pub fn auxiliary_vision_provider(
    config: &Config,
    env: &Env,
) -> Option<Result<Arc<dyn Provider>, String>> {
    let block = config.auxiliary.vision.as_ref()?;
    let vision = match block.vision {
        VisionMode::Off => VisionMode::Off,
        VisionMode::Auto | VisionMode::On => VisionMode::On,
    };
    let endpoint = config.vision_endpoint(env)?;
    Some(auxiliary_provider(
        config,
        env,
        endpoint,
        block,
        Some(vision),
    ))
}

/// The provider for `auxiliary.web` (the model that summarises long pages
/// for `web_extract`), or `None` when none is configured; the error says
/// what the block lacks.
pub fn auxiliary_web_provider(
    config: &Config,
    env: &Env,
) -> Option<Result<Arc<dyn Provider>, String>> {
    let block = config.auxiliary.web.as_ref()?;
    let endpoint = config.web_endpoint(env)?;
    Some(auxiliary_provider(config, env, endpoint, block, None))
}

/// The provider of an `auxiliary.<job>` block at `endpoint`, with the
/// block's token and temperature defaults, every configured secret kept
/// out of its errors, and `vision` when the job decides it.
fn auxiliary_provider(
    config: &Config,
    env: &Env,
    endpoint: Result<talaria_core::Endpoint, String>,
    block: &talaria_core::config::ModelConfig,
    vision: Option<VisionMode>,
) -> Result<Arc<dyn Provider>, String> {
    let endpoint = endpoint?;
    let mut secrets = env.secret_values();
    secrets.extend(config.secret_values());
    let mut opts = HttpOptions {
        default_max_tokens: block.max_tokens,
        default_temperature: block.temperature,
        secrets,
        ..HttpOptions::from_agent(&config.agent)
    };
    if let Some(vision) = vision {
        opts.vision = vision;
    }
    Ok(provider_with(&endpoint, opts))
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    Retry,
    Fallback,
    GiveUp,
}

fn next_step(kind: ErrorKind) -> Next {
    match kind {
        // The agent handles these (compress, or report the request bug);
        // another provider would fail the same way.
        ErrorKind::ContextOverflow
        | ErrorKind::PayloadTooLarge
        | ErrorKind::FormatError
        | ErrorKind::Interrupted => Next::GiveUp,
        // Asking the same provider again will not help.
        ErrorKind::Auth | ErrorKind::Billing | ErrorKind::ModelNotFound => Next::Fallback,
        k if is_retryable(k) => Next::Retry,
        _ => Next::Fallback,
    }
}

/// A [`Provider`] over a primary and ordered fallbacks: retries the current
/// provider for transient failures, then moves down the chain for the rest
/// of the turn.
pub struct LlmClient {
    providers: Vec<Arc<dyn Provider>>,
    /// Index of the provider serving the current turn.
    current: AtomicUsize,
    policy: RetryPolicy,
    warnings: Vec<String>,
}

impl LlmClient {
    /// A client over explicit providers (tests, embedding).
    pub fn new(
        primary: Arc<dyn Provider>,
        fallbacks: Vec<Arc<dyn Provider>>,
        policy: RetryPolicy,
    ) -> LlmClient {
        let mut providers = vec![primary];
        providers.extend(fallbacks);
        LlmClient {
            providers,
            current: AtomicUsize::new(0),
            policy,
            warnings: Vec::new(),
        }
    }

    /// The client described by `model:`, `fallback_providers:` and `agent:`.
    /// Fails only when the primary cannot be used; unusable fallbacks are
    /// skipped and listed in [`LlmClient::warnings`].
    pub fn from_config(config: &Config, env: &Env) -> Result<LlmClient, String> {
        let primary = config.primary_endpoint(env)?;
        Ok(LlmClient::serving(config, env, &primary))
    }

    /// The client of `model:`'s settings and `fallback_providers:` with
    /// `primary` in the primary's place: a model a conversation switched
    /// to (`/model`) or an API client asked for by a route's name.
    pub fn serving(config: &Config, env: &Env, primary: &Endpoint) -> LlmClient {
        let (fallbacks, warnings) = config.fallback_endpoints(env);
        for w in &warnings {
            tracing::warn!("{w}");
        }
        let mut secrets = env.secret_values();
        secrets.extend(config.secret_values());
        let opts = HttpOptions {
            default_max_tokens: config.model.max_tokens,
            secrets,
            // Caching and routing choices are about the account, not one
            // model, so fallbacks follow them too.
            prompt_caching: config.model.prompt_caching,
            openrouter: config.model.openrouter.clone(),
            ..HttpOptions::from_agent(&config.agent)
        };
        let primary_opts = HttpOptions {
            // The temperature was chosen for the primary model; fallbacks
            // keep their server's default.
            default_temperature: config.model.temperature,
            // `model.vision` is about the primary model; fallbacks are
            // judged by their names.
            vision: config.model.vision,
            // So is the text tool-call format; fallbacks keep `auto`.
            tool_call_parser: config.model.tool_call_parser,
            ..opts.clone()
        };
        let mut client = LlmClient::new(
            provider_with(primary, primary_opts),
            fallbacks
                .iter()
                .map(|e| provider_with(e, opts.clone()))
                .collect(),
            RetryPolicy::from_agent(&config.agent),
        );
        client.warnings = warnings;
        client
    }

    /// Replaces the retry policy (tests use millisecond backoff).
    pub fn with_policy(mut self, policy: RetryPolicy) -> LlmClient {
        self.policy = policy;
        self
    }

    /// Starts a new turn: the primary serves again.
    pub fn begin_turn(&self) {
        self.current.store(0, Ordering::Relaxed);
    }

    /// The provider that serves the next call.
    pub fn active(&self) -> &Arc<dyn Provider> {
        let i = self
            .current
            .load(Ordering::Relaxed)
            .min(self.providers.len() - 1);
        &self.providers[i]
    }

    /// `provider:model` of the provider serving now (also available without
    /// importing [`Provider`]).
    pub fn describe(&self) -> String {
        self.active().describe()
    }

    /// The model of the provider serving now.
    pub fn model(&self) -> &str {
        self.active().model()
    }

    /// Whether a fallback is serving the current turn.
    pub fn on_fallback(&self) -> bool {
        self.current.load(Ordering::Relaxed) > 0
    }

    /// The whole chain, primary first.
    pub fn providers(&self) -> &[Arc<dyn Provider>] {
        &self.providers
    }

    /// The retry policy in force.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// Configuration problems noticed while building (skipped fallbacks).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
}

#[async_trait]
impl Provider for LlmClient {
    fn describe(&self) -> String {
        LlmClient::describe(self)
    }

    fn model(&self) -> &str {
        LlmClient::model(self)
    }

    async fn chat(
        &self,
        request: &ChatRequest,
        sink: EventSink<'_>,
        cancel: &CancellationToken,
    ) -> Result<ChatResponse, LlmError> {
        let start = self
            .current
            .load(Ordering::Relaxed)
            .min(self.providers.len() - 1);
        let mut last: Option<LlmError> = None;
        // Whether the current attempt has streamed anything; a failed
        // attempt that did must be voided before the next one streams.
        let emitted = AtomicBool::new(false);
        let tracking = |event: StreamEvent| {
            emitted.store(true, Ordering::Relaxed);
            sink(event);
        };
        for (idx, provider) in self.providers.iter().enumerate().skip(start) {
            if idx != start {
                // A notice: the person at a terminal sees this line too.
                tracing::warn!(
                    target: "talaria::notice",
                    from = %self.providers[idx - 1].describe(),
                    "Switching to the fallback model {} for the rest of this turn.",
                    provider.describe()
                );
                self.current.store(idx, Ordering::Relaxed);
            }
            let mut attempt = 0u32;
            loop {
                attempt += 1;
                if emitted.swap(false, Ordering::Relaxed) {
                    sink(StreamEvent::Restart);
                }
                let err = match provider.chat(request, &tracking, cancel).await {
                    Ok(r) => return Ok(r),
                    Err(e) => e,
                };
                if cancel.is_cancelled() {
                    return Err(interrupted(&err));
                }
                let next = match next_step(err.kind) {
                    Next::Retry if attempt >= self.policy.max_attempts => Next::Fallback,
                    n => n,
                };
                match next {
                    Next::GiveUp => {
                        log_failure(provider.as_ref(), attempt, &err);
                        return Err(err);
                    }
                    Next::Fallback => {
                        log_failure(provider.as_ref(), attempt, &err);
                        let mut err = err;
                        if attempt > 1 {
                            err.message =
                                format!("failed after {attempt} attempts: {}", err.message);
                        }
                        last = Some(err);
                        break;
                    }
                    Next::Retry => {
                        let wait = self.policy.wait_for(attempt, &err);
                        // One event, two readers: the person at a terminal
                        // sees the sentence alone (a notice), the log gets
                        // it with the server's own words and the provider.
                        tracing::warn!(
                            target: "talaria::notice",
                            provider = %provider.describe(),
                            attempt,
                            kind = ?err.kind,
                            error = %err.message,
                            "{}; trying again in {} (attempt {} of {}).",
                            capitalized(short_reason(&err)),
                            seconds(wait),
                            attempt + 1,
                            self.policy.max_attempts
                        );
                        if !sleep_or_cancel(wait, cancel).await {
                            return Err(interrupted(&err));
                        }
                    }
                }
            }
        }
        Err(last.unwrap_or_else(|| LlmError {
            kind: ErrorKind::Unknown,
            status: None,
            message: "no provider is configured".to_owned(),
            retry_after: None,
            provider: "talaria".to_owned(),
        }))
    }
}

/// Logs a failed attempt after which this provider is not asked again.
fn log_failure(provider: &dyn Provider, attempt: u32, err: &LlmError) {
    tracing::warn!(
        provider = %provider.describe(),
        attempt,
        kind = ?err.kind,
        "model call failed: {}", err.message
    );
}

/// The reason for a retry notice: the error's summary without its advice
/// ("try again in a moment" would contradict the notice's own).
fn short_reason(err: &LlmError) -> String {
    let summary = err.summary();
    summary
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned()
}

fn capitalized(text: String) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => text,
    }
}

/// A wait for people: whole seconds, at least one.
fn seconds(wait: std::time::Duration) -> String {
    let secs = wait.as_secs_f64().round().max(1.0);
    if secs == 1.0 {
        "1 second".to_owned()
    } else {
        format!("{secs:.0} seconds")
    }
}

fn interrupted(after: &LlmError) -> LlmError {
    LlmError {
        kind: ErrorKind::Interrupted,
        status: None,
        message: "the request was interrupted".to_owned(),
        retry_after: None,
        provider: after.provider.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispositions() {
        assert_eq!(next_step(ErrorKind::RateLimit), Next::Retry);
        assert_eq!(next_step(ErrorKind::Network), Next::Retry);
        assert_eq!(next_step(ErrorKind::Auth), Next::Fallback);
        assert_eq!(next_step(ErrorKind::Billing), Next::Fallback);
        assert_eq!(next_step(ErrorKind::ModelNotFound), Next::Fallback);
        assert_eq!(next_step(ErrorKind::ContextOverflow), Next::GiveUp);
        assert_eq!(next_step(ErrorKind::FormatError), Next::GiveUp);
        assert_eq!(next_step(ErrorKind::Interrupted), Next::GiveUp);
    }
}

#[cfg(test)]
mod restart_tests {
    use std::sync::Mutex;
    use std::sync::atomic::AtomicU32;
    use std::time::Duration;

    use talaria_core::{Message, Usage};

    use super::*;
    use crate::{ChatRequest, ChatResponse, LlmError};

    /// Streams "partial" and fails on its first call; answers on the second.
    struct FlakyStream {
        calls: AtomicU32,
    }

    #[async_trait]
    impl Provider for FlakyStream {
        fn describe(&self) -> String {
            "flaky:model".to_owned()
        }

        fn model(&self) -> &str {
            "model"
        }

        async fn chat(
            &self,
            _request: &ChatRequest,
            sink: EventSink<'_>,
            _cancel: &CancellationToken,
        ) -> Result<ChatResponse, LlmError> {
            if self.calls.fetch_add(1, Ordering::Relaxed) == 0 {
                sink(StreamEvent::Text("partial".to_owned()));
                return Err(LlmError {
                    kind: ErrorKind::Network,
                    status: None,
                    message: "connection reset".to_owned(),
                    retry_after: None,
                    provider: self.describe(),
                });
            }
            sink(StreamEvent::Text("whole answer".to_owned()));
            Ok(ChatResponse {
                message: Message::assistant("whole answer"),
                usage: Usage::default(),
                provider: self.describe(),
                model: "model".to_owned(),
            })
        }
    }

    #[tokio::test]
    async fn a_retry_after_partial_output_voids_it_first() {
        let policy = RetryPolicy {
            max_attempts: 3,
            base: Duration::from_millis(1),
            max: Duration::from_millis(2),
            retry_after_cap: Duration::from_millis(2),
        };
        let client = LlmClient::new(
            Arc::new(FlakyStream {
                calls: AtomicU32::new(0),
            }),
            Vec::new(),
            policy,
        );
        let events = Mutex::new(Vec::new());
        let sink = |e: StreamEvent| events.lock().unwrap().push(e);
        let r = client
            .chat(&ChatRequest::default(), &sink, &CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(r.message.content, "whole answer");
        assert_eq!(
            events.into_inner().unwrap(),
            vec![
                StreamEvent::Text("partial".to_owned()),
                StreamEvent::Restart,
                StreamEvent::Text("whole answer".to_owned()),
            ]
        );
    }
}
