//! The gateway end to end with WhatsApp Cloud, in one process: the adapter
//! contract suite through the fake Graph API and Meta's signed deliveries
//! to the shared webhook listener, and what only WhatsApp does.
#![cfg(feature = "whatsapp")]

use crate::contract;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use contract::{AdapterKit, Rig, WAIT};
use talaria_core::{Config, Env};
use talaria_gateway::Adapter;
use talaria_platforms::registry::{Built, Setup};
use talaria_platforms::whatsapp::{WhatsappAdapter, WhatsappSettings};
use talaria_store::{LedgerStore, Obligation, ObligationState, SqliteStore};
use talaria_testkit::Reply;
use talaria_testkit::kit::whatsapp::{ADA, APP_SECRET, MALLORY, TOKEN, WhatsappKit};
use talaria_testkit::wait::wait_for;
use talaria_testkit::whatsapp::{MetaWebhook, signature};

impl AdapterKit for WhatsappKit {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        Arc::new(whatsapp_adapter(config, env))
    }

    fn build(&self, setup: &Setup<'_>) -> Built {
        let adapter = whatsapp_adapter(setup.config, setup.env);
        let mount = adapter.mount();
        Built {
            adapter: Arc::new(adapter),
            mount: Some(mount),
        }
    }
}

/// The adapter as the registry builds it, except that Graph's pauses
/// (seconds long) are not waited out in full.
fn whatsapp_adapter(config: &Config, env: &Env) -> WhatsappAdapter {
    let settings = WhatsappSettings::from_config(&config.section().unwrap(), env)
        .expect("the WhatsApp settings resolve")
        .expect("WhatsApp Cloud is on");
    let settings = WhatsappSettings {
        rate_limit_wait: Duration::from_millis(10),
        ..settings
    };
    WhatsappAdapter::new(settings).expect("the WhatsApp adapter")
}

adapter_contract!(WhatsappKit;
    run: dm_turn, long_answer_split, redelivery, rate_limit, unauthorized, media_in, media_out;
    skip: thread_reply => contract::Skip::Threadless,
          group_mention => contract::Skip::NoGroups,
          dropped_connection => contract::Skip::Connectionless);

