//! The Matrix adapter against the fake homeserver in talaria-testkit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::json;
use talaria_core::Env;
use talaria_gateway::auth::AuthPolicy;
use talaria_gateway::{
    Adapter, AdapterContext, AdapterError, ChatType, Inbox, Liveness, LivenessReporter,
    MessageEvent, OutboundMessage, SendError,
};
use talaria_platforms::matrix::{E2eeMode, E2eeSettings, MatrixAdapter, MatrixSettings};
use talaria_store::CursorStore;
use talaria_testkit::FakeMatrix;
use talaria_testkit::matrix::BOT_USER_ID;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "syt_dGFsYXJpYQ_test_token_0123";
const WAIT: Duration = Duration::from_secs(10);
const ALICE: &str = "@alice:localhost";
const BOB: &str = "@bob:localhost";

/// Cursors in memory, shared by adapters that stand for one process's
/// successive incarnations.
#[derive(Default)]
struct Cursors(Mutex<HashMap<(String, String), String>>);

#[async_trait]
impl CursorStore for Cursors {
    async fn cursor(&self, platform: &str, name: &str) -> talaria_store::Result<Option<String>> {
        Ok(self
            .0
            .lock()
            .unwrap()
            .get(&(platform.to_owned(), name.to_owned()))
            .cloned())
    }
    async fn set_cursor(
        &self,
        platform: &str,
        name: &str,
        value: &str,
    ) -> talaria_store::Result<()> {
        self.0
            .lock()
            .unwrap()
            .insert((platform.to_owned(), name.to_owned()), value.to_owned());
        Ok(())
    }
    async fn delete_cursor(&self, platform: &str, name: &str) -> talaria_store::Result<bool> {
        Ok(self
            .0
            .lock()
            .unwrap()
            .remove(&(platform.to_owned(), name.to_owned()))
            .is_some())
    }
}

impl Cursors {
    fn saved(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap()
            .get(&("matrix".to_owned(), format!("next_batch:{BOT_USER_ID}")))
            .cloned()
    }
}

fn settings(fake: &FakeMatrix) -> MatrixSettings {
    MatrixSettings {
        homeserver: fake.homeserver(),
        access_token: TOKEN.into(),
        user_id: None,
        require_mention: true,
        sync_timeout: Duration::from_millis(300),
        retry_base: Duration::from_millis(20),
        max_sync_failures: 4,
        invite_policy: None,
        e2ee: E2eeSettings {
            mode: E2eeMode::Off,
            ..E2eeSettings::default()
        },
    }
}

fn adapter_with(s: MatrixSettings, cursors: &Arc<Cursors>) -> Arc<MatrixAdapter> {
    Arc::new(MatrixAdapter::new(s, cursors.clone()).unwrap())
}

struct Running {
    events: mpsc::Receiver<MessageEvent>,
    liveness: watch::Receiver<Liveness>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), AdapterError>>,
}

fn spawn(adapter: &Arc<MatrixAdapter>) -> Running {
    let (inbox, events) = Inbox::channel(16);
    let (reporter, liveness) = LivenessReporter::new();
    let shutdown = CancellationToken::new();
    let ctx = AdapterContext {
        inbox,
        liveness: reporter,
        shutdown: shutdown.clone(),
    };
    let a = adapter.clone();
    let task = tokio::spawn(async move { a.run(ctx).await });
    Running {
        events,
        liveness,
        shutdown,
        task,
    }
}

impl Running {
    /// Waits until a sync was answered (the first one skips history).
    async fn live(&self) {
        tokio::time::timeout(
            WAIT,
            self.liveness.clone().wait_for(|l| *l == Liveness::Live),
        )
        .await
        .expect("no sync in time")
        .unwrap();
    }

    async fn next(&mut self) -> MessageEvent {
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .expect("no event in time")
            .expect("inbox closed")
    }

    /// Nothing more arrives while the adapter catches up with the log.
    async fn nothing_more(&mut self, fake: &FakeMatrix) {
        fake.wait_until_caught_up(WAIT).await;
        if let Ok(ev) = self.events.try_recv() {
            panic!("unexpected event: {ev:?}");
        }
    }

    async fn stop(self) -> Result<(), AdapterError> {
        self.shutdown.cancel();
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("run did not return")
            .expect("run panicked")
    }

    async fn ended(self) -> Result<(), AdapterError> {
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("run did not return")
            .expect("run panicked")
    }
}

/// Starts an adapter and waits until its first sync (which skips history)
/// is done.
async fn started(fake: &FakeMatrix, a: &Arc<MatrixAdapter>) -> Running {
    let run = spawn(a);
    fake.wait_until_caught_up(WAIT).await;
    run
}

fn out(room: &str, thread: Option<&str>, reply_to: Option<&str>, text: &str) -> OutboundMessage {
    OutboundMessage {
        chat_id: room.into(),
        thread_id: thread.map(Into::into),
        reply_to: reply_to.map(Into::into),
        text: text.into(),
        choices: Vec::new(),
    }
}

#[tokio::test]
async fn the_first_sync_skips_history_and_later_dm_messages_become_events() {
    let fake = FakeMatrix::start(TOKEN).await;
    let cursors = Arc::new(Cursors::default());
    let dm = fake.create_dm(ALICE);
    fake.push_text(&dm, ALICE, "an old message from before the bot ran");
    let a = adapter_with(settings(&fake), &cursors);
    let mut run = started(&fake, &a).await;
    assert_eq!(*run.liveness.borrow(), Liveness::Live);
    assert_eq!(fake.sync_calls()[0].since, None);
    assert_eq!(cursors.saved(), Some(fake.current_token()));

    let id = fake.push_text(&dm, ALICE, "hello there");
    let ev = run.next().await;
    assert_eq!(ev.text, "hello there");
    assert_eq!(ev.message_id.as_deref(), Some(id.as_str()));
    assert_eq!(ev.source.platform, "matrix");
    assert_eq!(ev.source.chat_id, dm);
    assert_eq!(ev.source.chat_type, ChatType::Dm);
    assert_eq!(ev.source.user_id.as_deref(), Some(ALICE));
    assert_eq!(ev.source.user_name.as_deref(), Some("Alice"));
    assert_eq!(ev.source.thread_id, None);
    run.nothing_more(&fake).await;
    assert_eq!(cursors.saved(), Some(fake.current_token()));
    assert_eq!(a.user_id().as_deref(), Some(BOT_USER_ID));
    assert_eq!(
        a.credential(),
        Some(("matrix-access-token", TOKEN.to_owned()))
    );
    // The whole long poll asked for the configured timeout and a filter.
    let last = fake.sync_calls().last().cloned().unwrap();
    assert_eq!(last.timeout_ms, Some(300));
    assert!(last.filter.unwrap().contains("timeline"));
    run.stop().await.unwrap();
}

