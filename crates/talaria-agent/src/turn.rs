//! One turn of the agent loop.
//!
//! A turn stores the user's message, then alternates model calls and tool
//! batches until the model answers without tools. Around that core:
//! an iteration budget (with one final tool-less call for a summary when it
//! runs out), history repair before every request, context compression when
//! the transcript grows too large, interrupt handling that always leaves a
//! valid transcript, and persistence of every row the moment it exists.

use talaria_core::{Message, Role, Usage};
use talaria_llm::{ChatResponse, ToolSpec};
use talaria_store::StoreError;
use tokio_util::sync::CancellationToken;

use crate::error::AgentError;
use crate::observer::TurnObserver;
use crate::parts::AgentParts;
use crate::session::SessionHandle;

mod model;
mod spend;
mod tools;

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
    /// How the turn ended; front ends word the answer by it.
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

/// Sent (not stored) after the partial answer when the model stopped at its
/// output limit (`finish_reason: length`).
const CONTINUE_NUDGE: &str = "Continue exactly where you stopped.";

/// Continuations of one answer cut at the output limit; the ancestor's
/// number. The answer after the last one is kept as it is.
const MAX_CONTINUATIONS: u32 = 3;

/// Result of one model call, from the loop's point of view.
enum Call {
    Answered(Box<ChatResponse>),
    /// Interrupted; carries the text that streamed before it.
    Interrupted(String),
    Failed(String),
}

/// Stores a turn's final answer together with the obligation to deliver
/// it, so no crash can leave an answer in the transcript that nobody owes.
#[async_trait::async_trait]
pub trait Outbox: Send + Sync {
    /// Appends `message` (the final answer row) to `session_id` with
    /// `usage`, and records `answer` (the text the user will be sent) as
    /// owed, atomically. Returns the row id.
    async fn append_answer(
        &self,
        session_id: &str,
        message: &Message,
        usage: &talaria_core::Usage,
        answer: &str,
    ) -> Result<i64, StoreError>;
    /// [`Outbox::append_answer`] with the model calls that led to the
    /// answer, stored in the same transaction with their cost and ledger
    /// rows. The default passes on only their usage.
    async fn append_answer_with_calls(
        &self,
        session_id: &str,
        message: &Message,
        calls: &[talaria_store::ModelCall],
        answer: &str,
    ) -> Result<i64, StoreError> {
        let usage = talaria_store::ModelCall::total_usage(calls);
        self.append_answer(session_id, message, &usage, answer)
            .await
    }
}

/// The working state of one turn.
pub(crate) struct TurnRun<'a> {
    parts: &'a AgentParts,
    session: &'a SessionHandle,
    observer: &'a dyn TurnObserver,
    cancel: CancellationToken,
    /// The active transcript (no system row), kept equal to the store's.
    messages: Vec<Message>,
    new_messages: Vec<Message>,
    api_calls: u32,
    usage: Usage,
    /// Model calls not yet written: they are stored with the next row (one
    /// write instead of two), or when the turn ends.
    pending: spend::PendingCalls,
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
    /// The user row's files, stored with it.
    media: Vec<talaria_core::MediaRef>,
    /// A damaged transcript is repaired for every request; say so once.
    repair_logged: bool,
    /// Who tools ask for approvals in this turn.
    interaction: std::sync::Arc<dyn crate::interaction::Interaction>,
    /// Where this turn's commands run and which files its tools may touch.
    execution: crate::execution::Execution,
    /// Where the final answer goes with its obligation, if anywhere.
    outbox: Option<std::sync::Arc<dyn Outbox>>,
    /// The final answer went through the outbox.
    owed: bool,
    /// The platform of the conversation, for the tools.
    platform: Option<String>,
    /// The step budget, when not `agent.max_turns`.
    max_turns: Option<u32>,
    /// The model of this turn: the session's switch or the default.
    provider: std::sync::Arc<dyn talaria_llm::Provider>,
    /// An answer cut at the model's output limit, while it is being
    /// continued: sent (not stored) as the assistant row before the
    /// continue nudge, and joined with what comes next.
    continuation: Option<String>,
    /// This turn's extra system instructions, sent, never stored.
    instructions: Option<String>,
}

