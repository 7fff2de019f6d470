//! Microsoft's side of a Graph change-notification app, for adapter and
//! end-to-end tests, written from the Graph documentation (change
//! notifications and their lifecycle events, the subscription resource,
//! the client-credentials and refresh-token grants, chatMessage and
//! message resources, posting chat messages, channel replies and mail
//! replies).
//!
//! [`FakeMsGraph`] serves on 127.0.0.1:
//!
//! - `POST /{tenant}/oauth2/v2.0/token`: `client_credentials` (the app's
//!   id and secret) → an app token; `refresh_token` (one it issued; a
//!   new one comes with each answer) → a delegated token; `{access_token,
//!   expires_in, token_type}`, else 400/401 `{error}`;
//! - `POST /v1.0/subscriptions`: checks the body, then performs Graph's
//!   validation POST (`?validationToken=…`, a token that needs URL
//!   decoding) to `notificationUrl` and `lifecycleNotificationUrl`, and
//!   refuses the create (400) unless each answered 200 `text/plain` with
//!   the decoded token within 10 s; the expiry must lie ahead of the
//!   fake's clock and within 4320 minutes;
//! - `PATCH`/`DELETE /v1.0/subscriptions/{id}`, `GET /v1.0/subscriptions`,
//!   `POST /v1.0/subscriptions/{id}/reauthorize` (204); a subscription
//!   whose expiry passed on the fake's clock is gone (404);
//! - resource GETs: `/chats/{id}`, `/chats/{id}/messages[/{id}]`,
//!   `/teams/{t}/channels/{c}/messages/{id}[/replies/{id}]`,
//!   `/users/{u}/messages/{id}`, `/users/{u}/mailFolders('Inbox')/messages`,
//!   `/me` (delegated), all needing a token it issued (401 otherwise);
//! - sends: `POST /chats/{id}/messages`, `POST
//!   /teams/{t}/channels/{c}/messages[/{id}/replies]` (201; an app-only
//!   token is refused 403, as Graph does outside migration),
//!   `POST /users/{u}/messages/{id}/reply` (`{comment}`, 202).
//!
//! Tests queue send failures (429 with `Retry-After`, a lost answer),
//! hang sends, move the fake's clock, and build notification and
//! lifecycle payloads ([`FakeMsGraph::notification`],
//! [`FakeMsGraph::lifecycle`]) for the kit to post. Every request is
//! recorded.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, Uri, header};
use axum::response::Response;
use serde_json::{Value, json};

use crate::fake::{Core, Faults, bind};
use crate::json_response;

/// The tenant.
pub const TENANT: &str = "tenant-0001";
/// The app registration's client id.
pub const CLIENT_ID: &str = "app-client-0001";
/// Its client secret, which no log may show.
pub const CLIENT_SECRET: &str = "fake-graph-client-secret-7f3a";
/// The first delegated refresh token.
pub const REFRESH_TOKEN: &str = "fake-refresh-token-0";
/// The user the delegated token posts as.
pub const BOT_USER: &str = "bot-user-0001";
/// The longest chat message body, in bytes.
pub const MAX_BODY_BYTES: usize = 28_000;
/// The longest subscription, in minutes.
pub const MAX_MINUTES: u64 = 4320;

/// A failure the next send gets.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// An error in Graph's shape.
    Status {
        /// The HTTP status.
        status: u16,
        /// `Retry-After`, in seconds.
        retry_after: Option<u64>,
    },
    /// The message is posted, then the answer is lost (503).
    LostAnswer,
}

/// What kind of send it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SentKind {
    /// `POST /chats/{id}/messages`.
    Chat,
    /// `POST /teams/{t}/channels/{c}/messages`.
    ChannelPost,
    /// `POST /teams/{t}/channels/{c}/messages/{id}/replies`.
    ChannelReply,
    /// `POST /users/{u}/messages/{id}/reply`.
    MailReply,
}

/// One message the fake accepted from the app.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    /// How it was sent.
    pub kind: SentKind,
    /// The chat id, `team/channel`, or mailbox user.
    pub place: String,
    /// The thread root (channel replies).
    pub thread: Option<String>,
    /// The mail replied to.
    pub reply_to: Option<String>,
    /// The text (the body's content, or the mail comment).
    pub text: String,
    /// Its new id.
    pub id: String,
    /// When it was accepted.
    pub at: Instant,
}

