//! What slash commands do, written once for every front end.
//!
//! `talaria_core::commands` says which commands exist and where they are
//! offered; this module runs them. A front end (the terminal REPL, a chat
//! served by the gateway) implements [`FrontEnd`]: how it reaches its
//! current session, which sessions it lists, and the few things only it
//! can do (stop a running turn, queue behind it, say who the user is).
//! Everything else, and every word the user reads, is here, so `/undo 3`
//! answers the same in a terminal and in a chat.
//!
//! It lives in the gateway crate because both front ends reach it there:
//! the CLI depends on the gateway, and the gateway's runner is the chat
//! front end.

use std::sync::Arc;

use async_trait::async_trait;
use talaria_agent::interaction::ApprovalDecision;
use talaria_agent::{Agent, SessionHandle};
use talaria_core::commands::{self, Availability, CommandDef, Invocation, WhileRunning};
use talaria_learning::Library;
use talaria_store::SessionRecord;

/// How many sessions `/sessions` lists; `/resume <number>` counts in it.
pub const RECENT: usize = 10;

/// Longest title `/title` stores, in characters.
pub const MAX_TITLE: usize = 100;

/// What a command leads to, for the front end to carry out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Tell the user this.
    Say(String),
    /// Tell the user this: the command was not carried out (unknown, not
    /// offered here, wrong usage, or it failed). The terminal prints it on
    /// stderr, and a one-shot `talaria chat -q` exits non-zero.
    Refuse(String),
    /// Run this text as a turn in the current session.
    Turn(String),
    /// Nothing to say: the front end has already acted (a chat queued a
    /// turn behind the running one).
    Done,
    /// Leave the front end (the terminal's `/exit`).
    Exit,
}

impl Reply {
    /// The text the user reads, if any.
    pub fn text(&self) -> Option<&str> {
        match self {
            Reply::Say(t) | Reply::Refuse(t) => Some(t),
            Reply::Turn(_) | Reply::Done | Reply::Exit => None,
        }
    }
}

/// What differs between front ends: where their session is, what they
/// list, and what only they can do. Errors are the text shown after
/// "Cannot ...:".
#[async_trait]
pub trait FrontEnd: Send + Sync {
    /// Which commands are offered here: [`Availability::CliOnly`] for the
    /// terminal, [`Availability::GatewayOnly`] for a chat.
    fn surface(&self) -> Availability;

    /// The agent commands act through (its store, model and tools).
    fn agent(&self) -> &Agent;

    /// Whether a turn is running now: commands that would race with it
    /// are refused until it ends.
    fn busy(&self) -> bool;

    /// The session commands act on, `None` while there is none yet.
    async fn current(&self) -> Result<Option<SessionRecord>, String>;

    /// The current session opened for work, started if there is none.
    async fn open(&mut self) -> Result<SessionHandle, String>;

    /// The sessions `/sessions` lists and `/resume` picks from, newest
    /// first, at most [`RECENT`].
    async fn recent(&self) -> Result<Vec<SessionRecord>, String>;

    /// A session named by id that `/resume <id>` may open from here
    /// beyond the recent ones.
    async fn find(&self, id: &str) -> Option<SessionRecord>;

    /// Starts a new session (the previous one is kept); returns its id.
    async fn start_new(&mut self) -> Result<String, String>;

    /// Makes session `id` the current one.
    async fn switch_to(&mut self, id: &str) -> Result<(), String>;

    /// `/stop`: interrupts the running turn; whether one was running.
    fn stop(&mut self) -> bool;

