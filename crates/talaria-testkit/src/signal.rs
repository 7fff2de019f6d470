//! A fake signal-cli REST API server (`bbernhard/signal-cli-rest-api`) on
//! 127.0.0.1, for adapter and end-to-end tests.
//!
//! [`FakeSignal`] speaks the server's wire format over real HTTP and a
//! real WebSocket, in either of its two receive styles (chosen at start,
//! as the server's `MODE` is):
//!
//! - `GET /v1/about`: versions, build, `mode` (`json-rpc` or `normal`)
//!   and capabilities;
//! - `GET /v1/accounts`: the registered accounts;
//! - `GET /v1/receive/{number}`: in [`Mode::JsonRpc`] a WebSocket on which
//!   every message arrives as one text frame
//!   (`{"envelope": {...}, "account": "+..."}`); in [`Mode::Normal`] a
//!   plain request answered with the JSON array of what arrived since the
//!   last call (`400 {"error": ...}` for an account the server does not
//!   hold);
//! - `POST /v2/send` (`number`, `recipients`, `message`, optional
//!   `quote_timestamp`/`quote_author`, optional `base64_attachments`, each
//!   `data:<mime>;filename=<name>;base64,<data>` or bare base64, decoded
//!   and recorded): `201 {"timestamp": "..."}`, or `400 {"error": ...}`
//!   for an unknown account or recipient, an undecodable attachment, or
//!   neither text nor attachment;
//! - `GET /v1/attachments/{id}`: the bytes of a file a test registered
//!   ([`FakeSignal::add_file`]), `404 {"error": ...}` for any other id;
//! - `PUT`/`DELETE /v1/typing-indicator/{number}` (`recipient`): 204.
//!
//! Messages are queued per account until a receiver takes them: a socket
//! that is connected gets them at once, otherwise they wait for the next
//! socket or poll, so a receiver that reconnects finds what arrived
//! meanwhile. A message handed to a socket or a poll is gone from the
//! queue, as it is from signal-cli's. Recipients the server knows are the
//! people and groups that wrote (plus [`FakeSignal::add_contact`]).
//!
//! The server runs on its own thread with its own runtime and stops when
//! the [`FakeSignal`] is dropped. Tests push messages
//! ([`push`](FakeSignal::push), [`push_raw`](FakeSignal::push_raw),
//! [`redeliver`](FakeSignal::redeliver)), inspect what the bot did
//! ([`sent`](FakeSignal::sent), [`typing`](FakeSignal::typing),
//! [`connections`](FakeSignal::connections)) and break things
//! ([`drop_connection`](FakeSignal::drop_connection),
//! [`fail_next_sends_with_429`](FakeSignal::fail_next_sends_with_429),
//! [`fail_next_send_with`](FakeSignal::fail_next_send_with)).

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::routing::{get, post, put};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::fake::{Core, Faults, bind, started};

use handlers::{
    about, accounts, attachment, not_found, receive_poll, receive_socket, send, typing,
};

mod handlers;

/// The server's receive style (its `MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `json-rpc`: `/v1/receive/{number}` is a WebSocket.
    JsonRpc,
    /// `normal`: `/v1/receive/{number}` is polled.
    Normal,
}

/// Someone who writes to the bot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    /// The phone number, in E.164 form.
    pub number: String,
    /// The account's ACI (UUID).
    pub uuid: String,
    /// The profile name shown as the sender's name.
    pub name: String,
}

impl Person {
    /// A person with a number and UUID derived from `n` (1 to 9999).
    pub fn numbered(n: u32, name: &str) -> Person {
        Person {
            number: format!("+1555000{n:04}"),
            uuid: format!("{n:08x}-aaaa-4bbb-8ccc-{n:012x}"),
            name: name.to_owned(),
        }
    }
}

/// A message for [`FakeSignal::push`] to deliver.
#[derive(Debug, Clone, PartialEq)]
pub struct NewMessage {
    /// Who sends it.
    pub from: Person,
    /// The message text.
    pub text: String,
    /// The group's internal id (base64) and name, for a group message.
    pub group: Option<(String, String)>,
    /// Assigned (increasing) when `None`.
    pub timestamp: Option<i64>,
    /// The envelope's `attachments`, as signal-cli reports them.
    pub attachments: Vec<Value>,
    /// The envelope's `mentions`, as signal-cli reports them.
    pub mentions: Vec<Value>,
    /// The envelope's `quote` (the message answered), when any.
    pub quote: Option<Value>,
}

