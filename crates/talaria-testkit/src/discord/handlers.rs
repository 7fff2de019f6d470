//! The fake's request handlers: the gateway WebSocket (identify,
//! resume, dispatches), the REST API (JSON and multipart messages) and
//! the CDN.

use super::*;
use axum::body::Bytes;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequest, Multipart, State};
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

pub(super) async fn upgrade(
    ws: WebSocketUpgrade,
    State(shared): State<Arc<Shared>>,
    uri: Uri,
) -> Response {
    shared.core.change().connections.push(Connection {
        path: uri.path().to_owned(),
        query: uri.query().unwrap_or("").to_owned(),
        at: Instant::now(),
    });
    ws.on_upgrade(move |socket| connection(shared, socket))
}

async fn connection(shared: Arc<Shared>, mut socket: WebSocket) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (id, interval) = {
        let mut st = shared.core.change();
        st.next_connection += 1;
        let id = st.next_connection;
        // A newer connection replaces an older one, as Discord does.
        if let Some(old) = st.attached.replace(Attached {
            id,
            tx,
            session: None,
        }) {
            let _ = old.tx.send(Control::Close(Some(4000)));
        }
        (id, st.heartbeat_interval_ms)
    };
    let hello = json!({"op": 10, "d": {"heartbeat_interval": interval}});
    if send(&mut socket, &hello).await {
        loop {
            tokio::select! {
                msg = socket.recv() => match msg {
                    Some(Ok(Message::Text(t))) => {
                        if !on_payload(&shared, id, &mut socket, t.as_str()).await {
                            break;
                        }
                    }
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => {}
                },
                ctl = rx.recv() => match ctl {
                    Some(Control::Send(v)) => {
                        if !send(&mut socket, &v).await {
                            break;
                        }
                    }
                    Some(Control::Close(Some(code))) => {
                        let _ = socket
                            .send(Message::Close(Some(CloseFrame { code, reason: "".into() })))
                            .await;
                        break;
                    }
                    Some(Control::Close(None)) | None => break,
                },
                () = shared.core.stopped() => break,
            }
        }
    }
    let mut st = shared.core.change();
    if st.attached.as_ref().is_some_and(|a| a.id == id) {
        st.attached = None;
    }
}

async fn send(socket: &mut WebSocket, v: &Value) -> bool {
    socket
        .send(Message::Text(v.to_string().into()))
        .await
        .is_ok()
}

/// Handles one client payload; `false` ends the connection.
async fn on_payload(shared: &Shared, conn: u64, socket: &mut WebSocket, text: &str) -> bool {
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        // Discord closes with 4002 on a payload it cannot decode.
        let _ = socket
            .send(Message::Close(Some(CloseFrame {
                code: 4002,
                reason: "decode error".into(),
            })))
            .await;
        return false;
    };
    let op = v.get("op").and_then(Value::as_u64).unwrap_or(u64::MAX);
    let d = v.get("d").cloned().unwrap_or(Value::Null);
    shared.core.change().frames.push(Frame {
        op,
        d: d.clone(),
        connection: conn,
        at: Instant::now(),
    });
    let token_ok = d.get("token").and_then(Value::as_str) == Some(shared.token.as_str());
    let out: Vec<Value> = match op {
        1 => {
            if shared.core.read().ack_heartbeats {
                vec![json!({"op": 11})]
            } else {
                Vec::new()
            }
        }
        2 | 6 if !token_ok => {
            let _ = socket
                .send(Message::Close(Some(CloseFrame {
                    code: 4004,
                    reason: "Authentication failed.".into(),
                })))
                .await;
            return false;
        }
        2 => identify(shared, conn),
        6 => resume(shared, conn, &d),
        _ => Vec::new(),
    };
    for payload in &out {
        if !send(socket, payload).await {
            return false;
        }
    }
    true
}

