//! Telegram's kit: the fake Bot API, long-polled.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use talaria_adapter::MediaKind;

use super::{KitFile, Out, PlatformKit, Threaded, Uploaded, Who};
use crate::FakeTelegram;
use crate::telegram::FileKind;
use crate::wait::WAIT;

/// The bot token the gateway is given.
pub const TOKEN: &str = "424242:kit-test-token-abcdefghijklmnop";

/// The fake Telegram with a friend (user `42`) and a stranger (`7`).
pub struct TelegramKit {
    /// The fake itself, for platform-specific tests.
    pub fake: FakeTelegram,
    /// Message ids the kit assigns, so a test knows what a reply names.
    next_message: AtomicI64,
}

fn user(who: Who) -> i64 {
    match who {
        Who::Friend => 42,
        Who::Stranger => 7,
    }
}

impl PlatformKit for TelegramKit {
    const NAME: &'static str = "telegram";
    const DM_REPLY_QUOTES: bool = true;

    async fn start() -> TelegramKit {
        TelegramKit {
            fake: FakeTelegram::start(TOKEN).await,
            next_message: AtomicI64::new(5_000),
        }
    }

    fn section(&self) -> String {
        format!(
            "  telegram:\n    base_url: {}\n    poll_timeout_secs: 1\n",
            self.fake.base_url()
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        vec![
            ("TELEGRAM_BOT_TOKEN".into(), TOKEN.into()),
            (
                "TELEGRAM_ALLOWED_USERS".into(),
                user(Who::Friend).to_string(),
            ),
        ]
    }

    fn secret(&self) -> &str {
        TOKEN
    }

    fn connections(&self) -> usize {
        self.fake.get_updates_calls().len()
    }

    async fn wait_connected(&self, n: usize) {
        self.fake.wait_for_get_updates_calls(n, WAIT).await;
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        let id = self.next_message.fetch_add(1, Ordering::Relaxed);
        self.push_private(who, id, text);
        id.to_string()
    }

    fn dm_chat(&self, who: Who) -> String {
        user(who).to_string()
    }

    fn sent(&self) -> Vec<Out> {
        sent(&self.fake)
    }

    async fn wait_sent(&self, n: usize) -> Vec<Out> {
        self.fake.wait_for_sent(n, WAIT).await;
        self.sent()
    }

    fn send_attempts(&self) -> Vec<Instant> {
        send_attempts(&self.fake)
    }

    async fn wait_send_attempts(&self, n: usize) {
        self.fake.wait_for_send_attempts(n, WAIT).await;
    }

    fn hang_send(&self, hang: bool) {
        self.fake.hang_send(hang);
    }

    fn push_dm_file(&self, who: Who, file: &KitFile, caption: &str) -> String {
        let kind = match file.kind {
            MediaKind::Image => FileKind::Photo,
            MediaKind::Voice => FileKind::Voice,
            MediaKind::Audio => FileKind::Audio,
            MediaKind::Video => FileKind::Video,
            MediaKind::Document => FileKind::Document,
        };
        let id = self
            .fake
            .add_file(file.bytes.clone(), file.name.as_deref(), Some(&file.mime));
        let caption = Some(caption).filter(|c| !c.is_empty());
        self.fake
            .push_private_file(user(who), kind, &id, caption)
            .to_string()
    }

    fn uploads(&self) -> Vec<Uploaded> {
        self.fake
            .uploads()
            .into_iter()
            .map(|u| Uploaded {
                kind: match u.field.as_str() {
                    "photo" => MediaKind::Image,
                    "voice" => MediaKind::Voice,
                    "audio" => MediaKind::Audio,
                    "video" => MediaKind::Video,
                    _ => MediaKind::Document,
                },
                name: u.file_name,
                bytes: u.bytes,
            })
            .collect()
    }

    fn push_in_thread(&self, text: &str) -> Threaded {
        // A forum topic is Telegram's thread.
        let id = self.next_message.fetch_add(1, Ordering::Relaxed);
        let message = json!({
            "message_id": id, "text": text, "message_thread_id": 17, "is_topic_message": true,
            "chat": {"id": -100500, "type": "supergroup", "title": "Group", "is_forum": true},
            "from": {"id": user(Who::Friend), "is_bot": false, "first_name": "U"},
        });
        self.fake.push_update(json!({ "message": message }));
        Threaded {
            id: id.to_string(),
            chat: "-100500".into(),
            thread: Some("17".into()),
        }
    }

    fn redeliver(&self, id: &str, text: &str) {
        // The same message in a new update: a replayed poll.
        let id = id.parse().unwrap_or_default();
        self.push_private(Who::Friend, id, text);
    }

    fn rate_limit_next_send(&self, after: Duration) {
        self.fake.fail_next_send_with_429(after.as_secs().max(1));
    }

    fn push_in_group(&self, text: &str, mention: bool) -> Threaded {
        let text = if mention {
            format!("@{} {text}", self.fake.bot_username())
        } else {
            text.to_owned()
        };
        let id = self
            .fake
            .push_group_text(-100500, user(Who::Friend), &text, None, false);
        Threaded {
            id: id.to_string(),
            chat: "-100500".into(),
            thread: None,
        }
    }

    fn push_stranger_in_group(&self, text: &str) {
        self.fake
            .push_group_text(-100500, user(Who::Stranger), text, None, false);
    }

    /// The offset moves past an update only after the adapter handed
    /// over its whole batch.
    async fn wait_handed_over(&self) {
        self.fake.wait_for_confirmed_updates(WAIT).await;
    }

    fn typed_in(&self, chat: &str) -> Option<bool> {
        Some(
            self.fake
                .chat_actions()
                .iter()
                .any(|a| a.chat_id.to_string() == chat && a.action == "typing"),
        )
    }
}

impl TelegramKit {
    fn push_private(&self, who: Who, id: i64, text: &str) {
        let from = user(who);
        self.fake.push_update(json!({ "message": {
            "message_id": id, "text": text,
            "chat": {"id": from, "type": "private", "first_name": "U"},
            "from": {"id": from, "is_bot": false, "first_name": "U"},
        }}));
    }
}

/// What the fake Bot API was sent, as the suites read it (also for kits
/// whose answers go out through Telegram, such as the webhook routes').
pub(crate) fn sent(fake: &FakeTelegram) -> Vec<Out> {
    fake.sent()
        .into_iter()
        .map(|s| Out {
            chat: s.chat_id.to_string(),
            thread: s.thread_id.map(|t| t.to_string()),
            text: s.rendered(),
            wire: s.text,
            reply_to: s.reply_to.map(|r| r.to_string()),
            at: s.at,
        })
        .collect()
}

/// When each send request reached the fake Bot API, answered or not.
pub(crate) fn send_attempts(fake: &FakeTelegram) -> Vec<Instant> {
    fake.send_attempts().iter().map(|r| r.at).collect()
}
