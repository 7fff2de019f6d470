//! Steering: text the user sends while a turn runs reaches the model after
//! the next tool batch, as a user row after the tool results.

use crate::turn_common;

use talaria_agent::TurnExit;
use talaria_core::Role;
use talaria_testkit::{Reply, ToolCallReply};
use tokio_util::sync::CancellationToken;
use turn_common::*;

#[tokio::test]
async fn steer_text_is_delivered_after_the_next_tool_batch() {
    let (echo, _) = Echo::new();
    let r = rig(|_| {}, vec![echo]).await;
    r.mock.push(Reply::tool_calls(vec![ToolCallReply::new(
        "c1",
        "echo",
        r#"{"text":"one"}"#,
    )]));
    r.mock.push(Reply::text("Done, in French."));
    let s = r.agent.new_session("test").await.unwrap();
    // Queued before the turn starts: it must wait for the tool batch, not
    // jump ahead of the user's own message.
    s.state.push_steer("answer in French please");
    let out = r
        .agent
        .run_turn(
            &s,
            "do the thing",
            &Recorder::default(),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(out.exit, TurnExit::Completed);

    let first = r.sent_messages(0);
    assert!(
        !first
            .iter()
            .any(|m| m["content"].as_str().is_some_and(|c| c.contains("French"))),
        "steer text must not reach the first request"
    );
    let second = r.sent_messages(1);
    let n = second.len();
    assert_eq!(second[n - 2]["role"], "tool");
    assert_eq!(second[n - 1]["role"], "user");
    assert!(
        second[n - 1]["content"]
            .as_str()
            .unwrap()
            .contains("answer in French please")
    );
    let stored = r.stored(&s.id).await;
    assert_eq!(stored[3].role, Role::User);
    assert!(s.state.take_steer().is_empty(), "the steer was consumed");
}

#[tokio::test]
async fn steer_left_over_when_the_turn_ends_stays_for_the_caller() {
    let (echo, _) = Echo::new();
    let r = rig(|_| {}, vec![echo]).await;
    r.mock.push(Reply::text("Plain answer."));
    let s = r.agent.new_session("test").await.unwrap();
    s.state.push_steer("too late");
    r.agent
        .run_turn(&s, "hi", &Recorder::default(), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(s.state.take_steer(), vec!["too late".to_owned()]);
}
