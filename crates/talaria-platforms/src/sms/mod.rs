//! The SMS adapter, through a Twilio phone number: Twilio's webhook in
//! (`POST /sms/twilio` on the shared listener, [`crate::ingress`]), the
//! REST API out.
//!
//! Every conversation is a DM with one phone number: the sender's E.164
//! number is both the chat and the user id, so `SMS_ALLOWED_USERS` lists
//! numbers (`+15551234567`).
//!
//! # Layout
//!
//! - this file: [`SmsSettings`] (from `platforms.sms` and the
//!   environment), [`SmsAdapter`] (sending, error mapping, the routes to
//!   mount, and `run` checking the credentials then attaching the inbox).
//! - `server`: the webhook handler, in processing order.
//! - `signature`: `X-Twilio-Signature` (HMAC-SHA1), compared in constant
//!   time.
//! - `api`: the REST calls, and fetching MMS media.
//! - `format`: Markdown to plain text that stays in GSM-7 where it can.
//! - `segments`: what a text costs in SMS segments, and the optional cap.
//!
//! # Invariants
//!
//! - Nothing a caller sends is acted on before its signature is checked
//!   over the configured public URL; a caller without the auth token can
//!   only get 401.
//! - A message is acknowledged (200) only after the gateway's inbox took
//!   it; otherwise 503, which Twilio reports and fails over on.
//! - The auth token is never logged and never part of an error message.

mod api;
mod config;
mod format;
pub mod segments;
mod server;
mod signature;

use crate::registry::{BuildError, Built, Platform, Setup};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Liveness, MessageLimits, OutboundMessage, SendError,
    SentMessage,
};
use talaria_adapter::{Capabilities, Download, DownloadError, LengthUnit, MediaKind, SenderIds};
use talaria_core::config::{secret_or_env, text_or_env};
use talaria_core::{Env, Secret};

use crate::ingress::{InboxSlot, Mount};
use api::{Api, ApiError};
use server::Inbound;

pub use server::{MAX_BODY_BYTES, PATH};

pub use config::{ENV, SmsConfig};

/// The platform name in session keys, allowlists (`SMS_ALLOWED_USERS`) and
/// targets (`sms:+15551234567`).
pub const PLATFORM: &str = "sms";

/// The longest Body Twilio accepts; Twilio sends a longer text as
/// several segments that the phone joins again (each billed).
pub const MAX_BODY_CHARS: usize = 1600;

/// How long fetching one MMS media file may take, body included.
const MEDIA_TIMEOUT: Duration = Duration::from_secs(120);

/// Longer waits than this are not worth blocking a send for.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(60);

/// The wait after a 429 that names none.
const DEFAULT_RETRY_WAIT: Duration = Duration::from_secs(1);

/// Twilio's error codes that the adapter tells apart.
mod code {
    /// Authentication failed (wrong SID or token).
    pub const AUTHENTICATE: u32 = 20003;
    /// Too many requests.
    pub const TOO_MANY_REQUESTS: u32 = 20429;
    /// The recipient replied STOP: Twilio refuses to send until START.
    pub const UNSUBSCRIBED: u32 = 21610;
    /// The `To` number is not a valid phone number.
    pub const INVALID_TO: u32 = 21211;
    /// The `To` number is not a mobile number (cannot take SMS).
    pub const NOT_MOBILE: u32 = 21614;
}

/// Whether `s` is an E.164 phone number: `+`, then 2 to 15 digits, the
/// first not 0.
pub fn is_e164(s: &str) -> bool {
    let Some(digits) = s.strip_prefix('+') else {
        return false;
    };
    (2..=15).contains(&digits.len())
        && digits.chars().all(|c| c.is_ascii_digit())
        && !digits.starts_with('0')
}

/// What the adapter needs, resolved from `platforms.sms` and the
/// environment.
#[derive(Debug, Clone)]
pub struct SmsSettings {
    /// The account SID (`AC...`).
    pub account_sid: String,
    /// The auth token. Never logged.
    pub auth_token: Secret,
    /// Our Twilio number, E.164.
    pub phone_number: String,
    /// The public URL Twilio posts to; signatures are computed over it.
    pub webhook_url: String,
    /// The REST API root.
    pub api_base: String,
    /// The most segments one SMS may use; 0 for no cap.
    pub max_segments: u32,
    /// How long one REST call may take.
    pub send_timeout: Duration,
    /// Retries after a 429 before a send reports
    /// [`SendError::RateLimited`].
    pub rate_limit_retries: u32,
}

