//! A fake iLink bot API (Weixin personal accounts) on 127.0.0.1, built
//! from the fact sheet's description of the protocol and its checklist
//! (the API is not publicly documented; the shapes agree with the
//! community ports).
//!
//! Every call is a `POST /ilink/bot/<endpoint>` with a JSON body that
//! carries `base_info.channel_version`, and the headers
//! `AuthorizationType: ilink_bot_token`, `Authorization: Bearer <token>`,
//! `X-WECHAT-UIN` (base64 of the decimal text of a uint32) and
//! `iLink-App-Id`. The HTTP status is always 200: failures are `ret` /
//! `errcode` / `errmsg` in the body. A call missing a header or
//! `base_info` gets `ret: -1` and is recorded as malformed.
//!
//! - `getupdates` `{get_updates_buf}` holds up to the configured time
//!   for messages after the cursor and answers them with a new cursor
//!   (`cur-<n>`), so a client that saves the cursor never sees a message
//!   twice; a re-delivery is a message queued again. It can answer `-14`
//!   (session expired) or `-2` (rate limited) instead.
//! - `sendmessage` `{msg}` records text items; a `context_token` must be
//!   the peer's latest (a stale one gets `-14`); a `client_id` seen
//!   before is answered as a success without sending again.
//! - `getconfig` answers a `typing_ticket`; `sendtyping` records it.
//! - Media: `getuploadurl` `{filekey, media_type, to_user_id, rawsize,
//!   rawfilemd5, filesize, no_need_thumb, aeskey}` checks every field
//!   (`filesize` must be the PKCS#7-padded size, `aeskey` 32 hex digits)
//!   and answers an `upload_param` (or an `upload_full_url`); the CDN
//!   (`{base}/c2c`) takes `POST /upload?encrypted_query_param&filekey`
//!   with the ciphertext, decrypts it with the key named in
//!   `getuploadurl` (AES-128-ECB, PKCS#7), checks its size and MD5, and
//!   answers the download handle in the `x-encrypted-param` header; a
//!   media item sent must name such a handle with `aes_key` = base64 of
//!   the key's hex text. `GET /download?encrypted_query_param` serves
//!   the ciphertext of files users sent.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aes::Aes128;
use aes::cipher::block_padding::Pkcs7;
use aes::cipher::generic_array::GenericArray;
use aes::cipher::{BlockDecryptMut, BlockEncryptMut, KeyInit};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{get, post};
use base64::Engine;
use md5::{Digest, Md5};
use serde_json::{Value, json};

use crate::fake::{Core, Faults, bind, started};

/// The bot's account id.
pub const ACCOUNT_ID: &str = "e9b0c1d2a3f4@im.bot";

/// One text the bot sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    /// The peer it went to.
    pub to: String,
    /// The text.
    pub text: String,
    /// The context token it echoed.
    pub context_token: Option<String>,
    /// Its `client_id`.
    pub client_id: String,
    /// When the fake accepted it.
    pub at: Instant,
}

/// A file the bot sent in a media item, decrypted.
#[derive(Debug, Clone, PartialEq)]
pub struct MediaSent {
    /// The peer it went to.
    pub to: String,
    /// The item type: 2 image, 3 voice, 4 file, 5 video.
    pub item_type: i64,
    /// `file_item.file_name`, for files.
    pub name: Option<String>,
    /// The plain bytes.
    pub bytes: Vec<u8>,
    /// The item as sent.
    pub item: Value,
    /// When the fake accepted it.
    pub at: Instant,
}

/// One upload the CDN accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct CdnUpload {
    /// `getuploadurl`'s `media_type`.
    pub media_type: i64,
    /// Its `to_user_id`.
    pub to: String,
    /// The key named in `getuploadurl` (32 hex digits).
    pub aeskey_hex: String,
    /// The ciphertext as it arrived.
    pub ciphertext: Vec<u8>,
    /// The handle answered in `x-encrypted-param`.
    pub handle: String,
}

