//! The Weixin adapter against the fake iLink bot API in talaria-testkit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use talaria_gateway::{
    Adapter, AdapterContext, AdapterError, ChatType, Inbox, Liveness, LivenessReporter,
    MessageEvent, OutboundMessage, SendError,
};
use talaria_platforms::weixin::{WeixinAdapter, WeixinSettings, WeixinTimings};
use talaria_store::CursorStore;
use talaria_testkit::weixin::{ACCOUNT_ID, FakeWeixin};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "e9b0c1d2a3f4@im.bot:0600test5e2d";
const PEER: &str = "o9cq80_peer@im.wechat";
const WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Cursors(Mutex<HashMap<(String, String), String>>);

#[async_trait]
impl CursorStore for Cursors {
    async fn cursor(&self, platform: &str, name: &str) -> talaria_store::Result<Option<String>> {
        Ok(self
            .0
            .lock()
            .unwrap()
            .get(&(platform.into(), name.into()))
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
            .insert((platform.into(), name.into()), value.into());
        Ok(())
    }

    async fn delete_cursor(&self, platform: &str, name: &str) -> talaria_store::Result<bool> {
        Ok(self
            .0
            .lock()
            .unwrap()
            .remove(&(platform.into(), name.into()))
            .is_some())
    }
}

fn adapter(fake: &FakeWeixin, cursors: Arc<Cursors>) -> Arc<WeixinAdapter> {
    let settings = WeixinSettings {
        token: TOKEN.into(),
        account_id: ACCOUNT_ID.into(),
        base_url: fake.base_url(),
        timings: WeixinTimings {
            poll_timeout: Duration::from_secs(1),
            poll_retry: Duration::from_millis(20),
            poll_backoff: Duration::from_millis(40),
            chunk_delay: Duration::from_millis(200),
            chunk_retries: 2,
            chunk_retry_delay: Duration::from_millis(300),
        },
    };
    Arc::new(WeixinAdapter::new(settings, cursors).unwrap())
}

struct Running {
    events: mpsc::Receiver<MessageEvent>,
    liveness: watch::Receiver<Liveness>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), AdapterError>>,
}

fn spawn(a: &Arc<WeixinAdapter>) -> Running {
    let (inbox, events) = Inbox::channel(16);
    let (reporter, liveness) = LivenessReporter::new();
    let shutdown = CancellationToken::new();
    let ctx = AdapterContext {
        inbox,
        liveness: reporter,
        shutdown: shutdown.clone(),
    };
    let a = a.clone();
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

    async fn ended(self) -> Result<(), AdapterError> {
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("run did not return")
            .expect("run panicked")
    }

    async fn stop(self) -> Result<(), AdapterError> {
        self.shutdown.cancel();
        self.ended().await
    }
}

fn out(text: &str) -> OutboundMessage {
    OutboundMessage {
        chat_id: PEER.into(),
        thread_id: None,
        reply_to: None,
        text: text.into(),
    }
}

#[tokio::test]
async fn texts_become_dm_events_and_replies_carry_the_context_token() {
    let fake = FakeWeixin::start(TOKEN, Duration::from_millis(300)).await;
    let cursors = Arc::new(Cursors::default());
    let a = adapter(&fake, cursors.clone());
    let mut run = spawn(&a);
    let id = fake.push_text(PEER, "hello");
    let ev = run.next().await;
    assert_eq!(
        (ev.source.chat_type, ev.source.chat_id.as_str()),
        (ChatType::Dm, PEER)
    );
    assert_eq!(
        (ev.text.as_str(), ev.message_id.as_deref()),
        ("hello", Some(id.as_str()))
    );
    tokio::time::timeout(WAIT, run.liveness.wait_for(|l| *l == Liveness::Live))
        .await
        .unwrap()
        .unwrap();
    // Our own echoes, bot messages, groups and files are not turns.
    fake.push_raw(
        serde_json::json!({"message_id": 1, "from_user_id": ACCOUNT_ID,
        "message_type": 1, "item_list": [{"type": 1, "text_item": {"text": "me"}}]}),
    );
    fake.push_raw(serde_json::json!({"message_id": 2, "from_user_id": PEER,
        "message_type": 2, "item_list": [{"type": 1, "text_item": {"text": "bot"}}]}));
    fake.push_raw(
        serde_json::json!({"message_id": 3, "from_user_id": PEER, "room_id": "r@chatroom",
        "message_type": 1, "item_list": [{"type": 1, "text_item": {"text": "group"}}]}),
    );
    fake.push_raw(serde_json::json!({"message_id": 4, "from_user_id": PEER,
        "message_type": 1, "item_list": [{"type": 3, "voice_item": {"text": "a transcript"}}]}));
    assert_eq!(run.next().await.text, "a transcript");
    // The same message again is not handed over twice.
    fake.redeliver(&id);
    fake.push_text(PEER, "next");
    assert_eq!(run.next().await.text, "next");

    a.send(&out("answer one")).await.unwrap();
    a.send(&out("answer two")).await.unwrap();
    let sent = fake.sent();
    assert_eq!(sent[0].context_token, fake.context_token(PEER));
    // Paced: the second part no sooner than the configured delay.
    assert!(sent[1].at.duration_since(sent[0].at) >= Duration::from_millis(200));
    assert!(fake.requests().iter().all(|r| r.well_formed));
    // The cursor and the token are in the store.
    let kept = cursors.0.lock().unwrap().clone();
    assert!(
        kept.keys()
            .any(|(p, n)| p == "weixin" && n.ends_with("get_updates_buf"))
    );
    assert!(
        kept.values()
            .any(|v| Some(v) == fake.context_token(PEER).as_ref())
    );
    run.stop().await.unwrap();
}

