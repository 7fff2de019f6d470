//! The [`Agent`]: what a front end holds to open sessions and run turns.
//!
//! The agent keeps no conversation in memory between turns: every turn
//! reads the active transcript from the store and writes each row back as
//! it is produced, so a crash loses at most the row being generated and any
//! process can continue any session.

use std::sync::Arc;

use talaria_core::{Message, Role};
use talaria_store::{NewSession, SessionRecord};
use tokio_util::sync::CancellationToken;

use crate::interaction::Interaction;
use crate::models::ModelSwitch;
use crate::observer::TurnObserver;
use crate::prompt::{PromptInputs, build_system_prompt};
use crate::tools::Registry;
use crate::turn::{TurnOutcome, TurnRun};

// Their home until they got modules of their own (so the turn loop need
// not reach back into this one); the paths stay valid.
pub use crate::error::AgentError;
pub use crate::parts::AgentParts;
pub use crate::session::SessionHandle;
pub use crate::turn::Outbox;

/// Per-turn choices for [`Agent::run_turn_with`].
#[derive(Clone, Default)]
pub struct TurnOptions {
    /// Who tools ask during this turn, instead of [`AgentParts::interaction`].
    pub interaction: Option<Arc<dyn Interaction>>,
    /// The tools offered in this turn, instead of [`AgentParts::registry`]
    /// (a scheduled job runs without `memory`, for one).
    pub registry: Option<Arc<Registry>>,
    /// Leave the external memory provider out of this turn: no recall
    /// before it, nothing handed over after it (scheduled jobs).
    pub without_memory: bool,
    /// Where the final answer is stored when the front end owes it to
    /// someone (the gateway's delivery ledger): the row and the debt in one
    /// transaction. See [`TurnOutcome::owed`].
    pub outbox: Option<Arc<dyn Outbox>>,
    /// Files the user's message carries into the transcript (images for a
    /// model that sees them; see [`crate::attach`]).
    pub media: Vec<talaria_core::MediaRef>,
    /// Where the turn's commands run and which files its tools may touch;
    /// `None` is the owner on this machine ([`crate::Execution::local`] in
    /// [`AgentParts::workdir`]). Tools it can't serve are withheld.
    pub execution: Option<crate::execution::Execution>,
    /// The platform the conversation is on (`telegram`, `cli`,
    /// `api_server`): its `platform_toolsets` entry, when there is one,
    /// decides which toolsets the model is offered.
    pub platform: Option<String>,
    /// The step budget of this turn instead of `agent.max_turns` (a
    /// subagent's `delegation.max_iterations`).
    pub max_turns: Option<u32>,
    /// The model serving this turn instead of the session's (an API
    /// client that named a route); see [`Agent::route_provider`].
    pub provider: Option<Arc<dyn talaria_llm::Provider>>,
    /// Extra system instructions for this turn only (an API client's
    /// `instructions`): sent after the system prompt, never stored.
    pub instructions: Option<String>,
}

/// Runs turns over sessions. Cheap to share behind an `Arc`; holds no
/// per-conversation state of its own.
pub struct Agent {
    pub(crate) parts: AgentParts,
    /// Told about every finished turn (the background review); set once.
    turn_hook: std::sync::OnceLock<Arc<dyn TurnHook>>,
    /// An external memory provider's recall and sync; set once.
    memory: std::sync::OnceLock<Arc<crate::memory_provider::MemoryManager>>,
    /// Builds the providers of models other than the default; without it
    /// every conversation uses [`AgentParts::provider`].
    models: std::sync::OnceLock<Arc<ModelSwitch>>,
}

/// Something that wants to know when a turn has finished, after its
/// answer exists and before it is returned. It must not make the caller
/// wait: anything slow belongs on a task of its own.
pub trait TurnHook: Send + Sync {
    /// Called once per finished turn with the session and what the turn produced.
    fn turn_finished(&self, session: &SessionHandle, outcome: &TurnOutcome);
}

impl Agent {
    /// An agent over these parts.
    pub fn new(parts: AgentParts) -> Agent {
        Agent {
            parts,
            turn_hook: std::sync::OnceLock::new(),
            memory: std::sync::OnceLock::new(),
            models: std::sync::OnceLock::new(),
        }
    }

    /// Lets conversations switch models (`/model`) and API clients ask
    /// for routes; a second call changes nothing.
    pub fn set_models(&self, models: Arc<ModelSwitch>) {
        let _ = self.models.set(models);
    }

    /// The model switch, when this agent has one.
    pub fn models(&self) -> Option<&Arc<ModelSwitch>> {
        self.models.get()
    }

