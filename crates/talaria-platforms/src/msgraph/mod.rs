//! The Microsoft Graph adapter: Teams chat and channel messages and
//! Outlook mail through Graph change notifications, answered through
//! Graph's REST API.
//!
//! Graph posts a notification naming the changed message to
//! `/msgraph/webhook` on the shared listener ([`crate::ingress`]); the
//! adapter fetches the message with an app-only token and hands it over.
//! Answers go back as a chat message, a reply in the channel thread, or a
//! mail reply in the conversation.
//!
//! Conversations are keyed `chat:<chat id>` (one-to-one chats are DMs,
//! group and meeting chats are shared), `channel:<team id>/<channel id>`
//! (shared; each thread, a post and its replies, is a thread), and
//! `mail:<mailbox user id>/<sender address>` (a DM threaded by Outlook's
//! conversation id). `MSGRAPH_ALLOWED_USERS` lists Entra ID user object
//! ids, and sender addresses for mail.
//!
//! # Layout
//!
//! - this file: [`MsGraphSettings`] (from `platforms.msgraph` and the
//!   environment), [`MsGraphAdapter`] and its [`Adapter`] impl: `run`
//!   makes the subscriptions once the listener is up, then runs the
//!   worker that fetches what the journal holds and the keeper that
//!   renews subscriptions and acts on lifecycle events; the sends.
//! - `server`: the notification routes, in processing order, and the
//!   journal.
//! - `mapping`: resource paths, Graph's messages and what they become.
//! - `api`: the tokens and the REST calls.
//!
//! # Invariants
//!
//! - A notification is answered 202 only once its item is in the journal
//!   in the store; the item leaves the journal only once the runner took
//!   (or decided on) its message, or Graph says the message is gone. A
//!   gateway killed in between fetches it at its next start.
//! - Every item's `clientState` is compared with ours in constant time;
//!   one that differs is never acted on.
//! - A message is handed over once per process (by notification id and
//!   by message id; the runner drops repeats across restarts by message
//!   id), and the app's own messages are never handed over.
//! - Subscriptions are created only after the listener serves Graph's
//!   handshake, renewed before they expire (by the injected clock),
//!   created again when Graph no longer knows them, and deleted when the
//!   gateway stops (unless `delete_on_shutdown: false`).
//! - The client secret, the client state and the tokens are never logged
//!   nor part of an error message; `Debug` masks them.

mod api;
mod config;
mod mapping;
mod server;

use crate::registry::{BuildError, Built, Platform, Setup};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Capabilities, ChatType, Inbox, LengthUnit, Liveness,
    MessageLimits, OutboundMessage, SendError, SenderIds, SentMessage,
};
use talaria_core::config::{secret_or_env, text_or_env};
use talaria_core::{Env, Secret};
use talaria_store::CursorStore;
use tokio::sync::Notify;

use crate::http::{Failure, HttpError};
use crate::ingress::{InboxSlot, Mount};
use crate::seen::Seen;
use api::{As, Credentials, Graph};
use mapping::{Item, Mapped, Me};
use server::{Hook, Journal, Lifecycle, Pending};

pub use config::{ENV, MsGraphConfig};
pub use server::{LIFECYCLE_PATH, WEBHOOK_PATH};

/// The platform name in session keys, config and allowlists
/// (`MSGRAPH_ALLOWED_USERS`).
pub const PLATFORM: &str = "msgraph";

/// Answers are split at this many characters (Teams takes about 28 KB).
pub const MAX_TEXT_CHARS: usize = 4000;

/// The subscriptions' name in the cursor store.
const SUBSCRIPTIONS: &str = "subscriptions";

/// Waits longer than this are not worth holding a send for.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(60);

/// Messages listed per resource in a resync.
const RESYNC_TOP: usize = 20;

/// The most accepted changes kept waiting.
const JOURNAL_CAP: usize = 5000;

/// Where "now" comes from, so tests can move it.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time.
    fn now(&self) -> SystemTime;
}

/// The system's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// What the adapter needs, resolved from `platforms.msgraph` and the
/// environment.
#[derive(Debug, Clone)]
pub struct MsGraphSettings {
    /// The secret every notification must carry.
    pub client_state: Secret,
    /// The Entra ID tenant.
    pub tenant_id: String,
    /// The app registration's client id.
    pub client_id: String,
    /// Its client secret.
    pub client_secret: Secret,
    /// The app token's scope.
    pub scope: String,
    /// The token authority's root.
    pub authority_url: String,
    /// The Graph API root.
    pub graph_url: String,
    /// The public origin of the shared listener.
    pub public_url: String,
    /// The resources subscribed to.
    pub resources: Vec<String>,
    /// Notifications for other resources are refused; empty accepts all.
    pub accepted_resources: Vec<String>,
    /// How long a subscription is made to last.
    pub subscription_lifetime: Duration,
    /// Renewed when less than this is left.
    pub renew_before: Duration,
    /// How often the keeper looks at the expiries.
    pub check_every: Duration,
    /// Deleted when the gateway stops.
    pub delete_on_shutdown: bool,
    /// Shared chats need a mention.
    pub require_mention: bool,
    /// The delegated refresh token, for posting to chats and channels.
    pub delegated_refresh_token: Option<Secret>,
    /// Or a delegated access token, used as is.
    pub delegated_access_token: Option<Secret>,
    /// The scope asked for with the refresh token.
    pub delegated_scope: String,
    /// Larger bodies get 413.
    pub max_body_bytes: usize,
    /// Ids remembered against repeats.
    pub max_seen: usize,
    /// How long one API call may take.
    pub send_timeout: Duration,
    /// Retries after a rate limit before a send reports
    /// [`SendError::RateLimited`].
    pub rate_limit_retries: u32,
    /// The wait after a rate limit that names none; doubled each time.
    pub rate_limit_wait: Duration,
    /// The wait before fetching a journal item again after a failure.
    pub retry_wait: Duration,
    /// Messages older than this are not handed over by a resync.
    pub resync_window: Duration,
    /// Where "now" comes from.
    pub clock: Arc<dyn Clock>,
}

