//! WebSocket events to [`MessageEvent`]s.
//!
//! A `posted` event carries the post as a JSON *string* in `data.post`,
//! the channel's type in `data.channel_type` (`D` direct, `G` group
//! message, `O` public, `P` private) and, when someone was mentioned, a
//! JSON-string array of user ids in `data.mentions`.

use std::collections::{HashSet, VecDeque};

use serde::Deserialize;
use serde_json::Value;
use talaria_adapter::{ChatType, MessageEvent, SessionSource};

use super::api::Post;

/// The bot itself, from `GET /users/me`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Me {
    pub id: String,
    pub username: String,
}

/// Why a post was not turned into an event (logged, never an error).
pub(crate) type Skip = &'static str;

/// One WebSocket frame from the server: an event (`event` set) or the
/// reply to one of our actions (`seq_reply` set).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Frame {
    #[serde(default)]
    pub event: Option<String>,
    #[serde(default)]
    pub data: Value,
    #[serde(default)]
    pub seq: Option<i64>,
    #[serde(default)]
    pub seq_reply: Option<i64>,
    #[serde(default)]
    pub status: Option<String>,
}

/// Thread roots the bot takes part in: a reply in one of them is for the
/// bot even without a mention, as a reply to the bot is on Telegram.
/// Bounded; the oldest are forgotten first (and all on restart).
#[derive(Debug, Default)]
pub(crate) struct BotThreads {
    order: VecDeque<String>,
    set: HashSet<String>,
}

/// How many thread roots [`BotThreads`] remembers.
const BOT_THREADS_CAP: usize = 4096;

impl BotThreads {
    pub(crate) fn contains(&self, root: &str) -> bool {
        self.set.contains(root)
    }

