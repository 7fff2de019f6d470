//! Webhook deliveries end to end, in one process: signed HTTP requests to
//! the real webhook adapter on 127.0.0.1, the real runner, router and
//! delivery ledger on a real SQLite file, the mock LLM over HTTP, and the
//! answer arriving at a fake Telegram Bot API as the route's `deliver`
//! target says.
#![cfg(feature = "webhook")]

mod gateway_support;
#[path = "gateway_support/webhook.rs"]
mod webhook_support;

use serde_json::json;
use talaria_platforms::webhook::WebhookScheme;
use talaria_store::SessionStore;
use talaria_testkit::Reply;
use webhook_support::*;

/// The GitHub route's secret, read from the environment as `secret_env`
/// names it.
const GH_SECRET: &str = "gh-secret-0123456789";
const GH_SECRET_ENV: &str = "GITHUB_WEBHOOK_SECRET";
const GENERIC_SECRET: &str = "generic-secret-0123456789";
const GENERIC_SECRET_ENV: &str = "ALERTS_WEBHOOK_SECRET";

/// The chat the GitHub route delivers to.
const PR_CHAT: i64 = 777_000;

/// The GitHub route: pull requests, rendered from payload fields,
/// answered in [`PR_CHAT`].
fn github_route() -> (&'static str, talaria_platforms::webhook::WebhookRouteConfig) {
    let mut route = route(
        WebhookScheme::Github,
        GH_SECRET_ENV,
        "Review PR #{payload.number}: {payload.pull_request.title} by \
         {payload.pull_request.user.login} ({event_type} on {route})",
        &format!("telegram:{PR_CHAT}"),
    );
    route.events = vec!["pull_request".to_owned()];
    ("gh-prs", route)
}

async fn github_rig() -> WebhookRig {
    WebhookRig::started(&[(GH_SECRET_ENV, GH_SECRET)], vec![github_route()]).await
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
    serde_json::to_vec(&payload).expect("JSON")
}

/// What the GitHub route's template makes of [`pull_request`].
fn pr_prompt(number: u64, title: &str, login: &str) -> String {
    format!("Review PR #{number}: {title} by {login} (pull_request on gh-prs)")
}

