//! A page's accessibility tree as compact indented text, with element refs
//! (`@e1`, `@e2`, ...) for the elements a model can act on.
//!
//! Each line is `role "name"`, then the value or state when there is one,
//! then `[@eN]` for an element that can be clicked or typed into. Nodes
//! that only wrap others (generic containers, ignored nodes) are skipped
//! and their children raised, so the text follows what a reader sees, not
//! the DOM's nesting. The compact view keeps what a model needs to act and
//! read: controls, links, headings, images and text; the full view keeps
//! every node with a role.

use std::collections::HashMap;
use std::fmt::Write as _;

use chromiumoxide::cdp::browser_protocol::accessibility::{AxNode, AxValue};
use chromiumoxide::cdp::browser_protocol::dom::BackendNodeId;

/// Roles a model can act on: each gets a ref.
const INTERACTIVE: &[&str] = &[
    "button",
    "checkbox",
    "combobox",
    "link",
    "listbox",
    "menuitem",
    "menuitemcheckbox",
    "menuitemradio",
    "option",
    "radio",
    "searchbox",
    "slider",
    "spinbutton",
    "switch",
    "tab",
    "textbox",
    "treeitem",
];

/// Roles the compact view keeps besides the interactive ones.
const READABLE: &[&str] = &[
    "heading",
    "image",
    "img",
    "StaticText",
    "paragraph",
    "list",
    "listitem",
    "table",
    "row",
    "cell",
    "columnheader",
    "rowheader",
    "form",
    "dialog",
    "alert",
    "status",
    "main",
    "navigation",
    "article",
    "code",
    "blockquote",
];

/// Roles never shown: they repeat their parent's text or hold nothing.
const NEVER: &[&str] = &["InlineTextBox", "LineBreak", "none", "presentation"];

/// Longest name or value shown for one node, in characters.
const MAX_FIELD: usize = 300;

/// A rendered snapshot.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The text.
    pub text: String,
    /// The DOM node behind each ref: `refs[0]` is `@e1`.
    pub refs: Vec<BackendNodeId>,
    /// Whether the text was cut to the limit.
    pub truncated: bool,
}

/// Renders `nodes` (as `Accessibility.getFullAXTree` returns them), at most
/// `max_chars` characters of it.
pub fn render(nodes: &[AxNode], full: bool, max_chars: usize) -> Snapshot {
    let by_id: HashMap<&str, &AxNode> = nodes
        .iter()
        .map(|n| (n.node_id.inner().as_str(), n))
        .collect();
    let root = nodes
        .iter()
        .find(|n| n.parent_id.is_none())
        .or_else(|| nodes.first());
    let mut out = Render {
        by_id,
        full,
        max_chars,
        text: String::new(),
        refs: Vec::new(),
        truncated: false,
        visited: 0,
    };
    if let Some(root) = root {
        out.node(root, 0, None);
    }
    Snapshot {
        text: out.text,
        refs: out.refs,
        truncated: out.truncated,
    }
}

struct Render<'a> {
    by_id: HashMap<&'a str, &'a AxNode>,
    full: bool,
    max_chars: usize,
    text: String,
    refs: Vec<BackendNodeId>,
    truncated: bool,
    /// Nodes walked: a tree with a cycle (never seen, but the data is the
    /// page's) stops here.
    visited: usize,
}

fn value_text(v: Option<&AxValue>) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

fn clip(s: &str) -> String {
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if s.chars().count() > MAX_FIELD {
        let mut cut: String = s.chars().take(MAX_FIELD).collect();
        cut.push('…');
        cut
    } else {
        s
    }
}

impl<'a> Render<'a> {
    /// Renders `node` at `depth`; `parent_name` is the name of the nearest
    /// shown ancestor (text that merely repeats it is left out).
    fn node(&mut self, node: &'a AxNode, depth: usize, parent_name: Option<&str>) {
        self.visited += 1;
        if self.truncated || self.visited > 200_000 {
            return;
        }
        let role = value_text(node.role.as_ref());
        let name = clip(&value_text(node.name.as_ref()));
        let shown = !node.ignored && !NEVER.contains(&role.as_str()) && self.keeps(&role, &name);
        let repeats = role == "StaticText" && parent_name.is_some_and(|p| p == name);
        let mut next_depth = depth;
        let mut next_parent = parent_name;
        // A text field's own text repeats its value.
        let value = clip(&value_text(node.value.as_ref()));
        if shown && !repeats {
            self.line(node, &role, &name, depth);
            next_depth = depth + 1;
            next_parent = Some(if name.is_empty() {
                value.as_str()
            } else {
                name.as_str()
            });
        }
        let children: Vec<&'a AxNode> = node
            .child_ids
            .iter()
            .flatten()
            .filter_map(|id| self.by_id.get(id.inner().as_str()).copied())
            .collect();
        // The name outlives the loop through an owned copy.
        let parent = next_parent.map(str::to_owned);
        for child in children {
            self.node(child, next_depth, parent.as_deref());
        }
    }

