//! Yuanbao's kit: the fake sign-token endpoint and bot socket.

use std::time::{Duration, Instant};

use talaria_adapter::MediaKind;

use super::{KitFile, Out, PlatformKit, Threaded, Uploaded, Who};
use crate::FakeYuanbao;
use crate::wait::WAIT;
use crate::yuanbao::wire;

/// The app key the gateway is given.
pub const APP_KEY: &str = "yb-kit-app-key-0123456789";
/// The app secret that signs token requests.
pub const APP_SECRET: &str = "yb-kit-app-secret-9876543210";
/// The group the kit's shared-chat messages come from.
pub const GROUP: &str = "g100";
/// The code the fake refuses a send with to stand for a rate limit (the
/// platform documents none; the adapter retries any refusal after 1 s,
/// then 2 s and 4 s).
pub const LIMITED: i32 = 20016;

/// The fake Yuanbao with a friend (`ann42`) and a stranger (`eve7`).
pub struct YuanbaoKit {
    /// The fake itself, for platform-specific tests.
    pub fake: FakeYuanbao,
}

fn user(who: Who) -> &'static str {
    match who {
        Who::Friend => "ann42",
        Who::Stranger => "eve7",
    }
}

impl PlatformKit for YuanbaoKit {
    const NAME: &'static str = "yuanbao";
    const DM_REPLY_QUOTES: bool = false;

    async fn start() -> YuanbaoKit {
        YuanbaoKit {
            fake: FakeYuanbao::start(APP_KEY, APP_SECRET).await,
        }
    }

    fn section(&self) -> String {
        format!(
            "  yuanbao:\n    ws_url: {}\n    api_domain: {}\n    cos_endpoint: {}\n    \
             ping_interval_ms: 300\n    pong_timeout_ms: 2000\n    request_timeout_ms: 5000\n",
            self.fake.ws_url(),
            self.fake.api_domain(),
            self.fake.cos_endpoint()
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        vec![
            ("YUANBAO_APP_ID".into(), APP_KEY.into()),
            ("YUANBAO_APP_SECRET".into(), APP_SECRET.into()),
            ("YUANBAO_ALLOWED_USERS".into(), user(Who::Friend).into()),
            ("YUANBAO_GROUP_POLICY".into(), "open".into()),
        ]
    }

    fn secret(&self) -> &str {
        APP_SECRET
    }

    fn connections(&self) -> usize {
        self.fake.connections()
    }

    async fn wait_connected(&self, n: usize) {
        self.fake.wait_for_connection(n, WAIT).await;
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        self.fake.push_dm(user(who), text)
    }

    fn push_dm_file(&self, who: Who, file: &KitFile, caption: &str) -> String {
        // The element names the file by Yuanbao's protected address; the
        // bot exchanges it at the download endpoint.
        let url = self.fake.add_resource(&file.bytes);
        let size = file.bytes.len() as u32;
        let content = match file.kind {
            MediaKind::Image => wire::MsgContent {
                uuid: "img-1".into(),
                image_format: 3,
                image_info_array: vec![wire::ImageInfo {
                    r#type: 1,
                    size,
                    width: 64,
                    height: 48,
                    url,
                }],
                ..wire::MsgContent::default()
            },
            _ => wire::MsgContent {
                uuid: "file-1".into(),
                url,
                file_size: size,
                file_name: file.name.clone().unwrap_or_default(),
                ..wire::MsgContent::default()
            },
        };
        let msg_type = match file.kind {
            MediaKind::Image => "TIMImageElem",
            MediaKind::Voice | MediaKind::Audio => "TIMSoundElem",
            MediaKind::Video => "TIMVideoFileElem",
            MediaKind::Document => "TIMFileElem",
        };
        let id = self.fake.next_msg_id();
        let mut push = wire::dm(user(who), &id, caption);
        push.msg_body = vec![wire::MsgBodyElement {
            msg_type: msg_type.into(),
            msg_content: Some(content),
        }];
        if !caption.is_empty() {
            push.msg_body.push(wire::text(caption));
        }
        self.fake.push(&push);
        id
    }

    fn uploads(&self) -> Vec<Uploaded> {
        // A file counts once a message shows it: an image element as a
        // picture, a file element as a file to download.
        self.fake
            .sent()
            .iter()
            .flat_map(|s| s.media.clone())
            .filter_map(|m| {
                let bytes = self.fake.uploaded(&m.url)?;
                Some(Uploaded {
                    kind: if m.msg_type == "TIMImageElem" {
                        MediaKind::Image
                    } else {
                        MediaKind::Document
                    },
                    name: m.name,
                    bytes,
                })
            })
            .collect()
    }

    fn dm_chat(&self, who: Who) -> String {
        format!("direct:{}", user(who))
    }

    fn sent(&self) -> Vec<Out> {
        self.fake
            .sent()
            .into_iter()
            .map(|s| Out {
                chat: s.chat,
                thread: None,
                wire: s.text.clone(),
                text: s.text,
                reply_to: s.ref_msg_id,
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

    fn redeliver(&self, id: &str, text: &str) {
        // The same message (same msg_id) in a new push, as after a lost ack.
        self.fake
            .push(&crate::yuanbao::wire::dm(user(Who::Friend), id, text));
    }

    async fn drop_connection(&self) {
        // Only an acknowledged push is safe from re-delivery.
        self.fake.wait_for_all_acked(WAIT).await;
        self.fake.drop_connection();
    }

    fn rate_limit_next_send(&self, _after: Duration) {
        self.fake.fail_next_send(LIMITED);
    }

    fn push_stranger_in_group(&self, text: &str) {
        self.fake.push_group(user(Who::Stranger), GROUP, text, true);
    }

    fn push_in_group(&self, text: &str, mention: bool) -> Threaded {
        let id = self
            .fake
            .push_group(user(Who::Friend), GROUP, text, mention);
        Threaded {
            id,
            chat: format!("group:{GROUP}"),
            thread: None,
        }
    }

    fn typed_in(&self, chat: &str) -> Option<bool> {
        Some(
            self.fake
                .heartbeats()
                .iter()
                .any(|h| h.chat == chat && h.beat == 1),
        )
    }

    fn unacknowledged(&self) -> Option<usize> {
        Some(self.fake.pending())
    }

    async fn wait_acknowledged(&self) {
        self.fake.wait_for_all_acked(WAIT).await;
    }
}
