//! The fake server's request handlers: the REST API (posts, typing,
//! users) and the WebSocket event stream.

use super::*;
use crate::json_response;
use axum::body::Bytes;
use axum::extract::multipart::MultipartRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Multipart, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, Uri, header};
use axum::response::Response;
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

fn authorized(shared: &Shared, headers: &HeaderMap) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| !t.is_empty() && t == shared.token)
}

fn app_error(status: u16, id: &str, message: &str) -> Response {
    json_response(
        status,
        &json!({"id": id, "message": message, "detailed_error": "", "request_id": "fake", "status_code": status}),
    )
}

pub(super) async fn rest(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let ok = authorized(&shared, &headers);
    // Decided before the attempt is logged (and waiters woken): a test that
    // sees the attempt and then clears the hang must find it hung.
    let hung = shared.core.hanging();
    shared.core.record(Request {
        method: method.to_string(),
        path: path.clone(),
        body: body.clone(),
        authorized: ok,
        at: Instant::now(),
    });
    if !ok {
        return app_error(
            401,
            "api.context.session_expired.app_error",
            "Invalid or expired session, please login again.",
        );
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (&method, segments.as_slice()) {
        (&Method::GET, ["api", "v4", "files", id]) => {
            let st = shared.core.read();
            match st.files.get(*id) {
                Some(f) => {
                    let mut r = Response::new(axum::body::Body::from(f.bytes.clone()));
                    if let Ok(v) = HeaderValue::from_str(&f.mime) {
                        r.headers_mut().insert(header::CONTENT_TYPE, v);
                    }
                    let disposition = format!(
                        "attachment;filename=\"{}\"",
                        f.name.replace(['"', '\\'], "_")
                    );
                    if let Ok(v) = HeaderValue::from_str(&disposition) {
                        r.headers_mut().insert(header::CONTENT_DISPOSITION, v);
                    }
                    r
                }
                None => app_error(
                    404,
                    "app.file_info.get.app_error",
                    "Unable to get the file info.",
                ),
            }
        }
        (&Method::GET, ["api", "v4", "users", "me"]) => json_response(
            200,
            &json!({"id": BOT_USER_ID, "username": BOT_USERNAME, "is_bot": true,
                    "first_name": "", "last_name": "", "nickname": "", "roles": "system_user"}),
        ),
        (&Method::POST, ["api", "v4", "posts"]) => create_post(&shared, &body, hung).await,
        (&Method::POST, ["api", "v4", "users", user, "typing"]) => {
            if *user != BOT_USER_ID && *user != "me" {
                return app_error(
                    403,
                    "api.context.permissions.app_error",
                    "You do not have the appropriate permissions.",
                );
            }
            let Some(channel_id) = body.get("channel_id").and_then(Value::as_str) else {
                return app_error(
                    400,
                    "api.context.invalid_body_param.app_error",
                    "Invalid or missing channel_id in request body.",
                );
            };
            let parent = body
                .get("parent_id")
                .and_then(Value::as_str)
                .filter(|p| !p.is_empty())
                .map(str::to_owned);
            shared.core.change().typing.push(Typing {
                user_id: (*user).to_owned(),
                channel_id: channel_id.to_owned(),
                parent_id: parent,
                at: Instant::now(),
            });
            json_response(200, &json!({"status": "OK"}))
        }
        _ => app_error(
            404,
            "api.context.404.app_error",
            "Sorry, we could not find the page.",
        ),
    }
}

async fn create_post(shared: &Shared, body: &Value, hung: bool) -> Response {
    if hung {
        shared.core.held().await;
        // Lost, never delivered: its client may be long gone.
        return app_error(502, "fake.lost", "Bad Gateway: the request was lost");
    }
    let mut st = shared.core.change();
    if let Some((reset, retry_after)) = st.fail_429.take() {
        let mut r = app_error(
            429,
            "api.context.rate_limit.app_error",
            "command failed: too many requests",
        );
        let h = r.headers_mut();
        h.insert("x-ratelimit-limit", HeaderValue::from_static("10"));
        h.insert("x-ratelimit-remaining", HeaderValue::from_static("0"));
        if let Ok(v) = HeaderValue::from_str(&reset.to_string()) {
            h.insert("x-ratelimit-reset", v);
        }
        if let Some(secs) = retry_after
            && let Ok(v) = HeaderValue::from_str(&secs.to_string())
        {
            h.insert(header::RETRY_AFTER, v);
        }
        return r;
    }
    if let Some(status) = st.fail_status.take() {
        return app_error(status, "fake.injected", "injected failure");
    }
    let channel_id = body.get("channel_id").and_then(Value::as_str).unwrap_or("");
    let message = body.get("message").and_then(Value::as_str).unwrap_or("");
    let file_ids: Vec<String> = body
        .get("file_ids")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    if file_ids.len() > MAX_FILES_PER_POST {
        return app_error(
            400,
            "model.post.is_valid.file_ids.app_error",
            "Invalid file ids.",
        );
    }
    // The server attaches only the caller's unattached files of the
    // channel; here an id that is not such a file is refused, so a test
    // sees the mistake.
    for id in &file_ids {
        match st.files.get(id) {
            Some(f) if f.channel_id == channel_id && f.post_id.is_none() => {}
            _ => {
                return app_error(
                    400,
                    "api.post.create_post.file_ids.app_error",
                    "Invalid file id.",
                );
            }
        }
    }
    let root_id = body
        .get("root_id")
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty())
        .map(str::to_owned);
    let Some(channel_type) = st.channels.get(channel_id).cloned() else {
        return app_error(
            403,
            "api.context.permissions.app_error",
            "You do not have the appropriate permissions.",
        );
    };
    if message.trim().is_empty() && file_ids.is_empty() {
        return app_error(
            400,
            "api.post.create_post.message.app_error",
            "Message must not be empty.",
        );
    }
    if message.chars().count() > MAX_POST_CHARS {
        return app_error(
            400,
            "model.post.is_valid.message_length.app_error",
            "Invalid message length.",
        );
    }
    if let Some(root) = &root_id
        && st.known_posts.get(root).map(String::as_str) != Some(channel_id)
    {
        return app_error(
            400,
            "api.post.create_post.root_id.app_error",
            "Invalid RootId parameter.",
        );
    }
    let id = new_id(&mut st, "b");
    let infos = attach(&mut st, &file_ids, &id);
    st.known_posts.insert(id.clone(), channel_id.to_owned());
    st.posts.push(CreatedPost {
        id: id.clone(),
        channel_id: channel_id.to_owned(),
        message: message.to_owned(),
        root_id: root_id.clone(),
        file_ids: file_ids.clone(),
        at: Instant::now(),
    });
    let post = json!({
        "id": id, "create_at": unix_millis(), "update_at": unix_millis(), "edit_at": 0,
        "delete_at": 0, "user_id": BOT_USER_ID, "channel_id": channel_id,
        "root_id": root_id.unwrap_or_default(), "message": message, "type": "",
        "props": {"from_bot": "true"}, "file_ids": file_ids, "metadata": metadata(&infos),
    });
    // A real server tells every member, the author included.
    let data = json!({
        "channel_display_name": display_name(channel_id, &channel_type),
        "channel_name": channel_id, "channel_type": channel_type,
        "post": post.to_string(), "sender_name": format!("@{BOT_USERNAME}"), "team_id": "team1",
    });
    emit(
        &mut st,
        "posted",
        data,
        json!({"channel_id": channel_id, "team_id": "", "user_id": ""}),
    );
    json_response(201, &post)
}

