//! The Discord adapter against the fake Discord (REST and gateway) in
//! talaria-testkit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use talaria_gateway::{
    Adapter, AdapterContext, AdapterError, ChatType, Inbox, Liveness, LivenessReporter,
    MessageEvent, OutboundMessage, SendError,
};
use talaria_platforms::discord::{DiscordAdapter, DiscordSettings, DiscordTimings};
use talaria_testkit::FakeDiscord;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "MTIzNDU2Nzg5.discord.test-token";
const WAIT: Duration = Duration::from_secs(10);
/// Short enough that heartbeat tests are quick, long enough that a busy
/// machine does not miss an ACK.
const BEAT: Duration = Duration::from_millis(150);

fn settings(fake: &FakeDiscord, require_mention: bool) -> DiscordSettings {
    DiscordSettings {
        token: TOKEN.into(),
        api_base: fake.api_base(),
        gateway_url: None,
        require_mention,
        timings: DiscordTimings {
            connect_timeout: Duration::from_secs(5),
            reidentify_delay: Duration::from_millis(50),
        },
    }
}

fn adapter(fake: &FakeDiscord, require_mention: bool) -> Arc<DiscordAdapter> {
    Arc::new(DiscordAdapter::new(settings(fake, require_mention)).unwrap())
}

struct Running {
    events: mpsc::Receiver<MessageEvent>,
    liveness: watch::Receiver<Liveness>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), AdapterError>>,
}

fn spawn(adapter: &Arc<DiscordAdapter>, capacity: usize) -> Running {
    let (inbox, events) = Inbox::channel(capacity);
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

    async fn ended(self) -> (Result<(), AdapterError>, mpsc::Receiver<MessageEvent>) {
        let result = tokio::time::timeout(WAIT, self.task)
            .await
            .expect("run did not return")
            .expect("run panicked");
        (result, self.events)
    }

    async fn stop(self) -> Result<(), AdapterError> {
        self.shutdown.cancel();
        self.ended().await.0
    }

    async fn wait_live(&mut self) {
        tokio::time::timeout(WAIT, self.liveness.wait_for(|l| *l == Liveness::Live))
            .await
            .expect("never live")
            .unwrap();
    }
}

fn out(
    chat_id: &str,
    thread_id: Option<&str>,
    reply_to: Option<&str>,
    text: &str,
) -> OutboundMessage {
    OutboundMessage {
        chat_id: chat_id.into(),
        thread_id: thread_id.map(Into::into),
        reply_to: reply_to.map(Into::into),
        text: text.into(),
    }
}

#[tokio::test]
async fn identify_then_a_dm_becomes_an_event() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, true);
    let mut run = spawn(&a, 8);
    // Live only after READY, not when the socket opened.
    fake.wait_for_sessions(1, WAIT).await;
    run.wait_live().await;
    let id = fake.push_dm("42", "hello there");
    let ev = run.next().await;
    assert_eq!(ev.text, "hello there");
    assert_eq!(ev.source.platform, "discord");
    assert_eq!(ev.source.chat_type, ChatType::Dm);
    assert_eq!(ev.source.chat_id, FakeDiscord::dm_channel("42"));
    assert_eq!(ev.source.user_id.as_deref(), Some("42"));
    assert_eq!(ev.source.user_name.as_deref(), Some("User 42"));
    assert_eq!(ev.message_id.as_deref(), Some(id.as_str()));
    assert_eq!(a.bot_id().as_deref(), Some(fake.bot_id()));

    let identify = &fake.frames_with_op(2)[0].d;
    assert_eq!(identify["token"], TOKEN);
    assert_eq!(identify["intents"], 1 | 512 | 4096 | 32768);
    let conn = &fake.connections()[0];
    assert_eq!(conn.path, "/gateway");
    assert_eq!(conn.query, "v=10&encoding=json");
    assert_eq!(
        a.credential(),
        Some(("discord-bot-token", TOKEN.to_owned()))
    );

    // A failing send degrades the connection; the next good one restores it.
    fake.fail_next_send_with_status(503);
    assert!(a.send(&out("55", None, None, "x")).await.is_err());
    assert_eq!(*run.liveness.borrow(), Liveness::Degraded);
    a.send(&out("55", None, None, "y")).await.unwrap();
    assert_eq!(*run.liveness.borrow(), Liveness::Live);
    run.stop().await.unwrap();
}