    /// Added to "Nothing is running." when `/stop` finds nothing.
    fn idle_hint(&self) -> &'static str {
        ""
    }

    /// `/queue <text>`: a turn of its own after the running one.
    fn queue(&mut self, text: &str) -> Reply;

    /// `/steer <text>`: guidance for the running turn.
    fn steer(&mut self, text: &str) -> Reply;

    /// `/status`'s lines about what runs now.
    fn activity(&self) -> Vec<String>;

    /// `/status`'s closing lines, after the model.
    fn status_extra(&self) -> Vec<String> {
        Vec::new()
    }

    /// `/whoami`: the user and the place, as this front end sees them.
    fn whoami(&self) -> String;

    /// Added to `/help`.
    fn help_footer(&self) -> &'static str {
        ""
    }

    /// The skills `/skills` lists and `/<skill-name>` loads.
    fn skills(&self) -> Arc<Library>;

    /// `/approve` and `/deny`: hands the decision to the command waiting
    /// for it; whether one was waiting. Only chats ask for approval.
    fn answer_approval(&mut self, _decision: ApprovalDecision) -> bool {
        false
    }

    /// `/sethome`: makes this place the home channel. Only chats have one.
    fn set_home(&mut self) -> Reply {
        Reply::Refuse(not_offered("sethome", Availability::GatewayOnly))
    }

    /// `/image PATH [message]`: a file from the disk goes with the next
    /// message (with `message`, that message is sent at once). A chat app
    /// sends photos itself.
    async fn attach(&mut self, _args: &str) -> Reply {
        Reply::Refuse(not_offered("image", Availability::CliOnly))
    }

    /// `/background <prompt>`: the prompt runs as its own conversation
    /// while this one stays free; its answer is delivered when ready.
    async fn background(&mut self, _prompt: &str) -> Reply {
        Reply::Refuse(not_offered("background", Availability::GatewayOnly))
    }
}

/// Runs the slash command `invocation` on `front`.
pub async fn run(front: &mut impl FrontEnd, invocation: Invocation<'_>) -> Reply {
    let (name, args) = (invocation.name, invocation.args);
    let Some(def) = commands::resolve(name) else {
        return skill_or_unknown(front, name, args).await;
    };
    if !def.availability.offered_on(front.surface()) {
        return Reply::Refuse(not_offered(name, def.availability));
    }
    if front.busy() && def.while_running == WhileRunning::Refused {
        return Reply::Say(format!(
            "⏳ A turn is running, so /{} can't run now. Wait for the answer or send /stop first.",
            def.name
        ));
    }
    match Action::of(def.name) {
        Some(action) => action.run(front, def, args).await,
        // The registry's test keeps every command mapped to an action.
        None => Reply::Refuse(format!(
            "/{name} is not available here yet. Type /help to see what is."
        )),
    }
}

/// What each command does, by its canonical name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `/new [title]`.
    New,
    /// `/stop`.
    Stop,
    /// `/status`.
    Status,
    /// `/queue <prompt>`.
    Queue,
    /// `/steer <prompt>`.
    Steer,
    /// `/background <prompt>`.
    Background,
    /// `/approve [session|always]`.
    Approve,
    /// `/deny`.
    Deny,
    /// `/sessions`.
    Sessions,
    /// `/resume [which]`.
    Resume,
    /// `/title [name]`.
    Title,
    /// `/retry`.
    Retry,
    /// `/undo [N]`.
    Undo,
    /// `/compress`.
    Compress,
    /// `/model`.
    Model,
    /// `/sethome`.
    SetHome,
    /// `/usage`.
    Usage,
    /// `/whoami`.
    Whoami,
    /// `/help`.
    Help,
    /// `/version`.
    Version,
    /// `/skills`.
    Skills,
    /// `/learn <topic>`.
    Learn,
    /// `/reload-mcp`.
    ReloadMcp,
    /// `/image PATH [message]`.
    Image,
    /// `/exit`.
    Exit,
}

impl Action {
    /// The action of the command named `name` (canonical, as the registry
    /// spells it).
    pub fn of(name: &str) -> Option<Action> {
        Some(match name {
            "new" => Action::New,
            "stop" => Action::Stop,
            "status" => Action::Status,
            "queue" => Action::Queue,
            "steer" => Action::Steer,
            "background" => Action::Background,
            "approve" => Action::Approve,
            "deny" => Action::Deny,
            "sessions" => Action::Sessions,
            "resume" => Action::Resume,
            "title" => Action::Title,
            "retry" => Action::Retry,
            "undo" => Action::Undo,
            "compress" => Action::Compress,
            "model" => Action::Model,
            "sethome" => Action::SetHome,
            "usage" => Action::Usage,
            "whoami" => Action::Whoami,
            "help" => Action::Help,
            "version" => Action::Version,
            "skills" => Action::Skills,
            "learn" => Action::Learn,
            "reload-mcp" => Action::ReloadMcp,
            "image" => Action::Image,
            "exit" => Action::Exit,
            _ => return None,
        })
    }

