//! Context compression: when the transcript nears the model's context
//! window, the middle of it is replaced by a model-written summary.
//!
//! The first few messages (usually the task as first stated) and the latest
//! ones (the work in progress) are kept verbatim; what lies between is sent
//! to the model once, without tools, with instructions to write a
//! structured checkpoint. The pure parts (estimating, choosing the cut,
//! building the summary request, reassembling) live here; the turn loop
//! makes the call and persists the result.

use talaria_core::config::CompressionConfig;
use talaria_core::{Message, Redactor, Role};
use talaria_llm::{ChatRequest, ToolSpec};

/// Rough token count of a request: characters / 4, which over-counts code
/// slightly and under-counts CJK text; good enough to decide when to act.
pub fn estimate_tokens(system_prompt: &str, messages: &[Message], tools: &[ToolSpec]) -> u64 {
    let tool_chars: usize = tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + t.parameters.to_string().len())
        .sum();
    let chars =
        system_prompt.len() + tool_chars + messages.iter().map(message_chars).sum::<usize>();
    (chars / 4) as u64
}

/// Approximate serialised size of one message, in characters (bytes, in
/// fact: cheaper and close enough).
pub fn message_chars(m: &Message) -> usize {
    // Role, ids and JSON punctuation cost a few tokens per message.
    const OVERHEAD: usize = 16;
    let calls: usize = m
        .tool_calls
        .iter()
        .map(|c| c.id.len() + c.name.len() + c.arguments.len() + OVERHEAD)
        .sum();
    OVERHEAD + m.content.len() + calls + m.tool_call_id.as_ref().map_or(0, String::len)
}

/// Token count at which compression starts.
pub fn threshold_tokens(config: &CompressionConfig, context_length: u64) -> u64 {
    (config.threshold * context_length as f64) as u64
}

/// Where the transcript is cut: `[..head_end]` is kept, `[head_end..tail_start]`
/// is summarised, `[tail_start..]` is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// First index after the kept head.
    pub head_end: usize,
    /// First index of the kept tail.
    pub tail_start: usize,
}

/// Chooses what to summarise, or `None` when nothing between the protected
/// head and tail can be.
///
/// The head is the first `protect_first_n` non-system messages, the tail the
/// latest `protect_last_n`. Both boundaries move so that an assistant row
/// with tool calls always stays with its results (the head grows past
/// results, the tail grows back to the call row): an API rejects results
/// without their call and calls without their results. The tail also grows
/// back to the last user message, so the request being worked on is never
/// summarised away.
pub fn choose_cut(
    messages: &[Message],
    protect_first_n: usize,
    protect_last_n: usize,
) -> Option<Cut> {
    let n = messages.len();
    let mut head_end = 0;
    let mut kept = 0;
    while head_end < n && kept < protect_first_n {
        if messages[head_end].role != Role::System {
            kept += 1;
        }
        head_end += 1;
    }
    while head_end < n && messages[head_end].role == Role::Tool {
        head_end += 1;
    }
    // At least one message stays in the tail: the reply must answer something.
    let mut tail_start = n.saturating_sub(protect_last_n.max(1)).max(head_end);
    while tail_start > head_end
        && messages
            .get(tail_start)
            .is_some_and(|m| m.role == Role::Tool)
    {
        tail_start -= 1;
    }
    if let Some(last_user) = messages.iter().rposition(|m| m.role == Role::User)
        && last_user >= head_end
        && last_user < tail_start
    {
        tail_start = last_user;
    }
    (tail_start > head_end && tail_start < n).then_some(Cut {
        head_end,
        tail_start,
    })
}

const SUMMARISER_INSTRUCTIONS: &str = "You condense the history of a conversation between a user \
and an AI agent that uses tools. The agent will continue the work from your summary and the most \
recent messages only, so keep every fact it needs to carry on and drop everything else. Be \
concrete: name files, commands, values, errors and outcomes. Write in the language the user \
writes in. Never write down secrets (API keys, tokens, passwords), even if they appear in the \
history. Do not address the user and do not continue the task yourself.\n\nUse exactly these \
sections, writing \"none\" under any that has nothing to report:\n\n## Goal\nWhat the user \
wants, in their own terms, including constraints and preferences they stated.\n\n## Progress\n\
What has been done so far and with what result.\n\n## Key decisions\nChoices made and why.\n\n\
## Relevant files\nPaths that were read, created or changed, each with a word on its role.\n\n\
## Remaining work\nWhat is still open, in order.";

/// Characters kept of one message when it is serialised for the summariser.
const PER_MESSAGE_CHARS: usize = 4000;
/// Characters kept of one tool call's argument text.
const PER_ARGUMENTS_CHARS: usize = 1500;