    fn keeps(&self, role: &str, name: &str) -> bool {
        if role == "StaticText" {
            return !name.is_empty();
        }
        if self.full {
            return !(matches!(role, "generic" | "") && name.is_empty());
        }
        if role == "ListMarker" {
            // The bullet or number of a list item: noise in the compact view.
            return false;
        }
        INTERACTIVE.contains(&role)
            || (READABLE.contains(&role) && (role != "image" && role != "img" || !name.is_empty()))
            || (!name.is_empty() && !matches!(role, "generic" | "RootWebArea" | "WebArea"))
    }

    fn line(&mut self, node: &AxNode, role: &str, name: &str, depth: usize) {
        let mut line = String::new();
        for _ in 0..depth.min(30) {
            line.push_str("  ");
        }
        if role == "StaticText" {
            let _ = write!(line, "text: {name}");
        } else {
            line.push_str(role);
            if !name.is_empty() {
                let _ = write!(line, " \"{name}\"");
            }
        }
        let value = clip(&value_text(node.value.as_ref()));
        if !value.is_empty() && value != name {
            let _ = write!(line, " = \"{value}\"");
        }
        for prop in node.properties.iter().flatten() {
            let key = prop.name.as_ref();
            let v = prop.value.value.as_ref();
            match (key, v) {
                (
                    "checked" | "pressed" | "selected" | "expanded",
                    Some(serde_json::Value::String(s)),
                ) => {
                    let _ = write!(line, " {key}={s}");
                }
                (
                    "checked" | "pressed" | "selected" | "expanded" | "disabled" | "required"
                    | "focused",
                    Some(serde_json::Value::Bool(true)),
                ) => {
                    let _ = write!(line, " {key}");
                }
                ("level", Some(l)) if role == "heading" => {
                    let _ = write!(line, " level={l}");
                }
                _ => {}
            }
        }
        let target = node
            .backend_dom_node_id
            .filter(|_| INTERACTIVE.contains(&role));
        if target.is_some() {
            let _ = write!(line, " [@e{}]", self.refs.len() + 1);
        }
        line.push('\n');
        if self.text.len() + line.len() > self.max_chars {
            self.truncated = true;
            return;
        }
        // A ref exists only for a line that is shown.
        if let Some(id) = target {
            self.refs.push(id);
        }
        self.text.push_str(&line);
    }
}

/// The index into [`Snapshot::refs`] that `r` names: `@e5`, `e5` or `5`
/// are ref 5, index 4.
pub fn parse_ref(r: &str) -> Option<usize> {
    let r = r.trim().trim_start_matches('[').trim_end_matches(']');
    let r = r.strip_prefix('@').unwrap_or(r);
    let r = r.strip_prefix('e').unwrap_or(r);
    let n: usize = r.parse().ok()?;
    n.checked_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, role: &str, name: &str, children: &[&str], backend: Option<i64>) -> AxNode {
        let mut v = serde_json::json!({
            "nodeId": id,
            "ignored": false,
            "role": {"type": "role", "value": role},
            "name": {"type": "computedString", "value": name},
            "childIds": children,
        });
        if let Some(b) = backend {
            v["backendDOMNodeId"] = b.into();
        }
        if id != "1" {
            v["parentId"] = "1".into();
        }
        serde_json::from_value(v).unwrap_or_else(|e| panic!("an AX node: {e}"))
    }

    fn page() -> Vec<AxNode> {
        vec![
            node("1", "RootWebArea", "Title", &["2", "3", "5"], Some(1)),
            node("2", "heading", "Hello", &[], Some(2)),
            node("3", "link", "Next page", &["4"], Some(3)),
            node("4", "StaticText", "Next page", &[], Some(4)),
            node("5", "button", "Go", &[], Some(5)),
        ]
    }

    #[test]
    fn controls_get_refs_and_repeated_text_is_left_out() {
        let s = render(&page(), false, 10_000);
        assert_eq!(
            s.text,
            "heading \"Hello\"\nlink \"Next page\" [@e1]\nbutton \"Go\" [@e2]\n"
        );
        assert_eq!(s.refs, vec![BackendNodeId::new(3), BackendNodeId::new(5)]);
        assert!(!s.truncated);
        let full = render(&page(), true, 10_000);
        assert!(
            full.text.starts_with("RootWebArea \"Title\"\n  heading"),
            "{}",
            full.text
        );
    }

    #[test]
    fn a_long_page_is_cut_at_a_line_and_says_so() {
        let s = render(&page(), false, 30);
        assert_eq!(s.text, "heading \"Hello\"\n");
        assert!(s.truncated);
        // No ref is handed out for a line that was not shown.
        assert!(s.refs.is_empty());
    }

    #[test]
    fn refs_are_read_in_every_spelling() {
        assert_eq!(parse_ref("@e5"), Some(4));
        assert_eq!(parse_ref("e5"), Some(4));
        assert_eq!(parse_ref("[@e5]"), Some(4));
        assert_eq!(parse_ref("5"), Some(4));
        assert_eq!(parse_ref("@e0"), None);
        assert_eq!(parse_ref("button"), None);
    }
}
