//! The gateway end to end with e-mail, in one process: real Dovecot (IMAP)
//! and SMTP servers on loopback, the mock LLM, a real SQLite file, and the
//! real runner, ledger, router and e-mail adapter between them. The
//! contract scenarios run through [`EmailKit`]; what only e-mail has is
//! tested below on the same rig.
#![cfg(feature = "email")]

use crate::contract;

use std::sync::Arc;

use contract::{AdapterKit, Rig};
use talaria_core::{Config, Env};
use talaria_gateway::{Adapter, Liveness};
use talaria_platforms::email::{EmailAdapter, EmailSettings};
use talaria_platforms::registry::{Built, Setup};
use talaria_store::{CursorStore, SqliteStore};
use talaria_testkit::Reply;
use talaria_testkit::email::{ADDRESS, SentMail};
use talaria_testkit::kit::email::EmailKit;
use talaria_testkit::kit::{PlatformKit, long_answer, part_count};
use talaria_testkit::wait::{WAIT, wait_for};

impl AdapterKit for EmailKit {
    /// For the adapter's declaration only: its position is kept nowhere
    /// lasting.
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        let dir = tempfile::tempdir().unwrap();
        let cursors = Arc::new(SqliteStore::open(&dir.path().join("state.db")).unwrap());
        email_adapter(config, env, cursors, None)
    }

    /// The adapter keeping its IMAP cursor in the gateway's store.
    fn build(&self, setup: &Setup<'_>) -> Built {
        Built {
            adapter: email_adapter(
                setup.config,
                setup.env,
                setup.cursors.clone(),
                Some(setup.media.clone()),
            ),
            mount: None,
        }
    }
}

/// The adapter; with `media`, attachments are stored in the gateway's
/// cache at intake, as the registry builds it.
fn email_adapter(
    config: &Config,
    env: &Env,
    cursors: Arc<dyn CursorStore>,
    media: Option<talaria_media::MediaCache>,
) -> Arc<dyn Adapter> {
    let settings = EmailSettings::from_config(&config.section().unwrap(), env).unwrap();
    let adapter = EmailAdapter::new(settings, cursors).unwrap();
    match media {
        Some(cache) => Arc::new(adapter.with_media(cache)),
        None => Arc::new(adapter),
    }
}

adapter_contract!(EmailKit;
    run: dm_turn, long_answer_split, dropped_connection, unauthorized, media_in, media_out;
    skip: thread_reply => contract::Skip::Threadless,
          group_mention => contract::Skip::NoGroups,
          redelivery => contract::Skip::DeliversOnce,
          rate_limit => contract::Skip::UnlimitedSends);

type EmailRig = Rig<EmailKit>;

/// The friend the kit allows.
const ALICE: &str = "alice@example.org";

