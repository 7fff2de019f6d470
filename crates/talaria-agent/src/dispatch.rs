//! Turning one assistant row's tool calls into a plan, and running a single
//! call safely.
//!
//! The turn loop walks the plan in order, running parallel-safe calls
//! together and everything else one at a time; this module decides what
//! each call is (run it, answer it with an error straight away, or reuse a
//! twin's result) and contains the panic and interrupt handling around one
//! execution.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use talaria_core::ToolCall;

use crate::tools::{Registry, Tool, ToolContext};

/// Most parallel-safe calls running at once.
pub const MAX_PARALLEL: usize = 8;

/// How long a tool may keep running after the interrupt before its task is
/// aborted. Tools are expected to watch the token; this bounds the wait for
/// those that do not.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(3);

/// The result text for malformed arguments. Part of the model-facing
/// contract inherited from the ancestor, so models trained on it recognise it.
pub const INVALID_ARGUMENTS: &str = r#"{"error":"Invalid tool arguments","message":"Tool arguments must be a valid JSON object; tool was not executed."}"#;

/// Close names listed when a tool name cannot be repaired.
const MAX_SUGGESTIONS: usize = 5;

/// What to do with one call of a batch.
pub enum Action {
    /// Execute the tool with these parsed arguments.
    Run {
        /// The registered tool.
        tool: Arc<dyn Tool>,
        /// The parsed argument object.
        args: serde_json::Value,
        /// The name the model wrote when it was not the tool's (a repaired
        /// near miss); the result tells the model.
        repaired_from: Option<String>,
    },
    /// Do not execute; answer with this (error) text.
    Immediate(String),
    /// Same name and arguments as the call at this earlier index of the
    /// batch: reuse its result instead of doing the work twice.
    Duplicate(usize),
}

/// One call of a batch with its decided action.
pub struct Planned {
    /// The call as the model wrote it.
    pub call: ToolCall,
    /// What the loop will do with it.
    pub action: Action,
}

impl Planned {
    /// Whether it may run alongside other parallel-safe calls.
    pub fn parallel_safe(&self) -> bool {
        match &self.action {
            Action::Run { tool, .. } => tool.parallel_safe(),
            // Nothing is executed, so nothing can conflict.
            Action::Immediate(_) | Action::Duplicate(_) => true,
        }
    }
}

/// Decides the action for each call, in order.
pub fn plan(calls: &[ToolCall], registry: &Registry) -> Vec<Planned> {
    let mut seen: HashMap<(String, String), usize> = HashMap::new();
    calls
        .iter()
        .enumerate()
        .map(|(i, call)| {
            let action = match (
                resolve(&call.name, registry),
                parse_arguments(&call.arguments),
            ) {
                (Err(refusal), _) => Action::Immediate(refusal),
                (Ok(_), None) => Action::Immediate(INVALID_ARGUMENTS.to_owned()),
                (Ok((tool, repaired)), Some(args)) => {
                    // Compare parsed values so that whitespace or key order
                    // differences still count as the same call; a repaired
                    // name counts as the tool's own.
                    let key = (tool.name().to_owned(), args.to_string());
                    match seen.get(&key) {
                        Some(&first) => Action::Duplicate(first),
                        None => {
                            seen.insert(key, i);
                            Action::Run {
                                tool: tool.clone(),
                                args,
                                repaired_from: repaired.then(|| call.name.clone()),
                            }
                        }
                    }
                }
            };
            Planned {
                call: call.clone(),
                action,
            }
        })
        .collect()
}

/// Groups plan indices into the order they run in: a group with several
/// entries runs concurrently, a group of one runs alone.
pub fn groups(plan: &[Planned]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut current_parallel = false;
    for (i, p) in plan.iter().enumerate() {
        let par = p.parallel_safe();
        match out.last_mut() {
            Some(group) if par && current_parallel => group.push(i),
            _ => {
                out.push(vec![i]);
                current_parallel = par;
            }
        }
    }
    out
}

/// The argument object, or `None` when the text is not a JSON object.
/// Blank text means "no arguments": models send it for parameterless tools.
pub fn parse_arguments(text: &str) -> Option<serde_json::Value> {
    if text.trim().is_empty() {
        return Some(serde_json::Value::Object(Default::default()));
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v @ serde_json::Value::Object(_)) => Some(v),
        _ => None,
    }
}

