//! The Signal adapter, through a signal-cli REST API server
//! (`bbernhard/signal-cli-rest-api`).
//!
//! Talaria does not speak the Signal protocol itself: the REST API server
//! holds the registered (or linked) account and its keys, and this adapter
//! talks plain HTTP to it.
//!
//! [`SignalAdapter::run`] first asks `GET /v1/about` (which also says the
//! server's mode) and `GET /v1/accounts` (an account the server does not
//! hold is a fatal misconfiguration: nothing is received and nothing
//! runs). It then receives in one of two styles:
//!
//! - **WebSocket** (the server's `json-rpc` mode, the recommended one):
//!   `GET /v1/receive/{account}` upgrades to a socket on which every
//!   message arrives as one text frame. WebSocket pings go out every
//!   `ping_interval`; a socket that answers nothing for two intervals is
//!   given up and the supervisor reconnects with backoff.
//! - **Polling** (the `normal` and `native` modes): the same path as a
//!   plain request returns what arrived since the last call, as a JSON
//!   array; an empty answer waits `poll_interval` before the next call.
//!
//! The server's own mode decides when it reports one; the configured
//! `receive_mode` is the choice for servers that do not. The adapter is
//! [`Liveness::Live`] once the server answered at the application level:
//! the account check passed and the socket was accepted, or the first
//! poll returned.
//!
//! Sending is `POST /v2/send`; an answer in a group quotes the message it
//! answers. Markdown is turned into plain text ([`format`]). Files come
//! from `GET /v1/attachments/{id}` (streamed) and go out in the same
//! `/v2/send` call, base64 inside the JSON body: the API has no other way,
//! so a file is read into memory whole, bounded by [`MAX_FILE_BYTES`].

mod api;
mod config;
mod mapping;

use crate::registry::{BuildError, Built, Platform, Setup};
use crate::ws::{Beat, Watched};
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Download, DownloadError, Liveness, MediaKind,
    MessageLimits, OutboundFile, OutboundMessage, SendError, SentMessage,
};
use talaria_adapter::{Capabilities, LengthUnit};
use talaria_core::Env;
use talaria_core::config::text_or_env;
use tokio_tungstenite::tungstenite::Message;

use api::{About, Api, ApiError, SendResponse, path_segment};
use mapping::{Context, GROUP_PREFIX, Incoming, Me};

pub use config::{ENV, SignalConfig, SignalReceiveMode};

/// The longest message sent in one piece, in characters: the limit the
/// system this one descends from used for Signal (the protocol itself
/// moves longer texts as an attachment, which not every client shows
/// inline).
pub const MAX_MESSAGE_CHARS: usize = 8000;

/// The largest file sent: Signal's own limit for an attachment (100 MiB).
/// signal-cli-rest-api takes files only base64 inside the JSON of
/// `/v2/send`, so the file is read whole into memory (its base64, a third
/// larger, and the JSON body made of that briefly bring the peak to about
/// three times the file): the size is checked on disk first, and the read
/// is capped at it in case the file grew.
pub const MAX_FILE_BYTES: u64 = 100 * 1024 * 1024;

/// How long fetching or sending one file may take, body included.
const MEDIA_TIMEOUT: Duration = Duration::from_secs(300);

/// Longer waits than this are not worth blocking a send for.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(60);

/// The wait after a rate limit that names none.
const DEFAULT_RETRY_WAIT: Duration = Duration::from_secs(1);

