//! The Matrix adapter: a hand-written client for the client-server API,
//! with end-to-end encryption by matrix-sdk-crypto's Olm machine (see
//! `e2ee` and `encrypted_rooms`).
//!
//! [`MatrixAdapter::run`] long-polls `/sync` and hands each room message to
//! the gateway's inbox. The sync token (`next_batch`) is saved in the
//! store only after a whole batch was handed over, so a crash re-delivers
//! at most that batch, whose events the runner recognises by their event
//! ids. A first start without a saved token answers none of the history
//! the homeserver returns: it only takes the token.
//!
//! Sends are `PUT .../send/m.room.message/{txnId}` with the Markdown both
//! as `body` and as sanitized HTML. The transaction id is derived from the
//! message (see [`MatrixAdapter::send`]) so that a retried send is
//! recognised by the homeserver instead of posted twice.
//!
//! Files go through the homeserver's media repository (see `media`):
//! `mxc://` addresses in, uploads then a file message out.

mod api;
mod config;
mod e2ee;
mod encrypted_media;
mod encrypted_rooms;
mod format;
mod mapping;
mod media;
mod membership;
mod outbox;
mod rooms;

use crate::registry::{BuildError, Built, Platform, Setup};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Method;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use talaria_adapter::auth::{AuthPolicy, Decision};
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, ChatType, Download, DownloadError, Liveness, MediaKind,
    MessageLimits, OutboundFile, OutboundMessage, SendError, SentMessage, SessionSource,
};
use talaria_adapter::{Capabilities, LengthUnit, Markup};
use talaria_core::config::{secret_or_env, text_or_env};
use talaria_core::{Env, Secret};
use talaria_store::CursorStore;

use crate::http::{Failure, HttpError};
use api::{Api, ApiError, segment};
use mapping::{Conversation, Me};
use rooms::Rooms;

pub use config::{DeviceTrust, E2eeMode, ENV, MatrixConfig};
pub use encrypted_rooms::E2eeSettings;
use encrypted_rooms::{CryptoState, HeldEvents, KeysNotTaken, Opened};

/// The platform's name in keys, config and environment variables.
pub const PLATFORM: &str = "matrix";

/// The longest message sent, in characters. Matrix caps a whole event at
/// 65,536 bytes, and a message carries its text twice (plain and HTML);
/// at this length even text of four-byte characters fits once the HTML is
/// dropped (see [`MAX_CONTENT_BYTES`]).
pub const MAX_MESSAGE_LEN: usize = 14_000;

/// Every kind of file: a room carries any file, and says which kind.
const MEDIA: &[MediaKind] = &[
    MediaKind::Image,
    MediaKind::Voice,
    MediaKind::Audio,
    MediaKind::Video,
    MediaKind::Document,
];

/// What a Matrix room can do; also used to judge inviters.
const CAPABILITIES: Capabilities = Capabilities {
    threads: true,
    markup: Markup::Html,
    receives: MEDIA,
    sends: MEDIA,
    ..Capabilities::chat(MessageLimits {
        max_len: MAX_MESSAGE_LEN,
        unit: LengthUnit::Chars,
    })
};

/// The largest message content sent with its HTML; above this only the
/// plain body goes, and above it again the message is refused rather than
/// bounced by the homeserver. The rest of the 64 KiB is for the event's
/// envelope (ids, signatures, hashes).
const MAX_CONTENT_BYTES: usize = 60_000;

/// Retries after a 429 before a send reports [`SendError::RateLimited`].
const MAX_RATE_LIMIT_RETRIES: u32 = 3;

/// Longer waits are not worth blocking a send for.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// How long a send, join or typing notice may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest wait between failed syncs.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Remembered own event ids and bot threads, for replies without a mention.
const MAX_REMEMBERED: usize = 10_000;

/// What a `/sync` asks for: no presence, typing or receipts (the adapter
/// reads none of them), and enough timeline per room for a busy minute.
const SYNC_FILTER: &str = r#"{"presence":{"types":[]},"account_data":{"types":["m.direct"]},"room":{"ephemeral":{"types":[]},"timeline":{"limit":100}}}"#;

