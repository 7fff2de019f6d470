//! The scenarios every adapter runs (see the module docs of `contract`).
//! Each asserts what holds for every platform; what a kit can observe
//! beyond that (typing, a quoted reply) it checks where the kit says so.

use std::time::Duration;

use talaria_adapter::contract::LengthUnit;
use talaria_testkit::Reply;
use talaria_testkit::kit::{Who, long_answer, part_count};

use super::{AdapterKit, Rig, Skip};

/// How long the fake asks the adapter to wait after a 429.
const RATE_LIMIT: Duration = Duration::from_secs(1);

/// A friend's DM is answered in the DM, the model saw the text, the
/// bot showed it was typing (where the fake can tell) and the ledger
/// records the answer delivered.
pub async fn dm_turn<K: AdapterKit>() {
    let rig = Rig::<K>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("Hello from Talaria."));
    let asked = rig.kit.push_dm(Who::Friend, "hi there");
    let sent = rig.sent(1).await;
    let chat = rig.kit.dm_chat(Who::Friend);
    assert_eq!(sent[0].chat, chat);
    assert_eq!(sent[0].text, "Hello from Talaria.");
    assert_eq!(sent[0].thread, None, "a DM is answered inline");
    if K::DM_REPLY_QUOTES {
        assert_eq!(sent[0].reply_to.as_deref(), Some(asked.as_str()));
    }
    assert_eq!(rig.user_messages(0).last().unwrap(), "hi there");
    if let Some(typed) = rig.kit.typed_in(&chat) {
        assert!(typed, "no typing indicator in {chat}");
    }
    rig.wait_for_delivered(1).await;
}

/// A message in a thread is answered in that thread, once (platforms that
/// send a mention twice included), and the speaker is named to the model
/// as in every shared chat.
pub async fn thread_reply<K: AdapterKit>() {
    let rig = Rig::<K>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("thread answer"));
    let asked = rig.kit.push_in_thread("in the thread");
    let sent = rig.wait_for_text("thread answer").await;
    let reply = sent.iter().find(|o| o.text == "thread answer").unwrap();
    assert_eq!(reply.chat, asked.chat);
    assert_eq!(reply.thread, asked.thread);
    let asked_text = rig.user_messages(0);
    assert!(
        asked_text.last().unwrap().ends_with("] in the thread"),
        "{asked_text:?}"
    );
    if let Some(typed) = rig.kit.typed_in(&asked.chat) {
        assert!(typed, "no typing indicator in {}", asked.chat);
    }
    rig.settle().await;
    assert_eq!(rig.llm.requests().len(), 1, "one turn for the message");
    assert_eq!(rig.kit.sent().len(), 1);
}

/// An answer several times the platform's limit arrives in numbered parts,
/// each under the limit in the platform's unit, that reassemble to it
/// exactly; only the first names the question where replies quote.
pub async fn long_answer_split<K: AdapterKit>() {
    let rig = Rig::<K>::started(&[], |_| {}).await;
    let limits = rig.capabilities().limits;
    let answer = long_answer(limits.max_len * 2 + 500);
    rig.llm.push(Reply::text(answer.clone()));
    rig.kit.push_dm(Who::Friend, "write a lot");
    let first = rig.sent(1).await;
    let total = part_count(&first[0].text).expect("the first part carries (1/n)");
    // Twice the limit and a bit: three parts, on every platform (the
    // splitter fills each part to within a line of the limit).
    assert_eq!(total, 3, "{total} parts");
    let sent = rig.sent(total).await;
    let mut joined = String::new();
    let chat = rig.kit.dm_chat(Who::Friend);
    for (i, part) in sent.iter().enumerate() {
        assert_eq!(part.chat, chat, "part {i} went elsewhere");
        let len = limits.unit.measure(&part.wire);
        assert!(len <= limits.max_len, "part {i} is {len} long");
        let suffix = format!(" ({}/{total})", i + 1);
        joined.push_str(part.text.strip_suffix(&suffix).expect("numbered part"));
    }
    assert_eq!(joined, answer);
    if K::DM_REPLY_QUOTES {
        assert!(sent[0].reply_to.is_some());
        assert!(sent[1..].iter().all(|s| s.reply_to.is_none()));
    }
    // Guard against a unit the suite does not know how to measure.
    assert!(matches!(limits.unit, LengthUnit::Chars | LengthUnit::Utf16));
}

/// The same event delivered again never starts a second turn; a new
/// message with the same text does.
pub async fn redelivery<K: AdapterKit>() {
    let rig = Rig::<K>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("First answer."));
    let id = rig.kit.push_dm(Who::Friend, "only once");
    rig.sent(1).await;
    // The turn is over once its answer is delivered, so the next message
    // is not met by a busy notice.
    rig.wait_for_delivered(1).await;
    rig.kit.redeliver(&id, "only once");
    rig.llm.push(Reply::text("Second answer."));
    let second = rig.kit.push_dm(Who::Friend, "only once");
    let sent = rig.sent(2).await;
    assert_eq!(sent[1].text, "Second answer.");
    if K::DM_REPLY_QUOTES {
        // Had the repeat started a turn, it would have run first and the
        // answer would quote the old message.
        assert_eq!(sent[1].reply_to.as_deref(), Some(second.as_str()));
    }
    rig.settle().await;
    assert_eq!(rig.llm.requests().len(), 2);
    assert_eq!(rig.kit.sent().len(), 2);
    rig.wait_for_delivered(2).await;
}