/// What the adapter needs to connect.
#[derive(Debug, Clone)]
pub struct SignalSettings {
    /// The REST API root, e.g. `http://127.0.0.1:8080`.
    pub http_url: String,
    /// The bot's number as the server holds it (`+4915112345678`).
    pub account: String,
    /// The account's UUID, when known: mentions of the bot may name only
    /// that.
    pub account_uuid: Option<String>,
    /// The receive style for servers that do not report their mode.
    pub receive_mode: SignalReceiveMode,
    /// Between two receive calls that found nothing (polling).
    pub poll_interval: Duration,
    /// In groups, submit only messages that mention or quote the bot.
    pub require_mention: bool,
    /// The allowlist entries (numbers or UUIDs): a sender is reported
    /// under the form listed, so either form admits them.
    pub allowed_users: Vec<String>,
    /// Between WebSocket pings; two silent intervals end the socket.
    pub ping_interval: Duration,
    /// How long opening the WebSocket may take.
    pub connect_timeout: Duration,
    /// How long a send (or another request) may take. signal-cli can be
    /// slow to send to a big group, so this is generous.
    pub send_timeout: Duration,
    /// Retries after a rate limit before a send reports
    /// [`SendError::RateLimited`].
    pub rate_limit_retries: u32,
}

impl SignalSettings {
    /// Settings with the defaults for everything but the server and
    /// account.
    pub fn new(http_url: impl Into<String>, account: impl Into<String>) -> SignalSettings {
        SignalSettings {
            http_url: http_url.into(),
            account: account.into(),
            account_uuid: None,
            receive_mode: SignalReceiveMode::Websocket,
            poll_interval: Duration::from_secs(2),
            require_mention: true,
            allowed_users: Vec::new(),
            ping_interval: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(30),
            send_timeout: Duration::from_secs(60),
            rate_limit_retries: 3,
        }
    }

    /// Settings from `platforms.signal` and the environment, or `None`
    /// when Signal is off: `enabled: false`, or no server
    /// (`platforms.signal.http_url`, `SIGNAL_HTTP_URL`) or no account
    /// (`platforms.signal.account`, `SIGNAL_ACCOUNT`). The allowlist
    /// entries come from `SIGNAL_ALLOWED_USERS` and
    /// `GATEWAY_ALLOWED_USERS`; `SIGNAL_REQUIRE_MENTION` (true/false)
    /// overrides `require_mention`.
    pub fn from_config(config: &SignalConfig, env: &Env) -> Option<SignalSettings> {
        if config.enabled == Some(false) {
            return None;
        }
        let url = text_or_env(config.http_url.as_deref(), env, "SIGNAL_HTTP_URL");
        let account = text_or_env(config.account.as_deref(), env, "SIGNAL_ACCOUNT");
        let (Some(url), Some(account)) = (url, account) else {
            if config.enabled == Some(true) {
                tracing::warn!(
                    "platforms.signal.enabled is true but the server or the account is missing \
                     (platforms.signal.http_url or SIGNAL_HTTP_URL, \
                     platforms.signal.account or SIGNAL_ACCOUNT)"
                );
            }
            return None;
        };
        let require_mention = env
            .flag("SIGNAL_REQUIRE_MENTION")
            .unwrap_or(config.require_mention);
        let allowed_users = ["SIGNAL_ALLOWED_USERS", "GATEWAY_ALLOWED_USERS"]
            .iter()
            .filter_map(|k| env.get(k))
            .flat_map(|v| {
                v.split(',')
                    .map(|e| e.trim().to_owned())
                    .collect::<Vec<_>>()
            })
            .filter(|e| !e.is_empty() && e != "*")
            .collect();
        Some(SignalSettings {
            receive_mode: config.receive_mode,
            poll_interval: Duration::from_secs(config.poll_interval_secs.max(1)),
            require_mention,
            allowed_users,
            ..SignalSettings::new(url, account)
        })
    }
}

/// Why the adapter could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignalError {
    /// The account is not a number in international format.
    #[error(
        "the Signal account {0:?} is not a number in international format \
         (set SIGNAL_ACCOUNT or platforms.signal.account, e.g. +4915112345678)"
    )]
    BadAccount(String),
    /// The server URL is missing or not an http(s) URL.
    #[error(
        "the Signal REST API URL is missing or not an http(s) URL ({0:?}); \
         set SIGNAL_HTTP_URL or platforms.signal.http_url, e.g. http://127.0.0.1:8080"
    )]
    BadUrl(String),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// The Signal connector (see the module docs).