/// Why the adapter cannot be configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MsGraphError {
    /// Microsoft Graph is on, but settings are missing; each is named as
    /// its environment variable and its config key.
    #[error(
        "Microsoft Graph is missing {}; set them in the environment or .env (or under \
         platforms.msgraph in config.yaml), or turn it off with platforms.msgraph.enabled: false",
        .0.join(", ")
    )]
    Missing(Vec<&'static str>),
    /// A setting is there but unusable; the message names it.
    #[error("Microsoft Graph: {0}")]
    Invalid(String),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// The configured value when it differs from the default, else the
/// variable's, else the default.
fn default_or_env(configured: &str, default: &str, env: &Env, var: &str) -> String {
    if configured != default {
        return configured.to_owned();
    }
    env.get(var)
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .unwrap_or(default)
        .to_owned()
}

fn list_or_env(configured: &[String], env: &Env, var: &str) -> Vec<String> {
    if !configured.is_empty() {
        return configured.to_vec();
    }
    env.get(var)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

impl MsGraphSettings {
    /// The settings, or `None` when Microsoft Graph is off:
    /// `enabled: false` or `MSGRAPH_WEBHOOK_ENABLED=false`, or neither
    /// says on and no client state is set.
    ///
    /// # Errors
    /// [`MsGraphError::Missing`] naming every missing setting when it is
    /// on: the client state (the gateway refuses to start without it),
    /// the app registration, the public URL and the resources.
    pub fn from_config(
        config: &MsGraphConfig,
        env: &Env,
    ) -> Result<Option<MsGraphSettings>, MsGraphError> {
        let switch = config.enabled.or(env.flag("MSGRAPH_WEBHOOK_ENABLED"));
        if switch == Some(false) {
            return Ok(None);
        }
        let client_state = secret_or_env(
            config.client_state.as_ref(),
            env,
            "MSGRAPH_WEBHOOK_CLIENT_STATE",
        );
        if switch.is_none() && client_state.is_none() {
            return Ok(None);
        }
        let text = |c: &Option<String>, var| text_or_env(c.as_deref(), env, var);
        let tenant = text(&config.tenant_id, "MSGRAPH_TENANT_ID");
        let client_id = text(&config.client_id, "MSGRAPH_CLIENT_ID");
        let client_secret =
            secret_or_env(config.client_secret.as_ref(), env, "MSGRAPH_CLIENT_SECRET");
        let public_url = text(&config.public_url, "MSGRAPH_WEBHOOK_PUBLIC_URL");
        let resources = config.resources.clone();
        let missing: Vec<&'static str> = [
            (
                client_state.is_none(),
                "MSGRAPH_WEBHOOK_CLIENT_STATE (platforms.msgraph.client_state)",
            ),
            (
                tenant.is_none(),
                "MSGRAPH_TENANT_ID (platforms.msgraph.tenant_id)",
            ),
            (
                client_id.is_none(),
                "MSGRAPH_CLIENT_ID (platforms.msgraph.client_id)",
            ),
            (
                client_secret.is_none(),
                "MSGRAPH_CLIENT_SECRET (platforms.msgraph.client_secret)",
            ),
            (
                public_url.is_none(),
                "MSGRAPH_WEBHOOK_PUBLIC_URL (platforms.msgraph.public_url)",
            ),
            (resources.is_empty(), "platforms.msgraph.resources"),
        ]
        .into_iter()
        .filter_map(|(missing, name)| missing.then_some(name))
        .collect();
        let (
            Some(client_state),
            Some(tenant_id),
            Some(client_id),
            Some(client_secret),
            Some(public_url),
            true,
        ) = (
            client_state,
            tenant,
            client_id,
            client_secret,
            public_url,
            missing.is_empty(),
        )
        else {
            return Err(MsGraphError::Missing(missing));
        };
        let minutes = |m: u64| Duration::from_secs(m * 60);
        let defaults = MsGraphConfig::default();
        Ok(Some(MsGraphSettings {
            client_state,
            tenant_id,
            client_id,
            client_secret,
            scope: default_or_env(&config.scope, &defaults.scope, env, "MSGRAPH_SCOPE"),
            authority_url: default_or_env(
                &config.authority_url,
                &defaults.authority_url,
                env,
                "MSGRAPH_AUTHORITY_URL",
            ),
            graph_url: config.graph_url.clone(),
            public_url,
            resources,
            accepted_resources: list_or_env(
                &config.accepted_resources,
                env,
                "MSGRAPH_WEBHOOK_ACCEPTED_RESOURCES",
            ),
            subscription_lifetime: minutes(config.subscription_minutes),
            renew_before: minutes(config.renew_before_minutes),
            check_every: Duration::from_secs(60),
            delete_on_shutdown: config.delete_on_shutdown,
            require_mention: env
                .flag("MSGRAPH_REQUIRE_MENTION")
                .unwrap_or(config.require_mention),
            delegated_refresh_token: secret_or_env(
                config.delegated_refresh_token.as_ref(),
                env,
                "MSGRAPH_DELEGATED_REFRESH_TOKEN",
            ),
            delegated_access_token: secret_or_env(
                config.delegated_access_token.as_ref(),
                env,
                "MSGRAPH_DELEGATED_ACCESS_TOKEN",
            ),
            delegated_scope: config.delegated_scope.clone(),
            max_body_bytes: config.max_body_bytes,
            max_seen: config.max_seen,
            send_timeout: Duration::from_secs(30),
            rate_limit_retries: 2,
            rate_limit_wait: Duration::from_secs(1),
            retry_wait: Duration::from_secs(5),
            resync_window: Duration::from_secs(3600),
            clock: Arc::new(SystemClock),
        }))
    }
}

/// One subscription the adapter made, as kept in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Sub {
    id: String,
    resource: String,
    /// `expirationDateTime` as Graph last confirmed it.
    expires: String,
}