/// A new session: READY, a GUILD_CREATE per known guild, then anything
/// pushed before the first session.
fn identify(shared: &Shared, conn: u64) -> Vec<Value> {
    let mut st = shared.core.change();
    st.next_session += 1;
    let session = format!("fake-session-{}", st.next_session);
    st.sessions.insert(session.clone(), SessionLog::default());
    st.current = Some(session.clone());
    if let Some(a) = st.attached.as_mut().filter(|a| a.id == conn) {
        a.session = Some(session.clone());
    }
    let guilds: Vec<(String, Vec<Value>)> = st
        .guilds
        .iter()
        .map(|(g, t)| (g.clone(), t.clone()))
        .collect();
    let ready = json!({
        "v": 10,
        "user": {"id": shared.bot_id, "username": BOT_USERNAME, "bot": true},
        "session_id": session,
        "resume_gateway_url": format!("ws://{}/resume", shared.addr),
        "guilds": guilds.iter().map(|(g, _)| json!({"id": g, "unavailable": true})).collect::<Vec<_>>(),
    });
    let mut out = vec![log_dispatch(&mut st, &session, "READY", ready)];
    st.readies += 1;
    for (g, threads) in guilds {
        let d = json!({"id": g, "name": format!("Guild {g}"), "channels": [], "threads": threads});
        out.push(log_dispatch(&mut st, &session, "GUILD_CREATE", d));
    }
    for (kind, d) in std::mem::take(&mut st.backlog) {
        out.push(log_dispatch(&mut st, &session, &kind, d));
    }
    out
}

/// Replays the session after the client's sequence number, then RESUMED;
/// op 9 for a session the fake does not know (or forgot).
fn resume(shared: &Shared, conn: u64, d: &Value) -> Vec<Value> {
    let mut st = shared.core.change();
    let session = d.get("session_id").and_then(Value::as_str).unwrap_or("");
    let seq = d.get("seq").and_then(Value::as_u64).unwrap_or(0);
    if !st.sessions.contains_key(session) {
        return vec![json!({"op": 9, "d": false})];
    }
    st.current = Some(session.to_owned());
    if let Some(a) = st.attached.as_mut().filter(|a| a.id == conn) {
        a.session = Some(session.to_owned());
    }
    let mut out: Vec<Value> = st.sessions[session]
        .events
        .iter()
        .filter(|e| e.get("s").and_then(Value::as_u64).is_some_and(|s| s > seq))
        .cloned()
        .collect();
    out.push(log_dispatch(&mut st, session, "RESUMED", json!({})));
    st.resumed += 1;
    out
}

fn json_response(status: u16, v: &Value, headers: &[(&str, String)]) -> Response {
    let mut r = crate::json_response(status, v);
    for (k, val) in headers {
        if let (Ok(name), Ok(value)) = (
            header::HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(val),
        ) {
            r.headers_mut().insert(name, value);
        }
    }
    r
}

pub(super) async fn rest(
    State(shared): State<Arc<Shared>>,
    request: axum::extract::Request,
) -> Response {
    let method = request.method().clone();
    let uri = request.uri().clone();
    let headers = request.headers().clone();
    if method == Method::GET && uri.path().starts_with("/attachments/") {
        return cdn(&shared, &uri);
    }
    let Some(path) = uri.path().strip_prefix("/api/v10") else {
        return json_response(404, &json!({"message": "404: Not Found", "code": 0}), &[]);
    };
    let path = path.to_owned();
    let authorized = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        == Some(format!("Bot {}", shared.token).as_str());
    let multipart = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("multipart/form-data"));
    let (body, files) = if multipart {
        match read_form(request).await {
            Ok(x) => x,
            Err(why) => (Value::Null, Err(why)),
        }
    } else {
        let bytes = Bytes::from_request(request, &()).await.unwrap_or_default();
        (
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            Ok(Vec::new()),
        )
    };
    shared.core.record(Request {
        method: method.to_string(),
        path: path.clone(),
        body: body.clone(),
        authorized,
        at: Instant::now(),
    });
    if !authorized {
        return json_response(
            401,
            &json!({"message": "401: Unauthorized", "code": 0}),
            &[],
        );
    }
    let files = match files {
        Ok(f) => f,
        Err(why) => {
            return json_response(400, &json!({"message": why, "code": 50035}), &[]);
        }
    };
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method.as_str(), parts.as_slice()) {
        ("GET", ["gateway", "bot"]) => json_response(
            200,
            &json!({"url": format!("ws://{}/gateway", shared.addr), "shards": 1,
                "session_start_limit": {"total": 1000, "remaining": 999, "reset_after": 0, "max_concurrency": 1}}),
            &[],
        ),
        // Discord's "Get Current User": the bot's own user object.
        ("GET", ["users", "@me"]) => json_response(
            200,
            &json!({"id": shared.bot_id, "username": super::BOT_USERNAME,
                "discriminator": "0", "global_name": null, "bot": true}),
            &[],
        ),
        ("POST", ["channels", channel, "typing"]) => {
            shared.core.change().typing.push(Typing {
                channel_id: (*channel).to_owned(),
                at: Instant::now(),
            });
            StatusCode::NO_CONTENT.into_response()
        }
        ("POST", ["channels", channel, "messages"]) => {
            create_message(&shared, channel, &body, files).await
        }
        _ => json_response(404, &json!({"message": "404: Not Found", "code": 0}), &[]),
    }
}

