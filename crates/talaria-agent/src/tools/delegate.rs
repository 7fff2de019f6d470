//! `delegate_task`: hands work to subagents, each a turn of its own in a
//! fresh session, and returns what they report.
//!
//! A subagent gets the task as its first message, the parent's tools of
//! this turn minus [`BLOCKED_TOOLS`] (narrowed to the toolsets asked for),
//! the parent's [`crate::Execution`], its own step budget
//! (`delegation.max_iterations`) and nobody to ask: approvals are refused
//! (unless `delegation.subagent_auto_approve`) and questions unanswered.
//! Its tool calls reach the parent's observer as progress lines. Children
//! of one call run at once; an interrupt of the parent reaches them all and
//! the tool returns only once each has stopped.
//!
//! With `background: true` the single task runs detached from the turn:
//! the job is opened with the front end's [`Reports`] first (so its end is
//! owed to the chat), the tool answers at once, and the report is closed
//! when the subagent finishes. Only [`DelegateTool::shutdown`] stops it.
//!
//! The tool needs the agent that runs it, which is built after its
//! registry (holding this tool): [`DelegateBinding`] is bound afterwards
//! and keeps a weak reference, so the agent and the tool do not keep each
//! other alive.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

use async_trait::async_trait;
use futures::FutureExt;
use serde_json::{Value, json};
use talaria_llm::Provider;
use talaria_store::NewSession;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{
    Registry, Tool, ToolContext, ToolError, ToolResult, json_type, opt_array, opt_bool, opt_str,
    truncate_chars,
};
use crate::background::{JobKind, JobReport, JobStart, Reports, ReportsSlot};
use crate::interaction::{ApprovalDecision, ApprovalRequest, ClarifyRequest, Interaction};
use crate::observer::{Progress, TurnObserver};
use crate::{Agent, AgentParts, TurnExit, TurnOptions};

/// Tools a subagent never gets: no further delegation (depth is 1), no
/// human to ask, no writes to the shared memory, nothing sent to other
/// chats, no scripts calling tools in bulk.
pub const BLOCKED_TOOLS: [&str; 5] = [
    "delegate_task",
    "clarify",
    "memory",
    "send_message",
    "execute_code",
];

/// Toolsets that hold only blocked tools (or tools Talaria does not have):
/// asking for them adds nothing, so they are passed over rather than
/// refused (models trained on the ancestor name them).
const BLOCKED_TOOLSETS: [&str; 5] = [
    "delegation",
    "clarify",
    "memory",
    "messaging",
    "code_execution",
];

/// The most characters of a subagent's final answer handed back.
const MAX_SUMMARY_CHARS: usize = 4000;

/// The longest goal accepted, in characters.
const MAX_GOAL_CHARS: usize = 20_000;

/// The longest context accepted, in characters.
const MAX_CONTEXT_CHARS: usize = 100_000;

/// How much of a tool call's argument a progress line shows.
const PROGRESS_ARG_CHARS: usize = 60;

/// How much of the goal names a background job in notices.
const TITLE_CHARS: usize = 100;

/// Where the tool finds the agent that runs it; bound once that agent
/// exists. Clones share the binding.
#[derive(Clone, Default)]
pub struct DelegateBinding(Arc<OnceLock<Weak<Agent>>>);

impl DelegateBinding {
    /// An unbound binding: the tool refuses calls until [`Self::bind`].
    pub fn new() -> DelegateBinding {
        DelegateBinding::default()
    }

    /// Binds the agent whose registry holds the tool. Only a weak reference
    /// is kept (the agent owns the tool). A second call changes nothing.
    pub fn bind(&self, agent: &Arc<Agent>) {
        let _ = self.0.set(Arc::downgrade(agent));
    }

    fn agent(&self) -> Option<Arc<Agent>> {
        self.0.get().and_then(Weak::upgrade)
    }
}

impl std::fmt::Debug for DelegateBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("DelegateBinding")
            .field(&self.agent().is_some())
            .finish()
    }
}

