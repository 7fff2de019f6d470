//! AI cards: with a card template configured, an answer streams into a
//! card while the model writes it.
//!
//! The gateway's streaming preview drives this through the adapter
//! contract: [`Adapter::start_preview`](talaria_adapter::Adapter::start_preview)
//! creates a card instance from the template (`POST /v1.0/card/instances`,
//! its data streamed, `callbackType: STREAM`), delivers it to the chat's
//! open space (`POST /v1.0/card/instances/deliver`: `IM_GROUP.<conversation
//! id>` for a group with the robot's code, `IM_ROBOT.<staff id>` for a 1:1
//! chat) and streams the first text into the template's `content`
//! variable (`PUT /v1.0/card/streaming`). Each edit streams the whole text
//! again (`isFull`); the answer itself, or what streamed before a turn
//! failed, is streamed once more with `isFinalize` (and `isError` after a
//! failure), which ends the card's "typing" state for good.
//!
//! The card's `outTrackId` is the preview's message id. Open cards are
//! remembered (bounded) so a card is finalized once; an id not open here
//! (finished, or from before a restart) is refused, and the gateway then
//! sends the answer as a message.

use std::collections::{HashMap, VecDeque};

use serde_json::{Value, json};
use talaria_adapter::{OutboundMessage, SendError, SentMessage};

use super::mapping::Route;
use super::{Attempt, DingTalkAdapter, format, lock};
use crate::http::HttpError;

/// Cards remembered between their first text and their last; the oldest
/// is forgotten past this (its answer then goes as a message).
const OPEN_CARDS: usize = 256;

/// The template variable answers stream into.
const CONTENT_KEY: &str = "content";

/// Cards streaming now, by `outTrackId`, with their chats.
#[derive(Debug, Default)]
pub(crate) struct OpenCards {
    chats: HashMap<String, String>,
    order: VecDeque<String>,
}

impl OpenCards {
    fn insert(&mut self, id: &str, chat_id: &str) {
        while self.order.len() >= OPEN_CARDS {
            if let Some(old) = self.order.pop_front() {
                self.chats.remove(&old);
            }
        }
        self.chats.insert(id.to_owned(), chat_id.to_owned());
        self.order.push_back(id.to_owned());
    }

    fn is_open(&self, id: &str, chat_id: &str) -> bool {
        self.chats.get(id).is_some_and(|c| c == chat_id)
    }

    fn close(&mut self, id: &str) {
        self.chats.remove(id);
        self.order.retain(|o| o != id);
    }
}