#[tokio::test]
async fn group_rooms_need_a_mention_and_threads_keep_their_root() {
    let fake = FakeMatrix::start(TOKEN).await;
    let cursors = Arc::new(Cursors::default());
    let room = "!group:localhost";
    fake.create_room(room, Some("Team"), &[ALICE, BOB]);
    let a = adapter_with(settings(&fake), &cursors);
    let mut run = started(&fake, &a).await;

    fake.push_text(room, ALICE, "lunch anyone?");
    let asked = fake.push_text(room, BOB, "Talaria: what is 2+2?");
    let ev = run.next().await;
    assert_eq!(ev.message_id.as_deref(), Some(asked.as_str()));
    assert_eq!(ev.text, "what is 2+2?");
    assert_eq!(ev.source.chat_type, ChatType::Group);
    assert_eq!(ev.source.chat_name.as_deref(), Some("Team"));

    let root = fake.push_text(room, ALICE, "a thread about deploys");
    fake.push_event(
        room,
        ALICE,
        json!({"msgtype": "m.text", "body": "deploy now?",
               "m.mentions": {"user_ids": [BOT_USER_ID]},
               "m.relates_to": {"rel_type": "m.thread", "event_id": root,
                                "is_falling_back": true, "m.in_reply_to": {"event_id": root}}}),
    );
    let ev = run.next().await;
    assert_eq!(ev.text, "deploy now?");
    assert_eq!(ev.source.thread_id.as_deref(), Some(root.as_str()));
    assert_eq!(ev.reply_to_message_id, None);

    // Once the bot wrote in the thread, it is a conversation: no mention.
    a.send(&out(room, Some(&root), ev.message_id.as_deref(), "yes"))
        .await
        .unwrap();
    fake.push_thread_text(room, BOB, &root, "and the database?");
    let ev = run.next().await;
    assert_eq!(ev.text, "and the database?");
    run.nothing_more(&fake).await;
    run.stop().await.unwrap();
}

#[tokio::test]
async fn own_messages_notices_encrypted_and_malformed_events_are_skipped() {
    let fake = FakeMatrix::start(TOKEN).await;
    let cursors = Arc::new(Cursors::default());
    let dm = fake.create_dm(ALICE);
    let a = adapter_with(settings(&fake), &cursors);
    let mut run = started(&fake, &a).await;

    a.send(&out(&dm, None, None, "the bot speaks"))
        .await
        .unwrap();
    fake.push_event(
        &dm,
        ALICE,
        json!({"msgtype": "m.notice", "body": "a bot notice"}),
    );
    for _ in 0..2 {
        fake.push_raw(
            &dm,
            json!({"type": "m.room.encrypted", "sender": ALICE,
                   "content": {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "x"}}),
        );
    }
    fake.push_raw(
        &dm,
        json!({"type": "m.room.message", "content": "not an object"}),
    );
    fake.push_raw(
        &dm,
        json!({"type": "m.room.message", "sender": ALICE, "content": {"body": 7}}),
    );
    fake.push_raw(&dm, json!("not even an object"));
    let good = fake.push_text(&dm, ALICE, "still listening?");
    let ev = run.next().await;
    assert_eq!(ev.message_id.as_deref(), Some(good.as_str()));
    run.nothing_more(&fake).await;
    assert_eq!(*run.liveness.borrow(), Liveness::Live);
    run.stop().await.unwrap();
}

#[tokio::test]
async fn a_dropped_or_failed_sync_is_retried_from_the_same_token() {
    let fake = FakeMatrix::start(TOKEN).await;
    let cursors = Arc::new(Cursors::default());
    let dm = fake.create_dm(ALICE);
    let a = adapter_with(settings(&fake), &cursors);
    let mut run = started(&fake, &a).await;
    let before = fake.current_token();
    // The poll already waiting on the server is the one that is dropped.
    let calls_before = fake.sync_calls().len() - 1;

    // The answer carrying the first message is cut off mid-body, and the
    // retry after it meets a proxy's 502.
    fake.drop_next_sync();
    fake.fail_next_syncs(1);
    let first = fake.push_text(&dm, ALICE, "first");
    let ev = run.next().await;
    assert_eq!(ev.message_id.as_deref(), Some(first.as_str()));
    let second = fake.push_text(&dm, ALICE, "second");
    let ev = run.next().await;
    assert_eq!(ev.message_id.as_deref(), Some(second.as_str()));
    run.nothing_more(&fake).await;

    let sinces: Vec<Option<String>> = fake.sync_calls()[calls_before..]
        .iter()
        .map(|c| c.since.clone())
        .collect();
    let from_before = sinces
        .iter()
        .filter(|s| s.as_deref() == Some(before.as_str()))
        .count();
    assert!(
        from_before >= 3,
        "the failed polls were retried from the same token: {sinces:?}"
    );
    assert_eq!(*run.liveness.borrow(), Liveness::Live);
    run.stop().await.unwrap();
}

#[tokio::test]
async fn a_restart_continues_from_the_saved_token() {
    let fake = FakeMatrix::start(TOKEN).await;
    let cursors = Arc::new(Cursors::default());
    let dm = fake.create_dm(ALICE);
    let a = adapter_with(settings(&fake), &cursors);
    let mut run = started(&fake, &a).await;
    fake.push_text(&dm, ALICE, "before the restart");
    assert_eq!(run.next().await.text, "before the restart");
    run.nothing_more(&fake).await;
    run.stop().await.unwrap();

    // Written while no adapter ran: neither lost nor taken for history.
    let missed = fake.push_text(&dm, ALICE, "while it was down");
    let b = adapter_with(settings(&fake), &cursors);
    let mut run = spawn(&b);
    let ev = run.next().await;
    assert_eq!(ev.message_id.as_deref(), Some(missed.as_str()));
    run.nothing_more(&fake).await;
    assert!(
        fake.sync_calls()
            .iter()
            .filter(|c| c.since.is_none())
            .count()
            == 1,
        "only the very first start synced without a token"
    );
    run.stop().await.unwrap();
}

/// A homeserver without the key endpoints (this fake has none): with
/// encryption `optional` the adapter goes on with plain rooms; with
/// `required` it refuses to connect, saying why.
#[tokio::test]
async fn a_homeserver_without_key_endpoints_is_plain_only_or_refused_when_required() {
    let fake = FakeMatrix::start(TOKEN).await;
    let cursors = Arc::new(Cursors::default());
    let dm = fake.create_dm(ALICE);
    let homedir = tempfile::tempdir().unwrap();
    let with = |mode| MatrixSettings {
        e2ee: E2eeSettings {
            mode,
            store_root: Some(homedir.path().join("crypto")),
            ..E2eeSettings::default()
        },
        ..settings(&fake)
    };
    let a = adapter_with(with(E2eeMode::Optional), &cursors);
    let mut run = started(&fake, &a).await;
    fake.push_text(&dm, ALICE, "plain still works");
    assert_eq!(run.next().await.text, "plain still works");
    run.stop().await.unwrap();

    let b = adapter_with(with(E2eeMode::Required), &cursors);
    match spawn(&b).ended().await {
        Err(AdapterError::Fatal(why)) => {
            assert!(
                why.contains("encryption is required but cannot be set up"),
                "{why}"
            );
            assert!(
                why.contains("keys/query") || why.contains("Unrecognized"),
                "{why}"
            );
        }
        other => panic!("required encryption without key endpoints: {other:?}"),
    }
}

