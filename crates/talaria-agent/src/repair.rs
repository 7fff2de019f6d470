//! Making a stored transcript acceptable to a chat API before it is sent.
//!
//! A transcript can be damaged in ways the model servers reject outright: a
//! crash between persisting an assistant tool-call row and its results, a
//! compression pass that cut badly in an older version, a row written by
//! hand. Rather than fail the turn, the request copy is repaired; the stored
//! rows are left as they are (they are the record of what happened).
//!
//! Everything here is a pure function of the message list.

use std::collections::HashSet;

use talaria_core::{Message, Role};

/// Content of the stand-in result for a tool call whose result was never
/// recorded. Worded for the model: it must not retry blindly on the belief
/// that the call succeeded.
pub const LOST_RESULT: &str =
    "[no result recorded — the tool output was lost; the call may or may not have taken effect]";

/// What [`repair_history`] changed, for logging.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RepairReport {
    /// Tool results dropped because no assistant call right before them
    /// asked for them (or they answered a call twice).
    pub dropped_orphans: usize,
    /// Stand-in results added for calls that had none.
    pub stubbed: usize,
    /// User or assistant rows dropped because they carried nothing.
    pub dropped_empty: usize,
    /// Tool-call argument texts that were not JSON and were sent as `{}`.
    pub fixed_arguments: usize,
}

impl RepairReport {
    /// Whether anything was changed.
    pub fn changed(&self) -> bool {
        *self != RepairReport::default()
    }
}

/// Returns a copy of `messages` that chat APIs accept:
///
/// - a tool result must sit in the run of tool rows directly after the
///   assistant row that made the call, and answer one of its calls once;
///   any other tool row is dropped;
/// - every call of an assistant row gets a result: missing ones get a
///   [`LOST_RESULT`] stand-in at the end of that run;
/// - user and assistant rows with blank content and no tool calls are
///   dropped (several servers reject empty content);
/// - tool-call argument text that is not JSON at all is replaced by `{}`,
///   because some servers parse it and refuse the whole request otherwise.
///
/// Consecutive user rows are left alone: the providers that need strict
/// alternation merge them at their edge.
pub fn repair_history(messages: &[Message]) -> (Vec<Message>, RepairReport) {
    let mut report = RepairReport::default();
    let mut out = Vec::with_capacity(messages.len());
    let mut i = 0;
    while i < messages.len() {
        let msg = &messages[i];
        i += 1;
        match msg.role {
            Role::Tool => {
                // Reaching a tool row here means it did not follow its call.
                report.dropped_orphans += 1;
            }
            Role::Assistant if msg.has_tool_calls() => {
                let mut call_row = msg.clone();
                for call in &mut call_row.tool_calls {
                    if !is_json(&call.arguments) {
                        call.arguments = "{}".to_owned();
                        report.fixed_arguments += 1;
                    }
                }
                let ids: HashSet<&str> = msg.tool_calls.iter().map(|c| c.id.as_str()).collect();
                out.push(call_row);
                let mut answered: HashSet<&str> = HashSet::new();
                while let Some(next) = messages.get(i).filter(|m| m.role == Role::Tool) {
                    i += 1;
                    match next.tool_call_id.as_deref() {
                        Some(id) if ids.contains(id) && answered.insert(id) => {
                            out.push(next.clone());
                        }
                        _ => report.dropped_orphans += 1,
                    }
                }
                for call in &msg.tool_calls {
                    if !answered.contains(call.id.as_str()) {
                        out.push(Message::tool_result(&call.id, &call.name, LOST_RESULT));
                        report.stubbed += 1;
                        // A call id listed twice in one row gets one stand-in.
                        answered.insert(call.id.as_str());
                    }
                }
            }
            Role::User | Role::Assistant if msg.content.trim().is_empty() => {
                report.dropped_empty += 1;
            }
            _ => out.push(msg.clone()),
        }
    }
    (out, report)
}

/// Whether `text` parses as JSON. Blank text counts as not JSON.
fn is_json(text: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(text).is_ok()
}

