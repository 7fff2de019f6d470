//! One QQ gateway session: Hello, Identify or Resume, heartbeats, and
//! dispatches until the connection ends.
//!
//! As on Discord (whose protocol QQ's follows), a sequence number counts
//! as handled only once its dispatch was handed to the inbox (or needed
//! nothing), so a resume after a drop asks QQ to replay exactly what was
//! not handed over. QQ may replay a message after a resume, and a guild
//! @-message arrives both as `GUILD_MESSAGE_CREATE` and as
//! `AT_MESSAGE_CREATE` to a bot subscribed to both: the message id is
//! remembered once handed over, and a second delivery is skipped.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use talaria_adapter::InboxClosed;
use talaria_adapter::{AdapterContext, AdapterError, Liveness, MessageEvent};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::{QqbotAdapter, Session, mapping};
use crate::ws::{self, WsStream};

/// `GROUP_AND_C2C_EVENT`: C2C messages and group @-messages.
pub(crate) const GROUP_AND_C2C: u64 = 1 << 25;
/// `PUBLIC_GUILD_MESSAGES`: guild messages that @-mention the bot.
pub(crate) const PUBLIC_GUILD_MESSAGES: u64 = 1 << 30;
/// `DIRECT_MESSAGE`: guild direct messages.
pub(crate) const DIRECT_MESSAGE: u64 = 1 << 12;
/// `GUILD_MESSAGES`: every guild message (private-domain bots only).
pub(crate) const GUILD_MESSAGES: u64 = 1 << 9;

/// How a session ended when `run` should go on by itself.
pub(crate) enum End {
    /// The gateway is shutting down.
    Shutdown,
    /// QQ asked for a new connection (op 7, op 9): connect again now.
    /// `was_live` says whether this session got as far as READY/RESUMED.
    Again { was_live: bool, why: String },
}

type Submit = Pin<Box<dyn Future<Output = Result<(), InboxClosed>> + Send>>;

/// Close codes after which reconnecting cannot help until the operator
/// acts [doc]/[anc].
fn fatal_close(code: u16) -> Option<&'static str> {
    match code {
        4001 => Some("QQ closed the gateway: invalid opcode (4001)"),
        4002 => Some("QQ closed the gateway: invalid payload (4002)"),
        4010 => Some("QQ refused the shard (close 4010)"),
        4011 => Some("QQ requires sharding for this bot (close 4011)"),
        4012 => Some("QQ refused the gateway version (close 4012)"),
        4013 => Some("QQ refused the intents (close 4013)"),
        4014 => Some(
            "QQ refused an intent the bot is not permitted (close 4014): enable the C2C/group \
             scenes, or turn off platforms.qqbot.all_guild_messages for a public bot",
        ),
        4914 => Some(
            "QQ says the bot is offline or sandbox-only (close 4914): publish it, or add the \
             testers and groups to its sandbox on q.qq.com",
        ),
        4915 => Some("QQ has banned the bot (close 4915); see q.qq.com"),
        _ => None,
    }
}

fn close_frame(code: u16) -> Message {
    Message::Close(Some(CloseFrame {
        code: CloseCode::from(code),
        reason: "".into(),
    }))
}

/// Sends without waiting long: a peer that stopped reading must not stall
/// the loop that notices it.
async fn send(ws: &mut WsStream, payload: Message) -> Result<(), AdapterError> {
    match tokio::time::timeout(Duration::from_secs(10), ws.send(payload)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(AdapterError::Disconnected(format!(
            "QQ gateway write failed: {e}"
        ))),
        Err(_) => Err(AdapterError::Disconnected(
            "QQ gateway write timed out".into(),
        )),
    }
}

/// Closes with a code that keeps the session resumable. Best effort.
async fn close_resumable(ws: &mut WsStream) {
    let _ = tokio::time::timeout(Duration::from_secs(2), ws.send(close_frame(4000))).await;
}

fn check_ws_url(url: &str) -> Result<String, AdapterError> {
    match reqwest::Url::parse(url.trim()) {
        Ok(u) if matches!(u.scheme(), "ws" | "wss") => Ok(u.into()),
        _ => Err(AdapterError::Fatal(format!(
            "the QQ gateway URL {url:?} is not a ws:// or wss:// URL"
        ))),
    }
}

