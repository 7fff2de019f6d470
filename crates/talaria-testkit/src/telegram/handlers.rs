//! The fake Bot API's request handlers: routing, `getUpdates` long
//! polls, `sendMessage`, `editMessageText`, files (`getFile`, downloads,
//! multipart uploads) and the answer envelopes.

use super::*;
use crate::json_response;
use axum::body::Bytes;
use axum::extract::{FromRequest, Multipart, State};
use axum::http::{HeaderMap, HeaderValue, header};

/// An HTTP request as axum hands it over.
type HttpRequest = axum::extract::Request;
use axum::response::Response;
use serde_json::{Map, Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A file part of a multipart body.
pub(super) struct FilePart {
    field: String,
    file_name: Option<String>,
    content_type: Option<String>,
    bytes: Bytes,
}

pub(super) async fn handle(State(shared): State<Arc<Shared>>, request: HttpRequest) -> Response {
    let uri = request.uri().clone();
    let headers = request.headers().clone();
    let path = uri.path().trim_start_matches('/');
    if let Some(rest) = path.strip_prefix("file/") {
        return download(&shared, rest);
    }
    let Some((bot, method)) = path.split_once('/') else {
        return error(404, "Not Found", None);
    };
    let method = method.to_owned();
    let token = bot.strip_prefix("bot").unwrap_or("");
    let authorized = !token.is_empty() && token == shared.token;
    let read = read_params(uri.query(), &headers, request).await;
    let (params, files, unreadable) = match read {
        Ok((p, f)) => (p, f, None),
        Err(why) => (Map::new(), Vec::new(), Some(why)),
    };
    // Decided before the attempt is logged (and waiters woken): a test that
    // sees the attempt and then clears the hang must find it hung.
    let hung = shared.core.hanging();
    shared.core.record(Request {
        method: method.clone(),
        params: Value::Object(params.clone()),
        at: Instant::now(),
        authorized,
    });
    if !authorized {
        return error(401, "Unauthorized", None);
    }
    if let Some(why) = unreadable {
        return error(400, &format!("Bad Request: {why}"), None);
    }
    let lower = method.to_ascii_lowercase();
    if let Some(field) = upload_field(&lower) {
        if holding_uploads(&shared) {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(std::time::Duration::from_millis(20)) => {}
                    () = shared.core.stopped() => break,
                }
                if !holding_uploads(&shared) {
                    break;
                }
            }
            // Lost like a hung send: never delivered late.
            return error(502, "Bad Gateway: the request was lost", None);
        }
        return upload(&shared, &method, field, &params, files);
    }
    match lower.as_str() {
        "getfile" => get_file(&shared, &params),
        "getme" => ok(json!({
            "id": shared.bot_id, "is_bot": true, "first_name": "Talaria Test",
            "username": BOT_USERNAME, "can_join_groups": true,
            "can_read_all_group_messages": false, "supports_inline_queries": false,
        })),
        "deletewebhook" => ok(json!(true)),
        "getupdates" => get_updates(&shared, &params).await,
        "sendmessage" => send_message(&shared, &params, hung).await,
        "editmessagetext" => edit_message(&shared, &params),
        "sendchataction" => {
            let Some(chat_id) = int(&params, "chat_id") else {
                return error(400, "Bad Request: chat not found", None);
            };
            let action = string(&params, "action").unwrap_or_default();
            shared.core.change().actions.push(ChatAction {
                chat_id,
                action,
                thread_id: int(&params, "message_thread_id"),
                at: Instant::now(),
            });
            ok(json!(true))
        }
        _ => error(404, "Not Found", None),
    }
}

/// A waiting long poll, counted while it lives (a client that hangs up
/// drops the handler, and with it this).
struct ActivePoll<'a>(&'a Shared);

impl Drop for ActivePoll<'_> {
    fn drop(&mut self) {
        let mut st = self.0.core.change();
        st.active_polls = st.active_polls.saturating_sub(1);
    }
}