/// Waits until some ledger row is in `state`; returns the open rows.
async fn wait_for_state(rig: &Rig<WhatsappKit>, state: ObligationState) -> Vec<Obligation> {
    let store = SqliteStore::open(&rig.home.state_db()).expect("the state database");
    wait_for(&format!("a {state:?} ledger row"), || async {
        let counts = store.obligation_counts().await.expect("ledger counts");
        if counts.contains_key(&state) {
            Ok(())
        } else {
            Err(counts)
        }
    })
    .await;
    store.open_obligations(0).await.expect("open obligations")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markdown_becomes_whatsapp_formatting_and_the_question_is_marked_read() {
    let rig = Rig::<WhatsappKit>::started(&[], |_| {}).await;
    rig.llm
        .push(Reply::text("Hello **Ada**, nice to meet you."));
    rig.kit
        .deliver(WhatsappKit::text_from(ADA, "wamid.HELLO1", "hi, I am Ada"));
    let sent = rig.kit.fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].body, "Hello *Ada*, nice to meet you.");
    assert_eq!(sent[0].context.as_deref(), Some("wamid.HELLO1"));
    let reads = rig.kit.fake.wait_for_reads(1, WAIT).await;
    assert_eq!(reads[0].message_id, "wamid.HELLO1");
    assert!(reads[0].typing);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strangers_message_is_not_even_marked_read() {
    let rig = Rig::<WhatsappKit>::started(&[], |_| {}).await;
    rig.kit
        .deliver(WhatsappKit::text_from(MALLORY, "wamid.M1", "let me in"));
    // Ada's message comes after Mallory's, so once it is answered the
    // runner has long decided about Mallory's.
    rig.llm.push(Reply::text("Welcome back."));
    rig.kit
        .deliver(WhatsappKit::text_from(ADA, "wamid.A1", "it's me"));
    rig.wait_for_text("Welcome back.").await;
    rig.wait_for_delivered(1).await;
    assert!(
        rig.kit
            .fake
            .reads()
            .iter()
            .all(|r| r.message_id != "wamid.M1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_signature_is_refused_with_401_and_nothing_runs() {
    let rig = Rig::<WhatsappKit>::started(&[], |_| {}).await;
    let meta = MetaWebhook::new(&rig.kit.base, APP_SECRET);
    let forged = WhatsappKit::text_from(ADA, "wamid.FORGED", "run this").to_string();
    let bytes = forged.as_bytes();
    let wrong = signature("someone-elses-secret", bytes);
    for sig in [Some(wrong.as_str()), None] {
        let answer = meta.post(bytes, sig).await;
        assert_eq!(answer.status, 401, "{sig:?}");
    }
    // The refusals were answered before anything was handed on; a real
    // message after them is the first and only turn.
    rig.llm.push(Reply::text("Only this one."));
    let real = WhatsappKit::text_from(ADA, "wamid.REAL", "hello");
    assert_eq!(meta.deliver(&real).await.status, 200);
    let sent = rig.kit.fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].body, "Only this one.");
    rig.wait_for_delivered(1).await;
    assert_eq!(rig.llm.requests().len(), 1);
    assert_eq!(
        rig.user_messages(0).last().map(String::as_str),
        Some("hello")
    );
    // The forged message was not even remembered: it can still come for
    // real (Meta's id is what the runner dedupes on).
    rig.llm.push(Reply::text("Now it counts."));
    let good = signature(APP_SECRET, bytes);
    assert_eq!(meta.post(bytes, Some(&good)).await.status, 200);
    rig.kit.fake.wait_for_sent(2, WAIT).await;
    assert_eq!(rig.llm.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_outside_the_24_hour_window_is_abandoned_and_logged() {
    capture_logs();
    const LATE: &str = "16505550024";
    let rig = Rig::<WhatsappKit>::started(&[("WHATSAPP_CLOUD_ALLOWED_USERS", LATE)], |_| {}).await;
    // The window closes while the answer is being worked on (or the
    // message was a day old when Meta finally delivered it).
    rig.kit.fake.close_window(LATE);
    rig.llm.push(Reply::text("Too late, I'm afraid."));
    rig.kit
        .deliver(WhatsappKit::text_from(LATE, "wamid.LATE", "are you there?"));
    // Refused for good: abandoned at once (the ledger's own tests check
    // the stored reason), so no sweep tries it again.
    let open = wait_for_state(&rig, ObligationState::Abandoned).await;
    assert!(open.iter().all(|o| o.chat_id != LATE), "{open:?}");
    assert!(rig.kit.fake.sent().is_empty());
    wait_for_log("the log to name the 24-hour window", |l| {
        l.contains("WARN")
            && l.contains("24-hour customer service window is closed")
            && l.contains("131047")
    })
    .await;
    // The delivery's own warning carries the refusal the ledger stored.
    wait_for_log("the delivery warning to say what to do", |l| {
        l.contains("could not deliver a reply")
            && l.contains("refused:")
            && l.contains("the user must write to the bot first")
            && l.contains("template")
    })
    .await;
    assert!(
        !captured_logs().contains(TOKEN) && !captured_logs().contains(APP_SECRET),
        "a secret was logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_keeps_the_reply_owed_and_says_what_to_fix() {
    capture_logs();
    const OWED: &str = "16505550190";
    let rig = Rig::<WhatsappKit>::started(&[("WHATSAPP_CLOUD_ALLOWED_USERS", OWED)], |_| {}).await;
    rig.kit.fake.expire_token();
    rig.llm.push(Reply::text("You will get this later."));
    rig.kit
        .deliver(WhatsappKit::text_from(OWED, "wamid.OWED", "hello?"));
    let open = wait_for_state(&rig, ObligationState::Failed).await;
    let row = open
        .iter()
        .find(|o| o.chat_id == OWED)
        .expect("the reply's ledger row");
    // Still open: the next gateway (started once the token is replaced)
    // sends it.
    assert!(row.state.is_open());
    let reason = row.last_error.as_deref().unwrap_or("");
    assert!(reason.contains("not reachable"), "{reason}");
    assert!(reason.contains("WHATSAPP_CLOUD_TOKEN"), "{reason}");
    wait_for_log("the log to say the token must be replaced", |l| {
        l.contains("ERROR") && l.contains("access token is invalid or expired")
    })
    .await;
    assert!(!captured_logs().contains(TOKEN), "the token was logged");
}

/// Waits until a captured log line satisfies `line`.
async fn wait_for_log(what: &str, line: impl Fn(&str) -> bool) {
    wait_for(what, || async {
        if captured_logs().lines().any(&line) {
            Ok(())
        } else {
            Err("not logged yet")
        }
    })
    .await;
}

/// Everything logged at info and above by this test binary, from the
/// first call on (a global subscriber: the gateway logs from its own
/// tasks, on any thread). Tests look for lines naming their own ids.
fn captured_logs() -> String {
    let buffer = log_buffer();
    let bytes = buffer.lock().unwrap_or_else(|p| p.into_inner()).clone();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Starts capturing logs (once per test binary).
fn capture_logs() {
    log_buffer();
}

fn log_buffer() -> Arc<Mutex<Vec<u8>>> {
    static BUFFER: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    BUFFER
        .get_or_init(|| {
            let buffer = Arc::new(Mutex::new(Vec::new()));
            let sink = buffer.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::INFO)
                .with_ansi(false)
                .with_writer(move || Sink(sink.clone()))
                .finish();
            // Another subscriber may already be global; then nothing is
            // captured and the assertions on logs say so.
            let _ = tracing::subscriber::set_global_default(subscriber);
            buffer
        })
        .clone()
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
