//! Discord's kit: the fake gateway WebSocket and REST API.

use std::time::{Duration, Instant};

use serde_json::json;

use talaria_adapter::MediaKind;

use super::{KitFile, Out, PlatformKit, Threaded, Uploaded, Who};
use crate::FakeDiscord;
use crate::wait::WAIT;

/// The bot token the gateway is given.
pub const TOKEN: &str = "MTk4NjIy.kit.discord-test-token";

/// The fake Discord with a friend (`42`) and a stranger (`7`).
pub struct DiscordKit {
    /// The fake itself, for platform-specific tests.
    pub fake: FakeDiscord,
}

fn user(who: Who) -> &'static str {
    match who {
        Who::Friend => "42",
        Who::Stranger => "7",
    }
}

impl PlatformKit for DiscordKit {
    const NAME: &'static str = "discord";
    const DM_REPLY_QUOTES: bool = true;

    async fn start() -> DiscordKit {
        // A short heartbeat keeps the client's heartbeating busy while turns run.
        let fake = FakeDiscord::start_with_heartbeat(TOKEN, Duration::from_millis(500)).await;
        DiscordKit { fake }
    }

    fn section(&self) -> String {
        format!("  discord:\n    api_base: {}\n", self.fake.api_base())
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        vec![
            ("DISCORD_BOT_TOKEN".into(), TOKEN.into()),
            ("DISCORD_ALLOWED_USERS".into(), user(Who::Friend).into()),
        ]
    }

    fn secret(&self) -> &str {
        TOKEN
    }

    fn connections(&self) -> usize {
        let (ready, resumed) = self.fake.ready_and_resumed();
        ready + resumed
    }

    async fn wait_connected(&self, n: usize) {
        self.fake.wait_for_sessions(n, WAIT).await;
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        self.fake.push_dm(user(who), text)
    }

    fn dm_chat(&self, who: Who) -> String {
        FakeDiscord::dm_channel(user(who))
    }

    fn sent(&self) -> Vec<Out> {
        self.fake
            .sent()
            .into_iter()
            .map(|s| Out {
                chat: s.channel_id,
                thread: None,
                text: s.content.clone(),
                wire: s.content,
                reply_to: s.reply_to,
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

    fn push_dm_file(&self, who: Who, file: &KitFile, caption: &str) -> String {
        // Discord carries every file as an attachment; a voice message is
        // one recorded in the app, flagged on the message.
        let name = file.name.clone().unwrap_or_else(|| match file.kind {
            MediaKind::Voice => "voice-message.ogg".to_owned(),
            _ => "file".to_owned(),
        });
        let channel = self.dm_chat(who);
        let attachment = self
            .fake
            .add_file(&channel, file.bytes.clone(), &name, Some(&file.mime));
        self.fake.push_dm_with_files(
            user(who),
            caption,
            &[attachment],
            file.kind == MediaKind::Voice,
        )
    }

    fn uploads(&self) -> Vec<Uploaded> {
        // Discord shows an attachment by its type: an image inline, audio
        // with a player; a voice message is one flagged as such.
        self.fake
            .uploads()
            .into_iter()
            .flat_map(|u| {
                let voice = u.payload["flags"].as_u64().unwrap_or(0) & (1 << 13) != 0;
                u.files.into_iter().map(move |f| {
                    let mime = f.content_type.as_deref().unwrap_or("");
                    let kind = if voice {
                        MediaKind::Voice
                    } else {
                        kind_of_mime(mime)
                    };
                    Uploaded {
                        kind,
                        name: f.file_name,
                        bytes: f.bytes,
                    }
                })
            })
            .collect()
    }

    fn push_in_thread(&self, text: &str) -> Threaded {
        // Guild channels need a mention by default; a thread is a channel
        // of its own, so the answer's channel is the thread's id.
        let at = self.fake.mention();
        let id = self
            .fake
            .push_thread_message("7", "70", "7001", "42", &format!("{at} {text}"));
        Threaded {
            id,
            chat: "7001".into(),
            thread: None,
        }
    }

    fn redeliver(&self, id: &str, text: &str) {
        self.fake
            .push_message(json!({"id": id, "channel_id": self.dm_chat(Who::Friend),
            "content": text, "author": {"id": user(Who::Friend), "username": "ada"}}));
    }

    async fn drop_connection(&self) {
        assert!(self.fake.drop_connection());
        self.fake.wait_for_detached(WAIT).await;
    }

    fn rate_limit_next_send(&self, after: Duration) {
        self.fake
            .fail_next_send_with_429(after.as_secs_f64(), false);
    }

    fn push_in_group(&self, text: &str, mention: bool) -> Threaded {
        let text = if mention {
            format!("{} {text}", self.fake.mention())
        } else {
            text.to_owned()
        };
        let id = self
            .fake
            .push_guild_message("7", "70", user(Who::Friend), &text);
        Threaded {
            id,
            chat: "70".into(),
            thread: None,
        }
    }

    fn push_stranger_in_group(&self, text: &str) {
        let at = self.fake.mention();
        self.fake
            .push_guild_message("7", "70", user(Who::Stranger), &format!("{at} {text}"));
    }

    fn typed_in(&self, chat: &str) -> Option<bool> {
        Some(self.fake.typing().iter().any(|t| t.channel_id == chat))
    }

    fn last_connection_resumed(&self) -> Option<bool> {
        // One READY, then one RESUMED for the one drop the scenario makes:
        // never identified afresh, never resumed twice.
        let (ready, resumed) = self.fake.ready_and_resumed();
        Some((ready, resumed) == (1, 1))
    }
}

/// How Discord shows an attachment of type `mime`.
fn kind_of_mime(mime: &str) -> MediaKind {
    match mime.split('/').next().unwrap_or("") {
        "image" => MediaKind::Image,
        "audio" => MediaKind::Audio,
        "video" => MediaKind::Video,
        _ => MediaKind::Document,
    }
}
