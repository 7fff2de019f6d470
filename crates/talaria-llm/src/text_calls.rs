//! Tool calls a model wrote as text in its answer.
//!
//! Many local models (served by llama.cpp, vLLM, Ollama without a tool
//! parser) put their tool calls in the answer text, in the format their chat
//! template taught them, instead of the API's `tool_calls` field. Left
//! alone, the tool never runs and the user sees raw JSON. This module finds
//! those calls ([`TextCalls::extract`]) and keeps them off the screen while
//! an answer streams ([`Scrubber`]).
//!
//! The formats (`model.tool_call_parser`):
//!
//! - Hermes 2 Pro and Qwen 2.5: `<tool_call>{"name": ..., "arguments": ...}</tool_call>`,
//!   one block per call, anywhere in the answer;
//! - Llama 3.1: a JSON object `{"name": ..., "parameters": ...}` that is the
//!   answer, or follows `<|python_tag|>`;
//! - Mistral: `[TOOL_CALLS][{"name": ..., "arguments": ...}]`, or the newer
//!   `[TOOL_CALLS]name[ARGS]{...}`;
//! - plain JSON: an object (or a list of them) with a name and arguments at
//!   the start of the answer, optionally in a ```` ```json ```` fence.
//!
//! `auto` tries them all but accepts the calls only when the request offered
//! tools and every parsed name is one of them, so an answer that merely
//! looks like JSON stays text. A named parser tries only its format and
//! accepts any name (the agent repairs or refuses a wrong one). Parsing is
//! all or nothing: one malformed call leaves the whole answer as text.

use serde_json::Value;
use talaria_core::ToolCall;
use talaria_core::config::ToolCallParser;

use crate::ToolSpec;
use crate::repair::repair_json;

/// Opens a Hermes/Qwen call block.
const TOOL_CALL_OPEN: &str = "<tool_call>";
/// Closes it.
const TOOL_CALL_CLOSE: &str = "</tool_call>";
/// Llama 3.1's marker before a call.
const PYTHON_TAG: &str = "<|python_tag|>";
/// Mistral's marker before its calls.
const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
/// Separates the name from the arguments in Mistral's newer form.
const MISTRAL_ARGS: &str = "[ARGS]";
/// An optional call id in Mistral's newer form, before `[ARGS]`.
const MISTRAL_CALL_ID: &str = "[CALL_ID]";
/// A fenced JSON block.
const JSON_FENCE: &str = "```json";
/// Llama end-of-message tokens a server may leave in the text.
const LLAMA_END_TOKENS: [&str; 3] = ["<|eom_id|>", "<|eot_id|>", "<|end_of_text|>"];
/// A tool name longer than this is not a name but prose.
const MAX_NAME_LEN: usize = 128;

/// One text format of tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// `<tool_call>` blocks (Hermes, Qwen).
    Tagged,
    /// `<|python_tag|>` then JSON (Llama 3.1).
    PythonTag,
    /// `[TOOL_CALLS]` (Mistral).
    Mistral,
    /// A JSON object or list at the start of the answer, maybe fenced.
    BareJson,
}

const ALL_FORMATS: &[Format] = &[
    Format::Tagged,
    Format::PythonTag,
    Format::Mistral,
    Format::BareJson,
];

/// The formats a setting looks for. Llama 3 and Mistral include bare JSON
/// because servers that drop special tokens from the text turn
/// `<|python_tag|>{...}` into `{...}` and `[TOOL_CALLS][...]` into `[...]`.
fn formats(mode: ToolCallParser) -> &'static [Format] {
    match mode {
        ToolCallParser::Auto => ALL_FORMATS,
        ToolCallParser::Off => &[],
        ToolCallParser::Hermes | ToolCallParser::Qwen => &[Format::Tagged],
        ToolCallParser::Llama3 => &[Format::PythonTag, Format::BareJson],
        ToolCallParser::Mistral => &[Format::Mistral, Format::BareJson],
        ToolCallParser::Json => &[Format::BareJson],
    }
}

