//! The app's callback on the shared listener (`GET`/`POST <path>`).
//!
//! `GET` is WeCom's URL verification: the signature over `echostr` is
//! checked, `echostr` decrypted, and the plaintext answered as the raw
//! body. `POST` carries one encrypted message; in order, each step
//! answering on its own when it refuses:
//!
//! 1. body over [`MAX_BODY_BYTES`] → 413;
//! 2. no `<Encrypt>` in the XML → 400;
//! 3. a signature that does not match → 403 (before anything is
//!    decrypted);
//! 4. a timestamp further from now than the allowed skew → 403 (a replay
//!    of an old delivery);
//! 5. a ciphertext that does not open, or opens for another corp → 403;
//! 6. events, messages for another agent, and anything but text, an
//!    image, a voice message, a video or a file → `success`, nothing
//!    handed over;
//! 7. a `MsgId` seen in the last five minutes → `success`, nothing handed
//!    over (WeCom retries a delivery it thinks was lost; a replay is
//!    dropped the same way);
//! 8. the message handed to the inbox → `success`, or 503 when the gateway
//!    does not take it (WeCom then retries).
//!
//! The turn itself runs in the background: `success` goes back as soon as
//! the runner recorded the message as owed an answer, well inside the
//! five seconds WeCom allows.
//!
//! Media messages carry a `MediaId` (an image also a `PicUrl`, a voice
//! message its `Format` and, when the app has speech recognition on, a
//! `Recognition` transcript). The media id is the attachment's locator:
//! the gateway fetches the bytes later through `cgi-bin/media/get` with
//! the app's token (media ids live three days), never from the `PicUrl`,
//! whose host the message chooses.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use talaria_adapter::{Attachment, ChatType, MediaKind, MessageEvent, SessionSource};

use super::super::crypto::{CryptoError, Key, signature_matches};
use super::super::seen::Seen;
use super::PLATFORM;
use crate::ingress::{InboxSlot, read_body};
use talaria_core::Secret;

/// The largest callback body read (the ancestor's cap). A text message
/// is at most 2048 bytes before encryption.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// How long a delivery may wait for a saturated inbox before it is
/// answered 503; WeCom gives a callback five seconds.
const SUBMIT_TIMEOUT: Duration = Duration::from_secs(4);

/// What the handlers check against.
pub(crate) struct Inbound {
    pub(crate) corp_id: String,
    pub(crate) agent_id: String,
    pub(crate) token: Secret,
    pub(crate) key: Key,
    pub(crate) max_skew: Duration,
    pub(crate) seen: Seen,
    pub(crate) slot: InboxSlot,
}

pub(crate) fn router(path: &str, inbound: Arc<Inbound>) -> Router {
    Router::new()
        .route(path, get(verify_url).post(receive))
        .with_state(inbound)
}

#[derive(Deserialize)]
struct Signed {
    #[serde(default)]
    msg_signature: String,
    #[serde(default)]
    timestamp: String,
    #[serde(default)]
    nonce: String,
    #[serde(default)]
    echostr: Option<String>,
}

/// The outer XML of a delivery.
#[derive(Deserialize)]
struct Envelope {
    #[serde(rename = "Encrypt")]
    encrypt: Option<String>,
}

/// The decrypted message (the fields the adapter reads).
#[derive(Deserialize, Debug, Default)]
#[serde(default)]
pub(crate) struct Message {
    #[serde(rename = "ToUserName")]
    pub(crate) to_user: String,
    #[serde(rename = "FromUserName")]
    pub(crate) from_user: String,
    #[serde(rename = "CreateTime")]
    pub(crate) create_time: String,
    #[serde(rename = "MsgType")]
    pub(crate) msg_type: String,
    #[serde(rename = "Content")]
    pub(crate) content: String,
    #[serde(rename = "MsgId")]
    pub(crate) msg_id: String,
    #[serde(rename = "AgentID")]
    pub(crate) agent_id: String,
    #[serde(rename = "Event")]
    pub(crate) event: String,
    /// Images, voice messages, videos, files: what `media/get` fetches.
    #[serde(rename = "MediaId")]
    pub(crate) media_id: String,
    /// An image's URL on WeCom's CDN (not fetched; see the module docs).
    #[serde(rename = "PicUrl")]
    pub(crate) pic_url: String,
    /// A voice message's format (`amr`, `speex`).
    #[serde(rename = "Format")]
    pub(crate) format: String,
    /// A voice message's transcript, when the app has recognition on.
    #[serde(rename = "Recognition")]
    pub(crate) recognition: String,
    /// A file's name.
    #[serde(rename = "FileName")]
    pub(crate) file_name: String,
}