/// A fresh `outTrackId`: DingTalk needs it unique per card.
fn track_id() -> String {
    format!("talaria_{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff)
}

/// Where a card for `route` in `chat_id` is delivered, and the delivery
/// model that space needs.
fn space(route: &Route, chat_id: &str, robot_code: &str) -> (String, &'static str, Value) {
    match route {
        Route::Group => (
            format!("dtv1.card//IM_GROUP.{chat_id}"),
            "imGroupOpenDeliverModel",
            json!({ "robotCode": robot_code }),
        ),
        Route::Dm(staff) => (
            format!("dtv1.card//IM_ROBOT.{staff}"),
            "imRobotOpenDeliverModel",
            json!({ "spaceType": "IM_ROBOT", "robotCode": robot_code }),
        ),
    }
}

impl DingTalkAdapter {
    /// What a failed card call means for the gateway.
    fn card_failure(&self, e: HttpError) -> SendError {
        match self.read_failure(e, false) {
            Attempt::TooFast(wait) => SendError::RateLimited(wait),
            Attempt::WebhookDead(why) => SendError::Rejected(why),
            Attempt::Failed(e) => e,
        }
    }

    /// Creates and delivers a card for `message`'s chat and streams its
    /// text in; the card's `outTrackId`.
    pub(super) async fn open_card(
        &self,
        template: &str,
        message: &OutboundMessage,
    ) -> Result<SentMessage, SendError> {
        let chat_id = message.chat_id.as_str();
        let Some(route) = self.route(chat_id).await else {
            return Err(self.unreachable(chat_id));
        };
        let id = track_id();
        let create = json!({
            "cardTemplateId": template,
            "outTrackId": id,
            "callbackType": "STREAM",
            "cardData": { "cardParamMap": { "content": "" } },
            "imGroupOpenSpaceModel": { "supportForward": true },
            "imRobotOpenSpaceModel": { "supportForward": true },
        });
        self.api
            .call("card/instances", &create)
            .await
            .map_err(|e| self.card_failure(e))?;
        let (open_space_id, model, deliver_model) =
            space(&route, chat_id, &self.settings.robot_code);
        let mut deliver = json!({ "outTrackId": id, "openSpaceId": open_space_id });
        deliver[model] = deliver_model;
        self.api
            .call("card/instances/deliver", &deliver)
            .await
            .map_err(|e| self.card_failure(e))?;
        lock(&self.cards).insert(&id, chat_id);
        self.stream(&id, &message.text, false, false).await?;
        Ok(SentMessage {
            message_id: Some(id),
        })
    }

    /// Streams `text` as the whole of card `id`'s content, while it is
    /// open; `last` finalizes it (marked an error when `failed`).
    pub(super) async fn stream_card(
        &self,
        chat_id: &str,
        id: &str,
        text: &str,
        last: bool,
        failed: bool,
    ) -> Result<(), SendError> {
        if !lock(&self.cards).is_open(id, chat_id) {
            return Err(SendError::Rejected(format!(
                "DingTalk card {id} is not streaming (finished, or from before a restart)"
            )));
        }
        let streamed = self.stream(id, text, last, failed).await;
        if last {
            // Finalized, or failed to be: either way it is not streamed
            // to again, and the gateway sends the answer anew on an error.
            lock(&self.cards).close(id);
        }
        streamed
    }

    async fn stream(
        &self,
        id: &str,
        text: &str,
        finalize: bool,
        error: bool,
    ) -> Result<(), SendError> {
        let body = json!({
            "outTrackId": id,
            "guid": format!("{:032x}", rand::random::<u128>()),
            "key": CONTENT_KEY,
            "content": format::to_markdown(text),
            "isFull": true,
            "isFinalize": finalize,
            "isError": error,
        });
        self.api
            .call_with(reqwest::Method::PUT, "card/streaming", &body)
            .await
            .map(|_| ())
            .map_err(|e| self.card_failure(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_cards_are_bounded_and_closed_once() {
        let mut cards = OpenCards::default();
        for n in 0..OPEN_CARDS + 5 {
            cards.insert(&format!("c{n}"), "cid");
        }
        assert_eq!(cards.chats.len(), OPEN_CARDS);
        assert!(!cards.is_open("c0", "cid"));
        let last = format!("c{}", OPEN_CARDS + 4);
        assert!(cards.is_open(&last, "cid"));
        assert!(!cards.is_open(&last, "another chat"));
        cards.close(&last);
        assert!(!cards.is_open(&last, "cid"));
        assert_eq!(cards.order.len(), OPEN_CARDS - 1);
        let id = track_id();
        assert!(id.starts_with("talaria_") && id.len() == 20, "{id}");
    }

    #[test]
    fn cards_go_to_the_group_or_the_users_robot_chat() {
        let (group, model, _) = space(&Route::Group, "cidG1", "robot1");
        assert_eq!(group, "dtv1.card//IM_GROUP.cidG1");
        assert_eq!(model, "imGroupOpenDeliverModel");
        let (dm, model, body) = space(&Route::Dm("staff9".into()), "cidDM", "robot1");
        assert_eq!(dm, "dtv1.card//IM_ROBOT.staff9");
        assert_eq!(model, "imRobotOpenDeliverModel");
        assert_eq!(body["spaceType"], "IM_ROBOT");
    }
}
