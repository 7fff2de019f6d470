//! Messages a person reads, through the real binary: configuration errors
//! that name the key and its line, schedules that name the field and its
//! range, MCP failures without Rust type names, and the small wordings of
//! the CLI (help, hints, counts, columns).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use talaria_testkit::MockOpenAi;

fn command(home: &Path, args: &[&str]) -> Command {
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
        .env("TALARIA_GATEWAY_LOCK_DIR", home.join("locks"))
        .stdin(Stdio::null());
    c
}

fn talaria(home: &Path, args: &[&str]) -> Output {
    command(home, args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn home_with(config: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("config.yaml"), config).unwrap();
    (dir, home)
}

/// A model section that needs nothing to be running.
const MODEL: &str =
    "model:\n  default: local-model\n  provider: custom\n  base_url: http://127.0.0.1:9/v1\n";

/// What a person sees of a failed configuration: `config check`'s error
/// and the one a command that loads it stops with.
fn config_errors(home: &Path) -> String {
    let check = talaria(home, &["config", "check"]);
    assert!(!check.status.success(), "{}", text(&check.stdout));
    let cron = talaria(home, &["cron", "list"]);
    assert!(!cron.status.success(), "{}", text(&cron.stdout));
    format!("{}\n{}", text(&check.stderr), text(&cron.stderr))
}

#[test]
fn a_duplicate_model_key_names_the_key_and_both_lines() {
    // The README's snippet pasted under an existing configuration.
    let (_dir, home) = home_with(&format!(
        "{MODEL}agent:\n  max_turns: 20\nmodel:\n  default: qwen3\n  provider: custom\n  base_url: http://127.0.0.1:11434/v1\n"
    ));
    let said = config_errors(&home);
    for line in said.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            line.contains(
                "line 7: `model` is given twice (also on line 1); keep one `model:` block and \
                 move the other's settings into it"
            ),
            "{said}"
        );
        assert!(!line.contains("DuplicateKeyPolicy"), "{said}");
        assert!(!line.contains("Options"), "{said}");
    }
}

#[test]
fn a_duplicate_nested_key_is_named_by_its_path() {
    let (_dir, home) = home_with(&format!(
        "{MODEL}agent:\n  max_turns: 20\n  max_turns: 30\n"
    ));
    let said = config_errors(&home);
    assert!(
        said.contains(
            "line 7: `agent.max_turns` is given twice (also on line 6); keep only one of them"
        ),
        "{said}"
    );
}

#[test]
fn a_value_of_the_wrong_type_is_a_sentence_with_the_key_path() {
    let (_dir, home) = home_with(&format!("{MODEL}agent:\n  max_turns: lots\n"));
    let said = config_errors(&home);
    assert!(
        said.contains(
            "line 6: `agent.max_turns`: expected a whole number from 0 to 4294967295, not the text \"lots\""
        ),
        "{said}"
    );
    assert!(!said.contains("u32"), "{said}");
    assert!(!said.contains("invalid type"), "{said}");

    // A choice that is not one, and a required key that is missing.
    let (_dir, home) = home_with(&format!(
        "{MODEL}fallback_providers:\n  - provider: custom\n    base_url: http://127.0.0.1:9/v1\n"
    ));
    let said = config_errors(&home);
    assert!(
        said.contains(
            "line 6: `fallback_providers[0].model`: this key is required here but missing"
        ),
        "{said}"
    );
    let (_dir, home) = home_with(&format!("{MODEL}gateway:\n  busy_input_mode: wait\n"));
    let said = config_errors(&home);
    assert!(
        said.contains("line 6: `gateway.busy_input_mode`: `wait` is not one of the choices:"),
        "{said}"
    );
    assert!(!said.contains("unknown variant"), "{said}");
}

#[test]
fn a_checked_value_names_its_line_too() {
    let (_dir, home) =
        home_with("agent:\n  max_turns: 5\nmodel:\n  default: m\n  base_url: localhost:8080\n");
    let said = config_errors(&home);
    assert!(
        said.contains("line 5: `model.base_url`: expected an http:// or https:// URL"),
        "{said}"
    );
}

#[test]
fn a_tab_in_the_yaml_points_at_its_own_line() {
    let (_dir, home) = home_with(&format!(
        "{MODEL}agent:\n\tmax_turns: 20\nmemory:\n  enabled: true\n"
    ));
    let said = config_errors(&home);
    for line in said.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            line.contains("line 6: a tab is used for indentation"),
            "{said}"
        );
    }
}

