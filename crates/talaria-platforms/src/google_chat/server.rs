//! The event route on the shared listener, and what an event becomes.
//!
//! `POST /google_chat/events` runs these steps in order, each answering on
//! its own when it refuses:
//!
//! 1. body over `max_body_bytes` → 413 (read no further than the limit)
//! 2. `Authorization: Bearer <JWT>` missing, or not Google Chat's token
//!    for this app (see `jwt`) → 401, whatever was wrong
//! 3. the body as JSON → 400
//! 4. a `MESSAGE` (or an `ADDED_TO_SPACE` that came with one) from a
//!    person handed to the inbox → 200 `{}` (no synchronous answer: the
//!    answer is posted through the API); other events → 200 `{}`; no
//!    inbox, a closed one or one that stays full → 503
//!
//! Events in the Workspace add-on shape (`chat.messagePayload`) are read
//! the same way. In a space, Chat posts only messages that mention the
//! app (or use its slash commands); in a DM, every message.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use talaria_adapter::{ChatType, MessageEvent, SessionSource};

use super::PLATFORM;
use super::jwt::Verifier;
use crate::ingress::{InboxSlot, json_refusal, read_body};

/// The path the app's HTTP endpoint URL points at.
pub const EVENTS_PATH: &str = "/google_chat/events";

/// How long one event may wait for a saturated inbox.
const SUBMIT_TIMEOUT: Duration = Duration::from_secs(8);

/// The longest id taken from an event.
const MAX_ID_LEN: usize = 512;

/// What the handler shares with the adapter.
pub(crate) struct Hook {
    pub verifier: Verifier,
    pub max_body_bytes: usize,
    pub slot: InboxSlot,
}

pub(crate) fn router(hook: Arc<Hook>) -> Router {
    Router::new()
        .route(EVENTS_PATH, post(receive))
        .with_state(hook)
}

async fn receive(State(hook): State<Arc<Hook>>, headers: HeaderMap, body: Body) -> Response {
    let body = match read_body(body, &headers, hook.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return json_refusal(e.status(), &e.to_string()),
    };
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(token) = token else {
        tracing::info!("a Google Chat event without a bearer token; refused");
        return json_refusal(StatusCode::UNAUTHORIZED, "missing or invalid token");
    };
    if let Err(why) = hook.verifier.verify(token).await {
        tracing::info!(reason = %why, "a Google Chat event with a token that is not Google's; refused");
        return json_refusal(StatusCode::UNAUTHORIZED, "missing or invalid token");
    }
    let Ok(event) = serde_json::from_slice::<Value>(&body) else {
        return json_refusal(StatusCode::BAD_REQUEST, "the body is not JSON");
    };
    let message = match map_event(&event) {
        Ok(Some(m)) => m,
        Ok(None) => return empty(),
        Err(why) => {
            tracing::debug!(reason = why, "Google Chat event not handed on");
            return empty();
        }
    };
    let Some(inbox) = hook.slot.inbox() else {
        return json_refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway is not taking messages right now",
        );
    };
    match tokio::time::timeout(SUBMIT_TIMEOUT, inbox.submit(message)).await {
        Ok(Ok(())) => empty(),
        _ => json_refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway is not taking messages right now",
        ),
    }
}

fn empty() -> Response {
    (StatusCode::OK, axum::Json(json!({}))).into_response()
}

fn id(v: &Value) -> Option<&str> {
    v.as_str()
        .map(str::trim)
        .filter(|s| !s.is_empty() && s.len() <= MAX_ID_LEN)
}

