//! Prompt templates: a route's `prompt` with placeholders filled from the
//! delivery.
//!
//! Placeholders are `{payload.a.b.c}` (a dot path into the JSON body;
//! numeric segments index arrays), `{event_type}`, `{route}` and
//! `{__raw__}` (the whole body). Substitution is a single pass over the
//! template: text inserted from the payload is never scanned again, so a
//! sender cannot smuggle placeholders (or reach other fields) through a
//! string value. Anything in braces that is not a known placeholder, or a
//! path the payload does not have, stays as written.

use serde_json::Value;

/// The most characters one `{payload...}` value contributes.
pub const MAX_VALUE_CHARS: usize = 2_000;

/// The most characters `{__raw__}` (and the default template's JSON block)
/// contributes.
pub const MAX_RAW_CHARS: usize = 4_000;

/// The most characters a rendered prompt has.
pub const MAX_PROMPT_CHARS: usize = 16_000;

/// Fills `template` for one delivery. An empty (or blank) template gives
/// the default: a header line naming the event and the route, then the
/// payload as pretty JSON in a fenced block.
pub fn render(template: &str, payload: &Value, event_type: &str, route: &str) -> String {
    let rendered = if template.trim().is_empty() {
        let json = serde_json::to_string_pretty(payload).unwrap_or_default();
        format!(
            "Webhook event {event_type} on route {route}:\n\n```json\n{}\n```",
            truncate(&json, MAX_RAW_CHARS)
        )
    } else {
        fill(template, payload, event_type, route)
    };
    truncate(&rendered, MAX_PROMPT_CHARS)
}

fn fill(template: &str, payload: &Value, event_type: &str, route: &str) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let filled = after.find('}').and_then(|close| {
            placeholder(&after[..close], payload, event_type, route).map(|value| (value, close))
        });
        match filled {
            Some((value, close)) => {
                out.push_str(&value);
                rest = &after[close + 1..];
            }
            None => {
                // Not a placeholder: keep the brace and look for one inside,
                // so `{"x": {payload.x}}` still fills the inner one.
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The text for one placeholder name, or `None` to leave it as written.
fn placeholder(name: &str, payload: &Value, event_type: &str, route: &str) -> Option<String> {
    match name {
        "event_type" => Some(event_type.to_owned()),
        "route" => Some(route.to_owned()),
        "__raw__" => {
            let json = serde_json::to_string(payload).unwrap_or_default();
            Some(truncate(&json, MAX_RAW_CHARS))
        }
        _ => {
            let path = name.strip_prefix("payload.")?;
            let value = lookup(payload, path)?;
            let text = match value {
                Value::String(s) => s.clone(),
                other => serde_json::to_string(other).unwrap_or_default(),
            };
            Some(truncate(&text, MAX_VALUE_CHARS))
        }
    }
}

/// Follows a dot path: object keys by name, array elements by index.
fn lookup<'a>(root: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(root, |node, segment| match node {
        Value::Object(map) => map.get(segment),
        Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
        _ => None,
    })
}

/// At most `max` characters; a cut text ends with `…` (counted in `max`),
/// so the reader can tell it was cut.
pub fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some(_) if max == 0 => String::new(),
        Some(_) => {
            let keep = max.saturating_sub(1);
            let end = text.char_indices().nth(keep).map_or(text.len(), |(i, _)| i);
            let mut cut = text[..end].to_owned();
            cut.push('…');
            cut
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn payload() -> Value {
        json!({
            "action": "opened",
            "number": 7,
            "draft": false,
            "pull_request": {
                "title": "Fix the {route} parser",
                "user": {"login": "octocat"},
                "labels": [{"name": "bug"}, {"name": "urgent"}],
            },
            "commits": [{"id": "abc"}, {"id": "def"}],
            "empty": null,
        })
    }

    #[test]
    fn dot_paths_fill_strings_raw_and_other_values_as_json() {
        let p = payload();
        assert_eq!(
            render(
                "{payload.pull_request.user.login} {payload.action} #{payload.number} draft={payload.draft} {payload.empty}",
                &p,
                "pull_request",
                "gh"
            ),
            "octocat opened #7 draft=false null"
        );
        assert_eq!(
            render("{payload.pull_request.user}", &p, "e", "r"),
            r#"{"login":"octocat"}"#
        );
    }

    #[test]
    fn numeric_segments_index_arrays() {
        let p = payload();
        assert_eq!(
            render(
                "{payload.commits.1.id} {payload.pull_request.labels.0.name}",
                &p,
                "e",
                "r"
            ),
            "def bug"
        );
        assert_eq!(
            render("{payload.commits.9.id} {payload.commits.x}", &p, "e", "r"),
            "{payload.commits.9.id} {payload.commits.x}"
        );
        assert_eq!(render("{payload.0}", &json!(["a", "b"]), "e", "r"), "a");
    }

    #[test]
    fn missing_paths_and_unknown_names_stay_literal() {
        let p = payload();
        assert_eq!(
            render(
                "{payload.nope.deeper} {payload.action.length} {payload.} {unknown} {} {",
                &p,
                "e",
                "r"
            ),
            "{payload.nope.deeper} {payload.action.length} {payload.} {unknown} {} {"
        );
    }

    #[test]
    fn builtins_and_nested_braces() {
        let p = payload();
        assert_eq!(
            render(
                r#"[{route}/{event_type}] {"title": {payload.pull_request.title}}"#,
                &p,
                "push",
                "gh"
            ),
            r#"[gh/push] {"title": Fix the {route} parser}"#
        );
    }

    #[test]
    fn inserted_text_is_not_expanded_again() {
        let p = json!({"a": "{payload.b}", "b": "secret"});
        assert_eq!(render("{payload.a}", &p, "e", "r"), "{payload.b}");
    }

    #[test]
    fn values_raw_and_the_prompt_are_capped() {
        let long = "x".repeat(5_000);
        let p = json!({"long": long, "list": [long.clone(), long.clone()]});
        let one = render("{payload.long}", &p, "e", "r");
        assert_eq!(one.chars().count(), MAX_VALUE_CHARS);
        assert!(one.ends_with('…'));
        let raw = render("{__raw__}", &p, "e", "r");
        assert_eq!(raw.chars().count(), MAX_RAW_CHARS);
        assert!(raw.starts_with(r#"{"list":["xxx"#), "{}", &raw[..20]);
        let many = render(&"{payload.long}".repeat(20), &p, "e", "r");
        assert_eq!(many.chars().count(), MAX_PROMPT_CHARS);
    }

    #[test]
    fn truncation_counts_characters_not_bytes() {
        assert_eq!(truncate("héllo", 5), "héllo");
        assert_eq!(truncate("héllo wörld", 5), "héll…");
        assert_eq!(truncate("日本語テキスト", 3), "日本…");
        assert_eq!(truncate("abc", 0), "");
        assert_eq!(truncate("abc", 1), "…");
    }

    #[test]
    fn an_empty_template_shows_the_event_and_the_payload() {
        let p = json!({"zen": "Keep it logically awesome."});
        let out = render("  ", &p, "ping", "gh");
        assert!(
            out.starts_with("Webhook event ping on route gh:\n\n```json\n"),
            "{out}"
        );
        assert!(
            out.contains(r#""zen": "Keep it logically awesome.""#),
            "{out}"
        );
        assert!(out.ends_with("\n```"), "{out}");
        let big = json!({"blob": "y".repeat(10_000)});
        let out = render("", &big, "e", "r");
        assert!(out.chars().count() < MAX_RAW_CHARS + 100, "{}", out.len());
        assert!(out.contains('…'));
    }
}
