//! The turn's model calls: building the request from the stored
//! transcript, calling the provider (abandoning it shortly after an
//! interrupt), counting usage, and compressing the context when it nears
//! the model's window.

use std::sync::Mutex;
use std::time::Duration;

use talaria_core::{Message, Role};
use talaria_llm::{ChatRequest, ChatResponse, ErrorKind, LlmError, StreamEvent, ToolSpec};

use super::{Call, TurnRun};
use crate::compress;
use crate::error::AgentError;
use crate::repair::repair_history;

/// How long a provider may take to honour the interrupt before its request
/// is dropped. The provider contract says "promptly"; this bounds a
/// provider that does not.
const MODEL_INTERRUPT_GRACE: Duration = Duration::from_secs(2);

/// Summary passes allowed in one turn (successful or not): a summariser that
/// keeps failing must not cost a model call per iteration.
const MAX_COMPRESSIONS_PER_TURN: u32 = 3;

impl TurnRun<'_> {
    /// One model call: compresses first when the transcript is near the
    /// window, and once more (then retries) if the server still says it is
    /// too large.
    pub(super) async fn call_model(
        &mut self,
        with_tools: bool,
        nudge: Option<&str>,
    ) -> Result<Call, AgentError> {
        if self.cancel.is_cancelled() {
            return Ok(Call::Interrupted(String::new()));
        }
        let config = &self.parts.config;
        if config.compression.enabled {
            let limit =
                compress::threshold_tokens(&config.compression, config.model.context_length);
            if self.estimate_prompt_tokens(with_tools) >= limit {
                self.compress().await?;
            }
        }
        let mut retried_overflow = false;
        loop {
            // Compression is itself a model call the user may have
            // interrupted.
            if self.cancel.is_cancelled() {
                return Ok(Call::Interrupted(String::new()));
            }
            let request = self.request(with_tools, nudge);
            let sent = self.messages.len();
            self.api_calls += 1;
            let streamed = Mutex::new(String::new());
            let scrubber = Mutex::new(crate::memory_context::Scrubber::new());
            let observer = self.observer;
            let sink = |event: StreamEvent| match event {
                StreamEvent::Text(t) => {
                    if let Ok(mut s) = streamed.lock() {
                        s.push_str(&t);
                    }
                    // Fenced memory never reaches the screen, however the
                    // stream is cut.
                    let shown = scrubber.lock().map(|mut s| s.feed(&t)).unwrap_or_default();
                    if !shown.is_empty() {
                        observer.text(&shown);
                    }
                }
                StreamEvent::Reasoning(r) => observer.reasoning(&r),
                StreamEvent::ToolCallStarted { .. } => {}
                StreamEvent::Restart => {
                    // The attempt that streamed this text failed; the
                    // retry's text replaces it, it must not be kept twice.
                    if let Ok(mut s) = streamed.lock() {
                        s.clear();
                    }
                    if let Ok(mut s) = scrubber.lock() {
                        *s = crate::memory_context::Scrubber::new();
                    }
                    observer.text_restarted();
                    observer.notice("(the model connection dropped; the answer restarts below)");
                }
            };
            tracing::debug!(
                session = %self.session.id,
                call = self.api_calls,
                messages = request.messages.len(),
                tools = request.tools.len(),
                "model call"
            );
            let result = self.chat(&request, &sink).await;
            let held = scrubber
                .into_inner()
                .map(|mut s| s.finish())
                .unwrap_or_default();
            if !held.is_empty() {
                observer.text(&held);
            }
            let partial = streamed.into_inner().unwrap_or_else(|e| e.into_inner());
            let partial = crate::memory_context::sanitize(&partial);
            match result {
                Ok(response) => {
                    tracing::debug!(
                        session = %self.session.id,
                        call = self.api_calls,
                        model = %response.model,
                        tool_calls = response.message.tool_calls.len(),
                        answer_chars = response.message.content.chars().count(),
                        "model answered"
                    );
                    self.record_usage(&response);
                    // Providers report cached prompt tokens apart from the
                    // rest; the window holds all of them.
                    let u = &response.usage;
                    let prompt = u.input_tokens + u.cache_read_tokens + u.cache_write_tokens;
                    if prompt > 0 {
                        self.known_prompt = Some((prompt, sent));
                    }
                    return Ok(Call::Answered(Box::new(response)));
                }
                Err(_) if self.cancel.is_cancelled() => return Ok(Call::Interrupted(partial)),
                Err(e) if e.kind == ErrorKind::Interrupted => {
                    return Ok(Call::Interrupted(partial));
                }
                Err(e)
                    if matches!(
                        e.kind,
                        ErrorKind::ContextOverflow | ErrorKind::PayloadTooLarge
                    ) && !retried_overflow =>
                {
                    retried_overflow = true;
                    tracing::warn!(
                        "request too large for the model ({e}); compressing and retrying"
                    );
                    if !self.compress().await? {
                        tracing::warn!(
                            "model call failed: {}",
                            self.parts.redactor.redact(&e.to_string())
                        );
                        talaria_core::metrics::model_failed(self.provider.model());
                        return Ok(Call::Failed(e.summary()));
                    }
                }
                // The reason reaches the user (a chat, an API response), so
                // it is the short sentence; the details, which may hold the
                // server's words and the endpoint's URL, go to the log,
                // whose writer redacts.
                Err(e) => {
                    tracing::warn!(
                        "model call failed: {}",
                        self.parts.redactor.redact(&e.to_string())
                    );
                    talaria_core::metrics::model_failed(self.provider.model());
                    return Ok(Call::Failed(e.summary()));
                }
            }
        }
    }

    /// Calls the provider, giving up on it shortly after an interrupt even
    /// if it does not return by itself.
    async fn chat(
        &self,
        request: &ChatRequest,
        sink: &(dyn Fn(StreamEvent) + Send + Sync),
    ) -> Result<ChatResponse, LlmError> {
        let provider = &self.provider;
        tokio::select! {
            result = provider.chat(request, sink, &self.cancel) => result,
            () = async {
                self.cancel.cancelled().await;
                tokio::time::sleep(MODEL_INTERRUPT_GRACE).await;
            } => Err(LlmError {
                kind: ErrorKind::Interrupted,
                status: None,
                message: "the request was abandoned after the interrupt".to_owned(),
                retry_after: None,
                provider: provider.describe(),
            }),
        }
    }

    /// Counts a model call's usage and cost; they are stored with the next
    /// row (see `turn/spend.rs`).
    pub(super) fn record_usage(&mut self, response: &ChatResponse) {
        self.record_call(response, false);
    }

    /// The request for the current transcript: system prompt, repaired
    /// history, then the unstored nudge if any.
    fn request(&mut self, with_tools: bool, nudge: Option<&str>) -> ChatRequest {
        let (history, report) = repair_history(&self.messages);
        if report.changed() && !self.repair_logged {
            self.repair_logged = true;
            tracing::warn!(
                session = %self.session.id,
                "repaired the transcript for the request: {report:?}"
            );
        }
        let mut messages = Vec::with_capacity(history.len() + 2);
        messages.push(Message::system(match &self.instructions {
            Some(extra) => format!("{}\n\n{extra}", self.session.system_prompt()),
            None => self.session.system_prompt().to_owned(),
        }));
        messages.extend(history);
        if let Some(recall) = &self.recall
            && let Some(own) = messages
                .iter_mut()
                .rev()
                .find(|m| m.role == Role::User && m.content == self.user_text)
        {
            own.content = format!("{recall}\n\n{}", own.content);
        }
        // A cut answer being continued goes back as the model's own row.
        if let Some(so_far) = &self.continuation {
            messages.push(Message::assistant(so_far.clone()));
        }
        if let Some(text) = nudge {
            messages.push(Message::user(text));
        }
        let model = &self.parts.config.model;
        ChatRequest {
            messages,
            tools: if with_tools {
                self.tools.clone()
            } else {
                Vec::new()
            },
            max_tokens: model.max_tokens,
            temperature: model.temperature,
        }
    }

    /// The larger of a chars/4 estimate and the last real prompt size plus
    /// an estimate of what was added since.
    fn estimate_prompt_tokens(&self, with_tools: bool) -> u64 {
        let tools: &[ToolSpec] = if with_tools { &self.tools } else { &[] };
        let rough = compress::estimate_tokens(self.session.system_prompt(), &self.messages, tools);
        let known = self.known_prompt.map_or(0, |(tokens, sent)| {
            let added = self.messages.get(sent..).unwrap_or(&[]);
            tokens + compress::estimate_tokens("", added, &[])
        });
        rough.max(known)
    }

    /// Summarises the middle of the transcript and makes the result the
    /// session's active transcript. Returns whether anything changed; a
    /// failed summary leaves everything as it was.
    pub(crate) async fn compress(&mut self) -> Result<bool, AgentError> {
        let parts = self.parts;
        let config = &parts.config;
        if !config.compression.enabled || self.compressions >= MAX_COMPRESSIONS_PER_TURN {
            return Ok(false);
        }
        let (history, _) = repair_history(&self.messages);
        let Some(cut) = compress::choose_cut(
            &history,
            config.compression.protect_first_n,
            config.compression.protect_last_n,
        ) else {
            tracing::info!(session = %self.session.id, "context is large but nothing can be summarised");
            return Ok(false);
        };
        self.compressions += 1;
        self.observer
            .notice("Compressing older parts of the conversation to fit the context window…");
        let window = config.model.context_length;
        // The summariser sees at most about half the window of transcript,
        // and writes at most a twentieth of it.
        let max_input_chars = usize::try_from(window.saturating_mul(2)).unwrap_or(usize::MAX);
        let max_tokens = u32::try_from((window / 20).clamp(512, 8192)).unwrap_or(8192);
        let request = compress::summary_request(
            &history[cut.head_end..cut.tail_start],
            &parts.redactor,
            max_input_chars,
            max_tokens,
        );
        self.api_calls += 1;
        let quiet = |_: StreamEvent| {};
        let summary = match self.chat(&request, &quiet).await {
            Ok(response) => {
                self.record_call(&response, true);
                response.message.content
            }
            Err(_) if self.cancel.is_cancelled() => return Ok(false),
            Err(e) => {
                tracing::warn!(session = %self.session.id, "context compression failed, continuing without it: {e}");
                self.observer
                    .notice("Compressing the conversation failed; continuing without it.");
                return Ok(false);
            }
        };
        if summary.trim().is_empty() {
            tracing::warn!(session = %self.session.id, "the summariser returned nothing; not compressing");
            return Ok(false);
        }
        let todos = self
            .session
            .state
            .todos
            .lock()
            .map(|t| t.clone())
            .unwrap_or_else(|p| p.into_inner().clone());
        let summary =
            compress::summary_message_with_todos(&parts.redactor.redact(&summary), &todos);
        let active = compress::assemble(&history, cut, summary);
        parts
            .store
            .replace_active(&self.session.id, &active)
            .await?;
        tracing::info!(
            session = %self.session.id,
            before = history.len(),
            after = active.len(),
            "compressed the conversation"
        );
        self.messages = active;
        self.compressed = true;
        // Real usage described the old transcript.
        self.known_prompt = None;
        Ok(true)
    }
}
