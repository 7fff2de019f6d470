//! Bot API messages to [`MessageEvent`]s.

use talaria_adapter::{Attachment, ChatType, MediaKind, MessageEvent, SessionSource};

use super::api::{Chat, FileRef, Message, User};

/// The bot itself, from `getMe`: mentions and replies are matched against it.
#[derive(Debug, Clone)]
pub(crate) struct Me {
    pub id: i64,
    pub username: String,
}

/// Why a message was not turned into an event (logged, never an error).
pub(crate) type Skip = &'static str;

/// The General topic of a forum arrives without a thread id.
pub(crate) const GENERAL_TOPIC: &str = "1";

/// Maps one message (`channel_post` or `message`) to an event.
pub(crate) fn map_message(
    msg: &Message,
    me: &Me,
    require_mention: bool,
) -> Result<MessageEvent, Skip> {
    let chat_type = match msg.chat.kind.as_str() {
        "private" => ChatType::Dm,
        "group" => ChatType::Group,
        "supergroup" if msg.chat.is_forum == Some(true) => ChatType::Forum,
        "supergroup" => ChatType::Group,
        "channel" => ChatType::Channel,
        _ => return Err("unknown chat type"),
    };
    let text = msg
        .text
        .as_deref()
        .or(msg.caption.as_deref())
        .unwrap_or("")
        .to_owned();
    let attachments = attachments(msg);
    if text.trim().is_empty() && attachments.is_empty() {
        return Err("no text or attachment (service message)");
    }
    if require_mention
        && matches!(chat_type, ChatType::Group | ChatType::Forum)
        && !addressed_to_bot(msg, &text, me)
    {
        return Err("group message does not address the bot");
    }
    let thread_id = (chat_type == ChatType::Forum).then(|| forum_topic(msg));
    let (user_id, user_name, is_bot) = match (&msg.from, chat_type) {
        // Channel posts are anonymous: `from` is absent or a placeholder.
        (_, ChatType::Channel) => (None, msg.author_signature.clone(), false),
        (Some(u), _) => (Some(u.id.to_string()), Some(display_user(u)), u.is_bot),
        (None, ChatType::Dm) => (Some(msg.chat.id.to_string()), None, false),
        (None, _) => (None, None, false),
    };
    let source = SessionSource {
        platform: "telegram".to_owned(),
        chat_id: msg.chat.id.to_string(),
        chat_name: chat_name(&msg.chat),
        chat_type,
        user_id,
        user_name,
        thread_id,
        is_bot,
    };
    let reply = msg.reply_to_message.as_deref();
    Ok(MessageEvent {
        source,
        text,
        message_id: Some(msg.message_id.to_string()),
        reply_to_message_id: reply.map(|r| r.message_id.to_string()),
        reply_to_text: reply.and_then(|r| r.text.clone().or_else(|| r.caption.clone())),
        attachments,
        reply_target: None,
    })
}

/// The topic of a forum message. A reply in the General topic carries the
/// replied-to message's thread id without `is_topic_message`; only a topic
/// message (or a non-reply that names its thread) is in a real topic.
fn forum_topic(msg: &Message) -> String {
    let in_topic = msg.is_topic_message == Some(true) || msg.reply_to_message.is_none();
    match msg.message_thread_id {
        Some(t) if in_topic => t.to_string(),
        _ => GENERAL_TOPIC.to_owned(),
    }
}

fn display_user(u: &User) -> String {
    u.username.clone().unwrap_or_else(|| u.first_name.clone())
}

fn chat_name(chat: &Chat) -> Option<String> {
    if let Some(t) = &chat.title {
        return Some(t.clone());
    }
    let full = [chat.first_name.as_deref(), chat.last_name.as_deref()]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" ");
    if full.is_empty() {
        chat.username.clone()
    } else {
        Some(full)
    }
}

/// The files of a message, fetched later by their file id (`getFile`).
fn attachments(msg: &Message) -> Vec<Attachment> {
    let attach = |kind: MediaKind, f: &FileRef| {
        Attachment::remote(kind, f.file_id.clone())
            .named(f.file_name.clone())
            .claiming(f.mime_type.clone())
            .sized(f.file_size)
    };
    let mut out = Vec::new();
    // Telegram sends a photo in several sizes; the largest has the most
    // detail, and the cache downscales it for the model anyway.
    let largest = msg.photo.iter().flatten().max_by_key(|p| {
        (
            u64::from(p.width.unwrap_or(0)) * u64::from(p.height.unwrap_or(0)),
            p.file_size.unwrap_or(0),
        )
    });
    if let Some(p) = largest {
        // Telegram re-encodes every photo as JPEG and says so nowhere.
        out.push(attach(MediaKind::Image, p).claiming(Some("image/jpeg")));
    }
    for (file, kind) in [
        (&msg.document, MediaKind::Document),
        (&msg.video, MediaKind::Video),
        (&msg.voice, MediaKind::Voice),
        (&msg.audio, MediaKind::Audio),
    ] {
        if let Some(f) = file {
            out.push(attach(kind, f));
        }
    }
    out
}

