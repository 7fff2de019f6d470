//! WeCom's self-built application (`wecom_callback`): WeCom posts each
//! message a user writes to the app as encrypted XML to a callback on the
//! shared listener ([`crate::ingress`]); answers go out through the
//! server API's `message/send` with the corp access token.
//!
//! Only one-to-one chats with the app exist here (a WeCom app receives no
//! group messages), and they have no threads.
//!
//! # Layout
//!
//! - this file: [`WecomCallbackSettings`], [`WecomCallbackAdapter`]
//!   (sending, error mapping, the routes to mount, `run`).
//! - `server`: URL verification and the message callback, in processing
//!   order.
//! - `api`: the access token, `message/send`, `media/upload` and
//!   `media/get`.
//! - `media`: which kind of media a file goes out as, within WeCom's
//!   limits.
//! - `config`: the section and its environment variables.
//!
//! Images, voice messages, videos and files users send are handed over as
//! attachments whose locator is WeCom's media id; the gateway fetches them
//! through `media/get` when the turn runs. Files go out by an upload, then
//! a message naming the media id.
//!
//! # Invariants
//!
//! - Nothing in a delivery is decrypted before its signature is checked;
//!   nothing is handed over unless it decrypts for the configured corp.
//! - A message is acknowledged (`success`) only after the gateway's inbox
//!   took it; otherwise 503, and WeCom retries.
//! - The secret, token, AES key and access token are never logged and
//!   never part of an error message.

mod api;
mod config;
mod media;
mod server;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Capabilities, Download, DownloadError, LengthUnit,
    Liveness, MediaKind, MessageLimits, OutboundFile, OutboundMessage, SendError, SentMessage,
};
use talaria_core::config::{secret_or_env, text_or_env};
use talaria_core::{Env, Secret};

use super::crypto::Key;
use super::seen::Seen;
use crate::ingress::{InboxSlot, Mount};
use crate::registry::{BuildError, Built, Platform, Setup};
use api::{Api, ApiError, code};
use server::Inbound;

pub use config::{DEFAULT_PATH, ENV, MessageFormat, WecomCallbackConfig};
pub use server::MAX_BODY_BYTES;

/// The platform name in session keys, allowlists
/// (`WECOM_CALLBACK_ALLOWED_USERS`) and targets.
pub const PLATFORM: &str = "wecom_callback";

/// The most a text or markdown message may carry, in UTF-8 **bytes**.
pub const MAX_CONTENT_BYTES: usize = 2048;

/// How many ids the repeat filter remembers, and for how long.
const SEEN_CAPACITY: usize = 1000;
const SEEN_TTL: Duration = Duration::from_secs(300);

/// Retries after a "too frequent" refusal before the ledger is told.
const RATE_LIMIT_RETRIES: u32 = 2;

/// What the adapter needs, resolved from `platforms.wecom_callback` and
/// the environment.
#[derive(Debug, Clone)]
pub struct WecomCallbackSettings {
    /// The corp id (`ww…`).
    pub corp_id: String,
    /// The app's secret. Never logged.
    pub corp_secret: Secret,
    /// The app's AgentId.
    pub agent_id: String,
    /// The callback Token. Never logged.
    pub token: Secret,
    /// The EncodingAESKey. Never logged.
    pub encoding_aes_key: Secret,
    /// The callback's path on the listener.
    pub path: String,
    /// The API root.
    pub api_base: String,
    /// Text or markdown.
    pub message_format: MessageFormat,
    /// The wait after a 45009.
    pub rate_limit_wait: Duration,
    /// The largest accepted distance of a delivery's timestamp from now.
    pub max_clock_skew: Duration,
    /// How long one API call may take.
    pub send_timeout: Duration,
}

/// Why the app cannot be configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WecomCallbackError {
    /// It is on, but settings are missing; each named as its environment
    /// variable and config key.
    #[error(
        "WeCom (self-built app) is missing {}; set them in the environment or .env (or under \
         platforms.wecom_callback in config.yaml), or turn it off with \
         platforms.wecom_callback.enabled: false",
        .0.join(", ")
    )]
    Missing(Vec<&'static str>),
    /// A setting is there but unusable; the message names it.
    #[error("WeCom (self-built app): {0}")]
    Invalid(String),
}

