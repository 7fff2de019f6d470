//! WhatsApp Cloud's kit: the fake Graph API for what the bot sends, and
//! Meta's side of the webhook for what it receives.
//!
//! Meta delivers to the gateway's shared webhook listener, whose port the
//! kit picks and writes in the `webhook` section. Like Meta, the kit posts
//! deliveries one at a time, in order, and posts a delivery again until
//! the listener takes it with a 200: one posted while the gateway is down
//! or still starting arrives once it is up.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use talaria_adapter::MediaKind;

use super::{KitFile, Out, PlatformKit, Uploaded, Who};
use crate::FakeGraph;
use crate::lock;
use crate::wait::{WAIT, wait_for};
use crate::whatsapp::{API_VERSION, Failure, delivery, message, signature, text};

/// The Graph access token the gateway is given.
pub const TOKEN: &str = "EAAGkit-access-token-0123456789abcdef";

/// The business phone number's id.
pub const NUMBER: &str = "106540352242922";

/// The app secret Meta signs deliveries with.
pub const APP_SECRET: &str = "kit-app-secret-0123456789abcdef";

/// The token of the verification handshake.
pub const VERIFY: &str = "kit-verify-token-0123";

/// The allowlisted user's WhatsApp id.
pub const ADA: &str = "16505551234";

/// A user on no list.
pub const MALLORY: &str = "15550009999";

/// How long Meta's side waits before posting a refused delivery again.
const RETRY: Duration = Duration::from_millis(20);

fn wa_id(who: Who) -> &'static str {
    match who {
        Who::Friend => ADA,
        Who::Stranger => MALLORY,
    }
}

/// The fake Graph API and Meta's deliveries to the listener.
pub struct WhatsappKit {
    /// The fake Graph API, for platform-specific tests.
    pub fake: FakeGraph,
    /// `http://127.0.0.1:PORT`: the gateway's webhook listener.
    pub base: String,
    port: u16,
    next_message: AtomicU64,
    /// Meta's delivery queue.
    outbox: mpsc::UnboundedSender<Value>,
    meta: JoinHandle<()>,
    /// Deliveries not yet taken with a 200.
    unanswered: Arc<AtomicUsize>,
    /// Gateways seen taking deliveries (see [`PlatformKit::connections`]).
    ready: Mutex<usize>,
    http: reqwest::Client,
}

