//! Platform kits: each platform's fake seen through one interface, so one
//! scenario suite can drive every adapter (in process, from
//! `talaria-platforms`' tests) and every `talaria gateway run` (as a
//! process, from the CLI's crash tests).
//!
//! A kit is the one place a platform's test configuration is written: the
//! `platforms.<name>` section pointing at its fake and the `.env` lines
//! holding its credentials and allowlist. The suites never name a
//! platform; they ask the kit. Scenarios a platform cannot have (no
//! threads, no connection to drop) are not methods the kit fakes: the
//! suite declares them skipped, with the reason, per platform.

pub mod bluebubbles;
pub mod deliver;
pub mod dingtalk;
pub mod discord;
pub mod email;
pub mod feishu;
pub mod google_chat;
pub mod homeassistant;
pub mod irc;
pub mod line;
pub mod matrix;
pub mod mattermost;
pub mod msgraph;
pub mod qqbot;
pub mod signal;
pub mod slack;
pub mod sms;
pub mod telegram;
pub mod webhook;
pub mod wecom_bot;
pub mod wecom_callback;
pub mod weixin;
pub mod whatsapp;
pub mod yuanbao;

use std::time::{Duration, Instant};

/// Who writes to the bot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    /// A user on the platform's allowlist.
    Friend,
    /// A user on no list.
    Stranger,
}

/// One message the bot sent, as every platform's fake can say it.
#[derive(Debug, Clone, PartialEq)]
pub struct Out {
    /// The chat (channel, room, DM) it went to.
    pub chat: String,
    /// The thread it went to, when the platform has threads.
    pub thread: Option<String>,
    /// The text as a user reads it (markup rendered, entities decoded).
    pub text: String,
    /// The text as sent on the wire, for the length limit.
    pub wire: String,
    /// The message it answers, when the platform shows that.
    pub reply_to: Option<String>,
    /// When the fake accepted it.
    pub at: Instant,
}

/// A file a user sends in a kit's DM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KitFile {
    /// What the user sends it as: a photo, a voice note, a document.
    pub kind: talaria_adapter::MediaKind,
    /// Its name, where the platform carries one.
    pub name: Option<String>,
    /// The type the platform claims.
    pub mime: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

/// A file the bot uploaded, as every platform's fake can say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uploaded {
    /// What the platform will show it as (a photo, a voice note, a
    /// document), from the call or message type the bot used.
    pub kind: talaria_adapter::MediaKind,
    /// The file name given, when the platform takes one.
    pub name: Option<String>,
    /// The bytes received.
    pub bytes: Vec<u8>,
}

/// A message pushed in a thread, and where its answer must land.
#[derive(Debug, Clone, PartialEq)]
pub struct Threaded {
    /// The pushed message's id.
    pub id: String,
    /// The chat the answer goes to.
    pub chat: String,
    /// The thread the answer goes to; `None` where a thread is a chat of
    /// its own (Discord).
    pub thread: Option<String>,
}

/// A platform's fake as the suites drive it (see the module docs).
#[allow(async_fn_in_trait)]
pub trait PlatformKit: Sized {
    /// The platform's section name under `platforms:`.
    const NAME: &'static str;
    /// Whether a reply in a DM names the message it answers.
    const DM_REPLY_QUOTES: bool;
    /// How long the model takes with the answer the crash test cuts off.
    /// Nothing, except where an answer rides in the asker's own HTTP
    /// response (Home Assistant): there the asker must have given up
    /// first, so the answer goes out on the platform's own wire, where a
    /// crash can catch it.
    const CRASH_ANSWER_DELAY: Duration = Duration::ZERO;
    /// Whether a friend's next DM continues the conversation of the one
    /// before; not where each delivery is a session of its own (webhook
    /// routes) or each new mail starts a thread of its own (e-mail).
    const DMS_CONTINUE: bool = true;

    /// Starts the fake.
    async fn start() -> Self;

    /// The `platforms.<name>` section, indented under `platforms:`.
    fn section(&self) -> String;

    /// The `.env` pairs: credentials, and [`Who::Friend`] on the allowlist.
    fn dotenv(&self) -> Vec<(String, String)>;

    /// A credential that must never appear in a log.
    fn secret(&self) -> &str;

    /// How many times a gateway connected (or, for polling, polled).
    fn connections(&self) -> usize;

    /// Waits until a gateway connected (or polled) `n` times in total.
    async fn wait_connected(&self, n: usize);

    /// A direct message from `who`; returns its id.
    fn push_dm(&self, who: Who, text: &str) -> String;

    /// The chat a DM from `who` is answered in.
    fn dm_chat(&self, who: Who) -> String;

    /// Every message sent so far, in order.
    fn sent(&self) -> Vec<Out>;

    /// Waits until at least `n` messages were sent; returns them all.
    async fn wait_sent(&self, n: usize) -> Vec<Out>;

    /// When each send request arrived, answered or not.
    fn send_attempts(&self) -> Vec<Instant>;

    /// Waits until at least `n` send requests arrived.
    async fn wait_send_attempts(&self, n: usize);

    /// While set, sends hang unanswered and are never delivered.
    fn hang_send(&self, hang: bool);

