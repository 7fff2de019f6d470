//! External memory through a fake mem0-compatible service on 127.0.0.1:
//! recall enters the model's view of the user message inside the fence
//! and nowhere else; each exchange is handed over after the turn; a slow
//! or failing service costs only its recall; only one provider is allowed;
//! a model echoing the fence leaks nothing to the screen or the store.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};
use talaria_agent::interaction::NoHuman;
use talaria_agent::memory_context::{CLOSE, OPEN};
use talaria_agent::memory_provider::{MemoryError, MemoryManager};
use talaria_agent::tools::Registry;
use talaria_agent::{Agent, AgentParts, TurnObserver};
use talaria_core::config::Mem0Config;
use talaria_core::{Env, Redactor};
use talaria_learning::mem0::Mem0;
use talaria_store::{SearchQuery, SessionStore, SqliteStore};
use talaria_testkit::{MockOpenAi, Reply};
use tokio_util::sync::CancellationToken;

/// A search request's body and its Authorization header.
type Search = (Value, Option<String>);

#[derive(Clone, Default)]
struct Fake {
    searches: Arc<Mutex<Vec<Search>>>,
    adds: Arc<Mutex<Vec<Value>>>,
    /// How the search answers: a delay, and an HTTP status.
    delay: Arc<Mutex<Duration>>,
    status: Arc<Mutex<u16>>,
}

async fn search(
    State(fake): State<Fake>,
    headers: axum::http::HeaderMap,
    Json(body): Json<Value>,
) -> (axum::http::StatusCode, Json<Value>) {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    fake.searches.lock().unwrap().push((body, auth));
    let delay = *fake.delay.lock().unwrap();
    tokio::time::sleep(delay).await;
    let status = *fake.status.lock().unwrap();
    (
        axum::http::StatusCode::from_u16(status).unwrap(),
        Json(json!([
            {"id": "1", "memory": "The user's dentist is Dr. Mehta, Tuesdays at 9.", "score": 0.9},
            {"id": "2", "memory": "The user prefers short answers.", "score": 0.7}
        ])),
    )
}

async fn add(State(fake): State<Fake>, Json(body): Json<Value>) -> Json<Value> {
    fake.adds.lock().unwrap().push(body);
    Json(json!([{"id": "3", "event": "ADD"}]))
}

async fn start_fake() -> (Fake, String) {
    let fake = Fake {
        status: Arc::new(Mutex::new(200)),
        ..Fake::default()
    };
    let app = axum::Router::new()
        .route("/v1/memories/search/", post(search))
        .route("/v1/memories/", post(add))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (fake, url)
}

struct Rig {
    _dir: tempfile::TempDir,
    llm: MockOpenAi,
    store: Arc<SqliteStore>,
    agent: Agent,
    fake: Fake,
}

async fn rig(timeout: Duration) -> Rig {
    let (fake, url) = start_fake().await;
    let (dir, home) = support::home();
    let llm = MockOpenAi::start().await;
    let config = support::config(&llm, |_| {});
    let store = support::store(&home);
    let agent = support::agent(
        &config,
        &home,
        &llm,
        store.clone(),
        Registry::with_core_tools(&config),
        dir.path(),
    );
    let mem0 = Mem0::from_config(
        &Mem0Config {
            base_url: url,
            user_id: "ada".into(),
            ..Mem0Config::default()
        },
        &Env::from_pairs([("MEM0_API_KEY", "m0-test-key-123")]),
    )
    .unwrap();
    let memory = Arc::new(MemoryManager::new(timeout));
    memory.add(Arc::new(mem0)).unwrap();
    agent.set_memory(memory);
    Rig {
        _dir: dir,
        llm,
        store,
        agent,
        fake,
    }
}

/// Collects what would be shown on screen.
#[derive(Default)]
struct Screen(Mutex<String>);

impl TurnObserver for Screen {
    fn text(&self, delta: &str) {
        self.0.lock().unwrap().push_str(delta);
    }
}

