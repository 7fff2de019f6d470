//! Graph's resource paths, its chatMessage and mail message, and what
//! they become; and the ISO-8601 times subscriptions carry.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use talaria_adapter::{ChatType, MessageEvent, SessionSource};

use super::PLATFORM;

/// The changed item a notification names, parsed from its `resource`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Item {
    /// A message in a one-to-one, group or meeting chat.
    Chat { chat: String, message: String },
    /// A channel post, or (with `parent`) a reply in its thread.
    Channel {
        team: String,
        channel: String,
        message: String,
        parent: Option<String>,
    },
    /// A mail message in a user's mailbox.
    Mail { user: String, message: String },
}

/// The segments of a resource path: `chats('19:a')/messages('1')` and
/// `Users/u1/Messages/m1` both give `[("chats", "19:a"), ("messages",
/// "1")]`-like pairs, names lowercased.
fn segments(resource: &str) -> Option<Vec<(String, String)>> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut pending: Option<String> = None;
    for part in resource.trim().trim_start_matches('/').split('/') {
        if part.is_empty() {
            return None;
        }
        if let Some(name) = pending.take() {
            out.push((name, part.to_owned()));
            continue;
        }
        match part.split_once("('") {
            Some((name, rest)) => {
                let value = rest.strip_suffix("')")?;
                out.push((name.to_ascii_lowercase(), value.replace("''", "'")));
            }
            None => pending = Some(part.to_ascii_lowercase()),
        }
    }
    if pending.is_some() { None } else { Some(out) }
}

impl Item {
    /// The item a notification's `resource` names, or `None` for a shape
    /// this adapter does not read.
    pub(crate) fn parse(resource: &str) -> Option<Item> {
        let seg = segments(resource)?;
        let names: Vec<&str> = seg.iter().map(|(n, _)| n.as_str()).collect();
        let v = |i: usize| seg[i].1.clone();
        let ok = |s: &str| !s.is_empty() && s.len() <= 512;
        let item = match names.as_slice() {
            ["chats", "messages"] => Item::Chat {
                chat: v(0),
                message: v(1),
            },
            ["teams", "channels", "messages"] => Item::Channel {
                team: v(0),
                channel: v(1),
                message: v(2),
                parent: None,
            },
            ["teams", "channels", "messages", "replies"] => Item::Channel {
                team: v(0),
                channel: v(1),
                message: v(3),
                parent: Some(v(2)),
            },
            ["users", "messages"] | ["users", "mailfolders", "messages"] => Item::Mail {
                user: v(0),
                message: v(seg.len() - 1),
            },
            _ => return None,
        };
        seg.iter().all(|(_, value)| ok(value)).then_some(item)
    }

    /// The path to GET it from, under the Graph root.
    pub(crate) fn path(&self) -> String {
        match self {
            Item::Chat { chat, message } => {
                format!("/chats/{}/messages/{}", esc(chat), esc(message))
            }
            Item::Channel {
                team,
                channel,
                message,
                parent: None,
            } => format!(
                "/teams/{}/channels/{}/messages/{}",
                esc(team),
                esc(channel),
                esc(message)
            ),
            Item::Channel {
                team,
                channel,
                message,
                parent: Some(parent),
            } => format!(
                "/teams/{}/channels/{}/messages/{}/replies/{}",
                esc(team),
                esc(channel),
                esc(parent),
                esc(message)
            ),
            Item::Mail { user, message } => {
                format!("/users/{}/messages/{}", esc(user), esc(message))
            }
        }
    }

    /// The resource string Graph would name it by, for the journal.
    pub(crate) fn resource(&self) -> String {
        match self {
            Item::Chat { chat, message } => {
                format!("chats('{}')/messages('{}')", quote(chat), quote(message))
            }
            Item::Channel {
                team,
                channel,
                message,
                parent,
            } => {
                let mut r = format!(
                    "teams('{}')/channels('{}')/messages('{}')",
                    quote(team),
                    quote(channel),
                    quote(parent.as_deref().unwrap_or(message))
                );
                if parent.is_some() {
                    r.push_str(&format!("/replies('{}')", quote(message)));
                }
                r
            }
            Item::Mail { user, message } => {
                format!("users('{}')/messages('{}')", quote(user), quote(message))
            }
        }
    }