/// What the adapter needs to connect.
#[derive(Clone)]
pub struct MatrixSettings {
    /// The client-server API root (`https://matrix.example.org`).
    pub homeserver: String,
    /// The bot account's access token. Never logged.
    pub access_token: Secret,
    /// The bot's user id; asked from the homeserver when `None`.
    pub user_id: Option<String>,
    /// In rooms with more than two members, submit only messages that
    /// mention the bot, reply to it, or continue a thread it wrote in.
    pub require_mention: bool,
    /// How long each `/sync` long poll waits on the server.
    pub sync_timeout: Duration,
    /// The wait after the first failed sync; it doubles with each further
    /// failure (up to 30 s).
    pub retry_base: Duration,
    /// Failed syncs in a row before `run` returns
    /// [`AdapterError::Disconnected`] for the supervisor to reconnect.
    pub max_sync_failures: u32,
    /// Who may invite the bot into a room: the runner's own rules
    /// (`MATRIX_ALLOWED_USERS`, allow-all flags). `None` joins every
    /// invite and leaves strangers to the runner.
    pub invite_policy: Option<AuthPolicy>,
    /// End-to-end encryption.
    pub e2ee: E2eeSettings,
}

// By hand only because the invite policy (the runner's rules) has no
// `Debug`; the token is a `Secret`, masked either way.
impl fmt::Debug for MatrixSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MatrixSettings")
            .field("homeserver", &self.homeserver)
            .field("access_token", &self.access_token)
            .field("user_id", &self.user_id)
            .field("require_mention", &self.require_mention)
            .field("sync_timeout", &self.sync_timeout)
            .field("retry_base", &self.retry_base)
            .field("max_sync_failures", &self.max_sync_failures)
            .field("e2ee", &self.e2ee)
            .finish_non_exhaustive()
    }
}

impl MatrixSettings {
    /// Settings from `platforms.matrix` and the environment, or `None` when
    /// Matrix is off: `enabled: false`, or no homeserver (config or
    /// `MATRIX_HOMESERVER`) or no token (config or `MATRIX_ACCESS_TOKEN`).
    /// `MATRIX_USER_ID` stands in for `platforms.matrix.user_id`, and
    /// `MATRIX_E2EE_MODE` (or the legacy `MATRIX_ENCRYPTION`),
    /// `MATRIX_DEVICE_ID` and `MATRIX_DEVICE_TRUST` for the encryption
    /// keys. Keys' stores go under `store_root` (no encryption without).
    ///
    /// # Errors
    /// An encryption variable that reads as none of its values.
    pub fn from_config(
        config: &MatrixConfig,
        env: &Env,
        store_root: Option<PathBuf>,
    ) -> Result<Option<MatrixSettings>, MatrixError> {
        if config.enabled == Some(false) {
            return Ok(None);
        }
        let homeserver = text_or_env(config.homeserver.as_deref(), env, "MATRIX_HOMESERVER");
        let token = secret_or_env(config.access_token.as_ref(), env, "MATRIX_ACCESS_TOKEN");
        let (Some(homeserver), Some(access_token)) = (homeserver, token) else {
            if config.enabled == Some(true) {
                tracing::warn!(
                    "platforms.matrix.enabled is true but the homeserver or the access token \
                     is missing (platforms.matrix.homeserver / MATRIX_HOMESERVER, \
                     platforms.matrix.access_token / MATRIX_ACCESS_TOKEN)"
                );
            }
            return Ok(None);
        };
        let e2ee = E2eeSettings {
            mode: encryption_mode(config, env)?,
            device_id: text_or_env(config.device_id.as_deref(), env, "MATRIX_DEVICE_ID"),
            trust: match (config.device_trust, env.get("MATRIX_DEVICE_TRUST")) {
                (Some(t), _) => t,
                (None, Some(v)) if !v.trim().is_empty() => {
                    DeviceTrust::parse(v).ok_or_else(|| {
                        MatrixError::BadSetting(format!(
                            "MATRIX_DEVICE_TRUST={v} is neither all nor cross-signed"
                        ))
                    })?
                }
                (None, _) => DeviceTrust::default(),
            },
            store_root,
        };
        Ok(Some(MatrixSettings {
            homeserver,
            access_token,
            user_id: text_or_env(config.user_id.as_deref(), env, "MATRIX_USER_ID"),
            require_mention: config.require_mention,
            sync_timeout: Duration::from_millis(config.sync_timeout_ms),
            retry_base: Duration::from_millis(500),
            max_sync_failures: 5,
            invite_policy: Some(AuthPolicy::from_env(env)),
            e2ee,
        }))
    }
}

