//! Event hooks with real handler scripts in a temporary home: what a
//! handler receives, and that a slow, crashing or flooding one never holds
//! the gateway up.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use talaria_core::Home;
use talaria_gateway::hooks::{Hooks, MAX_BACKLOG, MAX_RUNNING};

/// How long a test waits for something that should happen.
const WAIT: Duration = Duration::from_secs(15);

struct TestHome {
    _dir: tempfile::TempDir,
    home: Home,
}

impl TestHome {
    fn new() -> TestHome {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home"));
        home.ensure().unwrap();
        TestHome { _dir: dir, home }
    }

    /// Writes a hook folder with `manifest` and, when given, an executable
    /// `handler` script.
    fn install(&self, folder: &str, manifest: &str, script: Option<&str>) -> PathBuf {
        let dir = self.home.hooks_dir().join(folder);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("HOOK.yaml"), manifest).unwrap();
        if let Some(script) = script {
            let handler = dir.join("handler");
            std::fs::write(&handler, script).unwrap();
            std::fs::set_permissions(&handler, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        dir
    }

    fn load(&self) -> Hooks {
        Hooks::load(&self.home)
    }
}

/// Waits until `path` exists and returns its content.
async fn wait_for_file(path: &Path) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Alive and not a zombie (an orphan whose reaper has not come by yet is
/// as dead as it gets).
fn pid_alive(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

async fn wait_until_dead(pid: &str) {
    let deadline = Instant::now() + WAIT;
    while pid_alive(pid) {
        assert!(Instant::now() < deadline, "process {pid} is still running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writes its stdin, environment and working directory next to itself.
const RECORDER: &str = "#!/bin/sh\n\
env > env.txt\n\
pwd > cwd.txt\n\
cat > stdin.tmp && mv stdin.tmp stdin.json\n";

const SECRET_VAR: &str = "TALARIA_TEST_SECRET";
const SECRET: &str = "sk-test-abcdefghijklmnopqrstuvwxyz";

/// Runs in a child test process that has a secret in its environment:
/// setting one in this multi-threaded test process would be unsound.
#[test]
fn a_handler_gets_the_event_on_stdin_and_nothing_else() {
    if std::env::var_os(SECRET_VAR).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "hooks::a_handler_gets_the_event_on_stdin_and_nothing_else",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(SECRET_VAR, SECRET)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("1 passed"), "{stdout}");
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let t = TestHome::new();
            let dir = t.install("recorder", "events: [agent:end]\n", Some(RECORDER));
            let hooks = t.load();
            assert_eq!(hooks.hooks().count(), 1);
            let before = chrono::Utc::now().timestamp() as f64;
            let payload = json!({"session_key": "agent:main:telegram:dm:x", "exit": "completed", "response": "hi ✓"});
            hooks.emit("agent:end", payload.clone());

            let input: Value =
                serde_json::from_str(&wait_for_file(&dir.join("stdin.json")).await).unwrap();
            assert_eq!(input["event"], "agent:end");
            assert_eq!(input["payload"], payload);
            let ts = input["timestamp"].as_f64().unwrap();
            assert!(ts >= before - 1.0 && ts < before + 60.0, "{ts}");
            assert_eq!(input.as_object().unwrap().len(), 3, "{input}");

            let env = wait_for_file(&dir.join("env.txt")).await;
            assert!(!env.contains(SECRET_VAR), "{env}");
            assert!(!env.contains(SECRET), "{env}");
            let names: Vec<&str> = env.lines().filter_map(|l| l.split_once('=')).map(|(k, _)| k).collect();
            // The shell adds its own bookkeeping (PWD, SHLVL, `_`).
            for name in &names {
                assert!(
                    ["PATH", "HOME", "LANG", "TALARIA_HOME", "PWD", "OLDPWD", "SHLVL", "_"]
                        .contains(name),
                    "unexpected variable {name} in {env}"
                );
            }
            let home = std::fs::canonicalize(t.home.root()).unwrap();
            assert!(
                env.lines().any(|l| l == format!("TALARIA_HOME={}", home.display())),
                "{env}"
            );
            if std::env::var_os("PATH").is_some() {
                assert!(names.contains(&"PATH"), "{env}");
            }

            let cwd = wait_for_file(&dir.join("cwd.txt")).await;
            assert_eq!(
                Path::new(cwd.trim()),
                std::fs::canonicalize(&dir).unwrap()
            );
        });
}

/// `emit` hands the event over and returns before its handler ends: the
/// handler waits for a file the test writes only once `emit` has
/// returned, and then runs to its end. Had `emit` waited for the handler,
/// the handler would have been killed at its timeout without ever seeing
/// the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emit_returns_before_its_handler_ends() {
    let t = TestHome::new();
    let dir = t.install(
        "waiter",
        "events: [\"message:*\"]\ntimeout_secs: 60\n",
        Some("#!/bin/sh\nwhile [ ! -f go ]; do sleep 0.05; done\necho ran > ran.tmp && mv ran.tmp ran\n"),
    );
    let hooks = t.load();
    hooks.emit("message:received", json!({"text": "hi"}));
    std::fs::write(dir.join("go"), "").unwrap();
    assert_eq!(wait_for_file(&dir.join("ran")).await, "ran\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_handler_is_killed_at_its_timeout() {
    let t = TestHome::new();
    let dir = t.install(
        "sleeper",
        "events: [\"message:*\"]\ntimeout_secs: 1\n",
        Some("#!/bin/sh\nsleep 30 &\necho $! > sleep.pid.tmp && mv sleep.pid.tmp sleep.pid\necho $$ > sh.pid.tmp && mv sh.pid.tmp sh.pid\nwait\n"),
    );
    let hooks = t.load();

    let started = Instant::now();
    hooks.emit("message:received", json!({"text": "hi"}));

    let sleep_pid = wait_for_file(&dir.join("sleep.pid")).await;
    let sh_pid = wait_for_file(&dir.join("sh.pid")).await;
    // Both the handler and what it started in the background are killed.
    wait_until_dead(sleep_pid.trim()).await;
    wait_until_dead(sh_pid.trim()).await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );

    // Waiting callers are bounded by the timeout too.
    std::fs::remove_file(dir.join("sleep.pid")).unwrap();
    let started = Instant::now();
    let answers = hooks.emit_and_wait("message:sent", json!({})).await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(answers, vec![("sleeper".to_owned(), None)]);
    let sleep_pid = wait_for_file(&dir.join("sleep.pid")).await;
    wait_until_dead(sleep_pid.trim()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_handler_is_isolated_from_the_other_hooks() {
    let t = TestHome::new();
    t.install(
        "a-crash",
        "events: [session:start]\n",
        Some("#!/bin/sh\necho 'garbage {{{'\necho 'it broke' >&2\nexit 3\n"),
    );
    t.install(
        "b-garbage",
        "events: [session:start]\n",
        Some("#!/bin/sh\necho 'this is not json'\n"),
    );
    t.install(
        "c-answer",
        "events: [session:start]\n",
        Some("#!/bin/sh\ncat > /dev/null\necho '{\"ok\": true}'\n"),
    );
    let recorder = t.install("d-recorder", "events: [\"session:*\"]\n", Some(RECORDER));
    let hooks = t.load();

    let answers = hooks.emit_and_wait("session:start", json!({"n": 1})).await;
    assert_eq!(
        answers,
        vec![
            ("a-crash".to_owned(), None),
            ("b-garbage".to_owned(), None),
            ("c-answer".to_owned(), Some(json!({"ok": true}))),
            ("d-recorder".to_owned(), None),
        ]
    );
    std::fs::remove_file(recorder.join("stdin.json")).unwrap();

    // Fire-and-forget too: the crash next door does not stop the recorder.
    hooks.emit("session:start", json!({"n": 2}));
    let input: Value =
        serde_json::from_str(&wait_for_file(&recorder.join("stdin.json")).await).unwrap();
    assert_eq!(input["payload"]["n"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emit_and_wait_returns_the_answers_of_subscribed_hooks() {
    let t = TestHome::new();
    t.install(
        "20-second",
        "name: second\nevents: [\"command:*\"]\n",
        Some("#!/bin/sh\nread line\necho \"{\\\"seen\\\": $line}\"\n"),
    );
    t.install(
        "10-first",
        "name: first\nevents: [command:new]\n",
        Some("#!/bin/sh\necho '{\"decision\": \"allow\", \"n\": [1, 2]}'\n"),
    );
    t.install(
        "30-other",
        "events: [agent:start]\n",
        Some("#!/bin/sh\necho '{\"wrong\": true}'\n"),
    );
    t.install(
        "40-silent",
        "events: [command:new]\n",
        Some("#!/bin/sh\nexit 0\n"),
    );
    let hooks = t.load();
    let names: Vec<&str> = hooks.hooks().map(|h| h.name()).collect();
    assert_eq!(names, ["first", "second", "30-other", "40-silent"]);

    let answers = hooks
        .emit_and_wait("command:new", json!({"command": "new", "args": ""}))
        .await;
    assert_eq!(answers.len(), 3, "{answers:?}");
    assert_eq!(answers[0].0, "first");
    assert_eq!(
        answers[0].1,
        Some(json!({"decision": "allow", "n": [1, 2]}))
    );
    assert_eq!(answers[1].0, "second");
    let seen = &answers[1].1.as_ref().unwrap()["seen"];
    assert_eq!(seen["event"], "command:new");
    assert_eq!(seen["payload"]["command"], "new");
    assert_eq!(answers[2], ("40-silent".to_owned(), None));

    // `command:*` covers every command; `command:new` only `/new`.
    let answers = hooks.emit_and_wait("command:status", json!({})).await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0].0, "second");
    assert!(hooks.emit_and_wait("cron:run", json!({})).await.is_empty());
}

#[tokio::test]
async fn unusable_hook_folders_are_skipped() {
    let t = TestHome::new();
    let ok = "#!/bin/sh\nexit 0\n";
    t.install("good", "events: [agent:end]\n", Some(ok));
    // Answers are attributed by name: the later folder loses.
    t.install("imposter", "name: good\nevents: [agent:end]\n", Some(ok));
    t.install("no-events", "name: quiet\ndescription: nothing\n", Some(ok));
    t.install("empty-events", "events: []\n", Some(ok));
    t.install("unknown-events", "events: [agent:step]\n", Some(ok));
    t.install("broken-yaml", "events: [agent:end\n  : :\n", Some(ok));
    t.install("no-handler", "events: [agent:end]\n", None);
    let dir = t.install("not-executable", "events: [agent:end]\n", Some(ok));
    std::fs::set_permissions(dir.join("handler"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let dir = t.install("handler-is-a-folder", "events: [agent:end]\n", None);
    std::fs::create_dir(dir.join("handler")).unwrap();
    t.install("no-manifest", "", Some(ok));
    std::fs::remove_file(t.home.hooks_dir().join("no-manifest").join("HOOK.yaml")).unwrap();
    // Not a valid path component: never becomes a path.
    t.install(".hidden", "events: [agent:end]\n", Some(ok));
    std::fs::write(t.home.hooks_dir().join("README"), "not a hook").unwrap();

    let hooks = t.load();
    let names: Vec<&str> = hooks.hooks().map(|h| h.name()).collect();
    assert_eq!(names, ["good"]);
    assert!(!hooks.is_empty());
    assert!(hooks.wants("agent:end"));
    assert!(!hooks.wants("agent:start"));

    let empty = Hooks::load(&Home::at(t.home.root().join("nowhere")));
    assert!(empty.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_events_is_bounded_in_processes_and_backlog() {
    let t = TestHome::new();
    let dir = t.install(
        "slow",
        "events: [message:received]\n",
        // The marker event (see below) is logged apart.
        Some(
            "#!/bin/sh\ncase \"$(cat)\" in\n*marker*) echo marker >> log ;;\n\
             *) echo start >> log; sleep 0.3; echo end >> log ;;\nesac\n",
        ),
    );
    let hooks = t.load();
    for i in 0..(MAX_BACKLOG * 3) {
        hooks.emit("message:received", json!({"i": i}));
    }

    let count = |what: &str| {
        std::fs::read_to_string(dir.join("log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| *l == what)
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (starts, ends) = (count("start"), count("end"));
        assert!(
            starts - ends.min(starts) <= MAX_RUNNING,
            "{starts} started, {ends} ended"
        );
        if ends >= MAX_BACKLOG {
            break;
        }
        assert!(Instant::now() < deadline, "{starts} started, {ends} ended");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // One more event, now that there is room: anything queued before it
    // (a dropped event that was kept after all) starts before it does.
    hooks.emit("message:received", json!({"marker": true}));
    let deadline = Instant::now() + Duration::from_secs(60);
    while count("marker") == 0 {
        assert!(Instant::now() < deadline, "the marker event never ran");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // Everything past the backlog was dropped, not queued.
    assert_eq!(count("start"), MAX_BACKLOG);
    assert_eq!(count("end"), MAX_BACKLOG);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_left_holding_the_output_are_killed_when_the_handler_exits() {
    let t = TestHome::new();
    let dir = t.install(
        "leaver",
        "events: [agent:start]\ntimeout_secs: 20\n",
        Some("#!/bin/sh\nsleep 30 &\necho $! > sleep.pid.tmp && mv sleep.pid.tmp sleep.pid\necho '{\"done\": 1}'\n"),
    );
    let hooks = t.load();
    let started = Instant::now();
    let answers = hooks.emit_and_wait("agent:start", json!({})).await;
    // Well before the 20 s timeout: the run ended with its handler.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        answers,
        vec![("leaver".to_owned(), Some(json!({"done": 1})))]
    );
    let pid = wait_for_file(&dir.join("sleep.pid")).await;
    wait_until_dead(pid.trim()).await;
}
