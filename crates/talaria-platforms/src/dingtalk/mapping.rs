//! A robot message from Stream mode, read into what the gateway handles:
//! the event, where its session webhook points and how the chat can be
//! reached again without one.

use serde::Deserialize;
use serde_json::Value;
use talaria_adapter::{Attachment, ChatType, MediaKind, MessageEvent, SessionSource};

/// The `data` of a robot message callback (only the fields used).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct BotMessage {
    pub msg_id: String,
    #[serde(default)]
    pub msgtype: String,
    #[serde(default)]
    pub text: Option<Text>,
    #[serde(default)]
    pub content: Option<Value>,
    #[serde(default)]
    pub conversation_id: Option<String>,
    /// `"1"`: a 1:1 chat; `"2"`: a group.
    #[serde(default)]
    pub conversation_type: Option<String>,
    #[serde(default)]
    pub conversation_title: Option<String>,
    #[serde(default)]
    pub sender_id: Option<String>,
    #[serde(default)]
    pub sender_staff_id: Option<String>,
    #[serde(default)]
    pub sender_nick: Option<String>,
    #[serde(default)]
    pub chatbot_user_id: Option<String>,
    #[serde(default)]
    pub is_in_at_list: Option<bool>,
    #[serde(default)]
    pub session_webhook: Option<String>,
    /// Milliseconds since the epoch.
    #[serde(default)]
    pub session_webhook_expired_time: Option<i64>,
}

/// `text` of a text message.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Text {
    #[serde(default)]
    pub content: String,
}

/// How a chat is reached through the robot send API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// A 1:1 chat: sent to the user by staff id.
    Dm(String),
    /// A group: sent to the conversation.
    Group,
}

impl Route {
    /// The form kept in the cursor store.
    pub(crate) fn encode(&self) -> String {
        match self {
            Route::Dm(staff) => format!("dm:{staff}"),
            Route::Group => "group".to_owned(),
        }
    }

    /// Reads [`Route::encode`]'s form back.
    pub(crate) fn decode(text: &str) -> Option<Route> {
        match text {
            "group" => Some(Route::Group),
            _ => text
                .strip_prefix("dm:")
                .filter(|s| !s.is_empty())
                .map(|s| Route::Dm(s.to_owned())),
        }
    }
}

/// A message read for the gateway.
#[derive(Debug)]
pub(crate) struct Mapped {
    pub event: MessageEvent,
    pub route: Option<Route>,
    /// The session webhook and its expiry (ms since the epoch).
    pub webhook: Option<(String, i64)>,
}

/// Reads `m`; `Err` says why it is not for the bot.
pub(crate) fn map_message(m: &BotMessage, require_mention: bool) -> Result<Mapped, &'static str> {
    let group = m.conversation_type.as_deref() == Some("2");
    if group && require_mention && m.is_in_at_list != Some(true) {
        return Err("a group message that does not mention the robot");
    }
    let sender = m
        .sender_staff_id
        .as_deref()
        .or(m.sender_id.as_deref())
        .filter(|s| !s.is_empty());
    if m.sender_id.is_some() && m.sender_id == m.chatbot_user_id {
        return Err("the robot's own message");
    }
    let Some(chat_id) = m
        .conversation_id
        .as_deref()
        .or(m.sender_id.as_deref())
        .filter(|c| !c.is_empty())
    else {
        return Err("a message without a conversation");
    };
    let (text, attachments) = body(m);
    if text.trim().is_empty() && attachments.is_empty() {
        return Err("a message with nothing the gateway can read");
    }
    let source = SessionSource {
        platform: "dingtalk".to_owned(),
        chat_id: chat_id.to_owned(),
        chat_name: if group {
            m.conversation_title.clone()
        } else {
            None
        },
        chat_type: if group { ChatType::Group } else { ChatType::Dm },
        user_id: sender.map(str::to_owned),
        user_name: m.sender_nick.clone(),
        thread_id: None,
        is_bot: false,
    };
    let mut event = MessageEvent::text(source, text.trim().to_owned());
    event.message_id = Some(m.msg_id.clone());
    event.attachments = attachments;
    let route = if group {
        Some(Route::Group)
    } else {
        m.sender_staff_id
            .as_deref()
            .filter(|s| !s.is_empty())
            .map(|s| Route::Dm(s.to_owned()))
    };
    let webhook = match (&m.session_webhook, m.session_webhook_expired_time) {
        (Some(url), Some(expires)) if !url.is_empty() => Some((url.clone(), expires)),
        _ => None,
    };
    Ok(Mapped {
        event,
        route,
        webhook,
    })
}

