//! The gateway end to end with BlueBubbles, in one process: the adapter
//! contract suite through the fake server and its webhook posts to the
//! shared listener, and what only BlueBubbles does: one registration
//! across restarts, messages the webhook missed read back from the
//! server, answers without the Private API.
#![cfg(feature = "bluebubbles")]

use crate::contract;

use std::sync::Arc;
use std::time::Duration;

use contract::{AdapterKit, Rig, WAIT};
use talaria_core::{Config, Env};
use talaria_gateway::Adapter;
use talaria_platforms::bluebubbles::{BlueBubblesAdapter, BlueBubblesSettings};
use talaria_platforms::registry::{Built, Setup};
use talaria_store::{CursorStore, SqliteStore};
use talaria_testkit::Reply;
use talaria_testkit::kit::bluebubbles::{ADA, BlueBubblesKit, PASSWORD, dm};
use talaria_testkit::kit::deliver::Delivery;
use talaria_testkit::kit::{PlatformKit, Who};

impl AdapterKit for BlueBubblesKit {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let store = SqliteStore::open(&dir.keep().join("state.db")).expect("a state database");
        Arc::new(bluebubbles_adapter(config, env, Arc::new(store)))
    }

    fn build(&self, setup: &Setup<'_>) -> Built {
        let adapter = bluebubbles_adapter(setup.config, setup.env, setup.cursors.clone());
        let mount = adapter.mount();
        Built {
            adapter: Arc::new(adapter),
            mount: Some(mount),
        }
    }
}

/// The adapter as the registry builds it, except that it catches up
/// every few tenths of a second instead of every half minute.
fn bluebubbles_adapter(
    config: &Config,
    env: &Env,
    cursors: Arc<dyn CursorStore>,
) -> BlueBubblesAdapter {
    let port = config
        .section::<talaria_platforms::webhook::WebhookConfig>()
        .unwrap()
        .port;
    let settings = BlueBubblesSettings::from_config(&config.section().unwrap(), env, port)
        .expect("the BlueBubbles settings resolve")
        .expect("BlueBubbles is on");
    let settings = BlueBubblesSettings {
        catch_up_every: Duration::from_millis(300),
        // Every turn shows typing, however close the turns.
        typing_every: Duration::ZERO,
        ..settings
    };
    BlueBubblesAdapter::new(settings, cursors).expect("the BlueBubbles adapter")
}

adapter_contract!(BlueBubblesKit;
    run: dm_turn, group_mention, long_answer_split, redelivery, unauthorized, media_in, media_out;
    skip: thread_reply => contract::Skip::Threadless,
          dropped_connection => contract::Skip::Connectionless,
          rate_limit => contract::Skip::UnlimitedSends);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_is_registered_once_with_the_password_and_kept_across_restarts() {
    let mut rig = Rig::<BlueBubblesKit>::started(&[], |_| {}).await;
    let urls = rig.kit.fake.webhook_urls();
    let want = format!(
        "http://127.0.0.1:{}/bluebubbles-webhook?password={PASSWORD}",
        rig.kit.port
    );
    assert_eq!(urls, std::slice::from_ref(&want));
    rig.restart().await;
    assert_eq!(rig.kit.fake.webhook_urls(), [want]);
    // And the restarted gateway answers through it.
    rig.llm.push(Reply::text("Still here."));
    rig.kit.push_dm(Who::Friend, "are you there?");
    let sent = rig.kit.fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].text, "Still here.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_webhook_never_posted_is_read_back_and_answered_once() {
    let rig = Rig::<BlueBubblesKit>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("Caught it."));
    // The server had the message but its post was lost (the gateway was
    // busy, the network hiccupped): nothing reaches the listener.
    let (guid, _) = rig
        .kit
        .fake
        .receive(&dm(Who::Friend), ADA, "did you get this?", &[]);
    let sent = rig.kit.fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].text, "Caught it.");
    assert_eq!(sent[0].selected.as_deref(), Some(guid.as_str()));
    rig.wait_for_delivered(1).await;
    // Catch-ups go on; the marker's turn comes after several of them.
    tokio::time::sleep(Duration::from_millis(700)).await;
    rig.barrier().await;
    assert_eq!(
        rig.llm.requests().len(),
        2,
        "the read-back message ran once"
    );
    let answers = rig
        .kit
        .fake
        .sent()
        .iter()
        .filter(|s| s.text == "Caught it.")
        .count();
    assert_eq!(answers, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_private_api_answers_go_plain_and_nothing_is_typed() {
    let mut rig = Rig::<BlueBubblesKit>::new(&[], |_| {}).await;
    rig.kit.fake.set_private_api(false);
    let seen = rig.kit.connections();
    rig.start();
    rig.kit.wait_connected(seen + 1).await;
    rig.llm.push(Reply::text("Plain **answer**."));
    rig.kit.push_dm(Who::Friend, "hello");
    let sent = rig.kit.fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].text, "Plain answer.");
    assert_eq!(sent[0].method, "apple-script");
    assert_eq!(sent[0].selected, None);
    rig.wait_for_delivered(1).await;
    assert!(rig.kit.fake.typing().is_empty());
    assert!(rig.kit.fake.reads().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posts_without_the_password_get_401_and_run_nothing() {
    let rig = Rig::<BlueBubblesKit>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("Read back."));
    let (_, payload) = rig.kit.fake.receive(&dm(Who::Friend), ADA, "forged", &[]);
    let base = format!("http://127.0.0.1:{}/bluebubbles-webhook", rig.kit.port);
    for url in [base.clone(), format!("{base}?password=wrong")] {
        rig.kit.sender.push(Delivery {
            url,
            headers: Vec::new(),
            content_type: "application/json".into(),
            body: payload.to_string().into_bytes(),
        });
    }
    let taken = rig.kit.sender.wait_taken(2).await;
    assert_eq!(
        taken.iter().map(|t| t.status).collect::<Vec<_>>(),
        [401, 401]
    );
    // The message is on the server, though: the catch-up reads it back,
    // which is what a real post would have led to as well.
    let sent = rig.kit.fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].text, "Read back.");
    assert_eq!(sent[0].chat, dm(Who::Friend));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_turn_marks_its_chat_read_and_shows_typing() {
    let rig = Rig::<BlueBubblesKit>::started(&[], |_| {}).await;
    for (i, text) in ["first", "second"].into_iter().enumerate() {
        rig.llm.push(Reply::text(format!("answer {i}")));
        rig.kit.push_dm(Who::Friend, text);
        rig.kit.fake.wait_for_sent(i + 1, WAIT).await;
        rig.wait_for_delivered(i as u64 + 1).await;
    }
    let chat = dm(Who::Friend);
    // At least once per turn (a long turn refreshes both).
    assert!(rig.kit.fake.reads().iter().filter(|c| **c == chat).count() >= 2);
    assert!(rig.kit.fake.typing().iter().filter(|c| **c == chat).count() >= 2);
}
