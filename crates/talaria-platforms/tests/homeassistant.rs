//! The Home Assistant adapter and tools against real HTTP on 127.0.0.1:
//! the conversation endpoint mounted on the shared listener with a test
//! inbox (the test plays the runner), and the `ha_*` tools against the
//! fake Home Assistant REST API.
#![cfg(feature = "homeassistant")]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use talaria_agent::interaction::{ApprovalDecision, ApprovalRequest, ClarifyRequest, Interaction};
use talaria_agent::tools::{SessionState, Tool, ToolContext};
use talaria_core::{Config, Home, Redactor};
use talaria_gateway::adapter::LengthUnit;
use talaria_gateway::split::split_message;
use talaria_gateway::{
    Adapter, AdapterContext, Inbox, Liveness, LivenessReporter, MessageEvent, MessageLimits,
    OutboundMessage, SendError,
};
use talaria_platforms::homeassistant::tools::ha_tools;
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

/// A human whose answers are scripted; records what it was asked.
#[derive(Default)]
struct Scripted {
    decisions: Mutex<VecDeque<ApprovalDecision>>,
    asked: Mutex<Vec<ApprovalRequest>>,
}

#[async_trait]
impl Interaction for Scripted {
    async fn approve(&self, request: &ApprovalRequest) -> ApprovalDecision {
        self.asked.lock().unwrap().push(request.clone());
        self.decisions
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(ApprovalDecision::Deny)
    }

    async fn clarify(&self, _request: &ClarifyRequest) -> Option<String> {
        None
    }
}

struct ToolRig {
    ha: FakeHomeAssistant,
    tools: Vec<Arc<dyn Tool>>,
    human: Arc<Scripted>,
    ctx: ToolContext,
    _dir: tempfile::TempDir,
}

async fn tool_rig(allowed: &[&str], decisions: &[ApprovalDecision]) -> ToolRig {
    let ha = FakeHomeAssistant::start(HASS_TOKEN).await;
    let mut settings = HomeAssistantSettings::new(Some(&ha.url()), Some(HASS_TOKEN), None);
    settings.allowed_services = allowed.iter().map(|s| s.to_string()).collect();
    let tools = ha_tools(&settings).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path().join("home"));
    home.ensure().unwrap();
    let store = Arc::new(talaria_store::SqliteStore::open(&home.state_db()).unwrap());
    let human = Arc::new(Scripted {
        decisions: Mutex::new(decisions.iter().copied().collect()),
        ..Scripted::default()
    });
    let ctx = ToolContext {
        session_id: "s1".into(),
        home,
        workdir: dir.path().to_path_buf(),
        config: Arc::new(Config::default()),
        store,
        interaction: human.clone(),
        session: Arc::new(SessionState::default()),
        redactor: Redactor::default(),
        cancel: CancellationToken::new(),
    };
    ToolRig {
        ha,
        tools,
        human,
        ctx,
        _dir: dir,
    }
}

impl ToolRig {
    async fn call(&self, name: &str, args: Value) -> Result<String, String> {
        let tool = self
            .tools
            .iter()
            .find(|t| t.name() == name)
            .unwrap_or_else(|| panic!("no tool {name}"));
        tool.call(args, &self.ctx).await.map_err(|e| e.0)
    }
}

#[tokio::test]
async fn the_tools_are_only_there_with_url_and_token_and_stay_small() {
    let none = HomeAssistantSettings::new(None, None, Some(CONV_SECRET));
    assert!(ha_tools(&none).unwrap().is_empty());
    let rig = tool_rig(&[], &[]).await;
    let mut names: Vec<&str> = rig.tools.iter().map(|t| t.name()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "ha_call_service",
            "ha_get_state",
            "ha_list_entities",
            "ha_list_services"
        ]
    );
    let spec_size: usize = rig
        .tools
        .iter()
        .map(|t| serde_json::to_string(&t.spec()).unwrap().len())
        .sum();
    assert!(spec_size < 2000, "the four specs take {spec_size} bytes");
}

