//! Meta's webhook payload for WhatsApp and what it becomes: a
//! [`MessageEvent`] per inbound message, a note per failed delivery
//! receipt.
//!
//! A delivery is `{"object": "whatsapp_business_account", "entry": [{"id":
//! <WABA id>, "changes": [{"field": "messages", "value": {...}}]}]}`, where
//! each `value` carries `metadata.phone_number_id` (the business number it
//! is for), `contacts[]` (the senders' profile names), `messages[]` and
//! `statuses[]` (receipts for what the business sent). One app may serve
//! several numbers, so traffic for other numbers is counted and left alone.
//!
//! Every message is read on its own: one of an unexpected shape is skipped
//! (and logged by the caller) without losing the others of its delivery.

use serde::Deserialize;
use serde_json::Value;
use talaria_adapter::{Attachment, ChatType, MediaKind, MessageEvent, SessionSource};

use super::PLATFORM;
use super::api::OUTSIDE_WINDOW;

/// The `object` of WhatsApp deliveries.
pub(crate) const OBJECT: &str = "whatsapp_business_account";

/// Longest inbound message id used as given; Meta's are about 60 characters.
const MAX_MESSAGE_ID_LEN: usize = 256;

/// Longest `wa_id` accepted: phone numbers are at most 15 digits, and
/// Meta's newer user ids are short too.
const MAX_WA_ID_LEN: usize = 64;

#[derive(Debug, Default, Deserialize)]
struct Delivery {
    #[serde(default)]
    object: String,
    #[serde(default)]
    entry: Vec<Entry>,
}

#[derive(Debug, Default, Deserialize)]
struct Entry {
    #[serde(default)]
    changes: Vec<Change>,
}

#[derive(Debug, Default, Deserialize)]
struct Change {
    #[serde(default)]
    field: String,
    #[serde(default)]
    value: ChangeValue,
}

#[derive(Debug, Default, Deserialize)]
struct ChangeValue {
    #[serde(default)]
    metadata: Option<Metadata>,
    #[serde(default)]
    contacts: Vec<Contact>,
    /// Kept as JSON so that one odd message cannot fail the others.
    #[serde(default)]
    messages: Vec<Value>,
    #[serde(default)]
    statuses: Vec<Value>,
}

#[derive(Debug, Default, Deserialize)]
struct Metadata {
    #[serde(default)]
    phone_number_id: String,
}

#[derive(Debug, Default, Deserialize)]
struct Contact {
    #[serde(default)]
    wa_id: String,
    #[serde(default)]
    profile: Option<Profile>,
}

#[derive(Debug, Default, Deserialize)]
struct Profile {
    #[serde(default)]
    name: String,
}

#[derive(Debug, Deserialize)]
struct Inbound {
    from: String,
    id: String,
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    text: Option<Text>,
    #[serde(default)]
    image: Option<Media>,
    #[serde(default)]
    video: Option<Media>,
    #[serde(default)]
    audio: Option<Media>,
    #[serde(default)]
    sticker: Option<Media>,
    #[serde(default)]
    document: Option<Media>,
    #[serde(default)]
    location: Option<Location>,
    #[serde(default)]
    interactive: Option<Interactive>,
    #[serde(default)]
    button: Option<Button>,
    #[serde(default)]
    reaction: Option<Reaction>,
    #[serde(default)]
    contacts: Option<Vec<Value>>,
    #[serde(default)]
    context: Option<Context>,
}

#[derive(Debug, Deserialize)]
struct Text {
    #[serde(default)]
    body: String,
}