impl NewMessage {
    /// A direct message from `from`.
    pub fn dm(from: &Person, text: &str) -> NewMessage {
        NewMessage {
            from: from.clone(),
            text: text.to_owned(),
            group: None,
            timestamp: None,
            attachments: Vec::new(),
            mentions: Vec::new(),
            quote: None,
        }
    }

    /// The same message in the group with internal id `group_id`.
    pub fn in_group(mut self, group_id: &str, name: &str) -> NewMessage {
        self.group = Some((group_id.to_owned(), name.to_owned()));
        self
    }

    /// The same message with a mention of `number` in front, as Signal
    /// writes it: U+FFFC in the text and an entry in `mentions`.
    pub fn mentioning(mut self, number: &str) -> NewMessage {
        self.text = format!("\u{fffc} {}", self.text);
        for m in &mut self.mentions {
            if let Some(start) = m["start"].as_u64() {
                m["start"] = json!(start + 2);
            }
        }
        self.mentions.push(json!({"name": number, "number": number,
                                  "uuid": null, "start": 0, "length": 1}));
        self
    }

    /// The same message quoting the message `timestamp` by `author`.
    pub fn quoting(mut self, timestamp: i64, author: &str, text: &str) -> NewMessage {
        self.quote = Some(
            json!({"id": timestamp, "author": author, "authorNumber": author,
                                 "authorUuid": null, "text": text, "attachments": []}),
        );
        self
    }

    /// The same message with an attachment.
    pub fn with_attachment(mut self, content_type: &str, filename: &str, size: u64) -> NewMessage {
        self.attachments
            .push(json!({"contentType": content_type, "filename": filename,
            "id": format!("att{}", self.attachments.len()), "size": size,
            "width": null, "height": null, "caption": null, "uploadTimestamp": null}));
        self
    }

    /// The same message with a file registered by [`FakeSignal::add_file`]
    /// (a voice note has no file name in Signal's payloads).
    pub fn with_file(
        mut self,
        id: &str,
        content_type: &str,
        filename: Option<&str>,
        size: u64,
    ) -> NewMessage {
        self.attachments.push(
            json!({"contentType": content_type, "filename": filename, "id": id,
            "size": size, "width": null, "height": null, "caption": null,
            "uploadTimestamp": null}),
        );
        self
    }

    /// The same message with a fixed timestamp.
    pub fn at(mut self, timestamp: i64) -> NewMessage {
        self.timestamp = Some(timestamp);
        self
    }
}

/// One message the fake accepted from the bot.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    /// The account it was sent from.
    pub number: String,
    /// The recipients' numbers or UUIDs (empty for a group send).
    pub recipients: Vec<String>,
    /// The text exactly as sent.
    pub message: String,
    /// The timestamp of the message quoted, when any.
    pub quote_timestamp: Option<i64>,
    /// The author of the message quoted, when any.
    pub quote_author: Option<String>,
    /// The files sent with it (`base64_attachments`), decoded.
    pub attachments: Vec<SentAttachment>,
    /// The timestamp the fake gave the message.
    pub timestamp: i64,
    /// When the fake received it.
    pub at: Instant,
}

/// One file of a send's `base64_attachments`.
#[derive(Debug, Clone, PartialEq)]
pub struct SentAttachment {
    /// The type the data URI named (`None` for bare base64).
    pub mime: Option<String>,
    /// The `filename=` the data URI named.
    pub filename: Option<String>,
    /// The decoded bytes.
    pub bytes: Vec<u8>,
}

/// One typing call.
#[derive(Debug, Clone, PartialEq)]
pub struct Typing {
    /// The account typing.
    pub number: String,
    /// Who sees the indicator.
    pub recipient: String,
    /// `PUT` shows, `DELETE` hides.
    pub show: bool,
    /// When the fake received it.
    pub at: Instant,
}

