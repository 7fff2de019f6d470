//! The guard for test crates that link all their files into one binary.
//!
//! With `autotests = false`, a file in `tests/` that the root does not
//! declare is never compiled, so its tests would silently not run. Each
//! root calls [`check_every_file_is_a_module`] from a test of its own.

use std::path::Path;

/// Panics, naming the files, when a `.rs` file directly in
/// `<manifest_dir>/tests` is neither declared by a `mod NAME;` line in
/// `root_source` nor a test target of its own in the manifest (a
/// `path = "tests/NAME.rs"` line, for a test that must run alone).
pub fn check_every_file_is_a_module(manifest_dir: &str, root_source: &str) {
    let manifest_path = Path::new(manifest_dir).join("Cargo.toml");
    let manifest = match std::fs::read_to_string(&manifest_path) {
        Ok(text) => text,
        Err(e) => panic!("reading {}: {e}", manifest_path.display()),
    };
    let own_targets: Vec<&str> = manifest
        .lines()
        .filter_map(|line| {
            let path = line.trim().strip_prefix("path")?.trim_start();
            path.strip_prefix('=')?
                .trim()
                .strip_prefix("\"tests/")?
                .strip_suffix(".rs\"")
        })
        .collect();
    let dir = Path::new(manifest_dir).join("tests");
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) => panic!("reading {}: {e}", dir.display()),
    };
    let declared: Vec<&str> = root_source
        .lines()
        .filter_map(|line| line.trim().strip_prefix("mod ")?.strip_suffix(';'))
        .collect();
    let mut missing: Vec<String> = entries
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter_map(|name| name.strip_suffix(".rs").map(str::to_owned))
        .filter(|stem| !declared.contains(&stem.as_str()) && !own_targets.contains(&stem.as_str()))
        .collect();
    missing.sort();
    assert!(
        missing.is_empty(),
        "tests/suite.rs does not declare {missing:?}: add `mod NAME;` for each, or their tests never run"
    );
}
