//! Mattermost's kit: the fake API v4 and its WebSocket event stream.

use std::time::{Duration, Instant};

use talaria_adapter::MediaKind;

use super::{KitFile, Out, PlatformKit, Threaded, Uploaded, Who};
use crate::FakeMattermost;
use crate::mattermost::NewPost;
use crate::wait::WAIT;

/// The personal access token the gateway is given.
pub const TOKEN: &str = "mmkittesttoken0123456789ab";

/// The fake Mattermost with a friend (`alice`) and a stranger (`mallory`).
pub struct MattermostKit {
    /// The fake itself, for platform-specific tests.
    pub fake: FakeMattermost,
}

fn user(who: Who) -> &'static str {
    match who {
        Who::Friend => "alice",
        Who::Stranger => "mallory",
    }
}

impl PlatformKit for MattermostKit {
    const NAME: &'static str = "mattermost";
    const DM_REPLY_QUOTES: bool = false;

    async fn start() -> MattermostKit {
        MattermostKit {
            fake: FakeMattermost::start(TOKEN).await,
        }
    }

    fn section(&self) -> String {
        format!(
            "  mattermost:\n    url: {}\n    ping_interval_secs: 1\n",
            self.fake.url()
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        vec![
            ("MATTERMOST_TOKEN".into(), TOKEN.into()),
            ("MATTERMOST_ALLOWED_USERS".into(), user(Who::Friend).into()),
        ]
    }

    fn secret(&self) -> &str {
        TOKEN
    }

    fn connections(&self) -> usize {
        self.fake.connections().len()
    }

    async fn wait_connected(&self, n: usize) {
        self.fake.wait_for_connections(n, WAIT).await;
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        self.fake.push(NewPost::dm(user(who), text))
    }

    fn dm_chat(&self, who: Who) -> String {
        format!("dm{}", user(who))
    }

    fn sent(&self) -> Vec<Out> {
        self.fake
            .posts()
            .into_iter()
            .map(|p| Out {
                chat: p.channel_id,
                thread: p.root_id,
                text: p.message.clone(),
                wire: p.message,
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
        self.fake.hang_posts(hang);
    }

    fn push_dm_file(&self, who: Who, file: &KitFile, caption: &str) -> String {
        // Mattermost has only files, each with a name: a recording made
        // in the app is a file like any other.
        let name = file.name.clone().unwrap_or_else(|| match file.kind {
            MediaKind::Voice | MediaKind::Audio => "voice.ogg".into(),
            MediaKind::Image => "image.png".into(),
            _ => "file".into(),
        });
        let id = self
            .fake
            .add_file(&self.dm_chat(who), &name, &file.mime, &file.bytes);
        self.fake
            .push(NewPost::dm(user(who), caption).with_files(&[&id]))
    }

    fn uploads(&self) -> Vec<Uploaded> {
        // Mattermost shows a file by the type it reads from the name's
        // extension: an image inline, audio and video with a player,
        // anything else as a file to download.
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
        // A channel mention opens a thread rooted at the mentioning post.
        let bot = self.fake.bot_username();
        let id = self.fake.push(NewPost::channel(
            "town",
            user(Who::Friend),
            &format!("@{bot} {text}"),
        ));
        Threaded {
            chat: "town".into(),
            thread: Some(id.clone()),
            id,
        }
    }

    fn redeliver(&self, id: &str, text: &str) {
        self.fake
            .push(NewPost::dm(user(Who::Friend), text).with_id(id));
    }

    async fn drop_connection(&self) {
        self.fake.drop_connection();
    }

    fn rate_limit_next_send(&self, after: Duration) {
        let secs = after.as_secs().max(1);
        self.fake.fail_next_posts_with_429(secs, Some(secs));
    }

    fn push_in_group(&self, text: &str, mention: bool) -> Threaded {
        // A channel mention opens a thread rooted at the mentioning post.
        let text = if mention {
            format!("@{} {text}", self.fake.bot_username())
        } else {
            text.to_owned()
        };
        let id = self
            .fake
            .push(NewPost::channel("town", user(Who::Friend), &text));
        Threaded {
            chat: "town".into(),
            thread: Some(id.clone()),
            id,
        }
    }

    fn push_stranger_in_group(&self, text: &str) {
        let bot = self.fake.bot_username();
        self.fake.push(NewPost::channel(
            "town",
            user(Who::Stranger),
            &format!("@{bot} {text}"),
        ));
    }

    fn typed_in(&self, chat: &str) -> Option<bool> {
        let bot = self.fake.bot_id();
        Some(
            self.fake
                .typing()
                .iter()
                .any(|t| t.channel_id == chat && t.user_id == bot),
        )
    }

    fn last_connection_resumed(&self) -> Option<bool> {
        Some(self.fake.connections().last().is_some_and(|c| c.resumed))
    }
}