struct PendingUpload {
    filekey: String,
    key: [u8; 16],
    media_type: i64,
    to: String,
    rawsize: u64,
    md5: String,
    filesize: u64,
}

struct Stored {
    key: [u8; 16],
    to: String,
    bytes: Vec<u8>,
}

/// One call, as it arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The endpoint (`getupdates`, `sendmessage`, ...).
    pub endpoint: String,
    /// The body.
    pub body: Value,
    /// The headers and `base_info` were all as iLink wants them.
    pub well_formed: bool,
    /// When it arrived.
    pub at: Instant,
}

/// What the next poll answers instead of messages.
#[derive(Debug, Clone, Copy)]
enum PollFault {
    Code(i64),
}

struct Book {
    token: String,
    hold: Duration,
    queue: Vec<Value>,
    next_msg: u64,
    /// Peer -> their latest context token.
    tokens: HashMap<String, String>,
    next_token: u64,
    sent: Vec<Sent>,
    client_ids: HashSet<String>,
    typing: Vec<(String, String)>,
    tickets: u64,
    polls: usize,
    poll_faults: Faults<PollFault>,
    send_faults: Faults<i64>,
    expired: bool,
    /// Ciphertexts users' files are served as, by download parameter.
    cdn_files: HashMap<String, Vec<u8>>,
    next_media: u64,
    pending: HashMap<String, PendingUpload>,
    stored: HashMap<String, Stored>,
    uploads: Vec<CdnUpload>,
    media_sent: Vec<MediaSent>,
    /// `getuploadurl` answers this as `upload_full_url` instead of a
    /// parameter (`{cdn}` is replaced by the fake's CDN root).
    full_url: Option<String>,
}

struct Shared {
    core: Core<Book, Request>,
}

/// A fake iLink bot API (see the module docs).
pub struct FakeWeixin {
    shared: Arc<Shared>,
    addr: SocketAddr,
}

impl FakeWeixin {
    /// Starts the fake accepting `token`, holding an empty poll `hold`.
    ///
    /// # Panics
    /// When no local port can be bound.
    pub async fn start(token: &str, hold: Duration) -> FakeWeixin {
        started("the fake iLink API", Self::try_start(token, hold))
    }

    /// Like [`Self::start`], returning the error instead.
    pub fn try_start(token: &str, hold: Duration) -> std::io::Result<FakeWeixin> {
        let (listener, addr) = bind()?;
        let shared = Arc::new(Shared {
            core: Core::new(Book {
                token: token.to_owned(),
                hold,
                queue: Vec::new(),
                next_msg: 7_448_678_501_208_393_000,
                tokens: HashMap::new(),
                next_token: 0,
                sent: Vec::new(),
                client_ids: HashSet::new(),
                typing: Vec::new(),
                tickets: 0,
                polls: 0,
                poll_faults: Faults::default(),
                send_faults: Faults::default(),
                expired: false,
                cdn_files: HashMap::new(),
                next_media: 0,
                pending: HashMap::new(),
                stored: HashMap::new(),
                uploads: Vec::new(),
                media_sent: Vec::new(),
                full_url: None,
            }),
        });
        let app = Router::new()
            .route("/ilink/bot/{endpoint}", post(endpoint))
            .route("/c2c/upload", post(cdn_upload))
            .route("/c2c/download", get(cdn_download))
            .with_state(shared.clone());
        shared.core.serve("fake-ilink", listener, app)?;
        Ok(FakeWeixin { shared, addr })
    }

