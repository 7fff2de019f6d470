//! `POST /sms/twilio`: Twilio's incoming-message webhook.
//!
//! In order, each step answering on its own when it refuses:
//!
//! 1. no `X-Twilio-Signature` → 401, before the body is read;
//! 2. body over [`MAX_BODY_BYTES`] → 413 (read no further);
//! 3. the form, decoded only to check the signature over it; a signature
//!    that does not match → 401 (the same answer whatever was wrong);
//! 4. `AccountSid` not ours, or `To` not our number → 403;
//! 5. no usable `MessageSid` → 400;
//! 6. a sender that is not an E.164 number (short codes, alphanumeric
//!    senders), an opt-out keyword Twilio already answered, or an empty
//!    message → 200 with an empty `<Response/>`, nothing handed over;
//! 7. the event handed to the inbox → 200 `<Response/>` (`text/xml`), or
//!    503 when no inbox is attached or it does not take the event in time,
//!    so Twilio reports the failure (and uses the number's fallback URL).
//!
//! A re-delivered message keeps its `MessageSid`, which becomes the event's
//! `message_id`: the runner's inbound dedupe drops the repeat, and it is
//! still answered 200 so Twilio stops.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use talaria_adapter::{ChatType, MessageEvent, SessionSource};

use super::signature::{HEADER, Verifier};
use super::{PLATFORM, is_e164};
use crate::ingress::{InboxSlot, read_body};

/// The route Twilio posts to (the path part of `webhook_url`, unless a
/// proxy rewrites it).
pub const PATH: &str = "/sms/twilio";

/// The largest webhook body read. An SMS of 1,600 characters with ten
/// media links is a few kilobytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// How long a delivery may wait for a saturated inbox before it is
/// answered 503. Twilio gives a webhook 15 s.
const SUBMIT_TIMEOUT: Duration = Duration::from_secs(8);

/// Twilio never sends more than ten media items with one message.
const MAX_MEDIA: usize = 10;

/// Longest `MessageSid` taken (Twilio's are 34 characters).
const MAX_SID_LEN: usize = 64;

/// The opt-out keywords Twilio's default handling acts on for long codes:
/// the sender is unsubscribed (and told so by Twilio), so an answer could
/// not reach them anyway. Opt-in and help keywords (`START`, `YES`,
/// `HELP`, ...) are ordinary words in a conversation and go to the agent
/// unless Twilio flags them (`OptOutType`, sent when Advanced Opt-Out is
/// on).
const OPT_OUT_KEYWORDS: &[&str] = &["STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT"];

/// What the handler checks against.
pub(crate) struct Inbound {
    pub(crate) verifier: Verifier,
    pub(crate) account_sid: String,
    pub(crate) phone_number: String,
    pub(crate) slot: InboxSlot,
}

pub(crate) fn router(inbound: Arc<Inbound>) -> Router {
    Router::new().route(PATH, post(receive)).with_state(inbound)
}

fn twiml_ok() -> Response {
    (
        StatusCode::OK,
        [(CONTENT_TYPE, HeaderValue::from_static("text/xml"))],
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Response/>",
    )
        .into_response()
}

