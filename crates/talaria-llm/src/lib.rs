//! Talaria's model providers.
//!
//! # Layout
//!
//! - this file: the provider-neutral request/response types and the
//!   [`Provider`] trait the agent loop calls.
//! - [`client`]: [`LlmClient`], the provider the agent uses: retries with
//!   backoff, then the fallback chain, for the rest of the turn.
//! - [`openai`] / [`anthropic`]: the two wire protocols.
//! - [`sse`]: the incremental Server-Sent Events parser both stream over.
//! - [`classify`]: HTTP status and body to [`ErrorKind`].
//! - [`retry`]: [`RetryPolicy`] and interruptible waits.
//! - [`repair`]: light repair of broken tool-call argument JSON.
//! - [`media`]: the images of user rows, read from the media cache when a
//!   request is built (the newest few as image parts, older ones as
//!   placeholders).
//! - [`vision`]: which models take images (`model.vision`).
//! - [`text_calls`]: tool calls a model wrote as text in its answer
//!   (`model.tool_call_parser`), and the stream filter that keeps them off
//!   the screen.
#![forbid(unsafe_code)]

pub mod anthropic;
pub mod classify;
pub mod client;
mod http;
pub mod media;
pub mod openai;
pub mod pricing;
pub mod probe;
pub mod repair;
pub mod retry;
pub mod sse;
pub mod text_calls;
pub mod vision;

pub use anthropic::AnthropicProvider;
pub use client::{
    LlmClient, auxiliary_vision_provider, auxiliary_web_provider, provider_for, provider_with,
};
pub use http::HttpOptions;
pub use openai::OpenAiProvider;
pub use retry::RetryPolicy;

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use talaria_core::{Message, Usage};
use tokio_util::sync::CancellationToken;

/// A tool the model may call, in JSON-schema form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name the model calls it by (unique within a request).
    pub name: String,
    /// What the tool does, for the model to decide when to call it.
    pub description: String,
    /// JSON schema of the arguments object.
    pub parameters: serde_json::Value,
}

/// One model request. The model name and endpoint belong to the provider,
/// so a fallback can serve the same request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatRequest {
    /// The transcript, system prompt first when there is one.
    pub messages: Vec<Message>,
    /// The tools offered; empty for a call without tools (a summary).
    pub tools: Vec<ToolSpec>,
    /// A cap on the answer's tokens; `None` leaves the provider's default.
    pub max_tokens: Option<u32>,
    /// Sampling temperature; `None` leaves the provider's default.
    pub temperature: Option<f32>,
}

/// Incremental output while a response streams.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// Visible answer text.
    Text(String),
    /// Reasoning text (not part of the answer).
    Reasoning(String),
    /// The model started writing a call to this tool.
    /// The model started writing a call to the tool `name`.
    ToolCallStarted {
        /// The tool being called.
        name: String,
    },
    /// Everything streamed since the last `Restart` (or the start) is void:
    /// that attempt failed and a retry or a fallback provider starts over.
    /// Consumers drop the partial text so nothing is shown or kept twice.
    Restart,
}

/// A complete model response.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatResponse {
    /// The assistant row: text, tool calls, reasoning, finish reason.
    pub message: Message,
    /// Tokens this response used (input, output, cache, reasoning).
    pub usage: Usage,
    /// Which provider and model answered (after any fallback).
    pub provider: String,
    /// The model that answered, as the provider named it.
    pub model: String,
}

/// Why a model call failed; decides retry and fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The key was refused (401/403): the next provider is tried.
    Auth,
    /// Quota or payment refused: the next provider is tried.
    Billing,
    /// Too many requests (429): retried after the server's delay.
    RateLimit,
    /// The server is overloaded (503, 529): retried with backoff.
    Overloaded,
    /// The server failed (5xx): retried with backoff.
    ServerError,
    /// No answer in time: retried with backoff.
    Timeout,
    /// The prompt exceeds the model's window: not retried; the agent
    /// compresses the transcript instead.
    ContextOverflow,
    /// The request body is too large for the server (413): not retried.
    PayloadTooLarge,
    /// The model name is unknown to the server: the next provider is tried.
    ModelNotFound,
    /// The server refused the request's shape (400, 422): sending it again
    /// would fail the same way.
    FormatError,
    /// Connection refused, reset, DNS: the request may not have arrived.
    Network,
    /// The caller cancelled the request.
    Interrupted,
    /// Nothing above fits: retried with backoff, as a server error is.
    Unknown,
}

/// A classified provider error. Its message never contains an API key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{provider}: {kind:?}{}: {message}", status.map(|s| format!(" (HTTP {s})")).unwrap_or_default())]
pub struct LlmError {
    /// What went wrong, which decides retry and fallback.
    pub kind: ErrorKind,
    /// The HTTP status, when the failure came with one.
    pub status: Option<u16>,
    /// What the server or the client said, with any key removed.
    pub message: String,
    /// The server's `Retry-After`, when it sent one.
    pub retry_after: Option<Duration>,
    /// Provider name, for messages.
    pub provider: String,
}

impl LlmError {
    /// What went wrong as one short sentence for the person waiting for the
    /// answer: the kind of failure in words and the HTTP status when there
    /// was one. Nothing the server wrote and nothing of the request (no
    /// URL, no key, no body) is in it, so it is safe to send to any chat;
    /// the details belong in the log ([`LlmError`]'s `Display`, scrubbed).
    pub fn summary(&self) -> String {
        let status = self
            .status
            .map(|s| format!(" (HTTP {s})"))
            .unwrap_or_default();
        match self.kind {
            ErrorKind::Auth => {
                format!("the model server refused the request{status}; check the API key")
            }
            ErrorKind::Billing => format!(
                "the model provider refused the request for billing or quota reasons{status}"
            ),
            ErrorKind::RateLimit => {
                format!("the model server is limiting requests{status}; try again in a moment")
            }
            ErrorKind::Overloaded => {
                format!("the model server is overloaded{status}; try again in a moment")
            }
            ErrorKind::ServerError => format!("the model server had an internal error{status}"),
            ErrorKind::Timeout => format!("the model server did not answer in time{status}"),
            ErrorKind::ContextOverflow => format!(
                "the conversation is too long for the model's context window{status}; start a \
                 new conversation"
            ),
            ErrorKind::PayloadTooLarge => {
                format!("the request was too large for the model server{status}")
            }
            ErrorKind::ModelNotFound => {
                format!("the model server does not know the configured model{status}")
            }
            ErrorKind::FormatError => {
                format!("the model server could not use the request or its answer{status}")
            }
            ErrorKind::Network => "could not reach the model server".to_owned(),
            ErrorKind::Interrupted => "the model request was interrupted".to_owned(),
            ErrorKind::Unknown if self.status.is_some() => {
                format!("the model server refused the request{status}")
            }
            ErrorKind::Unknown => "the model call failed".to_owned(),
        }
    }
}

/// Receives stream events; called from the task that drives the request.
pub type EventSink<'a> = &'a (dyn Fn(StreamEvent) + Send + Sync);

/// Something that answers chat requests.
#[async_trait]
pub trait Provider: Send + Sync {
    /// `provider:model`, for logs and the session record.
    fn describe(&self) -> String;
    /// The model name requests go to.
    fn model(&self) -> &str;
    /// Sends one request. Streams events into `sink` as they arrive. Returns
    /// promptly with [`ErrorKind::Interrupted`] once `cancel` fires.
    async fn chat(
        &self,
        request: &ChatRequest,
        sink: EventSink<'_>,
        cancel: &CancellationToken,
    ) -> Result<ChatResponse, LlmError>;
}
