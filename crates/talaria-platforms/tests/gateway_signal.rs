//! The gateway end to end with Signal, in one process: the adapter
//! contract suite through the fake signal-cli REST API, over its WebSocket
//! and by polling it, and what only Signal does.

use crate::contract;

use std::sync::Arc;

use contract::{AdapterKit, Rig, WAIT};
use talaria_core::{Config, Env};
use talaria_gateway::{Adapter, Liveness};
use talaria_platforms::signal::{SignalAdapter, SignalSettings};
use talaria_testkit::FakeSignal;
use talaria_testkit::Reply;
use talaria_testkit::kit::signal::{BOT, GROUP, SignalKit, SignalKitIn, alice, mallory};
use talaria_testkit::signal::NewMessage;
use talaria_testkit::wait::wait_for;

impl<const POLLED: bool> AdapterKit for SignalKitIn<POLLED> {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        let settings = SignalSettings::from_config(&config.section().unwrap(), env).unwrap();
        Arc::new(SignalAdapter::new(settings).unwrap())
    }
}

adapter_contract!(SignalKit;
    run: dm_turn, group_mention, long_answer_split, redelivery, dropped_connection, rate_limit,
         unauthorized, media_in, media_out;
    skip: thread_reply => contract::Skip::Threadless);

/// The same contract when the server is polled.
mod polled {
    use talaria_testkit::kit::signal::PolledSignalKit;

    adapter_contract!(PolledSignalKit;
    run: dm_turn, group_mention, long_answer_split, redelivery, rate_limit, unauthorized, media_in,
         media_out;
    skip: thread_reply => crate::contract::Skip::Threadless,
              dropped_connection => crate::contract::Skip::Connectionless);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dm_is_answered_from_the_account_in_plain_text_quoting_nothing() {
    let rig = Rig::<SignalKit>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("Hello from **Talaria**."));
    rig.kit.fake.push(NewMessage::dm(&alice(), "hi there"));
    let sent = rig.kit.fake.wait_for_sent(1, WAIT).await;
    // Answered to the sender's UUID, in plain text, quoting nothing.
    assert_eq!(sent[0].recipients, vec![alice().uuid]);
    assert_eq!(sent[0].number, BOT);
    assert_eq!(sent[0].message, "Hello from Talaria.");
    assert_eq!(sent[0].quote_timestamp, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_mention_is_answered_in_the_group_quoting_it() {
    let rig = Rig::<SignalKit>::started(&[], |_| {}).await;
    let signal = &rig.kit.fake;
    signal.push(NewMessage::dm(&alice(), "no mention, no answer").in_group(GROUP, "Team"));
    rig.llm.push(Reply::text("Group answer."));
    let asked = signal.push(
        NewMessage::dm(&alice(), "my name is Ada")
            .in_group(GROUP, "Team")
            .mentioning(BOT),
    );
    rig.wait_for_text("Group answer.").await;
    let sent = signal.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].recipients, vec![FakeSignal::group_recipient(GROUP)]);
    assert_eq!(sent[0].quote_timestamp, Some(asked));
    assert_eq!(sent[0].quote_author.as_deref(), Some(alice().uuid.as_str()));
    // Shared chats name the speaker to the model; the mention is gone.
    let asked_text = rig.user_messages(0);
    assert_eq!(asked_text.len(), 1);
    assert!(asked_text[0].starts_with("[Alice"), "{asked_text:?}");
    assert!(
        asked_text[0].ends_with("] my name is Ada"),
        "{asked_text:?}"
    );

    // Quoting the bot's answer addresses it without a mention, and the
    // group's conversation goes on.
    rig.wait_for_delivered(1).await;
    rig.llm.push(Reply::text("You are Ada."));
    signal.push(
        NewMessage::dm(&alice(), "who am I?")
            .in_group(GROUP, "Team")
            .quoting(sent[0].timestamp, BOT, "Group answer."),
    );
    rig.wait_for_text("You are Ada.").await;
    let history = rig.user_messages(1);
    assert_eq!(history.len(), 2, "{history:?}");
    assert!(history[1].contains("who am I?"), "{history:?}");
    rig.barrier().await;
    assert_eq!(rig.llm.requests().len(), 3, "two turns and the marker's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uuid_on_the_allowlist_admits_its_owner_too() {
    let listed = alice().uuid.to_uppercase();
    let rig = Rig::<SignalKit>::started(&[("SIGNAL_ALLOWED_USERS", &listed)], |_| {}).await;
    rig.llm.push(Reply::text("Hi Alice."));
    rig.kit.fake.push(NewMessage::dm(&alice(), "hello"));
    rig.wait_for_text("Hi Alice.").await;
    rig.kit.fake.push(NewMessage::dm(&mallory(), "me too"));
    rig.barrier().await;
    assert_eq!(rig.llm.requests().len(), 2, "Alice's turn and the marker's");
    assert_eq!(rig.kit.fake.sent().len(), 2, "{:?}", rig.kit.fake.sent());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_the_server_does_not_hold_is_refused_and_nothing_runs() {
    let mut rig = Rig::<SignalKit>::new(&[("SIGNAL_ACCOUNT", "+15550001234")], |_| {}).await;
    rig.start();
    let signal = &rig.kit.fake;
    signal.push(NewMessage::dm(&alice(), "anyone there?"));
    // The adapter asked who the server holds and gave up: the board shows
    // an error only once the adapter's run has returned, and after a
    // fatal one the next run is a long backoff away, so what the fake
    // saw until now is all this run did.
    let error = wait_for("the refused account on the status board", || async {
        match rig.status() {
            Some((Liveness::Backoff, Some(e))) => Ok(e),
            other => Err(other),
        }
    })
    .await;
    assert!(error.contains("+15550001234"), "{error}");
    assert!(
        signal.requests().iter().any(|r| r.path == "/v1/accounts"),
        "{:?}",
        signal.requests()
    );
    assert!(signal.connections().is_empty());
    assert!(
        !signal
            .requests()
            .iter()
            .any(|r| r.path.starts_with("/v1/receive"))
    );
    assert_eq!(signal.queued(), 1);
    assert!(rig.llm.requests().is_empty());
    assert!(signal.sent().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polling_server_is_polled_and_never_opened_as_a_websocket() {
    let rig = Rig::<talaria_testkit::kit::signal::PolledSignalKit>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("Polled answer."));
    rig.kit
        .fake
        .push(NewMessage::dm(&alice(), "are you polling?"));
    rig.wait_for_text("Polled answer.").await;
    assert!(rig.kit.fake.connections().is_empty());
    assert!(rig.kit.fake.polls() >= 1);
}