/// What an answer held once its text calls are taken out.
#[derive(Debug, Clone, PartialEq)]
pub struct Extracted {
    /// The answer without the calls (the text around them, trimmed).
    pub content: String,
    /// The calls, in the order written, each with a fresh id.
    pub calls: Vec<ToolCall>,
}

/// The text-call settings of one request: which formats, and which tool
/// names `auto` accepts.
#[derive(Debug, Clone, Default)]
pub struct TextCalls {
    formats: &'static [Format],
    /// The offered tools' names.
    offered: Vec<String>,
    /// `auto`: every parsed name must be offered.
    known_names_only: bool,
}

impl TextCalls {
    /// The settings for a request offering `tools` under `mode`. Without
    /// tools nothing is ever a call, whatever the mode.
    pub fn new(mode: ToolCallParser, tools: &[ToolSpec]) -> TextCalls {
        TextCalls {
            formats: if tools.is_empty() { &[] } else { formats(mode) },
            offered: tools.iter().map(|t| t.name.clone()).collect(),
            known_names_only: mode == ToolCallParser::Auto,
        }
    }

    /// Settings that never find a call.
    pub fn off() -> TextCalls {
        TextCalls {
            formats: &[],
            offered: Vec::new(),
            known_names_only: true,
        }
    }

    /// Whether answers are searched at all.
    pub fn is_active(&self) -> bool {
        !self.formats.is_empty()
    }

    fn has(&self, f: Format) -> bool {
        self.formats.contains(&f)
    }

    /// The calls written in `content` and the text around them, or `None`
    /// when the answer holds no call that these settings accept (it is then
    /// text, untouched).
    pub fn extract(&self, content: &str) -> Option<Extracted> {
        if !self.is_active() {
            return None;
        }
        let mut found: Calls = Vec::new();
        let mut kept = String::new();
        let mut pos = 0;
        if self.has(Format::BareJson)
            && let Some((end, calls)) = leading_json(content)?
        {
            found.extend(calls);
            pos = end;
        }
        while let Some((start, tag)) = self.next_tag(content, pos) {
            kept.push_str(&content[pos..start]);
            let after = start + tag.len();
            let (end, calls) = match tag {
                TOOL_CALL_OPEN => tagged_block(content, after)?,
                PYTHON_TAG => python_tag(content, after)?,
                _ => mistral(content, after)?,
            };
            found.extend(calls);
            pos = end;
        }
        if found.is_empty() {
            return None;
        }
        kept.push_str(&content[pos..]);
        if self.known_names_only && !found.iter().all(|(n, _)| self.offered.contains(n)) {
            return None;
        }
        Some(Extracted {
            content: kept.trim().to_owned(),
            calls: found
                .into_iter()
                .map(|(name, arguments)| ToolCall {
                    id: new_call_id(),
                    name,
                    arguments,
                })
                .collect(),
        })
    }

    /// The earliest marker of an enabled format at or after `from`.
    fn next_tag(&self, content: &str, from: usize) -> Option<(usize, &'static str)> {
        self.anywhere_openers()
            .filter_map(|tag| content[from..].find(tag).map(|i| (from + i, tag)))
            .min_by_key(|(i, _)| *i)
    }

    /// The markers that may open a call anywhere in the answer.
    fn anywhere_openers(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.formats.iter().filter_map(|f| match f {
            Format::Tagged => Some(TOOL_CALL_OPEN),
            Format::PythonTag => Some(PYTHON_TAG),
            Format::Mistral => Some(MISTRAL_CALLS),
            Format::BareJson => None,
        })
    }

    /// A stream filter for an answer under these settings.
    pub fn scrubber(&self) -> Scrubber {
        Scrubber {
            openers: self.anywhere_openers().collect(),
            check_start: self.has(Format::BareJson),
            start_decided: false,
            emitted: 0,
            holding: false,
        }
    }
}

/// Parsed calls as `(name, arguments JSON text)`.
type Calls = Vec<(String, String)>;

/// Where a run of calls ends in the answer, and the calls.
type Span = (usize, Calls);

/// A fresh call id, unlike any a server assigns.
fn new_call_id() -> String {
    use rand::Rng;
    let tail: String = rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .take(24)
        .map(char::from)
        .collect();
    format!("call_text_{tail}")
}

