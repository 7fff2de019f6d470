//! One turn of the agent loop.
//!
//! A turn stores the user's message, then alternates model calls and tool
//! batches until the model answers without tools. Around that core:
//! an iteration budget (with one final tool-less call for a summary when it
//! runs out), history repair before every request, context compression when
//! the transcript grows too large, interrupt handling that always leaves a
//! valid transcript, and persistence of every row the moment it exists.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use futures::StreamExt;
use talaria_core::{Message, Role, ToolCall, Usage};
use talaria_llm::{ChatRequest, ChatResponse, ErrorKind, LlmError, StreamEvent, ToolSpec};
use tokio_util::sync::CancellationToken;

use crate::agent::{Agent, AgentError, SessionHandle};
use crate::compress;
use crate::dispatch::{self, Action, Planned};
use crate::observer::TurnObserver;
use crate::repair::repair_history;
use crate::spill;
use crate::tools::ToolContext;

/// Opens the user row that carries steering into a running turn. It marks
/// the row as part of that turn, not a turn of its own (see
/// [`crate::Agent::rewind`]).
pub(crate) const STEER_HEADER: &str = "[The user sent this while you were working:]";

/// How a turn ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnExit {
    /// The model gave its answer.
    Completed,
    /// The iteration budget ran out; the answer is the model's summary of
    /// progress and what remains.
    BudgetExhausted,
    /// The user interrupted; the answer is the text streamed so far, or a
    /// short notice.
    Interrupted,
    /// The model could not be reached or refused the request (after the
    /// provider's own retries and fallbacks). The user message stays stored.
    /// The reason is one short sentence safe to show anyone
    /// ([`talaria_llm::LlmError::summary`]): no URL, key or server text.
    Failed(String),
}

/// What a turn produced.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOutcome {
    /// The text to show the user.
    pub answer: String,
    pub exit: TurnExit,
    /// The rows this turn stored, in order (the user message first).
    pub new_messages: Vec<Message>,
    /// Model requests made, including failed ones and summaries.
    pub api_calls: u32,
    /// Token usage summed over the turn's requests.
    pub usage: Usage,
    /// The turn replaced the session's active transcript (compressed it),
    /// storing rows beyond `new_messages`.
    pub compressed: bool,
    /// The answer was stored through [`crate::TurnOptions::outbox`], so
    /// its delivery is already owed; `false` when there was no outbox or
    /// the turn ended without storing an answer (interrupted, failed,
    /// empty).
    pub owed: bool,
}

/// The answer when an interrupt came before any text.
pub const INTERRUPTED_ANSWER: &str = "Operation interrupted.";

/// The answer when the model kept returning nothing.
pub const EMPTY_ANSWER: &str = "(empty)";

/// Sent (not stored) when the iteration budget is used up.
const BUDGET_NUDGE: &str = "You have reached the limit of tool-calling steps for this turn. Do \
not call any more tools. Reply to the user now: summarise what you did and found so far, and \
list what remains to be done.";

/// Sent (not stored) after an empty reply.
const EMPTY_NUDGE: &str = "Your last reply was empty. Continue with the task: call a tool if \
one is needed, or give your answer to the user.";

/// How long a provider may take to honour the interrupt before its request
/// is dropped. The provider contract says "promptly"; this bounds a
/// provider that does not.
const MODEL_INTERRUPT_GRACE: Duration = Duration::from_secs(2);

/// Summary passes allowed in one turn (successful or not): a summariser that
/// keeps failing must not cost a model call per iteration.
const MAX_COMPRESSIONS_PER_TURN: u32 = 3;

/// How one tool call of a batch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Ok,
    Error,
    /// Never started because of the interrupt.
    Skipped,
}

/// A call's result text and how it ended.
type Done = (String, Status);

/// Result of one model call, from the loop's point of view.
enum Call {
    Answered(Box<ChatResponse>),
    /// Interrupted; carries the text that streamed before it.
    Interrupted(String),
    Failed(String),
}

