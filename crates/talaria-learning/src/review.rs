//! The background review: after some turns, a second agent reads the
//! conversation and decides what is worth keeping, as memory entries or
//! skills, without ever delaying the answer.
//!
//! # Triggers (counted, never timed)
//!
//! - a memory review after `memory.nudge_interval` user turns without a
//!   `memory` call;
//! - a skill review after `skills.creation_nudge_interval` model calls
//!   without a `skill_manage` call;
//! - both at once: one combined review. 0 turns a trigger off.
//!
//! Only turns that completed with an answer count toward a review, and
//! sessions from cron jobs never get one.
//!
//! # The review
//!
//! It runs on its own task with the same model, reading the conversation
//! as text, with only the memory and skill tools (any other call is an
//! unknown tool; nobody answers approvals), a budget of 16 model calls,
//! and the skill tools in review mode (it marks what it creates as the
//! agent's, and changes only such skills after reading them). Its session
//! lives in memory ([`crate::scratch`]), never in `state.db`. What it
//! wrote is reported as one line (`display.memory_notifications`); a
//! failure is logged and goes no further.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use talaria_agent::interaction::NoHuman;
use talaria_agent::tools::Registry;
use talaria_agent::{
    Agent, AgentParts, NullObserver, SessionHandle, TurnExit, TurnHook, TurnOutcome,
};
use talaria_core::config::MemoryNotifications;
use talaria_core::{Config, Home, Message, Redactor, Role};
use talaria_llm::Provider;
use talaria_store::{NewSession, SessionStore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::scratch::ScratchStore;
use crate::skills::Library;

/// Model calls one review may make.
pub const REVIEW_BUDGET: u32 = 16;

/// Sessions whose counters are kept; beyond this the oldest are forgotten
/// (they restart from zero, which only delays a review).
const MAX_SESSIONS: usize = 1024;

/// The longest conversation text a review reads, in chars (the tail is
/// kept: the latest turns matter most).
const MAX_TRANSCRIPT_CHARS: usize = 40_000;

/// The longest single message in that text, in chars.
const MAX_MESSAGE_CHARS: usize = 2_000;

/// Sources whose sessions are never reviewed.
const NOT_REVIEWED: &[&str] = &["cron", "review"];

const MEMORY_PROMPT: &str = "Review the conversation above and decide whether anything belongs in memory. Save only durable facts: who the user is, their preferences, how they want you to work, and facts about their environment that will matter in later conversations. Do not save what was only true for this task, what is already in memory, or guesses. Most conversations hold nothing worth saving: then answer exactly \"Nothing to save.\"";

const SKILL_PROMPT: &str = "Review the conversation above and decide whether a skill should be written or fixed. Worth a skill: a non-obvious procedure that worked and will recur, a workflow the user corrected, a loaded skill that turned out wrong. Prefer, in order: patching a skill used in this conversation, patching an existing broader skill, adding a support file to one, and only then creating a new skill named for the class of task (never for one error or one-off). Never record environment failures, transient errors or one-off stories. Read a skill with skill_view before changing it. If nothing qualifies, answer exactly \"Nothing to save.\"";

const TOOLS_NOTE: &str =
    "You can only use the memory and skill tools here; any other tool is refused.";

/// What a review is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Focus {
    /// Save what was learned about the user and their preferences.
    Memory,
    /// Write or improve skills from the work done.
    Skills,
    /// Memory first, then skills.
    Both,
}

impl Focus {
    fn prompt(self) -> String {
        let body = match self {
            Focus::Memory => MEMORY_PROMPT.to_owned(),
            Focus::Skills => SKILL_PROMPT.to_owned(),
            Focus::Both => format!("{MEMORY_PROMPT}\n\nThen: {SKILL_PROMPT}"),
        };
        format!("{body}\n\n{TOOLS_NOTE}")
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    turns_since_memory: u32,
    calls_since_skill: u32,
}

/// Where review results go: the session reviewed and one line.
pub type Notify = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// Everything a review runs with.
#[derive(Clone)]
pub struct ReviewParts {
    /// The loaded configuration (model caps, review triggers).
    pub config: Arc<Config>,
    /// `TALARIA_HOME`: memory and the skills library live there.
    pub home: Home,
    /// The model the review runs on (the session's own).
    pub provider: Arc<dyn Provider>,
    /// The real store, to read the conversation from.
    pub store: Arc<dyn SessionStore>,
    /// The skills library the review writes through.
    pub library: Arc<Library>,
    /// Applied to what the review stores, as in a turn.
    pub redactor: Redactor,
    /// Where relative paths point for the review's tools.
    pub workdir: std::path::PathBuf,
    /// Told the one-line report of each review that changed something.
    pub notify: Notify,
}

/// The turn hook that starts reviews.
pub struct BackgroundReview {
    parts: ReviewParts,
    counters: Mutex<HashMap<String, Counters>>,
    tasks: TaskTracker,
}

impl BackgroundReview {
    /// The hook over `parts`; attach it to the agent with
    /// `Agent::set_turn_hook`.
    pub fn new(parts: ReviewParts) -> Arc<BackgroundReview> {
        Arc::new(BackgroundReview {
            parts,
            counters: Mutex::new(HashMap::new()),
            tasks: TaskTracker::new(),
        })
    }

