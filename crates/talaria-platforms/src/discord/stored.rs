//! The gateway session kept in the store, under platform `discord`:
//!
//! - `session:<bot user id>`: `{"session_id", "resume_gateway_url",
//!   "seq"}`, the last dispatch handled; gone once Discord said the
//!   session cannot be resumed (op 9 with `d: false`, close 4007 or 4009).
//! - `threads:<bot user id>`: the thread map (thread id to parent id),
//!   which a fresh process that resumes cannot learn from `GUILD_CREATE`
//!   (only READY is followed by those).
//!
//! Both are read when `run` starts without a session in memory, and
//! written when they changed: at most once a second while the connection
//! runs ([`SAVE_EVERY`]), and whenever a connection ends, a clean shutdown
//! included. A process killed between two writes leaves a sequence number
//! a little behind; Discord then replays a few dispatches already handed
//! over, and the gateway's inbound dedupe drops them.
//!
//! Names carry the bot's user id, so two bots sharing a store never take
//! each other's session; a fresh process asks `GET /users/@me` for it.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use talaria_adapter::AdapterError;
use talaria_store::CursorStore;
use tokio::time::Instant;

use super::gateway::with_query;
use super::{DiscordAdapter, Session};
use crate::kept::Kept;

/// The platform the values are kept under.
const PLATFORM: &str = "discord";

/// The most often a changed session is written while a connection runs.
const SAVE_EVERY: Duration = Duration::from_secs(1);

/// The session as stored.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct StoredSession {
    session_id: String,
    resume_gateway_url: String,
    seq: u64,
}

fn session_name(bot: &str) -> String {
    format!("session:{bot}")
}

fn threads_name(bot: &str) -> String {
    format!("threads:{bot}")
}

fn encode(session: &Session) -> String {
    let stored = StoredSession {
        session_id: session.id.clone(),
        resume_gateway_url: session.resume_url.clone(),
        seq: session.seq,
    };
    serde_json::to_string(&stored).unwrap_or_default()
}

/// A stored session, when it is one that can be resumed from.
fn decode(value: &str) -> Option<Session> {
    let stored: StoredSession = serde_json::from_str(value).ok()?;
    let id_ok = !stored.session_id.is_empty()
        && stored.session_id.len() <= 128
        && stored.session_id.chars().all(|c| c.is_ascii_graphic());
    if !id_ok || with_query(&stored.resume_gateway_url).is_err() {
        return None;
    }
    Some(Session {
        id: stored.session_id,
        resume_url: stored.resume_gateway_url,
        seq: stored.seq,
    })
}

impl DiscordAdapter {
    /// Keeps the gateway session in `cursors` as well as in memory (see
    /// the module docs), so a new process resumes it.
    pub fn keeping_session_in(mut self, cursors: Arc<dyn CursorStore>) -> DiscordAdapter {
        self.kept = Some(Kept::new(cursors, PLATFORM, SAVE_EVERY));
        self
    }

    /// At the start of `run`, without a session in memory: takes the
    /// stored one, and its thread map. Fails only when the bot's id
    /// cannot be learnt (a refused token is fatal).
    pub(super) async fn restore(&self) -> Result<(), AdapterError> {
        let Some(kept) = &self.kept else {
            return Ok(());
        };
        if self.state().session.is_some() {
            return Ok(());
        }
        let bot = match self.bot_id() {
            Some(bot) => bot,
            None => {
                let (bot, _) = self.me().await?;
                self.state().bot_id = Some(bot.clone());
                bot
            }
        };
        let Some(value) = kept.read(&session_name(&bot)).await else {
            return Ok(());
        };
        let Some(session) = decode(&value) else {
            tracing::warn!("ignoring a stored Discord session that cannot be resumed from");
            return Ok(());
        };
        let threads = kept.read(&threads_name(&bot)).await;
        let mut state = self.state();
        tracing::info!(seq = session.seq, "resuming the stored Discord session");
        state.session = Some(session);
        // What the store holds: nothing to write back.
        kept.holds(&session_name(&bot), state.revision);
        if let Some(threads) = threads {
            if state.threads.learn_json(&threads) {
                kept.holds(&threads_name(&bot), state.threads.revision());
            } else {
                tracing::warn!("ignoring a stored Discord thread map that is not one");
            }
        }
        Ok(())
    }

    /// When the next write to the store is due, if one is.
    pub(super) fn save_due(&self) -> Option<Instant> {
        let kept = self.kept.as_ref()?;
        let state = self.state();
        let bot = state.bot_id.as_deref()?;
        let session = kept.due(&session_name(bot), state.revision);
        let threads = kept.due(&threads_name(bot), state.threads.revision());
        session.into_iter().chain(threads).min()
    }

    /// Writes what is due now, or (`flush`) everything that changed.
    pub(super) async fn save(&self, flush: bool) {
        let Some(kept) = &self.kept else {
            return;
        };
        let owed = |name: &str, revision: u64| {
            if flush {
                kept.due(name, revision).is_some()
            } else {
                kept.due_now(name, revision)
            }
        };
        let (session, threads) = {
            let state = self.state();
            let Some(bot) = state.bot_id.as_deref() else {
                return;
            };
            let (s_name, t_name) = (session_name(bot), threads_name(bot));
            let session = owed(&s_name, state.revision)
                .then(|| (s_name, state.revision, state.session.as_ref().map(encode)));
            let threads = owed(&t_name, state.threads.revision())
                .then(|| (t_name, state.threads.revision(), state.threads.to_json()));
            (session, threads)
        };
        if let Some((name, revision, value)) = session {
            kept.write(&name, revision, value.as_deref()).await;
        }
        if let Some((name, revision, value)) = threads {
            kept.write(&name, revision, Some(&value)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_round_trip_and_bad_ones_are_refused() {
        let session = Session {
            id: "abc123".into(),
            resume_url: "wss://gateway-us-east1-b.discord.gg".into(),
            seq: 42,
        };
        let back = decode(&encode(&session)).unwrap();
        assert_eq!(
            (back.id.as_str(), back.resume_url.as_str(), back.seq),
            ("abc123", "wss://gateway-us-east1-b.discord.gg", 42)
        );
        for bad in [
            "",
            "not json",
            r#"{"session_id":"","resume_gateway_url":"wss://x","seq":1}"#,
            r#"{"session_id":"a b","resume_gateway_url":"wss://x","seq":1}"#,
            r#"{"session_id":"a","resume_gateway_url":"https://x","seq":1}"#,
            r#"{"session_id":"a","resume_gateway_url":"wss://x","seq":-1}"#,
            r#"{"session_id":"a","seq":1}"#,
        ] {
            assert!(decode(bad).is_none(), "{bad}");
        }
    }
}