#[tokio::test]
async fn repeated_sync_failures_disconnect_and_a_revoked_token_is_fatal() {
    let fake = FakeMatrix::start(TOKEN).await;
    let cursors = Arc::new(Cursors::default());
    let dm = fake.create_dm(ALICE);
    let a = adapter_with(settings(&fake), &cursors);
    let run = started(&fake, &a).await;
    let mut liveness = run.liveness.clone();
    fake.fail_next_syncs(100);
    liveness
        .wait_for(|l| *l == Liveness::Degraded)
        .await
        .unwrap();
    let started_at = Instant::now();
    let err = run.ended().await.unwrap_err();
    assert!(matches!(err, AdapterError::Disconnected(_)), "{err:?}");
    // Backoff 20 + 40 + 80 ms between the four attempts.
    assert!(started_at.elapsed() < Duration::from_secs(5));

    fake.fail_next_syncs(0);
    fake.revoke_token();
    let err = spawn(&a).ended().await.unwrap_err();
    assert!(matches!(err, AdapterError::Fatal(_)), "{err:?}");
    assert!(!err.to_string().contains(TOKEN));
    // A send with the revoked token leaves the reply owed rather than
    // giving it up: the token, not the message, is at fault.
    let err = a
        .send(&out(&dm, None, None, "still owed"))
        .await
        .unwrap_err();
    assert!(matches!(err, SendError::Unavailable(_)), "{err:?}");
    assert!(!err.to_string().contains(TOKEN));
}

#[tokio::test]
async fn rate_limits_are_waited_out_and_then_reported() {
    let fake = FakeMatrix::start(TOKEN).await;
    let cursors = Arc::new(Cursors::default());
    let dm = fake.create_dm(ALICE);
    let a = adapter_with(settings(&fake), &cursors);

    fake.fail_next_send_with_429(300);
    let t = Instant::now();
    let sent = a.send(&out(&dm, None, None, "patience")).await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    let attempts = fake.send_attempts();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0].path, attempts[1].path, "one transaction id");
    assert_eq!(fake.sent().len(), 1);
    assert_eq!(sent.message_id, Some(fake.sent()[0].event_id.clone()));

    for _ in 0..4 {
        fake.fail_next_send_with_429(20);
    }
    let err = a.send(&out(&dm, None, None, "again")).await.unwrap_err();
    assert_eq!(err, SendError::RateLimited(Duration::from_millis(20)));
    assert_eq!(fake.sent().len(), 1);
}

#[tokio::test]
async fn a_retried_send_reuses_its_transaction_and_a_repeat_is_a_new_message() {
    let fake = FakeMatrix::start(TOKEN).await;
    let cursors = Arc::new(Cursors::default());
    let dm = fake.create_dm(ALICE);
    let a = adapter_with(settings(&fake), &cursors);
    let msg = out(&dm, None, Some("$question"), "the answer");

    // A send that is lost on the way fails; its retry uses the same id.
    fake.hang_send(true);
    let pending = {
        let a = a.clone();
        let msg = msg.clone();
        tokio::spawn(async move { a.send(&msg).await })
    };
    fake.wait_for_send_attempts(1, WAIT).await;
    fake.hang_send(false);
    let err = pending.await.unwrap().unwrap_err();
    assert!(matches!(err, SendError::Transient(_)), "{err:?}");
    a.send(&msg).await.unwrap();
    a.send(&msg).await.unwrap();
    let attempts = fake.send_attempts();
    assert_eq!(attempts.len(), 3);
    assert_eq!(attempts[0].path, attempts[1].path);
    assert_ne!(attempts[1].path, attempts[2].path);
    assert_eq!(fake.sent().len(), 2);

    // A send that arrived but whose answer was lost: the retry is
    // answered with the first event and posts nothing new.
    fake.drop_next_send_answer();
    let lost = out(&dm, None, Some("$other"), "lost answer");
    let err = a.send(&lost).await.unwrap_err();
    assert!(matches!(err, SendError::Ambiguous(_)), "{err:?}");
    assert_eq!(fake.sent().len(), 3);
    let again = a.send(&lost).await.unwrap();
    assert_eq!(again.message_id, Some(fake.sent()[2].event_id.clone()));
    assert_eq!(fake.sent().len(), 3, "the homeserver posted it once");
    let attempts = fake.send_attempts();
    assert_eq!(attempts[3].path, attempts[4].path);

    // Forbidden rooms are refused for good.
    let err = a
        .send(&out("!nowhere:localhost", None, None, "x"))
        .await
        .unwrap_err();
    assert!(matches!(err, SendError::Rejected(_)), "{err:?}");
}

#[tokio::test]
async fn sends_carry_html_threads_and_replies_and_typing_names_the_bot() {
    let fake = FakeMatrix::start(TOKEN).await;
    let cursors = Arc::new(Cursors::default());
    let room = "!group:localhost";
    fake.create_room(room, None, &[ALICE, BOB]);
    let a = adapter_with(settings(&fake), &cursors);

    a.send(&out(room, None, Some("$q"), "**bold** <script>x</script>"))
        .await
        .unwrap();
    a.send(&out(room, Some("$root"), Some("$latest"), "in thread"))
        .await
        .unwrap();
    a.send(&out(room, Some("$root"), None, "later part"))
        .await
        .unwrap();
    let sent = fake.sent();
    assert_eq!(sent[0].body(), "**bold** <script>x</script>");
    let html = sent[0].html().unwrap();
    assert!(html.contains("<strong>bold</strong>"), "{html}");
    assert!(!html.contains("<script>"), "{html}");
    assert_eq!(sent[0].content["format"], "org.matrix.custom.html");
    assert_eq!(sent[0].in_reply_to().as_deref(), Some("$q"));
    assert_eq!(sent[0].thread_root(), None);
    assert_eq!(sent[1].thread_root().as_deref(), Some("$root"));
    assert_eq!(sent[1].in_reply_to().as_deref(), Some("$latest"));
    assert_eq!(sent[1].content["m.relates_to"]["is_falling_back"], true);
    assert_eq!(sent[2].thread_root().as_deref(), Some("$root"));

    a.typing(room, None).await.unwrap();
    let typing = fake.typing();
    assert_eq!(typing.len(), 1);
    assert_eq!(typing[0].room_id, room);
    assert_eq!(typing[0].user_id, BOT_USER_ID);
    assert!(typing[0].typing);
    assert_eq!(typing[0].timeout_ms, Some(30_000));
}