/// `platforms.matrix.encryption`, else `MATRIX_E2EE_MODE`, else the
/// legacy `MATRIX_ENCRYPTION` (true means required), else `optional`.
fn encryption_mode(config: &MatrixConfig, env: &Env) -> Result<E2eeMode, MatrixError> {
    if let Some(mode) = config.encryption {
        return Ok(mode);
    }
    for var in ["MATRIX_E2EE_MODE", "MATRIX_ENCRYPTION"] {
        if let Some(v) = env.get(var).filter(|v| !v.trim().is_empty()) {
            return E2eeMode::parse(v).ok_or_else(|| {
                MatrixError::BadSetting(format!("{var}={v} is none of off, optional, required"))
            });
        }
    }
    Ok(E2eeMode::default())
}

/// Why the adapter could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MatrixError {
    /// The token is empty or cannot travel in a header.
    #[error("the Matrix access token is malformed (empty, or with spaces or control characters)")]
    BadToken,
    /// The homeserver is not an http(s) URL.
    #[error("the Matrix homeserver is not an http(s) URL: {0}")]
    BadHomeserver(String),
    /// The configured user id is not `@localpart:server`.
    #[error("the Matrix user id is not of the form @name:server: {0}")]
    BadUserId(String),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    /// An environment variable reads as none of its values.
    #[error("{0}")]
    BadSetting(String),
}

/// What the bot itself wrote: its event ids and the threads it is in.
#[derive(Default)]
struct Own {
    events: HashSet<String>,
    threads: HashSet<String>,
}

impl Conversation for Own {
    fn is_own_event(&self, event_id: &str) -> bool {
        self.events.contains(event_id)
    }

    fn is_bot_thread(&self, root: &str) -> bool {
        self.threads.contains(root) || self.events.contains(root)
    }
}

fn remember(set: &mut HashSet<String>, value: &str) {
    if set.len() >= MAX_REMEMBERED {
        set.clear();
    }
    set.insert(value.to_owned());
}

/// The Matrix connector (see the module docs).
pub struct MatrixAdapter {
    api: Api,
    media: media::Media,
    token: Secret,
    configured_user: Option<String>,
    require_mention: bool,
    sync_timeout: Duration,
    retry_base: Duration,
    max_sync_failures: u32,
    invite_policy: Option<AuthPolicy>,
    cursors: Arc<dyn CursorStore>,
    /// The last `next_batch` handed over, kept across `run` calls so a
    /// reconnect continues where the last connection stopped.
    since: Mutex<Option<String>>,
    me: Mutex<Option<Me>>,
    rooms: Mutex<Rooms>,
    own: Mutex<Own>,
    /// Message digest -> (sequence, whether its last send is unconfirmed).
    txns: Mutex<HashMap<String, (u64, bool)>>,
    /// Distinguishes this process's transaction ids from an earlier one's.
    nonce: String,
    e2ee: E2eeSettings,
    crypto: Mutex<CryptoState>,
    /// Room id -> its `m.room.encryption` content, `None` when it has none.
    encryption: Mutex<HashMap<String, Option<Value>>>,
    held: Mutex<HeldEvents>,
}

impl fmt::Debug for MatrixAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MatrixAdapter")
            .field("api", &self.api)
            .field("user_id", &self.configured_user)
            .field("require_mention", &self.require_mention)
            .finish_non_exhaustive()
    }
}

