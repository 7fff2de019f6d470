//! Session routing: which stored session a session key currently points at.
//!
//! The route lives in the store, so a chat continues after a restart. A
//! route expires under the configured reset policy (idle, daily, both);
//! `/new` re-points it at once. Old sessions are ended, never deleted: they
//! stay searchable and `/resume` can point the key back at one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Local, TimeZone, Timelike};
use talaria_agent::{Agent, AgentError, SessionHandle};
use talaria_core::config::{ResetMode, SessionResetConfig};
use talaria_store::{GatewayStore, NewSession, Route, SessionRecord, StoreError};

use crate::event::SessionSource;
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
    pub handle: SessionHandle,
    /// Set when the previous session expired just now.
    pub auto_reset: Option<AutoReset>,
    /// Set when this call started `handle`'s session, with why.
    pub started: Option<Started>,
    /// The session this call ended to make room for the new one.
    pub ended: Option<String>,
}

/// Errors while routing.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error(transparent)]
    Agent(#[from] AgentError),
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
                        });
                    }
                    // The routed session vanished from the store: start over.
                }
                Some(reason) => {
                    self.end(&route.session_id, reason.reason()).await;
                    let handle = self
                        .start(key, source, Some(route.session_id.clone()))
                        .await?;
                    return Ok(Routed {
                        handle,
                        auto_reset: Some(reason),
                        started: Some(reason.into()),
                        ended: Some(route.session_id),
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
        let old = self.store.route(key.as_str()).await?.map(|r| r.session_id);
        if let Some(old) = &old {
            self.end(old, Started::NewSession.as_str()).await;
        }
        let handle = self.start(key, source, old.clone()).await?;
        Ok(Routed {
            handle,
            auto_reset: None,
            started: Some(Started::NewSession),
            ended: old,
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
            self.end(&current.session_id, "resumed_other").await;
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

    /// Ends a session; a failure only costs the end stamp, so it is logged.
    async fn end(&self, session_id: &str, reason: &str) {
        self.lock().remove(session_id);
        if let Err(e) = self.store.end_session(session_id, reason).await {
            tracing::warn!(session = session_id, error = %e, "could not mark the session ended");
        }
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
    let now_ts = now.timestamp_millis() as f64 / 1000.0;
    let idle = || now_ts > last + policy.idle_minutes as f64 * 60.0;
    let daily = || {
        let hour = policy.at_hour.min(23);
        let today = now.date_naive();
        let boundary_day = if now.hour() < hour {
            today.pred_opt().unwrap_or(today)
        } else {
            today
        };
        let boundary = boundary_day
            .and_hms_opt(hour, 0, 0)
            .and_then(|b| now.timezone().from_local_datetime(&b).earliest())
            .map(|b| b.timestamp_millis() as f64 / 1000.0);
        boundary.is_some_and(|b| last < b)
    };
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
