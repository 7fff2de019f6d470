//! Home Assistant end to end, in one process: conversation requests to the
//! real adapter on 127.0.0.1, the real runner, router and delivery ledger
//! on a real SQLite file, the mock LLM over HTTP, and the `ha_*` tools
//! against the fake Home Assistant REST API.
#![cfg(feature = "homeassistant")]

mod gateway_support;
#[path = "gateway_support/homeassistant.rs"]
mod ha_support;

use std::time::Duration;

use gateway_support::WAIT;
use ha_support::*;
use serde_json::json;
use talaria_testkit::{Reply, ToolCallReply};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_answered_in_the_response_and_recorded_delivered() {
    let rig = HaRig::started(|_| {}).await;
    rig.llm.push(Reply::text("The kitchen light is on."));
    let answer = rig
        .converse(
            Some(CONV_SECRET),
            json!({"text": "Is the kitchen light on?", "conversation_id": "01HCONVA", "language": "en"}),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.speech(), "The kitchen light is on.");
    assert_eq!(answer.body["conversation_id"], "01HCONVA");
    assert_eq!(answer.body["response"]["response_type"], "action_done");
    let users: Vec<String> = rig
        .messages(0)
        .into_iter()
        .filter(|(r, _)| r == "user")
        .map(|(_, c)| c)
        .collect();
    assert_eq!(
        users.last().map(String::as_str),
        Some("Is the kitchen light on?")
    );
    rig.wait_for_ledger_delivered(1).await;
    assert!(rig.ha.notifications().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_conversation_id_continues_the_session() {
    let rig = HaRig::started(|_| {}).await;
    rig.llm.push(Reply::text("Hello Ada."));
    rig.llm.push(Reply::text("Your name is Ada."));
    let conv = json!("01HCONVB");
    let first = rig
        .converse(
            Some(CONV_SECRET),
            json!({"text": "My name is Ada.", "conversation_id": conv}),
        )
        .await;
    assert_eq!(first.speech(), "Hello Ada.");
    rig.wait_for_ledger_delivered(1).await;
    let second = rig
        .converse(
            Some(CONV_SECRET),
            json!({"text": "What is my name?", "conversation_id": conv}),
        )
        .await;
    assert_eq!(second.speech(), "Your name is Ada.");
    let seen = rig.messages(1);
    let pos = |role: &str, text: &str| {
        seen.iter()
            .position(|(r, c)| r == role && c == text)
            .unwrap_or_else(|| panic!("no {role} {text:?} in {seen:?}"))
    };
    assert!(pos("user", "My name is Ada.") < pos("assistant", "Hello Ada."));
    assert!(pos("assistant", "Hello Ada.") < pos("user", "What is my name?"));
    rig.wait_for_ledger_delivered(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_request_runs_one_turn_and_gets_the_same_answer() {
    let rig = HaRig::started(|_| {}).await;
    rig.llm.push(Reply::text("first answer"));
    rig.llm.push(Reply::text("answer to the next question"));
    let body = json!({"text": "Turn it up", "conversation_id": "01HCONVC", "id": "ha-req-7"});
    let first = rig.converse(Some(CONV_SECRET), body.clone()).await;
    assert_eq!(first.speech(), "first answer");
    rig.wait_for_ledger_delivered(1).await;
    let retry = rig.converse(Some(CONV_SECRET), body).await;
    assert_eq!(retry.status, 200);
    assert_eq!(retry.speech(), "first answer");
    // A new request after the retry: a turn started by the retry would
    // have come before it.
    let next = rig
        .converse(
            Some(CONV_SECRET),
            json!({"text": "Next question", "conversation_id": "01HCONVC", "id": "ha-req-8"}),
        )
        .await;
    assert_eq!(next.speech(), "answer to the next question");
    rig.wait_for_ledger_delivered(2).await;
    assert_eq!(rig.llm.requests().len(), 2, "the retry reached the model");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_or_missing_bearer_is_refused_and_the_model_is_never_called() {
    let rig = HaRig::started(|_| {}).await;
    rig.llm.push(Reply::text("only for the real caller"));
    for bearer in [None, Some("guess"), Some(HASS_TOKEN)] {
        let answer = rig
            .converse(bearer, json!({"text": "Unlock the front door"}))
            .await;
        assert_eq!(answer.status, 401, "{bearer:?}");
    }
    let ok = rig
        .converse(Some(CONV_SECRET), json!({"text": "hello"}))
        .await;
    assert_eq!(ok.speech(), "only for the real caller");
    rig.wait_for_ledger_delivered(1).await;
    assert_eq!(
        rig.llm.requests().len(),
        1,
        "refused requests reached the model"
    );
    let users: Vec<String> = rig
        .messages(0)
        .into_iter()
        .filter(|(r, _)| r == "user")
        .map(|(_, c)| c)
        .collect();
    assert_eq!(users, vec!["hello".to_owned()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_answer_is_returned_whole() {
    let rig = HaRig::started(|_| {}).await;
    let mut long = String::new();
    for i in 0..300 {
        long.push_str(&format!("Step {i}: check the sensor and write it down.\n"));
    }
    long.push_str("```yaml\nautomation:\n  - alias: test\n```\nThe end.");
    assert!(long.chars().count() > 2 * 4096);
    rig.llm.push(Reply::text(long.clone()));
    let answer = rig
        .converse(Some(CONV_SECRET), json!({"text": "Write a long guide"}))
        .await;
    assert_eq!(answer.speech(), long);
    rig.wait_for_ledger_delivered(1).await;
    assert!(rig.ha.notifications().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_with_no_waiting_request_becomes_a_persistent_notification() {
    let rig = HaRig::started(|c| c.platforms.set("homeassistant.reply_timeout_secs", 1)).await;
    // The model answers after the request stopped waiting.
    rig.llm
        .push(Reply::text("The garage door was closed at 8pm.").with_delay(Duration::from_secs(3)));
    let answer = rig
        .converse(
            Some(CONV_SECRET),
            json!({"text": "When was the garage closed?", "id": "slow-1"}),
        )
        .await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body["status"], "pending");
    let n = rig.ha.wait_for_notifications(1, WAIT_LONG).await;
    assert_eq!(n[0].message, "The garage door was closed at 8pm.");
    assert_eq!(n[0].title.as_deref(), Some("Talaria"));
    rig.wait_for_ledger_delivered(1).await;
}

const WAIT_LONG: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_reads_states_and_calls_an_allowed_service() {
    let rig = HaRig::started(|c| {
        c.platforms
            .set("homeassistant.allowed_services", vec!["light.*"]);
    })
    .await;
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
    let answer = rig
        .converse(
            Some(CONV_SECRET),
            json!({"text": "Turn on the living room light"}),
        )
        .await;
    assert_eq!(answer.speech(), "The living room light is on now.");
    // The model saw the state, then the call's result.
    let tools: Vec<String> = rig
        .messages(2)
        .into_iter()
        .filter(|(r, _)| r == "tool")
        .map(|(_, c)| c)
        .collect();
    assert_eq!(tools.len(), 2, "{tools:?}");
    assert!(tools[0].contains(r#""state":"off""#), "{}", tools[0]);
    assert!(tools[1].contains("light.living_room | on"), "{}", tools[1]);
    let calls = rig.ha.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (calls[0].domain.as_str(), calls[0].service.as_str()),
        ("light", "turn_on")
    );
    assert_eq!(rig.ha.state("light.living_room").as_deref(), Some("on"));
    rig.wait_for_ledger_delivered(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_not_allowed_asks_in_the_conversation_and_a_denial_calls_nothing() {
    let rig = HaRig::started(|c| {
        c.platforms
            .set("homeassistant.allowed_services", vec!["light.*"]);
    })
    .await;
    rig.llm.push(Reply::tool_calls(vec![ToolCallReply::new(
        "call_1",
        "ha_call_service",
        r#"{"domain": "lock", "service": "unlock", "entity_id": "lock.front_door"}"#,
    )]));
    rig.llm
        .push(Reply::text("All right, the front door stays locked."));
    let conv = "01HCONVD";
    // The turn stops at the approval: the question is this request's answer.
    let asked = rig
        .converse(
            Some(CONV_SECRET),
            json!({"text": "Unlock the front door", "conversation_id": conv}),
        )
        .await;
    assert!(
        asked.speech().contains("needs your approval"),
        "{}",
        asked.speech()
    );
    assert!(asked.speech().contains("lock.unlock"), "{}", asked.speech());
    assert!(asked.speech().contains("/deny"), "{}", asked.speech());
    // The user says no, in the same conversation.
    let denied = rig
        .converse(
            Some(CONV_SECRET),
            json!({"text": "/deny", "conversation_id": conv}),
        )
        .await;
    assert_eq!(denied.speech(), "Denied.");
    // The turn's answer comes after both requests were answered: it is
    // shown as a notification.
    let n = rig.ha.wait_for_notifications(1, WAIT).await;
    assert_eq!(n[0].message, "All right, the front door stays locked.");
    rig.llm_requests(2).await;
    let tools: Vec<String> = rig
        .messages(1)
        .into_iter()
        .filter(|(r, _)| r == "tool")
        .map(|(_, c)| c)
        .collect();
    assert!(
        tools[0].contains("did NOT allow calling lock.unlock"),
        "{tools:?}"
    );
    let calls: Vec<_> = rig
        .ha
        .calls()
        .into_iter()
        .filter(|c| c.domain != "persistent_notification")
        .collect();
    assert!(calls.is_empty(), "a denied call ran: {calls:?}");
    assert_eq!(rig.ha.state("lock.front_door").as_deref(), Some("locked"));
    rig.wait_for_ledger_delivered(1).await;
}
