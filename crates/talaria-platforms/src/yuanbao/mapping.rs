//! Inbound pushes to [`MessageEvent`]s: chat ids, mentions, the access
//! policies, quotes and recalls.

use serde_json::Value;
use talaria_adapter::{Attachment, ChatType, MediaKind, MessageEvent, SessionSource};

use super::proto::{InboundMessagePush, MsgBodyElement};
use crate::access::Access;

/// The custom element type of an @-mention.
const MENTION: i64 = 1002;

/// Commands the bot owner may give in a group without mentioning the bot.
const OWNER_COMMANDS: &[&str] = &[
    "/new",
    "/reset",
    "/retry",
    "/undo",
    "/stop",
    "/approve",
    "/deny",
    "/background",
    "/bg",
    "/btw",
    "/queue",
    "/q",
];

/// A conversation, as chat ids spell it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Chat {
    /// `direct:<account>`: a private chat with one user.
    Direct(String),
    /// `group:<group_code>`: a group ("Pai").
    Group(String),
}

impl Chat {
    /// Reads `direct:<account>` or `group:<group_code>`.
    pub fn parse(chat_id: &str) -> Option<Chat> {
        let (kind, id) = chat_id.split_once(':')?;
        let id = id.trim();
        if id.is_empty() || id.contains(char::is_whitespace) {
            return None;
        }
        match kind {
            "direct" => Some(Chat::Direct(id.to_owned())),
            "group" => Some(Chat::Group(id.to_owned())),
            _ => None,
        }
    }

    /// The chat id.
    pub fn id(&self) -> String {
        match self {
            Chat::Direct(a) => format!("direct:{a}"),
            Chat::Group(g) => format!("group:{g}"),
        }
    }
}

/// What a push means.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Inbound {
    /// A message for the runner.
    Message(Box<MessageEvent>),
    /// These message ids were taken back.
    Recall(Vec<String>),
    /// Nothing to do, and why.
    Skip(&'static str),
}

/// Maps one `inbound_message` push.
pub(super) fn map_push(push: &InboundMessagePush, bot_id: &str, access: &Access) -> Inbound {
    let command = push.callback_command.as_str();
    if command.contains("Recall") || command.contains("WithDraw") {
        let mut ids: Vec<String> = push
            .recall_msg_seq_list
            .iter()
            .map(|r| r.msg_id.clone())
            .filter(|id| !id.is_empty())
            .collect();
        if ids.is_empty() && !push.msg_id.is_empty() {
            ids.push(push.msg_id.clone());
        }
        return Inbound::Recall(ids);
    }
    let from = push.from_account.trim();
    if from.is_empty() {
        return Inbound::Skip("no sender");
    }
    if from == bot_id {
        return Inbound::Skip("the bot's own message");
    }
    if push.msg_id.is_empty() {
        return Inbound::Skip("no message id");
    }
    let in_group =
        !push.group_code.is_empty() || command.starts_with("Group.") || push.claw_msg_type == 1;
    let (text, mentioned) = text_of(&push.msg_body, bot_id);
    let attachments = attachments(&push.msg_body);
    if text.is_empty() && attachments.is_empty() {
        return Inbound::Skip("nothing readable (no text, no file)");
    }
    let chat = if in_group {
        if push.group_code.is_empty() {
            return Inbound::Skip("a group message without a group code");
        }
        if let Some(why) = access.refuses_group(&push.group_code) {
            return Inbound::Skip(why);
        }
        let owner_command =
            !push.bot_owner_id.is_empty() && from == push.bot_owner_id && is_owner_command(&text);
        if !mentioned && !owner_command {
            return Inbound::Skip("a group message that does not mention the bot");
        }
        Chat::Group(push.group_code.clone())
    } else {
        if let Some(why) = access.refuses_dm(from) {
            return Inbound::Skip(why);
        }
        Chat::Direct(from.to_owned())
    };
    let nickname = Some(push.sender_nickname.clone()).filter(|n| !n.is_empty());
    let chat_name = if in_group {
        Some(push.group_name.clone()).filter(|n| !n.is_empty())
    } else {
        nickname.clone()
    };
    let mut event = MessageEvent::text(
        SessionSource {
            platform: "yuanbao".into(),
            chat_id: chat.id(),
            chat_name,
            chat_type: if in_group {
                ChatType::Group
            } else {
                ChatType::Dm
            },
            user_id: Some(from.to_owned()),
            user_name: nickname,
            thread_id: None,
            is_bot: false,
        },
        text,
    );
    event.message_id = Some(push.msg_id.clone());
    event.attachments = attachments;
    if let Some((id, desc)) = quote(&push.cloud_custom_data) {
        event.reply_to_message_id = Some(id);
        event.reply_to_text = desc;
    }
    Inbound::Message(Box::new(event))
}

