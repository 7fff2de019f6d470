//! The event subscription's route on the shared listener.
//!
//! `POST {webhook_path}` runs these steps in order, each answering on its
//! own when it refuses:
//!
//! 1. body over `max_body_bytes` → 413; not JSON → 400
//! 2. encrypt key configured and `X-Lark-Signature` present: wrong, or its
//!    timestamp outside the allowed skew (a replay) → 401, checked on the
//!    raw body before anything is decrypted or parsed
//! 3. `{"encrypt": …}` without an encrypt key configured, or one that does
//!    not decrypt → 400
//! 4. verification token configured and not the one the event carries
//!    (constant-time) → 401
//! 5. `url_verification` → 200 `{"challenge": …}` (the console's check
//!    when the request URL is saved; plain or encrypted, may be unsigned)
//! 6. encrypt key configured and the event unsigned → 401
//! 7. an `event_id` seen before → 200, ignored (Feishu re-delivers)
//! 8. a chat message handed to the inbox → 200; no inbox or a full one →
//!    503, and Feishu delivers it again. A comment is read and handed on in
//!    the background (its reads may take longer than Feishu waits).
//!
//! A card callback (`card.action.trigger`, see the `callback` module) goes
//! through steps 1 to 6 like an event; then a click seen before gets 200
//! with an empty answer, and any other 200 with the toast the clicker
//! sees (503 when the gateway did not take it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use talaria_adapter::{Admission, ChatType, Inbox};
use talaria_core::Secret;

use super::api::Api;
use super::callback::{self, Click};
use super::card::Cards;
use super::comments;
use super::crypto;
use super::mapping::{self, Inbound};
use crate::ingress::{InboxSlot, json_refusal, read_body};

/// How long one delivery may wait for a saturated inbox before it is
/// answered 503 (Feishu waits about 3 s).
const SUBMIT_TIMEOUT: Duration = Duration::from_secs(2);

/// Chats whose last inbound message is remembered for the typing reaction.
const MAX_REMEMBERED_CHATS: usize = 10_000;

/// How long a click on a card not known yet waits for the cards being
/// sent: Feishu may show a card (and take its click) before the answer to
/// its send arrives here with its id.
const CARD_SEND_WAIT: Duration = Duration::from_millis(800);

/// What the handler and the adapter share.
pub(crate) struct Hook {
    pub path: String,
    pub encrypt_key: Option<Secret>,
    /// SHA-256 of the verification token, compared in constant time.
    pub token_digest: Option<[u8; 32]>,
    pub max_skew: u64,
    pub max_body_bytes: usize,
    pub require_mention: bool,
    pub bot_open_id: RwLock<Option<String>>,
    pub slot: InboxSlot,
    pub api: Arc<Api>,
    pub seen_events: Mutex<crate::seen::Seen>,
    /// chat id → its last inbound message id (and its typing reaction).
    pub last_inbound: Mutex<HashMap<String, (String, Option<String>)>>,
    /// Document chat → the comment its last turn came from, for the
    /// parts of an answer after the first.
    pub last_comment: Mutex<HashMap<String, String>>,
    /// chat id → the kind of chat its messages said it is, for clicks on
    /// cards sent there.
    pub chat_types: Mutex<HashMap<String, ChatType>>,
    /// The cards sent: previews being patched, buttons being clicked.
    pub cards: Mutex<Cards>,
    /// Held shared while a card is sent and until it is remembered; a
    /// click on an unknown card takes it whole, so it waits those out.
    pub card_sends: tokio::sync::RwLock<()>,
}

