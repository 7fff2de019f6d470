//! `talaria cron` as a real process: jobs added, listed, paused, resumed,
//! run without a gateway (delivered to a fake Telegram Bot API through the
//! ledger) and removed; and a running gateway ticking a due job by itself.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use talaria_testkit::{FakeTelegram, MockOpenAi, Reply};

const TOKEN: &str = "515151:cron-cli-token-abcdefghijkl";
const WAIT: Duration = Duration::from_secs(20);

struct Home {
    _dir: tempfile::TempDir,
    root: PathBuf,
    locks: PathBuf,
}

fn home(llm: &MockOpenAi, tg: &FakeTelegram) -> Home {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("home");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(
        root.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {}\n  api_key: sk-test-secret-key-0123456789\nagent:\n  api_max_retries: 0\nplatforms:\n  telegram:\n    base_url: {}\n    poll_timeout_secs: 1\ncron:\n  timezone: Europe/Berlin\n",
            llm.base_url(),
            tg.base_url()
        ),
    )
    .unwrap();
    std::fs::write(
        root.join(".env"),
        format!(
            "TELEGRAM_BOT_TOKEN={TOKEN}\nTELEGRAM_ALLOWED_USERS=42\nTELEGRAM_HOME_CHANNEL=42\n"
        ),
    )
    .unwrap();
    let locks = dir.path().join("locks");
    Home {
        _dir: dir,
        root,
        locks,
    }
}

fn command(home: &Home, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_talaria"));
    c.arg("--home")
        .arg(&home.root)
        .args(args)
        .env_remove("TALARIA_HOME")
        .env_remove("TELEGRAM_BOT_TOKEN")
        .env_remove("TELEGRAM_ALLOWED_USERS")
        .env_remove("TELEGRAM_HOME_CHANNEL")
        .env_remove("API_SERVER_KEY")
        .env("TALARIA_GATEWAY_LOCK_DIR", &home.locks)
        .env("TALARIA_LOG", "info")
        .stdin(Stdio::null());
    c
}