/// Why the SMS adapter cannot be configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SmsError {
    /// SMS is on, but some settings are missing; each is named as its
    /// environment variable and its config key.
    #[error(
        "SMS (Twilio) is missing {}; set them in the environment or .env (or under \
         platforms.sms in config.yaml), or turn SMS off with platforms.sms.enabled: false",
        .0.join(", ")
    )]
    Missing(Vec<&'static str>),
    /// A setting is there but unusable; the message names it.
    #[error("SMS (Twilio): {0}")]
    Invalid(String),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

impl SmsSettings {
    /// Settings with the defaults for everything but these four.
    pub fn new(
        account_sid: impl Into<String>,
        auth_token: impl Into<Secret>,
        phone_number: impl Into<String>,
        webhook_url: impl Into<String>,
    ) -> SmsSettings {
        let defaults = SmsConfig::default();
        SmsSettings {
            account_sid: account_sid.into(),
            auth_token: auth_token.into(),
            phone_number: phone_number.into(),
            webhook_url: webhook_url.into(),
            api_base: defaults.api_base,
            max_segments: 0,
            send_timeout: Duration::from_secs(30),
            rate_limit_retries: 2,
        }
    }

    /// The settings, or `None` when SMS is off: `enabled: false`, or no
    /// `enabled` and not both an account SID and an auth token (config
    /// values win over `TWILIO_ACCOUNT_SID`, `TWILIO_AUTH_TOKEN`,
    /// `TWILIO_PHONE_NUMBER`, `SMS_WEBHOOK_URL`).
    ///
    /// # Errors
    /// [`SmsError::Missing`] naming every missing piece when SMS is on.
    pub fn from_config(config: &SmsConfig, env: &Env) -> Result<Option<SmsSettings>, SmsError> {
        if config.enabled == Some(false) {
            return Ok(None);
        }
        let sid = text_or_env(config.account_sid.as_deref(), env, "TWILIO_ACCOUNT_SID");
        let token = secret_or_env(config.auth_token.as_ref(), env, "TWILIO_AUTH_TOKEN");
        let number = text_or_env(config.phone_number.as_deref(), env, "TWILIO_PHONE_NUMBER");
        let url = text_or_env(config.webhook_url.as_deref(), env, "SMS_WEBHOOK_URL");
        if config.enabled.is_none() && (sid.is_none() || token.is_none()) {
            return Ok(None);
        }
        let missing: Vec<&'static str> = [
            (
                sid.is_none(),
                "TWILIO_ACCOUNT_SID (platforms.sms.account_sid)",
            ),
            (
                token.is_none(),
                "TWILIO_AUTH_TOKEN (platforms.sms.auth_token)",
            ),
            (
                number.is_none(),
                "TWILIO_PHONE_NUMBER (platforms.sms.phone_number)",
            ),
            (url.is_none(), "SMS_WEBHOOK_URL (platforms.sms.webhook_url)"),
        ]
        .into_iter()
        .filter_map(|(missing, name)| missing.then_some(name))
        .collect();
        match (sid, token, number, url) {
            (Some(sid), Some(token), Some(number), Some(url)) => Ok(Some(SmsSettings {
                api_base: config.api_base.trim().to_owned(),
                max_segments: config.max_segments.unwrap_or(0),
                ..SmsSettings::new(sid, token, number, url)
            })),
            _ => Err(SmsError::Missing(missing)),
        }
    }
}

/// The SMS connector (see the module docs).
pub struct SmsAdapter {
    api: Api,
    phone_number: String,
    max_segments: usize,
    send_timeout: Duration,
    rate_limit_retries: u32,
    inbound: Arc<Inbound>,
}

// By hand only because the webhook side holds no `Debug`; the credentials
// are `Secret`s inside the client either way.
impl std::fmt::Debug for SmsAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmsAdapter")
            .field("api", &self.api)
            .field("phone_number", &self.phone_number)
            .finish_non_exhaustive()
    }
}

fn http_url_with_host(url: &str) -> bool {
    reqwest::Url::parse(url)
        .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
}

