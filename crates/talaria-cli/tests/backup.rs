//! `talaria backup` and `talaria restore`, as an operator runs them: a
//! backup taken while a real `talaria gateway run` answers API-server
//! turns one after another, restored into a fresh home, holds every
//! session and message as they were at one moment (compared row by row
//! with the original), the memories, the skills and the pairing
//! approvals; a restore over a home that is not empty is refused.

use crate::api_gateway::{ApiGateway, free_port};
use crate::crash_support::home;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use talaria_store::{PairingLimits, PairingStore, SessionFilter, SessionStore, SqliteStore};
use talaria_testkit::{MockOpenAi, Reply};

const KEY: &str = "sk-backup-api-key-0123456789";

fn talaria(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("TALARIA_HOME")
        .stdin(Stdio::null())
        .output()
        .expect("talaria runs")
}

async fn turn(http: &reqwest::Client, url: &str, session: &str, text: &str) {
    let response = http
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(KEY)
        .header("x-talaria-session-id", session)
        .json(&serde_json::json!({
            "model": "talaria",
            "messages": [{"role": "user", "content": text}],
        }))
        .send()
        .await
        .expect("the API server answers");
    assert!(response.status().is_success(), "{}", response.status());
}

/// Every session with its messages, as comparable text.
async fn rows(store: &SqliteStore) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let sessions = store
        .list_sessions(SessionFilter::default())
        .await
        .expect("sessions");
    for s in sessions {
        let messages = store.messages(&s.id).await.expect("messages");
        out.push((
            format!("{} {}", s.id, s.source),
            messages.iter().map(|m| format!("{m:?}")).collect(),
        ));
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_restores_sessions_memories_skills_and_approvals() {
    let llm = Arc::new(MockOpenAi::start().await);
    let port = free_port();
    let original = home(
        &llm,
        &format!("  api_server:\n    enabled: true\n    host: 127.0.0.1\n    port: {port}\n"),
        &format!("API_SERVER_KEY={KEY}\n"),
    );
    let root = original.root.clone();
    std::fs::create_dir_all(root.join("memories")).unwrap();
    std::fs::write(
        root.join("memories/MEMORY.md"),
        "The llama is called Pablo.\n",
    )
    .unwrap();
    std::fs::create_dir_all(root.join("skills/haiku")).unwrap();
    std::fs::write(
        root.join("skills/haiku/SKILL.md"),
        "---\nname: haiku\ndescription: write a haiku\n---\nFive, seven, five.\n",
    )
    .unwrap();
    {
        let store = SqliteStore::open(&root.join("state.db")).unwrap();
        let limits = PairingLimits::default();
        store
            .pairing_offer("telegram", "4242", Some("Ada"), "4242", "ABCD2345", limits)
            .await
            .unwrap();
        store
            .pairing_approve("telegram", "ABCD2345", limits)
            .await
            .unwrap();
        assert!(store.pairing_is_approved("telegram", "4242").await.unwrap());
    }

    let gateway = ApiGateway::start(&root, port).await;
    let http = reqwest::Client::new();
    for i in 0..3 {
        llm.push(Reply::text(format!("answer {i}")));
        turn(&http, &gateway.url, &format!("before-{i}"), "hello").await;
    }
    // Turns keep coming while the backup runs.
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (stop, http, url, llm) = (stop.clone(), http.clone(), gateway.url.clone(), llm.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                llm.push(Reply::text(format!("load answer {n}")));
                turn(
                    &http,
                    &url,
                    &format!("load-{}", n % 4),
                    &format!("load {n}"),
                )
                .await;
                n += 1;
            }
            n
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("backup.tar.gz");
    let made = talaria(&root, &["backup", archive.to_str().unwrap()]);
    assert!(
        made.status.success(),
        "{}{}",
        String::from_utf8_lossy(&made.stdout),
        String::from_utf8_lossy(&made.stderr)
    );
    stop.store(true, Ordering::SeqCst);
    let turns_under_load = load.await.unwrap();
    assert!(turns_under_load >= 1, "no turn ran during the backup");
    drop(gateway);

    // Into the original, which is not empty: refused, nothing changed.
    let refused = talaria(&root, &["restore", archive.to_str().unwrap()]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--force"));

    let fresh = dir.path().join("fresh");
    let restored = talaria(&fresh, &["restore", archive.to_str().unwrap()]);
    assert!(
        restored.status.success(),
        "{}",
        String::from_utf8_lossy(&restored.stderr)
    );

    // Row by row: every restored session is the original's as of one
    // moment, and the turns before the backup are all there.
    let before = rows(&SqliteStore::open(&root.join("state.db")).unwrap()).await;
    let after_store = SqliteStore::open(&fresh.join("state.db")).unwrap();
    let after = rows(&after_store).await;
    for i in 0..3 {
        let id = format!("before-{i}");
        let (_, msgs) = after
            .iter()
            .find(|(s, _)| s.starts_with(&id))
            .unwrap_or_else(|| panic!("{id} is missing from the restore"));
        let (_, orig) = before.iter().find(|(s, _)| s.starts_with(&id)).unwrap();
        assert_eq!(msgs, orig, "{id}");
    }
    for (session, msgs) in &after {
        let (_, orig) = before
            .iter()
            .find(|(s, _)| s == session)
            .unwrap_or_else(|| panic!("{session} is not in the original"));
        assert!(
            orig.starts_with(msgs),
            "{session}: the restored messages are not a moment of the original's"
        );
    }
    assert_eq!(
        std::fs::read_to_string(fresh.join("memories/MEMORY.md")).unwrap(),
        "The llama is called Pablo.\n"
    );
    assert_eq!(
        std::fs::read(fresh.join("skills/haiku/SKILL.md")).unwrap(),
        std::fs::read(root.join("skills/haiku/SKILL.md")).unwrap()
    );
    assert!(
        after_store
            .pairing_is_approved("telegram", "4242")
            .await
            .unwrap()
    );
    // Without --with-secrets, no .env.
    assert!(!fresh.join(".env").exists());
}
