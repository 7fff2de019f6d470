//! How the mock LLM servers put a [`Reply`] on the wire: OpenAI and
//! Anthropic JSON bodies, and their SSE streams cut into frames.

use super::*;
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// One SSE frame and whether it carries model output (text, reasoning or
/// tool-call deltas); `stall_after` counts only those.
pub(super) struct Frame {
    text: String,
    content: bool,
}

pub(super) fn content(text: String) -> Frame {
    Frame {
        text,
        content: true,
    }
}

pub(super) fn control(text: String) -> Frame {
    Frame {
        text,
        content: false,
    }
}

pub(super) fn data_frame(event: Option<&str>, data: &str) -> String {
    let mut s = String::new();
    if let Some(e) = event {
        s.push_str("event: ");
        s.push_str(e);
        s.push('\n');
    }
    // Multi-line payloads become several `data:` lines, as the SSE spec says.
    for line in data.split('\n') {
        s.push_str("data: ");
        s.push_str(line);
        s.push('\n');
    }
    s.push('\n');
    s
}

/// Streams the frames one write at a time, so the client really sees several
/// chunks. With `stall_after(n)`, hangs right after the n-th content frame
/// (or after the last one, when there are fewer) until the client goes away
/// or the mock shuts down. `pending` goes with the stream: dropped
/// unanswered when the client goes away first.
pub(super) fn sse_response(
    frames: Vec<Frame>,
    reply: &Reply,
    mut shutdown: watch::Receiver<bool>,
    pending: Pending,
) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(4);
    let stall = reply.stall_after;
    let chunk_pause = reply.chunk_pause;
    let total_content = frames.iter().filter(|f| f.content).count();
    tokio::spawn(async move {
        let mut sent_content = 0;
        let stall_point = stall.map(|n| n.min(total_content));
        for f in frames {
            if stall_point == Some(sent_content) && (f.content || sent_content == total_content) {
                break;
            }
            if f.content {
                sent_content += 1;
            }
            if tx.send(Ok(Bytes::from(f.text))).await.is_err() {
                return;
            }
            // A short pause keeps frames in separate TCP writes.
            let pause = match chunk_pause {
                Some(p) if f.content => p,
                _ => Duration::from_millis(2),
            };
            tokio::time::sleep(pause).await;
        }
        if stall.is_some() {
            tokio::select! {
                // A shutdown may close the connection too: it is the
                // server's doing then, not a hang-up.
                biased;
                _ = shutdown.wait_for(|s| *s) => {}
                _ = tx.closed() => return,
            }
        }
        pending.answered();
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// Splits text into up to four pieces on character boundaries.
fn pieces(s: &str) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    if chars.is_empty() {
        return Vec::new();
    }
    let n = chars.len().min(4);
    let size = chars.len().div_ceil(n);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

fn finish_openai(reply: &Reply) -> &'static str {
    if reply.tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    }
}

fn openai_usage(reply: &Reply) -> Value {
    let (p, c) = reply.usage;
    json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c})
}

fn openai_chunk(model: &str, delta: Value, finish: Option<&str>) -> String {
    json!({
        "id": "chatcmpl-mock",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    })
    .to_string()
}