/// How handing over a sync batch ended.
enum HandOver {
    /// Every message of the batch was taken: its token may be saved.
    Done,
    /// Shutdown, or the runner is gone: the batch was not finished.
    Stopped,
    /// A room could not be classified; the batch is synced again.
    Retry(ApiError),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl MatrixAdapter {
    /// Checks the settings and builds the HTTP client; does not connect.
    /// `cursors` keeps the sync token across restarts.
    pub fn new(
        settings: MatrixSettings,
        cursors: Arc<dyn CursorStore>,
    ) -> Result<MatrixAdapter, MatrixError> {
        let token = Secret::new(settings.access_token.expose().trim());
        if token.expose().is_empty()
            || token
                .expose()
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || !c.is_ascii())
        {
            return Err(MatrixError::BadToken);
        }
        let homeserver = settings.homeserver.trim().trim_end_matches('/').to_owned();
        match reqwest::Url::parse(&homeserver) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => {}
            _ => return Err(MatrixError::BadHomeserver(homeserver)),
        }
        let configured_user = settings.user_id.map(|u| u.trim().to_owned());
        if let Some(u) = &configured_user
            && !is_user_id(u)
        {
            return Err(MatrixError::BadUserId(u.clone()));
        }
        let api = api::client(&homeserver, &token).map_err(MatrixError::Client)?;
        let media = media::Media::new(&homeserver, &token).map_err(MatrixError::Client)?;
        Ok(MatrixAdapter {
            api,
            media,
            token,
            configured_user,
            require_mention: settings.require_mention,
            sync_timeout: settings.sync_timeout,
            retry_base: settings.retry_base.max(Duration::from_millis(1)),
            max_sync_failures: settings.max_sync_failures.max(1),
            invite_policy: settings.invite_policy,
            cursors,
            since: Mutex::new(None),
            me: Mutex::new(None),
            rooms: Mutex::new(Rooms::default()),
            own: Mutex::new(Own::default()),
            txns: Mutex::new(HashMap::new()),
            nonce: format!("{:08x}", rand::random::<u32>()),
            e2ee: settings.e2ee,
            crypto: Mutex::new(CryptoState::NotYet),
            encryption: Mutex::new(HashMap::new()),
            held: Mutex::new(HeldEvents::default()),
        })
    }

    /// The bot's user id, once known (configured, or after `run` asked).
    pub fn user_id(&self) -> Option<String> {
        lock(&self.me)
            .as_ref()
            .map(|m| m.user_id.clone())
            .or_else(|| self.configured_user.clone())
    }

    fn cursor_name(user_id: &str) -> String {
        // Per account: a token from another account would be refused, or
        // worse, accepted and skip messages.
        format!("next_batch:{user_id}")
    }

    /// Asks the homeserver who the token belongs to (which also proves the
    /// token works) and the bot's display name, best effort.
    async fn identify(&self) -> Result<Me, AdapterError> {
        let whoami: Result<Value, ApiError> = self
            .api
            .request(Method::GET, "/account/whoami", &[], None, REQUEST_TIMEOUT)
            .await;
        let (user_id, device_id) = match whoami {
            Ok(v) => (
                v.get("user_id")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .ok_or_else(|| {
                        AdapterError::Disconnected("whoami answered without a user_id".into())
                    })?,
                v.get("device_id")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
            ),
            Err(e) if api::is_bad_token(&e) => {
                return Err(AdapterError::Fatal(format!(
                    "the homeserver rejected the access token ({e}); check MATRIX_ACCESS_TOKEN"
                )));
            }
            Err(e) => return Err(AdapterError::Disconnected(e.to_string())),
        };
        if let Some(configured) = &self.configured_user
            && *configured != user_id
        {
            return Err(AdapterError::Fatal(format!(
                "the access token belongs to {user_id}, not to the configured MATRIX_USER_ID {configured}"
            )));
        }
        let path = format!("/profile/{}/displayname", segment(&user_id));
        let display_name = match self
            .api
            .request::<Value>(Method::GET, &path, &[], None, REQUEST_TIMEOUT)
            .await
        {
            Ok(v) => v
                .get("displayname")
                .and_then(Value::as_str)
                .map(str::to_owned),
            Err(e) => {
                tracing::debug!("no display name for {user_id}: {e}");
                None
            }
        };
        let me = Me {
            user_id,
            display_name,
            device_id,
        };
        *lock(&self.me) = Some(me.clone());
        Ok(me)
    }

    async fn sync(&self, since: Option<&str>, timeout: Duration) -> Result<Value, ApiError> {
        let mut query = vec![
            ("timeout", timeout.as_millis().to_string()),
            ("filter", SYNC_FILTER.to_owned()),
        ];
        if let Some(s) = since {
            query.push(("since", s.to_owned()));
        }
        // The server holds the request for up to `timeout`; allow for that.
        // A first sync has no wait but may take a while to assemble on a
        // big account.
        let margin = if since.is_none() { 120 } else { 15 };
        let http_timeout = timeout + Duration::from_secs(margin);
        self.api
            .request(Method::GET, "/sync", &query, None, http_timeout)
            .await
    }

    /// Reads what later messages need from a sync response: room and
    /// member names, direct rooms, the bot's own events, and which rooms'
    /// member counts a membership change made stale.
    fn absorb(&self, sync: &Value, me: &Me) {
        let mut rooms = lock(&self.rooms);
        if let Some(events) = sync
            .pointer("/account_data/events")
            .and_then(Value::as_array)
        {
            for ev in events {
                if ev.get("type").and_then(Value::as_str) == Some("m.direct")
                    && let Some(content) = ev.get("content")
                {
                    rooms.set_account_direct(content);
                }
            }
        }
        if let Some(left) = sync.pointer("/rooms/leave").and_then(Value::as_object) {
            for room_id in left.keys() {
                rooms.left(room_id);
            }
        }
        let Some(joined) = sync.pointer("/rooms/join").and_then(Value::as_object) else {
            return;
        };
        let mut own = lock(&self.own);
        for (room_id, room) in joined {
            let state = room.pointer("/state/events").and_then(Value::as_array);
            let timeline = room.pointer("/timeline/events").and_then(Value::as_array);
            for ev in state.into_iter().chain(timeline).flatten() {
                let kind = ev.get("type").and_then(Value::as_str).unwrap_or("");
                match kind {
                    "m.room.name" => {
                        if let Some(n) = ev.pointer("/content/name").and_then(Value::as_str) {
                            rooms.set_name(room_id, n);
                        }
                    }
                    "m.room.encryption" => {
                        if let Some(content) =
                            ev.get("content").filter(|c| c.get("algorithm").is_some())
                        {
                            self.set_encryption(room_id, Some(content.clone()));
                        }
                    }
                    "m.room.member" => {
                        // Someone joined, left, was invited or renamed:
                        // the count is asked again when a message needs it.
                        rooms.forget_joined(room_id);
                        if let (Some(user), Some(name)) = (
                            ev.get("state_key").and_then(Value::as_str),
                            ev.pointer("/content/displayname").and_then(Value::as_str),
                        ) {
                            rooms.set_member_name(room_id, user, name);
                        }
                    }
                    _ => {}
                }
                if ev.get("sender").and_then(Value::as_str) == Some(me.user_id.as_str())
                    && let Some(id) = ev.get("event_id").and_then(Value::as_str)
                {
                    remember(&mut own.events, id);
                }
            }
            // When the homeserver sends a count (with lazy-loaded members,
            // after a change) it is the count at the end of this batch.
            if let Some(n) = room
                .pointer("/summary/m.joined_member_count")
                .and_then(Value::as_u64)
            {
                rooms.set_joined(room_id, n);
            }
        }
    }

    /// Hands over the messages of one sync batch.
    async fn hand_over(&self, sync: &Value, me: &Me, ctx: &AdapterContext) -> HandOver {
        let Some(joined) = sync.pointer("/rooms/join").and_then(Value::as_object) else {
            return HandOver::Done;
        };
        for (room_id, room) in joined {
            let events = room
                .pointer("/timeline/events")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default();
            // Where the bot joined in this batch: what comes before was
            // written before it was there.
            let joined_at = events.iter().rposition(|e| rooms::is_fresh_join(e, me));
            let fresh_join = joined_at.is_some()
                || room
                    .pointer("/state/events")
                    .and_then(Value::as_array)
                    .is_some_and(|s| s.iter().any(|e| rooms::is_fresh_join(e, me)));
            // A fresh join's timeline is always "limited" (Synapse marks
            // it so): the older messages left out are the room's history
            // from before the bot, not messages it missed.
            if room.pointer("/timeline/limited").and_then(Value::as_bool) == Some(true)
                && !fresh_join
            {
                tracing::warn!(room = %room_id, "the homeserver left out older messages of this room (more than the sync limit arrived at once)");
            }
            let has_messages = events.iter().any(|e| {
                matches!(
                    e.get("type").and_then(Value::as_str),
                    Some("m.room.message" | "m.room.encrypted")
                )
            });
            if !has_messages {
                continue;
            }
            let is_dm = match self.room_is_dm(room_id, ctx).await {
                Ok(dm) => dm,
                Err(e) => {
                    tracing::warn!(room = %room_id, "cannot ask whether this room is a direct chat; the batch is fetched again: {e}");
                    return HandOver::Retry(e);
                }
            };
            if ctx.shutdown.is_cancelled() {
                return HandOver::Stopped;
            }
            for (i, ev) in events.iter().enumerate() {
                let kind = ev.get("type").and_then(Value::as_str).unwrap_or("");
                if !matches!(kind, "m.room.message" | "m.room.encrypted") {
                    continue;
                }
                // A group's talk from before the bot was invited was not
                // meant for it; in a direct chat, what the user wrote
                // while the invite was pending is.
                if !is_dm && (joined_at.is_some_and(|j| i < j) || rooms::written_before_joining(ev))
                {
                    tracing::debug!(room = %room_id, "skipping an event: written in a group before the bot joined");
                    continue;
                }
                let delivered = if kind == "m.room.encrypted" {
                    // The bot's own messages come back too; they need no
                    // reading.
                    if ev.get("sender").and_then(Value::as_str) == Some(me.user_id.as_str()) {
                        continue;
                    }
                    match self.open(room_id, ev, is_dm).await {
                        Opened::Plain(plain) => self.deliver(room_id, &plain, is_dm, me, ctx).await,
                        Opened::Not => continue,
                    }
                } else {
                    self.deliver(room_id, ev, is_dm, me, ctx).await
                };
                if delivered.is_err() {
                    return HandOver::Stopped;
                }
            }
        }
        HandOver::Done
    }

    /// Maps one room message and hands it to the runner; `Err` when the
    /// gateway is stopping.
    async fn deliver(
        &self,
        room_id: &str,
        ev: &Value,
        is_dm: bool,
        me: &Me,
        ctx: &AdapterContext,
    ) -> Result<(), ()> {
        if ev.get("type").and_then(Value::as_str) != Some("m.room.message") {
            return Ok(());
        }
        let sender = ev.get("sender").and_then(Value::as_str);
        let view = lock(&self.rooms).view(room_id, sender, is_dm);
        let mapped = {
            let own = lock(&self.own);
            mapping::map_event(ev, &view, me, self.require_mention, &*own)
        };
        let event = match mapped {
            Ok(e) => e,
            Err(why) => {
                tracing::debug!(room = %room_id, "skipping an event: {why}");
                return Ok(());
            }
        };
        tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => Err(()),
            r = ctx.inbox.submit(event) => r.map_err(|_| ()),
        }
    }

    /// Saves the token of a batch that was fully handed over.
    async fn advance(&self, next_batch: &str, me: &Me) {
        *lock(&self.since) = Some(next_batch.to_owned());
        if let Err(e) = self
            .cursors
            .set_cursor(PLATFORM, &Self::cursor_name(&me.user_id), next_batch)
            .await
        {
            // Kept in memory meanwhile; a restart before the next save
            // re-delivers, and the runner drops what it already took.
            tracing::warn!("cannot save the Matrix sync token: {e}");
        }
    }
}

