//! The busy guard as a state machine: one [`Lane`] per session key, the
//! turn it runs and what waits behind it.
//!
//! A lane runs at most one turn at a time (its `run`); what arrives
//! meanwhile is steered into the run, queued behind it or interrupts it, as
//! the [`BusyInputMode`] says. A run that was interrupted, stopped or reset
//! is marked `discard` and its late result is dropped, but the lane stays
//! busy until that run has actually unwound, so two turns never touch one
//! transcript at once. Lanes of different keys run concurrently.
//!
//! Nothing here waits, sends or spawns: every transition is a plain method
//! that says what the runner has to do next (start a driver, acknowledge,
//! settle owed turns), so the whole guard is tested without a runtime.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use talaria_agent::interaction::ApprovalDecision;
use talaria_agent::tools::SessionState;
use talaria_core::config::BusyInputMode;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::event::MessageEvent;

/// Follow-ups waiting behind a busy turn; more are dropped (and logged):
/// a flood must not grow memory without bound.
pub(super) const MAX_QUEUED: usize = 32;

/// One session key's state in this process.
#[derive(Default)]
pub(super) struct Lane {
    /// The turn running now, if any.
    pub(super) run: Option<Run>,
    /// Messages waiting for their turn, oldest first.
    pub(super) queue: VecDeque<Queued>,
    /// Owed turns whose message is already in the transcript and will be
    /// answered by the lane's next turn: a superseded run's, a steered
    /// message's. The next run settles them with its answer.
    pub(super) carried: Vec<String>,
    /// Messages handed to the lane so far: how a superseding turn tells
    /// that a burst is still arriving.
    pub(super) arrivals: u64,
    /// A dangerous command waiting for `/approve` or `/deny`.
    pub(super) approval: Option<oneshot::Sender<ApprovalDecision>>,
    /// A clarifying question waiting for the next plain message.
    pub(super) clarify: Option<oneshot::Sender<String>>,
}

/// The turn a lane is running.
pub(super) struct Run {
    /// Tells this run from the ones before and after it on the lane.
    pub(super) generation: u64,
    /// Fired to interrupt it.
    pub(super) cancel: CancellationToken,
    /// When it started, for `/status`.
    pub(super) started: Instant,
    /// Its result must not be delivered (interrupted, stopped, reset).
    pub(super) discard: bool,
    /// The session's state once routed, for steering.
    pub(super) state: Option<Arc<SessionState>>,
    /// The tool running now, for `/status`.
    pub(super) tool: Arc<Mutex<Option<String>>>,
}

/// How a run ended, for what becomes of the turns it owed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RunEnd {
    /// Answered, or failed and said so: its owed turns are settled.
    Done,
    /// Stopped before an answer (superseded, stopped, shutting down).
    Superseded,
}

/// A message waiting for its turn.
#[derive(Debug)]
pub(super) struct Queued {
    /// The message, as the turn will see it.
    pub(super) event: MessageEvent,
    /// Plain follow-ups in queue mode merge into one turn; `/queue` items
    /// are each their own.
    pub(super) mergeable: bool,
    /// The owed turns its answer settles (one per merged message).
    pub(super) owed: Vec<String>,
}

impl Queued {
    /// A turn of its own that settles nothing: `/queue`, `/retry`, a
    /// skill's or `/learn`'s prompt.
    pub(super) fn alone(event: MessageEvent) -> Queued {
        Queued {
            event,
            mergeable: false,
            owed: Vec::new(),
        }
    }
}

/// What a user whose message met a busy lane is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ack {
    /// Steer mode: the running turn will read it.
    Steered,
    /// Queue mode (and steer mode with nothing to steer): it waits.
    Queued,
    /// Interrupt mode: the running turn stops for it.
    Interrupting,
}

impl Ack {
    /// The acknowledgement in the busy mode's words.
    pub(super) fn text(self) -> &'static str {
        match self {
            Ack::Steered => {
                "⏩ Passed your message to the running task; it will see it after its current step."
            }
            Ack::Queued => {
                "⏳ Still working on your previous message; this one is queued for the next turn."
            }
            Ack::Interrupting => "⚡ Interrupting the current task to answer your new message.",
        }
    }

    /// What a turn waiting for another node's turn of the same session is
    /// told: the busy mode's words, as if the other turn ran here.
    pub(super) fn waiting(mode: BusyInputMode) -> Ack {
        match mode {
            BusyInputMode::Interrupt => Ack::Interrupting,
            BusyInputMode::Queue | BusyInputMode::Steer => Ack::Queued,
        }
    }
}

