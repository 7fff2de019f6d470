//! The terminal tool's execution: exit codes, timeouts, output caps,
//! redaction and cancellation.

use crate::tools_support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use talaria_agent::tools::Tool;
use talaria_agent::tools::terminal::TerminalTool;
use talaria_core::Config;
use tools_support::{Env, Scripted, json};

async fn run(env: &Env, args: Value) -> Value {
    json(&TerminalTool::default().call(args, &env.ctx).await.unwrap())
}

#[tokio::test]
async fn reports_output_and_exit_code() {
    let env = Env::new();
    let out = run(&env, json!({"command": "echo out; echo err >&2; exit 3"})).await;
    assert_eq!(out["exit_code"], 3, "{out}");
    let text = out["output"].as_str().unwrap();
    assert!(text.contains("out\n") && text.contains("err\n"), "{text}");
}

#[tokio::test]
async fn runs_in_the_workdir_with_no_stdin() {
    let env = Env::new();
    std::fs::create_dir_all(env.work().join("sub")).unwrap();
    let out = run(
        &env,
        json!({"command": "pwd; cat; echo done", "workdir": "sub"}),
    )
    .await;
    let text = out["output"].as_str().unwrap();
    assert!(
        text.trim_start()
            .starts_with(env.work().join("sub").to_str().unwrap()),
        "{text}"
    );
    assert!(text.contains("done"), "{text}");
    let e = TerminalTool::default()
        .call(json!({"command": "true", "workdir": "missing"}), &env.ctx)
        .await
        .unwrap_err();
    assert!(e.0.contains("workdir"), "{e}");
}

#[tokio::test]
async fn arguments_are_validated() {
    let env = Env::new();
    for (args, field) in [
        (json!({}), "command"),
        (json!({"command": 5}), "command"),
        (json!({"command": "  "}), "command"),
        (json!({"command": "true", "timeout": "soon"}), "timeout"),
        (json!({"command": "true", "timeout": -1}), "timeout"),
        (json!({"command": "true", "workdir": []}), "workdir"),
    ] {
        let e = TerminalTool::default()
            .call(args.clone(), &env.ctx)
            .await
            .unwrap_err();
        assert!(e.0.contains(field), "{args}: {e}");
    }
}

fn pid_alive(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // A zombie is dead, just not yet reaped by its new parent.
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group() {
    let env = Env::new();
    let pidfile = env.work().join("bg.pid");
    let started = Instant::now();
    let out = run(
        &env,
        json!({"command": format!("sleep 60 & echo $! > {}; echo started; wait", pidfile.display()), "timeout": 1}),
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(out["timed_out"], true, "{out}");
    assert!(
        out["error"]
            .as_str()
            .unwrap()
            .contains("timed out after 1s"),
        "{out}"
    );
    assert!(out["output"].as_str().unwrap().contains("started"), "{out}");
    let pid = std::fs::read_to_string(&pidfile).unwrap().trim().to_owned();
    let deadline = Instant::now() + talaria_testkit::wait::WAIT;
    while pid_alive(&pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !pid_alive(&pid),
        "background sleep {pid} survived the timeout"
    );
}

#[tokio::test]
async fn timeout_is_capped_by_config() {
    let mut config = Config::default();
    config.terminal.max_timeout_secs = 1;
    let env = Env::with(config, Scripted::with(&[]));
    let started = Instant::now();
    let out = run(&env, json!({"command": "sleep 30", "timeout": 999})).await;
    assert_eq!(out["timed_out"], true, "{out}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn default_timeout_comes_from_config() {
    let mut config = Config::default();
    config.terminal.timeout_secs = 1;
    let env = Env::with(config, Scripted::with(&[]));
    let out = run(&env, json!({"command": "sleep 30"})).await;
    assert_eq!(out["timed_out"], true, "{out}");
}

#[tokio::test]
async fn output_is_capped_keeping_head_and_tail() {
    let mut config = Config::default();
    config.terminal.max_output_chars = 1000;
    let env = Env::with(config, Scripted::with(&[]));
    let out = run(&env, json!({"command": "seq 1 200000"})).await;
    assert_eq!(out["exit_code"], 0);
    let text = out["output"].as_str().unwrap();
    assert!(text.starts_with("1\n2\n3\n"), "{}", &text[..50]);
    assert!(
        text.trim_end().ends_with("199999\n200000"),
        "{}",
        &text[text.len() - 50..]
    );
    assert!(text.contains("output truncated"), "{text}");
    assert!(text.chars().count() < 1200, "{}", text.chars().count());
}

#[tokio::test]
async fn secrets_printed_by_a_command_are_redacted() {
    let env = Env::new();
    let out = run(
        &env,
        json!({"command": "echo value=super-secret-value-123; echo sk-abcdefghijklmnopqrstuvwx; echo ghp_abcdefghijklmnopqrstuvwxyz0123"}),
    )
    .await;
    let text = out["output"].as_str().unwrap();
    assert!(!text.contains("super-secret-value-123"), "{text}");
    assert!(!text.contains("abcdefghijklmnopqrstuvwx"), "{text}");
    assert_eq!(text.matches("[REDACTED]").count(), 3, "{text}");
}

#[tokio::test]
async fn cancel_token_kills_a_running_command() {
    let env = Env::new();
    let ctx = env.ctx.clone();
    let cancel = ctx.cancel.clone();
    let begun = ctx.workdir.join("begun");
    let task = tokio::spawn(async move {
        TerminalTool::default()
            .call(
                json!({"command": "echo begin; : > begun; sleep 60", "timeout": 120}),
                &ctx,
            )
            .await
            .unwrap()
    });
    // Cancelled once the command has provably printed its first line.
    talaria_testkit::wait::wait_for("the command to begin", || async {
        if begun.exists() { Ok(()) } else { Err(()) }
    })
    .await;
    cancel.cancel();
    // Well before the command's own 60 s end: the cancel killed it.
    let out = json(
        &tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("the cancelled command ran on")
            .unwrap(),
    );
    assert_eq!(out["interrupted"], true, "{out}");
    assert!(out["output"].as_str().unwrap().contains("begin"), "{out}");
}

#[tokio::test]
async fn invalid_utf8_and_huge_lines_do_not_break_anything() {
    let env = Env::new();
    let out = run(
        &env,
        json!({"command": "printf '\\377\\376ok'; head -c 300000 /dev/zero | tr '\\0' a"}),
    )
    .await;
    assert_eq!(out["exit_code"], 0, "{out}");
    assert!(out["output"].as_str().unwrap().contains("ok"));
}

#[tokio::test]
async fn background_jobs_holding_output_do_not_hang_the_call() {
    let env = Env::new();
    let pidfile = env.work().join("bg.pid");
    let started = Instant::now();
    let out = run(
        &env,
        json!({"command": format!("sleep 30 & echo $! > {}; echo fg", pidfile.display())}),
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(out["exit_code"], 0, "{out}");
    assert!(
        out["note"].as_str().unwrap().contains("background"),
        "{out}"
    );
    // Clean up the sleeper ourselves.
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}