pub(super) fn openai_stream(reply: &Reply, model: &str, include_usage: bool) -> Vec<Frame> {
    let mut out = Vec::new();
    let mut first = true;
    let mut with_role = |mut delta: Value| {
        if first {
            delta["role"] = json!("assistant");
            first = false;
        }
        delta
    };
    if let Some(r) = &reply.reasoning {
        for p in pieces(r) {
            out.push(openai_chunk(
                model,
                with_role(json!({"reasoning_content": p})),
                None,
            ));
        }
    }
    for p in pieces(&reply.text) {
        out.push(openai_chunk(model, with_role(json!({"content": p})), None));
    }
    for (i, call) in reply.tool_calls.iter().enumerate() {
        let open = json!({"tool_calls": [{
            "index": i, "id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }]});
        out.push(openai_chunk(model, with_role(open), None));
        for p in pieces(&call.arguments) {
            let more = json!({"tool_calls": [{"index": i, "function": {"arguments": p}}]});
            out.push(openai_chunk(model, more, None));
        }
    }
    let mut frames: Vec<Frame> = out.iter().map(|d| content(data_frame(None, d))).collect();
    frames.push(control(data_frame(
        None,
        &openai_chunk(model, json!({}), Some(finish_openai(reply))),
    )));
    if include_usage {
        let usage = json!({
            "id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0,
            "model": model, "choices": [], "usage": openai_usage(reply),
        });
        frames.push(control(data_frame(None, &usage.to_string())));
    }
    frames.push(control(data_frame(None, "[DONE]")));
    frames
}

pub(super) fn openai_json(reply: &Reply, model: &str) -> Value {
    let mut message = json!({
        "role": "assistant",
        "content": if reply.text.is_empty() && !reply.tool_calls.is_empty() { Value::Null } else { json!(reply.text) },
    });
    if let Some(r) = &reply.reasoning {
        message["reasoning_content"] = json!(r);
    }
    if !reply.tool_calls.is_empty() {
        message["tool_calls"] = reply
            .tool_calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
    }
    json!({
        "id": "chatcmpl-mock",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_openai(reply)}],
        "usage": openai_usage(reply),
    })
}

fn stop_anthropic(reply: &Reply) -> &'static str {
    if reply.tool_calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    }
}

fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}

pub(super) fn anthropic_stream(reply: &Reply, model: &str) -> Vec<Frame> {
    let (input, output) = reply.usage;
    let mut frames = Vec::new();
    let mut ev = |name: &str, v: Value| {
        let text = data_frame(Some(name), &v.to_string());
        frames.push(if name == "content_block_delta" {
            content(text)
        } else {
            control(text)
        });
    };
    ev(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": "msg_mock", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input, "output_tokens": 1},
        }}),
    );
    ev("ping", json!({"type": "ping"}));
    let mut index = 0;
    if let Some(r) = &reply.reasoning {
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": {"type": "thinking", "thinking": ""}}),
        );
        for p in pieces(r) {
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": p}}),
            );
        }
        ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        );
        index += 1;
    }
    if !reply.text.is_empty() {
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
        );
        for p in pieces(&reply.text) {
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": p}}),
            );
        }
        ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        );
        index += 1;
    }
    for call in &reply.tool_calls {
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": {
                "type": "tool_use", "id": call.id, "name": call.name, "input": {},
            }}),
        );
        for p in pieces(&call.arguments) {
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": p}}),
            );
        }
        ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        );
        index += 1;
    }
    ev(
        "message_delta",
        json!({"type": "message_delta",
               "delta": {"stop_reason": stop_anthropic(reply), "stop_sequence": null},
               "usage": {"output_tokens": output}}),
    );
    ev("message_stop", json!({"type": "message_stop"}));
    frames
}

pub(super) fn anthropic_json(reply: &Reply, model: &str) -> Value {
    let mut content = Vec::new();
    if let Some(r) = &reply.reasoning {
        content.push(json!({"type": "thinking", "thinking": r, "signature": "mock-signature"}));
    }
    if !reply.text.is_empty() {
        content.push(json!({"type": "text", "text": reply.text}));
    }
    for c in &reply.tool_calls {
        content.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": tool_input(&c.arguments)}));
    }
    let (input, output) = reply.usage;
    json!({
        "id": "msg_mock",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_anthropic(reply),
        "stop_sequence": null,
        "usage": {"input_tokens": input, "output_tokens": output},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_split_on_char_boundaries() {
        assert_eq!(pieces(""), Vec::<String>::new());
        assert_eq!(pieces("ab"), vec!["a", "b"]);
        let p = pieces("héllo wörld");
        assert!(p.len() > 1);
        assert_eq!(p.concat(), "héllo wörld");
    }

    #[test]
    fn multi_line_data_becomes_several_lines() {
        assert_eq!(
            data_frame(Some("x"), "a\nb"),
            "event: x\ndata: a\ndata: b\n\n"
        );
    }

    #[test]
    fn openai_stream_ends_with_done_and_usage() {
        let r = Reply::text("hello there").with_usage(3, 4);
        let f = openai_stream(&r, "m", true);
        assert_eq!(f.last().map(|f| f.text.as_str()), Some("data: [DONE]\n\n"));
        assert!(f[f.len() - 2].text.contains("\"prompt_tokens\":3"));
        assert!(f.iter().filter(|f| f.content).count() > 1);
    }
}
