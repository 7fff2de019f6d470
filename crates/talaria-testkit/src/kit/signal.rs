//! Signal's kits: the fake signal-cli REST API, received from over its
//! WebSocket ([`SignalKit`], the server's `json-rpc` mode) or by polling
//! ([`PolledSignalKit`], its `normal` mode). The adapter follows the mode
//! the server reports, so the two kits differ only in the fake's mode.

use std::time::{Duration, Instant};

use talaria_adapter::MediaKind;

use super::{KitFile, Out, PlatformKit, Threaded, Uploaded, Who};
use crate::FakeSignal;
use crate::signal::{Mode, NewMessage, Person};
use crate::wait::{WAIT, wait_for};

/// The bot's number: the account the server holds.
pub const BOT: &str = "+15550009999";

/// A group both people and the bot are in (its internal id, base64).
pub const GROUP: &str = "R3JvdXAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDA=";

/// The person on the allowlist.
pub fn alice() -> Person {
    Person::numbered(1, "Alice")
}

/// A person on no list.
pub fn mallory() -> Person {
    Person::numbered(666, "Mallory")
}

fn person(who: Who) -> Person {
    match who {
        Who::Friend => alice(),
        Who::Stranger => mallory(),
    }
}

/// The fake signal-cli, receiving over a WebSocket when `POLLED` is false
/// and by polling when it is true.
pub struct SignalKitIn<const POLLED: bool> {
    /// The fake itself, for platform-specific tests.
    pub fake: FakeSignal,
}

/// Signal received over the server's WebSocket.
pub type SignalKit = SignalKitIn<false>;

/// Signal received by polling the server.
pub type PolledSignalKit = SignalKitIn<true>;

impl<const POLLED: bool> PlatformKit for SignalKitIn<POLLED> {
    const NAME: &'static str = "signal";
    // A DM's answer quotes nothing (a group's quotes the question).
    const DM_REPLY_QUOTES: bool = false;

    async fn start() -> SignalKitIn<POLLED> {
        let mode = if POLLED { Mode::Normal } else { Mode::JsonRpc };
        SignalKitIn {
            fake: FakeSignal::start(BOT, mode).await,
        }
    }

    fn section(&self) -> String {
        format!(
            "  signal:\n    http_url: {}\n    poll_interval_secs: 1\n",
            self.fake.url()
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        // The account is here rather than in the section so that a test
        // can name one the server does not hold.
        vec![
            ("SIGNAL_ACCOUNT".into(), BOT.into()),
            ("SIGNAL_ALLOWED_USERS".into(), alice().number),
        ]
    }

    fn secret(&self) -> &str {
        // signal-cli's REST API takes no credential: the account is what
        // the adapter holds as one (two readers of it would split its
        // stream), and it has no reason to be logged either.
        BOT
    }

    fn connections(&self) -> usize {
        if POLLED {
            self.fake.polls()
        } else {
            self.fake.connections().len()
        }
    }

    async fn wait_connected(&self, n: usize) {
        if POLLED {
            self.fake.wait_for_polls(n, WAIT).await;
        } else {
            self.fake.wait_for_connections(n, WAIT).await;
        }
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        self.fake
            .push(NewMessage::dm(&person(who), text))
            .to_string()
    }

    fn dm_chat(&self, who: Who) -> String {
        person(who).uuid
    }

    fn sent(&self) -> Vec<Out> {
        self.fake
            .sent()
            .into_iter()
            .map(|s| Out {
                chat: s.recipients.first().cloned().unwrap_or_default(),
                thread: None,
                text: s.message.clone(),
                wire: s.message,
                reply_to: s.quote_timestamp.map(|t| t.to_string()),
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
        // signal-cli keeps a received file under an id ending in the
        // type's extension; a voice note recorded in the app has no name.
        let extension = file
            .name
            .as_deref()
            .and_then(|n| n.rsplit_once('.'))
            .map(|(_, ext)| ext)
            .unwrap_or_else(|| extension_of(&file.mime));
        let id = self.fake.add_file(&file.bytes, extension);
        let name = match file.kind {
            MediaKind::Voice => None,
            _ => file.name.as_deref(),
        };
        let size = u64::try_from(file.bytes.len()).unwrap_or(u64::MAX);
        self.fake
            .push(NewMessage::dm(&person(who), caption).with_file(&id, &file.mime, name, size))
            .to_string()
    }

    fn uploads(&self) -> Vec<Uploaded> {
        // Signal shows a file by its type; a voice note is audio without a
        // file name, as the app records one.
        self.fake
            .sent()
            .into_iter()
            .flat_map(|s| s.attachments)
            .map(|a| {
                let mime = a.mime.as_deref().unwrap_or("");
                let kind = match mime.split('/').next().unwrap_or("") {
                    "image" => MediaKind::Image,
                    "video" => MediaKind::Video,
                    "audio" if a.filename.is_none() => MediaKind::Voice,
                    "audio" => MediaKind::Audio,
                    _ => MediaKind::Document,
                };
                Uploaded {
                    kind,
                    name: a.filename,
                    bytes: a.bytes,
                }
            })
            .collect()
    }

    fn redeliver(&self, id: &str, _text: &str) {
        // signal-cli hands the same envelope over again.
        self.fake.redeliver(id.parse().unwrap_or_default());
    }

    async fn drop_connection(&self) {
        assert!(!POLLED, "a polled server holds no connection");
        self.fake.drop_connection();
    }

    fn rate_limit_next_send(&self, after: Duration) {
        self.fake
            .fail_next_sends_with_429(Some(after.as_secs().max(1)));
    }

    fn push_in_group(&self, text: &str, mention: bool) -> Threaded {
        let mut message = NewMessage::dm(&alice(), text).in_group(GROUP, "Team");
        if mention {
            message = message.mentioning(BOT);
        }
        let id = self.fake.push(message);
        Threaded {
            id: id.to_string(),
            chat: FakeSignal::group_recipient(GROUP),
            thread: None,
        }
    }

    fn push_stranger_in_group(&self, text: &str) {
        self.fake.push(
            NewMessage::dm(&mallory(), text)
                .in_group(GROUP, "Team")
                .mentioning(BOT),
        );
    }

    fn typed_in(&self, chat: &str) -> Option<bool> {
        Some(
            self.fake
                .typing()
                .iter()
                .any(|t| t.recipient == chat && t.show),
        )
    }

    fn unacknowledged(&self) -> Option<usize> {
        // signal-cli forgets what it hands a receiver; what it still holds
        // is what no receiver has taken.
        Some(self.fake.queued())
    }

    async fn wait_acknowledged(&self) {
        wait_for("signal-cli to hold nothing undelivered", || async {
            match self.fake.queued() {
                0 => Ok(()),
                held => Err(held),
            }
        })
        .await;
    }
}

/// The extension signal-cli gives a file of type `mime`.
fn extension_of(mime: &str) -> &'static str {
    match mime.split(';').next().unwrap_or("").trim() {
        "image/png" => "png",
        "image/jpeg" => "jpg",
        "audio/ogg" => "ogg",
        "audio/aac" => "aac",
        "application/pdf" => "pdf",
        _ => "bin",
    }
}
