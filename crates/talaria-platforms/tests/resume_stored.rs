//! Connectors whose resume state lives in the store (Discord's gateway
//! session, Mattermost's WebSocket connection), against their fakes and a
//! real SQLite file: a second adapter with nothing in memory, as a
//! restarted process or another node would build it, resumes where the
//! first one left off and is not given again what the first handed over;
//! a state the platform can no longer resume is forgotten; a busy
//! connection writes about once a second, not per event, and still leaves
//! its position in the store when it is killed without a word.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use talaria_gateway::{
    Adapter, AdapterContext, AdapterError, ChatType, Inbox, LivenessReporter, MessageEvent,
};
use talaria_platforms::discord::{DiscordAdapter, DiscordSettings, DiscordTimings};
use talaria_platforms::mattermost::{MattermostAdapter, MattermostSettings};
use talaria_store::{CursorStore, SqliteStore};
use talaria_testkit::mattermost::NewPost;
use talaria_testkit::wait::wait_for;
use talaria_testkit::{FakeDiscord, FakeMattermost};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(10);
const DISCORD_TOKEN: &str = "MTIzNDU2Nzg5.stored.resume-token";
const MATTERMOST_TOKEN: &str = "mmstoredresume0123456789ab";

/// One write the adapter made to the store.
#[derive(Debug, Clone, PartialEq)]
enum Write {
    Set(String, String, String),
    Delete(String, String),
}

/// A SQLite file as the adapters' store, every write noted.
struct Recorded {
    inner: SqliteStore,
    writes: Mutex<Vec<Write>>,
}

impl Recorded {
    /// The store in `path`, opened afresh (as a new process would).
    fn open(path: &Path) -> Arc<Recorded> {
        Arc::new(Recorded {
            inner: SqliteStore::open(path).unwrap(),
            writes: Mutex::new(Vec::new()),
        })
    }

    fn writes(&self) -> Vec<Write> {
        self.writes.lock().unwrap().clone()
    }

    /// The writes of `name` under `platform`.
    fn writes_of(&self, platform: &str, name: &str) -> Vec<Write> {
        self.writes()
            .into_iter()
            .filter(|w| match w {
                Write::Set(p, n, _) | Write::Delete(p, n) => p == platform && n == name,
            })
            .collect()
    }

    /// The stored value of `name` under `platform`, as JSON.
    async fn json(&self, platform: &str, name: &str) -> Option<serde_json::Value> {
        let value = self.inner.cursor(platform, name).await.unwrap()?;
        Some(serde_json::from_str(&value).unwrap())
    }
}

#[async_trait]
impl CursorStore for Recorded {
    async fn cursor(&self, platform: &str, name: &str) -> talaria_store::Result<Option<String>> {
        self.inner.cursor(platform, name).await
    }

    async fn set_cursor(
        &self,
        platform: &str,
        name: &str,
        value: &str,
    ) -> talaria_store::Result<()> {
        self.writes
            .lock()
            .unwrap()
            .push(Write::Set(platform.into(), name.into(), value.into()));
        self.inner.set_cursor(platform, name, value).await
    }

    async fn delete_cursor(&self, platform: &str, name: &str) -> talaria_store::Result<bool> {
        self.writes
            .lock()
            .unwrap()
            .push(Write::Delete(platform.into(), name.into()));
        self.inner.delete_cursor(platform, name).await
    }
}

/// A state database in a directory of its own.
fn database() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    (dir, path)
}

/// An adapter's `run`, its events and its stop.
struct Running {
    events: mpsc::Receiver<MessageEvent>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), AdapterError>>,
}

fn spawn(adapter: Arc<dyn Adapter>) -> Running {
    let (inbox, events) = Inbox::channel(64);
    let (reporter, _liveness) = LivenessReporter::new();
    let shutdown = CancellationToken::new();
    let ctx = AdapterContext {
        inbox,
        liveness: reporter,
        shutdown: shutdown.clone(),
    };
    let task = tokio::spawn(async move { adapter.run(ctx).await });
    Running {
        events,
        shutdown,
        task,
    }
}

impl Running {
    async fn next(&mut self) -> MessageEvent {
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .expect("no event in time")
            .expect("inbox closed")
    }

