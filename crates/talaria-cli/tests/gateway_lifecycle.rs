//! Starting and stopping the gateway as a person does, through the real
//! binary: a start that fails says why, a configuration error has its own
//! exit status (which the systemd unit does not restart on), a stop says
//! when it waits for a running turn, and a stranger dropped by an allowlist
//! is logged with their id.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use talaria_testkit::{FakeTelegram, MockOpenAi, Reply};

const TOKEN: &str = "515151:lifecycle-test-token-abcdefghij";
const WAIT: Duration = Duration::from_secs(20);

/// `sysexits`' EX_CONFIG, which `gateway run` exits with on a bad config.
const EXIT_BAD_CONFIG: i32 = 78;

struct Home {
    _dir: tempfile::TempDir,
    root: PathBuf,
    locks: PathBuf,
}

fn empty_home() -> Home {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("home");
    std::fs::create_dir_all(&root).unwrap();
    let locks = dir.path().join("locks");
    Home {
        _dir: dir,
        root,
        locks,
    }
}

fn command(home: &Home, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_talaria"));
    c.arg("--home").arg(&home.root).args(args);
    for var in [
        "TALARIA_HOME",
        "TELEGRAM_BOT_TOKEN",
        "TELEGRAM_ALLOWED_USERS",
        "GATEWAY_ALLOW_ALL_USERS",
        "API_SERVER_KEY",
        "OPENAI_API_KEY",
        "TALARIA_MODEL",
        "TALARIA_BASE_URL",
    ] {
        c.env_remove(var);
    }
    c.env("TALARIA_GATEWAY_LOCK_DIR", &home.locks)
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

fn write_config(home: &Home, yaml: &str) {
    std::fs::write(home.root.join("config.yaml"), yaml).unwrap();
}

fn model_config(llm: &MockOpenAi) -> String {
    format!(
        "model:\n  default: mock-model\n  provider: custom\n  base_url: {}\n",
        llm.base_url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_fails_prints_the_reason_from_the_log() {
    let llm = MockOpenAi::start().await;
    let home = empty_home();

    // A configuration the parser rejects.
    write_config(&home, "model:\n  default: [unclosed\n");
    let out = talaria(&home, &["gateway", "start"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("the gateway did not start"), "{err}");
    assert!(err.contains("The configuration is not usable"), "{err}");
    assert!(
        err.contains("config.yaml"),
        "the parser's complaint is shown: {err}"
    );
    assert!(err.contains("gateway.log"), "{err}");

    // A valid file with nothing to serve: the reason, not only "see log".
    write_config(&home, &model_config(&llm));
    let out = talaria(&home, &["gateway", "start"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("nothing to serve: no platform is enabled"),
        "{err}"
    );
    assert!(err.contains("TELEGRAM_BOT_TOKEN"), "{err}");
    // Only this start's lines: the first failure is not repeated.
    assert!(!err.contains("unclosed"), "{err}");
    assert!(talaria(&home, &["gateway", "status"]).status.code() == Some(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_exits_with_its_own_status_when_the_configuration_is_bad() {
    let llm = MockOpenAi::start().await;
    let home = empty_home();
    write_config(&home, "model: [\n");
    let out = talaria(&home, &["gateway", "run"]);
    assert_eq!(
        out.status.code(),
        Some(EXIT_BAD_CONFIG),
        "{}",
        text(&out.stderr)
    );
    assert!(text(&out.stderr).contains("configuration is not usable"));

    // Nothing to serve is the configuration's fault too.
    write_config(&home, &model_config(&llm));
    let out = talaria(&home, &["gateway", "run"]);
    assert_eq!(
        out.status.code(),
        Some(EXIT_BAD_CONFIG),
        "{}",
        text(&out.stderr)
    );

    // So is a malformed bot token.
    std::fs::write(
        home.root.join(".env"),
        "TELEGRAM_BOT_TOKEN=\"not a token\"\n",
    )
    .unwrap();
    let out = talaria(&home, &["gateway", "run"]);
    assert_eq!(
        out.status.code(),
        Some(EXIT_BAD_CONFIG),
        "{}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("bot token is malformed"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn the_unit_waits_for_the_network_and_does_not_restart_on_a_bad_configuration() {
    let home = empty_home();
    let xdg = home.root.parent().unwrap().join("xdg");
    let out = command(&home, &["gateway", "install"])
        .env("XDG_CONFIG_HOME", &xdg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let unit = std::fs::read_to_string(xdg.join("systemd/user/talaria-gateway.service")).unwrap();
    let section = |name: &str| -> Vec<&str> {
        let start = unit
            .find(name)
            .unwrap_or_else(|| panic!("no {name} in\n{unit}"));
        unit[start + name.len()..]
            .lines()
            .take_while(|l| !l.starts_with('['))
            .collect()
    };
    let unit_part = section("[Unit]");
    assert!(unit_part.contains(&"Wants=network-online.target"), "{unit}");
    assert!(unit_part.contains(&"After=network-online.target"), "{unit}");
    let service = section("[Service]");
    assert!(service.contains(&"Restart=on-failure"), "{unit}");
    assert!(
        service.contains(&format!("RestartPreventExitStatus={EXIT_BAD_CONFIG}").as_str()),
        "{unit}"
    );
}

/// The state file follows the gateway every couple of seconds: asks until
/// `status` shows `needle`.
fn wait_for_status(home: &Home, needle: &str) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let out = text(&talaria(home, &["gateway", "status"]).stdout);
        if out.contains(needle) {
            return out;
        }
        assert!(Instant::now() < deadline, "no {needle:?} in\n{out}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn telegram_home(llm: &MockOpenAi, tg: &FakeTelegram, extra_config: &str) -> Home {
    let home = empty_home();
    write_config(
        &home,
        &format!(
            "{}agent:\n  api_max_retries: 1\nplatforms:\n  telegram:\n    base_url: {}\n    poll_timeout_secs: 1\n{extra_config}",
            model_config(llm),
            tg.base_url()
        ),
    );
    std::fs::write(
        home.root.join(".env"),
        format!("TELEGRAM_BOT_TOKEN={TOKEN}\nTELEGRAM_ALLOWED_USERS=42\n"),
    )
    .unwrap();
    home
}

fn gateway_log(home: &Home) -> String {
    std::fs::read_to_string(home.root.join("logs/gateway.log")).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_says_it_waits_for_a_running_turn_and_for_how_long() {
    let llm = MockOpenAi::start().await;
    let tg = FakeTelegram::start(TOKEN).await;
    let home = telegram_home(&llm, &tg, "gateway:\n  drain_timeout_secs: 3\n");
    let started = talaria(&home, &["gateway", "start"]);
    assert!(started.status.success(), "{}", text(&started.stderr));
    tg.wait_for_get_updates_calls(1, WAIT).await;

    // A stranger (the allowlist holds 42 only) is dropped, and the log
    // names their id, so an owner who wrote to their own bot finds it.
    tg.push_private_text(555, "is this my bot?");
    // A turn that will not finish by itself.
    llm.push(Reply::text("too late").with_delay(Duration::from_secs(120)));
    tg.push_private_text(42, "think hard");
    wait_for_status(&home, "Running turns: 1");

    let stop = talaria(&home, &["gateway", "stop"]);
    let out = text(&stop.stdout);
    assert!(stop.status.success(), "{out}\n{}", text(&stop.stderr));
    assert!(
        out.contains("Waiting for 1 running turn to finish: at most 3 s (gateway.drain_timeout_secs), then it is interrupted."),
        "{out}"
    );
    assert!(out.contains("Gateway stopped"), "{out}");
    assert!(
        tg.sent().iter().all(|s| s.chat_id != 555),
        "a stranger is not answered when an allowlist exists"
    );
    let log = gateway_log(&home);
    assert!(
        log.lines()
            .any(|l| l.contains("unauthorized sender dropped") && l.contains("user_id=555")),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_without_running_turns_does_not_mention_waiting() {
    let llm = MockOpenAi::start().await;
    let tg = FakeTelegram::start(TOKEN).await;
    let home = telegram_home(&llm, &tg, "");
    let started = talaria(&home, &["gateway", "start"]);
    assert!(started.status.success(), "{}", text(&started.stderr));
    wait_for_status(&home, "Running turns: 0");
    let stop = talaria(&home, &["gateway", "stop"]);
    let out = text(&stop.stdout);
    assert!(stop.status.success(), "{out}");
    assert!(!out.contains("Waiting"), "{out}");
    assert!(out.contains("Gateway stopped"), "{out}");
}