#[tokio::test]
async fn invites_from_allowed_users_are_joined_and_others_ignored() {
    let fake = FakeMatrix::start(TOKEN).await;
    let cursors = Arc::new(Cursors::default());
    let mut s = settings(&fake);
    s.invite_policy = Some(AuthPolicy::from_env(&Env::from_pairs([(
        "MATRIX_ALLOWED_USERS",
        ALICE,
    )])));
    let a = adapter_with(s, &cursors);
    // An invite pending before the first start is still accepted.
    fake.invite("!early:localhost", ALICE, true);
    let mut run = started(&fake, &a).await;
    fake.wait_for_joins(1, WAIT).await;
    fake.invite("!stranger:localhost", "@mallory:localhost", true);
    fake.invite("!later:localhost", ALICE, false);
    let joins = fake.wait_for_joins(2, WAIT).await;
    run.nothing_more(&fake).await;
    assert_eq!(joins, vec!["!early:localhost", "!later:localhost"]);

    // The direct invite's room is a DM.
    let id = fake.push_text("!early:localhost", ALICE, "thanks for joining");
    let ev = run.next().await;
    assert_eq!(ev.message_id.as_deref(), Some(id.as_str()));
    assert_eq!(ev.source.chat_type, ChatType::Dm);
    run.stop().await.unwrap();
}

#[tokio::test]
async fn liveness_is_live_only_once_a_sync_was_answered() {
    let fake = FakeMatrix::start(TOKEN).await;
    let cursors = Arc::new(Cursors::default());
    fake.create_dm(ALICE);
    // whoami works, but the syncs fail: connected over TCP is not live.
    fake.fail_next_syncs(2);
    let a = adapter_with(settings(&fake), &cursors);
    let run = spawn(&a);
    let mut seen = Vec::new();
    let mut liveness = run.liveness.clone();
    let deadline = tokio::time::Instant::now() + WAIT;
    while *liveness.borrow_and_update() != Liveness::Live {
        seen.push(*liveness.borrow());
        tokio::time::timeout_at(deadline, liveness.changed())
            .await
            .expect("never live")
            .unwrap();
    }
    assert!(seen.contains(&Liveness::Degraded), "{seen:?}");
    assert!(!seen.contains(&Liveness::Live));
    assert!(fake.sync_calls().len() >= 3, "two failures, then an answer");
    run.stop().await.unwrap();
}

#[tokio::test]
async fn a_bracketed_room_id_is_a_delivery_target() {
    let fake = FakeMatrix::start(TOKEN).await;
    let cursors = Arc::new(Cursors::default());
    let room = fake.create_dm(ALICE);
    let a = adapter_with(settings(&fake), &cursors);
    let delivery = talaria_gateway::delivery::Delivery::new(vec![a as Arc<dyn Adapter>], None);
    let target = format!("matrix:[{room}]");
    talaria_gateway::messenger::send_to_target(&delivery, &target, None, "to the room")
        .await
        .unwrap();
    let sent = fake.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].room_id, room);
    assert_eq!(sent[0].body(), "to the room");
}

fn joined_members_asked(fake: &FakeMatrix, room: &str) -> usize {
    fake.requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == format!("rooms/{room}/joined_members"))
        .count()
}

/// Issue 19, item 7: the adapter took "direct" from a sync's member count,
/// which Synapse (like the fake now) does not send, and from what it saw
/// in memory. A two-member room is a direct chat however it was made, and
/// a restarted adapter knows it from the store without asking again.
#[tokio::test]
async fn a_two_member_room_is_a_dm_before_and_after_a_restart() {
    let fake = FakeMatrix::start(TOKEN).await;
    let cursors = Arc::new(Cursors::default());
    let room = "!pair:localhost";
    fake.create_room(room, None, &[ALICE]);
    let a = adapter_with(settings(&fake), &cursors);
    let mut run = started(&fake, &a).await;
    fake.push_text(room, ALICE, "no mention needed");
    let ev = run.next().await;
    assert_eq!(ev.text, "no mention needed");
    assert_eq!(ev.source.chat_type, ChatType::Dm);
    run.nothing_more(&fake).await;
    assert_eq!(joined_members_asked(&fake, room), 1);
    run.stop().await.unwrap();

    let b = adapter_with(settings(&fake), &cursors);
    let mut run = spawn(&b);
    fake.push_text(room, ALICE, "after the restart");
    let ev = run.next().await;
    assert_eq!(ev.text, "after the restart");
    assert_eq!(ev.source.chat_type, ChatType::Dm);
    run.nothing_more(&fake).await;
    assert_eq!(
        joined_members_asked(&fake, room),
        1,
        "the count came from the store"
    );
    run.stop().await.unwrap();
}

/// A member joining turns a direct chat into a group: the count is asked
/// again, and messages then need a mention.
#[tokio::test]
async fn a_third_member_makes_a_dm_a_group() {
    let fake = FakeMatrix::start(TOKEN).await;
    let cursors = Arc::new(Cursors::default());
    let dm = fake.create_dm(ALICE);
    let a = adapter_with(settings(&fake), &cursors);
    let mut run = started(&fake, &a).await;
    fake.push_text(&dm, ALICE, "just us");
    assert_eq!(run.next().await.source.chat_type, ChatType::Dm);
    fake.add_member(&dm, BOB);
    fake.push_text(&dm, ALICE, "hello bob");
    let asked = fake.push_text(&dm, ALICE, "Talaria: now with bob");
    let ev = run.next().await;
    assert_eq!(ev.message_id.as_deref(), Some(asked.as_str()));
    assert_eq!(ev.source.chat_type, ChatType::Group);
    run.nothing_more(&fake).await;
    assert_eq!(joined_members_asked(&fake, &dm), 2);
    run.stop().await.unwrap();
}

/// A homeserver that cannot say who is in a room does not make the
/// adapter guess: the batch is fetched again once it can.
#[tokio::test]
async fn an_unanswered_member_count_retries_the_batch_instead_of_guessing() {
    let fake = FakeMatrix::start(TOKEN).await;
    let cursors = Arc::new(Cursors::default());
    let dm = fake.create_dm(ALICE);
    let a = adapter_with(settings(&fake), &cursors);
    let mut run = started(&fake, &a).await;
    let before = cursors.saved();
    fake.fail_next_joined_members(2);
    let id = fake.push_text(&dm, ALICE, "hello");
    let ev = run.next().await;
    assert_eq!(ev.message_id.as_deref(), Some(id.as_str()));
    assert_eq!(ev.source.chat_type, ChatType::Dm);
    assert_eq!(joined_members_asked(&fake, &dm), 3);
    let sinces: Vec<Option<String>> = fake.sync_calls().iter().map(|c| c.since.clone()).collect();
    assert!(
        sinces.iter().filter(|s| **s == before).count() >= 3,
        "the batch was fetched again from the same token: {sinces:?}"
    );
    run.nothing_more(&fake).await;
    run.stop().await.unwrap();
}

