//! A fake Twilio on 127.0.0.1, for the SMS adapter's tests, and a sender
//! of inbound SMS webhooks signed the way Twilio signs them.
//!
//! [`FakeTwilio`] speaks the parts of the REST API (`2010-04-01`) the
//! adapter uses, over real HTTP with form bodies and JSON answers:
//!
//! - `POST /2010-04-01/Accounts/{sid}/Messages.json` with `To`, `From`,
//!   `Body`: `201` and the message resource (`sid` `SM...`, `status`
//!   `queued`, `num_segments`, ...). Refused as Twilio refuses: wrong or
//!   missing basic auth → 401 (code 20003); another account's path → 404
//!   (20404); a `To` that is not E.164 → 400 (21211); a `From` other than the account's number → 400
//!   (21606); no `Body` → 400 (21602); a `Body` over 1,600 characters →
//!   400 (21617); a number that replied STOP ([`FakeTwilio::unsubscribe`])
//!   → 400 (21610); a landline ([`FakeTwilio::landline`]) → 400 (21614).
//! - `GET /2010-04-01/Accounts/{sid}.json`: the account, behind the same
//!   basic auth.
//! - `GET /2010-04-01/Accounts/{sid}/Messages/{MM}/Media/{ME}`: a media
//!   file a test registered ([`FakeTwilio::add_media`], whose URL goes in
//!   an inbound MMS's `MediaUrl{N}`), behind the same basic auth (as with
//!   "Enforce HTTP Auth on Media URLs"), answered as Twilio does with a
//!   `307` to a short-lived URL (here `/cdn/{ME}` on this server) that
//!   serves the bytes with their type; an unknown or deleted one gets
//!   `404` (20404).
//!
//! Error bodies have Twilio's shape: `code`, `message`, `more_info`,
//! `status`. Tests script failures for the next sends
//! ([`FakeTwilio::fail_next_send`]: any error, a 429 with or without
//! `Retry-After`, or a hang) and read what was sent
//! ([`FakeTwilio::sent`], [`FakeTwilio::wait_for_sent`]) and every request
//! ([`FakeTwilio::requests`]). The server runs on its own thread and stops
//! when dropped.
//!
//! [`WebhookSender`] posts inbound messages ([`InboundSms`]) to an
//! application as Twilio does: a form with Twilio's fields, signed with
//! `X-Twilio-Signature` over the public URL (which behind a proxy is not
//! the address the request is actually sent to). [`sign`] is the
//! algorithm on its own.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, Uri, header};
use axum::response::Response;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha1::Sha1;

use crate::fake::{Core, Faults, bind, started};
use crate::json_response;

/// Twilio's largest Body, in characters.
pub const MAX_BODY_CHARS: usize = 1600;

/// One message the fake accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct SentSms {
    /// The message SID the fake assigned.
    pub sid: String,
    /// The recipient's number.
    pub to: String,
    /// The sender's number (the bot's).
    pub from: String,
    /// The text exactly as sent.
    pub body: String,
    /// When the fake received it.
    pub at: Instant,
}

/// Any request, recorded when it arrived (before failures or hangs).
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The HTTP method (`GET`, `POST`, ...).
    pub method: String,
    /// The request path.
    pub path: String,
    /// The form fields, in the order sent.
    pub form: Vec<(String, String)>,
    /// Basic auth with the account SID and auth token.
    pub authorized: bool,
    /// When the fake received it.
    pub at: Instant,
}

impl Request {
    /// The first value of form field `name`.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.form
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What the next send gets instead of being accepted.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// An error with Twilio's body: HTTP `status`, Twilio `code`.
    Error {
        /// The HTTP status.
        status: u16,
        /// Twilio's error code.
        code: u32,
        /// The body's `message`.
        message: String,
    },
    /// HTTP 429, code 20429, with `Retry-After` when given.
    RateLimited {
        /// The `Retry-After` header, in seconds.
        retry_after: Option<u64>,
    },
    /// The request is recorded, then never answered (until the server
    /// stops).
    Hang,
}

