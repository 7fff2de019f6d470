//! The gateway end to end over Discord, in one process: the adapter
//! contract suite through the fake Discord (REST and gateway WebSocket),
//! and what only Discord does.

use crate::contract;

use std::sync::Arc;
use std::time::Duration;

use contract::{AdapterKit, Rig};
use talaria_core::{Config, Env};
use talaria_gateway::Adapter;
use talaria_platforms::discord::{DiscordAdapter, DiscordSettings, DiscordTimings};
use talaria_testkit::Reply;
use talaria_testkit::kit::discord::DiscordKit;

impl AdapterKit for DiscordKit {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        let mut settings = DiscordSettings::from_config(&config.section().unwrap(), env).unwrap();
        settings.timings = DiscordTimings {
            connect_timeout: Duration::from_secs(5),
            reidentify_delay: Duration::from_millis(50),
        };
        Arc::new(DiscordAdapter::new(settings).unwrap())
    }
}

adapter_contract!(DiscordKit;
    run: dm_turn, group_mention, thread_reply, long_answer_split, redelivery, dropped_connection,
         rate_limit, unauthorized, media_in, media_out;
    skip: );

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmentioned_chatter_is_ignored_and_the_parent_channel_is_a_conversation_of_its_own() {
    let rig = Rig::<DiscordKit>::started(&[], |_| {}).await;
    let dc = &rig.kit.fake;
    // Guild channels need a mention by default.
    dc.push_thread_message("7", "70", "7001", "42", "no mention here");
    dc.push_guild_message("7", "70", "42", "nor here");

    // The mention comes after them on the same connection: by its answer
    // both were decided on.
    rig.llm.push(Reply::text("thread answer"));
    let at = dc.mention();
    let id = dc.push_thread_message("7", "70", "7001", "42", &format!("{at} in the thread"));
    let sent = rig.wait_for_text("thread answer").await;
    rig.assert_nothing_owed().await;
    assert_eq!(
        rig.llm.requests().len(),
        1,
        "the unmentioned started a turn"
    );
    let asked = rig.user_messages(0);
    assert_eq!(asked.len(), 1, "{asked:?}");
    let reply = sent.iter().find(|s| s.text == "thread answer").unwrap();
    assert_eq!(reply.chat, "7001");
    assert_eq!(reply.reply_to.as_deref(), Some(id.as_str()));

    // The parent channel is a conversation of its own.
    rig.llm.push(Reply::text("channel answer"));
    dc.push_guild_message("7", "70", "42", &format!("{at} in the channel"));
    let sent = rig.wait_for_text("channel answer").await;
    let reply = sent.iter().find(|s| s.text == "channel answer").unwrap();
    assert_eq!(reply.chat, "70");
    let asked = rig.user_messages(1);
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(asked[0].ends_with("] in the channel"), "{asked:?}");
}