    pub(crate) fn insert(&mut self, root: &str) {
        if root.is_empty() || !self.set.insert(root.to_owned()) {
            return;
        }
        self.order.push_back(root.to_owned());
        while self.order.len() > BOT_THREADS_CAP {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }
}

/// What a mapped post is, besides its event: the thread root the answer
/// goes to, so the adapter can remember the bot is in it.
#[derive(Debug)]
pub(crate) struct Mapped {
    pub event: MessageEvent,
    pub thread_root: Option<String>,
}

/// Maps the `data` of a `posted` event.
pub(crate) fn map_posted(
    data: &Value,
    me: &Me,
    require_mention: bool,
    threads: &BotThreads,
) -> Result<Mapped, Skip> {
    let raw = data.get("post").ok_or("no post in the event")?;
    let post: Post = match raw {
        Value::String(s) => serde_json::from_str(s).map_err(|_| "malformed post JSON")?,
        // Tolerate a server that sends the post as an object.
        Value::Object(_) => serde_json::from_value(raw.clone()).map_err(|_| "malformed post")?,
        _ => return Err("malformed post"),
    };
    if post.id.is_empty() || post.channel_id.is_empty() {
        return Err("post without id or channel");
    }
    if !me.id.is_empty() && post.user_id == me.id {
        return Err("the bot's own post");
    }
    if !post.kind.is_empty() {
        return Err("system post");
    }
    let chat_type = match data.get("channel_type").and_then(Value::as_str) {
        Some("D") => ChatType::Dm,
        Some("G" | "O" | "P") => ChatType::Group,
        _ => return Err("unknown channel type"),
    };
    // Fetched through the files API (`GET /files/{id}`) when the turn runs.
    // Mattermost has no voice notes or photo messages, only files: the
    // kind is guessed from the file info the server adds to the post
    // (a document when there is none), and the bytes decide later.
    let infos = post
        .metadata
        .as_ref()
        .map(|m| m.files.as_slice())
        .unwrap_or(&[]);
    let attachments: Vec<talaria_adapter::Attachment> = post
        .file_ids
        .iter()
        .map(|id| match infos.iter().find(|f| f.id == *id) {
            Some(f) => talaria_adapter::Attachment::guessed(
                id.clone(),
                f.name.as_deref(),
                f.mime_type.as_deref(),
                f.size,
            ),
            None => talaria_adapter::Attachment::remote(
                talaria_adapter::MediaKind::Document,
                id.clone(),
            ),
        })
        .collect();
    let root = (!post.root_id.is_empty()).then(|| post.root_id.clone());
    let mut text = post.message.clone();
    if chat_type != ChatType::Dm {
        let mentioned = mention_ids(data).contains(&me.id)
            || mentions(&text, &me.username)
            || root.as_deref().is_some_and(|r| threads.contains(r));
        if require_mention && !mentioned {
            return Err("channel post does not address the bot");
        }
    }
    text = strip_mention(&text, &me.username);
    if text.trim().is_empty() && attachments.is_empty() {
        return Err("no text or file");
    }
    // In channels the answer goes to a thread under the post (or the
    // thread it is in), so the conversation stays in one place; a DM is
    // answered inline unless the user wrote in a thread.
    let thread_id = match chat_type {
        ChatType::Dm => root.clone(),
        _ => Some(root.clone().unwrap_or_else(|| post.id.clone())),
    };
    let is_bot = matches!(post.props.get("from_bot"), Some(Value::Bool(true)))
        || post.props.get("from_bot").and_then(Value::as_str) == Some("true");
    let user_name = data
        .get("sender_name")
        .and_then(Value::as_str)
        .map(|n| n.trim_start_matches('@').to_owned())
        .filter(|n| !n.is_empty());
    let chat_name = data
        .get("channel_display_name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_owned);
    let source = SessionSource {
        platform: "mattermost".to_owned(),
        chat_id: post.channel_id.clone(),
        chat_name,
        chat_type,
        user_id: (!post.user_id.is_empty()).then(|| post.user_id.clone()),
        user_name,
        thread_id: thread_id.clone(),
        is_bot,
    };
    Ok(Mapped {
        event: MessageEvent {
            source,
            text,
            message_id: Some(post.id),
            reply_to_message_id: None,
            reply_to_text: None,
            attachments,
            reply_target: None,
        },
        thread_root: thread_id,
    })
}

/// `data.mentions`: a JSON array inside a string (or, leniently, an array).
fn mention_ids(data: &Value) -> Vec<String> {
    let parse = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    match data.get("mentions") {
        Some(Value::String(s)) => serde_json::from_str::<Value>(s)
            .map(|v| parse(&v))
            .unwrap_or_default(),
        Some(v @ Value::Array(_)) => parse(v),
        _ => Vec::new(),
    }
}

/// Characters that continue a Mattermost username.
fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// Where `@name` occurs as a whole word, case-insensitively (byte ranges).
fn mention_spans(text: &str, name: &str) -> Vec<(usize, usize)> {
    if name.is_empty() {
        return Vec::new();
    }
    let lower = text.to_ascii_lowercase();
    let needle = format!("@{}", name.to_ascii_lowercase());
    lower
        .match_indices(&needle)
        .filter(|(i, _)| {
            let before_ok = lower[..*i]
                .chars()
                .next_back()
                .is_none_or(|c| !name_char(c));
            // A trailing dot ends a sentence rather than the name.
            let mut after = lower[*i + needle.len()..].chars();
            let after_ok = match after.next() {
                None => true,
                Some('.') => after.next().is_none_or(|c| !name_char(c)),
                Some(c) => !name_char(c),
            };
            before_ok && after_ok
        })
        .map(|(i, _)| (i, i + needle.len()))
        .collect()
}

/// Whether `text` mentions `@name`.
pub(crate) fn mentions(text: &str, name: &str) -> bool {
    !mention_spans(text, name).is_empty()
}

/// `text` without `@name` (and a `:` or `,` right after it), trimmed.
pub(crate) fn strip_mention(text: &str, name: &str) -> String {
    let spans = mention_spans(text, name);
    if spans.is_empty() {
        return text.trim().to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (start, end) in spans {
        out.push_str(&text[at..start]);
        let mut end = end;
        if text[end..].starts_with([':', ',']) {
            end += 1;
        }
        // Do not leave two spaces where the mention was.
        if out.ends_with(' ') && text[end..].starts_with(' ') {
            end += 1;
        }
        at = end;
    }
    out.push_str(&text[at..]);
    out.trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn me() -> Me {
        Me {
            id: "botid".into(),
            username: "talaria".into(),
        }
    }

    fn posted(channel_type: &str, post: Value, mentions: Option<&str>) -> Value {
        let mut d = json!({
            "channel_type": channel_type,
            "channel_display_name": "Town Square",
            "sender_name": "@alice",
            "post": post.to_string(),
        });
        if let Some(m) = mentions {
            d["mentions"] = json!(m);
        }
        d
    }

    fn post(id: &str, root: &str, text: &str) -> Value {
        json!({"id": id, "channel_id": "chan", "root_id": root, "user_id": "alice",
               "message": text, "type": ""})
    }

    #[test]
    fn dms_map_without_a_mention_and_without_a_thread() {
        let t = BotThreads::default();
        let m = map_posted(&posted("D", post("p1", "", "hi"), None), &me(), true, &t).unwrap();
        let ev = m.event;
        assert_eq!(ev.source.chat_type, ChatType::Dm);
        assert_eq!(ev.source.chat_id, "chan");
        assert_eq!(ev.source.user_id.as_deref(), Some("alice"));
        assert_eq!(ev.source.user_name.as_deref(), Some("alice"));
        assert_eq!(ev.source.thread_id, None);
        assert_eq!(ev.message_id.as_deref(), Some("p1"));
        assert_eq!(ev.text, "hi");
        // A DM thread reply stays in its thread.
        let m = map_posted(
            &posted("D", post("p2", "p1", "more"), None),
            &me(),
            true,
            &t,
        )
        .unwrap();
        assert_eq!(m.event.source.thread_id.as_deref(), Some("p1"));
    }

    #[test]
    fn channels_need_a_mention_and_answer_in_a_thread() {
        let mut t = BotThreads::default();
        for kind in ["O", "P", "G"] {
            let plain = posted(kind, post("p1", "", "just chatting"), None);
            assert!(map_posted(&plain, &me(), true, &t).is_err(), "{kind}");
            assert!(map_posted(&plain, &me(), false, &t).is_ok(), "{kind}");
        }
        let by_id = posted("O", post("p2", "", "hey you"), Some("[\"botid\"]"));
        let m = map_posted(&by_id, &me(), true, &t).unwrap();
        assert_eq!(m.event.source.chat_type, ChatType::Group);
        assert_eq!(m.event.source.thread_id.as_deref(), Some("p2"));
        assert_eq!(m.thread_root.as_deref(), Some("p2"));
        let by_name = posted("O", post("p3", "", "@Talaria: what's up?"), None);
        let m = map_posted(&by_name, &me(), true, &t).unwrap();
        assert_eq!(m.event.text, "what's up?");
        // Someone else mentioned: not for the bot.
        let other = posted("O", post("p4", "", "@talaria_two hi"), Some("[\"x\"]"));
        assert!(map_posted(&other, &me(), true, &t).is_err());
        // A reply in a thread the bot is in needs no mention.
        let reply = posted("O", post("p5", "p2", "and then?"), None);
        assert!(map_posted(&reply, &me(), true, &t).is_err());
        t.insert("p2");
        let m = map_posted(&reply, &me(), true, &t).unwrap();
        assert_eq!(m.event.source.thread_id.as_deref(), Some("p2"));
    }

    #[test]
    fn own_system_and_malformed_posts_are_skipped() {
        let t = BotThreads::default();
        let mut own = post("p1", "", "hi");
        own["user_id"] = json!("botid");
        assert!(map_posted(&posted("D", own, None), &me(), true, &t).is_err());
        let mut sys = post("p1", "", "alice joined");
        sys["type"] = json!("system_join_channel");
        assert!(map_posted(&posted("O", sys, None), &me(), false, &t).is_err());
        let bad = json!({"channel_type": "D", "post": "{not json"});
        assert!(map_posted(&bad, &me(), true, &t).is_err());
        assert!(map_posted(&json!({"channel_type": "D"}), &me(), true, &t).is_err());
        let odd = posted("X", post("p1", "", "hi"), None);
        assert!(map_posted(&odd, &me(), true, &t).is_err());
        let empty = posted("D", post("p1", "", "  "), None);
        assert!(map_posted(&empty, &me(), true, &t).is_err());
    }

    #[test]
    fn mention_words() {
        assert!(mentions("hi @talaria!", "talaria"));
        assert!(mentions("thanks @talaria.", "talaria"));
        assert!(!mentions("hi @talaria.bot", "talaria"));
        assert!(!mentions("hi @talaria-two", "talaria"));
        assert!(!mentions("mail x@talaria", "talaria"));
        assert_eq!(strip_mention("@talaria, do it", "talaria"), "do it");
        assert_eq!(strip_mention("ask @talaria now", "talaria"), "ask now");
        assert_eq!(strip_mention("no mention", "talaria"), "no mention");
    }

    #[test]
    fn bot_threads_are_bounded() {
        let mut t = BotThreads::default();
        for i in 0..BOT_THREADS_CAP + 10 {
            t.insert(&format!("r{i}"));
        }
        assert!(!t.contains("r0"));
        assert!(t.contains(&format!("r{}", BOT_THREADS_CAP + 9)));
        assert_eq!(t.set.len(), BOT_THREADS_CAP);
    }
}
