//! Home Assistant's kit: conversation requests posted as Home Assistant
//! posts them (JSON with a bearer secret) to the gateway's shared webhook
//! listener, answered in their own HTTP responses, and the fake Home
//! Assistant REST API for the `ha_*` tools and for the persistent
//! notifications that carry answers nobody waits for any more.
//!
//! What the bot "sent" is what the askers read: each request's answer
//! (a retried request reads the same answer again, which is not a second
//! message) and each notification.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::deliver::{Arrivals, Delivery, Sender, free_port};
use super::{Out, PlatformKit, Who};
use crate::FakeHomeAssistant;
use crate::lock;
use crate::wait::wait_for;

/// The long-lived token the fake Home Assistant accepts (the tools' and
/// the notifications').
pub const HASS_TOKEN: &str = "kit-hass-long-lived-token-0123456789";
/// The conversation endpoint's bearer secret: a caller holding it is who
/// the bot answers.
pub const CONV_SECRET: &str = "kit-conversation-secret-0123456789";
/// Where the adapter serves conversation requests on the listener.
pub const PATH: &str = "/homeassistant/conversation";
/// The service the adapter calls for a notification.
const NOTIFY: &str = "/api/services/persistent_notification/create";
/// How long a request waits for its answer (`reply_timeout_secs`): long
/// enough for any turn of the suites, short enough for a test to outlast.
pub const REPLY_TIMEOUT_SECS: u64 = 4;
/// The notifications' title.
const TITLE: &str = "Talaria";

/// The fake Home Assistant and the callers of the conversation endpoint.
pub struct HomeAssistantKit {
    /// The fake REST API, for platform-specific tests.
    pub fake: FakeHomeAssistant,
    /// The shared listener's port, named in the kit's section.
    pub port: u16,
    /// Posts the conversation requests, in order, and keeps the answers.
    pub sender: Sender,
    arrivals: Arrivals,
    /// `(conversation_id, id)` of each request queued, in order; `None`
    /// for a request queued as raw JSON.
    asked: Mutex<Vec<Option<(String, String)>>>,
    /// Each notification and when the kit first saw it.
    notified: Mutex<Vec<(String, Instant)>>,
    /// Notification calls refused so far by [`PlatformKit::hang_send`].
    refused_before: AtomicUsize,
    /// Refusals scripted by [`PlatformKit::hang_send`] in total.
    scripted: AtomicUsize,
    next_id: AtomicU64,
}

/// The conversation `who` speaks in.
pub fn conversation(who: Who) -> &'static str {
    match who {
        Who::Friend => "kit-conv-friend",
        Who::Stranger => "kit-conv-stranger",
    }
}

/// The bearer `who` holds: the secret for a friend, a guess for a
/// stranger.
fn bearer(who: Who) -> &'static str {
    match who {
        Who::Friend => CONV_SECRET,
        Who::Stranger => "kit-guessed-secret-0000000000",
    }
}

/// The id the adapter gives a notification: the same answer always gets
/// the same one, so a resend replaces it.
fn notification_id(chat: &str, reply_to: &str, text: &str) -> String {
    let mut h = Sha256::new();
    for piece in [chat, reply_to, text] {
        h.update(piece.as_bytes());
        h.update([0]);
    }
    let hex: String = h
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("talaria_{hex}")
}

impl PlatformKit for HomeAssistantKit {
    const NAME: &'static str = "homeassistant";
    const DM_REPLY_QUOTES: bool = false;
    // Longer than the requests wait, so the answer becomes a notification.
    const CRASH_ANSWER_DELAY: Duration = Duration::from_secs(REPLY_TIMEOUT_SECS + 2);

    async fn start() -> HomeAssistantKit {
        let port = free_port();
        HomeAssistantKit {
            fake: FakeHomeAssistant::start(HASS_TOKEN).await,
            port,
            sender: Sender::start(),
            arrivals: Arrivals::new(port),
            asked: Mutex::new(Vec::new()),
            notified: Mutex::new(Vec::new()),
            refused_before: AtomicUsize::new(0),
            scripted: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
        }
    }

