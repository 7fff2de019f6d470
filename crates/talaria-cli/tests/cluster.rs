//! Several `talaria gateway run` processes sharing one PostgreSQL database,
//! as nodes on several hosts would (each reports its own host name), with
//! the fake Telegram and the mock LLM.
//!
//! - One node polls Telegram at a time; when it is SIGKILLed another takes
//!   the connector over within 15 s, and no update is lost or answered
//!   twice. The reply the dead node was sending when it died is sent again
//!   by a survivor, once, marked as a possible duplicate.
//! - Consecutive API-server turns of one session, served by different
//!   nodes, see the same history.
//! - What a turn on one node saves to memory or to a skill is in the next
//!   session's prompt on the other.

use crate::crash_support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use crash_support::{Home, gateway_command, home};
use talaria_store::{ClusterStore, LedgerStore, ObligationState, PostgresOptions, PostgresStore};
use talaria_testkit::{FakeTelegram, MockOpenAi};

const TOKEN: &str = "424242:cluster-test-token-abcdefghij";
const RECOVERY_MARKER: &str = "♻️ Recovered reply";

/// A node: its home, its process and its log.
struct Node {
    home: Home,
    log: PathBuf,
    host: String,
    child: Option<Child>,
}

impl Node {
    fn start(&mut self) {
        if let Ok(mut logs) = LOGS.lock() {
            logs.push(self.log.clone());
        }
        let mut command = gateway_command(&self.home, &self.log);
        command.env("TALARIA_NODE_HOST", &self.host);
        self.child = Some(command.spawn().unwrap());
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, and the exit status.
    fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Appends the shared store to a node's configuration.
fn use_postgres(home: &Home, schema: &str) {
    let path = home.root.join("config.yaml");
    let mut config = std::fs::read_to_string(&path).unwrap();
    config.push_str(&format!(
        "store:\n  backend: postgres\n  postgres_url: {}\n  postgres_schema: {schema}\n  postgres_max_connections: 4\n",
        talaria_testkit::postgres::url()
    ));
    std::fs::write(path, config).unwrap();
}

async fn open_store(schema: &str) -> PostgresStore {
    let mut options = PostgresOptions::new(talaria_testkit::postgres::url());
    options.schema = Some(schema.to_owned());
    options.max_connections = 2;
    PostgresStore::connect(options).await.unwrap()
}

/// Waits for `check` to return something, up to `within`; on a timeout,
/// fails showing the logs of the node processes in the system temp dir.
async fn eventually<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() >= deadline {
            let logs = LOGS.lock().map(|l| l.clone()).unwrap_or_default();
            let mut shown = String::new();
            for path in logs {
                shown.push_str(&format!(
                    "--- {}\n{}\n",
                    path.display(),
                    std::fs::read_to_string(&path).unwrap_or_default()
                ));
            }
            panic!("timed out waiting for {what}\n{shown}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every node log of this test binary, for failure messages.
static LOGS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// The pid of the node holding the Telegram connector lease now.
async fn connector_holder(store: &PostgresStore) -> Option<u32> {
    let now = store.clock().await.ok()?;
    let lease = store
        .leases("connector:telegram")
        .await
        .ok()?
        .into_iter()
        .find(|l| l.lease_until > now)?;
    let nodes = store.nodes().await.ok()?;
    nodes
        .into_iter()
        .find(|n| n.id == lease.holder)
        .map(|n| n.pid)
}

/// Replies per chat, as the fake Telegram received them.
fn replies_by_chat(tg: &FakeTelegram) -> BTreeMap<i64, Vec<String>> {
    let mut by_chat: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for sent in tg.sent() {
        by_chat
            .entry(sent.chat_id)
            .or_default()
            .push(sent.rendered());
    }
    by_chat
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_telegram_connector_moves_to_a_survivor_and_nothing_is_lost_or_answered_twice() {
    const METRICS_KEY: &str = "sk-cluster-metrics-key-0123456789";
    let llm = MockOpenAi::start().await;
    let tg = FakeTelegram::start(TOKEN).await;
    let schema = talaria_testkit::postgres::fresh_schema().await;
    let users: Vec<i64> = (100..108).collect();
    let allowed = users
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    // Each node serves its API too, for its `/metrics`.
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| {
            let home = home(
                &llm,
                &format!(
                    "  telegram:\n    base_url: {}\n    poll_timeout_secs: 1\n  \
                     api_server:\n    enabled: true\n    host: 127.0.0.1\n    port: {}\n",
                    tg.base_url(),
                    ports[i]
                ),
                &format!(
                    "TELEGRAM_BOT_TOKEN={TOKEN}\nTELEGRAM_ALLOWED_USERS={allowed}\n\
                     API_SERVER_KEY={METRICS_KEY}\n"
                ),
            );
            use_postgres(&home, &schema);
            let log = home.root.join("node.log");
            Node {
                home,
                log,
                host: format!("host-{i}"),
                child: None,
            }
        })
        .collect();
    for node in &mut nodes {
        node.start();
    }
    let store = eventually(Duration::from_secs(20), "the schema", || {
        let schema = schema.clone();
        async move {
            let mut options = PostgresOptions::new(talaria_testkit::postgres::url());
            options.schema = Some(schema);
            PostgresStore::connect(options).await.ok()
        }
    })
    .await;

    // Exactly one node takes the connector; the others stand by.
    let leader_pid = eventually(Duration::from_secs(20), "a connector leader", || {
        connector_holder(&store)
    })
    .await;
    let leader = nodes
        .iter()
        .position(|n| n.pid() == Some(leader_pid))
        .expect("the leader is one of the three nodes");
    eventually(Duration::from_secs(20), "three live nodes", || async {
        let now = store.clock().await.ok()?;
        let live = store.nodes().await.ok()?;
        (live.iter().filter(|n| n.lease_until > now).count() == 3).then_some(())
    })
    .await;

    // Each node's `/metrics` says which holds the connector's lease.
    for (i, port) in ports.iter().enumerate() {
        let want = if i == leader { 1 } else { 0 };
        let line = format!("talaria_node_leases{{kind=\"connector\"}} {want}");
        eventually(Duration::from_secs(20), "the lease gauge", || {
            let line = line.clone();
            async move {
                let text = reqwest::Client::new()
                    .get(format!("http://127.0.0.1:{port}/metrics"))
                    .bearer_auth(METRICS_KEY)
                    .send()
                    .await
                    .ok()?
                    .text()
                    .await
                    .ok()?;
                text.lines().any(|l| l == line).then_some(())
            }
        })
        .await;
    }

    // Phase 1: three messages, three answers.
    for user in &users[..3] {
        tg.push_private_text(*user, &format!("hello from {user}"));
    }
    tg.wait_for_sent(3, Duration::from_secs(30)).await;

    // Phase 2: the leader dies while it sends the answer to the fourth
    // message. The send hangs, so the row is `attempting` when it dies.
    tg.hang_send(true);
    let attempts_before = tg.send_attempts().len();
    let fourth = tg.push_private_text(users[3], "are you there?");
    tg.wait_for_send_attempts(attempts_before + 1, Duration::from_secs(30))
        .await;
    // The leader keeps its getUpdates offset in the shared store: the
    // fourth update was handed over, so the offset is past it.
    let cursor = format!("offset:{}", tg.bot_id());
    let stored: i64 = eventually(Duration::from_secs(20), "the stored offset", || async {
        let value = talaria_store::CursorStore::cursor(&store, "telegram", &cursor)
            .await
            .ok()??;
        let offset: i64 = value.parse().ok()?;
        (offset > fourth).then_some(offset)
    })
    .await;
    let killed_at = Instant::now();
    nodes[leader].kill();
    tg.hang_send(false);
    // Messages arriving while nobody polls.
    for user in &users[4..] {
        tg.push_private_text(*user, &format!("while you were away, {user}"));
    }

    // A survivor polls again within 15 s.
    let (takeover, resumed_at) = eventually(Duration::from_secs(30), "a new poller", || async {
        tg.get_updates_calls()
            .iter()
            .find(|c| c.at > killed_at)
            .map(|c| (c.at - killed_at, c.offset))
    })
    .await;
    // It starts where the dead leader stopped, not at what Telegram still
    // holds unconfirmed.
    assert_eq!(resumed_at, Some(stored), "the new leader's first poll");
    eprintln!("the connector was taken over {takeover:?} after the leader died");
    assert!(
        takeover < Duration::from_secs(15),
        "the connector was taken over after {takeover:?}"
    );
    let new_leader = eventually(Duration::from_secs(20), "the new leader's lease", || {
        connector_holder(&store)
    })
    .await;
    assert_ne!(new_leader, leader_pid);

    // Every chat gets exactly one answer, the fourth from the survivor,
    // marked as possibly sent before.
    let all = users.len();
    eventually(
        Duration::from_secs(60),
        "an answer in every chat",
        || async { (replies_by_chat(&tg).len() == all).then_some(()) },
    )
    .await;
    // Anything duplicated would arrive within a sweep or two.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let replies = replies_by_chat(&tg);
    for user in &users {
        let got = replies.get(user).cloned().unwrap_or_default();
        assert_eq!(got.len(), 1, "chat {user} got {got:?}");
    }
    assert!(
        replies[&users[3]][0].starts_with(RECOVERY_MARKER),
        "{:?}",
        replies[&users[3]]
    );
    for user in users.iter().filter(|u| **u != users[3]) {
        assert!(!replies[user][0].starts_with(RECOVERY_MARKER));
    }
    // One model call per message: no update started a second turn.
    assert_eq!(llm.requests().len(), all);
    // Never two pollers at once.
    assert_eq!(tg.poll_conflicts(), 0);

    // The ledger agrees: every reply delivered, nothing owed.
    let counts = store.obligation_counts().await.unwrap();
    assert_eq!(
        counts.get(&ObligationState::Delivered).copied(),
        Some(all as u64),
        "{counts:?}"
    );
    assert!(store.open_obligations(0).await.unwrap().is_empty());

    // `gateway status` on a survivor shows the cluster: two nodes alive,
    // the dead one gone, and who runs Telegram now.
    let survivor = nodes.iter().find(|n| n.pid() == Some(new_leader)).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(&survivor.home.root)
        .args(["gateway", "status"])
        .env_remove("TALARIA_DATABASE_URL")
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{shown}");
    eprintln!("{shown}");
    assert!(shown.contains("Cluster: 2 nodes alive, 1 gone"), "{shown}");
    let leader_line = shown
        .lines()
        .position(|l| l.contains(&format!("pid {new_leader} ")))
        .unwrap_or_else(|| panic!("no line for the leader in:\n{shown}"));
    assert_eq!(
        shown.lines().nth(leader_line + 1).map(str::trim),
        Some("connectors: telegram-bot-token"),
        "{shown}"
    );
    assert_eq!(shown.matches("connectors:").count(), 1, "{shown}");
    assert!(!shown.contains(TOKEN), "the bot token was printed");

    // The survivors stop in order and leave the cluster.
    for node in &mut nodes {
        if let Some(status) = node.stop() {
            assert!(status.success(), "{}", node.log());
        }
    }
    let now = store.clock().await.unwrap();
    let live = store.nodes().await.unwrap();
    assert!(
        live.iter().all(|n| n.lease_until <= now),
        "nodes still alive after stopping: {live:?}"
    );
}

/// A port nobody listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Two started nodes on `schema`, each serving the API on a port of its
/// own (returned with it) with `key`, its `api_server:` section extended
/// by `api_extra`; returns once both answer `/health`.
async fn api_nodes(
    llm: &MockOpenAi,
    schema: &str,
    key: &str,
    api_extra: &str,
    tag: &str,
) -> Vec<(Node, u16)> {
    let mut nodes: Vec<(Node, u16)> = (0..2)
        .map(|i| {
            let port = free_port();
            let home = home(
                llm,
                &format!(
                    "  api_server:\n    enabled: true\n    host: 127.0.0.1\n    port: {port}\n{api_extra}"
                ),
                &format!("API_SERVER_KEY={key}\n"),
            );
            use_postgres(&home, schema);
            let log = home.root.join("node.log");
            let node = Node {
                home,
                log,
                host: format!("{tag}-host-{i}"),
                child: None,
            };
            (node, port)
        })
        .collect();
    for (node, _) in &mut nodes {
        node.start();
    }
    let http = reqwest::Client::new();
    for (node, port) in &nodes {
        let url = format!("http://127.0.0.1:{port}/health");
        eventually(Duration::from_secs(20), "the API server", || {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let r = http.get(&url).send().await.ok()?;
                r.status().is_success().then_some(())
            }
        })
        .await;
        assert!(node.pid().is_some());
    }
    nodes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_turns_of_one_session_on_different_nodes_see_the_same_history() {
    let llm = MockOpenAi::start().await;
    let schema = talaria_testkit::postgres::fresh_schema().await;
    let key = "sk-cluster-api-key-0123456789";
    let mut nodes = api_nodes(&llm, &schema, key, "", "api").await;
    let http = reqwest::Client::new();
    let turn = |port: u16, text: &'static str| {
        let http = http.clone();
        async move {
            let response = http
                .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
                .bearer_auth(key)
                .header("x-talaria-session-id", "cluster-session-1")
                .json(&serde_json::json!({
                    "model": "talaria",
                    "messages": [{"role": "user", "content": text}],
                }))
                .send()
                .await
                .unwrap();
            assert!(response.status().is_success(), "{}", response.status());
            let body: serde_json::Value = response.json().await.unwrap();
            body["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        }
    };
    llm.push(talaria_testkit::Reply::text("the llama is called Pablo"));
    let first = turn(nodes[0].1, "remember: my llama is Pablo").await;
    assert_eq!(first, "the llama is called Pablo");
    llm.push(talaria_testkit::Reply::text("Pablo"));
    let second = turn(nodes[1].1, "what is my llama called?").await;
    assert_eq!(second, "Pablo");

    // The second node's request to the model carried the first turn,
    // which the first node stored.
    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    let transcript: Vec<(String, String)> = requests[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] != "system")
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default().to_owned(),
                m["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        transcript,
        [
            ("user".to_owned(), "remember: my llama is Pablo".to_owned()),
            (
                "assistant".to_owned(),
                "the llama is called Pablo".to_owned()
            ),
            ("user".to_owned(), "what is my llama called?".to_owned()),
        ]
    );

    // Two requests of the session at once, on two nodes: the second turn
    // waits for the first (the session's turn lease) and sees its answer.
    llm.push(
        talaria_testkit::Reply::text("a slow third answer").with_delay(Duration::from_secs(3)),
    );
    llm.push(talaria_testkit::Reply::text("the fourth answer"));
    let (port0, port1) = (nodes[0].1, nodes[1].1);
    let third = tokio::spawn(turn(port0, "third question"));
    eventually(
        Duration::from_secs(20),
        "the third turn to reach the model",
        || async { (llm.requests().len() == 3).then_some(()) },
    )
    .await;
    let fourth = tokio::spawn(turn(port1, "fourth question"));
    assert_eq!(third.await.unwrap(), "a slow third answer");
    assert_eq!(fourth.await.unwrap(), "the fourth answer");
    let requests = llm.requests();
    assert_eq!(requests.len(), 4);
    let last: Vec<String> = requests[3].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str().map(str::to_owned))
        .collect();
    assert!(
        last.iter().any(|c| c == "a slow third answer"),
        "the fourth turn ran before the third had finished: {last:?}"
    );

    let store = open_store(&schema).await;
    let messages = talaria_store::SessionStore::messages(&store, "cluster-session-1")
        .await
        .unwrap();
    assert_eq!(messages.len(), 8);
    for (node, _) in &mut nodes {
        let status = node.stop().unwrap();
        assert!(status.success(), "{}", node.log());
    }
}

/// A request for a session another node is running a turn of waits
/// `api_server.busy_wait_secs`, then gets 429 with `Retry-After`; once the
/// turn ends, the same request goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_busy_on_another_node_is_a_429_after_the_busy_wait() {
    let llm = MockOpenAi::start().await;
    let schema = talaria_testkit::postgres::fresh_schema().await;
    let key = "sk-cluster-busy-key-0123456789";
    let mut nodes = api_nodes(&llm, &schema, key, "    busy_wait_secs: 1\n", "busy").await;
    let http = reqwest::Client::new();
    let ask = |port: u16, text: &'static str| {
        let http = http.clone();
        async move {
            http.post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
                .bearer_auth(key)
                .header("x-talaria-session-id", "busy-session")
                .json(&serde_json::json!({
                    "model": "talaria",
                    "messages": [{"role": "user", "content": text}],
                }))
                .send()
                .await
                .unwrap()
        }
    };
    llm.push(talaria_testkit::Reply::text("slow").with_delay(Duration::from_secs(4)));
    let (port0, port1) = (nodes[0].1, nodes[1].1);
    let slow = tokio::spawn(ask(port0, "a long question"));
    eventually(
        Duration::from_secs(20),
        "the slow turn to start",
        || async { (llm.requests().len() == 1).then_some(()) },
    )
    .await;
    let started = Instant::now();
    let refused = ask(port1, "meanwhile").await;
    assert_eq!(refused.status(), 429);
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(
        refused
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "session_busy", "{body}");
    assert_eq!(
        llm.requests().len(),
        1,
        "the refused request reached the model"
    );

    assert!(slow.await.unwrap().status().is_success());
    llm.push(talaria_testkit::Reply::text("now free"));
    let later = ask(port1, "meanwhile").await;
    assert!(later.status().is_success(), "{}", later.status());
    for (node, _) in &mut nodes {
        let status = node.stop().unwrap();
        assert!(status.success(), "{}", node.log());
    }
}

/// The listener's address, from the line a gateway prints at start.
async fn listener_address(node: &Node) -> String {
    eventually(Duration::from_secs(20), "a webhook listener", || async {
        let text = node.log();
        let rest = text.split("webhook listener on ").nth(1)?;
        rest.split_whitespace().next().map(str::to_owned)
    })
    .await
}

/// WhatsApp Cloud is a webhook platform: every node serves it, so two
/// messages of one chat can reach two nodes. The second node waits for the
/// first one's turn, says so, and (the default busy mode being interrupt)
/// interrupts it: only the answer to the newer message is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_busy_on_one_node_is_interrupted_by_a_message_reaching_another() {
    use talaria_testkit::whatsapp::{API_VERSION, MetaWebhook, delivery, text};
    const WA_TOKEN: &str = "EAAGclitest-access-token-0123456789";
    const NUMBER: &str = "106540352242922";
    const APP_SECRET: &str = "cli-app-secret-0123456789";
    const VERIFY: &str = "cli-verify-token-0123";
    const ADA: &str = "16505551234";

