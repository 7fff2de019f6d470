//! WeCom self-built app's kit: the fake WeCom server API for answers, and
//! messages posted as WeCom posts them (encrypted XML, signed) to the
//! gateway's shared webhook listener.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::deliver::{Delivery, Sender, free_port};
use talaria_adapter::MediaKind;

use super::{KitFile, Out, PlatformKit, Uploaded, Who};
use crate::wait::{WAIT, wait_for};
use crate::wecom::{Callback, Failure, FakeWecom, media_xml, text_xml};

/// The company.
pub const CORP_ID: &str = "ww0a1b2c3d4e5f6a7b";
/// The app's secret.
pub const CORP_SECRET: &str = "kit-wecom-corp-secret-0123456789abcdef";
/// The app's AgentId.
pub const AGENT_ID: i64 = 1000002;
/// The callback Token.
pub const TOKEN: &str = "kitWecomCallbackToken";
/// The EncodingAESKey (43 characters of base64).
pub const ENCODING_AES_KEY: &str = "kWeComKitEncodingAesKey0123456789abcdefghij";
/// Where the adapter serves the callback (the default path).
pub const PATH: &str = "/wecom/callback";

/// The WeCom user id `who` writes as.
pub fn user(who: Who) -> &'static str {
    match who {
        Who::Friend => "zhangsan",
        Who::Stranger => "lisi",
    }
}

/// The fake WeCom with a friend and a stranger.
pub struct WecomCallbackKit {
    /// The fake server API, for platform-specific tests.
    pub fake: FakeWecom,
    /// The shared listener's port.
    pub port: u16,
    /// Posts the callbacks in order until the listener takes them.
    pub sender: Sender,
    /// Seals messages as WeCom does.
    pub callback: Callback,
    next_id: AtomicU64,
}

impl PlatformKit for WecomCallbackKit {
    const NAME: &'static str = "wecom_callback";
    const DM_REPLY_QUOTES: bool = false;

    async fn start() -> WecomCallbackKit {
        WecomCallbackKit {
            fake: FakeWecom::start(CORP_ID, CORP_SECRET, AGENT_ID),
            port: free_port(),
            sender: Sender::start(),
            callback: Callback {
                corp_id: CORP_ID.to_owned(),
                agent_id: AGENT_ID,
                token: TOKEN.to_owned(),
                encoding_aes_key: ENCODING_AES_KEY.to_owned(),
            },
            next_id: AtomicU64::new(0),
        }
    }

