//! DingTalk's kit: the fake Stream mode connection, session webhooks and
//! robot send API.

use std::time::{Duration, Instant};

use serde_json::json;
use talaria_adapter::MediaKind;

use super::{KitFile, Out, PlatformKit, Threaded, Uploaded, Who};
use crate::dingtalk::{FakeDingTalk, Incoming, SendFault};
use crate::wait::WAIT;

/// The app's Client ID.
pub const CLIENT_ID: &str = "dingkittestclient0001";
/// The app's Client Secret.
pub const CLIENT_SECRET: &str = "kit-test-dingtalk-client-secret-0123456789";
/// The custom robot's access token.
pub const CUSTOM_TOKEN: &str = "kit-test-custom-robot-token-0123456789";
/// The custom robot's signing secret.
pub const CUSTOM_SECRET: &str = "SECkit-test-custom-robot-secret-0123456789";
/// The group the kit's group messages are in.
pub const GROUP: &str = "cidGROUP0001";

/// The fake DingTalk with a friend (staff `staff42`, DM `cidDM42`) and a
/// stranger (staff `staff7`, DM `cidDM7`).
pub struct DingTalkKit {
    /// The fake itself, for platform-specific tests.
    pub fake: FakeDingTalk,
}

/// The staff id of `who`.
pub fn staff(who: Who) -> &'static str {
    match who {
        Who::Friend => "staff42",
        Who::Stranger => "staff7",
    }
}

impl DingTalkKit {
    /// Where `who` writes to the robot directly.
    pub fn dm(who: Who) -> Incoming<'static> {
        Incoming {
            conversation: match who {
                Who::Friend => "cidDM42",
                Who::Stranger => "cidDM7",
            },
            group: false,
            staff_id: staff(who),
            at_robot: false,
        }
    }

    /// Where `who` writes in the group, mentioning the robot or not.
    pub fn in_group(who: Who, at_robot: bool) -> Incoming<'static> {
        Incoming {
            conversation: GROUP,
            group: true,
            staff_id: staff(who),
            at_robot,
        }
    }
}

impl PlatformKit for DingTalkKit {
    const NAME: &'static str = "dingtalk";
    const DM_REPLY_QUOTES: bool = false;

    async fn start() -> DingTalkKit {
        DingTalkKit {
            fake: FakeDingTalk::start(CLIENT_ID, CLIENT_SECRET, CUSTOM_TOKEN, Some(CUSTOM_SECRET))
                .await,
        }
    }

    fn section(&self) -> String {
        // The session webhooks are on the fake, so its address is the one
        // host they may point at; "too fast" names no wait, so the
        // configured one is the contract suite's.
        format!(
            "  dingtalk:\n    api_base: {base}\n    media_base: {base}\n    \
             webhook_hosts: [\"{base}/\"]\n    \
             rate_limit_wait_ms: 1000\n    ping_interval_ms: 1000\n",
            base = self.fake.api_base()
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        vec![
            ("DINGTALK_CLIENT_ID".into(), CLIENT_ID.into()),
            ("DINGTALK_CLIENT_SECRET".into(), CLIENT_SECRET.into()),
            ("DINGTALK_ALLOWED_USERS".into(), staff(Who::Friend).into()),
            ("DINGTALK_WEBHOOK_URL".into(), self.fake.custom_robot_url()),
            ("DINGTALK_WEBHOOK_SECRET".into(), CUSTOM_SECRET.into()),
        ]
    }

    fn secret(&self) -> &str {
        CLIENT_SECRET
    }

    fn connections(&self) -> usize {
        self.fake.connections()
    }

    async fn wait_connected(&self, n: usize) {
        self.fake.wait_for_connection(n, WAIT).await;
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        self.fake.push_text(&Self::dm(who), text)
    }

    fn dm_chat(&self, who: Who) -> String {
        Self::dm(who).conversation.to_owned()
    }

    fn sent(&self) -> Vec<Out> {
        self.fake
            .sent()
            .into_iter()
            .map(|s| Out {
                chat: s.conversation,
                thread: None,
                wire: s.text.clone(),
                text: s.text,
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
        self.fake.send_attempts().iter().map(|r| r.at).collect()
    }

    async fn wait_send_attempts(&self, n: usize) {
        self.fake.wait_for_send_attempts(n, WAIT).await;
    }

    fn hang_send(&self, hang: bool) {
        self.fake.hang_sends(hang);
    }

    fn push_dm_file(&self, who: Who, file: &KitFile, _caption: &str) -> String {
        // DingTalk sends a picture, a voice message or a file as a message
        // of its own, without a caption.
        let code = self.fake.add_file(&file.bytes);
        let body = match file.kind {
            MediaKind::Image => {
                json!({ "msgtype": "picture", "content": { "downloadCode": code } })
            }
            MediaKind::Voice | MediaKind::Audio => json!({
                "msgtype": "audio",
                "content": { "downloadCode": code, "duration": 3000, "recognition": "" },
            }),
            _ => json!({
                "msgtype": "file",
                "content": {
                    "downloadCode": code,
                    "fileName": file.name.clone().unwrap_or_else(|| "file".into()),
                    "fileId": format!("file-{code}"), "spaceId": "space-1",
                },
            }),
        };
        self.fake.push_message(&Self::dm(who), body)
    }

    /// Uploads the robot sent in a message, as the message shows them:
    /// `sampleImageMsg` as an image, `sampleFile` as a document.
    fn uploads(&self) -> Vec<Uploaded> {
        let uploads = self.fake.uploads();
        self.fake
            .file_messages()
            .into_iter()
            .filter_map(|m| {
                let up = uploads.iter().find(|u| u.media_id == m.media)?;
                let kind = if m.msg_key == "sampleImageMsg" {
                    MediaKind::Image
                } else {
                    MediaKind::Document
                };
                Some(Uploaded {
                    kind,
                    name: m.file_name.or_else(|| Some(up.file_name.clone())),
                    bytes: up.bytes.clone(),
                })
            })
            .collect()
    }

    fn redeliver(&self, id: &str, _text: &str) {
        self.fake.redeliver(id);
    }

    async fn drop_connection(&self) {
        // Only an acknowledged frame is safe from re-delivery.
        self.fake.wait_for_all_acked(WAIT).await;
        self.fake.drop_connection();
    }

    fn rate_limit_next_send(&self, _after: Duration) {
        // DingTalk's "too fast" names no wait: the kit's section
        // configures the suite's.
        self.fake.fail_next_send(SendFault::TooFast);
    }

    fn push_stranger_in_group(&self, text: &str) {
        self.fake
            .push_text(&Self::in_group(Who::Stranger, true), text);
    }

    fn push_in_group(&self, text: &str, mention: bool) -> Threaded {
        // An unaddressed message reaches the robot only with the
        // all-messages permission; the fake delivers it as such an app's.
        let id = self
            .fake
            .push_text(&Self::in_group(Who::Friend, mention), text);
        Threaded {
            id,
            chat: GROUP.into(),
            thread: None,
        }
    }

    fn unacknowledged(&self) -> Option<usize> {
        Some(self.fake.pending())
    }

    async fn wait_acknowledged(&self) {
        self.fake.wait_for_all_acked(WAIT).await;
    }
}
