use std::path::Path;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::{DuplicateKeyPolicy, MessageFormatter, Spanned, UserMessageFormatter};

use super::ConfigError;

/// A document that is not YAML.
pub(super) fn syntax(text: &str, origin: &Path, e: &serde_saphyr::Error) -> ConfigError {
    let location = e.location().filter(|l| l.line() > 0);
    let mut line = location.map(|l| l.line());
    let raw: String = UserMessageFormatter
        .format_message(e)
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    // The error itself, under the snippet and alias wrappers.
    let mut inner = e;
    while let serde_saphyr::Error::WithSnippet { error, .. }
    | serde_saphyr::Error::AliasError { error, .. } = inner
    {
        inner = error;
    }
    let message = if let serde_saphyr::Error::DuplicateMappingKey { key, .. } = inner {
        duplicate(
            text,
            key.as_deref(),
            location.map(|l| (l.line(), l.column())),
        )
    } else if let Some(tab) = tab_indentation(text, line) {
        line = Some(tab);
        "a tab is used for indentation; YAML indents with spaces only (replace the tab \
         with spaces)"
            .to_owned()
    } else {
        format!("this is not valid YAML: {raw}")
    };
    ConfigError::Syntax {
        path: origin.to_owned(),
        line,
        message,
    }
}

/// The same key twice in one mapping, which a pasted snippet causes
/// (a second `model:` block).
fn duplicate(text: &str, key: Option<&str>, at: Option<(u64, u64)>) -> String {
    let Some(key) = key else {
        return "a key appears twice in the same place; keep one of them".to_owned();
    };
    // The later one is where the parser stopped; keeping it shows the
    // path, keeping the first shows where that one is.
    let found = at.and_then(|(line, column)| {
        let last = outline(text, DuplicateKeyPolicy::LastWins)?;
        let path = path_of_key(&last, line, column)?;
        let block = node_at(&last, &path).is_some_and(|n| matches!(n.kind, Kind::Map(_)));
        let first = outline(text, DuplicateKeyPolicy::FirstWins)
            .and_then(|first| line_of_path(&first, &path));
        Some((render(&path), block, first))
    });
    // A block (a pasted `model:` section) is merged; a plain value is
    // given once.
    let fix = |block: bool| {
        if block {
            format!("keep one `{key}:` block and move the other's settings into it")
        } else {
            "keep only one of them".to_owned()
        }
    };
    match found {
        Some((path, block, Some(first))) => {
            format!(
                "`{path}` is given twice (also on line {first}); {}",
                fix(block)
            )
        }
        Some((path, block, None)) => format!("`{path}` is given twice; {}", fix(block)),
        None => format!("`{key}` is given twice in the same place; {}", fix(false)),
    }
}

/// The line of the first tab in the indentation at or above the line
/// the parser complained about: a parser reports a tab where the
/// indentation stops making sense, often the line after.
fn tab_indentation(text: &str, reported: Option<u64>) -> Option<u64> {
    let lines: Vec<&str> = text.lines().collect();
    let last = reported
        .and_then(|l| usize::try_from(l).ok())
        .unwrap_or(lines.len())
        .min(lines.len());
    let indented_with_tab = |l: &&str| {
        l.chars()
            .take_while(|c| c.is_whitespace())
            .any(|c| c == '\t')
    };
    // Nearest to the reported line first.
    (0..last)
        .rev()
        .find(|&i| lines.get(i).is_some_and(indented_with_tab))
        .or_else(|| lines.iter().position(indented_with_tab))
        .and_then(|i| u64::try_from(i + 1).ok())
}

/// A value of the wrong form, found while reading the schema.
pub(super) fn invalid(
    text: &str,
    origin: &Path,
    e: serde_path_to_error::Error<serde_json::Error>,
) -> ConfigError {
    invalid_under(text, origin, "", e)
}

/// [`invalid`] for a value read apart from the rest, from under the
/// dotted key `prefix` (`platforms.<name>`): its path, and the line, are
/// looked up below that key.
pub(super) fn invalid_under(
    text: &str,
    origin: &Path,
    prefix: &str,
    e: serde_path_to_error::Error<serde_json::Error>,
) -> ConfigError {
    let under = prefix
        .split('.')
        .filter(|k| !k.is_empty())
        .map(|k| Part::Key(k.to_owned()));
    let read = e.path().iter().filter_map(|segment| match segment {
        serde_path_to_error::Segment::Map { key } => Some(Part::Key(key.clone())),
        serde_path_to_error::Segment::Seq { index } => Some(Part::Index(*index)),
        serde_path_to_error::Segment::Enum { variant } => Some(Part::Key(variant.clone())),
        serde_path_to_error::Segment::Unknown => None,
    });
    let mut path: Vec<Part> = under.chain(read).collect();
    let mut message = plain(&e.into_inner().to_string());
    // A missing key is reported on its parent; name it instead.
    if let Some(field) = missing_field(&message) {
        path.push(Part::Key(field));
        message = "this key is required here but missing".to_owned();
    }
    let line =
        outline(text, DuplicateKeyPolicy::LastWins).and_then(|root| line_of_path(&root, &path));
    ConfigError::Invalid {
        path: origin.to_owned(),
        key: if path.is_empty() {
            "(top level)".to_owned()
        } else {
            render(&path)
        },
        line,
        message,
    }
}