/// Parses one JSON value at the start of `text` (after whitespace); its
/// value and the byte offset just past it.
fn json_at(text: &str) -> Option<(Value, usize)> {
    let skipped = text.len() - text.trim_start().len();
    let mut it = serde_json::Deserializer::from_str(&text[skipped..]).into_iter::<Value>();
    match it.next() {
        Some(Ok(v)) => Some((v, skipped + it.byte_offset())),
        _ => None,
    }
}

/// `(name, arguments JSON text)` from one call object: `{"name", "arguments"
/// | "parameters"}`, or the same inside `{"function": {...}}`.
fn call_from_object(v: &Value) -> Option<(String, String)> {
    let v = v.get("function").filter(|f| f.is_object()).unwrap_or(v);
    let name = v.get("name")?.as_str()?.trim();
    if !plausible_name(name) {
        return None;
    }
    let args = v.get("arguments").or_else(|| v.get("parameters"))?;
    Some((name.to_owned(), arguments_text(args)?))
}

/// Whether `name` can be a tool's name: short, and letters, digits and
/// the separators tool names use (a near miss such as `functions.read_file`
/// included, for the agent to repair). Prose or markup is not a name.
fn plausible_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '/'))
}

/// Arguments as JSON text: an object as is, a string holding an object
/// (lightly repaired), nothing as `{}`; anything else is not a call.
fn arguments_text(args: &Value) -> Option<String> {
    match args {
        Value::Object(_) => Some(args.to_string()),
        Value::Null => Some("{}".to_owned()),
        Value::String(s) if s.trim().is_empty() => Some("{}".to_owned()),
        Value::String(s) => {
            let fixed = repair_json(s)?;
            serde_json::from_str::<Value>(&fixed)
                .ok()?
                .is_object()
                .then_some(fixed)
        }
        _ => None,
    }
}

/// Calls from an object or a non-empty list of them; `None` when any
/// element is not a call.
fn calls_from_value(v: &Value) -> Option<Calls> {
    match v {
        Value::Array(items) if !items.is_empty() => items.iter().map(call_from_object).collect(),
        Value::Object(_) => Some(vec![call_from_object(v)?]),
        _ => None,
    }
}

/// JSON values at `from`, one or more, separated by whitespace or `;`
/// (Llama sometimes writes several calls that way); the calls and the end.
fn json_calls(content: &str, from: usize) -> Option<Span> {
    let (v, len) = json_at(&content[from..])?;
    let mut calls = calls_from_value(&v)?;
    let mut end = from + len;
    loop {
        let rest = &content[end..];
        let trimmed = rest.trim_start().trim_start_matches(';').trim_start();
        if !trimmed.starts_with('{') {
            break;
        }
        let Some((v, len)) = json_at(trimmed) else {
            break;
        };
        let Some(more) = calls_from_value(&v) else {
            break;
        };
        calls.extend(more);
        end += rest.len() - trimmed.len() + len;
    }
    Some((end, calls))
}

/// The plain-JSON form at the start of the answer. `Some(None)`: the answer
/// does not start like one; `None`: it starts like one but is not a call,
/// which leaves the whole answer as text (a JSON answer is data, not a
/// call, and nothing after it is searched).
#[allow(clippy::option_option)]
fn leading_json(content: &str) -> Option<Option<Span>> {
    let start = content.len() - content.trim_start().len();
    let rest = &content[start..];
    if let Some(fenced) = rest.strip_prefix(JSON_FENCE) {
        let body = start + JSON_FENCE.len() + fenced.find('\n')? + 1;
        let (end, calls) = json_calls(content, body)?;
        let after = &content[end..];
        let close = after.trim_start();
        let close = close.strip_prefix("```")?;
        return Some(Some((content.len() - close.len(), calls)));
    }
    let first_after_bracket = rest
        .strip_prefix('[')
        .map(|r| r.trim_start().starts_with('{'));
    if rest.starts_with('{') || first_after_bracket == Some(true) {
        return json_calls(content, start).map(Some);
    }
    Some(None)
}