fn talaria(home: &Home, args: &[&str]) -> Output {
    command(home, args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The id `cron add` printed: `added <name> (<id>): ...`.
fn added_id(out: &Output) -> String {
    let stdout = text(&out.stdout);
    let start = stdout.find('(').expect("an id in parentheses") + 1;
    stdout[start..start + 12].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_managed_and_run_from_the_command_line_without_a_gateway() {
    let llm = MockOpenAi::start().await;
    let tg = FakeTelegram::start(TOKEN).await;
    let home = home(&llm, &tg);

    let add = talaria(
        &home,
        &[
            "cron",
            "add",
            "0 9 * * 1-5",
            "Summarise",
            "the",
            "overnight",
            "alerts.",
            "--name",
            "alerts",
            "--deliver",
            "telegram",
        ],
    );
    assert!(add.status.success(), "{}", text(&add.stderr));
    let id = added_id(&add);
    assert!(text(&add.stdout).contains("delivered to telegram"));

    let bad = talaria(&home, &["cron", "add", "every 10s", "too often"]);
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("every 30m"),
        "{}",
        text(&bad.stderr)
    );
    let clash = talaria(&home, &["cron", "add", "every 1h", "x", "--name", "alerts"]);
    assert!(!clash.status.success());
    assert!(
        text(&clash.stderr).contains("already exists"),
        "{}",
        text(&clash.stderr)
    );

    let list = talaria(&home, &["cron", "list"]);
    let listed = text(&list.stdout);
    assert!(
        listed.contains(&id) && listed.contains("0 9 * * 1-5"),
        "{listed}"
    );
    assert!(listed.contains("scheduled"), "{listed}");

    let pause = talaria(&home, &["cron", "pause", "alerts"]);
    assert!(pause.status.success(), "{}", text(&pause.stderr));
    assert!(text(&talaria(&home, &["cron", "list"]).stdout).contains("paused"));
    let resume = talaria(&home, &["cron", "resume", &id]);
    assert!(resume.status.success(), "{}", text(&resume.stderr));
    assert!(text(&resume.stdout).contains("next run"));

    // Run now, no gateway: the answer is printed, saved and delivered to
    // the home channel.
    llm.push(Reply::text("Two alerts overnight, both resolved."));
    let run = talaria(&home, &["cron", "run", "alerts"]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(
        text(&run.stdout).trim(),
        "Two alerts overnight, both resolved."
    );
    let sent = tg.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].chat_id, 42);
    assert!(sent[0].rendered().contains("Two alerts overnight"));
    let user = llm.requests()[0].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(user.contains("Summarise the overnight alerts."), "{user}");
    assert!(
        user.contains("[SILENT]"),
        "the model is told how to stay quiet"
    );

    let logs = talaria(&home, &["cron", "logs", "alerts"]);
    let shown = text(&logs.stdout);
    assert!(shown.contains("ok") && shown.contains("manual"), "{shown}");
    assert!(shown.contains("Two alerts overnight"), "{shown}");
    let outputs = std::fs::read_dir(home.root.join("cron/output").join(&id))
        .unwrap()
        .count();
    assert_eq!(outputs, 1);

    let missing = talaria(&home, &["cron", "run", "nope"]);
    assert!(!missing.status.success());
    assert!(
        text(&missing.stderr).contains("no cron job"),
        "{}",
        text(&missing.stderr)
    );

    let remove = talaria(&home, &["cron", "remove", "alerts"]);
    assert!(remove.status.success(), "{}", text(&remove.stderr));
    assert!(text(&talaria(&home, &["cron", "list"]).stdout).contains("no cron jobs"));
}

fn json_of(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

/// Runs a command that must fail; what it said.
fn refused(home: &Home, args: &[&str]) -> String {
    let out = talaria(home, args);
    assert!(!out.status.success(), "{args:?}: {}", text(&out.stdout));
    text(&out.stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_edited_in_place_keeping_its_runs_and_the_status_tells_it() {
    let llm = MockOpenAi::start().await;
    let tg = FakeTelegram::start(TOKEN).await;
    let home = home(&llm, &tg);
    let add = talaria(
        &home,
        &[
            "cron",
            "add",
            "0 9 * * 1-5",
            "Summarise the alerts.",
            "--name",
            "alerts",
        ],
    );
    assert!(add.status.success(), "{}", text(&add.stderr));
    let id = added_id(&add);
    let other = talaria(
        &home,
        &["cron", "add", "every 1h", "Other.", "--name", "other"],
    );
    assert!(other.status.success(), "{}", text(&other.stderr));
    llm.push(Reply::text("No alerts."));
    let run = talaria(&home, &["cron", "run", "alerts"]);
    assert!(run.status.success(), "{}", text(&run.stderr));

    // Nothing to change, no such job, and what `add` refuses.
    assert!(refused(&home, &["cron", "edit", "alerts"]).contains("nothing to change"));
    assert!(refused(&home, &["cron", "edit", "nope", "--prompt", "x"]).contains("no cron job"));
    assert!(
        refused(
            &home,
            &["cron", "edit", "alerts", "--schedule", "every 10s"]
        )
        .contains("every 30m")
    );
    assert!(
        refused(
            &home,
            &["cron", "edit", "alerts", "--schedule", "2020-01-01T00:00"]
        )
        .contains("in the past")
    );
    assert!(
        refused(&home, &["cron", "edit", "alerts", "--name", "other"]).contains("already exists")
    );
    assert!(
        refused(&home, &["cron", "edit", "alerts", "--skill", "nope"]).contains("no skill named")
    );
    assert!(refused(&home, &["cron", "edit", "alerts", "--repeat", "0"]).contains("at least 1"));
    assert!(refused(&home, &["cron", "edit", "alerts", "--deliver", "origin"]).contains("origin"));
    assert!(
        refused(&home, &["cron", "edit", "alerts", "--prompt", ""])
            .contains("a prompt, a skill, or both")
    );
    let unchanged = text(&talaria(&home, &["cron", "list"]).stdout);
    assert!(unchanged.contains("0 9 * * 1-5"), "{unchanged}");

    let edit = talaria(
        &home,
        &[
            "cron",
            "edit",
            &id,
            "--schedule",
            "every 2h",
            "--prompt",
            "Summarise the new alerts.",
            "--name",
            "morning",
            "--deliver",
            "telegram:42",
            "--repeat",
            "3",
            "--misfire",
            "skip",
        ],
    );
    assert!(edit.status.success(), "{}", text(&edit.stderr));
    let said = text(&edit.stdout);
    assert!(said.contains(&format!("changed morning ({id})")), "{said}");
    for change in [
        "name: alerts -> morning",
        "prompt: Summarise the alerts. -> Summarise the new alerts.",
        "schedule: 0 9 * * 1-5 -> every 2h",
        "deliver: local -> telegram:42",
        "repeat: no limit -> 3 runs in all",
        "misfire: run_once -> skip",
        "next run: ",
    ] {
        assert!(said.contains(change), "{change} in: {said}");
    }
    let again = talaria(&home, &["cron", "edit", "morning", "--misfire", "skip"]);
    assert!(text(&again.stdout).contains("already had those settings"));
    let unlimited = talaria(&home, &["cron", "edit", "morning", "--no-repeat-limit"]);
    assert!(
        text(&unlimited.stdout).contains("repeat: 3 runs in all -> no limit"),
        "{}",
        text(&unlimited.stdout)
    );

    // The same job, with its run kept.
    let logs = text(&talaria(&home, &["cron", "logs", "morning"]).stdout);
    assert!(logs.contains(&id) && logs.contains("every 2h"), "{logs}");
    assert!(logs.contains("ok") && logs.contains("manual"), "{logs}");
    assert!(logs.contains("No alerts."), "{logs}");

    let pause = talaria(&home, &["cron", "pause", "other"]);
    assert!(pause.status.success(), "{}", text(&pause.stderr));
    let status = json_of(&talaria(&home, &["cron", "status", "--json"]));
    assert_eq!(status["scheduler"]["running"], false, "{status}");
    assert_eq!(status["scheduler"]["enabled"], true, "{status}");
    assert_eq!(status["scheduler"]["gateway_pid"], serde_json::Value::Null);
    assert_eq!(status["jobs"]["total"], 2, "{status}");
    assert_eq!(status["jobs"]["scheduled"], 1, "{status}");
    assert_eq!(status["jobs"]["paused"], 1, "{status}");
    assert_eq!(status["next"]["id"], id.as_str(), "{status}");
    // Computed afresh from the edit: two hours on.
    let in_secs = status["next"]["in_secs"].as_i64().unwrap();
    assert!((7000..=7200).contains(&in_secs), "{status}");
    let runs = status["recent_runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{status}");
    assert_eq!(runs[0]["job_name"], "morning");
    assert_eq!(runs[0]["status"], "ok");
    assert_eq!(runs[0]["trigger"], "manual");

    let shown = talaria(&home, &["cron", "status"]);
    assert!(shown.status.success(), "{}", text(&shown.stderr));
    let shown = text(&shown.stdout);
    assert!(shown.contains("Scheduler: not running"), "{shown}");
    assert!(
        shown.contains("Jobs: 2 (1 scheduled, 1 paused, 0 completed)"),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("Next due: morning ({id}) at ")),
        "{shown}"
    );
    assert!(shown.contains("morning  ok  manual"), "{shown}");
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "the gateway did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_gateway_runs_a_due_job_by_itself() {
    let llm = MockOpenAi::start().await;
    let tg = FakeTelegram::start(TOKEN).await;
    let home = home(&llm, &tg);
    // A one-shot due a few seconds ago (still inside its grace).
    let due = (chrono::Utc::now() - chrono::Duration::seconds(5))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let add = talaria(
        &home,
        &[
            "cron",
            "add",
            &due,
            "Say it is time.",
            "--name",
            "ping",
            "--deliver",
            "telegram:42",
        ],
    );
    assert!(add.status.success(), "{}", text(&add.stderr));
    llm.push(Reply::text("It is time."));

    let log = home.root.join("gateway.log.txt");
    let mut gateway = command(&home, &["gateway", "run"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let sent = tg.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].chat_id, 42);
    assert!(
        sent[0].rendered().contains("It is time."),
        "{}",
        sent[0].rendered()
    );

    // The status sees the gateway's scheduler and, once recorded, its run.
    let deadline = Instant::now() + WAIT;
    let status = loop {
        let status = json_of(&talaria(&home, &["cron", "status", "--json"]));
        if status["recent_runs"][0]["status"] == "ok" || Instant::now() > deadline {
            break status;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status["scheduler"]["running"], true, "{status}");
    assert_eq!(status["scheduler"]["gateway_pid"], gateway.id(), "{status}");
    assert_eq!(status["recent_runs"][0]["job_name"], "ping", "{status}");
    assert_eq!(status["recent_runs"][0]["status"], "ok", "{status}");
    assert_eq!(status["recent_runs"][0]["trigger"], "schedule", "{status}");
    assert_eq!(status["jobs"]["completed"], 1, "{status}");
    assert_eq!(status["next"], serde_json::Value::Null, "{status}");
    let shown = text(&talaria(&home, &["cron", "status"]).stdout);
    assert!(
        shown.contains(&format!(
            "Scheduler: running, in the gateway (pid {})",
            gateway.id()
        )),
        "{shown}"
    );
    assert!(shown.contains("Next due: nothing is scheduled"), "{shown}");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(gateway.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(wait_exit(&mut gateway).success());
    // The one-shot is done and says so.
    let list = text(&talaria(&home, &["cron", "list"]).stdout);
    assert!(list.contains("completed"), "{list}");
    assert_eq!(
        llm.requests().len(),
        1,
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
}