    async fn run(self, front: &mut impl FrontEnd, def: &CommandDef, args: &str) -> Reply {
        match self {
            Action::New => new(front, args).await,
            Action::Stop if front.stop() => Reply::Say(
                "⏹ Stopped. Your next message starts a new turn in the same conversation."
                    .to_owned(),
            ),
            Action::Stop => Reply::Say(format!("Nothing is running.{}", front.idle_hint())),
            Action::Status => Reply::Say(status(front).await),
            Action::Queue | Action::Steer | Action::Background if args.is_empty() => {
                Reply::Refuse(format!("Usage: {}", def.usage()))
            }
            Action::Queue => front.queue(args),
            Action::Steer => front.steer(args),
            Action::Background => front.background(args).await,
            Action::Approve => approval(front, approval_from_args(args)),
            Action::Deny => approval(front, ApprovalDecision::Deny),
            Action::Sessions => sessions(front).await,
            Action::Resume => resume(front, args).await,
            Action::Title => title(front, args).await,
            Action::Retry => retry(front).await,
            Action::Undo => undo(front, def, args).await,
            Action::Compress => compress(front).await,
            Action::Model => model(front, args).await,
            Action::SetHome => front.set_home(),
            Action::Image => front.attach(args).await,
            Action::Usage => usage(front).await,
            Action::Whoami => Reply::Say(front.whoami()),
            Action::Help => Reply::Say(format!(
                "{}{}",
                commands::help_text(front.surface()),
                front.help_footer()
            )),
            Action::Version => Reply::Say(format!("Talaria {}", env!("CARGO_PKG_VERSION"))),
            Action::Skills => {
                let library = front.skills();
                let listing = tokio::task::spawn_blocking(move || {
                    talaria_learning::invoke::listing(&library)
                })
                .await;
                match listing {
                    Ok(text) => Reply::Say(text),
                    Err(e) => Reply::Refuse(format!("⚠️ Cannot list the skills: {e}")),
                }
            }
            Action::Learn if args.trim().is_empty() => Reply::Refuse(
                "Usage: /learn <topic>, for example /learn rotating nginx logs".to_owned(),
            ),
            Action::Learn => Reply::Turn(talaria_learning::invoke::learn_prompt(args.trim())),
            Action::ReloadMcp => Reply::Say(front.agent().parts().registry.reload_sources().await),
            Action::Exit => Reply::Exit,
        }
    }
}

/// What a command offered only elsewhere answers.
pub fn not_offered(name: &str, availability: Availability) -> String {
    let place = match availability {
        Availability::GatewayOnly => "in chats served by the gateway",
        Availability::CliOnly => "in the terminal (talaria chat)",
        Availability::Both => "elsewhere",
    };
    format!("/{name} is only available {place}. Type /help to see the commands here.")
}

/// `/<skill-name> args` loads the skill for a turn; any other unknown name
/// is refused (never sent to the model as a question).
async fn skill_or_unknown(front: &impl FrontEnd, name: &str, args: &str) -> Reply {
    let library = front.skills();
    let (skill, wanted) = (name.to_owned(), args.to_owned());
    let message = tokio::task::spawn_blocking(move || {
        talaria_learning::invoke::invocation(&library, &skill, &wanted)
    })
    .await
    .ok()
    .flatten();
    match message {
        Some(message) => Reply::Turn(message),
        None => Reply::Refuse(format!(
            "Unknown command /{name}. Type /help to see the commands, or /skills to see the skills."
        )),
    }
}

fn approval_from_args(args: &str) -> ApprovalDecision {
    match args.trim().to_ascii_lowercase().as_str() {
        "session" => ApprovalDecision::Session,
        "always" | "permanent" => ApprovalDecision::Always,
        _ => ApprovalDecision::Once,
    }
}

fn approval(front: &mut impl FrontEnd, decision: ApprovalDecision) -> Reply {
    if !front.answer_approval(decision) {
        return Reply::Say("Nothing is waiting for approval.".to_owned());
    }
    Reply::Say(
        match decision {
            ApprovalDecision::Deny => "Denied.",
            ApprovalDecision::Session => "Approved for the rest of this conversation.",
            ApprovalDecision::Always => "Approved permanently.",
            _ => "Approved.",
        }
        .to_owned(),
    )
}

