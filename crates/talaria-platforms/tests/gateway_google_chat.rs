//! The gateway end to end with Google Chat, in one process: the adapter
//! contract suite through the fake Google (tokens, JWK set, messages) and
//! Chat's signed event posts to the shared listener, and what only Chat
//! does: tokens that are not Google's refused, client-assigned message ids
//! that keep a re-send from showing twice.
#![cfg(feature = "google_chat")]

use crate::contract;

use std::sync::Arc;

use contract::{AdapterKit, Rig, WAIT};
use talaria_core::{Config, Env};
use talaria_gateway::Adapter;
use talaria_platforms::google_chat::{GoogleChatAdapter, GoogleChatSettings};
use talaria_platforms::registry::{Built, Setup};
use talaria_testkit::Reply;
use talaria_testkit::google_chat::Failure;
use talaria_testkit::kit::google_chat::{GoogleChatKit, PROJECT, dm_space};
use talaria_testkit::kit::{PlatformKit, Who};

impl AdapterKit for GoogleChatKit {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        Arc::new(google_chat_adapter(config, env))
    }

    fn build(&self, setup: &Setup<'_>) -> Built {
        let adapter = google_chat_adapter(setup.config, setup.env);
        let mount = adapter.mount();
        Built {
            adapter: Arc::new(adapter),
            mount: Some(mount),
        }
    }
}

fn google_chat_adapter(config: &Config, env: &Env) -> GoogleChatAdapter {
    let settings = GoogleChatSettings::from_config(&config.section().unwrap(), env)
        .expect("the Google Chat settings resolve")
        .expect("Google Chat is on");
    GoogleChatAdapter::new(settings).expect("the Google Chat adapter")
}

adapter_contract!(GoogleChatKit;
    run: dm_turn, group_mention, thread_reply, long_answer_split, redelivery, rate_limit, unauthorized;
    skip: dropped_connection => contract::Skip::Connectionless,
          media_in => contract::Skip::ReceivesNoFiles,
          media_out => contract::Skip::SendsNoFiles);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_without_googles_token_for_this_app_get_401_and_run_nothing() {
    let rig = Rig::<GoogleChatKit>::started(&[], |_| {}).await;
    let (event, _) = rig.kit.message_event(
        Who::Friend,
        dm_space(Who::Friend),
        true,
        None,
        "run this",
        "run this",
    );
    let forged = rig.kit.fake.forged_token(PROJECT);
    let other_app = rig.kit.fake.event_token("999999999999");
    rig.kit.post_with(&event, Some(&forged));
    rig.kit.post_with(&event, Some(&other_app));
    rig.kit.post_with(&event, Some("not.a.jwt"));
    rig.kit.post_with(&event, None);
    let taken = rig.kit.sender.wait_taken(4).await;
    assert_eq!(
        taken.iter().map(|t| t.status).collect::<Vec<_>>(),
        [401, 401, 401, 401]
    );
    rig.llm.push(Reply::text("Only this one."));
    rig.kit.push_dm(Who::Friend, "hello");
    let sent = rig.kit.fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].text, "Only this one.");
    rig.wait_for_delivered(1).await;
    assert_eq!(rig.llm.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_answer_was_lost_is_refused_as_existing_not_shown_twice() {
    let rig = Rig::<GoogleChatKit>::started(&[], |_| {}).await;
    // Chat creates the message, but a 503 comes back (a proxy lost the
    // answer): the gateway retries with the same client-assigned id, and
    // Chat refuses it as existing.
    rig.kit.fake.fail_next_send(Failure::LostAnswer);
    rig.llm.push(Reply::text("Posted once."));
    rig.kit.push_dm(Who::Friend, "hello");
    rig.wait_for_delivered(1).await;
    rig.barrier().await;
    let sent = rig.kit.fake.sent();
    let answers: Vec<_> = sent.iter().filter(|s| s.text == "Posted once.").collect();
    assert_eq!(answers.len(), 1, "{sent:?}");
    assert!(answers[0].message_id.starts_with("client-"));
    // Two creates for it (the lost one and the refused retry), then the
    // marker's.
    assert!(rig.kit.fake.send_attempts().len() >= 3);
}
