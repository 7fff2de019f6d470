//! Scheduled jobs end to end under an injected clock: the scheduler is
//! ticked with chosen times (nothing sleeps until a job is due), runs turns
//! against the mock LLM over HTTP, keeps its records in a real SQLite file
//! and delivers through the real Telegram adapter, against a fake Bot API,
//! and the delivery ledger.
#![cfg(feature = "telegram")]

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use talaria_agent::interaction::NoHuman;
use talaria_agent::tools::Registry;
use talaria_agent::{Agent, AgentParts, NullObserver};
use talaria_core::{Config, Endpoint, Env, Home, ProviderKind, Redactor};
use talaria_gateway::Adapter;
use talaria_gateway::cron::{CronTool, JobSpec, Scheduler, SchedulerParts, Zone, jobs};
use talaria_gateway::delivery::Delivery;
use talaria_gateway::hooks::Hooks;
use talaria_gateway::ledger::Ledger;
use talaria_platforms::telegram::{TelegramAdapter, TelegramSettings};
use talaria_store::{
    CronStore, GatewayStore, JobState, LedgerStore, Misfire, NewSession, ObligationState,
    OccurrenceStatus, SessionFilter, SessionStore, SqliteStore, Trigger,
};
use talaria_testkit::{FakeTelegram, MockOpenAi, Reply, ToolCallReply};
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "123456:cron-test-token-abcdefghij";
const WAIT: Duration = Duration::from_secs(15);

/// One gateway process's worth of cron: its own store connection, agent,
/// Telegram adapter, ledger and scheduler.
struct Node {
    store: Arc<SqliteStore>,
    agent: Arc<Agent>,
    scheduler: Scheduler,
}

struct Rig {
    tg: FakeTelegram,
    llm: MockOpenAi,
    dir: tempfile::TempDir,
    home: Home,
    config: Arc<Config>,
    zone: Zone,
}

impl Rig {
    async fn new(configure: impl FnOnce(&mut Config)) -> Rig {
        let tg = FakeTelegram::start(TOKEN).await;
        let llm = MockOpenAi::start().await;
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home"));
        home.ensure().unwrap();
        let mut config = Config::default();
        config.model.default = Some("test-model".into());
        config.model.base_url = Some(llm.base_url());
        config.platforms.set("telegram.base_url", tg.base_url());
        config.agent.api_max_retries = 0;
        config.cron.timezone = Some("Europe/Berlin".into());
        configure(&mut config);
        let zone = Zone::from_config(&config.cron).unwrap();
        Rig {
            tg,
            llm,
            dir,
            home,
            config: Arc::new(config),
            zone,
        }
    }

    /// A scheduler as one gateway process builds it, with its own
    /// connections to the shared database file.
    fn node(&self) -> Node {
        let env = Env::from_pairs([("TELEGRAM_BOT_TOKEN", TOKEN)]);
        let store = Arc::new(SqliteStore::open(&self.home.state_db()).unwrap());
        let endpoint = Endpoint {
            provider: ProviderKind::Custom,
            model: "test-model".into(),
            base_url: self.llm.base_url(),
            api_key: None,
        };
        let mut registry = Registry::with_core_tools(&self.config);
        let cron_tool = CronTool::new(store.clone(), self.home.clone(), self.zone);
        registry.register(cron_tool.clone()).unwrap();
        let agent = Arc::new(Agent::new(AgentParts {
            config: self.config.clone(),
            home: self.home.clone(),
            provider: talaria_llm::provider_for(&endpoint, &self.config.agent),
            store: store.clone(),
            registry: Arc::new(registry),
            interaction: Arc::new(NoHuman),
            redactor: Redactor::default(),
            workdir: self.dir.path().to_path_buf(),
        }));
        let settings =
            TelegramSettings::from_config(&self.config.section().unwrap(), &env).unwrap();
        let adapter: Arc<dyn Adapter> = Arc::new(TelegramAdapter::new(settings).unwrap());
        let gateway_store: Arc<dyn GatewayStore> = store.clone();
        let delivery = Delivery::new(
            vec![adapter],
            Some(Ledger::new(
                gateway_store.clone(),
                talaria_store::NodeId::random(),
            )),
        )
        .with_local_dir(self.home.cron_output_dir());
        let scheduler = Scheduler::new(SchedulerParts {
            config: self.config.clone(),
            home: self.home.clone(),
            agent: agent.clone(),
            store: gateway_store,
            delivery,
            hooks: Arc::new(Hooks::load(&self.home)),
            await_hooks: true,
            backends: None,
        })
        .unwrap();
        cron_tool.bind(scheduler.clone());
        Node {
            store,
            agent,
            scheduler,
        }
    }