/// The title as it will be stored: no control characters (they would
/// garble listings), at most [`MAX_TITLE`] characters. `None` if nothing
/// is left.
pub fn clean_title(args: &str) -> Option<String> {
    let title: String = args
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_TITLE)
        .collect();
    let title = title.trim();
    (!title.is_empty()).then(|| title.to_owned())
}

/// The `[N]` of `/undo`: 1 when absent, `None` when not a positive number.
pub fn exchange_count(args: &str) -> Option<usize> {
    if args.is_empty() {
        return Some(1);
    }
    args.parse::<usize>().ok().filter(|&n| n > 0)
}

/// "1 message", "4 messages".
pub fn messages(n: u64) -> String {
    if n == 1 {
        "1 message".to_owned()
    } else {
        format!("{n} messages")
    }
}

/// A session's start as listings show it: local time to the minute.
pub fn when(ts: f64) -> String {
    chrono::DateTime::from_timestamp(ts as i64, 0)
        .map(|t| {
            t.with_timezone(&chrono::Local)
                .format("%Y-%m-%d %H:%M")
                .to_string()
        })
        .unwrap_or_else(|| "?".to_owned())
}

/// `/sessions`: `list` numbered, with each session's active message count
/// from `counts`, the `current` one marked.
pub fn format_sessions(list: &[SessionRecord], counts: &[u64], current: Option<&str>) -> String {
    if list.is_empty() {
        return "No conversations yet.".to_owned();
    }
    let mut out = vec!["Recent conversations (/resume <number> switches):".to_owned()];
    for ((i, s), count) in list.iter().enumerate().zip(counts) {
        out.push(format!(
            "{:>2}. {} · {} · {} · {}{}",
            i + 1,
            s.title.as_deref().unwrap_or("(untitled)"),
            s.id,
            when(s.started_at),
            messages(*count),
            if current == Some(s.id.as_str()) {
                " (current)"
            } else {
                ""
            }
        ));
    }
    out.join("\n")
}

/// Each session's message count as a person sees it: the active
/// transcript, not rows `/undo`, `/retry` or a compression replaced.
async fn counts(front: &impl FrontEnd, list: &[SessionRecord]) -> Result<Vec<u64>, String> {
    let ids: Vec<String> = list.iter().map(|s| s.id.clone()).collect();
    front
        .agent()
        .parts()
        .store
        .active_message_counts(&ids)
        .await
        .map_err(|e| e.to_string())
}

async fn new(front: &mut impl FrontEnd, args: &str) -> Reply {
    let id = match front.start_new().await {
        Ok(id) => id,
        Err(e) => return Reply::Refuse(format!("⚠️ Cannot start a new conversation: {e}")),
    };
    let mut named = String::new();
    let mut problem = String::new();
    if let Some(title) = clean_title(args) {
        match front.agent().parts().store.set_title(&id, &title).await {
            Ok(()) => named = format!(" ({title})"),
            Err(e) => problem = format!("\n⚠️ Cannot set its title: {e}"),
        }
    }
    Reply::Say(format!(
        "✨ Started a new conversation{named}. The previous one is kept: /sessions lists it and /resume brings it back.{problem}"
    ))
}

async fn status(front: &impl FrontEnd) -> String {
    let mut lines = Vec::new();
    let mut model = None;
    match front.current().await {
        Ok(Some(session)) => {
            model.clone_from(&session.model_choice);
            lines.push(format!(
                "Conversation: {}{}",
                session.id,
                session
                    .title
                    .as_deref()
                    .map(|t| format!(" ({t})"))
                    .unwrap_or_default()
            ));
            lines.push(format!(
                "Messages: {} · tokens in {} / out {}",
                counts_of(front, &session)
                    .await
                    .map_or_else(|| "?".to_owned(), |n| n.to_string()),
                session.input_tokens,
                session.output_tokens
            ));
        }
        Ok(None) => lines.push("Conversation: none yet".to_owned()),
        Err(e) => lines.push(format!("Conversation: unavailable ({e})")),
    }
    lines.extend(front.activity());
    lines.push(format!(
        "Model: {}",
        model.unwrap_or_else(|| front.agent().parts().provider.model().to_owned())
    ));
    lines.extend(front.status_extra());
    lines.join("\n")
}

