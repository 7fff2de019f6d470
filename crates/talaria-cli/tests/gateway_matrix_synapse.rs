//! `talaria gateway run` as a real process against a real Synapse
//! homeserver (from the test Python environment) and the mock LLM: direct
//! chats across restarts, rooms joined on invite, and what the log says.
//!
//! The tests of this binary share one homeserver (starting one takes
//! seconds), each with its own bot account, users and rooms.

use crate::crash_support;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use talaria_store::{LedgerStore, ObligationState, SqliteStore};
use talaria_testkit::matrix_e2ee::EncryptingClient;
use talaria_testkit::synapse::{MatrixUser, Synapse, body};
use talaria_testkit::{MockOpenAi, Reply};

use crash_support::{Home, spawn_gateway};

/// Generous: Synapse is Python, and CI machines are shared.
const WAIT: Duration = Duration::from_secs(60);

/// What the adapter logged when it took a fresh join's history for lost
/// messages (issue 19, item 7).
const FALSE_GAP_WARNING: &str = "left out older messages";

fn home(llm: &MockOpenAi, hs: &Synapse, bot: &MatrixUser, allowed: &[&str]) -> Home {
    crash_support::home(
        llm,
        &format!(
            "  matrix:\n    homeserver: {}\n    sync_timeout_ms: 1000\n",
            hs.homeserver()
        ),
        &format!(
            "MATRIX_ACCESS_TOKEN={}\nMATRIX_ALLOWED_USERS={}\n",
            bot.access_token,
            allowed.join(",")
        ),
    )
}

/// One gateway run's log file.
fn log_of(home: &Home, run: usize) -> PathBuf {
    home.root.join(format!("test-gateway-{run}.log"))
}

/// Every run's log so far.
fn logs(home: &Home) -> String {
    (1..10)
        .map(|run| std::fs::read_to_string(log_of(home, run)).unwrap_or_default())
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n----\n")
}

