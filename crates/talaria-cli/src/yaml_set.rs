//! One key of `config.yaml` set in the file's text, every comment and
//! every other line kept as written: `talaria config set`.
//!
//! The edit is made on a lossless syntax tree (the `yaml-edit` crate): a
//! scalar is replaced where it stands (a comment after it stays), a
//! missing key joins its parent mapping at the indentation of its
//! siblings, and missing parent mappings are made. What to do is decided
//! from what the YAML *means* (parsed as the loader parses it), and the
//! result is parsed again and must mean exactly the old file with the one
//! key changed; anything else is refused, so a surprise in the editor
//! never reaches the file.

use std::str::FromStr;

use serde_json::{Map, Value};
use yaml_edit::{Document, Mapping, MappingBuilder};

/// A dotted key split into its parts: `model.default` is `model`, then
/// `default`.
pub fn parse_key(key: &str) -> Result<Vec<String>, String> {
    let parts: Vec<String> = key.split('.').map(str::to_owned).collect();
    if parts.iter().any(|p| p.trim().is_empty()) {
        return Err(format!(
            "`{key}` is not a setting's name: write it with dots, as `agent.max_turns`"
        ));
    }
    Ok(parts)
}

/// `text` as YAML reads a value: a number, `true`/`false`, `null` or text
/// (quoted when it would read as something else). Lists and mappings are
/// refused: they are written with `talaria config edit`.
pub fn parse_value(text: &str) -> Result<Value, String> {
    let value: Value = serde_saphyr::from_str(text)
        .map_err(|e| format!("`{text}` is not a value YAML can read: {e}"))?;
    match value {
        Value::Object(_) => Err(format!(
            "`{text}` reads as a mapping (`key: value`) in YAML; to set it as text, quote it: \
             '\"{text}\"'"
        )),
        Value::Array(_) => Err(format!(
            "`{text}` is a list; lists and mappings are changed with `talaria config edit`"
        )),
        scalar => Ok(scalar),
    }
}

/// What a configuration's text means: its tree, an empty mapping for an
/// empty file.
pub fn meaning(text: &str) -> Result<Value, String> {
    let value: Value =
        serde_saphyr::from_str(text).map_err(|e| format!("it is not valid YAML: {e}"))?;
    match value {
        Value::Null => Ok(Value::Object(Map::new())),
        Value::Object(_) => Ok(value),
        _ => Err("it is not a mapping of settings".to_owned()),
    }
}

/// `text` with the setting at `path` set to `value` (a scalar, as
/// [`parse_value`] returns), everything else in it kept byte for byte.
pub fn set(text: &str, path: &[String], value: &Value) -> Result<String, String> {
    let Some((last, parents)) = path.split_last() else {
        return Err("no setting named".to_owned());
    };
    let before = meaning(text)?;
    // How far the path already exists, from what the file means.
    let mut node = &before;
    let mut present = 0;
    for (i, key) in parents.iter().enumerate() {
        match node.get(key) {
            Some(child @ Value::Object(_)) => {
                node = child;
                present = i + 1;
            }
            None | Some(Value::Null) => break,
            Some(other) => {
                return Err(format!(
                    "`{}` is {}, not a mapping of settings",
                    path[..=i].join("."),
                    kind(other)
                ));
            }
        }
    }
    if present == parents.len() {
        match node.get(last) {
            Some(Value::Object(children)) => {
                let names: Vec<&str> = children.keys().map(String::as_str).collect();
                return Err(format!(
                    "`{}` is a mapping of settings ({}); set one of them, as `{}.{}`",
                    path.join("."),
                    names.join(", "),
                    path.join("."),
                    names.first().copied().unwrap_or("name")
                ));
            }
            Some(Value::Array(_)) => {
                return Err(format!(
                    "`{}` is a list: change it with `talaria config edit`",
                    path.join(".")
                ));
            }
            _ => {}
        }
    }
    let edited = edit(text, &before, path, present, value)?;
    let mut expected = before;
    put(&mut expected, path, value.clone());
    match meaning(&edited) {
        Ok(after) if after == expected => Ok(edited),
        _ => Err(
            "the file cannot be changed there without touching other settings; use \
             `talaria config edit`"
                .to_owned(),
        ),
    }
}

