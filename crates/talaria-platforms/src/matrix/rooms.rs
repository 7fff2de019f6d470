//! What the adapter knows about the rooms it is in, and what it keeps of
//! that across restarts.
//!
//! Whether a room is a direct chat decides whether a message must address
//! the bot, so a wrong guess silently drops messages (the sync token moves
//! on past them). The answer is the room's joined member count (two or
//! fewer: a direct chat), asked from the homeserver
//! (`GET /rooms/{id}/joined_members`) when not known. A sync's
//! `summary.m.joined_member_count` cannot be relied on: Synapse sends it
//! only with lazy-loaded members, and then only when the membership
//! changed. The count is forgotten whenever a sync shows a membership
//! event of the room, and asked again when a message needs it.
//!
//! Only when the count cannot be had does "direct" come from the invite
//! (`is_direct`) or the account's `m.direct` data.
//!
//! The counts and the direct invites are saved in the store as one compact
//! record per account (see [`Rooms::record`]), so a restart knows them
//! without asking and keeps the direct invites, which nothing else tells.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::mapping::{Me, RoomView};

/// The most rooms remembered; beyond, the counts are dropped and asked
/// again (a bot in that many rooms pays one request per room).
const MAX_ROOMS: usize = 10_000;

/// What is known of one room's membership.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Facts {
    /// Joined members (the bot included), when known and current.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    joined: Option<u64>,
    /// The bot was invited with `is_direct`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    direct: bool,
}

impl Facts {
    fn is_empty(&self) -> bool {
        self.joined.is_none() && !self.direct
    }
}

/// Per-room facts gathered from sync responses and the homeserver.
#[derive(Default)]
pub(crate) struct Rooms {
    facts: HashMap<String, Facts>,
    /// Rooms marked direct in the account's `m.direct` data.
    account_direct: HashSet<String>,
    names: HashMap<String, String>,
    /// room -> user -> display name.
    members: HashMap<String, HashMap<String, String>>,
    /// Rooms whose encrypted messages were already warned about.
    pub(crate) warned_encrypted: HashSet<String>,
    /// `facts` changed since the record was last saved.
    dirty: bool,
}

impl Rooms {
    /// The saved record's name for the account `user_id`.
    pub(crate) fn record_name(user_id: &str) -> String {
        format!("rooms:{user_id}")
    }

    /// Takes in a saved record (see [`Self::record`]). A record that does
    /// not parse is dropped: everything in it can be asked again.
    pub(crate) fn load(&mut self, record: &str) {
        match serde_json::from_str::<BTreeMap<String, Facts>>(record) {
            Ok(saved) => {
                for (room, facts) in saved.into_iter().take(MAX_ROOMS) {
                    self.facts.entry(room).or_insert(facts);
                }
            }
            Err(e) => {
                tracing::warn!("the saved Matrix room record is unreadable ({e}); starting over")
            }
        }
    }

    /// The record to save, when something changed since the last one:
    /// `{"!room:server": {"joined": 2, "direct": true}, ...}` with only
    /// what is known.
    pub(crate) fn record(&self) -> Option<String> {
        if !self.dirty {
            return None;
        }
        let known: BTreeMap<&String, &Facts> =
            self.facts.iter().filter(|(_, f)| !f.is_empty()).collect();
        serde_json::to_string(&known).ok()
    }

    /// The record returned by [`Self::record`] was saved.
    pub(crate) fn saved(&mut self) {
        self.dirty = false;
    }

    fn update(&mut self, room_id: &str, change: impl FnOnce(&mut Facts)) {
        if !self.facts.contains_key(room_id) && self.facts.len() >= MAX_ROOMS {
            self.facts.retain(|_, f| f.direct);
            for f in self.facts.values_mut() {
                f.joined = None;
            }
            self.dirty = true;
        }
        let facts = self.facts.entry(room_id.to_owned()).or_default();
        let before = *facts;
        change(facts);
        if *facts != before {
            self.dirty = true;
        }
    }

