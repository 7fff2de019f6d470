//! The WebSocket connection kept in the store, under platform
//! `mattermost` and the name `websocket:<bot user id>@<server>`:
//! `{"connection_id", "sequence_number"}`, the next event expected.
//!
//! Read when `run` starts without a connection in memory; written when it
//! changed, at most once a second while the socket runs ([`SAVE_EVERY`]),
//! and whenever `run` ends, a clean shutdown included. When the server
//! cannot resume the stored connection it sends a new `hello`, whose new
//! id replaces the stored one. A process killed between two writes leaves
//! a sequence number a little behind: the server replays a few events
//! already handed over, and the gateway's inbound dedupe drops them.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use talaria_store::CursorStore;
use tokio::time::Instant;

use super::mapping::Me;
use super::{MattermostAdapter, lock};
use crate::kept::Kept;

/// The platform the value is kept under.
const PLATFORM: &str = "mattermost";

/// The most often a changed position is written while the socket runs.
const SAVE_EVERY: Duration = Duration::from_secs(1);

/// The position as stored.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Stored {
    connection_id: String,
    sequence_number: i64,
}

impl Stored {
    /// A stored position, when it is one a server could have given.
    fn decode(value: &str) -> Option<Stored> {
        let stored: Stored = serde_json::from_str(value).ok()?;
        let id_ok = !stored.connection_id.is_empty()
            && stored.connection_id.len() <= 128
            && stored.connection_id.chars().all(|c| c.is_ascii_graphic());
        (id_ok && stored.sequence_number >= 0).then_some(stored)
    }
}

impl MattermostAdapter {
    /// Keeps the WebSocket's connection id and sequence number in
    /// `cursors` as well as in memory (see the module docs), so a new
    /// process resumes the connection.
    pub fn keeping_connection_in(mut self, cursors: Arc<dyn CursorStore>) -> MattermostAdapter {
        self.kept = Some(Kept::new(cursors, PLATFORM, SAVE_EVERY));
        self
    }

    /// Per bot and server: another account's connection means nothing
    /// to this one.
    fn stored_name(&self, me: &Me) -> String {
        format!("websocket:{}@{}", me.id, self.base_url)
    }

    /// At the start of `run`, without a connection in memory: takes the
    /// stored one.
    pub(super) async fn restore(&self, me: &Me) {
        let Some(kept) = &self.kept else {
            return;
        };
        if lock(&self.resume).connection_id.is_some() {
            return;
        }
        let name = self.stored_name(me);
        let Some(value) = kept.read(&name).await else {
            return;
        };
        let Some(stored) = Stored::decode(&value) else {
            tracing::warn!("ignoring a stored Mattermost connection that cannot be resumed");
            return;
        };
        let mut resume = lock(&self.resume);
        tracing::info!(
            seq = stored.sequence_number,
            "resuming the stored Mattermost connection"
        );
        resume.connection_id = Some(stored.connection_id);
        resume.next_seq = stored.sequence_number;
        // What the store holds: nothing to write back.
        kept.holds(&name, resume.revision);
    }

    /// When the next write to the store is due, if one is.
    pub(super) fn save_due(&self, me: &Me) -> Option<Instant> {
        let kept = self.kept.as_ref()?;
        let revision = lock(&self.resume).revision;
        kept.due(&self.stored_name(me), revision)
    }

    /// Writes the position when a write is due now, or (`flush`) when it
    /// changed at all.
    pub(super) async fn save(&self, me: &Me, flush: bool) {
        let Some(kept) = &self.kept else {
            return;
        };
        let name = self.stored_name(me);
        let (revision, value) = {
            let resume = lock(&self.resume);
            let owed = if flush {
                kept.due(&name, resume.revision).is_some()
            } else {
                kept.due_now(&name, resume.revision)
            };
            if !owed {
                return;
            }
            let value = resume.connection_id.as_ref().map(|id| {
                let stored = Stored {
                    connection_id: id.clone(),
                    sequence_number: resume.next_seq,
                };
                serde_json::to_string(&stored).unwrap_or_default()
            });
            (resume.revision, value)
        };
        kept.write(&name, revision, value.as_deref()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_positions_are_checked() {
        let good = Stored::decode(r#"{"connection_id":"abc","sequence_number":4}"#).unwrap();
        assert_eq!(
            good,
            Stored {
                connection_id: "abc".into(),
                sequence_number: 4
            }
        );
        for bad in [
            "",
            "{}",
            r#"{"connection_id":"","sequence_number":4}"#,
            r#"{"connection_id":"a b","sequence_number":4}"#,
            r#"{"connection_id":"abc","sequence_number":-1}"#,
        ] {
            assert!(Stored::decode(bad).is_none(), "{bad}");
        }
    }
}
