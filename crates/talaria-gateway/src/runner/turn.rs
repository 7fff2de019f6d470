//! Driving a lane: each turn routed, run with a typing indicator and a
//! streaming preview, its answer delivered (through the ledger when it is
//! on) and its owed turns settled; with a shared store, the session's turn
//! lease held meanwhile.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use talaria_agent::interaction::Interaction;
use talaria_agent::{TurnExit, TurnObserver, TurnOptions};
use talaria_core::MediaRef;
use talaria_core::config::BusyInputMode;
use tokio_util::sync::CancellationToken;

use super::interaction::ChatInteraction;
use super::lane::{Ack, Next, Queued, RunEnd, Submitted};
use super::{Runner, prompt_text};
use crate::delivery::Address;
use crate::event::MessageEvent;
use crate::hooks::events;
use crate::key::SessionKey;
use crate::ledger::ReplyTo;
use crate::preview::{Preview, PreviewSink};
use crate::router::AutoReset;
use crate::turn_lease::{HeldTurn, Taken};

/// In interrupt mode, after a turn was superseded, the next one waits
/// until no new message arrived for this long, so a burst of messages
/// becomes one turn instead of one interrupted model call each.
const COALESCE_QUIET: Duration = Duration::from_millis(400);

/// The longest a superseding turn waits for a burst to end.
const COALESCE_MAX: Duration = Duration::from_secs(3);

impl Runner {
    /// Starts a turn for `item`, or applies the busy mode when one runs.
    pub(super) fn submit(&self, key: SessionKey, item: Queued) {
        let inner = &self.inner;
        let to = Address::reply_to(&item.event);
        let submitted =
            inner
                .lanes()
                .entry(key.clone())
                .or_default()
                .submit(item, inner.busy_mode(), || inner.next_generation());
        let (ack, dropped) = match submitted {
            Submitted::Start {
                item,
                generation,
                cancel,
            } => {
                inner.board.touch();
                let this = self.clone();
                inner
                    .tasks
                    .spawn(async move { this.drive(key, item, generation, cancel).await });
                return;
            }
            Submitted::Busy { ack, dropped } => (ack, dropped),
        };
        if let Some(ack) = ack {
            inner.acknowledge(&key, to, ack);
        }
        if let Some(item) = dropped {
            // Said, and settled: a message nobody will answer must not wait
            // in the store to be run after a restart either.
            let this = self.clone();
            tokio::spawn(async move {
                let to = Address::reply_to(&item.event);
                this.inner
                    .delivery
                    .notify(&to, "⚠️ Too many messages are waiting for this chat; this one was dropped. Send it again once I have answered.")
                    .await;
                this.settle(&item.owed).await;
            });
        }
    }

    /// Forgets owed turns that are over (answered without the outbox,
    /// failed and said so, stopped by the user).
    pub(super) async fn settle(&self, owed: &[String]) {
        if owed.is_empty() {
            return;
        }
        if let Err(e) = self.inner.store.settle_turns(owed).await {
            tracing::warn!(error = %e, "cannot mark answered messages; a restart may run them again");
        }
    }

    /// Runs a lane's turns until its queue is empty.
    async fn drive(
        &self,
        key: SessionKey,
        first: Queued,
        generation: u64,
        cancel: CancellationToken,
    ) {
        let inner = &self.inner;
        let mut next = Some((first, generation, cancel));
        while let Some((item, generation, cancel)) = next.take() {
            let Queued {
                event, mut owed, ..
            } = item;
            if let Some(lane) = inner.lanes().get_mut(&key) {
                owed.append(&mut lane.take_carried());
            }
            let end = match self
                .take_turn_lease(&key, &event, generation, &cancel)
                .await
            {
                Some(held) => {
                    let end = self.run_one(&key, event, generation, cancel, &owed).await;
                    drop(held);
                    end
                }
                None => {
                    tracing::info!(key = %key, "stopped while waiting for another node's turn");
                    RunEnd::Superseded
                }
            };
            let ended = {
                let mut lanes = inner.lanes();
                let Some(lane) = lanes.get_mut(&key) else {
                    break;
                };
                let draining = inner.draining.load(Ordering::SeqCst);
                lane.ended(end, owed, draining, inner.busy_mode())
            };
            self.settle(&ended.settle).await;
            if ended.coalesce {
                self.await_quiet(&key).await;
            }
            let leftover = {
                let mut lanes = inner.lanes();
                let Some(lane) = lanes.get_mut(&key) else {
                    break;
                };
                let draining = inner.draining.load(Ordering::SeqCst);
                match lane.next(draining, || inner.next_generation()) {
                    Next::Run {
                        item,
                        generation,
                        cancel,
                    } => {
                        inner.board.touch();
                        next = Some((item, generation, cancel));
                        Vec::new()
                    }
                    Next::Idle { leftover, forget } => {
                        inner.board.touch();
                        if forget {
                            lanes.remove(&key);
                        }
                        leftover
                    }
                }
            };
            // Carried turns with no turn left to answer them: a steered
            // message its turn already saw.
            self.settle(&leftover).await;
        }
    }