/// A subscription the fake holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Subscription {
    /// Its id.
    pub id: String,
    /// The resource.
    pub resource: String,
    /// The change types.
    pub change_type: String,
    /// Where notifications go.
    pub notification_url: String,
    /// Where lifecycle notifications go.
    pub lifecycle_url: Option<String>,
    /// The client state notifications carry.
    pub client_state: String,
    /// When it expires.
    pub expires: SystemTime,
}

/// One validation request the fake made.
#[derive(Debug, Clone, PartialEq)]
pub struct Handshake {
    /// The URL checked.
    pub url: String,
    /// The token sent (decoded form).
    pub token: String,
    /// What came back: status, content type, body.
    pub status: u16,
    /// The answer's content type.
    pub content_type: String,
    /// The answer's body.
    pub body: String,
    /// Whether it passed.
    pub ok: bool,
}

/// Any request, recorded as it arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The decoded path.
    pub path: String,
    /// The JSON body, `Null` for none.
    pub body: Value,
}

#[derive(Default)]
struct Book {
    next: u64,
    app_tokens: HashSet<String>,
    user_tokens: HashSet<String>,
    /// Refresh tokens that are good: issued ones stay good after they
    /// are redeemed, as Entra ID keeps them (until they expire).
    refresh_tokens: HashSet<String>,
    clock_offset: Duration,
    subs: Vec<Subscription>,
    handshakes: Vec<Handshake>,
    chats: HashMap<String, String>,
    /// Messages by their GET path under `/v1.0`.
    messages: HashMap<String, Value>,
    /// Message ids by their list path, oldest first.
    lists: HashMap<String, Vec<String>>,
    sent: Vec<Sent>,
    send_attempts: Vec<Instant>,
    failures: Faults<Failure>,
    reauthorized: Vec<String>,
    renewals: Vec<(String, SystemTime)>,
    creates: Vec<String>,
    deleted: Vec<String>,
}

impl Book {
    fn id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    fn now(&self) -> SystemTime {
        SystemTime::now() + self.clock_offset
    }

    /// Drops subscriptions whose expiry passed.
    fn expire(&mut self) {
        let now = self.now();
        self.subs.retain(|s| s.expires > now);
    }
}

struct Shared {
    core: Core<Book, Request>,
    client: reqwest::Client,
}

/// Microsoft's side (see the module docs).
pub struct FakeMsGraph {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

/// `t` as Graph writes times.
pub fn iso8601(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:07}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_nanos() / 100
    )
}

/// Reads `YYYY-MM-DDTHH:MM:SS[.f]Z`.
pub fn parse_iso8601(s: &str) -> Option<SystemTime> {
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d, h, mi, se) = (
        n(0..4)?,
        n(5..7)?,
        n(8..10)?,
        n(11..13)?,
        n(14..16)?,
        n(17..19)?,
    );
    if !s.ends_with('Z') || !(1..=12).contains(&m) {
        return None;
    }
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + se;
    u64::try_from(secs)
        .ok()
        .map(|s| UNIX_EPOCH + Duration::from_secs(s))
}

