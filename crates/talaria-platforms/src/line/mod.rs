//! The LINE adapter: a LINE Official Account through the Messaging API,
//! its webhook in (`POST /line/webhook` on the shared listener,
//! [`crate::ingress`]) and its REST API out.
//!
//! One-to-one chats are keyed by the user id (`U…`), groups and
//! multi-person rooms by theirs (`C…`, `R…`); `LINE_ALLOWED_USERS` lists
//! user ids, and `LINE_GROUP_ALLOWED_CHATS` vouches for whole groups.
//!
//! # Layout
//!
//! - this file: [`LineSettings`] (from `platforms.line` and the
//!   environment), [`LineAdapter`] and its [`Adapter`] impl: reply token
//!   first, push after, rate-limit waits, the loading animation.
//! - `server`: the webhook handler, in processing order.
//! - `mapping`: LINE's events and what they become.
//! - `tokens`: the reply and quote tokens of recent messages.
//! - `api`: the REST calls and what their errors mean to the ledger.
//!
//! # Invariants
//!
//! - A delivery's signature is checked on the raw body before anything in
//!   it is parsed, logged or handed on; a bad or missing one gets 401.
//! - A delivery is answered 200 only after every message in it was handed
//!   to the inbox. The message id is LINE's, stable across redeliveries,
//!   so a redelivered message starts no second turn.
//! - A push always carries an `X-Line-Retry-Key` derived from what it
//!   sends and where, so the ledger's re-send of a message that did go
//!   out is refused by LINE (409) and counted as sent, never shown twice.
//!   A reply token is used at most once per message, and a reply that
//!   timed out is checked with the same token before anything is pushed
//!   (see `tokens`).
//! - The channel access token and secret are never logged nor part of an
//!   error message; `Debug` masks them.

mod api;
mod config;
mod mapping;
mod server;
mod tokens;

use crate::registry::{BuildError, Built, Platform, Setup};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use hmac::Mac;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Capabilities, Download, DownloadError, LengthUnit,
    Liveness, MediaKind, MessageLimits, OutboundMessage, SendError, SentMessage,
};
use talaria_core::config::secret_or_env;
use talaria_core::{Env, Secret};

use crate::ingress::{InboxSlot, Mount};
use api::{Api, ApiError, Pushed};
use tokens::{Outcome, ReplyTokens, Take};

pub use config::{ENV, LineConfig};
pub use server::WEBHOOK_PATH;

/// The platform name in session keys, config and allowlists
/// (`LINE_ALLOWED_USERS`).
pub const PLATFORM: &str = "line";

/// The longest text message LINE accepts.
pub const MAX_TEXT_LEN: usize = 5000;

/// LINE shows at most this many quick-reply buttons.
const MAX_QUICK_REPLIES: usize = 13;

/// A quick-reply button's label is cut to this many characters.
const MAX_LABEL_CHARS: usize = 20;

/// How long the loading animation runs; shown again after
/// [`LOADING_REFRESH`] while the turn goes on.
const LOADING_SECS: u64 = 20;
const LOADING_REFRESH: Duration = Duration::from_secs(15);

/// Chats whose loading animation time is remembered; when full, the
/// memory starts over.
const MAX_LOADING_CHATS: usize = 10_000;

/// How long fetching one file may take, body included.
const MEDIA_TIMEOUT: Duration = Duration::from_secs(300);

/// Waits longer than this are not worth holding a send for.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(60);

/// What the adapter needs, resolved from `platforms.line` and the
/// environment.
#[derive(Debug, Clone)]
pub struct LineSettings {
    /// The channel access token.
    pub channel_access_token: Secret,
    /// The channel secret that signs deliveries.
    pub channel_secret: Secret,
    /// Group and room messages need the bot's mention.
    pub require_mention: bool,
    /// The Messaging API root.
    pub api_base: String,
    /// The content host's root.
    pub data_base: String,
    /// Reply tokens older than this are not used.
    pub reply_token_age: Duration,
    /// Larger deliveries get 413.
    pub max_body_bytes: usize,
    /// How long one API call may take.
    pub send_timeout: Duration,
    /// Retries after a rate limit before a send reports
    /// [`SendError::RateLimited`].
    pub rate_limit_retries: u32,
    /// The first wait after a rate limit that names none; doubled each
    /// time.
    pub rate_limit_wait: Duration,
}

