//! `talaria import hermes` on a home the real hermes-agent wrote.
//!
//! The ancestor (the `hermes-agent` package from PyPI, in the test
//! environment) runs two conversations against the mock model through
//! its own agent class: in the first the model saves a memory entry with
//! the `memory` tool and writes a skill with `skill_manage`. Then, through
//! the binary: a dry run lists what would come over and changes nothing;
//! the import makes the conversations searchable and one of them
//! continues with its history in a Talaria turn; memory and skill are
//! there; a second import adds nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use talaria_testkit::python::hermes_python;
use talaria_testkit::{MockOpenAi, Reply, ToolCallReply};

/// Drives hermes-agent: one `AIAgent` per conversation, writing to the
/// session database of `$HERMES_HOME`, then a title through its session
/// store, a cron job through its job store and a pairing approval through
/// its pairing store (a code asked for and approved). Prints each
/// conversation's session id on a line of its own.
const DRIVE_HERMES: &str = r#"
import sys
from hermes_state import SessionDB
from run_agent import AIAgent
from cron.jobs import create_job
from gateway.pairing import PairingStore

base_url = sys.argv[1]
ids = []
for text in sys.argv[2:]:
    agent = AIAgent(base_url=base_url, api_key="sk-test", model="mock-model",
                    quiet_mode=True, enabled_toolsets=["memory", "skills"],
                    session_db=SessionDB(), platform="cli", skip_context_files=True)
    result = agent.run_conversation(text)
    if not result.get("final_response"):
        sys.exit(f"no answer to {text!r}: {result!r}")
    ids.append(agent.session_id)
SessionDB().set_session_title(ids[0], "Tea and editors")
create_job("Summarise the news of the day.", "every 2h", name="news digest", deliver="local")
pairing = PairingStore()
code = pairing.generate_code("telegram", "424242", "Ada")
if not pairing.approve_code("telegram", code):
    sys.exit("the pairing code was not approved")
for i in ids:
    print("SESSION", i)
"#;

const SKILL: &str = "---\nname: brew-tea\ndescription: Brew green tea properly.\n---\n# Brew tea\n\n1. Heat the water to 80C.\n2. Steep for two minutes.\n";

fn talaria(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("TALARIA_HOME")
        .env_remove("TALARIA_MODEL")
        .env_remove("TALARIA_BASE_URL")
        .env_remove("HERMES_HOME")
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Every file of the home but the logs, with its bytes.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    snapshot_but(root, &[])
}

/// [`snapshot`] without the files named `skip`.
fn snapshot_but(root: &Path, skip: &[&str]) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, skip: &[&str], out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            if rel.starts_with("logs") || skip.iter().any(|s| rel == Path::new(s)) {
                continue;
            }
            if path.is_dir() {
                walk(root, &path, skip, out);
            } else {
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, skip, &mut out);
    out
}

/// The database's content as SQL, read by Python's sqlite3: the same
/// rows whatever is still in the write-ahead log.
fn dump(db: &Path) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg("import sqlite3, sys; print('\\n'.join(sqlite3.connect(sys.argv[1]).iterdump()))")
        .arg(db)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

/// The database's files, whose bytes a writer that opens and closes it
/// may change (checkpointing its log) without changing a row.
const DB_FILES: &[&str] = &["state.db", "state.db-wal", "state.db-shm"];

/// Fails naming the files that differ between two snapshots.
fn assert_same(
    before: &BTreeMap<PathBuf, Vec<u8>>,
    after: &BTreeMap<PathBuf, Vec<u8>>,
    what: &str,
) {
    let changed: Vec<&PathBuf> = before
        .keys()
        .chain(after.keys())
        .filter(|p| before.get(*p) != after.get(*p))
        .collect();
    assert!(changed.is_empty(), "{what} changed {changed:?}");
}

