//! The outbox: a front end that owes the answer to someone stores it, and
//! the debt, in one step; a failing outbox stores no answer.

use crate::turn_common;

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use talaria_agent::{Outbox, TurnExit, TurnOptions};
use talaria_core::{Message, Role, Usage};
use talaria_store::{SessionStore, StoreError};
use talaria_testkit::Reply;
use tokio_util::sync::CancellationToken;
use turn_common::*;

/// Stores the row through the real store and remembers what was owed; or
/// refuses, as a store that lost its connection would.
struct Recording {
    store: Arc<dyn SessionStore>,
    owed: Mutex<Vec<(String, String, Usage)>>,
    fail: bool,
}

#[async_trait]
impl Outbox for Recording {
    async fn append_answer(
        &self,
        session_id: &str,
        message: &Message,
        usage: &Usage,
        answer: &str,
    ) -> Result<i64, StoreError> {
        if self.fail {
            return Err(StoreError::Busy);
        }
        let row = self
            .store
            .append_message_with_usage(session_id, message, usage)
            .await?;
        self.owed
            .lock()
            .unwrap()
            .push((session_id.to_owned(), answer.to_owned(), *usage));
        Ok(row)
    }
}

#[tokio::test]
async fn the_final_answer_goes_through_the_outbox_and_nothing_else_does() {
    let (echo, _) = Echo::new();
    let r = rig(|_| {}, vec![echo]).await;
    r.mock.push(Reply::text("  The answer, owed.  "));
    let s = r.agent.new_session("test").await.unwrap();
    let outbox = Arc::new(Recording {
        store: r.store.clone(),
        owed: Mutex::new(Vec::new()),
        fail: false,
    });
    let out = r
        .agent
        .run_turn_with(
            &s,
            "hi",
            &Recorder::default(),
            CancellationToken::new(),
            TurnOptions {
                outbox: Some(outbox.clone()),
                ..TurnOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(out.exit, TurnExit::Completed);
    assert!(out.owed);
    let owed = outbox.owed.lock().unwrap().clone();
    assert_eq!(owed.len(), 1, "only the answer is owed, not the user row");
    assert_eq!(owed[0].0, s.id);
    // What is owed is exactly what the front end will send.
    assert_eq!(owed[0].1, out.answer);
    assert_eq!(owed[0].2.output_tokens, 5, "the call's usage rides along");
    let stored = r.stored(&s.id).await;
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[1].role, Role::Assistant);

    // Without an outbox nothing is owed.
    r.mock.push(Reply::text("plain"));
    let out = r
        .agent
        .run_turn(&s, "again", &Recorder::default(), CancellationToken::new())
        .await
        .unwrap();
    assert!(!out.owed);
}

#[tokio::test]
async fn a_failing_outbox_fails_the_turn_and_stores_no_answer() {
    let (echo, _) = Echo::new();
    let r = rig(|_| {}, vec![echo]).await;
    r.mock.push(Reply::text("never stored"));
    let s = r.agent.new_session("test").await.unwrap();
    let outbox = Arc::new(Recording {
        store: r.store.clone(),
        owed: Mutex::new(Vec::new()),
        fail: true,
    });
    let result = r
        .agent
        .run_turn_with(
            &s,
            "hi",
            &Recorder::default(),
            CancellationToken::new(),
            TurnOptions {
                outbox: Some(outbox),
                ..TurnOptions::default()
            },
        )
        .await;
    assert!(result.is_err());
    let stored = r.stored(&s.id).await;
    assert_eq!(stored, vec![Message::user("hi")]);
}
