//! Slash commands in a chat: the chat as a [`FrontEnd`] of the shared
//! commands in [`crate::slash`]. What only a chat has lives here: the
//! session routed by the chat's key, the lane a command can stop, queue
//! behind or steer, approvals waiting in the chat, and the home channel.

use std::sync::Arc;

use async_trait::async_trait;
use talaria_agent::interaction::ApprovalDecision;
use talaria_agent::{Agent, SessionHandle};
use talaria_core::commands::{self, Availability};
use talaria_learning::Library;
use talaria_store::{SessionFilter, SessionRecord};

use super::Runner;
use super::lane::{Explicit, Queued};
use crate::delivery::Address;
use crate::event::MessageEvent;
use crate::hooks::events;
use crate::key::SessionKey;
use crate::slash::{self, FrontEnd, RECENT, Reply};

impl Runner {
    /// Answers the slash command `event` holds, without calling the model
    /// (unless the command runs a turn: `/retry`, `/learn`, a skill).
    pub(super) async fn command(&self, key: &SessionKey, event: &MessageEvent) {
        let Some(invocation) = event.command() else {
            return;
        };
        let inner = &self.inner;
        if let Some(def) = commands::resolve(invocation.name)
            && def.availability.offered_on(Availability::GatewayOnly)
        {
            inner.hooks.fire(&events::CommandRun {
                platform: &event.source.platform,
                command: def.name,
                args: invocation.args,
                session_key: key.as_str(),
            });
        }
        let mut chat = Chat {
            runner: self,
            key,
            event,
        };
        match slash::run(&mut chat, invocation).await {
            Reply::Say(text) | Reply::Refuse(text) => {
                inner
                    .delivery
                    .notify(&Address::reply_to(event), &text)
                    .await;
            }
            Reply::Turn(text) => {
                let mut turn = event.clone();
                turn.text = text;
                self.submit(key.clone(), Queued::alone(turn));
            }
            // `/exit` is not offered in chats.
            Reply::Done | Reply::Exit => {}
        }
    }
}

/// One chat, as the shared commands see it: the key's session and lane.
struct Chat<'a> {
    runner: &'a Runner,
    key: &'a SessionKey,
    /// The command's message: where answers go, and the sender a queued
    /// turn comes from.
    event: &'a MessageEvent,
}

impl Chat<'_> {
    /// The command's message with `text` in its place.
    fn follow_up(&self, text: &str) -> MessageEvent {
        let mut follow = self.event.clone();
        follow.text = text.to_owned();
        follow
    }
}