/// Why the adapter cannot be configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// LINE is on, but credentials are missing; each is named as its
    /// environment variable and its config key.
    #[error(
        "LINE is missing {}; set them in the environment or .env (or under platforms.line in \
         config.yaml), or turn LINE off with platforms.line.enabled: false",
        .0.join(", ")
    )]
    Missing(Vec<&'static str>),
    /// A setting is there but unusable; the message names it.
    #[error("LINE: {0}")]
    Invalid(String),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

impl LineSettings {
    /// Settings with the defaults for everything but the credentials.
    pub fn new(
        channel_access_token: impl Into<Secret>,
        channel_secret: impl Into<Secret>,
    ) -> LineSettings {
        let defaults = LineConfig::default();
        LineSettings {
            channel_access_token: channel_access_token.into(),
            channel_secret: channel_secret.into(),
            require_mention: defaults.require_mention,
            api_base: defaults.api_base,
            data_base: defaults.data_base,
            reply_token_age: Duration::from_secs(defaults.reply_token_secs),
            max_body_bytes: defaults.max_body_bytes,
            send_timeout: Duration::from_secs(30),
            rate_limit_retries: 2,
            rate_limit_wait: Duration::from_secs(1),
        }
    }

    /// The settings, or `None` when LINE is off: `enabled: false`, or no
    /// `enabled` and neither credential set. `LINE_REQUIRE_MENTION`
    /// (true/false) overrides `require_mention`.
    ///
    /// # Errors
    /// [`LineError::Missing`] naming every missing credential when LINE
    /// is on.
    pub fn from_config(config: &LineConfig, env: &Env) -> Result<Option<LineSettings>, LineError> {
        if config.enabled == Some(false) {
            return Ok(None);
        }
        let token = secret_or_env(
            config.channel_access_token.as_ref(),
            env,
            "LINE_CHANNEL_ACCESS_TOKEN",
        );
        let secret = secret_or_env(config.channel_secret.as_ref(), env, "LINE_CHANNEL_SECRET");
        if config.enabled.is_none() && token.is_none() && secret.is_none() {
            return Ok(None);
        }
        match (token, secret) {
            (Some(token), Some(secret)) => Ok(Some(LineSettings {
                require_mention: env
                    .flag("LINE_REQUIRE_MENTION")
                    .unwrap_or(config.require_mention),
                api_base: config.api_base.clone(),
                data_base: config.data_base.clone(),
                reply_token_age: Duration::from_secs(config.reply_token_secs),
                max_body_bytes: config.max_body_bytes,
                ..LineSettings::new(token, secret)
            })),
            (token, secret) => Err(LineError::Missing(
                [
                    (
                        token.is_none(),
                        "LINE_CHANNEL_ACCESS_TOKEN (platforms.line.channel_access_token)",
                    ),
                    (
                        secret.is_none(),
                        "LINE_CHANNEL_SECRET (platforms.line.channel_secret)",
                    ),
                ]
                .into_iter()
                .filter_map(|(missing, name)| missing.then_some(name))
                .collect(),
            )),
        }
    }
}

/// The LINE connector (see the module docs).
pub struct LineAdapter {
    api: Api,
    hook: Arc<server::Hook>,
    tokens: Arc<ReplyTokens>,
    reply_token_age: Duration,
    send_timeout: Duration,
    rate_limit_retries: u32,
    rate_limit_wait: Duration,
    /// When each one-to-one chat last had its loading animation started.
    loading: Mutex<HashMap<String, Instant>>,
}

// By hand only because the webhook side holds no `Debug`; the
// credentials are `Secret`s inside the client either way.
impl fmt::Debug for LineAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LineAdapter")
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

fn http_root(url: &str, key: &str) -> Result<String, LineError> {
    let url = url.trim().trim_end_matches('/');
    match reqwest::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Ok(url.to_owned()),
        _ => Err(LineError::Invalid(format!(
            "platforms.line.{key} must be an http(s) URL; got {url:?}"
        ))),
    }
}

