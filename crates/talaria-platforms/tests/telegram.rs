//! The Telegram adapter against the fake Bot API in talaria-testkit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use talaria_gateway::{
    Adapter, AdapterContext, AdapterError, ChatType, Inbox, Liveness, LivenessReporter,
    MessageEvent, OutboundMessage, SendError,
};
use talaria_platforms::telegram::{TelegramAdapter, TelegramSettings};
use talaria_testkit::FakeTelegram;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "123456:TEST-token_abc";
const WAIT: Duration = Duration::from_secs(10);

fn adapter(fake: &FakeTelegram, require_mention: bool) -> Arc<TelegramAdapter> {
    Arc::new(
        TelegramAdapter::new(TelegramSettings {
            token: TOKEN.into(),
            base_url: fake.base_url(),
            require_mention,
            poll_timeout: Duration::from_secs(1),
            streaming_edits: false,
        })
        .unwrap(),
    )
}

struct Running {
    events: mpsc::Receiver<MessageEvent>,
    liveness: watch::Receiver<Liveness>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), AdapterError>>,
}

fn spawn(adapter: &Arc<TelegramAdapter>, capacity: usize) -> Running {
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

    async fn stop(self) -> Result<(), AdapterError> {
        self.shutdown.cancel();
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("run did not return")
            .expect("run panicked")
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
async fn dm_text_becomes_an_event() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    let mut run = spawn(&a, 8);
    fake.push_private_text(42, "hello there");
    let ev = run.next().await;
    assert_eq!(ev.text, "hello there");
    assert_eq!(ev.source.platform, "telegram");
    assert_eq!(ev.source.chat_id, "42");
    assert_eq!(ev.source.chat_type, ChatType::Dm);
    assert_eq!(ev.source.user_id.as_deref(), Some("42"));
    assert_eq!(ev.source.user_name.as_deref(), Some("user42"));
    assert_eq!(ev.source.thread_id, None);
    assert!(!ev.source.is_bot);
    assert!(ev.message_id.is_some());
    assert_eq!(*run.liveness.borrow(), Liveness::Live);
    assert_eq!(a.bot_username().as_deref(), Some(fake.bot_username()));
    assert_eq!(
        a.credential(),
        Some(("telegram-bot-token", TOKEN.to_owned()))
    );
    run.stop().await.unwrap();
}

#[tokio::test]
async fn forum_topics_and_the_general_topic() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    let mut run = spawn(&a, 8);
    fake.push_group_text(-100, 5, "in a topic", Some(17), true);
    fake.push_group_text(-100, 5, "in general", None, true);
    // A reply thread in an ordinary group is not a topic.
    fake.push_group_text(-200, 5, "plain group", Some(9), false);

    let topic = run.next().await;
    assert_eq!(topic.source.chat_type, ChatType::Forum);
    assert_eq!(topic.source.thread_id.as_deref(), Some("17"));
    assert_eq!(topic.source.chat_name.as_deref(), Some("Group -100"));
    let general = run.next().await;
    assert_eq!(general.source.chat_type, ChatType::Forum);
    assert_eq!(general.source.thread_id.as_deref(), Some("1"));
    let group = run.next().await;
    assert_eq!(group.source.chat_type, ChatType::Group);
    assert_eq!(group.source.thread_id, None);
    assert_eq!(group.source.user_id.as_deref(), Some("5"));
    run.stop().await.unwrap();
}

#[tokio::test]
async fn groups_with_require_mention_only_pass_messages_for_the_bot() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, true);
    let mut run = spawn(&a, 8);
    let bot = fake.bot_username();
    fake.push_group_text(-1, 5, "just chatting", None, false);
    fake.push_group_text(-1, 5, &format!("hey @{bot} what's up"), None, false);
    fake.push_group_text(-1, 5, "/help@some_other_bot", None, false);
    fake.push_group_text(-1, 5, "/status", None, false);
    fake.push_update(json!({"message": {
        "chat": {"id": -1, "type": "supergroup", "title": "G"},
        "from": {"id": 6, "is_bot": false, "first_name": "Ann"},
        "text": "thanks!",
        "reply_to_message": {"message_id": 1, "chat": {"id": -1, "type": "supergroup"}, "date": 0,
            "text": "an answer", "from": {"id": fake.bot_id(), "is_bot": true, "first_name": "Bot"}},
    }}));
    // DMs are never filtered.
    fake.push_private_text(9, "no mention needed");

    let texts: Vec<String> = [
        run.next().await,
        run.next().await,
        run.next().await,
        run.next().await,
    ]
    .into_iter()
    .map(|e| e.text)
    .collect();
    assert_eq!(
        texts,
        [
            format!("hey @{bot} what's up"),
            "/status".to_owned(),
            "thanks!".to_owned(),
            "no mention needed".to_owned()
        ]
    );
    // The skipped ones were still confirmed, and none became an event.
    fake.wait_for_confirmed_updates(WAIT).await;
    assert!(run.events.try_recv().is_err());
    run.stop().await.unwrap();
    assert_eq!(fake.pending_updates(), 0);
}