/// The text and files of a message, by its type.
fn body(m: &BotMessage) -> (String, Vec<Attachment>) {
    let content = m.content.as_ref();
    let field = |k: &str| {
        content
            .and_then(|c| c.get(k))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    match m.msgtype.as_str() {
        "text" | "" => (
            m.text
                .as_ref()
                .map(|t| t.content.clone())
                .unwrap_or_default(),
            Vec::new(),
        ),
        "richText" => {
            let mut text = String::new();
            let mut files = Vec::new();
            let parts = content
                .and_then(|c| c.get("richText"))
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for part in parts {
                if let Some(t) = part.get("text").and_then(Value::as_str) {
                    text.push_str(t);
                } else if let Some(code) = part
                    .get("downloadCode")
                    .or_else(|| part.get("pictureDownloadCode"))
                    .and_then(Value::as_str)
                {
                    files.push(Attachment::remote(MediaKind::Image, code));
                }
            }
            (text, files)
        }
        "picture" => (
            String::new(),
            field("downloadCode")
                .map(|c| Attachment::remote(MediaKind::Image, c))
                .into_iter()
                .collect(),
        ),
        // DingTalk transcribes voice messages itself; the file still goes
        // to the gateway, whose own transcription is used when configured.
        "audio" => (
            String::new(),
            field("downloadCode")
                .map(|c| Attachment::remote(MediaKind::Voice, c))
                .into_iter()
                .collect(),
        ),
        "video" => (
            String::new(),
            field("downloadCode")
                .map(|c| Attachment::remote(MediaKind::Video, c))
                .into_iter()
                .collect(),
        ),
        "file" => {
            let name = field("fileName");
            (
                String::new(),
                field("downloadCode")
                    .map(|c| Attachment::guessed(c, name.as_deref(), None, None))
                    .into_iter()
                    .collect(),
            )
        }
        _ => (String::new(), Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn message(v: Value) -> BotMessage {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_dm_maps_to_its_conversation_and_staff_id() {
        let m = message(json!({
            "msgId": "m1", "msgtype": "text", "text": {"content": " hello "},
            "conversationId": "cidA", "conversationType": "1",
            "senderId": "$:LWCP:x", "senderStaffId": "staff1", "senderNick": "Ann",
            "chatbotUserId": "$:bot", "sessionWebhook": "https://api.dingtalk.com/s",
            "sessionWebhookExpiredTime": 5
        }));
        let mapped = map_message(&m, true).unwrap();
        assert_eq!(mapped.event.text, "hello");
        assert_eq!(mapped.event.source.chat_id, "cidA");
        assert_eq!(mapped.event.source.chat_type, ChatType::Dm);
        assert_eq!(mapped.event.source.user_id.as_deref(), Some("staff1"));
        assert_eq!(mapped.event.message_id.as_deref(), Some("m1"));
        assert_eq!(mapped.route, Some(Route::Dm("staff1".into())));
        assert_eq!(
            mapped.webhook,
            Some(("https://api.dingtalk.com/s".into(), 5))
        );
    }

    #[test]
    fn groups_need_a_mention_unless_configured_otherwise() {
        let m = message(json!({
            "msgId": "m2", "msgtype": "text", "text": {"content": "hi"},
            "conversationId": "cidG", "conversationType": "2", "senderId": "u",
            "isInAtList": false
        }));
        assert!(map_message(&m, true).is_err());
        let mapped = map_message(&m, false).unwrap();
        assert_eq!(mapped.event.source.chat_type, ChatType::Group);
        assert_eq!(mapped.route, Some(Route::Group));
        assert_eq!(mapped.event.source.user_id.as_deref(), Some("u"));
    }

    #[test]
    fn files_and_rich_text_become_attachments() {
        let m = message(json!({
            "msgId": "m3", "msgtype": "file", "conversationId": "c", "conversationType": "1",
            "senderId": "u", "content": {"downloadCode": "dc1", "fileName": "a.pdf"}
        }));
        let mapped = map_message(&m, true).unwrap();
        assert_eq!(mapped.event.attachments.len(), 1);
        assert_eq!(mapped.event.attachments[0].kind, MediaKind::Document);
        let m = message(json!({
            "msgId": "m4", "msgtype": "richText", "conversationId": "c", "conversationType": "1",
            "senderId": "u", "content": {"richText": [{"text": "look "}, {"downloadCode": "p1", "type": "picture"}]}
        }));
        let mapped = map_message(&m, true).unwrap();
        assert_eq!(mapped.event.text, "look");
        assert_eq!(mapped.event.attachments[0].kind, MediaKind::Image);
        assert_eq!(
            Route::decode(&Route::Dm("s".into()).encode()),
            Some(Route::Dm("s".into()))
        );
        assert_eq!(Route::decode("group"), Some(Route::Group));
        assert_eq!(Route::decode("dm:"), None);
    }
}