impl LineAdapter {
    /// Checks the settings and builds the HTTP client; serves nothing
    /// until [`LineAdapter::mount`] is mounted on the shared listener.
    ///
    /// # Errors
    /// A malformed credential or an unusable URL, named.
    pub fn new(settings: LineSettings) -> Result<LineAdapter, LineError> {
        let token = settings.channel_access_token.expose().trim();
        if token.is_empty() || !token.chars().all(|c| c.is_ascii_graphic()) {
            return Err(LineError::Invalid(
                "the channel access token (LINE_CHANNEL_ACCESS_TOKEN) is empty or malformed"
                    .to_owned(),
            ));
        }
        let secret = settings.channel_secret.expose().trim();
        if secret.is_empty() {
            return Err(LineError::Invalid(
                "the channel secret (LINE_CHANNEL_SECRET) is empty".to_owned(),
            ));
        }
        if settings.max_body_bytes == 0 {
            return Err(LineError::Invalid(
                "platforms.line.max_body_bytes must be at least 1".to_owned(),
            ));
        }
        let api_base = http_root(&settings.api_base, "api_base")?;
        let data_base = http_root(&settings.data_base, "data_base")?;
        let api =
            Api::new(&api_base, &data_base, &Secret::new(token)).map_err(LineError::Client)?;
        let mac = <server::HmacSha256 as Mac>::new_from_slice(secret.as_bytes())
            .map_err(|e| LineError::Client(format!("the channel secret cannot key HMAC: {e}")))?;
        let tokens = Arc::new(ReplyTokens::default());
        Ok(LineAdapter {
            api,
            hook: Arc::new(server::Hook {
                mac,
                max_body_bytes: settings.max_body_bytes,
                require_mention: settings.require_mention,
                slot: InboxSlot::new(),
                tokens: tokens.clone(),
            }),
            tokens,
            reply_token_age: settings.reply_token_age,
            send_timeout: settings.send_timeout,
            rate_limit_retries: settings.rate_limit_retries,
            rate_limit_wait: settings.rate_limit_wait,
            loading: Mutex::new(HashMap::new()),
        })
    }

    /// Asks `GET /v2/bot/info` whose the channel access token is: the
    /// bot's name and basic id, or [`AdapterError::Fatal`] when LINE
    /// refuses the token (401) and [`AdapterError::Disconnected`] when it
    /// cannot be asked.
    async fn whoami_line(&self) -> Result<String, AdapterError> {
        match self.api.bot_info(self.send_timeout).await {
            Ok(info) => Ok(match (info.display_name.as_str(), info.basic_id.as_str()) {
                ("", "") => format!("bot {}", info.user_id),
                ("", id) | (id, "") => format!("{id} (bot {})", info.user_id),
                (name, id) => format!("{name} {id} (bot {})", info.user_id),
            }),
            Err(e) if matches!(e.status(), Some(401 | 403)) => Err(AdapterError::Fatal(format!(
                "LINE refused the channel access token (LINE_CHANNEL_ACCESS_TOKEN): {e}"
            ))),
            Err(e) => Err(AdapterError::Disconnected(e.to_string())),
        }
    }

    /// `POST /line/webhook`, to mount on the shared listener.
    pub fn mount(&self) -> Mount {
        Mount {
            platform: PLATFORM,
            slot: self.hook.slot.clone(),
            routes: server::router(self.hook.clone()),
        }
    }

    /// The wait before retry `retries` after `e`, or `None` when it was
    /// not a rate limit worth waiting for.
    fn rate_limit_wait(&self, e: &ApiError, retries: u32) -> Option<Duration> {
        if e.status() != Some(429) || api::is_quota(e) || retries >= self.rate_limit_retries {
            return None;
        }
        let wait = e
            .retry_after()
            .unwrap_or(self.rate_limit_wait.saturating_mul(1 << retries.min(8)));
        (wait <= MAX_RETRY_WAIT).then_some(wait)
    }

