//! The Mattermost adapter: API v4 for sending, the WebSocket for events.
//!
//! [`MattermostAdapter::run`] checks the token with `GET /users/me`, opens
//! `{url}/api/v4/websocket` and hands every `posted` event to the inbox.
//! It reports [`Liveness::Live`] only once the server spoke at the
//! application level: the `hello` event of a new connection, or the reply
//! to the ping sent right after a resumed one.
//!
//! The connection id and the next expected sequence number outlive a
//! `run`, so the next `run` asks the server to resume
//! (`?connection_id=..&sequence_number=..`) and it replays what was missed
//! from its buffer. Events at a sequence number already handed over are
//! dropped (and the runner drops a post id it already took); a sequence
//! number advances only after the inbox accepted its event. When the
//! server cannot resume it starts a new connection with a new `hello`,
//! and the adapter logs that events may have been missed.
//!
//! With a store ([`MattermostAdapter::keeping_connection_in`]) the
//! connection id and sequence number are kept there too (see `stored`),
//! so a restarted process, or another node taking the connector over,
//! resumes the same connection instead of starting a new one.
//!
//! Application-level pings go out every `ping_interval`; a socket that
//! says nothing for two intervals is given up, and the supervisor
//! reconnects.
//!
//! Files come and go through the files API (see `media`).

mod api;
mod config;
mod format;
mod mapping;
mod media;
mod stored;

use crate::kept::Kept;
use crate::registry::{BuildError, Built, Platform, Setup, token_switch};
use crate::ws::{Beat, Watched};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Download, DownloadError, Liveness, MediaKind,
    MessageLimits, OutboundFile, OutboundMessage, SendError, SentMessage,
};
use talaria_adapter::{Capabilities, LengthUnit, Markup};
use talaria_core::config::text_or_env;
use talaria_core::{Env, Secret};
use tokio_tungstenite::tungstenite::Message;

use api::{Api, ApiError, Post, User};
use mapping::{BotThreads, Frame, Me};

pub use config::{ENV, MattermostConfig};

/// Mattermost's default largest post, in characters.
pub const MAX_POST_CHARS: usize = 16383;

/// Longer waits than this are not worth blocking a send for.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(60);

/// The wait after a 429 that names none (or zero seconds).
const DEFAULT_RETRY_WAIT: Duration = Duration::from_millis(250);

/// Where the event stream stands, kept across `run` calls so the next
/// connection can resume it.
#[derive(Debug, Clone, Default)]
struct Resume {
    connection_id: Option<String>,
    /// The next sequence number expected (last handed over + 1).
    next_seq: i64,
    /// Counts the changes, for the copy in the store.
    revision: u64,
}

/// What the adapter needs to connect.
#[derive(Debug, Clone)]
pub struct MattermostSettings {
    /// The server root, e.g. `https://chat.example.com`.
    pub url: String,
    /// A bot account's or a personal access token. Never logged.
    pub token: Secret,
    /// Outside direct messages, submit only posts that mention the bot or
    /// continue a thread it is in.
    pub require_mention: bool,
    /// Between application-level pings; two silent intervals end the
    /// connection.
    pub ping_interval: Duration,
    /// How long opening the WebSocket may take.
    pub connect_timeout: Duration,
    /// Retries after a 429 before a send reports
    /// [`SendError::RateLimited`].
    pub rate_limit_retries: u32,
    /// How long a send (or typing call) may take.
    pub send_timeout: Duration,
}

impl MattermostSettings {
    /// Settings with the defaults for everything but the server and token.
    pub fn new(url: impl Into<String>, token: impl Into<Secret>) -> MattermostSettings {
        MattermostSettings {
            url: url.into(),
            token: token.into(),
            require_mention: true,
            ping_interval: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(30),
            rate_limit_retries: 3,
            send_timeout: Duration::from_secs(30),
        }
    }

    /// Settings from `platforms.mattermost` and the environment, or `None`
    /// when Mattermost is off: `enabled: false`, or no token in
    /// `platforms.mattermost.token` nor `MATTERMOST_TOKEN`. The server is
    /// `platforms.mattermost.url` or `MATTERMOST_URL` (when neither is set
    /// the URL is empty and [`MattermostAdapter::new`] says so).
    /// `MATTERMOST_REQUIRE_MENTION` (true/false) overrides
    /// `require_mention`.
    pub fn from_config(config: &MattermostConfig, env: &Env) -> Option<MattermostSettings> {
        let token = token_switch(
            config.enabled,
            config.token.as_ref(),
            env,
            "platforms.mattermost.token",
            "MATTERMOST_TOKEN",
        )?;
        let url = text_or_env(config.url.as_deref(), env, "MATTERMOST_URL").unwrap_or_default();
        let require_mention = env
            .flag("MATTERMOST_REQUIRE_MENTION")
            .unwrap_or(config.require_mention);
        Some(MattermostSettings {
            require_mention,
            ping_interval: Duration::from_secs(config.ping_interval_secs.max(1)),
            ..MattermostSettings::new(url, token)
        })
    }
}