/// The `delegate_task` tool. See the module documentation.
pub struct DelegateTool {
    binding: DelegateBinding,
    reports: ReportsSlot,
    /// The model subagents use instead of the parent's (`delegation.model`).
    provider: Option<Arc<dyn Provider>>,
    /// Cancels detached delegations (shutdown).
    shutdown: CancellationToken,
    /// Detached delegations, to wait for at shutdown.
    tracker: TaskTracker,
    /// Detached delegations running now.
    running: Arc<AtomicUsize>,
}

impl DelegateTool {
    /// The tool, running subagents on the agent `binding` will name and
    /// reporting detached ones through `reports`.
    pub fn new(binding: DelegateBinding, reports: ReportsSlot) -> DelegateTool {
        DelegateTool {
            binding,
            reports,
            provider: None,
            shutdown: CancellationToken::new(),
            tracker: TaskTracker::new(),
            running: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Subagents talk to `provider` (built from `delegation.model`) instead
    /// of the parent's model.
    pub fn with_provider(mut self, provider: Option<Arc<dyn Provider>>) -> DelegateTool {
        self.provider = provider;
        self
    }

    /// Detached delegations running now.
    pub fn background_running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    /// Interrupts every detached delegation and waits until each has
    /// stopped and reported (gateway shutdown). Later background calls are
    /// refused.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }

    /// The agent subagents run on: the parent's parts, with the delegation
    /// model when there is one. A fresh agent, not the parent itself, so a
    /// subagent's turn feeds neither the parent's memory provider nor its
    /// background review.
    fn child_agent(&self) -> Result<Arc<Agent>, ToolError> {
        let parent = self.binding.agent().ok_or_else(|| {
            ToolError::new("delegate_task is not available here (no agent to run subagents on)")
        })?;
        let parts: AgentParts = parent.parts().clone();
        let provider = self
            .provider
            .clone()
            .unwrap_or_else(|| parts.provider.clone());
        Ok(Arc::new(Agent::new(AgentParts { provider, ..parts })))
    }
}

/// One task as asked for.
#[derive(Debug, Clone)]
struct Task {
    goal: String,
    context: Option<String>,
    toolsets: Option<Vec<String>>,
}

/// The call's arguments, checked.
struct Request {
    tasks: Vec<Task>,
    background: bool,
}

fn parse_request(args: &Value, max_concurrent: usize) -> Result<Request, ToolError> {
    let top_toolsets = toolsets_arg(args, "toolsets")?;
    check_role(args, "role")?;
    let background = opt_bool(args, "background")?.unwrap_or(false);
    let listed = opt_array(args, "tasks")?.filter(|t| !t.is_empty());
    let tasks = match listed {
        Some(list) => {
            if list.len() > max_concurrent {
                return Err(ToolError::new(format!(
                    "too many tasks: {} given, at most {max_concurrent} run at once \
                     (delegation.max_concurrent); send at most {max_concurrent} per call",
                    list.len()
                )));
            }
            list.iter()
                .enumerate()
                .map(|(i, t)| parse_task(t, i, &top_toolsets))
                .collect::<Result<Vec<_>, _>>()?
        }
        None => {
            let goal = opt_str(args, "goal")?
                .map(str::trim)
                .filter(|g| !g.is_empty())
                .ok_or_else(|| {
                    ToolError::new(
                        "give `goal` (one task) or `tasks` (a batch of objects with a `goal` each)",
                    )
                })?;
            vec![Task {
                goal: checked_goal(goal, "goal")?,
                context: checked_context(opt_str(args, "context")?, "context")?,
                toolsets: top_toolsets,
            }]
        }
    };
    if background && tasks.len() > 1 {
        return Err(ToolError::new(
            "`background` runs a single task: give one `goal` (or call once per task)",
        ));
    }
    Ok(Request { tasks, background })
}

fn parse_task(task: &Value, i: usize, inherited: &Option<Vec<String>>) -> Result<Task, ToolError> {
    if !task.is_object() {
        return Err(ToolError::new(format!(
            "`tasks[{i}]` must be an object with a `goal`, got {}",
            json_type(task)
        )));
    }
    let at = |field: &str| format!("tasks[{i}].{field}");
    let goal = opt_str(task, "goal")
        .map_err(|_| ToolError::new(format!("`{}` must be a string", at("goal"))))?
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .ok_or_else(|| ToolError::new(format!("`{}` is required (what to do)", at("goal"))))?;
    let context = opt_str(task, "context")
        .map_err(|_| ToolError::new(format!("`{}` must be a string", at("context"))))?;
    check_role(task, &at("role"))?;
    let toolsets = toolsets_arg(task, &at("toolsets"))?.or_else(|| inherited.clone());
    Ok(Task {
        goal: checked_goal(goal, &at("goal"))?,
        context: checked_context(context, &at("context"))?,
        toolsets,
    })
}

fn checked_goal(goal: &str, name: &str) -> Result<String, ToolError> {
    if goal.chars().count() > MAX_GOAL_CHARS {
        return Err(ToolError::new(format!(
            "`{name}` is longer than {MAX_GOAL_CHARS} characters; put details in `context`"
        )));
    }
    Ok(goal.to_owned())
}

fn checked_context(context: Option<&str>, name: &str) -> Result<Option<String>, ToolError> {
    let Some(context) = context.map(str::trim).filter(|c| !c.is_empty()) else {
        return Ok(None);
    };
    if context.chars().count() > MAX_CONTEXT_CHARS {
        return Err(ToolError::new(format!(
            "`{name}` is longer than {MAX_CONTEXT_CHARS} characters; point to files instead"
        )));
    }
    Ok(Some(context.to_owned()))
}

/// `role` is `leaf` or `orchestrator`; both run as a leaf (depth 1).
fn check_role(args: &Value, name: &str) -> Result<(), ToolError> {
    let field = name.rsplit('.').next().unwrap_or(name);
    match args.get(field).filter(|v| !v.is_null()) {
        None => Ok(()),
        Some(Value::String(r)) if matches!(r.trim(), "leaf" | "orchestrator") => Ok(()),
        Some(_) => Err(ToolError::new(format!(
            "`{name}` must be \"leaf\" or \"orchestrator\""
        ))),
    }
}

/// A `toolsets` list: known toolset names; those holding only blocked
/// tools are dropped. `None` when not given (inherit everything allowed).
fn toolsets_arg(args: &Value, name: &str) -> Result<Option<Vec<String>>, ToolError> {
    let field = name.rsplit('.').next().unwrap_or(name);
    let Some(list) = args.get(field).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let list = list.as_array().ok_or_else(|| {
        ToolError::new(format!(
            "`{name}` must be a list of toolset names, like [\"terminal\", \"file\"]"
        ))
    })?;
    let mut sets = Vec::new();
    for item in list {
        let set = item
            .as_str()
            .map(str::trim)
            .ok_or_else(|| ToolError::new(format!("each `{name}` entry must be a string")))?;
        if BLOCKED_TOOLSETS.contains(&set) {
            continue;
        }
        if !talaria_core::toolsets::is_known(set) {
            let known: Vec<&str> = talaria_core::toolsets::TOOLSETS
                .iter()
                .map(|(n, _)| *n)
                .filter(|n| !BLOCKED_TOOLSETS.contains(n))
                .collect();
            return Err(ToolError::new(format!(
                "`{name}`: unknown toolset `{set}`; known: {}",
                known.join(", ")
            )));
        }
        sets.push(set.to_owned());
    }
    Ok(Some(sets))
}

/// The subagent's first message: the task, and what its answer is for.
fn task_message(task: &Task) -> String {
    let mut text = String::from(
        "You are a subagent: another agent handed you one task and will read only your \
         final answer. You know nothing of its conversation beyond what follows.\n\nTASK:\n",
    );
    text.push_str(&task.goal);
    if let Some(context) = &task.context {
        text.push_str("\n\nCONTEXT:\n");
        text.push_str(context);
    }
    text.push_str(
        "\n\nWork on it with the tools you have. No human is watching: questions go \
         unanswered and commands that need an approval are refused, so find another way or \
         report what blocked you. When you are done, answer with a short report: what you \
         did, what you found or achieved, the files you created or changed, and any problems \
         or loose ends.",
    );
    text
}

/// Refuses approvals (unless told to grant them) and answers no question:
/// nobody watches a subagent.
struct Unattended {
    auto_approve: bool,
}

#[async_trait]
impl Interaction for Unattended {
    async fn approve(&self, request: &ApprovalRequest) -> ApprovalDecision {
        if self.auto_approve {
            tracing::warn!(reason = %request.reason, "a subagent's command was approved without asking (delegation.subagent_auto_approve)");
            ApprovalDecision::Once
        } else {
            tracing::warn!(reason = %request.reason, "a subagent's command needing approval was refused (set delegation.subagent_auto_approve to allow)");
            ApprovalDecision::Deny
        }
    }

    async fn clarify(&self, _request: &ClarifyRequest) -> Option<String> {
        None
    }
}

/// Passes a subagent's tool calls to the parent's observer as compact
/// lines, and counts them.
struct ChildObserver {
    progress: Progress,
    /// `[2/3] ` in a batch, empty for a single task.
    prefix: String,
    redactor: talaria_core::Redactor,
    tool_calls: AtomicU32,
}

impl TurnObserver for ChildObserver {
    fn tool_started(&self, name: &str, args: &str) {
        self.tool_calls.fetch_add(1, Ordering::Relaxed);
        let arg = self.redactor.redact(&compact_arg(args));
        let line = if arg.is_empty() {
            format!("↳ {}{name}", self.prefix)
        } else {
            format!("↳ {}{name}: {arg}", self.prefix)
        };
        self.progress.line(line);
    }

    fn progress(&self, line: &str) {
        self.progress.line(format!("  {}{line}", self.prefix));
    }
}

/// The telling part of a call's arguments on one short line: the command,
/// path or query when there is one, else the arguments as sent.
fn compact_arg(args: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(args).ok();
    let picked = parsed.as_ref().and_then(|v| {
        [
            "command", "path", "query", "pattern", "url", "goal", "action",
        ]
        .iter()
        .find_map(|k| v.get(*k).and_then(Value::as_str))
    });
    let text = match (picked, &parsed) {
        (Some(s), _) => s.to_owned(),
        (None, Some(Value::Object(m))) if m.is_empty() => String::new(),
        _ => args.to_owned(),
    };
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(PROGRESS_ARG_CHARS) {
        None => line,
        Some((cut, _)) => format!("{}…", &line[..cut]),
    }
}

/// What one subagent needs besides its task.
#[derive(Clone)]
struct ChildEnv {
    agent: Arc<Agent>,
    parent_session: String,
    registry: Arc<Registry>,
    execution: crate::Execution,
    interaction: Arc<dyn Interaction>,
    max_iterations: u32,
    redactor: talaria_core::Redactor,
    progress: Progress,
    total: usize,
}

/// How a subagent ended, for the parent.
struct ChildResult {
    index: usize,
    status: &'static str,
    summary: Option<String>,
    error: Option<String>,
    api_calls: u32,
    tool_calls: u32,
    seconds: f64,
    session_id: Option<String>,
}

impl ChildResult {
    fn json(&self) -> Value {
        let mut v = json!({
            "task_index": self.index,
            "status": self.status,
            "summary": self.summary,
            "api_calls": self.api_calls,
            "tool_calls": self.tool_calls,
            "duration_seconds": self.seconds,
        });
        if let Some(e) = &self.error {
            v["error"] = json!(e);
        }
        if let Some(s) = &self.session_id {
            v["session_id"] = json!(s);
        }
        v
    }

    fn failed(index: usize, error: String, started: Instant) -> ChildResult {
        ChildResult {
            index,
            status: "failed",
            summary: None,
            error: Some(error),
            api_calls: 0,
            tool_calls: 0,
            seconds: seconds_since(started),
            session_id: None,
        }
    }
}

fn seconds_since(started: Instant) -> f64 {
    (started.elapsed().as_secs_f64() * 100.0).round() / 100.0
}

/// Runs one subagent to its end: its own session (a child of the
/// parent's), one turn, the session ended with how it went.
async fn run_child(
    env: ChildEnv,
    task: Task,
    index: usize,
    cancel: CancellationToken,
) -> ChildResult {
    let started = Instant::now();
    let session = match env
        .agent
        .start_session(NewSession {
            source: "subagent".to_owned(),
            parent_session_id: Some(env.parent_session.clone()),
            ..NewSession::default()
        })
        .await
    {
        Ok(s) => s,
        Err(e) => {
            let error = env
                .redactor
                .redact(&format!("could not start the subagent's session: {e}"));
            return ChildResult::failed(index, error, started);
        }
    };
    let observer = ChildObserver {
        progress: env.progress.clone(),
        prefix: if env.total > 1 {
            format!("[{}/{}] ", index + 1, env.total)
        } else {
            String::new()
        },
        redactor: env.redactor.clone(),
        tool_calls: AtomicU32::new(0),
    };
    let options = TurnOptions {
        interaction: Some(env.interaction.clone()),
        registry: Some(env.registry.clone()),
        without_memory: true,
        execution: Some(env.execution.clone()),
        max_turns: Some(env.max_iterations),
        ..TurnOptions::default()
    };
    let turn = env
        .agent
        .run_turn_with(
            &session,
            &task_message(&task),
            &observer,
            cancel.clone(),
            options,
        )
        .await;
    let mut result = ChildResult {
        index,
        status: "failed",
        summary: None,
        error: None,
        api_calls: 0,
        tool_calls: observer.tool_calls.load(Ordering::Relaxed),
        seconds: 0.0,
        session_id: Some(session.id.clone()),
    };
    match turn {
        Ok(outcome) => {
            result.api_calls = outcome.api_calls;
            let answer = outcome.answer.trim();
            result.summary = (!answer.is_empty() && answer != crate::turn::INTERRUPTED_ANSWER)
                .then(|| truncate_chars(answer, MAX_SUMMARY_CHARS));
            match outcome.exit {
                TurnExit::Completed => result.status = "completed",
                TurnExit::BudgetExhausted => {
                    result.status = "budget_exhausted";
                    result.error = Some(format!(
                        "the subagent used its {} steps (delegation.max_iterations); the summary says how far it got",
                        env.max_iterations
                    ));
                }
                TurnExit::Interrupted => {
                    result.status = "interrupted";
                    result.error = Some("interrupted before the task was done".to_owned());
                }
                TurnExit::Failed(reason) => result.error = Some(reason),
            }
        }
        Err(e) => {
            result.error = Some(env.redactor.redact(&format!("the subagent failed: {e}")));
        }
    }
    if result.status == "failed" && cancel.is_cancelled() {
        result.status = "interrupted";
    }
    result.seconds = seconds_since(started);
    let reason = format!("subagent_{}", result.status);
    if let Err(e) = env
        .agent
        .parts()
        .store
        .end_session(&session.id, &reason)
        .await
    {
        tracing::warn!(session = %session.id, error = %e, "could not mark the subagent's session ended");
    }
    let mark = if result.status == "completed" {
        "✓"
    } else {
        "✗"
    };
    let label = if env.total > 1 {
        format!("[{}/{}] ", index + 1, env.total)
    } else {
        String::new()
    };
    env.progress.line(format!(
        "{mark} {label}{} ({}s)",
        result.status, result.seconds
    ));
    result
}

/// Runs `tasks` at once and returns their results in task order. Returns
/// only when every child has stopped.
async fn run_batch(
    children: Vec<(ChildEnv, Task)>,
    cancel: &CancellationToken,
) -> Vec<ChildResult> {
    let started = Instant::now();
    let count = children.len();
    // Spawned so children run in parallel; dropping the set (the parent's
    // call aborted) aborts them too, so none outlives the call.
    let mut set = tokio::task::JoinSet::new();
    for (index, (env, task)) in children.into_iter().enumerate() {
        let token = cancel.child_token();
        set.spawn(async move {
            // A panic inside one child must not lose the others' results.
            match std::panic::AssertUnwindSafe(run_child(env, task, index, token))
                .catch_unwind()
                .await
            {
                Ok(r) => r,
                Err(_) => ChildResult::failed(index, "the subagent crashed".to_owned(), started),
            }
        });
    }
    let mut results: Vec<Option<ChildResult>> = (0..count).map(|_| None).collect();
    while let Some(joined) = set.join_next().await {
        if let Ok(r) = joined
            && let Some(slot) = results.get_mut(r.index)
        {
            *slot = Some(r);
        }
    }
    results
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            r.unwrap_or_else(|| {
                ChildResult::failed(i, "the subagent stopped unexpectedly".to_owned(), started)
            })
        })
        .collect()
}