/// The working state of one turn.
pub(crate) struct TurnRun<'a> {
    agent: &'a Agent,
    session: &'a SessionHandle,
    observer: &'a dyn TurnObserver,
    cancel: CancellationToken,
    /// The active transcript (no system row), kept equal to the store's.
    messages: Vec<Message>,
    new_messages: Vec<Message>,
    api_calls: u32,
    usage: Usage,
    /// Usage not yet written: it is stored with the next row (one write
    /// instead of two), or when the turn ends.
    pending_usage: Usage,
    /// The last real prompt size reported by the provider, and how many
    /// messages that request carried (rows after it are estimated).
    known_prompt: Option<(u64, usize)>,
    compressions: u32,
    /// A compression replaced the active transcript in this turn.
    compressed: bool,
    tools: Vec<ToolSpec>,
    /// The tools this turn may call (the specs above describe them).
    registry: std::sync::Arc<crate::tools::Registry>,
    /// Fenced memory recalled for this turn: sent with the user's message,
    /// never stored.
    recall: Option<String>,
    /// The user's message of this turn (where the recall goes).
    user_text: String,
    /// A damaged transcript is repaired for every request; say so once.
    repair_logged: bool,
    /// Who tools ask for approvals in this turn.
    interaction: std::sync::Arc<dyn crate::interaction::Interaction>,
    /// Where the final answer goes with its obligation, if anywhere.
    outbox: Option<std::sync::Arc<dyn crate::Outbox>>,
    /// The final answer went through the outbox.
    owed: bool,
}

