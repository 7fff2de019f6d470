//! Matrix's kit: the fake homeserver, long-polled through `/sync`.

use std::time::{Duration, Instant};

use serde_json::json;

use talaria_adapter::MediaKind;

use super::{KitFile, Out, PlatformKit, Threaded, Uploaded, Who};
use crate::FakeMatrix;
use crate::wait::WAIT;

/// The access token the gateway is given.
pub const TOKEN: &str = "syt_kit_test_token_0123456789abcdef";

/// The user on the allowlist.
pub const ALICE: &str = "@alice:localhost";

/// A user on no list.
pub const MALLORY: &str = "@mallory:localhost";

/// A shared room with both of them and the bot.
pub const TEAM: &str = "!team:localhost";

/// The fake homeserver with a DM room for each of Alice and Mallory, and
/// [`TEAM`] for all three.
pub struct MatrixKit {
    /// The fake itself, for platform-specific tests.
    pub fake: FakeMatrix,
}

fn user(who: Who) -> &'static str {
    match who {
        Who::Friend => ALICE,
        Who::Stranger => MALLORY,
    }
}

/// What the bot answers to in a shared room: its display name first.
fn mentioning(text: &str) -> String {
    format!("{}: {text}", crate::matrix::BOT_DISPLAY_NAME)
}

impl PlatformKit for MatrixKit {
    const NAME: &'static str = "matrix";
    const DM_REPLY_QUOTES: bool = true;

    async fn start() -> MatrixKit {
        let fake = FakeMatrix::start(TOKEN).await;
        fake.create_dm(ALICE);
        fake.create_dm(MALLORY);
        fake.create_room(TEAM, Some("Team"), &[ALICE, MALLORY]);
        MatrixKit { fake }
    }