    /// The message's own id: the key repeats are dropped by.
    pub(crate) fn message_id(&self) -> &str {
        match self {
            Item::Chat { message, .. }
            | Item::Channel { message, .. }
            | Item::Mail { message, .. } => message,
        }
    }
}

fn quote(s: &str) -> String {
    s.replace('\'', "''")
}

/// A path segment, percent-encoded but for what Graph's ids use plainly.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:@!$&'()*+,;=".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// What a resource subscribed to lists, for a resync after `missed`.
/// `None` for tenant-wide resources (`getAllMessages`), which cannot be
/// listed.
pub(crate) fn listable(resource: &str) -> Option<Listing> {
    let parts: Vec<&str> = resource.trim().trim_matches('/').split('/').collect();
    let lower: Vec<String> = parts.iter().map(|p| p.to_ascii_lowercase()).collect();
    let names: Vec<&str> = lower.iter().map(String::as_str).collect();
    let owned = |s: &str| (!s.is_empty() && !s.contains('(')).then(|| s.to_owned());
    match names.as_slice() {
        ["chats", _, "messages"] => Some(Listing::Chat(owned(parts[1])?)),
        ["teams", _, "channels", _, "messages"] => {
            Some(Listing::Channel(owned(parts[1])?, owned(parts[3])?))
        }
        ["users", _, "messages"] | ["users", _, "mailfolders", _, "messages"] => {
            Some(Listing::Mail(owned(parts[1])?))
        }
        ["users", _, folder, "messages"] if folder.starts_with("mailfolders(") => {
            Some(Listing::Mail(owned(parts[1])?))
        }
        _ => None,
    }
}

/// A listable resource's owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Listing {
    Chat(String),
    Channel(String, String),
    Mail(String),
}

impl Listing {
    /// The item for message `id` listed here.
    pub(crate) fn item(&self, id: &str) -> Item {
        match self {
            Listing::Chat(chat) => Item::Chat {
                chat: chat.clone(),
                message: id.to_owned(),
            },
            Listing::Channel(team, channel) => Item::Channel {
                team: team.clone(),
                channel: channel.clone(),
                message: id.to_owned(),
                parent: None,
            },
            Listing::Mail(user) => Item::Mail {
                user: user.clone(),
                message: id.to_owned(),
            },
        }
    }
}

/// Who the app is, to tell its own messages and mentions apart.
#[derive(Debug, Clone, Default)]
pub(crate) struct Me {
    /// The app registration's client id.
    pub app_id: String,
    /// The user the delegated token posts as, once known.
    pub user_id: Option<String>,
}