#[tokio::test]
async fn read_only_lookups_never_ask() {
    let rig = tool_rig(&[], &[]).await;
    let all = rig.call("ha_list_entities", json!({})).await.unwrap();
    assert!(all.contains("light.kitchen | on | Kitchen Light"), "{all}");
    assert!(all.contains("sensor.outside_temperature | 12.5"), "{all}");
    let lights = rig
        .call("ha_list_entities", json!({"domain": "light"}))
        .await
        .unwrap();
    assert_eq!(lights.lines().count(), 2, "{lights}");
    let found = rig
        .call("ha_list_entities", json!({"search": "coffee"}))
        .await
        .unwrap();
    assert_eq!(found, "switch.coffee_maker | off | Coffee Maker");

    let state = rig
        .call(
            "ha_get_state",
            json!({"entity_id": "sensor.outside_temperature"}),
        )
        .await
        .unwrap();
    let state: Value = serde_json::from_str(&state).unwrap();
    assert_eq!(state["state"], "12.5");
    assert_eq!(state["attributes"]["unit_of_measurement"], "°C");
    let missing = rig
        .call("ha_get_state", json!({"entity_id": "light.garage"}))
        .await
        .unwrap_err();
    assert_eq!(missing, "no entity light.garage");

    let domains = rig.call("ha_list_services", json!({})).await.unwrap();
    assert!(
        domains.contains("light: toggle, turn_off, turn_on"),
        "{domains}"
    );
    let light = rig
        .call("ha_list_services", json!({"domain": "light"}))
        .await
        .unwrap();
    assert!(
        light.contains(
            "light.turn_on: Turns on one or more lights. (fields: brightness_pct, color_name)"
        ),
        "{light}"
    );
    assert!(rig.human.asked.lock().unwrap().is_empty());
    assert!(rig.ha.calls().is_empty());
}

#[tokio::test]
async fn a_call_allowed_by_pattern_runs_without_asking() {
    let rig = tool_rig(&["light.*", "media_player.volume_set"], &[]).await;
    let out = rig
        .call(
            "ha_call_service",
            json!({"domain": "light", "service": "turn_on", "entity_id": "light.living_room",
                   "data": {"brightness_pct": 40}}),
        )
        .await
        .unwrap();
    assert!(out.contains("light.living_room | on"), "{out}");
    let calls = rig.ha.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].data,
        json!({"entity_id": "light.living_room", "brightness_pct": 40})
    );
    assert_eq!(rig.ha.state("light.living_room").as_deref(), Some("on"));
    assert!(rig.human.asked.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_call_not_allowed_asks_and_a_denial_calls_nothing() {
    let rig = tool_rig(
        &["light.*"],
        &[ApprovalDecision::Deny, ApprovalDecision::Session],
    )
    .await;
    let unlock = json!({"domain": "lock", "service": "unlock", "entity_id": "lock.front_door"});
    let denied = rig
        .call("ha_call_service", unlock.clone())
        .await
        .unwrap_err();
    assert!(
        denied.contains("did NOT allow calling lock.unlock"),
        "{denied}"
    );
    assert!(rig.ha.calls().is_empty(), "nothing was called");
    assert_eq!(rig.ha.state("lock.front_door").as_deref(), Some("locked"));
    let asked = rig.human.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    assert!(asked[0].command.contains("lock.unlock"), "{:?}", asked[0]);
    assert!(
        asked[0].command.contains("lock.front_door"),
        "{:?}",
        asked[0]
    );

    // Approved for the session: runs now, and next time without asking.
    rig.call("ha_call_service", unlock.clone()).await.unwrap();
    assert_eq!(rig.ha.state("lock.front_door").as_deref(), Some("unlocked"));
    rig.call("ha_call_service", unlock).await.unwrap();
    assert_eq!(rig.human.asked.lock().unwrap().len(), 2);
    assert_eq!(rig.ha.calls().len(), 2);
}

#[tokio::test]
async fn ids_that_would_reach_other_paths_are_refused_before_any_request() {
    let rig = tool_rig(&["*"], &[]).await;
    for (tool, args) in [
        (
            "ha_get_state",
            json!({"entity_id": "../services/lock/unlock"}),
        ),
        (
            "ha_get_state",
            json!({"entity_id": "light.kitchen/../../config"}),
        ),
        ("ha_get_state", json!({"entity_id": "light.kitchen?x=1"})),
        ("ha_list_entities", json!({"domain": "light/../.."})),
        (
            "ha_call_service",
            json!({"domain": "lock/../light", "service": "turn_on"}),
        ),
        (
            "ha_call_service",
            json!({"domain": "light", "service": "turn_on/../../states"}),
        ),
        (
            "ha_call_service",
            json!({"domain": "light", "service": "turn_on", "entity_id": "../x"}),
        ),
    ] {
        let e = rig.call(tool, args.clone()).await.unwrap_err();
        assert!(e.contains("must"), "{tool} {args}: {e}");
    }
    assert!(rig.ha.calls().is_empty());
}

#[tokio::test]
async fn a_refused_token_is_said_plainly() {
    let ha = FakeHomeAssistant::start(HASS_TOKEN).await;
    let settings = HomeAssistantSettings::new(Some(&ha.url()), Some("stale-token"), None);
    let tools = ha_tools(&settings).unwrap();
    let rig = tool_rig(&[], &[]).await;
    let list = tools
        .iter()
        .find(|t| t.name() == "ha_list_entities")
        .unwrap();
    let e = list.call(json!({}), &rig.ctx).await.unwrap_err();
    assert!(e.0.starts_with("HASS_TOKEN was refused"), "{e}");
    assert_eq!(ha.unauthorized(), 1);
}