impl WecomCallbackSettings {
    /// The settings, or `None` when the app is off: `enabled: false`, or
    /// no `enabled` and not both a corp id and a corp secret.
    ///
    /// # Errors
    /// [`WecomCallbackError::Missing`] naming every missing piece when on.
    pub fn from_config(
        config: &WecomCallbackConfig,
        env: &Env,
    ) -> Result<Option<WecomCallbackSettings>, WecomCallbackError> {
        if config.enabled == Some(false) {
            return Ok(None);
        }
        let corp_id = text_or_env(config.corp_id.as_deref(), env, "WECOM_CALLBACK_CORP_ID");
        let secret = secret_or_env(
            config.corp_secret.as_ref(),
            env,
            "WECOM_CALLBACK_CORP_SECRET",
        );
        let agent_id = text_or_env(config.agent_id.as_deref(), env, "WECOM_CALLBACK_AGENT_ID");
        let token = secret_or_env(config.token.as_ref(), env, "WECOM_CALLBACK_TOKEN");
        let aes_key = secret_or_env(
            config.encoding_aes_key.as_ref(),
            env,
            "WECOM_CALLBACK_ENCODING_AES_KEY",
        );
        if config.enabled.is_none() && (corp_id.is_none() || secret.is_none()) {
            return Ok(None);
        }
        let missing: Vec<&'static str> = [
            (
                corp_id.is_none(),
                "WECOM_CALLBACK_CORP_ID (platforms.wecom_callback.corp_id)",
            ),
            (
                secret.is_none(),
                "WECOM_CALLBACK_CORP_SECRET (platforms.wecom_callback.corp_secret)",
            ),
            (
                agent_id.is_none(),
                "WECOM_CALLBACK_AGENT_ID (platforms.wecom_callback.agent_id)",
            ),
            (
                token.is_none(),
                "WECOM_CALLBACK_TOKEN (platforms.wecom_callback.token)",
            ),
            (
                aes_key.is_none(),
                "WECOM_CALLBACK_ENCODING_AES_KEY (platforms.wecom_callback.encoding_aes_key)",
            ),
        ]
        .into_iter()
        .filter_map(|(missing, name)| missing.then_some(name))
        .collect();
        match (corp_id, secret, agent_id, token, aes_key) {
            (Some(corp_id), Some(corp_secret), Some(agent_id), Some(token), Some(aes_key)) => {
                Ok(Some(WecomCallbackSettings {
                    corp_id,
                    corp_secret,
                    agent_id,
                    token,
                    encoding_aes_key: aes_key,
                    path: config.path.trim().to_owned(),
                    api_base: config.api_base.trim().to_owned(),
                    message_format: config.message_format,
                    rate_limit_wait: Duration::from_secs(config.rate_limit_wait_secs),
                    max_clock_skew: Duration::from_secs(config.max_clock_skew_secs),
                    send_timeout: Duration::from_secs(30),
                }))
            }
            _ => Err(WecomCallbackError::Missing(missing)),
        }
    }
}

/// The self-built app's connector (see the module docs).
pub struct WecomCallbackAdapter {
    api: Api,
    agent_id: i64,
    path: String,
    message_format: MessageFormat,
    rate_limit_wait: Duration,
    inbound: Arc<Inbound>,
}

impl std::fmt::Debug for WecomCallbackAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WecomCallbackAdapter")
            .field("api", &self.api)
            .field("agent_id", &self.agent_id)
            .finish_non_exhaustive()
    }
}

