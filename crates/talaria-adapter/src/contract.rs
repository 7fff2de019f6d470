//! The adapter contract: what a platform connector provides to the gateway
//! and what the gateway provides to it.
//!
//! An adapter owns everything platform-specific: the wire protocol, the
//! payload types, formatting and escaping, rate limits. It turns inbound
//! traffic into [`MessageEvent`]s handed to an [`Inbox`], and sends plain
//! text the gateway has already split to fit [`Adapter::limits`].

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::capabilities::Capabilities;
// Part of the declaration now; still named here, where adapters and the
// gateway have always found them.
pub use crate::capabilities::{LengthUnit, MessageLimits};
use crate::event::MessageEvent;
use crate::media::{Download, DownloadError, OutboundFile};

/// One message to send. The text already fits the platform's limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboundMessage {
    /// The platform's chat (or channel, room, address) to post in.
    pub chat_id: String,
    /// Thread or forum topic to post in.
    pub thread_id: Option<String>,
    /// The message this one answers, when the platform can show that.
    pub reply_to: Option<String>,
    /// The text to send, plain; the adapter formats it for its platform.
    pub text: String,
    /// Answers the user may pick instead of typing them (an approval's
    /// `/approve`, `/deny`). The text names them too, so a platform
    /// without buttons ignores this; one with buttons shows one per
    /// choice, and a click arrives as an ordinary message whose text is
    /// the choice's command, from the user who clicked, in this chat.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<Choice>,
}

/// One answer offered with a message (see [`OutboundMessage::choices`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Choice {
    /// What the button says.
    pub label: String,
    /// What a click sends, as if the user had typed it (`/approve`).
    pub command: String,
}

impl Choice {
    /// A choice labelled `label` that sends `command`.
    pub fn new(label: impl Into<String>, command: impl Into<String>) -> Choice {
        Choice {
            label: label.into(),
            command: command.into(),
        }
    }
}

/// What the platform returned for a sent message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SentMessage {
    /// The platform's id of the new message, for later edits.
    pub message_id: Option<String>,
}

/// Why a send did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The platform is not connected (or its API is unreachable): nothing
    /// was sent, and trying again later will probably work. The ledger
    /// spends no attempt on this.
    #[error("{0} is not reachable right now")]
    Unavailable(String),
    /// The platform asked us to slow down; the adapter already waited and
    /// retried as long as it sensibly could.
    #[error("rate limited; retry after {0:?}")]
    RateLimited(Duration),
    /// The platform refused this message for good (unknown chat, blocked by
    /// the user, too long): retrying cannot help, so the ledger abandons
    /// the reply at once with this reason.
    #[error("refused: {0}")]
    Rejected(String),
    /// The request failed in a way that may pass on a retry (5xx).
    #[error("failed: {0}")]
    Transient(String),
    /// The request timed out after it was sent: the message may or may not
    /// have arrived.
    #[error("timed out; the message may have been delivered: {0}")]
    Ambiguous(String),
}

/// Why an adapter's connection ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdapterError {
    /// Connection lost or refused: the supervisor reconnects with backoff.
    #[error("{0}")]
    Disconnected(String),
    /// Misconfiguration or revoked credentials: reconnecting cannot help
    /// until the operator acts. The supervisor still retries, slowly.
    #[error("{0}")]
    Fatal(String),
}

/// A connector's health, as `talaria gateway status` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Liveness {
    /// Connecting (first time or after a backoff).
    Connecting,
    /// Connected and receiving.
    Live,
    /// Connected, but recent requests failed.
    Degraded,
    /// Waiting before the next reconnect attempt.
    Backoff,
    /// Not connected because another node of the deployment holds this
    /// platform's credential; ready to take over if that node dies.
    Standby,
}

impl fmt::Display for Liveness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Liveness::Connecting => "connecting",
            Liveness::Live => "live",
            Liveness::Degraded => "degraded",
            Liveness::Backoff => "backoff",
            Liveness::Standby => "standby",
        })
    }
}

/// Where an adapter hands inbound events to the runner.
///
/// [`Inbox::submit`] returns once the runner has taken the event: recorded
/// in the store as owed an answer (or recognised as a repeat, or refused).
/// An adapter that acknowledges receipt to its platform (Telegram's update
/// offset, Slack's envelope ack) does so only after it returns `Ok`, so a
/// gateway that dies a moment later still owes the message and answers it
/// after a restart; on `Err` it must not acknowledge, and the platform
/// delivers the message again.
#[derive(Debug, Clone)]
pub struct Inbox {
    tx: InboxTx,
}

