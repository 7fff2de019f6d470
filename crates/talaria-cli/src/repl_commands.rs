//! Slash commands typed at the `talaria chat` prompt.
//!
//! Every line that parses as a command is looked up in the registry shared
//! with the gateway ([`talaria_core::commands`]), so names, aliases and
//! `/help` mean the same in both, and a mistyped command is answered here
//! instead of being sent to the model as a question.
//!
//! `talaria chat -q` hands its text here too, so a one-shot slash command
//! runs the command (or the skill's turn) instead of reaching the model, and
//! an unknown one fails the same way.
//!
//! The REPL only reads a line between turns (Ctrl-C is what interrupts a
//! running one), so nothing here meets a turn in progress: `/stop` has
//! nothing to stop, `/queue` and `/steer` run their prompt now, and the
//! registry's [`talaria_core::commands::WhileRunning`] never applies.

use anyhow::{Context, anyhow};
use talaria_agent::{Agent, SessionHandle};
use talaria_core::commands::{self, Availability, CommandDef, Invocation};
use talaria_llm::LlmClient;
use talaria_store::{SessionFilter, SessionRecord};

use crate::runtime::Runtime;
use crate::sessions_cmd::when;
use crate::sources::SOURCE;

/// How many sessions `/sessions` lists; `/resume <number>` counts in it.
const RECENT: usize = 10;

/// Longest title `/title` stores, in characters.
const MAX_TITLE: usize = 100;

/// What the REPL does after a line was handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The line was answered here; show the prompt again.
    Handled,
    /// The line was refused here (an unknown command, wrong usage, or a
    /// command that failed), with the reason on stderr. The REPL goes on;
    /// a one-shot `-q` exits non-zero.
    Refused,
    /// Run this text as a turn in the current session.
    RunTurn(String),
    /// Leave the REPL.
    Exit,
}

/// What the terminal does for a command, by its canonical name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    New,
    Stop,
    Status,
    /// `/queue` and `/steer`: at the prompt there is no turn to wait for or
    /// to steer, so the prompt runs now.
    RunNow,
    Sessions,
    Resume,
    Title,
    Retry,
    Undo,
    Compress,
    Model,
    Usage,
    Whoami,
    Help,
    Version,
    ReloadMcp,
    Skills,
    Learn,
    Exit,
}

fn action(name: &str) -> Option<Action> {
    Some(match name {
        "new" => Action::New,
        "stop" => Action::Stop,
        "status" => Action::Status,
        "queue" | "steer" => Action::RunNow,
        "sessions" => Action::Sessions,
        "resume" => Action::Resume,
        "title" => Action::Title,
        "retry" => Action::Retry,
        "undo" => Action::Undo,
        "compress" => Action::Compress,
        "model" => Action::Model,
        "usage" => Action::Usage,
        "whoami" => Action::Whoami,
        "help" => Action::Help,
        "version" => Action::Version,
        "reload-mcp" => Action::ReloadMcp,
        "skills" => Action::Skills,
        "learn" => Action::Learn,
        "exit" => Action::Exit,
        _ => return None,
    })
}

/// A typed line, classified without touching the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line<'a> {
    /// Not a command: a message for the model.
    Prompt,
    /// A command the terminal runs, with its arguments.
    Command(&'static CommandDef, Action, &'a str),
    /// A name the registry does not know, as typed, with its arguments (a
    /// skill's name loads the skill).
    Unknown(&'a str, &'a str),
    /// A command only the gateway offers, as typed.
    GatewayOnly(&'a str),
    /// A command the registry offers here that this front end has not
    /// learnt yet; answered rather than sent to the model.
    Unsupported(&'a str),
}

fn classify(line: &str) -> Line<'_> {
    let Some(inv) = Invocation::parse(line) else {
        return Line::Prompt;
    };
    let Some(def) = commands::resolve(inv.name) else {
        return Line::Unknown(inv.name, inv.args);
    };
    if !def.availability.offered_on(Availability::CliOnly) {
        return Line::GatewayOnly(inv.name);
    }
    match action(def.name) {
        Some(a) => Line::Command(def, a, inv.args),
        None => Line::Unsupported(inv.name),
    }
}

fn help() -> String {
    format!(
        "{}Ctrl-C interrupts the running turn; at the prompt it clears the line. Ctrl-D leaves.",
        commands::help_text(Availability::CliOnly)
    )
}