    async fn create(
        &self,
        node: &Node,
        spec: JobSpec,
        now: DateTime<Utc>,
    ) -> talaria_store::CronJob {
        jobs::create(node.store.as_ref(), &self.home, self.zone, spec, now)
            .await
            .unwrap()
    }

    fn memory_files(&self) -> Vec<String> {
        std::fs::read_dir(self.home.memories_dir())
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
}

fn every(schedule: &str, prompt: &str, deliver: &[&str]) -> JobSpec {
    JobSpec {
        name: None,
        prompt: Some(prompt.into()),
        skills: Vec::new(),
        schedule: schedule.into(),
        deliver: deliver.iter().map(|s| s.to_string()).collect(),
        repeat: None,
        misfire: None,
        origin: None,
    }
}

/// The last user message of LLM request `i`.
fn last_user_message(llm: &MockOpenAi, i: usize) -> String {
    llm.requests()[i].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_occurrence_is_claimed_once_across_two_schedulers_on_one_database() {
    let rig = Rig::new(|_| {}).await;
    let (a, b) = (rig.node(), rig.node());
    let t0 = at(2026, 12, 4, 12, 0);
    let job = rig
        .create(
            &a,
            every("every 30m", "Report the queue length.", &["local"]),
            t0,
        )
        .await;
    const OCCURRENCES: usize = 12;
    for i in 1..=OCCURRENCES {
        rig.llm.push(Reply::text(format!("queue length {i}")));
        let now = t0 + chrono::Duration::minutes(30 * i as i64);
        // Both schedulers tick at the same moment, on separate connections.
        let (ca, cb) = tokio::join!(a.scheduler.tick(now), b.scheduler.tick(now));
        let claims = ca.unwrap().len() + cb.unwrap().len();
        assert_eq!(claims, 1, "occurrence {i} was claimed {claims} times");
        a.scheduler.idle().await;
        b.scheduler.idle().await;
        // A late tick of the same moment finds nothing left to claim.
        assert!(a.scheduler.tick(now).await.unwrap().is_empty());
    }
    assert_eq!(rig.llm.requests().len(), OCCURRENCES);
    let runs = a.store.occurrences(&job.id, 100).await.unwrap();
    assert_eq!(runs.len(), OCCURRENCES);
    assert!(
        runs.iter().all(|r| r.status == OccurrenceStatus::Ok),
        "{runs:?}"
    );
    let sessions = a
        .store
        .list_sessions(SessionFilter {
            source: Some("cron".into()),
            ..SessionFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(sessions.len(), OCCURRENCES);
    let outputs = std::fs::read_dir(rig.home.cron_output_dir().join(&job.id))
        .unwrap()
        .count();
    assert_eq!(outputs, OCCURRENCES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_downtime_skip_records_the_miss_and_run_once_runs_late_once() {
    let rig = Rig::new(|_| {}).await;
    let node = rig.node();
    let t0 = at(2026, 12, 4, 12, 0);
    let mut skip = every("every 1h", "Hourly skip job.", &["telegram:501"]);
    skip.name = Some("skipper".into());
    skip.misfire = Some(Misfire::Skip);
    let mut once = every("every 1h", "Hourly catch-up job.", &["telegram:502"]);
    once.name = Some("catcher".into());
    once.misfire = Some(Misfire::RunOnce);
    let skip = rig.create(&node, skip, t0).await;
    let once = rig.create(&node, once, t0).await;

    // Down from 12:00 until 17:10: five hourly occurrences were missed.
    rig.llm.push(Reply::text("caught up"));
    let now = at(2026, 12, 4, 17, 10);
    let claimed = node.scheduler.tick(now).await.unwrap();
    node.scheduler.idle().await;
    assert_eq!(claimed.len(), 2, "{claimed:?}");
    let status = |id: &str| claimed.iter().find(|c| c.job_id == id).unwrap().status;
    assert_eq!(status(&skip.id), OccurrenceStatus::Missed);
    assert_eq!(status(&once.id), OccurrenceStatus::Running);
    // One model call in all: the catch-up ran once, the skipped job not at all.
    assert_eq!(rig.llm.requests().len(), 1);
    assert!(last_user_message(&rig.llm, 0).contains("Hourly catch-up job."));
    let sent = rig.tg.wait_for_sent(1, WAIT).await;
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].chat_id, 502);
    assert!(
        sent[0].rendered().contains("late"),
        "{}",
        sent[0].rendered()
    );
    // Both move on to the next slot after now, keeping their phase.
    for id in [&skip.id, &once.id] {
        let job = node.store.job(id).await.unwrap().unwrap();
        assert_eq!(job.next_run_at, Some(at(2026, 12, 4, 18, 0).timestamp()));
    }
    let missed = node.store.occurrences(&skip.id, 10).await.unwrap();
    assert_eq!(missed.len(), 1);
    assert_eq!(missed[0].status, OccurrenceStatus::Missed);
    assert_eq!(missed[0].scheduled_at, at(2026, 12, 4, 13, 0).timestamp());
    assert_eq!(
        node.store.job(&skip.id).await.unwrap().unwrap().completed,
        0,
        "a miss is not a run"
    );

    // Back on time at 18:00: both run, neither is late.
    rig.llm.push(Reply::text("on time A"));
    rig.llm.push(Reply::text("on time B"));
    let claimed = node.scheduler.tick(at(2026, 12, 4, 18, 0)).await.unwrap();
    node.scheduler.idle().await;
    assert_eq!(claimed.len(), 2);
    assert!(
        claimed
            .iter()
            .all(|c| c.status == OccurrenceStatus::Running)
    );
    let sent = rig.tg.wait_for_sent(3, WAIT).await;
    assert!(sent[1..].iter().all(|s| !s.rendered().contains("late")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cron_expressions_follow_the_configured_zone_across_a_dst_change() {
    let rig = Rig::new(|c| c.cron.timezone = Some("America/New_York".into())).await;
    let node = rig.node();
    // New York moves to summer time on 2027-03-14.
    let created = at(2027, 3, 12, 20, 0);
    let job = rig
        .create(
            &node,
            every("0 9 * * *", "Morning digest.", &["local"]),
            created,
        )
        .await;
    // 09:00 EST is 14:00 UTC.
    assert_eq!(job.next_run_at, Some(at(2027, 3, 13, 14, 0).timestamp()));
    assert!(
        node.scheduler
            .tick(at(2027, 3, 13, 13, 59))
            .await
            .unwrap()
            .is_empty()
    );
    let mut runs = Vec::new();
    for _ in 0..3 {
        rig.llm.push(Reply::text("digest"));
        let due = node
            .store
            .job(&job.id)
            .await
            .unwrap()
            .unwrap()
            .next_run_at
            .unwrap();
        let now = DateTime::from_timestamp(due, 0).unwrap();
        assert_eq!(node.scheduler.tick(now).await.unwrap().len(), 1);
        node.scheduler.idle().await;
        runs.push(now);
    }
    // 09:00 local each day: 14:00 UTC before the change, 13:00 UTC after.
    assert_eq!(
        runs,
        [
            at(2027, 3, 13, 14, 0),
            at(2027, 3, 14, 13, 0),
            at(2027, 3, 15, 13, 0)
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_answer_is_kept_but_delivered_nowhere() {
    let rig = Rig::new(|_| {}).await;
    let node = rig.node();
    let t0 = at(2026, 12, 4, 12, 0);
    let job = rig
        .create(
            &node,
            every(
                "every 1h",
                "Tell me only if the site is down.",
                &["telegram:900"],
            ),
            t0,
        )
        .await;
    rig.llm.push(Reply::text("Everything is fine.\n\n[SILENT]"));
    rig.llm.push(Reply::text("The site is DOWN."));
    node.scheduler.tick(at(2026, 12, 4, 13, 0)).await.unwrap();
    node.scheduler.idle().await;
    let runs = node.store.occurrences(&job.id, 10).await.unwrap();
    assert_eq!(runs[0].status, OccurrenceStatus::Silent);
    let output = std::fs::read_to_string(runs[0].output_path.as_ref().unwrap()).unwrap();
    assert!(output.contains("[SILENT]"), "{output}");
    assert_eq!(node.store.obligation_counts().await.unwrap().len(), 0);

    // The next run speaks, and only it reaches the chat: the fake has seen
    // exactly one message once that one has arrived.
    node.scheduler.tick(at(2026, 12, 4, 14, 0)).await.unwrap();
    node.scheduler.idle().await;
    let sent = rig.tg.wait_for_sent(1, WAIT).await;
    assert_eq!(sent.len(), 1);
    assert!(sent[0].rendered().contains("The site is DOWN."));
    assert_eq!(rig.tg.send_attempts().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_reaches_telegram_through_the_ledger_and_is_saved() {
    let rig = Rig::new(|_| {}).await;
    let node = rig.node();
    let t0 = at(2026, 12, 4, 12, 0);
    let mut spec = every(
        "every 1d",
        "Summarise the news.",
        &["telegram:4242:7", "local"],
    );
    spec.name = Some("news".into());
    let job = rig.create(&node, spec, t0).await;
    rig.llm.push(Reply::text("Three things happened."));
    node.scheduler.tick(at(2026, 12, 5, 12, 0)).await.unwrap();
    node.scheduler.idle().await;

    let sent = rig.tg.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].chat_id, 4242);
    assert_eq!(sent[0].thread_id, Some(7));
    let text = sent[0].rendered();
    assert!(
        text.contains("news") && text.contains("Three things happened."),
        "{text}"
    );
    let counts = node.store.obligation_counts().await.unwrap();
    assert_eq!(
        counts.get(&ObligationState::Delivered),
        Some(&1),
        "{counts:?}"
    );
    assert_eq!(counts.len(), 1, "{counts:?}");
    let run = &node.store.occurrences(&job.id, 1).await.unwrap()[0];
    assert_eq!(run.status, OccurrenceStatus::Ok);
    assert_eq!(run.delivery_error, None);
    let saved = std::fs::read_to_string(run.output_path.as_ref().unwrap()).unwrap();
    assert!(saved.contains("Three things happened."));
    assert!(
        run.output_path
            .as_ref()
            .unwrap()
            .ends_with("2026-12-05_12-00-00.md")
    );
    let job = node.store.job(&job.id).await.unwrap().unwrap();
    assert_eq!(job.last_status, Some(OccurrenceStatus::Ok));
    assert_eq!(job.completed, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_its_own_session_and_cannot_touch_memory_or_chats() {
    let rig = Rig::new(|_| {}).await;
    let node = rig.node();
    // A chat conversation that already exists.
    let chat = node
        .agent
        .start_session(NewSession {
            source: "telegram".into(),
            chat_id: Some("555".into()),
            session_key: Some("agent:main:telegram:dm:555".into()),
            ..NewSession::default()
        })
        .await
        .unwrap();
    rig.llm.push(Reply::text("hello there"));
    node.agent
        .run_turn(&chat, "hi", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    let chat_rows = node.store.messages(&chat.id).await.unwrap().len();

    let t0 = at(2026, 12, 4, 12, 0);
    let job = rig
        .create(
            &node,
            every("every 1h", "Note that the user likes tea.", &["local"]),
            t0,
        )
        .await;
    // The model tries to write memory anyway.
    rig.llm.push(Reply::tool_calls(vec![ToolCallReply::new(
        "c1",
        "memory",
        r#"{"action":"add","target":"user","content":"likes tea"}"#,
    )]));
    rig.llm.push(Reply::text("I could not save that."));
    node.scheduler.tick(at(2026, 12, 4, 13, 0)).await.unwrap();
    node.scheduler.idle().await;

    // The run's request offered neither memory nor cronjob.
    let request = &rig.llm.requests()[1].body;
    let tools: Vec<&str> = request["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(
        !tools.contains(&"memory") && !tools.contains(&"cronjob"),
        "{tools:?}"
    );
    assert!(tools.contains(&"terminal"));
    // The call was refused and nothing was written to memory.
    assert!(
        rig.memory_files().iter().all(|f| !f.ends_with(".md")),
        "{:?}",
        rig.memory_files()
    );
    // The run lives in its own session...
    let run = &node.store.occurrences(&job.id, 1).await.unwrap()[0];
    let session_id = run.session_id.clone().unwrap();
    assert_eq!(session_id, format!("cron_{}_20261204_130000", job.id));
    let session = node.store.session(&session_id).await.unwrap().unwrap();
    assert_eq!(session.source, "cron");
    assert_eq!(session.chat_id, None);
    let rows = node.store.messages(&session_id).await.unwrap();
    assert!(
        rows[0]
            .message
            .content
            .contains("Note that the user likes tea.")
    );
    // ...and the chat's history is as it was.
    assert_eq!(
        node.store.messages(&chat.id).await.unwrap().len(),
        chat_rows
    );
    // The chat's own turn did offer memory (the agent is not crippled).
    let chat_tools = rig.llm.requests()[0].body["tools"].to_string();
    assert!(chat_tools.contains("\"memory\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_run_delivers_a_short_error_and_repeat_limits_runs() {
    let rig = Rig::new(|_| {}).await;
    let node = rig.node();
    let t0 = at(2026, 12, 4, 12, 0);
    let mut spec = every("every 1h", "Check the backups.", &["telegram:77"]);
    spec.repeat = Some(2);
    spec.name = Some("backups".into());
    let job = rig.create(&node, spec, t0).await;
    rig.llm.push(Reply::error(
        400,
        r#"{"error":{"message":"model exploded"}}"#,
    ));
    node.scheduler.tick(at(2026, 12, 4, 13, 0)).await.unwrap();
    node.scheduler.idle().await;
    let sent = rig.tg.wait_for_sent(1, WAIT).await;
    let text = sent[0].rendered();
    assert!(
        text.contains("backups") && text.contains("failed"),
        "{text}"
    );
    assert!(text.chars().count() < 600, "{text}");
    let run = &node.store.occurrences(&job.id, 1).await.unwrap()[0];
    assert_eq!(run.status, OccurrenceStatus::Failed);
    assert!(run.error.is_some());

    rig.llm.push(Reply::text("Backups are fine."));
    node.scheduler.tick(at(2026, 12, 4, 14, 0)).await.unwrap();
    node.scheduler.idle().await;
    let job = node.store.job(&job.id).await.unwrap().unwrap();
    assert_eq!(job.completed, 2);
    assert_eq!(job.state, JobState::Completed);
    assert_eq!(job.next_run_at, None);
    assert!(
        node.scheduler
            .tick(at(2026, 12, 4, 15, 0))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(rig.llm.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_run_leaves_the_schedule_alone() {
    let rig = Rig::new(|_| {}).await;
    let node = rig.node();
    let t0 = at(2026, 12, 4, 12, 0);
    let job = rig
        .create(&node, every("every 1d", "Daily report.", &["local"]), t0)
        .await;
    rig.llm.push(Reply::text("manual report"));
    let report = node
        .scheduler
        .run_now(&job.name, at(2026, 12, 4, 15, 30))
        .await
        .unwrap();
    assert_eq!(report.status, OccurrenceStatus::Ok);
    assert_eq!(report.answer, "manual report");
    let after = node.store.job(&job.id).await.unwrap().unwrap();
    assert_eq!(after.next_run_at, job.next_run_at);
    assert_eq!(after.completed, 0);
    let runs = node.store.occurrences(&job.id, 5).await.unwrap();
    assert_eq!(runs[0].trigger, Trigger::Manual);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cronjob_tool_schedules_a_job_that_answers_in_the_chat_it_was_made_in() {
    let rig = Rig::new(|_| {}).await;
    let node = rig.node();
    let chat = node
        .agent
        .start_session(NewSession {
            source: "telegram".into(),
            chat_id: Some("31337".into()),
            thread_id: Some("12".into()),
            session_key: Some("agent:main:telegram:group:31337:12".into()),
            ..NewSession::default()
        })
        .await
        .unwrap();
    rig.llm.push(Reply::tool_calls(vec![ToolCallReply::new(
        "c1",
        "cronjob",
        r#"{"action":"create","name":"stretch","prompt":"Remind me to stretch.","schedule":"every 2h"}"#,
    )]));
    rig.llm.push(Reply::text("Done: every two hours."));
    node.agent
        .run_turn(
            &chat,
            "remind me to stretch every 2 hours",
            &NullObserver,
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let jobs = node.store.jobs().await.unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let job = &jobs[0];
    assert_eq!(job.name, "stretch");
    assert_eq!(job.deliver, ["origin"]);
    let origin = job.origin.clone().unwrap();
    assert_eq!(
        (
            origin.platform.as_str(),
            origin.chat_id.as_str(),
            origin.thread_id.as_deref()
        ),
        ("telegram", "31337", Some("12"))
    );

    // Its first run goes back to that chat and topic.
    rig.llm.push(Reply::text("Time to stretch!"));
    let due = DateTime::from_timestamp(job.next_run_at.unwrap(), 0).unwrap();
    node.scheduler.tick(due).await.unwrap();
    node.scheduler.idle().await;
    let sent = rig.tg.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].chat_id, 31337);
    assert_eq!(sent[0].thread_id, Some(12));
    assert!(sent[0].rendered().contains("Time to stretch!"));

    // A schedule it cannot read is refused with the forms it can, and
    // nothing is created.
    rig.llm.push(Reply::tool_calls(vec![ToolCallReply::new(
        "c2",
        "cronjob",
        r#"{"action":"create","prompt":"Ping.","schedule":"every 5 seconds"}"#,
    )]));
    rig.llm.push(Reply::text("That did not work."));
    node.agent
        .run_turn(
            &chat,
            "ping me constantly",
            &NullObserver,
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let last = rig.llm.requests().last().unwrap().body["messages"].clone();
    let result = last
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .unwrap()["content"]
        .to_string();
    assert!(result.contains("every 30m"), "{result}");
    assert_eq!(node.store.jobs().await.unwrap().len(), 1);
}

/// The tool results of the last LLM request, in order.
fn tool_results(llm: &MockOpenAi) -> Vec<serde_json::Value> {
    llm.requests().last().unwrap().body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            let text = m["content"].as_str().unwrap_or_default();
            serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.into()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cronjob_tool_lists_updates_pauses_resumes_and_removes() {
    let rig = Rig::new(|_| {}).await;
    let node = rig.node();
    let chat = node.agent.new_session("cli").await.unwrap();
    let t0 = chrono::Utc::now();
    let mut spec = every("every 1h", "Water the plants.", &["local"]);
    spec.name = Some("plants".into());
    let job = rig.create(&node, spec, t0).await;

    let call = |id: &str, args: &str| ToolCallReply::new(id, "cronjob", args);
    // Each call runs in order in one batch (the tool is not parallel-safe).
    rig.llm.push(Reply::tool_calls(vec![
        call("1", r#"{"action":"update","job_id":"plants","schedule":"0 7 * * *","prompt":"Water the plants and the herbs."}"#),
        call("2", r#"{"action":"pause","job_id":"plants"}"#),
        call("3", r#"{"action":"list"}"#),
        call("4", r#"{"action":"resume","job_id":"plants"}"#),
        call("5", r#"{"action":"pause","job_id":"nope"}"#),
        call("6", r#"{"action":"explode"}"#),
    ]));
    rig.llm.push(Reply::text("Done."));
    node.agent
        .run_turn(
            &chat,
            "manage my jobs",
            &NullObserver,
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let results = tool_results(&rig.llm);
    assert_eq!(results.len(), 6, "{results:?}");
    assert_eq!(results[0]["job"]["schedule"], "0 7 * * *");
    assert_eq!(
        results[0]["job"]["prompt"],
        "Water the plants and the herbs."
    );
    assert_eq!(results[1]["job"]["state"], "paused");
    assert_eq!(results[2]["count"], 1);
    assert_eq!(results[2]["jobs"][0]["state"], "paused");
    assert_eq!(results[3]["job"]["state"], "scheduled");
    assert!(
        results[4].to_string().contains("no cron job"),
        "{}",
        results[4]
    );
    assert!(
        results[5].to_string().contains("unknown action"),
        "{}",
        results[5]
    );
    let stored = node.store.job(&job.id).await.unwrap().unwrap();
    assert_eq!(stored.state, JobState::Scheduled);
    assert_eq!(stored.schedule, "0 7 * * *");
    // A chat outside any platform has no origin: its jobs cannot say
    // `origin`, and the refusal says what to use instead.
    rig.llm.push(Reply::tool_calls(vec![
        call(
            "7",
            r#"{"action":"create","prompt":"x","schedule":"every 1d","deliver":"origin"}"#,
        ),
        call("8", r#"{"action":"remove","job_id":"plants"}"#),
    ]));
    rig.llm.push(Reply::text("Removed."));
    node.agent
        .run_turn(&chat, "remove it", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    let results = tool_results(&rig.llm);
    let refused = results[results.len() - 2].to_string();
    assert!(refused.contains("`origin` means the chat"), "{refused}");
    assert_eq!(results[results.len() - 1]["removed"], "plants");
    assert!(node.store.jobs().await.unwrap().is_empty());
}