impl SmsAdapter {
    /// Asks Twilio for the account (`GET /Accounts/{sid}.json`): its name
    /// and sid, [`AdapterError::Fatal`] when Twilio refuses the sid and
    /// auth token or the account is not active, and
    /// [`AdapterError::Disconnected`] when it cannot be asked.
    async fn whoami_twilio(&self) -> Result<String, AdapterError> {
        match self.api.account(self.send_timeout).await {
            Ok(account) if !account.status.is_empty() && account.status != "active" => {
                Err(AdapterError::Fatal(format!(
                    "the Twilio account {} is {}",
                    account.sid, account.status
                )))
            }
            // The sid is what was configured (and reports mask it as a
            // secret of `.env`): the account's name says more.
            Ok(account) => Ok(match account.friendly_name.as_str() {
                "" => format!("the account {}", account.sid),
                name => format!("the account {name:?}"),
            }),
            Err(e) if matches!(e.status(), Some(401 | 403)) => Err(AdapterError::Fatal(format!(
                "Twilio rejected the account SID and auth token (TWILIO_ACCOUNT_SID, \
                     TWILIO_AUTH_TOKEN): {e}"
            ))),
            Err(e) => Err(AdapterError::Disconnected(e.to_string())),
        }
    }

    /// Checks the settings and builds the HTTP client; contacts nobody.
    ///
    /// # Errors
    /// A setting that cannot work, named with the reason.
    pub fn new(settings: SmsSettings) -> Result<SmsAdapter, SmsError> {
        let sid = settings.account_sid.trim().to_owned();
        if !(sid.starts_with("AC")
            && sid.len() > 2
            && sid.chars().all(|c| c.is_ascii_alphanumeric()))
        {
            return Err(SmsError::Invalid(
                "the account SID (TWILIO_ACCOUNT_SID) is not one: it starts with AC, followed by \
                 letters and digits"
                    .to_owned(),
            ));
        }
        let token = Secret::new(settings.auth_token.expose().trim());
        if token.expose().is_empty() || !token.expose().chars().all(|c| c.is_ascii_graphic()) {
            return Err(SmsError::Invalid(
                "the auth token (TWILIO_AUTH_TOKEN) is malformed".to_owned(),
            ));
        }
        let number = settings.phone_number.trim().to_owned();
        if !is_e164(&number) {
            return Err(SmsError::Invalid(format!(
                "the phone number (TWILIO_PHONE_NUMBER) must be in E.164 form, like \
                 +15551234567; got {number:?}"
            )));
        }
        let webhook_url = settings.webhook_url.trim().to_owned();
        if !http_url_with_host(&webhook_url) {
            return Err(SmsError::Invalid(format!(
                "the webhook URL (SMS_WEBHOOK_URL) must be the full public http(s) URL set on the \
                 number in Twilio, like https://gateway.example.com{PATH}; got {webhook_url:?}"
            )));
        }
        if !webhook_url.starts_with("https://") {
            tracing::warn!(
                "SMS_WEBHOOK_URL is not https: Twilio's requests (and the messages in them) \
                 travel unencrypted"
            );
        }
        let api_base = settings.api_base.trim().trim_end_matches('/').to_owned();
        if !http_url_with_host(&api_base) {
            return Err(SmsError::Invalid(format!(
                "platforms.sms.api_base must be an http(s) URL; got {api_base:?}"
            )));
        }
        let verifier =
            signature::Verifier::new(token.expose(), &webhook_url).map_err(SmsError::Invalid)?;
        let api = Api::new(&api_base, &sid, &token).map_err(SmsError::Client)?;
        Ok(SmsAdapter {
            api,
            phone_number: number.clone(),
            max_segments: settings.max_segments as usize,
            send_timeout: settings.send_timeout,
            rate_limit_retries: settings.rate_limit_retries,
            inbound: Arc::new(Inbound {
                verifier,
                account_sid: sid,
                phone_number: number,
                slot: InboxSlot::new(),
            }),
        })
    }

    /// `POST /sms/twilio`, to mount on the shared listener.
    pub fn mount(&self) -> Mount {
        Mount {
            platform: PLATFORM,
            slot: self.inbound.slot.clone(),
            routes: server::router(self.inbound.clone()),
        }
    }

