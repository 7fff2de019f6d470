//! The long connection (`FEISHU_CONNECTION_MODE=websocket`): events over a
//! WebSocket the bot opens, so no public URL is needed.
//!
//! 1. `POST {base}/callback/ws/endpoint` `{AppID, AppSecret}` names the
//!    socket's URL (with `device_id` and `service_id` in its query) and a
//!    `ClientConfig` (`PingInterval`, seconds).
//! 2. Every WebSocket message is a binary protobuf [`Frame`] (`pbbp2`).
//!    Control frames (`method` 0) carry `type: ping` (ours, every
//!    `PingInterval`) and `type: pong` (Feishu's, whose payload may retune
//!    the interval). Data frames (`method` 1) carry an event's JSON, split
//!    into `sum` parts when large (`seq` 0-based, joined by `message_id`).
//! 3. Each data frame is answered with the same frame whose payload is
//!    `{"code":200}` once the event was taken; anything else makes Feishu
//!    deliver it again. A card callback (`card.action.trigger`, in a frame
//!    of type `card`, or `event` as some of Feishu's SDKs receive it) is
//!    answered the same way, with the answer the clicker sees as the
//!    payload's `data` (its JSON, base64-encoded, as Feishu's SDKs send a
//!    byte field).
//!
//! A closed or silent socket ends the run with `Disconnected`; the
//! supervisor reconnects (with a new endpoint URL) after its back-off.
//! Credentials Feishu refuses (514, 1000040344) are `Fatal`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use futures::{SinkExt, StreamExt};
use prost::Message as _;
use serde_json::{Value, json};
use talaria_adapter::{AdapterContext, AdapterError, Liveness};
use tokio_tungstenite::tungstenite::Message;

use super::callback;
use super::server::{Dispatched, Hook, dispatch, dispatch_click};

/// Frame methods.
const CONTROL: i32 = 0;
const DATA: i32 = 1;

/// Parts of split events held at once, and their bytes in total.
const MAX_PENDING: usize = 64;
const MAX_PENDING_BYTES: usize = 4 << 20;

/// How long the parts of one event may take to arrive.
const PARTS_TIMEOUT: Duration = Duration::from_secs(10);

/// The ping interval when Feishu names none.
const DEFAULT_PING: Duration = Duration::from_secs(120);

/// One header of a [`Frame`].
#[derive(Clone, PartialEq, prost::Message)]
pub struct Header {
    /// The header's name.
    #[prost(string, required, tag = "1")]
    pub key: String,
    /// Its value.
    #[prost(string, required, tag = "2")]
    pub value: String,
}

/// `pbbp2.Frame`, the long connection's one message type.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Frame {
    /// `SeqID`.
    #[prost(uint64, required, tag = "1")]
    pub seq_id: u64,
    /// `LogID`.
    #[prost(uint64, required, tag = "2")]
    pub log_id: u64,
    /// The service id from the socket URL.
    #[prost(int32, required, tag = "3")]
    pub service: i32,
    /// 0 control, 1 data.
    #[prost(int32, required, tag = "4")]
    pub method: i32,
    /// `type`, `message_id`, `sum`, `seq`, `trace_id`, `biz_rt`, ...
    #[prost(message, repeated, tag = "5")]
    pub headers: Vec<Header>,
    /// `payload_encoding`.
    #[prost(string, optional, tag = "6")]
    pub payload_encoding: Option<String>,
    /// `payload_type`.
    #[prost(string, optional, tag = "7")]
    pub payload_type: Option<String>,
    /// The payload: an event's JSON (or a part of it), a ClientConfig.
    #[prost(bytes = "vec", optional, tag = "8")]
    pub payload: Option<Vec<u8>>,
    /// `LogIDNew`.
    #[prost(string, optional, tag = "9")]
    pub log_id_new: Option<String>,
}

impl Frame {
    fn header(&self, key: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|h| h.key == key)
            .map(|h| h.value.as_str())
    }
}

/// The endpoint's answer.
struct Endpoint {
    url: String,
    service_id: i32,
    ping: Duration,
}

