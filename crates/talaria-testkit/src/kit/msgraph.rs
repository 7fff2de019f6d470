//! Microsoft Graph's kit: the fake Graph for tokens, subscriptions,
//! messages and answers, and Graph's change notifications posted to the
//! URL the adapter subscribed with, on the gateway's shared listener.
//!
//! A DM is a one-to-one Teams chat; the shared chat is a channel, where
//! the app is addressed with an @-mention and answers in the thread.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::deliver::{Delivery, Sender, free_port};
use super::{Out, PlatformKit, Threaded, Who};
use crate::msgraph::{
    BOT_USER, CLIENT_ID, CLIENT_SECRET, Failure, FakeMsGraph, REFRESH_TOKEN, SentKind, TENANT,
};
use crate::wait::{WAIT, wait_for};

/// The secret every notification carries.
pub const CLIENT_STATE: &str = "kit-client-state-51c0";
/// The allowlisted user's object id.
pub const ADA: &str = "ada-0000-4c1d";
/// A user on no list.
pub const MALLORY: &str = "mallory-0000-9e2f";
/// The team and channel both are in.
pub const TEAM: &str = "team-0001";
/// The channel.
pub const CHANNEL: &str = "19:general@thread.tacv2";
/// What chats are subscribed to.
pub const CHATS: &str = "/chats/getAllMessages";
/// What channels are subscribed to.
pub const CHANNELS: &str = "/teams/getAllMessages";

/// `who`'s id and name.
pub fn user(who: Who) -> (&'static str, &'static str) {
    match who {
        Who::Friend => (ADA, "Ada Lovelace"),
        Who::Stranger => (MALLORY, "Mallory"),
    }
}

/// The one-to-one chat of `who` with the app's user.
pub fn dm(who: Who) -> &'static str {
    match who {
        Who::Friend => "19:ada_bot@unq.gbl.spaces",
        Who::Stranger => "19:mallory_bot@unq.gbl.spaces",
    }
}

/// The fake Graph and its notifications.
pub struct MsGraphKit {
    /// The fake itself.
    pub fake: FakeMsGraph,
    /// The shared listener's port.
    pub port: u16,
    /// Posts the notifications, in order.
    pub sender: Sender,
    next: std::sync::atomic::AtomicU64,
}

impl MsGraphKit {
    /// Posts `body` to `url` as Graph does.
    pub fn post(&self, url: &str, body: &Value) {
        self.sender.push(Delivery {
            url: url.to_owned(),
            headers: Vec::new(),
            content_type: "application/json; charset=utf-8".to_owned(),
            body: body.to_string().into_bytes(),
        });
    }

    /// A fresh notification id.
    pub fn note_id(&self) -> String {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("note-{n:06}")
    }

    /// Notifies the subscription for `subscribed` of `resource`, with
    /// `client_state` instead of the right one when given.
    ///
    /// # Panics
    /// When the adapter has no live subscription for it.
    pub fn notify(&self, subscribed: &str, resource: &str, client_state: Option<&str>) {
        let sub = self
            .fake
            .subscription(subscribed)
            .unwrap_or_else(|| panic!("no subscription to {subscribed}"));
        let id = self.note_id();
        let body = self
            .fake
            .notification(&sub, &[(resource, id.as_str())], client_state);
        self.post(&sub.notification_url, &body);
    }

    /// A channel message (a reply in `parent`'s thread when given) from
    /// `who`, notified; returns its id.
    pub fn channel_message(
        &self,
        who: Who,
        parent: Option<&str>,
        text: &str,
        mention: bool,
    ) -> String {
        let (id, resource) =
            self.fake
                .post_channel_message(TEAM, CHANNEL, parent, user(who), text, mention);
        self.notify(CHANNELS, &resource, None);
        id
    }

    /// The chat id the adapter answers the channel in.
    pub fn channel_chat() -> String {
        format!("channel:{TEAM}/{CHANNEL}")
    }
}

impl PlatformKit for MsGraphKit {
    const NAME: &'static str = "msgraph";
    const DM_REPLY_QUOTES: bool = false;

    async fn start() -> MsGraphKit {
        let fake = FakeMsGraph::start();
        fake.add_chat(dm(Who::Friend), "oneOnOne");
        fake.add_chat(dm(Who::Stranger), "oneOnOne");
        MsGraphKit {
            fake,
            port: free_port(),
            sender: Sender::start(),
            next: std::sync::atomic::AtomicU64::new(1),
        }
    }

