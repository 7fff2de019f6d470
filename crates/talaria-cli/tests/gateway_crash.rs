//! `talaria gateway run` as real processes, one platform after another
//! through its kit: a gateway killed (SIGKILL) while an answer is on the
//! wire loses nothing, and the restarted gateway sends it exactly once
//! with the recovery line (see `crash_support`).

mod crash_support;

use talaria_testkit::kit::discord::DiscordKit;
use talaria_testkit::kit::email::EmailKit;
use talaria_testkit::kit::homeassistant::HomeAssistantKit;
use talaria_testkit::kit::matrix::MatrixKit;
use talaria_testkit::kit::mattermost::MattermostKit;
use talaria_testkit::kit::signal::{PolledSignalKit, SignalKit};
use talaria_testkit::kit::slack::SlackKit;
use talaria_testkit::kit::sms::SmsKit;
use talaria_testkit::kit::telegram::TelegramKit;
use talaria_testkit::kit::webhook::WebhookKit;
use talaria_testkit::kit::whatsapp::WhatsappKit;

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
    sms: super::SmsKit,
    homeassistant: super::HomeAssistantKit,
    webhook: super::WebhookKit,
    email: super::EmailKit,
);
