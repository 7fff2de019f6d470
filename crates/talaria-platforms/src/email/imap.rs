//! Opening an IMAP connection: the socket, TLS (implicit or STARTTLS, or
//! none on loopback) and the server's greeting.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use super::MailTls;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::Endpoint;

/// A connection to a mail server, encrypted or (on loopback) not.
pub enum MailStream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl fmt::Debug for MailStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MailStream::Plain(_) => "MailStream::Plain",
            MailStream::Tls(_) => "MailStream::Tls",
        })
    }
}

impl AsyncRead for MailStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MailStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            MailStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for MailStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MailStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            MailStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MailStream::Plain(s) => Pin::new(s).poll_flush(cx),
            MailStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MailStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            MailStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A client that has read the greeting and is ready to log in.
pub type Client = async_imap::Client<MailStream>;

/// A logged-in IMAP session.
pub type Session = async_imap::Session<MailStream>;

/// The TLS client: the web's public roots (the ones mail providers use),
/// on ring like the rest of the workspace.
fn tls_connector() -> Result<TlsConnector, String> {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("cannot set up TLS: {e}"))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

async fn wrap_tls(endpoint: &Endpoint, tcp: TcpStream) -> io::Result<MailStream> {
    let connector = tls_connector().map_err(io::Error::other)?;
    let name = rustls::pki_types::ServerName::try_from(endpoint.host.clone())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let tls = connector.connect(name, tcp).await?;
    Ok(MailStream::Tls(Box::new(tls)))
}

/// Connects, secures the connection as configured and reads the greeting,
/// all within `timeout`.
pub async fn connect(endpoint: &Endpoint, timeout: Duration) -> io::Result<Client> {
    match tokio::time::timeout(timeout, connect_inner(endpoint)).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "connecting to {}:{} took longer than {timeout:?}",
                endpoint.host, endpoint.port
            ),
        )),
    }
}

async fn connect_inner(endpoint: &Endpoint) -> io::Result<Client> {
    let tcp = TcpStream::connect((endpoint.host.as_str(), endpoint.port)).await?;
    let stream = match endpoint.tls {
        MailTls::Implicit => wrap_tls(endpoint, tcp).await?,
        MailTls::None => MailStream::Plain(tcp),
        MailTls::Starttls => {
            let mut client = async_imap::Client::new(MailStream::Plain(tcp));
            greeting(&mut client).await?;
            client
                .run_command_and_check_ok("STARTTLS", None)
                .await
                .map_err(|e| io::Error::other(format!("STARTTLS was refused: {e}")))?;
            let MailStream::Plain(tcp) = client.into_inner() else {
                return Err(io::Error::other("STARTTLS on an encrypted connection"));
            };
            // No greeting follows STARTTLS.
            return Ok(async_imap::Client::new(wrap_tls(endpoint, tcp).await?));
        }
    };
    let mut client = async_imap::Client::new(stream);
    greeting(&mut client).await?;
    Ok(client)
}

async fn greeting(client: &mut Client) -> io::Result<()> {
    match client.read_response().await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the server closed the connection before its greeting",
        )),
        Err(e) => Err(e),
    }
}