    /// Waits, while messages keep arriving for `key`, until none came for
    /// [`COALESCE_QUIET`] (at most [`COALESCE_MAX`]): the superseded run
    /// stays in place meanwhile, so what arrives is queued (and merged)
    /// rather than starting and interrupting a turn each.
    async fn await_quiet(&self, key: &SessionKey) {
        let started = Instant::now();
        loop {
            let seen = match self.inner.lanes().get(key) {
                Some(lane) => lane.arrivals,
                None => return,
            };
            tokio::time::sleep(COALESCE_QUIET).await;
            let quiet = self
                .inner
                .lanes()
                .get(key)
                .is_none_or(|lane| lane.arrivals == seen);
            if quiet
                || started.elapsed() >= COALESCE_MAX
                || self.inner.draining.load(Ordering::SeqCst)
            {
                return;
            }
        }
    }

    /// With a shared store, takes the session's turn lease, waiting while
    /// another node runs a turn of it (telling the user once, as the busy
    /// mode says). The run is interrupted, its answer dropped, if the
    /// lease is lost, or, in interrupt mode, when another node waits.
    /// `None` when the run was stopped while waiting; `Some(None)` on one
    /// node.
    async fn take_turn_lease(
        &self,
        key: &SessionKey,
        event: &MessageEvent,
        generation: u64,
        cancel: &CancellationToken,
    ) -> Option<Option<HeldTurn>> {
        let inner = &self.inner;
        let Some(leases) = &inner.turn_leases else {
            return Some(None);
        };
        let mode = inner.busy_mode();
        let on_wait = || inner.acknowledge(key, Address::reply_to(event), Ack::waiting(mode));
        let held = match leases
            .take(
                key.as_str(),
                cancel,
                mode == BusyInputMode::Interrupt,
                on_wait,
            )
            .await
        {
            Taken::Held(held) => held,
            Taken::Cancelled => return None,
        };
        let (runner, key, interrupted, cancel) = (
            self.clone(),
            key.clone(),
            held.interrupted.clone(),
            cancel.clone(),
        );
        tokio::spawn(async move {
            tokio::select! {
                _ = interrupted.cancelled() => {
                    if let Some(lane) = runner.inner.lanes().get_mut(&key) {
                        lane.interrupt_generation(generation);
                    }
                }
                _ = cancel.cancelled() => {}
            }
        });
        Some(Some(held))
    }