#[derive(Debug, Default, Deserialize)]
struct Media {
    /// The media id: `GET /{id}` gives a short-lived URL to fetch it from.
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    mime_type: Option<String>,
    #[serde(default)]
    caption: Option<String>,
    #[serde(default)]
    filename: Option<String>,
    /// Audio only: recorded in the app as a voice note.
    #[serde(default)]
    voice: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct Location {
    #[serde(default)]
    latitude: Option<f64>,
    #[serde(default)]
    longitude: Option<f64>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    address: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Interactive {
    #[serde(default)]
    button_reply: Option<Choice>,
    #[serde(default)]
    list_reply: Option<Choice>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    #[serde(default)]
    title: String,
}

#[derive(Debug, Deserialize)]
struct Button {
    #[serde(default)]
    text: String,
}

#[derive(Debug, Deserialize)]
struct Reaction {
    #[serde(default)]
    emoji: String,
}

#[derive(Debug, Deserialize)]
struct Context {
    #[serde(default)]
    id: Option<String>,
}

/// A delivery receipt that reports a failure, as the caller logs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FailedStatus {
    /// The recipient's `wa_id`.
    pub recipient: String,
    /// The message that failed.
    pub message_id: String,
    /// Graph's error code, when the receipt carries one.
    pub code: Option<i64>,
    /// Graph's title and details, joined.
    pub reason: String,
}

impl FailedStatus {
    /// Whether WhatsApp refused the message because the 24-hour customer
    /// service window was closed.
    pub fn is_outside_window(&self) -> bool {
        self.code == Some(OUTSIDE_WINDOW)
    }
}

/// What one delivery holds for this number.
#[derive(Debug, Default)]
pub(crate) struct Mapped {
    /// Inbound messages, in delivery order.
    pub events: Vec<MessageEvent>,
    /// Receipts that report failures.
    pub failures: Vec<FailedStatus>,
    /// Other receipts (sent, delivered, read).
    pub receipts: usize,
    /// Changes for other phone numbers of the same app, left alone.
    pub other_numbers: usize,
    /// Messages that could not be used, with why.
    pub skipped: Vec<String>,
}

/// Why a delivery was not for WhatsApp at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NotWhatsapp {
    /// Another product's webhook (`object` is not WhatsApp's).
    Object(String),
    /// The body is JSON but not shaped like a delivery.
    Shape(String),
}

/// Reads one delivery, keeping what is for `phone_number_id`.
pub(crate) fn map_delivery(body: &Value, phone_number_id: &str) -> Result<Mapped, NotWhatsapp> {
    let delivery: Delivery =
        serde_json::from_value(body.clone()).map_err(|e| NotWhatsapp::Shape(e.to_string()))?;
    if delivery.object != OBJECT {
        return Err(NotWhatsapp::Object(delivery.object));
    }
    let mut out = Mapped::default();
    for change in delivery.entry.iter().flat_map(|e| &e.changes) {
        if change.field != "messages" {
            continue;
        }
        let value = &change.value;
        let number = value
            .metadata
            .as_ref()
            .map_or("", |m| m.phone_number_id.as_str());
        if number != phone_number_id {
            out.other_numbers += 1;
            continue;
        }
        for raw in &value.messages {
            match map_message(raw, &value.contacts) {
                Ok(event) => out.events.push(event),
                Err(why) => out.skipped.push(why),
            }
        }
        for raw in &value.statuses {
            match failed_status(raw) {
                Some(f) => out.failures.push(f),
                None => out.receipts += 1,
            }
        }
    }
    Ok(out)
}

fn map_message(raw: &Value, contacts: &[Contact]) -> Result<MessageEvent, String> {
    let msg: Inbound =
        serde_json::from_value(raw.clone()).map_err(|e| format!("unreadable message: {e}"))?;
    let wa_id = msg.from.trim();
    if !usable_wa_id(wa_id) {
        return Err(format!(
            "the sender id {:?} is not usable as a chat id",
            truncate(wa_id, 40)
        ));
    }
    let message_id = msg.id.trim();
    if message_id.is_empty()
        || message_id.len() > MAX_MESSAGE_ID_LEN
        || talaria_core::ids::validate_logical_key(message_id).is_err()
    {
        return Err(format!(
            "the message id {:?} is not usable",
            truncate(message_id, 40)
        ));
    }
    let (text, attachments) = describe(&msg);
    if text.trim().is_empty() && attachments.is_empty() {
        return Err(format!("a {} message without content", msg.kind));
    }
    let user_name = contacts
        .iter()
        .find(|c| c.wa_id == wa_id)
        .and_then(|c| c.profile.as_ref())
        .map(|p| p.name.trim().to_owned())
        .filter(|n| !n.is_empty());
    let source = SessionSource {
        platform: PLATFORM.to_owned(),
        chat_id: wa_id.to_owned(),
        chat_name: user_name.clone(),
        chat_type: ChatType::Dm,
        user_id: Some(wa_id.to_owned()),
        user_name,
        thread_id: None,
        is_bot: false,
    };
    Ok(MessageEvent {
        message_id: Some(message_id.to_owned()),
        reply_to_message_id: msg
            .context
            .as_ref()
            .and_then(|c| c.id.clone())
            .filter(|id| !id.is_empty()),
        attachments,
        ..MessageEvent::text(source, text)
    })
}

