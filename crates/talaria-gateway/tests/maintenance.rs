//! The session-expiry watcher over a real SQLite file, with a real
//! `session:end` hook: which sessions a pass ends, that each is ended and
//! announced once, and that the key's next message still starts the next
//! session as an automatic reset without ending the old one again.
//!
//! Routes are aged by passing the watcher a `now` in the future, never by
//! sleeping or editing the database.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use talaria_agent::interaction::NoHuman;
use talaria_agent::tools::Registry;
use talaria_agent::{Agent, AgentParts};
use talaria_core::config::{ResetMode, SessionResetConfig};
use talaria_core::{Config, Endpoint, Home, ProviderKind, Redactor};
use talaria_gateway::hooks::Hooks;
use talaria_gateway::router::{AutoReset, ExpiryWatcher, IsRunning, Router, Started};
use talaria_gateway::{ChatType, SessionKey, SessionSource};
use talaria_store::{GatewayStore, NewSession, RouteStore, SessionStore, SqliteStore};

/// How long a test waits for a hook's output.
const WAIT: Duration = Duration::from_secs(15);

const KEY: &str = "agent:main:telegram:dm:42";

/// Appends each event it gets, one JSON object a line, to `events.log`
/// in its folder.
const APPENDER: &str = "#!/bin/sh\n{ cat; echo; } >> events.log\n";

struct Rig {
    _dir: tempfile::TempDir,
    home: Home,
    store: Arc<SqliteStore>,
    hooks: Arc<Hooks>,
    log: PathBuf,
}

impl Rig {
    /// A home with a hook recording `session:end` (and `gateway:shutdown`,
    /// used as a barrier) and a fresh database.
    fn new() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home"));
        home.ensure().unwrap();
        let hook = home.hooks_dir().join("ends");
        std::fs::create_dir_all(&hook).unwrap();
        std::fs::write(
            hook.join("HOOK.yaml"),
            "events: [session:end, gateway:shutdown]\n",
        )
        .unwrap();
        let handler = hook.join("handler");
        std::fs::write(&handler, APPENDER).unwrap();
        std::fs::set_permissions(&handler, std::fs::Permissions::from_mode(0o755)).unwrap();
        let hooks = Arc::new(Hooks::load(&home));
        assert_eq!(hooks.hooks().count(), 1);
        let store = Arc::new(SqliteStore::open(&home.state_db()).unwrap());
        Rig {
            _dir: dir,
            home,
            store,
            hooks,
            log: hook.join("events.log"),
        }
    }

    fn watcher(&self, policy: SessionResetConfig, is_running: IsRunning) -> ExpiryWatcher {
        let store: Arc<dyn GatewayStore> = self.store.clone();
        ExpiryWatcher::new(store, policy, self.hooks.clone(), is_running)
    }

    /// A stored session routed from `key`, as the router leaves it.
    async fn routed(&self, key: &str, id: &str) {
        self.store
            .create_session(NewSession {
                id: id.into(),
                source: "telegram".into(),
                session_key: Some(key.into()),
                ..NewSession::default()
            })
            .await
            .unwrap();
        self.store.set_route(key, id).await.unwrap();
    }

    fn router(&self, policy: SessionResetConfig) -> Router {
        let config = Arc::new(Config::default());
        let endpoint = Endpoint {
            provider: ProviderKind::Custom,
            model: "test-model".into(),
            // Never called: routing only stores sessions.
            base_url: "http://127.0.0.1:9/v1".into(),
            api_key: None,
        };
        let agent = Arc::new(Agent::new(AgentParts {
            config: config.clone(),
            home: self.home.clone(),
            provider: talaria_llm::provider_for(&endpoint, &config.agent),
            store: self.store.clone(),
            registry: Arc::new(Registry::new()),
            interaction: Arc::new(NoHuman),
            redactor: Redactor::default(),
            workdir: self.home.root().to_path_buf(),
        }));
        Router::new(agent, self.store.clone(), policy)
    }

    /// The `session:end` events the hook recorded, once at least
    /// `expected` are in and a barrier event fired after them has run:
    /// runs are not ordered, so the barrier is what gives an extra,
    /// unexpected event the time to show up.
    async fn session_ends(&self, expected: usize) -> Vec<Value> {
        wait_for(&self.log, |t| t.matches("session:end").count() >= expected).await;
        self.hooks
            .emit_and_wait("gateway:shutdown", json!({}))
            .await;
        let text = wait_for(&self.log, |t| t.contains("gateway:shutdown")).await;
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|e| e["event"] == "session:end")
            .collect()
    }
}

