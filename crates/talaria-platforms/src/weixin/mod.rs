//! The Weixin adapter: a personal WeChat account as a bot through
//! Tencent's iLink bot API (see [`api`] for the wire).
//!
//! [`WeixinAdapter::run`] long-polls `getupdates` with the
//! `get_updates_buf` cursor, which is kept in the store's cursor
//! namespace and saved only once every message of a batch was handed to
//! the inbox: a restart resumes where the last one stopped, and a crash
//! before the hand-over means the batch comes again (the gateway and a
//! bounded set of seen message ids answer it once). Users' text (and
//! voice transcripts) become DM turns; iLink bots see no group traffic
//! worth the name, so groups are not taken.
//!
//! Every reply echoes the peer's latest `context_token`, which ties it to
//! the conversation; it is remembered (and kept in the store) per peer. A
//! send answered with `-14` is tried once more without it. A poll
//! answered with `-14` means the login expired: polling stops for good,
//! and the status board and the log say how to log in again. A `-2`
//! (rate limited) is waited out, polls and sends alike; the parts of a
//! long answer go out no faster than the configured pace.
//!
//! Files cross the media CDN AES-128-ECB encrypted (see [`media`]):
//! images, voice notes, files and videos a user sends become attachments
//! whose locator holds the CDN's download parameter and the key, fetched
//! from the configured CDN only and decrypted as they stream in (a voice
//! note WeChat transcribed arrives as its text instead). A file the bot
//! sends is encrypted under a fresh random key as it is read, uploaded
//! to the address `getuploadurl` names (only on the CDN's or the API's
//! host), and sent as an image, video or file item carrying the CDN's
//! handle and the key.
//!
//! Not carried: the QR login itself (the docs page says how to get the
//! token).

mod api;
mod config;
mod media;

use crate::registry::{BuildError, Built, Platform, Setup};
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Attachment, AttachmentSource, ChatType, Download,
    DownloadError, Liveness, MediaKind, MessageEvent, MessageLimits, OutboundFile, OutboundMessage,
    SendError, SentMessage, SessionSource,
};
use talaria_adapter::{Capabilities, LengthUnit, Markup};
use talaria_core::config::{secret_or_env, text_or_env};
use talaria_core::{Env, Secret};
use talaria_store::CursorStore;
use tokio::time::Instant;

use api::{Api, Outcome, RATE_LIMITED, SESSION_EXPIRED};

pub use config::{ENV, WeixinConfig};

/// The platform's name in keys and configuration.
pub const PLATFORM: &str = "weixin";

/// The longest message sent, in characters [anc].
pub const MAX_MESSAGE_LEN: usize = 2000;

/// The API root when neither the file nor `WEIXIN_BASE_URL` names one.
pub const DEFAULT_BASE_URL: &str = "https://ilinkai.weixin.qq.com";

/// What the operator is told when the login expired.
pub const LOGIN_AGAIN: &str = "the Weixin login expired (iLink answered -14): log in again with \
     the iLink QR login (docs/platforms/weixin.md) and set the new WEIXIN_TOKEN and \
     WEIXIN_ACCOUNT_ID, then restart the gateway";

/// The media CDN when neither the file nor `WEIXIN_CDN_BASE_URL` names one.
pub const DEFAULT_CDN_BASE_URL: &str = "https://novac2c.cdn.weixin.qq.com/c2c";

/// How long a send or a typing call may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(15);

/// How long fetching or uploading one file may take, body included.
const MEDIA_TIMEOUT: Duration = Duration::from_secs(300);

/// The largest file sent [?]: WeChat's own limit for files is larger, but
/// a bot's upload is one request and this keeps it reasonable.
pub const MAX_UPLOAD_BYTES: u64 = 100 * 1024 * 1024;

/// Message ids remembered against a second delivery.
const SEEN_CAP: usize = 1000;

/// Peers whose context token (and typing ticket) is remembered in memory.
const PEER_CAP: usize = 1000;

/// A typing ticket is good for about ten minutes [anc].
const TICKET_LIFE: Duration = Duration::from_secs(600);

/// Consecutive failed polls after which the pause is the long one [anc].
const FAILURES_BEFORE_LONG_PAUSE: u32 = 3;

/// Timings, configurable so tests need not wait for iLink's real ones.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WeixinTimings {
    /// How long the server may hold a poll; the client waits 10 s more.
    pub poll_timeout: Duration,
    /// After a failed poll.
    pub poll_retry: Duration,
    /// After three failed polls in a row.
    pub poll_backoff: Duration,
    /// The pause between the parts of an answer to one peer.
    pub chunk_delay: Duration,
    /// Retries of a part refused as rate-limited.
    pub chunk_retries: u32,
    /// The first wait before such a retry, doubling each time.
    pub chunk_retry_delay: Duration,
}

