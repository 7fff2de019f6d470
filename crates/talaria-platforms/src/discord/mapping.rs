//! Gateway `MESSAGE_CREATE` payloads to [`MessageEvent`]s, and the thread
//! bookkeeping that needs.
//!
//! A Discord thread is a channel of its own, and a message posted in one
//! carries only the thread's channel id. Which channel is a thread, and of
//! which parent, comes from the gateway: `GUILD_CREATE` lists the active
//! threads when the session starts, `THREAD_CREATE` / `THREAD_UPDATE` /
//! `THREAD_LIST_SYNC` announce new ones, `THREAD_DELETE` ends them. The
//! adapter keeps that map ([`Threads`]); a message in a known thread
//! becomes a [`ChatType::Thread`] event whose chat is the parent channel
//! and whose `thread_id` is the thread.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::Value;
use talaria_adapter::{ChatType, MessageEvent, SessionSource};

/// Why a message was not turned into an event (logged, never an error).
pub(crate) type Skip = &'static str;

/// Thread channel id -> parent channel id.
#[derive(Debug, Default)]
pub(crate) struct Threads {
    parents: HashMap<String, String>,
    /// Counts the changes, for the copy in the store.
    revision: u64,
}

#[derive(Deserialize)]
struct Channel {
    id: String,
    parent_id: Option<String>,
    #[serde(rename = "type")]
    kind: Option<u8>,
}

/// Channel types that are threads: announcement, public and private.
fn is_thread(kind: Option<u8>) -> bool {
    matches!(kind, Some(10..=12))
}

impl Threads {
    /// Learns from a dispatch that may describe threads; ignores others.
    pub(crate) fn observe(&mut self, kind: &str, d: &Value) {
        match kind {
            "GUILD_CREATE" | "THREAD_LIST_SYNC" => {
                if let Some(list) = d.get("threads").and_then(Value::as_array) {
                    for t in list {
                        self.learn(t);
                    }
                }
            }
            "THREAD_CREATE" | "THREAD_UPDATE" | "CHANNEL_CREATE" => self.learn(d),
            "THREAD_DELETE" => {
                if let Some(id) = d.get("id").and_then(Value::as_str)
                    && self.parents.remove(id).is_some()
                {
                    self.revision += 1;
                }
            }
            _ => {}
        }
    }

    fn learn(&mut self, v: &Value) {
        match Channel::deserialize(v) {
            Ok(Channel {
                id,
                parent_id: Some(parent),
                kind,
            }) if is_thread(kind) => self.insert(id, parent),
            Ok(_) => {}
            Err(e) => tracing::debug!("skipping a malformed Discord channel: {e}"),
        }
    }

    fn insert(&mut self, id: String, parent: String) {
        if self.parents.get(&id) != Some(&parent) {
            self.parents.insert(id, parent);
            self.revision += 1;
        }
    }

    /// The parent channel of `channel_id` when it is a known thread.
    pub(crate) fn parent(&self, channel_id: &str) -> Option<&str> {
        self.parents.get(channel_id).map(String::as_str)
    }

    /// How many changes the map has seen.
    pub(crate) fn revision(&self) -> u64 {
        self.revision
    }

    /// The map, thread id to parent id, to keep in the store.
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(&self.parents).unwrap_or_else(|_| "{}".to_owned())
    }

    /// Learns the threads of a map kept in the store ([`Self::to_json`]);
    /// `false` when it is not one (nothing is learnt then).
    pub(crate) fn learn_json(&mut self, json: &str) -> bool {
        match serde_json::from_str::<HashMap<String, String>>(json) {
            Ok(parents) => {
                for (id, parent) in parents {
                    if is_snowflake(&id) && is_snowflake(&parent) {
                        self.insert(id, parent);
                    }
                }
                true
            }
            Err(_) => false,
        }
    }
}

/// Digits only: what a channel id is.
fn is_snowflake(id: &str) -> bool {
    !id.is_empty() && id.len() <= 20 && id.chars().all(|c| c.is_ascii_digit())
}

#[derive(Debug, Deserialize)]
pub(crate) struct User {
    pub id: String,
    #[serde(default)]
    pub username: String,
    pub global_name: Option<String>,
    #[serde(default)]
    pub bot: bool,
}

#[derive(Debug, Deserialize)]
struct Attachment {
    url: Option<String>,
    filename: Option<String>,
    content_type: Option<String>,
    size: Option<u64>,
}

/// `MESSAGE_FLAGS.IS_VOICE_MESSAGE`: recorded in the app as a voice note.
const IS_VOICE_MESSAGE: u64 = 1 << 13;

