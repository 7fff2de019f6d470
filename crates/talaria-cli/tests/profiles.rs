//! Profiles, driven as an operator drives them: two agents on one machine,
//! each a home of its own under `<home>/profiles/`, selected with `-p` or
//! `TALARIA_PROFILE`; their gateways run side by side (each with its own
//! PID file), keep their conversations apart, and `gateway stop --all`
//! stops both. Also the gateway under systemd's notify protocol: `READY=1`,
//! watchdog pings and `STOPPING=1` arrive on `NOTIFY_SOCKET`, and `/readyz`
//! turns 200 only once its platform is connected.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use talaria_testkit::wait::wait_for;
use talaria_testkit::{FakeTelegram, MockOpenAi, Reply};

const KEY: &str = "sk-profiles-api-key-0123456789";

fn command(base: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_talaria"));
    c.arg("--home").arg(base).args(args);
    for var in [
        "TALARIA_HOME",
        "TALARIA_PROFILE",
        "TELEGRAM_BOT_TOKEN",
        "API_SERVER_KEY",
        "OPENAI_API_KEY",
        "NOTIFY_SOCKET",
        "WATCHDOG_USEC",
        "WATCHDOG_PID",
    ] {
        c.env_remove(var);
    }
    c.env("TALARIA_GATEWAY_LOCK_DIR", base.join("locks"))
        .env("TALARIA_LOG", "info")
        .stdin(Stdio::null());
    c
}

fn talaria(base: &Path, args: &[&str]) -> Output {
    command(base, args).output().unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn configure(root: &Path, llm: &MockOpenAi, port: u16) {
    std::fs::write(
        root.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {}\n\
             platforms:\n  api_server:\n    enabled: true\n    host: 127.0.0.1\n    port: {port}\n",
            llm.base_url()
        ),
    )
    .unwrap();
    std::fs::write(root.join(".env"), format!("API_SERVER_KEY={KEY}\n")).unwrap();
}