impl WecomCallbackAdapter {
    /// Checks the settings and builds the HTTP client; contacts nobody.
    ///
    /// # Errors
    /// A setting that cannot work, named with the reason (never its value
    /// when it is a credential).
    pub fn new(
        settings: WecomCallbackSettings,
    ) -> Result<WecomCallbackAdapter, WecomCallbackError> {
        let corp_id = settings.corp_id.trim().to_owned();
        if corp_id.is_empty() || !corp_id.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(WecomCallbackError::Invalid(
                "the corp id (WECOM_CALLBACK_CORP_ID) must be letters and digits, like ww0123456789abcdef"
                    .to_owned(),
            ));
        }
        let agent_id: i64 = settings.agent_id.trim().parse().map_err(|_| {
            WecomCallbackError::Invalid(format!(
                "the agent id (WECOM_CALLBACK_AGENT_ID) must be the app's numeric AgentId; got {:?}",
                settings.agent_id
            ))
        })?;
        let key =
            Key::from_encoding_aes_key(settings.encoding_aes_key.expose()).ok_or_else(|| {
                WecomCallbackError::Invalid(
                "the EncodingAESKey (WECOM_CALLBACK_ENCODING_AES_KEY) must be the 43 characters \
                 the console generated"
                    .to_owned(),
            )
            })?;
        let token = Secret::new(settings.token.expose().trim());
        if token.expose().is_empty() {
            return Err(WecomCallbackError::Invalid(
                "the callback token (WECOM_CALLBACK_TOKEN) is empty".to_owned(),
            ));
        }
        let api_base = settings.api_base.trim().trim_end_matches('/').to_owned();
        if !reqwest::Url::parse(&api_base)
            .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
        {
            return Err(WecomCallbackError::Invalid(format!(
                "platforms.wecom_callback.api_base must be an http(s) URL; got {api_base:?}"
            )));
        }
        let secret = Secret::new(settings.corp_secret.expose().trim());
        let api = Api::new(&api_base, &corp_id, &secret, settings.send_timeout)
            .map_err(WecomCallbackError::Invalid)?;
        Ok(WecomCallbackAdapter {
            api,
            agent_id,
            path: settings.path,
            message_format: settings.message_format,
            rate_limit_wait: settings.rate_limit_wait,
            inbound: Arc::new(Inbound {
                corp_id,
                agent_id: agent_id.to_string(),
                token,
                key,
                max_skew: settings.max_clock_skew,
                seen: Seen::new(SEEN_CAPACITY, SEEN_TTL),
                slot: InboxSlot::new(),
            }),
        })
    }

    /// `GET`/`POST <path>`, to mount on the shared listener.
    pub fn mount(&self) -> Mount {
        Mount {
            platform: PLATFORM,
            slot: self.inbound.slot.clone(),
            routes: server::router(&self.path, self.inbound.clone()),
        }
    }

    fn body(&self, to_user: &str, content: &str) -> serde_json::Value {
        match self.message_format {
            MessageFormat::Text => json!({
                "touser": to_user,
                "msgtype": "text",
                "agentid": self.agent_id,
                "text": {"content": content},
                "safe": 0,
            }),
            MessageFormat::Markdown => json!({
                "touser": to_user,
                "msgtype": "markdown",
                "agentid": self.agent_id,
                "markdown": {"content": content},
            }),
        }
    }

    /// One message, waiting out "too frequent" a bounded number of times.
    async fn send_one(&self, to_user: &str, content: &str) -> Result<SentMessage, SendError> {
        self.send_body(&self.body(to_user, content)).await
    }

    /// The user a chat id names: `<corp_id>:<user_id>`, or a bare user id
    /// (`talaria send`).
    fn user_of<'a>(&self, chat_id: &'a str) -> Result<&'a str, SendError> {
        let chat = chat_id.trim();
        let user = match chat.split_once(':') {
            Some((corp, user)) if corp == self.inbound.corp_id => user,
            Some(_) => {
                return Err(SendError::Rejected(format!(
                    "`{chat}` is a chat of another WeCom corp"
                )));
            }
            None => chat,
        };
        if user.is_empty() || user.contains(['|', ' ']) {
            return Err(SendError::Rejected(format!(
                "`{chat}` does not name one WeCom user"
            )));
        }
        Ok(user)
    }

    /// Uploads `file` as the kind it fits and sends it (see `media`).
    async fn post_file(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        let user = self.user_of(&file.chat_id)?;
        let size = tokio::fs::metadata(&file.path)
            .await
            .map_err(|e| SendError::Rejected(format!("cannot read {}: {e}", file.name)))?
            .len();
        let kind = media::choose(file, size).map_err(SendError::Rejected)?;
        let media_id = self
            .api
            .upload(kind.as_str(), &file.path, &file.name, &file.mime)
            .await
            .map_err(|e| match e {
                // WeCom refused the file itself (its type, its size).
                ApiError::Code { errcode, .. } if (40004..=40009).contains(&errcode) => {
                    SendError::Rejected(format!(
                        "WeCom refused {} as {}: {e}",
                        file.name,
                        kind.as_str()
                    ))
                }
                e => classify(e, self.rate_limit_wait),
            })?;
        let msgtype = kind.as_str();
        let mut body = json!({
            "touser": user,
            "msgtype": msgtype,
            "agentid": self.agent_id,
            "safe": 0,
        });
        body[msgtype] = json!({ "media_id": media_id });
        if kind == media::Kind::Video {
            body[msgtype]["title"] = json!(file.name);
        }
        let sent = self.send_body(&body).await?;
        if let Some(caption) = file.caption.as_deref().filter(|c| !c.trim().is_empty()) {
            for piece in split_bytes(caption, MAX_CONTENT_BYTES) {
                self.send_one(user, piece).await?;
            }
        }
        Ok(sent)
    }

    /// Sends `body`, waiting out "too frequent" a bounded number of times.
    async fn send_body(&self, body: &serde_json::Value) -> Result<SentMessage, SendError> {
        let mut retries = 0;
        loop {
            match self.api.send(body).await {
                Ok(sent) => {
                    if let Some(invalid) = sent.invalid_user {
                        return Err(SendError::Rejected(format!(
                            "WeCom could not deliver to {invalid}: not a member in the app's \
                             visible range"
                        )));
                    }
                    return Ok(SentMessage {
                        message_id: sent.msgid,
                    });
                }
                Err(e) if is_rate_limit(&e) && retries < RATE_LIMIT_RETRIES => {
                    retries += 1;
                    tracing::info!(wait = ?self.rate_limit_wait, "WeCom says sends are too frequent; waiting");
                    tokio::time::sleep(self.rate_limit_wait).await;
                }
                Err(e) => return Err(classify(e, self.rate_limit_wait)),
            }
        }
    }
}

