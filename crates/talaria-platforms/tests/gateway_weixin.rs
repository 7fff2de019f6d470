//! The gateway end to end over Weixin (iLink), in one process: the
//! adapter contract suite through the fake iLink API, and what only
//! Weixin does (the poll cursor kept across restarts, the context token,
//! the expired login told to the operator).

use crate::contract;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use contract::{AdapterKit, Rig, Skip};
use talaria_core::{Config, Env};
use talaria_gateway::{Adapter, Liveness};
use talaria_platforms::registry::{Built, Setup};
use talaria_platforms::weixin::{WeixinAdapter, WeixinSettings};
use talaria_store::CursorStore;
use talaria_testkit::Reply;
use talaria_testkit::kit::weixin::{WeixinKit, user};
use talaria_testkit::kit::{PlatformKit, Who};
use talaria_testkit::wait::wait_for;

impl AdapterKit for WeixinKit {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        weixin_adapter(config, env, Arc::new(Cursors::default()))
    }

    fn build(&self, setup: &Setup<'_>) -> Built {
        Built {
            adapter: weixin_adapter(setup.config, setup.env, setup.cursors.clone()),
            #[cfg(feature = "ingress")]
            mount: None,
        }
    }
}

/// The adapter as the registry builds it, its cursor in `cursors`, with
/// a failed poll retried quickly.
fn weixin_adapter(config: &Config, env: &Env, cursors: Arc<dyn CursorStore>) -> Arc<dyn Adapter> {
    let mut settings = WeixinSettings::from_config(&config.section().unwrap(), env)
        .unwrap()
        .unwrap();
    settings.timings.poll_retry = Duration::from_millis(50);
    settings.timings.poll_backoff = Duration::from_millis(100);
    Arc::new(WeixinAdapter::new(settings, cursors).unwrap())
}

/// Cursors in memory, for the adapter built only to ask its capabilities.
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

adapter_contract!(WeixinKit;
    run: dm_turn, long_answer_split, redelivery, rate_limit, unauthorized, media_in, media_out;
    skip: thread_reply => Skip::Threadless,
          group_mention => Skip::NoGroups,
          dropped_connection => Skip::Connectionless);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_echo_the_context_token_and_every_call_is_well_formed() {
    let rig = Rig::<WeixinKit>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("Hello **there**."));
    rig.kit.push_dm(Who::Friend, "hi");
    let sent = rig.kit.fake.wait_for_sent(1, contract::WAIT).await;
    let token = rig.kit.fake.context_token(user(Who::Friend));
    assert_eq!(sent[0].context_token, token);
    assert!(sent[0].client_id.starts_with("talaria-weixin-"));
    // WeChat shows text as typed: the answer goes as written.
    assert_eq!(sent[0].text, "Hello **there**.");
    assert!(rig.kit.fake.requests().iter().all(|r| r.well_formed));
    rig.wait_for_delivered(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cursor_survives_a_restart_so_nothing_is_answered_twice() {
    let mut rig = Rig::<WeixinKit>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("before"));
    rig.kit.push_dm(Who::Friend, "first");
    rig.wait_for_text("before").await;
    rig.wait_for_delivered(1).await;
    rig.restart().await;
    rig.llm.push(Reply::text("after"));
    rig.kit.push_dm(Who::Friend, "second");
    rig.wait_for_text("after").await;
    rig.barrier().await;
    assert_eq!(rig.llm.requests().len(), 3, "something was answered twice");
    assert_eq!(rig.kit.sent().len(), 3);
    // The polls after the restart started from the saved cursor.
    let polls: Vec<String> = rig
        .kit
        .fake
        .requests()
        .iter()
        .filter(|r| r.endpoint == "getupdates")
        .map(|r| r.body["get_updates_buf"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(
        polls.iter().filter(|c| c.is_empty()).count(),
        1,
        "{polls:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_login_stops_polling_and_says_how_to_log_in_again() {
    let rig = Rig::<WeixinKit>::started(&[], |_| {}).await;
    rig.kit.fake.expire_session();
    // Every poll that arrives from now on is answered -14.
    let expired = std::time::Instant::now();
    let (_, error) = wait_for("the expired login on the status board", || async {
        match rig.status() {
            Some((l, Some(e))) if e.contains("-14") => Ok((l, e)),
            other => Err(other),
        }
    })
    .await;
    assert!(error.contains("log in again"), "{error}");
    assert!(error.contains("WEIXIN_TOKEN"), "{error}");
    assert!(!error.contains(talaria_testkit::kit::weixin::TOKEN));
    // The board shows an error only once the adapter's run has returned,
    // and the next run is a fatal error's long backoff away: every poll
    // this run made is in. One answered -14 was enough to stop it.
    let polls_after: Vec<_> = rig
        .kit
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.endpoint == "getupdates" && r.at >= expired)
        .collect();
    assert!(
        polls_after.len() <= 1,
        "polled on after the login expired: {polls_after:?}"
    );
    assert_ne!(rig.status().map(|s| s.0), Some(Liveness::Live));
}