async fn health(port: u16) -> bool {
    reqwest::get(format!("http://127.0.0.1:{port}/health"))
        .await
        .is_ok_and(|r| r.status().is_success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_profiles_run_side_by_side_and_stop_all_stops_both() {
    let llm = MockOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("home");

    let out = talaria(&base, &["profile", "create", "work"]);
    assert!(out.status.success(), "{}", text(&out));
    let work = base.join("profiles/work");
    assert!(work.is_dir());
    assert_eq!(
        std::fs::metadata(&work).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let out = talaria(&base, &["profile", "create", "work"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("exists already"), "{}", text(&out));
    for bad in ["../escape", ".hidden", "a/b"] {
        let out = talaria(&base, &["profile", "create", bad]);
        assert!(!out.status.success(), "{bad}: {}", text(&out));
        assert!(!base.join("profiles").join(bad).exists());
    }
    // A misspelt profile is an error, not a new blank agent.
    let out = talaria(&base, &["-p", "wrok", "sessions", "list"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("no profile named `wrok`"),
        "{}",
        text(&out)
    );
    assert!(!base.join("profiles/wrok").exists());

    let (default_port, work_port) = (free_port(), free_port());
    configure(&base, &llm, default_port);
    configure(&work, &llm, work_port);

    let out = talaria(&base, &["gateway", "start"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = command(&base, &["gateway", "start"])
        .env("TALARIA_PROFILE", "work")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(health(default_port).await && health(work_port).await);

    // One conversation on the work profile's API; the default never sees it.
    llm.push(Reply::text("work answer"));
    let response = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{work_port}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&serde_json::json!({"model": "talaria",
            "messages": [{"role": "user", "content": "the work question"}]}))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success());
    let out = talaria(
        &base,
        &["-p", "work", "sessions", "search", "work question"],
    );
    assert!(text(&out).contains("work question"), "{}", text(&out));
    let out = talaria(&base, &["sessions", "search", "work question"]);
    assert!(!text(&out).contains("work question"), "{}", text(&out));

    let out = talaria(&base, &["-p", "work", "profile", "list"]);
    let listing = text(&out);
    assert!(listing.contains("  default"), "{listing}");
    assert!(listing.contains("* work"), "{listing}");
    assert_eq!(listing.matches("gateway running").count(), 2, "{listing}");

    // A running profile is not deleted.
    let out = talaria(&base, &["profile", "delete", "work", "--yes"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("running"), "{}", text(&out));

    let out = talaria(&base, &["gateway", "stop", "--all"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!health(default_port).await && !health(work_port).await);
    let out = talaria(&base, &["profile", "list"]);
    assert_eq!(text(&out).matches("gateway stopped").count(), 2);

    // Deleting asks for --yes without a terminal, then deletes.
    let out = talaria(&base, &["profile", "delete", "work"]);
    assert!(!out.status.success());
    assert!(work.is_dir());
    let out = talaria(&base, &["profile", "delete", "work", "--yes"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!work.exists());
}

/// A gateway process that a failing test does not leave behind.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Everything the gateway sends to the notify socket, collected by a
/// thread of its own so the test's runtime never blocks on the socket.
#[derive(Clone, Default)]
struct Heard(Arc<Mutex<Vec<String>>>);

impl Heard {
    fn listen(socket: UnixDatagram) -> Heard {
        let heard = Heard::default();
        let into = heard.clone();
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // Ends with the test process.
            loop {
                if let Ok(n) = socket.recv(&mut buf) {
                    let message = String::from_utf8_lossy(&buf[..n]).into_owned();
                    into.0.lock().unwrap().push(message);
                }
            }
        });
        heard
    }

    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// How many messages held the line `line`.
    fn count(&self, line: &str) -> usize {
        self.all()
            .iter()
            .filter(|m| m.lines().any(|l| l == line))
            .count()
    }

    async fn wait_for(&self, line: &str) {
        let what = format!("{line} on the notify socket");
        wait_for(&what, || async {
            if self.count(line) > 0 {
                Ok(())
            } else {
                Err(self.all())
            }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_hears_ready_the_watchdog_and_stopping_and_readyz_waits_for_telegram() {
    let llm = MockOpenAi::start().await;
    let tg = FakeTelegram::start("4242:notify-token").await;
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("home");
    std::fs::create_dir_all(&base).unwrap();
    let port = free_port();
    configure(&base, &llm, port);
    let mut config = std::fs::read_to_string(base.join("config.yaml")).unwrap();
    config.push_str(&format!(
        "  telegram:\n    base_url: {}\n    poll_timeout_secs: 1\n",
        tg.base_url()
    ));
    std::fs::write(base.join("config.yaml"), config).unwrap();
    let mut env = std::fs::read_to_string(base.join(".env")).unwrap();
    env.push_str("TELEGRAM_BOT_TOKEN=4242:notify-token\n");
    std::fs::write(base.join(".env"), env).unwrap();
    // Telegram refuses the first polls: the gateway serves, but is not
    // ready until the poll succeeds.
    tg.fail_next_get_updates(3);

    let socket_path = dir.path().join("notify.sock");
    let heard = Heard::listen(UnixDatagram::bind(&socket_path).unwrap());
    let log = std::fs::File::create(dir.path().join("gateway.log")).unwrap();
    // systemd names the main process in WATCHDOG_PID; a shell that execs
    // the gateway knows its pid before it starts.
    let gateway = command(&base, &["gateway", "run"]);
    let mut shell = Command::new("sh");
    shell
        .arg("-c")
        .arg("WATCHDOG_PID=$$ exec \"$0\" \"$@\"")
        .arg(gateway.get_program())
        .args(gateway.get_args());
    for (k, v) in gateway.get_envs() {
        match v {
            Some(v) => shell.env(k, v),
            None => shell.env_remove(k),
        };
    }
    let child = shell
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "400000")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut child = Killed(child);

    heard.wait_for("READY=1").await;
    assert!(
        heard
            .all()
            .iter()
            .any(|m| m.contains("READY=1") && m.contains("STATUS=serving")),
        "{:?}",
        heard.all()
    );
    // Pings at half the interval: several within a second.
    let before = heard.count("WATCHDOG=1");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let pings = heard.count("WATCHDOG=1") - before;
    assert!(pings >= 2, "{pings} watchdog pings");

    // /readyz says 503 until Telegram is connected, then 200.
    let url = format!("http://127.0.0.1:{port}/readyz");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut saw_waiting = false;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let response = http.get(&url).send().await.unwrap();
        let status = response.status().as_u16();
        let body: serde_json::Value = response.json().await.unwrap();
        if status == 503 {
            assert_eq!(body["waiting"], serde_json::json!(["telegram"]), "{body}");
            saw_waiting = true;
        } else {
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["ready"], true);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz never turned 200: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        saw_waiting,
        "/readyz was ready before Telegram answered a poll"
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    heard.wait_for("STOPPING=1").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the gateway did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_starts_a_new_gateway_and_uninstall_removes_the_profiles_unit() {
    let llm = MockOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("home");
    let out = talaria(&base, &["profile", "create", "ops"]);
    assert!(out.status.success(), "{}", text(&out));
    let port = free_port();
    configure(&base.join("profiles/ops"), &llm, port);
    let pid_of = || -> String {
        std::fs::read_to_string(base.join("profiles/ops/gateway.pid"))
            .unwrap_or_default()
            .trim()
            .to_owned()
    };

    // Nothing runs yet: restart starts it.
    let out = talaria(&base, &["-p", "ops", "gateway", "restart"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("was not running"), "{}", text(&out));
    assert!(health(port).await);
    let first = pid_of();
    assert!(!first.is_empty());
    let out = talaria(&base, &["-p", "ops", "gateway", "restart"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(health(port).await);
    let second = pid_of();
    assert!(
        !second.is_empty() && second != first,
        "{first} then {second}"
    );
    let out = talaria(&base, &["-p", "ops", "gateway", "stop"]);
    assert!(out.status.success(), "{}", text(&out));

    // The profile's own unit, installed and removed.
    let xdg = dir.path().join("xdg");
    let unit = xdg.join("systemd/user/talaria-gateway-ops.service");
    let out = command(&base, &["-p", "ops", "gateway", "install"])
        .env("XDG_CONFIG_HOME", &xdg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let written = std::fs::read_to_string(&unit).unwrap();
    assert!(written.contains("Type=notify"), "{written}");
    assert!(written.contains("profiles/ops"), "{written}");
    let out = command(&base, &["-p", "ops", "gateway", "uninstall"])
        .env("XDG_CONFIG_HOME", &xdg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(!unit.exists());
}

#[test]
fn hooks_list_names_what_loads_and_test_runs_one_hook() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("home");
    let hook = base.join("hooks/audit");
    std::fs::create_dir_all(&hook).unwrap();
    std::fs::write(
        hook.join("HOOK.yaml"),
        "description: Echo what happened\nevents: [\"agent:*\"]\ntimeout_secs: 5\n",
    )
    .unwrap();
    // Answers with what it read, so the test sees the event went in.
    std::fs::write(
        hook.join("handler"),
        "#!/bin/sh\nread line\nprintf '{\"heard\": %s}\\n' \"$line\"\n",
    )
    .unwrap();
    std::fs::set_permissions(hook.join("handler"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir_all(base.join("hooks/broken")).unwrap();

    let out = talaria(&base, &["hooks", "list"]);
    let listing = text(&out);
    assert_eq!(out.status.code(), Some(1), "{listing}");
    assert!(listing.contains("audit"), "{listing}");
    assert!(
        listing.contains("events: agent:*; timeout 5 s"),
        "{listing}"
    );
    assert!(listing.contains("broken: not loaded"), "{listing}");

    let out = talaria(
        &base,
        &[
            "hooks",
            "test",
            "audit",
            "agent:end",
            "--payload",
            r#"{"exit": "completed"}"#,
        ],
    );
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("audit answered"), "{said}");
    assert!(said.contains("\"exit\":\"completed\""), "{said}");
    assert!(said.contains("agent:end"), "{said}");

    let out = talaria(&base, &["hooks", "test", "audit", "message:received"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("does not subscribe"), "{}", text(&out));
    let out = talaria(&base, &["hooks", "test", "nobody", "agent:end"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("no hook named `nobody`"),
        "{}",
        text(&out)
    );
}
