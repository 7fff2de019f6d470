//! Room timeline events to [`MessageEvent`]s.
//!
//! Events are read as loose JSON: one malformed event is skipped with a
//! reason, never a reason to drop the rest of a sync batch.

use serde_json::Value;
use talaria_adapter::{Attachment, ChatType, MediaKind, MessageEvent, SessionSource};

/// The bot's own account: mentions are matched against it and its own
/// messages are never taken as input.
#[derive(Debug, Clone)]
pub(crate) struct Me {
    pub user_id: String,
    pub display_name: Option<String>,
    /// The device the access token belongs to (whoami's `device_id`).
    pub device_id: Option<String>,
}

/// What the adapter knows about the room an event is in.
#[derive(Debug, Clone)]
pub(crate) struct RoomView {
    pub room_id: String,
    pub name: Option<String>,
    pub is_dm: bool,
    /// The sender's display name in this room, when a member event told.
    pub sender_name: Option<String>,
}

/// Whether a group message continues a conversation with the bot without
/// naming it: a reply to one of the bot's messages, or a message in a
/// thread the bot has written in.
pub(crate) trait Conversation {
    fn is_own_event(&self, event_id: &str) -> bool;
    fn is_bot_thread(&self, root: &str) -> bool;
}

/// Why an event was not turned into a message (logged, never an error).
pub(crate) type Skip = &'static str;

/// The event's `m.relates_to`, read once.
struct Relation<'a> {
    thread_root: Option<&'a str>,
    in_reply_to: Option<&'a str>,
    /// `m.in_reply_to` is only there for clients without threads.
    falling_back: bool,
    is_edit: bool,
}

fn relation(content: &Value) -> Relation<'_> {
    let rel = content.get("m.relates_to");
    let rel_type = rel.and_then(|r| r.get("rel_type")).and_then(Value::as_str);
    Relation {
        thread_root: rel
            .filter(|_| rel_type == Some("m.thread"))
            .and_then(|r| r.get("event_id"))
            .and_then(Value::as_str),
        in_reply_to: rel
            .and_then(|r| r.get("m.in_reply_to"))
            .and_then(|r| r.get("event_id"))
            .and_then(Value::as_str),
        falling_back: rel
            .and_then(|r| r.get("is_falling_back"))
            .and_then(Value::as_bool)
            == Some(true),
        is_edit: rel_type == Some("m.replace"),
    }
}

/// Maps one `m.room.message` timeline event.
pub(crate) fn map_event(
    event: &Value,
    room: &RoomView,
    me: &Me,
    require_mention: bool,
    conversation: &dyn Conversation,
) -> Result<MessageEvent, Skip> {
    if event.get("type").and_then(Value::as_str) != Some("m.room.message") {
        return Err("not a room message");
    }
    let sender = event
        .get("sender")
        .and_then(Value::as_str)
        .ok_or("no sender")?;
    if sender == me.user_id {
        return Err("the bot's own message");
    }
    let event_id = event
        .get("event_id")
        .and_then(Value::as_str)
        .ok_or("no event id")?;
    let content = event
        .get("content")
        .filter(|c| c.is_object())
        .ok_or("no content")?;
    let msgtype = content
        .get("msgtype")
        .and_then(Value::as_str)
        .ok_or("no msgtype (redacted?)")?;
    let body = content.get("body").and_then(Value::as_str).unwrap_or("");
    let rel = relation(content);
    if rel.is_edit {
        // Acting on an edit would run a second turn for one message.
        return Err("an edit of an earlier message");
    }
    let reply_to = rel.in_reply_to.filter(|_| !rel.falling_back);
    let (mut text, attachments) = match msgtype {
        "m.text" | "m.emote" => (strip_reply_fallback(body, reply_to.is_some()), Vec::new()),
        // Notices are what bots send: answering them invites bot loops.
        "m.notice" => return Err("a notice (bot output)"),
        "m.image" | "m.file" | "m.video" | "m.audio" => {
            let kind = match msgtype {
                "m.image" => MediaKind::Image,
                "m.video" => MediaKind::Video,
                // MSC3245: a clip recorded in the client as a voice message.
                "m.audio" if content.get("org.matrix.msc3245.voice").is_some() => MediaKind::Voice,
                "m.audio" => MediaKind::Audio,
                _ => MediaKind::Document,
            };
            let filename = content.get("filename").and_then(Value::as_str);
            let info = content.get("info");
            // In an encrypted room the address sits in `file`, with the
            // file's own key; the locator then carries both.
            let url = match content.get("file") {
                Some(file) => super::encrypted_media::locator(file),
                None => content
                    .get("url")
                    .and_then(Value::as_str)
                    .filter(|u| u.starts_with("mxc://"))
                    .map(str::to_owned),
            };
            let name = filename.unwrap_or(body);
            // With a separate filename, the body is the caption.
            let caption = match filename {
                Some(f) if f != body => body.to_owned(),
                _ => String::new(),
            };
            let attachments = url
                .map(|u| {
                    Attachment::remote(kind, &u)
                        .named(Some(name))
                        .claiming(info.and_then(|i| i.get("mimetype")).and_then(Value::as_str))
                        .sized(info.and_then(|i| i.get("size")).and_then(Value::as_u64))
                })
                .into_iter()
                .collect();
            (caption, attachments)
        }
        _ => return Err("a message type that is not supported"),
    };
    if text.trim().is_empty() && attachments.is_empty() {
        return Err("no text");
    }
    let mentioned = mentions_me(content, body, me);
    if require_mention && !room.is_dm {
        let continues = reply_to.is_some_and(|r| conversation.is_own_event(r))
            || rel
                .thread_root
                .is_some_and(|t| conversation.is_bot_thread(t));
        if !mentioned && !continues {
            return Err("group message does not address the bot");
        }
    }
    if mentioned {
        text = strip_mention(&text, me);
        if text.is_empty() && attachments.is_empty() {
            return Err("nothing but a mention");
        }
    }
    let source = SessionSource {
        platform: "matrix".to_owned(),
        chat_id: room.room_id.clone(),
        chat_name: room.name.clone(),
        chat_type: if room.is_dm {
            ChatType::Dm
        } else {
            ChatType::Group
        },
        user_id: Some(sender.to_owned()),
        user_name: room.sender_name.clone(),
        thread_id: rel.thread_root.map(str::to_owned),
        is_bot: false,
    };
    Ok(MessageEvent {
        source,
        text,
        message_id: Some(event_id.to_owned()),
        reply_to_message_id: reply_to.map(str::to_owned),
        reply_to_text: None,
        attachments,
        reply_target: None,
    })
}

