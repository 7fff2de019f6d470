//! The Home Assistant adapter against real HTTP on 127.0.0.1: the
//! conversation endpoint mounted on the shared listener with a test inbox
//! (the test plays the runner), notifications to the fake Home Assistant
//! REST API. The `ha_*` tools are tested in `talaria-tools`.
#![cfg(feature = "homeassistant")]

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use talaria_adapter::split::split_message;
use talaria_adapter::{
    Adapter, AdapterContext, Inbox, LengthUnit, Liveness, LivenessReporter, MessageEvent,
    MessageLimits, OutboundMessage, SendError,
};
use talaria_platforms::homeassistant::{HomeAssistantAdapter, HomeAssistantSettings};
use talaria_platforms::ingress::Ingress;
use talaria_testkit::FakeHomeAssistant;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

const WAIT: Duration = Duration::from_secs(15);
const HASS_TOKEN: &str = "hass-long-lived-token-0123456789";
const CONV_SECRET: &str = "conversation-secret-0123456789";

struct Running {
    base: String,
    http: reqwest::Client,
    events: mpsc::Receiver<MessageEvent>,
    adapter: Arc<HomeAssistantAdapter>,
    ha: FakeHomeAssistant,
    /// Stops the adapter's run, as the gateway does when it stops.
    stop: CancellationToken,
    _server: DropGuard,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn start_with(configure: impl FnOnce(&mut HomeAssistantSettings)) -> Running {
    let ha = FakeHomeAssistant::start(HASS_TOKEN).await;
    let mut settings =
        HomeAssistantSettings::new(Some(&ha.url()), Some(HASS_TOKEN), Some(CONV_SECRET));
    configure(&mut settings);
    let adapter = Arc::new(
        HomeAssistantAdapter::new(&settings)
            .unwrap()
            .expect("a conversation token is set"),
    );
    let mut ingress = Ingress::bind("127.0.0.1", 0).await.unwrap();
    ingress.mount(adapter.mount());
    let addr = ingress.local_addr();
    let server = CancellationToken::new();
    tokio::spawn(ingress.serve(server.clone()));
    let (inbox, events) = Inbox::channel(16);
    let (reporter, mut liveness) = LivenessReporter::new();
    let shutdown = CancellationToken::new();
    let ctx = AdapterContext {
        inbox,
        liveness: reporter,
        shutdown: shutdown.clone(),
    };
    let a = adapter.clone();
    tokio::spawn(async move { a.run(ctx).await });
    tokio::time::timeout(WAIT, liveness.wait_for(|l| *l == Liveness::Live))
        .await
        .expect("never live")
        .expect("reporter dropped");
    Running {
        base: format!("http://{addr}"),
        http: reqwest::Client::new(),
        events,
        adapter,
        ha,
        stop: shutdown,
        _server: server.drop_guard(),
    }
}

async fn start() -> Running {
    start_with(|_| {}).await
}

impl Running {
    /// Posts a conversation request with this bearer (none when `None`).
    fn post(
        &self,
        bearer: Option<&str>,
        body: Value,
    ) -> impl std::future::Future<Output = (u16, Value)> + 'static {
        let mut req = self
            .http
            .post(format!("{}/homeassistant/conversation", self.base))
            .json(&body);
        if let Some(b) = bearer {
            req = req.bearer_auth(b);
        }
        async move {
            let r = tokio::time::timeout(WAIT, req.send())
                .await
                .expect("answered in time")
                .expect("request goes through");
            let status = r.status().as_u16();
            (status, r.json().await.unwrap_or(Value::Null))
        }
    }

    async fn next_event(&mut self) -> MessageEvent {
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .expect("an event in time")
            .expect("inbox open")
    }

    /// Answers `event` as the gateway would: split to the adapter's
    /// limit, the first part anchored to the event's message id.
    async fn answer(&self, event: &MessageEvent, text: &str) {
        for (i, part) in split_message(text, self.adapter.limits())
            .into_iter()
            .enumerate()
        {
            let message = OutboundMessage {
                chat_id: event.source.chat_id.clone(),
                thread_id: None,
                reply_to: if i == 0 {
                    event.message_id.clone()
                } else {
                    None
                },
                text: part,
                choices: Vec::new(),
            };
            self.adapter.send(&message).await.unwrap();
        }
    }
}