fn refuse(status: StatusCode, message: &'static str) -> Response {
    (
        status,
        [(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        message,
    )
        .into_response()
}

async fn receive(
    axum::extract::State(inbound): axum::extract::State<Arc<Inbound>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Some(signature) = headers
        .get(HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.trim().is_empty())
    else {
        tracing::info!("SMS webhook without a signature refused");
        return refuse(StatusCode::UNAUTHORIZED, "missing or invalid signature");
    };
    let body = match read_body(body, &headers, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(e) => return refuse(e.status(), "the body could not be read"),
    };
    let params: Vec<(String, String)> = form_urlencoded::parse(&body).into_owned().collect();
    if !inbound.verifier.verify(signature, &params) {
        // Info, not warn: anyone can send these; a wrong webhook_url or
        // auth token shows up here.
        tracing::info!(
            "SMS webhook with a signature that does not match refused (check the auth token, \
             and that SMS_WEBHOOK_URL is exactly the URL set on the number in Twilio)"
        );
        return refuse(StatusCode::UNAUTHORIZED, "missing or invalid signature");
    }
    let field = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    if field("AccountSid") != Some(inbound.account_sid.as_str()) {
        tracing::warn!("SMS webhook for another Twilio account refused");
        return refuse(StatusCode::FORBIDDEN, "not this account");
    }
    if field("To").map(str::trim) != Some(inbound.phone_number.as_str()) {
        tracing::warn!("SMS webhook for a number other than TWILIO_PHONE_NUMBER refused");
        return refuse(StatusCode::FORBIDDEN, "not this number");
    }
    let Some(sid) = field("MessageSid")
        .or_else(|| field("SmsSid"))
        .map(str::trim)
        .filter(|s| is_sid(s))
    else {
        return refuse(StatusCode::BAD_REQUEST, "no usable MessageSid");
    };
    let from = field("From").unwrap_or("").trim();
    if !is_e164(from) {
        tracing::info!(message_sid = %sid, "SMS from a sender that is not a phone number ignored");
        return twiml_ok();
    }
    let text = field("Body").unwrap_or("");
    if field("OptOutType").is_some_and(|t| !t.trim().is_empty())
        || OPT_OUT_KEYWORDS
            .iter()
            .any(|k| k.eq_ignore_ascii_case(text.trim()))
    {
        tracing::info!(message_sid = %sid, "SMS opt-out keyword left to Twilio");
        return twiml_ok();
    }
    let attachments = media(&field);
    if text.trim().is_empty() && attachments.is_empty() {
        tracing::debug!(message_sid = %sid, "empty SMS ignored");
        return twiml_ok();
    }
    let event = MessageEvent {
        message_id: Some(sid.to_owned()),
        attachments,
        ..MessageEvent::text(source(from), text)
    };
    let handed = match inbound.slot.inbox() {
        Some(inbox) => matches!(
            tokio::time::timeout(SUBMIT_TIMEOUT, inbox.submit(event)).await,
            Ok(Ok(()))
        ),
        None => false,
    };
    if !handed {
        tracing::warn!(message_sid = %sid, "the gateway did not take an SMS; Twilio will report it");
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway is not taking messages right now",
        );
    }
    tracing::info!(message_sid = %sid, "SMS accepted");
    twiml_ok()
}

/// A DM with the sender, whose number is both chat and user.
fn source(from: &str) -> SessionSource {
    SessionSource {
        platform: PLATFORM.to_owned(),
        chat_id: from.to_owned(),
        chat_name: None,
        chat_type: ChatType::Dm,
        user_id: Some(from.to_owned()),
        user_name: None,
        thread_id: None,
        is_bot: false,
    }
}

/// Twilio's `NumMedia`, `MediaContentType{N}` and `MediaUrl{N}`: what the
/// model is told was attached, its type and where Twilio keeps it (the
/// URL may need the account's credentials, which the model never gets).
fn media<'a>(field: &impl Fn(&str) -> Option<&'a str>) -> Vec<talaria_adapter::Attachment> {
    let n = field("NumMedia")
        .and_then(|n| n.trim().parse::<usize>().ok())
        .unwrap_or(0)
        .min(MAX_MEDIA);
    let clean = |v: &'a str| {
        let v = v.trim();
        (!v.is_empty() && v.len() <= 500 && !v.chars().any(|c| c.is_control() || c == ' '))
            .then_some(v)
    };
    (0..n)
        .filter_map(|i| {
            let kind = field(&format!("MediaContentType{i}")).and_then(clean);
            let url = field(&format!("MediaUrl{i}"))
                .and_then(clean)
                .filter(|u| u.starts_with("https://") || u.starts_with("http://"))?;
            // Fetched with the account's credentials when the turn runs.
            Some(talaria_adapter::Attachment::guessed(url, None, kind, None))
        })
        .collect()
}

/// A Twilio SID: letters and digits only, so it is safe as a message id.
fn is_sid(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_SID_LEN && s.chars().all(|c| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;
    use talaria_adapter::{KeyPolicy, SessionKey};

    #[test]
    fn sids_and_sources() {
        assert!(is_sid("SM0123456789abcdef0123456789abcdef"));
        for bad in ["", "SM../x", "SM 1", &"a".repeat(65)] {
            assert!(!is_sid(bad), "{bad:?}");
        }
        let key = SessionKey::for_source(&source("+15551234567"), KeyPolicy::default()).unwrap();
        assert!(
            key.as_str().ends_with(":sms:dm:+15551234567"),
            "{}",
            key.as_str()
        );
    }

    #[test]
    fn media_is_described_by_type() {
        let params = [
            ("NumMedia", "3"),
            ("MediaContentType0", "image/jpeg"),
            ("MediaContentType1", ""),
            ("MediaUrl0", "https://api.twilio.com/x"),
            ("MediaUrl2", "https://api.twilio.com/y"),
        ];
        let field = |name: &str| params.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
        assert_eq!(
            media(&field),
            vec![
                talaria_adapter::Attachment::guessed(
                    "https://api.twilio.com/x",
                    None,
                    Some("image/jpeg"),
                    None
                ),
                talaria_adapter::Attachment::guessed("https://api.twilio.com/y", None, None, None),
            ]
        );
        let many: Vec<(String, String)> =
            std::iter::once(("NumMedia".to_owned(), "999".to_owned()))
                .chain((0..999).map(|i| {
                    (
                        format!("MediaUrl{i}"),
                        format!("https://api.twilio.com/{i}"),
                    )
                }))
                .collect();
        let field = |name: &str| {
            many.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(media(&field).len(), MAX_MEDIA);
    }
}
