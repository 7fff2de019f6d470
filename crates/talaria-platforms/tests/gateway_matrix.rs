//! The gateway end to end with Matrix, in one process: the adapter
//! contract suite through the fake homeserver, and what only Matrix does.

use crate::contract;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use contract::{AdapterKit, Rig};
use talaria_core::{Config, Env};
use talaria_gateway::Adapter;
use talaria_platforms::matrix::{MatrixAdapter, MatrixSettings};
use talaria_platforms::registry::{Built, Setup};
use talaria_store::CursorStore;
use talaria_testkit::Reply;
use talaria_testkit::kit::PlatformKit;
use talaria_testkit::kit::matrix::{ALICE, MALLORY, MatrixKit, TEAM};
use talaria_testkit::matrix::MAX_EVENT_BYTES;

impl AdapterKit for MatrixKit {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        matrix_adapter(config, env, Arc::new(Cursors::default()))
    }

    fn build(&self, setup: &Setup<'_>) -> Built {
        Built {
            adapter: matrix_adapter(setup.config, setup.env, setup.cursors.clone()),
            #[cfg(feature = "ingress")]
            mount: None,
        }
    }
}

/// The adapter as the registry builds it, keeping its sync position in
/// `cursors`, with a failed sync retried at once rather than after seconds.
fn matrix_adapter(config: &Config, env: &Env, cursors: Arc<dyn CursorStore>) -> Arc<dyn Adapter> {
    let mut settings = MatrixSettings::from_config(&config.section().unwrap(), env, None)
        .unwrap()
        .unwrap();
    settings.retry_base = Duration::from_millis(20);
    Arc::new(MatrixAdapter::new(settings, cursors).unwrap())
}

adapter_contract!(MatrixKit;
    run: dm_turn, group_mention, thread_reply, long_answer_split, redelivery, dropped_connection,
         rate_limit, unauthorized, media_in, media_out;
    skip: );

/// Sync positions in memory, for the adapter the suite builds only to ask
/// its capabilities (the running gateway keeps them in its SQLite file).
#[derive(Default)]
struct Cursors(Mutex<HashMap<(String, String), String>>);

#[async_trait]
impl CursorStore for Cursors {
    async fn cursor(&self, platform: &str, name: &str) -> talaria_store::Result<Option<String>> {
        let key = (platform.to_owned(), name.to_owned());
        Ok(self.0.lock().unwrap().get(&key).cloned())
    }

    async fn set_cursor(
        &self,
        platform: &str,
        name: &str,
        value: &str,
    ) -> talaria_store::Result<()> {
        let key = (platform.to_owned(), name.to_owned());
        self.0.lock().unwrap().insert(key, value.to_owned());
        Ok(())
    }