#[derive(Debug, Clone)]
enum InboxTx {
    /// The gateway's: each event waits for the runner's [`Admission`].
    Admitting(mpsc::Sender<Admit>),
    /// A bare queue, for adapter tests that read events themselves:
    /// queued counts as accepted.
    Plain(mpsc::Sender<MessageEvent>),
}

/// The runner is gone (the gateway is shutting down), or it did not take
/// the event: the adapter must not acknowledge it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the gateway is shutting down")]
pub struct InboxClosed;

/// What the runner did with an event handed to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Taken: a message is now owed an answer (or a command was run).
    Accepted,
    /// The same message was taken before (by this node or another, before
    /// or after a restart); nothing more happens.
    Duplicate,
    /// Dropped on purpose: an unauthorized sender, an unusable chat id.
    /// Delivering it again would not change that.
    Refused,
}

/// An event on its way to the runner, with the way back for its
/// [`Admission`].
#[derive(Debug)]
pub struct Admit {
    /// The event the adapter handed over.
    pub event: MessageEvent,
    reply: oneshot::Sender<Admission>,
}

impl Admit {
    /// Tells the adapter what became of the event.
    pub fn answer(self, admission: Admission) -> MessageEvent {
        let _ = self.reply.send(admission);
        self.event
    }

    /// Splits the event from its reply, so the runner can answer once it
    /// has taken the event and before it works on it.
    pub fn into_parts(self) -> (MessageEvent, AdmitReply) {
        (self.event, AdmitReply(self.reply))
    }
}

/// The way back to the adapter waiting in [`Inbox::admit`]. Dropping it
/// unanswered tells the adapter the event was not taken.
#[derive(Debug)]
pub struct AdmitReply(oneshot::Sender<Admission>);

impl AdmitReply {
    /// Tells the waiting adapter what became of its event.
    pub fn send(self, admission: Admission) {
        let _ = self.0.send(admission);
    }
}

impl Inbox {
    /// A bare inbox and the receiving end: events are accepted once queued.
    /// For adapter tests that read the events themselves.
    pub fn channel(capacity: usize) -> (Inbox, mpsc::Receiver<MessageEvent>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (
            Inbox {
                tx: InboxTx::Plain(tx),
            },
            rx,
        )
    }

    /// The gateway's inbox: every event waits for the runner's admission
    /// (`Runner::serve` reads the receiving end).
    pub fn admitting(capacity: usize) -> (Inbox, mpsc::Receiver<Admit>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (
            Inbox {
                tx: InboxTx::Admitting(tx),
            },
            rx,
        )
    }

    /// Hands an event to the runner and waits until it is taken, a repeat
    /// or refused. `Err` when it was not taken: the runner is gone or
    /// stopping.
    pub async fn admit(&self, event: MessageEvent) -> Result<Admission, InboxClosed> {
        match &self.tx {
            InboxTx::Plain(tx) => tx
                .send(event)
                .await
                .map(|()| Admission::Accepted)
                .map_err(|_| InboxClosed),
            InboxTx::Admitting(tx) => {
                let (reply, answer) = oneshot::channel();
                tx.send(Admit { event, reply })
                    .await
                    .map_err(|_| InboxClosed)?;
                answer.await.map_err(|_| InboxClosed)
            }
        }
    }

    /// [`Inbox::admit`] for adapters that only need to know whether they
    /// may acknowledge the event: `Ok` for taken, repeated and refused.
    pub async fn submit(&self, event: MessageEvent) -> Result<(), InboxClosed> {
        self.admit(event).await.map(|_| ())
    }
}

/// Reports an adapter's liveness to the supervisor.
#[derive(Debug, Clone)]
pub struct LivenessReporter {
    tx: watch::Sender<Liveness>,
}

impl LivenessReporter {
    /// A reporter and the receiver that observes it.
    pub fn new() -> (LivenessReporter, watch::Receiver<Liveness>) {
        let (tx, rx) = watch::channel(Liveness::Connecting);
        (LivenessReporter { tx }, rx)
    }

    /// Reports `state`; observers are woken only when it changes.
    pub fn set(&self, state: Liveness) {
        self.tx.send_if_modified(|current| {
            let changed = *current != state;
            *current = state;
            changed
        });
    }

    /// The state last reported.
    pub fn get(&self) -> Liveness {
        *self.tx.borrow()
    }
}

