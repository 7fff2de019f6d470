//! The fake's request handlers: about, accounts, receiving (polled or
//! over a WebSocket), sending and typing.

use super::*;
use crate::json_response;
use axum::body::Bytes;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

fn error(status: u16, text: &str) -> Response {
    json_response(status, &json!({ "error": text }))
}

fn record(shared: &Shared, method: &str, path: &str, body: &Value) {
    shared.core.record(Request {
        method: method.to_owned(),
        path: path.to_owned(),
        body: body.clone(),
        at: Instant::now(),
    });
}

pub(super) async fn about(State(shared): State<Arc<Shared>>) -> Response {
    record(&shared, "GET", "/v1/about", &Value::Null);
    let mode = match shared.mode {
        Mode::JsonRpc => "json-rpc",
        Mode::Normal => "normal",
    };
    json_response(
        200,
        &json!({"versions": ["v1", "v2"], "build": 2, "mode": mode, "version": "0.fake",
                "capabilities": {"v2/send": ["quotes", "mentions"]}}),
    )
}

pub(super) async fn accounts(State(shared): State<Arc<Shared>>) -> Response {
    record(&shared, "GET", "/v1/accounts", &Value::Null);
    let accounts = shared.core.read().accounts.clone();
    json_response(200, &json!(accounts))
}

pub(super) async fn not_found(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: axum::http::Uri,
) -> Response {
    record(&shared, method.as_str(), uri.path(), &Value::Null);
    (StatusCode::NOT_FOUND, "404 page not found").into_response()
}

pub(super) async fn receive_poll(
    State(shared): State<Arc<Shared>>,
    Path(number): Path<String>,
) -> Response {
    record(
        &shared,
        "GET",
        &format!("/v1/receive/{number}"),
        &Value::Null,
    );
    let mut st = shared.core.change();
    if !st.accounts.contains(&number) {
        return error(400, &format!("User {number} is not registered."));
    }
    st.polls += 1;
    let frames: Vec<String> = st
        .queues
        .get_mut(&number)
        .map(|q| q.drain(..).collect())
        .unwrap_or_default();
    st.handed.extend(frames.iter().cloned());
    let items: Vec<Value> = frames
        .iter()
        .filter_map(|f| serde_json::from_str(f).ok())
        .collect();
    json_response(200, &json!(items))
}

pub(super) async fn receive_socket(
    State(shared): State<Arc<Shared>>,
    Path(number): Path<String>,
    upgrade: WebSocketUpgrade,
) -> Response {
    record(
        &shared,
        "GET",
        &format!("/v1/receive/{number}"),
        &Value::Null,
    );
    upgrade.on_upgrade(move |socket| serve_socket(shared, socket, number))
}

async fn serve_socket(shared: Arc<Shared>, mut socket: WebSocket, number: String) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Outgoing>();
    let held = shared.core.read().accounts.contains(&number);
    if !held {
        // The real server logs "Couldn't get receive channel" and keeps
        // the socket open, silent.
        shared.core.stopped().await;
        return;
    }
    let conn_no = {
        let mut st = shared.core.change();
        st.next_conn += 1;
        let conn_no = st.next_conn;
        if let Some((_, old)) = st.live.remove(&number) {
            let _ = old.send(Outgoing::Drop);
        }
        let waiting: Vec<String> = st
            .queues
            .get_mut(&number)
            .map(|q| q.drain(..).collect())
            .unwrap_or_default();
        for frame in waiting {
            let _ = tx.send(Outgoing::Frame(frame.clone()));
            st.handed.push(frame);
        }
        st.live.insert(number.clone(), (conn_no, tx));
        st.connections.push(Connection {
            number: number.clone(),
            at: Instant::now(),
        });
        conn_no
    };
    let mut silent = false;
    loop {
        if silent {
            // Neither read nor write: pings pile up unanswered.
            tokio::select! {
                out = rx.recv() => if matches!(out, None | Some(Outgoing::Drop)) { break },
                () = shared.core.stopped() => break,
            }
            continue;
        }
        tokio::select! {
            out = rx.recv() => match out {
                None | Some(Outgoing::Drop) => break,
                Some(Outgoing::Silence) => silent = true,
                Some(Outgoing::Frame(f)) => {
                    if socket.send(Message::text(f)).await.is_err() {
                        break;
                    }
                }
            },
            incoming = socket.recv() => match incoming {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => break,
                Some(Ok(Message::Ping(payload))) => {
                    if socket.send(Message::Pong(payload)).await.is_err() {
                        break;
                    }
                }
                Some(Ok(_)) => {}
            },
            () = shared.core.stopped() => break,
        }
    }
    let mut st = shared.core.change();
    if st.live.get(&number).is_some_and(|(n, _)| *n == conn_no) {
        st.live.remove(&number);
    }
}