    /// The model `session` talks to: its switch, else the default.
    pub fn session_model(&self, session: &SessionHandle) -> String {
        session
            .model_choice()
            .unwrap_or_else(|| self.parts.provider.model().to_owned())
    }

    /// Switches `session` to the model `name` names (a route, `model` or
    /// `provider:model`), or back to the default with `None`; stored, so
    /// it outlives a restart. Refused, changing nothing, when the model
    /// cannot be served (no switch here, no key, no address). Returns the
    /// model now in use.
    pub async fn switch_model(
        &self,
        session: &SessionHandle,
        name: Option<&str>,
    ) -> Result<String, String> {
        let choice = match name {
            None => None,
            Some(name) => {
                let models = self.models.get().ok_or_else(|| {
                    "switching models is not available here: only the configured model \
                     answers"
                        .to_owned()
                })?;
                let name = name.trim();
                let route = models.resolve(name)?;
                models.provider(&route)?;
                // A route is kept by its name, so its own server and key
                // apply; anything else in the form it is read back.
                let stored = if models.config().route(name).is_some() {
                    name.to_owned()
                } else {
                    route.spec()
                };
                // Choosing the default by name is no switch at all.
                let is_default = route.provider.is_none()
                    && route.base_url.is_none()
                    && route.model == self.parts.provider.model();
                (!is_default).then_some(stored)
            }
        };
        self.parts
            .store
            .set_model_choice(&session.id, choice.as_deref())
            .await
            .map_err(|e| format!("cannot store the switch: {e}"))?;
        session.set_model_choice(choice);
        Ok(self.session_model(session))
    }

    /// The provider serving the route `name` of `model.routes`, when it is
    /// one (and can be served); the API server's `"model"` field.
    pub fn route_provider(&self, name: &str) -> Option<Arc<dyn talaria_llm::Provider>> {
        let models = self.models.get()?;
        let route = models.config().route(name)?;
        match models.provider(route) {
            Ok(provider) => Some(provider),
            Err(e) => {
                tracing::warn!(route = name, "model route cannot be served: {e}");
                None
            }
        }
    }

    /// The provider of `session`'s switched model, or the default when it
    /// did not switch or its model can no longer be served (said once per
    /// turn through `observer`).
    fn provider_for(
        &self,
        session: &SessionHandle,
        observer: &dyn TurnObserver,
    ) -> Arc<dyn talaria_llm::Provider> {
        let Some(choice) = session.model_choice() else {
            return self.parts.provider.clone();
        };
        let built = match self.models.get() {
            Some(models) => models
                .resolve(&choice)
                .and_then(|route| models.provider(&route)),
            None => Err("switching models is not available here".to_owned()),
        };
        built.unwrap_or_else(|e| {
            tracing::warn!(session = %session.id, model = %choice, "switched model unusable: {e}");
            observer.notice(&format!(
                "⚠️ This conversation's model {choice} cannot be used ({e}); {} answers instead. \
                 /model default goes back to it for good.",
                self.parts.provider.model()
            ));
            self.parts.provider.clone()
        })
    }

    /// The manager of the external memory provider, if one is set.
    pub fn memory(&self) -> Option<&Arc<crate::memory_provider::MemoryManager>> {
        self.memory.get()
    }

    /// Sets the manager of the external memory provider; a second call
    /// changes nothing.
    pub fn set_memory(&self, memory: Arc<crate::memory_provider::MemoryManager>) {
        let _ = self.memory.set(memory);
    }

    /// Sets the hook told about finished turns; a second call changes
    /// nothing.
    pub fn set_turn_hook(&self, hook: Arc<dyn TurnHook>) {
        let _ = self.turn_hook.set(hook);
    }

    /// The parts the agent was built from.
    pub fn parts(&self) -> &AgentParts {
        &self.parts
    }

    /// Starts a session: builds the system prompt once and stores it with a
    /// new session row.
    pub async fn new_session(&self, source: &str) -> Result<SessionHandle, AgentError> {
        self.start_session(NewSession {
            source: source.to_owned(),
            ..NewSession::default()
        })
        .await
    }

    /// [`Agent::new_session`] with routing metadata (session key, chat,
    /// user, parent). An empty `id` gets a fresh one; the model and the
    /// system prompt are always filled in here.
    pub async fn start_session(&self, mut meta: NewSession) -> Result<SessionHandle, AgentError> {
        if meta.id.is_empty() {
            meta.id = talaria_core::ids::new_session_id();
        }
        let prompt = self.build_prompt().await?;
        meta.model = Some(self.parts.provider.model().to_owned());
        meta.system_prompt = Some(prompt.clone());
        let (id, source) = (meta.id.clone(), meta.source.clone());
        self.parts.store.create_session(meta).await?;
        Ok(SessionHandle::new(id, source, prompt))
    }