    /// Waits for the reviews under way (tests; a short-lived process
    /// before it exits).
    pub async fn idle(&self) {
        self.tasks.close();
        self.tasks.wait().await;
        self.tasks.reopen();
    }

    /// Counts the turn and says which review, if any, is due.
    fn due(&self, session: &str, outcome: &TurnOutcome) -> Option<Focus> {
        let memory_every = self.parts.config.memory.nudge_interval;
        let skills_every = self.parts.config.skills.creation_nudge_interval;
        let called = |tool: &str| {
            outcome
                .new_messages
                .iter()
                .any(|m| m.tool_calls.iter().any(|c| c.name == tool))
        };
        let mut all = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        if all.len() >= MAX_SESSIONS && !all.contains_key(session) {
            all.clear();
        }
        let c = all.entry(session.to_owned()).or_default();
        c.turns_since_memory = if called("memory") {
            0
        } else {
            c.turns_since_memory.saturating_add(1)
        };
        c.calls_since_skill = if called("skill_manage") {
            0
        } else {
            c.calls_since_skill.saturating_add(outcome.api_calls)
        };
        let memory = memory_every > 0
            && self.parts.config.memory.enabled
            && c.turns_since_memory >= memory_every;
        let skills = skills_every > 0 && c.calls_since_skill >= skills_every;
        if memory {
            c.turns_since_memory = 0;
        }
        if skills {
            c.calls_since_skill = 0;
        }
        match (memory, skills) {
            (true, true) => Some(Focus::Both),
            (true, false) => Some(Focus::Memory),
            (false, true) => Some(Focus::Skills),
            (false, false) => None,
        }
    }

