//! Webhook deliveries end to end, in one process: signed HTTP requests to
//! the real webhook adapter on the shared listener, the real runner,
//! router and delivery ledger on a real SQLite file, the mock LLM over
//! HTTP, and the answer arriving at a fake Telegram Bot API as the route's
//! `deliver` target says. The contract scenarios run through
//! [`WebhookKit`]; what only webhook routes have is tested below on the
//! same rig.
#![cfg(feature = "webhook")]

use crate::contract;

use std::sync::Arc;

use contract::{AdapterKit, Rig};
use serde_json::{Value, json};
use talaria_core::{Config, Env};
use talaria_gateway::Adapter;
use talaria_platforms::registry::{Built, Setup};
use talaria_platforms::telegram::{TelegramAdapter, TelegramSettings};
use talaria_platforms::webhook::{WebhookAdapter, WebhookSettings};
use talaria_store::{SessionFilter, SessionRecord, SessionStore, SqliteStore};
use talaria_testkit::Reply;
use talaria_testkit::kit::webhook::{
    ALERTS_ROUTE, ALERTS_SECRET, EVENT, PR_ROUTE, PR_SECRET, SECRET, TARGET_CHAT, WebhookKit,
    github_headers, hmac_hex,
};
use talaria_testkit::kit::{PlatformKit, Who};
use talaria_testkit::telegram::Sent;
use talaria_testkit::wait::WAIT;

fn webhook_adapter(config: &Config, env: &Env) -> WebhookAdapter {
    let settings = WebhookSettings::from_config(&config.section().unwrap(), env)
        .unwrap()
        .expect("the kit configures routes");
    WebhookAdapter::new(settings).unwrap()
}

impl AdapterKit for WebhookKit {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        Arc::new(webhook_adapter(config, env))
    }

    /// The routes on the listener.
    fn build(&self, setup: &Setup<'_>) -> Built {
        let webhook = webhook_adapter(setup.config, setup.env);
        Built {
            mount: Some(webhook.mount()),
            adapter: Arc::new(webhook),
        }
    }

    /// The Telegram adapter the routes' answers go out through.
    fn beside(&self, config: &Config, env: &Env) -> Vec<Arc<dyn Adapter>> {
        let telegram = TelegramSettings::from_config(&config.section().unwrap(), env).unwrap();
        vec![Arc::new(TelegramAdapter::new(telegram).unwrap())]
    }
}

adapter_contract!(WebhookKit;
    run: dm_turn, redelivery, rate_limit, unauthorized;
    skip: thread_reply => contract::Skip::Threadless,
          group_mention => contract::Skip::NotAChat,
          long_answer_split => contract::Skip::NotAChat,
          dropped_connection => contract::Skip::Connectionless,
          media_in => contract::Skip::ReceivesNoFiles,
          media_out => contract::Skip::SendsNoFiles);

type WebhookRig = Rig<WebhookKit>;

/// Posts `body` to `route` with these headers and waits for the answer.
async fn post(
    rig: &WebhookRig,
    route: &str,
    headers: Vec<(String, String)>,
    body: &[u8],
) -> (u16, Value) {
    let n = rig.kit.sender.taken().len();
    rig.kit.post_to(route, headers, body.to_vec());
    let taken = rig.kit.sender.wait_taken(n + 1).await;
    let answer = &taken[n];
    (
        answer.status,
        serde_json::from_str(&answer.body).unwrap_or(Value::Null),
    )
}

/// A pull request event's body.
fn pull_request(number: u64, title: &str, login: &str) -> Vec<u8> {
    let payload = json!({
        "action": "opened",
        "number": number,
        "pull_request": {
            "title": title,
            "user": {"login": login},
            "html_url": format!("https://example.com/pr/{number}"),
        },
    });
    serde_json::to_vec(&payload).unwrap()
}

/// What the pull request route's template makes of [`pull_request`].
fn pr_prompt(number: u64, title: &str, login: &str) -> String {
    format!("Review PR #{number}: {title} by {login} (pull_request on {PR_ROUTE})")
}

/// Posts a correctly signed GitHub pull request delivery.
async fn post_pr(rig: &WebhookRig, body: &[u8], delivery: &str) -> (u16, Value) {
    let headers = github_headers(PR_SECRET, body, "pull_request", delivery);
    post(rig, PR_ROUTE, headers, body).await
}