    /// Reopens a stored session with the system prompt it was started with,
    /// byte for byte. A session stored without one (written by another
    /// tool) gets a fresh prompt, which is then stored.
    pub async fn resume_session(&self, id: &str) -> Result<SessionHandle, AgentError> {
        let record = self
            .parts
            .store
            .session(id)
            .await?
            .ok_or_else(|| AgentError::NoSuchSession(id.to_owned()))?;
        self.resume_record(record).await
    }

    /// [`Agent::resume_session`] for a session record the caller has
    /// already read (and checked), saving a second read.
    pub async fn resume_record(&self, record: SessionRecord) -> Result<SessionHandle, AgentError> {
        let prompt = match record.system_prompt {
            Some(p) => p,
            None => {
                let p = self.build_prompt().await?;
                self.parts.store.set_system_prompt(&record.id, &p).await?;
                p
            }
        };
        let handle = SessionHandle::new(record.id, record.source, prompt);
        handle.set_model_choice(record.model_choice);
        Ok(handle)
    }

    /// Runs one turn: stores `user_text`, calls the model and tools until
    /// the model answers (or the budget, an interrupt or an error ends it),
    /// storing every row as it is produced.
    ///
    /// `cancel` interrupts the turn: the model request is abandoned, tools
    /// not yet started are recorded as skipped, and the turn returns
    /// [`crate::TurnExit::Interrupted`] with whatever text had streamed.
    pub async fn run_turn(
        &self,
        session: &SessionHandle,
        user_text: &str,
        observer: &dyn TurnObserver,
        cancel: CancellationToken,
    ) -> Result<TurnOutcome, AgentError> {
        self.run_turn_with(session, user_text, observer, cancel, TurnOptions::default())
            .await
    }

    /// [`Agent::run_turn`] with per-turn choices (a front end that serves
    /// many chats routes each turn's approvals to its own chat).
    pub async fn run_turn_with(
        &self,
        session: &SessionHandle,
        user_text: &str,
        observer: &dyn TurnObserver,
        cancel: CancellationToken,
        options: TurnOptions,
    ) -> Result<TurnOutcome, AgentError> {
        let interaction = options
            .interaction
            .unwrap_or_else(|| self.parts.interaction.clone());
        let registry = options
            .registry
            .unwrap_or_else(|| self.parts.registry.clone());
        let execution = options
            .execution
            .unwrap_or_else(|| crate::execution::Execution::local(self.parts.workdir.clone()));
        let withheld = execution.withheld();
        let registry = if withheld.is_empty() {
            registry
        } else {
            Arc::new(registry.without(&withheld))
        };
        let registry = match options
            .platform
            .as_deref()
            .and_then(|p| self.parts.config.platform_toolsets.get(p))
        {
            Some(enabled) => Arc::new(registry.offered(enabled)),
            None => registry,
        };
        let _one_at_a_time = session.turn_lock.lock().await;
        // A spent budget refuses the turn before anything is stored or sent.
        let kind = match crate::budget::gate(&self.parts, session, user_text, &options.media).await
        {
            Ok(kind) => kind,
            Err(refused) => return Ok(refused),
        };
        let history: Vec<Message> = self
            .parts
            .store
            .messages(&session.id)
            .await?
            .into_iter()
            .map(|row| row.message)
            .collect();
        // The first answer names the session (unless a person already
        // did), from the conversation's first message, so lists read as
        // conversations rather than a column of "(untitled)".
        let first_exchange = !history.iter().any(|m| m.role == Role::Assistant);
        let title_from = history
            .iter()
            .find(|m| m.role == Role::User)
            .map_or(user_text, |m| m.content.as_str());
        let title = first_exchange.then(|| session_title(title_from)).flatten();
        let memory = self.memory.get().filter(|_| !options.without_memory);
        let recall = match memory {
            Some(memory) => memory.recall(user_text, &session.id).await,
            None => None,
        };
        let provider = match options.provider {
            Some(provider) => provider,
            None => self.provider_for(session, observer),
        };
        let outcome = TurnRun::new(&self.parts, session, observer, cancel, history, interaction)
            .with_provider(provider)
            .with_registry(registry)
            .with_execution(execution)
            .with_recall(recall)
            .with_outbox(options.outbox)
            .with_media(options.media)
            .with_platform(options.platform)
            .with_max_turns(options.max_turns)
            .with_instructions(options.instructions)
            .with_call_kind(kind)
            .run(user_text)
            .await?;
        if let Some(title) = title
            && outcome.exit == crate::TurnExit::Completed
            && let Err(e) = self
                .parts
                .store
                .set_title_if_unset(&session.id, &title)
                .await
        {
            tracing::warn!(session = %session.id, error = %e, "cannot store the session's title");
        }
        if let Some(memory) = memory
            && outcome.exit == crate::TurnExit::Completed
        {
            memory.sync(user_text, &outcome.answer, &session.id);
        }
        if let Some(hook) = self.turn_hook.get() {
            hook.turn_finished(session, &outcome);
        }
        Ok(outcome)
    }

