//! Sessions: the list (newest first, or found by a search of the
//! transcripts) and one session's transcript, with each tool call folded
//! together with its result.

use std::collections::HashMap;
use std::sync::Arc;

use askama::Template;
use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use serde_json::{Value, json};

use super::Shown;
use crate::Ui;
use crate::auth::Login;
use crate::form::{self, Fields};
use crate::view::{self, Frame, count, encode, text, when_value};

/// Sessions per page of the list.
const PAGE: usize = 50;
/// Messages per page of a transcript.
const MESSAGES: usize = 200;

/// A session in a list.
pub(crate) struct SessionRow {
    pub(crate) id: String,
    pub(crate) title: String,
    pub(crate) source: String,
    pub(crate) started: String,
    pub(crate) messages: u64,
    pub(crate) model: String,
    pub(crate) cost: String,
    pub(crate) snippet: String,
}

/// The rows of a `/api/sessions` answer.
pub(crate) fn session_rows(answer: &Value) -> Vec<SessionRow> {
    answer["data"]
        .as_array()
        .map(|rows| rows.iter().map(session_row).collect())
        .unwrap_or_default()
}

fn session_row(s: &Value) -> SessionRow {
    SessionRow {
        id: text(s, "id"),
        title: text(s, "title"),
        source: text(s, "source"),
        started: when_value(&s["started_at"]),
        messages: count(s, "message_count"),
        model: text(s, "model"),
        cost: s["cost_usd"]
            .as_f64()
            .filter(|c| *c > 0.0)
            .map(|c| format!("${c:.4}"))
            .unwrap_or_default(),
        snippet: s
            .pointer("/match/snippet")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
    }
}

#[derive(Template)]
#[template(path = "sessions.html")]
struct List {
    frame: Frame,
    q: String,
    rows: Shown<Vec<SessionRow>>,
    previous: Option<String>,
    next: Option<String>,
}

view::framed!(List);

/// `GET /ui/sessions?q=&offset=`.
pub(crate) async fn list(
    State(ui): State<Arc<Ui>>,
    Extension(login): Extension<Login>,
    Query(query): Query<form::Query>,
    headers: HeaderMap,
) -> Response {
    let q = query
        .get("q")
        .map(|q| q.trim().to_owned())
        .unwrap_or_default();
    let offset: usize = query
        .get("offset")
        .and_then(|o| o.trim().parse().ok())
        .unwrap_or(0);
    let mut path = format!("/api/sessions?limit={PAGE}&offset={offset}");
    if !q.is_empty() {
        path.push_str(&format!("&q={}", encode(&q)));
    }
    let answer = ui.api.get(&path).await;
    let has_more = answer
        .as_ref()
        .is_ok_and(|v| v["has_more"].as_bool().unwrap_or(false));
    let link = |offset: usize| {
        let mut link = format!("/ui/sessions?offset={offset}");
        if !q.is_empty() {
            link.push_str(&format!("&q={}", encode(&q)));
        }
        link
    };
    let page = List {
        frame: Frame::new("sessions", "Sessions", &login, &headers),
        previous: (offset > 0).then(|| link(offset.saturating_sub(PAGE))),
        next: has_more.then(|| link(offset + PAGE)),
        rows: answer.map(|v| session_rows(&v)).map_err(|e| e.to_string()),
        q,
    };
    view::render(&page)
}

/// A tool call with its result, folded under the message that made it.
pub(crate) struct ToolCall {
    pub(crate) name: String,
    pub(crate) arguments: String,
    pub(crate) result: Option<String>,
}

/// One entry of a transcript.
pub(crate) struct Entry {
    pub(crate) role: String,
    pub(crate) content: String,
    pub(crate) reasoning: String,
    pub(crate) time: String,
    pub(crate) calls: Vec<ToolCall>,
}

/// A message's text: a string, or the text parts of a list.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match p.get("text").and_then(Value::as_str) {
                Some(t) => t.to_owned(),
                None => format!(
                    "[{}]",
                    p.get("type").and_then(Value::as_str).unwrap_or("part")
                ),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        other => other.to_string(),
    }
}

