//! Slack's kit: the fake Socket Mode connection and Web API.

use std::time::{Duration, Instant};

use serde_json::json;

use talaria_adapter::MediaKind;

use super::{KitFile, Out, PlatformKit, Threaded, Uploaded, Who};
use crate::FakeSlack;
use crate::slack::PostFailure;
use crate::wait::WAIT;

/// The bot token the gateway is given.
pub const BOT_TOKEN: &str = "xoxb-kit-test-bot-token-0123456789";
/// The app-level token Socket Mode opens with.
pub const APP_TOKEN: &str = "xapp-1-kit-test-app-token-0123456789";

/// The fake Slack with a friend (`U42`, DM `D42`) and a stranger (`U7`,
/// DM `D7`).
pub struct SlackKit {
    /// The fake itself, for platform-specific tests.
    pub fake: FakeSlack,
}

fn user(who: Who) -> &'static str {
    match who {
        Who::Friend => "U42",
        Who::Stranger => "U7",
    }
}

impl PlatformKit for SlackKit {
    const NAME: &'static str = "slack";
    const DM_REPLY_QUOTES: bool = false;

    async fn start() -> SlackKit {
        SlackKit {
            fake: FakeSlack::start(BOT_TOKEN, APP_TOKEN).await,
        }
    }

    fn section(&self) -> String {
        format!(
            "  slack:\n    api_base: {}\n    ping_interval_ms: 100\n    ping_timeout_ms: 2000\n",
            self.fake.api_base()
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        vec![
            ("SLACK_BOT_TOKEN".into(), BOT_TOKEN.into()),
            ("SLACK_APP_TOKEN".into(), APP_TOKEN.into()),
            ("SLACK_ALLOWED_USERS".into(), user(Who::Friend).into()),
        ]
    }

    fn secret(&self) -> &str {
        BOT_TOKEN
    }

    fn connections(&self) -> usize {
        self.fake.connections()
    }

    async fn wait_connected(&self, n: usize) {
        self.fake.wait_for_connection(n, WAIT).await;
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        self.fake.push_dm(&self.dm_chat(who), user(who), text).1
    }

    fn dm_chat(&self, who: Who) -> String {
        format!("D{}", &user(who)[1..])
    }

    fn sent(&self) -> Vec<Out> {
        self.fake
            .posted()
            .into_iter()
            .map(|p| Out {
                text: p.rendered(),
                chat: p.channel,
                thread: p.thread_ts,
                wire: p.text,
                reply_to: None,
                at: p.at,
            })
            .collect()
    }

    async fn wait_sent(&self, n: usize) -> Vec<Out> {
        self.fake.wait_for_posts(n, WAIT).await;
        self.sent()
    }

    fn send_attempts(&self) -> Vec<Instant> {
        self.fake.post_attempts().iter().map(|r| r.at).collect()
    }

    async fn wait_send_attempts(&self, n: usize) {
        self.fake.wait_for_post_attempts(n, WAIT).await;
    }

    fn hang_send(&self, hang: bool) {
        self.fake.hang_post(hang);
    }

    fn push_dm_file(&self, who: Who, file: &KitFile, caption: &str) -> String {
        // Slack names every file; a clip recorded in the app is an
        // `audio_message` file of subtype `slack_audio`.
        let name = file.name.clone().unwrap_or_else(|| match file.kind {
            MediaKind::Voice => "audio_message.ogg".into(),
            MediaKind::Image => "image.png".into(),
            _ => "file".into(),
        });
        let mut object = self.fake.add_file(&name, &file.mime, &file.bytes);
        if file.kind == MediaKind::Voice {
            object["subtype"] = json!("slack_audio");
        }
        self.fake
            .push_dm_files(&self.dm_chat(who), user(who), caption, &[object])
            .1
    }

    fn uploads(&self) -> Vec<Uploaded> {
        // Slack shows a shared file by the type it reads from the name:
        // an image inline, audio and video with a player, anything else
        // as a file to download.
        self.fake
            .uploads()
            .into_iter()
            .map(|u| {
                let ext = u
                    .filename
                    .rsplit_once('.')
                    .map(|(_, e)| e.to_ascii_lowercase())
                    .unwrap_or_default();
                let kind = match ext.as_str() {
                    "png" | "jpg" | "jpeg" | "gif" | "webp" | "bmp" => MediaKind::Image,
                    "ogg" | "oga" | "opus" | "mp3" | "m4a" | "wav" | "aac" => MediaKind::Audio,
                    "mp4" | "webm" | "mov" | "mkv" => MediaKind::Video,
                    _ => MediaKind::Document,
                };
                Uploaded {
                    kind,
                    name: Some(u.filename),
                    bytes: u.bytes,
                }
            })
            .collect()
    }

    fn push_in_thread(&self, text: &str) -> Threaded {
        // Slack sends a mention twice (message and app_mention); the
        // answer must still come once, in the thread.
        let parent = "1700000000.900000";
        let bot = self.fake.bot_user_id();
        let text = format!("<@{bot}> {text}");
        let (_, ts) = self
            .fake
            .push_channel_message("C1", user(Who::Friend), &text, Some(parent));
        self.fake
            .push_app_mention("C1", user(Who::Friend), &text, &ts, Some(parent));
        Threaded {
            id: ts,
            chat: "C1".into(),
            thread: Some(parent.into()),
        }
    }

    fn redeliver(&self, id: &str, text: &str) {
        // The same message in a new envelope: what a retry after a lost
        // acknowledgement looks like once the connection was replaced.
        self.fake.push_event(json!({
            "type": "message", "channel": self.dm_chat(Who::Friend), "channel_type": "im",
            "user": user(Who::Friend), "text": text, "ts": id,
        }));
    }

    async fn drop_connection(&self) {
        // Only an acknowledged envelope is safe from Slack's re-delivery.
        self.fake.wait_for_all_acked(WAIT).await;
        self.fake.drop_connection();
    }

    fn rate_limit_next_send(&self, after: Duration) {
        self.fake
            .fail_next_post(PostFailure::RateLimited(after.as_secs().max(1)));
    }

    fn push_in_group(&self, text: &str, mention: bool) -> Threaded {
        // A top-level mention is answered at the top level; Slack sends
        // it twice (message and app_mention), as in a thread.
        let text = if mention {
            format!("<@{}> {text}", self.fake.bot_user_id())
        } else {
            text.to_owned()
        };
        let (_, ts) = self
            .fake
            .push_channel_message("C1", user(Who::Friend), &text, None);
        if mention {
            self.fake
                .push_app_mention("C1", user(Who::Friend), &text, &ts, None);
        }
        Threaded {
            id: ts,
            chat: "C1".into(),
            thread: None,
        }
    }

    fn push_stranger_in_group(&self, text: &str) {
        let bot = self.fake.bot_user_id();
        self.fake.push_channel_message(
            "C1",
            user(Who::Stranger),
            &format!("<@{bot}> {text}"),
            None,
        );
    }

    fn unacknowledged(&self) -> Option<usize> {
        Some(self.fake.pending())
    }

    async fn wait_acknowledged(&self) {
        self.fake.wait_for_all_acked(WAIT).await;
    }

    fn reactions(&self) -> Option<usize> {
        Some(self.fake.reactions().len())
    }
}