async fn get_updates(shared: &Shared, params: &Map<String, Value>) -> Response {
    let offset = int(params, "offset");
    let timeout = int(params, "timeout").map(|t| t.max(0) as u64);
    let limit = int(params, "limit").unwrap_or(100).clamp(1, 100) as usize;
    let allowed_updates = match params.get("allowed_updates") {
        Some(Value::Array(a)) => Some(
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
        ),
        Some(Value::String(s)) => serde_json::from_str(s).ok(),
        _ => None,
    };
    {
        let mut st = shared.core.change();
        st.get_updates.push(GetUpdatesCall {
            offset,
            timeout,
            allowed_updates,
            at: Instant::now(),
        });
        if st.fail_get_updates.fire() {
            return error(500, "Internal Server Error", None);
        }
        if st.active_polls > 0 {
            st.conflicts += 1;
        }
        // Telegram forgets an update once a later offset confirms it.
        match offset {
            Some(o) if o > 0 => st
                .updates
                .retain(|u| u.get("update_id").and_then(Value::as_i64) >= Some(o)),
            Some(o) if o < 0 => {
                let keep = o.unsigned_abs() as usize;
                while st.updates.len() > keep {
                    st.updates.pop_front();
                }
            }
            _ => {}
        }
    }
    let poll = {
        let mut st = shared.core.change();
        st.current_poll += 1;
        st.active_polls += 1;
        st.current_poll
    };
    let _active = ActivePoll(shared);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout.unwrap_or(0));
    let mut changes = shared.core.changes().subscribe();
    loop {
        changes.borrow_and_update();
        let (superseded, batch) = {
            let st = shared.core.read();
            let batch: Vec<Value> = st.updates.iter().take(limit).cloned().collect();
            (st.current_poll != poll, batch)
        };
        if superseded {
            return error(
                409,
                "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running",
                None,
            );
        }
        if !batch.is_empty() || tokio::time::Instant::now() >= deadline {
            return ok(Value::Array(batch));
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {}
            _ = changes.changed() => {}
            () = shared.core.stopped() => return error(500, "Internal Server Error: shutting down", None),
        }
    }
}

async fn send_message(shared: &Shared, params: &Map<String, Value>, hung: bool) -> Response {
    if hung {
        shared.core.held().await;
        // A hung request is lost, never delivered: its client may be long
        // gone (a crash test kills it), and a late delivery would look like
        // one the dead gateway made.
        return error(502, "Bad Gateway: the request was lost", None);
    }
    let parse_mode = string(params, "parse_mode").filter(|m| !m.is_empty());
    let text = string(params, "text").unwrap_or_default();
    let mut st = shared.core.change();
    if let Some(secs) = st.fail_429.take() {
        return error(
            429,
            &format!("Too Many Requests: retry after {secs}"),
            Some(json!({ "retry_after": secs })),
        );
    }
    if parse_mode.is_some() && st.reject_entities.fire() {
        return error(
            400,
            "Bad Request: can't parse entities: Unsupported start tag \"x\" at byte offset 0",
            None,
        );
    }
    let Some(chat_id) = int(params, "chat_id") else {
        return error(400, "Bad Request: chat not found", None);
    };
    if st.blocked.contains(&chat_id) {
        return error(403, "Forbidden: bot was blocked by the user", None);
    }
    if let Some(m) = &parse_mode {
        if !m.eq_ignore_ascii_case("html") {
            return error(
                400,
                "Bad Request: unsupported parse_mode in this fake",
                None,
            );
        }
        if let Err(why) = check_html(&text) {
            return error(
                400,
                &format!("Bad Request: can't parse entities: {why}"),
                None,
            );
        }
    }
    let rendered = match &parse_mode {
        Some(_) => render_html(&text),
        None => text.clone(),
    };
    if rendered.trim().is_empty() {
        return error(400, "Bad Request: message text is empty", None);
    }
    if rendered.encode_utf16().count() > 4096 {
        return error(400, "Bad Request: message is too long", None);
    }
    let reply_to = reply_to(params);
    let thread_id = int(params, "message_thread_id");
    let message_id = st.next_message_id;
    st.next_message_id += 1;
    st.messages.insert((chat_id, message_id), rendered.clone());
    st.sent.push(Sent {
        chat_id,
        text,
        parse_mode,
        thread_id,
        reply_to,
        message_id,
        at: Instant::now(),
    });
    let chat = st
        .chats
        .get(&chat_id)
        .cloned()
        .unwrap_or_else(|| json!({ "id": chat_id, "type": "private" }));
    let mut m = json!({
        "message_id": message_id, "date": unix_now(), "chat": chat, "text": rendered,
        "from": { "id": shared.bot_id, "is_bot": true, "first_name": "Talaria Test", "username": BOT_USERNAME },
    });
    if let Some(t) = thread_id {
        m["message_thread_id"] = json!(t);
    }
    if let Some(r) = reply_to
        && let Some(orig) = st.messages.get(&(chat_id, r))
    {
        m["reply_to_message"] =
            json!({ "message_id": r, "chat": m["chat"], "date": 0, "text": orig });
    }
    ok(m)
}