    let llm = MockOpenAi::start().await;
    let graph = talaria_testkit::FakeGraph::start(WA_TOKEN, NUMBER).await;
    let schema = talaria_testkit::postgres::fresh_schema().await;
    let mut nodes: Vec<Node> = (0..2)
        .map(|i| {
            let home = home(
                &llm,
                &format!(
                    "  webhook:\n    port: 0\n  whatsapp_cloud:\n    graph_base: {}\n    \
                     api_version: {API_VERSION}\n",
                    graph.base_url()
                ),
                &format!(
                    "WHATSAPP_CLOUD_TOKEN={WA_TOKEN}\nWHATSAPP_CLOUD_PHONE_NUMBER_ID={NUMBER}\n\
                     WHATSAPP_CLOUD_APP_SECRET={APP_SECRET}\nWHATSAPP_CLOUD_VERIFY_TOKEN={VERIFY}\n\
                     WHATSAPP_CLOUD_ALLOWED_USERS={ADA}\n"
                ),
            );
            use_postgres(&home, &schema);
            let log = home.root.join("node.log");
            Node {
                home,
                log,
                host: format!("wa-host-{i}"),
                child: None,
            }
        })
        .collect();
    for node in &mut nodes {
        node.start();
    }
    let mut hooks = Vec::new();
    for node in &nodes {
        hooks.push(MetaWebhook::new(&listener_address(node).await, APP_SECRET));
    }
    /// Delivers once; `Some` when the node took it (503 until its adapter
    /// is attached, which Meta, and this test, retry).
    async fn deliver(meta: &MetaWebhook, wamid: &str, body: &str) -> Option<()> {
        let payload = delivery(
            NUMBER,
            &[(ADA, "Ada")],
            vec![text(ADA, wamid, body)],
            vec![],
        );
        let answer = meta.deliver(&payload).await;
        (answer.status == 200).then_some(())
    }

