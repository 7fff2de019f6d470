//! The reply and quote tokens of recent inbound messages.
//!
//! A reply token lets the bot answer for free, once, within about a
//! minute; a push costs quota. So the first answer to a message uses the
//! message's reply token while it is young, and everything after pushes.
//!
//! A reply is not idempotent the way a push is (LINE refuses a retry key
//! on it), so a reply that timed out is remembered as *uncertain*,
//! together with a digest of what it carried. When the ledger sends the
//! same message again while the token is still young, the token is tried
//! once more: LINE answering "Invalid reply token" then means the first
//! attempt used it, so the message is out and is not sent again.
//!
//! Entries are keyed by the inbound message id (what an answer's
//! `reply_to` names) and checked against the chat. They live in memory: a
//! gateway that restarts pushes its owed answers, which the retry key
//! keeps from doubling.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Messages remembered at most; when full, the expired are dropped first,
/// then everything (only quote tokens are lost that way).
const CAPACITY: usize = 10_000;

/// Older than this, an entry only serves its quote token.
const REPLY_LIFETIME: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not used yet.
    Fresh,
    /// A reply with it is on its way.
    InFlight,
    /// Used, or refused by LINE.
    Spent,
    /// A reply carrying the message with this digest may have used it.
    Uncertain(u64),
}

#[derive(Debug)]
struct Entry {
    chat_id: String,
    reply_token: Option<String>,
    quote_token: Option<String>,
    received: Instant,
    state: State,
}

/// What [`ReplyTokens::take`] hands out.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Take {
    /// Reply with this token.
    Use(String),
    /// An earlier reply of this same message may have used this token:
    /// reply again, and read "Invalid reply token" as "it went out".
    Confirm(String),
    /// Push instead.
    Push,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct ReplyTokens {
    entries: Mutex<HashMap<String, Entry>>,
}

impl ReplyTokens {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers message `id` of `chat_id`. A re-delivery of a message
    /// already known changes nothing: its first token may be spent.
    pub(crate) fn remember(
        &self,
        id: &str,
        chat_id: &str,
        reply_token: Option<String>,
        quote_token: Option<String>,
    ) {
        let mut map = self.lock();
        if map.contains_key(id) {
            return;
        }
        if map.len() >= CAPACITY {
            map.retain(|_, e| e.received.elapsed() < REPLY_LIFETIME);
            if map.len() >= CAPACITY {
                map.clear();
            }
        }
        map.insert(
            id.to_owned(),
            Entry {
                chat_id: chat_id.to_owned(),
                reply_token,
                quote_token,
                received: Instant::now(),
                state: State::Fresh,
            },
        );
    }

    /// The token that quotes message `id` in `chat_id`.
    pub(crate) fn quote_token(&self, id: &str, chat_id: &str) -> Option<String> {
        let map = self.lock();
        let e = map.get(id).filter(|e| e.chat_id == chat_id)?;
        e.quote_token.clone()
    }

    /// How to send the message with digest `digest` that answers `id` in
    /// `chat_id`, given that a reply token is used only while younger
    /// than `max_age`. A token handed out is in flight until
    /// [`Self::settle`].
    pub(crate) fn take(&self, id: &str, chat_id: &str, digest: u64, max_age: Duration) -> Take {
        let mut map = self.lock();
        let Some(e) = map.get_mut(id).filter(|e| e.chat_id == chat_id) else {
            return Take::Push;
        };
        let Some(token) = e.reply_token.clone() else {
            return Take::Push;
        };
        if e.received.elapsed() >= max_age {
            if matches!(e.state, State::Uncertain(_)) {
                tracing::warn!(
                    message_id = id,
                    "a LINE reply timed out and its token is too old to check whether it was \
                     used; pushing the answer, which may show twice"
                );
            }
            e.state = State::Spent;
            return Take::Push;
        }
        match e.state {
            State::Fresh => {
                e.state = State::InFlight;
                Take::Use(token)
            }
            State::Uncertain(d) if d == digest => {
                e.state = State::InFlight;
                Take::Confirm(token)
            }
            // Another part of the answer, or a reply already going out.
            State::Uncertain(_) | State::InFlight | State::Spent => Take::Push,
        }
    }

    /// Records how a reply with message `id`'s token ended.
    pub(crate) fn settle(&self, id: &str, outcome: Outcome) {
        let mut map = self.lock();
        if let Some(e) = map.get_mut(id) {
            e.state = match outcome {
                Outcome::Used => State::Spent,
                Outcome::Unused => State::Fresh,
                Outcome::Unknown(digest) => State::Uncertain(digest),
            };
        }
    }
}

/// How a reply attempt left its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Used (the reply went out), or refused by LINE as spent or expired.
    Used,
    /// Untouched: the request never arrived, or was refused before use
    /// (a rate limit, a malformed message).
    Unused,
    /// The reply carrying the message with this digest may have used it.
    Unknown(u64),
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(50);

    fn tokens() -> ReplyTokens {
        let t = ReplyTokens::default();
        t.remember("m1", "Uchat", Some("rt".into()), Some("qt".into()));
        t
    }

    #[test]
    fn a_token_is_used_once_then_answers_push() {
        let t = tokens();
        assert_eq!(t.take("m1", "Uother", 1, LONG), Take::Push, "another chat");
        assert_eq!(t.take("m1", "Uchat", 1, LONG), Take::Use("rt".into()));
        assert_eq!(t.take("m1", "Uchat", 2, LONG), Take::Push, "in flight");
        t.settle("m1", Outcome::Used);
        assert_eq!(t.take("m1", "Uchat", 1, LONG), Take::Push);
        assert_eq!(t.quote_token("m1", "Uchat").as_deref(), Some("qt"));
        assert_eq!(t.quote_token("m1", "Uother"), None);
        assert_eq!(t.take("unknown", "Uchat", 1, LONG), Take::Push);
    }

    #[test]
    fn an_unused_token_is_handed_out_again() {
        let t = tokens();
        assert_eq!(t.take("m1", "Uchat", 1, LONG), Take::Use("rt".into()));
        t.settle("m1", Outcome::Unused);
        assert_eq!(t.take("m1", "Uchat", 1, LONG), Take::Use("rt".into()));
    }

    #[test]
    fn an_uncertain_reply_is_confirmed_only_by_the_same_message() {
        let t = tokens();
        assert_eq!(t.take("m1", "Uchat", 7, LONG), Take::Use("rt".into()));
        t.settle("m1", Outcome::Unknown(7));
        assert_eq!(t.take("m1", "Uchat", 8, LONG), Take::Push, "another part");
        assert_eq!(t.take("m1", "Uchat", 7, LONG), Take::Confirm("rt".into()));
    }

    #[test]
    fn an_old_token_is_not_used_and_a_redelivery_changes_nothing() {
        let t = tokens();
        assert_eq!(t.take("m1", "Uchat", 1, Duration::ZERO), Take::Push);
        t.remember("m1", "Uchat", Some("new".into()), None);
        assert_eq!(t.take("m1", "Uchat", 1, LONG), Take::Push);
        t.remember("m2", "Uchat", None, None);
        assert_eq!(t.take("m2", "Uchat", 1, LONG), Take::Push);
    }
}
