//! The fake's request handlers: the Socket Mode WebSocket and the Web
//! API methods, with their parameter decoding.

use super::*;
use crate::json_response;
use axum::body::Bytes;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

pub(super) async fn socket(
    State(shared): State<Arc<Shared>>,
    upgrade: WebSocketUpgrade,
) -> Response {
    upgrade
        .on_upgrade(move |ws| serve_socket(shared, ws))
        .into_response()
}

async fn serve_socket(shared: Arc<Shared>, mut ws: WebSocket) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (hello, resend) = {
        let mut st = shared.core.change();
        st.connections += 1;
        // A new connection replaces the old one, as Slack spreads events
        // over connections; the old one hears nothing more.
        st.live = Some(tx.clone());
        let hello = st.send_hello;
        // Everything unacknowledged comes again on a new connection.
        let mut resend = Vec::new();
        for e in st.envelopes.iter_mut().filter(|e| !e.acked) {
            resend.push(envelope_frame(e));
            e.sent += 1;
        }
        (hello, resend)
    };
    if hello {
        send_frame(
            &shared,
            json!({
                "type": "hello", "num_connections": 1,
                "debug_info": {"host": "fake-slack", "approximate_connection_time": 18060},
                "connection_info": {"app_id": "A0TALARIA"},
            }),
        );
    }
    for f in resend {
        send_frame(&shared, f);
    }
    loop {
        tokio::select! {
            () = shared.core.stopped() => return,
            cmd = rx.recv() => match cmd {
                Some(Command::Text(t)) => {
                    if ws.send(Message::Text(t.into())).await.is_err() {
                        break;
                    }
                }
                Some(Command::Drop) | None => break,
                Some(Command::Silence) => {
                    // Hold the socket open, reading nothing, until the
                    // client gives up or the server stops.
                    shared.core.stopped().await;
                    return;
                }
            },
            frame = ws.recv() => match frame {
                None | Some(Err(_)) => break,
                Some(Ok(Message::Text(t))) => {
                    // A connection the test dropped is gone: what the
                    // client wrote to it after that never reaches Slack.
                    let live = shared.core.read()
                        .live
                        .as_ref()
                        .is_some_and(|l| l.same_channel(&tx));
                    if live {
                        on_client_text(&shared, t.as_str());
                    }
                }
                Some(Ok(Message::Ping(_))) => {
                    shared.core.change().pings += 1;
                }
                Some(Ok(Message::Close(_))) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    let mut st = shared.core.change();
    if st.live.as_ref().is_some_and(|l| l.same_channel(&tx)) {
        st.live = None;
    }
    drop(st);
}

fn on_client_text(shared: &Shared, text: &str) {
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        return;
    };
    let Some(id) = v.get("envelope_id").and_then(Value::as_str) else {
        return;
    };
    let mut st = shared.core.change();
    st.acks.push(id.to_owned());
    if let Some(e) = st.envelopes.iter_mut().find(|e| e.id == id) {
        e.acked = true;
    }
    drop(st);
}

pub(super) async fn api(
    State(shared): State<Arc<Shared>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let expected = if method == "apps.connections.open" {
        &shared.app_token
    } else {
        &shared.bot_token
    };
    let authorized = !token.is_empty() && token == expected;
    let params = params(&headers, &body);
    let hung = shared.core.hanging();
    shared.core.record(Request {
        method: method.clone(),
        params: Value::Object(params.clone()),
        authorized,
        at: Instant::now(),
    });
    if !authorized {
        // Slack says which token type is wrong when it is a real token of
        // the other kind.
        let error = if token == shared.bot_token || token == shared.app_token {
            "not_allowed_token_type"
        } else {
            "invalid_auth"
        };
        return fail(error);
    }
    match method.as_str() {
        "auth.test" => ok(json!({
            "url": "https://talaria-test.slack.com/", "team": "Talaria Test",
            "user": "talaria", "team_id": "T0TALARIA", "user_id": BOT_USER_ID,
            "bot_id": BOT_ID, "is_enterprise_install": false,
        })),
        "apps.connections.open" => {
            let failure = shared.core.change().open_failures.take();
            if let Some(error) = failure {
                return fail(&error);
            }
            let n = shared.core.read().connections + 1;
            ok(json!({ "url": format!("ws://{}/socket?ticket=t{n}", shared.addr) }))
        }
        "chat.postMessage" => post_message(&shared, &params, hung).await,
        "reactions.add" | "reactions.remove" => {
            let field = |k: &str| string(&params, k).unwrap_or_default();
            let (channel, timestamp, name) = (field("channel"), field("timestamp"), field("name"));
            if channel.is_empty() || timestamp.is_empty() || name.is_empty() {
                return fail("invalid_arguments");
            }
            shared.core.change().reactions.push(Reaction {
                added: method == "reactions.add",
                channel,
                timestamp,
                name,
            });
            ok(json!({}))
        }
        _ => fail("unknown_method"),
    }
}

async fn post_message(shared: &Shared, params: &Map<String, Value>, hung: bool) -> Response {
    if hung {
        shared.core.held().await;
        // Lost, never delivered: its client may be long gone.
        return status(502);
    }
    let failure = shared.core.change().post_failures.take();
    match failure {
        Some(PostFailure::RateLimited(secs)) => {
            let mut r = json_response(429, &json!({ "ok": false, "error": "ratelimited" }));
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
            return r;
        }
        Some(PostFailure::Error(e)) => return fail(&e),
        Some(PostFailure::Status(s)) => return status(s),
        None => {}
    }
    let Some(channel) = string(params, "channel").filter(|c| !c.is_empty()) else {
        return fail("channel_not_found");
    };
    let text = string(params, "text").unwrap_or_default();
    if text.trim().is_empty() {
        return fail("no_text");
    }
    if text.chars().count() > 40_000 {
        return fail("msg_too_long");
    }
    let thread_ts = string(params, "thread_ts").filter(|t| !t.is_empty());
    let mrkdwn = match params.get("mrkdwn") {
        Some(Value::Bool(b)) => Some(*b),
        Some(Value::String(s)) => Some(s == "true"),
        _ => None,
    };
    let ts = {
        let mut st = shared.core.change();
        let ts = format!("1700000000.{:06}", st.next_ts);
        st.next_ts += 1;
        st.posted.push(Posted {
            channel: channel.clone(),
            text: text.clone(),
            thread_ts: thread_ts.clone(),
            mrkdwn,
            ts: ts.clone(),
            at: Instant::now(),
        });
        ts
    };
    let mut message = json!({
        "type": "message", "user": BOT_USER_ID, "bot_id": BOT_ID, "text": text, "ts": ts,
    });
    if let Some(t) = thread_ts {
        message["thread_ts"] = json!(t);
    }
    ok(json!({ "channel": channel, "ts": ts, "message": message }))
}

fn ok(mut fields: Value) -> Response {
    if let Some(obj) = fields.as_object_mut() {
        obj.insert("ok".into(), json!(true));
    }
    json_response(200, &fields)
}

fn fail(error: &str) -> Response {
    json_response(200, &json!({ "ok": false, "error": error }))
}

fn status(code: u16) -> Response {
    let mut r = Response::new(axum::body::Body::empty());
    *r.status_mut() =
        axum::http::StatusCode::from_u16(code).unwrap_or(axum::http::StatusCode::BAD_GATEWAY);
    r
}

/// The body's parameters (JSON object or form).
pub(super) fn params(headers: &HeaderMap, body: &Bytes) -> Map<String, Value> {
    let ctype = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ctype.starts_with("application/x-www-form-urlencoded") {
        return form_urlencoded::parse(body)
            .map(|(k, v)| (k.into_owned(), Value::String(v.into_owned())))
            .collect();
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

fn string(params: &Map<String, Value>, key: &str) -> Option<String> {
    match params.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        v => Some(v.to_string()),
    }
}
