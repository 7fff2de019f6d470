//! The fake's request handlers: the Socket Mode WebSocket and the Web
//! API methods, with their parameter decoding.

use super::*;
use crate::json_response;
use axum::body::Bytes;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequest, Path, State};
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
        "files.getUploadURLExternal" => {
            // Its documentation lists a form body only.
            if !is_form(&headers) {
                return fail("invalid_form_data");
            }
            let filename = string(&params, "filename").filter(|f| !f.is_empty());
            let length = string(&params, "length").and_then(|l| l.parse::<u64>().ok());
            let (Some(filename), Some(length)) = (filename, length.filter(|l| *l > 0)) else {
                return fail("invalid_arguments");
            };
            let mut st = shared.core.change();
            let id = next_file_id(&mut st);
            let key = format!("{id}k{}", st.next_ts);
            st.files.insert(
                id.clone(),
                StoredFile {
                    name: filename,
                    mime: String::new(),
                    bytes: None,
                    length,
                    upload_key: key.clone(),
                },
            );
            ok(json!({
                "upload_url": format!("http://{}/upload/v1/{key}", shared.addr),
                "file_id": id,
            }))
        }
        "files.completeUploadExternal" => complete_upload(&shared, &params),
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

fn is_form(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/x-www-form-urlencoded"))
}

fn complete_upload(shared: &Shared, params: &Map<String, Value>) -> Response {
    // `files` is an array in JSON, a JSON string in a form.
    let files = match params.get("files") {
        Some(Value::Array(a)) => a.clone(),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Array(a)) => a,
            _ => return fail("invalid_arguments"),
        },
        _ => return fail("invalid_arguments"),
    };
    let mut listed = Vec::new();
    for f in &files {
        let Some(id) = f.get("id").and_then(Value::as_str) else {
            return fail("invalid_arguments");
        };
        let title = f.get("title").and_then(Value::as_str).map(str::to_owned);
        listed.push((id.to_owned(), title));
    }
    if listed.is_empty() {
        return fail("invalid_arguments");
    }
    let mut st = shared.core.change();
    for (id, _) in &listed {
        if st.files.get(id).is_none_or(|f| f.bytes.is_none()) {
            return fail("file_not_found");
        }
    }
    let answer: Vec<Value> = listed
        .iter()
        .map(|(id, title)| json!({ "id": id, "title": title.clone().unwrap_or_default() }))
        .collect();
    st.shares.push(Share {
        files: listed,
        channel_id: string(params, "channel_id").filter(|c| !c.is_empty()),
        thread_ts: string(params, "thread_ts").filter(|t| !t.is_empty()),
        initial_comment: string(params, "initial_comment"),
    });
    ok(json!({ "files": answer }))
}

/// The upload address: the bytes, raw or as a multipart form.
pub(super) async fn upload(
    State(shared): State<Arc<Shared>>,
    Path(key): Path<String>,
    request: axum::extract::Request,
) -> Response {
    let headers = request.headers().clone();
    let had_authorization = headers.contains_key(header::AUTHORIZATION);
    let Some(file_id) = shared
        .core
        .read()
        .files
        .iter()
        .find(|(_, f)| !f.upload_key.is_empty() && f.upload_key == key)
        .map(|(id, _)| id.clone())
    else {
        return status(404);
    };
    let ctype = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let (field, part_filename, content_type, bytes) = if ctype.starts_with("multipart/form-data") {
        let mut multipart = match axum::extract::Multipart::from_request(request, &()).await {
            Ok(m) => m,
            Err(_) => return status(400),
        };
        let mut found = None;
        loop {
            match multipart.next_field().await {
                Ok(Some(f)) => {
                    let name = f.name().map(str::to_owned);
                    let file_name = f.file_name().map(str::to_owned);
                    let ctype = f.content_type().map(str::to_owned);
                    let Ok(data) = f.bytes().await else {
                        return status(400);
                    };
                    if found.is_none() && file_name.is_some() {
                        found = Some((name, file_name, ctype, data.to_vec()));
                    }
                }
                Ok(None) => break,
                Err(_) => return status(400),
            }
        }
        match found {
            Some(f) => f,
            None => return status(400),
        }
    } else {
        let Ok(body) = axum::body::to_bytes(request.into_body(), 64 << 20).await else {
            return status(400);
        };
        let ctype = (!ctype.is_empty()).then_some(ctype);
        (None, None, ctype, body.to_vec())
    };
    let mut st = shared.core.change();
    let Some(stored) = st.files.get_mut(&file_id) else {
        return status(404);
    };
    stored.bytes = Some(bytes.clone());
    stored.mime = content_type.clone().unwrap_or_default();
    let (filename, length) = (stored.name.clone(), stored.length);
    st.uploads.push(Upload {
        file_id,
        filename,
        length,
        field,
        part_filename,
        content_type,
        bytes: bytes.clone(),
        had_authorization,
    });
    let mut r = Response::new(axum::body::Body::from(format!("OK - {}", bytes.len())));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

/// `url_private` and `url_private_download`.
pub(super) async fn file_private(
    State(shared): State<Arc<Shared>>,
    Path((key, _name)): Path<(String, String)>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let authorized = !token.is_empty() && token == shared.bot_token;
    let mut st = shared.core.change();
    st.downloads.push((uri.path().to_owned(), authorized));
    if !authorized {
        // Slack's answer to a request without the token: its sign-in page.
        let mut r = Response::new(axum::body::Body::from(
            "<!DOCTYPE html><html><head><title>Slack</title></head><body>Sign in</body></html>",
        ));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
        return r;
    }
    let id = key.strip_prefix("T0TALARIA-").unwrap_or("");
    let Some(file) = st.files.get(id).filter(|f| f.bytes.is_some()) else {
        return status(404);
    };
    let bytes = file.bytes.clone().unwrap_or_default();
    let mut r = Response::new(axum::body::Body::from(bytes));
    if let Ok(v) = HeaderValue::from_str(&file.mime) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}