impl Default for WeixinTimings {
    fn default() -> WeixinTimings {
        WeixinTimings {
            poll_timeout: Duration::from_secs(35),
            poll_retry: Duration::from_secs(2),
            poll_backoff: Duration::from_secs(30),
            chunk_delay: Duration::from_millis(1500),
            chunk_retries: 4,
            chunk_retry_delay: Duration::from_secs(1),
        }
    }
}

/// What the adapter needs to connect.
#[derive(Debug, Clone)]
pub struct WeixinSettings {
    /// The bot token. Never logged.
    pub token: Secret,
    /// The bot's account id.
    pub account_id: String,
    /// The API root.
    pub base_url: String,
    /// The media CDN root (`{cdn}/download`, `{cdn}/upload`).
    pub cdn_base_url: String,
    /// Poll and send pacing.
    pub timings: WeixinTimings,
}

/// Why the adapter could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WeixinError {
    /// Only one of token and account id is set.
    #[error("Weixin needs both the bot token and the account id; missing: {0}")]
    Missing(&'static str),
    /// The token has characters a header cannot carry.
    #[error("the Weixin bot token is malformed")]
    BadToken,
    /// A setting is out of range.
    #[error("platforms.weixin.{0}: {1}")]
    Invalid(&'static str, String),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// Seconds from the file, else the variable, else `default`.
fn seconds(
    configured: Option<f64>,
    env: &Env,
    var: &str,
    key: &'static str,
    default: Duration,
) -> Result<Duration, WeixinError> {
    let value =
        match configured {
            Some(v) => Some(v),
            None => match env.get(var).map(str::trim).filter(|v| !v.is_empty()) {
                Some(v) => Some(v.parse::<f64>().map_err(|_| {
                    WeixinError::Invalid(key, format!("{var}={v:?} is not a number"))
                })?),
                None => None,
            },
        };
    match value {
        None => Ok(default),
        Some(v) if v.is_finite() && (0.0..=600.0).contains(&v) => Ok(Duration::from_secs_f64(v)),
        Some(v) => Err(WeixinError::Invalid(
            key,
            format!("{v} is not 0-600 seconds"),
        )),
    }
}

impl WeixinSettings {
    /// Settings from `platforms.weixin` and the environment; `Ok(None)`
    /// when Weixin is off.
    pub fn from_config(
        config: &WeixinConfig,
        env: &Env,
    ) -> Result<Option<WeixinSettings>, WeixinError> {
        let token = secret_or_env(config.token.as_ref(), env, "WEIXIN_TOKEN");
        let account = text_or_env(config.account_id.as_deref(), env, "WEIXIN_ACCOUNT_ID");
        if !config
            .enabled
            .unwrap_or(token.is_some() || account.is_some())
        {
            return Ok(None);
        }
        let token = token.ok_or(WeixinError::Missing("token (WEIXIN_TOKEN)"))?;
        let account_id = account.ok_or(WeixinError::Missing("account_id (WEIXIN_ACCOUNT_ID)"))?;
        let base_url = text_or_env(config.base_url.as_deref(), env, "WEIXIN_BASE_URL")
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_owned());
        let cdn_base_url = text_or_env(config.cdn_base_url.as_deref(), env, "WEIXIN_CDN_BASE_URL")
            .unwrap_or_else(|| DEFAULT_CDN_BASE_URL.to_owned());
        let retries = match config.send_chunk_retries {
            Some(n) => n,
            None => match env.get("WEIXIN_SEND_CHUNK_RETRIES").map(str::trim) {
                Some(v) if !v.is_empty() => v.parse().map_err(|_| {
                    WeixinError::Invalid("send_chunk_retries", format!("{v:?} is not a count"))
                })?,
                _ => 4,
            },
        };
        let defaults = WeixinTimings::default();
        Ok(Some(WeixinSettings {
            token,
            account_id,
            base_url,
            cdn_base_url,
            timings: WeixinTimings {
                poll_timeout: Duration::from_secs(config.poll_timeout_secs.clamp(1, 120)),
                chunk_delay: seconds(
                    config.send_chunk_delay_seconds,
                    env,
                    "WEIXIN_SEND_CHUNK_DELAY_SECONDS",
                    "send_chunk_delay_seconds",
                    defaults.chunk_delay,
                )?,
                chunk_retries: retries.min(20),
                chunk_retry_delay: seconds(
                    config.send_chunk_retry_delay_seconds,
                    env,
                    "WEIXIN_SEND_CHUNK_RETRY_DELAY_SECONDS",
                    "send_chunk_retry_delay_seconds",
                    defaults.chunk_retry_delay,
                )?,
                ..defaults
            },
        }))
    }
}

/// One peer's conversation state.
#[derive(Debug, Clone, Default)]
struct Peer {
    context_token: Option<String>,
    ticket: Option<(String, Instant)>,
    last_send: Option<Instant>,
}

#[derive(Debug, Default)]
struct State {
    seen: VecDeque<String>,
    seen_set: HashSet<String>,
    peers: HashMap<String, Peer>,
    /// The login expired: no more polls until the operator logs in again.
    expired: bool,
}

/// The Weixin connector (see the module docs).
pub struct WeixinAdapter {
    api: Api,
    /// The media CDN's root, without a trailing slash.
    cdn: String,
    /// The hosts an upload address may point at: the CDN's and the API's.
    upload_hosts: Vec<String>,
    account_id: String,
    timings: WeixinTimings,
    cursors: Arc<dyn CursorStore>,
    state: Mutex<State>,
}

impl fmt::Debug for WeixinAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeixinAdapter")
            .field("account_id", &self.account_id)
            .field("timings", &self.timings)
            .finish_non_exhaustive()
    }
}

