//! Binding the TCP listener of an HTTP adapter (the API server, webhooks).

use std::net::SocketAddr;

use tokio::net::TcpListener;

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