    // The first turn is slow; the second message reaches the other node
    // while it runs.
    llm.push(talaria_testkit::Reply::text("the slow answer").with_delay(Duration::from_secs(8)));
    llm.push(talaria_testkit::Reply::text(
        "the answer to the newer message",
    ));
    eventually(
        Duration::from_secs(20),
        "node 0 to take the message",
        || deliver(&hooks[0], "wamid.ONE", "tell me something slowly"),
    )
    .await;
    eventually(
        Duration::from_secs(20),
        "the first turn to call the model",
        || async { (!llm.requests().is_empty()).then_some(()) },
    )
    .await;
    eventually(
        Duration::from_secs(20),
        "node 1 to take the message",
        || deliver(&hooks[1], "wamid.TWO", "actually, never mind that"),
    )
    .await;

    let sent = graph.wait_for_sent(2, Duration::from_secs(30)).await;
    let bodies: Vec<&str> = sent.iter().map(|s| s.body.as_str()).collect();
    assert!(
        bodies[0].starts_with("⚡ Interrupting"),
        "the waiting node says what happens: {bodies:?}"
    );
    assert_eq!(bodies[1], "the answer to the newer message");
    // The slow answer would have come by now; it was dropped.
    tokio::time::sleep(Duration::from_secs(9)).await;
    let bodies: Vec<String> = graph.sent().into_iter().map(|s| s.body).collect();
    assert_eq!(bodies.len(), 2, "{bodies:?}");
    assert!(!bodies.iter().any(|b| b == "the slow answer"));
    // The newer turn ran after the first had stopped: its request carries
    // both user messages of the session, in order.
    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    let users: Vec<String> = requests[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        users.last().map(String::as_str),
        Some("actually, never mind that"),
        "{users:?}"
    );
    for node in &mut nodes {
        let status = node.stop().unwrap();
        assert!(status.success(), "{}", node.log());
    }
}