fn graph_error(status: u16, code: &str, message: &str) -> Response {
    json_response(
        status,
        &json!({"error": {"code": code, "message": message, "innerError": {"request-id": "fake"}}}),
    )
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = s.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl FakeMsGraph {
    /// Starts the server on 127.0.0.1.
    ///
    /// # Panics
    /// When no port can be bound.
    pub fn start() -> FakeMsGraph {
        let (listener, addr) = bind().expect("a port on 127.0.0.1");
        let book = Book {
            refresh_tokens: HashSet::from([REFRESH_TOKEN.to_owned()]),
            ..Book::default()
        };
        let shared = Arc::new(Shared {
            core: Core::new(book),
            client: reqwest::Client::new(),
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        shared
            .core
            .serve("fake-msgraph", listener, app)
            .expect("the fake Graph serves");
        FakeMsGraph { addr, shared }
    }

    /// `http://127.0.0.1:PORT`: the token authority.
    pub fn authority_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The Graph root, `…/v1.0`.
    pub fn graph_url(&self) -> String {
        format!("http://{}/v1.0", self.addr)
    }

    /// Every request.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.core.requests()
    }

    /// The live subscriptions (expired ones dropped).
    pub fn subscriptions(&self) -> Vec<Subscription> {
        let mut book = self.shared.core.change();
        book.expire();
        book.subs.clone()
    }

    /// The live subscription for `resource`.
    pub fn subscription(&self, resource: &str) -> Option<Subscription> {
        self.subscriptions()
            .into_iter()
            .find(|s| s.resource == resource)
    }

    /// Every validation request made, in order.
    pub fn handshakes(&self) -> Vec<Handshake> {
        self.shared.core.read().handshakes.clone()
    }

    /// The ids of the subscriptions created, in order.
    pub fn creates(&self) -> Vec<String> {
        self.shared.core.read().creates.clone()
    }

    /// The renewals accepted: id and new expiry.
    pub fn renewals(&self) -> Vec<(String, SystemTime)> {
        self.shared.core.read().renewals.clone()
    }

    /// The subscriptions reauthorized.
    pub fn reauthorized(&self) -> Vec<String> {
        self.shared.core.read().reauthorized.clone()
    }

    /// The subscriptions deleted.
    pub fn deleted(&self) -> Vec<String> {
        self.shared.core.read().deleted.clone()
    }

    /// Forgets subscription `id`, as Graph does before a
    /// `subscriptionRemoved` event.
    pub fn remove_subscription(&self, id: &str) {
        self.shared.core.change().subs.retain(|s| s.id != id);
    }

    /// Moves the fake's clock `by` ahead.
    pub fn advance_clock(&self, by: Duration) {
        self.shared.core.change().clock_offset += by;
    }

    /// The fake's "now".
    pub fn now(&self) -> SystemTime {
        self.shared.core.read().now()
    }

    /// Every message sent, in order.
    pub fn sent(&self) -> Vec<Sent> {
        self.shared.core.read().sent.clone()
    }

    /// When each send arrived.
    pub fn send_attempts(&self) -> Vec<Instant> {
        self.shared.core.read().send_attempts.clone()
    }

    /// The next send gets `failure`.
    pub fn fail_next_send(&self, failure: Failure) {
        self.shared.core.change().failures.push(failure);
    }

    /// While on, sends hang and post nothing; off, the held ones get 502.
    pub fn hang_sends(&self, on: bool) {
        self.shared.core.set_hang(on);
    }

    /// Waits until `n` messages were sent.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_sent(&self, n: usize, timeout: Duration) -> Vec<Sent> {
        self.shared
            .core
            .wait_len("Graph sends", n, timeout, |b| &b.sent)
            .await
    }

    /// Waits until `n` sends arrived.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_send_attempts(&self, n: usize, timeout: Duration) {
        self.shared
            .core
            .wait_len("Graph send attempts", n, timeout, |b| &b.send_attempts)
            .await;
    }

    /// Waits until `n` requests `matches` accepts arrived.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_requests(
        &self,
        what: &str,
        n: usize,
        timeout: Duration,
        matches: impl Fn(&Request) -> bool,
    ) -> Vec<Request> {
        self.shared
            .core
            .wait_requests(what, n, timeout, matches)
            .await
    }

    /// Makes chat `id` of `chat_type` (`oneOnOne`, `group`, `meeting`).
    pub fn add_chat(&self, id: &str, chat_type: &str) {
        self.shared
            .core
            .change()
            .chats
            .insert(id.to_owned(), chat_type.to_owned());
    }

    fn message_json(
        book: &mut Book,
        from: (&str, &str),
        text: &str,
        mention_app: bool,
        extra: Value,
    ) -> (String, Value) {
        let n = book.id();
        let id = format!("{}", 1_765_000_000_000u64 + n);
        let (content, mentions) = if mention_app {
            (
                format!("<p><at id=\"0\">Talaria</at> {}</p>", html_escape(text)),
                json!([{"id": 0, "mentionText": "Talaria",
                        "mentioned": {"application": {"id": CLIENT_ID, "displayName": "Talaria",
                                                      "applicationIdentityType": "bot"}}}]),
            )
        } else {
            (format!("<p>{}</p>", html_escape(text)), json!([]))
        };
        let mut msg = json!({
            "id": id, "replyToId": null, "etag": id, "messageType": "message",
            "createdDateTime": iso8601(book.now()), "lastModifiedDateTime": iso8601(book.now()),
            "deletedDateTime": null, "subject": null, "importance": "normal", "locale": "en-us",
            "from": {"application": null, "device": null,
                     "user": {"@odata.type": "#microsoft.graph.teamworkUserIdentity",
                              "id": from.0, "displayName": from.1, "userIdentityType": "aadUser"}},
            "body": {"contentType": "html", "content": content},
            "attachments": [], "mentions": mentions, "reactions": [],
        });
        if let (Some(m), Some(e)) = (msg.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                m.insert(k.clone(), v.clone());
            }
        }
        (id, msg)
    }

    /// A message from `from` (id, name) in chat `chat`; returns its id
    /// and the resource a notification names it by.
    pub fn post_chat_message(
        &self,
        chat: &str,
        from: (&str, &str),
        text: &str,
        mention_app: bool,
    ) -> (String, String) {
        let mut book = self.shared.core.change();
        let (id, msg) =
            Self::message_json(&mut book, from, text, mention_app, json!({"chatId": chat}));
        book.messages
            .insert(format!("/chats/{chat}/messages/{id}"), msg);
        book.lists
            .entry(format!("/chats/{chat}/messages"))
            .or_default()
            .push(id.clone());
        let resource = format!("chats('{chat}')/messages('{id}')");
        (id, resource)
    }

    /// A channel post (or, with `parent`, a reply in its thread); returns
    /// its id and resource.
    pub fn post_channel_message(
        &self,
        team: &str,
        channel: &str,
        parent: Option<&str>,
        from: (&str, &str),
        text: &str,
        mention_app: bool,
    ) -> (String, String) {
        let mut book = self.shared.core.change();
        let extra =
            json!({"replyToId": parent, "channelIdentity": {"teamId": team, "channelId": channel}});
        let (id, msg) = Self::message_json(&mut book, from, text, mention_app, extra);
        let base = format!("/teams/{team}/channels/{channel}/messages");
        let (path, resource) = match parent {
            Some(p) => (
                format!("{base}/{p}/replies/{id}"),
                format!("teams('{team}')/channels('{channel}')/messages('{p}')/replies('{id}')"),
            ),
            None => {
                book.lists.entry(base.clone()).or_default().push(id.clone());
                (
                    format!("{base}/{id}"),
                    format!("teams('{team}')/channels('{channel}')/messages('{id}')"),
                )
            }
        };
        book.messages.insert(path, msg);
        (id, resource)
    }

    /// A mail from `address` arriving in `user`'s inbox; returns its id
    /// and resource.
    pub fn receive_mail(
        &self,
        user: &str,
        address: &str,
        subject: &str,
        text: &str,
        conversation: &str,
    ) -> (String, String) {
        let mut book = self.shared.core.change();
        let n = book.id();
        let id = format!("AAMkAGI2-{n}=");
        let msg = json!({
            "id": id, "conversationId": conversation, "internetMessageId": format!("<m{n}@example.com>"),
            "subject": subject, "isDraft": false, "receivedDateTime": iso8601(book.now()),
            "from": {"emailAddress": {"name": address, "address": address}},
            "body": {"contentType": "text", "content": text},
        });
        book.messages
            .insert(format!("/users/{user}/messages/{id}"), msg);
        book.lists
            .entry(format!("/users/{user}/mailFolders('Inbox')/messages"))
            .or_default()
            .push(id.clone());
        (id.clone(), format!("Users/{user}/Messages/{id}"))
    }

    /// A change notification collection for `items` (resource,
    /// notification id) under `sub`, with `client_state` instead of the
    /// subscription's when given (a tampered one).
    pub fn notification(
        &self,
        sub: &Subscription,
        items: &[(&str, &str)],
        client_state: Option<&str>,
    ) -> Value {
        let value: Vec<Value> = items
            .iter()
            .map(|(resource, id)| {
                let message = resource
                    .rsplit("('")
                    .next()
                    .map(|s| s.trim_end_matches("')"))
                    .unwrap_or("");
                json!({
                    "id": id, "subscriptionId": sub.id,
                    "subscriptionExpirationDateTime": iso8601(sub.expires),
                    "changeType": "created", "resource": resource,
                    "clientState": client_state.unwrap_or(&sub.client_state),
                    "tenantId": TENANT,
                    "resourceData": {"@odata.type": "#Microsoft.Graph.chatMessage",
                                     "@odata.id": resource, "id": message},
                })
            })
            .collect();
        json!({ "value": value })
    }

    /// A lifecycle notification collection: `event` for `sub`.
    pub fn lifecycle(&self, sub: &Subscription, event: &str, client_state: Option<&str>) -> Value {
        json!({"value": [{
            "subscriptionId": sub.id,
            "subscriptionExpirationDateTime": iso8601(sub.expires),
            "tenantId": TENANT,
            "clientState": client_state.unwrap_or(&sub.client_state),
            "lifecycleEvent": event,
        }]})
    }
}

