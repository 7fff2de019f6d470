//! The Matrix adapter: a hand-written client for the client-server API
//! (no end-to-end encryption).
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

mod api;
mod format;
mod mapping;
mod rooms;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Method;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use talaria_adapter::auth::{AuthPolicy, Decision};
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, ChatType, Liveness, MessageLimits, OutboundMessage,
    SendError, SentMessage, SessionSource,
};
use talaria_adapter::{Capabilities, LengthUnit, Markup};
use talaria_core::Env;
use talaria_core::config::MatrixConfig;
use talaria_store::CursorStore;

use api::{Api, ApiError, segment};
use mapping::{Conversation, Me};
use rooms::Rooms;

/// The platform's name in keys, config and environment variables.
pub const PLATFORM: &str = "matrix";

/// The longest message sent, in characters. Matrix caps a whole event at
/// 65,536 bytes, and a message carries its text twice (plain and HTML);
/// at this length even text of four-byte characters fits once the HTML is
/// dropped (see [`MAX_CONTENT_BYTES`]).
pub const MAX_MESSAGE_LEN: usize = 14_000;

/// What a Matrix room can do; also used to judge inviters.
const CAPABILITIES: Capabilities = Capabilities {
    threads: true,
    markup: Markup::Html,
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
    pub access_token: String,
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
}

impl fmt::Debug for MatrixSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MatrixSettings")
            .field("homeserver", &self.homeserver)
            .field(
                "access_token",
                &talaria_core::config::mask(&self.access_token),
            )
            .field("user_id", &self.user_id)
            .field("require_mention", &self.require_mention)
            .field("sync_timeout", &self.sync_timeout)
            .field("retry_base", &self.retry_base)
            .field("max_sync_failures", &self.max_sync_failures)
            .finish_non_exhaustive()
    }
}

