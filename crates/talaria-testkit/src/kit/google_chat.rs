//! Google Chat's kit: the fake Google for tokens and answers, and Chat's
//! signed event posts to the gateway's shared listener.
//!
//! Like Chat, the kit posts an event in a space only when it mentions the
//! app: an unaddressed message in a space never reaches an app.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::deliver::{Delivery, Sender, free_port};
use super::{Out, PlatformKit, Threaded, Who};
use crate::google_chat::{Failure, FakeGoogle};
use crate::wait::{WAIT, wait_for};

/// The app's authentication audience: the project number.
pub const PROJECT: &str = "123456789012";
/// The allowlisted user.
pub const ADA: &str = "ada@example.com";
/// A user on no list.
pub const MALLORY: &str = "mallory@example.com";
/// The space both are in.
pub const SPACE: &str = "spaces/AAAATEAM";

/// The address of `who`.
pub fn email(who: Who) -> &'static str {
    match who {
        Who::Friend => ADA,
        Who::Stranger => MALLORY,
    }
}

/// The DM space of `who` with the app.
pub fn dm_space(who: Who) -> &'static str {
    match who {
        Who::Friend => "spaces/DMADA",
        Who::Stranger => "spaces/DMMALLORY",
    }
}

/// The fake Google and Chat's posts.
pub struct GoogleChatKit {
    /// The fake itself.
    pub fake: FakeGoogle,
    /// The shared listener's port.
    pub port: u16,
    /// Posts the events, in order.
    pub sender: Sender,
    dir: tempfile::TempDir,
    next: AtomicU64,
}

impl GoogleChatKit {
    /// Posts `event` with `token` as its bearer token.
    pub fn post_with(&self, event: &Value, token: Option<&str>) {
        let headers = token
            .map(|t| vec![("Authorization".to_owned(), format!("Bearer {t}"))])
            .unwrap_or_default();
        self.sender.push(Delivery {
            url: format!("http://127.0.0.1:{}/google_chat/events", self.port),
            headers,
            content_type: "application/json".to_owned(),
            body: event.to_string().into_bytes(),
        });
    }

    /// Posts `event` signed as Chat signs it.
    pub fn post(&self, event: &Value) {
        let token = self.fake.event_token(PROJECT);
        self.post_with(event, Some(&token));
    }

    /// A MESSAGE event from `who` in `space`, in `thread` (a new one when
    /// `None`); returns the event and the message's name.
    pub fn message_event(
        &self,
        who: Who,
        space: &str,
        dm: bool,
        thread: Option<&str>,
        text: &str,
        argument: &str,
    ) -> (Value, String) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("{space}/messages/m{n}");
        let thread = thread
            .map(str::to_owned)
            .unwrap_or_else(|| format!("{space}/threads/t{n}"));
        let user = json!({"name": format!("users/{}", email(who).len() * 1000 + n as usize),
                          "displayName": email(who), "email": email(who), "type": "HUMAN"});
        let space_json = if dm {
            json!({"name": space, "type": "DM", "spaceType": "DIRECT_MESSAGE", "singleUserBotDm": true})
        } else {
            json!({"name": space, "type": "ROOM", "spaceType": "SPACE", "displayName": "Team"})
        };
        let event = json!({
            "type": "MESSAGE", "eventTime": "2026-12-07T09:00:00.000000Z",
            "space": space_json, "user": user,
            "message": {"name": name, "sender": user, "createTime": "2026-12-07T09:00:00Z",
                        "text": text, "argumentText": argument,
                        "thread": {"name": thread}, "space": {"name": space}},
        });
        (event, name)
    }

    fn in_space(&self, who: Who, text: &str) -> (String, String) {
        let said = format!("@Talaria {text}");
        let (event, name) = self.message_event(who, SPACE, false, None, &said, &format!(" {text}"));
        let thread = event["message"]["thread"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        self.post(&event);
        (name, thread)
    }
}

impl PlatformKit for GoogleChatKit {
    const NAME: &'static str = "google_chat";
    const DM_REPLY_QUOTES: bool = false;

    async fn start() -> GoogleChatKit {
        GoogleChatKit {
            fake: FakeGoogle::start(),
            port: free_port(),
            sender: Sender::start(),
            dir: tempfile::tempdir().expect("a temporary folder"),
            next: AtomicU64::new(1),
        }
    }

    fn section(&self) -> String {
        format!(
            "  webhook:\n    port: {}\n  google_chat:\n    api_base: {}\n    jwks_urls: [\"{}\"]\n",
            self.port,
            self.fake.base_url(),
            self.fake.jwks_url()
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        let key = self.dir.path().join("service-account.json");
        std::fs::write(&key, self.fake.service_account_json()).expect("the key file");
        vec![
            (
                "GOOGLE_CHAT_SERVICE_ACCOUNT_JSON".to_owned(),
                key.display().to_string(),
            ),
            (
                "GOOGLE_CHAT_HTTP_EVENTS_AUDIENCE".to_owned(),
                PROJECT.to_owned(),
            ),
            ("GOOGLE_CHAT_ALLOWED_USERS".to_owned(), ADA.to_owned()),
        ]
    }

    fn secret(&self) -> &str {
        self.fake.private_key_line()
    }

    /// Each adapter run fetches an access token first.
    fn connections(&self) -> usize {
        self.fake
            .requests()
            .iter()
            .filter(|r| r.path == "/token")
            .count()
    }

    async fn wait_connected(&self, n: usize) {
        wait_for(&format!("{n} token requests"), || async {
            let got = self.connections();
            if got >= n { Ok(()) } else { Err(got) }
        })
        .await;
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        let (event, name) = self.message_event(who, dm_space(who), true, None, text, text);
        self.post(&event);
        name
    }

    fn dm_chat(&self, who: Who) -> String {
        dm_space(who).to_owned()
    }

    fn sent(&self) -> Vec<Out> {
        self.fake
            .sent()
            .into_iter()
            .map(|s| Out {
                chat: s.space,
                thread: s.thread,
                text: s.text.clone(),
                wire: s.text,
                reply_to: None,
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

    fn push_in_thread(&self, text: &str) -> Threaded {
        let (id, thread) = self.in_space(Who::Friend, text);
        Threaded {
            id,
            chat: SPACE.to_owned(),
            thread: Some(thread),
        }
    }

    fn redeliver(&self, id: &str, text: &str) {
        // Chat posts the same event again (its delivery timed out).
        let (mut event, _) =
            self.message_event(Who::Friend, dm_space(Who::Friend), true, None, text, text);
        event["message"]["name"] = json!(id);
        self.post(&event);
    }

    fn rate_limit_next_send(&self, after: Duration) {
        self.fake.fail_next_send(Failure::Status {
            status: 429,
            code: "RESOURCE_EXHAUSTED".into(),
            retry_after: Some(after.as_secs().max(1)),
        });
    }

    fn push_stranger_in_group(&self, text: &str) {
        self.in_space(Who::Stranger, text);
    }

    fn push_in_group(&self, text: &str, mention: bool) -> Threaded {
        if !mention {
            // Chat does not post a space message that does not mention
            // the app.
            return Threaded {
                id: String::new(),
                chat: SPACE.to_owned(),
                thread: None,
            };
        }
        let (id, thread) = self.in_space(Who::Friend, text);
        Threaded {
            id,
            chat: SPACE.to_owned(),
            thread: Some(thread),
        }
    }

    fn unacknowledged(&self) -> Option<usize> {
        Some(self.sender.pending())
    }

    async fn wait_acknowledged(&self) {
        self.sender.wait_all_taken().await;
    }
}