/// The largest media id taken; WeCom's are well under it.
const MAX_MEDIA_ID: usize = 512;

/// Whether `id` can be a media id (it goes into a query string, so only
/// its length and printable ASCII are asked for).
pub(crate) fn is_media_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_MEDIA_ID && id.bytes().all(|b| b.is_ascii_graphic())
}

/// The text and files of a message, by its type; `None` for a type that
/// starts no turn (events, locations, links).
fn body(message: &Message) -> Option<(String, Vec<Attachment>)> {
    let media = message.media_id.trim();
    let attach = |kind: MediaKind| {
        is_media_id(media)
            .then(|| Attachment::remote(kind, media))
            .into_iter()
            .collect::<Vec<_>>()
    };
    match message.msg_type.as_str() {
        "text" => Some((message.content.clone(), Vec::new())),
        "image" => Some((String::new(), attach(MediaKind::Image))),
        // WeCom's own transcript is the text; the recording still goes to
        // the gateway, whose speech-to-text is used when configured.
        "voice" => {
            let format = message.format.trim().to_ascii_lowercase();
            let files = attach(MediaKind::Voice)
                .into_iter()
                .map(|a| {
                    let mime = match format.as_str() {
                        "amr" => Some("audio/amr"),
                        "speex" => Some("audio/speex"),
                        _ => None,
                    };
                    a.claiming(mime)
                        .named((!format.is_empty()).then(|| format!("voice.{format}")))
                })
                .collect();
            Some((message.recognition.trim().to_owned(), files))
        }
        "video" => Some((String::new(), attach(MediaKind::Video))),
        "file" => {
            let name = Some(message.file_name.trim()).filter(|n| !n.is_empty());
            let files = is_media_id(media)
                .then(|| Attachment::guessed(media, name, None, None))
                .into_iter()
                .collect();
            Some((String::new(), files))
        }
        _ => None,
    }
}