impl MatrixSettings {
    /// Settings from `platforms.matrix` and the environment, or `None` when
    /// Matrix is off: `enabled: false`, or no homeserver (config or
    /// `MATRIX_HOMESERVER`) or no token (config or `MATRIX_ACCESS_TOKEN`).
    /// `MATRIX_USER_ID` stands in for `platforms.matrix.user_id`.
    pub fn from_config(config: &MatrixConfig, env: &Env) -> Option<MatrixSettings> {
        if config.enabled == Some(false) {
            return None;
        }
        let pick = |configured: Option<String>, var: &str| {
            configured
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .or_else(|| {
                    env.get(var)
                        .map(|v| v.trim().to_owned())
                        .filter(|v| !v.is_empty())
                })
        };
        let homeserver = pick(config.homeserver.clone(), "MATRIX_HOMESERVER");
        let token = pick(
            config.access_token.as_ref().map(|s| s.expose().to_owned()),
            "MATRIX_ACCESS_TOKEN",
        );
        let (Some(homeserver), Some(access_token)) = (homeserver, token) else {
            if config.enabled == Some(true) {
                tracing::warn!(
                    "platforms.matrix.enabled is true but the homeserver or the access token \
                     is missing (platforms.matrix.homeserver / MATRIX_HOMESERVER, \
                     platforms.matrix.access_token / MATRIX_ACCESS_TOKEN)"
                );
            }
            return None;
        };
        Some(MatrixSettings {
            homeserver,
            access_token,
            user_id: pick(config.user_id.clone(), "MATRIX_USER_ID"),
            require_mention: config.require_mention,
            sync_timeout: Duration::from_millis(config.sync_timeout_ms),
            retry_base: Duration::from_millis(500),
            max_sync_failures: 5,
            invite_policy: Some(AuthPolicy::from_env(env)),
        })
    }
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
    token: String,
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
        let token = settings.access_token.trim().to_owned();
        if token.is_empty()
            || token
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
        let api = Api::new(&homeserver, &token).map_err(MatrixError::Client)?;
        Ok(MatrixAdapter {
            api,
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
            .request(Method::GET, "account/whoami", &[], None, REQUEST_TIMEOUT)
            .await;
        let user_id = match whoami {
            Ok(v) => v
                .get("user_id")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| {
                    AdapterError::Disconnected("whoami answered without a user_id".into())
                })?,
            Err(e) if e.is_bad_token() => {
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
        let path = format!("profile/{}/displayname", segment(&user_id));
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
            .request(Method::GET, "sync", &query, None, http_timeout)
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

    /// Whether `room_id` is a direct chat, asking the homeserver for its
    /// member count when it is not known. `Err` is a failure worth a retry
    /// of the whole batch (the homeserver is unreachable or busy): a guess
    /// would drop the messages for good.
    async fn room_is_dm(&self, room_id: &str, ctx: &AdapterContext) -> Result<bool, ApiError> {
        if lock(&self.rooms).joined(room_id).is_some() {
            return Ok(lock(&self.rooms).is_dm(room_id));
        }
        let path = format!("rooms/{}/joined_members", segment(room_id));
        let answer = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(lock(&self.rooms).is_dm(room_id)),
            r = self.api.request::<Value>(Method::GET, &path, &[], None, REQUEST_TIMEOUT) => r,
        };
        let mut rooms = lock(&self.rooms);
        match answer {
            Ok(v) => match v.get("joined").and_then(Value::as_object) {
                Some(members) => {
                    rooms.set_joined(room_id, members.len() as u64);
                }
                None => {
                    tracing::warn!(room = %room_id, "joined_members answered without a member list")
                }
            },
            Err(e)
                if matches!(&e, ApiError::Api { status, .. } if (400..500).contains(status))
                    && !e.is_rate_limit()
                    && !e.is_bad_token() =>
            {
                // Refused for good (the bot is no longer in the room, a
                // server without the endpoint): decide without the count.
                tracing::warn!(room = %room_id, "cannot ask the room's members: {e}");
            }
            Err(e) => return Err(e),
        }
        Ok(rooms.is_dm(room_id))
    }

    /// Reads the saved room record, once per process.
    async fn load_rooms(&self, me: &Me) -> Result<(), AdapterError> {
        let saved = self
            .cursors
            .cursor(PLATFORM, &Rooms::record_name(&me.user_id))
            .await
            .map_err(|e| {
                AdapterError::Disconnected(format!("cannot read the saved Matrix rooms: {e}"))
            })?;
        if let Some(record) = saved {
            lock(&self.rooms).load(&record);
        }
        Ok(())
    }

    /// Asks for the account's `m.direct` data, which a sync with a token
    /// only carries when it changed. Best effort: the member counts decide
    /// first anyway.
    async fn load_account_direct(&self, me: &Me) {
        let path = format!("user/{}/account_data/m.direct", segment(&me.user_id));
        match self
            .api
            .request::<Value>(Method::GET, &path, &[], None, REQUEST_TIMEOUT)
            .await
        {
            Ok(content) => lock(&self.rooms).set_account_direct(&content),
            Err(ApiError::Api { status: 404, .. }) => {}
            Err(e) => tracing::debug!("cannot read the account's m.direct data: {e}"),
        }
    }

    /// Saves the room record when it changed.
    async fn save_rooms(&self, me: &Me) {
        let Some(record) = lock(&self.rooms).record() else {
            return;
        };
        match self
            .cursors
            .set_cursor(PLATFORM, &Rooms::record_name(&me.user_id), &record)
            .await
        {
            Ok(()) => lock(&self.rooms).saved(),
            // Still dirty: the next batch tries again.
            Err(e) => tracing::warn!("cannot save what is known of the Matrix rooms: {e}"),
        }
    }

    /// Joins the rooms the bot was invited to by someone the runner would
    /// let in (or who could pair, in a direct chat).
    async fn accept_invites(&self, sync: &Value, me: &Me, ctx: &AdapterContext) {
        let Some(invites) = sync.pointer("/rooms/invite").and_then(Value::as_object) else {
            return;
        };
        for (room_id, room) in invites {
            let invite = room
                .pointer("/invite_state/events")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|e| {
                    e.get("type").and_then(Value::as_str) == Some("m.room.member")
                        && e.get("state_key").and_then(Value::as_str) == Some(me.user_id.as_str())
                });
            let inviter = invite
                .and_then(|e| e.get("sender"))
                .and_then(Value::as_str)
                .unwrap_or("");
            let is_direct = invite
                .and_then(|e| e.pointer("/content/is_direct"))
                .and_then(Value::as_bool)
                == Some(true);
            if !self.may_invite(room_id, inviter, is_direct) {
                tracing::info!(room = %room_id, inviter, "ignoring an invite from someone who may not use the bot");
                continue;
            }
            let path = format!("join/{}", segment(room_id));
            let empty = json!({});
            let joined = tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => return,
                r = self.api.request::<Value>(Method::POST, &path, &[], Some(&empty), REQUEST_TIMEOUT) => r,
            };
            match joined {
                Ok(_) => {
                    tracing::info!(room = %room_id, inviter, "joined a room on invite");
                    if is_direct {
                        lock(&self.rooms).set_direct(room_id);
                    }
                }
                Err(e) => tracing::warn!(room = %room_id, "cannot join the room: {e}"),
            }
        }
    }

