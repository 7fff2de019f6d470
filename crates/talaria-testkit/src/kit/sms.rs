//! SMS's kit: the fake Twilio REST API for answers, and inbound messages
//! posted as Twilio posts them (form bodies signed over the public URL) to
//! the gateway's shared webhook listener.

use std::time::{Duration, Instant};

use super::deliver::{Delivery, Sender, free_port};
use super::{KitFile, Out, PlatformKit, Who};
use crate::FakeTwilio;
use crate::twilio::{Failure, InboundSms, sign};
use crate::wait::{WAIT, wait_for};

/// The Twilio account the gateway is given.
pub const ACCOUNT_SID: &str = "AC00000000000000000000000000000abc";
/// The account's auth token: it authenticates sends and signs webhooks.
pub const AUTH_TOKEN: &str = "kit-twilio-token-0123456789abcdef";
/// The gateway's Twilio number.
pub const NUMBER: &str = "+15550001111";
/// The public URL set on the number in Twilio (a proxy in front of the
/// listener): what signatures are computed over.
pub const PUBLIC_URL: &str = "https://sms.example.com/sms/twilio";
/// Where the adapter serves Twilio's webhooks on the listener.
const PATH: &str = "/sms/twilio";

/// The fake Twilio with a friend and a stranger, each a phone number.
pub struct SmsKit {
    /// The fake itself, for platform-specific tests.
    pub fake: FakeTwilio,
    /// The shared listener's port, named in the kit's section.
    pub port: u16,
    /// Posts the inbound webhooks, in order, until the listener takes them.
    pub sender: Sender,
}

/// The number `who` writes from.
pub fn number(who: Who) -> &'static str {
    match who {
        Who::Friend => "+15552223333",
        Who::Stranger => "+15559990000",
    }
}

impl PlatformKit for SmsKit {
    const NAME: &'static str = "sms";
    const DM_REPLY_QUOTES: bool = false;

    async fn start() -> SmsKit {
        SmsKit {
            fake: FakeTwilio::start(ACCOUNT_SID, AUTH_TOKEN, NUMBER),
            port: free_port(),
            sender: Sender::start(),
        }
    }

    fn section(&self) -> String {
        format!(
            "  webhook:\n    port: {}\n  sms:\n    api_base: {}\n",
            self.port,
            self.fake.base_url()
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        [
            ("TWILIO_ACCOUNT_SID", ACCOUNT_SID),
            ("TWILIO_AUTH_TOKEN", AUTH_TOKEN),
            ("TWILIO_PHONE_NUMBER", NUMBER),
            ("SMS_WEBHOOK_URL", PUBLIC_URL),
            ("SMS_ALLOWED_USERS", number(Who::Friend)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    fn secret(&self) -> &str {
        AUTH_TOKEN
    }

    /// Each adapter run checks its credentials with Twilio first (it
    /// fetches the account).
    fn connections(&self) -> usize {
        let account = format!("/2010-04-01/Accounts/{ACCOUNT_SID}.json");
        self.fake
            .requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path == account)
            .count()
    }

    async fn wait_connected(&self, n: usize) {
        wait_for(&format!("{n} credential checks"), || async {
            let got = self.connections();
            if got >= n { Ok(()) } else { Err(got) }
        })
        .await;
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        let sms = self.fake.inbound(number(who), text);
        self.post(&sms);
        sms.message_sid
    }

    fn push_dm_file(&self, who: Who, file: &KitFile, caption: &str) -> String {
        // An MMS: Twilio keeps the file and names its URL and type; it
        // carries no file name, and every kind arrives the same way.
        let url = self.fake.add_media(&file.bytes, &file.mime);
        let sms = self
            .fake
            .inbound(number(who), caption)
            .with_media(&url, &file.mime);
        self.post(&sms);
        sms.message_sid
    }

    fn dm_chat(&self, who: Who) -> String {
        number(who).to_owned()
    }

    fn sent(&self) -> Vec<Out> {
        // SMS is plain text: what is read is what was sent.
        self.fake
            .sent()
            .into_iter()
            .map(|s| Out {
                chat: s.to,
                thread: None,
                text: s.body.clone(),
                wire: s.body,
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

    fn redeliver(&self, id: &str, text: &str) {
        // Twilio posts the same MessageSid again when it did not see the
        // webhook answered.
        let sms = InboundSms::new(ACCOUNT_SID, number(Who::Friend), NUMBER, text).with_sid(id);
        self.post(&sms);
    }

    fn rate_limit_next_send(&self, after: Duration) {
        self.fake.fail_next_send(Failure::RateLimited {
            retry_after: Some(after.as_secs().max(1)),
        });
    }
}

impl SmsKit {
    /// Queues `sms` for the listener, signed as Twilio signs it.
    pub fn post(&self, sms: &InboundSms) {
        let params = sms.params();
        let signature = sign(AUTH_TOKEN, PUBLIC_URL, &params);
        self.post_params(&params, Some(&signature));
    }

    /// Queues form fields with this signature header (`None`: none), for
    /// tests of refused webhooks.
    pub fn post_params(&self, params: &[(String, String)], signature: Option<&str>) {
        let body: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params.iter())
            .finish();
        let headers = signature
            .map(|s| vec![("X-Twilio-Signature".to_owned(), s.to_owned())])
            .unwrap_or_default();
        self.sender.push(Delivery {
            url: format!("http://127.0.0.1:{}{PATH}", self.port),
            headers,
            content_type: "application/x-www-form-urlencoded; charset=UTF-8".to_owned(),
            body: body.into_bytes(),
        });
    }
}