/// Issue 19, item 7: after joining a group on invite, what was written
/// there before the bot came was answered. Only direct chats answer what
/// was written while the invite was pending.
#[tokio::test]
async fn a_group_joined_on_invite_skips_what_came_before_the_join() {
    let fake = FakeMatrix::start(TOKEN).await;
    let cursors = Arc::new(Cursors::default());
    let a = adapter_with(settings(&fake), &cursors);
    let mut run = started(&fake, &a).await;

    let group = "!team:localhost";
    fake.room_without_bot(group, Some("Team"), &[ALICE, BOB]);
    fake.push_text(group, ALICE, "Talaria: did you read this?");
    fake.invite_into(group, ALICE, &[BOB], false);
    fake.push_text(group, BOB, "Talaria: or this, while invited?");
    fake.wait_for_joins(1, WAIT).await;
    let asked = fake.push_text(group, ALICE, "Talaria: welcome!");
    let ev = run.next().await;
    assert_eq!(ev.message_id.as_deref(), Some(asked.as_str()));
    assert_eq!(ev.source.chat_type, ChatType::Group);
    run.nothing_more(&fake).await;

    // A direct chat answers what the user wrote before the bot joined.
    fake.invite("!new-dm:localhost", ALICE, true);
    let early = fake.push_text("!new-dm:localhost", ALICE, "hi, are you there?");
    let ev = run.next().await;
    assert_eq!(ev.message_id.as_deref(), Some(early.as_str()));
    assert_eq!(ev.source.chat_type, ChatType::Dm);
    run.nothing_more(&fake).await;
    run.stop().await.unwrap();
}

// --- Media (issue 22) ---

/// Small real files, made here: a 1×1 PNG, the first page of an Ogg/Opus
/// stream (what a voice note starts with; nothing decodes it here) and a
/// minimal PDF.
mod samples {
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = 0xffff_ffffu32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xedb8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    fn chunk(out: &mut Vec<u8>, kind: &[u8], data: &[u8]) {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut tagged = kind.to_vec();
        tagged.extend_from_slice(data);
        out.extend_from_slice(&tagged);
        out.extend_from_slice(&crc32(&tagged).to_be_bytes());
    }