    /// A clean stop: the gateway shutting down.
    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("run did not return")
            .expect("run panicked")
            .unwrap();
    }

    /// The task ended without a word, as a killed process's would.
    async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }

    /// Nothing more arrived (after a moment for anything in flight).
    async fn nothing_more(&mut self) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        if let Ok(ev) = self.events.try_recv() {
            panic!("handed over again: {:?}", ev.text);
        }
    }
}

fn discord(fake: &FakeDiscord, store: &Arc<Recorded>) -> Arc<DiscordAdapter> {
    let settings = DiscordSettings {
        token: DISCORD_TOKEN.into(),
        api_base: fake.api_base(),
        gateway_url: None,
        require_mention: true,
        timings: DiscordTimings {
            connect_timeout: Duration::from_secs(5),
            reidentify_delay: Duration::from_millis(50),
        },
    };
    let store: Arc<dyn CursorStore> = store.clone();
    Arc::new(
        DiscordAdapter::new(settings)
            .unwrap()
            .keeping_session_in(store),
    )
}

fn session_name(fake: &FakeDiscord) -> String {
    format!("session:{}", fake.bot_id())
}

/// Waits until the stored session's `seq` is `seq`.
async fn discord_stored_seq(store: &Recorded, fake: &FakeDiscord, seq: u64) {
    let name = session_name(fake);
    wait_for("the stored sequence number", || async {
        let stored = store.json("discord", &name).await;
        match stored.as_ref().and_then(|v| v["seq"].as_u64()) {
            Some(s) if s == seq => Ok(()),
            _ => Err(stored),
        }
    })
    .await;
}

#[tokio::test]
async fn a_new_discord_adapter_resumes_the_stored_session_and_gets_only_what_it_missed() {
    let (_dir, db) = database();
    let fake = FakeDiscord::start(DISCORD_TOKEN).await;
    let store = Recorded::open(&db);
    let mut run = spawn(discord(&fake, &store));
    fake.wait_for_sessions(1, WAIT).await;
    // A thread the first process learns of, and two messages it hands over.
    let at = fake.mention();
    fake.push_thread_message("7", "70", "7001", "42", &format!("{at} in the thread"));
    assert_eq!(run.next().await.text, "in the thread");
    fake.push_dm("42", "one");
    assert_eq!(run.next().await.text, "one");
    run.stop().await;
    drop(store);

    fake.push_dm("42", "while nobody was connected");
    // Nothing in memory: another process, the same database.
    let store = Recorded::open(&db);
    let b = discord(&fake, &store);
    let mut run = spawn(b.clone());
    fake.wait_for_sessions(2, WAIT).await;
    assert_eq!(run.next().await.text, "while nobody was connected");
    assert_eq!(fake.ready_and_resumed(), (1, 1), "resumed, not identified");
    assert_eq!(fake.frames_with_op(2).len(), 1, "one Identify, the first");
    let resume = &fake.frames_with_op(6)[0].d;
    assert_eq!(resume["token"], DISCORD_TOKEN);
    assert_eq!(resume["session_id"], "fake-session-1");
    // READY 1, THREAD_CREATE 2, the two messages 3 and 4.
    assert_eq!(resume["seq"], 4);
    assert_eq!(fake.connections()[1].path, "/resume");
    // It asked who the bot is, so mentions of it still count...
    assert_eq!(b.bot_id().as_deref(), Some(fake.bot_id()));
    assert!(
        fake.requests()
            .iter()
            .any(|r| r.method == "GET" && r.path == "/users/@me")
    );
    // ...and it knows the thread no GUILD_CREATE told it of.
    fake.push_thread_message("7", "70", "7001", "42", &format!("{at} again"));
    let ev = run.next().await;
    assert_eq!(ev.text, "again");
    assert_eq!(ev.source.chat_type, ChatType::Thread);
    assert_eq!(ev.source.chat_id, "70");
    assert_eq!(ev.source.thread_id.as_deref(), Some("7001"));
    run.nothing_more().await;
    run.stop().await;
}

