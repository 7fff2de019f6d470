//! Slash commands typed at the `talaria chat` prompt.
//!
//! Every line that parses as a command runs through the slash commands
//! shared with the gateway ([`talaria_gateway::slash`], over the registry
//! in [`talaria_core::commands`]), so names, aliases, `/help` and every
//! answer are the same in both, and a mistyped command is answered here
//! instead of being sent to the model as a question. This module is the
//! terminal's [`FrontEnd`]: its one session, the sessions started here,
//! and what the prompt can and cannot do.
//!
//! `talaria chat -q` hands its text here too, so a one-shot slash command
//! runs the command (or the skill's turn) instead of reaching the model, and
//! an unknown one fails the same way.
//!
//! The REPL only reads a line between turns (Ctrl-C is what interrupts a
//! running one), so nothing here meets a turn in progress: `/stop` has
//! nothing to stop, `/queue` and `/steer` run their prompt now, and the
//! registry's [`talaria_core::commands::WhileRunning`] never applies.

use std::sync::Arc;

use async_trait::async_trait;
use talaria_agent::{Agent, SessionHandle};
use talaria_core::commands::{Availability, Invocation};
use talaria_gateway::slash::{self, FrontEnd, RECENT, Reply};
use talaria_learning::Library;
use talaria_llm::LlmClient;
use talaria_store::{SessionFilter, SessionRecord};

use crate::runtime::Runtime;
use crate::sources::SOURCE;

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

/// The command side of the REPL: the session the prompt is in, and what
/// commands need to act on it.
pub struct Commands<'a> {
    rt: &'a Runtime,
    agent: &'a Agent,
    client: &'a LlmClient,
    session: SessionHandle,
    /// What `/image` attached, waiting for the next message.
    staged: Staged,
}

/// Files attached for the next message: the words they give the model and
/// the images for a model that sees them.
#[derive(Debug, Default)]
pub struct Staged {
    /// Lines added after the message's text.
    pub text: String,
    /// Images for the user's row.
    pub media: Vec<talaria_core::MediaRef>,
}

impl Staged {
    /// Adds what a file gave.
    pub fn add(&mut self, digest: talaria_agent::attach::Digest) {
        for notice in &digest.notices {
            eprintln!("{notice}");
        }
        self.text = digest.message_text(&self.text);
        self.media.extend(digest.media);
    }

    /// The message to send: `text` with the staged files' words, and
    /// their images; nothing stays staged.
    pub fn take(&mut self, text: &str) -> (String, Vec<talaria_core::MediaRef>) {
        let staged = std::mem::take(self);
        if staged.text.is_empty() {
            return (text.to_owned(), staged.media);
        }
        let text = match text.trim() {
            "" => staged.text,
            t => format!("{t}\n\n{}", staged.text),
        };
        (text, staged.media)
    }
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
            staged: Staged::default(),
        }
    }

    /// Files attached for the next message (`/image`, `chat --image`).
    pub fn staged(&mut self) -> &mut Staged {
        &mut self.staged
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
        let Some(invocation) = Invocation::parse(line) else {
            return Outcome::RunTurn(line.to_owned());
        };
        match self.answer(invocation).await {
            Reply::Say(text) => {
                println!("{text}");
                Outcome::Handled
            }
            Reply::Refuse(text) => {
                eprintln!("{text}");
                Outcome::Refused
            }
            Reply::Turn(text) => Outcome::RunTurn(text),
            Reply::Done => Outcome::Handled,
            Reply::Exit => Outcome::Exit,
        }
    }

    /// What the command `invocation` answers here, before it is printed.
    pub(crate) async fn answer(&mut self, invocation: Invocation<'_>) -> Reply {
        slash::run(self, invocation).await
    }
}

#[async_trait]
impl FrontEnd for Commands<'_> {
    fn surface(&self) -> Availability {
        Availability::CliOnly
    }

    fn agent(&self) -> &Agent {
        self.agent
    }

    async fn attach(&mut self, args: &str) -> Reply {
        let (path, message) = crate::attach::split_path(args);
        if path.is_empty() {
            return Reply::Refuse("usage: /image PATH [message]".to_owned());
        }
        let model = self.client.model().to_owned();
        match crate::attach::attach_files(self.rt, &model, &[std::path::Path::new(path)]).await {
            Ok(digest) => {
                self.staged.add(digest);
                if message.is_empty() {
                    Reply::Say(format!("📎 {path} goes with your next message."))
                } else {
                    Reply::Turn(message.to_owned())
                }
            }
            Err(e) => Reply::Refuse(e),
        }
    }

    fn busy(&self) -> bool {
        // The prompt only reads a line between turns.
        false
    }

    async fn current(&self) -> Result<Option<SessionRecord>, String> {
        match self.rt.store.session(&self.session.id).await {
            Ok(Some(record)) => Ok(Some(record)),
            Ok(None) => Err(format!("session {} is not in the store", self.session.id)),
            Err(e) => Err(format!("cannot read the session: {e}")),
        }
    }

    async fn open(&mut self) -> Result<SessionHandle, String> {
        // Whatever calls the model next starts from the primary, as a
        // turn does.
        self.client.begin_turn();
        Ok(self.session.clone())
    }

    async fn recent(&self) -> Result<Vec<SessionRecord>, String> {
        self.rt
            .store
            .list_sessions(SessionFilter {
                source: Some(SOURCE.to_owned()),
                limit: RECENT,
                ..SessionFilter::default()
            })
            .await
            .map_err(|e| e.to_string())
    }

    async fn find(&self, id: &str) -> Option<SessionRecord> {
        // An id from `talaria sessions list`, perhaps older than the recent
        // list or from another source: `--resume` takes those too.
        self.rt.store.session(id).await.ok().flatten()
    }

    async fn start_new(&mut self) -> Result<String, String> {
        let previous = self.session.id.clone();
        self.session = self
            .agent
            .new_session(SOURCE)
            .await
            .map_err(|e| e.to_string())?;
        if let Some(memory) = self.agent.memory() {
            memory.session_ended(&previous);
        }
        Ok(self.session.id.clone())
    }

    async fn switch_to(&mut self, id: &str) -> Result<(), String> {
        self.session = self
            .agent
            .resume_session(id)
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    fn stop(&mut self) -> bool {
        false
    }

    fn idle_hint(&self) -> &'static str {
        " The prompt only shows between turns: press Ctrl-C while a turn runs to interrupt it."
    }

    fn queue(&mut self, text: &str) -> Reply {
        // No turn to wait for at the prompt: it runs now.
        Reply::Turn(text.to_owned())
    }

    fn steer(&mut self, text: &str) -> Reply {
        // No turn to steer at the prompt: it runs now.
        Reply::Turn(text.to_owned())
    }

    fn activity(&self) -> Vec<String> {
        vec!["Idle".to_owned()]
    }

    fn whoami(&self) -> String {
        format!(
            "You: local user\nSource: {SOURCE}\nConversation: {}",
            self.session.id
        )
    }

    fn help_footer(&self) -> &'static str {
        "Ctrl-C interrupts the running turn; at the prompt it clears the line. Ctrl-D leaves."
    }

    fn skills(&self) -> Arc<Library> {
        self.rt.skills.clone()
    }
}

#[cfg(test)]
mod tests;