fn edit_message(shared: &Shared, params: &Map<String, Value>) -> Response {
    let (Some(chat_id), Some(message_id)) = (int(params, "chat_id"), int(params, "message_id"))
    else {
        return error(400, "Bad Request: message to edit not found", None);
    };
    let parse_mode = string(params, "parse_mode").filter(|m| !m.is_empty());
    let text = string(params, "text").unwrap_or_default();
    let mut st = shared.core.change();
    if parse_mode.is_some() && st.reject_entities.fire() {
        return error(
            400,
            "Bad Request: can't parse entities: Unsupported start tag \"x\" at byte offset 0",
            None,
        );
    }
    if parse_mode.is_some()
        && let Err(why) = check_html(&text)
    {
        return error(
            400,
            &format!("Bad Request: can't parse entities: {why}"),
            None,
        );
    }
    let rendered = match &parse_mode {
        Some(_) => render_html(&text),
        None => text.clone(),
    };
    let Some(current) = st.messages.get(&(chat_id, message_id)) else {
        return error(400, "Bad Request: message to edit not found", None);
    };
    if *current == rendered {
        return error(
            400,
            "Bad Request: message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message",
            None,
        );
    }
    st.messages.insert((chat_id, message_id), rendered.clone());
    st.edits.push(Edit {
        chat_id,
        message_id,
        text,
        parse_mode,
        at: Instant::now(),
    });
    ok(
        json!({ "message_id": message_id, "date": unix_now(), "chat": { "id": chat_id, "type": "private" }, "text": rendered }),
    )
}

fn ok(result: Value) -> Response {
    json_response(200, &json!({ "ok": true, "result": result }))
}

fn error(code: u16, description: &str, parameters: Option<Value>) -> Response {
    let mut body = json!({ "ok": false, "error_code": code, "description": description });
    if let Some(p) = parameters {
        body["parameters"] = p;
    }
    let mut r = json_response(code, &body);
    if code == 429
        && let Some(secs) = body.pointer("/parameters/retry_after")
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

/// The parameters of a call: the query string overlaid by the body's, a
/// multipart body's file parts apart.
async fn read_params(
    query: Option<&str>,
    headers: &HeaderMap,
    request: HttpRequest,
) -> Result<(Map<String, Value>, Vec<FilePart>), String> {
    let multipart = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("multipart/form-data"));
    if !multipart {
        let body = Bytes::from_request(request, &())
            .await
            .map_err(|e| e.body_text())?;
        return Ok((params(query, headers, &body), Vec::new()));
    }
    let mut out = params(query, headers, &Bytes::new());
    let mut files = Vec::new();
    let mut form = Multipart::from_request(request, &())
        .await
        .map_err(|e| e.body_text())?;
    while let Some(field) = form.next_field().await.map_err(|e| e.body_text())? {
        let name = field.name().unwrap_or("").to_owned();
        let file_name = field.file_name().map(str::to_owned);
        let content_type = field.content_type().map(str::to_owned);
        let bytes = field.bytes().await.map_err(|e| e.body_text())?;
        if file_name.is_some() {
            files.push(FilePart {
                field: name,
                file_name,
                content_type,
                bytes,
            });
        } else {
            out.insert(
                name,
                Value::String(String::from_utf8_lossy(&bytes).into_owned()),
            );
        }
    }
    Ok((out, files))
}

/// The form field holding the file for an upload method (lowercased).
/// Whether an upload now is held (see `FakeTelegram::hold_uploads_after`).
fn holding_uploads(shared: &Shared) -> bool {
    let st = shared.core.read();
    st.hold_uploads_after.is_some_and(|n| st.uploads.len() >= n)
}

fn upload_field(method: &str) -> Option<&'static str> {
    Some(match method {
        "sendphoto" => "photo",
        "sendvoice" => "voice",
        "sendaudio" => "audio",
        "sendvideo" => "video",
        "senddocument" => "document",
        _ => return None,
    })
}

/// `getFile`: the file's path for the download, or why not.
fn get_file(shared: &Shared, params: &Map<String, Value>) -> Response {
    let Some(file_id) = string(params, "file_id").filter(|f| !f.is_empty()) else {
        return error(400, "Bad Request: file_id is empty", None);
    };
    let st = shared.core.read();
    let Some(file) = st.files.get(&file_id) else {
        return error(400, "Bad Request: invalid file_id", None);
    };
    if file.bytes.len() > MAX_DOWNLOAD_BYTES {
        return error(400, "Bad Request: file is too big", None);
    }
    ok(json!({
        "file_id": file_id, "file_unique_id": file.unique_id,
        "file_size": file.bytes.len(), "file_path": file.path,
    }))
}

