//! The WebSocket client shared by the adapters that hold a socket open
//! (Discord's gateway, Slack's Socket Mode, Mattermost's event stream,
//! signal-cli's receive socket), and [`Watched`], a socket given up when it
//! goes silent.

use std::time::Duration;

use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use talaria_adapter::{AdapterContext, AdapterError, Liveness};
use tokio::net::TcpStream;
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::Utf8Bytes;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// An open WebSocket, over TLS for `wss://` URLs.
pub(crate) type WsStream = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Largest frame or message accepted from a platform. Platform events are
/// a few kB; anything near this is a broken or hostile peer.
const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// Connects to `url` (`ws://` or `wss://`) with extra request `headers`,
/// giving up after `timeout`. Errors are one line, with no secrets: the
/// URL's query (which may carry a ticket) is left out.
pub(crate) async fn connect(
    url: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> Result<WsStream, String> {
    install_crypto_provider();
    let shown = url.split('?').next().unwrap_or(url).to_owned();
    let mut request = url
        .into_client_request()
        .map_err(|e| format!("bad WebSocket URL {shown}: {e}"))?;
    for (name, value) in headers {
        let value = HeaderValue::from_str(value)
            .map_err(|_| format!("header {name} has characters a request cannot carry"))?;
        let name: tokio_tungstenite::tungstenite::http::HeaderName = name
            .parse()
            .map_err(|_| format!("bad header name {name}"))?;
        request.headers_mut().insert(name, value);
    }
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE_BYTES))
        .max_frame_size(Some(MAX_MESSAGE_BYTES));
    let connecting =
        tokio_tungstenite::connect_async_tls_with_config(request, Some(config), false, None);
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok((stream, _response))) => Ok(stream),
        Ok(Err(e)) => Err(format!("cannot open the WebSocket to {shown}: {e}")),
        Err(_) => Err(format!(
            "opening the WebSocket to {shown} took longer than {timeout:?}"
        )),
    }
}

/// What a [`Watched`] socket hands its adapter.
#[derive(Debug)]
pub(crate) enum Beat {
    /// A text frame from the peer.
    Text(Utf8Bytes),
    /// Time to ping, in whatever way the peer answers (a WebSocket ping,
    /// or an action of the platform's own protocol).
    PingDue,
}

/// An open socket that must hear from its peer: anything that arrives
/// (pongs and the peer's own pings included) proves it alive, and two ping
/// intervals of silence give it up as a hung server or a dead NAT mapping
/// would leave it, instead of waiting forever on a socket that only looks
/// open.
pub(crate) struct Watched {
    sink: SplitSink<WsStream, Message>,
    stream: SplitStream<WsStream>,
    /// The socket in errors: `the Mattermost WebSocket`.
    name: &'static str,
    /// Who closes it in errors: `Mattermost`, `the Signal REST API`.
    peer: &'static str,
    silence: Duration,
    quiet_until: Instant,
    ping: Interval,
}

impl Watched {
    /// Watches `stream`, pinging every `ping_interval` (first after one
    /// interval).
    pub(crate) fn new(
        stream: WsStream,
        name: &'static str,
        peer: &'static str,
        ping_interval: Duration,
    ) -> Watched {
        let (sink, stream) = stream.split();
        let mut ping = tokio::time::interval_at(Instant::now() + ping_interval, ping_interval);
        // After a stall, one ping is enough; a burst would only add load.
        ping.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let silence = ping_interval * 2;
        Watched {
            sink,
            stream,
            name,
            peer,
            silence,
            quiet_until: Instant::now() + silence,
            ping,
        }
    }

    /// Sends a frame; a failure means the connection is gone.
    pub(crate) async fn send(&mut self, message: Message) -> Result<(), AdapterError> {
        self.sink.send(message).await.map_err(|e| self.failed(e))
    }

    /// The next frame or ping to act on. `Ok(None)` when `ctx` shuts down
    /// (the socket is closed politely first); an error when the peer
    /// closes, the connection breaks or the socket went silent.
    pub(crate) async fn next(
        &mut self,
        ctx: &AdapterContext,
    ) -> Result<Option<Beat>, AdapterError> {
        loop {
            tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => {
                    let close = self.sink.send(Message::Close(None));
                    let _ = tokio::time::timeout(Duration::from_secs(1), close).await;
                    return Ok(None);
                }
                _ = tokio::time::sleep_until(self.quiet_until) => {
                    ctx.liveness.set(Liveness::Degraded);
                    return Err(AdapterError::Disconnected(format!(
                        "{} was silent for {:?}",
                        self.name, self.silence
                    )));
                }
                _ = self.ping.tick() => return Ok(Some(Beat::PingDue)),
                next = self.stream.next() => {
                    let message = match next {
                        None => {
                            return Err(AdapterError::Disconnected(format!("{} closed", self.name)));
                        }
                        Some(Err(e)) => return Err(self.failed(e)),
                        Some(Ok(m)) => m,
                    };
                    self.quiet_until = Instant::now() + self.silence;
                    match message {
                        Message::Text(text) => return Ok(Some(Beat::Text(text))),
                        Message::Close(frame) => {
                            return Err(AdapterError::Disconnected(format!(
                                "{} closed the WebSocket{}",
                                self.peer,
                                frame
                                    .map(|f| format!(": {} {}", f.code, f.reason))
                                    .unwrap_or_default()
                            )));
                        }
                        // Pings are answered by the library; pongs and
                        // binary frames only count as signs of life.
                        _ => {}
                    }
                }
            }
        }
    }

    fn failed(&self, e: impl std::fmt::Display) -> AdapterError {
        AdapterError::Disconnected(format!("{} failed: {e}", self.name))
    }
}

/// rustls refuses to pick a crypto backend when more than one is compiled
/// in (the dependency tree brings both ring and aws-lc-rs), and the
/// WebSocket library builds its TLS config from the process default. Ring
/// is what reqwest uses here too. Installing twice is harmless: the second
/// call reports the first and changes nothing.
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refused_connection_is_a_one_line_error_without_the_query() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let err = connect(
            &format!("ws://{addr}/socket?ticket=secret"),
            &[("Authorization", "Bearer x")],
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert!(err.contains("cannot open the WebSocket"), "{err}");
        assert!(!err.contains("secret"), "{err}");
    }

    #[tokio::test]
    async fn a_wss_url_gets_a_tls_config_instead_of_a_panic() {
        // A plain TCP listener that never speaks TLS: the handshake times
        // out. What matters is that building the TLS client does not panic
        // for want of a crypto provider, which it does without the install
        // whenever the build has both of rustls' backends (the workspace
        // build does).
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let err = connect(
            &format!("wss://{addr}/socket"),
            &[],
            Duration::from_millis(200),
        )
        .await
        .unwrap_err();
        assert!(
            err.contains("took longer") || err.contains("cannot open"),
            "{err}"
        );
        drop(listener);
    }
}