/// The title as it will be stored: no control characters (they would
/// garble listings), at most [`MAX_TITLE`] characters. `None` if nothing
/// is left.
fn clean_title(args: &str) -> Option<String> {
    let title: String = args
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_TITLE)
        .collect();
    let title = title.trim();
    (!title.is_empty()).then(|| title.to_owned())
}

/// The `[N]` of `/undo`: 1 when absent, `None` when not a positive number.
fn exchange_count(args: &str) -> Option<usize> {
    if args.is_empty() {
        return Some(1);
    }
    args.parse::<usize>().ok().filter(|&n| n > 0)
}

/// `/sessions`: `list` numbered, with each session's active message count
/// from `counts`.
fn format_sessions(list: &[SessionRecord], counts: &[u64], current: &str) -> String {
    if list.is_empty() {
        return "No sessions yet.".to_owned();
    }
    let mut out = vec!["Recent sessions (/resume <number> switches):".to_owned()];
    for ((i, s), count) in list.iter().enumerate().zip(counts) {
        out.push(format!(
            "{:>2}. {} · {} · {} · {}{}",
            i + 1,
            s.title.as_deref().unwrap_or("(untitled)"),
            s.id,
            when(s.started_at),
            messages(*count),
            if s.id == current { " (current)" } else { "" }
        ));
    }
    out.join("\n")
}

/// "1 message", "4 messages".
fn messages(n: u64) -> String {
    crate::count(
        usize::try_from(n).unwrap_or(usize::MAX),
        "message",
        "messages",
    )
}

fn name_of(s: &SessionRecord) -> &str {
    s.title.as_deref().unwrap_or(&s.id)
}

/// The command side of the REPL: the session the prompt is in, and what
/// commands need to act on it.
pub struct Commands<'a> {
    rt: &'a Runtime,
    agent: &'a Agent,
    client: &'a LlmClient,
    session: SessionHandle,
}