/// The Microsoft Graph connector (see the module docs).
pub struct MsGraphAdapter {
    graph: Arc<Graph>,
    hook: Arc<Hook>,
    store: Arc<dyn CursorStore>,
    subs: tokio::sync::Mutex<Vec<Sub>>,
    /// Message ids handed over, skipped or sent by the app.
    messages: Mutex<Seen>,
    /// Chat types by chat id.
    chats: Mutex<HashMap<String, ChatType>>,
    me: Mutex<Me>,
    settings: MsGraphSettings,
}

// By hand only because the webhook side holds no `Debug`; the
// credentials are `Secret`s either way.
impl fmt::Debug for MsGraphAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MsGraphAdapter")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

fn http_root(url: &str, key: &str) -> Result<String, MsGraphError> {
    let url = url.trim().trim_end_matches('/');
    match reqwest::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Ok(url.to_owned()),
        _ => Err(MsGraphError::Invalid(format!(
            "platforms.msgraph.{key} must be an http(s) URL; got {url:?}"
        ))),
    }
}

/// What became of one journal item.
enum Handled {
    /// Taken, decided on, or gone: forget it.
    Done,
    /// Try again later.
    Later(String),
    /// The runner is stopping.
    Closed,
}

impl MsGraphAdapter {
    /// Checks the settings and builds the client; serves nothing until
    /// [`MsGraphAdapter::mount`] is mounted on the shared listener.
    /// `store` keeps the journal and the subscriptions across restarts.
    ///
    /// # Errors
    /// An empty credential or client state, or an unusable URL, named.
    pub fn new(
        settings: MsGraphSettings,
        store: Arc<dyn CursorStore>,
    ) -> Result<MsGraphAdapter, MsGraphError> {
        let state = settings.client_state.expose();
        if state.trim().is_empty() || state.chars().count() > config::MAX_CLIENT_STATE {
            return Err(MsGraphError::Invalid(
                "the client state (MSGRAPH_WEBHOOK_CLIENT_STATE) must be 1 to 128 characters"
                    .to_owned(),
            ));
        }
        for (value, name) in [
            (settings.tenant_id.as_str(), "MSGRAPH_TENANT_ID"),
            (settings.client_id.as_str(), "MSGRAPH_CLIENT_ID"),
            (settings.client_secret.expose(), "MSGRAPH_CLIENT_SECRET"),
        ] {
            if value.trim().is_empty() {
                return Err(MsGraphError::Invalid(format!("{name} is empty")));
            }
        }
        if settings.resources.iter().any(|r| r.trim().is_empty()) {
            return Err(MsGraphError::Invalid(
                "platforms.msgraph.resources holds an empty entry".to_owned(),
            ));
        }
        if settings.max_body_bytes == 0 || settings.max_seen == 0 {
            return Err(MsGraphError::Invalid(
                "max_body_bytes and max_seen must be at least 1".to_owned(),
            ));
        }
        let public_url = http_root(&settings.public_url, "public_url")?;
        let graph = Graph::new(Credentials {
            base: http_root(&settings.graph_url, "graph_url")?,
            authority: http_root(&settings.authority_url, "authority_url")?,
            tenant: settings.tenant_id.trim().to_owned(),
            client_id: settings.client_id.trim().to_owned(),
            client_secret: settings.client_secret.clone(),
            scope: settings.scope.clone(),
            delegated_scope: settings.delegated_scope.clone(),
            refresh_token: settings.delegated_refresh_token.clone(),
            access_token: settings.delegated_access_token.clone(),
            timeout: settings.send_timeout,
        })
        .map_err(MsGraphError::Client)?;
        let hook = Arc::new(Hook {
            client_state: settings.client_state.clone(),
            accepted: settings.accepted_resources.clone(),
            max_body_bytes: settings.max_body_bytes,
            slot: InboxSlot::new(),
            journal: Arc::new(Journal::new(store.clone(), JOURNAL_CAP)),
            notes: Mutex::new(Seen::new(settings.max_seen)),
            lifecycle: Mutex::new(Default::default()),
            lifecycle_wake: Notify::new(),
        });
        Ok(MsGraphAdapter {
            graph: Arc::new(graph),
            hook,
            store,
            subs: tokio::sync::Mutex::new(Vec::new()),
            messages: Mutex::new(Seen::new(settings.max_seen)),
            chats: Mutex::new(HashMap::new()),
            me: Mutex::new(Me {
                app_id: settings.client_id.trim().to_owned(),
                user_id: None,
            }),
            settings: MsGraphSettings {
                public_url,
                ..settings
            },
        })
    }

