//! The crate's integration tests, linked as one binary: one link instead
//! of one per file keeps the build's size and time down. Every file here
//! is a module below; `every_test_file_is_a_module` fails when one is not.

mod api_gateway;
mod crash_support;

mod api_openai_sdk;
mod api_responses_sdk;
mod api_rest;
mod api_runs;
mod approvals;
mod background;
mod backup;
mod browser;
mod cli;
mod cluster;
mod config_show;
mod config_write;
mod connections;
mod connector_resume;
mod cost;
mod cron;
mod dashboard;
mod dashboard_browser;
mod doctor;
mod gateway;
mod gateway_crash;
mod gateway_lifecycle;
mod gateway_matrix_synapse;
mod gateway_whatsapp;
mod homeassistant;
mod import_hermes;
mod isolation;
mod logs;
mod logs_cmd;
mod mcp;
mod messages;
mod metrics;
mod models;
mod probe;
mod profiles;
mod readme;
mod repl;
mod repl_commands;
mod secrets;
mod sessions_admin;
mod sessions_cli;
mod setup;
mod store_migrate;
mod text_tool_calls;
mod web;
mod webhook_replay;

#[test]
fn every_test_file_is_a_module() {
    talaria_testkit::suite::check_every_file_is_a_module(
        env!("CARGO_MANIFEST_DIR"),
        include_str!("suite.rs"),
    );
}