/// One accepted WebSocket connection.
#[derive(Debug, Clone, PartialEq)]
pub struct Connection {
    /// The account whose receive stream was opened.
    pub number: String,
    /// When the fake accepted it.
    pub at: Instant,
}

/// Any request, recorded when it arrived (before failures).
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The HTTP method (`GET`, `POST`, ...).
    pub method: String,
    /// The request path.
    pub path: String,
    /// The JSON body (`null` when there was none or it did not parse).
    pub body: Value,
    /// When the fake received it.
    pub at: Instant,
}

enum Outgoing {
    Frame(String),
    /// Cut the TCP connection without a close frame.
    Drop,
    /// Stop reading and writing, as a hung server or a dead NAT would.
    Silence,
}

#[derive(Default)]
struct Book {
    accounts: Vec<String>,
    /// Per account: frames not yet handed to a receiver.
    queues: HashMap<String, VecDeque<String>>,
    /// Per account: the socket receiving now (its number and queue).
    live: HashMap<String, (u64, mpsc::UnboundedSender<Outgoing>)>,
    /// Queues of silenced connections, held so they stay open.
    silenced: Vec<mpsc::UnboundedSender<Outgoing>>,
    /// Every frame pushed, by timestamp, for `redeliver`.
    pushed: HashMap<i64, (String, String)>,
    /// Frames handed over (to a socket or a poll), in order.
    handed: Vec<String>,
    contacts: HashSet<String>,
    /// Files the server keeps, by attachment id.
    files: HashMap<String, Vec<u8>>,
    groups: HashSet<String>,
    sent: Vec<Sent>,
    typing: Vec<Typing>,
    connections: Vec<Connection>,
    polls: usize,
    next_conn: u64,
    last_ts: i64,
    /// `Retry-After` of each 429 the next sends get.
    fail_429: Faults<Option<u64>>,
    fail_status: Faults<(u16, String)>,
}

impl Book {
    /// A new timestamp, later than every one before (Signal's ids).
    fn timestamp(&mut self) -> i64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        self.last_ts = now.max(self.last_ts + 1);
        self.last_ts
    }

    /// Hands `frame` to `account`'s socket, or queues it.
    fn deliver(&mut self, account: &str, frame: String) {
        if let Some((_, tx)) = self.live.get(account) {
            if tx.send(Outgoing::Frame(frame.clone())).is_ok() {
                self.handed.push(frame);
                return;
            }
            self.live.remove(account);
        }
        self.queues
            .entry(account.to_owned())
            .or_default()
            .push_back(frame);
    }
}

struct Shared {
    mode: Mode,
    core: Core<Book, Request>,
}

/// A fake signal-cli REST API server (see the module docs).
pub struct FakeSignal {
    addr: SocketAddr,
    account: String,
    shared: Arc<Shared>,
}

impl FakeSignal {
    /// Starts the server on 127.0.0.1 with an ephemeral port, holding
    /// `account`.
    ///
    /// # Panics
    /// When no local port can be bound (a broken test environment).
    pub async fn start(account: &str, mode: Mode) -> FakeSignal {
        started("the fake Signal REST API", Self::try_start(account, mode))
    }

    /// Like [`Self::start`], returning the error instead of panicking.
    pub fn try_start(account: &str, mode: Mode) -> std::io::Result<FakeSignal> {
        let (listener, addr) = bind()?;
        let shared = Arc::new(Shared {
            mode,
            core: Core::new(Book {
                accounts: vec![account.to_owned()],
                ..Book::default()
            }),
        });
        let receive = match mode {
            Mode::JsonRpc => get(receive_socket),
            Mode::Normal => get(receive_poll),
        };
        let app = Router::new()
            .route("/v1/about", get(about))
            .route("/v1/accounts", get(accounts))
            .route("/v1/receive/{number}", receive)
            .route("/v2/send", post(send))
            .route("/v1/attachments/{id}", get(attachment))
            .route("/v1/typing-indicator/{number}", put(typing).delete(typing))
            .fallback(not_found)
            .with_state(shared.clone());
        shared.core.serve("fake-signal", listener, app)?;
        Ok(FakeSignal {
            addr,
            account: account.to_owned(),
            shared,
        })
    }