/// What an event becomes: `Ok(None)` for events that are not messages.
pub(crate) fn map_event(event: &Value) -> Result<Option<MessageEvent>, &'static str> {
    // The add-on shape wraps the same message and space.
    let (kind, message, space) = match event["chat"]["messagePayload"].as_object() {
        Some(payload) => (
            "MESSAGE",
            payload.get("message").unwrap_or(&Value::Null),
            payload.get("space").unwrap_or(&Value::Null),
        ),
        None => (
            event["type"].as_str().unwrap_or_default(),
            &event["message"],
            &event["space"],
        ),
    };
    if !matches!(kind, "MESSAGE" | "ADDED_TO_SPACE") || !message.is_object() {
        return Ok(None);
    }
    let sender = &message["sender"];
    if sender["type"].as_str() == Some("BOT") {
        return Err("a bot's message");
    }
    let space = if space.is_object() {
        space
    } else {
        &message["space"]
    };
    let Some(space_name) = id(&space["name"]).filter(|n| n.starts_with("spaces/")) else {
        return Err("a message without a space");
    };
    let Some(name) = id(&message["name"]) else {
        return Err("a message without a name");
    };
    let user = id(&sender["email"]).or_else(|| id(&sender["name"]));
    let Some(user) = user else {
        return Err("a message without a sender");
    };
    let space_type = space["spaceType"]
        .as_str()
        .or_else(|| space["type"].as_str())
        .unwrap_or_default();
    let dm = matches!(space_type, "DIRECT_MESSAGE" | "DM") || space["singleUserBotDm"] == true;
    let thread = if dm {
        None
    } else {
        id(&message["thread"]["name"]).map(str::to_owned)
    };
    // A slash command reads as typed; otherwise the text without the
    // app's mention.
    let text = if message["slashCommand"].is_object() {
        message["text"].as_str().unwrap_or_default()
    } else {
        message["argumentText"]
            .as_str()
            .or_else(|| message["text"].as_str())
            .unwrap_or_default()
    };
    let mut text = text.trim().to_owned();
    for a in message["attachment"].as_array().into_iter().flatten() {
        let name = a["contentName"].as_str().unwrap_or("a file");
        text.push_str(&format!(
            "\n[an attachment Talaria cannot open here: {name}]"
        ));
    }
    let text = text.trim().to_owned();
    if text.is_empty() {
        return Err("an empty message");
    }
    let source = SessionSource {
        platform: PLATFORM.to_owned(),
        chat_id: space_name.to_owned(),
        chat_name: space["displayName"]
            .as_str()
            .filter(|n| !n.is_empty())
            .map(str::to_owned),
        chat_type: if dm { ChatType::Dm } else { ChatType::Group },
        user_id: Some(user.to_owned()),
        user_name: sender["displayName"].as_str().map(str::to_owned),
        thread_id: thread,
        is_bot: false,
    };
    let mut out = MessageEvent::text(source, text);
    out.message_id = Some(name.to_owned());
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(space_type: &str, text: &str, argument: &str) -> Value {
        json!({
            "type": "MESSAGE", "eventTime": "2026-12-07T09:00:00Z",
            "space": {"name": "spaces/AAA", "spaceType": space_type, "displayName": "Team"},
            "message": {
                "name": "spaces/AAA/messages/M1", "text": text, "argumentText": argument,
                "sender": {"name": "users/42", "displayName": "Ada", "email": "ada@example.com", "type": "HUMAN"},
                "thread": {"name": "spaces/AAA/threads/T1"},
            },
        })
    }

    #[test]
    fn dms_and_space_threads_are_told_apart() {
        let dm = map_event(&event("DIRECT_MESSAGE", "hello", "hello"))
            .unwrap()
            .unwrap();
        assert_eq!(dm.source.chat_type, ChatType::Dm);
        assert_eq!(dm.source.thread_id, None);
        assert_eq!(dm.source.user_id.as_deref(), Some("ada@example.com"));
        assert_eq!(dm.message_id.as_deref(), Some("spaces/AAA/messages/M1"));
        let sp = map_event(&event("SPACE", "@Talaria what time", " what time"))
            .unwrap()
            .unwrap();
        assert_eq!(sp.source.chat_type, ChatType::Group);
        assert_eq!(
            sp.source.thread_id.as_deref(),
            Some("spaces/AAA/threads/T1")
        );
        assert_eq!(sp.text, "what time");
        assert_eq!(sp.source.chat_name.as_deref(), Some("Team"));
    }

    #[test]
    fn bots_other_events_and_the_add_on_shape() {
        let mut bot = event("SPACE", "x", "x");
        bot["message"]["sender"]["type"] = json!("BOT");
        assert!(map_event(&bot).is_err());
        let removed = json!({"type": "REMOVED_FROM_SPACE", "space": {"name": "spaces/AAA"}});
        assert_eq!(map_event(&removed), Ok(None));
        let plain = event("DIRECT_MESSAGE", "hi", "hi");
        let add_on = json!({"chat": {"messagePayload": {"message": plain["message"], "space": plain["space"]}}});
        assert_eq!(map_event(&add_on).unwrap().unwrap().text, "hi");
        let mut slash = event("SPACE", "/help me", "me");
        slash["message"]["slashCommand"] = json!({"commandId": "1"});
        assert_eq!(map_event(&slash).unwrap().unwrap().text, "/help me");
    }
}
