//! The gateway end to end with Feishu / Lark, in one process: the adapter
//! contract suite through the fake Open Platform and Feishu's encrypted,
//! signed events to the shared webhook listener, and what only Feishu
//! does (document comments, withdrawn parents, token refresh, posts).
#![cfg(feature = "feishu")]

use crate::contract;

use std::sync::Arc;
use std::time::Duration;

use contract::{AdapterKit, Rig, WAIT};
use talaria_core::{Config, Env};
use talaria_gateway::Adapter;
use talaria_platforms::feishu::{FeishuAdapter, FeishuSettings};
use talaria_platforms::registry::{Built, Setup};
use talaria_testkit::Reply;
use talaria_testkit::kit::PlatformKit;
use talaria_testkit::kit::Who;
use talaria_testkit::kit::feishu::{ADA, BOT, FeishuKit, FeishuSocketKit, MALLORY};

impl AdapterKit for FeishuKit {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        Arc::new(feishu_adapter(config, env))
    }

    fn build(&self, setup: &Setup<'_>) -> Built {
        let adapter = feishu_adapter(setup.config, setup.env);
        let mount = adapter.mount();
        Built {
            adapter: Arc::new(adapter),
            mount: Some(mount),
        }
    }
}

impl AdapterKit for FeishuSocketKit {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        Arc::new(feishu_adapter(config, env))
    }
}

/// The adapter as the registry builds it, except that back-offs that
/// name no wait are short.
fn feishu_adapter(config: &Config, env: &Env) -> FeishuAdapter {
    let settings = FeishuSettings::from_config(&config.section().unwrap(), env)
        .expect("the Feishu settings resolve")
        .expect("Feishu is on");
    let settings = FeishuSettings {
        rate_limit_wait: Duration::from_millis(10),
        ..settings
    };
    FeishuAdapter::new(settings).expect("the Feishu adapter")
}

adapter_contract!(FeishuKit;
    run: dm_turn, thread_reply, group_mention, long_answer_split, redelivery, rate_limit,
         unauthorized, media_in, media_out;
    skip: dropped_connection => contract::Skip::Connectionless);

/// The same suite over the long connection (the ancestor's default).
mod socket {
    use talaria_testkit::kit::feishu::FeishuSocketKit;

    adapter_contract!(FeishuSocketKit;
        run: dm_turn, thread_reply, group_mention, long_answer_split, redelivery,
             dropped_connection, rate_limit, unauthorized, media_in, media_out;
        skip:);
}

/// A comment notice over the long connection is answered in its thread
/// too, and every event frame was answered with code 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_comment_over_the_long_connection_is_answered_in_its_thread() {
    let rig = Rig::<FeishuSocketKit>::started(&[], |_| {}).await;
    rig.kit.0.fake.add_comment(
        "doxcnWS",
        "Spec",
        "7200",
        "the API",
        &[("8200", "which API?")],
        0,
    );
    rig.llm.push(Reply::text("The REST one."));
    rig.kit.0.push_comment(ADA, BOT, "doxcnWS", "7200", "8200");
    let replies = rig.kit.0.fake.wait_for_comment_replies(1, WAIT).await;
    assert_eq!(replies[0].comment_id.as_deref(), Some("7200"));
    assert_eq!(replies[0].text, "The REST one.");
    rig.kit.wait_acknowledged().await;
}