/// Why the adapter could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MattermostError {
    /// The token is empty or cannot be sent in a header.
    #[error("the Mattermost token is malformed (expected a bot or personal access token)")]
    BadToken,
    /// The server URL is missing or not an http(s) URL.
    #[error(
        "the Mattermost server URL is missing or not an http(s) URL ({0:?}); \
         set MATTERMOST_URL or platforms.mattermost.url, e.g. https://chat.example.com"
    )]
    BadUrl(String),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// The Mattermost connector (see the module docs).
#[derive(Debug)]
pub struct MattermostAdapter {
    api: Api,
    /// For the files API, whose bodies are not JSON.
    files: crate::http::Http,
    /// The server root, without `/api/v4`.
    base_url: String,
    token: Secret,
    /// `ws(s)://.../api/v4/websocket`.
    socket_url: String,
    require_mention: bool,
    ping_interval: Duration,
    connect_timeout: Duration,
    rate_limit_retries: u32,
    send_timeout: Duration,
    resume: Mutex<Resume>,
    me: Mutex<Option<Me>>,
    threads: Mutex<BotThreads>,
    /// Where the connection is kept between processes, when anywhere.
    kept: Option<Kept>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl MattermostAdapter {
    /// Checks the settings and builds the HTTP client; does not connect.
    pub fn new(settings: MattermostSettings) -> Result<MattermostAdapter, MattermostError> {
        let token = Secret::new(settings.token.expose().trim());
        if token.expose().is_empty() || !token.expose().chars().all(|c| c.is_ascii_graphic()) {
            return Err(MattermostError::BadToken);
        }
        let url = settings.url.trim().trim_end_matches('/').to_owned();
        let socket_url = match reqwest::Url::parse(&url) {
            Ok(u) if u.scheme() == "http" && u.host().is_some() => {
                format!("ws{}/api/v4/websocket", &url["http".len()..])
            }
            Ok(u) if u.scheme() == "https" && u.host().is_some() => {
                format!("wss{}/api/v4/websocket", &url["https".len()..])
            }
            _ => return Err(MattermostError::BadUrl(url)),
        };
        let api = api::client(&url, &token).map_err(MattermostError::Client)?;
        let files = crate::http::Http::new(api::MATTERMOST)
            .map_err(MattermostError::Client)?
            .hiding(&token, "<token>");
        Ok(MattermostAdapter {
            api,
            files,
            base_url: url.clone(),
            token,
            socket_url,
            require_mention: settings.require_mention,
            ping_interval: settings.ping_interval.max(Duration::from_millis(10)),
            connect_timeout: settings.connect_timeout,
            rate_limit_retries: settings.rate_limit_retries,
            send_timeout: settings.send_timeout,
            resume: Mutex::new(Resume::default()),
            me: Mutex::new(None),
            threads: Mutex::new(BotThreads::default()),
            kept: None,
        })
    }

    /// The bot's username, once `run` (or a typing call) asked the server.
    pub fn bot_username(&self) -> Option<String> {
        lock(&self.me).as_ref().map(|m| m.username.clone())
    }

    /// The WebSocket connection id the next `run` asks to resume, if any.
    pub fn connection_id(&self) -> Option<String> {
        lock(&self.resume).connection_id.clone()
    }

    async fn get_me(&self) -> Result<Me, AdapterError> {
        let user: User = self
            .api
            .get("/users/me", self.send_timeout)
            .await
            .map_err(|e| match e.status() {
                Some(401 | 403) => AdapterError::Fatal(format!(
                    "Mattermost rejected the token ({e}); check MATTERMOST_TOKEN"
                )),
                _ => AdapterError::Disconnected(e.to_string()),
            })?;
        let me = Me {
            id: user.id,
            username: user.username,
        };
        *lock(&self.me) = Some(me.clone());
        Ok(me)
    }

    fn connect_url(&self) -> String {
        let resume = lock(&self.resume).clone();
        match resume.connection_id {
            Some(id) => format!(
                "{}?connection_id={}&sequence_number={}",
                self.socket_url,
                url_escape(&id),
                resume.next_seq
            ),
            None => self.socket_url.clone(),
        }
    }

    /// Handles one text frame. `Ok(false)`: stop (shutdown or the runner
    /// is gone) without confirming the event.
    async fn on_frame(&self, text: &str, me: &Me, ctx: &AdapterContext) -> bool {
        let frame: Frame = match serde_json::from_str(text) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!("skipping a malformed Mattermost WebSocket frame: {e}");
                return true;
            }
        };
        if frame.seq_reply.is_some() {
            if frame.status.as_deref() == Some("OK") {
                ctx.liveness.set(Liveness::Live);
            } else {
                tracing::debug!(status = ?frame.status, "Mattermost refused an action");
            }
            return true;
        }
        let Some(event) = frame.event.as_deref() else {
            return true;
        };
        if event == "hello" {
            self.on_hello(&frame);
            ctx.liveness.set(Liveness::Live);
            return true;
        }
        if let Some(seq) = frame.seq {
            let expected = lock(&self.resume).next_seq;
            if seq < expected {
                tracing::debug!(
                    seq,
                    expected,
                    "skipping a Mattermost event already handed over"
                );
                return true;
            }
            if seq > expected {
                tracing::warn!(
                    seq,
                    expected,
                    "Mattermost skipped sequence numbers; events may have been missed"
                );
            }
        }
        if event == "posted" {
            let mapped = {
                let threads = lock(&self.threads);
                mapping::map_posted(&frame.data, me, self.require_mention, &threads)
            };
            match mapped {
                Err(why) => tracing::debug!(seq = ?frame.seq, "skipping post: {why}"),
                Ok(m) => {
                    if m.event.source.chat_type.is_shared()
                        && let Some(root) = &m.thread_root
                    {
                        lock(&self.threads).insert(root);
                    }
                    tokio::select! {
                        biased;
                        _ = ctx.shutdown.cancelled() => return false,
                        r = ctx.inbox.submit(m.event) => {
                            if r.is_err() {
                                return false;
                            }
                        }
                    }
                }
            }
        }
        if let Some(seq) = frame.seq {
            let mut resume = lock(&self.resume);
            if seq + 1 > resume.next_seq {
                resume.next_seq = seq + 1;
                resume.revision += 1;
            }
        }
        true
    }

    fn on_hello(&self, frame: &Frame) {
        let id = frame
            .data
            .get("connection_id")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let mut resume = lock(&self.resume);
        if id.is_empty() {
            // A server without the reliable WebSocket: nothing to resume.
            resume.connection_id = None;
            resume.next_seq = frame.seq.unwrap_or(0) + 1;
            resume.revision += 1;
            return;
        }
        if resume.connection_id.as_deref() == Some(id.as_str()) {
            return;
        }
        if resume.connection_id.is_some() {
            tracing::warn!(
                "Mattermost could not resume the WebSocket and started a new connection; \
                 posts made while disconnected may have been missed"
            );
        }
        tracing::info!("connected to Mattermost");
        resume.connection_id = Some(id);
        resume.next_seq = frame.seq.unwrap_or(0) + 1;
        resume.revision += 1;
    }

    /// One WebSocket connection, resumed when there is one to resume,
    /// until it ends; events are handed over as they come.
    async fn connection(&self, me: &Me, ctx: &AdapterContext) -> Result<(), AdapterError> {
        let url = self.connect_url();
        let resuming = url.contains("connection_id=");
        let auth = format!("Bearer {}", self.token.expose());
        let headers = [("Authorization", auth.as_str())];
        let stream = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = crate::ws::connect(&url, &headers, self.connect_timeout) => {
                r.map_err(AdapterError::Disconnected)?
            }
        };
        let mut socket = Watched::new(
            stream,
            "the Mattermost WebSocket",
            "Mattermost",
            self.ping_interval,
        );
        let mut action_seq: i64 = 1;
        // For servers (or proxies) that do not pass the header on.
        let challenge = json!({
            "seq": action_seq,
            "action": "authentication_challenge",
            "data": { "token": self.token.expose() },
        });
        action_seq += 1;
        socket.send(Message::text(challenge.to_string())).await?;
        // A resumed connection gets no hello: its answer to a ping is the
        // sign that the server is really there.
        let mut ping_now = resuming;
        loop {
            if ping_now {
                let action = json!({ "seq": action_seq, "action": "ping" });
                action_seq += 1;
                socket.send(Message::text(action.to_string())).await?;
            }
            let save_at = self.save_due(me);
            let beat = tokio::select! {
                biased;
                _ = tokio::time::sleep_until(save_at.unwrap_or_else(tokio::time::Instant::now)), if save_at.is_some() => {
                    self.save(me, false).await;
                    ping_now = false;
                    continue;
                }
                beat = socket.next(ctx) => beat?,
            };
            ping_now = match beat {
                None => return Ok(()),
                Some(Beat::PingDue) => true,
                Some(Beat::Text(text)) => {
                    if !self.on_frame(text.as_str(), me, ctx).await {
                        return Ok(());
                    }
                    false
                }
            };
        }
    }

    /// `POST /posts`, waiting out 429s a bounded number of times.
    async fn create_post(&self, body: &Value) -> Result<Post, SendError> {
        let mut retries = 0;
        loop {
            match self
                .api
                .post::<Post>("/posts", body, self.send_timeout)
                .await
            {
                Ok(p) => return Ok(p),
                Err(e) if e.status() == Some(429) => {
                    let wait = match e.retry_after() {
                        Some(s) if !s.is_zero() => s,
                        _ => DEFAULT_RETRY_WAIT,
                    };
                    if retries >= self.rate_limit_retries || wait > MAX_RETRY_WAIT {
                        return Err(SendError::RateLimited(wait));
                    }
                    retries += 1;
                    tracing::info!(?wait, "Mattermost rate limit; waiting");
                    tokio::time::sleep(wait).await;
                }
                Err(e) => return Err(e.classify()),
            }
        }
    }

    async fn me_or_fetch(&self) -> Result<Me, SendError> {
        if let Some(me) = lock(&self.me).clone() {
            return Ok(me);
        }
        self.get_me()
            .await
            .map_err(|e| SendError::Unavailable(e.to_string()))
    }
}

