//! What a BlueBubbles message becomes.
//!
//! The server posts `{type, data}`; `new-message` and `updated-message`
//! carry a message (`guid`, `text`, `isFromMe`, `handle.address`,
//! `chats[]`, `attachments[]`, `associatedMessageType`,
//! `threadOriginatorGuid`, `dateCreated`). The same message shape comes
//! back from `POST /api/v1/message/query`, which the adapter reads to
//! catch up on what arrived while it was away.
//!
//! - The bot's own messages (`isFromMe`, which the server echoes) and
//!   tapbacks (an `associatedMessageType`) are skipped.
//! - The chat is the chat's guid: `iMessage;-;+15551234567` one-to-one,
//!   `iMessage;+;chat…` a group (`SMS;…` through the Mac's phone relay).
//! - In a group with wake words required, a message is taken only when a
//!   wake word matches, and the wake word is cut out.
//! - The message guid is the id the runner dedupes on, so an
//!   `updated-message` of a message already taken starts no second turn.

use regex::Regex;
use serde_json::Value;
use talaria_adapter::{Attachment, ChatType, MediaKind, MessageEvent, SessionSource};

use super::PLATFORM;

/// How a message is read.
#[derive(Debug)]
pub(crate) struct Rules<'a> {
    pub require_mention: bool,
    pub wake_words: &'a [Regex],
}