async fn sent(rig: &EmailRig, n: usize) -> Vec<SentMail> {
    rig.kit.mail.wait_for_sent(n, WAIT).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mail_is_answered_in_its_thread_and_the_thread_is_one_conversation() {
    let rig = EmailRig::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("The answer is 42."));
    let uid = rig.kit.deliver_text(
        "Alice <alice@example.org>",
        "Question",
        "q1@example.org",
        "What is the answer?",
    );
    let sent_mail = sent(&rig, 1).await;
    let reply = &sent_mail[0];
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
    let flags = rig.kit.flags(uid);
    assert!(flags.contains("\\Seen"), "{flags}");

    // Alice answers the answer (her client adds another `Re:`): the reply
    // keeps one `Re:`, extends the thread's references, and the turn sees
    // the first exchange, since a mail thread is one conversation.
    let bot_id = reply
        .message_id
        .clone()
        .expect("the reply has a Message-ID");
    rig.llm.push(Reply::text("You are welcome."));
    rig.kit.deliver(&format!(
        "From: alice@example.org\nTo: {ADDRESS}\nSubject: RE: Re: Question\n\
         Message-ID: <q2@example.org>\nIn-Reply-To: <{bot_id}>\n\
         References: <q1@example.org> <{bot_id}>\n\nThanks!\n\n\
         On Friday, the bot wrote:\n> The answer is 42.\n"
    ));
    let sent_mail = sent(&rig, 2).await;
    assert_eq!(sent_mail[1].subject, "Re: Question");
    assert_eq!(sent_mail[1].in_reply_to.as_deref(), Some("q2@example.org"));
    assert_eq!(
        sent_mail[1].references,
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
    // IMAP never delivers a mail twice; a lost position fetches it again.
    let mut rig = EmailRig::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("First answer."));
    rig.kit
        .deliver_text(ALICE, "Once", "once@example.org", "only once, please");
    sent(&rig, 1).await;
    rig.wait_for_delivered(1).await;
    rig.stop().await;

    // The saved position is lost: the next gateway fetches the mail again.
    let validity = rig.kit.uid_validity();
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
    let seen = rig.kit.connections();
    rig.start();
    rig.kit.wait_connected(seen + 1).await;
    rig.llm.push(Reply::text("Second answer."));
    rig.kit
        .deliver_text(ALICE, "Twice", "twice@example.org", "a new question");
    let sent_mail = sent(&rig, 2).await;
    assert_eq!(sent_mail[1].text.trim_end(), "Second answer.");
    assert_eq!(
        sent_mail[1].in_reply_to.as_deref(),
        Some("twice@example.org")
    );
    rig.barrier().await;
    assert_eq!(
        rig.llm.requests().len(),
        3,
        "the old mail started a turn besides the new one and the marker"
    );
    assert_eq!(rig.kit.mail.sent().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_fatal_and_nothing_runs() {
    let mut rig = EmailRig::new(&[("EMAIL_PASSWORD", "not-the-password")], |_| {}).await;
    // A mail waits after the saved position the whole time: one the
    // adapter would answer, had it got in.
    let store = SqliteStore::open(&rig.home.state_db()).unwrap();
    store
        .set_cursor(
            "email",
            &format!("uid:{ADDRESS}:INBOX"),
            &format!("{}:0", rig.kit.uid_validity()),
        )
        .await
        .unwrap();
    drop(store);
    rig.kit
        .deliver_text(ALICE, "Hello?", "h@example.org", "anyone there?");
    rig.start();
    // The board shows an error only once the adapter's run has returned,
    // and the next run is a fatal error's long backoff away: what this
    // run did is all done.
    let error = wait_for("the adapter to give up on the login", || async {
        match rig.status() {
            Some((Liveness::Backoff, Some(e))) => Ok(e),
            other => Err(other),
        }
    })
    .await;
    assert!(error.contains("refused the login"), "{error}");
    assert!(error.contains("EMAIL_PASSWORD"), "{error}");
    assert!(!error.contains("not-the-password"), "{error}");
    rig.assert_nothing_owed().await;
    assert!(rig.llm.requests().is_empty());
    assert!(rig.kit.mail.sent().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_part_of_a_long_answer_is_a_reply_in_the_thread() {
    // That the parts fit and reassemble is the contract's
    // `long_answer_split`.
    let rig = EmailRig::started(&[], |_| {}).await;
    let limit = rig.capabilities().limits.max_len;
    rig.llm.push(Reply::text(long_answer(limit * 2 + 500)));
    rig.kit
        .deliver_text(ALICE, "Long", "long@example.org", "write a lot");
    let first = sent(&rig, 1).await;
    let total = part_count(first[0].text.trim_end()).expect("the first part carries (1/n)");
    // One answer, one ledger row, however many mails it took.
    rig.wait_for_delivered(1).await;
    let sent_mail = sent(&rig, total).await;
    for part in &sent_mail {
        assert_eq!(part.subject, "Re: Long");
        assert_eq!(part.in_reply_to.as_deref(), Some("long@example.org"));
        assert_eq!(part.references, vec!["long@example.org"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_never_reach_the_model_and_the_allowlist_ignores_case() {
    // A stranger is the contract's `unauthorized`.
    let rig = EmailRig::started(&[], |_| {}).await;
    rig.kit.deliver(&format!(
        "From: {ALICE}\nTo: {ADDRESS}\nSubject: Out of office\nAuto-Submitted: auto-replied\n\
         Message-ID: <ooo@example.org>\n\nI am away."
    ));
    rig.kit.deliver(&format!(
        "From: {ALICE}\nTo: {ADDRESS}\nSubject: News\nPrecedence: bulk\n\
         Message-ID: <news@example.org>\n\nOur newsletter."
    ));
    rig.kit.deliver(&format!(
        "From: MAILER-DAEMON@example.org\nTo: {ADDRESS}\nSubject: Undelivered\n\
         Message-ID: <bounce@example.org>\n\nThe mail could not be delivered."
    ));
    rig.kit.deliver(&format!(
        "From: {ADDRESS}\nTo: {ADDRESS}\nSubject: Me\nMessage-ID: <me@example.test>\n\nmyself"
    ));

    // The allowlist compares whole addresses, case-insensitively. Fetched
    // after the machines' mails, this one's answer is the barrier.
    rig.llm.push(Reply::text("Hi Alice."));
    rig.kit
        .deliver_text("Alice <ALICE@Example.ORG>", "Hi", "a1@example.org", "hello");
    let sent_mail = sent(&rig, 1).await;
    assert_eq!(sent_mail[0].text.trim_end(), "Hi Alice.");
    assert_eq!(sent_mail[0].rcpt_to, vec![ALICE]);
    rig.barrier().await;
    assert_eq!(
        rig.llm.requests().len(),
        2,
        "a machine's mail reached the model"
    );
    assert_eq!(rig.kit.mail.sent().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_picks_up_new_mail_without_waiting_for_a_poll() {
    // The kit sets an hour between polls: only IDLE brings mail in time.
    let rig = EmailRig::started(&[], |_| {}).await;
    for n in 1..=2 {
        rig.llm.push(Reply::text(format!("answer {n}")));
        rig.kit.deliver_text(
            ALICE,
            &format!("Question {n}"),
            &format!("idle{n}@example.org"),
            "quick?",
        );
        let sent_mail = sent(&rig, n).await;
        assert_eq!(sent_mail[n - 1].text.trim_end(), format!("answer {n}"));
        rig.wait_for_delivered(n as u64).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resumes_after_the_cursor_and_mail_from_before_the_first_start_is_history() {
    let mut rig = EmailRig::new(&[], |_| {}).await;
    // Mail from before the first start is history, not a question.
    rig.kit
        .deliver_text(ALICE, "Old", "old@example.org", "an old mail");
    rig.start();
    rig.kit.wait_connected(1).await;
    rig.llm.push(Reply::text("Noted, Ada."));
    rig.kit
        .deliver_text(ALICE, "Name", "n1@example.org", "my name is Ada");
    sent(&rig, 1).await;
    rig.wait_for_delivered(1).await;
    rig.stop().await;

    // Arrives while the gateway is down.
    rig.kit
        .deliver_text(ALICE, "Later", "n2@example.org", "are you back?");
    rig.llm.push(Reply::text("I am back."));
    rig.start();
    let sent_mail = sent(&rig, 2).await;
    assert_eq!(sent_mail[1].text.trim_end(), "I am back.");
    assert_eq!(sent_mail[1].subject, "Re: Later");
    rig.wait_for_delivered(2).await;
    rig.barrier().await;
    assert_eq!(rig.llm.requests().len(), 3, "something was answered twice");
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