    fn section(&self) -> String {
        format!(
            "  matrix:\n    homeserver: {}\n    sync_timeout_ms: 300\n",
            self.fake.homeserver()
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        vec![
            ("MATRIX_ACCESS_TOKEN".into(), TOKEN.into()),
            ("MATRIX_ALLOWED_USERS".into(), ALICE.into()),
        ]
    }

    fn secret(&self) -> &str {
        TOKEN
    }

    fn connections(&self) -> usize {
        self.fake.sync_calls().len()
    }

    async fn wait_connected(&self, n: usize) {
        self.fake.wait_for_sync_calls(n, WAIT).await;
        // The first sync only learns where the timeline ends (its events
        // are history, never answered): the bot is listening once it has
        // asked for what comes after everything pushed so far.
        self.fake.wait_until_caught_up(WAIT).await;
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        let from = user(who);
        self.fake.push_text(&self.dm_chat(who), from, text)
    }

    fn dm_chat(&self, who: Who) -> String {
        let local = user(who)
            .trim_start_matches('@')
            .split(':')
            .next()
            .unwrap_or_default();
        format!("!dm-{local}:localhost")
    }

    fn sent(&self) -> Vec<Out> {
        self.fake
            .sent()
            .into_iter()
            .map(|s| Out {
                chat: s.room_id.clone(),
                thread: s.thread_root(),
                text: s.body(),
                wire: s.body(),
                reply_to: s.in_reply_to(),
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
        let url = self
            .fake
            .add_file(&file.bytes, &file.mime, file.name.as_deref());
        let msgtype = match file.kind {
            MediaKind::Image => "m.image",
            MediaKind::Voice | MediaKind::Audio => "m.audio",
            MediaKind::Video => "m.video",
            MediaKind::Document => "m.file",
        };
        // A client names even a file that had none (Element calls a
        // recording "Voice message").
        let name = file.name.clone().unwrap_or_else(|| match file.kind {
            MediaKind::Voice => "Voice message".into(),
            _ => "file".into(),
        });
        // Matrix 1.10: with a caption, `body` is the caption and
        // `filename` the name; without one, `body` is the name.
        let body = if caption.is_empty() {
            name.as_str()
        } else {
            caption
        };
        let mut content = json!({
            "msgtype": msgtype,
            "body": body,
            "filename": name,
            "url": url,
            "info": { "mimetype": file.mime, "size": file.bytes.len() },
        });
        if file.kind == MediaKind::Voice {
            // MSC3245: what a client sets on a clip recorded as a voice
            // message.
            content["org.matrix.msc3245.voice"] = json!({});
        }
        self.fake.push_event(&self.dm_chat(who), user(who), content)
    }

    fn uploads(&self) -> Vec<Uploaded> {
        // The kind is in the message that shows the file, so an upload
        // counts once a message names its address.
        let sent = self.fake.sent();
        self.fake
            .uploads()
            .into_iter()
            .filter_map(|u| {
                let shown = sent.iter().find(|s| {
                    s.content.get("url").and_then(serde_json::Value::as_str)
                        == Some(u.content_uri.as_str())
                })?;
                let msgtype = shown
                    .content
                    .get("msgtype")
                    .and_then(serde_json::Value::as_str);
                let kind = match msgtype {
                    Some("m.image") => MediaKind::Image,
                    Some("m.video") => MediaKind::Video,
                    Some("m.audio") if shown.content.get("org.matrix.msc3245.voice").is_some() => {
                        MediaKind::Voice
                    }
                    Some("m.audio") => MediaKind::Audio,
                    _ => MediaKind::Document,
                };
                Some(Uploaded {
                    kind,
                    name: u.filename,
                    bytes: u.bytes,
                })
            })
            .collect()
    }

    fn push_in_thread(&self, text: &str) -> Threaded {
        // The root needs no answer (it does not mention the bot); the
        // reply in its thread does.
        let root = self.fake.push_text(TEAM, ALICE, "a thread of its own");
        let id = self
            .fake
            .push_thread_text(TEAM, ALICE, &root, &mentioning(text));
        Threaded {
            id,
            chat: TEAM.into(),
            thread: Some(root),
        }
    }

    fn redeliver(&self, id: &str, text: &str) {
        // The same event id again, as a sync replayed from an old token
        // would bring it.
        self.fake.push_raw(
            &self.dm_chat(Who::Friend),
            json!({"type": "m.room.message", "event_id": id, "sender": ALICE,
                   "content": {"msgtype": "m.text", "body": text}}),
        );
    }

    async fn drop_connection(&self) {
        // The long poll in flight is cut off mid-answer, and the next two
        // retries meet a failing proxy.
        self.fake.drop_next_sync();
        self.fake.fail_next_syncs(2);
    }

    fn rate_limit_next_send(&self, after: Duration) {
        let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
        self.fake.fail_next_send_with_429(ms);
    }

    fn push_in_group(&self, text: &str, mention: bool) -> Threaded {
        let body = if mention {
            mentioning(text)
        } else {
            text.to_owned()
        };
        let id = self.fake.push_text(TEAM, ALICE, &body);
        Threaded {
            id,
            chat: TEAM.into(),
            thread: None,
        }
    }

    /// Rooms in one sync batch are handed over in no set order, so a
    /// later message in another room is no proof: the sync after the
    /// batch is (the adapter saves its token only once the batch is
    /// handed over).
    async fn wait_handed_over(&self) {
        self.fake.wait_until_caught_up(WAIT).await;
    }

    fn push_stranger_in_group(&self, text: &str) {
        self.fake.push_text(TEAM, MALLORY, &mentioning(text));
    }

    fn typed_in(&self, chat: &str) -> Option<bool> {
        Some(
            self.fake
                .typing()
                .iter()
                .any(|t| t.room_id == chat && t.typing),
        )
    }

    fn last_connection_resumed(&self) -> Option<bool> {
        // A sync that names where the last one ended resumes it.
        self.fake.sync_calls().last().map(|s| s.since.is_some())
    }
}
