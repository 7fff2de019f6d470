//! Interactive cards (`msg_type: "interactive"`, card JSON 1.0): streamed
//! answers and messages that offer choices as buttons.
//!
//! A streamed answer is a card created once (as a reply, in the thread,
//! with a `uuid`, like any send) whose one `markdown` element holds the
//! text so far; each edit replaces the whole card with `PATCH
//! /open-apis/im/v1/messages/:message_id`, and the last one holds the
//! answer, or what streamed before a failed turn with a note saying so.
//! Feishu edits text messages too (`PUT`), but at most 20 times each,
//! too few for a growing answer; a card may be patched any number of
//! times, at most 5 times a second (see the docs of "更新应用发送的消息
//! 卡片"), which the gateway's edit interval keeps well under. Every card
//! says `"update_multi": true`: Feishu patches only shared cards, and only
//! when both the card sent and its replacement say so.
//!
//! A message with choices is a card whose buttons carry their command in
//! their `value`; the click comes back as `card.action.trigger` (see the
//! `callback` module), which finds the card here.
//!
//! The cards sent are remembered (bounded): `edit` patches only a card
//! this adapter opened for a preview and refuses anything else (a text
//! message cannot be patched), and a click counts only on a card sent
//! with that choice.

use std::collections::{HashMap, VecDeque};

use reqwest::Method;
use serde_json::{Value, json};
use talaria_adapter::{ChatType, Choice, OutboundMessage, SendError, SentMessage};

use super::{Destination, FeishuAdapter, format, idempotency_key};

/// Feishu refuses a card whose request body is larger than this (create,
/// reply and PATCH alike: "卡片及富文本消息请求体最大不能超过30KB").
pub(crate) const MAX_CARD_REQUEST_BYTES: usize = 30 * 1024;

/// What a request holds besides the card's (escaped) JSON: the other
/// fields of a create or reply (`receive_id`, `msg_type`, `uuid`,
/// `reply_in_thread`) come to well under this.
const REQUEST_OVERHEAD: usize = 512;

/// Ends a text cut to fit one card, so the cut is never silent.
const CUT_NOTE: &str = "\n\n… *(cut here: the rest does not fit in one card)*";

/// The note under the text of an answer that did not finish.
const FAILED_NOTE: &str = "⚠️ This answer did not finish.";

/// Cards remembered for edits and clicks; the oldest is forgotten past
/// this (its preview then stops growing, its buttons stop working).
const REMEMBERED_CARDS: usize = 512;

/// The key of a button's `value` that holds its command.
pub(crate) const COMMAND_KEY: &str = "talaria_command";

/// The card JSON (as the string Feishu wants in `content`) showing `text`
/// as Markdown, marked unfinished when `failed`, with a button per choice.
/// Text that would make the request too large is cut, with a note.
pub(crate) fn render(text: &str, failed: bool, choices: &[Choice]) -> String {
    let body = format::markdown(text);
    let whole = card(&body, failed, choices).to_string();
    if fits(&whole) {
        return whole;
    }
    // The longest prefix (in whole characters) that fits with the note:
    // found by bisection, each step one render, so a long text costs a
    // handful of renders, never one per character.
    let ends: Vec<usize> = body.char_indices().map(|(i, _)| i).collect();
    let cut = |n: usize| -> String {
        let end = ends.get(n).copied().unwrap_or(body.len());
        card(&format!("{}{CUT_NOTE}", &body[..end]), failed, choices).to_string()
    };
    let (mut fitting, mut too_long) = (0, ends.len());
    while fitting + 1 < too_long {
        let mid = fitting + (too_long - fitting) / 2;
        if fits(&cut(mid)) {
            fitting = mid;
        } else {
            too_long = mid;
        }
    }
    cut(fitting)
}

/// Whether a request carrying `card` stays within Feishu's limit. The card
/// travels as a JSON string inside the JSON body, so it is measured
/// escaped.
fn fits(card: &str) -> bool {
    serde_json::to_string(card)
        .is_ok_and(|escaped| escaped.len() + REQUEST_OVERHEAD <= MAX_CARD_REQUEST_BYTES)
}

