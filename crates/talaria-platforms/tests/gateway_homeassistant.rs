//! Home Assistant end to end, in one process: conversation requests to the
//! real adapter on the shared listener, the real runner, router and
//! delivery ledger on a real SQLite file, the mock LLM over HTTP, and the
//! `ha_*` tools against the fake Home Assistant REST API. The contract
//! scenarios run through [`HomeAssistantKit`]; what only Home Assistant
//! has is tested below on the same rig.
#![cfg(feature = "homeassistant")]

use crate::contract;

use std::sync::Arc;
use std::time::Duration;

use contract::{AdapterKit, Rig};
use serde_json::{Value, json};
use talaria_agent::tools::Tool;
use talaria_core::{Config, Env};
use talaria_gateway::Adapter;
use talaria_platforms::homeassistant::{HomeAssistantAdapter, HomeAssistantSettings};
use talaria_platforms::registry::{Built, Setup};
use talaria_testkit::kit::homeassistant::{
    CONV_SECRET, HASS_TOKEN, HomeAssistantKit, REPLY_TIMEOUT_SECS,
};
use talaria_testkit::kit::long_answer;
use talaria_testkit::wait::WAIT;
use talaria_testkit::{Reply, ToolCallReply};
use talaria_tools::homeassistant::ha_tools;

/// The settings as `talaria gateway run` resolves them from
/// `platforms.homeassistant` and the environment.
fn settings(config: &Config, env: &Env) -> HomeAssistantSettings {
    HomeAssistantSettings::from_config(&config.section().unwrap(), env)
        .expect("the kit turns Home Assistant on")
}

fn ha_adapter(config: &Config, env: &Env) -> HomeAssistantAdapter {
    HomeAssistantAdapter::new(&settings(config, env))
        .unwrap()
        .expect("the kit sets a conversation token")
}

impl AdapterKit for HomeAssistantKit {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        Arc::new(ha_adapter(config, env))
    }

    fn build(&self, setup: &Setup<'_>) -> Built {
        let adapter = ha_adapter(setup.config, setup.env);
        Built {
            mount: Some(adapter.mount()),
            adapter: Arc::new(adapter),
        }
    }

    fn tools(&self, config: &Config, env: &Env) -> Vec<Arc<dyn Tool>> {
        ha_tools(&settings(config, env)).unwrap()
    }
}

adapter_contract!(HomeAssistantKit;
    run: dm_turn, redelivery, unauthorized;
    skip: thread_reply => contract::Skip::Threadless,
          group_mention => contract::Skip::NoGroups,
          long_answer_split => contract::Skip::Reassembled,
          dropped_connection => contract::Skip::Connectionless,
          rate_limit => contract::Skip::UnlimitedSends,
          media_in => contract::Skip::ReceivesNoFiles,
          media_out => contract::Skip::SendsNoFiles);

type HaRig = Rig<HomeAssistantKit>;

/// Posts a conversation request with the secret and waits for its answer.
async fn converse(rig: &HaRig, body: Value) -> Value {
    converse_as(rig, Some(CONV_SECRET), body).await.1
}

/// Posts a request with this bearer; returns the status and the body.
async fn converse_as(rig: &HaRig, bearer: Option<&str>, body: Value) -> (u16, Value) {
    let n = rig.kit.sender.taken().len();
    rig.kit.post(bearer, &body);
    let taken = rig.kit.sender.wait_taken(n + 1).await;
    let answer = &taken[n];
    (
        answer.status,
        serde_json::from_str(&answer.body).unwrap_or(Value::Null),
    )
}

fn speech(body: &Value) -> &str {
    body["response"]["speech"]["plain"]["speech"]
        .as_str()
        .unwrap_or_else(|| panic!("no speech in {body}"))
}