    /// Runs one review of `session_id` now and returns its line (`None`
    /// when nothing was written or notifications are off).
    pub async fn review(&self, session_id: &str, focus: Focus) -> Result<Option<String>, String> {
        run_review(&self.parts, session_id, focus).await
    }
}

async fn run_review(
    parts: &ReviewParts,
    session_id: &str,
    focus: Focus,
) -> Result<Option<String>, String> {
    let record = parts
        .store
        .session(session_id)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("the session is gone")?;
    if NOT_REVIEWED.contains(&record.source.as_str()) {
        return Ok(None);
    }
    // A review costs the conversation it reviews: a spent budget skips it.
    match talaria_agent::budget::exceeded(
        &parts.config,
        &*parts.store,
        &record,
        talaria_core::unix_now(),
    )
    .await
    {
        Ok(Some(spent)) => {
            tracing::info!(session = %session_id, "background review skipped: {}", spent.message());
            return Ok(None);
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(session = %session_id, error = %e, "cannot check budgets for the review")
        }
    }
    let transcript = parts
        .store
        .messages(session_id)
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|m| m.message)
        .collect::<Vec<_>>();
    let agent = review_agent(parts, session_id);
    let handle = agent
        .start_session(NewSession {
            source: "review".into(),
            parent_session_id: Some(session_id.to_owned()),
            ..NewSession::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    let prompt = format!(
        "[Background review of a conversation. Nobody reads your reply; only what you save with the tools counts.]\n\n<conversation>\n{}\n</conversation>\n\n{}",
        render(&transcript),
        focus.prompt()
    );
    let outcome = agent
        .run_turn(&handle, &prompt, &NullObserver, CancellationToken::new())
        .await
        .map_err(|e| e.to_string())?;
    if let TurnExit::Failed(reason) = &outcome.exit {
        return Err(reason.clone());
    }
    let mode = parts.config.display.memory_notifications;
    let actions = summarize(&outcome.new_messages, mode);
    if actions.is_empty() || mode == MemoryNotifications::Off {
        return Ok(None);
    }
    Ok(Some(format!("💾 learned: {}", actions.join(" · "))))
}

/// An agent with the same model, only the memory and skill tools, a small
/// budget and an in-memory store.
fn review_agent(p: &ReviewParts, reviewed: &str) -> Agent {
    let mut config = (*p.config).clone();
    config.agent.max_turns = REVIEW_BUDGET;
    let config = Arc::new(config);
    let mut registry = Registry::new();
    if config.memory.enabled
        && let Err(e) =
            registry.register(Arc::new(crate::log::LoggedMemory::new(&p.home, "review")))
    {
        tracing::error!("{e}");
    }
    for tool in crate::tools::review_skill_tools(p.library.clone()) {
        if let Err(e) = registry.register(tool) {
            tracing::error!("{e}");
        }
    }
    Agent::new(AgentParts {
        config,
        home: p.home.clone(),
        provider: p.provider.clone(),
        store: Arc::new(ScratchStore::billed_to(p.store.clone(), reviewed)),
        registry: Arc::new(registry),
        interaction: Arc::new(NoHuman),
        redactor: p.redactor.clone(),
        workdir: p.workdir.clone(),
    })
}

impl TurnHook for BackgroundReview {
    fn turn_finished(&self, session: &SessionHandle, outcome: &TurnOutcome) {
        if outcome.exit != TurnExit::Completed || outcome.answer.trim().is_empty() {
            return;
        }
        let Some(focus) = self.due(&session.id, outcome) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let parts = self.parts.clone();
        let session_id = session.id.clone();
        // The answer is already made; the review goes on its own task, so
        // the caller gets it now, and nothing the review does reaches it.
        self.tasks.spawn_on(
            async move {
                match run_review(&parts, &session_id, focus).await {
                    Ok(Some(line)) => (parts.notify)(&session_id, &line),
                    Ok(None) => {}
                    Err(e) => tracing::warn!(session = %session_id, error = %e, "background review failed"),
                }
            },
            &runtime,
        );
    }
}

/// The conversation as plain text, the tail kept when long.
fn render(messages: &[Message]) -> String {
    let mut lines: Vec<String> = Vec::new();
    for m in messages {
        let clip = |s: &str| -> String {
            let flat = s.trim();
            if flat.chars().count() > MAX_MESSAGE_CHARS {
                let cut: String = flat.chars().take(MAX_MESSAGE_CHARS).collect();
                format!("{cut} […]")
            } else {
                flat.to_owned()
            }
        };
        match m.role {
            Role::User => lines.push(format!("USER: {}", clip(&m.content))),
            Role::Assistant => {
                if !m.tool_calls.is_empty() {
                    let names: Vec<&str> = m.tool_calls.iter().map(|c| c.name.as_str()).collect();
                    lines.push(format!("ASSISTANT [used: {}]", names.join(", ")));
                }
                if !m.content.trim().is_empty() {
                    lines.push(format!("ASSISTANT: {}", clip(&m.content)));
                }
            }
            Role::Tool => lines.push(format!(
                "TOOL {}: {}",
                m.tool_name.as_deref().unwrap_or("?"),
                clip(&m.content).chars().take(300).collect::<String>()
            )),
            Role::System => {}
        }
    }
    let mut text = lines.join("\n");
    if text.chars().count() > MAX_TRANSCRIPT_CHARS {
        let skip = text.chars().count() - MAX_TRANSCRIPT_CHARS;
        text = format!(
            "[… earlier turns left out …]\n{}",
            text.chars().skip(skip).collect::<String>()
        );
    }
    text
}

/// What the review's successful tool calls did, one phrase each.
fn summarize(messages: &[Message], mode: MemoryNotifications) -> Vec<String> {
    let calls: HashMap<&str, &talaria_core::ToolCall> = messages
        .iter()
        .flat_map(|m| m.tool_calls.iter())
        .map(|c| (c.id.as_str(), c))
        .collect();
    let mut out: Vec<String> = Vec::new();
    for m in messages.iter().filter(|m| m.role == Role::Tool) {
        let result: Value = serde_json::from_str(&m.content).unwrap_or(Value::Null);
        if result["success"] != Value::Bool(true) || result["staged"] == Value::Bool(true) {
            continue;
        }
        let Some(call) = m.tool_call_id.as_deref().and_then(|id| calls.get(id)) else {
            continue;
        };
        let args: Value = serde_json::from_str(&call.arguments).unwrap_or(Value::Null);
        let phrase = match call.name.as_str() {
            "memory" => {
                let target = if args["target"] == "user" {
                    "user profile"
                } else {
                    "memory"
                };
                match (mode, args["content"].as_str()) {
                    (MemoryNotifications::Verbose, Some(c)) => {
                        format!(
                            "{target} updated: “{}”",
                            c.chars().take(120).collect::<String>()
                        )
                    }
                    _ => format!("{target} updated"),
                }
            }
            "skill_manage" => {
                let name = args["name"].as_str().unwrap_or("?");
                match args["action"].as_str().unwrap_or_default() {
                    "create" => format!("skill `{name}` created"),
                    "delete" => format!("skill `{name}` deleted"),
                    _ => format!("skill `{name}` updated"),
                }
            }
            _ => continue,
        };
        if !out.contains(&phrase) {
            out.push(phrase);
        }
    }
    out
}