    /// `/msgraph/webhook` and `/msgraph/lifecycle`, to mount on the
    /// shared listener.
    pub fn mount(&self) -> Mount {
        Mount {
            platform: PLATFORM,
            slot: self.hook.slot.clone(),
            routes: server::router(self.hook.clone()),
        }
    }

    fn seen_message(&self, id: &str) -> bool {
        self.messages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(id)
    }

    fn remember_message(&self, id: &str) {
        self.messages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .first(id);
    }

    fn now(&self) -> SystemTime {
        self.settings.clock.now()
    }

    // ---- subscriptions ----

    async fn load_subs(&self) -> Vec<Sub> {
        match self.store.cursor(PLATFORM, SUBSCRIPTIONS).await {
            Ok(Some(text)) => serde_json::from_str(&text).unwrap_or_default(),
            Ok(None) => Vec::new(),
            Err(e) => {
                tracing::warn!("cannot read the saved Graph subscriptions: {e}");
                Vec::new()
            }
        }
    }

    async fn save_subs(&self, subs: &[Sub]) {
        let text = serde_json::to_string(subs).unwrap_or_else(|_| "[]".to_owned());
        if let Err(e) = self.store.set_cursor(PLATFORM, SUBSCRIPTIONS, &text).await {
            tracing::warn!("cannot save the Graph subscriptions: {e}");
        }
    }

    fn expiry(&self) -> String {
        mapping::iso8601(self.now() + self.settings.subscription_lifetime)
    }

    /// `POST /subscriptions` for `resource`. Graph checks both URLs with
    /// the handshake before it answers.
    async fn create(&self, resource: &str) -> Result<Sub, HttpError> {
        let public = &self.settings.public_url;
        let body = json!({
            "changeType": "created",
            "notificationUrl": format!("{public}{WEBHOOK_PATH}"),
            "lifecycleNotificationUrl": format!("{public}{LIFECYCLE_PATH}"),
            "resource": resource,
            "expirationDateTime": self.expiry(),
            "clientState": self.settings.client_state.expose(),
            "latestSupportedTlsVersion": "v1_2",
        });
        let answer = self
            .graph
            .app(Method::POST, "/subscriptions", Some(&body))
            .await?;
        let v = self.graph.decode(&answer)?;
        let id = v["id"].as_str().unwrap_or_default().to_owned();
        if id.is_empty() {
            return Err(HttpError::new(
                api::GRAPH,
                Failure::Other("the new subscription has no id".to_owned()),
            ));
        }
        tracing::info!(%resource, subscription = %id, "Graph subscription created");
        Ok(Sub {
            id,
            resource: resource.to_owned(),
            expires: v["expirationDateTime"]
                .as_str()
                .map_or_else(|| self.expiry(), str::to_owned),
        })
    }

    /// `PATCH /subscriptions/{id}` with a new expiry.
    async fn renew(&self, sub: &Sub) -> Result<Sub, HttpError> {
        let body = json!({ "expirationDateTime": self.expiry() });
        let path = format!("/subscriptions/{}", mapping::esc(&sub.id));
        let answer = self.graph.app(Method::PATCH, &path, Some(&body)).await?;
        let v = self.graph.decode(&answer).unwrap_or(Value::Null);
        tracing::debug!(subscription = %sub.id, "Graph subscription renewed");
        Ok(Sub {
            expires: v["expirationDateTime"]
                .as_str()
                .map_or_else(|| self.expiry(), str::to_owned),
            ..sub.clone()
        })
    }

    /// Renews `sub`, or creates its resource's subscription again when
    /// Graph no longer knows it.
    async fn renew_or_create(&self, sub: &Sub) -> Result<Sub, HttpError> {
        match self.renew(sub).await {
            Err(e) if e.status() == Some(404) => {
                tracing::info!(subscription = %sub.id, "Graph no longer knows the subscription; creating it again");
                self.create(&sub.resource).await
            }
            other => other,
        }
    }

    /// At start: each configured resource's subscription, kept from the
    /// last run and renewed, or created; subscriptions for resources no
    /// longer configured are deleted.
    async fn subscribe(&self) -> Result<(), String> {
        let saved = self.load_subs().await;
        let mut subs = Vec::new();
        for resource in &self.settings.resources {
            let sub = match saved.iter().find(|s| &s.resource == resource) {
                Some(old) => self.renew_or_create(old).await,
                None => self.create(resource).await,
            }
            .map_err(|e| format!("cannot subscribe to {resource}: {e}"))?;
            subs.push(sub);
            self.save_subs(&subs).await;
        }
        for old in saved
            .iter()
            .filter(|s| !self.settings.resources.contains(&s.resource))
        {
            self.delete(old).await;
        }
        self.save_subs(&subs).await;
        *self.subs.lock().await = subs;
        Ok(())
    }

