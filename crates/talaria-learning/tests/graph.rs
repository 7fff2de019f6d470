//! The learning graph from a real home: which skills count as learned,
//! skill and memory edges, the JSON shape and DOT; and the HTML page drawn
//! by headless Chromium, with a screenshot kept.

use std::path::{Path, PathBuf};
use std::process::Command;

use chrono::Utc;
use talaria_core::Home;
use talaria_learning::graph;
use talaria_learning::skills::Library;
use talaria_learning::skills::usage::Event;

fn skill_md(name: &str, related: &[&str]) -> String {
    format!(
        "---\nname: {name}\ndescription: The {name} procedure.\nrelated_skills: [{}]\n---\n1. Do it.\n",
        related.join(", ")
    )
}

/// A home with learned, unlearned and bundled skills and two memory files.
fn home() -> (tempfile::TempDir, Home, Library) {
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path().join("home"));
    home.ensure().unwrap();
    let lib = Library::new(&home);
    let now = Utc::now();
    lib.create(
        "deploy-api",
        Some("ops"),
        &skill_md("deploy-api", &["rotate-logs", "never-used"]),
        Some("agent"),
        now,
    )
    .unwrap();
    lib.create(
        "rotate-logs",
        Some("ops"),
        &skill_md("rotate-logs", &["deploy-api"]),
        None,
        now,
    )
    .unwrap();
    lib.usage().record("rotate-logs", Event::Used, now);
    lib.create("never-used", None, &skill_md("never-used", &[]), None, now)
        .unwrap();
    lib.create(
        "brew-tea",
        Some("home"),
        &skill_md("brew-tea", &[]),
        Some("agent"),
        now,
    )
    .unwrap();
    std::fs::create_dir_all(home.memories_dir()).unwrap();
    std::fs::write(
        home.memories_dir().join("MEMORY.md"),
        "# Deploys\nThe API deploy goes through deploy-api on the blue hosts.\n§\nLogs rotate nightly; rotate logs before a deploy.",
    )
    .unwrap();
    std::fs::write(
        home.memories_dir().join("USER.md"),
        "Prefers green tea, brewed short.",
    )
    .unwrap();
    (dir, home, lib)
}

#[test]
fn the_graph_holds_learned_skills_memory_cards_and_their_links() {
    let (_dir, home, lib) = home();
    let g = graph::build(&lib, &home);
    let skills: Vec<&str> = g
        .nodes
        .iter()
        .filter(|n| n.kind == "skill")
        .map(|n| n.id.as_str())
        .collect();
    // Created by the agent, or used: learned. Neither, or bundled: not.
    assert_eq!(skills, ["brew-tea", "deploy-api", "rotate-logs"]);
    let memory: Vec<&str> = g
        .nodes
        .iter()
        .filter(|n| n.kind == "memory")
        .map(|n| n.id.as_str())
        .collect();
    assert_eq!(
        memory,
        ["memory:memory:0", "memory:memory:1", "memory:profile:2"]
    );
    assert_eq!(g.memory[0].title, "Deploys");
    let edges: Vec<(&str, &str)> = g
        .edges
        .iter()
        .map(|e| (e.source.as_str(), e.target.as_str()))
        .collect();
    // related_skills between learned skills only, once per pair.
    assert_eq!(
        edges.iter().filter(|e| !e.0.starts_with("memory:")).count(),
        1
    );
    assert!(edges.contains(&("deploy-api", "rotate-logs")));
    // Cards link to the skills they talk about.
    assert!(
        edges.contains(&("memory:memory:0", "deploy-api")),
        "{edges:?}"
    );
    assert!(
        edges.contains(&("memory:memory:1", "rotate-logs")),
        "{edges:?}"
    );
    assert!(
        edges.contains(&("memory:profile:2", "brew-tea")),
        "{edges:?}"
    );
    assert_eq!(g.stats.learned_skills, 3);
    assert_eq!(g.stats.agent_created, 2);
    assert_eq!(g.stats.linked_nodes, 2);
    assert_eq!(g.stats.isolated_pct, 33.3);
    assert_eq!(g.clusters[0].category, "memory");
    // The JSON names fields as the ancestor's payload does.
    let json = serde_json::to_value(&g).unwrap();
    assert_eq!(json["nodes"][0]["useCount"], 0);
    assert_eq!(json["nodes"][1]["createdBy"], "agent");
    assert_eq!(json["nodes"][3]["memorySource"], "memory");
    assert!(json["stats"]["edges_per_node"].is_number());
    let dot = graph::to_dot(&g);
    assert!(
        dot.starts_with("graph learning {") && dot.contains("\"deploy-api\" -- \"rotate-logs\";")
    );
}

/// The Chromium binary: `TALARIA_CHROMIUM`, else Debian's.
fn chromium() -> PathBuf {
    let path = std::env::var_os("TALARIA_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    assert!(
        path.exists(),
        "this test needs headless Chromium: install Debian's `chromium` (.ci/run does) or set TALARIA_CHROMIUM"
    );
    path
}

fn headless(profile: &Path) -> Command {
    let mut c = Command::new(chromium());
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1200,800",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    c
}

#[test]
fn the_html_page_draws_every_node_in_headless_chromium() {
    let (dir, home, lib) = home();
    let g = graph::build(&lib, &home);
    let page = dir.path().join("graph.html");
    std::fs::write(&page, graph::to_html(&g)).unwrap();
    let url = format!("file://{}", page.display());
    let profile = tempfile::tempdir().unwrap();

    let dom = headless(profile.path())
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .unwrap();
    assert!(
        dom.status.success(),
        "{}",
        String::from_utf8_lossy(&dom.stderr)
    );
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(
        dom.contains(&format!("data-drawn=\"{}\"", g.nodes.len())),
        "{dom}"
    );
    assert_eq!(dom.matches("<circle").count(), g.nodes.len());
    assert_eq!(dom.matches("<line").count(), g.edges.len());
    assert!(dom.contains("3 learned skills · 3 memory cards"), "{dom}");

    // A screenshot, kept beside the test's target directory for a look.
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("learning-graph.png");
    let _ = std::fs::remove_file(&shot);
    let out = headless(profile.path())
        .arg(format!("--screenshot={}", shot.display()))
        .arg(&url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
}