    fn may_invite(&self, room_id: &str, inviter: &str, is_direct: bool) -> bool {
        let Some(policy) = &self.invite_policy else {
            return true;
        };
        if inviter.is_empty() {
            return false;
        }
        let source = SessionSource {
            platform: PLATFORM.to_owned(),
            chat_id: room_id.to_owned(),
            chat_name: None,
            chat_type: if is_direct {
                ChatType::Dm
            } else {
                ChatType::Group
            },
            user_id: Some(inviter.to_owned()),
            user_name: None,
            thread_id: None,
            is_bot: false,
        };
        // A stranger who could pair must be able to reach the bot to get a
        // code; the runner still decides about every message.
        matches!(
            policy.decide(&source, &CAPABILITIES, false),
            Decision::Allow(_)
                | Decision::Deny {
                    offer_pairing: true
                }
        )
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
            let has_messages = events
                .iter()
                .any(|e| e.get("type").and_then(Value::as_str) == Some("m.room.message"));
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
                if kind == "m.room.encrypted" {
                    if lock(&self.rooms).warned_encrypted.insert(room_id.clone()) {
                        tracing::warn!(room = %room_id, "this room is end-to-end encrypted, which the Matrix adapter does not support yet: its messages are ignored");
                    }
                    continue;
                }
                if kind != "m.room.message" {
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
                        continue;
                    }
                };
                tokio::select! {
                    biased;
                    _ = ctx.shutdown.cancelled() => return HandOver::Stopped,
                    r = ctx.inbox.submit(event) => {
                        if r.is_err() {
                            return HandOver::Stopped;
                        }
                    }
                }
            }
        }
        HandOver::Done
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

    /// The transaction id for a send of `message`.
    ///
    /// The same message gets the same id until a send of it succeeds, so
    /// the ledger's retry of a send that timed out (and may have arrived)
    /// is deduplicated by the homeserver. Once it succeeded, sending the
    /// same text again is a new message and gets the next sequence number.
    /// The per-process nonce keeps ids from an earlier run (whose
    /// sequence numbers started over) from colliding; a reply recovered
    /// after a crash carries the recovery line, so it is a new text anyway.
    fn txn_for(&self, message: &OutboundMessage) -> (String, String) {
        let mut h = Sha256::new();
        for part in [
            message.chat_id.as_str(),
            message.thread_id.as_deref().unwrap_or(""),
            message.reply_to.as_deref().unwrap_or(""),
            message.text.as_str(),
        ] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
        let digest: String = h
            .finalize()
            .iter()
            .take(12)
            .map(|b| format!("{b:02x}"))
            .collect();
        let mut txns = lock(&self.txns);
        if txns.len() >= MAX_REMEMBERED {
            txns.retain(|_, (_, pending)| *pending);
        }
        let seq = match txns.get_mut(&digest) {
            Some((seq, pending)) if *pending => *seq,
            Some((seq, pending)) => {
                *seq += 1;
                *pending = true;
                *seq
            }
            None => {
                txns.insert(digest.clone(), (0, true));
                0
            }
        };
        (format!("talaria.{}.{digest}.{seq}", self.nonce), digest)
    }

    fn txn_done(&self, digest: &str) {
        if let Some((_, pending)) = lock(&self.txns).get_mut(digest) {
            *pending = false;
        }
    }

    /// The content of a message event for `message`.
    fn content(message: &OutboundMessage) -> Result<Value, SendError> {
        let mut content = json!({
            "msgtype": "m.text",
            "body": message.text,
            "format": "org.matrix.custom.html",
            "formatted_body": format::to_html(&message.text),
        });
        match (&message.thread_id, &message.reply_to) {
            (Some(root), reply) => {
                content["m.relates_to"] = json!({
                    "rel_type": "m.thread",
                    "event_id": root,
                    "is_falling_back": true,
                    "m.in_reply_to": { "event_id": reply.as_deref().unwrap_or(root) },
                });
            }
            (None, Some(reply)) => {
                content["m.relates_to"] = json!({ "m.in_reply_to": { "event_id": reply } });
            }
            (None, None) => {}
        }
        if content.to_string().len() > MAX_CONTENT_BYTES {
            if let Some(obj) = content.as_object_mut() {
                obj.remove("format");
                obj.remove("formatted_body");
            }
            let size = content.to_string().len();
            if size > MAX_CONTENT_BYTES {
                return Err(SendError::Rejected(format!(
                    "the message is {size} bytes, more than a Matrix event can carry"
                )));
            }
        }
        Ok(content)
    }

    async fn own_user_id(&self) -> Result<String, SendError> {
        if let Some(u) = self.user_id() {
            return Ok(u);
        }
        let v: Value = self
            .api
            .request(Method::GET, "account/whoami", &[], None, REQUEST_TIMEOUT)
            .await
            .map_err(classify)?;
        v.get("user_id")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| SendError::Transient("whoami answered without a user_id".into()))
    }
}

