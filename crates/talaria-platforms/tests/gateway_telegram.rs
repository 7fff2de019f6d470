//! The gateway end to end, in one process: a fake Telegram Bot API server,
//! the mock LLM, a real SQLite file, and the real runner, ledger, router
//! and Telegram adapter between them.

use crate::contract;
use crate::gateway_support;

use std::sync::Arc;
use std::time::Duration;

use gateway_support::*;
use talaria_core::config::BusyInputMode;
use talaria_gateway::Adapter;
use talaria_gateway::pairing::Pairing;
use talaria_store::{LedgerStore, ObligationState, SqliteStore};
use talaria_testkit::Reply;
use talaria_testkit::kit::telegram::TelegramKit;

impl contract::AdapterKit for TelegramKit {
    fn adapter(&self, config: &talaria_core::Config, env: &talaria_core::Env) -> Arc<dyn Adapter> {
        telegram_adapter(config, env)
    }
}

adapter_contract!(TelegramKit;
    run: dm_turn, group_mention, thread_reply, long_answer_split, redelivery, rate_limit, unauthorized, media_in, media_out;
    skip: dropped_connection => contract::Skip::Connectionless);

fn has(sent: &[talaria_testkit::telegram::Sent], needle: &str) -> bool {
    sent.iter().any(|s| s.rendered().contains(needle))
}