async fn sessions(front: &impl FrontEnd) -> Reply {
    let listed = async {
        let list = front.recent().await?;
        let counts = counts(front, &list).await?;
        Ok::<_, String>((list, counts))
    };
    let (list, counts) = match listed.await {
        Ok(listed) => listed,
        Err(e) => return Reply::Refuse(format!("⚠️ Cannot list conversations: {e}")),
    };
    let current = front.current().await.ok().flatten().map(|s| s.id);
    Reply::Say(format_sessions(&list, &counts, current.as_deref()))
}

async fn resume(front: &mut impl FrontEnd, args: &str) -> Reply {
    let listed = async {
        let list = front.recent().await?;
        let counts = counts(front, &list).await?;
        Ok::<_, String>((list, counts))
    };
    let (list, counts) = match listed.await {
        Ok(listed) => listed,
        Err(e) => return Reply::Refuse(format!("⚠️ Cannot list conversations: {e}")),
    };
    let current = front.current().await.ok().flatten().map(|s| s.id);
    let picked = talaria_agent::pick_session(&list, &counts, current.as_deref(), args).cloned();
    let session = match picked {
        Some(session) => session,
        None if args.is_empty() => {
            return Reply::Say(
                "No other conversation has messages to go back to. /sessions lists them; /resume <number> opens any of them."
                    .to_owned(),
            );
        }
        // An id from `talaria sessions list`, perhaps older than the recent
        // list: the front end says whether it may be opened from here.
        None => match front.find(args).await {
            Some(session) => session,
            None => {
                return Reply::Say(format!(
                    "No conversation matches `{args}`. /sessions lists them."
                ));
            }
        },
    };
    if current.as_deref() == Some(session.id.as_str()) {
        return Reply::Say("That is the current conversation.".to_owned());
    }
    if let Err(e) = front.switch_to(&session.id).await {
        return Reply::Refuse(format!("⚠️ Cannot resume: {e}"));
    }
    let count = match counts_of(front, &session).await {
        Some(n) => messages(n),
        None => "? messages".to_owned(),
    };
    Reply::Say(format!(
        "↩️ Resumed {} ({count}).",
        session.title.as_deref().unwrap_or(&session.id)
    ))
}

async fn counts_of(front: &impl FrontEnd, session: &SessionRecord) -> Option<u64> {
    counts(front, std::slice::from_ref(session))
        .await
        .ok()
        .and_then(|c| c.first().copied())
}

async fn title(front: &impl FrontEnd, args: &str) -> Reply {
    let session = match front.current().await {
        Ok(Some(session)) => session,
        Ok(None) => return Reply::Say("No conversation yet.".to_owned()),
        Err(e) => return Reply::Refuse(format!("⚠️ Cannot read the conversation: {e}")),
    };
    if args.is_empty() {
        return Reply::Say(match session.title {
            Some(t) => format!("Title: {t}"),
            None => "This conversation has no title. /title <name> sets one.".to_owned(),
        });
    }
    let Some(title) = clean_title(args) else {
        return Reply::Refuse("Usage: /title [name]".to_owned());
    };
    match front
        .agent()
        .parts()
        .store
        .set_title(&session.id, &title)
        .await
    {
        Ok(()) => Reply::Say(format!("Title set: {title}")),
        Err(e) => Reply::Refuse(format!("⚠️ Cannot set the title: {e}")),
    }
}

/// Drops the current transcript back to before the `n`-th last user
/// message; returns that message's text (`None`: not that many).
async fn rewind(front: &impl FrontEnd, n: usize) -> Result<Option<String>, String> {
    let Some(session) = front.current().await? else {
        return Ok(None);
    };
    front
        .agent()
        .rewind(&session.id, n)
        .await
        .map_err(|e| e.to_string())
}

async fn retry(front: &impl FrontEnd) -> Reply {
    match rewind(front, 1).await {
        Ok(Some(text)) => Reply::Turn(text),
        Ok(None) => Reply::Say("There is nothing to retry yet.".to_owned()),
        Err(e) => Reply::Refuse(format!("⚠️ Cannot retry: {e}")),
    }
}

