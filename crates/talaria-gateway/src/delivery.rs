//! Sending text to chats: splitting to the platform's limit, retrying what
//! may pass on a retry, and routing final replies through the ledger.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use talaria_adapter::{Choice, OutboundFile};

use crate::adapter::{Adapter, OutboundMessage, SendError};
use crate::event::MessageEvent;
use crate::ledger::{Attempt, Claimed, Ledger, RECOVERY_MARKER};
use crate::parts::{FileRoots, Part, answer_parts};
use crate::target::{HomeChannels, Target, TargetError};

/// Retries of a part that failed with a transient error (5xx). Timeouts
/// are never retried: the first request may have landed.
const TRANSIENT_RETRIES: u32 = 2;

/// Where a message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    /// The adapter's platform name.
    pub platform: String,
    /// The chat on that platform.
    pub chat_id: String,
    /// The thread within the chat, when the message goes to one.
    pub thread_id: Option<String>,
    /// Anchors the first part as a reply to this message.
    pub reply_to: Option<String>,
}

impl Address {
    /// Back to where `event` came from, replying to it.
    pub fn reply_to(event: &MessageEvent) -> Address {
        Address {
            platform: event.source.platform.clone(),
            chat_id: event.source.chat_id.clone(),
            thread_id: event.source.thread_id.clone(),
            reply_to: event.message_id.clone(),
        }
    }
}

/// The pseudo-platform of [`Target::Local`]: a file in the home instead of
/// a chat. Its "chat id" names the folder under `cron/output/`.
pub const LOCAL: &str = "local";

/// The folder `local` deliveries go to when nothing more specific is named.
const LOCAL_DEFAULT_FOLDER: &str = "misc";

/// The connected adapters, the home channels and the ledger.
#[derive(Clone)]
pub struct Delivery {
    adapters: Arc<HashMap<String, Arc<dyn Adapter>>>,
    ledger: Option<Ledger>,
    homes: Arc<HomeChannels>,
    /// Where `local` deliveries are written; `None` refuses them.
    local_dir: Option<PathBuf>,
    /// The folders an answer's `MEDIA:` lines may name files in.
    file_roots: Arc<FileRoots>,
    transient_backoff: Duration,
}

/// How a send of an answer's parts starts and reports: the parts already
/// confirmed are skipped, and each one sent is recorded in the ledger
/// before the next goes, so a crash re-sends only what did not go out.
#[derive(Clone, Copy, Default)]
struct Progress<'a> {
    /// Parts confirmed by an earlier attempt.
    skip: usize,
    /// The attempt whose progress is recorded.
    attempt: Option<(&'a Ledger, &'a Attempt)>,
    /// Prefix the first part sent with the recovery line.
    marker: bool,
}

/// Why a target cannot be delivered to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The target text does not parse.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// No adapter of this platform runs in this gateway.
    #[error("{0} is not connected to this gateway (is it configured and enabled?)")]
    NotConnected(String),
    #[error(
        "{platform} has no home channel: send /sethome in the chat that should be it, or set {var} in the .env file"
    )]
    /// `home` was asked for on a platform that has no home channel yet.
    NoHome {
        /// The platform asked for.
        platform: String,
        /// The environment variable that would set its home channel.
        var: String,
    },
}

impl Delivery {
    /// Delivery over `adapters` (one per platform); with a `ledger`,
    /// sends are recorded there so a crash does not lose them.
    pub fn new(adapters: Vec<Arc<dyn Adapter>>, ledger: Option<Ledger>) -> Delivery {
        Delivery {
            adapters: Arc::new(
                adapters
                    .into_iter()
                    .map(|a| (a.platform().to_owned(), a))
                    .collect(),
            ),
            ledger,
            homes: Arc::default(),
            local_dir: None,
            file_roots: Arc::default(),
            transient_backoff: Duration::from_secs(2),
        }
    }

    /// Lets answers send files from these folders (`MEDIA:<path>` lines):
    /// the workspace, the media cache, scheduled jobs' output.
    pub fn with_file_roots(mut self, roots: FileRoots) -> Delivery {
        self.file_roots = Arc::new(roots);
        self
    }

    /// Uses these home channels for bare `<platform>` targets.
    pub fn with_homes(mut self, homes: Arc<HomeChannels>) -> Delivery {
        self.homes = homes;
        self
    }

    /// Writes `local` deliveries under `dir` (normally
    /// `$TALARIA_HOME/cron/output`).
    pub fn with_local_dir(mut self, dir: PathBuf) -> Delivery {
        self.local_dir = Some(dir);
        self
    }

