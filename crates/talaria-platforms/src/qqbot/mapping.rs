//! Gateway dispatches to [`MessageEvent`]s, and chat ids to where a
//! message is sent.
//!
//! QQ has four places a bot is written to, each answered at its own
//! endpoint, so the chat id says which one it is:
//!
//! | event | chat id | chat type | sent to |
//! |---|---|---|---|
//! | `C2C_MESSAGE_CREATE` | the user's openid | DM | `/v2/users/{openid}/messages` |
//! | `GROUP_AT_MESSAGE_CREATE` | `group:<group_openid>` | group | `/v2/groups/{id}/messages` |
//! | `AT_MESSAGE_CREATE`, `GUILD_AT_MESSAGE_CREATE`, `GUILD_MESSAGE_CREATE` | `channel:<channel_id>` | group | `/channels/{id}/messages` |
//! | `DIRECT_MESSAGE_CREATE` | `dms:<guild_id>` | DM | `/dms/{guild_id}/messages` |
//!
//! A bare id is a user's openid, so a home channel written as the ancestor
//! wrote it (`QQBOT_HOME_CHANNEL=<openid>`) still reaches that user.

use serde::Deserialize;
use serde_json::Value;
use talaria_adapter::media::guess_kind;
use talaria_adapter::{
    Attachment, AttachmentSource, ChatType, MediaKind, MessageEvent, SessionSource,
};

use super::PLATFORM;

/// Why a dispatch was not turned into an event (logged, never an error).
pub(crate) type Skip = &'static str;

/// Where a chat id sends to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// A user 1:1 (C2C), by openid.
    User(String),
    /// A QQ group, by group openid.
    Group(String),
    /// A guild's text channel.
    Channel(String),
    /// A guild direct-message session, by its guild id.
    Dms(String),
}