#[test]
fn a_cron_field_out_of_range_names_the_field_and_its_range() {
    let (_dir, home) = home_with(MODEL);
    let out = talaria(&home, &["cron", "add", "0 25 * * *", "Say hello."]);
    assert!(!out.status.success());
    let said = text(&out.stderr);
    assert!(
        said.contains("the hour field is 25, but it must be from 0 to 23"),
        "{said}"
    );
    assert!(!said.contains("Component error"), "{said}");
    assert!(!said.contains("out of bounds"), "{said}");

    let out = talaria(&home, &["cron", "add", "0 9 * 13 *", "Say hello."]);
    let said = text(&out.stderr);
    assert!(
        said.contains("the month field is 13, but it must be from 1 to 12"),
        "{said}"
    );
}

#[test]
fn an_mcp_server_that_fails_to_start_is_a_sentence_without_type_names() {
    // A program that starts and ends at once, and an address where nothing
    // listens.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let (_dir, home) = home_with(&format!(
        "{MODEL}mcp_servers:\n  quits:\n    command: sh\n    args: [-c, 'echo starting >&2; exit 3']\n    connect_timeout: 20\n  nowhere:\n    url: http://127.0.0.1:{port}/mcp\n    connect_timeout: 20\n"
    ));
    for (server, expected) in [
        (
            "quits",
            "`sh` started but the MCP handshake failed: the program ended",
        ),
        ("nowhere", "the MCP handshake with http://127.0.0.1:"),
    ] {
        let out = talaria(&home, &["mcp", "test", server]);
        assert!(!out.status.success());
        let said = text(&out.stderr);
        assert!(said.contains(expected), "{said}");
        for rust in [
            "::",
            "WorkerTransport",
            "Transport [",
            "<",
            "Send message error",
        ] {
            assert!(!said.contains(rust), "{rust} in: {said}");
        }
    }
    // What the program said is in the log the message points at.
    let out = talaria(&home, &["mcp", "test", "quits"]);
    let log_path = home.join("logs/talaria.log");
    let said = text(&out.stderr);
    assert!(
        said.contains(&format!(
            "What `sh` wrote to its standard error is in {}.",
            log_path.display()
        )),
        "{said}"
    );
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.contains("starting"), "{log}");
}

