//! The generic webhook platform's kit: deliveries signed as GitHub signs
//! them, posted to a route on the gateway's shared listener, whose answers
//! go to the route's `deliver` target, a chat of the fake Telegram.
//!
//! A webhook sender has no chat of its own: "a direct message" is a
//! delivery, its answer lands in the route's target chat, and a sender is
//! known by its signature, so a stranger is one signing with a wrong
//! secret.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;

use super::deliver::{Arrivals, Delivery, Sender, free_port};
use super::{Out, PlatformKit, Who};
use crate::FakeTelegram;
use crate::wait::WAIT;

/// The route the kit posts to.
pub const ROUTE: &str = "kit";
/// The environment variable holding the route's secret.
pub const SECRET_ENV: &str = "KIT_WEBHOOK_SECRET";
/// The route's secret.
pub const SECRET: &str = "kit-webhook-secret-0123456789";
/// The GitHub pull request route.
pub const PR_ROUTE: &str = "gh-prs";
/// The environment variable holding its secret.
pub const PR_SECRET_ENV: &str = "GITHUB_WEBHOOK_SECRET";
/// Its secret.
pub const PR_SECRET: &str = "kit-gh-secret-0123456789";
/// The alerts route, answered in Telegram's home channel.
pub const ALERTS_ROUTE: &str = "alerts";
/// The environment variable holding its secret.
pub const ALERTS_SECRET_ENV: &str = "ALERTS_WEBHOOK_SECRET";
/// Its secret.
pub const ALERTS_SECRET: &str = "kit-alerts-secret-0123456789";
/// The bot token of the Telegram the answers go to.
pub const TELEGRAM_TOKEN: &str = "535353:kit-webhook-target-token-abcdef";
/// The Telegram chat the route delivers to.
pub const TARGET_CHAT: i64 = 777_000;
/// The event type every delivery names.
pub const EVENT: &str = "kit_event";

/// A route delivering to the fake Telegram, and its sender.
pub struct WebhookKit {
    /// Where the answers land.
    pub telegram: FakeTelegram,
    /// The shared listener's port, named in the kit's section.
    pub port: u16,
    /// Posts the deliveries, in order, until the listener takes them.
    pub sender: Sender,
    arrivals: Arrivals,
    next_id: AtomicU64,
}

/// The hex HMAC-SHA256 of `data` under `key`.
pub fn hmac_hex(key: &str, data: &[u8]) -> String {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key.as_bytes()) else {
        unreachable!("HMAC takes keys of any length");
    };
    mac.update(data);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The headers GitHub sends with a delivery of `event`, signed with
/// `secret`.
pub fn github_headers(
    secret: &str,
    body: &[u8],
    event: &str,
    delivery: &str,
) -> Vec<(String, String)> {
    vec![
        ("X-GitHub-Event".to_owned(), event.to_owned()),
        ("X-GitHub-Delivery".to_owned(), delivery.to_owned()),
        (
            "X-Hub-Signature-256".to_owned(),
            format!("sha256={}", hmac_hex(secret, body)),
        ),
    ]
}

impl PlatformKit for WebhookKit {
    const NAME: &'static str = "webhook";
    const DM_REPLY_QUOTES: bool = false;
    const DMS_CONTINUE: bool = false;

    async fn start() -> WebhookKit {
        let port = free_port();
        WebhookKit {
            telegram: FakeTelegram::start(TELEGRAM_TOKEN).await,
            port,
            sender: Sender::start(),
            arrivals: Arrivals::new(port),
            next_id: AtomicU64::new(1),
        }
    }

