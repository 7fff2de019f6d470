//! The learning routes end to end: memory, skills, the learning log with
//! rollback and the learning graph, over real HTTP on 127.0.0.1 against
//! the real agent's home in a temporary directory, checked both through
//! the API and on disk.

use crate::api_support;

use std::path::PathBuf;

use api_support::{KEY, Rig, rig};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

async fn call(rig: &Rig, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    let mut req = rig.client.request(method, rig.url(path)).bearer_auth(KEY);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let text = resp.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, body)
}

async fn get(rig: &Rig, path: &str) -> (StatusCode, Value) {
    call(rig, Method::GET, path, None).await
}

async fn post(rig: &Rig, path: &str, body: Value) -> (StatusCode, Value) {
    call(rig, Method::POST, path, Some(body)).await
}

async fn put(rig: &Rig, path: &str, body: Value) -> (StatusCode, Value) {
    call(rig, Method::PUT, path, Some(body)).await
}

/// The error code of an OpenAI-shaped error body (and that it is one).
fn code(body: &Value) -> &str {
    assert!(body["error"]["message"].is_string(), "not an error: {body}");
    assert!(body["error"]["type"].is_string(), "not an error: {body}");
    body["error"]["code"].as_str().unwrap_or("")
}

fn home(rig: &Rig) -> PathBuf {
    rig.dir.path().join("home")
}

