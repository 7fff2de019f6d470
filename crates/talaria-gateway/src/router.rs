//! Session routing: which stored session a session key currently points at.
//!
//! The route lives in the store, so a chat continues after a restart. A
//! route expires under the configured reset policy (idle, daily, both);
//! `/new` re-points it at once. Old sessions are ended, never deleted: they
//! stay searchable and `/resume` can point the key back at one.
//!
//! # Expiry
//!
//! Two parties end an expired session. The [`ExpiryWatcher`], a
//! maintenance task, ends it in the background soon after it expires and
//! fires `session:end`, but keeps the route. [`Router::current`], when the
//! key's next message comes, still sees the expired route and starts the
//! next session (with [`Started::Idle`] or [`Started::Daily`], and the
//! auto-reset notice), ending the old one only if the watcher has not:
//! both go through [`RouteStore::end_route_session`], whose guard lets
//! exactly one of them end a session for a given expiry, and only the one
//! that did reports it (so `session:end` fires once).
//!
//! [`RouteStore::end_route_session`]: talaria_store::gateway::RouteStore::end_route_session

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Local, TimeZone, Timelike, Utc};
use talaria_agent::{Agent, AgentError, SessionHandle};
use talaria_core::config::{ResetMode, SessionResetConfig};
use talaria_store::{GatewayStore, NewSession, Route, SessionRecord, StoreError};

use crate::event::SessionSource;
use crate::hooks::{Hooks, events};
use crate::key::SessionKey;

/// Open session handles kept in memory. A handle is cheap to rebuild from
/// the store, so the cache only saves prompt reads; bounded so a gateway
/// serving many chats does not grow without limit.
const HANDLE_CACHE: usize = 512;

/// Why a route was replaced without the user asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoReset {
    /// No message for longer than `idle_minutes`.
    Idle,
    /// The daily reset hour passed since the last message.
    Daily,
}

impl AutoReset {
    fn reason(self) -> &'static str {
        match self {
            AutoReset::Idle => "idle",
            AutoReset::Daily => "daily",
        }
    }
}

/// Why the router started a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Started {
    /// The key had no session (or its session vanished from the store).
    First,
    /// The previous one expired: no message for `idle_minutes`.
    Idle,
    /// The previous one expired at the daily reset hour.
    Daily,
    /// `/new` asked for it.
    NewSession,
}

impl Started {
    /// The form hooks and logs use; matches the ended session's reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Started::First => "first",
            Started::Idle => "idle",
            Started::Daily => "daily",
            Started::NewSession => "new_session",
        }
    }
}

impl From<AutoReset> for Started {
    fn from(reason: AutoReset) -> Started {
        match reason {
            AutoReset::Idle => Started::Idle,
            AutoReset::Daily => Started::Daily,
        }
    }
}

/// The session a message goes to.
#[derive(Debug, Clone)]
pub struct Routed {
    /// The session the message belongs to (new or continued).
    pub handle: SessionHandle,
    /// Set when the previous session expired just now.
    pub auto_reset: Option<AutoReset>,
    /// Set when this call started `handle`'s session, with why.
    pub started: Option<Started>,
    /// The session this call ended to make room for the new one. `None`
    /// when it had been ended already (the [`ExpiryWatcher`] ends expired
    /// sessions in the background, and fired `session:end` for it then).
    pub ended: Option<String>,
    /// The session the key pointed at before this call, ended now or
    /// earlier (`session:reset` names it either way).
    pub previous: Option<String>,
}

/// Errors while routing.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// Starting or ending a session in the agent failed.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// Reading or writing the route failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Maps session keys to sessions.
pub struct Router {
    agent: Arc<Agent>,
    store: Arc<dyn GatewayStore>,
    policy: SessionResetConfig,
    handles: Mutex<HashMap<String, SessionHandle>>,
}

impl Router {
    /// A router starting sessions in `agent`, keeping routes in `store`,
    /// and resetting them as `policy` says.
    pub fn new(
        agent: Arc<Agent>,
        store: Arc<dyn GatewayStore>,
        policy: SessionResetConfig,
    ) -> Router {
        Router {
            agent,
            store,
            policy,
            handles: Mutex::new(HashMap::new()),
        }
    }