impl Hook {
    pub(crate) fn bot(&self) -> Option<String> {
        self.bot_open_id
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn remember(&self, chat_id: &str, message_id: &str, chat_type: ChatType) {
        {
            let mut map = self.last_inbound.lock().unwrap_or_else(|p| p.into_inner());
            if map.len() >= MAX_REMEMBERED_CHATS && !map.contains_key(chat_id) {
                map.clear();
            }
            map.insert(chat_id.to_owned(), (message_id.to_owned(), None));
        }
        let mut types = self.chat_types.lock().unwrap_or_else(|p| p.into_inner());
        if types.len() >= MAX_REMEMBERED_CHATS && !types.contains_key(chat_id) {
            types.clear();
        }
        types.insert(chat_id.to_owned(), chat_type);
    }

    /// The kind of chat `chat_id` is, as its messages said; a chat known
    /// only by a user's open id is that user's DM.
    pub(crate) fn chat_type(&self, chat_id: &str) -> Option<ChatType> {
        let known = self
            .chat_types
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(chat_id)
            .copied();
        known.or_else(|| chat_id.starts_with("ou_").then_some(ChatType::Dm))
    }

    pub(crate) fn last_comment(&self, chat_id: &str) -> Option<String> {
        self.last_comment
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(chat_id)
            .cloned()
    }

    fn remember_comment(&self, chat_id: &str, comment_id: &str) {
        let mut map = self.last_comment.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_REMEMBERED_CHATS && !map.contains_key(chat_id) {
            map.clear();
        }
        map.insert(chat_id.to_owned(), comment_id.to_owned());
    }

    fn first_event(&self, id: &str) -> bool {
        self.seen_events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .first(id)
    }
}

pub(crate) fn router(hook: Arc<Hook>) -> Router {
    Router::new()
        .route(&hook.path.clone(), post(receive))
        .with_state(hook)
}

fn ok() -> Response {
    (StatusCode::OK, axum::Json(json!({"code": 0, "msg": "ok"}))).into_response()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

async fn receive(State(hook): State<Arc<Hook>>, headers: HeaderMap, body: Body) -> Response {
    let raw = match read_body(body, &headers, hook.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => {
            tracing::info!("Feishu webhook body refused: {e}");
            return json_refusal(e.status(), &e.to_string());
        }
    };
    // With an encrypt key Feishu signs its requests: a signed one is
    // checked on the raw body before anything in it is read. Only the
    // console's URL check may come unsigned (it proves itself by
    // decrypting and by its token).
    let signed = header(&headers, "x-lark-signature").is_some();
    if let Some(key) = hook.encrypt_key.as_ref()
        && signed
    {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if let Err(why) = crypto::check_signature(
            key.expose(),
            header(&headers, "x-lark-request-timestamp"),
            header(&headers, "x-lark-request-nonce"),
            header(&headers, "x-lark-signature"),
            &raw,
            now,
            hook.max_skew,
        ) {
            tracing::info!(reason = why.as_str(), "Feishu webhook delivery refused");
            return json_refusal(StatusCode::UNAUTHORIZED, "missing or invalid signature");
        }
    }
    let outer: Value = match serde_json::from_slice(&raw) {
        Ok(v) => v,
        Err(_) => return json_refusal(StatusCode::BAD_REQUEST, "the body is not valid JSON"),
    };
    let envelope = match outer.get("encrypt").and_then(Value::as_str) {
        Some(blob) => {
            let Some(key) = hook.encrypt_key.as_ref() else {
                tracing::warn!(
                    "an encrypted Feishu event arrived but no encrypt key is configured \
                     (FEISHU_ENCRYPT_KEY)"
                );
                return json_refusal(StatusCode::BAD_REQUEST, "cannot decrypt the body");
            };
            match crypto::decrypt(key.expose(), blob)
                .ok()
                .and_then(|plain| serde_json::from_slice::<Value>(&plain).ok())
            {
                Some(v) => v,
                None => {
                    tracing::info!("a Feishu event that does not decrypt with the encrypt key");
                    return json_refusal(StatusCode::BAD_REQUEST, "cannot decrypt the body");
                }
            }
        }
        None => outer,
    };
    if let Some(expected) = hook.token_digest.as_ref() {
        let presented = mapping::token(&envelope).unwrap_or("");
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        if !talaria_core::constant_time_eq(&digest, expected) {
            tracing::info!("a Feishu event with a wrong verification token refused");
            return json_refusal(StatusCode::UNAUTHORIZED, "invalid verification token");
        }
    }
    if envelope.get("type").and_then(Value::as_str) == Some("url_verification") {
        let challenge = envelope
            .get("challenge")
            .and_then(Value::as_str)
            .unwrap_or("");
        if challenge.is_empty() || challenge.len() > 512 {
            return json_refusal(StatusCode::BAD_REQUEST, "missing or oversized challenge");
        }
        tracing::info!("Feishu verified the webhook URL");
        return (
            StatusCode::OK,
            axum::Json(json!({ "challenge": challenge })),
        )
            .into_response();
    }
    if hook.encrypt_key.is_some() && !signed {
        tracing::info!("an unsigned Feishu event refused (an encrypt key is configured)");
        return json_refusal(StatusCode::UNAUTHORIZED, "missing or invalid signature");
    }
    let Some(inbox) = hook.slot.inbox() else {
        return json_refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway is not taking deliveries right now; retry later",
        );
    };
    if callback::is_card_action(&envelope) {
        return match dispatch_click(&hook, &envelope, &inbox).await {
            (Dispatched::Taken, answer) => (StatusCode::OK, axum::Json(answer)).into_response(),
            (Dispatched::NotTaken, _) => json_refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "the gateway is not taking deliveries right now; retry later",
            ),
        };
    }
    match dispatch(&hook, &envelope, &inbox).await {
        Dispatched::Taken => ok(),
        Dispatched::NotTaken => json_refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway is not taking deliveries right now; retry later",
        ),
    }
}

