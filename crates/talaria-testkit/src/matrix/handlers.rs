//! The fake homeserver's request handlers: routing, authentication, the
//! failure switches, joins, sends, `/sync` bodies and the media
//! repository.

use super::*;
use crate::json_response;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::Response;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn error(status: u16, errcode: &str, message: &str) -> Response {
    json_response(status, &json!({ "errcode": errcode, "error": message }))
}

pub(super) async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let full = uri.path();
    let (area, rest) = if let Some(r) = full.strip_prefix("/_matrix/client/v3/") {
        (Area::Client, r)
    } else if let Some(r) = full.strip_prefix("/_matrix/client/v1/media/") {
        (Area::Media, r)
    } else if let Some(r) = full.strip_prefix("/_matrix/media/v3/") {
        (Area::LegacyMedia, r)
    } else {
        return error(404, "M_UNRECOGNIZED", "Unrecognized request");
    };
    let segments: Vec<String> = rest.split('/').map(percent_decode).collect();
    let path = match area {
        Area::Client => segments.join("/"),
        Area::Media => format!("_matrix/client/v1/media/{}", segments.join("/")),
        Area::LegacyMedia => format!("_matrix/media/v3/{}", segments.join("/")),
    };
    let query = query_pairs(uri.query());
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned)
        .or_else(|| query.get("access_token").cloned());
    let json_body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let hung = shared.core.hanging();
    shared.core.record(Request {
        method: method.to_string(),
        path: path.clone(),
        body: json_body.clone(),
        at: Instant::now(),
        authorized: given.as_deref() == Some(shared.token.as_str()),
    });
    let revoked = shared.core.read().revoked;
    let parts: Vec<&str> = segments.iter().map(String::as_str).collect();
    if area == Area::LegacyMedia && method == Method::GET && parts.first() == Some(&"download") {
        // The old download endpoint never needed a token.
        return media_download(&shared, area, &parts[1..]);
    }
    match given {
        None => return error(401, "M_MISSING_TOKEN", "Missing access token"),
        Some(t) if t != shared.token || revoked => {
            return error(401, "M_UNKNOWN_TOKEN", "Unrecognised access token");
        }
        Some(_) => {}
    }
    match area {
        Area::Client => {}
        Area::Media | Area::LegacyMedia => {
            return media(&shared, area, &method, &parts, &headers, &query, &body);
        }
    }
    match (&method, parts.as_slice()) {
        (&Method::GET, ["account", "whoami"]) => json_response(
            200,
            &json!({ "user_id": BOT_USER_ID, "device_id": "FAKEDEVICE" }),
        ),
        (&Method::GET, ["profile", user, "displayname"]) => {
            if *user == BOT_USER_ID {
                json_response(200, &json!({ "displayname": BOT_DISPLAY_NAME }))
            } else {
                error(404, "M_NOT_FOUND", "Profile was not found")
            }
        }
        (&Method::GET, ["sync"]) => sync(&shared, &query).await,
        (&Method::GET, ["rooms", room, "joined_members"]) => {
            let mut st = shared.core.change();
            if st.fail_joined_members.fire() {
                let mut r = Response::new(Body::from("<html><body>502 Bad Gateway</body></html>"));
                *r.status_mut() = StatusCode::BAD_GATEWAY;
                return r;
            }
            match st.rooms.get(*room) {
                Some(r) if r.bot_joined => {
                    let joined: Map<String, Value> = r
                        .members
                        .iter()
                        .map(|m| {
                            (
                                m.clone(),
                                json!({ "display_name": null, "avatar_url": null }),
                            )
                        })
                        .collect();
                    json_response(200, &json!({ "joined": joined }))
                }
                _ => error(
                    403,
                    "M_FORBIDDEN",
                    "User not in room and not an admin of the room",
                ),
            }
        }
        (&Method::GET, ["user", user, "account_data", kind]) => {
            if *user != BOT_USER_ID {
                return error(
                    403,
                    "M_FORBIDDEN",
                    "Cannot get account data for other users.",
                );
            }
            match (&shared.core.read().direct, *kind) {
                (Some(d), "m.direct") => json_response(200, d),
                _ => error(404, "M_NOT_FOUND", "Account data not found"),
            }
        }
        (&Method::POST, ["join", room]) | (&Method::POST, ["rooms", room, "join"]) => {
            join(&shared, room)
        }
        (&Method::PUT, ["rooms", room, "send", kind, txn]) => {
            send(&shared, room, kind, txn, &body, json_body, hung).await
        }
        (&Method::PUT, ["rooms", room, "typing", user]) => {
            if *user != BOT_USER_ID {
                return error(403, "M_FORBIDDEN", "Cannot set another user's typing state");
            }
            shared.core.change().typing.push(Typing {
                room_id: (*room).to_owned(),
                user_id: (*user).to_owned(),
                typing: json_body.get("typing").and_then(Value::as_bool) == Some(true),
                timeout_ms: json_body.get("timeout").and_then(Value::as_u64),
                at: Instant::now(),
            });
            json_response(200, &json!({}))
        }
        _ => error(404, "M_UNRECOGNIZED", "Unrecognized request"),
    }
}