pub struct SignalAdapter {
    api: Api,
    files: api::Files,
    url: String,
    /// `ws(s)://.../v1/receive/{account}`.
    socket_url: String,
    me: Me,
    receive_mode: SignalReceiveMode,
    poll_interval: Duration,
    require_mention: bool,
    allowed_users: Vec<String>,
    ping_interval: Duration,
    connect_timeout: Duration,
    send_timeout: Duration,
    rate_limit_retries: u32,
}

impl fmt::Debug for SignalAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignalAdapter")
            .field("url", &self.url)
            .field("receive_mode", &self.receive_mode)
            .field("require_mention", &self.require_mention)
            .finish_non_exhaustive()
    }
}

impl SignalAdapter {
    /// Checks the settings and builds the HTTP client; does not connect.
    pub fn new(settings: SignalSettings) -> Result<SignalAdapter, SignalError> {
        let account = settings.account.trim().to_owned();
        let digits = account.strip_prefix('+').unwrap_or("");
        if !(7..=15).contains(&digits.len()) || !digits.chars().all(|c| c.is_ascii_digit()) {
            return Err(SignalError::BadAccount(account));
        }
        let url = settings.http_url.trim().trim_end_matches('/').to_owned();
        let receive = format!("/v1/receive/{}", path_segment(&account));
        let socket_url = match reqwest::Url::parse(&url) {
            Ok(u) if u.scheme() == "http" && u.host().is_some() => {
                format!("ws{}{receive}", &url["http".len()..])
            }
            Ok(u) if u.scheme() == "https" && u.host().is_some() => {
                format!("wss{}{receive}", &url["https".len()..])
            }
            _ => return Err(SignalError::BadUrl(url)),
        };
        let api = api::client(&url).map_err(SignalError::Client)?;
        let files = api::Files::new(&url).map_err(SignalError::Client)?;
        Ok(SignalAdapter {
            api,
            files,
            url,
            socket_url,
            me: Me {
                account,
                uuid: settings.account_uuid.filter(|u| !u.trim().is_empty()),
            },
            receive_mode: settings.receive_mode,
            poll_interval: settings.poll_interval.max(Duration::from_millis(10)),
            require_mention: settings.require_mention,
            allowed_users: settings.allowed_users,
            ping_interval: settings.ping_interval.max(Duration::from_millis(10)),
            connect_timeout: settings.connect_timeout,
            send_timeout: settings.send_timeout,
            rate_limit_retries: settings.rate_limit_retries,
        })
    }

    /// The account this adapter serves.
    pub fn account(&self) -> &str {
        &self.me.account
    }

    /// `GET /v1/about` and `GET /v1/accounts`: the server is there and
    /// holds the account. Returns the receive style to use.
    async fn handshake(&self) -> Result<SignalReceiveMode, AdapterError> {
        let about = self.check().await?;
        let mode = match about.mode.as_deref() {
            Some("json-rpc") => SignalReceiveMode::Websocket,
            Some("normal" | "native") => SignalReceiveMode::Poll,
            _ => self.receive_mode,
        };
        if mode != self.receive_mode {
            tracing::info!(
                server_mode = about.mode.as_deref().unwrap_or(""),
                "the Signal REST API's mode decides the receive style: {mode:?}"
            );
        }
        tracing::debug!(version = ?about.version, ?mode, "Signal REST API answered");
        Ok(mode)
    }

    /// `GET /v1/about`, then `GET /v1/accounts`: [`AdapterError::Fatal`]
    /// when the server is not a signal-cli REST API or does not hold the
    /// account; what the server says of itself otherwise.
    async fn check(&self) -> Result<About, AdapterError> {
        let about: About =
            self.api
                .get("/v1/about", self.send_timeout)
                .await
                .map_err(|e| match e.status() {
                    Some(404) => AdapterError::Fatal(format!(
                        "{e}: {} does not look like a signal-cli REST API server \
                     (no /v1/about); check SIGNAL_HTTP_URL",
                        self.url
                    )),
                    _ => AdapterError::Disconnected(e.to_string()),
                })?;
        match self
            .api
            .get::<Vec<String>>("/v1/accounts", self.send_timeout)
            .await
        {
            Ok(accounts) if !accounts.iter().any(|a| a == &self.me.account) => {
                return Err(AdapterError::Fatal(format!(
                    "the Signal REST API at {} does not hold the account {} \
                     (it holds {}); register or link it there, or fix SIGNAL_ACCOUNT",
                    self.url,
                    self.me.account,
                    accounts.len()
                )));
            }
            Ok(_) => {}
            // Servers older than the accounts list: the first receive
            // will tell.
            Err(e) if e.status() == Some(404) => {}
            Err(e) => return Err(AdapterError::Disconnected(e.to_string())),
        }
        Ok(about)
    }

