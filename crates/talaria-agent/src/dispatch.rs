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

/// What to do with one call of a batch.
pub enum Action {
    /// Execute the tool with these parsed arguments.
    Run {
        /// The registered tool.
        tool: Arc<dyn Tool>,
        /// The parsed argument object.
        args: serde_json::Value,
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
            let action = match (registry.get(&call.name), parse_arguments(&call.arguments)) {
                (None, _) => Action::Immediate(unknown_tool(&call.name, registry)),
                (Some(_), None) => Action::Immediate(INVALID_ARGUMENTS.to_owned()),
                (Some(tool), Some(args)) => {
                    // Compare parsed values so that whitespace or key order
                    // differences still count as the same call.
                    let key = (call.name.clone(), args.to_string());
                    match seen.get(&key) {
                        Some(&first) => Action::Duplicate(first),
                        None => {
                            seen.insert(key, i);
                            Action::Run {
                                tool: tool.clone(),
                                args,
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

/// The error result for a name the registry does not know.
pub fn unknown_tool(name: &str, registry: &Registry) -> String {
    let available = registry.names().join(", ");
    let message = if name.trim().is_empty() {
        format!("The tool call had no tool name. Available tools: {available}")
    } else {
        format!("Tool '{name}' does not exist. Available tools: {available}")
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