    /// What one SMS carries for `text`: plain text, capped to
    /// `max_segments` when a cap is set.
    fn body_for(&self, text: &str) -> String {
        let plain = format::to_sms(text);
        let body = segments::cap(&plain, self.max_segments);
        if body.len() != plain.len() {
            tracing::warn!(
                max_segments = self.max_segments,
                "an SMS was shortened to platforms.sms.max_segments"
            );
        }
        body
    }

    /// Creates the message, waiting out 429s a bounded number of times.
    async fn create(&self, to: &str, body: &str) -> Result<SentMessage, SendError> {
        let mut retries = 0;
        loop {
            match self
                .api
                .create_message(to, &self.phone_number, body, self.send_timeout)
                .await
            {
                Ok(created) => {
                    tracing::debug!(
                        sid = %created.sid,
                        status = %created.status,
                        segments = segments::count(body),
                        "SMS sent"
                    );
                    return Ok(SentMessage {
                        message_id: Some(created.sid),
                    });
                }
                Err(e) => match rate_limit_wait(&e) {
                    Some(wait) if retries < self.rate_limit_retries && wait <= MAX_RETRY_WAIT => {
                        retries += 1;
                        tracing::info!(?wait, "Twilio rate limit; waiting");
                        tokio::time::sleep(wait).await;
                    }
                    _ => return Err(classify(e)),
                },
            }
        }
    }
}

/// The wait a rate-limited call asks for, or `None` when it was not one.
fn rate_limit_wait(e: &ApiError) -> Option<Duration> {
    if e.status() != Some(429) && api::twilio_code(e) != Some(code::TOO_MANY_REQUESTS) {
        return None;
    }
    Some(match e.retry_after() {
        Some(wait) if !wait.is_zero() => wait,
        _ => DEFAULT_RETRY_WAIT,
    })
}

/// Maps a failed call to what the gateway's ledger understands.
fn classify(e: ApiError) -> SendError {
    if let Some(wait) = rate_limit_wait(&e) {
        return SendError::RateLimited(wait);
    }
    // Twilio's reasons are read whole: the code and its words.
    let text = e.to_string();
    let code = api::twilio_code(&e);
    match e.status() {
        _ if code == Some(code::UNSUBSCRIBED) => SendError::Rejected(format!(
            "the recipient unsubscribed by replying STOP; Twilio sends nothing to them until \
             they reply START ({text})"
        )),
        _ if matches!(code, Some(code::INVALID_TO | code::NOT_MOBILE)) => {
            SendError::Rejected(format!("the number cannot take SMS ({text})"))
        }
        Some(status) if status == 401 || code == Some(code::AUTHENTICATE) => {
            SendError::Unavailable(format!(
                "{text}; check TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN"
            ))
        }
        Some(status) if status >= 500 => SendError::Transient(text),
        Some(_) => SendError::Rejected(text),
        None => match e.classify() {
            SendError::Unavailable(_) => SendError::Unavailable(text),
            _ => SendError::Ambiguous(text),
        },
    }
}

/// What the platform can do; also the registry's declaration.
pub const CAPABILITIES: Capabilities = Capabilities {
    sender_ids: SenderIds::Phone,
    // An MMS carries pictures, audio (recordings arrive as AMR audio),
    // video and a few document types.
    receives: &[
        MediaKind::Image,
        MediaKind::Audio,
        MediaKind::Video,
        MediaKind::Document,
    ],
    // Sending an MMS needs the file at a public URL Twilio fetches
    // (`MediaUrl`); Talaria serves none, so files go as a text line.
    sends: &[],
    ..Capabilities::chat(MessageLimits {
        max_len: MAX_BODY_CHARS,
        unit: LengthUnit::Chars,
    })
};

