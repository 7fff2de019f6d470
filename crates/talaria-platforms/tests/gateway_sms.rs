//! SMS end to end, in one process: webhooks posted as Twilio posts them
//! (form bodies signed over the public URL) to the real SMS adapter on
//! the shared listener, the real runner, router and delivery ledger on a
//! real SQLite file, the mock LLM over HTTP, and the answers arriving at
//! the fake Twilio REST API.
#![cfg(feature = "sms")]

#[path = "gateway_support/sms.rs"]
mod support;

use support::*;
use talaria_testkit::Reply;
use talaria_testkit::twilio::{WebhookReply, sign};

const ALICE: &str = "+15552223333";
const MALLORY: &str = "+15559990000";
const ALLOWED: &[(&str, &str)] = &[("SMS_ALLOWED_USERS", ALICE)];

fn assert_twiml(reply: &WebhookReply) {
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.content_type.as_deref(), Some("text/xml"));
    assert!(reply.body.contains("<Response/>"), "{reply:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sms_is_answered_to_the_sender_and_recorded_delivered() {
    let rig = SmsRig::started(ALLOWED).await;
    rig.llm.push(Reply::text("Hello from **Talaria**."));
    let inbound = rig.sms(ALICE, "hi there");

    assert_twiml(&rig.sender.send(&inbound).await);

    let sent = rig.sent(1).await;
    assert_eq!(sent[0].to, ALICE, "answered in the sender's conversation");
    assert_eq!(sent[0].from, NUMBER);
    assert_eq!(sent[0].body, "Hello from Talaria.", "sent as plain text");
    rig.wait_for_ledger_delivered(1).await;
    assert_eq!(
        rig.user_messages(0).last().map(String::as_str),
        Some("hi there")
    );
    assert_eq!(rig.twilio.send_attempts().len(), 1);
    assert!(rig.twilio.send_attempts()[0].authorized);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_sms_starts_no_second_turn() {
    let rig = SmsRig::started(ALLOWED).await;
    rig.llm.push(Reply::text("first answer"));
    rig.llm.push(Reply::text("answer to the second message"));
    let inbound = rig.sms(ALICE, "only once");

    assert_twiml(&rig.sender.send(&inbound).await);
    rig.sent(1).await;
    rig.wait_for_ledger_delivered(1).await;

    // Twilio sends the same message again (same MessageSid): it is
    // acknowledged, so Twilio stops, but no second turn starts.
    assert_twiml(&rig.sender.send(&inbound).await);

    // A different message after the repeat: once its answer is out, a
    // turn started by the repeat would have been started before it.
    assert_twiml(&rig.sender.send(&rig.sms(ALICE, "a new question")).await);
    let sent = rig.sent(2).await;
    rig.wait_for_ledger_delivered(2).await;
    let bodies: Vec<&str> = sent.iter().map(|s| s.body.as_str()).collect();
    assert_eq!(bodies, vec!["first answer", "answer to the second message"]);
    assert_eq!(rig.llm.requests().len(), 2, "the repeat reached the model");
    assert_eq!(rig.user_messages(1), vec!["only once", "a new question"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_or_missing_signature_gets_401_and_nothing_runs() {
    let rig = SmsRig::started(ALLOWED).await;
    rig.llm.push(Reply::text("answer to the genuine message"));
    let inbound = rig.sms(ALICE, "forged?");
    let params = inbound.params();

    assert_eq!(rig.sender.post(&params, None).await.status, 401);
    let forged = sign("not-the-auth-token", PUBLIC_URL, &params);
    assert_eq!(rig.sender.post(&params, Some(&forged)).await.status, 401);
    // Signed correctly, then the text changed on the way.
    let good = rig.sender.signature(&params);
    let tampered: Vec<(String, String)> = params
        .iter()
        .map(|(k, v)| match k.as_str() {
            "Body" => (k.clone(), "send me the secrets".to_owned()),
            _ => (k.clone(), v.clone()),
        })
        .collect();
    assert_eq!(rig.sender.post(&tampered, Some(&good)).await.status, 401);

    rig.settle().await;
    assert!(
        rig.llm.requests().is_empty(),
        "a refused webhook reached the model"
    );
    assert!(rig.twilio.send_attempts().is_empty());

    // The genuine message (same MessageSid: the refused ones were not
    // remembered) is answered.
    assert_twiml(&rig.sender.post(&params, Some(&good)).await);
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].body, "answer to the genuine message");
    rig.wait_for_ledger_delivered(1).await;
    assert_eq!(rig.user_messages(0), vec!["forged?"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_answer_is_split_into_sms_that_reassemble_exactly() {
    let rig = SmsRig::started(ALLOWED).await;
    let limit = talaria_platforms::sms::MAX_BODY_CHARS;
    let mut answer = String::new();
    let mut i = 0;
    while answer.chars().count() < limit * 2 + 300 {
        answer.push_str(&format!(
            "Paragraph {i}: the quick brown fox jumps over the lazy dog, again and again.\n\n"
        ));
        i += 1;
    }
    let answer = answer.trim_end().to_owned();
    rig.llm.push(Reply::text(answer.clone()));
    assert_twiml(&rig.sender.send(&rig.sms(ALICE, "write a lot")).await);

    let first = rig.sent(1).await;
    let total: usize = first[0]
        .body
        .rsplit_once(" (1/")
        .and_then(|(_, n)| n.trim_end_matches(')').parse().ok())
        .expect("the first part carries (1/n)");
    assert_eq!(total, 3);
    let sent = rig.sent(total).await;
    rig.wait_for_ledger_delivered(1).await;
    let mut joined = String::new();
    for (i, part) in sent.iter().enumerate() {
        assert_eq!(part.to, ALICE);
        assert!(part.body.chars().count() <= limit, "part {i} is too long");
        let suffix = format!(" ({}/{total})", i + 1);
        joined.push_str(part.body.strip_suffix(&suffix).expect("a numbered part"));
    }
    assert_eq!(joined, answer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthorized_sender_is_ignored_and_never_reaches_the_model() {
    let rig = SmsRig::started(ALLOWED).await;
    // Acknowledged to Twilio (it was delivered to us), then ignored.
    assert_twiml(&rig.sender.send(&rig.sms(MALLORY, "let me in")).await);
    rig.settle().await;
    assert!(
        rig.llm.requests().is_empty(),
        "a stranger reached the model"
    );
    assert!(
        rig.twilio.send_attempts().is_empty(),
        "a stranger got an answer"
    );

    rig.llm.push(Reply::text("Welcome back."));
    assert_twiml(&rig.sender.send(&rig.sms(ALICE, "it's me")).await);
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].to, ALICE);
    assert_eq!(sent[0].body, "Welcome back.");
    rig.wait_for_ledger_delivered(1).await;
    assert_eq!(rig.llm.requests().len(), 1);
    assert_eq!(rig.twilio.sent().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recipient_who_replied_stop_is_not_sent_to_again() {
    let rig = SmsRig::started(ALLOWED).await;
    rig.twilio.unsubscribe(ALICE);
    rig.llm.push(Reply::text("You will not get this."));
    assert_twiml(&rig.sender.send(&rig.sms(ALICE, "question")).await);
    rig.twilio.wait_for_send_attempts(1, WAIT).await;
    rig.wait_for("the ledger to settle the refused answer", || async {
        let counts = rig.ledger_counts().await;
        counts.keys().all(|s| {
            !matches!(
                s,
                talaria_store::ObligationState::Pending
                    | talaria_store::ObligationState::Attempting
            )
        }) && !counts.is_empty()
    })
    .await;
    rig.settle().await;
    // Refused for good: one attempt, no retry, nothing delivered.
    assert_eq!(rig.twilio.send_attempts().len(), 1);
    assert!(rig.twilio.sent().is_empty());
    let counts = rig.ledger_counts().await;
    assert!(
        !counts.contains_key(&talaria_store::ObligationState::Delivered),
        "{counts:?}"
    );
}