    /// A 1×1 opaque red PNG (zlib with one stored block).
    pub fn png() -> Vec<u8> {
        let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut ihdr = Vec::new();
        ihdr.extend_from_slice(&1u32.to_be_bytes());
        ihdr.extend_from_slice(&1u32.to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
        chunk(&mut out, b"IHDR", &ihdr);
        let raw = [0u8, 255, 0, 0]; // filter byte, then one RGB pixel
        let (mut a, mut b) = (1u32, 0u32);
        for &x in &raw {
            a = (a + u32::from(x)) % 65521;
            b = (b + a) % 65521;
        }
        let mut z = vec![
            0x78,
            0x01,
            0x01,
            raw.len() as u8,
            0,
            !(raw.len() as u8),
            0xff,
        ];
        z.extend_from_slice(&raw);
        z.extend_from_slice(&((b << 16) | a).to_be_bytes());
        chunk(&mut out, b"IDAT", &z);
        chunk(&mut out, b"IEND", &[]);
        out
    }

    /// An Ogg page holding an `OpusHead` packet.
    pub fn ogg_opus() -> Vec<u8> {
        let head = b"OpusHead\x01\x01\x38\x01\x80\xbb\x00\x00\x00\x00\x00";
        let mut page = b"OggS\x00\x02".to_vec();
        page.extend_from_slice(&[0; 8]); // granule position
        page.extend_from_slice(&1u32.to_le_bytes()); // stream serial
        page.extend_from_slice(&0u32.to_le_bytes()); // page sequence
        page.extend_from_slice(&[0; 4]); // checksum (unchecked here)
        page.push(1);
        page.push(head.len() as u8);
        page.extend_from_slice(head);
        page
    }

    /// A one-page PDF with no content.
    pub fn pdf() -> Vec<u8> {
        b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj\n3 0 obj<</Type/Page/Parent 2 0 R/MediaBox[0 0 10 10]>>endobj\ntrailer<</Root 1 0 R>>\n%%EOF\n".to_vec()
    }
}

use talaria_adapter::{AttachmentSource, DownloadError, MediaKind, OutboundFile};
use tokio::io::AsyncReadExt;

/// Everything a download hands over.
async fn fetch(a: &MatrixAdapter, locator: &str) -> Result<Vec<u8>, DownloadError> {
    let mut d = a.download(locator).await?;
    let mut bytes = Vec::new();
    d.reader.read_to_end(&mut bytes).await.unwrap();
    if let Some(len) = d.length {
        assert_eq!(len, bytes.len() as u64, "Content-Length matches the body");
    }
    Ok(bytes)
}

fn locator(ev: &MessageEvent, i: usize) -> String {
    match &ev.attachments[i].source {
        AttachmentSource::Remote(l) => l.clone(),
        other => panic!("not a remote attachment: {other:?}"),
    }
}

/// A file on disk for `send_file`.
fn outbound(
    dir: &tempfile::TempDir,
    room: &str,
    name: &str,
    bytes: &[u8],
    kind: MediaKind,
    mime: &str,
) -> OutboundFile {
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    OutboundFile {
        chat_id: room.into(),
        thread_id: None,
        reply_to: None,
        path,
        kind,
        mime: mime.into(),
        name: name.into(),
        caption: None,
    }
}

#[tokio::test]
async fn inbound_photos_voice_notes_and_documents_download_their_exact_bytes() {
    let fake = FakeMatrix::start(TOKEN).await;
    let cursors = Arc::new(Cursors::default());
    let room = fake.create_dm(ALICE);
    let a = adapter_with(settings(&fake), &cursors);
    let mut run = started(&fake, &a).await;

    let (png, ogg, pdf) = (samples::png(), samples::ogg_opus(), samples::pdf());
    let png_url = fake.add_file(&png, "image/png", Some("cat.png"));
    fake.push_event(
        &room,
        ALICE,
        json!({ "msgtype": "m.image", "body": "look at this", "filename": "cat.png", "url": png_url,
                "info": { "mimetype": "image/png", "size": png.len(), "w": 1, "h": 1 } }),
    );
    let ogg_url = fake.add_file(&ogg, "audio/ogg", Some("Voice message.ogg"));
    fake.push_event(
        &room,
        ALICE,
        json!({ "msgtype": "m.audio", "body": "Voice message.ogg", "url": ogg_url,
                "info": { "mimetype": "audio/ogg", "size": ogg.len(), "duration": 1000 },
                "org.matrix.msc1767.audio": { "duration": 1000, "waveform": [] },
                "org.matrix.msc3245.voice": {} }),
    );
    let pdf_url = fake.add_file(&pdf, "application/pdf", Some("report.pdf"));
    fake.push_event(
        &room,
        ALICE,
        json!({ "msgtype": "m.file", "body": "report.pdf", "url": pdf_url,
                "info": { "mimetype": "application/pdf", "size": pdf.len() } }),
    );

    let photo = run.next().await;
    assert_eq!(photo.text, "look at this", "the body is the caption");
    assert_eq!(photo.attachments.len(), 1);
    let att = &photo.attachments[0];
    assert_eq!(att.kind, MediaKind::Image);
    assert_eq!(att.name.as_deref(), Some("cat.png"));
    assert_eq!(att.mime.as_deref(), Some("image/png"));
    assert_eq!(att.size, Some(png.len() as u64));
    assert_eq!(fetch(&a, &locator(&photo, 0)).await.unwrap(), png);

    let voice = run.next().await;
    assert_eq!(voice.attachments[0].kind, MediaKind::Voice);
    assert_eq!(fetch(&a, &locator(&voice, 0)).await.unwrap(), ogg);

    let doc = run.next().await;
    assert_eq!(doc.attachments[0].kind, MediaKind::Document);
    assert_eq!(doc.attachments[0].name.as_deref(), Some("report.pdf"));
    assert_eq!(fetch(&a, &locator(&doc, 0)).await.unwrap(), pdf);

    // Fetched from the authenticated endpoint, with the token.
    let downloads: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/download/"))
        .collect();
    assert_eq!(downloads.len(), 3);
    for r in &downloads {
        assert!(
            r.path
                .starts_with("_matrix/client/v1/media/download/localhost/"),
            "{}",
            r.path
        );
        assert!(r.authorized);
    }
    run.stop().await.unwrap();
}

#[tokio::test]
async fn an_older_homeserver_is_asked_at_the_unauthenticated_endpoint() {
    let fake = FakeMatrix::start(TOKEN).await;
    let a = adapter_with(settings(&fake), &Arc::new(Cursors::default()));
    let png = samples::png();
    let url = fake.add_file(&png, "image/png", None);
    // A current server does not serve new media at the old endpoint.
    fake.legacy_media_only(false);
    assert_eq!(fetch(&a, &url).await.unwrap(), png);
    fake.legacy_media_only(true);
    assert_eq!(fetch(&a, &url).await.unwrap(), png);
    let paths: Vec<String> = fake
        .requests()
        .into_iter()
        .map(|r| r.path)
        .filter(|p| p.contains("/download/"))
        .collect();
    let id = url.rsplit('/').next().unwrap();
    assert_eq!(
        paths,
        [
            format!("_matrix/client/v1/media/download/localhost/{id}"),
            format!("_matrix/client/v1/media/download/localhost/{id}"),
            format!("_matrix/media/v3/download/localhost/{id}"),
        ]
    );
}

#[tokio::test]
async fn missing_files_are_gone_and_foreign_addresses_are_never_fetched() {
    let fake = FakeMatrix::start(TOKEN).await;
    let a = adapter_with(settings(&fake), &Arc::new(Cursors::default()));
    let err = fetch(&a, "mxc://localhost/nosuchmedia").await.unwrap_err();
    assert!(matches!(err, DownloadError::Gone(_)), "{err:?}");
    assert!(!err.to_string().contains(TOKEN));
    let before = fake.requests().len();
    for foreign in [
        "https://evil.example/_matrix/media/v3/download/x/y",
        "http://127.0.0.1:1/steal",
        "mxc://localhost/../../account/whoami",
        "mxc://evil.example/a?access_token=x",
    ] {
        let err = fetch(&a, foreign).await.unwrap_err();
        match err {
            DownloadError::Gone(why) => assert!(why.contains("not a Matrix file address"), "{why}"),
            other => panic!("{foreign}: {other:?}"),
        }
    }
    assert_eq!(
        fake.requests().len(),
        before,
        "no request for a foreign address"
    );
}

#[tokio::test]
async fn files_are_uploaded_then_posted_as_image_voice_and_file_messages() {
    let fake = FakeMatrix::start(TOKEN).await;
    let room = fake.create_dm(ALICE);
    let a = adapter_with(settings(&fake), &Arc::new(Cursors::default()));
    let dir = tempfile::tempdir().unwrap();
    let (png, ogg, pdf) = (samples::png(), samples::ogg_opus(), samples::pdf());

    let mut photo = outbound(
        &dir,
        &room,
        "chart.png",
        &png,
        MediaKind::Image,
        "image/png",
    );
    photo.caption = Some("the **chart**".into());
    photo.reply_to = Some("$asked".into());
    let sent = a.send_file(&photo).await.unwrap();
    let mut voice = outbound(
        &dir,
        &room,
        "answer.ogg",
        &ogg,
        MediaKind::Voice,
        "audio/ogg",
    );
    voice.thread_id = Some("$root".into());
    a.send_file(&voice).await.unwrap();
    let doc = outbound(
        &dir,
        &room,
        "report.pdf",
        &pdf,
        MediaKind::Document,
        "application/pdf",
    );
    a.send_file(&doc).await.unwrap();

    let uploads = fake.uploads();
    assert_eq!(uploads.len(), 3);
    let expect = [
        ("chart.png", "image/png", &png),
        ("answer.ogg", "audio/ogg", &ogg),
        ("report.pdf", "application/pdf", &pdf),
    ];
    for (u, (name, mime, bytes)) in uploads.iter().zip(expect) {
        assert_eq!(u.filename.as_deref(), Some(name));
        assert_eq!(u.content_type.as_deref(), Some(mime));
        assert_eq!(&u.bytes, bytes);
    }
    let up: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.path == "_matrix/media/v3/upload")
        .collect();
    assert!(up.iter().all(|r| r.authorized && r.method == "POST"));

    let msgs = fake.sent();
    assert_eq!(msgs.len(), 3);
    assert_eq!(sent.message_id.as_deref(), Some(msgs[0].event_id.as_str()));
    let c = &msgs[0].content;
    assert_eq!(c["msgtype"], "m.image");
    assert_eq!(c["url"], uploads[0].content_uri.as_str());
    assert_eq!(c["body"], "the **chart**");
    assert_eq!(c["filename"], "chart.png");
    assert_eq!(
        c["info"],
        json!({ "mimetype": "image/png", "size": png.len() })
    );
    assert!(msgs[0].html().unwrap().contains("<strong>chart</strong>"));
    assert_eq!(msgs[0].in_reply_to().as_deref(), Some("$asked"));
    let c = &msgs[1].content;
    assert_eq!(c["msgtype"], "m.audio");
    assert_eq!(c["org.matrix.msc3245.voice"], json!({}));
    assert_eq!(c["url"], uploads[1].content_uri.as_str());
    assert_eq!(c["info"]["size"], ogg.len());
    assert_eq!(msgs[1].thread_root().as_deref(), Some("$root"));
    let c = &msgs[2].content;
    assert_eq!(c["msgtype"], "m.file");
    assert_eq!(c["body"], "report.pdf");
    assert_eq!(
        c["info"],
        json!({ "mimetype": "application/pdf", "size": pdf.len() })
    );