#[async_trait]
impl Adapter for SmsAdapter {
    fn platform(&self) -> &'static str {
        PLATFORM
    }

    /// Twilio's largest Body. The gateway splits longer answers into
    /// several messages; each is billed per segment (see [`segments`]).
    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    /// Checks the credentials with Twilio (a rejected token stops here
    /// with a clear error), then takes deliveries until the gateway stops.
    /// Twilio being unreachable is only warned about: messages may still
    /// arrive, and sends report their own failures.
    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        ctx.liveness.set(Liveness::Connecting);
        let checked = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = self.whoami_twilio() => r,
        };
        match checked {
            Ok(who) => tracing::info!(account = %who, "Twilio accepted the SMS credentials"),
            Err(fatal @ AdapterError::Fatal(_)) => return Err(fatal),
            Err(e) => tracing::warn!("cannot check the SMS credentials with Twilio: {e}"),
        }
        self.inbound.slot.attach(&ctx).await
    }

    async fn whoami(&self) -> Option<Result<String, AdapterError>> {
        Some(self.whoami_twilio().await)
    }

    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        let to = message.chat_id.trim();
        if !is_e164(to) {
            return Err(SendError::Rejected(format!(
                "`{to}` is not a phone number in E.164 form (+15551234567)"
            )));
        }
        let body = self.body_for(&message.text);
        if body.trim().is_empty() {
            // Twilio refuses an empty Body (21602); nothing to say.
            return Ok(SentMessage::default());
        }
        self.create(to, &body).await
    }

    /// `locator` is a `MediaUrl{N}` from an inbound MMS: fetched with the
    /// account's credentials, only from Twilio's API host or the
    /// configured API base.
    async fn download(&self, locator: &str) -> Result<Download, DownloadError> {
        let url = reqwest::Url::parse(locator)
            .ok()
            .filter(|u| self.api.is_media_address(u))
            .ok_or_else(|| {
                DownloadError::Gone("the media URL is not a Twilio file address".into())
            })?;
        self.api.fetch_media(url, MEDIA_TIMEOUT).await
    }

    // `send_file` keeps the default, a text line naming the file: an MMS
    // is sent by giving Twilio a public URL to fetch the file from
    // (`MediaUrl`), and Talaria serves files at none.
}