impl QqbotAdapter {
    /// The configured gateway URL, or the one `GET /gateway` names.
    async fn gateway_url(&self) -> Result<String, AdapterError> {
        if let Some(u) = &self.gateway_url {
            return check_ws_url(u);
        }
        let answer = self
            .api
            .request(
                reqwest::Method::GET,
                "/gateway",
                None,
                self.timings.connect_timeout,
            )
            .await
            .map_err(|e| match e.status() {
                Some(400..=403) => AdapterError::Fatal(format!(
                    "QQ refused the bot's credentials ({e}); check QQ_APP_ID and QQ_CLIENT_SECRET \
                     and the IP allowlist on q.qq.com"
                )),
                _ => AdapterError::Disconnected(format!("cannot ask QQ for the gateway URL: {e}")),
            })?;
        match answer.get("url").and_then(Value::as_str) {
            Some(u) if !u.is_empty() => check_ws_url(u),
            _ => Err(AdapterError::Disconnected(
                "GET /gateway answered without a url".into(),
            )),
        }
    }

    /// Runs one connection from Hello to its end.
    pub(crate) async fn session(&self, ctx: &AdapterContext) -> Result<End, AdapterError> {
        let resuming = self.state().session.clone();
        let url = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(End::Shutdown),
            u = self.gateway_url() => u?,
        };
        let token = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(End::Shutdown),
            t = self.api.token(self.timings.connect_timeout) => t.map_err(|e| match e.status() {
                Some(400..=403) => AdapterError::Fatal(format!(
                    "QQ refused the AppID/AppSecret ({e}); check QQ_APP_ID and QQ_CLIENT_SECRET"
                )),
                _ => AdapterError::Disconnected(format!("cannot get a QQ access token: {e}")),
            })?,
        };
        let connected = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(End::Shutdown),
            c = ws::connect(&url, &[], self.timings.connect_timeout) => c,
        };
        let mut socket = connected.map_err(AdapterError::Disconnected)?;
        let interval = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(End::Shutdown),
            h = self.hello(&mut socket) => h?,
        };

        let auth = format!("QQBot {}", token.expose());
        let hello = match &resuming {
            Some(s) => json!({"op": 6, "d": {"token": auth, "session_id": s.id, "seq": s.seq}}),
            None => json!({"op": 2, "d": {
                "token": auth,
                "intents": self.intents,
                "shard": [0, 1],
                "properties": {"$os": std::env::consts::OS, "$browser": "talaria", "$device": "talaria"},
            }}),
        };
        send(&mut socket, Message::text(hello.to_string())).await?;
        tracing::debug!(resume = resuming.is_some(), "QQ gateway connected");

        // QQ closes a session whose heartbeats come late; beat a little
        // early, as the ancestor does.
        let beat = interval.mul_f64(0.8);
        let mut next_beat = Instant::now() + beat;
        let mut awaiting_ack = false;
        let mut was_live = false;
        let mut pending: VecDeque<(Option<u64>, Option<MessageEvent>)> = VecDeque::new();
        let mut submitting: Option<(Option<u64>, Option<String>, Submit)> = None;

        loop {
            while submitting.is_none() {
                let Some((seq, event)) = pending.pop_front() else {
                    break;
                };
                match event {
                    Some(ev) if !self.seen(ev.message_id.as_deref()) => {
                        let id = ev.message_id.clone();
                        let inbox = ctx.inbox.clone();
                        submitting =
                            Some((seq, id, Box::pin(async move { inbox.submit(ev).await })));
                    }
                    Some(ev) => {
                        tracing::debug!(id = ?ev.message_id, "skipping a QQ message seen before");
                        self.handled(seq, None);
                    }
                    None => self.handled(seq, None),
                }
            }
            tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => {
                    close_resumable(&mut socket).await;
                    return Ok(End::Shutdown);
                }
                r = async {
                    match submitting.as_mut() {
                        Some((_, _, f)) => f.await,
                        None => std::future::pending().await,
                    }
                } => {
                    let (seq, id) = submitting.take().map(|(s, id, _)| (s, id)).unwrap_or((None, None));
                    if r.is_err() {
                        close_resumable(&mut socket).await;
                        return Ok(End::Shutdown);
                    }
                    self.handled(seq, id);
                }
                _ = tokio::time::sleep_until(next_beat) => {
                    if awaiting_ack {
                        ctx.liveness.set(Liveness::Degraded);
                        close_resumable(&mut socket).await;
                        return Err(AdapterError::Disconnected(
                            "the QQ gateway stopped acknowledging heartbeats".into(),
                        ));
                    }
                    self.heartbeat(&mut socket).await?;
                    awaiting_ack = true;
                    next_beat = Instant::now() + beat;
                }
                frame = socket.next() => {
                    let text = match frame {
                        Some(Ok(Message::Text(t))) => t,
                        Some(Ok(Message::Close(frame))) => {
                            return Err(self.closed(frame.map(|f| u16::from(f.code)), ctx).await);
                        }
                        Some(Ok(_)) => continue,
                        Some(Err(e)) => {
                            return Err(AdapterError::Disconnected(format!(
                                "the QQ gateway connection failed: {e}"
                            )));
                        }
                        None => {
                            return Err(AdapterError::Disconnected(
                                "the QQ gateway closed the connection".into(),
                            ));
                        }
                    };
                    let payload: Value = match serde_json::from_str(text.as_str()) {
                        Ok(v) => v,
                        Err(e) => {
                            tracing::warn!("skipping an unreadable QQ gateway frame: {e}");
                            continue;
                        }
                    };
                    match payload.get("op").and_then(Value::as_u64) {
                        Some(0) => {
                            let seq = payload.get("s").and_then(Value::as_u64);
                            let kind = payload.get("t").and_then(Value::as_str).unwrap_or("");
                            let d = payload.get("d").unwrap_or(&Value::Null);
                            if self.dispatch(kind, d, seq, ctx) {
                                was_live = true;
                            }
                            let event = mapping::is_message(kind)
                                .then(|| self.map(kind, d))
                                .flatten();
                            pending.push_back((seq, event));
                        }
                        Some(1) => self.heartbeat(&mut socket).await?,
                        Some(7) => {
                            close_resumable(&mut socket).await;
                            return Ok(End::Again {
                                was_live,
                                why: "QQ asked for a reconnect".into(),
                            });
                        }
                        Some(9) => {
                            let resumable = payload.get("d").and_then(Value::as_bool) == Some(true);
                            close_resumable(&mut socket).await;
                            if !resumable {
                                self.state().session = None;
                                tokio::select! {
                                    biased;
                                    _ = ctx.shutdown.cancelled() => return Ok(End::Shutdown),
                                    _ = tokio::time::sleep(self.timings.reidentify_delay) => {}
                                }
                            }
                            return Ok(End::Again {
                                was_live,
                                why: format!("QQ invalidated the session (resumable: {resumable})"),
                            });
                        }
                        Some(11) => awaiting_ack = false,
                        Some(10) => {}
                        other => tracing::debug!(?other, "ignoring a QQ gateway opcode"),
                    }
                }
            }
        }
    }

    /// Waits for op 10 Hello and returns its heartbeat interval.
    async fn hello(&self, socket: &mut WsStream) -> Result<Duration, AdapterError> {
        let deadline = Instant::now() + self.timings.connect_timeout;
        loop {
            let frame = tokio::time::timeout_at(deadline, socket.next())
                .await
                .map_err(|_| AdapterError::Disconnected("no Hello from the QQ gateway".into()))?;
            match frame {
                Some(Ok(Message::Text(t))) => {
                    let Ok(v) = serde_json::from_str::<Value>(t.as_str()) else {
                        continue;
                    };
                    if v.get("op").and_then(Value::as_u64) == Some(10) {
                        let ms = v
                            .pointer("/d/heartbeat_interval")
                            .and_then(Value::as_u64)
                            .filter(|ms| *ms > 0)
                            .ok_or_else(|| {
                                AdapterError::Disconnected(
                                    "QQ's Hello had no heartbeat interval".into(),
                                )
                            })?;
                        return Ok(Duration::from_millis(ms));
                    }
                }
                Some(Ok(Message::Close(frame))) => {
                    return Err(AdapterError::Disconnected(format!(
                        "the QQ gateway closed before Hello{}",
                        frame.map(|f| format!(" ({})", f.code)).unwrap_or_default()
                    )));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    return Err(AdapterError::Disconnected(format!(
                        "the QQ gateway connection failed: {e}"
                    )));
                }
                None => {
                    return Err(AdapterError::Disconnected(
                        "the QQ gateway closed before Hello".into(),
                    ));
                }
            }
        }
    }

    async fn heartbeat(&self, socket: &mut WsStream) -> Result<(), AdapterError> {
        let seq = self.state().session.as_ref().map(|s| s.seq);
        send(
            socket,
            Message::text(json!({"op": 1, "d": seq}).to_string()),
        )
        .await
    }

    /// What a close frame means for the next connection.
    async fn closed(&self, code: Option<u16>, ctx: &AdapterContext) -> AdapterError {
        if let Some(m) = code.and_then(fatal_close) {
            self.state().session = None;
            return AdapterError::Fatal(m.to_owned());
        }
        match code {
            // The token went bad: a new one, and a fresh session.
            Some(4004) => {
                self.api.forget_token().await;
                self.state().session = None;
            }
            // The session or its sequence is no longer valid, or QQ had
            // an internal error: identify afresh.
            Some(4006 | 4007 | 4900..=4913) => self.state().session = None,
            // Too many connections or payloads: wait before reconnecting.
            Some(4008) => {
                tracing::warn!(
                    "QQ closed the gateway for sending too fast (4008); waiting {:?}",
                    self.timings.rate_limited_pause
                );
                tokio::select! {
                    _ = ctx.shutdown.cancelled() => {}
                    _ = tokio::time::sleep(self.timings.rate_limited_pause) => {}
                }
            }
            // 4009 (session timed out) and anything else: resume.
            _ => {}
        }
        AdapterError::Disconnected(match code {
            Some(c) => format!("the QQ gateway closed the connection ({c})"),
            None => "the QQ gateway closed the connection".into(),
        })
    }

    /// Updates session state from a dispatch; `true` when the session is
    /// now live (READY or RESUMED).
    fn dispatch(&self, kind: &str, d: &Value, seq: Option<u64>, ctx: &AdapterContext) -> bool {
        let mut state = self.state();
        match kind {
            "READY" => {
                let Some(id) = d.get("session_id").and_then(Value::as_str) else {
                    tracing::warn!("QQ READY without a session id; ignored");
                    return false;
                };
                state.session = Some(Session {
                    id: id.to_owned(),
                    seq: seq.unwrap_or(0),
                });
                state.bot_id = d
                    .pointer("/user/id")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                drop(state);
                tracing::info!("connected to QQ");
                ctx.liveness.set(Liveness::Live);
                true
            }
            "RESUMED" => {
                drop(state);
                tracing::info!("resumed the QQ session");
                ctx.liveness.set(Liveness::Live);
                true
            }
            _ => false,
        }
    }

    fn map(&self, kind: &str, d: &Value) -> Option<MessageEvent> {
        let bot_id = self.state().bot_id.clone().unwrap_or_default();
        match mapping::map_message(kind, d, &bot_id) {
            Ok(ev) => {
                self.remember_inbound(&ev);
                Some(ev)
            }
            Err(why) => {
                tracing::debug!("skipping a QQ {kind}: {why}");
                None
            }
        }
    }

    /// Records that the dispatch numbered `seq` was handled, and the
    /// message `id` it handed over.
    fn handled(&self, seq: Option<u64>, id: Option<String>) {
        let mut state = self.state();
        if let Some(id) = id {
            state.seen.insert(id);
        }
        if let (Some(seq), Some(s)) = (seq, state.session.as_mut()) {
            s.seq = s.seq.max(seq);
        }
    }

    fn seen(&self, id: Option<&str>) -> bool {
        id.is_some_and(|id| self.state().seen.contains(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fatal_codes() {
        for c in [4001, 4002, 4010, 4011, 4012, 4013, 4014, 4914, 4915] {
            assert!(fatal_close(c).is_some(), "{c}");
        }
        for c in [4000, 4004, 4006, 4007, 4008, 4009, 4900] {
            assert!(fatal_close(c).is_none(), "{c}");
        }
    }

    #[test]
    fn intents_are_qqs_bits() {
        assert_eq!(GROUP_AND_C2C, 33_554_432);
        assert_eq!(PUBLIC_GUILD_MESSAGES, 1_073_741_824);
        assert_eq!(DIRECT_MESSAGE, 4096);
        assert_eq!(GUILD_MESSAGES, 512);
        assert!(check_ws_url("wss://api.sgroup.qq.com/websocket").is_ok());
        assert!(check_ws_url("https://x").is_err());
    }
}