/// A `<tool_call>` block whose body starts at `from`: up to its closing tag,
/// or to the end when the model stopped before writing it.
fn tagged_block(content: &str, from: usize) -> Option<Span> {
    let (body_end, end) = match content[from..].find(TOOL_CALL_CLOSE) {
        Some(i) => (from + i, from + i + TOOL_CALL_CLOSE.len()),
        None => (content.len(), content.len()),
    };
    let body = content[from..body_end].trim();
    // Some models fence the JSON inside the block.
    let body = body
        .strip_prefix(JSON_FENCE)
        .or_else(|| body.strip_prefix("```"))
        .and_then(|b| b.strip_suffix("```"))
        .unwrap_or(body);
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    Some((end, calls_from_value(&v)?))
}

/// Skips the Llama end tokens (and whitespace) after `from`.
fn skip_llama_end(content: &str, mut from: usize) -> usize {
    loop {
        let rest = content[from..].trim_start();
        match LLAMA_END_TOKENS.iter().find(|t| rest.starts_with(**t)) {
            Some(t) => from = content.len() - rest.len() + t.len(),
            None => return from,
        }
    }
}

/// JSON after `<|python_tag|>`. Llama's built-in tools use a Python call
/// (`brave_search.call(query=...)`) there instead; that is not parsed.
fn python_tag(content: &str, from: usize) -> Option<Span> {
    let (end, calls) = json_calls(content, from)?;
    Some((skip_llama_end(content, end), calls))
}

/// What follows `[TOOL_CALLS]`: a JSON list of calls, or `name[ARGS]{...}`
/// (with an optional `[CALL_ID]id` before `[ARGS]`).
fn mistral(content: &str, from: usize) -> Option<Span> {
    let rest = content[from..].trim_start();
    if rest.starts_with('[') || rest.starts_with('{') {
        return json_calls(content, from);
    }
    let args_at = rest.find(MISTRAL_ARGS)?;
    let head = &rest[..args_at];
    let name = head.split(MISTRAL_CALL_ID).next()?.trim();
    if !plausible_name(name) {
        return None;
    }
    let args_from = content.len() - rest.len() + args_at + MISTRAL_ARGS.len();
    let (v, len) = json_at(&content[args_from..])?;
    Some((
        args_from + len,
        vec![(name.to_owned(), arguments_text(&v)?)],
    ))
}

/// Keeps text calls off the screen while an answer streams.
///
/// Fed the whole answer so far after each chunk, it says how much more of
/// it is safe to show. Text before a possible call marker is released as it
/// comes; from a marker on (`<tool_call>`, `<|python_tag|>`, `[TOOL_CALLS]`,
/// or `{`, `[{` or ```` ```json ```` opening the answer) the rest is held
/// until the answer is complete and [`Scrubber::finish`] decides. A few
/// bytes that may be the start of a marker (`<tool`) are held until the next
/// chunk settles it. It keeps only offsets: the text lives in the caller's
/// buffer, so holding costs no memory of its own.
#[derive(Debug, Clone, Default)]
pub struct Scrubber {
    openers: Vec<&'static str>,
    /// Whether the start of the answer is checked for plain JSON.
    check_start: bool,
    /// The start has been checked (or need not be).
    start_decided: bool,
    /// Bytes of the answer shown so far.
    emitted: usize,
    /// A marker was seen: nothing more is shown until the end.
    holding: bool,
}

/// What the start of an answer says about plain JSON.
enum Start {
    /// It opens like a call: hold everything.
    Call,
    /// Too little yet to tell.
    Unknown,
    /// It is not plain JSON.
    Text,
}

fn classify_start(content: &str) -> Start {
    let rest = content.trim_start();
    if rest.is_empty() {
        return Start::Unknown;
    }
    if rest.starts_with('{') || rest.starts_with(JSON_FENCE) {
        return Start::Call;
    }
    if JSON_FENCE.starts_with(rest) {
        return Start::Unknown;
    }
    if let Some(after) = rest.strip_prefix('[') {
        let after = after.trim_start();
        return if after.is_empty() {
            Start::Unknown
        } else if after.starts_with('{') {
            Start::Call
        } else {
            Start::Text
        };
    }
    Start::Text
}

