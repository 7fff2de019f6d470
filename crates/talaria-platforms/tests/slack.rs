//! The Slack adapter against the fake Slack in talaria-testkit: Socket Mode
//! over a real WebSocket, the Web API over real HTTP.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use talaria_gateway::{
    Adapter, AdapterContext, AdapterError, Admission, Admit, ChatType, Inbox, Liveness,
    LivenessReporter, MessageEvent, OutboundMessage, SendError,
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

async fn next_admit(admits: &mut mpsc::Receiver<Admit>) -> Admit {
    tokio::time::timeout(WAIT, admits.recv())
        .await
        .expect("nothing handed over in time")
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
        choices: Vec::new(),
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
    // The test is the runner: it admits "one" and holds "two" unanswered,
    // so the adapter waits in `admit` with "two" read off the socket.
    let (inbox, mut admits) = Inbox::admitting(1);
    let (reporter, mut liveness) = LivenessReporter::new();
    let shutdown = CancellationToken::new();
    let ctx = AdapterContext {
        inbox,
        liveness: reporter,
        shutdown: shutdown.clone(),
    };
    let runner = a.clone();
    let task = tokio::spawn(async move { runner.run(ctx).await });
    wait_live(&mut liveness).await;
    let (e1, _) = fake.push_dm("D1", "U1", "one");
    let (e2, _) = fake.push_dm("D1", "U1", "two");
    let one = next_admit(&mut admits).await;
    assert_eq!(one.answer(Admission::Accepted).text, "one");
    let held = next_admit(&mut admits).await;
    assert_eq!(held.event.text, "two");
    // Stopped while "two" waits: the fake reads the connection in order,
    // so once it sees it closed it has read every ack sent before.
    shutdown.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .expect("run did not return")
        .expect("run panicked")
        .unwrap();
    talaria_testkit::wait::wait_for("the connection closed", || async {
        if fake.connected() {
            Err(fake.acks())
        } else {
            Ok(())
        }
    })
    .await;
    assert_eq!(
        fake.acks(),
        std::slice::from_ref(&e1),
        "two was acknowledged before hand-over"
    );
    drop(held);

    // Unacknowledged, "two" comes again on the next connection.
    let mut run = spawn(&a, 8);
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
    // Dropped once "two" is on the wire (the fake wrote its frame) and
    // still unacknowledged: in flight.
    let deadline = Instant::now() + WAIT;
    while fake.acks().is_empty()
        || !fake
            .frames()
            .iter()
            .any(|f| f["envelope_id"] == e2.as_str())
    {
        assert!(Instant::now() < deadline, "\"two\" never went out");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
    // A repeat of anything above would come before this marker.
    fake.push_dm("D1", "U1", "marker");
    assert_eq!(next(&mut sup.events).await.text, "marker");
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
    // An envelope is acknowledged only after its event was handed over
    // or dropped, so the repeat would be queued by now.
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
async fn fetch(a: &SlackAdapter, locator: &str) -> Result<Vec<u8>, DownloadError> {
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
    chat: &str,
    name: &str,
    bytes: &[u8],
    kind: MediaKind,
    mime: &str,
) -> OutboundFile {
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    OutboundFile {
        chat_id: chat.into(),
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
async fn shared_files_arrive_typed_and_download_with_the_bot_token() {
    let fake = FakeSlack::start(BOT, APP).await;
    let a = adapter(&fake);
    let mut run = spawn(&a, 16);
    let (png, ogg, pdf) = (samples::png(), samples::ogg_opus(), samples::pdf());
    let photo = fake.add_file("cat.png", "image/png", &png);
    let mut clip = fake.add_file("audio_message.webm", "audio/webm", &ogg);
    clip["subtype"] = json!("slack_audio");
    let doc = fake.add_file("report.pdf", "application/pdf", &pdf);
    fake.push_dm_files("D1", "U2", "see these", &[photo, clip, doc]);
    let ev = tokio::time::timeout(WAIT, run.events.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ev.text, "see these");
    let kinds: Vec<MediaKind> = ev.attachments.iter().map(|a| a.kind).collect();
    assert_eq!(
        kinds,
        [MediaKind::Image, MediaKind::Voice, MediaKind::Document]
    );
    assert_eq!(ev.attachments[0].name.as_deref(), Some("cat.png"));
    assert_eq!(ev.attachments[2].mime.as_deref(), Some("application/pdf"));
    assert_eq!(ev.attachments[2].size, Some(pdf.len() as u64));
    assert!(
        locator(&ev, 0).contains("/download/"),
        "url_private_download first"
    );
    assert_eq!(fetch(&a, &locator(&ev, 0)).await.unwrap(), png);
    assert_eq!(fetch(&a, &locator(&ev, 1)).await.unwrap(), ogg);
    assert_eq!(fetch(&a, &locator(&ev, 2)).await.unwrap(), pdf);
    let downloads = fake.downloads();
    assert_eq!(downloads.len(), 3);
    assert!(downloads.iter().all(|(_, with_token)| *with_token));
    run.shutdown.cancel();
}

#[tokio::test]
async fn missing_files_are_gone_and_foreign_hosts_are_never_asked() {
    let fake = FakeSlack::start(BOT, APP).await;
    let a = adapter(&fake);
    let root = fake.api_base().trim_end_matches("/api").to_owned();
    let gone = format!("{root}/files-pri/T0TALARIA-F99999999/download/x.png");
    let err = fetch(&a, &gone).await.unwrap_err();
    assert!(matches!(err, DownloadError::Gone(_)), "{err:?}");
    assert!(!err.to_string().contains(BOT));
    let port = fake
        .api_base()
        .split(':')
        .nth(2)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    for foreign in [
        "https://evil.example/files-pri/T1-F1/x.png".to_owned(),
        "http://files.slack.com/files-pri/T1-F1/x.png".to_owned(),
        "https://files.slack.com.evil.example/x".to_owned(),
        "https://files.slack.com:8443/x".to_owned(),
        format!("http://localhost:{port}/files-pri/T0TALARIA-F1/x.png"),
        format!("http://user:pw@127.0.0.1:{port}/files-pri/T0TALARIA-F1/x.png"),
        "file:///etc/passwd".to_owned(),
        "not a url".to_owned(),
    ] {
        match fetch(&a, &foreign).await.unwrap_err() {
            DownloadError::Gone(why) => assert!(why.contains("not a Slack file address"), "{why}"),
            other => panic!("{foreign}: {other:?}"),
        }
    }
    assert_eq!(
        fake.downloads().len(),
        1,
        "only the first, allowed, address was asked"
    );
}

#[tokio::test]
async fn files_go_through_the_external_upload_flow() {
    let fake = FakeSlack::start(BOT, APP).await;
    let a = adapter(&fake);
    let dir = tempfile::tempdir().unwrap();
    let (png, ogg, pdf) = (samples::png(), samples::ogg_opus(), samples::pdf());
    let mut photo = outbound(&dir, "C1", "chart.png", &png, MediaKind::Image, "image/png");
    photo.caption = Some("the **chart**".into());
    photo.thread_id = Some("1700000000.000001".into());
    let sent = a.send_file(&photo).await.unwrap();
    assert_eq!(
        sent.message_id, None,
        "Slack names no message for a shared file"
    );
    let voice = outbound(
        &dir,
        "C1",
        "answer.ogg",
        &ogg,
        MediaKind::Voice,
        "audio/ogg",
    );
    a.send_file(&voice).await.unwrap();
    let doc = outbound(
        &dir,
        "D1",
        "report.pdf",
        &pdf,
        MediaKind::Document,
        "application/pdf",
    );
    a.send_file(&doc).await.unwrap();

    let asks: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "files.getUploadURLExternal")
        .collect();
    assert_eq!(asks.len(), 3);
    assert!(asks.iter().all(|r| r.authorized));
    assert_eq!(asks[0].params["filename"], "chart.png");
    assert_eq!(asks[0].params["length"], png.len().to_string());

    let uploads = fake.uploads();
    assert_eq!(uploads.len(), 3);
    let expect = [
        ("chart.png", "image/png", &png),
        ("answer.ogg", "audio/ogg", &ogg),
        ("report.pdf", "application/pdf", &pdf),
    ];
    for (u, (name, mime, bytes)) in uploads.iter().zip(expect) {
        assert_eq!(u.filename, name);
        assert_eq!(u.length, bytes.len() as u64);
        assert_eq!(u.field.as_deref(), Some("filename"));
        assert_eq!(u.part_filename.as_deref(), Some(name));
        assert_eq!(u.content_type.as_deref(), Some(mime));
        assert_eq!(&u.bytes, bytes);
        assert!(
            !u.had_authorization,
            "the upload address carries its own authorization"
        );
    }
    let shares = fake.shares();
    assert_eq!(shares.len(), 3);
    assert_eq!(
        shares[0].files,
        [(uploads[0].file_id.clone(), Some("chart.png".to_owned()))]
    );
    assert_eq!(shares[0].channel_id.as_deref(), Some("C1"));
    assert_eq!(shares[0].thread_ts.as_deref(), Some("1700000000.000001"));
    assert_eq!(shares[0].initial_comment.as_deref(), Some("the *chart*"));
    assert_eq!(shares[1].thread_ts, None);
    assert_eq!(shares[1].initial_comment, None);
    assert_eq!(shares[2].channel_id.as_deref(), Some("D1"));
    assert_eq!(shares[2].files[0].0, uploads[2].file_id);
}

#[tokio::test]
async fn refused_steps_map_to_send_errors() {
    let fake = FakeSlack::start(BOT, APP).await;
    let dir = tempfile::tempdir().unwrap();
    let doc = outbound(
        &dir,
        "C1",
        "report.pdf",
        &samples::pdf(),
        MediaKind::Document,
        "application/pdf",
    );
    let bad = SlackAdapter::new(SlackSettings {
        bot_token: "xoxb-wrong".into(),
        ..settings(&fake)
    })
    .unwrap();
    match bad.send_file(&doc).await {
        Err(SendError::Rejected(code)) => assert_eq!(code, "invalid_auth"),
        other => panic!("{other:?}"),
    }
    let a = adapter(&fake);
    let mut gone = doc.clone();
    gone.path = dir.path().join("missing.pdf");
    assert!(matches!(
        a.send_file(&gone).await,
        Err(SendError::Rejected(_))
    ));
    let empty = outbound(
        &dir,
        "C1",
        "empty.txt",
        b"",
        MediaKind::Document,
        "text/plain",
    );
    match a.send_file(&empty).await {
        Err(SendError::Rejected(code)) => assert_eq!(code, "invalid_arguments"),
        other => panic!("{other:?}"),
    }
    assert!(fake.shares().is_empty());
}

#[tokio::test]
async fn a_sign_in_page_instead_of_the_file_is_refused() {
    let fake = FakeSlack::start(BOT, APP).await;
    let pdf = samples::pdf();
    let file = fake.add_file("report.pdf", "application/pdf", &pdf);
    let url = file["url_private_download"].as_str().unwrap().to_owned();
    // Slack serves its sign-in page to a token it will not give the file.
    let without_scope = SlackAdapter::new(SlackSettings {
        bot_token: "xoxb-without-files-read".into(),
        ..settings(&fake)
    })
    .unwrap();
    match fetch(&without_scope, &url).await.unwrap_err() {
        DownloadError::Gone(why) => assert!(why.contains("files:read"), "{why}"),
        other => panic!("{other:?}"),
    }
    // With the right token the first bytes read are handed back in place.
    assert_eq!(fetch(&adapter(&fake), &url).await.unwrap(), pdf);
}