/// `text` without the setting at `path`, everything else kept byte for
/// byte; `text` itself when the setting is not there.
pub fn remove(text: &str, path: &[String]) -> Result<String, String> {
    let Some((last, parents)) = path.split_last() else {
        return Err("no setting named".to_owned());
    };
    let before = meaning(text)?;
    let mut node = &before;
    for key in parents {
        match node.get(key) {
            Some(child @ Value::Object(_)) => node = child,
            _ => return Ok(text.to_owned()),
        }
    }
    if node.get(last).is_none() {
        return Ok(text.to_owned());
    }
    let doc = Document::from_str(text)
        .map_err(|_| "its layout is one this editor cannot follow".to_owned())?;
    let mut mapping = doc
        .as_mapping()
        .ok_or_else(|| "its layout is one this editor cannot follow".to_owned())?;
    for key in parents {
        mapping = mapping
            .get_mapping(key.as_str())
            .ok_or_else(|| format!("`{key}` is written in a way this editor cannot follow"))?;
    }
    mapping.remove(last.as_str());
    let edited = doc.to_string();
    let mut expected = before;
    take(&mut expected, path);
    match meaning(&edited) {
        Ok(after) if after == expected => Ok(edited),
        _ => Err(
            "the file cannot be changed there without touching other settings; use              `talaria config edit`"
                .to_owned(),
        ),
    }
}

/// The edit itself: `path[..present]` are mappings already.
fn edit(
    text: &str,
    before: &Value,
    path: &[String],
    present: usize,
    value: &Value,
) -> Result<String, String> {
    let empty = before.as_object().is_some_and(Map::is_empty);
    let root = Document::from_str(text)
        .ok()
        .and_then(|doc| doc.as_mapping().map(|m| (doc, m)));
    let Some((doc, root)) = root else {
        // Nothing but comments (or nothing): the settings go after them.
        if !empty {
            return Err("its layout is one this editor cannot follow".to_owned());
        }
        let added = nested(path, value)?.build_document().to_string();
        let mut out = text.to_owned();
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&added);
        return Ok(out);
    };
    let mut mapping: Mapping = root;
    for key in &path[..present] {
        mapping = mapping
            .get_mapping(key.as_str())
            .ok_or_else(|| format!("`{key}` is written in a way this editor cannot follow"))?;
    }
    if present + 1 == path.len() {
        set_scalar(&mapping, &path[present], value)?;
    } else {
        let inner = nested(&path[present + 1..], value)?.build_document();
        let inner = inner
            .as_mapping()
            .ok_or_else(|| "cannot build the new settings".to_owned())?;
        mapping.set(path[present].as_str(), inner);
    }
    Ok(doc.to_string())
}

/// Mappings one inside the other along `path`, `value` at the end.
fn nested(path: &[String], value: &Value) -> Result<MappingBuilder, String> {
    let Some((last, parents)) = path.split_last() else {
        return Err("no setting named".to_owned());
    };
    let mut builder = pair(MappingBuilder::new(), last, value)?;
    for key in parents.iter().rev() {
        builder = MappingBuilder::new().insert_mapping(key.as_str(), builder);
    }
    Ok(builder)
}

fn pair(builder: MappingBuilder, key: &str, value: &Value) -> Result<MappingBuilder, String> {
    Ok(match value {
        Value::Null => builder.pair(key, Option::<i64>::None),
        Value::Bool(b) => builder.pair(key, *b),
        Value::String(s) => builder.pair(key, s.as_str()),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => builder.pair(key, i),
            (_, Some(u), _) => builder.pair(key, u),
            (_, _, Some(f)) => builder.pair(key, f),
            _ => return Err(format!("cannot write the number {n}")),
        },
        other => return Err(format!("{} cannot be set here", kind(other))),
    })
}