/// What became of one authentic event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dispatched {
    /// Handed on, ignored, or seen before: Feishu may forget it.
    Taken,
    /// The gateway did not take it: Feishu must deliver it again.
    NotTaken,
}

/// Steps 7 and 8 (see the module docs), shared by the webhook and the
/// long connection: dedupe on `event_id`, map, hand on.
pub(crate) async fn dispatch(hook: &Arc<Hook>, envelope: &Value, inbox: &Inbox) -> Dispatched {
    let Some(event_id) = mapping::event_id(envelope).map(str::to_owned) else {
        tracing::info!("a Feishu event without an event id; ignored");
        return Dispatched::Taken;
    };
    if !hook.first_event(&event_id) {
        tracing::debug!(%event_id, "a Feishu event delivered again; ignored");
        return Dispatched::Taken;
    }
    let bot = hook.bot();
    match mapping::map_event(envelope, bot.as_deref(), hook.require_mention) {
        Inbound::Ignored(why) => {
            tracing::debug!(%event_id, reason = %why, "Feishu event ignored");
            Dispatched::Taken
        }
        Inbound::Message(event) => {
            if let Some(id) = event.message_id.as_deref() {
                hook.remember(&event.source.chat_id, id, event.source.chat_type);
            }
            let handed = matches!(
                tokio::time::timeout(SUBMIT_TIMEOUT, inbox.submit(*event)).await,
                Ok(Ok(()))
            );
            if handed {
                Dispatched::Taken
            } else {
                // Forget it, so Feishu's next delivery of it is taken.
                hook.seen_events
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .forget(&event_id);
                tracing::warn!(%event_id, "the gateway did not take a Feishu message; Feishu will deliver it again");
                Dispatched::NotTaken
            }
        }
        Inbound::Comment(comment) => {
            hook.remember_comment(&comment.chat_id(), &comment.comment_id);
            let api = hook.api.clone();
            let inbox = inbox.clone();
            tokio::spawn(async move {
                let event = comments::to_event(&api, &comment).await;
                if inbox.submit(event).await.is_err() {
                    tracing::warn!(
                        comment = %comment.comment_id,
                        "the gateway stopped before a Feishu comment was taken"
                    );
                }
            });
            Dispatched::Taken
        }
    }
}

/// A card callback, shared by the webhook and the long connection: dedupe
/// on its event id, turn the click into its command's message, hand it on;
/// with the answer the clicker sees.
pub(crate) async fn dispatch_click(
    hook: &Arc<Hook>,
    envelope: &Value,
    inbox: &Inbox,
) -> (Dispatched, Value) {
    let click = match Click::parse(envelope) {
        Ok(c) => c,
        Err(why) => {
            tracing::info!(reason = why, "a Feishu card callback ignored");
            return (Dispatched::Taken, callback::silent());
        }
    };
    if !hook.first_event(&click.key) {
        tracing::debug!(key = %click.key, "a Feishu card click delivered again; ignored");
        return (Dispatched::Taken, callback::silent());
    }
    let known = || {
        hook.cards
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&click.message_id)
            .cloned()
    };
    let mut card = known();
    if card.is_none()
        && let Ok(_sent) = tokio::time::timeout(CARD_SEND_WAIT, hook.card_sends.write()).await
    {
        card = known();
    }
    let event = match click.to_event(card.as_ref(), hook.bot().as_deref()) {
        Ok(event) => event,
        Err(why) => {
            tracing::info!(card = %click.message_id, reason = why, "a Feishu card click not taken");
            return (Dispatched::Taken, callback::toast("info", why));
        }
    };
    let command = event.text.clone();
    match tokio::time::timeout(SUBMIT_TIMEOUT, inbox.admit(event)).await {
        Ok(Ok(Admission::Accepted)) => (
            Dispatched::Taken,
            callback::toast("success", &format!("Sent: {command}")),
        ),
        Ok(Ok(Admission::Duplicate)) => (Dispatched::Taken, callback::silent()),
        // Refused like the same words typed by the same person: the runner
        // said why in its log; the clicker learns only that it went nowhere.
        Ok(Ok(Admission::Refused)) => (Dispatched::Taken, callback::toast("warning", "Not taken.")),
        Ok(Err(_)) | Err(_) => {
            hook.seen_events
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .forget(&click.key);
            tracing::warn!(card = %click.message_id, "the gateway did not take a Feishu card click");
            (Dispatched::NotTaken, callback::silent())
        }
    }
}