    /// `http://127.0.0.1:PORT`: the adapter's `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A text message from `peer`; returns its message id. Each message
    /// brings the peer a new context token, as a new exchange does.
    pub fn push_text(&self, peer: &str, text: &str) -> String {
        let mut st = self.shared.core.change();
        st.next_msg += 1;
        st.next_token += 1;
        let id = st.next_msg;
        let token = format!("ctx-{peer}-{}", st.next_token);
        st.tokens.insert(peer.to_owned(), token.clone());
        let m = json!({
            "message_id": id, "from_user_id": peer, "to_user_id": ACCOUNT_ID,
            "client_id": format!("wx-{id}"), "create_time_ms": 1_765_000_000_000u64 + id % 1000,
            "session_id": format!("s-{peer}"), "message_type": 1, "message_state": 2,
            "context_token": token,
            "item_list": [{"type": 1, "text_item": {"text": text}}],
        });
        st.queue.push(m);
        id.to_string()
    }

    /// `http://127.0.0.1:PORT/c2c`: the adapter's `cdn_base_url`.
    pub fn cdn_base_url(&self) -> String {
        format!("http://{}/c2c", self.addr)
    }

    /// Puts `ciphertext` on the CDN; returns the download parameter that
    /// names it (with characters a URL must escape, as real ones have).
    pub fn put_cdn_file(&self, ciphertext: Vec<u8>) -> String {
        let mut st = self.shared.core.change();
        st.next_media += 1;
        let param = format!("dl+{}/Zm9v=={}", st.next_media, st.next_media);
        st.cdn_files.insert(param.clone(), ciphertext);
        param
    }

    /// A message from `peer` whose `item_list` is `items` (a new context
    /// token comes with it); returns its id.
    pub fn push_items(&self, peer: &str, items: Value) -> String {
        let mut st = self.shared.core.change();
        st.next_msg += 1;
        st.next_token += 1;
        let id = st.next_msg;
        let token = format!("ctx-{peer}-{}", st.next_token);
        st.tokens.insert(peer.to_owned(), token.clone());
        let m = json!({
            "message_id": id, "from_user_id": peer, "to_user_id": ACCOUNT_ID,
            "client_id": format!("wx-{id}"), "create_time_ms": 1_765_000_000_000u64 + id % 1000,
            "session_id": format!("s-{peer}"), "message_type": 1, "message_state": 2,
            "context_token": token, "item_list": items,
        });
        st.queue.push(m);
        id.to_string()
    }

    /// A file from `peer` as an item of `item_type` (2 image, 3 voice, 4
    /// file, 5 video), encrypted here under a fresh key handed over as
    /// base64 of its hex text, after a text item `caption` when there is
    /// one. Returns the message id.
    pub fn push_file(
        &self,
        peer: &str,
        item_type: i64,
        name: Option<&str>,
        bytes: &[u8],
        caption: &str,
    ) -> String {
        let key: [u8; 16] = std::array::from_fn(|i| (i as u8).wrapping_mul(37).wrapping_add(11));
        let param = self.put_cdn_file(encrypt(&key, bytes));
        let media = json!({"encrypt_query_param": param,
            "aes_key": base64::engine::general_purpose::STANDARD.encode(hex(&key)),
            "encrypt_type": 1});
        let item = match item_type {
            2 => json!({"type": 2, "image_item": {"media": media, "mid_size": bytes.len()}}),
            3 => json!({"type": 3, "voice_item": {"media": media, "encode_type": 6,
                "playtime": 1500}}),
            5 => json!({"type": 5, "video_item": {"media": media, "video_size": bytes.len()}}),
            _ => json!({"type": 4, "file_item": {"media": media,
                "file_name": name.unwrap_or("file.bin"), "len": bytes.len().to_string()}}),
        };
        let mut items = Vec::new();
        if !caption.is_empty() {
            items.push(json!({"type": 1, "text_item": {"text": caption}}));
        }
        items.push(item);
        self.push_items(peer, Value::Array(items))
    }

    /// `getuploadurl` answers `upload_full_url` = `url` (`{cdn}` stands
    /// for the fake's CDN root) instead of `upload_param`.
    pub fn answer_full_upload_url(&self, url: &str) {
        let url = url.replace("{cdn}", &self.cdn_base_url());
        self.shared.core.change().full_url = Some(url);
    }