    /// The key's current session, starting one when there is none or the
    /// old one expired. Counts as activity on the key.
    pub async fn current(
        &self,
        key: &SessionKey,
        source: &SessionSource,
    ) -> Result<Routed, RouteError> {
        let now = Local::now();
        if let Some(route) = self.store.route(key.as_str()).await? {
            match expired(&self.policy, &route, now) {
                None => {
                    if let Some(handle) = self.open(&route.session_id).await? {
                        self.store.touch_route(key.as_str()).await?;
                        return Ok(Routed {
                            handle,
                            auto_reset: None,
                            started: None,
                            ended: None,
                            previous: None,
                        });
                    }
                    // The routed session vanished from the store: start over.
                }
                Some(reason) => {
                    // The user still hears of the reset when the watcher
                    // got there first; only the end is not repeated.
                    let ended = self.end(&route, reason.reason()).await;
                    let handle = self
                        .start(key, source, Some(route.session_id.clone()))
                        .await?;
                    return Ok(Routed {
                        handle,
                        auto_reset: Some(reason),
                        started: Some(reason.into()),
                        ended: ended.then(|| route.session_id.clone()),
                        previous: Some(route.session_id),
                    });
                }
            }
        }
        let handle = self.start(key, source, None).await?;
        Ok(Routed {
            handle,
            auto_reset: None,
            started: Some(Started::First),
            ended: None,
            previous: None,
        })
    }

    /// The key's current session without creating or touching anything.
    pub async fn peek(&self, key: &SessionKey) -> Result<Option<SessionRecord>, RouteError> {
        let Some(route) = self.store.route(key.as_str()).await? else {
            return Ok(None);
        };
        Ok(self.store.session(&route.session_id).await?)
    }

    /// `/new`: ends the current session (it stays searchable) and points
    /// the key at a fresh one.
    pub async fn reset(
        &self,
        key: &SessionKey,
        source: &SessionSource,
    ) -> Result<Routed, RouteError> {
        let old = self.store.route(key.as_str()).await?;
        let mut ended = None;
        if let Some(route) = &old
            && self.end(route, Started::NewSession.as_str()).await
        {
            ended = Some(route.session_id.clone());
        }
        let previous = old.map(|r| r.session_id);
        let handle = self.start(key, source, previous.clone()).await?;
        Ok(Routed {
            handle,
            auto_reset: None,
            started: Some(Started::NewSession),
            ended,
            previous,
        })
    }

    /// `/resume`: points the key back at one of its earlier sessions.
    pub async fn resume(
        &self,
        key: &SessionKey,
        session_id: &str,
    ) -> Result<SessionHandle, RouteError> {
        let handle = self
            .open(session_id)
            .await?
            .ok_or_else(|| RouteError::Agent(AgentError::NoSuchSession(session_id.to_owned())))?;
        if let Some(current) = self.store.route(key.as_str()).await?
            && current.session_id != session_id
        {
            self.end(&current, "resumed_other").await;
        }
        self.store.set_route(key.as_str(), session_id).await?;
        Ok(handle)
    }

    async fn start(
        &self,
        key: &SessionKey,
        source: &SessionSource,
        parent: Option<String>,
    ) -> Result<SessionHandle, RouteError> {
        let handle = self
            .agent
            .start_session(NewSession {
                source: source.platform.clone(),
                session_key: Some(key.as_str().to_owned()),
                chat_id: Some(source.chat_id.clone()),
                user_id: source.user_id.clone(),
                thread_id: source.thread_id.clone(),
                parent_session_id: parent,
                ..NewSession::default()
            })
            .await?;
        self.store.set_route(key.as_str(), &handle.id).await?;
        self.remember(&handle);
        Ok(handle)
    }