fn speech(body: &Value) -> &str {
    body["response"]["speech"]["plain"]["speech"]
        .as_str()
        .unwrap_or_else(|| panic!("no speech in {body}"))
}

#[tokio::test]
async fn a_request_becomes_an_event_and_is_answered_with_the_reply() {
    let mut rig = start().await;
    assert!(rig.adapter.verifies_senders());
    let pending = rig.post(
        Some(CONV_SECRET),
        json!({"text": "Is the kitchen light on?", "conversation_id": "01HCONV0001",
               "language": "de", "user_id": "8a7f00c0ffee", "device_id": "satellite1"}),
    );
    let request = tokio::spawn(pending);
    let event = rig.next_event().await;
    assert_eq!(event.text, "Is the kitchen light on?");
    assert_eq!(event.source.platform, "homeassistant");
    assert_eq!(event.source.chat_id, "01HCONV0001");
    assert_eq!(event.source.user_id.as_deref(), Some("8a7f00c0ffee"));
    let id = event.message_id.clone().expect("a message id");
    rig.answer(&event, "Yes, it is on.").await;
    let (status, body) = request.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(speech(&body), "Yes, it is on.");
    assert_eq!(body["response"]["response_type"], "action_done");
    assert_eq!(body["response"]["language"], "de");
    assert_eq!(body["conversation_id"], "01HCONV0001");
    assert_eq!(body["id"], id.as_str());
    assert!(rig.ha.notifications().is_empty());
}

#[tokio::test]
async fn without_a_conversation_id_one_is_minted_and_returned() {
    let mut rig = start().await;
    let request = tokio::spawn(rig.post(Some(CONV_SECRET), json!({"text": "hello"})));
    let event = rig.next_event().await;
    rig.answer(&event, "hi").await;
    let (_, body) = request.await.unwrap();
    let minted = body["conversation_id"].as_str().unwrap().to_owned();
    assert_eq!(minted, event.source.chat_id);
    assert!(minted.len() > 20, "{minted}");
    // An id unusable in a session key is hashed, and returned as given.
    let request = tokio::spawn(rig.post(
        Some(CONV_SECRET),
        json!({"text": "x", "conversation_id": "../../etc/passwd"}),
    ));
    let event = rig.next_event().await;
    assert!(
        event.source.chat_id.starts_with("conv_"),
        "{}",
        event.source.chat_id
    );
    rig.answer(&event, "ok").await;
    let (_, body) = request.await.unwrap();
    assert_eq!(body["conversation_id"], "../../etc/passwd");
}

#[tokio::test]
async fn a_bad_or_missing_bearer_is_refused_and_nothing_is_submitted() {
    let mut rig = start().await;
    for bearer in [None, Some("wrong"), Some("conversation-secret-012345678")] {
        let (status, body) = rig.post(bearer, json!({"text": "unlock the door"})).await;
        assert_eq!(status, 401, "{bearer:?}: {body}");
    }
    let (status, _) = rig.post(Some(CONV_SECRET), json!({"nope": 1})).await;
    assert_eq!(status, 400);
    let (status, _) = rig.post(Some(CONV_SECRET), json!({"text": "  "})).await;
    assert_eq!(status, 400);
    assert!(rig.events.try_recv().is_err(), "nothing reached the inbox");
}

#[tokio::test]
async fn a_retried_request_waits_for_the_same_answer_and_later_gets_it_again() {
    let mut rig = start().await;
    let body = json!({"text": "turn on the lights", "conversation_id": "c1", "id": "req-1"});
    let first = tokio::spawn(rig.post(Some(CONV_SECRET), body.clone()));
    let event = rig.next_event().await;
    assert_eq!(event.message_id.as_deref(), Some("req-1"));
    // The retry while the first still waits, by header this time.
    let retry = {
        let req = rig
            .http
            .post(format!("{}/homeassistant/conversation", rig.base))
            .bearer_auth(CONV_SECRET)
            .header("Idempotency-Key", "req-1")
            .json(&json!({"text": "turn on the lights", "conversation_id": "c1"}));
        tokio::spawn(async move {
            let r = req.send().await.unwrap();
            r.json::<Value>().await.unwrap()
        })
    };
    // Whether the retry arrives while the first waits (it then waits for
    // the same answer) or just after (it gets the remembered one), it
    // starts no second turn and says the same.
    rig.answer(&event, "Done, the lights are on.").await;
    let (_, a) = first.await.unwrap();
    let b = tokio::time::timeout(WAIT, retry).await.unwrap().unwrap();
    assert_eq!(speech(&a), "Done, the lights are on.");
    assert_eq!(speech(&b), "Done, the lights are on.");
    // After it finished: the same answer from the cache.
    let (status, c) = rig.post(Some(CONV_SECRET), body).await;
    assert_eq!(status, 200);
    assert_eq!(speech(&c), "Done, the lights are on.");
    assert!(
        rig.events.try_recv().is_err(),
        "one event for three requests"
    );
}