#[tokio::test]
async fn the_offset_advances_only_after_hand_over() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    let u1 = fake.push_private_text(1, "one");
    let u2 = fake.push_private_text(1, "two");
    let u3 = fake.push_private_text(1, "three");
    // Capacity 1 and nobody reading: "one" fills the inbox, "two" waits.
    let mut run = spawn(&a, 1);
    fake.wait_for_get_updates_calls(1, WAIT).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let calls = fake.get_updates_calls();
    assert_eq!(calls.len(), 1, "polled again before hand-over: {calls:?}");
    assert_eq!(calls[0].offset, None);

    assert_eq!(run.next().await.text, "one");
    assert_eq!(run.next().await.text, "two");
    // "three" sits in the inbox now, so the batch is done and the next poll
    // confirms all three.
    let calls = fake.wait_for_get_updates_calls(2, WAIT).await;
    assert_eq!(calls[1].offset, Some(u3 + 1), "{calls:?}");
    assert!(calls.iter().all(|c| c.offset != Some(u2 + 1)));
    assert_eq!(run.next().await.text, "three");
    run.stop().await.unwrap();
    let _ = u1;
}

#[tokio::test]
async fn an_update_not_handed_over_is_delivered_again() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    let u1 = fake.push_private_text(1, "one");
    fake.push_private_text(1, "two");
    let run = spawn(&a, 1);
    fake.wait_for_get_updates_calls(1, WAIT).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Stop while "two" waits for the inbox: it must not be confirmed.
    let mut events = {
        let Running {
            events,
            shutdown,
            task,
            ..
        } = run;
        shutdown.cancel();
        tokio::time::timeout(WAIT, task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        events
    };
    assert_eq!(events.recv().await.unwrap().text, "one");

    // A reconnect with the same adapter resumes after "one" only.
    let mut run = spawn(&a, 8);
    assert_eq!(run.next().await.text, "two");
    let calls = fake.get_updates_calls();
    assert_eq!(calls[1].offset, Some(u1 + 1), "{calls:?}");
    run.stop().await.unwrap();
}

#[tokio::test]
async fn non_messages_and_malformed_updates_are_skipped() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    let mut run = spawn(&a, 8);
    fake.push_update(json!({"callback_query": {"id": "x"}}));
    fake.push_update(json!({"message": {"chat": "not an object"}}));
    let last = fake.push_private_text(3, "after the junk");
    assert_eq!(run.next().await.text, "after the junk");
    let calls = fake.wait_for_get_updates_calls(2, WAIT).await;
    assert_eq!(calls.last().unwrap().offset, Some(last + 1));
    run.stop().await.unwrap();
}

#[tokio::test]
async fn send_with_thread_and_reply() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    let sent = a
        .send(&out("-100", Some("17"), Some("55"), "in topic"))
        .await
        .unwrap();
    a.send(&out("-100", Some("1"), None, "in general"))
        .await
        .unwrap();
    let s = fake.sent();
    assert_eq!(sent.message_id, Some(s[0].message_id.to_string()));
    assert_eq!(s[0].chat_id, -100);
    assert_eq!(s[0].thread_id, Some(17));
    assert_eq!(s[0].reply_to, Some(55));
    assert_eq!(s[0].parse_mode.as_deref(), Some("HTML"));
    assert_eq!(s[0].text, "in topic");
    let params = &fake.send_attempts()[0].params;
    assert_eq!(params["allow_sending_without_reply"], json!(true));
    // The General topic is addressed by leaving the thread out.
    assert_eq!(s[1].thread_id, None);
    assert_eq!(s[1].reply_to, None);

    a.typing("-100", Some("17")).await.unwrap();
    let actions = fake.chat_actions();
    assert_eq!(actions[0].action, "typing");
    assert_eq!(actions[0].thread_id, Some(17));

    let id = sent.message_id.unwrap();
    a.edit("-100", &id, "edited **now**").await.unwrap();
    let edits = fake.edits();
    assert_eq!(edits[0].text, "edited <b>now</b>");
    // Editing to the same text is not an error.
    a.edit("-100", &id, "edited **now**").await.unwrap();
}