/// Whether every tool call in `messages` is answered by a tool row in the
/// run right after it and every tool row answers such a call: the invariant
/// [`repair_history`] establishes. Used by tests and debug assertions.
pub fn is_well_formed(messages: &[Message]) -> bool {
    let (repaired, report) = repair_history(messages);
    repaired.len() == messages.len() && report.dropped_orphans == 0 && report.stubbed == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use talaria_core::ToolCall;

    fn call(id: &str, name: &str, args: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: args.into(),
        }
    }

    #[test]
    fn a_valid_transcript_is_unchanged() {
        let msgs = vec![
            Message::user("hi"),
            Message::assistant_tool_calls(
                "",
                vec![call("a", "t", "{}"), call("b", "t", "{\"x\":1}")],
            ),
            Message::tool_result("a", "t", "ra"),
            Message::tool_result("b", "t", "rb"),
            Message::assistant("done"),
            Message::user("again"),
            Message::user("and again"),
        ];
        let (out, report) = repair_history(&msgs);
        assert_eq!(out, msgs);
        assert!(!report.changed());
        assert!(is_well_formed(&msgs));
    }

    #[test]
    fn orphan_results_are_dropped() {
        let msgs = vec![
            Message::user("hi"),
            Message::tool_result("ghost", "t", "boo"),
            Message::assistant("ok"),
        ];
        let (out, report) = repair_history(&msgs);
        assert_eq!(out, vec![Message::user("hi"), Message::assistant("ok")]);
        assert_eq!(report.dropped_orphans, 1);
    }

    #[test]
    fn results_after_an_intervening_row_are_orphans() {
        let msgs = vec![
            Message::assistant_tool_calls("", vec![call("a", "t", "{}")]),
            Message::user("interjection"),
            Message::tool_result("a", "t", "late"),
        ];
        let (out, report) = repair_history(&msgs);
        assert_eq!(out.len(), 3);
        assert_eq!(out[1].tool_call_id.as_deref(), Some("a"));
        assert_eq!(out[1].content, LOST_RESULT);
        assert_eq!(out[2], Message::user("interjection"));
        assert_eq!(report.dropped_orphans, 1);
        assert_eq!(report.stubbed, 1);
    }

    #[test]
    fn missing_results_get_a_stand_in() {
        let msgs = vec![
            Message::user("go"),
            Message::assistant_tool_calls("", vec![call("a", "t1", "{}"), call("b", "t2", "{}")]),
            Message::tool_result("b", "t2", "rb"),
            Message::user("next"),
        ];
        let (out, report) = repair_history(&msgs);
        assert_eq!(report.stubbed, 1);
        assert_eq!(out.len(), 5);
        assert_eq!(out[2].tool_call_id.as_deref(), Some("b"));
        assert_eq!(out[3].tool_call_id.as_deref(), Some("a"));
        assert_eq!(out[3].tool_name.as_deref(), Some("t1"));
        assert_eq!(out[3].content, LOST_RESULT);
        assert!(is_well_formed(&out));
    }

    #[test]
    fn duplicate_results_keep_the_first() {
        let msgs = vec![
            Message::assistant_tool_calls("", vec![call("a", "t", "{}")]),
            Message::tool_result("a", "t", "first"),
            Message::tool_result("a", "t", "second"),
        ];
        let (out, report) = repair_history(&msgs);
        assert_eq!(out.len(), 2);
        assert_eq!(out[1].content, "first");
        assert_eq!(report.dropped_orphans, 1);
    }

    #[test]
    fn empty_rows_are_dropped_but_tool_call_rows_are_kept() {
        let msgs = vec![
            Message::user("  "),
            Message::assistant(""),
            Message::assistant_tool_calls("", vec![call("a", "t", "{}")]),
            Message::tool_result("a", "t", ""),
        ];
        let (out, report) = repair_history(&msgs);
        assert_eq!(report.dropped_empty, 2);
        assert_eq!(out.len(), 2);
        assert!(out[0].has_tool_calls());
    }

    #[test]
    fn unparseable_arguments_are_sent_as_an_empty_object() {
        let msgs = vec![
            Message::assistant_tool_calls(
                "",
                vec![call("a", "t", "{\"x\": "), call("b", "t", "[1]")],
            ),
            Message::tool_result("a", "t", "err"),
            Message::tool_result("b", "t", "err"),
        ];
        let (out, report) = repair_history(&msgs);
        assert_eq!(report.fixed_arguments, 1);
        assert_eq!(out[0].tool_calls[0].arguments, "{}");
        // Valid JSON that is not an object is the tool's problem, not the API's.
        assert_eq!(out[0].tool_calls[1].arguments, "[1]");
    }

    #[test]
    fn repair_is_idempotent() {
        let msgs = vec![
            Message::tool_result("x", "t", "orphan"),
            Message::user("go"),
            Message::assistant_tool_calls("", vec![call("a", "t", "nope"), call("a", "t", "{}")]),
            Message::assistant(""),
            Message::user("q"),
        ];
        let (once, _) = repair_history(&msgs);
        let (twice, report) = repair_history(&once);
        assert_eq!(once, twice);
        assert!(!report.changed());
    }
}