/// A comment that mentions the bot on a document gets the answer in its
/// thread; the model saw the document's title, the quoted text and the
/// question; the same event delivered again is answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_comment_mentioning_the_bot_gets_the_answer_in_its_thread() {
    let rig = Rig::<FeishuKit>::started(&[], |_| {}).await;
    // The first read finds nothing yet, as right after a real notice.
    rig.kit.fake.add_comment(
        "doxcnPLAN",
        "Launch plan",
        "7001",
        "ship on Friday",
        &[("8001", " is Friday realistic?")],
        1,
    );
    rig.llm.push(Reply::text("Friday works if QA signs off."));
    let envelope = rig.kit.push_comment(ADA, BOT, "doxcnPLAN", "7001", "8001");
    let replies = rig.kit.fake.wait_for_comment_replies(1, WAIT).await;
    assert_eq!(replies[0].comment_id.as_deref(), Some("7001"));
    assert_eq!(replies[0].file_token, "doxcnPLAN");
    assert_eq!(replies[0].file_type, "docx");
    assert_eq!(replies[0].text, "Friday works if QA signs off.");
    let asked = rig.user_messages(0);
    let question = asked.last().unwrap();
    assert!(question.contains("Launch plan"), "{question}");
    assert!(question.contains("ship on Friday"), "{question}");
    assert!(question.ends_with("is Friday realistic?"), "{question}");
    // Feishu delivers the same notice again: no second turn.
    rig.kit.deliver(envelope);
    // Nor for notices addressed elsewhere or written by the bot itself.
    rig.kit
        .push_comment(ADA, "ou_someone_else", "doxcnPLAN", "7001", "8002");
    rig.kit.push_comment(BOT, BOT, "doxcnPLAN", "7001", "8003");
    rig.kit.wait_acknowledged().await;
    // The adapter takes a comment on a task of its own (it reads the
    // comment first), so the marker's order behind them rests on those
    // tasks' head start, not on the runner's intake alone.
    rig.barrier().await;
    assert_eq!(rig.llm.requests().len(), 2, "one turn, and the marker's");
    assert_eq!(rig.kit.fake.comment_replies().len(), 1);
    let sent = rig.kit.sent();
    assert_eq!(
        sent.len(),
        1,
        "only the marker's answer went to a chat: {sent:?}"
    );
}

/// A comment thread that takes no replies (1069302) gets a new
/// whole-document comment instead; a stranger's comment gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_comment_thread_gets_a_new_comment_and_strangers_nothing() {
    let rig = Rig::<FeishuKit>::started(&[], |_| {}).await;
    rig.kit.fake.add_comment(
        "doxcnX",
        "Notes",
        "7100",
        "",
        &[("8100", "summarise"), ("8101", "summarise please")],
        0,
    );
    rig.kit.fake.close_comment("7100");
    rig.kit.push_comment(MALLORY, BOT, "doxcnX", "7100", "8100");
    rig.llm.push(Reply::text("A short summary."));
    rig.kit.push_comment(ADA, BOT, "doxcnX", "7100", "8101");
    let replies = rig.kit.fake.wait_for_comment_replies(1, WAIT).await;
    assert_eq!(replies[0].comment_id, None, "a new whole-document comment");
    assert_eq!(replies[0].text, "A short summary.");
    rig.barrier().await;
    assert_eq!(
        rig.llm.requests().len(),
        2,
        "the stranger started a turn besides Ada's and the marker's"
    );
    assert_eq!(rig.kit.fake.comment_replies().len(), 1);
}

/// A reply to a withdrawn message (230011) is sent to the chat instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_to_a_withdrawn_message_is_sent_to_the_chat() {
    let rig = Rig::<FeishuKit>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("still here"));
    let asked = rig.kit.push_dm(Who::Friend, "are you there?");
    // Withdrawn before the answer is ready.
    rig.kit.fake.withdraw(&asked);
    let sent = rig.wait_for_text("still here").await;
    let answer = sent.iter().find(|o| o.text == "still here").unwrap();
    assert_eq!(answer.chat, rig.kit.dm_chat(Who::Friend));
    assert_eq!(answer.reply_to, None, "created, not a reply");
}

/// Markdown goes out as a post with one `md` element; an invalid tenant
/// token is replaced and the call made once more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markdown_is_a_post_and_an_invalid_token_is_refreshed_once() {
    let rig = Rig::<FeishuKit>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("Hello **Ada**."));
    rig.kit.push_dm(Who::Friend, "hi");
    rig.sent(1).await;
    let first = rig.kit.fake.sent();
    assert_eq!(first[0].msg_type, "post");
    assert_eq!(first[0].text, "Hello **Ada**.");
    rig.wait_for_delivered(1).await;
    let issued = rig.kit.fake.tokens_issued();
    rig.kit.fake.invalidate_token();
    rig.llm.push(Reply::text("plain again"));
    rig.kit.push_dm(Who::Friend, "again");
    rig.wait_for_text("plain again").await;
    assert_eq!(rig.kit.fake.sent()[1].msg_type, "text");
    assert_eq!(rig.kit.fake.tokens_issued(), issued + 1);
    assert!(rig.kit.fake.unauthorized() >= 1);
}