/// What became of a message handed to a lane.
#[derive(Debug)]
// Returned once and taken apart at once: boxing the message would only
// add an allocation per turn.
#[allow(clippy::large_enum_variant)]
pub(super) enum Submitted {
    /// The lane was idle and now runs `item`: start its driver.
    Start {
        item: Queued,
        generation: u64,
        cancel: CancellationToken,
    },
    /// The lane was busy: the message was steered, queued, or interrupts
    /// the run. `ack` is what to tell the user (cooldown permitting);
    /// `dropped` is a message the full queue turned away.
    Busy {
        ack: Option<Ack>,
        dropped: Option<Queued>,
    },
}

/// What becomes of the owed turns of a run that just ended.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Ended {
    /// Owed turns nothing will answer: settle them.
    pub(super) settle: Vec<String>,
    /// Interrupt mode superseded the run: wait for the burst to end before
    /// the next turn.
    pub(super) coalesce: bool,
}

/// What the lane's driver does after a run.
#[derive(Debug)]
// Returned once and taken apart at once: boxing the message would only
// add an allocation per turn.
#[allow(clippy::large_enum_variant)]
pub(super) enum Next {
    /// Run the next queued message.
    Run {
        item: Queued,
        generation: u64,
        cancel: CancellationToken,
    },
    /// Nothing is queued: the lane is idle. `leftover` are carried turns
    /// nothing will answer (settle them); `forget` says the lane holds
    /// nothing more and can go.
    Idle { leftover: Vec<String>, forget: bool },
}

/// `/queue` on a lane.
#[derive(Debug)]
// Returned once and taken apart at once, like `Submitted`.
#[allow(clippy::large_enum_variant)]
pub(super) enum Explicit {
    /// Queued behind the running turn: this many wait now.
    Queued(usize),
    /// The queue is full; nothing was queued.
    Full,
    /// Nothing runs: submit it.
    Idle(Queued),
}

impl Lane {
    /// Whether a turn runs that has not been told to stop.
    pub(super) fn running(&self) -> bool {
        self.run.as_ref().is_some_and(|r| !r.discard)
    }

    /// Installs a new run under `generation`; returns its token.
    pub(super) fn start(&mut self, generation: u64) -> CancellationToken {
        let cancel = CancellationToken::new();
        self.run = Some(Run {
            generation,
            cancel: cancel.clone(),
            started: Instant::now(),
            discard: false,
            state: None,
            tool: Arc::new(Mutex::new(None)),
        });
        cancel
    }

    /// Hands a message to the lane: it starts a run when idle, otherwise
    /// the busy mode decides. `generation` names the run if one starts.
    pub(super) fn submit(
        &mut self,
        item: Queued,
        mode: BusyInputMode,
        generation: impl FnOnce() -> u64,
    ) -> Submitted {
        self.arrivals += 1;
        let Some(run) = &mut self.run else {
            let generation = generation();
            let cancel = self.start(generation);
            return Submitted::Start {
                item,
                generation,
                cancel,
            };
        };
        let already_stopping = run.discard;
        let mut dropped = None;
        let ack = match mode {
            BusyInputMode::Steer if run.state.is_some() && item.mergeable => {
                if let Some(state) = &run.state {
                    state.push_steer(&item.event.text);
                }
                // The running turn (or, if it ends first, the next one)
                // answers it.
                self.carried.extend(item.owed);
                Some(Ack::Steered)
            }
            BusyInputMode::Queue | BusyInputMode::Steer => {
                dropped = self.enqueue(item);
                Some(Ack::Queued)
            }
            BusyInputMode::Interrupt => {
                dropped = self.enqueue(item);
                self.interrupt();
                (!already_stopping).then_some(Ack::Interrupting)
            }
        };
        Submitted::Busy { ack, dropped }
    }

    /// Adds a follow-up to the queue: merged into the last waiting message
    /// from the same sender when both allow it (queue mode's "one next
    /// turn"), otherwise appended; handed back when the queue is full.
    fn enqueue(&mut self, item: Queued) -> Option<Queued> {
        if let Some(last) = self.queue.back_mut()
            && last.mergeable
            && item.mergeable
            && last.event.source.user_id == item.event.source.user_id
        {
            last.event.text.push('\n');
            last.event.text.push_str(&item.event.text);
            last.event.attachments.extend(item.event.attachments);
            last.event.message_id = item.event.message_id.or(last.event.message_id.take());
            last.owed.extend(item.owed);
            return None;
        }
        if self.queue.len() >= MAX_QUEUED {
            tracing::warn!("follow-up queue full; message dropped");
            return Some(item);
        }
        self.queue.push_back(item);
        None
    }

    /// `/queue`: behind the running turn, each item its own turn.
    pub(super) fn queue_explicit(&mut self, item: Queued) -> Explicit {
        if self.run.is_none() {
            return Explicit::Idle(item);
        }
        if self.queue.len() >= MAX_QUEUED {
            return Explicit::Full;
        }
        self.queue.push_back(item);
        Explicit::Queued(self.queue.len())
    }