fn is_user_id(s: &str) -> bool {
    s.strip_prefix('@')
        .and_then(|rest| rest.split_once(':'))
        .is_some_and(|(local, server)| {
            !local.is_empty() && !server.is_empty() && !s.chars().any(char::is_whitespace)
        })
}

/// Maps a failed request to what the gateway's ledger understands.
fn classify(e: ApiError) -> SendError {
    match e {
        ApiError::Api {
            status,
            errcode,
            message,
            ..
        } if status == 401 || matches!(errcode.as_str(), "M_UNKNOWN_TOKEN" | "M_MISSING_TOKEN") => {
            // The account's token, not this message, is the problem: keep
            // the reply owed until the operator fixes the token.
            SendError::Unavailable(format!(
                "the homeserver rejected the access token ({errcode}: {message})"
            ))
        }
        ApiError::Api {
            status,
            errcode,
            message,
            ..
        } if (400..500).contains(&status) => {
            SendError::Rejected(format!("{status} {errcode}: {message}"))
        }
        ApiError::Api {
            status,
            errcode,
            message,
            ..
        } => SendError::Transient(format!("{status} {errcode}: {message}")),
        ApiError::Connect(m) => SendError::Unavailable(m),
        ApiError::Timeout(m) | ApiError::Other(m) => SendError::Ambiguous(m),
    }
}