    async fn delete(&self, sub: &Sub) {
        let path = format!("/subscriptions/{}", mapping::esc(&sub.id));
        match self.graph.app(Method::DELETE, &path, None).await {
            Ok(_) => tracing::info!(subscription = %sub.id, "Graph subscription deleted"),
            Err(e) if e.status() == Some(404) => {}
            Err(e) => {
                tracing::warn!(subscription = %sub.id, "cannot delete the Graph subscription: {e}")
            }
        }
    }

    /// At shutdown.
    async fn unsubscribe(&self) {
        let subs = std::mem::take(&mut *self.subs.lock().await);
        for sub in &subs {
            self.delete(sub).await;
        }
        self.save_subs(&[]).await;
    }

    /// Renews every subscription whose expiry is within `renew_before`.
    async fn renew_due(&self) {
        let mut subs = self.subs.lock().await;
        let now = self.now();
        let mut changed = false;
        for sub in subs.iter_mut() {
            let due = mapping::parse_iso8601(&sub.expires)
                .is_none_or(|at| at <= now + self.settings.renew_before);
            if !due {
                continue;
            }
            match self.renew_or_create(sub).await {
                Ok(next) => {
                    *sub = next;
                    changed = true;
                }
                Err(e) => {
                    tracing::warn!(subscription = %sub.id, "cannot renew the Graph subscription: {e}")
                }
            }
        }
        if changed {
            let snapshot = subs.clone();
            drop(subs);
            self.save_subs(&snapshot).await;
        }
    }

    /// Acts on one lifecycle event.
    async fn on_lifecycle(&self, event: Lifecycle) {
        let mut subs = self.subs.lock().await;
        let Some(index) = subs.iter().position(|s| s.id == event.subscription) else {
            tracing::info!(subscription = %event.subscription, "a lifecycle event for a subscription not ours");
            return;
        };
        let sub = subs[index].clone();
        let mut resync = false;
        match event.event.as_str() {
            "reauthorizationRequired" => {
                let path = format!("/subscriptions/{}/reauthorize", mapping::esc(&sub.id));
                match self.graph.app(Method::POST, &path, None).await {
                    Ok(_) => {
                        tracing::info!(subscription = %sub.id, "Graph subscription reauthorized")
                    }
                    Err(e) if e.status() == Some(404) => match self.create(&sub.resource).await {
                        Ok(next) => {
                            subs[index] = next;
                            resync = true;
                        }
                        Err(e) => tracing::warn!("cannot create the subscription again: {e}"),
                    },
                    Err(e) => tracing::warn!(subscription = %sub.id, "cannot reauthorize: {e}"),
                }
            }
            "subscriptionRemoved" => match self.create(&sub.resource).await {
                Ok(next) => {
                    subs[index] = next;
                    resync = true;
                }
                Err(e) => tracing::warn!("cannot create the removed subscription again: {e}"),
            },
            "missed" => resync = true,
            other => {
                tracing::info!(event = %other, "a Graph lifecycle event this adapter does not act on")
            }
        }
        let snapshot = subs.clone();
        drop(subs);
        self.save_subs(&snapshot).await;
        if resync {
            self.resync(&sub.resource).await;
        }
    }

