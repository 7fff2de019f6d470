//! The crate's integration tests, linked as one binary: one link instead
//! of one per file keeps the build's size and time down. Every file here
//! is a module below; `every_test_file_is_a_module` fails when one is not.

mod tools_support;
mod turn_common;

mod ancestor_schemas;
mod anthropic_turns;
mod delegate;
mod execute_code;
mod patch;
mod processes;
mod shared_home;
mod todo_compression;
mod tool_sources;
mod tools_files;
mod tools_guard;
mod tools_memory;
mod tools_sandbox;
mod tools_search;
mod tools_session_search;
mod tools_terminal;
mod tools_todo_clarify;
mod turn_history;
mod turn_interrupt;
mod turn_loop;
mod turn_outbox;
mod turn_rewind;
mod turn_steer;
mod turn_weak_models;
mod vision_tool;

#[test]
fn every_test_file_is_a_module() {
    talaria_testkit::suite::check_every_file_is_a_module(
        env!("CARGO_MANIFEST_DIR"),
        include_str!("suite.rs"),
    );
}
