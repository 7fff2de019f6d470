//! The gateway end to end with WhatsApp Cloud, in one process: Meta's
//! signed deliveries posted to the shared webhook listener, the fake Graph
//! API, the mock LLM, a real SQLite file, and the real runner, ledger,
//! router and WhatsApp adapter between them.
#![cfg(feature = "whatsapp")]

#[path = "gateway_support/whatsapp.rs"]
mod support;

use support::*;
use talaria_testkit::Reply;
use talaria_testkit::whatsapp::{delivery, signature, text};

const ADA: &str = "16505551234";
const MALLORY: &str = "15550009999";
const ALLOW_ADA: &[(&str, &str)] = &[("WHATSAPP_CLOUD_ALLOWED_USERS", ADA)];

fn from(wa_id: &str, wamid: &str, body: &str) -> serde_json::Value {
    delivery(
        NUMBER,
        &[(wa_id, "Someone")],
        vec![text(wa_id, wamid, body)],
        vec![],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_is_answered_in_its_chat_and_recorded_as_delivered() {
    let rig = Rig::started(ALLOW_ADA).await;
    rig.llm
        .push(Reply::text("Hello **Ada**, nice to meet you."));
    let answer = rig
        .meta
        .deliver(&from(ADA, "wamid.HELLO1", "hi, I am Ada"))
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let sent = rig.graph.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].to, ADA);
    assert_eq!(sent[0].body, "Hello *Ada*, nice to meet you.");
    assert_eq!(sent[0].context.as_deref(), Some("wamid.HELLO1"));
    assert_eq!(
        rig.user_messages(0).last().map(String::as_str),
        Some("hi, I am Ada")
    );
    rig.wait_for_delivered(1).await;
    // The message was marked read, with the typing indicator, while the
    // answer was worked on.
    let reads = rig.graph.wait_for_reads(1, WAIT).await;
    assert_eq!(reads[0].message_id, "wamid.HELLO1");
    assert!(reads[0].typing);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_delivered_message_is_processed_once() {
    let rig = Rig::started(ALLOW_ADA).await;
    rig.llm.push(Reply::text("First answer."));
    let first = from(ADA, "wamid.ONCE", "only once");
    assert_eq!(rig.meta.deliver(&first).await.status, 200);
    rig.graph.wait_for_sent(1, WAIT).await;
    rig.wait_for_delivered(1).await;
    // Meta delivers the same batch again (it missed our 200, say); then a
    // new message with the same text. Had the repeat started a turn, it
    // would run before the new one and take its reply.
    assert_eq!(rig.meta.deliver(&first).await.status, 200);
    rig.llm.push(Reply::text("Second answer."));
    let second = from(ADA, "wamid.TWICE", "only once");
    assert_eq!(rig.meta.deliver(&second).await.status, 200);
    let sent = rig.graph.wait_for_sent(2, WAIT).await;
    assert_eq!(sent[1].body, "Second answer.");
    assert_eq!(sent[1].context.as_deref(), Some("wamid.TWICE"));
    rig.wait_for_delivered(2).await;
    assert_eq!(rig.llm.requests().len(), 2);
    assert_eq!(rig.graph.sent().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_signature_is_refused_with_401_and_nothing_runs() {
    let rig = Rig::started(ALLOW_ADA).await;
    let forged = from(ADA, "wamid.FORGED", "run this").to_string();
    let bytes = forged.as_bytes();
    let wrong = signature("someone-elses-secret", bytes);
    for sig in [Some(wrong.as_str()), None] {
        let answer = rig.meta.post(bytes, sig).await;
        assert_eq!(answer.status, 401, "{sig:?}");
    }
    // The refusals were answered before anything was handed on; a real
    // message after them is the first and only turn.
    rig.llm.push(Reply::text("Only this one."));
    assert_eq!(
        rig.meta
            .deliver(&from(ADA, "wamid.REAL", "hello"))
            .await
            .status,
        200
    );
    let sent = rig.graph.wait_for_sent(1, WAIT).await;
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
    assert_eq!(rig.meta.post(bytes, Some(&good)).await.status, 200);
    rig.graph.wait_for_sent(2, WAIT).await;
    assert_eq!(rig.llm.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_answer_is_split_under_the_text_limit_and_reassembles() {
    let rig = Rig::started(ALLOW_ADA).await;
    let limit = talaria_platforms::whatsapp::MAX_TEXT_CHARS;
    let mut answer = String::new();
    let mut i = 0;
    while answer.chars().count() < limit * 2 + 500 {
        answer.push_str(&format!(
            "Paragraph {i}: the quick brown fox jumps over the lazy dog, again and again.\n\n"
        ));
        i += 1;
    }
    let answer = answer.trim_end().to_owned();
    rig.llm.push(Reply::text(answer.clone()));
    assert_eq!(
        rig.meta
            .deliver(&from(ADA, "wamid.LONG", "write a lot"))
            .await
            .status,
        200
    );
    let first = rig.graph.wait_for_sent(1, WAIT).await;
    let total: usize = first[0]
        .body
        .rsplit_once(" (1/")
        .and_then(|(_, n)| n.trim_end_matches(')').parse().ok())
        .expect("the first part carries (1/n)");
    assert_eq!(total, 3);
    let parts = rig.graph.wait_for_sent(total, WAIT).await;
    let mut joined = String::new();
    for (i, part) in parts.iter().enumerate() {
        assert!(part.body.chars().count() <= limit);
        assert_eq!(part.to, ADA);
        // Only the first part quotes the question.
        let quoted = if i == 0 { Some("wamid.LONG") } else { None };
        assert_eq!(part.context.as_deref(), quoted);
        let suffix = format!(" ({}/{total})", i + 1);
        joined.push_str(part.body.strip_suffix(&suffix).expect("a numbered part"));
    }
    assert_eq!(joined, answer);
    rig.wait_for_delivered(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthorized_sender_never_reaches_the_model() {
    let rig = Rig::started(ALLOW_ADA).await;
    assert_eq!(
        rig.meta
            .deliver(&from(MALLORY, "wamid.M1", "let me in"))
            .await
            .status,
        200
    );
    // Ada's message comes after Mallory's, so once it is answered the
    // runner has long decided about Mallory's.
    rig.llm.push(Reply::text("Welcome back."));
    assert_eq!(
        rig.meta
            .deliver(&from(ADA, "wamid.A1", "it's me"))
            .await
            .status,
        200
    );
    let sent = rig.graph.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].body, "Welcome back.");
    rig.wait_for_delivered(1).await;
    assert_eq!(rig.llm.requests().len(), 1);
    assert_eq!(rig.user_messages(0), vec!["it's me"]);
    assert!(rig.graph.sent().iter().all(|s| s.to == ADA));
    // Nor was the stranger's message marked read.
    assert!(rig.graph.reads().iter().all(|r| r.message_id != "wamid.M1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_outside_the_24_hour_window_is_abandoned_and_logged() {
    capture_logs();
    const LATE: &str = "16505550024";
    let rig = Rig::started(&[("WHATSAPP_CLOUD_ALLOWED_USERS", LATE)]).await;
    // The window closes while the answer is being worked on (or the
    // message was a day old when Meta finally delivered it).
    rig.graph.close_window(LATE);
    rig.llm.push(Reply::text("Too late, I'm afraid."));
    assert_eq!(
        rig.meta
            .deliver(&from(LATE, "wamid.LATE", "are you there?"))
            .await
            .status,
        200
    );
    // Refused for good: abandoned at once (the ledger's own tests check
    // the stored reason), so no sweep tries it again.
    let open = rig.wait_for_abandoned().await;
    assert!(open.iter().all(|o| o.chat_id != LATE), "{open:?}");
    assert!(rig.graph.sent().is_empty());
    let what = "the log to name the 24-hour window";
    rig.wait_for(what, || async {
        captured_logs().lines().any(|l| {
            l.contains("WARN")
                && l.contains("24-hour customer service window is closed")
                && l.contains("131047")
        })
    })
    .await;
    // The delivery's own warning carries the refusal the ledger stored.
    let what = "the delivery warning to say what to do";
    rig.wait_for(what, || async {
        captured_logs().lines().any(|l| {
            l.contains("could not deliver a reply")
                && l.contains("refused:")
                && l.contains("the user must write to the bot first")
                && l.contains("template")
        })
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
    let rig = Rig::started(&[("WHATSAPP_CLOUD_ALLOWED_USERS", OWED)]).await;
    rig.graph.expire_token();
    rig.llm.push(Reply::text("You will get this later."));
    assert_eq!(
        rig.meta
            .deliver(&from(OWED, "wamid.OWED", "hello?"))
            .await
            .status,
        200
    );
    let open = rig.wait_for_failed().await;
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
    rig.wait_for("the log to say the token must be replaced", || async {
        captured_logs()
            .lines()
            .any(|l| l.contains("ERROR") && l.contains("access token is invalid or expired"))
    })
    .await;
    assert!(!captured_logs().contains(TOKEN), "the token was logged");
}
