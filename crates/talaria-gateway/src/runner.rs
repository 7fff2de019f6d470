//! The runner: every inbound event passes through here, in order.
//!
//! For each event: compute its session key once; authorize the sender
//! (strangers in DMs may get a pairing code, nobody unauthorized reaches the
//! model); answer slash commands without the model; otherwise run an agent
//! turn, or, when the chat's agent is already busy, apply the busy-input
//! mode.
//!
//! # The busy guard
//!
//! Each session key has a [`Lane`]. A lane runs at most one turn at a time
//! (its `run`); what arrives meanwhile waits in its `queue`. A run that was
//! interrupted, stopped or reset is marked `discard` and its late result is
//! dropped, but the lane stays busy until that run has actually unwound, so
//! two turns never touch one transcript at once. Lanes of different keys
//! run concurrently.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use talaria_agent::interaction::{ApprovalDecision, ApprovalRequest, ClarifyRequest, Interaction};
use talaria_agent::tools::SessionState;
use talaria_agent::{Agent, TurnExit, TurnObserver, TurnOptions};
use talaria_core::Role;
use talaria_core::commands::{self, CommandDef, WhileRunning};
use talaria_core::config::BusyInputMode;
use talaria_core::{Config, Env, Home};
use talaria_store::{GatewayStore, NodeId, OwedTurn, SessionFilter};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::adapter::{Admission, Admit, AdmitReply};
use crate::auth::{AuthPolicy, Decision};
use talaria_adapter::{Capabilities, LengthUnit, MessageLimits};

/// How an event is judged whose platform has no adapter in this gateway
/// (only tests hand the runner such events): a chat with opaque sender ids.
const UNREGISTERED: Capabilities = Capabilities::chat(MessageLimits {
    max_len: 4096,
    unit: LengthUnit::Chars,
});
use crate::delivery::{Address, Delivery};
use crate::event::{MessageEvent, SessionSource};
use crate::hooks::{Hooks, events};
use crate::key::{KeyPolicy, SessionKey};
use crate::ledger::ReplyTo;
use crate::owed;
use crate::pairing::{OfferReply, Pairing};
use crate::preview::{Preview, PreviewSink};
use crate::router::{AutoReset, Routed, Router};
use crate::supervisor::StatusBoard;
use crate::turn_lease::{HeldTurn, Taken, TurnLeases};

/// Follow-ups waiting behind a busy turn; more are dropped (and logged):
/// a flood must not grow memory without bound.
const MAX_QUEUED: usize = 32;

/// At most one "busy" acknowledgement per chat in this window.
const ACK_COOLDOWN: Duration = Duration::from_secs(30);

/// Chats whose acknowledgement time is kept before the expired ones are
/// swept out.
const MAX_ACK_ENTRIES: usize = 1024;

/// The busy acknowledgement in queue (and steer-less) mode.
const ACK_QUEUED: &str =
    "⏳ Still working on your previous message; this one is queued for the next turn.";

/// The busy acknowledgement in interrupt mode.
const ACK_INTERRUPT: &str = "⚡ Interrupting the current task to answer your new message.";

/// In interrupt mode, after a turn was superseded, the next one waits
/// until no new message arrived for this long, so a burst of messages
/// becomes one turn instead of one interrupted model call each.
const COALESCE_QUIET: Duration = Duration::from_millis(400);

/// The longest a superseding turn waits for a burst to end.
const COALESCE_MAX: Duration = Duration::from_secs(3);

/// How long a clarifying question waits for its answer.
const CLARIFY_TIMEOUT: Duration = Duration::from_secs(300);

/// Everything the runner is built from.
pub struct RunnerParts {
    pub config: Arc<Config>,
    /// `.env` overlaid by the process environment: allowlists and flags.
    pub env: Env,
    pub home: Home,
    pub agent: Arc<Agent>,
    pub store: Arc<dyn GatewayStore>,
    pub delivery: Delivery,
    /// Adapter liveness, shown by `/status`.
    pub board: Arc<StatusBoard>,
    /// Event hooks; the runner only ever fires them and moves on.
    pub hooks: Arc<Hooks>,
    /// Set when several nodes share the store: each turn then holds the
    /// session's lease there, so no two nodes run one session at once.
    pub turn_leases: Option<TurnLeases>,
    /// This process as a node: the owner of the turns it owes.
    pub node: NodeId,
}

/// The runner. Cheap to clone; clones share all state.
#[derive(Clone)]
pub struct Runner {
    inner: Arc<Inner>,
}

struct Inner {
    config: Arc<Config>,
    home: Home,
    policy: KeyPolicy,
    auth: AuthPolicy,
    pairing: Pairing,
    router: Router,
    agent: Arc<Agent>,
    store: Arc<dyn GatewayStore>,
    delivery: Delivery,
    board: Arc<StatusBoard>,
    hooks: Arc<Hooks>,
    turn_leases: Option<TurnLeases>,
    node: NodeId,
    lanes: Mutex<HashMap<SessionKey, Lane>>,
    /// When each key was last sent a busy acknowledgement. Kept apart from
    /// the lanes, which go when their queue empties: the cooldown must
    /// outlive them (at most one acknowledgement per chat per window).
    acks: Mutex<HashMap<SessionKey, Instant>>,
    generations: AtomicU64,
    /// Set when the gateway stops: new work is refused.
    draining: AtomicBool,
    /// Every lane driver, so a stopping gateway can wait for them.
    tasks: TaskTracker,
    started: Instant,
}

/// One session key's state in this process.
#[derive(Default)]
struct Lane {
    run: Option<Run>,
    queue: VecDeque<Queued>,
    /// Owed turns whose message is already in the transcript and will be
    /// answered by the lane's next turn: a superseded run's, a steered
    /// message's. The next run settles them with its answer.
    carried: Vec<String>,
    /// Messages handed to the lane so far: how a superseding turn tells
    /// that a burst is still arriving.
    arrivals: u64,
    /// A dangerous command waiting for `/approve` or `/deny`.
    approval: Option<oneshot::Sender<ApprovalDecision>>,
    /// A clarifying question waiting for the next plain message.
    clarify: Option<oneshot::Sender<String>>,
}

/// The turn a lane is running.
struct Run {
    generation: u64,
    cancel: CancellationToken,
    started: Instant,
    /// Its result must not be delivered (interrupted, stopped, reset).
    discard: bool,
    /// The session's state once routed, for steering.
    state: Option<Arc<SessionState>>,
    /// The tool running now, for `/status`.
    tool: Arc<Mutex<Option<String>>>,
}

/// How a run ended, for what becomes of the turns it owed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunEnd {
    /// Answered, or failed and said so: its owed turns are settled.
    Done,
    /// Stopped before an answer (superseded, stopped, shutting down).
    Superseded,
}

/// A message waiting for its turn.
struct Queued {
    event: MessageEvent,
    /// Plain follow-ups in queue mode merge into one turn; `/queue` items
    /// are each their own.
    mergeable: bool,
    /// The owed turns its answer settles (one per merged message).
    owed: Vec<String>,
}

