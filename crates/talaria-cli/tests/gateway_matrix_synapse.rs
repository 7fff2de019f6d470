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
