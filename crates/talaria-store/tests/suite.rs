//! The crate's integration tests, linked as one binary: one link instead
//! of one per file keeps the build's size and time down. Every file here
//! is a module below; `every_test_file_is_a_module` fails when one is not.

#[macro_use]
mod common;

mod busy;
mod cluster;
mod concurrency;
mod copy;
mod cron;
mod gateway_inbound;
mod gateway_ledger;
mod gateway_pairing;
mod gateway_route_expiry;
mod gateway_routes;
mod imports;
mod media;
mod migrations;
mod owed_turns;
mod postgres_backend;
mod sanitizer;
mod search;
mod search_batches;
mod session_delete;
mod sessions;
mod shared_files;
mod spend;
mod thinking;
mod upkeep;

#[test]
fn every_test_file_is_a_module() {
    talaria_testkit::suite::check_every_file_is_a_module(
        env!("CARGO_MANIFEST_DIR"),
        include_str!("suite.rs"),
    );
}