    /// Replies with `token` (answering message `id`), waiting out rate
    /// limits. `Ok(None)` when LINE says the token is spent: the caller
    /// pushes, or, when `confirming`, counts the message as sent.
    async fn reply(
        &self,
        id: &str,
        token: &str,
        messages: &[Value],
        digest: u64,
    ) -> Result<Option<SentMessage>, SendError> {
        let mut retries = 0;
        loop {
            match self.api.reply(token, messages, self.send_timeout).await {
                Ok(message_id) => {
                    self.tokens.settle(id, Outcome::Used);
                    return Ok(Some(SentMessage { message_id }));
                }
                Err(e) if api::is_spent_token(&e) => {
                    self.tokens.settle(id, Outcome::Used);
                    return Ok(None);
                }
                Err(e) => {
                    if let Some(wait) = self.rate_limit_wait(&e, retries) {
                        retries += 1;
                        tracing::info!(?wait, error = %e, "LINE rate limit; waiting");
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                    let classified = api::classify(&e, self.rate_limit_wait);
                    // Only a refusal LINE decided before acting leaves the
                    // token untouched; a lost answer or a server error may
                    // have used it.
                    let outcome = match &classified {
                        SendError::Unavailable(_)
                        | SendError::RateLimited(_)
                        | SendError::Rejected(_) => Outcome::Unused,
                        SendError::Transient(_) | SendError::Ambiguous(_) => {
                            Outcome::Unknown(digest)
                        }
                    };
                    self.tokens.settle(id, outcome);
                    return Err(classified);
                }
            }
        }
    }

    /// Pushes under `retry_key`, waiting out rate limits.
    async fn push(
        &self,
        to: &str,
        messages: &[Value],
        retry_key: &str,
    ) -> Result<SentMessage, SendError> {
        let mut retries = 0;
        loop {
            match self
                .api
                .push(to, messages, retry_key, self.send_timeout)
                .await
            {
                Ok(Pushed::Sent(message_id)) => return Ok(SentMessage { message_id }),
                Ok(Pushed::AlreadySent) => {
                    tracing::debug!(
                        "LINE had accepted this push before (409 for its retry key): not sent twice"
                    );
                    return Ok(SentMessage::default());
                }
                Err(e) => {
                    if let Some(wait) = self.rate_limit_wait(&e, retries) {
                        retries += 1;
                        tracing::info!(?wait, error = %e, "LINE rate limit; waiting");
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                    if api::is_quota(&e) {
                        tracing::error!(
                            "LINE's monthly message quota is used up: answers past a reply \
                             token's first minute wait until it renews or the plan is raised"
                        );
                    }
                    return Err(api::classify(&e, self.rate_limit_wait));
                }
            }
        }
    }
}

/// What identifies one message the bot sends: the same message to the
/// same place always gives the same digest (and so the same retry key).
/// A message that answers nothing carries the day too, so tomorrow's
/// identical reminder is not taken for a repeat of today's.
fn digest(message: &OutboundMessage) -> [u8; 32] {
    let mut d = Sha256::new();
    for part in [
        message.chat_id.as_str(),
        message.reply_to.as_deref().unwrap_or(""),
        message.text.as_str(),
    ] {
        d.update(part.as_bytes());
        d.update([0]);
    }
    for choice in &message.choices {
        d.update(choice.label.as_bytes());
        d.update([0]);
        d.update(choice.command.as_bytes());
        d.update([0]);
    }
    if message.reply_to.is_none() {
        let day = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() / 86_400);
        d.update(day.to_be_bytes());
    }
    d.finalize().into()
}

/// A version-4-shaped UUID from the digest, as LINE wants a retry key.
fn retry_key(digest: &[u8; 32]) -> String {
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The text message object for `message`, with the quote and the
/// quick-reply buttons.
fn text_message(message: &OutboundMessage, quote_token: Option<String>) -> Value {
    let mut text = crate::plain::to_plain(&message.text);
    if text.trim().is_empty() || text.encode_utf16().count() > MAX_TEXT_LEN {
        // The gateway split the original to fit; keep that if the
        // conversion ever made it longer (or emptied it).
        text = message.text.clone();
    }
    let mut object = json!({ "type": "text", "text": text });
    if let Some(quote) = quote_token {
        object["quoteToken"] = json!(quote);
    }
    if !message.choices.is_empty() {
        // A tap sends the command as the user's own message, which is
        // what a choice promises.
        let items: Vec<Value> = message
            .choices
            .iter()
            .take(MAX_QUICK_REPLIES)
            .map(|c| {
                let label: String = c.label.chars().take(MAX_LABEL_CHARS).collect();
                json!({
                    "type": "action",
                    "action": { "type": "message", "label": label, "text": c.command },
                })
            })
            .collect();
        object["quickReply"] = json!({ "items": items });
    }
    object
}

/// What the platform can do; also the registry's declaration.
pub const CAPABILITIES: Capabilities = Capabilities {
    receives: &[
        MediaKind::Image,
        MediaKind::Video,
        MediaKind::Voice,
        MediaKind::Document,
    ],
    // LINE takes images, audio and video only as public HTTPS URLs it
    // fetches itself; Talaria serves files at none, so files go as a
    // text line.
    sends: &[],
    group_chat_allowlist: true,
    ..Capabilities::chat(MessageLimits {
        max_len: MAX_TEXT_LEN,
        unit: LengthUnit::Utf16,
    })
};

#[async_trait]
impl Adapter for LineAdapter {
    fn platform(&self) -> &'static str {
        PLATFORM
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    /// Checks the channel access token (a refused one stops here with a
    /// clear error), then takes deliveries until the gateway stops. LINE
    /// being unreachable is only warned about: deliveries may still
    /// arrive, and sends report their own failures.
    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        ctx.liveness.set(Liveness::Connecting);
        let checked = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = self.whoami_line() => r,
        };
        match checked {
            Ok(who) => tracing::info!(bot = %who, "LINE accepted the channel access token"),
            Err(fatal @ AdapterError::Fatal(_)) => return Err(fatal),
            Err(e) => tracing::warn!("cannot check the LINE channel access token: {e}"),
        }
        self.hook.slot.attach(&ctx).await
    }

