//! What a LINE webhook body holds, and what each event becomes.
//!
//! A body is `{destination, events: [...]}`; `destination` is the bot's own
//! user id. Only `message` events become [`MessageEvent`]s:
//!
//! - the chat is where the answer goes: the user (`U…`) in a one-to-one
//!   chat, the group (`C…`) or the multi-person room (`R…`) otherwise;
//! - in a group or room the bot answers only when mentioned (unless told
//!   otherwise), and the mention is cut out of the text;
//! - photos, videos, voice messages and files become attachments fetched
//!   by message id; stickers and locations are described in words;
//! - `mode: standby` events belong to another channel of a multi-channel
//!   setup, which answers them: skipped.
//!
//! Follows, joins, postbacks and the rest are counted and logged, never
//! handed on.

use serde::Deserialize;
use talaria_adapter::{Attachment, ChatType, MediaKind, MessageEvent, SessionSource};

use super::PLATFORM;

/// A message event, with what answering it needs.
#[derive(Debug)]
pub(crate) struct Inbound {
    pub event: MessageEvent,
    /// Single use, valid about a minute.
    pub reply_token: Option<String>,
    /// Quotes the message in an answer.
    pub quote_token: Option<String>,
}

/// One webhook body, mapped.
#[derive(Debug, Default)]
pub(crate) struct Mapped {
    pub messages: Vec<Inbound>,
    /// Why events were left alone, for the log.
    pub skipped: Vec<String>,
}

#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    destination: String,
    #[serde(default)]
    events: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    reply_token: Option<String>,
    #[serde(default)]
    source: Option<Source>,
    #[serde(default)]
    message: Option<Message>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Source {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    user_id: Option<String>,
    #[serde(default)]
    group_id: Option<String>,
    #[serde(default)]
    room_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Message {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    mention: Option<Mention>,
    #[serde(default)]
    quote_token: Option<String>,
    #[serde(default)]
    quoted_message_id: Option<String>,
    #[serde(default)]
    file_name: Option<String>,
    #[serde(default)]
    content_provider: Option<ContentProvider>,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    address: Option<String>,
    #[serde(default)]
    latitude: Option<f64>,
    #[serde(default)]
    longitude: Option<f64>,
}

#[derive(Deserialize)]
struct Mention {
    #[serde(default)]
    mentionees: Vec<Mentionee>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Mentionee {
    #[serde(default)]
    index: usize,
    #[serde(default)]
    length: usize,
    #[serde(default)]
    user_id: Option<String>,
    #[serde(default)]
    is_self: Option<bool>,
}

#[derive(Deserialize)]
struct ContentProvider {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default, rename = "originalContentUrl")]
    original: Option<String>,
}

/// Whether `id` is a LINE user, group or room id: the letter, then 32
/// lower-case hex digits.
pub(crate) fn is_line_id(id: &str, kinds: &[char]) -> bool {
    let mut chars = id.chars();
    chars.next().is_some_and(|c| kinds.contains(&c))
        && id.len() == 33
        && chars.all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
}

/// Maps a signed webhook body. `Err` only when it is not LINE's shape at
/// all.
pub(crate) fn map_delivery(body: &[u8], require_mention: bool) -> Result<Mapped, String> {
    let body: Body = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let mut mapped = Mapped::default();
    for raw in body.events {
        let event: Event = match serde_json::from_value(raw) {
            Ok(e) => e,
            Err(e) => {
                mapped
                    .skipped
                    .push(format!("an event of an unknown shape: {e}"));
                continue;
            }
        };
        match map_event(event, &body.destination, require_mention) {
            Ok(Some(inbound)) => mapped.messages.push(inbound),
            Ok(None) => {}
            Err(why) => mapped.skipped.push(why),
        }
    }
    Ok(mapped)
}

