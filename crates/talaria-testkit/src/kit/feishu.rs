//! Feishu's kits: the fake Open Platform for what the bot sends, and
//! Feishu's side of the events it receives: [`FeishuKit`] posts them to
//! the webhook, [`FeishuSocketKit`] pushes them over the long connection
//! (protobuf frames, split in two parts when long).
//!
//! For the webhook the app has both an Encrypt Key and a Verification Token, so every
//! event the kit posts is encrypted, carries the token and is signed
//! (`X-Lark-Signature`). Like Feishu, the kit posts events one at a time,
//! in order, and posts one again until the listener takes it with a 200.
//!
//! A click on a card's button ([`FeishuKit::click`]) is a
//! `card.action.trigger` callback, checked like an event: posted once to
//! the webhook (encrypted, signed, with the token) or pushed over the long
//! connection as a frame of type `card`; either way the kit hands back the
//! answer the clicker would see.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use talaria_adapter::MediaKind;

use super::{KitFile, Out, PlatformKit, Threaded, Uploaded, Who};
use crate::feishu::{
    Failure, FakeFeishu, card_action, encrypt, event, sign, text_message, typed_message,
};
use crate::lock;
use crate::wait::{WAIT, wait_for};

/// The app's id.
pub const APP_ID: &str = "cli_kit0123456789";
/// The app's secret.
pub const APP_SECRET: &str = "kit-feishu-app-secret-0123456789";
/// The console's Encrypt Key.
pub const ENCRYPT_KEY: &str = "kit-feishu-encrypt-key-0123";
/// The console's Verification Token.
pub const VERIFICATION_TOKEN: &str = "kit-feishu-verification-0123";
/// The bot's open id.
pub const BOT: &str = "ou_bot0000kit";
/// The allowlisted user's open id.
pub const ADA: &str = "ou_ada0000kit";
/// A user on no list.
pub const MALLORY: &str = "ou_mallory0kit";
/// The group chat.
pub const GROUP: &str = "oc_group0kit";
/// The topic group and its thread.
pub const TOPIC_CHAT: &str = "oc_topic0kit";
/// The topic thread in [`TOPIC_CHAT`].
pub const TOPIC: &str = "omt_topic0kit";

/// How long Feishu's side waits before posting a refused event again.
const RETRY: Duration = Duration::from_millis(20);

fn open_id(who: Who) -> &'static str {
    match who {
        Who::Friend => ADA,
        Who::Stranger => MALLORY,
    }
}

/// The fake Open Platform and Feishu's event deliveries.
pub struct FeishuKit {
    /// The fake Open Platform, for platform-specific tests.
    pub fake: FakeFeishu,
    /// `http://127.0.0.1:PORT`: the gateway's webhook listener.
    pub base: String,
    port: u16,
    next: AtomicU64,
    outbox: mpsc::UnboundedSender<Value>,
    feishu: JoinHandle<()>,
    unanswered: Arc<AtomicUsize>,
    ready: Mutex<usize>,
    /// message id → the envelope that delivered it, for re-deliveries.
    delivered: Mutex<HashMap<String, Value>>,
    http: reqwest::Client,
    /// Events go over the long connection instead of the webhook.
    socket: bool,
}

impl Drop for FeishuKit {
    fn drop(&mut self) {
        self.feishu.abort();
    }
}

