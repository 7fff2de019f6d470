//! LINE's kit: the fake Messaging API for what the bot sends, and LINE's
//! signed webhook deliveries to the gateway's shared listener for what it
//! receives.
//!
//! Deliveries are posted one at a time, in order, and posted again until
//! the listener takes one with a 200, as LINE does with webhook
//! redelivery on: one posted while the gateway is down or starting
//! arrives once it is up.

use std::time::{Duration, Instant};

use talaria_adapter::MediaKind;

use super::deliver::{Delivery, Sender, free_port};
use super::{KitFile, Out, PlatformKit, Threaded, Who};
use crate::line::{Event, Failure, FakeLine, Mentionee, Source, sign, webhook_body};
use crate::wait::{WAIT, wait_for};

/// The channel access token the gateway is given.
pub const TOKEN: &str = "kit-line-channel-access-token-0123456789";
/// The channel secret LINE signs deliveries with.
pub const SECRET: &str = "kit-line-channel-secret-abcdef";
/// The bot's own user id (a delivery's `destination`).
pub const BOT: &str = "U00000000000000000000000000000b07";
/// The allowlisted user.
pub const ADA: &str = "U0123456789abcdef0123456789abcdef";
/// A user on no list.
pub const MALLORY: &str = "Ufedcba9876543210fedcba9876543210";
/// The group both are in.
pub const GROUP: &str = "C0123456789abcdef0123456789abc000";
/// How the bot is called in a mention.
const MENTION: &str = "@Talaria";

/// The user id of `who`.
pub fn user(who: Who) -> &'static str {
    match who {
        Who::Friend => ADA,
        Who::Stranger => MALLORY,
    }
}

/// The fake LINE API and LINE's deliveries to the listener.
pub struct LineKit {
    /// The fake itself, for platform-specific tests.
    pub fake: FakeLine,
    /// The shared listener's port, named in the kit's section.
    pub port: u16,
    /// Posts the deliveries, in order, until the listener takes them.
    pub sender: Sender,
}

impl LineKit {
    /// Queues `events` as one signed delivery.
    pub fn deliver(&self, events: &[serde_json::Value]) {
        let body = webhook_body(BOT, events);
        let signature = sign(SECRET, &body);
        self.post(body, Some(&signature));
    }

    /// Queues `body` with this signature header (`None`: none), for tests
    /// of refused deliveries.
    pub fn post(&self, body: Vec<u8>, signature: Option<&str>) {
        let headers = signature
            .map(|s| vec![("x-line-signature".to_owned(), s.to_owned())])
            .unwrap_or_default();
        self.sender.push(Delivery {
            url: format!("http://127.0.0.1:{}/line/webhook", self.port),
            headers,
            content_type: "application/json; charset=utf-8".to_owned(),
            body,
        });
    }

    /// A text from `who` in their one-to-one chat, delivered.
    pub fn dm(&self, who: Who, text: &str) -> Event {
        let event = self
            .fake
            .text_event(&Source::User(user(who).to_owned()), text, &[]);
        self.deliver(std::slice::from_ref(&event.json));
        event
    }

    /// A text from `who` in the group, mentioning the bot first when
    /// `mention`, delivered.
    pub fn in_group(&self, who: Who, text: &str, mention: bool) -> Event {
        let source = Source::Group {
            group: GROUP.to_owned(),
            user: user(who).to_owned(),
        };
        let event = if mention {
            let said = format!("{MENTION} {text}");
            let m = Mentionee {
                index: 0,
                length: MENTION.encode_utf16().count(),
                user_id: BOT.to_owned(),
                is_self: true,
            };
            self.fake.text_event(&source, &said, &[m])
        } else {
            self.fake.text_event(&source, text, &[])
        };
        self.deliver(std::slice::from_ref(&event.json));
        event
    }
}

impl PlatformKit for LineKit {
    const NAME: &'static str = "line";
    // The first part of an answer quotes the question while the gateway
    // holds the question's quote token; one restarted since does not, so
    // quoting is not promised.
    const DM_REPLY_QUOTES: bool = false;

    async fn start() -> LineKit {
        LineKit {
            fake: FakeLine::start(TOKEN, BOT),
            port: free_port(),
            sender: Sender::start(),
        }
    }

    fn section(&self) -> String {
        let base = self.fake.base_url();
        format!(
            "  webhook:\n    port: {}\n  line:\n    api_base: {base}\n    data_base: {base}\n",
            self.port
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        [
            ("LINE_CHANNEL_ACCESS_TOKEN", TOKEN),
            ("LINE_CHANNEL_SECRET", SECRET),
            ("LINE_ALLOWED_USERS", ADA),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    fn secret(&self) -> &str {
        TOKEN
    }

    /// Each adapter run checks its token first (`GET /v2/bot/info`).
    fn connections(&self) -> usize {
        self.fake
            .requests()
            .iter()
            .filter(|r| r.path == "/v2/bot/info")
            .count()
    }

    async fn wait_connected(&self, n: usize) {
        wait_for(&format!("{n} token checks"), || async {
            let got = self.connections();
            if got >= n { Ok(()) } else { Err(got) }
        })
        .await;
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        self.dm(who, text).message_id
    }

    fn push_dm_file(&self, who: Who, file: &KitFile, _caption: &str) -> String {
        // LINE's media messages carry no caption, and a user cannot add
        // one: what they type next is a message of its own.
        let kind = match file.kind {
            MediaKind::Image => "image",
            MediaKind::Video => "video",
            MediaKind::Voice | MediaKind::Audio => "audio",
            MediaKind::Document => "file",
        };
        let source = Source::User(user(who).to_owned());
        let event =
            self.fake
                .file_event(&source, kind, &file.bytes, &file.mime, file.name.as_deref());
        self.deliver(std::slice::from_ref(&event.json));
        event.message_id
    }

    fn dm_chat(&self, who: Who) -> String {
        user(who).to_owned()
    }

    fn sent(&self) -> Vec<Out> {
        self.fake
            .sent()
            .into_iter()
            .map(|s| Out {
                chat: s.to,
                thread: None,
                text: s.text.clone(),
                wire: s.text,
                reply_to: s.quoted,
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
        self.fake.hang_sends(hang);
    }

    fn redeliver(&self, id: &str, text: &str) {
        // LINE posts the same event again, flagged, when the first
        // delivery was not answered 200.
        let mut event = self
            .fake
            .text_event(&Source::User(ADA.to_owned()), text, &[])
            .json;
        event["message"]["id"] = serde_json::json!(id);
        event["deliveryContext"]["isRedelivery"] = serde_json::json!(true);
        self.deliver(&[event]);
    }

    fn rate_limit_next_send(&self, after: Duration) {
        self.fake.fail_next_send(Failure::TooManyRequests {
            retry_after: Some(after.as_secs().max(1)),
        });
    }

    fn push_stranger_in_group(&self, text: &str) {
        self.in_group(Who::Stranger, text, true);
    }

    fn push_in_group(&self, text: &str, mention: bool) -> Threaded {
        let event = self.in_group(Who::Friend, text, mention);
        Threaded {
            id: event.message_id,
            chat: GROUP.to_owned(),
            thread: None,
        }
    }

    fn typed_in(&self, chat: &str) -> Option<bool> {
        Some(self.fake.loading().iter().any(|(c, _)| c == chat))
    }

    fn unacknowledged(&self) -> Option<usize> {
        Some(self.sender.pending())
    }

    async fn wait_acknowledged(&self) {
        self.sender.wait_all_taken().await;
    }
}