    /// Every upload the CDN accepted.
    pub fn uploads(&self) -> Vec<CdnUpload> {
        self.shared.core.read().uploads.clone()
    }

    /// Every media item sent, decrypted.
    pub fn media_sent(&self) -> Vec<MediaSent> {
        self.shared.core.read().media_sent.clone()
    }

    /// Waits until at least `n` media items were sent.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_media(&self, n: usize, timeout: Duration) -> Vec<MediaSent> {
        self.shared
            .core
            .wait_len("media sent", n, timeout, |st| &st.media_sent)
            .await
    }

    /// Queues any message object as the next delivery.
    pub fn push_raw(&self, m: Value) {
        self.shared.core.change().queue.push(m);
    }

    /// Delivers the message `id` again (a copy queued after the cursor).
    pub fn redeliver(&self, id: &str) {
        let mut st = self.shared.core.change();
        let copy = st
            .queue
            .iter()
            .find(|m| match &m["message_id"] {
                Value::Number(n) => n.to_string() == id,
                Value::String(s) => s == id,
                _ => false,
            })
            .cloned();
        if let Some(m) = copy {
            st.queue.push(m);
        }
    }

    /// The next poll answers `code` (`-14` expired, `-2` rate limited).
    pub fn fail_next_poll(&self, code: i64) {
        self.shared
            .core
            .change()
            .poll_faults
            .push(PollFault::Code(code));
    }

    /// From now on every call answers `-14`, as after the login expired.
    pub fn expire_session(&self) {
        self.shared.core.change().expired = true;
    }

    /// The next send answers `code`.
    pub fn fail_next_send(&self, code: i64) {
        self.shared.core.change().send_faults.push(code);
    }

    /// The peer's latest context token.
    pub fn context_token(&self, peer: &str) -> Option<String> {
        self.shared.core.read().tokens.get(peer).cloned()
    }

    /// Gives the peer a new context token, making the old one stale.
    pub fn rotate_context_token(&self, peer: &str) {
        let mut st = self.shared.core.change();
        st.next_token += 1;
        let token = format!("ctx-{peer}-{}", st.next_token);
        st.tokens.insert(peer.to_owned(), token);
    }

    /// While set, sends hang unanswered and are never delivered.
    pub fn hang_send(&self, hang: bool) {
        self.shared.core.set_hang(hang);
    }

    /// Every text accepted.
    pub fn sent(&self) -> Vec<Sent> {
        self.shared.core.read().sent.clone()
    }

    /// Every typing call: (peer, ticket).
    pub fn typing(&self) -> Vec<(String, String)> {
        self.shared.core.read().typing.clone()
    }

    /// How many polls were answered.
    pub fn polls(&self) -> usize {
        self.shared.core.read().polls
    }

    /// Every call so far.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.core.requests()
    }

    /// The send calls so far, answered or not.
    pub fn send_attempts(&self) -> Vec<Request> {
        self.shared
            .core
            .requests_where(|r| r.endpoint == "sendmessage")
    }

    /// Waits until at least `n` polls were answered.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_polls(&self, n: usize, timeout: Duration) {
        self.shared
            .core
            .wait(
                &format!("{n} polls"),
                timeout,
                |st| (st.polls >= n).then_some(()),
                |st| st.polls,
            )
            .await;
    }

    /// Waits until at least `n` texts were accepted.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_sent(&self, n: usize, timeout: Duration) -> Vec<Sent> {
        self.shared
            .core
            .wait_len("sent texts", n, timeout, |st| &st.sent)
            .await
    }

    /// Waits until at least `n` sends arrived.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_send_attempts(&self, n: usize, timeout: Duration) -> Vec<Request> {
        self.shared
            .core
            .wait_requests("send attempts", n, timeout, |r| r.endpoint == "sendmessage")
            .await
    }

    /// Stops the server (also on drop).
    pub fn shutdown(&self) {
        self.shared.core.stop();
    }
}