async fn endpoint(hook: &Hook, app_id: &str, app_secret: &str) -> Result<Endpoint, AdapterError> {
    let body = json!({"AppID": app_id, "AppSecret": app_secret});
    let answer = hook
        .api
        .post_plain("/callback/ws/endpoint", &body)
        .await
        .map_err(AdapterError::Disconnected)?;
    let code = answer.get("code").and_then(Value::as_i64).unwrap_or(-1);
    if code != 0 {
        let msg = answer.get("msg").and_then(Value::as_str).unwrap_or("");
        let text = format!("Feishu refused the long connection (code {code}): {msg}");
        return Err(if matches!(code, 514 | 1_000_040_344) {
            AdapterError::Fatal(format!(
                "{text}; check FEISHU_APP_ID / FEISHU_APP_SECRET and that the app uses the long \
                 connection under Events & Callbacks"
            ))
        } else {
            AdapterError::Disconnected(text)
        });
    }
    let url = answer
        .pointer("/data/URL")
        .and_then(Value::as_str)
        .filter(|u| u.starts_with("ws://") || u.starts_with("wss://"))
        .ok_or_else(|| AdapterError::Disconnected("Feishu named no socket URL".into()))?
        .to_owned();
    let service_id = reqwest::Url::parse(&url)
        .ok()
        .and_then(|u| {
            u.query_pairs()
                .find(|(k, _)| k == "service_id")
                .and_then(|(_, v)| v.parse().ok())
        })
        .unwrap_or(0);
    let ping = answer
        .pointer("/data/ClientConfig/PingInterval")
        .and_then(Value::as_u64)
        .filter(|s| *s > 0)
        .map_or(DEFAULT_PING, Duration::from_secs);
    Ok(Endpoint {
        url,
        service_id,
        ping,
    })
}

/// When the first part of an event arrived, and its parts so far.
type Partial = (Instant, Vec<Option<Vec<u8>>>);

/// Parts of events split across frames, by `message_id`.
#[derive(Default)]
struct Parts {
    pending: HashMap<String, Partial>,
    bytes: usize,
}

impl Parts {
    /// Adds part `seq` of `sum`; the whole payload once every part is in.
    fn add(&mut self, id: &str, sum: usize, seq: usize, part: Vec<u8>) -> Option<Vec<u8>> {
        if sum <= 1 {
            return Some(part);
        }
        if seq >= sum || sum > 64 {
            return None;
        }
        let now = Instant::now();
        let before = self.pending.len();
        self.pending
            .retain(|_, (at, _)| now.duration_since(*at) < PARTS_TIMEOUT);
        if self.pending.len() != before {
            self.recount();
        }
        if !self.pending.contains_key(id)
            && (self.pending.len() >= MAX_PENDING || self.bytes + part.len() > MAX_PENDING_BYTES)
        {
            tracing::warn!(
                "too many split Feishu events pending; dropping one (it is re-delivered)"
            );
            return None;
        }
        let entry = self
            .pending
            .entry(id.to_owned())
            .or_insert_with(|| (now, vec![None; sum]));
        if entry.1.len() != sum {
            return None;
        }
        self.bytes += part.len();
        entry.1[seq] = Some(part);
        if entry.1.iter().all(Option::is_some) {
            let (_, parts) = self.pending.remove(id)?;
            let whole: Vec<u8> = parts.into_iter().flatten().flatten().collect();
            self.bytes = self.bytes.saturating_sub(whole.len());
            return Some(whole);
        }
        None
    }

    fn recount(&mut self) {
        self.bytes = self
            .pending
            .values()
            .flat_map(|(_, p)| p.iter().flatten())
            .map(Vec::len)
            .sum();
    }
}

fn ping_frame(service: i32) -> Frame {
    Frame {
        seq_id: 0,
        log_id: 0,
        service,
        method: CONTROL,
        headers: vec![Header {
            key: "type".into(),
            value: "ping".into(),
        }],
        ..Frame::default()
    }
}