#[derive(Debug, Deserialize)]
struct Reference {
    message_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Referenced {
    #[serde(default)]
    content: String,
}

#[derive(Debug, Deserialize)]
struct Message {
    id: String,
    channel_id: String,
    guild_id: Option<String>,
    author: User,
    #[serde(default)]
    content: String,
    #[serde(default)]
    mentions: Vec<User>,
    #[serde(default)]
    attachments: Vec<Attachment>,
    #[serde(default)]
    flags: u64,
    webhook_id: Option<String>,
    message_reference: Option<Reference>,
    referenced_message: Option<Box<Referenced>>,
}

/// Maps one `MESSAGE_CREATE` to an event. `bot_id` is the bot's user id
/// from `READY`.
pub(crate) fn map_message(
    d: &Value,
    bot_id: &str,
    require_mention: bool,
    threads: &Threads,
) -> Result<MessageEvent, Skip> {
    let msg = Message::deserialize(d).map_err(|e| {
        tracing::warn!("skipping a malformed Discord message: {e}");
        "malformed message"
    })?;
    if msg.author.id == bot_id {
        return Err("our own message");
    }
    if msg.author.bot || msg.webhook_id.is_some() {
        return Err("from a bot or webhook");
    }
    let in_guild = msg.guild_id.is_some();
    let mentioned = msg.mentions.iter().any(|u| u.id == bot_id) || mention_at(&msg.content, bot_id);
    let text = strip_mentions(&msg.content, bot_id);
    // Attachments are fetched from their CDN URL when the turn runs.
    let voice = msg.flags & IS_VOICE_MESSAGE != 0;
    let attachments: Vec<talaria_adapter::Attachment> = msg
        .attachments
        .iter()
        .filter_map(|a| {
            let url = a.url.as_deref()?;
            let mut att = talaria_adapter::Attachment::guessed(
                url,
                a.filename.as_deref(),
                a.content_type.as_deref(),
                a.size,
            );
            if voice {
                att.kind = talaria_adapter::MediaKind::Voice;
            }
            Some(att)
        })
        .collect();
    if text.is_empty() && attachments.is_empty() {
        return Err("no text or attachment");
    }
    if in_guild && require_mention && !mentioned {
        return Err("guild message does not mention the bot");
    }
    let (chat_type, chat_id, thread_id) = match (in_guild, threads.parent(&msg.channel_id)) {
        (false, _) => (ChatType::Dm, msg.channel_id.clone(), None),
        (true, Some(parent)) => (
            ChatType::Thread,
            parent.to_owned(),
            Some(msg.channel_id.clone()),
        ),
        (true, None) => (ChatType::Group, msg.channel_id.clone(), None),
    };
    let user_name = msg
        .author
        .global_name
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| Some(msg.author.username.clone()).filter(|n| !n.is_empty()));
    let source = SessionSource {
        platform: "discord".to_owned(),
        chat_id,
        chat_name: None,
        chat_type,
        user_id: Some(msg.author.id.clone()),
        user_name,
        thread_id,
        is_bot: false,
    };
    Ok(MessageEvent {
        source,
        text,
        message_id: Some(msg.id),
        reply_to_message_id: msg.message_reference.and_then(|r| r.message_id),
        reply_to_text: msg
            .referenced_message
            .map(|r| r.content)
            .filter(|c| !c.is_empty()),
        attachments,
        reply_target: None,
    })
}

/// Whether `content` contains `<@id>` or `<@!id>` for `bot_id`.
fn mention_at(content: &str, bot_id: &str) -> bool {
    !bot_id.is_empty()
        && (content.contains(&format!("<@{bot_id}>")) || content.contains(&format!("<@!{bot_id}>")))
}