fn set_scalar(mapping: &Mapping, key: &str, value: &Value) -> Result<(), String> {
    match value {
        Value::Null => mapping.set(key, Option::<i64>::None),
        Value::Bool(b) => mapping.set(key, *b),
        Value::String(s) => mapping.set(key, s.as_str()),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => mapping.set(key, i),
            (_, Some(u), _) => mapping.set(key, u),
            (_, _, Some(f)) => mapping.set(key, f),
            _ => return Err(format!("cannot write the number {n}")),
        },
        other => return Err(format!("{} cannot be set here", kind(other))),
    }
    Ok(())
}

/// `tree` with `value` at `path`, making mappings on the way.
fn put(tree: &mut Value, path: &[String], value: Value) {
    let Some((first, rest)) = path.split_first() else {
        *tree = value;
        return;
    };
    if !tree.is_object() {
        *tree = Value::Object(Map::new());
    }
    if let Value::Object(map) = tree {
        let child = map.entry(first.clone()).or_insert(Value::Null);
        put(child, rest, value);
    }
}

/// `tree` without the value at `path`.
fn take(tree: &mut Value, path: &[String]) {
    match path {
        [last] => {
            if let Value::Object(map) = tree {
                map.remove(last);
            }
        }
        [first, rest @ ..] => {
            if let Some(child) = tree.get_mut(first) {
                take(child, rest);
            }
        }
        [] => {}
    }
}

/// What a value is, for people.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "empty",
        Value::Bool(_) => "true or false",
        Value::Number(_) => "a number",
        Value::String(_) => "text",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> Vec<String> {
        parse_key(k).unwrap()
    }

    fn set_to(text: &str, k: &str, v: &str) -> Result<String, String> {
        set(text, &key(k), &parse_value(v).unwrap())
    }

    const COMMENTED: &str = "\
# Talaria's configuration.
model:
  # the big one, on the GPU box
  default: qwen3:32b   # pinned
  base_url: http://127.0.0.1:11434/v1

# agent settings
agent:
    max_turns: 20      # four-space indentation here
terminal:
  backend: local
