//! The gateway end to end with Matrix, in one process: the fake homeserver,
//! the mock LLM, a real SQLite file, and the real runner, ledger, router
//! and Matrix adapter between them.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use talaria_agent::interaction::NoHuman;
use talaria_agent::tools::Registry;
use talaria_agent::{Agent, AgentParts};
use talaria_core::{Config, Endpoint, Env, Home, ProviderKind, Redactor};
use talaria_gateway::Adapter;
use talaria_gateway::gateway::{Gateway, GatewayParts};
use talaria_gateway::hooks::Hooks;
use talaria_platforms::matrix::{MAX_MESSAGE_LEN, MatrixAdapter, MatrixSettings};
use talaria_store::{CursorStore, LedgerStore, ObligationState, SqliteStore};
use talaria_testkit::matrix::{MAX_EVENT_BYTES, Sent};
use talaria_testkit::{FakeMatrix, MockOpenAi, Reply};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "syt_gateway_test_token_0123456789";
const WAIT: Duration = Duration::from_secs(15);
const ALICE: &str = "@alice:localhost";
const MALLORY: &str = "@mallory:localhost";

struct Rig {
    hs: FakeMatrix,
    llm: MockOpenAi,
    dir: tempfile::TempDir,
    home: Home,
    env: Vec<(String, String)>,
    config: Config,
    running: Option<(CancellationToken, JoinHandle<()>)>,
}

impl Rig {
    async fn new(env: &[(&str, &str)]) -> Rig {
        let hs = FakeMatrix::start(TOKEN).await;
        let llm = MockOpenAi::start().await;
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home"));
        home.ensure().unwrap();
        let mut config = Config::default();
        config.model.default = Some("test-model".into());
        config.model.base_url = Some(llm.base_url());
        config.platforms.set("matrix.homeserver", hs.homeserver());
        config.platforms.set("matrix.sync_timeout_ms", 300);
        config.gateway.typing_interval_secs = 1;
        Rig {
            hs,
            llm,
            dir,
            home,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            config,
            running: None,
        }
    }

    /// A rig with a gateway running past its first sync.
    async fn started(env: &[(&str, &str)], setup: impl FnOnce(&FakeMatrix)) -> Rig {
        let mut rig = Rig::new(env).await;
        setup(&rig.hs);
        rig.start();
        rig.hs.wait_until_caught_up(WAIT).await;
        rig
    }

    /// Builds everything afresh from the home, as a new process would.
    fn start(&mut self) {
        assert!(self.running.is_none());
        let mut pairs = self.env.clone();
        pairs.push(("MATRIX_ACCESS_TOKEN".into(), TOKEN.into()));
        let env = Env::from_pairs(pairs);
        let config = Arc::new(self.config.clone());
        let store = Arc::new(SqliteStore::open(&self.home.state_db()).unwrap());
        let endpoint = Endpoint {
            provider: ProviderKind::Custom,
            model: "test-model".into(),
            base_url: self.llm.base_url(),
            api_key: None,
        };
        let agent = Arc::new(Agent::new(AgentParts {
            config: config.clone(),
            home: self.home.clone(),
            provider: talaria_llm::provider_for(&endpoint, &config.agent),
            store: store.clone(),
            registry: Arc::new(Registry::with_core_tools(&config)),
            interaction: Arc::new(NoHuman),
            redactor: Redactor::default(),
            workdir: self.dir.path().to_path_buf(),
        }));
        let mut settings = MatrixSettings::from_config(&config.section().unwrap(), &env).unwrap();
        settings.retry_base = Duration::from_millis(20);
        let cursors: Arc<dyn CursorStore> = store.clone();
        let adapter: Arc<dyn Adapter> = Arc::new(MatrixAdapter::new(settings, cursors).unwrap());
        let gateway = Gateway::new(GatewayParts {
            config,
            env,
            home: self.home.clone(),
            agent,
            store,
            adapters: vec![adapter],
            lock_dir: Some(self.dir.path().join("locks")),
            hooks: Arc::new(Hooks::load(&self.home)),
        });
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let task = tokio::spawn(async move { gateway.run(stop).await });
        self.running = Some((shutdown, task));
    }

    async fn stop(&mut self) {
        if let Some((shutdown, task)) = self.running.take() {
            shutdown.cancel();
            tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
        }
    }

