use super::*;

#[test]
fn silence_is_recognised_where_models_put_it() {
    for silent in [
        "[SILENT]",
        "  [silent]  ",
        "[SILENT] nothing new today",
        "Checked everything.\n\n[SILENT]",
        "SILENT",
        "NO_REPLY",
        "**[SILENT]**",
    ] {
        assert!(is_silent(silent), "{silent:?}");
    }
    for loud in [
        "",
        "The build is red.",
        "Nothing is silent about this [SILENT] here",
        "silently failing tests: 3",
    ] {
        assert!(!is_silent(loud), "{loud:?}");
    }
}

#[test]
fn session_ids_name_the_job_and_the_occurrence() {
    let t = DateTime::from_timestamp(1_796_400_000, 0).unwrap();
    let id = session_id("0123456789ab", t);
    assert_eq!(id, "cron_0123456789ab_20261204_160000");
    assert!(talaria_core::ids::validate_path_component(&id).is_ok());
}

#[test]
fn output_pruning_keeps_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..5 {
        std::fs::write(dir.path().join(format!("2026-12-0{i}_00-00-00.md")), "x").unwrap();
    }
    std::fs::write(dir.path().join("notes.txt"), "kept").unwrap();
    prune_outputs(dir.path(), 2).unwrap();
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "2026-12-03_00-00-00.md",
            "2026-12-04_00-00-00.md",
            "notes.txt"
        ]
    );
}