/// Which API a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Area {
    /// `/_matrix/client/v3/`.
    Client,
    /// `/_matrix/client/v1/media/` (authenticated media, Matrix 1.11).
    Media,
    /// `/_matrix/media/v3/` (uploads; downloads before Matrix 1.11).
    LegacyMedia,
}

/// An authenticated request to the media repository.
fn media(
    shared: &Shared,
    area: Area,
    method: &Method,
    parts: &[&str],
    headers: &HeaderMap,
    query: &HashMap<String, String>,
    body: &Bytes,
) -> Response {
    let legacy_only = shared.core.read().legacy_media_only;
    match (area, method, parts) {
        (Area::Media, _, _) if legacy_only => error(404, "M_UNRECOGNIZED", "Unrecognized request"),
        (Area::Media, &Method::GET, ["download", rest @ ..]) => media_download(shared, area, rest),
        (Area::Media, &Method::GET, ["config"]) | (Area::LegacyMedia, &Method::GET, ["config"]) => {
            let max = shared.core.read().max_upload;
            json_response(200, &json!({ "m.upload.size": max }))
        }
        (Area::LegacyMedia, &Method::POST, ["upload"]) => {
            let mut st = shared.core.change();
            if let Some(ms) = st.fail_upload_429.take() {
                return json_response(
                    429,
                    &json!({ "errcode": "M_LIMIT_EXCEEDED", "error": "Too many requests", "retry_after_ms": ms }),
                );
            }
            if body.len() > st.max_upload {
                return error(
                    413,
                    "M_TOO_LARGE",
                    "Cannot upload files larger than the limit",
                );
            }
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let filename = query.get("filename").cloned();
            // As Synapse: a missing type is stored as a plain byte stream.
            let stored_type = content_type
                .clone()
                .unwrap_or_else(|| "application/octet-stream".to_owned());
            let uri = store_file(&mut st, body.to_vec(), &stored_type, filename.as_deref());
            st.uploads.push(Upload {
                filename,
                content_type,
                bytes: body.to_vec(),
                content_uri: uri.clone(),
            });
            json_response(200, &json!({ "content_uri": uri }))
        }
        _ => error(404, "M_UNRECOGNIZED", "Unrecognized request"),
    }
}