/// One event: `Ok(None)` for a group message not addressed to the bot.
fn map_event(event: Event, bot_id: &str, require_mention: bool) -> Result<Option<Inbound>, String> {
    if event.kind != "message" {
        return Err(format!("a {} event", event.kind));
    }
    if event.mode.as_deref() == Some("standby") {
        return Err("a message for the channel that is active in this chat (standby mode)".into());
    }
    let (Some(source), Some(message)) = (event.source, event.message) else {
        return Err("a message event without a source or a message".into());
    };
    let user = source.user_id.filter(|u| is_line_id(u, &['U']));
    let (chat_id, chat_type) = match source.kind.as_str() {
        "user" => (user.clone(), ChatType::Dm),
        "group" => (source.group_id, ChatType::Group),
        "room" => (source.room_id, ChatType::Group),
        other => return Err(format!("a message from a source of type {other:?}")),
    };
    let Some(chat_id) = chat_id.filter(|c| is_line_id(c, &['U', 'C', 'R'])) else {
        return Err("a message whose chat id is not a LINE id".into());
    };
    let shared = chat_type.is_shared();
    let mut text = String::new();
    let mut attachments = Vec::new();
    match message.kind.as_str() {
        "text" => {
            let raw = message.text.clone().unwrap_or_default();
            let mine: Vec<&Mentionee> = message
                .mention
                .as_ref()
                .map(|m| {
                    m.mentionees
                        .iter()
                        .filter(|m| {
                            m.is_self == Some(true)
                                || (!bot_id.is_empty() && m.user_id.as_deref() == Some(bot_id))
                        })
                        .collect()
                })
                .unwrap_or_default();
            if shared && require_mention && mine.is_empty() {
                return Ok(None);
            }
            text = cut_spans(&raw, mine.iter().map(|m| (m.index, m.length)));
        }
        kind @ ("image" | "video" | "audio" | "file") => {
            if shared && require_mention {
                // A file cannot mention anyone.
                return Ok(None);
            }
            let media = match kind {
                "image" => MediaKind::Image,
                "video" => MediaKind::Video,
                // LINE's audio messages are recorded in the app.
                "audio" => MediaKind::Voice,
                _ => MediaKind::Document,
            };
            match message.content_provider.as_ref() {
                Some(p) if p.kind == "external" => {
                    // Sent through another bot's API with a URL of its own;
                    // fetching a URL a chat chose is not done.
                    text = format!(
                        "[a {kind} hosted elsewhere: {}]",
                        p.original.as_deref().unwrap_or("no address")
                    );
                }
                _ => attachments.push(
                    Attachment::remote(media, &message.id)
                        .named(message.file_name.as_deref().filter(|n| !n.is_empty())),
                ),
            }
        }
        "sticker" => {
            if shared && require_mention {
                return Ok(None);
            }
            text = "[a sticker]".to_owned();
        }
        "location" => {
            if shared && require_mention {
                return Ok(None);
            }
            text = describe_location(&message);
        }
        other => return Err(format!("a {other} message")),
    }
    let source = SessionSource {
        platform: PLATFORM.to_owned(),
        chat_id,
        chat_name: None,
        chat_type,
        user_id: user,
        user_name: None,
        thread_id: None,
        is_bot: false,
    };
    let mut event_out = MessageEvent::text(source, text.trim().to_owned());
    event_out.message_id = Some(message.id);
    event_out.reply_to_message_id = message.quoted_message_id;
    event_out.attachments = attachments;
    Ok(Some(Inbound {
        event: event_out,
        reply_token: event.reply_token.filter(|t| !t.is_empty()),
        quote_token: message.quote_token.filter(|t| !t.is_empty()),
    }))
}

fn describe_location(m: &Message) -> String {
    let mut parts = Vec::new();
    if let Some(t) = m.title.as_deref().filter(|t| !t.is_empty()) {
        parts.push(t.to_owned());
    }
    if let Some(a) = m.address.as_deref().filter(|a| !a.is_empty()) {
        parts.push(a.to_owned());
    }
    if let (Some(lat), Some(lon)) = (m.latitude, m.longitude) {
        parts.push(format!("{lat:.6}, {lon:.6}"));
    }
    format!("[a location: {}]", parts.join(", "))
}

