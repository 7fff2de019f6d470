//! The curator under an injected clock: agent-written skills that go
//! unused turn stale, then are archived and can be restored; pinned,
//! cron-used, user-written and bundled skills are never touched; the first
//! look only notes the time, and runs are spaced by the interval.

use std::collections::HashSet;

use chrono::{DateTime, Duration, Utc};
use talaria_core::Home;
use talaria_core::config::CuratorConfig;
use talaria_learning::curator::{self, ARCHIVE_DIR};
use talaria_learning::skills::Library;
use talaria_learning::skills::usage::{Event, SkillState};

fn skill_md(name: &str) -> String {
    format!("---\nname: {name}\ndescription: The {name} procedure.\n---\n1. Do {name}.\n")
}

#[test]
fn unused_agent_skills_go_stale_then_to_the_archive_and_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path().join("home"));
    home.ensure().unwrap();
    let lib = Library::new(&home);
    let t0 = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
    let at = |days: i64| t0 + Duration::days(days);
    for name in ["idle-one", "pinned-one", "cron-one", "busy-one"] {
        lib.create(name, Some("auto"), &skill_md(name), Some("agent"), t0)
            .unwrap();
    }
    lib.create("users-own", None, &skill_md("users-own"), None, t0)
        .unwrap();
    lib.usage().change("pinned-one", |r| r.pinned = true);
    lib.usage().record("busy-one", Event::Used, t0);
    let cron: HashSet<String> = ["cron-one".to_owned()].into();
    let config = CuratorConfig::default();

    // The first look notes the time and changes nothing, even far later.
    assert_eq!(
        curator::run_if_due(&lib, &config, &cron, at(200)).unwrap(),
        None
    );
    // Within the week since, it does not run again.
    assert_eq!(
        curator::run_if_due(&lib, &config, &cron, at(203)).unwrap(),
        None
    );

    // Without a clock going back, a plain run at day 35 shows the rules.
    let report = curator::run(&lib, &config, &cron, at(35)).unwrap();
    assert_eq!(report.marked_stale, ["busy-one", "idle-one"]);
    assert!(report.archived.is_empty());
    let snapshot = report.snapshot.clone().unwrap();
    assert!(
        snapshot.join("auto/idle-one/SKILL.md").is_file(),
        "snapshot first"
    );
    for untouched in ["pinned-one", "cron-one", "users-own"] {
        assert_eq!(
            lib.usage().get(untouched).state,
            SkillState::Active,
            "{untouched}"
        );
    }

    // Using a stale skill revives it.
    lib.usage().record("busy-one", Event::Used, at(40));
    assert_eq!(lib.usage().get("busy-one").state, SkillState::Active);

    // At day 100 the never-used one is archived; the one used at day 40
    // is only stale again.
    let report = curator::run(&lib, &config, &cron, at(100)).unwrap();
    assert_eq!(report.archived, ["idle-one"]);
    assert_eq!(report.marked_stale, ["busy-one"]);
    assert!(lib.find("idle-one").is_none());
    assert!(
        home.skills_dir()
            .join(ARCHIVE_DIR)
            .join("auto/idle-one/SKILL.md")
            .is_file()
    );
    assert_eq!(lib.usage().get("idle-one").state, SkillState::Archived);
    assert!(!lib.index().contains("idle-one"));
    assert!(
        lib.index().contains("busy-one"),
        "stale skills stay offered"
    );
    for untouched in ["pinned-one", "cron-one", "users-own"] {
        assert!(lib.find(untouched).is_some(), "{untouched}");
    }
    // Bundled skills are never the curator's.
    assert!(lib.find("git-workflow").is_some());

    // Restored, it is back where it was, active and young again.
    let back = curator::restore(&lib, "idle-one", at(101)).unwrap();
    assert!(back.ends_with("auto/idle-one"));
    assert_eq!(lib.find("idle-one").unwrap().category, "auto");
    assert_eq!(lib.usage().get("idle-one").state, SkillState::Active);
    assert!(
        curator::run(&lib, &config, &cron, at(102))
            .unwrap()
            .archived
            .is_empty()
    );
    assert!(
        curator::restore(&lib, "idle-one", at(102)).is_err(),
        "nothing left to restore"
    );
}

#[test]
fn a_due_run_happens_once_per_interval_and_never_when_disabled() {
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path().join("home"));
    home.ensure().unwrap();
    let lib = Library::new(&home);
    let t0: DateTime<Utc> = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
    lib.create("old", None, &skill_md("old"), Some("agent"), t0)
        .unwrap();
    let none = HashSet::new();
    let off = CuratorConfig {
        enabled: false,
        ..CuratorConfig::default()
    };
    assert_eq!(curator::run_if_due(&lib, &off, &none, t0).unwrap(), None);
    let config = CuratorConfig::default();
    assert!(!curator::is_due(&lib, &off, t0));
    assert!(curator::is_due(&lib, &config, t0), "the first look is due");
    assert_eq!(curator::run_if_due(&lib, &config, &none, t0).unwrap(), None);
    let week = Duration::hours(168);
    assert!(!curator::is_due(&lib, &config, t0 + Duration::hours(1)));
    assert!(curator::is_due(&lib, &config, t0 + week));
    let report = curator::run_if_due(&lib, &config, &none, t0 + week)
        .unwrap()
        .expect("due after a week");
    assert!(report.is_empty(), "a week-old unused skill is left alone");
    assert_eq!(
        curator::run_if_due(&lib, &config, &none, t0 + week + Duration::hours(1)).unwrap(),
        None
    );
    let report = curator::run_if_due(&lib, &config, &none, t0 + Duration::days(120))
        .unwrap()
        .unwrap();
    assert_eq!(report.archived, ["old"]);
    assert!(report.summary().contains("archived old"));
}