/// The registry's entry for SMS (Twilio).
pub const ENTRY: Platform = Platform {
    name: PLATFORM,
    title: "SMS (Twilio)",
    standalone: true,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<SmsConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let Some(settings) = SmsSettings::from_config(&setup.section()?, setup.env)
        .map_err(BuildError::misconfigured)?
    else {
        return Ok(None);
    };
    let adapter = SmsAdapter::new(settings).map_err(BuildError::set_up)?;
    let mount = adapter.mount();
    Ok(Some(Built {
        adapter: Arc::new(adapter),
        mount: Some(mount),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{Failure, HttpError};

    const SID: &str = "AC0123456789abcdef0123456789abcdef";

    fn no_env() -> Env {
        Env::from_pairs(Vec::<(String, String)>::new())
    }

    fn full_env() -> Env {
        Env::from_pairs([
            ("TWILIO_ACCOUNT_SID", SID),
            ("TWILIO_AUTH_TOKEN", "envtoken0123"),
            ("TWILIO_PHONE_NUMBER", "+15550001111"),
            ("SMS_WEBHOOK_URL", "https://gw.example.com/sms/twilio"),
        ])
    }

    #[test]
    fn off_unless_credentials_or_enabled() {
        let cfg = SmsConfig::default();
        assert!(SmsSettings::from_config(&cfg, &no_env()).unwrap().is_none());
        // A number alone (for another tool, say) does not turn SMS on.
        let env = Env::from_pairs([("TWILIO_PHONE_NUMBER", "+15550001111")]);
        assert!(SmsSettings::from_config(&cfg, &env).unwrap().is_none());
        let s = SmsSettings::from_config(&cfg, &full_env())
            .unwrap()
            .unwrap();
        assert_eq!(s.account_sid, SID);
        assert_eq!(s.auth_token, "envtoken0123");
        assert_eq!(s.api_base, "https://api.twilio.com");
        assert_eq!(s.max_segments, 0);
        let off = SmsConfig {
            enabled: Some(false),
            ..SmsConfig::default()
        };
        assert!(
            SmsSettings::from_config(&off, &full_env())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn config_wins_and_missing_pieces_are_named() {
        let cfg = SmsConfig {
            auth_token: Some(talaria_core::Secret::new("cfgtoken")),
            phone_number: Some("+15559998888".into()),
            max_segments: Some(3),
            ..SmsConfig::default()
        };
        let s = SmsSettings::from_config(&cfg, &full_env())
            .unwrap()
            .unwrap();
        assert_eq!(s.auth_token, "cfgtoken");
        assert_eq!(s.phone_number, "+15559998888");
        assert_eq!(s.max_segments, 3);

        let env = Env::from_pairs([("TWILIO_ACCOUNT_SID", SID), ("TWILIO_AUTH_TOKEN", "t")]);
        let e = SmsSettings::from_config(&SmsConfig::default(), &env).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("TWILIO_PHONE_NUMBER") && text.contains("SMS_WEBHOOK_URL"),
            "{text}"
        );
        assert!(!text.contains("TWILIO_AUTH_TOKEN"), "{text}");
        let on = SmsConfig {
            enabled: Some(true),
            ..SmsConfig::default()
        };
        let e = SmsSettings::from_config(&on, &no_env()).unwrap_err();
        assert_eq!(
            e,
            SmsError::Missing(vec![
                "TWILIO_ACCOUNT_SID (platforms.sms.account_sid)",
                "TWILIO_AUTH_TOKEN (platforms.sms.auth_token)",
                "TWILIO_PHONE_NUMBER (platforms.sms.phone_number)",
                "SMS_WEBHOOK_URL (platforms.sms.webhook_url)",
            ])
        );
    }

    #[test]
    fn new_checks_every_setting_and_hides_the_token() {
        let good = || {
            SmsSettings::new(
                SID,
                "SECRETSECRETSECRET",
                "+15550001111",
                "https://gw.example.com/sms/twilio",
            )
        };
        let a = SmsAdapter::new(good()).unwrap();
        assert!(!format!("{a:?}").contains("SECRETSECRET"));
        assert!(!format!("{:?}", good()).contains("SECRETSECRET"));
        assert_eq!(a.limits().max_len, 1600);
        assert!(!a.verifies_senders(), "allowlists apply to SMS senders");
        let bad = [
            SmsSettings {
                account_sid: "XX123".into(),
                ..good()
            },
            SmsSettings {
                auth_token: "a b".into(),
                ..good()
            },
            SmsSettings {
                phone_number: "5550001111".into(),
                ..good()
            },
            SmsSettings {
                webhook_url: "/sms/twilio".into(),
                ..good()
            },
            SmsSettings {
                api_base: "ftp://x".into(),
                ..good()
            },
        ];
        for s in bad {
            let e = SmsAdapter::new(s).unwrap_err();
            assert!(matches!(e, SmsError::Invalid(_)), "{e:?}");
            assert!(!e.to_string().contains("SECRETSECRET"), "{e}");
        }
    }

    #[test]
    fn e164() {
        for good in ["+15551234567", "+447700900123", "+12", "+123456789012345"] {
            assert!(is_e164(good), "{good}");
        }
        for bad in [
            "",
            "+",
            "15551234567",
            "+1",
            "+0155512345",
            "+1555 123 4567",
            "+1234567890123456",
            "whatsapp:+15551234567",
            "12345",
        ] {
            assert!(!is_e164(bad), "{bad}");
        }
    }

    #[test]
    fn errors_are_classified() {
        let failed = |failure| HttpError::new(api::TWILIO, failure);
        let status = |status: u16, code: Option<u32>, retry_after: Option<u64>| {
            failed(Failure::Status {
                status,
                code: code.map(|c| c.to_string()),
                message: "m".into(),
                retry_after: retry_after.map(Duration::from_secs),
            })
        };
        let e = classify(status(400, Some(21610), None));
        assert!(
            matches!(&e, SendError::Rejected(m) if m.contains("STOP")),
            "{e:?}"
        );
        for c in [21211, 21614] {
            assert!(matches!(
                classify(status(400, Some(c), None)),
                SendError::Rejected(_)
            ));
        }
        assert_eq!(
            classify(status(429, Some(20429), Some(7))),
            SendError::RateLimited(Duration::from_secs(7))
        );
        assert_eq!(
            classify(status(429, None, None)),
            SendError::RateLimited(DEFAULT_RETRY_WAIT)
        );
        assert!(matches!(
            classify(status(401, Some(20003), None)),
            SendError::Unavailable(_)
        ));
        assert!(matches!(
            classify(status(503, None, None)),
            SendError::Transient(_)
        ));
        assert!(matches!(
            classify(status(400, Some(21602), None)),
            SendError::Rejected(_)
        ));
        assert!(matches!(
            classify(failed(Failure::Connect("x".into()))),
            SendError::Unavailable(_)
        ));
        assert!(matches!(
            classify(failed(Failure::Timeout("x".into()))),
            SendError::Ambiguous(_)
        ));
    }
}
