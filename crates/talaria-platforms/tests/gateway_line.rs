//! The gateway end to end with LINE, in one process: the adapter contract
//! suite through the fake Messaging API and LINE's signed deliveries to
//! the shared webhook listener, and what only LINE does: free reply
//! tokens before paid pushes, retry keys that keep a re-sent push from
//! showing twice, the monthly quota.
#![cfg(feature = "line")]

use crate::contract;

use std::sync::Arc;
use std::time::Duration;

use contract::{AdapterKit, Rig, WAIT};
use talaria_core::{Config, Env};
use talaria_gateway::Adapter;
use talaria_platforms::line::{LineAdapter, LineSettings};
use talaria_platforms::registry::{Built, Setup};
use talaria_store::{LedgerStore, ObligationState, SqliteStore};
use talaria_testkit::Reply;
use talaria_testkit::kit::line::{ADA, LineKit, SECRET};
use talaria_testkit::kit::{PlatformKit, Who, long_answer};
use talaria_testkit::line::{Failure, Via, sign, webhook_body};
use talaria_testkit::wait::wait_for;

impl AdapterKit for LineKit {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        Arc::new(line_adapter(config, env))
    }

    fn build(&self, setup: &Setup<'_>) -> Built {
        let adapter = line_adapter(setup.config, setup.env);
        let mount = adapter.mount();
        Built {
            adapter: Arc::new(adapter),
            mount: Some(mount),
        }
    }
}

/// The adapter as the registry builds it, except that LINE's pauses are
/// not waited out in full.
fn line_adapter(config: &Config, env: &Env) -> LineAdapter {
    let settings = LineSettings::from_config(&config.section().unwrap(), env)
        .expect("the LINE settings resolve")
        .expect("LINE is on");
    let settings = LineSettings {
        rate_limit_wait: Duration::from_millis(10),
        ..settings
    };
    LineAdapter::new(settings).expect("the LINE adapter")
}