    /// The joined member count, when known.
    pub(crate) fn joined(&self, room_id: &str) -> Option<u64> {
        self.facts.get(room_id).and_then(|f| f.joined)
    }

    pub(crate) fn set_joined(&mut self, room_id: &str, n: u64) {
        self.update(room_id, |f| f.joined = Some(n));
    }

    /// The membership changed: the count is asked again when needed.
    pub(crate) fn forget_joined(&mut self, room_id: &str) {
        if self.joined(room_id).is_some() {
            self.update(room_id, |f| f.joined = None);
        }
    }

    /// The bot joined on an invite marked `is_direct`.
    pub(crate) fn set_direct(&mut self, room_id: &str) {
        self.update(room_id, |f| f.direct = true);
    }

    /// The bot left (or was removed from) the room.
    pub(crate) fn left(&mut self, room_id: &str) {
        if self.facts.remove(room_id).is_some() {
            self.dirty = true;
        }
        self.names.remove(room_id);
        self.members.remove(room_id);
    }

    /// Replaces the rooms of the account's `m.direct` data (its content:
    /// user id -> room ids).
    pub(crate) fn set_account_direct(&mut self, content: &Value) {
        if let Some(map) = content.as_object() {
            self.account_direct = map
                .values()
                .filter_map(Value::as_array)
                .flatten()
                .filter_map(Value::as_str)
                .take(MAX_ROOMS)
                .map(str::to_owned)
                .collect();
        }
    }

    /// Whether the room is a direct chat: by its member count when known,
    /// else by how the bot was invited or the account's `m.direct` data.
    pub(crate) fn is_dm(&self, room_id: &str) -> bool {
        match self.joined(room_id) {
            Some(n) => n <= 2,
            None => {
                self.facts.get(room_id).is_some_and(|f| f.direct)
                    || self.account_direct.contains(room_id)
            }
        }
    }

    pub(crate) fn set_name(&mut self, room_id: &str, name: &str) {
        if self.names.len() < MAX_ROOMS || self.names.contains_key(room_id) {
            self.names.insert(room_id.to_owned(), name.to_owned());
        }
    }

    pub(crate) fn set_member_name(&mut self, room_id: &str, user: &str, name: &str) {
        if self.members.len() >= MAX_ROOMS && !self.members.contains_key(room_id) {
            return;
        }
        let names = self.members.entry(room_id.to_owned()).or_default();
        if names.len() < MAX_ROOMS || names.contains_key(user) {
            names.insert(user.to_owned(), name.to_owned());
        }
    }

    pub(crate) fn view(&self, room_id: &str, sender: Option<&str>, is_dm: bool) -> RoomView {
        RoomView {
            room_id: room_id.to_owned(),
            name: self.names.get(room_id).cloned(),
            is_dm,
            sender_name: sender
                .and_then(|s| self.members.get(room_id).and_then(|m| m.get(s)).cloned()),
        }
    }
}

/// Whether `event` is the bot's own join into a room it was not in: its
/// membership event turning to `join` from anything else (an invite,
/// nothing, a leave). A display name change is a `join` after a `join`.
pub(crate) fn is_fresh_join(event: &Value, me: &Me) -> bool {
    let own_join = event.get("type").and_then(Value::as_str) == Some("m.room.member")
        && event.get("state_key").and_then(Value::as_str) == Some(me.user_id.as_str())
        && event.pointer("/content/membership").and_then(Value::as_str) == Some("join");
    if !own_join {
        return false;
    }
    // `prev_content` sits in `unsigned`; older servers put it on the event.
    let previous = event
        .pointer("/unsigned/prev_content/membership")
        .or_else(|| event.pointer("/prev_content/membership"))
        .and_then(Value::as_str);
    previous != Some("join")
}