#[async_trait]
impl FrontEnd for Chat<'_> {
    fn surface(&self) -> Availability {
        Availability::GatewayOnly
    }

    fn agent(&self) -> &Agent {
        &self.runner.inner.agent
    }

    fn busy(&self) -> bool {
        self.runner
            .inner
            .lanes()
            .get(self.key)
            .is_some_and(|l| l.running())
    }

    async fn current(&self) -> Result<Option<SessionRecord>, String> {
        self.runner
            .inner
            .router
            .peek(self.key)
            .await
            .map_err(|e| e.to_string())
    }

    async fn open(&mut self) -> Result<SessionHandle, String> {
        let inner = &self.runner.inner;
        let routed = inner
            .router
            .current(self.key, &self.event.source)
            .await
            .map_err(|e| e.to_string())?;
        inner.session_hooks(self.key, &self.event.source, &routed);
        Ok(routed.handle)
    }

    async fn recent(&self) -> Result<Vec<SessionRecord>, String> {
        self.runner
            .inner
            .store
            .list_sessions(SessionFilter {
                session_key: Some(self.key.as_str().to_owned()),
                limit: RECENT,
                ..SessionFilter::default()
            })
            .await
            .map_err(|e| e.to_string())
    }

    async fn find(&self, id: &str) -> Option<SessionRecord> {
        // Only this chat's own sessions: an id must not open someone
        // else's conversation.
        let session = self.agent().parts().store.session(id).await.ok()??;
        (session.session_key.as_deref() == Some(self.key.as_str())).then_some(session)
    }

    async fn start_new(&mut self) -> Result<String, String> {
        let inner = &self.runner.inner;
        if let Some(lane) = inner.lanes().get_mut(self.key) {
            lane.stop(true);
        }
        let source = &self.event.source;
        let routed = inner
            .router
            .reset(self.key, source)
            .await
            .map_err(|e| e.to_string())?;
        inner.hooks.fire(&events::SessionReset {
            platform: &source.platform,
            session_key: self.key.as_str(),
            user_id: source.user_id.as_deref(),
            session_id: &routed.handle.id,
            previous_session_id: routed.previous.as_deref(),
        });
        inner.session_hooks(self.key, source, &routed);
        // A reset conversation starts without the old one's container (its
        // workspace's files stay).
        let scope = inner.config.terminal.workspace_scope;
        if let Some(previous) = &routed.previous {
            let old = crate::isolation::scope(scope, self.key.as_str(), previous);
            inner.backends.release(old).await;
            self.runner.end_session_work(previous);
        }
        Ok(routed.handle.id)
    }

    async fn switch_to(&mut self, id: &str) -> Result<(), String> {
        self.runner
            .inner
            .router
            .resume(self.key, id)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn stop(&mut self) -> bool {
        self.runner
            .inner
            .lanes()
            .get_mut(self.key)
            .is_some_and(|lane| lane.stop(false))
    }

    fn queue(&mut self, text: &str) -> Reply {
        let item = Queued::alone(self.follow_up(text));
        let queued = self
            .runner
            .inner
            .lanes()
            .entry(self.key.clone())
            .or_default()
            .queue_explicit(item);
        match queued {
            Explicit::Queued(1) => Reply::Say("Queued for the next turn.".to_owned()),
            Explicit::Queued(n) => Reply::Say(format!("Queued for the next turn ({n} queued).")),
            Explicit::Full => {
                Reply::Say("The queue is full; wait for the current turn.".to_owned())
            }
            Explicit::Idle(item) => {
                self.runner.submit(self.key.clone(), item);
                Reply::Done
            }
        }
    }

    fn steer(&mut self, text: &str) -> Reply {
        let steered = self
            .runner
            .inner
            .lanes()
            .get(self.key)
            .is_some_and(|l| l.steer(text));
        if steered {
            return Reply::Say(
                "⏩ The running task will see this after its current step.".to_owned(),
            );
        }
        // Nothing to steer: it is an ordinary message.
        self.runner.submit(
            self.key.clone(),
            Queued {
                event: self.follow_up(text),
                mergeable: true,
                owed: Vec::new(),
            },
        );
        Reply::Done
    }

    fn activity(&self) -> Vec<String> {
        let lanes = self.runner.inner.lanes();
        let line = match lanes
            .get(self.key)
            .and_then(|l| l.run.as_ref().map(|r| (r, l.queue.len())))
        {
            Some((run, queued)) => {
                let tool = run.tool.lock().unwrap_or_else(|p| p.into_inner()).clone();
                format!(
                    "Working for {}s{}{}",
                    run.started.elapsed().as_secs(),
                    tool.map(|t| format!(", running {t}")).unwrap_or_default(),
                    if queued > 0 {
                        format!(", {queued} queued")
                    } else {
                        String::new()
                    }
                )
            }
            None => "Idle".to_owned(),
        };
        vec![line]
    }

    fn status_extra(&self) -> Vec<String> {
        let inner = &self.runner.inner;
        let mut lines = Vec::new();
        let platforms = inner.board.snapshot();
        if !platforms.is_empty() {
            let list: Vec<String> = platforms
                .iter()
                .map(|(p, s)| format!("{p} {}", s.liveness))
                .collect();
            lines.push(format!("Platforms: {}", list.join(", ")));
        }
        lines.push(crate::isolation::describe(
            &inner.backends,
            self.runner.trust_of(&self.event.source),
        ));
        lines.extend(self.runner.job_lines(self.key));
        lines.push(format!("Gateway up {}s", inner.started.elapsed().as_secs()));
        lines
    }

    async fn background(&mut self, prompt: &str) -> Reply {
        match self
            .runner
            .start_background(self.key, self.event, prompt)
            .await
        {
            Ok(text) => Reply::Say(text),
            Err(e) => Reply::Refuse(format!("⚠️ Cannot run that in the background: {e}")),
        }
    }

    fn whoami(&self) -> String {
        let s = &self.event.source;
        format!(
            "Platform: {}\nChat: {} ({})\nYour id: {}\nName: {}\nConversation key: {}",
            s.platform,
            s.chat_id,
            s.chat_type,
            s.user_id.as_deref().unwrap_or("(anonymous)"),
            s.user_name.as_deref().unwrap_or("(unknown)"),
            self.key
        )
    }

    fn skills(&self) -> Arc<Library> {
        // Read afresh: a skill written since the last command is listed.
        Arc::new(Library::new(&self.runner.inner.home))
    }

    fn answer_approval(&mut self, decision: ApprovalDecision) -> bool {
        self.runner
            .inner
            .lanes()
            .get_mut(self.key)
            .is_some_and(|lane| lane.answer_approval(decision))
    }

    fn set_home(&mut self) -> Reply {
        let inner = &self.runner.inner;
        let s = &self.event.source;
        let var = |suffix| talaria_core::config::platform_var(&s.platform, suffix);
        let vars = vec![
            (var("HOME_CHANNEL"), s.chat_id.clone()),
            (
                var("HOME_CHANNEL_THREAD_ID"),
                s.thread_id.clone().unwrap_or_default(),
            ),
        ];
        match crate::dotenv::upsert(&inner.home.dotenv_file(), &vars) {
            Ok(()) => {
                // Live at once: `send_message` and `talaria send` to the
                // bare platform go here from now on, without a restart.
                inner.delivery.homes().set(
                    &s.platform,
                    crate::target::HomeChannel {
                        chat_id: s.chat_id.clone(),
                        thread_id: s.thread_id.clone(),
                    },
                );
                Reply::Say(format!(
                    "🏠 This chat is now the home channel for {}.",
                    s.platform
                ))
            }
            Err(e) => Reply::Refuse(format!("⚠️ Cannot save the home channel: {e}")),
        }
    }
}