/// One memory target's entries from a `/api/memory` answer.
fn entries(memory: &Value, target: &str) -> Vec<String> {
    memory["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["target"] == target)
        .unwrap_or_else(|| panic!("no {target} in {memory}"))["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_owned())
        .collect()
}

/// `(actor, action, target)` of each log entry of a `/api/learning` page.
fn changes(page: &Value) -> Vec<(String, String, String)> {
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["actor"].as_str().unwrap().to_owned(),
                e["action"].as_str().unwrap().to_owned(),
                e["target"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn change(actor: &str, action: &str, target: &str) -> (String, String, String) {
    (actor.to_owned(), action.to_owned(), target.to_owned())
}

fn skill_md(name: &str, description: &str, body: &str) -> String {
    format!("---\nname: {name}\ndescription: {description}\n---\n{body}\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_changes_show_in_memory_and_in_the_log_as_the_api() {
    let rig = rig(0).await;
    let (status, memory) = get(&rig, "/api/memory").await;
    assert_eq!(status, 200, "{memory}");
    assert_eq!(memory["object"], "talaria.memory");
    assert!(entries(&memory, "memory").is_empty());
    assert_eq!(memory["targets"][0]["char_limit"], 2200);
    assert_eq!(memory["targets"][1]["char_limit"], 1375);

    let (status, after) = post(
        &rig,
        "/api/memory",
        json!({"action": "add", "target": "user", "content": "Prefers tabs over spaces"}),
    )
    .await;
    assert_eq!(status, 200, "{after}");
    assert_eq!(entries(&after, "user"), ["Prefers tabs over spaces"]);
    assert!(after["message"].is_string());
    for body in [
        json!({"action": "add", "target": "memory", "content": "The server runs Debian"}),
        json!({"action": "replace", "target": "memory", "old_text": "Debian",
               "content": "The server runs Debian 13"}),
        json!({"action": "add", "target": "memory", "content": "Backups run at 02:00"}),
        json!({"action": "remove", "target": "user", "old_text": "tabs"}),
    ] {
        let (status, answer) = post(&rig, "/api/memory", body).await;
        assert_eq!(status, 200, "{answer}");
    }
    let (_, memory) = get(&rig, "/api/memory").await;
    assert_eq!(
        entries(&memory, "memory"),
        ["The server runs Debian 13", "Backups run at 02:00"]
    );
    assert!(entries(&memory, "user").is_empty());
    assert_eq!(
        memory["targets"][0]["chars_used"],
        "The server runs Debian 13\n§\nBackups run at 02:00"
            .chars()
            .count()
    );
    // On disk as the memory tool writes it.
    let on_disk = std::fs::read_to_string(home(&rig).join("memories/MEMORY.md")).unwrap();
    assert_eq!(
        on_disk,
        "The server runs Debian 13\n§\nBackups run at 02:00"
    );

    let (status, log) = get(&rig, "/api/learning").await;
    assert_eq!(status, 200, "{log}");
    assert_eq!(
        changes(&log),
        [
            change("api", "memory", "memory:USER.md"),
            change("api", "memory", "memory:MEMORY.md"),
            change("api", "memory", "memory:MEMORY.md"),
            change("api", "memory", "memory:MEMORY.md"),
            change("api", "memory", "memory:USER.md"),
        ]
    );
    assert_eq!(log["has_more"], false);

    // One step back undoes the newest change to MEMORY.md, the next the
    // one before (not the undo itself).
    let (status, undone) = post(&rig, "/api/learning/rollback", json!({"memory": "memory"})).await;
    assert_eq!(status, 200, "{undone}");
    assert_eq!(
        entries(&undone["memory"], "memory"),
        ["The server runs Debian 13"]
    );
    let (status, undone) = post(&rig, "/api/learning/rollback", json!({"memory": "memory"})).await;
    assert_eq!(status, 200, "{undone}");
    assert_eq!(
        entries(&undone["memory"], "memory"),
        ["The server runs Debian"]
    );
    let (_, log) = get(&rig, "/api/learning?limit=2").await;
    assert_eq!(
        changes(&log),
        [
            change("api", "rollback", "memory:MEMORY.md"),
            change("api", "rollback", "memory:MEMORY.md"),
        ]
    );
    assert_eq!(log["has_more"], true);

    // Any version the log shows can be put back by its hash: the one the
    // replace made.
    let (_, history) = get(&rig, "/api/learning?target=memory:MEMORY.md&limit=200").await;
    let replaced = history["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "memory")
        .nth(1)
        .unwrap()["after"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, restored) = post(
        &rig,
        "/api/learning/rollback",
        json!({"memory": "memory", "to": replaced}),
    )
    .await;
    assert_eq!(status, 200, "{restored}");
    assert_eq!(restored["to"], replaced.as_str());
    assert_eq!(
        entries(&restored["memory"], "memory"),
        ["The server runs Debian 13"]
    );
    // A hash the log has for another file is not a version of this one.
    let (_, user_history) = get(&rig, "/api/learning?target=memory:USER.md").await;
    let user_version = user_history["data"][0]["before"].as_str().unwrap();
    let (status, refused) = post(
        &rig,
        "/api/learning/rollback",
        json!({"memory": "memory", "to": user_version}),
    )
    .await;
    assert_eq!(status, 404, "{refused}");
    assert_eq!(code(&refused), "version_not_found");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_memory_requests_are_refused_and_change_nothing() {
    let rig = rig(0).await;
    let (status, _) = post(
        &rig,
        "/api/memory",
        json!({"action": "add", "target": "memory", "content": "Keep this"}),
    )
    .await;
    assert_eq!(status, 200);
    let path = home(&rig).join("memories/MEMORY.md");
    let before = std::fs::read(&path).unwrap();

    for (body, wanted) in [
        (
            json!({"action": "wipe", "target": "memory", "content": "x"}),
            "memory_refused",
        ),
        (
            json!({"action": "add", "target": "soul", "content": "x"}),
            "memory_refused",
        ),
        (json!({"action": "add", "content": "x"}), "invalid_body"),
        (
            json!({"action": "add", "target": "memory", "operations": []}),
            "invalid_body",
        ),
        (
            json!({"action": "add", "target": "memory", "content": "  "}),
            "memory_refused",
        ),
        (
            json!({"action": "remove", "target": "memory", "old_text": "not there"}),
            "memory_refused",
        ),
        (
            json!({"action": "add", "target": "user", "content": "x".repeat(2000)}),
            "memory_refused",
        ),
    ] {
        let (status, answer) = post(&rig, "/api/memory", body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(code(&answer), wanted, "{body}: {answer}");
    }
    // The tool's own sentence reaches the client.
    let (_, answer) = post(
        &rig,
        "/api/memory",
        json!({"action": "remove", "target": "memory", "old_text": "not there"}),
    )
    .await;
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("No memory entry contains"), "{message}");

    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert!(!home(&rig).join("memories/USER.md").exists());
    let (_, log) = get(&rig, "/api/learning").await;
    assert_eq!(changes(&log), [change("api", "memory", "memory:MEMORY.md")]);

    // Rollback asks for one thing it can undo.
    for (body, status_wanted, wanted) in [
        (json!({}), 400, "invalid_body"),
        (
            json!({"memory": "memory", "skill": "x"}),
            400,
            "invalid_body",
        ),
        (json!({"memory": "soul"}), 400, "invalid_target"),
        (json!({"memory": "user"}), 409, "nothing_to_restore"),
        (
            json!({"memory": "memory", "to": "not-a-hash"}),
            404,
            "version_not_found",
        ),
    ] {
        let (status, answer) = post(&rig, "/api/learning/rollback", body.clone()).await;
        assert_eq!(status, status_wanted, "{body}: {answer}");
        assert_eq!(code(&answer), wanted, "{body}: {answer}");
    }
    assert_eq!(std::fs::read(&path).unwrap(), before);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_skill_edit_is_validated_logged_and_rolled_back() {
    let rig = rig(0).await;
    let v1 = skill_md(
        "deploy-notes",
        "How this team deploys.",
        "1. Build.\n2. Ship.",
    );
    let (status, made) = post(
        &rig,
        "/api/skills",
        json!({"name": "deploy-notes", "content": v1}),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["origin"], "user");
    assert_eq!(made["read_only"], false);
    assert_eq!(made["content"], v1.as_str());
    let file = home(&rig).join("skills/deploy-notes/SKILL.md");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), v1);

    // A support file shows by name.
    std::fs::create_dir_all(home(&rig).join("skills/deploy-notes/references")).unwrap();
    std::fs::write(
        home(&rig).join("skills/deploy-notes/references/hosts.md"),
        "web1",
    )
    .unwrap();
    let (status, shown) = get(&rig, "/api/skills/deploy-notes").await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["description"], "How this team deploys.");
    assert_eq!(shown["category"], "general");
    assert_eq!(shown["files"], json!(["references/hosts.md"]));

    // A frontmatter that does not name the skill is refused and the file
    // is left as it was.
    for bad in [
        "just text, no frontmatter".to_owned(),
        skill_md("other-name", "Wrong name.", "Steps."),
        skill_md("deploy-notes", "No body.", ""),
    ] {
        let (status, refused) =
            put(&rig, "/api/skills/deploy-notes", json!({"content": bad})).await;
        assert_eq!(status, 400, "{refused}");
        assert_eq!(code(&refused), "skill_refused");
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), v1);

    let v2 = skill_md(
        "deploy-notes",
        "How this team deploys.",
        "1. Build.\n2. Test.\n3. Ship.",
    );
    let (status, edited) = put(&rig, "/api/skills/deploy-notes", json!({"content": v2})).await;
    assert_eq!(status, 200, "{edited}");
    assert_eq!(edited["content"], v2.as_str());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), v2);

    let (_, log) = get(&rig, "/api/learning?target=skill:deploy-notes").await;
    assert_eq!(
        changes(&log),
        [
            change("api", "edit", "skill:deploy-notes"),
            change("api", "create", "skill:deploy-notes"),
        ]
    );

    // Rollback puts the previous content back, and says so in the log.
    let (status, undone) = post(
        &rig,
        "/api/learning/rollback",
        json!({"skill": "deploy-notes"}),
    )
    .await;
    assert_eq!(status, 200, "{undone}");
    assert_eq!(undone["skill"]["content"], v1.as_str());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), v1);
    let (_, log) = get(&rig, "/api/learning?target=skill:deploy-notes&limit=1").await;
    assert_eq!(
        changes(&log),
        [change("api", "rollback", "skill:deploy-notes")]
    );

    // The graph has the skill, as the user's (the API is not the agent).
    let (status, graph) = get(&rig, "/api/learning/graph").await;
    assert_eq!(status, 200, "{graph}");
    let node = graph["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == "deploy-notes")
        .unwrap_or_else(|| panic!("no deploy-notes node in {graph}"))
        .clone();
    assert_eq!(node["group"], "yours");
    let resp = rig
        .client
        .get(rig.url("/api/learning/graph?format=dot"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()[reqwest::header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/vnd.graphviz")
    );
    let dot = resp.text().await.unwrap();
    assert!(dot.contains("deploy-notes"), "{dot}");
    let (status, refused) = get(&rig, "/api/learning/graph?format=svg").await;
    assert_eq!(status, 400);
    assert_eq!(code(&refused), "invalid_query");

    // Stepping back once more undoes the creation: the skill is gone.
    let (status, undone) = post(
        &rig,
        "/api/learning/rollback",
        json!({"skill": "deploy-notes"}),
    )
    .await;
    assert_eq!(status, 200, "{undone}");
    assert_eq!(undone["skill"], Value::Null);
    assert!(!file.exists());
    let (status, gone) = get(&rig, "/api/skills/deploy-notes").await;
    assert_eq!(status, 404);
    assert_eq!(code(&gone), "skill_not_found");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bundled_unknown_and_taken_skills_are_refused() {
    let rig = rig(0).await;
    let bundled = talaria_learning::skills::bundled::SKILLS[0].name;
    let (status, shown) = get(&rig, &format!("/api/skills/{bundled}")).await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["origin"], "bundled");
    assert_eq!(shown["read_only"], true);
    assert!(shown["content"].as_str().unwrap().contains(bundled));

    let content = skill_md(bundled, "Mine now.", "Steps.");
    let (status, refused) = put(
        &rig,
        &format!("/api/skills/{bundled}"),
        json!({"content": content}),
    )
    .await;
    assert_eq!(status, 403, "{refused}");
    assert_eq!(code(&refused), "skill_read_only");
    // Creating one of the same name is refused too (it would shadow it).
    let (status, refused) = post(
        &rig,
        "/api/skills",
        json!({"name": bundled, "content": content}),
    )
    .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(code(&refused), "skill_exists");

    let content = skill_md("nowhere", "None.", "Steps.");
    let (status, refused) = put(&rig, "/api/skills/nowhere", json!({"content": content})).await;
    assert_eq!(status, 404, "{refused}");
    assert_eq!(code(&refused), "skill_not_found");
    let (status, refused) = get(&rig, "/api/skills/Not%20A%20Name").await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(code(&refused), "invalid_skill_name");
    let (status, refused) = post(
        &rig,
        "/api/skills",
        json!({"name": "../escape", "content": content}),
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(code(&refused), "invalid_skill_name");
    let (status, refused) = post(&rig, "/api/learning/rollback", json!({"skill": "nowhere"})).await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(code(&refused), "nothing_to_restore");

    // Nothing was written or logged.
    assert!(!home(&rig).join("skills").join(bundled).exists());
    assert!(!home(&rig).join("skills/nowhere").exists());
    let (_, log) = get(&rig, "/api/learning").await;
    assert!(changes(&log).is_empty(), "{log}");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_log_is_paged_newest_first() {
    let rig = rig(0).await;
    for i in 0..7 {
        let (status, answer) = post(
            &rig,
            "/api/memory",
            json!({"action": "add", "target": "memory", "content": format!("fact {i}")}),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
    }
    let (_, all) = get(&rig, "/api/learning").await;
    let afters: Vec<String> = all["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["after"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(afters.len(), 7);
    let (status, page) = get(&rig, "/api/learning?limit=3&offset=2").await;
    assert_eq!(status, 200, "{page}");
    let paged: Vec<&str> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["after"].as_str().unwrap())
        .collect();
    assert_eq!(paged, afters[2..5]);
    assert_eq!(page["has_more"], true);
    assert_eq!(page["limit"], 3);
    assert_eq!(page["offset"], 2);
    let (_, tail) = get(&rig, "/api/learning?limit=3&offset=5").await;
    assert_eq!(tail["data"].as_array().unwrap().len(), 2);
    assert_eq!(tail["has_more"], false);
    // Newest first: the first entry made the file hold all seven facts.
    let newest = &all["data"][0];
    assert!(newest["at"].as_str().unwrap() >= all["data"][6]["at"].as_str().unwrap());
    for bad in ["limit=201", "limit=-1", "offset=x"] {
        let (status, refused) = get(&rig, &format!("/api/learning?{bad}")).await;
        assert_eq!(status, 400, "{bad}: {refused}");
        assert_eq!(code(&refused), "invalid_query");
    }
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_learning_route_needs_the_key() {
    let rig = rig(0).await;
    let routes: [(Method, &str, Option<Value>); 8] = [
        (Method::GET, "/api/memory", None),
        (
            Method::POST,
            "/api/memory",
            Some(json!({"action": "add", "target": "memory", "content": "x"})),
        ),
        (
            Method::POST,
            "/api/skills",
            Some(json!({"name": "sneaky", "content": skill_md("sneaky", "S.", "Steps.")})),
        ),
        (Method::GET, "/api/skills/writing-skills", None),
        (
            Method::PUT,
            "/api/skills/sneaky",
            Some(json!({"content": skill_md("sneaky", "S.", "Steps.")})),
        ),
        (Method::GET, "/api/learning", None),
        (
            Method::POST,
            "/api/learning/rollback",
            Some(json!({"memory": "memory"})),
        ),
        (Method::GET, "/api/learning/graph", None),
    ];
    for (method, path, body) in routes {
        for key in [None, Some("wrong-key-0123456789abcdef")] {
            let mut req = rig.client.request(method.clone(), rig.url(path));
            if let Some(key) = key {
                req = req.bearer_auth(key);
            }
            if let Some(body) = &body {
                req = req.json(body);
            }
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), 401, "{method} {path}");
            let body: Value = resp.json().await.unwrap();
            assert_eq!(code(&body), "invalid_api_key");
        }
    }
    assert!(!home(&rig).join("memories/MEMORY.md").exists());
    assert!(!home(&rig).join("skills/sneaky").exists());
    assert!(!home(&rig).join("learning/log.jsonl").exists());
    rig.stop().await;
}
