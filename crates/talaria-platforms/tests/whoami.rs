//! `Adapter::whoami`, `talaria doctor`'s credential check, for the
//! platforms whose API has a cheap read that needs the credentials: each
//! adapter built as the registry builds it from its kit's section and
//! `.env`, asked against its fake with the right credentials (who they
//! belong to) and a wrong one (refused as the real API refuses it, and
//! the wrong secret never in the message); a platform that cannot be
//! reached is only that, not a refusal.

use std::path::Path;
use std::sync::Arc;

use talaria_core::{Config, Env, Home};
use talaria_gateway::AdapterError;
use talaria_platforms::registry::{PLATFORMS, Setup};
use talaria_store::SqliteStore;
use talaria_testkit::kit::PlatformKit;
use talaria_testkit::kit::bluebubbles::BlueBubblesKit;
use talaria_testkit::kit::dingtalk::{self, DingTalkKit};
use talaria_testkit::kit::email::EmailKit;
use talaria_testkit::kit::feishu::{self, FeishuKit};
use talaria_testkit::kit::google_chat::GoogleChatKit;
use talaria_testkit::kit::homeassistant::HomeAssistantKit;
use talaria_testkit::kit::line::LineKit;
use talaria_testkit::kit::qqbot::{self, QqbotKit};
use talaria_testkit::kit::signal::{self, SignalKit};
use talaria_testkit::kit::sms::SmsKit;
use talaria_testkit::kit::wecom_callback::{self, WecomCallbackKit};
use talaria_testkit::kit::whatsapp::{self, WhatsappKit};
use talaria_testkit::kit::yuanbao::YuanbaoKit;
use talaria_testkit::wait::WAIT;

/// The kit's platform built from `section` (indented under
/// `platforms:`) and the kit's `.env` with `env` on top, then asked whom
/// its credentials belong to.
async fn ask_with<K: PlatformKit>(
    kit: &K,
    section: &str,
    env: &[(&str, &str)],
) -> Result<String, AdapterError> {
    let yaml = format!("platforms:\n{section}");
    let (config, unknown) = Config::parse(&yaml, Path::new("kit.yaml")).unwrap();
    assert!(unknown.is_empty(), "{unknown:?}");
    let mut pairs = kit.dotenv();
    for (k, v) in env {
        pairs.retain(|(old, _)| old != k);
        pairs.push((k.to_string(), v.to_string()));
    }
    let env = Env::from_pairs(pairs);
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path().join("home"));
    home.ensure().unwrap();
    let store = Arc::new(SqliteStore::open(&home.state_db()).unwrap());
    let platform = PLATFORMS
        .iter()
        .find(|p| p.name == K::NAME)
        .expect("the platform is registered");
    let built = (platform.build)(&Setup {
        home: &home,
        config: &config,
        env: &env,
        cursors: store,
        media: talaria_media::MediaCache::for_home(&home, &config.media),
        #[cfg(feature = "yuanbao")]
        yuanbao: Default::default(),
    })
    .unwrap_or_else(|e| panic!("{} is not set up: {e:?}", K::NAME))
    .unwrap_or_else(|| panic!("{} is not on", K::NAME));
    tokio::time::timeout(WAIT, built.adapter.whoami())
        .await
        .expect("an answer in time")
        .expect("the platform has a question to ask")
}

/// [`ask_with`] the kit's own section.
async fn ask<K: PlatformKit>(kit: &K, env: &[(&str, &str)]) -> Result<String, AdapterError> {
    ask_with(kit, &kit.section(), env).await
}

/// Asks with the right credentials, expecting every one of `names` in
/// the answer; then with `wrong` in the environment, expecting a refusal
/// that does not quote the wrong secret.
async fn right_then_wrong<K: PlatformKit>(kit: &K, names: &[&str], wrong: (&str, &str)) {
    let who = ask(kit, &[])
        .await
        .unwrap_or_else(|e| panic!("{}: {e:?}", K::NAME));
    for name in names {
        assert!(who.contains(name), "{}: {who:?} names no {name:?}", K::NAME);
    }
    match ask(kit, &[wrong]).await {
        Err(AdapterError::Fatal(m)) => {
            assert!(!m.contains(wrong.1), "{}: the secret shows: {m}", K::NAME);
        }
        other => panic!("{}: expected a refusal, got {other:?}", K::NAME),
    }
}

/// A local port nothing listens on.
fn dead_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn line_names_the_bot_of_the_channel_access_token() {
    let kit = LineKit::start().await;
    right_then_wrong(
        &kit,
        &["Talaria", "@123fakeb"],
        ("LINE_CHANNEL_ACCESS_TOKEN", "a-token-line-does-not-know"),
    )
    .await;
}

#[tokio::test]
async fn twilio_names_the_account_of_the_sid_and_auth_token() {
    let kit = SmsKit::start().await;
    right_then_wrong(
        &kit,
        &["Talaria test account"],
        ("TWILIO_AUTH_TOKEN", "a-token-twilio-does-not-know"),
    )
    .await;
}

#[tokio::test]
async fn home_assistant_accepts_the_long_lived_token() {
    let kit = HomeAssistantKit::start().await;
    let url = kit.fake.url();
    right_then_wrong(
        &kit,
        &[url.as_str()],
        ("HASS_TOKEN", "a-token-home-assistant-does-not-know"),
    )
    .await;
}