/// A port free now on 127.0.0.1, below the ephemeral range, so nothing
/// else of a test running alongside takes it before the gateway binds it.
fn free_port() -> u16 {
    const FIRST: u16 = 20_000;
    const COUNT: u16 = 12_000;
    let start = RandomState::new().hash_one(std::process::id());
    for i in 0..200u64 {
        let port = FIRST + u16::try_from(start.wrapping_add(i) % u64::from(COUNT)).unwrap_or(0);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!(
        "no free port on 127.0.0.1 between {FIRST} and {}",
        FIRST + COUNT
    )
}

/// The headers and body Feishu posts for `envelope`: encrypted with a
/// fresh IV, signed now.
pub fn signed_delivery(envelope: &Value) -> (Vec<(String, String)>, Vec<u8>) {
    let n = RandomState::new().hash_one(0u8);
    let iv: [u8; 16] = [n.to_le_bytes(), n.rotate_left(17).to_le_bytes()]
        .concat()
        .try_into()
        .unwrap_or([7; 16]);
    let body = encrypt(ENCRYPT_KEY, iv, envelope.to_string().as_bytes())
        .to_string()
        .into_bytes();
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        .to_string();
    let nonce = format!("nonce{n:x}");
    let signature = sign(&timestamp, &nonce, ENCRYPT_KEY, &body);
    (
        vec![
            ("X-Lark-Request-Timestamp".to_owned(), timestamp),
            ("X-Lark-Request-Nonce".to_owned(), nonce),
            ("X-Lark-Signature".to_owned(), signature),
        ],
        body,
    )
}

async fn feishu_side(
    url: String,
    mut queue: mpsc::UnboundedReceiver<Value>,
    unanswered: Arc<AtomicUsize>,
) {
    let http = reqwest::Client::new();
    while let Some(envelope) = queue.recv().await {
        loop {
            // Each attempt is signed afresh, as Feishu's retries are.
            let (headers, body) = signed_delivery(&envelope);
            let mut request = http
                .post(&url)
                .header("content-type", "application/json; charset=utf-8")
                .body(body)
                .timeout(Duration::from_secs(10));
            for (k, v) in &headers {
                request = request.header(k, v);
            }
            if matches!(request.send().await, Ok(r) if r.status().as_u16() == 200) {
                unanswered.fetch_sub(1, Ordering::SeqCst);
                break;
            }
            tokio::time::sleep(RETRY).await;
        }
    }
}

impl FeishuKit {
    /// Feishu delivers `envelope` after everything queued before it.
    pub fn deliver(&self, envelope: Value) {
        if self.socket {
            self.fake.push_event(&envelope);
            return;
        }
        self.unanswered.fetch_add(1, Ordering::SeqCst);
        if self.outbox.send(envelope).is_err() {
            self.unanswered.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn next_id(&self, prefix: &str) -> String {
        format!("{prefix}_kit{}", self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// A text message from `from` in `chat`; returns its message id.
    pub fn push_message(
        &self,
        from: &str,
        chat: &str,
        chat_type: &str,
        thread: Option<&str>,
        text: &str,
        mention_bot: bool,
    ) -> String {
        let id = self.next_id("om");
        self.fake.add_message(&id, chat, thread);
        let (text, mentions) = if mention_bot {
            (
                format!("@_user_1 {text}"),
                json!([{"key": "@_user_1", "id": {"open_id": BOT, "user_id": "u_bot"},
                    "name": "Talaria", "tenant_key": "tenant_kit"}]),
            )
        } else {
            (text.to_owned(), json!([]))
        };
        let envelope = event(
            &self.next_id("ev"),
            "im.message.receive_v1",
            VERIFICATION_TOKEN,
            text_message(from, &id, chat, chat_type, thread, &text, mentions),
        );
        lock(&self.delivered).insert(id.clone(), envelope.clone());
        self.deliver(envelope);
        id
    }

    /// A file `from` sends in a DM, as Feishu delivers it: a photo with
    /// text is a `post` (text and an `img` element), a photo alone an
    /// `image` message, a voice note an `audio` message, a video a
    /// `media` message, anything else a `file` message. The bytes are
    /// served as the message's resource. Feishu's other file messages
    /// carry no text, so a caption goes only with a photo.
    pub fn push_file(&self, from: &str, chat: &str, file: &KitFile, caption: &str) -> String {
        let id = self.next_id("om");
        self.fake.add_message(&id, chat, None);
        let image = file.kind == MediaKind::Image;
        let key = if image {
            self.next_id("img_v3")
        } else {
            self.next_id("file_v3")
        };
        self.fake
            .add_resource(&id, &key, image, &file.mime, &file.bytes);
        let name = file.name.clone().unwrap_or_else(|| "file".to_owned());
        let (message_type, content) = match file.kind {
            MediaKind::Image if !caption.is_empty() => (
                "post",
                json!({"title": "", "content": [
                    [{"tag": "text", "text": caption}],
                    [{"tag": "img", "image_key": key}],
                ]}),
            ),
            MediaKind::Image => ("image", json!({"image_key": key})),
            MediaKind::Voice => ("audio", json!({"file_key": key, "duration": 2000})),
            MediaKind::Video => (
                "media",
                json!({"file_key": key, "image_key": "img_v3_cover", "file_name": name,
                    "duration": 2000}),
            ),
            MediaKind::Audio | MediaKind::Document => {
                ("file", json!({"file_key": key, "file_name": name}))
            }
        };
        let envelope = event(
            &self.next_id("ev"),
            "im.message.receive_v1",
            VERIFICATION_TOKEN,
            typed_message(from, &id, chat, "p2p", message_type, &content),
        );
        lock(&self.delivered).insert(id.clone(), envelope.clone());
        self.deliver(envelope);
        id
    }

    /// The files the bot uploaded, as the message types it sent them as
    /// show them: the image upload as a photo, an opus file as a voice
    /// note, an mp4 as a video, anything else as a file.
    pub fn uploaded(&self) -> Vec<Uploaded> {
        self.fake
            .uploads()
            .into_iter()
            .map(|u| Uploaded {
                kind: match u.file_type.as_deref() {
                    None => MediaKind::Image,
                    Some("opus") => MediaKind::Voice,
                    Some("mp4") => MediaKind::Video,
                    Some(_) => MediaKind::Document,
                },
                name: u.name,
                bytes: u.bytes,
            })
            .collect()
    }

    /// The callback Feishu sends when `who` clicks the button labelled
    /// `label` on card `message_id`: the button's own value, the card's
    /// chat, a fresh event id.
    ///
    /// # Panics
    /// When the bot sent no such card, or the card has no such button.
    pub fn click_envelope(&self, message_id: &str, who: &str, label: &str) -> Value {
        let card = self
            .fake
            .card(message_id)
            .unwrap_or_else(|| panic!("the bot sent no card {message_id}"));
        let button = card
            .buttons
            .iter()
            .find(|b| b.label == label)
            .unwrap_or_else(|| panic!("card {message_id} has no button {label:?}: {card:?}"));
        let chat = self.fake.chat_of(message_id).unwrap_or_default();
        event(
            &self.next_id("ev"),
            "card.action.trigger",
            VERIFICATION_TOKEN,
            card_action(who, message_id, &chat, &button.value),
        )
    }

    /// `who` clicks the button labelled `label` on card `message_id`;
    /// returns the answer Feishu would show them.
    pub async fn click(&self, message_id: &str, who: &str, label: &str) -> Value {
        let envelope = self.click_envelope(message_id, who, label);
        self.deliver_click(&envelope).await
    }

    /// Feishu delivers a card callback (once: a click is not posted again)
    /// and returns the answer's JSON.
    ///
    /// # Panics
    /// When the webhook does not answer 200 with JSON, or the long
    /// connection does not answer the frame with code 200.
    pub async fn deliver_click(&self, envelope: &Value) -> Value {
        if self.socket {
            let frame = self.fake.push_card_action(envelope);
            return self.fake.wait_for_card_answer(&frame, WAIT).await;
        }
        let (headers, body) = signed_delivery(envelope);
        let mut request = self
            .http
            .post(format!("{}/feishu/webhook", self.base))
            .header("content-type", "application/json; charset=utf-8")
            .body(body)
            .timeout(WAIT);
        for (k, v) in &headers {
            request = request.header(k, v);
        }
        let answer = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("the card callback was not answered: {e}"));
        let status = answer.status().as_u16();
        let text = answer.text().await.unwrap_or_default();
        assert_eq!(
            status, 200,
            "the card callback was answered {status}: {text}"
        );
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("the card callback's answer is not JSON ({e}): {text}"))
    }

    /// A comment notice from `from` on a document, addressed to `to`.
    pub fn push_comment(
        &self,
        from: &str,
        to: &str,
        file_token: &str,
        comment_id: &str,
        reply_id: &str,
    ) -> Value {
        let envelope = event(
            &self.next_id("ev"),
            "drive.notice.comment_add_v1",
            VERIFICATION_TOKEN,
            json!({
                "comment_id": comment_id, "reply_id": reply_id, "is_mentioned": true,
                "timestamp": "1700000000",
                "notice_meta": {
                    "file_token": file_token, "file_type": "docx", "notice_type": "add_comment",
                    "from_user_id": {"open_id": from, "user_id": "u_x", "union_id": "on_x"},
                    "to_user_id": {"open_id": to, "user_id": "u_bot", "union_id": "on_bot"},
                },
            }),
        );
        self.deliver(envelope.clone());
        envelope
    }
}

impl FeishuKit {
    async fn started(socket: bool) -> FeishuKit {
        let fake = FakeFeishu::start(APP_ID, APP_SECRET, BOT).await;
        let port = free_port();
        let base = format!("http://127.0.0.1:{port}");
        let (outbox, queue) = mpsc::unbounded_channel();
        let unanswered = Arc::new(AtomicUsize::new(0));
        let feishu = tokio::spawn(feishu_side(
            format!("{base}/feishu/webhook"),
            queue,
            unanswered.clone(),
        ));
        FeishuKit {
            fake,
            base,
            port,
            next: AtomicU64::new(1),
            outbox,
            feishu,
            unanswered,
            ready: Mutex::new(0),
            delivered: Mutex::new(HashMap::new()),
            http: reqwest::Client::new(),
            socket,
        }
    }
}

impl PlatformKit for FeishuKit {
    const NAME: &'static str = "feishu";
    const DM_REPLY_QUOTES: bool = true;

    async fn start() -> FeishuKit {
        FeishuKit::started(false).await
    }

    fn section(&self) -> String {
        format!(
            "  webhook:\n    port: {}\n  feishu:\n    base_url: {}\n",
            self.port,
            self.fake.base_url()
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        [
            ("FEISHU_APP_ID", APP_ID),
            ("FEISHU_APP_SECRET", APP_SECRET),
            ("FEISHU_ENCRYPT_KEY", ENCRYPT_KEY),
            ("FEISHU_VERIFICATION_TOKEN", VERIFICATION_TOKEN),
            ("FEISHU_CONNECTION_MODE", "webhook"),
            ("FEISHU_ALLOWED_USERS", ADA),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    fn secret(&self) -> &str {
        APP_SECRET
    }

    /// Counts the gateways seen taking deliveries.
    fn connections(&self) -> usize {
        *lock(&self.ready)
    }

    async fn wait_connected(&self, n: usize) {
        let url = format!("{}/health", self.base);
        wait_for("the webhook listener to take deliveries", || async {
            match self.http.get(&url).send().await {
                Ok(r) if r.status().as_u16() == 200 => Ok(()),
                Ok(r) => Err(r.status().to_string()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
        let mut ready = lock(&self.ready);
        *ready = (*ready + 1).max(n);
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        let chat = self.dm_chat(who);
        self.push_message(open_id(who), &chat, "p2p", None, text, false)
    }

    fn push_dm_file(&self, who: Who, file: &KitFile, caption: &str) -> String {
        let chat = self.dm_chat(who);
        self.push_file(open_id(who), &chat, file, caption)
    }

    fn uploads(&self) -> Vec<Uploaded> {
        self.uploaded()
    }

    fn dm_chat(&self, who: Who) -> String {
        match who {
            Who::Friend => "oc_dm0ada".to_owned(),
            Who::Stranger => "oc_dm0mallory".to_owned(),
        }
    }

    fn sent(&self) -> Vec<Out> {
        self.fake
            .sent()
            .into_iter()
            .map(|s| Out {
                chat: s.chat,
                thread: s.thread,
                text: s.text.clone(),
                wire: s.text,
                reply_to: s.parent,
                at: s.at,
            })
            .collect()
    }

    async fn wait_sent(&self, n: usize) -> Vec<Out> {
        self.fake.wait_for_sent(n, WAIT).await;
        self.sent()
    }

    fn send_attempts(&self) -> Vec<Instant> {
        self.fake.send_attempts()
    }

    async fn wait_send_attempts(&self, n: usize) {
        self.fake.wait_for_send_attempts(n, WAIT).await;
    }

    fn hang_send(&self, hang: bool) {
        self.fake.hang_send(hang);
    }

    fn push_in_thread(&self, text: &str) -> Threaded {
        let id = self.push_message(ADA, TOPIC_CHAT, "group", Some(TOPIC), text, true);
        Threaded {
            id,
            chat: TOPIC_CHAT.to_owned(),
            thread: Some(TOPIC.to_owned()),
        }
    }

    fn push_in_group(&self, text: &str, mention: bool) -> Threaded {
        let id = self.push_message(ADA, GROUP, "group", None, text, mention);
        Threaded {
            id,
            chat: GROUP.to_owned(),
            thread: None,
        }
    }

    fn redeliver(&self, id: &str, _text: &str) {
        // Feishu posts the same event (same event_id) again.
        let envelope = lock(&self.delivered).get(id).cloned();
        if let Some(envelope) = envelope {
            self.deliver(envelope);
        }
    }

    fn rate_limit_next_send(&self, after: Duration) {
        self.fake
            .fail_next_send(Failure::rate_limited(after.as_secs().max(1)));
    }

    fn push_stranger_in_group(&self, text: &str) {
        self.push_message(MALLORY, GROUP, "group", None, text, true);
    }

    fn typed_in(&self, chat: &str) -> Option<bool> {
        Some(self.fake.reactions().iter().any(|r| {
            r.emoji == "Typing" && self.fake.chat_of(&r.message_id).as_deref() == Some(chat)
        }))
    }

    fn unacknowledged(&self) -> Option<usize> {
        Some(self.unanswered.load(Ordering::SeqCst))
    }

    async fn wait_acknowledged(&self) {
        wait_for("Feishu's events taken with a 200", || async {
            match self.unanswered.load(Ordering::SeqCst) {
                0 => Ok(()),
                held => Err(held),
            }
        })
        .await;
    }

    fn reactions(&self) -> Option<usize> {
        Some(self.fake.reactions().len())
    }
}

/// Feishu over the long connection: the same fake and users as
/// [`FeishuKit`], with events pushed as protobuf frames over the socket
/// the gateway opens.
pub struct FeishuSocketKit(pub FeishuKit);

impl PlatformKit for FeishuSocketKit {
    const NAME: &'static str = "feishu";
    const DM_REPLY_QUOTES: bool = true;

    async fn start() -> FeishuSocketKit {
        FeishuSocketKit(FeishuKit::started(true).await)
    }

    fn section(&self) -> String {
        format!("  feishu:\n    base_url: {}\n", self.0.fake.base_url())
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        [
            ("FEISHU_APP_ID", APP_ID),
            ("FEISHU_APP_SECRET", APP_SECRET),
            ("FEISHU_CONNECTION_MODE", "websocket"),
            ("FEISHU_ALLOWED_USERS", ADA),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    fn secret(&self) -> &str {
        APP_SECRET
    }

    fn connections(&self) -> usize {
        self.0.fake.socket_connections()
    }

    async fn wait_connected(&self, n: usize) {
        self.0.fake.wait_for_socket_connections(n, WAIT).await;
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        self.0.push_dm(who, text)
    }

    fn dm_chat(&self, who: Who) -> String {
        self.0.dm_chat(who)
    }

    fn push_dm_file(&self, who: Who, file: &KitFile, caption: &str) -> String {
        self.0.push_dm_file(who, file, caption)
    }

    fn uploads(&self) -> Vec<Uploaded> {
        self.0.uploaded()
    }

    fn sent(&self) -> Vec<Out> {
        self.0.sent()
    }

    async fn wait_sent(&self, n: usize) -> Vec<Out> {
        self.0.wait_sent(n).await
    }

    fn send_attempts(&self) -> Vec<Instant> {
        self.0.send_attempts()
    }

    async fn wait_send_attempts(&self, n: usize) {
        self.0.wait_send_attempts(n).await;
    }

    fn hang_send(&self, hang: bool) {
        self.0.hang_send(hang);
    }

    fn push_in_thread(&self, text: &str) -> Threaded {
        self.0.push_in_thread(text)
    }

    fn push_in_group(&self, text: &str, mention: bool) -> Threaded {
        self.0.push_in_group(text, mention)
    }

    fn redeliver(&self, id: &str, text: &str) {
        self.0.redeliver(id, text);
    }

    async fn drop_connection(&self) {
        // Only an answered event is safe from being sent again.
        self.0.fake.wait_for_all_delivered(WAIT).await;
        self.0.fake.drop_connection();
    }

    fn rate_limit_next_send(&self, after: Duration) {
        self.0.rate_limit_next_send(after);
    }

    fn push_stranger_in_group(&self, text: &str) {
        self.0.push_stranger_in_group(text);
    }

    fn typed_in(&self, chat: &str) -> Option<bool> {
        self.0.typed_in(chat)
    }

    fn unacknowledged(&self) -> Option<usize> {
        Some(self.0.fake.undelivered())
    }

    async fn wait_acknowledged(&self) {
        self.0.fake.wait_for_all_delivered(WAIT).await;
    }

    fn reactions(&self) -> Option<usize> {
        self.0.reactions()
    }
}