fn plain(status: StatusCode, body: impl Into<String>) -> Response {
    (
        status,
        [(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        body.into(),
    )
        .into_response()
}

/// "Received, no passive reply."
fn success() -> Response {
    plain(StatusCode::OK, "success")
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Whether `timestamp` (seconds) is within `skew` of now.
fn fresh(timestamp: &str, skew: Duration) -> bool {
    let Ok(ts) = timestamp.trim().parse::<u64>() else {
        return false;
    };
    now_secs().abs_diff(ts) <= skew.as_secs()
}

async fn verify_url(State(inbound): State<Arc<Inbound>>, query: Query<Signed>) -> Response {
    let Some(echostr) = query.echostr.as_deref().filter(|e| !e.is_empty()) else {
        return plain(StatusCode::BAD_REQUEST, "missing echostr");
    };
    if !signature_matches(
        &query.msg_signature,
        inbound.token.expose(),
        &query.timestamp,
        &query.nonce,
        echostr,
    ) {
        tracing::info!(
            "WeCom URL verification with a wrong signature refused (check WECOM_CALLBACK_TOKEN)"
        );
        return plain(StatusCode::FORBIDDEN, "invalid signature");
    }
    match inbound.key.decrypt(echostr, Some(&inbound.corp_id)) {
        Ok(text) => match String::from_utf8(text) {
            // The plaintext, raw: no quotes, BOM or newline.
            Ok(text) => plain(StatusCode::OK, text),
            Err(_) => plain(StatusCode::BAD_REQUEST, "echostr is not text"),
        },
        Err(e) => {
            tracing::warn!(
                "WeCom URL verification could not be decrypted ({e}); check \
                 WECOM_CALLBACK_ENCODING_AES_KEY and WECOM_CALLBACK_CORP_ID"
            );
            plain(StatusCode::FORBIDDEN, "cannot decrypt echostr")
        }
    }
}

async fn receive(
    State(inbound): State<Arc<Inbound>>,
    query: Query<Signed>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let body = match read_body(body, &headers, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(e) => return plain(e.status(), e.to_string()),
    };
    let Some(encrypted) = std::str::from_utf8(&body)
        .ok()
        .and_then(|xml| quick_xml::de::from_str::<Envelope>(xml).ok())
        .and_then(|e| e.encrypt)
        .filter(|e| !e.trim().is_empty())
    else {
        return plain(StatusCode::BAD_REQUEST, "no Encrypt element");
    };
    if !signature_matches(
        &query.msg_signature,
        inbound.token.expose(),
        &query.timestamp,
        &query.nonce,
        &encrypted,
    ) {
        tracing::info!("WeCom callback with a wrong signature refused");
        return plain(StatusCode::FORBIDDEN, "invalid signature");
    }
    if !fresh(&query.timestamp, inbound.max_skew) {
        tracing::info!("WeCom callback with a stale timestamp refused as a replay");
        return plain(StatusCode::FORBIDDEN, "stale timestamp");
    }
    let xml = match inbound.key.decrypt(&encrypted, Some(&inbound.corp_id)) {
        Ok(xml) => xml,
        Err(e @ CryptoError::WrongReceiver) => {
            tracing::warn!("WeCom callback refused: {e} (not WECOM_CALLBACK_CORP_ID)");
            return plain(StatusCode::FORBIDDEN, "wrong receive id");
        }
        Err(e) => {
            tracing::warn!("WeCom callback refused: {e}");
            return plain(StatusCode::FORBIDDEN, "cannot decrypt");
        }
    };
    let Some(message) = std::str::from_utf8(&xml)
        .ok()
        .and_then(|xml| quick_xml::de::from_str::<Message>(xml).ok())
    else {
        return plain(StatusCode::BAD_REQUEST, "the message is not readable XML");
    };
    handle(&inbound, message).await
}

async fn handle(inbound: &Inbound, message: Message) -> Response {
    if !message.agent_id.trim().is_empty() && message.agent_id.trim() != inbound.agent_id {
        tracing::info!("WeCom message for another agent ignored");
        return success();
    }
    let Some((text, attachments)) = body(&message) else {
        // Events (`enter_agent`, `subscribe`), locations and links start
        // no turn.
        tracing::debug!(msg_type = %message.msg_type, event = %message.event, "WeCom callback ignored");
        return success();
    };
    let user = message.from_user.trim();
    if user.is_empty() || user.len() > 64 || user.contains(':') {
        return plain(StatusCode::BAD_REQUEST, "no usable FromUserName");
    }
    let id = if message.msg_id.trim().is_empty() {
        format!("{user}:{}", message.create_time.trim())
    } else {
        message.msg_id.trim().to_owned()
    };
    if text.trim().is_empty() && attachments.is_empty() {
        return success();
    }
    if !inbound.seen.insert(&id) {
        tracing::info!(msg_id = %id, "WeCom message already taken; repeat ignored");
        return success();
    }
    let event = MessageEvent {
        message_id: Some(id.clone()),
        attachments,
        ..MessageEvent::text(source(&inbound.corp_id, user), text)
    };
    let handed = match inbound.slot.inbox() {
        Some(inbox) => matches!(
            tokio::time::timeout(SUBMIT_TIMEOUT, inbox.submit(event)).await,
            Ok(Ok(()))
        ),
        None => false,
    };
    if !handed {
        // Not taken: WeCom's retry must get through.
        inbound.seen.remove(&id);
        tracing::warn!(msg_id = %id, "the gateway did not take a WeCom message; WeCom will retry");
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway is not taking messages right now",
        );
    }
    tracing::info!(msg_id = %id, "WeCom message accepted");
    success()
}

/// A DM with the sender: the chat is `<corp_id>:<user_id>` (the
/// ancestor's form), the user the WeCom user id.
pub(crate) fn source(corp_id: &str, user: &str) -> SessionSource {
    SessionSource {
        platform: PLATFORM.to_owned(),
        chat_id: format!("{corp_id}:{user}"),
        chat_name: None,
        chat_type: ChatType::Dm,
        user_id: Some(user.to_owned()),
        user_name: None,
        thread_id: None,
        is_bot: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decrypted_xml_is_read_with_cdata() {
        let xml = "<xml><ToUserName><![CDATA[ww1]]></ToUserName><FromUserName><![CDATA[zhang]]>\
                   </FromUserName><CreateTime>1700000000</CreateTime><MsgType><![CDATA[text]]>\
                   </MsgType><Content><![CDATA[你好 <b>&amp;</b>]]></Content><MsgId>123456</MsgId>\
                   <AgentID>1000002</AgentID></xml>";
        let m: Message = quick_xml::de::from_str(xml).unwrap();
        assert_eq!(m.from_user, "zhang");
        assert_eq!(m.content, "你好 <b>&amp;</b>");
        assert_eq!(m.msg_id, "123456");
        assert_eq!(m.agent_id, "1000002");
        assert_eq!(m.to_user, "ww1");
        let outer: Envelope =
            quick_xml::de::from_str("<xml><ToUserName>a</ToUserName><AgentID>1</AgentID><Encrypt><![CDATA[abc=]]></Encrypt></xml>")
                .unwrap();
        assert_eq!(outer.encrypt.as_deref(), Some("abc="));
    }

    #[test]
    fn media_messages_become_attachments_fetched_by_media_id() {
        let read = |xml: &str| quick_xml::de::from_str::<Message>(xml).unwrap();
        let image = read(
            "<xml><MsgType><![CDATA[image]]></MsgType><PicUrl><![CDATA[https://wework.qpic.cn/x]]>\
             </PicUrl><MediaId><![CDATA[2-media_ID-1]]></MediaId><MsgId>1</MsgId></xml>",
        );
        assert_eq!(image.pic_url, "https://wework.qpic.cn/x");
        let (text, files) = body(&image).unwrap();
        assert!(text.is_empty());
        assert_eq!(
            files,
            vec![Attachment::remote(MediaKind::Image, "2-media_ID-1")]
        );
        let voice = read(
            "<xml><MsgType>voice</MsgType><MediaId>v1</MediaId><Format>AMR</Format>\
             <Recognition><![CDATA[明天开会]]></Recognition></xml>",
        );
        let (text, files) = body(&voice).unwrap();
        assert_eq!(text, "明天开会");
        assert_eq!(files[0].kind, MediaKind::Voice);
        assert_eq!(files[0].mime.as_deref(), Some("audio/amr"));
        let file = read(
            "<xml><MsgType>file</MsgType><MediaId>f1</MediaId><FileName>q3.pdf</FileName></xml>",
        );
        let (_, files) = body(&file).unwrap();
        assert_eq!(files[0].kind, MediaKind::Document);
        assert_eq!(files[0].name.as_deref(), Some("q3.pdf"));
        let video = read("<xml><MsgType>video</MsgType><MediaId>m1</MediaId></xml>");
        assert_eq!(body(&video).unwrap().1[0].kind, MediaKind::Video);
        // A media id with spaces is not fetched; an event starts nothing.
        let bad = read("<xml><MsgType>image</MsgType><MediaId>a b</MediaId></xml>");
        assert!(body(&bad).unwrap().1.is_empty());
        let event = read("<xml><MsgType>event</MsgType><Event>enter_agent</Event></xml>");
        assert!(body(&event).is_none());
    }

    #[test]
    fn timestamps_must_be_near_now() {
        let skew = Duration::from_secs(300);
        assert!(fresh(&now_secs().to_string(), skew));
        assert!(!fresh(&(now_secs() - 301).to_string(), skew));
        assert!(!fresh("soon", skew));
        let key = talaria_adapter::SessionKey::for_source(
            &source("ww1", "zhang"),
            talaria_adapter::KeyPolicy::default(),
        )
        .unwrap();
        assert!(
            key.as_str().ends_with(":wecom_callback:dm:ww1:zhang"),
            "{}",
            key.as_str()
        );
    }
}
