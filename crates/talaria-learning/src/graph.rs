//! The learning graph: what the agent has learned, as nodes and edges.
//!
//! Nodes are the learned skills (the user's skills that the agent created
//! or that were used at least once; bundled ones are built in, not learned)
//! and the memory cards (each entry of MEMORY.md and USER.md). Edges come
//! from `related_skills` between learned skills, and from each memory card
//! to the (at most four) learned skills whose names share the most words
//! with it. Rendered as JSON (the ancestor's payload shape), Graphviz DOT,
//! or one self-contained HTML page that draws the graph with no network.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::Serialize;
use talaria_core::Home;

use crate::skills::{Library, Origin};

/// Memory→skill edges per card.
const EDGES_PER_CARD: usize = 4;

/// A node as drawn.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    pub id: String,
    pub label: String,
    /// `skill` or `memory`.
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_source: Option<String>,
    /// Unix seconds of the last activity (skills) or the file (memory).
    pub timestamp: i64,
    pub category: String,
    pub use_count: u64,
    pub state: String,
    pub created_by: String,
    pub pinned: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Edge {
    pub source: String,
    pub target: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cluster {
    pub category: String,
    pub count: usize,
}

/// A memory entry as a card.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Card {
    pub id: String,
    /// `memory` (MEMORY.md) or `profile` (USER.md).
    pub source: String,
    pub timestamp: i64,
    pub title: String,
    pub body: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stats {
    pub nodes: usize,
    pub related_edges: usize,
    pub edges_per_node: f64,
    pub linked_nodes: usize,
    pub isolated_pct: f64,
    pub categories: usize,
    pub agent_created: usize,
    pub used: usize,
    pub top_categories: Vec<(String, usize)>,
    pub memory_nodes: usize,
    pub memory_skill_edges: usize,
    pub learned_skills: usize,
}

/// The whole graph.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Graph {
    pub nodes: Vec<Node>,
    pub edges: Vec<Edge>,
    pub clusters: Vec<Cluster>,
    pub memory: Vec<Card>,
    pub stats: Stats,
}

/// Builds the graph of `home`.
pub fn build(library: &Library, home: &Home) -> Graph {
    let records = library.usage().all();
    let mut nodes = Vec::new();
    let mut related: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for skill in library.list() {
        if skill.origin != Origin::User {
            continue;
        }
        let r = records.get(&skill.name).cloned().unwrap_or_default();
        let learned = r.created_by.as_deref() == Some("agent") || r.use_count > 0;
        if !learned {
            continue;
        }
        let timestamp = r
            .last_activity()
            .or(r.created_at)
            .map(|t| t.timestamp())
            .or_else(|| {
                let md = skill.dir.as_ref()?.join("SKILL.md");
                let modified = std::fs::metadata(md).ok()?.modified().ok()?;
                Some(chrono::DateTime::<chrono::Utc>::from(modified).timestamp())
            })
            .unwrap_or(0);
        related.insert(skill.name.clone(), skill.frontmatter.related_skills.clone());
        nodes.push(Node {
            id: skill.name.clone(),
            label: skill.name.clone(),
            kind: "skill".into(),
            memory_source: None,
            timestamp,
            category: skill.category.clone(),
            use_count: r.use_count,
            state: serde_json::to_value(r.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_else(|| "active".into()),
            created_by: r.created_by.clone().unwrap_or_else(|| "user".into()),
            pinned: r.pinned,
        });
    }
    let learned: HashSet<&str> = nodes.iter().map(|n| n.id.as_str()).collect();
    let mut skill_edges: BTreeSet<Edge> = BTreeSet::new();
    for (name, others) in &related {
        for other in others {
            let other = other.trim();
            if other != name && learned.contains(other) {
                let (a, b) = if name.as_str() < other {
                    (name.as_str(), other)
                } else {
                    (other, name.as_str())
                };
                skill_edges.insert(Edge {
                    source: a.to_owned(),
                    target: b.to_owned(),
                });
            }
        }
    }
    let cards = memory_cards(home);
    let mut memory_edges = Vec::new();
    for card in &cards {
        let text = format!("{}\n{}", card.title, card.body);
        let words = tokens(&text);
        let lower = text.to_lowercase();
        let mut scored: Vec<(usize, &str)> = learned
            .iter()
            .map(|name| {
                let named = if lower.contains(&name.to_lowercase()) {
                    6
                } else {
                    0
                };
                let shared = tokens(name).intersection(&words).count();
                (named + shared, *name)
            })
            .filter(|(score, _)| *score > 0)
            .collect();
        scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
        for (_, name) in scored.into_iter().take(EDGES_PER_CARD) {
            memory_edges.push(Edge {
                source: card.id.clone(),
                target: name.to_owned(),
            });
        }
    }
    let stats = stats(&nodes, &skill_edges, cards.len(), memory_edges.len());
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for n in &nodes {
        *counts.entry(n.category.clone()).or_default() += 1;
    }
    if !cards.is_empty() {
        counts.insert("memory".into(), cards.len());
    }
    let mut clusters: Vec<Cluster> = counts
        .into_iter()
        .map(|(category, count)| Cluster { category, count })
        .collect();
    clusters.sort_by(|a, b| b.count.cmp(&a.count).then(a.category.cmp(&b.category)));
    for card in &cards {
        nodes.push(Node {
            id: card.id.clone(),
            label: card.title.clone(),
            kind: "memory".into(),
            memory_source: Some(card.source.clone()),
            timestamp: card.timestamp,
            category: "memory".into(),
            use_count: 0,
            state: "active".into(),
            created_by: "memory".into(),
            pinned: false,
        });
    }
    let mut edges: Vec<Edge> = skill_edges.into_iter().collect();
    edges.extend(memory_edges);
    Graph {
        nodes,
        edges,
        clusters,
        memory: cards,
        stats,
    }
}

/// Lower-cased words of at least three letters or digits.
fn tokens(text: &str) -> HashSet<String> {
    text.to_lowercase()
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|t| t.len() >= 3)
        .map(str::to_owned)
        .collect()
}

