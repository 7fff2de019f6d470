//! Work that outlives its turn in a chat (see [`crate::jobs`]): the
//! runner as the [`Reports`] the agent's tools report to, `/background`,
//! what `/status` lists, and what a stop or a restart says about jobs.

use std::sync::{Arc, Weak};
use std::time::Instant;

use async_trait::async_trait;
use talaria_agent::background::{JobKind, JobReport, JobStart, Reports, SessionWork};
use talaria_agent::interaction::NoHuman;
use talaria_agent::{NullObserver, TurnExit, TurnOptions};
use talaria_store::{NewOwedTurn, NewSession, OwedTurn};

use super::lane::Queued;
use super::{Inner, Runner};
use crate::event::MessageEvent;
use crate::jobs::{self, JobRecord, OpenJob};
use crate::key::SessionKey;

/// The runner as the agent's tools see it: reports go to the chat of the
/// session that opened the job. Holds the runner weakly: the agent's
/// tools hold this, and the runner holds the agent.
struct ChatReports {
    runner: Weak<Inner>,
}

impl ChatReports {
    fn runner(&self) -> Option<Runner> {
        self.runner.upgrade().map(|inner| Runner { inner })
    }
}

#[async_trait]
impl Reports for ChatReports {
    async fn opened(&self, job: &JobStart) -> Result<(), String> {
        let runner = self
            .runner()
            .ok_or_else(|| "the gateway is shutting down".to_owned())?;
        let (key, event) = runner.inner.jobs.chat_of(&job.session_id).ok_or_else(|| {
            "this conversation has no chat to report to (it is not a chat served by the gateway)"
                .to_owned()
        })?;
        runner.open_job(&key, &event, job).await
    }

    async fn progress(&self, job: &JobStart, text: &str) {
        let Some(runner) = self.runner() else {
            return;
        };
        if let Some(open) = runner.inner.jobs.get(&job.id) {
            let to = runner.inner.delivery.answer_address(&open.event);
            runner.inner.delivery.notify(&to, text).await;
        }
    }

    async fn closed(&self, job: &JobStart, report: JobReport) {
        if let Some(runner) = self.runner() {
            runner.close_job(&job.id, report).await;
        }
    }

    async fn dropped(&self, job: &JobStart) {
        if let Some(runner) = self.runner() {
            runner.inner.jobs.remove(&job.id);
            runner.settle(&[jobs::owed_id(&job.id)]).await;
        }
    }
}

impl Runner {
    /// Where the agent's tools report work that outlives its turn (bind it
    /// to their [`talaria_agent::background::ReportsSlot`]).
    pub fn reports(&self) -> Arc<dyn Reports> {
        Arc::new(ChatReports {
            runner: Arc::downgrade(&self.inner),
        })
    }

    /// Records `job` as owed to the chat of `event` (before it starts), and
    /// keeps it open on this node.
    async fn open_job(
        &self,
        key: &SessionKey,
        event: &MessageEvent,
        job: &JobStart,
    ) -> Result<(), String> {
        let inner = &self.inner;
        if inner.draining.load(std::sync::atomic::Ordering::SeqCst) {
            return Err("the gateway is shutting down".to_owned());
        }
        let record = JobRecord {
            id: job.id.clone(),
            kind: job.kind.as_str().to_owned(),
            title: job.title.clone(),
            event: event.clone(),
        };
        let payload = serde_json::to_string(&record).map_err(|e| e.to_string())?;
        let open = OpenJob {
            key: key.clone(),
            event: event.clone(),
            start: job.clone(),
            since: Instant::now(),
        };
        if !inner.jobs.insert(open) {
            return Err(format!(
                "too many background jobs are running on this gateway (at most {})",
                jobs::MAX_OPEN
            ));
        }
        let owed = NewOwedTurn {
            id: jobs::owed_id(&job.id),
            session_key: key.as_str().to_owned(),
            platform: event.source.platform.clone(),
            event: payload,
            owner: inner.node.clone(),
        };
        if let Err(e) = inner.store.accept_turn(None, owed).await {
            inner.jobs.remove(&job.id);
            tracing::warn!(job = %job.id, error = %e, "cannot record a background job");
            return Err(format!("its report could not be recorded ({e})"));
        }
        tracing::info!(job = %job.id, kind = job.kind.as_str(), key = %key, "background job opened");
        Ok(())
    }

