//! The Slack adapter against the fake Slack in talaria-testkit: Socket Mode
//! over a real WebSocket, the Web API over real HTTP.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use talaria_gateway::{
    Adapter, AdapterContext, AdapterError, ChatType, Inbox, Liveness, LivenessReporter,
    MessageEvent, OutboundMessage, SendError,
};
use talaria_platforms::slack::{SlackAdapter, SlackSettings};
use talaria_testkit::FakeSlack;
use talaria_testkit::slack::PostFailure;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const BOT: &str = "xoxb-test-bot-token-0123456789";
const APP: &str = "xapp-1-test-app-token-0123456789";
const WAIT: Duration = Duration::from_secs(10);

fn settings(fake: &FakeSlack) -> SlackSettings {
    SlackSettings {
        bot_token: BOT.into(),
        app_token: APP.into(),
        api_base: fake.api_base(),
        require_mention: true,
        working_reaction: Some("eyes".into()),
        ping_interval: Duration::from_millis(20),
        ping_timeout: Duration::from_millis(150),
    }
}

fn adapter(fake: &FakeSlack) -> Arc<SlackAdapter> {
    Arc::new(SlackAdapter::new(settings(fake)).unwrap())
}

struct Running {
    events: mpsc::Receiver<MessageEvent>,
    liveness: watch::Receiver<Liveness>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), AdapterError>>,
}