    /// `http://127.0.0.1:PORT`: the REST API root (`SIGNAL_HTTP_URL`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The account the server holds.
    pub fn account(&self) -> &str {
        &self.account
    }

    /// The REST API's recipient name of the group with internal id
    /// `group_id`: `group.` and the base64 of the id's text.
    pub fn group_recipient(group_id: &str) -> String {
        format!("group.{}", base64(group_id.as_bytes()))
    }

    /// Keeps `bytes` as signal-cli keeps a received file; the id (with
    /// `extension`) to put in a message ([`NewMessage::with_file`]).
    pub fn add_file(&self, bytes: &[u8], extension: &str) -> String {
        let mut st = self.shared.core.change();
        let id = format!("fAk3{}-{}.{extension}", st.files.len(), st.timestamp());
        st.files.insert(id.clone(), bytes.to_vec());
        id
    }

    /// Makes a number, UUID or group recipient known to sends.
    pub fn add_contact(&self, recipient: &str) {
        self.shared
            .core
            .change()
            .contacts
            .insert(recipient.to_owned());
    }

    /// Delivers `message` to the account (or queues it). Returns its
    /// timestamp.
    pub fn push(&self, message: NewMessage) -> i64 {
        let mut st = self.shared.core.change();
        let ts = message.timestamp.unwrap_or_else(|| st.timestamp());
        st.last_ts = st.last_ts.max(ts);
        st.contacts.insert(message.from.number.clone());
        st.contacts.insert(message.from.uuid.clone());
        let mut data = json!({
            "timestamp": ts, "message": message.text, "expiresInSeconds": 0,
            "viewOnce": false,
        });
        if let Some((id, name)) = &message.group {
            st.groups.insert(FakeSignal::group_recipient(id));
            data["groupInfo"] = json!({"groupId": id, "groupName": name,
                                       "revision": 1, "type": "DELIVER"});
        }
        if !message.attachments.is_empty() {
            data["attachments"] = json!(message.attachments);
        }
        if !message.mentions.is_empty() {
            data["mentions"] = json!(message.mentions);
        }
        if let Some(q) = &message.quote {
            data["quote"] = q.clone();
        }
        let item = json!({"envelope": {
            "source": message.from.number, "sourceNumber": message.from.number,
            "sourceUuid": message.from.uuid, "sourceName": message.from.name,
            "sourceDevice": 1, "timestamp": ts, "serverReceivedTimestamp": ts + 5,
            "serverDeliveredTimestamp": ts + 9, "dataMessage": data,
        }, "account": self.account});
        let frame = item.to_string();
        st.pushed.insert(ts, (self.account.clone(), frame.clone()));
        st.deliver(&self.account, frame);
        ts
    }

    /// Delivers any item (an envelope of another kind, a malformed one) to
    /// the account as it is.
    pub fn push_raw(&self, item: Value) {
        self.shared
            .core
            .change()
            .deliver(&self.account, item.to_string());
    }

    /// Delivers the message pushed with `timestamp` once more, as signal-cli
    /// does when it could not confirm a message to the Signal servers.
    ///
    /// # Panics
    /// When no such message was pushed.
    pub fn redeliver(&self, timestamp: i64) {
        let mut st = self.shared.core.change();
        let Some((account, frame)) = st.pushed.get(&timestamp).cloned() else {
            panic!("no message with timestamp {timestamp} was pushed");
        };
        st.deliver(&account, frame);
    }

    /// Every message the bot sent, in order.
    pub fn sent(&self) -> Vec<Sent> {
        self.shared.core.read().sent.clone()
    }

    /// Every `POST /v2/send` request, answered or not.
    pub fn send_attempts(&self) -> Vec<Request> {
        self.shared.core.requests_where(is_send)
    }

    /// Every typing call.
    pub fn typing(&self) -> Vec<Typing> {
        self.shared.core.read().typing.clone()
    }

    /// Every accepted WebSocket connection.
    pub fn connections(&self) -> Vec<Connection> {
        self.shared.core.read().connections.clone()
    }

