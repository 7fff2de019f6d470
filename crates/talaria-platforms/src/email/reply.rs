//! Reply contexts: what a reply needs from the mail it answers, saved in
//! a fixed ring of cursor slots so a reply sent later (by the ledger's
//! redelivery or another process) still threads.

use super::parse::Inbound;
use super::{PLATFORM, lock};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use talaria_store::CursorStore;

/// Slots in the ring of saved reply contexts (see [`ReplyContexts`]).
pub(super) const CONTEXT_SLOTS: u64 = 2048;

/// Reply contexts kept in memory besides the store.
const MAX_CACHED_CONTEXTS: usize = 1024;

/// `References` entries carried into a reply (the oldest is kept: it names
/// the thread).
pub(super) const MAX_REFERENCES: usize = 20;

/// What a reply needs from the mail it answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct ReplyContext {
    /// The Message-ID answered (no angle brackets).
    pub(super) message_id: Option<String>,
    /// Its `References`, oldest first.
    pub(super) references: Vec<String>,
    pub(super) subject: String,
}

impl ReplyContext {
    pub(super) fn of(mail: &Inbound) -> ReplyContext {
        ReplyContext {
            message_id: mail.message_id.clone(),
            references: mail.references.clone(),
            subject: mail.subject.clone(),
        }
    }

    /// The `References` of a reply: the thread so far plus the mail
    /// answered, trimmed in the middle when long.
    pub(super) fn reply_references(&self) -> Vec<String> {
        let mut refs = self.references.clone();
        if let Some(id) = &self.message_id
            && refs.last() != Some(id)
        {
            refs.push(id.clone());
        }
        if refs.len() > MAX_REFERENCES {
            let tail = refs.split_off(refs.len() - (MAX_REFERENCES - 1));
            refs.truncate(1);
            refs.extend(tail);
        }
        refs
    }
}

/// A saved context with the key it was saved under, so a slot taken over
/// by a later key is recognised.
#[derive(Serialize, Deserialize)]
struct Slot {
    key: String,
    #[serde(flatten)]
    context: ReplyContext,
}

/// Reply contexts, by the inbound mail's id (`msg:<uidvalidity>:<uid>`)
/// and by thread (`thread:<thread id>`, the latest mail of the thread).
///
/// The gateway hands `send` only the inbound id and the thread id, and a
/// reply may be sent by a later process (the ledger's redelivery after a
/// crash, `talaria send`), so the contexts are saved in the store. The
/// store has no delete, so they live in a fixed ring of
/// [`CONTEXT_SLOTS`] cursor names picked by a hash of the key: the table
/// never grows past that, and a key whose slot was since reused by
/// another reads as unknown (the reply then goes out unthreaded).
pub(super) struct ReplyContexts {
    pub(super) store: Arc<dyn CursorStore>,
    pub(super) cache: Mutex<HashMap<String, ReplyContext>>,
}

impl ReplyContexts {
    fn slot_name(key: &str) -> String {
        let digest = Sha256::digest(key.as_bytes());
        let n = u64::from_be_bytes([
            digest[0], digest[1], digest[2], digest[3], digest[4], digest[5], digest[6], digest[7],
        ]);
        format!("reply-context:{}", n % CONTEXT_SLOTS)
    }

    pub(super) async fn save(&self, key: &str, context: &ReplyContext) {
        {
            let mut cache = lock(&self.cache);
            if cache.len() >= MAX_CACHED_CONTEXTS {
                cache.clear();
            }
            cache.insert(key.to_owned(), context.clone());
        }
        let slot = Slot {
            key: key.to_owned(),
            context: context.clone(),
        };
        let value = match serde_json::to_string(&slot) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!("cannot encode a reply context: {e}");
                return;
            }
        };
        if let Err(e) = self
            .store
            .set_cursor(PLATFORM, &Self::slot_name(key), &value)
            .await
        {
            tracing::warn!("cannot save a reply context (the reply may not thread): {e}");
        }
    }

    pub(super) async fn load(&self, key: &str) -> Option<ReplyContext> {
        if let Some(c) = lock(&self.cache).get(key) {
            return Some(c.clone());
        }
        let raw = match self.store.cursor(PLATFORM, &Self::slot_name(key)).await {
            Ok(v) => v?,
            Err(e) => {
                tracing::warn!("cannot read a reply context: {e}");
                return None;
            }
        };
        let slot: Slot = serde_json::from_str(&raw).ok()?;
        (slot.key == key).then_some(slot.context)
    }
}
