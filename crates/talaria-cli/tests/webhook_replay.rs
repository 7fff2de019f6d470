//! `talaria gateway run` as a real process serving the webhook kit's GitHub
//! route, the mock LLM as its model: a captured signed delivery resent
//! after the gateway was killed and started again on the same home, under
//! a new `X-GitHub-Delivery` (which GitHub does not sign), must not reach
//! the model a second time, and must not be answered 202 "accepted".

use crate::crash_support;

use crash_support::{kit_home, logs, spawn_gateway};
use serde_json::{Value, json};
use talaria_testkit::kit::PlatformKit;
use talaria_testkit::kit::webhook::{PR_ROUTE, PR_SECRET, WebhookKit, github_headers};
use talaria_testkit::wait::wait_for;
use talaria_testkit::{MockOpenAi, Reply};

/// Posts a GitHub `pull_request` delivery signed with the route's secret
/// (retried while the gateway is not taking deliveries) and returns the
/// answer.
async fn deliver(kit: &WebhookKit, body: &[u8], delivery: &str) -> (u16, Value) {
    let n = kit.sender.taken().len();
    let headers = github_headers(PR_SECRET, body, "pull_request", delivery);
    kit.post_to(PR_ROUTE, headers, body.to_vec());
    let taken = kit.sender.wait_taken(n + 1).await;
    (
        taken[n].status,
        serde_json::from_str(&taken[n].body).unwrap_or(Value::Null),
    )
}

/// Waits until no accepted message is owed a turn any more.
async fn turns_finished(home: &crash_support::Home) {
    let store = talaria_store::SqliteStore::open(&home.root.join("state.db")).unwrap();
    wait_for("every accepted delivery's turn to finish", || async {
        match talaria_store::OwedTurnStore::owed_turn_count(&store).await {
            Ok(0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

async fn model_requests(llm: &MockOpenAi, n: usize) {
    wait_for(&format!("{n} model requests"), || async {
        let got = llm.requests().len();
        if got >= n { Ok(()) } else { Err(got) }
    })
    .await;
}

/// The last user message of model request `i`.
fn prompt_of(llm: &MockOpenAi, i: usize) -> String {
    let requests = llm.requests();
    let messages = requests[i].body["messages"].as_array().unwrap().clone();
    messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

fn pr(number: u64, title: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "action": "opened",
        "number": number,
        "pull_request": {"title": title, "user": {"login": "ada"}},
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_delivery_replayed_after_a_restart_under_a_new_id_reaches_the_model_once() {
    let llm = MockOpenAi::start().await;
    let kit = WebhookKit::start().await;
    llm.push(Reply::text("PR 7 reviewed."));
    llm.push(Reply::text("PR 8 reviewed."));
    let home = kit_home(&llm, &kit);
    let mut gateway = spawn_gateway(&home, &home.root.join("test-gateway.log"));
    kit.wait_connected(1).await;

    let captured = pr(7, "Fix the parser");
    let (status, answer) = deliver(&kit, &captured, "f0e1d2c3-0001").await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["status"], "accepted");
    model_requests(&llm, 1).await;
    // The turn is over (answered, nothing owed) before the gateway dies.
    turns_finished(&home).await;
    gateway.kill().unwrap();
    gateway.wait().unwrap();

    // Started again on the same home: its in-memory replay cache is empty.
    let seen = kit.connections();
    let mut gateway = spawn_gateway(&home, &home.root.join("test-gateway-2.log"));
    kit.wait_connected(seen + 1).await;
    // The captured delivery, byte for byte, with a new unsigned id.
    let (status, answer) = deliver(&kit, &captured, "a9b8c7d6-0002").await;
    assert_eq!(status, 200, "{answer}\n{}", logs(&home));
    assert_eq!(answer["status"], "duplicate");
    assert_eq!(answer["delivery_id"], "a9b8c7d6-0002");

    // A genuinely new delivery afterwards: once the model has been asked
    // about it, a turn the replay started would have asked it before.
    let (status, answer) = deliver(&kit, &pr(8, "Another change"), "a9b8c7d6-0003").await;
    assert_eq!(status, 202, "{answer}");
    model_requests(&llm, 2).await;
    turns_finished(&home).await;
    assert_eq!(llm.requests().len(), 2, "the replay reached the model");
    let prompt = |n: u64, title: &str| {
        format!("Review PR #{n}: {title} by ada (pull_request on {PR_ROUTE})")
    };
    assert_eq!(prompt_of(&llm, 0), prompt(7, "Fix the parser"));
    assert_eq!(prompt_of(&llm, 1), prompt(8, "Another change"));

    gateway.kill().unwrap();
    gateway.wait().unwrap();
}