    /// Delivers the report of job `id` once (the ledger records it and
    /// settles the job's obligation in one transaction), then, when the
    /// job asked for one and the configuration allows it, runs a turn on
    /// its result.
    async fn close_job(&self, id: &str, report: JobReport) {
        let inner = &self.inner;
        let owed = [jobs::owed_id(id)];
        let Some(open) = inner.jobs.remove(id) else {
            // Opened on no chat of this node: nothing to deliver to.
            self.settle(&owed).await;
            return;
        };
        let to = inner.delivery.answer_address(&open.event);
        let reference = format!("job:{id}");
        let _ = inner
            .delivery
            .deliver_reply_settling(
                open.key.as_str(),
                &reference,
                &to,
                &report.text,
                None,
                &owed,
            )
            .await;
        if inner.delivery.ledger().is_none() {
            self.settle(&owed).await;
        }
        tracing::info!(job = %id, "background job reported");
        if let Some(text) = report.follow_up
            && inner.config.gateway.background_follow_up
            && !inner.draining.load(std::sync::atomic::Ordering::SeqCst)
        {
            let mut event = open.event.clone();
            event.text = text;
            event.message_id = None;
            event.attachments.clear();
            self.submit(open.key.clone(), Queued::alone(event));
        }
    }

    /// Says what became of a job a dead node owed its chat: its work
    /// cannot be resumed, so it is reported lost (through the ledger, which
    /// settles the row in the same transaction).
    pub(super) async fn report_lost_job(&self, turn: OwedTurn) {
        let inner = &self.inner;
        let record: JobRecord = match serde_json::from_str(&turn.event) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(id = %turn.id, error = %e, "a background job's record cannot be read back; dropping it");
                self.settle(&[turn.id]).await;
                return;
            }
        };
        tracing::warn!(job = %record.id, "a background job's gateway stopped before it ended; telling its chat");
        let to = inner.delivery.answer_address(&record.event);
        let reference = format!("lost:{}", turn.id);
        let settles = [turn.id];
        let _ = inner
            .delivery
            .deliver_reply_settling(
                &turn.session_key,
                &reference,
                &to,
                &jobs::lost_notice(&record.kind, &record.title),
                None,
                &settles,
            )
            .await;
        if inner.delivery.ledger().is_none() {
            self.settle(&settles).await;
        }
    }

    /// Tells the chats of the jobs still open that the gateway stopped
    /// them, settling their obligations (a stop is not a crash: the news
    /// need not wait for the next start).
    pub(super) async fn report_stopped_jobs(&self) {
        let inner = &self.inner;
        let open = inner.jobs.drain_all();
        for job in open {
            let to = inner.delivery.answer_address(&job.event);
            let text = format!(
                "⏹ The gateway stopped, so your {} “{}” was stopped too. Run it again once I am back.",
                match job.start.kind {
                    JobKind::Process => "background command",
                    JobKind::Delegation => "delegated task",
                    JobKind::Prompt => "background task",
                },
                jobs::quote(&job.start.title)
            );
            let owed = [jobs::owed_id(&job.start.id)];
            let _ = inner
                .delivery
                .deliver_reply_settling(
                    job.key.as_str(),
                    &format!("stopped:{}", job.start.id),
                    &to,
                    &text,
                    None,
                    &owed,
                )
                .await;
            if inner.delivery.ledger().is_none() {
                self.settle(&owed).await;
            }
        }
    }

    /// `/background <prompt>`: runs `prompt` as a conversation of its own
    /// while the chat stays free; the answer is delivered when ready.
    pub(super) async fn start_background(
        &self,
        key: &SessionKey,
        event: &MessageEvent,
        prompt: &str,
    ) -> Result<String, String> {
        let inner = &self.inner;
        let id = talaria_core::ids::random_id("bg");
        let session = inner
            .agent
            .start_session(NewSession {
                source: event.source.platform.clone(),
                user_id: event.source.user_id.clone(),
                ..NewSession::default()
            })
            .await
            .map_err(|e| format!("cannot start its conversation: {e}"))?;
        let job = JobStart {
            id: id.clone(),
            session_id: session.id.clone(),
            kind: JobKind::Prompt,
            title: prompt.to_owned(),
        };
        self.open_job(key, event, &job).await?;
        let execution = talaria_agent::Execution::for_conversation(
            &inner.backends,
            self.trust_of(&event.source),
            crate::isolation::scope(
                inner.config.terminal.workspace_scope,
                key.as_str(),
                &session.id,
            ),
        )
        .await;
        let platform = event.source.platform.clone();
        let this = self.clone();
        let cancel = inner.background.child_token();
        let prompt = prompt.to_owned();
        inner.background_tasks.spawn(async move {
            let inner = &this.inner;
            let result = inner
                .agent
                .run_turn_with(
                    &session,
                    &prompt,
                    &NullObserver,
                    cancel,
                    TurnOptions {
                        // Nobody watches a background task: a command that
                        // needs approval is refused, never left waiting.
                        interaction: Some(Arc::new(NoHuman)),
                        execution: Some(execution),
                        platform: Some(platform),
                        ..TurnOptions::default()
                    },
                )
                .await;
            let text = match result {
                Ok(o) if matches!(o.exit, TurnExit::Completed | TurnExit::BudgetExhausted) => {
                    format!(
                        "🌙 Background task “{}” is done:\n\n{}",
                        jobs::quote(&prompt),
                        o.answer
                    )
                }
                // Stopped with the gateway: the stop reports it.
                Ok(o) if o.exit == TurnExit::Interrupted => return,
                Ok(o) => format!(
                    "⚠️ Background task “{}” failed: {}",
                    jobs::quote(&prompt),
                    match o.exit {
                        TurnExit::Failed(reason) => reason,
                        _ => "it ended without an answer".to_owned(),
                    }
                ),
                Err(e) => {
                    tracing::error!(job = %id, error = %e, "background task failed");
                    format!(
                        "⚠️ Background task “{}” failed (the database may be busy). Please try again.",
                        jobs::quote(&prompt)
                    )
                }
            };
            this.close_job(
                &id,
                JobReport {
                    text,
                    follow_up: None,
                },
            )
            .await;
        });
        Ok(format!(
            "🌙 Started in the background as {}. The chat stays free; I'll post the answer here when it's ready. /status lists what runs in the background.",
            job.id
        ))
    }

    /// Binds what ends the background commands of a reset session; a
    /// second call changes nothing.
    pub fn bind_session_work(&self, work: Arc<dyn SessionWork>) {
        let _ = self.inner.session_work.set(work);
    }

    /// The session `session_id` was reset: its background commands end,
    /// unless `terminal.background.kill_on_reset` is off.
    pub(super) fn end_session_work(&self, session_id: &str) {
        if !self.inner.config.terminal.background.kill_on_reset {
            return;
        }
        if let Some(work) = self.inner.session_work.get() {
            work.end_session(session_id);
        }
    }

    /// `/status` lines for what runs in the background for chat `key`:
    /// the jobs open for it and its sessions' background commands.
    pub(super) fn job_lines(&self, key: &SessionKey) -> Vec<String> {
        let inner = &self.inner;
        let open = inner.jobs.of_chat(key);
        let mut lines: Vec<String> = open
            .iter()
            .map(|j| {
                jobs::status_line(
                    &j.start.id,
                    j.start.kind.as_str(),
                    j.since.elapsed().as_secs(),
                    &j.start.title,
                )
            })
            .collect();
        if let Some(work) = inner.session_work.get() {
            for session in inner.jobs.sessions_of(key) {
                for (id, title, secs) in work.running(&session) {
                    // A command with a notice is listed as its job already.
                    if !open.iter().any(|j| j.start.id == id) {
                        lines.push(jobs::status_line(&id, "process", secs, &title));
                    }
                }
            }
        }
        if lines.is_empty() {
            return lines;
        }
        lines.insert(0, format!("In the background ({}):", lines.len()));
        lines
    }
}