/// The messages of LLM request `i`, as `(role, content)`.
fn messages(rig: &HaRig, i: usize) -> Vec<(String, String)> {
    rig.llm.requests()[i].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or("").to_owned(),
                m["content"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

fn tool_results(rig: &HaRig, i: usize) -> Vec<String> {
    messages(rig, i)
        .into_iter()
        .filter(|(r, _)| r == "tool")
        .map(|(_, c)| c)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answer_is_home_assistants_conversation_result() {
    let rig = HaRig::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("The kitchen light is on."));
    let answer = converse(
        &rig,
        json!({"text": "Is the kitchen light on?", "conversation_id": "01HCONVA", "language": "en"}),
    )
    .await;
    assert_eq!(speech(&answer), "The kitchen light is on.");
    assert_eq!(answer["conversation_id"], "01HCONVA");
    assert_eq!(answer["response"]["response_type"], "action_done");
    assert_eq!(answer["response"]["language"], "en");
    rig.wait_for_delivered(1).await;
    assert!(rig.kit.fake.notifications().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_conversation_id_continues_the_session() {
    let rig = HaRig::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("Hello Ada."));
    rig.llm.push(Reply::text("Your name is Ada."));
    let first = converse(
        &rig,
        json!({"text": "My name is Ada.", "conversation_id": "01HCONVB"}),
    )
    .await;
    assert_eq!(speech(&first), "Hello Ada.");
    rig.wait_for_delivered(1).await;
    let second = converse(
        &rig,
        json!({"text": "What is my name?", "conversation_id": "01HCONVB"}),
    )
    .await;
    assert_eq!(speech(&second), "Your name is Ada.");
    let seen = messages(&rig, 1);
    let pos = |role: &str, text: &str| {
        seen.iter()
            .position(|(r, c)| r == role && c == text)
            .unwrap_or_else(|| panic!("no {role} {text:?} in {seen:?}"))
    };
    assert!(pos("user", "My name is Ada.") < pos("assistant", "Hello Ada."));
    assert!(pos("assistant", "Hello Ada.") < pos("user", "What is my name?"));
    rig.wait_for_delivered(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_request_gets_the_same_answer_again() {
    // That it starts no second turn is the contract's `redelivery`.
    let rig = HaRig::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("first answer"));
    let body = json!({"text": "Turn it up", "conversation_id": "01HCONVC", "id": "ha-req-7"});
    assert_eq!(speech(&converse(&rig, body.clone()).await), "first answer");
    rig.wait_for_delivered(1).await;
    let (status, retry) = converse_as(&rig, Some(CONV_SECRET), body).await;
    assert_eq!(status, 200);
    assert_eq!(speech(&retry), "first answer");
    assert_eq!(rig.llm.requests().len(), 1, "the retry reached the model");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bearer_or_the_rest_api_token_is_refused_and_the_model_is_never_called() {
    // A wrong secret is the contract's `unauthorized`.
    let rig = HaRig::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("only for the real caller"));
    for bearer in [None, Some(HASS_TOKEN)] {
        let (status, _) = converse_as(&rig, bearer, json!({"text": "Unlock the front door"})).await;
        assert_eq!(status, 401, "{bearer:?}");
    }
    let ok = converse(&rig, json!({"text": "hello"})).await;
    assert_eq!(speech(&ok), "only for the real caller");
    rig.wait_for_delivered(1).await;
    assert_eq!(
        rig.llm.requests().len(),
        1,
        "refused requests reached the model"
    );
    assert_eq!(rig.user_messages(0), vec!["hello"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_answer_is_returned_whole() {
    // The runner splits it under the adapter's limit; the adapter joins
    // the parts back, so Home Assistant gets one answer (no `(i/n)`).
    let rig = HaRig::started(&[], |_| {}).await;
    let limit = rig.capabilities().limits.max_len;
    let mut long = long_answer(limit * 2 + 500);
    long.push_str("\n```yaml\nautomation:\n  - alias: test\n```\nThe end.");
    rig.llm.push(Reply::text(long.clone()));
    let answer = converse(&rig, json!({"text": "Write a long guide"})).await;
    assert_eq!(speech(&answer), long);
    rig.wait_for_delivered(1).await;
    assert!(rig.kit.fake.notifications().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_with_no_waiting_request_becomes_a_persistent_notification() {
    let rig = HaRig::started(&[], |_| {}).await;
    // The model answers after the request stopped waiting.
    rig.llm.push(
        Reply::text("The garage door was closed at 8pm.")
            .with_delay(Duration::from_secs(REPLY_TIMEOUT_SECS + 2)),
    );
    let (status, answer) = converse_as(
        &rig,
        Some(CONV_SECRET),
        json!({"text": "When was the garage closed?", "id": "slow-1"}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(answer["status"], "pending");
    let n = rig.kit.fake.wait_for_notifications(1, WAIT).await;
    assert_eq!(n[0].message, "The garage door was closed at 8pm.");
    assert_eq!(n[0].title.as_deref(), Some("Talaria"));
    rig.wait_for_delivered(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_reads_states_and_calls_an_allowed_service() {
    // The kit allows `light.*`.
    let rig = HaRig::started(&[], |_| {}).await;
    rig.llm.push(Reply::tool_calls(vec![ToolCallReply::new(
        "call_1",
        "ha_get_state",
        r#"{"entity_id": "light.living_room"}"#,
    )]));
    rig.llm.push(Reply::tool_calls(vec![ToolCallReply::new(
        "call_2",
        "ha_call_service",
        r#"{"domain": "light", "service": "turn_on", "entity_id": "light.living_room", "data": {"brightness_pct": 30}}"#,
    )]));
    rig.llm
        .push(Reply::text("The living room light is on now."));
    let answer = converse(&rig, json!({"text": "Turn on the living room light"})).await;
    assert_eq!(speech(&answer), "The living room light is on now.");
    // The model saw the state, then the call's result.
    let tools = tool_results(&rig, 2);
    assert_eq!(tools.len(), 2, "{tools:?}");
    assert!(tools[0].contains(r#""state":"off""#), "{}", tools[0]);
    assert!(tools[1].contains("light.living_room | on"), "{}", tools[1]);
    let calls = rig.kit.fake.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (calls[0].domain.as_str(), calls[0].service.as_str()),
        ("light", "turn_on")
    );
    assert_eq!(
        rig.kit.fake.state("light.living_room").as_deref(),
        Some("on")
    );
    rig.wait_for_delivered(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_not_allowed_asks_in_the_conversation_and_a_denial_calls_nothing() {
    let rig = HaRig::started(&[], |_| {}).await;
    rig.llm.push(Reply::tool_calls(vec![ToolCallReply::new(
        "call_1",
        "ha_call_service",
        r#"{"domain": "lock", "service": "unlock", "entity_id": "lock.front_door"}"#,
    )]));
    rig.llm
        .push(Reply::text("All right, the front door stays locked."));
    let conv = "01HCONVD";
    // The turn stops at the approval: the question is this request's answer.
    let asked = converse(
        &rig,
        json!({"text": "Unlock the front door", "conversation_id": conv}),
    )
    .await;
    let question = speech(&asked);
    assert!(question.contains("needs your approval"), "{question}");
    assert!(question.contains("lock.unlock"), "{question}");
    assert!(question.contains("/deny"), "{question}");
    // The user says no, in the same conversation.
    let denied = converse(&rig, json!({"text": "/deny", "conversation_id": conv})).await;
    assert_eq!(speech(&denied), "Denied.");
    // The turn's answer comes after both requests were answered: it is
    // shown as a notification.
    let n = rig.kit.fake.wait_for_notifications(1, WAIT).await;
    assert_eq!(n[0].message, "All right, the front door stays locked.");
    rig.llm_requests(2).await;
    let tools = tool_results(&rig, 1);
    assert!(
        tools[0].contains("did NOT allow calling lock.unlock"),
        "{tools:?}"
    );
    let calls: Vec<_> = rig
        .kit
        .fake
        .calls()
        .into_iter()
        .filter(|c| c.domain != "persistent_notification")
        .collect();
    assert!(calls.is_empty(), "a denied call ran: {calls:?}");
    assert_eq!(
        rig.kit.fake.state("lock.front_door").as_deref(),
        Some("locked")
    );
    rig.wait_for_delivered(1).await;
}