/// A dropped connection is re-established; what arrived meanwhile is
/// answered, nothing is answered twice, and the conversation goes on.
pub async fn dropped_connection<K: AdapterKit>() {
    let rig = Rig::<K>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("first answer"));
    rig.kit.push_dm(Who::Friend, "before the drop");
    rig.wait_for_text("first answer").await;
    let seen = rig.kit.connections();
    rig.kit.drop_connection().await;
    // Sent while the bot is away: the platform keeps it for the next
    // connection.
    rig.llm.push(Reply::text("second answer"));
    rig.kit.push_dm(Who::Friend, "during the outage");
    rig.kit.wait_connected(seen + 1).await;
    if let Some(resumed) = rig.kit.last_connection_resumed() {
        assert!(resumed, "the connection was started afresh, not resumed");
    }
    rig.wait_for_text("second answer").await;
    rig.settle().await;
    // Everything the platform handed over, before and after the drop, was
    // acknowledged: nothing is left for it to deliver again.
    rig.kit.wait_acknowledged().await;
    assert_eq!(rig.kit.sent().len(), 2, "{:?}", rig.kit.sent());
    assert_eq!(rig.llm.requests().len(), 2);
    let asked = rig.user_messages(1);
    if K::DMS_CONTINUE {
        assert_eq!(asked, vec!["before the drop", "during the outage"]);
    } else {
        assert_eq!(asked, vec!["during the outage"]);
    }
}

/// A send refused as rate-limited is retried no sooner than the platform
/// asked, and the answer arrives once.
pub async fn rate_limit<K: AdapterKit>() {
    let rig = Rig::<K>::started(&[], |_| {}).await;
    rig.kit.rate_limit_next_send(RATE_LIMIT);
    rig.llm.push(Reply::text("worth the wait"));
    rig.kit.push_dm(Who::Friend, "hello");
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].text, "worth the wait");
    let attempts = rig.kit.send_attempts();
    assert_eq!(attempts.len(), 2, "one refused send, one retry");
    let gap = attempts[1].duration_since(attempts[0]);
    assert!(gap >= RATE_LIMIT, "retried after {gap:?}");
    rig.settle().await;
    assert_eq!(rig.kit.sent().len(), 1);
    rig.wait_for_delivered(1).await;
}

/// A stranger is ignored in a DM and in a shared chat, even with the
/// global allow-all flag once an allowlist exists: no answer, no pairing
/// offer, no turn. The friend is still answered.
pub async fn unauthorized<K: AdapterKit>() {
    let rig = Rig::<K>::started(&[("GATEWAY_ALLOW_ALL_USERS", "true")], |_| {}).await;
    rig.kit.push_dm(Who::Stranger, "let me in");
    rig.kit.push_stranger_in_group("hello");
    rig.settle().await;
    assert!(rig.kit.sent().is_empty(), "no answer, no pairing offer");
    assert!(rig.llm.requests().is_empty());
    if let Some(reactions) = rig.kit.reactions() {
        assert_eq!(reactions, 0, "no working indicator for a stranger");
    }

    rig.llm.push(Reply::text("Welcome back."));
    rig.kit.push_dm(Who::Friend, "it's me");
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].text, "Welcome back.");
    assert_eq!(sent[0].chat, rig.kit.dm_chat(Who::Friend));
    assert_eq!(rig.llm.requests().len(), 1);
}

/// Every scenario is run or skipped, never both or neither, and a skip
/// the capabilities can speak to agrees with them.
pub async fn check_declaration<K: AdapterKit>(run: &[&str], skipped: &[(&str, Skip)]) {
    const ALL: &[&str] = &[
        "dm_turn",
        "thread_reply",
        "long_answer_split",
        "redelivery",
        "dropped_connection",
        "rate_limit",
        "unauthorized",
    ];
    for name in ALL {
        let ran = run.contains(name);
        let skip = skipped.iter().any(|(s, _)| s == name);
        assert!(
            ran != skip,
            "{}: {name} must be run or skipped, once",
            K::NAME
        );
    }
    let rig = Rig::<K>::new(&[], |_| {}).await;
    let caps = rig.capabilities();
    assert_eq!(
        skipped.iter().any(|(_, why)| *why == Skip::Threadless),
        !caps.threads,
        "{}: a thread scenario is skipped exactly when the adapter has no threads",
        K::NAME
    );
    assert_eq!(
        skipped.iter().any(|(_, why)| *why == Skip::NotAChat),
        !caps.chat,
        "{}: a scenario is skipped as not a chat exactly when the adapter is none",
        K::NAME
    );
}
