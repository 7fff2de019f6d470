//! One Discord gateway session: Hello, Identify or Resume, heartbeats, and
//! dispatches until the connection ends.
//!
//! Sequence numbers advance only once the dispatch they number has been
//! handled (a message handed to the inbox, anything else seen), so a
//! resume after a drop asks Discord to replay exactly what was not yet
//! handed over: nothing lost, nothing twice.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use rand::Rng;
use serde_json::{Value, json};
use talaria_adapter::InboxClosed;
use talaria_adapter::{AdapterContext, AdapterError, Liveness, MessageEvent};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::{DiscordAdapter, Session, mapping};
use crate::ws::{self, WsStream};

/// GUILDS | GUILD_MESSAGES | DIRECT_MESSAGES | MESSAGE_CONTENT.
pub(crate) const INTENTS: u64 = 1 | 512 | 4096 | 32768;

/// How a session ended when `run` should go on by itself.
pub(crate) enum End {
    /// The gateway is shutting down.
    Shutdown,
    /// Discord asked for a new connection (op 7, op 9): connect again now.
    /// `was_live` says whether this session got as far as READY/RESUMED.
    Again { was_live: bool, why: String },
}

type Submit = Pin<Box<dyn Future<Output = Result<(), InboxClosed>> + Send>>;

/// Close codes after which reconnecting cannot help.
fn fatal_close(code: u16) -> Option<&'static str> {
    match code {
        4004 => Some("Discord rejected the bot token (close 4004); check DISCORD_BOT_TOKEN"),
        4010 => Some("Discord refused the shard (close 4010)"),
        4011 => Some("Discord requires sharding for this bot (close 4011)"),
        4012 => Some("Discord refused the gateway version (close 4012)"),
        4013 => Some("Discord refused the intents (close 4013)"),
        4014 => Some(
            "Discord refused privileged intents (close 4014): enable the Message Content \
             intent for the bot in the Developer Portal",
        ),
        _ => None,
    }
}

/// `url` with the version and encoding Discord's gateway expects.
pub(crate) fn with_query(url: &str) -> Result<String, AdapterError> {
    let mut parsed = reqwest::Url::parse(url.trim()).map_err(|e| {
        AdapterError::Fatal(format!("the Discord gateway URL {url:?} is not a URL: {e}"))
    })?;
    if !matches!(parsed.scheme(), "ws" | "wss") {
        return Err(AdapterError::Fatal(format!(
            "the Discord gateway URL {url:?} is not a ws:// or wss:// URL"
        )));
    }
    let kept: Vec<(String, String)> = parsed
        .query_pairs()
        .filter(|(k, _)| k != "v" && k != "encoding")
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    parsed
        .query_pairs_mut()
        .clear()
        .extend_pairs(kept)
        .append_pair("v", "10")
        .append_pair("encoding", "json");
    Ok(parsed.into())
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
            "Discord gateway write failed: {e}"
        ))),
        Err(_) => Err(AdapterError::Disconnected(
            "Discord gateway write timed out".into(),
        )),
    }
}

/// Closes with a code that keeps the session resumable (not 1000/1001,
/// which end it on Discord's side). Best effort: the peer may be gone.
async fn close_resumable(ws: &mut WsStream) {
    let _ = tokio::time::timeout(Duration::from_secs(2), ws.send(close_frame(4000))).await;
}

impl DiscordAdapter {
    /// Where to connect: the session's resume URL, the configured URL, or
    /// the one `GET /gateway/bot` names.
    async fn gateway_url(&self, resuming: Option<&Session>) -> Result<String, AdapterError> {
        if let Some(s) = resuming {
            return with_query(&s.resume_url);
        }
        if let Some(u) = &self.gateway_url {
            return with_query(u);
        }
        let answer = self
            .rest
            .request(
                reqwest::Method::GET,
                "/gateway/bot",
                "GET /gateway/bot",
                "",
                None,
                self.timings.connect_timeout,
            )
            .await
            .map_err(|e| match e.status() {
                Some(401) => AdapterError::Fatal(format!(
                    "Discord rejected the bot token ({e}); check DISCORD_BOT_TOKEN"
                )),
                _ => AdapterError::Disconnected(format!("cannot ask for the gateway URL: {e}")),
            })?;
        match answer.get("url").and_then(Value::as_str) {
            Some(u) if !u.is_empty() => with_query(u),
            _ => Err(AdapterError::Disconnected(
                "GET /gateway/bot answered without a url".into(),
            )),
        }
    }