/// One connection, until it breaks or the gateway stops.
pub(crate) async fn run(
    hook: &Arc<Hook>,
    app_id: &str,
    app_secret: &str,
    ctx: &AdapterContext,
) -> Result<(), AdapterError> {
    ctx.liveness.set(Liveness::Connecting);
    let ep = endpoint(hook, app_id, app_secret).await?;
    let socket = crate::ws::connect(&ep.url, &[], Duration::from_secs(20))
        .await
        .map_err(AdapterError::Disconnected)?;
    let (mut sink, mut stream) = socket.split();
    ctx.liveness.set(Liveness::Live);
    tracing::info!("Feishu long connection open");
    let mut ping_every = ep.ping;
    let mut next_ping = tokio::time::Instant::now() + ping_every;
    let mut quiet_until = tokio::time::Instant::now() + ping_every * 2 + Duration::from_secs(10);
    let mut parts = Parts::default();
    loop {
        let message = tokio::select! {
            biased;
            () = ctx.shutdown.cancelled() => {
                let _ = tokio::time::timeout(Duration::from_secs(1), sink.send(Message::Close(None))).await;
                return Ok(());
            }
            () = tokio::time::sleep_until(quiet_until) => {
                ctx.liveness.set(Liveness::Degraded);
                return Err(AdapterError::Disconnected("the Feishu long connection went silent".into()));
            }
            () = tokio::time::sleep_until(next_ping) => {
                next_ping = tokio::time::Instant::now() + ping_every;
                sink.send(Message::Binary(ping_frame(ep.service_id).encode_to_vec().into()))
                    .await
                    .map_err(|e| AdapterError::Disconnected(format!("the Feishu long connection failed: {e}")))?;
                continue;
            }
            next = stream.next() => next,
        };
        let message = match message {
            None => {
                return Err(AdapterError::Disconnected(
                    "Feishu closed the long connection".into(),
                ));
            }
            Some(Err(e)) => {
                return Err(AdapterError::Disconnected(format!(
                    "the Feishu long connection failed: {e}"
                )));
            }
            Some(Ok(m)) => m,
        };
        quiet_until = tokio::time::Instant::now() + ping_every * 2 + Duration::from_secs(10);
        let bytes = match message {
            Message::Binary(b) => b,
            Message::Close(frame) => {
                return Err(AdapterError::Disconnected(format!(
                    "Feishu closed the long connection{}",
                    frame
                        .map(|f| format!(": {} {}", f.code, f.reason))
                        .unwrap_or_default()
                )));
            }
            _ => continue,
        };
        let Ok(frame) = Frame::decode(bytes.as_ref()) else {
            tracing::info!("an unreadable frame on the Feishu long connection; ignored");
            continue;
        };
        match frame.method {
            CONTROL => {
                if frame.header("type") == Some("pong")
                    && let Some(secs) = frame
                        .payload
                        .as_deref()
                        .and_then(|p| serde_json::from_slice::<Value>(p).ok())
                        .and_then(|c| c.get("PingInterval").and_then(Value::as_u64))
                        .filter(|s| *s > 0)
                {
                    ping_every = Duration::from_secs(secs);
                }
            }
            DATA => {
                let started = Instant::now();
                let sum = frame
                    .header("sum")
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(1);
                let seq = frame
                    .header("seq")
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                let id = frame.header("message_id").unwrap_or("").to_owned();
                let part = frame.payload.clone().unwrap_or_default();
                let Some(whole) = parts.add(&id, sum, seq, part) else {
                    continue;
                };
                let kind = frame.header("type");
                let reply = match serde_json::from_slice::<Value>(&whole) {
                    Ok(envelope)
                        if matches!(kind, Some("event" | "card"))
                            && callback::is_card_action(&envelope) =>
                    {
                        match dispatch_click(hook, &envelope, &ctx.inbox).await {
                            (Dispatched::Taken, answer) => json!({
                                "code": 200,
                                "data": base64::engine::general_purpose::STANDARD
                                    .encode(answer.to_string()),
                            }),
                            (Dispatched::NotTaken, _) => json!({"code": 500}),
                        }
                    }
                    Ok(envelope) if kind == Some("event") => {
                        match dispatch(hook, &envelope, &ctx.inbox).await {
                            Dispatched::Taken => json!({"code": 200}),
                            Dispatched::NotTaken => json!({"code": 500}),
                        }
                    }
                    // Other types are not handled: acknowledged, so they
                    // are not sent again.
                    Ok(_) => json!({"code": 200}),
                    Err(_) => {
                        tracing::info!("a Feishu event frame that is not JSON; acknowledged");
                        json!({"code": 200})
                    }
                };
                let mut answer = frame;
                answer.headers.push(Header {
                    key: "biz_rt".into(),
                    value: started.elapsed().as_millis().to_string(),
                });
                answer.payload = Some(reply.to_string().into_bytes());
                sink.send(Message::Binary(answer.encode_to_vec().into()))
                    .await
                    .map_err(|e| {
                        AdapterError::Disconnected(format!(
                            "the Feishu long connection failed: {e}"
                        ))
                    })?;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_use_the_pbbp2_field_numbers() {
        let f = Frame {
            seq_id: 1,
            log_id: 2,
            service: 3,
            method: 1,
            headers: vec![Header {
                key: "k".into(),
                value: "v".into(),
            }],
            payload: Some(b"{}".to_vec()),
            ..Frame::default()
        };
        let bytes = f.encode_to_vec();
        // field 1 varint 1, field 2 varint 2, field 3 varint 3, field 4 varint 1,
        // field 5 message {1:"k", 2:"v"}, field 8 bytes "{}".
        assert_eq!(
            bytes,
            vec![
                0x08, 1, 0x10, 2, 0x18, 3, 0x20, 1, 0x2a, 6, 0x0a, 1, b'k', 0x12, 1, b'v', 0x42, 2,
                b'{', b'}'
            ]
        );
        assert_eq!(Frame::decode(bytes.as_slice()).unwrap(), f);
    }

    #[test]
    fn split_events_are_joined_in_seq_order_and_bounded() {
        let mut p = Parts::default();
        assert_eq!(p.add("m", 1, 0, b"x".to_vec()), Some(b"x".to_vec()));
        assert_eq!(p.add("m", 2, 1, b"cd".to_vec()), None);
        assert_eq!(p.add("m", 2, 0, b"ab".to_vec()), Some(b"abcd".to_vec()));
        assert_eq!(p.bytes, 0);
        assert_eq!(p.add("n", 2, 5, b"?".to_vec()), None, "seq out of range");
        for i in 0..MAX_PENDING {
            p.add(&format!("k{i}"), 2, 0, b"a".to_vec());
        }
        assert!(p.pending.len() <= MAX_PENDING);
    }
}