/// The summarisation request for `middle`: no tools, redacted text, at most
/// `max_input_chars` of transcript.
pub fn summary_request(
    middle: &[Message],
    redactor: &Redactor,
    max_input_chars: usize,
    max_tokens: u32,
) -> ChatRequest {
    let mut transcript = String::new();
    for m in middle {
        let label = match (m.role, m.tool_name.as_deref()) {
            (Role::Tool, Some(name)) => format!("[tool result: {name}]"),
            (role, _) => format!("[{}]", role.as_str()),
        };
        transcript.push_str(&label);
        transcript.push('\n');
        if !m.content.trim().is_empty() {
            transcript.push_str(&clip(m.content.trim(), PER_MESSAGE_CHARS));
            transcript.push('\n');
        }
        for c in &m.tool_calls {
            transcript.push_str(&format!(
                "(called {} with {})\n",
                c.name,
                clip(&c.arguments, PER_ARGUMENTS_CHARS)
            ));
        }
        transcript.push('\n');
    }
    let transcript = clip(&redactor.redact(&transcript), max_input_chars);
    ChatRequest {
        messages: vec![
            Message::system(SUMMARISER_INSTRUCTIONS),
            Message::user(format!(
                "Summarise this part of the conversation:\n\n{transcript}\nWrite the summary now, \
                 using the sections above."
            )),
        ],
        tools: Vec::new(),
        max_tokens: Some(max_tokens),
        temperature: None,
    }
}

/// Opening line of a summary message; also how a summary is recognised.
pub const SUMMARY_HEADER: &str = "[CONTEXT SUMMARY] Earlier turns of this conversation were \
condensed to save space. What follows is background from those turns, not a new request.";

const SUMMARY_FOOTER: &str =
    "[END OF CONTEXT SUMMARY — continue from the messages below, not from the summary]";

/// The row that stands in for the summarised messages. It is a user row
/// because every API accepts one anywhere a summary can land.
pub fn summary_message(body: &str) -> Message {
    Message::user(format!(
        "{SUMMARY_HEADER}\n\n{}\n\n{SUMMARY_FOOTER}",
        body.trim()
    ))
}

/// The summary row with the session's open todo items appended, so the
/// model keeps its plan when the turns that wrote the list are summarised
/// away. The list rides in the summary row rather than a row of its own so
/// the roles around it stay as the APIs require.
pub fn summary_message_with_todos(body: &str, todos: &[crate::tools::todo::TodoItem]) -> Message {
    let mut message = summary_message(body);
    if let Some(list) = crate::tools::todo::preserved_list(todos) {
        message.content.push_str("\n\n");
        message.content.push_str(&list);
    }
    message
}

/// Head, summary, tail.
pub fn assemble(messages: &[Message], cut: Cut, summary: Message) -> Vec<Message> {
    let mut out = Vec::with_capacity(cut.head_end + 1 + messages.len() - cut.tail_start);
    out.extend_from_slice(&messages[..cut.head_end]);
    out.push(summary);
    out.extend_from_slice(&messages[cut.tail_start..]);
    out
}