/// One line naming the goal, for notices.
fn title(goal: &str, redactor: &talaria_core::Redactor) -> String {
    let line = goal.split_whitespace().collect::<Vec<_>>().join(" ");
    let line = redactor.redact(&line);
    match line.char_indices().nth(TITLE_CHARS) {
        None => line,
        Some((cut, _)) => format!("{}…", &line[..cut]),
    }
}

/// Counts a detached delegation for as long as it lives.
struct RunningGuard(Arc<AtomicUsize>);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl DelegateTool {
    async fn start_background(
        &self,
        env: ChildEnv,
        task: Task,
        ctx: &ToolContext,
        limit: usize,
    ) -> ToolResult {
        let reports: Arc<dyn Reports> = self.reports.get().cloned().ok_or_else(|| {
            ToolError::new(
                "background delegation is not available here (nothing would deliver its result); \
                 run the task without `background`",
            )
        })?;
        if self.shutdown.is_cancelled() {
            return Err(ToolError::new(
                "Talaria is shutting down; no background work can start now",
            ));
        }
        let previous = self.running.fetch_add(1, Ordering::SeqCst);
        let guard = RunningGuard(self.running.clone());
        if previous >= limit {
            return Err(ToolError::new(format!(
                "{previous} background delegations are already running (the most is {limit}, \
                 delegation.max_concurrent); wait for one to finish or run this one without \
                 `background`"
            )));
        }
        let id = format!("deleg_{}", talaria_core::ids::new_session_id());
        let job = JobStart {
            id: id.clone(),
            session_id: ctx.session_id.clone(),
            kind: JobKind::Delegation,
            title: title(&task.goal, &ctx.redactor),
        };
        reports.opened(&job).await.map_err(|e| {
            ToolError::new(format!(
                "cannot start the delegation in the background: {e}; run it without `background`"
            ))
        })?;
        let cancel = self.shutdown.child_token();
        let redactor = ctx.redactor.clone();
        let shown = job.title.clone();
        self.tracker.spawn(async move {
            let _guard = guard;
            let goal = task.goal.clone();
            let context = task.context.clone();
            let result = match std::panic::AssertUnwindSafe(run_child(env, task, 0, cancel))
                .catch_unwind()
                .await
            {
                Ok(r) => r,
                Err(_) => ChildResult::failed(0, "the subagent crashed".to_owned(), Instant::now()),
            };
            let report = background_report(&job, &goal, context.as_deref(), &result, &redactor);
            reports.closed(&job, report).await;
        });
        Ok(json!({
            "status": "started",
            "delegation_id": id,
            "goal": shown,
            "note": "The subagent runs in the background. Carry on; its result will be \
                     delivered to this chat, and handed back to you, when it finishes. Do not \
                     wait or poll for it."
        })
        .to_string())
    }
}