    /// One turn: route, run the agent with a typing indicator, deliver.
    /// `owed` are the owed turns its answer settles.
    async fn run_one(
        &self,
        key: &SessionKey,
        event: MessageEvent,
        generation: u64,
        cancel: CancellationToken,
        owed: &[String],
    ) -> RunEnd {
        let inner = &self.inner;
        let to = inner.delivery.answer_address(&event);
        let routed = match inner.router.current(key, &event.source).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(key = %key, error = %e, "cannot open the session");
                inner
                    .delivery
                    .notify(&to, "⚠️ I could not open this conversation's history (the database may be busy). Please try again in a moment.")
                    .await;
                self.settle(owed).await;
                return RunEnd::Done;
            }
        };
        inner.session_hooks(key, &event.source, &routed);
        let handle = routed.handle;
        // Background work this turn's tools start reports to this chat.
        inner.jobs.remember(&handle.id, key, &event);
        let tool = {
            let mut lanes = inner.lanes();
            match lanes.get_mut(key).and_then(|l| l.run_of(generation)) {
                Some(run) => {
                    run.state = Some(handle.state.clone());
                    run.tool.clone()
                }
                None => Arc::new(Mutex::new(None)),
            }
        };
        let workspace_scope = inner.config.terminal.workspace_scope;
        if routed.auto_reset.is_some()
            && let Some(previous) = &routed.previous
        {
            let old = crate::isolation::scope(workspace_scope, key.as_str(), previous);
            inner.backends.release(old).await;
        }
        let execution = talaria_agent::Execution::for_conversation(
            &inner.backends,
            self.trust_of(&event.source),
            crate::isolation::scope(workspace_scope, key.as_str(), &handle.id),
        )
        .await;
        if let Some(reason) = routed.auto_reset {
            let why = match reason {
                AutoReset::Idle => "after a period of inactivity",
                AutoReset::Daily => "for the daily reset",
            };
            let text = format!(
                "◐ Started a new conversation {why}. The previous one is kept: /sessions lists it and /resume brings it back."
            );
            inner.delivery.notify(&to, &text).await;
        }

        let typing = self.typing_indicator(&event);
        let interaction: Arc<dyn Interaction> = Arc::new(ChatInteraction {
            runner: self.clone(),
            key: key.clone(),
            to: to.clone(),
        });
        let preview = inner
            .delivery
            .adapter(&event.source.platform)
            .filter(|a| a.streaming_edits())
            .map(|a| {
                let interval = inner.config.gateway.stream_edit_interval_ms.max(100);
                Preview::start(a.clone(), to.clone(), Duration::from_millis(interval))
            });
        let mut observer = RunObserver {
            tool,
            preview: preview.as_ref().map(Preview::sink),
            progress: self.progress_lines(&to),
        };
        let (text, media, voice_in) = self.take_in(&event, &to).await;
        let message_ref = event.message_id.clone().unwrap_or_default();
        // With the ledger on, the answer and its obligation are stored in
        // one transaction.
        let outbox = inner.delivery.ledger().map(|ledger| {
            ledger.outbox(ReplyTo {
                session_key: key.as_str().to_owned(),
                message_ref: message_ref.clone(),
                platform: to.platform.clone(),
                chat_id: to.chat_id.clone(),
                thread_id: to.thread_id.clone(),
                reply_to: to.reply_to.clone(),
                settles: owed.to_vec(),
            })
        });
        inner.hooks.fire(&events::AgentStart {
            platform: &event.source.platform,
            session_key: key.as_str(),
            session_id: &handle.id,
            message: &event.text,
        });
        tracing::debug!(key = %key, session = %handle.id, "turn starting");
        let result = inner
            .agent
            .run_turn_with(
                &handle,
                &text,
                &observer,
                cancel,
                TurnOptions {
                    interaction: Some(interaction),
                    outbox,
                    media,
                    execution: Some(execution),
                    platform: Some(event.source.platform.clone()),
                    ..TurnOptions::default()
                },
            )
            .await;
        typing.cancel();
        observer.flush_progress().await;

        // Steering that arrived too late for the turn becomes the next one.
        let leftover = handle.state.take_steer();
        let discard = match inner.lanes().get_mut(key) {
            Some(lane) => lane.turn_over(generation, &event, leftover),
            None => true,
        };
        let exit = match &result {
            _ if discard => "interrupted",
            Ok(o) => match o.exit {
                TurnExit::Completed => "completed",
                TurnExit::BudgetExhausted => "budget_exhausted",
                TurnExit::Interrupted => "interrupted",
                TurnExit::Failed(_) => "failed",
            },
            Err(_) => "failed",
        };
        inner.hooks.fire(&events::AgentEnd {
            platform: &event.source.platform,
            session_key: key.as_str(),
            session_id: &handle.id,
            exit,
            response: result.as_ref().map_or("", |o| o.answer.as_str()),
        });
        let answered = !discard
            && matches!(&result, Ok(o) if matches!(o.exit, TurnExit::Completed | TurnExit::BudgetExhausted));
        let preview_id = match preview {
            Some(p) if answered => p.finish().await,
            Some(p) => {
                p.abandon("⏹ Stopped before the answer was complete.").await;
                None
            }
            None => None,
        };
        if discard {
            tracing::info!(key = %key, "a superseded turn finished; its answer is dropped");
            return RunEnd::Superseded;
        }
        match result {
            Ok(outcome) => match outcome.exit {
                TurnExit::Completed | TurnExit::BudgetExhausted => {
                    if !outcome.owed {
                        // No outbox stored the answer (the ledger is off):
                        // it is settled here, as it goes out.
                        self.settle(owed).await;
                    }
                    let delivered = if outcome.owed {
                        inner
                            .delivery
                            .deliver_owed_reply(
                                key.as_str(),
                                &message_ref,
                                &to,
                                &outcome.answer,
                                preview_id.as_deref(),
                            )
                            .await
                    } else {
                        inner
                            .delivery
                            .deliver_reply(
                                key.as_str(),
                                &message_ref,
                                &to,
                                &outcome.answer,
                                preview_id.as_deref(),
                            )
                            .await
                    }
                    .is_ok();
                    tracing::debug!(
                        key = %key,
                        platform = %to.platform,
                        chars = outcome.answer.chars().count(),
                        "{}",
                        if delivered {
                            "answer delivered"
                        } else {
                            "answer not delivered"
                        }
                    );
                    inner.board.touch();
                    if delivered && inner.media.speaks(voice_in) {
                        self.speak(key, &message_ref, &to, &outcome.answer).await;
                    }
                    if delivered {
                        inner.hooks.fire(&events::MessageSent {
                            platform: &to.platform,
                            session_key: key.as_str(),
                            chars: outcome.answer.chars().count(),
                        });
                    }
                }
                TurnExit::Interrupted => return RunEnd::Superseded,
                TurnExit::Failed(reason) => {
                    let text = format!(
                        "⚠️ The model could not answer: {reason}\nYour message is saved; send it again or try /retry."
                    );
                    inner.delivery.notify(&to, &text).await;
                    self.settle(owed).await;
                }
            },
            Err(e) => {
                tracing::error!(key = %key, error = %e, "turn failed");
                inner
                    .delivery
                    .notify(&to, "⚠️ Something went wrong while working on that (the database may be busy). Please try again.")
                    .await;
                self.settle(owed).await;
            }
        }
        RunEnd::Done
    }

    /// The user row of a turn: the prompt text with what the message's
    /// files gave, the images for a model that sees them, and whether a
    /// voice note came in. What could not be taken (a file too large, a
    /// failed transcription) and, when asked for, the transcript are said
    /// in the chat first.
    async fn take_in(&self, event: &MessageEvent, to: &Address) -> (String, Vec<MediaRef>, bool) {
        let text = prompt_text(event);
        if event.attachments.is_empty() {
            return (text, Vec::new(), false);
        }
        let inner = &self.inner;
        let adapter = inner.delivery.adapter(&event.source.platform);
        let received = crate::media::receive(adapter, &event.attachments, &inner.media.cache).await;
        let digest = talaria_agent::attach::digest(received, &inner.media.attach_context()).await;
        for notice in &digest.notices {
            inner.delivery.notify(to, notice).await;
        }
        if inner.media.echo_transcript {
            for heard in &digest.transcripts {
                inner.delivery.notify(to, &format!("🎤 “{heard}”")).await;
            }
        }
        (digest.message_text(&text), digest.media, digest.voice)
    }

    /// Speaks an answer (`tts.voice_reply`) and sends it as a voice note,
    /// owed through the ledger like the answer itself. A failure is said
    /// in the chat: the written answer is already there.
    async fn speak(&self, key: &SessionKey, message_ref: &str, to: &Address, answer: &str) {
        let inner = &self.inner;
        let Some(tts) = &inner.media.synthesizer else {
            return;
        };
        let words = crate::parts::spoken_text(answer);
        if words.is_empty() {
            return;
        }
        match tts.speak(&words, &inner.media.cache).await {
            Ok(speech) => {
                let line = format!(
                    "{}{}",
                    crate::parts::MEDIA_PREFIX,
                    speech.stored.path.display()
                );
                let voice_ref = format!("{message_ref}#voice");
                if let Err(e) = inner
                    .delivery
                    .deliver_reply(key.as_str(), &voice_ref, to, &line, None)
                    .await
                {
                    tracing::warn!(error = %e, "could not send the spoken answer");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not speak an answer");
                inner
                    .delivery
                    .notify(to, &format!("⚠️ I could not speak this answer: {e}."))
                    .await;
            }
        }
    }

    /// Sends "typing…" every few seconds until the returned token fires.
    fn typing_indicator(&self, event: &MessageEvent) -> CancellationToken {
        let stop = CancellationToken::new();
        let Some(adapter) = self.inner.delivery.adapter(&event.source.platform).cloned() else {
            return stop;
        };
        let interval = Duration::from_secs(self.inner.config.gateway.typing_interval_secs.max(1));
        let chat = event.source.chat_id.clone();
        let thread = event.source.thread_id.clone();
        let token = stop.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = adapter.typing(&chat, thread.as_deref()).await {
                    tracing::debug!(error = %e, "typing indicator failed");
                }
                tokio::select! {
                    _ = token.cancelled() => break,
                    _ = tokio::time::sleep(interval) => {}
                }
            }
        });
        stop
    }
}