/// `GET /file/bot{token}/{file_path}`: the bytes, as Telegram's file
/// server sends them (an opaque type; the path's extension is the hint).
fn download(shared: &Shared, rest: &str) -> Response {
    let Some((bot, path)) = rest.split_once('/') else {
        return error(404, "Not Found", None);
    };
    let token = bot.strip_prefix("bot").unwrap_or("");
    let mut st = shared.core.change();
    st.downloads.push(path.to_owned());
    if token.is_empty() || token != shared.token {
        return error(401, "Unauthorized", None);
    }
    let Some(file) = st.files.values().find(|f| f.path == path && !f.expired) else {
        return error(404, "Not Found", None);
    };
    let mut r = Response::new(axum::body::Body::from(file.bytes.clone()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    r
}

/// An upload: the checks Telegram makes that matter here, then the sent
/// message with the file as the bot's new file.
fn upload(
    shared: &Shared,
    method: &str,
    field: &str,
    params: &Map<String, Value>,
    files: Vec<FilePart>,
) -> Response {
    let mut st = shared.core.change();
    if let Some(secs) = st.fail_429.take() {
        return error(
            429,
            &format!("Too Many Requests: retry after {secs}"),
            Some(json!({ "retry_after": secs })),
        );
    }
    let Some(chat_id) = int(params, "chat_id") else {
        return error(400, "Bad Request: chat not found", None);
    };
    if st.blocked.contains(&chat_id) {
        return error(403, "Forbidden: bot was blocked by the user", None);
    }
    let Some(part) = files.into_iter().find(|f| f.field == field) else {
        return error(
            400,
            &format!("Bad Request: there is no {field} in the request"),
            None,
        );
    };
    if part.bytes.is_empty() {
        return error(400, "Bad Request: file must be non-empty", None);
    }
    if part.bytes.len() > MAX_UPLOAD_BYTES {
        return error(413, "Request Entity Too Large", None);
    }
    if field == "photo" && part.bytes.len() > MAX_PHOTO_BYTES {
        return error(400, "Bad Request: PHOTO_INVALID_DIMENSIONS", None);
    }
    let parse_mode = string(params, "parse_mode").filter(|m| !m.is_empty());
    let caption = string(params, "caption");
    if let Some(c) = &caption {
        if let Some(m) = &parse_mode {
            if !m.eq_ignore_ascii_case("html") {
                return error(
                    400,
                    "Bad Request: unsupported parse_mode in this fake",
                    None,
                );
            }
            if st.reject_entities.fire() {
                return error(
                    400,
                    "Bad Request: can't parse entities: Unsupported start tag \"x\" at byte offset 0",
                    None,
                );
            }
            if let Err(why) = check_html(c) {
                return error(
                    400,
                    &format!("Bad Request: can't parse entities: {why}"),
                    None,
                );
            }
        }
        if rendered(c, parse_mode.as_deref()).encode_utf16().count() > 1024 {
            return error(400, "Bad Request: message caption is too long", None);
        }
    }
    let reply_to = reply_to(params);
    let thread_id = int(params, "message_thread_id");
    let file_id = store_file(
        &mut st,
        part.bytes.clone(),
        part.file_name.as_deref(),
        part.content_type.as_deref(),
    );
    let message_id = st.next_message_id;
    st.next_message_id += 1;
    let shown = caption
        .as_deref()
        .map(|c| rendered(c, parse_mode.as_deref()))
        .unwrap_or_default();
    st.messages.insert((chat_id, message_id), shown.clone());
    let fields = params
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.as_str().map_or_else(|| v.to_string(), str::to_owned),
            )
        })
        .collect();
    st.uploads.push(Upload {
        method: method.to_owned(),
        chat_id,
        field: field.to_owned(),
        fields,
        file_name: part.file_name.clone(),
        content_type: part.content_type.clone(),
        bytes: part.bytes.to_vec(),
        caption,
        parse_mode,
        thread_id,
        reply_to,
        message_id,
        file_id: file_id.clone(),
        at: Instant::now(),
    });
    let chat = st
        .chats
        .get(&chat_id)
        .cloned()
        .unwrap_or_else(|| json!({ "id": chat_id, "type": "private" }));
    let object = json!({
        "file_id": file_id, "file_size": part.bytes.len(),
        "file_name": part.file_name, "mime_type": part.content_type,
    });
    let mut m = json!({
        "message_id": message_id, "date": unix_now(), "chat": chat,
        "from": { "id": shared.bot_id, "is_bot": true, "first_name": "Talaria Test", "username": BOT_USERNAME },
    });
    m[field] = if field == "photo" {
        json!([object])
    } else {
        object
    };
    if !shown.is_empty() {
        m["caption"] = json!(shown);
    }
    if let Some(t) = thread_id {
        m["message_thread_id"] = json!(t);
    }
    ok(m)
}

/// `reply_to_message_id`, or `reply_parameters.message_id` (a JSON
/// object, or its text in a form).
fn reply_to(params: &Map<String, Value>) -> Option<i64> {
    int(params, "reply_to_message_id").or_else(|| {
        let rp = match params.get("reply_parameters") {
            Some(Value::String(s)) => serde_json::from_str(s).ok(),
            Some(v) => Some(v.clone()),
            None => None,
        };
        rp.and_then(|v| v.get("message_id").and_then(as_int))
    })
}