fn is_rate_limit(e: &ApiError) -> bool {
    matches!(
        e.errcode(),
        Some(code::TOO_FREQUENT | code::TOO_MANY_MESSAGES)
    )
}

/// Maps a failed call to what the gateway's ledger understands.
fn classify(e: ApiError, rate_limit_wait: Duration) -> SendError {
    if is_rate_limit(&e) {
        return SendError::RateLimited(rate_limit_wait.max(Duration::from_secs(1)));
    }
    let text = e.to_string();
    match &e {
        ApiError::Code { errcode, .. } => match *errcode {
            code::IP_NOT_TRUSTED => SendError::Unavailable(format!(
                "WeCom refuses sends from this server's IP address: add its public IP to the \
                 app's trusted IPs in the WeCom admin console ({text})"
            )),
            code::INVALID_CORP_ID | code::INVALID_CREDENTIAL | code::INVALID_TOKEN => {
                SendError::Unavailable(format!(
                    "{text}; check WECOM_CALLBACK_CORP_ID and WECOM_CALLBACK_CORP_SECRET"
                ))
            }
            code::INVALID_AGENT_ID => {
                SendError::Unavailable(format!("{text}; check WECOM_CALLBACK_AGENT_ID"))
            }
            code::BUSY => SendError::Transient(text),
            _ => SendError::Rejected(text),
        },
        ApiError::Status(status) if *status >= 500 => SendError::Transient(text),
        ApiError::Status(_) => SendError::Rejected(text),
        ApiError::Connect(_) => SendError::Unavailable(text),
        ApiError::Timeout(_) | ApiError::Other(_) => SendError::Ambiguous(text),
    }
}