/// Whether a group message is for the bot: it mentions `@botname`, starts
/// with a command (not one addressed to another bot), or replies to the bot.
fn addressed_to_bot(msg: &Message, text: &str, me: &Me) -> bool {
    let name = me.username.to_ascii_lowercase();
    if msg
        .reply_to_message
        .as_ref()
        .and_then(|r| r.from.as_ref())
        .is_some_and(|u| u.id == me.id)
    {
        return true;
    }
    let entities = msg
        .entities
        .iter()
        .chain(msg.caption_entities.iter())
        .flatten();
    for e in entities {
        if e.kind == "text_mention" && e.user.as_ref().is_some_and(|u| u.id == me.id) {
            return true;
        }
    }
    if let Some(rest) = text.trim_start().strip_prefix('/') {
        let head = rest.split_whitespace().next().unwrap_or("");
        match head.split_once('@') {
            Some((_, bot)) if bot.eq_ignore_ascii_case(&name) => return true,
            None if !head.is_empty() && !head.contains('/') => return true,
            _ => {}
        }
    }
    mentions(text, &name)
}

/// `@name` as a whole word, case-insensitively.
fn mentions(text: &str, name: &str) -> bool {
    if name.is_empty() {
        return false;
    }
    let lower = text.to_ascii_lowercase();
    let needle = format!("@{name}");
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    lower.match_indices(&needle).any(|(i, _)| {
        let before_ok = lower[..i].chars().next_back().is_none_or(|c| !word(c));
        let after_ok = lower[i + needle.len()..]
            .chars()
            .next()
            .is_none_or(|c| !word(c));
        before_ok && after_ok
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn me() -> Me {
        Me {
            id: 7,
            username: "TalariaBot".into(),
        }
    }

    fn msg(v: serde_json::Value) -> Message {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn mention_rules() {
        assert!(mentions("hi @talariabot!", "talariabot"));
        assert!(!mentions("hi @talariabot_two", "talariabot"));
        assert!(!mentions("mail x@talariabot", "talariabot"));
        let group = json!({"id": -5, "type": "group"});
        let m = |text: &str| {
            msg(
                json!({"message_id": 1, "chat": group, "text": text, "from": {"id": 3, "first_name": "A"}}),
            )
        };
        assert!(map_message(&m("/help"), &me(), true).is_ok());
        assert!(map_message(&m("/help@talariabot"), &me(), true).is_ok());
        assert!(map_message(&m("/help@otherbot"), &me(), true).is_err());
        assert!(map_message(&m("/usr/bin"), &me(), true).is_err());
        assert!(map_message(&m("hello"), &me(), true).is_err());
        assert!(map_message(&m("hello"), &me(), false).is_ok());
        let reply = msg(json!({"message_id": 2, "chat": group, "text": "ok",
            "from": {"id": 3, "first_name": "A"},
            "reply_to_message": {"message_id": 1, "chat": group, "text": "earlier", "from": {"id": 7, "is_bot": true, "first_name": "T"}}}));
        let ev = map_message(&reply, &me(), true).unwrap();
        assert_eq!(ev.reply_to_message_id.as_deref(), Some("1"));
        assert_eq!(ev.reply_to_text.as_deref(), Some("earlier"));
    }

    #[test]
    fn channel_posts_captions_and_attachments() {
        let post = msg(
            json!({"message_id": 9, "chat": {"id": -100, "type": "channel", "title": "News"},
            "caption": "look", "author_signature": "Ed",
            "photo": [{"file_id": "small", "width": 90, "height": 60, "file_size": 900},
                      {"file_id": "large", "width": 1280, "height": 853, "file_size": 91000},
                      {"file_id": "mid", "width": 320, "height": 213, "file_size": 9000}]}),
        );
        let ev = map_message(&post, &me(), true).unwrap();
        assert_eq!(ev.source.chat_type, ChatType::Channel);
        assert_eq!(ev.source.user_id, None);
        assert_eq!(ev.source.chat_name.as_deref(), Some("News"));
        assert_eq!(ev.text, "look");
        assert_eq!(
            ev.attachments,
            [Attachment::remote(MediaKind::Image, "large")
                .sized(Some(91000))
                .claiming(Some("image/jpeg"))]
        );
    }

    #[test]
    fn reply_thread_ids_outside_forums_are_ignored() {
        let m = msg(json!({"message_id": 3, "message_thread_id": 2,
            "chat": {"id": -5, "type": "supergroup"}, "text": "x", "from": {"id": 1, "first_name": "A"},
            "reply_to_message": {"message_id": 2, "chat": {"id": -5, "type": "supergroup"}, "text": "y"}}));
        assert_eq!(
            map_message(&m, &me(), false).unwrap().source.thread_id,
            None
        );
        // In a forum, a reply in General carries a thread id but is not a topic message.
        let m = msg(json!({"message_id": 3, "message_thread_id": 2,
            "chat": {"id": -5, "type": "supergroup", "is_forum": true}, "text": "x", "from": {"id": 1, "first_name": "A"},
            "reply_to_message": {"message_id": 2, "chat": {"id": -5, "type": "supergroup"}, "text": "y"}}));
        assert_eq!(
            map_message(&m, &me(), false)
                .unwrap()
                .source
                .thread_id
                .as_deref(),
            Some("1")
        );
    }
}