async fn create_message(
    shared: &Shared,
    channel: &str,
    body: &Value,
    files: Vec<UploadedFile>,
) -> Response {
    if shared.core.hanging() {
        shared.core.held().await;
        return json_response(502, &json!({"message": "502: Bad Gateway", "code": 0}), &[]);
    }
    let limit_headers = |remaining: u32, reset_after: f64| {
        vec![
            ("x-ratelimit-bucket", SEND_BUCKET.to_owned()),
            ("x-ratelimit-limit", "5".to_owned()),
            ("x-ratelimit-remaining", remaining.to_string()),
            ("x-ratelimit-reset-after", format!("{reset_after:.3}")),
        ]
    };
    let (fail_429, fail_status, exhaust) = {
        let mut st = shared.core.change();
        let f = st.fail_429.take();
        let s = if f.is_none() {
            st.fail_status.take()
        } else {
            None
        };
        let e = if f.is_none() && s.is_none() {
            st.exhaust_next.take()
        } else {
            None
        };
        (f, s, e)
    };
    if let Some((retry_after, global)) = fail_429 {
        let mut h = limit_headers(0, retry_after);
        h.push(("retry-after", format!("{}", retry_after.ceil() as u64)));
        if global {
            h.push(("x-ratelimit-global", "true".to_owned()));
        }
        return json_response(
            429,
            &json!({"message": "You are being rate limited.", "retry_after": retry_after, "global": global}),
            &h,
        );
    }
    if let Some(status) = fail_status {
        return json_response(
            status,
            &json!({"message": format!("{status}: injected"), "code": 0}),
            &[],
        );
    }
    if !files.is_empty() {
        return create_with_files(shared, channel, body, files);
    }
    let content = body.get("content").and_then(Value::as_str).unwrap_or("");
    if content.is_empty() {
        return json_response(
            400,
            &json!({"message": "Cannot send an empty message", "code": 50006}),
            &[],
        );
    }
    if content.chars().count() > 2000 {
        return json_response(
            400,
            &json!({"message": "Invalid Form Body", "code": 50035,
                "errors": {"content": {"_errors": [{"code": "BASE_TYPE_MAX_LENGTH", "message": "Must be 2000 or fewer in length."}]}}}),
            &[],
        );
    }
    let sent = {
        let mut st = shared.core.change();
        st.next_id += 1;
        let sent = Sent {
            channel_id: channel.to_owned(),
            content: content.to_owned(),
            reply_to: body
                .pointer("/message_reference/message_id")
                .and_then(Value::as_str)
                .map(str::to_owned),
            allowed_mentions: body.get("allowed_mentions").cloned().unwrap_or(Value::Null),
            id: st.next_id.to_string(),
            at: Instant::now(),
        };
        st.sent.push(sent.clone());
        sent
    };
    let h = match exhaust {
        Some(after) => limit_headers(0, after),
        None => limit_headers(4, 1.0),
    };
    json_response(
        200,
        &json!({"id": sent.id, "channel_id": sent.channel_id, "content": sent.content,
            "author": {"id": shared.bot_id, "username": BOT_USERNAME, "bot": true}, "type": 0}),
        &h,
    )
}

/// A multipart body: `payload_json` parsed, and the file parts.
async fn read_form(
    request: axum::extract::Request,
) -> Result<(Value, Result<Vec<UploadedFile>, String>), String> {
    let mut form = Multipart::from_request(request, &())
        .await
        .map_err(|e| e.body_text())?;
    let mut payload = Value::Null;
    let mut files = Vec::new();
    while let Some(field) = form.next_field().await.map_err(|e| e.body_text())? {
        let name = field.name().unwrap_or("").to_owned();
        let file_name = field.file_name().map(str::to_owned);
        let content_type = field.content_type().map(str::to_owned);
        let bytes = field.bytes().await.map_err(|e| e.body_text())?;
        if name == "payload_json" {
            payload = serde_json::from_slice(&bytes).map_err(|e| format!("payload_json: {e}"))?;
        } else if file_name.is_some() {
            files.push(UploadedFile {
                field: name,
                file_name,
                content_type,
                bytes: bytes.to_vec(),
            });
        }
    }
    let files = if files.iter().all(|f| is_files_field(&f.field)) {
        Ok(files)
    } else {
        Err("Invalid Form Body: file fields are named files[n]".to_owned())
    };
    Ok((payload, files))
}