#[tokio::test]
async fn a_stored_discord_session_that_cannot_be_resumed_is_forgotten() {
    let (_dir, db) = database();
    let fake = FakeDiscord::start(DISCORD_TOKEN).await;
    let store = Recorded::open(&db);
    let mut run = spawn(discord(&fake, &store));
    fake.wait_for_sessions(1, WAIT).await;
    fake.push_dm("42", "one");
    assert_eq!(run.next().await.text, "one");
    run.stop().await;
    // Discord forgets the session while nobody is connected.
    assert!(!fake.invalidate_session(false), "no connection to tell");

    let store = Recorded::open(&db);
    let mut run = spawn(discord(&fake, &store));
    fake.wait_for_sessions(2, WAIT).await;
    // It tried the stored session, heard op 9, and identified afresh.
    assert_eq!(fake.frames_with_op(6)[0].d["session_id"], "fake-session-1");
    assert_eq!(fake.ready_and_resumed(), (2, 0));
    let name = session_name(&fake);
    wait_for("the new session in the store", || async {
        let stored = store.json("discord", &name).await;
        match stored.as_ref().map(|v| v["session_id"].clone()) {
            Some(id) if id == "fake-session-2" => Ok(()),
            _ => Err(stored),
        }
    })
    .await;
    // The dead session was forgotten before the new one was written.
    let writes = store.writes_of("discord", &name);
    assert_eq!(writes[0], Write::Delete("discord".into(), name.clone()));
    assert!(
        matches!(&writes[1], Write::Set(_, _, v) if v.contains("fake-session-2")),
        "{writes:?}"
    );
    fake.push_dm("42", "two");
    assert_eq!(run.next().await.text, "two");
    run.nothing_more().await;
    run.stop().await;
}

#[tokio::test]
async fn a_busy_discord_session_is_written_about_once_a_second_and_survives_a_kill() {
    let (_dir, db) = database();
    let fake = FakeDiscord::start(DISCORD_TOKEN).await;
    let store = Recorded::open(&db);
    let mut run = spawn(discord(&fake, &store));
    fake.wait_for_sessions(1, WAIT).await;
    // READY is written at once.
    discord_stored_seq(&store, &fake, 1).await;
    let name = session_name(&fake);
    let before = store.writes_of("discord", &name).len();
    for i in 0..30 {
        fake.push_dm("42", &format!("message {i}"));
    }
    for i in 0..30 {
        assert_eq!(run.next().await.text, format!("message {i}"));
    }
    // Within the second after: the last one handled, without a stop.
    discord_stored_seq(&store, &fake, 31).await;
    let writes = store.writes_of("discord", &name).len() - before;
    assert!(
        (1..=3).contains(&writes),
        "{writes} writes for 30 dispatches"
    );
    // Killed: nothing is written on the way out, nor needed.
    run.kill().await;
    fake.push_dm("42", "after the kill");

    let store = Recorded::open(&db);
    let mut run = spawn(discord(&fake, &store));
    assert_eq!(run.next().await.text, "after the kill");
    assert_eq!(fake.frames_with_op(6)[0].d["seq"], 31);
    run.nothing_more().await;
    run.stop().await;
}

fn mattermost(fake: &FakeMattermost, store: &Arc<Recorded>) -> Arc<MattermostAdapter> {
    let settings = MattermostSettings {
        ping_interval: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(5),
        send_timeout: Duration::from_secs(5),
        ..MattermostSettings::new(fake.url(), MATTERMOST_TOKEN)
    };
    let store: Arc<dyn CursorStore> = store.clone();
    Arc::new(
        MattermostAdapter::new(settings)
            .unwrap()
            .keeping_connection_in(store),
    )
}

fn connection_name(fake: &FakeMattermost) -> String {
    format!("websocket:{}@{}", fake.bot_id(), fake.url())
}

/// Waits until the stored connection is `id`, expecting `next_seq`.
async fn mattermost_stored(store: &Recorded, fake: &FakeMattermost, id: &str, next_seq: i64) {
    let name = connection_name(fake);
    wait_for("the stored connection", || async {
        let stored = store.json("mattermost", &name).await;
        match &stored {
            Some(v) if v["connection_id"] == id && v["sequence_number"] == next_seq => Ok(()),
            _ => Err(stored),
        }
    })
    .await;
}