#[test]
fn help_says_what_talaria_is() {
    let dir = tempfile::tempdir().unwrap();
    let out = talaria(dir.path(), &["--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    assert!(
        help.starts_with("Talaria: a self-hosted AI agent"),
        "{help}"
    );
    assert!(!help.contains("The `talaria` command."), "{help}");
}

#[test]
fn chat_with_a_message_hints_at_dash_q() {
    let (_dir, home) = home_with(MODEL);
    let out = talaria(&home, &["chat", "hello there"]);
    assert_eq!(out.status.code(), Some(2));
    let said = text(&out.stderr);
    assert!(said.contains("talaria chat -q 'hello there'"), "{said}");
    assert!(!said.contains("unexpected argument"), "{said}");
}

#[test]
fn misfire_takes_both_spellings() {
    let (_dir, home) = home_with(MODEL);
    for spelling in ["run-once", "run_once", "skip"] {
        let out = talaria(
            &home,
            &[
                "cron",
                "add",
                "every 1h",
                "Check.",
                "--name",
                spelling,
                "--misfire",
                spelling,
            ],
        );
        assert!(out.status.success(), "{spelling}: {}", text(&out.stderr));
    }
}

#[test]
fn counts_are_pluralised() {
    let (_dir, home) = home_with(MODEL);
    let memories = home.join("memories");
    std::fs::create_dir_all(&memories).unwrap();
    std::fs::write(memories.join("MEMORY.md"), "Only one thing.\n").unwrap();
    let out = talaria(&home, &["memory", "show"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(shown.contains(", 1 entry):"), "{shown}");
    assert!(shown.contains(", 0 entries):"), "{shown}");
    assert!(!shown.contains("1 entries"), "{shown}");
}

#[test]
fn send_local_says_which_file_it_wrote() {
    let (_dir, home) = home_with(MODEL);
    let mut child = command(&home, &["send", "local", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"the nightly backup finished\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    let path = said
        .trim()
        .strip_prefix("wrote ")
        .unwrap_or_else(|| panic!("no path in: {said}"));
    let written = std::fs::read_to_string(path).unwrap();
    assert!(written.contains("the nightly backup finished"), "{written}");
}

#[test]
fn people_are_not_told_internal_tool_names() {
    let (_dir, home) = home_with(MODEL);
    let out = talaria(&home, &["skills", "show", "no-such-skill"]);
    assert!(!out.status.success());
    let said = text(&out.stderr);
    assert!(said.contains("`talaria skills list` shows them"), "{said}");
    assert!(!said.contains("skills_list"), "{said}");

    let out = talaria(
        &home,
        &[
            "cron",
            "add",
            "every 1h",
            "Check.",
            "--skill",
            "no-such-skill",
        ],
    );
    assert!(!out.status.success());
    let said = text(&out.stderr);
    assert!(said.contains("`talaria skills list` shows them"), "{said}");
    assert!(!said.contains("skills_list"), "{said}");
}

/// The column (in characters) where each line's `marker` starts.
fn column_of(listing: &str, marker: &str) -> Vec<usize> {
    listing
        .lines()
        .filter_map(|l| l.find(marker).map(|byte| l[..byte].chars().count()))
        .collect()
}

#[test]
fn cron_list_columns_stay_aligned_with_long_names() {
    let (_dir, home) = home_with(MODEL);
    for name in ["a", "a-rather-long-job-name-for-the-weekly-report"] {
        let out = talaria(
            &home,
            &["cron", "add", "every 2h", "Check.", "--name", name],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let out = talaria(&home, &["cron", "list"]);
    let listing = text(&out.stdout);
    let states = column_of(&listing, "every 2h");
    assert_eq!(states.len(), 2, "{listing}");
    assert_eq!(states[0], states[1], "{listing}");
    let header = listing.lines().next().unwrap();
    assert_eq!(header.find("schedule"), Some(states[0]), "{listing}");
}

#[test]
fn skill_and_mcp_lists_stay_aligned_with_long_names() {
    let (_dir, home) = home_with(&format!(
        "{MODEL}mcp_servers:\n  a:\n    command: a-program\n  a-server-with-a-long-name-indeed:\n    command: another-program\n"
    ));
    let out = talaria(&home, &["mcp", "list"]);
    let listing = text(&out.stdout);
    assert_eq!(column_of(&listing, "stdio:").len(), 2, "{listing}");
    let starts = column_of(&listing, "stdio:");
    assert_eq!(starts[0], starts[1], "{listing}");

    let skill = home.join("skills/a-skill-with-a-remarkably-long-name-for-testing");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: a-skill-with-a-remarkably-long-name-for-testing\ndescription: Long.\n---\nDo it.\n",
    )
    .unwrap();
    let out = talaria(&home, &["skills", "list"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listing = text(&out.stdout);
    let used = column_of(&listing, " used ");
    assert!(used.len() > 1, "{listing}");
    assert!(used.iter().all(|c| *c == used[0]), "{listing}");
}

#[test]
fn skills_in_the_repl_are_cut_at_a_word() {
    use rexpect::reader::Options;
    use rexpect::session::spawn_with_options;

    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = rt.block_on(MockOpenAi::start());
    let (dir, home) = home_with(&format!(
        "model:\n  default: mock-model\n  base_url: {}\n",
        mock.base_url()
    ));
    let skill = home.join("skills/wordy");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: wordy\ndescription: Explains how to rotate the backup keys of the archive server without interrupting the nightly replication\n---\nDo it.\n",
    )
    .unwrap();
    // Not `command()`: its null stdin would end the REPL at once.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_talaria"));
    cmd.arg("--home")
        .arg(&home)
        .arg("chat")
        .env_remove("TALARIA_HOME")
        .env_remove("TALARIA_LOG")
        .current_dir(dir.path());
    let mut p = spawn_with_options(
        cmd,
        Options::new()
            .timeout_ms(Some(20_000))
            .strip_ansi_escape_codes(true),
    )
    .unwrap();
    p.exp_string("Type /help").unwrap();
    p.send_line("/skills").unwrap();
    let (_, line) = p.exp_regex(r"/wordy - [^\r\n]*").unwrap();
    // rexpect reads bytes as Latin-1: the ellipsis arrives as three bytes.
    assert!(
        line.ends_with("archive server without\u{e2}\u{80}\u{a6}"),
        "{line:?}"
    );
    p.send_line("/exit").unwrap();
    p.exp_eof().unwrap();
}

/// `--skill a,b` names two skills, as `--skill a --skill b` does (it was
/// taken for one skill named "a,b").
#[test]
fn cron_skills_may_be_given_separated_by_commas() {
    let (_dir, home) = home_with(MODEL);
    for name in ["alpha", "beta"] {
        let dir = home.join("skills").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("SKILL.md"),
            format!("---\nname: {name}\ndescription: {name} things\n---\nDo {name}.\n"),
        )
        .unwrap();
    }
    let out = talaria(
        &home,
        &["cron", "add", "every 1h", "Check.", "--skill", "alpha,beta"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = talaria(
        &home,
        &["cron", "add", "every 1h", "Check.", "--skill", "alpha,nope"],
    );
    assert!(!out.status.success());
    let said = text(&out.stderr);
    assert!(said.contains("no skill named `nope`"), "{said}");
}