#[tokio::test]
async fn guild_messages_need_a_mention_and_bots_are_ignored() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, true);
    let mut run = spawn(&a, 8);
    fake.wait_for_sessions(1, WAIT).await;
    let at = fake.mention();
    fake.push_guild_message("7", "70", "42", "just chatting");
    fake.push_guild_message("7", "70", "42", &format!("{at} what's up?"));
    fake.push_message(serde_json::json!({
        "channel_id": "70", "guild_id": "7", "content": format!("{at} I am a bot"),
        "author": {"id": "5", "username": "otherbot", "bot": true},
    }));
    fake.push_message(serde_json::json!({
        "channel_id": "70", "guild_id": "7", "content": "an echo of myself",
        "author": {"id": fake.bot_id(), "username": "talaria-test", "bot": true},
    }));
    fake.push_dm("9", "no mention needed");
    let first = run.next().await;
    assert_eq!(first.text, "what's up?");
    assert_eq!(first.source.chat_type, ChatType::Group);
    assert_eq!(first.source.chat_id, "70");
    assert_eq!(first.source.thread_id, None);
    assert_eq!(run.next().await.text, "no mention needed");
    assert!(run.events.try_recv().is_err());
    run.stop().await.unwrap();
}

#[tokio::test]
async fn thread_messages_map_to_the_parent_and_replies_go_to_the_thread() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, false);
    let mut run = spawn(&a, 8);
    fake.wait_for_sessions(1, WAIT).await;
    fake.push_thread_message("7", "70", "7001", "42", "inside the thread");
    let ev = run.next().await;
    assert_eq!(ev.source.chat_type, ChatType::Thread);
    assert_eq!(ev.source.chat_id, "70");
    assert_eq!(ev.source.thread_id.as_deref(), Some("7001"));
    run.stop().await.unwrap();

    // A new session learns the thread from GUILD_CREATE.
    let b = adapter(&fake, false);
    let mut run = spawn(&b, 8);
    fake.wait_for_sessions(2, WAIT).await;
    fake.push_thread_message("7", "70", "7001", "42", "still inside");
    let ev = run.next().await;
    assert_eq!(ev.source.thread_id.as_deref(), Some("7001"));
    run.stop().await.unwrap();

    let sent = a
        .send(&out("70", Some("7001"), ev.message_id.as_deref(), "answer"))
        .await
        .unwrap();
    a.typing("70", Some("7001")).await.unwrap();
    let s = &fake.sent()[0];
    assert_eq!(s.channel_id, "7001");
    assert_eq!(s.reply_to, ev.message_id);
    assert_eq!(sent.message_id.as_deref(), Some(s.id.as_str()));
    assert_eq!(fake.typing()[0].channel_id, "7001");
}

#[tokio::test]
async fn a_dropped_connection_resumes_without_losing_or_repeating_events() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, false);
    let mut run = spawn(&a, 8);
    fake.wait_for_sessions(1, WAIT).await;
    fake.push_dm("42", "before the drop");
    assert_eq!(run.next().await.text, "before the drop");

    assert!(fake.drop_connection());
    let (result, mut events) = run.ended().await;
    assert!(
        matches!(result, Err(AdapterError::Disconnected(_))),
        "{result:?}"
    );
    // Pushed while nobody is connected: the session keeps it.
    fake.push_dm("42", "during the drop");

    let mut run = spawn(&a, 8);
    fake.wait_for_sessions(2, WAIT).await;
    assert_eq!(run.next().await.text, "during the drop");
    fake.push_dm("42", "after the resume");
    assert_eq!(run.next().await.text, "after the resume");
    assert!(run.events.try_recv().is_err(), "nothing twice");
    assert!(events.try_recv().is_err());

    let resume = &fake.frames_with_op(6)[0].d;
    assert_eq!(resume["token"], TOKEN);
    assert_eq!(resume["session_id"], "fake-session-1");
    assert_eq!(fake.connections()[1].path, "/resume");
    assert_eq!(fake.ready_and_resumed(), (1, 1));
    run.stop().await.unwrap();
}

#[tokio::test]
async fn an_event_not_handed_over_is_replayed_on_resume() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, false);
    // Capacity 1 and nobody reading: "one" fills the inbox, "two" waits.
    let run = spawn(&a, 1);
    fake.wait_for_sessions(1, WAIT).await;
    fake.push_dm("1", "one");
    fake.push_dm("1", "two");
    tokio::time::sleep(Duration::from_millis(200)).await;
    run.shutdown.cancel();
    let (result, mut events) = run.ended().await;
    result.unwrap();
    assert_eq!(events.recv().await.unwrap().text, "one");
    assert!(events.recv().await.is_none());

    let mut run = spawn(&a, 8);
    assert_eq!(run.next().await.text, "two");
    assert_eq!(fake.ready_and_resumed(), (1, 1));
    run.stop().await.unwrap();
}