impl Drop for FakeWeixin {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Whether the call carries what iLink wants: the headers, and
/// `base_info` in the body.
fn well_formed(headers: &HeaderMap, body: &Value) -> bool {
    let h = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let uin_ok = h("x-wechat-uin")
        .and_then(|u| base64::engine::general_purpose::STANDARD.decode(u).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .is_some_and(|d| d.parse::<u32>().is_ok());
    h("authorizationtype") == Some("ilink_bot_token")
        && h("ilink-app-id").is_some_and(|v| !v.is_empty())
        && uin_ok
        && body
            .pointer("/base_info/channel_version")
            .and_then(Value::as_str)
            .is_some_and(|v| !v.is_empty())
}

fn answer(v: Value) -> Response {
    crate::json_response(200, &v)
}

fn failed(code: i64, message: &str) -> Response {
    answer(json!({"ret": code, "errcode": code, "errmsg": message}))
}

async fn endpoint(
    State(shared): State<Arc<Shared>>,
    Path(endpoint): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let ok = well_formed(&headers, &body);
    shared.core.record(Request {
        endpoint: endpoint.clone(),
        body: body.clone(),
        well_formed: ok,
        at: Instant::now(),
    });
    if !ok {
        return failed(-1, "malformed request");
    }
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    {
        let st = shared.core.read();
        if bearer.as_deref() != Some(st.token.as_str()) || st.expired {
            drop(st);
            if endpoint == "getupdates" {
                shared.core.change().polls += 1;
            }
            return failed(-14, "session timeout");
        }
    }
    match endpoint.as_str() {
        "getupdates" => poll(&shared, &body).await,
        "sendmessage" => send(&shared, &body).await,
        "getuploadurl" => upload_url(&shared, &body),
        "getconfig" => {
            let mut st = shared.core.change();
            st.tickets += 1;
            answer(json!({"ret": 0, "typing_ticket": format!("ticket-{}", st.tickets)}))
        }
        "sendtyping" => {
            let peer = body["ilink_user_id"].as_str().unwrap_or("").to_owned();
            let ticket = body["typing_ticket"].as_str().unwrap_or("").to_owned();
            if !ticket.starts_with("ticket-") {
                return failed(-1, "bad typing ticket");
            }
            shared.core.change().typing.push((peer, ticket));
            answer(json!({"ret": 0}))
        }
        _ => failed(-1, "unknown endpoint"),
    }
}

/// The index after which a cursor's messages start.
fn position(cursor: &str) -> usize {
    cursor
        .strip_prefix("cur-")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

async fn poll(shared: &Shared, body: &Value) -> Response {
    let from = position(body["get_updates_buf"].as_str().unwrap_or(""));
    let (hold, fault) = {
        let mut st = shared.core.change();
        (st.hold, st.poll_faults.take())
    };
    if let Some(PollFault::Code(code)) = fault {
        shared.core.change().polls += 1;
        return failed(
            code,
            if code == -2 {
                "rate limited"
            } else {
                "session timeout"
            },
        );
    }
    let batch = shared
        .core
        .changes()
        .until(hold, || {
            let st = shared.core.read();
            (st.queue.len() > from).then(|| st.queue[from..].to_vec())
        })
        .await
        .unwrap_or_default();
    let mut st = shared.core.change();
    st.polls += 1;
    let next = from + batch.len();
    answer(json!({
        "ret": 0, "errcode": 0, "errmsg": "", "msgs": batch,
        "get_updates_buf": format!("cur-{next}"),
        "longpolling_timeout_ms": u64::try_from(st.hold.as_millis()).unwrap_or(35_000),
    }))
}

async fn send(shared: &Shared, body: &Value) -> Response {
    if shared.core.hanging() {
        shared.core.held().await;
        return failed(-1, "system busy");
    }
    let msg = &body["msg"];
    let to = msg["to_user_id"].as_str().unwrap_or("").to_owned();
    let client_id = msg["client_id"].as_str().unwrap_or("").to_owned();
    let items: Vec<&Value> = msg["item_list"].as_array().into_iter().flatten().collect();
    let text: Vec<&str> = items
        .iter()
        .filter(|i| i["type"] == 1)
        .filter_map(|i| i.pointer("/text_item/text").and_then(Value::as_str))
        .collect();
    let media: Vec<&Value> = items
        .iter()
        .copied()
        .filter(|i| matches!(i["type"].as_i64(), Some(2..=5)))
        .collect();
    let mut st = shared.core.change();
    if let Some(code) = st.send_faults.take() {
        return failed(code, "injected failure");
    }
    if to.is_empty()
        || client_id.is_empty()
        || (text.is_empty() && media.is_empty())
        || msg["message_type"] != 2
    {
        return failed(-1, "invalid msg");
    }
    let mut files = Vec::new();
    for item in &media {
        match sent_file(&st, &to, item) {
            Some(f) => files.push(f),
            None => return failed(-1, "invalid media item"),
        }
    }
    let token = msg["context_token"].as_str().map(str::to_owned);
    if let Some(t) = &token
        && st.tokens.get(&to) != Some(t)
    {
        return failed(-14, "context token expired");
    }
    if !st.client_ids.insert(client_id.clone()) {
        // The same message again: already sent.
        return answer(json!({"ret": 0}));
    }
    st.media_sent.extend(files);
    if !text.is_empty() {
        st.sent.push(Sent {
            to,
            text: text.join(""),
            context_token: token,
            client_id,
            at: Instant::now(),
        });
    }
    answer(json!({"ret": 0}))
}

/// A media item's file, when it names a handle the CDN gave for `to`
/// with that upload's key.
fn sent_file(st: &Book, to: &str, item: &Value) -> Option<MediaSent> {
    let item_type = item["type"].as_i64()?;
    let field = match item_type {
        2 => "image_item",
        3 => "voice_item",
        4 => "file_item",
        _ => "video_item",
    };
    let body = item.get(field)?;
    let handle = body.pointer("/media/encrypt_query_param")?.as_str()?;
    let key_text = body.pointer("/media/aes_key")?.as_str()?;
    let key_hex = base64::engine::general_purpose::STANDARD
        .decode(key_text)
        .ok()
        .and_then(|k| String::from_utf8(k).ok())?;
    let stored = st.stored.get(handle)?;
    if key_hex != hex(&stored.key) || stored.to != to || body.pointer("/media/encrypt_type")? != 1 {
        return None;
    }
    let name = body
        .get("file_name")
        .and_then(Value::as_str)
        .map(str::to_owned);
    if item_type == 4 && name.as_deref().is_none_or(str::is_empty) {
        return None;
    }
    Some(MediaSent {
        to: to.to_owned(),
        item_type,
        name,
        bytes: stored.bytes.clone(),
        item: item.clone(),
        at: Instant::now(),
    })
}

fn upload_url(shared: &Shared, body: &Value) -> Response {
    let text = |k: &str| body[k].as_str().unwrap_or("").to_owned();
    let is_hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    let (filekey, to, md5, aeskey) = (
        text("filekey"),
        text("to_user_id"),
        text("rawfilemd5"),
        text("aeskey"),
    );
    let media_type = body["media_type"].as_i64().unwrap_or(0);
    let (Some(rawsize), Some(filesize)) = (body["rawsize"].as_u64(), body["filesize"].as_u64())
    else {
        return failed(-1, "rawsize and filesize must be numbers");
    };
    let key = decode_hex(&aeskey);
    let valid = !filekey.is_empty()
        && filekey.bytes().all(|b| b.is_ascii_alphanumeric())
        && (1..=4).contains(&media_type)
        && !to.is_empty()
        && is_hex(&md5, 32)
        && filesize == (rawsize / 16 + 1) * 16
        && key.is_some();
    let Some(key) = key.filter(|_| valid) else {
        return failed(-1, "invalid getuploadurl parameters");
    };
    let mut st = shared.core.change();
    st.next_media += 1;
    let param = format!("up+{}/{}", st.next_media, filekey);
    st.pending.insert(
        param.clone(),
        PendingUpload {
            filekey,
            key,
            media_type,
            to,
            rawsize,
            md5: md5.to_ascii_lowercase(),
            filesize,
        },
    );
    match &st.full_url {
        Some(url) => {
            let url = format!(
                "{url}?encrypted_query_param={}&filekey={}",
                form_urlencoded::byte_serialize(param.as_bytes()).collect::<String>(),
                st.pending[&param].filekey
            );
            answer(json!({"ret": 0, "upload_full_url": url}))
        }
        None => answer(json!({"ret": 0, "upload_param": param})),
    }
}

fn cdn_error(status: u16, why: &str) -> Response {
    let mut r = crate::json_response(status, &json!({}));
    if let Ok(v) = axum::http::HeaderValue::from_str(why) {
        r.headers_mut().insert("x-error-message", v);
    }
    r
}

async fn cdn_upload(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<HashMap<String, String>>,
    bytes: Bytes,
) -> Response {
    let param = q.get("encrypted_query_param").cloned().unwrap_or_default();
    let filekey = q.get("filekey").cloned().unwrap_or_default();
    let mut st = shared.core.change();
    let Some(p) = st.pending.get(&param).filter(|p| p.filekey == filekey) else {
        return cdn_error(400, "unknown upload parameter or file key");
    };
    if bytes.len() as u64 != p.filesize {
        return cdn_error(400, "size does not match filesize");
    }
    let Some(plain) = decrypt(&p.key, &bytes) else {
        return cdn_error(400, "does not decrypt with aeskey");
    };
    if plain.len() as u64 != p.rawsize || hex(&Md5::digest(&plain)) != p.md5 {
        return cdn_error(400, "rawsize or rawfilemd5 does not match");
    }
    let Some(p) = st.pending.remove(&param) else {
        return cdn_error(400, "unknown upload parameter");
    };
    st.next_media += 1;
    let handle = format!("enc+{}/{}==", st.next_media, p.filekey);
    st.uploads.push(CdnUpload {
        media_type: p.media_type,
        to: p.to.clone(),
        aeskey_hex: hex(&p.key),
        ciphertext: bytes.to_vec(),
        handle: handle.clone(),
    });
    st.stored.insert(
        handle.clone(),
        Stored {
            key: p.key,
            to: p.to,
            bytes: plain,
        },
    );
    let mut r = crate::json_response(200, &json!({}));
    if let Ok(v) = axum::http::HeaderValue::from_str(&handle) {
        r.headers_mut().insert("x-encrypted-param", v);
    }
    r
}

async fn cdn_download(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let param = q.get("encrypted_query_param").cloned().unwrap_or_default();
    let body = shared.core.read().cdn_files.get(&param).cloned();
    match body {
        Some(b) => Response::builder()
            .status(200)
            .header("content-type", "application/octet-stream")
            .body(axum::body::Body::from(b))
            .unwrap_or_else(|_| cdn_error(500, "cannot build the answer")),
        None => cdn_error(404, "no such file"),
    }
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_hex(text: &str) -> Option<[u8; 16]> {
    if text.len() != 32 {
        return None;
    }
    let mut key = [0u8; 16];
    for (i, k) in key.iter_mut().enumerate() {
        *k = u8::from_str_radix(text.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(key)
}

/// AES-128-ECB with PKCS#7, as the CDN stores files.
pub fn encrypt(key: &[u8; 16], plain: &[u8]) -> Vec<u8> {
    ecb::Encryptor::<Aes128>::new(GenericArray::from_slice(key))
        .encrypt_padded_vec_mut::<Pkcs7>(plain)
}

/// The inverse of [`encrypt`]; `None` when the padding is wrong.
pub fn decrypt(key: &[u8; 16], cipher: &[u8]) -> Option<Vec<u8>> {
    ecb::Decryptor::<Aes128>::new(GenericArray::from_slice(key))
        .decrypt_padded_vec_mut::<Pkcs7>(cipher)
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn calls_without_the_ilink_headers_or_base_info_are_refused() {
        let fake = FakeWeixin::start("tok", Duration::from_millis(50)).await;
        let url = format!("{}/ilink/bot/getupdates", fake.base_url());
        let uin = base64::engine::general_purpose::STANDARD.encode("3141592653");
        let call = |uin: &str, body: Value| {
            reqwest::Client::new()
                .post(&url)
                .header("AuthorizationType", "ilink_bot_token")
                .header("Authorization", "Bearer tok")
                .header("X-WECHAT-UIN", uin.to_owned())
                .header("iLink-App-Id", "bot")
                .json(&body)
                .send()
        };
        let good = json!({"get_updates_buf": "", "base_info": {"channel_version": "2.2.0"}});
        let v: Value = call(&uin, good.clone())
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["ret"], 0);
        let v: Value = call("not-base64!", good)
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["ret"], -1);
        let v: Value = call(&uin, json!({"get_updates_buf": ""}))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["ret"], -1);
        assert_eq!(fake.requests().iter().filter(|r| r.well_formed).count(), 1);
    }

    #[tokio::test]
    async fn the_cdn_refuses_an_upload_that_does_not_match_its_announcement() {
        let fake = FakeWeixin::start("tok", Duration::from_millis(50)).await;
        let key = [5u8; 16];
        let plain = b"twelve bytes";
        let md5 = hex(&Md5::digest(plain));
        let call = |body: Value| {
            reqwest::Client::new()
                .post(format!("{}/ilink/bot/getuploadurl", fake.base_url()))
                .header("AuthorizationType", "ilink_bot_token")
                .header("Authorization", "Bearer tok")
                .header(
                    "X-WECHAT-UIN",
                    base64::engine::general_purpose::STANDARD.encode("42"),
                )
                .header("iLink-App-Id", "bot")
                .json(&body)
                .send()
        };
        let announce = |filesize: u64| {
            json!({"filekey": "ab12", "media_type": 3, "to_user_id": "u", "rawsize": 12,
                "rawfilemd5": md5, "filesize": filesize, "no_need_thumb": true,
                "aeskey": hex(&key), "base_info": {"channel_version": "2.2.0"}})
        };
        // 12 bytes pad to 16: any other filesize is refused.
        let v: Value = call(announce(12)).await.unwrap().json().await.unwrap();
        assert_eq!(v["ret"], -1);
        let v: Value = call(announce(16)).await.unwrap().json().await.unwrap();
        let param = v["upload_param"].as_str().unwrap().to_owned();
        let upload = |body: Vec<u8>, filekey: &str| {
            reqwest::Client::new()
                .post(format!("{}/upload", fake.cdn_base_url()))
                .query(&[
                    ("encrypted_query_param", param.as_str()),
                    ("filekey", filekey),
                ])
                .body(body)
                .send()
        };
        // Wrong key, wrong file key, then the right ciphertext.
        let r = upload(encrypt(&[6u8; 16], plain), "ab12").await.unwrap();
        assert_eq!(r.status(), 400);
        let r = upload(encrypt(&key, plain), "zz").await.unwrap();
        assert_eq!(r.status(), 400);
        let r = upload(encrypt(&key, plain), "ab12").await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.headers().contains_key("x-encrypted-param"));
        assert_eq!(fake.uploads().len(), 1);
        assert_eq!(decrypt(&key, &fake.uploads()[0].ciphertext).unwrap(), plain);
    }
}
