//! BlueBubbles' kit: the fake server for what the bot sends, and the
//! server's webhook posts to the gateway's shared listener for what it
//! receives.
//!
//! A message arriving in Messages joins the server's list first (which
//! the adapter's catch-up reads) and is then posted to every webhook the
//! adapter registered, at the URL it registered; before any registration
//! it is only in the list, as on a real server.

use std::time::Instant;

use serde_json::Value;
use talaria_adapter::MediaKind;

use super::deliver::{Delivery, Sender, free_port};
use super::{KitFile, Out, PlatformKit, Threaded, Uploaded, Who};
use crate::bluebubbles::{FakeBlueBubbles, File};
use crate::wait::{WAIT, wait_for};

/// The server password.
pub const PASSWORD: &str = "kit-bluebubbles-password-0123";
/// The allowlisted user's handle.
pub const ADA: &str = "+15552223333";
/// A handle on no list.
pub const MALLORY: &str = "+15559990000";
/// The group chat both are in.
pub const GROUP: &str = "iMessage;+;chat493827156";
/// What wakes the bot in a group.
const WAKE: &str = "Talaria,";

/// The handle of `who`.
pub fn handle(who: Who) -> &'static str {
    match who {
        Who::Friend => ADA,
        Who::Stranger => MALLORY,
    }
}

/// The one-to-one chat of `who`.
pub fn dm(who: Who) -> String {
    format!("iMessage;-;{}", handle(who))
}

/// The fake server and its webhook posts.
pub struct BlueBubblesKit {
    /// The fake itself, for platform-specific tests.
    pub fake: FakeBlueBubbles,
    /// The shared listener's port, named in the kit's section.
    pub port: u16,
    /// Posts the webhook payloads, in order.
    pub sender: Sender,
}

impl BlueBubblesKit {
    /// Posts `payload` to every registered webhook.
    pub fn post(&self, payload: &Value) {
        for url in self.fake.webhook_urls() {
            self.sender.push(Delivery {
                url,
                headers: Vec::new(),
                content_type: "application/json".to_owned(),
                body: payload.to_string().into_bytes(),
            });
        }
    }

    /// A message from `who` in `chat`, with `files`; returns its guid.
    pub fn say(&self, chat: &str, who: Who, text: &str, files: &[File]) -> String {
        let (guid, payload) = self.fake.receive(chat, handle(who), text, files);
        self.post(&payload);
        guid
    }
}

impl PlatformKit for BlueBubblesKit {
    const NAME: &'static str = "bluebubbles";
    const DM_REPLY_QUOTES: bool = true;

    async fn start() -> BlueBubblesKit {
        BlueBubblesKit {
            fake: FakeBlueBubbles::start(PASSWORD),
            port: free_port(),
            sender: Sender::start(),
        }
    }

    fn section(&self) -> String {
        format!(
            "  webhook:\n    port: {}\n  bluebubbles:\n    server_url: {}\n",
            self.port,
            self.fake.base_url()
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        [
            ("BLUEBUBBLES_PASSWORD", PASSWORD),
            ("BLUEBUBBLES_ALLOWED_USERS", ADA),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    fn secret(&self) -> &str {
        PASSWORD
    }

    /// Each adapter run pings the server first.
    fn connections(&self) -> usize {
        self.fake
            .requests()
            .iter()
            .filter(|r| r.path == "/api/v1/ping")
            .count()
    }

    async fn wait_connected(&self, n: usize) {
        wait_for(&format!("{n} pings"), || async {
            let got = self.connections();
            if got >= n { Ok(()) } else { Err(got) }
        })
        .await;
        // Then the registration, which every post needs.
        wait_for("a webhook registered", || async {
            if self.fake.webhook_urls().is_empty() {
                Err("none")
            } else {
                Ok(())
            }
        })
        .await;
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        self.say(&dm(who), who, text, &[])
    }

    fn push_dm_file(&self, who: Who, file: &KitFile, caption: &str) -> String {
        // A voice message recorded in Messages is a .caf file.
        let name = match (file.kind, &file.name) {
            (MediaKind::Voice, _) => "Audio Message.caf".to_owned(),
            (_, Some(n)) => n.clone(),
            (_, None) => "file".to_owned(),
        };
        let f = File {
            mime: file.mime.clone(),
            name,
            bytes: file.bytes.clone(),
        };
        self.say(&dm(who), who, caption, &[f])
    }

    fn uploads(&self) -> Vec<Uploaded> {
        self.fake
            .uploads()
            .into_iter()
            .map(|u| {
                let ext = u
                    .name
                    .rsplit('.')
                    .next()
                    .unwrap_or_default()
                    .to_ascii_lowercase();
                let kind = if u.is_audio {
                    MediaKind::Voice
                } else {
                    match ext.as_str() {
                        "png" | "jpg" | "jpeg" | "gif" | "heic" | "webp" => MediaKind::Image,
                        "mp4" | "mov" | "m4v" => MediaKind::Video,
                        "mp3" | "m4a" | "ogg" | "wav" | "caf" | "opus" => MediaKind::Audio,
                        _ => MediaKind::Document,
                    }
                };
                Uploaded {
                    kind,
                    name: Some(u.name),
                    bytes: u.bytes,
                }
            })
            .collect()
    }

    fn dm_chat(&self, who: Who) -> String {
        dm(who)
    }

    fn sent(&self) -> Vec<Out> {
        self.fake
            .sent()
            .into_iter()
            .map(|s| Out {
                chat: s.chat,
                thread: None,
                text: s.text.clone(),
                wire: s.text,
                reply_to: s.selected,
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

    fn redeliver(&self, id: &str, _text: &str) {
        // The server posts the same message again as `updated-message`
        // when it changes (delivered, read, edited).
        if let Some(message) = self.fake.message(id) {
            self.post(&serde_json::json!({"type": "updated-message", "data": message}));
        }
    }

    fn push_stranger_in_group(&self, text: &str) {
        self.say(GROUP, Who::Stranger, &format!("{WAKE} {text}"), &[]);
    }

    fn push_in_group(&self, text: &str, mention: bool) -> Threaded {
        let said = if mention {
            format!("{WAKE} {text}")
        } else {
            text.to_owned()
        };
        let id = self.say(GROUP, Who::Friend, &said, &[]);
        Threaded {
            id,
            chat: GROUP.to_owned(),
            thread: None,
        }
    }

    fn typed_in(&self, chat: &str) -> Option<bool> {
        Some(self.fake.typing().iter().any(|c| c == chat))
    }

    fn unacknowledged(&self) -> Option<usize> {
        Some(self.sender.pending())
    }

    async fn wait_acknowledged(&self) {
        self.sender.wait_all_taken().await;
    }
}