/// `text` without the spans, which LINE counts in UTF-16 code units.
/// Spans that do not fit the text are ignored.
fn cut_spans(text: &str, spans: impl Iterator<Item = (usize, usize)>) -> String {
    let total: usize = text.encode_utf16().count();
    let spans: Vec<(usize, usize)> = spans
        .filter(|&(i, n)| n > 0 && i.checked_add(n).is_some_and(|end| end <= total))
        .map(|(i, n)| (i, i + n))
        .collect();
    if spans.is_empty() {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut unit = 0;
    for c in text.chars() {
        if !spans.iter().any(|&(a, b)| unit >= a && unit < b) {
            out.push(c);
        }
        unit += c.len_utf16();
    }
    // "@bot  hello" loses the mention and keeps one space.
    out.split(' ')
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const BOT: &str = "Ubbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    const ADA: &str = "U0123456789abcdef0123456789abcdef";
    const GROUP: &str = "C0123456789abcdef0123456789abcdef";

    fn body(events: serde_json::Value) -> Vec<u8> {
        json!({"destination": BOT, "events": events})
            .to_string()
            .into_bytes()
    }

    fn text_event(
        source: serde_json::Value,
        text: &str,
        mention: serde_json::Value,
    ) -> serde_json::Value {
        json!({
            "type": "message", "mode": "active", "timestamp": 1, "webhookEventId": "01H",
            "deliveryContext": {"isRedelivery": false}, "replyToken": "rt-1",
            "source": source,
            "message": {"id": "468789577898262530", "type": "text", "text": text,
                        "quoteToken": "q-1", "mention": mention}
        })
    }

    #[test]
    fn a_dm_is_from_its_user_with_its_tokens() {
        let m = map_delivery(
            &body(json!([text_event(
                json!({"type": "user", "userId": ADA}),
                "hello",
                json!(null)
            )])),
            true,
        )
        .unwrap();
        assert!(m.skipped.is_empty(), "{:?}", m.skipped);
        let one = &m.messages[0];
        assert_eq!(one.event.source.chat_id, ADA);
        assert_eq!(one.event.source.user_id.as_deref(), Some(ADA));
        assert_eq!(one.event.source.chat_type, ChatType::Dm);
        assert_eq!(one.event.text, "hello");
        assert_eq!(one.event.message_id.as_deref(), Some("468789577898262530"));
        assert_eq!(one.reply_token.as_deref(), Some("rt-1"));
        assert_eq!(one.quote_token.as_deref(), Some("q-1"));
    }

    #[test]
    fn a_group_message_needs_the_bots_mention_which_is_cut_out() {
        let src = json!({"type": "group", "groupId": GROUP, "userId": ADA});
        let plain = text_event(src.clone(), "just chatting", json!(null));
        // "@Talaria 🙂 time?": the emoji is two UTF-16 units.
        let addressed = text_event(
            src.clone(),
            "hi @Talaria 🙂 time?",
            json!({"mentionees": [{"index": 3, "length": 8, "type": "user", "isSelf": true}]}),
        );
        let other = text_event(
            src,
            "@Bob look",
            json!({"mentionees": [{"index": 0, "length": 4, "type": "user", "userId": ADA, "isSelf": false}]}),
        );
        let m = map_delivery(&body(json!([plain, addressed, other])), true).unwrap();
        assert_eq!(m.messages.len(), 1);
        let e = &m.messages[0].event;
        assert_eq!(e.text, "hi 🙂 time?");
        assert_eq!(e.source.chat_id, GROUP);
        assert_eq!(e.source.chat_type, ChatType::Group);
        // By user id too, for bodies without isSelf.
        let by_id = text_event(
            json!({"type": "room", "roomId": GROUP.replacen('C', "R", 1), "userId": ADA}),
            "@Talaria hi",
            json!({"mentionees": [{"index": 0, "length": 8, "type": "user", "userId": BOT}]}),
        );
        let m = map_delivery(&body(json!([by_id])), true).unwrap();
        assert_eq!(m.messages[0].event.text, "hi");
        // Without the requirement every group message is taken.
        let plain = text_event(
            json!({"type": "group", "groupId": GROUP, "userId": ADA}),
            "just chatting",
            json!(null),
        );
        assert_eq!(
            map_delivery(&body(json!([plain])), false)
                .unwrap()
                .messages
                .len(),
            1
        );
    }

    #[test]
    fn media_become_attachments_and_the_rest_is_described_or_skipped() {
        let src = json!({"type": "user", "userId": ADA});
        let media = |kind: &str, extra: serde_json::Value| {
            let mut m = json!({"id": "900", "type": kind, "quoteToken": "q"});
            for (k, v) in extra.as_object().unwrap() {
                m[k] = v.clone();
            }
            json!({"type": "message", "replyToken": "r", "source": src, "message": m})
        };
        let m = map_delivery(
            &body(json!([
                media("image", json!({"contentProvider": {"type": "line"}})),
                media("audio", json!({"duration": 1000})),
                media("file", json!({"fileName": "a.pdf", "fileSize": 10})),
                media("video", json!({"contentProvider": {"type": "external", "originalContentUrl": "https://x/v.mp4"}})),
                media("sticker", json!({"packageId": "1", "stickerId": "2"})),
                media("location", json!({"title": "Tower", "address": "Tokyo", "latitude": 35.0, "longitude": 139.0})),
                {"type": "follow", "replyToken": "r", "source": src},
                {"type": "message", "mode": "standby", "source": src, "message": {"id": "1", "type": "text", "text": "x"}},
                {"type": "message", "source": {"type": "user", "userId": "../etc"}, "message": {"id": "1", "type": "text", "text": "x"}},
            ])),
            true,
        )
        .unwrap();
        let kinds: Vec<Option<MediaKind>> = m
            .messages
            .iter()
            .map(|i| i.event.attachments.first().map(|a| a.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                Some(MediaKind::Image),
                Some(MediaKind::Voice),
                Some(MediaKind::Document),
                None,
                None,
                None
            ]
        );
        assert_eq!(
            m.messages[2].event.attachments[0].name.as_deref(),
            Some("a.pdf")
        );
        assert!(m.messages[3].event.text.contains("hosted elsewhere"));
        assert_eq!(m.messages[4].event.text, "[a sticker]");
        assert!(m.messages[5].event.text.contains("Tower, Tokyo"));
        assert_eq!(m.skipped.len(), 3, "{:?}", m.skipped);
        assert!(map_delivery(b"[1]", true).is_err());
        assert!(
            map_delivery(&body(json!([])), true)
                .unwrap()
                .messages
                .is_empty()
        );
    }

    #[test]
    fn ids_are_checked() {
        assert!(is_line_id(ADA, &['U']));
        assert!(!is_line_id(ADA, &['C']));
        assert!(!is_line_id("U0123", &['U']));
        assert!(!is_line_id("U0123456789ABCDEF0123456789abcdef", &['U']));
    }
}
