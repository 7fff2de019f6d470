//! SMS end to end, in one process: webhooks posted as Twilio posts them
//! (form bodies signed over the public URL) to the real SMS adapter on
//! the shared listener, the real runner, router and delivery ledger on a
//! real SQLite file, the mock LLM over HTTP, and the answers arriving at
//! the fake Twilio REST API. The contract scenarios run through
//! [`SmsKit`]; what only SMS has is tested below on the same rig.
#![cfg(feature = "sms")]

use crate::contract;

use std::sync::Arc;

use contract::{AdapterKit, Rig};
use talaria_core::{Config, Env};
use talaria_gateway::Adapter;
use talaria_platforms::registry::{Built, Setup};
use talaria_platforms::sms::{SmsAdapter, SmsSettings};
use talaria_store::{LedgerStore, ObligationState, SqliteStore};
use talaria_testkit::Reply;
use talaria_testkit::kit::deliver::Taken;
use talaria_testkit::kit::sms::{AUTH_TOKEN, NUMBER, PUBLIC_URL, SmsKit, number};
use talaria_testkit::kit::{PlatformKit, Who};
use talaria_testkit::twilio::sign;
use talaria_testkit::wait::{WAIT, wait_for};

/// The SMS adapter as `talaria gateway run` builds it from `platforms.sms`
/// and the environment: the one place these tests construct it.
fn sms_adapter(config: &Config, env: &Env) -> SmsAdapter {
    let settings = SmsSettings::from_config(&config.section().unwrap(), env)
        .unwrap()
        .expect("the kit turns SMS on");
    SmsAdapter::new(settings).unwrap()
}

impl AdapterKit for SmsKit {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        Arc::new(sms_adapter(config, env))
    }

    fn build(&self, setup: &Setup<'_>) -> Built {
        let sms = sms_adapter(setup.config, setup.env);
        Built {
            mount: Some(sms.mount()),
            adapter: Arc::new(sms),
        }
    }
}

adapter_contract!(SmsKit;
    run: dm_turn, long_answer_split, redelivery, rate_limit, unauthorized, media_in;
    skip: thread_reply => contract::Skip::Threadless,
          group_mention => contract::Skip::NoGroups,
          dropped_connection => contract::Skip::Connectionless,
          media_out => contract::Skip::SendsNoFiles);

/// Twilio's webhook is answered with empty TwiML: the answer goes out
/// through the REST API, never in the webhook's reply.
fn assert_twiml(reply: &Taken) {
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.content_type.as_deref(), Some("text/xml"));
    assert!(reply.body.contains("<Response/>"), "{reply:?}");
}

/// The ledger's rows by state.
async fn ledger_counts(rig: &Rig<SmsKit>) -> std::collections::BTreeMap<ObligationState, u64> {
    let store = SqliteStore::open(&rig.home.state_db()).unwrap();
    store
        .obligation_counts()
        .await
        .unwrap()
        .into_iter()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_plain_text_from_the_gateways_number_and_every_webhook_gets_empty_twiml() {
    let rig = Rig::<SmsKit>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("Hello from **Talaria**."));
    let id = rig.kit.push_dm(Who::Friend, "hi there");
    let sent = rig.kit.fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].to, number(Who::Friend));
    assert_eq!(sent[0].from, NUMBER);
    assert_eq!(sent[0].body, "Hello from Talaria.", "sent as plain text");
    let attempts = rig.kit.fake.send_attempts();
    assert_eq!(attempts.len(), 1);
    assert!(attempts[0].authorized);
    rig.wait_for_delivered(1).await;

    // The repeat is acknowledged too, so Twilio stops sending it.
    rig.kit.redeliver(&id, "hi there");
    let taken = rig.kit.sender.wait_taken(2).await;
    taken.iter().for_each(assert_twiml);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_or_missing_signature_gets_401_and_nothing_runs() {
    let rig = Rig::<SmsKit>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("answer to the genuine message"));
    let inbound = rig.kit.fake.inbound(number(Who::Friend), "forged?");
    let params = inbound.params();

    rig.kit.post_params(&params, None);
    let forged = sign("not-the-auth-token", PUBLIC_URL, &params);
    rig.kit.post_params(&params, Some(&forged));
    // Signed correctly, then the text changed on the way.
    let good = sign(AUTH_TOKEN, PUBLIC_URL, &params);
    let tampered: Vec<(String, String)> = params
        .iter()
        .map(|(k, v)| match k.as_str() {
            "Body" => (k.clone(), "send me the secrets".to_owned()),
            _ => (k.clone(), v.clone()),
        })
        .collect();
    rig.kit.post_params(&tampered, Some(&good));
    let taken = rig.kit.sender.wait_taken(3).await;
    let statuses: Vec<u16> = taken.iter().map(|t| t.status).collect();
    assert_eq!(statuses, vec![401, 401, 401]);

    // The genuine message (same MessageSid: the refused ones were not
    // remembered) is answered. Posted after the refused ones were
    // answered, it is the barrier: had one of them been taken, its turn
    // would be owed or would have asked the model by now.
    rig.kit.post_params(&params, Some(&good));
    assert_twiml(&rig.kit.sender.wait_taken(4).await[3]);
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].text, "answer to the genuine message");
    rig.assert_nothing_owed().await;
    assert_eq!(
        rig.llm.requests().len(),
        1,
        "a refused webhook reached the model"
    );
    assert_eq!(rig.kit.fake.send_attempts().len(), 1);
    rig.wait_for_delivered(1).await;
    assert_eq!(rig.user_messages(0), vec!["forged?"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recipient_who_replied_stop_is_not_sent_to_again() {
    let rig = Rig::<SmsKit>::started(&[], |_| {}).await;
    rig.kit.fake.unsubscribe(number(Who::Friend));
    rig.llm.push(Reply::text("You will not get this."));
    rig.kit.push_dm(Who::Friend, "question");
    rig.kit.wait_send_attempts(1).await;
    // Refused for good: abandoned at once. That is the ledger's last word
    // on the answer (no sweep takes an abandoned row again), and a retry
    // by the adapter would have come before it.
    wait_for("the ledger to abandon the refused answer", || async {
        let counts = ledger_counts(&rig).await;
        let abandoned = counts.len() == 1 && counts.get(&ObligationState::Abandoned) == Some(&1);
        if abandoned { Ok(()) } else { Err(counts) }
    })
    .await;
    // One attempt, no retry, nothing delivered.
    assert_eq!(rig.kit.fake.send_attempts().len(), 1);
    assert!(rig.kit.fake.sent().is_empty());
}