";

    #[test]
    fn a_key_is_removed_with_its_line_and_the_comments_stay() {
        let out = remove(COMMENTED, &key("model.base_url")).unwrap();
        assert_eq!(
            out,
            COMMENTED.replace("  base_url: http://127.0.0.1:11434/v1\n", "")
        );
        // Not there: nothing to do.
        assert_eq!(remove(COMMENTED, &key("model.api_key")).unwrap(), COMMENTED);
        assert_eq!(remove(COMMENTED, &key("nope.api_key")).unwrap(), COMMENTED);
        // A key whose parent is not a mapping is not there either.
        assert_eq!(
            remove(COMMENTED, &key("model.default.x")).unwrap(),
            COMMENTED
        );
    }

    #[test]
    fn a_scalar_is_replaced_where_it_stands_and_nothing_else_moves() {
        let out = set_to(COMMENTED, "model.default", "qwen3:4b").unwrap();
        assert_eq!(
            out,
            COMMENTED.replace(
                "default: qwen3:32b   # pinned",
                "default: qwen3:4b   # pinned"
            )
        );
        let out = set_to(COMMENTED, "agent.max_turns", "30").unwrap();
        assert_eq!(out, COMMENTED.replace("max_turns: 20 ", "max_turns: 30 "));
    }

    #[test]
    fn a_missing_key_joins_its_parent_at_its_siblings_indentation() {
        let out = set_to(COMMENTED, "agent.api_max_retries", "2").unwrap();
        assert_eq!(
            out,
            COMMENTED.replace(
                "    max_turns: 20      # four-space indentation here\n",
                "    max_turns: 20      # four-space indentation here\n    api_max_retries: 2\n"
            )
        );
    }

    #[test]
    fn missing_parents_are_made() {
        let out = set_to(COMMENTED, "web.search.backend", "searxng").unwrap();
        assert_eq!(
            out,
            format!("{COMMENTED}web:\n  search:\n    backend: searxng\n")
        );
        // Under an existing parent, the new mapping sits with its siblings.
        let out = set_to(COMMENTED, "model.routes.fast.model", "qwen3:4b").unwrap();
        assert!(
            out.contains(
                "  base_url: http://127.0.0.1:11434/v1\n  routes:\n    fast:\n      model: qwen3:4b\n"
            ),
            "{out}"
        );
        // A key left empty is a parent to fill, its comments kept.
        let out = set_to(
            "web:\n  # search: later\nmodel: {}\n",
            "web.timeout_secs",
            "5",
        )
        .unwrap();
        assert!(
            out.starts_with("web:\n  timeout_secs: 5\n  # search: later\n"),
            "{out}"
        );
    }

    #[test]
    fn an_empty_or_comment_only_file_gets_the_setting_after_its_comments() {
        assert_eq!(
            set_to("", "agent.max_turns", "5").unwrap(),
            "agent:\n  max_turns: 5\n"
        );
        assert_eq!(
            set_to("# nothing yet", "agent.max_turns", "5").unwrap(),
            "# nothing yet\nagent:\n  max_turns: 5\n"
        );
    }

    #[test]
    fn values_are_yaml_scalars_written_so_they_read_back_the_same() {
        for (given, read) in [
            ("30", serde_json::json!(30)),
            ("0.5", serde_json::json!(0.5)),
            ("2.0", serde_json::json!(2.0)),
            ("true", serde_json::json!(true)),
            ("null", Value::Null),
            ("qwen3:4b", serde_json::json!("qwen3:4b")),
            ("'true'", serde_json::json!("true")),
            ("\"30\"", serde_json::json!("30")),
            ("'a #b'", serde_json::json!("a #b")),
            ("'hello: world'", serde_json::json!("hello: world")),
        ] {
            let value = parse_value(given).unwrap();
            assert_eq!(value, read, "{given}");
            let out = set(COMMENTED, &key("model.default"), &value).unwrap();
            let meant = meaning(&out).unwrap();
            assert_eq!(meant["model"]["default"], read, "{given}: {out}");
        }
        assert!(
            parse_value("hello: world")
                .unwrap_err()
                .contains("quote it")
        );
        assert!(parse_value("[a, b]").unwrap_err().contains("config edit"));
    }

    #[test]
    fn what_cannot_be_set_as_one_value_is_refused_with_the_reason() {
        let e = set_to(COMMENTED, "model", "x").unwrap_err();
        assert!(e.contains("`model` is a mapping of settings"), "{e}");
        assert!(e.contains("(base_url, default)"), "{e}");
        let e = set_to(COMMENTED, "model.default.name", "x").unwrap_err();
        assert!(e.contains("`model.default` is text, not a mapping"), "{e}");
        let e = set_to("web:\n  allow_hosts: [a, b]\n", "web.allow_hosts", "c").unwrap_err();
        assert!(e.contains("is a list"), "{e}");
        let e = set_to("model: [\n", "model.default", "x").unwrap_err();
        assert!(e.contains("not valid YAML"), "{e}");
        assert!(parse_key("agent..max_turns").is_err());
        assert!(parse_key("").is_err());
    }

    #[test]
    fn flow_mappings_crlf_and_anchors_survive() {
        let flow = "model:\n  routes:\n    fast: {model: qwen3:4b}  # quick\n";
        let out = set_to(flow, "model.routes.fast.model", "qwen3:8b").unwrap();
        assert_eq!(out, flow.replace("qwen3:4b", "qwen3:8b"));
        let crlf = "agent:\r\n  max_turns: 20\r\n# end\r\n";
        let out = set_to(crlf, "agent.max_turns", "21").unwrap();
        assert_eq!(out, crlf.replace("20", "21"));
        let anchors = "base: &b\n  x: 1\nother:\n  <<: *b\n  y: 2\n";
        let out = set_to(anchors, "other.y", "3").unwrap();
        assert_eq!(out, anchors.replace("y: 2", "y: 3"));
    }
}