/// What one fetched message became.
#[derive(Debug, PartialEq)]
pub(crate) enum Mapped {
    Event(Box<MessageEvent>),
    /// Not handed on; why.
    Skip(&'static str),
}

/// Chat kinds as Graph names them (`oneOnOne`, `group`, `meeting`).
pub(crate) fn chat_type(kind: &str) -> ChatType {
    if kind.eq_ignore_ascii_case("oneOnOne") {
        ChatType::Dm
    } else {
        ChatType::Group
    }
}

/// A chatMessage (`item` is a chat or channel item) as an inbound event.
/// `kind` is the chat's type (channels are shared).
pub(crate) fn map_chat_message(
    item: &Item,
    msg: &Value,
    kind: ChatType,
    me: &Me,
    require_mention: bool,
) -> Mapped {
    if msg["messageType"].as_str().unwrap_or("message") != "message" {
        return Mapped::Skip("not a user message (a system event)");
    }
    if !msg["deletedDateTime"].is_null() {
        return Mapped::Skip("a deleted message");
    }
    let from = &msg["from"];
    if from["application"]["id"].as_str().is_some() || from["user"].is_null() {
        return Mapped::Skip("sent by an app (this one or another)");
    }
    let Some(user_id) = from["user"]["id"].as_str().filter(|s| !s.is_empty()) else {
        return Mapped::Skip("no sender");
    };
    if me.user_id.as_deref() == Some(user_id) {
        return Mapped::Skip("sent by the app's own user");
    }
    let Some(id) = msg["id"].as_str() else {
        return Mapped::Skip("no message id");
    };
    let text = body_text(&without_my_mentions(msg, me));
    let (chat_id, chat_type, thread) = match item {
        Item::Chat { chat, .. } => (format!("chat:{chat}"), kind, None),
        Item::Channel {
            team,
            channel,
            parent,
            ..
        } => {
            let root = msg["replyToId"]
                .as_str()
                .map(str::to_owned)
                .or_else(|| parent.clone())
                .unwrap_or_else(|| id.to_owned());
            (
                format!("channel:{team}/{channel}"),
                ChatType::Group,
                Some(root),
            )
        }
        Item::Mail { .. } => return Mapped::Skip("not a chat message"),
    };
    if chat_type.is_shared() && require_mention && !mentions_me(msg, me) {
        return Mapped::Skip("a shared-chat message that does not mention the app");
    }
    if text.trim().is_empty() {
        return Mapped::Skip("no text");
    }
    let source = SessionSource {
        platform: PLATFORM.to_owned(),
        chat_id,
        chat_name: None,
        chat_type,
        user_id: Some(user_id.to_owned()),
        user_name: from["user"]["displayName"].as_str().map(str::to_owned),
        thread_id: thread,
        is_bot: false,
    };
    let mut event = MessageEvent::text(source, text);
    event.message_id = Some(id.to_owned());
    Mapped::Event(Box::new(event))
}

fn is_me(mention: &Value, me: &Me) -> bool {
    let who = &mention["mentioned"];
    who["application"]["id"].as_str() == Some(me.app_id.as_str())
        || (me.user_id.is_some() && who["user"]["id"].as_str() == me.user_id.as_deref())
}

fn mentions_me(msg: &Value, me: &Me) -> bool {
    msg["mentions"]
        .as_array()
        .is_some_and(|all| all.iter().any(|m| is_me(m, me)))
}

/// The message's body with the `<at id="n">…</at>` elements that address
/// the app taken out (others stay, as `@Name`).
fn without_my_mentions(msg: &Value, me: &Me) -> Value {
    let mut body = msg["body"].clone();
    let Some(mut content) = body["content"].as_str().map(str::to_owned) else {
        return body;
    };
    for m in msg["mentions"].as_array().into_iter().flatten() {
        if !is_me(m, me) {
            continue;
        }
        let id = match &m["id"] {
            Value::Number(n) => n.to_string(),
            Value::String(s) => s.clone(),
            _ => continue,
        };
        let open = format!("<at id=\"{id}\">");
        if let Some(start) = content.find(&open)
            && let Some(len) = content[start..].find("</at>")
        {
            content.replace_range(start..start + len + "</at>".len(), "");
        }
    }
    body["content"] = Value::String(content);
    body
}

/// A mail message as an inbound event: one conversation per sender,
/// threaded by Outlook's conversation id; the text is the subject and the
/// new part of the body.
pub(crate) fn map_mail(item: &Item, msg: &Value) -> Mapped {
    let Item::Mail { user, .. } = item else {
        return Mapped::Skip("not a mail message");
    };
    if msg["isDraft"].as_bool() == Some(true) {
        return Mapped::Skip("a draft");
    }
    let Some(id) = msg["id"].as_str() else {
        return Mapped::Skip("no message id");
    };
    let Some(address) = msg["from"]["emailAddress"]["address"]
        .as_str()
        .map(|a| a.trim().to_ascii_lowercase())
        .filter(|a| a.contains('@'))
    else {
        return Mapped::Skip("no sender address");
    };
    let body = if msg["uniqueBody"].is_object() {
        body_text(&msg["uniqueBody"])
    } else {
        body_text(&msg["body"])
    };
    let subject = msg["subject"].as_str().unwrap_or("").trim();
    let text = match (subject.is_empty(), body.trim().is_empty()) {
        (_, true) => subject.to_owned(),
        (true, false) => body.trim().to_owned(),
        (false, false) => format!("{subject}\n\n{}", body.trim()),
    };
    if text.is_empty() {
        return Mapped::Skip("no text");
    }
    let source = SessionSource {
        platform: PLATFORM.to_owned(),
        chat_id: format!("mail:{user}/{address}"),
        chat_name: None,
        chat_type: ChatType::Dm,
        user_id: Some(address),
        user_name: msg["from"]["emailAddress"]["name"]
            .as_str()
            .map(str::to_owned),
        thread_id: msg["conversationId"].as_str().map(str::to_owned),
        is_bot: false,
    };
    let mut event = MessageEvent::text(source, text);
    event.message_id = Some(id.to_owned());
    Mapped::Event(Box::new(event))
}

/// An itemBody's text: HTML made plain (tags dropped, line breaks kept,
/// entities decoded), text as is.
pub(crate) fn body_text(body: &Value) -> String {
    let content = body["content"].as_str().unwrap_or("");
    if body["contentType"]
        .as_str()
        .is_some_and(|t| t.eq_ignore_ascii_case("html"))
    {
        html_to_text(content)
    } else {
        content.trim().to_owned()
    }
}

fn html_to_text(html: &str) -> String {
    let mut out = String::new();
    let mut rest = html;
    while let Some(open) = rest.find('<') {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('>') else {
            rest = "";
            break;
        };
        let tag = rest[open + 1..open + close].trim().to_ascii_lowercase();
        let name = tag
            .trim_start_matches('/')
            .split([' ', '/'])
            .next()
            .unwrap_or("");
        if matches!(name, "br" | "p" | "div" | "li") && (tag.starts_with('/') || name == "br") {
            out.push('\n');
        }
        if name == "at" && !tag.starts_with('/') {
            out.push('@');
        }
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    let decoded = out
        .replace("&nbsp;", " ")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&");
    let lines: Vec<&str> = decoded.lines().map(str::trim).collect();
    lines.join("\n").trim().to_owned()
}

/// `t` as Graph writes times: `2026-12-07T09:00:00.000Z`.
pub(crate) fn iso8601(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, day) = civil(days);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Reads `YYYY-MM-DDTHH:MM:SS[.fraction](Z|+00:00)`; other offsets are
/// applied.
pub(crate) fn parse_iso8601(s: &str) -> Option<SystemTime> {
    let s = s.trim();
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if s.get(4..5)? != "-" || !s.get(10..11)?.eq_ignore_ascii_case("T") {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let end = frac
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(frac.len());
        rest = &frac[end..];
    }
    let offset = match rest {
        "Z" | "z" | "" => 0,
        _ => {
            let sign = match rest.get(0..1)? {
                "+" => 1,
                "-" => -1,
                _ => return None,
            };
            let oh = rest.get(1..3)?.parse::<i64>().ok()?;
            let om = rest.get(4..6)?.parse::<i64>().ok()?;
            sign * (oh * 3600 + om * 60)
        }
    };
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + se - offset;
    u64::try_from(secs)
        .ok()
        .map(|s| UNIX_EPOCH + Duration::from_secs(s))
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01.
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn resources_parse_in_both_spellings() {
        assert_eq!(
            Item::parse("chats('19:abc@thread.v2')/messages('1616965872395')"),
            Some(Item::Chat {
                chat: "19:abc@thread.v2".into(),
                message: "1616965872395".into()
            })
        );
        let reply =
            Item::parse("teams('t1')/channels('19:c@thread.tacv2')/messages('p1')/replies('r1')")
                .unwrap();
        assert_eq!(
            reply,
            Item::Channel {
                team: "t1".into(),
                channel: "19:c@thread.tacv2".into(),
                message: "r1".into(),
                parent: Some("p1".into())
            }
        );
        assert_eq!(
            reply.path(),
            "/teams/t1/channels/19:c@thread.tacv2/messages/p1/replies/r1"
        );
        assert_eq!(Item::parse(&reply.resource()), Some(reply));
        let mail = Item::parse("Users/u-1/Messages/AAMk=").unwrap();
        assert_eq!(mail.path(), "/users/u-1/messages/AAMk=");
        assert_eq!(Item::parse(&mail.resource()), Some(mail));
        for bad in [
            "",
            "chats('a')",
            "chats('a')/members('b')",
            "chats('a/messages('b')",
            "Users/u",
        ] {
            assert_eq!(Item::parse(bad), None, "{bad}");
        }
        assert_eq!(esc("a b/c#"), "a%20b%2Fc%23");
    }

    #[test]
    fn listable_resources_are_the_ones_with_an_owner() {
        assert_eq!(listable("/chats/getAllMessages"), None);
        assert_eq!(listable("/teams/getAllMessages"), None);
        assert_eq!(
            listable("/chats/19:a@thread.v2/messages"),
            Some(Listing::Chat("19:a@thread.v2".into()))
        );
        assert_eq!(
            listable("/teams/t/channels/c/messages"),
            Some(Listing::Channel("t".into(), "c".into()))
        );
        assert_eq!(
            listable("/users/u/mailFolders('Inbox')/messages"),
            Some(Listing::Mail("u".into()))
        );
    }

    #[test]
    fn chat_messages_map_by_kind_mention_and_sender() {
        let me = Me {
            app_id: "app-1".into(),
            user_id: Some("bot-user".into()),
        };
        let item = Item::Chat {
            chat: "19:x".into(),
            message: "m1".into(),
        };
        let msg = json!({"id": "m1", "messageType": "message", "from": {"user": {"id": "u1", "displayName": "Ada"}},
                         "body": {"contentType": "html", "content": "<p>Hi <at id=\"0\">Talaria</at> &amp; you</p>"},
                         "mentions": [{"id": 0, "mentionText": "Talaria", "mentioned": {"application": {"id": "app-1"}}}]});
        let Mapped::Event(e) = map_chat_message(&item, &msg, ChatType::Group, &me, true) else {
            panic!()
        };
        assert_eq!(e.text, "Hi  & you");
        assert_eq!(e.source.chat_id, "chat:19:x");
        let mut quiet = msg.clone();
        quiet["mentions"] = json!([]);
        assert!(matches!(
            map_chat_message(&item, &quiet, ChatType::Group, &me, true),
            Mapped::Skip(_)
        ));
        assert!(matches!(
            map_chat_message(&item, &quiet, ChatType::Dm, &me, true),
            Mapped::Event(_)
        ));
        let mut own = msg.clone();
        own["from"] = json!({"user": {"id": "bot-user"}});
        assert!(matches!(
            map_chat_message(&item, &own, ChatType::Dm, &me, true),
            Mapped::Skip(_)
        ));
        let mut app = msg.clone();
        app["from"] = json!({"application": {"id": "app-1"}});
        assert!(matches!(
            map_chat_message(&item, &app, ChatType::Dm, &me, true),
            Mapped::Skip(_)
        ));
        let channel = Item::Channel {
            team: "t".into(),
            channel: "c".into(),
            message: "r1".into(),
            parent: Some("p1".into()),
        };
        let Mapped::Event(e) = map_chat_message(&channel, &msg, ChatType::Group, &me, true) else {
            panic!()
        };
        assert_eq!(e.source.chat_id, "channel:t/c");
        assert_eq!(e.source.thread_id.as_deref(), Some("p1"));
    }

    #[test]
    fn mail_is_threaded_by_conversation() {
        let item = Item::Mail {
            user: "box".into(),
            message: "AA1".into(),
        };
        let msg = json!({"id": "AA1", "conversationId": "conv-1", "subject": "Question",
                         "from": {"emailAddress": {"name": "Ada", "address": "Ada@Example.com"}},
                         "body": {"contentType": "text", "content": "How are you?"}});
        let Mapped::Event(e) = map_mail(&item, &msg) else {
            panic!()
        };
        assert_eq!(e.source.chat_id, "mail:box/ada@example.com");
        assert_eq!(e.source.thread_id.as_deref(), Some("conv-1"));
        assert_eq!(e.text, "Question\n\nHow are you?");
    }

    #[test]
    fn times_round_trip() {
        let t = UNIX_EPOCH + Duration::from_millis(1_796_634_000_123);
        let s = iso8601(t);
        assert_eq!(s, "2026-12-07T09:00:00.123Z");
        assert_eq!(
            parse_iso8601(&s),
            Some(UNIX_EPOCH + Duration::from_secs(1_796_634_000))
        );
        assert_eq!(
            parse_iso8601("2026-12-07T10:00:00.5+01:00"),
            Some(UNIX_EPOCH + Duration::from_secs(1_796_634_000))
        );
        assert_eq!(parse_iso8601("2026-13-07T10:40:00Z"), None);
        assert_eq!(parse_iso8601("soon"), None);
    }
}