#[tokio::test]
async fn a_stale_token_is_dropped_and_rate_limits_are_waited_out() {
    let fake = FakeWeixin::start(TOKEN, Duration::from_millis(300)).await;
    let a = adapter(&fake, Arc::new(Cursors::default()));
    let mut run = spawn(&a);
    fake.push_text(PEER, "hi");
    run.next().await;
    fake.rotate_context_token(PEER);
    a.send(&out("still arrives")).await.unwrap();
    let sent = fake.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].context_token, None);
    // -2: waited out, no sooner than the retry delay.
    fake.fail_next_send(-2);
    a.send(&out("later")).await.unwrap();
    let attempts = fake.send_attempts();
    let n = attempts.len();
    // The stale token was dropped after the first refusal: two tries only.
    assert_eq!(n, 4);
    assert_eq!(fake.sent()[1].context_token, None);
    assert!(attempts[n - 1].at.duration_since(attempts[n - 2].at) >= Duration::from_millis(300));
    // Rate-limited past the retries: the ledger hears how long to wait.
    for _ in 0..3 {
        fake.fail_next_send(-2);
    }
    let err = a.send(&out("never")).await.unwrap_err();
    assert!(matches!(err, SendError::RateLimited(_)), "{err:?}");
    // Another refusal is final, and names its code.
    fake.fail_next_send(-3);
    let err = a.send(&out("no")).await.unwrap_err();
    assert!(
        matches!(&err, SendError::Rejected(m) if m.contains("-3")),
        "{err:?}"
    );
    // A poll answered -2 is retried.
    let polls = fake.polls();
    fake.fail_next_poll(-2);
    // The poll in flight, then the refused one, then one more.
    fake.wait_for_polls(polls + 3, WAIT).await;
    let refused = fake
        .requests()
        .iter()
        .filter(|r| r.endpoint == "getupdates")
        .count();
    assert!(refused >= polls + 3);
    fake.push_text(PEER, "after the pause");
    assert_eq!(run.next().await.text, "after the pause");
    run.stop().await.unwrap();
}

#[tokio::test]
async fn typing_fetches_a_ticket_once() {
    let fake = FakeWeixin::start(TOKEN, Duration::from_millis(300)).await;
    let a = adapter(&fake, Arc::new(Cursors::default()));
    a.typing(PEER, None).await.unwrap();
    a.typing(PEER, None).await.unwrap();
    let typing = fake.typing();
    assert_eq!(typing.len(), 2);
    assert_eq!(typing[0].1, typing[1].1, "the ticket is cached");
    let getconfig = fake
        .requests()
        .iter()
        .filter(|r| r.endpoint == "getconfig")
        .count();
    assert_eq!(getconfig, 1);
}

#[tokio::test]
async fn an_expired_login_ends_polling_for_good_with_the_fix() {
    let fake = FakeWeixin::start(TOKEN, Duration::from_millis(300)).await;
    let a = adapter(&fake, Arc::new(Cursors::default()));
    let run = spawn(&a);
    fake.wait_for_polls(1, WAIT).await;
    fake.fail_next_poll(-14);
    match run.ended().await {
        Err(AdapterError::Fatal(m)) => {
            assert!(
                m.contains("log in again") && m.contains("WEIXIN_TOKEN"),
                "{m}"
            );
            assert!(!m.contains(TOKEN));
        }
        other => panic!("{other:?}"),
    }
    let polls = fake.polls();
    // Run again (as the supervisor would): no poll, the same reason.
    let run = spawn(&a);
    assert!(matches!(run.ended().await, Err(AdapterError::Fatal(_))));
    assert_eq!(fake.polls(), polls);
}
