//! The `yb_*` tools through the real Yuanbao adapter's socket, against
//! the fake platform on 127.0.0.1.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use talaria_adapter::{Adapter, AdapterContext, Inbox, Liveness, LivenessReporter};
use talaria_agent::interaction::NoHuman;
use talaria_agent::tools::{SessionState, Tool, ToolContext};
use talaria_core::{Config, Home, Redactor, Secret};
use talaria_platforms::yuanbao::{Access, Policy, YuanbaoAdapter, YuanbaoLink, YuanbaoSettings};
use talaria_testkit::FakeYuanbao;
use talaria_testkit::wait::WAIT;
use talaria_testkit::yuanbao::BOT_ID;
use talaria_tools::yuanbao::{MAX_MEMBERS_SHOWN, yb_tools};
use tokio_util::sync::CancellationToken;

const APP_KEY: &str = "ak-tools-0001";
const APP_SECRET: &str = "sk-tools-secret-0002";

fn settings(fake: &FakeYuanbao) -> YuanbaoSettings {
    YuanbaoSettings {
        app_key: Secret::new(APP_KEY),
        app_secret: Secret::new(APP_SECRET),
        bot_id: None,
        ws_url: fake.ws_url(),
        api_domain: fake.api_domain(),
        route_env: None,
        access: Access {
            dm: Policy::Open,
            dm_allow_from: vec![],
            group: Policy::Open,
            group_allow_from: vec![],
            allow_all: false,
        },
        ping_interval: Duration::from_secs(30),
        pong_timeout: Duration::from_secs(10),
        request_timeout: Duration::from_secs(5),
        cos_endpoint: fake.cos_endpoint(),
        media_hosts: vec![],
    }
}

fn ctx(dir: &tempfile::TempDir) -> ToolContext {
    let home = Home::at(dir.path().join("home"));
    home.ensure().unwrap();
    let store = Arc::new(talaria_store::SqliteStore::open(&home.state_db()).unwrap());
    ToolContext {
        session_id: "s1".into(),
        home,
        workdir: dir.path().to_path_buf(),
        config: Arc::new(Config::default()),
        store,
        interaction: Arc::new(NoHuman),
        session: Arc::new(SessionState::default()),
        redactor: Redactor::default(),
        cancel: CancellationToken::new(),
        execution: talaria_agent::Execution::local(dir.path()),
        tools: Arc::new(talaria_agent::tools::Registry::new()),
        platform: None,
        progress: talaria_agent::Progress::none(),
    }
}

fn tool(tools: &[Arc<dyn Tool>], name: &str) -> Arc<dyn Tool> {
    tools.iter().find(|t| t.name() == name).unwrap().clone()
}

struct Running {
    fake: FakeYuanbao,
    tools: Vec<Arc<dyn Tool>>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    dir: tempfile::TempDir,
}

/// The fake, an adapter on a link connected to it, and the tools on the
/// same link.
async fn running() -> Running {
    let fake = FakeYuanbao::start(APP_KEY, APP_SECRET).await;
    let link = YuanbaoLink::new();
    let adapter = Arc::new(YuanbaoAdapter::with_link(settings(&fake), link.clone()).unwrap());
    let (inbox, _events) = Inbox::channel(4);
    let (reporter, mut liveness) = LivenessReporter::new();
    let shutdown = CancellationToken::new();
    let context = AdapterContext {
        inbox,
        liveness: reporter,
        shutdown: shutdown.clone(),
    };
    let task = tokio::spawn(async move {
        let _keep = _events;
        let _ = adapter.run(context).await;
    });
    fake.wait_for_connection(1, WAIT).await;
    tokio::time::timeout(WAIT, liveness.wait_for(|l| *l == Liveness::Live))
        .await
        .unwrap()
        .unwrap();
    Running {
        fake,
        tools: yb_tools(link),
        shutdown,
        task,
        dir: tempfile::tempdir().unwrap(),
    }
}

async fn call(r: &Running, name: &str, args: Value) -> Result<Value, String> {
    let out = tool(&r.tools, name)
        .call(args, &ctx(&r.dir))
        .await
        .map_err(|e| e.0)?;
    Ok(serde_json::from_str(&out).unwrap())
}