impl Drop for FakeMsGraph {
    fn drop(&mut self) {
        self.shared.core.stop();
    }
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

enum Bearer {
    App,
    User,
    None,
}

fn bearer(book: &Book, headers: &HeaderMap) -> Bearer {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match token {
        Some(t) if book.app_tokens.contains(t) => Bearer::App,
        Some(t) if book.user_tokens.contains(t) => Bearer::User,
        _ => Bearer::None,
    }
}

fn unauthenticated() -> Response {
    graph_error(
        401,
        "InvalidAuthenticationToken",
        "Access token is empty or invalid.",
    )
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = percent_decode(uri.path());
    let json_body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let sending = method == Method::POST
        && (path.starts_with("/v1.0/chats/") && path.ends_with("/messages")
            || path.starts_with("/v1.0/teams/")
                && (path.ends_with("/messages") || path.ends_with("/replies"))
            || path.starts_with("/v1.0/users/") && path.ends_with("/reply"));
    let hung = sending && shared.core.hanging();
    shared.core.record(Request {
        method: method.to_string(),
        path: path.clone(),
        body: json_body.clone(),
    });
    if sending {
        shared.core.change().send_attempts.push(Instant::now());
        if hung {
            shared.core.held().await;
            return graph_error(502, "BadGateway", "Bad Gateway");
        }
    }
    if method == Method::POST && path == format!("/{TENANT}/oauth2/v2.0/token") {
        return token(&shared, &body);
    }
    let Some(rest) = path.strip_prefix("/v1.0") else {
        return graph_error(404, "NotFound", "Resource not found.");
    };
    let rest = rest.to_owned();
    if rest == "/subscriptions" && method == Method::POST {
        return create(&shared, &headers, &json_body).await;
    }
    let mut book = shared.core.change();
    let who = bearer(&book, &headers);
    if matches!(who, Bearer::None) {
        return unauthenticated();
    }
    if sending {
        return send(&mut book, &rest, who, &json_body);
    }
    if let Some(sub) = rest.strip_prefix("/subscriptions") {
        return subscriptions(&mut book, &method, sub, &json_body);
    }
    if method != Method::GET {
        return graph_error(405, "MethodNotAllowed", "Method not allowed.");
    }
    if rest == "/me" {
        return match who {
            Bearer::User => json_response(200, &json!({"id": BOT_USER, "displayName": "Talaria"})),
            _ => graph_error(
                400,
                "BadRequest",
                "/me request is only valid with delegated authentication flow.",
            ),
        };
    }
    if let Some(chat) = rest.strip_prefix("/chats/").filter(|c| !c.contains('/')) {
        return match book.chats.get(chat) {
            Some(t) => json_response(200, &json!({"id": chat, "chatType": t, "topic": null})),
            None => graph_error(404, "NotFound", "Chat not found."),
        };
    }
    if let Some(msg) = book.messages.get(&rest) {
        return json_response(200, msg);
    }
    if let Some(ids) = book.lists.get(&rest) {
        let top = uri
            .query()
            .and_then(|q| {
                form_urlencoded::parse(q.as_bytes())
                    .find(|(k, _)| k == "$top")
                    .and_then(|(_, v)| v.parse::<usize>().ok())
            })
            .unwrap_or(20);
        let base = rest.trim_end_matches("/messages").to_owned();
        let value: Vec<Value> = ids
            .iter()
            .rev()
            .take(top)
            .filter_map(|id| {
                let key = if base.contains("/mailFolders(") {
                    let user = base
                        .trim_start_matches("/users/")
                        .split('/')
                        .next()
                        .unwrap_or("");
                    format!("/users/{user}/messages/{id}")
                } else {
                    format!("{base}/messages/{id}")
                };
                book.messages.get(&key).cloned()
            })
            .collect();
        return json_response(200, &json!({ "value": value }));
    }
    graph_error(404, "NotFound", "The requested resource does not exist.")
}

fn token(shared: &Shared, body: &[u8]) -> Response {
    let form: HashMap<String, String> = form_urlencoded::parse(body).into_owned().collect();
    let get = |k: &str| form.get(k).map(String::as_str).unwrap_or("");
    if get("client_id") != CLIENT_ID || get("client_secret") != CLIENT_SECRET {
        return json_response(
            401,
            &json!({"error": "invalid_client", "error_description": "AADSTS7000215: Invalid client secret provided."}),
        );
    }
    let mut book = shared.core.change();
    let n = book.id();
    match get("grant_type") {
        "client_credentials" if !get("scope").is_empty() => {
            let t = format!("app-token-{n}");
            book.app_tokens.insert(t.clone());
            json_response(
                200,
                &json!({"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": t}),
            )
        }
        "refresh_token" if book.refresh_tokens.contains(get("refresh_token")) => {
            let t = format!("user-token-{n}");
            let next = format!("fake-refresh-token-{n}");
            book.user_tokens.insert(t.clone());
            book.refresh_tokens.insert(next.clone());
            json_response(
                200,
                &json!({"token_type": "Bearer", "scope": get("scope"), "expires_in": 3599,
                        "access_token": t, "refresh_token": next}),
            )
        }
        "refresh_token" => json_response(
            400,
            &json!({"error": "invalid_grant", "error_description": "AADSTS70000: The refresh token is invalid."}),
        ),
        _ => json_response(400, &json!({"error": "unsupported_grant_type"})),
    }
}

fn sub_json(s: &Subscription) -> Value {
    json!({
        "id": s.id, "resource": s.resource, "changeType": s.change_type,
        "notificationUrl": s.notification_url, "lifecycleNotificationUrl": s.lifecycle_url,
        "expirationDateTime": iso8601(s.expires), "clientState": s.client_state,
        "latestSupportedTlsVersion": "v1_2", "applicationId": CLIENT_ID,
    })
}

/// The body's expiry when it lies ahead of the fake's clock and within
/// the longest lifetime, else what Graph says.
fn expiry_in_range(book: &Book, body: &Value) -> Result<SystemTime, &'static str> {
    let at = body["expirationDateTime"]
        .as_str()
        .and_then(parse_iso8601)
        .ok_or("expirationDateTime is missing or invalid.")?;
    let now = book.now();
    if at <= now || at > now + Duration::from_secs(MAX_MINUTES * 60 + 60) {
        return Err("Subscription expiration can only be 4320 minutes in the future.");
    }
    Ok(at)
}