    // What was uploaded can be fetched back.
    assert_eq!(
        fetch(&a, uploads[2].content_uri.as_str()).await.unwrap(),
        pdf
    );
}

/// A file of several megabytes goes up and comes back whole: nothing on
/// the way is bounded by a small buffer.
#[tokio::test]
async fn a_large_file_round_trips() {
    let fake = FakeMatrix::start(TOKEN).await;
    let room = fake.create_dm(ALICE);
    let a = adapter_with(settings(&fake), &Arc::new(Cursors::default()));
    let dir = tempfile::tempdir().unwrap();
    let big: Vec<u8> = (0..5_000_000u32).map(|i| (i % 251) as u8).collect();
    let file = outbound(
        &dir,
        &room,
        "big.bin",
        &big,
        MediaKind::Document,
        "application/octet-stream",
    );
    a.send_file(&file).await.unwrap();
    let up = fake.uploads();
    assert_eq!(up[0].bytes.len(), big.len());
    assert_eq!(fake.sent()[0].content["info"]["size"], big.len());
    assert!(fetch(&a, &up[0].content_uri).await.unwrap() == big);
}

#[tokio::test]
async fn a_refused_upload_is_rejected_and_nothing_is_posted() {
    let fake = FakeMatrix::start(TOKEN).await;
    let room = fake.create_dm(ALICE);
    let a = adapter_with(settings(&fake), &Arc::new(Cursors::default()));
    let dir = tempfile::tempdir().unwrap();
    fake.set_max_upload(10);
    let doc = outbound(
        &dir,
        &room,
        "report.pdf",
        &samples::pdf(),
        MediaKind::Document,
        "application/pdf",
    );
    match a.send_file(&doc).await {
        Err(SendError::Rejected(why)) => assert!(why.contains("M_TOO_LARGE"), "{why}"),
        other => panic!("{other:?}"),
    }
    let mut gone = doc.clone();
    gone.path = dir.path().join("missing.pdf");
    assert!(matches!(
        a.send_file(&gone).await,
        Err(SendError::Rejected(_))
    ));
    fake.fail_next_upload_with_429(2_000);
    assert_eq!(
        a.send_file(&doc).await,
        Err(SendError::RateLimited(Duration::from_secs(2)))
    );
    assert!(fake.sent().is_empty());
    fake.revoke_token();
    fake.set_max_upload(1 << 20);
    assert!(matches!(
        a.send_file(&doc).await,
        Err(SendError::Unavailable(_))
    ));
}

/// The round trip against a real homeserver: what the adapter uploads and
/// posts is a file message a user sees, fetched back byte for byte, and a
/// file a user posts reaches the adapter as an attachment it can fetch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synapse_carries_files_both_ways() {
    let hs = talaria_testkit::synapse::Synapse::shared();
    let bot = hs.register("mediabot").await;
    let alice = hs.register("mediaalice").await;
    let room = alice.create_room(&[&bot.user_id], true).await;
    bot.join(&room).await;

    let cursors = Arc::new(Cursors::default());
    let s = MatrixSettings {
        homeserver: hs.homeserver().to_owned(),
        access_token: bot.access_token.as_str().into(),
        ..settings_for_synapse()
    };
    let a = adapter_with(s, &cursors);
    let dir = tempfile::tempdir().unwrap();
    let png = samples::png();
    let mut file = outbound(
        &dir,
        &room,
        "chart.png",
        &png,
        MediaKind::Image,
        "image/png",
    );
    file.caption = Some("here it is".into());
    a.send_file(&file).await.unwrap();
    let got = alice
        .wait_for_messages_from(&room, &bot.user_id, 1, WAIT)
        .await;
    let content = &got[0]["content"];
    assert_eq!(content["msgtype"], "m.image");
    assert_eq!(content["body"], "here it is");
    assert_eq!(content["filename"], "chart.png");
    assert_eq!(content["info"]["size"], png.len());
    let url = content["url"].as_str().unwrap();
    assert!(url.starts_with("mxc://localhost/"), "{url}");
    assert_eq!(fetch(&a, url).await.unwrap(), png);

    // Alice uploads a voice note and posts it; the adapter takes it in.
    let mut run = spawn(&a);
    // Live once the first sync (which skips history) was answered.
    run.live().await;
    let ogg = samples::ogg_opus();
    let uploaded: serde_json::Value = reqwest::Client::new()
        .post(format!(
            "{}/_matrix/media/v3/upload?filename=note.ogg",
            hs.homeserver()
        ))
        .bearer_auth(&alice.access_token)
        .header("Content-Type", "audio/ogg")
        .body(ogg.clone())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mxc = uploaded["content_uri"].as_str().unwrap().to_owned();
    alice
        .call(
            reqwest::Method::PUT,
            &format!(
                "rooms/{}/send/m.room.message/voice1",
                talaria_testkit::synapse::segment(&room)
            ),
            Some(
                json!({ "msgtype": "m.audio", "body": "Voice message", "url": mxc,
                "info": { "mimetype": "audio/ogg", "size": ogg.len() },
                "org.matrix.msc3245.voice": {} }),
            ),
        )
        .await;
    let ev = run.next().await;
    assert_eq!(ev.attachments.len(), 1);
    assert_eq!(ev.attachments[0].kind, MediaKind::Voice);
    assert_eq!(fetch(&a, &locator(&ev, 0)).await.unwrap(), ogg);
    run.stop().await.unwrap();
}

fn settings_for_synapse() -> MatrixSettings {
    MatrixSettings {
        homeserver: String::new(),
        access_token: "x".into(),
        user_id: None,
        require_mention: true,
        sync_timeout: Duration::from_millis(300),
        retry_base: Duration::from_millis(20),
        max_sync_failures: 4,
        invite_policy: None,
        e2ee: E2eeSettings {
            mode: E2eeMode::Off,
            ..E2eeSettings::default()
        },
    }
}

/// The device keys the homeserver publishes for `user`'s `device`: its
/// ed25519 key and algorithms, as any client asking sees them.
async fn published_keys(
    asker: &talaria_testkit::synapse::MatrixUser,
    user: &str,
) -> serde_json::Map<String, serde_json::Value> {
    let answer = asker
        .call(
            reqwest::Method::POST,
            "keys/query",
            Some(json!({ "device_keys": { user: [] } })),
        )
        .await;
    answer["device_keys"][user]
        .as_object()
        .cloned()
        .unwrap_or_default()
}