    /// WeCom names no wait when it refuses a send as too frequent; the
    /// adapter waits `rate_limit_wait_secs`, here the suite's one second.
    fn section(&self) -> String {
        format!(
            "  webhook:\n    port: {}\n  wecom_callback:\n    api_base: {}\n    rate_limit_wait_secs: 1\n",
            self.port,
            self.fake.base_url()
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        [
            ("WECOM_CALLBACK_CORP_ID", CORP_ID.to_owned()),
            ("WECOM_CALLBACK_CORP_SECRET", CORP_SECRET.to_owned()),
            ("WECOM_CALLBACK_AGENT_ID", AGENT_ID.to_string()),
            ("WECOM_CALLBACK_TOKEN", TOKEN.to_owned()),
            (
                "WECOM_CALLBACK_ENCODING_AES_KEY",
                ENCODING_AES_KEY.to_owned(),
            ),
            ("WECOM_CALLBACK_ALLOWED_USERS", user(Who::Friend).to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    fn secret(&self) -> &str {
        CORP_SECRET
    }

    /// Each adapter run checks its credentials by fetching a token.
    fn connections(&self) -> usize {
        self.fake.tokens_issued()
    }

    async fn wait_connected(&self, n: usize) {
        wait_for(&format!("{n} access tokens"), || async {
            let got = self.connections();
            if got >= n { Ok(()) } else { Err(got) }
        })
        .await;
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        let id =
            (7_300_000_000_000_000_000 + self.next_id.fetch_add(1, Ordering::SeqCst)).to_string();
        self.post_message(&text_xml(CORP_ID, AGENT_ID, user(who), text, &id), &id);
        id
    }

    fn dm_chat(&self, who: Who) -> String {
        format!("{CORP_ID}:{}", user(who))
    }

    /// The text and markdown messages (files are [`Self::uploads`]).
    fn sent(&self) -> Vec<Out> {
        self.fake
            .sent()
            .into_iter()
            .filter(|s| matches!(s.msgtype.as_str(), "text" | "markdown"))
            .map(|s| Out {
                chat: format!("{CORP_ID}:{}", s.touser),
                thread: None,
                text: s.content.clone(),
                wire: s.content,
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

    /// WeCom posts a picture, a voice message, a video or a file as a
    /// message of its own, without a caption; the bytes wait on the fake
    /// for `media/get`. An image's `PicUrl` points where nothing answers:
    /// the adapter must fetch by media id.
    fn push_dm_file(&self, who: Who, file: &KitFile, _caption: &str) -> String {
        let id =
            (7_300_000_000_000_000_000 + self.next_id.fetch_add(1, Ordering::SeqCst)).to_string();
        let (msg_type, extra) = match file.kind {
            MediaKind::Image => (
                "image",
                "<PicUrl><![CDATA[http://127.0.0.1:9/never-fetched.png]]></PicUrl>".to_owned(),
            ),
            MediaKind::Voice | MediaKind::Audio => {
                ("voice", "<Format><![CDATA[amr]]></Format>".to_owned())
            }
            MediaKind::Video => (
                "video",
                "<ThumbMediaId><![CDATA[thumb-1]]></ThumbMediaId>".to_owned(),
            ),
            MediaKind::Document => (
                "file",
                format!(
                    "<FileName><![CDATA[{}]]></FileName>",
                    file.name.as_deref().unwrap_or("file")
                ),
            ),
        };
        let media = self.fake.add_media(msg_type, &file.mime, &file.bytes);
        let xml = media_xml(CORP_ID, AGENT_ID, user(who), msg_type, &media, &extra, &id);
        self.post_message(&xml, &id);
        id
    }

    /// Uploads the app sent in a message, as the message type shows them.
    fn uploads(&self) -> Vec<Uploaded> {
        let uploads = self.fake.uploads();
        self.fake
            .sent()
            .into_iter()
            .filter_map(|s| {
                let up = uploads.iter().find(|u| u.media_id == s.content)?;
                let kind = match s.msgtype.as_str() {
                    "image" => MediaKind::Image,
                    "voice" => MediaKind::Voice,
                    "video" => MediaKind::Video,
                    _ => MediaKind::Document,
                };
                Some(Uploaded {
                    kind,
                    name: Some(up.file_name.clone()),
                    bytes: up.bytes.clone(),
                })
            })
            .collect()
    }

    /// WeCom posts the same message again (same `MsgId`, a new timestamp
    /// and nonce) when the callback was not answered in time.
    fn redeliver(&self, id: &str, text: &str) {
        self.post_message(
            &text_xml(CORP_ID, AGENT_ID, user(Who::Friend), text, id),
            &format!("re{id}"),
        );
    }

    /// 45009: WeCom's "API frequency" refusal, which names no wait.
    fn rate_limit_next_send(&self, after: Duration) {
        assert!(
            after <= Duration::from_secs(1),
            "the kit configures a one-second wait after 45009"
        );
        self.fake.fail_next_send(Failure::Code(45009));
    }
}

impl WecomCallbackKit {
    /// The callback's URL on the listener.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}{PATH}", self.port)
    }

    /// Queues `xml`, encrypted and signed as WeCom does (`nonce` varies it).
    pub fn post_message(&self, xml: &str, nonce: &str) {
        let signed = self.callback.seal(xml, nonce);
        self.post_raw(
            &signed.query(),
            self.callback.envelope(&signed).into_bytes(),
        );
    }

    /// Queues a POST with this query string and body, for tests of
    /// refused deliveries.
    pub fn post_raw(&self, query: &str, body: Vec<u8>) {
        self.sender.push(Delivery {
            url: format!("{}?{query}", self.url()),
            headers: Vec::new(),
            content_type: "text/xml".to_owned(),
            body,
        });
    }
}