/// A peer id goes into JSON only, but it must be one: printable, short.
fn check_peer(peer: &str) -> Result<&str, SendError> {
    let peer = peer.trim();
    if peer.is_empty() || peer.len() > 256 || peer.chars().any(char::is_control) {
        return Err(SendError::Rejected(format!(
            "not a Weixin user id: {peer:?}"
        )));
    }
    Ok(peer)
}

impl WeixinAdapter {
    /// Checks the settings and builds the HTTP client; does not connect.
    /// `cursors` keeps the poll cursor and the peers' context tokens.
    pub fn new(
        settings: WeixinSettings,
        cursors: Arc<dyn CursorStore>,
    ) -> Result<WeixinAdapter, WeixinError> {
        let token = Secret::new(settings.token.expose().trim());
        if token.expose().is_empty() || !token.expose().chars().all(|c| c.is_ascii_graphic()) {
            return Err(WeixinError::BadToken);
        }
        let base = settings.base_url.trim().trim_end_matches('/').to_owned();
        match reqwest::Url::parse(&base) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => {}
            _ => {
                return Err(WeixinError::Invalid(
                    "base_url",
                    format!("{base:?} is not an http(s) URL"),
                ));
            }
        }
        let cdn = settings
            .cdn_base_url
            .trim()
            .trim_end_matches('/')
            .to_owned();
        let mut upload_hosts = Vec::new();
        for (key, url) in [("cdn_base_url", &cdn), ("base_url", &base)] {
            match reqwest::Url::parse(url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => {
                    upload_hosts.extend(u.host_str().map(str::to_ascii_lowercase));
                }
                _ => {
                    return Err(WeixinError::Invalid(
                        key,
                        format!("{url:?} is not an http(s) URL"),
                    ));
                }
            }
        }
        let api = Api::new(&base, &token).map_err(WeixinError::Client)?;
        Ok(WeixinAdapter {
            api,
            cdn,
            upload_hosts,
            account_id: settings.account_id.trim().to_owned(),
            timings: settings.timings,
            cursors,
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cursor_name(&self) -> String {
        format!("{}.get_updates_buf", self.account_id)
    }

    fn token_name(&self, peer: &str) -> String {
        format!("{}.context_token.{peer}", self.account_id)
    }

    /// The peer's context token: remembered, else from the store.
    async fn context_token(&self, peer: &str) -> Option<String> {
        if let Some(t) = self
            .state()
            .peers
            .get(peer)
            .and_then(|p| p.context_token.clone())
        {
            return Some(t);
        }
        match self.cursors.cursor(PLATFORM, &self.token_name(peer)).await {
            Ok(t) => t.filter(|t| !t.is_empty()),
            Err(e) => {
                tracing::warn!("cannot read a Weixin context token: {e}");
                None
            }
        }
    }

    fn peer_mut<'a>(state: &'a mut State, peer: &str) -> &'a mut Peer {
        if !state.peers.contains_key(peer) && state.peers.len() >= PEER_CAP {
            // Forget the quietest peer; its token is still in the store.
            let oldest = state
                .peers
                .iter()
                .min_by_key(|(_, p)| p.last_send)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                state.peers.remove(&k);
            }
        }
        state.peers.entry(peer.to_owned()).or_default()
    }

    async fn remember_token(&self, peer: &str, token: &str) {
        let changed = {
            let mut state = self.state();
            let p = Self::peer_mut(&mut state, peer);
            let changed = p.context_token.as_deref() != Some(token);
            p.context_token = Some(token.to_owned());
            changed
        };
        if changed
            && let Err(e) = self
                .cursors
                .set_cursor(PLATFORM, &self.token_name(peer), token)
                .await
        {
            tracing::warn!("cannot keep a Weixin context token: {e}");
        }
    }

    /// Drops a context token iLink refused as stale, so the next sends
    /// do not try it first; the peer's next message brings a fresh one.
    async fn forget_token(&self, peer: &str) {
        if let Some(p) = self.state().peers.get_mut(peer) {
            p.context_token = None;
        }
        if let Err(e) = self
            .cursors
            .set_cursor(PLATFORM, &self.token_name(peer), "")
            .await
        {
            tracing::warn!("cannot forget a stale Weixin context token: {e}");
        }
    }

    fn seen(&self, id: &str) -> bool {
        self.state().seen_set.contains(id)
    }

    fn mark_seen(&self, id: &str) {
        let mut state = self.state();
        if state.seen_set.insert(id.to_owned()) {
            state.seen.push_back(id.to_owned());
            while state.seen.len() > SEEN_CAP {
                if let Some(old) = state.seen.pop_front() {
                    state.seen_set.remove(&old);
                }
            }
        }
    }

    /// One message of a batch as an event, or why not.
    fn map(&self, m: &Value) -> Result<MessageEvent, &'static str> {
        if m.get("message_type").and_then(Value::as_i64) != Some(1) {
            return Err("not a user's message");
        }
        let from = m
            .get("from_user_id")
            .and_then(Value::as_str)
            .filter(|f| !f.is_empty())
            .ok_or("no sender")?;
        if from == self.account_id {
            return Err("our own message");
        }
        let room = ["room_id", "chat_room_id"].iter().any(|k| {
            m.get(*k)
                .and_then(Value::as_str)
                .is_some_and(|r| !r.is_empty())
        });
        if room {
            return Err("a group message (groups are not taken)");
        }
        let id = match m.get("message_id") {
            Some(Value::Number(n)) => n.to_string(),
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            _ => return Err("no message id"),
        };
        let mut parts = Vec::new();
        let mut attachments = Vec::new();
        for item in m
            .get("item_list")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let text = match item.get("type").and_then(Value::as_i64) {
                Some(1) => item.pointer("/text_item/text").and_then(Value::as_str),
                // A voice note's transcript, where WeChat made one: the
                // words are what the note is for, so the audio is not
                // fetched and transcribed again.
                Some(3) => item
                    .pointer("/voice_item/text")
                    .and_then(Value::as_str)
                    .filter(|t| !t.trim().is_empty()),
                _ => None,
            };
            match text.map(str::trim).filter(|t| !t.is_empty()) {
                Some(t) => parts.push(t.to_owned()),
                None => attachments.extend(item_attachment(item)),
            }
        }
        if parts.is_empty() && attachments.is_empty() {
            return Err("no text and no file");
        }
        Ok(MessageEvent {
            source: SessionSource {
                platform: PLATFORM.to_owned(),
                chat_id: from.to_owned(),
                chat_name: None,
                chat_type: ChatType::Dm,
                user_id: Some(from.to_owned()),
                user_name: None,
                thread_id: None,
                is_bot: false,
            },
            text: parts.join("\n"),
            message_id: Some(id),
            reply_to_message_id: None,
            reply_to_text: None,
            attachments,
            reply_target: None,
        })
    }

    /// Polls until shutdown, an expired login or the inbox closing.
    async fn poll(&self, ctx: &AdapterContext) -> Result<(), AdapterError> {
        let mut cursor = match self.cursors.cursor(PLATFORM, &self.cursor_name()).await {
            Ok(c) => c.unwrap_or_default(),
            Err(e) => {
                return Err(AdapterError::Disconnected(format!(
                    "cannot read the Weixin poll cursor: {e}"
                )));
            }
        };
        let mut hold = self.timings.poll_timeout;
        let mut failures = 0u32;
        loop {
            let call = self.api.call(
                "getupdates",
                json!({"get_updates_buf": cursor}),
                hold + Duration::from_secs(10),
            );
            let answer = tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => return Ok(()),
                a = call => a,
            };
            let pause = match answer {
                Ok(Outcome::Ok(v)) => {
                    failures = 0;
                    ctx.liveness.set(Liveness::Live);
                    if let Some(ms) = v.get("longpolling_timeout_ms").and_then(Value::as_u64) {
                        hold = Duration::from_millis(ms.clamp(1000, 120_000));
                    }
                    for m in v
                        .get("msgs")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        if let Some(token) = m.get("context_token").and_then(Value::as_str)
                            && let Some(from) = m.get("from_user_id").and_then(Value::as_str)
                            && m.get("message_type").and_then(Value::as_i64) == Some(1)
                            && !token.is_empty()
                        {
                            self.remember_token(from, token).await;
                        }
                        match self.map(m) {
                            Ok(ev) => {
                                let id = ev.message_id.clone().unwrap_or_default();
                                if self.seen(&id) {
                                    tracing::debug!(id, "skipping a Weixin message seen before");
                                    continue;
                                }
                                let submitted = tokio::select! {
                                    biased;
                                    _ = ctx.shutdown.cancelled() => return Ok(()),
                                    s = ctx.inbox.submit(ev) => s,
                                };
                                if submitted.is_err() {
                                    return Ok(());
                                }
                                self.mark_seen(&id);
                            }
                            Err(why) => tracing::debug!("skipping a Weixin message: {why}"),
                        }
                    }
                    // Only now: a crash before this replays the batch.
                    if let Some(next) = v.get("get_updates_buf").and_then(Value::as_str)
                        && next != cursor
                    {
                        if let Err(e) = self
                            .cursors
                            .set_cursor(PLATFORM, &self.cursor_name(), next)
                            .await
                        {
                            tracing::warn!("cannot keep the Weixin poll cursor: {e}");
                        }
                        cursor = next.to_owned();
                    }
                    None
                }
                Ok(Outcome::Failed { code, message })
                    if code == SESSION_EXPIRED
                        || (code == RATE_LIMITED
                            && message.eq_ignore_ascii_case("unknown error")) =>
                {
                    self.state().expired = true;
                    tracing::error!("{LOGIN_AGAIN}");
                    return Err(AdapterError::Fatal(LOGIN_AGAIN.to_owned()));
                }
                Ok(Outcome::Failed { code, message }) => {
                    failures += 1;
                    if code == RATE_LIMITED {
                        tracing::info!("iLink asked the poll to slow down ({message})");
                    } else {
                        tracing::warn!(code, "a Weixin poll failed: {message}");
                    }
                    ctx.liveness.set(Liveness::Degraded);
                    Some(failures)
                }
                Err(e) if matches!(e.failure, crate::http::Failure::Timeout(_)) => {
                    // The server held longer than it said: an empty batch.
                    None
                }
                Err(e) => {
                    failures += 1;
                    tracing::warn!("a Weixin poll failed: {e}");
                    ctx.liveness.set(Liveness::Degraded);
                    Some(failures)
                }
            };
            if let Some(failures) = pause {
                let wait = if failures >= FAILURES_BEFORE_LONG_PAUSE {
                    self.timings.poll_backoff
                } else {
                    self.timings.poll_retry
                };
                tokio::select! {
                    biased;
                    _ = ctx.shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
    }

    /// Sends one message of `items` to `peer`, echoing the peer's context
    /// token (once more without it when iLink calls it stale), waiting out
    /// rate limits as configured.
    async fn send_items(&self, peer: &str, items: Value) -> Result<SentMessage, SendError> {
        self.pace(peer).await;
        let mut token = self.context_token(peer).await;
        // One id for every try of this part: the server can tell a retry.
        let client_id = format!("talaria-weixin-{:016x}", rand::random::<u64>());
        let mut without_token = false;
        let mut retries = 0;
        let mut wait = self.timings.chunk_retry_delay;
        loop {
            let mut msg = json!({
                "from_user_id": "",
                "to_user_id": peer,
                "client_id": client_id,
                "message_type": 2,
                "message_state": 2,
                "item_list": items,
            });
            if let Some(t) = &token {
                msg["context_token"] = json!(t);
            }
            let answer = self
                .api
                .call("sendmessage", json!({"msg": msg}), SEND_TIMEOUT)
                .await;
            Self::peer_mut(&mut self.state(), peer).last_send = Some(Instant::now());
            match answer {
                Ok(Outcome::Ok(v)) => {
                    if without_token {
                        self.forget_token(peer).await;
                    }
                    let id = v
                        .get("message_id")
                        .map(|i| i.to_string().trim_matches('"').to_owned())
                        .filter(|i| !i.is_empty() && i != "null")
                        .or(Some(client_id));
                    return Ok(SentMessage { message_id: id });
                }
                Ok(Outcome::Failed { code, .. })
                    if code == SESSION_EXPIRED && !without_token && token.is_some() =>
                {
                    // A stale context token is refused; once more without it.
                    without_token = true;
                    token = None;
                }
                Ok(Outcome::Failed { code, message }) if code == RATE_LIMITED => {
                    if retries >= self.timings.chunk_retries {
                        return Err(SendError::RateLimited(wait));
                    }
                    retries += 1;
                    tracing::info!(?wait, "iLink rate-limited a send ({message}); waiting");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(60));
                }
                Ok(Outcome::Failed { code, message }) => {
                    let reason = self.api.failure(code, &message).reason();
                    return Err(if code == SESSION_EXPIRED {
                        SendError::Rejected(format!("{reason}; {LOGIN_AGAIN}"))
                    } else {
                        SendError::Rejected(reason)
                    });
                }
                Err(e) => return Err(e.classify()),
            }
        }
    }

    /// Encrypts `file` under a fresh key and puts it on the CDN for
    /// `peer`: `getuploadurl`, then the ciphertext POSTed, streamed from
    /// disk, to the address it named; the CDN's answer names the handle.
    async fn upload(&self, peer: &str, file: &OutboundFile) -> Result<CdnFile, SendError> {
        let unreadable = |e: std::io::Error| {
            SendError::Rejected(format!("cannot read {}: {e}", file.path.display()))
        };
        let (size, md5) = media::size_and_md5(&file.path).await.map_err(unreadable)?;
        if size > MAX_UPLOAD_BYTES {
            return Err(SendError::Rejected(format!(
                "{} is {} bytes; Weixin bots send files up to {MAX_UPLOAD_BYTES} bytes",
                file.name, size
            )));
        }
        let shown = CdnKind::of(file.kind);
        let key: [u8; 16] = rand::random();
        let filekey = media::hex(&rand::random::<[u8; 16]>());
        let cipher_len = media::encrypted_len(size);
        let body = json!({
            "filekey": filekey,
            "media_type": shown.media_type(),
            "to_user_id": peer,
            "rawsize": size,
            "rawfilemd5": md5,
            "filesize": cipher_len,
            "no_need_thumb": true,
            "aeskey": media::hex(&key),
        });
        let v = match self.api.call("getuploadurl", body, SEND_TIMEOUT).await {
            Ok(Outcome::Ok(v)) => v,
            Ok(Outcome::Failed { code, message }) => {
                let reason = self.api.failure(code, &message).reason();
                return Err(if code == RATE_LIMITED {
                    SendError::RateLimited(self.timings.chunk_retry_delay)
                } else if code == SESSION_EXPIRED {
                    SendError::Rejected(format!("{reason}; {LOGIN_AGAIN}"))
                } else {
                    SendError::Rejected(format!("iLink gave no upload address: {reason}"))
                });
            }
            Err(e) => return Err(e.classify()),
        };
        let url = self.upload_url(&v, &filekey)?;
        let encrypted = media::encrypting(&file.path, &key)
            .await
            .map_err(unreadable)?;
        let http = self.api.http();
        let request = http
            .client()
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .header(reqwest::header::CONTENT_LENGTH, cipher_len)
            .body(reqwest::Body::wrap_stream(encrypted));
        let answer = http
            .send(request, MEDIA_TIMEOUT)
            .await
            .map_err(|e| e.classify())?;
        if !answer.is_success() {
            let why = answer
                .headers
                .get("x-error-message")
                .and_then(|h| h.to_str().ok())
                .map(str::to_owned)
                .unwrap_or_else(|| {
                    String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)])
                        .trim()
                        .to_owned()
                });
            return Err(http
                .refused(answer.status, None, &why, answer.retry_after())
                .classify());
        }
        let handle = answer
            .headers
            .get("x-encrypted-param")
            .and_then(|h| h.to_str().ok())
            .filter(|h| !h.trim().is_empty())
            .ok_or_else(|| {
                SendError::Transient(
                    "the Weixin CDN took the upload but named no handle (x-encrypted-param)"
                        .to_owned(),
                )
            })?;
        Ok(CdnFile {
            handle: handle.trim().to_owned(),
            key,
            shown,
            size,
            cipher_len,
            md5,
        })
    }

    /// Where the ciphertext goes: `upload_full_url` when it is on the
    /// CDN's or the API's host (an address elsewhere is not followed),
    /// else `{cdn}/upload` with `upload_param` and the file key.
    fn upload_url(&self, v: &Value, filekey: &str) -> Result<reqwest::Url, SendError> {
        if let Some(full) = v
            .get("upload_full_url")
            .and_then(Value::as_str)
            .filter(|u| !u.trim().is_empty())
        {
            match reqwest::Url::parse(full.trim()) {
                Ok(u)
                    if matches!(u.scheme(), "http" | "https")
                        && u.host_str().is_some_and(|h| {
                            self.upload_hosts.iter().any(|a| a.eq_ignore_ascii_case(h))
                        }) =>
                {
                    return Ok(u);
                }
                _ => tracing::warn!(
                    "iLink named an upload address off the CDN's host; using the CDN's own"
                ),
            }
        }
        let param = v
            .get("upload_param")
            .and_then(Value::as_str)
            .filter(|p| !p.trim().is_empty())
            .ok_or_else(|| {
                SendError::Transient("iLink answered getuploadurl without an address".to_owned())
            })?;
        let mut url = reqwest::Url::parse(&format!("{}/upload", self.cdn))
            .map_err(|e| SendError::Rejected(format!("the CDN URL is invalid: {e}")))?;
        url.query_pairs_mut()
            .append_pair("encrypted_query_param", param)
            .append_pair("filekey", filekey);
        Ok(url)
    }

    /// Waits until the pace allows the next part to `peer`.
    async fn pace(&self, peer: &str) {
        let wait = {
            let state = self.state();
            state
                .peers
                .get(peer)
                .and_then(|p| p.last_send)
                .map(|at| self.timings.chunk_delay.saturating_sub(at.elapsed()))
                .unwrap_or_default()
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// How a sent file is shown: iLink's upload `media_type` and item type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CdnKind {
    Image,
    Video,
    File,
}

impl CdnKind {
    /// Photos and videos as themselves; everything else, voice notes and
    /// audio included, as a file (a WeChat voice note must be SILK with
    /// its play time, which a file the model made is not).
    fn of(kind: MediaKind) -> CdnKind {
        match kind {
            MediaKind::Image => CdnKind::Image,
            MediaKind::Video => CdnKind::Video,
            _ => CdnKind::File,
        }
    }

    /// `getuploadurl`'s `media_type`: 1 image, 2 video, 3 file.
    fn media_type(self) -> u8 {
        match self {
            CdnKind::Image => 1,
            CdnKind::Video => 2,
            CdnKind::File => 3,
        }
    }
}

/// A file on the CDN, ready to be sent as an item.
#[derive(Debug, Clone)]
struct CdnFile {
    /// The CDN's `x-encrypted-param`.
    handle: String,
    key: [u8; 16],
    shown: CdnKind,
    size: u64,
    cipher_len: u64,
    md5: String,
}

impl CdnFile {
    /// The `item_list` entry that sends it.
    fn item(&self, file: &OutboundFile) -> Value {
        let media = json!({
            "encrypt_query_param": self.handle,
            "aes_key": media::key_for_message(&self.key),
            "encrypt_type": 1,
        });
        match self.shown {
            CdnKind::Image => json!({"type": 2, "image_item": {
                "media": media, "mid_size": self.cipher_len}}),
            CdnKind::Video => json!({"type": 5, "video_item": {
                "media": media, "video_size": self.cipher_len}}),
            CdnKind::File => json!({"type": 4, "file_item": {
                "media": media, "file_name": file.name, "md5": self.md5,
                "len": self.size.to_string()}}),
        }
    }
}

/// A media item (image 2, voice 3, file 4, video 5) as an attachment;
/// `None` for items that are not media or name nothing to fetch.
fn item_attachment(item: &Value) -> Option<Attachment> {
    let (field, kind) = match item.get("type").and_then(Value::as_i64)? {
        2 => ("image_item", MediaKind::Image),
        3 => ("voice_item", MediaKind::Voice),
        4 => ("file_item", MediaKind::Document),
        5 => ("video_item", MediaKind::Video),
        _ => return None,
    };
    let body = item.get(field)?;
    let media = body.get("media")?;
    let param = media
        .get("encrypt_query_param")
        .and_then(Value::as_str)
        .filter(|p| !p.trim().is_empty())?;
    let name = body
        .get("file_name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_owned);
    // `len` has come both as a number and as a string.
    let size = match body.get("len") {
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => s.trim().parse().ok(),
        _ => None,
    };
    // Images may carry the key as hex text of their own (`aeskey`),
    // which then wins over the media block's.
    let key = body
        .get("aeskey")
        .and_then(Value::as_str)
        .and_then(media::parse_key)
        .or_else(|| {
            media
                .get("aes_key")
                .and_then(Value::as_str)
                .and_then(media::parse_key)
        });
    let source = match key {
        Some(key) => AttachmentSource::Remote(
            media::Locator {
                key,
                param: param.trim().to_owned(),
            }
            .encode(),
        ),
        None => AttachmentSource::Refused(
            "Weixin sent this file without a key it could be opened with".to_owned(),
        ),
    };
    let mime = match kind {
        // WeChat records voice notes as SILK.
        MediaKind::Voice => Some("audio/silk".to_owned()),
        _ => None,
    };
    Some(Attachment {
        kind,
        name,
        mime,
        size,
        source,
    })
}

/// What the platform can do; also the registry's declaration.
pub const CAPABILITIES: Capabilities = Capabilities {
    markup: Markup::Plain,
    receives: &[
        MediaKind::Image,
        MediaKind::Voice,
        MediaKind::Document,
        MediaKind::Video,
    ],
    sends: &[
        MediaKind::Image,
        MediaKind::Voice,
        MediaKind::Audio,
        MediaKind::Document,
        MediaKind::Video,
    ],
    ..Capabilities::chat(MessageLimits {
        max_len: MAX_MESSAGE_LEN,
        unit: LengthUnit::Chars,
    })
};

#[async_trait]
impl Adapter for WeixinAdapter {
    fn platform(&self) -> &'static str {
        PLATFORM
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn credential(&self) -> Option<(&'static str, String)> {
        // The ancestor's scoped lock `weixin-bot-token`: one poller per login.
        Some(("weixin-bot-token", self.account_id.clone()))
    }

    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        if self.state().expired {
            // Polling again cannot help: only a new login can.
            return Err(AdapterError::Fatal(LOGIN_AGAIN.to_owned()));
        }
        ctx.liveness.set(Liveness::Connecting);
        self.poll(&ctx).await
    }

    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        let peer = check_peer(&message.chat_id)?;
        self.send_items(
            peer,
            json!([{"type": 1, "text_item": {"text": message.text}}]),
        )
        .await
    }

    async fn download(&self, locator: &str) -> Result<Download, DownloadError> {
        let loc = media::Locator::decode(locator)
            .ok_or_else(|| DownloadError::Gone("not a Weixin media locator".to_owned()))?;
        let mut url = reqwest::Url::parse(&format!("{}/download", self.cdn))
            .map_err(|e| DownloadError::Unavailable(format!("the CDN URL is invalid: {e}")))?;
        url.query_pairs_mut()
            .append_pair("encrypted_query_param", &loc.param);
        let http = self.api.http();
        let fetched = http.download(http.client().get(url), MEDIA_TIMEOUT).await?;
        let cipher = Box::pin(tokio_util::io::ReaderStream::new(fetched.reader));
        let plain = media::decrypting(cipher, &loc.key);
        Ok(Download {
            reader: Box::pin(tokio_util::io::StreamReader::new(plain)),
            // The CDN's length is the ciphertext's, up to a block more
            // than the file's: the cache counts what arrives instead.
            length: None,
        })
    }

    async fn send_file(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        let peer = check_peer(&file.chat_id)?;
        let upload = self.upload(peer, file).await?;
        let sent = self.send_items(peer, json!([upload.item(file)])).await?;
        if let Some(caption) = file.caption.as_deref().filter(|c| !c.trim().is_empty()) {
            // iLink items carry no caption: it follows as its own text.
            self.send_items(peer, json!([{"type": 1, "text_item": {"text": caption}}]))
                .await?;
        }
        Ok(sent)
    }

    async fn typing(&self, chat_id: &str, _thread_id: Option<&str>) -> Result<(), SendError> {
        let peer = check_peer(chat_id)?;
        let cached = self
            .state()
            .peers
            .get(peer)
            .and_then(|p| p.ticket.clone())
            .filter(|(_, at)| at.elapsed() < TICKET_LIFE)
            .map(|(t, _)| t);
        let ticket = match cached {
            Some(t) => t,
            None => {
                let token = self.context_token(peer).await;
                let answer = self
                    .api
                    .call(
                        "getconfig",
                        json!({"ilink_user_id": peer, "context_token": token}),
                        SEND_TIMEOUT,
                    )
                    .await
                    .map_err(|e| e.classify())?;
                let Outcome::Ok(v) = answer else {
                    // Best effort: no ticket, no typing.
                    return Ok(());
                };
                let Some(t) = v
                    .get("typing_ticket")
                    .and_then(Value::as_str)
                    .filter(|t| !t.is_empty())
                else {
                    return Ok(());
                };
                let mut state = self.state();
                Self::peer_mut(&mut state, peer).ticket = Some((t.to_owned(), Instant::now()));
                t.to_owned()
            }
        };
        self.api
            .call(
                "sendtyping",
                json!({"ilink_user_id": peer, "typing_ticket": ticket, "status": 1}),
                SEND_TIMEOUT,
            )
            .await
            .map(|_| ())
            .map_err(|e| e.classify())
    }
}