impl Failure {
    /// An error of `status` and `code` with Twilio's usual message.
    pub fn code(status: u16, code: u32) -> Failure {
        Failure::Error {
            status,
            code,
            message: default_message(code).to_owned(),
        }
    }
}

fn default_message(code: u32) -> &'static str {
    match code {
        20003 => "Authenticate",
        20429 => "Too Many Requests",
        20500 => "Internal Server Error",
        21211 => "The 'To' number is not a valid phone number.",
        21602 => "Message body is required.",
        21606 => {
            "The 'From' phone number provided is not a valid message-capable Twilio phone number \
             for this destination/account."
        }
        21610 => "Attempt to send to unsubscribed recipient",
        21614 => "'To' number is not a valid mobile number",
        21617 => "The concatenated message body exceeds the 1600 character limit.",
        _ => "Error",
    }
}

#[derive(Default)]
struct Book {
    next_id: u64,
    sent: Vec<SentSms>,
    failures: Faults<Failure>,
    unsubscribed: HashSet<String>,
    landlines: HashSet<String>,
    media: Vec<Media>,
}

struct Shared {
    account_sid: String,
    auth_token: String,
    phone_number: String,
    core: Core<Book, Request>,
}

/// A fake Twilio REST API (see the module docs).
pub struct FakeTwilio {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl FakeTwilio {
    /// Starts the server on 127.0.0.1 with an ephemeral port, for the
    /// account `account_sid` with `auth_token`, owning `phone_number`.
    ///
    /// # Panics
    /// When no local port can be bound (a broken test environment).
    pub fn start(account_sid: &str, auth_token: &str, phone_number: &str) -> FakeTwilio {
        started(
            "the fake Twilio server",
            Self::try_start(account_sid, auth_token, phone_number),
        )
    }

    /// Like [`Self::start`], returning the error instead of panicking.
    pub fn try_start(
        account_sid: &str,
        auth_token: &str,
        phone_number: &str,
    ) -> std::io::Result<FakeTwilio> {
        let (listener, addr) = bind()?;
        let shared = Arc::new(Shared {
            account_sid: account_sid.to_owned(),
            auth_token: auth_token.to_owned(),
            phone_number: phone_number.to_owned(),
            core: Core::new(Book::default()),
        });
        let app = Router::new().fallback(rest).with_state(shared.clone());
        shared.core.serve("fake-twilio", listener, app)?;
        Ok(FakeTwilio { addr, shared })
    }

    /// `http://127.0.0.1:PORT`: the API root (`platforms.sms.api_base`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The account SID.
    pub fn account_sid(&self) -> &str {
        &self.shared.account_sid
    }

    /// The auth token.
    pub fn auth_token(&self) -> &str {
        &self.shared.auth_token
    }

    /// The account's phone number.
    pub fn phone_number(&self) -> &str {
        &self.shared.phone_number
    }

    /// An inbound SMS from `from` to the account's number, with a fresh
    /// `MessageSid`.
    pub fn inbound(&self, from: &str, body: &str) -> InboundSms {
        let sid = {
            let mut st = self.shared.core.change();
            st.next_id += 1;
            format!("SM{:032x}", 0xabc0_0000_u64 + st.next_id)
        };
        InboundSms::new(
            &self.shared.account_sid,
            from,
            &self.shared.phone_number,
            body,
        )
        .with_sid(&sid)
    }

    /// A sender of webhooks signed with this account's token over
    /// `signed_url`, posting to `post_to`.
    pub fn webhook_sender(&self, post_to: &str, signed_url: &str) -> WebhookSender {
        WebhookSender::new(post_to, signed_url, &self.shared.auth_token)
    }

    /// Every message accepted so far.
    pub fn sent(&self) -> Vec<SentSms> {
        self.shared.core.read().sent.clone()
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.core.requests()
    }

    /// Every `POST .../Messages.json` so far, accepted or not.
    pub fn send_attempts(&self) -> Vec<Request> {
        self.shared.core.requests_where(is_send)
    }