/// Waits until the run's log has `line`: the gateway got that far.
async fn wait_for_log(log: &Path, line: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(line) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "waited {WAIT:?} for {line:?} in the log:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `n` replies were recorded as delivered, so a restart owes
/// nothing and sends nothing again.
async fn wait_for_delivered(home: &Home, n: u64) {
    let store = SqliteStore::open(&home.root.join("state.db")).unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let counts = store.obligation_counts().await.unwrap();
        if counts
            .get(&ObligationState::Delivered)
            .copied()
            .unwrap_or(0)
            >= n
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "waited {WAIT:?} for {n} delivered replies: {counts:?}\n{}",
            logs(home)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A gateway process, killed when a failed test unwinds.
struct Gateway(Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sigterm(child: &mut Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "the gateway's stop failed: {status:?}");
            return;
        }
        assert!(Instant::now() < deadline, "the gateway did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn sigkill(child: &mut Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The bodies of the bot's messages in `room`, once there are `n`.
async fn replies(user: &MatrixUser, room: &str, bot: &MatrixUser, n: usize) -> Vec<String> {
    user.wait_for_messages_from(room, &bot.user_id, n, WAIT)
        .await
        .iter()
        .map(|e| body(e).to_owned())
        .collect()
}

/// The user turns the model saw in its `i`th request.
fn user_turns(llm: &MockOpenAi, i: usize) -> Vec<String> {
    llm.requests()[i].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Issue 19, item 7: after a restart every direct chat was taken for a
/// group room (Synapse sends no member count in an ordinary sync, and the
/// invite's `is_direct` was only remembered in memory), so its messages
/// were skipped as "not addressed to the bot", and lost as the sync token
/// moved on. A two-member room made without `is_direct` was never a
/// direct chat at all. Both now hold across a SIGKILL and a plain stop,
/// including a message written while the gateway was down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_chats_are_answered_across_a_sigkill_and_a_plain_stop() {
    let hs = Synapse::shared();
    let bot = hs.register("dmbot").await;
    let alice = hs.register("dmalice").await;
    let llm = MockOpenAi::start().await;
    let home = home(&llm, hs, &bot, &[&alice.user_id]);

    let mut gateway = Gateway(spawn_gateway(&home, &log_of(&home, 1)));
    wait_for_log(&log_of(&home, 1), "first Matrix sync").await;
    // A DM as clients make it, and a plain two-member room.
    let dm = alice.create_room(&[&bot.user_id], true).await;
    let pair = alice.create_room(&[&bot.user_id], false).await;
    alice.wait_until_joined(&dm, &bot.user_id, WAIT).await;
    alice.wait_until_joined(&pair, &bot.user_id, WAIT).await;

    llm.push(Reply::text("Answer one."));
    alice.send_text(&dm, "hello").await;
    assert_eq!(replies(&alice, &dm, &bot, 1).await, ["Answer one."]);
    llm.push(Reply::text("Answer two."));
    alice.send_text(&pair, "are you there?").await;
    assert_eq!(
        replies(&alice, &pair, &bot, 1).await,
        ["Answer two."],
        "a two-member room is a direct chat: no mention needed\n{}",
        logs(&home)
    );
    wait_for_delivered(&home, 2).await;

    // A crash; a message arrives while nothing runs.
    sigkill(&mut gateway.0);
    alice.send_text(&dm, "written while you were down").await;
    llm.push(Reply::text("Answer three."));
    llm.push(Reply::text("Answer four."));
    let mut gateway = Gateway(spawn_gateway(&home, &log_of(&home, 2)));
    assert_eq!(
        replies(&alice, &dm, &bot, 2).await,
        ["Answer one.", "Answer three."],
        "{}",
        logs(&home)
    );
    alice.send_text(&pair, "and now?").await;
    assert_eq!(
        replies(&alice, &pair, &bot, 2).await,
        ["Answer two.", "Answer four."],
        "{}",
        logs(&home)
    );
    wait_for_delivered(&home, 4).await;

    // A plain stop, then a message after the next start.
    sigterm(&mut gateway.0);
    let mut gateway = Gateway(spawn_gateway(&home, &log_of(&home, 3)));
    wait_for_log(&log_of(&home, 3), "connected to the Matrix homeserver").await;
    llm.push(Reply::text("Answer five."));
    alice.send_text(&dm, "after the stop").await;
    assert_eq!(
        replies(&alice, &dm, &bot, 3).await,
        ["Answer one.", "Answer three.", "Answer five."],
        "{}",
        logs(&home)
    );
    wait_for_delivered(&home, 5).await;

    // Each question reached the model once, as a direct chat's history.
    assert_eq!(llm.requests().len(), 5, "{}", logs(&home));
    assert_eq!(
        user_turns(&llm, 4),
        ["hello", "written while you were down", "after the stop"]
    );
    let logged = logs(&home);
    assert!(!logged.contains(FALSE_GAP_WARNING), "{logged}");
    assert!(
        !logged.contains(&bot.access_token),
        "the token must not be logged"
    );
    sigterm(&mut gateway.0);
}

/// Issue 19, item 7: after joining a group on invite, the messages written
/// there before the invite were answered (Synapse hands a fresh join the
/// room's recent history), and the join logged a false "the homeserver left
/// out older messages" warning (Synapse marks a fresh join's timeline
/// limited). Now only what addresses the bot after the join is answered,
/// and the join logs no warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_joined_on_invite_answers_only_what_follows_the_join() {
    let hs = Synapse::shared();
    let bot = hs.register("groupbot").await;
    let alice = hs.register("groupalice").await;
    let bob = hs.register("groupbob").await;
    let llm = MockOpenAi::start().await;
    let home = home(&llm, hs, &bot, &[&alice.user_id, &bob.user_id]);

    let mut gateway = Gateway(spawn_gateway(&home, &log_of(&home, 1)));
    wait_for_log(&log_of(&home, 1), "first Matrix sync").await;
    let room = alice.create_room(&[&bob.user_id], false).await;
    bob.join(&room).await;
    // Talk from before the bot was there, some of it naming it.
    alice
        .send_text(
            &room,
            &format!("{}: what did I say yesterday?", bot.user_id),
        )
        .await;
    bob.send_text(&room, "lunch at noon").await;
    alice.invite(&room, &bot.user_id).await;
    alice.wait_until_joined(&room, &bot.user_id, WAIT).await;

    llm.push(Reply::text("Four."));
    alice
        .send_text(&room, &format!("{}: what is 2+2?", bot.user_id))
        .await;
    assert_eq!(replies(&alice, &room, &bot, 1).await, ["Four."]);
    wait_for_delivered(&home, 1).await;
    // A message nobody addressed to the bot, after the join: still not
    // answered; and once it was taken, nothing else was.
    bob.send_text(&room, "see you there").await;
    llm.push(Reply::text("Five."));
    alice
        .send_text(&room, &format!("{}: and 2+3?", bot.user_id))
        .await;
    assert_eq!(replies(&alice, &room, &bot, 2).await, ["Four.", "Five."]);
    wait_for_delivered(&home, 2).await;

    assert_eq!(llm.requests().len(), 2, "{}", logs(&home));
    // Group turns name their sender: "[name · id] text".
    let turns = user_turns(&llm, 1);
    assert_eq!(turns.len(), 2, "{turns:?}");
    assert!(turns[0].ends_with("] what is 2+2?"), "{turns:?}");
    assert!(turns[1].ends_with("] and 2+3?"), "{turns:?}");
    let logged = logs(&home);
    assert!(
        !logged.contains(FALSE_GAP_WARNING),
        "a fresh join is not a gap: {logged}"
    );
    sigterm(&mut gateway.0);
}

/// The events of `room` as the homeserver stores them (what anyone with
/// access to the server sees), oldest first.
async fn stored_events(user: &MatrixUser, room: &str) -> Vec<serde_json::Value> {
    let page = user
        .call(
            reqwest::Method::GET,
            &format!(
                "rooms/{}/messages?dir=b&limit=200",
                talaria_testkit::synapse::segment(room)
            ),
            None,
        )
        .await;
    let mut events = page["chunk"].as_array().cloned().unwrap_or_default();
    events.reverse();
    events
}

/// The fingerprint the gateway logged when encryption came on.
fn logged_fingerprint(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let line = text
        .lines()
        .find(|l| l.contains("Matrix end-to-end encryption is on"))
        .unwrap_or_else(|| panic!("encryption did not come on:\n{text}"));
    let start = line
        .find("fingerprint=")
        .unwrap_or_else(|| panic!("no fingerprint in {line:?}"))
        + "fingerprint=".len();
    line[start..]
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// Issue 29: most direct chats are end-to-end encrypted, and the adapter
/// ignored them. A real client that encrypts (matrix-nio: its own
/// protocol code in Python over vodozemac's bindings, where the bot runs
/// matrix-sdk-crypto) opens an encrypted direct
/// chat: the bot answers, the answer decrypts on the client, and the
/// homeserver holds only ciphertext. After a SIGKILL the bot has the same
/// device keys and goes on answering in the same room; an unencrypted
/// room beside it keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_direct_chat_is_answered_and_survives_a_sigkill() {
    let hs = Synapse::shared();
    let bot = hs.register("e2ebot").await;
    let alice = hs.register("e2ealice").await;
    let llm = MockOpenAi::start().await;
    let home = home(&llm, hs, &bot, &[&alice.user_id]);

    let mut gateway = Gateway(spawn_gateway(&home, &log_of(&home, 1)));
    wait_for_log(&log_of(&home, 1), "first Matrix sync").await;
    let fingerprint = logged_fingerprint(&log_of(&home, 1));

    let store = tempfile::tempdir().unwrap();
    let client = EncryptingClient::login(hs, "e2ealice", store.path()).await;
    let room = client.create_encrypted_room(&[&bot.user_id], true).await;
    client.wait_until_joined(&room, &bot.user_id, WAIT).await;

    llm.push(Reply::text("The secret answer."));
    client.send_text(&room, "a secret question").await;
    let answer = client.wait_for_message(&room, &bot.user_id, WAIT).await;
    assert!(
        answer.encrypted && answer.decrypted,
        "the answer must arrive encrypted and decrypt on the client: {answer:?}\n{}",
        logs(&home)
    );
    assert_eq!(answer.body, "The secret answer.");
    assert_eq!(user_turns(&llm, 0), ["a secret question"]);
    wait_for_delivered(&home, 1).await;

    // What the homeserver keeps is ciphertext, both ways.
    let stored = stored_events(&alice, &room).await;
    let messages: Vec<_> = stored
        .iter()
        .filter(|e| {
            matches!(
                e["type"].as_str(),
                Some("m.room.message" | "m.room.encrypted")
            )
        })
        .collect();
    assert!(messages.len() >= 2, "{stored:?}");
    assert!(
        messages.iter().all(|e| e["type"] == "m.room.encrypted"),
        "{messages:?}"
    );
    let text = serde_json::to_string(&stored).unwrap();
    assert!(!text.contains("secret question") && !text.contains("secret answer"));

    // The device's keys are in the home, private.
    let crypto = home.root.join("platforms/matrix/crypto");
    let devices: Vec<_> = std::fs::read_dir(&crypto).unwrap().flatten().collect();
    assert_eq!(devices.len(), 1, "one device, one store");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = devices[0].metadata().unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "the key store is private");
    }

    // A crash; the same device comes back with the same keys.
    sigkill(&mut gateway.0);
    let mut gateway = Gateway(spawn_gateway(&home, &log_of(&home, 2)));
    wait_for_log(&log_of(&home, 2), "connected to the Matrix homeserver").await;
    wait_for_log(&log_of(&home, 2), "Matrix end-to-end encryption is on").await;
    assert_eq!(logged_fingerprint(&log_of(&home, 2)), fingerprint);

    llm.push(Reply::text("Still here, still private."));
    client.send_text(&room, "are you still there?").await;
    let answer = client.wait_for_message(&room, &bot.user_id, WAIT).await;
    assert!(
        answer.encrypted && answer.decrypted,
        "{answer:?}\n{}",
        logs(&home)
    );
    assert_eq!(answer.body, "Still here, still private.");

    // An unencrypted direct chat beside it.
    let plain = alice.create_room(&[&bot.user_id], true).await;
    alice.wait_until_joined(&plain, &bot.user_id, WAIT).await;
    llm.push(Reply::text("Plain answer."));
    alice.send_text(&plain, "no secrets here").await;
    assert_eq!(replies(&alice, &plain, &bot, 1).await, ["Plain answer."]);
    wait_for_delivered(&home, 3).await;

    assert_eq!(llm.requests().len(), 3, "{}", logs(&home));
    assert_eq!(
        user_turns(&llm, 1),
        ["a secret question", "are you still there?"],
        "the encrypted chat keeps its history across the crash"
    );
    let logged = logs(&home);
    assert!(
        !logged.contains("cannot read an encrypted message"),
        "{logged}"
    );
    assert!(!logged.contains(&bot.access_token));
    sigterm(&mut gateway.0);
}