    async fn open(&self, session_id: &str) -> Result<Option<SessionHandle>, RouteError> {
        if let Some(handle) = self.lock().get(session_id) {
            return Ok(Some(handle.clone()));
        }
        match self.agent.resume_session(session_id).await {
            Ok(handle) => {
                self.remember(&handle);
                Ok(Some(handle))
            }
            Err(AgentError::NoSuchSession(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Ends the route's session unless it was ended since the route's
    /// last activity (by the expiry watcher); returns whether this call
    /// ended it. A store failure only costs the end stamp, so it is logged
    /// and counts as ended: hooks still hear of the end.
    async fn end(&self, route: &Route, reason: &str) -> bool {
        self.lock().remove(&route.session_id);
        let ended = match self.store.end_route_session(route, reason).await {
            Ok(ended) => ended,
            Err(e) => {
                tracing::warn!(session = %route.session_id, error = %e, "could not mark the session ended");
                true
            }
        };
        // Whoever ended the session tells the memory provider, once.
        if ended && let Some(memory) = self.agent.memory() {
            memory.session_ended(&route.session_id);
        }
        ended
    }

    fn remember(&self, handle: &SessionHandle) {
        let mut handles = self.lock();
        if handles.len() >= HANDLE_CACHE
            && !handles.contains_key(&handle.id)
            && let Some(victim) = handles.keys().next().cloned()
        {
            handles.remove(&victim);
        }
        handles.insert(handle.id.clone(), handle.clone());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, SessionHandle>> {
        self.handles.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether the route's session expired under `policy` at `now`.
pub fn expired<Tz: TimeZone>(
    policy: &SessionResetConfig,
    route: &Route,
    now: DateTime<Tz>,
) -> Option<AutoReset> {
    let last = route.updated_at;
    let idle = || last < idle_cutoff(policy, &now);
    let daily = || daily_boundary(policy, &now).is_some_and(|b| last < b);
    match policy.mode {
        ResetMode::None => None,
        ResetMode::Idle => idle().then_some(AutoReset::Idle),
        ResetMode::Daily => daily().then_some(AutoReset::Daily),
        ResetMode::Both => {
            if idle() {
                Some(AutoReset::Idle)
            } else {
                daily().then_some(AutoReset::Daily)
            }
        }
    }
}

/// The `updated_at` before which a route has expired under `policy` at
/// `now` (what [`expired`] decides, as one bound a store can filter on);
/// `None` when nothing expires.
fn expiry_cutoff<Tz: TimeZone>(policy: &SessionResetConfig, now: &DateTime<Tz>) -> Option<f64> {
    match policy.mode {
        ResetMode::None => None,
        ResetMode::Idle => Some(idle_cutoff(policy, now)),
        ResetMode::Daily => daily_boundary(policy, now),
        ResetMode::Both => {
            let idle = idle_cutoff(policy, now);
            Some(daily_boundary(policy, now).map_or(idle, |b| b.max(idle)))
        }
    }
}

/// Last activity before this is idle for too long at `now`.
fn idle_cutoff<Tz: TimeZone>(policy: &SessionResetConfig, now: &DateTime<Tz>) -> f64 {
    unix_secs(now) - policy.idle_minutes as f64 * 60.0
}

/// The latest daily reset at or before `now`, in `now`'s time zone.
fn daily_boundary<Tz: TimeZone>(policy: &SessionResetConfig, now: &DateTime<Tz>) -> Option<f64> {
    let hour = policy.at_hour.min(23);
    let today = now.date_naive();
    let boundary_day = if now.hour() < hour {
        today.pred_opt().unwrap_or(today)
    } else {
        today
    };
    boundary_day
        .and_hms_opt(hour, 0, 0)
        .and_then(|b| now.timezone().from_local_datetime(&b).earliest())
        .map(|b| unix_secs(&b))
}

fn unix_secs<Tz: TimeZone>(t: &DateTime<Tz>) -> f64 {
    t.timestamp_millis() as f64 / 1000.0
}

/// How often the expiry watcher looks for expired sessions.
pub const EXPIRY_INTERVAL: Duration = Duration::from_secs(300);

/// How long after the gateway starts the watcher first looks.
pub const EXPIRY_FIRST_RUN: Duration = Duration::from_secs(60);

/// Expired routes one page of a pass reads.
const EXPIRY_PAGE: usize = 200;

/// Pages one pass reads at most; a larger backlog (after a long downtime)
/// waits for the next pass rather than holding the database.
const EXPIRY_MAX_PAGES: usize = 10;

/// Whether a session key (its string form) has a turn running now.
pub type IsRunning = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// Told the id of a session the watcher ended.
pub type OnEnd = Arc<dyn Fn(&str) + Send + Sync>;

/// What one [`ExpiryWatcher::pass`] did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExpiryReport {
    /// The sessions this pass ended, with why.
    pub ended: Vec<(String, AutoReset)>,
    /// Expired routes left alone because a turn is running on their key.
    pub running: usize,
}

/// Ends sessions whose route expired under the reset policy, without
/// waiting for the key's next message, and fires `session:end` for each.
///
/// The route is kept: the key's next message still finds it expired and
/// starts the next session (see the module documentation). A key with a
/// turn running is skipped, so no session is ended under a running turn
/// (a turn longer than the idle limit, or one crossing the daily hour).
pub struct ExpiryWatcher {
    store: Arc<dyn GatewayStore>,
    policy: SessionResetConfig,
    hooks: Arc<Hooks>,
    is_running: IsRunning,
    /// Told each session this watcher ends (the external memory
    /// provider's end-of-session call).
    on_end: Option<OnEnd>,
}

impl ExpiryWatcher {
    /// A watcher over `store` applying `policy`; `is_running` is asked
    /// about a key just before its session is ended.
    pub fn new(
        store: Arc<dyn GatewayStore>,
        policy: SessionResetConfig,
        hooks: Arc<Hooks>,
        is_running: IsRunning,
    ) -> ExpiryWatcher {
        ExpiryWatcher {
            store,
            policy,
            hooks,
            is_running,
            on_end: None,
        }
    }

    /// Calls `on_end` with each session this watcher ends.
    pub fn with_on_end(mut self, on_end: OnEnd) -> ExpiryWatcher {
        self.on_end = Some(on_end);
        self
    }

    /// Ends the sessions expired at `now` (oldest first, a bounded number
    /// per pass). Does nothing when the reset mode is `none`. The daily
    /// hour is read in local time, as [`Router::current`] does.
    pub async fn pass(&self, now: DateTime<Utc>) -> Result<ExpiryReport, StoreError> {
        let now = now.with_timezone(&Local);
        let mut report = ExpiryReport::default();
        let Some(cutoff) = expiry_cutoff(&self.policy, &now) else {
            return Ok(report);
        };
        for _ in 0..EXPIRY_MAX_PAGES {
            let page = self.store.stale_routes(cutoff, EXPIRY_PAGE).await?;
            let full = page.len() == EXPIRY_PAGE;
            let mut progressed = false;
            for route in page {
                let Some(reason) = expired(&self.policy, &route, now) else {
                    continue;
                };
                // Checked per route, as late as possible: a turn may have
                // started since the pass began.
                if (self.is_running)(&route.session_key) {
                    report.running += 1;
                    continue;
                }
                // Won or lost, the route leaves the list: its session is
                // ended either way.
                progressed = true;
                if self
                    .store
                    .end_route_session(&route, reason.reason())
                    .await?
                {
                    tracing::debug!(session = %route.session_id, reason = reason.reason(), "ended an expired session");
                    self.announce(&route, reason);
                    if let Some(on_end) = &self.on_end {
                        on_end(&route.session_id);
                    }
                    report.ended.push((route.session_id, reason));
                }
            }
            // What is left on a full page without progress is all running
            // keys; reading it again would only find them again.
            if !full || !progressed {
                break;
            }
        }
        if !report.ended.is_empty() {
            tracing::info!(
                ended = report.ended.len(),
                "ended sessions that expired under the reset policy"
            );
        }
        Ok(report)
    }

    /// `session:end`, with the payload the runner gives it.
    fn announce(&self, route: &Route, reason: AutoReset) {
        if !self.hooks.wants(events::SESSION_END) {
            return;
        }
        // A stored key was made by `SessionKey::for_source`, so it parses;
        // the platform is its third part, as in the source it came from.
        let platform = SessionKey::parse(&route.session_key)
            .map(|k| k.platform().to_owned())
            .unwrap_or_default();
        // The key is hashed as the runner hashes keys for hooks, so a hook
        // can match this end with the session's start.
        self.hooks.fire(&events::SessionEnd {
            platform: &platform,
            session_key: &route.session_key,
            session_id: &route.session_id,
            reason: Started::from(reason).as_str(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    fn route(updated_at: f64) -> Route {
        Route {
            session_key: "k".into(),
            session_id: "s".into(),
            created_at: updated_at,
            updated_at,
        }
    }

    fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
    }

    #[test]
    fn idle_daily_and_both() {
        let now = at(2026, 12, 3, 10, 0);
        let ts = |t: DateTime<Utc>| t.timestamp() as f64;
        let idle = SessionResetConfig {
            mode: ResetMode::Idle,
            idle_minutes: 60,
            at_hour: 4,
        };
        assert_eq!(
            expired(&idle, &route(ts(at(2026, 12, 3, 8, 59))), now),
            Some(AutoReset::Idle)
        );
        assert_eq!(
            expired(&idle, &route(ts(at(2026, 12, 3, 9, 30))), now),
            None
        );
        let daily = SessionResetConfig {
            mode: ResetMode::Daily,
            ..idle.clone()
        };
        // Last message before today's 04:00 boundary.
        assert_eq!(
            expired(&daily, &route(ts(at(2026, 12, 3, 3, 59))), now),
            Some(AutoReset::Daily)
        );
        assert_eq!(
            expired(&daily, &route(ts(at(2026, 12, 3, 4, 1))), now),
            None
        );
        // Before 04:00 the boundary is yesterday's.
        let early = at(2026, 12, 3, 2, 0);
        assert_eq!(
            expired(&daily, &route(ts(at(2026, 12, 2, 5, 0))), early),
            None
        );
        assert_eq!(
            expired(&daily, &route(ts(at(2026, 12, 2, 3, 0))), early),
            Some(AutoReset::Daily)
        );
        let none = SessionResetConfig::default();
        assert_eq!(expired(&none, &route(0.0), now), None);
        let both = SessionResetConfig {
            mode: ResetMode::Both,
            ..idle
        };
        assert_eq!(
            expired(&both, &route(ts(at(2026, 12, 3, 9, 30))), now),
            None
        );
        assert_eq!(
            expired(&both, &route(ts(at(2026, 12, 2, 9, 30))), now),
            Some(AutoReset::Idle)
        );
    }
}