/// A `wa_id` becomes the chat id, the user id and part of the session key:
/// only short ids of ASCII letters and digits are taken (phone numbers are
/// digits), which also pass the strict id validator.
fn usable_wa_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_WA_ID_LEN
        && id.chars().all(|c| c.is_ascii_alphanumeric())
        && talaria_core::ids::validate_path_component(id).is_ok()
}

/// The text the model sees and the attachments listed beside it.
fn describe(msg: &Inbound) -> (String, Vec<Attachment>) {
    let media = |kind: MediaKind, m: &Option<Media>| -> (String, Vec<Attachment>) {
        let Some(m) = m.as_ref() else {
            return (String::new(), Vec::new());
        };
        let caption = m.caption.clone().unwrap_or_default();
        let Some(id) = m.id.as_deref().filter(|id| !id.is_empty()) else {
            return (caption, Vec::new());
        };
        let attachment = Attachment::remote(kind, id)
            .named(m.filename.as_deref().filter(|f| !f.is_empty()))
            .claiming(m.mime_type.as_deref().filter(|t| !t.is_empty()));
        (caption, vec![attachment])
    };
    match msg.kind.as_str() {
        "text" => (
            msg.text
                .as_ref()
                .map(|t| t.body.clone())
                .unwrap_or_default(),
            Vec::new(),
        ),
        "image" => media(MediaKind::Image, &msg.image),
        "video" => media(MediaKind::Video, &msg.video),
        "sticker" => media(MediaKind::Image, &msg.sticker),
        "document" => media(MediaKind::Document, &msg.document),
        "audio" => {
            let voice = msg.audio.as_ref().and_then(|a| a.voice) == Some(true);
            let kind = if voice {
                MediaKind::Voice
            } else {
                MediaKind::Audio
            };
            media(kind, &msg.audio)
        }
        "location" => match &msg.location {
            Some(l) => (describe_location(l), Vec::new()),
            None => ("[a location]".to_owned(), Vec::new()),
        },
        "interactive" => {
            let choice = msg
                .interactive
                .as_ref()
                .and_then(|i| i.button_reply.as_ref().or(i.list_reply.as_ref()))
                .map(|c| c.title.clone())
                .unwrap_or_default();
            (choice, Vec::new())
        }
        "button" => (
            msg.button
                .as_ref()
                .map(|b| b.text.clone())
                .unwrap_or_default(),
            Vec::new(),
        ),
        "reaction" => match msg.reaction.as_ref().map(|r| r.emoji.as_str()) {
            // An empty emoji takes a reaction back: nothing to answer.
            Some("") | None => (String::new(), Vec::new()),
            Some(emoji) => (format!("[reacted {emoji} to a message]"), Vec::new()),
        },
        "contacts" => {
            let n = msg.contacts.as_ref().map_or(0, Vec::len);
            (format!("[{n} shared contact card(s)]"), Vec::new())
        }
        "unsupported" | "unknown" => (
            "[a message of a kind WhatsApp does not pass on to business accounts]".to_owned(),
            Vec::new(),
        ),
        other => {
            let kind = truncate(other, 40);
            (format!("[a WhatsApp {kind} message]"), Vec::new())
        }
    }
}

fn describe_location(l: &Location) -> String {
    let mut parts = Vec::new();
    if let (Some(lat), Some(lon)) = (l.latitude, l.longitude) {
        parts.push(format!("{lat}, {lon}"));
    }
    for extra in [&l.name, &l.address].into_iter().flatten() {
        if !extra.trim().is_empty() {
            parts.push(extra.trim().to_owned());
        }
    }
    if parts.is_empty() {
        "[a location]".to_owned()
    } else {
        format!("[location: {}]", parts.join("; "))
    }
}

