//! `talaria gateway run` with Discord (the fake) and its SQLite store,
//! killed (SIGKILL) and started again: the new process resumes the
//! gateway session the dead one kept in the store (op 6 with its session
//! id and sequence number) instead of identifying afresh, gets what was
//! sent while nobody was connected, and answers nothing twice.

use crate::crash_support;

use std::time::Duration;

use talaria_store::{CursorStore, SqliteStore};
use talaria_testkit::kit::discord::DiscordKit;
use talaria_testkit::kit::{PlatformKit, Who};
use talaria_testkit::wait::wait_for;
use talaria_testkit::{MockOpenAi, Reply};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_and_restarted_resumes_the_discord_session_from_the_store() {
    let llm = MockOpenAi::start().await;
    let kit = DiscordKit::start().await;
    let home = crash_support::kit_home(&llm, &kit);

    let mut first = crash_support::spawn_gateway(&home, &home.root.join("test-gateway.log"));
    kit.wait_connected(1).await;
    llm.push(Reply::text("First answer."));
    kit.push_dm(Who::Friend, "hello");
    kit.wait_sent(1).await;
    // The session is in the state database once the message is handled:
    // READY was dispatch 1, the message 2.
    let store = SqliteStore::open(&home.root.join("state.db")).unwrap();
    let name = format!("session:{}", kit.fake.bot_id());
    wait_for("the session in the store", || async {
        let stored = store.cursor("discord", &name).await.unwrap();
        let value: Option<serde_json::Value> =
            stored.as_deref().and_then(|v| serde_json::from_str(v).ok());
        match value {
            Some(v) if v["session_id"] == "fake-session-1" && v["seq"] == 2 => Ok(()),
            other => Err(other),
        }
    })
    .await;
    drop(store);
    first.kill().unwrap();
    first.wait().unwrap();

    // Written while nobody is connected: the session keeps it.
    llm.push(Reply::text("Second answer."));
    kit.push_dm(Who::Friend, "are you back?");
    let mut second = crash_support::spawn_gateway(&home, &home.root.join("test-gateway-2.log"));
    kit.wait_connected(2).await;
    let resumes = kit.fake.frames_with_op(6);
    assert_eq!(resumes.len(), 1, "{}", crash_support::logs(&home));
    assert_eq!(resumes[0].d["session_id"], "fake-session-1");
    assert_eq!(resumes[0].d["seq"], 2);
    assert_eq!(
        kit.fake.frames_with_op(2).len(),
        1,
        "the restarted gateway identified afresh:\n{}",
        crash_support::logs(&home)
    );
    assert_eq!(kit.fake.ready_and_resumed(), (1, 1));

    let sent = kit.wait_sent(2).await;
    assert_eq!(sent[1].text, "Second answer.");
    // Nothing answered twice, and the model asked once per message.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(kit.sent().len(), 2);
    assert_eq!(llm.requests().len(), 2);
    assert!(
        !crash_support::logs(&home).contains(kit.secret()),
        "the token was logged"
    );
    second.kill().unwrap();
    second.wait().unwrap();
}