fn card(markdown: &str, failed: bool, choices: &[Choice]) -> Value {
    // An empty markdown element is refused; a preview always has text,
    // but a choice card's question might not.
    let content = if markdown.trim().is_empty() {
        " "
    } else {
        markdown
    };
    let mut elements = vec![json!({"tag": "markdown", "content": content})];
    if failed {
        elements.push(json!({
            "tag": "note",
            "elements": [{"tag": "plain_text", "content": FAILED_NOTE}],
        }));
    }
    if !choices.is_empty() {
        let buttons: Vec<Value> = choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                json!({
                    "tag": "button",
                    "text": {"tag": "plain_text", "content": c.label},
                    "type": if i == 0 { "primary" } else { "default" },
                    "value": { COMMAND_KEY: c.command },
                })
            })
            .collect();
        elements.push(json!({"tag": "action", "actions": buttons}));
    }
    json!({
        "config": {"update_multi": true, "wide_screen_mode": true},
        "elements": elements,
    })
}

/// What is remembered of a card sent, by its message id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SentCard {
    /// The chat it is in.
    pub chat_id: String,
    /// The topic thread it is in (the conversation a click continues).
    pub thread_id: Option<String>,
    /// The kind of chat, as its messages said (a click's session is the
    /// same conversation as the question's).
    pub chat_type: ChatType,
    /// A streaming preview still growing: edits patch it.
    pub streaming: bool,
    /// The commands its buttons send.
    pub commands: Vec<String>,
}

/// The cards sent, bounded to the most recent [`REMEMBERED_CARDS`].
#[derive(Debug, Default)]
pub(crate) struct Cards {
    by_id: HashMap<String, SentCard>,
    order: VecDeque<String>,
}

impl Cards {
    pub(crate) fn insert(&mut self, message_id: &str, card: SentCard) {
        if self.by_id.insert(message_id.to_owned(), card).is_some() {
            self.order.retain(|o| o != message_id);
        }
        self.order.push_back(message_id.to_owned());
        while self.order.len() > REMEMBERED_CARDS {
            if let Some(old) = self.order.pop_front() {
                self.by_id.remove(&old);
            }
        }
    }

    pub(crate) fn get(&self, message_id: &str) -> Option<&SentCard> {
        self.by_id.get(message_id)
    }

    /// Whether `message_id` is a preview card in `chat_id` still growing.
    pub(crate) fn is_streaming(&self, message_id: &str, chat_id: &str) -> bool {
        self.by_id
            .get(message_id)
            .is_some_and(|c| c.streaming && c.chat_id == chat_id)
    }

    /// The preview is finished: later edits are refused. A card without
    /// buttons is forgotten at once.
    pub(crate) fn finish(&mut self, message_id: &str) {
        let keep = match self.by_id.get_mut(message_id) {
            Some(card) => {
                card.streaming = false;
                !card.commands.is_empty()
            }
            None => return,
        };
        if !keep {
            self.by_id.remove(message_id);
            self.order.retain(|o| o != message_id);
        }
    }
}

impl FeishuAdapter {
    /// Sends `message` as a card (as a reply, in its thread, with a
    /// `uuid`, as any send), remembered for the edits of a `streaming`
    /// preview and for clicks on its buttons.
    pub(super) async fn send_card(
        &self,
        message: &OutboundMessage,
        streaming: bool,
    ) -> Result<SentMessage, SendError> {
        let content = render(&message.text, false, &message.choices);
        let uuid = idempotency_key(message, if streaming { "preview" } else { "card" });
        let to = Destination {
            chat_id: &message.chat_id,
            thread_id: message.thread_id.as_deref(),
            reply_to: message.reply_to.as_deref(),
        };
        // Until the card is remembered, a click on it waits (see
        // `server::dispatch_click`).
        let _sending = self.hook.card_sends.read().await;
        let sent = self
            .post(&to, "interactive", &content, &uuid)
            .await
            .map_err(|e| self.classify(&e))?;
        if let Some(id) = sent.message_id.as_deref() {
            // Choices are asked during a turn, after a message from the
            // chat said what it is; failing that it counts as a group,
            // where a stranger's click is never offered a pairing code.
            let chat_type = self
                .hook
                .chat_type(&message.chat_id)
                .unwrap_or(ChatType::Group);
            let card = SentCard {
                chat_id: message.chat_id.clone(),
                thread_id: message.thread_id.clone(),
                chat_type,
                streaming,
                commands: message.choices.iter().map(|c| c.command.clone()).collect(),
            };
            self.cards().insert(id, card);
        }
        Ok(sent)
    }