pub(super) async fn send(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    // Decided before the attempt is recorded: a test that sees the attempt
    // may clear the hang at once, and this request must still be lost.
    let hung = shared.core.hanging();
    record(&shared, "POST", "/v2/send", &body);
    if hung {
        // Lost on the way, never delivered: a crash test kills the client
        // meanwhile, and a late delivery would look like the dead one's.
        shared.core.held().await;
        return error(502, "Bad Gateway: the request was lost");
    }
    let mut st = shared.core.change();
    if let Some(retry_after) = st.fail_429.take() {
        let mut r = error(429, "Rate limit exceeded");
        if let Some(secs) = retry_after
            && let Ok(v) = HeaderValue::from_str(&secs.to_string())
        {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return r;
    }
    if let Some((status, text)) = st.fail_status.take() {
        return error(status, &text);
    }
    let Some(number) = body["number"].as_str().map(str::to_owned) else {
        return error(
            400,
            "Couldn't process request - please provide a valid number",
        );
    };
    let recipients: Vec<String> = body["recipients"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| r.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    if recipients.is_empty() {
        return error(
            400,
            "Couldn't process request - please provide at least one recipient",
        );
    }
    if !st.accounts.contains(&number) {
        return error(400, &format!("User {number} is not registered."));
    }
    let groups = recipients
        .iter()
        .filter(|r| r.starts_with("group."))
        .count();
    if groups > 0 && groups < recipients.len() {
        return error(
            400,
            "Signal Messenger Groups and phone numbers cannot be specified together in one request!",
        );
    }
    for r in &recipients {
        let known = if r.starts_with("group.") {
            st.groups.contains(r) || st.contacts.contains(r)
        } else {
            st.contacts.contains(r)
        };
        if !known {
            return error(
                400,
                &format!("Failed to send message: Unregistered user {r}"),
            );
        }
    }
    let mut attachments = Vec::new();
    for item in body["base64_attachments"].as_array().into_iter().flatten() {
        let Some(a) = item.as_str().and_then(parse_attachment) else {
            return error(400, "Couldn't process request - invalid attachment");
        };
        attachments.push(a);
    }
    let message = body["message"].as_str().unwrap_or("").to_owned();
    if message.trim().is_empty() && attachments.is_empty() {
        return error(400, "Failed to send message: empty message");
    }
    let timestamp = st.timestamp();
    st.sent.push(Sent {
        number,
        recipients,
        message,
        quote_timestamp: body["quote_timestamp"].as_i64(),
        quote_author: body["quote_author"].as_str().map(str::to_owned),
        attachments,
        timestamp,
        at: Instant::now(),
    });
    json_response(201, &json!({ "timestamp": timestamp.to_string() }))
}

/// `data:<mime>;filename=<name>;base64,<data>`, or bare base64.
fn parse_attachment(item: &str) -> Option<SentAttachment> {
    use base64::Engine;
    let decode = |data: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .ok()
    };
    let Some(rest) = item.strip_prefix("data:") else {
        return Some(SentAttachment {
            mime: None,
            filename: None,
            bytes: decode(item)?,
        });
    };
    let (head, data) = rest.split_once(";base64,")?;
    let mut fields = head.split(';');
    let mime = fields.next().filter(|m| m.contains('/'))?.to_owned();
    let mut filename = None;
    for field in fields {
        if let Some(name) = field.strip_prefix("filename=") {
            filename = Some(name.to_owned());
        }
    }
    Some(SentAttachment {
        mime: Some(mime),
        filename,
        bytes: decode(data)?,
    })
}

/// `GET /v1/attachments/{id}`: a file the server keeps.
pub(super) async fn attachment(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Response {
    record(
        &shared,
        "GET",
        &format!("/v1/attachments/{id}"),
        &Value::Null,
    );
    match shared.core.read().files.get(&id) {
        Some(bytes) => {
            let mut r = Response::new(axum::body::Body::from(bytes.clone()));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            r
        }
        None => error(404, "No attachment with that name found"),
    }
}

pub(super) async fn typing(
    State(shared): State<Arc<Shared>>,
    method: Method,
    Path(number): Path<String>,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    record(
        &shared,
        method.as_str(),
        &format!("/v1/typing-indicator/{number}"),
        &body,
    );
    let mut st = shared.core.change();
    if !st.accounts.contains(&number) {
        return error(400, &format!("User {number} is not registered."));
    }
    let Some(recipient) = body["recipient"].as_str().map(str::to_owned) else {
        return error(400, "Couldn't process request - recipient missing");
    };
    st.typing.push(Typing {
        number,
        recipient,
        show: method == Method::PUT,
        at: Instant::now(),
    });
    StatusCode::NO_CONTENT.into_response()
}