    /// Lists the recent messages of `resource` and journals those not
    /// handed over yet (tenant-wide resources cannot be listed).
    async fn resync(&self, resource: &str) {
        let Some(listing) = mapping::listable(resource) else {
            tracing::warn!(%resource, "a tenant-wide resource cannot be listed; changes Graph missed stay missed");
            return;
        };
        let path = format!("/{}?$top={RESYNC_TOP}", resource.trim().trim_matches('/'));
        let listed = match self.graph.get(&path).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(%resource, "cannot list messages to resync: {e}");
                return;
            }
        };
        let since = self.now() - self.settings.resync_window;
        let mut new = Vec::new();
        for m in listed["value"].as_array().into_iter().flatten().rev() {
            let Some(id) = m["id"].as_str() else { continue };
            let at = m["createdDateTime"]
                .as_str()
                .or(m["receivedDateTime"].as_str())
                .and_then(mapping::parse_iso8601);
            if self.seen_message(id) || at.is_none_or(|at| at < since) {
                continue;
            }
            new.push(Pending {
                key: format!("resync:{id}"),
                resource: listing.item(id).resource(),
            });
        }
        let count = new.len();
        match self.hook.journal.add(new).await {
            Ok(()) => {
                tracing::info!(%resource, messages = count, "resynced after Graph missed changes")
            }
            Err(e) => tracing::warn!("cannot journal resynced messages: {e}"),
        }
    }

    /// Lifecycle events and renewals, until dropped.
    async fn keep(&self) {
        loop {
            loop {
                let next = self
                    .hook
                    .lifecycle
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .pop_front();
                match next {
                    Some(event) => self.on_lifecycle(event).await,
                    None => break,
                }
            }
            self.renew_due().await;
            tokio::select! {
                _ = tokio::time::sleep(self.settings.check_every) => {}
                _ = self.hook.lifecycle_wake.notified() => {}
            }
        }
    }

    // ---- the worker ----

    /// The chat's type, asked of Graph once per chat.
    async fn chat_type(&self, chat: &str) -> Result<ChatType, HttpError> {
        if let Some(t) = self
            .chats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(chat)
        {
            return Ok(*t);
        }
        let v = self
            .graph
            .get(&format!("/chats/{}", mapping::esc(chat)))
            .await?;
        let t = mapping::chat_type(v["chatType"].as_str().unwrap_or("group"));
        let mut chats = self.chats.lock().unwrap_or_else(|p| p.into_inner());
        if chats.len() > 10_000 {
            chats.clear();
        }
        chats.insert(chat.to_owned(), t);
        Ok(t)
    }

    async fn handle(&self, pending: &Pending, inbox: &Inbox) -> Handled {
        let Some(item) = Item::parse(&pending.resource) else {
            return Handled::Done;
        };
        let id = item.message_id().to_owned();
        if self.seen_message(&id) {
            return Handled::Done;
        }
        let gone = |e: &HttpError| matches!(e.status(), Some(400 | 403 | 404 | 410));
        let msg = match self.graph.get(&item.path()).await {
            Ok(v) => v,
            Err(e) if gone(&e) => {
                tracing::info!(message = %id, "a notified Graph message cannot be read: {e}");
                return Handled::Done;
            }
            Err(e) => return Handled::Later(e.to_string()),
        };
        let me = self.me.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mapped = match &item {
            Item::Chat { chat, .. } => match self.chat_type(chat).await {
                Ok(kind) => {
                    mapping::map_chat_message(&item, &msg, kind, &me, self.settings.require_mention)
                }
                Err(e) if gone(&e) => Mapped::Skip("the chat cannot be read"),
                Err(e) => return Handled::Later(e.to_string()),
            },
            Item::Channel { .. } => mapping::map_chat_message(
                &item,
                &msg,
                ChatType::Group,
                &me,
                self.settings.require_mention,
            ),
            Item::Mail { .. } => mapping::map_mail(&item, &msg),
        };
        match mapped {
            Mapped::Skip(why) => {
                tracing::debug!(message = %id, reason = why, "Graph message not handed on");
                self.remember_message(&id);
                Handled::Done
            }
            Mapped::Event(event) => match inbox.admit(*event).await {
                Ok(_) => {
                    self.remember_message(&id);
                    Handled::Done
                }
                Err(_) => Handled::Closed,
            },
        }
    }

    /// Hands over what the journal holds, oldest first, until dropped or
    /// the runner stops.
    async fn work(&self, inbox: &Inbox) {
        let mut failures: u32 = 0;
        loop {
            let next = match self.hook.journal.first().await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!("Microsoft Graph journal: {e}");
                    tokio::time::sleep(self.settings.retry_wait).await;
                    continue;
                }
            };
            let Some(pending) = next else {
                self.hook.journal.wake.notified().await;
                continue;
            };
            match self.handle(&pending, inbox).await {
                Handled::Done => {
                    failures = 0;
                    if let Err(e) = self.hook.journal.remove(&pending.key).await {
                        tracing::warn!("Microsoft Graph journal: {e}");
                        tokio::time::sleep(self.settings.retry_wait).await;
                    }
                }
                Handled::Later(why) => {
                    failures = failures.saturating_add(1);
                    let wait = self
                        .settings
                        .retry_wait
                        .saturating_mul(1 << failures.min(4))
                        .min(Duration::from_secs(300));
                    tracing::warn!(?wait, "cannot fetch a notified Graph message yet: {why}");
                    tokio::time::sleep(wait).await;
                }
                Handled::Closed => return,
            }
        }
    }

    /// Learns the delegated user's id, so its own posts are known.
    async fn learn_me(&self) {
        if !self.graph.can_post_as_user() {
            return;
        }
        match self.graph.call(Method::GET, "/me", None, As::User).await {
            Ok(Some(a)) if a.is_success() => {
                let v = self.graph.decode(&a).unwrap_or(Value::Null);
                if let Some(id) = v["id"].as_str() {
                    self.me.lock().unwrap_or_else(|p| p.into_inner()).user_id = Some(id.to_owned());
                }
            }
            Ok(Some(a)) => tracing::warn!(
                "cannot read the delegated user (/me): {}",
                self.graph.refusal(&a)
            ),
            Ok(None) => {}
            Err(e) => tracing::warn!("cannot read the delegated user (/me): {e}"),
        }
    }

    // ---- sends ----

    /// The wait before retry `retries` after a 429, or `None`.
    fn rate_limit_wait(&self, e: &HttpError, retries: u32) -> Option<Duration> {
        if e.status() != Some(429) || retries >= self.settings.rate_limit_retries {
            return None;
        }
        let wait = e.retry_after().unwrap_or(
            self.settings
                .rate_limit_wait
                .saturating_mul(1 << retries.min(8)),
        );
        (wait <= MAX_RETRY_WAIT).then_some(wait)
    }

    /// Posts `body` to `path` as `who`, waiting out rate limits.
    async fn post(&self, path: &str, body: &Value, who: As) -> Result<Value, SendError> {
        let mut retries = 0;
        loop {
            let answer = self
                .graph
                .call(Method::POST, path, Some(body), who)
                .await
                .map_err(|e| classify(&e, self.settings.rate_limit_wait))?;
            let Some(answer) = answer else {
                return Err(SendError::Rejected(
                    "posting into Teams chats and channels needs a delegated token: set \
                     MSGRAPH_DELEGATED_REFRESH_TOKEN (or MSGRAPH_DELEGATED_ACCESS_TOKEN) for the \
                     user the app posts as; Graph refuses app-only tokens there"
                        .to_owned(),
                ));
            };
            if answer.is_success() {
                return Ok(serde_json::from_slice(&answer.body).unwrap_or(Value::Null));
            }
            let e = self.graph.refusal(&answer);
            if let Some(wait) = self.rate_limit_wait(&e, retries) {
                retries += 1;
                tracing::info!(?wait, "Microsoft Graph rate limit; waiting");
                tokio::time::sleep(wait).await;
                continue;
            }
            return Err(classify(&e, self.settings.rate_limit_wait));
        }
    }
}

