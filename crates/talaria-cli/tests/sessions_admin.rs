//! Looking after stored sessions through the binary, against a real
//! `state.db`: `sessions export` (JSONL that reads back, markdown for
//! reading, every session a page at a time), `delete` (asked on a
//! terminal, refused without one), `prune` (only what has been idle long
//! enough, never what a gateway owes an answer), `rename` and `stats`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use rexpect::reader::Options;
use rexpect::session::spawn_with_options;
use talaria_core::{Message, ToolCall};
use talaria_store::{
    NewOwedTurn, NewSession, NodeId, OwedTurnStore, RouteStore, SessionRecord, SessionStore,
    SqliteStore,
};

struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        Home {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn db(&self) -> PathBuf {
        self.path().join("state.db")
    }

    fn store(&self) -> SqliteStore {
        SqliteStore::open(&self.db()).unwrap()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_talaria"));
        cmd.arg("--home")
            .arg(self.path())
            .args(args)
            .env_remove("TALARIA_HOME")
            .env("RUST_BACKTRACE", "1");
        cmd
    }

    /// The command with no terminal: stdin is empty, as in a script.
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

    /// The command on a pseudo-terminal: answers `answer` to its question
    /// and returns what it showed and whether it succeeded.
    fn on_terminal(&self, args: &[&str], question: &str, answer: &str) -> (String, bool) {
        let mut p = spawn_with_options(
            self.command(args),
            Options::new()
                .timeout_ms(Some(20_000))
                .strip_ansi_escape_codes(true),
        )
        .unwrap();
        let asked = p.exp_string(question).unwrap();
        p.send_line(answer).unwrap();
        let rest = p.exp_eof().unwrap();
        let status = p.process().wait().unwrap();
        let ok = matches!(status, rexpect::process::WaitStatus::Exited(_, 0));
        (format!("{asked}{question}{rest}"), ok)
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn session(id: &str, source: &str) -> NewSession {
    NewSession {
        id: id.to_owned(),
        source: source.to_owned(),
        chat_id: Some("42".to_owned()),
        model: Some("mock-model".to_owned()),
        ..NewSession::default()
    }
}

/// A conversation with a tool call, whose first exchange a compression
/// replaced: 2 replaced rows, then 5 that stand.
async fn conversation(store: &SqliteStore, id: &str, source: &str, word: &str) {
    store.create_session(session(id, source)).await.unwrap();
    store
        .append_message(id, &Message::user("forgotten question"))
        .await
        .unwrap();
    store
        .append_message(id, &Message::assistant("forgotten answer"))
        .await
        .unwrap();
    store
        .replace_active(id, &[Message::user("summary of earlier")])
        .await
        .unwrap();
    store
        .append_message(id, &Message::user(format!("what is in the {word} folder?")))
        .await
        .unwrap();
    let call = ToolCall {
        id: "call_1".into(),
        name: "terminal".into(),
        arguments: "{\"command\":\"ls\"}".into(),
    };
    store
        .append_message(id, &Message::assistant_tool_calls("", vec![call]))
        .await
        .unwrap();
    store
        .append_message(
            id,
            &Message::tool_result("call_1", "terminal", "a.txt\n```\nnot a fence\n```"),
        )
        .await
        .unwrap();
    store
        .append_message(id, &Message::assistant("There is a.txt."))
        .await
        .unwrap();
    store
        .set_title(id, &format!("the {word} folder"))
        .await
        .unwrap();
}

const A: &str = "20260101_100000_aaaa01";
const B: &str = "20260102_100000_bbbb02";

#[tokio::test(flavor = "multi_thread")]
async fn export_writes_jsonl_that_reads_back_and_markdown_for_reading() {
    let home = Home::new();
    let store = home.store();
    conversation(&store, A, "cli", "photos").await;
    conversation(&store, B, "telegram", "music").await;
    // More sessions than one page holds, so `--all` pages through.
    for i in 0..250 {
        store
            .create_session(session(&format!("20250101_000000_{i:06}"), "api"))
            .await
            .unwrap();
    }

    let jsonl = home.ok(&["sessions", "export", "--all"]);
    let lines: Vec<serde_json::Value> = jsonl
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 252);
    let ids: Vec<&str> = lines
        .iter()
        .map(|l| l["session"]["id"].as_str().unwrap())
        .collect();
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(ids, sorted, "every session once, in id order");

    // A whole session reads back as the store holds it, replaced rows
    // marked.
    let a = lines.iter().find(|l| l["session"]["id"] == A).unwrap();
    assert_eq!(a["version"], 1);
    let record: SessionRecord = serde_json::from_value(a["session"].clone()).unwrap();
    assert_eq!(record, store.session(A).await.unwrap().unwrap());
    let rows = a["messages"].as_array().unwrap();
    let stored = store.message_window(A, 1, 0, 100).await.unwrap();
    assert_eq!(rows.len(), 7);
    assert_eq!(rows.len(), stored.len());
    for (row, want) in rows.iter().zip(&stored) {
        let message: Message = serde_json::from_value(row.clone()).unwrap();
        assert_eq!(message, want.message);
        assert_eq!(row["id"], want.id);
        assert_eq!(row["active"], want.active);
        assert_eq!(row["timestamp"].as_f64(), Some(want.timestamp));
    }
    let active: Vec<bool> = rows.iter().map(|r| r["active"] == true).collect();
    assert_eq!(active, [false, false, true, true, true, true, true]);

    // One source only.
    let api = home.ok(&["sessions", "export", "--all", "--source", "telegram"]);
    assert_eq!(api.lines().count(), 1, "{api}");
    assert!(api.contains(B));

    // Markdown, to a new file only you can read.
    let out = home.path().join("exports");
    std::fs::create_dir(&out).unwrap();
    let file = out.join("a.md");
    let file_arg = file.to_str().unwrap();
    let done = home.run(&[
        "sessions", "export", A, "--format", "markdown", "-o", file_arg,
    ]);
    assert!(done.status.success(), "{}", text(&done.stderr));
    assert!(
        text(&done.stderr).contains("exported 1 session to"),
        "{}",
        text(&done.stderr)
    );
    let md = std::fs::read_to_string(&file).unwrap();
    assert!(md.starts_with("# the photos folder\n"), "{md}");
    assert!(md.contains(&format!("- id: `{A}`")), "{md}");
    assert!(md.contains("what is in the photos folder?"), "{md}");
    assert!(md.contains("**Tool call** `terminal`"), "{md}");
    // The output's own fence stays inside a longer one.
    assert!(
        md.contains("````text\na.txt\n```\nnot a fence\n```\n````"),
        "{md}"
    );
    assert!(md.contains("There is a.txt."), "{md}");
    assert!(md.contains("2 rows replaced"), "{md}");
    assert!(!md.contains("forgotten question"), "{md}");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    let left: Vec<_> = std::fs::read_dir(&out).unwrap().collect();
    assert_eq!(left.len(), 1, "no temporary file is left beside it");

    // An existing file is never replaced.
    let again = home.run(&["sessions", "export", B, "-o", file_arg]);
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("exists"),
        "{}",
        text(&again.stderr)
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), md);

    let missing = home.run(&["sessions", "export", "20990101_000000_ffff"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        text(&missing.stderr).contains("no session has the id or title `20990101_000000_ffff`")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_asks_on_a_terminal_and_refuses_without_one() {
    let home = Home::new();
    let store = home.store();
    conversation(&store, A, "cli", "photos").await;
    conversation(&store, B, "telegram", "zebracorn").await;
    store.set_route("telegram:dm:42", B).await.unwrap();

    // A script without --yes: refused, nothing deleted.
    let out = home.run(&["sessions", "delete", A]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--yes"), "{}", text(&out.stderr));
    assert!(store.session(A).await.unwrap().is_some());

    // On a terminal: asked, and "no" keeps it.
    let (shown, ok) = home.on_terminal(&["sessions", "delete", A], "[y/N]", "n");
    assert!(!ok, "{shown}");
    assert!(shown.contains("the photos folder"), "{shown}");
    assert!(shown.contains("5 messages"), "{shown}");
    assert!(shown.contains("nothing deleted"), "{shown}");
    assert!(store.session(A).await.unwrap().is_some());

    let (shown, ok) = home.on_terminal(&["sessions", "delete", A], "[y/N]", "y");
    assert!(ok, "{shown}");
    assert!(shown.contains(&format!("deleted session {A}")), "{shown}");
    assert!(store.session(A).await.unwrap().is_none());

    // --yes for scripts: the transcript, its search entries and the
    // chat's route go with it.
    assert!(home.ok(&["sessions", "search", "zebracorn"]).contains(B));
    home.ok(&["sessions", "delete", B, "--yes"]);
    assert!(store.session(B).await.unwrap().is_none());
    assert!(store.route("telegram:dm:42").await.unwrap().is_none());
    assert!(!home.ok(&["sessions", "search", "zebracorn"]).contains(B));

    let out = home.run(&["sessions", "delete", B, "--yes"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains(&format!("no session has the id or title `{B}`")));
}

#[tokio::test(flavor = "multi_thread")]
async fn prune_deletes_only_what_has_been_idle_long_enough() {
    let home = Home::new();
    let store = home.store();
    let old_cli = "20250101_000000_old001";
    let old_telegram = "20250101_000000_old002";
    let owed = "20250101_000000_owed03";
    let ten_days = "20250101_000000_ten004";
    let fresh = "20250101_000000_new005";
    for (id, source) in [
        (old_cli, "cli"),
        (old_telegram, "telegram"),
        (owed, "telegram"),
        (ten_days, "cli"),
        (fresh, "cli"),
    ] {
        conversation(&store, id, source, "old").await;
    }
    for id in [old_cli, old_telegram, owed] {
        talaria_testkit::state_db::age_session(&home.db(), id, 40.0);
    }
    talaria_testkit::state_db::age_session(&home.db(), ten_days, 10.0);
    // A message a gateway accepted for the chat routed to `owed`, not
    // answered yet.
    store.set_route("telegram:dm:7", owed).await.unwrap();
    let turn = NewOwedTurn {
        id: "t1".into(),
        session_key: "telegram:dm:7".into(),
        platform: "telegram".into(),
        event: "{}".into(),
        owner: NodeId::new("node-a").unwrap(),
    };
    assert!(store.accept_turn(None, turn).await.unwrap());
    let all = [old_cli, old_telegram, owed, ten_days, fresh];
    let exists = |id: &'static str| {
        let store = &store;
        async move { store.session(id).await.unwrap().is_some() }
    };

    // The dry run lists what would go, and changes nothing.
    let listed = home.ok(&["sessions", "prune", "--older-than", "30", "--dry-run"]);
    assert!(
        listed.contains(old_cli) && listed.contains(old_telegram),
        "{listed}"
    );
    for kept in [owed, ten_days, fresh] {
        assert!(!listed.contains(kept), "{listed}");
    }
    assert!(
        listed.contains("1 session idle that long is kept: a running gateway owes it an answer"),
        "{listed}"
    );
    assert!(
        listed.contains("dry run: 2 sessions (10 messages)")
            && listed.contains("nothing was changed"),
        "{listed}"
    );
    for id in all {
        assert!(exists(id).await, "{id}");
    }

    // Without a terminal and without --yes: refused.
    let out = home.run(&["sessions", "prune", "--older-than", "30"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--yes"), "{}", text(&out.stderr));
    for id in all {
        assert!(exists(id).await, "{id}");
    }

    // One source.
    let said = home.ok(&[
        "sessions",
        "prune",
        "--older-than",
        "30",
        "--source",
        "telegram",
        "--yes",
    ]);
    assert!(said.contains("deleted 1 session"), "{said}");
    assert!(!exists(old_telegram).await);
    assert!(exists(old_cli).await);
    assert!(exists(owed).await);

    let said = home.ok(&["sessions", "prune", "--older-than", "30", "--yes"]);
    assert!(said.contains("deleted 1 session"), "{said}");
    assert!(!exists(old_cli).await);
    assert!(exists(ten_days).await);

    let said = home.ok(&["sessions", "prune", "--older-than", "5", "--yes"]);
    assert!(said.contains("deleted 1 session"), "{said}");
    assert!(!exists(ten_days).await);
    assert!(exists(fresh).await);
    assert!(exists(owed).await);

    let said = home.ok(&[
        "sessions",
        "prune",
        "--older-than",
        "5",
        "--source",
        "bogus",
    ]);
    assert!(said.contains("No sessions from `bogus`"), "{said}");
}

#[tokio::test(flavor = "multi_thread")]
async fn rename_titles_a_session_and_stats_count_what_is_stored() {
    let home = Home::new();
    let store = home.store();
    conversation(&store, A, "cli", "photos").await;
    conversation(&store, B, "telegram", "music").await;
    store
        .create_session(session("20260103_100000_cccc03", "cli"))
        .await
        .unwrap();

    let said = home.ok(&["sessions", "rename", A, "Trip", "to", "Lyon"]);
    assert!(said.contains("the photos folder -> Trip to Lyon"), "{said}");
    let list = home.ok(&["sessions", "list"]);
    assert!(
        list.lines()
            .any(|l| l.starts_with(A) && l.ends_with("Trip to Lyon")),
        "{list}"
    );
    let out = home.run(&["sessions", "rename", "20990101_000000_ffff", "x"]);
    assert_eq!(out.status.code(), Some(1));
    let out = home.run(&["sessions", "rename", A, "  "]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("visible character"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        store.session(A).await.unwrap().unwrap().title.as_deref(),
        Some("Trip to Lyon")
    );

    let table = home.ok(&["sessions", "stats"]);
    assert!(
        table.starts_with(&format!("database: {}", home.db().display())),
        "{table}"
    );
    let row = |name: &str| -> Vec<String> {
        table
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} row in:\n{table}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(row("cli")[1..4], ["2", "5", "7"], "{table}");
    assert_eq!(row("telegram")[1..4], ["1", "5", "7"], "{table}");
    assert_eq!(row("total")[1..4], ["3", "10", "14"], "{table}");

    let json: serde_json::Value =
        serde_json::from_str(&home.ok(&["sessions", "stats", "--json"])).unwrap();
    assert_eq!(json["total"]["sessions"], 3);
    assert_eq!(json["sources"][0]["source"], "cli");
    // The session started last, after the others' last rows.
    let newest = store
        .session("20260103_100000_cccc03")
        .await
        .unwrap()
        .unwrap()
        .started_at;
    assert_eq!(json["total"]["last_active"].as_f64(), Some(newest));
    let size = json["size"]["bytes"].as_u64().unwrap();
    assert_eq!(size, std::fs::metadata(home.db()).unwrap().len());
}

/// Sessions may be named by a recent session's title (any case) as well
/// as by id; a title two sessions share is refused with both ids.
#[tokio::test(flavor = "multi_thread")]
async fn sessions_are_found_by_title_and_a_shared_title_is_refused() {
    let home = Home::new();
    let store = home.store();
    conversation(&store, A, "cli", "photos").await;
    conversation(&store, B, "telegram", "music").await;
    store.set_title(A, "Trip to Lyon").await.unwrap();

    let shown = home.ok(&["sessions", "show", "trip to lyon"]);
    assert!(shown.contains(&format!("session {A}")), "{shown}");
    let said = home.ok(&["sessions", "rename", "Trip to Lyon", "Lyon", "in", "May"]);
    assert!(said.contains(&format!("renamed {A}")), "{said}");
    let exported = home.ok(&["sessions", "export", "Lyon in May"]);
    assert!(exported.contains(A), "{exported}");

    store.set_title(B, "Lyon in May").await.unwrap();
    let out = home.run(&["sessions", "delete", "Lyon in May", "--yes"]);
    assert!(!out.status.success());
    let said = text(&out.stderr);
    assert!(said.contains("2 recent sessions are titled"), "{said}");
    assert!(said.contains(A) && said.contains(B), "{said}");
    let out = home.run(&["sessions", "show", "no such title"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("no session has the id or title"));
    assert!(store.session(A).await.unwrap().is_some() && store.session(B).await.unwrap().is_some());
}