    /// Runs one connection from Hello to its end.
    pub(crate) async fn session(&self, ctx: &AdapterContext) -> Result<End, AdapterError> {
        let resuming = self.state().session.clone();
        let url = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(End::Shutdown),
            u = self.gateway_url(resuming.as_ref()) => u?,
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

        let hello = match &resuming {
            Some(s) => json!({"op": 6, "d": {
                "token": self.token.expose(), "session_id": s.id, "seq": s.seq,
            }}),
            None => json!({"op": 2, "d": {
                "token": self.token.expose(),
                "intents": INTENTS,
                "properties": {"os": std::env::consts::OS, "browser": "talaria", "device": "talaria"},
            }}),
        };
        send(&mut socket, Message::text(hello.to_string())).await?;
        tracing::debug!(resume = resuming.is_some(), "Discord gateway connected");

        let jitter: f64 = rand::rng().random_range(0.0..1.0);
        let mut next_beat = Instant::now() + interval.mul_f64(jitter);
        let mut awaiting_ack = false;
        let mut was_live = false;
        let mut pending: VecDeque<(Option<u64>, Option<MessageEvent>)> = VecDeque::new();
        let mut submitting: Option<(Option<u64>, Submit)> = None;

        loop {
            // Start the next hand-over, and note dispatches that need none.
            while submitting.is_none() {
                let Some((seq, event)) = pending.pop_front() else {
                    break;
                };
                match event {
                    None => self.handled(seq),
                    Some(ev) => {
                        let inbox = ctx.inbox.clone();
                        submitting = Some((seq, Box::pin(async move { inbox.submit(ev).await })));
                    }
                }
            }
            let save_at = self.save_due();
            tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => {
                    // Not a normal close: the session stays resumable
                    // until Discord times it out.
                    close_resumable(&mut socket).await;
                    return Ok(End::Shutdown);
                }
                r = async {
                    match submitting.as_mut() {
                        Some((_, f)) => f.await,
                        None => std::future::pending().await,
                    }
                } => {
                    let seq = submitting.take().and_then(|(s, _)| s);
                    if r.is_err() {
                        // The runner is gone: the gateway is stopping.
                        close_resumable(&mut socket).await;
                        return Ok(End::Shutdown);
                    }
                    self.handled(seq);
                }
                _ = tokio::time::sleep_until(next_beat) => {
                    if awaiting_ack {
                        ctx.liveness.set(Liveness::Degraded);
                        close_resumable(&mut socket).await;
                        return Err(AdapterError::Disconnected(
                            "the Discord gateway stopped acknowledging heartbeats".into(),
                        ));
                    }
                    self.heartbeat(&mut socket).await?;
                    awaiting_ack = true;
                    next_beat = Instant::now() + interval;
                }
                _ = tokio::time::sleep_until(save_at.unwrap_or(next_beat)), if save_at.is_some() => {
                    self.save(false).await;
                }
                frame = socket.next() => {
                    let text = match frame {
                        Some(Ok(Message::Text(t))) => t,
                        Some(Ok(Message::Close(frame))) => {
                            return Err(self.closed(frame.map(|f| u16::from(f.code))));
                        }
                        Some(Ok(_)) => continue,
                        Some(Err(e)) => {
                            return Err(AdapterError::Disconnected(format!(
                                "the Discord gateway connection failed: {e}"
                            )));
                        }
                        None => {
                            return Err(AdapterError::Disconnected(
                                "the Discord gateway closed the connection".into(),
                            ));
                        }
                    };
                    let payload: Value = match serde_json::from_str(text.as_str()) {
                        Ok(v) => v,
                        Err(e) => {
                            tracing::warn!("skipping an unreadable Discord gateway frame: {e}");
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
                            let event = (kind == "MESSAGE_CREATE")
                                .then(|| self.map(d))
                                .flatten();
                            pending.push_back((seq, event));
                        }
                        Some(1) => self.heartbeat(&mut socket).await?,
                        Some(7) => {
                            close_resumable(&mut socket).await;
                            return Ok(End::Again {
                                was_live,
                                why: "Discord asked for a reconnect".into(),
                            });
                        }
                        Some(9) => {
                            let resumable = payload.get("d").and_then(Value::as_bool) == Some(true);
                            close_resumable(&mut socket).await;
                            if !resumable {
                                // Forgotten here and, when the session ends,
                                // in the store.
                                self.state().set_session(None);
                                // Discord asks for a pause before a fresh identify.
                                let max = self.timings.reidentify_delay.as_millis().max(1) as u64;
                                let wait = Duration::from_millis(rand::rng().random_range(max / 5..=max));
                                tokio::select! {
                                    biased;
                                    _ = ctx.shutdown.cancelled() => return Ok(End::Shutdown),
                                    _ = tokio::time::sleep(wait) => {}
                                }
                            }
                            return Ok(End::Again {
                                was_live,
                                why: format!("Discord invalidated the session (resumable: {resumable})"),
                            });
                        }
                        Some(11) => awaiting_ack = false,
                        Some(10) => {}
                        other => tracing::debug!(?other, "ignoring a Discord gateway opcode"),
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
                .map_err(|_| {
                    AdapterError::Disconnected("no Hello from the Discord gateway".into())
                })?;
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
                                    "Discord's Hello had no heartbeat interval".into(),
                                )
                            })?;
                        return Ok(Duration::from_millis(ms));
                    }
                }
                Some(Ok(Message::Close(frame))) => {
                    return Err(self.closed(frame.map(|f| u16::from(f.code))));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    return Err(AdapterError::Disconnected(format!(
                        "the Discord gateway connection failed: {e}"
                    )));
                }
                None => {
                    return Err(AdapterError::Disconnected(
                        "the Discord gateway closed before Hello".into(),
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
    fn closed(&self, code: Option<u16>) -> AdapterError {
        if let Some(m) = code.and_then(fatal_close) {
            return AdapterError::Fatal(m.to_owned());
        }
        // An invalid sequence or a timed-out session cannot be resumed.
        if matches!(code, Some(4007 | 4009)) {
            self.state().set_session(None);
        }
        AdapterError::Disconnected(match code {
            Some(c) => format!("the Discord gateway closed the connection ({c})"),
            None => "the Discord gateway closed the connection".into(),
        })
    }

    /// Updates session state from a dispatch; `true` when the session is
    /// now live (READY or RESUMED).
    fn dispatch(&self, kind: &str, d: &Value, seq: Option<u64>, ctx: &AdapterContext) -> bool {
        let mut state = self.state();
        match kind {
            "READY" => {
                let id = d.get("session_id").and_then(Value::as_str);
                let bot = d.pointer("/user/id").and_then(Value::as_str);
                let (Some(id), Some(bot)) = (id, bot) else {
                    tracing::warn!("Discord READY without a session id or user; ignored");
                    return false;
                };
                let resume_url = d
                    .get("resume_gateway_url")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .or_else(|| self.gateway_url.clone())
                    .unwrap_or_default();
                // READY starts a new sequence; it is handled at once.
                state.set_session(Some(Session {
                    id: id.to_owned(),
                    resume_url,
                    seq: seq.unwrap_or(0),
                }));
                state.bot_id = Some(bot.to_owned());
                drop(state);
                tracing::info!("connected to Discord");
                ctx.liveness.set(Liveness::Live);
                true
            }
            "RESUMED" => {
                drop(state);
                tracing::info!("resumed the Discord session");
                ctx.liveness.set(Liveness::Live);
                true
            }
            _ => {
                state.threads.observe(kind, d);
                false
            }
        }
    }

    fn map(&self, d: &Value) -> Option<MessageEvent> {
        let state = self.state();
        let bot_id = state.bot_id.as_deref().unwrap_or("");
        match mapping::map_message(d, bot_id, self.require_mention, &state.threads) {
            Ok(ev) => Some(ev),
            Err(why) => {
                tracing::debug!("skipping a Discord message: {why}");
                None
            }
        }
    }

    /// Records that the dispatch numbered `seq` was handled.
    fn handled(&self, seq: Option<u64>) {
        let mut state = self.state();
        if let (Some(seq), Some(s)) = (seq, state.session.as_mut())
            && seq > s.seq
        {
            s.seq = seq;
            state.revision += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_urls_get_version_and_encoding() {
        assert_eq!(
            with_query("wss://gateway.discord.gg").unwrap(),
            "wss://gateway.discord.gg/?v=10&encoding=json"
        );
        assert_eq!(
            with_query("ws://127.0.0.1:9/gw?x=1&v=9").unwrap(),
            "ws://127.0.0.1:9/gw?x=1&v=10&encoding=json"
        );
        assert!(matches!(
            with_query("https://discord.com"),
            Err(AdapterError::Fatal(_))
        ));
    }

    #[test]
    fn fatal_codes() {
        assert!(fatal_close(4004).is_some());
        assert!((4010..=4014).all(|c| fatal_close(c).is_some()));
        assert!(fatal_close(4000).is_none() && fatal_close(4009).is_none());
    }
}
