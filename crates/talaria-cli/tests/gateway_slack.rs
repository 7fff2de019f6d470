//! `talaria gateway run` as a real process against the fake Slack and the
//! mock LLM: a crash (SIGKILL) while an answer is being posted loses
//! nothing, and the restarted gateway posts it exactly once, marked as
//! recovered.

mod crash_support;

use std::time::{Duration, Instant};

use talaria_testkit::{FakeSlack, MockOpenAi, Reply};

use crash_support::{Home, spawn_gateway};

const BOT_TOKEN: &str = "xoxb-cli-test-bot-token-0123456789";
const APP_TOKEN: &str = "xapp-1-cli-test-app-token-0123456789";
const WAIT: Duration = Duration::from_secs(20);

fn home(llm: &MockOpenAi, slack: &FakeSlack) -> Home {
    crash_support::home(
        llm,
        &format!(
            "  slack:\n    api_base: {}\n    ping_interval_ms: 100\n    ping_timeout_ms: 2000\n",
            slack.api_base()
        ),
        &format!(
            "SLACK_BOT_TOKEN={BOT_TOKEN}\nSLACK_APP_TOKEN={APP_TOKEN}\nSLACK_ALLOWED_USERS=U42\n"
        ),
    )
}

/// The ledger's open rows.
async fn ledger_open_rows(home: &Home) -> Vec<String> {
    use talaria_store::LedgerStore;
    let store = talaria_store::SqliteStore::open(&home.root.join("state.db")).unwrap();
    store
        .open_obligations(0)
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.content)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slack_reply_cut_off_by_sigkill_is_posted_once_after_restart_with_the_recovery_line() {
    let llm = MockOpenAi::start().await;
    let slack = FakeSlack::start(BOT_TOKEN, APP_TOKEN).await;
    let home = home(&llm, &slack);
    let log = home.root.join("test-gateway.log");
    let log2 = home.root.join("test-gateway-2.log");
    let logs = || {
        format!(
            "{}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default(),
            std::fs::read_to_string(&log2).unwrap_or_default()
        )
    };

    let mut first = spawn_gateway(&home, &log);
    slack.wait_for_connection(1, WAIT).await;
    llm.push(Reply::text("The precious answer."));
    slack.hang_post(true);
    slack.push_dm("D42", "U42", "important question");
    slack.wait_for_post_attempts(1, WAIT).await;
    // The answer is on the wire and Slack has not answered: crash.
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(slack.posted().is_empty());
    assert_eq!(llm.requests().len(), 1);
    // The question was acknowledged before the turn ran: Slack will not
    // send it again, so only the ledger can bring the answer back.
    assert_eq!(slack.pending(), 0, "{}", logs());

    slack.hang_post(false);
    let mut second = spawn_gateway(&home, &log2);
    slack.wait_for_connection(2, WAIT).await;
    let posted = slack.wait_for_posts(1, WAIT).await;
    let text0 = posted[0].rendered();
    assert!(
        text0.starts_with("♻️ Recovered reply"),
        "{text0:?}\n{}",
        logs()
    );
    assert!(text0.ends_with("The precious answer."), "{text0:?}");
    assert_eq!(posted[0].channel, "D42");
    // Exactly once, and the model was not asked again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(slack.posted().len(), 1);
    assert_eq!(llm.requests().len(), 1);

    // The conversation goes on where it was.
    llm.push(Reply::text("Next answer."));
    slack.push_dm("D42", "U42", "and then?");
    let posted = slack.wait_for_posts(2, WAIT).await;
    assert_eq!(posted[1].rendered(), "Next answer.");
    let deadline = Instant::now() + WAIT;
    while !ledger_open_rows(&home).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            ledger_open_rows(&home).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        slack.posted().len(),
        2,
        "the recovered reply was sent again"
    );
    let users: Vec<String> = llm.requests()[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(users, vec!["important question", "and then?"]);

    second.kill().unwrap();
    second.wait().unwrap();
}