/// Graph's validation request to `url`; whether it passed.
async fn validate(shared: &Shared, url: &str, n: u64) -> bool {
    let token = format!("Validation: Testing client application {n} + more/checks & done");
    let encoded: String = form_urlencoded::byte_serialize(token.as_bytes()).collect();
    let sep = if url.contains('?') { '&' } else { '?' };
    let answer = shared
        .client
        .post(format!("{url}{sep}validationToken={encoded}"))
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .timeout(Duration::from_secs(10))
        .send()
        .await;
    let (status, content_type, body) = match answer {
        Ok(r) => {
            let status = r.status().as_u16();
            let ct = r
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            (status, ct, r.text().await.unwrap_or_default())
        }
        Err(e) => (0, String::new(), e.to_string()),
    };
    let ok = status == 200 && content_type.starts_with("text/plain") && body == token;
    shared.core.change().handshakes.push(Handshake {
        url: url.to_owned(),
        token,
        status,
        content_type,
        body,
        ok,
    });
    ok
}

async fn create(shared: &Shared, headers: &HeaderMap, body: &Value) -> Response {
    let (n, expires) = {
        let mut book = shared.core.change();
        if !matches!(bearer(&book, headers), Bearer::App | Bearer::User) {
            return unauthenticated();
        }
        let expires = match expiry_in_range(&book, body) {
            Ok(at) => at,
            Err(why) => return graph_error(400, "ExtensionError", why),
        };
        (book.id(), expires)
    };
    let field = |k: &str| body[k].as_str().unwrap_or("").to_owned();
    let (resource, change_type, url, state) = (
        field("resource"),
        field("changeType"),
        field("notificationUrl"),
        field("clientState"),
    );
    let lifecycle = body["lifecycleNotificationUrl"].as_str().map(str::to_owned);
    if resource.is_empty() || change_type.is_empty() || url.is_empty() {
        return graph_error(
            400,
            "InvalidRequest",
            "resource, changeType and notificationUrl are required.",
        );
    }
    if state.chars().count() > 128 {
        return graph_error(
            400,
            "InvalidRequest",
            "clientState is longer than 128 characters.",
        );
    }
    let teams = resource.contains("chats") || resource.contains("teams");
    if teams && lifecycle.is_none() && expires > SystemTime::now() + Duration::from_secs(3600) {
        return graph_error(
            400,
            "InvalidRequest",
            "lifecycleNotificationUrl is required when expirationDateTime is more than 1 hour away.",
        );
    }
    let mut urls = vec![url.clone()];
    urls.extend(lifecycle.clone());
    for u in &urls {
        if !validate(shared, u, n).await {
            return graph_error(
                400,
                "ValidationError",
                "Subscription validation request failed. Notification endpoint must respond with \
                 200 OK to validation request.",
            );
        }
    }
    let sub = Subscription {
        id: format!("sub-{n:04}-7d2b"),
        resource,
        change_type,
        notification_url: url,
        lifecycle_url: lifecycle,
        client_state: state,
        expires,
    };
    let mut book = shared.core.change();
    book.creates.push(sub.id.clone());
    book.subs.push(sub.clone());
    json_response(201, &sub_json(&sub))
}

