//! Many tasks writing and reading at once.

use crate::common;

use std::collections::HashSet;

use common::{new_session, temp_store};
use talaria_core::Message;
use talaria_store::{SearchQuery, SessionFilter, SessionStore, SqliteStore};

const SESSIONS: usize = 16;
const PER_SESSION: usize = 25;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_to_different_sessions_all_land() {
    let (_dir, store) = temp_store();
    let mut tasks = Vec::new();
    for s in 0..SESSIONS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("sess_{s:02}");
            store.create_session(new_session(&id, "api")).await.unwrap();
            let mut ids = Vec::new();
            for i in 0..PER_SESSION {
                let text = format!("session {s} message {i} kumquat");
                ids.push(
                    store
                        .append_message(&id, &Message::user(text))
                        .await
                        .unwrap(),
                );
                // Interleave reads so readers and the writer overlap.
                if i % 5 == 0 {
                    store.messages(&id).await.unwrap();
                }
            }
            ids
        }));
    }
    let mut all_ids = HashSet::new();
    for t in tasks {
        for id in t.await.unwrap() {
            assert!(all_ids.insert(id), "row id {id} handed out twice");
        }
    }
    assert_eq!(all_ids.len(), SESSIONS * PER_SESSION);

    for s in 0..SESSIONS {
        let id = format!("sess_{s:02}");
        let msgs = store.messages(&id).await.unwrap();
        assert_eq!(msgs.len(), PER_SESSION);
        for (i, m) in msgs.iter().enumerate() {
            assert_eq!(
                m.message.content,
                format!("session {s} message {i} kumquat")
            );
        }
        let rec = store.session(&id).await.unwrap().unwrap();
        assert_eq!(rec.message_count, PER_SESSION as u64);
    }
    let sessions = store.list_sessions(SessionFilter::default()).await.unwrap();
    assert_eq!(sessions.len(), SESSIONS);
    let hits = store
        .search(SearchQuery {
            text: "kumquat".into(),
            sources: vec!["api".into()],
            exclude_session: None,
            limit: 100,
        })
        .await
        .unwrap();
    assert_eq!(hits.len(), SESSIONS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stores_on_one_file_share_it() {
    // Two handles with separate connections stand in for two processes.
    let (dir, a) = temp_store();
    let b = SqliteStore::open(&dir.path().join("state.db")).unwrap();
    a.create_session(new_session("shared", "cli"))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for (n, store) in [a.clone(), b.clone()].into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            for i in 0..30 {
                store
                    .append_message("shared", &Message::user(format!("{n}-{i}")))
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(a.messages("shared").await.unwrap().len(), 60);
    assert_eq!(
        b.session("shared").await.unwrap().unwrap().message_count,
        60
    );
}
