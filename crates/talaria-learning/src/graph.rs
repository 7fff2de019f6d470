//! The learning graph: the skills Talaria knows and what it remembers, as
//! nodes and links.
//!
//! Every skill is a node, in one of three groups: **learned** (the agent
//! wrote it, of its own accord or because you asked it to: see
//! [`crate::skill_history::written_by_agent`]), **yours** (a skill you put in the
//! skills folder yourself) and **bundled** (shipped with Talaria). Each
//! entry of MEMORY.md and USER.md is a **memory** card. Links come from a
//! skill's `related_skills` (to any skill, bundled ones included) and from
//! each memory card to the (at most four) skills whose names share the
//! most words with it. Rendered as JSON (the ancestor's payload shape, with
//! the group added), Graphviz DOT, or one self-contained HTML page that
//! lays the graph out itself and needs no network.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::Serialize;
use talaria_core::Home;

use crate::skills::{Library, Origin};

/// Memory→skill edges per card.
const EDGES_PER_CARD: usize = 4;

/// Which kind of node, as the legend names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Group {
    /// A skill the agent wrote.
    Learned,
    /// A skill the user wrote.
    Yours,
    /// A skill shipped with Talaria.
    Bundled,
    /// An entry of MEMORY.md or USER.md.
    Memory,
}

/// A node as drawn.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    /// Unique in the graph: the skill's name, or the memory card's id.
    pub id: String,
    /// The text drawn on the node.
    pub label: String,
    /// `skill` or `memory`.
    pub kind: String,
    /// Which colour group it is drawn in.
    pub group: Group,
    /// For a memory card, which file it comes from (`memory` or `profile`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_source: Option<String>,
    /// Unix seconds of the last activity (skills) or the file (memory).
    pub timestamp: i64,
    /// The skill's category (`general` for one at the root).
    pub category: String,
    /// Times the skill was used, from its usage record.
    pub use_count: u64,
    /// The skill's state: `active`, `stale` or `archived`.
    pub state: String,
    /// `agent`, `user`, `bundled` or `memory`.
    pub created_by: String,
    /// Pinned by the user: the curator never retires it.
    pub pinned: bool,
}

/// A link between two nodes: skills that name each other as related, or
/// a memory card and the skills its text is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Edge {
    /// One end: a skill's name, or a memory card's id.
    pub source: String,
    /// The other end, always a skill's name.
    pub target: String,
}

/// A category and how many skills are in it, for the legend.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cluster {
    /// The category's name.
    pub category: String,
    /// Skills in it.
    pub count: usize,
}

/// A memory entry as a card.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Card {
    /// Stable across runs for the same entry, so a page can link to it.
    pub id: String,
    /// `memory` (MEMORY.md) or `profile` (USER.md).
    pub source: String,
    /// Unix seconds of the file's last change.
    pub timestamp: i64,
    /// The entry's first line, shortened.
    pub title: String,
    /// The rest of the entry.
    pub body: String,
}

/// The graph's counts; the page's legend shows them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stats {
    /// Every node: skills of each group and memory cards.
    pub nodes: usize,
    /// Links between two skills.
    pub related_edges: usize,
    /// Links from a memory card to a skill.
    pub memory_skill_edges: usize,
    /// Every link.
    pub links: usize,
    /// Links per node.
    pub edges_per_node: f64,
    /// Nodes with at least one link.
    pub linked_nodes: usize,
    /// Share of nodes without a link, in percent.
    pub isolated_pct: f64,
    /// Skill categories.
    pub categories: usize,
    /// Skills used at least once.
    pub used: usize,
    /// The eight largest skill categories.
    pub top_categories: Vec<(String, usize)>,
    /// Skills the agent wrote (the ancestor's name for `learned_skills`).
    pub agent_created: usize,
    /// Skills the agent wrote.
    pub learned_skills: usize,
    /// Skills the user wrote.
    pub your_skills: usize,
    /// Skills shipped with Talaria.
    pub bundled_skills: usize,
    /// Memory cards.
    pub memory_nodes: usize,
}

/// The whole graph.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Graph {
    /// Every skill and memory card.
    pub nodes: Vec<Node>,
    /// The links between them, each once.
    pub edges: Vec<Edge>,
    /// The skill categories with their sizes.
    pub clusters: Vec<Cluster>,
    /// The memory entries, for the page's card list.
    pub memory: Vec<Card>,
    /// Counts shown above the graph.
    pub stats: Stats,
}

