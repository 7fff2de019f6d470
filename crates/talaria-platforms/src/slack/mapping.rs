//! Events API payloads (`message`, `app_mention`) to [`MessageEvent`]s.

use serde::Deserialize;
use talaria_adapter::{ChatType, MessageEvent, SessionSource};

use super::format::unescape;

/// The bot itself, from `auth.test`: its own messages are skipped and
/// mentions of it are matched.
#[derive(Debug, Clone, Default)]
pub(crate) struct Me {
    pub user_id: String,
}

/// Why an event was not turned into a message (logged, never an error).
pub(crate) type Skip = &'static str;

/// The fields of a `message` or `app_mention` event the adapter reads.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Event {
    #[serde(rename = "type")]
    pub kind: String,
    pub subtype: Option<String>,
    pub channel: Option<String>,
    pub channel_type: Option<String>,
    pub user: Option<String>,
    pub bot_id: Option<String>,
    pub text: Option<String>,
    pub ts: Option<String>,
    pub thread_ts: Option<String>,
    pub user_profile: Option<Profile>,
    #[serde(default)]
    pub files: Vec<File>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Profile {
    pub display_name: Option<String>,
    pub real_name: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct File {
    pub name: Option<String>,
    /// Fetched with the bot token in an `Authorization` header.
    pub url_private_download: Option<String>,
    pub url_private: Option<String>,
    pub mimetype: Option<String>,
    pub size: Option<u64>,
    /// `slack_audio` for a clip recorded in the app.
    pub subtype: Option<String>,
}

/// Subtypes that are still a person writing to the bot; everything else
/// (edits, deletions, joins, bot posts) is not a new message.
const PLAIN_SUBTYPES: &[&str] = &["file_share", "thread_broadcast"];

/// Maps one event. `app_mention` events always address the bot; `message`
/// events in shared chats must mention it when `require_mention` is set.
pub(crate) fn map_event(
    event: &Event,
    me: &Me,
    require_mention: bool,
) -> Result<MessageEvent, Skip> {
    let mention_event = match event.kind.as_str() {
        "message" => false,
        "app_mention" => true,
        _ => return Err("not a message event"),
    };
    if event
        .subtype
        .as_deref()
        .is_some_and(|s| !PLAIN_SUBTYPES.contains(&s))
    {
        return Err("a message subtype that is not a new message");
    }
    if event.bot_id.is_some() {
        return Err("a bot's message");
    }
    let Some(user) = event.user.as_deref().filter(|u| !u.is_empty()) else {
        return Err("no sender");
    };
    if user == me.user_id {
        return Err("the bot's own message");
    }
    let (Some(channel), Some(ts)) = (event.channel.as_deref(), event.ts.as_deref()) else {
        return Err("no channel or ts");
    };
    if channel.is_empty() || ts.is_empty() {
        return Err("no channel or ts");
    }
    let dm = match event.channel_type.as_deref() {
        Some("im") => true,
        Some("channel" | "group" | "mpim") => false,
        Some(_) => return Err("unknown channel type"),
        // `app_mention` carries no channel type; DM channel ids start with D.
        None => channel.starts_with('D'),
    };
    let raw = event.text.as_deref().unwrap_or("");
    let mentioned = mention_event || mentions(raw, &me.user_id);
    if !dm && require_mention && !mentioned {
        return Err("a channel message that does not mention the bot");
    }
    let text = unescape(strip_mention(raw, &me.user_id).trim());
    let attachments: Vec<talaria_adapter::Attachment> = event
        .files
        .iter()
        .filter_map(|f| {
            let url = f
                .url_private_download
                .as_deref()
                .or(f.url_private.as_deref())?;
            let mut att = talaria_adapter::Attachment::guessed(
                url,
                f.name.as_deref(),
                f.mimetype.as_deref(),
                f.size,
            );
            if f.subtype.as_deref() == Some("slack_audio") {
                att.kind = talaria_adapter::MediaKind::Voice;
            }
            Some(att)
        })
        .collect();
    if text.is_empty() && attachments.is_empty() {
        return Err("no text or file");
    }
    let thread_id = event
        .thread_ts
        .as_deref()
        .filter(|t| !t.is_empty() && *t != ts)
        .map(str::to_owned);
    let chat_type = match (dm, &thread_id) {
        (true, _) => ChatType::Dm,
        (false, Some(_)) => ChatType::Thread,
        (false, None) => ChatType::Group,
    };
    let user_name = event.user_profile.as_ref().and_then(|p| {
        p.display_name
            .clone()
            .filter(|n| !n.is_empty())
            .or_else(|| p.real_name.clone())
    });
    let source = SessionSource {
        platform: "slack".to_owned(),
        chat_id: channel.to_owned(),
        chat_name: None,
        chat_type,
        user_id: Some(user.to_owned()),
        user_name,
        thread_id,
        is_bot: false,
    };
    Ok(MessageEvent {
        source,
        text,
        // Unique within the channel; the runner's dedupe key adds the chat.
        message_id: Some(ts.to_owned()),
        reply_to_message_id: None,
        reply_to_text: None,
        attachments,
        reply_target: None,
    })
}

/// Whether `text` holds `<@USER>` or `<@USER|name>`.
fn mentions(text: &str, user_id: &str) -> bool {
    !user_id.is_empty()
        && (text.contains(&format!("<@{user_id}>")) || text.contains(&format!("<@{user_id}|")))
}

/// `text` without the mentions of the bot.
fn strip_mention(text: &str, user_id: &str) -> String {
    if user_id.is_empty() {
        return text.to_owned();
    }
    let open = format!("<@{user_id}");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(&open) {
        let after = &rest[i + open.len()..];
        match after.chars().next() {
            Some('>' | '|') => {
                out.push_str(&rest[..i]);
                let close = after.find('>').map_or(after.len(), |e| e + 1);
                rest = after[close..].strip_prefix(' ').unwrap_or(&after[close..]);
            }
            // Another user whose id starts with ours.
            _ => {
                out.push_str(&rest[..i + open.len()]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn me() -> Me {
        Me {
            user_id: "UBOT".into(),
        }
    }

    fn ev(v: serde_json::Value) -> Event {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn dms_threads_and_channels() {
        let dm = ev(
            json!({"type": "message", "channel": "D1", "channel_type": "im",
            "user": "U1", "text": "hi &amp; bye", "ts": "1.000001"}),
        );
        let m = map_event(&dm, &me(), true).unwrap();
        assert_eq!(m.source.chat_type, ChatType::Dm);
        assert_eq!(m.source.chat_id, "D1");
        assert_eq!(m.text, "hi & bye");
        assert_eq!(m.message_id.as_deref(), Some("1.000001"));
        assert_eq!(m.source.thread_id, None);

        let threaded = ev(
            json!({"type": "message", "channel": "C1", "channel_type": "channel",
            "user": "U1", "text": "<@UBOT> more", "ts": "2.0", "thread_ts": "1.0"}),
        );
        let m = map_event(&threaded, &me(), true).unwrap();
        assert_eq!(m.source.chat_type, ChatType::Thread);
        assert_eq!(m.source.thread_id.as_deref(), Some("1.0"));
        assert_eq!(m.text, "more");

        // A thread's parent carries thread_ts == ts: not in a thread.
        let parent = ev(
            json!({"type": "message", "channel": "C1", "channel_type": "channel",
            "user": "U1", "text": "<@UBOT|talaria> top", "ts": "1.0", "thread_ts": "1.0"}),
        );
        let m = map_event(&parent, &me(), true).unwrap();
        assert_eq!(m.source.chat_type, ChatType::Group);
        assert_eq!(m.source.thread_id, None);
        assert_eq!(m.text, "top");
    }

    #[test]
    fn channels_need_a_mention_unless_configured_otherwise() {
        let plain = ev(
            json!({"type": "message", "channel": "C1", "channel_type": "channel",
            "user": "U1", "text": "just chatting", "ts": "1.0"}),
        );
        assert!(map_event(&plain, &me(), true).is_err());
        assert!(map_event(&plain, &me(), false).is_ok());
        let other = ev(
            json!({"type": "message", "channel": "C1", "channel_type": "channel",
            "user": "U1", "text": "<@UBOTX> hi", "ts": "1.0"}),
        );
        assert!(map_event(&other, &me(), true).is_err());
        assert_eq!(map_event(&other, &me(), false).unwrap().text, "<@UBOTX> hi");
        let mention = ev(json!({"type": "app_mention", "channel": "C1",
            "user": "U1", "text": "<@UBOT> do it", "ts": "1.0"}));
        let m = map_event(&mention, &me(), true).unwrap();
        assert_eq!(m.text, "do it");
        assert_eq!(m.source.chat_type, ChatType::Group);
    }

    #[test]
    fn bots_edits_and_the_bot_itself_are_skipped() {
        for v in [
            json!({"type": "message", "subtype": "message_changed", "channel": "D1", "channel_type": "im", "ts": "1.0"}),
            json!({"type": "message", "subtype": "bot_message", "channel": "D1", "channel_type": "im", "text": "x", "ts": "1.0", "bot_id": "B2"}),
            json!({"type": "message", "channel": "D1", "channel_type": "im", "user": "U2", "text": "x", "ts": "1.0", "bot_id": "B2"}),
            json!({"type": "message", "channel": "D1", "channel_type": "im", "user": "UBOT", "text": "x", "ts": "1.0"}),
            json!({"type": "message", "channel": "D1", "channel_type": "im", "user": "U2", "text": "  ", "ts": "1.0"}),
            json!({"type": "reaction_added", "user": "U2"}),
        ] {
            assert!(map_event(&ev(v.clone()), &me(), false).is_err(), "{v}");
        }
        let files = ev(
            json!({"type": "message", "subtype": "file_share", "channel": "D1",
            "channel_type": "im", "user": "U2", "text": "", "ts": "1.0", "files": [{"name": "a.png", "url_private": "https://files.slack.com/a.png"}]}),
        );
        assert_eq!(
            map_event(&files, &me(), false).unwrap().attachments,
            [talaria_adapter::Attachment::guessed(
                "https://files.slack.com/a.png",
                Some("a.png"),
                None,
                None
            )]
        );
    }
}