/// Percent-encodes a query value (connection ids are alphanumeric, but a
/// server may say otherwise).
fn url_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Every kind: Mattermost carries any file, as a file.
const MEDIA: &[MediaKind] = &[
    MediaKind::Image,
    MediaKind::Voice,
    MediaKind::Audio,
    MediaKind::Video,
    MediaKind::Document,
];

/// What the platform can do; also the registry's declaration.
pub const CAPABILITIES: Capabilities = Capabilities {
    threads: true,
    markup: Markup::Markdown,
    receives: MEDIA,
    sends: MEDIA,
    ..Capabilities::chat(MessageLimits {
        max_len: MAX_POST_CHARS,
        unit: LengthUnit::Chars,
    })
};

#[async_trait]
impl Adapter for MattermostAdapter {
    fn platform(&self) -> &'static str {
        "mattermost"
    }

    async fn whoami(&self) -> Option<Result<String, AdapterError>> {
        Some(
            self.get_me()
                .await
                .map(|me| format!("@{} ({})", me.username, me.id)),
        )
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn credential(&self) -> Option<(&'static str, String)> {
        Some(("mattermost-token", self.token.expose().to_owned()))
    }

    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        ctx.liveness.set(Liveness::Connecting);
        let me = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = self.get_me() => r?,
        };
        tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            () = self.restore(&me) => {}
        }
        let result = self.connection(&me, &ctx).await;
        // However it ended, a clean shutdown included.
        self.save(&me, true).await;
        result
    }

    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        let mut text = format::to_mattermost(&message.text);
        if text.chars().count() > MAX_POST_CHARS {
            // Only defused mentions make the text longer; the original fits.
            text = message.text.clone();
        }
        let mut body = json!({ "channel_id": message.chat_id, "message": text });
        let root = message.thread_id.as_deref().filter(|t| !t.is_empty());
        if let Some(root) = root {
            body["root_id"] = json!(root);
        }
        let post = self.create_post(&body).await?;
        if let Some(root) = root {
            lock(&self.threads).insert(root);
        }
        Ok(SentMessage {
            message_id: Some(post.id),
        })
    }

    async fn download(&self, locator: &str) -> Result<Download, DownloadError> {
        self.fetch_file(locator).await
    }

    async fn send_file(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        self.post_file(file).await
    }

    async fn typing(&self, chat_id: &str, thread_id: Option<&str>) -> Result<(), SendError> {
        let me = self.me_or_fetch().await?;
        let body = json!({ "channel_id": chat_id, "parent_id": thread_id.unwrap_or("") });
        self.api
            .post::<Value>(
                &format!("/users/{}/typing", url_escape(&me.id)),
                &body,
                self.send_timeout,
            )
            .await
            .map(|_| ())
            .map_err(ApiError::classify)
    }
}