fn memory_cards(home: &Home) -> Vec<Card> {
    let mut cards = Vec::new();
    for (file, source) in [("MEMORY.md", "memory"), ("USER.md", "profile")] {
        let path = home.memories_dir().join(file);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let base = std::fs::metadata(&path)
            .ok()
            .and_then(|m| m.modified().ok())
            .map(|t| chrono::DateTime::<chrono::Utc>::from(t).timestamp())
            .unwrap_or(0);
        let chunks = text
            .split(talaria_agent::tools::memory::ENTRY_DELIMITER)
            .map(str::trim)
            .filter(|c| !c.is_empty());
        for (i, chunk) in chunks.enumerate() {
            let first = chunk.lines().next().unwrap_or_default();
            let first = first.trim_start_matches("# ").trim();
            let title = if first.chars().count() > 80 {
                format!("{}…", first.chars().take(80).collect::<String>())
            } else {
                first.to_owned()
            };
            cards.push(Card {
                id: format!("memory:{source}:{}", cards.len()),
                source: source.to_owned(),
                timestamp: base + i as i64,
                title,
                body: chunk.chars().take(1200).collect(),
            });
        }
    }
    cards
}

fn stats(nodes: &[Node], edges: &BTreeSet<Edge>, cards: usize, memory_edges: usize) -> Stats {
    let n = nodes.len().max(1);
    let linked: HashSet<&str> = edges
        .iter()
        .flat_map(|e| [e.source.as_str(), e.target.as_str()])
        .collect();
    let mut per_category: BTreeMap<&str, usize> = BTreeMap::new();
    for node in nodes {
        *per_category.entry(node.category.as_str()).or_default() += 1;
    }
    let mut top: Vec<(String, usize)> = per_category
        .iter()
        .map(|(c, k)| ((*c).to_owned(), *k))
        .collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    top.truncate(8);
    let round = |x: f64, places: i32| (x * 10f64.powi(places)).round() / 10f64.powi(places);
    Stats {
        nodes: nodes.len(),
        related_edges: edges.len(),
        edges_per_node: round(edges.len() as f64 / n as f64, 3),
        linked_nodes: linked.len(),
        isolated_pct: round(100.0 * (n - linked.len().min(n)) as f64 / n as f64, 1),
        categories: per_category.len(),
        agent_created: nodes.iter().filter(|n| n.created_by == "agent").count(),
        used: nodes.iter().filter(|n| n.use_count > 0).count(),
        top_categories: top,
        memory_nodes: cards,
        memory_skill_edges: memory_edges,
        learned_skills: nodes.len(),
    }
}

/// Graphviz DOT.
pub fn to_dot(graph: &Graph) -> String {
    let quote = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
    let mut out = String::from("graph learning {\n  node [fontname=\"Helvetica\"];\n");
    for n in &graph.nodes {
        let shape = if n.kind == "memory" {
            "note"
        } else {
            "ellipse"
        };
        out.push_str(&format!(
            "  {} [label={}, shape={shape}];\n",
            quote(&n.id),
            quote(&n.label)
        ));
    }
    for e in &graph.edges {
        out.push_str(&format!(
            "  {} -- {};\n",
            quote(&e.source),
            quote(&e.target)
        ));
    }
    out.push_str("}\n");
    out
}

/// One self-contained HTML page drawing the graph (an SVG laid out by a
/// small force simulation), with no request to any network.
pub fn to_html(graph: &Graph) -> String {
    // `</` inside the embedded JSON would end the script element early.
    let data = serde_json::to_string(graph)
        .unwrap_or_else(|_| "{}".into())
        .replace("</", "<\\/");
    HTML.replace("__GRAPH_JSON__", &data)
}

