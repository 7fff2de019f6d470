//! Sending text to chats: splitting to the platform's limit, retrying what
//! may pass on a retry, and routing final replies through the ledger.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::adapter::{Adapter, OutboundMessage, SendError};
use crate::event::MessageEvent;
use crate::ledger::{Claimed, Ledger};
use crate::split::split_message;

/// Retries of a part that failed with a transient error (5xx). Timeouts
/// are never retried: the first request may have landed.
const TRANSIENT_RETRIES: u32 = 2;

/// Where a message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub platform: String,
    pub chat_id: String,
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

/// The connected adapters and the ledger.
#[derive(Clone)]
pub struct Delivery {
    adapters: Arc<HashMap<String, Arc<dyn Adapter>>>,
    ledger: Option<Ledger>,
    transient_backoff: Duration,
}

impl Delivery {
    pub fn new(adapters: Vec<Arc<dyn Adapter>>, ledger: Option<Ledger>) -> Delivery {
        Delivery {
            adapters: Arc::new(
                adapters
                    .into_iter()
                    .map(|a| (a.platform().to_owned(), a))
                    .collect(),
            ),
            ledger,
            transient_backoff: Duration::from_secs(2),
        }
    }

    /// Where the answer to `event` goes: its reply target when it names one,
    /// else back to where it came from.
    pub fn answer_address(&self, event: &MessageEvent) -> Address {
        Address::reply_to(event)
    }

    pub fn adapter(&self, platform: &str) -> Option<&Arc<dyn Adapter>> {
        self.adapters.get(platform)
    }

    pub fn adapters(&self) -> impl Iterator<Item = &Arc<dyn Adapter>> {
        self.adapters.values()
    }

    pub fn ledger(&self) -> Option<&Ledger> {
        self.ledger.as_ref()
    }

    /// Sends `text`, split to fit, part by part. Only the first part is
    /// anchored as a reply.
    pub async fn send_text(&self, to: &Address, text: &str) -> Result<(), SendError> {
        self.send_over(to, text, None).await
    }

    /// Like [`Delivery::send_text`], but the first part replaces the text of
    /// the message `edit` (a streaming preview) when given. If that edit
    /// fails, the first part is sent as a new message instead.
    async fn send_over(
        &self,
        to: &Address,
        text: &str,
        edit: Option<&str>,
    ) -> Result<(), SendError> {
        let adapter = self
            .adapter(&to.platform)
            .ok_or_else(|| SendError::Unavailable(format!("{} is not configured", to.platform)))?;
        let parts = split_message(text, adapter.limits());
        let mut skip = 0;
        if let (Some(id), Some(first)) = (edit, parts.first()) {
            match adapter.edit(&to.chat_id, id, first).await {
                Ok(()) => skip = 1,
                Err(e) => {
                    tracing::debug!(error = %e, "could not turn the preview into the answer; sending it anew");
                }
            }
        }
        for (i, part) in parts.into_iter().enumerate().skip(skip) {
            let message = OutboundMessage {
                chat_id: to.chat_id.clone(),
                thread_id: to.thread_id.clone(),
                reply_to: if i == 0 { to.reply_to.clone() } else { None },
                text: part,
            };
            self.send_part(adapter.as_ref(), &message).await?;
        }
        Ok(())
    }

    async fn send_part(
        &self,
        adapter: &dyn Adapter,
        message: &OutboundMessage,
    ) -> Result<(), SendError> {
        let mut retries = 0;
        loop {
            match adapter.send(message).await {
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
        if let Err(e) = self.send_text(to, text).await {
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
        let id = match &self.ledger {
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
                    )
                    .await
            }
            None => None,
        };
        if let (Some(ledger), Some(id)) = (&self.ledger, &id) {
            ledger.attempting(id).await;
        }
        let result = self.send_over(to, text, preview).await;
        if let (Some(ledger), Some(id)) = (&self.ledger, &id) {
            match &result {
                Ok(()) => ledger.delivered(id).await,
                Err(e) => ledger.failed(id, &e.to_string()).await,
            }
        }
        if let Err(e) = &result {
            tracing::warn!(platform = %to.platform, error = %e, "could not deliver a reply");
        }
        result
    }

    /// Sends an obligation claimed by a sweep. The claim already moved the
    /// row to `attempting`, so a crash now leaves a row the next sweep marks
    /// as a possible duplicate, and a second sweep by this process leaves
    /// it alone.
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
        let result = self.send_text(&to, &claimed.text()).await;
        match &result {
            Ok(()) => {
                tracing::info!(id = %row.id, platform = %row.platform, "recovered an undelivered reply");
                ledger.delivered(&row.id).await;
            }
            Err(e) => {
                tracing::warn!(id = %row.id, error = %e, "could not redeliver a recovered reply");
                ledger.failed(&row.id, &e.to_string()).await;
            }
        }
        result
    }
}
