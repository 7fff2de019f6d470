//! The gateway end to end with e-mail, in one process: real Dovecot (IMAP)
//! and SMTP servers on loopback, the mock LLM, a real SQLite file, and the
//! real runner, ledger, router and e-mail adapter between them.

#[path = "gateway_support/email.rs"]
mod support;

use support::*;
use talaria_gateway::Liveness;
use talaria_store::{CursorStore, SqliteStore};
use talaria_testkit::Reply;
use talaria_testkit::email::ADDRESS;

const ALICE: &str = "alice@example.org";
const ALLOW_ALICE: &[(&str, &str)] = &[("EMAIL_ALLOWED_USERS", ALICE)];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mail_is_answered_in_its_thread_and_recorded_delivered() {
    let rig = Rig::started(ALLOW_ALICE, |_| {}).await;
    rig.llm.push(Reply::text("The answer is 42."));
    let uid = rig.mail.deliver_text(
        "Alice <alice@example.org>",
        "Question",
        "q1@example.org",
        "What is the answer?",
    );
    let sent = rig.sent(1).await;
    let reply = &sent[0];
    assert_eq!(reply.rcpt_to, vec![ALICE]);
    assert!(reply.from.contains(ADDRESS), "{}", reply.from);
    assert_eq!(reply.subject, "Re: Question");
    assert_eq!(reply.in_reply_to.as_deref(), Some("q1@example.org"));
    assert_eq!(reply.references, vec!["q1@example.org"]);
    assert_eq!(reply.content_type, "text/plain");
    assert_eq!(reply.text.trim_end(), "The answer is 42.");
    assert_eq!(
        rig.user_messages(0).last().unwrap(),
        "Subject: Question\n\nWhat is the answer?"
    );
    rig.wait_for_delivered(1).await;
    assert!(
        rig.mail.flags(uid).contains("\\Seen"),
        "{}",
        rig.mail.flags(uid)
    );

    // Alice answers the answer (her client adds another `Re:`): the reply
    // keeps one `Re:`, extends the thread's references, and the turn sees
    // the first exchange, since a mail thread is one conversation.
    let bot_id = reply
        .message_id
        .clone()
        .expect("the reply has a Message-ID");
    rig.llm.push(Reply::text("You are welcome."));
    rig.mail.deliver(&format!(
        "From: alice@example.org\nTo: {ADDRESS}\nSubject: RE: Re: Question\n\
         Message-ID: <q2@example.org>\nIn-Reply-To: <{bot_id}>\n\
         References: <q1@example.org> <{bot_id}>\n\nThanks!\n\n\
         On Friday, the bot wrote:\n> The answer is 42.\n"
    ));
    let sent = rig.sent(2).await;
    assert_eq!(sent[1].subject, "Re: Question");
    assert_eq!(sent[1].in_reply_to.as_deref(), Some("q2@example.org"));
    assert_eq!(
        sent[1].references,
        vec!["q1@example.org".to_owned(), bot_id, "q2@example.org".into()]
    );
    assert_eq!(
        rig.user_messages(1),
        vec!["Subject: Question\n\nWhat is the answer?", "Thanks!"],
        "the quoted history is trimmed and the thread is one session"
    );
    rig.wait_for_delivered(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mail_seen_again_starts_one_turn() {
    let mut rig = Rig::started(ALLOW_ALICE, |_| {}).await;
    rig.llm.push(Reply::text("First answer."));
    rig.mail
        .deliver_text(ALICE, "Once", "once@example.org", "only once, please");
    rig.sent(1).await;
    rig.wait_for_delivered(1).await;
    rig.stop().await;

    // The saved position is lost: the next gateway fetches the mail again.
    let validity = rig.mail.uid_validity();
    let store = SqliteStore::open(&rig.home.state_db()).unwrap();
    store
        .set_cursor(
            "email",
            &format!("uid:{ADDRESS}:INBOX"),
            &format!("{validity}:0"),
        )
        .await
        .unwrap();
    drop(store);
    rig.start();
    rig.wait_until_live().await;
    rig.llm.push(Reply::text("Second answer."));
    rig.mail
        .deliver_text(ALICE, "Twice", "twice@example.org", "a new question");
    let sent = rig.sent(2).await;
    assert_eq!(sent[1].text.trim_end(), "Second answer.");
    assert_eq!(sent[1].in_reply_to.as_deref(), Some("twice@example.org"));
    rig.settle().await;
    assert_eq!(rig.llm.requests().len(), 2, "the old mail started no turn");
    assert_eq!(rig.mail.sent().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_fatal_and_nothing_runs() {
    let mut rig = Rig::new(ALLOW_ALICE, |_| {}).await;
    rig.password = "not-the-password".into();
    rig.start();
    let deadline = tokio::time::Instant::now() + WAIT;
    let error = loop {
        if let Some((Liveness::Backoff, Some(e))) = rig.state() {
            break e;
        }
        assert!(tokio::time::Instant::now() < deadline, "{:?}", rig.state());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert!(error.contains("refused the login"), "{error}");
    assert!(error.contains("EMAIL_PASSWORD"), "{error}");
    assert!(!error.contains("not-the-password"), "{error}");
    rig.mail
        .deliver_text(ALICE, "Hello?", "h@example.org", "anyone there?");
    rig.settle().await;
    assert!(rig.llm.requests().is_empty());
    assert!(rig.mail.sent().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_answer_arrives_in_several_mails_that_reassemble() {
    let rig = Rig::started(ALLOW_ALICE, |_| {}).await;
    let mut answer = String::new();
    let mut i = 0;
    while answer.chars().count() < 120_000 {
        answer.push_str(&format!(
            "Paragraph {i}: the quick brown fox jumps over the lazy dog, again and again.\n\n"
        ));
        i += 1;
    }
    let answer = answer.trim_end().to_owned();
    rig.llm.push(Reply::text(answer.clone()));
    rig.mail
        .deliver_text(ALICE, "Long", "long@example.org", "write a lot");
    let first = rig.sent(1).await;
    let total: usize = first[0]
        .text
        .trim_end()
        .rsplit_once(" (1/")
        .and_then(|(_, n)| n.trim_end_matches(')').parse().ok())
        .expect("the first part carries (1/n)");
    assert!(total >= 3, "{total} parts");
    // One answer, one ledger row, however many mails it took.
    rig.wait_for_delivered(1).await;
    let sent = rig.sent(total).await;
    assert_eq!(sent.len(), total);
    let mut parts: Vec<(usize, String)> = sent
        .iter()
        .map(|m| {
            assert_eq!(m.subject, "Re: Long");
            assert_eq!(m.references, vec!["long@example.org"]);
            let body = m.text.trim_end_matches(['\r', '\n']);
            assert!(body.chars().count() <= 50_000);
            let (text, n) = body.rsplit_once(" (").expect("numbered part");
            let index: usize = n.split('/').next().unwrap().parse().unwrap();
            (index, text.to_owned())
        })
        .collect();
    parts.sort_by_key(|(i, _)| *i);
    let joined: String = parts.into_iter().map(|(_, t)| t).collect();
    assert_eq!(joined, answer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_and_machines_never_reach_the_model() {
    let rig = Rig::started(ALLOW_ALICE, |_| {}).await;
    rig.mail
        .deliver_text("mallory@example.net", "Hi", "m1@example.net", "let me in");
    rig.mail.deliver(&format!(
        "From: {ALICE}\nTo: {ADDRESS}\nSubject: Out of office\nAuto-Submitted: auto-replied\n\
         Message-ID: <ooo@example.org>\n\nI am away."
    ));
    rig.mail.deliver(&format!(
        "From: {ALICE}\nTo: {ADDRESS}\nSubject: News\nPrecedence: bulk\n\
         Message-ID: <news@example.org>\n\nOur newsletter."
    ));
    rig.mail.deliver(&format!(
        "From: MAILER-DAEMON@example.org\nTo: {ADDRESS}\nSubject: Undelivered\n\
         Message-ID: <bounce@example.org>\n\nThe mail could not be delivered."
    ));
    rig.mail.deliver(&format!(
        "From: {ADDRESS}\nTo: {ADDRESS}\nSubject: Me\nMessage-ID: <me@example.test>\n\nmyself"
    ));
    rig.settle().await;
    assert!(rig.llm.requests().is_empty());
    assert!(rig.mail.sent().is_empty());

    // The allowlist compares whole addresses, case-insensitively.
    rig.llm.push(Reply::text("Hi Alice."));
    rig.mail
        .deliver_text("Alice <ALICE@Example.ORG>", "Hi", "a1@example.org", "hello");
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].text.trim_end(), "Hi Alice.");
    assert_eq!(sent[0].rcpt_to, vec![ALICE]);
    rig.settle().await;
    assert_eq!(rig.llm.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_picks_up_new_mail_without_waiting_for_a_poll() {
    // An hour between polls: only IDLE can bring the mail in time.
    let rig = Rig::started(ALLOW_ALICE, |c| {
        c.platforms.set("email.poll_interval_secs", 3600)
    })
    .await;
    for n in 1..=2 {
        rig.llm.push(Reply::text(format!("answer {n}")));
        rig.mail.deliver_text(
            ALICE,
            &format!("Question {n}"),
            &format!("idle{n}@example.org"),
            "quick?",
        );
        let sent = rig.sent(n).await;
        assert_eq!(sent[n - 1].text.trim_end(), format!("answer {n}"));
        rig.wait_for_delivered(n as u64).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resumes_after_the_cursor() {
    let mut rig = Rig::new(ALLOW_ALICE, |_| {}).await;
    // Mail from before the first start is history, not a question.
    rig.mail
        .deliver_text(ALICE, "Old", "old@example.org", "an old mail");
    rig.start();
    rig.wait_until_live().await;
    rig.llm.push(Reply::text("Noted, Ada."));
    rig.mail
        .deliver_text(ALICE, "Name", "n1@example.org", "my name is Ada");
    rig.sent(1).await;
    rig.wait_for_delivered(1).await;
    rig.stop().await;

    // Arrives while the gateway is down.
    rig.mail
        .deliver_text(ALICE, "Later", "n2@example.org", "are you back?");
    rig.llm.push(Reply::text("I am back."));
    rig.start();
    let sent = rig.sent(2).await;
    assert_eq!(sent[1].text.trim_end(), "I am back.");
    assert_eq!(sent[1].subject, "Re: Later");
    rig.wait_for_delivered(2).await;
    rig.settle().await;
    assert_eq!(rig.llm.requests().len(), 2, "nothing was answered twice");
    assert_eq!(
        rig.user_messages(1).last().unwrap(),
        "Subject: Later\n\nare you back?"
    );
    assert!(
        rig.llm
            .requests()
            .iter()
            .all(|r| !r.body.to_string().contains("an old mail")),
        "the mail from before the first start was not answered"
    );
}