/// Arguments as sent (a JSON string), pretty-printed when they parse.
fn pretty_arguments(arguments: &Value) -> String {
    let raw = match arguments {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    serde_json::from_str::<Value>(&raw)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or(raw)
}

/// The messages as entries: every `tool` row goes under the call it
/// answers; one whose call is not on this page stands alone.
pub(crate) fn entries(messages: &[Value]) -> Vec<Entry> {
    let mut out: Vec<Entry> = Vec::with_capacity(messages.len());
    // Which entry and call each open call id is.
    let mut open: HashMap<String, (usize, usize)> = HashMap::new();
    for m in messages {
        let role = text(m, "role");
        if role == "tool" {
            let id = text(m, "tool_call_id");
            let result = content_text(&m["content"]);
            if let Some((entry, call)) = open.remove(&id)
                && let Some(call) = out.get_mut(entry).and_then(|e| e.calls.get_mut(call))
            {
                call.result = Some(result);
                continue;
            }
            out.push(Entry {
                role,
                content: String::new(),
                reasoning: String::new(),
                time: when_value(&m["timestamp"]),
                calls: vec![ToolCall {
                    name: text(m, "tool_name"),
                    arguments: String::new(),
                    result: Some(result),
                }],
            });
            continue;
        }
        let calls: Vec<ToolCall> = m["tool_calls"]
            .as_array()
            .map(|calls| {
                calls
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        open.insert(text(c, "id"), (out.len(), i));
                        ToolCall {
                            name: c
                                .pointer("/function/name")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_owned(),
                            arguments: pretty_arguments(
                                c.pointer("/function/arguments").unwrap_or(&Value::Null),
                            ),
                            result: None,
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(Entry {
            role,
            content: content_text(&m["content"]),
            reasoning: text(m, "reasoning"),
            time: when_value(&m["timestamp"]),
            calls,
        });
    }
    out
}

#[derive(Template)]
#[template(path = "transcript.html")]
struct Transcript {
    frame: Frame,
    id: String,
    session: Shown<SessionRow>,
    entries: Shown<Vec<Entry>>,
    next: Option<String>,
}

view::framed!(Transcript);

/// `GET /ui/sessions/{id}?after=`.
pub(crate) async fn transcript(
    State(ui): State<Arc<Ui>>,
    Extension(login): Extension<Login>,
    Path(id): Path<String>,
    Query(query): Query<form::Query>,
    headers: HeaderMap,
) -> Response {
    let after: i64 = query
        .get("after")
        .and_then(|a| a.trim().parse().ok())
        .unwrap_or(0);
    let session_path = format!("/api/sessions/{}", encode(&id));
    let messages_path = format!(
        "/api/sessions/{}/messages?limit={MESSAGES}&after={after}",
        encode(&id)
    );
    let (session, messages) = tokio::join!(ui.api.get(&session_path), ui.api.get(&messages_path));
    let next = messages.as_ref().ok().and_then(|v| {
        v["next_after"]
            .as_i64()
            .map(|n| format!("/ui/sessions/{}?after={n}", encode(&id)))
    });
    let session = session
        .map(|v| session_row(&v["session"]))
        .map_err(|e| e.to_string());
    let title = match &session {
        Ok(s) if !s.title.is_empty() => s.title.clone(),
        _ => format!("Session {id}"),
    };
    let page = Transcript {
        frame: Frame::new("sessions", title, &login, &headers),
        entries: messages
            .map(|v| entries(v["data"].as_array().map_or(&[][..], Vec::as_slice)))
            .map_err(|e| e.to_string()),
        session,
        next,
        id,
    };
    view::render(&page)
}

/// `POST /ui/sessions/{id}/rename` with `title`.
pub(crate) async fn rename(
    State(ui): State<Arc<Ui>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let fields = Fields::parse(&body);
    let title = fields.get("title").unwrap_or("").trim().to_owned();
    let outcome = ui
        .api
        .send(
            Method::PATCH,
            &format!("/api/sessions/{}", encode(&id)),
            json!({ "title": title }),
        )
        .await
        .map(|_| format!("Renamed to \u{201c}{title}\u{201d}."))
        .map_err(|e| format!("Cannot rename: {e}"));
    view::after_change(&format!("/ui/sessions/{}", encode(&id)), outcome)
}

/// `POST /ui/sessions/{id}/delete`.
pub(crate) async fn delete(State(ui): State<Arc<Ui>>, Path(id): Path<String>) -> Response {
    match ui
        .api
        .send(
            Method::DELETE,
            &format!("/api/sessions/{}", encode(&id)),
            json!({}),
        )
        .await
    {
        Ok(_) => view::after_change("/ui/sessions", Ok(format!("Deleted session {id}."))),
        Err(e) => view::after_change(
            &format!("/ui/sessions/{}", encode(&id)),
            Err(format!("Cannot delete: {e}")),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_results_fold_under_their_calls() {
        let messages = vec![
            json!({"role": "user", "content": "list files"}),
            json!({"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "function": {"name": "terminal", "arguments": "{\"command\":\"ls\"}"}},
                {"id": "c2", "function": {"name": "read_file", "arguments": "not json"}}
            ]}),
            json!({"role": "tool", "tool_call_id": "c2", "content": "file body"}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "a b"}),
            json!({"role": "tool", "tool_call_id": "elsewhere", "tool_name": "x", "content": "orphan"}),
            json!({"role": "assistant", "content": [{"type": "text", "text": "done"}, {"type": "image_url"}]}),
        ];
        let e = entries(&messages);
        assert_eq!(e.len(), 4);
        assert_eq!(e[1].calls.len(), 2);
        assert_eq!(e[1].calls[0].result.as_deref(), Some("a b"));
        assert!(e[1].calls[0].arguments.contains("\"command\": \"ls\""));
        assert_eq!(e[1].calls[1].arguments, "not json");
        assert_eq!(e[1].calls[1].result.as_deref(), Some("file body"));
        assert_eq!(e[2].role, "tool");
        assert_eq!(e[3].content, "done\n[image_url]");
    }
}