/// Cuts `text` into pieces of at most `max` UTF-8 bytes, at a line break
/// or a space in the last quarter of a piece where there is one, and
/// never inside a character.
pub fn split_bytes(text: &str, max: usize) -> Vec<&str> {
    let max = max.max(4);
    let mut pieces = Vec::new();
    let mut rest = text;
    while rest.len() > max {
        let mut cut = max;
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let window = &rest[..cut];
        let floor = cut - cut / 4;
        if let Some(at) = window.rfind('\n').or_else(|| window.rfind(' '))
            && at >= floor
            && at > 0
        {
            cut = at + 1;
        }
        pieces.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    if !rest.is_empty() || pieces.is_empty() {
        pieces.push(rest);
    }
    pieces
}

/// Kinds users send that are handed over (WeCom documents image, voice and
/// video messages for apps; a `file` message is taken too).
const RECEIVES: &[MediaKind] = &[
    MediaKind::Image,
    MediaKind::Voice,
    MediaKind::Video,
    MediaKind::Document,
];

/// Kinds sent as files (each as its own message type where it fits, else
/// as a file).
const SENDS: &[MediaKind] = &[
    MediaKind::Image,
    MediaKind::Voice,
    MediaKind::Audio,
    MediaKind::Video,
    MediaKind::Document,
];

/// What the app can do; also the registry's declaration.
pub const CAPABILITIES: Capabilities = Capabilities {
    receives: RECEIVES,
    sends: SENDS,
    ..Capabilities::chat(MessageLimits {
        // WeCom counts 2048 *bytes*; the gateway splits by characters, so
        // a part of non-ASCII text over 2048 bytes is cut again by bytes
        // in `send` (several messages for one part).
        max_len: MAX_CONTENT_BYTES,
        unit: LengthUnit::Chars,
    })
};

impl WecomCallbackAdapter {
    /// Fetches an access token: whom the credentials name (the app of the
    /// corp), [`AdapterError::Fatal`] when WeCom refuses them and
    /// [`AdapterError::Disconnected`] when it cannot be asked.
    async fn check_credentials(&self) -> Result<String, AdapterError> {
        match self.api.token(false).await {
            Ok(_) => Ok(format!(
                "the app {} of the corp {}",
                self.agent_id,
                self.api.corp_id()
            )),
            Err(e)
                if matches!(
                    e.errcode(),
                    Some(code::INVALID_CORP_ID | code::INVALID_CREDENTIAL)
                ) =>
            {
                Err(AdapterError::Fatal(format!(
                    "WeCom refused the app's credentials; check WECOM_CALLBACK_CORP_ID and \
                     WECOM_CALLBACK_CORP_SECRET ({e})"
                )))
            }
            Err(e) => Err(AdapterError::Disconnected(e.to_string())),
        }
    }
}

#[async_trait]
impl Adapter for WecomCallbackAdapter {
    fn platform(&self) -> &'static str {
        PLATFORM
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    /// Checks the corp id and secret by fetching an access token (refused
    /// credentials stop here with a clear error), then takes deliveries
    /// until the gateway stops.
    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        ctx.liveness.set(Liveness::Connecting);
        let checked = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = self.check_credentials() => r,
        };
        match checked {
            Ok(_) => tracing::info!("WeCom issued an access token for the app"),
            Err(fatal @ AdapterError::Fatal(_)) => return Err(fatal),
            Err(e) => tracing::warn!("cannot fetch a WeCom access token yet: {e}"),
        }
        self.inbound.slot.attach(&ctx).await
    }

    /// `GET /cgi-bin/gettoken` with the corp id and the app's secret:
    /// WeCom refuses credentials it does not know with errcode 40013
    /// (corp id) or 40001 (secret), which is [`AdapterError::Fatal`].
    async fn whoami(&self) -> Option<Result<String, AdapterError>> {
        Some(self.check_credentials().await)
    }

    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        let user = self.user_of(&message.chat_id)?;
        if message.text.trim().is_empty() {
            return Ok(SentMessage::default());
        }
        let mut last = SentMessage::default();
        for piece in split_bytes(&message.text, MAX_CONTENT_BYTES) {
            last = self.send_one(user, piece).await?;
        }
        Ok(last)
    }

    async fn download(&self, locator: &str) -> Result<Download, DownloadError> {
        if !server::is_media_id(locator) {
            let shown: String = locator.chars().take(80).collect();
            return Err(DownloadError::Gone(format!(
                "{shown:?} is not a WeCom media id"
            )));
        }
        self.api.media(locator).await
    }

    async fn send_file(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        self.post_file(file).await
    }
}

