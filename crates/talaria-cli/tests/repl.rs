//! The interactive REPL driven through a real pseudo-terminal: streaming,
//! tool lines, Ctrl-C interrupting the turn but not the program.

use std::process::Command;

use rexpect::reader::Options;
use rexpect::session::spawn_with_options;
use talaria_testkit::{MockOpenAi, Reply, ToolCallReply};

#[test]
fn repl_streams_shows_tools_and_survives_ctrl_c() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = rt.block_on(MockOpenAi::start());
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  base_url: {}\n",
            mock.base_url()
        ),
    )
    .unwrap();

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_talaria"));
    cmd.arg("--home").arg(&home).arg("chat");
    cmd.env_remove("TALARIA_HOME");
    cmd.current_dir(dir.path());
    let mut p = spawn_with_options(
        cmd,
        Options::new()
            .timeout_ms(Some(20_000))
            .strip_ansi_escape_codes(true),
    )
    .unwrap();
    p.exp_string("Type /help").unwrap();

    // A streamed answer.
    mock.push(Reply::text("streamed hello world"));
    p.send_line("hi").unwrap();
    p.exp_string("streamed hello world").unwrap();

    // A tool call shows as one line, then the answer.
    mock.push(Reply::tool_calls(vec![ToolCallReply {
        id: "call_1".into(),
        name: "terminal".into(),
        arguments: r#"{"command":"echo from-the-tool"}"#.into(),
    }]));
    mock.push(Reply::text("tool finished fine"));
    p.send_line("run something").unwrap();
    // rexpect reads bytes as Latin-1, so match the ASCII part of the tool line.
    p.exp_string(r#"terminal {"command":"echo from-the-tool"}"#)
        .unwrap();
    p.exp_string("tool finished fine").unwrap();

    // Ctrl-C during a stalled stream interrupts the turn, not the program.
    mock.push(Reply::text("partial words then a very long silence").stall_after(1));
    p.send_line("slow one").unwrap();
    p.exp_string("partial").unwrap();
    p.send_control('c').unwrap();
    p.exp_string("interrupted").unwrap();

    // Still alive: another turn works.
    mock.push(Reply::text("still here"));
    p.send_line("are you there").unwrap();
    p.exp_string("still here").unwrap();

    p.send_line("/exit").unwrap();
    p.exp_eof().unwrap();
    assert_eq!(mock.requests().len(), 5);
}