impl Runner {
    pub fn new(parts: RunnerParts) -> Runner {
        let RunnerParts {
            config,
            env,
            home,
            agent,
            store,
            delivery,
            board,
            hooks,
            turn_leases,
            node,
        } = parts;
        let router = Router::new(agent.clone(), store.clone(), config.session_reset.clone());
        Runner {
            inner: Arc::new(Inner {
                policy: KeyPolicy::from_config(&config.gateway),
                auth: AuthPolicy::from_env(&env),
                pairing: Pairing::new(store.clone()),
                router,
                config,
                home,
                agent,
                store,
                delivery,
                board,
                hooks,
                turn_leases,
                node,
                lanes: Mutex::new(HashMap::new()),
                acks: Mutex::new(HashMap::new()),
                generations: AtomicU64::new(1),
                draining: AtomicBool::new(false),
                tasks: TaskTracker::new(),
                started: Instant::now(),
            }),
        }
    }

    /// Reads events until the inbox closes or `shutdown` fires. Each is
    /// answered with its [`Admission`] as soon as it is taken, before any
    /// command or turn runs, so the adapter can acknowledge it.
    pub async fn serve(
        &self,
        mut inbox: tokio::sync::mpsc::Receiver<Admit>,
        shutdown: CancellationToken,
    ) {
        loop {
            let admit = tokio::select! {
                _ = shutdown.cancelled() => break,
                admit = inbox.recv() => match admit {
                    Some(a) => a,
                    None => break,
                },
            };
            let (event, reply) = admit.into_parts();
            self.accept(event, reply).await;
        }
    }

    /// Session keys with a turn running now.
    pub fn running_sessions(&self) -> Vec<String> {
        self.inner
            .lanes()
            .iter()
            .filter(|(_, lane)| lane.run.is_some())
            .map(|(k, _)| k.to_string())
            .collect()
    }

    /// Stops taking work, lets running turns finish for up to `grace`,
    /// then interrupts what is left and waits briefly for it to unwind.
    pub async fn drain(&self, grace: Duration) {
        let inner = &self.inner;
        inner.draining.store(true, Ordering::SeqCst);
        inner.tasks.close();
        if tokio::time::timeout(grace, inner.tasks.wait())
            .await
            .is_ok()
        {
            return;
        }
        tracing::info!("interrupting running turns to shut down");
        for lane in inner.lanes().values_mut() {
            lane.queue.clear();
            if let Some(run) = &mut lane.run {
                run.discard = true;
                run.cancel.cancel();
            }
        }
        if tokio::time::timeout(Duration::from_secs(5), inner.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("some turns did not stop in time");
        }
    }

    /// Takes over the owed turns (see [`crate::owed`]) of nodes that died
    /// (this one's previous process, or another node of the deployment) on
    /// `platforms`, where their answers can be sent now, and runs each
    /// again, or tells its user it was lost.
    pub async fn recover_owed(&self, platforms: &HashSet<String>) {
        let inner = &self.inner;
        if platforms.is_empty() || inner.draining.load(Ordering::SeqCst) {
            return;
        }
        // A crashed predecessor on this host is declared dead now, not when
        // its heartbeat lease runs out.
        if let Err(e) = crate::node::reap_local(inner.store.as_ref(), &inner.node).await {
            tracing::warn!(error = %e, "could not check this host's gateways for dead ones");
        }
        let platforms: Vec<String> = platforms.iter().cloned().collect();
        let claimed = match inner
            .store
            .claim_owed_turns(&inner.node, &platforms, owed::CLAIM_LIMIT)
            .await
        {
            Ok(claimed) => claimed,
            Err(e) => {
                tracing::warn!(error = %e, "cannot look for unanswered messages of a stopped gateway");
                return;
            }
        };
        if !claimed.is_empty() {
            tracing::info!(
                count = claimed.len(),
                "taking over messages a stopped gateway had not answered"
            );
        }
        for turn in claimed {
            self.resume_owed(turn).await;
        }
    }

    /// Runs a claimed owed turn again, or says it was lost.
    async fn resume_owed(&self, turn: OwedTurn) {
        let inner = &self.inner;
        let event: MessageEvent = match serde_json::from_str(&turn.event) {
            Ok(event) => event,
            Err(e) => {
                // Written by this code; unreadable only after a downgrade.
                tracing::error!(id = %turn.id, error = %e, "an unanswered message cannot be read back; dropping it");
                self.settle(&[turn.id]).await;
                return;
            }
        };
        let key = match SessionKey::for_source(&event.source, inner.policy) {
            Ok(key) => key,
            Err(e) => {
                tracing::warn!(error = %e, "an unanswered message has an unusable chat id; dropping it");
                self.settle(&[turn.id]).await;
                return;
            }
        };
        let age = talaria_core::unix_now() - turn.accepted_at;
        if turn.claims > owed::MAX_CLAIMS || age > owed::MAX_AGE.as_secs_f64() {
            tracing::warn!(key = %key, claims = turn.claims, age_secs = age, "giving up on an unanswered message; telling its sender");
            // Through the ledger, which settles the turn in the transaction
            // that records the notice: a crash now neither loses the notice
            // nor sends a second one.
            let to = inner.delivery.answer_address(&event);
            let reference = format!("lost:{}", turn.id);
            let settles = [turn.id];
            let _ = inner
                .delivery
                .deliver_reply_settling(
                    key.as_str(),
                    &reference,
                    &to,
                    &owed::lost_notice(&event.text),
                    None,
                    &settles,
                )
                .await;
            if inner.delivery.ledger().is_none() {
                self.settle(&settles).await;
            }
            return;
        }
        tracing::info!(key = %key, claims = turn.claims, "running an unanswered message again");
        self.rewind_unanswered(&key, &prompt_text(&event)).await;
        self.submit(
            key,
            Queued {
                event,
                mergeable: false,
                owed: vec![turn.id],
            },
        );
    }