/// With encryption on, the bot's device publishes its keys (device keys
/// and one-time keys another client can claim to start a session), finds
/// the same keys after a restart, and a store that was lost is refused
/// rather than uploading over keys the homeserver already holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synapse_publishes_the_device_keys_and_a_lost_store_is_refused() {
    let hs = talaria_testkit::synapse::Synapse::shared();
    let bot = hs.register("keysbot").await;
    let alice = hs.register("keysalice").await;
    let homedir = tempfile::tempdir().unwrap();
    let settings = |mode| MatrixSettings {
        homeserver: hs.homeserver().to_owned(),
        access_token: bot.access_token.as_str().into(),
        e2ee: E2eeSettings {
            mode,
            store_root: Some(homedir.path().join("crypto")),
            ..E2eeSettings::default()
        },
        ..settings_for_synapse()
    };
    let cursors = Arc::new(Cursors::default());
    let a = adapter_with(settings(E2eeMode::Optional), &cursors);
    let run = spawn(&a);
    run.live().await;
    let devices = published_keys(&alice, &bot.user_id).await;
    assert_eq!(devices.len(), 1, "{devices:?}");
    let (device, keys) = devices.iter().next().unwrap();
    let ed25519 = keys["keys"][format!("ed25519:{device}")]
        .as_str()
        .unwrap()
        .to_owned();
    let algorithms = keys["algorithms"].as_array().unwrap();
    assert!(
        algorithms.contains(&json!("m.megolm.v1.aes-sha2")),
        "{keys}"
    );
    assert!(keys["signatures"][&bot.user_id][format!("ed25519:{device}")].is_string());
    let claimed = alice
        .call(
            reqwest::Method::POST,
            "keys/claim",
            Some(json!({ "one_time_keys": { &bot.user_id: { device: "signed_curve25519" } } })),
        )
        .await;
    assert!(
        claimed["one_time_keys"][&bot.user_id][device]
            .as_object()
            .is_some_and(|k| !k.is_empty()),
        "a one-time key to start a session with: {claimed}"
    );
    run.stop().await.unwrap();

    // A new process on the same store: the same keys.
    let a = adapter_with(settings(E2eeMode::Required), &cursors);
    let run = spawn(&a);
    run.live().await;
    run.stop().await.unwrap();
    let again = published_keys(&alice, &bot.user_id).await;
    assert_eq!(
        again[device]["keys"][format!("ed25519:{device}")],
        json!(ed25519)
    );

    // The store is lost: the homeserver's keys are not this home's.
    std::fs::remove_dir_all(homedir.path().join("crypto")).unwrap();
    let a = adapter_with(settings(E2eeMode::Required), &cursors);
    match spawn(&a).ended().await {
        Err(AdapterError::Fatal(why)) => {
            assert!(why.contains("holds other encryption keys"), "{why}");
            assert!(why.contains(device.as_str()), "{why}");
        }
        other => panic!("a lost store must be refused: {other:?}"),
    }
    let after = published_keys(&alice, &bot.user_id).await;
    assert_eq!(
        after[device]["keys"][format!("ed25519:{device}")],
        json!(ed25519),
        "nothing was uploaded over the published keys"
    );
}

/// Files in an encrypted room, both ways, with a client that encrypts
/// (matrix-nio): the bot's file is uploaded as ciphertext and the client
/// decrypts it to the same bytes; the client's encrypted file reaches the
/// bot as an attachment whose download decrypts it. The homeserver holds
/// neither file in the clear, nor the bot's file's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synapse_encrypted_rooms_carry_encrypted_files_both_ways() {
    let hs = talaria_testkit::synapse::Synapse::shared();
    let bot = hs.register("e2efilebot").await;
    let alice = hs.register("e2efilealice").await;
    let homedir = tempfile::tempdir().unwrap();
    let cursors = Arc::new(Cursors::default());
    let a = adapter_with(
        MatrixSettings {
            homeserver: hs.homeserver().to_owned(),
            access_token: bot.access_token.as_str().into(),
            e2ee: E2eeSettings {
                mode: E2eeMode::Required,
                store_root: Some(homedir.path().join("crypto")),
                ..E2eeSettings::default()
            },
            ..settings_for_synapse()
        },
        &cursors,
    );
    let mut run = spawn(&a);
    run.live().await;
    let store = tempfile::tempdir().unwrap();
    let client =
        talaria_testkit::matrix_e2ee::EncryptingClient::login(hs, "e2efilealice", store.path())
            .await;
    let room = client.create_encrypted_room(&[&bot.user_id], true).await;
    client.wait_until_joined(&room, &bot.user_id, WAIT).await;

    // The bot sends a file.
    let dir = tempfile::tempdir().unwrap();
    let png = samples::png();
    let mut file = outbound(
        &dir,
        &room,
        "secret-chart.png",
        &png,
        MediaKind::Image,
        "image/png",
    );
    file.caption = Some("the chart".into());
    let sent = a.send_file(&file).await.unwrap();
    let got = client.wait_for_message(&room, &bot.user_id, WAIT).await;
    assert!(
        got.encrypted && got.decrypted,
        "{got:?}\n{}",
        client.log_tail()
    );
    assert!(
        got.file_encrypted,
        "an encrypted room gets an encrypted file: {got:?}"
    );
    assert_eq!(got.detail, None, "the file object follows the spec");
    assert_eq!(got.file.as_deref(), Some(png.as_slice()));
    assert_eq!(got.content["msgtype"], "m.image");
    assert_eq!(got.content["filename"], "secret-chart.png");
    assert_eq!(sent.message_id.as_deref(), Some(got.event_id.as_str()));
    let mxc = got.content["file"]["url"].as_str().unwrap().to_owned();
    let (server, id) = mxc.trim_start_matches("mxc://").split_once('/').unwrap();
    let raw = reqwest::Client::new()
        .get(format!(
            "{}/_matrix/client/v1/media/download/{server}/{id}",
            hs.homeserver()
        ))
        .bearer_auth(&alice.access_token)
        .send()
        .await
        .unwrap();
    let disposition = format!("{:?}", raw.headers().get("content-disposition"));
    assert!(!disposition.contains("secret-chart"), "{disposition}");
    let raw = raw.bytes().await.unwrap();
    assert_eq!(raw.len(), png.len());
    assert_ne!(raw.as_ref(), png.as_slice(), "the server holds ciphertext");

    // The client sends one; the bot takes it in and decrypts it.
    let doc: Vec<u8> = (0..150_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    client
        .send_file(
            &room,
            "notes.bin",
            &doc,
            "application/octet-stream",
            "m.file",
        )
        .await;
    let ev = run.next().await;
    assert_eq!(ev.attachments.len(), 1, "{ev:?}");
    assert_eq!(ev.attachments[0].kind, MediaKind::Document);
    let loc = locator(&ev, 0);
    assert_eq!(fetch(&a, &loc).await.unwrap(), doc);
    run.stop().await.unwrap();
}