/// Maps a failed call to what the gateway's ledger understands.
fn classify(e: &HttpError, wait: Duration) -> SendError {
    match &e.failure {
        Failure::Status { status: 429, .. } => {
            SendError::RateLimited(e.retry_after().unwrap_or(wait))
        }
        Failure::Status { status: 401, .. } => SendError::Unavailable(format!(
            "Microsoft Graph refused the token; check MSGRAPH_CLIENT_SECRET or the delegated token ({e})"
        )),
        Failure::Status { status, .. } if *status >= 500 => SendError::Transient(e.to_string()),
        Failure::Status { .. } => SendError::Rejected(e.to_string()),
        Failure::Connect(m) => {
            SendError::Unavailable(format!("cannot connect to Microsoft Graph: {m}"))
        }
        Failure::Timeout(_) | Failure::Other(_) => e.clone().classify(),
    }
}

/// What the platform can do; also the registry's declaration.
pub const CAPABILITIES: Capabilities = Capabilities {
    threads: true,
    // Mail senders are addresses anyone can write from, so no stranger is
    // offered a pairing code here; Entra ID object ids (GUIDs) compare the
    // same without case.
    sender_ids: SenderIds::Email,
    ..Capabilities::chat(MessageLimits {
        max_len: MAX_TEXT_CHARS,
        unit: LengthUnit::Chars,
    })
};

#[async_trait]
impl Adapter for MsGraphAdapter {
    fn platform(&self) -> &'static str {
        PLATFORM
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    /// Gets the app token (a refused one stops here with a clear error),
    /// makes the subscriptions, then hands over what the journal holds and
    /// keeps the subscriptions until the gateway stops, when they are
    /// deleted.
    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        ctx.liveness.set(Liveness::Connecting);
        let token = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = self.graph.app_token() => r,
        };
        match token {
            Ok(_) => {}
            Err(e) if matches!(e.status(), Some(400 | 401)) => {
                return Err(AdapterError::Fatal(format!(
                    "Microsoft Graph refused the app registration (MSGRAPH_TENANT_ID, \
                     MSGRAPH_CLIENT_ID, MSGRAPH_CLIENT_SECRET): {e}"
                )));
            }
            Err(e) => return Err(AdapterError::Disconnected(e.to_string())),
        }
        self.learn_me().await;
        let subscribed = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = self.subscribe() => r,
        };
        subscribed.map_err(AdapterError::Disconnected)?;
        let waiting = self.hook.journal.len().await;
        if waiting > 0 {
            tracing::info!(
                items = waiting,
                "Graph notifications kept from before; handing them over"
            );
        }
        tokio::select! {
            r = self.hook.slot.attach(&ctx) => r?,
            _ = self.keep() => {}
            _ = self.work(&ctx.inbox) => {
                // The runner stopped taking messages: wait for the stop.
                ctx.shutdown.cancelled().await;
            }
        }
        if self.settings.delete_on_shutdown {
            self.unsubscribe().await;
        }
        Ok(())
    }

    /// A chat message, a reply in the channel thread, or a mail reply (see
    /// the module docs for the chat ids).
    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        let chat = message.chat_id.trim();
        let text = message.text.trim_end();
        if text.trim().is_empty() {
            return Ok(SentMessage::default());
        }
        let body = json!({ "body": { "contentType": "text", "content": text } });
        let (path, who, body) = if let Some(id) = chat.strip_prefix("chat:") {
            (
                format!("/chats/{}/messages", mapping::esc(id)),
                As::User,
                body,
            )
        } else if let Some(rest) = chat.strip_prefix("channel:") {
            let Some((team, channel)) = rest.split_once('/') else {
                return Err(SendError::Rejected(format!("`{chat}` names no channel")));
            };
            let base = format!(
                "/teams/{}/channels/{}/messages",
                mapping::esc(team),
                mapping::esc(channel)
            );
            match message.thread_id.as_deref().filter(|t| !t.is_empty()) {
                Some(root) => (
                    format!("{base}/{}/replies", mapping::esc(root)),
                    As::User,
                    body,
                ),
                None => (base, As::User, body),
            }
        } else if let Some(rest) = chat.strip_prefix("mail:") {
            let Some((user, _)) = rest.split_once('/') else {
                return Err(SendError::Rejected(format!("`{chat}` names no mailbox")));
            };
            let Some(answered) = message.reply_to.as_deref().filter(|r| !r.is_empty()) else {
                return Err(SendError::Rejected(
                    "a mail answer replies to a message, and none was named".to_owned(),
                ));
            };
            (
                format!(
                    "/users/{}/messages/{}/reply",
                    mapping::esc(user),
                    mapping::esc(answered)
                ),
                As::App,
                json!({ "comment": text }),
            )
        } else {
            return Err(SendError::Rejected(format!(
                "`{chat}` is not a Microsoft Graph chat, channel or mailbox"
            )));
        };
        let sent = self.post(&path, &body, who).await?;
        let id = sent["id"].as_str().map(str::to_owned);
        if let Some(id) = &id {
            // Its own notification is not a message to answer.
            self.remember_message(id);
        }
        Ok(SentMessage { message_id: id })
    }
}