fn subscriptions(book: &mut Book, method: &Method, rest: &str, body: &Value) -> Response {
    book.expire();
    if rest.is_empty() && *method == Method::GET {
        let value: Vec<Value> = book.subs.iter().map(sub_json).collect();
        return json_response(200, &json!({ "value": value }));
    }
    let rest = rest.trim_start_matches('/');
    let (id, action) = rest.split_once('/').unwrap_or((rest, ""));
    let Some(index) = book.subs.iter().position(|s| s.id == id) else {
        return graph_error(404, "ResourceNotFound", "The object was not found.");
    };
    match (method.as_str(), action) {
        ("GET", "") => json_response(200, &sub_json(&book.subs[index])),
        ("PATCH", "") => {
            let at = match expiry_in_range(book, body) {
                Ok(at) => at,
                Err(why) => return graph_error(400, "ExtensionError", why),
            };
            book.subs[index].expires = at;
            book.renewals.push((id.to_owned(), at));
            json_response(200, &sub_json(&book.subs[index]))
        }
        ("DELETE", "") => {
            book.subs.remove(index);
            book.deleted.push(id.to_owned());
            let mut r = Response::new(axum::body::Body::empty());
            *r.status_mut() = axum::http::StatusCode::NO_CONTENT;
            r
        }
        ("POST", "reauthorize") => {
            book.reauthorized.push(id.to_owned());
            let mut r = Response::new(axum::body::Body::empty());
            *r.status_mut() = axum::http::StatusCode::NO_CONTENT;
            r
        }
        _ => graph_error(405, "MethodNotAllowed", "Method not allowed."),
    }
}

