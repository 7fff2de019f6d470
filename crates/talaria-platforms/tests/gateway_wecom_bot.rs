//! The gateway end to end with WeCom's intelligent robot, in one process:
//! the adapter contract suite through the fake long connection, and what
//! only the robot does (a connection taken over by another client, a
//! group that can only be answered through its own message).
#![cfg(feature = "wecom")]

use crate::contract;

use std::sync::Arc;

use contract::{AdapterKit, Rig, Skip};
use talaria_core::{Config, Env};
use talaria_gateway::{Adapter, Liveness};
use talaria_platforms::wecom::bot::{WecomBotAdapter, WecomBotSettings};
use talaria_store::{LedgerStore, ObligationState, SqliteStore};
use talaria_testkit::Reply;
use talaria_testkit::kit::wecom_bot::{GROUP, WecomBotKit, user};
use talaria_testkit::kit::{PlatformKit, Who};
use talaria_testkit::wait::wait_for;
use talaria_testkit::wecom_bot::UNKNOWN_REQ_ID;

type WecomRig = Rig<WecomBotKit>;

impl AdapterKit for WecomBotKit {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        let settings = WecomBotSettings::from_config(&config.section().unwrap(), env)
            .unwrap()
            .expect("the kit turns the robot on");
        Arc::new(WecomBotAdapter::new(settings).unwrap())
    }
}

adapter_contract!(WecomBotKit;
    run: dm_turn, group_mention, long_answer_split, redelivery, dropped_connection,
         rate_limit, unauthorized, media_in, media_out;
    skip: thread_reply => Skip::Threadless);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_taken_by_another_client_stops_and_shows_in_the_status() {
    let rig = WecomRig::started(&[], |_| {}).await;
    rig.kit.fake.supersede();
    wait_for("the takeover in the status", || async {
        match rig.status() {
            Some((Liveness::Backoff | Liveness::Standby, Some(error)))
                if error.contains("in use elsewhere") =>
            {
                Ok(())
            }
            other => Err(other),
        }
    })
    .await;
    // It does not fight for the robot: no second subscription.
    assert_eq!(rig.kit.fake.subscriptions().len(), 1);
    assert!(!rig.kit.fake.is_connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_answer_wecom_will_not_take_is_abandoned_never_sent_proactively() {
    let rig = WecomRig::started(&[], |_| {}).await;
    // WeCom refuses the answer's req_id (as it may once the message is
    // old): a group cannot be written to any other way, so the ledger
    // records the refusal at once.
    rig.kit.fake.fail_next_send(UNKNOWN_REQ_ID);
    rig.llm.push(Reply::text("group answer"));
    rig.kit
        .fake
        .push_text_group(user(Who::Friend), GROUP, "hello all", true);
    let store = SqliteStore::open(&rig.home.state_db()).unwrap();
    wait_for("the group's answer abandoned", || async {
        let open = store.open_obligations(0).await.unwrap();
        let counts = store.obligation_counts().await.unwrap();
        if open.is_empty() && counts.get(&ObligationState::Abandoned) == Some(&1) {
            Ok(())
        } else {
            Err((open, counts))
        }
    })
    .await;
    assert!(rig.kit.sent().is_empty(), "{:?}", rig.kit.sent());
    let attempts = rig.kit.fake.send_attempts();
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0].cmd, "aibot_respond_msg");
}