/// Writes a hermes-agent home with the real package and returns its
/// folder and the ids of its two sessions.
async fn hermes_home(mock: &MockOpenAi) -> (tempfile::TempDir, Vec<String>) {
    let python = hermes_python(&["run_agent", "hermes_state"]);
    let dir = tempfile::tempdir().unwrap();
    // The ancestor's configuration as a person has it: a model, settings
    // Talaria has, and some it has not.
    std::fs::write(
        dir.path().join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {}\n\
             approvals:\n  mode: manual\n  timeout: 45\n\
             streaming:\n  enabled: true\n\
             memory:\n  memory_enabled: true\n  memory_char_limit: 3000\n",
            mock.base_url()
        ),
    )
    .unwrap();
    std::fs::write(
        dir.path().join(".env"),
        "HERMES_ONLY_SETTING=from-hermes\nSHARED_SETTING=hermes-value\nPLACEHOLDER=\n",
    )
    .unwrap();

    // The first conversation: a memory entry, a skill, an answer.
    mock.push_when(
        "remember my editor",
        Reply::tool_calls(vec![ToolCallReply::new(
            "c1",
            "memory",
            serde_json::json!({"action": "add", "target": "memory",
                "content": "The user's favourite editor is helix."})
            .to_string(),
        )]),
    );
    mock.push_when(
        r#""tool_call_id":"c1""#,
        Reply::tool_calls(vec![ToolCallReply::new(
            "c2",
            "skill_manage",
            serde_json::json!({"action": "create", "name": "brew-tea", "content": SKILL})
                .to_string(),
        )]),
    );
    mock.push_when(
        r#""tool_call_id":"c2""#,
        Reply::text("Noted: helix, and the tea procedure is saved."),
    );
    // The second: a plain answer.
    mock.push_when(
        "Tell me about Zanzibar",
        Reply::text("Zanzibar is an archipelago in the Indian Ocean, famous for cloves."),
    );

    let out = tokio::process::Command::new(python)
        .arg("-c")
        .arg(DRIVE_HERMES)
        .arg(mock.base_url())
        .arg("Please remember my editor is helix, and save how to brew tea.")
        .arg("Tell me about Zanzibar.")
        .env("HERMES_HOME", dir.path())
        .env("HOME", dir.path())
        // Whatever the package would fetch from the internet fails at
        // once; the mock model is reached directly.
        .env("HTTP_PROXY", "http://127.0.0.1:9")
        .env("HTTPS_PROXY", "http://127.0.0.1:9")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "hermes-agent failed\nstdout: {stdout}\nstderr: {}",
        text(&out.stderr)
    );
    let ids: Vec<String> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("SESSION "))
        .map(str::to_owned)
        .collect();
    assert_eq!(ids.len(), 2, "{stdout}");
    // What the ancestor wrote is what the import reads.
    let memory = std::fs::read_to_string(dir.path().join("memories/MEMORY.md")).unwrap();
    assert!(memory.contains("helix"), "{memory}");
    assert!(dir.path().join("skills/brew-tea/SKILL.md").is_file());
    assert!(dir.path().join("cron/jobs.json").is_file());
    (dir, ids)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hermes_home_comes_over_searchable_and_continues_once() {
    let mock = MockOpenAi::start().await;
    let (hermes, ids) = hermes_home(&mock).await;
    let from = hermes.path().to_str().unwrap();

    // A Talaria home in use: its own config, a variable, a database.
    let home_dir = tempfile::tempdir().unwrap();
    let home = home_dir.path();
    let own_config = format!(
        "model:\n  default: mock-model\n  base_url: {}\nagent:\n  api_max_retries: 0\n",
        mock.base_url()
    );
    std::fs::write(home.join("config.yaml"), &own_config).unwrap();
    std::fs::write(home.join(".env"), "SHARED_SETTING=talaria-value\n").unwrap();
    ok(&talaria(home, &["sessions", "list"]));
    assert!(home.join("state.db").is_file());

    // The dry run says what would happen and changes nothing.
    let before = snapshot(home);
    let dry = ok(&talaria(
        home,
        &["import", "hermes", "--from", from, "--dry-run"],
    ));
    for line in [
        "2 sessions to import",
        "MEMORY.md: 1 entry to add",
        "1 skill to copy (brew-tea)",
        "1 variable to add (HERMES_ONLY_SETTING), 1 already set here (kept)",
        "config.imported.yaml",
        "streaming: enabled",
        "1 job to import",
        "1 approved user to import",
    ] {
        assert!(dry.contains(line), "{line:?} not in:\n{dry}");
    }
    assert_same(&before, &snapshot(home), "the dry run");

    // The import.
    let report = ok(&talaria(home, &["import", "hermes", "--from", from]));
    assert!(report.contains("2 sessions imported"), "{report}");

    // The conversations are found, with their ids and title.
    let found = ok(&talaria(home, &["sessions", "search", "Zanzibar"]));
    assert!(found.contains(&ids[1]), "{found}");
    let found = ok(&talaria(home, &["sessions", "search", "helix"]));
    assert!(found.contains(&ids[0]), "{found}");
    let list = ok(&talaria(home, &["sessions", "list"]));
    assert!(list.contains("Tea and editors"), "{list}");
    let shown = ok(&talaria(home, &["sessions", "show", &ids[0]]));
    assert!(shown.contains("skill_manage"), "{shown}");

    // Memory, skill, variables; this home's own config and values kept.
    let memory = ok(&talaria(home, &["memory", "show"]));
    assert!(memory.contains("favourite editor is helix"), "{memory}");
    let skill = ok(&talaria(home, &["skills", "show", "brew-tea"]));
    assert!(skill.contains("Steep for two minutes"), "{skill}");
    let env = std::fs::read_to_string(home.join(".env")).unwrap();
    assert!(env.contains("HERMES_ONLY_SETTING=from-hermes"), "{env}");
    assert!(env.contains("SHARED_SETTING=talaria-value"), "{env}");
    assert!(
        !env.contains("hermes-value") && !env.contains("PLACEHOLDER"),
        "{env}"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(home.join(".env"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    assert_eq!(
        std::fs::read_to_string(home.join("config.yaml")).unwrap(),
        own_config
    );
    let imported = std::fs::read_to_string(home.join("config.imported.yaml")).unwrap();
    assert!(imported.contains("timeout_secs: 45"), "{imported}");
    assert!(imported.contains("memory_char_limit: 3000"), "{imported}");

    // The cron job and the approval.
    let jobs = ok(&talaria(home, &["cron", "list"]));
    assert!(
        jobs.contains("news digest") && jobs.contains("every 2h"),
        "{jobs}"
    );
    let pairing = ok(&talaria(home, &["pairing", "list"]));
    assert!(pairing.contains("424242"), "{pairing}");

    // A conversation continues with its history: the model is sent the
    // earlier exchange, tool calls included.
    mock.push_when("What editor do I use", Reply::text("You use helix."));
    let answer = ok(&talaria(
        home,
        &["chat", "-q", "What editor do I use?", "--resume", &ids[0]],
    ));
    assert!(answer.contains("You use helix."), "{answer}");
    let request = mock
        .requests()
        .into_iter()
        .rev()
        .find(|r| r.body.to_string().contains("What editor do I use"))
        .expect("the Talaria turn reached the model");
    let sent = request.body.to_string();
    for earlier in [
        "Please remember my editor is helix",
        "skill_manage",
        "Noted: helix, and the tea procedure is saved.",
    ] {
        assert!(sent.contains(earlier), "{earlier:?} not sent:\n{sent}");
    }

    // A second import adds nothing.
    let after = snapshot_but(home, DB_FILES);
    let rows = dump(&home.join("state.db"));
    let again = ok(&talaria(home, &["import", "hermes", "--from", from]));
    assert!(again.contains("0 sessions imported"), "{again}");
    assert!(again.contains("2 already imported"), "{again}");
    assert!(again.contains("0 jobs imported, 1 already here"), "{again}");
    assert_same(&after, &snapshot_but(home, DB_FILES), "the second import");
    assert_eq!(
        dump(&home.join("state.db")),
        rows,
        "the second import changed the database"
    );
}

#[test]
fn a_missing_home_or_an_unknown_database_is_named() {
    let home = tempfile::tempdir().unwrap();
    let out = talaria(
        home.path(),
        &["import", "hermes", "--from", "/nonexistent/hermes-home"],
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("no hermes-agent home at /nonexistent/hermes-home"),
        "{err}"
    );

    // A state.db from something else: the table it lacks is named, and
    // nothing is imported (the memory entry beside it neither).
    let source = tempfile::tempdir().unwrap();
    std::fs::create_dir(source.path().join("memories")).unwrap();
    std::fs::write(source.path().join("memories/MEMORY.md"), "an entry\n").unwrap();
    let sqlite = Command::new("python3")
        .arg("-c")
        .arg(
            "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); \
             c.execute('CREATE TABLE sessions (id TEXT, source TEXT, started_at REAL)'); c.commit()",
        )
        .arg(source.path().join("state.db"))
        .status()
        .unwrap();
    assert!(sqlite.success());
    let out = talaria(
        home.path(),
        &[
            "import",
            "hermes",
            "--from",
            source.path().to_str().unwrap(),
        ],
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("it has no `messages` table"), "{err}");
    assert!(!home.path().join("memories/MEMORY.md").exists());
}