    /// A direct message from `who` carrying `file`, with `caption` as its
    /// text where the platform has captions; returns its id.
    ///
    /// # Panics
    /// On a kit whose platform receives no files (the suite never calls
    /// it there).
    fn push_dm_file(&self, _who: Who, _file: &KitFile, _caption: &str) -> String {
        panic!("{} declares no files received", Self::NAME)
    }

    /// Every file the bot uploaded so far, in order.
    fn uploads(&self) -> Vec<Uploaded> {
        Vec::new()
    }

    /// A message in a thread, addressed to the bot as the platform needs.
    ///
    /// # Panics
    /// On a kit whose platform has no threads (the suite never calls it).
    fn push_in_thread(&self, _text: &str) -> Threaded {
        panic!("{} declares no threads", Self::NAME)
    }

    /// Delivers the message `id` (from [`PlatformKit::push_dm`]) again, as
    /// the platform does when it thinks a delivery was lost.
    ///
    /// # Panics
    /// On a kit whose platform never re-delivers.
    fn redeliver(&self, _id: &str, _text: &str) {
        panic!("{} declares no re-deliveries", Self::NAME)
    }

    /// Cuts the gateway's connection; the fake keeps what arrives meanwhile.
    ///
    /// # Panics
    /// On a kit whose platform holds no connection.
    async fn drop_connection(&self) {
        panic!("{} declares no connection to drop", Self::NAME)
    }

    /// The next send is refused as rate-limited, asking to wait `after`.
    ///
    /// # Panics
    /// On a kit whose fake cannot rate-limit.
    fn rate_limit_next_send(&self, _after: Duration) {
        panic!("{} declares no rate limit", Self::NAME)
    }

    /// Pushes a message from [`Who::Stranger`] where the bot would answer
    /// a friend in a shared chat (mentioning it, where that is needed).
    fn push_stranger_in_group(&self, _text: &str) {}

    /// A message from [`Who::Friend`] in a shared chat (a group, a
    /// channel), addressing the bot the way the platform does (an
    /// @-mention) when `mention` is true and not addressing it at all
    /// otherwise; says where its answer must land.
    ///
    /// # Panics
    /// On a kit whose platform has no shared chats (the suite never calls
    /// it there).
    fn push_in_group(&self, _text: &str, _mention: bool) -> Threaded {
        panic!("{} declares no shared chats", Self::NAME)
    }

    /// Whether the bot showed it was typing in `chat`; `None` where the
    /// fake cannot tell.
    fn typed_in(&self, _chat: &str) -> Option<bool> {
        None
    }

    /// Whether the newest connection resumed the one before it (rather
    /// than starting afresh); `None` where the platform has no resume.
    fn last_connection_resumed(&self) -> Option<bool> {
        None
    }

    /// Inbound events the platform still holds for lack of an
    /// acknowledgement; `None` where the platform does not acknowledge.
    fn unacknowledged(&self) -> Option<usize> {
        None
    }

    /// Waits until the platform holds no inbound event unacknowledged
    /// (panics after the wait); nothing to wait for where the platform
    /// does not acknowledge.
    async fn wait_acknowledged(&self) {}

    /// Waits until the adapter has taken everything pushed so far off the
    /// platform: acknowledged it, confirmed it with a later offset,
    /// synced past it. An adapter does that only once the runner has
    /// decided on each event (taken, a repeat, refused), so what follows
    /// is causally after every decision. The default is
    /// [`PlatformKit::wait_acknowledged`]; where the platform shows no
    /// such thing, the adapter hands events over one at a time in the
    /// order they were pushed, and the answer to a later message is the
    /// proof instead.
    async fn wait_handed_over(&self) {
        self.wait_acknowledged().await;
    }

    /// Reactions the bot put on messages (Slack's working indicator);
    /// `None` where the platform shows none.
    fn reactions(&self) -> Option<usize> {
        None
    }
}

/// Finds the `(i/n)` part counter the splitter appends and returns `n`.
pub fn part_count(text: &str) -> Option<usize> {
    text.rsplit_once(" (1/")
        .and_then(|(_, n)| n.trim_end_matches(')').parse().ok())
}

/// An answer of whole paragraphs at least `min_chars` long.
pub fn long_answer(min_chars: usize) -> String {
    let mut answer = String::new();
    let mut i = 0;
    while answer.chars().count() < min_chars {
        answer.push_str(&format!(
            "Paragraph {i}: the quick brown fox jumps over the lazy dog, again and again.\n\n"
        ));
        i += 1;
    }
    answer.trim_end().to_owned()
}

/// Waits until some sent message contains `needle`; returns them all.
///
/// # Panics
/// When [`crate::wait::WAIT`] passes first.
pub async fn wait_for_text<K: PlatformKit>(kit: &K, needle: &str) -> Vec<Out> {
    crate::wait::wait_for(&format!("a message containing {needle:?}"), || async {
        let sent = kit.sent();
        if sent.iter().any(|o| o.text.contains(needle)) {
            Ok(sent)
        } else {
            Err(sent.into_iter().map(|o| o.text).collect::<Vec<_>>())
        }
    })
    .await
}
