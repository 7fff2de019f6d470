//! The gateway end to end with Mattermost, in one process: the adapter
//! contract suite through the fake Mattermost server, and what only
//! Mattermost does.

use crate::contract;

use std::sync::Arc;

use contract::{AdapterKit, Rig};
use talaria_core::{Config, Env};
use talaria_gateway::Adapter;
use talaria_platforms::mattermost::{MattermostAdapter, MattermostSettings};
use talaria_testkit::Reply;
use talaria_testkit::kit::mattermost::MattermostKit;
use talaria_testkit::mattermost::NewPost;

impl AdapterKit for MattermostKit {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        let settings = MattermostSettings::from_config(&config.section().unwrap(), env).unwrap();
        Arc::new(MattermostAdapter::new(settings).unwrap())
    }
}

adapter_contract!(MattermostKit;
    run: dm_turn, group_mention, thread_reply, long_answer_split, redelivery, dropped_connection,
         rate_limit, unauthorized, media_in, media_out;
    skip: );

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmentioned_posts_are_ignored_and_a_thread_goes_on_without_a_mention() {
    let rig = Rig::<MattermostKit>::started(&[], |_| {}).await;
    let mm = &rig.kit.fake;
    let bot = mm.bot_username();
    rig.llm.push(Reply::text("Thread answer."));
    mm.push(NewPost::channel("town", "alice", "no mention, no answer"));
    let asked = mm.push(NewPost::channel(
        "town",
        "alice",
        &format!("@{bot} my name is Ada"),
    ));
    let posts = rig.wait_for_text("Thread answer.").await;
    assert_eq!(posts.len(), 1);
    // Shared chats name the speaker to the model.
    let asked_text = rig.user_messages(0);
    assert_eq!(asked_text.len(), 1);
    assert!(asked_text[0].starts_with("[useralice"), "{asked_text:?}");
    assert!(
        mm.typing()
            .iter()
            .any(|t| t.parent_id.as_deref() == Some(asked.as_str()))
    );
    // A reply in the thread needs no mention and continues the conversation.
    rig.llm.push(Reply::text("You are Ada."));
    mm.push(NewPost::channel("town", "alice", "who am I?").in_thread(&asked));
    let posts = rig.wait_for_text("You are Ada.").await;
    assert_eq!(posts[1].thread.as_deref(), Some(asked.as_str()));
    let history = rig.user_messages(1);
    assert_eq!(history.len(), 2, "{history:?}");
    assert!(history[0].ends_with("my name is Ada") && history[1].ends_with("who am I?"));
    rig.barrier().await;
    assert_eq!(rig.llm.requests().len(), 3, "two turns and the marker's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_code_block_cut_between_posts_is_closed_and_reopened_with_its_language() {
    let rig = Rig::<MattermostKit>::started(&[], |_| {}).await;
    let limit = talaria_platforms::mattermost::MAX_POST_CHARS;
    // Every part renders as code: the fence is closed in one part and
    // reopened, with its language, in the next.
    let mut code = String::from("Here:\n```rust\n");
    let mut n = 0;
    while code.chars().count() < limit + 2000 {
        code.push_str(&format!("let value_{n} = compute({n}); // keep going\n"));
        n += 1;
    }
    code.push_str("```\nDone.");
    rig.llm.push(Reply::text(code));
    rig.kit.fake.push(NewPost::dm("alice", "write code"));
    let posts = rig.wait_for_text("Done.").await;
    let parts: Vec<_> = posts.iter().filter(|p| p.wire.ends_with("/2)")).collect();
    assert_eq!(parts.len(), 2, "{posts:#?}");
    for p in &parts {
        assert!(p.wire.chars().count() <= limit);
        let fences = p.wire.lines().filter(|l| l.starts_with("```")).count();
        assert_eq!(fences % 2, 0, "unbalanced fence in {:?}", &p.wire[..80]);
    }
    assert!(parts[1].wire.starts_with("```rust\n"));
}