pub(super) async fn websocket(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    let header_auth = authorized(&shared, &headers);
    let asked_id = query
        .get("connection_id")
        .cloned()
        .filter(|s| !s.is_empty());
    let asked_seq = query.get("sequence_number").and_then(|s| s.parse().ok());
    upgrade.on_upgrade(move |socket| serve_socket(shared, socket, header_auth, asked_id, asked_seq))
}

async fn serve_socket(
    shared: Arc<Shared>,
    mut socket: WebSocket,
    header_auth: bool,
    asked_id: Option<String>,
    asked_seq: Option<i64>,
) {
    if !header_auth {
        // Without the header, the first frame must be the challenge.
        let first = tokio::time::timeout(Duration::from_secs(5), socket.recv()).await;
        let ok = match first {
            Ok(Some(Ok(Message::Text(t)))) => serde_json::from_str::<Value>(t.as_str())
                .ok()
                .filter(|v| v["action"] == "authentication_challenge")
                .and_then(|v| v["data"]["token"].as_str().map(|t| t == shared.token))
                .unwrap_or(false),
            _ => false,
        };
        if !ok {
            let _ = socket.send(Message::Close(None)).await;
            return;
        }
    }
    let (tx, mut rx) = mpsc::unbounded_channel::<Outgoing>();
    let mut silent = false;
    let conn_no = {
        let mut st = shared.core.change();
        if st.mute {
            silent = true;
        }
        st.next_conn += 1;
        let conn_no = st.next_conn;
        let resumable = match (&st.session, &asked_id, asked_seq) {
            (Some(s), Some(id), Some(seq)) if *id == s.id => {
                let oldest = s.buffer.front().map_or(s.next_seq, |(q, _)| *q);
                seq >= oldest && seq <= s.next_seq
            }
            _ => false,
        };
        let fresh = new_id(&mut st, "c");
        let backlog = std::mem::take(&mut st.backlog);
        let session = st.session.get_or_insert_with(|| Session {
            id: String::new(),
            next_seq: 0,
            buffer: VecDeque::new(),
            live: None,
        });
        if let Some((_, old)) = session.live.take() {
            let _ = old.send(Outgoing::Drop);
        }
        if resumable {
            let from = asked_seq.unwrap_or(0);
            for (_, frame) in session.buffer.iter().filter(|(q, _)| *q >= from) {
                let _ = tx.send(Outgoing::Frame(frame.clone()));
            }
        } else {
            session.id = fresh;
            session.next_seq = 1;
            session.buffer.clear();
            let hello = json!({"event": "hello", "data": {"connection_id": session.id,
                "server_version": "10.0.0.fake", "server_hostname": "fake"},
                "broadcast": {"channel_id": "", "team_id": "", "user_id": BOT_USER_ID}, "seq": 0});
            let _ = tx.send(Outgoing::Frame(hello.to_string()));
        }
        session.live = Some((conn_no, tx));
        let connection_id = session.id.clone();
        for (event, data, broadcast) in backlog {
            emit(&mut st, &event, data, broadcast);
        }
        st.connections.push(Connection {
            asked_id,
            asked_seq,
            resumed: resumable,
            connection_id,
            header_auth,
            at: Instant::now(),
        });
        conn_no
    };
    loop {
        if silent {
            tokio::select! {
                out = rx.recv() => match out {
                    None | Some(Outgoing::Drop) => break,
                    _ => {}
                },
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
                Some(Ok(Message::Text(t))) => {
                    let Ok(action) = serde_json::from_str::<Value>(t.as_str()) else {
                        continue;
                    };
                    let seq = action["seq"].as_i64().unwrap_or(0);
                    let reply = match action["action"].as_str() {
                        Some("ping") => {
                            shared.core.change().pings += 1;
                            json!({"status": "OK", "seq_reply": seq,
                                   "data": {"text": "pong", "version": "10.0.0.fake", "server_time": unix_millis()}})
                        }
                        Some("authentication_challenge") => json!({"status": "OK", "seq_reply": seq}),
                        Some("user_typing") => json!({"status": "OK", "seq_reply": seq}),
                        _ => json!({"status": "FAIL", "seq_reply": seq,
                                    "error": {"id": "api.web_socket_router.bad_action.app_error"}}),
                    };
                    if socket.send(Message::text(reply.to_string())).await.is_err() {
                        break;
                    }
                }
                Some(Ok(_)) => {}
            },
            () = shared.core.stopped() => break,
        }
    }
    let mut st = shared.core.change();
    if let Some(s) = st.session.as_mut()
        && s.live.as_ref().is_some_and(|(n, _)| *n == conn_no)
    {
        s.live = None;
    }
}

