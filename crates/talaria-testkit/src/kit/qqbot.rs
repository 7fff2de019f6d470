//! QQ Bot's kit: the fake QQ open platform (token, OpenAPI, gateway).
//!
//! The friend and the stranger write 1:1 (C2C) by their openids. The
//! shared chat the suite's group scenario uses is a guild channel: QQ
//! groups deliver only messages that @-mention the bot, so an unaddressed
//! message can only be shown to the adapter where QQ delivers those too,
//! a guild channel to a bot with `GUILD_MESSAGES` (which the kit's section
//! turns on with `all_guild_messages`).

use std::time::{Duration, Instant};

use serde_json::json;

use talaria_adapter::MediaKind;

use super::{KitFile, Out, PlatformKit, Threaded, Uploaded, Who};
use crate::qqbot::FakeQq;
use crate::wait::WAIT;

/// The bot's AppID.
pub const APP_ID: &str = "102030405";

/// The bot's AppSecret.
pub const SECRET: &str = "qq-kit-client-secret-8f3a1c";

/// The guild and channel of the group scenario.
pub const GUILD: &str = "6240001";
/// The channel in [`GUILD`].
pub const CHANNEL: &str = "6240002";

/// The fake QQ with a friend and a stranger.
pub struct QqbotKit {
    /// The fake itself, for platform-specific tests.
    pub fake: FakeQq,
}

/// The user's openid in C2C.
pub fn openid(who: Who) -> &'static str {
    match who {
        Who::Friend => "E4F1A2B3C4D5E6F7A8B9C0D1E2F3A4B5",
        Who::Stranger => "0A0B0C0D0E0F1A1B1C1D1E1F2A2B2C2D",
    }
}

/// A guild member's user id.
pub fn guild_user(who: Who) -> &'static str {
    match who {
        Who::Friend => "144115218677563842",
        Who::Stranger => "144115218677560007",
    }
}

/// The chat id the adapter names a fake's recipient by.
fn chat_of(scope: &str, target: &str) -> String {
    match scope {
        "users" => target.to_owned(),
        "groups" => format!("group:{target}"),
        "channels" => format!("channel:{target}"),
        _ => format!("dms:{target}"),
    }
}

impl PlatformKit for QqbotKit {
    const NAME: &'static str = "qqbot";
    // A passive reply names the message by `msg_id` on every part, which
    // QQ does not show as a quote.
    const DM_REPLY_QUOTES: bool = false;

    async fn start() -> QqbotKit {
        let fake = FakeQq::start(APP_ID, SECRET, Duration::from_millis(500)).await;
        QqbotKit { fake }
    }

    fn section(&self) -> String {
        format!(
            "  qqbot:\n    api_base: {}\n    bots_base: {}\n    all_guild_messages: true\n    media_hosts: [127.0.0.1]\n",
            self.fake.api_base(),
            self.fake.api_base()
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        let friends = format!("{},{}", openid(Who::Friend), guild_user(Who::Friend));
        vec![
            ("QQ_APP_ID".into(), APP_ID.into()),
            ("QQ_CLIENT_SECRET".into(), SECRET.into()),
            ("QQ_ALLOWED_USERS".into(), friends),
        ]
    }

    fn secret(&self) -> &str {
        SECRET
    }

    fn connections(&self) -> usize {
        let (ready, resumed) = self.fake.ready_and_resumed();
        ready + resumed
    }

    async fn wait_connected(&self, n: usize) {
        self.fake.wait_for_sessions(n, WAIT).await;
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        self.fake.push_c2c(openid(who), text)
    }

    fn push_dm_file(&self, who: Who, file: &KitFile, caption: &str) -> String {
        let n = self.fake.requests().len();
        let name = file.name.clone().unwrap_or_else(|| "file.bin".to_owned());
        let url = self
            .fake
            .serve_media(&format!("{n}-{name}"), file.bytes.clone());
        let attachment = match file.kind {
            // QQ names voice messages `voice` and adds a WAV rendering.
            MediaKind::Voice => json!({"content_type": "voice", "url": url,
                "voice_wav_url": url, "filename": name, "size": file.bytes.len()}),
            MediaKind::Image | MediaKind::Video => json!({"content_type": file.mime,
                "url": url, "filename": name, "size": file.bytes.len()}),
            MediaKind::Audio | MediaKind::Document => json!({"content_type": "file",
                "url": url, "filename": name, "size": file.bytes.len()}),
        };
        self.fake
            .push_c2c_with(openid(who), caption, json!([attachment]))
    }

    fn uploads(&self) -> Vec<Uploaded> {
        self.fake
            .media_sent()
            .into_iter()
            .map(|m| Uploaded {
                kind: match m.file_type {
                    1 => MediaKind::Image,
                    2 => MediaKind::Video,
                    3 => MediaKind::Voice,
                    _ => MediaKind::Document,
                },
                name: m.name,
                bytes: m.bytes,
            })
            .collect()
    }

    fn dm_chat(&self, who: Who) -> String {
        openid(who).to_owned()
    }

    fn sent(&self) -> Vec<Out> {
        self.fake
            .sent()
            .into_iter()
            .map(|s| Out {
                chat: chat_of(&s.scope, &s.target),
                thread: None,
                text: s.text.clone(),
                wire: s.text,
                reply_to: s.msg_id,
                at: s.at,
            })
            .collect()
    }

    async fn wait_sent(&self, n: usize) -> Vec<Out> {
        self.fake.wait_for_sent(n, WAIT).await;
        self.sent()
    }

    fn send_attempts(&self) -> Vec<Instant> {
        self.fake.send_attempts().iter().map(|r| r.at).collect()
    }

    async fn wait_send_attempts(&self, n: usize) {
        self.fake.wait_for_send_attempts(n, WAIT).await;
    }

    fn hang_send(&self, hang: bool) {
        self.fake.hang_send(hang);
    }

    fn redeliver(&self, id: &str, text: &str) {
        // QQ replays a message with its own id (after a resume, or when
        // it thinks a delivery was lost).
        self.fake.push_message(
            "C2C_MESSAGE_CREATE",
            json!({"id": id, "content": text, "author": {"user_openid": openid(Who::Friend)}}),
        );
    }

    async fn drop_connection(&self) {
        assert!(self.fake.drop_connection());
        self.fake.wait_for_detached(WAIT).await;
    }

    fn rate_limit_next_send(&self, after: Duration) {
        self.fake.rate_limit_next_send(after.as_secs_f64());
    }

    fn push_stranger_in_group(&self, text: &str) {
        self.fake.push_group_at(
            "GROUPOPENID00000000000000000001",
            openid(Who::Stranger),
            text,
        );
        self.fake
            .push_guild(GUILD, CHANNEL, guild_user(Who::Stranger), text, true);
    }

    fn push_in_group(&self, text: &str, mention: bool) -> Threaded {
        let id = self
            .fake
            .push_guild(GUILD, CHANNEL, guild_user(Who::Friend), text, mention);
        Threaded {
            id,
            chat: format!("channel:{CHANNEL}"),
            thread: None,
        }
    }

    fn typed_in(&self, chat: &str) -> Option<bool> {
        Some(self.fake.typing().iter().any(|t| t.openid == chat))
    }

    fn last_connection_resumed(&self) -> Option<bool> {
        let (ready, resumed) = self.fake.ready_and_resumed();
        Some((ready, resumed) == (1, 1))
    }
}