#[tokio::test]
async fn a_new_mattermost_adapter_resumes_the_stored_connection_and_gets_only_what_it_missed() {
    let (_dir, db) = database();
    let fake = FakeMattermost::start(MATTERMOST_TOKEN).await;
    let store = Recorded::open(&db);
    let mut run = spawn(mattermost(&fake, &store));
    fake.push(NewPost::dm("alice", "one"));
    assert_eq!(run.next().await.text, "one");
    run.stop().await;
    drop(store);

    fake.push(NewPost::dm("alice", "while nobody was connected"));
    let store = Recorded::open(&db);
    let mut run = spawn(mattermost(&fake, &store));
    assert_eq!(run.next().await.text, "while nobody was connected");
    let conns = fake.connections();
    assert_eq!(conns.len(), 2);
    assert!(conns[1].resumed, "{conns:#?}");
    assert_eq!(
        conns[1].asked_id.as_deref(),
        Some(conns[0].connection_id.as_str())
    );
    // hello was 0 and "one" 1: the next wanted is 2.
    assert_eq!(conns[1].asked_seq, Some(2));
    fake.push(NewPost::dm("alice", "after"));
    assert_eq!(run.next().await.text, "after");
    run.nothing_more().await;
    run.stop().await;
    mattermost_stored(&store, &fake, &conns[0].connection_id, 4).await;
}

#[tokio::test]
async fn a_stored_mattermost_connection_the_server_forgot_is_replaced() {
    let (_dir, db) = database();
    let fake = FakeMattermost::start(MATTERMOST_TOKEN).await;
    let store = Recorded::open(&db);
    let mut run = spawn(mattermost(&fake, &store));
    fake.push(NewPost::dm("alice", "one"));
    assert_eq!(run.next().await.text, "one");
    run.stop().await;
    let first = fake.connections()[0].connection_id.clone();
    mattermost_stored(&store, &fake, &first, 2).await;
    // The server drops its buffer: the connection cannot be resumed.
    fake.expire_connection();

    let store = Recorded::open(&db);
    let mut run = spawn(mattermost(&fake, &store));
    let conns = fake.wait_for_connections(2, WAIT).await;
    assert_eq!(conns[1].asked_id.as_deref(), Some(first.as_str()));
    assert!(!conns[1].resumed);
    // The new hello's connection replaces the stored one.
    mattermost_stored(&store, &fake, &conns[1].connection_id, 1).await;
    fake.push(NewPost::dm("alice", "fresh"));
    assert_eq!(run.next().await.text, "fresh");
    run.nothing_more().await;
    run.stop().await;
}

#[tokio::test]
async fn a_busy_mattermost_connection_is_written_about_once_a_second_and_survives_a_kill() {
    let (_dir, db) = database();
    let fake = FakeMattermost::start(MATTERMOST_TOKEN).await;
    let store = Recorded::open(&db);
    let mut run = spawn(mattermost(&fake, &store));
    let conns = fake.wait_for_connections(1, WAIT).await;
    let id = conns[0].connection_id.clone();
    mattermost_stored(&store, &fake, &id, 1).await;
    let name = connection_name(&fake);
    let before = store.writes_of("mattermost", &name).len();
    for i in 0..30 {
        fake.push(NewPost::dm("alice", &format!("post {i}")));
    }
    for i in 0..30 {
        assert_eq!(run.next().await.text, format!("post {i}"));
    }
    mattermost_stored(&store, &fake, &id, 31).await;
    let writes = store.writes_of("mattermost", &name).len() - before;
    assert!((1..=3).contains(&writes), "{writes} writes for 30 events");
    run.kill().await;
    fake.push(NewPost::dm("alice", "after the kill"));

    let store = Recorded::open(&db);
    let mut run = spawn(mattermost(&fake, &store));
    assert_eq!(run.next().await.text, "after the kill");
    let conns = fake.connections();
    assert!(conns[1].resumed);
    assert_eq!(conns[1].asked_seq, Some(31));
    run.nothing_more().await;
    run.stop().await;
}
