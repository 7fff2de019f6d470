//! WeCom end to end, in one process: the real adapters, runner, router and
//! delivery ledger on a real SQLite file, the mock LLM over HTTP, and the
//! fake WeCom. The self-built app's callbacks are posted as WeCom posts
//! them (encrypted, signed) to the shared listener. The contract scenarios
//! run through each platform's kit; what only WeCom has is tested below
//! on the same rig.
#![cfg(feature = "wecom")]

use crate::contract;

use std::sync::Arc;

use contract::{AdapterKit, Rig};
use talaria_core::{Config, Env};
use talaria_gateway::Adapter;
use talaria_platforms::registry::{Built, Setup};
use talaria_platforms::wecom::callback::{WecomCallbackAdapter, WecomCallbackSettings};
use talaria_store::{LedgerStore, ObligationState, SqliteStore};
use talaria_testkit::Reply;
use talaria_testkit::kit::wecom_callback::{AGENT_ID, CORP_ID, WecomCallbackKit, user};
use talaria_testkit::kit::{PlatformKit, Who};
use talaria_testkit::wait::wait_for;
use talaria_testkit::wecom::{Failure, text_xml};

/// The app as `talaria gateway run` builds it: the one place these tests
/// construct it.
fn callback_adapter(config: &Config, env: &Env) -> WecomCallbackAdapter {
    let settings = WecomCallbackSettings::from_config(&config.section().unwrap(), env)
        .unwrap()
        .expect("the kit turns the app on");
    WecomCallbackAdapter::new(settings).unwrap()
}

impl AdapterKit for WecomCallbackKit {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        Arc::new(callback_adapter(config, env))
    }

    fn build(&self, setup: &Setup<'_>) -> Built {
        let app = callback_adapter(setup.config, setup.env);
        Built {
            mount: Some(app.mount()),
            adapter: Arc::new(app),
        }
    }
}

mod callback {
    use super::*;

    adapter_contract!(WecomCallbackKit;
        run: dm_turn, long_answer_split, redelivery, rate_limit, unauthorized, media_in,
             media_out;
        skip: thread_reply => contract::Skip::Threadless,
              group_mention => contract::Skip::NoGroups,
              dropped_connection => contract::Skip::Connectionless);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_callback_is_answered_success_and_a_repeat_gets_no_second_turn() {
    let rig = Rig::<WecomCallbackKit>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("你好！Hello from Talaria."));
    let id = rig.kit.push_dm(Who::Friend, "你好");
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].chat, format!("{CORP_ID}:{}", user(Who::Friend)));
    assert_eq!(sent[0].text, "你好！Hello from Talaria.");
    rig.wait_for_delivered(1).await;
    rig.kit.redeliver(&id, "你好");
    let taken = rig.kit.sender.wait_taken(2).await;
    assert!(
        taken.iter().all(|t| t.status == 200 && t.body == "success"),
        "{taken:?}"
    );
    rig.barrier().await;
    assert_eq!(rig.llm.requests().len(), 2, "the repeat started a turn");
    assert_eq!(rig.user_messages(0), vec!["你好"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_mid_run_is_refreshed_and_the_answer_arrives_once() {
    let rig = Rig::<WecomCallbackKit>::started(&[], |_| {}).await;
    rig.kit.fake.expire_tokens();
    rig.llm.push(Reply::text("still here"));
    rig.kit.push_dm(Who::Friend, "ping");
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].text, "still here");
    rig.wait_for_delivered(1).await;
    assert_eq!(
        rig.kit.fake.send_attempts().len(),
        2,
        "refused once, retried once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_server_ip_keeps_the_answer_owed_with_the_reason() {
    let rig = Rig::<WecomCallbackKit>::started(&[], |_| {}).await;
    rig.kit.fake.fail_next_send(Failure::Code(60020));
    rig.llm.push(Reply::text("eventually"));
    rig.kit.post_message(
        &text_xml(CORP_ID, AGENT_ID, user(Who::Friend), "hello", "880001"),
        "ip",
    );
    rig.kit.wait_send_attempts(1).await;
    // Failed, not abandoned: the ledger tries again later, once the
    // operator added the server's IP to the app's trusted list.
    let store = SqliteStore::open(&rig.home.state_db()).unwrap();
    wait_for("the refused answer to be recorded as failed", || async {
        let counts = store.obligation_counts().await.unwrap();
        if counts.get(&ObligationState::Failed) == Some(&1) {
            Ok(())
        } else {
            Err(counts)
        }
    })
    .await;
    assert!(rig.kit.fake.sent().is_empty());
    let status = rig.status();
    assert!(status.is_some(), "the app is on the status board");
}
