//! Binding the TCP listener of an HTTP adapter (the API server, webhooks).

use std::net::SocketAddr;

use axum::serve::{ListenerExt, TapIo};
use tokio::net::{TcpListener, TcpStream};

/// Binds `host:port` and reads back the address actually bound (port 0
/// becomes a real port), so callers can print and connect to it.
///
/// # Errors
/// `host:port` as configured, for the caller's error message, with what
/// the operating system said (in use, not permitted, unknown host).
pub(crate) async fn bind_listener(
    host: &str,
    port: u16,
) -> Result<(TcpListener, SocketAddr), (String, std::io::Error)> {
    let failed = |source| (format!("{host}:{port}"), source);
    let listener = TcpListener::bind((host, port)).await.map_err(failed)?;
    let addr = listener.local_addr().map_err(failed)?;
    Ok((listener, addr))
}

/// A listener whose accepted connections send small writes at once.
///
/// Without `TCP_NODELAY`, a second small write (the next server-sent event,
/// a body after its headers) waits until the first is acknowledged, and
/// the peer delays that acknowledgement by up to 40 ms: every streamed
/// answer would stall once per event.
pub(crate) fn no_delay(listener: TcpListener) -> TapIo<TcpListener, fn(&mut TcpStream)> {
    listener.tap_io(set_no_delay as fn(&mut TcpStream))
}

fn set_no_delay(stream: &mut TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY; serving anyway");
    }
}
