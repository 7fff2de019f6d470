//! The crate's integration tests, linked as one binary: one link instead
//! of one per file keeps the build's size and time down. Every file here
//! is a module below; `every_test_file_is_a_module` fails when one is not.

#[macro_use]
mod contract;
mod gateway_support;

mod cron;
mod dingtalk;
mod discord;
mod email;
mod feishu;
mod gateway_bluebubbles;
mod gateway_dingtalk;
mod gateway_discord;
mod gateway_email;
mod gateway_feishu;
mod gateway_feishu_cards;
mod gateway_google_chat;
mod gateway_homeassistant;
mod gateway_hooks;
mod gateway_irc;
mod gateway_line;
mod gateway_matrix;
mod gateway_mattermost;
mod gateway_msgraph;
mod gateway_names;
mod gateway_qqbot;
mod gateway_signal;
mod gateway_slack;
mod gateway_sms;
mod gateway_telegram;
mod gateway_webhook;
mod gateway_wecom;
mod gateway_wecom_bot;
mod gateway_weixin;
mod gateway_whatsapp;
mod gateway_yuanbao;
mod homeassistant;
mod irc;
mod matrix;
mod mattermost;
mod qqbot;
mod registry_docs;
mod resume_stored;
mod signal;
mod slack;
mod sms;
mod telegram;
mod webhook;
mod wecom;
mod wecom_bot;
mod weixin;
mod whatsapp;
mod whoami;
mod yuanbao;

#[test]
fn every_test_file_is_a_module() {
    talaria_testkit::suite::check_every_file_is_a_module(
        env!("CARGO_MANIFEST_DIR"),
        include_str!("suite.rs"),
    );
}