    /// The connected platforms that take messages, sorted. Sources that
    /// only submit (a webhook) are left out.
    pub fn platforms(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .adapters
            .values()
            .filter(|a| !a.verifies_senders())
            .map(|a| a.platform().to_owned())
            .collect();
        names.sort();
        names
    }

    /// The home channels, as set by `/sethome` or the environment.
    pub(crate) fn homes(&self) -> &Arc<HomeChannels> {
        &self.homes
    }

    /// Where `target` points. `origin` is where the request came from, if
    /// anywhere; `origin` without one means `local`.
    pub fn resolve(
        &self,
        target: &Target,
        origin: Option<&Address>,
    ) -> Result<Address, ResolveError> {
        let local = || Address {
            platform: LOCAL.to_owned(),
            chat_id: LOCAL_DEFAULT_FOLDER.to_owned(),
            thread_id: None,
            reply_to: None,
        };
        match target {
            Target::Origin => Ok(origin.cloned().unwrap_or_else(local)),
            Target::Local => Ok(local()),
            Target::Home { platform } => {
                self.connected(platform)?;
                let home = self
                    .homes
                    .get(platform)
                    .ok_or_else(|| ResolveError::NoHome {
                        platform: platform.clone(),
                        var: talaria_core::config::platform_var(platform, "HOME_CHANNEL"),
                    })?;
                Ok(Address {
                    platform: platform.clone(),
                    chat_id: home.chat_id,
                    thread_id: home.thread_id,
                    reply_to: None,
                })
            }
            Target::Chat {
                platform,
                chat_id,
                thread_id,
            } => {
                self.connected(platform)?;
                Ok(Address {
                    platform: platform.clone(),
                    chat_id: chat_id.clone(),
                    thread_id: thread_id.clone(),
                    reply_to: None,
                })
            }
        }
    }

    fn connected(&self, platform: &str) -> Result<(), ResolveError> {
        if self.adapters.contains_key(platform) {
            Ok(())
        } else {
            Err(ResolveError::NotConnected(platform.to_owned()))
        }
    }

    /// Where the answer to `event` goes: its reply target when it names one,
    /// else back to where it came from. A reply target that cannot be used
    /// (malformed, a platform not connected) falls back to `local`, so the
    /// answer is kept rather than lost.
    pub fn answer_address(&self, event: &MessageEvent) -> Address {
        let Some(target) = &event.reply_target else {
            return Address::reply_to(event);
        };
        let resolved = target
            .parse::<Target>()
            .map_err(ResolveError::from)
            .and_then(|t| self.resolve(&t, None));
        match resolved {
            Ok(to) => to,
            Err(e) => {
                tracing::warn!(platform = %event.source.platform, error = %e, "the reply target is unusable; the answer is written to a local file instead");
                self.resolve(&Target::Local, None)
                    .unwrap_or_else(|_| Address::reply_to(event))
            }
        }
    }

    /// Sends a message owed to someone that is not a reply (`send_message`,
    /// `talaria send`): recorded in the ledger like a final reply, under a
    /// key naming its destination and a fresh reference, so two identical
    /// sends stay two obligations.
    pub async fn deliver_message(&self, to: &Address, text: &str) -> Result<(), SendError> {
        let key = format!("outbound:{}:{}", to.platform, to.chat_id);
        let reference = format!("{:016x}", rand::random::<u64>());
        self.deliver_reply(&key, &reference, to, text, None).await
    }

