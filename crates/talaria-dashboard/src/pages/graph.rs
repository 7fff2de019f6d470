//! The learning graph: skills by who wrote them and memory cards, with
//! their links, drawn as an SVG on the server (no script), with the
//! counts and the lists beside it.

use std::sync::Arc;

use askama::Template;
use axum::Extension;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::Value;

use super::Shown;
use crate::Ui;
use crate::auth::Login;
use crate::view::{self, Frame, count, text};

/// The drawing's size, and the radius nodes are placed on.
const SIZE: f64 = 640.0;
const RADIUS: f64 = 250.0;
/// Most nodes drawn; the lists below show every one.
const MAX_DRAWN: usize = 300;

pub(crate) struct Dot {
    x: String,
    y: String,
    label: String,
    group: String,
}

pub(crate) struct Line {
    x1: String,
    y1: String,
    x2: String,
    y2: String,
}

pub(crate) struct Drawing {
    dots: Vec<Dot>,
    lines: Vec<Line>,
    nodes: u64,
    links: u64,
    skills: Vec<(String, String)>,
    cards: Vec<(String, String)>,
    more: usize,
}

#[derive(Template)]
#[template(path = "graph.html")]
struct GraphPage {
    frame: Frame,
    size: u32,
    graph: Shown<Drawing>,
}

view::framed!(GraphPage);

fn coordinate(value: f64) -> String {
    format!("{value:.1}")
}

/// Places the nodes on a circle (grouped, as the API lists them) and
/// draws each link between two drawn nodes.
fn draw(graph: &Value) -> Drawing {
    let nodes = graph["nodes"].as_array().map_or(&[][..], Vec::as_slice);
    let drawn = &nodes[..nodes.len().min(MAX_DRAWN)];
    let centre = SIZE / 2.0;
    let mut place = std::collections::HashMap::new();
    let dots: Vec<Dot> = drawn
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let angle = std::f64::consts::TAU * i as f64 / drawn.len().max(1) as f64;
            let (x, y) = (centre + RADIUS * angle.cos(), centre + RADIUS * angle.sin());
            place.insert(text(n, "id"), (x, y));
            Dot {
                x: coordinate(x),
                y: coordinate(y),
                label: text(n, "label"),
                group: text(n, "group"),
            }
        })
        .collect();
    let lines = graph["edges"]
        .as_array()
        .map(|edges| {
            edges
                .iter()
                .filter_map(|e| {
                    let a = place.get(&text(e, "source"))?;
                    let b = place.get(&text(e, "target"))?;
                    Some(Line {
                        x1: coordinate(a.0),
                        y1: coordinate(a.1),
                        x2: coordinate(b.0),
                        y2: coordinate(b.1),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let skills = nodes
        .iter()
        .filter(|n| text(n, "kind") == "skill")
        .map(|n| (text(n, "label"), text(n, "group")))
        .collect();
    let cards = graph["memory"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| (text(c, "title"), text(c, "source")))
                .collect()
        })
        .unwrap_or_default();
    Drawing {
        dots,
        lines,
        nodes: count(&graph["stats"], "nodes"),
        links: count(&graph["stats"], "links"),
        skills,
        cards,
        more: nodes.len().saturating_sub(MAX_DRAWN),
    }
}

/// `GET /ui/graph`.
pub(crate) async fn page(
    State(ui): State<Arc<Ui>>,
    Extension(login): Extension<Login>,
    headers: HeaderMap,
) -> Response {
    let graph = ui
        .api
        .get("/api/learning/graph")
        .await
        .map(|v| draw(&v))
        .map_err(|e| e.to_string());
    view::render(&GraphPage {
        frame: Frame::new("graph", "Learning graph", &login, &headers),
        size: SIZE as u32,
        graph,
    })
}
