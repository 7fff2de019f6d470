//! `talaria approvals list | revoke` through the binary: the commands
//! approved with "always", and what becomes of an allowlist an older
//! version wrote (its pattern keys allowed whole kinds of command).

use std::path::Path;
use std::process::{Command, Output, Stdio};

fn talaria(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("TALARIA_HOME")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const HEADER: &str = "# Talaria command allowlist (format 2)\n";

fn home_with(allowlist: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("command_allowlist.txt"), allowlist).unwrap();
    (dir, home)
}

#[test]
fn list_numbers_the_commands_and_revoke_takes_one_back_by_number_or_text() {
    let (_dir, home) = home_with(&format!(
        "{HEADER}rm -r build\ngit push --force origin main\nrm -r somedir\n"
    ));
    let list = talaria(&home, &["approvals", "list"]);
    assert!(list.status.success(), "{}", stderr(&list));
    let out = stdout(&list);
    assert!(out.contains("  1. rm -r build\n"), "{out}");
    assert!(out.contains("  2. git push --force origin main\n"), "{out}");
    assert!(out.contains("  3. rm -r somedir\n"), "{out}");

    let by_number = talaria(&home, &["approvals", "revoke", "2"]);
    assert!(by_number.status.success(), "{}", stderr(&by_number));
    assert!(
        stdout(&by_number).contains("Revoked: git push --force origin main"),
        "{}",
        stdout(&by_number)
    );
    // Quoted, as one argument.
    let by_text = talaria(&home, &["approvals", "revoke", "rm -r somedir"]);
    assert!(by_text.status.success(), "{}", stderr(&by_text));

    let out = stdout(&talaria(&home, &["approvals", "list"]));
    assert!(out.contains("  1. rm -r build\n"), "{out}");
    assert!(
        !out.contains("git push") && !out.contains("somedir"),
        "{out}"
    );
    let file = std::fs::read_to_string(home.join("command_allowlist.txt")).unwrap();
    assert!(file.starts_with(HEADER), "{file}");
    assert!(
        !file.contains("git push") && !file.contains("somedir"),
        "{file}"
    );
}

#[test]
fn revoking_what_is_not_there_fails_with_a_pointer_to_list() {
    let (_dir, home) = home_with(&format!("{HEADER}rm -r build\n"));
    for wanted in ["rm -r other", "7"] {
        let out = talaria(&home, &["approvals", "revoke", wanted]);
        assert!(!out.status.success(), "{wanted}");
        assert!(
            stderr(&out).contains("is not an approved command. `talaria approvals list`"),
            "{}",
            stderr(&out)
        );
    }
    assert!(stdout(&talaria(&home, &["approvals", "list"])).contains("1. rm -r build"));
}

#[test]
fn an_empty_home_has_nothing_approved_and_gets_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let list = talaria(&home, &["approvals", "list"]);
    assert!(list.status.success(), "{}", stderr(&list));
    assert!(stdout(&list).contains("No commands are approved with \"always\"."));
    assert!(!home.join("command_allowlist.txt").exists());
}

#[test]
fn config_entries_are_shown_apart_and_not_revoked_here() {
    let (_dir, home) = home_with(&format!("{HEADER}rm -r build\n"));
    std::fs::write(
        home.join("config.yaml"),
        "command_allowlist:\n  - \"git push origin *\"\n",
    )
    .unwrap();
    let out = stdout(&talaria(&home, &["approvals", "list"]));
    assert!(out.contains("1. rm -r build"), "{out}");
    assert!(
        out.contains("Also allowed by command_allowlist in"),
        "{out}"
    );
    assert!(out.contains("git push origin *"), "{out}");
    let revoke = talaria(&home, &["approvals", "revoke", "git push origin *"]);
    assert!(!revoke.status.success());
}

/// An older version's "always" stored the pattern key: every `rm -r`
/// anywhere ran unasked. Those lines are retired with a one-time notice;
/// other lines stay, as exact commands.
#[test]
fn an_old_allowlist_loses_its_pattern_keys_with_one_notice() {
    let (_dir, home) = home_with(
        "# Command patterns approved with \"always\"; commands matching them run\n\
         # without asking. One pattern key or command glob per line.\n\
         recursive delete (rm -r)\n\
         make clean\n",
    );
    let first = talaria(&home, &["approvals", "list"]);
    assert!(first.status.success(), "{}", stderr(&first));
    let notice = stderr(&first);
    assert!(
        notice.contains("recursive delete (rm -r)") && notice.contains("no longer honoured"),
        "{notice}"
    );
    let out = stdout(&first);
    assert!(out.contains("  1. make clean\n"), "{out}");
    assert!(!out.contains("recursive delete"), "{out}");

    let second = talaria(&home, &["approvals", "list"]);
    assert!(
        !stderr(&second).contains("no longer honoured"),
        "the notice comes once: {}",
        stderr(&second)
    );
    assert_eq!(stdout(&second), out);
    let file = std::fs::read_to_string(home.join("command_allowlist.txt")).unwrap();
    assert!(file.starts_with(HEADER), "{file}");
    assert!(
        file.lines()
            .any(|l| l.starts_with("# ") && l.ends_with(": recursive delete (rm -r)")),
        "{file}"
    );
}