impl MatrixAdapter {
    /// Puts one `m.room.message` with `content` in `message`'s room under
    /// `txn`, encrypted when the room is, waiting out short rate limits.
    async fn put_event(
        &self,
        message: &OutboundMessage,
        txn: &str,
        digest: &str,
        content: Value,
    ) -> Result<SentMessage, SendError> {
        let (kind, content) = self
            .seal(&message.chat_id, "m.room.message", content)
            .await?;
        let content = &content;
        let path = format!(
            "/rooms/{}/send/{kind}/{}",
            segment(&message.chat_id),
            segment(txn)
        );
        let mut rate_retries = 0;
        loop {
            let result: Result<Value, ApiError> = self
                .api
                .request(Method::PUT, &path, &[], Some(content), REQUEST_TIMEOUT)
                .await;
            match result {
                Ok(v) => {
                    self.txn_done(digest);
                    let event_id = v.get("event_id").and_then(Value::as_str).map(str::to_owned);
                    let mut own = lock(&self.own);
                    if let Some(id) = &event_id {
                        remember(&mut own.events, id);
                    }
                    if let Some(t) = &message.thread_id {
                        remember(&mut own.threads, t);
                    }
                    return Ok(SentMessage {
                        message_id: event_id,
                    });
                }
                Err(e) if api::is_rate_limit(&e) => {
                    let wait = e.retry_after().unwrap_or(Duration::from_secs(1));
                    if rate_retries >= MAX_RATE_LIMIT_RETRIES || wait > MAX_RETRY_AFTER {
                        return Err(SendError::RateLimited(wait));
                    }
                    rate_retries += 1;
                    tracing::info!(?wait, "Matrix rate limit; waiting");
                    tokio::time::sleep(wait).await;
                }
                Err(e) => return Err(classify(e)),
            }
        }
    }
}