#[tokio::test]
async fn rate_limits_wait_retry_after() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    fake.fail_next_send_with_429(1);
    a.send(&out("7", None, None, "patience")).await.unwrap();
    let attempts = fake.send_attempts();
    assert_eq!(attempts.len(), 2);
    let gap = attempts[1].at.duration_since(attempts[0].at);
    assert!(gap >= Duration::from_secs(1), "retried after {gap:?}");
    assert_eq!(fake.sent().len(), 1);

    // Beyond the retry budget the caller hears about it.
    for _ in 0..4 {
        fake.fail_next_send_with_429(1);
    }
    let err = a.send(&out("7", None, None, "again")).await.unwrap_err();
    assert_eq!(err, SendError::RateLimited(Duration::from_secs(1)));
    // A wait too long to block on is reported at once.
    fake.fail_next_send_with_429(3600);
    let started = Instant::now();
    let err = a.send(&out("7", None, None, "later")).await.unwrap_err();
    assert_eq!(err, SendError::RateLimited(Duration::from_secs(3600)));
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[tokio::test]
async fn rejected_entities_fall_back_to_plain_text() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    fake.reject_entities_next(1);
    a.send(&out("7", None, None, "**bold** <tag>"))
        .await
        .unwrap();
    let s = fake.sent();
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].parse_mode, None);
    assert_eq!(s[0].text, "**bold** <tag>");
    assert_eq!(fake.send_attempts().len(), 2);
}

#[tokio::test]
async fn html_is_escaped() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    let text = "<script>alert('x')</script> & a > b, `x<y` and\n```html\n<b>&amp;</b>\n```";
    a.send(&out("7", None, None, text)).await.unwrap();
    let s = &fake.sent()[0];
    // The fake validates the markup: a mistake would have been a 400 and a
    // plain-text retry.
    assert_eq!(s.parse_mode.as_deref(), Some("HTML"));
    assert_eq!(fake.send_attempts().len(), 1);
    assert!(
        s.text.starts_with(
            "&lt;script&gt;alert('x')&lt;/script&gt; &amp; a &gt; b, <code>x&lt;y</code>"
        ),
        "{}",
        s.text
    );
    assert!(
        s.text.contains(
            "<pre><code class=\"language-html\">&lt;b&gt;&amp;amp;&lt;/b&gt;</code></pre>"
        ),
        "{}",
        s.text
    );
    assert_eq!(
        s.rendered(),
        "<script>alert('x')</script> & a > b, x<y and\n<b>&amp;</b>"
    );
}

#[tokio::test]
async fn send_errors_are_classified() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    fake.block_chat(8);
    assert!(matches!(
        a.send(&out("8", None, None, "hi")).await,
        Err(SendError::Rejected(_))
    ));
    assert!(matches!(
        a.send(&out("@nowhere", None, None, "hi")).await,
        Err(SendError::Rejected(d)) if d.contains("chat not found")
    ));
}

#[tokio::test]
async fn a_wrong_token_is_fatal() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = Arc::new(
        TelegramAdapter::new(TelegramSettings {
            token: "999:wrong".into(),
            base_url: fake.base_url(),
            require_mention: false,
            poll_timeout: Duration::from_secs(1),
            streaming_edits: false,
        })
        .unwrap(),
    );
    let run = spawn(&a, 1);
    let result = tokio::time::timeout(WAIT, run.task).await.unwrap().unwrap();
    match result {
        Err(AdapterError::Fatal(m)) => assert!(!m.contains("wrong"), "token leaked: {m}"),
        other => panic!("expected Fatal, got {other:?}"),
    }
}

#[tokio::test]
async fn failed_polls_degrade_then_disconnect() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    fake.fail_next_get_updates(2);
    let mut run = spawn(&a, 8);
    fake.push_private_text(4, "still here");
    // Two failures, then recovery.
    assert_eq!(run.next().await.text, "still here");
    assert_eq!(*run.liveness.borrow(), Liveness::Live);
    run.stop().await.unwrap();

    fake.fail_next_get_updates(100);
    let run = spawn(&a, 8);
    let mut liveness = run.liveness.clone();
    let result = tokio::time::timeout(WAIT, run.task).await.unwrap().unwrap();
    assert!(
        matches!(result, Err(AdapterError::Disconnected(_))),
        "{result:?}"
    );
    assert_eq!(*liveness.borrow_and_update(), Liveness::Degraded);
}

#[tokio::test]
async fn shutdown_returns_ok_promptly() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = Arc::new(
        TelegramAdapter::new(TelegramSettings {
            token: TOKEN.into(),
            base_url: fake.base_url(),
            require_mention: false,
            poll_timeout: Duration::from_secs(30),
            streaming_edits: false,
        })
        .unwrap(),
    );
    let run = spawn(&a, 1);
    fake.wait_for_get_updates_calls(1, WAIT).await;
    let started = Instant::now();
    run.shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(2), run.task)
        .await
        .expect("run ignored shutdown")
        .unwrap();
    assert_eq!(result, Ok(()));
    assert!(started.elapsed() < Duration::from_secs(2));
}