    /// Waits until at least `n` messages were accepted and returns them
    /// all.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_sent(&self, n: usize, timeout: Duration) -> Vec<SentSms> {
        self.shared
            .core
            .wait_len("SMS", n, timeout, |st| &st.sent)
            .await
    }

    /// Waits until at least `n` sends were attempted and returns them.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_send_attempts(&self, n: usize, timeout: Duration) -> Vec<Request> {
        self.shared
            .core
            .wait_requests("send attempts", n, timeout, is_send)
            .await
    }

    /// The next send gets `failure`. Calls queue up.
    pub fn fail_next_send(&self, failure: Failure) {
        self.shared.core.change().failures.push(failure);
    }

    /// `number` replied STOP: sends to it get 21610 until
    /// [`Self::resubscribe`].
    pub fn unsubscribe(&self, number: &str) {
        self.shared
            .core
            .change()
            .unsubscribed
            .insert(number.to_owned());
    }

    /// `number` replied START.
    pub fn resubscribe(&self, number: &str) {
        self.shared.core.change().unsubscribed.remove(number);
    }

    /// `number` is a landline: sends to it get 21614.
    pub fn landline(&self, number: &str) {
        self.shared
            .core
            .change()
            .landlines
            .insert(number.to_owned());
    }

    /// Keeps a media file as Twilio keeps an inbound MMS's; its URL, for
    /// [`InboundSms::with_media`].
    pub fn add_media(&self, bytes: &[u8], content_type: &str) -> String {
        let mut st = self.shared.core.change();
        let sid = format!("ME{:032x}", st.media.len() + 1);
        st.media.push(Media {
            sid: sid.clone(),
            content_type: content_type.to_owned(),
            bytes: bytes.to_vec(),
        });
        format!(
            "{}/2010-04-01/Accounts/{}/Messages/MM{:032x}/Media/{sid}",
            self.base_url(),
            self.shared.account_sid,
            st.media.len()
        )
    }

    /// Deletes the media behind `url`: fetching it gets 404 from then on.
    pub fn delete_media(&self, url: &str) {
        let sid = url.rsplit('/').next().unwrap_or("").to_owned();
        self.shared.core.change().media.retain(|m| m.sid != sid);
    }

    /// Stops the server (also on drop). Hung requests are cut.
    pub fn shutdown(&self) {
        self.shared.core.stop();
    }
}

