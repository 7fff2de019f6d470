//! Interrupts: during a streaming model response and between tools. The
//! turn must return promptly and leave a transcript an API accepts.

use crate::turn_common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use talaria_agent::{NullObserver, TurnExit};
use talaria_core::{Message, Role};
use talaria_testkit::{Reply, ToolCallReply};
use tokio_util::sync::CancellationToken;
use turn_common::*;

#[tokio::test]
async fn an_interrupt_mid_stream_keeps_the_partial_text() {
    let r = rig(|_| {}, vec![]).await;
    let full = "The first part of the answer, then the second part, then more.";
    r.mock.push(Reply::text(full).stall_after(2));
    let s = r.agent.new_session("test").await.unwrap();
    let cancel = CancellationToken::new();
    let obs = Recorder::cancelling(cancel.clone());
    // The stream stalls for good after two chunks: only the interrupt the
    // observer raises can end this turn. A broken interrupt hangs it, and
    // the deadline (far beyond any prompt return) fails the test.
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        r.agent.run_turn(&s, "talk", &obs, cancel),
    )
    .await
    .expect("the interrupt did not end the turn")
    .unwrap();

    assert_eq!(out.exit, TurnExit::Interrupted);
    let streamed = obs.streamed_text();
    assert!(!streamed.is_empty());
    assert_eq!(out.answer, streamed.trim());
    assert!(
        full.starts_with(&out.answer) && out.answer.len() < full.len(),
        "{}",
        out.answer
    );
    let stored = r.stored(&s.id).await;
    assert_valid(&stored);
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[1].role, Role::Assistant);
    assert_eq!(stored[1].content, out.answer);

    // The next turn carries on from the partial answer.
    r.mock.push(Reply::text("Continuing."));
    let out = r
        .agent
        .run_turn(&s, "go on", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.exit, TurnExit::Completed);
    let sent = r.sent_messages(1);
    assert_eq!(sent[2]["role"], "assistant");
    assert_eq!(sent[2]["content"], stored[1].content.as_str());
}

#[tokio::test]
async fn an_interrupt_between_tools_skips_the_rest_of_the_batch() {
    let (echo, calls) = Echo::new();
    let r = rig(|_| {}, vec![Arc::new(Interrupter), echo]).await;
    r.mock.push(Reply::tool_calls(vec![
        ToolCallReply::new("c1", "interrupter", "{}"),
        ToolCallReply::new("c2", "echo", r#"{"text":"a"}"#),
        ToolCallReply::new("c3", "echo", r#"{"text":"b"}"#),
    ]));
    r.mock.push(Reply::text("must not be requested"));
    let s = r.agent.new_session("test").await.unwrap();
    let out = r
        .agent
        .run_turn(&s, "go", &NullObserver, CancellationToken::new())
        .await
        .unwrap();

    assert_eq!(out.exit, TurnExit::Interrupted);
    assert_eq!(out.answer, "Operation interrupted.");
    assert_eq!(
        r.mock.requests().len(),
        1,
        "no model call after the interrupt"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let stored = r.stored(&s.id).await;
    assert_valid(&stored);
    let roles: Vec<Role> = stored.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Tool,
            Role::Tool,
            Role::Assistant
        ]
    );
    assert_eq!(stored[2].content, "interrupter ran");
    for (row, id) in stored[3..5].iter().zip(["c2", "c3"]) {
        assert_eq!(row.tool_call_id.as_deref(), Some(id));
        assert_eq!(
            row.content,
            "[Tool execution skipped — echo was not started: the user interrupted]"
        );
    }
    assert_eq!(stored[5].content, "Operation interrupted.");
}

#[tokio::test]
async fn a_turn_cancelled_before_it_starts_calls_no_model() {
    let r = rig(|_| {}, vec![]).await;
    let s = r.agent.new_session("test").await.unwrap();
    let cancel = CancellationToken::new();
    cancel.cancel();
    let out = r
        .agent
        .run_turn(&s, "never mind", &NullObserver, cancel)
        .await
        .unwrap();
    assert_eq!(out.exit, TurnExit::Interrupted);
    assert_eq!(out.answer, "Operation interrupted.");
    assert!(r.mock.requests().is_empty());
    assert_eq!(r.stored(&s.id).await, vec![Message::user("never mind")]);
}