#[tokio::test]
async fn without_a_socket_the_tools_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let link = YuanbaoLink::new();
    let tools = yb_tools(link.clone());
    let info = tool(&tools, "yb_query_group_info");
    // No adapter in this process (a chat session).
    let err = info
        .call(json!({"group_code": "g1"}), &ctx(&dir))
        .await
        .unwrap_err();
    assert!(err.0.contains("talaria gateway run"), "{}", err.0);
    // An adapter that is not connected.
    let fake = FakeYuanbao::start(APP_KEY, APP_SECRET).await;
    let _adapter = YuanbaoAdapter::with_link(settings(&fake), link).unwrap();
    let err = tool(&tools, "yb_query_group_members")
        .call(
            json!({"group_code": "g1", "action": "list_all"}),
            &ctx(&dir),
        )
        .await
        .unwrap_err();
    assert!(err.0.contains("down"), "{}", err.0);
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn group_info_rides_the_adapters_socket() {
    let r = running().await;
    r.fake.add_member("g1", "u-owner", "Olga", 2);
    r.fake.add_member("g1", "u-ann", "Ann", 0);
    let out = call(&r, "yb_query_group_info", json!({"group_code": "group:g1"}))
        .await
        .unwrap();
    assert_eq!(out["group_name"], "Pai g1");
    assert_eq!(out["member_count"], 2);
    assert_eq!(out["owner"]["user_id"], "u-owner");
    assert_eq!(out["owner"]["nickname"], "Olga");
    let asked: Vec<String> = r.fake.requests().iter().map(|q| q.cmd.clone()).collect();
    assert_eq!(asked, vec!["query_group_info"]);
    // The platform's refusal is the tool's error.
    let err = call(&r, "yb_query_group_info", json!({"group_code": "nope"}))
        .await
        .unwrap_err();
    assert!(err.contains("404"), "{err}");
    // The socket goes away with the gateway: said plainly.
    r.shutdown.cancel();
    tokio::time::timeout(WAIT, r.task).await.unwrap().unwrap();
    let err = tool(&r.tools, "yb_query_group_info")
        .call(json!({"group_code": "g1"}), &ctx(&r.dir))
        .await
        .unwrap_err();
    assert!(err.0.contains("down"), "{}", err.0);
}

#[tokio::test]
async fn members_are_paged_found_listed_and_bounded() {
    let r = running().await;
    for i in 0..250 {
        r.fake
            .add_member("g2", &format!("u{i:03}"), &format!("Member {i:03}"), 0);
    }
    r.fake.add_member("g2", "u-ann", "Annika", 1);
    r.fake.add_member("g2", "u-bot", "Helper", 3);
    r.fake.add_member("g2", BOT_ID, "Talaria", 0);

    let out = call(
        &r,
        "yb_query_group_members",
        json!({"group_code": "g2", "action": "find", "name": "ANN", "mention": true}),
    )
    .await
    .unwrap();
    assert_eq!(out["success"], true);
    assert_eq!(
        out["members"],
        json!([{"user_id": "u-ann", "nickname": "Annika", "role": "admin"}])
    );
    assert!(out["mention_hint"].as_str().unwrap().contains("@"));
    // Two pages of 200 were read for the 253 members.
    assert_eq!(r.fake.member_pages(), vec![(0, 200), (200, 200)]);

    let out = call(
        &r,
        "yb_query_group_members",
        json!({"group_code": "g2", "action": "list_bots"}),
    )
    .await
    .unwrap();
    let bots: Vec<&str> = out["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["user_id"].as_str().unwrap())
        .collect();
    assert_eq!(bots, vec!["u-bot", BOT_ID]);
    assert!(out.get("mention_hint").is_none());

    let out = call(
        &r,
        "yb_query_group_members",
        json!({"group_code": "g2", "action": "list_all"}),
    )
    .await
    .unwrap();
    assert_eq!(out["members"].as_array().unwrap().len(), MAX_MEMBERS_SHOWN);
    assert!(
        out["more"].as_str().unwrap().starts_with("153 more"),
        "{out}"
    );

    // No match: said, with everyone listed (bounded) to choose from.
    let out = call(
        &r,
        "yb_query_group_members",
        json!({"group_code": "g2", "action": "find", "name": "zed"}),
    )
    .await
    .unwrap();
    assert_eq!(out["success"], false);
    assert!(out["msg"].as_str().unwrap().contains("No match"));
    // Bad arguments never reach the platform.
    let before = r.fake.requests().len();
    for args in [
        json!({"action": "list_all"}),
        json!({"group_code": "g2", "action": "find"}),
        json!({"group_code": "g2", "action": "kick"}),
    ] {
        assert!(call(&r, "yb_query_group_members", args).await.is_err());
    }
    assert_eq!(r.fake.requests().len(), before);
    r.shutdown.cancel();
}
