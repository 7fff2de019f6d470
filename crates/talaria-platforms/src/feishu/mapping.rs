//! Feishu's event envelope (schema 2.0) and what it becomes.
//!
//! - `im.message.receive_v1`: p2p chats are DMs, group and topic chats are
//!   groups; the chat id is `oc_…`, the sender its `open_id`; a topic
//!   message's `thread_id` is the thread. In groups the bot must be
//!   @mentioned (unless `require_mention` is off); its `@_user_N`
//!   placeholder is removed from the text, other people's are replaced by
//!   their names.
//! - `drive.notice.comment_add_v1`: a comment addressed to the bot (see
//!   the `comments` module).

use serde_json::Value;
use talaria_adapter::{ChatType, MessageEvent, SessionSource};

use super::PLATFORM;

/// What one event is.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// A chat message for the runner.
    Message(Box<MessageEvent>),
    /// A document comment addressed to the bot.
    Comment(super::comments::Comment),
    /// Authentic, but nothing to answer; the reason is logged.
    Ignored(String),
}

/// The header's `event_id` (a re-delivery carries the same one).
pub(crate) fn event_id(envelope: &Value) -> Option<&str> {
    envelope
        .pointer("/header/event_id")
        .or_else(|| envelope.get("uuid"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// The verification token an event carries (v2 header, or v1 top level).
pub(crate) fn token(envelope: &Value) -> Option<&str> {
    envelope
        .pointer("/header/token")
        .or_else(|| envelope.get("token"))
        .and_then(Value::as_str)
}

/// Maps one authentic event.
pub(crate) fn map_event(
    envelope: &Value,
    bot_open_id: Option<&str>,
    require_mention: bool,
) -> Inbound {
    let kind = envelope
        .pointer("/header/event_type")
        .and_then(Value::as_str)
        .unwrap_or("");
    let Some(event) = envelope.get("event") else {
        return Inbound::Ignored("an event without a body".into());
    };
    match kind {
        "im.message.receive_v1" => map_message(event, bot_open_id, require_mention),
        "drive.notice.comment_add_v1" => {
            match super::comments::Comment::from_event(event, bot_open_id) {
                Ok(c) => Inbound::Comment(c),
                Err(why) => Inbound::Ignored(why),
            }
        }
        other => Inbound::Ignored(format!("event type {other:?} is not handled")),
    }
}

fn text_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

fn map_message(event: &Value, bot_open_id: Option<&str>, require_mention: bool) -> Inbound {
    let sender_type = text_at(event, "/sender/sender_type").unwrap_or("user");
    let Some(open_id) = text_at(event, "/sender/sender_id/open_id") else {
        return Inbound::Ignored("a message without a sender open_id".into());
    };
    if bot_open_id == Some(open_id) || sender_type == "app" {
        return Inbound::Ignored("the bot's own message".into());
    }
    let message = &event["message"];
    let (Some(message_id), Some(chat_id)) = (
        text_at(message, "/message_id"),
        text_at(message, "/chat_id"),
    ) else {
        return Inbound::Ignored("a message without message_id or chat_id".into());
    };
    let chat_type = match text_at(message, "/chat_type") {
        Some("p2p") => ChatType::Dm,
        _ => ChatType::Group,
    };
    let mentions: Vec<&Value> = message
        .get("mentions")
        .and_then(Value::as_array)
        .map(|m| m.iter().collect())
        .unwrap_or_default();
    let is_bot_mention = |m: &Value| {
        let id = text_at(m, "/id/open_id");
        bot_open_id.is_some() && id == bot_open_id
    };
    let mentioned = mentions.iter().any(|m| is_bot_mention(m))
        || mentions.iter().any(|m| text_at(m, "/key") == Some("@_all"));
    if chat_type == ChatType::Group && require_mention && !mentioned {
        return Inbound::Ignored("a group message that does not mention the bot".into());
    }
    let message_type = text_at(message, "/message_type").unwrap_or("");
    let content: Value = text_at(message, "/content")
        .and_then(|c| serde_json::from_str(c).ok())
        .unwrap_or(Value::Null);
    let (mut text, attachments) = match message_type {
        "text" => (
            content
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            Vec::new(),
        ),
        "post" => (
            post_text(&content),
            super::media::of_post(post_body(&content), message_id),
        ),
        "image" | "file" | "audio" | "media" => {
            match super::media::of_message(message_type, &content, message_id) {
                Some(a) => (String::new(), vec![a]),
                None => {
                    return Inbound::Ignored(format!(
                        "a {message_type:?} message without a usable key"
                    ));
                }
            }
        }
        other => {
            return Inbound::Ignored(format!(
                "a {other:?} message (only text, post, image, file, audio and media are read)"
            ));
        }
    };
    for m in &mentions {
        let Some(key) = text_at(m, "/key") else {
            continue;
        };
        let replacement = if is_bot_mention(m) {
            String::new()
        } else {
            format!("@{}", text_at(m, "/name").unwrap_or("someone"))
        };
        text = text.replace(key, &replacement);
    }
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.is_empty() && attachments.is_empty() {
        return Inbound::Ignored("an empty message".into());
    }
    let thread_id = text_at(message, "/thread_id").map(str::to_owned);
    let reply_to = text_at(message, "/parent_id").map(str::to_owned);
    let source = SessionSource {
        platform: PLATFORM.to_owned(),
        chat_id: chat_id.to_owned(),
        chat_name: None,
        chat_type,
        user_id: Some(open_id.to_owned()),
        user_name: None,
        thread_id,
        is_bot: sender_type == "bot",
    };
    let mut event = MessageEvent::text(source, text);
    event.message_id = Some(message_id.to_owned());
    event.reply_to_message_id = reply_to;
    event.attachments = attachments;
    Inbound::Message(Box::new(event))
}

/// A post's `{title, content}`: received posts are either that or keyed
/// by language.
fn post_body(content: &Value) -> &Value {
    if content.get("content").is_some() {
        content
    } else {
        content
            .as_object()
            .and_then(|o| o.values().next())
            .unwrap_or(&Value::Null)
    }
}

/// The text of a rich-text (`post`) message: its title and every text,
/// link, mention and markdown element, one paragraph a line.
fn post_text(content: &Value) -> String {
    let body = post_body(content);
    let mut lines = Vec::new();
    if let Some(title) = body
        .get("title")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        lines.push(title.to_owned());
    }
    for row in body
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let mut line = String::new();
        for el in row.as_array().into_iter().flatten() {
            match el.get("tag").and_then(Value::as_str) {
                Some("text" | "md" | "code_block") => {
                    line.push_str(el.get("text").and_then(Value::as_str).unwrap_or(""));
                }
                Some("a") => {
                    line.push_str(el.get("text").and_then(Value::as_str).unwrap_or(""));
                }
                Some("at") => {
                    // The placeholder is replaced like a text's mentions.
                    line.push_str(el.get("user_id").and_then(Value::as_str).unwrap_or(""));
                }
                _ => {}
            }
        }
        lines.push(line);
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn message(chat_type: &str, text: &str, mentions: Value) -> Value {
        json!({
            "schema": "2.0",
            "header": {"event_id": "ev1", "event_type": "im.message.receive_v1", "token": "t"},
            "event": {
                "sender": {"sender_id": {"open_id": "ou_ada"}, "sender_type": "user"},
                "message": {
                    "message_id": "om_1", "chat_id": "oc_1", "chat_type": chat_type,
                    "message_type": "text",
                    "content": json!({"text": text}).to_string(),
                    "mentions": mentions,
                }
            }
        })
    }

    #[test]
    fn p2p_is_a_dm_and_groups_need_the_mention() {
        let Inbound::Message(e) = map_event(&message("p2p", "hi", json!([])), Some("ou_bot"), true)
        else {
            panic!()
        };
        assert_eq!(e.source.chat_type, ChatType::Dm);
        assert_eq!(e.source.user_id.as_deref(), Some("ou_ada"));
        assert_eq!(e.text, "hi");
        let unaddressed = message("group", "hi all", json!([]));
        assert!(matches!(
            map_event(&unaddressed, Some("ou_bot"), true),
            Inbound::Ignored(_)
        ));
        assert!(matches!(
            map_event(&unaddressed, Some("ou_bot"), false),
            Inbound::Message(_)
        ));
        let mentions = json!([
            {"key": "@_user_1", "id": {"open_id": "ou_bot"}, "name": "Talaria"},
            {"key": "@_user_2", "id": {"open_id": "ou_bob"}, "name": "Bob"},
        ]);
        let addressed = message("group", "@_user_1 ask @_user_2 too", mentions);
        let Inbound::Message(e) = map_event(&addressed, Some("ou_bot"), true) else {
            panic!()
        };
        assert_eq!(e.text, "ask @Bob too");
        assert_eq!(e.source.chat_type, ChatType::Group);
    }

    #[test]
    fn own_messages_and_other_types_are_ignored() {
        let mut own = message("p2p", "hi", json!([]));
        own["event"]["sender"]["sender_id"]["open_id"] = json!("ou_bot");
        assert!(matches!(
            map_event(&own, Some("ou_bot"), true),
            Inbound::Ignored(_)
        ));
        let mut sticker = message("p2p", "x", json!([]));
        sticker["event"]["message"]["message_type"] = json!("sticker");
        assert!(matches!(
            map_event(&sticker, Some("ou_bot"), true),
            Inbound::Ignored(_)
        ));
        // An image without a key is nothing to answer either.
        let mut keyless = message("p2p", "x", json!([]));
        keyless["event"]["message"]["message_type"] = json!("image");
        assert!(matches!(
            map_event(&keyless, Some("ou_bot"), true),
            Inbound::Ignored(_)
        ));
    }

    #[test]
    fn an_image_message_is_an_attachment_without_text() {
        let mut image = message("p2p", "x", json!([]));
        image["event"]["message"]["message_type"] = json!("image");
        image["event"]["message"]["content"] = json!(json!({"image_key": "img_v3_1"}).to_string());
        let Inbound::Message(e) = map_event(&image, Some("ou_bot"), true) else {
            panic!()
        };
        assert_eq!(e.text, "");
        assert_eq!(e.attachments.len(), 1);
        assert_eq!(
            e.attachments[0].source,
            talaria_adapter::AttachmentSource::Remote("image:om_1:img_v3_1".into())
        );
    }

    #[test]
    fn posts_are_read_as_text() {
        let content = json!({"title": "T", "content": [[{"tag": "text", "text": "a "}, {"tag": "md", "text": "**b**"}]]});
        assert_eq!(post_text(&content), "T\na **b**");
        let keyed = json!({"zh_cn": content});
        assert_eq!(post_text(&keyed), "T\na **b**");
    }
}
