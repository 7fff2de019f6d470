//! The gateway end to end with Microsoft Graph, in one process: the
//! adapter contract suite through the fake Graph and its change
//! notifications on the shared webhook listener, and what only Graph
//! does: the validation handshake, clientState, subscriptions renewed
//! before they expire, lifecycle events.
#![cfg(feature = "msgraph")]

use crate::contract;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use contract::{AdapterKit, Rig, WAIT};
use talaria_core::{Config, Env};
use talaria_gateway::Adapter;
use talaria_platforms::msgraph::{Clock, MsGraphAdapter, MsGraphSettings};
use talaria_platforms::registry::{Built, Setup};
use talaria_store::CursorStore;
use talaria_testkit::Reply;
use talaria_testkit::kit::msgraph::{CHANNELS, CHATS, MsGraphKit, dm};
use talaria_testkit::kit::{PlatformKit, Who};
use talaria_testkit::wait::wait_for;

/// A clock the test moves ahead, shared by every adapter a rig builds.
#[derive(Debug, Default)]
struct Ahead(AtomicU64);

impl Clock for Ahead {
    fn now(&self) -> SystemTime {
        SystemTime::now() + Duration::from_secs(self.0.load(Ordering::SeqCst))
    }
}

/// The clock of the rig whose environment has `MSGRAPH_TEST_CLOCK=ahead`
/// (one test moves it; the others keep the system's).
static CLOCK: std::sync::LazyLock<Arc<Ahead>> = std::sync::LazyLock::new(Arc::default);

impl AdapterKit for MsGraphKit {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let store: Arc<dyn CursorStore> = Arc::new(
            talaria_store::SqliteStore::open(&dir.keep().join("state.db")).expect("a store"),
        );
        Arc::new(msgraph_adapter(config, env, store))
    }

    fn build(&self, setup: &Setup<'_>) -> Built {
        let adapter = msgraph_adapter(setup.config, setup.env, setup.cursors.clone());
        let mount = adapter.mount();
        Built {
            adapter: Arc::new(adapter),
            mount: Some(mount),
        }
    }
}

/// The adapter as the registry builds it, except that Graph's pauses are
/// not waited out in full, and with the test clock when the environment
/// asks for it.
fn msgraph_adapter(config: &Config, env: &Env, store: Arc<dyn CursorStore>) -> MsGraphAdapter {
    let settings = MsGraphSettings::from_config(&config.section().unwrap(), env)
        .expect("the Microsoft Graph settings resolve")
        .expect("Microsoft Graph is on");
    let settings = MsGraphSettings {
        rate_limit_wait: Duration::from_millis(10),
        retry_wait: Duration::from_millis(200),
        check_every: Duration::from_millis(100),
        clock: if env.get("MSGRAPH_TEST_CLOCK") == Some("ahead") {
            CLOCK.clone()
        } else {
            settings.clock.clone()
        },
        ..settings
    };
    MsGraphAdapter::new(settings, store).expect("the Microsoft Graph adapter")
}