/// Two nodes serving the same webhook platform sweep the ledger every few
/// seconds: replies owed by a node that is gone are each claimed, and sent,
/// by exactly one of them.
///
/// The race is made to happen and seen to happen: the test holds the
/// ledger table locked while the dead node's rows become claimable, waits
/// until both nodes' sweeps are blocked inside the claim (seen in
/// PostgreSQL's lock table, by each node's connection name), and then
/// lets both go at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_sweeping_the_same_owed_replies_send_each_once() {
    use talaria_store::{LedgerStore, NewObligation, NodeAnnouncement, NodeId};
    const WA_TOKEN: &str = "EAAGclitest-access-token-0123456789";
    const NUMBER: &str = "106540352242922";
    const OWED: usize = 60;

    let llm = MockOpenAi::start().await;
    let graph = talaria_testkit::FakeGraph::start(WA_TOKEN, NUMBER).await;
    let schema = talaria_testkit::postgres::fresh_schema().await;
    let store = open_store(&schema).await;
    // A node on another host that will die owing replies. Alive for now,
    // so the sweeps leave its rows alone.
    let doomed = NodeId::new("a-node-about-to-die").unwrap();
    store
        .heartbeat(
            &NodeAnnouncement {
                id: doomed.clone(),
                host: "a-host-elsewhere".to_owned(),
                pid: 4242,
                started_at: Some(1),
                version: "test".to_owned(),
            },
            300.0,
        )
        .await
        .unwrap();
    for i in 0..OWED {
        store
            .record_obligation(NewObligation {
                id: format!("owed-{i:03}"),
                session_key: format!("agent:main:whatsapp_cloud:dm:1650555{i:04}"),
                platform: "whatsapp_cloud".to_owned(),
                chat_id: format!("1650555{i:04}"),
                thread_id: None,
                reply_to: None,
                content: format!("owed reply number {i}"),
                owner: doomed.clone(),
                settles: Vec::new(),
            })
            .await
            .unwrap();
    }
    let mut nodes: Vec<Node> = (0..2)
        .map(|i| {
            let home = home(
                &llm,
                &format!(
                    "  webhook:\n    port: 0\n  whatsapp_cloud:\n    graph_base: {}\n    \
                     api_version: {}\n",
                    graph.base_url(),
                    talaria_testkit::whatsapp::API_VERSION
                ),
                &format!(
                    "WHATSAPP_CLOUD_TOKEN={WA_TOKEN}\nWHATSAPP_CLOUD_PHONE_NUMBER_ID={NUMBER}\n\
                     WHATSAPP_CLOUD_APP_SECRET=sweep-app-secret-0123\n\
                     WHATSAPP_CLOUD_VERIFY_TOKEN=sweep-verify-0123\n\
                     WHATSAPP_CLOUD_ALLOWED_USERS=16505550000\n"
                ),
            );
            // Each node's connections carry its name, so the lock table
            // below can say whose sweep waits.
            let path = home.root.join("config.yaml");
            let mut config = std::fs::read_to_string(&path).unwrap();
            config.push_str(&format!(
                "store:\n  backend: postgres\n  postgres_url: {}?application_name=sweep-node-{i}\n  \
                 postgres_schema: {schema}\n  postgres_max_connections: 4\n",
                talaria_testkit::postgres::url()
            ));
            std::fs::write(path, config).unwrap();
            let log = home.root.join("node.log");
            Node {
                home,
                log,
                host: format!("sweep-host-{i}"),
                child: None,
            }
        })
        .collect();
    for node in &mut nodes {
        node.start();
    }
    for node in &nodes {
        listener_address(node).await;
    }

    // The table locked against claims (plain reads still pass), then the
    // owner declared dead: both nodes' next sweeps find rows to claim and
    // wait on the lock.
    let mut gate = talaria_testkit::postgres::connect(Some(&schema)).await;
    let held = gate.transaction().await.unwrap();
    held.batch_execute("LOCK TABLE delivery_obligations IN EXCLUSIVE MODE")
        .await
        .unwrap();
    assert!(store.expire_node(&doomed).await.unwrap());
    let watcher = talaria_testkit::postgres::connect(Some(&schema)).await;
    let waiting = eventually(
        Duration::from_secs(60),
        "both nodes' sweeps waiting on the locked ledger",
        || async {
            let rows = watcher
                .query(
                    "SELECT DISTINCT a.application_name FROM pg_locks l \
                     JOIN pg_stat_activity a ON a.pid = l.pid \
                     WHERE NOT l.granted AND l.relation = 'delivery_obligations'::regclass \
                       AND a.query LIKE '%owner_node%'",
                    &[],
                )
                .await
                .ok()?;
            let names: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
            (names.len() == 2).then_some(names)
        },
    )
    .await;
    assert!(
        waiting.iter().all(|n| n.starts_with("sweep-node-")),
        "{waiting:?}"
    );
    // Both released at once.
    held.rollback().await.unwrap();

    graph.wait_for_sent(OWED, Duration::from_secs(60)).await;
    // Every row delivered, each claimed once: a second claim would have
    // counted a second attempt (and sent a second copy).
    eventually(Duration::from_secs(30), "every row delivered", || async {
        let counts = store.obligation_counts().await.ok()?;
        (counts.get(&ObligationState::Delivered).copied() == Some(OWED as u64)).then_some(())
    })
    .await;
    for i in 0..OWED {
        let row = store
            .obligation(&format!("owed-{i:03}"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(row.attempts, 1, "{row:?}");
        assert_ne!(row.owner.as_ref(), Some(&doomed), "{row:?}");
    }
    let mut bodies: Vec<String> = graph.sent().into_iter().map(|s| s.body).collect();
    bodies.sort();
    let mut expected: Vec<String> = (0..OWED)
        .map(|i| format!("owed reply number {i}"))
        .collect();
    expected.sort();
    assert_eq!(bodies, expected, "each owed reply exactly once");
    for node in &mut nodes {
        let status = node.stop().unwrap();
        assert!(status.success(), "{}", node.log());
    }
}

/// What a turn on one node saves to memory or to a skill is in the next
/// session's prompt on the other node, in both directions, and in the
/// other node's files (which stay the interface).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_skills_saved_on_one_node_are_in_the_next_prompt_on_another() {
    use talaria_testkit::{Reply, ToolCallReply};
    let llm = MockOpenAi::start().await;
    let schema = talaria_testkit::postgres::fresh_schema().await;
    let key = "sk-cluster-memory-key-0123456789";
    let mut nodes = api_nodes(&llm, &schema, key, "", "memory").await;
    let http = reqwest::Client::new();
    let turn = |port: u16, session: &'static str, text: &'static str| {
        let http = http.clone();
        async move {
            let response = http
                .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
                .bearer_auth(key)
                .header("x-talaria-session-id", session)
                .json(&serde_json::json!({
                    "model": "talaria",
                    "messages": [{"role": "user", "content": text}],
                }))
                .send()
                .await
                .unwrap();
            assert!(response.status().is_success(), "{}", response.status());
        }
    };
    let system_prompt = |index: usize| -> String {
        let requests = llm.requests();
        requests[index].body["messages"][0]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let skill = "---\nname: llama-care\ndescription: Looking after Pablo the llama\n---\n\n1. Hay twice a day.\n";

    // Node 0: the model saves a fact about the user and writes a skill.
    llm.push(Reply::tool_calls(vec![
        ToolCallReply::new(
            "call_memory",
            "memory",
            serde_json::json!({"action": "add", "target": "user", "content": "Owns a llama called Pablo."})
                .to_string(),
        ),
        ToolCallReply::new(
            "call_skill",
            "skill_manage",
            serde_json::json!({"action": "create", "name": "llama-care", "content": skill})
                .to_string(),
        ),
    ]));
    llm.push(Reply::text("Noted."));
    turn(nodes[0].1, "memory-session-1", "remember my llama Pablo").await;
    assert_eq!(llm.requests().len(), 2);
    let results: Vec<String> = llm.requests()[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(
        results.iter().all(|r| r.contains("\"success\":true")),
        "{results:?}"
    );

    // Node 1, a new session: the fact and the skill are in its prompt.
    llm.push(Reply::text("Pablo, of course."));
    turn(nodes[1].1, "memory-session-2", "what is my llama called?").await;
    let prompt = system_prompt(2);
    assert!(prompt.contains("Owns a llama called Pablo."), "{prompt}");
    assert!(prompt.contains("llama-care"), "{prompt}");
    let home1 = &nodes[1].0.home.root;
    assert_eq!(
        std::fs::read_to_string(home1.join("memories/USER.md")).unwrap(),
        "Owns a llama called Pablo."
    );
    assert_eq!(
        std::fs::read_to_string(home1.join("skills/llama-care/SKILL.md")).unwrap(),
        skill
    );

    // And back: node 1 saves a second fact; node 0's next session has
    // both, the first one kept.
    llm.push(Reply::tool_calls(vec![ToolCallReply::new(
        "call_memory_2",
        "memory",
        serde_json::json!({"action": "add", "target": "user", "content": "Prefers tea to coffee."})
            .to_string(),
    )]));
    llm.push(Reply::text("Noted too."));
    turn(nodes[1].1, "memory-session-3", "I prefer tea").await;
    llm.push(Reply::text("Tea, and Pablo."));
    turn(nodes[0].1, "memory-session-4", "what do you know about me?").await;
    let prompt = system_prompt(5);
    assert!(prompt.contains("Owns a llama called Pablo."), "{prompt}");
    assert!(prompt.contains("Prefers tea to coffee."), "{prompt}");

    let store = open_store(&schema).await;
    let shared = talaria_store::SharedFileStore::shared_file(&store, "memories/USER.md")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        shared.content.as_deref(),
        Some("Owns a llama called Pablo.\n§\nPrefers tea to coffee.".as_bytes())
    );
    for (node, _) in &mut nodes {
        let status = node.stop().unwrap();
        assert!(status.success(), "{}", node.log());
    }
}