    fn section(&self) -> String {
        format!(
            "  webhook:\n    port: {}\n  homeassistant:\n    url: {}\n    \
             reply_timeout_secs: {REPLY_TIMEOUT_SECS}\n    allowed_services: [\"light.*\"]\n",
            self.port,
            self.fake.url()
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        vec![
            ("HASS_TOKEN".into(), HASS_TOKEN.into()),
            ("HASS_CONVERSATION_TOKEN".into(), CONV_SECRET.into()),
        ]
    }

    fn secret(&self) -> &str {
        CONV_SECRET
    }

    fn connections(&self) -> usize {
        self.arrivals.count()
    }

    async fn wait_connected(&self, n: usize) {
        self.arrivals.wait(n).await;
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        let id = format!("kit-req-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        self.converse(who, conversation(who), &id, text);
        id
    }

    fn dm_chat(&self, who: Who) -> String {
        conversation(who).to_owned()
    }

    fn sent(&self) -> Vec<Out> {
        let asked = lock(&self.asked).clone();
        let mut out = Vec::new();
        let mut answered = HashSet::new();
        for (taken, asked) in self.sender.taken().iter().zip(&asked) {
            let body: Value = serde_json::from_str(&taken.body).unwrap_or(Value::Null);
            let retried = asked.as_ref().is_some_and(|(_, id)| !answered.insert(id));
            if taken.status != 200 || body["status"] != "answered" || retried {
                continue;
            }
            let speech = body["response"]["speech"]["plain"]["speech"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            out.push(Out {
                chat: body["conversation_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                thread: None,
                text: speech.clone(),
                wire: speech,
                reply_to: body["id"].as_str().map(str::to_owned),
                at: taken.at,
            });
        }
        for (message, at) in self.notifications() {
            // The notification's id names the request it answers.
            let id = self
                .fake
                .notifications()
                .into_iter()
                .find(|n| n.message == message)
                .and_then(|n| n.notification_id);
            let answered = asked
                .iter()
                .flatten()
                .find(|(chat, req)| id.as_deref() == Some(&*notification_id(chat, req, &message)));
            out.push(Out {
                chat: answered.map(|(c, _)| c.clone()).unwrap_or_default(),
                thread: None,
                text: message.clone(),
                wire: message,
                reply_to: answered.map(|(_, r)| r.clone()),
                at,
            });
        }
        out.sort_by_key(|o| o.at);
        out
    }

    async fn wait_sent(&self, n: usize) -> Vec<Out> {
        wait_for(&format!("{n} answers"), || async {
            let sent = self.sent();
            if sent.len() >= n { Ok(sent) } else { Err(sent) }
        })
        .await
    }

    /// Answers given in responses, notifications made, and notification
    /// calls refused (timed when the kit noticed them).
    fn send_attempts(&self) -> Vec<Instant> {
        let mut at: Vec<Instant> = self.sent().iter().map(|o| o.at).collect();
        at.extend(std::iter::repeat_n(Instant::now(), self.refused()));
        at.sort();
        at
    }

    async fn wait_send_attempts(&self, n: usize) {
        wait_for(&format!("{n} send attempts"), || async {
            let got = self.send_attempts().len();
            if got >= n { Ok(()) } else { Err(got) }
        })
        .await;
    }

    fn redeliver(&self, id: &str, text: &str) {
        // Home Assistant posts the same request again (same `id`) when it
        // did not get the answer.
        self.converse(Who::Friend, conversation(Who::Friend), id, text);
    }

    /// Notifications are the adapter's own wire (answers in responses are
    /// handed over in memory): while set, Home Assistant refuses them as
    /// unavailable (503), so none is ever shown.
    fn hang_send(&self, hang: bool) {
        // More refusals than any test provokes while it holds them.
        const REFUSALS: usize = 64;
        let left = self.fake.failures_left(NOTIFY);
        self.refused_before.fetch_add(
            self.scripted.swap(0, Ordering::SeqCst).saturating_sub(left),
            Ordering::SeqCst,
        );
        self.fake.clear_failures(NOTIFY);
        if hang {
            self.fake.fail_next(NOTIFY, &[503; REFUSALS]);
            self.scripted.store(REFUSALS, Ordering::SeqCst);
        }
    }
}

impl HomeAssistantKit {
    /// Queues a conversation request as `who`, in `conversation`, with
    /// the request id `id`.
    pub fn converse(&self, who: Who, conversation: &str, id: &str, text: &str) {
        let body =
            json!({"text": text, "conversation_id": conversation, "id": id, "language": "en"});
        lock(&self.asked).push(Some((conversation.to_owned(), id.to_owned())));
        self.queue(Some(bearer(who)), &body);
    }

    /// Queues any request body with this bearer (`None`: no header), for
    /// tests of malformed or refused requests.
    pub fn post(&self, bearer: Option<&str>, body: &Value) {
        lock(&self.asked).push(None);
        self.queue(bearer, body);
    }

    fn queue(&self, bearer: Option<&str>, body: &Value) {
        let headers = bearer
            .map(|b| vec![("Authorization".to_owned(), format!("Bearer {b}"))])
            .unwrap_or_default();
        self.sender.push(Delivery {
            url: format!("http://127.0.0.1:{}{PATH}", self.port),
            headers,
            content_type: "application/json".to_owned(),
            body: body.to_string().into_bytes(),
        });
    }

    /// The notifications' texts, each with when the kit first saw it.
    fn notifications(&self) -> Vec<(String, Instant)> {
        let all: Vec<String> = self
            .fake
            .notifications()
            .into_iter()
            .filter(|n| n.title.as_deref() == Some(TITLE))
            .map(|n| n.message)
            .collect();
        let mut seen = lock(&self.notified);
        for message in all.into_iter().skip(seen.len()) {
            seen.push((message, Instant::now()));
        }
        seen.clone()
    }

    /// Notification calls refused so far.
    fn refused(&self) -> usize {
        let left = self.fake.failures_left(NOTIFY);
        self.refused_before.load(Ordering::SeqCst)
            + self.scripted.load(Ordering::SeqCst).saturating_sub(left)
    }
}