/// The tool a call names: the exact name or alias, else the one tool a
/// near miss can only mean (`true` then: the name was repaired). `Err` is
/// the error result for a name that fits no tool or several.
pub fn resolve<'r>(
    name: &str,
    registry: &'r Registry,
) -> Result<(&'r Arc<dyn Tool>, bool), String> {
    if let Some(tool) = registry.get(name) {
        return Ok((tool, false));
    }
    let wanted = spellings(name);
    let matches: Vec<&Arc<dyn Tool>> = registry
        .tools()
        .filter(|t| {
            std::iter::once(t.name())
                .chain(t.alias())
                .any(|known| wanted.contains(&squash(known)))
        })
        .collect();
    match matches.as_slice() {
        [tool] => Ok((*tool, true)),
        _ => Err(unknown_tool(name, registry)),
    }
}

/// The ways a near-miss name may be meant, squashed (see [`squash`]): as
/// written, without a namespace (`functions.read_file`), and either of
/// those without a `_tool` suffix (`read_file_tool`).
fn spellings(name: &str) -> Vec<String> {
    let mut out = vec![squash(name)];
    if let Some((_, last)) = name.rsplit_once(['.', ':', '/']) {
        out.push(squash(last));
    }
    let bare: Vec<String> = out
        .iter()
        .filter_map(|s| s.strip_suffix("tool"))
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    out.extend(bare);
    out
}

/// A name with case and separators (`-`, `_`, `.`, spaces) taken out, so
/// `ReadFile`, `read-file` and `READ_FILE` all read `readfile`.
fn squash(name: &str) -> String {
    name.chars()
        .filter(|c| !matches!(c, '-' | '_' | '.' | ' '))
        .flat_map(char::to_lowercase)
        .collect()
}

/// The tool result for a call whose name was repaired, so the model learns
/// the right name.
pub fn repaired_note(written: &str, tool: &str, output: &str) -> String {
    format!("note: there is no tool `{written}`; ran `{tool}`.\n{output}")
}

/// Levenshtein distance between two short strings (names).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = if ca == *cb {
                diagonal
            } else {
                1 + diagonal.min(above).min(row[j])
            };
            diagonal = above;
        }
    }
    row[b.len()]
}

/// Up to [`MAX_SUGGESTIONS`] tool names close to `name`, closest first: a
/// small edit distance (about a third of the name) or a shared start of
/// at least four characters, both compared squashed.
fn close_names<'r>(name: &str, registry: &'r Registry) -> Vec<&'r str> {
    // Names are short; a very long "name" is not worth comparing whole.
    let wanted: String = squash(name).chars().take(64).collect();
    if wanted.is_empty() {
        return Vec::new();
    }
    let mut scored: Vec<(usize, &str)> = registry
        .names()
        .into_iter()
        .filter_map(|known| {
            let k = squash(known);
            let distance = edit_distance(&wanted, &k);
            let limit = (wanted.chars().count().max(k.chars().count()) / 3).max(1);
            let shared = wanted
                .chars()
                .zip(k.chars())
                .take_while(|(a, b)| a == b)
                .count();
            (distance <= limit || shared >= 4).then_some((distance, known))
        })
        .collect();
    scored.sort();
    scored
        .into_iter()
        .take(MAX_SUGGESTIONS)
        .map(|(_, n)| n)
        .collect()
}

/// The error result for a name no tool answers to: the close names when
/// there are any, else every tool.
pub fn unknown_tool(name: &str, registry: &Registry) -> String {
    let available = registry.names().join(", ");
    if name.trim().is_empty() {
        return error_json(&format!(
            "The tool call had no tool name. Available tools: {available}"
        ));
    }
    let close = close_names(name, registry);
    let message = if close.is_empty() {
        format!("Tool '{name}' does not exist. Available tools: {available}")
    } else {
        format!(
            "Tool '{name}' does not exist. Did you mean: {}?",
            close.join(", ")
        )
    };
    error_json(&message)
}

/// `{"error": message}`.
pub fn error_json(message: &str) -> String {
    serde_json::json!({ "error": message }).to_string()
}

/// The result recorded for a call that never started because of an interrupt.
pub fn skipped(name: &str) -> String {
    format!("[Tool execution skipped — {name} was not started: the user interrupted]")
}