#[tokio::test]
async fn reconnect_and_invalid_session_requests_are_followed() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, false);
    let mut run = spawn(&a, 8);
    fake.wait_for_sessions(1, WAIT).await;
    // op 7: reconnect and resume within the same run.
    assert!(fake.send_reconnect());
    fake.wait_for_sessions(2, WAIT).await;
    assert_eq!(fake.ready_and_resumed(), (1, 1));
    fake.push_dm("3", "after op 7");
    assert_eq!(run.next().await.text, "after op 7");

    // op 9 resumable: resume again.
    assert!(fake.invalidate_session(true));
    fake.wait_for_sessions(3, WAIT).await;
    assert_eq!(fake.ready_and_resumed(), (1, 2));

    // op 9 not resumable: a fresh identify after a short wait.
    assert!(fake.invalidate_session(false));
    fake.wait_for_sessions(4, WAIT).await;
    assert_eq!(fake.ready_and_resumed(), (2, 2));
    fake.push_dm("3", "new session");
    assert_eq!(run.next().await.text, "new session");
    assert!(!run.task.is_finished());
    run.stop().await.unwrap();
}

#[tokio::test]
async fn heartbeats_carry_the_sequence_and_a_zombie_connection_is_dropped() {
    let fake = FakeDiscord::start_with_heartbeat(TOKEN, BEAT).await;
    let a = adapter(&fake, false);
    let mut run = spawn(&a, 8);
    fake.wait_for_sessions(1, WAIT).await;
    fake.push_dm("4", "numbered");
    run.next().await;
    let beats = fake.wait_for_frames(1, 3, WAIT).await;
    // READY is 1, GUILD_CREATEs none, the message 2.
    assert_eq!(beats.last().unwrap().d, 2);
    // op 1 from the server gets a beat at once, not at the next interval.
    let n = fake.frames_with_op(1).len();
    let asked = Instant::now();
    assert!(fake.request_heartbeat());
    let beats = fake.wait_for_frames(1, n + 1, WAIT).await;
    assert!(
        beats[n].at.duration_since(asked) < BEAT,
        "{:?}",
        beats[n].at.duration_since(asked)
    );
    assert_eq!(*run.liveness.borrow(), Liveness::Live);

    fake.ack_heartbeats(false);
    let mut liveness = run.liveness.clone();
    let (result, _) = run.ended().await;
    assert!(
        matches!(&result, Err(AdapterError::Disconnected(m)) if m.contains("heartbeat")),
        "{result:?}"
    );
    assert_eq!(*liveness.borrow_and_update(), Liveness::Degraded);
    // The zombie's session is resumed on the next connection.
    fake.ack_heartbeats(true);
    let run = spawn(&a, 8);
    fake.wait_for_sessions(2, WAIT).await;
    assert_eq!(fake.ready_and_resumed(), (1, 1));
    run.stop().await.unwrap();
}

#[tokio::test]
async fn a_wrong_token_and_refused_intents_are_fatal() {
    let fake = FakeDiscord::start(TOKEN).await;
    let mut s = settings(&fake, false);
    s.token = "wrong.token.value".into();
    let bad = Arc::new(DiscordAdapter::new(s.clone()).unwrap());
    // /gateway/bot refuses it first.
    let (result, _) = spawn(&bad, 1).ended().await;
    match result {
        Err(AdapterError::Fatal(m)) => assert!(!m.contains("wrong.token"), "token leaked: {m}"),
        other => panic!("expected Fatal, got {other:?}"),
    }
    // With the URL configured the gateway itself closes with 4004.
    s.gateway_url = Some(fake.gateway_url());
    let bad = Arc::new(DiscordAdapter::new(s).unwrap());
    let (result, _) = spawn(&bad, 1).ended().await;
    assert!(
        matches!(result, Err(AdapterError::Fatal(ref m)) if m.contains("4004")),
        "{result:?}"
    );

    let a = adapter(&fake, false);
    let run = spawn(&a, 1);
    fake.wait_for_sessions(1, WAIT).await;
    assert!(fake.close_connection(4014));
    let (result, _) = run.ended().await;
    assert!(
        matches!(result, Err(AdapterError::Fatal(ref m)) if m.contains("intent")),
        "{result:?}"
    );

    // Other close codes reconnect.
    let run = spawn(&a, 1);
    fake.wait_for_sessions(2, WAIT).await;
    assert!(fake.close_connection(4000));
    let (result, _) = run.ended().await;
    assert!(
        matches!(result, Err(AdapterError::Disconnected(_))),
        "{result:?}"
    );
}