/// The message's text, with mentions of the bot taken out (other
/// mentions keep their `@name`), and whether the bot was mentioned.
fn text_of(body: &[MsgBodyElement], bot_id: &str) -> (String, bool) {
    let mut text = String::new();
    let mut mentioned = false;
    for element in body {
        let Some(content) = &element.msg_content else {
            continue;
        };
        match element.msg_type.as_str() {
            "TIMTextElem" => text.push_str(&content.text),
            "TIMCustomElem" => {
                let Ok(data) = serde_json::from_str::<Value>(&content.data) else {
                    continue;
                };
                if number(&data["elem_type"]) != Some(MENTION) {
                    continue;
                }
                let target = match &data["user_id"] {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    _ => String::new(),
                };
                if !bot_id.is_empty() && target == bot_id {
                    mentioned = true;
                } else if let Some(name) = data["text"].as_str() {
                    text.push_str(name);
                }
            }
            _ => {}
        }
    }
    // Taking a mention out leaves the spaces around it.
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    (text, mentioned)
}

/// The files among the elements: images (their original rendition, else
/// the largest), files, voice notes and videos, each fetched later through
/// the adapter by its locator.
fn attachments(body: &[MsgBodyElement]) -> Vec<Attachment> {
    let mut out = Vec::new();
    for element in body {
        let Some(content) = &element.msg_content else {
            continue;
        };
        let name = Some(content.file_name.trim()).filter(|n| !n.is_empty());
        let size = Some(u64::from(content.file_size)).filter(|s| *s > 0);
        let attachment = match element.msg_type.as_str() {
            "TIMImageElem" => {
                let renditions: Vec<_> = content
                    .image_info_array
                    .iter()
                    .filter(|i| !i.url.trim().is_empty())
                    .collect();
                let best = renditions
                    .iter()
                    .find(|i| i.r#type == 1)
                    .or_else(|| renditions.iter().max_by_key(|i| i.size));
                let Some(best) = best else { continue };
                let Some(locator) = super::media::locator(&best.url) else {
                    continue;
                };
                Attachment::remote(MediaKind::Image, locator)
                    .sized(Some(u64::from(best.size)).filter(|s| *s > 0))
            }
            "TIMFileElem" => {
                let Some(locator) = super::media::locator(&content.url) else {
                    continue;
                };
                Attachment::guessed(locator, name, None, size)
            }
            "TIMSoundElem" | "TIMVideoFileElem" => {
                let Some(locator) = super::media::locator(&content.url) else {
                    continue;
                };
                let kind = if element.msg_type == "TIMSoundElem" {
                    MediaKind::Voice
                } else {
                    MediaKind::Video
                };
                Attachment::remote(kind, locator).named(name).sized(size)
            }
            _ => continue,
        };
        // Bounded: a message names a handful of files at most.
        if out.len() < MAX_ATTACHMENTS {
            out.push(attachment);
        }
    }
    out
}

/// The most files taken from one message.
const MAX_ATTACHMENTS: usize = 20;

/// A JSON number, or a string holding one.
fn number(v: &Value) -> Option<i64> {
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
}

fn is_owner_command(text: &str) -> bool {
    let word = text.split_whitespace().next().unwrap_or("");
    OWNER_COMMANDS.contains(&word)
}

/// The quoted message in `cloud_custom_data`: its id and text.
fn quote(custom: &str) -> Option<(String, Option<String>)> {
    if custom.is_empty() {
        return None;
    }
    let v: Value = serde_json::from_str(custom).ok()?;
    let q = v.get("quote")?;
    let id = match q.get("id")? {
        Value::String(s) if !s.is_empty() => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    let desc = q
        .get("desc")
        .and_then(Value::as_str)
        .filter(|d| !d.is_empty())
        .map(str::to_owned);
    Some((id, desc))
}

#[cfg(test)]
mod tests {
    use super::super::proto::{ImMsgSeq, MsgContent};
    use super::*;
    use crate::access::Policy;

    fn text(t: &str) -> MsgBodyElement {
        MsgBodyElement {
            msg_type: "TIMTextElem".into(),
            msg_content: Some(MsgContent {
                text: t.into(),
                ..MsgContent::default()
            }),
        }
    }

    fn mention(user: &str, name: &str) -> MsgBodyElement {
        MsgBodyElement {
            msg_type: "TIMCustomElem".into(),
            msg_content: Some(MsgContent {
                data: format!(r#"{{"elem_type":1002,"text":"@{name}","user_id":"{user}"}}"#),
                ..MsgContent::default()
            }),
        }
    }

    fn open() -> Access {
        Access {
            dm: Policy::Open,
            dm_allow_from: vec![],
            group: Policy::Open,
            group_allow_from: vec![],
            allow_all: false,
        }
    }

    fn group_push(body: Vec<MsgBodyElement>) -> InboundMessagePush {
        InboundMessagePush {
            callback_command: "Group.CallbackAfterSendMsg".into(),
            from_account: "u1".into(),
            group_code: "g9".into(),
            group_name: "Pai".into(),
            sender_nickname: "Ann".into(),
            msg_id: "m1".into(),
            bot_owner_id: "owner".into(),
            msg_body: body,
            ..InboundMessagePush::default()
        }
    }

    #[test]
    fn a_group_message_needs_a_mention_of_the_bot_which_is_stripped() {
        let push = group_push(vec![text("hello all")]);
        assert!(matches!(map_push(&push, "bot", &open()), Inbound::Skip(_)));
        let push = group_push(vec![mention("other", "Bob"), text(" hi")]);
        assert!(matches!(map_push(&push, "bot", &open()), Inbound::Skip(_)));
        let push = group_push(vec![
            mention("bot", "Talaria"),
            text(" what time "),
            mention("other", "Bob"),
        ]);
        let Inbound::Message(event) = map_push(&push, "bot", &open()) else {
            panic!("not a message");
        };
        assert_eq!(event.text, "what time @Bob");
        assert_eq!(event.source.chat_id, "group:g9");
        assert_eq!(event.source.chat_type, ChatType::Group);
        assert_eq!(event.source.chat_name.as_deref(), Some("Pai"));
        assert_eq!(event.message_id.as_deref(), Some("m1"));
    }

    #[test]
    fn the_owner_may_give_commands_in_a_group_without_a_mention() {
        let mut push = group_push(vec![text("/new")]);
        assert!(matches!(map_push(&push, "bot", &open()), Inbound::Skip(_)));
        push.from_account = "owner".into();
        assert!(matches!(
            map_push(&push, "bot", &open()),
            Inbound::Message(_)
        ));
        push.msg_body = vec![text("/newfangled idea")];
        assert!(matches!(map_push(&push, "bot", &open()), Inbound::Skip(_)));
    }

    #[test]
    fn policies_filter_dms_and_groups() {
        let dm = InboundMessagePush {
            callback_command: "C2C.CallbackAfterSendMsg".into(),
            from_account: "u1".into(),
            msg_id: "m2".into(),
            msg_body: vec![text("hi")],
            cloud_custom_data: r#"{"quote":{"id":"m0","desc":"earlier","sender_nickname":"x"}}"#
                .into(),
            ..InboundMessagePush::default()
        };
        let Inbound::Message(event) = map_push(&dm, "bot", &open()) else {
            panic!("not a message");
        };
        assert_eq!(event.source.chat_id, "direct:u1");
        assert_eq!(event.reply_to_message_id.as_deref(), Some("m0"));
        assert_eq!(event.reply_to_text.as_deref(), Some("earlier"));
        let mut access = open();
        access.dm = Policy::Allowlist;
        assert!(matches!(map_push(&dm, "bot", &access), Inbound::Skip(_)));
        access.dm_allow_from = vec!["u1".into()];
        assert!(matches!(map_push(&dm, "bot", &access), Inbound::Message(_)));
        access.dm = Policy::Disabled;
        assert!(matches!(map_push(&dm, "bot", &access), Inbound::Skip(_)));

        let push = group_push(vec![mention("bot", "T"), text("hi")]);
        let mut access = open();
        access.group = Policy::Pairing;
        assert!(matches!(map_push(&push, "bot", &access), Inbound::Skip(_)));
        access.group = Policy::Allowlist;
        assert!(matches!(map_push(&push, "bot", &access), Inbound::Skip(_)));
        access.group_allow_from = vec!["g9".into()];
        assert!(matches!(
            map_push(&push, "bot", &access),
            Inbound::Message(_)
        ));
    }

    #[test]
    fn own_messages_are_skipped_and_recalls_name_their_messages() {
        let mut push = group_push(vec![mention("bot", "T"), text("hi")]);
        push.from_account = "bot".into();
        assert!(matches!(map_push(&push, "bot", &open()), Inbound::Skip(_)));
        let recall = InboundMessagePush {
            callback_command: "Group.CallbackAfterRecallMsg".into(),
            recall_msg_seq_list: vec![ImMsgSeq {
                msg_seq: 3,
                msg_id: "m7".into(),
            }],
            ..InboundMessagePush::default()
        };
        assert_eq!(
            map_push(&recall, "bot", &open()),
            Inbound::Recall(vec!["m7".into()])
        );
    }

    #[test]
    fn chat_ids_round_trip_and_junk_is_refused() {
        for id in ["direct:abc", "group:123"] {
            assert_eq!(Chat::parse(id).map(|c| c.id()).as_deref(), Some(id));
        }
        for bad in ["abc", "direct:", "room:1", "group:a b"] {
            assert_eq!(Chat::parse(bad), None, "{bad}");
        }
    }
}