/// Tracks the running tool for `/status`, feeds the streaming preview
/// when there is one, and passes progress lines to the chat when
/// `display.tool_progress` asks for them.
struct RunObserver {
    tool: Arc<Mutex<Option<String>>>,
    preview: Option<PreviewSink>,
    progress: Option<ProgressLines>,
}

/// Progress lines on their way to a chat: grouped, so a busy subagent
/// makes one message every few seconds rather than one per step.
struct ProgressLines {
    tx: tokio::sync::mpsc::Sender<String>,
    /// Sends the grouped lines; ends once `tx` is gone and the rest sent.
    sender: tokio::task::JoinHandle<()>,
    /// `new`: the tool of the last line sent, to skip repeats.
    only_new: bool,
    last: Mutex<Option<String>>,
}

/// Lines gathered into one message at most this often.
const PROGRESS_EVERY: Duration = Duration::from_secs(3);

/// Lines one message holds at most; more are counted, not shown.
const PROGRESS_MAX_LINES: usize = 12;

impl Runner {
    /// Where this turn's progress lines go, when the chat is shown any.
    fn progress_lines(&self, to: &Address) -> Option<ProgressLines> {
        use talaria_core::config::ToolProgress;
        let mode = self.inner.config.display.tool_progress;
        if mode == ToolProgress::Off {
            return None;
        }
        let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(64);
        let delivery = self.inner.delivery.clone();
        let to = to.clone();
        // Ends when the turn is over (the sender is dropped), after sending
        // what is left.
        let sender = tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut lines = vec![first];
                let mut more = 0usize;
                let window = tokio::time::sleep(PROGRESS_EVERY);
                tokio::pin!(window);
                loop {
                    tokio::select! {
                        _ = &mut window => break,
                        line = rx.recv() => match line {
                            Some(line) if lines.len() < PROGRESS_MAX_LINES => lines.push(line),
                            Some(_) => more += 1,
                            None => break,
                        },
                    }
                }
                if more > 0 {
                    lines.push(format!("(+{more} more)"));
                }
                delivery.notify(&to, &lines.join("\n")).await;
            }
        });
        Some(ProgressLines {
            tx,
            sender,
            only_new: mode == ToolProgress::New,
            last: Mutex::new(None),
        })
    }
}

