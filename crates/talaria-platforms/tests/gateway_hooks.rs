//! Event hooks end to end: a hook installed in the home sees a Telegram DM
//! turn and a `/new` through the real gateway, with platform ids hashed.

use crate::gateway_support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use gateway_support::*;
use serde_json::Value;
use talaria_core::ids::hash_id;
use talaria_testkit::Reply;

/// Records each event it gets as its own file, written whole.
const RECORDER: &str = "#!/bin/sh\ncat > in.$$.tmp && mv in.$$.tmp in.$$.json\n";

fn install_recorder(rig: &Rig, events: &[&str]) -> std::path::PathBuf {
    let dir = rig.home.hooks_dir().join("recorder");
    std::fs::create_dir_all(&dir).unwrap();
    let list: Vec<String> = events.iter().map(|e| format!("\"{e}\"")).collect();
    std::fs::write(
        dir.join("HOOK.yaml"),
        format!("events: [{}]\n", list.join(", ")),
    )
    .unwrap();
    let handler = dir.join("handler");
    std::fs::write(&handler, RECORDER).unwrap();
    std::fs::set_permissions(&handler, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn recorded(dir: &Path) -> Vec<Value> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("in.") && name.ends_with(".json") {
            let text = std::fs::read_to_string(entry.path()).unwrap();
            out.push(serde_json::from_str(&text).unwrap());
        }
    }
    out
}

/// Waits until the hook has seen every event in `wanted`; returns all it saw.
async fn wait_for_events(dir: &Path, wanted: &[&str]) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let seen = recorded(dir);
        if wanted.iter().all(|w| seen.iter().any(|e| e["event"] == *w)) {
            return seen;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "wanted {wanted:?}, saw {:?}",
            seen.iter().map(|e| e["event"].clone()).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn payload<'a>(seen: &'a [Value], event: &str) -> &'a Value {
    &seen
        .iter()
        .find(|e| e["event"] == event)
        .unwrap_or_else(|| panic!("no {event}"))["payload"]
}

/// No value carries the raw platform id, the session key included.
fn assert_no_raw_id(value: &Value, raw: &str, at: &str) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                assert_no_raw_id(v, raw, &format!("{at}.{k}"));
            }
        }
        Value::Array(items) => items.iter().for_each(|v| assert_no_raw_id(v, raw, at)),
        Value::String(s) => assert!(
            s != raw && !s.split(':').any(|part| part == raw),
            "raw id at {at}: {s}"
        ),
        Value::Number(n) => assert_ne!(n.to_string(), raw, "raw id at {at}"),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_see_a_dm_turn_with_hashed_ids() {
    let mut rig = Rig::new(&[("TELEGRAM_ALLOWED_USERS", "42")], |_| {}).await;
    let dir = install_recorder(
        &rig,
        &[
            "gateway:startup",
            "message:received",
            "session:start",
            "agent:*",
            "message:sent",
        ],
    );
    rig.start();
    rig.wait_until_polling().await;

    rig.llm.push(Reply::text("Hello from Talaria."));
    rig.tg.push_private_text(42, "hi there");
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].rendered(), "Hello from Talaria.");

    let seen = wait_for_events(
        &dir,
        &[
            "gateway:startup",
            "message:received",
            "session:start",
            "agent:start",
            "agent:end",
            "message:sent",
        ],
    )
    .await;
    for event in &seen {
        assert_no_raw_id(&event["payload"], "42", event["event"].as_str().unwrap());
    }

    assert_eq!(
        payload(&seen, "gateway:startup")["platforms"],
        serde_json::json!(["telegram"])
    );

    let received = payload(&seen, "message:received");
    assert_eq!(received["platform"], "telegram");
    assert_eq!(received["chat_type"], "dm");
    assert_eq!(received["user_id_hash"], hash_id("user", "42"));
    assert_eq!(received["chat_id_hash"], hash_id("chat", "42"));
    assert_eq!(received["text"], "hi there");
    assert_eq!(received["is_command"], false);
    let key = received["session_key"].as_str().unwrap().to_owned();
    assert_eq!(
        key,
        hash_id("key", "agent:main:telegram:dm:42"),
        "hashed, not raw"
    );

    let start = payload(&seen, "session:start");
    assert_eq!(start["session_key"], key.as_str());
    assert_eq!(start["reason"], "first");
    let session_id = start["session_id"].as_str().unwrap();

    let agent_start = payload(&seen, "agent:start");
    assert_eq!(agent_start["session_id"], session_id);
    assert_eq!(agent_start["message"], "hi there");

    let end = payload(&seen, "agent:end");
    assert_eq!(end["session_key"], key.as_str());
    assert_eq!(end["session_id"], session_id);
    assert_eq!(end["exit"], "completed");
    assert_eq!(end["response"], "Hello from Talaria.");

    let sent = payload(&seen, "message:sent");
    assert_eq!(sent["platform"], "telegram");
    assert_eq!(sent["chars"], "Hello from Talaria.".chars().count());
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_see_new_as_a_command_and_a_session_reset() {
    let mut rig = Rig::new(&[("TELEGRAM_ALLOWED_USERS", "42")], |_| {}).await;
    let dir = install_recorder(&rig, &["command:*", "session:*", "gateway:shutdown"]);
    rig.start();
    rig.wait_until_polling().await;

    rig.llm.push(Reply::text("First answer."));
    rig.tg.push_private_text(42, "hello");
    rig.sent(1).await;
    let first = wait_for_events(&dir, &["session:start"]).await;
    let old_id = payload(&first, "session:start")["session_id"]
        .as_str()
        .unwrap()
        .to_owned();

    rig.tg.push_private_text(42, "/new fresh start");
    rig.sent(2).await;
    let seen = wait_for_events(&dir, &["command:new", "session:reset", "session:end"]).await;
    let command = payload(&seen, "command:new");
    assert_eq!(command["command"], "new");
    assert_eq!(command["args"], "fresh start");
    let reset = payload(&seen, "session:reset");
    assert_eq!(reset["previous_session_id"], old_id.as_str());
    let new_id = reset["session_id"].as_str().unwrap();
    assert_ne!(new_id, old_id);
    let ended = payload(&seen, "session:end");
    assert_eq!(ended["session_id"], old_id.as_str());
    assert_eq!(ended["reason"], "new_session");
    // The new session's start is an event of its own, emitted after the
    // reset: wait for it rather than expect it with the others.
    let new_start = |seen: &[Value]| {
        seen.iter().any(|e| {
            e["event"] == "session:start"
                && e["payload"]["session_id"] == new_id
                && e["payload"]["reason"] == "new_session"
        })
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    let seen = loop {
        let seen = recorded(&dir);
        if new_start(&seen) {
            break seen;
        }
        assert!(tokio::time::Instant::now() < deadline, "{seen:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for event in &seen {
        assert_no_raw_id(&event["payload"], "42", event["event"].as_str().unwrap());
    }

    // The stop waits for shutdown hooks.
    rig.stop().await;
    assert!(
        recorded(&dir)
            .iter()
            .any(|e| e["event"] == "gateway:shutdown")
    );
}