impl<'a> Commands<'a> {
    /// Commands over `session`, which `/new` and `/resume` replace.
    pub fn new(
        rt: &'a Runtime,
        agent: &'a Agent,
        client: &'a LlmClient,
        session: SessionHandle,
    ) -> Commands<'a> {
        Commands {
            rt,
            agent,
            client,
            session,
        }
    }

    /// The session turns run in now.
    pub fn session(&self) -> &SessionHandle {
        &self.session
    }

    /// Handles one typed, non-empty line: answers a command here, or says
    /// which text to run as a turn (text that is not a command comes back
    /// as it was given).
    ///
    /// A failing command is reported and the REPL goes on: a store hiccup
    /// in `/sessions` is no reason to end the chat.
    pub async fn handle(&mut self, line: &str) -> Outcome {
        let step = match classify(line) {
            Line::Prompt => return Outcome::RunTurn(line.to_owned()),
            Line::Unknown(name, args) => {
                match talaria_learning::invoke::invocation(&self.rt.skills, name, args) {
                    Some(message) => return Outcome::RunTurn(message),
                    None => Ok(Step::Refuse(format!(
                        "Unknown command /{name}. Type /help to see the commands, or /skills to see the skills."
                    ))),
                }
            }
            Line::GatewayOnly(name) => Ok(Step::Refuse(format!(
                "/{name} is only available in chats served by the gateway. Type /help to see the commands here."
            ))),
            Line::Unsupported(name) => Ok(Step::Refuse(format!(
                "/{name} is not available in the terminal yet. Type /help to see the commands here."
            ))),
            Line::Command(def, action, args) => self.run(def, action, args).await,
        };
        match step {
            Ok(Step::Say(text)) => {
                println!("{text}");
                Outcome::Handled
            }
            Ok(Step::Refuse(text)) => {
                eprintln!("{text}");
                Outcome::Refused
            }
            Ok(Step::Go(outcome)) => outcome,
            Err(e) => {
                eprintln!("error: {e:#}");
                Outcome::Refused
            }
        }
    }

    async fn run(
        &mut self,
        def: &'static CommandDef,
        action: Action,
        args: &str,
    ) -> anyhow::Result<Step> {
        let text = match action {
            Action::Exit => return Ok(Step::Go(Outcome::Exit)),
            Action::RunNow if args.is_empty() => {
                return Ok(Step::Refuse(format!("Usage: {}", def.usage())));
            }
            Action::RunNow => return Ok(Step::Go(Outcome::RunTurn(args.to_owned()))),
            Action::Retry => return self.retry().await,
            Action::New => self.new_session(args).await?,
            Action::Stop => "Nothing is running: the prompt only shows between turns. \
                             Press Ctrl-C while a turn runs to interrupt it."
                .to_owned(),
            Action::Status => self.status().await?,
            Action::Sessions => {
                let list = self.recent().await?;
                let counts = self.counts(&list).await?;
                format_sessions(&list, &counts, &self.session.id)
            }
            Action::Resume => self.resume(args).await?,
            Action::Title => return self.title(args).await,
            Action::Undo => return self.undo(def, args).await,
            Action::Compress => self.compress().await?,
            Action::Model => self.model(args),
            Action::Usage => self.usage().await?,
            Action::Whoami => format!(
                "You: local user\nSource: {SOURCE}\nSession: {}",
                self.session.id
            ),
            Action::Help => help(),
            Action::Version => format!("Talaria {}", env!("CARGO_PKG_VERSION")),
            Action::ReloadMcp => self.agent.parts().registry.reload_sources().await,
            Action::Skills => talaria_learning::invoke::listing(&self.rt.skills),
            Action::Learn if args.trim().is_empty() => {
                return Ok(Step::Refuse(
                    "Usage: /learn <topic>, for example /learn rotating nginx logs".to_owned(),
                ));
            }
            Action::Learn => {
                return Ok(Step::Go(Outcome::RunTurn(
                    talaria_learning::invoke::learn_prompt(args.trim()),
                )));
            }
        };
        Ok(Step::Say(text))
    }

    async fn record(&self) -> anyhow::Result<SessionRecord> {
        self.rt
            .store
            .session(&self.session.id)
            .await
            .context("cannot read the session")?
            .ok_or_else(|| anyhow!("session {} is not in the store", self.session.id))
    }

    /// Each session's message count as a person sees it (the active
    /// transcript).
    async fn counts(&self, list: &[SessionRecord]) -> anyhow::Result<Vec<u64>> {
        let ids: Vec<String> = list.iter().map(|s| s.id.clone()).collect();
        self.rt
            .store
            .active_message_counts(&ids)
            .await
            .context("cannot count the sessions' messages")
    }

    /// The current session's message count as a person sees it.
    async fn count(&self) -> anyhow::Result<u64> {
        let counts = self
            .rt
            .store
            .active_message_counts(std::slice::from_ref(&self.session.id))
            .await?;
        Ok(counts.first().copied().unwrap_or(0))
    }

    async fn recent(&self) -> anyhow::Result<Vec<SessionRecord>> {
        self.rt
            .store
            .list_sessions(SessionFilter {
                source: Some(SOURCE.to_owned()),
                limit: RECENT,
                ..SessionFilter::default()
            })
            .await
            .context("cannot list sessions")
    }

    async fn new_session(&mut self, args: &str) -> anyhow::Result<String> {
        let previous = self.session.id.clone();
        self.session = self
            .agent
            .new_session(SOURCE)
            .await
            .context("cannot start a new session")?;
        if let Some(memory) = self.agent.memory() {
            memory.session_ended(&previous);
        }
        let Some(title) = clean_title(args) else {
            return Ok(format!("new session {}", self.session.id));
        };
        self.rt
            .store
            .set_title(&self.session.id, &title)
            .await
            .context("started a new session but cannot set its title")?;
        Ok(format!("new session {} ({title})", self.session.id))
    }

    async fn status(&self) -> anyhow::Result<String> {
        let s = self.record().await?;
        Ok(format!(
            "Session: {}{}\nMessages: {} · tokens in {} / out {}\nModel: {}",
            s.id,
            s.title.map(|t| format!(" ({t})")).unwrap_or_default(),
            self.count().await?,
            s.input_tokens,
            s.output_tokens,
            self.agent.parts().provider.model()
        ))
    }

    async fn resume(&mut self, args: &str) -> anyhow::Result<String> {
        let list = self.recent().await?;
        let counts = self.counts(&list).await?;
        let picked = talaria_agent::pick_session(&list, &counts, Some(&self.session.id), args)
            .map(|s| s.id.clone());
        let id = match picked {
            Some(id) => id,
            None if args.is_empty() => {
                return Ok(
                    "No other session has a conversation to go back to. /sessions lists them; /resume <number> opens any of them."
                        .to_owned(),
                );
            }
            // An id from `talaria sessions list`, perhaps older than the
            // recent list or from another source: `--resume` takes those too.
            None => match self.rt.store.session(args).await.ok().flatten() {
                Some(s) => s.id,
                None => {
                    return Ok(format!(
                        "No session matches `{args}`. /sessions lists them."
                    ));
                }
            },
        };
        if id == self.session.id {
            return Ok("That is the current session.".to_owned());
        }
        self.session = self
            .agent
            .resume_session(&id)
            .await
            .with_context(|| format!("cannot resume session {id}"))?;
        let s = self.record().await?;
        Ok(format!(
            "Resumed {} ({}).",
            name_of(&s),
            messages(self.count().await?)
        ))
    }

    async fn title(&self, args: &str) -> anyhow::Result<Step> {
        if args.is_empty() {
            return Ok(Step::Say(match self.record().await?.title {
                Some(t) => format!("Title: {t}"),
                None => "This session has no title. /title <name> sets one.".to_owned(),
            }));
        }
        let Some(title) = clean_title(args) else {
            return Ok(Step::Refuse("Usage: /title [name]".to_owned()));
        };
        self.rt
            .store
            .set_title(&self.session.id, &title)
            .await
            .context("cannot set the title")?;
        Ok(Step::Say(format!("Title set: {title}")))
    }

    async fn retry(&self) -> anyhow::Result<Step> {
        match self.agent.rewind(&self.session.id, 1).await {
            Ok(Some(text)) => Ok(Step::Go(Outcome::RunTurn(text))),
            Ok(None) => Ok(Step::Say("There is nothing to retry yet.".to_owned())),
            Err(e) => Err(e).context("cannot retry"),
        }
    }

    async fn undo(&self, def: &CommandDef, args: &str) -> anyhow::Result<Step> {
        let Some(n) = exchange_count(args) else {
            return Ok(Step::Refuse(format!("Usage: {}", def.usage())));
        };
        let removed = self
            .agent
            .rewind(&self.session.id, n)
            .await
            .context("cannot undo")?;
        Ok(Step::Say(match (removed, n) {
            (Some(_), 1) => "Removed the last exchange from this session.".to_owned(),
            (Some(_), n) => format!("Removed the last {n} exchanges from this session."),
            (None, 1) => "There is nothing to undo.".to_owned(),
            (None, n) => format!("This session has fewer than {n} exchanges; nothing was removed."),
        }))
    }

    async fn compress(&self) -> anyhow::Result<String> {
        // Summarising calls the model: start from the primary, as a turn does.
        self.client.begin_turn();
        let compressed = self
            .agent
            .compress_session(&self.session)
            .await
            .context("cannot compress")?;
        Ok(if compressed {
            "Compressed the session: older turns are summarised.".to_owned()
        } else {
            "The session is too short to compress.".to_owned()
        })
    }

    fn model(&self, args: &str) -> String {
        let model = self.agent.parts().provider.model();
        if args.is_empty() {
            format!("Model: {model}")
        } else {
            format!(
                "Model: {model}. /model only shows the model; to use another, set model.default in {} and start talaria chat again.",
                self.rt.home.config_file().display()
            )
        }
    }

    async fn usage(&self) -> anyhow::Result<String> {
        let s = self.record().await?;
        Ok(format!(
            "This session: {}; tokens in {}, out {}, cache read {}, cache write {}, reasoning {}.",
            messages(self.count().await?),
            s.input_tokens,
            s.output_tokens,
            s.cache_read_tokens,
            s.cache_write_tokens,
            s.reasoning_tokens
        ))
    }
}