#[tokio::test]
async fn malformed_payloads_are_skipped() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, false);
    let mut run = spawn(&a, 8);
    fake.wait_for_sessions(1, WAIT).await;
    fake.push_dispatch(
        "MESSAGE_CREATE",
        serde_json::json!({"id": 5, "content": []}),
    );
    fake.push_dispatch("MESSAGE_CREATE", serde_json::json!("not an object"));
    fake.push_dispatch("SOMETHING_NEW", serde_json::json!({"x": 1}));
    fake.push_dm("8", "after the junk");
    assert_eq!(run.next().await.text, "after the junk");
    assert_eq!(*run.liveness.borrow(), Liveness::Live);
    run.stop().await.unwrap();
}

#[tokio::test]
async fn sends_reply_without_pinging_everyone_and_are_formatted() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, true);
    a.send(&out(
        "55",
        None,
        Some("1001"),
        "#### Result\n@everyone done",
    ))
    .await
    .unwrap();
    let s = &fake.sent()[0];
    assert_eq!(s.channel_id, "55");
    assert_eq!(s.content, "**Result**\n@everyone done");
    assert_eq!(s.reply_to.as_deref(), Some("1001"));
    let parse = s.allowed_mentions["parse"].as_array().unwrap();
    assert!(
        !parse.iter().any(|p| p == "everyone" || p == "roles"),
        "{parse:?}"
    );
    assert!(fake.send_attempts()[0].authorized);
    a.typing("55", None).await.unwrap();
    assert_eq!(fake.typing()[0].channel_id, "55");
}

#[tokio::test]
async fn rate_limits_wait_retry_after_and_empty_buckets() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, true);
    fake.fail_next_send_with_429(0.3, false);
    a.send(&out("55", None, None, "patience")).await.unwrap();
    let attempts = fake.send_attempts();
    assert_eq!(attempts.len(), 2);
    let gap = attempts[1].at.duration_since(attempts[0].at);
    assert!(gap >= Duration::from_millis(300), "retried after {gap:?}");

    // Remaining 0: the next request in the bucket waits for the reset
    // instead of earning a 429.
    fake.exhaust_bucket_next(0.4);
    a.send(&out("55", None, None, "one")).await.unwrap();
    let before = Instant::now();
    a.send(&out("55", None, None, "two")).await.unwrap();
    assert!(
        before.elapsed() >= Duration::from_millis(300),
        "{:?}",
        before.elapsed()
    );
    // Another channel is another bucket: no wait.
    fake.exhaust_bucket_next(5.0);
    a.send(&out("56", None, None, "three")).await.unwrap();
    let before = Instant::now();
    a.send(&out("57", None, None, "four")).await.unwrap();
    assert!(before.elapsed() < Duration::from_secs(2));

    // Beyond the retry budget the caller hears about it.
    for _ in 0..4 {
        fake.fail_next_send_with_429(0.05, true);
    }
    let err = a.send(&out("55", None, None, "again")).await.unwrap_err();
    assert_eq!(err, SendError::RateLimited(Duration::from_millis(50)));
    // A wait too long to block on is reported at once.
    fake.fail_next_send_with_429(3600.0, false);
    let started = Instant::now();
    let err = a.send(&out("55", None, None, "later")).await.unwrap_err();
    assert_eq!(err, SendError::RateLimited(Duration::from_secs(3600)));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(fake.sent().len(), 5);
}

#[tokio::test]
async fn send_errors_are_classified() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, true);
    for (status, rejected) in [(403, true), (404, true), (500, false), (503, false)] {
        fake.fail_next_send_with_status(status);
        let err = a.send(&out("55", None, None, "x")).await.unwrap_err();
        if rejected {
            assert!(matches!(err, SendError::Rejected(_)), "{status}: {err:?}");
        } else {
            assert!(matches!(err, SendError::Transient(_)), "{status}: {err:?}");
        }
    }
    let mut s = settings(&fake, true);
    s.token = "wrong.token".into();
    let bad = DiscordAdapter::new(s).unwrap();
    assert!(matches!(
        bad.send(&out("55", None, None, "x")).await,
        Err(SendError::Rejected(_))
    ));
}

#[tokio::test]
async fn shutdown_returns_ok_promptly() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, true);
    let run = spawn(&a, 1);
    fake.wait_for_sessions(1, WAIT).await;
    let started = Instant::now();
    run.shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(3), run.task)
        .await
        .expect("run ignored shutdown")
        .unwrap();
    assert_eq!(result, Ok(()));
    assert!(started.elapsed() < Duration::from_secs(3));
}