fn is_user_id(s: &str) -> bool {
    s.strip_prefix('@')
        .and_then(|rest| rest.split_once(':'))
        .is_some_and(|(local, server)| {
            !local.is_empty() && !server.is_empty() && !s.chars().any(char::is_whitespace)
        })
}

/// Maps a failed request to what the gateway's ledger understands: a
/// refused token keeps the reply owed, and any other 4xx (a rate limit
/// that outlasted the retries included) is final.
fn classify(e: ApiError) -> SendError {
    if api::is_bad_token(&e) {
        // The account's token, not this message, is the problem: keep the
        // reply owed until the operator fixes the token.
        return SendError::Unavailable(format!(
            "the homeserver rejected the access token ({}: {})",
            e.code().unwrap_or_default(),
            e.message()
        ));
    }
    match e.status() {
        Some(400..=499) => SendError::Rejected(e.reason()),
        _ => e.classify(),
    }
}

#[async_trait]
impl Adapter for MatrixAdapter {
    fn platform(&self) -> &'static str {
        PLATFORM
    }

    async fn whoami(&self) -> Option<Result<String, AdapterError>> {
        Some(self.identify().await.map(|me| match me.display_name {
            Some(name) => format!("{} ({name})", me.user_id),
            None => me.user_id,
        }))
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn credential(&self) -> Option<(&'static str, String)> {
        Some(("matrix-access-token", self.token.expose().to_owned()))
    }

    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        ctx.liveness.set(Liveness::Connecting);
        let me = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = self.identify() => r?,
        };
        tracing::info!(user = %me.user_id, "connected to the Matrix homeserver");
        tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = self.set_up_crypto(&me) => r?,
        }
        let mut since = lock(&self.since).clone();
        if since.is_none() {
            // The first run of this process: what earlier ones knew.
            self.load_rooms(&me).await?;
            since = self
                .cursors
                .cursor(PLATFORM, &Self::cursor_name(&me.user_id))
                .await
                .map_err(|e| {
                    AdapterError::Disconnected(format!(
                        "cannot read the saved Matrix sync token: {e}"
                    ))
                })?;
        }
        tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            () = self.load_account_direct(&me) => {}
        }
        let mut failures = 0u32;
        loop {
            let initial = since.is_none();
            let timeout = if initial {
                Duration::ZERO
            } else {
                self.sync_timeout
            };
            let synced = tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => return Ok(()),
                r = self.sync(since.as_deref(), timeout) => r,
            };
            let error = match synced {
                Ok(batch) => match batch.get("next_batch").and_then(Value::as_str) {
                    Some(next) => {
                        ctx.liveness.set(Liveness::Live);
                        self.absorb(&batch, &me);
                        // Room keys first: this batch's messages may need them.
                        let keys = match self.take_keys(&batch, &me, &ctx).await {
                            Err(KeysNotTaken::Stopped) => return Ok(()),
                            Err(KeysNotTaken::Retry(why)) => Some(why),
                            Ok(()) => None,
                        };
                        self.accept_invites(&batch, &me, &ctx).await;
                        let handed = if let Some(why) = keys {
                            HandOver::Retry(HttpError::new(
                                api::HOMESERVER,
                                Failure::Other(format!(
                                    "cannot keep this sync's encryption keys: {why}"
                                )),
                            ))
                        } else if initial {
                            let skipped = batch
                                .pointer("/rooms/join")
                                .and_then(Value::as_object)
                                .map_or(0, |rooms| {
                                    rooms
                                        .values()
                                        .filter_map(|r| r.pointer("/timeline/events"))
                                        .filter_map(Value::as_array)
                                        .map(Vec::len)
                                        .sum::<usize>()
                                });
                            tracing::info!(
                                skipped,
                                "first Matrix sync: older messages are not answered, only newer ones"
                            );
                            HandOver::Done
                        } else {
                            self.hand_over(&batch, &me, &ctx).await
                        };
                        match handed {
                            HandOver::Done => {
                                failures = 0;
                                // Before the token: a crash in between
                                // re-delivers the batch, never skips it.
                                self.save_rooms(&me).await;
                                self.advance(next, &me).await;
                                since = Some(next.to_owned());
                                continue;
                            }
                            HandOver::Stopped => return Ok(()),
                            HandOver::Retry(e) => e,
                        }
                    }
                    None => HttpError::new(
                        api::HOMESERVER,
                        Failure::Other("a sync answer without next_batch".into()),
                    ),
                },
                Err(e) if api::is_bad_token(&e) => {
                    return Err(AdapterError::Fatal(format!(
                        "the homeserver rejected the access token ({e}); check MATRIX_ACCESS_TOKEN"
                    )));
                }
                Err(e) => e,
            };
            failures += 1;
            ctx.liveness.set(Liveness::Degraded);
            tracing::warn!(failures, "Matrix sync failed: {error}");
            if failures >= self.max_sync_failures {
                return Err(AdapterError::Disconnected(error.to_string()));
            }
            let backoff = error
                .retry_after()
                .unwrap_or_else(|| self.retry_base.saturating_mul(1 << (failures - 1).min(10)));
            tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(backoff.min(MAX_BACKOFF)) => {}
            }
        }
    }

    /// Sends one message. A retry of a message whose earlier send did not
    /// succeed reuses its transaction id (see `txn_for`), so the
    /// homeserver posts it once however often it is retried.
    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        let content = Self::content(message)?;
        let (txn, digest) = self.txn_for(message);
        self.put_event(message, &txn, &digest, content).await
    }

    async fn download(&self, locator: &str) -> Result<Download, DownloadError> {
        if encrypted_media::is_encrypted(locator) {
            return self.media.download_encrypted(locator).await;
        }
        self.media.download(locator).await
    }

    /// Uploads the file, then posts it as a message in the room. A retry
    /// uploads again (the upload itself has no idempotency key) but posts
    /// under the same transaction id, so the room shows the file once.
    async fn send_file(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        // An encrypted room gets an encrypted file: the server never
        // holds its bytes or its name in the clear.
        let (mut content, size) = if self.room_encryption(&file.chat_id).await?.is_some() {
            let (object, size) = self.media.upload_encrypted(file).await?;
            (media::encrypted_file_content(file, object, size), size)
        } else {
            let (content_uri, size) = self.media.upload(file).await?;
            (media::file_content(file, &content_uri, size), size)
        };
        outbox::relate(
            &mut content,
            file.thread_id.as_deref(),
            file.reply_to.as_deref(),
        );
        let content = outbox::fit(content)?;
        // The transaction is keyed by what the file is, not by the fresh
        // upload's address, which differs on every try.
        let key = OutboundMessage {
            chat_id: file.chat_id.clone(),
            thread_id: file.thread_id.clone(),
            reply_to: file.reply_to.clone(),
            text: format!(
                "\u{1}file\u{1}{}\u{1}{}\u{1}{size}\u{1}{}",
                file.path.display(),
                file.name,
                file.caption.as_deref().unwrap_or("")
            ),
            choices: Vec::new(),
        };
        let (txn, digest) = self.txn_for(&key);
        self.put_event(&key, &txn, &digest, content).await
    }

    async fn typing(&self, chat_id: &str, _thread_id: Option<&str>) -> Result<(), SendError> {
        let user = self.own_user_id().await?;
        let path = format!("/rooms/{}/typing/{}", segment(chat_id), segment(&user));
        self.api
            .request::<Value>(
                Method::PUT,
                &path,
                &[],
                Some(&json!({ "typing": true, "timeout": 30_000 })),
                REQUEST_TIMEOUT,
            )
            .await
            .map(|_| ())
            .map_err(classify)
    }
}

/// The registry's entry for Matrix.
pub const ENTRY: Platform = Platform {
    name: PLATFORM,
    title: "Matrix",
    standalone: true,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<MatrixConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let store_root = setup
        .home
        .root()
        .join("platforms")
        .join(PLATFORM)
        .join("crypto");
    let Some(settings) =
        MatrixSettings::from_config(&setup.section()?, setup.env, Some(store_root))
            .map_err(BuildError::misconfigured)?
    else {
        return Ok(None);
    };
    let adapter =
        MatrixAdapter::new(settings, setup.cursors.clone()).map_err(BuildError::set_up)?;
    Ok(Some(Built::connected(adapter)))
}

#[cfg(test)]
mod tests;