impl Drop for FakeTwilio {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Whether `r` is a send, accepted or not.
fn is_send(r: &Request) -> bool {
    r.method == "POST" && r.path.ends_with("/Messages.json")
}

fn twilio_error(status: u16, code: u32, message: &str) -> Response {
    json_response(
        status,
        &json!({
            "code": code,
            "message": message,
            "more_info": format!("https://www.twilio.com/docs/errors/{code}"),
            "status": status,
        }),
    )
}

fn authorized(shared: &Shared, headers: &HeaderMap) -> bool {
    let Some(encoded) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
    else {
        return false;
    };
    let Ok(decoded) = BASE64.decode(encoded.trim()) else {
        return false;
    };
    let expected = format!("{}:{}", shared.account_sid, shared.auth_token);
    decoded == expected.as_bytes()
}

/// One media file Twilio keeps for an inbound MMS.
struct Media {
    sid: String,
    content_type: String,
    bytes: Vec<u8>,
}

async fn rest(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let form: Vec<(String, String)> = form_urlencoded::parse(&body).into_owned().collect();
    let ok = authorized(&shared, &headers);
    let request = Request {
        method: method.to_string(),
        path: path.clone(),
        form: form.clone(),
        authorized: ok,
        at: Instant::now(),
    };
    // Taken before the attempt is logged (and waiters woken), so a test
    // that sees the attempt finds its failure already decided.
    let failure = if is_send(&request) && ok {
        shared.core.change().failures.take()
    } else {
        None
    };
    shared.core.record(request);
    // The CDN's short-lived URLs need no credentials: they are the secret.
    if method == Method::GET
        && let Some(sid) = path.strip_prefix("/cdn/")
    {
        let st = shared.core.read();
        return match st.media.iter().find(|m| m.sid == sid) {
            Some(m) => {
                let mut r = Response::new(axum::body::Body::from(m.bytes.clone()));
                if let Ok(v) = HeaderValue::from_str(&m.content_type) {
                    r.headers_mut().insert(header::CONTENT_TYPE, v);
                }
                r
            }
            None => twilio_error(404, 20404, "The requested resource was not found"),
        };
    }
    if !ok {
        return twilio_error(401, 20003, default_message(20003));
    }
    let account = format!("/2010-04-01/Accounts/{}", shared.account_sid);
    match (&method, path.strip_prefix(&account)) {
        (&Method::GET, Some(".json")) => json_response(
            200,
            &json!({
                "sid": shared.account_sid,
                "friendly_name": "Talaria test account",
                "status": "active",
                "type": "Full",
            }),
        ),
        (&Method::POST, Some("/Messages.json")) => send(&shared, &form, failure).await,
        (&Method::GET, Some(rest))
            if rest.starts_with("/Messages/") && rest.contains("/Media/") =>
        {
            let sid = rest.rsplit('/').next().unwrap_or("");
            let known = shared.core.read().media.iter().any(|m| m.sid == sid);
            if !known {
                return twilio_error(
                    404,
                    20404,
                    &format!("The requested resource {path} was not found"),
                );
            }
            let mut r = Response::new(axum::body::Body::empty());
            *r.status_mut() = axum::http::StatusCode::TEMPORARY_REDIRECT;
            if let Ok(v) = HeaderValue::from_str(&format!("/cdn/{sid}?Expires=1700000000")) {
                r.headers_mut().insert(header::LOCATION, v);
            }
            r
        }
        _ => twilio_error(
            404,
            20404,
            &format!("The requested resource {path} was not found"),
        ),
    }
}

async fn send(shared: &Shared, form: &[(String, String)], failure: Option<Failure>) -> Response {
    let field = |name: &str| {
        form.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    match failure {
        Some(Failure::Error {
            status,
            code,
            message,
        }) => return twilio_error(status, code, &message),
        Some(Failure::RateLimited { retry_after }) => {
            let mut r = twilio_error(429, 20429, default_message(20429));
            if let Some(s) = retry_after
                && let Ok(v) = HeaderValue::from_str(&s.to_string())
            {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
            return r;
        }
        Some(Failure::Hang) => {
            shared.core.stopped().await;
            return twilio_error(503, 20500, default_message(20500));
        }
        None => {}
    }
    let to = field("To").unwrap_or("");
    let from = field("From").unwrap_or("");
    let Some(body) = field("Body").filter(|b| !b.is_empty()) else {
        return twilio_error(400, 21602, default_message(21602));
    };
    if !is_e164(to) {
        return twilio_error(
            400,
            21211,
            &format!("The 'To' number {to} is not a valid phone number."),
        );
    }
    if from != shared.phone_number {
        return twilio_error(400, 21606, default_message(21606));
    }
    if body.chars().count() > MAX_BODY_CHARS {
        return twilio_error(400, 21617, default_message(21617));
    }
    {
        let st = shared.core.read();
        if st.unsubscribed.contains(to) {
            return twilio_error(400, 21610, default_message(21610));
        }
        if st.landlines.contains(to) {
            return twilio_error(400, 21614, default_message(21614));
        }
    }
    let sid = {
        let mut st = shared.core.change();
        st.next_id += 1;
        let sid = format!("SM{:032x}", st.next_id);
        st.sent.push(SentSms {
            sid: sid.clone(),
            to: to.to_owned(),
            from: from.to_owned(),
            body: body.to_owned(),
            at: Instant::now(),
        });
        sid
    };
    json_response(
        201,
        &json!({
            "sid": sid,
            "account_sid": shared.account_sid,
            "to": to,
            "from": from,
            "body": body,
            "status": "queued",
            "direction": "outbound-api",
            "num_segments": segments(body).to_string(),
            "num_media": "0",
            "api_version": "2010-04-01",
            "error_code": Value::Null,
            "error_message": Value::Null,
            "price": Value::Null,
            "price_unit": "USD",
            "uri": format!("/2010-04-01/Accounts/{}/Messages/{sid}.json", shared.account_sid),
        }),
    )
}

/// Segments, roughly: printable ASCII counts as GSM-7 (160, then 153 a
/// segment), anything else makes the text UCS-2 (70, then 67).
fn segments(body: &str) -> usize {
    let gsm = body
        .chars()
        .all(|c| c == '\n' || c == '\r' || (' '..='~').contains(&c));
    let (units, single, each) = if gsm {
        (body.chars().count(), 160, 153)
    } else {
        (body.encode_utf16().count(), 70, 67)
    };
    if units <= single {
        1
    } else {
        units.div_ceil(each)
    }
}

fn is_e164(s: &str) -> bool {
    s.strip_prefix('+').is_some_and(|d| {
        (2..=15).contains(&d.len()) && d.chars().all(|c| c.is_ascii_digit()) && !d.starts_with('0')
    })
}

/// Twilio's signature: base64 of the HMAC-SHA1, keyed with the auth token,
/// of `url` followed by every parameter sorted by name, each name followed
/// by its value.
pub fn sign(auth_token: &str, url: &str, params: &[(String, String)]) -> String {
    let mut sorted: Vec<&(String, String)> = params.iter().collect();
    sorted.sort();
    let mut data = url.to_owned();
    for (k, v) in sorted {
        data.push_str(k);
        data.push_str(v);
    }
    let Ok(mut mac) = Hmac::<Sha1>::new_from_slice(auth_token.as_bytes()) else {
        unreachable!("HMAC takes keys of any length");
    };
    mac.update(data.as_bytes());
    BASE64.encode(mac.finalize().into_bytes())
}

/// One incoming SMS (or MMS) as Twilio posts it.
#[derive(Debug, Clone, PartialEq)]
pub struct InboundSms {
    /// The account the message arrived on.
    pub account_sid: String,
    /// The message's SID.
    pub message_sid: String,
    /// The sender's number.
    pub from: String,
    /// The number written to (the bot's).
    pub to: String,
    /// The message text.
    pub body: String,
    /// `(url, content type)` of each media item.
    pub media: Vec<(String, String)>,
    /// More fields, sent as given (`OptOutType`, ...).
    pub extra: Vec<(String, String)>,
}

impl InboundSms {
    /// A text from `from` to `to` with a fixed `MessageSid`.
    pub fn new(account_sid: &str, from: &str, to: &str, body: &str) -> InboundSms {
        InboundSms {
            account_sid: account_sid.to_owned(),
            message_sid: "SM00000000000000000000000000000001".to_owned(),
            from: from.to_owned(),
            to: to.to_owned(),
            body: body.to_owned(),
            media: Vec::new(),
            extra: Vec::new(),
        }
    }

    /// The same message under another `MessageSid`.
    pub fn with_sid(mut self, sid: &str) -> InboundSms {
        self.message_sid = sid.to_owned();
        self
    }

    /// The same message with a media item attached (an MMS).
    pub fn with_media(mut self, url: &str, content_type: &str) -> InboundSms {
        self.media.push((url.to_owned(), content_type.to_owned()));
        self
    }

    /// The same message with one more field.
    pub fn with_field(mut self, name: &str, value: &str) -> InboundSms {
        self.extra.push((name.to_owned(), value.to_owned()));
        self
    }

    /// The form fields Twilio sends for it, in Twilio's usual order.
    pub fn params(&self) -> Vec<(String, String)> {
        let mut p: Vec<(String, String)> = Vec::new();
        let mut add = |k: &str, v: &str| p.push((k.to_owned(), v.to_owned()));
        add("ToCountry", "US");
        add("ToState", "CA");
        add("SmsMessageSid", &self.message_sid);
        add("NumMedia", &self.media.len().to_string());
        add("ToCity", "");
        add("FromZip", "");
        add("SmsSid", &self.message_sid);
        add("FromState", "");
        add("SmsStatus", "received");
        add("FromCity", "");
        add("Body", &self.body);
        add("FromCountry", "US");
        add("To", &self.to);
        add("ToZip", "");
        add("NumSegments", &segments(&self.body).to_string());
        add("MessageSid", &self.message_sid);
        add("AccountSid", &self.account_sid);
        add("From", &self.from);
        add("ApiVersion", "2010-04-01");
        for (i, (url, kind)) in self.media.iter().enumerate() {
            add(&format!("MediaContentType{i}"), kind);
            add(&format!("MediaUrl{i}"), url);
        }
        for (k, v) in &self.extra {
            add(k, v);
        }
        p
    }
}

/// What the application answered a webhook with.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookReply {
    /// The HTTP status.
    pub status: u16,
    /// The `Content-Type` header, when set.
    pub content_type: Option<String>,
    /// The body (TwiML, or empty).
    pub body: String,
}

/// Posts inbound webhooks as Twilio does (see the module docs).
#[derive(Debug, Clone)]
pub struct WebhookSender {
    http: reqwest::Client,
    post_to: String,
    signed_url: String,
    auth_token: String,
}

impl WebhookSender {
    /// Posts to `post_to`, signing over `signed_url` with `auth_token`.
    pub fn new(post_to: &str, signed_url: &str, auth_token: &str) -> WebhookSender {
        WebhookSender {
            http: reqwest::Client::new(),
            post_to: post_to.to_owned(),
            signed_url: signed_url.to_owned(),
            auth_token: auth_token.to_owned(),
        }
    }

    /// The signature Twilio would put on `params`.
    pub fn signature(&self, params: &[(String, String)]) -> String {
        sign(&self.auth_token, &self.signed_url, params)
    }

    /// Posts `sms`, correctly signed.
    ///
    /// # Panics
    /// When the application cannot be reached at all.
    pub async fn send(&self, sms: &InboundSms) -> WebhookReply {
        let params = sms.params();
        let signature = self.signature(&params);
        self.post(&params, Some(&signature)).await
    }

    /// Posts `params` with this signature header (`None`: no header).
    ///
    /// # Panics
    /// When the application cannot be reached at all.
    pub async fn post(&self, params: &[(String, String)], signature: Option<&str>) -> WebhookReply {
        let body: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params.iter())
            .finish();
        let mut request = self
            .http
            .post(&self.post_to)
            .header(
                header::CONTENT_TYPE,
                "application/x-www-form-urlencoded; charset=UTF-8",
            )
            .header(header::USER_AGENT, "TwilioProxy/1.1")
            .body(body);
        if let Some(s) = signature {
            request = request.header("X-Twilio-Signature", s);
        }
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => panic!("cannot post the SMS webhook to {}: {e}", self.post_to),
        };
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response.text().await.unwrap_or_default();
        WebhookReply {
            status,
            content_type,
            body,
        }
    }
}