/// The registry's entry for Weixin.
pub const ENTRY: Platform = Platform {
    name: PLATFORM,
    title: "Weixin (WeChat, iLink)",
    standalone: true,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<WeixinConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let Some(settings) = WeixinSettings::from_config(&setup.section()?, setup.env)
        .map_err(BuildError::misconfigured)?
    else {
        return Ok(None);
    };
    let adapter =
        WeixinAdapter::new(settings, setup.cursors.clone()).map_err(BuildError::set_up)?;
    Ok(Some(Built::connected(adapter)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_config_reads_the_ancestors_variables() {
        let cfg = WeixinConfig::default();
        let none = Env::from_pairs(Vec::<(String, String)>::new());
        assert!(WeixinSettings::from_config(&cfg, &none).unwrap().is_none());
        let env = Env::from_pairs([
            ("WEIXIN_TOKEN", "tok@im.bot:0600"),
            ("WEIXIN_ACCOUNT_ID", "abc@im.bot"),
            ("WEIXIN_SEND_CHUNK_DELAY_SECONDS", "0.25"),
        ]);
        let s = WeixinSettings::from_config(&cfg, &env).unwrap().unwrap();
        assert_eq!(s.base_url, DEFAULT_BASE_URL);
        assert_eq!(s.account_id, "abc@im.bot");
        assert_eq!(s.timings.chunk_delay, Duration::from_millis(250));
        assert_eq!(s.timings.chunk_retries, 4);
        let half = Env::from_pairs([("WEIXIN_TOKEN", "t")]);
        assert!(matches!(
            WeixinSettings::from_config(&cfg, &half),
            Err(WeixinError::Missing(_))
        ));
        let bad = Env::from_pairs([
            ("WEIXIN_TOKEN", "t"),
            ("WEIXIN_ACCOUNT_ID", "a"),
            ("WEIXIN_SEND_CHUNK_DELAY_SECONDS", "soon"),
        ]);
        assert!(matches!(
            WeixinSettings::from_config(&cfg, &bad),
            Err(WeixinError::Invalid(..))
        ));
    }

    #[test]
    fn peers_must_be_ids() {
        assert!(check_peer("o9cq80_abc@im.wechat").is_ok());
        assert!(check_peer(" ").is_err());
        assert!(check_peer("a\nb").is_err());
    }
}
