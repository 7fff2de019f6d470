//! signal-cli envelopes to [`MessageEvent`]s.
//!
//! Every receive style delivers the same object per message:
//! `{"envelope": {...}, "account": "+49..."}`. Only envelopes with a
//! `dataMessage` that says something become events; receipts, typing
//! notices, sync messages (what the account itself sent from another
//! device), reactions, deletions and group updates are skipped.
//!
//! Signal names a message by its author and its timestamp, so the event's
//! `message_id` is `<timestamp>:<author>`: the same envelope delivered
//! twice carries the same id and the runner drops the repeat.

use base64::Engine;
use serde::Deserialize;
use talaria_adapter::{ChatType, MessageEvent, SessionSource};

/// Why an envelope was not turned into an event (logged, never an error).
pub(crate) type Skip = &'static str;

/// The prefix the REST API gives group recipients.
pub(crate) const GROUP_PREFIX: &str = "group.";

/// One received item, as the WebSocket sends it and `receive` lists it.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Incoming {
    #[serde(default)]
    pub envelope: Option<Envelope>,
    #[serde(default)]
    pub account: Option<String>,
    /// What the server sends instead when signal-cli reported a failure.
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Envelope {
    #[serde(default)]
    pub source: Option<String>,
    #[serde(default)]
    pub source_number: Option<String>,
    #[serde(default)]
    pub source_uuid: Option<String>,
    #[serde(default)]
    pub source_name: Option<String>,
    #[serde(default)]
    pub timestamp: Option<i64>,
    #[serde(default)]
    pub data_message: Option<DataMessage>,
    #[serde(default)]
    pub sync_message: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DataMessage {
    #[serde(default)]
    pub timestamp: Option<i64>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub group_info: Option<GroupInfo>,
    #[serde(default)]
    pub attachments: Vec<Attachment>,
    #[serde(default)]
    pub quote: Option<Quote>,
    #[serde(default)]
    pub mentions: Vec<Mention>,
    #[serde(default)]
    pub sticker: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GroupInfo {
    /// The group's internal id (base64).
    #[serde(default)]
    pub group_id: Option<String>,
    #[serde(default)]
    pub group_name: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Attachment {
    /// The id under which signal-cli keeps the file (`/v1/attachments/{id}`).
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub content_type: Option<String>,
    #[serde(default)]
    pub filename: Option<String>,
    #[serde(default)]
    pub size: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Quote {
    /// The quoted message's timestamp.
    #[serde(default)]
    pub id: Option<i64>,
    #[serde(default)]
    pub author: Option<String>,
    #[serde(default)]
    pub author_number: Option<String>,
    #[serde(default)]
    pub author_uuid: Option<String>,
    #[serde(default)]
    pub text: Option<String>,
}

/// A mention: the text holds U+FFFC at `start` (UTF-16 units).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Mention {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub number: Option<String>,
    #[serde(default)]
    pub uuid: Option<String>,
    #[serde(default)]
    pub start: usize,
    #[serde(default)]
    pub length: usize,
}

/// The bot's own account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Me {
    /// The number the adapter serves.
    pub account: String,
    /// Its UUID, when configured (mentions may carry only that).
    pub uuid: Option<String>,
}

impl Me {
    fn is(&self, number: Option<&str>, uuid: Option<&str>) -> bool {
        number.is_some_and(|n| n == self.account)
            || uuid.is_some_and(|u| {
                self.uuid
                    .as_deref()
                    .is_some_and(|mine| mine.eq_ignore_ascii_case(u))
            })
    }
}

/// What the mapping needs besides the envelope.
#[derive(Debug, Clone)]
pub(crate) struct Context<'a> {
    pub me: &'a Me,
    pub require_mention: bool,
    /// The allowlist entries (`SIGNAL_ALLOWED_USERS`, `GATEWAY_ALLOWED_USERS`):
    /// the sender is reported under the form listed there.
    pub allowed: &'a [String],
}

/// The REST API's name of a group: `group.` and the base64 of the
/// internal id's text.
pub(crate) fn group_recipient(internal_id: &str) -> String {
    format!(
        "{GROUP_PREFIX}{}",
        base64::engine::general_purpose::STANDARD.encode(internal_id.as_bytes())
    )
}

/// Maps one received item.
pub(crate) fn map_incoming(item: &Incoming, cx: &Context<'_>) -> Result<MessageEvent, Skip> {
    if let Some(account) = item.account.as_deref()
        && account != cx.me.account
    {
        return Err("an envelope for another account");
    }
    let env = item.envelope.as_ref().ok_or("no envelope")?;
    if env.sync_message.is_some() {
        return Err("a sync message (sent from the account's own devices)");
    }
    let data = env
        .data_message
        .as_ref()
        .ok_or("not a data message (receipt, typing, call, story)")?;
    let number = nonempty(env.source_number.as_deref())
        .or_else(|| nonempty(env.source.as_deref()).filter(|s| s.starts_with('+')));
    let uuid = nonempty(env.source_uuid.as_deref())
        .or_else(|| nonempty(env.source.as_deref()).filter(|s| !s.starts_with('+')));
    if cx.me.is(number, uuid) {
        return Err("the account's own message");
    }
    // The stable name of the author: the UUID (a number can change hands
    // or be hidden), else the number.
    let author = uuid.or(number).ok_or("no sender")?;
    let timestamp = data
        .timestamp
        .or(env.timestamp)
        .filter(|t| *t > 0)
        .ok_or("no timestamp")?;

    let group = data
        .group_info
        .as_ref()
        .and_then(|g| nonempty(g.group_id.as_deref()).map(|id| (id, g)));
    let (chat_id, chat_type, chat_name) = match group {
        Some((id, g)) => (
            group_recipient(id),
            ChatType::Group,
            nonempty(g.group_name.as_deref()).map(str::to_owned),
        ),
        None => (author.to_owned(), ChatType::Dm, None),
    };
    if talaria_core::ids::validate_logical_key(&chat_id).is_err() {
        return Err("a chat id that cannot be a key");
    }

    let raw = data.message.as_deref().unwrap_or("");
    let (text, mentioned) = resolve_mentions(raw, &data.mentions, cx.me);
    let quoted_bot = data.quote.as_ref().is_some_and(|q| {
        cx.me.is(
            nonempty(q.author_number.as_deref()).or(nonempty(q.author.as_deref())),
            nonempty(q.author_uuid.as_deref()),
        )
    });
    if chat_type == ChatType::Group && cx.require_mention && !mentioned && !quoted_bot {
        return Err("a group message that does not address the bot");
    }
    let attachments: Vec<talaria_adapter::Attachment> =
        data.attachments.iter().filter_map(attachment).collect();
    let text = if data.sticker.is_some() && text.is_empty() {
        "[a sticker]".to_owned()
    } else {
        text
    };
    if text.is_empty() && attachments.is_empty() {
        return Err("no text or attachment (reaction, deletion, group update)");
    }

    let (reply_to_message_id, reply_to_text) = match &data.quote {
        Some(q) => {
            let quoted_author = nonempty(q.author_uuid.as_deref())
                .or(nonempty(q.author_number.as_deref()))
                .or(nonempty(q.author.as_deref()));
            (
                q.id.zip(quoted_author).map(|(t, a)| message_id(t, a)),
                nonempty(q.text.as_deref()).map(str::to_owned),
            )
        }
        None => (None, None),
    };
    let source = SessionSource {
        platform: "signal".to_owned(),
        chat_id,
        chat_name,
        chat_type,
        user_id: Some(user_id(uuid, number, cx.allowed)),
        user_name: nonempty(env.source_name.as_deref()).map(str::to_owned),
        thread_id: None,
        is_bot: false,
    };
    Ok(MessageEvent {
        source,
        text,
        message_id: Some(message_id(timestamp, author)),
        reply_to_message_id,
        reply_to_text,
        attachments,
        reply_target: None,
    })
}

/// `<timestamp>:<author>`, Signal's own way of naming a message.
pub(crate) fn message_id(timestamp: i64, author: &str) -> String {
    format!("{timestamp}:{author}")
}

/// The parts of a [`message_id`]: timestamp and author.
pub(crate) fn parse_message_id(id: &str) -> Option<(i64, &str)> {
    let (t, author) = id.split_once(':')?;
    let t = t.parse().ok().filter(|t: &i64| *t > 0)?;
    (!author.is_empty()).then_some((t, author))
}

/// The sender as the runner sees it: the UUID, unless the operator's
/// allowlist names the number and not the UUID, in which case the number,
/// so that a list of either form admits the person it names. A UUID entry
/// matches in any case and is reported as written.
fn user_id(uuid: Option<&str>, number: Option<&str>, allowed: &[String]) -> String {
    if let Some(u) = uuid {
        if let Some(listed) = allowed.iter().find(|e| e.eq_ignore_ascii_case(u)) {
            return listed.clone();
        }
        if let Some(n) = number
            && allowed.iter().any(|e| e == n)
        {
            return n.to_owned();
        }
        return u.to_owned();
    }
    number.unwrap_or_default().to_owned()
}

fn nonempty(s: Option<&str>) -> Option<&str> {
    s.map(str::trim).filter(|s| !s.is_empty())
}

/// Replaces the U+FFFC placeholders of mentions: the bot's own go away,
/// others become `@name`. Returns the text and whether the bot was
/// mentioned.
fn resolve_mentions(text: &str, mentions: &[Mention], me: &Me) -> (String, bool) {
    let mut mentioned = false;
    if mentions.is_empty() {
        return (text.trim().to_owned(), false);
    }
    let units: Vec<u16> = text.encode_utf16().collect();
    let mut sorted: Vec<&Mention> = mentions.iter().collect();
    sorted.sort_by_key(|m| m.start);
    let mut out: Vec<u16> = Vec::with_capacity(units.len());
    let mut at = 0;
    for m in sorted {
        let end = m.start.saturating_add(m.length.max(1));
        if m.start < at || end > units.len() {
            continue;
        }
        out.extend_from_slice(&units[at..m.start]);
        if me.is(nonempty(m.number.as_deref()), nonempty(m.uuid.as_deref())) {
            mentioned = true;
        } else {
            let name = nonempty(m.name.as_deref())
                .or(nonempty(m.number.as_deref()))
                .unwrap_or("someone");
            out.extend(format!("@{name}").encode_utf16());
        }
        at = end;
    }
    out.extend_from_slice(&units[at..]);
    let text = String::from_utf16_lossy(&out);
    // Removing a mention at the start leaves ", do this" or two spaces.
    let text = text
        .trim()
        .trim_start_matches([':', ','])
        .split(' ')
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    (text, mentioned)
}

/// An attachment signal-cli keeps under its id, fetched when the turn runs.
fn attachment(a: &Attachment) -> Option<talaria_adapter::Attachment> {
    let id = nonempty(a.id.as_deref())?;
    let mut att = talaria_adapter::Attachment::guessed(
        id,
        nonempty(a.filename.as_deref()),
        nonempty(a.content_type.as_deref()),
        a.size,
    );
    // The app records voice notes as AAC with no file name.
    if att.kind == talaria_adapter::MediaKind::Audio && att.name.is_none() {
        att.kind = talaria_adapter::MediaKind::Voice;
    }
    Some(att)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn me() -> Me {
        Me {
            account: "+10000000000".into(),
            uuid: Some("bbbbbbbb-0000-0000-0000-000000000000".into()),
        }
    }

    fn cx<'a>(me: &'a Me, allowed: &'a [String]) -> Context<'a> {
        Context {
            me,
            require_mention: true,
            allowed,
        }
    }

    fn item(v: serde_json::Value) -> Incoming {
        serde_json::from_value(v).unwrap()
    }

    fn dm(text: &str) -> serde_json::Value {
        json!({"account": "+10000000000", "envelope": {
            "source": "+15550001111", "sourceNumber": "+15550001111",
            "sourceUuid": "aaaaaaaa-1111-2222-3333-444444444444", "sourceName": "Alice",
            "sourceDevice": 1, "timestamp": 1700000000123_i64,
            "dataMessage": {"timestamp": 1700000000123_i64, "message": text,
                            "expiresInSeconds": 0, "viewOnce": false}}})
    }

    #[test]
    fn a_dm_maps_with_the_uuid_and_a_message_id_of_author_and_time() {
        let me = me();
        let ev = map_incoming(&item(dm("hi")), &cx(&me, &[])).unwrap();
        assert_eq!(ev.text, "hi");
        assert_eq!(ev.source.chat_type, ChatType::Dm);
        assert_eq!(ev.source.chat_id, "aaaaaaaa-1111-2222-3333-444444444444");
        assert_eq!(
            ev.source.user_id.as_deref(),
            Some("aaaaaaaa-1111-2222-3333-444444444444")
        );
        assert_eq!(ev.source.user_name.as_deref(), Some("Alice"));
        assert_eq!(
            ev.message_id.as_deref(),
            Some("1700000000123:aaaaaaaa-1111-2222-3333-444444444444")
        );
        assert_eq!(
            parse_message_id(ev.message_id.as_deref().unwrap()),
            Some((1700000000123, "aaaaaaaa-1111-2222-3333-444444444444"))
        );
    }

    #[test]
    fn the_sender_takes_the_form_the_allowlist_names() {
        let me = me();
        let by_number = vec!["+15550001111".to_owned()];
        let ev = map_incoming(&item(dm("hi")), &cx(&me, &by_number)).unwrap();
        assert_eq!(ev.source.user_id.as_deref(), Some("+15550001111"));
        // The chat stays keyed by the UUID whatever the list says.
        assert_eq!(ev.source.chat_id, "aaaaaaaa-1111-2222-3333-444444444444");
        let by_uuid = vec!["AAAAAAAA-1111-2222-3333-444444444444".to_owned()];
        let ev = map_incoming(&item(dm("hi")), &cx(&me, &by_uuid)).unwrap();
        assert_eq!(
            ev.source.user_id.as_deref(),
            Some("AAAAAAAA-1111-2222-3333-444444444444")
        );
        // A sender without a UUID (old servers) is its number.
        let mut v = dm("hi");
        v["envelope"]["sourceUuid"] = json!(null);
        let ev = map_incoming(&item(v), &cx(&me, &[])).unwrap();
        assert_eq!(ev.source.user_id.as_deref(), Some("+15550001111"));
        assert_eq!(ev.source.chat_id, "+15550001111");
    }

    #[test]
    fn groups_need_a_mention_or_a_quote_of_the_bot() {
        let me = me();
        let mut v = dm("\u{fffc} what time is it?");
        v["envelope"]["dataMessage"]["groupInfo"] =
            json!({"groupId": "Z3JvdXBpZA==", "groupName": "Team", "type": "DELIVER"});
        let plain = {
            let mut p = v.clone();
            p["envelope"]["dataMessage"]["message"] = json!("just chatting");
            p
        };
        assert!(map_incoming(&item(plain.clone()), &cx(&me, &[])).is_err());
        let open = Context {
            require_mention: false,
            ..cx(&me, &[])
        };
        assert!(map_incoming(&item(plain), &open).is_ok());
        v["envelope"]["dataMessage"]["mentions"] = json!([{"name": "+10000000000",
            "number": "+10000000000", "uuid": "bbbbbbbb-0000-0000-0000-000000000000",
            "start": 0, "length": 1}]);
        let ev = map_incoming(&item(v.clone()), &cx(&me, &[])).unwrap();
        assert_eq!(ev.text, "what time is it?");
        assert_eq!(ev.source.chat_type, ChatType::Group);
        assert_eq!(ev.source.chat_id, group_recipient("Z3JvdXBpZA=="));
        assert_eq!(ev.source.chat_id, "group.WjNKdmRYQnBaQT09");
        assert_eq!(ev.source.chat_name.as_deref(), Some("Team"));
        // Someone else's mention becomes @name and does not count.
        v["envelope"]["dataMessage"]["mentions"] = json!([{"name": "Bob",
            "number": "+15550002222", "start": 0, "length": 1}]);
        assert!(map_incoming(&item(v.clone()), &cx(&me, &[])).is_err());
        let ev = map_incoming(&item(v.clone()), &open).unwrap();
        assert_eq!(ev.text, "@Bob what time is it?");
        // Quoting the bot addresses it.
        v["envelope"]["dataMessage"]["quote"] = json!({"id": 1699999999000_i64,
            "author": "+10000000000", "authorNumber": "+10000000000", "text": "earlier"});
        let ev = map_incoming(&item(v), &cx(&me, &[])).unwrap();
        assert_eq!(
            ev.reply_to_message_id.as_deref(),
            Some("1699999999000:+10000000000")
        );
        assert_eq!(ev.reply_to_text.as_deref(), Some("earlier"));
    }

    #[test]
    fn receipts_typing_sync_own_and_empty_messages_are_skipped() {
        let me = me();
        let c = cx(&me, &[]);
        let base = dm("x");
        let mut receipt = base.clone();
        receipt["envelope"]["dataMessage"] = json!(null);
        receipt["envelope"]["receiptMessage"] =
            json!({"when": 1, "isDelivery": true, "timestamps": [1]});
        assert!(map_incoming(&item(receipt), &c).is_err());
        let mut typing = base.clone();
        typing["envelope"]["dataMessage"] = json!(null);
        typing["envelope"]["typingMessage"] = json!({"action": "STARTED", "timestamp": 1});
        assert!(map_incoming(&item(typing), &c).is_err());
        let mut sync = base.clone();
        sync["envelope"]["syncMessage"] = json!({"sentMessage": {"message": "from my phone"}});
        assert!(map_incoming(&item(sync), &c).is_err());
        let mut own = base.clone();
        own["envelope"]["sourceNumber"] = json!("+10000000000");
        own["envelope"]["source"] = json!("+10000000000");
        assert!(map_incoming(&item(own), &c).is_err());
        let mut other = base.clone();
        other["account"] = json!("+19999999999");
        assert!(map_incoming(&item(other), &c).is_err());
        let mut reaction = base.clone();
        reaction["envelope"]["dataMessage"]["message"] = json!(null);
        reaction["envelope"]["dataMessage"]["reaction"] = json!({"emoji": "👍"});
        assert!(map_incoming(&item(reaction), &c).is_err());
        assert!(map_incoming(&item(json!({"error": "boom"})), &c).is_err());
    }

    #[test]
    fn attachments_are_fetched_by_id_with_what_signal_claims() {
        let me = me();
        let mut v = dm("");
        v["envelope"]["dataMessage"]["attachments"] = json!([
            {"contentType": "image/jpeg", "filename": "cat.jpg", "id": "abc", "size": 2048},
            {"contentType": "application/pdf", "id": "def"}
        ]);
        let ev = map_incoming(&item(v), &cx(&me, &[])).unwrap();
        assert_eq!(ev.text, "");
        assert_eq!(
            ev.attachments,
            vec![
                talaria_adapter::Attachment::guessed(
                    "abc",
                    Some("cat.jpg"),
                    Some("image/jpeg"),
                    Some(2048)
                ),
                talaria_adapter::Attachment::guessed("def", None, Some("application/pdf"), None),
            ]
        );
    }

    #[test]
    fn message_ids_parse_back() {
        assert_eq!(parse_message_id("12:+1555"), Some((12, "+1555")));
        assert_eq!(parse_message_id("x:+1555"), None);
        assert_eq!(parse_message_id("12:"), None);
        assert_eq!(parse_message_id("12"), None);
    }
}
