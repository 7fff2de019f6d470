//! The learning graph from a real home: who wrote each skill (the agent,
//! asked or not; the user; Talaria's bundle), skill and memory links
//! (bundled skills included), the JSON shape and DOT; and the HTML page laid
//! out by headless Chromium, measured from its DOM (every node and label
//! inside the canvas, no two labels overlapping, a legend with the graph's
//! counts), with screenshots kept.

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use chrono::Utc;
use serde_json::Value;
use talaria_agent::tools::Registry;
use talaria_agent::{Agent, NullObserver};
use talaria_core::Home;
use talaria_learning::graph::{self, Graph, Group};
use talaria_learning::skills::Library;
use talaria_learning::skills::usage::Event;
use talaria_learning::{skill_history, skill_tools};
use talaria_testkit::{MockOpenAi, Reply, ToolCallReply};
use tokio_util::sync::CancellationToken;

fn skill_md(name: &str, related: &[&str]) -> String {
    format!(
        "---\nname: {name}\ndescription: The {name} procedure.\nrelated_skills: [{}]\n---\n1. Do it.\n",
        related.join(", ")
    )
}

/// A home with skills of each kind and two memory files.
fn home() -> (tempfile::TempDir, Home, Library) {
    let (dir, home) = support::home();
    let lib = Library::new(&home);
    let now = Utc::now();
    lib.create(
        "deploy-api",
        Some("ops"),
        &skill_md(
            "deploy-api",
            &["rotate-logs", "never-used", "system-health"],
        ),
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
        "# Deploys\nThe API deploy goes through deploy-api on the blue hosts.\n§\nLogs rotate nightly; rotate logs before a deploy.\n§\nThis repository squashes with git before merging.",
    )
    .unwrap();
    std::fs::write(
        home.memories_dir().join("USER.md"),
        "Prefers green tea, brewed short.",
    )
    .unwrap();
    (dir, home, lib)
}

fn ids_in(g: &Graph, group: Group) -> Vec<&str> {
    g.nodes
        .iter()
        .filter(|n| n.group == group)
        .map(|n| n.id.as_str())
        .collect()
}

fn edges(g: &Graph) -> Vec<(&str, &str)> {
    g.edges
        .iter()
        .map(|e| (e.source.as_str(), e.target.as_str()))
        .collect()
}