/// What running a command led to.
enum Step {
    /// Print this and prompt again.
    Say(String),
    /// Print this on stderr: the line was refused (wrong usage).
    Refuse(String),
    /// Hand this to the REPL loop.
    Go(Outcome),
}

#[cfg(test)]
mod tests {
    use talaria_core::commands::COMMANDS;

    use super::*;

    fn command(line: &str) -> Option<(&'static str, Action, &str)> {
        match classify(line) {
            Line::Command(def, action, args) => Some((def.name, action, args)),
            _ => None,
        }
    }

    fn record(id: &str, title: Option<&str>) -> SessionRecord {
        SessionRecord {
            id: id.to_owned(),
            source: SOURCE.to_owned(),
            session_key: None,
            chat_id: None,
            user_id: None,
            thread_id: None,
            title: title.map(str::to_owned),
            model: None,
            system_prompt: None,
            parent_session_id: None,
            started_at: 1_700_000_000.0,
            ended_at: None,
            end_reason: None,
            message_count: 4,
            input_tokens: 0,
            output_tokens: 0,
            cache_read_tokens: 0,
            cache_write_tokens: 0,
            reasoning_tokens: 0,
        }
    }

    #[test]
    fn names_and_aliases_reach_their_actions() {
        assert_eq!(command("/new"), Some(("new", Action::New, "")));
        assert_eq!(
            command("/reset Trip plans"),
            Some(("new", Action::New, "Trip plans"))
        );
        assert_eq!(
            command("/Q do it"),
            Some(("queue", Action::RunNow, "do it"))
        );
        assert_eq!(command("/steer go"), Some(("steer", Action::RunNow, "go")));
        assert_eq!(
            command("/compact"),
            Some(("compress", Action::Compress, ""))
        );
        assert_eq!(command("/commands"), Some(("help", Action::Help, "")));
        assert_eq!(command("/v"), Some(("version", Action::Version, "")));
        assert_eq!(command("/quit"), Some(("exit", Action::Exit, "")));
        assert_eq!(command("/EXIT"), Some(("exit", Action::Exit, "")));
        assert_eq!(command("/undo 2"), Some(("undo", Action::Undo, "2")));
    }