/// The registry's entry for the self-built app.
pub const ENTRY: Platform = Platform {
    name: PLATFORM,
    title: "WeCom (self-built app)",
    standalone: true,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<WecomCallbackConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let Some(settings) = WecomCallbackSettings::from_config(&setup.section()?, setup.env)
        .map_err(BuildError::misconfigured)?
    else {
        return Ok(None);
    };
    let adapter = WecomCallbackAdapter::new(settings).map_err(BuildError::set_up)?;
    let mount = adapter.mount();
    Ok(Some(Built {
        adapter: Arc::new(adapter),
        mount: Some(mount),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const AES_KEY: &str = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG";

    fn env() -> Env {
        Env::from_pairs([
            ("WECOM_CALLBACK_CORP_ID", "ww0123"),
            ("WECOM_CALLBACK_CORP_SECRET", "corp-secret-value"),
            ("WECOM_CALLBACK_AGENT_ID", "1000002"),
            ("WECOM_CALLBACK_TOKEN", "cb-token-value"),
            ("WECOM_CALLBACK_ENCODING_AES_KEY", AES_KEY),
        ])
    }

    #[test]
    fn off_unless_credentials_and_missing_pieces_are_named() {
        let cfg = WecomCallbackConfig::default();
        let none = Env::from_pairs(Vec::<(String, String)>::new());
        assert!(
            WecomCallbackSettings::from_config(&cfg, &none)
                .unwrap()
                .is_none()
        );
        let s = WecomCallbackSettings::from_config(&cfg, &env())
            .unwrap()
            .unwrap();
        assert_eq!(s.corp_id, "ww0123");
        assert_eq!(s.path, DEFAULT_PATH);
        let partial = Env::from_pairs([
            ("WECOM_CALLBACK_CORP_ID", "ww0123"),
            ("WECOM_CALLBACK_CORP_SECRET", "s"),
        ]);
        let e = WecomCallbackSettings::from_config(&cfg, &partial).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("WECOM_CALLBACK_TOKEN"), "{text}");
        assert!(text.contains("WECOM_CALLBACK_ENCODING_AES_KEY"), "{text}");
        assert!(!text.contains("CORP_SECRET"), "{text}");
        let off = WecomCallbackConfig {
            enabled: Some(false),
            ..cfg
        };
        assert!(
            WecomCallbackSettings::from_config(&off, &env())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn new_checks_settings_without_showing_credentials() {
        let good = WecomCallbackSettings::from_config(&WecomCallbackConfig::default(), &env())
            .unwrap()
            .unwrap();
        let adapter = WecomCallbackAdapter::new(good.clone()).unwrap();
        let shown = format!("{adapter:?}");
        assert!(!shown.contains("corp-secret-value") && !shown.contains("cb-token-value"));
        let bad_key = WecomCallbackSettings {
            encoding_aes_key: Secret::new("tooshort"),
            ..good.clone()
        };
        let e = WecomCallbackAdapter::new(bad_key).unwrap_err().to_string();
        assert!(
            e.contains("ENCODING_AES_KEY") && !e.contains("tooshort"),
            "{e}"
        );
        let bad_agent = WecomCallbackSettings {
            agent_id: "app".into(),
            ..good
        };
        assert!(WecomCallbackAdapter::new(bad_agent).is_err());
    }

    #[test]
    fn text_is_cut_by_utf8_bytes_on_character_boundaries() {
        let text = "你好世界".repeat(300); // 3600 bytes
        let pieces = split_bytes(&text, MAX_CONTENT_BYTES);
        assert_eq!(pieces.len(), 2);
        assert!(pieces.iter().all(|p| p.len() <= MAX_CONTENT_BYTES));
        assert_eq!(pieces.concat(), text);
        let words = "word ".repeat(500);
        let pieces = split_bytes(&words, 100);
        assert!(pieces.iter().all(|p| p.len() <= 100 && p.ends_with(' ')));
        assert_eq!(pieces.concat(), words);
        assert_eq!(split_bytes("short", 2048), vec!["short"]);
        let emoji = "😀".repeat(600);
        assert!(
            split_bytes(&emoji, MAX_CONTENT_BYTES)
                .iter()
                .all(|p| p.len() <= 2048)
        );
    }

    #[test]
    fn errors_are_classified() {
        let code = |errcode| ApiError::Code {
            errcode,
            errmsg: "m".into(),
        };
        let wait = Duration::from_secs(3);
        assert_eq!(classify(code(45009), wait), SendError::RateLimited(wait));
        let e = classify(code(60020), wait);
        assert!(
            matches!(&e, SendError::Unavailable(m) if m.contains("trusted IP")),
            "{e:?}"
        );
        assert!(matches!(
            classify(code(40056), wait),
            SendError::Unavailable(_)
        ));
        assert!(matches!(classify(code(-1), wait), SendError::Transient(_)));
        assert!(matches!(
            classify(code(81013), wait),
            SendError::Rejected(_)
        ));
        assert!(matches!(
            classify(ApiError::Status(502), wait),
            SendError::Transient(_)
        ));
        assert!(matches!(
            classify(ApiError::Connect("x".into()), wait),
            SendError::Unavailable(_)
        ));
        assert!(matches!(
            classify(ApiError::Timeout("x".into()), wait),
            SendError::Ambiguous(_)
        ));
    }
}