/// The text with the bot's mentions removed, each with one space next to
/// it, so `<@1> /status` is the command `/status`; the rest of the text
/// (line breaks, indentation) is left as written.
fn strip_mentions(content: &str, bot_id: &str) -> String {
    let mut text = content.to_owned();
    if !bot_id.is_empty() {
        for token in [format!("<@!{bot_id}>"), format!("<@{bot_id}>")] {
            while let Some(at) = text.find(&token) {
                let mut start = at;
                let mut end = at + token.len();
                if text[end..].starts_with(' ') {
                    end += 1;
                } else if text[..start].ends_with(' ') {
                    start -= 1;
                }
                text.replace_range(start..end, "");
            }
        }
    }
    text.trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const BOT: &str = "900";

    fn message(extra: Value) -> Value {
        let mut m = json!({
            "id": "1001", "channel_id": "55", "content": "hello",
            "author": {"id": "42", "username": "ada", "global_name": "Ada L"},
        });
        if let (Some(m), Some(e)) = (m.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                m.insert(k.clone(), v.clone());
            }
        }
        m
    }

    #[test]
    fn dms_need_no_mention_and_name_the_dm_channel() {
        let ev = map_message(&message(json!({})), BOT, true, &Threads::default()).unwrap();
        assert_eq!(ev.source.chat_type, ChatType::Dm);
        assert_eq!(ev.source.chat_id, "55");
        assert_eq!(ev.source.user_id.as_deref(), Some("42"));
        assert_eq!(ev.source.user_name.as_deref(), Some("Ada L"));
        assert_eq!(ev.message_id.as_deref(), Some("1001"));
        assert_eq!(ev.text, "hello");
    }

    #[test]
    fn guild_messages_need_a_mention_which_is_stripped() {
        let t = Threads::default();
        let plain = message(json!({"guild_id": "7"}));
        assert!(map_message(&plain, BOT, true, &t).is_err());
        assert_eq!(map_message(&plain, BOT, false, &t).unwrap().text, "hello");
        let by_content = message(json!({"guild_id": "7", "content": "<@900> /status"}));
        let ev = map_message(&by_content, BOT, true, &t).unwrap();
        assert_eq!(ev.text, "/status");
        assert_eq!(ev.source.chat_type, ChatType::Group);
        let nick = message(json!({"guild_id": "7", "content": "hey <@!900>, look:\n  indented"}));
        assert_eq!(
            map_message(&nick, BOT, true, &t).unwrap().text,
            "hey, look:\n  indented"
        );
        let listed =
            message(json!({"guild_id": "7", "mentions": [{"id": "900", "username": "bot"}]}));
        assert!(map_message(&listed, BOT, true, &t).is_ok());
        // Someone else's mention is not ours, and is kept in the text.
        let other = message(json!({"guild_id": "7", "content": "<@901> hi"}));
        assert!(map_message(&other, BOT, true, &t).is_err());
        assert_eq!(
            map_message(&other, BOT, false, &t).unwrap().text,
            "<@901> hi"
        );
        // A bare mention with nothing else says nothing.
        let bare = message(json!({"guild_id": "7", "content": "<@900>"}));
        assert!(map_message(&bare, BOT, true, &t).is_err());
    }

    #[test]
    fn bots_webhooks_and_ourselves_are_ignored() {
        let t = Threads::default();
        let ours = message(json!({"author": {"id": "900", "username": "me", "bot": true}}));
        assert!(map_message(&ours, BOT, false, &t).is_err());
        let bot = message(json!({"author": {"id": "5", "username": "b", "bot": true}}));
        assert!(map_message(&bot, BOT, false, &t).is_err());
        let hook = message(json!({"webhook_id": "77"}));
        assert!(map_message(&hook, BOT, false, &t).is_err());
        assert!(map_message(&json!({"id": 3}), BOT, false, &t).is_err());
    }

    #[test]
    fn threads_map_to_their_parent_channel() {
        let mut t = Threads::default();
        t.observe(
            "GUILD_CREATE",
            &json!({"id": "7", "threads": [{"id": "300", "parent_id": "55", "type": 11}]}),
        );
        t.observe(
            "THREAD_CREATE",
            &json!({"id": "301", "parent_id": "56", "type": 12}),
        );
        // A text channel with a category parent is not a thread.
        t.observe(
            "CHANNEL_CREATE",
            &json!({"id": "302", "parent_id": "1", "type": 0}),
        );
        let ev = map_message(
            &message(json!({"guild_id": "7", "channel_id": "300"})),
            BOT,
            false,
            &t,
        )
        .unwrap();
        assert_eq!(ev.source.chat_type, ChatType::Thread);
        assert_eq!(ev.source.chat_id, "55");
        assert_eq!(ev.source.thread_id.as_deref(), Some("300"));
        assert_eq!(t.parent("301"), Some("56"));
        assert_eq!(t.parent("302"), None);
        t.observe("THREAD_DELETE", &json!({"id": "301"}));
        assert_eq!(t.parent("301"), None);
    }

    #[test]
    fn replies_and_attachments() {
        let m = message(json!({
            "content": "",
            "attachments": [{"id": "1", "filename": "a.png", "url": "https://cdn.discordapp.com/a.png", "size": 5}],
            "message_reference": {"message_id": "999"},
            "referenced_message": {"content": "earlier"},
        }));
        let ev = map_message(&m, BOT, false, &Threads::default()).unwrap();
        assert_eq!(
            ev.attachments,
            [talaria_adapter::Attachment::guessed(
                "https://cdn.discordapp.com/a.png",
                Some("a.png"),
                None,
                Some(5)
            )]
        );
        assert_eq!(ev.reply_to_message_id.as_deref(), Some("999"));
        assert_eq!(ev.reply_to_text.as_deref(), Some("earlier"));
    }
}