impl WhatsappKit {
    /// Meta delivers `payload` (signed), after everything queued before it.
    pub fn deliver(&self, payload: Value) {
        self.unanswered.fetch_add(1, Ordering::SeqCst);
        if self.outbox.send(payload).is_err() {
            // Meta's side ended only if its task panicked; the waits
            // that follow say what never arrived.
            self.unanswered.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// A text from `from` with the id `wamid`, as Meta delivers it.
    pub fn text_from(from: &str, wamid: &str, body: &str) -> Value {
        delivery(
            NUMBER,
            &[(from, "Someone")],
            vec![text(from, wamid, body)],
            vec![],
        )
    }

    fn wamid(&self, from: &str) -> String {
        let n = self.next_message.fetch_add(1, Ordering::Relaxed);
        format!("wamid.kit-{from}-{n}")
    }
}

/// A port free now on 127.0.0.1 for the gateway's listener, below the
/// ephemeral range (32768 and up on Linux): there, no outgoing connection
/// or port-0 listener of a test running alongside can take it between now
/// and the moment the gateway binds it.
fn free_port() -> u16 {
    const FIRST: u16 = 20_000;
    const COUNT: u16 = 12_000;
    // `RandomState` is seeded afresh for each instance: a start that
    // differs between concurrent tests without a random-number crate.
    let start = RandomState::new().hash_one(std::process::id());
    for i in 0..200u64 {
        let port = FIRST + u16::try_from((start.wrapping_add(i)) % u64::from(COUNT)).unwrap_or(0);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!(
        "no free port on 127.0.0.1 between {FIRST} and {}",
        FIRST + COUNT
    )
}

impl Drop for WhatsappKit {
    fn drop(&mut self) {
        self.meta.abort();
    }
}

/// Posts each delivery until the listener takes it, in order, as Meta
/// does (it retries a delivery that was not answered with a 200).
async fn meta_side(
    url: String,
    mut queue: mpsc::UnboundedReceiver<Value>,
    unanswered: Arc<AtomicUsize>,
) {
    let http = reqwest::Client::new();
    while let Some(payload) = queue.recv().await {
        let body = payload.to_string().into_bytes();
        let sig = signature(APP_SECRET, &body);
        loop {
            let answer = http
                .post(&url)
                .header("content-type", "application/json")
                .header("X-Hub-Signature-256", &sig)
                .body(body.clone())
                .timeout(Duration::from_secs(10))
                .send()
                .await;
            if matches!(&answer, Ok(r) if r.status().as_u16() == 200) {
                unanswered.fetch_sub(1, Ordering::SeqCst);
                break;
            }
            tokio::time::sleep(RETRY).await;
        }
    }
}

impl PlatformKit for WhatsappKit {
    const NAME: &'static str = "whatsapp_cloud";
    const DM_REPLY_QUOTES: bool = true;

    async fn start() -> WhatsappKit {
        let fake = FakeGraph::start(TOKEN, NUMBER).await;
        // Every gateway of the test (a restart included) listens here.
        let port = free_port();
        let base = format!("http://127.0.0.1:{port}");
        let (outbox, queue) = mpsc::unbounded_channel();
        let unanswered = Arc::new(AtomicUsize::new(0));
        let meta = tokio::spawn(meta_side(
            format!("{base}/whatsapp/webhook"),
            queue,
            unanswered.clone(),
        ));
        WhatsappKit {
            fake,
            base,
            port,
            next_message: AtomicU64::new(1),
            outbox,
            meta,
            unanswered,
            ready: Mutex::new(0),
            http: reqwest::Client::new(),
        }
    }

    fn section(&self) -> String {
        format!(
            "  webhook:\n    port: {}\n  whatsapp_cloud:\n    graph_base: {}\n    \
             api_version: {API_VERSION}\n",
            self.port,
            self.fake.base_url()
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        [
            ("WHATSAPP_CLOUD_TOKEN", TOKEN),
            ("WHATSAPP_CLOUD_PHONE_NUMBER_ID", NUMBER),
            ("WHATSAPP_CLOUD_APP_SECRET", APP_SECRET),
            ("WHATSAPP_CLOUD_VERIFY_TOKEN", VERIFY),
            ("WHATSAPP_CLOUD_ALLOWED_USERS", ADA),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    fn secret(&self) -> &str {
        TOKEN
    }

    /// A webhook platform holds no connection: this counts the gateways
    /// seen taking deliveries, one per [`PlatformKit::wait_connected`].
    fn connections(&self) -> usize {
        *lock(&self.ready)
    }

    /// Waits until the listener's `/health` says deliveries are taken.
    /// Every suite stops a gateway before it waits for the next, so the
    /// one answering is the new one.
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

    fn push_dm(&self, who: Who, body: &str) -> String {
        let from = wa_id(who);
        let id = self.wamid(from);
        self.deliver(Self::text_from(from, &id, body));
        id
    }

    fn dm_chat(&self, who: Who) -> String {
        wa_id(who).to_owned()
    }

    fn sent(&self) -> Vec<Out> {
        self.fake
            .sent()
            .into_iter()
            .map(|s| Out {
                chat: s.to,
                thread: None,
                text: s.body.clone(),
                wire: s.body,
                reply_to: s.context,
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

    fn push_dm_file(&self, who: Who, file: &KitFile, caption: &str) -> String {
        let from = wa_id(who);
        let id = self.wamid(from);
        let media_id = self.fake.add_media(&file.bytes, &file.mime);
        let mut content = json!({"id": media_id, "mime_type": file.mime});
        // WhatsApp's message types: audio shows no caption and flags a
        // note recorded in the app; a document carries its file name.
        let kind = match file.kind {
            MediaKind::Image => "image",
            MediaKind::Video => "video",
            MediaKind::Voice | MediaKind::Audio => {
                content["voice"] = json!(file.kind == MediaKind::Voice);
                "audio"
            }
            MediaKind::Document => {
                if let Some(name) = &file.name {
                    content["filename"] = json!(name);
                }
                "document"
            }
        };
        if kind != "audio" && !caption.is_empty() {
            content["caption"] = json!(caption);
        }
        let payload = delivery(
            NUMBER,
            &[(from, "Someone")],
            vec![message(from, &id, kind, content)],
            vec![],
        );
        self.deliver(payload);
        id
    }

    fn uploads(&self) -> Vec<Uploaded> {
        // A file goes out in two calls: the upload, then a message of the
        // type it is shown as, naming the upload's media id.
        let uploads = self.fake.uploads();
        self.fake
            .sent_files()
            .into_iter()
            .filter_map(|f| {
                let up = uploads.iter().find(|u| u.id == f.media_id)?;
                let kind = match f.kind.as_str() {
                    "image" => MediaKind::Image,
                    "video" => MediaKind::Video,
                    // An Opus note plays as a voice message.
                    "audio" if up.mime.starts_with("audio/ogg") => MediaKind::Voice,
                    "audio" => MediaKind::Audio,
                    _ => MediaKind::Document,
                };
                Some(Uploaded {
                    kind,
                    name: up.file_name.clone(),
                    bytes: up.bytes.clone(),
                })
            })
            .collect()
    }

    fn redeliver(&self, id: &str, body: &str) {
        // Meta posts the same message again (it missed the 200, say).
        self.deliver(Self::text_from(ADA, id, body));
    }

    fn rate_limit_next_send(&self, after: Duration) {
        // Graph's own rate limits name no wait; a proxy's 429 does.
        self.fake.fail_next_send(Failure::TooManyRequests {
            retry_after: Some(after.as_secs().max(1)),
        });
    }

    fn typed_in(&self, chat: &str) -> Option<bool> {
        // The indicator rides on the read receipt of the chat's message.
        let prefix = format!("wamid.kit-{chat}-");
        Some(
            self.fake
                .reads()
                .iter()
                .any(|r| r.typing && r.message_id.starts_with(&prefix)),
        )
    }

    fn unacknowledged(&self) -> Option<usize> {
        Some(self.unanswered.load(Ordering::SeqCst))
    }

    async fn wait_acknowledged(&self) {
        wait_for("Meta's deliveries taken with a 200", || async {
            match self.unanswered.load(Ordering::SeqCst) {
                0 => Ok(()),
                held => Err(held),
            }
        })
        .await;
    }
}
