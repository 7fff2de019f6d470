//! Two API servers (two nodes) over one PostgreSQL store: a response one
//! node answered is retrieved, continued and deleted through the other.

use crate::api_support;

use std::sync::Arc;

use api_support::{KEY, agent_over, conversation};
use serde_json::{Value, json};
use talaria_api::{ApiServer, ApiServerSettings};
use talaria_core::{Home, Secret};
use talaria_store::{PostgresOptions, PostgresStore};
use talaria_testkit::{MockOpenAi, Reply};
use tokio_util::sync::CancellationToken;

/// A node: a server of its own, with an agent of its own, over `store`.
async fn node(
    mock: &MockOpenAi,
    dir: &std::path::Path,
    store: &Arc<PostgresStore>,
) -> (String, CancellationToken) {
    let home = Home::at(dir.join("home"));
    home.ensure().unwrap();
    let agent = agent_over(mock, dir, home, store.clone(), |_| {});
    let settings = ApiServerSettings {
        host: "127.0.0.1".into(),
        port: 0,
        key: Secret::new(KEY),
        max_concurrent_runs: 0,
        busy_wait: std::time::Duration::from_secs(60),
    };
    let server = ApiServer::bind(settings, agent)
        .await
        .unwrap()
        .with_transcript_store(store.clone());
    let base = format!("http://{}", server.local_addr());
    let shutdown = CancellationToken::new();
    tokio::spawn(server.serve(shutdown.clone()));
    (base, shutdown)
}

#[tokio::test(flavor = "multi_thread")]
async fn any_node_of_a_shared_store_serves_a_stored_response() {
    let mut options = PostgresOptions::new(talaria_testkit::postgres::url());
    options.schema = Some(talaria_testkit::postgres::fresh_schema().await);
    options.max_connections = 4;
    let store = Arc::new(PostgresStore::connect(options).await.unwrap());
    let mock = MockOpenAi::start().await;
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, stop_a) = node(&mock, a_dir.path(), &store).await;
    let (b, stop_b) = node(&mock, b_dir.path(), &store).await;
    let http = reqwest::Client::new();

    mock.push(Reply::text("Answered on A."));
    let first: Value = http
        .post(format!("{a}/v1/responses"))
        .bearer_auth(KEY)
        .json(&json!({"input": "hello A"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = first["id"].as_str().unwrap();

    let got = http
        .get(format!("{b}/v1/responses/{id}"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.json::<Value>().await.unwrap(), first);

    mock.push(Reply::text("Answered on B."));
    let second = http
        .post(format!("{b}/v1/responses"))
        .bearer_auth(KEY)
        .json(&json!({"input": "hello B", "previous_response_id": id}))
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), 200);
    let sent = mock.requests()[1].body["messages"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(
        conversation(&sent),
        [
            ("user", "hello A"),
            ("assistant", "Answered on A."),
            ("user", "hello B"),
        ]
        .map(|(r, c)| (r.to_owned(), c.to_owned()))
    );

    let deleted = http
        .delete(format!("{b}/v1/responses/{id}"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    let gone = http
        .get(format!("{a}/v1/responses/{id}"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 404);
    stop_a.cancel();
    stop_b.cancel();
}