/// What the platform kit ([`crate::kit::sms`]) asks of the fake beyond
/// the tests' own API.
impl FakeTwilio {
    /// While `hang` holds, sends hang unanswered (until the server stops)
    /// and deliver nothing; clearing it lets the next send through.
    pub fn hang_sends(&self, hang: bool) {
        // More hangs than any test sends while it holds them; the ones
        // left are taken back when the test lets sends through again.
        const HANGS: usize = 64;
        let mut st = self.shared.core.change();
        st.failures.retain(|f| *f != Failure::Hang);
        if hang {
            for _ in 0..HANGS {
                st.failures.push(Failure::Hang);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs_like_twilios_documentation() {
        let params: Vec<(String, String)> = [
            ("CallSid", "CA1234567890ABCDE"),
            ("Caller", "+12349013030"),
            ("Digits", "1234"),
            ("From", "+12349013030"),
            ("To", "+18005551212"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        assert_eq!(
            sign(
                "12345",
                "https://mycompany.com/myapp.php?foo=1&bar=2",
                &params
            ),
            "0/KCTR6DLpKmkAf8muzZqo1nDgQ="
        );
    }

    #[test]
    fn segment_counts() {
        assert_eq!(segments("hi"), 1);
        assert_eq!(segments(&"a".repeat(161)), 2);
        assert_eq!(segments(&"é".repeat(71)), 2);
    }
}