    /// Maps and submits one received item. `false`: stop (shutdown or the
    /// runner is gone).
    async fn on_item(&self, item: &Value, ctx: &AdapterContext) -> bool {
        let incoming: Incoming = match serde_json::from_value(item.clone()) {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!("skipping a malformed Signal envelope: {e}");
                return true;
            }
        };
        if let Some(error) = &incoming.error {
            tracing::warn!("the Signal REST API reported a receive error: {error}");
            return true;
        }
        let cx = Context {
            me: &self.me,
            require_mention: self.require_mention,
            allowed: &self.allowed_users,
        };
        match mapping::map_incoming(&incoming, &cx) {
            Err(why) => {
                tracing::debug!("skipping a Signal envelope: {why}");
                true
            }
            Ok(event) => tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => false,
                r = ctx.inbox.submit(event) => r.is_ok(),
            },
        }
    }

    async fn run_socket(&self, ctx: &AdapterContext) -> Result<(), AdapterError> {
        let stream = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = crate::ws::connect(&self.socket_url, &[], self.connect_timeout) => {
                r.map_err(AdapterError::Disconnected)?
            }
        };
        tracing::info!("receiving Signal messages over the WebSocket");
        ctx.liveness.set(Liveness::Live);
        let mut socket = Watched::new(
            stream,
            "the Signal WebSocket",
            "the Signal REST API",
            self.ping_interval,
        );
        loop {
            match socket.next(ctx).await? {
                None => return Ok(()),
                Some(Beat::PingDue) => socket.send(Message::Ping(Default::default())).await?,
                Some(Beat::Text(text)) => {
                    let item = match serde_json::from_str::<Value>(text.as_str()) {
                        Ok(v) => v,
                        Err(e) => {
                            tracing::warn!("skipping a malformed Signal frame: {e}");
                            continue;
                        }
                    };
                    if !self.on_item(&item, ctx).await {
                        return Ok(());
                    }
                }
            }
        }
    }

    async fn run_poll(&self, ctx: &AdapterContext) -> Result<(), AdapterError> {
        // signal-cli waits up to `timeout` seconds for messages; the
        // request itself gets that plus room for a slow JVM start.
        let path = format!("/v1/receive/{}?timeout=1", path_segment(&self.me.account));
        let request_timeout = self.send_timeout.max(Duration::from_secs(5));
        loop {
            let items = tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => return Ok(()),
                r = self.api.get::<Vec<Value>>(&path, request_timeout) => r,
            };
            let items = match items {
                Ok(items) => items,
                Err(e) if api::error_text(&e).contains("not registered") => {
                    return Err(AdapterError::Fatal(format!(
                        "{e}; register or link {} on the Signal REST API",
                        self.me.account
                    )));
                }
                Err(e) => {
                    if ctx.liveness.get() == Liveness::Live {
                        ctx.liveness.set(Liveness::Degraded);
                    }
                    return Err(AdapterError::Disconnected(e.to_string()));
                }
            };
            if ctx.liveness.get() != Liveness::Live {
                tracing::info!("receiving Signal messages by polling");
                ctx.liveness.set(Liveness::Live);
            }
            let empty = items.is_empty();
            for item in &items {
                if !self.on_item(item, ctx).await {
                    return Ok(());
                }
            }
            if empty {
                tokio::select! {
                    biased;
                    _ = ctx.shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(self.poll_interval) => {}
                }
            }
        }
    }

    /// `POST /v2/send`, waiting out rate limits a bounded number of times.
    /// Sends `body` to `chat_id`, quoting `reply_to` in a group: there
    /// several conversations interleave, so the answer points at the
    /// message it answers (a DM needs no such pointer).
    async fn send_body(
        &self,
        mut body: Value,
        chat_id: &str,
        reply_to: Option<&str>,
        timeout: Duration,
    ) -> Result<SentMessage, SendError> {
        if chat_id.starts_with(GROUP_PREFIX)
            && let Some((timestamp, author)) = reply_to.and_then(mapping::parse_message_id)
        {
            body["quote_timestamp"] = json!(timestamp);
            body["quote_author"] = json!(author);
        }
        let sent = self.post_send(&body, timeout).await?;
        let timestamp = match &sent.timestamp {
            Value::String(s) => s.trim().parse::<i64>().ok(),
            Value::Number(n) => n.as_i64(),
            _ => None,
        };
        Ok(SentMessage {
            message_id: timestamp.map(|t| mapping::message_id(t, &self.me.account)),
        })
    }

    async fn post_send(&self, body: &Value, timeout: Duration) -> Result<SendResponse, SendError> {
        let mut retries = 0;
        loop {
            match self
                .api
                .post::<SendResponse>("/v2/send", body, timeout)
                .await
            {
                Ok(r) => return Ok(r),
                Err(e) => {
                    let Some(wait) = rate_limit_wait(&e) else {
                        return Err(classify(e));
                    };
                    if retries >= self.rate_limit_retries || wait > MAX_RETRY_WAIT {
                        return Err(SendError::RateLimited(wait));
                    }
                    retries += 1;
                    tracing::info!(?wait, "Signal rate limit; waiting");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

/// The wait a rate-limited call asks for: a 429 with its `Retry-After`,
/// or the 400 signal-cli gives when the Signal servers limited it.
fn rate_limit_wait(e: &ApiError) -> Option<Duration> {
    let limited = match e.status() {
        Some(429) => true,
        Some(400) => {
            let text = api::error_text(e);
            text.contains("ratelimit") || text.contains("rate limit")
        }
        _ => false,
    };
    if !limited {
        return None;
    }
    Some(match e.retry_after() {
        Some(wait) if !wait.is_zero() => wait,
        _ => DEFAULT_RETRY_WAIT,
    })
}

/// Maps a failed call to what the gateway's ledger understands.
fn classify(e: ApiError) -> SendError {
    // Unknown or unregistered recipients, a group the account left, an
    // account the server does not hold: the default's "rejected".
    match rate_limit_wait(&e) {
        Some(wait) => SendError::RateLimited(wait),
        None => e.classify(),
    }
}

/// What the platform can do; also the registry's declaration.
pub const CAPABILITIES: Capabilities = Capabilities {
    // Signal carries any file; the app plays audio and shows pictures
    // and video inline, whatever the kind.
    receives: ALL_KINDS,
    sends: ALL_KINDS,
    ..Capabilities::chat(MessageLimits {
        max_len: MAX_MESSAGE_CHARS,
        unit: LengthUnit::Chars,
    })
};

const ALL_KINDS: &[MediaKind] = &[
    MediaKind::Image,
    MediaKind::Voice,
    MediaKind::Audio,
    MediaKind::Video,
    MediaKind::Document,
];

#[async_trait]
impl Adapter for SignalAdapter {
    fn platform(&self) -> &'static str {
        "signal"
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn credential(&self) -> Option<(&'static str, String)> {
        // Two readers of one account would each take messages from the
        // other's stream.
        Some(("signal-phone", self.me.account.clone()))
    }

    /// The account, once the server answered that it holds it (see
    /// `check`). The REST API has no credential of its own: the account
    /// being registered or linked there is what lets the bot work.
    async fn whoami(&self) -> Option<Result<String, AdapterError>> {
        Some(self.check().await.map(|about| {
            let version = about.version.map(|v| format!(" {v}")).unwrap_or_default();
            format!(
                "{} on the signal-cli REST API{version} at {}",
                self.me.account, self.url
            )
        }))
    }

    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        ctx.liveness.set(Liveness::Connecting);
        let mode = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = self.handshake() => r?,
        };
        match mode {
            SignalReceiveMode::Websocket => self.run_socket(&ctx).await,
            SignalReceiveMode::Poll => self.run_poll(&ctx).await,
        }
    }

    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        let mut text = crate::plain::to_plain(&message.text);
        if text.trim().is_empty() {
            text = message.text.clone();
        }
        let body = json!({
            "message": text,
            "number": self.me.account,
            "recipients": [message.chat_id],
        });
        self.send_body(
            body,
            &message.chat_id,
            message.reply_to.as_deref(),
            self.send_timeout,
        )
        .await
    }

    /// `locator` is the attachment id signal-cli gave the file; the URL
    /// is built on the configured server, never taken from a payload.
    async fn download(&self, locator: &str) -> Result<Download, DownloadError> {
        if !api::is_attachment_id(locator) {
            return Err(DownloadError::Gone(format!(
                "{locator:?} is not a Signal attachment id"
            )));
        }
        self.files.download(locator, MEDIA_TIMEOUT).await
    }

    /// One `/v2/send` with the file base64 in `base64_attachments` and the
    /// caption as the message. The API takes files no other way, so the
    /// file is read whole, bounded by [`MAX_FILE_BYTES`]; a larger one is
    /// announced by a text line instead.
    async fn send_file(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        let unreadable =
            |e: std::io::Error| SendError::Rejected(format!("cannot read {}: {e}", file.name));
        let size = tokio::fs::metadata(&file.path)
            .await
            .map_err(unreadable)?
            .len();
        if size > MAX_FILE_BYTES {
            let text = file.fallback_text("signal");
            return self
                .send(&OutboundMessage {
                    chat_id: file.chat_id.clone(),
                    thread_id: file.thread_id.clone(),
                    reply_to: file.reply_to.clone(),
                    text,
                    choices: Vec::new(),
                })
                .await;
        }
        let bytes = {
            use tokio::io::AsyncReadExt;
            let handle = tokio::fs::File::open(&file.path)
                .await
                .map_err(unreadable)?;
            let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
            handle
                .take(MAX_FILE_BYTES + 1)
                .read_to_end(&mut bytes)
                .await
                .map_err(unreadable)?;
            bytes
        };
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(SendError::Rejected(format!(
                "{} grew past Signal's {} MiB limit while it was read",
                file.name,
                MAX_FILE_BYTES >> 20
            )));
        }
        let caption = file
            .caption
            .as_deref()
            .map(crate::plain::to_plain)
            .unwrap_or_default();
        let attachment = api::data_uri(&file.mime, &file.name, &bytes);
        drop(bytes);
        let body = json!({
            "message": caption,
            "number": self.me.account,
            "recipients": [file.chat_id],
            "base64_attachments": [attachment],
        });
        // The body carries the file: it may take longer than a text.
        let timeout = self.send_timeout.max(MEDIA_TIMEOUT);
        self.send_body(body, &file.chat_id, file.reply_to.as_deref(), timeout)
            .await
    }

    async fn typing(&self, chat_id: &str, _thread_id: Option<&str>) -> Result<(), SendError> {
        let path = format!("/v1/typing-indicator/{}", path_segment(&self.me.account));
        self.api
            .put::<Value>(&path, &json!({ "recipient": chat_id }), self.send_timeout)
            .await
            .map(|_| ())
            .map_err(classify)
    }
}