/// Adds the key's line to an error of [`super::Config::validate`].
pub(super) fn with_line(text: &str, e: ConfigError) -> ConfigError {
    match e {
        ConfigError::Invalid {
            path,
            key,
            line: None,
            message,
        } => {
            let line = outline(text, DuplicateKeyPolicy::LastWins)
                .and_then(|root| line_of_dotted(&root, &key));
            ConfigError::Invalid {
                path,
                key,
                line,
                message,
            }
        }
        other => other,
    }
}

fn missing_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("missing field `")?;
    Some(rest.strip_suffix('`')?.to_owned())
}

/// serde's message in plain words: what was expected and what was
/// found.
fn plain(message: &str) -> String {
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix)
            && let Some((found, expected)) = rest.rsplit_once(", expected ")
        {
            return format!(
                "expected {}, not {}",
                expected_words(expected),
                found_words(found)
            );
        }
    }
    if let Some(rest) = message.strip_prefix("unknown variant `")
        && let Some((given, choices)) = rest.split_once("`, expected ")
    {
        let choices = choices
            .trim_start_matches("one of ")
            .replace(" or ", ", ")
            .replace('`', "");
        return format!("`{given}` is not one of the choices: {choices}");
    }
    message.to_owned()
}

fn expected_words(expected: &str) -> String {
    let whole = |max: &str| format!("a whole number from 0 to {max}");
    match expected {
        "u8" => whole("255"),
        "u16" => whole("65535"),
        "u32" => whole("4294967295"),
        "u64" | "u128" | "usize" => "a whole number (0 or more)".to_owned(),
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "a whole number".to_owned(),
        "f32" | "f64" => "a number".to_owned(),
        "a boolean" => "true or false".to_owned(),
        "a string" | "a borrowed string" | "a character" => "text".to_owned(),
        "a sequence" => "a list".to_owned(),
        e if e == "a map" || e.starts_with("struct ") || e.starts_with("map") => {
            "indented `key: value` settings".to_owned()
        }
        e => e.to_owned(),
    }
}

fn found_words(found: &str) -> String {
    let quoted = |prefix: &str| {
        found
            .strip_prefix(prefix)
            .map(|v| v.trim_matches('`').to_owned())
    };
    if let Some(s) = found.strip_prefix("string ") {
        format!("the text {s}")
    } else if let Some(n) = quoted("integer ").or_else(|| quoted("floating point ")) {
        format!("the number {n}")
    } else if let Some(b) = quoted("boolean ") {
        format!("`{b}`")
    } else {
        match found {
            "unit value" => "empty".to_owned(),
            "sequence" => "a list".to_owned(),
            "map" => "indented settings".to_owned(),
            other => other.to_owned(),
        }
    }
}

/// One step of a key path.
#[derive(Debug, Clone, PartialEq)]
enum Part {
    Key(String),
    Index(usize),
}

/// `a.b[0].c`, as the errors name keys.
fn render(path: &[Part]) -> String {
    let mut out = String::new();
    for part in path {
        match part {
            Part::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Part::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// A YAML document reduced to where its keys and items are.
struct Node {
    line: u64,
    kind: Kind,
}

enum Kind {
    /// Each key with its own position (line, column) and its value.
    Map(Vec<(String, (u64, u64), Node)>),
    Seq(Vec<Node>),
    Leaf,
}

fn outline(text: &str, duplicates: DuplicateKeyPolicy) -> Option<Node> {
    let options = serde_saphyr::options! { duplicate_keys: duplicates };
    let root: Spanned<Shape> = serde_saphyr::from_str_with_options(text, options).ok()?;
    Some(node(root))
}

fn node(spanned: Spanned<Shape>) -> Node {
    let line = spanned.referenced.line();
    let kind = match spanned.value {
        Shape::Map(entries) => Kind::Map(
            entries
                .into_iter()
                .map(|(k, v)| {
                    let at = (k.referenced.line(), k.referenced.column());
                    (k.value.0, at, node(v))
                })
                .collect(),
        ),
        Shape::Seq(items) => Kind::Seq(items.into_iter().map(node).collect()),
        Shape::Leaf => Kind::Leaf,
    };
    Node { line, kind }
}

/// The line of the deepest part of `path` the document has: the key
/// itself, or its nearest parent when the key is missing.
fn line_of_path(root: &Node, path: &[Part]) -> Option<u64> {
    let mut here = root;
    let mut line = None;
    for part in path {
        let next = match (&here.kind, part) {
            (Kind::Map(entries), Part::Key(key)) => entries
                .iter()
                .find(|(k, _, _)| k == key)
                .map(|(_, (l, _), v)| (*l, v)),
            (Kind::Seq(items), Part::Index(i)) => items.get(*i).map(|v| (v.line, v)),
            _ => None,
        };
        match next {
            Some((l, node)) => {
                line = Some(l).filter(|l| *l > 0);
                here = node;
            }
            None => break,
        }
    }
    line
}

/// The node at `path`, if the document has it.
fn node_at<'a>(root: &'a Node, path: &[Part]) -> Option<&'a Node> {
    path.iter()
        .try_fold(root, |here, part| match (&here.kind, part) {
            (Kind::Map(entries), Part::Key(key)) => {
                entries.iter().find(|(k, _, _)| k == key).map(|(_, _, v)| v)
            }
            (Kind::Seq(items), Part::Index(i)) => items.get(*i),
            _ => None,
        })
}

/// [`line_of_path`] for a key written `a.b[0].c`, where a key may itself
/// hold dots (a server or route name): the longest key that fits wins.
fn line_of_dotted(root: &Node, dotted: &str) -> Option<u64> {
    let mut here = root;
    let mut rest = dotted;
    let mut line = None;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('[') {
            let (index, tail) = after.split_once(']')?;
            let Kind::Seq(items) = &here.kind else {
                break;
            };
            let Some(item) = index.parse::<usize>().ok().and_then(|i| items.get(i)) else {
                break;
            };
            line = Some(item.line).filter(|l| *l > 0).or(line);
            here = item;
            rest = tail.strip_prefix('.').unwrap_or(tail);
            continue;
        }
        let Kind::Map(entries) = &here.kind else {
            break;
        };
        let fits = |k: &str| {
            rest.strip_prefix(k)
                .is_some_and(|t| t.is_empty() || t.starts_with('.') || t.starts_with('['))
        };
        let Some((key, (l, _), value)) = entries
            .iter()
            .filter(|(k, _, _)| fits(k))
            .max_by_key(|(k, _, _)| k.len())
        else {
            break;
        };
        line = Some(*l).filter(|l| *l > 0).or(line);
        here = value;
        let tail = &rest[key.len()..];
        rest = tail.strip_prefix('.').unwrap_or(tail);
    }
    line
}

