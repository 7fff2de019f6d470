//! `talaria send`'s path into a running gateway: the control socket on a
//! real Unix socket, delivery targets resolved against home channels, and
//! every message recorded in a real SQLite ledger.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use talaria_agent::tools::send_message::Messenger;
use talaria_core::Env;
use talaria_gateway::Adapter;
use talaria_gateway::control::{self, ClientError, Request};
use talaria_gateway::delivery::Delivery;
use talaria_gateway::ledger::Ledger;
use talaria_gateway::messenger::GatewayMessenger;
use talaria_gateway::target::HomeChannels;
use talaria_store::{LedgerStore, NewSession, ObligationState, SessionStore, SqliteStore};
use talaria_testkit::recorder::Recorder;
use tokio_util::sync::CancellationToken;

struct Setup {
    dir: tempfile::TempDir,
    store: Arc<SqliteStore>,
    adapter: Arc<Recorder>,
    delivery: Delivery,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("state.db")).unwrap());
    let adapter = Arc::new(Recorder::new("telegram"));
    let env = Env::from_pairs([("TELEGRAM_HOME_CHANNEL", "555")]);
    let homes = HomeChannels::load(&Default::default(), &env, &["telegram"]);
    let delivery = Delivery::new(
        vec![adapter.clone() as Arc<dyn Adapter>],
        Some(Ledger::new(store.clone(), talaria_store::NodeId::random())),
    )
    .with_homes(Arc::new(homes))
    .with_local_dir(dir.path().join("cron/output"));
    Setup {
        dir,
        store,
        adapter,
        delivery,
    }
}

fn send(target: &str, text: &str) -> Request {
    Request::Send {
        target: target.into(),
        text: text.into(),
    }
}

#[tokio::test]
async fn sends_through_the_socket_go_to_their_targets_and_the_ledger() {
    let s = setup();
    let path = s.dir.path().join("gateway.sock");
    let stop = CancellationToken::new();
    let server = tokio::spawn(control::serve(
        path.clone(),
        s.delivery.clone(),
        stop.clone(),
    ));
    while !path.exists() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    let home = control::request(&path, &send("Telegram", "to the home channel"))
        .await
        .unwrap();
    assert!(home.ok, "{home:?}");
    assert_eq!(home.detail.as_deref(), Some("sent to telegram:555"));
    let topic = control::request(&path, &send("telegram:-100:7", "into a topic"))
        .await
        .unwrap();
    assert!(topic.ok, "{topic:?}");
    let local = control::request(&path, &send("local", "kept on disk"))
        .await
        .unwrap();
    assert!(local.ok, "{local:?}");

    let sent = s.adapter.sent();
    assert_eq!(sent.len(), 2);
    assert_eq!(
        (sent[0].chat_id.as_str(), sent[0].thread_id.as_deref()),
        ("555", None)
    );
    assert_eq!(sent[0].text, "to the home channel");
    assert_eq!(
        (sent[1].chat_id.as_str(), sent[1].thread_id.as_deref()),
        ("-100", Some("7"))
    );
    let files: Vec<_> = std::fs::read_dir(s.dir.path().join("cron/output/misc"))
        .unwrap()
        .collect();
    assert_eq!(files.len(), 1);
    let written = std::fs::read_to_string(files[0].as_ref().unwrap().path()).unwrap();
    assert!(written.contains("kept on disk"));
    // Every message owed went through the ledger.
    let counts = s.store.obligation_counts().await.unwrap();
    assert_eq!(
        counts.get(&ObligationState::Delivered),
        Some(&3),
        "{counts:?}"
    );

    for (target, expected) in [
        ("discord", "not connected"),
        ("telegram::1", "expected origin"),
        ("", "empty"),
    ] {
        let r = control::request(&path, &send(target, "x")).await.unwrap();
        assert!(!r.ok);
        let error = r.error.unwrap_or_default();
        assert!(error.contains(expected), "{target:?}: {error}");
    }
    let empty = control::request(&path, &send("telegram", "  "))
        .await
        .unwrap();
    assert!(!empty.ok);

    stop.cancel();
    server.await.unwrap().unwrap();
    assert!(!path.exists(), "the socket is removed on shutdown");
    assert!(matches!(
        control::request(&path, &send("telegram", "x")).await,
        Err(ClientError::NotRunning(_))
    ));
}

#[tokio::test]
async fn garbage_on_the_socket_gets_an_error_and_the_server_keeps_serving() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let s = setup();
    let path = s.dir.path().join("gateway.sock");
    // A socket file left behind by a dead gateway is replaced.
    std::fs::write(&path, b"stale").unwrap();
    let stop = CancellationToken::new();
    let server = tokio::spawn(control::serve(
        path.clone(),
        s.delivery.clone(),
        stop.clone(),
    ));
    let mut stream = loop {
        match tokio::net::UnixStream::connect(&path).await {
            Ok(stream) => break stream,
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    };
    stream.write_all(b"{not json\n").await.unwrap();
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).await.unwrap();
    assert!(
        line.contains("\"ok\":false") && line.contains("not a valid request"),
        "{line}"
    );
    let r = control::request(&path, &send("telegram", "still here"))
        .await
        .unwrap();
    assert!(r.ok, "{r:?}");
    stop.cancel();
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn the_send_message_tool_resolves_origin_to_the_sessions_chat() {
    let s = setup();
    let session = NewSession {
        id: talaria_core::ids::new_session_id(),
        source: "telegram".into(),
        chat_id: Some("4242".into()),
        thread_id: Some("9".into()),
        ..NewSession::default()
    };
    s.store.create_session(session.clone()).await.unwrap();
    let messenger = GatewayMessenger::bound(s.store.clone(), s.delivery.clone());
    let detail = messenger
        .send("origin", "back where we started", &session.id)
        .await
        .unwrap();
    assert_eq!(detail, "sent to telegram:4242:9");
    let cli = NewSession {
        id: talaria_core::ids::new_session_id(),
        source: "cli".into(),
        ..NewSession::default()
    };
    s.store.create_session(cli.clone()).await.unwrap();
    let detail = messenger
        .send("origin", "no chat here", &cli.id)
        .await
        .unwrap();
    assert!(detail.contains("local file"), "{detail}");
    let targets = messenger.targets().await.unwrap();
    assert!(
        targets
            .iter()
            .any(|t| t.target == "telegram" && t.description.contains("telegram:555")),
        "{targets:?}"
    );
    let unbound = GatewayMessenger::new(s.store.clone());
    assert!(
        unbound
            .send("telegram", "x", &cli.id)
            .await
            .unwrap_err()
            .contains("starting")
    );
}