    fn user_messages(&self, i: usize) -> Vec<String> {
        self.llm.requests()[i].body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "user")
            .map(|m| m["content"].as_str().unwrap_or("").to_owned())
            .collect()
    }

    async fn sent(&self, n: usize) -> Vec<Sent> {
        self.hs.wait_for_sent(n, WAIT).await
    }

    /// Gives the gateway a moment to do something it should not do.
    async fn settle(&self) {
        self.hs.wait_until_caught_up(WAIT).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    async fn wait_for_delivered(&self, n: u64) {
        let store = SqliteStore::open(&self.home.state_db()).unwrap();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let counts = store.obligation_counts().await.unwrap();
            if counts.get(&ObligationState::Delivered) == Some(&n) {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "{counts:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some((shutdown, _)) = &self.running {
            shutdown.cancel();
        }
    }
}

const ALLOW_ALICE: &[(&str, &str)] = &[("MATRIX_ALLOWED_USERS", ALICE)];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dm_turn_is_answered_as_a_reply_with_typing_first() {
    let rig = Rig::started(ALLOW_ALICE, |hs| {
        hs.create_dm(ALICE);
    })
    .await;
    let dm = "!dm-alice:localhost";
    rig.llm.push(Reply::text("Hello from **Talaria**."));
    let question = rig.hs.push_text(dm, ALICE, "hi there");
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].room_id, dm);
    assert_eq!(sent[0].body(), "Hello from **Talaria**.");
    assert_eq!(
        sent[0].html().as_deref(),
        Some("<p>Hello from <strong>Talaria</strong>.</p>")
    );
    assert_eq!(sent[0].in_reply_to(), Some(question));
    assert_eq!(rig.user_messages(0).last().unwrap(), "hi there");
    let typing = rig.hs.typing();
    assert!(
        typing.iter().any(|t| t.room_id == dm && t.typing),
        "{typing:?}"
    );
    assert!(typing[0].at <= sent[0].at, "typing comes before the answer");
    rig.wait_for_delivered(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_reply_lands_in_its_thread() {
    let room = "!team:localhost";
    let rig = Rig::started(ALLOW_ALICE, |hs| {
        hs.create_room(room, Some("Team"), &[ALICE, "@bob:localhost"]);
    })
    .await;
    let root = rig.hs.push_text(room, ALICE, "deploy thread");
    rig.llm.push(Reply::text("thread answer"));
    let asked = rig
        .hs
        .push_thread_text(room, ALICE, &root, "Talaria: is it done?");
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].room_id, room);
    assert_eq!(sent[0].body(), "thread answer");
    assert_eq!(sent[0].thread_root(), Some(root.clone()));
    assert_eq!(sent[0].in_reply_to(), Some(asked));
    // Shared rooms name the speaker before the text; the mention is gone.
    let asked_text = rig.user_messages(0).last().unwrap().clone();
    assert!(asked_text.ends_with("] is it done?"), "{asked_text}");

    // The main timeline is another conversation, and needs a mention.
    rig.hs.push_text(room, ALICE, "unrelated chatter");
    rig.llm.push(Reply::text("main answer"));
    rig.hs.push_text(room, ALICE, "Talaria, hello");
    let sent = rig.sent(2).await;
    assert_eq!(sent[1].body(), "main answer");
    assert_eq!(sent[1].thread_root(), None);
    let main = rig.user_messages(1);
    assert_eq!(main.len(), 1, "the thread's history is not here: {main:?}");
    assert!(main[0].ends_with("] hello"), "{main:?}");
    assert_eq!(rig.llm.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_answer_arrives_in_parts_that_reassemble() {
    let rig = Rig::started(ALLOW_ALICE, |hs| {
        hs.create_dm(ALICE);
    })
    .await;
    let mut answer = String::new();
    let mut i = 0;
    while answer.chars().count() < 40_000 {
        answer.push_str(&format!(
            "Paragraph {i}: the quick brown fox jumps over the lazy dog, again and again.\n\n"
        ));
        i += 1;
    }
    let answer = answer.trim_end().to_owned();
    rig.llm.push(Reply::text(answer.clone()));
    rig.hs
        .push_text("!dm-alice:localhost", ALICE, "write a lot");
    let first = rig.sent(1).await;
    let total: usize = first[0]
        .body()
        .rsplit_once(" (1/")
        .and_then(|(_, n)| n.trim_end_matches(')').parse().ok())
        .expect("the first part carries (1/n)");
    assert!(total >= 3, "{total} parts");
    let sent = rig.sent(total).await;
    let mut joined = String::new();
    for (i, part) in sent.iter().enumerate() {
        let body = part.body();
        assert!(body.chars().count() <= MAX_MESSAGE_LEN);
        assert!(part.content.to_string().len() <= MAX_EVENT_BYTES);
        assert!(part.html().is_some(), "ASCII parts keep their HTML");
        let suffix = format!(" ({}/{total})", i + 1);
        joined.push_str(body.strip_suffix(&suffix).expect("numbered part"));
    }
    assert_eq!(joined, answer);
    assert!(sent[0].in_reply_to().is_some());
    assert!(sent[1..].iter().all(|s| s.in_reply_to().is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_sync_loses_and_duplicates_nothing() {
    let rig = Rig::started(ALLOW_ALICE, |hs| {
        hs.create_dm(ALICE);
    })
    .await;
    rig.hs.drop_next_sync();
    rig.hs.fail_next_syncs(2);
    rig.llm.push(Reply::text("got it once"));
    rig.hs
        .push_text("!dm-alice:localhost", ALICE, "are you there?");
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].body(), "got it once");
    rig.settle().await;
    assert_eq!(rig.llm.requests().len(), 1);
    assert_eq!(rig.hs.sent().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_answer_waits_for_the_homeservers_hint() {
    let rig = Rig::started(ALLOW_ALICE, |hs| {
        hs.create_dm(ALICE);
    })
    .await;
    rig.hs.fail_next_send_with_429(400);
    rig.llm.push(Reply::text("after the wait"));
    rig.hs
        .push_text("!dm-alice:localhost", ALICE, "quick question");
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].body(), "after the wait");
    let attempts = rig.hs.send_attempts();
    assert_eq!(attempts.len(), 2, "one refused, one accepted");
    assert!(attempts[1].at - attempts[0].at >= Duration::from_millis(400));
    assert_eq!(attempts[0].path, attempts[1].path, "the same transaction");
    rig.wait_for_delivered(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_never_reach_the_model() {
    let room = "!team:localhost";
    let rig = Rig::started(ALLOW_ALICE, |hs| {
        hs.create_dm(MALLORY);
        hs.create_room(room, None, &[ALICE, MALLORY]);
    })
    .await;
    rig.hs
        .push_text("!dm-mallory:localhost", MALLORY, "let me in");
    rig.hs.push_text(room, MALLORY, "Talaria: do my bidding");
    // A stranger's invite is not even accepted.
    rig.hs.invite("!trap:localhost", MALLORY, true);
    rig.settle().await;
    assert!(rig.hs.sent().is_empty(), "{:?}", rig.hs.sent());
    assert!(rig.llm.requests().is_empty());
    assert!(rig.hs.joins().is_empty());

    rig.llm.push(Reply::text("Hi Alice."));
    rig.hs.push_text(room, ALICE, "Talaria: hi");
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].body(), "Hi Alice.");
    assert_eq!(rig.llm.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_delivered_event_never_starts_a_second_turn() {
    let rig = Rig::started(ALLOW_ALICE, |hs| {
        hs.create_dm(ALICE);
    })
    .await;
    let dm = "!dm-alice:localhost";
    let message = |id: &str| {
        json!({"type": "m.room.message", "event_id": id, "sender": ALICE,
               "content": {"msgtype": "m.text", "body": "only once"}})
    };
    rig.llm.push(Reply::text("First answer."));
    rig.hs.push_raw(dm, message("$fixed-1"));
    rig.sent(1).await;
    // The first turn is over (its answer recorded as delivered), so the
    // next message is not met by a busy notice.
    rig.wait_for_delivered(1).await;
    rig.hs.push_raw(dm, message("$fixed-1"));
    rig.llm.push(Reply::text("Second answer."));
    rig.hs.push_raw(dm, message("$fixed-2"));
    let sent = rig.sent(2).await;
    assert_eq!(sent[1].body(), "Second answer.");
    rig.settle().await;
    assert_eq!(rig.llm.requests().len(), 2);
    assert_eq!(rig.hs.sent().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resumes_from_the_saved_token() {
    let mut rig = Rig::started(ALLOW_ALICE, |hs| {
        hs.create_dm(ALICE);
    })
    .await;
    let dm = "!dm-alice:localhost";
    rig.llm.push(Reply::text("Noted, Ada."));
    rig.hs.push_text(dm, ALICE, "my name is Ada");
    rig.sent(1).await;
    rig.hs.wait_until_caught_up(WAIT).await;
    rig.stop().await;

    rig.hs.push_text(dm, ALICE, "who am I?");
    rig.llm.push(Reply::text("You are Ada."));
    rig.start();
    let sent = rig.sent(2).await;
    assert_eq!(sent[1].body(), "You are Ada.");
    rig.settle().await;
    assert_eq!(rig.llm.requests().len(), 2, "nothing was answered twice");
    assert_eq!(rig.user_messages(1), vec!["my name is Ada", "who am I?"]);
    let fresh = rig
        .hs
        .sync_calls()
        .iter()
        .filter(|c| c.since.is_none())
        .count();
    assert_eq!(fresh, 1, "the second gateway started from the saved token");
}