    #[test]
    fn unknown_and_gateway_only_commands_are_answered_not_sent() {
        assert_eq!(classify("/frobnicate"), Line::Unknown("frobnicate", ""));
        assert_eq!(classify("/res now"), Line::Unknown("res", "now"));
        assert_eq!(classify("/sethome"), Line::GatewayOnly("sethome"));
        assert_eq!(classify("/set_home"), Line::GatewayOnly("set_home"));
        assert_eq!(classify("/approve always"), Line::GatewayOnly("approve"));
        assert_eq!(classify("/deny"), Line::GatewayOnly("deny"));
    }

    #[test]
    fn text_that_is_not_a_command_goes_to_the_model() {
        for line in ["hello", "/usr/bin/ls -la", "/", "what does /new do?"] {
            assert_eq!(classify(line), Line::Prompt, "{line}");
        }
    }

    #[test]
    fn every_command_offered_in_the_terminal_is_implemented() {
        for c in COMMANDS {
            let line = format!("/{}", c.name);
            if c.availability.offered_on(Availability::CliOnly) {
                assert!(
                    matches!(classify(&line), Line::Command(d, _, _) if d.name == c.name),
                    "{line} has no terminal action"
                );
            } else {
                assert_eq!(classify(&line), Line::GatewayOnly(c.name));
            }
        }
    }

    #[test]
    fn help_is_the_registry_list_for_the_terminal() {
        let h = help();
        assert!(h.contains("/exit (also /quit)"), "{h}");
        assert!(h.contains("/queue <prompt> (also /q)"), "{h}");
        assert!(!h.contains("/sethome") && !h.contains("/approve"), "{h}");
        assert!(h.contains("Ctrl-C"), "{h}");
    }

    #[test]
    fn titles_lose_control_characters_and_are_capped() {
        assert_eq!(clean_title("My notes").as_deref(), Some("My notes"));
        assert_eq!(clean_title("a\u{1b}[31mb\n").as_deref(), Some("a[31mb"));
        assert_eq!(clean_title("\u{7}\t"), None);
        assert_eq!(
            clean_title(&"é".repeat(150)).map(|t| t.chars().count()),
            Some(100)
        );
    }

    #[test]
    fn undo_counts() {
        assert_eq!(exchange_count(""), Some(1));
        assert_eq!(exchange_count("3"), Some(3));
        assert_eq!(exchange_count("0"), None);
        assert_eq!(exchange_count("-1"), None);
        assert_eq!(exchange_count("two"), None);
    }

    #[test]
    fn session_list_is_numbered_and_marks_the_current_one() {
        let list = vec![record("s2", Some("Trip")), record("s1", None)];
        let out = format_sessions(&list, &[7, 4], "s1");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(lines[1].starts_with(" 1. Trip · s2 · "), "{out}");
        assert!(!lines[1].contains("(current)"), "{out}");
        assert!(lines[2].starts_with(" 2. (untitled) · s1 · "), "{out}");
        assert!(lines[2].ends_with("4 messages (current)"), "{out}");
        assert_eq!(format_sessions(&[], &[], "s1"), "No sessions yet.");
    }
}