/// `files[n]`, the name Discord reads file parts under.
fn is_files_field(name: &str) -> bool {
    name.strip_prefix("files[")
        .and_then(|r| r.strip_suffix(']'))
        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

/// A message with files: each `attachments` entry of the payload names a
/// `files[id]` part; the files go on the CDN.
fn create_with_files(
    shared: &Shared,
    channel: &str,
    body: &Value,
    files: Vec<UploadedFile>,
) -> Response {
    let invalid = |why: &str| {
        json_response(
            400,
            &json!({"message": format!("Invalid Form Body: {why}"), "code": 50035}),
            &[],
        )
    };
    if files.iter().any(|f| f.bytes.len() > MAX_UPLOAD_BYTES) {
        return json_response(
            413,
            &json!({"message": "Request entity too large", "code": 40005}),
            &[],
        );
    }
    let content = body.get("content").and_then(Value::as_str);
    if content.is_some_and(|c| c.chars().count() > 2000) {
        return invalid("content: Must be 2000 or fewer in length.");
    }
    let described: Vec<(String, Option<String>)> = body
        .get("attachments")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|x| {
                    let id = match x.get("id") {
                        Some(Value::String(s)) => s.clone(),
                        Some(v) => v.to_string(),
                        None => String::new(),
                    };
                    (
                        id,
                        x.get("filename").and_then(Value::as_str).map(str::to_owned),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    for (id, _) in &described {
        if !files.iter().any(|f| f.field == format!("files[{id}]")) {
            return invalid(&format!("attachments: no file files[{id}]"));
        }
    }
    let mut st = shared.core.change();
    let attachments: Vec<Value> = files
        .iter()
        .map(|f| {
            let n = f.field.trim_start_matches("files[").trim_end_matches(']');
            // The payload's filename wins over the part's, as on Discord.
            let name = described
                .iter()
                .find(|(id, _)| id == n)
                .and_then(|(_, name)| name.clone())
                .or_else(|| f.file_name.clone())
                .unwrap_or_else(|| "file".to_owned());
            cdn_file(
                &mut st,
                shared.addr,
                channel,
                Bytes::from(f.bytes.clone()),
                &name,
                f.content_type.as_deref(),
            )
        })
        .collect();
    st.next_id += 1;
    let id = st.next_id.to_string();
    let upload = Upload {
        channel_id: channel.to_owned(),
        payload: body.clone(),
        content: content.map(str::to_owned),
        reply_to: body
            .pointer("/message_reference/message_id")
            .and_then(Value::as_str)
            .map(str::to_owned),
        files,
        id: id.clone(),
        attachments: attachments.clone(),
        at: Instant::now(),
    };
    st.uploads.push(upload);
    json_response(
        200,
        &json!({"id": id, "channel_id": channel, "content": content.unwrap_or(""),
            "attachments": attachments,
            "author": {"id": shared.bot_id, "username": BOT_USERNAME, "bot": true}, "type": 0}),
        &[
            ("x-ratelimit-bucket", SEND_BUCKET.to_owned()),
            ("x-ratelimit-limit", "5".to_owned()),
            ("x-ratelimit-remaining", "4".to_owned()),
            ("x-ratelimit-reset-after", "1.000".to_owned()),
        ],
    )
}

/// `GET /attachments/...`: the CDN. No authorization, but the address's
/// `hm` signature must be the one the file was given.
fn cdn(shared: &Shared, uri: &Uri) -> Response {
    let path = uri.path().to_owned();
    let hm = uri.query().and_then(|q| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("hm="))
            .map(str::to_owned)
    });
    let mut st = shared.core.change();
    st.fetches.push(path.clone());
    let found = st
        .files
        .values()
        .find(|f| f.path == path && !f.expired && hm.as_deref() == Some(f.signature.as_str()));
    match found {
        Some(CdnFile {
            redirect: Some(location),
            ..
        }) => {
            let mut r = Response::new(axum::body::Body::empty());
            *r.status_mut() = StatusCode::FOUND;
            if let Ok(v) = HeaderValue::from_str(location) {
                r.headers_mut().insert(header::LOCATION, v);
            }
            r
        }
        Some(f) => {
            let mut r = Response::new(axum::body::Body::from(f.bytes.clone()));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            r
        }
        None => {
            let mut r = Response::new(axum::body::Body::from(
                "This content is no longer available.",
            ));
            *r.status_mut() = StatusCode::NOT_FOUND;
            r
        }
    }
}