/// A home whose key store was deleted cannot take over the device: the
/// homeserver publishes other keys for it. `required` refuses to connect
/// and says what to do; `optional` (the default) goes on without
/// encryption, saying why, and plain rooms keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_key_store_is_refused_with_what_to_do() {
    let hs = Synapse::shared();
    let bot = hs.register("lostbot").await;
    let alice = hs.register("lostalice").await;
    let llm = MockOpenAi::start().await;
    let home = home(&llm, hs, &bot, &[&alice.user_id]);

    let mut gateway = Gateway(spawn_gateway(&home, &log_of(&home, 1)));
    wait_for_log(&log_of(&home, 1), "Matrix end-to-end encryption is on").await;
    wait_for_log(&log_of(&home, 1), "first Matrix sync").await;
    sigterm(&mut gateway.0);
    std::fs::remove_dir_all(home.root.join("platforms/matrix/crypto")).unwrap();

    let mut required = crash_support::gateway_command(&home, &log_of(&home, 2));
    required.env("MATRIX_E2EE_MODE", "required");
    let mut gateway = Gateway(required.spawn().unwrap());
    wait_for_log(&log_of(&home, 2), "holds other encryption keys").await;
    let text = std::fs::read_to_string(log_of(&home, 2)).unwrap();
    assert!(
        text.contains("Log in again for a new access token"),
        "{text}"
    );
    assert!(!text.contains("first Matrix sync"), "{text}");
    sigterm(&mut gateway.0);

    let mut gateway = Gateway(spawn_gateway(&home, &log_of(&home, 3)));
    wait_for_log(&log_of(&home, 3), "encrypted rooms are ignored").await;
    let plain = alice.create_room(&[&bot.user_id], true).await;
    alice.wait_until_joined(&plain, &bot.user_id, WAIT).await;
    llm.push(Reply::text("Plain works."));
    alice.send_text(&plain, "hello").await;
    assert_eq!(replies(&alice, &plain, &bot, 1).await, ["Plain works."]);
    sigterm(&mut gateway.0);
}