    /// The kit's route, and two more for platform-specific tests: GitHub
    /// pull requests rendered from their fields ([`PR_ROUTE`]), and alerts
    /// signed with the generic scheme for the home channel
    /// ([`ALERTS_ROUTE`]).
    fn section(&self) -> String {
        format!(
            "  webhook:\n    port: {port}\n    routes:\n\
             \x20     {ROUTE}:\n\
             \x20       scheme: github\n\
             \x20       secret_env: {SECRET_ENV}\n\
             \x20       prompt: \"{{payload.text}}\"\n\
             \x20       deliver: \"telegram:{TARGET_CHAT}\"\n\
             \x20     {PR_ROUTE}:\n\
             \x20       scheme: github\n\
             \x20       secret_env: {PR_SECRET_ENV}\n\
             \x20       prompt: \"Review PR #{{payload.number}}: {{payload.pull_request.title}} by \
             {{payload.pull_request.user.login}} ({{event_type}} on {{route}})\"\n\
             \x20       deliver: \"telegram:{TARGET_CHAT}\"\n\
             \x20       events: [pull_request]\n\
             \x20     {ALERTS_ROUTE}:\n\
             \x20       scheme: hmac\n\
             \x20       secret_env: {ALERTS_SECRET_ENV}\n\
             \x20       prompt: \"Alert {{payload.alert.name}} is {{payload.alert.state}}\"\n\
             \x20       deliver: telegram\n\
             \x20 telegram:\n    base_url: {telegram}\n    poll_timeout_secs: 1\n",
            port = self.port,
            telegram = self.telegram.base_url()
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        vec![
            (SECRET_ENV.into(), SECRET.into()),
            (PR_SECRET_ENV.into(), PR_SECRET.into()),
            (ALERTS_SECRET_ENV.into(), ALERTS_SECRET.into()),
            ("TELEGRAM_BOT_TOKEN".into(), TELEGRAM_TOKEN.into()),
        ]
    }

    fn secret(&self) -> &str {
        SECRET
    }

    fn connections(&self) -> usize {
        self.arrivals.count()
    }

    async fn wait_connected(&self, n: usize) {
        self.arrivals.wait(n).await;
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        let id = format!(
            "kit-delivery-{}",
            self.next_id.fetch_add(1, Ordering::Relaxed)
        );
        let secret = match who {
            Who::Friend => SECRET,
            Who::Stranger => "kit-guessed-secret-0000000000",
        };
        self.deliver(secret, &id, text);
        id
    }

    /// Every answer goes to the route's target, whoever asked.
    fn dm_chat(&self, _who: Who) -> String {
        TARGET_CHAT.to_string()
    }

    fn sent(&self) -> Vec<Out> {
        super::telegram::sent(&self.telegram)
    }

    async fn wait_sent(&self, n: usize) -> Vec<Out> {
        self.telegram.wait_for_sent(n, WAIT).await;
        self.sent()
    }

    fn send_attempts(&self) -> Vec<Instant> {
        super::telegram::send_attempts(&self.telegram)
    }

    async fn wait_send_attempts(&self, n: usize) {
        self.telegram.wait_for_send_attempts(n, WAIT).await;
    }

    fn hang_send(&self, hang: bool) {
        self.telegram.hang_send(hang);
    }

    fn redeliver(&self, id: &str, text: &str) {
        // A sender retrying: the same body under the same delivery id.
        self.deliver(SECRET, id, text);
    }

    fn rate_limit_next_send(&self, after: Duration) {
        self.telegram
            .fail_next_send_with_429(after.as_secs().max(1));
    }
}

impl WebhookKit {
    /// The body of delivery `id`: its own id makes each delivery's body,
    /// and so what its signature covers, unique.
    pub fn body(id: &str, text: &str) -> Vec<u8> {
        json!({"delivery": id, "text": text})
            .to_string()
            .into_bytes()
    }

    /// Queues delivery `id` carrying `text`, signed with `secret`.
    pub fn deliver(&self, secret: &str, id: &str, text: &str) {
        let body = WebhookKit::body(id, text);
        let headers = github_headers(secret, &body, EVENT, id);
        self.post(headers, body);
    }

    /// Queues `body` for the kit's route with exactly these headers.
    pub fn post(&self, headers: Vec<(String, String)>, body: Vec<u8>) {
        self.post_to(ROUTE, headers, body);
    }

    /// Queues `body` for `route` with exactly these headers.
    pub fn post_to(&self, route: &str, headers: Vec<(String, String)>, body: Vec<u8>) {
        self.sender.push(Delivery {
            url: format!("http://127.0.0.1:{}/webhooks/{route}", self.port),
            headers,
            content_type: "application/json".to_owned(),
            body,
        });
    }
}
