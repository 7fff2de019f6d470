//! Work that outlives its turn, through the binary and the fake Telegram:
//! a background command reports to the chat after the turn has ended,
//! `/background` runs a prompt while the chat stays free, and a gateway
//! killed (SIGKILL) while background work runs tells the chat once what
//! became of it after the restart: lost if it was still running, its
//! report (once) if it had just finished.

use crate::crash_support;

use std::time::Duration;

use crash_support::{kit_home, logs, spawn_gateway};
use talaria_testkit::kit::telegram::TelegramKit;
use talaria_testkit::kit::{PlatformKit, Who, wait_for_text};
use talaria_testkit::{MockOpenAi, Reply, ToolCallReply};

/// A model reply that starts `command` in the background with a
/// completion notice.
fn start_in_background(command: &str) -> Reply {
    let args = serde_json::json!({
        "command": command,
        "background": true,
        "notify_on_complete": true,
    });
    Reply::tool_calls(vec![ToolCallReply::new(
        "call_bg",
        "terminal",
        args.to_string(),
    )])
}

/// The texts the chat got so far.
fn texts(kit: &TelegramKit) -> Vec<String> {
    kit.sent().into_iter().map(|o| o.text).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_command_reports_to_the_chat_after_the_turn_ended() {
    let llm = MockOpenAi::start().await;
    let kit = TelegramKit::start().await;
    let home = kit_home(&llm, &kit);
    let mut gateway = spawn_gateway(&home, &home.root.join("test-gateway.log"));
    kit.wait_connected(1).await;

    llm.push(start_in_background("sleep 2 && echo done-marker"));
    llm.push(Reply::text("Started it; I'll tell you when it ends."));
    kit.push_dm(Who::Friend, "run the slow thing in the background");
    let sent = kit.wait_sent(1).await;
    assert_eq!(sent[0].text, "Started it; I'll tell you when it ends.");
    // The tool returned at once: the model saw a running process.
    let second = &llm.requests()[1].body;
    let result = second["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "tool"))
        .map(|m| m["content"].to_string())
        .unwrap_or_default();
    assert!(result.contains("proc_"), "{result}");
    assert!(result.contains("running"), "{result}");

    let sent = kit.wait_sent(2).await;
    let notice = &sent[1].text;
    assert!(notice.contains("done-marker"), "{notice}\n{}", logs(&home));
    assert!(
        notice.contains("exit 0") || notice.contains("exit code 0"),
        "{notice}"
    );
    assert_eq!(sent[1].chat, kit.dm_chat(Who::Friend));
    // No follow-up turn by default: the model was asked twice, for the
    // one turn.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(llm.requests().len(), 2);
    assert_eq!(kit.sent().len(), 2);

    // The obligation is settled: nothing is owed after the report.
    let store = talaria_store::SqliteStore::open(&home.root.join("state.db")).unwrap();
    talaria_testkit::wait::wait_for("nothing owed", || async {
        match talaria_store::OwedTurnStore::owed_turn_count(&store).await {
            Ok(0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    gateway.kill().unwrap();
    gateway.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slash_background_runs_a_prompt_while_the_chat_stays_free() {
    let llm = MockOpenAi::start().await;
    let kit = TelegramKit::start().await;
    let home = kit_home(&llm, &kit);
    let mut gateway = spawn_gateway(&home, &home.root.join("test-gateway.log"));
    kit.wait_connected(1).await;

    llm.push(Reply::text("The long research result.").with_delay(Duration::from_secs(3)));
    kit.push_dm(Who::Friend, "/background research the history of sails");
    let sent = wait_for_text(&kit, "Started in the background").await;
    assert!(sent.iter().any(|o| o.text.contains("bg_")), "{sent:?}");

    // The chat is free while it runs: a message is answered at once, and
    // /status lists the background task.
    llm.push(Reply::text("Quick answer."));
    kit.push_dm(Who::Friend, "what time is it?");
    wait_for_text(&kit, "Quick answer.").await;
    kit.push_dm(Who::Friend, "/status");
    let sent = wait_for_text(&kit, "In the background (1)").await;
    let status = sent
        .iter()
        .find(|o| o.text.contains("In the background"))
        .map(|o| o.text.clone())
        .unwrap_or_default();
    assert!(status.contains("research the history of sails"), "{status}");
    assert!(
        !texts(&kit)
            .iter()
            .any(|t| t.contains("long research result")),
        "the background answer came before the quick one"
    );

    let sent = wait_for_text(&kit, "The long research result.").await;
    let done = sent
        .iter()
        .find(|o| o.text.contains("The long research result."))
        .map(|o| o.text.clone())
        .unwrap_or_default();
    assert!(done.contains("Background task"), "{done}");
    assert!(done.contains("research the history of sails"), "{done}");
    // The background prompt ran as a conversation of its own: its request
    // holds the prompt and not the chat's other message.
    let bg = llm
        .requests()
        .into_iter()
        .find(|r| r.body.to_string().contains("history of sails"))
        .expect("the background request");
    assert!(!bg.body.to_string().contains("what time is it"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        texts(&kit)
            .iter()
            .filter(|t| t.contains("The long research result."))
            .count(),
        1
    );
    gateway.kill().unwrap();
    gateway.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_command_running_at_a_sigkill_is_said_lost_once_after_restart() {
    let llm = MockOpenAi::start().await;
    let kit = TelegramKit::start().await;
    let home = kit_home(&llm, &kit);
    let mut first = spawn_gateway(&home, &home.root.join("test-gateway.log"));
    kit.wait_connected(1).await;

    // Short enough that the orphaned sleep does not outlive the test run
    // by much.
    llm.push(start_in_background("sleep 20"));
    llm.push(Reply::text("Running."));
    kit.push_dm(Who::Friend, "start the long job");
    kit.wait_sent(1).await;
    // The answer is marked delivered before the kill, so the restart's
    // only message is about the job.
    crash_support::wait_delivered(&home, 1).await;
    first.kill().unwrap();
    first.wait().unwrap();

    let seen = kit.connections();
    let mut second = spawn_gateway(&home, &home.root.join("test-gateway-2.log"));
    kit.wait_connected(seen + 1).await;
    let sent = kit.wait_sent(2).await;
    let notice = &sent[1].text;
    assert!(
        notice.contains("restarted") && notice.contains("sleep 20"),
        "{notice}\n{}",
        logs(&home)
    );
    assert_eq!(sent[1].chat, kit.dm_chat(Who::Friend));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(kit.sent().len(), 2, "{:?}", texts(&kit));
    assert_eq!(llm.requests().len(), 2, "the job is not run again");
    second.kill().unwrap();
    second.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_on_the_wire_at_a_sigkill_is_delivered_once_after_restart() {
    let llm = MockOpenAi::start().await;
    let kit = TelegramKit::start().await;
    let home = kit_home(&llm, &kit);
    let mut first = spawn_gateway(&home, &home.root.join("test-gateway.log"));
    kit.wait_connected(1).await;

    llm.push(start_in_background("sleep 1 && echo finished-marker"));
    llm.push(Reply::text("Started."));
    kit.push_dm(Who::Friend, "quick background job");
    kit.wait_sent(1).await;
    crash_support::wait_delivered(&home, 1).await;
    let attempts = kit.send_attempts().len();
    // The platform stops answering: the report is recorded and on the wire
    // when the gateway dies.
    kit.hang_send(true);
    kit.wait_send_attempts(attempts + 1).await;
    first.kill().unwrap();
    first.wait().unwrap();
    assert_eq!(kit.sent().len(), 1);

    kit.hang_send(false);
    let seen = kit.connections();
    let mut second = spawn_gateway(&home, &home.root.join("test-gateway-2.log"));
    kit.wait_connected(seen + 1).await;
    let sent = kit.wait_sent(2).await;
    assert!(
        sent[1].text.contains("finished-marker"),
        "{:?}\n{}",
        sent[1].text,
        logs(&home)
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    let reports = texts(&kit)
        .iter()
        .filter(|t| t.contains("finished-marker"))
        .count();
    assert_eq!(reports, 1, "{:?}", texts(&kit));
    assert!(
        !texts(&kit).iter().any(|t| t.contains("result is lost")),
        "a finished job is not said lost: {:?}",
        texts(&kit)
    );
    second.kill().unwrap();
    second.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_normal_stop_tells_the_chat_at_once_and_the_restart_says_nothing_more() {
    let llm = MockOpenAi::start().await;
    let kit = TelegramKit::start().await;
    let home = kit_home(&llm, &kit);
    let mut first = spawn_gateway(&home, &home.root.join("test-gateway.log"));
    kit.wait_connected(1).await;

    llm.push(start_in_background("sleep 30"));
    llm.push(Reply::text("Running."));
    kit.push_dm(Who::Friend, "start the long job");
    kit.wait_sent(1).await;
    crash_support::wait_delivered(&home, 1).await;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(first.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = first.wait().unwrap();
    assert!(status.success(), "{status:?}\n{}", logs(&home));
    let sent = kit.wait_sent(2).await;
    assert!(
        sent[1].text.contains("gateway stopped") && sent[1].text.contains("sleep 30"),
        "{:?}",
        sent[1].text
    );

    // Nothing is owed any more: the next start says nothing about it.
    let seen = kit.connections();
    let mut second = spawn_gateway(&home, &home.root.join("test-gateway-2.log"));
    kit.wait_connected(seen + 1).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(kit.sent().len(), 2, "{:?}", texts(&kit));
    second.kill().unwrap();
    second.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_ends_the_background_commands_of_the_old_conversation() {
    let llm = MockOpenAi::start().await;
    let kit = TelegramKit::start().await;
    let home = kit_home(&llm, &kit);
    let marker = home.root.join("still-running");
    let mut gateway = spawn_gateway(&home, &home.root.join("test-gateway.log"));
    kit.wait_connected(1).await;

    // The command touches the marker every 100 ms while it lives.
    let command = format!("while true; do touch {}; sleep 0.1; done", marker.display());
    llm.push(start_in_background(&command));
    llm.push(Reply::text("Running."));
    kit.push_dm(Who::Friend, "start the loop");
    kit.wait_sent(1).await;
    talaria_testkit::wait::wait_for("the loop running", || async {
        if marker.exists() { Ok(()) } else { Err(()) }
    })
    .await;
    // /status lists it, with the command.
    kit.push_dm(Who::Friend, "/status");
    let sent = wait_for_text(&kit, "In the background (1)").await;
    let status = sent
        .iter()
        .find(|o| o.text.contains("In the background"))
        .map(|o| o.text.clone())
        .unwrap_or_default();
    assert!(
        status.contains("proc_") && status.contains("while true"),
        "{status}"
    );
    kit.push_dm(Who::Friend, "/new");
    wait_for_text(&kit, "new conversation").await;
    // Once it is dead, a removed marker stays removed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::remove_file(&marker).unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!marker.exists(), "the loop outlived /new\n{}", logs(&home));
    // A reset asked for a fresh start: no report, nothing owed.
    assert!(
        !texts(&kit).iter().any(|t| t.contains("Background process")),
        "{:?}",
        texts(&kit)
    );
    let store = talaria_store::SqliteStore::open(&home.root.join("state.db")).unwrap();
    talaria_testkit::wait::wait_for("nothing owed", || async {
        match talaria_store::OwedTurnStore::owed_turn_count(&store).await {
            Ok(0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    gateway.kill().unwrap();
    gateway.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_prompt_cut_off_by_sigkill_is_said_lost_after_restart() {
    let llm = MockOpenAi::start().await;
    let kit = TelegramKit::start().await;
    let home = kit_home(&llm, &kit);
    let mut first = spawn_gateway(&home, &home.root.join("test-gateway.log"));
    kit.wait_connected(1).await;

    llm.push(Reply::text("Too late.").with_delay(Duration::from_secs(30)));
    kit.push_dm(Who::Friend, "/bg compare every sailing ship ever built");
    wait_for_text(&kit, "Started in the background").await;
    talaria_testkit::wait::wait_for("the background prompt at the model", || async {
        if llm.requests().is_empty() {
            Err(())
        } else {
            Ok(())
        }
    })
    .await;
    first.kill().unwrap();
    first.wait().unwrap();

    let seen = kit.connections();
    let mut second = spawn_gateway(&home, &home.root.join("test-gateway-2.log"));
    kit.wait_connected(seen + 1).await;
    let sent = wait_for_text(&kit, "result is lost").await;
    let lost: Vec<&String> = sent
        .iter()
        .map(|o| &o.text)
        .filter(|t| t.contains("result is lost"))
        .collect();
    assert_eq!(lost.len(), 1, "{sent:?}");
    assert!(
        lost[0].contains("background task") && lost[0].contains("compare every sailing ship"),
        "{}\n{}",
        lost[0],
        logs(&home)
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!texts(&kit).iter().any(|t| t.contains("Too late.")));
    second.kill().unwrap();
    second.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_with_tool_progress_on_sees_what_a_subagent_does() {
    let llm = MockOpenAi::start().await;
    let kit = TelegramKit::start().await;
    let home = kit_home(&llm, &kit);
    let config = home.root.join("config.yaml");
    let mut yaml = std::fs::read_to_string(&config).unwrap();
    yaml.push_str("display:\n  tool_progress: all\n");
    std::fs::write(&config, yaml).unwrap();
    let mut gateway = spawn_gateway(&home, &home.root.join("test-gateway.log"));
    kit.wait_connected(1).await;

    let task = serde_json::json!({"goal": "Say hello from a shell"});
    llm.push(Reply::tool_calls(vec![ToolCallReply::new(
        "call_delegate",
        "delegate_task",
        task.to_string(),
    )]));
    llm.push(Reply::tool_calls(vec![ToolCallReply::new(
        "call_child",
        "terminal",
        serde_json::json!({"command": "echo hello-from-child"}).to_string(),
    )]));
    llm.push(Reply::text("The shell said hello."));
    llm.push(Reply::text("Your subagent reports: hello."));
    kit.push_dm(Who::Friend, "have a helper say hello");
    let sent = wait_for_text(&kit, "Your subagent reports: hello.").await;
    let progress: Vec<&String> = sent
        .iter()
        .map(|o| &o.text)
        .filter(|t| t.contains("terminal:") && t.contains("echo hello-from-child"))
        .collect();
    assert_eq!(progress.len(), 1, "{sent:?}\n{}", logs(&home));
    // The progress came before the answer.
    let at = |needle: &str| sent.iter().position(|o| o.text.contains(needle));
    assert!(at("terminal:") < at("Your subagent reports"), "{sent:?}");
    gateway.kill().unwrap();
    gateway.wait().unwrap();
}