    /// Replaces a streaming card with `text` (`PATCH`); `last` ends its
    /// preview, marked unfinished when `failed`. Anything but a streaming
    /// card of this chat is refused without a call.
    pub(super) async fn patch_card(
        &self,
        chat_id: &str,
        message_id: &str,
        text: &str,
        failed: bool,
        last: bool,
    ) -> Result<(), SendError> {
        if !self.cards().is_streaming(message_id, chat_id) {
            return Err(SendError::Rejected(format!(
                "Feishu message {message_id} is not a card this adapter is streaming into"
            )));
        }
        let body = json!({ "content": render(text, failed, &[]) });
        let path = format!("/open-apis/im/v1/messages/{message_id}");
        let patched = self
            .call_with_retries(Method::PATCH, &path, &[], &body)
            .await
            .map(|_| ())
            .map_err(|e| self.classify(&e));
        if last {
            // Patched or not, it is not patched again: after a failure the
            // gateway sends the answer as a message of its own.
            self.cards().finish(message_id);
        }
        patched
    }

    fn cards(&self) -> std::sync::MutexGuard<'_, Cards> {
        self.hook.cards.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(card: &str) -> Value {
        serde_json::from_str(card).unwrap()
    }

    #[test]
    fn a_card_is_shared_markdown_with_a_note_when_failed_and_buttons_for_choices() {
        let c = parse(&render("# Done\nall **good**", false, &[]));
        assert_eq!(c["config"]["update_multi"], true);
        assert_eq!(c["elements"].as_array().unwrap().len(), 1);
        assert_eq!(c["elements"][0]["tag"], "markdown");
        assert_eq!(c["elements"][0]["content"], "**Done**\nall **good**");

        let c = parse(&render("half of it", true, &[]));
        assert_eq!(c["elements"][1]["tag"], "note");
        assert_eq!(c["elements"][1]["elements"][0]["content"], FAILED_NOTE);

        let choices = [Choice::new("Yes", "/approve"), Choice::new("No", "/deny")];
        let c = parse(&render("Run it?", false, &choices));
        let buttons = c["elements"][1]["actions"].as_array().unwrap();
        assert_eq!(buttons.len(), 2);
        assert_eq!(buttons[0]["text"]["content"], "Yes");
        assert_eq!(buttons[0]["type"], "primary");
        assert_eq!(buttons[1]["value"][COMMAND_KEY], "/deny");
    }

    #[test]
    fn too_long_a_text_is_cut_with_a_note_to_fit_the_request_limit() {
        // Quotes double when the card is escaped into the request.
        let text = "\"quoted\" 汉字 ".repeat(4000);
        let card = render(&text, true, &[Choice::new("Ok", "/ok")]);
        assert!(fits(&card));
        let c = parse(&card);
        let shown = c["elements"][0]["content"].as_str().unwrap();
        assert!(shown.ends_with(CUT_NOTE), "the cut is marked");
        assert!(text.starts_with(shown.trim_end_matches(CUT_NOTE)));
        // Close to the limit, not cut far shorter than needed.
        let escaped = serde_json::to_string(&card).unwrap().len();
        assert!(escaped + REQUEST_OVERHEAD > MAX_CARD_REQUEST_BYTES - 64);
        assert_eq!(c["elements"][1]["tag"], "note", "the marks survive");
        assert_eq!(c["elements"][2]["actions"][0]["value"][COMMAND_KEY], "/ok");
        // A text that fits is never cut.
        let short = parse(&render("short", false, &[]));
        assert_eq!(short["elements"][0]["content"], "short");
    }

    #[test]
    fn cards_are_bounded_and_a_finished_preview_takes_no_edits() {
        let sent = |streaming: bool, commands: &[&str]| SentCard {
            chat_id: "oc_1".into(),
            thread_id: None,
            chat_type: ChatType::Dm,
            streaming,
            commands: commands.iter().map(|c| (*c).to_owned()).collect(),
        };
        let mut cards = Cards::default();
        for n in 0..REMEMBERED_CARDS + 3 {
            cards.insert(&format!("om_{n}"), sent(true, &[]));
        }
        assert_eq!(cards.by_id.len(), REMEMBERED_CARDS);
        assert_eq!(cards.order.len(), REMEMBERED_CARDS);
        assert!(cards.get("om_0").is_none());
        let last = format!("om_{}", REMEMBERED_CARDS + 2);
        assert!(cards.is_streaming(&last, "oc_1"));
        assert!(!cards.is_streaming(&last, "oc_other"));
        cards.finish(&last);
        assert!(!cards.is_streaming(&last, "oc_1"));
        assert!(cards.get(&last).is_none(), "nothing left to click");
        cards.insert("om_q", sent(false, &["/approve"]));
        cards.finish("om_q");
        assert_eq!(cards.get("om_q").unwrap().commands, ["/approve"]);
    }
}
