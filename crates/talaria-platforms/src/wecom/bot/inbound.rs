//! What a message callback's body says, and the [`MessageEvent`] it
//! becomes: who may reach the robot (the ancestor's DM and group
//! policies), which chat answers go to, and the files it carries.

use serde::Deserialize;
use talaria_adapter::{Attachment, ChatType, MediaKind, MessageEvent, SessionSource};

use super::PLATFORM;
use crate::access::Access;

#[derive(Debug, Default, Deserialize)]
pub(super) struct Callback {
    #[serde(default)]
    pub msgid: String,
    #[serde(default)]
    pub chatid: String,
    #[serde(default)]
    pub chattype: String,
    #[serde(default)]
    pub from: Sender,
    #[serde(default)]
    pub msgtype: String,
    pub text: Option<Content>,
    pub voice: Option<Content>,
    pub image: Option<Media>,
    pub file: Option<Media>,
    pub video: Option<Media>,
    pub mixed: Option<Mixed>,
    pub quote: Option<Quote>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct Sender {
    #[serde(default)]
    pub userid: String,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct Content {
    #[serde(default)]
    pub content: String,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct Media {
    #[serde(default)]
    pub url: String,
    #[serde(default)]
    pub aeskey: String,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct Mixed {
    #[serde(default)]
    pub msg_item: Vec<Item>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct Item {
    #[serde(default)]
    pub msgtype: String,
    pub text: Option<Content>,
    pub image: Option<Media>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct Quote {
    #[serde(default)]
    pub msgtype: String,
    pub text: Option<Content>,
    pub voice: Option<Content>,
}

/// What a callback means.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Inbound {
    /// A message for the runner.
    Message(Box<MessageEvent>),
    /// Nothing to do, and why.
    Skip(&'static str),
}

/// The locator [`super::WecomBotAdapter::download`] reads: the file's
/// key, a space, its URL (neither ever holds a space).
pub(super) fn locator(media: &Media) -> Option<String> {
    let (key, url) = (media.aeskey.trim(), media.url.trim());
    if key.is_empty() || url.is_empty() || key.contains(' ') || url.contains(' ') {
        return None;
    }
    Some(format!("{key} {url}"))
}

/// Splits a [`locator`] into its key and URL.
pub(super) fn parse_locator(locator: &str) -> Option<(&str, &str)> {
    locator.split_once(' ')
}

/// Drops a leading `@name` (the robot's mention, as WeCom writes it at
/// the start of a group message) and the space after it.
fn strip_mention(text: &str) -> &str {
    let trimmed = text.trim_start();
    match trimmed.strip_prefix('@') {
        Some(rest) => match rest.find(char::is_whitespace) {
            Some(at) => rest[at..].trim_start(),
            None => "",
        },
        None => trimmed,
    }
}

/// Maps one message callback.
pub(super) fn map(cb: &Callback, access: &Access) -> Inbound {
    let from = cb.from.userid.trim();
    if from.is_empty() {
        return Inbound::Skip("no sender");
    }
    if cb.msgid.trim().is_empty() {
        return Inbound::Skip("no message id");
    }
    let group = cb.chattype == "group";
    let chat_id = if group {
        let chat = cb.chatid.trim();
        if chat.is_empty() {
            return Inbound::Skip("a group message without a chat id");
        }
        if let Some(why) = access.refuses_group(chat) {
            return Inbound::Skip(why);
        }
        chat.to_owned()
    } else {
        if let Some(why) = access.refuses_dm(from) {
            return Inbound::Skip(why);
        }
        from.to_owned()
    };

    let mut text = String::new();
    let mut attachments = Vec::new();
    let mut refused = false;
    let mut file = |media: &Option<Media>, kind: MediaKind| match media.as_ref().and_then(locator) {
        Some(l) => attachments.push(Attachment::remote(kind, l)),
        None => refused = true,
    };
    match cb.msgtype.as_str() {
        "text" => text = content(&cb.text),
        // WeCom transcribes voice messages itself and sends the words.
        "voice" => text = content(&cb.voice),
        "image" => file(&cb.image, MediaKind::Image),
        "file" => file(&cb.file, MediaKind::Document),
        "video" => file(&cb.video, MediaKind::Video),
        "mixed" => {
            let mut parts = Vec::new();
            for item in cb.mixed.iter().flat_map(|m| &m.msg_item) {
                match item.msgtype.as_str() {
                    "text" => parts.push(content(&item.text)),
                    "image" => file(&item.image, MediaKind::Image),
                    _ => {}
                }
            }
            text = parts
                .into_iter()
                .filter(|p| !p.is_empty())
                .collect::<Vec<_>>()
                .join("\n");
        }
        _ => return Inbound::Skip("a message type the robot does not take"),
    }
    if refused {
        tracing::warn!(msgid = %cb.msgid, "a WeCom file came without its URL or aeskey");
    }
    let text = if group {
        strip_mention(&text).to_owned()
    } else {
        text.trim().to_owned()
    };
    if text.is_empty() && attachments.is_empty() {
        return Inbound::Skip("nothing in the message");
    }
    let mut event = MessageEvent::text(
        SessionSource {
            platform: PLATFORM.into(),
            chat_id,
            chat_name: None,
            chat_type: if group { ChatType::Group } else { ChatType::Dm },
            user_id: Some(from.to_owned()),
            user_name: None,
            thread_id: None,
            is_bot: false,
        },
        text,
    );
    event.message_id = Some(cb.msgid.trim().to_owned());
    event.attachments = attachments;
    if let Some(quote) = &cb.quote {
        let quoted = match quote.msgtype.as_str() {
            "text" => content(&quote.text),
            "voice" => content(&quote.voice),
            _ => String::new(),
        };
        event.reply_to_text = Some(quoted).filter(|q| !q.is_empty());
    }
    Inbound::Message(Box::new(event))
}

fn content(c: &Option<Content>) -> String {
    c.as_ref().map(|c| c.content.clone()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::Policy;

    fn open() -> Access {
        Access {
            dm: Policy::Open,
            dm_allow_from: vec!["ann".into()],
            allow_all: false,
            group: Policy::Open,
            group_allow_from: vec!["wrgroup".into()],
        }
    }

    fn parse(json: serde_json::Value) -> Callback {
        serde_json::from_value(json).unwrap()
    }

    fn event(i: Inbound) -> MessageEvent {
        match i {
            Inbound::Message(e) => *e,
            Inbound::Skip(why) => panic!("skipped: {why}"),
        }
    }

    #[test]
    fn a_group_mention_is_stripped_and_the_chat_is_the_group() {
        let cb = parse(serde_json::json!({
            "msgid": "m1", "chatid": "wrgroup", "chattype": "group",
            "from": {"userid": "ann"}, "msgtype": "text",
            "text": {"content": "@Talaria\u{2005}what is the time"},
            "quote": {"msgtype": "text", "text": {"content": "earlier"}},
        }));
        let e = event(map(&cb, &open()));
        assert_eq!(e.text, "what is the time");
        assert_eq!(e.source.chat_id, "wrgroup");
        assert_eq!(e.source.chat_type, ChatType::Group);
        assert_eq!(e.source.user_id.as_deref(), Some("ann"));
        assert_eq!(e.reply_to_text.as_deref(), Some("earlier"));
        assert_eq!(strip_mention("@bot"), "");
        assert_eq!(strip_mention("  plain"), "plain");
    }

    #[test]
    fn a_dm_is_the_senders_chat_and_media_become_attachments() {
        let cb = parse(serde_json::json!({
            "msgid": "m2", "chattype": "single", "from": {"userid": "ann"},
            "msgtype": "mixed", "mixed": {"msg_item": [
                {"msgtype": "text", "text": {"content": "look"}},
                {"msgtype": "image", "image": {"url": "https://x.qpic.cn/a", "aeskey": "KEY"}},
            ]},
        }));
        let e = event(map(&cb, &open()));
        assert_eq!(e.source.chat_id, "ann");
        assert_eq!(e.text, "look");
        assert_eq!(e.attachments.len(), 1);
        assert_eq!(e.attachments[0].kind, MediaKind::Image);
        let talaria_adapter::AttachmentSource::Remote(l) = &e.attachments[0].source else {
            panic!("not remote");
        };
        assert_eq!(parse_locator(l), Some(("KEY", "https://x.qpic.cn/a")));

        let voice = parse(serde_json::json!({
            "msgid": "m3", "chattype": "single", "from": {"userid": "ann"},
            "msgtype": "voice", "voice": {"content": "call mum"},
        }));
        assert_eq!(event(map(&voice, &open())).text, "call mum");
    }

    #[test]
    fn policies_gate_dms_and_groups() {
        let dm = parse(serde_json::json!({
            "msgid": "m4", "chattype": "single", "from": {"userid": "eve"},
            "msgtype": "text", "text": {"content": "hi"},
        }));
        let group = parse(serde_json::json!({
            "msgid": "m5", "chattype": "group", "chatid": "wrother",
            "from": {"userid": "ann"}, "msgtype": "text", "text": {"content": "@bot hi"},
        }));
        let mut access = open();
        assert!(matches!(map(&dm, &access), Inbound::Message(_)));
        access.dm = Policy::Allowlist;
        assert!(matches!(map(&dm, &access), Inbound::Skip(_)));
        access.allow_all = true;
        assert!(matches!(map(&dm, &access), Inbound::Message(_)));
        access.dm = Policy::Disabled;
        assert!(matches!(map(&dm, &access), Inbound::Skip(_)));
        assert!(matches!(map(&group, &access), Inbound::Message(_)));
        access.group = Policy::Allowlist;
        assert!(matches!(map(&group, &access), Inbound::Skip(_)));
        access.group = Policy::Pairing;
        assert!(matches!(map(&group, &access), Inbound::Skip(_)));
        let unknown = parse(serde_json::json!({
            "msgid": "m6", "chattype": "single", "from": {"userid": "ann"},
            "msgtype": "location",
        }));
        assert!(matches!(map(&unknown, &open()), Inbound::Skip(_)));
    }
}