/// Whether the message names the bot: in `m.mentions`, as a pill link in
/// the HTML, or by user id or display name in the text.
fn mentions_me(content: &Value, body: &str, me: &Me) -> bool {
    let listed = content
        .get("m.mentions")
        .and_then(|m| m.get("user_ids"))
        .and_then(Value::as_array)
        .is_some_and(|ids| ids.iter().any(|i| i.as_str() == Some(me.user_id.as_str())));
    let pill = content
        .get("formatted_body")
        .and_then(Value::as_str)
        .is_some_and(|h| h.contains(&format!("matrix.to/#/{}", me.user_id)));
    let lower = body.to_lowercase();
    let by_id = lower.contains(&me.user_id.to_lowercase());
    let by_name = me
        .display_name
        .as_deref()
        .filter(|n| !n.trim().is_empty())
        .is_some_and(|n| contains_word(&lower, &n.to_lowercase()));
    listed || pill || by_id || by_name
}

/// `needle` in `hay` not glued to letters or digits on either side.
fn contains_word(hay: &str, needle: &str) -> bool {
    let mut from = 0;
    while let Some(i) = hay[from..].find(needle) {
        let start = from + i;
        let end = start + needle.len();
        let before = hay[..start].chars().next_back();
        let after = hay[end..].chars().next();
        if !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric) {
            return true;
        }
        from = start + needle.len().max(1);
        while from < hay.len() && !hay.is_char_boundary(from) {
            from += 1;
        }
        if from >= hay.len() {
            break;
        }
    }
    false
}

/// The text without the bot's user id anywhere and without a leading
/// "Name:" address, which clients insert when a pill is clicked.
fn strip_mention(text: &str, me: &Me) -> String {
    let mut out = remove_case_insensitive(text, &me.user_id);
    if let Some(name) = me.display_name.as_deref().filter(|n| !n.trim().is_empty()) {
        let trimmed = out.trim_start().trim_start_matches('@');
        if let Some(head) = trimmed.get(..name.len())
            && head.eq_ignore_ascii_case(name)
            && !trimmed[name.len()..]
                .chars()
                .next()
                .is_some_and(char::is_alphanumeric)
        {
            out = trimmed[name.len()..].to_owned();
        }
    }
    out.trim_start_matches([':', ',', ' ']).trim().to_owned()
}

fn remove_case_insensitive(text: &str, needle: &str) -> String {
    if needle.is_empty() {
        return text.to_owned();
    }
    let lower_needle = needle.to_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    loop {
        let found = rest.char_indices().map(|(i, _)| i).find(|&i| {
            rest.get(i..i + needle.len())
                .is_some_and(|s| s.to_lowercase() == lower_needle)
        });
        match found {
            Some(i) => {
                out.push_str(&rest[..i]);
                rest = &rest[i + needle.len()..];
            }
            None => {
                out.push_str(rest);
                return out;
            }
        }
    }
}