/// The report of a finished detached delegation: a notice for the person
/// and, when it ran to an end, the result for a follow-up turn.
fn background_report(
    job: &JobStart,
    goal: &str,
    context: Option<&str>,
    result: &ChildResult,
    redactor: &talaria_core::Redactor,
) -> JobReport {
    let summary = result.summary.as_deref().unwrap_or("");
    let error = result.error.as_deref().unwrap_or("");
    let text = match result.status {
        "completed" => format!("🔀 Delegated task finished: {}\n\n{summary}", job.title),
        "interrupted" => {
            return JobReport {
                text: format!(
                    "🔀 Delegated task stopped before it finished (Talaria was shutting down): {}",
                    job.title
                ),
                follow_up: None,
            };
        }
        "budget_exhausted" => format!(
            "🔀 Delegated task ran out of steps: {}\n\n{summary}",
            job.title
        ),
        _ => format!("🔀 Delegated task failed: {}\n\n{error}", job.title),
    };
    let mut follow_up = format!(
        "[Background delegation {} ended: {}]\n\nGoal:\n{}",
        job.id,
        result.status,
        redactor.redact(goal)
    );
    if let Some(context) = context {
        follow_up.push_str("\n\nContext:\n");
        follow_up.push_str(&truncate_chars(&redactor.redact(context), 2000));
    }
    if !summary.is_empty() {
        follow_up.push_str("\n\nResult:\n");
        follow_up.push_str(summary);
    }
    if !error.is_empty() {
        follow_up.push_str("\n\nProblem:\n");
        follow_up.push_str(error);
    }
    JobReport {
        text: text.trim_end().to_owned(),
        follow_up: Some(follow_up),
    }
}