    async fn delete_cursor(&self, platform: &str, name: &str) -> talaria_store::Result<bool> {
        let key = (platform.to_owned(), name.to_owned());
        Ok(self.0.lock().unwrap().remove(&key).is_some())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markdown_is_sent_with_its_html_and_typing_comes_before_the_answer() {
    let rig = Rig::<MatrixKit>::started(&[], |_| {}).await;
    let hs = &rig.kit.fake;
    rig.llm.push(Reply::text("Hello from **Talaria**."));
    let dm = rig.kit.dm_chat(talaria_testkit::kit::Who::Friend);
    hs.push_text(&dm, ALICE, "hi there");
    let sent = hs.wait_for_sent(1, contract::WAIT).await;
    assert_eq!(sent[0].body(), "Hello from **Talaria**.");
    assert_eq!(
        sent[0].html().as_deref(),
        Some("<p>Hello from <strong>Talaria</strong>.</p>")
    );
    let typing = hs.typing();
    assert!(
        typing.iter().any(|t| t.room_id == dm && t.typing),
        "{typing:?}"
    );
    assert!(typing[0].at <= sent[0].at, "typing comes before the answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_answer_quotes_its_question_and_the_main_timeline_is_another_conversation() {
    let rig = Rig::<MatrixKit>::started(&[], |_| {}).await;
    let hs = &rig.kit.fake;
    let root = hs.push_text(TEAM, ALICE, "deploy thread");
    rig.llm.push(Reply::text("thread answer"));
    let asked = hs.push_thread_text(TEAM, ALICE, &root, "Talaria: is it done?");
    let sent = rig.wait_for_text("thread answer").await;
    // In the thread, the answer also quotes the message it answers.
    assert_eq!(sent[0].thread.as_deref(), Some(root.as_str()));
    assert_eq!(sent[0].reply_to.as_deref(), Some(asked.as_str()));

    hs.push_text(TEAM, ALICE, "unrelated chatter");
    rig.llm.push(Reply::text("main answer"));
    hs.push_text(TEAM, ALICE, "Talaria, hello");
    let sent = rig.sent(2).await;
    assert_eq!(sent[1].text, "main answer");
    assert_eq!(sent[1].thread, None);
    let main = rig.user_messages(1);
    assert_eq!(main.len(), 1, "the thread's history is not here: {main:?}");
    assert!(main[0].ends_with("] hello"), "{main:?}");
    rig.barrier().await;
    assert_eq!(
        rig.llm.requests().len(),
        3,
        "the chatter started a turn besides the two and the marker's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_part_of_a_long_answer_keeps_its_html_and_fits_an_event() {
    let rig = Rig::<MatrixKit>::started(&[], |_| {}).await;
    let limit = talaria_platforms::matrix::MAX_MESSAGE_LEN;
    rig.llm
        .push(Reply::text(talaria_testkit::kit::long_answer(limit * 2)));
    rig.kit
        .push_dm(talaria_testkit::kit::Who::Friend, "write a lot");
    let total = talaria_testkit::kit::part_count(&rig.sent(1).await[0].text)
        .expect("the first part carries (1/n)");
    rig.sent(total).await;
    for part in rig.kit.fake.sent() {
        assert!(part.content.to_string().len() <= MAX_EVENT_BYTES);
        assert!(part.html().is_some(), "ASCII parts keep their HTML");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_send_is_retried_as_the_same_transaction() {
    let rig = Rig::<MatrixKit>::started(&[], |_| {}).await;
    let hs = &rig.kit.fake;
    hs.fail_next_send_with_429(400);
    rig.llm.push(Reply::text("after the wait"));
    rig.kit
        .push_dm(talaria_testkit::kit::Who::Friend, "quick question");
    rig.sent(1).await;
    let attempts = hs.send_attempts();
    assert_eq!(attempts.len(), 2, "one refused, one accepted");
    assert!(attempts[1].at - attempts[0].at >= Duration::from_millis(400));
    assert_eq!(attempts[0].path, attempts[1].path, "the same transaction");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strangers_invite_is_not_accepted() {
    let rig = Rig::<MatrixKit>::started(&[], |_| {}).await;
    let hs = &rig.kit.fake;
    hs.invite("!trap:localhost", MALLORY, true);
    hs.invite("!welcome:localhost", ALICE, true);
    let joins = hs.wait_for_joins(1, contract::WAIT).await;
    // Invites of one sync batch are decided in no set order, so the join
    // is no proof that the stranger's was; the sync after the batch is:
    // the adapter asks for it once it has answered every invite.
    hs.wait_until_caught_up(contract::WAIT).await;
    assert_eq!(
        hs.joins(),
        vec!["!welcome:localhost".to_owned()],
        "{joins:?}"
    );
    assert!(hs.sent().is_empty());
    assert!(rig.llm.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resumes_from_the_saved_token() {
    let mut rig = Rig::<MatrixKit>::started(&[], |_| {}).await;
    let dm = rig.kit.dm_chat(talaria_testkit::kit::Who::Friend);
    let hs = &rig.kit.fake;
    rig.llm.push(Reply::text("Noted, Ada."));
    hs.push_text(&dm, ALICE, "my name is Ada");
    rig.sent(1).await;
    rig.kit.fake.wait_until_caught_up(contract::WAIT).await;
    rig.stop().await;

    rig.kit.fake.push_text(&dm, ALICE, "who am I?");
    rig.llm.push(Reply::text("You are Ada."));
    rig.start();
    let sent = rig.sent(2).await;
    assert_eq!(sent[1].text, "You are Ada.");
    rig.barrier().await;
    assert_eq!(rig.llm.requests().len(), 3, "something was answered twice");
    assert_eq!(rig.user_messages(1), vec!["my name is Ada", "who am I?"]);
    let fresh = rig
        .kit
        .fake
        .sync_calls()
        .iter()
        .filter(|c| c.since.is_none())
        .count();
    assert_eq!(fresh, 1, "the second gateway started from the saved token");
}