/// Replies from older clients start with the quoted message (`> <@u:s>
/// text` lines, then a blank line); the quote is not what the user wrote.
fn strip_reply_fallback(body: &str, is_reply: bool) -> String {
    if !is_reply || !body.starts_with("> ") {
        return body.to_owned();
    }
    let mut lines = body.lines().peekable();
    while lines.next_if(|l| l.starts_with('>')).is_some() {}
    let rest: Vec<&str> = lines.collect();
    let rest = rest.join("\n");
    rest.trim_start_matches('\n').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Nobody;
    impl Conversation for Nobody {
        fn is_own_event(&self, event_id: &str) -> bool {
            event_id == "$bots"
        }
        fn is_bot_thread(&self, root: &str) -> bool {
            root == "$bot-thread"
        }
    }

    fn me() -> Me {
        Me {
            device_id: None,
            user_id: "@talaria:example.org".into(),
            display_name: Some("Talaria".into()),
        }
    }

    fn room(is_dm: bool) -> RoomView {
        RoomView {
            room_id: "!r:example.org".into(),
            name: Some("Room".into()),
            is_dm,
            sender_name: Some("Alice".into()),
        }
    }

    fn text_event(body: &str, extra: Value) -> Value {
        let mut content = json!({"msgtype": "m.text", "body": body});
        if let (Some(c), Some(e)) = (content.as_object_mut(), extra.as_object()) {
            c.extend(e.clone());
        }
        json!({"type": "m.room.message", "sender": "@alice:example.org",
               "event_id": "$e1", "content": content})
    }

    fn map(ev: &Value, is_dm: bool) -> Result<MessageEvent, Skip> {
        map_event(ev, &room(is_dm), &me(), true, &Nobody)
    }

    #[test]
    fn a_dm_text_maps_fully() {
        let ev = map(&text_event("hello", json!({})), true).unwrap();
        assert_eq!(ev.text, "hello");
        assert_eq!(ev.message_id.as_deref(), Some("$e1"));
        assert_eq!(ev.source.chat_type, ChatType::Dm);
        assert_eq!(ev.source.chat_id, "!r:example.org");
        assert_eq!(ev.source.user_id.as_deref(), Some("@alice:example.org"));
        assert_eq!(ev.source.user_name.as_deref(), Some("Alice"));
        assert_eq!(ev.source.thread_id, None);
    }

    #[test]
    fn group_messages_need_a_mention_which_is_stripped() {
        assert!(map(&text_event("hello all", json!({})), false).is_err());
        let by_name = map(&text_event("Talaria: what time is it?", json!({})), false).unwrap();
        assert_eq!(by_name.text, "what time is it?");
        assert_eq!(by_name.source.chat_type, ChatType::Group);
        let by_id = map(
            &text_event("hey @talaria:example.org, status?", json!({})),
            false,
        )
        .unwrap();
        assert_eq!(by_id.text, "hey , status?");
        let listed = map(
            &text_event(
                "status please",
                json!({"m.mentions": {"user_ids": ["@talaria:example.org"]}}),
            ),
            false,
        )
        .unwrap();
        assert_eq!(listed.text, "status please");
        // A word that merely contains the name is not a mention.
        assert!(map(&text_event("talarian ships", json!({})), false).is_err());
        // Replies to the bot and its threads continue without a mention.
        let reply = json!({"m.relates_to": {"m.in_reply_to": {"event_id": "$bots"}}});
        assert!(map(&text_event("and then?", reply), false).is_ok());
        let thread = json!({"m.relates_to": {"rel_type": "m.thread", "event_id": "$bot-thread",
            "is_falling_back": true, "m.in_reply_to": {"event_id": "$x"}}});
        let ev = map(&text_event("more", thread), false).unwrap();
        assert_eq!(ev.source.thread_id.as_deref(), Some("$bot-thread"));
        assert_eq!(ev.reply_to_message_id, None, "a fallback is not a reply");
    }

    #[test]
    fn own_notices_edits_and_odd_events_are_skipped() {
        let mut own = text_event("hi", json!({}));
        own["sender"] = json!("@talaria:example.org");
        assert_eq!(map(&own, true).err(), Some("the bot's own message"));
        let mut notice = text_event("hi", json!({}));
        notice["content"]["msgtype"] = json!("m.notice");
        assert!(map(&notice, true).is_err());
        let edit = text_event(
            "* fixed",
            json!({"m.relates_to": {"rel_type": "m.replace", "event_id": "$e0"}}),
        );
        assert!(map(&edit, true).is_err());
        assert!(map(&json!({"type": "m.room.message"}), true).is_err());
        assert!(map(&json!({"type": "m.room.message", "sender": 5}), true).is_err());
        let mut redacted = text_event("x", json!({}));
        redacted["content"] = json!({});
        assert!(map(&redacted, true).is_err());
    }

    #[test]
    fn files_are_attachments_and_replies_lose_their_quote() {
        let mut ev = text_event("cat.png", json!({"url": "mxc://example.org/abc"}));
        ev["content"]["msgtype"] = json!("m.image");
        let m = map(&ev, true).unwrap();
        assert_eq!(m.text, "");
        assert_eq!(
            m.attachments,
            vec![
                Attachment::remote(MediaKind::Image, "mxc://example.org/abc")
                    .named(Some("cat.png"))
            ]
        );
        let reply = text_event(
            "> <@bob:example.org> old words\n> more\n\nmy answer",
            json!({"m.relates_to": {"m.in_reply_to": {"event_id": "$old"}}}),
        );
        let m = map(&reply, true).unwrap();
        assert_eq!(m.text, "my answer");
        assert_eq!(m.reply_to_message_id.as_deref(), Some("$old"));
    }
}