/// At most `max` characters of `text`: the first quarter and the last three
/// quarters (recent material matters more) around a marker.
fn clip(text: &str, max: usize) -> String {
    let total = text.chars().count();
    if total <= max {
        return text.to_owned();
    }
    let head_n = max / 4;
    let tail_n = max - head_n;
    let head: String = text.chars().take(head_n).collect();
    let tail: String = text.chars().skip(total - tail_n).collect();
    format!(
        "{head}\n[… {} characters omitted …]\n{tail}",
        total - head_n - tail_n
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use talaria_core::ToolCall;

    use crate::repair::is_well_formed;

    fn calls(ids: &[&str]) -> Message {
        Message::assistant_tool_calls(
            "",
            ids.iter()
                .map(|id| ToolCall {
                    id: (*id).into(),
                    name: "t".into(),
                    arguments: "{}".into(),
                })
                .collect(),
        )
    }

    fn result(id: &str) -> Message {
        Message::tool_result(id, "t", format!("result {id}"))
    }

    /// user, then `rounds` rounds of (call row + `width` results), then an answer.
    fn long_turn(rounds: usize, width: usize) -> Vec<Message> {
        let mut v = vec![Message::user("do it")];
        for r in 0..rounds {
            let ids: Vec<String> = (0..width).map(|k| format!("c{r}_{k}")).collect();
            let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
            v.push(calls(&refs));
            v.extend(ids.iter().map(|id| result(id)));
        }
        v.push(Message::assistant("done"));
        v
    }

    fn check(messages: &[Message], cut: Cut) {
        assert!(
            cut.head_end < cut.tail_start && cut.tail_start < messages.len(),
            "{cut:?}"
        );
        for part in [&messages[..cut.head_end], &messages[cut.tail_start..]] {
            assert!(is_well_formed(part), "split pair at {cut:?}");
        }
        let rebuilt = assemble(messages, cut, summary_message("s"));
        assert!(is_well_formed(&rebuilt), "{cut:?}");
    }

    #[test]
    fn plain_conversation_cuts_at_the_protected_counts() {
        let mut v = Vec::new();
        for i in 0..10 {
            v.push(Message::user(format!("q{i}")));
            v.push(Message::assistant(format!("a{i}")));
        }
        let cut = choose_cut(&v, 3, 4).unwrap();
        // Tail would start at index 16 (a user row): already the last user? no,
        // the last user is 18, which is inside the tail.
        assert_eq!(
            cut,
            Cut {
                head_end: 3,
                tail_start: 16
            }
        );
        check(&v, cut);
    }

    #[test]
    fn system_rows_do_not_count_toward_the_head() {
        let mut v = vec![Message::system("sys")];
        for i in 0..6 {
            v.push(Message::user(format!("q{i}")));
            v.push(Message::assistant(format!("a{i}")));
        }
        let cut = choose_cut(&v, 2, 2).unwrap();
        assert_eq!(cut.head_end, 3);
    }

    #[test]
    fn head_grows_past_results() {
        let v = long_turn(6, 3);
        // protect_first_n = 2 ends the head right after the first call row.
        let cut = choose_cut(&v, 2, 3).unwrap();
        assert_eq!(cut.head_end, 5, "the head takes all three results");
        check(&v, cut);
    }

    #[test]
    fn tail_grows_back_to_the_call_row() {
        let v = long_turn(6, 3);
        for last_n in 1..v.len() {
            if let Some(cut) = choose_cut(&v, 1, last_n) {
                assert_ne!(v[cut.tail_start].role, Role::Tool, "last_n={last_n}");
                check(&v, cut);
            }
        }
    }

    #[test]
    fn every_cut_of_mixed_transcripts_keeps_pairs() {
        let mut v = Vec::new();
        for i in 0..5 {
            v.push(Message::user(format!("q{i}")));
            v.extend(long_turn(i % 3 + 1, i % 2 + 1).into_iter().skip(1));
        }
        let mut cuts = 0;
        for first in 0..6 {
            for last in 0..v.len() + 2 {
                if let Some(cut) = choose_cut(&v, first, last) {
                    check(&v, cut);
                    cuts += 1;
                }
            }
        }
        // Most of these ask for a small head and tail of a long transcript:
        // a cut exists. A `choose_cut` that gave up on them all would pass
        // the checks above vacuously.
        let asked = 6 * (v.len() + 2);
        assert!(cuts * 2 > asked, "{cuts} cuts of {asked}");
    }

    #[test]
    fn the_last_user_message_stays_in_the_tail() {
        let mut v = vec![
            Message::user("old"),
            Message::assistant("old answer"),
            Message::user("older follow-up"),
            Message::assistant("ok"),
            Message::user("current request"),
        ];
        v.extend(long_turn(4, 1).into_iter().skip(1));
        let cut = choose_cut(&v, 1, 2).unwrap();
        assert_eq!(v[cut.tail_start], Message::user("current request"));
        check(&v, cut);
    }

    #[test]
    fn nothing_to_cut_gives_none() {
        let v = vec![
            Message::user("a"),
            Message::assistant("b"),
            Message::user("c"),
        ];
        assert_eq!(choose_cut(&v, 3, 8), None);
        assert_eq!(choose_cut(&[], 0, 0), None);
        // One turn whose user row is protected in the head: the tool rounds
        // after it can still be summarised.
        let v = long_turn(8, 2);
        let cut = choose_cut(&v, 1, 4).unwrap();
        assert_eq!(cut.head_end, 1);
        check(&v, cut);
    }

    #[test]
    fn summary_request_has_no_tools_and_no_secrets() {
        let v = vec![
            Message::user("my key is sk-abcdefghijklmnopqrstuvwxyz"),
            calls(&["x"]),
            result("x"),
        ];
        let req = summary_request(&v, &Redactor::default(), 10_000, 512);
        assert!(req.tools.is_empty());
        let body = &req.messages[1].content;
        assert!(!body.contains("abcdefghijklmnop"), "{body}");
        assert!(
            body.contains("[tool result: t]") && body.contains("(called t with {})"),
            "{body}"
        );
        assert!(req.messages[0].content.contains("## Remaining work"));
        let clipped = summary_request(
            &[Message::user("y".repeat(50_000))],
            &Redactor::default(),
            1000,
            512,
        );
        assert!(clipped.messages[1].content.chars().count() < 1300);
    }

    #[test]
    fn estimate_grows_with_content() {
        let small = estimate_tokens("sys", &[Message::user("hi")], &[]);
        let big = estimate_tokens("sys", &[Message::user("x".repeat(4000))], &[]);
        assert!(big >= small + 990, "{small} {big}");
    }
}
