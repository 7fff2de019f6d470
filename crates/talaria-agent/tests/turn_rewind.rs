//! `Agent::rewind`, behind `/undo` and `/retry`: cutting the active
//! transcript back to before a user message.

use crate::turn_common;

use talaria_agent::compress::summary_message;
use talaria_agent::{AgentError, NullObserver};
use talaria_core::{Message, Role};
use talaria_store::SessionStore;
use talaria_testkit::{Reply, ToolCallReply};
use tokio_util::sync::CancellationToken;
use turn_common::*;

#[tokio::test]
async fn rewind_cuts_before_the_nth_last_user_message_and_returns_it() {
    let (echo, _) = Echo::new();
    let r = rig(|_| {}, vec![echo]).await;
    let s = r.agent.new_session("test").await.unwrap();

    // The first turn uses a tool, so the cut must keep whole exchanges.
    r.mock.push(Reply::tool_calls(vec![ToolCallReply {
        id: "call_1".into(),
        name: "echo".into(),
        arguments: r#"{"text":"hi"}"#.into(),
    }]));
    r.mock.push(Reply::text("one"));
    r.agent
        .run_turn(&s, "first", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    r.mock.push(Reply::text("two"));
    r.agent
        .run_turn(&s, "second", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    let before = r.stored(&s.id).await;
    assert_eq!(before.len(), 6, "{before:#?}");

    // Too far back, or nothing at all, changes nothing.
    assert_eq!(r.agent.rewind(&s.id, 3).await.unwrap(), None);
    assert_eq!(r.agent.rewind(&s.id, 0).await.unwrap(), None);
    assert_eq!(r.stored(&s.id).await, before);

    assert_eq!(
        r.agent.rewind(&s.id, 1).await.unwrap().as_deref(),
        Some("second")
    );
    let after = r.stored(&s.id).await;
    assert_eq!(after, before[..4]);
    assert_eq!(after.last().map(|m| m.content.as_str()), Some("one"));
    assert_valid(&after);

    // The next turn is sent without the removed exchange.
    r.mock.push(Reply::text("three"));
    r.agent
        .run_turn(&s, "again", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    let sent = r.sent_messages(3);
    assert!(
        sent.iter()
            .all(|m| m["content"] != "second" && m["content"] != "two"),
        "{sent:#?}"
    );

    // Two back from [first…one, again, three] is the very first message.
    assert_eq!(
        r.agent.rewind(&s.id, 2).await.unwrap().as_deref(),
        Some("first")
    );
    assert!(r.stored(&s.id).await.is_empty());
    assert_eq!(r.agent.rewind(&s.id, 1).await.unwrap(), None);
}

#[tokio::test]
async fn rewind_never_counts_or_cuts_a_compression_summary() {
    let r = rig(|_| {}, vec![]).await;
    let s = r.agent.new_session("test").await.unwrap();
    let summary = summary_message("The user asked about tea.");
    assert_eq!(summary.role, Role::User);
    r.store
        .replace_active(
            &s.id,
            &[
                summary.clone(),
                Message::assistant("Noted."),
                Message::user("latest"),
                Message::assistant("answer"),
            ],
        )
        .await
        .unwrap();

    assert_eq!(r.agent.rewind(&s.id, 2).await.unwrap(), None);
    assert_eq!(
        r.agent.rewind(&s.id, 1).await.unwrap().as_deref(),
        Some("latest")
    );
    assert_eq!(
        r.stored(&s.id).await,
        vec![summary, Message::assistant("Noted.")]
    );
    assert_eq!(r.agent.rewind(&s.id, 1).await.unwrap(), None);
}

#[tokio::test]
async fn rewinding_an_unknown_session_is_an_error() {
    let r = rig(|_| {}, vec![]).await;
    let err = r
        .agent
        .rewind("20240101_000000_abcdef", 1)
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::Store(_)), "{err:?}");
}
