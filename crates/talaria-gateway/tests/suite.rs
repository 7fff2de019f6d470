//! The crate's integration tests, linked as one binary: one link instead
//! of one per file keeps the build's size and time down. Every file here
//! is a module below; `every_test_file_is_a_module` fails when one is not.

mod control;
mod hooks;
mod ledger_sweep;
mod maintenance;

#[test]
fn every_test_file_is_a_module() {
    talaria_testkit::suite::check_every_file_is_a_module(
        env!("CARGO_MANIFEST_DIR"),
        include_str!("suite.rs"),
    );
}