/// `POST /api/v4/files`: a `multipart/form-data` upload, read part by
/// part as the server does.
pub(super) async fn upload(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    multipart: Result<Multipart, MultipartRejection>,
) -> Response {
    let ok = authorized(&shared, &headers);
    shared.core.record(Request {
        method: "POST".into(),
        path: "/api/v4/files".into(),
        body: Value::Null,
        authorized: ok,
        at: Instant::now(),
    });
    if !ok {
        return app_error(
            401,
            "api.context.session_expired.app_error",
            "Invalid or expired session, please login again.",
        );
    }
    let bad = |why: &str| app_error(400, "api.file.upload_file.bad_parse.app_error", why);
    let mut multipart = match multipart {
        Ok(m) => m,
        Err(e) => return bad(&format!("Unable to parse multipart request: {e}")),
    };
    let max = shared.core.read().max_file_size;
    let mut fields = Vec::new();
    let mut channel_id: Option<String> = None;
    let mut got: Vec<(String, Option<String>, Vec<u8>)> = Vec::new();
    loop {
        let field = match multipart.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => return bad(&format!("Unable to parse multipart request: {e}")),
        };
        let name = field.name().unwrap_or("").to_owned();
        fields.push(name.clone());
        match name.as_str() {
            "channel_id" => match field.text().await {
                Ok(t) => channel_id = Some(t),
                Err(e) => return bad(&e.to_string()),
            },
            "files" => {
                if channel_id.is_none() {
                    return app_error(
                        400,
                        "api.file.upload_file.multipart.app_error",
                        "Unable to upload file(s). Have channel_id before files.",
                    );
                }
                let filename = field.file_name().unwrap_or("").to_owned();
                let content_type = field.content_type().map(str::to_owned);
                let bytes = match field.bytes().await {
                    Ok(b) => b.to_vec(),
                    Err(e) => return bad(&e.to_string()),
                };
                if bytes.len() > max {
                    return app_error(
                        413,
                        "api.file.upload_file.too_large_detailed.app_error",
                        "Unable to upload file. File is too large.",
                    );
                }
                got.push((filename, content_type, bytes));
            }
            _ => {
                // client_ids and anything else: read and ignored here.
                let _ = field.bytes().await;
            }
        }
    }
    let Some(channel_id) = channel_id.filter(|c| !c.is_empty()) else {
        return app_error(
            400,
            "api.context.invalid_body_param.app_error",
            "Invalid or missing channel_id in request body.",
        );
    };
    if got.is_empty() {
        return app_error(
            400,
            "api.file.upload_file.no_file.app_error",
            "No file under 'files' in request.",
        );
    }
    let mut st = shared.core.change();
    if !st.channels.contains_key(&channel_id) {
        return app_error(
            403,
            "api.context.permissions.app_error",
            "You do not have the appropriate permissions.",
        );
    }
    let mut infos = Vec::new();
    for (filename, content_type, bytes) in got {
        let mime = content_type
            .clone()
            .unwrap_or_else(|| "application/octet-stream".into());
        let id = store_file(&mut st, &channel_id, &filename, &mime, bytes.clone());
        if let Some(f) = st.files.get(&id) {
            infos.push(file_info(&id, f));
        }
        st.uploads.push(Upload {
            fields: fields.clone(),
            channel_id: channel_id.clone(),
            filename,
            content_type,
            bytes,
            file_id: id,
        });
    }
    json_response(201, &json!({ "file_infos": infos, "client_ids": [] }))
}
