//! Weixin's kit: the fake iLink bot API, polled by the gateway. A
//! personal account's bot talks 1:1 only.

use std::time::{Duration, Instant};

use talaria_adapter::MediaKind;

use super::{KitFile, Out, PlatformKit, Uploaded, Who};
use crate::wait::WAIT;
use crate::weixin::{ACCOUNT_ID, FakeWeixin};

/// The bot token from the QR login.
pub const TOKEN: &str = "e9b0c1d2a3f4@im.bot:0600kit3c1b6a7f0d24e8";

/// The fake iLink API with a friend and a stranger.
pub struct WeixinKit {
    /// The fake itself, for platform-specific tests.
    pub fake: FakeWeixin,
}

/// A user's id on iLink.
pub fn user(who: Who) -> &'static str {
    match who {
        Who::Friend => "o9cq80_friend_ada@im.wechat",
        Who::Stranger => "o9cq80_stranger_eve@im.wechat",
    }
}

impl PlatformKit for WeixinKit {
    const NAME: &'static str = "weixin";
    // Replies carry the context token, not a quote of the message.
    const DM_REPLY_QUOTES: bool = false;

    async fn start() -> WeixinKit {
        // A short hold keeps the poll loop turning while tests run.
        let fake = FakeWeixin::start(TOKEN, Duration::from_millis(500)).await;
        WeixinKit { fake }
    }

    fn section(&self) -> String {
        format!(
            "  weixin:\n    base_url: {}\n    cdn_base_url: {}\n    send_chunk_delay_seconds: 0.05\n",
            self.fake.base_url(),
            self.fake.cdn_base_url()
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        vec![
            ("WEIXIN_TOKEN".into(), TOKEN.into()),
            ("WEIXIN_ACCOUNT_ID".into(), ACCOUNT_ID.into()),
            ("WEIXIN_ALLOWED_USERS".into(), user(Who::Friend).into()),
        ]
    }

    fn secret(&self) -> &str {
        TOKEN
    }

    fn connections(&self) -> usize {
        self.fake.polls()
    }

    async fn wait_connected(&self, n: usize) {
        self.fake.wait_for_polls(n, WAIT).await;
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        self.fake.push_text(user(who), text)
    }

    fn push_dm_file(&self, who: Who, file: &KitFile, caption: &str) -> String {
        let item_type = match file.kind {
            MediaKind::Image => 2,
            MediaKind::Voice => 3,
            MediaKind::Video => 5,
            MediaKind::Audio | MediaKind::Document => 4,
        };
        self.fake.push_file(
            user(who),
            item_type,
            file.name.as_deref(),
            &file.bytes,
            caption,
        )
    }

    fn uploads(&self) -> Vec<Uploaded> {
        self.fake
            .media_sent()
            .into_iter()
            .map(|m| Uploaded {
                kind: match m.item_type {
                    2 => MediaKind::Image,
                    3 => MediaKind::Voice,
                    5 => MediaKind::Video,
                    _ => MediaKind::Document,
                },
                name: m.name,
                bytes: m.bytes,
            })
            .collect()
    }

    fn dm_chat(&self, who: Who) -> String {
        user(who).to_owned()
    }

    fn sent(&self) -> Vec<Out> {
        self.fake
            .sent()
            .into_iter()
            .map(|s| Out {
                chat: s.to,
                thread: None,
                text: s.text.clone(),
                wire: s.text,
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
        self.fake.hang_send(hang);
    }

    fn redeliver(&self, id: &str, _text: &str) {
        self.fake.redeliver(id);
    }

    fn rate_limit_next_send(&self, _after: Duration) {
        // iLink's `-2` names no wait: the adapter's own retry delay (one
        // second unless configured) is what keeps it from trying sooner.
        self.fake.fail_next_send(-2);
    }

    fn typed_in(&self, chat: &str) -> Option<bool> {
        Some(self.fake.typing().iter().any(|(peer, _)| peer == chat))
    }
}
