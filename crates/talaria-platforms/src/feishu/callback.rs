//! `card.action.trigger`: a click on a card's button. Feishu delivers it
//! like an event (envelope schema 2.0, the same signature, encryption and
//! verification token over the webhook; a data frame over the long
//! connection) and shows the clicker what the answer says (a toast),
//! which it must get within 3 seconds.
//!
//! ```text
//! {"schema": "2.0",
//!  "header": {"event_id", "event_type": "card.action.trigger", "token", …},
//!  "event": {"operator": {"open_id", …}, "token": "c-…",
//!            "action": {"tag": "button", "value": {…}},
//!            "context": {"open_message_id", "open_chat_id"}}}
//! ```
//!
//! A click on a button of a card this adapter sent with choices becomes an
//! ordinary message: the button's command as its text, from the clicker's
//! open_id, in the card's chat and thread (the conversation that asked),
//! so authorization and a waiting approval apply as to the typed command.
//! Its message id is made from the click's event id, which the runner
//! deduplicates like any message id; the adapter drops a click it has seen
//! already before that. A click on a card the adapter does not know
//! (forgotten, or from before a restart), or a command the card did not
//! offer, is answered with a toast and goes no further.

use serde_json::{Value, json};
use talaria_adapter::{MessageEvent, SessionSource};

use super::PLATFORM;
use super::card::{COMMAND_KEY, SentCard};

/// The callback's event type.
pub(crate) const EVENT_TYPE: &str = "card.action.trigger";

/// Whether `envelope` is a card callback.
pub(crate) fn is_card_action(envelope: &Value) -> bool {
    envelope
        .pointer("/header/event_type")
        .and_then(Value::as_str)
        == Some(EVENT_TYPE)
}

/// One click, as far as it matters here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Click {
    /// What a re-delivery of the same click repeats: the event id (or,
    /// without one, the callback's card token).
    pub key: String,
    /// Who clicked.
    pub operator: String,
    /// The card's message.
    pub message_id: String,
    /// The chat Feishu says the card is in.
    pub chat_id: Option<String>,
    /// The command the button carried.
    pub command: Option<String>,
}

fn text_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

impl Click {
    /// Reads a click; `Err` names what it lacks.
    pub(crate) fn parse(envelope: &Value) -> Result<Click, &'static str> {
        let key = text_at(envelope, "/header/event_id")
            .or_else(|| text_at(envelope, "/event/token"))
            .ok_or("a card callback without an event id or token")?;
        let operator = text_at(envelope, "/event/operator/open_id")
            .ok_or("a card callback without the clicker's open_id")?;
        let message_id = text_at(envelope, "/event/context/open_message_id")
            .ok_or("a card callback without the card's message id")?;
        // A button's value is an object or, in older cards, a JSON string
        // holding one.
        let value = envelope.pointer("/event/action/value");
        let command = match value {
            Some(Value::String(s)) => serde_json::from_str::<Value>(s).ok().and_then(|v| {
                v.get(COMMAND_KEY)
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            }),
            Some(v) => v
                .get(COMMAND_KEY)
                .and_then(Value::as_str)
                .map(str::to_owned),
            None => None,
        };
        Ok(Click {
            key: format!("card:{key}"),
            operator: operator.to_owned(),
            message_id: message_id.to_owned(),
            chat_id: text_at(envelope, "/event/context/open_chat_id").map(str::to_owned),
            command,
        })
    }

    /// The message the click stands for, or the toast that answers it
    /// instead.
    pub(crate) fn to_event(
        &self,
        card: Option<&SentCard>,
        bot_open_id: Option<&str>,
    ) -> Result<MessageEvent, &'static str> {
        let Some(card) = card else {
            return Err("This button no longer works here; type the command instead.");
        };
        if bot_open_id == Some(self.operator.as_str()) {
            return Err("The bot's own click is ignored.");
        }
        if self.chat_id.as_deref().is_some_and(|c| c != card.chat_id) {
            return Err("This card belongs to another chat.");
        }
        let Some(command) = self
            .command
            .as_deref()
            .filter(|c| card.commands.iter().any(|o| o == c))
        else {
            return Err("This button does nothing.");
        };
        let source = SessionSource {
            platform: PLATFORM.to_owned(),
            chat_id: card.chat_id.clone(),
            chat_name: None,
            chat_type: card.chat_type,
            user_id: Some(self.operator.clone()),
            user_name: None,
            thread_id: card.thread_id.clone(),
            is_bot: false,
        };
        let mut event = MessageEvent::text(source, command);
        // Not the card's id: the answer to the command is its own message,
        // and two clicks on one card are two messages.
        event.message_id = Some(self.key.replace(':', "_"));
        Ok(event)
    }
}