    /// Compresses the session's transcript now (the `/compress` command),
    /// with the same summary pass a long turn would run. Returns whether
    /// anything was compressed (a short transcript has nothing to cut).
    pub async fn compress_session(&self, session: &SessionHandle) -> Result<bool, AgentError> {
        let _one_at_a_time = session.turn_lock.lock().await;
        let history = self
            .parts
            .store
            .messages(&session.id)
            .await?
            .into_iter()
            .map(|row| row.message)
            .collect();
        let observer = crate::observer::NullObserver;
        let mut run = TurnRun::new(
            &self.parts,
            session,
            &observer,
            CancellationToken::new(),
            history,
            self.parts.interaction.clone(),
        );
        let compressed = run.compress().await;
        // The summary call is paid for even when no turn follows.
        run.store_pending_calls().await;
        compressed
    }

    /// Drops the session's active transcript back to just before the `n`-th
    /// last user message (the `/undo` and `/retry` commands) and returns
    /// that message's text, so `/retry` can send it again.
    ///
    /// Returns `None`, changing nothing, when the session has fewer than `n`
    /// user messages (or `n` is 0). The summary left by compression is a
    /// user row but not something the user said, so it is not counted and
    /// never cut: rewinding cannot go back past it. Steering handed to a
    /// running turn is a user row inside that turn, so it does not count as
    /// a turn either. Fails with
    /// [`AgentError::Store`] when the session does not exist.
    ///
    /// The rows removed stay stored as inactive (and searchable), as after
    /// compression. Call it between turns: a turn running on the session
    /// would keep appending to the transcript it read before the cut.
    pub async fn rewind(&self, session_id: &str, n: usize) -> Result<Option<String>, AgentError> {
        let messages: Vec<Message> = self
            .parts
            .store
            .messages(session_id)
            .await?
            .into_iter()
            .map(|row| row.message)
            .collect();
        let user_positions: Vec<usize> = messages
            .iter()
            .enumerate()
            .filter(|(_, m)| {
                m.role == Role::User
                    && !m.content.starts_with(crate::compress::SUMMARY_HEADER)
                    && !m.content.starts_with(crate::turn::STEER_HEADER)
            })
            .map(|(i, _)| i)
            .collect();
        let Some(&cut) = user_positions
            .len()
            .checked_sub(n)
            .and_then(|i| user_positions.get(i))
        else {
            return Ok(None);
        };
        let text = messages[cut].content.clone();
        self.parts
            .store
            .replace_active(session_id, &messages[..cut])
            .await?;
        Ok(Some(text))
    }

    /// Builds the prompt off the async threads: it reads several files.
    async fn build_prompt(&self) -> Result<String, AgentError> {
        // What other nodes learned since this one last looked, so the new
        // session's memory and skills index are the deployment's.
        if let Some(files) = self.parts.store.shared_files()
            && let Err(e) = crate::shared_home::pull(&self.parts.home, files).await
        {
            tracing::warn!("the session starts with this node's memory and skills: {e}");
        }
        let home = self.parts.home.clone();
        let config = self.parts.config.clone();
        let registry = self.parts.registry.clone();
        let workdir = self.parts.workdir.clone();
        let provider_block = self
            .memory
            .get()
            .and_then(|m| m.provider())
            .and_then(|p| p.system_prompt_block())
            .filter(|b| !b.trim().is_empty());
        let prompt = tokio::task::spawn_blocking(move || {
            build_system_prompt(&PromptInputs {
                home: &home,
                config: &config,
                registry: &registry,
                workdir: &workdir,
                today: chrono::Local::now().date_naive(),
            })
        })
        .await
        .map_err(|e| AgentError::Prompt(e.to_string()))?;
        // The external memory provider's own words close the prompt.
        Ok(match provider_block {
            Some(block) => format!("{prompt}\n\n{}", block.trim()),
            None => prompt,
        })
    }
}

