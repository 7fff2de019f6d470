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
use talaria_platforms::matrix::{MatrixAdapter, MatrixSettings};
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