/// Runs one call in its own task so that a panicking tool becomes an error
/// result instead of taking the process down. Returns the result text and
/// whether the tool succeeded.
pub async fn execute(
    tool: Arc<dyn Tool>,
    args: serde_json::Value,
    ctx: ToolContext,
) -> (String, bool) {
    let name = tool.name().to_owned();
    let untrusted = tool.untrusted_output();
    let cancel = ctx.cancel.clone();
    let mut task = tokio::spawn(async move { tool.call(args, &ctx).await });
    let joined = tokio::select! {
        joined = &mut task => joined,
        () = async {
            cancel.cancelled().await;
            tokio::time::sleep(INTERRUPT_GRACE).await;
        } => {
            task.abort();
            return (
                error_json(&format!("{name} was stopped because the user interrupted")),
                false,
            );
        }
    };
    match joined {
        Ok(Ok(output)) if untrusted => (crate::untrusted::wrap(&name, &output), true),
        Ok(Ok(output)) => (output, true),
        Ok(Err(e)) => (error_json(&e.0), false),
        Err(e) if e.is_panic() => {
            let payload = e.into_panic();
            let detail = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no details".to_owned());
            tracing::error!("tool {name} panicked: {detail}");
            (error_json(&format!("Tool {name} crashed: {detail}")), false)
        }
        Err(_) => (error_json(&format!("{name} was cancelled")), false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;

    use crate::tools::ToolResult;

    struct T {
        name: &'static str,
        parallel: bool,
    }

    #[async_trait]
    impl Tool for T {
        fn name(&self) -> &str {
            self.name
        }
        fn description(&self) -> &str {
            "t"
        }
        fn parameters(&self) -> serde_json::Value {
            serde_json::json!({"type": "object"})
        }
        fn parallel_safe(&self) -> bool {
            self.parallel
        }
        async fn call(&self, _args: serde_json::Value, _ctx: &ToolContext) -> ToolResult {
            Ok("ok".into())
        }
    }

    fn registry() -> Registry {
        let mut r = Registry::new();
        r.register(Arc::new(T {
            name: "read",
            parallel: true,
        }))
        .unwrap();
        r.register(Arc::new(T {
            name: "write",
            parallel: false,
        }))
        .unwrap();
        r
    }

    fn call(id: &str, name: &str, args: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: args.into(),
        }
    }

    #[test]
    fn arguments_must_be_an_object() {
        assert!(parse_arguments("{\"a\":1}").is_some());
        assert!(parse_arguments("  ").is_some());
        assert!(parse_arguments("[1]").is_none());
        assert!(parse_arguments("{\"a\":").is_none());
        assert!(parse_arguments("\"x\"").is_none());
    }

    #[test]
    fn plan_classifies_calls() {
        let r = registry();
        let p = plan(
            &[
                call("1", "read", "{\"p\": 1, \"q\": 2}"),
                call("2", "nope", "{}"),
                call("3", "read", "{\"q\":2,\"p\":1}"),
                call("4", "write", "not json"),
                call("5", "write", "{}"),
            ],
            &r,
        );
        assert!(matches!(p[0].action, Action::Run { .. }));
        match &p[1].action {
            Action::Immediate(t) => {
                assert!(
                    t.contains("Tool 'nope' does not exist") && t.contains("read, write"),
                    "{t}"
                )
            }
            _ => panic!("unknown tool should be answered directly"),
        }
        assert!(matches!(p[2].action, Action::Duplicate(0)));
        assert!(matches!(&p[3].action, Action::Immediate(t) if t == INVALID_ARGUMENTS));
        assert!(matches!(p[4].action, Action::Run { .. }));
    }

    struct Aliased;

    #[async_trait]
    impl Tool for Aliased {
        fn name(&self) -> &str {
            "session_search"
        }
        fn alias(&self) -> Option<&str> {
            Some("search_sessions")
        }
        fn description(&self) -> &str {
            "t"
        }
        fn parameters(&self) -> serde_json::Value {
            serde_json::json!({"type": "object"})
        }
        async fn call(&self, _args: serde_json::Value, _ctx: &ToolContext) -> ToolResult {
            Ok("ok".into())
        }
    }

    fn bigger_registry() -> Registry {
        let mut r = Registry::new();
        for name in [
            "read_file",
            "write_file",
            "search_files",
            "terminal",
            "todo",
            "web_search",
            "web_extract",
            "memory",
        ] {
            let name: &'static str = Box::leak(name.to_owned().into_boxed_str());
            r.register(Arc::new(T {
                name,
                parallel: true,
            }))
            .unwrap();
        }
        r.register(Arc::new(Aliased)).unwrap();
        r
    }

    #[test]
    fn near_miss_names_are_repaired_to_the_one_tool_they_mean() {
        let r = bigger_registry();
        for written in [
            "ReadFile",
            "read-file",
            "functions.read_file",
            "READ_FILE",
            "read file",
            "read_file_tool",
            "readFile",
        ] {
            let (tool, repaired) =
                resolve(written, &r).unwrap_or_else(|e| panic!("{written}: {e}"));
            assert_eq!(tool.name(), "read_file", "{written}");
            assert!(repaired, "{written}");
        }
        let (tool, repaired) = resolve("read_file", &r).unwrap();
        assert_eq!((tool.name(), repaired), ("read_file", false));
        // The alias itself is exact; a near miss of it is repaired.
        let (tool, repaired) = resolve("search_sessions", &r).unwrap();
        assert_eq!((tool.name(), repaired), ("session_search", false));
        let (tool, repaired) = resolve("SearchSessions", &r).unwrap();
        assert_eq!((tool.name(), repaired), ("session_search", true));
    }

    #[test]
    fn a_repaired_call_runs_and_says_so() {
        let r = bigger_registry();
        let p = plan(
            &[call("1", "ReadFile", "{}"), call("2", "read_file", "{}")],
            &r,
        );
        match &p[0].action {
            Action::Run {
                tool,
                repaired_from,
                ..
            } => {
                assert_eq!(tool.name(), "read_file");
                assert_eq!(repaired_from.as_deref(), Some("ReadFile"));
            }
            _ => panic!("a repaired call runs"),
        }
        // The same call under its right name is a duplicate of the first.
        assert!(matches!(p[1].action, Action::Duplicate(0)));
        assert_eq!(
            repaired_note("ReadFile", "read_file", "ok"),
            "note: there is no tool `ReadFile`; ran `read_file`.\nok"
        );
    }

    #[test]
    fn unrepairable_names_are_refused_with_close_names_or_all() {
        let r = bigger_registry();
        let refusal = resolve("read_fil", &r).err().unwrap();
        assert!(
            refusal.contains("Tool 'read_fil' does not exist"),
            "{refusal}"
        );
        assert!(refusal.contains("Did you mean: read_file"), "{refusal}");
        assert!(!refusal.contains("terminal"), "{refusal}");

        let refusal = resolve("web_serch", &r).err().unwrap();
        assert!(refusal.contains("Did you mean: web_search?"), "{refusal}");

        // Too many edits away, but it starts like one.
        let refusal = resolve("write_file_contents", &r).err().unwrap();
        assert!(refusal.contains("Did you mean: write_file?"), "{refusal}");

        let refusal = resolve("launch_rocket", &r).err().unwrap();
        assert!(
            refusal.contains("Available tools: memory, read_file, search_files, session_search, terminal, todo, web_extract, web_search, write_file"),
            "{refusal}"
        );
        assert!(!refusal.contains("Did you mean"), "{refusal}");
    }

    #[test]
    fn at_most_five_close_names() {
        let mut r = Registry::new();
        for i in 0..9 {
            let name: &'static str = Box::leak(format!("tool_{i}").into_boxed_str());
            r.register(Arc::new(T {
                name,
                parallel: true,
            }))
            .unwrap();
        }
        let refusal = resolve("tool_x", &r).err().unwrap();
        let listed = refusal
            .split("Did you mean: ")
            .nth(1)
            .unwrap()
            .split(", ")
            .count();
        assert_eq!(listed, 5, "{refusal}");
    }

    #[test]
    fn groups_keep_order_and_isolate_unsafe_calls() {
        let r = registry();
        let p = plan(
            &[
                call("1", "read", "{\"a\":1}"),
                call("2", "read", "{\"a\":2}"),
                call("3", "write", "{}"),
                call("4", "write", "{\"x\":1}"),
                call("5", "read", "{\"a\":3}"),
                call("6", "nope", "{}"),
            ],
            &r,
        );
        assert_eq!(groups(&p), vec![vec![0, 1], vec![2], vec![3], vec![4, 5]]);
    }
}