    /// Every request.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.core.requests()
    }

    /// `GET /v1/receive` calls answered in [`Mode::Normal`].
    pub fn polls(&self) -> usize {
        self.shared.core.read().polls
    }

    /// Frames handed to a receiver so far.
    pub fn handed_over(&self) -> usize {
        self.shared.core.read().handed.len()
    }

    /// Frames waiting for a receiver.
    pub fn queued(&self) -> usize {
        self.shared
            .core
            .read()
            .queues
            .values()
            .map(VecDeque::len)
            .sum()
    }

    /// Whether a WebSocket is receiving for the account now.
    pub fn is_connected(&self) -> bool {
        self.shared.core.read().live.contains_key(&self.account)
    }

    /// Waits until at least `n` messages were sent and returns them all.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_sent(&self, n: usize, timeout: Duration) -> Vec<Sent> {
        self.shared
            .core
            .wait_len("sent messages", n, timeout, |st| &st.sent)
            .await
    }

    /// Waits until at least `n` WebSocket connections were accepted.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_connections(&self, n: usize, timeout: Duration) -> Vec<Connection> {
        self.shared
            .core
            .wait_len("WebSocket connections", n, timeout, |st| &st.connections)
            .await
    }

    /// Waits until at least `n` polls were answered.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_polls(&self, n: usize, timeout: Duration) -> usize {
        let what = format!("{n} polls");
        self.shared
            .core
            .wait(
                &what,
                timeout,
                |st| (st.polls >= n).then_some(st.polls),
                |st| st.polls,
            )
            .await
    }

    /// Waits until at least `n` typing calls arrived.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_typing(&self, n: usize, timeout: Duration) -> Vec<Typing> {
        self.shared
            .core
            .wait_len("typing calls", n, timeout, |st| &st.typing)
            .await
    }

    /// The next `POST /v2/send` gets 429 (with `Retry-After` when given).
    /// Calls queue up.
    pub fn fail_next_sends_with_429(&self, retry_after: Option<u64>) {
        self.shared.core.change().fail_429.push(retry_after);
    }

    /// The next `POST /v2/send` gets `status` with `{"error": text}`.
    /// Calls queue up (after any queued 429s).
    pub fn fail_next_send_with(&self, status: u16, text: &str) {
        self.shared
            .core
            .change()
            .fail_status
            .push((status, text.to_owned()));
    }

    /// Cuts the account's WebSocket without a close frame. What is pushed
    /// afterwards waits for the next connection.
    pub fn drop_connection(&self) {
        let mut st = self.shared.core.change();
        if let Some((_, tx)) = st.live.remove(&self.account) {
            let _ = tx.send(Outgoing::Drop);
        }
    }

    /// The account's WebSocket stops reading and writing (pings go
    /// unanswered) but stays open, as with a hung server. It no longer
    /// counts as receiving: what is pushed afterwards waits for the next
    /// connection.
    pub fn go_silent(&self) {
        let mut st = self.shared.core.change();
        if let Some((_, tx)) = st.live.remove(&self.account) {
            let _ = tx.send(Outgoing::Silence);
            // Kept, or the connection would see its queue close.
            st.silenced.push(tx);
        }
    }

    /// Stops the server (also on drop). Open connections are cut.
    pub fn shutdown(&self) {
        self.shared.core.stop();
    }
}

/// Whether `r` is a `POST /v2/send`, answered or not.
fn is_send(r: &Request) -> bool {
    r.method == "POST" && r.path == "/v2/send"
}

impl Drop for FakeSignal {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Standard base64 with padding (the REST API's group names).
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;

impl FakeSignal {
    /// While set, sends are recorded as attempts but hang unanswered and
    /// are never delivered; clearing it (or stopping the server) answers
    /// them with a 502, as a proxy that lost the request would.
    pub fn hang_send(&self, hang: bool) {
        self.shared.core.set_hang(hang);
    }

    /// Waits until at least `n` send requests arrived (answered or not).
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_send_attempts(&self, n: usize, timeout: Duration) -> Vec<Request> {
        self.shared
            .core
            .wait_requests("send requests", n, timeout, |r| {
                r.method == "POST" && r.path == "/v2/send"
            })
            .await
    }
}