    async fn whoami(&self) -> Option<Result<String, AdapterError>> {
        Some(self.whoami_line().await)
    }

    /// The first answer to a message replies with its token while the
    /// token is young; everything else is pushed (see the module docs).
    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        let chat = message.chat_id.trim();
        if !mapping::is_line_id(chat, &['U', 'C', 'R']) {
            return Err(SendError::Rejected(format!(
                "`{chat}` is not a LINE user, group or room id"
            )));
        }
        if message.text.trim().is_empty() && message.choices.is_empty() {
            return Ok(SentMessage::default());
        }
        let answered = message.reply_to.as_deref();
        let quote = answered.and_then(|id| self.tokens.quote_token(id, chat));
        let messages = [text_message(message, quote)];
        let digest = digest(message);
        let short = u64::from_be_bytes(digest[..8].try_into().unwrap_or_default());
        if let Some(id) = answered {
            match self.tokens.take(id, chat, short, self.reply_token_age) {
                Take::Use(token) => {
                    if let Some(sent) = self.reply(id, &token, &messages, short).await? {
                        return Ok(sent);
                    }
                    tracing::debug!("the LINE reply token had expired; pushing the answer");
                }
                Take::Confirm(token) => match self.reply(id, &token, &messages, short).await? {
                    Some(sent) => return Ok(sent),
                    None => {
                        tracing::info!(
                            "a LINE reply that timed out had gone out (its token is used): \
                                 not sent again"
                        );
                        return Ok(SentMessage::default());
                    }
                },
                Take::Push => {}
            }
        }
        self.push(chat, &messages, &retry_key(&digest)).await
    }

    /// `locator` is the message id: the content is fetched from the data
    /// host with the channel access token.
    async fn download(&self, locator: &str) -> Result<Download, DownloadError> {
        if locator.is_empty() || locator.len() > 32 || !locator.chars().all(|c| c.is_ascii_digit())
        {
            return Err(DownloadError::Gone(format!(
                "{locator:?} is not a LINE message id"
            )));
        }
        self.api.content(locator, MEDIA_TIMEOUT).await
    }

    /// Starts the loading animation, which LINE shows in one-to-one chats
    /// only; again at most every few seconds while the turn goes on.
    async fn typing(&self, chat_id: &str, _thread_id: Option<&str>) -> Result<(), SendError> {
        if !mapping::is_line_id(chat_id, &['U']) {
            return Ok(());
        }
        {
            let mut map = self.loading.lock().unwrap_or_else(|p| p.into_inner());
            if map
                .get(chat_id)
                .is_some_and(|at| at.elapsed() < LOADING_REFRESH)
            {
                return Ok(());
            }
            if map.len() >= MAX_LOADING_CHATS {
                map.clear();
            }
            map.insert(chat_id.to_owned(), Instant::now());
        }
        self.api
            .loading(chat_id, LOADING_SECS, self.send_timeout)
            .await
            .map_err(|e| api::classify(&e, self.rate_limit_wait))
    }
}