impl Target {
    /// Reads a chat id (see the module docs). Ids go into URL paths, so
    /// only the characters QQ's ids are made of pass.
    pub(crate) fn parse(chat_id: &str) -> Result<Target, String> {
        let chat_id = chat_id.trim();
        let (kind, id) = match chat_id.split_once(':') {
            Some((k, id)) => (k, id),
            None => ("c2c", chat_id),
        };
        if id.is_empty()
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(format!("not a QQ chat id: {chat_id:?}"));
        }
        let id = id.to_owned();
        match kind {
            "c2c" | "user" => Ok(Target::User(id)),
            "group" => Ok(Target::Group(id)),
            "channel" => Ok(Target::Channel(id)),
            "dms" => Ok(Target::Dms(id)),
            _ => Err(format!(
                "not a QQ chat id: {chat_id:?} (use an openid, group:<id>, channel:<id> or dms:<guild id>)"
            )),
        }
    }

    /// The path messages to it are posted to.
    pub(crate) fn messages_path(&self) -> String {
        match self {
            Target::User(id) => format!("/v2/users/{id}/messages"),
            Target::Group(id) => format!("/v2/groups/{id}/messages"),
            Target::Channel(id) => format!("/channels/{id}/messages"),
            Target::Dms(id) => format!("/dms/{id}/messages"),
        }
    }

    /// The path files for it are uploaded to (users and groups only).
    pub(crate) fn files_path(&self) -> Option<String> {
        match self {
            Target::User(id) => Some(format!("/v2/users/{id}/files")),
            Target::Group(id) => Some(format!("/v2/groups/{id}/files")),
            Target::Channel(_) | Target::Dms(_) => None,
        }
    }

    /// Whether it takes the v2 body (`msg_type`, `msg_seq`, `markdown`):
    /// users and groups; guild channels and DMs take the older one.
    pub(crate) fn is_v2(&self) -> bool {
        matches!(self, Target::User(_) | Target::Group(_))
    }

    /// How long after a user's message a reply to it is still passive
    /// [doc]: 60 minutes in C2C, 5 elsewhere.
    pub(crate) fn passive_window(&self) -> std::time::Duration {
        match self {
            Target::User(_) => std::time::Duration::from_secs(60 * 60),
            _ => std::time::Duration::from_secs(5 * 60),
        }
    }

    /// How many passive replies one message takes [doc/?]: about 4 in
    /// C2C, 5 in groups and guilds.
    pub(crate) fn passive_cap(&self) -> u32 {
        match self {
            Target::User(_) => 4,
            _ => 5,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
struct Author {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    user_openid: Option<String>,
    #[serde(default)]
    member_openid: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    bot: bool,
}

#[derive(Debug, Deserialize)]
struct Mention {
    #[serde(default)]
    id: String,
}

#[derive(Debug, Deserialize)]
struct Member {
    #[serde(default)]
    nick: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Reference {
    #[serde(default)]
    message_id: Option<String>,
}

/// A file that came with a message [doc]: what QQ claims of it and where
/// it is.
#[derive(Debug, Default, Deserialize)]
struct RawAttachment {
    #[serde(default)]
    content_type: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    filename: Option<String>,
    /// A number, or a numeric string.
    #[serde(default)]
    size: Option<Value>,
    /// QQ's transcript of a voice message.
    #[serde(default)]
    asr_refer_text: Option<String>,
    /// A WAV rendering of a voice message (the original is SILK).
    #[serde(default)]
    voice_wav_url: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Message {
    id: String,
    #[serde(default)]
    content: String,
    #[serde(default)]
    author: Author,
    #[serde(default)]
    group_openid: Option<String>,
    #[serde(default)]
    channel_id: Option<String>,
    #[serde(default)]
    guild_id: Option<String>,
    #[serde(default)]
    mentions: Vec<Mention>,
    #[serde(default)]
    member: Option<Member>,
    #[serde(default)]
    message_reference: Option<Reference>,
    #[serde(default)]
    attachments: Vec<RawAttachment>,
}

/// The most attachments taken from one message.
const MAX_ATTACHMENTS: usize = 20;

/// An attachment's URL made whole: QQ sends some without a scheme
/// (`//host/path`, and in guilds `host/path`), which means HTTPS.
/// Anything but an http(s) URL is not one.
pub(crate) fn media_url(raw: &str) -> Option<String> {
    let raw = raw.trim();
    let whole = if raw.starts_with("//") {
        format!("https:{raw}")
    } else if !raw.contains("://") && !raw.contains(':') {
        format!("https://{raw}")
    } else {
        raw.to_owned()
    };
    match reqwest::Url::parse(&whole) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => {
            Some(u.to_string())
        }
        _ => None,
    }
}

/// QQ's attachments as the gateway's, and the transcripts of voice
/// messages QQ already transcribed (those are taken as words, and their
/// audio is not fetched to be transcribed again).
fn attachments(raw: &[RawAttachment]) -> (Vec<Attachment>, Vec<String>) {
    let mut out = Vec::new();
    let mut transcripts = Vec::new();
    for a in raw.iter().take(MAX_ATTACHMENTS) {
        let claimed = a.content_type.as_deref().map(str::trim).unwrap_or("");
        let voice = claimed.eq_ignore_ascii_case("voice") || claimed.starts_with("audio/silk");
        if voice
            && let Some(t) = a.asr_refer_text.as_deref().map(str::trim)
            && !t.is_empty()
        {
            transcripts.push(t.to_owned());
            continue;
        }
        let kind = if voice {
            MediaKind::Voice
        } else {
            guess_kind(Some(claimed), a.filename.as_deref())
        };
        // A voice message's WAV is what a transcriber can read.
        let raw_url = if voice {
            a.voice_wav_url
                .as_deref()
                .filter(|u| !u.trim().is_empty())
                .or(a.url.as_deref())
        } else {
            a.url.as_deref()
        };
        let size = match &a.size {
            Some(Value::Number(n)) => n.as_u64(),
            Some(Value::String(s)) => s.trim().parse().ok(),
            _ => None,
        };
        let mime = Some(claimed).filter(|c| c.contains('/')).map(str::to_owned);
        let source = match raw_url.and_then(media_url) {
            Some(url) => AttachmentSource::Remote(url),
            None => AttachmentSource::Refused("QQ sent this file without a usable address".into()),
        };
        out.push(Attachment {
            kind,
            name: a.filename.clone().filter(|n| !n.is_empty()),
            mime,
            size,
            source,
        });
    }
    (out, transcripts)
}

/// The dispatch types that carry a user's message.
pub(crate) fn is_message(kind: &str) -> bool {
    matches!(
        kind,
        "C2C_MESSAGE_CREATE"
            | "GROUP_AT_MESSAGE_CREATE"
            | "AT_MESSAGE_CREATE"
            | "GUILD_AT_MESSAGE_CREATE"
            | "GUILD_MESSAGE_CREATE"
            | "DIRECT_MESSAGE_CREATE"
    )
}

/// Maps one message dispatch of type `kind`. `bot_id` is the bot's user id
/// from READY (guild mentions name it).
pub(crate) fn map_message(kind: &str, d: &Value, bot_id: &str) -> Result<MessageEvent, Skip> {
    let msg = Message::deserialize(d).map_err(|e| {
        tracing::warn!("skipping a malformed QQ {kind}: {e}");
        "malformed message"
    })?;
    if msg.author.bot || (!bot_id.is_empty() && msg.author.id.as_deref() == Some(bot_id)) {
        return Err("from a bot");
    }
    let nick = msg
        .member
        .as_ref()
        .and_then(|m| m.nick.clone())
        .or_else(|| msg.author.username.clone())
        .filter(|n| !n.is_empty());
    let (chat_type, chat_id, user_id, text) = match kind {
        "C2C_MESSAGE_CREATE" => {
            let user = msg.author.user_openid.clone().ok_or("C2C without a user")?;
            (
                ChatType::Dm,
                user.clone(),
                user,
                msg.content.trim().to_owned(),
            )
        }
        "GROUP_AT_MESSAGE_CREATE" => {
            let group = msg
                .group_openid
                .clone()
                .ok_or("group message without a group")?;
            let user = msg
                .author
                .member_openid
                .clone()
                .ok_or("group message without a member")?;
            // QQ delivers only messages that @-mention the bot in groups, and
            // keeps the mention's text at the start of `content`.
            (
                ChatType::Group,
                format!("group:{group}"),
                user,
                strip_leading_at(&msg.content),
            )
        }
        "AT_MESSAGE_CREATE" | "GUILD_AT_MESSAGE_CREATE" | "GUILD_MESSAGE_CREATE" => {
            let channel = msg
                .channel_id
                .clone()
                .ok_or("guild message without a channel")?;
            let user = msg
                .author
                .id
                .clone()
                .ok_or("guild message without an author")?;
            let mentioned = kind != "GUILD_MESSAGE_CREATE"
                || (!bot_id.is_empty()
                    && (msg.mentions.iter().any(|m| m.id == bot_id)
                        || msg.content.contains(&format!("<@!{bot_id}>"))
                        || msg.content.contains(&format!("<@{bot_id}>"))));
            if !mentioned {
                return Err("guild message does not mention the bot");
            }
            (
                ChatType::Group,
                format!("channel:{channel}"),
                user,
                strip_mentions(&msg.content, bot_id),
            )
        }
        "DIRECT_MESSAGE_CREATE" => {
            let guild = msg.guild_id.clone().ok_or("guild DM without a guild")?;
            let user = msg.author.id.clone().ok_or("guild DM without an author")?;
            (
                ChatType::Dm,
                format!("dms:{guild}"),
                user,
                msg.content.trim().to_owned(),
            )
        }
        _ => return Err("not a message"),
    };
    let (attachments, transcripts) = attachments(&msg.attachments);
    let text = std::iter::once(text)
        .chain(transcripts)
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    if text.is_empty() && attachments.is_empty() {
        return Err("no text and no file");
    }
    Ok(MessageEvent {
        source: SessionSource {
            platform: PLATFORM.to_owned(),
            chat_id,
            chat_name: None,
            chat_type,
            user_id: Some(user_id),
            user_name: nick,
            thread_id: None,
            is_bot: false,
        },
        text,
        message_id: Some(msg.id),
        reply_to_message_id: msg.message_reference.and_then(|r| r.message_id),
        reply_to_text: None,
        attachments,
        reply_target: None,
    })
}

/// A group message without the `@bot` QQ keeps at its start: either the
/// `<@!id>` form or the bot's name as typed (`@Name `, up to the first
/// space).
fn strip_leading_at(content: &str) -> String {
    let text = content.trim_start();
    let rest = if let Some(r) = text.strip_prefix("<@") {
        match r.find('>') {
            Some(end) => &r[end + 1..],
            None => text,
        }
    } else if let Some(r) = text.strip_prefix('@') {
        r.split_once(char::is_whitespace)
            .map_or("", |(_, rest)| rest)
    } else {
        text
    };
    rest.trim().to_owned()
}

/// The text with the bot's `<@!id>` / `<@id>` mentions removed.
fn strip_mentions(content: &str, bot_id: &str) -> String {
    let mut text = content.to_owned();
    if !bot_id.is_empty() {
        for token in [format!("<@!{bot_id}>"), format!("<@{bot_id}>")] {
            text = text.replace(&token, "");
        }
    }
    text.split(' ')
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
        .trim()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chat_ids_name_their_endpoint() {
        assert_eq!(
            Target::parse("ABC123").unwrap(),
            Target::User("ABC123".into())
        );
        assert_eq!(
            Target::parse("group:G1").unwrap().messages_path(),
            "/v2/groups/G1/messages"
        );
        assert_eq!(
            Target::parse("channel:55").unwrap().messages_path(),
            "/channels/55/messages"
        );
        assert_eq!(
            Target::parse("dms:9").unwrap().messages_path(),
            "/dms/9/messages"
        );
        assert!(Target::parse("group:../x").is_err());
        assert!(Target::parse("nope:1").is_err());
        assert!(Target::parse("").is_err());
    }

    #[test]
    fn c2c_and_group_messages() {
        let c2c = json!({"id": "m1", "content": " hi ", "author": {"user_openid": "U1"}});
        let ev = map_message("C2C_MESSAGE_CREATE", &c2c, "B").unwrap();
        assert_eq!(ev.source.chat_type, ChatType::Dm);
        assert_eq!(ev.source.chat_id, "U1");
        assert_eq!(ev.text, "hi");
        assert_eq!(ev.message_id.as_deref(), Some("m1"));
        let group = json!({"id": "m2", "content": "@Talaria /status now",
            "group_openid": "G1", "author": {"member_openid": "M1"}});
        let ev = map_message("GROUP_AT_MESSAGE_CREATE", &group, "B").unwrap();
        assert_eq!(ev.source.chat_id, "group:G1");
        assert_eq!(ev.source.user_id.as_deref(), Some("M1"));
        assert_eq!(ev.text, "/status now");
        let tagged = json!({"id": "m3", "content": "<@!B> hello",
            "group_openid": "G1", "author": {"member_openid": "M1"}});
        assert_eq!(
            map_message("GROUP_AT_MESSAGE_CREATE", &tagged, "B")
                .unwrap()
                .text,
            "hello"
        );
        // A bare mention says nothing.
        let bare = json!({"id": "m4", "content": "@Talaria", "group_openid": "G1",
            "author": {"member_openid": "M1"}});
        assert!(map_message("GROUP_AT_MESSAGE_CREATE", &bare, "B").is_err());
    }

    #[test]
    fn attachments_become_files_and_voice_transcripts_words() {
        let d = json!({"id": "m1", "content": "look", "author": {"user_openid": "U1"},
        "attachments": [
            {"content_type": "image/png", "url": "//multimedia.nt.qq.com.cn/a.png?x=1",
             "filename": "a.png", "size": "2048", "width": 10, "height": 10},
            {"content_type": "voice", "url": "https://x.qq.com/v.silk",
             "voice_wav_url": "https://x.qq.com/v.wav", "asr_refer_text": " call mum "},
            {"content_type": "voice", "url": "https://x.qq.com/w.silk",
             "voice_wav_url": "https://x.qq.com/w.wav"},
            {"content_type": "file", "url": "ftp://nope/x", "filename": "r.pdf", "size": 9}
        ]});
        let ev = map_message("C2C_MESSAGE_CREATE", &d, "B").unwrap();
        assert_eq!(ev.text, "look\ncall mum");
        assert_eq!(ev.attachments.len(), 3);
        let img = &ev.attachments[0];
        assert_eq!(img.kind, MediaKind::Image);
        assert_eq!(img.size, Some(2048));
        assert_eq!(img.mime.as_deref(), Some("image/png"));
        assert_eq!(
            img.source,
            AttachmentSource::Remote("https://multimedia.nt.qq.com.cn/a.png?x=1".into())
        );
        let voice = &ev.attachments[1];
        assert_eq!(voice.kind, MediaKind::Voice);
        assert_eq!(
            voice.source,
            AttachmentSource::Remote("https://x.qq.com/w.wav".into())
        );
        let doc = &ev.attachments[2];
        assert_eq!(doc.kind, MediaKind::Document);
        assert!(matches!(doc.source, AttachmentSource::Refused(_)));
        // A file alone is a message.
        let only = json!({"id": "m2", "content": "", "author": {"user_openid": "U1"},
            "attachments": [{"content_type": "image/jpeg", "url": "https://h.qpic.cn/x"}]});
        let ev = map_message("C2C_MESSAGE_CREATE", &only, "B").unwrap();
        assert_eq!((ev.text.as_str(), ev.attachments.len()), ("", 1));
        assert_eq!(media_url("javascript:alert(1)"), None);
        assert_eq!(media_url("//h/x").as_deref(), Some("https://h/x"));
        assert_eq!(
            media_url("gchat.qpic.cn/a/b").as_deref(),
            Some("https://gchat.qpic.cn/a/b")
        );
    }

    #[test]
    fn guild_messages_need_the_mention_unless_the_event_is_one() {
        let plain = json!({"id": "m1", "content": "chatting", "channel_id": "55",
            "guild_id": "7", "author": {"id": "42", "username": "ada"}});
        assert!(map_message("GUILD_MESSAGE_CREATE", &plain, "900").is_err());
        let at = json!({"id": "m2", "content": "<@!900> what time", "channel_id": "55",
            "guild_id": "7", "author": {"id": "42"}, "mentions": [{"id": "900"}]});
        let ev = map_message("GUILD_MESSAGE_CREATE", &at, "900").unwrap();
        assert_eq!(ev.source.chat_id, "channel:55");
        assert_eq!(ev.text, "what time");
        assert_eq!(
            map_message("AT_MESSAGE_CREATE", &at, "900").unwrap().text,
            "what time"
        );
        let dm = json!({"id": "m3", "content": "psst", "channel_id": "1", "guild_id": "9",
            "author": {"id": "42"}});
        let ev = map_message("DIRECT_MESSAGE_CREATE", &dm, "900").unwrap();
        assert_eq!(
            (ev.source.chat_type, ev.source.chat_id.as_str()),
            (ChatType::Dm, "dms:9")
        );
        let bot = json!({"id": "m4", "content": "x", "author": {"user_openid": "U", "bot": true}});
        assert!(map_message("C2C_MESSAGE_CREATE", &bot, "900").is_err());
        assert!(map_message("C2C_MESSAGE_CREATE", &json!({"content": 1}), "900").is_err());
    }
}