/// The callback's answer: a toast of `kind` (`success`, `info`, `warning`,
/// `error`) saying `text`.
pub(crate) fn toast(kind: &str, text: &str) -> Value {
    json!({"toast": {"type": kind, "content": text}})
}

/// The callback's answer that shows nothing.
pub(crate) fn silent() -> Value {
    json!({})
}

#[cfg(test)]
mod tests {
    use super::*;
    use talaria_adapter::ChatType;

    fn click(value: Value) -> Value {
        json!({
            "schema": "2.0",
            "header": {"event_id": "ev_9", "event_type": EVENT_TYPE, "token": "vt"},
            "event": {
                "operator": {"open_id": "ou_ada", "user_id": "u1"},
                "token": "c-123",
                "action": {"tag": "button", "value": value},
                "host": "im_message",
                "context": {"open_message_id": "om_card", "open_chat_id": "oc_1"},
            }
        })
    }

    fn card(commands: &[&str]) -> SentCard {
        SentCard {
            chat_id: "oc_1".into(),
            thread_id: Some("omt_1".into()),
            chat_type: ChatType::Group,
            streaming: false,
            commands: commands.iter().map(|c| (*c).to_owned()).collect(),
        }
    }

    #[test]
    fn a_click_becomes_the_command_from_the_clicker_in_the_cards_conversation() {
        let envelope = click(json!({COMMAND_KEY: "/approve session"}));
        assert!(is_card_action(&envelope));
        let c = Click::parse(&envelope).unwrap();
        assert_eq!(c.key, "card:ev_9");
        assert_eq!(c.message_id, "om_card");
        let e = c
            .to_event(
                Some(&card(&["/approve", "/approve session"])),
                Some("ou_bot"),
            )
            .unwrap();
        assert_eq!(e.text, "/approve session");
        assert_eq!(e.source.user_id.as_deref(), Some("ou_ada"));
        assert_eq!(e.source.chat_id, "oc_1");
        assert_eq!(e.source.thread_id.as_deref(), Some("omt_1"));
        assert_eq!(e.source.chat_type, ChatType::Group);
        assert_eq!(e.message_id.as_deref(), Some("card_ev_9"));
        // A value given as a JSON string reads the same.
        let s = click(json!(json!({COMMAND_KEY: "/approve"}).to_string()));
        assert_eq!(
            Click::parse(&s).unwrap().command.as_deref(),
            Some("/approve")
        );
    }

    #[test]
    fn clicks_the_card_did_not_offer_go_nowhere() {
        let offered = card(&["/approve"]);
        let other = Click::parse(&click(json!({COMMAND_KEY: "/reset"}))).unwrap();
        assert!(other.to_event(Some(&offered), None).is_err());
        let no_value = Click::parse(&click(json!({"something": "else"}))).unwrap();
        assert!(no_value.to_event(Some(&offered), None).is_err());
        let fine = Click::parse(&click(json!({COMMAND_KEY: "/approve"}))).unwrap();
        assert!(fine.to_event(None, None).is_err(), "an unknown card");
        assert!(
            fine.to_event(Some(&offered), Some("ou_ada")).is_err(),
            "the bot"
        );
        let mut elsewhere = fine.clone();
        elsewhere.chat_id = Some("oc_2".into());
        assert!(elsewhere.to_event(Some(&offered), None).is_err());
        let mut bare = click(json!({COMMAND_KEY: "/approve"}));
        bare["event"]["operator"] = json!({});
        assert!(Click::parse(&bare).is_err());
    }
}
