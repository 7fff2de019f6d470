//! Background processes: `terminal(background=true)` and the `process`
//! tool, with real processes on the local backend (and one in the
//! bubblewrap sandbox), and a `Reports` that records what it is told.

use crate::tools_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use talaria_agent::background::{JobKind, JobReport, JobStart, Reports, ReportsSlot};
use talaria_agent::processes::ProcessRegistry;
use talaria_agent::tools::process::ProcessTool;
use talaria_agent::tools::terminal::TerminalTool;
use talaria_agent::tools::{Tool, ToolContext};
use talaria_core::Config;
use tools_support::{Env, Scripted, json};

/// Long enough for anything here to happen; only a bound on waiting.
const WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq)]
enum Event {
    Opened(JobStart),
    Progress(String, String),
    Closed(String, JobReport),
    Dropped(String),
}

/// A front end that records every report.
#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<Event>>,
}

impl Recorder {
    fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    /// Waits (boundedly) until an event satisfies `pred`.
    async fn until(&self, what: &str, pred: impl Fn(&Event) -> bool) -> Event {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(e) = self.events().into_iter().find(|e| pred(e)) {
                return e;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {what} came: {:?}",
                self.events()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[async_trait]
impl Reports for Recorder {
    async fn opened(&self, job: &JobStart) -> Result<(), String> {
        self.events.lock().unwrap().push(Event::Opened(job.clone()));
        Ok(())
    }
    async fn progress(&self, job: &JobStart, text: &str) {
        self.events
            .lock()
            .unwrap()
            .push(Event::Progress(job.id.clone(), text.to_owned()));
    }
    async fn closed(&self, job: &JobStart, report: JobReport) {
        self.events
            .lock()
            .unwrap()
            .push(Event::Closed(job.id.clone(), report));
    }
    async fn dropped(&self, job: &JobStart) {
        self.events
            .lock()
            .unwrap()
            .push(Event::Dropped(job.id.clone()));
    }
}

struct Rig {
    env: Env,
    registry: ProcessRegistry,
    reports: Arc<Recorder>,
    terminal: TerminalTool,
    process: ProcessTool,
}

impl Rig {
    fn new() -> Rig {
        Rig::with(Config::default(), true)
    }

    fn with(config: Config, bound: bool) -> Rig {
        let env = Env::with(config, Scripted::with(&[]));
        let reports = Arc::new(Recorder::default());
        let slot = ReportsSlot::new();
        if bound {
            slot.bind(reports.clone());
        }
        let registry = ProcessRegistry::new(&env.ctx.home, slot);
        Rig {
            terminal: TerminalTool::with_processes(registry.clone()),
            process: ProcessTool::new(registry.clone()),
            env,
            registry,
            reports,
        }
    }

    /// A context for another session of the same front end.
    fn session(&self, id: &str) -> ToolContext {
        let mut ctx = self.env.ctx.clone();
        ctx.session_id = id.to_owned();
        ctx
    }

    async fn start_in(&self, ctx: &ToolContext, args: Value) -> Value {
        let out = self.terminal.call(args, ctx).await.unwrap();
        json(&out)
    }

    async fn start(&self, args: Value) -> (String, Value) {
        let out = self.start_in(&self.env.ctx, args).await;
        let id = out["session_id"]
            .as_str()
            .unwrap_or_else(|| panic!("no process id: {out}"))
            .to_owned();
        (id, out)
    }

    async fn process_in(&self, ctx: &ToolContext, args: Value) -> Result<Value, String> {
        self.process
            .call(args, ctx)
            .await
            .map(|o| json(&o))
            .map_err(|e| e.0)
    }

    async fn process(&self, args: Value) -> Value {
        let ctx = self.env.ctx.clone();
        self.process_in(&ctx, args.clone())
            .await
            .unwrap_or_else(|e| panic!("{args}: {e}"))
    }

    /// Waits for `id` to end and returns `wait`'s answer.
    async fn wait(&self, id: &str) -> Value {
        let out = self
            .process(json!({"action": "wait", "session_id": id, "timeout": WAIT.as_secs()}))
            .await;
        assert_ne!(out["status"], "running", "{out}");
        out
    }

    /// Polls `id` until its output so far holds `text`; returns it all.
    async fn output_until(&self, id: &str, text: &str) -> String {
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut seen = String::new();
        loop {
            let out = self
                .process(json!({"action": "poll", "session_id": id}))
                .await;
            seen.push_str(out["output"].as_str().unwrap_or_default());
            if seen.contains(text) {
                return seen;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{text:?} never showed: {seen}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn pid_alive(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // A zombie is dead, just not yet reaped.
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

async fn gone(pid: &str) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT;
    while pid_alive(pid) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    !pid_alive(pid)
}

/// The word after `label` in `text`.
fn word_after(text: &str, label: &str) -> String {
    text.split(label)
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no {label:?} in {text}"))
        .to_owned()
}

#[tokio::test]
async fn a_background_command_returns_at_once_and_reports_its_end() {
    let rig = Rig::new();
    let (id, out) = rig
        .start(json!({"command": "sleep 2 && echo done", "background": true, "notify_on_complete": true}))
        .await;
    assert!(id.starts_with("proc_") && id.len() == 17, "{out}");
    assert_eq!(out["status"], "running", "{out}");
    assert_eq!(out["notify_on_complete"], true, "{out}");
    // The call came back while the command still sleeps: only the opening
    // is known.
    let events = rig.reports.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let Event::Opened(job) = &events[0] else {
        panic!("{events:?}")
    };
    assert_eq!(job.id, id);
    assert_eq!(job.kind, JobKind::Process);
    assert_eq!(job.session_id, rig.env.ctx.session_id);
    assert!(job.title.contains("sleep 2"), "{job:?}");

    let closed = rig
        .reports
        .until("closing", |e| matches!(e, Event::Closed(..)))
        .await;
    let Event::Closed(closed_id, report) = closed else {
        unreachable!()
    };
    assert_eq!(closed_id, id);
    assert!(report.text.contains("done"), "{}", report.text);
    assert!(report.text.contains("exit 0"), "{}", report.text);
    assert!(report.text.starts_with('✅'), "{}", report.text);
    let follow = report.follow_up.expect("a follow-up was asked for");
    assert!(follow.contains(&id) && follow.contains("done"), "{follow}");
    assert!(
        !rig.reports
            .events()
            .iter()
            .any(|e| matches!(e, Event::Dropped(_))),
        "{:?}",
        rig.reports.events()
    );

    let log = rig
        .process(json!({"action": "log", "session_id": id}))
        .await;
    assert_eq!(log["output"], "done", "{log}");
    assert_eq!(log["total_lines"], 1, "{log}");
    let poll = rig
        .process(json!({"action": "poll", "session_id": id}))
        .await;
    assert_eq!(poll["status"], "exited", "{poll}");
    assert_eq!(poll["exit_code"], 0, "{poll}");
    let waited = rig.wait(&id).await;
    assert_eq!(waited["exit_code"], 0, "{waited}");
    // The log is a file under the home.
    let file = rig
        .env
        .ctx
        .home
        .root()
        .join("processes")
        .join(format!("{id}.log"));
    assert_eq!(std::fs::read_to_string(file).unwrap(), "done\n");
}

#[tokio::test]
async fn a_failing_command_is_reported_as_failed_with_its_code() {
    let rig = Rig::new();
    let (id, _) = rig
        .start(
            json!({"command": "echo oops; exit 3", "background": true, "notify_on_complete": true}),
        )
        .await;
    let Event::Closed(_, report) = rig
        .reports
        .until("closing", |e| matches!(e, Event::Closed(..)))
        .await
    else {
        unreachable!()
    };
    assert!(report.text.starts_with('❌'), "{}", report.text);
    assert!(report.text.contains("exit 3") && report.text.contains("oops"));
    assert_eq!(rig.wait(&id).await["exit_code"], 3);
}

#[tokio::test]
async fn process_kill_ends_a_long_command_and_everything_it_started() {
    let rig = Rig::new();
    let (id, out) = rig
        .start(json!({
            "command": "echo top $$; sh -c 'sleep 600 & echo kid $!; sleep 600'",
            "background": true,
            "notify_on_complete": true
        }))
        .await;
    let shell = out["pid"].as_u64().expect("a local process has a pid");
    let seen = rig.output_until(&id, "kid ").await;
    assert_eq!(word_after(&seen, "top "), shell.to_string(), "{seen}");
    let kid = word_after(&seen, "kid ");
    assert!(pid_alive(&kid), "{seen}");

    let killed = rig
        .process(json!({"action": "kill", "session_id": id}))
        .await;
    assert_eq!(killed["status"], "killed", "{killed}");
    assert!(gone(&shell.to_string()).await, "the shell survived");
    assert!(gone(&kid).await, "the background sleep survived");
    let events = rig.reports.events();
    assert!(events.contains(&Event::Dropped(id.clone())), "{events:?}");
    assert!(
        !events.iter().any(|e| matches!(e, Event::Closed(..))),
        "{events:?}"
    );
    let listed = rig.process(json!({"action": "list"})).await;
    assert_eq!(listed["processes"][0]["status"], "killed", "{listed}");
}

#[tokio::test]
async fn the_session_limit_refuses_with_a_way_out_and_a_reset_frees_it() {
    let mut config = Config::default();
    config.terminal.background.max_per_session = 2;
    config.terminal.background.max_total = 3;
    let rig = Rig::with(config, true);
    let long = json!({"command": "sleep 600", "background": true});
    let mut pids = Vec::new();
    for _ in 0..2 {
        let (_, out) = rig.start(long.clone()).await;
        pids.push(out["pid"].as_u64().unwrap().to_string());
    }
    let refused = rig
        .terminal
        .call(long.clone(), &rig.env.ctx)
        .await
        .unwrap_err()
        .0;
    assert!(
        refused.contains("terminal.background.max_per_session (2)"),
        "{refused}"
    );
    assert!(refused.contains("action=\"kill\""), "{refused}");

    // Another session has slots of its own, up to the total.
    let other = rig.session("another-session");
    let out = rig.start_in(&other, long.clone()).await;
    assert_eq!(out["status"], "running", "{out}");
    let refused = rig.terminal.call(long.clone(), &other).await.unwrap_err().0;
    assert!(
        refused.contains("terminal.background.max_total (3)"),
        "{refused}"
    );

    // The reset kills the first session's, and only those.
    let killed = rig.registry.kill_session(&rig.env.ctx.session_id).await;
    assert_eq!(killed, 2);
    for pid in &pids {
        assert!(gone(pid).await, "{pid} survived the reset");
    }
    let other_pid = out["pid"].as_u64().unwrap().to_string();
    assert!(pid_alive(&other_pid));
    let (_, again) = rig.start(long.clone()).await;
    assert_eq!(again["status"], "running", "{again}");
    assert_eq!(rig.registry.kill_all().await, 2);
    assert!(gone(&other_pid).await);
}

#[tokio::test]
async fn stdin_answers_a_prompt_and_closing_it_ends_the_input() {
    let rig = Rig::new();
    let (id, _) = rig
        .start(json!({"command": "read x; echo got $x", "background": true}))
        .await;
    let sent = rig
        .process(json!({"action": "submit", "session_id": id, "data": "hello"}))
        .await;
    assert_eq!(sent["bytes_written"], 6, "{sent}");
    let done = rig.wait(&id).await;
    assert_eq!(done["exit_code"], 0, "{done}");
    assert!(
        done["output"].as_str().unwrap().contains("got hello"),
        "{done}"
    );

    let (id, _) = rig
        .start(json!({"command": "cat; echo end", "background": true}))
        .await;
    rig.process(json!({"action": "write", "session_id": id, "data": "abc"}))
        .await;
    rig.process(json!({"action": "close", "session_id": id}))
        .await;
    let done = rig.wait(&id).await;
    assert_eq!(done["output"], "abcend\n", "{done}");
    let e = rig
        .process_in(
            &rig.env.ctx,
            json!({"action": "write", "session_id": id, "data": "late"}),
        )
        .await
        .unwrap_err();
    assert!(e.contains("ended"), "{e}");
}

#[tokio::test]
async fn a_pty_gives_the_command_a_terminal_and_none_is_given_otherwise() {
    let rig = Rig::new();
    let (id, _) = rig
        .start(json!({"command": "tty", "background": true, "pty": true}))
        .await;
    let done = rig.wait(&id).await;
    assert!(
        done["output"].as_str().unwrap().contains("/dev/pts/"),
        "{done}"
    );
    let (id, _) = rig
        .start(json!({"command": "tty", "background": true}))
        .await;
    let done = rig.wait(&id).await;
    assert!(
        done["output"].as_str().unwrap().contains("not a tty"),
        "{done}"
    );
    // In the foreground too.
    let out = json(
        &rig.terminal
            .call(json!({"command": "tty", "pty": true}), &rig.env.ctx)
            .await
            .unwrap(),
    );
    assert!(
        out["output"].as_str().unwrap().contains("/dev/pts/"),
        "{out}"
    );
    // A prompt on a terminal is answered with Enter.
    let (id, _) = rig
        .start(json!({"command": "read x; echo got $x", "background": true, "pty": true}))
        .await;
    rig.process(json!({"action": "submit", "session_id": id, "data": "typed"}))
        .await;
    let done = rig.wait(&id).await;
    assert!(
        done["output"].as_str().unwrap().contains("got typed"),
        "{done}"
    );
}

#[tokio::test]
async fn a_watched_line_is_reported_once_within_the_cooldown() {
    let rig = Rig::new();
    let (id, out) = rig
        .start(json!({
            "command": "echo starting; echo server READY on 8080; echo READY again; echo bye",
            "background": true,
            "watch_patterns": ["READY"]
        }))
        .await;
    assert_eq!(out["watch_patterns"], json!(["READY"]), "{out}");
    rig.wait(&id).await;
    // Its end was not asked about: the job is settled without a notice.
    rig.reports
        .until("dropping", |e| matches!(e, Event::Dropped(_)))
        .await;
    let events = rig.reports.events();
    let progress: Vec<&String> = events
        .iter()
        .filter_map(|e| match e {
            Event::Progress(pid, text) if *pid == id => Some(text),
            _ => None,
        })
        .collect();
    assert_eq!(progress.len(), 1, "{events:?}");
    assert!(progress[0].contains("server READY on 8080"), "{progress:?}");
    assert!(matches!(events[0], Event::Opened(_)), "{events:?}");
    assert!(
        !events.iter().any(|e| matches!(e, Event::Closed(..))),
        "{events:?}"
    );
}

#[tokio::test]
async fn notify_on_complete_wins_over_watch_patterns() {
    let rig = Rig::new();
    let (id, out) = rig
        .start(json!({
            "command": "echo READY",
            "background": true,
            "notify_on_complete": true,
            "watch_patterns": ["READY"]
        }))
        .await;
    assert!(out.get("watch_patterns").is_none(), "{out}");
    assert!(
        out["note"]
            .as_str()
            .unwrap()
            .contains("watch_patterns was dropped"),
        "{out}"
    );
    rig.reports
        .until("closing", |e| matches!(e, Event::Closed(..)))
        .await;
    assert!(
        !rig.reports
            .events()
            .iter()
            .any(|e| matches!(e, Event::Progress(p, _) if *p == id)),
        "{:?}",
        rig.reports.events()
    );
}

#[tokio::test]
async fn a_notice_is_refused_when_nothing_delivers_it() {
    let rig = Rig::with(Config::default(), false);
    let e = rig
        .terminal
        .call(
            json!({"command": "true", "background": true, "notify_on_complete": true}),
            &rig.env.ctx,
        )
        .await
        .unwrap_err()
        .0;
    assert!(e.contains("without notify_on_complete"), "{e}");
    assert_eq!(
        rig.process(json!({"action": "list"})).await["processes"],
        json!([])
    );
    // Without one asked for, it runs.
    let (id, _) = rig
        .start(json!({"command": "echo fine", "background": true}))
        .await;
    assert_eq!(rig.wait(&id).await["output"], "fine\n");
}

#[tokio::test]
async fn another_session_can_neither_see_nor_kill_a_process() {
    let rig = Rig::new();
    let (id, out) = rig
        .start(json!({"command": "sleep 600", "background": true}))
        .await;
    let pid = out["pid"].as_u64().unwrap().to_string();
    let other = rig.session("someone-else");
    let listed = rig
        .process_in(&other, json!({"action": "list"}))
        .await
        .unwrap();
    assert_eq!(listed["processes"], json!([]), "{listed}");
    for action in ["poll", "log", "kill", "wait", "close"] {
        let e = rig
            .process_in(
                &other,
                json!({"action": action, "session_id": id, "timeout": 1}),
            )
            .await
            .unwrap_err();
        assert!(e.contains("no background process"), "{action}: {e}");
    }
    let e = rig
        .process_in(
            &other,
            json!({"action": "submit", "session_id": id, "data": "x"}),
        )
        .await
        .unwrap_err();
    assert!(e.contains("no background process"), "{e}");
    assert!(pid_alive(&pid));
    let mine = rig.process(json!({"action": "list"})).await;
    assert_eq!(mine["processes"][0]["session_id"], id.as_str(), "{mine}");
    assert_eq!(mine["processes"][0]["status"], "running", "{mine}");
    rig.process(json!({"action": "kill", "session_id": id}))
        .await;
    assert!(gone(&pid).await);
}

#[tokio::test]
async fn bad_arguments_get_clear_errors() {
    let rig = Rig::new();
    for (args, needle) in [
        (json!({}), "action"),
        (json!({"action": "explode"}), "unknown action"),
        (json!({"action": "poll"}), "session_id"),
        (
            json!({"action": "poll", "session_id": "proc_000000000000"}),
            "no background process",
        ),
        (
            json!({"action": "log", "session_id": "x", "limit": 0}),
            "limit",
        ),
        (json!({"action": "write", "session_id": "x"}), "data"),
    ] {
        let e = rig
            .process_in(&rig.env.ctx, args.clone())
            .await
            .unwrap_err();
        assert!(e.contains(needle), "{args}: {e}");
    }
    let e = rig
        .terminal
        .call(
            json!({"command": "true", "background": true, "watch_patterns": [1]}),
            &rig.env.ctx,
        )
        .await
        .unwrap_err()
        .0;
    assert!(e.contains("watch_patterns"), "{e}");
    // Without a registry, background is refused rather than run in front.
    let e = TerminalTool::default()
        .call(json!({"command": "true", "background": true}), &rig.env.ctx)
        .await
        .unwrap_err()
        .0;
    assert!(e.contains("background processes are not available"), "{e}");
}

#[tokio::test]
async fn log_pages_through_a_long_output() {
    let rig = Rig::new();
    let (id, _) = rig
        .start(json!({"command": "seq 1 500", "background": true}))
        .await;
    rig.wait(&id).await;
    let tail = rig
        .process(json!({"action": "log", "session_id": id}))
        .await;
    assert_eq!(tail["total_lines"], 500);
    assert_eq!(tail["lines"], 200);
    assert!(
        tail["output"].as_str().unwrap().starts_with("301\n"),
        "{tail}"
    );
    let page = rig
        .process(json!({"action": "log", "session_id": id, "offset": 10, "limit": 3}))
        .await;
    assert_eq!(page["output"], "11\n12\n13", "{page}");
}

#[tokio::test]
async fn a_background_command_runs_in_the_sandbox_backend() {
    assert!(
        talaria_exec::find_program("bwrap").is_some(),
        "bubblewrap (bwrap) is not installed: scripts/test installs it"
    );
    let mut rig = Rig::new();
    let backends = talaria_exec::Backends::new(
        &rig.env.ctx.config.terminal,
        &rig.env.ctx.home,
        rig.env.work(),
    );
    rig.env.ctx.execution = talaria_agent::Execution::for_conversation(
        &backends,
        talaria_exec::Trust::Untrusted,
        "telegram:group:-7",
    )
    .await;
    if let Err(e) = &rig.env.ctx.execution.backend {
        panic!("the sandbox cannot start here: {e}");
    }
    let (id, _) = rig
        .start(json!({
            "command": "read x; echo got $x in $(pwd); hostname",
            "background": true,
            "notify_on_complete": true
        }))
        .await;
    rig.process(json!({"action": "submit", "session_id": id, "data": "word"}))
        .await;
    let done = rig.wait(&id).await;
    let text = done["output"].as_str().unwrap();
    assert!(text.contains("got word in /workspace"), "{done}");
    assert!(text.contains("talaria-sandbox"), "{done}");
}

#[tokio::test]
async fn the_log_file_stops_at_its_cap_with_a_note() {
    let mut config = Config::default();
    config.terminal.background.log_max_bytes = 100;
    let rig = Rig::with(config, true);
    let (id, _) = rig
        .start(json!({"command": "seq 1 1000", "background": true}))
        .await;
    let done = rig.wait(&id).await;
    let file = rig
        .env
        .ctx
        .home
        .root()
        .join("processes")
        .join(format!("{id}.log"));
    let text = std::fs::read_to_string(file).unwrap();
    assert!(text.starts_with("1\n2\n3\n"), "{text}");
    assert!(text.contains("log_max_bytes (100 bytes)"), "{text}");
    assert!(!text.contains("\n1000\n"), "{text}");
    // The end is still in memory for poll and wait.
    assert!(
        done["output"].as_str().unwrap().ends_with("999\n1000\n"),
        "{done}"
    );
}

#[tokio::test]
async fn the_guard_blocks_a_background_command_as_it_does_a_foreground_one() {
    let rig = Rig::new();
    let out = rig
        .terminal
        .call(
            json!({"command": "rm -rf /", "background": true, "notify_on_complete": true}),
            &rig.env.ctx,
        )
        .await
        .unwrap();
    assert!(out.starts_with("BLOCKED"), "{out}");
    assert!(
        rig.reports.events().is_empty(),
        "{:?}",
        rig.reports.events()
    );
    let listed = rig.process(json!({"action": "list"})).await;
    assert_eq!(listed["processes"], json!([]), "{listed}");
}

#[tokio::test]
async fn wait_returns_when_the_turn_is_interrupted() {
    let rig = Rig::new();
    let (id, _) = rig
        .start(json!({"command": "sleep 600", "background": true}))
        .await;
    let cancel = rig.env.ctx.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        cancel.cancel();
    });
    let out = rig
        .process(json!({"action": "wait", "session_id": id, "timeout": 600}))
        .await;
    assert_eq!(out["interrupted"], true, "{out}");
    assert_eq!(out["status"], "running", "{out}");
    rig.registry.kill_all().await;
}

#[tokio::test]
async fn the_registry_ends_a_reset_sessions_processes_as_session_work() {
    use talaria_agent::background::SessionWork;
    let rig = Rig::new();
    let (id, out) = rig
        .start(json!({"command": "sleep 600", "background": true, "notify_on_complete": true}))
        .await;
    let pid = out["pid"].as_u64().unwrap().to_string();
    let work: Arc<dyn SessionWork> = Arc::new(rig.registry.clone());
    work.end_session(&rig.env.ctx.session_id);
    rig.reports
        .until("dropping", |e| *e == Event::Dropped(id.clone()))
        .await;
    assert!(gone(&pid).await, "{pid} survived the reset");
}