#[async_trait]
impl Adapter for MatrixAdapter {
    fn platform(&self) -> &'static str {
        PLATFORM
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn credential(&self) -> Option<(&'static str, String)> {
        Some(("matrix-access-token", self.token.clone()))
    }

    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        ctx.liveness.set(Liveness::Connecting);
        let me = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = self.identify() => r?,
        };
        tracing::info!(user = %me.user_id, "connected to the Matrix homeserver");
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
                        self.accept_invites(&batch, &me, &ctx).await;
                        let handed = if initial {
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
                    None => ApiError::Other("a sync answer without next_batch".into()),
                },
                Err(e) if e.is_bad_token() => {
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
        let path = format!(
            "rooms/{}/send/m.room.message/{}",
            segment(&message.chat_id),
            segment(&txn)
        );
        let mut rate_retries = 0;
        loop {
            let result: Result<Value, ApiError> = self
                .api
                .request(Method::PUT, &path, &[], Some(&content), REQUEST_TIMEOUT)
                .await;
            match result {
                Ok(v) => {
                    self.txn_done(&digest);
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
                Err(e) if e.is_rate_limit() => {
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

    async fn typing(&self, chat_id: &str, _thread_id: Option<&str>) -> Result<(), SendError> {
        let user = self.own_user_id().await?;
        let path = format!("rooms/{}/typing/{}", segment(chat_id), segment(&user));
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

#[cfg(test)]
mod tests {
    use super::*;

    struct NoCursors;
    #[async_trait]
    impl CursorStore for NoCursors {
        async fn cursor(&self, _: &str, _: &str) -> talaria_store::Result<Option<String>> {
            Ok(None)
        }
        async fn set_cursor(&self, _: &str, _: &str, _: &str) -> talaria_store::Result<()> {
            Ok(())
        }
        async fn delete_cursor(&self, _: &str, _: &str) -> talaria_store::Result<bool> {
            Ok(false)
        }
    }

    fn settings(token: &str, homeserver: &str) -> MatrixSettings {
        MatrixSettings {
            homeserver: homeserver.into(),
            access_token: token.into(),
            user_id: None,
            require_mention: true,
            sync_timeout: Duration::from_secs(1),
            retry_base: Duration::from_millis(10),
            max_sync_failures: 3,
            invite_policy: None,
        }
    }

    fn adapter(token: &str, homeserver: &str) -> Result<MatrixAdapter, MatrixError> {
        MatrixAdapter::new(settings(token, homeserver), Arc::new(NoCursors))
    }

    fn out(text: &str) -> OutboundMessage {
        OutboundMessage {
            chat_id: "!r:example.org".into(),
            thread_id: None,
            reply_to: Some("$e".into()),
            text: text.into(),
        }
    }

    #[test]
    fn from_config_reads_config_then_environment() {
        let empty = Env::from_pairs(Vec::<(String, String)>::new());
        let env = Env::from_pairs([
            ("MATRIX_HOMESERVER", "https://hs.example.org"),
            ("MATRIX_ACCESS_TOKEN", "syt_env"),
            ("MATRIX_USER_ID", "@bot:example.org"),
        ]);
        let mut cfg = MatrixConfig::default();
        assert!(MatrixSettings::from_config(&cfg, &empty).is_none());
        let s = MatrixSettings::from_config(&cfg, &env).unwrap();
        assert_eq!(s.homeserver, "https://hs.example.org");
        assert_eq!(s.access_token, "syt_env");
        assert_eq!(s.user_id.as_deref(), Some("@bot:example.org"));
        assert!(s.require_mention, "mentions are required by default");
        assert_eq!(s.sync_timeout, Duration::from_secs(30));
        cfg.access_token = Some(talaria_core::Secret::new("syt_cfg"));
        cfg.homeserver = Some("http://127.0.0.1:8008".into());
        let s = MatrixSettings::from_config(&cfg, &env).unwrap();
        assert_eq!(s.access_token, "syt_cfg");
        assert_eq!(s.homeserver, "http://127.0.0.1:8008");
        cfg.enabled = Some(false);
        assert!(MatrixSettings::from_config(&cfg, &env).is_none());
    }

    #[test]
    fn new_validates_and_debug_hides_the_token() {
        assert_eq!(adapter("", "http://x").err(), Some(MatrixError::BadToken));
        assert_eq!(
            adapter("a b", "http://x").err(),
            Some(MatrixError::BadToken)
        );
        assert!(matches!(
            adapter("syt_a", "ftp://x"),
            Err(MatrixError::BadHomeserver(_))
        ));
        let mut s = settings("syt_a", "http://x");
        s.user_id = Some("bot".into());
        assert!(matches!(
            MatrixAdapter::new(s, Arc::new(NoCursors)),
            Err(MatrixError::BadUserId(_))
        ));
        let s = settings("syt_SECRETSECRETSECRET", "http://127.0.0.1:1");
        assert!(!format!("{s:?}").contains("SECRETSECRET"));
        let a = MatrixAdapter::new(s, Arc::new(NoCursors)).unwrap();
        assert!(!format!("{a:?}").contains("SECRETSECRET"));
    }

    #[test]
    fn a_retry_reuses_the_transaction_id_and_a_new_message_does_not() {
        let a = adapter("syt_a", "http://x").unwrap();
        let (first, digest) = a.txn_for(&out("hello"));
        let (retry, _) = a.txn_for(&out("hello"));
        assert_eq!(first, retry, "an unconfirmed send is retried under its id");
        a.txn_done(&digest);
        let (again, _) = a.txn_for(&out("hello"));
        assert_ne!(
            first, again,
            "the same text after a success is a new message"
        );
        let (other, _) = a.txn_for(&out("hello!"));
        assert_ne!(other, again);
        let mut threaded = out("hello");
        threaded.thread_id = Some("$root".into());
        assert_ne!(a.txn_for(&threaded).0, again);
        // Another process never reuses this one's ids.
        let b = adapter("syt_a", "http://x").unwrap();
        assert_ne!(b.txn_for(&out("hello")).0, first);
    }

    #[test]
    fn content_carries_html_threads_and_replies() {
        let c = MatrixAdapter::content(&out("**hi**")).unwrap();
        assert_eq!(c["body"], "**hi**");
        assert_eq!(c["formatted_body"], "<p><strong>hi</strong></p>");
        assert_eq!(c["m.relates_to"]["m.in_reply_to"]["event_id"], "$e");
        let mut m = out("x");
        m.thread_id = Some("$root".into());
        m.reply_to = None;
        let c = MatrixAdapter::content(&m).unwrap();
        assert_eq!(c["m.relates_to"]["rel_type"], "m.thread");
        assert_eq!(c["m.relates_to"]["event_id"], "$root");
        assert_eq!(c["m.relates_to"]["m.in_reply_to"]["event_id"], "$root");
        // Too big with HTML: plain only; too big even so: refused.
        let big = "€".repeat(MAX_MESSAGE_LEN);
        let c = MatrixAdapter::content(&out(&big)).unwrap();
        assert!(c.get("formatted_body").is_none());
        let huge = "😀".repeat(MAX_MESSAGE_LEN * 2);
        assert!(matches!(
            MatrixAdapter::content(&out(&huge)),
            Err(SendError::Rejected(_))
        ));
    }

    #[tokio::test]
    async fn connection_refused_is_unavailable_and_redacted() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let a = adapter(
            "syt_SECRETSECRETSECRET",
            &format!("http://127.0.0.1:{port}"),
        )
        .unwrap();
        let err = a.send(&out("hi")).await.unwrap_err();
        assert!(matches!(err, SendError::Unavailable(_)), "{err:?}");
        assert!(!err.to_string().contains("SECRETSECRET"), "{err}");
    }
}