/// Longest automatic title, in characters.
const MAX_TITLE_CHARS: usize = 48;

/// A short title for a session from its first message: the first line
/// with text, spaces collapsed, cut at a word boundary with an ellipsis
/// when long. `None` for a message with nothing to show.
pub fn session_title(first_message: &str) -> Option<String> {
    let line = first_message.lines().find(|l| !l.trim().is_empty())?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut title = String::new();
    for word in &words {
        let extra = usize::from(!title.is_empty()) + word.chars().count();
        if title.chars().count() + extra > MAX_TITLE_CHARS {
            if title.is_empty() {
                // One very long word: cut inside it.
                title = word.chars().take(MAX_TITLE_CHARS - 1).collect();
            }
            title.push('…');
            return Some(title);
        }
        if !title.is_empty() {
            title.push(' ');
        }
        title.push_str(word);
    }
    let cut_lines = first_message.trim().lines().count() > 1;
    if cut_lines {
        title.push('…');
    }
    Some(title)
}

/// The session `/resume <wanted>` means in `list` (the front end's recent
/// sessions, newest first, as `/sessions` numbers them): by number, by id,
/// or by title ignoring case; with nothing wanted, the newest that is not
/// `current` and holds a conversation (`counts`, the active message count
/// of each session in `list`, is above zero: a session started and left
/// empty is no place to go back to). Shared by the REPL and the gateway so
/// `/resume` picks alike.
pub fn pick_session<'s>(
    list: &'s [SessionRecord],
    counts: &[u64],
    current: Option<&str>,
    wanted: &str,
) -> Option<&'s SessionRecord> {
    let wanted = wanted.trim();
    if wanted.is_empty() {
        return list
            .iter()
            .zip(counts)
            .find(|(s, count)| Some(s.id.as_str()) != current && **count > 0)
            .map(|(s, _)| s);
    }
    if let Ok(n) = wanted.parse::<usize>() {
        return n.checked_sub(1).and_then(|i| list.get(i));
    }
    let lower = wanted.to_lowercase();
    list.iter().find(|s| {
        s.id == wanted
            || s.title
                .as_deref()
                .is_some_and(|t| t.to_lowercase() == lower)
    })
}

#[cfg(test)]
mod title_tests {
    use super::session_title;

    #[test]
    fn titles_are_the_first_line_cut_at_a_word() {
        assert_eq!(
            session_title("  fix   the build \n").as_deref(),
            Some("fix the build")
        );
        assert_eq!(
            session_title("\n\nplan the trip\nwith details").as_deref(),
            Some("plan the trip…")
        );
        let long = "please write a function that parses the configuration file and reports errors";
        let title = session_title(long).unwrap();
        assert_eq!(title, "please write a function that parses the…");
        assert!(title.chars().count() <= 48);
        let word = "x".repeat(100);
        assert_eq!(session_title(&word).unwrap().chars().count(), 48);
        assert_eq!(session_title(" \n  "), None);
        assert_eq!(session_title("héllo wörld").as_deref(), Some("héllo wörld"));
    }
}

#[cfg(test)]
mod pick_tests {
    use super::*;

    fn record(id: &str, title: Option<&str>) -> SessionRecord {
        SessionRecord {
            id: id.to_owned(),
            source: "cli".to_owned(),
            title: title.map(str::to_owned),
            started_at: 1_700_000_000.0,
            message_count: 4,
            ..SessionRecord::default()
        }
    }

    #[test]
    fn resume_picks_by_number_id_title_or_the_newest_other() {
        let list = vec![
            record("s4", None),
            record("s3", None),
            record("s2", Some("Trip Plans")),
            record("s1", Some("Notes")),
        ];
        // s3 was started and left empty.
        let counts = [2, 0, 6, 4];
        let pick = |wanted| pick_session(&list, &counts, Some("s4"), wanted).map(|s| s.id.as_str());
        assert_eq!(pick(""), Some("s2"));
        assert_eq!(pick("4"), Some("s1"));
        assert_eq!(pick("2"), Some("s3"));
        assert_eq!(pick("0"), None);
        assert_eq!(pick("5"), None);
        assert_eq!(pick("s1"), Some("s1"));
        assert_eq!(pick("trip plans"), Some("s2"));
        assert_eq!(pick("nothing"), None);
        assert_eq!(pick_session(&list[..2], &counts, Some("s4"), ""), None);
        assert_eq!(
            pick_session(&list, &counts, None, "").map(|s| s.id.as_str()),
            Some("s4")
        );
    }
}