/// A receipt with `status: failed`, else `None`.
fn failed_status(raw: &Value) -> Option<FailedStatus> {
    if raw.get("status").and_then(Value::as_str) != Some("failed") {
        return None;
    }
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let error = raw
        .get("errors")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
        .cloned()
        .unwrap_or(Value::Null);
    let details = error
        .get("error_data")
        .map(|d| text(d, "details"))
        .unwrap_or_default();
    let title = match text(&error, "title") {
        t if t.is_empty() => text(&error, "message"),
        t => t,
    };
    let reason = match (title.is_empty(), details.is_empty()) {
        (false, false) => format!("{title}: {details}"),
        (false, true) => title,
        (true, false) => details,
        (true, true) => "no reason given".to_owned(),
    };
    Some(FailedStatus {
        recipient: text(raw, "recipient_id"),
        message_id: text(raw, "id"),
        code: error.get("code").and_then(Value::as_i64),
        reason,
    })
}

fn truncate(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NUMBER: &str = "106540352242922";

    fn delivery(messages: Value, statuses: Value) -> Value {
        json!({"object": OBJECT, "entry": [{"id": "WABA", "changes": [{"field": "messages",
            "value": {"messaging_product": "whatsapp",
                "metadata": {"display_phone_number": "15550783881", "phone_number_id": NUMBER},
                "contacts": [{"profile": {"name": "Ada"}, "wa_id": "16505551234"}],
                "messages": messages, "statuses": statuses}}]}]})
    }

    fn one(message: Value) -> Result<MessageEvent, String> {
        let mut mapped = map_delivery(&delivery(json!([message]), json!([])), NUMBER).unwrap();
        match mapped.events.pop() {
            Some(e) => Ok(e),
            None => Err(mapped.skipped.join("; ")),
        }
    }

    fn msg(kind: &str, extra: Value) -> Value {
        let mut m = json!({"from": "16505551234", "id": "wamid.ABC=", "timestamp": "1700000000",
            "type": kind});
        if let (Some(m), Some(extra)) = (m.as_object_mut(), extra.as_object()) {
            m.extend(extra.clone());
        }
        m
    }

    #[test]
    fn a_text_message_is_a_dm_from_its_sender() {
        let ev = one(msg("text", json!({"text": {"body": "hello"}}))).unwrap();
        assert_eq!(ev.text, "hello");
        assert_eq!(ev.message_id.as_deref(), Some("wamid.ABC="));
        assert_eq!(ev.source.platform, "whatsapp_cloud");
        assert_eq!(ev.source.chat_id, "16505551234");
        assert_eq!(ev.source.user_id.as_deref(), Some("16505551234"));
        assert_eq!(ev.source.user_name.as_deref(), Some("Ada"));
        assert_eq!(ev.source.chat_type, ChatType::Dm);
        let quoted = one(msg(
            "text",
            json!({"text": {"body": "re"}, "context": {"from": "1555", "id": "wamid.Q"}}),
        ))
        .unwrap();
        assert_eq!(quoted.reply_to_message_id.as_deref(), Some("wamid.Q"));
    }

    #[test]
    fn other_kinds_are_described_and_attachments_listed() {
        let image = one(msg(
            "image",
            json!({"image": {"id": "1", "mime_type": "image/jpeg", "caption": "look"}}),
        ))
        .unwrap();
        assert_eq!(image.text, "look");
        assert_eq!(
            image.attachments,
            [Attachment::remote(MediaKind::Image, "1").claiming(Some("image/jpeg"))]
        );
        let doc = one(msg(
            "document",
            json!({"document": {"id": "2", "filename": "q3.pdf", "mime_type": "application/pdf"}}),
        ))
        .unwrap();
        assert_eq!(doc.text, "");
        assert_eq!(
            doc.attachments,
            [Attachment::remote(MediaKind::Document, "2")
                .named(Some("q3.pdf"))
                .claiming(Some("application/pdf"))]
        );
        let voice = one(msg(
            "audio",
            json!({"audio": {"id": "3", "mime_type": "audio/ogg; codecs=opus", "voice": true}}),
        ))
        .unwrap();
        assert_eq!(
            voice.attachments,
            [Attachment::remote(MediaKind::Voice, "3").claiming(Some("audio/ogg; codecs=opus"))]
        );
        let place = one(msg(
            "location",
            json!({"location": {"latitude": 52.5, "longitude": 13.4, "name": "Office"}}),
        ))
        .unwrap();
        assert_eq!(place.text, "[location: 52.5, 13.4; Office]");
        let button = one(msg(
            "interactive",
            json!({"interactive": {"type": "button_reply", "button_reply": {"id": "y", "title": "Yes"}}}),
        ))
        .unwrap();
        assert_eq!(button.text, "Yes");
        let list = one(msg(
            "interactive",
            json!({"interactive": {"type": "list_reply", "list_reply": {"id": "b", "title": "Blue", "description": "d"}}}),
        ))
        .unwrap();
        assert_eq!(list.text, "Blue");
        let quick = one(msg(
            "button",
            json!({"button": {"payload": "p", "text": "Stop promotions"}}),
        ))
        .unwrap();
        assert_eq!(quick.text, "Stop promotions");
        let reaction = one(msg(
            "reaction",
            json!({"reaction": {"message_id": "wamid.X", "emoji": "👍"}}),
        ))
        .unwrap();
        assert_eq!(reaction.text, "[reacted 👍 to a message]");
        assert!(
            one(msg(
                "reaction",
                json!({"reaction": {"message_id": "wamid.X"}})
            ))
            .is_err()
        );
        let odd = one(msg("order", json!({}))).unwrap();
        assert_eq!(odd.text, "[a WhatsApp order message]");
    }

    #[test]
    fn unusable_ids_are_skipped_not_hashed_into_keys() {
        for from in ["../etc", "1 2", "", "+1555", &"9".repeat(65)] {
            let mut m = msg("text", json!({"text": {"body": "x"}}));
            m["from"] = json!(from);
            assert!(one(m).is_err(), "{from:?}");
        }
        let mut m = msg("text", json!({"text": {"body": "x"}}));
        m["id"] = json!("wamid.\u{7}bell");
        assert!(one(m).is_err());
        // One bad message does not cost the others of its delivery.
        let good = msg("text", json!({"text": {"body": "kept"}}));
        let d = delivery(json!([{"from": 5}, good]), json!([]));
        let mapped = map_delivery(&d, NUMBER).unwrap();
        assert_eq!(mapped.events.len(), 1);
        assert_eq!(mapped.skipped.len(), 1);
    }

    #[test]
    fn other_numbers_and_other_objects_are_left_alone() {
        let d = delivery(
            json!([msg("text", json!({"text": {"body": "x"}}))]),
            json!([]),
        );
        let mapped = map_delivery(&d, "999").unwrap();
        assert!(mapped.events.is_empty());
        assert_eq!(mapped.other_numbers, 1);
        let page = json!({"object": "page", "entry": []});
        assert_eq!(
            map_delivery(&page, NUMBER).err(),
            Some(NotWhatsapp::Object("page".into()))
        );
        assert!(matches!(
            map_delivery(&json!({"object": OBJECT, "entry": 5}), NUMBER),
            Err(NotWhatsapp::Shape(_))
        ));
    }

    #[test]
    fn receipts_are_counted_and_failures_kept() {
        let statuses = json!([
            {"id": "wamid.S1", "status": "delivered", "timestamp": "1", "recipient_id": "16505551234"},
            {"id": "wamid.S2", "status": "failed", "timestamp": "2", "recipient_id": "16505551234",
             "errors": [{"code": 131047, "title": "Re-engagement message",
                         "message": "Re-engagement message",
                         "error_data": {"details": "Message failed to send because more than 24 hours have passed since the customer last replied to this number."}}]}
        ]);
        let mapped = map_delivery(&delivery(json!([]), statuses), NUMBER).unwrap();
        assert!(mapped.events.is_empty());
        assert_eq!(mapped.receipts, 1);
        assert_eq!(mapped.failures.len(), 1);
        let f = &mapped.failures[0];
        assert!(f.is_outside_window());
        assert_eq!(f.message_id, "wamid.S2");
        assert!(
            f.reason
                .starts_with("Re-engagement message: Message failed")
        );
    }
}