/// The registry's entry for Microsoft Graph.
pub const ENTRY: Platform = Platform {
    name: PLATFORM,
    title: "Microsoft Graph (Teams, Outlook)",
    standalone: true,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<MsGraphConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let Some(settings) = MsGraphSettings::from_config(&setup.section()?, setup.env)
        .map_err(BuildError::misconfigured)?
    else {
        return Ok(None);
    };
    let adapter =
        MsGraphAdapter::new(settings, setup.cursors.clone()).map_err(BuildError::set_up)?;
    let mount = adapter.mount();
    Ok(Some(Built {
        adapter: Arc::new(adapter),
        mount: Some(mount),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Env {
        Env::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    fn config() -> MsGraphConfig {
        MsGraphConfig {
            resources: vec!["/chats/getAllMessages".into()],
            public_url: Some("https://bot.example.com".into()),
            ..MsGraphConfig::default()
        }
    }

    #[test]
    fn off_unless_switched_on_then_the_client_state_is_required() {
        assert!(
            MsGraphSettings::from_config(&config(), &env(&[]))
                .unwrap()
                .is_none()
        );
        let e = MsGraphSettings::from_config(
            &config(),
            &env(&[
                ("MSGRAPH_WEBHOOK_ENABLED", "true"),
                ("MSGRAPH_TENANT_ID", "t"),
            ]),
        )
        .unwrap_err();
        let MsGraphError::Missing(missing) = e else {
            panic!("{e:?}")
        };
        assert!(
            missing[0].starts_with("MSGRAPH_WEBHOOK_CLIENT_STATE"),
            "{missing:?}"
        );
        let full = env(&[
            ("MSGRAPH_WEBHOOK_CLIENT_STATE", "state"),
            ("MSGRAPH_TENANT_ID", "t"),
            ("MSGRAPH_CLIENT_ID", "c"),
            ("MSGRAPH_CLIENT_SECRET", "s"),
            ("MSGRAPH_WEBHOOK_ACCEPTED_RESOURCES", "chats*, teams*"),
            ("MSGRAPH_AUTHORITY_URL", "http://127.0.0.1:9"),
        ]);
        let s = MsGraphSettings::from_config(&config(), &full)
            .unwrap()
            .unwrap();
        assert_eq!(s.accepted_resources, ["chats*", "teams*"]);
        assert_eq!(s.authority_url, "http://127.0.0.1:9");
        assert_eq!(s.scope, "https://graph.microsoft.com/.default");
        let off = env(&[
            ("MSGRAPH_WEBHOOK_ENABLED", "false"),
            ("MSGRAPH_WEBHOOK_CLIENT_STATE", "x"),
        ]);
        assert!(
            MsGraphSettings::from_config(&config(), &off)
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn chat_answers_need_a_delegated_token_and_say_so() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn CursorStore> =
            Arc::new(talaria_store::SqliteStore::open(&dir.path().join("state.db")).unwrap());
        let app_only = env(&[
            ("MSGRAPH_WEBHOOK_CLIENT_STATE", "state"),
            ("MSGRAPH_TENANT_ID", "t"),
            ("MSGRAPH_CLIENT_ID", "c"),
            ("MSGRAPH_CLIENT_SECRET", "s"),
        ]);
        let settings = MsGraphSettings::from_config(&config(), &app_only)
            .unwrap()
            .unwrap();
        let a = MsGraphAdapter::new(settings, store).unwrap();
        let message = |chat: &str, reply_to: Option<&str>| OutboundMessage {
            chat_id: chat.into(),
            thread_id: None,
            reply_to: reply_to.map(str::to_owned),
            text: "hello".into(),
            choices: Vec::new(),
        };
        for chat in ["chat:19:a@thread.v2", "channel:t/19:c@thread.tacv2"] {
            match a.send(&message(chat, None)).await {
                Err(SendError::Rejected(why)) => {
                    assert!(why.contains("MSGRAPH_DELEGATED_REFRESH_TOKEN"), "{why}")
                }
                other => panic!("{chat}: {other:?}"),
            }
        }
        for (chat, reply_to) in [
            ("mail:box/ada@example.com", None),
            ("elsewhere:1", Some("m")),
        ] {
            assert!(
                matches!(
                    a.send(&message(chat, reply_to)).await,
                    Err(SendError::Rejected(_))
                ),
                "{chat}"
            );
        }
        let shown = format!("{a:?}");
        assert!(
            !shown.contains("state\"") && !shown.contains("\"s\""),
            "{shown}"
        );
    }
}