impl<'a> TurnRun<'a> {
    pub(crate) fn new(
        agent: &'a Agent,
        session: &'a SessionHandle,
        observer: &'a dyn TurnObserver,
        cancel: CancellationToken,
        history: Vec<Message>,
        interaction: std::sync::Arc<dyn crate::interaction::Interaction>,
    ) -> TurnRun<'a> {
        TurnRun {
            interaction,
            agent,
            session,
            observer,
            cancel,
            messages: history,
            new_messages: Vec::new(),
            api_calls: 0,
            usage: Usage::default(),
            pending_usage: Usage::default(),
            known_prompt: None,
            compressions: 0,
            compressed: false,
            tools: agent.parts.registry.specs(),
            registry: agent.parts.registry.clone(),
            recall: None,
            user_text: String::new(),
            repair_logged: false,
            outbox: None,
            owed: false,
        }
    }

    /// Stores the final answer through `outbox`, with its obligation.
    pub(crate) fn with_outbox(
        mut self,
        outbox: Option<std::sync::Arc<dyn crate::Outbox>>,
    ) -> TurnRun<'a> {
        self.outbox = outbox;
        self
    }

    /// Sends `recall` (already fenced) with this turn's user message.
    pub(crate) fn with_recall(mut self, recall: Option<String>) -> TurnRun<'a> {
        self.recall = recall;
        self
    }

    /// Offers and dispatches `registry`'s tools instead of the agent's.
    pub(crate) fn with_registry(
        mut self,
        registry: std::sync::Arc<crate::tools::Registry>,
    ) -> TurnRun<'a> {
        self.tools = registry.specs();
        self.registry = registry;
        self
    }

    pub(crate) async fn run(mut self, user_text: &str) -> Result<TurnOutcome, AgentError> {
        // The turn's life at debug: sizes and names, never the words.
        tracing::debug!(
            session = %self.session.id,
            chars = user_text.chars().count(),
            "turn started"
        );
        let result = self.steps(user_text).await;
        match &result {
            Ok(outcome) => tracing::debug!(
                session = %self.session.id,
                exit = ?outcome.exit,
                model_calls = outcome.api_calls,
                answer_chars = outcome.answer.chars().count(),
                "turn finished"
            ),
            Err(e) => tracing::debug!(session = %self.session.id, error = %e, "turn failed"),
        }
        // Usage of calls that produced no stored row (an interrupted or
        // failed call, an empty reply, a compression summary).
        if self.pending_usage != Usage::default() {
            let usage = std::mem::take(&mut self.pending_usage);
            if let Err(e) = self
                .agent
                .parts
                .store
                .add_usage(&self.session.id, &usage)
                .await
            {
                tracing::warn!(session = %self.session.id, error = %e, "could not store the turn's token usage");
            }
        }
        result
    }

    async fn steps(&mut self, user_text: &str) -> Result<TurnOutcome, AgentError> {
        // Tools from sources (MCP servers) are fixed for the whole turn, so
        // every request of it offers the same set.
        if self.registry.has_sources() {
            let resolved = std::sync::Arc::new(self.registry.for_turn().await);
            self.tools = resolved.specs();
            self.registry = resolved;
        }
        // Stored before anything can fail, so the request is never lost.
        self.user_text = crate::memory_context::sanitize(user_text);
        self.persist(Message::user(user_text)).await?;
        let budget = self.agent.parts.config.agent.max_turns.max(1);
        let mut iterations = 0;
        let mut nudge: Option<&str> = None;
        let mut retried_empty = false;
        loop {
            if iterations >= budget {
                return self.budget_summary().await;
            }
            iterations += 1;
            let response = match self.call_model(true, nudge.take()).await? {
                Call::Answered(r) => r,
                Call::Interrupted(partial) => return self.finish_interrupted(&partial).await,
                Call::Failed(reason) => {
                    return Ok(self.outcome(String::new(), TurnExit::Failed(reason)));
                }
            };
            let reply = self.assistant_row(response.message);
            if reply.has_tool_calls() {
                // Stored before any tool runs: if the process dies mid-batch,
                // the next turn's repair gives the missing results a stand-in.
                self.persist(reply.clone()).await?;
                self.run_tools(&reply.tool_calls).await?;
                if self.cancel.is_cancelled() {
                    return self.finish_interrupted("").await;
                }
                self.deliver_steer().await?;
                continue;
            }
            if reply.content.trim().is_empty() {
                if !retried_empty {
                    retried_empty = true;
                    nudge = Some(EMPTY_NUDGE);
                    self.observer
                        .notice("The model returned an empty reply; asking again.");
                    continue;
                }
                // Nothing to store: an empty row would only be dropped by the
                // next repair.
                return Ok(self.outcome(EMPTY_ANSWER.to_owned(), TurnExit::Completed));
            }
            let answer = reply.content.trim().to_owned();
            self.persist_answer(reply, &answer).await?;
            return Ok(self.outcome(answer, TurnExit::Completed));
        }
    }

    /// Hands the model what the user sent while it worked, as a user row
    /// after the tool results (a valid place for one in every chat API).
    async fn deliver_steer(&mut self) -> Result<(), AgentError> {
        let steer = self.session.state.take_steer();
        if steer.is_empty() {
            return Ok(());
        }
        let text = format!("{STEER_HEADER}\n{}", steer.join("\n"));
        self.observer
            .notice("Passed your message to the running turn.");
        self.persist(Message::user(text)).await
    }

    /// The budget is spent: one more call, without tools, for a summary.
    async fn budget_summary(&mut self) -> Result<TurnOutcome, AgentError> {
        self.observer
            .notice("The step budget for this turn is used up; asking for a summary.");
        match self.call_model(false, Some(BUDGET_NUDGE)).await? {
            Call::Answered(response) => {
                let mut reply = self.assistant_row(response.message);
                // A call made now could never run; keeping it would leave a
                // call without a result in the transcript.
                reply.tool_calls.clear();
                let answer = reply.content.trim().to_owned();
                if answer.is_empty() {
                    return Ok(self.outcome(EMPTY_ANSWER.to_owned(), TurnExit::BudgetExhausted));
                }
                self.persist_answer(reply, &answer).await?;
                Ok(self.outcome(answer, TurnExit::BudgetExhausted))
            }
            Call::Interrupted(partial) => self.finish_interrupted(&partial).await,
            Call::Failed(reason) => Ok(self.outcome(String::new(), TurnExit::Failed(reason))),
        }
    }

    /// Ends an interrupted turn, keeping the transcript valid: streamed text
    /// becomes the assistant row; with none, a notice closes a transcript
    /// that ends in tool results.
    async fn finish_interrupted(&mut self, partial: &str) -> Result<TurnOutcome, AgentError> {
        let partial = self.agent.parts.redactor.redact(partial.trim());
        if !partial.is_empty() {
            let mut row = Message::assistant(partial.clone());
            row.finish_reason = Some("interrupted".to_owned());
            self.persist(row).await?;
            return Ok(self.outcome(partial, TurnExit::Interrupted));
        }
        if self.messages.last().is_some_and(|m| m.role == Role::Tool) {
            let mut row = Message::assistant(INTERRUPTED_ANSWER);
            row.finish_reason = Some("interrupted".to_owned());
            self.persist(row).await?;
        }
        Ok(self.outcome(INTERRUPTED_ANSWER.to_owned(), TurnExit::Interrupted))
    }

    /// The model's row as it is kept: assistant role, secrets redacted from
    /// the text and reasoning. Tool-call arguments are left alone so that a
    /// replay still carries what the tool was actually given.
    fn assistant_row(&self, mut message: Message) -> Message {
        let redactor = &self.agent.parts.redactor;
        message.role = Role::Assistant;
        message.tool_call_id = None;
        message.tool_name = None;
        message.content = redactor.redact(&message.content);
        message.reasoning = message.reasoning.map(|r| redactor.redact(&r));
        message
    }

    fn outcome(&mut self, answer: String, exit: TurnExit) -> TurnOutcome {
        TurnOutcome {
            answer: crate::memory_context::sanitize(&answer),
            exit,
            new_messages: std::mem::take(&mut self.new_messages),
            api_calls: self.api_calls,
            usage: self.usage,
            compressed: self.compressed,
            owed: self.owed,
        }
    }

    /// Stores the final answer row; through the outbox when there is one,
    /// owing `answer` as the user will be sent it (sanitized as
    /// [`TurnRun::outcome`] does, so the debt and the delivery agree).
    async fn persist_answer(&mut self, message: Message, answer: &str) -> Result<(), AgentError> {
        let Some(outbox) = self.outbox.clone() else {
            return self.persist(message).await;
        };
        let mut message = message;
        message.content = crate::memory_context::sanitize(&message.content);
        let usage = std::mem::take(&mut self.pending_usage);
        let owed = crate::memory_context::sanitize(answer);
        outbox
            .append_answer(&self.session.id, &message, &usage, &owed)
            .await?;
        self.owed = true;
        self.messages.push(message.clone());
        self.new_messages.push(message);
        Ok(())
    }

    async fn persist(&mut self, mut message: Message) -> Result<(), AgentError> {
        // Recalled memory is never stored (nor indexed), even when a model
        // echoes its fence or a user pastes one.
        if matches!(message.role, Role::User | Role::Assistant) {
            message.content = crate::memory_context::sanitize(&message.content);
        }
        let usage = std::mem::take(&mut self.pending_usage);
        self.agent
            .parts
            .store
            .append_message_with_usage(&self.session.id, &message, &usage)
            .await?;
        self.messages.push(message.clone());
        self.new_messages.push(message);
        Ok(())
    }

    /// One model call: compresses first when the transcript is near the
    /// window, and once more (then retries) if the server still says it is
    /// too large.
    async fn call_model(
        &mut self,
        with_tools: bool,
        nudge: Option<&str>,
    ) -> Result<Call, AgentError> {
        if self.cancel.is_cancelled() {
            return Ok(Call::Interrupted(String::new()));
        }
        let agent = self.agent;
        let config = &agent.parts.config;
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
                    self.record_usage(&response.usage);
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
                            self.agent.parts.redactor.redact(&e.to_string())
                        );
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
                        self.agent.parts.redactor.redact(&e.to_string())
                    );
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
        let provider = &self.agent.parts.provider;
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

    /// Counts a model call's usage; it is stored with the next row.
    fn record_usage(&mut self, usage: &Usage) {
        self.usage.add(usage);
        self.pending_usage.add(usage);
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
        messages.push(Message::system(self.session.system_prompt()));
        messages.extend(history);
        if let Some(recall) = &self.recall
            && let Some(own) = messages
                .iter_mut()
                .rev()
                .find(|m| m.role == Role::User && m.content == self.user_text)
        {
            own.content = format!("{recall}\n\n{}", own.content);
        }
        if let Some(text) = nudge {
            messages.push(Message::user(text));
        }
        let model = &self.agent.parts.config.model;
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
        let agent = self.agent;
        let parts = &agent.parts;
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
                self.record_usage(&response.usage);
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
        let summary = compress::summary_message(&parts.redactor.redact(&summary));
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

    /// Runs one batch of tool calls and stores a result row for every call,
    /// in the order the model listed them.
    async fn run_tools(&mut self, calls: &[ToolCall]) -> Result<(), AgentError> {
        let agent = self.agent;
        let parts = &agent.parts;
        let plan = dispatch::plan(calls, &self.registry);
        let ctx = ToolContext {
            session_id: self.session.id.clone(),
            home: parts.home.clone(),
            workdir: parts.workdir.clone(),
            config: parts.config.clone(),
            store: parts.store.clone(),
            interaction: self.interaction.clone(),
            session: self.session.state.clone(),
            redactor: parts.redactor.clone(),
            cancel: self.cancel.clone(),
        };
        let mut results: HashMap<usize, Done> = HashMap::new();
        for group in dispatch::groups(&plan) {
            if group.len() == 1 {
                if let Some(&i) = group.first() {
                    let done = self.run_planned(&plan, i, &ctx, &results).await;
                    self.store_result(&plan[i].call, &done).await?;
                    results.insert(i, done);
                }
                continue;
            }
            // Parallel group: start up to MAX_PARALLEL at once, then store the
            // results in call order.
            let this = &*self;
            let finished: Vec<(usize, Done)> = futures::stream::iter(group.iter().copied())
                .filter(|i| std::future::ready(matches!(plan[*i].action, Action::Run { .. })))
                .map(|i| {
                    let ctx = &ctx;
                    let plan = &plan;
                    let results = &results;
                    async move { (i, this.run_planned(plan, i, ctx, results).await) }
                })
                .buffer_unordered(dispatch::MAX_PARALLEL)
                .collect()
                .await;
            results.extend(finished);
            for i in group {
                let done = match results.get(&i) {
                    Some(done) => done.clone(),
                    None => self.run_planned(&plan, i, &ctx, &results).await,
                };
                self.store_result(&plan[i].call, &done).await?;
                results.insert(i, done);
            }
        }
        Ok(())
    }

    /// The result of plan entry `i`: executes it, answers it directly, or
    /// copies its twin's. Entries reached after the interrupt are skipped.
    async fn run_planned(
        &self,
        plan: &[Planned],
        i: usize,
        ctx: &ToolContext,
        results: &HashMap<usize, Done>,
    ) -> Done {
        let entry = &plan[i];
        let name = &entry.call.name;
        match &entry.action {
            Action::Duplicate(first) => {
                if let Some(done) = results.get(first) {
                    return done.clone();
                }
                (dispatch::skipped(name), Status::Skipped)
            }
            _ if self.cancel.is_cancelled() => (dispatch::skipped(name), Status::Skipped),
            Action::Immediate(text) => {
                self.observer.tool_started(name, &entry.call.arguments);
                (text.clone(), Status::Error)
            }
            Action::Run { tool, args } => {
                tracing::debug!(session = %self.session.id, tool = %name, "tool call");
                self.observer.tool_started(name, &entry.call.arguments);
                let (output, ok) = dispatch::execute(tool.clone(), args.clone(), ctx.clone()).await;
                let status = if ok { Status::Ok } else { Status::Error };
                (self.spill(&entry.call, output).await, status)
            }
        }
    }

    /// Replaces oversized output with a preview and a file path.
    async fn spill(&self, call: &ToolCall, output: String) -> String {
        let parts = &self.agent.parts;
        let max = parts.config.agent.tool_output_max_chars;
        // Byte length bounds the character count from above: skip the work
        // for the common small result.
        if output.len() <= max {
            return output;
        }
        let home = parts.home.clone();
        let session_id = self.session.id.clone();
        let call_id = call.id.clone();
        let fallback: String = output.chars().take(max).collect();
        tokio::task::spawn_blocking(move || {
            spill::spill_if_large(&home, &session_id, &call_id, output, max)
        })
        .await
        .unwrap_or(fallback)
    }

    async fn store_result(
        &mut self,
        call: &ToolCall,
        (content, status): &Done,
    ) -> Result<(), AgentError> {
        tracing::debug!(
            session = %self.session.id,
            tool = %call.name,
            status = ?status,
            result_chars = content.chars().count(),
            "tool call finished"
        );
        if *status != Status::Skipped {
            self.observer
                .tool_finished(&call.name, *status == Status::Ok, &preview(content, 200));
        }
        self.persist(Message::tool_result(&call.id, &call.name, content.as_str()))
            .await
    }
}

/// The first `max` characters of `text`, on one line.
fn preview(text: &str, max: usize) -> String {
    text.chars()
        .take(max)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}