/// Waits until the ledger shows `n` delivered rows: a row is marked just
/// after the platform accepted the message, so a test that saw the message
/// may look a moment too early.
async fn wait_for_delivered(rig: &Rig, n: u64) {
    let store = SqliteStore::open(&rig.home.state_db()).unwrap();
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

/// Waits until some sent message contains `needle`.
async fn wait_for_text(rig: &Rig, needle: &str) -> Vec<talaria_testkit::telegram::Sent> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let sent = rig.tg.sent();
        if has(&sent, needle) {
            return sent;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no message containing {needle:?}; sent: {:?}",
            sent.iter().map(|s| s.rendered()).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The pairing code in an offer.
fn code_in(offer: &str) -> String {
    offer
        .lines()
        .find_map(|l| l.strip_prefix("Your pairing code: "))
        .unwrap_or_else(|| panic!("no code in {offer:?}"))
        .trim_matches('`')
        .to_owned()
}

/// Waits for the first message sent to `chat`.
async fn wait_for_message_to(rig: &Rig, chat: i64) -> talaria_testkit::telegram::Sent {
    talaria_testkit::wait::wait_for(&format!("a message to {chat}"), || async {
        let sent = rig.tg.sent();
        match sent.iter().find(|s| s.chat_id == chat) {
            Some(s) => Ok(s.clone()),
            None => Err(sent.iter().map(|s| s.rendered()).collect::<Vec<_>>()),
        }
    })
    .await
}

/// Where nobody is allowed, [`Rig::barrier`]'s marker would be a
/// stranger's too: a new stranger writes instead, and the runner sends
/// them a pairing offer (or a refusal) while it takes their message,
/// after every update before it. Returns what they were sent.
async fn stranger_barrier(rig: &Rig, stranger: i64) -> talaria_testkit::telegram::Sent {
    rig.tg.wait_for_confirmed_updates(WAIT).await;
    rig.tg.push_private_text(stranger, "hello, anyone?");
    let offer = wait_for_message_to(rig, stranger).await;
    contract::assert_nothing_owed(&rig.home).await;
    offer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_general_topic_has_no_thread_id_and_topics_are_conversations_of_their_own() {
    let rig = Rig::started(&[("TELEGRAM_ALLOWED_USERS", "42")], |_| {}).await;
    rig.llm.push(Reply::text("topic answer"));
    rig.tg
        .push_group_text(-100500, 42, "in topic 17", Some(17), true);
    wait_for_text(&rig, "topic answer").await;

    // The General topic has no thread id on the wire.
    rig.llm.push(Reply::text("general answer"));
    rig.tg
        .push_group_text(-100500, 42, "in general", None, true);
    let sent = wait_for_text(&rig, "general answer").await;
    let reply = sent
        .iter()
        .find(|s| s.rendered() == "general answer")
        .unwrap();
    assert_eq!(reply.chat_id, -100500);
    assert_eq!(reply.thread_id, None);

    // Topics are separate conversations: topic 17's history is not in the
    // General topic's request.
    let general = rig.user_messages(1);
    assert!(
        !general.iter().any(|m| m.contains("in topic 17")),
        "{general:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_message_id_in_another_chat_is_another_message() {
    let rig = Rig::started(&[("TELEGRAM_ALLOWED_USERS", "42")], |_| {}).await;
    let message = |chat: i64, text: &str| {
        serde_json::json!({ "message": {
            "message_id": 777, "text": text,
            "chat": {"id": chat, "type": "private", "first_name": "U"},
            "from": {"id": 42, "is_bot": false, "first_name": "U"},
        }})
    };
    rig.llm.push(Reply::text("First answer."));
    rig.tg.push_update(message(42, "only once"));
    rig.sent(1).await;
    wait_for_delivered(&rig, 1).await;
    rig.llm.push(Reply::text("Second answer."));
    rig.tg.push_update(message(43, "hello from 43"));
    let sent = rig.sent(2).await;
    assert_eq!(sent[1].rendered(), "Second answer.");
    assert_eq!(sent[1].chat_id, 43);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_gets_one_code_and_gets_in_once_it_is_approved() {
    let rig = Rig::started(&[], |_| {}).await;
    rig.tg.push_private_text(7, "hello?");
    let sent = rig.sent(1).await;
    let code = code_in(&sent[0].rendered());
    assert_eq!(code.len(), 8);
    assert!(
        code.bytes()
            .all(|b| talaria_gateway::pairing::CODE_ALPHABET.contains(&b))
    );

    // A second message within ten minutes gets nothing.
    rig.tg.push_private_text(7, "hello??");
    stranger_barrier(&rig, 9).await;
    let sent = rig.tg.sent();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(sent[1].chat_id, 9);
    assert!(rig.llm.requests().is_empty());

    // Strangers in groups are never offered a code.
    rig.tg.push_group_text(-100500, 8, "hi all", None, false);
    stranger_barrier(&rig, 10).await;
    let sent = rig.tg.sent();
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert_eq!(sent[2].chat_id, 10);
    assert!(rig.llm.requests().is_empty());

    let store = Arc::new(SqliteStore::open(&rig.home.state_db()).unwrap());
    let outcome = Pairing::new(store)
        .approve("telegram", &code.to_lowercase())
        .await
        .unwrap();
    assert!(
        matches!(outcome, talaria_store::ApproveOutcome::Approved(_)),
        "{outcome:?}"
    );

    rig.llm.push(Reply::text("Nice to meet you."));
    rig.tg.push_private_text(7, "approved now?");
    wait_for_text(&rig, "Nice to meet you.").await;
}

/// The code's reply carries the stranger's numeric id (what an allowlist
/// takes); an approval made while no gateway runs is told to the user in
/// their chat when the gateway next starts, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_made_while_the_gateway_is_down_is_told_when_it_starts() {
    let mut rig = Rig::started(&[], |_| {}).await;
    rig.tg.push_private_text(7001, "hello?");
    let sent = rig.sent(1).await;
    let offer = sent[0].rendered();
    assert!(offer.contains("Your telegram user id: 7001"), "{offer:?}");
    assert!(offer.contains("TELEGRAM_ALLOWED_USERS"), "{offer:?}");
    let code = code_in(&offer);
    rig.stop().await;

    let store = Arc::new(SqliteStore::open(&rig.home.state_db()).unwrap());
    let outcome = Pairing::new(store)
        .approve("telegram", &code)
        .await
        .unwrap();
    assert!(
        matches!(outcome, talaria_store::ApproveOutcome::Approved(_)),
        "{outcome:?}"
    );
    assert_eq!(rig.tg.sent().len(), 1, "nobody runs to tell them yet");

    rig.start();
    let sent = wait_for_text(&rig, "You have been approved").await;
    let notice = sent
        .iter()
        .find(|s| s.rendered().contains("You have been approved"))
        .unwrap();
    assert_eq!(notice.chat_id, 7001);
    // Told once, however many maintenance runs pass. Two more users are
    // approved, each once the one before was told: the run that tells
    // the last began after the run that told the one before had ended,
    // and that run, a later one than the run that told 7001, would have
    // told 7001 again.
    for user in [7002, 7003] {
        rig.tg.push_private_text(user, "me too?");
        let code = code_in(&wait_for_message_to(&rig, user).await.rendered());
        let store = Arc::new(SqliteStore::open(&rig.home.state_db()).unwrap());
        let outcome = Pairing::new(store)
            .approve("telegram", &code)
            .await
            .unwrap();
        assert!(
            matches!(outcome, talaria_store::ApproveOutcome::Approved(_)),
            "{outcome:?}"
        );
        talaria_testkit::wait::wait_for(&format!("{user} told"), || async {
            let told = rig
                .tg
                .sent()
                .iter()
                .any(|s| s.chat_id == user && s.rendered().contains("You have been approved"));
            if told {
                Ok(())
            } else {
                Err(rig.tg.sent().len())
            }
        })
        .await;
    }
    let notices = rig
        .tg
        .sent()
        .iter()
        .filter(|s| s.chat_id == 7001 && s.rendered().contains("You have been approved"))
        .count();
    assert_eq!(notices, 1);

    rig.llm.push(Reply::text("Glad you're here."));
    rig.tg.push_private_text(7001, "so I'm in?");
    wait_for_text(&rig, "Glad you're here.").await;
}

/// Waits until the last edit of the first sent message renders as `text`.
async fn wait_for_final_edit(rig: &Rig, text: &str) -> Vec<talaria_testkit::telegram::Edit> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let edits = rig.tg.edits();
        if edits.last().is_some_and(|e| e.rendered() == text) {
            return edits;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the preview never became {text:?}; edits: {:?}",
            edits.iter().map(|e| e.rendered()).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_edits_grow_one_message_into_the_answer() {
    let rig = Rig::started(&[("TELEGRAM_ALLOWED_USERS", "42")], |c| {
        c.platforms.set("telegram.streaming_edits", true);
        c.gateway.stream_edit_interval_ms = 100;
    })
    .await;
    let answer = "Streaming makes long answers feel fast, one piece at a time.";
    rig.llm
        .push(Reply::text(answer).with_chunk_pause(Duration::from_millis(300)));
    rig.tg.push_private_text(42, "tell me something");
    let edits = wait_for_final_edit(&rig, answer).await;
    let sent = rig.tg.sent();
    assert_eq!(sent.len(), 1, "one message, edited: {sent:?}");
    let preview = sent[0].rendered();
    assert!(
        preview.ends_with('▍') && answer.starts_with(preview.trim_end_matches(" ▍")),
        "the first send is a growing prefix: {preview:?}"
    );
    assert!(sent[0].reply_to.is_some());
    assert!(edits.iter().all(|e| e.message_id == sent[0].message_id));
    assert!(
        edits.len() >= 2,
        "the text grew in steps: {:?}",
        edits.iter().map(|e| e.rendered()).collect::<Vec<_>>()
    );
    // The final answer went through the ledger like any other.
    wait_for_delivered(&rig, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_preview_says_so_and_the_new_message_is_answered() {
    let rig = Rig::started(&[("TELEGRAM_ALLOWED_USERS", "42")], |c| {
        c.platforms.set("telegram.streaming_edits", true);
        c.gateway.stream_edit_interval_ms = 100;
        c.gateway.busy_ack = false;
    })
    .await;
    rig.llm
        .push(Reply::text("This answer never finishes because").stall_after(1));
    rig.llm.push(Reply::text("Second answer."));
    rig.tg.push_private_text(42, "first");
    rig.sent(1).await;
    rig.tg.push_private_text(42, "second");
    // The new answer is previewed too, and finished by an edit.
    let edits = wait_for_final_edit(&rig, "Second answer.").await;
    let first = rig.tg.sent()[0].clone();
    assert!(
        edits
            .iter()
            .any(|e| e.message_id == first.message_id && e.rendered().contains("Stopped before")),
        "{:?}",
        edits.iter().map(|e| e.rendered()).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_streaming_edits_nothing_is_edited() {
    let rig = Rig::started(&[("TELEGRAM_ALLOWED_USERS", "42")], |_| {}).await;
    rig.llm.push(
        Reply::text("Sent whole, once it is done.").with_chunk_pause(Duration::from_millis(50)),
    );
    rig.tg.push_private_text(42, "hello");
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].rendered(), "Sent whole, once it is done.");
    assert!(rig.tg.edits().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_are_answered_without_the_model() {
    let rig = Rig::started(&[("TELEGRAM_ALLOWED_USERS", "42")], |_| {}).await;
    rig.tg.push_private_text(42, "/status");
    rig.tg.push_private_text(42, "/frobnicate now");
    rig.tg.push_private_text(42, "/help@talaria_test_bot");
    let sent = rig.sent(3).await;
    let texts: Vec<String> = sent.iter().map(|s| s.rendered()).collect();
    assert!(
        texts
            .iter()
            .any(|t| t.contains("Idle") && t.contains("Model: test-model")),
        "{texts:?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.contains("Unknown command /frobnicate") && t.contains("/help")),
        "{texts:?}"
    );
    assert!(texts.iter().any(|t| t.contains("/queue")), "{texts:?}");
    rig.barrier().await;
    assert_eq!(
        rig.llm.requests().len(),
        1,
        "commands never call the model: only the marker did"
    );
    // A path is not a command: it goes to the model.
    rig.llm.push(Reply::text("That is a path."));
    rig.tg.push_private_text(42, "/usr/bin/ls");
    wait_for_text(&rig, "That is a path.").await;
    assert_eq!(rig.user_messages(1).last().unwrap(), "/usr/bin/ls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skill_name_as_a_command_loads_the_skill_for_the_turn() {
    let rig = Rig::started(&[("TELEGRAM_ALLOWED_USERS", "42")], |_| {}).await;
    rig.llm.push(Reply::text("Disks are fine."));
    rig.tg
        .push_private_text(42, "/system_health only the disks");
    wait_for_text(&rig, "Disks are fine.").await;
    let asked = rig.user_messages(0).last().unwrap().clone();
    assert!(asked.contains("\"system-health\" skill"), "{asked}");
    assert!(asked.contains("df -hP"), "{asked}");
    assert!(asked.ends_with("only the disks"), "{asked}");

    // /skills lists them without the model; /learn starts a turn that
    // asks for a new skill.
    rig.tg.push_private_text(42, "/skills");
    let sent = wait_for_text(&rig, "/systematic-debugging").await;
    let listing = sent.last().unwrap().rendered();
    assert!(listing.contains("/learn"), "{listing}");
    rig.llm.push(Reply::text("Learned it."));
    rig.tg.push_private_text(42, "/learn rotating nginx logs");
    wait_for_text(&rig, "Learned it.").await;
    let asked = rig.user_messages(1).last().unwrap().clone();
    assert!(
        asked.contains("learn a skill: rotating nginx logs"),
        "{asked}"
    );
    assert_eq!(rig.llm.requests().len(), 2, "/skills made no model call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_starts_afresh_and_a_restart_continues_the_conversation() {
    let mut rig = Rig::started(&[("TELEGRAM_ALLOWED_USERS", "42")], |_| {}).await;
    rig.llm.push(Reply::text("Noted, Ada."));
    rig.tg.push_private_text(42, "my name is Ada");
    wait_for_text(&rig, "Noted, Ada.").await;

    // A restart: a new gateway over the same home continues the session.
    rig.stop().await;
    rig.start();
    rig.wait_until_polling().await;
    rig.llm.push(Reply::text("You are Ada."));
    rig.tg.push_private_text(42, "who am I?");
    wait_for_text(&rig, "You are Ada.").await;
    assert_eq!(rig.user_messages(1), vec!["my name is Ada", "who am I?"]);

    // /new clears it at once, without a confirmation.
    rig.tg.push_private_text(42, "/new");
    wait_for_text(&rig, "new conversation").await;
    rig.llm.push(Reply::text("I don't know."));
    rig.tg.push_private_text(42, "who am I now?");
    wait_for_text(&rig, "I don't know.").await;
    assert_eq!(rig.user_messages(2), vec!["who am I now?"]);

    // The old conversation is kept and can be resumed. The answer is on
    // screen a moment before its turn has settled, and a command that
    // would race the turn is refused meanwhile: ask again after such a
    // refusal, as a user would.
    for attempt in 1.. {
        let seen = rig.tg.sent().len();
        rig.tg.push_private_text(42, "/resume");
        let sent = rig.tg.wait_for_sent(seen + 1, WAIT).await;
        let answer = sent[seen].rendered();
        if answer.contains("Resumed") {
            break;
        }
        assert!(
            answer.contains("A turn is running") && attempt < 20,
            "{answer:?}"
        );
        // Pacing, as a user would take a moment before asking again.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    rig.llm.push(Reply::text("Ada again."));
    rig.tg.push_private_text(42, "and now?");
    wait_for_text(&rig, "Ada again.").await;
    assert_eq!(
        rig.user_messages(3),
        vec!["my name is Ada", "who am I?", "and now?"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_during_a_slow_turn_interrupts_it_and_the_stale_answer_is_dropped() {
    let rig = Rig::started(&[("TELEGRAM_ALLOWED_USERS", "42")], |_| {}).await;
    // The first call would take far longer than the test waits.
    rig.llm
        .push(Reply::text("STALE ANSWER").with_delay(Duration::from_secs(60)));
    rig.llm.push(Reply::text("fresh answer"));
    rig.tg.push_private_text(42, "first question");
    rig.llm_requests(1).await;
    rig.tg.push_private_text(42, "actually, second question");
    let sent = wait_for_text(&rig, "fresh answer").await;
    assert!(has(&sent, "Interrupting"), "the user is told");
    assert_eq!(
        rig.user_messages(1).last().unwrap(),
        "actually, second question"
    );
    // A chat runs one turn at a time, and the interrupted one holds it
    // until it has unwound: by the fresh answer, a stale one would have
    // been stored and sent. The marker follows in the same chat.
    rig.barrier().await;
    assert!(!has(&rig.tg.sent(), "STALE ANSWER"));
    let store = SqliteStore::open(&rig.home.state_db()).unwrap();
    let counts = store.obligation_counts().await.unwrap();
    assert_eq!(
        counts.values().sum::<u64>(),
        2,
        "the fresh answer and the marker's, nothing else: {counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_mode_merges_follow_ups_into_the_next_turn() {
    let rig = Rig::started(&[("TELEGRAM_ALLOWED_USERS", "42")], |c| {
        c.gateway.busy_input_mode = BusyInputMode::Queue;
    })
    .await;
    rig.llm
        .push(Reply::text("first answer").with_delay(Duration::from_millis(1500)));
    rig.llm.push(Reply::text("merged answer"));
    rig.tg.push_private_text(42, "one");
    rig.llm_requests(1).await;
    rig.tg.push_private_text(42, "two");
    rig.tg.push_private_text(42, "three");
    let sent = wait_for_text(&rig, "merged answer").await;
    assert!(has(&sent, "first answer"), "queue mode does not interrupt");
    assert!(has(&sent, "queued"), "the user is told");
    assert_eq!(rig.llm.requests().len(), 2);
    assert_eq!(rig.user_messages(1).last().unwrap(), "two\nthree");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_interrupts_and_queue_runs_items_as_their_own_turns() {
    let rig = Rig::started(&[("TELEGRAM_ALLOWED_USERS", "42")], |_| {}).await;
    rig.llm
        .push(Reply::text("NEVER").with_delay(Duration::from_secs(60)));
    rig.tg.push_private_text(42, "slow one");
    rig.llm_requests(1).await;
    rig.tg.push_private_text(42, "/stop");
    wait_for_text(&rig, "Stopped").await;

    rig.llm
        .push(Reply::text("answer a").with_delay(Duration::from_millis(800)));
    rig.llm.push(Reply::text("answer b"));
    rig.llm.push(Reply::text("answer c"));
    rig.tg.push_private_text(42, "a");
    rig.llm_requests(2).await;
    rig.tg.push_private_text(42, "/queue b");
    rig.tg.push_private_text(42, "/queue c");
    let sent = wait_for_text(&rig, "answer c").await;
    assert!(has(&sent, "Queued for the next turn."));
    assert!(has(&sent, "(2 queued)"));
    assert!(has(&sent, "answer a") && has(&sent, "answer b"));
    assert!(!has(&sent, "NEVER"));
    assert_eq!(rig.user_messages(2).last().unwrap(), "b");
    assert_eq!(rig.user_messages(3).last().unwrap(), "c");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_busy_notice_comes_once_per_cooldown_even_when_the_lane_empties_between() {
    let rig = Rig::started(&[("TELEGRAM_ALLOWED_USERS", "42")], |c| {
        c.gateway.busy_input_mode = BusyInputMode::Queue;
    })
    .await;
    for round in 0..3 {
        rig.llm
            .push(Reply::text(format!("answer {round}")).with_delay(Duration::from_millis(600)));
        rig.llm.push(Reply::text(format!("follow-up {round}")));
        rig.tg.push_private_text(42, &format!("question {round}"));
        rig.llm_requests(round * 2 + 1).await;
        rig.tg.push_private_text(42, &format!("and also {round}"));
        wait_for_text(&rig, &format!("follow-up {round}")).await;
        // The lane is gone once both answers are out.
        wait_for_delivered(&rig, (round * 2 + 2) as u64).await;
    }
    let notices = rig
        .tg
        .sent()
        .iter()
        .filter(|s| s.rendered().contains("Still working"))
        .count();
    assert_eq!(notices, 1, "three busy chats within seconds, one notice");
}

/// A burst in interrupt mode: each message used to interrupt the turn the
/// one before it had just started, one model call per message. The turn
/// after an interruption now waits for the burst to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_in_interrupt_mode_becomes_a_few_turns_not_one_per_message() {
    const BURST: usize = 40;
    let rig = Rig::started(&[("TELEGRAM_ALLOWED_USERS", "42")], |c| {
        c.gateway.busy_ack = false;
    })
    .await;
    for _ in 0..BURST {
        rig.llm
            .push(Reply::text("burst answer").with_delay(Duration::from_millis(100)));
    }
    for i in 0..BURST {
        rig.tg.push_private_text(42, &format!("part {i}"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_for_text(&rig, "burst answer").await;
    rig.barrier().await;
    // The marker's call is the last: every turn of the burst was answered
    // (nothing is owed) and so had made its call before.
    let mut requests = rig.llm.requests();
    requests.pop();
    assert!(
        requests.len() <= 4,
        "{} model calls for a burst of {BURST} messages",
        requests.len()
    );
    let answers = rig
        .tg
        .sent()
        .iter()
        .filter(|s| s.rendered() == "burst answer")
        .count();
    assert_eq!(answers, 1);
    // Nothing was lost on the way: every part is in what the model saw.
    let seen: String = requests.last().unwrap().body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect::<Vec<_>>()
        .join("\n");
    for i in 0..BURST {
        assert!(
            seen.lines().any(|l| l == format!("part {i}")),
            "part {i} missing from {seen:?}"
        );
    }
}

/// The gateway's maintenance forgets the files users sent once they are
/// `media.retention_days` old, and keeps the rest (and anything in the
/// media folder that is not the cache's own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_media_files_are_swept_by_the_gateways_maintenance() {
    let mut rig = contract::Rig::<TelegramKit>::new(&[], |c| c.media.retention_days = 3).await;
    let media = rig.home.media_dir();
    std::fs::create_dir_all(&media).unwrap();
    let aged = |name: &str, days: u64| {
        let path = media.join(name);
        std::fs::write(&path, b"bytes").unwrap();
        let file = std::fs::File::options().write(true).open(&path).unwrap();
        let when = std::time::SystemTime::now() - Duration::from_secs(days * 24 * 3600);
        file.set_modified(when).unwrap();
        path
    };
    let old = aged(&format!("{}.png", "a".repeat(64)), 4);
    let recent = aged(&format!("{}.png", "b".repeat(64)), 2);
    let foreign = aged("notes.txt", 30);
    rig.start();
    talaria_testkit::wait::wait_for("the old file to be swept", || async {
        if old.exists() {
            Err(old.clone())
        } else {
            Ok(())
        }
    })
    .await;
    assert!(recent.exists());
    assert!(foreign.exists());
    rig.stop().await;
}

/// Media end to end through the fake Bot API: files fetched with
/// `getFile`, what the model gets, and files sent back as uploads.
mod media {
    use std::time::Duration;

    use base64::Engine as _;
    use talaria_core::config::{ModelConfig, SttProvider, TtsProvider, VisionMode, VoiceReply};
    use talaria_testkit::Reply;
    use talaria_testkit::kit::telegram::TelegramKit;
    use talaria_testkit::openai_media::{FakeOpenAiMedia, MediaReply};
    use talaria_testkit::telegram::FileKind;

    use talaria_testkit::kit::PlatformKit as _;

    use super::contract::Rig;
    // The contract's media fixtures and readings, shared.
    use super::contract::scenarios::media::{last_user, pdf, text_of, voice};

    const FRIEND: i64 = 42;

    /// A PNG of `w`×`h` with some detail, as a phone would send.
    fn png(w: u32, h: u32) -> Vec<u8> {
        let img = image::RgbImage::from_fn(w, h, |x, y| {
            image::Rgb([(x % 251) as u8, (y % 241) as u8, 90])
        });
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, image::ImageFormat::Png).unwrap();
        out.into_inner()
    }

    /// PNG's chunk checksum (CRC-32, as in zlib).
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    fn cached_files(rig: &Rig<TelegramKit>) -> Vec<std::path::PathBuf> {
        match std::fs::read_dir(rig.home.media_dir()) {
            Ok(dir) => dir.map(|e| e.unwrap().path()).collect(),
            Err(_) => Vec::new(),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_photo_reaches_a_vision_model_as_a_downscaled_image_part() {
        let rig = Rig::<TelegramKit>::started(&[], |c| c.model.vision = VisionMode::On).await;
        let fake = &rig.kit.fake;
        let id = fake.add_file(png(3000, 2000), None, None);
        rig.llm.push(Reply::text("A striped picture."));
        fake.push_private_file(FRIEND, FileKind::Photo, &id, Some("what is this?"));
        rig.wait_for_text("A striped picture.").await;
        let user = last_user(&rig, 0);
        assert!(text_of(&user).contains("what is this?"), "{user}");
        let url = user["content"]
            .as_array()
            .and_then(|parts| parts.iter().find(|p| p["type"] == "image_url"))
            .and_then(|p| p["image_url"]["url"].as_str())
            .unwrap_or_else(|| panic!("no image part: {user}"))
            .to_owned();
        let data = url.strip_prefix("data:image/jpeg;base64,").unwrap();
        let jpeg = base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap();
        let seen = image::load_from_memory(&jpeg).unwrap();
        assert_eq!((seen.width(), seen.height()), (1568, 1045));
        // The transcript keeps a reference, never the bytes.
        let db = std::fs::read(rig.home.state_db()).unwrap();
        assert!(
            !db.windows(data.len().min(64))
                .any(|w| w == &data.as_bytes()[..64])
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_vision_the_auxiliary_model_describes_the_photo() {
        let aux = talaria_testkit::MockOpenAi::start().await;
        let aux_url = aux.base_url();
        let rig = Rig::<TelegramKit>::started(&[], |c| {
            c.model.vision = VisionMode::Off;
            c.media.describe_images = true;
            c.auxiliary.vision = Some(ModelConfig {
                default: Some("looker".into()),
                base_url: Some(aux_url),
                ..ModelConfig::default()
            });
        })
        .await;
        aux.push(Reply::text("a grid of coloured stripes"));
        rig.llm.push(Reply::text("Stripes, it seems."));
        let id = rig.kit.fake.add_file(png(64, 48), None, None);
        rig.kit
            .fake
            .push_private_file(FRIEND, FileKind::Photo, &id, None);
        rig.wait_for_text("Stripes, it seems.").await;
        let user = last_user(&rig, 0);
        assert!(
            user["content"].is_string(),
            "no image part for a blind model: {user}"
        );
        assert!(
            text_of(&user).contains("described by a vision model: a grid of coloured stripes"),
            "{user}"
        );
        let looked = &aux.requests()[0].body;
        assert!(looked.to_string().contains("data:image/"), "{looked}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_voice_note_is_transcribed_echoed_and_answered() {
        let stt = FakeOpenAiMedia::start().await;
        let stt_url = stt.base_url();
        let rig = Rig::<TelegramKit>::started(&[], |c| {
            c.stt.provider = Some(SttProvider::Openai);
            c.stt.base_url = Some(stt_url);
            c.stt.api_key = Some(talaria_core::Secret::new("sk-stt-test"));
            c.stt.echo_transcript = true;
        })
        .await;
        stt.push(MediaReply::transcript("turn on the kitchen lights"));
        rig.llm.push(Reply::text("Lights are on."));
        let voice = voice().bytes;
        let id = rig
            .kit
            .fake
            .add_file(voice.clone(), None, Some("audio/ogg"));
        rig.kit
            .fake
            .push_private_file(FRIEND, FileKind::Voice, &id, None);
        rig.wait_for_text("Lights are on.").await;
        rig.wait_for_text("turn on the kitchen lights").await;
        let user = text_of(&last_user(&rig, 0));
        assert!(
            user.contains("[transcript of a voice note]: turn on the kitchen lights"),
            "{user}"
        );
        let heard = &stt.requests()[0];
        assert_eq!(heard.field("model"), Some("whisper-1"));
        assert_eq!(heard.file.as_ref().map(|f| f.len), Some(voice.len()));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_transcription_is_said_not_swallowed() {
        let stt = FakeOpenAiMedia::start().await;
        let stt_url = stt.base_url();
        let rig = Rig::<TelegramKit>::started(&[], |c| {
            c.stt.provider = Some(SttProvider::Openai);
            c.stt.base_url = Some(stt_url);
            c.stt.api_key = Some(talaria_core::Secret::new("sk-stt-test"));
        })
        .await;
        stt.push(MediaReply::error(500, "model overloaded", "server_error"));
        rig.llm.push(Reply::text("Sorry, I could not hear that."));
        let id = rig
            .kit
            .fake
            .add_file(voice().bytes, None, Some("audio/ogg"));
        rig.kit
            .fake
            .push_private_file(FRIEND, FileKind::Voice, &id, None);
        rig.wait_for_text("could not transcribe your voice note")
            .await;
        rig.wait_for_text("Sorry, I could not hear that.").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pdfs_text_reaches_the_model_and_a_broken_one_is_said_unreadable() {
        let rig = Rig::<TelegramKit>::started(&[], |_| {}).await;
        let fake = &rig.kit.fake;
        rig.llm.push(Reply::text("Revenue grew."));
        let id = fake.add_file(
            pdf("Quarterly revenue grew twelve percent"),
            Some("q3.pdf"),
            Some("application/pdf"),
        );
        fake.push_private_file(FRIEND, FileKind::Document, &id, Some("summarise"));
        rig.wait_for_text("Revenue grew.").await;
        let user = text_of(&last_user(&rig, 0));
        assert!(
            user.contains("Quarterly revenue grew twelve percent"),
            "{user}"
        );
        assert!(user.contains("q3.pdf"), "{user}");

        rig.llm.push(Reply::text("That file is damaged."));
        let id = fake.add_file(
            b"%PDF-1.7\n1 0 obj <<garbage".to_vec(),
            Some("broken.pdf"),
            Some("application/pdf"),
        );
        fake.push_private_file(FRIEND, FileKind::Document, &id, None);
        rig.wait_for_text("That file is damaged.").await;
        let user = text_of(&last_user(&rig, 1));
        assert!(
            user.contains("broken.pdf") && user.contains("cannot be read"),
            "{user}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bad_files_get_clear_answers_and_leave_nothing_behind() {
        let rig = Rig::<TelegramKit>::started(&[], |c| c.model.vision = VisionMode::On).await;
        let fake = &rig.kit.fake;

        // 25 MB: refused from Telegram's own size claim, never fetched.
        rig.llm.push(Reply::text("noted the big one"));
        let big = fake.add_file(vec![7u8; 25 * 1024 * 1024], Some("big.bin"), None);
        fake.push_private_file(FRIEND, FileKind::Document, &big, None);
        rig.wait_for_text("it is 25 MB, and the limit is 20 MB")
            .await;
        rig.wait_for_text("noted the big one").await;
        assert!(fake.downloads().is_empty(), "{:?}", fake.downloads());
        assert!(cached_files(&rig).is_empty(), "{:?}", cached_files(&rig));

        // A decompression bomb: 50,000 × 50,000 pixels in a small file.
        rig.llm.push(Reply::text("noted the bomb"));
        let mut bomb = png(1, 1);
        bomb[16..20].copy_from_slice(&50_000u32.to_be_bytes());
        bomb[20..24].copy_from_slice(&50_000u32.to_be_bytes());
        // The header's checksum made right, so only the size is wrong.
        let crc = crc32(&bomb[12..29]);
        bomb[29..33].copy_from_slice(&crc.to_be_bytes());
        let id = fake.add_file(bomb, None, None);
        fake.push_private_file(FRIEND, FileKind::Photo, &id, None);
        rig.wait_for_text("too large to open").await;
        rig.wait_for_text("noted the bomb").await;

        // A "photo" that is a program.
        rig.llm.push(Reply::text("noted the program"));
        let mut elf = b"\x7fELF\x02\x01\x01\0".to_vec();
        elf.extend_from_slice(&[0u8; 120]);
        let id = fake.add_file(elf, Some("cat.jpg"), Some("image/jpeg"));
        fake.push_private_file(FRIEND, FileKind::Photo, &id, None);
        rig.wait_for_text("is not an image").await;
        rig.wait_for_text("noted the program").await;
        let leftovers: Vec<_> = cached_files(&rig)
            .into_iter()
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "half-written files: {leftovers:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn media_lines_become_uploads_of_the_right_kind_and_outside_paths_are_refused() {
        let rig = Rig::<TelegramKit>::started(&[], |_| {}).await;
        let work = rig.dir.path();
        let chart = png(40, 30);
        std::fs::write(work.join("chart.png"), &chart).unwrap();
        std::fs::write(work.join("report.pdf"), pdf("hello")).unwrap();
        std::fs::write(work.join("note.ogg"), voice().bytes).unwrap();
        rig.llm.push(Reply::text(format!(
            "Here you are.\nMEDIA:{}\nMEDIA:report.pdf\nMEDIA:note.ogg\nMEDIA:/etc/passwd",
            work.join("chart.png").display()
        )));
        rig.kit
            .push_dm(talaria_testkit::kit::Who::Friend, "send me the files");
        let uploads = rig
            .kit
            .fake
            .wait_for_uploads(3, Duration::from_secs(20))
            .await;
        let kinds: Vec<&str> = uploads.iter().map(|u| u.method.as_str()).collect();
        assert_eq!(kinds, ["sendPhoto", "sendDocument", "sendVoice"]);
        assert_eq!(uploads[0].bytes, chart);
        assert_eq!(uploads[1].file_name.as_deref(), Some("report.pdf"));
        let sent = rig.wait_for_text("Here you are.").await;
        let text = sent
            .iter()
            .map(|o| o.text.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            text.contains("Not sent: passwd is outside the folders"),
            "{text}"
        );
        assert!(!text.contains("MEDIA:"), "{text}");
        rig.wait_for_delivered(1).await;
    }

    /// A real local text-to-speech round trip: Debian's espeak-ng speaks
    /// the answer, ffmpeg makes it OGG/Opus, and Telegram gets a voice
    /// note of a plausible length.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn espeak_ng_speaks_the_answer_as_an_ogg_opus_voice_note() {
        for program in ["espeak-ng", "ffmpeg", "ffprobe"] {
            let found = std::process::Command::new("sh")
                .args(["-c", &format!("command -v {program}")])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            assert!(
                found,
                "{program} is missing: install espeak-ng and ffmpeg (scripts/test does)"
            );
        }
        let rig = Rig::<TelegramKit>::started(&[], |c| {
            c.tts.provider = Some(TtsProvider::Command);
            c.tts.command = Some("espeak-ng -w {output} {text}".into());
            c.tts.voice_reply = VoiceReply::Always;
        })
        .await;
        let answer = "Good morning. The weather today is sunny with a light breeze.";
        rig.llm.push(Reply::text(answer));
        rig.kit
            .push_dm(talaria_testkit::kit::Who::Friend, "how is the weather?");
        rig.wait_for_text("sunny with a light breeze").await;
        let uploads = rig
            .kit
            .fake
            .wait_for_uploads(1, Duration::from_secs(60))
            .await;
        let voice = &uploads[0];
        assert_eq!(voice.method, "sendVoice");
        assert!(voice.bytes.starts_with(b"OggS"), "not OGG");
        assert!(voice.bytes.windows(8).any(|w| w == b"OpusHead"), "not Opus");
        let file = rig.dir.path().join("heard.ogg");
        std::fs::write(&file, &voice.bytes).unwrap();
        let length = talaria_media::audio_duration(&file).expect("ffprobe reads the voice note");
        assert!(
            (Duration::from_secs(2)..Duration::from_secs(12)).contains(&length),
            "{length:?} for {} words",
            answer.split_whitespace().count()
        );
    }
}