adapter_contract!(MsGraphKit;
    run: dm_turn, group_mention, thread_reply, long_answer_split, redelivery, rate_limit, unauthorized;
    skip: dropped_connection => contract::Skip::Connectionless,
          media_in => contract::Skip::ReceivesNoFiles,
          media_out => contract::Skip::SendsNoFiles);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graph_validated_both_urls_with_a_token_that_needs_decoding() {
    let rig = Rig::<MsGraphKit>::started(&[], |_| {}).await;
    let shakes = rig.kit.fake.handshakes();
    // Two subscriptions, each with its notification and lifecycle URL.
    assert_eq!(shakes.len(), 4, "{shakes:?}");
    for h in &shakes {
        assert!(h.ok, "{h:?}");
        assert_eq!(h.status, 200);
        assert!(h.content_type.starts_with("text/plain"), "{h:?}");
        assert!(h.token.contains(": ") && h.token.contains(" + "), "{h:?}");
        assert_eq!(h.body, h.token);
    }
    assert!(shakes.iter().any(|h| h.url.ends_with("/msgraph/lifecycle")));
    // The handshake by GET, as the ancestor served it, works too.
    let url = format!(
        "http://127.0.0.1:{}/msgraph/webhook?validationToken=a%2Bb%20c",
        rig.kit.port
    );
    let answer = reqwest::get(&url).await.expect("the listener answers");
    assert_eq!(answer.status().as_u16(), 200);
    assert_eq!(answer.text().await.unwrap(), "a+b c");
    let subs = rig.kit.fake.subscriptions();
    assert!(
        subs.iter()
            .all(|s| s.lifecycle_url.is_some() && s.client_state == "kit-client-state-51c0")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_client_state_is_dropped_and_a_batch_of_only_those_gets_403() {
    let rig = Rig::<MsGraphKit>::started(&[], |_| {}).await;
    let kit = &rig.kit;
    let sub = kit
        .fake
        .subscription(CHATS)
        .expect("the chats subscription");
    let (_, forged) =
        kit.fake
            .post_chat_message(dm(Who::Friend), ("ada-0000-4c1d", "Ada"), "forged", false);
    let body = kit.fake.notification(
        &sub,
        &[(forged.as_str(), "n-forged")],
        Some("guessed-state"),
    );
    kit.post(&sub.notification_url, &body);
    // A batch mixing a tampered item with a good one: the good one only.
    let (_, good) =
        kit.fake
            .post_chat_message(dm(Who::Friend), ("ada-0000-4c1d", "Ada"), "genuine", false);
    let mut mixed = kit
        .fake
        .notification(&sub, &[(good.as_str(), "n-good")], None);
    let bad = kit
        .fake
        .notification(&sub, &[(forged.as_str(), "n-forged-2")], Some(""));
    mixed["value"]
        .as_array_mut()
        .unwrap()
        .push(bad["value"][0].clone());
    rig.llm.push(Reply::text("Only the genuine one."));
    kit.post(&sub.notification_url, &mixed);
    let taken = kit.sender.wait_taken(2).await;
    let statuses: Vec<u16> = taken.iter().map(|t| t.status).collect();
    assert_eq!(statuses, [403, 202]);
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].text, "Only the genuine one.");
    rig.barrier().await;
    assert_eq!(
        rig.llm.requests().len(),
        2,
        "the forged message started a turn"
    );
    assert!(rig.user_messages(0).iter().all(|m| !m.contains("forged")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_are_renewed_before_they_expire_on_the_injected_clock() {
    let rig = Rig::<MsGraphKit>::started(&[("MSGRAPH_TEST_CLOCK", "ahead")], |_| {}).await;
    let before = rig.kit.fake.subscription(CHATS).expect("subscribed");
    assert!(rig.kit.fake.renewals().is_empty());
    // 19 hours on: less than the six hours' margin is left of a day.
    CLOCK.0.fetch_add(19 * 3600, Ordering::SeqCst);
    rig.kit.fake.advance_clock(Duration::from_secs(19 * 3600));
    let renewed = wait_for("both subscriptions renewed", || async {
        let r = rig.kit.fake.renewals();
        if r.len() >= 2 { Ok(r) } else { Err(r) }
    })
    .await;
    CLOCK.0.fetch_sub(19 * 3600, Ordering::SeqCst);
    let chats = renewed
        .iter()
        .find(|(id, _)| *id == before.id)
        .expect("the chats subscription renewed");
    assert!(chats.1 > before.expires, "{chats:?} vs {before:?}");
    // Still live on Graph's clock after the old expiry would have passed.
    rig.kit.fake.advance_clock(Duration::from_secs(6 * 3600));
    assert!(rig.kit.fake.subscription(CHATS).is_some());
    assert!(rig.kit.fake.subscription(CHANNELS).is_some());
    // And notifications still reach the gateway.
    rig.llm.push(Reply::text("Still here."));
    rig.kit.push_dm(Who::Friend, "are you there?");
    assert_eq!(rig.sent(1).await[0].text, "Still here.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_events_reauthorize_and_recreate_the_subscription() {
    let rig = Rig::<MsGraphKit>::started(&[], |_| {}).await;
    let kit = &rig.kit;
    let sub = kit.fake.subscription(CHATS).expect("subscribed");
    let url = sub.lifecycle_url.clone().expect("a lifecycle URL");
    kit.post(
        &url,
        &kit.fake.lifecycle(&sub, "reauthorizationRequired", None),
    );
    kit.fake
        .wait_for_requests("a reauthorize call", 1, WAIT, |r| {
            r.method == "POST" && r.path == format!("/v1.0/subscriptions/{}/reauthorize", sub.id)
        })
        .await;
    // The request is logged as it arrives; the fake acts on it after.
    let done = wait_for("the subscription reauthorized", || async {
        let r = kit.fake.reauthorized();
        if r.is_empty() { Err(r) } else { Ok(r) }
    })
    .await;
    assert_eq!(done, std::slice::from_ref(&sub.id));
    // A forged lifecycle event is refused and does nothing.
    kit.post(
        &url,
        &kit.fake
            .lifecycle(&sub, "reauthorizationRequired", Some("x")),
    );
    let taken = kit.sender.wait_taken(2).await;
    assert_eq!(taken[0].status, 202);
    assert_eq!(taken[1].status, 403);
    // Graph removed the subscription: it is created again.
    let creates = kit.fake.creates().len();
    kit.fake.remove_subscription(&sub.id);
    kit.post(&url, &kit.fake.lifecycle(&sub, "subscriptionRemoved", None));
    wait_for("the subscription created again", || async {
        match kit.fake.subscription(CHATS) {
            Some(s) if s.id != sub.id => Ok(()),
            other => Err(other),
        }
    })
    .await;
    assert_eq!(kit.fake.creates().len(), creates + 1);
    assert_eq!(kit.fake.reauthorized().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missed_event_resyncs_the_mailbox_and_the_mail_is_answered_in_its_conversation() {
    const INBOX: &str = "/users/box-0001/mailFolders('Inbox')/messages";
    let rig = Rig::<MsGraphKit>::started(
        &[("MSGRAPH_ALLOWED_USERS", "ada-0000-4c1d,ada@example.com")],
        |c| {
            c.platforms.set(
                "msgraph.resources",
                serde_json::json!([CHATS, INBOX, CHANNELS]),
            );
        },
    )
    .await;
    let kit = &rig.kit;
    let sub = kit
        .fake
        .subscription(INBOX)
        .expect("the mailbox subscribed");
    let url = sub.lifecycle_url.clone().expect("a lifecycle URL");
    // A mail whose notification Graph lost.
    let (id, _) = kit.fake.receive_mail(
        "box-0001",
        "ada@example.com",
        "Quarterly numbers",
        "Where are they?",
        "conv-7",
    );
    rig.llm.push(Reply::text("In the shared folder."));
    kit.post(&url, &kit.fake.lifecycle(&sub, "missed", None));
    let sent = rig.sent(1).await;
    // A reply to the mail itself, from the mailbox it arrived in.
    assert_eq!(sent[0].chat, "mail:box-0001");
    assert_eq!(sent[0].reply_to.as_deref(), Some(id.as_str()));
    assert_eq!(sent[0].text, "In the shared folder.");
    let asked = rig.user_messages(0);
    assert!(
        asked
            .last()
            .unwrap()
            .ends_with("Quarterly numbers\n\nWhere are they?"),
        "{asked:?}"
    );
    rig.wait_for_delivered(1).await;
    // Listed again by a second `missed`, it is not answered twice.
    kit.post(&url, &kit.fake.lifecycle(&sub, "missed", None));
    kit.fake
        .wait_for_requests("two mailbox listings", 2, WAIT, |r| {
            r.method == "GET" && r.path.ends_with("mailFolders('Inbox')/messages")
        })
        .await;
    rig.barrier().await;
    assert_eq!(rig.llm.requests().len(), 2, "the mail was answered twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_apps_own_posts_are_never_answered() {
    // Its user on the allowlist: only the adapter keeps its posts out.
    let rig = Rig::<MsGraphKit>::started(
        &[("MSGRAPH_ALLOWED_USERS", "ada-0000-4c1d,bot-user-0001")],
        |_| {},
    )
    .await;
    let kit = &rig.kit;
    rig.llm.push(Reply::text("One answer."));
    kit.push_dm(Who::Friend, "hello");
    rig.sent(1).await;
    rig.wait_for_delivered(1).await;
    // Graph notifies the app's own post in the chat, by the id the post
    // got, and a post of its user's it does not know the id of.
    let posted = kit.fake.sent()[0].id.clone();
    let resource = format!("chats('{}')/messages('{posted}')", dm(Who::Friend));
    kit.notify(CHATS, &resource, None);
    let (_, own) = kit.fake.post_chat_message(
        dm(Who::Friend),
        (talaria_testkit::kit::msgraph::bot_user(), "Talaria"),
        "One answer.",
        false,
    );
    kit.notify(CHATS, &own, None);
    rig.barrier().await;
    assert_eq!(rig.llm.requests().len(), 2, "the app answered itself");
    assert_eq!(kit.sent().len(), 2, "{:?}", kit.sent());
    // The post it sent was known by its id, not even fetched.
    let fetched = kit
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path.ends_with(&format!("/messages/{posted}")))
        .count();
    assert_eq!(fetched, 0);
}