/// Posts a correctly signed GitHub pull request delivery.
async fn post_pr(rig: &WebhookRig, body: &[u8], delivery: &str) -> Answer {
    let headers = github_headers(GH_SECRET, body, "pull_request", delivery);
    rig.post("gh-prs", &headers, body).await
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

fn texts(sent: &[talaria_testkit::telegram::Sent]) -> Vec<String> {
    sent.iter().map(|s| s.rendered()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_github_delivery_is_answered_in_the_routes_chat_through_the_ledger() {
    let rig = github_rig().await;
    rig.llm.push(Reply::text("PR #42 looks good to me."));
    let body = pull_request(42, "Add webhook deliveries", "ada");

    let answer = post_pr(&rig, &body, "d-0001").await;
    assert_eq!(answer.status, 202, "{:?}", answer.body);
    assert_eq!(answer.body["status"], "accepted");
    assert_eq!(answer.body["route"], "gh-prs");
    assert_eq!(answer.body["event"], "pull_request");
    assert_eq!(answer.body["delivery_id"], "d-0001");

    // The model sees the rendered template as the user's message.
    rig.llm_requests(1).await;
    let users = rig.messages(0, "user");
    assert_eq!(
        users.last().map(String::as_str),
        Some(pr_prompt(42, "Add webhook deliveries", "ada").as_str()),
        "{users:?}"
    );

    // The answer goes to the route's chat, not back to the sender.
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].chat_id, PR_CHAT);
    assert_eq!(sent[0].rendered(), "PR #42 looks good to me.");
    assert_eq!(sent[0].thread_id, None);
    assert_eq!(sent[0].reply_to, None, "nothing in Telegram to reply to");
    rig.wait_for_ledger_delivered(1).await;
    assert_eq!(
        rig.tg.send_attempts().len(),
        1,
        "exactly one sendMessage: {:?}",
        texts(&rig.tg.sent())
    );
    assert_eq!(rig.llm.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_delivery_is_a_duplicate_and_starts_no_second_turn() {
    let rig = github_rig().await;
    rig.llm.push(Reply::text("first answer"));
    rig.llm.push(Reply::text("answer to the other PR"));
    let body = pull_request(7, "Fix the parser", "grace");

    assert_eq!(post_pr(&rig, &body, "d-0007").await.status, 202);
    rig.sent(1).await;
    rig.wait_for_ledger_delivered(1).await;

    // The same body under the same delivery id, as a sender retrying.
    let replay = post_pr(&rig, &body, "d-0007").await;
    assert_eq!(replay.status, 200, "{:?}", replay.body);
    assert_eq!(replay.body["status"], "duplicate");
    assert_eq!(replay.body["delivery_id"], "d-0007");

    // A different delivery after the replay: once its answer is out, a
    // turn started by the replay would have been started before it.
    let other = pull_request(8, "Another change", "grace");
    assert_eq!(post_pr(&rig, &other, "d-0008").await.status, 202);
    let sent = rig.sent(2).await;
    rig.wait_for_ledger_delivered(2).await;
    assert_eq!(texts(&sent), vec!["first answer", "answer to the other PR"]);
    assert_eq!(rig.llm.requests().len(), 2, "the replay reached the model");
    assert_eq!(rig.tg.send_attempts().len(), 2);
    let users = rig.messages(1, "user");
    assert_eq!(
        users.last().map(String::as_str),
        Some(pr_prompt(8, "Another change", "grace").as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_delivering_to_telegram_uses_the_home_channel_from_the_gateway_env() {
    let alerts = route(
        WebhookScheme::Hmac,
        GENERIC_SECRET_ENV,
        "Alert {payload.alert.name} is {payload.alert.state}",
        "telegram",
    );
    let rig = WebhookRig::started(
        &[
            (GENERIC_SECRET_ENV, GENERIC_SECRET),
            ("TELEGRAM_HOME_CHANNEL", "-100424242"),
            ("TELEGRAM_HOME_CHANNEL_THREAD_ID", "17"),
        ],
        vec![("alerts", alerts)],
    )
    .await;
    rig.llm.push(Reply::text("The disk alert needs a look."));
    let body = serde_json::to_vec(&json!({"alert": {"name": "disk_full", "state": "firing"}}))
        .expect("JSON");

    let answer = rig
        .post("alerts", &hmac_headers(GENERIC_SECRET, &body), &body)
        .await;
    assert_eq!(answer.status, 202, "{:?}", answer.body);

    let sent = rig.sent(1).await;
    assert_eq!(sent[0].chat_id, -100_424_242);
    assert_eq!(sent[0].thread_id, Some(17));
    assert_eq!(sent[0].rendered(), "The disk alert needs a look.");
    assert_eq!(
        rig.messages(0, "user").last().map(String::as_str),
        Some("Alert disk_full is firing")
    );
    rig.wait_for_ledger_delivered(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_delivery_is_a_session_of_its_own() {
    let rig = github_rig().await;
    rig.llm.push(Reply::text("answer one"));
    rig.llm.push(Reply::text("answer two"));
    let first = pr_prompt(1, "First change", "ada");
    let second = pr_prompt(2, "Second change", "ada");

    let body = pull_request(1, "First change", "ada");
    let first_chat = format!("gh-prs:{}", signed_key("gh-prs", &body));
    assert_eq!(post_pr(&rig, &body, "d-1").await.status, 202);
    rig.sent(1).await;
    let body = pull_request(2, "Second change", "ada");
    let second_chat = format!("gh-prs:{}", signed_key("gh-prs", &body));
    assert_eq!(post_pr(&rig, &body, "d-2").await.status, 202);
    let sent = rig.sent(2).await;
    assert_eq!(texts(&sent), vec!["answer one", "answer two"]);
    rig.wait_for_ledger_delivered(2).await;

    // The second turn knows nothing of the first.
    let requests = rig.llm.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(rig.messages(1, "user"), vec![second.clone()]);
    let everything = requests[1].body["messages"].to_string();
    assert!(
        !everything.contains("First change") && !everything.contains("answer one"),
        "the first delivery leaked into the second request: {everything}"
    );

    // Two stored sessions, one per delivery, each holding its own prompt.
    let sessions = rig.webhook_sessions().await;
    assert_eq!(sessions.len(), 2, "{sessions:#?}");
    assert_ne!(sessions[0].id, sessions[1].id);
    assert_ne!(sessions[0].session_key, sessions[1].session_key);
    // Each named by what its sender signed, not by the delivery header.
    let mut chats: Vec<Option<String>> = sessions.iter().map(|s| s.chat_id.clone()).collect();
    chats.sort();
    let mut expected_chats = vec![Some(first_chat.clone()), Some(second_chat.clone())];
    expected_chats.sort();
    assert_eq!(chats, expected_chats);
    let store = rig.store();
    for session in &sessions {
        let expected = if session.chat_id.as_deref() == Some(first_chat.as_str()) {
            vec![first.clone(), "answer one".to_owned()]
        } else {
            vec![second.clone(), "answer two".to_owned()]
        };
        let stored = store
            .messages(&session.id)
            .await
            .expect("the session's messages");
        let contents: Vec<String> = stored.into_iter().map(|m| m.message.content).collect();
        assert_eq!(contents, expected, "{session:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_signature_gets_401_and_never_reaches_the_model() {
    let rig = github_rig().await;
    rig.llm.push(Reply::text("answer to the genuine delivery"));
    let body = pull_request(9, "Sneaky change", "mallory");

    let forged = github_headers("not-the-secret", &body, "pull_request", "d-0009");
    let answer = rig.post("gh-prs", &forged, &body).await;
    assert_eq!(answer.status, 401, "{:?}", answer.body);
    let unsigned: Vec<(&str, String)> = forged
        .iter()
        .filter(|(name, _)| *name != "X-Hub-Signature-256")
        .cloned()
        .collect();
    assert_eq!(rig.post("gh-prs", &unsigned, &body).await.status, 401);
    // Signed over other bytes than were sent.
    let other = pull_request(10, "Something else", "mallory");
    let swapped = github_headers(GH_SECRET, &other, "pull_request", "d-0009");
    assert_eq!(rig.post("gh-prs", &swapped, &body).await.status, 401);

    // The genuine delivery with the same body and id still gets in: the
    // refused ones were not remembered. Once its answer is out, anything
    // the refused ones started would have shown up before it.
    assert_eq!(post_pr(&rig, &body, "d-0009").await.status, 202);
    let sent = rig.sent(1).await;
    assert_eq!(texts(&sent), vec!["answer to the genuine delivery"]);
    rig.wait_for_ledger_delivered(1).await;
    assert_eq!(
        rig.llm.requests().len(),
        1,
        "a refused delivery reached the model"
    );
    assert_eq!(rig.webhook_sessions().await.len(), 1);
}
