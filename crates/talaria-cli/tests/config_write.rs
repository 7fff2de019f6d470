//! `talaria config get | set | edit` through the binary: `set` changes
//! one line of a file full of comments and leaves every other byte alone,
//! adds a missing key under its parent, writes nothing for a value the
//! configuration would refuse; `edit` checks what the editor left, puts
//! the previous file back when it is wrong, and offers another go on a
//! terminal.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use rexpect::reader::Options;
use rexpect::session::spawn_with_options;

/// A configuration as people keep theirs: comments everywhere, blank
/// lines, a block indented by four, a flow mapping, a `#` inside quotes.
const COMMENTED: &str = "\
# Talaria: my settings.
# Keep the model on the GPU box.

model:
  # which model answers
  default: qwen3:32b      # the big one
  base_url: http://127.0.0.1:9/v1
  routes:
    fast: {model: qwen3:4b}   # for quick questions

# How long a turn may go on.
agent:
    max_turns: 20         # four-space block
    api_max_retries: 1

web:
  timeout_secs: 20
  # search comes later

terminal:
  cwd: \"/srv/work # not a comment\"
# the end
";

struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn with(config: &str) -> Home {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.yaml"), config).unwrap();
        Home { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn config(&self) -> PathBuf {
        self.path().join("config.yaml")
    }

    fn text(&self) -> String {
        std::fs::read_to_string(self.config()).unwrap()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_talaria"));
        cmd.arg("--home")
            .arg(self.path())
            .args(args)
            .env_remove("TALARIA_HOME")
            .env_remove("TALARIA_MODEL")
            .env_remove("TALARIA_BASE_URL")
            .env_remove("TELEGRAM_BOT_TOKEN")
            .env_remove("VISUAL")
            .env_remove("EDITOR")
            .env("RUST_BACKTRACE", "1");
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).stdin(Stdio::null()).output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "{args:?}: {:?}\nstdout: {}\nstderr: {}",
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    /// Files in the home whose names start with `prefix`.
    fn files(&self, prefix: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(prefix))
            .collect();
        names.sort();
        names
    }

    /// An executable script in the home (outside what the tests look at).
    fn script(&self, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let dir = self.path().join("bin");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn set_changes_one_line_of_a_commented_file_and_keeps_the_old_one() {
    let home = Home::with(COMMENTED);
    let said = home.ok(&["config", "set", "agent.max_turns", "30"]);
    assert!(said.contains("agent.max_turns: 20 -> 30"), "{said}");
    let after = home.text();
    let before_lines: Vec<&str> = COMMENTED.lines().collect();
    let after_lines: Vec<&str> = after.lines().collect();
    assert_eq!(before_lines.len(), after_lines.len(), "{after}");
    for (old, new) in before_lines.iter().zip(&after_lines) {
        if old.contains("max_turns") {
            assert_eq!(*new, "    max_turns: 30         # four-space block");
        } else {
            assert_eq!(old, new);
        }
    }
    assert!(after.ends_with("# the end\n"));
    assert_eq!(
        std::fs::read_to_string(home.path().join("config.yaml.bak")).unwrap(),
        COMMENTED
    );
    assert_eq!(home.ok(&["config", "get", "agent.max_turns"]), "30\n");

    // Text that would read as something else is written quoted, and reads
    // back as the text given.
    home.ok(&["config", "set", "model.default", "'true'"]);
    assert!(
        home.text()
            .contains("  default: 'true'      # the big one\n")
    );
    assert_eq!(home.ok(&["config", "get", "model.default"]), "true\n");
    // The flow mapping is edited inside its braces.
    home.ok(&["config", "set", "model.routes.fast.model", "qwen3:8b"]);
    assert!(
        home.text()
            .contains("    fast: {model: qwen3:8b}   # for quick questions\n"),
        "{}",
        home.text()
    );
    // Setting the value it has changes nothing, and keeps no backup of it.
    let backup = std::fs::read(home.path().join("config.yaml.bak")).unwrap();
    let unchanged = home.text();
    let said = home.ok(&["config", "set", "agent.max_turns", "30"]);
    assert!(said.contains("nothing changed"), "{said}");
    assert_eq!(home.text(), unchanged);
    assert_eq!(
        std::fs::read(home.path().join("config.yaml.bak")).unwrap(),
        backup
    );
    assert!(home.files(".talaria-").is_empty(), "{:?}", home.files(""));
}

#[test]
fn set_adds_a_missing_key_under_its_parent_and_makes_missing_parents() {
    let home = Home::with(COMMENTED);
    home.ok(&["config", "set", "web.search.backend", "searxng"]);
    let after = home.text();
    // Beside its siblings, at their indentation; nothing else moved.
    let added = "  search:\n    backend: searxng\n";
    assert!(
        after.contains(&format!(
            "web:\n  timeout_secs: 20\n{added}  # search comes later\n"
        )),
        "{after}"
    );
    assert_eq!(after.replacen(added, "", 1), COMMENTED);
    assert_eq!(
        home.ok(&["config", "get", "web.search.backend"]),
        "searxng\n"
    );

    // A section the file does not have yet goes at the end.
    home.ok(&["config", "set", "browser.idle_timeout_secs", "120"]);
    let last = home.text();
    assert_eq!(
        last,
        format!("{after}browser:\n  idle_timeout_secs: 120\n"),
        "{last}"
    );
    // Under the four-space block, with its indentation.
    home.ok(&["config", "set", "agent.stream", "false"]);
    assert!(
        home.text()
            .contains("    api_max_retries: 1\n    stream: false\n"),
        "{}",
        home.text()
    );
    let out = home.run(&["config", "check"]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    // No file yet: one is made, readable by its owner only.
    let fresh = Home::with("");
    std::fs::remove_file(fresh.config()).unwrap();
    fresh.ok(&["config", "set", "model.default", "qwen3:4b"]);
    assert_eq!(fresh.text(), "model:\n  default: qwen3:4b\n");
    assert!(fresh.files("config.yaml.bak").is_empty());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(fresh.config())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
}

#[test]
fn set_writes_nothing_the_configuration_would_refuse() {
    let home = Home::with(COMMENTED);
    for (args, why) in [
        (
            ["agent.max_turns", "0"],
            "expected an integer of at least 1",
        ),
        (["agent.max_turns", "lots"], "not the text \"lots\""),
        (["model.base_url", "ftp://x"], "model.base_url"),
        // A misspelt key is never written: nothing would read it.
        (["agent.max_turn", "3"], "`agent` has: "),
        (["model", "x"], "`model` is a mapping of settings"),
        (["agent.max_turns", "hello: world"], "quote it"),
        (["agent.max_turns", "[1, 2]"], "talaria config edit"),
        (["terminal.cwd.x", "1"], "`terminal.cwd` is text"),
    ] {
        let mut all = vec!["config", "set"];
        all.extend(args);
        let out = home.run(&all);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
        assert!(err.contains("nothing was written"), "{args:?}: {err}");
        assert_eq!(home.text(), COMMENTED, "{args:?}");
    }
    assert!(
        home.files("config.yaml.").is_empty(),
        "{:?}",
        home.files("")
    );
    assert!(home.files(".talaria-").is_empty(), "{:?}", home.files(""));

    // `get` names what there is when a key is not a setting.
    let out = home.run(&["config", "get", "agent.max_turn"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no setting `agent.max_turn`; `agent` has: ")
            && text(&out.stderr).contains("max_turns"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn get_prints_the_value_in_effect_with_secrets_masked() {
    let home = Home::with(COMMENTED);
    std::fs::write(
        home.path().join(".env"),
        "TELEGRAM_BOT_TOKEN=123456:ABCDEFGHIJKLMNOPQRSTUVWX\n",
    )
    .unwrap();
    let out = home.run(&["config", "get", "platforms.telegram.token"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert_eq!(shown.trim(), "****UVWX", "{shown}");
    assert!(text(&out.stderr).contains("TELEGRAM_BOT_TOKEN in .env"));
    // A mapping is printed as YAML.
    let routes = home.ok(&["config", "get", "model.routes"]);
    assert!(
        routes.contains("fast:") && routes.contains("model: qwen3:4b"),
        "{routes}"
    );
    // Defaults count: a setting the file leaves out has its value.
    assert_eq!(
        home.ok(&["config", "get", "browser.max_contexts"])
            .trim()
            .parse::<u32>()
            .map(|n| n > 0),
        Ok(true)
    );
}

#[test]
fn edit_keeps_a_valid_result_and_puts_the_old_file_back_after_an_invalid_one() {
    let home = Home::with(COMMENTED);
    let good = home.script("good", "sed -i 's/max_turns: 20/max_turns: 25/' \"$1\"");
    let out = home
        .command(&["config", "edit"])
        .env("EDITOR", &good)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        home.text(),
        COMMENTED.replace("max_turns: 20", "max_turns: 25")
    );
    assert_eq!(
        std::fs::read_to_string(home.path().join("config.yaml.bak")).unwrap(),
        COMMENTED
    );
    let valid = home.text();

    // Wrong, without a terminal: said why, kept aside, old file back.
    let bad = home.script("bad", "sed -i 's/max_turns: 25/max_turns: 0/' \"$1\"");
    let out = home
        .command(&["config", "edit"])
        .env("EDITOR", &bad)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("agent.max_turns"), "{err}");
    assert!(err.contains("expected an integer of at least 1"), "{err}");
    assert_eq!(home.text(), valid);
    let aside = home.files("config.yaml.rejected-");
    assert_eq!(aside.len(), 1, "{:?}", home.files(""));
    assert_eq!(
        std::fs::read_to_string(home.path().join(&aside[0])).unwrap(),
        valid.replace("max_turns: 25", "max_turns: 0")
    );

    // An editor that fails leaves nothing of what it did.
    let quit = home.script("quit", "echo 'half: [' >> \"$1\"; exit 3");
    let out = home
        .command(&["config", "edit"])
        .env("VISUAL", &quit)
        .env("EDITOR", &good)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("failed"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(home.text(), valid);

    // No change: nothing written, no backup taken.
    let backup = std::fs::read(home.path().join("config.yaml.bak")).unwrap();
    let out = home
        .command(&["config", "edit"])
        .env("EDITOR", "true")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(text(&out.stdout).contains("no changes"));
    assert_eq!(
        std::fs::read(home.path().join("config.yaml.bak")).unwrap(),
        backup
    );
}

#[test]
fn edit_on_a_terminal_offers_another_go_at_an_invalid_file() {
    let home = Home::with(COMMENTED);
    // Breaks the file the first time, mends it the second.
    let count = home.path().join("bin/count");
    let editor = home.script(
        "twice",
        &format!(
            "if [ -e '{c}' ]; then sed -i 's/max_turns: oops/max_turns: 40/' \"$1\"; \
             else touch '{c}'; sed -i 's/max_turns: 20/max_turns: oops/' \"$1\"; fi",
            c = count.display()
        ),
    );
    let mut cmd = home.command(&["config", "edit"]);
    cmd.env("EDITOR", &editor);
    let mut p = spawn_with_options(
        cmd,
        Options::new()
            .timeout_ms(Some(20_000))
            .strip_ansi_escape_codes(true),
    )
    .unwrap();
    let said = p.exp_string("Edit again? [Y/n]").unwrap();
    assert!(said.contains("agent.max_turns"), "{said}");
    p.send_line("y").unwrap();
    let rest = p.exp_eof().unwrap();
    assert!(rest.contains("saved"), "{rest}");
    let status = p.process().wait().unwrap();
    assert!(
        matches!(status, rexpect::process::WaitStatus::Exited(_, 0)),
        "{status:?}"
    );
    assert_eq!(
        home.text(),
        COMMENTED.replace("max_turns: 20", "max_turns: 40")
    );
    assert_eq!(
        std::fs::read_to_string(home.path().join("config.yaml.bak")).unwrap(),
        COMMENTED
    );
    assert!(home.files("config.yaml.rejected").is_empty());

    // Declining (here with Ctrl-C, which must not end the command before
    // it restores) puts the old file back, the attempt kept aside.
    std::fs::write(home.config(), COMMENTED).unwrap();
    std::fs::remove_file(&count).unwrap();
    let mut cmd = home.command(&["config", "edit"]);
    cmd.env("EDITOR", &editor);
    let mut p = spawn_with_options(
        cmd,
        Options::new()
            .timeout_ms(Some(20_000))
            .strip_ansi_escape_codes(true),
    )
    .unwrap();
    p.exp_string("Edit again? [Y/n]").unwrap();
    p.send_control('c').unwrap();
    let rest = p.exp_eof().unwrap();
    assert!(rest.contains("is as it was"), "{rest}");
    let status = p.process().wait().unwrap();
    assert!(
        matches!(status, rexpect::process::WaitStatus::Exited(_, 1)),
        "{status:?}"
    );
    assert_eq!(home.text(), COMMENTED);
    assert_eq!(home.files("config.yaml.rejected-").len(), 1);
}