    /// `/steer`: hands `text` to the running turn; `false` when none runs
    /// that could take it.
    pub(super) fn steer(&self, text: &str) -> bool {
        match self
            .run
            .as_ref()
            .filter(|r| !r.discard)
            .and_then(|r| r.state.as_ref())
        {
            Some(state) => {
                state.push_steer(text);
                true
            }
            None => false,
        }
    }

    /// Tells the run to stop; its result will be dropped.
    pub(super) fn interrupt(&mut self) {
        if let Some(run) = &mut self.run {
            run.discard = true;
            run.cancel.cancel();
        }
    }

    /// Interrupts the run only if it is still `generation` (a lost turn
    /// lease must not stop the run after it).
    pub(super) fn interrupt_generation(&mut self, generation: u64) {
        if self
            .run
            .as_ref()
            .is_some_and(|r| r.generation == generation)
        {
            self.interrupt();
        }
    }

    /// `/stop` and `/new`: cancels the run, drops what waits (`/stop`
    /// keeps what was explicitly queued), and answers any waiting question
    /// with a denial. Whether a run was going.
    pub(super) fn stop(&mut self, clear_queue: bool) -> bool {
        let was_running = self.running();
        self.interrupt();
        if clear_queue {
            self.queue.clear();
        } else {
            self.queue.retain(|q| !q.mergeable);
        }
        // Dropping the senders answers the waiting tools with a denial.
        self.approval = None;
        self.clarify = None;
        was_running
    }

    /// A stopping gateway: nothing more runs, the run is interrupted.
    pub(super) fn shut_down(&mut self) {
        self.queue.clear();
        self.interrupt();
    }

    /// `/approve` and `/deny`: hands the decision to the waiting command;
    /// `false` when none waits.
    pub(super) fn answer_approval(&mut self, decision: ApprovalDecision) -> bool {
        self.approval
            .take()
            .is_some_and(|tx| tx.send(decision).is_ok())
    }

    /// The carried owed turns, for the run about to start: its answer
    /// settles them.
    pub(super) fn take_carried(&mut self) -> Vec<String> {
        std::mem::take(&mut self.carried)
    }

    /// The run `generation`, if it is still this lane's.
    pub(super) fn run_of(&mut self, generation: u64) -> Option<&mut Run> {
        self.run.as_mut().filter(|r| r.generation == generation)
    }

    /// The turn `generation` ended: steering that came too late for it
    /// becomes the next turn (from `event`'s sender). Whether its result
    /// must be dropped.
    pub(super) fn turn_over(
        &mut self,
        generation: u64,
        event: &MessageEvent,
        late_steer: Vec<String>,
    ) -> bool {
        let discard = self
            .run
            .as_ref()
            .is_none_or(|r| r.generation != generation || r.discard);
        if !late_steer.is_empty() {
            let mut follow = event.clone();
            follow.text = late_steer.join("\n");
            follow.message_id = None;
            self.queue.push_front(Queued {
                event: follow,
                mergeable: true,
                owed: Vec::new(),
            });
        }
        discard
    }

    /// The run ended as `end`, owing `owed`: what the user stopped is
    /// settled, what a newer message superseded is carried into its turn.
    /// A stopping gateway settles nothing it did not answer: those turns
    /// run again after the restart.
    pub(super) fn ended(
        &mut self,
        end: RunEnd,
        mut owed: Vec<String>,
        draining: bool,
        mode: BusyInputMode,
    ) -> Ended {
        let mut out = Ended::default();
        if end == RunEnd::Superseded && !draining {
            if self.queue.is_empty() {
                // Stopped by the user (`/stop`, `/new`): nothing will
                // answer these, and nothing should.
                out.settle = owed;
            } else {
                // Superseded by a newer message: its message is in the
                // transcript, so the next turn answers it.
                self.carried.append(&mut owed);
            }
        }
        out.coalesce = end == RunEnd::Superseded
            && mode == BusyInputMode::Interrupt
            && !self.queue.is_empty()
            && !draining;
        out
    }

    /// What runs next: the first queued message under `generation`, or
    /// nothing (always nothing when the gateway is stopping).
    pub(super) fn next(&mut self, draining: bool, generation: impl FnOnce() -> u64) -> Next {
        match self.queue.pop_front() {
            Some(item) if !draining => {
                let generation = generation();
                let cancel = self.start(generation);
                Next::Run {
                    item,
                    generation,
                    cancel,
                }
            }
            _ => {
                self.run = None;
                self.queue.clear();
                let leftover = if draining {
                    Vec::new()
                } else {
                    std::mem::take(&mut self.carried)
                };
                Next::Idle {
                    leftover,
                    forget: self.approval.is_none() && self.clarify.is_none(),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