impl Scrubber {
    /// The part of `content` (the whole answer so far) that may be shown
    /// now and was not shown before.
    pub fn advance<'c>(&mut self, content: &'c str) -> &'c str {
        if self.holding || self.emitted > content.len() {
            return "";
        }
        if self.check_start && !self.start_decided {
            match classify_start(content) {
                Start::Call => {
                    self.holding = true;
                    return "";
                }
                Start::Unknown => return "",
                Start::Text => self.start_decided = true,
            }
        }
        let region = &content[self.emitted..];
        let first = self.openers.iter().filter_map(|o| region.find(o)).min();
        let safe = match first {
            Some(at) => {
                self.holding = true;
                at
            }
            None => region.len() - self.partial_opener_len(region),
        };
        let shown = &region[..safe];
        self.emitted += safe;
        shown
    }

    /// The length of the longest tail of `region` that may grow into a
    /// marker.
    fn partial_opener_len(&self, region: &str) -> usize {
        let longest = self.openers.iter().map(|o| o.len()).max().unwrap_or(0);
        (1..longest.min(region.len() + 1))
            .rev()
            .find(|&k| {
                let at = region.len() - k;
                region.is_char_boundary(at)
                    && self.openers.iter().any(|o| o.starts_with(&region[at..]))
            })
            .unwrap_or(0)
    }

    /// The text still to show once the answer (`content`) is complete:
    /// with `cleaned` (the answer without its calls, when calls were found)
    /// the part of it not yet shown, else everything held back.
    pub fn finish(&mut self, content: &str, cleaned: Option<&str>) -> String {
        let shown = content.get(..self.emitted).unwrap_or(content);
        let rest = match cleaned {
            None => content.get(self.emitted..).unwrap_or_default(),
            Some(c) => c
                .strip_prefix(shown)
                .or_else(|| c.strip_prefix(shown.trim_end()).map(str::trim_start))
                .unwrap_or_default(),
        };
        self.emitted = content.len();
        self.holding = true;
        rest.to_owned()
    }

    /// Whether the filter lets everything through (nothing to look for).
    pub fn is_passthrough(&self) -> bool {
        self.openers.is_empty() && !self.check_start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools(names: &[&str]) -> Vec<ToolSpec> {
        names
            .iter()
            .map(|n| ToolSpec {
                name: (*n).to_owned(),
                description: String::new(),
                parameters: serde_json::json!({"type": "object"}),
            })
            .collect()
    }

    /// Streams `text` split at `cut` through a scrubber the way the
    /// accumulator does; what the user saw.
    fn stream_split(tc: &TextCalls, text: &str, cuts: &[usize]) -> String {
        let mut s = tc.scrubber();
        let mut content = String::new();
        let mut seen = String::new();
        let mut last = 0;
        for &c in cuts.iter().chain(std::iter::once(&text.len())) {
            content.push_str(&text[last..c]);
            last = c;
            seen.push_str(s.advance(&content));
        }
        let ex = tc.extract(&content);
        seen.push_str(&s.finish(&content, ex.as_ref().map(|e| e.content.as_str())));
        seen
    }

    fn boundaries(text: &str) -> impl Iterator<Item = usize> + '_ {
        (1..text.len()).filter(|&i| text.is_char_boundary(i))
    }

    #[test]
    fn every_single_and_double_chunk_boundary_hides_the_call() {
        let tc = TextCalls::new(ToolCallParser::Auto, &tools(&["todo", "read_file"]));
        let cases = [
            (
                "Let me look. <tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>",
                "Let me look.",
            ),
            ("{\"name\": \"todo\", \"parameters\": {}}", ""),
            ("Sure.\n[TOOL_CALLS]todo[ARGS]{\"a\":1}", "Sure."),
            (
                "ok <|python_tag|>{\"name\":\"todo\",\"parameters\":{}}<|eom_id|>",
                "ok",
            ),
            (
                "```json\n{\"name\":\"todo\",\"arguments\":{}}\n```\nafter",
                "after",
            ),
        ];
        for (text, want) in cases {
            for i in boundaries(text) {
                let seen = stream_split(&tc, text, &[i]);
                assert_eq!(seen.trim(), want, "{text:?} cut at {i}");
                for j in boundaries(text).filter(|&j| j > i) {
                    let seen = stream_split(&tc, text, &[i, j]);
                    assert_eq!(seen.trim(), want, "{text:?} cut at {i},{j}");
                    assert!(!seen.contains("\"name\""), "{seen:?}");
                }
            }
        }
    }

    #[test]
    fn text_that_is_not_a_call_is_released_whole_at_any_boundary() {
        let tc = TextCalls::new(ToolCallParser::Auto, &tools(&["todo"]));
        for text in [
            "plain answer with a < sign and [brackets]",
            "{\"name\": \"Bob\", \"arguments\": {}} is a person, not a tool",
            "[link](http://x) text",
            "  ```python\nprint(1)\n```",
            "héllo <tool_cal wörld",
            "<tool_call>{broken json</tool_call>",
        ] {
            for i in boundaries(text) {
                assert_eq!(stream_split(&tc, text, &[i]), text, "{text:?} cut at {i}");
            }
        }
    }

    #[test]
    fn text_before_a_marker_streams_before_the_end() {
        let tc = TextCalls::new(ToolCallParser::Auto, &tools(&["todo"]));
        let mut s = tc.scrubber();
        assert_eq!(s.advance("Checking the <to"), "Checking the ");
        assert_eq!(s.advance("Checking the <tool_call>{\"na"), "");
        assert_eq!(s.advance("Checking the <tool_call>{\"name\":\"todo\"}"), "");
        let mut s = tc.scrubber();
        assert_eq!(s.advance("  "), "");
        assert_eq!(s.advance("  Hi"), "  Hi");
        assert_eq!(s.advance("  Hi <"), " ");
        assert_eq!(s.advance("  Hi <b>"), "<b>");
    }

    #[test]
    fn off_and_no_tools_pass_everything_through() {
        for tc in [
            TextCalls::new(ToolCallParser::Off, &tools(&["todo"])),
            TextCalls::new(ToolCallParser::Auto, &[]),
            TextCalls::new(ToolCallParser::Hermes, &[]),
        ] {
            let text = "<tool_call>{\"name\":\"todo\",\"arguments\":{}}</tool_call>";
            assert!(tc.extract(text).is_none());
            assert!(tc.scrubber().is_passthrough());
            assert_eq!(tc.scrubber().advance(text), text);
        }
    }

    #[test]
    fn a_named_parser_accepts_unknown_names_but_only_its_format() {
        let t = tools(&["todo"]);
        let hermes = TextCalls::new(ToolCallParser::Hermes, &t);
        let ex = hermes
            .extract("<tool_call>{\"name\":\"ReadFile\",\"arguments\":{}}</tool_call>")
            .unwrap();
        assert_eq!(ex.calls[0].name, "ReadFile");
        assert!(
            hermes
                .extract("{\"name\":\"todo\",\"arguments\":{}}")
                .is_none()
        );
        let json = TextCalls::new(ToolCallParser::Json, &t);
        assert!(
            json.extract("<tool_call>{\"name\":\"todo\",\"arguments\":{}}</tool_call>")
                .is_none()
        );
        assert!(
            json.extract("{\"name\":\"todo\",\"arguments\":{}}")
                .is_some()
        );
    }

    #[test]
    fn ids_are_fresh() {
        let tc = TextCalls::new(ToolCallParser::Auto, &tools(&["todo"]));
        let ex = tc
            .extract("<tool_call>{\"name\":\"todo\",\"arguments\":{}}</tool_call><tool_call>{\"name\":\"todo\",\"arguments\":{}}</tool_call>")
            .unwrap();
        assert_eq!(ex.calls.len(), 2);
        assert_ne!(ex.calls[0].id, ex.calls[1].id);
        assert!(ex.calls[0].id.starts_with("call_text_"));
    }
}