const HTML: &str = r##"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'">
<title>Talaria: what I have learned</title>
<style>
  body { margin: 0; font: 14px system-ui, sans-serif; background: #fbfaf7; color: #222; }
  header { padding: 12px 16px; border-bottom: 1px solid #ddd; }
  header h1 { font-size: 16px; margin: 0 0 4px; }
  #stats { color: #666; }
  svg { display: block; width: 100vw; height: calc(100vh - 64px); }
  .skill circle { fill: #3b7dd8; }
  .memory circle { fill: #e0a526; }
  .node text { font-size: 11px; fill: #333; pointer-events: none; }
  line { stroke: #999; stroke-opacity: .6; }
  #tip { position: fixed; max-width: 360px; padding: 6px 8px; background: #fff; border: 1px solid #ccc; display: none; white-space: pre-wrap; }
</style>
</head>
<body>
<header><h1>What Talaria has learned</h1><div id="stats"></div></header>
<svg id="graph" role="img" aria-label="learning graph"></svg>
<div id="tip"></div>
<script>
"use strict";
const graph = __GRAPH_JSON__;
const svg = document.getElementById("graph");
const tip = document.getElementById("tip");
const NS = "http://www.w3.org/2000/svg";
const s = graph.stats || {};
document.getElementById("stats").textContent =
  `${s.learned_skills || 0} learned skills · ${s.memory_nodes || 0} memory cards · ` +
  `${(graph.edges || []).length} links`;
const width = svg.clientWidth || 1000, height = svg.clientHeight || 700;
const nodes = graph.nodes.map((n, i) => ({
  ...n,
  x: width / 2 + Math.cos(i * 2.4) * (60 + 12 * i),
  y: height / 2 + Math.sin(i * 2.4) * (60 + 12 * i),
  vx: 0, vy: 0,
}));
const byId = new Map(nodes.map(n => [n.id, n]));
const links = graph.edges.map(e => ({ a: byId.get(e.source), b: byId.get(e.target) })).filter(l => l.a && l.b);
// Fruchterman-Reingold: every pair repels, links pull, a mild pull to
// the centre keeps loose nodes in view, and the step shrinks as it cools.
const k = Math.sqrt((width * height) / Math.max(nodes.length, 1)) * 0.45;
let heat = width / 8;
for (let step = 0; step < 300; step++) {
  for (const n of nodes) { n.vx = 0; n.vy = 0; }
  for (let i = 0; i < nodes.length; i++) {
    for (let j = i + 1; j < nodes.length; j++) {
      const a = nodes[i], b = nodes[j];
      const dx = a.x - b.x, dy = a.y - b.y;
      const d = Math.max(0.01, Math.hypot(dx, dy));
      const f = (k * k) / d;
      a.vx += (dx / d) * f; a.vy += (dy / d) * f;
      b.vx -= (dx / d) * f; b.vy -= (dy / d) * f;
    }
  }
  for (const l of links) {
    const dx = l.a.x - l.b.x, dy = l.a.y - l.b.y;
    const d = Math.max(0.01, Math.hypot(dx, dy));
    const f = (d * d) / k;
    l.a.vx -= (dx / d) * f; l.a.vy -= (dy / d) * f;
    l.b.vx += (dx / d) * f; l.b.vy += (dy / d) * f;
  }
  for (const n of nodes) {
    n.vx += (width / 2 - n.x) * 0.05; n.vy += (height / 2 - n.y) * 0.05;
    const d = Math.max(0.01, Math.hypot(n.vx, n.vy));
    n.x += (n.vx / d) * Math.min(d, heat);
    n.y += (n.vy / d) * Math.min(d, heat);
    n.x = Math.max(30, Math.min(width - 180, n.x));
    n.y = Math.max(30, Math.min(height - 30, n.y));
  }
  heat *= 0.97;
}
for (const l of links) {
  const line = document.createElementNS(NS, "line");
  line.setAttribute("x1", l.a.x); line.setAttribute("y1", l.a.y);
  line.setAttribute("x2", l.b.x); line.setAttribute("y2", l.b.y);
  svg.appendChild(line);
}
for (const n of nodes) {
  const g = document.createElementNS(NS, "g");
  g.setAttribute("class", "node " + n.kind);
  g.setAttribute("data-id", n.id);
  const c = document.createElementNS(NS, "circle");
  c.setAttribute("cx", n.x); c.setAttribute("cy", n.y);
  c.setAttribute("r", n.kind === "memory" ? 7 : 6 + Math.min(10, Math.sqrt(n.useCount || 0) * 2));
  const t = document.createElementNS(NS, "text");
  t.setAttribute("x", n.x + 10); t.setAttribute("y", n.y + 4);
  t.textContent = n.label.length > 40 ? n.label.slice(0, 39) + "…" : n.label;
  g.append(c, t);
  g.addEventListener("mouseenter", ev => {
    tip.style.display = "block";
    tip.style.left = (ev.clientX + 12) + "px"; tip.style.top = (ev.clientY + 12) + "px";
    tip.textContent = n.kind === "skill"
      ? `${n.label}\ncategory: ${n.category}\nused: ${n.useCount}\nstate: ${n.state}`
      : n.label;
  });
  g.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  svg.appendChild(g);
}
document.body.setAttribute("data-drawn", String(nodes.length));
</script>
</body>
</html>
"##;