/// The registry's entry for Mattermost.
pub const ENTRY: Platform = Platform {
    name: "mattermost",
    title: "Mattermost",
    standalone: true,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<MattermostConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let Some(settings) = MattermostSettings::from_config(&setup.section()?, setup.env) else {
        return Ok(None);
    };
    let adapter = MattermostAdapter::new(settings)
        .map_err(BuildError::set_up)?
        .keeping_connection_in(setup.cursors.clone());
    Ok(Some(Built::connected(adapter)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{Failure, HttpError};

    #[test]
    fn from_config_reads_url_token_and_mention() {
        let empty = Env::from_pairs(Vec::<(String, String)>::new());
        let env = Env::from_pairs([
            ("MATTERMOST_TOKEN", "envtoken"),
            ("MATTERMOST_URL", "https://chat.example.com"),
        ]);
        let mut cfg = MattermostConfig::default();
        assert!(MattermostSettings::from_config(&cfg, &empty).is_none());
        let s = MattermostSettings::from_config(&cfg, &env).unwrap();
        assert_eq!(s.token, "envtoken");
        assert_eq!(s.url, "https://chat.example.com");
        assert!(s.require_mention);
        assert_eq!(s.ping_interval, Duration::from_secs(30));
        cfg.token = Some(talaria_core::Secret::new("cfgtoken"));
        cfg.url = Some("http://127.0.0.1:8065".into());
        let s = MattermostSettings::from_config(&cfg, &env).unwrap();
        assert_eq!(
            (s.token.expose(), s.url.as_str()),
            ("cfgtoken", "http://127.0.0.1:8065")
        );
        let off = Env::from_pairs([("MATTERMOST_REQUIRE_MENTION", "false")]);
        assert!(
            !MattermostSettings::from_config(&cfg, &off)
                .unwrap()
                .require_mention
        );
        cfg.enabled = Some(false);
        assert!(MattermostSettings::from_config(&cfg, &env).is_none());
    }

    #[test]
    fn new_validates_and_builds_the_socket_url() {
        let ok =
            MattermostAdapter::new(MattermostSettings::new("https://chat.example.com/", "t0k"))
                .unwrap();
        assert_eq!(ok.socket_url, "wss://chat.example.com/api/v4/websocket");
        let sub =
            MattermostAdapter::new(MattermostSettings::new("http://h:8065/mm", "t0k")).unwrap();
        assert_eq!(sub.socket_url, "ws://h:8065/mm/api/v4/websocket");
        assert!(matches!(
            MattermostAdapter::new(MattermostSettings::new("", "t0k")),
            Err(MattermostError::BadUrl(_))
        ));
        assert!(matches!(
            MattermostAdapter::new(MattermostSettings::new("ftp://h", "t0k")),
            Err(MattermostError::BadUrl(_))
        ));
        assert_eq!(
            MattermostAdapter::new(MattermostSettings::new("http://h", "a b")).err(),
            Some(MattermostError::BadToken)
        );
    }

    #[test]
    fn debug_never_shows_the_token() {
        let s = MattermostSettings::new("http://127.0.0.1:1", "SECRETSECRETSECRET");
        assert!(!format!("{s:?}").contains("SECRETSECRET"));
        let a = MattermostAdapter::new(s).unwrap();
        assert!(!format!("{a:?}").contains("SECRETSECRET"));
    }

    #[test]
    fn errors_are_classified() {
        let status = |status| {
            HttpError::new(
                api::MATTERMOST,
                Failure::Status {
                    status,
                    code: None,
                    message: "m".into(),
                    retry_after: None,
                },
            )
        };
        let classify = HttpError::classify;
        for s in [400, 401, 403, 404, 413] {
            assert!(matches!(classify(status(s)), SendError::Rejected(_)), "{s}");
        }
        assert!(matches!(classify(status(502)), SendError::Transient(_)));
        assert!(matches!(classify(status(429)), SendError::RateLimited(_)));
        assert!(matches!(
            classify(HttpError::new(
                api::MATTERMOST,
                Failure::Connect("x".into())
            )),
            SendError::Unavailable(_)
        ));
        assert!(matches!(
            classify(HttpError::new(
                api::MATTERMOST,
                Failure::Timeout("x".into())
            )),
            SendError::Ambiguous(_)
        ));
        assert_eq!(url_escape("ab-9_~"), "ab-9_~");
        assert_eq!(url_escape("a b&"), "a%20b%26");
    }
}