/// Builds the graph of `home`.
pub fn build(library: &Library, home: &Home) -> Graph {
    let records = library.usage().all();
    let by_agent = crate::skill_history::written_by_agent(library);
    let mut nodes = Vec::new();
    let mut related: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for skill in library.list() {
        let r = records.get(&skill.name).cloned().unwrap_or_default();
        let (group, created_by) = match skill.origin {
            Origin::Bundled => (Group::Bundled, "bundled"),
            Origin::User if by_agent.contains(&skill.name) => (Group::Learned, "agent"),
            Origin::User => (Group::Yours, "user"),
        };
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
            group,
            memory_source: None,
            timestamp,
            category: skill.category.clone(),
            use_count: r.use_count,
            state: serde_json::to_value(r.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_else(|| "active".into()),
            created_by: created_by.into(),
            pinned: r.pinned,
        });
    }
    let skills: HashSet<&str> = nodes.iter().map(|n| n.id.as_str()).collect();
    // A link between two skills when either names the other, once per pair.
    let mut skill_edges: BTreeSet<Edge> = BTreeSet::new();
    for (name, others) in &related {
        for other in others {
            let other = other.trim();
            if other != name && skills.contains(other) {
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
        let mut scored: Vec<(usize, &str)> = skills
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
            group: Group::Memory,
            memory_source: Some(card.source.clone()),
            timestamp: card.timestamp,
            category: "memory".into(),
            use_count: 0,
            state: "active".into(),
            created_by: "memory".into(),
            pinned: false,
        });
    }
    let related_edges = skill_edges.len();
    let mut edges: Vec<Edge> = skill_edges.into_iter().collect();
    edges.extend(memory_edges);
    let stats = stats(&nodes, &edges, related_edges);
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

fn stats(nodes: &[Node], edges: &[Edge], related_edges: usize) -> Stats {
    let n = nodes.len().max(1);
    let linked: HashSet<&str> = edges
        .iter()
        .flat_map(|e| [e.source.as_str(), e.target.as_str()])
        .collect();
    let skills: Vec<&Node> = nodes.iter().filter(|n| n.kind == "skill").collect();
    let mut per_category: BTreeMap<&str, usize> = BTreeMap::new();
    for node in &skills {
        *per_category.entry(node.category.as_str()).or_default() += 1;
    }
    let mut top: Vec<(String, usize)> = per_category
        .iter()
        .map(|(c, k)| ((*c).to_owned(), *k))
        .collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    top.truncate(8);
    let round = |x: f64, places: i32| (x * 10f64.powi(places)).round() / 10f64.powi(places);
    let in_group = |g: Group| nodes.iter().filter(|n| n.group == g).count();
    Stats {
        nodes: nodes.len(),
        related_edges,
        memory_skill_edges: edges.len() - related_edges,
        links: edges.len(),
        edges_per_node: round(edges.len() as f64 / n as f64, 3),
        linked_nodes: linked.len(),
        isolated_pct: round(100.0 * (n - linked.len().min(n)) as f64 / n as f64, 1),
        categories: per_category.len(),
        used: skills.iter().filter(|n| n.use_count > 0).count(),
        top_categories: top,
        agent_created: in_group(Group::Learned),
        learned_skills: in_group(Group::Learned),
        your_skills: in_group(Group::Yours),
        bundled_skills: in_group(Group::Bundled),
        memory_nodes: in_group(Group::Memory),
    }
}

/// Graphviz DOT: memory cards as notes, bundled skills dashed.
pub fn to_dot(graph: &Graph) -> String {
    let quote = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
    let mut out = String::from("graph learning {\n  node [fontname=\"Helvetica\"];\n");
    for n in &graph.nodes {
        let style = match n.group {
            Group::Memory => "shape=note",
            Group::Bundled => "shape=ellipse, style=dashed",
            Group::Learned => "shape=ellipse, style=bold",
            Group::Yours => "shape=ellipse",
        };
        out.push_str(&format!(
            "  {} [label={}, {style}];\n",
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

/// One self-contained HTML page drawing the graph: an SVG laid out in the
/// page by a small seeded force simulation that keeps every node and label
/// inside the canvas and apart, with a legend of the counts. It makes no
/// request to any network.
pub fn to_html(graph: &Graph) -> String {
    // `</` inside the embedded JSON would end the script element early.
    let data = serde_json::to_string(graph)
        .unwrap_or_else(|_| "{}".into())
        .replace("</", "<\\/");
    HTML.replace("__GRAPH_JSON__", &data)
}

const HTML: &str = include_str!("graph.html");
