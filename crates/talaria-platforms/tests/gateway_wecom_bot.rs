//! The gateway end to end with WeCom's intelligent robot, in one process:
//! the adapter contract suite through the fake long connection, and what
//! only the robot does (a connection taken over by another client, a
//! group that can only be answered through its own message).
#![cfg(feature = "wecom")]

#[macro_use]
mod contract;

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
async fn a_group_answer_with_no_message_to_answer_fails_into_the_ledger() {
    let rig = WecomRig::started(&[], |_| {}).await;
    // The group's answer is held until the connection it came on is gone.
    rig.kit.hang_send(true);
    rig.llm.push(Reply::text("group answer"));
    rig.kit
        .fake
        .push_text_group(user(Who::Friend), GROUP, "hello all", true);
    rig.kit.wait_send_attempts(1).await;
    rig.kit.fake.drop_connection();
    rig.kit.wait_connected(2).await;
    rig.kit.hang_send(false);
    // Re-sent on the new connection, there is no message of the group's to
    // answer, and no proactive send to a group: the ledger gives up, and
    // nothing was sent to the group.
    let store = SqliteStore::open(&rig.home.state_db()).unwrap();
    wait_for("the group's answer abandoned", || async {
        let open = store.open_obligations(0).await.unwrap();
        let counts = store.obligation_counts().await.unwrap();
        if open.is_empty()
            && counts
                .get(&ObligationState::Abandoned)
                .copied()
                .unwrap_or(0)
                == 1
        {
            Ok(())
        } else {
            Err((open, counts))
        }
    })
    .await;
    assert!(rig.kit.sent().is_empty(), "{:?}", rig.kit.sent());
    assert!(
        rig.kit
            .fake
            .send_attempts()
            .iter()
            .all(|r| r.cmd == "aibot_respond_msg"),
        "never a proactive send to a group: {:?}",
        rig.kit.fake.send_attempts()
    );
}