adapter_contract!(LineKit;
    run: dm_turn, group_mention, long_answer_split, redelivery, rate_limit, unauthorized, media_in;
    skip: thread_reply => contract::Skip::Threadless,
          dropped_connection => contract::Skip::Connectionless,
          media_out => contract::Skip::SendsNoFiles);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_part_replies_for_free_quoting_the_question_and_the_rest_is_pushed() {
    let rig = Rig::<LineKit>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text(long_answer(12_000)));
    let asked = rig.kit.dm(Who::Friend, "tell me everything");
    let first = rig.kit.fake.wait_for_sent(1, WAIT).await;
    let total = talaria_testkit::kit::part_count(&first[0].text).expect("numbered parts");
    let sent = rig.kit.fake.wait_for_sent(total, WAIT).await;
    assert_eq!(sent[0].via, Via::Reply);
    assert_eq!(sent[0].quoted.as_deref(), Some(asked.message_id.as_str()));
    assert!(sent[1..].iter().all(|s| s.via == Via::Push), "{sent:?}");
    // Every push carries a retry key of its own.
    let keys: std::collections::HashSet<_> = sent[1..]
        .iter()
        .map(|s| s.retry_key.clone().expect("a retry key"))
        .collect();
    assert_eq!(keys.len(), total - 1);
    // The loading animation ran in the one-to-one chat while it worked.
    assert_eq!(rig.kit.typed_in(ADA), Some(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_whose_reply_token_expired_is_pushed() {
    let rig = Rig::<LineKit>::started(&[], |_| {}).await;
    // The turn took longer than LINE keeps the token.
    rig.kit.fake.set_reply_token_validity(Duration::ZERO);
    rig.llm.push(Reply::text("Sorry for the wait."));
    rig.kit.dm(Who::Friend, "slow question");
    let sent = rig.kit.fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].text, "Sorry for the wait.");
    assert_eq!(sent[0].via, Via::Push);
    // The spent token was tried once, then the push.
    assert_eq!(rig.kit.fake.send_attempts().len(), 2);
    rig.wait_for_delivered(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_whose_answer_was_lost_is_checked_not_sent_again() {
    let rig = Rig::<LineKit>::started(&[], |_| {}).await;
    // LINE sends the reply, but its answer never reaches the gateway.
    rig.kit.fake.fail_next_send(Failure::LostAnswer);
    rig.llm.push(Reply::text("Exactly once."));
    rig.kit.dm(Who::Friend, "hello");
    rig.wait_for_delivered(1).await;
    rig.barrier().await;
    let sent = rig.kit.fake.sent();
    let answers: Vec<_> = sent.iter().filter(|s| s.text == "Exactly once.").collect();
    assert_eq!(answers.len(), 1, "{sent:?}");
    // The retry asked LINE with the same token, which it had used.
    let replies = rig
        .kit
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v2/bot/message/reply")
        .count();
    assert!(replies >= 2, "{replies} replies");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_whose_answer_was_lost_is_refused_by_its_retry_key_not_shown_twice() {
    let rig = Rig::<LineKit>::started(&[], |_| {}).await;
    rig.kit.fake.set_reply_token_validity(Duration::ZERO);
    // The refused reply token, then the push that is sent but whose
    // answer is lost.
    rig.kit.fake.fail_next_send(Failure::Status {
        status: 400,
        message: "Invalid reply token".into(),
    });
    rig.kit.fake.fail_next_send(Failure::LostAnswer);
    rig.llm.push(Reply::text("Pushed once."));
    rig.kit.dm(Who::Friend, "hello");
    rig.wait_for_delivered(1).await;
    rig.barrier().await;
    let sent = rig.kit.fake.sent();
    let answers: Vec<_> = sent.iter().filter(|s| s.text == "Pushed once.").collect();
    assert_eq!(answers.len(), 1, "{sent:?}");
    // The re-send was a push under the same key, which LINE refused.
    let pushes: Vec<_> = rig
        .kit
        .fake
        .requests()
        .into_iter()
        .filter(|r| {
            r.path == "/v2/bot/message/push" && r.body["messages"][0]["text"] == "Pushed once."
        })
        .collect();
    assert!(pushes.len() >= 2, "{pushes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_monthly_quota_keeps_the_answer_owed_and_says_why() {
    let rig = Rig::<LineKit>::started(&[], |_| {}).await;
    rig.kit.fake.set_reply_token_validity(Duration::ZERO);
    rig.kit.fake.set_push_quota(Some(0));
    rig.llm.push(Reply::text("When the month turns."));
    rig.kit.dm(Who::Friend, "hello");
    let store = SqliteStore::open(&rig.home.state_db()).expect("the state database");
    wait_for("a failed, still open ledger row", || async {
        let open = store.open_obligations(0).await.expect("open obligations");
        match open.iter().find(|o| o.state == ObligationState::Failed) {
            Some(row) => Ok(row.clone()),
            None => Err(open),
        }
    })
    .await;
    let open = store.open_obligations(0).await.expect("open obligations");
    let row = open
        .iter()
        .find(|o| o.chat_id == ADA)
        .expect("the answer's row");
    let reason = row.last_error.as_deref().unwrap_or("");
    assert!(reason.contains("monthly message quota"), "{reason}");
    assert!(rig.kit.fake.sent().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_deliveries_get_401_and_the_consoles_verify_gets_200() {
    let rig = Rig::<LineKit>::started(&[], |_| {}).await;
    let event = rig.kit.fake.text_event(
        &talaria_testkit::line::Source::User(ADA.into()),
        "run this",
        &[],
    );
    let body = webhook_body(
        rig.kit.fake.bot_user_id(),
        std::slice::from_ref(&event.json),
    );
    rig.kit
        .post(body.clone(), Some(&sign("another-secret", &body)));
    rig.kit.post(body.clone(), None);
    // The console's "Verify" button: a signed body without events.
    let empty = webhook_body(rig.kit.fake.bot_user_id(), &[]);
    rig.kit.post(empty.clone(), Some(&sign(SECRET, &empty)));
    let taken = rig.kit.sender.wait_taken(3).await;
    let statuses: Vec<u16> = taken.iter().map(|t| t.status).collect();
    assert_eq!(statuses, [401, 401, 200]);
    // Nothing ran: the next real message is the first turn.
    rig.llm.push(Reply::text("Only this one."));
    rig.kit.dm(Who::Friend, "hello");
    let sent = rig.kit.fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].text, "Only this one.");
    rig.wait_for_delivered(1).await;
    assert_eq!(rig.llm.requests().len(), 1);
    let open = store_of(&rig)
        .open_obligations(0)
        .await
        .expect("open obligations");
    assert!(
        open.is_empty(),
        "a forged message is owed an answer: {open:?}"
    );
}

fn store_of(rig: &Rig<LineKit>) -> SqliteStore {
    SqliteStore::open(&rig.home.state_db()).expect("the state database")
}