fn send(book: &mut Book, rest: &str, who: Bearer, body: &Value) -> Response {
    let parts: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
    let (kind, place, thread, reply_to) = match parts.as_slice() {
        ["chats", chat, "messages"] => (SentKind::Chat, chat.to_string(), None, None),
        ["teams", t, "channels", c, "messages"] => {
            (SentKind::ChannelPost, format!("{t}/{c}"), None, None)
        }
        ["teams", t, "channels", c, "messages", root, "replies"] => (
            SentKind::ChannelReply,
            format!("{t}/{c}"),
            Some(root.to_string()),
            None,
        ),
        ["users", u, "messages", m, "reply"] => (
            SentKind::MailReply,
            u.to_string(),
            None,
            Some(m.to_string()),
        ),
        _ => return graph_error(404, "NotFound", "Resource not found."),
    };
    if kind != SentKind::MailReply && !matches!(who, Bearer::User) {
        return graph_error(
            403,
            "Forbidden",
            "Message POST is allowed in application-only context only for import purposes.",
        );
    }
    let failure = book.failures.take();
    let lost = failure == Some(Failure::LostAnswer);
    if let Some(Failure::Status {
        status,
        retry_after,
    }) = failure
    {
        let mut r = graph_error(status, "TooManyRequests", "injected failure");
        if let Some(secs) = retry_after
            && let Ok(v) = HeaderValue::from_str(&secs.to_string())
        {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return r;
    }
    let text = match kind {
        SentKind::MailReply => body["comment"].as_str(),
        _ => body["body"]["content"].as_str(),
    }
    .unwrap_or("")
    .to_owned();
    if text.is_empty() || text.len() > MAX_BODY_BYTES {
        return graph_error(400, "BadRequest", "The message body is empty or too large.");
    }
    match (kind, &thread) {
        (SentKind::ChannelReply, Some(root)) => {
            let (t, c) = place.split_once('/').unwrap_or(("", ""));
            if !book
                .messages
                .contains_key(&format!("/teams/{t}/channels/{c}/messages/{root}"))
            {
                return graph_error(404, "NotFound", "The thread's root message does not exist.");
            }
        }
        (SentKind::Chat, _) if !book.chats.contains_key(&place) => {
            return graph_error(404, "NotFound", "Chat not found.");
        }
        _ => {}
    }
    let n = book.id();
    let id = format!("{}", 1_765_500_000_000u64 + n);
    book.sent.push(Sent {
        kind,
        place: place.clone(),
        thread: thread.clone(),
        reply_to,
        text: text.clone(),
        id: id.clone(),
        at: Instant::now(),
    });
    if kind == SentKind::Chat {
        // Graph keeps the post in the chat, where a notification names it.
        let msg = json!({"id": id, "messageType": "message", "chatId": place,
                         "createdDateTime": iso8601(book.now()), "deletedDateTime": null,
                         "from": {"user": {"id": BOT_USER, "displayName": "Talaria"}},
                         "body": {"contentType": "text", "content": text}, "mentions": []});
        book.messages
            .insert(format!("/chats/{place}/messages/{id}"), msg);
    }
    if lost {
        return graph_error(
            503,
            "ServiceUnavailable",
            "The service is currently unavailable.",
        );
    }
    if kind == SentKind::MailReply {
        let mut r = Response::new(axum::body::Body::empty());
        *r.status_mut() = axum::http::StatusCode::ACCEPTED;
        return r;
    }
    json_response(
        201,
        &json!({"id": id, "replyToId": thread, "messageType": "message",
                "createdDateTime": iso8601(book.now()),
                "from": {"user": {"id": BOT_USER, "displayName": "Talaria"}},
                "body": {"contentType": body["body"]["contentType"], "content": text}}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip() {
        let t = UNIX_EPOCH + Duration::from_secs(1_796_634_000);
        assert_eq!(iso8601(t), "2026-12-07T09:00:00.0000000Z");
        assert_eq!(parse_iso8601(&iso8601(t)), Some(t));
    }
}