/// Waits until `path` (missing reads as empty) holds text satisfying
/// `done`, and returns it.
async fn wait_for(path: &Path, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if done(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "{} never filled", path.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn idle(minutes: u64) -> SessionResetConfig {
    SessionResetConfig {
        mode: ResetMode::Idle,
        idle_minutes: minutes,
        at_hour: 4,
    }
}

fn nothing_running() -> IsRunning {
    Arc::new(|_: &str| false)
}

/// `secs` seconds after `stamp` (a store timestamp).
fn after(stamp: f64, secs: f64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(((stamp + secs) * 1000.0) as i64).unwrap()
}

fn source() -> SessionSource {
    SessionSource {
        platform: "telegram".into(),
        chat_id: "42".into(),
        chat_name: None,
        chat_type: ChatType::Dm,
        user_id: Some("42".into()),
        user_name: None,
        thread_id: None,
        is_bot: false,
    }
}

#[tokio::test]
async fn an_idle_session_is_ended_and_announced_once_and_its_route_kept() {
    let rig = Rig::new();
    rig.routed(KEY, "s1").await;
    let route = rig.store.route(KEY).await.unwrap().unwrap();
    let watcher = rig.watcher(idle(60), nothing_running());

    let later = after(route.updated_at, 61.0 * 60.0);
    let report = watcher.pass(later).await.unwrap();
    assert_eq!(report.ended, [("s1".to_owned(), AutoReset::Idle)]);
    assert_eq!(report.running, 0);
    let session = rig.store.session("s1").await.unwrap().unwrap();
    assert_eq!(session.end_reason.as_deref(), Some("idle"));
    let stamp = session.ended_at.unwrap();
    // The route stays, so the next message can tell the session expired.
    assert_eq!(rig.store.route(KEY).await.unwrap(), Some(route));

    // A second pass finds nothing more to do.
    let again = watcher.pass(later).await.unwrap();
    assert!(again.ended.is_empty(), "{again:?}");
    let session = rig.store.session("s1").await.unwrap().unwrap();
    assert_eq!(session.ended_at, Some(stamp));

    let events = rig.session_ends(1).await;
    assert_eq!(events.len(), 1, "{events:?}");
    // The payload the runner gives `session:end`, key hashed the same way.
    assert_eq!(
        events[0]["payload"],
        json!({
            "platform": "telegram",
            "session_key": talaria_core::ids::hash_id("key", KEY),
            "session_id": "s1",
            "reason": "idle",
        })
    );
}

#[tokio::test]
async fn the_watcher_tells_who_asked_which_sessions_it_ended() {
    let rig = Rig::new();
    rig.routed(KEY, "s1").await;
    let route = rig.store.route(KEY).await.unwrap().unwrap();
    let told: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let sink = told.clone();
    let watcher = rig
        .watcher(idle(60), nothing_running())
        .with_on_end(Arc::new(move |id: &str| {
            sink.lock().unwrap().push(id.to_owned())
        }));
    watcher
        .pass(after(route.updated_at, 61.0 * 60.0))
        .await
        .unwrap();
    watcher
        .pass(after(route.updated_at, 62.0 * 60.0))
        .await
        .unwrap();
    assert_eq!(*told.lock().unwrap(), ["s1"], "once, for the one it ended");
}

#[tokio::test]
async fn only_routes_idle_past_the_limit_are_touched() {
    let rig = Rig::new();
    rig.routed("agent:main:telegram:dm:old", "s_old").await;
    let old = rig
        .store
        .route("agent:main:telegram:dm:old")
        .await
        .unwrap()
        .unwrap();
    // Distinct stamps for the two routes; nothing is timed here.
    tokio::time::sleep(Duration::from_millis(50)).await;
    rig.routed("agent:main:telegram:dm:new", "s_new").await;
    let new = rig
        .store
        .route("agent:main:telegram:dm:new")
        .await
        .unwrap()
        .unwrap();
    assert!(new.updated_at - old.updated_at > 0.04);

    // An hour after a moment between the two: only the older one is idle.
    let midway = (old.updated_at + new.updated_at) / 2.0;
    let watcher = rig.watcher(idle(60), nothing_running());
    let report = watcher.pass(after(midway, 3600.0)).await.unwrap();
    assert_eq!(report.ended, [("s_old".to_owned(), AutoReset::Idle)]);
    let fresh = rig.store.session("s_new").await.unwrap().unwrap();
    assert_eq!(fresh.ended_at, None);

    // Just short of the limit, nothing is.
    let report = watcher
        .pass(after(new.updated_at, 59.0 * 60.0))
        .await
        .unwrap();
    assert!(report.ended.is_empty(), "{report:?}");
    let fresh = rig.store.session("s_new").await.unwrap().unwrap();
    assert_eq!(fresh.ended_at, None);
}

#[tokio::test]
async fn mode_none_touches_nothing() {
    let rig = Rig::new();
    rig.routed(KEY, "s1").await;
    let route = rig.store.route(KEY).await.unwrap().unwrap();
    let policy = SessionResetConfig {
        mode: ResetMode::None,
        idle_minutes: 1,
        at_hour: 4,
    };
    let watcher = rig.watcher(policy, nothing_running());
    let report = watcher
        .pass(after(route.updated_at, 365.0 * 86400.0))
        .await
        .unwrap();
    assert_eq!(report, Default::default());
    let session = rig.store.session("s1").await.unwrap().unwrap();
    assert_eq!(session.ended_at, None);
    assert!(rig.session_ends(0).await.is_empty());
}

#[tokio::test]
async fn a_session_with_a_running_turn_is_skipped_until_it_is_done() {
    let rig = Rig::new();
    rig.routed(KEY, "s1").await;
    rig.routed("agent:main:telegram:dm:7", "s2").await;
    let route = rig.store.route(KEY).await.unwrap().unwrap();
    let later = after(route.updated_at, 2.0 * 3600.0);

    let busy: IsRunning = Arc::new(|key: &str| key == KEY);
    let report = rig.watcher(idle(60), busy).pass(later).await.unwrap();
    assert_eq!(report.running, 1);
    assert_eq!(report.ended, [("s2".to_owned(), AutoReset::Idle)]);
    let session = rig.store.session("s1").await.unwrap().unwrap();
    assert_eq!(session.ended_at, None);

    // The turn is over: the next pass ends it.
    let report = rig
        .watcher(idle(60), nothing_running())
        .pass(later)
        .await
        .unwrap();
    assert_eq!(report.ended, [("s1".to_owned(), AutoReset::Idle)]);
    assert_eq!(report.running, 0);
    assert_eq!(rig.session_ends(2).await.len(), 2);
}

#[tokio::test]
async fn the_daily_reset_ends_with_reason_daily() {
    let rig = Rig::new();
    rig.routed(KEY, "s1").await;
    let route = rig.store.route(KEY).await.unwrap().unwrap();
    let policy = SessionResetConfig {
        mode: ResetMode::Daily,
        idle_minutes: 1,
        at_hour: 4,
    };
    // Two days on, the reset hour has passed at least once, whatever the
    // local time zone.
    let report = rig
        .watcher(policy.clone(), nothing_running())
        .pass(after(route.updated_at, 2.0 * 86400.0))
        .await
        .unwrap();
    assert_eq!(report.ended, [("s1".to_owned(), AutoReset::Daily)]);
    let session = rig.store.session("s1").await.unwrap().unwrap();
    assert_eq!(session.end_reason.as_deref(), Some("daily"));
    let events = rig.session_ends(1).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["payload"]["reason"], "daily");

    // `both` says idle when the idle limit is what passed.
    rig.routed("agent:main:telegram:dm:7", "s2").await;
    let both = SessionResetConfig {
        mode: ResetMode::Both,
        ..policy
    };
    let route = rig
        .store
        .route("agent:main:telegram:dm:7")
        .await
        .unwrap()
        .unwrap();
    let report = rig
        .watcher(both, nothing_running())
        .pass(after(route.updated_at, 2.0 * 86400.0))
        .await
        .unwrap();
    assert_eq!(report.ended, [("s2".to_owned(), AutoReset::Idle)]);
}

#[tokio::test]
async fn the_next_message_resets_without_ending_the_old_session_again() {
    let rig = Rig::new();
    // Idle after zero minutes: expired as soon as the clock moves, so the
    // router, which reads the real clock, sees it expired too.
    let policy = idle(0);
    let router = rig.router(policy.clone());
    let key = SessionKey::parse(KEY).unwrap();
    let first = router.current(&key, &source()).await.unwrap();
    assert_eq!(first.started, Some(Started::First));
    let old = first.handle.id.clone();
    tokio::time::sleep(Duration::from_millis(20)).await;

    let report = rig
        .watcher(policy, nothing_running())
        .pass(Utc::now())
        .await
        .unwrap();
    assert_eq!(report.ended, [(old.clone(), AutoReset::Idle)]);
    let stamp = rig.store.session(&old).await.unwrap().unwrap().ended_at;

    let next = router.current(&key, &source()).await.unwrap();
    // Still an automatic reset for the user and for `session:start`...
    assert_eq!(next.auto_reset, Some(AutoReset::Idle));
    assert_eq!(next.started, Some(Started::Idle));
    // ...but the end was the watcher's: not repeated, not reported again
    // (the runner fires `session:end` only for `ended`).
    assert_eq!(next.ended, None);
    assert_ne!(next.handle.id, old);
    let old_row = rig.store.session(&old).await.unwrap().unwrap();
    assert_eq!(old_row.ended_at, stamp);
    assert_eq!(old_row.end_reason.as_deref(), Some("idle"));
    let new_row = rig.store.session(&next.handle.id).await.unwrap().unwrap();
    assert_eq!(new_row.parent_session_id.as_deref(), Some(old.as_str()));
    assert_eq!(
        rig.store.route(KEY).await.unwrap().unwrap().session_id,
        next.handle.id
    );
    assert_eq!(rig.session_ends(1).await.len(), 1);
}

#[tokio::test]
async fn without_the_watcher_the_router_still_ends_the_expired_session() {
    let rig = Rig::new();
    let router = rig.router(idle(0));
    let key = SessionKey::parse(KEY).unwrap();
    let old = router.current(&key, &source()).await.unwrap().handle.id;
    tokio::time::sleep(Duration::from_millis(20)).await;

    let next = router.current(&key, &source()).await.unwrap();
    assert_eq!(next.started, Some(Started::Idle));
    assert_eq!(next.ended.as_deref(), Some(old.as_str()));
    let old_row = rig.store.session(&old).await.unwrap().unwrap();
    assert_eq!(old_row.end_reason.as_deref(), Some("idle"));
}

#[tokio::test]
async fn new_after_the_watcher_does_not_end_the_session_again() {
    let rig = Rig::new();
    let policy = idle(0);
    let router = rig.router(policy.clone());
    let key = SessionKey::parse(KEY).unwrap();
    let old = router.current(&key, &source()).await.unwrap().handle.id;
    tokio::time::sleep(Duration::from_millis(20)).await;
    rig.watcher(policy, nothing_running())
        .pass(Utc::now())
        .await
        .unwrap();

    let reset = router.reset(&key, &source()).await.unwrap();
    assert_eq!(reset.started, Some(Started::NewSession));
    assert_eq!(reset.ended, None);
    // `session:reset` still names the session it replaced.
    assert_eq!(reset.previous.as_deref(), Some(old.as_str()));
    let old_row = rig.store.session(&old).await.unwrap().unwrap();
    assert_eq!(old_row.end_reason.as_deref(), Some("idle"));
}