/// The key a GitHub delivery is named by: the hex SHA-256 of the route, a
/// 0x1f byte and the signed body.
fn signed_key(route: &str, body: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(route.as_bytes());
    h.update([0x1f]);
    h.update(body);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The headers of the generic `hmac` scheme, signed now with `secret`.
fn hmac_headers(secret: &str, body: &[u8]) -> Vec<(String, String)> {
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let signed = [ts.as_bytes(), b".", body].concat();
    vec![
        ("X-Webhook-Timestamp".to_owned(), ts),
        (
            "X-Webhook-Signature".to_owned(),
            format!("sha256={}", hmac_hex(secret, &signed)),
        ),
    ]
}

/// The contents of the messages of LLM request `i` with this role.
fn messages(rig: &WebhookRig, i: usize, role: &str) -> Vec<String> {
    rig.llm.requests()[i].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == role)
        .map(|m| m["content"].as_str().unwrap_or("").to_owned())
        .collect()
}

async fn sent(rig: &WebhookRig, n: usize) -> Vec<Sent> {
    rig.kit.telegram.wait_for_sent(n, WAIT).await
}

fn texts(sent: &[Sent]) -> Vec<String> {
    sent.iter().map(|s| s.rendered()).collect()
}

/// The sessions the webhook platform started, newest first.
async fn webhook_sessions(rig: &WebhookRig) -> Vec<SessionRecord> {
    SqliteStore::open(&rig.home.state_db())
        .unwrap()
        .list_sessions(SessionFilter {
            source: Some("webhook".to_owned()),
            ..SessionFilter::default()
        })
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_github_delivery_is_accepted_and_its_prompt_rendered_from_the_payload() {
    // That its answer lands in the route's chat through the ledger is the
    // contract's `dm_turn`.
    let rig = WebhookRig::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("PR #42 looks good to me."));
    let body = pull_request(42, "Add webhook deliveries", "ada");

    let (status, answer) = post_pr(&rig, &body, "d-0001").await;
    assert_eq!(status, 202, "{answer:?}");
    assert_eq!(answer["status"], "accepted");
    assert_eq!(answer["route"], PR_ROUTE);
    assert_eq!(answer["event"], "pull_request");
    assert_eq!(answer["delivery_id"], "d-0001");

    rig.llm_requests(1).await;
    assert_eq!(
        messages(&rig, 0, "user").last().map(String::as_str),
        Some(pr_prompt(42, "Add webhook deliveries", "ada").as_str())
    );
    let sent = sent(&rig, 1).await;
    assert_eq!(sent[0].chat_id, TARGET_CHAT);
    assert_eq!(sent[0].thread_id, None);
    assert_eq!(sent[0].reply_to, None, "nothing in Telegram to reply to");
    rig.wait_for_delivered(1).await;
    // Delivered is the ledger's last word on the answer; the marker's
    // answer is the next send.
    rig.barrier().await;
    assert_eq!(rig.kit.telegram.send_attempts().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_delivery_is_answered_duplicate() {
    // That it starts no second turn is the contract's `redelivery`.
    let rig = WebhookRig::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("first answer"));
    let id = rig.kit.push_dm(Who::Friend, "only once");
    let (status, first) = {
        let taken = rig.kit.sender.wait_taken(1).await;
        (taken[0].status, taken[0].body.clone())
    };
    assert_eq!(status, 202, "{first}");
    sent(&rig, 1).await;
    rig.wait_for_delivered(1).await;

    let body = WebhookKit::body(&id, "only once");
    let (status, replay) = post(
        &rig,
        "kit",
        github_headers(SECRET, &body, EVENT, &id),
        &body,
    )
    .await;
    assert_eq!(status, 200, "{replay:?}");
    assert_eq!(replay["status"], "duplicate");
    assert_eq!(replay["delivery_id"], id.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_delivering_to_telegram_uses_the_home_channel_from_the_gateway_env() {
    let rig = WebhookRig::started(
        &[
            ("TELEGRAM_HOME_CHANNEL", "-100424242"),
            ("TELEGRAM_HOME_CHANNEL_THREAD_ID", "17"),
        ],
        |_| {},
    )
    .await;
    rig.llm.push(Reply::text("The disk alert needs a look."));
    let body =
        serde_json::to_vec(&json!({"alert": {"name": "disk_full", "state": "firing"}})).unwrap();

    let (status, answer) = post(
        &rig,
        ALERTS_ROUTE,
        hmac_headers(ALERTS_SECRET, &body),
        &body,
    )
    .await;
    assert_eq!(status, 202, "{answer:?}");

    let sent = sent(&rig, 1).await;
    assert_eq!(sent[0].chat_id, -100_424_242);
    assert_eq!(sent[0].thread_id, Some(17));
    assert_eq!(sent[0].rendered(), "The disk alert needs a look.");
    assert_eq!(
        messages(&rig, 0, "user").last().map(String::as_str),
        Some("Alert disk_full is firing")
    );
    rig.wait_for_delivered(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_delivery_is_a_session_of_its_own() {
    let rig = WebhookRig::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("answer one"));
    rig.llm.push(Reply::text("answer two"));
    let first = pr_prompt(1, "First change", "ada");
    let second = pr_prompt(2, "Second change", "ada");

    let body = pull_request(1, "First change", "ada");
    let first_chat = format!("{PR_ROUTE}:{}", signed_key(PR_ROUTE, &body));
    assert_eq!(post_pr(&rig, &body, "d-1").await.0, 202);
    sent(&rig, 1).await;
    let body = pull_request(2, "Second change", "ada");
    let second_chat = format!("{PR_ROUTE}:{}", signed_key(PR_ROUTE, &body));
    assert_eq!(post_pr(&rig, &body, "d-2").await.0, 202);
    let sent = sent(&rig, 2).await;
    assert_eq!(texts(&sent), vec!["answer one", "answer two"]);
    rig.wait_for_delivered(2).await;

    // The second turn knows nothing of the first.
    let requests = rig.llm.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(messages(&rig, 1, "user"), vec![second.clone()]);
    let everything = requests[1].body["messages"].to_string();
    assert!(
        !everything.contains("First change") && !everything.contains("answer one"),
        "the first delivery leaked into the second request: {everything}"
    );

    // Two stored sessions, one per delivery, each holding its own prompt.
    let sessions = webhook_sessions(&rig).await;
    assert_eq!(sessions.len(), 2, "{sessions:#?}");
    assert_ne!(sessions[0].id, sessions[1].id);
    assert_ne!(sessions[0].session_key, sessions[1].session_key);
    // Each named by what its sender signed, not by the delivery header.
    let mut chats: Vec<Option<String>> = sessions.iter().map(|s| s.chat_id.clone()).collect();
    chats.sort();
    let mut expected_chats = vec![Some(first_chat.clone()), Some(second_chat.clone())];
    expected_chats.sort();
    assert_eq!(chats, expected_chats);
    let store = SqliteStore::open(&rig.home.state_db()).unwrap();
    for session in &sessions {
        let expected = if session.chat_id.as_deref() == Some(first_chat.as_str()) {
            vec![first.clone(), "answer one".to_owned()]
        } else {
            vec![second.clone(), "answer two".to_owned()]
        };
        let stored = store.messages(&session.id).await.unwrap();
        let contents: Vec<String> = stored.into_iter().map(|m| m.message.content).collect();
        assert_eq!(contents, expected, "{session:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsigned_or_mis_signed_delivery_gets_401_and_never_reaches_the_model() {
    // A wrong secret is the contract's `unauthorized`.
    let rig = WebhookRig::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("answer to the genuine delivery"));
    let body = pull_request(9, "Sneaky change", "mallory");

    let forged = github_headers("not-the-secret", &body, "pull_request", "d-0009");
    assert_eq!(post(&rig, PR_ROUTE, forged.clone(), &body).await.0, 401);
    let unsigned: Vec<(String, String)> = forged
        .into_iter()
        .filter(|(name, _)| name != "X-Hub-Signature-256")
        .collect();
    assert_eq!(post(&rig, PR_ROUTE, unsigned, &body).await.0, 401);
    // Signed over other bytes than were sent.
    let other = pull_request(10, "Something else", "mallory");
    let swapped = github_headers(PR_SECRET, &other, "pull_request", "d-0009");
    assert_eq!(post(&rig, PR_ROUTE, swapped, &body).await.0, 401);

    // The genuine delivery with the same body and id still gets in: the
    // refused ones were not remembered. Once its answer is out, anything
    // the refused ones started would have shown up before it.
    assert_eq!(post_pr(&rig, &body, "d-0009").await.0, 202);
    let sent = sent(&rig, 1).await;
    assert_eq!(texts(&sent), vec!["answer to the genuine delivery"]);
    rig.wait_for_delivered(1).await;
    assert_eq!(
        rig.llm.requests().len(),
        1,
        "a refused delivery reached the model"
    );
    assert_eq!(webhook_sessions(&rig).await.len(), 1);
}
