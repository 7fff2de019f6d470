//! The WeCom intelligent robot's kit: the fake long connection.

use std::time::{Duration, Instant};

use serde_json::json;
use talaria_adapter::MediaKind;

use super::{KitFile, Out, PlatformKit, Threaded, Uploaded, Who};
use crate::wait::WAIT;
use crate::wecom_bot::{FakeWecomBot, TOO_FAST, dm_body, seal};

/// The robot's Bot ID.
pub const BOT_ID: &str = "aibkittestrobot0001";
/// The robot's long-connection secret.
pub const SECRET: &str = "kit-test-wecom-robot-secret-0123456789";
/// The group the kit's shared-chat messages come from.
pub const GROUP: &str = "wrkitgroup0001";
/// The aeskey the kit's files are encrypted with (43 base64 characters).
pub const AESKEY: &str = "kitKitKitKitKitKitKitKitKitKitKitKitKitKitk";

/// The fake WeCom robot with a friend (`ann42`) and a stranger (`eve7`).
pub struct WecomBotKit {
    /// The fake itself, for platform-specific tests.
    pub fake: FakeWecomBot,
}

/// The WeCom user id of `who`.
pub fn user(who: Who) -> &'static str {
    match who {
        Who::Friend => "ann42",
        Who::Stranger => "eve7",
    }
}

impl PlatformKit for WecomBotKit {
    const NAME: &'static str = "wecom";
    const DM_REPLY_QUOTES: bool = false;

    async fn start() -> WecomBotKit {
        WecomBotKit {
            fake: FakeWecomBot::start(BOT_ID, SECRET).await,
        }
    }

    fn section(&self) -> String {
        format!(
            "  wecom:\n    websocket_url: {}\n    media_hosts: [\"{}\"]\n    \
             ping_interval_ms: 300\n    request_timeout_ms: 5000\n    rate_limit_wait_ms: 1000\n",
            self.fake.ws_url(),
            self.fake.media_host()
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        vec![
            ("WECOM_BOT_ID".into(), BOT_ID.into()),
            ("WECOM_SECRET".into(), SECRET.into()),
            ("WECOM_ALLOWED_USERS".into(), user(Who::Friend).into()),
            ("WECOM_GROUP_POLICY".into(), "open".into()),
        ]
    }

    fn secret(&self) -> &str {
        SECRET
    }

    fn connections(&self) -> usize {
        self.fake.connections()
    }

    async fn wait_connected(&self, n: usize) {
        self.fake.wait_for_connection(n, WAIT).await;
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        self.fake.push_text_dm(user(who), text)
    }

    fn dm_chat(&self, who: Who) -> String {
        user(who).to_owned()
    }

    fn sent(&self) -> Vec<Out> {
        // Files are told by `uploads`; these are the texts.
        self.fake
            .sent()
            .into_iter()
            .filter(|s| s.media_id.is_none())
            .map(|s| Out {
                chat: s.chat,
                thread: None,
                wire: s.text.clone(),
                text: s.text,
                reply_to: None,
                at: s.at,
            })
            .collect()
    }

    async fn wait_sent(&self, n: usize) -> Vec<Out> {
        crate::wait::wait_for(&format!("{n} sent messages"), || async {
            let sent = self.sent();
            if sent.len() >= n { Ok(sent) } else { Err(sent) }
        })
        .await
    }

    fn send_attempts(&self) -> Vec<Instant> {
        self.fake.send_attempts().iter().map(|r| r.at).collect()
    }

    async fn wait_send_attempts(&self, n: usize) {
        self.fake.wait_for_send_attempts(n, WAIT).await;
    }

    fn hang_send(&self, hang: bool) {
        self.fake.hang_sends(hang);
    }

    fn push_dm_file(&self, who: Who, file: &KitFile, _caption: &str) -> String {
        // WeCom sends a picture or a file as a message of its own, without
        // a caption; each names an encrypted download and its key.
        let url = self.fake.host_media(seal(AESKEY, &file.bytes));
        let part = json!({ "url": url, "aeskey": AESKEY });
        let msgtype = match file.kind {
            MediaKind::Image => "image",
            MediaKind::Video => "video",
            _ => "file",
        };
        let id = self.fake.next_msgid();
        self.fake
            .push_message(dm_body(&id, user(who), msgtype, part));
        id
    }

    fn uploads(&self) -> Vec<Uploaded> {
        let uploads = self.fake.uploads();
        self.fake
            .sent()
            .into_iter()
            .filter_map(|s| {
                let id = s.media_id?;
                let up = uploads.iter().find(|u| u.media_id == id)?;
                Some(Uploaded {
                    kind: match s.msgtype.as_str() {
                        "image" => MediaKind::Image,
                        "video" => MediaKind::Video,
                        _ => MediaKind::Document,
                    },
                    name: Some(up.filename.clone()),
                    bytes: up.bytes.clone(),
                })
            })
            .collect()
    }

    fn redeliver(&self, id: &str, _text: &str) {
        self.fake.redeliver(id);
    }

    async fn drop_connection(&self) {
        self.fake.drop_connection();
    }

    fn rate_limit_next_send(&self, _after: Duration) {
        // WeCom names no wait; the kit's section sets the adapter's to the
        // suite's second.
        self.fake.fail_next_send(TOO_FAST);
    }

    fn push_stranger_in_group(&self, text: &str) {
        self.fake
            .push_text_group(user(Who::Stranger), GROUP, text, true);
    }

    fn push_in_group(&self, text: &str, mention: bool) -> Threaded {
        // WeCom delivers a group message to the robot only when it
        // @mentions it: an unaddressed one never reaches the adapter.
        let id = if mention {
            self.fake
                .push_text_group(user(Who::Friend), GROUP, text, true)
        } else {
            self.fake.next_msgid()
        };
        Threaded {
            id,
            chat: GROUP.to_owned(),
            thread: None,
        }
    }
}