fn last_user_message(llm: &MockOpenAi) -> String {
    llm.requests().last().unwrap().body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recall_is_fenced_for_the_model_only_and_each_exchange_is_handed_over() {
    let rig = rig(Duration::from_secs(5)).await;
    let session = rig.agent.new_session("cli").await.unwrap();
    rig.llm.push(Reply::text("Tuesday at 9, with Dr. Mehta."));
    let screen = Screen::default();
    let outcome = rig
        .agent
        .run_turn(
            &session,
            "When is my dentist?",
            &screen,
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(outcome.answer, "Tuesday at 9, with Dr. Mehta.");

    // The model saw the recall, fenced, before the user's words.
    let sent = last_user_message(&rig.llm);
    assert!(sent.starts_with(OPEN), "{sent}");
    assert!(sent.contains("Dr. Mehta, Tuesdays at 9") && sent.contains("not written by the user"));
    assert!(sent.ends_with("When is my dentist?"), "{sent}");
    let searches = rig.fake.searches.lock().unwrap().clone();
    assert_eq!(searches[0].0["query"], "When is my dentist?");
    assert_eq!(searches[0].0["user_id"], "ada");
    assert_eq!(searches[0].1.as_deref(), Some("Token m0-test-key-123"));

    // Nothing of it was stored, indexed or shown.
    let rows = rig.store.messages(&session.id).await.unwrap();
    assert_eq!(rows[0].message.content, "When is my dentist?");
    let found = rig
        .store
        .search(SearchQuery {
            text: "Mehta Tuesdays".into(),
            sources: vec![],
            exclude_session: None,
            limit: 5,
        })
        .await
        .unwrap();
    assert!(
        found.iter().all(|h| !h.snippet.contains("Tuesdays at 9")),
        "{found:?}"
    );
    assert_eq!(*screen.0.lock().unwrap(), "Tuesday at 9, with Dr. Mehta.");

    // The exchange reaches the service after the turn.
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.fake.adds.lock().unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the exchange was never handed over"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let add = rig.fake.adds.lock().unwrap()[0].clone();
    assert_eq!(add["user_id"], "ada");
    assert_eq!(add["messages"][0]["content"], "When is my dentist?");
    assert_eq!(
        add["messages"][1]["content"],
        "Tuesday at 9, with Dr. Mehta."
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_or_failing_service_costs_only_its_recall() {
    let rig = rig(Duration::from_millis(300)).await;
    let session = rig.agent.new_session("cli").await.unwrap();
    *rig.fake.delay.lock().unwrap() = Duration::from_secs(10);
    rig.llm.push(Reply::text("answered anyway"));
    let started = Instant::now();
    let outcome = rig
        .agent
        .run_turn(
            &session,
            "hello",
            &Screen::default(),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(outcome.answer, "answered anyway");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(last_user_message(&rig.llm), "hello", "no recall, no fence");

    *rig.fake.delay.lock().unwrap() = Duration::ZERO;
    *rig.fake.status.lock().unwrap() = 500;
    rig.llm.push(Reply::text("still answered"));
    let outcome = rig
        .agent
        .run_turn(
            &session,
            "again",
            &Screen::default(),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(outcome.answer, "still answered");
    assert_eq!(last_user_message(&rig.llm), "again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_echoing_the_fence_leaks_nothing() {
    let rig = rig(Duration::from_secs(5)).await;
    let session = rig.agent.new_session("cli").await.unwrap();
    let echoed = format!("Sure.{OPEN}\nThe user's dentist is Dr. Mehta.\n{CLOSE} Anything else?");
    rig.llm.push(Reply::text(echoed));
    let screen = Screen::default();
    let outcome = rig
        .agent
        .run_turn(&session, "hi", &screen, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(outcome.answer, "Sure. Anything else?");
    assert_eq!(*screen.0.lock().unwrap(), "Sure. Anything else?");
    let rows = rig.store.messages(&session.id).await.unwrap();
    assert_eq!(rows[1].message.content, "Sure. Anything else?");
}

#[test]
fn only_one_external_provider_is_allowed() {
    let manager = MemoryManager::new(Duration::from_secs(1));
    let first = Mem0::from_config(&Mem0Config::default(), &Env::default()).unwrap();
    let second = Mem0::from_config(&Mem0Config::default(), &Env::default()).unwrap();
    manager.add(Arc::new(first)).unwrap();
    let e = manager.add(Arc::new(second)).unwrap_err();
    assert_eq!(
        e,
        MemoryError::SecondProvider {
            existing: "mem0".into()
        }
    );
    assert!(e.to_string().contains("only one"), "{e}");
}

/// A provider that records which lifecycle calls it got.
#[derive(Default)]
struct Recording {
    calls: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl talaria_agent::memory_provider::MemoryProvider for Recording {
    fn name(&self) -> &str {
        "recording"
    }
    async fn initialize(&self) -> Result<(), String> {
        self.calls.lock().unwrap().push("initialize".into());
        Ok(())
    }
    fn system_prompt_block(&self) -> Option<String> {
        Some("## Long-term memory\nA memory service recalls facts for you.".into())
    }
    async fn prefetch(&self, _q: &str, _s: &str) -> Result<Option<String>, String> {
        Ok(None)
    }
    async fn sync_turn(&self, _u: &str, _a: &str, _s: &str) -> Result<(), String> {
        self.calls.lock().unwrap().push("sync".into());
        Ok(())
    }
    async fn on_session_end(&self, session_id: &str) {
        self.calls.lock().unwrap().push(format!("end {session_id}"));
    }
    async fn shutdown(&self) {
        self.calls.lock().unwrap().push("shutdown".into());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_lifecycle_and_its_prompt_block() {
    let rig = rig(Duration::from_secs(5)).await;
    // The rig's agent has mem0; a fresh agent gets the recording provider.
    let provider = Arc::new(Recording::default());
    let memory = Arc::new(MemoryManager::new(Duration::from_secs(1)));
    memory.add(provider.clone()).unwrap();
    let agent = Agent::new(AgentParts {
        config: rig.agent.parts().config.clone(),
        home: rig.agent.parts().home.clone(),
        provider: rig.agent.parts().provider.clone(),
        store: rig.store.clone(),
        registry: rig.agent.parts().registry.clone(),
        interaction: Arc::new(NoHuman),
        redactor: Redactor::default(),
        workdir: rig.agent.parts().workdir.clone(),
    });
    agent.set_memory(memory.clone());
    memory.initialize().await;
    let session = agent.new_session("cli").await.unwrap();
    rig.llm.push(Reply::text("hi"));
    agent
        .run_turn(
            &session,
            "hello",
            &Screen::default(),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let prompt = rig.llm.requests().last().unwrap().body["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        prompt.ends_with("A memory service recalls facts for you."),
        "{prompt}"
    );
    memory.session_ended(&session.id);
    let deadline = Instant::now() + Duration::from_secs(5);
    while provider.calls.lock().unwrap().len() < 3 {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            provider.calls.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    memory.shutdown(Duration::from_secs(1)).await;
    let calls = provider.calls.lock().unwrap().clone();
    assert_eq!(calls[0], "initialize");
    assert!(calls.contains(&"sync".to_owned()));
    assert!(calls.contains(&format!("end {}", session.id)));
    assert_eq!(calls.last().unwrap(), "shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_without_memory_neither_recalls_nor_hands_over() {
    let rig = rig(Duration::from_secs(5)).await;
    let session = rig.agent.new_session("cron").await.unwrap();
    rig.llm.push(Reply::text("job done"));
    let outcome = rig
        .agent
        .run_turn_with(
            &session,
            "scheduled work",
            &Screen::default(),
            CancellationToken::new(),
            talaria_agent::TurnOptions {
                without_memory: true,
                ..talaria_agent::TurnOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(outcome.answer, "job done");
    assert_eq!(last_user_message(&rig.llm), "scheduled work");
    // A normal turn after it does hand over: so the first one's silence
    // is the option's doing, not timing.
    rig.llm.push(Reply::text("chat answer"));
    rig.agent
        .run_turn(
            &session,
            "chat",
            &Screen::default(),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.fake.adds.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let adds = rig.fake.adds.lock().unwrap().clone();
    assert_eq!(adds.len(), 1, "{adds:?}");
    assert_eq!(adds[0]["messages"][0]["content"], "chat");
    assert_eq!(rig.fake.searches.lock().unwrap().len(), 1);
}