#[tokio::test]
async fn whatsapp_names_the_business_number_and_refuses_another_numbers_id() {
    let kit = WhatsappKit::start().await;
    right_then_wrong(
        &kit,
        &[
            talaria_testkit::whatsapp::VERIFIED_NAME,
            talaria_testkit::whatsapp::DISPLAY_PHONE_NUMBER,
            whatsapp::NUMBER,
        ],
        ("WHATSAPP_CLOUD_TOKEN", "EAAG-a-token-graph-does-not-know"),
    )
    .await;
    // A number the token does not reach: Graph's 400 with code 100.
    match ask(
        &kit,
        &[("WHATSAPP_CLOUD_PHONE_NUMBER_ID", "999999999999999")],
    )
    .await
    {
        Err(AdapterError::Fatal(m)) => assert!(m.contains("phone number id"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn bluebubbles_names_the_server_and_its_icloud_account() {
    let kit = BlueBubblesKit::start().await;
    right_then_wrong(
        &kit,
        &["1.9.9", talaria_testkit::bluebubbles::ICLOUD_ACCOUNT],
        (
            "BLUEBUBBLES_PASSWORD",
            "a-password-the-server-does-not-know",
        ),
    )
    .await;
}

#[tokio::test]
async fn signal_names_the_account_the_rest_api_holds() {
    let kit = SignalKit::start().await;
    let who = ask(&kit, &[]).await.unwrap();
    assert!(who.contains(signal::BOT), "{who}");
    // An account the server does not hold cannot receive anything.
    match ask(&kit, &[("SIGNAL_ACCOUNT", "+15550001234")]).await {
        Err(AdapterError::Fatal(m)) => assert!(m.contains("does not hold"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn feishu_names_the_bot_of_the_app() {
    let kit = FeishuKit::start().await;
    right_then_wrong(
        &kit,
        &["Talaria", feishu::BOT],
        ("FEISHU_APP_SECRET", "a-secret-feishu-does-not-know"),
    )
    .await;
}

#[tokio::test]
async fn dingtalk_accepts_the_apps_key_and_secret() {
    let kit = DingTalkKit::start().await;
    right_then_wrong(
        &kit,
        &[dingtalk::CLIENT_ID],
        ("DINGTALK_CLIENT_SECRET", "a-secret-dingtalk-does-not-know"),
    )
    .await;
}

#[tokio::test]
async fn wecom_accepts_the_corp_id_and_app_secret() {
    let kit = WecomCallbackKit::start().await;
    right_then_wrong(
        &kit,
        &[
            wecom_callback::CORP_ID,
            &wecom_callback::AGENT_ID.to_string(),
        ],
        ("WECOM_CALLBACK_CORP_SECRET", "a-secret-wecom-does-not-know"),
    )
    .await;
}

#[tokio::test]
async fn google_chat_names_the_service_account_and_refuses_a_key_google_does_not_know() {
    let kit = GoogleChatKit::start().await;
    // The same account's file with a key Google never issued.
    let mut file: serde_json::Value =
        serde_json::from_str(&kit.fake.service_account_json()).unwrap();
    file["private_key"] = talaria_testkit::google_chat::new_rsa_key_pem().into();
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other-key.json");
    std::fs::write(&other, file.to_string()).unwrap();
    let other = other.display().to_string();
    right_then_wrong(
        &kit,
        &[talaria_testkit::google_chat::APP_EMAIL],
        ("GOOGLE_CHAT_SERVICE_ACCOUNT_JSON", other.as_str()),
    )
    .await;
}

#[tokio::test]
async fn qq_accepts_the_app_id_and_secret() {
    let kit = QqbotKit::start().await;
    right_then_wrong(
        &kit,
        &[qqbot::APP_ID],
        ("QQ_CLIENT_SECRET", "a-secret-qq-does-not-know"),
    )
    .await;
}

#[tokio::test]
async fn yuanbao_names_the_bot_its_signed_token_is_for() {
    let kit = YuanbaoKit::start().await;
    right_then_wrong(
        &kit,
        &[talaria_testkit::yuanbao::BOT_ID],
        ("YUANBAO_APP_SECRET", "a-secret-yuanbao-does-not-know"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn email_logs_in_to_the_imap_server_and_out_again() {
    let kit = EmailKit::start().await;
    right_then_wrong(
        &kit,
        &[talaria_testkit::email::ADDRESS],
        ("EMAIL_PASSWORD", "a-password-dovecot-does-not-know"),
    )
    .await;
}

#[tokio::test]
async fn a_platform_that_cannot_be_reached_is_unchecked_not_refused() {
    let line = LineKit::start().await;
    let dead = format!("http://127.0.0.1:{}", dead_port());
    let section = line.section().replace(&line.fake.base_url(), &dead);
    let answer = ask_with(&line, &section, &[]).await;
    assert!(
        matches!(answer, Err(AdapterError::Disconnected(_))),
        "{answer:?}"
    );
    let sms = SmsKit::start().await;
    let section = sms.section().replace(&sms.fake.base_url(), &dead);
    let answer = ask_with(&sms, &section, &[]).await;
    assert!(
        matches!(answer, Err(AdapterError::Disconnected(_))),
        "{answer:?}"
    );
}
