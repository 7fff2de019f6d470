//! Cost and budgets through the real binary: a day of turns on two models
//! (two mock endpoints reporting known usage) sums to the price table's
//! figures in `talaria insights`, a spent home budget refuses a turn from
//! the terminal, and a chat over its own budget is refused on the fake
//! Telegram while another chat is answered, with no model request for
//! the refused ones.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use talaria_testkit::{FakeTelegram, MockOpenAi, Reply, ToolCallReply};

const TOKEN: &str = "424242:cost-test-token-abcdefghijkl";
const WAIT: Duration = Duration::from_secs(20);

fn command(home: &Path, locks: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_talaria"));
    c.arg("--home")
        .arg(home)
        .args(args)
        .env_remove("TALARIA_HOME")
        .env_remove("TALARIA_LOG")
        .env_remove("RUST_LOG")
        .env_remove("OPENAI_API_KEY")
        .env_remove("TALARIA_MODEL")
        .env_remove("TALARIA_BASE_URL")
        .env_remove("TELEGRAM_BOT_TOKEN")
        .env_remove("TELEGRAM_ALLOWED_USERS")
        .env_remove("GATEWAY_ALLOW_ALL_USERS")
        .env("TALARIA_GATEWAY_LOCK_DIR", locks)
        .stdin(Stdio::null());
    c
}

