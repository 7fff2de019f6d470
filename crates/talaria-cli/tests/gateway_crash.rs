//! `talaria gateway run` as real processes, one platform after another
//! through its kit: a gateway killed (SIGKILL) while an answer is on the
//! wire loses nothing, and the restarted gateway sends it exactly once
//! with the recovery line (see `crash_support`).

use crate::crash_support;

use talaria_testkit::kit::bluebubbles::BlueBubblesKit;
use talaria_testkit::kit::dingtalk::DingTalkKit;
use talaria_testkit::kit::discord::DiscordKit;
use talaria_testkit::kit::email::EmailKit;
use talaria_testkit::kit::feishu::{FeishuKit, FeishuSocketKit};
use talaria_testkit::kit::google_chat::GoogleChatKit;
use talaria_testkit::kit::homeassistant::HomeAssistantKit;
use talaria_testkit::kit::irc::IrcKit;
use talaria_testkit::kit::line::LineKit;
use talaria_testkit::kit::matrix::MatrixKit;
use talaria_testkit::kit::mattermost::MattermostKit;
use talaria_testkit::kit::msgraph::MsGraphKit;
use talaria_testkit::kit::qqbot::QqbotKit;
use talaria_testkit::kit::signal::{PolledSignalKit, SignalKit};
use talaria_testkit::kit::slack::SlackKit;
use talaria_testkit::kit::sms::SmsKit;
use talaria_testkit::kit::telegram::TelegramKit;
use talaria_testkit::kit::webhook::WebhookKit;
use talaria_testkit::kit::wecom_bot::WecomBotKit;
use talaria_testkit::kit::wecom_callback::WecomCallbackKit;
use talaria_testkit::kit::weixin::WeixinKit;
use talaria_testkit::kit::whatsapp::WhatsappKit;
use talaria_testkit::kit::yuanbao::YuanbaoKit;

/// One crash test per platform kit.
macro_rules! crash_resend {
    ($($platform:ident: $kit:ty),* $(,)?) => {
        $(
            mod $platform {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_reply_cut_off_by_sigkill_is_sent_once_after_restart_with_the_recovery_line() {
                    crate::crash_support::reply_cut_off_by_sigkill_is_sent_once_after_restart::<$kit>()
                        .await;
                }
            }
        )*
    };
}

crash_resend!(
    telegram: super::TelegramKit,
    discord: super::DiscordKit,
    slack: super::SlackKit,
    mattermost: super::MattermostKit,
    matrix: super::MatrixKit,
    signal: super::SignalKit,
    signal_polled: super::PolledSignalKit,
    whatsapp: super::WhatsappKit,
    feishu: super::FeishuKit,
    feishu_socket: super::FeishuSocketKit,
    sms: super::SmsKit,
    homeassistant: super::HomeAssistantKit,
    webhook: super::WebhookKit,
    email: super::EmailKit,
    dingtalk: super::DingTalkKit,
    qqbot: super::QqbotKit,
    weixin: super::WeixinKit,
    yuanbao: super::YuanbaoKit,
    wecom_callback: super::WecomCallbackKit,
    wecom_bot: super::WecomBotKit,
    irc: super::IrcKit,
    line: super::LineKit,
    bluebubbles: super::BlueBubblesKit,
    google_chat: super::GoogleChatKit,
    msgraph: super::MsGraphKit,
);

/// A gateway killed between two files of one answer: the restarted
/// gateway sends only the file that did not go out, once, after the
/// recovery line; the text and the first file are not sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_two_files_of_an_answer_sends_each_part_once() {
    use talaria_store::{LedgerStore, ObligationState};
    use talaria_testkit::kit::{PlatformKit, Who};
    use talaria_testkit::{MockOpenAi, Reply};

    // Enough of a PNG and a PDF for their types to be read from the bytes.
    const PNG: &[u8] =
        b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89";
    const PDF: &[u8] = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<< >>\nendobj\n%%EOF\n";

    let llm = MockOpenAi::start().await;
    let kit = TelegramKit::start().await;
    let home = crash_support::kit_home(&llm, &kit);
    let work = home.root.join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("a.png"), PNG).unwrap();
    std::fs::write(work.join("b.pdf"), PDF).unwrap();
    let config = home.root.join("config.yaml");
    let mut yaml = std::fs::read_to_string(&config).unwrap();
    yaml.push_str(&format!("terminal:\n  cwd: {}\n", work.display()));
    std::fs::write(&config, yaml).unwrap();

    let mut first = crash_support::spawn_gateway(&home, &home.root.join("test-gateway.log"));
    kit.wait_connected(1).await;
    kit.fake.hold_uploads_after(Some(1usize));
    llm.push(Reply::text("Two files.\nMEDIA:a.png\nMEDIA:b.pdf"));
    kit.push_dm(Who::Friend, "send both");
    talaria_testkit::wait::wait_for("the second file's upload", || async {
        let asked = kit
            .fake
            .requests()
            .iter()
            .any(|r| r.method.eq_ignore_ascii_case("sendDocument"));
        if asked {
            Ok(())
        } else {
            Err(kit.fake.uploads().len())
        }
    })
    .await;
    first.kill().unwrap();
    first.wait().unwrap();
    assert_eq!(kit.fake.sent().len(), 1, "{}", crash_support::logs(&home));
    assert_eq!(kit.fake.uploads().len(), 1);

    kit.fake.hold_uploads_after(None);
    let seen = kit.connections();
    let mut second = crash_support::spawn_gateway(&home, &home.root.join("test-gateway-2.log"));
    kit.wait_connected(seen + 1).await;
    let uploads = kit
        .fake
        .wait_for_uploads(2, std::time::Duration::from_secs(30))
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let uploads_now = kit.fake.uploads();
    let methods: Vec<&str> = uploads_now.iter().map(|u| u.method.as_str()).collect();
    assert_eq!(
        methods,
        ["sendPhoto", "sendDocument"],
        "{}",
        crash_support::logs(&home)
    );
    assert_eq!(uploads[1].bytes, PDF);
    let texts: Vec<String> = kit.fake.sent().iter().map(|s| s.rendered()).collect();
    assert_eq!(
        texts.iter().filter(|t| t.contains("Two files.")).count(),
        1,
        "{texts:?}"
    );
    assert!(
        texts.iter().any(|t| t.starts_with("♻️ Recovered reply")),
        "the re-sent part is announced: {texts:?}"
    );
    assert_eq!(llm.requests().len(), 1, "the model is not asked again");
    let store = talaria_store::SqliteStore::open(&home.root.join("state.db")).unwrap();
    talaria_testkit::wait::wait_for("the answer delivered in the ledger", || async {
        let counts = store.obligation_counts().await.unwrap();
        if counts.get(&ObligationState::Delivered) == Some(&1) {
            Ok(())
        } else {
            Err(counts)
        }
    })
    .await;
    second.kill().unwrap();
    second.wait().unwrap();
}
