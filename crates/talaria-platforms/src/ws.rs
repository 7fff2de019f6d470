//! The WebSocket client shared by the adapters that hold a socket open
//! (Discord's gateway, Slack's Socket Mode, Mattermost's event stream).

use std::time::Duration;

use tokio::net::TcpStream;
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