/// Whether the homeserver says the bot was not in the room when `event`
/// was written (`unsigned.membership`, the reader's membership at the
/// event, which Synapse sends).
pub(crate) fn written_before_joining(event: &Value) -> bool {
    event
        .pointer("/unsigned/membership")
        .and_then(Value::as_str)
        .is_some_and(|m| m != "join")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn me() -> Me {
        Me {
            device_id: None,
            user_id: "@bot:hs".into(),
            display_name: None,
        }
    }

    #[test]
    fn the_count_decides_and_the_invite_only_when_it_is_unknown() {
        let mut r = Rooms::default();
        assert!(!r.is_dm("!a:hs"), "nothing known: a group");
        r.set_direct("!a:hs");
        assert!(r.is_dm("!a:hs"));
        r.set_joined("!a:hs", 3);
        assert!(!r.is_dm("!a:hs"), "a third member makes it a group");
        r.forget_joined("!a:hs");
        assert!(r.is_dm("!a:hs"));
        r.set_joined("!b:hs", 2);
        assert!(r.is_dm("!b:hs"), "two members without is_direct: a DM");
        r.set_account_direct(&json!({"@u:hs": ["!c:hs"]}));
        assert!(r.is_dm("!c:hs"));
    }

    #[test]
    fn the_record_keeps_what_is_known_and_loads_back() {
        let mut r = Rooms::default();
        assert_eq!(r.record(), None, "nothing changed");
        r.set_joined("!a:hs", 2);
        r.set_direct("!b:hs");
        r.set_joined("!c:hs", 5);
        r.forget_joined("!c:hs");
        let record = r.record().unwrap();
        assert_eq!(record, r#"{"!a:hs":{"joined":2},"!b:hs":{"direct":true}}"#);
        r.saved();
        assert_eq!(r.record(), None);
        r.set_joined("!a:hs", 2);
        assert_eq!(r.record(), None, "the same again is no change");

        let mut back = Rooms::default();
        back.load(&record);
        assert_eq!(back.joined("!a:hs"), Some(2));
        assert!(back.is_dm("!b:hs"));
        assert!(!back.is_dm("!c:hs"));
        back.load("not json");
        assert_eq!(back.joined("!a:hs"), Some(2));
        back.left("!a:hs");
        assert_eq!(back.joined("!a:hs"), None);
        assert!(back.record().is_some());
    }

    #[test]
    fn the_memory_is_bounded() {
        let mut r = Rooms::default();
        r.set_direct("!dm:hs");
        for i in 0..MAX_ROOMS + 5 {
            r.set_joined(&format!("!r{i}:hs"), 3);
        }
        assert!(r.facts.len() <= MAX_ROOMS);
        assert!(r.is_dm("!dm:hs"), "direct invites outlive the counts");
    }

    #[test]
    fn fresh_joins_and_pre_join_events_are_recognised() {
        let join = |prev: Value| {
            json!({"type": "m.room.member", "state_key": "@bot:hs", "sender": "@bot:hs",
                   "content": {"membership": "join"}, "unsigned": {"prev_content": prev}})
        };
        assert!(is_fresh_join(&join(json!({"membership": "invite"})), &me()));
        assert!(is_fresh_join(
            &json!({"type": "m.room.member", "state_key": "@bot:hs",
            "content": {"membership": "join"}}),
            &me()
        ));
        assert!(
            !is_fresh_join(
                &join(json!({"membership": "join", "displayname": "x"})),
                &me()
            ),
            "a rename is no join"
        );
        let mut other = join(json!({"membership": "invite"}));
        other["state_key"] = json!("@alice:hs");
        assert!(!is_fresh_join(&other, &me()));
        assert!(written_before_joining(
            &json!({"unsigned": {"membership": "leave"}})
        ));
        assert!(written_before_joining(
            &json!({"unsigned": {"membership": "invite"}})
        ));
        assert!(!written_before_joining(
            &json!({"unsigned": {"membership": "join"}})
        ));
        assert!(!written_before_joining(&json!({"unsigned": {}})));
    }
}