#[test]
fn the_graph_holds_every_skill_by_who_wrote_it_memory_cards_and_their_links() {
    let (_dir, home, lib) = home();
    let g = graph::build(&lib, &home);
    assert_eq!(ids_in(&g, Group::Learned), ["brew-tea", "deploy-api"]);
    // Written by the user: theirs, used or not.
    assert_eq!(ids_in(&g, Group::Yours), ["never-used", "rotate-logs"]);
    assert_eq!(
        ids_in(&g, Group::Bundled),
        [
            "writing-skills",
            "system-health",
            "git-workflow",
            "systematic-debugging"
        ]
    );
    assert_eq!(
        ids_in(&g, Group::Memory),
        [
            "memory:memory:0",
            "memory:memory:1",
            "memory:memory:2",
            "memory:profile:3"
        ]
    );
    assert_eq!(g.memory[0].title, "Deploys");
    let edges = edges(&g);
    // related_skills, once per pair, bundled skills included (the bundled
    // git-workflow and systematic-debugging name each other).
    let skill_links: Vec<_> = edges
        .iter()
        .filter(|e| !e.0.starts_with("memory:"))
        .copied()
        .collect();
    assert_eq!(
        skill_links,
        [
            ("deploy-api", "never-used"),
            ("deploy-api", "rotate-logs"),
            ("deploy-api", "system-health"),
            ("git-workflow", "systematic-debugging"),
        ]
    );
    // Cards link to the skills they talk about, bundled ones too.
    for link in [
        ("memory:memory:0", "deploy-api"),
        ("memory:memory:1", "rotate-logs"),
        ("memory:memory:2", "git-workflow"),
        ("memory:profile:3", "brew-tea"),
    ] {
        assert!(edges.contains(&link), "{link:?} in {edges:?}");
    }
    // The counts say what they count.
    let s = &g.stats;
    assert_eq!(
        (
            s.learned_skills,
            s.your_skills,
            s.bundled_skills,
            s.memory_nodes
        ),
        (2, 2, 4, 4)
    );
    assert_eq!(s.nodes, g.nodes.len());
    assert_eq!(s.links, g.edges.len());
    assert_eq!(s.related_edges + s.memory_skill_edges, s.links);
    assert_eq!(s.agent_created, 2);
    assert_eq!(s.used, 1);
    let linked = g
        .nodes
        .iter()
        .filter(|n| g.edges.iter().any(|e| e.source == n.id || e.target == n.id))
        .count();
    assert_eq!(s.linked_nodes, linked);
    assert_eq!(g.clusters[0].category, "memory");
    // The JSON names fields as the ancestor's payload does, with the group.
    let json = serde_json::to_value(&g).unwrap();
    let node = |id: &str| {
        json["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(node("deploy-api")["createdBy"], "agent");
    assert_eq!(node("deploy-api")["group"], "learned");
    assert_eq!(node("rotate-logs")["useCount"], 1);
    assert_eq!(node("rotate-logs")["createdBy"], "user");
    assert_eq!(node("git-workflow")["group"], "bundled");
    assert_eq!(node("memory:memory:0")["memorySource"], "memory");
    assert!(json["stats"]["edges_per_node"].is_number());
    let dot = graph::to_dot(&g);
    assert!(
        dot.starts_with("graph learning {") && dot.contains("\"deploy-api\" -- \"rotate-logs\";")
    );
    assert!(
        dot.contains("\"git-workflow\" [label=\"git-workflow\", shape=ellipse, style=dashed];")
    );
}

fn agent(home: &Home, llm: &MockOpenAi, lib: Arc<Library>) -> Agent {
    let config = support::config(llm, |_| {});
    let mut registry = Registry::with_core_tools(&config);
    for tool in skill_tools(lib) {
        registry.register(tool).unwrap();
    }
    support::agent(
        &config,
        home,
        llm,
        support::store(home),
        registry,
        home.root(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skill_the_agent_wrote_because_the_user_asked_is_learned() {
    let (_dir, home) = support::home();
    let llm = MockOpenAi::start().await;
    let lib = Arc::new(Library::new(&home));
    let agent = agent(&home, &llm, lib.clone());
    let session = agent.new_session("cli").await.unwrap();
    let args = serde_json::json!({
        "action": "create",
        "name": "rotate-logs",
        "category": "ops",
        "content": skill_md("rotate-logs", &["system-health"]),
    });
    llm.push(Reply::tool_calls(vec![ToolCallReply::new(
        "c1",
        "skill_manage",
        args.to_string(),
    )]));
    llm.push(Reply::text("Saved it as the skill rotate-logs."));
    agent
        .run_turn(
            &session,
            "please write down how we rotate the logs as a skill",
            &NullObserver,
            CancellationToken::new(),
        )
        .await
        .unwrap();

    let g = graph::build(&lib, &home);
    assert_eq!(ids_in(&g, Group::Learned), ["rotate-logs"]);
    assert!(ids_in(&g, Group::Yours).is_empty());
    assert_eq!(g.stats.learned_skills, 1);
    assert_eq!(g.stats.your_skills, 0);
    let node = g.nodes.iter().find(|n| n.id == "rotate-logs").unwrap();
    assert_eq!(node.created_by, "agent");
    // Its link to the bundled skill it names is drawn.
    assert!(
        edges(&g).contains(&("rotate-logs", "system-health")),
        "{:?}",
        g.edges
    );
    // The curator still leaves it alone: it was asked for, so it is not
    // marked as written of the agent's own accord.
    assert_eq!(lib.usage().get("rotate-logs").created_by, None);

    // Undone, then written again by hand: the user's.
    skill_history::rollback_skill(&lib, "rotate-logs").unwrap();
    assert!(
        graph::build(&lib, &home)
            .nodes
            .iter()
            .all(|n| n.id != "rotate-logs")
    );
    lib.create(
        "rotate-logs",
        Some("ops"),
        &skill_md("rotate-logs", &[]),
        None,
        Utc::now(),
    )
    .unwrap();
    let g = graph::build(&lib, &home);
    assert_eq!(ids_in(&g, Group::Yours), ["rotate-logs"]);
    assert!(ids_in(&g, Group::Learned).is_empty());
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

fn headless(profile: &Path, size: (u32, u32)) -> Command {
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
    ])
    .arg(format!("--window-size={},{}", size.0, size.1))
    .arg(format!("--user-data-dir={}", profile.display()));
    c
}

/// Run after the page's own script has laid the graph out: reads where
/// every node's mark and label ended up, the canvas, the window, the links
/// and the legend's counts, and leaves them in the DOM as JSON (every
/// character outside printable ASCII escaped, so the DOM dump keeps it
/// intact).
const MEASURE: &str = r##"<script>
(() => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const out = {
    viewport: [0, 0, window.innerWidth, window.innerHeight],
    canvas: box(document.getElementById("graph")),
    nodes: [...document.querySelectorAll("#graph .node")].map(g => ({
      id: g.dataset.id,
      group: g.dataset.group,
      mark: box(g.querySelector(".mark")),
      label: box(g.querySelector(".label")),
      text: g.querySelector(".label").textContent,
    })),
    links: document.querySelectorAll("#graph .link").length,
    legend: Object.fromEntries([...document.querySelectorAll("#legend [data-group]")]
      .map(li => [li.dataset.group, Number(li.querySelector(".count").textContent)])),
  };
  const pre = document.createElement("pre");
  pre.id = "measured";
  pre.textContent = JSON.stringify(out)
    .replace(/[^\x20-\x7e]|[&<>]/g, c => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));
  document.body.append(pre);
})();
</script>
</body>"##;

type Rect = [f64; 4];

fn rect(v: &Value) -> Rect {
    let a: Vec<f64> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    [a[0], a[1], a[2], a[3]]
}

/// `inner` lies within `outer` (half a pixel of rounding allowed).
fn inside(inner: &Rect, outer: &Rect) -> bool {
    inner[0] >= outer[0] - 0.5
        && inner[1] >= outer[1] - 0.5
        && inner[2] <= outer[2] + 0.5
        && inner[3] <= outer[3] + 0.5
}

fn overlap(a: &Rect, b: &Rect) -> bool {
    a[2].min(b[2]) > a[0].max(b[0]) && a[3].min(b[3]) > a[1].max(b[1])
}

/// Opens the page of `g` in headless Chromium at `size` and returns what
/// [`MEASURE`] read from it.
fn measure(dir: &Path, g: &Graph, size: (u32, u32)) -> Value {
    let page = dir.join(format!("measured-{}x{}.html", size.0, size.1));
    let html = graph::to_html(g);
    assert!(html.contains("</body>"));
    std::fs::write(&page, html.replacen("</body>", MEASURE, 1)).unwrap();
    let profile = tempfile::tempdir().unwrap();
    let out = headless(profile.path(), size)
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains(&format!("data-drawn=\"{}\"", g.nodes.len())),
        "{dom}"
    );
    let start = dom.find("<pre id=\"measured\">").expect("the measurements") + 19;
    let end = start + dom[start..].find("</pre>").unwrap();
    serde_json::from_str(&dom[start..end]).unwrap()
}

/// Checks a laid-out page against the graph: every node drawn once inside
/// the canvas, the canvas inside the window, no label over another label
/// or another node's mark, every link drawn, and the legend's counts equal
/// to the graph's.
fn check_layout(g: &Graph, m: &Value) {
    let viewport = rect(&m["viewport"]);
    let canvas = rect(&m["canvas"]);
    assert!(
        inside(&canvas, &viewport),
        "canvas {canvas:?} in {viewport:?}"
    );
    assert!(
        canvas[2] - canvas[0] > 100.0 && canvas[3] - canvas[1] > 100.0,
        "{canvas:?}"
    );
    let drawn = m["nodes"].as_array().unwrap();
    let mut ids: Vec<&str> = drawn.iter().map(|n| n["id"].as_str().unwrap()).collect();
    ids.sort_unstable();
    let mut expected: Vec<&str> = g.nodes.iter().map(|n| n.id.as_str()).collect();
    expected.sort_unstable();
    assert_eq!(ids, expected);
    for n in drawn {
        let (mark, label) = (rect(&n["mark"]), rect(&n["label"]));
        assert!(inside(&mark, &canvas), "{n} outside {canvas:?}");
        assert!(inside(&label, &canvas), "{n}'s label outside {canvas:?}");
        assert!(!n["text"].as_str().unwrap().is_empty(), "{n}");
        assert!(label[2] > label[0] && label[3] > label[1], "{n}");
    }
    for (i, a) in drawn.iter().enumerate() {
        for b in &drawn[i + 1..] {
            let (la, lb) = (rect(&a["label"]), rect(&b["label"]));
            assert!(!overlap(&la, &lb), "labels overlap: {a} and {b}");
            assert!(!overlap(&la, &rect(&b["mark"])), "{a}'s label over {b}");
            assert!(!overlap(&lb, &rect(&a["mark"])), "{b}'s label over {a}");
        }
    }
    assert_eq!(m["links"], g.edges.len());
    // The legend counts what is drawn, and what the graph holds.
    let mut per_group: BTreeMap<&str, usize> = BTreeMap::new();
    for n in drawn {
        *per_group.entry(n["group"].as_str().unwrap()).or_default() += 1;
    }
    let legend = &m["legend"];
    for (group, name, stat) in [
        (Group::Learned, "learned", g.stats.learned_skills),
        (Group::Yours, "yours", g.stats.your_skills),
        (Group::Bundled, "bundled", g.stats.bundled_skills),
        (Group::Memory, "memory", g.stats.memory_nodes),
    ] {
        let in_graph = g.nodes.iter().filter(|n| n.group == group).count();
        assert_eq!(stat, in_graph, "{name}");
        assert_eq!(legend[name], in_graph, "legend {name}: {legend}");
        assert_eq!(
            per_group.get(name).copied().unwrap_or(0),
            in_graph,
            "{name}"
        );
    }
    assert_eq!(legend["links"], g.edges.len(), "legend links: {legend}");
}

/// A screenshot of the page as it is, kept in the test's target directory
/// for a look.
fn screenshot(dir: &Path, g: &Graph, name: &str) {
    let page = dir.join(format!("{name}.html"));
    std::fs::write(&page, graph::to_html(g)).unwrap();
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.png"));
    let _ = std::fs::remove_file(&shot);
    let profile = tempfile::tempdir().unwrap();
    let out = headless(profile.path(), (1200, 800))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", page.display()))
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

#[test]
fn a_new_install_is_drawn_in_the_middle_of_the_canvas_with_its_legend() {
    let (dir, home) = support::home();
    let lib = Library::new(&home);
    std::fs::create_dir_all(home.memories_dir()).unwrap();
    std::fs::write(
        home.memories_dir().join("USER.md"),
        "Prefers short answers and git rebase over merges.",
    )
    .unwrap();
    let g = graph::build(&lib, &home);
    assert_eq!(g.stats.learned_skills, 0);
    assert_eq!(g.stats.bundled_skills, 4);
    assert_eq!(g.stats.memory_nodes, 1);
    assert!(
        edges(&g).contains(&("memory:profile:0", "git-workflow")),
        "{:?}",
        g.edges
    );

    let m = measure(dir.path(), &g, (1200, 800));
    check_layout(&g, &m);
    // A handful of nodes stays near the middle, not out in the corners.
    let canvas = rect(&m["canvas"]);
    let (w, h) = (canvas[2] - canvas[0], canvas[3] - canvas[1]);
    for n in m["nodes"].as_array().unwrap() {
        let mark = rect(&n["mark"]);
        let (x, y) = ((mark[0] + mark[2]) / 2.0, (mark[1] + mark[3]) / 2.0);
        assert!(
            x > canvas[0] + w * 0.1
                && x < canvas[2] - w * 0.1
                && y > canvas[1] + h * 0.1
                && y < canvas[3] - h * 0.1,
            "{n} near the edge of {canvas:?}"
        );
    }
    screenshot(dir.path(), &g, "learning-graph-new-install");
}

#[test]
fn a_grown_graph_is_drawn_inside_the_canvas_without_overlapping_labels() {
    let (dir, home, lib) = home();
    let now = Utc::now();
    // More learned skills, linked to each other and to bundled skills.
    let names = [
        "backup-postgres",
        "renew-certificates",
        "triage-alerts",
        "weekly-report",
        "fix-flaky-tests",
        "nginx-reload",
        "docker-cleanup",
        "kubernetes-rollout-with-a-rather-long-name-that-gets-cut",
        "python-venv-setup",
        "bisect-a-regression",
    ];
    for (i, name) in names.iter().enumerate() {
        let related = [names[(i + 1) % names.len()], "systematic-debugging"];
        lib.create(
            name,
            Some(if i % 2 == 0 { "ops" } else { "software" }),
            &skill_md(name, &related),
            Some("agent"),
            now,
        )
        .unwrap();
        for _ in 0..i {
            lib.usage().record(name, Event::Used, now);
        }
    }
    let mut memory = std::fs::read_to_string(home.memories_dir().join("MEMORY.md")).unwrap();
    for topic in [
        "Backups of postgres run at 02:00 and go to the NAS",
        "Certificates renew through certbot; nginx reload after",
        "The weekly report goes out on Fridays to the team list",
        "Flaky tests: retry once, then bisect the regression",
    ] {
        memory.push_str(&format!("\n§\n{topic}."));
    }
    std::fs::write(home.memories_dir().join("MEMORY.md"), memory).unwrap();
    let g = graph::build(&lib, &home);
    assert_eq!(g.stats.learned_skills, 12);
    assert!(g.nodes.len() >= 26, "{}", g.nodes.len());
    assert!(g.edges.len() >= 25, "{}", g.edges.len());

    let m = measure(dir.path(), &g, (1200, 800));
    check_layout(&g, &m);
    // The layout is seeded: the same graph lands in the same places.
    assert_eq!(measure(dir.path(), &g, (1200, 800))["nodes"], m["nodes"]);
    // A small window too: the drawing is scaled to fit, still apart.
    check_layout(&g, &measure(dir.path(), &g, (640, 480)));
    screenshot(dir.path(), &g, "learning-graph");
}