    /// Removes what a dead process wrote of a turn it did not finish (the
    /// user row, tool calls and results after it), so the turn run again
    /// starts from the same transcript instead of seeing its message twice.
    /// Only when the transcript ends in that very message's turn.
    async fn rewind_unanswered(&self, key: &SessionKey, prompt: &str) {
        let inner = &self.inner;
        let session = match inner.router.peek(key).await {
            Ok(Some(session)) => session,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(key = %key, error = %e, "cannot read the conversation of an unanswered message");
                return;
            }
        };
        let rows = match inner.store.messages(&session.id).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(key = %key, error = %e, "cannot read the conversation of an unanswered message");
                return;
            }
        };
        let Some(last_user) = rows.iter().rposition(|r| r.message.role == Role::User) else {
            return;
        };
        let answered = rows[last_user + 1..]
            .iter()
            .any(|r| r.message.role == Role::Assistant && r.message.tool_calls.is_empty());
        if rows[last_user].message.content == prompt
            && !answered
            && let Err(e) = inner.agent.rewind(&session.id, 1).await
        {
            tracing::warn!(key = %key, error = %e, "cannot remove an unfinished turn; running it again after it");
        }
    }

    /// Handles one inbound event: answers `reply` once the event is taken
    /// (or refused, or known), then runs its command or hands it to its
    /// lane. Returns once the event is routed: turns run on their own
    /// tasks.
    async fn accept(&self, event: MessageEvent, reply: AdmitReply) {
        let inner = &self.inner;
        if inner.draining.load(Ordering::SeqCst) {
            // Not taken: the adapter does not acknowledge it, and the
            // platform delivers it again to whichever process runs next.
            tracing::info!(platform = %event.source.platform, "gateway stopping; message not taken");
            return;
        }
        let key = match SessionKey::for_source(&event.source, inner.policy) {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(platform = %event.source.platform, error = %e, "message with an unusable chat id dropped");
                reply.send(Admission::Refused);
                return;
            }
        };
        // The message's life at debug: ids and sizes, never the words.
        tracing::debug!(
            platform = %event.source.platform,
            key = %key,
            chars = event.text.chars().count(),
            "message received"
        );
        let verified = inner
            .delivery
            .adapter(&event.source.platform)
            .is_some_and(|a| a.verifies_senders());
        if !verified && !self.authorized(&event).await {
            reply.send(Admission::Refused);
            return;
        }
        tracing::debug!(
            key = %key,
            by = if verified { "the platform" } else { "the allowlist or pairing" },
            "sender authorized"
        );
        // A message that will start a turn is recorded as owed before the
        // adapter may acknowledge it; commands and answers to a waiting
        // question are only deduplicated.
        let starts_turn = event.command().is_none()
            && inner.lanes().get(&key).is_none_or(|l| l.clarify.is_none());
        let owed = if starts_turn {
            match self.take_owed(&key, &event).await {
                Some(owed) => owed,
                None => {
                    reply.send(Admission::Duplicate);
                    return;
                }
            }
        } else {
            if !self.first_delivery(&event).await {
                reply.send(Admission::Duplicate);
                return;
            }
            Vec::new()
        };
        reply.send(Admission::Accepted);
        inner.hook(events::MESSAGE_RECEIVED, || {
            let s = &event.source;
            serde_json::json!({
                "platform": s.platform,
                "chat_type": s.chat_type.as_str(),
                "chat_id_hash": talaria_core::ids::hash_id("chat", &s.chat_id),
                "user_id_hash": user_hash(s),
                "session_key": hook_key(&key),
                "text": clip(&event.text),
                "is_command": event.command().is_some(),
            })
        });
        if let Some(invocation) = event.command() {
            let name = invocation.name.to_owned();
            let args = invocation.args.to_owned();
            match commands::resolve(&name) {
                Some(def) if def.availability != commands::Availability::CliOnly => {
                    inner.hook(&events::command(def.name), || {
                        serde_json::json!({
                            "platform": event.source.platform,
                            "command": def.name,
                            "args": clip(&args),
                            "session_key": hook_key(&key),
                        })
                    });
                    self.command(&key, &event, def, &args).await;
                }
                _ => {
                    // `/skill-name args` loads the skill for this turn.
                    let home = inner.home.clone();
                    let (skill, wanted) = (name.clone(), args.clone());
                    let message = tokio::task::spawn_blocking(move || {
                        let library = talaria_learning::Library::new(&home);
                        talaria_learning::invoke::invocation(&library, &skill, &wanted)
                    })
                    .await
                    .ok()
                    .flatten();
                    if let Some(message) = message {
                        let mut event = event;
                        event.text = message;
                        self.submit(
                            key,
                            Queued {
                                event,
                                mergeable: false,
                                owed,
                            },
                        );
                        return;
                    }
                    let text =
                        format!("Unknown command /{name}. Type /help to see what I understand.");
                    inner
                        .delivery
                        .notify(&Address::reply_to(&event), &text)
                        .await;
                }
            }
            return;
        }
        if !starts_turn
            && let Some(answer) = inner.lanes().get_mut(&key).and_then(|l| l.clarify.take())
        {
            // The answer to a question the agent asked: it goes to the
            // waiting tool, not into a new turn.
            let _ = answer.send(event.text.clone());
            return;
        }
        self.submit(
            key,
            Queued {
                event,
                mergeable: true,
                owed,
            },
        );
    }

    /// Records a message that will start a turn as owed (and, when it has
    /// an id, as seen, in the same step). `None` for a repeat; otherwise
    /// the owed turn's id, or none when the store cannot record it (the
    /// message is taken anyway, as [`Runner::first_delivery`] does).
    async fn take_owed(&self, key: &SessionKey, event: &MessageEvent) -> Option<Vec<String>> {
        let inner = &self.inner;
        let source = &event.source;
        let inbound_id = inbound_id(event);
        let serialized = match serde_json::to_string(event) {
            Ok(json) => json,
            Err(e) => {
                tracing::warn!(platform = %source.platform, error = %e, "cannot record a message as owed; taking it anyway");
                return self.first_delivery(event).await.then(Vec::new);
            }
        };
        let id = crate::owed::turn_id(&source.platform, inbound_id.as_deref());
        let turn = talaria_store::NewOwedTurn {
            id: id.clone(),
            session_key: key.as_str().to_owned(),
            platform: source.platform.clone(),
            event: serialized,
            owner: inner.node.clone(),
        };
        match inner.store.accept_turn(inbound_id.as_deref(), turn).await {
            Ok(true) => Some(vec![id]),
            Ok(false) => {
                tracing::info!(platform = %source.platform, "re-delivered message ignored");
                None
            }
            Err(e) => {
                tracing::warn!(platform = %source.platform, error = %e, "cannot record a message as owed; taking it anyway");
                Some(Vec::new())
            }
        }
    }

    /// Whether this is the first time the event arrives. Platforms
    /// re-deliver what they think was missed (an unacknowledged envelope, a
    /// replayed sync, a resumed stream); a repeat is dropped here, before
    /// it can start a second turn. Message ids are unique per chat on most
    /// platforms, so the chat is part of the id. When the store cannot
    /// answer, the event goes through: a rare duplicate answer is better
    /// than a lost message.
    async fn first_delivery(&self, event: &MessageEvent) -> bool {
        let Some(inbound_id) = inbound_id(event) else {
            return true;
        };
        let (source, message_id) = (&event.source, &inbound_id);
        match self
            .inner
            .store
            .first_delivery(&source.platform, &inbound_id)
            .await
        {
            Ok(true) => true,
            Ok(false) => {
                tracing::info!(platform = %source.platform, message_id = %message_id, "re-delivered message ignored");
                false
            }
            Err(e) => {
                tracing::warn!(platform = %source.platform, error = %e, "cannot check for a re-delivered message; taking it");
                true
            }
        }
    }

    /// Applies authorization; strangers in DMs may be offered a code.
    async fn authorized(&self, event: &MessageEvent) -> bool {
        let inner = &self.inner;
        let source = &event.source;
        // Pairing can only turn a denial into an approval, so the store is
        // read only for senders the configuration alone does not admit:
        // allowlisted users cost no query per message (the auth proptest
        // `pairing_admits_humans_with_an_id_only` holds this equivalence).
        // Bots are never admitted by pairing, so they cost no query either.
        let caps = inner
            .delivery
            .adapter(&source.platform)
            .map_or(UNREGISTERED, |a| a.capabilities());
        let mut decision = inner.auth.decide(source, &caps, false);
        if matches!(decision, Decision::Deny { .. })
            && !source.is_bot
            && let Some(user) = &source.user_id
        {
            match inner.pairing.is_approved(&source.platform, user).await {
                Ok(true) => decision = inner.auth.decide(source, &caps, true),
                Ok(false) => {}
                Err(e) => {
                    // Unknown is not "unpaired": offering a fresh code to a
                    // user who may well be approved would only confuse.
                    tracing::warn!(platform = %source.platform, error = %e, "cannot read pairing approvals; message dropped");
                    return false;
                }
            }
        }
        match decision {
            Decision::Allow(_) => true,
            Decision::Deny { offer_pairing } => {
                // The user id is logged so an owner who wrote to their own
                // bot can find what to put in its allowlist.
                let user = source.user_id.as_deref().unwrap_or("-");
                if !(offer_pairing && source.user_id.is_some()) {
                    tracing::info!(
                        platform = %source.platform,
                        chat_type = %source.chat_type,
                        user_id = %user,
                        "message from an unauthorized sender dropped (to let them in, add their user id to the platform's allowlist)"
                    );
                    return false;
                }
                match inner
                    .pairing
                    .offer(
                        &source.platform,
                        user,
                        source.user_name.as_deref(),
                        &source.chat_id,
                    )
                    .await
                {
                    Ok(Some(reply)) => {
                        match &reply {
                            OfferReply::Code(_) => tracing::info!(
                                platform = %source.platform,
                                user_id = %user,
                                "an unknown sender was sent a pairing code (approve it with `talaria pairing approve`)"
                            ),
                            OfferReply::Refusal(_) => tracing::info!(
                                platform = %source.platform,
                                user_id = %user,
                                "an unknown sender was told to try pairing later: too many requests, or approvals are locked"
                            ),
                        }
                        inner
                            .delivery
                            .notify(&Address::reply_to(event), reply.text())
                            .await;
                    }
                    Ok(None) => tracing::info!(
                        platform = %source.platform,
                        user_id = %user,
                        "message from an unknown sender dropped: they were answered with a pairing code within the last minutes"
                    ),
                    Err(e) => {
                        tracing::warn!(platform = %source.platform, user_id = %user, error = %e, "cannot offer a pairing code; message dropped");
                    }
                }
                false
            }
        }
    }

    /// Starts a turn for `item`, or applies the busy mode when one runs.
    fn submit(&self, key: SessionKey, item: Queued) {
        let inner = &self.inner;
        let mut lanes = inner.lanes();
        let lane = lanes.entry(key.clone()).or_default();
        lane.arrivals += 1;
        let Some(run) = &mut lane.run else {
            let (generation, cancel) = inner.new_run(lane);
            drop(lanes);
            let this = self.clone();
            inner
                .tasks
                .spawn(async move { this.drive(key, item, generation, cancel).await });
            return;
        };
        let to = Address::reply_to(&item.event);
        let already_stopping = run.discard;
        let mut dropped = None;
        let ack = match inner.config.gateway.busy_input_mode {
            BusyInputMode::Steer if run.state.is_some() && item.mergeable => {
                if let Some(state) = &run.state {
                    state.push_steer(&item.event.text);
                }
                // The running turn (or, if it ends first, the next one)
                // answers it.
                lane.carried.extend(item.owed);
                Some(
                    "⏩ Passed your message to the running task; it will see it after its current step.",
                )
            }
            BusyInputMode::Queue | BusyInputMode::Steer => {
                dropped = enqueue(lane, item);
                Some(ACK_QUEUED)
            }
            BusyInputMode::Interrupt => {
                dropped = enqueue(lane, item);
                if let Some(run) = &mut lane.run {
                    run.discard = true;
                    run.cancel.cancel();
                }
                (!already_stopping).then_some(ACK_INTERRUPT)
            }
        };
        drop(lanes);
        let ack = ack
            .filter(|_| inner.config.gateway.busy_ack)
            .filter(|_| inner.ack_due(&key));
        if let Some(text) = ack {
            let delivery = inner.delivery.clone();
            tokio::spawn(async move { delivery.notify(&to, text).await });
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
    async fn settle(&self, owed: &[String]) {
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
                owed.append(&mut lane.carried);
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
            let mut settle = Vec::new();
            let coalesce = {
                let mut lanes = inner.lanes();
                let Some(lane) = lanes.get_mut(&key) else {
                    break;
                };
                // A stopping gateway settles nothing it did not answer:
                // those turns run again after the restart.
                let draining = inner.draining.load(Ordering::SeqCst);
                if end == RunEnd::Superseded && !draining {
                    if lane.queue.is_empty() {
                        // Stopped by the user (`/stop`, `/new`): nothing
                        // will answer these, and nothing should.
                        settle = owed;
                    } else {
                        // Superseded by a newer message: its message is in
                        // the transcript, so the next turn answers it.
                        lane.carried.append(&mut owed);
                    }
                }
                end == RunEnd::Superseded
                    && inner.config.gateway.busy_input_mode == BusyInputMode::Interrupt
                    && !lane.queue.is_empty()
                    && !draining
            };
            self.settle(&settle).await;
            if coalesce {
                self.await_quiet(&key).await;
            }
            let leftover = {
                let mut lanes = inner.lanes();
                let Some(lane) = lanes.get_mut(&key) else {
                    break;
                };
                match lane.queue.pop_front() {
                    Some(item) if !inner.draining.load(Ordering::SeqCst) => {
                        let (generation, cancel) = inner.new_run(lane);
                        next = Some((item, generation, cancel));
                        Vec::new()
                    }
                    _ => {
                        lane.run = None;
                        inner.board.touch();
                        lane.queue.clear();
                        let leftover = if inner.draining.load(Ordering::SeqCst) {
                            Vec::new()
                        } else {
                            std::mem::take(&mut lane.carried)
                        };
                        if lane.approval.is_none() && lane.clarify.is_none() {
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
        let mode = inner.config.gateway.busy_input_mode;
        let on_wait = || {
            let text = match mode {
                BusyInputMode::Interrupt => ACK_INTERRUPT,
                BusyInputMode::Queue | BusyInputMode::Steer => ACK_QUEUED,
            };
            let due = inner.config.gateway.busy_ack && inner.ack_due(key);
            if due {
                let (delivery, to) = (inner.delivery.clone(), Address::reply_to(event));
                tokio::spawn(async move { delivery.notify(&to, text).await });
            }
        };
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
                    let mut lanes = runner.inner.lanes();
                    if let Some(run) = lanes
                        .get_mut(&key)
                        .and_then(|l| l.run.as_mut())
                        .filter(|r| r.generation == generation)
                    {
                        run.discard = true;
                        run.cancel.cancel();
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
        let tool = {
            let mut lanes = inner.lanes();
            let run = lanes
                .get_mut(key)
                .and_then(|l| l.run.as_mut())
                .filter(|r| r.generation == generation);
            match run {
                Some(run) => {
                    run.state = Some(handle.state.clone());
                    run.tool.clone()
                }
                None => Arc::new(Mutex::new(None)),
            }
        };
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
        let observer = RunObserver {
            tool,
            preview: preview.as_ref().map(Preview::sink),
        };
        let text = prompt_text(&event);
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
        inner.hook(events::AGENT_START, || {
            serde_json::json!({
                "platform": event.source.platform,
                "session_key": hook_key(key),
                "session_id": handle.id,
                "message": clip(&event.text),
            })
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
                    ..TurnOptions::default()
                },
            )
            .await;
        typing.cancel();

        // Steering that arrived too late for the turn becomes the next one.
        let leftover = handle.state.take_steer();
        let discard = {
            let mut lanes = inner.lanes();
            let lane = lanes.get_mut(key);
            let discard = lane
                .as_ref()
                .and_then(|l| l.run.as_ref())
                .is_none_or(|r| r.generation != generation || r.discard);
            if let Some(lane) = lane
                && !leftover.is_empty()
            {
                let mut follow = event.clone();
                follow.text = leftover.join("\n");
                follow.message_id = None;
                lane.queue.push_front(Queued {
                    event: follow,
                    mergeable: true,
                    owed: Vec::new(),
                });
            }
            discard
        };
        inner.hook(events::AGENT_END, || {
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
            let response = result.as_ref().map(|o| clip(&o.answer)).unwrap_or_default();
            serde_json::json!({
                "platform": event.source.platform,
                "session_key": hook_key(key),
                "session_id": handle.id,
                "exit": exit,
                "response": response,
            })
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
                    if delivered {
                        inner.hook(events::MESSAGE_SENT, || {
                            serde_json::json!({
                                "platform": to.platform,
                                "session_key": hook_key(key),
                                "chars": outcome.answer.chars().count(),
                            })
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

    /// Answers a slash command without calling the model.
    async fn command(&self, key: &SessionKey, event: &MessageEvent, def: &CommandDef, args: &str) {
        let inner = &self.inner;
        let to = Address::reply_to(event);
        let running = inner
            .lanes()
            .get(key)
            .and_then(|l| l.run.as_ref())
            .is_some_and(|r| !r.discard);
        if running && def.while_running == WhileRunning::Refused {
            let text = format!(
                "⏳ A turn is running, so /{} can't run now. Wait for the answer or send /stop first.",
                def.name
            );
            inner.delivery.notify(&to, &text).await;
            return;
        }
        let reply = match def.name {
            "new" => Some(self.cmd_new(key, event, args).await),
            "stop" => Some(self.cmd_stop(key)),
            "status" => Some(self.cmd_status(key).await),
            "help" => Some(commands::help_text(commands::Availability::GatewayOnly)),
            "queue" => self.cmd_queue(key, event, args),
            "steer" => self.cmd_steer(key, event, args),
            "approve" => Some(self.cmd_answer_approval(key, approval_from_args(args))),
            "deny" => Some(self.cmd_answer_approval(key, ApprovalDecision::Deny)),
            "sessions" => Some(self.cmd_sessions(key).await),
            "resume" => Some(self.cmd_resume(key, args).await),
            "title" => Some(self.cmd_title(key, args).await),
            "retry" => self.cmd_retry(key, event).await,
            "undo" => Some(self.cmd_undo(key, args).await),
            "compress" => Some(self.cmd_compress(key, event).await),
            "model" => Some(self.cmd_model(args)),
            "usage" => Some(self.cmd_usage(key).await),
            "whoami" => Some(self.cmd_whoami(key, event).await),
            "sethome" => Some(self.cmd_sethome(event)),
            "version" => Some(format!("Talaria {}", env!("CARGO_PKG_VERSION"))),
            "reload-mcp" => Some(self.inner.agent.parts().registry.reload_sources().await),
            "skills" => {
                let home = inner.home.clone();
                tokio::task::spawn_blocking(move || {
                    talaria_learning::invoke::listing(&talaria_learning::Library::new(&home))
                })
                .await
                .ok()
            }
            "learn" if args.trim().is_empty() => {
                Some("Usage: /learn <topic>, for example /learn rotating nginx logs".to_owned())
            }
            "learn" => {
                let mut turn = event.clone();
                turn.text = talaria_learning::invoke::learn_prompt(args.trim());
                self.submit(
                    key.clone(),
                    Queued {
                        event: turn,
                        mergeable: false,
                        owed: Vec::new(),
                    },
                );
                None
            }
            other => Some(format!(
                "/{other} is not available in chat. Type /help to see what is."
            )),
        };
        if let Some(text) = reply {
            inner.delivery.notify(&to, &text).await;
        }
    }

    /// Cancels the lane's run (its result is dropped), and optionally its
    /// queue and any question waiting for an answer.
    fn stop_lane(&self, key: &SessionKey, clear_queue: bool) -> bool {
        let mut lanes = self.inner.lanes();
        let Some(lane) = lanes.get_mut(key) else {
            return false;
        };
        let was_running = lane.run.as_ref().is_some_and(|r| !r.discard);
        if let Some(run) = &mut lane.run {
            run.discard = true;
            run.cancel.cancel();
        }
        if clear_queue {
            lane.queue.clear();
        } else {
            // `/stop` drops follow-ups but keeps what was explicitly queued.
            lane.queue.retain(|q| !q.mergeable);
        }
        // Dropping the senders answers the waiting tools with a denial.
        lane.approval = None;
        lane.clarify = None;
        was_running
    }

    async fn cmd_new(&self, key: &SessionKey, event: &MessageEvent, args: &str) -> String {
        self.stop_lane(key, true);
        match self.inner.router.reset(key, &event.source).await {
            Ok(routed) => {
                let inner = &self.inner;
                inner.hook(events::SESSION_RESET, || {
                    serde_json::json!({
                        "platform": event.source.platform,
                        "session_key": hook_key(key),
                        "user_id_hash": user_hash(&event.source),
                        "session_id": routed.handle.id,
                        "previous_session_id": routed.previous,
                    })
                });
                inner.session_hooks(key, &event.source, &routed);
                let handle = routed.handle;
                if !args.is_empty()
                    && let Err(e) = self.inner.store.set_title(&handle.id, args).await
                {
                    tracing::warn!(error = %e, "cannot set the title");
                }
                "✨ Started a new conversation. The previous one is kept: /sessions lists it and /resume brings it back.".to_owned()
            }
            Err(e) => format!("⚠️ Could not start a new conversation: {e}"),
        }
    }

    fn cmd_stop(&self, key: &SessionKey) -> String {
        if self.stop_lane(key, false) {
            "⏹ Stopped. Your next message starts a new turn in the same conversation.".to_owned()
        } else {
            "Nothing is running.".to_owned()
        }
    }

    /// How many messages a person is shown for each session: the active
    /// transcript, not rows `/undo`, `/retry` or a compression replaced.
    /// `?` when the store cannot say.
    async fn shown_counts(&self, ids: &[String]) -> Vec<String> {
        match self
            .inner
            .agent
            .parts()
            .store
            .active_message_counts(ids)
            .await
        {
            Ok(counts) => counts.iter().map(u64::to_string).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot count the sessions' messages");
                vec!["?".to_owned(); ids.len()]
            }
        }
    }

    async fn shown_count(&self, id: &str) -> String {
        let mut counts = self.shown_counts(&[id.to_owned()]).await;
        counts.pop().unwrap_or_else(|| "?".to_owned())
    }

    async fn cmd_status(&self, key: &SessionKey) -> String {
        let inner = &self.inner;
        let mut lines = Vec::new();
        match inner.router.peek(key).await {
            Ok(Some(session)) => {
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
                    self.shown_count(&session.id).await,
                    session.input_tokens,
                    session.output_tokens
                ));
            }
            Ok(None) => lines.push("Conversation: none yet".to_owned()),
            Err(e) => lines.push(format!("Conversation: unavailable ({e})")),
        }
        {
            let lanes = inner.lanes();
            match lanes
                .get(key)
                .and_then(|l| l.run.as_ref().map(|r| (r, l.queue.len())))
            {
                Some((run, queued)) => {
                    let tool = run.tool.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    lines.push(format!(
                        "Working for {}s{}{}",
                        run.started.elapsed().as_secs(),
                        tool.map(|t| format!(", running {t}")).unwrap_or_default(),
                        if queued > 0 {
                            format!(", {queued} queued")
                        } else {
                            String::new()
                        }
                    ));
                }
                None => lines.push("Idle".to_owned()),
            }
        }
        lines.push(format!("Model: {}", inner.agent.parts().provider.model()));
        let platforms = inner.board.snapshot();
        if !platforms.is_empty() {
            let list: Vec<String> = platforms
                .iter()
                .map(|(p, s)| format!("{p} {}", s.liveness))
                .collect();
            lines.push(format!("Platforms: {}", list.join(", ")));
        }
        lines.push(format!("Gateway up {}s", inner.started.elapsed().as_secs()));
        lines.join("\n")
    }

    fn cmd_queue(&self, key: &SessionKey, event: &MessageEvent, args: &str) -> Option<String> {
        if args.is_empty() {
            return Some("Usage: /queue <message>".to_owned());
        }
        let mut follow = event.clone();
        follow.text = args.to_owned();
        let mut lanes = self.inner.lanes();
        let lane = lanes.entry(key.clone()).or_default();
        if lane.run.is_some() {
            if lane.queue.len() >= MAX_QUEUED {
                return Some("The queue is full; wait for the current turn.".to_owned());
            }
            lane.queue.push_back(Queued {
                event: follow,
                mergeable: false,
                owed: Vec::new(),
            });
            let n = lane.queue.len();
            return Some(if n == 1 {
                "Queued for the next turn.".to_owned()
            } else {
                format!("Queued for the next turn ({n} queued).")
            });
        }
        drop(lanes);
        self.submit(
            key.clone(),
            Queued {
                event: follow,
                mergeable: false,
                owed: Vec::new(),
            },
        );
        None
    }

    fn cmd_steer(&self, key: &SessionKey, event: &MessageEvent, args: &str) -> Option<String> {
        if args.is_empty() {
            return Some("Usage: /steer <message>".to_owned());
        }
        {
            let lanes = self.inner.lanes();
            if let Some(state) = lanes
                .get(key)
                .and_then(|l| l.run.as_ref())
                .filter(|r| !r.discard)
                .and_then(|r| r.state.clone())
            {
                state.push_steer(args);
                return Some(
                    "⏩ The running task will see this after its current step.".to_owned(),
                );
            }
        }
        let mut follow = event.clone();
        follow.text = args.to_owned();
        self.submit(
            key.clone(),
            Queued {
                event: follow,
                mergeable: true,
                owed: Vec::new(),
            },
        );
        None
    }

    fn cmd_answer_approval(&self, key: &SessionKey, decision: ApprovalDecision) -> String {
        let waiting = self
            .inner
            .lanes()
            .get_mut(key)
            .and_then(|l| l.approval.take());
        let delivered = waiting.is_some_and(|tx| tx.send(decision).is_ok());
        if !delivered {
            return "Nothing is waiting for approval.".to_owned();
        }
        match decision {
            ApprovalDecision::Deny => "Denied.".to_owned(),
            ApprovalDecision::Session => "Approved for the rest of this conversation.".to_owned(),
            ApprovalDecision::Always => "Approved permanently.".to_owned(),
            _ => "Approved.".to_owned(),
        }
    }

    /// This key's sessions, newest first.
    async fn key_sessions(
        &self,
        key: &SessionKey,
    ) -> Result<Vec<talaria_store::SessionRecord>, String> {
        self.inner
            .store
            .list_sessions(SessionFilter {
                session_key: Some(key.as_str().to_owned()),
                limit: 10,
                ..SessionFilter::default()
            })
            .await
            .map_err(|e| e.to_string())
    }

    /// The id of the key's current session, if it has one (and the store
    /// answers).
    async fn current_id(&self, key: &SessionKey) -> Option<String> {
        self.inner
            .router
            .peek(key)
            .await
            .ok()
            .flatten()
            .map(|s| s.id)
    }

    async fn cmd_sessions(&self, key: &SessionKey) -> String {
        let current = self.current_id(key).await;
        match self.key_sessions(key).await {
            Ok(list) if list.is_empty() => "No conversations yet.".to_owned(),
            Ok(list) => {
                let ids: Vec<String> = list.iter().map(|s| s.id.clone()).collect();
                let counts = self.shown_counts(&ids).await;
                let mut out =
                    vec!["Recent conversations (/resume <number> to go back):".to_owned()];
                for ((i, s), count) in list.iter().enumerate().zip(counts) {
                    let when = chrono::DateTime::from_timestamp(s.started_at as i64, 0)
                        .map(|t| t.format("%Y-%m-%d %H:%M").to_string())
                        .unwrap_or_default();
                    out.push(format!(
                        "{}. {} · {} · {} messages{}",
                        i + 1,
                        s.title.as_deref().unwrap_or(&s.id),
                        when,
                        count,
                        if current.as_deref() == Some(s.id.as_str()) {
                            " (current)"
                        } else {
                            ""
                        }
                    ));
                }
                out.join("\n")
            }
            Err(e) => format!("⚠️ Cannot list conversations: {e}"),
        }
    }

    async fn cmd_resume(&self, key: &SessionKey, args: &str) -> String {
        let list = match self.key_sessions(key).await {
            Ok(l) => l,
            Err(e) => return format!("⚠️ Cannot list conversations: {e}"),
        };
        let current = self.current_id(key).await;
        let ids: Vec<String> = list.iter().map(|s| s.id.clone()).collect();
        let counts = match self
            .inner
            .agent
            .parts()
            .store
            .active_message_counts(&ids)
            .await
        {
            Ok(counts) => counts,
            Err(e) => return format!("⚠️ Cannot list conversations: {e}"),
        };
        let pick = talaria_agent::pick_session(&list, &counts, current.as_deref(), args);
        let Some(session) = pick else {
            return "No such conversation here. /sessions lists them.".to_owned();
        };
        match self.inner.router.resume(key, &session.id).await {
            Ok(_) => format!(
                "↩️ Resumed {}.",
                session.title.as_deref().unwrap_or(&session.id)
            ),
            Err(e) => format!("⚠️ Cannot resume: {e}"),
        }
    }

    async fn cmd_title(&self, key: &SessionKey, args: &str) -> String {
        let Ok(Some(session)) = self.inner.router.peek(key).await else {
            return "No conversation yet.".to_owned();
        };
        if args.is_empty() {
            return match session.title {
                Some(t) => format!("Title: {t}"),
                None => "This conversation has no title. /title <name> sets one.".to_owned(),
            };
        }
        let title: String = args.chars().filter(|c| !c.is_control()).take(100).collect();
        match self.inner.store.set_title(&session.id, &title).await {
            Ok(()) => format!("Title set: {title}"),
            Err(e) => format!("⚠️ Cannot set the title: {e}"),
        }
    }

    /// Drops the key's active transcript back to before the `n`-th last
    /// user message; returns that message's text.
    async fn rewind(&self, key: &SessionKey, n: usize) -> Result<Option<String>, String> {
        let Some(session) = self
            .inner
            .router
            .peek(key)
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(None);
        };
        self.inner
            .agent
            .rewind(&session.id, n)
            .await
            .map_err(|e| e.to_string())
    }

    async fn cmd_retry(&self, key: &SessionKey, event: &MessageEvent) -> Option<String> {
        match self.rewind(key, 1).await {
            Ok(Some(text)) => {
                let mut again = event.clone();
                again.text = text;
                self.submit(
                    key.clone(),
                    Queued {
                        event: again,
                        mergeable: false,
                        owed: Vec::new(),
                    },
                );
                None
            }
            Ok(None) => Some("There is nothing to retry yet.".to_owned()),
            Err(e) => Some(format!("⚠️ Cannot retry: {e}")),
        }
    }

    async fn cmd_undo(&self, key: &SessionKey, args: &str) -> String {
        let n = args.trim().parse::<usize>().unwrap_or(1).max(1);
        match self.rewind(key, n).await {
            Ok(Some(_)) if n == 1 => {
                "↩️ Removed the last exchange from this conversation.".to_owned()
            }
            Ok(Some(_)) => format!("↩️ Removed the last {n} exchanges from this conversation."),
            Ok(None) => "There is nothing to undo.".to_owned(),
            Err(e) => format!("⚠️ Cannot undo: {e}"),
        }
    }

    async fn cmd_compress(&self, key: &SessionKey, event: &MessageEvent) -> String {
        let routed = match self.inner.router.current(key, &event.source).await {
            Ok(r) => r,
            Err(e) => return format!("⚠️ Cannot open the conversation: {e}"),
        };
        self.inner.session_hooks(key, &event.source, &routed);
        match self.inner.agent.compress_session(&routed.handle).await {
            Ok(true) => "🗜 Compressed the conversation: older turns are summarised.".to_owned(),
            Ok(false) => "The conversation is too short to compress.".to_owned(),
            Err(e) => format!("⚠️ Could not compress: {e}"),
        }
    }

    fn cmd_model(&self, args: &str) -> String {
        let model = self.inner.agent.parts().provider.model().to_owned();
        if args.is_empty() {
            format!("Model: {model}")
        } else {
            format!(
                "Model: {model}. Switching models from chat is not supported; set model.default in {} and restart the gateway.",
                self.inner.home.config_file().display()
            )
        }
    }

    async fn cmd_usage(&self, key: &SessionKey) -> String {
        match self.inner.router.peek(key).await {
            Ok(Some(s)) => format!(
                "This conversation: {} messages; tokens in {}, out {}, cache read {}, cache write {}, reasoning {}.",
                self.shown_count(&s.id).await,
                s.input_tokens,
                s.output_tokens,
                s.cache_read_tokens,
                s.cache_write_tokens,
                s.reasoning_tokens
            ),
            Ok(None) => "No conversation yet.".to_owned(),
            Err(e) => format!("⚠️ Cannot read usage: {e}"),
        }
    }

    async fn cmd_whoami(&self, key: &SessionKey, event: &MessageEvent) -> String {
        let s = &event.source;
        format!(
            "Platform: {}\nChat: {} ({})\nYour id: {}\nName: {}\nConversation key: {}",
            s.platform,
            s.chat_id,
            s.chat_type,
            s.user_id.as_deref().unwrap_or("(anonymous)"),
            s.user_name.as_deref().unwrap_or("(unknown)"),
            key
        )
    }

    fn cmd_sethome(&self, event: &MessageEvent) -> String {
        let s = &event.source;
        let var = |suffix| talaria_core::config::platform_var(&s.platform, suffix);
        let vars = vec![
            (var("HOME_CHANNEL"), s.chat_id.clone()),
            (
                var("HOME_CHANNEL_THREAD_ID"),
                s.thread_id.clone().unwrap_or_default(),
            ),
        ];
        match crate::dotenv::upsert(&self.inner.home.dotenv_file(), &vars) {
            Ok(()) => {
                // Live at once: `send_message` and `talaria send` to the
                // bare platform go here from now on, without a restart.
                self.inner.delivery.homes().set(
                    &s.platform,
                    crate::target::HomeChannel {
                        chat_id: s.chat_id.clone(),
                        thread_id: s.thread_id.clone(),
                    },
                );
                format!("🏠 This chat is now the home channel for {}.", s.platform)
            }
            Err(e) => format!("⚠️ Cannot save the home channel: {e}"),
        }
    }
}

impl Inner {
    /// Fires `event` at the hooks, building the payload only when some
    /// hook subscribes to it. Never waits: see [`Hooks::emit`].
    fn hook(&self, event: &str, payload: impl FnOnce() -> serde_json::Value) {
        if self.hooks.wants(event) {
            self.hooks.emit(event, payload());
        }
    }

    /// `session:end` and `session:start` for what routing just did.
    fn session_hooks(&self, key: &SessionKey, source: &SessionSource, routed: &Routed) {
        let Some(reason) = routed.started else {
            return;
        };
        if let Some(ended) = &routed.ended {
            self.hook(events::SESSION_END, || {
                serde_json::json!({
                    "platform": source.platform,
                    "session_key": hook_key(key),
                    "session_id": ended,
                    "reason": reason.as_str(),
                })
            });
        }
        self.hook(events::SESSION_START, || {
            serde_json::json!({
                "platform": source.platform,
                "session_key": hook_key(key),
                "session_id": routed.handle.id,
                "user_id_hash": user_hash(source),
                "reason": reason.as_str(),
            })
        });
    }

    fn lanes(&self) -> MutexGuard<'_, HashMap<SessionKey, Lane>> {
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a busy acknowledgement may go to `key` now (at most one per
    /// [`ACK_COOLDOWN`]); if so, starts the cooldown.
    fn ack_due(&self, key: &SessionKey) -> bool {
        let mut acks = self.acks.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if acks.len() >= MAX_ACK_ENTRIES {
            // Only entries still cooling down matter; the rest can go, so
            // the map stays as small as the chats acknowledged recently.
            acks.retain(|_, at| now.duration_since(*at) < ACK_COOLDOWN);
        }
        let due = acks
            .get(key)
            .is_none_or(|at| now.duration_since(*at) >= ACK_COOLDOWN);
        if due {
            acks.insert(key.clone(), now);
        }
        due
    }

    /// Installs a new run on the lane; returns its generation and token.
    fn new_run(&self, lane: &mut Lane) -> (u64, CancellationToken) {
        let generation = self.generations.fetch_add(1, Ordering::SeqCst);
        let cancel = CancellationToken::new();
        lane.run = Some(Run {
            generation,
            cancel: cancel.clone(),
            started: Instant::now(),
            discard: false,
            state: None,
            tool: Arc::new(Mutex::new(None)),
        });
        self.board.touch();
        (generation, cancel)
    }
}

/// Adds a follow-up to the lane's queue: merged into the last waiting
/// message from the same sender when both allow it (queue mode's "one next
/// turn"), otherwise appended, and dropped when the queue is full.
fn enqueue(lane: &mut Lane, item: Queued) -> Option<Queued> {
    if let Some(last) = lane.queue.back_mut()
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
    if lane.queue.len() >= MAX_QUEUED {
        tracing::warn!("follow-up queue full; message dropped");
        return Some(item);
    }
    lane.queue.push_back(item);
    None
}

/// The id an event is deduplicated (and its owed turn named) by: message
/// ids are unique per chat on most platforms, so the chat is part of it.
fn inbound_id(event: &MessageEvent) -> Option<String> {
    let id = event.message_id.as_ref()?;
    Some(format!("{}\u{1f}{id}", event.source.chat_id))
}

fn approval_from_args(args: &str) -> ApprovalDecision {
    match args.trim().to_ascii_lowercase().as_str() {
        "session" => ApprovalDecision::Session,
        "always" | "permanent" => ApprovalDecision::Always,
        _ => ApprovalDecision::Once,
    }
}

/// The session key as hooks see it: hashed like every other platform id,
/// since the key itself carries the chat (and maybe user) id. Stable, so a
/// hook can still tell conversations apart and follow one.
fn hook_key(key: &SessionKey) -> String {
    talaria_core::ids::hash_id("key", key.as_str())
}

/// Text as hooks (and quoted replies in prompts) get it: the first 500
/// characters.
fn clip(text: &str) -> String {
    text.chars().take(500).collect()
}

/// The sender as prompts and hooks see it: hashed, since raw platform ids
/// never leave the process.
fn user_hash(source: &SessionSource) -> Option<String> {
    source
        .user_id
        .as_deref()
        .map(|u| talaria_core::ids::hash_id("user", u))
}

/// The text the agent sees: the message, with what it replies to and its
/// attachments, and in shared chats who wrote it (the platform id hashed:
/// raw ids never enter a prompt).
fn prompt_text(event: &MessageEvent) -> String {
    let mut text = String::new();
    let s: &SessionSource = &event.source;
    if s.chat_type.is_shared() {
        let who = user_hash(s).unwrap_or_else(|| "anonymous".to_owned());
        match &s.user_name {
            Some(name) => text.push_str(&format!("[{name} · {who}] ")),
            None => text.push_str(&format!("[{who}] ")),
        }
    }
    if let Some(quoted) = &event.reply_to_text {
        text.push_str(&format!("(replying to: \"{}\")\n", clip(quoted)));
    }
    text.push_str(&event.text);
    if !event.attachments.is_empty() {
        text.push_str(&format!(
            "\n[attachments: {}]",
            event.attachments.join(", ")
        ));
    }
    text
}

/// Tracks the running tool for `/status`, and feeds the streaming preview
/// when there is one.
struct RunObserver {
    tool: Arc<Mutex<Option<String>>>,
    preview: Option<PreviewSink>,
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
}

/// Approvals and questions for one chat: asked in the chat, answered with
/// `/approve`, `/deny` or the next plain message.
struct ChatInteraction {
    runner: Runner,
    key: SessionKey,
    to: Address,
}

#[async_trait]
impl Interaction for ChatInteraction {
    async fn approve(&self, request: &ApprovalRequest) -> ApprovalDecision {
        let inner = &self.runner.inner;
        let (tx, rx) = oneshot::channel();
        inner.lanes().entry(self.key.clone()).or_default().approval = Some(tx);
        let timeout = Duration::from_secs(inner.config.approvals.timeout_secs.max(1));
        let text = format!(
            "⚠️ The agent wants to run a command that needs your approval:\n\n{}\n\nWhy: {}\n\nReply /approve to run it once, /approve session to allow it for this conversation, /approve always to allow it from now on, or /deny. Without an answer in {}s it is denied.",
            request.command,
            request.reason,
            timeout.as_secs()
        );
        inner.delivery.notify(&self.to, &text).await;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(decision)) => decision,
            Ok(Err(_)) => ApprovalDecision::Deny,
            Err(_) => {
                if let Some(lane) = inner.lanes().get_mut(&self.key) {
                    lane.approval = None;
                }
                inner
                    .delivery
                    .notify(&self.to, "⌛ No answer in time; the command was not run.")
                    .await;
                ApprovalDecision::TimedOut
            }
        }
    }

    async fn clarify(&self, request: &ClarifyRequest) -> Option<String> {
        let inner = &self.runner.inner;
        let (tx, rx) = oneshot::channel();
        inner.lanes().entry(self.key.clone()).or_default().clarify = Some(tx);
        let mut text = format!("❓ {}", request.question);
        for (i, choice) in request.choices.iter().enumerate() {
            text.push_str(&format!("\n{}. {choice}", i + 1));
        }
        inner.delivery.notify(&self.to, &text).await;
        let answer = tokio::time::timeout(CLARIFY_TIMEOUT, rx).await.ok()?.ok()?;
        // A number picks a choice.
        let picked = answer
            .trim()
            .parse::<usize>()
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| request.choices.get(i).cloned());
        Some(picked.unwrap_or(answer))
    }
}