async fn undo(front: &impl FrontEnd, def: &CommandDef, args: &str) -> Reply {
    let Some(n) = exchange_count(args) else {
        return Reply::Refuse(format!("Usage: {}", def.usage()));
    };
    match (rewind(front, n).await, n) {
        (Ok(Some(_)), 1) => {
            Reply::Say("↩️ Removed the last exchange from this conversation.".to_owned())
        }
        (Ok(Some(_)), n) => Reply::Say(format!(
            "↩️ Removed the last {n} exchanges from this conversation."
        )),
        (Ok(None), 1) => Reply::Say("There is nothing to undo.".to_owned()),
        (Ok(None), n) => Reply::Say(format!(
            "This conversation has fewer than {n} exchanges; nothing was removed."
        )),
        (Err(e), _) => Reply::Refuse(format!("⚠️ Cannot undo: {e}")),
    }
}

async fn compress(front: &mut impl FrontEnd) -> Reply {
    let handle = match front.open().await {
        Ok(handle) => handle,
        Err(e) => return Reply::Refuse(format!("⚠️ Cannot open the conversation: {e}")),
    };
    match front.agent().compress_session(&handle).await {
        Ok(true) => {
            Reply::Say("🗜 Compressed the conversation: older turns are summarised.".to_owned())
        }
        Ok(false) => Reply::Say("The conversation is too short to compress.".to_owned()),
        Err(e) => Reply::Refuse(format!("⚠️ Cannot compress: {e}")),
    }
}

/// `/model`: which model this conversation talks to, and with a name,
/// a switch to another (a `model.routes` name, `model` on the same
/// server, `provider:model` elsewhere; `default` goes back). The switch
/// is stored with the session, so it outlives a restart; a new
/// conversation starts on the configured default.
async fn model(front: &mut impl FrontEnd, args: &str) -> Reply {
    let default = front.agent().parts().provider.model().to_owned();
    if args.is_empty() {
        let current = match front.current().await {
            Ok(Some(session)) => session.model_choice.unwrap_or_else(|| default.clone()),
            _ => default.clone(),
        };
        let mut text = if current == default {
            format!("Model: {current}.")
        } else {
            format!("Model: {current} (this conversation; the default is {default}).")
        };
        let routes: Vec<&str> = front
            .agent()
            .models()
            .map(|m| m.config().model.routes.keys().map(String::as_str).collect())
            .unwrap_or_default();
        if !routes.is_empty() {
            text.push_str(&format!(" Named models: {}.", routes.join(", ")));
        }
        text.push_str(
            " /model <name> or /model <provider>:<name> switches this conversation; \
             /model default goes back.",
        );
        return Reply::Say(text);
    }
    let name = match args.trim() {
        "default" | "reset" => None,
        name => Some(name),
    };
    let session = match front.open().await {
        Ok(session) => session,
        Err(e) => return Reply::Refuse(format!("⚠️ Cannot switch models: {e}")),
    };
    match front.agent().switch_model(&session, name).await {
        Ok(now) if now == default => {
            Reply::Say(format!("Model: {now}, the default, for this conversation."))
        }
        Ok(now) => Reply::Say(format!(
            "Model: {now} for this conversation from the next message (the default stays {default})."
        )),
        Err(e) => Reply::Refuse(format!("⚠️ Cannot switch to {}: {e}", args.trim())),
    }
}

async fn usage(front: &impl FrontEnd) -> Reply {
    let parts = front.agent().parts();
    match front.current().await {
        Ok(Some(s)) => {
            let cost = parts.store.session_cost_micros(&s.id).await.unwrap_or(0);
            let mut text = format!(
                "This conversation: {}; tokens in {}, out {}, cache read {}, cache write {}, reasoning {}; cost {}.",
                match counts_of(front, &s).await {
                    Some(n) => messages(n),
                    None => "? messages".to_owned(),
                },
                s.input_tokens,
                s.output_tokens,
                s.cache_read_tokens,
                s.cache_write_tokens,
                s.reasoning_tokens,
                talaria_agent::budget::usd(cost)
            );
            let now = talaria_core::unix_now();
            match talaria_agent::budget::spend_lines(&parts.config, &*parts.store, &s, now).await {
                Ok(lines) => {
                    for line in lines {
                        text.push('\n');
                        text.push_str(&line);
                    }
                }
                Err(e) => text.push_str(&format!("\n(cannot sum the spend: {e})")),
            }
            Reply::Say(text)
        }
        Ok(None) => Reply::Say("No conversation yet.".to_owned()),
        Err(e) => Reply::Refuse(format!("⚠️ Cannot read usage: {e}")),
    }
}

#[cfg(test)]
mod tests;