/// `device_trust: cross-signed`: a device its owner never signed
/// (the nio client has no cross-signing identity) is not read from, and
/// the log says why; nothing is verified behind the operator's back. The
/// same gateway still answers a plain room, after the refused message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_cross_signed_trust_an_unsigned_device_is_not_read() {
    let hs = Synapse::shared();
    let bot = hs.register("trustbot").await;
    let alice = hs.register("trustalice").await;
    let llm = MockOpenAi::start().await;
    let home = home(&llm, hs, &bot, &[&alice.user_id]);
    // In the configuration: `.env` values are redacted from the log.
    let config = home.root.join("config.yaml");
    let text = std::fs::read_to_string(&config).unwrap();
    let text = text.replace(
        "    sync_timeout_ms: 1000\n",
        "    sync_timeout_ms: 1000\n    device_trust: cross-signed\n",
    );
    assert!(text.contains("device_trust"));
    std::fs::write(&config, text).unwrap();

    let mut gateway = Gateway(spawn_gateway(&home, &log_of(&home, 1)));
    wait_for_log(&log_of(&home, 1), "first Matrix sync").await;
    let store = tempfile::tempdir().unwrap();
    let client = EncryptingClient::login(hs, "trustalice", store.path()).await;
    let room = client.create_encrypted_room(&[&bot.user_id], true).await;
    client.wait_until_joined(&room, &bot.user_id, WAIT).await;
    client.send_text(&room, "do you trust me?").await;
    wait_for_log(&log_of(&home, 1), "cannot read an encrypted message").await;
    let text = std::fs::read_to_string(log_of(&home, 1)).unwrap();
    assert!(
        text.contains("not trusted under device_trust: cross-signed"),
        "{text}"
    );

    let plain = alice.create_room(&[&bot.user_id], true).await;
    alice.wait_until_joined(&plain, &bot.user_id, WAIT).await;
    llm.push(Reply::text("Plain answer."));
    alice.send_text(&plain, "and here?").await;
    assert_eq!(replies(&alice, &plain, &bot, 1).await, ["Plain answer."]);
    assert_eq!(
        llm.requests().len(),
        1,
        "the unsigned device's message never reached the model"
    );
    assert_eq!(user_turns(&llm, 0), ["and here?"]);
    sigterm(&mut gateway.0);
}