/// The registry's entry for LINE.
pub const ENTRY: Platform = Platform {
    name: PLATFORM,
    title: "LINE",
    standalone: true,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<LineConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let Some(settings) = LineSettings::from_config(&setup.section()?, setup.env)
        .map_err(BuildError::misconfigured)?
    else {
        return Ok(None);
    };
    let adapter = LineAdapter::new(settings).map_err(BuildError::set_up)?;
    let mount = adapter.mount();
    Ok(Some(Built {
        adapter: Arc::new(adapter),
        mount: Some(mount),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use talaria_adapter::Choice;

    fn no_env() -> Env {
        Env::from_pairs(Vec::<(String, String)>::new())
    }

    #[test]
    fn off_unless_a_credential_is_set_then_both_are_needed() {
        let cfg = LineConfig::default();
        assert!(
            LineSettings::from_config(&cfg, &no_env())
                .unwrap()
                .is_none()
        );
        let env = Env::from_pairs([("LINE_CHANNEL_SECRET", "s")]);
        let e = LineSettings::from_config(&cfg, &env).unwrap_err();
        assert_eq!(
            e,
            LineError::Missing(vec![
                "LINE_CHANNEL_ACCESS_TOKEN (platforms.line.channel_access_token)"
            ])
        );
        let env = Env::from_pairs([
            ("LINE_CHANNEL_SECRET", "s"),
            ("LINE_CHANNEL_ACCESS_TOKEN", "t"),
            ("LINE_REQUIRE_MENTION", "false"),
        ]);
        let s = LineSettings::from_config(&cfg, &env).unwrap().unwrap();
        assert!(!s.require_mention);
        assert_eq!(s.api_base, "https://api.line.me");
        assert_eq!(s.reply_token_age, Duration::from_secs(50));
        let off = LineConfig {
            enabled: Some(false),
            ..LineConfig::default()
        };
        assert!(LineSettings::from_config(&off, &env).unwrap().is_none());
    }

    #[test]
    fn new_checks_the_settings_and_hides_the_credentials() {
        let good = || LineSettings::new("TOKENTOKENTOKEN", "SECRETSECRET");
        let a = LineAdapter::new(good()).unwrap();
        let shown = format!("{a:?}{:?}", good());
        assert!(
            !shown.contains("TOKENTOKEN") && !shown.contains("SECRETSECRET"),
            "{shown}"
        );
        for bad in [
            LineSettings::new("a b", "s"),
            LineSettings::new("t", " "),
            LineSettings {
                api_base: "ftp://x".into(),
                ..good()
            },
            LineSettings {
                max_body_bytes: 0,
                ..good()
            },
        ] {
            let e = LineAdapter::new(bad).unwrap_err();
            assert!(matches!(e, LineError::Invalid(_)), "{e:?}");
        }
    }

    #[test]
    fn retry_keys_are_uuids_stable_per_message() {
        let m = |text: &str, reply_to: Option<&str>| OutboundMessage {
            chat_id: "Uabc".into(),
            thread_id: None,
            reply_to: reply_to.map(str::to_owned),
            text: text.into(),
            choices: Vec::new(),
        };
        let a = retry_key(&digest(&m("hello", Some("1"))));
        assert_eq!(a, retry_key(&digest(&m("hello", Some("1")))));
        assert_ne!(a, retry_key(&digest(&m("hello", Some("2")))));
        assert_ne!(a, retry_key(&digest(&m("hello!", Some("1")))));
        let parts: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12]);
        assert_eq!(&a[14..15], "4");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
    }

    #[test]
    fn choices_become_quick_replies_that_send_the_command() {
        let mut m = OutboundMessage {
            chat_id: "Uabc".into(),
            thread_id: None,
            reply_to: None,
            text: "Run **rm**?".into(),
            choices: vec![
                Choice::new("Approve once, for this command only", "/approve"),
                Choice::new("Deny", "/deny"),
            ],
        };
        let o = text_message(&m, Some("q".into()));
        assert_eq!(o["text"], "Run rm?");
        assert_eq!(o["quoteToken"], "q");
        let items = o["quickReply"]["items"].as_array().unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0]["action"]["type"], "message");
        assert_eq!(items[0]["action"]["text"], "/approve");
        assert_eq!(
            items[0]["action"]["label"]
                .as_str()
                .unwrap()
                .chars()
                .count(),
            20
        );
        m.choices.clear();
        assert!(text_message(&m, None).get("quickReply").is_none());
    }
}