impl<'a> TurnRun<'a> {
    pub(crate) fn new(
        parts: &'a AgentParts,
        session: &'a SessionHandle,
        observer: &'a dyn TurnObserver,
        cancel: CancellationToken,
        history: Vec<Message>,
        interaction: std::sync::Arc<dyn crate::interaction::Interaction>,
    ) -> TurnRun<'a> {
        TurnRun {
            interaction,
            execution: crate::execution::Execution::local(parts.workdir.clone()),
            parts,
            session,
            observer,
            cancel,
            messages: history,
            new_messages: Vec::new(),
            api_calls: 0,
            usage: Usage::default(),
            pending: spend::PendingCalls::default(),
            known_prompt: None,
            compressions: 0,
            compressed: false,
            tools: parts.registry.specs(),
            registry: parts.registry.clone(),
            recall: None,
            user_text: String::new(),
            media: Vec::new(),
            repair_logged: false,
            outbox: None,
            owed: false,
            platform: None,
            max_turns: None,
            provider: parts.provider.clone(),
            continuation: None,
            instructions: None,
        }
    }

    /// Sends `instructions` after the system prompt in this turn's
    /// requests.
    pub(crate) fn with_instructions(mut self, instructions: Option<String>) -> TurnRun<'a> {
        self.instructions = instructions.filter(|i| !i.trim().is_empty());
        self
    }

    /// The model this turn talks to, instead of [`AgentParts::provider`].
    pub(crate) fn with_provider(
        mut self,
        provider: std::sync::Arc<dyn talaria_llm::Provider>,
    ) -> TurnRun<'a> {
        self.provider = provider;
        self
    }

    /// The platform the conversation is on, as the tools see it.
    pub(crate) fn with_platform(mut self, platform: Option<String>) -> TurnRun<'a> {
        self.platform = platform;
        self
    }

    /// Spends at most `max_turns` steps instead of `agent.max_turns`.
    pub(crate) fn with_max_turns(mut self, max_turns: Option<u32>) -> TurnRun<'a> {
        self.max_turns = max_turns;
        self
    }

    /// Stores the final answer through `outbox`, with its obligation.
    /// The files the user's row carries (images for a model that sees).
    pub(crate) fn with_media(mut self, media: Vec<talaria_core::MediaRef>) -> TurnRun<'a> {
        self.media = media;
        self
    }

    pub(crate) fn with_outbox(mut self, outbox: Option<std::sync::Arc<dyn Outbox>>) -> TurnRun<'a> {
        self.outbox = outbox;
        self
    }

    /// Sends `recall` (already fenced) with this turn's user message.
    pub(crate) fn with_recall(mut self, recall: Option<String>) -> TurnRun<'a> {
        self.recall = recall;
        self
    }

    /// Runs commands and file tools as `execution` says.
    pub(crate) fn with_execution(mut self, execution: crate::execution::Execution) -> TurnRun<'a> {
        self.execution = execution;
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
        let started = std::time::Instant::now();
        let result = self.steps(user_text).await;
        let outcome = match &result {
            Ok(o) => match o.exit {
                TurnExit::Completed | TurnExit::BudgetExhausted => "ok",
                TurnExit::Interrupted => "interrupted",
                TurnExit::Failed(_) => "error",
            },
            Err(_) => "error",
        };
        talaria_core::metrics::turn_finished(
            self.platform.as_deref().unwrap_or("cli"),
            outcome,
            started.elapsed(),
        );
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
        self.store_pending_calls().await;
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
        let media = std::mem::take(&mut self.media);
        self.persist(Message::user_with_media(user_text, media))
            .await?;
        let budget = self
            .max_turns
            .unwrap_or(self.parts.config.agent.max_turns)
            .max(1);
        let mut iterations = 0;
        let mut nudge: Option<&str> = None;
        let mut retried_empty = false;
        let mut continuations = 0;
        loop {
            // Continuing a cut answer finishes the step it belongs to.
            if self.continuation.is_none() {
                if iterations >= budget {
                    return self.budget_summary().await;
                }
                iterations += 1;
            }
            let response = match self.call_model(true, nudge.take()).await? {
                Call::Answered(r) => r,
                Call::Interrupted(partial) => {
                    let so_far = self.continuation.take().unwrap_or_default();
                    return self.finish_interrupted(&format!("{so_far}{partial}")).await;
                }
                Call::Failed(reason) => {
                    // What the model already wrote is the answer, cut short.
                    if let Some(so_far) = self.continuation.take() {
                        tracing::warn!(session = %self.session.id, "continuing a cut answer failed: {reason}");
                        self.observer.notice(
                            "The model could not finish its answer; keeping what it wrote.",
                        );
                        let mut row = Message::assistant(so_far.clone());
                        row.finish_reason = Some("length".to_owned());
                        let answer = so_far.trim().to_owned();
                        self.persist_answer(row, &answer).await?;
                        return Ok(self.outcome(answer, TurnExit::Completed));
                    }
                    return Ok(self.outcome(String::new(), TurnExit::Failed(reason)));
                }
            };
            let mut reply = self.assistant_row(response.message);
            if let Some(so_far) = self.continuation.take() {
                reply.content = format!("{so_far}{}", reply.content);
            }
            if !reply.has_tool_calls()
                && reply.finish_reason.as_deref() == Some("length")
                && !reply.content.trim().is_empty()
                && continuations < MAX_CONTINUATIONS
            {
                continuations += 1;
                tracing::debug!(session = %self.session.id, continuations, "answer cut at the output limit; asking the model to continue");
                self.continuation = Some(reply.content);
                nudge = Some(CONTINUE_NUDGE);
                continue;
            }
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
        let partial = self.parts.redactor.redact(partial.trim());
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
        let redactor = &self.parts.redactor;
        message.role = Role::Assistant;
        message.tool_call_id = None;
        message.tool_name = None;
        message.content = redactor.redact(&message.content);
        message.reasoning = message.reasoning.map(|r| redactor.redact(&r));
        message
    }

    fn outcome(&mut self, answer: String, exit: TurnExit) -> TurnOutcome {
        let answer = self
            .execution
            .confine_media(&answer, &self.parts.home.media_dir());
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
        let calls = self.pending.take();
        // The files an untrusted conversation may send are checked here,
        // where its workspace is known.
        let owed = crate::memory_context::sanitize(
            &self
                .execution
                .confine_media(answer, &self.parts.home.media_dir()),
        );
        outbox
            .append_answer_with_calls(&self.session.id, &message, &calls, &owed)
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
        let calls = self.pending.take();
        self.parts
            .store
            .append_message_with_calls(&self.session.id, &message, &calls)
            .await?;
        self.messages.push(message.clone());
        self.new_messages.push(message);
        Ok(())
    }
}