/// What [`Adapter::run`] is given.
#[derive(Debug, Clone)]
pub struct AdapterContext {
    /// Where the adapter hands inbound events.
    pub inbox: Inbox,
    /// Where the adapter reports whether it is connected.
    pub liveness: LivenessReporter,
    /// Fires when the gateway stops; `run` then returns `Ok(())` promptly.
    pub shutdown: CancellationToken,
}

/// A platform connector.
#[async_trait]
pub trait Adapter: Send + Sync + 'static {
    /// The platform's name in keys and config (`telegram`).
    fn platform(&self) -> &'static str;

    /// What the platform can do and what its ids are. The gateway decides
    /// from this, never from the platform's name.
    fn capabilities(&self) -> Capabilities;

    /// The largest message the platform accepts.
    fn limits(&self) -> MessageLimits {
        self.capabilities().limits
    }

    /// For platforms that allow one reader per credential: the lock scope
    /// and the credential, so two gateways on one machine cannot both use
    /// it. The credential is hashed before it touches the disk.
    fn credential(&self) -> Option<(&'static str, String)> {
        None
    }

    /// Connects and receives until `ctx.shutdown` fires (then `Ok`) or the
    /// connection fails (then `Err`; the supervisor reconnects with
    /// backoff). Sets [`Liveness::Live`] once receiving.
    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError>;

    /// Sends one message (already within [`Adapter::limits`]).
    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError>;

    /// Opens an attachment this adapter described as
    /// [`AttachmentSource::Remote`](crate::media::AttachmentSource::Remote)
    /// with `locator`. The gateway streams the body into the media cache.
    async fn download(&self, locator: &str) -> Result<Download, DownloadError> {
        let _ = locator;
        Err(DownloadError::Unsupported)
    }

    /// Sends one file (a kind in [`Capabilities::sends`]). A platform that
    /// cannot carry it sends [`OutboundFile::fallback_text`] instead, which
    /// is what this default does.
    async fn send_file(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        let message = OutboundMessage {
            chat_id: file.chat_id.clone(),
            thread_id: file.thread_id.clone(),
            reply_to: file.reply_to.clone(),
            text: file.fallback_text(self.platform()),
            choices: Vec::new(),
        };
        self.send(&message).await
    }

    /// Whether this adapter authenticates every event it submits itself
    /// ([`Capabilities::verifies_senders`]).
    fn verifies_senders(&self) -> bool {
        self.capabilities().verifies_senders
    }

    /// Whether answers should be shown growing while they stream, by
    /// editing one message (the gateway's streaming preview). Only adapters that can
    /// [`Adapter::edit`] should say yes, and only when configured to.
    fn streaming_edits(&self) -> bool {
        false
    }

    /// Sends the first message of a streaming preview (the text so far),
    /// which [`Adapter::edit`] then grows. Platforms whose streamed answers
    /// are a message kind of their own (DingTalk's AI cards) open one here;
    /// the default sends an ordinary message.
    async fn start_preview(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        self.send(message).await
    }

    /// Ends a streaming preview with its last text: the answer, or, when
    /// `failed`, what streamed before the turn stopped. Platforms that
    /// mark a streamed message finished (DingTalk's AI cards) do so here,
    /// once; the default is one more [`Adapter::edit`].
    async fn finish_preview(
        &self,
        chat_id: &str,
        message_id: &str,
        text: &str,
        failed: bool,
    ) -> Result<(), SendError> {
        let _ = failed;
        self.edit(chat_id, message_id, text).await
    }

    /// Replaces the text of a message sent earlier. Platforms that cannot
    /// edit report [`SendError::Rejected`].
    async fn edit(&self, chat_id: &str, message_id: &str, text: &str) -> Result<(), SendError> {
        let _ = (chat_id, message_id, text);
        Err(SendError::Rejected(format!(
            "{} messages cannot be edited",
            self.platform()
        )))
    }

    /// Shows that the bot is working on an answer. Best effort.
    async fn typing(&self, chat_id: &str, thread_id: Option<&str>) -> Result<(), SendError> {
        let _ = (chat_id, thread_id);
        Ok(())
    }

    /// Asks the platform whom the configured credentials belong to, with
    /// one request and without receiving anything: `talaria doctor`'s
    /// credential check. `Ok` names the account (`@talaria_bot`); a
    /// [`AdapterError::Fatal`] means the platform refused the credentials,
    /// a [`AdapterError::Disconnected`] that it could not be reached.
    /// `None` (the default): the platform has no such question, and its
    /// credentials are first tried when the gateway connects.
    async fn whoami(&self) -> Option<Result<String, AdapterError>> {
        None
    }
}