    fn section(&self) -> String {
        format!(
            "  webhook:\n    port: {port}\n  msgraph:\n    graph_url: {graph}\n    \
             authority_url: {auth}\n    public_url: http://127.0.0.1:{port}\n    \
             resources: [\"{CHATS}\", \"{CHANNELS}\"]\n",
            port = self.port,
            graph = self.fake.graph_url(),
            auth = self.fake.authority_url(),
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        [
            ("MSGRAPH_WEBHOOK_CLIENT_STATE", CLIENT_STATE),
            ("MSGRAPH_TENANT_ID", TENANT),
            ("MSGRAPH_CLIENT_ID", CLIENT_ID),
            ("MSGRAPH_CLIENT_SECRET", CLIENT_SECRET),
            ("MSGRAPH_DELEGATED_REFRESH_TOKEN", REFRESH_TOKEN),
            ("MSGRAPH_ALLOWED_USERS", ADA),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    fn secret(&self) -> &str {
        CLIENT_SECRET
    }

    /// Each adapter run subscribes to both resources, channels last: a
    /// run counts once its channel subscription is made or renewed.
    fn connections(&self) -> usize {
        self.fake
            .requests()
            .iter()
            .filter(|r| {
                (r.method == "POST"
                    && r.path == "/v1.0/subscriptions"
                    && r.body["resource"] == CHANNELS)
                    || (r.method == "PATCH" && r.path.starts_with("/v1.0/subscriptions/"))
            })
            .count()
    }

    async fn wait_connected(&self, n: usize) {
        wait_for(&format!("{n} subscription runs"), || async {
            let got = self.connections();
            let live = self.fake.subscription(CHANNELS).is_some();
            if got >= n && live { Ok(()) } else { Err(got) }
        })
        .await;
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        let (id, resource) = self.fake.post_chat_message(dm(who), user(who), text, false);
        self.notify(CHATS, &resource, None);
        id
    }

    fn dm_chat(&self, who: Who) -> String {
        format!("chat:{}", dm(who))
    }

    fn sent(&self) -> Vec<Out> {
        self.fake
            .sent()
            .into_iter()
            .map(|s| Out {
                chat: match s.kind {
                    SentKind::Chat => format!("chat:{}", s.place),
                    SentKind::ChannelPost | SentKind::ChannelReply => {
                        format!("channel:{}", s.place)
                    }
                    SentKind::MailReply => format!("mail:{}", s.place),
                },
                thread: s.thread,
                text: s.text.clone(),
                wire: s.text,
                reply_to: s.reply_to,
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

    fn push_in_thread(&self, text: &str) -> Threaded {
        // The thread's root, posted without addressing the app.
        let (root, _) = self.fake.post_channel_message(
            TEAM,
            CHANNEL,
            None,
            user(Who::Friend),
            "a topic",
            false,
        );
        let id = self.channel_message(Who::Friend, Some(&root), text, true);
        Threaded {
            id,
            chat: Self::channel_chat(),
            thread: Some(root),
        }
    }

    fn redeliver(&self, id: &str, _text: &str) {
        // Graph notifies the message again under a new notification id
        // (an `updated` after the `created`, or a retry).
        let resource = format!("chats('{}')/messages('{id}')", dm(Who::Friend));
        self.notify(CHATS, &resource, None);
    }

    fn rate_limit_next_send(&self, after: Duration) {
        self.fake.fail_next_send(Failure::Status {
            status: 429,
            retry_after: Some(after.as_secs().max(1)),
        });
    }

    fn push_stranger_in_group(&self, text: &str) {
        self.channel_message(Who::Stranger, None, text, true);
    }

    fn push_in_group(&self, text: &str, mention: bool) -> Threaded {
        let id = self.channel_message(Who::Friend, None, text, mention);
        Threaded {
            id: id.clone(),
            chat: Self::channel_chat(),
            thread: Some(id),
        }
    }

    fn unacknowledged(&self) -> Option<usize> {
        Some(self.sender.pending())
    }

    async fn wait_acknowledged(&self) {
        self.sender.wait_all_taken().await;
    }
}

/// The bot user's id, for tests that make it speak.
pub fn bot_user() -> &'static str {
    BOT_USER
}