impl RunObserver {
    /// The turn is over: the progress lines still waiting go out now,
    /// before the answer (bounded: a stuck platform does not hold the
    /// answer back for long).
    async fn flush_progress(&mut self) {
        if let Some(ProgressLines { tx, sender, .. }) = self.progress.take() {
            drop(tx);
            let _ = tokio::time::timeout(Duration::from_secs(5), sender).await;
        }
    }
}

impl TurnObserver for RunObserver {
    fn text(&self, delta: &str) {
        if let Some(p) = &self.preview {
            p.push(delta);
        }
    }

    fn text_restarted(&self) {
        if let Some(p) = &self.preview {
            p.clear();
        }
    }

    fn tool_started(&self, name: &str, _args: &str) {
        *self.tool.lock().unwrap_or_else(|p| p.into_inner()) = Some(name.to_owned());
        if let Some(p) = &self.preview {
            p.replace_on_next();
        }
    }

    fn tool_finished(&self, _name: &str, _ok: bool, _preview: &str) {
        *self.tool.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn progress(&self, line: &str) {
        let Some(progress) = &self.progress else {
            return;
        };
        if progress.only_new {
            // The tool is the line's first word after its marker.
            let tool: String = line
                .split_whitespace()
                .find(|w| w.ends_with(':'))
                .unwrap_or(line)
                .to_owned();
            let mut last = progress.last.lock().unwrap_or_else(|p| p.into_inner());
            if last.as_deref() == Some(tool.as_str()) {
                return;
            }
            *last = Some(tool);
        }
        let _ = progress.tx.try_send(line.to_owned());
    }
}