#[async_trait]
impl Tool for DelegateTool {
    fn name(&self) -> &str {
        "delegate_task"
    }

    fn description(&self) -> &str {
        "Hand work to subagents, each in a fresh conversation with its own step budget; only \
         their final reports come back, so their intermediate tool output stays out of your \
         context. Give `goal` (plus `context`, `toolsets`) for one task, or `tasks` for a batch \
         run at the same time (at most delegation.max_concurrent, 3 unless configured); results \
         come back as a list, one entry per task, in order. Use it for reasoning-heavy or \
         output-heavy subtasks and independent workstreams; not for a single tool call or for \
         anything needing the user. Subagents know nothing of this conversation: put every \
         path, error and constraint (and the language to answer in) into `context`. They cannot \
         use delegate_task, clarify, memory, send_message or execute_code, and cannot delegate \
         further: role 'orchestrator' is accepted but runs as a leaf. Commands needing approval \
         are refused to them. Their reports are their own claims: check side effects that \
         matter. An interrupt of this turn stops them. With `background: true` one task runs \
         detached: you get a delegation_id at once and the result is delivered to the chat when \
         it is done."
    }

    fn parameters(&self) -> Value {
        let toolsets_hint = "Toolsets the subagent gets, e.g. [\"terminal\", \"file\"] for code work or [\"web\"] for research; default: every toolset you have (minus the blocked tools)";
        json!({
            "type": "object",
            "properties": {
                "goal": {
                    "type": "string",
                    "description": "What the subagent should achieve, specific and self-contained (it has not seen this conversation)"
                },
                "context": {
                    "type": "string",
                    "description": "What it needs to know: file paths, error messages, constraints, the language to answer in"
                },
                "toolsets": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": toolsets_hint
                },
                "tasks": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "goal": {"type": "string", "description": "What this subagent should achieve"},
                            "context": {"type": "string", "description": "What this subagent needs to know"},
                            "toolsets": {
                                "type": "array",
                                "items": {"type": "string"},
                                "description": "Toolsets for this task; default: the top-level `toolsets`, else all of yours"
                            },
                            "role": {
                                "type": "string",
                                "enum": ["leaf", "orchestrator"],
                                "description": "Accepted for compatibility; every subagent runs as a leaf"
                            }
                        },
                        "required": ["goal"]
                    },
                    "description": "A batch run at the same time, at most delegation.max_concurrent (3 unless configured); top-level goal and context are then ignored"
                },
                "role": {
                    "type": "string",
                    "enum": ["leaf", "orchestrator"],
                    "description": "'leaf' (default): a worker that cannot delegate. 'orchestrator' is accepted but also runs as a leaf here (delegation depth is 1)"
                },
                "background": {
                    "type": "boolean",
                    "description": "Run one task detached from this turn: returns a delegation_id at once, and the result is delivered to the chat (and handed back to you) when it finishes. Not with a batch of several tasks. Do not wait or poll afterwards"
                }
            },
            "required": []
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolResult {
        let settings = &ctx.config.delegation;
        let limit = settings.max_concurrent.max(1);
        let request = parse_request(&args, limit)?;
        let agent = self.child_agent()?;
        let allowed = ctx.tools.without(&BLOCKED_TOOLS);
        let env = ChildEnv {
            agent,
            parent_session: ctx.session_id.clone(),
            registry: Arc::new(allowed),
            execution: ctx.execution.clone(),
            interaction: Arc::new(Unattended {
                auto_approve: settings.subagent_auto_approve,
            }),
            max_iterations: settings.max_iterations.max(1),
            redactor: ctx.redactor.clone(),
            progress: ctx.progress.clone(),
            total: request.tasks.len(),
        };
        let narrowed = |env: &ChildEnv, task: &Task| -> ChildEnv {
            let mut env = env.clone();
            if let Some(sets) = &task.toolsets {
                env.registry = Arc::new(env.registry.offered(sets));
            }
            env
        };
        if request.background {
            let Some(task) = request.tasks.into_iter().next() else {
                return Err(ToolError::new("give `goal` for the background task"));
            };
            let mut env = narrowed(&env, &task);
            // Nobody's turn is watching by the time it works.
            env.progress = Progress::none();
            return self.start_background(env, task, ctx, limit).await;
        }
        let started = Instant::now();
        let children = request
            .tasks
            .into_iter()
            .map(|task| (narrowed(&env, &task), task))
            .collect();
        let results = run_batch(children, &ctx.cancel).await;
        Ok(json!({
            "results": results.iter().map(ChildResult::json).collect::<Vec<_>>(),
            "total_duration_seconds": seconds_since(started),
        })
        .to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_shows_the_telling_argument_on_one_short_line() {
        assert_eq!(
            compact_arg(r#"{"command": "ls   -la\n/tmp"}"#),
            "ls -la /tmp"
        );
        assert_eq!(
            compact_arg(r#"{"path": "src/main.rs", "offset": 3}"#),
            "src/main.rs"
        );
        assert_eq!(compact_arg("{}"), "");
        assert_eq!(compact_arg(r#"{"n": 1}"#), r#"{"n": 1}"#);
        let long = compact_arg(&json!({"command": "x".repeat(200)}).to_string());
        assert_eq!(long.chars().count(), PROGRESS_ARG_CHARS + 1);
        assert!(long.ends_with('…'));
    }

    #[test]
    fn tasks_inherit_the_top_level_toolsets_and_blocked_sets_are_passed_over() {
        let args = json!({
            "toolsets": ["file", "memory"],
            "tasks": [{"goal": "a"}, {"goal": " b ", "toolsets": ["web", "delegation"]}],
            "role": "orchestrator"
        });
        let request = parse_request(&args, 3).unwrap();
        assert_eq!(
            request.tasks[0].toolsets.as_deref(),
            Some(&["file".to_owned()][..])
        );
        assert_eq!(request.tasks[1].goal, "b");
        assert_eq!(
            request.tasks[1].toolsets.as_deref(),
            Some(&["web".to_owned()][..])
        );
        assert!(!request.background);
        // An empty batch falls back to the single goal.
        let request = parse_request(&json!({"tasks": [], "goal": "solo"}), 3).unwrap();
        assert_eq!(request.tasks.len(), 1);
        assert_eq!(request.tasks[0].toolsets, None);
    }

    #[test]
    fn the_task_message_carries_goal_and_context_and_asks_for_a_report() {
        let text = task_message(&Task {
            goal: "find the bug".into(),
            context: Some("in parser.rs".into()),
            toolsets: None,
        });
        assert!(text.contains("TASK:\nfind the bug"));
        assert!(text.contains("CONTEXT:\nin parser.rs"));
        assert!(text.contains("files you created or changed"));
    }
}