/// The path of the key written at `line`, `column`.
fn path_of_key(root: &Node, line: u64, column: u64) -> Option<Vec<Part>> {
    fn walk(node: &Node, line: u64, column: u64, path: &mut Vec<Part>) -> bool {
        match &node.kind {
            Kind::Map(entries) => {
                for (key, at, value) in entries {
                    path.push(Part::Key(key.clone()));
                    if at.0 == line && (at.1 == column || column == 0)
                        || walk(value, line, column, path)
                    {
                        return true;
                    }
                    path.pop();
                }
                false
            }
            Kind::Seq(items) => {
                for (i, item) in items.iter().enumerate() {
                    path.push(Part::Index(i));
                    if walk(item, line, column, path) {
                        return true;
                    }
                    path.pop();
                }
                false
            }
            Kind::Leaf => false,
        }
    }
    let mut path = Vec::new();
    (walk(root, line, column, &mut path) || walk(root, line, 0, &mut path)).then_some(path)
}

/// What a YAML node is, read through [`Spanned`] for the positions.
enum Shape {
    Map(Vec<(Spanned<KeyText>, Spanned<Shape>)>),
    Seq(Vec<Spanned<Shape>>),
    Leaf,
}

impl<'de> de::Deserialize<'de> for Shape {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Shape, D::Error> {
        d.deserialize_any(ShapeVisitor)
    }
}

struct ShapeVisitor;

impl<'de> Visitor<'de> for ShapeVisitor {
    type Value = Shape;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        Ok(Shape::Map(entries))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shape, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Shape::Seq(items))
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Shape, D::Error> {
        d.deserialize_any(ShapeVisitor)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Shape, E> {
        Ok(Shape::Leaf)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Shape, E> {
        Ok(Shape::Leaf)
    }
    fn visit_i128<E>(self, _: i128) -> Result<Shape, E> {
        Ok(Shape::Leaf)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Shape, E> {
        Ok(Shape::Leaf)
    }
    fn visit_u128<E>(self, _: u128) -> Result<Shape, E> {
        Ok(Shape::Leaf)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Shape, E> {
        Ok(Shape::Leaf)
    }
    fn visit_str<E>(self, _: &str) -> Result<Shape, E> {
        Ok(Shape::Leaf)
    }
    fn visit_bytes<E>(self, _: &[u8]) -> Result<Shape, E> {
        Ok(Shape::Leaf)
    }
    fn visit_unit<E>(self) -> Result<Shape, E> {
        Ok(Shape::Leaf)
    }
    fn visit_none<E>(self) -> Result<Shape, E> {
        Ok(Shape::Leaf)
    }
}

/// A mapping key as text, whatever scalar it is written as.
struct KeyText(String);

impl<'de> de::Deserialize<'de> for KeyText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<KeyText, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = KeyText;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E>(self, v: &str) -> Result<KeyText, E> {
                Ok(KeyText(v.to_owned()))
            }
            fn visit_bool<E>(self, v: bool) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_unit<E>(self) -> Result<KeyText, E> {
                Ok(KeyText(String::new()))
            }
        }
        d.deserialize_any(KeyVisitor)
    }
}