async fn talaria(home: &Path, args: &[&str]) -> Output {
    let mut c = command(home, &home.join("locks"), args);
    tokio::task::spawn_blocking(move || c.output().unwrap())
        .await
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The model section for `model` at `url`, then `extra`.
fn write_config(home: &Path, model: &str, url: &str, extra: &str) {
    std::fs::create_dir_all(home).unwrap();
    std::fs::write(
        home.join("config.yaml"),
        format!(
            "model:\n  default: {model}\n  provider: custom\n  base_url: {url}\n  api_key: sk-test-secret-key-0123456789\nagent:\n  api_max_retries: 1\n{extra}"
        ),
    )
    .unwrap();
}

async fn ask(home: &Path, prompt: &str) -> String {
    let out = talaria(home, &["chat", "-q", prompt]).await;
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    text(&out.stdout)
}

fn group<'a>(report: &'a Value, list: &str, name: &str) -> &'a Value {
    report[list]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {list}: {report}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_of_turns_on_two_models_sums_in_insights_and_a_spent_budget_refuses() {
    let first = MockOpenAi::start().await;
    let second = MockOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    // An override for a model the table does not know.
    let prices = "prices:\n  house-model:\n    input: 2.0\n    output: 8.0\n";

    // Morning, on gpt-4o-mini ($0.15 in, $0.60 out per million): a turn
    // with a tool call (two model calls), then a plain one.
    write_config(&home, "gpt-4o-mini", &first.base_url(), prices);
    first.push(
        Reply::tool_calls(vec![ToolCallReply {
            id: "call_1".into(),
            name: "terminal".into(),
            arguments: r#"{"command":"echo cost-marker"}"#.into(),
        }])
        .with_usage(1000, 200),
    );
    first.push(Reply::text("Ran it.").with_usage(1500, 100));
    assert_eq!(ask(&home, "run echo").await, "Ran it.\n");
    first.push(Reply::text("Second answer.").with_usage(2000, 300));
    assert_eq!(ask(&home, "again").await, "Second answer.\n");
    assert_eq!(first.requests().len(), 3);

    // Afternoon, on the second endpoint: claude-sonnet-4-5 ($3 in, $15
    // out), then the overridden house-model ($2 in, $8 out).
    write_config(
        &home,
        "claude-sonnet-4-5-20250929",
        &second.base_url(),
        prices,
    );
    second.push(Reply::text("Sonnet here.").with_usage(1000, 100));
    assert_eq!(ask(&home, "hello sonnet").await, "Sonnet here.\n");
    write_config(&home, "house-model", &second.base_url(), prices);
    second.push(Reply::text("House here.").with_usage(500, 50));
    assert_eq!(ask(&home, "hello house").await, "House here.\n");
    assert_eq!(second.requests().len(), 2);

    // gpt-4o-mini: 1000*0.15 + 200*0.60 = 270; 1500*0.15 + 100*0.60 = 285;
    // 2000*0.15 + 300*0.60 = 480 micro-dollars: 1035.
    // claude-sonnet-4-5: 1000*3 + 100*15 = 4500. house-model: 500*2 + 50*8
    // = 1400. In all 6935 micro-dollars.
    let out = talaria(&home, &["insights", "--json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["days"], 30);
    let report = &json["report"];
    let total = &report["total"];
    assert_eq!(total["cost_micros"], 6935, "{report}");
    assert_eq!(total["calls"], 5);
    assert_eq!(total["turns"], 4);
    assert_eq!(total["tool_calls"], 1);
    assert_eq!(total["input_tokens"], 6000);
    assert_eq!(total["output_tokens"], 750);
    let gpt = group(report, "by_model", "gpt-4o-mini");
    assert_eq!(
        (
            gpt["cost_micros"].as_u64(),
            gpt["calls"].as_u64(),
            gpt["turns"].as_u64()
        ),
        (Some(1035), Some(3), Some(2))
    );
    assert_eq!(
        group(report, "by_model", "claude-sonnet-4-5-20250929")["cost_micros"],
        4500
    );
    assert_eq!(
        group(report, "by_model", "house-model")["cost_micros"],
        1400
    );
    // Costliest first.
    let models: Vec<&str> = report["by_model"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        models,
        ["claude-sonnet-4-5-20250929", "house-model", "gpt-4o-mini"]
    );
    assert_eq!(
        group(report, "by_platform", "cli-oneshot")["cost_micros"],
        6935
    );
    let day_sum: u64 = report["by_day"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["cost_micros"].as_u64().unwrap())
        .sum();
    assert_eq!(day_sum, 6935);

    // The same as a table.
    let out = talaria(&home, &["insights", "--days", "7"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(
        table.starts_with("In the last 7 days (UTC): 4 turns, 5 model calls, 1 tool calls; 6000 tokens in, 750 out"),
        "{table}"
    );
    assert!(table.contains("cost $0.0069."), "{table}");
    assert!(table.contains("house-model"), "{table}");
    let out = talaria(&home, &["insights", "--days", "0"]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--days must be from 1 to 3650"),
        "{}",
        text(&out.stderr)
    );

    // A home budget of half a cent a day is spent ($0.0069 today): the
    // next turn is refused and no request reaches the model.
    write_config(
        &home,
        "house-model",
        &second.base_url(),
        &format!("{prices}budget:\n  daily_usd: 0.005\n"),
    );
    second.push(Reply::text("must not be sent"));
    let out = talaria(&home, &["chat", "-q", "one more"]).await;
    assert!(!out.status.success());
    let said = text(&out.stderr);
    assert!(
        said.contains(
            "The daily budget of $0.0050 is spent ($0.0069 today); it resets at 00:00 UTC, in "
        ),
        "{said}"
    );
    assert_eq!(second.requests().len(), 2, "a refused turn calls no model");
    // A monthly budget alone is checked the same way.
    write_config(
        &home,
        "house-model",
        &second.base_url(),
        &format!("{prices}budget:\n  monthly_usd: 0.006\n"),
    );
    let out = talaria(&home, &["chat", "-q", "one more"]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr)
            .contains("The monthly budget of $0.0060 is spent ($0.0069 this month); it resets on "),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(second.requests().len(), 2);
    // Raised, the turn goes through.
    write_config(
        &home,
        "house-model",
        &second.base_url(),
        &format!("{prices}budget:\n  daily_usd: 1\n"),
    );
    assert_eq!(ask(&home, "one more").await, "must not be sent\n");
    assert_eq!(second.requests().len(), 3);
}

struct Gateway {
    child: Child,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_gateway(home: &Path, locks: &Path, log: &Path) -> Gateway {
    let log = std::fs::File::create(log).unwrap();
    let child = command(home, locks, &["gateway", "run"])
        .env("TALARIA_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Gateway { child }
}

/// The first `n` messages sent, once the `n`th is; then a pause, so the
/// chat's turn has ended (a message during it would interrupt it).
async fn sent_to(tg: &FakeTelegram, n: usize) -> Vec<String> {
    let sent = tg
        .wait_for_sent(n, WAIT)
        .await
        .iter()
        .map(|s| s.rendered())
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_over_its_budget_is_refused_and_the_model_is_not_called() {
    let llm = MockOpenAi::start().await;
    let tg = FakeTelegram::start(TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let home: PathBuf = dir.path().join("home");
    let locks = dir.path().join("locks");
    // Chat 7 may spend a tenth of a cent a day; chat 8 has no budget of
    // its own, and the home's is far away.
    write_config(
        &home,
        "gpt-4o-mini",
        &llm.base_url(),
        &format!(
            "platforms:\n  telegram:\n    base_url: {}\n    poll_timeout_secs: 1\nbudget:\n  daily_usd: 100\n  chats:\n    \"telegram:7\":\n      daily_usd: 0.001\n",
            tg.base_url()
        ),
    );
    std::fs::write(
        home.join(".env"),
        format!("TELEGRAM_BOT_TOKEN={TOKEN}\nTELEGRAM_ALLOWED_USERS=7,8\n"),
    )
    .unwrap();
    let log = dir.path().join("gateway.log");
    let _gateway = spawn_gateway(&home, &locks, &log);
    tg.wait_for_get_updates_calls(1, WAIT).await;

    // 10,000 in x $0.15 + 1,000 out x $0.60 = 2100 micro-dollars.
    llm.push(Reply::text("First answer.").with_usage(10_000, 1_000));
    tg.push_private_text(7, "hello");
    let sent = sent_to(&tg, 1).await;
    assert!(sent[0].contains("First answer."), "{sent:?}");
    assert_eq!(llm.requests().len(), 1);

    tg.push_private_text(7, "and again");
    let sent = sent_to(&tg, 2).await;
    assert!(
        sent[1].contains(
            "This chat's daily budget of $0.0010 is spent ($0.0021 today); it resets at 00:00 UTC, in "
        ),
        "{sent:?}"
    );
    assert_eq!(
        llm.requests().len(),
        1,
        "the refused turn made no model call"
    );

    // Another chat is not held to chat 7's budget.
    llm.push(Reply::text("Answer for eight."));
    tg.push_private_text(8, "hi from eight");
    let sent = sent_to(&tg, 3).await;
    assert!(sent[2].contains("Answer for eight."), "{sent:?}");
    assert_eq!(llm.requests().len(), 2);

    // /usage shows the chat's cost and its spend against its budget.
    tg.push_private_text(7, "/usage");
    let sent = sent_to(&tg, 4).await;
    let usage = &sent[3];
    assert!(usage.contains("cost $0.0021."), "{usage}");
    assert!(
        usage.contains("This chat: $0.0021 today, $0.0021 this month (daily budget $0.0010)."),
        "{usage}"
    );
    assert!(
        usage.contains("This chat's daily budget of $0.0010 is spent"),
        "{usage}"
    );
    assert_eq!(llm.requests().len(), 2);
    let deadline = Instant::now() + Duration::from_millis(300);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(llm.requests().len(), 2, "nothing called the model late");
}