    /// Writes a `local` delivery to `<local_dir>/<folder>/<timestamp>.md`.
    async fn write_local(&self, folder: &str, text: &str) -> Result<(), SendError> {
        let Some(dir) = &self.local_dir else {
            return Err(SendError::Rejected(
                "local delivery is not set up here".into(),
            ));
        };
        talaria_core::ids::validate_path_component(folder)
            .map_err(|e| SendError::Rejected(format!("unusable local folder name: {e}")))?;
        let dir = dir.join(folder);
        let now = chrono::Utc::now();
        let path = dir.join(format!("{}.md", now.format("%Y%m%d_%H%M%S_%6f")));
        let body = format!("<!-- delivered {} -->\n\n{text}\n", now.to_rfc3339());
        tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&dir)?;
            std::fs::write(&path, body)
        })
        .await
        .map_err(|e| SendError::Transient(e.to_string()))?
        .map_err(|e| SendError::Transient(format!("cannot write the local delivery: {e}")))
    }

    /// The adapter of `platform`, when it runs in this gateway.
    pub fn adapter(&self, platform: &str) -> Option<&Arc<dyn Adapter>> {
        self.adapters.get(platform)
    }

    /// The ledger sends are recorded in; `None` when not recording.
    pub(crate) fn ledger(&self) -> Option<&Ledger> {
        self.ledger.as_ref()
    }

    /// Sends `text`, split to fit, part by part, with the files its
    /// `MEDIA:` lines name. Only the first part is anchored as a reply.
    pub async fn send_text(&self, to: &Address, text: &str) -> Result<(), SendError> {
        self.send_over(to, text, None, Progress::default(), &[])
            .await
    }

    /// Like [`Delivery::send_text`], but the first part replaces the text of
    /// the message `edit` (a streaming preview) when given. If that edit
    /// fails, the first part is sent as a new message instead. `choices`
    /// go with the last text part: the question they answer ends there.
    async fn send_over(
        &self,
        to: &Address,
        text: &str,
        edit: Option<&str>,
        progress: Progress<'_>,
        choices: &[Choice],
    ) -> Result<(), SendError> {
        if to.platform == LOCAL {
            return self.write_local(&to.chat_id, text).await;
        }
        let adapter = self
            .adapter(&to.platform)
            .ok_or_else(|| SendError::Unavailable(format!("{} is not configured", to.platform)))?;
        let limits = adapter.limits();
        let parts = answer_parts(text, &self.file_roots, limits);
        let first = progress.skip;
        if first >= parts.len() && first > 0 {
            return Ok(());
        }
        let last_text = parts.iter().rposition(|p| matches!(p, Part::Text(_)));
        if progress.marker {
            // Said on its own when it cannot lead the first part: a part
            // must keep its length, or the parts counted as sent would no
            // longer be the parts the answer is cut into.
            let fits = matches!(parts.get(first), Some(Part::Text(t))
                if limits.unit.measure(t) + limits.unit.measure(RECOVERY_MARKER) <= limits.max_len);
            if !fits {
                self.send_message(adapter.as_ref(), to, RECOVERY_MARKER.trim_end(), None, &[])
                    .await?;
            }
        }
        for (i, part) in parts.into_iter().enumerate().skip(first) {
            let reply_to = if i == first {
                to.reply_to.clone()
            } else {
                None
            };
            match part {
                Part::Text(mut t) => {
                    if i == first && progress.marker && {
                        let n = limits.unit.measure(&t) + limits.unit.measure(RECOVERY_MARKER);
                        n <= limits.max_len
                    } {
                        t.insert_str(0, RECOVERY_MARKER);
                    }
                    let edited = match (edit, i) {
                        (Some(id), 0) => {
                            match adapter.finish_preview(&to.chat_id, id, &t, false).await {
                                Ok(()) => true,
                                Err(e) => {
                                    tracing::debug!(error = %e, "could not turn the preview into the answer; sending it anew");
                                    false
                                }
                            }
                        }
                        _ => false,
                    };
                    if !edited {
                        let choices = if Some(i) == last_text { choices } else { &[] };
                        self.send_message(adapter.as_ref(), to, &t, reply_to, choices)
                            .await?;
                    }
                }
                Part::File(f) => {
                    let file = OutboundFile {
                        chat_id: to.chat_id.clone(),
                        thread_id: to.thread_id.clone(),
                        reply_to,
                        path: f.path,
                        kind: f.kind,
                        mime: f.mime,
                        name: f.name,
                        caption: None,
                    };
                    self.retrying(|| adapter.send_file(&file)).await?;
                }
            }
            if let Some((ledger, attempt)) = progress.attempt {
                ledger.progress(attempt, i + 1).await;
            }
        }
        Ok(())
    }

    /// Sends one text message, retrying what may pass on a retry.
    async fn send_message(
        &self,
        adapter: &dyn Adapter,
        to: &Address,
        text: &str,
        reply_to: Option<String>,
        choices: &[Choice],
    ) -> Result<(), SendError> {
        let message = OutboundMessage {
            chat_id: to.chat_id.clone(),
            thread_id: to.thread_id.clone(),
            reply_to,
            text: text.to_owned(),
            choices: choices.to_vec(),
        };
        self.retrying(|| adapter.send(&message)).await
    }

    /// Runs `send` until it succeeds, fails for good, or has failed
    /// transiently more than [`TRANSIENT_RETRIES`] times.
    async fn retrying<F, Fut>(&self, mut send: F) -> Result<(), SendError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<crate::adapter::SentMessage, SendError>>,
    {
        let mut retries = 0;
        loop {
            match send().await {
                Ok(_) => return Ok(()),
                Err(SendError::Transient(e)) if retries < TRANSIENT_RETRIES => {
                    retries += 1;
                    let wait = self.transient_backoff * 2u32.pow(retries - 1);
                    tracing::debug!(error = %e, ?wait, "send failed; retrying");
                    tokio::time::sleep(wait).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends something not owed through the ledger (command replies,
    /// notices); a failure is logged.
    pub async fn notify(&self, to: &Address, text: &str) {
        self.notify_with_choices(to, text, &[]).await;
    }

    /// [`Delivery::notify`] for a question with answers the user may pick
    /// (buttons, where the platform has them; the text must name them
    /// too, for platforms that have none).
    pub async fn notify_with_choices(&self, to: &Address, text: &str, choices: &[Choice]) {
        if let Err(e) = self
            .send_over(to, text, None, Progress::default(), choices)
            .await
        {
            tracing::warn!(platform = %to.platform, error = %e, "could not send a notice");
        }
    }

    /// Sends a final reply: recorded in the ledger first, marked when the
    /// send ends. A ledger failure never stops the send. `preview` is the
    /// id of a streaming preview the answer should replace, if any.
    pub async fn deliver_reply(
        &self,
        session_key: &str,
        message_ref: &str,
        to: &Address,
        text: &str,
        preview: Option<&str>,
    ) -> Result<(), SendError> {
        self.deliver_reply_settling(session_key, message_ref, to, text, preview, &[])
            .await
    }

    /// [`Delivery::deliver_reply`] for a reply that ends owed turns (a
    /// message said lost): the ledger records it and settles them in one
    /// transaction, so a crash leaves either both or neither. Without a
    /// ledger the caller settles them.
    pub async fn deliver_reply_settling(
        &self,
        session_key: &str,
        message_ref: &str,
        to: &Address,
        text: &str,
        preview: Option<&str>,
        settles: &[String],
    ) -> Result<(), SendError> {
        let attempt = match &self.ledger {
            Some(ledger) => {
                ledger
                    .record(
                        session_key,
                        message_ref,
                        &to.platform,
                        &to.chat_id,
                        to.thread_id.as_deref(),
                        to.reply_to.as_deref(),
                        text,
                        settles,
                    )
                    .await
            }
            None => None,
        };
        self.send_attempt(attempt, to, text, preview).await
    }

    /// Sends a final reply whose obligation the turn's outbox already
    /// recorded with the answer (see [`Ledger::outbox`]): starts its
    /// attempt, sends, settles. A reply another node has taken over is
    /// left to it.
    pub async fn deliver_owed_reply(
        &self,
        session_key: &str,
        message_ref: &str,
        to: &Address,
        text: &str,
        preview: Option<&str>,
    ) -> Result<(), SendError> {
        let attempt = match &self.ledger {
            Some(ledger) => {
                let id = crate::ledger::obligation_id(session_key, message_ref, text);
                match ledger.begin(&id).await {
                    Ok(attempt) => attempt,
                    Err(()) => return Ok(()),
                }
            }
            None => None,
        };
        self.send_attempt(attempt, to, text, preview).await
    }

    /// Sends a reply and settles its attempt (when the ledger has one).
    async fn send_attempt(
        &self,
        attempt: Option<Attempt>,
        to: &Address,
        text: &str,
        preview: Option<&str>,
    ) -> Result<(), SendError> {
        let progress = Progress {
            attempt: self.ledger.as_ref().zip(attempt.as_ref()),
            ..Progress::default()
        };
        let result = self.send_over(to, text, preview, progress, &[]).await;
        if let (Some(ledger), Some(attempt)) = (&self.ledger, &attempt) {
            ledger.settle(attempt, &result).await;
        }
        if let Err(e) = &result {
            tracing::warn!(platform = %to.platform, error = %e, "could not deliver a reply");
        }
        result
    }

    /// Sends an obligation claimed by a sweep. The claim already started
    /// its attempt, so a crash now leaves a row the next sweep marks as a
    /// possible duplicate, and a second sweep leaves it alone while the
    /// attempt's lease lasts.
    pub async fn redeliver(&self, claimed: &Claimed) -> Result<(), SendError> {
        let Some(ledger) = &self.ledger else {
            return Ok(());
        };
        let row = &claimed.obligation;
        let to = Address {
            platform: row.platform.clone(),
            chat_id: row.chat_id.clone(),
            thread_id: row.thread_id.clone(),
            reply_to: row.reply_to.clone(),
        };
        let attempt = Attempt {
            id: row.id.clone(),
            number: claimed.attempt(),
        };
        let progress = Progress {
            skip: usize::try_from(row.parts_sent).unwrap_or(usize::MAX),
            attempt: Some((ledger, &attempt)),
            marker: claimed.needs_marker,
        };
        let result = self.send_over(&to, &row.content, None, progress, &[]).await;
        match &result {
            Ok(()) => {
                tracing::info!(id = %row.id, platform = %row.platform, "recovered an undelivered reply");
            }
            Err(e) => {
                tracing::warn!(id = %row.id, error = %e, "could not redeliver a recovered reply");
            }
        }
        ledger.settle(&attempt, &result).await;
        result
    }
}