/// Runs the adapter once, as the supervisor does for one connection.
fn spawn(adapter: &Arc<SlackAdapter>, capacity: usize) -> Running {
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

/// A task that runs the adapter again whenever `run` returns an error,
/// like the supervisor (without its backoff), recording the errors and
/// every liveness state it went through.
struct Supervised {
    events: mpsc::Receiver<MessageEvent>,
    errors: Arc<std::sync::Mutex<Vec<AdapterError>>>,
    states: Arc<std::sync::Mutex<Vec<Liveness>>>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

fn supervise(adapter: &Arc<SlackAdapter>, capacity: usize) -> Supervised {
    let (inbox, events) = Inbox::channel(capacity);
    let shutdown = CancellationToken::new();
    let errors = Arc::new(std::sync::Mutex::new(Vec::new()));
    let states = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (a, stop, errs, seen) = (
        adapter.clone(),
        shutdown.clone(),
        errors.clone(),
        states.clone(),
    );
    let task = tokio::spawn(async move {
        loop {
            let (reporter, mut watcher) = LivenessReporter::new();
            let seen2 = seen.clone();
            let follower = tokio::spawn(async move {
                loop {
                    seen2.lock().unwrap().push(*watcher.borrow_and_update());
                    if watcher.changed().await.is_err() {
                        return;
                    }
                }
            });
            let ctx = AdapterContext {
                inbox: inbox.clone(),
                liveness: reporter,
                shutdown: stop.clone(),
            };
            let r = a.run(ctx).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            follower.abort();
            match r {
                Ok(()) => return,
                Err(e) => errs.lock().unwrap().push(e),
            }
        }
    });
    Supervised {
        events,
        errors,
        states,
        shutdown,
        task,
    }
}

async fn next(events: &mut mpsc::Receiver<MessageEvent>) -> MessageEvent {
    tokio::time::timeout(WAIT, events.recv())
        .await
        .expect("no event in time")
        .expect("inbox closed")
}

async fn wait_live(liveness: &mut watch::Receiver<Liveness>) {
    tokio::time::timeout(WAIT, liveness.wait_for(|l| *l == Liveness::Live))
        .await
        .expect("never live")
        .unwrap();
}

impl Running {
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

fn out(chat_id: &str, thread_id: Option<&str>, text: &str) -> OutboundMessage {
    OutboundMessage {
        chat_id: chat_id.into(),
        thread_id: thread_id.map(Into::into),
        reply_to: None,
        text: text.into(),
    }
}

#[tokio::test]
async fn a_dm_becomes_an_event_and_its_envelope_is_acknowledged() {
    let fake = FakeSlack::start(BOT, APP).await;
    let a = adapter(&fake);
    let mut run = spawn(&a, 8);
    wait_live(&mut run.liveness).await;
    let (envelope, ts) = fake.push_dm("D42", "U42", "hello &lt;there&gt;");
    let ev = next(&mut run.events).await;
    assert_eq!(ev.text, "hello <there>");
    assert_eq!(ev.source.platform, "slack");
    assert_eq!(ev.source.chat_id, "D42");
    assert_eq!(ev.source.chat_type, ChatType::Dm);
    assert_eq!(ev.source.user_id.as_deref(), Some("U42"));
    assert_eq!(ev.source.thread_id, None);
    assert_eq!(ev.message_id.as_deref(), Some(ts.as_str()));
    fake.wait_for_all_acked(WAIT).await;
    assert_eq!(fake.acks(), [envelope]);
    assert_eq!(a.bot_user_id().as_deref(), Some(fake.bot_user_id()));
    // The adapter checked the bot token and opened Socket Mode with the
    // app token, each with the right one.
    let methods: Vec<(String, bool)> = fake
        .requests()
        .iter()
        .map(|r| (r.method.clone(), r.authorized))
        .collect();
    assert_eq!(
        methods,
        [
            ("auth.test".to_owned(), true),
            ("apps.connections.open".to_owned(), true)
        ]
    );
    run.stop().await.unwrap();
}

#[tokio::test]
async fn liveness_waits_for_hello_and_no_hello_means_reconnect() {
    let fake = FakeSlack::start(BOT, APP).await;
    fake.set_send_hello(false);
    let a = adapter(&fake);
    let run = spawn(&a, 8);
    let mut liveness = run.liveness.clone();
    fake.wait_for_connection(1, WAIT).await;
    // Connected at the TCP and WebSocket level, but Slack has not said
    // hello: not live, and after the timeout the connection is given up.
    let err = run.ended().await.unwrap_err();
    assert!(
        matches!(err, AdapterError::Disconnected(ref m) if m.contains("hello")),
        "{err:?}"
    );
    assert_ne!(*liveness.borrow_and_update(), Liveness::Live);

    fake.set_send_hello(true);
    let mut run = spawn(&a, 8);
    wait_live(&mut run.liveness).await;
    run.stop().await.unwrap();
}

#[tokio::test]
async fn channel_messages_need_a_mention_and_the_app_mention_twin_is_dropped() {
    let fake = FakeSlack::start(BOT, APP).await;
    let a = adapter(&fake);
    let mut run = spawn(&a, 8);
    wait_live(&mut run.liveness).await;
    let bot = fake.bot_user_id();
    fake.push_channel_message("C1", "U5", "just chatting", None);
    let text = format!("<@{bot}> what's up?");
    let (_, ts) = fake.push_channel_message("C1", "U5", &text, None);
    // Slack sends both events for one mention: one turn only.
    fake.push_app_mention("C1", "U5", &text, &ts, None);
    // A mention-only event for a message whose `message` event the app did
    // not subscribe to still gets through.
    let other_ts = fake.next_ts();
    fake.push_app_mention("C2", "U6", &format!("<@{bot}> ping"), &other_ts, None);
    // Bots, the bot itself and edits are never events.
    fake.push_event(
        json!({"type": "message", "channel": "C1", "channel_type": "channel",
        "user": "U7", "bot_id": "B7", "text": format!("<@{bot}> from a bot")}),
    );
    fake.push_event(
        json!({"type": "message", "channel": "D1", "channel_type": "im",
        "user": bot, "text": "my own answer"}),
    );
    fake.push_event(
        json!({"type": "message", "subtype": "message_changed", "channel": "D1",
        "channel_type": "im", "message": {"text": "edited"}}),
    );
    let first = next(&mut run.events).await;
    assert_eq!(first.text, "what's up?");
    assert_eq!(first.source.chat_type, ChatType::Group);
    assert_eq!(first.message_id.as_deref(), Some(ts.as_str()));
    let second = next(&mut run.events).await;
    assert_eq!(second.text, "ping");
    assert_eq!(second.source.chat_id, "C2");
    fake.wait_for_all_acked(WAIT).await;
    assert!(
        run.events.try_recv().is_err(),
        "nothing else became an event"
    );
    run.stop().await.unwrap();
}

#[tokio::test]
async fn an_envelope_is_acknowledged_only_after_the_inbox_took_it() {
    let fake = FakeSlack::start(BOT, APP).await;
    let a = adapter(&fake);
    // Capacity 1 and nobody reading: "one" fills the inbox, "two" waits.
    let mut run = spawn(&a, 1);
    wait_live(&mut run.liveness).await;
    let (e1, _) = fake.push_dm("D1", "U1", "one");
    let (e2, _) = fake.push_dm("D1", "U1", "two");
    let deadline = Instant::now() + WAIT;
    while fake.acks().is_empty() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        fake.acks(),
        std::slice::from_ref(&e1),
        "two was acknowledged before hand-over"
    );
    assert_eq!(next(&mut run.events).await.text, "one");
    assert_eq!(next(&mut run.events).await.text, "two");
    fake.wait_for_all_acked(WAIT).await;
    assert_eq!(fake.acks(), [e1, e2]);
    run.stop().await.unwrap();
}

#[tokio::test]
async fn a_dropped_connection_is_resumed_without_losing_or_duplicating_an_event() {
    let fake = FakeSlack::start(BOT, APP).await;
    let a = adapter(&fake);
    let mut sup = supervise(&a, 1);
    fake.wait_for_connection(1, WAIT).await;
    // "one" fills the inbox; "two" is read from the socket and waits for
    // room, unacknowledged, when the connection drops.
    fake.push_dm("D1", "U1", "one");
    let (e2, _) = fake.push_dm("D1", "U1", "two");
    let deadline = Instant::now() + WAIT;
    while fake.acks().is_empty() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    fake.drop_connection();
    assert_eq!(fake.pending(), 1);
    assert_eq!(next(&mut sup.events).await.text, "one");
    assert_eq!(next(&mut sup.events).await.text, "two");
    // The adapter reconnects; Slack re-sends "two" (never acknowledged)
    // on the new connection, where it is acknowledged, not handed over
    // again.
    fake.wait_for_connection(2, WAIT).await;
    fake.wait_for_all_acked(WAIT).await;
    let retried = fake
        .frames()
        .iter()
        .filter(|f| f["envelope_id"] == e2.as_str())
        .map(|f| f["retry_attempt"].as_u64().unwrap())
        .collect::<Vec<_>>();
    assert_eq!(retried, [0, 1]);
    fake.push_dm("D1", "U1", "three");
    assert_eq!(next(&mut sup.events).await.text, "three");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(sup.events.try_recv().is_err(), "an event came twice");
    assert!(
        sup.errors
            .lock()
            .unwrap()
            .iter()
            .all(|e| matches!(e, AdapterError::Disconnected(_))),
        "{:?}",
        sup.errors.lock().unwrap()
    );
    sup.shutdown.cancel();
    tokio::time::timeout(WAIT, sup.task).await.unwrap().unwrap();
}

#[tokio::test]
async fn re_sent_envelopes_are_acknowledged_but_not_handed_over_again() {
    let fake = FakeSlack::start(BOT, APP).await;
    let a = adapter(&fake);
    let mut run = spawn(&a, 8);
    wait_live(&mut run.liveness).await;
    let (e1, _) = fake.push_dm("D1", "U1", "only once");
    assert_eq!(next(&mut run.events).await.text, "only once");
    fake.wait_for_all_acked(WAIT).await;
    // Slack thinks the ack was lost and retries.
    fake.redeliver(true);
    let deadline = Instant::now() + WAIT;
    while fake.acks().len() < 2 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(fake.acks(), [e1.clone(), e1]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(run.events.try_recv().is_err());
    run.stop().await.unwrap();
}

#[tokio::test]
async fn refresh_requested_opens_a_new_connection_without_leaving_run() {
    let fake = FakeSlack::start(BOT, APP).await;
    let a = adapter(&fake);
    let mut run = spawn(&a, 8);
    wait_live(&mut run.liveness).await;
    fake.send_disconnect("refresh_requested");
    fake.wait_for_connection(2, WAIT).await;
    fake.push_dm("D1", "U1", "after the refresh");
    assert_eq!(next(&mut run.events).await.text, "after the refresh");
    assert!(!run.task.is_finished());
    assert_eq!(
        fake.requests()
            .iter()
            .filter(|r| r.method == "apps.connections.open")
            .count(),
        2
    );
    run.stop().await.unwrap();
}

#[tokio::test]
async fn link_disabled_and_bad_tokens_are_fatal() {
    let fake = FakeSlack::start(BOT, APP).await;
    let a = adapter(&fake);
    let mut run = spawn(&a, 8);
    wait_live(&mut run.liveness).await;
    fake.send_disconnect("link_disabled");
    let err = run.ended().await.unwrap_err();
    assert!(
        matches!(err, AdapterError::Fatal(ref m) if m.contains("link_disabled")),
        "{err:?}"
    );

    let mut wrong_bot = settings(&fake);
    wrong_bot.bot_token = "xoxb-not-the-right-one".into();
    let run = spawn(&Arc::new(SlackAdapter::new(wrong_bot).unwrap()), 8);
    let err = run.ended().await.unwrap_err();
    assert!(
        matches!(err, AdapterError::Fatal(ref m) if m.contains("SLACK_BOT_TOKEN")),
        "{err:?}"
    );
    assert!(!err.to_string().contains("not-the-right-one"));

    let mut wrong_app = settings(&fake);
    wrong_app.app_token = "xapp-not-the-right-one".into();
    let run = spawn(&Arc::new(SlackAdapter::new(wrong_app).unwrap()), 8);
    let err = run.ended().await.unwrap_err();
    assert!(
        matches!(err, AdapterError::Fatal(ref m) if m.contains("SLACK_APP_TOKEN")),
        "{err:?}"
    );

    // A server-side hiccup opening the socket is not fatal.
    fake.fail_next_open("internal_error");
    let run = spawn(&a, 8);
    let err = run.ended().await.unwrap_err();
    assert!(matches!(err, AdapterError::Disconnected(_)), "{err:?}");
}

#[tokio::test]
async fn a_silent_socket_is_caught_by_the_watchdog_and_rebuilt() {
    let fake = FakeSlack::start(BOT, APP).await;
    let a = adapter(&fake);
    let mut sup = supervise(&a, 8);
    fake.wait_for_connection(1, WAIT).await;
    // Pings flow and are answered while the socket is healthy.
    fake.wait_for_pings(3, WAIT).await;
    assert!(sup.errors.lock().unwrap().is_empty());
    let opened_before = fake.requests().len();
    fake.go_silent();
    // The TCP connection stays open; only the missing pongs show it dead.
    fake.wait_for_connection(2, WAIT).await;
    let errors = sup.errors.lock().unwrap().clone();
    assert!(
        matches!(errors.as_slice(), [AdapterError::Disconnected(m)] if m.contains("no answer")),
        "{errors:?}"
    );
    let states = sup.states.lock().unwrap().clone();
    assert!(states.contains(&Liveness::Degraded), "{states:?}");
    // The whole client was rebuilt: a fresh apps.connections.open.
    assert!(
        fake.requests()[opened_before..]
            .iter()
            .any(|r| r.method == "apps.connections.open")
    );
    fake.push_dm("D1", "U1", "still here?");
    assert_eq!(next(&mut sup.events).await.text, "still here?");
    sup.shutdown.cancel();
    tokio::time::timeout(WAIT, sup.task).await.unwrap().unwrap();
}

#[tokio::test]
async fn malformed_frames_and_events_are_skipped_without_dropping_the_connection() {
    let fake = FakeSlack::start(BOT, APP).await;
    let a = adapter(&fake);
    let mut run = spawn(&a, 8);
    wait_live(&mut run.liveness).await;
    fake.send_raw("this is not json");
    fake.send_raw("[1, 2, 3]");
    fake.send_raw(r#"{"type": "events_api"}"#);
    fake.send_raw(
        r#"{"type": "events_api", "envelope_id": "raw-1", "payload": {"event": "nope"}}"#,
    );
    fake.push_event(json!({"type": "message", "channel": 5, "user": ["x"]}));
    fake.push_dm("D1", "U1", "still fine");
    assert_eq!(next(&mut run.events).await.text, "still fine");
    fake.wait_for_all_acked(WAIT).await;
    assert!(fake.acks().contains(&"raw-1".to_owned()));
    assert_eq!(fake.connections(), 1);
    run.stop().await.unwrap();
}

#[tokio::test]
async fn sends_are_mrkdwn_and_thread_replies_land_in_their_thread() {
    let fake = FakeSlack::start(BOT, APP).await;
    let a = adapter(&fake);
    let sent = a
        .send(&out(
            "C1",
            Some("1700000000.000001"),
            "**done** & [docs](https://x.y)",
        ))
        .await
        .unwrap();
    let posted = fake.posted();
    assert_eq!(posted.len(), 1);
    assert_eq!(posted[0].channel, "C1");
    assert_eq!(posted[0].thread_ts.as_deref(), Some("1700000000.000001"));
    assert_eq!(posted[0].text, "*done* &amp; <https://x.y|docs>");
    assert_eq!(posted[0].mrkdwn, Some(true));
    assert_eq!(sent.message_id.as_deref(), Some(posted[0].ts.as_str()));
    a.send(&out("D1", None, "plain")).await.unwrap();
    assert_eq!(fake.posted()[1].thread_ts, None);
}

#[tokio::test]
async fn rate_limits_are_waited_out_then_reported() {
    let fake = FakeSlack::start(BOT, APP).await;
    let a = adapter(&fake);
    fake.fail_next_post(PostFailure::RateLimited(1));
    let started = Instant::now();
    a.send(&out("D1", None, "after a wait")).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After was not honoured"
    );
    assert_eq!(fake.post_attempts().len(), 2);
    assert_eq!(fake.posted().len(), 1);
    // A wait longer than a send should block for is reported at once.
    fake.fail_next_post(PostFailure::RateLimited(600));
    let err = a
        .send(&out("D1", None, "too long a wait"))
        .await
        .unwrap_err();
    assert_eq!(err, SendError::RateLimited(Duration::from_secs(600)));
    assert_eq!(fake.posted().len(), 1);
}

#[tokio::test]
async fn send_errors_are_classified() {
    let fake = FakeSlack::start(BOT, APP).await;
    let a = adapter(&fake);
    fake.fail_next_post(PostFailure::Error("channel_not_found".into()));
    assert_eq!(
        a.send(&out("C404", None, "x")).await.unwrap_err(),
        SendError::Rejected("channel_not_found".into())
    );
    fake.fail_next_post(PostFailure::Error("not_in_channel".into()));
    assert!(matches!(
        a.send(&out("C1", None, "x")).await.unwrap_err(),
        SendError::Rejected(_)
    ));
    fake.fail_next_post(PostFailure::Status(503));
    assert!(matches!(
        a.send(&out("C1", None, "x")).await.unwrap_err(),
        SendError::Transient(_)
    ));
    let mut wrong = settings(&fake);
    wrong.bot_token = "xoxb-wrong".into();
    let b = SlackAdapter::new(wrong).unwrap();
    assert_eq!(
        b.send(&out("C1", None, "x")).await.unwrap_err(),
        SendError::Rejected("invalid_auth".into())
    );
    // Nothing listening: unavailable, nothing was sent.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut gone = settings(&fake);
    gone.api_base = format!("http://127.0.0.1:{port}/api");
    let c = SlackAdapter::new(gone).unwrap();
    let err = c.send(&out("C1", None, "x")).await.unwrap_err();
    assert!(matches!(err, SendError::Unavailable(_)), "{err:?}");
    assert!(!err.to_string().contains("test-bot-token"));
    assert!(fake.posted().is_empty());
}

#[tokio::test]
async fn typing_is_a_reaction_that_the_answer_removes() {
    let fake = FakeSlack::start(BOT, APP).await;
    let a = adapter(&fake);
    let mut run = spawn(&a, 8);
    wait_live(&mut run.liveness).await;
    let (_, ts) = fake.push_dm("D9", "U9", "think hard");
    next(&mut run.events).await;
    a.typing("D9", None).await.unwrap();
    a.typing("D9", None).await.unwrap();
    // Nothing to react to in a chat without a pending message.
    a.typing("D10", None).await.unwrap();
    let reactions = fake.reactions();
    assert_eq!(reactions.len(), 1, "{reactions:?}");
    assert!(reactions[0].added);
    assert_eq!(
        (
            reactions[0].channel.as_str(),
            reactions[0].timestamp.as_str(),
            reactions[0].name.as_str()
        ),
        ("D9", ts.as_str(), "eyes")
    );
    a.send(&out("D9", None, "the answer")).await.unwrap();
    let reactions = fake.reactions();
    assert_eq!(reactions.len(), 2);
    assert!(!reactions[1].added);
    assert_eq!(reactions[1].timestamp, ts);
    run.stop().await.unwrap();
}