/// The registry's entry for Signal.
pub const ENTRY: Platform = Platform {
    name: "signal",
    title: "Signal",
    standalone: true,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<SignalConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let Some(settings) = SignalSettings::from_config(&setup.section()?, setup.env) else {
        return Ok(None);
    };
    let adapter = SignalAdapter::new(settings).map_err(BuildError::set_up)?;
    Ok(Some(Built::connected(adapter)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{Failure, HttpError};

    #[test]
    fn from_config_reads_server_account_and_lists() {
        let empty = Env::from_pairs(Vec::<(String, String)>::new());
        let env = Env::from_pairs([
            ("SIGNAL_HTTP_URL", "http://127.0.0.1:8080"),
            ("SIGNAL_ACCOUNT", "+4915112345678"),
            (
                "SIGNAL_ALLOWED_USERS",
                " +4915100000001 , aaaaaaaa-1111-2222-3333-444444444444,*",
            ),
            ("GATEWAY_ALLOWED_USERS", "+4915100000002"),
        ]);
        let mut cfg = SignalConfig::default();
        assert!(SignalSettings::from_config(&cfg, &empty).is_none());
        let s = SignalSettings::from_config(&cfg, &env).unwrap();
        assert_eq!(s.http_url, "http://127.0.0.1:8080");
        assert_eq!(s.account, "+4915112345678");
        assert_eq!(s.receive_mode, SignalReceiveMode::Websocket);
        assert_eq!(s.poll_interval, Duration::from_secs(2));
        assert!(s.require_mention);
        assert_eq!(
            s.allowed_users,
            vec![
                "+4915100000001",
                "aaaaaaaa-1111-2222-3333-444444444444",
                "+4915100000002"
            ]
        );
        cfg.http_url = Some("http://signal:8080".into());
        cfg.account = Some("+4915199999999".into());
        cfg.receive_mode = SignalReceiveMode::Poll;
        cfg.require_mention = false;
        let s = SignalSettings::from_config(&cfg, &empty).unwrap();
        assert_eq!(
            (s.http_url.as_str(), s.account.as_str()),
            ("http://signal:8080", "+4915199999999")
        );
        assert_eq!(s.receive_mode, SignalReceiveMode::Poll);
        assert!(!s.require_mention);
        cfg.enabled = Some(false);
        assert!(SignalSettings::from_config(&cfg, &env).is_none());
    }

    #[test]
    fn new_validates_and_builds_the_socket_url() {
        let a =
            SignalAdapter::new(SignalSettings::new("http://h:8080/", "+4915112345678")).unwrap();
        assert_eq!(a.socket_url, "ws://h:8080/v1/receive/+4915112345678");
        let a = SignalAdapter::new(SignalSettings::new("https://h/api", "+4915112345678")).unwrap();
        assert_eq!(a.socket_url, "wss://h/api/v1/receive/+4915112345678");
        assert!(matches!(
            SignalAdapter::new(SignalSettings::new("", "+4915112345678")),
            Err(SignalError::BadUrl(_))
        ));
        for bad in ["4915112345678", "+49 151", "+12", "alice"] {
            assert!(
                matches!(
                    SignalAdapter::new(SignalSettings::new("http://h", bad)),
                    Err(SignalError::BadAccount(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn errors_are_classified() {
        let failed = |failure| HttpError::new(api::SIGNAL, failure);
        let status = |status, message: &str| {
            failed(Failure::Status {
                status,
                code: None,
                message: message.into(),
                retry_after: None,
            })
        };
        assert!(matches!(
            classify(status(400, "Failed to send message: Unregistered user")),
            SendError::Rejected(_)
        ));
        assert!(matches!(classify(status(404, "x")), SendError::Rejected(_)));
        assert!(matches!(
            classify(status(502, "x")),
            SendError::Transient(_)
        ));
        assert!(matches!(
            classify(status(429, "x")),
            SendError::RateLimited(_)
        ));
        assert!(matches!(
            classify(status(400, "[429] RateLimitException: Rate limit exceeded")),
            SendError::RateLimited(_)
        ));
        assert!(matches!(
            classify(failed(Failure::Connect("x".into()))),
            SendError::Unavailable(_)
        ));
        assert!(matches!(
            classify(failed(Failure::Timeout("x".into()))),
            SendError::Ambiguous(_)
        ));
        let hinted = failed(Failure::Status {
            status: 429,
            code: None,
            message: "slow down".into(),
            retry_after: Some(Duration::from_secs(7)),
        });
        assert_eq!(rate_limit_wait(&hinted), Some(Duration::from_secs(7)));
    }
}