/// `download/{server}/{id}[/{name}]`, the part after `download/`.
fn media_download(shared: &Shared, area: Area, rest: &[&str]) -> Response {
    let st = shared.core.read();
    if area == Area::LegacyMedia && !st.legacy_media_only {
        // Synapse with authenticated media: new media is not served here.
        return error(404, "M_NOT_FOUND", "Not found");
    }
    let (server, id) = match rest {
        [server, id] | [server, id, _] => (*server, *id),
        _ => return error(404, "M_UNRECOGNIZED", "Unrecognized request"),
    };
    let Some(file) = st.media.get(id).filter(|_| server == SERVER_NAME) else {
        return error(404, "M_NOT_FOUND", "Not found");
    };
    let mut r = Response::new(Body::from(file.bytes.clone()));
    if let Ok(v) = HeaderValue::from_str(&file.content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    let disposition = match &file.filename {
        Some(name) => format!(
            "attachment; filename=\"{}\"",
            name.replace(['"', '\\'], "_")
        ),
        None => "attachment".to_owned(),
    };
    if let Ok(v) = HeaderValue::from_str(&disposition) {
        r.headers_mut().insert(header::CONTENT_DISPOSITION, v);
    }
    r
}

fn join(shared: &Shared, room_id: &str) -> Response {
    let mut st = shared.core.change();
    let Some(room) = st.rooms.get_mut(room_id) else {
        return error(404, "M_NOT_FOUND", "No known servers");
    };
    let mut fresh = false;
    if !room.bot_joined {
        if room.invite.take().is_none() {
            return error(403, "M_FORBIDDEN", "You are not invited to this room.");
        }
        room.bot_joined = true;
        room.members.push(BOT_USER_ID.to_owned());
        fresh = true;
    }
    st.joins.push(room_id.to_owned());
    if fresh {
        // The homeserver's join event, seen by the bot's next sync.
        let position = st.log.len();
        if let Some(room) = st.rooms.get_mut(room_id) {
            room.joined_at = Some(position);
        }
        let mut event = member_event(room_id, BOT_USER_ID, "join");
        event["unsigned"] = json!({ "prev_content": { "membership": "invite" } });
        st.log.push(Entry::Timeline {
            room_id: room_id.to_owned(),
            event,
        });
    }
    json_response(200, &json!({ "room_id": room_id }))
}

async fn send(
    shared: &Shared,
    room_id: &str,
    kind: &str,
    txn: &str,
    raw: &Bytes,
    content: Value,
    hung: bool,
) -> Response {
    if hung {
        shared.core.held().await;
        // Lost on the way, never delivered: a crash test kills the client
        // meanwhile, and a late delivery would look like the dead one's.
        return error(502, "", "Bad Gateway: the request was lost");
    }
    let mut st = shared.core.change();
    if let Some(ms) = st.fail_429.take() {
        let mut r = json_response(
            429,
            &json!({ "errcode": "M_LIMIT_EXCEEDED", "error": "Too many requests", "retry_after_ms": ms }),
        );
        if let Ok(v) = HeaderValue::from_str(&ms.div_ceil(1000).to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return r;
    }
    if let Some(event_id) = st.txns.get(txn) {
        // The spec: a repeated transaction id answers the first event.
        return json_response(200, &json!({ "event_id": event_id }));
    }
    if !content.is_object() {
        return error(400, "M_NOT_JSON", "Content not JSON.");
    }
    if raw.len() > MAX_EVENT_BYTES {
        return error(413, "M_TOO_LARGE", "event too large");
    }
    match st.rooms.get(room_id) {
        Some(room) if room.bot_joined => {}
        _ => {
            return error(
                403,
                "M_FORBIDDEN",
                "User is not in the room or the room does not exist",
            );
        }
    }
    let event_id = format!("$ev{}", st.next_event);
    st.next_event += 1;
    st.txns.insert(txn.to_owned(), event_id.clone());
    st.sent.push(Sent {
        room_id: room_id.to_owned(),
        txn_id: txn.to_owned(),
        content: content.clone(),
        event_id: event_id.clone(),
        at: Instant::now(),
    });
    // The homeserver echoes the bot's own events in its sync stream.
    st.log.push(Entry::Timeline {
        room_id: room_id.to_owned(),
        event: json!({
            "type": kind, "sender": BOT_USER_ID, "event_id": event_id,
            "origin_server_ts": now_ms(), "content": content,
            "unsigned": { "transaction_id": txn },
        }),
    });
    if st.drop_send_answers.fire() {
        broken_body()
    } else {
        json_response(200, &json!({ "event_id": event_id }))
    }
}

/// A 200 whose body breaks off: the client sees the connection drop.
fn broken_body() -> Response {
    let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
        Ok(Bytes::from_static(b"{\"event_id\":\"$")),
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "dropped by the fake",
        )),
    ];
    let mut r = Response::new(Body::from_stream(futures::stream::iter(chunks)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

async fn sync(shared: &Shared, query: &HashMap<String, String>) -> Response {
    let since = query.get("since").cloned();
    let timeout_ms = query.get("timeout").and_then(|t| t.parse::<u64>().ok());
    let start = match since.as_deref() {
        None => 0,
        Some(s) => match s.strip_prefix('s').and_then(|n| n.parse::<usize>().ok()) {
            Some(n) => n,
            None => return error(400, "M_INVALID_PARAM", "Invalid since token"),
        },
    };
    {
        let mut st = shared.core.change();
        st.syncs.push(SyncCall {
            since: since.clone(),
            timeout_ms,
            filter: query.get("filter").cloned(),
            at: Instant::now(),
        });
        if st.fail_syncs.fire() {
            drop(st);
            let mut r = Response::new(Body::from("<html><body>502 Bad Gateway</body></html>"));
            *r.status_mut() = StatusCode::BAD_GATEWAY;
            return r;
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms.unwrap_or(0));
    let mut changes = shared.core.changes().subscribe();
    loop {
        changes.borrow_and_update();
        let ready = {
            let st = shared.core.read();
            since.is_none() || st.log.len() > start
        };
        if ready || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {}
            _ = changes.changed() => {}
            () = shared.core.stopped() => return error(502, "", "shutting down"),
        }
    }
    let answer = {
        let mut st = shared.core.change();
        let has_news = st.log.len() > start;
        if has_news && st.drop_syncs.fire() {
            None
        } else {
            Some(sync_body(&st, start, since.is_none()))
        }
    };
    match answer {
        Some(v) => json_response(200, &v),
        // Headers and part of a body, then the connection breaks.
        None => broken_body(),
    }
}

fn sync_body(st: &Book, start: usize, initial: bool) -> Value {
    let start = start.min(st.log.len());
    let mut join: Map<String, Value> = Map::new();
    let mut invite: Map<String, Value> = Map::new();
    let mut timelines: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
    if initial {
        for (id, room) in &st.rooms {
            if room.bot_joined {
                timelines.entry(id.as_str()).or_default();
            }
        }
    }
    // A room the bot joined on invite since `start` comes with its recent
    // history, from before `start` too, as Synapse hands a fresh join.
    let fresh_join = |room: &Room| {
        !initial && room.invited_at.is_some() && room.joined_at.is_some_and(|j| j >= start)
    };
    let first = if st.rooms.values().any(|r| r.bot_joined && fresh_join(r)) {
        0
    } else {
        start
    };
    for (position, entry) in st.log.iter().enumerate().skip(first) {
        match entry {
            Entry::Timeline { room_id, event } => {
                if let Some(room) = st
                    .rooms
                    .get(room_id)
                    .filter(|r| r.bot_joined && (position >= start || fresh_join(r)))
                {
                    // Synapse's `unsigned.membership`: the reader's
                    // membership when the event was written.
                    let membership = if room.joined_at.is_some_and(|j| position >= j) {
                        "join"
                    } else if room.invited_at.is_some_and(|i| position >= i) {
                        "invite"
                    } else {
                        "leave"
                    };
                    let mut event = event.clone();
                    // A test's malformed event is passed on as it is.
                    if let Some(obj) = event.as_object_mut() {
                        let unsigned = obj.entry("unsigned").or_insert_with(|| json!({}));
                        if let Some(unsigned) = unsigned.as_object_mut() {
                            unsigned.insert("membership".into(), json!(membership));
                        }
                    }
                    timelines.entry(room_id.as_str()).or_default().push(event);
                }
            }
            Entry::Invite { room_id } if position >= start => {
                if let Some(room) = st.rooms.get(room_id)
                    && let Some((inviter, is_direct)) = &room.invite
                {
                    let mut own = member_event(room_id, BOT_USER_ID, "invite");
                    own["sender"] = json!(inviter);
                    own["content"]["is_direct"] = json!(is_direct);
                    invite.insert(
                        room_id.clone(),
                        json!({ "invite_state": { "events": [
                            { "type": "m.room.create", "state_key": "", "sender": inviter, "content": {} },
                            own,
                        ] } }),
                    );
                }
            }
            Entry::Invite { .. } => {}
        }
    }
    for (room_id, events) in timelines {
        let Some(room) = st.rooms.get(room_id) else {
            continue;
        };
        // Synapse sends a room's state with the first sync and when the
        // bot newly joined it (or it appeared: `create_room` after the
        // start); an ordinary incremental sync has only the timeline.
        let fresh = room.joined_at.is_some_and(|j| j >= start) && !initial;
        let mut state: Vec<Value> = Vec::new();
        if initial || fresh {
            state.extend(
                room.members
                    .iter()
                    .map(|m| member_event(room_id, m, "join")),
            );
            if let Some(n) = &room.name {
                state.push(json!({
                    "type": "m.room.name", "state_key": "", "sender": BOT_USER_ID,
                    "event_id": format!("$name-{room_id}"), "origin_server_ts": 0,
                    "content": { "name": n },
                }));
            }
        }
        // A fresh join's timeline is always marked limited by Synapse.
        let joined_in_range = room.invited_at.is_some() && fresh;
        join.insert(
            room_id.to_owned(),
            json!({
                // Without lazy-loaded members Synapse sends an empty one.
                "summary": {},
                "state": { "events": state },
                "timeline": { "events": events, "limited": joined_in_range, "prev_batch": token_at(start) },
                "ephemeral": { "events": [] },
                "account_data": { "events": [] },
            }),
        );
    }
    let mut body = json!({
        "next_batch": token_at(st.log.len()),
        "rooms": { "join": join, "invite": invite, "leave": {} },
    });
    if let Some(d) = &st.direct {
        body["account_data"] = json!({ "events": [ { "type": "m.direct", "content": d } ] });
    }
    body
}

fn query_pairs(q: Option<&str>) -> HashMap<String, String> {
    form_urlencoded::parse(q.unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

/// A path segment with its `%XX` escapes decoded (`+` stays a `+` in a
/// path).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