/// What a message became.
#[derive(Debug)]
pub(crate) enum Mapped {
    /// Hand this to the runner.
    Event(Box<MessageEvent>),
    /// Leave it, for this reason (logged at debug).
    Skip(&'static str),
}

/// The longest id or address taken from a payload.
const MAX_ID_LEN: usize = 256;

fn text(v: &Value) -> Option<&str> {
    v.as_str()
        .map(str::trim)
        .filter(|s| !s.is_empty() && s.len() <= MAX_ID_LEN)
}

/// Whether a chat guid names a group (`;+;`) rather than a one-to-one
/// chat (`;-;`).
pub(crate) fn is_group_guid(guid: &str) -> bool {
    guid.contains(";+;")
}

/// The message's creation time, Unix milliseconds.
pub(crate) fn created_ms(message: &Value) -> Option<i64> {
    message["dateCreated"].as_i64()
}

/// Maps one message (a webhook's `data`, or an item of a query).
pub(crate) fn map_message(message: &Value, rules: &Rules<'_>) -> Mapped {
    if message["isFromMe"].as_bool() == Some(true) {
        return Mapped::Skip("the bot's own message");
    }
    let associated = &message["associatedMessageType"];
    let is_tapback = match associated {
        Value::Number(n) => n.as_i64().is_some_and(|n| n != 0),
        Value::String(s) => !s.is_empty(),
        _ => false,
    };
    if is_tapback {
        return Mapped::Skip("a tapback");
    }
    let Some(guid) = text(&message["guid"]) else {
        return Mapped::Skip("a message without a guid");
    };
    let sender = text(&message["handle"]["address"]);
    let chat = message["chats"]
        .as_array()
        .and_then(|chats| chats.first())
        .and_then(|c| text(&c["guid"]))
        .or_else(|| text(&message["chatGuid"]));
    let (chat_id, chat_name, group) = match (chat, sender) {
        (Some(chat), _) => {
            let group = is_group_guid(chat)
                || message["chats"][0]["style"].as_i64() == Some(43)
                || message["isGroup"].as_bool() == Some(true);
            let name = message["chats"][0]["displayName"]
                .as_str()
                .filter(|n| !n.is_empty())
                .map(str::to_owned);
            (chat.to_owned(), name, group)
        }
        // Older servers without `chats`: the sender's one-to-one chat.
        (None, Some(address)) => (format!("iMessage;-;{address}"), None, false),
        (None, None) => return Mapped::Skip("a message without a chat or a sender"),
    };
    let Some(sender) = sender else {
        return Mapped::Skip("a message without a sender");
    };
    let mut body = message["text"].as_str().unwrap_or_default().to_owned();
    // iMessage puts U+FFFC where an attachment sits in the text.
    body = body.replace('\u{fffc}', "").trim().to_owned();
    let attachments: Vec<Attachment> = message["attachments"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(attachment)
        .collect();
    if group && rules.require_mention {
        let Some(stripped) = strip_wake_word(&body, rules.wake_words) else {
            return Mapped::Skip("a group message without a wake word");
        };
        body = stripped;
    }
    if body.is_empty() && attachments.is_empty() {
        return Mapped::Skip("an empty message");
    }
    let source = SessionSource {
        platform: PLATFORM.to_owned(),
        chat_id,
        chat_name,
        chat_type: if group { ChatType::Group } else { ChatType::Dm },
        user_id: Some(sender.to_owned()),
        user_name: None,
        thread_id: None,
        is_bot: false,
    };
    let mut event = MessageEvent::text(source, body);
    event.message_id = Some(guid.to_owned());
    event.reply_to_message_id = text(&message["threadOriginatorGuid"]).map(str::to_owned);
    event.attachments = attachments;
    Mapped::Event(Box::new(event))
}

fn attachment(a: &Value) -> Option<Attachment> {
    let guid = text(&a["guid"])?;
    let mime = a["mimeType"].as_str().unwrap_or_default();
    let name = a["transferName"].as_str().filter(|n| !n.is_empty());
    let kind = if mime.starts_with("image/") {
        MediaKind::Image
    } else if mime.starts_with("video/") {
        MediaKind::Video
    } else if mime.starts_with("audio/") {
        // Voice memos recorded in Messages are .caf audio.
        if name.is_some_and(|n| n.ends_with(".caf")) || a["isVoiceMemo"].as_bool() == Some(true) {
            MediaKind::Voice
        } else {
            MediaKind::Audio
        }
    } else {
        MediaKind::Document
    };
    Some(
        Attachment::remote(kind, guid)
            .named(name)
            .claiming(Some(mime).filter(|m| !m.is_empty()))
            .sized(a["totalBytes"].as_u64()),
    )
}

/// `text` without its first wake word, or `None` when none matches.
fn strip_wake_word(text: &str, wake_words: &[Regex]) -> Option<String> {
    let m = wake_words.iter().find_map(|w| w.find(text))?;
    let mut out = String::with_capacity(text.len());
    out.push_str(&text[..m.start()]);
    out.push_str(&text[m.end()..]);
    let cleaned = out
        .trim_matches(|c: char| c.is_whitespace() || matches!(c, ',' | ':' | '!'))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    Some(cleaned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn words() -> Vec<Regex> {
        vec![
            regex::RegexBuilder::new(r"\btalaria\b")
                .case_insensitive(true)
                .build()
                .unwrap(),
        ]
    }

    fn message(chat: &str, text: &str) -> Value {
        json!({
            "guid": "p:0/ABC-1", "text": text, "isFromMe": false,
            "handle": {"address": "+15552223333"},
            "chats": [{"guid": chat, "chatIdentifier": "x", "displayName": ""}],
            "attachments": [], "associatedMessageType": null, "dateCreated": 1700000000000i64,
        })
    }

    fn event(m: Mapped) -> MessageEvent {
        match m {
            Mapped::Event(e) => *e,
            Mapped::Skip(why) => panic!("skipped: {why}"),
        }
    }

    #[test]
    fn a_one_to_one_message_is_a_dm_in_its_chat() {
        let w = words();
        let rules = Rules {
            require_mention: true,
            wake_words: &w,
        };
        let e = event(map_message(
            &message("iMessage;-;+15552223333", "hi"),
            &rules,
        ));
        assert_eq!(e.source.chat_id, "iMessage;-;+15552223333");
        assert_eq!(e.source.chat_type, ChatType::Dm);
        assert_eq!(e.source.user_id.as_deref(), Some("+15552223333"));
        assert_eq!(e.message_id.as_deref(), Some("p:0/ABC-1"));
        // Without chats, the sender's chat.
        let mut m = message("x", "hi");
        m["chats"] = json!([]);
        let e = event(map_message(&m, &rules));
        assert_eq!(e.source.chat_id, "iMessage;-;+15552223333");
    }

    #[test]
    fn groups_need_a_wake_word_when_told_and_lose_it() {
        let w = words();
        let strict = Rules {
            require_mention: true,
            wake_words: &w,
        };
        let g = "iMessage;+;chat123456";
        assert!(matches!(
            map_message(&message(g, "just us"), &strict),
            Mapped::Skip(_)
        ));
        let e = event(map_message(
            &message(g, "Talaria, what time is it"),
            &strict,
        ));
        assert_eq!(e.text, "what time is it");
        assert_eq!(e.source.chat_type, ChatType::Group);
        let open = Rules {
            require_mention: false,
            wake_words: &w,
        };
        assert_eq!(
            event(map_message(&message(g, "just us"), &open)).text,
            "just us"
        );
    }

    #[test]
    fn echoes_tapbacks_and_empties_are_skipped_and_files_listed() {
        let w = words();
        let rules = Rules {
            require_mention: false,
            wake_words: &w,
        };
        let chat = "iMessage;-;+15552223333";
        let mut mine = message(chat, "hi");
        mine["isFromMe"] = json!(true);
        assert!(matches!(map_message(&mine, &rules), Mapped::Skip(_)));
        let mut tap = message(chat, "Loved “hi”");
        tap["associatedMessageType"] = json!(2000);
        assert!(matches!(map_message(&tap, &rules), Mapped::Skip(_)));
        assert!(matches!(
            map_message(&message(chat, " "), &rules),
            Mapped::Skip(_)
        ));
        let mut photo = message(chat, "\u{fffc}");
        photo["attachments"] = json!([
            {"guid": "at-1", "mimeType": "image/jpeg", "transferName": "IMG_1.jpeg", "totalBytes": 10},
            {"guid": "at-2", "mimeType": "audio/x-caf", "transferName": "Audio Message.caf"},
            {"guid": "at-3", "mimeType": "application/pdf", "transferName": "a.pdf"},
        ]);
        photo["threadOriginatorGuid"] = json!("p:0/FIRST");
        let e = event(map_message(&photo, &rules));
        assert_eq!(e.text, "");
        let kinds: Vec<MediaKind> = e.attachments.iter().map(|a| a.kind).collect();
        assert_eq!(
            kinds,
            [MediaKind::Image, MediaKind::Voice, MediaKind::Document]
        );
        assert_eq!(e.reply_to_message_id.as_deref(), Some("p:0/FIRST"));
    }
}