#[tokio::test]
async fn a_long_answer_is_returned_whole() {
    let mut rig = start().await;
    let request = tokio::spawn(rig.post(Some(CONV_SECRET), json!({"text": "tell me a story"})));
    let event = rig.next_event().await;
    let mut story = String::new();
    for i in 0..400 {
        story.push_str(&format!("Line {i} of the story, with some words.\n"));
        if i % 50 == 0 {
            story.push_str("```text\ncode inside\n\n```\n");
        }
    }
    assert!(story.chars().count() > 3 * 4096);
    let parts = split_message(
        &story,
        MessageLimits {
            max_len: 4096,
            unit: LengthUnit::Chars,
        },
    );
    assert!(parts.len() > 3);
    rig.answer(&event, &story).await;
    let (_, body) = request.await.unwrap();
    assert_eq!(speech(&body), story);
}

#[tokio::test]
async fn an_answer_nobody_waits_for_becomes_a_persistent_notification() {
    let rig = start().await;
    let message = OutboundMessage {
        chat_id: "01HCONV0002".into(),
        thread_id: None,
        reply_to: Some("gone".into()),
        text: "The washing machine is done.".into(),
        choices: Vec::new(),
    };
    rig.adapter.send(&message).await.unwrap();
    let n = rig.ha.wait_for_notifications(1, WAIT).await;
    assert_eq!(n[0].message, "The washing machine is done.");
    assert_eq!(n[0].title.as_deref(), Some("Talaria"));
    let id = n[0].notification_id.clone().unwrap();
    assert!(id.starts_with("talaria_"));
    // Home Assistant failing: 5xx may pass later, a refused token waits
    // for the operator; neither is lost.
    rig.ha
        .fail_next("/api/services/persistent_notification", &[503, 401]);
    assert!(matches!(
        rig.adapter.send(&message).await,
        Err(SendError::Transient(_))
    ));
    assert!(matches!(
        rig.adapter.send(&message).await,
        Err(SendError::Unavailable(_))
    ));
    // The resend replaces the notification rather than adding another.
    rig.adapter.send(&message).await.unwrap();
    let n = rig.ha.notifications();
    assert_eq!(n.len(), 2);
    assert_eq!(n[1].notification_id.as_deref(), Some(id.as_str()));
}

#[tokio::test]
async fn a_late_answer_is_pending_then_a_notification() {
    let mut rig = start_with(|s| s.reply_timeout = Duration::from_millis(300)).await;
    let body = json!({"text": "slow question", "conversation_id": "c9", "id": "slow-1"});
    let request = tokio::spawn(rig.post(Some(CONV_SECRET), body.clone()));
    let event = rig.next_event().await;
    let (status, answer) = request.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(answer["status"], "pending");
    assert!(speech(&answer).contains("notification"));
    rig.answer(&event, "Here is the slow answer.").await;
    let n = rig.ha.wait_for_notifications(1, WAIT).await;
    assert_eq!(n[0].message, "Here is the slow answer.");
    // A retry of the timed-out request starts nothing.
    let (_, again) = rig.post(Some(CONV_SECRET), body).await;
    assert_eq!(again["status"], "pending");
    assert!(rig.events.try_recv().is_err());
}

#[tokio::test]
async fn a_waiting_request_is_answered_pending_when_the_gateway_stops() {
    let mut rig = start().await;
    let request = tokio::spawn(rig.post(Some(CONV_SECRET), json!({"text": "long job"})));
    let event = rig.next_event().await;
    rig.stop.cancel();
    let (status, body) = request.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(body["status"], "pending");
    // The answer, finished while stopping, is still shown.
    rig.answer(&event, "finished after all").await;
    let n = rig.ha.wait_for_notifications(1, WAIT).await;
    assert_eq!(n[0].message, "finished after all");
}

// --- The tools -----------------------------------------------------------
